// Tensor-core GEMV for Q4_K, Q6_K and Q8_0 weights at several activation rows
// (GemvKernel::Mma; internal, included by matmul_gemv.cuh).
//
// At 2..8 activation rows the CUDA-core kernels are bound by their dp4a arithmetic, not by the
// weight bytes: 8 rows of an 8B matrix ran at 8-10% of HBM (Q4_K), 7-13% (Q6_K) and 21-30%
// (Q8_0) against 52-92% for one row (bench_gemv). Here a warp multiplies 16 weight rows by all
// (up to 8) activation rows with the integer mma, one per run of elements that share a weight
// scale, and applies the scales to the 16 x 8 integer dot products:
//   Q4_K  mma.m16n8k32 per 32-element sub-block: d * dx * sum(sc * dot) - dmin * dx * sum(m *
//         sum qx) (xd holds (dx, dx * sum qx), from which sum qx comes back exactly; dx is one
//         per block);
//   Q6_K  mma.m16n8k16 per 16-element sub-block on the signed quants (q - 32):
//         d * dx * sum(sc * dot);
//   Q8_0  mma.m16n8k32 per block: d * dx * dot.
// The scales multiply the exact integer sums in double and the outputs stay in double until they
// round to float once, as every GEMV's (Quant<T>::dot says why), so these are the CPU's bits too.
//
// Fragments (PTX ISA, .s8): lane = 4 * g + t4; C c0, c1 (row g, columns 2t4, 2t4 + 1), c2, c3
// (row g + 8). k16: A a0 (row g, k 4t4..+3), a1 (row g + 8); B b0 (k 4t4..+3, column g). k32:
// A a0, a1 as k16, a2 and a3 (k 16 + 4t4..+3); B b0, b1 (k 16 + 4t4..+3). The dot product does
// not care which element sits at which k as long as A and B agree, so each lane takes the
// elements whose bytes are contiguous in the block:
//   Q4_K  lane t4 takes a sub-block's elements 8t4..8t4+7 (k 4t4..+3 and 16 + 4t4..+3): one
//         8-byte load of quants (low nibbles sub-block 2c, high 2c + 1) and one of activations;
//   Q6_K  lane t4 takes a sub-block's elements 4t4..4t4+3: one word of low bits (ql) and one
//         of high bits (qh), each shared by two (ql) or four (qh) sub-blocks;
//   Q8_0  as Q4_K, 8 bytes at 2 + 8t4.
//
// Q6_K's 210-byte and Q8_0's 34-byte blocks are only 2-byte aligned. A lane loads the aligned
// word at or below each of its words (a lane's words, and the four lanes of a row, lie 4 or 16
// bytes apart), takes the next aligned word from the lane that loaded it (one shuffle) and
// shifts the pair; no load reaches past its block.
//
// The KS warps of a tile (1 to 8) take alternate steps (Q4_K, Q6_K: one block; Q8_0: four) and
// meet in shared memory (a fixed order: the same bits every run); KS 8 gives matrices of few
// rows (1024 or 4096) enough warps. bench_gemv, 8B Q4_K shapes, 8 rows: 4096x4096 7.7 us (18.1
// on the CUDA cores), 1024x4096 4.3 (8.9), 14336x4096 19.0 (49.2), 4096x14336 18.1 (53.3),
// 128256x4096 131 (392): 28-51% of HBM. ncu: bound by the instructions of a step and the
// latency of its loads, not by the bytes in flight (a cp.async ring 4 steps deep in shared
// memory halved the load stalls but added instructions and was no faster).
#pragma once
#include <cstdint>

#include "backend/cuda/matmul_kernels.cuh"
#include "backend/cuda/matmul_quant.cuh"
#include "backend/cuda/pdl.cuh"

namespace nt::cuda::detail {

constexpr int kMmaTileRows = 16;

// d = a * b + c (c in every element: 0, or a seed such as kI2dBias).
__device__ __forceinline__ void mma_s8_16832(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                             uint32_t a3, uint32_t b0, uint32_t b1,
                                             uint32_t c = 0) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%10,%10,%10,%10};"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(c));
}
__device__ __forceinline__ void mma_s8_16816(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t b0,
                                             uint32_t c = 0) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
        "{%7,%7,%7,%7};"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a0), "r"(a1), "r"(b0), "r"(c));
}

