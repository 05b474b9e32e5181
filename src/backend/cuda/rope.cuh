// GGML "normal" rope, one pair at a time (internal; the rope kernels of elementwise.cu and the
// decode attention kernel that turns q and k itself both use it, so that they give the same bits).
#pragma once
#include <cuda_runtime.h>

namespace nt::cuda::detail {

// cos and sin of pair j's angle at position pos: the float product pos * inv_freq[j], then a
// double-precision sincos (what the CPU backend computes), rounded to float.
__device__ __forceinline__ void rope_angle(int pos, float inv_freq, float& c, float& s) {
    double sd = 0, cd = 1;
    sincos(double(__fmul_rn(float(pos), inv_freq)), &sd, &cd);
    c = float(cd);
    s = float(sd);
}

// The pair (a, b) turned by the angle whose cos and sin are c and s, every operation rounded
// on its own (no contraction into fused multiply-adds, which would differ between kernels).
__device__ __forceinline__ float2 rope_turn(float a, float b, float c, float s) {
    return make_float2(__fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s)),
                       __fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c)));
}

}  // namespace nt::cuda::detail
