"""The CUDA sources asyncgpu compiles (`kernels_dir`), the wire format of in-kernel records read from its one
definition, and that format's host-side writer. Imports no CUDA: ``import asyncgpu`` reads the format from here.

``kernels/asyncgpu_profile_format.h`` defines the layout (a diagram heads that file); this module parses its
``#define AGK_<NAME> <integer>`` lines at import, so Python never restates a value, and derives the masks.
`HostLane` writes the same format from Python with ``time.perf_counter_ns()`` stamps: the host backend's
"kernels" (Python callables on a stream thread) record real host timings with it, so the whole path (arm,
record, gather, decode, place, trace) runs without a GPU.
"""

from __future__ import annotations

import re
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import numpy as np

from asyncgpu._base.checks import whole

__all__ = ["FORMAT", "HostLane", "format_path", "kernels_dir", "parse_format", "words_of"]

_KERNEL_SOURCE = "workloads.cu"  # a file every kernels directory has
CLOCK_KERNEL_PREFIX = "asyncgpu_clock_"  #: the clock calibration's kernels (kernels/clock.cu): asyncgpu's own work

_DEFINE = re.compile(r"^\s*#\s*define\s+(AGK_[A-Z0-9_]+)\s+(\S+)\s*$")


def kernels_dir() -> Path:
    """Where the CUDA sources live: ``asyncgpu/_kernels`` in a wheel, ``<repo>/kernels`` in a checkout."""
    package = Path(__file__).resolve().parent.parent
    for candidate in (package / "_kernels", package.parent / "kernels"):
        if (candidate / _KERNEL_SOURCE).is_file():
            return candidate
    raise FileNotFoundError(f"asyncgpu's CUDA sources ({_KERNEL_SOURCE}) are missing: reinstall asyncgpu")


def format_path() -> Path:
    """The path of ``asyncgpu_profile_format.h`` (next to the CUDA sources)."""
    return kernels_dir() / "asyncgpu_profile_format.h"


def parse_format(text: str) -> dict[str, int]:
    """``{NAME: value}`` for every ``#define AGK_NAME <integer literal>`` of the format header. Any other
    ``#define AGK_...`` line raises `ValueError`: the header stays plain enough for this parser and for C."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        if not line.lstrip().startswith("#") or "AGK_" not in line or "define" not in line:
            continue
        m = _DEFINE.match(line)
        if m is None:
            raise ValueError(
                f"asyncgpu_profile_format.h: cannot read {line.strip()!r}: write `#define AGK_NAME "
                "<integer literal>` only"
            )
        name, literal = m.groups()
        try:
            out[name[4:]] = int(literal.rstrip("uUlL"), 0)
        except ValueError:
            raise ValueError(f"asyncgpu_profile_format.h: {name} = {literal!r} is not an integer literal") from None
    return out


class _Format:
    """The format's constants (attribute per ``AGK_`` name, without the prefix) and the derived masks."""

    def __init__(self, values: dict[str, int]) -> None:
        self.values = dict(values)
        for k, value in values.items():
            setattr(self, k, value)
        v = self.values
        self.KIND_MASK = (1 << v["KIND_BITS"]) - 1
        self.STAGE_MASK = (1 << v["STAGE_BITS"]) - 1
        self.MAX_STAGES = 1 << v["STAGE_BITS"]
        # Every tag bit that is neither kind nor stage: the mark byte, and zeros in between.
        self.CHECK_MASK = 0xFFFFFFFF & ~(self.KIND_MASK | (self.STAGE_MASK << v["STAGE_SHIFT"]))
        self.CHECK_VALUE = v["RECORD_MARK"] << v["MARK_SHIFT"]
        if v["STAGE_SHIFT"] + v["STAGE_BITS"] > 16 or v["KIND_BITS"] > v["STAGE_SHIFT"]:
            raise ValueError(
                "asyncgpu_profile_format.h: the decoder reads the stage from the tag's low 16 bits: "
                "keep STAGE_SHIFT + STAGE_BITS <= 16 and the kind below the stage"
            )

    if TYPE_CHECKING:  # the header's constants, set in __init__: every one is an int

        def __getattr__(self, name: str) -> int: ...

    def tag(self, kind: int, stage: int) -> int:
        """The tag word of a record, as the header's ``profile_tag`` computes it."""
        return self.CHECK_VALUE | ((stage & self.STAGE_MASK) << self.STAGE_SHIFT) | (kind & self.KIND_MASK)

    def fin_word(self, attempted: int, flags: int) -> int:
        """A lane's finalize word, as the header's ``profile_fin_word`` computes it."""
        return (self.FIN_MARK << self.FIN_MARK_SHIFT) | ((flags & 0xFFFF) << self.FIN_FLAGS_SHIFT) | attempted

    def header(self, groups: int, lanes: int, capacity: int) -> np.ndarray:
        """The header as the host writes it when arming: uint32 fields (``AGK_HDR_*`` indices), device fields 0."""
        h = np.zeros(2 * self.HEADER_WORDS, np.uint32)
        h[[self.HDR_MAGIC, self.HDR_GROUPS, self.HDR_LANES, self.HDR_CAPACITY]] = (self.MAGIC, groups, lanes, capacity)
        return h

    def words_for(self, lanes: int, capacity: int) -> int:
        """Buffer size in uint64 words for ``lanes`` lanes of ``capacity`` records."""
        return self.HEADER_WORDS + lanes * (self.LANE_WORDS + capacity)


