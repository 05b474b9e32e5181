// The residual add, RMSNorm and int8 activation quantization of one row (add_rmsnorm with a
// slot), as device code shared by the two places that run it: add_rmsnorm's own kernel
// (elementwise.cu: a block of dim / 8 threads, 8 consecutive elements each) and the chained
// GEMV that runs it between its two products (matmul_gemv_chain.cuh: 128 threads, each
// standing in for dim / 1024 of those threads). Both take the same floats through the same
// operations in the same order, so both give the same bits. Device code only; include from .cu
// files.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/matmul_kernels.cuh"
#include "backend/cuda/quantize_q8.cuh"

namespace nt::cuda::detail {

// Sum of squares of a thread's 8 elements, in order, each step an FMA.
__device__ __forceinline__ float sum_sq8(const float (&v)[8]) {
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) s = __fmaf_rn(v[i], v[i], s);
    return s;
}
// Warp sum, xor order: every lane gets it.
__device__ __forceinline__ float warp_sum_xor(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
// The row's sum of squares from its per-warp sums red[0 .. n_warps) (n_warps <= 32), the second
// stage of a block sum, on every lane.
__device__ __forceinline__ float sum_of_warps(const float* red, int n_warps, int lane) {
    return warp_sum_xor(lane < n_warps ? red[lane] : 0.f);
}
// As the CPU: scale = 1 / sqrt(mean + eps), each operation rounded.
__device__ __forceinline__ float rms_scale(float sum_sq, int dim, float eps) {
    return __frcp_rn(__fsqrt_rn(__fadd_rn(__fdiv_rn(sum_sq, float(dim)), eps)));
}
// (x * scale) * w, each product rounded.
__device__ __forceinline__ float rms_apply(float x, float scale, float w) {
    return __fmul_rn(__fmul_rn(x, scale), w);
}
// The 8 normed elements v of a thread that holds elements e0 .. e0 + 7 (e0 = lane * 8 within
// its warp's 256), quantized for MODE (int(ActQuant): Q8_0, Q8_1 or Q8_K) into xq + e0 and, from
// every fourth lane, the pair of its 32 into xd[e0 / 32]. Every lane of the warp calls it.
template <int MODE>
__device__ __forceinline__ void quantize8(const float (&v)[8], int lane, int8_t* xq, float2* xd,
                                          int64_t e0) {
    int q[8];
    const float2 dq = MODE == int(ActQuant::Q8_K) ? q8k_block(v, lane, q)
                                                  : q8_block<8, MODE == int(ActQuant::Q8_1)>(v, q);
    store_q8(xq + e0, q);
    if ((lane & 3) == 0) xd[e0 / 32] = dq;
}

}  // namespace nt::cuda::detail
