"""Calls that synchronize a GPU run with every hold released.

A hold (`asyncgpu._backends.cuda.holds`) keeps a stream waiting on a pinned host word until the thread that made
it has enqueued its bracket, a few microseconds later. Freeing pinned or device memory (``cuMemFreeHost``,
``cuMemFree``) waits for the GPU to go idle, and holds a driver lock while it waits. If such a free starts while
a hold is open, the GPU waits for the hold, the free waits for the GPU, and the thread that would end the hold
waits in its next driver call for the free's lock: every thread stops. The same thread can meet itself there:
a finalizer that frees pinned memory may run inside its own hold window.

So every synchronizing call the backend makes runs inside `releasing_holds`: while it runs, new holds are
skipped (their brackets go unheld: they may count a few microseconds of the host's time), and a releaser thread
moves every hold word to its latest value every `RELEASE_PERIOD_S`, which also ends a hold that began just
before the call.

Calls that synchronize without asyncgpu knowing are caught by the **watchdog** (``asyncgpu-holdwatch``, one per
process while holds are made, `watch`): a hold that spans one launch (``watched``: a bracket's, not one a
benchmark keeps on purpose while it enqueues a whole repeat) still open, with no step made by its thread, at
`WATCHDOG_STUCK_LOOKS` looks in a row is ended, and counted in `RESCUED`. The case it was built for: a kernel's
first launch loads its function lazily (``CUDA_MODULE_LOADING=LAZY``, the default), and a load may synchronize the
context (CUDA Programming Guide, "Lazy Loading"), so a first launch inside its own hold waits for the hold it is
inside. A free by another library inside one of our hold windows is the other. The bracket of a rescued hold may
count the host's time.

A thread that goes on, however slowly, is not stuck: the launching thread says so after each step (`progressed`:
the primer, the start records, the work). Behind another Python thread that keeps the GIL, every driver call waits
for the interpreter's switch interval (5 ms) to take the GIL back, so a bracket's few calls span 10-30 ms; ending
its hold then would let the work run before its end record was enqueued (a 40 MB copy read +10 ms on one H100:
`dev/diag_copy_pair.py`, variant ``gil``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from asyncgpu._backends.cuda.driver import MASK32

#: How often the releaser moves the hold words while a synchronizing call runs (s). A hold that began just
#: before the call ends within this long; the call itself takes at least as long (a free unpins pages).
RELEASE_PERIOD_S = 50e-6

#: How often the watchdog looks at the watched holds (s) (`watch`).
WATCHDOG_PERIOD_S = 0.01
#: Looks in a row that see a watched hold open with no step made (`progressed`) before the watchdog ends it: 20-30
#: ms without a step, far beyond the few microseconds a thread takes to enqueue a bracket and beyond a GIL switch
#: interval or two, short enough that a stuck launch costs a step, not a hang.
WATCHDOG_STUCK_LOOKS = 3
#: Looks in a row with no watched hold after which the watchdog stops (the next watched hold starts it again).
WATCHDOG_IDLE_LOOKS = 100
#: Holds the watchdog ended (one item), process-wide since it started.
RESCUED = [0]

#: GPU index -> its hold words (`holds._Gates`: ``words``, the pinned uint32 words the streams wait on, ``next``,
#: each word's latest hold value, and ``slots``, the streams given a word). Registered by the holds, read here.
GATES: dict[int, Any] = {}
#: Synchronizing calls in progress (one item): `holds.hold` makes no hold while it is not 0.
ACTIVE = [0]
_lock = threading.RLock()  # (re-entrant: a finalizer that frees may run in a thread that holds it)


def syncing() -> bool:
    """Whether a synchronizing call is in progress (a hold made now could stop every thread)."""
    return ACTIVE[0] != 0


def _behind() -> Iterator[tuple[int, Any, int, int]]:
    """Each hold word behind its latest hold, as ``(GPU index, words, word, latest value)``, found one at a time
    (a caller that moves a word does so right after its check). Any thread."""
    for index, gates in list(GATES.items()):
        words, latest = gates.words, gates.next
        for slot in range(min(len(gates.slots), len(latest))):  # (words are given out in order: 0, 1, 2…)
            value = latest[slot]
            if 0 < (value - words[slot]) & MASK32 < 0x80000000:  # (cyclic: a word ahead of it is never moved back)
                yield index, words, slot, value


def release_all() -> None:
    """Move every hold word forward to its latest hold's value: every held stream may go on. Any thread."""
    for _, words, slot, value in _behind():
        words[slot] = value


def open_holds() -> list[tuple[int, int, int, int]]:
    """The holds not ended: ``(GPU index, word, its value, its latest hold's value)`` for each hold word behind its
    latest hold. Reads only; any thread."""
    return [(index, slot, int(words[slot]), int(value)) for index, words, slot, value in _behind()]


