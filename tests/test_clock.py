"""Clock calibration and the host time base: every record gets absolute times; failures are said, not hidden."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

import asyncgpu
from asyncgpu import gpu_timer
from asyncgpu.errors import ClockError

pytestmark = pytest.mark.anyio


def test_calibration_of_a_host_device_is_exact():
    dev = asyncgpu.device(0, backend="host")
    before = time.perf_counter_ns()
    cal = dev.clock()
    assert cal.bound_ns == 0 and cal.globaltimer_offset_ns is None and cal.samples == 16
    assert before <= cal.host_ns <= cal.taken_ns <= time.perf_counter_ns()
    assert dev.clock() is cal  # re-used while young
    assert dev.clock(refresh=True) is not cal
    with pytest.raises(ClockError, match="no %globaltimer"):
        cal.globaltimer_to_host_ns(0)


def test_events_placed_in_a_batch_read_as_placed_one_by_one(dev):
    from asyncgpu._runtime.clock import placement

    events = []
    for _ in range(5):
        dev.stream.spin_us(20)
        events.append(dev.record())
    dev.synchronize()
    place = placement(dev)
    raws = [ev._raw for ev in events]
    one_by_one = [place.host_ns(raw) for raw in raws]
    assert place.host_ns_many(raws).tolist() == one_by_one  # (the same arithmetic: equal to the last bit)
    assert np.all(np.diff(one_by_one) > 0) and place.host_ns_many([]).shape == (0,)
    for ev in events:
        ev.release()


async def test_records_carry_absolute_host_times(two_devs):
    t_before = time.perf_counter_ns()
    async with gpu_timer(two_devs) as t:
        for d in two_devs:
            d.stream.spin_us(2_000)
            d.stream.spin_us(1_000)
    t_after = time.perf_counter_ns()
    tl = t.timeline
    assert tl.aligned and len(tl) == 4
    bound = max(c.bound_ns for c in tl.clocks)
    assert np.all(tl.start_ns >= t_before - bound) and np.all(tl.end_ns <= t_after + bound)
    assert tl.scope_start_ns <= tl.start_ns.min() + bound
    # back to back on one stream: the second starts where the first ends (host time base, both devices), or where
    # the host issued it when it issued it later (a stall of the loop's thread over the first's 2 ms: 4× H100, run
    # 44, the second started 0.5 ms after the first's end)
    for code in range(2):
        rows = np.flatnonzero(tl.device == code)
        assert np.isfinite(tl.issued_ns[rows[1]])
        ready_ns = max(tl.end_ns[rows[0]], tl.issued_ns[rows[1]])
        late_ns = tl.issued_ns[rows[1]] - tl.end_ns[rows[0]]
        assert abs(tl.start_ns[rows[1]] - ready_ns) < 200_000, (
            tl.start_ns[rows[1]] - ready_ns,
            late_ns,
            tl.host_ranges,
        )
        assert tl.duration_ns[rows[0]] > 1.9e6
    r = t.records[0]
    assert r.start_ns == int(tl.start_ns[0]) and r.end_ns - r.start_ns == pytest.approx(r.duration_ms * 1e6, abs=2)
    assert r.start_ms == pytest.approx((r.start_ns - tl.scope_start_ns) / 1e6, abs=1e-6)


async def test_calibration_failure_falls_back_to_relative_time_and_says_so(two_devs, monkeypatch):
    bad, good = two_devs

    def refuse(raws, timeout_ns):
        raise ClockError("injected: the device did not answer")

    monkeypatch.setattr(bad._internal.bd, "calibrate_events", refuse)
    async with gpu_timer(two_devs) as t:
        for d in two_devs:
            d.stream.spin_us(1_000)
    tl = t.timeline
    assert not tl.aligned
    assert not tl.clock(bad.name).aligned and "injected" in tl.clock(bad.name).reason
    assert tl.clock(good.name).aligned
    assert np.all(np.isfinite(tl.start_ns)) and np.all(tl.duration_ns > 0.9e6)  # relative, but present
    assert all(r.complete for r in t.records)


def test_max_clock_age_refreshes_per_scope():
    dev = asyncgpu.device(0, backend="host")
    with gpu_timer(dev, max_clock_age_s=0.0) as t1:
        dev.stream.spin_us(10)
    first = dev.clock(max_age_s=1e9)
    with gpu_timer(dev, max_clock_age_s=0.0) as t2:
        dev.stream.spin_us(10)
    assert dev.clock(max_age_s=1e9) is not first
    assert t1.timeline.aligned and t2.timeline.aligned


@pytest.mark.gpu
def test_cuda_calibration_bounds():
    dev = asyncgpu.device(0, backend="cuda")
    cal = dev.clock(refresh=True, samples=32)
    # %globaltimer pings right after: each one's host bracket is a round trip of this link now
    stamps, _ = dev._internal.bd.calibrate_globaltimer(8, 5_000_000)
    trips_ns = float(np.median(stamps[:, 2] - stamps[:, 1]))
    assert 0 < cal.bound_ns <= cal.rtt_ns / 2 + 1, cal  # the pings' intersection: at most half the best round trip
    assert cal.rtt_ns < 4 * trips_ns, (cal, trips_ns)  # (events pings take ~2 of those: a slow moment was re-measured)
    assert cal.globaltimer_offset_ns is not None and 0 < cal.globaltimer_bound_ns < trips_ns, (cal, trips_ns)
    # an event recorded on an idle stream lands within the launch latency of the host's clock
    for _ in range(5):
        h0 = time.perf_counter_ns()
        ev = dev.record(dev.streams[1])
        ev.wait_sync()
        h1 = time.perf_counter_ns()
        placed = cal.host_ns + dev._internal.bd.elapsed_ms(cal.anchor, ev._raw) * 1e6 * cal.rate
        ev.release()
        assert h0 - cal.bound_ns - 1_000 <= placed <= h1 + cal.bound_ns, (h0, placed, h1)
    # a globaltimer stamp taken in a kernel converts to a host time inside its bracket
    host = cal.globaltimer_to_host_ns(stamps[:, 0])
    slack = cal.globaltimer_bound_ns + 1_000
    assert np.all(host >= stamps[:, 1] - slack) and np.all(host <= stamps[:, 2] + slack)


def test_slow_pings_are_taken_again_once_and_the_tighter_kept(monkeypatch):
    """A calibration whose best round trip is over `SLOW_PINGS_RATIO` times its device's best so far (a slow
    moment of the host or the link) pings once more and keeps the tighter bound; the other's anchor goes back."""
    import types

    from asyncgpu._runtime import clock

    rounds = iter([(4_700, 2_300, "a"), (13_500, 6_700, "slow"), (4_900, 2_400, "again"), (5_000, 2_500, "b")])

    def fake_pings(device, samples, timeout_ns, previous):
        rtt, bound, anchor = next(rounds)
        return clock._Pings(anchor, 0, float(bound), float(rtt), time.perf_counter_ns())

    monkeypatch.setattr(clock, "_pings", fake_pings)
    monkeypatch.setattr(clock, "_BEST_RTT_NS", {})
    dev = types.SimpleNamespace(name="cuda:7", clock_events=[])
    prev = clock.ClockCalibration(
        device="cuda:7", host_ns=0, bound_ns=1.0, samples=1, rtt_ns=1.0, taken_ns=0, bracket_overhead_ns=2_000.0
    )  # (its pair overhead is taken over: no CUPTI measurement here)
    first = clock.calibrate(dev, 16, previous=prev)
    assert (first.rtt_ns, first.anchor, dev.clock_events) == (4_700, "a", [])
    slow = clock.calibrate(dev, 16, previous=prev)  # 13.5 µs > 2 × 4.7: pinged again, the tighter kept
    assert (slow.rtt_ns, slow.bound_ns, slow.anchor, dev.clock_events) == (4_900, 2_400, "again", ["slow"])
    usual = clock.calibrate(dev, 16, previous=prev)  # 5.0 µs: within the ratio, one round
    assert (usual.anchor, dev.clock_events) == ("b", ["slow"])


