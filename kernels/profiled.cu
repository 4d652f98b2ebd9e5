// asyncgpu's kernels with in-kernel records (kernels/asyncgpu_profile.cuh), compiled at run time like
// workloads.cu. profiled_off.cu includes this file with ASYNCGPU_PROFILE=0: the same kernels with every record
// compiled out, named with an `_off` suffix (the benchmarks' uninstrumented twins).
//
// Launch shapes (set by asyncgpu/_cuda.py and benchmarks/bench_kprofile.py):
//   asyncgpu_inc_loop_profiled  grid ceil(n/256), 256   inc_loop; stages (group 0, thread 0 of each block):
//                                                        0 load (until the first add has its value),
//                                                        1 add (the other iterations), 2 store
//   asyncgpu_kp_bench           any grid and block      `regions` regions of stage 0 per lane, each around
//                                                        `work` dependent FMAs; groups of 128 threads
#include "asyncgpu_profile.cuh"

#if ASYNCGPU_PROFILE
#define AGK_KERNEL(name) name
#else
#define AGK_KERNEL(name) name##_off
#endif

extern "C" __global__ void AGK_KERNEL(asyncgpu_inc_loop_profiled)(float* a, unsigned long long n, int iterations,
                                                                 unsigned long long* records) {
    asyncgpu::Profiler prof(records);
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    prof.begin(0);
    float v = i < n ? a[i] : 0.0f;
    if (iterations > 0) v = v + 1.0f;  // waits for the load: the stamp below comes after it landed
    asm volatile("" : "+f"(v)::"memory");
    prof.end(0);
    prof.begin(1);
    for (int j = 1; j < iterations; ++j) {
        v = v + 1.0f;
    }
    asm volatile("" : "+f"(v)::"memory");
    prof.end(1);
    prof.begin(2);
    if (i < n) a[i] = v;
    prof.end(2);
    prof.finalize();
}

extern "C" __global__ void AGK_KERNEL(asyncgpu_kp_bench)(float* out, int regions, int work,
                                                        unsigned long long* records) {
    const unsigned int group = threadIdx.x / 128;
    asyncgpu::Profiler prof(records, group, threadIdx.x % 128 == 0);
    float acc = threadIdx.x;
    for (int r = 0; r < regions; ++r) {
        auto region = prof.region(0);
        for (int k = 0; k < work; ++k) {
            acc = fmaf(acc, 0.999f, 1.0f);
        }
        asm volatile("" : "+f"(acc)::"memory");
    }
    prof.finalize();
    out[(unsigned long long)blockIdx.x * blockDim.x + threadIdx.x] = acc;
}
