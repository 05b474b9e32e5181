// The prompt path's GEMM on the integer tensor cores: y[i][r] = sum_c W[r][c] * x[i][c] for
// batches above kGemvMaxBatch, with the CPU's arithmetic, so a prompt's logits are the CPU's bits
// (and the decode path's, whatever the batch).
//
// Why not FP16 and cuBLAS: the GEMM path dequantized the weights to FP16 (every d * sc * q - dmin
// * m rounded to 11 bits) and summed the products in float in cuBLAS's order. Both move outputs
// by a last bit, and with 8-bit activations one such bit anywhere moves the rest of the pass:
// top-1 agreement with the CPU over a 512-token prompt stayed at 95-97.7% for SmolLM2 and the
// K-quants, where the decode path agrees 100%. Here the weights stay quantized and meet the
// activations quantized as the CPU quantizes them (quantize_q8), the integer sums are exact
// (mma.sync s8 x s8 -> s32), the scales multiply them in double, and each output rounds to
// float once: bit-identical to the CPU for SmolLM2 and every quantized type over a 512-token
// prompt (docs/BENCHMARKS.md, "Prompt processing with the CPU's arithmetic").
//
// Shape. A CTA takes 64 weight rows by 64 activation rows (tokens): 4 warps of 16 weight rows,
// each multiplying its rows by all 64 tokens as 8 tiles of m16n8. A step is 256 elements of the
// row (one K-quant block, or 8 legacy blocks); its weights, its int8 activations and their
// scales go through shared memory by cp.async, 3 steps in flight. Each warp prepares its A
// fragments and scales once a step and reuses them for the 8 token tiles, so the weight-side
// work (unpacking nibbles, 6-bit scales) is shared by 64 tokens; the per-token work is the mma,
// the integer scaling of each sub-block's sum and the double epilogue:
//   Q4_K  the 6-bit sub-block scales ride in A as two 3-bit digits (u8 sh * q and sl * q), so
//         four chains of mma.m16n8k32 sum the whole block on the tensor cores and
//         is = 8 sum(sh q x) + sum(sl q x) needs no multiply per sub-block; the mins'
//         sum(m * sum qx) by two mma.m16n8k16 (the 8 mins of a row against each token's 8
//         sub-block sums, split as 64 * hi + lo to fit int8, in shared memory); dx * (is * d -
//         ms * dmin) in double once a block;
//   Q6_K  mma.m16n8k16 per 16-element sub-block on q - 32, sum(sc * dot) in int32; dx * (is * d);
//   Q8_0  mma.m16n8k32 per block, dx * (dot * d) in double;
//   Q4_1  mma.m16n8k32 per block, dx * (dot * d) + m * s (the Q8_1 activations' s) in double.
// These are the GEMV's terms (matmul_gemv_mma.cuh for the first three) with other roundings of
// the same double products (each integer-times-scale product here is exact, each fma rounds
// once) and another order of double sums: the same floats but for ties. The activations'
// scales are converted to double once a step in shared memory and the integer sums by
// i2d_biased (matmul_quant.cuh: the sums start at 2^31, in the mma's accumulator), both off the
// conversion unit, which every tile would otherwise wait on.
//
// Fragments as in matmul_gemv_mma.cuh: lane = 4g + t4; C c0, c1 at (row g, tokens 2t4, 2t4 + 1),
// c2, c3 at row g + 8. Activation rows in shared memory are padded (288 or 272 bytes) so that
// the 8 tokens g of a tile read distinct banks.
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/cuda_check.cuh"
#include "backend/cuda/matmul_gemv_mma.cuh"
#include "backend/cuda/matmul_kernels.cuh"
#include "backend/cuda/matmul_mmq.cuh"
#include "backend/cuda/matmul_quant.cuh"
#include "core/error.h"
#include "core/env.h"

