// GEMV kernels for quantized weights and int8 activations (internal; instantiated per type
// family in matmul_gemv_*.cu).
//
// Work split: a CTA of 4 warps covers 4/ksplit groups of RW consecutive weight rows; the
// ksplit warps of a group take alternate column chunks of those rows (ksplit > 1 gives small
// matrices enough warps). Inside a warp, Quant<T>::kLanesPerBlock lanes share a block, so a
// warp covers 32/kLanesPerBlock consecutive blocks per unit. Each weight block is loaded once
// and multiplied with all NX activation rows; lanes' partial sums meet in a shuffle reduction,
// then across the group's warps in shared memory.
//
// Staged kernel: the RW rows' bytes of a chunk (kUnits units of blocks) are contiguous per
// row; lanes copy them into the warp's shared-memory stage with 16-byte cp.async from the
// 16-byte aligned address at or below the chunk start, so every global load is a full, aligned,
// coalesced 16 bytes whatever the block size (Q8_0's 34 bytes, Q6_K's 210). Four stages keep
// three chunks in flight while the warp computes on the fourth. With `persistent`, the grid
// holds only as many CTAs as fit on the GPU at once and each loops over several row tiles, its
// copy pipeline running on from one tile into the next. Blocks keep their global address
// modulo 16 in shared memory, so the type's aligned loads stay valid.
//
// Direct kernel (blocks that are 16-byte aligned: Q4_K, Q5_K): 16-byte loads straight into
// registers, kDirectUnroll units in flight per warp.
//
// Stream kernel: matmul_gemv_stream.cuh. Pipe kernel: matmul_gemv_pipe.cuh, and its form with
// the weights in flight in shared memory (one activation row, sm_90+): matmul_gemv_tma.cuh.
#pragma once
#include <algorithm>
#include <cstdint>

#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/cuda_check.cuh"
#include "backend/cuda/matmul_gemv_mma.cuh"
#include "backend/cuda/matmul_gemv_pipe.cuh"
#include "backend/cuda/matmul_gemv_stream.cuh"
#include "backend/cuda/matmul_gemv_tma.cuh"
#include "backend/cuda/matmul_kernels.cuh"
#include "backend/cuda/matmul_quant.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/warp_reduce.cuh"

namespace nt::cuda::detail {

constexpr int kGemvWarps = 4;
constexpr int kGemvThreads = kGemvWarps * 32;
constexpr int kGemvStages = 4;
constexpr int kDirectUnroll = 2;
// At least 4 CTAs (16 warps) per multiprocessor: caps registers at 128 per thread. Kernels
// for 4 or 8 activation rows hold more accumulators and activations and get 3 (168 registers)
// rather than spill; their copy pipelines still keep enough bytes in flight.
constexpr int kGemvMinBlocks = 4;
constexpr int gemv_min_blocks(int nx) {
    return nx >= 4 ? 3 : kGemvMinBlocks;
}

template <GgmlType T>
struct Staging {
    using Q = Quant<T>;
    static constexpr int kBlocksPerUnit = 32 / Q::kLanesPerBlock;
    static constexpr int kBlocksPerChunk = kBlocksPerUnit * Q::kUnits;
    static constexpr int kChunkBytes = kBlocksPerChunk * Q::kBlockBytes;
    // An unaligned start adds at most one 16-byte vector, a partial end one more.
    static constexpr int kStageBytes = (kChunkBytes / 16 + 2) * 16;
};

// Sums acc over the warp, then over the ksplit warps of each row group, and writes the rows
// of CTA tile `tile` (kGemvWarps / ksplit groups of RW rows) into y.
// `red` holds kGemvWarps * RW * NX accumulators of shared memory. The quantized types' sums are
// double (see Quant<T>::dot) until each output rounds to float once; float weights' are float.
template <int NX, int RW, class Acc>
__device__ __forceinline__ void gemv_reduce_store(Acc (&acc)[RW][NX], Acc* red, int ksplit,
                                                  int64_t rows, int n, float* __restrict__ y,
                                                  int64_t tile) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
    for (int r = 0; r < RW; ++r)
#pragma unroll
        for (int k = 0; k < NX; ++k) acc[r][k] = warp_sum(acc[r][k]);
    if (ksplit == 1) {
        // Every warp owns its rows: no shared memory and no CTA barrier, so warps never wait
        // for each other between tiles (ksplit is uniform across the CTA).
        if (lane == 0) {
#pragma unroll
            for (int r = 0; r < RW; ++r) {
                const int64_t row = (tile * kGemvWarps + warp) * RW + r;
#pragma unroll
                for (int k = 0; k < NX; ++k)
                    if (row < rows && k < n) y[int64_t(k) * rows + row] = float(acc[r][k]);
            }
        }
        return;
    }
    if (lane == 0) {
#pragma unroll
        for (int r = 0; r < RW; ++r)
#pragma unroll
            for (int k = 0; k < NX; ++k) red[(warp * RW + r) * NX + k] = acc[r][k];
    }
    __syncthreads();
    const int groups = kGemvWarps / ksplit;
    const int t = threadIdx.x;
    if (t < groups * RW * NX) {
        const int g = t / (RW * NX), idx = t % (RW * NX), r = idx / NX, k = idx % NX;
        Acc s = 0;
        for (int kp = 0; kp < ksplit; ++kp) s += red[((g * ksplit + kp) * RW + r) * NX + k];
        const int64_t row = (tile * groups + g) * RW + r;
        if (row < rows && k < n) y[int64_t(k) * rows + row] = float(s);
    }
    __syncthreads();  // red is reused by the next tile
}

