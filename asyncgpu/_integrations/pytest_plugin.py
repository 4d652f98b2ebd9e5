"""pytest plugin (entry point ``pytest11: asyncgpu``): a ``gpu`` marker and an ``asyncgpu_timer`` fixture.

- ``@pytest.mark.gpu`` skips the test, with the reason, where no CUDA GPU is usable; ``@pytest.mark.gpu(2)``
  (or ``count=2``) where fewer than two are. The driver is probed once, and only when a marked test runs.
- ``asyncgpu_timer`` yields an open `gpu_timer` scope (blocking form, ``all_threads=True``) over the devices
  of the test: every CUDA GPU for a test marked ``gpu``, else the devices of ``--asyncgpu-backend`` (default:
  ``$ASYNCGPU_BACKEND``, else cuda), skipping the test when there are none. It records what the test launches
  through asyncgpu, in any thread or task that has no scope of its own; the scope ends right after the test
  function (waiting for the devices), and its report is attached to the test's report as the section
  "asyncgpu" (shown for failures, and with ``-rA``). Read results in a later fixture or a teardown through the
  returned `Timer`.

Loading the plugin imports nothing heavy: asyncgpu is imported when a marked test or the fixture runs.
Disable it with ``-p no:asyncgpu``.
"""

from __future__ import annotations

from typing import Any, Iterator

import pytest

__all__ = ["asyncgpu_timer"]

_TIMER = pytest.StashKey[Any]()
_probe: tuple[bool, str, int] | None = None


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("asyncgpu")
    group.addoption(
        "--asyncgpu-backend",
        choices=("cuda", "host"),
        default=None,
        help="devices of the asyncgpu_timer fixture for tests not marked gpu (default: $ASYNCGPU_BACKEND, else cuda)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu(count=1): needs `count` CUDA GPUs (skipped otherwise, with the reason)")


def _cuda() -> tuple[bool, str, int]:
    """(usable, why not, device count), probed once per session."""
    global _probe
    if _probe is None:
        from asyncgpu._backends import load_backend

        backend = load_backend("cuda")
        ok, why = backend.available()
        _probe = (ok, why, backend.device_count() if ok else 0)
    return _probe


def _wanted(marker: Any) -> int:
    count = marker.kwargs.get("count", marker.args[0] if marker.args else 1)
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise pytest.UsageError(f"@pytest.mark.gpu takes a GPU count >= 1, not {count!r}")
    return count


def pytest_runtest_setup(item: pytest.Item) -> None:
    marker = item.get_closest_marker("gpu")
    if marker is None:
        return
    want = _wanted(marker)
    ok, why, count = _cuda()
    if not ok:
        pytest.skip(f"needs a CUDA GPU: {why}")
    if count < want:
        pytest.skip(f"needs {want} CUDA GPUs (this machine has {count})")


@pytest.fixture
def asyncgpu_timer(request: pytest.FixtureRequest) -> Iterator[Any]:
    """An open `asyncgpu.gpu_timer` scope over the test's devices; see `asyncgpu._integrations.pytest_plugin`."""
    from asyncgpu._base.errors import NoDeviceError
    from asyncgpu._runtime.select import devices
    from asyncgpu._timing.scope import gpu_timer

    marker = request.node.get_closest_marker("gpu")
    backend = "cuda" if marker is not None else request.config.getoption("asyncgpu_backend")
    try:
        devs = devices(backend)
    except NoDeviceError as exc:
        pytest.skip(str(exc))
    timer = gpu_timer(devs, label=request.node.name, all_threads=True)
    timer.__enter__()
    request.node.stash[_TIMER] = timer
    try:
        yield timer
    finally:
        _finish(request.node, "teardown")  # the call phase did not end it (setup failed, or no call)


def _finish(item: pytest.Item, when: str) -> None:
    timer = item.stash.get(_TIMER, None)
    if timer is None:
        return
    del item.stash[_TIMER]
    timer.__exit__(None, None, None)
    item.add_report_section(when, "asyncgpu", str(timer))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    try:
        return (yield)
    finally:
        _finish(item, "call")  # before the call's report is made: the report carries the timing
