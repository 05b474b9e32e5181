#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.cuh"
#include "backend/cuda/device_limits.cuh"
#include "backend/cuda/matmul.cuh"
#include "backend/cuda/ops.cuh"
#include "backend/cuda/phase_trace.cuh"
#include "backend/vocab_draw.h"
#include "core/env.h"
#include "core/error.h"

namespace nt {

namespace {

constexpr double kGiB = double(1ull << 30);
constexpr size_t kAlign = 256;
constexpr size_t kDownloadChunk = size_t(4) << 20;
constexpr size_t kDrawInts = (sizeof(TokenDraw) + 3) / 4;  // a step's TokenDraw in its tables
constexpr size_t kUploadChunk = size_t(16) << 20;
// Left free after init() for the CUDA context's own growth, cuBLAS and graph instantiation.
constexpr size_t kHeadroom = size_t(256) << 20;
// What to do when an allocation does not fit (the end of the error's sentence).
constexpr const char* kAdviceCache =
    "reduce the context (-c), the number of sequences or the batch size, or use a smaller model.";
constexpr const char* kAdviceWeights =
    "use a smaller model or quantization, or a smaller context (-c).";
// Runs of at least this many consecutive positions of one sequence go to the prefill kernel;
// shorter runs (and every row of a step of at most kGraphMaxBatch rows) go to decode.
constexpr int kMinPrefillRun = 16;
// A key whose steps left their recorded graph this often stays eager.
constexpr int kMaxGraphFailures = 2;

size_t align_up(size_t n) {
    return (n + kAlign - 1) / kAlign * kAlign;
}
double gib(size_t n) {
    return double(n) / kGiB;
}

}  // namespace

bool CudaBackend::Op::operator==(const Op& o) const {
    return kind == o.kind && i0 == o.i0 && i1 == o.i1 && n == o.n && p[0] == o.p[0] &&
           p[1] == o.p[1] && p[2] == o.p[2] && p[3] == o.p[3] && w.type == o.w.type &&
           w.cols == o.w.cols && w.rows == o.w.rows && w.data == o.w.data &&
           w.nbytes == o.w.nbytes && w2.type == o.w2.type && w2.cols == o.w2.cols &&
           w2.rows == o.w2.rows && w2.data == o.w2.data && w3.type == o.w3.type &&
           w3.cols == o.w3.cols && w3.rows == o.w3.rows && w3.data == o.w3.data && next == o.next;
}

CudaBackend::CudaBackend(int device) {
    dev_ = cuda_device_info(device);  // throws a clear sentence when unusable; sets the device
    NT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    NT_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking),
                  "cudaStreamCreate");
    NT_CUDA_CHECK(cudaEventCreateWithFlags(&step_uploaded_, cudaEventDisableTiming),
                  "cudaEventCreate");
    for (auto& s : side_)
        NT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    NT_CUDA_CHECK(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming), "cudaEventCreate");
    for (auto& e : chosen_ready_)
        NT_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    for (auto& e : join_)
        NT_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    for (auto& e : upload_done_)
        NT_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    graphs_on_ = env_switch("NT_CUDA_GRAPHS");
    rope_fusion_ = env_switch("NT_ROPE_FUSION");
    attn_alone_ = int(env_int("NT_ATTN_ALONE", 1));
    l2_warm_ = env_int("NT_L2_WARM", -1);
    l2_warm_after_ = env_int("NT_L2_WARM_AFTER", 0) != 0;
    exact_prompt_ = cuda::prompt_exact();
    mm_ = std::make_unique<cuda::MatmulWorkspace>();
#ifdef NT_PHASE_TRACE
    cuda::phase::init();
#endif
}

CudaBackend::~CudaBackend() {
    // Nothing here may throw: errors are ignored, memory goes back with the context anyway.
    if (mode_ == Mode::Capture) {
        cudaGraph_t g = nullptr;
        if (cudaStreamEndCapture(stream_, &g) == cudaSuccess && g) cudaGraphDestroy(g);
    }
    if (stream_) cudaStreamSynchronize(stream_);
#ifdef NT_PHASE_TRACE
    cuda::phase::dump(std::getenv("NT_PHASE_OUT"));
#endif
    try {
        release();
    } catch (...) {
    }
    for (Arena& a : arenas_) cudaFree(a.base);
    for (void* p : weight_allocs_) cudaFree(p);
    for (void* p : h_upload_)
        if (p) cudaFreeHost(p);
    for (auto& e : upload_done_)
        if (e) cudaEventDestroy(e);
    if (step_uploaded_) cudaEventDestroy(step_uploaded_);
    if (fork_) cudaEventDestroy(fork_);
    for (auto& e : chosen_ready_)
        if (e) cudaEventDestroy(e);
    for (auto& e : join_)
        if (e) cudaEventDestroy(e);
    for (auto& s : side_)
        if (s) cudaStreamDestroy(s);
    if (copy_stream_) cudaStreamDestroy(copy_stream_);
    if (stream_) cudaStreamDestroy(stream_);
    (void)cudaGetLastError();
}

void CudaBackend::release() {
    drop_graphs();
    if (mm_ && mm_->cublas) cuda::matmul_free(*mm_);
    if (scratch_) cudaFree(scratch_);
    if (kv_) cudaFree(kv_);
    if (h_step_) cudaFreeHost(h_step_);
    if (h_download_) cudaFreeHost(h_download_);
    if (h_sel_) cudaFreeHost(h_sel_);
    if (h_asks_) cudaFreeHost(h_asks_);
    if (h_chosen_) cudaFreeHost(h_chosen_);
    if (h_row_) cudaFreeHost(h_row_);
    h_chosen_ = nullptr;
    h_row_ = nullptr;
    whole_run_sums_ = whole_block_sums_ = nullptr;
    whole_rows_ = nullptr;
    scratch_ = kv_ = nullptr;
    h_step_ = nullptr;
    h_download_ = nullptr;
    h_sel_ = nullptr;
    h_asks_ = nullptr;
    d_step_ = nullptr;
    acts_ = Activations{};
    ready_ = false;
}

void CudaBackend::drop_graphs() {
    for (auto& [key, g] : graphs_)
        if (g.exec) cudaGraphExecDestroy(g.exec);
    graphs_.clear();
}

void* CudaBackend::device_alloc(size_t bytes, const char* what, const char* advice) {
    return cuda::malloc_or_explain(bytes, what, dev_.name.c_str(), advice);
}

void CudaBackend::require_init(const char* op) const {
    if (!ready_) fail("CUDA backend: %s called before init().", op);
}

int CudaBackend::decode_splits(int n_rows) const {
    cuda::AttnShape s{shape_.n_head, shape_.n_head_kv, shape_.head_dim, n_ctx_};
    return cuda::attn_decode_splits(s, n_rows, dev_.sm_count);
}

