"""Holds: a stream waits on a pinned host word until its event bracket and work are fully enqueued (`hold`,
`release`), so a bracket on an idle stream never counts the host's own time."""

from __future__ import annotations

import threading
from typing import Any

from asyncgpu._backends.cuda.driver import MASK32, PAGE
from asyncgpu._backends.cuda.hotpath import CudaDeviceBase
from asyncgpu._backends.cuda.unheld import ACTIVE, GATES, WATCH, WATCHED, watch
from asyncgpu._base.errors import BackendError


class HoldsMixin(CudaDeviceBase):
    """`CudaDevice`'s holds, on one page of hold words per GPU (`_Gates`, registered in `unheld.GATES`, which
    releases them during synchronizing calls)."""

    def hold(self, raw_stream: Any, watched: bool = False) -> Any:
        if ACTIVE[0]:  # a call that synchronizes the GPU is running: a hold now could stop every thread (`unheld`)
            return None
        gates = GATES.get(self.index)
        if gates is None:
            if self.index in _NO_GATES:
                return None
            gates = self._open_gates()
            if gates is None:
                return None
        key = raw_stream[2]
        slot = gates.slots.get(key)
        if slot is None:
            slot = gates.assign(key)
        value = gates.next[slot] = (gates.next[slot] + 1) & MASK32
        addr = gates.dptr + 4 * slot
        drv = self._drv
        if drv.wait_value_c is not None:
            err = drv.wait_value_c(raw_stream[3], addr, value, 0)  # CU_STREAM_WAIT_VALUE_GEQ (cyclic)
            failed = bool(err)
        else:
            d = drv.d
            res = d.cuStreamWaitValue32(raw_stream[1], addr, value, d.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ)
            failed = res[0] is not drv.SUCCESS
        if failed:  # nothing was enqueued: brackets go unheld from now on (`hold_problem` says why)
            _NO_GATES[self.index] = f"cuStreamWaitValue32 failed on {self.name}: stream memory operations unusable"
            gates.words[slot] = value  # (no stream waits for this value: the word is not behind a hold)
            return None
        cell = None
        if watched:  # (the watchdog ends it if its thread gets stuck in the launch: `unheld`)
            cell = WATCHED[(self.index, slot)] = [value, 0]
            if WATCH[0] is None:
                watch()
        return (gates.words, slot, value, cell)

    def hold_problem(self) -> str | None:
        return _NO_GATES.get(self.index)

    def progressed(self, token: Any) -> None:
        cell = token[3]  # (the watched hold's [value, steps], shared with the watchdog; None: not watched)
        if cell is not None:
            cell[1] += 1

    def release(self, token: Any) -> None:
        words, slot, value, _ = token
        if (value - words[slot]) & MASK32 < 0x80000000:  # never move a word back (holds may end out of order)
            words[slot] = value

    def _open_gates(self) -> _Gates | None:
        with _GATES_LOCK:
            gates = GATES.get(self.index)
            if gates is None and self.index not in _NO_GATES:
                try:
                    gates = GATES[self.index] = _Gates(self)
                except BackendError as exc:
                    _NO_GATES[self.index] = str(exc)
            return gates


class _Gates:
    """One GPU's hold words (`CudaDevice.hold`): a page of pinned, device-mapped uint32 words, one per stream,
    each counting up. Kept for the life of the process (one page per GPU, reused when the device is opened
    again): a stream queued behind a hold may still read its word after the worker that made it closed."""

    def __init__(self, dev: CudaDeviceBase) -> None:
        self.page = dev.alloc_mapped(PAGE)
        self.words = self.page.words
        self.dptr = dev.device_pointer(self.page)
        self.slots: dict[int, int] = {}  # stream handle -> word
        self.next = [0] * (PAGE // 4)  # the value of each word's latest hold
        self._lock = threading.Lock()

    def assign(self, key: int) -> int:
        """The word for the stream ``key``: a word of its own while there are free ones, then a shared one (a
        shared word only lets a hold end early, never late: every release moves it forward)."""
        with self._lock:
            slot = self.slots.get(key)
            if slot is None:
                n = len(self.next)
                if len(self.slots) >= n:
                    return (key >> 4) % n
                slot = self.slots[key] = len(self.slots)
            return slot


_NO_GATES: dict[int, str] = {}  # GPU index -> why its streams cannot be held
_GATES_LOCK = threading.Lock()
