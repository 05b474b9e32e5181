// "Stream" GEMV kernel for quantized weights and int8 activations (internal; included by
// matmul_gemv.cuh, instantiated with it in matmul_gemv_*.cu). Built for HBM bandwidth:
//
//  - A CTA of 8 warps; the grid holds as many CTAs as fit on the GPU at once, and warp g of
//    W takes whole rows g, g + W, g + 2W, ... (no column split, no CTA barrier after the start).
//  - The activations (int8 quants and their (d, s) pairs for the n rows) are copied once per
//    CTA into shared memory when they fit (kStreamMaxXBytes), else read from global memory.
//  - A warp walks its rows in pieces of whole blocks (StreamPiece<T>::kBlocks, about 2.5 KB).
//    Each lane loads its 16-byte vectors of the next piece (lane, lane + 32, ... of the piece's
//    16-byte aligned span: fully coalesced 512-byte warp loads) with ld.global.nc that does not
//    allocate in L1, all of them before it computes on the current piece; so every lane keeps
//    kVecsPerLane x 16 bytes in flight while the warp computes. The registers then go to the
//    warp's shared-memory buffer, where blocks keep their global address modulo 16, so each
//    type's block unpacking and dp4a dot (Quant<T>::load_w / dot) apply unchanged.
//  - Partial sums stay in registers for the whole row and meet in one shuffle reduction.
#pragma once
#include <algorithm>
#include <cstdint>

#include "backend/cuda/cuda_check.cuh"
#include "backend/cuda/matmul_kernels.cuh"
#include "backend/cuda/matmul_quant.cuh"
#include "backend/cuda/warp_reduce.cuh"
#include "core/error.h"