void CudaBackend::init(const ModelShape& shape, int max_batch, int n_seq, int n_ctx) {
    flush();
    NT_CUDA_CHECK(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    release();
    if (shape.n_embd <= 0 || shape.n_layer <= 0 || shape.n_head <= 0 || shape.n_head_kv <= 0 ||
        shape.head_dim <= 0 || shape.n_ff <= 0 || shape.n_vocab <= 0)
        fail("CUDA backend: model shape has a zero or negative dimension.");
    if (shape.n_head % shape.n_head_kv != 0)
        fail("the model's %d attention heads are not a multiple of its %d KV heads.", shape.n_head,
             shape.n_head_kv);
    if (shape.head_dim % 8 != 0 || shape.head_dim > 256)
        fail(
            "head dimension %d is not supported by the CUDA backend (a multiple of 8, at most "
            "256); use "
            "--device cpu.",
            shape.head_dim);
    if (max_batch <= 0 || n_seq <= 0 || n_ctx <= 0)
        fail("CUDA backend: batch (%d), sequences (%d) and context (%d) must be positive.",
             max_batch, n_seq, n_ctx);
    n_rot_ = shape.rope.n_rot > 0 ? shape.rope.n_rot : shape.head_dim;
    if (n_rot_ > shape.head_dim || n_rot_ % 2 != 0)
        fail("rope dimension count %d does not fit head dimension %d.", n_rot_, shape.head_dim);
    if (!shape.rope.freq_factors.empty() && int(shape.rope.freq_factors.size()) != n_rot_ / 2)
        fail("rope frequency factors: %zu values for %d rotated pairs.",
             shape.rope.freq_factors.size(), n_rot_ / 2);
    shape_ = shape;
    max_batch_ = max_batch;
    n_seq_ = n_seq;
    n_ctx_ = n_ctx;

    // ---- plan every byte up front
    const int64_t qdim = int64_t(shape.n_head) * shape.head_dim;
    const int64_t kvdim = int64_t(shape.n_head_kv) * shape.head_dim;
    kv_layer_elems_ = size_t(n_seq) * size_t(n_ctx) * size_t(kvdim);
    kv_bytes_ = 2 * size_t(shape.n_layer) * kv_layer_elems_ * sizeof(__half);

    const size_t B = size_t(max_batch);
    // gate doubles as the final norm's output (n_embd wide) in the forward pass.
    const int64_t widths[] = {shape.n_embd,
                              shape.n_embd,
                              qdim,
                              kvdim,
                              kvdim,
                              qdim,
                              std::max<int64_t>(shape.n_ff, shape.n_embd),
                              shape.n_ff,
                              shape.n_vocab};
    size_t act_bytes = 0;
    for (int64_t w : widths) act_bytes += align_up(B * size_t(w) * sizeof(float));
    step_bytes_ = align_up((5 * ((B + 3) / 4 * 4) + kDrawInts) * sizeof(int32_t) +
                           B * sizeof(cuda::AttnTile));
    const size_t rope_bytes = align_up(size_t(n_rot_ / 2) * sizeof(float));
    cuda::AttnShape as{shape.n_head, shape.n_head_kv, shape.head_dim, n_ctx};
    size_t attn_floats = 0;
    for (int r = 1; r <= max_batch; r++)
        attn_floats =
            std::max(attn_floats, cuda::attn_decode_scratch_floats(as, r, decode_splits(r)));
    const size_t attn_bytes = align_up(std::max<size_t>(attn_floats, 1) * sizeof(float));
    const size_t done_bytes = align_up(B * size_t(shape.n_head_kv) * sizeof(int));
    const int64_t max_cols = std::max({int64_t(shape.n_embd), int64_t(shape.n_ff), qdim});
    const int64_t max_rows =
        std::max({int64_t(shape.n_vocab), int64_t(shape.n_ff), int64_t(shape.n_embd), qdim});
    const size_t mm_bytes = align_up(cuda::matmul_workspace_bytes(max_cols, max_rows, max_batch));
    // The sampler's candidates (select_logits), sel_rows_ rows at a time: each row's asks, the
    // merge's keys, a NaN flag per block and the answer.
    sel_rows_ = std::max(1, std::min(max_batch, n_seq));
    const size_t sel_row_bytes =
        align_up(size_t(cuda::kMergeKeys) * sizeof(unsigned long long)) +
        align_up(size_t(cuda::logit_select_nan_stride(shape.n_vocab)) * sizeof(int));
    // The draw over the whole vocabulary: its run and block sums, and a ring of rows.
    const size_t draw_blocks = (size_t(shape.n_vocab) + kDrawBlock - 1) / kDrawBlock;
    const size_t whole_bytes = align_up(draw_blocks * kDrawBlockRuns * sizeof(double)) +
                               align_up(draw_blocks * sizeof(double)) +
                               align_up(size_t(kMaxChosen) * size_t(shape.n_vocab) * sizeof(float));
    const size_t sel_bytes = size_t(sel_rows_) * sel_row_bytes + whole_bytes +
                             align_up(size_t(sel_rows_) * sizeof(cuda::LogitAsk)) +
                             align_up(size_t(sel_rows_) * sizeof(cuda::LogitSelection)) +
                             2 * align_up(sizeof(int32_t));
    const size_t scratch_bytes =
        act_bytes + step_bytes_ + rope_bytes + attn_bytes + done_bytes + mm_bytes + sel_bytes;

    size_t free_b = 0, total_b = 0;
    NT_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
    const size_t need = kv_bytes_ + scratch_bytes;
    if (need + kHeadroom > free_b)
        fail(
            "not enough GPU memory: need %.2f GiB for the KV cache (%d layers x %d sequences x %d "
            "positions) and "
            "%.2f GiB for activations and scratch (batch %d), %.2f GiB free on %s; reduce the "
            "context (-c), the "
            "number of sequences or the batch size.",
            gib(kv_bytes_), shape.n_layer, n_seq, n_ctx, gib(scratch_bytes), max_batch, gib(free_b),
            dev_.name.c_str());

    kv_ = device_alloc(kv_bytes_, "the KV cache", kAdviceCache);
    scratch_ = device_alloc(scratch_bytes, "activations and scratch", kAdviceCache);
    // Never-written cells are read only with zero weight, but 0 * NaN is NaN: start from zeros.
    NT_CUDA_CHECK(cudaMemsetAsync(kv_, 0, kv_bytes_, stream_), "cudaMemsetAsync KV cache");

    char* p = static_cast<char*>(scratch_);
    auto take = [&](size_t bytes) {
        char* r = p;
        p += align_up(bytes);
        return r;
    };
    float** slots[] = {&acts_.x,   &acts_.xn,   &acts_.q,  &acts_.k,     &acts_.v,
                       &acts_.att, &acts_.gate, &acts_.up, &acts_.logits};
    for (size_t i = 0; i < 9; i++)
        *slots[i] = reinterpret_cast<float*>(take(B * size_t(widths[i]) * sizeof(float)));
    acts_.max_batch = max_batch;
    d_step_ = reinterpret_cast<int32_t*>(take(step_bytes_));
    rope_inv_freq_ = reinterpret_cast<float*>(take(rope_bytes));
    attn_scratch_ = reinterpret_cast<float*>(take(attn_bytes));
    attn_done_ = reinterpret_cast<int*>(take(done_bytes));
    NT_CUDA_CHECK(cudaMemsetAsync(attn_done_, 0, done_bytes, stream_), "cudaMemsetAsync");
    sel_keys_ = reinterpret_cast<unsigned long long*>(
        take(size_t(sel_rows_) * cuda::kMergeKeys * sizeof(unsigned long long)));
    sel_nan_ = reinterpret_cast<int*>(
        take(size_t(sel_rows_) * size_t(cuda::logit_select_nan_stride(shape.n_vocab)) * sizeof(int)));
    sel_asks_ = reinterpret_cast<cuda::LogitAsk*>(take(size_t(sel_rows_) * sizeof(cuda::LogitAsk)));
    sel_out_ = reinterpret_cast<cuda::LogitSelection*>(
        take(size_t(sel_rows_) * sizeof(cuda::LogitSelection)));
    whole_run_sums_ = reinterpret_cast<double*>(take(draw_blocks * kDrawBlockRuns * sizeof(double)));
    whole_block_sums_ = reinterpret_cast<double*>(take(draw_blocks * sizeof(double)));
    whole_rows_ = reinterpret_cast<float*>(
        take(size_t(kMaxChosen) * size_t(shape.n_vocab) * sizeof(float)));
    fed_token_ = reinterpret_cast<int32_t*>(take(sizeof(int32_t)));
    chosen_on_device_ = reinterpret_cast<int*>(take(sizeof(int)));
    NT_CUDA_CHECK(cudaMemsetAsync(fed_token_, 0, sizeof(int32_t), stream_), "cudaMemsetAsync");
    NT_CUDA_CHECK(cudaMemsetAsync(chosen_on_device_, 0, sizeof(int), stream_), "cudaMemsetAsync");
    chosen_made_ = 0;
    chosen_count_ = 0;
    tables_known_ = false;
    void* mm_buf = take(mm_bytes);
    cuda::matmul_init(*mm_, mm_buf, mm_bytes, stream_);
    pdl_supported_ = mm_->pdl;
    mm_->pdl = pdl_supported_ && pdl_allowed_;
    mm_->exact = exact_prompt_;
    cuda::attn_init();
    cuda::logit_select_init();
    // Every kernel prefers the largest shared-memory carveout (NT_CACHE_SHARED=0 leaves the
    // choice to the driver, for A/B runs). Left to the driver, the carveout follows each
    // kernel's own needs, and a multiprocessor whose carveout must change between two kernels
    // cannot start the next one's CTAs beside the last of the one before: 8B Q4_K_M decode
    // gains about 2% (BENCHMARKS, twelfth session).
    if (env_switch("NT_CACHE_SHARED"))
        NT_CUDA_CHECK(cudaDeviceSetCacheConfig(cudaFuncCachePreferShared),
                      "cudaDeviceSetCacheConfig");

    NT_CUDA_CHECK(cudaMallocHost(&h_step_, step_bytes_), "cudaMallocHost");
    std::memset(h_step_, 0, step_bytes_);
    NT_CUDA_CHECK(cudaMallocHost(&h_download_, kDownloadChunk), "cudaMallocHost");
    NT_CUDA_CHECK(cudaMallocHost(&h_sel_, size_t(sel_rows_) * sizeof(cuda::LogitSelection)),
                  "cudaMallocHost");
    NT_CUDA_CHECK(cudaMallocHost(&h_asks_, size_t(sel_rows_) * sizeof(cuda::LogitAsk)),
                  "cudaMallocHost");
    NT_CUDA_CHECK(cudaMallocHost(&h_row_, size_t(shape.n_vocab) * sizeof(float)), "cudaMallocHost");
    NT_CUDA_CHECK(cudaHostAlloc(&h_chosen_, size_t(kMaxChosen) * sizeof(cuda::LogitSelection),
                                cudaHostAllocMapped),
                  "cudaHostAlloc chosen tokens");
    NT_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&h_chosen_on_device_),
                                           h_chosen_, 0),
                  "cudaHostGetDevicePointer chosen tokens");

    // Rope frequencies exactly as the CPU backend computes them (same float expression), so
    // both turn by the same float angle.
    std::vector<float> inv(size_t(n_rot_ / 2));
    for (int i = 0; i < n_rot_ / 2; i++) {
        float f = shape.rope.freq_scale *
                  std::pow(shape.rope.freq_base, -2.0f * float(i) / float(n_rot_));
        if (!shape.rope.freq_factors.empty()) f /= shape.rope.freq_factors[size_t(i)];
        inv[size_t(i)] = f;
    }
    if (!inv.empty())
        NT_CUDA_CHECK(cudaMemcpyAsync(rope_inv_freq_, inv.data(), inv.size() * sizeof(float),
                                      cudaMemcpyHostToDevice, stream_),
                      "cudaMemcpyAsync rope table");
    NT_CUDA_CHECK(cudaStreamSynchronize(stream_), "cudaStreamSynchronize init");
    n_rows_ = n_logits_ = n_dec_ = n_tiles_ = 0;
    splits_ = 1;
    ready_ = true;
}

