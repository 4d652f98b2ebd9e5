"""`TraceStream`: a step timer's steps streamed to a Perfetto trace file as they complete, in bounded memory.

Format: Perfetto's native protobuf, written with `asyncgpu._trace.perfetto`'s encoder. A trace file is the fields of one
top-level ``Trace`` message, each a ``TracePacket``; this writer only ever appends whole packets, so the file is a
valid trace at every packet boundary: open it in https://ui.perfetto.dev (or ``trace_processor``) while the run
goes on, and it shows every step written so far (copy it first if the viewer locks the file). Tracks: "steps"
(the host's entry to exit of each step) and one per device (the device's start to end event of each step), each a
slice named "step" with the step's index as a debug annotation; times on CLOCK_MONOTONIC (``perf_counter_ns``).

Threads: `put` is called by the harvest thread and never blocks: it hands a batch of finished steps to a queue of
``max_batches``; when that is full the batch is dropped and counted (`dropped`). A writer thread
(``asyncgpu-steps-trace``) encodes each batch and writes it with one unbuffered ``write`` (the harvest's cadence,
20 a second by default): between writes the file ends at a packet boundary, so what a reader sees is a whole trace
of every step written so far (a reader that races a write sees the last packet cut short: Perfetto drops it).
`close` writes what is queued and joins the thread.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from typing import Any, final

import numpy as np

from asyncgpu._trace.perfetto import stream_header, stream_slices

__all__ = ["TraceStream"]

_SEQ = 7  # the trusted packet sequence id of every packet (one writer, no interned state)
_STOP = object()


@final
class TraceStream:
    """Writes steps to ``path`` from its own thread. ``devices``: track names, in column order."""

    def __init__(self, path: str | os.PathLike, devices: tuple[str, ...], *, max_batches: int = 256) -> None:
        self.path = os.fspath(path)
        try:
            self._f = open(self.path, "wb", buffering=0)  # (closed by the writer thread)
        except OSError as exc:
            raise OSError(
                f"cannot write the step trace to {self.path}: {exc.strerror}; pass trace= a writable path"
            ) from None
        self.devices = devices
        self.dropped = 0  #: steps not written: the queue was full
        self.written = 0  #: steps written
        self.error: BaseException | None = None  #: what stopped the writer thread, if anything
        self._q: queue.Queue[Any] = queue.Queue(max_batches)
        tracks = [(1, 0, "steps")] + [(2 + d, 0, name) for d, name in enumerate(devices)]
        self._f.write(stream_header(_SEQ, time.perf_counter_ns(), tracks))
        self._thread = threading.Thread(target=self._run, name="asyncgpu-steps-trace", daemon=True)
        self._thread.start()

    def put(
        self, index: np.ndarray, begin_ns: np.ndarray, exit_ns: np.ndarray, start_ns: np.ndarray, end_ns: np.ndarray
    ) -> None:
        """Queue finished steps (columns, rows in step order; per-device columns (steps, devices)). Never blocks."""
        try:
            self._q.put_nowait((index, begin_ns, exit_ns, start_ns, end_ns))
        except queue.Full:
            self.dropped += len(index)

    def _run(self) -> None:
        f = self._f
        try:
            while True:
                item = self._q.get()
                if item is _STOP:
                    break
                index, begin, exit_, start, end = item
                nd = start.shape[1]
                track = np.concatenate(
                    [np.ones(len(index), np.uint64)] + [np.full(len(index), 2 + d, np.uint64) for d in range(nd)]
                )
                f.write(
                    stream_slices(
                        _SEQ,
                        track,
                        np.concatenate([begin.astype(np.float64), *start.T]),
                        np.concatenate([exit_.astype(np.float64), *end.T]),
                        np.tile(index, 1 + nd),
                    )
                )
                self.written += len(index)
        except BaseException as exc:  # (a full disk: kept for `close`, the loop never sees it)
            self.error = exc
            while self._q.get() is not _STOP:  # (drain so `close` finds its way in)
                pass
        finally:
            f.close()

    def close(self) -> None:
        """Write what is queued, close the file and join the thread (blocks; the queue drains at disk
        speed). Idempotent."""
        if self._thread.is_alive():
            self._q.put(_STOP)
            self._thread.join()
