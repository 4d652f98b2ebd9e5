"""NVTX colours and the profiler capture range (`capture`)."""

from __future__ import annotations

import pytest

from asyncgpu import KINDS, ScopeError, profiler_range
from asyncgpu._timing import nvtx as _nvtx

pytestmark = pytest.mark.anyio


@pytest.fixture
def calls(two_devs, monkeypatch):
    """Every profiler_start/stop and NVTX range, in order, as (what, device name or range message)."""
    log: list[tuple[str, str]] = []
    for d in two_devs:
        for what in ("profiler_start", "profiler_stop"):
            monkeypatch.setattr(d._internal.bd, what, lambda what=what, name=d.name: log.append((what, name)))
    ranges: dict[object, str] = {}

    def sink(what, arg):
        if what == "start":
            ranges[arg[1]] = arg[0]
            log.append(("nvtx start", arg[0]))
        else:
            log.append(("nvtx end", ranges.pop(arg)))

    monkeypatch.setattr(_nvtx, "sink", sink)
    return log


def test_colours_cover_every_kind():
    from nvtx.colors import _NVTX_COLORS

    assert set(_nvtx.KIND_COLORS) == {*KINDS, "scope", "capture"}
    assert all(c in _NVTX_COLORS for c in _nvtx.KIND_COLORS.values())  # names nvtx knows without matplotlib


def test_capture_starts_and_stops_once_in_order(two_devs, calls):
    a, b = two_devs
    with profiler_range(two_devs):
        calls.append(("body", ""))
    assert calls == [
        ("profiler_start", a.name),
        ("profiler_start", b.name),
        ("nvtx start", "capture"),
        ("body", ""),
        ("nvtx end", "capture"),
        ("profiler_stop", b.name),
        ("profiler_stop", a.name),
    ]


async def test_capture_stops_when_the_body_raises(two_devs, calls):
    with pytest.raises(RuntimeError, match="boom"):
        async with profiler_range(two_devs[1]):
            raise RuntimeError("boom")
    name = two_devs[1].name
    assert calls == [
        ("profiler_start", name),
        ("nvtx start", "capture"),
        ("nvtx end", "capture"),
        ("profiler_stop", name),
    ]


def test_inactive_capture_does_nothing(two_devs, calls, monkeypatch):
    for step in range(3):
        with profiler_range(two_devs[0], active=(step == 1)):
            pass
    monkeypatch.setenv("ASYNCGPU_BACKEND", "no-such-backend")
    with profiler_range(active=False):  # resolves no device: the default backend would raise
        pass
    name = two_devs[0].name
    assert calls == [
        ("profiler_start", name),
        ("nvtx start", "capture"),
        ("nvtx end", "capture"),
        ("profiler_stop", name),
    ]


def test_a_failed_start_stops_the_devices_already_started(two_devs, calls, monkeypatch):
    def fail():
        raise RuntimeError("no profiler")

    monkeypatch.setattr(two_devs[1]._internal.bd, "profiler_start", fail)
    with pytest.raises(RuntimeError, match="no profiler"), profiler_range(two_devs):
        pass
    name = two_devs[0].name
    assert calls == [("profiler_start", name), ("profiler_stop", name)]


def test_capture_is_one_block_at_a_time(dev):
    c = profiler_range(dev)  # the host backend's profiler calls are no-ops
    with c, pytest.raises(ScopeError, match="new capture"):
        c.__enter__()
    with c:  # reusable once closed
        pass