// ---- steps and graphs ----------------------------------------------------------------------

void CudaBackend::begin_step(const Batch& batch) {
    require_init("begin_step");
    flush();             // a previous step that never downloaded
    forget_quantized();  // a replayed graph leaves other activations in the workspace
    const int n = batch.size();
    if (n > max_batch_) fail("batch of %d tokens exceeds the maximum of %d.", n, max_batch_);
    for (int i = 0; i < n; i++) {
        const size_t u = size_t(i);
        if (batch.seq[u] < 0 || batch.seq[u] >= n_seq_)
            fail("sequence id %d is out of range (0..%d).", batch.seq[u], n_seq_ - 1);
        if (batch.pos[u] < 0 || batch.pos[u] >= n_ctx_)
            fail("position %d is outside the context of %d tokens.", batch.pos[u], n_ctx_);
        if (batch.tokens[u] == kFedToken && chosen_made_ == 0)
            fail("a step names the token chosen on the device, but none was chosen.");
        if ((batch.tokens[u] < 0 && batch.tokens[u] != kFedToken) ||
            batch.tokens[u] >= shape_.n_vocab)
            fail("token id %d is outside the vocabulary (%d tokens).", batch.tokens[u],
                 shape_.n_vocab);
    }
    if (batch.choose) {
        if (batch.n_logits() == 0)
            fail("a step that chooses its token on the device must produce logits.");
        if (chosen_count_ == kMaxChosen)
            fail("%d tokens chosen on the device were never taken.", kMaxChosen);
        const TokenDraw& d = batch.draw;
        // top_k 0: over the whole vocabulary (no top-p), at a temperature above 0.
        const bool whole = d.top_k == 0 && d.temperature > 0.f && d.top_p == 1.f;
        if (!cuda::logit_select_fits(shape_.n_vocab, whole ? 1 : d.top_k) ||
            d.top_k > shape_.n_vocab ||
            !(d.u >= 0.0 && d.u < 1.0) || !(d.top_p >= 0.f && d.top_p <= 1.f) ||
            !(d.min_p >= 0.f && d.min_p <= 1.f) || std::isnan(d.temperature) || d.n_bias < 0 ||
            d.n_bias > kMaxDrawBias)
            fail("a token drawn on the device needs top-k 1 to %d within the vocabulary (or 0, "
                 "the whole vocabulary, at a temperature above 0 without top-p) and sampler "
                 "settings in range.",
                 kMaxLogitCandidates);
        for (int i = 0; i < d.n_bias; i++)
            if (d.bias_id[i] < 0 || d.bias_id[i] >= shape_.n_vocab || !std::isfinite(d.bias[i]))
                fail("a logit bias drawn on the device needs token ids within the vocabulary "
                     "and finite values.");
    }

    // The tables, laid out for this step's rows (stride_), staged on the host first: a step
    // whose tables the device already holds uploads nothing.
    static_assert(sizeof(cuda::AttnTile) == 4 * sizeof(int32_t), "tiles are four ints");
    static_assert(sizeof(TokenDraw) == kDrawInts * sizeof(int32_t) && kDrawInts % 2 == 0,
                  "the draw is whole ints, and the tiles after it stay 8-byte aligned");
    const size_t S = size_t((n + 3) / 4 * 4);
    staged_.assign(5 * S + kDrawInts + 4 * size_t(n), 0);
    int32_t* tokens = staged_.data();
    int32_t* pos = tokens + S;
    int32_t* seq = tokens + 2 * S;
    int32_t* logit_rows = tokens + 3 * S;
    int32_t* dec_rows = tokens + 4 * S;
    if (batch.choose) std::memcpy(tokens + 5 * S, &batch.draw, sizeof(TokenDraw));
    cuda::AttnTile* tiles = reinterpret_cast<cuda::AttnTile*>(tokens + 5 * S + kDrawInts);
    std::copy(batch.tokens.begin(), batch.tokens.end(), tokens);
    std::copy(batch.pos.begin(), batch.pos.end(), pos);
    std::copy(batch.seq.begin(), batch.seq.end(), seq);
    n_logits_ = 0;
    for (int i = 0; i < n; i++)
        if (batch.want_logits[size_t(i)]) logit_rows[n_logits_++] = i;

    // Attention plan: runs of consecutive positions long enough for the prefill kernel become
    // tiles; every other row is a decode row.
    n_dec_ = n_tiles_ = 0;
    cuda::AttnShape as{shape_.n_head, shape_.n_head_kv, shape_.head_dim, n_ctx_};
    // With the CPU's arithmetic (exact_prompt_) the tiles go to the prefill kernel that
    // sums each row's context in the CPU's chunks (the flash kernel's FP16 tiles would not).
    const bool all_decode = n <= kGraphMaxBatch || !cuda::attn_has_prefill(as, exact_prompt_);
    for (int i = 0; i < n;) {
        int j = i + 1;
        if (!all_decode)
            while (j < n && seq[j] == seq[i] && pos[j] == pos[j - 1] + 1) j++;
        if (j - i >= kMinPrefillRun) {
            for (int r = i; r < j; r += cuda::kPrefillTileRows)
                tiles[n_tiles_++] =
                    cuda::AttnTile{r, std::min(cuda::kPrefillTileRows, j - r), seq[i], pos[r]};
        } else {
            for (int r = i; r < j; r++) dec_rows[n_dec_++] = r;
        }
        i = j;
    }
    splits_ = decode_splits(n_dec_);
    n_rows_ = n;
    stride_ = int(S);
    choose_k_ = !batch.choose ? 0 : batch.draw.top_k > 0 ? batch.draw.top_k : kChooseWhole;
    staged_.resize(5 * S + kDrawInts + 4 * size_t(n_tiles_));
    const bool held = tables_known_ && staged_ == tables_;
    tables_known_ = false;  // until the step has been enqueued whole (end_step)
    if (!held) {
        // The pinned mirror may still feed the previous step's copy.
        NT_CUDA_CHECK(cudaEventSynchronize(step_uploaded_), "cudaEventSynchronize");
        const size_t bytes = staged_.size() * sizeof(int32_t);
        std::memcpy(h_step_, staged_.data(), bytes);
        NT_CUDA_CHECK(cudaMemcpyAsync(d_step_, h_step_, bytes, cudaMemcpyHostToDevice, stream_),
                      "cudaMemcpyAsync step tables");
        NT_CUDA_CHECK(cudaEventRecord(step_uploaded_, stream_), "cudaEventRecord");
    }
    tables_.swap(staged_);

    if (graphs_on_ && n > 0 && n <= kGraphMaxBatch) {
        key_ = {n, n_logits_, choose_k_};
        auto it = graphs_.find(key_);
        if (it != graphs_.end() && it->second.exec) {
            mode_ = Mode::Replay;
            replay_pos_ = 0;
            pending_.clear();
        } else if (it == graphs_.end() || it->second.failures < kMaxGraphFailures) {
            NT_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal),
                          "cudaStreamBeginCapture");
            mode_ = Mode::Capture;
            recording_.clear();
        }
    }
}