def test_a_calibration_whose_drift_is_unknown_is_measured_again_sooner():
    """The clocks drift apart by some ppm; until a device has a second of history its drift is unknown, and its
    calibration goes stale after `UNKNOWN_DRIFT_MAX_AGE_S` instead of the caller's age, unless the caller asks for
    no re-measure at all (an infinite age: the calibration that placed earlier records)."""
    from asyncgpu._runtime.clock import UNKNOWN_DRIFT_MAX_AGE_S, ClockCalibration
    from asyncgpu._runtime.clock import stale as _stale

    age_s = (UNKNOWN_DRIFT_MAX_AGE_S + 0.25) / 2  # between the two ages
    taken = time.perf_counter_ns() - int(age_s * 1e9)

    def cal(**kw):
        return ClockCalibration(device="d", host_ns=taken, bound_ns=0.0, samples=1, rtt_ns=0.0, taken_ns=taken, **kw)

    assert _stale(cal(gt_point=(0, 0.0)), 0.25)  # a %globaltimer point, no drift yet
    assert not _stale(cal(gt_point=(0, 0.0), drift_ppm=7.7), 0.25)
    assert not _stale(cal(), 0.25)  # no %globaltimer (the host backend): its own age
    assert _stale(None, 0.25)
    assert not _stale(cal(gt_point=(0, 0.0)), math.inf)  # (4× H100, run 47: a test's read of it re-measured)
    assert _stale(None, math.inf)


