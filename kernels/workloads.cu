// asyncgpu built-in workloads. Compiled at run time with NVRTC (asyncgpu/_backends/cuda.py), cached per device and
// architecture. Every kernel is extern "C" so the host looks it up by its plain name.
//
// Launch shapes (set by asyncgpu/_backends/cuda.py):
//   asyncgpu_spin       grid 1, block 1         busy-waits duration_ns on %globaltimer
//   asyncgpu_inc_loop   grid ceil(n/256), 256   Warp's inc_loop: a[i] += 1.0f, `iterations` times
//   asyncgpu_prime      grid 1, block 1         does nothing: puts the next event record behind the compute
//                                               engine (event brackets at a copy->compute switch)

__device__ __forceinline__ unsigned long long asyncgpu_globaltimer_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

extern "C" __global__ void asyncgpu_spin(unsigned long long duration_ns) {
    const unsigned long long start = asyncgpu_globaltimer_ns();
    while (asyncgpu_globaltimer_ns() - start < duration_ns) {
    }
}

extern "C" __global__ void asyncgpu_inc_loop(float* a, unsigned long long n, int iterations) {
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    for (int j = 0; j < iterations; ++j) {
        a[i] = a[i] + 1.0f;
    }
}

extern "C" __global__ void asyncgpu_prime() {}