void CudaBackend::submit(const Op& op) {
    switch (mode_) {
        case Mode::Eager:
            run(op);
            return;
        case Mode::Capture:
            try {
                run(op);
            } catch (const Error&) {
                // Not capturable (or a real failure): run the step eagerly from its start, and
                // do not try to record this key again. A real failure throws again from run().
                capture_failed();
                run(op);
                return;
            }
            recording_.push_back(op);
            return;
        case Mode::Replay: {
            const Graph& g = graphs_.at(key_);
            if (replay_pos_ < g.ops.size() && g.ops[replay_pos_] == op) {
                pending_.push_back(op);
                replay_pos_++;
                return;
            }
            leave_graph();
            run(op);
            return;
        }
    }
}

void CudaBackend::leave_graph() {
    // The step's op sequence differs from the recorded one: the graph cannot serve this key
    // (it is recorded again next time), and the ops deferred so far run now, in order.
    Graph& g = graphs_.at(key_);
    if (g.exec) cudaGraphExecDestroy(g.exec);
    g.exec = nullptr;
    g.ops.clear();
    g.failures++;
    stats_.fallbacks++;
    mode_ = Mode::Eager;
    forget_quantized();
    std::vector<Op> ops;
    ops.swap(pending_);
    for (const Op& o : ops) run(o);
}

void CudaBackend::forget_quantized() {
    after_matmul_ = false;
    if (mm_) cuda::matmul_forget_activations(*mm_);
}

void CudaBackend::capture_failed() {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream_, &status) == cudaSuccess &&
        status != cudaStreamCaptureStatusNone) {
        cudaGraph_t g = nullptr;
        if (cudaStreamEndCapture(stream_, &g) == cudaSuccess && g) cudaGraphDestroy(g);
    }
    (void)cudaGetLastError();
    mode_ = Mode::Eager;
    graphs_[key_].failures = kMaxGraphFailures;
    forget_quantized();  // what run() recorded as quantized was captured, never executed
    std::vector<Op> ops;
    ops.swap(recording_);
    for (const Op& o : ops) run(o);  // captured, never executed
}

void CudaBackend::flush() {
    if (mode_ == Mode::Capture) {
        cudaGraph_t graph = nullptr;
        cudaError_t e = cudaStreamEndCapture(stream_, &graph);
        if (e != cudaSuccess || !graph) {  // the capture was invalidated along the way
            capture_failed();
            return;
        }
        mode_ = Mode::Eager;
        if (recording_.empty()) {  // nothing was enqueued this step
            cudaGraphDestroy(graph);
            return;
        }
        cudaGraphExec_t exec = nullptr;
        e = cudaGraphInstantiate(&exec, graph, 0);
        cudaGraphDestroy(graph);
        if (e != cudaSuccess) {
            capture_failed();
            return;
        }
        Graph& g = graphs_[key_];
        if (g.exec) cudaGraphExecDestroy(g.exec);
        g.exec = exec;
        g.ops = std::move(recording_);
        recording_.clear();
        stats_.captures++;
        NT_CUDA_CHECK(cudaGraphLaunch(exec, stream_), "cudaGraphLaunch");
    } else if (mode_ == Mode::Replay) {
        const Graph& g = graphs_.at(key_);
        if (replay_pos_ != g.ops.size()) {  // the step stopped short of the recorded sequence
            leave_graph();
            return;
        }
        mode_ = Mode::Eager;
        pending_.clear();
        stats_.replays++;
        NT_CUDA_CHECK(cudaGraphLaunch(g.exec, stream_), "cudaGraphLaunch");
    }
}

