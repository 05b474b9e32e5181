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
// (mma.sync s8 x s8 -> s32), the scales multiply them in double as Quant<T>::dot does, and each
// output rounds to float once.
//
// Shape. A CTA takes 64 weight rows by 64 activation rows (tokens): 4 warps of 16 weight rows,
// each multiplying its rows by all 64 tokens as 8 tiles of m16n8. A step is 256 elements of
// the row (one K-quant block, or 8 legacy blocks); its weights, its int8 activations and their
// scales go through shared memory by cp.async, 3 steps in flight. Each warp prepares its A
// fragments and scales once a step and reuses them for the 8 token tiles, so the weight-side
// work (unpacking nibbles, 6-bit scales) is shared by 64 tokens; the per-token work is the mma,
// the integer scaling of each sub-block's sum and the double epilogue:
//   Q4_K  mma.m16n8k32 per 32-element sub-block, sum(sc * dot) in int32 over the block; the
//         mins' sum(m * sum qx) by two mma.m16n8k16 on the tensor cores (the 8 mins of a row
//         against each token's 8 sub-block sums, split as 64 * hi + lo to fit int8, in shared
//         memory); d * dx * is - dmin * dx * ms in double once a block;
//   Q6_K  mma.m16n8k16 per 16-element sub-block on q - 32, sum(sc * dot) in int32; d * dx * is;
//   Q8_0  mma.m16n8k32 per block, d * dx * dot in double;
//   Q4_1  mma.m16n8k32 per block, d * dx * dot + m * s (the Q8_1 activations' s) in double.
// These are exactly the GEMV's terms (matmul_gemv_mma.cuh for the first three), in another
// order of double sums: the same floats but for ties.
//
// Fragments as in matmul_gemv_mma.cuh: lane = 4g + t4; C c0, c1 at (row g, tokens 2t4, 2t4 + 1),
// c2, c3 at row g + 8. Activation rows in shared memory are padded (288 or 272 bytes) so that
// the 8 tokens g of a tile read distinct banks.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/cuda_check.cuh"
#include "backend/cuda/matmul_gemv_mma.cuh"
#include "backend/cuda/matmul_kernels.cuh"
#include "backend/cuda/matmul_quant.cuh"
#include "core/error.h"

namespace nt::cuda::detail {

namespace {

constexpr int kMmqWarps = 4;
constexpr int kMmqRows = kMmqWarps * kMmaTileRows;  // 64 weight rows a CTA
constexpr int kMmqTiles = 8;                         // token tiles of 8 a warp
constexpr int kMmqTokens = kMmqTiles * 8;            // 64 tokens a CTA
constexpr int kMmqThreads = kMmqWarps * 32;
constexpr int kStepElems = 256;
constexpr int kXdStride = 80;  // bytes a token in the stage's scales: 8 float2 and 16 of padding

__device__ __forceinline__ void cp_async8(void* smem, const void* gmem, int src_bytes) {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(s), "l"(gmem),
                 "r"(src_bytes)
                 : "memory");
}

__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) {
    return a < b ? a : b;
}

__device__ __forceinline__ uint32_t lds_u32_a2(const uint8_t* p) {  // p 2-byte aligned
    const uint16_t* h = reinterpret_cast<const uint16_t*>(p);
    return uint32_t(h[0]) | (uint32_t(h[1]) << 16);
}

// What every warp reads for one token tile of a step: the activation rows of its 8 tokens (B's
// column g is token 8 * tile + g) and the scales of C's columns (tokens 2t4, 2t4 + 1).
struct MmqTile {
    const int8_t* xr;     // token 8 * tile + g, the step's 256 quants
    const uint8_t* xd0;   // token 8 * tile + 2t4: the step's 8 float2
    const uint8_t* xd1;   // token 8 * tile + 2t4 + 1
    const uint8_t* qmin;  // Q4_K: token 8 * tile + g's 8 sub-block sums, hi then lo
};
__device__ __forceinline__ float2 xd_at(const uint8_t* p, int j) {
    return reinterpret_cast<const float2*>(p)[j];
}

