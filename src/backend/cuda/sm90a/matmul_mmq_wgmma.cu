// The prompt path's integer GEMM for Q4_K and Q5_K on Hopper's warpgroup tensor cores (wgmma,
// sm_90a): the same function as matmul_mmq.cu's gemm_mmq, bit for bit, at a fraction of its
// instructions.
//
// Why: the mma.sync kernel issues about 1650 instructions a warp per step of 16 rows x 64
// tokens x 256 elements (an mma per 16x8x32, its B fragments from shared memory one by one, the
// double epilogue) and is bound by issue and latency, not by any pipe (ncu: issue slots 53% busy,
// tensor pipe 13%). Here one wgmma.m64n64k32 takes a CTA's whole 64 x 64 x 32 chunk with B read
// by the tensor cores straight from shared memory: 16 a step where the mma.sync kernel issues
// 512, asynchronous, so the weights' unpacking, the token sums and the epilogue of the CTA
// beside it run while they do.
//
// Shape. A CTA is one warpgroup (4 warps, 128 threads) and takes 64 weight rows (warp w: rows
// 16w..16w+15, the wgmma's A layout) by 64 tokens. A step is one 256-element block; 3 steps in
// flight through shared memory by cp.async. Per step:
//   - A: each sub-block's 6-bit scale split as sc = 8 sh + sl, and A = sh q, sl q as u8 (below
//     7 * 31, as in matmul_mmq.cu's MmqQ45k), built chunk by chunk from the weights in shared
//     memory into registers; chunk c of the step is sub-block c (32 elements);
//   - two wgmma chains, H = sum(sh q x) and L = sum(sl q x) over the block, each in int32
//     accumulators for the CTA's 64 x 64 outputs, so is = 8 H + L = sum(sc * dot) exactly;
//   - the mins term from each token's sums of quants a sub-block, by mma.sync as in gemm_mmq;
//   - d dx is - dmin dx ms in double once a block (k_block_term), summed over the blocks in
//     order: the same roundings in the same order as gemm_mmq, so the same bits.
// B (the activations) sits in shared memory as wgmma's K-major core matrices without swizzle: 8
// tokens x 16 bytes contiguous (128 bytes), the next 16 bytes of K 128 bytes on (the
// descriptor's leading byte offset) and the next 8 tokens 2048 bytes on (its stride byte
// offset); the cp.async loader writes that layout directly, a quarter-warp 128 contiguous bytes.
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/cuda_check.cuh"
#include "backend/cuda/matmul_kernels.cuh"
#include "backend/cuda/matmul_mmq.cuh"
#include "backend/cuda/matmul_quant.cuh"
#include "core/env.h"
#include "core/error.h"

namespace nt::cuda::detail {

namespace {

constexpr int kWgRows = 64, kWgTokens = 64, kWgThreads = 128;
constexpr int kCorePiece = 128;    // 8 tokens x 16 bytes: one core matrix
constexpr int kCoreGroup = 2048;   // 8 tokens x 256 bytes: a step of 8 tokens

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
// Makes this thread's cp.async writes to shared memory visible to the tensor cores' reads (the
// async proxy).
__device__ __forceinline__ void fence_proxy_async_smem() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// A shared-memory matrix descriptor: K-major, no swizzle, core matrices 128 bytes apart along K
// (leading byte offset) and kCoreGroup apart along the tokens (stride byte offset).
__device__ __forceinline__ uint64_t core_desc(uint32_t smem_addr) {
    return uint64_t((smem_addr & 0x3FFFF) >> 4) | uint64_t(kCorePiece >> 4) << 16 |
           uint64_t(kCoreGroup >> 4) << 32;
}
// d (+)= a * b on a warpgroup: m64n64k32, A (u8) from registers in mma.m16n8k32's fragment
// layout (warp w's rows 16w..16w+15), B (s8) from shared memory by descriptor, int32
// accumulators in 8 m16n8 C fragments (d[4j..4j+3]: tokens 8j..8j+7). scale_d 0 ignores d's
// values (the first chunk of a sum).
__device__ __forceinline__ void wgmma_u8s8_m64n64k32(int (&d)[32], const uint32_t (&a)[4],
                                                     uint64_t desc, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k32.s32.u8.s8 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "{%32, %33, %34, %35}, %36, p;\n}\n"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]), "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]), "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]), "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scale_d)
        : "memory");
}
#endif  // __CUDA_ARCH_FEAT_SM90_ALL

