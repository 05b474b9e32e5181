// matmul(): picks GEMV or dequantize + cuBLAS GEMM, lays out the workspace, checks arguments.
#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>

#include "backend/cuda/arrival.cuh"
#include "backend/cuda/cuda_check.cuh"
#include "backend/cuda/matmul.cuh"
#include "backend/cuda/matmul_gemv.cuh"
#include "backend/cuda/matmul_kernels.cuh"
#include "core/env.h"
#include "core/error.h"

namespace nt::cuda {
namespace {

using detail::GemvConfig;
using detail::GemvKernel;

constexpr size_t kCublasWorkspace = size_t(32) << 20;  // cuBLAS's recommendation for Hopper
constexpr int64_t kMinSliceRows = 128;
// The workspace's tail (where it has room for it beyond kTailMinRest bytes): the counters of
// kernels that quantize their own output in groups of 256 rows (the SwiGLU pair).
constexpr int kQuantGroups = 1024;
constexpr size_t kTailBytes = kQuantGroups * sizeof(int);
constexpr size_t kTailMinRest = size_t(256) << 10;

constexpr size_t align256(size_t b) {
    return (b + 255) & ~size_t(255);
}

bool is_quantized(GgmlType t) {
    switch (t) {
        case GgmlType::Q4_0:
        case GgmlType::Q4_1:
        case GgmlType::Q5_0:
        case GgmlType::Q5_1:
        case GgmlType::Q8_0:
        case GgmlType::Q2_K:
        case GgmlType::Q3_K:
        case GgmlType::Q4_K:
        case GgmlType::Q5_K:
        case GgmlType::Q6_K:
            return true;
        default:
            return false;
    }
}

bool is_float(GgmlType t) {
    return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16;
}

size_t gemv_bytes(int n, int64_t cols) {
    return detail::q8_bytes(n, cols);
}

// The GEMV path's int8 activations at the start of the workspace: xq [n][cols], then xd.
int8_t* gemv_xq(const MatmulWorkspace& ws) {
    return static_cast<int8_t*>(ws.buf);
}
float2* gemv_xd(const MatmulWorkspace& ws, int n, int64_t cols) {
    return reinterpret_cast<float2*>(static_cast<uint8_t*>(ws.buf) + align256(size_t(n) * cols));
}

// GEMM path: [cuBLAS workspace][x converted to 16 bits][FP16 weight slice].
size_t gemm_x_bytes(int n, int64_t cols) {
    return align256(size_t(n) * size_t(cols) * 2);
}

template <GgmlType T>
void gemv_q8_t(const void* w, int64_t rows, int64_t cols, const int8_t* xq, const float2* xd, int n,
               float* y, const GemvConfig& c, cudaStream_t s) {
    detail::launch_gemv_q8<T>(w, rows, cols, xq, xd, n, y, c, s);
}

void cublas_gemm(MatmulWorkspace& ws, const void* a, cudaDataType at, const void* b,
                 cudaDataType bt, int64_t m, int n, int64_t k, float* c, int64_t ldc,
                 cudaStream_t stream) {
    const float alpha = 1.f, beta = 0.f;
    // Column-major view: C (m x n, ldc) = A^T (A: k x m, lda = k) * B (k x n, ldb = k), i.e.
    // y[i][r] = sum_c W[r][c] x[i][c] for the row-major W [m][k], x [n][k], y [n][ldc].
    NT_CUDA_CHECK(cublasSetStream(ws.cublas, stream), "cublasSetStream");
    NT_CUDA_CHECK(cublasGemmEx(ws.cublas, CUBLAS_OP_T, CUBLAS_OP_N, int(m), n, int(k), &alpha, a,
                               at, int(k), b, bt, int(k), &beta, c, CUDA_R_32F, int(ldc),
                               CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                  "cublasGemmEx");
}

void check_args(const WeightView& w, const float* x, int n, float* y) {
    const TypeTraits* tr = type_traits(uint32_t(w.type));
    if (!tr || !matmul_supports(w.type))
        nt::fail(
            "CUDA matmul does not support weight type %s; convert the model to a GGML type among "
            "F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K.",
            tr ? tr->name : "unknown");
    if (w.cols <= 0 || w.rows <= 0 || w.cols % tr->block_elems != 0)
        nt::fail(
            "CUDA matmul: weight of %lld x %lld %s elements is not a whole number of %d-element "
            "blocks per row.",
            (long long)w.rows, (long long)w.cols, tr->name, tr->block_elems);
    if (w.rows > INT32_MAX || w.cols > INT32_MAX)
        nt::fail("CUDA matmul: weight of %lld x %lld is too large for one call.", (long long)w.rows,
                 (long long)w.cols);
    if (!is_float(w.type) && reinterpret_cast<uintptr_t>(w.data) % 16 != 0)
        nt::fail("CUDA matmul: %s weight data at %p is not 16-byte aligned.", tr->name, w.data);
    if (n < 1 || !x || !y || !w.data)
        nt::fail("CUDA matmul: empty batch or null pointer (n = %d).", n);
}

}  // namespace

bool matmul_supports(GgmlType t) {
    return is_quantized(t) || is_float(t);
}

size_t matmul_tail_bytes() {
    return kTailBytes;
}

size_t matmul_workspace_bytes(int64_t max_cols, int64_t max_rows, int max_batch) {
    const size_t gemv =
        std::max(align256(gemv_bytes(std::min(max_batch, kGemvMaxBatch), max_cols)), kTailMinRest);
    if (max_batch <= kGemvMaxBatch) return gemv + kTailBytes;
    const size_t slice = std::min(size_t(max_rows) * size_t(max_cols) * 2, kGemmSliceBytes);
    return std::max(gemv, kCublasWorkspace + gemm_x_bytes(max_batch, max_cols) + slice) +
           kTailBytes;
}

void matmul_init(MatmulWorkspace& ws, void* buf, size_t bytes, cudaStream_t stream) {
    if (reinterpret_cast<uintptr_t>(buf) % 256 != 0)
        nt::fail("CUDA matmul workspace must be 256-byte aligned.");
    ws.buf = buf;
    ws.bytes = bytes;
    ws.held = {};
    ws.done = nullptr;
    if (bytes >= kTailBytes + kTailMinRest) {
        ws.bytes = bytes - kTailBytes;
        ws.done = reinterpret_cast<int*>(static_cast<uint8_t*>(buf) + ws.bytes);
        NT_CUDA_CHECK(cudaMemsetAsync(ws.done, 0, kTailBytes, stream), "cudaMemsetAsync");
    }
    int dev = 0;
    NT_CUDA_CHECK(cudaGetDevice(&dev), "cudaGetDevice");
    NT_CUDA_CHECK(cudaDeviceGetAttribute(&ws.sm_count, cudaDevAttrMultiProcessorCount, dev),
                  "cudaDeviceGetAttribute");
    int major = 0;
    NT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev),
                  "cudaDeviceGetAttribute");
    ws.pdl = major >= 9 && env_switch("NT_PDL");
    ws.exact = prompt_exact();
    NT_CUDA_CHECK(cublasCreate(&ws.cublas), "cublasCreate");
    NT_CUDA_CHECK(cublasSetStream(ws.cublas, stream), "cublasSetStream");
    detail::prepare_gemv_all();
    // With a workspace of its own cuBLAS never allocates during a call.
    if (bytes >= kCublasWorkspace)
        NT_CUDA_CHECK(cublasSetWorkspace(ws.cublas, buf, kCublasWorkspace), "cublasSetWorkspace");
}

