// asyncgpu in-kernel records: bracket named stages inside a kernel with %globaltimer stamps.
// Header-only; compiles with NVRTC and nvcc (C++17). The layout it writes is kernels/asyncgpu_profile_format.h.
//
//   #include "asyncgpu_profile.cuh"
//   enum : unsigned { LOAD, COMPUTE };                      // stage ids 0..4095; names are given on the host
//   extern "C" __global__ void k(float* x, unsigned long long* records) {
//       const unsigned group = threadIdx.x / 128;          // e.g. a warp group
//       asyncgpu::Profiler prof(records, group, threadIdx.x % 128 == 0);   // one leader per group writes
//       prof.begin(LOAD); ...; prof.end(LOAD);
//       { auto r = prof.region(COMPUTE); ... }             // RAII: end() when r goes out of scope
//       prof.instant(COMPUTE);
//       prof.finalize();                                    // once, at the end (the decoder checks it)
//   }
//
// Host side: asyncgpu.KernelProfiler(device, stages=("load", "compute"), groups=2).arm(grid) zeroes the buffer
// and writes its header on the stream; pass `prof.pointer` as the kernel's `records` argument.
//
// Compile-time switch: -DASYNCGPU_PROFILE=0 (or `#define ASYNCGPU_PROFILE 0` before the include) turns every
// call into nothing; the kernel's code is then the same as without the calls (tests compare the cubins).
//
// Cost (per record, on the leader's warp only): one %globaltimer_lo read, a compare, one 8-byte store, an add.
// Measured on H100 (benchmarks/bench_kprofile.py): about 57 ns per record on the leader's critical path, the
// same for one lane and for every SM's leaders at once: the read (S2UR in SASS) stalls the warp until its value
// reaches the store. Starting a lane reads the 16-byte header once (paid by the first record that stores).
// Stamps follow the leader's program order: the compiler and the GPU may move independent arithmetic and
// memory operations across them (the stamp's asm has a memory clobber, so memory operations stay on their side
// in the compiler). To time a load, end the stage after an instruction that uses the loaded value.
//
// Safety: a leader never writes outside its lane. A lane that is full counts what it drops (the decoder reports
// it); a (block, group) whose lane lies past the buffer writes nothing and is counted in the header; a buffer
// whose header is not armed (wrong magic) is never written. Other threads' calls cost one predicate.
#ifndef ASYNCGPU_PROFILE_CUH
#define ASYNCGPU_PROFILE_CUH

#include "asyncgpu_profile_format.h"

#ifndef ASYNCGPU_PROFILE
#define ASYNCGPU_PROFILE 1
#endif

namespace asyncgpu {

static_assert(AGK_HDR_MAGIC == 0 && AGK_HDR_GROUPS == 1 && AGK_HDR_LANES == 2 && AGK_HDR_CAPACITY == 3,
              "the leader reads the host's header fields with one 16-byte load");

//: The tag of a record: kind (AGK_KIND_*) and stage id (masked to AGK_STAGE_BITS bits).
__host__ __device__ constexpr unsigned int profile_tag(unsigned int kind, unsigned int stage) {
    return (static_cast<unsigned int>(AGK_RECORD_MARK) << AGK_MARK_SHIFT) |
           ((stage & ((1u << AGK_STAGE_BITS) - 1u)) << AGK_STAGE_SHIFT) | (kind & ((1u << AGK_KIND_BITS) - 1u));
}

//: The lane finalize word: records attempted, flags, and the mark that says finalize ran.
__host__ __device__ constexpr unsigned long long profile_fin_word(unsigned int attempted, unsigned int flags) {
    return (static_cast<unsigned long long>(AGK_FIN_MARK) << AGK_FIN_MARK_SHIFT) |
           (static_cast<unsigned long long>(flags & 0xFFFFu) << AGK_FIN_FLAGS_SHIFT) | attempted;
}

#if ASYNCGPU_PROFILE

__device__ __forceinline__ unsigned long long profile_globaltimer_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
    return t;
}

__device__ __forceinline__ unsigned int profile_globaltimer_lo() {
    unsigned int t;
    asm volatile("mov.u32 %0, %%globaltimer_lo;" : "=r"(t)::"memory");
    return t;
}

class Profiler {
  public:
    class Region {
      public:
        __device__ Region(Profiler* p, unsigned int stage) : p_(p), stage_(stage) {}
        __device__ ~Region() { p_->end(stage_); }
        Region(const Region&) = delete;
        Region& operator=(const Region&) = delete;

