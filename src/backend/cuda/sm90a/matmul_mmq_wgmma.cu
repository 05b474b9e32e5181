// The prompt path's integer GEMM for Q4_K and Q5_K (and, further down, Q6_K and the 32-element
// block types) on Hopper's warpgroup tensor cores (wgmma, sm_90a), fed by the tensor memory
// accelerator (TMA): the same function as matmul_mmq.cu's gemm_mmq, bit for bit, at 1.6 to 1.9
// times its speed (docs/BENCHMARKS.md, thirty-second and thirty-third sessions).
//
// Why not the mma.sync kernel's shape: with 64-row CTAs and 16-byte cp.async copies it is bound
// by L2 (ncu on a wgmma version with that loader, Q4_K 14336 x 4096 x 512: L2 76% busy, issue
// 28%): each 16-byte cp.async is its own L2 request and its own shared-memory wavefront (twice
// the ideal sectors, seven times the ideal wavefronts), and every 64-row CTA reads the
// activations again. Fewer instructions alone (wgmma instead of mma.sync, 944 instead of about
// 1650 a warp step) gained 5%. With the TMA's boxes (a few large requests a step) L2 is 22% busy
// at 128-row CTAs (ncu, Q4_K 4096 x 4096 x 512, H200), so 64-row CTAs can afford to read the
// activations twice as often.
//
// Shape. A CTA is one warpgroup (128 threads) or two and takes R = 64 or 128 weight rows (warp w:
// rows 16w..16w+15; each warpgroup's 64 rows are one wgmma's M) by 64 tokens. One warpgroup
// lets two CTAs share an SM, so that one's epilogue runs beside the other's wgmmas (no
// barrier ties them): Q6_K pp512 +5.8% and Q4_K_M +1.2% on an H100 against two warpgroups a
// CTA. Q8_0's steps are larger, so its CTAs keep 2 steps in flight instead of 3, which lets two
// share an SM too. A step is one 256-element block, 3 steps in flight. Per step:
//   - thread 0 asks the TMA for the step's boxes, counted on the stage's mbarrier: B (the
//     activations) as two boxes of 64 tokens x 128 bytes, which the TMA writes in wgmma's
//     128-byte swizzled K-major layout; the weights as one box of R rows x the step's bytes;
//     each token's first two scales. Boxes past the matrix come zero-filled;
//   - A: each sub-block's 6-bit scale split as sc = 8 sh + sl, and A = sh q, sl q as u8 (below
//     7 * 31, as in matmul_mmq.cu's MmqQ45k), built chunk by chunk in registers from the
//     weights in shared memory; chunk c of the step is sub-block c (32 elements);
//   - two wgmma chains a warpgroup, H = sum(sh q x) and L = sum(sl q x) over the block, in int32
//     accumulators for its 64 x 64 outputs, so is = 8 H + L = sum(sc * dot) exactly;
//   - while they run: the token scales as doubles and each token's sums of quants a sub-block;
//     then the mins term from those sums by mma.sync as in gemm_mmq (mins_mma, after the wait:
//     an mma.sync makes the compiler wait for the wgmmas) and d dx is - dmin dx ms in double
//     once a block (k_block_term), summed over the blocks in order: the same roundings in the
//     same order as gemm_mmq, so the same bits.
// The 32-element block types (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) have a kernel of the same shape
// further down.
#include <cuda.h>  // CUtensorMap and its encoder's types; the encoder comes from the runtime
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/cuda_check.cuh"
#include "backend/cuda/matmul_kernels.cuh"
#include "backend/cuda/matmul_mmq.cuh"
#include "backend/cuda/matmul_quant.cuh"
#include "core/error.h"

namespace nt::cuda::detail {

namespace {

// A CTA takes R weight rows (one warpgroup of 128 threads for each 64) by kWgTokens tokens,
// with (a layout's kStages) steps in flight, kWgStages but where said.
constexpr int kWgTokens = 64, kWgStages = 3;

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ void wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Ties a register to the instructions around it: the compiler sees an accumulator written by an
// asynchronous wgmma as ready at issue, so each is read only through one of these after the wait.
__device__ __forceinline__ void fence_operand(int& r) {
    asm volatile("" : "+r"(r)::"memory");
}
// Orders this thread's (and, after a barrier, the CTA's) shared-memory accesses before its next
// asynchronous-proxy ones (here the TMA's writes into a stage the CTA has just read).
__device__ __forceinline__ void fence_proxy_async_smem() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// d (+)= a * b on a warpgroup: m64n64k32, A (ATYPE: u8 or s8) from registers in
// mma.m16n8k32's fragment layout (warp w's rows 16w..16w+15), B (s8) from shared memory by
// descriptor, int32 accumulators in 8 m16n8 C fragments (d[4j..4j+3]: tokens 8j..8j+7).
// scale_d 0 ignores d's values (the first chunk of a sum).
#define NT_WGMMA_M64N64K32(NAME, ATYPE)                                                           \
    __device__ __forceinline__ void NAME(int(&d)[32], const uint32_t(&a)[4], uint64_t desc,       \
                                         int scale_d) {                                           \
        asm volatile(                                                                             \
            "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                          \
            "wgmma.mma_async.sync.aligned.m64n64k32.s32." ATYPE                                   \
            ".s8 "                                                                                \
            "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, "   \
            "%18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "             \
            "{%32, %33, %34, %35}, %36, p;\n}\n"                                                  \
            : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), \
              "+r"(d[7]), "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]),          \
              "+r"(d[13]), "+r"(d[14]), "+r"(d[15]), "+r"(d[16]), "+r"(d[17]), "+r"(d[18]),       \
              "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]), "+r"(d[24]),       \
              "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]),       \
              "+r"(d[31])                                                                         \
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scale_d)                 \
            : "memory");                                                                          \
    }
