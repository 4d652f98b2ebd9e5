"""`gather`: one timing scope's results from every rank of a torch.distributed process group or an mpi4py
communicator, merged on the root (or on every rank) with the ranks' host clocks aligned; `mark_collective` marks
the collective points the cross-rank balance compares.

asyncgpu brings no transport of its own: it rides on the group the caller passes. Neither torch nor mpi4py is
imported unless the caller already did (``group=None`` picks an initialised torch default group, else mpi4py's
``COMM_WORLD`` if ``mpi4py.MPI`` is imported).

Protocol (every rank calls `gather` in the same order; one gather at a time per group)::

    1 check-in   every rank posts a small JSON check-in (wire and asyncgpu versions, label, devices, backend,
                 rows, payload size, root, to_all). torch: into the group's key-value store (the default
                 store, keys under "asyncgpu.gather/<group>/<call>/"); MPI: a message to the root, polled with
                 Iprobe. The root waits until ``timeout_s`` for all of them, validates them and posts a verdict:
                 "go" with the sizes, or the error naming the ranks at fault. No rank enters a blocking exchange
                 before every rank has checked in, so a missing rank costs a timeout, never a hang, and every
                 rank that came raises the same `GatherError`.
    2 clocks     the root pings each rank in turn ``clock_samples`` times (8 bytes each way); see below.
    3 payloads   each rank sends its payload (`asyncgpu._wire_ranks`: one uint8 buffer, 35 B per activity plus
                 a JSON header) to the root, which merges them rank by rank (`asyncgpu._ranks.Merger`).
    4 to_all     the root sends the merged result (same format) to every rank.

Transport of steps 2-4: torch: a private gloo group with the same ranks (``dist.new_group(backend="gloo")``,
made once per group after its first check-in, cached), CPU tensors, ``isend``/``irecv`` waited with a timeout —
whatever the caller's backend (NCCL included): the exchange is host-to-host by nature; NCCL would need CUDA
tensors, order the pings behind the rank's CUDA streams (kernel launch and stream sync in every timestamp) and
cannot time out without its watchdog killing the process. MPI: the caller's communicator, non-blocking
Isend/Irecv polled against the deadline, tags derived from the call's sequence number.

Clock offsets: every rank's times are ``time.perf_counter_ns()`` (CLOCK_MONOTONIC), whose zero is the host's
boot: two hosts' values have nothing in common, and wall time (``time.time_ns``, NTP) agrees across hosts only to
about a millisecond. So the root measures each rank's offset ``θ = rank clock - root clock`` directly: it stamps
t0, sends a ping, the rank stamps tr on receipt and answers, the root stamps t1. The rank's stamp happened between
the root's two, so ``tr - t1 <= θ <= tr - t0``; the intervals of all pings are intersected (the tightest ones
decide: the exchanges with the smallest round trips) and θ is the middle of the intersection, ± half its width
(`RankInfo.bound_ns`). Were the intervals to disagree (a clock stepped), the single ping with the smallest round
trip is used, ± half its round trip. On one machine the ranks share one clock: θ comes out within its bound of
zero. The offset is measured when gather runs; hosts whose clocks run at different rates (NTP keeps synchronised
hosts within a few ppm) add that rate times the age of an activity to its error.

Threads: `gather` blocks the calling thread (seconds at most ``timeout_s`` per step; a rank that is not the root
waits up to ``2 * timeout_s + 1`` for the root's verdict; the root takes the payloads in rank order, so
``timeout_s`` must also cover receiving the payloads of the ranks before yours). From an event loop, run it in a thread:
``await anyio.to_thread.run_sync(asyncgpu.gather, t)``. `mark_collective` may be called from any thread or task.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
import zlib
from datetime import timedelta
from typing import Any

import numpy as np

from asyncgpu._base.checks import number, whole
from asyncgpu._base.errors import GatherError, ScopeError
from asyncgpu._base.records import Timeline
from asyncgpu._timing import scope as _timer
from asyncgpu._timing.scope import Timer
from asyncgpu.ranks import wire
from asyncgpu.ranks.merge import Merger, RankTimeline, merged_from_payload, merged_to_payload
from asyncgpu.ranks.wire import Marks

__all__ = ["gather", "mark_collective", "offset_from_pings"]

_now_ns = time.perf_counter_ns  # the clock of every rank's times (tests shift it to play another host)
_LOCK = threading.Lock()
_SEQ: dict[Any, int] = {}  # per group: how many gathers this process began on it


def mark_collective(name: str, timer: Timer | None = None) -> None:
    """Mark a collective point (an all-reduce, a barrier, the end of a step) in ``timer``, or in every open
    scope of this context: call it on every rank right before the collective. `gather` matches the k-th mark of
    one ``name`` across ranks and reports who arrived last and how long the others waited (`RankTimeline.balance`).
    Costs a clock read and a list append; any thread."""
    now = _now_ns()
    if timer is not None and not isinstance(timer, Timer):
        raise TypeError(f"timer= takes an open gpu_timer scope (a Timer), not {timer!r}")
    scopes = [timer] if timer is not None else list(_timer.current_scopes())
    scopes = [s for s in scopes if _timer.is_open(s)]
    if not scopes:
        raise ScopeError(
            f"mark_collective({name!r}) outside a timing scope: call it inside `async with "
            "gpu_timer(...) as t:` (or pass timer=t while t is open)"
        )
    thread = threading.current_thread().name
    for s in scopes:
        s.mark(name, now, thread)


def gather(
    source: Timer | Timeline,
    group: Any = None,
    *,
    root: int = 0,
    to_all: bool = False,
    timeout_s: float = 60.0,
    strict: bool = True,
    clock_samples: int = 16,
) -> RankTimeline | None:
    """Gather a finished scope (a `Timer`, or a `Timeline`, with its collective ``marks``) from every rank of
    ``group`` onto ``root`` (every rank with ``to_all``). Returns the `RankTimeline` there, None elsewhere. Call
    it on every rank, in the same order.

    ``group``: a ``torch.distributed`` process group (any backend; None: the default group) or an ``mpi4py``
    communicator. ``timeout_s``: how long each step waits for the other ranks. ``strict``: the ranks must agree
    on the scope label, the number of devices and the device backend. ``clock_samples``: pings per rank for its
    clock offset. Raises `GatherError` (the same on every rank that came) when the ranks disagree, a rank does
    not come in time (``missing_ranks``), or no process group is usable. Blocks; see the module docstring."""
    timeout_s = number("timeout_s", timeout_s, unit="seconds (how long each step waits for the other ranks)")
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0 (seconds each step waits for the other ranks), not {timeout_s}")
    clock_samples = whole("clock_samples", clock_samples, minimum=1, hint="pings per rank")
    root = whole("root", root)
    tl, marks, backend = _scope(source)
    tr = _transport(group)
    if not 0 <= root < tr.size:
        raise ValueError(f"root={root} is not a rank of this group (ranks 0..{tr.size - 1})")
    with _LOCK:
        seq = _SEQ[tr.key] = _SEQ.get(tr.key, -1) + 1
    me = {
        "wire": wire.WIRE_VERSION,
        "asyncgpu_version": _version(),
        "seq": seq,
        "rank": tr.rank,
        "label": tl.label,
        "devices": list(tl.devices),
        "backend": backend,
        "rows": len(tl),
        "root": root,
        "to_all": bool(to_all),
        "host": socket.gethostname(),
        "pid": os.getpid(),
    }
    payload = wire.timeline_to_payload(
        tl, marks, {k: me[k] for k in ("rank", "host", "pid", "backend", "asyncgpu_version")}
    )
    me["nbytes"] = int(payload.size)
    verdict = _check_in(tr, seq, root, me, timeout_s, strict, clock_samples)
    tr.open_data(timeout_s)
    result: RankTimeline | None
    if tr.rank == root:
        result = _as_root(tr, payload, verdict, root, to_all, timeout_s)
    else:
        result = _as_rank(tr, payload, verdict, root, to_all, timeout_s)
    tr.finish(seq, root)
    return result


def _check_in(tr: Any, seq: int, root: int, me: dict, timeout_s: float, strict: bool, samples: int) -> dict:
    """Step 1: post this rank's check-in; the root collects them and posts the verdict, the others read it.
    Returns the verdict when it says go; raises the `GatherError` it names otherwise (on every rank)."""
    deadline = time.monotonic() + timeout_s
    tr.post_checkin(seq, root, json.dumps(me).encode())
    if tr.rank == root:
        got, missing = tr.collect_checkins(seq, root, deadline)
        verdict = _verdict(got, missing, tr.size, root, timeout_s, strict, samples)
        tr.post_verdict(seq, root, json.dumps(verdict).encode(), sorted(r for r in got if r != root))
    else:
        verdict = json.loads(tr.await_verdict(seq, root, deadline + timeout_s + 1.0, timeout_s))
    if not verdict["ok"]:
        raise GatherError(verdict["error"], tuple(verdict["missing"]))
    return verdict


def _as_rank(
    tr: Any, payload: np.ndarray, verdict: dict, root: int, to_all: bool, timeout_s: float
) -> RankTimeline | None:
    """Steps 2-4 on a rank that is not the root: answer the pings, send the payload, take the merge (to_all)."""
    _answer_pings(tr, root, verdict["samples"], timeout_s)
    tr.send(payload, root, "payload", timeout_s)
    if not to_all:
        return None
    n = int(tr.recv(8, root, "merged size", timeout_s).view(np.int64)[0])
    return merged_from_payload(tr.recv(n, root, "merged result", timeout_s))


def _as_root(tr: Any, payload: np.ndarray, verdict: dict, root: int, to_all: bool, timeout_s: float) -> RankTimeline:
    """Steps 2-4 on the root: ping every rank, take the payloads one by one into the merge, send it (to_all)."""
    offsets = [(0, 0.0, 0.0, 0) if r == root else _ping(tr, r, verdict["samples"], timeout_s) for r in range(tr.size)]
    merger = Merger(verdict["rows"], root)
    for r in range(tr.size):  # one received payload alive at a time, besides the merged columns
        merger.add(payload if r == root else tr.recv(verdict["nbytes"][r], r, "payload", timeout_s), offsets[r])
    result = merger.result()
    if to_all:
        blob = merged_to_payload(result)
        for r in range(tr.size):
            if r != root:
                tr.send(np.array([blob.size], np.int64).view(np.uint8), r, "merged size", timeout_s)
                tr.send(blob, r, "merged result", timeout_s)
    return result


# -- the scope --------------------------------------------------------------------------------------------------
def _scope(source: Any) -> tuple[Timeline, Marks, str]:
    if isinstance(source, Timer):
        tl = source.timeline  # ScopeError (naming the fix) while the scope is open
        backend = "+".join(sorted({d.backend for d in source.devices}))
    elif isinstance(source, Timeline):
        tl = source
        backend = "+".join(sorted({d.split(":", 1)[0] for d in tl.devices}))
    else:
        raise TypeError(f"gather a Timer (after its scope) or a Timeline, not {type(source).__name__}")
    return tl, Marks.from_tuples([(m.name, m.host_ns, m.row, m.thread) for m in tl.marks]), backend


def _version() -> str:
    from asyncgpu._version import __version__

    return __version__


def _verdict(
    got: dict[int, bytes], missing: list[int], size: int, root: int, timeout_s: float, strict: bool, samples: int
) -> dict:
    """``{"ok": True, rows, nbytes, samples}`` or ``{"ok": False, "error", "missing"}``: the root's decision."""

    def fail(msg: str, bad: list[int] | None = None) -> dict:
        return {"ok": False, "error": msg, "missing": bad or []}

    if missing:
        came = ", ".join(map(str, sorted(got))) or "none"
        return fail(
            f"rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} of {size} did not reach "
            f"gather within {timeout_s:g} s (checked in: {came}): call asyncgpu.gather on every rank of the "
            "group, in the same order, or raise timeout_s",
            missing,
        )
    info: dict[int, dict] = {}
    for r, raw in sorted(got.items()):
        try:
            c = json.loads(raw)
            int(c["wire"])
        except (ValueError, KeyError, TypeError):
            return fail(
                f"rank {r}'s check-in is not an asyncgpu gather check-in ({raw[:60]!r}): run the same "
                "asyncgpu version on every rank"
            )
        info[r] = c
    mine = info[root]
    old = {r: c for r, c in info.items() if c["wire"] != wire.WIRE_VERSION}
    if old:
        who = "; ".join(
            f"rank {r} sends payload version {c['wire']} (asyncgpu {c.get('asyncgpu_version', '?')})"
            for r, c in old.items()
        )
        return fail(
            f"{who}; the root (rank {root}, asyncgpu {mine['asyncgpu_version']}) reads version "
            f"{wire.WIRE_VERSION}: install the same asyncgpu version on every rank"
        )
    for key, what in (("seq", "call number (gathers so far on this group)"), ("root", "root"), ("to_all", "to_all")):
        values = {r: c.get(key) for r, c in info.items()}
        if len(set(map(json.dumps, values.values()))) > 1:
            return fail(
                f"ranks disagree on the {what}: "
                + ", ".join(f"rank {r} {v!r}" for r, v in values.items())
                + ": call gather with the same root and to_all on every rank, in the same order"
            )
    if strict:
        for key, what, fix in (
            ("backend", "device backend", "time every rank on the same backend (or pass strict=False)"),
            ("label", "scope label", "gather the same scope on every rank (or pass strict=False)"),
            ("devices", "number of devices", "time the same number of devices on every rank (or pass strict=False)"),
        ):
            values = {r: (len(c[key]) if key == "devices" else c[key]) for r, c in info.items()}
            if len(set(values.values())) > 1:
                shown = ", ".join(
                    f"rank {r} {v!r}" + (f" ({', '.join(info[r]['devices'])})" if key == "devices" else "")
                    for r, v in values.items()
                )
                return fail(f"ranks disagree on the {what}: {shown}: {fix}")
    return {
        "ok": True,
        "rows": [info[r]["rows"] for r in range(size)],
        "nbytes": [info[r]["nbytes"] for r in range(size)],
        "samples": samples,
        "missing": [],
    }


