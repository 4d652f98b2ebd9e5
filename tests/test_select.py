"""Choosing devices and backends: never silently, errors that name the fix."""

from __future__ import annotations

import numpy as np
import pytest

import asyncgpu
from asyncgpu import ClosedError, DeviceMismatchError, NoDeviceError
from asyncgpu._backends import load_backend
from asyncgpu.errors import UnknownDeviceError

from .conftest import CUDA_OK


def test_device_names_and_indices():
    a = asyncgpu.device("host:1")
    assert a is asyncgpu.device(1, backend="host") is asyncgpu.device(a)
    assert (a.name, a.index, a.backend) == ("host:1", 1, "host")
    assert len(a.streams) == 2 and a.stream is a.streams[0]


@pytest.mark.parametrize("spec", ["gpu:0", "cuda:x", "host:-1", "", "cuda:0:1"])
def test_unknown_device_names(spec):
    with pytest.raises(UnknownDeviceError, match="cuda:0"):
        asyncgpu.device(spec)


def test_out_of_range_and_wrong_types():
    with pytest.raises(UnknownDeviceError, match="host:63"):
        asyncgpu.device(64, backend="host")
    with pytest.raises(UnknownDeviceError, match="backend"):
        asyncgpu.device(0, backend="tpu")
    with pytest.raises(UnknownDeviceError, match="not a cuda device"):
        asyncgpu.device("host:0", backend="cuda")
    with pytest.raises(TypeError):
        asyncgpu.device(True)
    with pytest.raises(TypeError):
        asyncgpu.device(1.5)


def test_backend_env(monkeypatch):
    monkeypatch.setenv("ASYNCGPU_BACKEND", "host")
    assert [d.name for d in asyncgpu.devices()] == ["host:0", "host:1"]
    assert asyncgpu.device(0).backend == "host"
    monkeypatch.setenv("ASYNCGPU_BACKEND", "opencl")
    with pytest.raises(UnknownDeviceError, match="ASYNCGPU_BACKEND"):
        asyncgpu.devices()


@pytest.mark.skipif(CUDA_OK, reason="checks the machine without a GPU")
def test_no_gpu_raises_and_names_the_host_backend(monkeypatch):
    monkeypatch.delenv("ASYNCGPU_BACKEND", raising=False)
    with pytest.raises(NoDeviceError, match="backend='host'"):
        asyncgpu.devices()
    with pytest.raises(NoDeviceError, match="ASYNCGPU_BACKEND=host"):
        asyncgpu.device(0)
    ok, why = load_backend("cuda").available()
    assert not ok and why


def test_options_apply_when_opening():
    d = asyncgpu.device("host:0", streams=3, max_events=100)
    assert len(d.streams) == 3
    with pytest.raises(ValueError, match="close it"):
        asyncgpu.device("host:0", streams=1)
    d.close()
    assert len(asyncgpu.device("host:0", streams=1).streams) == 1
    with pytest.raises(ValueError, match="at least one stream"):
        asyncgpu.device("host:2", streams=0)


def test_host_devices_count():
    assert len(asyncgpu.devices("host", count=5)) == 5
    with pytest.raises(UnknownDeviceError, match="has 64"):
        asyncgpu.devices("host", count=65)


def test_objects_of_two_devices_do_not_mix(two_devs):
    a, b = two_devs
    arr = a.alloc(10)
    with pytest.raises(DeviceMismatchError, match="allocate it on this device"):
        b.stream.inc_loop(arr, 1)
    with pytest.raises(DeviceMismatchError):
        a.record(b.stream)
    with pytest.raises(DeviceMismatchError):
        b.adopt_stream(a.stream)
    ev = a.record()
    with pytest.raises(DeviceMismatchError):
        b.stream.record(ev)
    ev.release()


def test_workload_argument_errors(dev):
    arr = dev.alloc(8, np.int32)
    with pytest.raises(TypeError, match="float32"):
        dev.stream.inc_loop(arr, 1)
    with pytest.raises(ValueError, match=r"0 \.\. 255"):
        dev.stream.memset(arr, 256)
    with pytest.raises(ValueError, match="alloc_pinned"):
        dev.stream.copy_to_host(arr, np.empty(2, np.int32))
    with pytest.raises(ValueError, match=">= 0"):
        dev.stream.spin_us(-1)
    with pytest.raises(TypeError, match="DeviceArray"):
        dev.stream.memset(np.zeros(4))
    with pytest.raises(ValueError):
        dev.alloc(-1)
    arr.free()
    with pytest.raises(asyncgpu.ReleasedError, match="alloc"):
        dev.stream.memset(arr, 0)


def test_workloads_compute_the_right_thing(dev):
    n = 100_000
    a = dev.alloc(n)
    dev.stream.memset(a, 0)
    dev.stream.inc_loop(a, 7)
    out = dev.alloc_pinned(n)
    dev.stream.copy_to_host(a, out)
    dev.stream.sync()
    assert np.all(out == 7.0)
    assert np.all(a.to_numpy() == 7.0)
    assert np.asarray(a).shape == (n,)


def test_closed_device_everywhere(backend):
    d = asyncgpu.device(0, backend=backend)
    s = d.create_stream()
    d.close()
    d.close()  # idempotent
    for call in (
        d.record,
        d.create_event,
        d.create_stream,
        d.synchronize,
        lambda: d.alloc_pinned(4),
        lambda: asyncgpu.device(d),
    ):
        with pytest.raises(ClosedError, match="asyncgpu.device"):
            call()
    assert s.device is d


def test_objects_have_no_public_constructors():
    for cls in (asyncgpu.Device, asyncgpu.Event, asyncgpu.Stream, asyncgpu.DeviceArray):
        with pytest.raises(TypeError):
            cls()


def test_host_streams_are_not_cuda_streams():
    d = asyncgpu.device("host:0")
    with pytest.raises(TypeError, match="not CUDA streams"):
        d.stream.__cuda_stream__()
    with pytest.raises(TypeError):
        d.adopt_stream(object())