template <GgmlType T, int NX, int RW>
__global__ void __launch_bounds__(kGemvThreads, gemv_min_blocks(NX))
    gemv_q8_staged(const uint8_t* __restrict__ w, int64_t rows, int nb,
                   const int8_t* __restrict__ xq, const float2* __restrict__ xd, int64_t cols,
                   int n, float* __restrict__ y, int ksplit) {
    using Q = Quant<T>;
    using S = Staging<T>;
    constexpr int kLPB = Q::kLanesPerBlock;
    constexpr int kBB = Q::kBlockBytes;
    extern __shared__ __align__(16) uint8_t smem[];

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int kpart = warp % ksplit, group = warp / ksplit;
    const int groups = kGemvWarps / ksplit;
    const size_t row_bytes = size_t(nb) * kBB;
    const uint8_t* wend = w + size_t(rows) * row_bytes;
    uint8_t* buf = smem + warp * (kGemvStages * RW * S::kStageBytes);
    double* red = reinterpret_cast<double*>(smem + kGemvWarps * kGemvStages * RW * S::kStageBytes);

    // A tile is the CTA's groups x RW rows; CTAs take tiles blockIdx.x, + gridDim.x, ... (one
    // each when the grid has a CTA per tile). The copy pipeline runs on across tiles, so a
    // warp's next rows are in flight while it finishes the current ones.
    const int64_t tiles = (rows + int64_t(groups) * RW - 1) / (int64_t(groups) * RW);
    const int my_tiles =
        int64_t(blockIdx.x) < tiles ? int((tiles - 1 - blockIdx.x) / gridDim.x + 1) : 0;
    const int nchunks = (nb + S::kBlocksPerChunk - 1) / S::kBlocksPerChunk;
    const int my_chunks = kpart < nchunks ? (nchunks - kpart + ksplit - 1) / ksplit : 0;
    const int total = my_tiles * my_chunks;

    auto row_ptr = [&](int tile_iter, int r) {
        const int64_t tile = blockIdx.x + int64_t(tile_iter) * gridDim.x;
        const int64_t row = (tile * groups + group) * RW + r;
        return w +
               size_t(row < rows ? row : rows - 1) * row_bytes;  // tail rows: computed, not stored
    };

    // Starts the copy of this warp's i-th chunk into stage i % kGemvStages. Always commits a
    // group (possibly empty) so that wait_group counts stay uniform.
    auto issue = [&](int i) {
        if (i < total) {
            const int ti = i / my_chunks, it = i - ti * my_chunks;
            const int kb0 = (kpart + it * ksplit) * S::kBlocksPerChunk;
            const int len = min(S::kBlocksPerChunk, nb - kb0) * kBB;
            uint8_t* dst = buf + (i % kGemvStages) * RW * S::kStageBytes;
#pragma unroll
            for (int r = 0; r < RW; ++r) {
                const uint8_t* src = row_ptr(ti, r) + size_t(kb0) * kBB;
                const uint8_t* a0 = reinterpret_cast<const uint8_t*>(
                    reinterpret_cast<uintptr_t>(src) & ~uintptr_t(15));
                const int nv = (int(src - a0) + len + 15) >> 4;
                for (int v = lane; v < nv; v += 32) {
                    const uint8_t* g = a0 + 16 * v;
                    const int avail = wend - g < 16 ? int(wend - g) : 16;
                    uint8_t* d = dst + r * S::kStageBytes + 16 * v;
                    if (avail == 16) {
                        cp_async16(d, g, 16);
                    } else {
                        // The matrix's last vector: copy what exists and zero the rest, so no
                        // instruction addresses bytes past the end (cp.async with a short
                        // src-size still names a 16-byte source).
                        for (int b = 0; b < 16; ++b) d[b] = b < avail ? g[b] : 0;
                    }
                }
            }
        }
        cp_async_commit();
    };

    pdl_trigger();
#pragma unroll
    for (int s = 0; s < kGemvStages - 1; ++s) issue(s);
    pdl_wait(xq, xd, y);  // weights only above

    const int part = lane % kLPB;
    const int64_t xd_stride = cols / 32;
    int i = 0;
    for (int ti = 0; ti < my_tiles; ++ti) {
        double acc[RW][NX];
#pragma unroll
        for (int r = 0; r < RW; ++r)
#pragma unroll
            for (int k = 0; k < NX; ++k) acc[r][k] = 0.0;
        // Offset of each row's first block from 16-byte alignment (blocks keep it in the stage).
        int off[RW];
#pragma unroll
        for (int r = 0; r < RW; ++r) off[r] = int(reinterpret_cast<uintptr_t>(row_ptr(ti, r)) & 15);

        for (int it = 0; it < my_chunks; ++it, ++i) {
            issue(i + kGemvStages - 1);
            cp_async_wait<kGemvStages - 1>();
            __syncwarp();
            const int kb0 = (kpart + it * ksplit) * S::kBlocksPerChunk;
            const int chunk_off = (kb0 * kBB) & 15;
            const uint8_t* stage = buf + (i % kGemvStages) * RW * S::kStageBytes;
#pragma unroll
            for (int u = 0; u < Q::kUnits; ++u) {
                const int j = u * S::kBlocksPerUnit + lane / kLPB;
                const int kb = kb0 + j;
                if (kb < nb) {
                    typename Q::W wr[RW];
#pragma unroll
                    for (int r = 0; r < RW; ++r)
                        Q::load_w(
                            stage + r * S::kStageBytes + ((off[r] + chunk_off) & 15) + j * kBB,
                            part, wr[r]);
#pragma unroll
                    for (int k = 0; k < NX; ++k) {
                        const int64_t xr = k < n ? k : n - 1;
                        typename Q::X xv;
                        Q::load_x(xq + xr * cols + int64_t(kb) * Q::kBlockElems,
                                  xd + xr * xd_stride + int64_t(kb) * (Q::kBlockElems / 32), part,
                                  xv);
#pragma unroll
                        for (int r = 0; r < RW; ++r) acc[r][k] += Q::dot(wr[r], xv);
                    }
                }
            }
            __syncwarp();
        }
        gemv_reduce_store<NX, RW>(acc, red, ksplit, rows, n, y,
                                  blockIdx.x + int64_t(ti) * gridDim.x);
    }
    cp_async_wait<0>();
}

