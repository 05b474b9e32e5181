// The kernels behind matmul() with their launch knobs exposed, for matmul.cu's dispatcher and
// for the harnesses (bench/cuda/bench_gemv.cu, bench_gemm.cu) that compare variants.
// Internal to the CUDA backend. Every launcher is asynchronous on `stream` and checks the launch.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/matmul.cuh"
#include "quant/types.h"

namespace nt::cuda::detail {

// ---- activations ---------------------------------------------------------------------------

// How the integer GEMV quantizes activations for a weight type: exactly as the CPU backend does
// (nt::vec_dot_type), so that both compute the same integer dot products.
enum class ActQuant : int {
    Q8_0 = 0,  // Q4_0, Q5_0, Q8_0 weights
    Q8_1 = 1,  // Q4_1, Q5_1
    Q8_K = 2,  // Q2_K .. Q6_K
};
ActQuant act_quant(GgmlType t);

// x [n][cols] fp32 -> xq [n][cols] int8 and xd [n][cols/32] float2 = (d, d * sum(q)) per 32
// elements, with the CPU's formulas and rounding (src/quant/quantize.cpp):
//  - Q8_0: d = f16(amax / 127), q = roundf(x * (1 / (amax / 127))), xd.y = d * sum(q);
//  - Q8_1: the same q and d, xd.y = f16((amax / 127) * sum(q)) (block_q8_1's s);
//  - Q8_K: one scale per 256 (cols a multiple of 256): d = 1 / (-127 / max), q =
//    rint(x * (-127 / max)) with max the first element of largest magnitude; all 8 sub-blocks
//    carry that d, and xd.y = d * sum of their own 32 quants.
// Tests compare xq and xd bit for bit with nt::quantize_row(vec_dot_type(t)).
void quantize_q8(const float* x, int n, int64_t cols, ActQuant mode, int8_t* xq, float2* xd,
                 cudaStream_t stream);
size_t q8_bytes(int n, int64_t cols);  // xq then xd, each 256-byte aligned

// The GEMM path's activations: x rounded to quantize_q8's grid for `mode` and written as FP16
// values q * d (out 16-byte aligned). The CPU multiplies a quantized weight by the 8-bit
// activations, so this is what makes the tensor-core path compute the CPU's function (and the
// GEMV's) to FP16 rounding rather than to the 8-bit grid's (docs/BENCHMARKS.md, GPU against CPU).
void quantize_to_f16(const float* x, int n, int64_t cols, ActQuant mode, __half* out,
                     cudaStream_t stream);

// count fp32 -> fp16 / bf16 (round to nearest even).
void convert_to_f16(const float* x, int64_t count, __half* out, cudaStream_t stream);
void convert_to_bf16(const float* x, int64_t count, __nv_bfloat16* out, cudaStream_t stream);

// ---- GEMM on the integer tensor cores, n > 8 (matmul_mmq.cu) ------------------------------

// Types with a kernel: the weights stay quantized and meet quantize_q8's activations in exact
// integer sums scaled in double, the CPU's (and the GEMV's) arithmetic.
bool mmq_supported(GgmlType t);
// y [n][rows] from W (rows x cols, 16-byte aligned) and x quantized by quantize_q8 for t.
// Best: the fastest kernel the device has (gemm_mmq_wgmma's where it takes the type); Sync: the
// mma.sync kernel every device has. The same bits either way.
enum class MmqKernel { Best, Sync };
void gemm_mmq(GgmlType t, const void* w, int64_t rows, int64_t cols, const int8_t* xq,
              const float2* xd, int n, float* y, cudaStream_t stream,
              MmqKernel kernel = MmqKernel::Best);
// The same on Hopper's warpgroup tensor cores (sm90a/matmul_mmq_wgmma.cu, built where the CUDA
// architectures include 9.0): Q4_K, Q5_K, Q6_K (rows a multiple of 16 bytes: cols a multiple of
// 2048), Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1 on a compute capability 9.0 device, with cols a
// multiple of 256 and w, xq, xd 16-byte aligned. Returns false, launching nothing, where it does
// not apply (or the build has no sm_90a code).
bool gemm_mmq_wgmma(GgmlType t, const void* w, int64_t rows, int64_t cols, const int8_t* xq,
                    const float2* xd, int n, float* y, cudaStream_t stream);

// ---- GEMV, n <= 8 --------------------------------------------------------------------------

enum class GemvKernel : int {
    Staged = 0,  // weights streamed through shared memory by cp.async, 3 stages (any type)
    Direct = 1,  // 16-byte loads straight into registers (Q4_K and Q5_K, whose blocks are
                 // 16-byte aligned)
    Stream = 2,  // GPU-filling grid of warps that each take whole rows, weights loaded several
                 // 16-byte vectors per lane ahead, activations in shared memory (Q4_K, Q5_K,
                 // Q6_K, Q8_0; rows_per_warp 1, ksplit 1; see matmul_gemv_stream.cuh)
    Pipe = 3,    // GPU-filling grid of warps over contiguous row ranges, several units of raw
                 // weight registers in flight per warp (Q4_K, Q6_K, Q8_0; rows_per_warp 1,
                 // ksplit 1; see matmul_gemv_pipe.cuh)
    Mma = 4,     // tensor cores: a warp takes 16 weight rows and every activation row with the
                 // integer mma (Q4_K, Q6_K, Q8_0; rows_per_warp 1; see matmul_gemv_mma.cuh)
};

// A GEMV launch shape. Zeros mean "choose": gemv_config() fills them in.
struct GemvConfig {
    GemvKernel kernel = GemvKernel::Staged;
    int nx = 0;             // activation rows per pass over the weights: 1, 2, 4 or 8 (>= n)
    int rows_per_warp = 0;  // weight rows a warp holds at once: 1, 2 or 4
    int ksplit = 0;  // warps of the 4-warp CTA that share rows, splitting the columns: 1, 2, 4
                     // (Mma: 8 too, in a CTA of 8 warps)
    bool persistent = true;  // Staged only: a GPU-filling grid whose CTAs loop over row tiles
                             // (false: one CTA per tile)
    bool pdl = false;  // programmatic dependent launch (pdl.cuh): weight loads start while the
                       // kernel before is finishing; only where no earlier work in the stream
                       // writes the weights (not with streamed layers)
    bool tma = true;   // Pipe only: its form with the weights in flight in shared memory where
                       // that can run (one activation row, sm_90+, 16-byte aligned rows;
                       // matmul_gemv_tma.cuh); false: the register ring
    // Pipe, TMA form only: where rows are too long for it whole, cut them into column slices
    // (matmul() does; false: such rows take the register ring). Single launches only.
    bool split = false;
};

// The dispatcher's choice for this shape (used when a GemvConfig field is 0).
GemvConfig gemv_config(GgmlType t, int64_t rows, int64_t cols, int n, int sm_count,
                       GemvConfig want = {});
// What matmul() runs: gemv_config with the kernel measured fastest for the type.
GemvConfig gemv_default(GgmlType t, int64_t rows, int64_t cols, int n, int sm_count);
// The column slices a Pipe GEMV with GemvConfig::split cuts rows of `cols` columns into on this
// GPU, at nx activation rows; 0 where it takes them whole or not at all.
int gemv_split_slices(GgmlType t, int64_t cols, int nx);
// Whether a (kernel, nx, rows_per_warp) combination is compiled for type t.
bool gemv_config_available(GgmlType t, const GemvConfig& c);

// y[i][r] = sum_c W[r][c] * x[i][c] for i < n <= 8, x given as quantize_q8's output.
// Quantized types only; w 16-byte aligned; cols a multiple of the block size.
void gemv_q8(GgmlType t, const void* w, int64_t rows, int64_t cols, const int8_t* xq,
             const float2* xd, int n, float* y, const GemvConfig& cfg, cudaStream_t stream);

// Per-type entry behind gemv_q8 (defined in matmul_gemv.cuh, instantiated in matmul_gemv_*.cu);
// cfg must be fully specified and available.
template <GgmlType T>
void launch_gemv_q8(const void* w, int64_t rows, int64_t cols, const int8_t* xq, const float2* xd,
                    int n, float* y, const GemvConfig& cfg, cudaStream_t stream);
// One-time host-side setup of every GEMV kernel of type T (shared-memory limits, occupancy).
template <GgmlType T>
void prepare_gemv_q8();
// The SwiGLU pair's own quantization of its output y (one activation row): mode =
// int(ActQuant), -1 for none; y's rows a multiple of 256; done: rows / 256 counters, zero.
struct PairQuant {
    int8_t* xq = nullptr;
    float2* xd = nullptr;
    int* done = nullptr;
    int mode = -1;
    bool sc_fences = false;  // arrival_sc_fences(): fences instead of the acquire-release count
};
// The L2Warm that the next TMA GEMV launch on this thread carries (set by matmul() around its
// dispatch, taken by the launch).
inline L2Warm& pending_l2_warm() {
    thread_local L2Warm w;
    return w;
}
// The activation rows one GEMV pass handles (nx, GemvConfig) for a batch of n <= 8.
constexpr int gemv_nx(int n) {
    return n <= 1 ? 1 : n <= 2 ? 2 : n <= 4 ? 4 : 8;
}
// Up to three matrices of one type and column count run as one GEMV over their stacked rows
// (q, k and v: one launch instead of three), each with its own output ([n][its rows]); one
// matrix is a stack of one. It is the pipe kernel's parameter as it is: named fields, chosen
// by comparisons rather than by indexing, so that they stay in the parameter space (no
// local-memory copy).
struct GemvStack {
    static constexpr int kMax = 3;
    const uint8_t *m0 = nullptr, *m1 = nullptr, *m2 = nullptr;
    float *y0 = nullptr, *y1 = nullptr, *y2 = nullptr;
    // Where each matrix ends in the stacked row index; the unused ones end with the last.
    int64_t e0 = 0, e1 = 0, e2 = 0;
    int count = 0;
    static GemvStack one(const void* w, int64_t rows, float* y) {
        GemvStack s;
        s.add(w, rows, y);
        return s;
    }
    // Appends a matrix (at most kMax): it fills its own slot and the unused ones after it.
    void add(const void* w, int64_t rows, float* y) {
        const auto* m = static_cast<const uint8_t*>(w);
        const int64_t end = e2 + rows;
        if (count == 0) m0 = m, y0 = y, e0 = end;
        if (count <= 1) m1 = m, y1 = y, e1 = end;
        m2 = m, y2 = y, e2 = end;
        ++count;
    }
    __host__ __device__ int64_t rows() const { return e2; }
    // Stacked row r's matrix (0..2); a matrix's stacked rows [begin, end), weights and output.
    __device__ __forceinline__ int matrix(int64_t r) const { return (r >= e0) + (r >= e1); }
    __device__ __forceinline__ int64_t begin(int i) const { return i == 0 ? 0 : i == 1 ? e0 : e1; }
    __device__ __forceinline__ int64_t end(int i) const { return i == 0 ? e0 : i == 1 ? e1 : e2; }
    __device__ __forceinline__ const uint8_t* weights(int i) const {
        return i == 0 ? m0 : i == 1 ? m1 : m2;
    }
    __device__ __forceinline__ float* out(int i) const { return i == 0 ? y0 : i == 1 ? y1 : y2; }
};
// The stack in one pipe launch (pipe_compiled<T>() types, n <= 8).
template <GgmlType T>
void launch_gemv_stack(const GemvStack& s, int64_t cols, const int8_t* xq, const float2* xd, int n,
                       bool pdl, cudaStream_t stream);
// SwiGLU pair: y = silu(w x) * (w2 x), both rows x cols of type T, in one launch (types with
// the pipe kernel only: gemv_pair_available).
template <GgmlType T>
void launch_gemv_pair(const void* w, const void* w2, int64_t rows, int64_t cols, const int8_t* xq,
                      const float2* xd, int n, float* y, int nx, bool pdl, cudaStream_t stream,
                      const PairQuant& q);
// One activation row of floats, quantized inside the kernel as quantize_q8 would (the TMA
// form's column slices of Q4_K and Q6_K: tma_split_float_x): whether it takes this matrix, and
// the launch (false, nothing launched, where it does not).
template <GgmlType T>
bool gemv_from_float_takes_t(const void* w, int64_t rows, int64_t cols);
template <GgmlType T>
bool launch_gemv_from_float(const void* w, int64_t rows, int64_t cols, const float* x, float* y,
                            bool pdl, cudaStream_t stream);
#define NT_GEMV_EXTERN(T)                                                                          \
    extern template void launch_gemv_q8<GgmlType::T>(const void*, int64_t, int64_t, const int8_t*, \
                                                     const float2*, int, float*,                   \
                                                     const GemvConfig&, cudaStream_t);             \
    extern template void launch_gemv_pair<GgmlType::T>(const void*, const void*, int64_t, int64_t, \
                                                       const int8_t*, const float2*, int, float*,  \
                                                       int, bool, cudaStream_t, const PairQuant&); \
    extern template void launch_gemv_stack<GgmlType::T>(const GemvStack&, int64_t, const int8_t*,  \
                                                        const float2*, int, bool, cudaStream_t);   \
    extern template bool gemv_from_float_takes_t<GgmlType::T>(const void*, int64_t, int64_t);      \
    extern template bool launch_gemv_from_float<GgmlType::T>(const void*, int64_t, int64_t,        \
                                                             const float*, float*, bool,           \
                                                             cudaStream_t);                        \
    extern template void prepare_gemv_q8<GgmlType::T>();
NT_GEMV_EXTERN(Q4_0)
NT_GEMV_EXTERN(Q4_1)
NT_GEMV_EXTERN(Q5_0)
NT_GEMV_EXTERN(Q5_1)
NT_GEMV_EXTERN(Q8_0)
NT_GEMV_EXTERN(Q2_K)
NT_GEMV_EXTERN(Q3_K)
NT_GEMV_EXTERN(Q4_K)
NT_GEMV_EXTERN(Q5_K)
NT_GEMV_EXTERN(Q6_K)
#undef NT_GEMV_EXTERN

// prepare_gemv_q8 for every quantized type (matmul_init calls it).
void prepare_gemv_all();

// Whether gemv_pair and gemv_stack have a kernel for weights of type t.
bool gemv_pair_available(GgmlType t);
// Whether the stack's GEMV of `rows` rows (all matrices together) of type t takes the TMA form
// with whole rows (detail::tma_whole_rows; the launch still checks the matrices' starts are
// 16-byte aligned, and runs the register ring where they are not).
bool gemv_stack_tma(GgmlType t, int64_t rows, int64_t cols, int n);
// The stack's GEMV for n <= 8 activation rows (quantize_q8 output), all matrices of type t.
void gemv_stack(GgmlType t, const GemvStack& s, int64_t cols, const int8_t* xq, const float2* xd,
                int n, bool pdl, cudaStream_t stream);
// y = silu(w x) * (w2 x) for n <= 8 activation rows (quantize_q8 output), nx as GemvConfig.
void gemv_pair(GgmlType t, const void* w, const void* w2, int64_t rows, int64_t cols,
               const int8_t* xq, const float2* xd, int n, float* y, bool pdl, cudaStream_t stream,
               const PairQuant& q = {});

// Whether gemv_from_float takes a single matrix of type t (gemv_from_float_takes_t), and the
// GEMV at one activation row of floats x, quantized inside the kernel (bit for bit what
// quantize_q8 and gemv_q8 give): launched, true; false, nothing launched, where it does not
// take the matrix.
bool gemv_from_float_takes(GgmlType t, const void* w, int64_t rows, int64_t cols);
// Whether matrices of type t and `cols` columns are of the shapes gemv_from_float takes (whose
// rows it may still not: gemv_from_float_takes decides).
bool gemv_from_float_cols(GgmlType t, int64_t cols);
bool gemv_from_float(GgmlType t, const void* w, int64_t rows, int64_t cols, const float* x,
                     float* y, bool pdl, cudaStream_t stream);

// The same for F32, F16 and BF16 weights with float activations (any cols).
void gemv_float(GgmlType t, const void* w, int64_t rows, int64_t cols, const float* x, int n,
                float* y, int sm_count, cudaStream_t stream);

// ---- GEMM path -----------------------------------------------------------------------------

// rows x cols quantized weights -> FP16 [rows][cols].
void dequant_to_f16(GgmlType t, const void* w, int64_t rows, int64_t cols, __half* out,
                    cudaStream_t stream);

}  // namespace nt::cuda::detail