def test_the_drift_is_measured_from_the_newest_calibration_at_least_a_window_old():
    """A GPU's drift moves with its load and temperature: each calibration measures it from the newest earlier one
    at least `DRIFT_WINDOW_S` old (the oldest kept before there is one), and lets the older ones go."""
    from asyncgpu._runtime.clock import DRIFT_WINDOW_S, ClockCalibration

    dev = asyncgpu.device(0, backend="host")
    internal = dev._internal
    now = time.perf_counter_ns()

    def cal(ago_s: float) -> ClockCalibration:
        taken = now - int(ago_s * 1e9)
        return ClockCalibration(
            device="d", host_ns=taken, bound_ns=0.0, samples=1, rtt_ns=0.0, taken_ns=taken, gt_point=(taken, 0.0)
        )

    with internal.clock_lock:
        saved = list(internal.clock_points)
        try:
            internal.clock_points.clear()
            assert internal.drift_base() is None
            young = [cal(0.5 * DRIFT_WINDOW_S), cal(0.25 * DRIFT_WINDOW_S)]
            internal.clock_points.extend(young)
            assert internal.drift_base() is young[0]  # (none a window old yet: the oldest)
            old = [cal(3 * DRIFT_WINDOW_S), cal(2 * DRIFT_WINDOW_S), cal(1.5 * DRIFT_WINDOW_S)]
            internal.clock_points.clear()
            internal.clock_points.extend(old + young)
            assert internal.drift_base() is old[2]  # the newest at least a window old
            assert list(internal.clock_points) == old[2:] + young  # the older ones let go
        finally:
            internal.clock_points.clear()
            internal.clock_points.extend(saved)