// d += a * b, a unsigned (u8), b signed (s8): the accumulating form, A as its four registers.
__device__ __forceinline__ void mma_u8s8_16832_acc(int (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                                   uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The aligned word at or below p (p 2-byte aligned) and the shift that, with the next aligned
// word, makes the word at p: __funnelshift_r(lo, hi, sh).
__device__ __forceinline__ uint32_t mma_ld_floor(const uint8_t* p) {
    return __ldg(reinterpret_cast<const uint32_t*>(reinterpret_cast<uintptr_t>(p) & ~uintptr_t(3)));
}
__device__ __forceinline__ uint32_t mma_shift(const uint8_t* p) {
    return uint32_t(reinterpret_cast<uintptr_t>(p) & 2) * 8;
}

// Where a warp's lanes find their data: row g's and row g + 8's weights, activation row g
// (B's column g) and the scales of activation rows 2t4 and 2t4 + 1 (C's columns).
struct MmaLane {
    const uint8_t *w0, *w1;
    const int8_t* xr;
    bool has_x;
    const float2 *xd0, *xd1;
    int lane, t4;
};

// ---- Q4_K: 144-byte blocks (16-byte aligned), one block a step ------------------------------
struct MmaQ4k {
    static constexpr int kBlockElems = 256, kBlockBytes = 144, kBlocksPerStep = 1;
    struct W {
        uint4 h0, h1;        // headers: d, dmin, scales
        uint2 q0[4], q1[4];  // quants 8t4..8t4+7 of each 32-byte group
    };
    struct X {  // sub-blocks 2c and 2c + 1, elements 8t4..8t4+7
        uint2 a[4], b[4];
    };
    __device__ static void load_w(const MmaLane& l, int64_t kb, int64_t /*nb*/, W& r) {
        const uint8_t* b0 = l.w0 + kb * kBlockBytes;
        const uint8_t* b1 = l.w1 + kb * kBlockBytes;
        r.h0 = __ldg(reinterpret_cast<const uint4*>(b0));
        r.h1 = __ldg(reinterpret_cast<const uint4*>(b1));
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            r.q0[c] = __ldg(reinterpret_cast<const uint2*>(b0 + 16 + 32 * c + 8 * l.t4));
            r.q1[c] = __ldg(reinterpret_cast<const uint2*>(b1 + 16 + 32 * c + 8 * l.t4));
        }
    }
    __device__ static void load_x(const MmaLane& l, int64_t kb, int64_t /*nb*/, X& r) {
        const int8_t* x = l.xr + kb * 256 + 8 * l.t4;
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            r.a[c] = l.has_x ? *reinterpret_cast<const uint2*>(x + 64 * c) : make_uint2(0, 0);
            r.b[c] = l.has_x ? *reinterpret_cast<const uint2*>(x + 64 * c + 32) : make_uint2(0, 0);
        }
    }
    // The activations of K-quant weights are Q8_K: one dx for the whole block, so the scaled
    // dot products sum as integers (sc * dot, at most 8 * 63 * 32 * 15 * 127 < 2^31), as the
    // CPU's vec_dot sums them, and meet d * dx once a block; so do the mins (m * sum qx, with
    // sum qx recovered from xd's second half: dx * sum qx rounded to float is within 2^-24 of
    // itself, and |sum qx| <= 32 * 127, so the nearest integer to it / dx is sum qx exactly).
    __device__ static int q8_sum(float dx, float dx_sum) {
        return dx != 0.f ? __float2int_rn(dx_sum / dx) : 0;
    }
    __device__ static void step(const MmaLane& l, const W& w, const X& x, int64_t kb,
                                int64_t /*nb*/, double (&acc)[4]) {
        const uint32_t hw0[4] = {w.h0.x, w.h0.y, w.h0.z, w.h0.w};
        const uint32_t hw1[4] = {w.h1.x, w.h1.y, w.h1.z, w.h1.w};
        int is[4] = {0, 0, 0, 0};
        int ms[4] = {0, 0, 0, 0};
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            constexpr uint32_t M = 0x0F0F0F0Fu;
            int lo[4], hi[4];
            mma_s8_16832(lo, w.q0[c].x & M, w.q1[c].x & M, w.q0[c].y & M, w.q1[c].y & M,
                         x.a[c].x, x.a[c].y);
            mma_s8_16832(hi, (w.q0[c].x >> 4) & M, (w.q1[c].x >> 4) & M, (w.q0[c].y >> 4) & M,
                         (w.q1[c].y >> 4) & M, x.b[c].x, x.b[c].y);
            int sa0, ma0, sb0, mb0, sa1, ma1, sb1, mb1;  // sub-blocks 2c (a), 2c + 1 (b)
            scale_min_k4_words(2 * c, hw0[1], hw0[2], hw0[3], sa0, ma0);
            scale_min_k4_words(2 * c + 1, hw0[1], hw0[2], hw0[3], sb0, mb0);
            scale_min_k4_words(2 * c, hw1[1], hw1[2], hw1[3], sa1, ma1);
            scale_min_k4_words(2 * c + 1, hw1[1], hw1[2], hw1[3], sb1, mb1);
            // (dx, dx * sum qx) of sub-blocks 2c and 2c + 1, C's columns 2t4 (0), 2t4 + 1 (1)
            const float4 s0 = *reinterpret_cast<const float4*>(l.xd0 + kb * 8 + 2 * c);
            const float4 s1 = *reinterpret_cast<const float4*>(l.xd1 + kb * 8 + 2 * c);
            is[0] += sa0 * lo[0] + sb0 * hi[0];
            is[1] += sa0 * lo[1] + sb0 * hi[1];
            is[2] += sa1 * lo[2] + sb1 * hi[2];
            is[3] += sa1 * lo[3] + sb1 * hi[3];
            const int q0a = q8_sum(s0.x, s0.y), q0b = q8_sum(s0.z, s0.w);
            const int q1a = q8_sum(s1.x, s1.y), q1b = q8_sum(s1.z, s1.w);
            ms[0] += ma0 * q0a + mb0 * q0b;
            ms[1] += ma0 * q1a + mb0 * q1b;
            ms[2] += ma1 * q0a + mb1 * q0b;
            ms[3] += ma1 * q1a + mb1 * q1b;
        }
        const double dx[2] = {double(l.xd0[kb * 8].x), double(l.xd1[kb * 8].x)};
        const double d[2] = {double(h2f(hw0[0] & 0xFFFF)), double(h2f(hw1[0] & 0xFFFF))};
        const double m[2] = {double(h2f(hw0[0] >> 16)), double(h2f(hw1[0] >> 16))};
#pragma unroll
        for (int i = 0; i < 4; ++i)
            acc[i] += i2d(is[i]) * (d[i >> 1] * dx[i & 1]) -
                      i2d(ms[i]) * (m[i >> 1] * dx[i & 1]);
    }
};