FORMAT = _Format(parse_format(format_path().read_text()))


def words_of(buffer: Any) -> np.ndarray:
    """The uint64 words of a host buffer: a numpy array (any dtype, C-contiguous, whole words) or a
    host-backend `DeviceArray`. No copy."""
    if hasattr(buffer, "live") and getattr(buffer, "device", None) is not None:
        if buffer.device.backend != "host":
            raise TypeError(
                f"that array lives on {buffer.device.name}: only the kernel writes a GPU buffer (include "
                "asyncgpu_profile.cuh); HostLane writes host-backend buffers"
            )
        buffer = buffer.live()
    if not isinstance(buffer, np.ndarray) or not buffer.flags.c_contiguous or buffer.nbytes % 8:
        raise TypeError(
            "records live in a C-contiguous numpy array of whole uint64 words (or a host DeviceArray), "
            f"not {type(buffer).__name__}"
        )
    return buffer.reshape(-1).view(np.uint64)


_header_lock = threading.Lock()  # the header's shared counters (the device uses atomics)


class HostLane:
    """The writer of one (block, group) lane on the host backend: what ``asyncgpu::Profiler`` does on a GPU,
    with ``time.perf_counter_ns()`` stamps (the host clock, so records need no calibration).

    Make it inside the host kernel (the callable the stream thread runs), after the profiler armed the buffer:
    it reads the header then, as a GPU leader does when it starts. One writer per lane; several lanes may be
    written from several threads. ``blocks`` is the launch's block count (a GPU kernel reads ``gridDim``).
    Never writes outside its lane: a full lane counts what it drops; a lane past the buffer writes nothing.
    """

    __slots__ = ("_words", "_base", "_n", "_cap", "_previous")
    _words: np.ndarray
    _base: int
    _n: int
    _cap: int
    _previous: int

    def __init__(self, buffer: Any, block: int, group: int = 0, *, blocks: int) -> None:
        f = FORMAT
        block, group = whole("block", block), whole("group", group)
        blocks = whole("blocks", blocks, minimum=1, hint="the launch's block count")
        self._words = words = words_of(buffer)
        self._base, self._n, self._cap, self._previous = -1, 0, 0, 0
        if words.size < f.HEADER_WORDS:
            return
        h = words[: f.HEADER_WORDS].view(np.uint32)
        if int(h[f.HDR_MAGIC]) != f.MAGIC:
            return  # not armed: never write
        groups, lanes, cap = int(h[f.HDR_GROUPS]), int(h[f.HDR_LANES]), int(h[f.HDR_CAPACITY])
        with _header_lock:
            if block == 0:
                h[f.HDR_BLOCKS] = blocks
            if group >= groups:
                h[f.HDR_BAD_GROUP] = max(int(h[f.HDR_BAD_GROUP]), group + 1)
                return
            lane = block * groups + group
            if lane >= lanes:
                h[f.HDR_NO_ROOM] += 1
                return
        self._base = f.HEADER_WORDS + lane * (f.LANE_WORDS + cap)
        self._cap = cap
        self._previous = int(words[self._base + f.LANE_START])
        words[self._base + f.LANE_START] = time.perf_counter_ns()

    def _put(self, kind: int, stage: int) -> None:
        if self._base < 0:
            return
        t = time.perf_counter_ns() & 0xFFFFFFFF
        if self._n < self._cap:
            self._words[self._base + FORMAT.LANE_WORDS + self._n] = (t << FORMAT.TIME_SHIFT) | FORMAT.tag(kind, stage)
        self._n += 1

    def begin(self, stage: int) -> None:
        self._put(FORMAT.KIND_BEGIN, stage)

    def end(self, stage: int) -> None:
        self._put(FORMAT.KIND_END, stage)

    def instant(self, stage: int) -> None:
        self._put(FORMAT.KIND_INSTANT, stage)

    @contextmanager
    def region(self, stage: int) -> Iterator[None]:
        """``with lane.region(stage):`` — begin, then end when the block exits (also on an exception)."""
        self.begin(stage)
        try:
            yield
        finally:
            self.end(stage)

    def finalize(self) -> None:
        """End the lane: its end stamp and record count. Once, after the last record."""
        if self._base < 0:
            return
        f = FORMAT
        self._words[self._base + f.LANE_END] = time.perf_counter_ns()
        self._words[self._base + f.LANE_FIN] = f.fin_word(self._n, f.FLAG_REUSED if self._previous else 0)
        self._base = -1
