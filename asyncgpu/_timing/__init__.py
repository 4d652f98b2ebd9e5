"""Timing features: the scope (`gpu_timer`), the kernel history, the benchmark, NVTX ranges, and step timing."""
