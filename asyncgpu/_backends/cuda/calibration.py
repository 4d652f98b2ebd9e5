"""Clock calibration: ping-pongs between the host and the device through mapped pinned memory (events recorded
behind a host word, or the ``%globaltimer`` kernel), the overhead an event pair adds per kind of work, and pings
between two GPUs through their own memory (`PeerPings`: a reference with no host link in the way)."""

from __future__ import annotations

import ctypes
import time
from typing import Any, Callable

import numpy as np

from asyncgpu._backends.cuda.driver import MASK32, PAGE
from asyncgpu._backends.cuda.hotpath import CudaDeviceBase, MappedPage
from asyncgpu._base.errors import ClockError, SourceError

# Calibration page (mapped pinned host memory), uint32 word indices and the byte offset of the stamps.
_W_FLAG_E, _W_ACK_E, _W_FLAG_K, _W_STARTED_K, _W_ACK_A = 0, 1, 2, 3, 5
_STAMPS_OFFSET, _MAX_STAMPS = 64, 63
_MEMSET_BYTES = 1 << 20  # the overhead calibration's memset, and the source of its copies
_COPY_BYTES = 64 << 10  # its copies to the host (much smaller copies give an unsteady estimate)
_START_TIMEOUT_NS = 20_000_000  # a calibration kernel that has not started by then: the device is busy


class _Calibration:
    """One device's calibration page, stream and 'kernel done' event."""

    def __init__(self, dev: CudaDeviceBase) -> None:
        self.page = dev.alloc_mapped(PAGE)
        self.words = self.page.words
        self.dptr = dev.device_pointer(self.page)
        self.stream = dev.create_stream()
        self.kernel_done = dev.create_event(False)
        self.next_e = self.next_k = 1
        self.copy_page: MappedPage | None = None  # the overhead calibration's copies land here (`bracket_overhead`)

    def close(self, dev: CudaDeviceBase) -> None:
        # Release anything still waiting on the page, let the stream drain, then free.
        self.words[_W_FLAG_E] = (self.next_e - 1) & MASK32
        self.words[_W_FLAG_K] = (self.next_k - 1) & MASK32
        try:
            dev.sync_stream(self.stream)
        finally:
            dev.close_stream(self.stream)
            dev.destroy_event(self.kernel_done)
            self.page.free()
            if self.copy_page is not None:
                self.copy_page.free()


