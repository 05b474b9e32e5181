// The residual add, RMSNorm and Q8_K quantization of one activation row, as add_rmsnorm's
// kernel computes them (elementwise.cu), in two forms that give the same bits: that kernel's
// threads (8 consecutive elements each, dim / 8 of them) and one CTA of any number of warps
// standing in for them (cta_add_rmsnorm_q8k: the SwiGLU pair's TMA form runs the norm itself
// instead of waiting for that kernel). Device code only; include from .cu files.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/quantize_q8.cuh"
#include "backend/cuda/warp_reduce.cuh"

namespace nt::cuda::detail {

// The sum of squares of a thread's 8 elements, in order, each step one fused multiply-add.
__device__ __forceinline__ float sumsq8(const float (&v)[8]) {
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) s = __fmaf_rn(v[i], v[i], s);
    return s;
}
// As the CPU: 1 / sqrt(mean + eps), each step rounded.
__device__ __forceinline__ float rms_scale(float sumsq, int dim, float eps) {
    return __frcp_rn(__fsqrt_rn(__fadd_rn(__fdiv_rn(sumsq, float(dim)), eps)));
}

// The largest row cta_add_rmsnorm_q8k takes: 16 blocks of 256, so a 4-warp CTA holds its share
// (4 blocks a warp, 32 floats a lane) in registers.
constexpr int kCtaNormMaxDim = 4096;
// Shared memory it needs for a row of dim elements: the quants, their (d, d * sum) per 32, and
// one float per block for the sums of squares.
__host__ __device__ constexpr int cta_norm_smem(int dim) {
    return dim + dim / 32 * 8 + dim / 256 * 4;
}

// x + y (y may be null), its RMSNorm with the F32 weights w and the norm's Q8_K quantization,
// for one row of dim elements (a multiple of 256, at most kCtaNormMaxDim), by the whole CTA
// (kWarps warps; every thread must call it). Block b of 256 is what add_rmsnorm's warp b
// computes: lane l takes elements 256b + 8l .. + 7, the warp sums its squares with warp_sum,
// the blocks' sums meet as block_reduce meets its warps' (one warp_sum over them, zeros past
// the last), and q8k_block quantizes the scaled block. Writes xq (dim int8) and xd (dim / 32
// pairs), both in shared memory, then waits for the CTA. `wreg`: the lane's norm weights,
// loaded by cta_norm_weights (before the kernel's programmatic wait: nothing writes them).
template <int kWarps>
struct CtaNorm {
    static constexpr int kBlocks = (kCtaNormMaxDim / 256 + kWarps - 1) / kWarps;  // a warp's
    float w[kBlocks][8];
};
template <int kWarps>
__device__ __forceinline__ void cta_norm_weights(const float* w, int dim, CtaNorm<kWarps>& r) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
    for (int j = 0; j < CtaNorm<kWarps>::kBlocks; ++j) {
        const int b = warp + j * kWarps;
        if (b * 256 < dim) {
            const float4 a = __ldg(reinterpret_cast<const float4*>(w + b * 256 + lane * 8));
            const float4 c = __ldg(reinterpret_cast<const float4*>(w + b * 256 + lane * 8 + 4));
            r.w[j][0] = a.x, r.w[j][1] = a.y, r.w[j][2] = a.z, r.w[j][3] = a.w;
            r.w[j][4] = c.x, r.w[j][5] = c.y, r.w[j][6] = c.z, r.w[j][7] = c.w;
        }
    }
}
template <int kWarps>
__device__ __forceinline__ void cta_add_rmsnorm_q8k(const float* x, const float* y, int dim,
                                                    float eps, const CtaNorm<kWarps>& wr,
                                                    int8_t* xq, float2* xd, float* red) {
    constexpr int kB = CtaNorm<kWarps>::kBlocks;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int blocks = dim / 256;
    float v[kB][8];
    // Every load first (x and y come from the kernels before: one trip to L2 for all of them).
#pragma unroll
    for (int j = 0; j < kB; ++j) {
        const int b = warp + j * kWarps;
        if (b < blocks) {
            const float4* px = reinterpret_cast<const float4*>(x + b * 256 + lane * 8);
            const float4 a = px[0], c = px[1];
            v[j][0] = a.x, v[j][1] = a.y, v[j][2] = a.z, v[j][3] = a.w;
            v[j][4] = c.x, v[j][5] = c.y, v[j][6] = c.z, v[j][7] = c.w;
        }
    }
    if (y) {
#pragma unroll
        for (int j = 0; j < kB; ++j) {
            const int b = warp + j * kWarps;
            if (b < blocks) {
                const float4* py = reinterpret_cast<const float4*>(y + b * 256 + lane * 8);
                const float4 a = py[0], c = py[1];
                const float t[8] = {a.x, a.y, a.z, a.w, c.x, c.y, c.z, c.w};
#pragma unroll
                for (int i = 0; i < 8; ++i) v[j][i] = __fadd_rn(v[j][i], t[i]);
            }
        }
    }
#pragma unroll
    for (int j = 0; j < kB; ++j) {
        const int b = warp + j * kWarps;
        if (b < blocks) {  // uniform across the warp
            const float s = warp_sum(sumsq8(v[j]));
            if (lane == 0) red[b] = s;
        }
    }
    __syncthreads();
    const float scale = rms_scale(warp_sum(lane < blocks ? red[lane] : 0.f), dim, eps);
#pragma unroll
    for (int j = 0; j < kB; ++j) {
        const int b = warp + j * kWarps;
        if (b < blocks) {
#pragma unroll
            for (int i = 0; i < 8; ++i) v[j][i] = __fmul_rn(__fmul_rn(v[j][i], scale), wr.w[j][i]);
            int q[8];
            const float2 dq = q8k_block(v[j], lane, q);
            store_q8(xq + b * 256 + lane * 8, q);
            if ((lane & 3) == 0) xd[b * 8 + (lane >> 2)] = dq;
        }
    }
    __syncthreads();
}

}  // namespace nt::cuda::detail
