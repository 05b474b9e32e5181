// "Pipe" GEMV kernel for quantized weights and int8 activations (internal; included by
// matmul_gemv.cuh, instantiated with it in matmul_gemv_*.cu). Built to keep HBM busy:
//
//  - The grid holds as many 4-warp CTAs as fit on the GPU at once (or fewer for small
//    matrices); warp g of W takes a contiguous, balanced range of rows. No CTA barrier at all.
//  - A warp walks its rows unit by unit (a unit = 32 / kLanesPerBlock consecutive blocks of one
//    row, kLanesPerBlock lanes to a block) and keeps kDepth units in flight: a ring of
//    registers holds each lane's raw bytes (Quant<T>::Raw: loads only, no arithmetic, so the
//    loads issue at once), the unit kDepth ahead is fetched as soon as a slot is decoded.
//    The loads of the next rows thus run under the arithmetic and the reductions of this one.
//  - Activations come from global memory through L1 (they are small and read by every warp),
//    unit by unit; or, for one activation row and rows of a few units (pipe_x_units: 8B's
//    4096 columns), once per warp into registers (kXU units), each unit's registers met at a
//    compile-time position of the unrolled loop. The activation loads cost as much as the
//    weights' otherwise (256 bytes per 144-byte Q4_K block; measured on the H200: 55% of HBM
//    with them, 72% without, on 128256 x 4096).
//  - Rows go in groups of kV (1 or 2): a slot holds the same unit of every row of the group,
//    and one load of the unit's activations serves them all (two rows halve the activation
//    loads of rows too long to keep their activations in registers).
//  - kPair: SwiGLU. A group is row r of `w` and row r of `w2`; the warp writes
//    silu(w.x) * (w2.x) for row r: gate and up projections in one pass, one launch.
//  - Otherwise the rows may be those of up to three matrices of one type one after another
//    (a GemvStack: q, k and v in one launch), each written to its own output.
#pragma once
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/arrival.cuh"
#include "backend/cuda/cuda_check.cuh"
#include "backend/cuda/matmul_kernels.cuh"
#include "backend/cuda/matmul_quant.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/quantize_q8.cuh"
#include "backend/cuda/swiglu.cuh"
#include "backend/cuda/warp_reduce.cuh"
#include "core/env.h"
#include "core/error.h"