class PeerPings:
    """GPU-to-GPU pings between two CUDA devices through their own memory (kernels/clock.cu's
    ``asyncgpu_clock_peer_ping``, peer access granted both ways): the offset of their ``%globaltimer`` clocks
    measured with no host link in the way, a reference for the host-based calibration (`check_alignment`). Made by
    `ClockMixin.peer_pings`; `measure` blocks the calling thread (two one-thread kernels, ~0.1 ms); `close` frees it.
    ``events``: a timing event of each device, recorded right after each `measure`'s kernel."""

    MAX_PINGS = 64
    TIMEOUT_NS = 50_000_000  # the kernels give up this long after they start (the other side never ran)

    def __init__(self, a: ClockMixin, b: ClockMixin, n: int) -> None:
        if not 1 <= n <= self.MAX_PINGS:
            raise ValueError(f"between 1 and {self.MAX_PINGS} peer pings, not {n}")
        self.devices, self.n, self._next = (a, b), n, 1
        self._sides: list[tuple[Any, Any, Any, Any]] = []  # per device: (stream, word, stamps, event)
        try:
            for d in (a, b):
                stream = d.create_stream()
                word = d.alloc(64, np.uint32, stream)
                stamps = d.alloc(2 * n + 2, np.uint64, stream)
                self._sides.append((stream, word, stamps, d.create_event(True)))
                d.memset(stream, word, 256, 0)
                d.sync_stream(stream)
        except BaseException:
            self.close()
            raise
        self.events = (self._sides[0][3], self._sides[1][3])

    def measure(self) -> tuple[float, float, int, int]:
        """``(D, bound, exit_a, exit_b)``: ``D`` = globaltimer_b − globaltimer_a (ns), the middle of the pings'
        intersection (each ping bounds it by causality alone), ``bound`` its half width, and each kernel's exit
        stamp on its own clock. `ClockError` when a kernel gave up (the devices did not run both at once)."""
        (a, b), n, first = self.devices, self.n, self._next
        self._next = (first + n) & MASK32 or 1
        (sa, wa, ta, ea), (sb, wb, tb, eb) = self._sides
        for d, stream, mine, theirs, stamps, event, initiator in (
            (b, sb, wb, wa, tb, eb, 0),  # (the responder first: it waits for the initiator's first write)
            (a, sa, wa, wb, ta, ea, 1),
        ):
            args = (
                np.uint64(int(mine.handle)),
                np.uint64(int(theirs.handle)),
                np.uint64(int(stamps.handle)),
                np.uint32(first),
                np.uint32(n),
                np.int32(initiator),
                np.uint64(self.TIMEOUT_NS),
            )
            d.launch(stream, d._kernel("asyncgpu_clock_peer_ping"), _one_thread(), args)
            d.record(event, stream)
        for d, (stream, _, _, _) in zip(self.devices, self._sides):
            d.sync_stream(stream)  # (to_numpy's copy does not wait for a non-blocking stream)
        stamps_a, stamps_b = (
            d.to_numpy(stamps, 2 * n + 2, np.uint64).astype(np.int64)
            for d, (_, _, stamps, _) in zip(self.devices, self._sides)
        )
        if stamps_a[2 * n] or stamps_b[2 * n]:
            raise ClockError(f"{a.name} and {b.name} did not run their peer ping kernels at once (one timed out)")
        t0, t1, seen = stamps_a[0 : 2 * n : 2], stamps_a[1 : 2 * n : 2], stamps_b[0 : 2 * n : 2]
        lo, hi = int((seen - t1).max()), int((seen - t0).min())
        if hi < lo:
            raise ClockError(f"{a.name} and {b.name}: the peer pings' brackets do not intersect ({lo} > {hi} ns)")
        return (lo + hi) / 2, (hi - lo) / 2, int(stamps_a[2 * n + 1]), int(stamps_b[2 * n + 1])

    def close(self) -> None:
        for d, (stream, word, stamps, event) in zip(self.devices, self._sides):
            d.sync_stream(stream)
            word.close(stream[0])
            stamps.close(stream[0])
            d.sync_stream(stream)
            d.close_stream(stream)
            d.destroy_event(event)
        self._sides.clear()


def _one_thread() -> Any:
    from cuda.core import LaunchConfig

    return LaunchConfig(grid=1, block=1)


def host_pingpong(words: Any, flag: int, acks: Any, first: int, n: int, timeout_ns: int, name: str) -> np.ndarray:
    """The host half of a ping-pong: for each ping k, read the clock (h0), write ``first + k`` to ``words[flag]``,
    spin until the device acknowledges it, read the clock (h1). ``acks`` is an int: the word of ``words`` the
    device writes each value into (the streams' pings); or an array of ``n`` 64-bit words that read 0 until the
    device writes ping k's stamp into ``acks[k]`` (the kernel's). Returns int64 ``(n, 2)``.

    ``timeout_ns`` bounds each ping's wait for the device: `ClockError` (after releasing the device side) when a
    ping is still unanswered that long after it was written. A host thread that was descheduled past that time
    (another Python thread held the GIL, the OS ran something else) finds the answer there when it runs again:
    that ping only reads a long round trip, which the callers' best-of selection leaves out."""
    clock = time.perf_counter_ns
    out = np.empty((n, 2), np.int64)
    word = acks if isinstance(acks, int) else -1
    for k in range(n):
        v = (first + k) & MASK32
        h0 = clock()
        deadline = h0 + timeout_ns
        words[flag] = v
        late = False  # (tight loops: each turn's cost is the ping's resolution)
        if word >= 0:
            while (words[word] - v) & MASK32 >= 0x80000000:  # cyclic: the ack has not reached v yet
                if clock() > deadline:
                    late = (words[word] - v) & MASK32 >= 0x80000000  # (again: this thread may have slept between)
                    break
        else:
            while not acks[k]:
                if clock() > deadline:
                    late = not acks[k]
                    break
        h1 = clock()
        if late:
            words[flag] = (first + n - 1) & MASK32
            raise ClockError(
                f"{name} did not answer a clock ping within {timeout_ns / 1e6:.1f} ms: its "
                "calibration stream is queued behind other work (too many busy streams)"
            )
        out[k, 0], out[k, 1] = h0, h1
    return out