@contextmanager
def releasing_holds() -> Iterator[None]:
    """Run the body (a call that synchronizes a GPU) with no hold open on any GPU of this process: holds are
    skipped while it runs, and a releaser thread (``asyncgpu-unhold``, joined at the end) ends those that began
    before it. Any thread, a finalizer's too. Without any hold word there is nothing to release: no thread."""
    if not GATES:
        yield
        return
    with _lock:
        ACTIVE[0] += 1
    done = threading.Event()

    def keep_releasing() -> None:
        while True:
            release_all()
            if done.wait(RELEASE_PERIOD_S):
                return

    releaser: threading.Thread | None = threading.Thread(target=keep_releasing, name="asyncgpu-unhold", daemon=True)
    try:
        assert releaser is not None
        releaser.start()
    except RuntimeError:  # at interpreter shutdown no thread starts: no loop makes holds then either
        releaser = None
        release_all()
    try:
        yield
    finally:
        done.set()
        if releaser is not None:
            releaser.join()
        with _lock:
            ACTIVE[0] -= 1


class UnheldFree:
    """The owner of a cuda.core buffer whose free synchronizes (pinned host memory): the last reference to it
    frees the buffer inside `releasing_holds`, in whichever thread drops it."""

    __slots__ = ("buffer",)

    def __init__(self, buffer: Any) -> None:
        self.buffer = buffer

    def close(self) -> None:
        buffer, self.buffer = self.buffer, None
        if buffer is not None:
            with releasing_holds():
                buffer.close()

    def __del__(self) -> None:
        self.close()


#: (the watchdog thread, its stop event) while it runs; `holds.hold` starts it when the thread is None
WATCH: list[Any] = [None, None]
#: (GPU index, hold word) -> ``[value, steps]``: the value of its latest watched hold (`holds.hold(...,
#: watched=True)`, a hold that spans one launch) and the steps its thread has made since (`progressed` counts them
#: in this list, which the hold's token shares). The latest is enough: a word that reaches it has passed every
#: earlier hold on it.
WATCHED: dict[tuple[int, int], Any] = {}


def watch() -> None:
    """Start the watchdog (``asyncgpu-holdwatch``) unless it runs: every `WATCHDOG_PERIOD_S` it looks at the
    watched holds (`WATCHED`), and ends one it saw open with no step made at `WATCHDOG_STUCK_LOOKS` looks in a row
    (`RESCUED`). It stops after `WATCHDOG_IDLE_LOOKS` looks without a watched hold (a second), or at `unwatch` (a
    CUDA device's close); the next watched hold starts it again. Any thread."""
    with _lock:
        if WATCH[0] is not None:
            return
        stop = threading.Event()
        thread = threading.Thread(target=_watchdog, args=(stop,), name="asyncgpu-holdwatch", daemon=True)
        try:
            thread.start()
        except RuntimeError:  # interpreter shutdown: no thread starts, and no loop makes holds then
            return
        WATCH[0], WATCH[1] = thread, stop


def unwatch() -> None:
    """Stop the watchdog and join it (at most one look, microseconds). Any thread but the watchdog's."""
    with _lock:
        thread, stop = WATCH
        WATCH[0] = WATCH[1] = None
    if thread is not None:
        stop.set()
        thread.join()


def _watchdog(stop: threading.Event) -> None:
    seen: dict[tuple[int, int], tuple[tuple[int, int], int]] = {}  # open watched holds: (entry, looks it was seen)
    me, idle = threading.current_thread(), 0
    while not stop.wait(WATCHDOG_PERIOD_S):
        if not WATCHED:  # (a hold registers itself before it looks for a watchdog: no hold goes unwatched)
            idle += 1
            if idle >= WATCHDOG_IDLE_LOOKS:
                with _lock:
                    if not WATCHED and WATCH[0] is me:
                        WATCH[0] = WATCH[1] = None
                        return
            seen = {}
            continue
        idle = 0
        now: dict[tuple[int, int], tuple[tuple[int, int], int]] = {}
        for key, entry in list(WATCHED.items()):
            gates = GATES.get(key[0])
            if gates is None:
                continue
            words, slot, value = gates.words, key[1], entry[0]
            if 0 < (value - words[slot]) & MASK32 < 0x80000000:  # still open
                state = (value, entry[1])  # (a snapshot: the launching thread counts steps in ``entry``)
                before = seen.get(key)
                looks = before[1] + 1 if before is not None and before[0] == state else 1  # (a step: counted anew)
                if looks < WATCHDOG_STUCK_LOOKS:
                    now[key] = (state, looks)
                    continue
                words[slot] = value  # open, with no step, at that many looks: its thread is stuck
                RESCUED[0] += 1
            latest = WATCHED.get(key)
            if latest is not None and latest[0] == value:  # (ended: forgotten, unless a newer hold took its place)
                WATCHED.pop(key, None)
        seen = now


def _after_fork_in_child() -> None:
    WATCH[0] = WATCH[1] = None  # (the parent's watchdog has no thread here: the child's next hold starts one)


if hasattr(os, "register_at_fork"):  # (not on Windows, which has no fork)
    os.register_at_fork(after_in_child=_after_fork_in_child)