void CudaBackend::end_step() {
    if (choose_k_) {
        Op op;
        op.kind = OpKind::Choose;
        op.i0 = choose_k_;
        submit(op);
    }
    flush();
    tables_known_ = true;
    if (choose_k_) {
        const int slot = int(chosen_made_ % kMaxChosen);
        chosen_k_[slot] = choose_k_;
        choose_k_ = 0;
        NT_CUDA_CHECK(cudaEventRecord(chosen_ready_[slot], stream_), "cudaEventRecord");
        chosen_made_++;
        chosen_count_++;
        tables_[size_t(stride_)]++;  // the choice advanced the first position on the device
    }
}

void CudaBackend::wait() {
    flush();
    NT_CUDA_CHECK(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
}

void CudaBackend::set_graphs(bool on) {
    flush();
    graphs_on_ = on;
    if (!on) drop_graphs();
}

void CudaBackend::set_rope_fusion(bool on) {
    flush();
    rope_fusion_ = on;
    drop_graphs();  // recorded steps hold the other choice
}

void CudaBackend::set_exact_prompt(bool on) {
    flush();
    exact_prompt_ = on;
    mm_->exact = on;
}

void CudaBackend::set_pdl(bool on) {
    flush();
    pdl_allowed_ = on;
    if (mm_) mm_->pdl = on && pdl_supported_;
}

// ---- ops -----------------------------------------------------------------------------------

void CudaBackend::run(const Op& op) {
    const auto f = [&](int i) { return static_cast<float*>(const_cast<void*>(op.p[i])); };
    const size_t B = size_t(stride_);
    const bool x_unchanged = after_matmul_;
    after_matmul_ = op.kind == OpKind::Matmul;
    const int32_t* d_tokens = d_step_;
    int32_t* d_pos = d_step_ + B;
    const int32_t* d_seq = d_step_ + 2 * B;
    const int32_t* d_logit_rows = d_step_ + 3 * B;
    const int32_t* d_dec_rows = d_step_ + 4 * B;
    const TokenDraw* d_draw = reinterpret_cast<const TokenDraw*>(d_step_ + 5 * B);
    const cuda::AttnTile* d_tiles =
        reinterpret_cast<const cuda::AttnTile*>(d_step_ + 5 * B + kDrawInts);
    switch (op.kind) {
        case OpKind::Embed:
            cuda::embed(op.w, d_tokens, fed_token_, n_rows_, f(0), stream_);
            return;
        case OpKind::RmsNorm:
            cuda::rmsnorm(f(0), op.w, op.i0, op.i1, shape_.norm_eps, f(1), stream_);
            return;
        case OpKind::AddRmsNorm: {
            // Decided on the host from the op's fields alone: the same in capture and eager runs.
            cuda::ActivationSlot slot;
            const bool quantize = cuda::matmul_activation_slot(*mm_, op.next, op.i0, op.i1, &slot);
            if (cuda::add_rmsnorm(f(0), f(1), op.w, op.i0, op.i1, shape_.norm_eps, f(2),
                                  quantize ? &slot : nullptr, stream_, mm_->pdl)) {
                cuda::matmul_adopt_activations(*mm_, f(2), op.i0, op.i1, slot);
                after_matmul_ = true;
            }
            return;
        }
        case OpKind::Matmul:
            cuda::matmul(op.w, f(0), op.i0, f(1), *mm_, stream_, x_unchanged);
            return;
        case OpKind::WarmWeights:
            // Sized by warm_weights. Only a launch that goes out before its wait takes them (a
            // programmatic dependent: resident layers, not streamed ones).
            after_matmul_ = x_unchanged;  // no kernel: the activations stay as they were
            mm_->warm = {
                {static_cast<const uint8_t*>(op.w.data), static_cast<const uint8_t*>(op.w2.data)},
                op.n,
                l2_warm_after_};
            return;
        case OpKind::GateUp: {
            // Decided on the host from the op's fields alone, like every matmul choice; with
            // `next` the pair also quantizes gate for the down projection.
            bool quantized = false;
            if (cuda::matmul_swiglu(op.w, op.w2, f(0), op.i0, f(1), *mm_, stream_, x_unchanged,
                                    op.next, &quantized)) {
                after_matmul_ = quantized;
            } else {
                cuda::matmul(op.w, f(0), op.i0, f(1), *mm_, stream_, x_unchanged);
                cuda::matmul(op.w2, f(0), op.i0, f(2), *mm_, stream_, true);
                cuda::swiglu(f(1), f(2), int64_t(op.i0) * op.w.rows, f(1), stream_);
            }
            return;
        }
        case OpKind::Qkv: {
            const WeightView w[3] = {op.w, op.w2, op.w3};
            float* const y[3] = {f(1), f(2), f(3)};
            const cuda::Fork3 fork{{side_[0], side_[1]}, fork_, {join_[0], join_[1]}};
            if (!cuda::matmul_qkv(w, f(0), op.i0, y, *mm_, stream_, fork, x_unchanged))
                for (int i = 0; i < 3; ++i)
                    cuda::matmul(w[i], f(0), op.i0, y[i], *mm_, stream_, x_unchanged || i > 0);
            after_matmul_ = true;
            return;
        }
        case OpKind::Rope:
            cuda::rope(f(0), f(1), d_pos, n_rows_, shape_.n_head, shape_.n_head_kv, shape_.head_dim,
                       n_rot_, rope_inv_freq_, stream_);
            return;
        case OpKind::Attention:
        case OpKind::RopeAttention: {
            const cuda::AttnShape as{shape_.n_head, shape_.n_head_kv, shape_.head_dim, n_ctx_};
            __half* kc = static_cast<__half*>(kv_) + size_t(op.i0) * kv_layer_elems_;
            __half* vc = kc + size_t(shape_.n_layer) * kv_layer_elems_;
            // A step of one decode row: the attention kernel turns q and k and stores the new
            // position itself (one kernel fewer a layer). Decided on the host from the op and the
            // step's shape: the same in capture and replay.
            const bool decode_only = n_dec_ == n_rows_ && n_tiles_ == 0;
            const bool full_rope = op.kind == OpKind::RopeAttention && n_rot_ == shape_.head_dim;
            const bool fuse_rope = full_rope && decode_only && rope_fusion_ &&
                                   cuda::attn_decode_fuses_rope(as, n_dec_);
            const cuda::RopeIn rope_in{f(1), f(2), rope_inv_freq_};
            if (full_rope && !fuse_rope) {
                cuda::rope_kv_store(f(0), f(1), f(2), d_pos, d_seq, n_rows_, shape_.n_head,
                                    shape_.n_head_kv, shape_.head_dim, rope_inv_freq_, n_ctx_, kc,
                                    vc, stream_, mm_->pdl);
            } else if (!full_rope) {
                if (op.kind == OpKind::RopeAttention)
                    cuda::rope(f(0), f(1), d_pos, n_rows_, shape_.n_head, shape_.n_head_kv,
                               shape_.head_dim, n_rot_, rope_inv_freq_, stream_);
                cuda::kv_store(as, f(1), f(2), d_pos, d_seq, n_rows_, kc, vc, stream_);
            }
            // A decode-only step quantizes out for the next matmul in the attention kernel.
            // Decided on the host from the op and the step's shape: the same in capture and replay.
            cuda::ActivationSlot slot;
            const bool quantize =
                op.kind == OpKind::RopeAttention && decode_only &&
                cuda::matmul_activation_slot(*mm_, op.next, n_rows_, as.q_dim(), &slot);
            // One decode row whose o projection is Q6_K: the attention's blocks keep o's CTAs
            // off their multiprocessors. H100, 8B tg128: Q6_K 361.9, 361.8 against 353.7, 353.7
            // (+2.3%; the attention 6.3 us a layer in place against 7.6), but Q4_K_M (its o in
            // Q4_K) -0.7% and Q8_0 -0.3%: there the blocks only start later.
            const bool alone = decode_only && n_dec_ == 1 &&
                               (attn_alone_ == 2 || (attn_alone_ == 1 && op.next == GgmlType::Q6_K));
            if (cuda::attn_decode(as, f(0), kc, vc, d_pos, d_seq, d_dec_rows, n_dec_, splits_,
                                  attn_scratch_, attn_done_, f(3), stream_, 0,
                                  quantize ? &slot : nullptr, mm_->pdl,
                                  fuse_rope ? &rope_in : nullptr, alone)) {
                cuda::matmul_adopt_activations(*mm_, f(3), n_rows_, as.q_dim(), slot);
                after_matmul_ = true;
            }
            cuda::attn_prefill(as, f(0), kc, vc, d_tiles, n_tiles_, f(3), stream_, exact_prompt_);
            return;
        }
        case OpKind::Swiglu:
            cuda::swiglu(f(0), f(1), op.n, f(2), stream_);
            return;
        case OpKind::Add:
            cuda::add(f(0), f(1), op.n, stream_);
            return;
        case OpKind::Gather:
            cuda::gather_rows(f(0), op.i0, d_logit_rows, n_logits_, f(1), stream_);
            return;
        case OpKind::Choose: {
            const cuda::LogitChoice c{.fed = fed_token_,
                                      .count = chosen_on_device_,
                                      .ring = h_chosen_on_device_,
                                      .ring_size = kMaxChosen,
                                      .pos = d_pos,
                                      .draw = d_draw};
            if (op.i0 == kChooseWhole)
                cuda::logit_choose_whole(
                    acts_.logits, shape_.n_vocab, sel_keys_, sel_nan_,
                    cuda::WholeDrawScratch{whole_run_sums_, whole_block_sums_, whole_rows_}, c,
                    stream_);
            else
                cuda::logit_choose(acts_.logits, shape_.n_vocab, op.i0, sel_keys_, sel_nan_, c,
                                   stream_);
            return;
        }
    }
}

void CudaBackend::embed(const WeightView& tok_embd, float* x) {
    require_init("embed");
    if (tok_embd.cols != shape_.n_embd)
        fail("token embedding rows have %lld values, the model has n_embd = %d.",
             (long long)tok_embd.cols, shape_.n_embd);
    if (tok_embd.rows < shape_.n_vocab)
        fail("token embedding table has %lld rows for a vocabulary of %d.",
             (long long)tok_embd.rows, shape_.n_vocab);
    if (!cuda::elementwise_supports(tok_embd.type))
        fail("token embeddings of type %s are not supported by the CUDA backend.",
             type_name(tok_embd.type));
    Op op;
    op.kind = OpKind::Embed;
    op.w = tok_embd;
    op.p[0] = x;
    submit(op);
}

namespace {
void check_norm_weight(const WeightView& w, int dim) {
    if (w.cols * w.rows < dim)
        fail("norm weight has %lld values for rows of %d.", (long long)(w.cols * w.rows), dim);
    if (!cuda::elementwise_supports(w.type))
        fail("norm weights of type %s are not supported by the CUDA backend.", type_name(w.type));
}
}  // namespace

void CudaBackend::rmsnorm(const float* x, const WeightView& w, int n, int dim, float* out) {
    require_init("rmsnorm");
    check_norm_weight(w, dim);
    Op op;
    op.kind = OpKind::RmsNorm;
    op.w = w;
    op.i0 = n;
    op.i1 = dim;
    op.p[0] = x;
    op.p[1] = out;
    submit(op);
}

void CudaBackend::add_rmsnorm(float* x, const float* y, const WeightView& w, int n, int dim,
                              float* out, GgmlType next) {
    require_init("add_rmsnorm");
    check_norm_weight(w, dim);
    Op op;
    op.kind = OpKind::AddRmsNorm;
    op.w = w;
    op.i0 = n;
    op.i1 = dim;
    op.p[0] = x;
    op.p[1] = y;
    op.p[2] = out;
    op.next = next;
    submit(op);
}

void CudaBackend::matmul(const WeightView& w, const float* x, int n, float* y) {
    require_init("matmul");
    Op op;
    op.kind = OpKind::Matmul;
    op.w = w;
    op.i0 = n;
    op.p[0] = x;
    op.p[1] = y;
    submit(op);
}

void CudaBackend::qkv(const WeightView& wq, const WeightView& wk, const WeightView& wv,
                      const float* x, int n, float* q, float* k, float* v) {
    require_init("qkv");
    Op op;
    op.kind = OpKind::Qkv;
    op.w = wq;
    op.w2 = wk;
    op.w3 = wv;
    op.i0 = n;
    op.p[0] = x;
    op.p[1] = q;
    op.p[2] = k;
    op.p[3] = v;
    submit(op);
}

void CudaBackend::rope(float* q, float* k) {
    require_init("rope");
    Op op;
    op.kind = OpKind::Rope;
    op.p[0] = q;
    op.p[1] = k;
    submit(op);
}

void CudaBackend::attention(int layer, const float* q, const float* k, const float* v, float* out) {
    attention_op(OpKind::Attention, layer, q, k, v, out, GgmlType::F32);
}

void CudaBackend::rope_attention(int layer, float* q, float* k, const float* v, float* out,
                                 GgmlType next) {
    attention_op(OpKind::RopeAttention, layer, q, k, v, out, next);
}

void CudaBackend::attention_op(OpKind kind, int layer, const float* q, const float* k,
                               const float* v, float* out, GgmlType next) {
    require_init("attention");
    if (layer < 0 || layer >= shape_.n_layer)
        fail("attention: layer %d of %d.", layer, shape_.n_layer);
    Op op;
    op.kind = kind;
    op.i0 = layer;
    op.p[0] = q;
    op.p[1] = k;
    op.p[2] = v;
    op.p[3] = out;
    op.next = next;
    submit(op);
}

void CudaBackend::swiglu(const float* gate, const float* up, int64_t n, float* out) {
    require_init("swiglu");
    Op op;
    op.kind = OpKind::Swiglu;
    op.n = n;
    op.p[0] = gate;
    op.p[1] = up;
    op.p[2] = out;
    submit(op);
}

void CudaBackend::ffn_gate_up(const WeightView& w_gate, const WeightView& w_up, const float* x,
                              int n, float* gate, float* up, GgmlType next) {
    require_init("ffn_gate_up");
    if (w_gate.rows != w_up.rows || w_gate.cols != w_up.cols)
        fail("ffn gate (%lld x %lld) and up (%lld x %lld) projections differ in shape.",
             (long long)w_gate.rows, (long long)w_gate.cols, (long long)w_up.rows,
             (long long)w_up.cols);
    Op op;
    op.kind = OpKind::GateUp;
    op.w = w_gate;
    op.w2 = w_up;
    op.i0 = n;
    op.p[0] = x;
    op.p[1] = gate;
    op.p[2] = up;
    op.next = next;
    submit(op);
}

// By default, as measured (H100, against none, the same binary): Q6_K's 16 MiB each (8B tg128,
// forty-third session: +1.7%; 4 MiB +1.1%); the other types an eighth of each matrix, which is
// what won at both sizes measured in Q4_K. 8B's gate and up (33 MB) at 4 MiB +0.7%, 8 MiB +0.4%,
// 16 MiB -0.3% (forty-third session). 70B's (132 MB) at 16 MiB and more (the cap) +1.2%, 12 MiB
// +0.9%, 8 MiB +0.6%, 4 MiB (the old default) +0.4% (tg64, 65.17-65.21 against 64.40;
// fifty-fourth session). Q8_0's o projection at 8B (4096 rows) is not in the TMA form, so
// nothing is requested there. At most a third of the L2 cache each, and whole 16-byte units of
// 16-byte aligned weights, as the bulk requests need.
int64_t cuda::l2_warm_bytes(const WeightView& a, const WeightView& b, int64_t setting, int64_t l2) {
    constexpr int64_t MiB = int64_t(1) << 20;
    auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    if (!aligned(a.data) || !aligned(b.data)) return 0;
    const int64_t want = setting >= 0               ? setting
                         : a.type == GgmlType::Q6_K ? 16 * MiB
                                                    : int64_t(a.nbytes) / 8;
    return std::min<int64_t>({want, l2 / 3, int64_t(a.nbytes), int64_t(b.nbytes)}) / 16 * 16;
}

void CudaBackend::warm_weights(const WeightView& a, const WeightView& b) {
    require_init("warm_weights");
    const int64_t bytes = cuda::l2_warm_bytes(a, b, l2_warm_, cuda::detail::device_limits().l2);
    if (bytes <= 0) return;
    Op op;
    op.kind = OpKind::WarmWeights;
    op.n = bytes;
    op.w = a;
    op.w2 = b;
    submit(op);
}

void CudaBackend::add(float* x, const float* y, int64_t n) {
    require_init("add");
    Op op;
    op.kind = OpKind::Add;
    op.n = n;
    op.p[0] = x;
    op.p[1] = y;
    submit(op);
}

void CudaBackend::gather_logit_rows(const float* x, int dim, float* dst) {
    require_init("gather_logit_rows");
    // Rows are whole: dst must be x itself or lie clear of the rows it reads.
    const float* x_end = x + int64_t(n_rows_) * dim;
    const float* d_end = dst + int64_t(n_logits_) * dim;
    if (dst != x && dst < x_end && x < d_end)
        fail("gather_logit_rows: destination overlaps the source rows.");
    Op op;
    op.kind = OpKind::Gather;
    op.i0 = dim;
    op.p[0] = x;
    op.p[1] = dst;
    submit(op);
}

void CudaBackend::download(const float* src, float* host_dst, size_t n) {
    flush();
    if (n == 0) return;
    if (!h_download_) {  // download before init(): plain copy
        NT_CUDA_CHECK(
            cudaMemcpyAsync(host_dst, src, n * sizeof(float), cudaMemcpyDeviceToHost, stream_),
            "cudaMemcpyAsync download");
        NT_CUDA_CHECK(cudaStreamSynchronize(stream_), "cudaStreamSynchronize download");
        return;
    }
    // Through the pinned bounce buffer: pageable destinations copy at a fraction of the speed.
    const size_t total = n * sizeof(float);
    for (size_t off = 0; off < total; off += kDownloadChunk) {
        const size_t len = std::min(kDownloadChunk, total - off);
        NT_CUDA_CHECK(cudaMemcpyAsync(h_download_, reinterpret_cast<const char*>(src) + off, len,
                                      cudaMemcpyDeviceToHost, stream_),
                      "cudaMemcpyAsync download");
        NT_CUDA_CHECK(cudaStreamSynchronize(stream_), "cudaStreamSynchronize download");
        std::memcpy(reinterpret_cast<char*>(host_dst) + off, h_download_, len);
    }
}

void CudaBackend::select_logits(const float* logits, int n_vocab,
                                const std::vector<LogitRequest>& req,
                                std::vector<LogitCandidates>& out) {
    require_init("select_logits");
    flush();
    int most = 1;
    for (const LogitRequest& r : req) {
        check_logit_request(n_vocab, r);
        if (r.row < 0 || r.row >= max_batch_)
            fail("logit selection: row %d does not exist (the logits hold %d rows).", r.row,
                 max_batch_);
        most = std::max(most, r.k);
    }
    if (n_vocab != shape_.n_vocab || !cuda::logit_select_fits(n_vocab, most)) {
        Backend::select_logits(logits, n_vocab, req, out);  // copies the rows
        return;
    }
    // sel_rows_ rows at a time, each batch in one pair of launches.
    out.resize(req.size());
    for (size_t first = 0; first < req.size(); first += size_t(sel_rows_)) {
        const size_t n = std::min(req.size() - first, size_t(sel_rows_));
        int batch_most = 1;
        for (size_t i = 0; i < n; i++) {
            const LogitRequest& r = req[first + i];
            cuda::LogitAsk& a = h_asks_[i];
            a.row = r.row;
            a.m = r.k;
            a.ids.n = int(r.ids.size());
            std::copy(r.ids.begin(), r.ids.end(), a.ids.id);
            batch_most = std::max(batch_most, r.k);
        }
        NT_CUDA_CHECK(cudaMemcpyAsync(sel_asks_, h_asks_, n * sizeof(cuda::LogitAsk),
                                      cudaMemcpyHostToDevice, stream_),
                      "cudaMemcpyAsync logit selection asks");
        cuda::logit_select(logits, n_vocab, sel_asks_, int(n), batch_most, sel_keys_, sel_nan_,
                           sel_out_, stream_);
        NT_CUDA_CHECK(cudaMemcpyAsync(h_sel_, sel_out_, n * sizeof(cuda::LogitSelection),
                                      cudaMemcpyDeviceToHost, stream_),
                      "cudaMemcpyAsync logit selection");
        NT_CUDA_CHECK(cudaStreamSynchronize(stream_), "cudaStreamSynchronize logit selection");
        for (size_t i = 0; i < n; i++) {
            const LogitRequest& r = req[first + i];
            cuda::logit_selection_unpack(h_sel_[i], std::min(r.k, n_vocab), int(r.ids.size()),
                                         out[first + i]);
        }
    }
}

int32_t CudaBackend::take_token(LogitCandidates* from, std::vector<float>* row) {
    require_init("take_token");
    if (chosen_count_ == 0) fail("take_token: no token was chosen.");
    const int slot = int((chosen_made_ - chosen_count_) % kMaxChosen);
    chosen_count_--;
    NT_CUDA_CHECK(cudaEventSynchronize(chosen_ready_[slot]), "cudaEventSynchronize chosen token");
    const cuda::LogitSelection& sel = h_chosen_[slot];
    if (sel.nan || sel.key[0] == 0)
        fail("the logits contain NaN; the model produced invalid values.");
    if (chosen_k_[slot] == kChooseWhole) {
        if (from) *from = LogitCandidates{};
        if (row) {
            // The row this choice copied into its slot, which no step rewrites until it is taken.
            const size_t V = size_t(shape_.n_vocab);
            NT_CUDA_CHECK(cudaMemcpyAsync(h_row_, whole_rows_ + size_t(slot) * V, V * sizeof(float),
                                          cudaMemcpyDeviceToHost, copy_stream_),
                          "cudaMemcpyAsync drawn row");
            NT_CUDA_CHECK(cudaStreamSynchronize(copy_stream_), "cudaStreamSynchronize drawn row");
            row->assign(h_row_, h_row_ + V);
        }
    } else if (from) {
        cuda::logit_selection_unpack(sel, chosen_k_[slot], 0, *from);
    }
    return sel.token;
}

void CudaBackend::kv_truncate(int seq, int from) {
    require_init("kv_truncate");
    if (seq < 0 || seq >= n_seq_) fail("sequence id %d is out of range (0..%d).", seq, n_seq_ - 1);
    if (from < 0 || from > n_ctx_)
        fail("kv_truncate: position %d is outside the context of %d tokens.", from, n_ctx_);
    // Nothing to do on the device: cells are addressed by (sequence, position), attention
    // reads only positions up to the row's own, and a step stores its rows before reading.
}

void CudaBackend::upload(void* dst, const void* host_src, size_t bytes) {
    flush();
    if (bytes == 0) return;
    NT_CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream_),
                  "cudaMemcpyAsync upload");
    NT_CUDA_CHECK(cudaStreamSynchronize(stream_), "cudaStreamSynchronize upload");
}