namespace nt::cuda::detail {

constexpr int kStreamWarps = 8;
constexpr int kStreamThreads = kStreamWarps * 32;
// Two CTAs (16 warps) per multiprocessor at least: caps registers at 128 per thread.
constexpr int kStreamMinBlocks = 2;
// Weight bytes a warp loads per piece (an upper bound; pieces are whole warp units of blocks).
constexpr int kStreamPieceTarget = 2560;
// Activations larger than this stay in global memory (n = 8 with long rows).
constexpr size_t kStreamMaxXBytes = size_t(64) << 10;

// The types the stream kernel is compiled for (matmul.cu's gemv_config_available mirrors it).
template <GgmlType T>
constexpr bool stream_compiled() {
    return T == GgmlType::Q4_K || T == GgmlType::Q5_K || T == GgmlType::Q6_K ||
           T == GgmlType::Q8_0;
}

template <GgmlType T>
struct StreamPiece {
    using Q = Quant<T>;
    static constexpr int kBlocksPerUnit = 32 / Q::kLanesPerBlock;  // blocks a warp computes at once
    static constexpr int kUnitBytes = kBlocksPerUnit * Q::kBlockBytes;
    static constexpr int kUnits =
        (kStreamPieceTarget - 16) / kUnitBytes > 0 ? (kStreamPieceTarget - 16) / kUnitBytes : 1;
    static constexpr int kBlocks = kUnits * kBlocksPerUnit;  // blocks per piece
    // 16-byte vectors covering a piece from the aligned address at or below its start.
    static constexpr int kMaxVecs = (kBlocks * Q::kBlockBytes + 15 + 15) / 16;
    static constexpr int kVecsPerLane = (kMaxVecs + 31) / 32;
    static constexpr int kBufBytes = kVecsPerLane * 32 * 16;  // one warp's shared buffer
};

// 16 bytes of weights, streamed: read-only for the kernel, not kept in L1.
__device__ __forceinline__ uint4 ld_stream16(const uint8_t* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}
// The last vector of the weights may run past their end (blocks are only 2-byte aligned):
// halfword loads up to `end`, zeros after it.
__device__ __forceinline__ uint4 ld_tail16(const uint8_t* p, const uint8_t* end) {
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const uint8_t* q = p + 4 * i;
        const uint32_t lo = q < end ? *reinterpret_cast<const uint16_t*>(q) : 0u;
        const uint32_t hi = q + 2 < end ? *reinterpret_cast<const uint16_t*>(q + 2) : 0u;
        w[i] = lo | (hi << 16);
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

template <GgmlType T, int NX>
__global__ void __launch_bounds__(kStreamThreads, kStreamMinBlocks)
    gemv_q8_stream(const uint8_t* __restrict__ w, int64_t rows, int nb,
                   const int8_t* __restrict__ xq, const float2* __restrict__ xd, int64_t cols,
                   int n, float* __restrict__ y, bool stage_x) {
    using Q = Quant<T>;
    using P = StreamPiece<T>;
    constexpr int kLPB = Q::kLanesPerBlock;
    constexpr int kBB = Q::kBlockBytes;
    constexpr int kV = P::kVecsPerLane;
    extern __shared__ __align__(16) uint8_t smem[];

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    uint8_t* buf = smem + warp * P::kBufBytes;
    const size_t row_bytes = size_t(nb) * kBB;
    const uint8_t* wend = w + size_t(rows) * row_bytes;

    // This warp's rows: gwarp, gwarp + nwarps, ...; each row is ppr pieces; piece i of the warp
    // is piece i % ppr of its (i / ppr)-th row.
    const int64_t gwarp = int64_t(blockIdx.x) * kStreamWarps + warp;
    const int64_t nwarps = int64_t(gridDim.x) * kStreamWarps;
    const int my_rows = gwarp < rows ? int((rows - 1 - gwarp) / nwarps + 1) : 0;
    const int ppr = (nb + P::kBlocks - 1) / P::kBlocks;
    const int total = my_rows * ppr;

    // Loads piece i into r (lane's vectors lane + 32u); returns the piece's vector count.
    auto fetch = [&](int i, uint4 (&r)[kV]) {
        const int ri = i / ppr, pi = i - ri * ppr;
        const int64_t row = gwarp + int64_t(ri) * nwarps;
        const int kb0 = pi * P::kBlocks;
        const int len = min(P::kBlocks, nb - kb0) * kBB;
        const uint8_t* src = w + size_t(row) * row_bytes + size_t(kb0) * kBB;
        const uint8_t* a0 =
            reinterpret_cast<const uint8_t*>(reinterpret_cast<uintptr_t>(src) & ~uintptr_t(15));
        const int nv = (int(src - a0) + len + 15) >> 4;
        // Vectors below `full` lie wholly inside the weights.
        const int full = wend - a0 >= int64_t(nv) * 16 ? nv : int((wend - a0) >> 4);
#pragma unroll
        for (int u = 0; u < kV; ++u) {
            const int v = lane + 32 * u;
            if (v < full)
                r[u] = ld_stream16(a0 + 16 * v);
            else if (v < nv)
                r[u] = ld_tail16(a0 + 16 * v, wend);
        }
        return nv;
    };

    uint4 r[kV];
    int nv = total > 0 ? fetch(0, r) : 0;  // in flight while the activations are staged

    const int64_t xd_stride = cols / 32;
    const int8_t* xqs = xq;
    const float2* xds = xd;
    if (stage_x) {
        int8_t* sq = reinterpret_cast<int8_t*>(smem + kStreamWarps * P::kBufBytes);
        float2* sd = reinterpret_cast<float2*>(sq + int64_t(n) * cols);  // n * cols % 32 == 0
        const int64_t nq = int64_t(n) * cols / 16, nd = int64_t(n) * xd_stride;
        for (int64_t k = threadIdx.x; k < nq; k += kStreamThreads)
            reinterpret_cast<int4*>(sq)[k] = __ldg(reinterpret_cast<const int4*>(xq) + k);
        for (int64_t k = threadIdx.x; k < nd; k += kStreamThreads) sd[k] = __ldg(xd + k);
        xqs = sq;
        xds = sd;
    }
    __syncthreads();  // the only CTA barrier: warps run independently from here on

    const int part = lane % kLPB;
    double acc[NX];  // in double: see Quant<T>::dot
#pragma unroll
    for (int k = 0; k < NX; ++k) acc[k] = 0.0;

    for (int i = 0; i < total; ++i) {
        // Piece i's registers to the buffer (waits for their loads), then piece i + 1's loads go
        // out before any computing on piece i.
#pragma unroll
        for (int u = 0; u < kV; ++u) {
            const int v = lane + 32 * u;
            if (v < nv) *reinterpret_cast<uint4*>(buf + 16 * v) = r[u];
        }
        __syncwarp();
        if (i + 1 < total) nv = fetch(i + 1, r);

        const int ri = i / ppr, pi = i - ri * ppr;
        const int64_t row = gwarp + int64_t(ri) * nwarps;
        const int kb0 = pi * P::kBlocks;
        const int nblk = min(P::kBlocks, nb - kb0);
        const int off = int((size_t(row) * row_bytes + size_t(kb0) * kBB) & 15);  // w is aligned
#pragma unroll
        for (int u = 0; u < P::kUnits; ++u) {
            const int j = u * P::kBlocksPerUnit + lane / kLPB;
            if (j < nblk) {
                typename Q::W wr;
                Q::load_w(buf + off + j * kBB, part, wr);
                const int64_t kb = kb0 + j;
#pragma unroll
                for (int k = 0; k < NX; ++k) {
                    const int64_t xr = k < n ? k : n - 1;
                    typename Q::X xv;
                    Q::template load_x<true>(xqs + xr * cols + kb * Q::kBlockElems,
                                             xds + xr * xd_stride + kb * (Q::kBlockElems / 32),
                                             part, xv);
                    acc[k] += Q::dot(wr, xv);
                }
            }
        }
        if (pi == ppr - 1) {  // row done
#pragma unroll
            for (int k = 0; k < NX; ++k) {
                const float s = float(warp_sum(acc[k]));  // the one rounding to float
                if (lane == 0 && k < n) y[int64_t(k) * rows + row] = s;
                acc[k] = 0.0;
            }
        }
        __syncwarp();  // the buffer is overwritten next
    }
}

// Shared memory of one launch: the warps' buffers, then the activations when staged.
template <GgmlType T>
constexpr size_t stream_buf_bytes() {
    return size_t(kStreamWarps) * StreamPiece<T>::kBufBytes;
}
inline size_t stream_x_bytes(int n, int64_t cols) {
    return size_t(n) * size_t(cols) + size_t(n) * size_t(cols / 32) * sizeof(float2);
}

// One-time host setup of an instantiation (shared-memory limit and carveout, register-limited
// CTAs per multiprocessor); returns {CTAs per SM allowed by registers, SMs, shared memory per SM}.
struct StreamLimits {
    int reg_ctas, sms, smem_per_sm;
};
template <GgmlType T, int NX>
const StreamLimits& stream_limits() {
    static const StreamLimits lim = [] {
        auto* kernel = gemv_q8_stream<T, NX>;
        const int max_smem = int(stream_buf_bytes<T>() + kStreamMaxXBytes);
        NT_CUDA_CHECK(
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, max_smem),
            "gemv stream shared memory limit");
        NT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                           int(cudaSharedmemCarveoutMaxShared)),
                      "gemv stream carveout");
        StreamLimits l{};
        int dev = 0;
        NT_CUDA_CHECK(cudaGetDevice(&dev), "cudaGetDevice");
        NT_CUDA_CHECK(cudaDeviceGetAttribute(&l.sms, cudaDevAttrMultiProcessorCount, dev),
                      "device attribute");
        NT_CUDA_CHECK(cudaDeviceGetAttribute(&l.smem_per_sm,
                                             cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev),
                      "device attribute");
        NT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&l.reg_ctas, kernel,
                                                                    kStreamThreads, 0),
                      "gemv stream occupancy");
        if (l.reg_ctas < 1)
            nt::fail("gemv: the stream kernel for %s does not fit on this GPU.", type_name(T));
        return l;
    }();
    return lim;
}