NT_WGMMA_M64N64K32(wgmma_u8s8_m64n64k32, "u8")
NT_WGMMA_M64N64K32(wgmma_s8s8_m64n64k32, "s8")
#undef NT_WGMMA_M64N64K32
// A shared-memory matrix descriptor for B as the TMA writes it with 128-byte swizzling: each
// token's 128 bytes of K contiguous, 16-byte chunk j of token t at chunk j ^ (t & 7), 8 tokens
// (1024 bytes, 1024-aligned) a swizzle atom and the next 8 tokens 1024 bytes on (stride byte
// offset); the leading byte offset is unused for K-major swizzled layouts. A chunk of K starts 32c
// bytes into the atom: the swizzle applies to the address bits, so the start may move within a row.
__device__ __forceinline__ uint64_t sw128_desc(uint32_t smem_addr) {
    return uint64_t((smem_addr & 0x3FFFF) >> 4) | uint64_t(1) << 16 | uint64_t(1024 >> 4) << 32 |
           uint64_t(1) << 62;
}
// A 2D box of map at (c0, c1) (bytes along the rows, then rows) into shared memory, counted on
// bar when it lands.
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, int c0, int c1,
                                            uint64_t* bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(smem_u32(dst)),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(smem_u32(bar))
        : "memory");
}
// The same for a 3D box at (c0, c1, c2).
__device__ __forceinline__ void tma_load_3d(void* dst, const CUtensorMap* map, int c0, int c1,
                                            int c2, uint64_t* bar) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(smem_u32(dst)),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(smem_u32(bar))
        : "memory");
}
__device__ __forceinline__ void zero(double (&acc)[8][4]) {
#pragma unroll
    for (int t = 0; t < 8; ++t)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[t][i] = 0.0;
}
// Warp w's rows 16w + g and + 8 by the tile's tokens 8t + 2t4 (+ 1), inside the matrix.
__device__ __forceinline__ void store(const double (&acc)[8][4], int64_t row0, int tok0, int warp,
                                      int g, int t4, int64_t rows, int n, float* y) {
    const int64_t r0 = row0 + 16 * warp + g;
#pragma unroll
    for (int t = 0; t < 8; ++t)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int64_t row = r0 + 8 * (i >> 1);
            const int tok = tok0 + 8 * t + 2 * t4 + (i & 1);
            if (row < rows && tok < n) y[int64_t(tok) * rows + row] = float(acc[t][i]);
        }
}

extern __shared__ __align__(1024) uint8_t wg_smem_raw[];

// What every wgmma kernel's CTA (layout L, R rows) starts from: this thread's place (warp w's
// rows 16w + g and + 8, tokens 2t4 and + 1 of every 8), the tile's first row and token, the
// steps, and shared memory aligned to 1024 (the swizzle atoms) with a stage mbarrier each,
// initialized; then the steps' pipeline, L::kStages steps in flight.
template <class L, int R>
struct WgCta {
    int tid, warp, g, t4, tok0;
    int64_t row0, steps;
    uint8_t* smem;
    uint64_t* bars;
    __device__ explicit WgCta(int64_t cols)
        : tid(int(threadIdx.x)),
          warp(tid >> 5),
          g((tid & 31) >> 2),
          t4(tid & 3),
          tok0(int(blockIdx.x) * kWgTokens),
          row0(int64_t(blockIdx.y) * R),
          steps(cols / kStepElems),
          smem(wg_smem_raw + ((1024 - (smem_u32(wg_smem_raw) & 1023)) & 1023)),
          bars(reinterpret_cast<uint64_t*>(smem + L::kBars)) {
        if (tid == 0) {
            for (int s = 0; s < L::kStages; ++s) mbar_init(bars + s, 1);
            mbar_fence_init();
        }
        __syncthreads();
    }
    // Step kb into stage s, by thread 0: the activations' two boxes, the weights' box
    // (load_w(dst, bar)), the token scales' box, kTx bytes in all. Every thread has finished
    // with the stage (the barrier before each call), and the fence orders their reads before
    // the TMA's writes.
    template <class LoadW>
    __device__ void issue(int s, int64_t kb, const CUtensorMap* tmx, const CUtensorMap* tmd,
                          LoadW load_w) const {
        if (tid != 0) return;
        uint8_t* st = smem + s * L::kStage;
        uint64_t* bar = bars + s;
        fence_proxy_async_smem();
        mbar_expect_tx(bar, L::kTx);
        tma_load_2d(st, tmx, int(kb * kStepElems), tok0, bar);
        tma_load_2d(st + L::kXBox, tmx, int(kb * kStepElems + 128), tok0, bar);
        load_w(st + L::kX, bar);
        tma_load_2d(st + L::kX + L::kW, tmd, int(kb * 64), tok0, bar);
    }
    // The steps before the first into stages 0..kStages - 2 (issue(stage, step)).
    template <class Issue>
    __device__ void issue_first(Issue issue) const {
        for (int s = 0; s < L::kStages - 1; ++s)
            if (s < steps) issue(s, int64_t(s));
    }
    // Step kb's stage, once it has landed; every thread is then done with step kb - 1's stage,
    // into which step kb + kStages - 1 is issued.
    template <class Issue>
    __device__ const uint8_t* next_stage(int64_t kb, Issue issue) const {
        constexpr int S = L::kStages;
        const int s = int(kb % S);
        mbar_wait(bars + s, uint32_t(kb / S) & 1u);
        __syncthreads();
        if (kb + S - 1 < steps) issue(int((kb + S - 1) % S), kb + S - 1);
        return smem + s * L::kStage;
    }
};
template <int N>
__device__ __forceinline__ void zero(int (&a)[N][32]) {
#pragma unroll
    for (int m = 0; m < N; ++m)
#pragma unroll
        for (int i = 0; i < 32; ++i) a[m][i] = 0;
}
#endif  // __CUDA_ARCH_FEAT_SM90_ALL

