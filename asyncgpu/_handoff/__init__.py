"""Thread-to-thread GPU work handoff (`Channel`), timed."""
