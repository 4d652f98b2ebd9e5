"""The gpu_timer scope: records, nesting, errors, cancellation, NVTX ranges, the report."""

from __future__ import annotations

import threading

import anyio
import numpy as np
import pytest

import asyncgpu
from asyncgpu import ScopeError, gpu_timer
from asyncgpu._timing import nvtx as _nvtx

pytestmark = pytest.mark.anyio


async def test_scope_records_workloads_and_activities(two_devs):
    async with gpu_timer(two_devs, label="step") as t:
        for d in two_devs:
            a = d.alloc(1000)
            d.stream.memset(a, 0)
            d.stream.inc_loop(a, 3)
            with t.activity("spin block", device=d):
                d.stream.spin_us(5_000)
            out = d.alloc_pinned(1000)
            d.stream.copy_to_host(a, out)
    assert [r.name for r in t.records] == ["memset", "inc_loop", "spin block", "spin", "copy_to_host"] * 2
    assert [r.kind for r in t.records[:5]] == ["memset", "kernel", "user", "kernel", "memcpy"]
    assert all(r.complete for r in t.records)
    spin = [r for r in t.records if r.name == "spin"]
    assert all(4.9 < r.duration_ms < 12 for r in spin)
    by_dev = {}
    for r in t.records:
        by_dev.setdefault(r.device, []).append(r)
    for recs in by_dev.values():  # one stream: issue order is time order
        starts = [r.start_ms for r in recs if r.name != "spin"]
        assert starts == sorted(starts) and starts[0] >= -0.05
    totals = t.totals_by_device()
    assert set(totals) == {d.name for d in two_devs} and all(v > 5 for v in totals.values())
    kinds = t.totals_by("kind")
    assert kinds["kernel"][0] == 4 and kinds["user"][0] == 2
    assert t.host_ms >= 0 and t.cpu_ms >= 0 and t.host_ms + t.wait_ms > 5
    assert all(span >= 5 for span in t.device_span_ms.values())
    for d in two_devs:
        assert d.pool_stats().in_use == 0


async def test_scope_is_not_reusable_and_activities_stay_inside(dev):
    t = gpu_timer(dev)
    async with t:
        pass
    with pytest.raises(ScopeError, match="new gpu_timer"):
        async with t:
            pass
    with pytest.raises(ScopeError, match="inside"):
        with t.activity("late"):
            pass


async def test_activity_needs_a_covered_device(two_devs):
    a, b = two_devs
    async with gpu_timer([a]) as t:
        with pytest.raises(ScopeError, match="does not cover"):
            t.activity("x", device=b)
        with pytest.raises(ValueError, match="kind"):
            t.activity("x", kind="bogus")
    async with gpu_timer(two_devs) as t:
        with pytest.raises(ScopeError, match="name one"):
            t.activity("x")


async def test_nested_scopes_share_activities(dev):
    async with gpu_timer(dev, label="outer") as outer:
        dev.stream.spin_us(1_000)
        async with gpu_timer(dev, label="inner") as inner:
            dev.stream.spin_us(2_000)
        dev.stream.spin_us(1_000)
    assert len(inner.records) == 1 and len(outer.records) == 3
    assert inner.records[0].duration_ms == outer.records[1].duration_ms
    assert outer.records[1].start_ms > inner.records[0].start_ms  # each relative to its own scope start
    assert dev.pool_stats().in_use == 0


async def test_child_tasks_inherit_the_scope(two_devs):
    async with gpu_timer(two_devs) as t:
        async with anyio.create_task_group() as tg:
            for d in two_devs:
                tg.start_soon(_spin_and_wait, d)
    assert sorted(r.device for r in t.records) == sorted(d.name for d in two_devs)


async def _spin_and_wait(d):
    d.stream.spin_us(2_000)
    with d.record() as ev:
        await ev.wait()


async def test_work_outside_any_scope_is_not_recorded(dev):
    dev.stream.spin_us(100)
    async with gpu_timer(dev) as t:
        pass
    dev.stream.spin_us(100)
    assert t.records == []
    assert dev.pool_stats().in_use == 0