template <bool Q5>
struct Wg45 {
    static constexpr GgmlType kType = Q5 ? GgmlType::Q5_K : GgmlType::Q4_K;
    static constexpr int kStepBytes = Quant<kType>::kBlockBytes, kQs = Q5 ? 48 : 16;
    static constexpr bool kMins = true;
};

// Shared memory: kStages stages of [B: two boxes of 64 tokens x 128 bytes | the weights' box
// | the token scales' box], 1024-aligned (the swizzle atoms), then the step's token scales as
// doubles, (with mins) each token's sums of quants a sub-block (hi, lo) and a stage's mbarrier
// each.
template <class P, int R>
struct TmaLayout {
    static constexpr int kXBox = kWgTokens * 128;  // 64 tokens x 128 bytes of K
    static constexpr int kX = 2 * kXBox;
    static constexpr int kW = R * P::kStepBytes;
    static constexpr int kXd = kWgTokens * 16;  // the step's first two float2 a token
    static constexpr int kStage = (kX + kW + kXd + 1023) / 1024 * 1024;
    static constexpr int kStages = kWgStages;
    static constexpr int kXdd = kStages * kStage;
    static constexpr int kQmin = kXdd + kWgTokens * 8;
    static constexpr int kBars = kQmin + (P::kMins ? kWgTokens * kQminStride : 0);
    static constexpr int kUsed = kBars + kStages * 8;
    static constexpr int kBytes = kUsed + 1024;  // slack to align the base to 1024
    static constexpr uint32_t kTx = kX + kW + kXd;
    static_assert(kW % 128 == 0 && kQmin % 8 == 0 && kBars % 8 == 0);
};

// tmx: xq as [n][cols] bytes (box 128 x 64, 128-byte swizzle); tmw: W as [rows][row bytes] (box
// a step's bytes x R rows); tmd: xd as [n][cols / 4] bytes (box 16 x 64). Boxes past the
// matrix come zero-filled (their outputs are not stored).
template <bool Q5, int R>
__global__ void __launch_bounds__(2 * R, 128 / R)
    gemm_wgmma_q45k(const __grid_constant__ CUtensorMap tmx,
                    const __grid_constant__ CUtensorMap tmw,
                    const __grid_constant__ CUtensorMap tmd, int64_t rows, int64_t cols, int n,
                    float* __restrict__ y) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using P = Wg45<Q5>;
    using L = TmaLayout<P, R>;
    const WgCta<L, R> cta(cols);
    const int tid = cta.tid, warp = cta.warp, g = cta.g, t4 = cta.t4;
    // Step kb into stage s; the weights as a 2D box.
    auto issue = [&](int s, int64_t kb) {
        cta.issue(s, kb, &tmx, &tmd, [&](uint8_t* dst, uint64_t* bar) {
            tma_load_2d(dst, &tmw, int(kb * P::kStepBytes), int(cta.row0), bar);
        });
    };
    cta.issue_first(issue);

    double acc[8][4];
    zero(acc);
    int h[32], l[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) h[i] = l[i] = 0;
    double* xdd = reinterpret_cast<double*>(cta.smem + L::kXdd);
    uint8_t* qmin = cta.smem + L::kQmin;

    for (int64_t kb = 0; kb < cta.steps; ++kb) {
        const uint8_t* st = cta.next_stage(kb, issue);

        // This lane's rows g and g + 8 of the warp's 16 (warps 0-3 the first warpgroup's 64
        // rows, 4-7 the second's): scales, mins, and the mins as mma.m16n8k16's A (lane
        // t4 < 2: mins 4t4..4t4+3).
        const uint8_t* rw[2] = {st + L::kX + (16 * warp + g) * P::kStepBytes,
                                st + L::kX + (16 * warp + g + 8) * P::kStepBytes};
        uint4 hd[2];
        double d[2], dmin[2];
        uint32_t amin[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            hd[i] = *reinterpret_cast<const uint4*>(rw[i]);
            d[i] = double(h2f(hd[i].x & 0xFFFF));
            dmin[i] = double(h2f(hd[i].x >> 16));
            int m[8], sc;
#pragma unroll
            for (int j = 0; j < 8; ++j) scale_min_k4_words(j, hd[i].y, hd[i].z, hd[i].w, sc, m[j]);
            amin[i] = k4_mins_a(m, t4);
        }
        uint32_t qh[4] = {0, 0, 0, 0};
        if constexpr (Q5) {
#pragma unroll
            for (int k = 0; k < 4; ++k)
                qh[k] = *reinterpret_cast<const uint32_t*>(rw[k & 1] + 16 + 16 * (k >> 1) + 4 * t4);
        }
        const uint32_t xbase = smem_u32(st);
#pragma unroll
        for (int c = 0; c < 8; ++c) {
            constexpr uint32_t M = 0x0F0F0F0Fu, B = 0x01010101u;
            int scv[2], mv;
            scale_min_k4_words(c, hd[0].y, hd[0].z, hd[0].w, scv[0], mv);
            scale_min_k4_words(c, hd[1].y, hd[1].z, hd[1].w, scv[1], mv);
            uint32_t ah[4], al[4];
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const uint32_t q = *reinterpret_cast<const uint32_t*>(
                    rw[k & 1] + P::kQs + 32 * (c >> 1) + 16 * (k >> 1) + 4 * t4);
                uint32_t v = (c & 1 ? q >> 4 : q) & M;
                if constexpr (Q5) v |= ((qh[k] >> c) & B) << 4;
                ah[k] = v * uint32_t(scv[k & 1] >> 3);
                al[k] = v * uint32_t(scv[k & 1] & 7);
            }
            wgmma_fence();
            // Chunk c: bytes 32c.. of every token, in box c >> 2, 32 (c & 3) into each row.
            const uint64_t dc = sw128_desc(xbase + (c >> 2) * L::kXBox + 32 * (c & 3));
            wgmma_u8s8_m64n64k32(h, ah, dc, c);
            wgmma_u8s8_m64n64k32(l, al, dc, c);
        }
        wgmma_commit();

        // While the tensor cores run: the step's token scales as doubles, and each token's sums
        // of quants a sub-block as int8 hi (sum >> 6) and lo (sum & 63) for mins_mma. Token tk's
        // 16-byte chunk j sits in box j >> 3 at chunk (j & 7) ^ (tk & 7) of its row; a
        // quarter-warp reads 8 tokens' chunks, 8 distinct 16-byte bank groups.
        if (tid < kWgTokens)
            xdd[tid] = double(reinterpret_cast<const float2*>(st + L::kX + L::kW)[2 * tid].x);