namespace nt::cuda::detail {

namespace {

constexpr int kMmqWarps = 4;
constexpr int kMmqRows = kMmqWarps * kMmaTileRows;  // 64 weight rows a CTA
constexpr int kMmqThreads = kMmqWarps * 32;

// Token tiles of 8 a warp: 64 tokens a CTA, two CTAs an SM (the double accumulators of 8 tiles
// take 64 of about 210 registers). 4 tiles, 32 tokens a CTA and three CTAs an SM, lost by 15-40%
// on the 8B shapes (docs/BENCHMARKS.md, thirty-second session): the weights' unpacking is then
// shared by half as many tokens.
constexpr int kMmqTiles = 8;

__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) {
    return a < b ? a : b;
}

// The K-quants' activations (Q8_K): one scale a 256-element block, the step's first float2.
struct MmqOneScale {
    static constexpr int kXdIn = 1, kXdd = 1;
    __device__ static void xdd(float2 v, int /*j*/, double* out) { out[0] = double(v.x); }
};

// ---- Q4_K and Q5_K: d @0, dmin @2, scales @4, (Q5_K: qh[32] @16,) qs[128] @16 or @48 ---------
// Elements 64c + l (l < 32) are the low nibbles of qs[32c + l] (sub-block 2c), 64c + 32 + l the
// high ones (2c + 1); Q5_K's fifth bit of element 64c + l is bit 2c of qh[l], of 64c + 32 + l
// bit 2c + 1. Lane t4 takes elements 8t4..8t4+7 of each sub-block (k 4t4.. and 16 + 4t4..).
template <bool Q5>
struct MmqQ45k : MmqOneScale {
    static constexpr GgmlType kType = Q5 ? GgmlType::Q5_K : GgmlType::Q4_K;
    static constexpr int kStepBytes = Q5 ? 176 : 144, kWSlot = kStepBytes, kXStride = 288;
    static constexpr int kMaxOff = 0, kStages = 3, kMinSubs = 8;  // blocks 16-byte aligned
    // The sub-block scales ride in A: sc = 8 sh + sl (sh, sl < 8), and A holds sh q and sl q as
    // unsigned bytes (at most 7 * 31 = 217), so the tensor cores sum sh q x and sl q x over the
    // whole block and is = 8 sum(sh q x) + sum(sl q x), the same integer as sum(sc * dot): two
    // mmas a sub-block instead of one mma and an integer multiply-add per C element.
    struct A {
        uint32_t h[2][4][4], l[2][4][4];  // [nibble: sub-block 2c + nibble][c]: sh q, sl q
        uint32_t amin[2];  // the mins as m16n8k16's A: lane t4 < 2, mins 4t4..4t4+3
        double d[2], dmin[2];
    };
    __device__ static void prepare(const uint8_t* r0, const uint8_t* r1, int t4, int /*nblk*/,
                                   A& a) {
        const uint8_t* rows[2] = {r0, r1};
        int sc[2][8];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const uint4 h = *reinterpret_cast<const uint4*>(rows[i]);
            a.d[i] = double(h2f(h.x & 0xFFFF));
            a.dmin[i] = double(h2f(h.x >> 16));
            int m[8];
#pragma unroll
            for (int j = 0; j < 8; ++j) scale_min_k4_words(j, h.y, h.z, h.w, sc[i][j], m[j]);
            a.amin[i] = k4_mins_a(m, t4);
        }
        constexpr int kQs = Q5 ? 48 : 16;
        uint2 qh[2] = {make_uint2(0, 0), make_uint2(0, 0)};
        if constexpr (Q5) {
            qh[0] = *reinterpret_cast<const uint2*>(r0 + 16 + 8 * t4);
            qh[1] = *reinterpret_cast<const uint2*>(r1 + 16 + 8 * t4);
        }
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            constexpr uint32_t M = 0x0F0F0F0Fu, B = 0x01010101u;
            const uint2 q0 = *reinterpret_cast<const uint2*>(r0 + kQs + 32 * c + 8 * t4);
            const uint2 q1 = *reinterpret_cast<const uint2*>(r1 + kQs + 32 * c + 8 * t4);
            const uint32_t w[4] = {q0.x, q1.x, q0.y, q1.y};  // A's a0..a3
            const uint32_t h[4] = {qh[0].x, qh[1].x, qh[0].y, qh[1].y};
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                uint32_t lo = w[k] & M, hi = (w[k] >> 4) & M;
                if constexpr (Q5) {
                    lo |= ((h[k] >> (2 * c)) & B) << 4;
                    hi |= ((h[k] >> (2 * c + 1)) & B) << 4;
                }
                // Bytes times a digit below 8 stay below 256: no carry from byte to byte.
                const int* r = sc[k & 1];  // a0, a2: row g; a1, a3: row g + 8
                a.h[0][c][k] = lo * uint32_t(r[2 * c] >> 3);
                a.l[0][c][k] = lo * uint32_t(r[2 * c] & 7);
                a.h[1][c][k] = hi * uint32_t(r[2 * c + 1] >> 3);
                a.l[1][c][k] = hi * uint32_t(r[2 * c + 1] & 7);
            }
        }
    }
    __device__ static void tile(const A& a, const MmqTile& t, int t4, int /*nblk*/,
                                double (&acc)[4]) {
        // A chain of mmas a digit and nibble: four chains of four, to shorten the waits. One
        // starts at kI2dBias: is comes biased, as k_block_term takes it.
        int h[2][4] = {}, l[2][4] = {};
#pragma unroll
        for (int i = 0; i < 4; ++i) l[1][i] = int(kI2dBias);
#pragma unroll
        for (int c = 0; c < 4; ++c) {
#pragma unroll
            for (int n = 0; n < 2; ++n) {
                const uint2 x = *reinterpret_cast<const uint2*>(t.xr + 64 * c + 32 * n + 8 * t4);
                mma_u8s8_16832_acc(h[n], a.h[n][c], x.x, x.y);
                mma_u8s8_16832_acc(l[n], a.l[n][c], x.x, x.y);
            }
        }
        uint32_t is[4], ms[4];
#pragma unroll
        for (int i = 0; i < 4; ++i)  // modulo 2^32, as the biased sums are
            is[i] = 8u * uint32_t(h[0][i] + h[1][i]) + uint32_t(l[0][i]) + uint32_t(l[1][i]);
        mins_mma(a.amin, t, t4 < 2, t4, ms);
        k_block_term(a.d, a.dmin, is, ms, t, acc);
    }
};

