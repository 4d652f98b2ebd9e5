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