// ---- Q4_K -----------------------------------------------------------------------------------
struct MmqQ4k {
    static constexpr GgmlType kType = GgmlType::Q4_K;
    static constexpr int kStepBytes = 144, kWSlot = 144, kXStride = 288, kMinBytes = 16;
    static constexpr int kMaxOff = 0, kStages = 3;  // 144-byte blocks: rows 16-byte aligned
    static constexpr bool kMins = true;
    struct A {
        uint32_t lo[4][4], hi[4][4];  // sub-blocks 2c (low nibbles) and 2c + 1, rows g, g + 8
        int sc[2][8];
        uint32_t amin[2];  // the mins as m16n8k16's A: lane t4 < 2, mins 4t4..4t4+3
        float d[2], dmin[2];
    };
    __device__ static void prepare(const uint8_t* r0, const uint8_t* r1, int t4, int /*nblk*/,
                                   A& a) {
        const uint8_t* rows[2] = {r0, r1};
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const uint4 h = *reinterpret_cast<const uint4*>(rows[i]);
            a.d[i] = h2f(h.x & 0xFFFF);
            a.dmin[i] = h2f(h.x >> 16);
            int m[8];
#pragma unroll
            for (int j = 0; j < 8; ++j) scale_min_k4_words(j, h.y, h.z, h.w, a.sc[i][j], m[j]);
            const uint32_t m03 = uint32_t(m[0]) | uint32_t(m[1]) << 8 | uint32_t(m[2]) << 16 |
                                 uint32_t(m[3]) << 24;
            const uint32_t m47 = uint32_t(m[4]) | uint32_t(m[5]) << 8 | uint32_t(m[6]) << 16 |
                                 uint32_t(m[7]) << 24;
            a.amin[i] = t4 == 0 ? m03 : t4 == 1 ? m47 : 0u;
        }
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            constexpr uint32_t M = 0x0F0F0F0Fu;
            const uint2 q0 = *reinterpret_cast<const uint2*>(r0 + 16 + 32 * c + 8 * t4);
            const uint2 q1 = *reinterpret_cast<const uint2*>(r1 + 16 + 32 * c + 8 * t4);
            a.lo[c][0] = q0.x & M, a.lo[c][1] = q1.x & M, a.lo[c][2] = q0.y & M,
            a.lo[c][3] = q1.y & M;
            a.hi[c][0] = (q0.x >> 4) & M, a.hi[c][1] = (q1.x >> 4) & M,
            a.hi[c][2] = (q0.y >> 4) & M, a.hi[c][3] = (q1.y >> 4) & M;
        }
    }
    __device__ static void tile(const A& a, const MmqTile& t, int t4, int /*nblk*/,
                                double (&acc)[4]) {
        int is[4] = {0, 0, 0, 0};
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            const uint2 xa = *reinterpret_cast<const uint2*>(t.xr + 64 * c + 8 * t4);
            const uint2 xb = *reinterpret_cast<const uint2*>(t.xr + 64 * c + 32 + 8 * t4);
            int lo[4], hi[4];
            mma_s8_16832(lo, a.lo[c][0], a.lo[c][1], a.lo[c][2], a.lo[c][3], xa.x, xa.y);
            mma_s8_16832(hi, a.hi[c][0], a.hi[c][1], a.hi[c][2], a.hi[c][3], xb.x, xb.y);
#pragma unroll
            for (int i = 0; i < 4; ++i)
                is[i] += a.sc[i >> 1][2 * c] * lo[i] + a.sc[i >> 1][2 * c + 1] * hi[i];
        }
        // sum(m * sum qx) = 64 * sum(m * hi) + sum(m * lo): |sum qx| <= 32 * 127, so hi in
        // -64..63 and lo in 0..63 are int8.
        const uint32_t bh = t4 < 2 ? *reinterpret_cast<const uint32_t*>(t.qmin + 4 * t4) : 0u;
        const uint32_t bl = t4 < 2 ? *reinterpret_cast<const uint32_t*>(t.qmin + 8 + 4 * t4) : 0u;
        int mh[4], ml[4];
        mma_s8_16816(mh, a.amin[0], a.amin[1], bh);
        mma_s8_16816(ml, a.amin[0], a.amin[1], bl);
        const double dx[2] = {double(xd_at(t.xd0, 0).x), double(xd_at(t.xd1, 0).x)};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int ms = 64 * mh[i] + ml[i];
            acc[i] += double(is[i]) * (double(a.d[i >> 1]) * dx[i & 1]) -
                      double(ms) * (double(a.dmin[i >> 1]) * dx[i & 1]);
        }
    }
};