// ---- Q2_K, Q3_K, Q6_K: 16 sub-blocks of 16, sub-block k = 8n + 2j + s is elements 16k.. -------
//   Q2_K  scales[16] @0 (low nibble scale, high min), qs[64] @16, d @80, dmin @82: bits 2j of
//         qs[32n + 16s + l];
//   Q3_K  hmask[32] @0, qs[64] @32, scales[12] @96, d @108: bits 2j of qs[32n + 16s + l], minus
//         4 where bit 4n + j of hmask[16s + l] is clear; signed 6-bit scales;
//   Q6_K  ql[128] @0, qh[64] @128, scales[16] @192, d @208: the nibble j >> 1 of ql[64n +
//         32(j & 1) + 16s + l] with bits 2j of qh[32n + 16s + l] above it, minus 32.
// Lane t4 takes elements 4t4..4t4+3 of each sub-block (mma.m16n8k16's k).
template <GgmlType T>
struct MmqK16 : MmqOneScale {
    static constexpr GgmlType kType = T;
    static constexpr bool kQ2 = T == GgmlType::Q2_K, kQ3 = T == GgmlType::Q3_K;
    static constexpr int kStepBytes = kQ2 ? 84 : kQ3 ? 110 : 210;
    static constexpr int kMaxOff = kQ2 ? 12 : 14;  // Q2_K's blocks are 4-byte aligned
    static constexpr int kWSlot = (kStepBytes + kMaxOff + 15) / 16 * 16, kXStride = 272;
    static constexpr int kStages = 3, kMinSubs = kQ2 ? 16 : 0;
    struct A {
        uint32_t q[16][2];  // sub-block k, rows g, g + 8: the quants as int8
        int sc[2][16];
        uint32_t amin[2];  // Q2_K: mins 4t4..4t4+3 as m16n8k16's A
        double d[2], dmin[2];
    };
    __device__ static void prepare(const uint8_t* r0, const uint8_t* r1, int t4, int /*nblk*/,
                                   A& a) {
        const uint8_t* rows[2] = {r0, r1};
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const uint8_t* b = rows[i];
            if constexpr (kQ2) {
                a.d[i] = double(h2f(ld_u16(b + 80)));
                a.dmin[i] = double(h2f(ld_u16(b + 82)));
#pragma unroll
                for (int w = 0; w < 4; ++w) {
                    const uint32_t s = *reinterpret_cast<const uint32_t*>(b + 4 * w);
#pragma unroll
                    for (int k = 0; k < 4; ++k) a.sc[i][4 * w + k] = int((s >> (8 * k)) & 0xF);
                }
                a.amin[i] = (*reinterpret_cast<const uint32_t*>(b + 4 * t4) >> 4) & 0x0F0F0F0Fu;
#pragma unroll
                for (int n = 0; n < 2; ++n)
#pragma unroll
                    for (int s = 0; s < 2; ++s) {
                        const uint32_t q =
                            *reinterpret_cast<const uint32_t*>(b + 16 + 32 * n + 16 * s + 4 * t4);
#pragma unroll
                        for (int j = 0; j < 4; ++j)
                            a.q[8 * n + 2 * j + s][i] = (q >> (2 * j)) & 0x03030303u;
                    }
            } else if constexpr (kQ3) {
                a.d[i] = double(h2f(ld_u16(b + 108)));
                const uint32_t v0 = ld_u32_a2(b + 96), v1 = ld_u32_a2(b + 100),
                               v2 = ld_u32_a2(b + 104);
#pragma unroll
                for (int k = 0; k < 16; ++k) a.sc[i][k] = scale_q3k_words(k, v0, v1, v2);
#pragma unroll
                for (int s = 0; s < 2; ++s) {
                    const uint32_t hm = ld_u32_a2(b + 16 * s + 4 * t4);
#pragma unroll
                    for (int n = 0; n < 2; ++n) {
                        const uint32_t q = ld_u32_a2(b + 32 + 32 * n + 16 * s + 4 * t4);
#pragma unroll
                        for (int j = 0; j < 4; ++j) {
                            const uint32_t lo = (q >> (2 * j)) & 0x03030303u;
                            const uint32_t neg = ((~hm >> (4 * n + j)) & 0x01010101u) << 2;
                            a.q[8 * n + 2 * j + s][i] = sub_bytes(lo, neg);
                        }
                    }
                }
            } else {
                a.d[i] = double(h2f(ld_u16(b + 208)));
#pragma unroll
                for (int w = 0; w < 4; ++w) {
                    const uint32_t s = ld_u32_a2(b + 192 + 4 * w);
#pragma unroll
                    for (int k = 0; k < 4; ++k)
                        a.sc[i][4 * w + k] = int(int8_t(uint8_t(s >> (8 * k))));
                }
#pragma unroll
                for (int n = 0; n < 2; ++n)
#pragma unroll
                    for (int s = 0; s < 2; ++s) {
                        const uint32_t h = ld_u32_a2(b + 128 + 32 * n + 16 * s + 4 * t4);
#pragma unroll
                        for (int tb = 0; tb < 2; ++tb) {
                            const uint32_t ql = ld_u32_a2(b + 64 * n + 32 * tb + 16 * s + 4 * t4);
#pragma unroll
                            for (int nib = 0; nib < 2; ++nib) {
                                const int j = tb + 2 * nib;
                                a.q[8 * n + 2 * j + s][i] = q6k_quants4(ql, h, j);
                            }
                        }
                    }
            }
        }
    }
    __device__ static void tile(const A& a, const MmqTile& t, int t4, int /*nblk*/,
                                double (&acc)[4]) {
        // is biased, for i2d_biased (summed modulo 2^32)
        uint32_t is[4] = {kI2dBias, kI2dBias, kI2dBias, kI2dBias};
#pragma unroll
        for (int k = 0; k < 16; ++k) {
            const uint32_t b = *reinterpret_cast<const uint32_t*>(t.xr + 16 * k + 4 * t4);
            int dot[4];
            mma_s8_16816(dot, a.q[k][0], a.q[k][1], b);
#pragma unroll
            for (int i = 0; i < 4; ++i) is[i] += uint32_t(a.sc[i >> 1][k] * dot[i]);
        }
        if constexpr (kQ2) {
            uint32_t ms[4];
            mins_mma(a.amin, t, true, t4, ms);
            k_block_term(a.d, a.dmin, is, ms, t, acc);
        } else {
            // is * d is exact (at most 26 + 11 bits); one rounding in the fma.
            const double dx[2] = {t.xd0[0], t.xd1[0]};
#pragma unroll
            for (int i = 0; i < 4; ++i)
                acc[i] = fma(i2d_biased(is[i]) * a.d[i >> 1], dx[i & 1], acc[i]);
        }
    }
};