// ---- Q6_K: 210-byte blocks (2-byte aligned), one block a step -------------------------------
// ql[128] @0, qh[64] @128, scales[16] @192, d @208. Element 128n + 32t + 16s + e (e < 16) is
// the nibble t >> 1 of ql[64n + 32(t & 1) + 16s + e] with bits 2t of qh[32n + 16s + e] above it,
// scale 8n + 2t + s. A lane's 12 words of a row lie 16 bytes apart: ql words m = 4n + 2(t & 1)
// + s, then qh words 8 + 2n + s; the aligned word after the last is the scales' first.
struct MmaQ6k {
    static constexpr int kBlockElems = 256, kBlockBytes = 210, kBlocksPerStep = 1;
    struct W {
        uint32_t q[2][12];  // the aligned words at or below the lane's words, rows g and g + 8
        A2x4 s[2];          // the 16 scales
        uint32_t d[2];
    };
    // The activations are read as each sub-block needs them (element 4t4..4t4+3 of each:
    // 128n + 32t + 16s + 4t4), not a step ahead: 16 more registers a lane would spill.
    struct X {};
    __device__ static void load_w(const MmaLane& l, int64_t kb, int64_t /*nb*/, W& r) {
        const uint8_t* b[2] = {l.w0 + kb * kBlockBytes, l.w1 + kb * kBlockBytes};
#pragma unroll
        for (int i = 0; i < 2; ++i) {
#pragma unroll
            for (int m = 0; m < 12; ++m) r.q[i][m] = mma_ld_floor(b[i] + 16 * m + 4 * l.t4);
            ld_a2x4_raw(b[i] + 192, r.s[i]);
            r.d[i] = ld_u16(b[i] + 208);
        }
    }
    __device__ static void load_x(const MmaLane&, int64_t, int64_t, X&) {}
    __device__ static void step(const MmaLane& l, const W& w, const X&, int64_t kb,
                                int64_t /*nb*/, double (&acc)[4]) {
        // Word m of row i: lane t4's aligned word after it is lane t4 + 1's word m (lane 3:
        // lane 0's word m + 1; after word 11, the scales' first aligned word). Each word is
        // made where it is first used, so that few are held at once.
        const int src = (l.lane & ~3) | ((l.t4 + 1) & 3);
        uint32_t sh[2], sc[2][4];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            sh[i] = mma_shift((i ? l.w1 : l.w0) + kb * kBlockBytes);
            a2x4_words(w.s[i], sc[i]);
        }
        auto word = [&](int i, int m) {
            const uint32_t send = l.t4 != 0 ? w.q[i][m] : m < 11 ? w.q[i][m + 1] : w.s[i].w[0];
            return __funnelshift_r(w.q[i][m], __shfl_sync(0xFFFFFFFFu, send, src), sh[i]);
        };
        const int8_t* x = l.xr + kb * 256 + 4 * l.t4;
        // One dx a block (Q8_K activations): sc * dot sums as integers over the block (at most
        // 16 * 127 * 16 * 32 * 127 < 2^31), as the CPU's vec_dot sums them.
        int is[4] = {0, 0, 0, 0};
#pragma unroll
        for (int n = 0; n < 2; ++n)
#pragma unroll
            for (int s = 0; s < 2; ++s) {
                const uint32_t h[2] = {word(0, 8 + 2 * n + s), word(1, 8 + 2 * n + s)};
#pragma unroll
                for (int tb = 0; tb < 2; ++tb) {
                    const uint32_t ql[2] = {word(0, 4 * n + 2 * tb + s),
                                            word(1, 4 * n + 2 * tb + s)};
#pragma unroll
                    for (int nib = 0; nib < 2; ++nib) {
                        const int t = tb + 2 * nib;
                        const uint32_t a[2] = {q6k_quants4(ql[0], h[0], t),
                                               q6k_quants4(ql[1], h[1], t)};
                        const uint32_t b =
                            l.has_x ? *reinterpret_cast<const uint32_t*>(
                                          x + 128 * n + 32 * t + 16 * s)
                                    : 0u;
                        int dot[4];
                        mma_s8_16816(dot, a[0], a[1], b);
                        // Scale 8n + 2t + s: byte 2(t & 1) + s of word 2n + (t >> 1).
#pragma unroll
                        for (int i = 0; i < 2; ++i) {
                            const int sv = int8_t(uint8_t(
                                sc[i][2 * n + (t >> 1)] >> (16 * (t & 1) + 8 * s)));
                            is[2 * i] += sv * dot[2 * i];
                            is[2 * i + 1] += sv * dot[2 * i + 1];
                        }
                    }
                }
            }
        const double dx[2] = {double(l.xd0[kb * 8].x), double(l.xd1[kb * 8].x)};
#pragma unroll
        for (int i = 0; i < 4; ++i)
            acc[i] += i2d(is[i]) * (double(h2f(w.d[i >> 1])) * dx[i & 1]);
    }
};