// ---- Q6_K -----------------------------------------------------------------------------------
// ql[128] @0, qh[64] @128, scales[16] @192, d @208; element 128n + 32t + 16s + e is the nibble
// t >> 1 of ql[64n + 32(t & 1) + 16s + e] with bits 2t of qh[32n + 16s + e] above it, scale
// 8n + 2t + s (matmul_gemv_mma.cuh). Lane t4 takes elements 4t4..4t4+3 of each sub-block.
struct MmqQ6k {
    static constexpr GgmlType kType = GgmlType::Q6_K;
    static constexpr int kStepBytes = 210, kWSlot = 224, kXStride = 272, kMinBytes = 0;
    static constexpr int kMaxOff = 14, kStages = 3;
    static constexpr bool kMins = false;
    struct A {
        uint32_t q[16][2];  // sub-block j = 8n + 2t + s, rows g, g + 8: the signed quants
        int sc[2][16];
        float d[2];
    };
    __device__ static void prepare(const uint8_t* r0, const uint8_t* r1, int t4, int /*nblk*/,
                                   A& a) {
        const uint8_t* rows[2] = {r0, r1};
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const uint8_t* b = rows[i];
            a.d[i] = h2f(*reinterpret_cast<const uint16_t*>(b + 208));
#pragma unroll
            for (int w = 0; w < 4; ++w) {
                const uint32_t s = lds_u32_a2(b + 192 + 4 * w);
#pragma unroll
                for (int k = 0; k < 4; ++k) a.sc[i][4 * w + k] = int(int8_t(uint8_t(s >> (8 * k))));
            }
#pragma unroll
            for (int n = 0; n < 2; ++n)
#pragma unroll
                for (int s = 0; s < 2; ++s) {
                    const uint32_t h = lds_u32_a2(b + 128 + 32 * n + 16 * s + 4 * t4);
#pragma unroll
                    for (int tb = 0; tb < 2; ++tb) {
                        const uint32_t ql = lds_u32_a2(b + 64 * n + 32 * tb + 16 * s + 4 * t4);
#pragma unroll
                        for (int nib = 0; nib < 2; ++nib) {
                            const int t = tb + 2 * nib;
                            const uint32_t lo = (ql >> (4 * nib)) & 0x0F0F0F0Fu;
                            const uint32_t hi = (t == 0   ? h << 4
                                                 : t == 1 ? h << 2
                                                 : t == 2 ? h
                                                          : h >> 2) &
                                                0x30303030u;
                            a.q[8 * n + 2 * t + s][i] = sub_bytes(lo | hi, 0x20202020u);
                        }
                    }
                }
        }
    }
    __device__ static void tile(const A& a, const MmqTile& t, int t4, int /*nblk*/,
                                double (&acc)[4]) {
        int is[4] = {0, 0, 0, 0};
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            const int n = j >> 3, tt = (j >> 1) & 3, s = j & 1;
            const uint32_t b =
                *reinterpret_cast<const uint32_t*>(t.xr + 128 * n + 32 * tt + 16 * s + 4 * t4);
            int dot[4];
            mma_s8_16816(dot, a.q[j][0], a.q[j][1], b);
#pragma unroll
            for (int i = 0; i < 4; ++i) is[i] += a.sc[i >> 1][j] * dot[i];
        }
        const double dx[2] = {double(xd_at(t.xd0, 0).x), double(xd_at(t.xd1, 0).x)};
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[i] += double(is[i]) * (double(a.d[i >> 1]) * dx[i & 1]);
    }
};