// ---- Q8_0: eight 34-byte blocks a step ---------------------------------------------------------
struct MmqQ80 {
    static constexpr GgmlType kType = GgmlType::Q8_0;
    static constexpr int kStepBytes = 8 * 34, kWSlot = 288, kXStride = 288;
    static constexpr int kMaxOff = 14, kStages = 2, kMinSubs = 0;  // 3 stages: one CTA an SM
    static constexpr int kXdIn = 8, kXdd = 8;
    struct A {
        uint32_t q[8][4];  // block u: rows g, g + 8, quants 8t4..8t4+3 and 8t4+4..8t4+7
        double d[8][2];
    };
    __device__ static void xdd(float2 v, int j, double* out) { out[j] = double(v.x); }
    __device__ static void prepare(const uint8_t* r0, const uint8_t* r1, int t4, int nblk, A& a) {
        const uint8_t* rows[2] = {r0, r1};
#pragma unroll
        for (int u = 0; u < 8; ++u) {
            if (u >= nblk) break;
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const uint8_t* b = rows[i] + 34 * u;
                a.d[u][i] = double(h2f(ld_u16(b)));
                a.q[u][i] = ld_u32_a2(b + 2 + 8 * t4);
                a.q[u][2 + i] = ld_u32_a2(b + 6 + 8 * t4);
            }
        }
    }
    __device__ static void tile(const A& a, const MmqTile& t, int t4, int nblk, double (&acc)[4]) {
#pragma unroll
        for (int u = 0; u < 8; ++u) {
            if (u >= nblk) break;
            const uint2 xv = *reinterpret_cast<const uint2*>(t.xr + 32 * u + 8 * t4);
            int dot[4];
            mma_s8_16832(dot, a.q[u][0], a.q[u][1], a.q[u][2], a.q[u][3], xv.x, xv.y, kI2dBias);
            // dot * d is exact (at most 19 + 11 bits): one rounding, in the fma.
            const double dx[2] = {t.xd0[u], t.xd1[u]};
#pragma unroll
            for (int i = 0; i < 4; ++i)
                acc[i] = fma(i2d_biased(uint32_t(dot[i])) * a.d[u][i >> 1], dx[i & 1], acc[i]);
        }
    }
};

