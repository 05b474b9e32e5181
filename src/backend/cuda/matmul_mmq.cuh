// What the integer GEMM's kernels share (matmul_mmq.cu's mma.sync kernel and the sm_90a
// wgmma kernel in sm90a/): a token tile's view of a step, the K-quants' mins term on the tensor
// cores and the block term in double. Device code only; include from .cu files.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/matmul_gemv_mma.cuh"
#include "backend/cuda/matmul_quant.cuh"

namespace nt::cuda::detail {

constexpr int kStepElems = 256;  // a GEMM step: one K-quant block, or 8 legacy blocks
// Bytes a token in the stage's sums of quants a sub-block (K-quants with mins): 16 hi, 16 lo and
// padding that puts the 8 tokens of a tile in distinct banks.
constexpr int kQminStride = 48;

// What every warp reads for one token tile of a step: the activation rows of its 8 tokens (B's
// column g is token 8 * tile + g) and the scales of C's columns (tokens 2t4, 2t4 + 1).
struct MmqTile {
    const int8_t* xr;     // token 8 * tile + g, the step's 256 quants
    const double* xd0;    // token 8 * tile + 2t4: the step's scales as doubles (P::kXdd)
    const double* xd1;    // token 8 * tile + 2t4 + 1
    const uint8_t* qmin;  // token 8 * tile + g's sums of quants a sub-block: 16 hi then 16 lo
};

// A Q4_K/Q5_K row's 8 mins m as mins_mma's A for lane t4: t4 0 holds mins 0..3, t4 1 mins 4..7,
// a byte each; the other lanes' k are zero.
__device__ __forceinline__ uint32_t k4_mins_a(const int (&m)[8], int t4) {
    const uint32_t m03 =
        uint32_t(m[0]) | uint32_t(m[1]) << 8 | uint32_t(m[2]) << 16 | uint32_t(m[3]) << 24;
    const uint32_t m47 =
        uint32_t(m[4]) | uint32_t(m[5]) << 8 | uint32_t(m[6]) << 16 | uint32_t(m[7]) << 24;
    return t4 == 0 ? m03 : t4 == 1 ? m47 : 0u;
}

// A token's sum of quants for sub-block j as mins_mma's B wants it: int8 hi (sum >> 6) at byte
// j, lo (sum & 63) at byte 16 + j of the token's kQminStride bytes.
__device__ __forceinline__ void store_qmin(uint8_t* token_qmin, int j, int sum) {
    token_qmin[j] = uint8_t(int8_t(sum >> 6));
    token_qmin[16 + j] = uint8_t(sum & 63);
}

// sum over sub-blocks of m * (the token's sum of quants), the K-quants' mins term, on the
// tensor cores (mma.m16n8k16: k = sub-block, lane t4 holds sub-blocks 4t4..4t4+3): a token's
// sums (|s| <= 32 * 127) go as 64 * hi + lo, hi in -64..63 and lo in 0..63, both int8. The
// result is biased by kI2dBias, for i2d_biased.
__device__ __forceinline__ void mins_mma(const uint32_t (&amin)[2], const MmqTile& t, bool live,
                                         int t4, uint32_t (&ms)[4]) {
    const uint32_t* q = reinterpret_cast<const uint32_t*>(t.qmin);
    const uint32_t bh = live ? q[t4] : 0u;
    const uint32_t bl = live ? q[4 + t4] : 0u;
    int mh[4], ml[4];
    mma_s8_16816(mh, amin[0], amin[1], bh);
    mma_s8_16816(ml, amin[0], amin[1], bl, kI2dBias);
#pragma unroll
    for (int i = 0; i < 4; ++i) ms[i] = 64u * uint32_t(mh[i]) + uint32_t(ml[i]);  // mod 2^32
}

// A K-quant block's term with mins, d dx is - dmin dx ms (rows g, g + 8 by tokens 2t4, 2t4 + 1):
// is d and ms dmin are exact in a double (at most 27 + 11 and 21 + 11 bits), so their
// difference rounds once and its product with dx once more, in the fma that adds it. is and ms
// come biased by kI2dBias.
__device__ __forceinline__ void k_block_term(const double (&d)[2], const double (&dmin)[2],
                                             const uint32_t (&is)[4], const uint32_t (&ms)[4],
                                             const MmqTile& t, double (&acc)[4]) {
    const double dx[2] = {t.xd0[0], t.xd1[0]};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const double u = fma(i2d_biased(is[i]), d[i >> 1], -(i2d_biased(ms[i]) * dmin[i >> 1]));
        acc[i] = fma(u, dx[i & 1], acc[i]);
    }
}

}  // namespace nt::cuda::detail