// ---- weights -------------------------------------------------------------------------------

void CudaBackend::reserve_weights(size_t total_bytes) {
    if (total_bytes == 0) return;
    size_t free_b = 0, total_b = 0;
    NT_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
    if (total_bytes + kHeadroom > free_b)
        fail(
            "not enough GPU memory for the weights: need %.2f GiB, %.2f GiB free on %s; use a "
            "smaller model or "
            "quantization, or a smaller context (-c).",
            gib(total_bytes), gib(free_b), dev_.name.c_str());
    // Each tensor is rounded up to 256 bytes: 1 MiB covers 4096 tensors (a 70B model has 723);
    // a tensor past the end gets its own allocation.
    const size_t size = total_bytes + (size_t(1) << 20);
    Arena a;
    a.base = static_cast<char*>(device_alloc(size, "the weights", kAdviceWeights));
    a.size = size;
    arenas_.push_back(a);
}

void* CudaBackend::alloc_weight(size_t bytes) {
    const size_t need = weight_footprint(bytes);
    for (Arena& a : arenas_) {
        if (a.size - a.used >= need) {
            void* p = a.base + a.used;
            a.used += need;
            return p;
        }
    }
    void* p = device_alloc(need, "the weights", kAdviceWeights);
    weight_allocs_.push_back(p);
    return p;
}