async def test_exception_in_scope_keeps_records_and_releases(dev):
    t = gpu_timer(dev, label="failing")
    with pytest.raises(RuntimeError, match="boom"):
        async with t:
            dev.stream.spin_us(3_000)
            raise RuntimeError("boom")
    assert len(t.records) == 1 and t.records[0].complete
    assert t.error == "RuntimeError: boom"
    assert "raised RuntimeError: boom" in str(t)
    assert dev.pool_stats().in_use == 0


async def test_cancelled_scope_returns_promptly_without_leaks(dev):
    t = gpu_timer(dev)
    with anyio.move_on_after(0.05) as scope:
        async with t:
            dev.stream.spin_us(300_000)
            await anyio.sleep(10)
    assert scope.cancelled_caught
    assert len(t.records) == 1 and not t.records[0].complete
    await anyio.to_thread.run_sync(dev.synchronize)
    for _ in range(400):  # deferred releases land once the device passes the events
        if dev.pool_stats().in_use == 0:
            break
        await anyio.sleep(0.005)
    assert dev.pool_stats().in_use == 0


async def test_synchronize_waits_for_all_device_work(dev):
    other = dev.create_stream()
    async with gpu_timer(dev, synchronize=True) as t:
        other.spin_us(20_000)  # on a stream no activity of the scope uses... but timed: it is a workload
    assert t.records[0].complete
    with dev.record(other) as ev:
        assert ev.query() or True
    assert t.host_ms + t.wait_ms >= 19


def test_blocking_form_for_plain_threads(dev):
    with gpu_timer(dev, label="sync") as t:
        dev.stream.spin_us(2_000)
        with t.activity("block"):
            dev.stream.spin_us(1_000)
    assert [r.name for r in t.records] == ["spin", "block", "spin"]
    assert all(r.complete for r in t.records)


async def test_nvtx_ranges_pair_up_across_awaits(dev, monkeypatch):
    events = []
    monkeypatch.setattr(_nvtx, "sink", lambda what, arg: events.append((what, arg)))

    async def task(i):
        async with t.activity(f"a{i}", device=dev):
            dev.stream.spin_us(500)
            await anyio.sleep(0.001)

    async with gpu_timer(dev, label="ranges") as t:
        async with anyio.create_task_group() as tg:
            for i in range(3):
                tg.start_soon(task, i)
    starts = {rid: msg for what, arg in events if what == "start" for msg, rid in [arg]}
    ends = [arg for what, arg in events if what == "end"]
    assert sorted(starts.values()) == ["a0", "a1", "a2", "ranges", "spin", "spin", "spin"]
    assert sorted(map(id, ends)) == sorted(map(id, starts))
    assert events[-1] == ("end", next(rid for rid, msg in starts.items() if msg == "ranges"))


async def test_nvtx_off(dev, monkeypatch):
    events = []
    monkeypatch.setattr(_nvtx, "sink", lambda what, arg: events.append(what))
    async with gpu_timer(dev, nvtx=False):
        dev.stream.spin_us(100)
    assert events == []


async def test_report_renders_every_table(dev):
    async with gpu_timer(dev, label="rep") as t:
        dev.stream.spin_us(1_000)
        a = dev.alloc(10)
        dev.stream.memset(a, 1)
    text = str(t)
    for needle in (
        "gpu_timer 'rep': activities",
        "totals per kind",
        "totals per device",
        "spin",
        "memset",
        dev.name,
        "scope 'rep': host",
        "waiting",
    ):
        assert needle in text
    assert np.all(a.to_numpy().view(np.uint8) == 1)


async def test_timer_over_default_devices_uses_env_backend(monkeypatch):
    monkeypatch.setenv("ASYNCGPU_BACKEND", "host")
    async with gpu_timer() as t:
        pass
    assert [d.name for d in t.devices] == ["host:0", "host:1"]


def test_unknown_devices_in_timer():
    with pytest.raises(asyncgpu.errors.UnknownDeviceError):
        gpu_timer(["host:0", "gpu:3"])
    with pytest.raises(TypeError):
        gpu_timer(3.5)