void matmul_forget_activations(MatmulWorkspace& ws) {
    ws.held = {};
}

bool matmul_activation_slot(const MatmulWorkspace& ws, GgmlType t, int n, int64_t cols,
                            ActivationSlot* slot) {
    if (!is_quantized(t) || n < 1 || n > kGemvMaxBatch || cols <= 0 || cols % 256 != 0 || !ws.buf ||
        gemv_bytes(n, cols) > ws.bytes)
        return false;
    slot->xq = gemv_xq(ws);
    slot->xd = gemv_xd(ws, n, cols);
    slot->mode = detail::act_quant(t);
    return true;
}

void matmul_adopt_activations(MatmulWorkspace& ws, const float* x, int n, int64_t cols,
                              const ActivationSlot& slot) {
    ws.held = {x, n, cols, int(slot.mode), slot.xq, slot.xd};
}

void matmul_free(MatmulWorkspace& ws) {
    if (ws.cublas) cublasDestroy(ws.cublas);
    ws = MatmulWorkspace{};
}

namespace {

// Whether a single activation row of floats goes straight to a GEMV of weights of type t that
// quantizes it itself (detail::gemv_from_float, where it takes the matrix) instead of through
// quantize_q8, and whether the SwiGLU pair then leaves its output in floats for such a down
// projection instead of quantizing it behind its counted arrivals. NT_GEMV_FROM_FLOAT: a mask
// of types, 1 Q4_K, 2 Q6_K; by default 2. H100 8B tg128 against the pair's acquire-release
// count: Q6_K's down projection +1.15% on Q4_K_M (470.0 / 464.7; its Q6_K layers) and +0.5% on
// Q6_K (364.7 / 362.8); Q4_K's -2.5% (452.9): every CTA of the down projection quantizes the
// whole row again, which costs Q4_K's short blocks more than the count saves.
bool gemv_from_float_enabled(GgmlType t) {
    static const int mask = int(env_int("NT_GEMV_FROM_FLOAT", 2));
    return (t == GgmlType::Q4_K && (mask & 1)) || (t == GgmlType::Q6_K && (mask & 2));
}

// Whether the workspace holds x's quantization for weights of type t (what gemv_activations
// would reuse).
bool holds_activations(const MatmulWorkspace& ws, GgmlType t, const float* x, int n, int64_t cols,
                       bool x_unchanged) {
    const ActivationKey& h = ws.held;
    return x_unchanged && h.x == x && h.n == n && h.cols == cols &&
           h.mode == int(detail::act_quant(t));
}

// The GEMV path's int8 activations for weights of type t: quantized into the workspace, or
// the ones already there when x_unchanged and they were made from the same x the same way.
ActivationSlot gemv_activations(GgmlType t, const float* x, int n, int64_t cols,
                                MatmulWorkspace& ws, cudaStream_t stream, bool x_unchanged) {
    ActivationSlot a;
    if (gemv_bytes(n, cols) > ws.bytes)
        nt::fail("CUDA matmul workspace holds %zu bytes; a batch of %d x %lld columns needs %zu.",
                 ws.bytes, n, (long long)cols, gemv_bytes(n, cols));
    a.xq = gemv_xq(ws);
    a.xd = gemv_xd(ws, n, cols);
    a.mode = detail::act_quant(t);
    if (holds_activations(ws, t, x, n, cols, x_unchanged)) {
        a.xq = ws.held.xq;
        a.xd = ws.held.xd;
    } else {
        detail::quantize_q8(x, n, cols, a.mode, a.xq, a.xd, stream);
        ws.held = {x, n, cols, int(a.mode), a.xq, a.xd};
    }
    return a;
}

// Batches above kGemvMaxBatch up to this many rows, of a type with the tensor-core GEMV, take
// the GEMV path in chunks of kGemvMaxBatch rows (NT_GEMV_CHUNKED_MAX, for A/B runs; 0: never).
// An 8-row pass over 8B Q4_K_M costs about 5.3 ms against about 12 for the GEMM path's
// dequantization and cuBLAS at any batch, so two passes win up to 16 rows and three lose.
int gemv_chunked_max_batch() {
    static const int n = int(env_int("NT_GEMV_CHUNKED_MAX", 16));
    return n;
}

}  // namespace