// ---- Q8_0: 34-byte blocks (2-byte aligned), four blocks a step -------------------------------
struct MmaQ80 {
    static constexpr int kBlockElems = 32, kBlockBytes = 34, kBlocksPerStep = 4;
    struct W {
        // Per block and row: the aligned words at or below quants 8t4 and 8t4 + 4, lane 3's
        // last two bytes where the quants are not 4-byte aligned, and d.
        uint32_t lo[kBlocksPerStep][2][2], tail[kBlocksPerStep][2], d[kBlocksPerStep][2];
    };
    struct X {
        uint2 v[kBlocksPerStep];
    };
    __device__ static void load_w(const MmaLane& l, int64_t st, int64_t nb, W& r) {
#pragma unroll
        for (int u = 0; u < kBlocksPerStep; ++u) {
            const int64_t kb = st * kBlocksPerStep + u;
            if (kb >= nb) continue;
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const uint8_t* b = (i ? l.w1 : l.w0) + kb * kBlockBytes;
                const uint8_t* p = b + 2 + 8 * l.t4;
                r.lo[u][i][0] = mma_ld_floor(p);
                r.lo[u][i][1] = mma_ld_floor(p + 4);
                r.tail[u][i] = l.t4 == 3 && mma_shift(p) ? ld_u16(b + 32) : 0u;
                r.d[u][i] = ld_u16(b);
            }
        }
    }
    __device__ static void load_x(const MmaLane& l, int64_t st, int64_t nb, X& r) {
#pragma unroll
        for (int u = 0; u < kBlocksPerStep; ++u) {
            const int64_t kb = st * kBlocksPerStep + u;
            r.v[u] = l.has_x && kb < nb
                         ? *reinterpret_cast<const uint2*>(l.xr + kb * 32 + 8 * l.t4)
                         : make_uint2(0, 0);
        }
    }
    __device__ static void step(const MmaLane& l, const W& w, const X& x, int64_t st, int64_t nb,
                                double (&acc)[4]) {
        const int src = (l.lane & ~3) | ((l.t4 + 1) & 3);
#pragma unroll
        for (int u = 0; u < kBlocksPerStep; ++u) {
            const int64_t kb = st * kBlocksPerStep + u;
            if (kb >= nb) break;  // the same for the whole warp
            uint32_t q[2][2];
            float d[2];
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const uint32_t sh = mma_shift((i ? l.w1 : l.w0) + kb * kBlockBytes + 2);
                const uint32_t next = __shfl_sync(0xFFFFFFFFu, w.lo[u][i][0], src);
                const uint32_t hi = l.t4 == 3 ? w.tail[u][i] : next;
                q[i][0] = __funnelshift_r(w.lo[u][i][0], w.lo[u][i][1], sh);
                q[i][1] = __funnelshift_r(w.lo[u][i][1], hi, sh);
                d[i] = h2f(w.d[u][i]);
            }
            int dot[4];
            mma_s8_16832(dot, q[0][0], q[1][0], q[0][1], q[1][1], x.v[u].x, x.v[u].y);
            const double dx[2] = {double(l.xd0[kb].x), double(l.xd1[kb].x)};
#pragma unroll
            for (int i = 0; i < 4; ++i)
                acc[i] += i2d(dot[i]) * (double(d[i >> 1]) * dx[i & 1]);
        }
    }
};