const void* CudaBackend::upload_weight(const void* host, size_t nbytes) {
    if (nbytes == 0) return nullptr;
    flush();
    // Every call copies: the engine uploads tied embeddings once itself, and a host pointer
    // says nothing about contents (a freed buffer's address is reused).
    char* dst = static_cast<char*>(alloc_weight(nbytes));
    if (!h_upload_[0])
        for (void*& b : h_upload_)
            NT_CUDA_CHECK(cudaMallocHost(&b, kUploadChunk), "cudaMallocHost upload");
    // Two pinned buffers: the CPU fills one while the copy engine drains the other.
    for (size_t off = 0, i = 0; off < nbytes; off += kUploadChunk, i++) {
        const size_t len = std::min(kUploadChunk, nbytes - off);
        const int b = int(i & 1);
        NT_CUDA_CHECK(cudaEventSynchronize(upload_done_[b]), "cudaEventSynchronize upload");
        std::memcpy(h_upload_[b], static_cast<const char*>(host) + off, len);
        NT_CUDA_CHECK(
            cudaMemcpyAsync(dst + off, h_upload_[b], len, cudaMemcpyHostToDevice, copy_stream_),
            "cudaMemcpyAsync weights");
        NT_CUDA_CHECK(cudaEventRecord(upload_done_[b], copy_stream_), "cudaEventRecord upload");
    }
    NT_CUDA_CHECK(cudaStreamSynchronize(copy_stream_), "cudaStreamSynchronize weights");
    return dst;
}

