#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/error.h"
#include "core/threadpool.h"
#include "memory/layer_blob.h"
#include "memory/streamer.h"
#include "memory/sysinfo.h"

namespace nt {

std::unique_ptr<Model> Model::load(const std::string& path) {
    auto m = std::make_unique<Model>();
    m->file = GgufFile::open(path);
    m->hp = read_llama_hparams(*m->file);
    m->weights = map_llama_weights(*m->file, m->hp);
    m->tokenizer = Tokenizer::from_gguf(*m->file);
    if (m->tokenizer->n_vocab() != m->hp.shape.n_vocab)
        fail("%s: the tokenizer has %d tokens but the model has %d.", path.c_str(),
             m->tokenizer->n_vocab(), m->hp.shape.n_vocab);
    return m;
}

Engine::Engine(Model& model, std::unique_ptr<Backend> backend, const EngineOptions& opt)
    : model_(model), backend_(std::move(backend)) {
    const LlamaHParams& hp = model.hp;
    n_ctx_ = opt.n_ctx > 0 ? opt.n_ctx : std::min(hp.n_ctx_train, 4096);
    if (opt.n_ctx > hp.n_ctx_train)
        n_ctx_ = opt.n_ctx;  // allowed: the user asked for it explicitly
    if (n_ctx_ < 1) fail("the context size must be at least 1 token.");
    n_seq_ = std::max(1, opt.n_seq);
    max_batch_ = std::max(1, std::min(opt.max_batch, n_ctx_ * n_seq_));
    // Made before init() so it can tell what the backend's own allocations take.
    std::unique_ptr<mem::StreamDevice> dev =
        opt.stream_device ? opt.stream_device(*backend_) : nullptr;
    backend_->init(hp.shape, max_batch_, n_seq_, n_ctx_);
    place_weights(opt, std::move(dev));
}

void Engine::place_weights(const EngineOptions& opt, std::unique_ptr<mem::StreamDevice> dev) {
    weights_ = model_.weights;
    const bool tied = weights_.output.data == weights_.tok_embd.data;
    const int L = int(weights_.layers.size());
    std::vector<bool> resident(size_t(L), true);
    if (dev) {
        // Tier planning: every layer's device footprint and streamed blob, the budgets, and
        // (when something streams) the ceilings measured now for the roofline.
        const MemoryOptions& mo = opt.memory;
        mem::PlanInput& in = memory_.input;
        const uint8_t* base = model_.file->base();
        for (const LayerWeights& l : weights_.layers) {
            uint64_t res = 0;
            for (const WeightView* v : mem::layer_views(l))
                res += dev->resident_footprint(v->nbytes);
            in.resident_bytes.push_back(res);
            in.blob_bytes.push_back(mem::layout_layer(mem::layer_ranges(l, base)).bytes);
        }
        in.vram_fixed_weights = dev->resident_footprint(weights_.tok_embd.nbytes) +
                                dev->resident_footprint(weights_.output_norm.nbytes) +
                                (tied ? 0 : dev->resident_footprint(weights_.output.nbytes));
        in.vram_backend = dev->backend_bytes();
        const uint64_t free_b = dev->free_bytes(), headroom = dev->headroom_bytes();
        in.vram_avail = in.vram_backend + (free_b > headroom ? free_b - headroom : 0);
        in.vram_budget = mo.vram_budget;
        in.ram_avail = mem::default_ram_budget(mem::mem_available());
        in.ram_budget = mo.ram_budget;
        in.slots = mo.slots;
        in.staging = mo.prefetch;
        in.force_stream = mo.force_stream;
        auto plan = [&] {
            return mo.forced_tiers.empty() ? mem::plan_tiers(in)
                                           : mem::plan_fixed(in, mo.forced_tiers);
        };
        memory_.plan = plan();
        memory_.planned = true;
        if (memory_.plan.streams()) {
            in.h2d_gbs = dev->measure_h2d_gbs();
            in.hbm_gbs = dev->measure_hbm_gbs();
            memory_.plan = plan();
            for (int i = 0; i < L; i++)
                resident[size_t(i)] = memory_.plan.tier[size_t(i)] == mem::Tier::Vram;
        }
    }

    // Resident weights move to the backend's memory once (the CPU backend keeps the mapped file).
    auto each_resident = [&](auto&& fn) {
        fn(weights_.tok_embd);
        fn(weights_.output_norm);
        if (!tied) fn(weights_.output);
        for (int i = 0; i < L; i++)
            if (resident[size_t(i)])
                for (WeightView* v : mem::layer_views(weights_.layers[size_t(i)])) fn(*v);
    };
    size_t total = 0;
    each_resident([&](WeightView& v) { total += v.nbytes; });
    backend_->reserve_weights(total);
    each_resident([&](WeightView& v) { v.data = backend_->upload_weight(v.data, v.nbytes); });
    if (tied) weights_.output = weights_.tok_embd;

    if (!dev || memory_.plan.all_resident()) {
        // The resident path, exactly as without a planner (CUDA graphs stay on).
        if (memory_.planned) memory_.text = mem::describe_plan(memory_.plan, memory_.input);
        source_ = std::make_unique<ResidentWeights>(weights_);
        return;
    }
    dev->begin_streaming();
    mem::StreamOptions so;
    so.io.threads = std::max(1, opt.memory.io_threads);
    so.io.direct = opt.memory.direct_io;
    so.gds = opt.memory.gds;
    so.gds_api = opt.memory.gds_api_for_testing;
    so.notify = opt.memory.notify;
    so.trace = opt.memory.trace;
    auto streamer = std::make_unique<mem::WeightStreamer>(
        *dev, model_.file->path(), model_.file->base(), weights_.layers, memory_.plan, so);
    memory_.plan = streamer->plan();
    if (memory_.plan.disk_per_step) {
        memory_.input.disk_gbs = streamer->measure_disk_gbs();
        const double t = memory_.input.disk_gbs > 0
                             ? double(memory_.plan.disk_per_step) / (memory_.input.disk_gbs * 1e9)
                             : 0;
        memory_.plan.t_disk = t;
        memory_.plan.t_h2d = memory_.input.h2d_gbs > 0
                                 ? double(memory_.plan.h2d_per_step) / (memory_.input.h2d_gbs * 1e9)
                                 : 0;
        const double tmax = std::max({memory_.plan.t_h2d, memory_.plan.t_disk, memory_.plan.t_hbm});
        memory_.plan.roofline_tok_s = tmax > 0 ? 1.0 / tmax : 0;
    }
    memory_.text = mem::describe_plan(memory_.plan, memory_.input) + streamer->notices();
    streamer_ = streamer.get();
    source_ = std::move(streamer);
    stream_dev_ = std::move(dev);
}

Engine::~Engine() = default;

void Engine::forward(const Batch& batch) {
    if (batch.size() == 0) return;
    if (batch.size() > max_batch_)
        fail("a step of %d tokens exceeds the batch limit of %d.", batch.size(), max_batch_);
    if (batch.choose && !pipelines())
        fail("tokens are chosen on the device only with every weight resident on a GPU.");
    llama_forward(model_.hp, weights_, *source_, *backend_, batch);
}

void Engine::eval(const Batch& batch, std::vector<float>& logits) {
    if (batch.size() == 0) return;  // logits left as they were
    forward(batch);
    const size_t n = size_t(batch.n_logits()) * size_t(n_vocab());
    logits.resize(n);
    if (n) backend_->download(backend_->acts().logits, logits.data(), n);
}

int32_t Engine::sample(Sampler& sampler, int row,
                       const std::vector<std::pair<int32_t, float>>& bias) {
    std::vector<Draw> d(1);
    d[0].sampler = &sampler;
    d[0].row = row;
    d[0].bias = &bias;
    sample_rows(d);
    if (!d[0].error.empty()) throw Error(d[0].error);
    return d[0].token;
}

void Engine::sample_rows(std::vector<Draw>& draws) {
    static const std::vector<std::pair<int32_t, float>> none;
    auto bias_of = [&](const Draw& d) -> const std::vector<std::pair<int32_t, float>>& {
        return d.bias ? *d.bias : none;
    };
    // Every draw that needs only candidates asks in one selection: one wait for the device.
    std::vector<LogitRequest> reqs;
    std::vector<int> asked(draws.size(), -1);  // draw i asked reqs[asked[i]]
    for (size_t i = 0; i < draws.size(); i++) {
        Draw& d = draws[i];
        d.token = -1;
        d.error.clear();
        if (d.whole_row) continue;
        std::vector<int32_t> changed;
        for (const auto& [id, b] : bias_of(d)) changed.push_back(id);
        LogitRequest req = d.sampler->request(changed);
        if (req.k == 0) continue;  // the draw needs the whole row
        req.row = d.row;
        asked[i] = int(reqs.size());
        reqs.push_back(std::move(req));
    }
    std::string select_error;
    if (!reqs.empty()) try {
            backend_->select_logits(backend_->acts().logits, n_vocab(), reqs, selected_);
        } catch (const std::exception& e) {
            select_error = e.what();
        }
    // The draws that need their whole row: the rows copied back here, then each drawn on a
    // thread of its own (a draw over a 128k vocabulary takes about a millisecond on the host,
    // and a server step's rows would queue behind one another); each sampler is its row's.
    std::vector<size_t> whole;
    for (size_t i = 0; i < draws.size(); i++) {
        Draw& d = draws[i];
        try {
            if (asked[i] >= 0) {
                if (!select_error.empty()) throw Error(select_error);
                const size_t q = size_t(asked[i]);
                d.token = d.sampler->sample(reqs[q], selected_[q], bias_of(d));
                continue;
            }
            if (rows_.size() <= whole.size()) rows_.resize(whole.size() + 1);
            std::vector<float>& row = d.whole_row ? d.logits : rows_[whole.size()];
            logits_row(d.row, row);
            for (const auto& [id, b] : bias_of(d))
                if (id >= 0 && id < n_vocab()) row[size_t(id)] += b;
            whole.push_back(i);
        } catch (const std::exception& e) {
            d.error = e.what();
        }
    }
    auto draw = [&](size_t k) {
        Draw& d = draws[whole[k]];
        try {
            d.token = d.sampler->sample((d.whole_row ? d.logits : rows_[k]).data());
        } catch (const std::exception& e) {
            d.error = e.what();
        }
    };
    bool shared = false;  // a sampler drawing twice: in order, on this thread
    for (size_t a = 0; a < whole.size() && !shared; a++)
        for (size_t b = a + 1; b < whole.size(); b++)
            shared |= draws[whole[a]].sampler == draws[whole[b]].sampler;
    if (whole.size() < 2 || shared) {
        for (size_t k = 0; k < whole.size(); k++) draw(k);
        return;
    }
    if (!draw_pool_)
        draw_pool_ = std::make_unique<ThreadPool>(std::min(8, ThreadPool::default_threads()));
    draw_pool_->parallel_for(int64_t(whole.size()), 1, [&](int64_t b, int64_t e, int) {
        for (int64_t k = b; k < e; k++) draw(size_t(k));
    });
}

bool Engine::pipelines() const {
    return backend_->feeds_tokens() && streamer_ == nullptr;
}

void Engine::logits_row(int row, std::vector<float>& out) {
    if (row < 0 || row >= std::max(max_batch_, 1)) fail("logit row %d does not exist.", row);
    out.resize(size_t(n_vocab()));
    backend_->download(backend_->acts().logits + size_t(row) * size_t(n_vocab()), out.data(),
                       out.size());
}

void Engine::feed(int seq, int pos, const std::vector<int32_t>& tokens, const TokenDraw* draw) {
    if (pos + int(tokens.size()) > n_ctx_)
        fail("the prompt needs %d tokens but the context holds %d; shorten the prompt or raise -c.",
             pos + int(tokens.size()), n_ctx_);
    Batch b;
    for (size_t i = 0; i < tokens.size(); i += size_t(max_batch_)) {
        b.clear();
        const size_t end = std::min(tokens.size(), i + size_t(max_batch_));
        for (size_t j = i; j < end; j++)
            b.add(tokens[j], pos + int(j), seq, j + 1 == tokens.size());
        b.choose = draw && end == tokens.size();
        if (b.choose) b.draw = *draw;
        forward(b);
    }
}

std::vector<float> Engine::prefill(int seq, int pos, const std::vector<int32_t>& tokens) {
    feed(seq, pos, tokens);
    std::vector<float> logits;
    if (!tokens.empty()) logits_row(0, logits);
    return logits;
}

DrawnToken take_drawn(Backend& be, Sampler& sampler, const TokenDraw& draw,
                      std::vector<float>& row) {
    DrawnToken t;
    if (!(draw.temperature > 0.f)) {
        t.drawn = t.token = be.take_token();
        return t;
    }
    if (draw.top_k == 0) {
        t.drawn = be.take_token(nullptr, &row);
        for (int i = 0; i < draw.n_bias; i++) row[size_t(draw.bias_id[i])] += draw.bias[i];
        t.token = sampler.sample(row.data());  // uses the uniform the device drew with
        return t;
    }
    LogitCandidates from;
    t.drawn = be.take_token(&from);
    LogitRequest req;
    req.k = draw.top_k;
    t.token = sampler.sample(req, from);  // uses the uniform the device drew with
    return t;
}

TokenDraw FedSteps::next_draw() const {
    TokenDraw d = draw_;
    if (draw_.temperature > 0.f) d.u = sampler_.peek_uniform(size_t(queued_));
    return d;
}

void FedSteps::enqueue(int32_t token, int pos) {
    batch_.clear();
    batch_.add(token, pos, seq_, true);
    batch_.choose = true;
    batch_.draw = next_draw();
    eng_.forward(batch_);
    queued_++;
}

DrawnToken FedSteps::take(int refeed_pos) {
    queued_--;
    const DrawnToken t = take_drawn(eng_.backend(), sampler_, draw_, row_);
    if (t.token != t.drawn) {
        drop();
        if (refeed_pos >= 0) enqueue(t.token, refeed_pos);
    }
    return t;
}

void FedSteps::drop() {
    for (; queued_ > 0; queued_--) try {
            eng_.backend().take_token();
        } catch (const Error&) {
        }
}

GenerateStats generate(Engine& eng, Sampler& sampler, int seq, int& pos,
                       const std::vector<int32_t>& prompt, int n_predict,
                       const std::function<bool(int32_t, const std::string&)>& on_token) {
    using clock = std::chrono::steady_clock;
    GenerateStats st;
    const Tokenizer& tok = *eng.model().tokenizer;
    st.n_prompt = int(prompt.size());
    if (prompt.empty()) fail("generation needs at least one prompt token.");
    // Fed: each step is enqueued before the token it feeds is known here. The step before
    // draws it on the device and the step embeds it from there (kFedToken), so the GPU never
    // waits for the host between steps. A sampled token is checked: the host's sampler draws
    // from the candidates the device drew from, with the same uniform; where the two differ
    // (the device's float rounding, rarely) the host's token stands and the step fed the other
    // runs again. A step fed past the end (a stop token, the callback's no) only wrote a cache
    // cell that the next step there rewrites.
    TokenDraw draw;
    const bool fed = eng.pipelines() && sampler.device_draw(draw);
    FedSteps steps(eng, sampler, draw, seq);
    Backend& be = eng.backend();
    Batch b;

    auto t0 = clock::now();
    if (fed && n_predict != 0) {
        const TokenDraw d = steps.next_draw();
        eng.feed(seq, pos, prompt, &d);
        steps.enqueued();
    } else {
        eng.feed(seq, pos, prompt);
    }
    be.wait();  // the prompt's time is its own
    pos += int(prompt.size());
    for (int32_t t : prompt) sampler.accept(t);
    auto t1 = clock::now();
    st.prompt_seconds = std::chrono::duration<double>(t1 - t0).count();

    StreamDecoder dec(tok);
    for (int i = 0; n_predict < 0 || i < n_predict; i++) {
        // Whether this token is fed back: room in the context and more tokens wanted.
        const bool more = pos < eng.n_ctx() && (n_predict < 0 || i + 1 < n_predict);
        if (fed && more) steps.enqueue(kFedToken, pos);
        int32_t id;
        if (!fed) {
            id = eng.sample(sampler);
        } else {
            const DrawnToken t = steps.take(more ? pos : -1);
            id = t.token;
            if (t.token != t.drawn) st.n_redrawn++;
        }
        sampler.accept(id);
        st.n_generated++;
        if (tok.is_eog(id)) break;
        if (!on_token(id, dec.push(id))) break;
        if (!more) break;
        if (!fed) {
            b.clear();
            b.add(id, pos, seq, true);
            eng.forward(b);
        }
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
    if (n_ctx > eng.n_ctx())
        fail("perplexity context %d exceeds the engine context %d.", n_ctx, eng.n_ctx());
    const int n_chunks = int(tokens.size()) / n_ctx;
    if (n_chunks < 1)
        fail("the text has %zu tokens; perplexity needs at least %d (one chunk of -c tokens).",
             tokens.size(), n_ctx);
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
        // model adds one, as llama.cpp's perplexity tool does. Logits at positions
        // first .. n_ctx-2 are scored as they arrive: position j predicts token j+1.
        for (int i = 0; i < n_ctx; i += eng.max_batch()) {
            b.clear();
            const int end = std::min(n_ctx, i + eng.max_batch());
            for (int j = i; j < end; j++) {
                int32_t t = tokens[size_t(start + j)];
                if (j == 0 && tok.add_bos()) t = tok.bos();
                b.add(t, j, 0, j >= first && j < n_ctx - 1);
            }
            eng.eval(b, logits);
            const float* lg = logits.data();
            for (int j = std::max(i, first); j < std::min(end, n_ctx - 1); j++, lg += n_vocab) {
                float mx = lg[0];
                for (int v = 1; v < n_vocab; v++) mx = std::max(mx, lg[v]);
                double sum = 0;
                for (int v = 0; v < n_vocab; v++) sum += std::exp(double(lg[v] - mx));
                const double lp = double(lg[tokens[size_t(start + j + 1)]] - mx) - std::log(sum);
                nll -= lp;
                nll2 += lp * lp;
                count++;
            }
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
