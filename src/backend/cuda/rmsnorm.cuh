// The residual add, RMSNorm and activation quantization of one row, as device functions: the
// add_rmsnorm kernel (elementwise.cu) and the GEMVs that fold the norm after them into their
// last CTA (NormFold, matmul_gemv_pipe.cuh and matmul_gemv_tma.cuh) share this one copy, so
// both give the same bits. Device code only; include from .cu files.
//
// Layout: a row of `dim` elements (a multiple of 256) is read 8 consecutive elements a thread.
// The add_rmsnorm kernel has dim / 8 threads, one group of 8 each; a GEMV CTA has fewer and
// walks the row in chunks of blockDim.x * 8, thread t of chunk c taking what thread
// c * blockDim.x + t of the kernel takes. The sum of squares is reduced in the kernel's order
// (per thread, then per warp of 256 elements, then over those warps), so both compute the
// same scale.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/matmul_kernels.cuh"
#include "backend/cuda/quantize_q8.cuh"

namespace nt::cuda::detail {

// The activation quantization after the norm: none, or int(ActQuant).
constexpr int kNoQuant = -1;
constexpr int kQ80 = int(ActQuant::Q8_0), kQ81 = int(ActQuant::Q8_1), kQ8K = int(ActQuant::Q8_K);

__device__ __forceinline__ void load8(const float* p, float (&v)[8]) {
    const float4 a = reinterpret_cast<const float4*>(p)[0];
    const float4 b = reinterpret_cast<const float4*>(p)[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}
// The same through L2 only: for what other CTAs of this grid wrote.
__device__ __forceinline__ void load8_cg(const float* p, float (&v)[8]) {
    const float4 a = __ldcg(reinterpret_cast<const float4*>(p));
    const float4 b = __ldcg(reinterpret_cast<const float4*>(p) + 1);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}
__device__ __forceinline__ void store8(float* p, const float (&v)[8]) {
    reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
    reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
}

// x += y element by element, rounded as the CPU rounds it.
__device__ __forceinline__ void add8(float (&x)[8], const float (&y)[8]) {
#pragma unroll
    for (int i = 0; i < 8; ++i) x[i] = __fadd_rn(x[i], y[i]);
}

// This thread's share of the sum of squares: one fused multiply-add an element, in order.
__device__ __forceinline__ float sumsq8(const float (&v)[8]) {
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) s = __fmaf_rn(v[i], v[i], s);
    return s;
}

// The sum over a warp; every lane gets the same bits (each step adds the same two values).
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// As the CPU: 1 / sqrt(mean + eps), each step rounded.
__device__ __forceinline__ float rms_scale(float sumsq, int dim, float eps) {
    return __frcp_rn(__fsqrt_rn(__fadd_rn(__fdiv_rn(sumsq, float(dim)), eps)));
}

// Elements e0 .. e0 + 7 of the normed row: (v * scale) * w, each product rounded, written to
// out and, for MODE >= 0, quantized as quantize_q8 would (Q8_0/Q8_1: 4 threads a 32-element
// block; Q8_K: a warp a 256-element block, which the layout above lines up with a warp).
// Every lane of the warp calls it (shuffles).
template <int MODE>
__device__ __forceinline__ void norm_store8(float (&v)[8], const float (&w)[8], float scale,
                                            float* out, int8_t* xq, float2* xd, int64_t e0,
                                            int lane) {
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = __fmul_rn(__fmul_rn(v[i], scale), w[i]);
    store8(out + e0, v);
    if constexpr (MODE != kNoQuant) {
        int q[8];
        const float2 dq = MODE == kQ8K ? q8k_block(v, lane, q) : q8_block<8, MODE == kQ81>(v, q);
        store_q8(xq + e0, q);
        // Both layouts keep one pair per 32 elements, and 4 threads cover 32.
        if ((lane & 3) == 0) xd[e0 / 32] = dq;
    }
}

// The folded norm's row, by the CTA that finished last (see norm_fold_tail): blockDim.x
// threads, dim a multiple of blockDim.x * 8. y is the GEMV's output (written by every CTA).
template <int MODE>
__device__ __forceinline__ void norm_fold_row(const NormFold& f, const float* y, int dim,
                                              float* red) {
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const int threads = blockDim.x, chunks = dim / (threads * 8);
    for (int c = 0; c < chunks; ++c) {
        const int64_t e0 = (int64_t(c) * threads + t) * 8;
        float v[8], yv[8];
        load8_cg(f.x + e0, v);
        load8_cg(y + e0, yv);
        add8(v, yv);
        store8(f.x + e0, v);
        // The kernel's warp c * threads / 32 + warp.
        const float s = warp_sum(sumsq8(v));
        if (lane == 0) red[c * (threads / 32) + warp] = s;
    }
    __syncthreads();
    const float scale = rms_scale(warp_sum(lane < dim / 256 ? red[lane] : 0.f), dim, f.eps);
    for (int c = 0; c < chunks; ++c) {
        const int64_t e0 = (int64_t(c) * threads + t) * 8;
        float v[8], w[8];
        load8(f.x + e0, v);  // what this thread stored above
        load8(f.w + e0, w);
        norm_store8<MODE>(v, w, scale, f.out, f.xq, f.xd, e0, lane);
    }
}

// The end of a GEMV that folds the norm after it (every thread of every CTA calls it once its
// rows of y are written): each CTA counts itself done, and the last one adds y into x and
// writes the norm (NormFold). The counter goes back to zero for the next launch. Not inlined:
// one copy per translation unit, whatever the number of GEMV instantiations.
static __device__ __noinline__ void norm_fold_tail(NormFold f, const float* y, int dim) {
    __shared__ int last;
    __shared__ float red[32];
    __syncthreads();  // this CTA's rows are written
    if (threadIdx.x == 0) {
        __threadfence();  // ... and visible to the CTA that reads them, before they are counted
        last = atomicAdd(f.counter, 1) == int(gridDim.x) - 1;
        if (last) *f.counter = 0;  // every CTA has counted
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    switch (f.mode) {
        case kQ80:
            return norm_fold_row<kQ80>(f, y, dim, red);
        case kQ81:
            return norm_fold_row<kQ81>(f, y, dim, red);
        case kQ8K:
            return norm_fold_row<kQ8K>(f, y, dim, red);
        default:
            return norm_fold_row<kNoQuant>(f, y, dim, red);
    }
}

}  // namespace nt::cuda::detail
