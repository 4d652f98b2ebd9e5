"""The calling convention `Channel` and `Handoff` share: checked timeouts, a deadline for a task's wait, and the
errors and warnings a call gets in the wrong kind of caller (a blocking call in a loop's thread, an awaitable
called from a plain thread)."""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from asyncgpu._base.checks import timeout_s as check_timeout_s
from asyncgpu._runtime.stream import Stream

__all__ = ["blocking_in_loop", "check_wait_stream", "checked_timeout_s", "deprecated_blocking", "time_limit"]


def checked_timeout_s(timeout_s: float | None, timeout: float | None) -> float | None:
    """The checked timeout in seconds; ``timeout`` is the deprecated name of ``timeout_s`` (it warns)."""
    if timeout is None:
        return check_timeout_s(timeout_s)
    warnings.warn(
        "timeout= is now timeout_s= (seconds; the old name goes in the next release)", DeprecationWarning, stacklevel=3
    )
    return check_timeout_s(timeout, "timeout") if timeout_s is None else check_timeout_s(timeout_s)


@contextmanager
def time_limit(timeout_s: float | None, message: Callable[[], str]) -> Iterator[None]:
    """Cancel the block after ``timeout_s`` seconds (None: never) and raise `TimeoutError` with ``message()``,
    read then (anyio's own says nothing)."""
    if timeout_s is None:
        yield
        return
    import anyio

    try:
        with anyio.fail_after(timeout_s):
            yield
    except TimeoutError:
        raise TimeoutError(message()) from None


def check_wait_stream(stream: Any) -> None:
    """``wait_done(stream=...)`` takes an asyncgpu `Stream` or None."""
    if stream is not None and not isinstance(stream, Stream):
        raise TypeError(
            f"wait_done(stream=...) takes the asyncgpu Stream that will reuse the payload (it waits on the GPU), "
            f"not {stream!r}"
        )


def deprecated_blocking(call: str, instead: str) -> None:
    """Warn that the awaitable ``call`` blocks when a plain thread calls it (the warning points at the caller of
    the public method that calls this)."""
    warnings.warn(
        f"{call} from a plain thread blocks: call {instead} there (an event loop awaits {call}; the "
        "blocking form of the old name goes in the next release)",
        DeprecationWarning,
        stacklevel=3,
    )


def blocking_in_loop(call: str, instead: str) -> RuntimeError:
    """The error a blocking ``call`` raises in an event loop's thread, naming the awaitable to use."""
    return RuntimeError(f"{call} would block this thread's event loop: use `{instead}` in a task")