template <GgmlType T, int NX, int RW>
__global__ void __launch_bounds__(kGemvThreads, gemv_min_blocks(NX))
    gemv_q8_direct(const uint8_t* __restrict__ w, int64_t rows, int nb,
                   const int8_t* __restrict__ xq, const float2* __restrict__ xd, int64_t cols,
                   int n, float* __restrict__ y, int ksplit) {
    using Q = Quant<T>;
    constexpr int kLPB = Q::kLanesPerBlock;
    constexpr int kBPU = 32 / kLPB;
    constexpr int kBB = Q::kBlockBytes;
    static_assert(kBB % 16 == 0, "the direct kernel needs 16-byte aligned blocks");
    __shared__ double red[kGemvWarps * RW * NX];

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int kpart = warp % ksplit;
    const int64_t row0 = (int64_t(blockIdx.x) * (kGemvWarps / ksplit) + warp / ksplit) * RW;
    const size_t row_bytes = size_t(nb) * kBB;
    const uint8_t* wrow[RW];
#pragma unroll
    for (int r = 0; r < RW; ++r) wrow[r] = w + size_t(min(row0 + r, rows - 1)) * row_bytes;

    double acc[RW][NX];
#pragma unroll
    for (int r = 0; r < RW; ++r)
#pragma unroll
        for (int k = 0; k < NX; ++k) acc[r][k] = 0.0;

    const int part = lane % kLPB;
    const int64_t xd_stride = cols / 32;
    const int nunits = (nb + kBPU - 1) / kBPU;
    pdl_trigger();
    pdl_wait(xq, xd, y);
    for (int u0 = kpart; u0 < nunits; u0 += kDirectUnroll * ksplit) {
        typename Q::W wr[kDirectUnroll][RW];
#pragma unroll
        for (int uu = 0; uu < kDirectUnroll; ++uu) {
            const int kb = (u0 + uu * ksplit) * kBPU + lane / kLPB;
            if (kb < nb) {
#pragma unroll
                for (int r = 0; r < RW; ++r) Q::load_w(wrow[r] + size_t(kb) * kBB, part, wr[uu][r]);
            }
        }
#pragma unroll
        for (int uu = 0; uu < kDirectUnroll; ++uu) {
            const int kb = (u0 + uu * ksplit) * kBPU + lane / kLPB;
            if (kb < nb) {
#pragma unroll
                for (int k = 0; k < NX; ++k) {
                    const int64_t xr = k < n ? k : n - 1;
                    typename Q::X xv;
                    Q::load_x(xq + xr * cols + int64_t(kb) * Q::kBlockElems,
                              xd + xr * xd_stride + int64_t(kb) * (Q::kBlockElems / 32), part, xv);
#pragma unroll
                    for (int r = 0; r < RW; ++r) acc[r][k] += Q::dot(wr[uu][r], xv);
                }
            }
        }
    }
    gemv_reduce_store<NX, RW>(acc, red, ksplit, rows, n, y, blockIdx.x);
}