template <bool Q5>
struct Wg45 {
    static constexpr GgmlType kType = Q5 ? GgmlType::Q5_K : GgmlType::Q4_K;
    static constexpr int kStepBytes = Q5 ? 176 : 144, kQs = Q5 ? 48 : 16;
};

// Shared memory: kStages stages of [B: 64 tokens x 256 quants as core matrices | 64 weight
// rows' blocks | 64 token scales (float2)], then the step's token scales as doubles and its sums
// of quants a sub-block (hi, lo), written once a step.
template <class P, int kStages>
struct WgLayout {
    static constexpr int kX = kWgTokens * kStepElems;
    static constexpr int kW = kWgRows * P::kStepBytes;
    static constexpr int kXd = kWgTokens * 8;
    static constexpr int kStage = (kX + kW + kXd + 127) / 128 * 128;
    static constexpr int kXdd = kStages * kStage;
    static constexpr int kQmin = kXdd + kWgTokens * 8;
    static constexpr int kBytes = kQmin + kWgTokens * kQminStride;
    static_assert(P::kStepBytes % 16 == 0);
};

// blockIdx.x: token tile (the fastest: CTAs that share weight rows run together), blockIdx.y:
// row tile.
template <bool Q5, int kWgStages>
__global__ void __launch_bounds__(kWgThreads, 2)
    gemm_wgmma_q45k(const uint8_t* __restrict__ w, int64_t rows, int64_t cols, int64_t row_bytes,
                    const int8_t* __restrict__ xq, const float2* __restrict__ xd, int n,
                    float* __restrict__ y) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using P = Wg45<Q5>;
    using L = WgLayout<P, kWgStages>;
    extern __shared__ __align__(128) uint8_t smem[];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int64_t row0 = int64_t(blockIdx.y) * kWgRows;
    const int tok0 = blockIdx.x * kWgTokens;
    const int64_t steps = cols / kStepElems, xd_row = cols / 32;
    auto token = [&](int tk) { return tok0 + tk < n ? tok0 + tk : n - 1; };

    // Each thread's copies start at the same places every step, kb * (a step's bytes) on. Tokens
    // and rows past the matrix repeat the last one (their outputs are not stored).
    //   B: the stage's 16-byte piece i = tid + 128 it holds token 8 it + (tid & 7), bytes
    //      16 (tid >> 3).. (consecutive threads fill consecutive bytes); where the tile has all
    //      64 tokens, token 8 it + (tid & 7) is 8 it rows past the first;
    //   weights: row tid >> 1, 16-byte pieces (tid & 1) + 2m of its step;
    //   scales: threads below 64, token tid's float2.
    const bool full = tok0 + kWgTokens <= n;
    const int8_t* xsrc = xq + int64_t(token(tid & 7)) * cols + 16 * (tid >> 3);
    const uint8_t* wsrc =
        w + (row0 + (tid >> 1) < rows ? row0 + (tid >> 1) : rows - 1) * row_bytes + 16 * (tid & 1);
    const float2* xdsrc = xd + int64_t(token(tid & (kWgTokens - 1))) * xd_row;
    auto load = [&](int s, int64_t kb) {
        uint8_t* st = smem + s * L::kStage;
        const int8_t* xs = xsrc + kb * kStepElems;
#pragma unroll
        for (int it = 0; it < kWgTokens / 8; ++it) {
            const int8_t* src = full ? xs + int64_t(8 * it) * cols
                                     : xq + int64_t(token(8 * it + (tid & 7))) * cols +
                                           kb * kStepElems + 16 * (tid >> 3);
            cp_async16(st + 16 * (tid + kWgThreads * it), src);
        }
        constexpr int kChunks = P::kStepBytes / 16;
        uint8_t* wd = st + L::kX + (tid >> 1) * P::kStepBytes + 16 * (tid & 1);
        const uint8_t* ws = wsrc + kb * P::kStepBytes;
#pragma unroll
        for (int m = 0; 2 * m + 1 < kChunks + 1; ++m)
            if (2 * m + (tid & 1) < kChunks) cp_async16(wd + 32 * m, ws + 32 * m);
        if (tid < kWgTokens) cp_async8(st + L::kX + L::kW + 8 * tid, xdsrc + kb * 8);
    };

    for (int s = 0; s < kWgStages - 1; ++s) {
        if (s < steps) load(s, s);
        cp_async_commit();
    }
    double acc[8][4];