// ---- Q4_0, Q4_1, Q5_0, Q5_1: eight blocks a step ---------------------------------------------
// d @0, (Q4_1, Q5_1: m @2,) (Q5: qh, 4 bytes,) 16 bytes of quants: element l is the low nibble
// of byte l, element 16 + l the high one (Q5: bit l and bit 16 + l of qh above them). Lane t4
// takes quant bytes 4t4..4t4+3: elements 4t4.. (A's k 4t4..) and 16 + 4t4.. (k 16 + 4t4..),
// the fragments' own order. The terms are Quant<T>::dot's: the unsigned quants' sum with the
// offset (Q4_0: 8, Q5_0: 16) or the min meeting the activations' s (x.d.y).
template <GgmlType T>
struct MmqLegacy4 {
    static constexpr GgmlType kType = T;
    static constexpr bool kMin = T == GgmlType::Q4_1 || T == GgmlType::Q5_1;
    static constexpr bool kQ5 = T == GgmlType::Q5_0 || T == GgmlType::Q5_1;
    static constexpr int kBlockBytes = T == GgmlType::Q4_0   ? 18
                                       : T == GgmlType::Q4_1 ? 20
                                       : T == GgmlType::Q5_0 ? 22
                                                             : 24;
    static constexpr int kQs = 2 + (kMin ? 2 : 0) + (kQ5 ? 4 : 0);  // qh (Q5) right after d (and m)
    static constexpr int kStepBytes = 8 * kBlockBytes;
    static constexpr int kMaxOff = kBlockBytes % 8 == 0 ? 8 : kBlockBytes % 4 == 0 ? 12 : 14;
    static constexpr int kWSlot = (kStepBytes + kMaxOff + 15) / 16 * 16, kXStride = 272;
    static constexpr int kStages = 3, kMinSubs = 0;
    // A block's activation scales as doubles: dx and (with a min) s, or (with an offset) -off * s.
    static constexpr int kXdIn = 8, kXdd = 16;
    struct A {
        uint32_t lo[8][2], hi[8][2];  // block u, rows g, g + 8: elements 4t4.. and 16 + 4t4..
        double d[8][2], m[8][2];
    };
    __device__ static void xdd(float2 v, int j, double* out) {
        out[2 * j] = double(v.x);
        out[2 * j + 1] = kMin ? double(v.y) : -(kQ5 ? 16.0 : 8.0) * double(v.y);
    }
    __device__ static void prepare(const uint8_t* r0, const uint8_t* r1, int t4, int nblk, A& a) {
        const uint8_t* rows[2] = {r0, r1};
#pragma unroll
        for (int u = 0; u < 8; ++u) {
            if (u >= nblk) break;
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const uint8_t* b = rows[i] + kBlockBytes * u;
                a.d[u][i] = double(h2f(ld_u16(b)));
                a.m[u][i] = kMin ? double(h2f(ld_u16(b + 2))) : 0.0;
                const uint32_t q = ld_u32_a2(b + kQs + 4 * t4);
                a.lo[u][i] = q & 0x0F0F0F0Fu;
                a.hi[u][i] = (q >> 4) & 0x0F0F0F0Fu;
                if constexpr (kQ5) {
                    const uint32_t qh = ld_u32_a2(b + (kMin ? 4 : 2));
                    a.lo[u][i] |= spread4_to_bit4((qh >> (4 * t4)) & 0xF);
                    a.hi[u][i] |= spread4_to_bit4((qh >> (16 + 4 * t4)) & 0xF);
                }
            }
        }
    }
    __device__ static void tile(const A& a, const MmqTile& t, int t4, int nblk, double (&acc)[4]) {
#pragma unroll
        for (int u = 0; u < 8; ++u) {
            if (u >= nblk) break;
            const uint32_t b0 = *reinterpret_cast<const uint32_t*>(t.xr + 32 * u + 4 * t4);
            const uint32_t b1 = *reinterpret_cast<const uint32_t*>(t.xr + 32 * u + 16 + 4 * t4);
            int s[4];
            mma_s8_16832(s, a.lo[u][0], a.lo[u][1], a.hi[u][0], a.hi[u][1], b0, b1, kI2dBias);
            // d s and m xs (with a min) are exact, as are dx s and off xs (without): each
            // fma rounds once.
            const double2 x[2] = {reinterpret_cast<const double2*>(t.xd0)[u],
                                  reinterpret_cast<const double2*>(t.xd1)[u]};
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const double d = a.d[u][i >> 1];
                const double2 xi = x[i & 1];
                if constexpr (kMin)
                    acc[i] = fma(i2d_biased(uint32_t(s[i])) * d, xi.x,
                                 fma(a.m[u][i >> 1], xi.y, acc[i]));
                else
                    acc[i] = fma(d, fma(xi.x, i2d_biased(uint32_t(s[i])), xi.y), acc[i]);
            }
        }
    }
};