@pytest.mark.gpu
def test_a_fresh_process_first_calibration_places_stamps_within_its_bound():
    """The case that bit: a device's first calibration also measures the pair overheads (the process's first CUPTI
    session: up to a second), and the clocks drift by some ppm meanwhile. Run alone, in a process of its own."""
    import subprocess
    import sys

    code = """
import numpy as np, asyncgpu
dev = asyncgpu.device(0, backend="cuda")
cal = dev.clock()
stamps, _ = dev._internal.bd.calibrate_globaltimer(8, 5_000_000)
host = cal.globaltimer_to_host_ns(stamps[:, 0])
print(float((stamps[:, 1] - host).max()), float((host - stamps[:, 2]).max()), cal.globaltimer_bound_ns)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    early, late, bound = map(float, out.stdout.split()[-3:])
    # a stamp converts to a host time inside its ping's host bracket, widened by the calibration's own bound
    assert early <= bound and late <= bound, (early, late, bound)


@pytest.mark.gpu
@pytest.mark.multigpu
def test_two_gpus_stamp_one_instant_within_the_target():
    devs = asyncgpu.devices("cuda", count=2)
    result = asyncgpu.check_alignment(devs, trials=10)
    s = result["summary"]
    # (each trial's figures, ns, in every message: which trial missed, and whether the pings' own bound was wide then)
    trials = {
        k: np.round(result[k]).astype(int).tolist()
        for k in ("aligned", "events_aligned", "peer_aligned", "peer_events_aligned", "peer_bound")
    }
    assert s["raw"]["median_abs_ns"] > 1_000  # the GPUs' clocks really are apart
    # %globaltimer stamps, and the events after them, of one instant: the target is 1 µs p50 (1.5 µs max,
    # met over 30 trials in benchmarks/bench_clock.py, but not in every run of 10: single trials reach 4-5 µs)
    assert s["aligned"]["median_abs_ns"] <= 1_000, trials
    assert s["events_aligned"]["median_abs_ns"] <= 1_500, trials
    if result["peer_pairs"]:
        # Against GPU-to-GPU pings (no host link in the way): asyncgpu's own error across the GPUs, the issue's
        # target (1 µs p50, 1.5 µs max)
        assert s["peer_aligned"]["median_abs_ns"] <= 1_000 and s["peer_aligned"]["max_abs_ns"] <= 1_500, trials
        assert s["peer_events_aligned"]["median_abs_ns"] <= 1_000, trials
        assert 0 < s["peer_bound"]["median_abs_ns"] < 2_000, trials  # (the pings' half intersection: a peer link's µs)


@pytest.mark.gpu
def test_the_calibration_says_how_the_pair_overhead_was_measured():
    """Against CUPTI's record of the kernel where CUPTI can be used in this process, else against the kernel's
    own %globaltimer span (and it says so); CUPTI is left free afterwards."""
    from asyncgpu._backends import cupti

    dev = asyncgpu.device(0, backend="cuda")
    cal = dev.clock()
    assert cal.to_dict()["bracket_overhead_source"] == cal.bracket_overhead_source != ""
    usable = cupti.available()[0]
    by_kind, source = dev._internal.bd.bracket_overhead()
    assert all(500 < ns < 20_000 for ns in by_kind.values()), by_kind
    if usable:  # each kind measured against CUPTI's record of it
        kinds = {"kernel", "memset", "memcpy", "memcpy_d2d"}
        bd = dev._internal.bd
        if bd.cache_bytes is not None:  # (and such work that spills the L2, from a size measured on this device)
            kinds |= {"memset_spill", "memcpy_d2d_spill", "kernel_spill"}
            sizes = {bd.cache_bytes // 4, bd.cache_bytes // 2, 3 * bd.cache_bytes // 4, bd.cache_bytes}
            assert bd.spill_bytes in sizes | {2 * bd.cache_bytes}, (bd.spill_bytes, bd.cache_bytes)
            assert "spilling from" in source, source
            assert bd.memory_bound_passes is not None and bd.memory_bound_passes >= 1, bd.memory_bound_passes
            assert f"bound by memory up to {bd.memory_bound_passes} passes" in source, source
        assert source.startswith("against CUPTI") and set(by_kind) == kinds, (source, by_kind)
        assert cupti.available()[0]  # the session was closed again
    else:
        assert "globaltimer" in source and set(by_kind) == {"kernel"}, (source, by_kind)


@pytest.mark.gpu
def test_kernel_durations_net_of_the_event_pair_overhead():
    """100 µs spins queued behind a 2 ms one, timed with and without the correction: the corrected ones read the
    raw ones less the kernel's measured overhead (within the raw ones' own spread), and never under the spin's
    own 100 µs by more than that spread."""
    dev = asyncgpu.device(0, backend="cuda")
    cal = dev.clock()
    assert 500 < cal.bracket_overhead_ns < 20_000, cal
    s = dev.streams[1]
    d = {}
    for subtract in (True, False):
        s.spin_us(1)
        dev.synchronize()
        with gpu_timer(dev, subtract_overhead=subtract, source="events") as t:
            s.spin_us(2_000)  # the host queues the rest while this runs
            for _ in range(10):
                s.spin_us(100)
        d[subtract] = np.array([r.duration_ms * 1e3 for r in t.records[1:]])  # µs
        assert t.timeline.clocks[0].overhead_ns == (cal.bracket_overhead_ns if subtract else 0.0)
    spread = np.ptp(d[False]) + np.ptp(d[True]) + 0.1
    cut_us = cal.bracket_overhead_ns / 1e3
    assert abs(np.median(d[False]) - np.median(d[True]) - cut_us) <= spread, (d, cut_us)
    assert np.all(d[True] > 100 - spread) and np.all(d[False] > 100 + cut_us - spread), (d, cut_us)


class _Page:
    """A calibration page whose device answers each ping the instant it is written, read by a host thread that is
    descheduled once, for ``sleep_s``, while it waits for ping ``late`` (another Python thread holding the GIL)."""

    def __init__(self, flag: int, ack: int, late: int, sleep_s: float, answer: bool = True) -> None:
        self.w = [0] * 8
        self.flag, self.ack, self.late, self.sleep_s, self.answer = flag, ack, late, sleep_s, answer
        self.pings = 0

    def __setitem__(self, i: int, v: int) -> None:
        self.w[i] = v
        if i == self.flag and self.answer:
            self.w[self.ack] = v
            self.pings += 1

    def __getitem__(self, i: int) -> int:
        if i == self.ack and self.pings == self.late + 1 and self.sleep_s:
            self.sleep_s, s = 0.0, self.sleep_s
            time.sleep(s)
        return self.w[i]


@pytest.mark.parametrize("form", ["word", "stamps"])
def test_a_ping_answered_while_the_host_slept_is_kept_not_a_timeout(form):
    """A calibration thread descheduled past a ping's timeout (5 ms: one GIL switch interval of another busy
    Python thread) finds the device's answer there when it runs again: that ping reads a long round trip and the
    calibration goes on. Before, the whole calibration failed as "did not answer" whenever its pings took longer
    than one timeout in all, which a busy neighbour thread made every calibration do."""
    from asyncgpu._backends.cuda.calibration import host_pingpong

    page = _Page(flag=2, ack=1, late=3, sleep_s=0.012)
    first, n = 7, 6
    if form == "word":
        out = host_pingpong(page, 2, 1, first, n, 5_000_000, "dev")
    else:  # the kernel's form: a stamp per ping, non-zero once answered

        class Stamps:
            def __getitem__(self, k: int) -> int:
                return page[1] - first >= k and page[1] != 0  # answered up to the latest ping (reads may sleep)

        out = host_pingpong(page, 2, Stamps(), first, n, 5_000_000, "dev")
    rtt_ms = (out[:, 1] - out[:, 0]) / 1e6
    assert rtt_ms[3] >= 12 and np.delete(rtt_ms, 3).max() < 5, rtt_ms
    assert page.w[2] == first + n - 1


def test_a_ping_the_device_never_answers_fails_after_one_timeout_and_releases_the_device():
    from asyncgpu._backends.cuda.calibration import host_pingpong

    page = _Page(flag=2, ack=1, late=-1, sleep_s=0.0, answer=False)
    t0 = time.perf_counter()
    with pytest.raises(ClockError, match="did not answer a clock ping within 5.0 ms"):
        host_pingpong(page, 2, 1, 40, 16, 5_000_000, "dev")
    assert 0.005 <= time.perf_counter() - t0 < 0.5
    assert page.w[2] == 40 + 16 - 1  # every ping released: nothing on the device waits for the host


def test_memsets_copies_and_kernels_that_spill_the_cache_lose_the_spilling_pairs_overhead():
    """A memset, a copy between device buffers or a kernel that spills the device's cache loses the overhead the
    calibration measured for such work (`cut_kind`); a copy to the host, or work of a device whose calibration
    measured no such kind, lose their own kind's."""
    from asyncgpu._base.records import KIND_CODES
    from asyncgpu._runtime.clock import DeviceClock, Placement, cut_kind

    assert cut_kind("memset", "memset", True) == "memset_spill" and cut_kind("memset", "memset") == "memset"
    assert cut_kind("memcpy", "copy", True) == "memcpy_d2d_spill" and cut_kind("memcpy", "copy") == "memcpy_d2d"
    assert cut_kind("memcpy", "copy_to_host", True) == "memcpy" and cut_kind("graph", "g", True) == "graph"
    assert cut_kind("kernel", "k", True) == "kernel_spill" and cut_kind("kernel", "k") == "kernel"
    dev = asyncgpu.device(0, backend="host")
    clock = DeviceClock(dev.name, True, 0.0)
    cuts = {"kernel": 2000.0, "memset": 2100.0, "memcpy": 3000.0, "memcpy_d2d": 2200.0}
    spilling = {"memset_spill": 2600.0, "memcpy_d2d_spill": 1900.0, "kernel_spill": 2400.0}
    measured = Placement(dev, None, 0.0, 1.0, {**cuts, **spilling}, clock, None)
    unmeasured = Placement(dev, None, 0.0, 1.0, cuts, clock, None)
    # rows: memset, spilling memset, copy to host, spilling copy, copy, spilling kernel
    kinds = np.array([KIND_CODES[k] for k in ("memset", "memset", "memcpy", "memcpy", "memcpy", "kernel")], np.int8)
    d2d = np.array([False, False, False, True, True, False])
    spills = np.array([False, True, False, True, False, True])
    for place, want in (
        (measured, [2100, 2600, 3000, 1900, 2200, 2400]),
        (unmeasured, [2100, 2100, 3000, 2200, 2200, 2000]),
    ):
        start, dur = np.zeros(6), np.full(6, 50_000.0)
        place.trim_columns(np.ones(6, bool), kinds, start, dur, d2d, spills)
        assert np.array_equal(50_000.0 - dur, want) and np.array_equal(start, np.array(want) / 2)
        names = ("memset", "memset", "copy_to_host", "copy", "copy", "k")
        one = [
            50_000.0 - place.trim(k, 0.0, 50_000.0, n, bool(s))[1]
            for k, n, s in zip(("memset", "memset", "memcpy", "memcpy", "memcpy", "kernel"), names, spills)
        ]
        assert one == want


