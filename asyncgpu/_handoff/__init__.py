"""Thread-to-thread GPU work handoff (`Channel`), timed.

``channel``: the channel (put, get, close). ``records``: one handoff, the item both sides hold (`Handoff`) and the
record it leaves (`HandoffRecord`). ``layer``: the handoffs of a channel as a trace layer of a scope. ``calls``: the
calling convention they share (timeouts, blocking and awaitable forms).
"""
