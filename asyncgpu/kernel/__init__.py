"""In-kernel records: a CUDA header (``asyncgpu_profile.cuh``, in `include_dir`) stamps ``%globaltimer`` inside
kernels; `KernelProfiler` arms a record buffer, collects it after the launch, decodes it (numpy) and places it on
the scope's timeline. `decode` / `decode_tirx` read buffers of other tools; `HostLane` writes the same format
from host-backend "kernels". The wire format is defined once, in ``kernels/asyncgpu_profile_format.h``, which
`FORMAT` reads.

    prof = asyncgpu.kernel.KernelProfiler(dev, stages=("load", "compute"))
    ptr = prof.arm(grid)
    dev.stream.launch(kernel, config, ..., ptr)
    recs = await prof.collect()
"""

from __future__ import annotations

from asyncgpu._backends.kernels import FORMAT as FORMAT
from asyncgpu._backends.kernels import HostLane as HostLane
from asyncgpu._base.publish import publish
from asyncgpu.kernel.asyncgpu_format import decode as decode
from asyncgpu.kernel.profiler import INC_LOOP_STAGES as INC_LOOP_STAGES
from asyncgpu.kernel.profiler import KernelProfiler as KernelProfiler
from asyncgpu.kernel.profiler import include_dir as include_dir
from asyncgpu.kernel.records import KernelRecords as KernelRecords
from asyncgpu.kernel.records import StageSummary as StageSummary
from asyncgpu.kernel.tirx_format import decode_tirx as decode_tirx

__all__ = [
    "FORMAT",
    "INC_LOOP_STAGES",
    "HostLane",
    "KernelProfiler",
    "KernelRecords",
    "StageSummary",
    "decode",
    "decode_tirx",
    "include_dir",
]

publish(__name__, globals(), __all__)