def test_a_launch_says_whether_it_spills_the_devices_cache(monkeypatch):
    """`Stream.memset`, `Stream.inc_loop` and `Stream.copy` flag their launch while the observers see it when its
    bytes reach the backend's `spill_bytes` (a memset, an `inc_loop` that runs, up to `memory_bound_passes`
    passes where measured) or `cache_bytes` (a copy) behind
    other work on the stream, and only then (onto an idle stream, or with nobody timing, never); the flag is down
    again after the launch. A user's kernel is never flagged (what it touches is its own)."""
    from asyncgpu._runtime import hooks
    from asyncgpu._runtime.stream import _spills

    dev = asyncgpu.device(0, backend="host")
    s = dev.stream
    small, big = dev.alloc(999, np.uint8), dev.alloc(1000, np.uint8)  # (bytes: under the limit, at it)
    seen = []

    class Watch:
        def launch_begin(self, stream, name, kind, fn, args):
            seen.append((name, stream._internal.spills))

        def launch_end(self, token, ok):
            pass

        def wanted_kinds(self, device, kinds):
            return frozenset()

        def adopt(self, *a, **k):
            return False

        def correlate(self, stream):
            return None

    bd = dev._internal.bd
    monkeypatch.setattr(bd, "spill_bytes", 1000, raising=False)
    monkeypatch.setattr(bd, "cache_bytes", 2000, raising=False)
    monkeypatch.setattr(bd, "memory_bound_passes", None, raising=False)  # (not measured: any pass count)
    dev.synchronize()
    assert not _spills(s._internal, 1000, 1000)  # (nobody times it)
    watch = Watch()
    hooks.install(watch)
    try:
        s.memset(big, 0)  # onto the idle stream
        dev.synchronize()
        s.spin_us(200_000)  # the stream busy from here on
        s.memset(small, 0)
        s.memset(big, 0)
        s.copy(big, small)  # (a copy: from the cache's size on, 2000 bytes here)
        s.copy(dev.alloc(2000, np.uint8), dev.alloc(2000, np.uint8))
        f_small, f_big = dev.alloc(249, np.float32), dev.alloc(250, np.float32)
        s.inc_loop(f_small, 1)
        s.inc_loop(f_big, 1)
        s.inc_loop(f_big, 0)  # (no pass: touches nothing)
        monkeypatch.setattr(bd, "memory_bound_passes", 3)
        s.inc_loop(f_big, 3)
        s.inc_loop(f_big, 4)  # (its arithmetic bounds it)
        s.launch(lambda: None, None, name="user")
        s.spin_us(1)
    finally:
        hooks.uninstall(watch)
    dev.synchronize()
    assert seen == [
        ("memset", False),
        ("spin", False),
        ("memset", False),
        ("memset", True),
        ("copy", False),
        ("copy", True),
        ("inc_loop", False),
        ("inc_loop", True),
        ("inc_loop", False),
        ("inc_loop", True),
        ("inc_loop", False),
        ("user", False),
        ("spin", False),
    ], seen
    assert not s._internal.spills