// ---- Q8_0: eight 34-byte blocks a step ---------------------------------------------------------
struct MmqQ80 {
    static constexpr GgmlType kType = GgmlType::Q8_0;
    static constexpr int kStepBytes = 8 * 34, kWSlot = 288, kXStride = 288, kMinBytes = 0;
    static constexpr int kMaxOff = 14, kStages = 2;  // 3 stages would leave one CTA an SM
    static constexpr bool kMins = false;
    struct A {
        uint32_t q[8][4];  // block u: rows g, g + 8, quants 8t4..8t4+3 and 8t4+4..8t4+7
        float d[8][2];
    };
    __device__ static void prepare(const uint8_t* r0, const uint8_t* r1, int t4, int nblk, A& a) {
        const uint8_t* rows[2] = {r0, r1};
#pragma unroll
        for (int u = 0; u < 8; ++u) {
            if (u >= nblk) break;
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const uint8_t* b = rows[i] + 34 * u;
                a.d[u][i] = h2f(*reinterpret_cast<const uint16_t*>(b));
                a.q[u][i] = lds_u32_a2(b + 2 + 8 * t4);
                a.q[u][2 + i] = lds_u32_a2(b + 6 + 8 * t4);
            }
        }
    }
    __device__ static void tile(const A& a, const MmqTile& t, int t4, int nblk, double (&acc)[4]) {
#pragma unroll
        for (int u = 0; u < 8; ++u) {
            if (u >= nblk) break;
            const uint2 xv = *reinterpret_cast<const uint2*>(t.xr + 32 * u + 8 * t4);
            int dot[4];
            mma_s8_16832(dot, a.q[u][0], a.q[u][1], a.q[u][2], a.q[u][3], xv.x, xv.y);
            const double dx[2] = {double(xd_at(t.xd0, u).x), double(xd_at(t.xd1, u).x)};
#pragma unroll
            for (int i = 0; i < 4; ++i)
                acc[i] += double(dot[i]) * (double(a.d[u][i >> 1]) * dx[i & 1]);
        }
    }
};

// ---- Q4_1: eight 20-byte blocks a step (d, m, 16 bytes of quants: element l is the low nibble
// of byte l, element 16 + l the high one). Lane t4 takes quant byte 4t4..4t4+3: elements
// 4t4..4t4+3 (A's k 4t4..) and 16 + 4t4.. (k 16 + 4t4..), the fragments' own order.
struct MmqQ41 {
    static constexpr GgmlType kType = GgmlType::Q4_1;
    static constexpr int kStepBytes = 8 * 20, kWSlot = 176, kXStride = 272, kMinBytes = 0;
    static constexpr int kMaxOff = 12, kStages = 3;
    static constexpr bool kMins = false;
    struct A {
        uint32_t q[8][2];  // block u: the quant word of rows g, g + 8
        float d[8][2], m[8][2];
    };
    __device__ static void prepare(const uint8_t* r0, const uint8_t* r1, int t4, int nblk, A& a) {
        const uint8_t* rows[2] = {r0, r1};
#pragma unroll
        for (int u = 0; u < 8; ++u) {
            if (u >= nblk) break;
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const uint8_t* b = rows[i] + 20 * u;
                const uint32_t dm = *reinterpret_cast<const uint32_t*>(b);
                a.d[u][i] = h2f(dm & 0xFFFF);
                a.m[u][i] = h2f(dm >> 16);
                a.q[u][i] = *reinterpret_cast<const uint32_t*>(b + 4 + 4 * t4);
            }
        }
    }
    __device__ static void tile(const A& a, const MmqTile& t, int t4, int nblk, double (&acc)[4]) {
#pragma unroll
        for (int u = 0; u < 8; ++u) {
            if (u >= nblk) break;
            constexpr uint32_t M = 0x0F0F0F0Fu;
            const uint32_t b0 = *reinterpret_cast<const uint32_t*>(t.xr + 32 * u + 4 * t4);
            const uint32_t b1 = *reinterpret_cast<const uint32_t*>(t.xr + 32 * u + 16 + 4 * t4);
            int dot[4];
            mma_s8_16832(dot, a.q[u][0] & M, a.q[u][1] & M, (a.q[u][0] >> 4) & M,
                         (a.q[u][1] >> 4) & M, b0, b1);
            const float2 x[2] = {xd_at(t.xd0, u), xd_at(t.xd1, u)};
#pragma unroll
            for (int i = 0; i < 4; ++i)
                acc[i] += double(dot[i]) * (double(a.d[u][i >> 1]) * double(x[i & 1].x)) +
                          double(a.m[u][i >> 1]) * double(x[i & 1].y);
        }
    }
};

