"""Trace files: the common model, Chrome JSON and CSV exports, the Perfetto writer and reader. Never touches a
device."""