template <GgmlType T, int NX>
void launch_stream(const void* w, int64_t rows, int64_t cols, const int8_t* xq, const float2* xd,
                   int n, float* y, cudaStream_t stream) {
    const StreamLimits& lim = stream_limits<T, NX>();
    const size_t xbytes = stream_x_bytes(n, cols);
    const bool stage_x = xbytes <= kStreamMaxXBytes;
    const size_t smem = stream_buf_bytes<T>() + (stage_x ? xbytes : 0);
    // CTAs resident at once: the register limit, and shared memory with 1 KB reserved per CTA.
    const int smem_ctas = int(size_t(lim.smem_per_sm) / (smem + 1024));
    const int per_sm = std::max(1, std::min(lim.reg_ctas, smem_ctas));
    const int64_t needed = (rows + kStreamWarps - 1) / kStreamWarps;
    const int64_t grid = std::min<int64_t>(needed, int64_t(per_sm) * lim.sms);
    gemv_q8_stream<T, NX><<<unsigned(grid), kStreamThreads, smem, stream>>>(
        static_cast<const uint8_t*>(w), rows, int(cols / Quant<T>::kBlockElems), xq, xd, cols, n,
        y, stage_x);
    NT_CUDA_CHECK(cudaGetLastError(), "gemv (stream)");
}

template <GgmlType T>
void launch_stream_nx(const void* w, int64_t rows, int64_t cols, const int8_t* xq,
                      const float2* xd, int n, float* y, int nx, cudaStream_t stream) {
    switch (nx) {
        case 1:
            return launch_stream<T, 1>(w, rows, cols, xq, xd, n, y, stream);
        case 2:
            return launch_stream<T, 2>(w, rows, cols, xq, xd, n, y, stream);
        case 4:
            return launch_stream<T, 4>(w, rows, cols, xq, xd, n, y, stream);
        case 8:
            return launch_stream<T, 8>(w, rows, cols, xq, xd, n, y, stream);
        default:
            nt::fail("gemv: no stream kernel for nx=%d.", nx);
    }
}

template <GgmlType T>
void prepare_stream() {
    stream_limits<T, 1>();
    stream_limits<T, 2>();
    stream_limits<T, 4>();
    stream_limits<T, 8>();
}

}  // namespace nt::cuda::detail