// KS warps share a tile (a CTA of WARPS warps covers WARPS / KS tiles); each warp holds the
// next step while it multiplies one. 16 warps a multiprocessor (128 registers). Two blocks
// ahead (Q4_K: 168 registers, 12 warps) measured slower on every 8B shape at 4 and 8 rows.
// early: the first step's weights are loaded before waiting for the kernel before
// (NT_PDL_PREFETCH=0 waits first).
template <class P, int KS, int WARPS>
__global__ void __launch_bounds__(WARPS * 32, 16 / WARPS)
    gemv_mma(const uint8_t* __restrict__ w, int64_t rows, int64_t cols,
             const int8_t* __restrict__ xq, const float2* __restrict__ xd, int n,
             float* __restrict__ y, bool early) {
    constexpr int kTiles = WARPS / KS;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    const int64_t tile = int64_t(blockIdx.x) * kTiles + warp / KS;
    const int kpart = warp % KS;
    const int64_t nb = cols / P::kBlockElems, row_bytes = nb * P::kBlockBytes;
    const int64_t steps = (nb + P::kBlocksPerStep - 1) / P::kBlocksPerStep;
    const int64_t r0 = tile * kMmaTileRows + g, r1 = r0 + 8;
    MmaLane l;
    l.w0 = w + (r0 < rows ? r0 : rows - 1) * row_bytes;
    l.w1 = w + (r1 < rows ? r1 : rows - 1) * row_bytes;
    l.lane = lane, l.t4 = t4;
    typename P::W cur;
    if (!early) pdl_wait(xq, xd);
    if (kpart < steps) P::load_w(l, kpart, nb, cur);
    if (early) pdl_wait(xq, xd);
    l.has_x = g < n;
    l.xr = xq + int64_t(l.has_x ? g : 0) * cols;
    const int64_t xd_stride = cols / 32;
    const int c0 = 2 * t4, c1 = 2 * t4 + 1;
    l.xd0 = xd + int64_t(c0 < n ? c0 : 0) * xd_stride;
    l.xd1 = xd + int64_t(c1 < n ? c1 : 0) * xd_stride;

    double acc[4] = {0.0, 0.0, 0.0, 0.0};  // in double: see Quant<T>::dot
    typename P::X x;
    if (kpart < steps) P::load_x(l, kpart, nb, x);
    for (int64_t st = kpart; st < steps; st += KS) {
        typename P::W next;
        typename P::X x_next;
        if (st + KS < steps) {
            P::load_w(l, st + KS, nb, next);
            P::load_x(l, st + KS, nb, x_next);
        }
        P::step(l, cur, x, st, nb, acc);
        cur = next;
        x = x_next;
    }
    if constexpr (KS > 1) {
        __shared__ double red[WARPS][4][32];
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
        if (row < rows && col < n) y[int64_t(col) * rows + row] = float(acc[i]);
    }
}

