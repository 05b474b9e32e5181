// Counted arrivals across CTAs: several warps or CTAs each write their part of a result to
// global memory and count it on a counter; the one whose count completes the total reads all
// the parts (the SwiGLU pair's quantization of its output, the decode attention's merge).
//
// The count is one acquire-release atomic at GPU scope, made by one thread after a barrier of
// the threads that wrote (__syncwarp or __syncthreads). The barrier orders their writes before
// the count, and the release is cumulative: whoever reads the counter later sees them. The
// thread that completes the total then passes its acquire on to the others with a second
// barrier, before they read. This is the release pattern the CUDA memory model describes;
// it replaces a sequentially consistent fence (__threadfence) on each side. Such a fence
// (MEMBAR.SC.GPU) is the heavier of the two; the acquire-release atomic needs only the
// writer's own stores acknowledged (MEMBAR.ALL.GPU). H100 8B tg128, count / fences: Q4_K_M
// 465.5 / 459.0 (+1.4%), Q6_K 363.2 / 359.8 (+0.9%); with no ordering at all (a probe, not a
// correct program) 478.2 and 369.1. NT_FENCE_SC=1 brings the fences back, for A/B runs.
#pragma once
#include "core/env.h"

namespace nt::cuda {

// *counter += n, returning the value before: acquire-release at GPU scope (see above).
__device__ __forceinline__ int arrive_acq_rel(int* counter, int n) {
    int before;
    asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], %2;"
                 : "=r"(before)
                 : "l"(counter), "r"(n)
                 : "memory");
    return before;
}

// Whether counted arrivals fence with __threadfence() on both sides instead (NT_FENCE_SC).
inline bool arrival_sc_fences() {
    static const bool on = env_int("NT_FENCE_SC", 0) != 0;
    return on;
}

}  // namespace nt::cuda