// Shared memory: P::kStages stages of the weights, the activations' quants and their scales as
// copied (float2), then the current step's scales as doubles and (K-quants with mins) its sums
// of quants, both written from the stage once a step (one buffer: they are rewritten only after
// the next step's barrier, when every warp is done with them).
template <class P>
struct MmqLayout {
    static constexpr int kMmqTokens = 8 * kMmqTiles;
    static constexpr int kWBytes = kMmqRows * P::kWSlot;
    static constexpr int kXBytes = kMmqTokens * P::kXStride;
    // A token's activation scales in the stage: its kXdIn float2, in a slot of at least 16 bytes
    // (8-byte slots for the K-quants' one float2 cost the Q5_K kernel a 4-byte spill in ptxas).
    static constexpr int kXdSlot = P::kXdIn * 8 < 16 ? 16 : P::kXdIn * 8;
    static constexpr int kXdBytes = kMmqTokens * kXdSlot;
    static constexpr int kStage = kWBytes + kXBytes + kXdBytes;
    // Doubles a token: 16 bytes of padding puts the 4 token pairs of a warp in distinct banks.
    static constexpr int kXddStride = P::kXdd == 1 ? 8 : P::kXdd * 8 + 16;
    static constexpr int kXddBytes = kMmqTokens * kXddStride;
    static constexpr int kMinBytes = P::kMinSubs ? kMmqTokens * kQminStride : 0;
    static constexpr int kBytes = P::kStages * kStage + kXddBytes + kMinBytes;
    static_assert(kWBytes % 16 == 0 && kXBytes % 16 == 0 && kXdBytes % 16 == 0);
    // A row's step starts up to kMaxOff bytes above its 16-byte floor.
    static_assert(P::kWSlot % 16 == 0 && P::kWSlot >= P::kStepBytes + P::kMaxOff);
};