      private:
        Profiler* p_;
        unsigned int stage_;
    };

    // `buffer`: the pointer KernelProfiler.arm() returned. `group`: this thread's group in its block
    // (0 .. groups-1, as given to KernelProfiler). `leader`: true on exactly one thread per (block, group),
    // the only one that writes. By default: group 0, led by thread (0, 0, 0) of the block.
    __device__ explicit Profiler(unsigned long long* buffer, unsigned int group = 0,
                                 bool leader = (threadIdx.x | threadIdx.y | threadIdx.z) == 0)
        : lane_(nullptr), n_(0), cap_(0), previous_(0) {
        if (!leader || buffer == nullptr) return;
        const uint4 h = *reinterpret_cast<const uint4*>(buffer);  // the host's four fields in one load
        if (h.x != AGK_MAGIC) return;                              // not armed: never write
        const unsigned int groups = h.y, lanes = h.z, cap = h.w;
        const unsigned int block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
        unsigned int* w = reinterpret_cast<unsigned int*>(buffer);
        if (block == 0) w[AGK_HDR_BLOCKS] = gridDim.x * gridDim.y * gridDim.z;  // every leader of block 0 agrees
        if (group >= groups) {
            atomicMax(w + AGK_HDR_BAD_GROUP, group + 1);
            return;
        }
        const unsigned long long lane = static_cast<unsigned long long>(block) * groups + group;
        if (lane >= lanes) {
            atomicAdd(w + AGK_HDR_NO_ROOM, 1u);
            return;
        }
        lane_ = buffer + AGK_HEADER_WORDS + lane * (AGK_LANE_WORDS + static_cast<unsigned long long>(cap));
        cap_ = cap;
        previous_ = lane_[AGK_LANE_START];  // nonzero: a launch already used this lane since it was zeroed
        lane_[AGK_LANE_START] = profile_globaltimer_ns();
    }

    __device__ __forceinline__ void begin(unsigned int stage) { put(AGK_KIND_BEGIN, stage); }
    __device__ __forceinline__ void end(unsigned int stage) { put(AGK_KIND_END, stage); }
    __device__ __forceinline__ void instant(unsigned int stage) { put(AGK_KIND_INSTANT, stage); }
    __device__ __forceinline__ Region region(unsigned int stage) {
        begin(stage);
        return Region(this, stage);
    }

    // Ends the lane: its end stamp, how many records it attempted, whether it was reused without zeroing.
    // Call it once per leader after the last record (later calls and records write nothing).
    __device__ void finalize() {
        if (lane_ == nullptr) return;
        lane_[AGK_LANE_END] = profile_globaltimer_ns();
        lane_[AGK_LANE_FIN] = profile_fin_word(n_, previous_ != 0 ? AGK_FLAG_REUSED : 0u);
        lane_ = nullptr;
    }

  private:
    __device__ __forceinline__ void put(unsigned int kind, unsigned int stage) {
        if (lane_ == nullptr) return;
        const unsigned int t = profile_globaltimer_lo();
        if (n_ < cap_) {
            lane_[AGK_LANE_WORDS + n_] = (static_cast<unsigned long long>(t) << AGK_TIME_SHIFT) |
                                         profile_tag(kind, stage);
        }
        ++n_;
    }

    unsigned long long* lane_;  // this leader's lane; nullptr: this thread writes nothing
    unsigned int n_;            // records attempted
    unsigned int cap_;
    unsigned long long previous_;
};

#else  // ASYNCGPU_PROFILE == 0: every call is nothing

class Profiler {
  public:
    class Region {
      public:
        __device__ Region(Profiler*, unsigned int) {}
        Region(const Region&) = delete;
        Region& operator=(const Region&) = delete;
    };
    __device__ explicit Profiler(unsigned long long*, unsigned int = 0, bool = false) {}
    __device__ __forceinline__ void begin(unsigned int) {}
    __device__ __forceinline__ void end(unsigned int) {}
    __device__ __forceinline__ void instant(unsigned int) {}
    __device__ __forceinline__ Region region(unsigned int stage) { return Region(this, stage); }
    __device__ __forceinline__ void finalize() {}
};

#endif  // ASYNCGPU_PROFILE

}  // namespace asyncgpu

#endif  // ASYNCGPU_PROFILE_CUH