bool prompt_exact() {
    static const bool on = env_int("NT_EXACT_PROMPT", 0) != 0;
    return on;
}

bool matmul_takes_gemv(GgmlType t, int n) {
    if (n <= kGemvMaxBatch) return true;
    return detail::mma_compiled(t) && n <= gemv_chunked_max_batch();
}

namespace {

// An output written over the activations it came from makes their quantized copy stale.
void forget_if_overwritten(MatmulWorkspace& ws, const float* x, int n, int64_t cols, const float* y,
                           int64_t rows) {
    const auto* xb = reinterpret_cast<const uint8_t*>(x);
    const auto* yb = reinterpret_cast<const uint8_t*>(y);
    if (yb < xb + size_t(n) * cols * sizeof(float) && xb < yb + size_t(n) * rows * sizeof(float))
        ws.held = {};
}

}  // namespace

bool matmul_swiglu(const WeightView& gate, const WeightView& up, const float* x, int n, float* y,
                   MatmulWorkspace& ws, cudaStream_t stream, bool x_unchanged, GgmlType next,
                   bool* y_quantized) {
    if (y_quantized) *y_quantized = false;
    // One activation row only: at 2..8 rows the separate staged/direct GEMVs are faster than
    // the pipe kernel the pair runs on (bench_gemv).
    if (n != 1 || gate.type != up.type || gate.rows != up.rows || gate.cols != up.cols ||
        !detail::gemv_pair_available(gate.type))
        return false;
    check_args(gate, x, n, y);
    check_args(up, x, n, y);
    const ActivationSlot a = gemv_activations(gate.type, x, n, gate.cols, ws, stream, x_unchanged);
    // y's own quantization goes to the slot after x's (which the kernel is still reading).
    detail::PairQuant q;
    const size_t y_at = gemv_bytes(n, gate.cols);
    // A down projection that quantizes its float activations itself needs no quantized y
    // (gemv_from_float_enabled).
    const bool next_from_float =
        gemv_from_float_enabled(next) && detail::gemv_from_float_cols(next, gate.rows);
    if (y_quantized && is_quantized(next) && !next_from_float && ws.done && a.xq == gemv_xq(ws) &&
        gate.rows % 256 == 0 && gate.rows / 256 <= kQuantGroups &&
        y_at + gemv_bytes(n, gate.rows) <= ws.bytes) {
        q.xq = reinterpret_cast<int8_t*>(static_cast<uint8_t*>(ws.buf) + y_at);
        q.xd = reinterpret_cast<float2*>(reinterpret_cast<uint8_t*>(q.xq) +
                                         align256(size_t(n) * gate.rows));
        q.done = ws.done;
        q.mode = int(detail::act_quant(next));
        q.sc_fences = arrival_sc_fences();
    }
    detail::gemv_pair(gate.type, gate.data, up.data, gate.rows, gate.cols, a.xq, a.xd, n, y, ws.pdl,
                      stream, q);
    forget_if_overwritten(ws, x, n, gate.cols, y, gate.rows);
    if (q.mode >= 0) {
        ws.held = {y, n, gate.rows, q.mode, q.xq, q.xd};
        *y_quantized = true;
    }
    return true;
}

