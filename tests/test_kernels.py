"""The CUDA sources compile with NVRTC on a machine without a GPU (no driver is touched)."""

from __future__ import annotations

import pytest

from asyncgpu._backends import cuda as _cuda


@pytest.mark.nvrtc
@pytest.mark.parametrize("arch", ["80", "90"])
def test_workloads_compile_with_nvrtc(arch):
    source = (_cuda.kernels_dir() / "workloads.cu").read_text()
    code = _cuda.compile_source(source, arch)
    assert code.code_type == "cubin"
    assert len(code.code) > 1000


@pytest.mark.nvrtc
def test_compile_errors_carry_the_log():
    with pytest.raises(Exception, match="undefined_name"):
        _cuda.compile_source('extern "C" __global__ void k() { undefined_name(); }', "90")


def test_kernels_dir_is_found():
    assert (_cuda.kernels_dir() / "workloads.cu").is_file()
