// The narrow door between the model and the hardware. The model code calls these ops on
// activations and weight views; it never learns where the weights live or which device runs
// the arithmetic. Pointers passed to a backend are in that backend's memory (host memory for
// the CPU backend, device memory for CUDA).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "quant/types.h"

namespace nt {

// A weight matrix of `rows` rows of `cols` elements (ggml's ne1 x ne0), stored row-major in
// GGML blocks. Vectors (norm weights) have rows == 1.
// Attention's softmax and P*V go in chunks of this many positions from position 0, summed in
// float inside a chunk and in double across chunks (CpuBackend::attention has the arithmetic,
// which every backend's decode path reproduces bit for bit).
constexpr int kAttnChunk = 64;
// The largest head size a model may have (llama_load checks it).
constexpr int kAttnMaxHd = 1024;

struct WeightView {
    GgmlType type = GgmlType::F32;
    int64_t cols = 0;
    int64_t rows = 0;
    const void* data = nullptr;
    size_t nbytes = 0;
};

// A batch token that is the one the backend chose on the device at the end of the step before
// (Batch::choose, Backend::feeds_tokens()).
constexpr int32_t kFedToken = -1;

// How a step's token is drawn on the device (Batch::choose): the sampler's chain in llama.cpp's
// order (top-k, top-p, min-p, temperature, draw) over the row's top_k best logits, as
// Sampler::sample draws it; top_k 0 (top_p then 1): over the whole vocabulary, min-p a floor,
// as vocab_draw.h says; greedy (the best token) when temperature <= 0. log_min_p is the
// host's logf(min_p) (unused when min_p is 0); u the draw's uniform in [0, 1), drawn on the
// host (Sampler::peek_uniform). Before the chain, bias[i] is added to the logit of token
// bias_id[i] (i < n_bias, in order, as Sampler::sample adds a logit bias).
constexpr int kMaxDrawBias = 16;
struct TokenDraw {
    int top_k = 1;
    float temperature = 0.f, top_p = 1.f, min_p = 0.f, log_min_p = 0.f;
    double u = 0.0;
    int n_bias = 0;
    int32_t bias_id[kMaxDrawBias] = {};
    float bias[kMaxDrawBias] = {};
};

// One step's batch: entry i is token `tokens[i]` of sequence `seq[i]` at position `pos[i]`.
// Entries of one sequence appear in increasing position order. Logits are produced for the
// entries whose `want_logits` flag is set, in batch order.
struct Batch {
    std::vector<int32_t> tokens;
    std::vector<int32_t> pos;
    std::vector<int32_t> seq;
    std::vector<uint8_t> want_logits;
    // Decoding with no round trip between steps (Backend::feeds_tokens()): the step ends by
    // drawing a token from its first logit row on the device as `draw` says, where the next
    // step may name it kFedToken; Backend::take_token() returns it on the host.
    bool choose = false;
    TokenDraw draw;
    int size() const { return int(tokens.size()); }
    int n_logits() const;
    void clear();
    void add(int32_t token, int32_t position, int32_t sequence, bool logits);
};

struct RopeParams {
    int n_rot = 0;  // rotated dims per head (== head_dim for Llama)
    float freq_base = 10000.f;
    float freq_scale = 1.f;  // linear scaling (1/factor)
    // Llama 3.1 scaling: per-dimension frequency factors (rope_freqs.weight or computed from
    // rope.scaling.* keys); empty when absent. Size n_rot / 2. Frequencies are divided by them.
    std::vector<float> freq_factors;
};

// Shapes a backend needs to size its scratch and KV cache.
struct ModelShape {
    int n_embd = 0, n_layer = 0, n_head = 0, n_head_kv = 0, head_dim = 0, n_ff = 0, n_vocab = 0;
    float norm_eps = 1e-5f;
    RopeParams rope;
};

// Activation buffers for one step, allocated by the backend for a maximum batch size.
// Layout: row-major [batch][width].
struct Activations {
    int max_batch = 0;
    float* x = nullptr;       // residual stream [B][n_embd]
    float* xn = nullptr;      // normed input     [B][n_embd]
    float* q = nullptr;       // [B][n_head*head_dim]
    float* k = nullptr;       // [B][n_head_kv*head_dim]
    float* v = nullptr;       // [B][n_head_kv*head_dim]
    float* att = nullptr;     // attention output [B][n_head*head_dim]
    float* gate = nullptr;    // [B][n_ff]
    float* up = nullptr;      // [B][n_ff]
    float* logits = nullptr;  // [n_logits][n_vocab]
};

// The one order of candidate tokens everywhere (sampler, logit selection): higher logit first,
// the lower id on ties. C has .logit and .id.
template <typename C>
bool ranks_before(const C& a, const C& b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

// What a sampler needs of one logit row, so that a device backend copies back a few hundred
// bytes instead of the row (Backend::select_logits): the k best logits, and the logits of `ids`
// (the tokens whose logits the sampler changes: penalties, biases).
struct LogitRequest {
    int row = 0;  // logit row of the step just run (the order of the flagged batch entries)
    int k = 0;    // 1 .. kMaxLogitCandidates - ids.size()
    std::vector<int32_t> ids;
};
constexpr int kMaxLogitCandidates = 256;  // k + ids.size()

// The answer: top_id/top_logit are the k best of the row, best first, by the one order the
// sampler uses (higher logit first, the lower id on ties; min(k, n_vocab) of them); id_logit[i]
// is the logit of ids[i]; nan says the row holds a NaN (which no candidate is).
struct LogitCandidates {
    std::vector<int32_t> top_id;
    std::vector<float> top_logit;
    std::vector<float> id_logit;
    bool nan = false;
};

// Throws nt::Error unless 1 <= k, k + ids.size() <= kMaxLogitCandidates and every id is a token.
void check_logit_request(int n_vocab, const LogitRequest& req);
// The selection on the host, over a row in host memory: the reference every backend matches.
void select_logits_host(const float* row, int n_vocab, const LogitRequest& req,
                        LogitCandidates& out);

class Backend {
  public:
    virtual ~Backend() = default;
    virtual std::string name() const = 0;

    // Sizes scratch for `max_batch` entries and a KV cache of n_seq sequences x n_ctx positions
    // (F16). Throws nt::Error when it cannot fit, saying how much is missing.
    virtual void init(const ModelShape& shape, int max_batch, int n_seq, int n_ctx) = 0;
    virtual Activations& acts() = 0;

    // Makes this batch the current step (uploads tokens/positions/sequences as needed).
    virtual void begin_step(const Batch& batch) = 0;

    // x[i] = embedding row of token i of the current batch.
    virtual void embed(const WeightView& tok_embd, float* x) = 0;
    // out[i] = x[i] / rms(x[i]) * w, for n rows of width `dim`.
    virtual void rmsnorm(const float* x, const WeightView& w, int n, int dim, float* out) = 0;
    // The residual add and the norm after it: x += y (skipped when y is null), then
    // rmsnorm(x, w, n, dim, out). `next` is the type of the weight the next matmul on `out`
    // multiplies: a hint that lets a backend prepare out for it (the CUDA backend quantizes
    // out in the same kernel). out may be x or y.
    virtual void add_rmsnorm(float* x, const float* y, const WeightView& w, int n, int dim,
                             float* out, GgmlType /*next*/) {
        if (y) add(x, y, int64_t(n) * dim);
        rmsnorm(x, w, n, dim, out);
    }
    // y[i][r] = sum_c W[r][c] * x[i][c] for n rows of x. Small n is a GEMV, large n a GEMM.
    virtual void matmul(const WeightView& w, const float* x, int n, float* y) = 0;
    // The attention block's three projections of one normed input: q = wq x, k = wk x,
    // v = wv x. One call, so a backend may run them concurrently (they are independent and each
    // too small to fill a large GPU alone at decode). No output may alias x.
    virtual void qkv(const WeightView& wq, const WeightView& wk, const WeightView& wv,
                     const float* x, int n, float* q, float* k, float* v) {
        matmul(wq, x, n, q);
        matmul(wk, x, n, k);
        matmul(wv, x, n, v);
    }
    // Rotary embedding in place on q [B][n_head][head_dim] and k [B][n_head_kv][head_dim],
    // adjacent pairs (GGML's "normal" rope, which Llama GGUF files expect).
    virtual void rope(float* q, float* k) = 0;
    // Stores k and v of the current batch into layer `layer`'s cache, then computes causal
    // attention of every q row over its sequence's cached positions 0..pos (GQA).
    virtual void attention(int layer, const float* q, const float* k, const float* v,
                           float* out) = 0;
    // rope(q, k), then attention(layer, q, k, v, out): one call, so a backend may turn k on its
    // way into the cache, or turn q and k inside its attention kernel and leave them as they
    // were (callers read neither afterwards). `next`: the type of the weight the next matmul on
    // `out` multiplies (a hint, as for add_rmsnorm: the CUDA backend quantizes out for it in the
    // attention kernel).
    virtual void rope_attention(int layer, float* q, float* k, const float* v, float* out,
                                GgmlType /*next*/) {
        rope(q, k);
        attention(layer, q, k, v, out);
    }
    // out[i] = silu(gate[i]) * up[i], n elements.
    virtual void swiglu(const float* gate, const float* up, int64_t n, float* out) = 0;
    // The feed-forward's first half: gate = silu(w_gate x) * (w_up x) for n rows of x; `up`
    // is scratch of n x w_up.rows floats (a backend that fuses the two projections and the
    // SwiGLU need not touch it). Neither may alias x. `next`: the type of the weight the next
    // matmul on gate multiplies (a hint, as for add_rmsnorm).
    virtual void ffn_gate_up(const WeightView& w_gate, const WeightView& w_up, const float* x,
                             int n, float* gate, float* up, GgmlType /*next*/) {
        matmul(w_gate, x, n, gate);
        matmul(w_up, x, n, up);
        swiglu(gate, up, int64_t(n) * w_gate.rows, gate);
    }
    // A hint: the step reads a and b soon, after work that leaves memory bandwidth idle (the
    // attention); a backend may start reading them into a cache with the next matmul.
    virtual void warm_weights(const WeightView& /*a*/, const WeightView& /*b*/) {}
    // x += y, n elements.
    virtual void add(float* x, const float* y, int64_t n) = 0;
    // Copies the rows of x whose want_logits is set to the first rows of dst (compacting).
    virtual void gather_logit_rows(const float* x, int dim, float* dst) = 0;
    // Copies n floats from backend memory to host memory (waits for pending work).
    virtual void download(const float* src, float* host_dst, size_t n) = 0;
    // The candidates of each request from the logit rows of the step just run (`logits`, rows
    // of n_vocab), as select_logits_host computes them; waits for pending work. This default
    // copies each row to the host; a device backend selects in place and copies back only the
    // candidates. Throws nt::Error on a request out of range.
    virtual void select_logits(const float* logits, int n_vocab,
                               const std::vector<LogitRequest>& req,
                               std::vector<LogitCandidates>& out);
    // Forgets a sequence's cached positions from `from` on (they will be rewritten).
    virtual void kv_truncate(int seq, int from) = 0;

    // Weight memory: the CPU backend uses the mapped file directly; a GPU backend uploads.
    // reserve_weights is called once with the total before any upload, so a model that does not
    // fit fails with a clear sentence before anything is copied.
    virtual void reserve_weights(size_t /*total_bytes*/) {}
    virtual const void* upload_weight(const void* host, size_t nbytes) = 0;
    virtual void end_step() {}
    // Waits for the work enqueued so far (a device backend runs it asynchronously).
    virtual void wait() {}

    // Decoding with no round trip between steps, where feeds_tokens(): a step whose batch says
    // `choose` ends by drawing a token from logit row 0 on the device (Batch::draw); the next
    // step may name that token kFedToken, so it is enqueued before the choice is known on the
    // host. take_token() returns the oldest choice not yet taken, waiting for it (throws
    // nt::Error when its row held a NaN); `from`, when given, receives the candidates it was
    // drawn from (select_logits' answer to a request of k = the draw's top_k), so that the
    // host can check the draw against its own sampler; a draw over the whole vocabulary
    // (top_k 0) has no candidates: `row`, when given, receives the row instead (as the step
    // produced it, before the draw's bias). At most kMaxChosen choices are outstanding.
    static constexpr int kMaxChosen = 4;
    virtual bool feeds_tokens() const { return false; }
    virtual int32_t take_token(LogitCandidates* from = nullptr, std::vector<float>* row = nullptr);

    // Measured streaming-read bandwidth of the memory the weights live in, GB/s (the decode
    // roofline's denominator); 0 when the backend cannot measure it.
    virtual double measure_read_bandwidth() { return 0; }

    // Whether every step, prompts included, computes the CPU backend's arithmetic (the CPU
    // backend is its definition; a GPU backend's decode steps always do, its prompts when set
    // to: --exact). Reported with benchmarks, whose prompt speed depends on it.
    virtual bool exact() const { return true; }
};

}  // namespace nt
