"""Time a few training steps on every rank, gather the scopes onto rank 0, print the cross-rank report.

    torchrun --nproc-per-node 2 examples/gather_ranks.py [--steps 5] [--trace PATH]
    mpirun -n 2 python examples/gather_ranks.py           # with mpi4py (pip install 'asyncgpu[mpi]')

It runs under a launcher only (plain ``python`` says so in one line). Under torchrun with CUDA: NCCL, one GPU per
process (``LOCAL_RANK``); without CUDA, or with ``ASYNCGPU_BACKEND=host``: gloo and the host backend (CPU worker
threads), and it says so. Under mpirun: the MPI communicator, a GPU per rank when there are GPUs.
Each step spins on the rank's device(s), rank r a little longer than rank r-1 (on purpose: rank 1 is the
straggler), marks the all-reduce with `asyncgpu.ranks.mark_collective`, waits for its device and all-reduces.
`asyncgpu.ranks.gather` then brings every rank's scope to rank 0 (clock offsets measured by ping-pong), which prints
the report and writes one Perfetto trace (in the temp folder unless ``--trace`` says where): a process per
(rank, device), host tracks per rank.
"""

from __future__ import annotations

import argparse
import os
import sys

from example_setup import need, need_modules, trace_path

import asyncgpu


def _under_torchrun() -> bool:
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def _under_mpi() -> bool:
    return not _under_torchrun() and any(
        k in os.environ for k in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "MPI_LOCALRANKID")
    )


def setup_torch():
    """``(rank, world, devices, collective, description, group, close)`` under torchrun (group None: the
    default group)."""
    import torch
    import torch.distributed as dist

    local = int(os.environ.get("LOCAL_RANK", 0))
    if torch.cuda.is_available() and asyncgpu.default_backend() == "cuda":
        per_node, gpus = int(os.environ.get("LOCAL_WORLD_SIZE", 1)), torch.cuda.device_count()
        if per_node > gpus:  # every rank says so and exits: NCCL needs a GPU of its own per process
            need(
                f"one GPU per process: --nproc-per-node {per_node} but this machine has {gpus} "
                f"(torchrun --nproc-per-node {gpus} {sys.argv[0]}, or ASYNCGPU_BACKEND=host for gloo on host devices)"
            )
        torch.cuda.set_device(local)
        try:
            dist.init_process_group("nccl", device_id=torch.device("cuda", local))
        except TypeError:  # torch < 2.3 has no device_id
            dist.init_process_group("nccl")
        devices = [asyncgpu.device(f"cuda:{local}")]
        x = torch.ones(1, device=torch.device("cuda", local))
        how = f"torch.distributed nccl, one GPU per process (LOCAL_RANK {local} -> cuda:{local})"

        def collective():
            dist.all_reduce(x)
            torch.cuda.synchronize()
    else:
        dist.init_process_group("gloo")
        devices = asyncgpu.devices("host", count=2)
        x = torch.ones(1)
        how = "torch.distributed gloo + asyncgpu host backend (no CUDA GPU here)"

        def collective():
            dist.all_reduce(x)

    return dist.get_rank(), dist.get_world_size(), devices, collective, how, None, dist.destroy_process_group


def setup_mpi():
    """The same under mpirun: the group is ``MPI.COMM_WORLD``."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    try:
        if asyncgpu.default_backend() != "cuda":
            raise asyncgpu.NoDeviceError("the host backend, as ASYNCGPU_BACKEND asks")
        devices = [asyncgpu.device(rank % len(asyncgpu.devices("cuda")), backend="cuda")]
        how = f"MPI ({MPI.Get_library_version().splitlines()[0].strip()}), CUDA device {devices[0].name}"
    except asyncgpu.NoDeviceError:
        devices = asyncgpu.devices("host", count=2)
        how = "MPI + asyncgpu host backend (no CUDA GPU here)"
    return rank, comm.Get_size(), devices, comm.Barrier, how, comm, lambda: None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5, help="training steps to time")
    ap.add_argument("--spin-us", type=float, default=2000.0, help="work per step on rank 0 (µs)")
    ap.add_argument("--trace", metavar="PATH", help="where rank 0 writes the merged trace (default: temp folder)")
    a = ap.parse_args(argv)
    trace = trace_path(a.trace, "ranks")
    if _under_mpi():
        need_modules("mpi4py", install="pip install 'asyncgpu[mpi]'")
        rank, world, devices, collective, how, group, close = setup_mpi()
    elif _under_torchrun():
        need_modules("torch", install="pip install 'asyncgpu[torch]'")
        rank, world, devices, collective, how, group, close = setup_torch()
    else:
        need(f"a launcher that starts the ranks: torchrun --nproc-per-node 2 {sys.argv[0]} (or mpirun -n 2 python ...)")
    if rank == 0:
        print(f"{world} ranks: {how}", flush=True)
    collective()  # start together, as after the previous step
    with asyncgpu.gpu_timer(devices, label="train") as t:
        for _ in range(a.steps):
            for d in devices:
                d.stream.spin_us(a.spin_us * (1 + 0.5 * rank))  # uneven on purpose
            asyncgpu.ranks.mark_collective("allreduce")  # right before the collective, on every rank
            for d in devices:
                d.synchronize()
            collective()
    result = asyncgpu.ranks.gather(t, group, timeout_s=60)  # every rank calls it; rank 0 gets the result
    if rank == 0:
        print(result)
        result.write_trace(trace)
        print(f"trace: {trace} (open it at https://ui.perfetto.dev)")
    close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