#pragma unroll
        for (int it = 0; it < kWgTokens * 8 / (2 * R); ++it) {
            const int i = tid + 2 * R * it;
            const int tk = ((i >> 6) << 3) | (i & 7), j = (i >> 3) & 7;
            const uint8_t* row = st + (j >> 2) * L::kXBox + tk * 128;
            const uint4 a = *reinterpret_cast<const uint4*>(row + (((2 * j) & 7) ^ (tk & 7)) * 16);
            const uint4 b =
                *reinterpret_cast<const uint4*>(row + (((2 * j + 1) & 7) ^ (tk & 7)) * 16);
            int sum = 0;
            sum = __dp4a(int(a.x), 0x01010101, sum);
            sum = __dp4a(int(a.y), 0x01010101, sum);
            sum = __dp4a(int(a.z), 0x01010101, sum);
            sum = __dp4a(int(a.w), 0x01010101, sum);
            sum = __dp4a(int(b.x), 0x01010101, sum);
            sum = __dp4a(int(b.y), 0x01010101, sum);
            sum = __dp4a(int(b.z), 0x01010101, sum);
            sum = __dp4a(int(b.w), 0x01010101, sum);
            store_qmin(qmin + tk * kQminStride, j, sum);
        }
        __syncthreads();
        wgmma_wait<0>();
#pragma unroll
        for (int i = 0; i < 32; ++i) {
            fence_operand(h[i]);
            fence_operand(l[i]);
        }
#pragma unroll
        for (int t = 0; t < 8; ++t) {
            MmqTile tl;
            tl.xr = nullptr;
            tl.xd0 = xdd + 8 * t + 2 * t4;
            tl.xd1 = tl.xd0 + 1;
            tl.qmin = qmin + (8 * t + g) * kQminStride;
            uint32_t is[4], ms[4];
#pragma unroll
            for (int i = 0; i < 4; ++i)  // modulo 2^32, biased for i2d_biased
                is[i] = 8u * uint32_t(h[4 * t + i]) + uint32_t(l[4 * t + i]) + kI2dBias;
            mins_mma(amin, tl, t4 < 2, t4, ms);
            k_block_term(d, dmin, is, ms, tl, acc[t]);
        }
    }
    store(acc, cta.row0, cta.tok0, warp, g, t4, rows, n, y);
#else
    __trap();  // launched only on compute capability 9.0, for which this file is built
#endif
}

// ---- Q6_K: ql[128] @0, qh[64] @128, scales[16] (int8) @192, d @208 -------------------------
// Chunk c of a step (elements 32c..32c+31) is half h = c >> 2, quarter j = c & 3: element
// 128h + 32j + l is the nibble j >> 1 of ql[64h + 32(j & 1) + l] with bits 2j, 2j + 1 of
// qh[32h + l] above it, minus 32 (q' in [-32, 31]), in sub-block 2c + (l >= 16) with scale sc
// (int8). sc q' needs 13 bits, so sc is split into three balanced base-8 digits, sc = 64 c2 +
// 8 c1 + c0 with every c in [-3, 4] (c q' in [-128, 124], an int8), and each warpgroup runs
// three wgmma.s8.s8 chains D_m = sum(c_m q' x) over the block (the digits and their products
// are matmul_quant.cuh's q6k_scale_digits and q6k_digit_times): is = 64 D2 + 8 D1 + D0 =
// sum(sc dot) exactly, which meets d dx in double once a block as in gemm_mmq (MmqK16). The
// chunks commit one by one, chunk c's A built while chunk c - 1 runs (the three chains' A for
// all eight chunks at once would not fit in registers beside the accumulators).
struct Wg6 {
    static constexpr GgmlType kType = GgmlType::Q6_K;
    // A step's 210 bytes start 2-byte aligned in a row, and a box must start 16-byte aligned:
    // the box starts at the 16 bytes below (off = 210 kb mod 16 bytes further is the block) and
    // takes kStepBytes = 240 bytes a row, off + 210 and the funnel shifts' last word included
    // (rows 60 words apart put a quarter warp's 8 rows in distinct banks).
    static constexpr int kBlockBytes = Quant<kType>::kBlockBytes, kStepBytes = 240;
    static constexpr bool kMins = false;
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// The word at byte x of a block that starts sh / 8 bytes past the 4-byte aligned p (sh 0 or 16;
// x a multiple of 4).
__device__ __forceinline__ uint32_t ld_shifted(const uint8_t* p, int x, uint32_t sh) {
    return __funnelshift_r(*reinterpret_cast<const uint32_t*>(p + x),
                           *reinterpret_cast<const uint32_t*>(p + x + 4), sh);
}
#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// tmx, tmd as for Q4_K; tmw: W as [rows][row bytes] (box 240 bytes x R rows, starts 16-byte
// aligned).
template <int R>
__global__ void __launch_bounds__(2 * R, 128 / R)
    gemm_wgmma_q6k(const __grid_constant__ CUtensorMap tmx, const __grid_constant__ CUtensorMap tmw,
                   const __grid_constant__ CUtensorMap tmd, int64_t rows, int64_t cols, int n,
                   float* __restrict__ y) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using P = Wg6;
    using L = TmaLayout<P, R>;
    const WgCta<L, R> cta(cols);
    const int tid = cta.tid, warp = cta.warp, g = cta.g, t4 = cta.t4;
    // Step kb into stage s; the weights as a 2D box from the 16 bytes below the block.
    auto issue = [&](int s, int64_t kb) {
        cta.issue(s, kb, &tmx, &tmd, [&](uint8_t* dst, uint64_t* bar) {
            tma_load_2d(dst, &tmw, int(kb * P::kBlockBytes) & ~15, int(cta.row0), bar);
        });
    };
    cta.issue_first(issue);

