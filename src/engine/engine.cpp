#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/error.h"

namespace nt {

std::unique_ptr<Model> Model::load(const std::string& path) {
    auto m = std::make_unique<Model>();
    m->file = GgufFile::open(path);
    m->hp = read_llama_hparams(*m->file);
    m->weights = map_llama_weights(*m->file, m->hp);
    m->tokenizer = Tokenizer::from_gguf(*m->file);
    if (m->tokenizer->n_vocab() != m->hp.shape.n_vocab)
        fail("%s: the tokenizer has %d tokens but the model has %d.", path.c_str(), m->tokenizer->n_vocab(),
             m->hp.shape.n_vocab);
    return m;
}

Engine::Engine(Model& model, std::unique_ptr<Backend> backend, const EngineOptions& opt)
    : model_(model), backend_(std::move(backend)) {
    const LlamaHParams& hp = model.hp;
    n_ctx_ = opt.n_ctx > 0 ? opt.n_ctx : std::min(hp.n_ctx_train, 4096);
    if (opt.n_ctx > hp.n_ctx_train) n_ctx_ = opt.n_ctx;  // allowed: the user asked for it explicitly
    if (n_ctx_ < 1) fail("the context size must be at least 1 token.");
    n_seq_ = std::max(1, opt.n_seq);
    max_batch_ = std::max(1, std::min(opt.max_batch, n_ctx_ * n_seq_));
    backend_->init(hp.shape, max_batch_, n_seq_, n_ctx_);

    // Weights move to the backend's memory once (the CPU backend keeps the mapped file).
    weights_ = model.weights;
    const bool tied = weights_.output.data == weights_.tok_embd.data;
    size_t total = 0;
    for_each_weight(weights_, [&](WeightView& v) { total += v.nbytes; });
    backend_->reserve_weights(total);
    for_each_weight(weights_, [&](WeightView& v) { v.data = backend_->upload_weight(v.data, v.nbytes); });
    if (tied) weights_.output = weights_.tok_embd;
    source_ = std::make_unique<ResidentWeights>(weights_);
}

Engine::~Engine() = default;

void Engine::eval(const Batch& batch, std::vector<float>& logits) {
    if (batch.size() == 0) return;
    if (batch.size() > max_batch_) fail("a step of %d tokens exceeds the batch limit of %d.", batch.size(), max_batch_);
    llama_forward(model_.hp, weights_, *source_, *backend_, batch);
    const size_t n = size_t(batch.n_logits()) * size_t(n_vocab());
    logits.resize(n);
    if (n) backend_->download(backend_->acts().logits, logits.data(), n);
}

std::vector<float> Engine::prefill(int seq, int pos, const std::vector<int32_t>& tokens) {
    if (pos + int(tokens.size()) > n_ctx_)
        fail("the prompt needs %d tokens but the context holds %d; shorten the prompt or raise -c.",
             pos + int(tokens.size()), n_ctx_);
    std::vector<float> logits;
    Batch b;
    for (size_t i = 0; i < tokens.size(); i += size_t(max_batch_)) {
        b.clear();
        const size_t end = std::min(tokens.size(), i + size_t(max_batch_));
        for (size_t j = i; j < end; j++) b.add(tokens[j], pos + int(j), seq, j + 1 == tokens.size());
        eval(b, logits);
    }
    return logits;
}

GenerateStats generate(Engine& eng, Sampler& sampler, int seq, int& pos, const std::vector<int32_t>& prompt,
                       int n_predict, const std::function<bool(int32_t, const std::string&)>& on_token) {
    using clock = std::chrono::steady_clock;
    GenerateStats st;
    const Tokenizer& tok = *eng.model().tokenizer;
    st.n_prompt = int(prompt.size());
    auto t0 = clock::now();
    std::vector<float> logits = eng.prefill(seq, pos, prompt);
    pos += int(prompt.size());
    for (int32_t t : prompt) sampler.accept(t);
    auto t1 = clock::now();
    st.prompt_seconds = std::chrono::duration<double>(t1 - t0).count();

    StreamDecoder dec(tok);
    Batch b;
    for (int i = 0; n_predict < 0 || i < n_predict; i++) {
        const int32_t id = sampler.sample(logits.data());
        sampler.accept(id);
        st.n_generated++;
        if (tok.is_eog(id)) break;
        if (!on_token(id, dec.push(id))) break;
        if (pos >= eng.n_ctx()) break;  // context full
        if (n_predict >= 0 && i + 1 >= n_predict) break;
        b.clear();
        b.add(id, pos, seq, true);
        eng.eval(b, logits);
        pos++;
    }
    const std::string rest = dec.flush();
    if (!rest.empty()) on_token(-1, rest);
    st.decode_seconds = std::chrono::duration<double>(clock::now() - t1).count();
    return st;
}

PerplexityResult perplexity(Engine& eng, const std::vector<int32_t>& tokens, int n_ctx,
                            const std::function<void(int, double)>& on_chunk) {
    const Tokenizer& tok = *eng.model().tokenizer;
    if (n_ctx > eng.n_ctx()) fail("perplexity context %d exceeds the engine context %d.", n_ctx, eng.n_ctx());
    const int n_chunks = int(tokens.size()) / n_ctx;
    if (n_chunks < 1)
        fail("the text has %zu tokens; perplexity needs at least %d (one chunk of -c tokens).", tokens.size(),
             n_ctx);
    const int n_vocab = eng.n_vocab();
    const int first = n_ctx / 2;
    double nll = 0, nll2 = 0;
    int count = 0;
    PerplexityResult r;
    std::vector<float> logits;
    Batch b;
    for (int c = 0; c < n_chunks; c++) {
        const int start = c * n_ctx;
        // Positions restart at 0 for every chunk, and the first token becomes BOS when the
        // model adds one, as llama.cpp's perplexity tool does.
        std::vector<float> all(size_t(n_ctx) * size_t(n_vocab));
        for (int i = 0; i < n_ctx; i += eng.max_batch()) {
            b.clear();
            const int end = std::min(n_ctx, i + eng.max_batch());
            for (int j = i; j < end; j++) {
                int32_t t = tokens[size_t(start + j)];
                if (j == 0 && tok.add_bos()) t = tok.bos();
                b.add(t, j, 0, j >= first && j < n_ctx - 1);
            }
            eng.eval(b, logits);
            // Copy back the rows that were flagged, in order.
            int k = 0;
            for (int j = i; j < end; j++)
                if (j >= first && j < n_ctx - 1) {
                    std::copy(logits.begin() + int64_t(k) * n_vocab, logits.begin() + int64_t(k + 1) * n_vocab,
                              all.begin() + int64_t(j) * n_vocab);
                    k++;
                }
        }
        for (int j = first + 1; j < n_ctx; j++) {
            // logits at position j-1 predict token j (positions first .. n_ctx-2)
            const float* lg = all.data() + int64_t(j - 1) * n_vocab;
            float mx = lg[0];
            for (int v = 1; v < n_vocab; v++) mx = std::max(mx, lg[v]);
            double sum = 0;
            for (int v = 0; v < n_vocab; v++) sum += std::exp(double(lg[v] - mx));
            const double lp = double(lg[tokens[size_t(start + j)]] - mx) - std::log(sum);
            nll -= lp;
            nll2 += lp * lp;
            count++;
        }
        r.n_chunks = c + 1;
        if (on_chunk) on_chunk(c, std::exp(nll / count));
    }
    const double mean = nll / count;
    r.ppl = std::exp(mean);
    const double var = nll2 / count - mean * mean;
    r.ppl_err = count > 1 && var > 0 ? r.ppl * std::sqrt(var / (count - 1)) : 0.0;
    r.n_scored = count;
    return r;
}

}  // namespace nt
