// Tensor-core GEMV for Q4_K weights at several activation rows (GemvKernel::Mma; internal,
// included by matmul_gemv.cuh).
//
// At 2..8 activation rows the CUDA-core kernels are bound by their dp4a arithmetic, not by the
// weight bytes: 8 rows of an 8B Q4_K matrix run at 8-9% of HBM against 52-92% for one row
// (bench_gemv). Here a warp multiplies 16 weight rows by all (up to 8) activation rows with
// the integer mma.m16n8k32: each 32-element sub-block is one mma, whose 16 x 8 integer dot
// products then take the sub-block's scales as the CUDA-core kernels apply them:
// d * sc * dx * dot - dmin * m * (dx * sum(qx)) (Quant<Q4_K>::dot; xd holds (dx, dx * sum qx)).
//
// Fragments (PTX ISA, mma.m16n8k32 .s8): lane = 4 * g + t4; A a0 (row g, k 4t4..+3), a1 (row
// g + 8, the same k), a2 and a3 (k 16 + 4t4..+3); B b0 (k 4t4..+3, column g), b1 (k 16 +
// 4t4..+3); C c0, c1 (row g, columns 2t4, 2t4 + 1), c2, c3 (row g + 8). The dot product does
// not care which element sits at which k as long as A and B agree, so lane t4 takes the
// sub-block's elements 8t4 .. 8t4 + 7 as k 4t4..+3 and 16 + 4t4..+3: one 8-byte load of the
// quants (the low nibbles are sub-block 2c, the high ones 2c + 1) and one of the activations.
//
// The KS warps of a tile (1 to 8) take alternate blocks and meet in shared memory (a fixed
// order: the same bits every run); KS 8 gives matrices of few rows (1024 or 4096) enough warps.
// bench_gemv, 8B shapes, 8 rows: 4096x4096 8.5 us (26.9 on the CUDA cores), 1024x4096 5.1
// (9.6), 14336x4096 23.2 (87.3), 4096x14336 22.8 (86.7), 128256x4096 159 (693): 24-35% of HBM,
// bound by the one block each warp holds in flight.
#pragma once
#include <cstdint>

#include "backend/cuda/matmul_kernels.cuh"
#include "backend/cuda/matmul_quant.cuh"
#include "backend/cuda/pdl.cuh"

namespace nt::cuda::detail {

constexpr int kMmaTileRows = 16;

__device__ __forceinline__ void mma_s8_16832(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                             uint32_t a3, uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%10,%10,%10,%10};"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(0));
}

// One Q4_K block of a lane's two weight rows, as loaded.
struct MmaQ4kW {
    uint4 h0, h1;        // headers: d, dmin, scales
    uint2 q0[4], q1[4];  // quants 8t4..8t4+7 of each 32-byte group
};
// The lane's activations of one block: sub-blocks 2c and 2c + 1, elements 8t4..8t4+7.
struct MmaQ4kX {
    uint2 a[4], b[4];
};

__device__ __forceinline__ void mma_q4k_load_w(const uint8_t* w0, const uint8_t* w1, int64_t kb,
                                               int t4, MmaQ4kW& r) {
    const uint8_t* b0 = w0 + kb * 144;
    const uint8_t* b1 = w1 + kb * 144;
    r.h0 = __ldg(reinterpret_cast<const uint4*>(b0));
    r.h1 = __ldg(reinterpret_cast<const uint4*>(b1));
#pragma unroll
    for (int c = 0; c < 4; ++c) {
        r.q0[c] = __ldg(reinterpret_cast<const uint2*>(b0 + 16 + 32 * c + 8 * t4));
        r.q1[c] = __ldg(reinterpret_cast<const uint2*>(b1 + 16 + 32 * c + 8 * t4));
    }
}

__device__ __forceinline__ void mma_q4k_load_x(const int8_t* xr, bool has_x, int64_t kb, int t4,
                                               MmaQ4kX& r) {
    const int8_t* x = xr + kb * 256 + 8 * t4;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
        r.a[c] = has_x ? *reinterpret_cast<const uint2*>(x + 64 * c) : make_uint2(0, 0);
        r.b[c] = has_x ? *reinterpret_cast<const uint2*>(x + 64 * c + 32) : make_uint2(0, 0);
    }
}