template <GgmlType T, int NX, int RW>
constexpr size_t staged_smem_bytes() {
    return size_t(kGemvWarps) * kGemvStages * RW * Staging<T>::kStageBytes +
           size_t(kGemvWarps) * RW * NX * sizeof(double);
}

// Sets up the staged kernel once per instantiation and returns how many of its CTAs fit on the
// whole GPU: raises the shared-memory limit above 48 KB and asks the occupancy calculator.
// Host-side calls only (no stream work); matmul_init runs them all up front through
// prepare_gemv_q8 so that none happens first inside a graph capture.
template <GgmlType T, int NX, int RW>
int staged_resident_ctas() {
    static const int resident = [] {
        constexpr size_t smem = staged_smem_bytes<T, NX, RW>();
        auto* kernel = gemv_q8_staged<T, NX, RW>;
        if (smem > 48 * 1024)
            NT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               int(smem)),
                          "gemv shared memory limit");
        int dev = 0, sms = 0, per_sm = 0;
        NT_CUDA_CHECK(cudaGetDevice(&dev), "cudaGetDevice");
        NT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev),
                      "device attribute");
        NT_CUDA_CHECK(
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kGemvThreads, smem),
            "gemv occupancy");
        if (per_sm < 1)
            nt::fail("gemv: the staged kernel for %s does not fit on this GPU.", type_name(T));
        return per_sm * sms;
    }();
    return resident;
}