double CudaBackend::measure_read_bandwidth() {
    flush();
    size_t free_b = 0, total_b = 0;
    NT_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
    // Far larger than L2 (50 MB on an H100/H200), well inside what is free.
    size_t bytes =
        std::min<size_t>(size_t(1) << 30, free_b / 4) / (size_t(16) << 20) * (size_t(16) << 20);
    if (bytes < (size_t(64) << 20)) return 0;
    const int blocks = dev_.sm_count * 4;
    void* buf = nullptr;
    uint32_t* sink = nullptr;
    NT_CUDA_CHECK(cudaMalloc(&buf, bytes), "cudaMalloc bandwidth buffer");
    double best = 0;
    cudaEvent_t e0 = nullptr, e1 = nullptr;
    try {
        NT_CUDA_CHECK(cudaMalloc(&sink, size_t(blocks) * sizeof(uint32_t)),
                      "cudaMalloc bandwidth sink");
        NT_CUDA_CHECK(cudaMemsetAsync(buf, 1, bytes, stream_), "cudaMemsetAsync bandwidth buffer");
        NT_CUDA_CHECK(cudaEventCreate(&e0), "cudaEventCreate");
        NT_CUDA_CHECK(cudaEventCreate(&e1), "cudaEventCreate");
        cuda::read_bandwidth_kernel(buf, bytes, sink, blocks, stream_);  // warm-up
        for (int r = 0; r < 5; r++) {
            NT_CUDA_CHECK(cudaEventRecord(e0, stream_), "cudaEventRecord");
            cuda::read_bandwidth_kernel(buf, bytes, sink, blocks, stream_);
            NT_CUDA_CHECK(cudaEventRecord(e1, stream_), "cudaEventRecord");
            NT_CUDA_CHECK(cudaEventSynchronize(e1), "cudaEventSynchronize");
            float ms = 0;
            NT_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1), "cudaEventElapsedTime");
            if (ms > 0) best = std::max(best, double(bytes) / (double(ms) * 1e-3) / 1e9);
        }
    } catch (...) {
        cudaFree(buf);
        if (sink) cudaFree(sink);
        if (e0) cudaEventDestroy(e0);
        if (e1) cudaEventDestroy(e1);
        throw;
    }
    cudaFree(buf);
    cudaFree(sink);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return best;
}

}  // namespace nt