// KS warps share a tile (a CTA of WARPS warps covers WARPS / KS tiles); each warp holds the
// next block while it multiplies one. 16 warps a multiprocessor (128 registers). Two blocks
// ahead (168 registers, 12 warps) measured slower on every 8B shape at 4 and 8 rows.
template <int KS, int WARPS>
__global__ void __launch_bounds__(WARPS * 32, 16 / WARPS)
    gemv_q4k_mma(const uint8_t* __restrict__ w, int64_t rows, int64_t cols,
                 const int8_t* __restrict__ xq, const float2* __restrict__ xd, int n,
                 float* __restrict__ y) {
    using Q = Quant<GgmlType::Q4_K>;
    constexpr int kTiles = WARPS / KS;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    const int64_t tile = int64_t(blockIdx.x) * kTiles + warp / KS;
    const int kpart = warp % KS;
    const int64_t nb = cols / 256, row_bytes = nb * 144;
    const int64_t r0 = tile * kMmaTileRows + g, r1 = r0 + 8;
    const uint8_t* w0 = w + (r0 < rows ? r0 : rows - 1) * row_bytes;
    const uint8_t* w1 = w + (r1 < rows ? r1 : rows - 1) * row_bytes;
    MmaQ4kW cur;
    if (kpart < nb) mma_q4k_load_w(w0, w1, kpart, t4, cur);
    pdl_wait(xq, xd);
    // Activation row g is B's column g; C's columns are activation rows 2t4 and 2t4 + 1.
    const bool has_x = g < n;
    const int8_t* xr = xq + int64_t(has_x ? g : 0) * cols;
    const int64_t xd_stride = cols / 32;
    const int c0 = 2 * t4, c1 = 2 * t4 + 1;
    const float2* xd0 = xd + int64_t(c0 < n ? c0 : 0) * xd_stride;
    const float2* xd1 = xd + int64_t(c1 < n ? c1 : 0) * xd_stride;

    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    MmaQ4kX x;
    if (kpart < nb) mma_q4k_load_x(xr, has_x, kpart, t4, x);
    for (int64_t kb = kpart; kb < nb; kb += KS) {
        MmaQ4kW next;
        MmaQ4kX x_next;
        if (kb + KS < nb) {
            mma_q4k_load_w(w0, w1, kb + KS, t4, next);
            mma_q4k_load_x(xr, has_x, kb + KS, t4, x_next);
        }
        const uint32_t hw0[4] = {cur.h0.x, cur.h0.y, cur.h0.z, cur.h0.w};
        const uint32_t hw1[4] = {cur.h1.x, cur.h1.y, cur.h1.z, cur.h1.w};
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            constexpr uint32_t M = 0x0F0F0F0Fu;
            int lo[4], hi[4];
            mma_s8_16832(lo, cur.q0[c].x & M, cur.q1[c].x & M, cur.q0[c].y & M, cur.q1[c].y & M,
                         x.a[c].x, x.a[c].y);
            mma_s8_16832(hi, (cur.q0[c].x >> 4) & M, (cur.q1[c].x >> 4) & M,
                         (cur.q0[c].y >> 4) & M, (cur.q1[c].y >> 4) & M, x.b[c].x, x.b[c].y);
            Q::W s0, s1;
            Q::scales_from_header(hw0, c, s0);
            Q::scales_from_header(hw1, c, s1);
            const int64_t sb = kb * 8 + 2 * c;
            const float2 a0 = xd0[sb], b0 = xd0[sb + 1], a1 = xd1[sb], b1 = xd1[sb + 1];
            acc[0] += s0.d1 * a0.x * float(lo[0]) + s0.d2 * b0.x * float(hi[0]) -
                      (s0.m1 * a0.y + s0.m2 * b0.y);
            acc[1] += s0.d1 * a1.x * float(lo[1]) + s0.d2 * b1.x * float(hi[1]) -
                      (s0.m1 * a1.y + s0.m2 * b1.y);
            acc[2] += s1.d1 * a0.x * float(lo[2]) + s1.d2 * b0.x * float(hi[2]) -
                      (s1.m1 * a0.y + s1.m2 * b0.y);
            acc[3] += s1.d1 * a1.x * float(lo[3]) + s1.d2 * b1.x * float(hi[3]) -
                      (s1.m1 * a1.y + s1.m2 * b1.y);
        }
        cur = next;
        x = x_next;
    }
    if constexpr (KS > 1) {
        __shared__ float red[WARPS][4][32];
#pragma unroll
        for (int i = 0; i < 4; ++i) red[warp][i][lane] = acc[i];
        __syncthreads();
        if (kpart != 0) return;
#pragma unroll
        for (int j = 1; j < KS; ++j)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[i] += red[warp + j][i][lane];
    }
    const int64_t rr[2] = {r0, r1};
    const int cc[2] = {c0, c1};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int64_t row = rr[i >> 1];
        const int col = cc[i & 1];
        if (row < rows && col < n) y[int64_t(col) * rows + row] = acc[i];
    }
}

inline void launch_q4k_mma(const void* w, int64_t rows, int64_t cols, const int8_t* xq,
                           const float2* xd, int n, float* y, int ksplit, bool pdl,
                           cudaStream_t stream) {
    const int64_t tiles = (rows + kMmaTileRows - 1) / kMmaTileRows;
    auto go = [&](auto kernel, int ks, int warps) {
        const int tiles_per_cta = warps / ks;
        const dim3 grid(unsigned((tiles + tiles_per_cta - 1) / tiles_per_cta));
        launch_kernel(pdl, kernel, grid, dim3(unsigned(warps * 32)), 0, stream,
                      "gemv (Q4_K, mma)", static_cast<const uint8_t*>(w), rows, cols, xq, xd, n,
                      y);
    };
    switch (ksplit) {
        case 1:
            return go(gemv_q4k_mma<1, 4>, 1, 4);
        case 2:
            return go(gemv_q4k_mma<2, 4>, 2, 4);
        case 4:
            return go(gemv_q4k_mma<4, 4>, 4, 4);
        case 8:
            return go(gemv_q4k_mma<8, 8>, 8, 8);
        default:
            nt::fail("gemv (Q4_K, mma): no kernel for ksplit %d.", ksplit);
    }
}

}  // namespace nt::cuda::detail
