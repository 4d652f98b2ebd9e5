"""Launch observers: how features see the work launched through the core, without the core importing them.

Every launch through a `Stream` (``launch`` and the built-in workloads) goes through `launch`. A feature that
wants to see launches (timing scopes, `asyncgpu._timer`; the kernel history, `asyncgpu._history`) installs an
observer with `install` while it is active and removes it with `uninstall`, as Triton's launch hooks let Proton
plug in. With no observer installed a launch costs one truth test of `OBSERVERS`.

An observer implements `LaunchObserver`. Besides launches it answers three questions other core parts and
features ask through this module:

* `wanted_kinds` / `adopt`: a graph replay (`asyncgpu._core.graph`) asks which activity kinds the observers
  want timed on a device, records pooled events around those parts, and hands each pair to them.
* `attach`: a feature that draws its own data on a scope's timeline (in-kernel records, handoffs) hands the
  observers a layer (see `asyncgpu._trace`); each open scope covering the device keeps it until it ends.

Threads: launches come from any thread; observers must be thread-safe and cheap. `install`/`uninstall` may be
called from any thread (copy-on-write: the launch path reads the tuple without a lock).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Callable, Protocol

if TYPE_CHECKING:
    from .device import Device
    from .stream import Stream

__all__ = [
    "CaptureHook",
    "LaunchObserver",
    "OBSERVERS",
    "adopt",
    "attach",
    "install",
    "launch",
    "launch_now",
    "uninstall",
    "wanted_kinds",
]


class LaunchObserver(Protocol):
    """What the core calls on an installed observer. Every method may be called from any thread."""

    def launch_begin(self, stream: Stream, name: str, kind: str, fn: Callable[..., Any], args: tuple) -> Any:
        """Before ``fn(*args)`` enqueues work on ``stream``: return a token (recorded start event…), or None
        when this launch does not interest the observer."""

    def launch_end(self, token: Any, ok: bool) -> None:
        """After the launch (``ok`` False: ``fn`` raised, or a later observer's `launch_begin` did)."""

    def wanted_kinds(self, device: Device, kinds: frozenset[str]) -> frozenset[str]:
        """Which of ``kinds`` the observer wants timed on ``device`` now (a graph replay's parts)."""

    def adopt(self, stream: Stream, name: str, kind: str, start_raw: Any, end_raw: Any) -> bool:
        """Take a pair of pooled timing events already enqueued on ``stream`` around an activity; False: not
        wanted (the caller keeps the events)."""

    def attach(self, device: Device, key: Any, make_layer: Callable[[], Any], fence: Stream | None) -> list[Any]:
        """Give each open scope covering ``device`` the layer stored under ``key`` (made by ``make_layer`` the
        first time; ``key=None``: always a new one); ``fence``: a stream the scope also waits for at its end.
        Returns the layers."""


class CaptureHook(Protocol):
    """What a stream's ``capture_hook`` is while a graph capture is open on its device (`asyncgpu._core.graph`)."""

    def timed(self, name: str, kind: str, fn: Callable[..., Any], args: tuple) -> None:
        """Take the launch of ``fn(*args)`` on the hooked stream instead of `launch_now`."""

    def refuse_graph(self, stream: Stream) -> None:
        """Raise if a graph may not be launched on ``stream`` now."""


#: The installed observers, read by the launch path without a lock (replaced, never mutated).
OBSERVERS: tuple[LaunchObserver, ...] = ()
_lock = threading.Lock()


def install(observer: LaunchObserver) -> None:
    """Start calling ``observer`` on every launch (idempotent)."""
    global OBSERVERS
    with _lock:
        if observer not in OBSERVERS:
            OBSERVERS = (*OBSERVERS, observer)


def uninstall(observer: LaunchObserver) -> None:
    """Stop calling ``observer`` (idempotent)."""
    global OBSERVERS
    with _lock:
        OBSERVERS = tuple(o for o in OBSERVERS if o is not observer)


def launch(stream: Stream, name: str, kind: str, fn: Callable[..., Any], *args: Any) -> None:
    """Call ``fn(*args)`` (which enqueues work on ``stream``) with the observers around it: the hot path of
    every built-in workload and launch. While the stream is being captured into a graph, the capture takes the
    call instead (it times the part on every replay)."""
    hook = stream.capture_hook
    if hook is not None:
        hook.timed(name, kind, fn, args)
        return
    launch_now(stream, name, kind, fn, args)


def launch_now(stream: Stream, name: str, kind: str, fn: Callable[..., Any], args: tuple) -> None:
    """`launch` without the capture check."""
    observers = OBSERVERS
    if not observers:  # the hot path: nobody watches this launch
        fn(*args)
        stream.tag = name
        return
    begun: list[tuple[LaunchObserver, Any]] = []
    try:
        for o in observers:
            token = o.launch_begin(stream, name, kind, fn, args)
            if token is not None:
                begun.append((o, token))
        fn(*args)
    except BaseException:
        for o, token in reversed(begun):
            o.launch_end(token, False)
        raise
    for o, token in reversed(begun):
        o.launch_end(token, True)
    stream.tag = name


def wanted_kinds(device: Device, kinds: frozenset[str]) -> frozenset[str]:
    """The activity kinds among ``kinds`` that some observer wants timed on ``device`` now."""
    out: frozenset[str] = frozenset()
    for o in OBSERVERS:
        out |= o.wanted_kinds(device, kinds)
    return out


def adopt(stream: Stream, name: str, kind: str, start_raw: Any, end_raw: Any) -> bool:
    """Hand a pair of pooled timing events around an activity on ``stream`` to the observers. True when one
    took it (it then releases them); False: the caller keeps the events."""
    for o in OBSERVERS:
        if o.adopt(stream, name, kind, start_raw, end_raw):
            return True
    return False


def attach(device: Device, make_layer: Callable[[], Any], *, key: Any = None, fence: Stream | None = None) -> list[Any]:
    """Give a layer (see `asyncgpu._trace`) to every open scope covering ``device``: the one stored under
    ``key`` in each scope (made by ``make_layer`` the first time), or a new one per call when ``key`` is None.
    ``fence``: a stream each such scope also waits for when it ends. Returns the layers (empty: no scope)."""
    out: list[Any] = []
    for o in OBSERVERS:
        out += o.attach(device, key, make_layer, fence)
    return out