// blockIdx.x: token tile (the fastest, so CTAs that share weight rows run together and the
// weights come from L2 after the first), blockIdx.y: row tile.
template <class P>
__global__ void __launch_bounds__(kMmqThreads, 2)
    gemm_mmq(const uint8_t* __restrict__ w, int64_t rows, int64_t cols, int64_t row_bytes,
             const int8_t* __restrict__ xq, const float2* __restrict__ xd, int n,
             float* __restrict__ y) {
    using L = MmqLayout<P>;
    constexpr int kMmqTokens = L::kMmqTokens;
    extern __shared__ __align__(16) uint8_t smem[];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int64_t row0 = int64_t(blockIdx.y) * kMmqRows;
    const int tok0 = blockIdx.x * kMmqTokens;
    const uint8_t* w_end = w + rows * row_bytes;
    const int64_t steps = (cols + kStepElems - 1) / kStepElems;
    const int64_t xd_row = cols / 32;

    // Where weight row r's slot for step kb starts (the 16-byte floor of the step; the slot keeps
    // the offset), and which token fills token slot tk: rows and tokens past the matrix repeat
    // the last one (their outputs are not stored).
    auto row_floor = [&](int r, int64_t kb) {
        const int64_t row = min64(row0 + r, rows - 1);
        const uint8_t* start = w + row * row_bytes + kb * P::kStepBytes;
        return reinterpret_cast<const uint8_t*>(reinterpret_cast<uintptr_t>(start) &
                                                ~uintptr_t(15));
    };
    auto token = [&](int tk) { return tok0 + tk < n ? tok0 + tk : n - 1; };
    // One step's copies into stage s: the weight rows' slots, the tokens' quants (zeros past
    // the row) and scales.
    auto load = [&](int s, int64_t kb) {
        uint8_t* st = smem + s * L::kStage;
        constexpr int kChunks = P::kWSlot / 16;
        for (int i = tid; i < kMmqRows * kChunks; i += kMmqThreads) {
            const int r = i / kChunks, c = i % kChunks;
            const uint8_t* src = row_floor(r, kb) + 16 * c;
            const int64_t left = w_end - src;
            uint8_t* dst = st + r * P::kWSlot + 16 * c;
            if (left >= 16) {
                cp_async16(dst, src);
            } else {
                // The matrix's last bytes (blocks are 2-byte multiples): plain loads, zeros
                // after, so that no copy names a byte past the end (compute-sanitizer flags a
                // short-source cp.async that does).
#pragma unroll
                for (int b = 0; b < 16; b += 2)
                    *reinterpret_cast<uint16_t*>(dst + b) =
                        b < left ? *reinterpret_cast<const uint16_t*>(src + b) : uint16_t(0);
            }
        }
        uint8_t* xs = st + L::kWBytes;
        for (int i = tid; i < kMmqTokens * 16; i += kMmqThreads) {
            const int tk = i >> 4, c = i & 15;
            const int tok = token(tk);
            const int64_t col = kb * kStepElems + 16 * c;
            const int64_t left = cols - col;
            const int bytes = left >= 16 ? 16 : left > 0 ? int(left) : 0;
            cp_async16(xs + tk * P::kXStride + 16 * c,
                       bytes > 0 ? xq + int64_t(tok) * cols + col : xq, bytes);
        }
        uint8_t* xds = xs + L::kXBytes;
        for (int i = tid; i < kMmqTokens * P::kXdIn; i += kMmqThreads) {
            const int tk = i / P::kXdIn, j = i % P::kXdIn;
            const int tok = token(tk);
            const int64_t b = kb * 8 + j;
            const bool in = b < xd_row;
            cp_async8(xds + tk * L::kXdSlot + 8 * j, in ? xd + int64_t(tok) * xd_row + b : xd,
                      in ? 8 : 0);
        }
    };
    for (int s = 0; s < P::kStages - 1; ++s) {
        if (s < steps) load(s, s);
        cp_async_commit();
    }
    double acc[kMmqTiles][4];
#pragma unroll
    for (int t = 0; t < kMmqTiles; ++t)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[t][i] = 0.0;

    for (int64_t kb = 0; kb < steps; ++kb) {
        cp_async_wait<P::kStages - 2>();
        __syncthreads();
        if (kb + P::kStages - 1 < steps)
            load(int((kb + P::kStages - 1) % P::kStages), kb + P::kStages - 1);
        cp_async_commit();
        uint8_t* st = smem + int(kb % P::kStages) * L::kStage;
        const int8_t* xs = reinterpret_cast<const int8_t*>(st + L::kWBytes);
        const float2* xds = reinterpret_cast<const float2*>(st + L::kWBytes + L::kXBytes);
        uint8_t* xdd = smem + P::kStages * L::kStage;
        uint8_t* qmin = xdd + L::kXddBytes;
        // The step's activation scales as doubles, converted once here rather than by every
        // warp for every tile.
        for (int i = tid; i < kMmqTokens * P::kXdIn; i += kMmqThreads)
            P::xdd(xds[i / P::kXdIn * (L::kXdSlot / 8) + i % P::kXdIn], i % P::kXdIn,
                   reinterpret_cast<double*>(xdd + (i / P::kXdIn) * L::kXddStride));
        if constexpr (P::kMinSubs > 0) {
            // Each token's sums of quants a sub-block, as int8 hi (sum >> 6) and lo (sum & 63).
            constexpr int kWords = kStepElems / P::kMinSubs / 4;
            for (int i = tid; i < kMmqTokens * P::kMinSubs; i += kMmqThreads) {
                const int tk = i / P::kMinSubs, j = i % P::kMinSubs;
                const uint32_t* q =
                    reinterpret_cast<const uint32_t*>(xs + tk * P::kXStride + 4 * kWords * j);
                int s = 0;
#pragma unroll
                for (int k = 0; k < kWords; ++k) s = __dp4a(int(q[k]), 0x01010101, s);
                store_qmin(qmin + tk * kQminStride, j, s);
            }
        }
        __syncthreads();
        const int nblk = int(min64(8, (cols - kb * kStepElems) / 32));  // legacy blocks here
        typename P::A a;
        {
            const uint8_t* wr = st + (warp * kMmaTileRows + g) * P::kWSlot;
            const int64_t r_0 = min64(row0 + warp * kMmaTileRows + g, rows - 1);
            const int64_t r_1 = min64(row0 + warp * kMmaTileRows + g + 8, rows - 1);
            const int off0 =
                int(reinterpret_cast<uintptr_t>(w + r_0 * row_bytes + kb * P::kStepBytes) & 15);
            const int off1 =
                int(reinterpret_cast<uintptr_t>(w + r_1 * row_bytes + kb * P::kStepBytes) & 15);
            P::prepare(wr + off0, wr + 8 * P::kWSlot + off1, t4, nblk, a);
        }
#pragma unroll
        for (int t = 0; t < kMmqTiles; ++t) {
            MmqTile tl;
            tl.xr = xs + (8 * t + g) * P::kXStride;
            tl.xd0 = reinterpret_cast<const double*>(xdd + (8 * t + 2 * t4) * L::kXddStride);
            tl.xd1 = reinterpret_cast<const double*>(xdd + (8 * t + 2 * t4 + 1) * L::kXddStride);
            tl.qmin = qmin + (8 * t + g) * kQminStride;
            P::tile(a, tl, t4, nblk, acc[t]);
        }
    }
    const int64_t r0 = row0 + warp * kMmaTileRows + g;
#pragma unroll
    for (int t = 0; t < kMmqTiles; ++t)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int64_t row = r0 + 8 * (i >> 1);
            const int tok = tok0 + 8 * t + 2 * t4 + (i & 1);
            if (row < rows && tok < n) y[int64_t(tok) * rows + row] = float(acc[t][i]);
        }
}