class ClockMixin(CudaDeviceBase):
    """`CudaDevice`'s clock calibration."""

    def own_streams(self) -> list[tuple[int, int]]:
        cal, marker = self._cal, self._marker
        out = []
        for s in (cal.stream if cal is not None else None, marker):
            if s is not None:
                err, ctx = self._drv.d.cuStreamGetCtx(s[1])
                if err is self._drv.SUCCESS:
                    out.append((int(ctx), s[2]))
        return out

    def peer_pings(self, other: ClockMixin, n: int = 32) -> PeerPings | None:
        """GPU-to-GPU pings with ``other`` (`PeerPings`), or None when the two cannot access each other's memory
        (no NVLink or PCIe peer to peer between them). Grants that access both ways (memory pools included)."""
        if not (self._dev.can_access_peer(other.index) and other._dev.can_access_peer(self.index)):
            return None
        if other.index not in self._peer_sources:
            self._grant_peer_access(other.index)
        if self.index not in other._peer_sources:
            other._grant_peer_access(self.index)
        return PeerPings(self, other, n)

    def _calibration(self) -> _Calibration:
        if self._cal is None:
            with self._kernel_lock:
                if self._cal is None:
                    self._cal = _Calibration(self)
        return self._cal

    def wait_value_record(
        self, raw_stream: Any, flag_dptr: int, value: int, raw_event: Any, ack_dptr: int | None = None
    ) -> None:
        """Enqueue: wait (on the device) until the uint32 at ``flag_dptr`` reaches ``value`` (cyclic compare),
        record ``raw_event``, then write ``value`` to ``ack_dptr``. No SM is involved."""
        d = self._drv.d
        err = d.cuStreamWaitValue32(
            raw_stream[1], flag_dptr, value & MASK32, d.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ
        )[0]
        if err is not self._drv.SUCCESS:
            raise ClockError(
                f"{self.name} cannot wait on host memory (cuStreamWaitValue32: {err.name}): stream "
                "memory operations are unsupported by this driver or device"
            )
        self.record(raw_event, raw_stream)
        if ack_dptr is not None:
            err = d.cuStreamWriteValue32(
                raw_stream[1], ack_dptr, value & MASK32, d.CUstreamWriteValue_flags.CU_STREAM_WRITE_VALUE_DEFAULT
            )[0]
            if err is not self._drv.SUCCESS:
                raise self._drv.error(err, "cuStreamWriteValue32")

    def launch_pingpong(
        self, raw_stream: Any, flag_dptr: int, started_dptr: int, stamps_dptr: int, first: int, n: int
    ) -> None:
        """Launch kernels/clock.cu's ``asyncgpu_clock_pingpong`` (one thread). Its ``n + 1`` stamps must read 0
        before: a stamp is its ping's acknowledgement."""
        args = (
            np.uint64(flag_dptr),
            np.uint64(started_dptr),
            np.uint64(stamps_dptr),
            np.uint32(first & MASK32),
            np.uint32(n),
        )
        self.launch(raw_stream, self._kernel("asyncgpu_clock_pingpong"), _one_thread(), args)

    def calibrate_events(self, raw_events: list, timeout_ns: int) -> np.ndarray:
        cal = self._calibration()
        n = len(raw_events)
        first = cal.next_e
        cal.next_e = (first + n) & MASK32
        try:
            for k, raw in enumerate(raw_events):
                self.wait_value_record(cal.stream, cal.dptr + 4 * _W_FLAG_E, first + k, raw, cal.dptr + 4 * _W_ACK_E)
        except BaseException:
            cal.words[_W_FLAG_E] = (first + n - 1) & MASK32  # release what was enqueued
            raise
        return host_pingpong(cal.words, _W_FLAG_E, _W_ACK_E, first, n, timeout_ns, self.name)

    def calibrate_globaltimer(self, n: int, timeout_ns: int, raw_event: Any = None) -> tuple:
        if not 1 <= n <= _MAX_STAMPS:
            raise ValueError(f"between 1 and {_MAX_STAMPS} globaltimer samples, not {n}")
        cal = self._calibration()
        if not self.query(cal.kernel_done):
            raise ClockError(
                f"{self.name}'s previous calibration kernel has not run yet: the device is busy "
                "(every SM taken by long kernels); calibrate again when it is idle"
            )
        first = cal.next_k
        cal.next_k = (first + n) & MASK32
        d, words = cal.dptr, cal.words
        ctypes.memset(cal.page.ptr + _STAMPS_OFFSET, 0, 8 * (n + 1))  # (the kernel is done: nothing reads them)
        self.launch_pingpong(cal.stream, d + 4 * _W_FLAG_K, d + 4 * _W_STARTED_K, d + _STAMPS_OFFSET, first, n)
        if raw_event is not None:
            self.record(raw_event, cal.stream)
            err = self._drv.d.cuStreamWriteValue32(
                cal.stream[1],
                d + 4 * _W_ACK_A,
                first,
                self._drv.d.CUstreamWriteValue_flags.CU_STREAM_WRITE_VALUE_DEFAULT,
            )[0]
            if err is not self._drv.SUCCESS:
                raise self._drv.error(err, "cuStreamWriteValue32")
        self.record(cal.kernel_done, cal.stream)
        deadline = time.perf_counter_ns() + _START_TIMEOUT_NS
        while words[_W_STARTED_K] != first:
            if time.perf_counter_ns() > deadline:
                words[_W_FLAG_K] = (first + n - 1) & MASK32  # the kernel runs through at once when it starts
                raise ClockError(
                    f"{self.name}'s calibration kernel did not start within "
                    f"{_START_TIMEOUT_NS // 1_000_000} ms: the device is busy"
                )
        acks = (ctypes.c_uint64 * (n + 1)).from_address(cal.page.ptr + _STAMPS_OFFSET)
        hosts = host_pingpong(words, _W_FLAG_K, acks, first, n, timeout_ns, self.name)
        after = None
        if raw_event is not None:
            deadline = time.perf_counter_ns() + timeout_ns
            while words[_W_ACK_A] != first:
                if time.perf_counter_ns() > deadline:
                    raise ClockError(f"{self.name} did not reach the event after its calibration kernel")
            after = time.perf_counter_ns()
        # numpy reads the ctypes array through the buffer protocol (its stubs do not list ctypes arrays)
        stamps = np.frombuffer(cal.page.view, dtype=np.uint64, count=n + 1, offset=_STAMPS_OFFSET).astype(np.int64)  # type: ignore[call-overload]
        return np.column_stack([stamps[:n], hosts]), (int(stamps[n]), after)

    def bracket_overhead(self, repeats: int = 21) -> tuple[dict[str, float], str]:
        """What a pair of events adds to the time of what it brackets on the GPU, ns, per kind of work (``"kernel"``,
        ``"memset"``, ``"memcpy"`` to the host, ``"memcpy_d2d"`` between device buffers, and ``"memset_spill"``,
        ``"memcpy_d2d_spill"``, ``"kernel_spill"`` for such work that spills the L2, `cache_bytes`): the median over
        ``repeats`` of elapsed(start, end) minus the work's own time, for a 20 µs kernel, a 1 MB memset, a 64 KB copy to
        the host, a 512 KB copy between device buffers, a memset of twice the L2, a copy of the L2's size and an
        ``inc_loop`` over twice the L2 (one pass: a memory-bound kernel), queued behind a 1 ms kernel (so the GPU never
        waits for the host), each pair held and primed as an event-timing scope holds and primes its launches (`hold`,
        `prime`). The kinds differ (a copy to the host's pair adds more than a kernel's; around work that spills the L2
        the pair costs the stream more on some machines, less on others: `dev/diag_spill.py`), and so do machines. The
        spilling kinds are left out when their buffer (twice the L2) cannot be allocated. Where they were measured,
        memsets of a quarter to all of the L2 are measured too (`_spill_ladder`), and the device's `spill_bytes` is set
        from them (`spill_threshold`): from how many bytes on a memset's pair costs what it costs around the spilling
        one; and the ``inc_loop`` of ``_MANY_PASSES`` over twice the L2 is timed against its one pass, which sets
        `memory_bound_passes`: up to how many passes an ``inc_loop`` over ``spill_bytes`` still spills.

        The work's own time is CUPTI's record of it where CUPTI can be used here (cupti-python installed, no
        other profiler subscribed: the session is opened for this work and closed again): what the events source
        is compared with. Otherwise only the kernel is measured, against its first-to-last ``%globaltimer`` span,
        which leaves out its own launch and exit (~1 µs): durations then read that much short. Blocks the
        calling thread for its rounds (up to ten against CUPTI, each a 1 ms kernel, its work and a flush; the
        first CUPTI session of a process: longer)."""
        from asyncgpu._backends import cupti

        use_cupti = cupti.available()[0]
        if use_cupti:
            try:
                cupti.acquire(cupti.CALIBRATION)
            except SourceError:
                use_cupti = False
        try:
            if not use_cupti:
                elapsed, spans = self._bracket_pairs(repeats, ("kernel",))
                return {"kernel": float(np.median(elapsed["kernel"] - spans))}, (
                    "against the kernel's own %globaltimer span (no CUPTI)"
                )
            out: dict[str, float] = {}
            # Rounds of their own: CUPTI calls every copy "memcpy" (and a spilling memset "memset"), so the copies
            # between device buffers (each behind its primer, another copy) are told apart by running them alone,
            # second in each primer-copy pair, and the spilling kinds by running each alone.
            first: tuple[np.ndarray, np.ndarray] | None = None  # the kernels' (elapsed, spans)
            spill_pairs: np.ndarray | None = None  # the spilling kernel's pairs (elapsed ns): `memory_bound_passes`
            rounds: list[tuple[str, ...]] = [("kernel", "memset", "memcpy"), ("memcpy_d2d",)]
            if self.cache_bytes is not None:  # (a round each: CUPTI names them as their small kinds)
                rounds += [("memset_spill",), ("memcpy_d2d_spill",), ("kernel_spill",)]
            for kinds in rounds:
                try:
                    elapsed, spans = self._bracket_pairs(repeats, kinds)
                except MemoryError:  # (the spilling kinds' buffer: left out, their work takes the small kinds' cut)
                    continue
                if first is None:
                    first = elapsed["kernel"], spans
                spill_pairs = elapsed.get("kernel_spill", spill_pairs)
                records, _ = cupti.flush(cupti.CALIBRATION)
                for kind, pairs in elapsed.items():
                    ns = pair_excess_ns(records, kind, self.index, pairs)
                    if ns is not None:
                        out[kind] = ns
            if "kernel" not in out and first is not None:  # (CUPTI missed them: the span's estimate, and say so)
                return {"kernel": float(np.median(first[0] - first[1]))}, (
                    "against the kernel's own %globaltimer span (CUPTI did not record the calibration)"
                )
            how = f"against CUPTI ({repeats} of each)"
            if spill_pairs is not None and "kernel_spill" in out:
                try:
                    passes, _ = self._bracket_pairs(_PASSES_REPEATS, ("kernel_passes",))
                except MemoryError:
                    passes = None
                cupti.flush(cupti.CALIBRATION)  # (their records: not needed)
                if passes is not None:
                    one, many = (
                        float(np.median(p)) - out["kernel_spill"] for p in (spill_pairs, passes["kernel_passes"])
                    )
                    self.memory_bound_passes = memory_bound_passes(one, many)
                    how += f"; inc_loop bound by memory up to {self.memory_bound_passes} passes"
            if self.cache_bytes is not None and "memset" in out and "memset_spill" in out:
                ladder = self._spill_ladder(repeats)
                self.spill_bytes = spill_threshold(out["memset"], out["memset_spill"], ladder, 2 * self.cache_bytes)
                how += "; " + describe_ladder(out["memset"], ladder, self.spill_bytes, self.cache_bytes)
            return out, how
        finally:
            if use_cupti:
                cupti.release(cupti.CALIBRATION)

    def _spill_ladder(self, repeats: int) -> list[tuple[int, float]]:
        """The held pair's overhead (ns, against CUPTI, in an open `cupti.CALIBRATION` session) around memsets of
        a quarter, a half, three quarters and all of the L2, a round each: ``[(bytes, ns)]``, the sizes whose
        buffer could be allocated and whose records CUPTI gave."""
        from asyncgpu._backends import cupti

        assert self.cache_bytes is not None
        ladder: list[tuple[int, float]] = []
        for size in (self.cache_bytes // 4, self.cache_bytes // 2, 3 * self.cache_bytes // 4, self.cache_bytes):
            try:
                elapsed, _ = self._bracket_pairs(repeats, ("memset_part",), part_bytes=size)
            except MemoryError:
                break
            records, _ = cupti.flush(cupti.CALIBRATION)
            ns = pair_excess_ns(records, "memset_part", self.index, elapsed["memset_part"])
            if ns is not None:
                ladder.append((size, ns))
        return ladder

    def _bracket_pairs(
        self, repeats: int, kinds: tuple[str, ...], part_bytes: int = 0, tail_ns: int = 0, timed_tail: bool = False
    ) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Run ``repeats`` held event pairs around each kind of work of `bracket_overhead` named in ``kinds``
        (and ``"memset_part"``, ``"memcpy_d2d_part"``: a memset, a copy between device buffers, of ``part_bytes``),
        each pair followed by a spin of ``tail_ns`` when that is not 0 (``timed_tail``: held, in a pair of its own, as a
        scope times the next launch: `dev/diag_copy_cut.py`), behind a 1 ms kernel on the
        calibration stream: ``({kind: elapsed ns}, the kernels' in-kernel spans ns)``. Blocks until they ran
        (`ClockError` after 100 ms); `MemoryError` when the spilling kinds' buffer (twice the L2) cannot be
        allocated."""
        cal = self._calibration()
        s = cal.stream
        one = _one_thread()
        kernel = self._kernel("asyncgpu_clock_bracket")
        self.prepare_kernel(kernel)  # loaded now, not at its first launch inside a hold (a load may synchronize)
        if "kernel_spill" in kinds or "kernel_passes" in kinds:
            self.prepare("inc_loop")
        out = self.alloc(2 * repeats, np.uint64, s)  # device memory: stores to host memory would slow the exit
        scratch = self.alloc(_MEMSET_BYTES, np.uint8, s)
        half = _MEMSET_BYTES // 2
        if cal.copy_page is None:
            cal.copy_page = self.alloc_mapped(_COPY_BYTES)
        host = np.frombuffer(cal.copy_page.view, np.uint8, _COPY_BYTES)  # type: ignore[call-overload]
        big, big_bytes = None, 2 * (self.cache_bytes or 0)  # twice the L2 (`cache_bytes`)
        if big_bytes and any(k.endswith(("_spill", "_part", "_passes")) for k in kinds):
            try:
                big = self.alloc(big_bytes, np.uint8, s)
            except Exception as exc:  # (the driver's out-of-memory error, whichever class cuda.core gives it)
                out.close()
                scratch.close()
                raise MemoryError(f"{self.name}: no {big_bytes >> 20} MB for the spilling pairs ({exc})") from exc
        ops: dict[str, Callable[[int], None]] = {
            "kernel": lambda k: self.launch(s, kernel, one, (np.uint64(20_000), np.uint64(int(out.handle) + 16 * k))),
            "memset": lambda k: self.memset(s, scratch, _MEMSET_BYTES, 0),
            "memcpy": lambda k: self.copy_to_host(s, scratch, host, _COPY_BYTES),
            "memcpy_d2d": lambda k: self._drv_check(
                self._drv.d.cuMemcpyDtoDAsync(int(scratch.handle) + half, int(scratch.handle), half, s[1])[0],
                "cuMemcpyDtoDAsync",
            ),
        }
        if big is not None:  # a memset of twice the L2, a copy of the L2's size (its reads and writes: twice)
            ops["memset_spill"] = lambda k: self.memset(s, big, big_bytes, 0)
            ops["memset_part"] = lambda k: self.memset(s, big, min(part_bytes, big_bytes), 0)
            src, half_big = int(big.handle), big_bytes // 2

            def copy_big(nbytes: int) -> None:  # (the first half of ``big`` into its second)
                self._drv_check(
                    self._drv.d.cuMemcpyDtoDAsync(src + half_big, src, nbytes, s[1])[0], "cuMemcpyDtoDAsync"
                )

            ops["memcpy_d2d_spill"] = lambda k: copy_big(half_big)
            ops["memcpy_d2d_part"] = lambda k: copy_big(min(part_bytes, half_big))
            ops["kernel_spill"] = lambda k: self.inc_loop(s, big, big_bytes // 4, 1)  # (float32: reads, writes all)
            ops["kernel_passes"] = lambda k: self.inc_loop(s, big, big_bytes // 4, _MANY_PASSES)
        self.spin(s, 1_000_000)
        pairs = {kind: [(self.create_event(True), self.create_event(True)) for _ in range(repeats)] for kind in kinds}
        tails = [self.create_event(True) for _ in range(2 if timed_tail and tail_ns else 0)]  # (reused: not read)
        try:
            for kind in kinds:
                for k, (a, b) in enumerate(pairs[kind]):
                    if kind == "memcpy" and k == 0:  # as `hooks.launch_now` primes: at the switch, before the hold
                        self.prime(s, "copy")
                    held = self.hold(s, True)
                    try:
                        if kind.startswith("memcpy_d2d"):  # every time, behind the hold
                            self.prime(s, "copy_d2d")
                        self.record(a, s)
                        if held is not None:  # (steps, as `hooks.launch_now` says them: `progressed`)
                            self.progressed(held)
                        ops[kind](k)
                        if held is not None:
                            self.progressed(held)
                        self.record(b, s)
                    finally:
                        if held is not None:
                            self.release(held)
                    if tails:
                        held = self.hold(s, True)
                        try:
                            self.record(tails[0], s)
                            self.spin(s, tail_ns)
                            self.record(tails[1], s)
                        finally:
                            if held is not None:
                                self.release(held)
                    elif tail_ns:
                        self.spin(s, tail_ns)
            deadline = time.perf_counter_ns() + 100_000_000
            last = pairs[kinds[-1]][-1][1]
            while not self.query(last):
                if time.perf_counter_ns() > deadline:
                    raise ClockError(f"{self.name} did not run the overhead calibration within 100 ms: it is busy")
            stamps = self.to_numpy(out, 2 * repeats, np.uint64).astype(np.int64)
            spans = (stamps[1::2] - stamps[0::2]).astype(np.float64)
            elapsed = {kind: np.array([self.elapsed_ms(a, b) * 1e6 for a, b in ps]) for kind, ps in pairs.items()}
            out.close()  # (not on failure: queued work may still use them)
            scratch.close()
            if big is not None:
                big.close()
        finally:
            for ps in pairs.values():
                for a, b in ps:
                    self.destroy_event(a)
                    self.destroy_event(b)
            for e in tails:
                self.destroy_event(e)
        return elapsed, spans

    def _drv_check(self, err: Any, call: str) -> None:
        if err is not self._drv.SUCCESS:
            raise self._drv.error(err, call)


#: the kernel each kernel kind of `bracket_overhead` times (CUPTI's name for it): the lead spin is another kernel
_CALIBRATION_KERNELS = {"kernel": "asyncgpu_clock_bracket", "kernel_spill": "asyncgpu_inc_loop"}


#: `memory_bound_passes`: passes enough that the ``inc_loop``'s arithmetic, not its traffic, sets its time (run 60,
#: H100: from under a hundred on), and how many times they run
_MANY_PASSES, _PASSES_REPEATS = 256, 5


def memory_bound_passes(one_ns: float, many_ns: float) -> int:
    """Up to how many passes asyncgpu's ``inc_loop`` over twice the L2 is bound by its memory traffic
    (`BackendDevice.memory_bound_passes`): the passes whose arithmetic takes one pass's time, ``one_ns`` (a
    memory-bound pass), at the rate of ``_MANY_PASSES`` of them, which took ``many_ns`` (their arithmetic's time):
    ``_MANY_PASSES × one / many``, at least 1. The arithmetic's own fixed start makes it a little low."""
    if many_ns <= 0 or one_ns <= 0:
        return 1
    return max(1, int(_MANY_PASSES * one_ns / many_ns))


def pair_excess_ns(records: list, kind: str, device: int, pairs_ns: np.ndarray) -> float | None:
    """The median of what each held pair of a `bracket_overhead` round added to its ``kind`` of work over CUPTI's
    record of that work, ns: ``pairs_ns`` (the pairs' elapsed times, in launch order) against the flush's
    ``records`` (`cupti.flush` tuples) of ``device``. CUPTI names the work by its own kinds (``"memcpy_d2d*"``
    are ``"memcpy"``, every ``"memset*"`` is ``"memset"``); a copy between device buffers follows its primer,
    another copy (every second record); a kernel kind's kernel is the one it times (`_CALIBRATION_KERNELS`). None
    unless CUPTI recorded each."""
    repeats, d2d = len(pairs_ns), kind.startswith("memcpy_d2d")
    want, kernel = kind.split("_")[0], _CALIBRATION_KERNELS.get(kind)
    mine = sorted(
        (r for r in records if r[0] == want and r[4] == device and (kernel is None or r[6] == kernel)),
        key=lambda r: r[1],
    )
    mine = mine[1::2] if d2d else mine[-repeats:]
    if len(mine) != repeats:
        return None
    return float(np.median(pairs_ns - np.array([r[2] - r[1] for r in mine], np.float64)))


def spill_threshold(small_ns: float, spill_ns: float, ladder: list[tuple[int, float]], largest: int) -> int:
    """From how many bytes a memset's event pair costs what it costs around work that spills the cache
    (`BackendDevice.spill_bytes`): the smallest size of the ``ladder`` (``[(bytes, overhead ns)]``, growing)
    from which on every measured size reads nearer ``spill_ns`` (the overhead around a memset of ``largest``
    bytes) than ``small_ns`` (around a small memset); ``largest`` when none does. Where the two overheads differ
    by little, either answer costs little: a size's error is at most half their difference, plus its own noise."""
    threshold = largest
    for size, ns in reversed(ladder):
        if abs(ns - spill_ns) >= abs(ns - small_ns):
            break
        threshold = size
    return threshold


def describe_ladder(small_ns: float, ladder: list[tuple[int, float]], threshold: int, cache_bytes: int) -> str:
    """What `spill_threshold` found, for a clock's ``overhead_source``."""
    mb = "/".join(f"{size / 2**20:.0f}" for size, _ in ladder)
    us = "/".join(f"{(ns - small_ns) / 1e3:+.2f}" for _, ns in ladder)
    return (
        f"memsets spilling from {threshold / 2**20:.0f} MB (L2 {cache_bytes / 2**20:.0f} MB; memsets of {mb} MB: "
        f"{us} µs over the small memset's; copies from the L2's size)"
    )
