"""One sync/async convention, units in names, old names that still work for one release, and a light import."""

from __future__ import annotations

import math
import subprocess
import sys
import threading

import pytest

import asyncgpu
from asyncgpu import Channel, gpu_timer

pytestmark = pytest.mark.anyio


def test_import_asyncgpu_loads_no_cuda():
    code = (
        "import sys, asyncgpu, asyncgpu.kernel, asyncgpu.ranks; "
        "print(sorted(m for m in sys.modules if m == 'asyncgpu._backends.cuda' or m.startswith('cuda')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_event_wait_sync_and_no_old_name(dev):
    dev.stream.spin_us(200)
    ev = dev.record()
    ev.wait_sync(timeout_s=10)
    assert ev.query()
    assert not hasattr(ev, "sync")  # (its old name, removed in 0.3)
    ev.release()


async def test_blocking_forms_refuse_an_event_loop_thread(dev):
    ch = Channel(1)
    with pytest.raises(RuntimeError, match="await channel.put"):
        ch.put_sync(1, stream=dev.stream)
    with pytest.raises(RuntimeError, match="await channel.get"):
        ch.get_sync()
    h = await ch.put(1, stream=dev.stream)
    with pytest.raises(RuntimeError, match="await handoff.wait_done"):
        h.wait_done_sync()
    with await ch.get() as got:
        assert got.payload == 1
    await h.wait_done()


def test_channel_awaitables_in_a_plain_thread_name_the_blocking_forms(dev):
    ch = Channel(2)
    with pytest.raises(RuntimeError, match=r"Channel.put_sync\(\)"):
        ch.put(7, stream=dev.stream)
    h = ch.put_sync(7, stream=dev.stream)
    with pytest.raises(RuntimeError, match=r"Channel.get_sync\(\)"):
        ch.get()
    got = ch.get_sync(timeout_s=5)
    assert got.payload == 7
    got.done()
    with pytest.raises(RuntimeError, match=r"Handoff.wait_done_sync\(\)"):
        h.wait_done(timeout_s=5)
    h.wait_done_sync(timeout_s=5)
    with pytest.raises(TypeError, match="timeout"):
        ch.get_sync(timeout=5)  # (the old name of timeout_s, removed in 0.3)


def test_put_sync_and_get_sync_across_threads_with_timeouts_in_seconds(dev):
    ch = Channel(1)
    with pytest.raises(TimeoutError):
        ch.get_sync(timeout_s=0.01)
    got = []
    consumer = threading.Thread(target=lambda: got.append(ch.get_sync(timeout_s=5).payload))
    consumer.start()
    ch.put_sync("x", stream=dev.stream, timeout_s=5)
    consumer.join()
    assert got == ["x"]


def test_benchmark_max_duration_s_and_no_old_name(dev):
    r = asyncgpu.benchmark(lambda s: s.spin_us(50), n_repeat=10_000, n_warmup=0, max_duration_s=0, devices=dev)
    assert r.stop_reason == "max_duration"
    with pytest.raises(TypeError, match="max_duration"):
        asyncgpu.benchmark(lambda s: s.spin_us(50), n_repeat=10, max_duration=0, devices=dev)  # (removed in 0.3)
    with pytest.raises(ValueError, match="max_duration_s is in seconds"):
        asyncgpu.benchmark(lambda s: None, max_duration_s=math.nan, devices=dev)


def test_kernel_profiler_collect_and_no_old_names(dev):
    prof = asyncgpu.kernel.KernelProfiler(dev)
    a = dev.alloc(1 << 16)
    dev.stream.memset(a, 0)
    prof.inc_loop(a, 2)
    assert len(prof.collect_sync()) > 0
    assert not hasattr(prof, "gather_sync") and not hasattr(prof, "gather")  # (old names, removed in 0.3)
    prof.close()


def test_timer_records_is_called_like_the_others(dev):
    with gpu_timer(dev) as t:
        dev.stream.spin_us(10)
    assert t.records() == t.timeline.records() == list(t.records)
    assert [r.name for r in t.records()] == ["spin"]


def test_clock_calibration_to_dict_and_no_old_name(dev):
    cal = dev.clock()
    assert cal.to_dict()["device"] == dev.name
    assert not hasattr(cal, "as_dict")  # (its old name, removed in 0.3)


def test_memory_info(dev):
    info = dev.memory_info()
    assert info is not None and 0 < info[0] <= info[1]