#pragma unroll
    for (int t = 0; t < 8; ++t)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[t][i] = 0.0;
    int h[32], l[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) h[i] = l[i] = 0;
    double* xdd = reinterpret_cast<double*>(smem + L::kXdd);
    uint8_t* qmin = smem + L::kQmin;

    for (int64_t kb = 0; kb < steps; ++kb) {
        cp_async_wait<kWgStages - 2>();
        fence_proxy_async_smem();
        __syncthreads();
        if (kb + kWgStages - 1 < steps)
            load(int((kb + kWgStages - 1) % kWgStages), kb + kWgStages - 1);
        cp_async_commit();
        const int s = int(kb % kWgStages);
        const uint8_t* st = smem + s * L::kStage;

        // This lane's rows g and g + 8 of the warp's 16: scales, mins, and the mins as
        // mma.m16n8k16's A (lane t4 < 2: mins 4t4..4t4+3).
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
            const uint32_t m03 = uint32_t(m[0]) | uint32_t(m[1]) << 8 | uint32_t(m[2]) << 16 |
                                 uint32_t(m[3]) << 24;
            const uint32_t m47 = uint32_t(m[4]) | uint32_t(m[5]) << 8 | uint32_t(m[6]) << 16 |
                                 uint32_t(m[7]) << 24;
            amin[i] = t4 == 0 ? m03 : t4 == 1 ? m47 : 0u;
        }
        // A's registers: a0 row g, k 4t4..; a1 row g + 8; a2 row g, k 16 + 4t4..; a3 row g + 8.
        uint32_t qh[4] = {0, 0, 0, 0};
        if constexpr (Q5) {
#pragma unroll
            for (int k = 0; k < 4; ++k)
                qh[k] = *reinterpret_cast<const uint32_t*>(rw[k & 1] + 16 + 16 * (k >> 1) + 4 * t4);
        }
        const uint64_t desc = core_desc(smem_u32(st));
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
                // Bytes times a digit below 8 stay below 256: no carry from byte to byte.
                ah[k] = v * uint32_t(scv[k & 1] >> 3);
                al[k] = v * uint32_t(scv[k & 1] & 7);
            }
            wgmma_fence();
            // Chunk c: B's 32 bytes of K from byte 32c of every token, 2 core matrices.
            const uint64_t dc = desc + uint64_t((2 * c * kCorePiece) >> 4);
            wgmma_u8s8_m64n64k32(h, ah, dc, c);
            wgmma_u8s8_m64n64k32(l, al, dc, c);
        }
        wgmma_commit();

        // While the tensor cores run: the step's token scales as doubles, and each token's sums
        // of quants a sub-block as int8 hi (sum >> 6) and lo (sum & 63) for mins_mma. A
        // quarter-warp reads 8 tokens' 16 bytes, 128 contiguous bytes.
        if (tid < kWgTokens)
            xdd[tid] = double(reinterpret_cast<const float2*>(st + L::kX + L::kW)[tid].x);
