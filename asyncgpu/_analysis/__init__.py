"""Analysis of a finished Timeline: summaries, balance, the rich report. Never touches a device."""
