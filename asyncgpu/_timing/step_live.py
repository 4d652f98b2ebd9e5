"""`LiveView`: a step timer's live terminal panel (rich ``Live``), drawn from its own thread.

The thread (``asyncgpu-steps-live``) takes a snapshot of the timer (`StepStats` of the last 64 steps and the
quantiles, under the timer's lock: ~0.3 ms) every ``1 / refresh_hz`` seconds and redraws (~2.5 ms of rich on a 2-CPU
VM, 2 devices); the loop's thread never renders, but the redraw holds the GIL: 2 redraws a second cost a loop about
0.5 % of its time. ``live="auto"`` draws only when stdout is a terminal (quiet otherwise);
``live=True`` draws to a terminal console even when it is not one (a log file gets the escape codes).
"""

from __future__ import annotations

import sys
import threading
from typing import Any, Callable, final

from asyncgpu._timing.step_stats import StepStats

__all__ = ["LiveView", "wants_live"]


def wants_live(live: Any, file: Any = None) -> bool:
    """Whether to draw: ``True``, ``False``, or ``"auto"`` (stdout, or ``file``, is a terminal)."""
    if live == "auto":
        f = sys.stdout if file is None else file
        isatty = getattr(f, "isatty", None)
        return bool(isatty and isatty())
    if isinstance(live, bool):
        return live
    raise ValueError(f"live is True, False or 'auto' (draw when stdout is a terminal), not {live!r}")


@final
class LiveView:
    """Redraws ``snapshot()`` at ``refresh_hz`` (≥ 2) on a console of its own until `close`."""

    def __init__(self, snapshot: Callable[[], StepStats], *, refresh_hz: float = 2.0, console: Any = None) -> None:
        from rich.console import Console
        from rich.live import Live

        if not refresh_hz >= 2:
            raise ValueError(f"refresh_hz is at least 2 (redraws per second), not {refresh_hz!r}")
        self._snapshot = snapshot
        self._period_s = 1.0 / refresh_hz
        self._stop = threading.Event()
        self.console = console if console is not None else Console(force_terminal=True)
        self._live = Live(
            console=self.console, auto_refresh=False, transient=False, redirect_stdout=False, redirect_stderr=False
        )
        self.frames = 0  #: redraws so far
        self._live.start()
        self._thread = threading.Thread(target=self._run, name="asyncgpu-steps-live", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._period_s):
            self.draw()

    def draw(self) -> None:
        self._live.update(self._snapshot(), refresh=True)
        self.frames += 1

    def close(self) -> None:
        """Draw the last frame, stop and join the thread. Idempotent."""
        if self._thread.is_alive():
            self._stop.set()
            self._thread.join()
            self.draw()
            self._live.stop()
