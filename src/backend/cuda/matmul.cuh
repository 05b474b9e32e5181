// Matrix products with GGML-quantized weights on the GPU: y[i][r] = sum_c W[r][c] * x[i][c].
//
// Two paths, chosen by the batch size n:
//  - n <= kGemvMaxBatch (decode): GEMV. Quantized weights meet activations quantized to int8
//    exactly as the CPU backend quantizes them for that weight type (Q8_0, Q8_1 or Q8_K: same
//    scales, same rounding, so the integer dot products are the CPU's), held per 32 elements as
//    (d, d*sum(q)); F32/F16/BF16 weights meet the float activations. Every
//    weight byte is read once for all n rows. Asynchronous, no allocation, no host sync: safe
//    to capture in a CUDA graph.
//  - n > kGemvMaxBatch (prompt), quantized weights, in a workspace set to the CPU's arithmetic
//    (MatmulWorkspace::exact: the CLI's --exact, or NT_EXACT_PROMPT=1):
//    the integer tensor-core GEMM (matmul_mmq.cu), the same activations and exact integer sums
//    as the GEMV, so a prompt's outputs are the CPU's bits too.
//  - n > kGemvMaxBatch otherwise (float weights, and by default): the weight is dequantized to
//    FP16 into the workspace (in row slices when it does not fit whole), x is converted to
//    FP16, and cuBLAS multiplies on the tensor cores with FP32 accumulation. F16 and BF16
//    weights are used in place (x converted to the weight's type), F32 weights go through an
//    FP32 cuBLAS GEMM. Short batches of the types with a tensor-core GEMV (Q4_K, Q6_K, Q8_0)
//    take the GEMV path in chunks of kGemvMaxBatch rows instead (matmul_takes_gemv).
//
// Host-only header: the CUDA backend and tests include it from plain C++.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "backend/backend.h"