namespace nt::cuda::detail {

constexpr int kPipeWarps = 4;
constexpr int kPipeThreads = kPipeWarps * 32;

// The types the pipe kernel is compiled for (their Quant<T> has Raw / load_raw / decode).
template <GgmlType T>
constexpr bool pipe_compiled() {
    return T == GgmlType::Q4_K || T == GgmlType::Q6_K || T == GgmlType::Q8_0;
}

// Units in flight per warp and the register cap (CTAs per multiprocessor) for each type and
// activation count: deep enough to cover HBM latency, shallow enough not to spill.
template <GgmlType T, int NX, int kXU = 0>
struct PipeShape {
    // (Q6_K's raw units are large: with register-held activations two of them fill the cap.)
    static constexpr int kDepth = kXU > 0               ? (T == GgmlType::Q6_K ? 2 : 4)
                                  : T == GgmlType::Q8_0 ? 6
                                  : NX >= 4             ? 2
                                  : T == GgmlType::Q6_K ? 3
                                                        : 4;
    static constexpr int kMinBlocks = NX >= 4 ? 3 : 4;
};
// The row lengths (in units) whose activations a lane holds in registers, by type: Q4_K and
// Q6_K 1 or 2 units (8B's 4096 columns are 2). Not Q8_0: 8 register-held units (4096
// columns) made it slower (H200, bench_gemv --pdl: 4096x4096 6.99 vs 6.70 us, 14336x4096
// 24.1 vs 20.1; 8B tg128 274 vs 289 tok/s), the ring then being 4 units deep instead of 6.
template <GgmlType T>
constexpr bool pipe_x_units(int upr) {
    return (T == GgmlType::Q4_K || T == GgmlType::Q6_K) && (upr == 1 || upr == 2);
}

// Whether rows whose activations are loaded unit by unit go two at a time (on unless
// NT_PIPE_TWO_ROWS=0, for A/B runs).
inline bool pipe_two_rows_enabled() {
    static const bool on = env_switch("NT_PIPE_TWO_ROWS");
    return on;
}

// The pair's quantization of its output (one activation row, PairQuant): once a warp has
// written its rows [r0, r1), it counts them into each 256-row group they touch; the warp that
// completes a group quantizes it, as quantize_q8 would (a warp per 256 elements, 8 per lane),
// and returns the group's counter to zero for the next launch.
__device__ __forceinline__ void pipe_quantize_groups(const float* y, int64_t r0, int64_t r1,
                                                     const PairQuant& pq, int lane) {
    for (int64_t g = r0 / 256; g * 256 < r1; ++g) {
        const int cnt = int(min(r1, (g + 1) * 256) - max(r0, g * 256));
        int last = 0;
        __syncwarp();  // every lane's rows are written before lane 0 counts them (arrival.cuh)
        if (lane == 0) {
            if (pq.sc_fences) {
                __threadfence();
                last = atomicAdd(pq.done + g, cnt) + cnt == 256;
            } else {
                last = arrive_acq_rel(pq.done + g, cnt) + cnt == 256;
            }
            if (last) pq.done[g] = 0;  // all 256 rows counted: no other warp touches it now
        }
        if (!__shfl_sync(0xffffffffu, last, 0)) continue;
        if (pq.sc_fences)
            __threadfence();
        else
            __syncwarp();  // lane 0's acquire, before any lane reads the group
        float v[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = __ldcg(y + g * 256 + lane * 8 + i);
        int q[8];
        const float2 dq = pq.mode == int(ActQuant::Q8_K)   ? q8k_block(v, lane, q)
                          : pq.mode == int(ActQuant::Q8_1) ? q8_block<8, true>(v, q)
                                                           : q8_block<8, false>(v, q);
        store_q8(pq.xq + g * 256 + lane * 8, q);
        if ((lane & 3) == 0) pq.xd[g * 8 + (lane >> 2)] = dq;
    }
}

template <GgmlType T, int NX, bool kPair, int kXU, int kV>
__global__ void __launch_bounds__(kPipeThreads, (PipeShape<T, NX, kXU>::kMinBlocks))
    gemv_q8_pipe(GemvStack pr, const uint8_t* __restrict__ w2, int nb,
                 const int8_t* __restrict__ xq, const float2* __restrict__ xd, int64_t cols, int n,
                 PairQuant pq, bool early) {
    using Q = Quant<T>;
    const int64_t rows = pr.rows();
    constexpr int kLPB = Q::kLanesPerBlock;
    constexpr int kBPU = 32 / kLPB;
    constexpr int kBB = Q::kBlockBytes;
    static_assert(!kPair || kV == 2, "a pair is a group of two rows");
    static_assert(kV == 1 || kV == 2, "groups of one or two rows");
    // Slots of kV rows' raw bytes: about kDepth units in flight either way (Q6_K's large raw
    // registers allow one slot of two rows without spilling).
    constexpr int kDepth = PipeShape<T, NX, kXU>::kDepth;
    constexpr int D = kV == 1 ? kDepth : T == GgmlType::Q6_K ? 1 : (kDepth + 1) / 2;
    static_assert(kXU == 0 || (NX == 1 && pipe_x_units<T>(kXU)), "register-held activations");
    // The loop below takes kStep units at a time, a multiple of D (unit i in slot i % D) and,
    // with register-held activations, of kXU (unit i of a warp is unit i % kXU of its row: a
    // warp starts at a row's first unit), so that both indices are compile-time constants.
    constexpr int kStep = kXU > D ? kXU : D;
    static_assert(kStep % D == 0 && kStep % (kXU > 0 ? kXU : 1) == 0, "slots and units in step");

    const int lane = threadIdx.x & 31;
    const int part = lane % kLPB, sub = lane / kLPB;
    const int64_t gw = int64_t(blockIdx.x) * kPipeWarps + (threadIdx.x >> 5);
    const int64_t nw = int64_t(gridDim.x) * kPipeWarps;
    // Row groups [g0, g1) of this warp: a pair's group is row r of w and of w2 (output row r);
    // otherwise rows kV g .. kV g + kV - 1 of w (rows is a multiple of kV).
    const int64_t groups = kPair ? rows : rows / kV;
    const int64_t g0 = groups * gw / nw, g1 = groups * (gw + 1) / nw;
    const int upr = (nb + kBPU - 1) / kBPU;  // units per row
    const int64_t total = (g1 - g0) * upr;   // units of this warp, each of kV rows
    const size_t row_bytes = size_t(nb) * kBB;
    auto row_of = [&](int64_t g, int h) {
        if constexpr (kPair) return (h ? w2 : pr.m0) + size_t(g) * row_bytes;
        const int64_t r = g * kV + h;
        const int m = pr.matrix(r);
        return pr.weights(m) + size_t(r - pr.begin(m)) * row_bytes;
    };

    // Unit index -> weight addresses of this lane's block in each row of the group. A lane
    // whose block lies past the row's end (last unit of a short row) loads nothing.
    typename Q::Raw ring[D][kV];
    int64_t f_g = 0;  // fetch cursor: group (relative to g0) and unit
    int f_u = 0;
    auto fetch = [&](typename Q::Raw(&r)[kV]) {
        if (f_g < g1 - g0) {
            const int kb = f_u * kBPU + sub;
            if (kb < nb) {
#pragma unroll
                for (int h = 0; h < kV; ++h)
                    Q::load_raw(row_of(g0 + f_g, h) + size_t(kb) * kBB, part, r[h]);
            }
            if (++f_u == upr) f_u = 0, ++f_g;
        }
    };
    // early: the first D units of weights are fetched before waiting for the kernel before
    // (a programmatic dependent launch starts while it finishes), so this grid's weight stream
    // starts under that kernel's tail. Only the weights: activations and outputs are touched
    // after the wait, through pointers that pdl_wait orders after it, and activations with
    // coherent loads (ld_x16). An earlier version that read them through the read-only path
    // (__ldg, which the compiler may move above the wait) gave wrong Q4_K logits inside CUDA
    // graphs once its weights were fetched early (NT_PDL_PREFETCH=0 restores waiting first).
    pdl_trigger();
    if (!early) pdl_wait(xq, xd, pr.y0, pr.y1, pr.y2);
#pragma unroll
    for (int s = 0; s < D; ++s) fetch(ring[s]);
    if (early) pdl_wait(xq, xd, pr.y0, pr.y1, pr.y2);

    const int64_t xd_stride = cols / 32;
    // kXU: this lane's activations for every unit of a row (upr == kXU), loaded once.
    typename Q::X xr[kXU > 0 ? kXU : 1];
    if constexpr (kXU > 0) {
#pragma unroll
        for (int u = 0; u < kXU; ++u) {
            const int kb = u * kBPU + sub;
            if (kb < nb)
                Q::load_x(xq + int64_t(kb) * Q::kBlockElems,
                          xd + int64_t(kb) * (Q::kBlockElems / 32), part, xr[u]);
        }
    }
    double acc[kV][NX];  // in double: see Quant<T>::dot
#pragma unroll
    for (int h = 0; h < kV; ++h)
#pragma unroll
        for (int k = 0; k < NX; ++k) acc[h][k] = 0.0;
    int64_t c_g = 0;
    int c_u = 0;
    for (int64_t i0 = 0; i0 < total; i0 += kStep) {
#pragma unroll
        for (int i = 0; i < kStep; ++i) {
            const int s = i % D;   // the slot
            if (i0 + i < total) {  // uniform across the warp
                const int kb = c_u * kBPU + sub;
                if (kb < nb) {
                    // Rows decoded one at a time, each right before its dot products, so that
                    // only one row's decoded weights are live (Q6_K's would spill otherwise).
                    if constexpr (kXU > 0) {
#pragma unroll
                        for (int h = 0; h < kV; ++h) {
                            typename Q::W wr;
                            Q::decode(ring[s][h], part, wr);
                            acc[h][0] += Q::dot(wr, xr[i % kXU]);
                        }
                    } else if constexpr (NX == 1) {
                        // One load of the activations serves every row of the group.
                        typename Q::X xv;
                        Q::load_x(xq + int64_t(kb) * Q::kBlockElems,
                                  xd + int64_t(kb) * (Q::kBlockElems / 32), part, xv);
#pragma unroll
                        for (int h = 0; h < kV; ++h) {
                            typename Q::W wr;
                            Q::decode(ring[s][h], part, wr);
                            acc[h][0] += Q::dot(wr, xv);
                        }
                    } else {
                        typename Q::W wr[kV];
#pragma unroll
                        for (int h = 0; h < kV; ++h) Q::decode(ring[s][h], part, wr[h]);
#pragma unroll
                        for (int k = 0; k < NX; ++k) {
                            const int64_t row_x = k < n ? k : n - 1;
                            typename Q::X xv;
                            Q::load_x(xq + row_x * cols + int64_t(kb) * Q::kBlockElems,
                                      xd + row_x * xd_stride + int64_t(kb) * (Q::kBlockElems / 32),
                                      part, xv);
#pragma unroll
                            for (int h = 0; h < kV; ++h) acc[h][k] += Q::dot(wr[h], xv);
                        }
                    }
                }
                fetch(ring[s]);      // this slot is decoded: refill it D units ahead
                if (++c_u == upr) {  // a group is done
                    c_u = 0;
                    const int64_t g = g0 + c_g;
                    ++c_g;
#pragma unroll
                    for (int k = 0; k < NX; ++k) {
                        float v[kV];
#pragma unroll
                        for (int h = 0; h < kV; ++h) {
                            v[h] = float(warp_sum(acc[h][k]));  // the one rounding to float
                            acc[h][k] = 0.0;
                        }
                        if (lane == 0 && k < n) {
                            if constexpr (kPair) {
                                pr.y0[int64_t(k) * rows + g] = silu_mul(v[0], v[1]);
                            } else {
                                // The rows of a group are in one matrix (even row counts).
                                const int m = pr.matrix(g * kV);
                                const int64_t b = pr.begin(m), mrows = pr.end(m) - b;
#pragma unroll
                                for (int h = 0; h < kV; ++h)
                                    pr.out(m)[int64_t(k) * mrows + g * kV + h - b] = v[h];
                            }
                        }
                    }
                }
            }
        }
    }
    if constexpr (kPair && NX == 1)
        if (pq.mode >= 0) pipe_quantize_groups(pr.y0, g0, g1, pq, lane);
}

// CTAs of one instantiation that fit on the GPU at once (host-side, computed once).
template <GgmlType T, int NX, bool kPair, int kXU, int kV>
int pipe_resident_ctas() {
    static const int resident = [] {
        int dev = 0, sms = 0, per_sm = 0;
        NT_CUDA_CHECK(cudaGetDevice(&dev), "cudaGetDevice");
        NT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev),
                      "device attribute");
        NT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                          &per_sm, gemv_q8_pipe<T, NX, kPair, kXU, kV>, kPipeThreads, 0),
                      "gemv pipe occupancy");
        if (per_sm < 1)
            nt::fail("gemv: the pipe kernel for %s does not fit on this GPU.", type_name(T));
        return per_sm * sms;
    }();
    return resident;
}