def test_an_inc_loop_is_bound_by_memory_up_to_the_passes_whose_arithmetic_takes_one_pass():
    """`memory_bound_passes`: the many passes' time per pass against the one memory-bound pass's time; at least
    one pass, also when a time is not positive."""
    from asyncgpu._backends.cuda.calibration import _MANY_PASSES, memory_bound_passes

    assert memory_bound_passes(80_000.0, 80_000.0 * _MANY_PASSES / 60) == 60
    assert memory_bound_passes(80_000.0, 80_000.0) == _MANY_PASSES  # (as slow as one pass: still memory-bound)
    assert memory_bound_passes(1.0, 1e9) == 1
    assert memory_bound_passes(0.0, 5.0) == memory_bound_passes(5.0, -1.0) == 1


def test_the_spilling_size_is_where_the_pair_costs_what_it_costs_around_spilling_work():
    """`spill_threshold`: the smallest measured size from which on every larger one reads nearer the spilling
    memset's overhead than the small memset's, whichever way the step goes; the largest size when none does."""
    from asyncgpu._backends.cuda.calibration import describe_ladder, spill_threshold

    mb = 1 << 20
    sizes = (12 * mb, 25 * mb, 37 * mb, 50 * mb)
    up = list(zip(sizes, (2410.0, 2450.0, 2760.0, 2790.0)))  # (one H100's kind of step: +0.4 µs from 37 MB)
    assert spill_threshold(2400.0, 2800.0, up, 100 * mb) == 37 * mb
    down = list(zip(sizes, (2400.0, 2380.0, 2390.0, 1990.0)))  # (a step down, at the L2's size only)
    assert spill_threshold(2400.0, 2000.0, down, 100 * mb) == 50 * mb
    never = list(zip(sizes, (2400.0, 2400.0, 2400.0, 2450.0)))
    assert spill_threshold(2400.0, 2800.0, never, 100 * mb) == 100 * mb
    back = list(zip(sizes, (2790.0, 2400.0, 2790.0, 2790.0)))  # (a size under a non-spilling one does not count)
    assert spill_threshold(2400.0, 2800.0, back, 100 * mb) == 37 * mb
    assert spill_threshold(2400.0, 2800.0, [], 100 * mb) == 100 * mb  # (no ladder: the spilling size itself)
    text = describe_ladder(2400.0, up, 37 * mb, 50 * mb)
    assert "from 37 MB" in text and "L2 50 MB" in text and "+0.01/+0.05/+0.36/+0.39 µs" in text, text