template <GgmlType T, int NX, int RW>
void launch_staged(const void* w, int64_t rows, int64_t cols, const int8_t* xq, const float2* xd,
                   int n, float* y, int ksplit, bool persistent, bool pdl, cudaStream_t stream) {
    constexpr size_t smem = staged_smem_bytes<T, NX, RW>();
    const int resident = staged_resident_ctas<T, NX, RW>();
    const int64_t rows_per_cta = int64_t(kGemvWarps / ksplit) * RW;
    const int64_t tiles = (rows + rows_per_cta - 1) / rows_per_cta;
    int64_t grid = tiles;
    if (persistent && tiles > resident) {
        const int64_t per_cta =
            (tiles + resident - 1) / resident;  // balanced: every CTA gets per_cta or one less
        grid = (tiles + per_cta - 1) / per_cta;
    }
    launch_kernel(pdl, gemv_q8_staged<T, NX, RW>, dim3(unsigned(grid)), dim3(kGemvThreads), smem,
                  stream, "gemv (staged)", static_cast<const uint8_t*>(w), rows,
                  int(cols / Quant<T>::kBlockElems), xq, xd, cols, n, y, ksplit);
}

template <GgmlType T, int NX, int RW>
void launch_direct(const void* w, int64_t rows, int64_t cols, const int8_t* xq, const float2* xd,
                   int n, float* y, int ksplit, bool pdl, cudaStream_t stream) {
    const int64_t rows_per_cta = int64_t(kGemvWarps / ksplit) * RW;
    const dim3 grid(unsigned((rows + rows_per_cta - 1) / rows_per_cta));
    launch_kernel(pdl, gemv_q8_direct<T, NX, RW>, grid, dim3(kGemvThreads), 0, stream,
                  "gemv (direct)", static_cast<const uint8_t*>(w), rows,
                  int(cols / Quant<T>::kBlockElems), xq, xd, cols, n, y, ksplit);
}

// The (nx, rows_per_warp) pairs compiled for every quantized type (the others spill registers
// under the 128-register cap), and those the direct kernel also has.
constexpr bool gemv_pair_compiled(int nx, int rw) {
    return ((nx == 1 || nx == 2 || nx == 4) && (rw == 1 || rw == 2)) || (nx == 8 && rw == 1);
}
constexpr bool direct_pair_compiled(int nx, int rw) {
    return (nx == 1 && rw <= 2) || (nx == 2 && rw == 1);
}

template <GgmlType T>
constexpr bool direct_compiled() {
    return Quant<T>::kBlockBytes % 16 == 0;
}

// Runs the GEMV for type T with a fully specified config (checked by the caller).
template <GgmlType T>
void launch_gemv_q8(const void* w, int64_t rows, int64_t cols, const int8_t* xq, const float2* xd,
                    int n, float* y, const GemvConfig& c, cudaStream_t stream) {
    if constexpr (stream_compiled<T>()) {
        if (c.kernel == GemvKernel::Stream)
            return launch_stream_nx<T>(w, rows, cols, xq, xd, n, y, c.nx, stream);
    }
    if constexpr (mma_compiled(T)) {
        if (c.kernel == GemvKernel::Mma)
            return launch_mma<T>(w, rows, cols, xq, xd, n, y, c.ksplit, c.pdl, stream);
    }
    if constexpr (pipe_compiled<T>()) {
        if (c.kernel == GemvKernel::Pipe) {
            const GemvStack one = GemvStack::one(w, rows, y);
            if (c.tma)
                return launch_pipe_any<T>(one, nullptr, cols, xq, xd, n, c.nx, c.pdl, stream, {},
                                          c.split);
            return launch_pipe_nx<T>(one, nullptr, cols, xq, xd, n, c.nx, c.pdl, stream);
        }
    }
#define NT_GEMV_CASE(NX, RW)                                                                  \
    if (c.nx == NX && c.rows_per_warp == RW) {                                                \
        if constexpr (direct_compiled<T>() && direct_pair_compiled(NX, RW)) {                 \
            if (c.kernel == GemvKernel::Direct)                                               \
                return launch_direct<T, NX, RW>(w, rows, cols, xq, xd, n, y, c.ksplit, c.pdl, \
                                                stream);                                      \
        }                                                                                     \
        return launch_staged<T, NX, RW>(w, rows, cols, xq, xd, n, y, c.ksplit, c.persistent,  \
                                        c.pdl, stream);                                       \
    }
    NT_GEMV_CASE(1, 1)
    NT_GEMV_CASE(1, 2)
    NT_GEMV_CASE(2, 1)
    NT_GEMV_CASE(2, 2)
    NT_GEMV_CASE(4, 1)
    NT_GEMV_CASE(4, 2)
    NT_GEMV_CASE(8, 1)
#undef NT_GEMV_CASE
    nt::fail("gemv: no kernel compiled for nx=%d rows_per_warp=%d.", c.nx, c.rows_per_warp);
}