    double acc[8][4];
    zero(acc);
    int dm[3][32];
    zero(dm);
    double* xdd = reinterpret_cast<double*>(cta.smem + L::kXdd);

    for (int64_t kb = 0; kb < cta.steps; ++kb) {
        const uint8_t* st = cta.next_stage(kb, issue);
        if (tid < kWgTokens)
            xdd[tid] = double(reinterpret_cast<const float2*>(st + L::kX + L::kW)[2 * tid].x);
        // This lane's rows g and g + 8 of the warp's 16, from the 4-byte aligned word at or below
        // each block (the block sh / 8 bytes further): the scales (sub-blocks 4w..4w+3 in word
        // w) and, for chunks c and c + 1, the digits of word c >> 1.
        const int off = int(kb * P::kBlockBytes) & 15;
        const uint32_t sh = 8u * uint32_t(off & 3);
        const uint8_t* rw[2] = {st + L::kX + (16 * warp + g) * P::kStepBytes + (off & ~3),
                                st + L::kX + (16 * warp + g + 8) * P::kStepBytes + (off & ~3)};
        uint32_t sc[2][4];
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
            for (int w = 0; w < 4; ++w) sc[i][w] = ld_shifted(rw[i], 192 + 4 * w, sh);
        const uint32_t xbase = smem_u32(st);
        uint32_t e[2][3];
#pragma unroll
        for (int c = 0; c < 8; ++c) {
            const int h = c >> 2, j = c & 3;
            if ((c & 1) == 0) {
#pragma unroll
                for (int i = 0; i < 2; ++i) {
                    q6k_scale_digits(sc[i][c >> 1], e[i]);
                }
            }
            // a[m][k]: row k & 1, the chunk's elements 16 (k >> 1) + 4t4.. (sub-block
            // 2c + (k >> 1): byte 2 (c & 1) + (k >> 1) of the digits' words).
            uint32_t a[3][4];
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const int x = 16 * (k >> 1) + 4 * t4;
                const uint32_t ql = ld_shifted(rw[k & 1], x + 64 * h + 32 * (j & 1), sh);
                const uint32_t qh = ld_shifted(rw[k & 1], x + 128 + 32 * h, sh);
                const uint32_t u = q6k_quants4_u(ql, qh, j);
                const int byte = 2 * (c & 1) + (k >> 1);
#pragma unroll
                for (int m = 0; m < 3; ++m)
                    a[m][k] = q6k_digit_times((e[k & 1][m] >> (8 * byte)) & 0xFFu, u);
            }
            wgmma_fence();
            const uint64_t dc = sw128_desc(xbase + (c >> 2) * L::kXBox + 32 * (c & 3));
#pragma unroll
            for (int m = 0; m < 3; ++m) wgmma_s8s8_m64n64k32(dm[m], a[m], dc, c);
            wgmma_commit();
            wgmma_wait<1>();  // chunk c - 1 done: its A registers free
        }
        double d[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) d[i] = double(h2f(ld_u16(rw[i] + (off & 3) + 208)));
        __syncthreads();  // xdd written
        wgmma_wait<0>();
#pragma unroll
        for (int m = 0; m < 3; ++m) {
#pragma unroll
            for (int i = 0; i < 32; ++i) fence_operand(dm[m][i]);
        }
        // is * d is exact (at most 26 + 11 bits): one rounding in the fma, as MmqK16's.
#pragma unroll
        for (int t = 0; t < 8; ++t)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const uint32_t is = 64u * uint32_t(dm[2][4 * t + i]) +
                                    8u * uint32_t(dm[1][4 * t + i]) + uint32_t(dm[0][4 * t + i]) +
                                    kI2dBias;
                acc[t][i] =
                    fma(i2d_biased(is) * d[i >> 1], xdd[8 * t + 2 * t4 + (i & 1)], acc[t][i]);
            }
    }
    store(acc, cta.row0, cta.tok0, warp, g, t4, rows, n, y);
#else
    __trap();  // launched only on compute capability 9.0, for which this file is built
#endif
}

