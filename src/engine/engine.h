// The engine: a loaded model (file, hyperparameters, weights, tokenizer) bound to a backend,
// with a KV cache for a number of sequences. Front ends (CLI, C API, server) drive it through
// eval() and the generation helpers; scheduling of many sequences lives in the server.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "engine/sampler.h"
#include "gguf/gguf.h"
#include "memory/planner.h"
#include "memory/stream_device.h"
#include "model/llama.h"
#include "tokenizer/tokenizer.h"

namespace nt {

namespace mem {
class WeightStreamer;
struct CuFileApi;
}  // namespace mem

// A validated model file: everything but the backend.
struct Model {
    std::unique_ptr<GgufFile> file;
    LlamaHParams hp;
    ModelWeights weights;  // views into the mapped file
    std::unique_ptr<Tokenizer> tokenizer;

    static std::unique_ptr<Model> load(const std::string& path);  // throws nt::Error
};

// Where weights may live (docs/BENCHMARKS.md, "Tiered memory and streaming"): budgets for the
// tier planner and the streaming pipeline's knobs. Only used when the backend can stream.
struct MemoryOptions {
    uint64_t vram_budget = mem::kAuto;  // bytes on the GPU: KV, scratch, weights, slots
    uint64_t ram_budget = mem::kAuto;   // pinned host bytes for streamed layers and staging
    int slots = 0;                      // VRAM ring slots (0: default)
    int prefetch = 0;                   // disk read-ahead in layers = staging buffers (0: default)
    int io_threads = 8;                 // disk reads in flight
    bool direct_io = true;              // O_DIRECT for the disk tier
    bool gds = false;           // GPUDirect Storage (cuFile) for the disk tier, where it works
    bool force_stream = false;  // stream even when everything fits (tests)
    bool trace = false;         // keep a Chrome trace of the pipeline
    std::vector<mem::Tier> forced_tiers;  // tests: this placement instead of the planner's
    const mem::CuFileApi* gds_api_for_testing = nullptr;  // tests: instead of libcufile
    // Fallbacks decided while running (one sentence each); front ends print them.
    std::function<void(const std::string&)> notify;
};

struct EngineOptions {
    int n_ctx = 0;            // 0: the model's training context, capped at 4096
    int n_seq = 1;            // sequences sharing the KV cache
    int max_batch = 512;      // tokens per forward step (prompt chunk size)
    bool logits_all = false;  // size the logits buffer for every row of a full batch
    MemoryOptions memory;
    // The device side of weight streaming for the backend (make_cuda_stream_device for CUDA),
    // called before the backend's init. Unset, or returning null: every weight is uploaded.
    std::function<std::unique_ptr<mem::StreamDevice>(Backend&)> stream_device;
};

// What the tier planner decided and what was measured for it (Engine::memory()).
struct MemoryReport {
    bool planned = false;  // a stream device was there to plan with
    mem::PlanInput input;  // sizes, budgets and bandwidths the plan was made from
    mem::TierPlan plan;    // after any fallback (layers that could not be pinned)
    std::string text;      // describe_plan() and the fallback notices
};

class ThreadPool;

class Engine {
  public:
    Engine(Model& model, std::unique_ptr<Backend> backend, const EngineOptions& opt);
    ~Engine();

    Model& model() { return model_; }
    Backend& backend() { return *backend_; }
    int n_ctx() const { return n_ctx_; }
    int max_batch() const { return max_batch_; }
    int n_vocab() const { return model_.hp.shape.n_vocab; }

    // One forward step; logits of the flagged rows are copied to `logits` ([n][n_vocab]).
    void eval(const Batch& batch, std::vector<float>& logits);
    // One forward step whose logits stay in the backend (acts().logits); nothing is waited for.
    void forward(const Batch& batch);
    // The next token of `sampler` from logit row `row` of the step just run: the backend copies
    // back only the candidates the sampler asks for (Sampler::request), or the row where it
    // needs the row. `bias` (token, value) is added to those logits first (tokens outside the
    // vocabulary are ignored).
    int32_t sample(Sampler& sampler, int row = 0,
                   const std::vector<std::pair<int32_t, float>>& bias = {});
    // sample() for several rows of the step just run: the rows that need only candidates ask
    // the backend in one selection (one wait for a device). A draw that fails gets token -1 and
    // its error's sentence; the others go on.
    struct Draw {
        Sampler* sampler = nullptr;
        int row = 0;
        const std::vector<std::pair<int32_t, float>>* bias = nullptr;  // may be null
        // Draw from the whole row and leave it, biased, in `logits` (log-probabilities).
        bool whole_row = false;
        std::vector<float> logits;
        int32_t token = -1;
        std::string error;
    };
    void sample_rows(std::vector<Draw>& draws);
    // Whether greedy decoding may enqueue each step before the host knows its token
    // (Backend::feeds_tokens, and every weight resident).
    bool pipelines() const;
    // Logit row `row` of the step just run, copied to the host.
    void logits_row(int row, std::vector<float>& out);

    const MemoryReport& memory() const { return memory_; }
    // The streaming pipeline (stats, trace); null when every layer is resident.
    mem::WeightStreamer* streamer() { return streamer_; }