async def test_report_in_time_order(two_devs):
    a, b = two_devs
    async with gpu_timer(two_devs) as t:
        b.stream.spin_us(3_000)
        a.streams[1].spin_us(1_000)
        a.stream.spin_us(1_000)
    issue = [r.name for r in t.records]
    assert issue == ["spin"] * 3
    text = asyncgpu._analysis.report.render(t.report(order="time"))
    rows = [ln for ln in text.splitlines() if "│ spin" in ln]
    starts = [float(ln.split("│")[0].replace(",", "")) for ln in rows]
    assert starts == sorted(starts) and len(starts) == 3


def test_functional_form_and_report_func(dev, capsys):
    seen = []
    with gpu_timer(dev, report_func=lambda recs, indent: seen.append((len(recs), indent))):
        dev.stream.spin_us(10)
        with gpu_timer(dev, report_func=lambda recs, indent: seen.append((len(recs), indent))):
            dev.stream.spin_us(10)
    assert seen == [(1, "  "), (2, "")]  # the inner scope ends first, indented once
    t = asyncgpu.timing_begin(dev, kinds=["memset"])
    a = dev.alloc(100)
    dev.stream.memset(a, 0)
    dev.stream.spin_us(10)  # not a memset: filtered out
    records = asyncgpu.timing_end()
    assert [r.kind for r in records] == ["memset"] and t.records == records
    asyncgpu.timing_print(records)
    assert "memset" in capsys.readouterr().out
    with pytest.raises(ScopeError, match="timing_begin"):
        asyncgpu.timing_end()
    with pytest.raises(ValueError, match="unknown activity kind"):
        gpu_timer(dev, kinds=["kernels"])


async def test_a_long_scope_gives_finished_events_back_and_places_them_on_the_host_clock(monkeypatch):
    """Activities the device has finished give their events back before the scope ends (harvested on the waiter
    thread): a scope of thousands of activities holds a bounded number of events, and their times stay exact."""
    from asyncgpu._timing import harvest as _timer

    monkeypatch.setattr(_timer, "_CHAIN_STEP_MS", 0.05)  # rotate the chain's reference often
    monkeypatch.setattr(_timer, "_CHAIN_GAP_MS", 2.0)  # and start new chains after short idle gaps
    dev = asyncgpu.device("host:0")
    s = dev.stream
    n = 3_000
    async with asyncgpu.gpu_timer(dev) as t:
        for i in range(n):
            await s.room()
            s.spin_us(20)
            if i % 200 == 199:
                with dev.record() as ev:
                    await ev.wait()
                if i % 1000 == 999:
                    await anyio.sleep(0.005)  # idle: the next activities start a new chain
        peak = dev.pool_stats().created
    assert peak < n  # two events per activity would be 6,000
    tl = t.timeline
    assert len(tl) == n and np.isfinite(tl.start_ns).all() and np.isfinite(tl.duration_ns).all()
    assert (tl.duration_ns >= 20_000).all()
    order = np.argsort(tl.start_ns)
    assert (np.diff(tl.start_ns[order]) > 0).all()
    assert (tl.end_ns[order][:-1] <= tl.start_ns[order][1:] + 1).all()  # one stream: one after the other
    assert tl.start_ns.min() >= t._t0_ns and tl.end_ns.max() <= t._t1_ns + 1e6
    assert dev.pool_stats().in_use <= len(dev._internal.kept_events)  # only the chain's reference is kept


async def test_an_async_scope_shrinks_big_pools_in_a_worker_thread(monkeypatch):
    """Thousands of surplus events go back to the system from a worker thread at an async scope's exit (about
    1 µs each on CUDA: on the loop's thread that would stall it); a few are trimmed at once."""
    dev = asyncgpu.device("host:0")
    loop_thread = threading.get_ident()
    trims = []
    real = dev._internal.trim
    monkeypatch.setattr(dev._internal, "trim", lambda keep=256: trims.append(threading.get_ident()) or real(keep))
    async with asyncgpu.gpu_timer(dev):
        dev.stream.spin_us(1)
    assert trims == [loop_thread]
    for ev in [dev.create_event(timing=False) for _ in range(5_000)]:
        ev.release()
    trims.clear()
    async with asyncgpu.gpu_timer(dev):
        dev.stream.spin_us(1)
    assert len(trims) == 1 and trims[0] != loop_thread
    assert dev.pool_stats(False).free <= 1024