// ---- The 32-element block types (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) ------------------------------
// Each chunk of K is one block, with its own scales (a row's d and m, a token's), so every
// chunk's sum meets them in double on its own: a chunk's wgmma into one of two accumulator sets
// while the epilogue of the chunk before takes the other. A is the block's quants (Q8_0) or
// nibbles with the fifth bit (k 4t4.. the low nibbles of bytes 4t4.., 16 + 4t4.. their high
// ones, as matmul_mmq.cu's MmqLegacy4), 2-byte aligned in the blocks. The weights come as a 3D
// box of 16-byte units (Q8_0's 272 bytes a step is more than a box dimension's 256). The terms
// are gemm_mmq's (MmqQ80, MmqLegacy4), in the same order: the same bits.
template <GgmlType T>
struct WgBlocks {
    static constexpr bool kQ8 = T == GgmlType::Q8_0;
    static constexpr bool kMin = T == GgmlType::Q4_1 || T == GgmlType::Q5_1;
    static constexpr bool kQ5 = T == GgmlType::Q5_0 || T == GgmlType::Q5_1;
    static constexpr int kBlockBytes = Quant<T>::kBlockBytes;
    static constexpr int kStepBytes = 8 * kBlockBytes;
    static constexpr int kQs = kQ8 ? 2 : 2 + (kMin ? 2 : 0) + (kQ5 ? 4 : 0);
    static_assert(kStepBytes % 16 == 0);
    // A token's block scales as doubles: dx and (with a min) s, (with an offset) -off * s, or
    // (Q8_0) nothing.
    __device__ static double2 xdd(float2 v) {
        return make_double2(double(v.x), kQ8    ? 0.0
                                         : kMin ? double(v.y)
                                                : -(kQ5 ? 16.0 : 8.0) * double(v.y));
    }
    // Rows g and g + 8's A registers for block c.
    __device__ static void load_a(const uint8_t* const (&rw)[2], int c, int t4, uint32_t (&a)[4]) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const uint8_t* b = rw[i] + kBlockBytes * c;
            if constexpr (kQ8) {
                a[i] = ld_u32_a2(b + kQs + 4 * t4);
                a[2 + i] = ld_u32_a2(b + kQs + 16 + 4 * t4);
            } else {
                const uint32_t q = ld_u32_a2(b + kQs + 4 * t4);
                a[i] = q & 0x0F0F0F0Fu;
                a[2 + i] = (q >> 4) & 0x0F0F0F0Fu;
                if constexpr (kQ5) {
                    const uint32_t qh = ld_u32_a2(b + (kMin ? 4 : 2));
                    a[i] |= spread4_to_bit4((qh >> (4 * t4)) & 0xF);
                    a[2 + i] |= spread4_to_bit4((qh >> (16 + 4 * t4)) & 0xF);
                }
            }
        }
    }
    // acc += the block's term for sum s, the row's d and m, the token's xi.
    __device__ static double term(double acc, int s, double d, double m, double2 xi) {
        if constexpr (kQ8)  // s d is exact (at most 19 + 11 bits): one rounding, in the fma
            return fma(i2d(s) * d, xi.x, acc);
        else if constexpr (kMin)  // d s and m xs exact: each fma rounds once
            return fma(i2d(s) * d, xi.x, fma(m, xi.y, acc));
        else  // dx s and off xs exact
            return fma(d, fma(xi.x, i2d(s), xi.y), acc);
    }
};

// Shared memory: S stages of [B | the weights' box | the token scales' box: 8 float2 a
// token], then the step's token scales as double2 (9 a token: the padding puts the 8 tokens a
// warp reads at once in distinct banks) and a stage's mbarrier each.
template <class P, int R, int S>
struct BlocksLayout {
    static constexpr int kXBox = kWgTokens * 128;
    static constexpr int kX = 2 * kXBox;
    static constexpr int kW = R * P::kStepBytes;
    static constexpr int kXd = kWgTokens * 64;
    static constexpr int kStage = (kX + kW + kXd + 1023) / 1024 * 1024;
    static constexpr int kXddStride = 9;  // double2 a token
    static constexpr int kStages = S;
    static constexpr int kXdd = S * kStage;
    static constexpr int kBars = kXdd + kWgTokens * kXddStride * 16;
    static constexpr int kBytes = kBars + S * 8 + 1024;
    static constexpr uint32_t kTx = kX + kW + kXd;
};