namespace nt::cuda {

constexpr int kGemvMaxBatch = 8;

// Whether a prompt (a batch above kGemvMaxBatch) runs with the CPU's arithmetic by default: the
// integer GEMM for the types that have it, and the prompt's attention by the prefill kernel that
// sums in the CPU's chunks (attn_prefill's exact form) instead of the FP16 flash-attention
// kernel. NT_EXACT_PROMPT=1 turns it on for every workspace and backend (CudaBackend::
// set_exact_prompt for one). Off by default: the FP16 paths (within FP16 rounding of the CPU)
// run 8B pp512 1.6x faster for Q4_K_M on an H100 and more for the 32-element block types, and the
// exact attention's float chains on CUDA cores grow with the context far faster than the flash
// kernel's tensor-core tiles (docs/BENCHMARKS.md).
bool prompt_exact();

// Whether matmul() multiplies a batch of n rows of type t on the GEMV path (int8 activations,
// quantized weights as they are), in chunks of kGemvMaxBatch rows, rather than the GEMM path.
bool matmul_takes_gemv(GgmlType t, int n);

// Which activations the workspace holds quantized (GEMV path): x, batch, columns and the
// activation quantization (detail::ActQuant). x == nullptr: none.
struct ActivationKey {
    const float* x = nullptr;
    int n = 0;
    int64_t cols = 0;
    int mode = -1;
    int8_t* xq = nullptr;  // where they are: the workspace's first slot, or (the SwiGLU pair's
    float2* xd = nullptr;  // quantized output) the one after its input's
};

// Weights to request into L2 (MatmulWorkspace::warm): the first `bytes` of each of p[0], p[1].
struct L2Warm {
    const uint8_t* p[2] = {nullptr, nullptr};
    int64_t bytes = 0;
    bool after = false;  // requested after the launch's wait rather than before it
};

// Scratch for one stream's matmuls. Calls sharing a workspace must be ordered (same stream).
struct MatmulWorkspace {
    void* buf = nullptr;  // device memory, 256-byte aligned (cudaMalloc)
    size_t bytes = 0;
    cublasHandle_t cublas = nullptr;
    int sm_count = 0;    // multiprocessors of the current device (launch shapes)
    ActivationKey held;  // host-side record of what the last GEMV quantized into buf
    // Counters near the end of buf (zero between launches), for kernels that quantize their own
    // output in groups of 256 rows (the SwiGLU pair); null in a workspace too small for them.
    int* done = nullptr;
    // GEMVs as programmatic dependent launches (their weight loads overlap the end of the
    // kernel before): set by matmul_init on compute capability 9.0+ unless NT_PDL=0; callers
    // whose weights are written by earlier work in the stream (streamed layers) turn it off.
    bool pdl = false;
    // Prompts (batches above kGemvMaxBatch) of quantized weights on the integer GEMM, the CPU's
    // bits: set by matmul_init from prompt_exact(), by CudaBackend from its own setting.
    bool exact = false;
    // Weights that the next GEMV launched as a programmatic dependent launch requests into L2
    // before its wait (or with `after`, after it), spread over its warps
    // (CudaBackend::warm_weights): the first `bytes` of each of p[0], p[1]. Taken (reset) by
    // that matmul.
    L2Warm warm;
    int64_t warm_launches = 0;  // launches that carried a warm (tests)
};

// Bytes of workspace that let matmul() run on any weight with at most max_cols columns and
// max_rows rows, for batches up to max_batch. For max_batch <= kGemvMaxBatch it is the int8
// activations (n x max_cols x 1.25 bytes, at least 256 KiB) and a tail of counters
// (MatmulWorkspace::done). Above, the GEMM path adds cuBLAS's 32 MiB, the FP16
// activations (max_batch x max_cols x 2) and an FP16 weight slice of at most kGemmSliceBytes:
// 8B's largest matrix (14336 x 4096, 117 MB) is dequantized whole; 70B's ffn matrices (28672 x
// 8192, 470 MB in FP16) and the vocab projections go in row slices of that size, which costs
// nothing measurable (each slice is still a large GEMM) and keeps the workspace near 300 MB.
// A smaller workspace also works, with more slices, as long as it holds 128 rows.
constexpr size_t kGemmSliceBytes = size_t(256) << 20;
size_t matmul_workspace_bytes(int64_t max_cols, int64_t max_rows, int max_batch);
// The tail's share of that (partial sums and counters), which a workspace of any size holds
// only with 256 KiB left over: what to add to a workspace sized by hand.
size_t matmul_tail_bytes();

// Takes `bytes` of device memory at `buf` (the caller keeps ownership) and creates the cuBLAS
// handle, bound to `stream`. Throws nt::Error on CUDA/cuBLAS failure.
void matmul_init(MatmulWorkspace& ws, void* buf, size_t bytes, cudaStream_t stream);
void matmul_free(MatmulWorkspace& ws);

// y[i][r] = sum_c W[r][c] * x[i][c] for i < n. W.data: device pointer to GGML blocks, row-major,
// 16-byte aligned; x [n][W.cols] and y [n][W.rows]: device float32, row-major. Asynchronous on
// `stream`. Throws nt::Error (before launching anything) for an unsupported type, a column
// count that is not a multiple of the type's block, a misaligned weight, or a workspace too
// small for this call.
//
// x_unchanged: the caller guarantees that x has not been written since the previous matmul()
// (or matmul_adopt_activations) on this workspace was enqueued. Then a GEMV whose x, n,
// columns and activation quantization match the previous GEMV's (or the adopted ones) reuses
// the int8 activations already in the workspace instead of quantizing again (q/k/v, gate/up:
// one quantize kernel instead of three or two; none after add_rmsnorm). The decision
// is host-side and depends only on the sequence of calls, so it is safe in a CUDA graph capture.
void matmul(const WeightView& w, const float* x, int n, float* y, MatmulWorkspace& ws,
            cudaStream_t stream, bool x_unchanged = false);

// The feed-forward's gate and up projections with SwiGLU in one GEMV launch:
// y[i][r] = silu(sum_c G[r][c] x[i][c]) * sum_c U[r][c] x[i][c]. Returns false, launching
// nothing, where no fused kernel applies (the caller then runs two matmuls and swiglu): batches
// other than 1, gate and up of different types or shapes, types without the pipe kernel.
// x_unchanged as for matmul(). `next` (a hint: the type of the weight the next matmul on y
// multiplies): where it is quantized, the rows a multiple of 256 and the workspace has room,
// the kernel also quantizes y for it (as quantize_q8 would, the last warp of each 256 rows
// doing it) and the next matmul() on y with x_unchanged uses that; *y_quantized says so.
bool matmul_swiglu(const WeightView& gate, const WeightView& up, const float* x, int n, float* y,
                   MatmulWorkspace& ws, cudaStream_t stream, bool x_unchanged = false,
                   GgmlType next = GgmlType::F32, bool* y_quantized = nullptr);

// Three GEMVs of the same x (the attention's q, k and v projections). Matrices that share a
// type whose GEMV here is the pipe kernel run as one launch over their stacked rows, the others
// after it on `stream` (all programmatic dependent launches where ws.pdl); with no two to
// stack (or NT_QKV_STACK=0) the three run concurrently: w[0] on `stream`, w[1] and w[2] on
// the two side streams, which fork from `stream` after x's quantization (event `fork`) and join
// it again (events `join`). Either way later work on `stream` sees all three outputs (in a
// graph capture too). Returns false, launching nothing, where it does not apply: batches above
// kGemvMaxBatch, float weights, or weights whose activation quantizations or column counts
// differ (the caller runs three matmuls). x_unchanged as for matmul().
struct Fork3 {
    cudaStream_t side[2] = {nullptr, nullptr};
    cudaEvent_t fork = nullptr;
    cudaEvent_t join[2] = {nullptr, nullptr};
};
bool matmul_qkv(const WeightView (&w)[3], const float* x, int n, float* const (&y)[3],
                MatmulWorkspace& ws, cudaStream_t stream, const Fork3& f, bool x_unchanged = false);

// Drops the record of quantized activations (the next GEMV quantizes whatever it is given).
void matmul_forget_activations(MatmulWorkspace& ws);

// Quantizing activations in the kernel that produces them (add_rmsnorm) instead of in a
// separate quantize kernel before the GEMV. A slot is where, and how, matmul() on a weight of
// type t would read n rows of `cols` quantized activations.
namespace detail {
enum class ActQuant : int;  // matmul_kernels.cuh
}
struct ActivationSlot {
    int8_t* xq = nullptr;  // [n][cols]
    float2* xd = nullptr;  // [n][cols / 32]
    detail::ActQuant mode{};
};
// False when that matmul would not read quantized activations (float weights, n outside 1 ..
// kGemvMaxBatch, columns not a multiple of 256) or the workspace is too small for them.
bool matmul_activation_slot(const MatmulWorkspace& ws, GgmlType t, int n, int64_t cols,
                            ActivationSlot* slot);
// The producer of x (n rows of `cols`) has been enqueued and writes x's quantization into the
// slot: the next matmul() on the same x, n, columns and activation type, called with
// x_unchanged, uses it instead of quantizing. The caller keeps the x_unchanged promise as
// if this were a matmul on x.
void matmul_adopt_activations(MatmulWorkspace& ws, const float* x, int n, int64_t cols,
                              const ActivationSlot& slot);

// Whether matmul() supports weights of this type.
bool matmul_supports(GgmlType t);

}  // namespace nt::cuda