template <class P>
struct MmqLayout {
    static constexpr int kWBytes = kMmqRows * P::kWSlot;
    static constexpr int kXBytes = kMmqTokens * P::kXStride;
    static constexpr int kXdBytes = kMmqTokens * kXdStride;
    static constexpr int kMinBytes = kMmqTokens * P::kMinBytes;
    static constexpr int kStage = kWBytes + kXBytes + kXdBytes + kMinBytes;
    static constexpr int kBytes = P::kStages * kStage;
    static_assert(kWBytes % 16 == 0 && kXBytes % 16 == 0 && kXdBytes % 16 == 0);
    // A row's step starts up to kMaxOff bytes above its 16-byte floor.
    static_assert(P::kWSlot % 16 == 0 && P::kWSlot >= P::kStepBytes + P::kMaxOff);
};

// blockIdx.x: token tile (the fastest, so CTAs that share weight rows run together and the
// weights come from L2 after the first), blockIdx.y: row tile.
template <class P>
__global__ void __launch_bounds__(kMmqThreads, 2)
    gemm_mmq(const uint8_t* __restrict__ w, int64_t rows, int64_t cols,
             const int8_t* __restrict__ xq, const float2* __restrict__ xd, int n,
             float* __restrict__ y) {
    using L = MmqLayout<P>;
    extern __shared__ __align__(16) uint8_t smem[];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int64_t row0 = int64_t(blockIdx.y) * kMmqRows;
    const int tok0 = blockIdx.x * kMmqTokens;
    const int64_t blk_elems = P::kType == GgmlType::Q4_K || P::kType == GgmlType::Q6_K ? 256 : 32;
    const int64_t nb = cols / blk_elems;
    const int64_t row_bytes = nb * (P::kType == GgmlType::Q4_K   ? 144
                                    : P::kType == GgmlType::Q6_K ? 210
                                    : P::kType == GgmlType::Q8_0 ? 34
                                                                 : 20);
    const uint8_t* w_end = w + rows * row_bytes;
    const int64_t steps = (cols + kStepElems - 1) / kStepElems;
    const int64_t xd_row = cols / 32;

    // One step's copies into stage s: the weight rows' bytes from their 16-byte aligned floor
    // (the slot keeps the offset), the tokens' quants (zeros past the row) and scales. Rows and
    // tokens past the matrix repeat the last one (their outputs are not stored).
    auto load = [&](int s, int64_t kb) {
        uint8_t* st = smem + s * L::kStage;
        constexpr int kChunks = P::kWSlot / 16;
        for (int i = tid; i < kMmqRows * kChunks; i += kMmqThreads) {
            const int r = i / kChunks, c = i % kChunks;
            const int64_t row = min64(row0 + r, rows - 1);
            const uint8_t* start = w + row * row_bytes + kb * P::kStepBytes;
            const uint8_t* src =
                reinterpret_cast<const uint8_t*>(reinterpret_cast<uintptr_t>(start) & ~uintptr_t(15)) +
                16 * c;
            const int64_t left = w_end - src;
            const int bytes = left >= 16 ? 16 : left > 0 ? int(left) : 0;
            cp_async16(st + r * P::kWSlot + 16 * c, bytes > 0 ? src : w, bytes);
        }
        uint8_t* xs = st + L::kWBytes;
        for (int i = tid; i < kMmqTokens * 16; i += kMmqThreads) {
            const int tk = i >> 4, c = i & 15;
            const int tok = (tok0 + tk < n ? tok0 + tk : n - 1);
            const int64_t col = kb * kStepElems + 16 * c;
            const int64_t left = cols - col;
            const int bytes = left >= 16 ? 16 : left > 0 ? int(left) : 0;
            cp_async16(xs + tk * P::kXStride + 16 * c,
                       bytes > 0 ? xq + int64_t(tok) * cols + col : xq, bytes);
        }
        uint8_t* xds = xs + L::kXBytes;
        for (int i = tid; i < kMmqTokens * 8; i += kMmqThreads) {
            const int tk = i >> 3, j = i & 7;
            const int tok = (tok0 + tk < n ? tok0 + tk : n - 1);
            const int64_t b = kb * 8 + j;
            const bool in = b < xd_row;
            cp_async8(xds + tk * kXdStride + 8 * j, in ? xd + int64_t(tok) * xd_row + b : xd,
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
        const uint8_t* st = smem + int(kb % P::kStages) * L::kStage;
        const int8_t* xs = reinterpret_cast<const int8_t*>(st + L::kWBytes);
        const uint8_t* xds = st + L::kWBytes + L::kXBytes;
        uint8_t* qmin = const_cast<uint8_t*>(xds) + L::kXdBytes;
        if constexpr (P::kMins) {
            // Each token's 8 sub-block sums of quants, as int8 hi (sum >> 6) and lo (sum & 63).
            for (int i = tid; i < kMmqTokens * 8; i += kMmqThreads) {
                const int tk = i >> 3, j = i & 7;
                const uint32_t* q = reinterpret_cast<const uint32_t*>(xs + tk * P::kXStride + 32 * j);
                int s = 0;
#pragma unroll
                for (int k = 0; k < 8; ++k) s = __dp4a(int(q[k]), 0x01010101, s);
                qmin[tk * 16 + j] = uint8_t(int8_t(s >> 6));
                qmin[tk * 16 + 8 + j] = uint8_t(s & 63);
            }
            __syncthreads();
        }
        const int nblk = int(min64(8, nb - kb * 8));  // legacy blocks in this step
        typename P::A a;
        {
            const uint8_t* wr = st + (warp * kMmaTileRows + g) * P::kWSlot;
            const int64_t r_0 = min64(row0 + warp * kMmaTileRows + g, rows - 1);
            const int64_t r_1 = min64(row0 + warp * kMmaTileRows + g + 8, rows - 1);
            const int off0 = int(reinterpret_cast<uintptr_t>(w + r_0 * row_bytes + kb * P::kStepBytes) & 15);
            const int off1 = int(reinterpret_cast<uintptr_t>(w + r_1 * row_bytes + kb * P::kStepBytes) & 15);
            P::prepare(wr + off0, wr + 8 * P::kWSlot + off1, t4, nblk, a);
        }
#pragma unroll
        for (int t = 0; t < kMmqTiles; ++t) {
            MmqTile tl;
            tl.xr = xs + (8 * t + g) * P::kXStride;
            tl.xd0 = xds + (8 * t + 2 * t4) * kXdStride;
            tl.xd1 = tl.xd0 + kXdStride;
            tl.qmin = qmin + (8 * t + g) * 16;
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
void launch_mmq_as(const char* what, const void* w, int64_t rows, int64_t cols, const int8_t* xq,
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
    if (row_tiles > 65535) nt::fail("%s: %lld rows (at most %d).", what, (long long)rows, 65535 * kMmqRows);
    const dim3 grid(unsigned((n + kMmqTokens - 1) / kMmqTokens), unsigned(row_tiles));
    gemm_mmq<P><<<grid, kMmqThreads, L::kBytes, stream>>>(static_cast<const uint8_t*>(w), rows,
                                                          cols, xq, xd, n, y);
    NT_CUDA_CHECK(cudaGetLastError(), what);
}

}  // namespace

bool mmq_supported(GgmlType t) {
    return t == GgmlType::Q4_K || t == GgmlType::Q6_K || t == GgmlType::Q8_0 ||
           t == GgmlType::Q4_1;
}

void gemm_mmq(GgmlType t, const void* w, int64_t rows, int64_t cols, const int8_t* xq,
              const float2* xd, int n, float* y, cudaStream_t stream) {
    if (n <= 0 || rows <= 0) return;
    switch (t) {
        case GgmlType::Q4_K:
            return launch_mmq_as<MmqQ4k>("gemm (Q4_K, mmq)", w, rows, cols, xq, xd, n, y, stream);
        case GgmlType::Q6_K:
            return launch_mmq_as<MmqQ6k>("gemm (Q6_K, mmq)", w, rows, cols, xq, xd, n, y, stream);
        case GgmlType::Q8_0:
            return launch_mmq_as<MmqQ80>("gemm (Q8_0, mmq)", w, rows, cols, xq, xd, n, y, stream);
        case GgmlType::Q4_1:
            return launch_mmq_as<MmqQ41>("gemm (Q4_1, mmq)", w, rows, cols, xq, xd, n, y, stream);
        default:
            nt::fail("gemm (mmq): no kernel for %s.", type_name(t));
    }
}

}  // namespace nt::cuda::detail