// tmx as for Q4_K; tmw: W as [rows][row bytes / 16][16] (box 16 x a step's units x 128); tmd:
// xd as [n][cols / 4] bytes (box 64 x 64). S stages.
template <GgmlType T, int R, int S>
__global__ void __launch_bounds__(2 * R, 128 / R)
    gemm_wgmma_blocks(const __grid_constant__ CUtensorMap tmx,
                      const __grid_constant__ CUtensorMap tmw,
                      const __grid_constant__ CUtensorMap tmd, int64_t rows, int64_t cols, int n,
                      float* __restrict__ y) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using P = WgBlocks<T>;
    using L = BlocksLayout<P, R, S>;
    const WgCta<L, R> cta(cols);
    const int tid = cta.tid, warp = cta.warp, g = cta.g, t4 = cta.t4;
    // Step kb into stage s; the weights as a 3D box of 16-byte units.
    auto issue = [&](int s, int64_t kb) {
        cta.issue(s, kb, &tmx, &tmd, [&](uint8_t* dst, uint64_t* bar) {
            tma_load_3d(dst, &tmw, 0, int(kb * (P::kStepBytes / 16)), int(cta.row0), bar);
        });
    };
    cta.issue_first(issue);

    double acc[8][4];
    zero(acc);
    int dot[2][32];
    zero(dot);
    double2* xdd = reinterpret_cast<double2*>(cta.smem + L::kXdd);

    for (int64_t kb = 0; kb < cta.steps; ++kb) {
        const uint8_t* st = cta.next_stage(kb, issue);
        const uint8_t* const rw[2] = {st + L::kX + (16 * warp + g) * P::kStepBytes,
                                      st + L::kX + (16 * warp + g + 8) * P::kStepBytes};
        const uint32_t xbase = smem_u32(st);
        // Block c of the step: A from the rows' quants, then its wgmma into dot[c & 1].
        auto issue_chunk = [&](int c) {
            uint32_t a[4];
            P::load_a(rw, c, t4, a);
            wgmma_fence();
            wgmma_s8s8_m64n64k32(dot[c & 1], a,
                                 sw128_desc(xbase + (c >> 2) * L::kXBox + 32 * (c & 3)), 0);
            wgmma_commit();
        };
        issue_chunk(0);
        issue_chunk(1);
        // The step's token scales as doubles, while the first blocks run.
#pragma unroll
        for (int it = 0; it < kWgTokens * 8 / (2 * R); ++it) {
            const int i = tid + 2 * R * it;
            xdd[(i >> 3) * L::kXddStride + (i & 7)] =
                P::xdd(reinterpret_cast<const float2*>(st + L::kX + L::kW)[i]);
        }
        __syncthreads();
#pragma unroll
        for (int c = 0; c < 8; ++c) {
            if (c < 7)
                wgmma_wait<1>();
            else
                wgmma_wait<0>();
            int* dc = dot[c & 1];
#pragma unroll
            for (int i = 0; i < 32; ++i) fence_operand(dc[i]);
            double d[2], m[2];
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const uint8_t* b = rw[i] + P::kBlockBytes * c;
                d[i] = double(h2f(ld_u16(b)));
                m[i] = P::kMin ? double(h2f(ld_u16(b + 2))) : 0.0;
            }
            // The block's terms for the tile's outputs.
#pragma unroll
            for (int t = 0; t < 8; ++t) {
                const double2* xt = xdd + (8 * t + 2 * t4) * L::kXddStride + c;
                const double2 xi[2] = {xt[0], xt[L::kXddStride]};
#pragma unroll
                for (int i = 0; i < 4; ++i)
                    acc[t][i] = P::term(acc[t][i], dc[4 * t + i], d[i >> 1], m[i >> 1], xi[i & 1]);
            }
            if (c + 2 < 8) issue_chunk(c + 2);
        }
    }
    store(acc, cta.row0, cta.tok0, warp, g, t4, rows, n, y);
#else
    __trap();  // launched only on compute capability 9.0, for which this file is built
#endif
}

// cuTensorMapEncodeTiled from the driver, through the runtime (no link against the driver);
// null where the driver has none (the GEMM then stays on mma.sync).
using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                 const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                 const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                 CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
EncodeTiled encode_tiled() {
    static const EncodeTiled fn = [] {
        void* p = nullptr;
        cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                             &q) != cudaSuccess ||
            q != cudaDriverEntryPointSuccess)
            p = nullptr;
        (void)cudaGetLastError();  // a failed query leaves nothing pending
        return reinterpret_cast<EncodeTiled>(p);
    }();
    return fn;
}

// A map over bytes of rank dims.size(): dims innermost first, strides (bytes) of dims 1.., boxes
// of box. A box's start must be 16-byte aligned along dims[0] (an unaligned start is an illegal
// instruction at the copy).
CUtensorMap byte_map(const void* base, std::initializer_list<uint64_t> dims,
                     std::initializer_list<uint64_t> strides, std::initializer_list<uint32_t> box,
                     CUtensorMapSwizzle swizzle) {
    CUtensorMap m;
    cuuint64_t d[3], st[2];
    cuuint32_t bx[3], elem[3] = {1, 1, 1};
    std::copy(dims.begin(), dims.end(), d);
    std::copy(strides.begin(), strides.end(), st);
    std::copy(box.begin(), box.end(), bx);
    const CUresult r = encode_tiled()(
        &m, CU_TENSOR_MAP_DATA_TYPE_UINT8, cuuint32_t(dims.size()), const_cast<void*>(base), d, st,
        bx, elem, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        nt::fail("gemm (wgmma): cuTensorMapEncodeTiled failed (CUresult %d).", int(r));
    return m;
}

// The activations' map, shared by the kernels: xq as [n][cols] bytes, boxes of 64 tokens x 128
// bytes in wgmma's 128-byte swizzled layout.
CUtensorMap x_map(const int8_t* xq, int64_t cols, int n) {
    return byte_map(xq, {uint64_t(cols), uint64_t(n)}, {uint64_t(cols)}, {128, kWgTokens},
                    CU_TENSOR_MAP_SWIZZLE_128B);
}
// The token scales' map: xd as [n][cols / 4] bytes, boxes of `bytes` x 64 tokens.
CUtensorMap xd_map(const float2* xd, int64_t cols, int n, uint32_t bytes) {
    return byte_map(xd, {uint64_t(cols / 4), uint64_t(n)}, {uint64_t(cols / 4)}, {bytes, kWgTokens},
                    CU_TENSOR_MAP_SWIZZLE_NONE);
}

using WgKernel = void (*)(CUtensorMap, CUtensorMap, CUtensorMap, int64_t, int64_t, int, float*);

// Kernel K over the whole matrix, a CTA a tile of R rows by 64 tokens (2R threads), with kBytes
// of shared memory (raised once).
template <WgKernel K, int kBytes, int R>
void launch_tiles(GgmlType t, const CUtensorMap& tmx, const CUtensorMap& tmw,
                  const CUtensorMap& tmd, int64_t rows, int64_t cols, int n, float* y,
                  cudaStream_t stream) {
    static const bool ready = [] {
        NT_CUDA_CHECK(cudaFuncSetAttribute(K, cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes),
                      "cudaFuncSetAttribute (wgmma GEMM shared memory)");
        return true;
    }();
    (void)ready;
    const int64_t row_tiles = (rows + R - 1) / R;
    if (row_tiles > 65535)
        nt::fail("gemm (%s, wgmma): %lld rows (at most %d).", type_name(t), (long long)rows,
                 65535 * R);
    const dim3 grid(unsigned((n + kWgTokens - 1) / kWgTokens), unsigned(row_tiles));
    K<<<grid, 2 * R, kBytes, stream>>>(tmx, tmw, tmd, rows, cols, n, y);
    NT_CUDA_CHECK(cudaGetLastError(), "gemm (wgmma)");
}

// Kernel K of layout P over W as [rows][row bytes] (box a step's bytes x R rows): Q4_K, Q5_K,
// and Q6_K (rows a multiple of 16 bytes, cols a multiple of 2048, for the map's row stride).
template <class P, WgKernel K, int R>
void launch_wgmma_rows(const void* w, int64_t rows, int64_t cols, const int8_t* xq,
                       const float2* xd, int n, float* y, cudaStream_t stream) {
    const uint64_t rb = row_bytes(P::kType, cols);
    const CUtensorMap tmw =
        byte_map(w, {rb, uint64_t(rows)}, {rb}, {uint32_t(P::kStepBytes), uint32_t(R)},
                 CU_TENSOR_MAP_SWIZZLE_NONE);
    launch_tiles<K, TmaLayout<P, R>::kBytes, R>(P::kType, x_map(xq, cols, n), tmw,
                                                xd_map(xd, cols, n, 16), rows, cols, n, y, stream);
}

template <GgmlType T, int R, int S = kWgStages>
void launch_wgmma_blocks(const void* w, int64_t rows, int64_t cols, const int8_t* xq,
                         const float2* xd, int n, float* y, cudaStream_t stream) {
    using P = WgBlocks<T>;
    using L = BlocksLayout<P, R, S>;
    const uint64_t rb = row_bytes(T, cols);  // a multiple of 16: whole steps
    const CUtensorMap tmx = x_map(xq, cols, n), tmd = xd_map(xd, cols, n, 64);
    const CUtensorMap tmw =
        byte_map(w, {16, rb / 16, uint64_t(rows)}, {16, rb},
                 {16, uint32_t(P::kStepBytes / 16), uint32_t(R)}, CU_TENSOR_MAP_SWIZZLE_NONE);
    launch_tiles<gemm_wgmma_blocks<T, R, S>, L::kBytes, R>(T, tmx, tmw, tmd, rows, cols, n, y,
                                                           stream);
}

}  // namespace