template <GgmlType T>
void prepare_gemv_q8() {
    staged_resident_ctas<T, 1, 1>();
    staged_resident_ctas<T, 1, 2>();
    staged_resident_ctas<T, 2, 1>();
    staged_resident_ctas<T, 2, 2>();
    staged_resident_ctas<T, 4, 1>();
    staged_resident_ctas<T, 4, 2>();
    staged_resident_ctas<T, 8, 1>();
    if constexpr (stream_compiled<T>()) prepare_stream<T>();
    if constexpr (pipe_compiled<T>()) prepare_pipe<T>(), prepare_tma<T>();
}

// SwiGLU pair: y = silu(w x) * (w2 x) in one pipe launch (pipe_compiled<T>() types only).
template <GgmlType T>
void launch_gemv_pair(const void* w, const void* w2, int64_t rows, int64_t cols, const int8_t* xq,
                      const float2* xd, int n, float* y, int nx, bool pdl, cudaStream_t stream,
                      const PairQuant& q) {
    if constexpr (pipe_compiled<T>())
        return launch_pipe_any<T>(GemvStack::one(w, rows, y), w2, cols, xq, xd, n, nx, pdl, stream,
                                  q);
    nt::fail("gemv: no SwiGLU pair kernel for %s.", type_name(T));
}

template <GgmlType T>
bool gemv_from_float_takes_t(const void* w, int64_t rows, int64_t cols) {
    if constexpr (pipe_compiled<T>()) return tma_split_float_x<T>(w, rows, cols);
    return false;
}

template <GgmlType T>
bool launch_gemv_from_float(const void* w, int64_t rows, int64_t cols, const float* x, float* y,
                            bool pdl, cudaStream_t stream) {
    if constexpr (pipe_compiled<T>())
        return launch_tma_split<T>(GemvStack::one(w, rows, y), cols, nullptr, nullptr, 1, pdl,
                                   stream, x);
    return false;
}

template <GgmlType T>
void launch_gemv_stack(const GemvStack& s, int64_t cols, const int8_t* xq, const float2* xd, int n,
                       bool pdl, cudaStream_t stream) {
    if constexpr (pipe_compiled<T>())
        return launch_pipe_any<T>(s, nullptr, cols, xq, xd, n, gemv_nx(n), pdl, stream);
    nt::fail("gemv: no stacked kernel for %s.", type_name(T));
}

}  // namespace nt::cuda::detail

// Explicit instantiation of one type's GEMV entry points (in the matmul_gemv_*.cu files, which
// split the types so that the build runs in parallel).
#define NT_GEMV_INSTANTIATE(T)                                                                  \
    template void launch_gemv_q8<GgmlType::T>(const void*, int64_t, int64_t, const int8_t*,     \
                                              const float2*, int, float*, const GemvConfig&,    \
                                              cudaStream_t);                                    \
    template void launch_gemv_pair<GgmlType::T>(const void*, const void*, int64_t, int64_t,     \
                                                const int8_t*, const float2*, int, float*, int, \
                                                bool, cudaStream_t, const PairQuant&);          \
    template void launch_gemv_stack<GgmlType::T>(const GemvStack&, int64_t, const int8_t*,      \
                                                 const float2*, int, bool, cudaStream_t);       \
    template bool gemv_from_float_takes_t<GgmlType::T>(const void*, int64_t, int64_t);          \
    template bool launch_gemv_from_float<GgmlType::T>(const void*, int64_t, int64_t,            \
                                                      const float*, float*, bool, cudaStream_t); \
    template void prepare_gemv_q8<GgmlType::T>();