template <class P>
void launch_mma_as(const char* what, const void* w, int64_t rows, int64_t cols, const int8_t* xq,
                   const float2* xd, int n, float* y, int ksplit, bool pdl, cudaStream_t stream) {
    const int64_t tiles = (rows + kMmaTileRows - 1) / kMmaTileRows;
    const bool early = pdl && pdl_prefetch_enabled();
    auto go = [&](auto kernel, int ks, int warps) {
        const int tiles_per_cta = warps / ks;
        const dim3 grid(unsigned((tiles + tiles_per_cta - 1) / tiles_per_cta));
        launch_kernel(pdl, kernel, grid, dim3(unsigned(warps * 32)), 0, stream, what,
                      static_cast<const uint8_t*>(w), rows, cols, xq, xd, n, y, early);
    };
    switch (ksplit) {
        case 1:
            return go(gemv_mma<P, 1, 4>, 1, 4);
        case 2:
            return go(gemv_mma<P, 2, 4>, 2, 4);
        case 4:
            return go(gemv_mma<P, 4, 4>, 4, 4);
        case 8:
            return go(gemv_mma<P, 8, 8>, 8, 8);
        default:
            nt::fail("%s: no kernel for ksplit %d.", what, ksplit);
    }
}

// The types with a tensor-core GEMV, and the blocks of a step (what its warps share out).
constexpr bool mma_compiled(GgmlType t) {
    return t == GgmlType::Q4_K || t == GgmlType::Q6_K || t == GgmlType::Q8_0;
}
constexpr int mma_blocks_per_step(GgmlType t) {
    return t == GgmlType::Q8_0 ? MmaQ80::kBlocksPerStep : 1;
}

template <GgmlType T>
void launch_mma(const void* w, int64_t rows, int64_t cols, const int8_t* xq, const float2* xd,
                int n, float* y, int ksplit, bool pdl, cudaStream_t stream) {
    static_assert(mma_compiled(T));
    if constexpr (T == GgmlType::Q4_K)
        launch_mma_as<MmaQ4k>("gemv (Q4_K, mma)", w, rows, cols, xq, xd, n, y, ksplit, pdl,
                              stream);
    else if constexpr (T == GgmlType::Q6_K)
        launch_mma_as<MmaQ6k>("gemv (Q6_K, mma)", w, rows, cols, xq, xd, n, y, ksplit, pdl,
                              stream);
    else
        launch_mma_as<MmaQ80>("gemv (Q8_0, mma)", w, rows, cols, xq, xd, n, y, ksplit, pdl,
                              stream);
}

}  // namespace nt::cuda::detail