def test_a_calibration_round_reads_each_pairs_excess_from_cuptis_records_of_its_own_work():
    """`pair_excess_ns`: each kind's pairs against CUPTI's records of that work on that device, by CUPTI's own kind
    names; a copy between device buffers after its primer; only the calibration's kernel; None when CUPTI missed
    one."""
    from asyncgpu._backends.cuda.calibration import pair_excess_ns

    def rec(kind, start, dur, device=0, name=""):
        return (kind, start, start + dur, 0, device, 7, name)

    pairs = np.array([3000.0, 3100.0, 3200.0])
    memsets = [rec("memset", 100 * i, 1000) for i in range(3)] + [rec("memset", 5, 1000, device=1)]
    for kind in ("memset", "memset_spill", "memset_part"):
        assert pair_excess_ns(memsets, kind, 0, pairs) == 2100.0
    copies = [rec("memcpy", 100 * i, 500 if i % 2 == 0 else 1000) for i in range(6)]  # (primer, copy) x 3
    assert pair_excess_ns(copies, "memcpy_d2d", 0, pairs) == 2100.0
    assert pair_excess_ns(copies, "memcpy_d2d_spill", 0, pairs) == 2100.0
    kernels = [rec("kernel", 100 * i, 1000, name="asyncgpu_clock_bracket") for i in range(3)]
    assert pair_excess_ns(kernels + [rec("kernel", 900, 9, name="user")], "kernel", 0, pairs) == 2100.0
    lead = rec("kernel", -9_000, 1_000_000, name="asyncgpu_spin")  # (the round's lead spin: not the kind's kernel)
    passes = [lead] + [rec("kernel", 100 * i, 1000, name="asyncgpu_inc_loop") for i in range(3)]
    assert pair_excess_ns(passes, "kernel_spill", 0, pairs) == 2100.0
    assert pair_excess_ns(passes, "kernel", 0, pairs) is None
    assert pair_excess_ns(memsets[:2], "memset", 0, pairs) is None  # (CUPTI missed one)
    assert pair_excess_ns(memsets, "memset", 1, pairs) is None


