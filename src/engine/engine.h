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
#include "model/llama.h"
#include "tokenizer/tokenizer.h"

namespace nt {

// A validated model file: everything but the backend.
struct Model {
    std::unique_ptr<GgufFile> file;
    LlamaHParams hp;
    ModelWeights weights;  // views into the mapped file
    std::unique_ptr<Tokenizer> tokenizer;

    static std::unique_ptr<Model> load(const std::string& path);  // throws nt::Error
};

struct EngineOptions {
    int n_ctx = 0;          // 0: the model's training context, capped at 4096
    int n_seq = 1;          // sequences sharing the KV cache
    int max_batch = 512;    // tokens per forward step (prompt chunk size)
    bool logits_all = false;  // size the logits buffer for every row of a full batch
};

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

    // Feeds `tokens` of sequence `seq` starting at position `pos` in chunks of max_batch;
    // returns the logits after the last token. Throws nt::Error past the context.
    std::vector<float> prefill(int seq, int pos, const std::vector<int32_t>& tokens);

private:
    Model& model_;
    std::unique_ptr<Backend> backend_;
    ModelWeights weights_;  // views in the backend's memory
    std::unique_ptr<WeightSource> source_;
    int n_ctx_ = 0, max_batch_ = 0, n_seq_ = 0;
};

// Greedy or sampled generation for a single sequence: the loop the CLI's generate and chat
// subcommands share.
struct GenerateStats {
    int n_prompt = 0, n_generated = 0;
    double prompt_seconds = 0, decode_seconds = 0;
};
// Calls on_token(id, text) for each generated token (text is complete UTF-8, may be empty);
// stops at end-of-generation, after n_predict tokens, or when on_token returns false.
GenerateStats generate(Engine& eng, Sampler& sampler, int seq, int& pos, const std::vector<int32_t>& prompt,
                       int n_predict, const std::function<bool(int32_t, const std::string&)>& on_token);

// llama.cpp's perplexity method: non-overlapping chunks of n_ctx tokens, the second half of
// each scored. Calls on_chunk(i, running_ppl) after each chunk.
struct PerplexityResult {
    double ppl = 0, ppl_err = 0;
    int n_chunks = 0, n_scored = 0;
};
PerplexityResult perplexity(Engine& eng, const std::vector<int32_t>& tokens, int n_ctx,
                            const std::function<void(int, double)>& on_chunk);

}  // namespace nt