// Units (32 / kLanesPerBlock blocks) per row.
template <GgmlType T>
int64_t pipe_units(int64_t cols) {
    constexpr int kBPU = 32 / Quant<T>::kLanesPerBlock;
    return (cols / Quant<T>::kBlockElems + kBPU - 1) / kBPU;
}

// Whether a single matrix (or stack) goes two rows a warp: every matrix has an even row
// count and there is a row for every resident warp of the two-row kernel (NX, XU); a short one
// (70B's 1024-row k/v) would leave warps idle (H200: 911 vs 1076 GB/s). NT_PIPE_TWO_ROWS=0
// turns it off.
template <GgmlType T, int NX, int XU>
bool pipe_two_rows(const GemvStack& pr) {
    return pr.e0 % 2 == 0 && pr.e1 % 2 == 0 && pr.e2 % 2 == 0 && pipe_two_rows_enabled() &&
           pr.rows() >= int64_t(pipe_resident_ctas<T, NX, false, XU, 2>()) * kPipeWarps;
}

template <GgmlType T, int NX, bool kPair, int kXU, int kV>
void launch_pipe_k(const GemvStack& pr, const uint8_t* w2, int64_t cols, const int8_t* xq,
                   const float2* xd, int n, bool pdl, cudaStream_t stream, const PairQuant& q) {
    // One warp per row group at most; a whole GPU's worth of CTAs at most.
    const int64_t groups = kPair ? pr.rows() : pr.rows() / kV;
    const int64_t want = (groups + kPipeWarps - 1) / kPipeWarps;
    const int64_t grid = std::min<int64_t>(want, pipe_resident_ctas<T, NX, kPair, kXU, kV>());
    launch_kernel(pdl, gemv_q8_pipe<T, NX, kPair, kXU, kV>, dim3(unsigned(grid)),
                  dim3(kPipeThreads), 0, stream, "gemv (pipe)", pr, w2,
                  int(cols / Quant<T>::kBlockElems), xq, xd, cols, n, q,
                  pdl && pdl_prefetch_enabled());
}

