// The residual add, RMSNorm and int8 activation quantization of one row (add_rmsnorm with a
// slot), as device code shared by the two places that run it: add_rmsnorm's own kernel
// (elementwise.cu: a block of dim / 8 threads, 8 consecutive elements each) and the GEMV that
// reads its output and runs it itself after its wait (matmul_gemv_tma.cuh: 128 threads, each
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

// Shared memory of the in-GEMV norm for rows of kNV * 1024 elements.
template <int kNV>
struct __align__(16) NormSmem {
    int8_t xq[kNV * 1024];
    float2 xd[kNV * 32];
    float red[32];
    int last;
};

// This thread's 8 norm weights of group j (see norm_in_cta), through L1.
template <int kNV>
__device__ __forceinline__ void norm_weights8(const NormIn& n, int j, float (&w)[8]) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t e0 = (int64_t(warp * kNV + j) * 32 + lane) * 8;
    const float4 a = __ldg(reinterpret_cast<const float4*>(n.w + e0));
    const float4 b = __ldg(reinterpret_cast<const float4*>(n.w + e0) + 1);
    w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w, w[4] = b.x, w[5] = b.y, w[6] = b.z, w[7] = b.w;
}
// Before the GEMV's wait: the norm weights asked into L1 (constant in the stream; prefetched
// rather than loaded, so that they hold no registers until the norm needs them).
template <int kNV>
__device__ __forceinline__ void norm_prefetch(const NormIn& n) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int j = 0; j < kNV; ++j) {
        const float* p = n.w + (int64_t(warp * kNV + j) * 32 + lane) * 8;
        asm volatile("prefetch.global.L1 [%0];" ::"l"(p));
    }
}

// After the GEMV's wait, in each of its CTAs (kNV * 1024 == n.dim, blockDim.x == 128): x + y,
// its norm and its quantization into sm (which the GEMV then reads its activations from), as
// add_rmsnorm's kernel computes them. Thread t of warp w stands in for add_rmsnorm's threads
// (w * kNV + j) * 32 + t, j < kNV, so its warps' sums and quantization blocks are theirs.
// The CTA that counts last on n.counter (every CTA has read x and y by then) also writes what
// add_rmsnorm writes: x + y into x, the float norm into out and the quantization into the
// slot, and sets the counter back to zero for the next launch. Ends with __syncthreads.
template <int kNV, int MODE>
__device__ __forceinline__ void norm_in_cta(const NormIn& n, NormSmem<kNV>& sm) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float v[kNV][8];
#pragma unroll
    for (int j = 0; j < kNV; ++j) {
        const int64_t e0 = (int64_t(warp * kNV + j) * 32 + lane) * 8;
        const float4 a = reinterpret_cast<const float4*>(n.x + e0)[0];
        const float4 b = reinterpret_cast<const float4*>(n.x + e0)[1];
        v[j][0] = a.x, v[j][1] = a.y, v[j][2] = a.z, v[j][3] = a.w;
        v[j][4] = b.x, v[j][5] = b.y, v[j][6] = b.z, v[j][7] = b.w;
    }
    if (n.y) {
#pragma unroll
        for (int j = 0; j < kNV; ++j) {
            const int64_t e0 = (int64_t(warp * kNV + j) * 32 + lane) * 8;
            const float4 a = reinterpret_cast<const float4*>(n.y + e0)[0];
            const float4 b = reinterpret_cast<const float4*>(n.y + e0)[1];
            v[j][0] = __fadd_rn(v[j][0], a.x), v[j][1] = __fadd_rn(v[j][1], a.y);
            v[j][2] = __fadd_rn(v[j][2], a.z), v[j][3] = __fadd_rn(v[j][3], a.w);
            v[j][4] = __fadd_rn(v[j][4], b.x), v[j][5] = __fadd_rn(v[j][5], b.y);
            v[j][6] = __fadd_rn(v[j][6], b.z), v[j][7] = __fadd_rn(v[j][7], b.w);
        }
    }
#pragma unroll
    for (int j = 0; j < kNV; ++j) {
        const float s = warp_sum_xor(sum_sq8(v[j]));
        if (lane == 0) sm.red[warp * kNV + j] = s;
    }
    __syncthreads();  // every thread of this CTA has read x and y
    if (threadIdx.x == 0) {
        const int last = atomicAdd(n.counter, 1) == int(gridDim.x) - 1;
        if (last) *n.counter = 0;
        sm.last = last;
    }
    const float scale = rms_scale(sum_of_warps(sm.red, kNV * 4, lane), n.dim, n.eps);
#pragma unroll
    for (int j = 0; j < kNV; ++j) {
        const int64_t e0 = (int64_t(warp * kNV + j) * 32 + lane) * 8;
        float o[8];
        norm_weights8<kNV>(n, j, o);
#pragma unroll
        for (int i = 0; i < 8; ++i) o[i] = rms_apply(v[j][i], scale, o[i]);
        quantize8<MODE>(o, lane, sm.xq, sm.xd, e0);
    }
    __syncthreads();
    if (sm.last) {
#pragma unroll
        for (int j = 0; j < kNV; ++j) {
            const int64_t e0 = (int64_t(warp * kNV + j) * 32 + lane) * 8;
            float o[8];
            norm_weights8<kNV>(n, j, o);
#pragma unroll
            for (int i = 0; i < 8; ++i) o[i] = rms_apply(v[j][i], scale, o[i]);
            if (n.y) {
                reinterpret_cast<float4*>(n.x + e0)[0] =
                    make_float4(v[j][0], v[j][1], v[j][2], v[j][3]);
                reinterpret_cast<float4*>(n.x + e0)[1] =
                    make_float4(v[j][4], v[j][5], v[j][6], v[j][7]);
            }
            reinterpret_cast<float4*>(n.out + e0)[0] = make_float4(o[0], o[1], o[2], o[3]);
            reinterpret_cast<float4*>(n.out + e0)[1] = make_float4(o[4], o[5], o[6], o[7]);
        }
        for (int i = threadIdx.x; i < kNV * 1024 / 16; i += blockDim.x)
            reinterpret_cast<int4*>(n.xq)[i] = reinterpret_cast<const int4*>(sm.xq)[i];
        for (int i = threadIdx.x; i < kNV * 32; i += blockDim.x) n.xd[i] = sm.xd[i];
    }
}

}  // namespace nt::cuda::detail
