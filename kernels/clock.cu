// asyncgpu clock calibration: one thread answers host pings with %globaltimer stamps (asyncgpu/_core/clock.py).
//
// The host zeroes stamps[0..n], then writes `first`, `first + 1`, ... into *flag (pinned, mapped host memory).
// For each value v the kernel spins until *flag has reached v (cyclic compare, as cuStreamWaitValue32's GEQ) and
// writes %globaltimer into stamps[v - first]: the 8-byte stamp is itself the acknowledgement the host waits for
// (one posted write; an acknowledgement word behind a system fence made the round trip ~1 µs longer). The host
// brackets each flip by its own clock readings (h0 before the write, h1 when it sees the stamp): the stamp lies
// between them, so the offset of the device clock to the host clock is within [stamp - h1, stamp - h0].
//
// After the last ping the kernel stamps once more, as its last instruction, into stamps[n]: an event recorded
// right after the kernel on the same stream lands between that stamp and the host seeing a write that follows
// the event, which places CUDA events on the globaltimer's (precise) calibration.
//
// *started = first tells the host that the kernel runs. A host that gives up writes a value >= every v into
// *flag: the kernel then runs through the remaining values at once and exits (it never spins forever).
// Launch: grid 1, block 1. Several devices may share one `flag` (ground-truth tests): each has its own
// started word and stamps.

__device__ __forceinline__ unsigned long long asyncgpu_clock_globaltimer_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

extern "C" __global__ void asyncgpu_clock_pingpong(const volatile unsigned int* flag, volatile unsigned int* started,
                                                   volatile unsigned long long* stamps, unsigned int first,
                                                   unsigned int n) {
    *started = first;
    __threadfence_system();
    for (unsigned int i = 0; i < n; ++i) {
        const unsigned int v = first + i;
        while ((int)(*flag - v) < 0) {
        }
        stamps[i] = asyncgpu_clock_globaltimer_ns();
        __threadfence_system();  // (after the stamp: it pushes the stamp out, and costs the host nothing)
    }
    stamps[n] = asyncgpu_clock_globaltimer_ns();
}

// Spins for duration_ns and stamps its own first and last instant into out[0], out[1]: bracketed by two events,
// it measures what event bracketing adds to a kernel's time on the GPU (launch and completion latency).
extern "C" __global__ void asyncgpu_clock_bracket(unsigned long long duration_ns, unsigned long long* out) {
    const unsigned long long start = asyncgpu_clock_globaltimer_ns();
    unsigned long long now = start;
    while (now - start < duration_ns) {
        now = asyncgpu_clock_globaltimer_ns();
    }
    out[0] = start;
    out[1] = now;
}

// GPU-to-GPU pings through device memory (peer access), with no host link in the way: one thread on each of two
// GPUs. For each value v = first + i the initiator stamps t0, writes v into the responder's word (`theirs`), and
// spins until its own word (`mine`) reaches v, then stamps t1; the responder spins until its word reaches v, stamps
// and writes v back. stamps: the initiator's t0, t1 at [2i], [2i + 1]; the responder's stamp at [2i]; then [2n] reads
// 1 if the kernel gave up (`timeout_ns` after it started: the other side never ran) and [2n + 1] is the exit stamp.
// Causality puts globaltimer_responder − globaltimer_initiator within [stamp − t1, stamp − t0] for every ping.
// Launch: grid 1, block 1, on both GPUs at once (the responder first).
extern "C" __global__ void asyncgpu_clock_peer_ping(volatile unsigned int* mine, volatile unsigned int* theirs,
                                                    unsigned long long* stamps, unsigned int first, unsigned int n,
                                                    int initiator, unsigned long long timeout_ns) {
    const unsigned long long begin = asyncgpu_clock_globaltimer_ns();
    stamps[2 * n] = 0;
    for (unsigned int i = 0; i < n; ++i) {
        const unsigned int v = first + i;
        unsigned long long t0 = 0;
        if (initiator) {
            t0 = asyncgpu_clock_globaltimer_ns();
            *theirs = v;
            __threadfence_system();
        }
        while ((int)(*mine - v) < 0) {
            if (asyncgpu_clock_globaltimer_ns() - begin > timeout_ns) {
                stamps[2 * n] = 1;
                stamps[2 * n + 1] = asyncgpu_clock_globaltimer_ns();
                return;
            }
        }
        const unsigned long long seen = asyncgpu_clock_globaltimer_ns();
        if (initiator) {
            stamps[2 * i] = t0;
            stamps[2 * i + 1] = seen;
        } else {
            *theirs = v;
            __threadfence_system();
            stamps[2 * i] = seen;
        }
    }
    stamps[2 * n + 1] = asyncgpu_clock_globaltimer_ns();
}
