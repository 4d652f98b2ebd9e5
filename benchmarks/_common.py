"""What the benchmark scripts and the dev/ probes share: ``--out`` for scripts that only print (a copy of stdout)."""

from __future__ import annotations

import atexit
import contextlib
import sys
from collections.abc import Iterator
from typing import TextIO


class _Tee:
    def __init__(self, *streams: TextIO) -> None:
        self._streams = streams

    def write(self, text: str) -> int:
        for s in self._streams:
            s.write(text)
        return len(text)

    def flush(self) -> None:
        for s in self._streams:
            s.flush()

    def __getattr__(self, name: str):  # isatty, encoding...: the terminal's
        return getattr(self._streams[0], name)


@contextlib.contextmanager
def tee_stdout(path: str | None) -> Iterator[None]:
    """Inside the block, everything printed also goes to the file at ``path`` (nothing when ``path`` is None)."""
    if not path:
        yield
        return
    with open(path, "w", encoding="utf-8") as f:
        old = sys.stdout
        sys.stdout = _Tee(old, f)  # type: ignore[assignment]
        try:
            yield
        finally:
            sys.stdout = old


def tee_stdout_to(path: str | None) -> None:
    """From now on, everything printed also goes to the file at ``path`` (nothing when ``path`` is None), a line at
    a time."""
    if path:
        # line-buffered: a probe killed by its time limit (or aborted for a traceback) keeps the lines it printed
        f = open(path, "w", encoding="utf-8", buffering=1)  # noqa: SIM115 - open until the process ends
        terminal = sys.stdout

        def end() -> None:  # (the terminal's stdout first: the interpreter flushes sys.stdout after atexit)
            sys.stdout = terminal
            f.close()

        atexit.register(end)
        sys.stdout = _Tee(terminal, f)  # type: ignore[assignment]
