"""The calling convention `Channel` and `Handoff` share: a deadline for a task's wait, and the errors a call gets
in the wrong kind of caller (a blocking call in a loop's thread, an awaitable called from a plain thread)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator

from asyncgpu._runtime.stream import Stream

__all__ = ["awaitable_in_thread", "blocking_in_loop", "check_wait_stream", "time_limit"]


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


def awaitable_in_thread(call: str, instead: str) -> RuntimeError:
    """The error an awaitable ``call`` raises when a plain thread calls it, naming the blocking form to use."""
    return RuntimeError(f"{call} is awaited in an event loop's task: a plain thread calls {instead}")


def blocking_in_loop(call: str, instead: str) -> RuntimeError:
    """The error a blocking ``call`` raises in an event loop's thread, naming the awaitable to use."""
    return RuntimeError(f"{call} would block this thread's event loop: use `{instead}` in a task")