namespace {

// Which q/k/v go as one stacked launch (NT_QKV_STACK, for A/B runs): 0 none; 1 those of one
// type whose own GEMV is the pipe kernel; 2 (default) also those whose stack takes the TMA form.
int qkv_stack_mode() {
    static const int mode = int(env_int("NT_QKV_STACK", 2));
    return mode;
}

// The stacked path of matmul_qkv: false (nothing launched) where no two matrices stack.
bool qkv_stacked(const WeightView (&w)[3], const ActivationSlot& a, int n, float* const (&y)[3],
                 MatmulWorkspace& ws, cudaStream_t stream) {
    const int mode = qkv_stack_mode();
    if (mode == 0) return false;
    const int64_t cols = w[0].cols;
    // Matrices whose own GEMV is the pipe kernel: each row is then summed as it would be alone
    // (bit for bit). A small one the staged kernel does better alone (Q8_0's and Q6_K's k and
    // v) joins only a stack that takes the TMA form, where one launch of q, k and v beats q
    // with k and v forked beside it (8B Q6_K tg128: 418.5, 418.5, 416.4 stacked vs 399.8,
    // 398.6, 401.7 forked); stacked with the register ring it lost (Q8_0 289.1 vs 295.6; with
    // the TMA form for q alone, Q8_0 309.1 vs 319.5 and Q6_K 353.2 vs 365.3; Q8_0's 6144
    // stacked rows are too few for its TMA form: 347.2 vs 358.4).
    bool joins[3], stacked[3] = {false, false, false};
    for (int i = 0; i < 3; ++i) {
        int64_t rows = 0;  // of the matrices of its type
        for (int j = 0; j < 3; ++j)
            if (w[j].type == w[i].type) rows += w[j].rows;
        joins[i] = detail::gemv_default(w[i].type, w[i].rows, cols, n, ws.sm_count).kernel ==
                       GemvKernel::Pipe ||
                   (mode == 2 && detail::gemv_stack_tma(w[i].type, rows, cols, n));
    }
    // The stacks (one per type) and the matrices left over, these first (NT_QKV_REST_FIRST=0
    // launches them after the stacks, for A/B runs): Q4_K_M's Q6_K v then waits for the norm
    // rather than for the q/k stack, and the attention follows the stack, a TMA launch it can
    // start beside, instead of v's staged launch, which left it no time before its wait. H100,
    // 8B Q4_K_M tg128 in one run, alternating: 477.71, 477.89, 478.02 against 477.11, 477.04,
    // 477.00 (+0.16%); in the phase marks the attention of those layers advances 10.0 us
    // instead of 13.7, and the q/k stack, now waiting for v, 5.5 instead of 3.4.
    struct TypedStack {
        detail::GemvStack rows;
        GgmlType type;
    } stacks[3];
    int n_stacks = 0;
    for (int i = 0; i < 3; ++i) {
        if (!joins[i] || stacked[i]) continue;
        int same[3], count = 0;
        for (int j = i; j < 3; ++j)
            if (joins[j] && w[j].type == w[i].type) same[count++] = j;
        if (count < 2) continue;
        for (int k = 0; k < count; ++k) {
            stacks[n_stacks].rows.add(w[same[k]].data, w[same[k]].rows, y[same[k]]);
            stacked[same[k]] = true;
        }
        stacks[n_stacks++].type = w[i].type;
    }
    if (n_stacks == 0) return false;
    auto launch_rest = [&] {
        for (int i = 0; i < 3; ++i) {
            if (stacked[i]) continue;
            GemvConfig c = detail::gemv_default(w[i].type, w[i].rows, cols, n, ws.sm_count);
            c.pdl = ws.pdl;
            detail::gemv_q8(w[i].type, w[i].data, w[i].rows, cols, a.xq, a.xd, n, y[i], c, stream);
        }
    };
    static const bool rest_first = env_switch("NT_QKV_REST_FIRST");
    if (rest_first) launch_rest();
    for (int k = 0; k < n_stacks; ++k)
        detail::gemv_stack(stacks[k].type, stacks[k].rows, cols, a.xq, a.xd, n, ws.pdl, stream);
    if (!rest_first) launch_rest();
    return true;
}

}  // namespace

bool matmul_qkv(const WeightView (&w)[3], const float* x, int n, float* const (&y)[3],
                MatmulWorkspace& ws, cudaStream_t stream, const Fork3& f, bool x_unchanged) {
    if (n < 1 || n > kGemvMaxBatch || !f.side[0] || !f.side[1]) return false;
    for (const WeightView& wi : w)
        if (!is_quantized(wi.type) || wi.cols != w[0].cols ||
            detail::act_quant(wi.type) != detail::act_quant(w[0].type))
            return false;
    for (int i = 0; i < 3; ++i) check_args(w[i], x, n, y[i]);
    const int64_t cols = w[0].cols;
    const ActivationSlot a = gemv_activations(w[0].type, x, n, cols, ws, stream, x_unchanged);
    if (!qkv_stacked(w, a, n, y, ws, stream)) {
        NT_CUDA_CHECK(cudaEventRecord(f.fork, stream), "cudaEventRecord (q/k/v fork)");
        // The side GEMVs first, so the small ones are not queued behind the large one's CTAs;
        // no programmatic launch there (their predecessor in the stream is the fork, not a
        // kernel).
        for (int i = 1; i < 3; ++i) {
            cudaStream_t s = f.side[i - 1];
            NT_CUDA_CHECK(cudaStreamWaitEvent(s, f.fork, 0), "cudaStreamWaitEvent (q/k/v fork)");
            const GemvConfig c = detail::gemv_default(w[i].type, w[i].rows, cols, n, ws.sm_count);
            detail::gemv_q8(w[i].type, w[i].data, w[i].rows, cols, a.xq, a.xd, n, y[i], c, s);
            NT_CUDA_CHECK(cudaEventRecord(f.join[i - 1], s), "cudaEventRecord (q/k/v join)");
        }
        GemvConfig c = detail::gemv_default(w[0].type, w[0].rows, cols, n, ws.sm_count);
        c.pdl = ws.pdl;
        detail::gemv_q8(w[0].type, w[0].data, w[0].rows, cols, a.xq, a.xd, n, y[0], c, stream);
        for (cudaEvent_t e : f.join)
            NT_CUDA_CHECK(cudaStreamWaitEvent(stream, e, 0), "cudaStreamWaitEvent (q/k/v join)");
    }
    for (int i = 0; i < 3; ++i) forget_if_overwritten(ws, x, n, cols, y[i], w[i].rows);
    return true;
}