#pragma unroll
        for (int it = 0; it < kWgTokens * 8 / kWgThreads; ++it) {
            const int i = tid + kWgThreads * it;
            const int tk = ((i >> 6) << 3) | (i & 7), j = (i >> 3) & 7;
            const uint8_t* p = st + (tk >> 3) * kCoreGroup + 2 * j * kCorePiece + (tk & 7) * 16;
            const uint4 a = *reinterpret_cast<const uint4*>(p);
            const uint4 b = *reinterpret_cast<const uint4*>(p + kCorePiece);
            int sum = 0;
            sum = __dp4a(int(a.x), 0x01010101, sum);
            sum = __dp4a(int(a.y), 0x01010101, sum);
            sum = __dp4a(int(a.z), 0x01010101, sum);
            sum = __dp4a(int(a.w), 0x01010101, sum);
            sum = __dp4a(int(b.x), 0x01010101, sum);
            sum = __dp4a(int(b.y), 0x01010101, sum);
            sum = __dp4a(int(b.z), 0x01010101, sum);
            sum = __dp4a(int(b.w), 0x01010101, sum);
            qmin[tk * kQminStride + j] = uint8_t(int8_t(sum >> 6));
            qmin[tk * kQminStride + 16 + j] = uint8_t(sum & 63);
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
    const int64_t r0 = row0 + 16 * warp + g;
#pragma unroll
    for (int t = 0; t < 8; ++t)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int64_t row = r0 + 8 * (i >> 1);
            const int tok = tok0 + 8 * t + 2 * t4 + (i & 1);
            if (row < rows && tok < n) y[int64_t(tok) * rows + row] = float(acc[t][i]);
        }
#else
    __trap();  // launched only on compute capability 9.0, for which this file is built
#endif
}

template <bool Q5, int kStages>
void launch_wgmma_q45k(const void* w, int64_t rows, int64_t cols, const int8_t* xq,
                       const float2* xd, int n, float* y, cudaStream_t stream) {
    using L = WgLayout<Wg45<Q5>, kStages>;
    static const bool ready = [] {
        NT_CUDA_CHECK(cudaFuncSetAttribute(gemm_wgmma_q45k<Q5, kStages>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, L::kBytes),
                      "cudaFuncSetAttribute (wgmma GEMM shared memory)");
        return true;
    }();
    (void)ready;
    const int64_t row_tiles = (rows + kWgRows - 1) / kWgRows;
    if (row_tiles > 65535)
        nt::fail("gemm (%s, wgmma): %lld rows (at most %d).", Q5 ? "Q5_K" : "Q4_K",
                 (long long)rows, 65535 * kWgRows);
    const dim3 grid(unsigned((n + kWgTokens - 1) / kWgTokens), unsigned(row_tiles));
    gemm_wgmma_q45k<Q5, kStages><<<grid, kWgThreads, L::kBytes, stream>>>(
        static_cast<const uint8_t*>(w), rows, cols, int64_t(row_bytes(Wg45<Q5>::kType, cols)), xq,
        xd, n, y);
    NT_CUDA_CHECK(cudaGetLastError(), Q5 ? "gemm (Q5_K, wgmma)" : "gemm (Q4_K, wgmma)");
}

// Steps in flight through shared memory: 3 (about 80 KB a CTA) or, with NT_WGMMA_STAGES=4,
// 4 (Q4_K about 108 KB, two CTAs an SM; Q5_K about 116 KB, one). An A/B knob.
template <bool Q5>
void launch_wgmma_q45k(const void* w, int64_t rows, int64_t cols, const int8_t* xq,
                       const float2* xd, int n, float* y, cudaStream_t stream) {
    static const int stages = env_int("NT_WGMMA_STAGES", 3) == 4 ? 4 : 3;
    if (stages == 4)
        launch_wgmma_q45k<Q5, 4>(w, rows, cols, xq, xd, n, y, stream);
    else
        launch_wgmma_q45k<Q5, 3>(w, rows, cols, xq, xd, n, y, stream);
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
    const auto aligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; };
    if (!sm90 || (t != GgmlType::Q4_K && t != GgmlType::Q5_K) || cols % kStepElems != 0 ||
        !aligned(w) || !aligned(xq) || (reinterpret_cast<uintptr_t>(xd) & 7) != 0)
        return false;
    if (n <= 0 || rows <= 0) return true;
    if (t == GgmlType::Q4_K)
        launch_wgmma_q45k<false>(w, rows, cols, xq, xd, n, y, stream);
    else
        launch_wgmma_q45k<true>(w, rows, cols, xq, xd, n, y, stream);
    return true;
}

}  // namespace nt::cuda::detail