bool gemm_mmq_wgmma(GgmlType t, const void* w, int64_t rows, int64_t cols, const int8_t* xq,
                    const float2* xd, int n, float* y, cudaStream_t stream) {
    static const bool sm90 = [] {
        int dev = 0, major = 0, minor = 0;
        NT_CUDA_CHECK(cudaGetDevice(&dev), "cudaGetDevice");
        NT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev),
                      "cudaDeviceGetAttribute");
        NT_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev),
                      "cudaDeviceGetAttribute");
        return major == 9 && minor == 0;
    }();
    const bool k45 = t == GgmlType::Q4_K || t == GgmlType::Q5_K;
    const bool q6 = t == GgmlType::Q6_K && row_bytes(t, cols) % 16 == 0;
    const bool b32 = t == GgmlType::Q8_0 || t == GgmlType::Q4_0 || t == GgmlType::Q4_1 ||
                     t == GgmlType::Q5_0 || t == GgmlType::Q5_1;
    const auto aligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; };
    if (!sm90 || !(k45 || q6 || b32) || cols % kStepElems != 0 || !aligned(w) || !aligned(xq) ||
        !aligned(xd) || !encode_tiled())
        return false;
    if (n <= 0 || rows <= 0) return true;
    switch (t) {  // 64-row CTAs, two an SM (the header says why)
        case GgmlType::Q4_K:
            launch_wgmma_rows<Wg45<false>, gemm_wgmma_q45k<false, 64>, 64>(w, rows, cols, xq, xd, n,
                                                                           y, stream);
            break;
        case GgmlType::Q5_K:
            launch_wgmma_rows<Wg45<true>, gemm_wgmma_q45k<true, 64>, 64>(w, rows, cols, xq, xd, n,
                                                                         y, stream);
            break;
        case GgmlType::Q6_K:
            launch_wgmma_rows<Wg6, gemm_wgmma_q6k<64>, 64>(w, rows, cols, xq, xd, n, y, stream);
            break;
        case GgmlType::Q8_0:  // 2 stages, so that two CTAs fit an SM's shared memory (84 KB
            // each; 3 stages take 124 KB: one CTA an SM, 14% slower than 128-row CTAs, which
            // were 3% slower than these: ffn_up 392 against 379 us, H100, thirty-fourth session)
            launch_wgmma_blocks<GgmlType::Q8_0, 64, 2>(w, rows, cols, xq, xd, n, y, stream);
            break;
        case GgmlType::Q4_0:
            launch_wgmma_blocks<GgmlType::Q4_0, 64>(w, rows, cols, xq, xd, n, y, stream);
            break;
        case GgmlType::Q4_1:
            launch_wgmma_blocks<GgmlType::Q4_1, 64>(w, rows, cols, xq, xd, n, y, stream);
            break;
        case GgmlType::Q5_0:
            launch_wgmma_blocks<GgmlType::Q5_0, 64>(w, rows, cols, xq, xd, n, y, stream);
            break;
        default:
            launch_wgmma_blocks<GgmlType::Q5_1, 64>(w, rows, cols, xq, xd, n, y, stream);
            break;
    }
    return true;
}

}  // namespace nt::cuda::detail