void matmul(const WeightView& w, const float* x, int n, float* y, MatmulWorkspace& ws,
            cudaStream_t stream, bool x_unchanged) {
    check_args(w, x, n, y);
    const int64_t rows = w.rows, cols = w.cols;
    auto* base = static_cast<uint8_t*>(ws.buf);
    // ws.warm goes with this matmul's TMA GEMV launch, if it makes one as a programmatic
    // dependent, and no further: detail::pending_l2_warm carries it down to the launch, which
    // takes it.
    struct WarmScope {
        MatmulWorkspace& ws;
        const bool offered;
        explicit WarmScope(MatmulWorkspace& w) : ws(w), offered(w.warm.bytes > 0) {
            detail::pending_l2_warm() = std::exchange(w.warm, {});
        }
        ~WarmScope() {
            if (offered && detail::pending_l2_warm().bytes == 0) ++ws.warm_launches;
            detail::pending_l2_warm() = {};
        }
    } warm_scope(ws);

    if (matmul_takes_gemv(w.type, n)) {
        if (is_float(w.type))  // (n <= kGemvMaxBatch: float types have no chunked path)
            return detail::gemv_float(w.type, w.data, rows, cols, x, n, y, ws.sm_count, stream);
        if (n == 1 && gemv_from_float_enabled(w.type) &&
            !holds_activations(ws, w.type, x, n, cols, x_unchanged) &&
            detail::gemv_from_float(w.type, w.data, rows, cols, x, y, ws.pdl, stream)) {
            forget_if_overwritten(ws, x, n, cols, y, rows);
            return;
        }
        // One pass of up to kGemvMaxBatch rows; a short prompt (a server request's, or one
        // joining decoding rows) in passes of kGemvMaxBatch rows, each reading the weight once,
        // where the GEMM path below writes and reads it whole in FP16 whatever the batch.
        for (int r0 = 0; r0 < n; r0 += kGemvMaxBatch) {
            const int m = std::min(kGemvMaxBatch, n - r0);
            const ActivationSlot a = gemv_activations(w.type, x + size_t(r0) * size_t(cols), m,
                                                      cols, ws, stream, x_unchanged && m == n);
            GemvConfig c = detail::gemv_default(w.type, rows, cols, m, ws.sm_count);
            c.pdl = ws.pdl;
            c.split = true;
            detail::gemv_q8(w.type, w.data, rows, cols, a.xq, a.xd, m,
                            y + size_t(r0) * size_t(rows), c, stream);
        }
        if (n > kGemvMaxBatch)
            ws.held = {};  // it would name the last pass's rows only
        else
            forget_if_overwritten(ws, x, n, cols, y, rows);
        return;
    }
    if (ws.exact && detail::mmq_supported(w.type)) {
        const ActivationSlot a = gemv_activations(w.type, x, n, cols, ws, stream, x_unchanged);
        detail::gemm_mmq(w.type, w.data, rows, cols, a.xq, a.xd, n, y, stream);
        forget_if_overwritten(ws, x, n, cols, y, rows);
        return;
    }
    ws.held = {};  // the GEMM path below overwrites the quantized activations

    if (!ws.cublas) nt::fail("CUDA matmul: workspace not initialised (call matmul_init).");
    if (w.type == GgmlType::F32) {
        if (ws.bytes < kCublasWorkspace)
            nt::fail("CUDA matmul workspace holds %zu bytes; batches above %d need at least %zu.",
                     ws.bytes, kGemvMaxBatch, kCublasWorkspace);
        return cublas_gemm(ws, w.data, CUDA_R_32F, x, CUDA_R_32F, rows, n, cols, y, rows, stream);
    }
    const size_t need_x = kCublasWorkspace + gemm_x_bytes(n, cols);
    uint8_t* xh = base + kCublasWorkspace;
    if (w.type == GgmlType::F16 || w.type == GgmlType::BF16) {
        if (need_x > ws.bytes)
            nt::fail(
                "CUDA matmul workspace holds %zu bytes; a batch of %d x %lld columns needs %zu.",
                ws.bytes, n, (long long)cols, need_x);
        if (w.type == GgmlType::F16) {
            detail::convert_to_f16(x, int64_t(n) * cols, reinterpret_cast<__half*>(xh), stream);
            return cublas_gemm(ws, w.data, CUDA_R_16F, xh, CUDA_R_16F, rows, n, cols, y, rows,
                               stream);
        }
        detail::convert_to_bf16(x, int64_t(n) * cols, reinterpret_cast<__nv_bfloat16*>(xh), stream);
        return cublas_gemm(ws, w.data, CUDA_R_16BF, xh, CUDA_R_16BF, rows, n, cols, y, rows,
                           stream);
    }

    // Quantized: dequantize as many rows as the workspace holds, multiply, repeat.
    const size_t row_f16 = size_t(cols) * 2;
    const int64_t fit = need_x < ws.bytes ? int64_t((ws.bytes - need_x) / row_f16) : 0;
    int64_t slice = std::min(rows, fit);
    if (slice < rows) slice -= slice % kMinSliceRows;
    if (slice < std::min(rows, kMinSliceRows))
        nt::fail(
            "CUDA matmul workspace holds %zu bytes; a batch of %d on a %lld x %lld weight needs at "
            "least %zu.",
            ws.bytes, n, (long long)rows, (long long)cols,
            need_x + size_t(std::min(rows, kMinSliceRows)) * row_f16);
    auto* wh = reinterpret_cast<__half*>(base + need_x);
    detail::quantize_to_f16(x, n, cols, detail::act_quant(w.type), reinterpret_cast<__half*>(xh),
                            stream);
    const size_t row_q = row_bytes(w.type, cols);
    for (int64_t r0 = 0; r0 < rows; r0 += slice) {
        const int64_t m = std::min(slice, rows - r0);
        detail::dequant_to_f16(w.type, static_cast<const uint8_t*>(w.data) + size_t(r0) * row_q, m,
                               cols, wh, stream);
        cublas_gemm(ws, wh, CUDA_R_16F, xh, CUDA_R_16F, m, n, cols, y + r0, rows, stream);
    }
}

}  // namespace nt::cuda