def test_a_scope_hands_its_spilling_rows_to_the_trim(monkeypatch):
    """A scope's harvest marks the activities that spilled the device's cache for `Placement.trim_columns`."""
    from asyncgpu._runtime.clock import Placement

    dev = asyncgpu.device(0, backend="host")
    small, big = dev.alloc(999, np.uint8), dev.alloc(1000, np.uint8)
    monkeypatch.setattr(dev._internal.bd, "spill_bytes", 1000, raising=False)
    got = []
    trim_columns = Placement.trim_columns
    dev.stream.spin_us(100_000)  # (behind other work)

    def spy(self, rows, kind_col, start_col, dur_col, d2d_rows=None, spill_rows=None):
        got.append(None if spill_rows is None else spill_rows[rows].tolist())
        return trim_columns(self, rows, kind_col, start_col, dur_col, d2d_rows, spill_rows)

    monkeypatch.setattr(Placement, "trim_columns", spy)
    with gpu_timer(dev) as t:
        dev.stream.memset(small, 0)
        dev.stream.memset(big, 0)
        dev.stream.spin_us(1)
    assert len(t.records) == 3 and got[-1] == [False, True, False], got


def test_the_event_after_the_kernel_is_placed_by_the_devices_narrow_exit_brackets(monkeypatch):
    """The event after the calibration kernel completes a fixed front-end delay after the kernel's exit stamp; the
    host sees it pass late by however long it took to look. A slow look widens that calibration's own bracket: the
    anchor stays where the device's narrow brackets put it (a low quantile of its latest), not at the slow one's
    middle; a device whose brackets all run wide is placed by them."""
    import types

    from asyncgpu._runtime import clock

    offset_ns, exit_host_ns = 10_000_000, 5_000_000  # %globaltimer − host; the kernel's exit, on the host clock
    looks = iter([1_000, 1_200, 900, 1_100, 1_000, 6_000])

    class Bd:
        def create_event(self, timing):
            return object()

        def calibrate_events(self, raws, timeout_ns):  # wide pings (±4 µs): the kernel's bracket wins
            return np.array([[1_000 * k, 1_000 * k + 8_000] for k in range(len(raws))], np.int64)

        def elapsed_ms(self, a, b):
            return 0.0

        def calibrate_globaltimer(self, n, timeout_ns, raw_event):
            h0 = np.arange(n, dtype=np.int64) * 2_000
            pings = np.column_stack([h0 + 500 + offset_ns, h0, h0 + 1_000])
            return pings, (exit_host_ns + offset_ns, exit_host_ns + next(looks))

    monkeypatch.setattr(clock, "_EXITS_NS", {})
    dev = types.SimpleNamespace(name="cuda:7", bd=Bd(), clock_events=[])
    placed = []
    for _ in range(6):
        p = clock._pings(dev, 4, 1_000_000, None)
        assert p.source == "kernel" and p.gt_bound == 500
        placed.append((p.host_ns - exit_host_ns, p.bound_ns, p.exit_ns))
    assert placed[0] == (500, 1_000, 1_000)  # alone: its own bracket's middle
    slow_at, slow_bound, slow_exit = placed[-1]
    assert slow_exit == 6_000 and 450 <= slow_at <= 550 and slow_bound <= 1_050, placed  # not 3_000 ± 3_500
    monkeypatch.setattr(clock, "_EXITS_NS", {})
    looks = iter([3_000] * 6)
    assert [clock._pings(dev, 4, 1_000_000, None).host_ns - exit_host_ns for _ in range(6)] == [1_500] * 6