template <class P>
void launch_mmq(const char* what, const void* w, int64_t rows, int64_t cols, const int8_t* xq,
                const float2* xd, int n, float* y, cudaStream_t stream) {
    using L = MmqLayout<P>;
    static const bool ready = [] {
        NT_CUDA_CHECK(cudaFuncSetAttribute(gemm_mmq<P>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           L::kBytes),
                      "cudaFuncSetAttribute (mmq shared memory)");
        return true;
    }();
    (void)ready;
    const int64_t row_tiles = (rows + kMmqRows - 1) / kMmqRows;
    if (row_tiles > 65535)
        nt::fail("%s: %lld rows (at most %d).", what, (long long)rows, 65535 * kMmqRows);
    const dim3 grid(unsigned((n + L::kMmqTokens - 1) / L::kMmqTokens), unsigned(row_tiles));
    gemm_mmq<P><<<grid, kMmqThreads, L::kBytes, stream>>>(static_cast<const uint8_t*>(w), rows,
                                                          cols, int64_t(row_bytes(P::kType, cols)),
                                                          xq, xd, n, y);
    NT_CUDA_CHECK(cudaGetLastError(), what);
}

}  // namespace

// Every quantized weight type (the activation types Q8_1 and Q8_K are not weights).
bool mmq_supported(GgmlType t) {
    const TypeTraits* tr = type_traits(uint32_t(t));
    return tr && tr->weight_type && tr->block_elems > 1;
}

#ifndef NT_HAVE_SM90A
bool gemm_mmq_wgmma(GgmlType, const void*, int64_t, int64_t, const int8_t*, const float2*, int,
                    float*, cudaStream_t) {
    return false;  // this build has no sm_90a code
}
#endif

void gemm_mmq(GgmlType t, const void* w, int64_t rows, int64_t cols, const int8_t* xq,
              const float2* xd, int n, float* y, cudaStream_t stream, MmqKernel kernel) {
    if (n <= 0 || rows <= 0) return;
    // NT_MMQ_WGMMA=0 keeps the mma.sync kernel (an A/B knob; the same bits).
    static const bool wgmma = env_int("NT_MMQ_WGMMA", 1) != 0;
    if (kernel == MmqKernel::Best && wgmma &&
        gemm_mmq_wgmma(t, w, rows, cols, xq, xd, n, y, stream))
        return;
    switch (t) {
#define NT_MMQ_CASE(T, P) \
    case GgmlType::T:     \
        return launch_mmq<P>("gemm (" #T ", mmq)", w, rows, cols, xq, xd, n, y, stream);
        NT_MMQ_CASE(Q4_0, MmqLegacy4<GgmlType::Q4_0>)
        NT_MMQ_CASE(Q4_1, MmqLegacy4<GgmlType::Q4_1>)
        NT_MMQ_CASE(Q5_0, MmqLegacy4<GgmlType::Q5_0>)
        NT_MMQ_CASE(Q5_1, MmqLegacy4<GgmlType::Q5_1>)
        NT_MMQ_CASE(Q8_0, MmqQ80)
        NT_MMQ_CASE(Q2_K, MmqK16<GgmlType::Q2_K>)
        NT_MMQ_CASE(Q3_K, MmqK16<GgmlType::Q3_K>)
        NT_MMQ_CASE(Q4_K, MmqQ45k<false>)
        NT_MMQ_CASE(Q5_K, MmqQ45k<true>)
        NT_MMQ_CASE(Q6_K, MmqK16<GgmlType::Q6_K>)
#undef NT_MMQ_CASE
        default:
            nt::fail("gemm (mmq): no kernel for %s.", type_name(t));
    }
}

}  // namespace nt::cuda::detail