namespace nt::cuda::detail {

namespace {

// Blocks per staged chunk: the unit in which warps of a row group share the columns.
int64_t chunk_blocks(GgmlType t) {
    switch (t) {
        case GgmlType::Q4_0:
            return Staging<GgmlType::Q4_0>::kBlocksPerChunk;
        case GgmlType::Q4_1:
            return Staging<GgmlType::Q4_1>::kBlocksPerChunk;
        case GgmlType::Q5_0:
            return Staging<GgmlType::Q5_0>::kBlocksPerChunk;
        case GgmlType::Q5_1:
            return Staging<GgmlType::Q5_1>::kBlocksPerChunk;
        case GgmlType::Q8_0:
            return Staging<GgmlType::Q8_0>::kBlocksPerChunk;
        case GgmlType::Q2_K:
            return Staging<GgmlType::Q2_K>::kBlocksPerChunk;
        case GgmlType::Q3_K:
            return Staging<GgmlType::Q3_K>::kBlocksPerChunk;
        case GgmlType::Q4_K:
            return Staging<GgmlType::Q4_K>::kBlocksPerChunk;
        case GgmlType::Q5_K:
            return Staging<GgmlType::Q5_K>::kBlocksPerChunk;
        case GgmlType::Q6_K:
            return Staging<GgmlType::Q6_K>::kBlocksPerChunk;
        default:
            return 1;
    }
}

}  // namespace

bool gemv_config_available(GgmlType t, const GemvConfig& c) {
    if (!is_quantized(t) || !gemv_pair_compiled(c.nx, c.rows_per_warp)) return false;
    if (c.ksplit != 1 && c.ksplit != 2 && c.ksplit != 4 &&
        !(c.ksplit == 8 && c.kernel == GemvKernel::Mma))
        return false;
    if (c.kernel == GemvKernel::Stream) {
        // stream_compiled<T>(); one row per warp at a time, no column split
        const bool typed = t == GgmlType::Q4_K || t == GgmlType::Q5_K || t == GgmlType::Q6_K ||
                           t == GgmlType::Q8_0;
        return typed && c.rows_per_warp == 1 && c.ksplit == 1;
    }
    if (c.kernel == GemvKernel::Pipe) {
        // pipe_compiled<T>(); one row per warp at a time, no column split
        return gemv_pair_available(t) && c.rows_per_warp == 1 && c.ksplit == 1;
    }
    if (c.kernel == GemvKernel::Direct) {
        const bool aligned = t == GgmlType::Q4_K || t == GgmlType::Q5_K;  // direct_compiled<T>()
        return aligned && direct_pair_compiled(c.nx, c.rows_per_warp);
    }
    if (c.kernel == GemvKernel::Mma) return mma_compiled(t) && c.rows_per_warp == 1;
    return true;
}

GemvConfig gemv_config(GgmlType t, int64_t rows, int64_t cols, int n, int sm_count,
                       GemvConfig want) {
    GemvConfig c = want;
    if (c.nx == 0) c.nx = gemv_nx(n);
    // Two weight rows per warp halve the activation reads from L1 where the registers allow it
    // (nx = 8 with two rows would spill).
    // Measured on the H200 (docs/BENCHMARKS.md): two rows per warp is faster at nx = 1 too.
    if (c.rows_per_warp == 0) c.rows_per_warp = c.nx <= 4 && c.kernel != GemvKernel::Mma ? 2 : 1;
    if (c.ksplit == 0) {
        // More warps per row group when the row groups alone would not give every
        // multiprocessor 16 warps, but never more than there are column chunks to share.
        // (The mma kernel's warps take tiles of 16 rows and share them block by block.)
        const TypeTraits& tr = traits(t);
        const bool mma = c.kernel == GemvKernel::Mma;
        const int64_t chunk = mma ? mma_blocks_per_step(t) : chunk_blocks(t);
        const int64_t chunks = (cols / tr.block_elems + chunk - 1) / chunk;
        const int64_t warp_rows = mma ? 16 : c.rows_per_warp;
        // (The mma kernel: 8 warps a multiprocessor; bench_gemv's best splits at 8 rows, e.g.
        // 14336x4096 k2 18.9 us against k4 19.3, k1 20.7.)
        const int64_t warps_wanted = int64_t(mma ? 8 : 16) * (sm_count > 0 ? sm_count : 132);
        c.ksplit = 1;
        while (c.ksplit < (mma ? 8 : 4) &&
               (rows + warp_rows - 1) / warp_rows * c.ksplit < warps_wanted &&
               chunks >= 2 * c.ksplit)
            c.ksplit *= 2;
    }
    if (!gemv_config_available(t, c)) c.kernel = GemvKernel::Staged;  // e.g. no direct nx=8 build
    return c;
}

GemvConfig gemv_default(GgmlType t, int64_t rows, int64_t cols, int n, int sm_count) {
    // NT_GEMV_KERNEL=staged|direct|stream|pipe forces a kernel where the type has it (A/B
    // measurements of whole models; bench_gemv compares kernels one matrix at a time).
    static const int forced = [] {
        const char* e = std::getenv("NT_GEMV_KERNEL");
        if (!e) return -1;
        const std::string v = e;
        return v == "staged"   ? int(GemvKernel::Staged)
               : v == "direct" ? int(GemvKernel::Direct)
               : v == "stream" ? int(GemvKernel::Stream)
               : v == "pipe"   ? int(GemvKernel::Pipe)
               : v == "mma"    ? int(GemvKernel::Mma)
                               : -1;
    }();
    if (forced >= 0) {
        GemvConfig want;
        want.kernel = GemvKernel(forced);
        if (want.kernel == GemvKernel::Pipe || want.kernel == GemvKernel::Stream)
            want.rows_per_warp = 1, want.ksplit = 1;
        if (want.kernel == GemvKernel::Mma) want.rows_per_warp = 1;
        const GemvConfig c = gemv_config(t, rows, cols, n, sm_count, want);
        if (c.kernel == want.kernel) return c;
    }
    GemvConfig want;
    // Q4_K/Q5_K blocks are 16-byte aligned, and loading them straight into registers beats the
    // staged copy through shared memory by 25-40% on every 8B shape (bench_gemv --variants all).
    if (t == GgmlType::Q4_K || t == GgmlType::Q5_K) want.kernel = GemvKernel::Direct;
    // Q4_K with one activation row: the pipe kernel beats direct on every 8B shape (with PDL,
    // bench_gemv --pdl: 4096x4096 5.35 vs 6.08 us, 14336x4096 13.2 vs 16.5, 128256x4096
    // 100.5 vs 116.0); at two or more rows the staged/direct kernels win.
    // Q6_K and Q8_0 at one activation row (fifth session, bench_gemv --pdl --variants all,
    // 8B shapes, pipe vs staged-p, us): Q6_K 4096x4096 6.72 vs 7.50, 1024x4096 3.06 vs 3.10,
    // 14336x4096 18.8 vs 21.5, 4096x14336 19.2 vs 20.7, 128256x4096 136 vs 158; Q8_0
    // 4096x4096 6.70 vs 7.86, 14336x4096 20.1 vs 22.7, 4096x14336 23.0 vs 26.7, but 1024x4096
    // 3.86 vs 2.67 and 128256x4096 168 vs 162 (few rows leave warps idle; with very many the
    // staged kernel's persistent grid streams as well).
    // 70B's Q6_K 1024x8192: pipe 5.81 vs 4.40 us for staged-p rw2 k4, so neither takes
    // matrices of fewer than 2048 rows.
    // With its TMA form (sm_90) the pipe kernel takes Q8_0's large output matrix too.
    const bool mid = rows >= 2048;
    const bool pipe_q8 = t == GgmlType::Q8_0 && mid &&
                         (rows <= 32768 || (n == 1 && detail::tma_takes<GgmlType::Q8_0>(cols)));
    if (n == 1 && (t == GgmlType::Q4_K || (t == GgmlType::Q6_K && mid) || pipe_q8)) {
        want.kernel = GemvKernel::Pipe;
        want.rows_per_warp = 1;
        want.ksplit = 1;
    }
    // Several activation rows: the tensor-core kernel, where the CUDA-core ones are bound by
    // their dp4a arithmetic (NT_GEMV_MMA=0 keeps those, for A/B runs). bench_gemv --pdl
    // --variants all, 8B shapes (4096x4096, 1024x4096, 14336x4096, 4096x14336, 128256x4096),
    // us, best mma against the best CUDA-core variant:
    //   Q4_K at 8 rows 7.5 vs 18.1, 4.3 vs 8.9, 18.9 vs 49.2, 18.0 vs 53.3, 132 vs 392; at 4
    //   rows 6.5 vs 9.8, 15.4 vs 25.3, 15.0 vs 29.8, 102 vs 196, but 4.0 vs 3.8 on 1024x4096;
    //   at 2 rows 14.5 vs 17.1, 14.0 vs 16.9, 96.8 vs 118.8, but 5.9 vs 5.9 and 3.9 vs 3.0.
    //   Q6_K at 8 rows 9.9 vs 20.3, 5.6 vs 9.4, 27.9 vs 55.6, 25.9 vs 61.8, 190 vs 452; at 4
    //   rows 9.1 vs 11.7, 24.4 vs 33.4, 23.7 vs 35.5, 163 vs 260, but 5.3 vs 4.6; at 2 rows
    //   21.9 vs 23.1, 22.2 vs 23.1, 153 vs 180, but 8.9 vs 7.7 and 5.3 vs 3.5.
    //   Q8_0 (whose dp4a needs no unpacking) only at 8 rows and 2048-8191 weight rows: 13.6 vs
    //   15.0 (4096x4096), 42.2 vs 50.5 (4096x14336); 46.7 vs 42.3 (14336x4096), 361 vs 340
    //   (128256x4096), 9.3 vs 4.6 (1024x4096).
    static const bool mma = env_switch("NT_GEMV_MMA");
    const bool mma_wins = t == GgmlType::Q8_0
                              ? n >= 8 && rows >= 2048 && rows < 8192
                              : n >= 8 || (n >= 3 && rows >= 2048) ||
                                    (n == 2 && (rows >= 8192 || cols >= 8192));
    if (mma_compiled(t) && mma && mma_wins) {
        want.kernel = GemvKernel::Mma;
        want.rows_per_warp = 1;
    }
    return gemv_config(t, rows, cols, n, sm_count, want);
}

bool gemv_pair_available(GgmlType t) {
    return t == GgmlType::Q4_K || t == GgmlType::Q6_K || t == GgmlType::Q8_0;
}

namespace {

// f(std::integral_constant<GgmlType, T>{}) for a type with the pipe kernel (gemv_pair_available);
// otherwise fails, naming `what`.
template <class F>
void with_pipe_type(GgmlType t, const char* what, F&& f) {
    switch (t) {
        case GgmlType::Q4_K:
            return f(std::integral_constant<GgmlType, GgmlType::Q4_K>{});
        case GgmlType::Q6_K:
            return f(std::integral_constant<GgmlType, GgmlType::Q6_K>{});
        case GgmlType::Q8_0:
            return f(std::integral_constant<GgmlType, GgmlType::Q8_0>{});
        default:
            nt::fail("%s: no kernel for %s.", what, type_name(t));
    }
}

// f(std::integral_constant<GgmlType, T>{}) for a type with the pipe kernel, `none` for any
// other: the questions about shapes and launches that only those types can say yes to.
template <class R, class F>
R ask_pipe_type(GgmlType t, R none, F&& f) {
    if (!gemv_pair_available(t)) return none;
    R r = none;
    with_pipe_type(t, "gemv", [&](auto type) { r = f(type); });
    return r;
}

}  // namespace

bool gemv_from_float_takes(GgmlType t, const void* w, int64_t rows, int64_t cols) {
    return ask_pipe_type(t, false, [&](auto type) {
        return gemv_from_float_takes_t<decltype(type)::value>(w, rows, cols);
    });
}

bool gemv_from_float(GgmlType t, const void* w, int64_t rows, int64_t cols, const float* x,
                     float* y, bool pdl, cudaStream_t stream) {
    return ask_pipe_type(t, false, [&](auto type) {
        return launch_gemv_from_float<decltype(type)::value>(w, rows, cols, x, y, pdl, stream);
    });
}

bool gemv_from_float_cols(GgmlType t, int64_t cols) {
    return ask_pipe_type(
        t, false, [&](auto type) { return tma_float_x_cols<decltype(type)::value>(cols); });
}

int gemv_split_slices(GgmlType t, int64_t cols, int nx) {
    return ask_pipe_type(
        t, 0, [&](auto type) { return tma_split_slices<decltype(type)::value>(cols, nx); });
}

void gemv_pair(GgmlType t, const void* w, const void* w2, int64_t rows, int64_t cols,
               const int8_t* xq, const float2* xd, int n, float* y, bool pdl, cudaStream_t s,
               const PairQuant& q) {
    if (n < 1 || n > 8) nt::fail("gemv pair: batch %d is not in 1..8.", n);
    with_pipe_type(t, "gemv pair", [&](auto type) {
        launch_gemv_pair<decltype(type)::value>(w, w2, rows, cols, xq, xd, n, y, gemv_nx(n), pdl, s,
                                                q);
    });
}

bool gemv_stack_tma(GgmlType t, int64_t rows, int64_t cols, int n) {
    return ask_pipe_type(t, false, [&](auto type) {
        return tma_whole_rows<decltype(type)::value>(rows, cols, gemv_nx(n));
    });
}

void gemv_stack(GgmlType t, const GemvStack& s, int64_t cols, const int8_t* xq, const float2* xd,
                int n, bool pdl, cudaStream_t stream) {
    if (n < 1 || n > 8) nt::fail("gemv stack: batch %d is not in 1..8.", n);
    with_pipe_type(t, "gemv stack", [&](auto type) {
        launch_gemv_stack<decltype(type)::value>(s, cols, xq, xd, n, pdl, stream);
    });
}

void prepare_gemv_all() {
    prepare_gemv_q8<GgmlType::Q4_0>();
    prepare_gemv_q8<GgmlType::Q4_1>();
    prepare_gemv_q8<GgmlType::Q5_0>();
    prepare_gemv_q8<GgmlType::Q5_1>();
    prepare_gemv_q8<GgmlType::Q8_0>();
    prepare_gemv_q8<GgmlType::Q2_K>();
    prepare_gemv_q8<GgmlType::Q3_K>();
    prepare_gemv_q8<GgmlType::Q4_K>();
    prepare_gemv_q8<GgmlType::Q5_K>();
    prepare_gemv_q8<GgmlType::Q6_K>();
}

void gemv_q8(GgmlType t, const void* w, int64_t rows, int64_t cols, const int8_t* xq,
             const float2* xd, int n, float* y, const GemvConfig& c, cudaStream_t s) {
    if (n < 1 || n > c.nx) nt::fail("gemv: batch %d does not fit nx = %d.", n, c.nx);
    if (!gemv_config_available(t, c))
        nt::fail("gemv: no %s kernel for %s with nx=%d rows_per_warp=%d ksplit=%d.",
                 c.kernel == GemvKernel::Direct   ? "direct"
                 : c.kernel == GemvKernel::Stream ? "stream"
                 : c.kernel == GemvKernel::Pipe   ? "pipe"
                                                  : "staged",
                 type_name(t), c.nx, c.rows_per_warp, c.ksplit);
    switch (t) {
        case GgmlType::Q4_0:
            return gemv_q8_t<GgmlType::Q4_0>(w, rows, cols, xq, xd, n, y, c, s);
        case GgmlType::Q4_1:
            return gemv_q8_t<GgmlType::Q4_1>(w, rows, cols, xq, xd, n, y, c, s);
        case GgmlType::Q5_0:
            return gemv_q8_t<GgmlType::Q5_0>(w, rows, cols, xq, xd, n, y, c, s);
        case GgmlType::Q5_1:
            return gemv_q8_t<GgmlType::Q5_1>(w, rows, cols, xq, xd, n, y, c, s);
        case GgmlType::Q8_0:
            return gemv_q8_t<GgmlType::Q8_0>(w, rows, cols, xq, xd, n, y, c, s);
        case GgmlType::Q2_K:
            return gemv_q8_t<GgmlType::Q2_K>(w, rows, cols, xq, xd, n, y, c, s);
        case GgmlType::Q3_K:
            return gemv_q8_t<GgmlType::Q3_K>(w, rows, cols, xq, xd, n, y, c, s);
        case GgmlType::Q4_K:
            return gemv_q8_t<GgmlType::Q4_K>(w, rows, cols, xq, xd, n, y, c, s);
        case GgmlType::Q5_K:
            return gemv_q8_t<GgmlType::Q5_K>(w, rows, cols, xq, xd, n, y, c, s);
        case GgmlType::Q6_K:
            return gemv_q8_t<GgmlType::Q6_K>(w, rows, cols, xq, xd, n, y, c, s);
        default:
            nt::fail("gemv: type %s is not quantized.", type_name(t));
    }
}

}  // namespace nt::cuda::detail
