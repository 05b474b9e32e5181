// The residual add, RMSNorm and int8 activation quantization of one row (add_rmsnorm with a
// slot), as device code shared by the two places that run it: add_rmsnorm's own kernel
// (elementwise.cu: a block of dim / 8 threads, 8 consecutive elements each) and the GEMV that
// reads its output and runs it itself after its wait (matmul_gemv_tma.cuh: 128 threads, each
// standing in for dim / 1024 of those threads). Both take the same floats through the same
// operations in the same order, so both give the same bits. Device code only; include from .cu
// files.
#pragma once
#include <cooperative_groups.h>
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

// The in-GEMV norm (NormIn, matmul.cuh) runs in clusters of kNormCluster CTAs of 128 threads,
// for rows of kNormDim elements: CTA rank r of a cluster reads, adds, norms and quantizes
// elements [r * 1024, (r + 1) * 1024) of the row, 8 a thread, and writes its warps' sums of
// squares and its quantization into the shared memory of every CTA of its cluster (distributed
// shared memory), so that each CTA reads its activations from its own shared memory, and L2
// serves each CTA a quarter of x and y rather than the whole row.
constexpr int kNormCluster = 4;
constexpr int kNormDim = kNormCluster * 1024;
static_assert(kNormDim == kNormInGemvDim, "the rows matmul_norm_in leaves to the GEMV");

// Its shared memory, in each CTA.
struct __align__(16) NormSmem {
    int8_t xq[kNormDim];
    float2 xd[kNormDim / 32];
    float red[kNormDim / 256];  // one sum of squares per 256 elements (add_rmsnorm's warps)
    int last;
};

// Before the GEMV's wait: this thread's 8 norm weights (constant in the stream).
__device__ __forceinline__ void norm_weights(const NormIn& n, unsigned rank, float (&w)[8]) {
    const int64_t e0 = int64_t(rank) * 1024 + threadIdx.x * 8;
    const float4 a = __ldg(reinterpret_cast<const float4*>(n.w + e0));
    const float4 b = __ldg(reinterpret_cast<const float4*>(n.w + e0) + 1);
    w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w, w[4] = b.x, w[5] = b.y, w[6] = b.z, w[7] = b.w;
}

// At the GEMV's start, every thread: arrives on the cluster barrier that norm_in_cluster waits
// on before its first store into another CTA's shared memory (which must have started by then).
__device__ __forceinline__ void norm_cluster_arrive() {
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}

// After the GEMV's wait, in each CTA of a cluster launch of kNormCluster (n.dim == kNormDim,
// blockDim.x == 128): x + y, its norm and its quantization, as add_rmsnorm's kernel computes
// them, into sm of every CTA of the cluster. Thread t of cluster rank r stands in for
// add_rmsnorm's thread r * 128 + t: its warp sums, their reduction and its Q8 blocks are that
// kernel's. The cluster whose rank 0 counts last on n.counter (every CTA of the grid has read
// its part of x and y by then) also writes what add_rmsnorm writes, each CTA its part: x + y
// into x, the float norm into out and the quantization into the slot; it sets the counter back
// to zero for the next launch. Ends with a cluster barrier: sm is complete in every CTA. Every
// thread must have called norm_cluster_arrive() before.
template <int MODE>
__device__ __forceinline__ void norm_in_cluster(const NormIn& n, const float (&w)[8],
                                                NormSmem& sm) {
    namespace cg = cooperative_groups;
    const cg::cluster_group cluster = cg::this_cluster();
    const unsigned rank = cluster.block_rank();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t e0 = int64_t(rank) * 1024 + threadIdx.x * 8;
    float v[8];
    {
        const float4 a = reinterpret_cast<const float4*>(n.x + e0)[0];
        const float4 b = reinterpret_cast<const float4*>(n.x + e0)[1];
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z,
        v[7] = b.w;
    }
    if (n.y) {
        const float4 a = reinterpret_cast<const float4*>(n.y + e0)[0];
        const float4 b = reinterpret_cast<const float4*>(n.y + e0)[1];
        v[0] = __fadd_rn(v[0], a.x), v[1] = __fadd_rn(v[1], a.y), v[2] = __fadd_rn(v[2], a.z),
        v[3] = __fadd_rn(v[3], a.w), v[4] = __fadd_rn(v[4], b.x), v[5] = __fadd_rn(v[5], b.y),
        v[6] = __fadd_rn(v[6], b.z), v[7] = __fadd_rn(v[7], b.w);
    }
    const float s = warp_sum_xor(sum_sq8(v));
    const int vw = int(rank) * 4 + warp;                         // add_rmsnorm's warp
    asm volatile("barrier.cluster.wait.aligned;" ::: "memory");  // norm_cluster_arrive's
    if (lane < kNormCluster) *cluster.map_shared_rank(&sm.red[vw], unsigned(lane)) = s;
    cluster.sync();  // every CTA of the cluster has read its x and y, and has every warp sum
    if (rank == 0 && threadIdx.x == 0) {
        const int last = atomicAdd(n.counter, 1) == int(gridDim.x / kNormCluster) - 1;
        if (last) *n.counter = 0;
        for (unsigned c = 0; c < kNormCluster; ++c) *cluster.map_shared_rank(&sm.last, c) = last;
    }
    const float scale = rms_scale(sum_of_warps(sm.red, kNormDim / 256, lane), n.dim, n.eps);
    float o[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) o[i] = rms_apply(v[i], scale, w[i]);
    int q[8];
    const float2 dq = MODE == int(ActQuant::Q8_K) ? q8k_block(o, lane, q)
                                                  : q8_block<8, MODE == int(ActQuant::Q8_1)>(o, q);
    uint32_t lo = 0, hi = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        lo |= uint32_t(uint8_t(int8_t(q[i]))) << (8 * i);
        hi |= uint32_t(uint8_t(int8_t(q[4 + i]))) << (8 * i);
    }
    for (unsigned c = 0; c < kNormCluster; ++c) {
        NormSmem* dst = cluster.map_shared_rank(&sm, c);
        *reinterpret_cast<uint2*>(dst->xq + e0) = make_uint2(lo, hi);
        if ((lane & 3) == 0) dst->xd[e0 / 32] = dq;
    }
    cluster.sync();  // sm complete everywhere; no CTA touches another's shared memory after this
    if (sm.last) {
        if (n.y) {
            reinterpret_cast<float4*>(n.x + e0)[0] = make_float4(v[0], v[1], v[2], v[3]);
            reinterpret_cast<float4*>(n.x + e0)[1] = make_float4(v[4], v[5], v[6], v[7]);
        }
        reinterpret_cast<float4*>(n.out + e0)[0] = make_float4(o[0], o[1], o[2], o[3]);
        reinterpret_cast<float4*>(n.out + e0)[1] = make_float4(o[4], o[5], o[6], o[7]);
        *reinterpret_cast<uint2*>(n.xq + e0) = make_uint2(lo, hi);
        if ((lane & 3) == 0) n.xd[e0 / 32] = dq;
    }
}

}  // namespace nt::cuda::detail