    // Feeds `tokens` of sequence `seq` starting at position `pos` in chunks of max_batch; the
    // logits after the last token stay in the backend (logit row 0). `draw`: the last step
    // draws its token on the device so (Batch::choose; needs pipelines()). Throws nt::Error
    // past the context.
    void feed(int seq, int pos, const std::vector<int32_t>& tokens,
              const TokenDraw* draw = nullptr);
    // feed(), then returns the logits after the last token.
    std::vector<float> prefill(int seq, int pos, const std::vector<int32_t>& tokens);

  private:
    // Uploads every weight (the resident path) or plans tiers and builds the streamer.
    void place_weights(const EngineOptions& opt, std::unique_ptr<mem::StreamDevice> dev);

    Model& model_;
    std::unique_ptr<Backend> backend_;
    std::unique_ptr<mem::StreamDevice> stream_dev_;  // outlives the streamer in source_
    ModelWeights weights_;                           // views in the backend's memory
    std::unique_ptr<WeightSource> source_;
    mem::WeightStreamer* streamer_ = nullptr;  // source_, when it streams
    MemoryReport memory_;
    int n_ctx_ = 0, max_batch_ = 0, n_seq_ = 0;
    std::vector<std::vector<float>> rows_;   // sample_rows(): the rows draws need whole
    std::vector<LogitCandidates> selected_;  // sample_rows(): the backend's answer
    std::unique_ptr<ThreadPool> draw_pool_;  // sample_rows(): whole-row draws side by side
};

// Greedy or sampled generation for a single sequence: the loop the CLI's generate and chat
// subcommands share.
struct GenerateStats {
    int n_prompt = 0, n_generated = 0;
    // Tokens the device drew otherwise than the host's sampler from the same candidates (its
    // float rounding): the host's token stood and the step after it ran again.
    int n_redrawn = 0;
    double prompt_seconds = 0, decode_seconds = 0;
};
// The oldest token the backend drew at the end of a step (Batch::choose, as `draw` says) and
// the token that stands: for a sampled draw, the one `sampler` draws from the same candidates
// (a draw over the whole vocabulary: from the row, which `row` holds after, with the draw's
// bias) with the same uniform (they differ only where the device rounded otherwise); a greedy
// draw, the best candidate, stands as it is.
struct DrawnToken {
    int32_t drawn = -1, token = -1;
};
DrawnToken take_drawn(Backend& be, Sampler& sampler, const TokenDraw& draw,
                      std::vector<float>& row);

// Decoding fed on the device (Engine::pipelines()), shared by generate() and the scheduler:
// one-row steps of sequence `seq` enqueued before the host has the token they feed, each ending
// with a draw as `draw` says, and the drawn tokens taken in order and checked on the host.
// Steps enqueued and never taken are dropped (drop(), or when the object goes).
class FedSteps {
  public:
    FedSteps(Engine& eng, Sampler& sampler, const TokenDraw& draw, int seq)
        : eng_(eng), sampler_(sampler), draw_(draw), seq_(seq) {}
    ~FedSteps() { drop(); }
    FedSteps(const FedSteps&) = delete;
    FedSteps& operator=(const FedSteps&) = delete;

    // The draw of the next step enqueued: its uniform is the one after those of the steps
    // queued. A step that draws with it and goes in by other means (Engine::feed) is counted
    // with enqueued().
    TokenDraw next_draw() const;
    void enqueued() { queued_++; }
    // Enqueues a step feeding `token` (kFedToken: the one the step before draws) at `pos`.
    void enqueue(int32_t token, int pos);
    // Takes the oldest step's token (take_drawn). Where the host's draw differs, its token
    // stands: the step queued after it, which fed the device's, is dropped, and when refeed_pos
    // >= 0 enqueued again at refeed_pos with the host's token.
    DrawnToken take(int refeed_pos);
    // Takes and discards every step's token still queued (a NaN in a step nobody wants is not
    // an error).
    void drop();

  private:
    Engine& eng_;
    Sampler& sampler_;
    const TokenDraw draw_;
    const int seq_;
    int queued_ = 0;  // steps enqueued whose token is not taken yet
    Batch batch_;
    std::vector<float> row_;  // a whole-vocabulary draw's row, for its check
};

// Calls on_token(id, text) for each generated token (text is complete UTF-8, may be empty);
// stops at end-of-generation, after n_predict tokens, or when on_token returns false.
GenerateStats generate(Engine& eng, Sampler& sampler, int seq, int& pos,
                       const std::vector<int32_t>& prompt, int n_predict,
                       const std::function<bool(int32_t, const std::string&)>& on_token);

// llama.cpp's perplexity method: non-overlapping chunks of n_ctx tokens, the second half of
// each scored. Calls on_chunk(i, running_ppl) after each chunk.
struct PerplexityResult {
    double ppl = 0, ppl_err = 0;
    int n_chunks = 0, n_scored = 0;
};
PerplexityResult perplexity(Engine& eng, const std::vector<int32_t>& tokens, int n_ctx,
                            const std::function<void(int, double)>& on_chunk);

}  // namespace nt