// w2 != nullptr: SwiGLU pair (y = silu(w x) * (w2 x)), both of `rows` x `cols`. A single
// matrix (or stack) goes two rows at a time where every matrix has an even row count and
// there is a row per resident warp, so that one activation load (or register-held
// activations) serves both.
// H200, bench_gemv --pdl, Q4_K at one activation row, one row -> two: 4096 x 14336 2129 ->
// 2683 GB/s, 8192 x 8192 2159 -> 2778, 28672 x 8192 2403 -> 3315, 8192 x 28672 2325 -> 2945.
template <GgmlType T, int NX, bool kPair>
void launch_pipe(const GemvStack& pr, const uint8_t* w2, int64_t cols, const int8_t* xq,
                 const float2* xd, int n, bool pdl, cudaStream_t stream, const PairQuant& q) {
    constexpr int kV = kPair ? 2 : 1;
    const int64_t upr = pipe_units<T>(cols);
    if constexpr (NX == 1 && pipe_x_units<T>(2)) {
        if (upr == 1) {
            if (!kPair && pipe_two_rows<T, 1, 1>(pr))
                return launch_pipe_k<T, 1, false, 1, 2>(pr, w2, cols, xq, xd, n, pdl, stream, q);
            return launch_pipe_k<T, 1, kPair, 1, kV>(pr, w2, cols, xq, xd, n, pdl, stream, q);
        }
        if (upr == 2) {
            if (!kPair && pipe_two_rows<T, 1, 2>(pr))
                return launch_pipe_k<T, 1, false, 2, 2>(pr, w2, cols, xq, xd, n, pdl, stream, q);
            return launch_pipe_k<T, 1, kPair, 2, kV>(pr, w2, cols, xq, xd, n, pdl, stream, q);
        }
    }
    if (!kPair && pipe_two_rows<T, NX, 0>(pr))
        return launch_pipe_k<T, NX, false, 0, 2>(pr, w2, cols, xq, xd, n, pdl, stream, q);
    launch_pipe_k<T, NX, kPair, 0, kV>(pr, w2, cols, xq, xd, n, pdl, stream, q);
}