# -- the clock ping-pong -----------------------------------------------------------------------------------------
def _ping(tr: Any, r: int, samples: int, timeout_s: float) -> tuple[int, float, float, int]:
    """Rank ``r``'s clock offset to this (root) rank's: ``(offset_ns, bound_ns, best rtt_ns, samples)``."""
    stamps = np.zeros((samples, 3), np.int64)  # t0, tr, t1
    ping = np.zeros(1, np.int64)
    for k in range(samples):
        t0 = _now_ns()
        tr.send(ping.view(np.uint8), r, "clock ping", timeout_s)
        answer = tr.recv(8, r, "clock ping", timeout_s)
        t1 = _now_ns()
        stamps[k] = (t0, int(answer.view(np.int64)[0]), t1)
    return offset_from_pings(stamps)


def offset_from_pings(stamps: np.ndarray) -> tuple[int, float, float, int]:
    """``(offset_ns, bound_ns, best rtt_ns, samples)`` from rows ``(t0, tr, t1)`` (see the module docstring)."""
    t0, tr, t1 = stamps[:, 0], stamps[:, 1], stamps[:, 2]
    lo, hi = int((tr - t1).max()), int((tr - t0).min())
    rtt = t1 - t0
    if lo <= hi:
        return (lo + hi) // 2, (hi - lo) / 2, float(rtt.min()), len(stamps)
    b = int(rtt.argmin())
    return int(tr[b] - (t0[b] + t1[b]) // 2), float(rtt[b]) / 2, float(rtt[b]), len(stamps)


def _answer_pings(tr: Any, root: int, samples: int, timeout_s: float) -> None:
    stamp = np.zeros(1, np.int64)
    for _ in range(samples):
        tr.recv(8, root, "clock ping", timeout_s)
        stamp[0] = _now_ns()
        tr.send(stamp.view(np.uint8), root, "clock ping", timeout_s)


# -- transports --------------------------------------------------------------------------------------------------
def _transport(group: Any) -> Any:
    torch_dist = sys.modules.get("torch.distributed")
    mpi = sys.modules.get("mpi4py.MPI")
    if group is None:
        if torch_dist is not None and torch_dist.is_available() and torch_dist.is_initialized():
            return _TorchTransport(torch_dist, torch_dist.group.WORLD)
        if mpi is not None:
            return _MpiTransport(mpi, mpi.COMM_WORLD)
        why = (
            "torch.distributed is imported but not initialised"
            if torch_dist is not None
            else "neither torch.distributed nor mpi4py is in use"
        )
        raise GatherError(
            f"no process group to gather over ({why}): call torch.distributed.init_process_group("
            "backend='nccl' or 'gloo') on every rank first (torchrun sets up its environment), or pass "
            "an mpi4py communicator (group=MPI.COMM_WORLD)"
        )
    if torch_dist is not None and isinstance(group, torch_dist.ProcessGroup):
        if not torch_dist.is_initialized():
            raise GatherError(
                "torch.distributed is not initialised: call torch.distributed.init_process_group() "
                "on every rank before gather"
            )
        return _TorchTransport(torch_dist, group)
    if mpi is not None and isinstance(group, mpi.Comm):
        return _MpiTransport(mpi, group)
    raise TypeError(
        f"group must be a torch.distributed ProcessGroup or an mpi4py communicator, not {type(group).__name__}"
    )


_SIDE_GROUPS: dict[tuple[int, ...], Any] = {}  # global ranks -> the private gloo group for steps 2-4


class _TorchTransport:
    """Check-in through the default store; steps 2-4 over a private gloo group (CPU tensors)."""

    def __init__(self, dist: Any, group: Any) -> None:
        import torch

        self.torch, self.dist, self.group = torch, dist, group
        self.rank, self.size = dist.get_rank(group), dist.get_world_size(group)
        if self.rank < 0:
            raise GatherError("this process is not a member of that process group: call gather on its members only")
        self.ranks = tuple(dist.get_process_group_ranks(group))
        self.key = f"{zlib.crc32(np.array(self.ranks, np.int64).tobytes()):08x}-{self.size}"
        try:
            self.store = dist.distributed_c10d._get_default_store()
        except (AttributeError, RuntimeError, ValueError) as exc:
            raise GatherError(
                f"cannot reach torch.distributed's key-value store ({exc}): initialise the default "
                "process group with init_process_group()"
            ) from None
        self.side: Any = None

    def _k(self, seq: int, what: str) -> str:
        return f"asyncgpu.gather/{self.key}/{seq}/{what}"

    def post_checkin(self, seq: int, root: int, data: bytes) -> None:
        self.store.set(self._k(seq, f"in/{self.rank}"), data)

    def collect_checkins(self, seq: int, root: int, deadline: float) -> tuple[dict[int, bytes], list[int]]:
        keys = {r: self._k(seq, f"in/{r}") for r in range(self.size)}
        try:
            self.store.wait(list(keys.values()), timedelta(seconds=max(deadline - time.monotonic(), 0.001)))
        except RuntimeError:  # DistStoreError "Wait timeout": name the ranks that did not come
            pass
        present = {r: k for r, k in keys.items() if self.store.check([k])}
        got = {r: bytes(self.store.get(k)) for r, k in present.items()}
        for k in present.values():
            self.store.delete_key(k)
        return got, [r for r in range(self.size) if r not in present]

    def post_verdict(self, seq: int, root: int, data: bytes, to: list[int]) -> None:
        self.store.set(self._k(seq, "verdict"), data)

    def await_verdict(self, seq: int, root: int, deadline: float, timeout_s: float) -> bytes:
        key = self._k(seq, "verdict")
        try:
            self.store.wait([key], timedelta(seconds=max(deadline - time.monotonic(), 0.001)))
        except RuntimeError:  # name every rank that has not checked in, the root first
            absent = [r for r in range(self.size) if r != self.rank and not self.store.check([self._k(seq, f"in/{r}")])]
            missing = sorted(set(absent) | {root}, key=lambda r: (r != root, r))
            others = [r for r in missing if r != root]
            nor = f", nor did rank{'s' if len(others) > 1 else ''} {', '.join(map(str, others))}" if others else ""
            raise GatherError(
                f"the root (rank {root}) posted no verdict within {2 * timeout_s + 1:g} s: it did not "
                f"reach gather{nor} (call gather on every rank of the group, in the same order)",
                tuple(missing),
            ) from None
        return bytes(self.store.get(key))

    def open_data(self, timeout_s: float) -> None:
        side = _SIDE_GROUPS.get(self.ranks)
        if side is None:
            side = _SIDE_GROUPS[self.ranks] = self.dist.new_group(
                list(self.ranks),
                timeout=timedelta(seconds=max(timeout_s, 30.0)),
                backend="gloo",
                use_local_synchronization=True,
            )
        self.side = side

    def send(self, arr: np.ndarray, to: int, what: str, timeout_s: float) -> None:
        work = self.dist.isend(self.torch.from_numpy(arr), dst=self.ranks[to], group=self.side, tag=_TAGS[what])
        self._wait(work, f"sending the {what} to rank {to}", timeout_s)

    def recv(self, nbytes: int, frm: int, what: str, timeout_s: float) -> np.ndarray:
        buf = self.torch.empty(nbytes, dtype=self.torch.uint8)
        work = self.dist.irecv(buf, src=self.ranks[frm], group=self.side, tag=_TAGS[what])
        self._wait(work, f"receiving the {what} from rank {frm}", timeout_s)
        return buf.numpy()

    def _wait(self, work: Any, doing: str, timeout_s: float) -> None:
        try:
            work.wait(timeout=timedelta(seconds=timeout_s))
        except RuntimeError as exc:
            raise GatherError(
                f"timed out or failed {doing} (within {timeout_s:g} s): that rank left or crashed "
                f"after checking in ({str(exc).splitlines()[0][:200]})"
            ) from None

    def finish(self, seq: int, root: int) -> None:
        """After a gather that went through: the root removes the verdict (every rank has read it by now)."""
        if self.rank == root:
            self.store.delete_key(self._k(seq, "verdict"))


_TAGS = {"clock ping": 1, "payload": 2, "merged size": 3, "merged result": 4}


_MPI_INFLIGHT: list[tuple[Any, np.ndarray]] = []


class _MpiTransport:
    """Everything over the caller's communicator: non-blocking operations polled against the deadline."""

    def __init__(self, mpi: Any, comm: Any) -> None:
        if not mpi.Is_initialized() or mpi.Is_finalized():
            raise GatherError(
                "MPI is not initialised (or already finalised): import mpi4py.MPI before gather and "
                "gather before MPI finalises"
            )
        self.mpi, self.comm = mpi, comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.key = ("mpi", comm.py2f())
        self.seq = 0
        self._pending = _MPI_INFLIGHT  # sends in flight, kept (with their buffers) until complete, across calls
        self._pending[:] = [(q, b) for q, b in self._pending if not q.Test()]

    def _tag(self, seq: int, what: str) -> int:
        kinds = {"in": 0, "verdict": 1, **{k: 1 + v for k, v in _TAGS.items()}}
        return 0x2000 + (seq % 1024) * 8 + kinds[what]

    def post_checkin(self, seq: int, root: int, data: bytes) -> None:
        self.seq = seq
        if self.rank == root:
            self._mine = data
            return
        buf = np.frombuffer(data, np.uint8).copy()
        self._pending.append((self.comm.Isend([buf, self.mpi.BYTE], dest=root, tag=self._tag(seq, "in")), buf))

    def collect_checkins(self, seq: int, root: int, deadline: float) -> tuple[dict[int, bytes], list[int]]:
        got = {root: self._mine}
        status = self.mpi.Status()
        while len(got) < self.size:
            for r in range(self.size):
                if r not in got and self.comm.Iprobe(source=r, tag=self._tag(seq, "in"), status=status):
                    buf = np.empty(status.Get_count(self.mpi.BYTE), np.uint8)
                    self.comm.Recv([buf, self.mpi.BYTE], source=r, tag=self._tag(seq, "in"))
                    got[r] = buf.tobytes()
            if len(got) < self.size:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.001)
        return got, [r for r in range(self.size) if r not in got]

    def post_verdict(self, seq: int, root: int, data: bytes, to: list[int]) -> None:
        buf = np.frombuffer(data, np.uint8).copy()
        reqs = [self.comm.Isend([buf, self.mpi.BYTE], dest=r, tag=self._tag(seq, "verdict")) for r in to]
        self._pending += [(q, buf) for q in reqs]

    def await_verdict(self, seq: int, root: int, deadline: float, timeout_s: float) -> bytes:
        status = self.mpi.Status()
        while not self.comm.Iprobe(source=root, tag=self._tag(seq, "verdict"), status=status):
            if time.monotonic() > deadline:
                raise GatherError(
                    f"the root (rank {root}) sent no verdict within {2 * timeout_s + 1:g} s: it did "
                    "not reach gather, or is waiting for ranks that did not (call gather on every "
                    "rank, in the same order)",
                    (root,),
                )
            time.sleep(0.001)
        buf = np.empty(status.Get_count(self.mpi.BYTE), np.uint8)
        self.comm.Recv([buf, self.mpi.BYTE], source=root, tag=self._tag(seq, "verdict"))
        return buf.tobytes()

    def open_data(self, timeout_s: float) -> None:
        pass

    def send(self, arr: np.ndarray, to: int, what: str, timeout_s: float) -> None:
        req = self.comm.Isend([np.ascontiguousarray(arr), self.mpi.BYTE], dest=to, tag=self._tag(self.seq, what))
        self._poll(req, f"sending the {what} to rank {to}", timeout_s)

    def recv(self, nbytes: int, frm: int, what: str, timeout_s: float) -> np.ndarray:
        buf = np.empty(nbytes, np.uint8)
        req = self.comm.Irecv([buf, self.mpi.BYTE], source=frm, tag=self._tag(self.seq, what))
        self._poll(req, f"receiving the {what} from rank {frm}", timeout_s)
        return buf

    def _poll(self, req: Any, doing: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        spins = 0
        while not req.Test():
            spins += 1
            if spins > 1000:  # past the first ~ms, poll gently
                if time.monotonic() > deadline:
                    req.Cancel()
                    raise GatherError(
                        f"timed out {doing} (within {timeout_s:g} s): that rank left or crashed after checking in"
                    )
                time.sleep(0.0002)

    def finish(self, seq: int, root: int) -> None:
        self.mpi.Request.Waitall([q for q, _ in self._pending])
        self._pending.clear()
