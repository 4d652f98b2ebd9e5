"""What a test suite checks after each test of asyncgpu: nothing of it is left running. For asyncgpu's own tests and
for users' suites (``asyncgpu._testing.assert_quiescent()`` in an autouse fixture); not part of the public API.
"""

from __future__ import annotations

import threading

from asyncgpu._backends import cupti, end_open_holds
from asyncgpu._runtime import hooks, select
from asyncgpu._timing import functional

__all__ = ["assert_quiescent", "cupti_users", "leftovers"]


def cupti_users() -> int:
    """How many scopes, step timers and calibrations hold CUPTI now (process-wide)."""
    return cupti.users()


def leftovers() -> dict[str, object]:
    """End what a failed test left open and close every worker (`asyncgpu.close_all`), then say what was left:
    ``{"threads": [names of asyncgpu's threads still alive], "open holds": [a line per hold not ended once the test's
    work was issued, ended now (`asyncgpu._backends.end_open_holds`)], "held-launch users": n, "timing_begin": n
    (functional scopes that were never ended: ended now), "CUPTI users": n}``. The holds are read once the calls
    queued on the workers' threads have run (a clock refresh the test queued holds its calibration stream while it
    runs: open then, but not left open), at most `SETTLE_TIMEOUT_S` per worker. Blocks while the workers join."""
    begun = list(functional._functional)
    for t in begun:
        functional.timing_end(t)
    _settle_workers(SETTLE_TIMEOUT_S)
    held = hooks.HOLD_USERS
    holds = end_open_holds()  # (before the workers close: closing a CUDA device ends every hold of the process)
    select.close_all()
    return {
        "threads": [t.name for t in threading.enumerate() if t.name.startswith("asyncgpu-") and t.is_alive()],
        "open holds": holds,
        "held-launch users": held,
        "timing_begin": len(begun),
        "CUPTI users": cupti.users(),  # (after the workers are joined: a clock calibration holds CUPTI briefly)
    }


#: (seconds) how long `leftovers` waits for each worker's queued calls before it reads the holds
SETTLE_TIMEOUT_S = 5.0


def _settle_workers(timeout_s: float) -> None:
    """Wait until each open device's worker thread has run what was queued on it before now (at most ``timeout_s``
    each; a worker whose thread never started has nothing queued)."""
    for dev in select.opened():
        worker = dev._internal.worker
        thread = worker.thread
        if thread is None or not thread.is_alive():
            continue
        done = threading.Event()
        if worker.call_soon(done.set):
            done.wait(timeout_s)


def assert_quiescent(*, cupti_users_before: int = 0) -> None:
    """`leftovers`, and `AssertionError` naming whatever was left (threads, scopes, CUPTI users beyond
    ``cupti_users_before``: what `cupti_users` said before the test, so that one test's leak is blamed on it
    alone)."""
    left = leftovers()
    assert not left["threads"], f"threads left running: {left['threads']}"
    assert not left["open holds"], f"holds left open (their streams waited for ever): {left['open holds']}"
    left["CUPTI users"] = max(0, int(left["CUPTI users"]) - cupti_users_before)  # type: ignore[call-overload]
    scopes = {k: v for k, v in left.items() if k not in ("threads", "open holds") and v}
    assert not scopes, f"scopes left open: {scopes}"