// w2: the SwiGLU pair's second matrix (nullptr for none); q: the pair's own output
// quantization (one activation row only; ignored otherwise).
template <GgmlType T>
void launch_pipe_nx(const GemvStack& pr, const void* w2, int64_t cols, const int8_t* xq,
                    const float2* xd, int n, int nx, bool pdl, cudaStream_t stream,
                    const PairQuant& q = {}) {
    const auto* b = static_cast<const uint8_t*>(w2);
    auto go = [&](auto nx_tag) {
        constexpr int NX = decltype(nx_tag)::value;
        if (b) return launch_pipe<T, NX, true>(pr, b, cols, xq, xd, n, pdl, stream, q);
        launch_pipe<T, NX, false>(pr, pr.m0, cols, xq, xd, n, pdl, stream, PairQuant{});
    };
    switch (nx) {
        case 1:
            return go(std::integral_constant<int, 1>{});
        case 2:
            return go(std::integral_constant<int, 2>{});
        case 4:
            return go(std::integral_constant<int, 4>{});
        case 8:
            return go(std::integral_constant<int, 8>{});
        default:
            nt::fail("gemv: no pipe kernel for nx=%d.", nx);
    }
}

// Occupancy queries up front (never first inside a graph capture).
template <GgmlType T>
void prepare_pipe() {
    auto each = [](auto nx_tag) {
        constexpr int NX = decltype(nx_tag)::value;
        pipe_resident_ctas<T, NX, false, 0, 1>();
        pipe_resident_ctas<T, NX, false, 0, 2>();
        pipe_resident_ctas<T, NX, true, 0, 2>();
        if constexpr (NX == 1 && pipe_x_units<T>(2)) {
            pipe_resident_ctas<T, 1, false, 1, 1>();
            pipe_resident_ctas<T, 1, false, 1, 2>();
            pipe_resident_ctas<T, 1, true, 1, 2>();
            pipe_resident_ctas<T, 1, false, 2, 1>();
            pipe_resident_ctas<T, 1, false, 2, 2>();
            pipe_resident_ctas<T, 1, true, 2, 2>();
        }
    };
    each(std::integral_constant<int, 1>{});
    each(std::integral_constant<int, 2>{});
    each(std::integral_constant<int, 4>{});
    each(std::integral_constant<int, 8>{});
}

}  // namespace nt::cuda::detail
