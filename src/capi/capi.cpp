// The C API (include/ntransformer.h) over the engine and the continuous-batching scheduler: a
// model owns one Engine with n_seq sequences and one Scheduler; a session reserves a sequence
// and runs its generations as pinned jobs, so sessions on different threads share every step.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "backend/select/select.h"
#include "core/error.h"
#include "engine/chat_template.h"
#include "engine/engine.h"
#include "ntransformer.h"
#include "server/scheduler.h"

struct nt_model {
    std::unique_ptr<nt::Model> model;
    std::unique_ptr<nt::Engine> engine;
    std::unique_ptr<nt::Scheduler> sched;
    std::string backend;
    int n_seq = 1;
};

struct nt_session {
    nt_model* m = nullptr;
    int slot = -1;
    nt::SamplerParams sp;
    int max_tokens = -1;
    std::unique_ptr<nt::Sampler> sampler;
    std::vector<int32_t> tokens;     // everything submitted and generated
    std::vector<int32_t> kv_tokens;  // the tokens whose K/V are in the sequence's cache, from 0

    // The running generation. `mu` guards `job` against nt_session_cancel from other threads.
    std::mutex mu;
    std::shared_ptr<nt::Job> job;
    std::atomic<bool> user_cancelled{false};
    std::vector<nt::GeneratedToken> buf;  // taken from the job, not yet delivered
    size_t buf_pos = 0;
    bool job_finished = false;  // the job said so; buf may still hold tokens
    bool flushed = false;       // the decoder's tail was delivered
    int n_delivered = 0;
    std::unique_ptr<nt::StreamDecoder> dec;
    std::string text;  // backing store of the last nt_token's text
    nt_generation_result last{};
};

namespace {

thread_local std::string g_last_error;

nt_status set_error(nt_status st, const std::string& msg) {
    g_last_error = msg;
    return st;
}

// Runs fn, turning exceptions into a status and this thread's last error. `user_error` is the
// status an nt::Error (a failure the caller caused) maps to.
template <class Fn>
nt_status guarded(nt_status user_error, Fn&& fn) {
    try {
        return fn();
    } catch (const nt::Error& e) {
        return set_error(user_error, e.what());
    } catch (const std::bad_alloc&) {
        return set_error(NT_ERR_OUT_OF_MEMORY,
                         "out of memory; try a smaller context or fewer sequences.");
    } catch (const std::exception& e) {
        return set_error(NT_ERR_INTERNAL, e.what());
    }
}

#define NT_REQUIRE(cond, what)                                                     \
    do {                                                                           \
        if (!(cond)) return set_error(NT_ERR_INVALID_ARGUMENT, std::string(what)); \
    } while (0)

nt::SamplerParams to_params(const nt_sampling_params& p) {
    nt::SamplerParams s;
    s.temperature = p.temperature;
    s.top_k = p.top_k;
    s.top_p = p.top_p;
    s.min_p = p.min_p;
    s.repeat_penalty = p.repeat_penalty;
    s.repeat_last_n = p.repeat_last_n;
    s.frequency_penalty = p.frequency_penalty;
    s.presence_penalty = p.presence_penalty;
    s.seed = p.seed;
    return s;
}

nt_finish_reason to_finish(nt::FinishReason r) {
    switch (r) {
        case nt::FinishReason::Stop:
            return NT_FINISH_STOP;
        case nt::FinishReason::Length:
            return NT_FINISH_LENGTH;
        case nt::FinishReason::Cancelled:
            return NT_FINISH_CANCELLED;
        case nt::FinishReason::Error:
            return NT_FINISH_ERROR;
        case nt::FinishReason::Running:
            break;
    }
    return NT_FINISH_NONE;
}

// Copies text into a caller's buffer with the API's convention (NUL-terminated, the length
// needed on NT_ERR_BUFFER_TOO_SMALL).
nt_status copy_out(const std::string& s, char* out, size_t capacity, size_t* length) {
    if (length) *length = s.size();
    if (!out || capacity <= s.size())
        return set_error(
            NT_ERR_BUFFER_TOO_SMALL,
            nt::strfmt("the text needs %zu bytes plus the terminating NUL; the buffer holds %zu.",
                       s.size(), capacity));
    std::memcpy(out, s.data(), s.size());
    out[s.size()] = '\0';
    return NT_OK;
}

bool running(const nt_session* s) {
    return s->job != nullptr;
}

// A generation ended: the session's cache now covers what the job evaluated. Tokens the job
// produced after the consumer stopped (callback or cancel) were never delivered, so they are not
// part of the session and their cache cells are dropped. (The sampler has seen them; its penalty
// window may count those few tokens.)
void finalize(nt_session* s, nt_finish_reason reason) {
    s->job->wait_finished();
    const nt::JobStats st = s->job->stats();
    const int32_t eog = s->job->eog_token();
    if (eog >= 0 && reason == NT_FINISH_STOP)
        s->tokens.push_back(eog);  // ends the turn in the history
    const size_t kv_len = std::min(size_t(std::max(st.kv_end, 0)), s->tokens.size());
    s->kv_tokens.assign(s->tokens.begin(), s->tokens.begin() + int64_t(kv_len));
    s->last.finish = reason;
    s->last.n_prompt = st.n_prompt - st.n_cached;
    s->last.n_generated = s->n_delivered;
    s->last.prompt_seconds = st.prompt_seconds;
    s->last.decode_seconds = st.decode_seconds;
    std::lock_guard<std::mutex> lk(s->mu);
    s->job.reset();
}

// Stops the consumer side of a running generation and finalizes it.
void abandon(nt_session* s, nt_finish_reason reason) {
    s->job->cancel();
    finalize(s, reason);
}

nt_status start(nt_session* s) {
    if (s->tokens.empty())
        return set_error(NT_ERR_INVALID_ARGUMENT, "the session is empty; submit a prompt first.");
    const int n_ctx = s->m->engine->n_ctx();
    if (int(s->tokens.size()) > n_ctx)
        return set_error(
            NT_ERR_CONTEXT_FULL,
            nt::strfmt("the session holds %zu tokens but the context holds %d; reset the session.",
                       s->tokens.size(), n_ctx));
    // Feed what the cache lacks (it may hold a prefix of a re-submitted conversation); with
    // nothing new, feed the last token again to get its logits.
    size_t common = 0;
    const size_t n = std::min(s->kv_tokens.size(), s->tokens.size());
    while (common < n && s->kv_tokens[common] == s->tokens[common]) common++;
    const int first = int(std::min(common, s->tokens.size() - 1));
    std::vector<int32_t> input(s->tokens.begin() + first, s->tokens.end());
    nt::GenerationParams gp;
    gp.sampling = s->sp;
    gp.max_tokens = s->max_tokens;
    gp.n_logprobs = 0;
    std::shared_ptr<nt::Job> job =
        s->m->sched->submit_pinned(s->slot, first, std::move(input), gp, s->sampler.get());
    s->user_cancelled = false;
    s->buf.clear();
    s->buf_pos = 0;
    s->job_finished = false;
    s->flushed = false;
    s->n_delivered = 0;
    s->dec = std::make_unique<nt::StreamDecoder>(*s->m->model->tokenizer);
    std::lock_guard<std::mutex> lk(s->mu);
    s->job = std::move(job);
    return NT_OK;
}

// The next event of the running generation: NT_OK with a token, or the generation's end status
// (NT_DONE, NT_ERR_CANCELLED, NT_ERR_INTERNAL) after finalizing it.
nt_status pull(nt_session* s, nt_token* out) {
    for (;;) {
        if (s->user_cancelled) {
            abandon(s, NT_FINISH_CANCELLED);
            return set_error(NT_ERR_CANCELLED, "the generation was cancelled.");
        }
        if (s->buf_pos < s->buf.size()) {
            const nt::GeneratedToken& g = s->buf[s->buf_pos++];
            s->tokens.push_back(g.id);
            s->n_delivered++;
            s->text = s->dec->push(g.id);
            *out = {g.id, s->text.c_str(), s->text.size(), g.logprob};
            return NT_OK;
        }
        s->buf.clear();
        s->buf_pos = 0;
        if (s->job_finished) break;
        s->job_finished = s->job->take(s->buf, std::chrono::milliseconds(1000));
    }
    const nt::FinishReason r = s->job->finish_reason();
    if (r != nt::FinishReason::Cancelled && r != nt::FinishReason::Error && !s->flushed) {
        s->flushed = true;
        s->text = s->dec->flush();
        if (!s->text.empty()) {
            *out = {-1, s->text.c_str(), s->text.size(), 0.f};
            return NT_OK;
        }
    }
    const std::string err = s->job->error();
    finalize(s, to_finish(r));
    if (r == nt::FinishReason::Error) return set_error(NT_ERR_INTERNAL, err);
    if (r == nt::FinishReason::Cancelled)
        return set_error(NT_ERR_CANCELLED, "the generation was cancelled.");
    return NT_DONE;
}

nt_status append_tokens(nt_session* s, const int32_t* ids, size_t n) {
    if (running(s))
        return set_error(NT_ERR_BUSY,
                         "a generation is running on this session; finish or cancel it first.");
    const int n_vocab = s->m->engine->n_vocab();
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= n_vocab)
            return set_error(
                NT_ERR_INVALID_ARGUMENT,
                nt::strfmt("token id %d is outside the vocabulary of %d tokens.", ids[i], n_vocab));
    const int n_ctx = s->m->engine->n_ctx();
    if (s->tokens.size() + n > size_t(n_ctx))
        return set_error(
            NT_ERR_CONTEXT_FULL,
            nt::strfmt(
                "the session would hold %zu tokens but the context holds %d; reset the session or "
                "load the model with a larger n_ctx.",
                s->tokens.size() + n, n_ctx));
    s->tokens.insert(s->tokens.end(), ids, ids + n);
    for (size_t i = 0; i < n; i++) s->sampler->accept(ids[i]);
    return NT_OK;
}

}  // namespace

extern "C" {

const char* nt_version(void) {
    return "0.1.0";
}

const char* nt_status_name(nt_status st) {
    switch (st) {
        case NT_OK:
            return "NT_OK";
        case NT_DONE:
            return "NT_DONE";
        case NT_ERR_INVALID_ARGUMENT:
            return "NT_ERR_INVALID_ARGUMENT";
        case NT_ERR_LOAD:
            return "NT_ERR_LOAD";
        case NT_ERR_OUT_OF_MEMORY:
            return "NT_ERR_OUT_OF_MEMORY";
        case NT_ERR_CONTEXT_FULL:
            return "NT_ERR_CONTEXT_FULL";
        case NT_ERR_BUSY:
            return "NT_ERR_BUSY";
        case NT_ERR_CANCELLED:
            return "NT_ERR_CANCELLED";
        case NT_ERR_BUFFER_TOO_SMALL:
            return "NT_ERR_BUFFER_TOO_SMALL";
        case NT_ERR_INTERNAL:
            return "NT_ERR_INTERNAL";
    }
    return "NT_UNKNOWN_STATUS";
}

const char* nt_last_error(void) {
    return g_last_error.c_str();
}

void nt_model_options_default(nt_model_options* o) {
    if (!o) return;
    *o = nt_model_options{};
    o->size = sizeof(nt_model_options);
    o->device = "auto";
    o->n_ctx = 0;
    o->n_seq = 1;
    o->n_threads = 0;
    o->max_batch = 0;
}

nt_status nt_model_load(const char* path, const nt_model_options* options, nt_model** out) {
    g_last_error.clear();
    NT_REQUIRE(path && out, "nt_model_load needs a path and an output pointer.");
    *out = nullptr;
    nt_model_options o;
    nt_model_options_default(&o);
    if (options) {
        NT_REQUIRE(options->size == sizeof(nt_model_options),
                   "nt_model_options has the wrong size: fill it with nt_model_options_default().");
        o = *options;
    }
    NT_REQUIRE(o.n_ctx >= 0, "n_ctx must be 0 (the model's) or more.");
    NT_REQUIRE(o.n_seq >= 1 && o.n_seq <= 4096, "n_seq must be between 1 and 4096.");
    NT_REQUIRE(o.n_threads >= 0, "n_threads must be 0 (all cores) or more.");
    NT_REQUIRE(o.max_batch >= 0, "max_batch must be 0 (512) or more.");
    return guarded(NT_ERR_LOAD, [&]() -> nt_status {
        auto m = std::make_unique<nt_model>();
        m->model = nt::Model::load(path);
        std::unique_ptr<nt::Backend> backend =
            nt::make_backend(o.device ? o.device : "auto", o.n_threads, o.exact != 0);
        m->backend = backend->name();
        // Resident weights either fit the budget of their tier or the load fails (see the header).
        uint64_t weight_bytes = 0;
        std::vector<const void*> seen;
        nt::for_each_weight(m->model->weights, [&](nt::WeightView& v) {
            if (std::find(seen.begin(), seen.end(), v.data) != seen.end()) return;
            seen.push_back(v.data);
            weight_bytes += v.nbytes;
        });
        const bool gpu = m->backend.rfind("cuda", 0) == 0;
        const uint64_t budget = gpu ? o.vram_budget : o.ram_budget;
        if (budget && weight_bytes > budget)
            return set_error(
                NT_ERR_OUT_OF_MEMORY,
                nt::strfmt(
                    "the weights need %.1f MiB of %s but the budget is %.1f MiB; raise the budget "
                    "(tiered placement is not available in this build).",
                    weight_bytes / 1048576.0, gpu ? "GPU memory" : "RAM", budget / 1048576.0));
        nt::EngineOptions eo;
        eo.n_ctx = o.n_ctx;
        eo.n_seq = o.n_seq;
        eo.max_batch = o.max_batch > 0 ? o.max_batch : std::max(512, o.n_seq);
        NT_REQUIRE(eo.max_batch >= o.n_seq,
                   "max_batch must be at least n_seq (one token of every session per step).");
        m->engine = std::make_unique<nt::Engine>(*m->model, std::move(backend), eo);
        nt::SchedulerOptions so;
        so.n_slots = o.n_seq;
        so.max_queue = 0;  // sessions never queue: each owns its sequence
        m->sched = std::make_unique<nt::Scheduler>(*m->engine, so);
        m->n_seq = o.n_seq;
        *out = m.release();
        return NT_OK;
    });
}

void nt_model_free(nt_model* m) {
    delete m;
}  // the scheduler cancels and joins first

int32_t nt_model_n_vocab(const nt_model* m) {
    return m ? m->model->hp.shape.n_vocab : 0;
}
int32_t nt_model_n_ctx(const nt_model* m) {
    return m ? m->engine->n_ctx() : 0;
}
int32_t nt_model_n_seq(const nt_model* m) {
    return m ? m->n_seq : 0;
}
const char* nt_model_backend(const nt_model* m) {
    return m ? m->backend.c_str() : "";
}
int32_t nt_token_bos(const nt_model* m) {
    return m ? m->model->tokenizer->bos() : -1;
}
int32_t nt_token_eos(const nt_model* m) {
    return m ? m->model->tokenizer->eos() : -1;
}
int nt_token_is_eog(const nt_model* m, int32_t t) {
    return m && m->model->tokenizer->is_eog(t) ? 1 : 0;
}

nt_status nt_tokenize(const nt_model* m, const char* text, size_t len, int add_special,
                      int parse_special, int32_t* tokens, size_t capacity, size_t* n_tokens) {
    g_last_error.clear();
    NT_REQUIRE(m && text && n_tokens, "nt_tokenize needs a model, a text and an output count.");
    if (len == size_t(-1)) len = std::strlen(text);
    return guarded(NT_ERR_INVALID_ARGUMENT, [&]() -> nt_status {
        const std::vector<int32_t> ids = m->model->tokenizer->encode(
            std::string_view(text, len), add_special != 0, parse_special != 0);
        *n_tokens = ids.size();
        if (!tokens || capacity < ids.size())
            return set_error(
                NT_ERR_BUFFER_TOO_SMALL,
                nt::strfmt("the text has %zu tokens; the buffer holds %zu.", ids.size(), capacity));
        std::copy(ids.begin(), ids.end(), tokens);
        return NT_OK;
    });
}

nt_status nt_detokenize(const nt_model* m, const int32_t* tokens, size_t n, int render_special,
                        char* text, size_t capacity, size_t* length) {
    g_last_error.clear();
    NT_REQUIRE(m && (tokens || n == 0) && length,
               "nt_detokenize needs a model, tokens and an output length.");
    const int n_vocab = m->model->hp.shape.n_vocab;
    for (size_t i = 0; i < n; i++)
        NT_REQUIRE(
            tokens[i] >= 0 && tokens[i] < n_vocab,
            nt::strfmt("token id %d is outside the vocabulary of %d tokens.", tokens[i], n_vocab));
    return guarded(NT_ERR_INVALID_ARGUMENT, [&]() -> nt_status {
        return copy_out(m->model->tokenizer->decode(std::vector<int32_t>(tokens, tokens + n),
                                                    render_special != 0),
                        text, capacity, length);
    });
}

nt_status nt_chat_apply_template(const nt_model* m, const nt_chat_message* msgs, size_t n,
                                 int add_generation_prompt, char* text, size_t capacity,
                                 size_t* length) {
    g_last_error.clear();
    NT_REQUIRE(m && (msgs || n == 0) && length,
               "nt_chat_apply_template needs a model, messages and an output length.");
    std::vector<nt::ChatMessage> conv;
    for (size_t i = 0; i < n; i++) {
        NT_REQUIRE(msgs[i].role && msgs[i].content,
                   nt::strfmt("message %zu has a NULL role or content.", i));
        conv.push_back({msgs[i].role, msgs[i].content});
    }
    return guarded(NT_ERR_INVALID_ARGUMENT, [&]() -> nt_status {
        const nt::Tokenizer& tok = *m->model->tokenizer;
        const nt::ChatTemplateKind kind = nt::detect_chat_template(tok.chat_template());
        if (kind == nt::ChatTemplateKind::Unknown)
            return set_error(NT_ERR_INVALID_ARGUMENT,
                             "the model's chat template is not one ntransformer knows (ChatML, "
                             "Llama 2/3, Mistral).");
        const std::string bos = tok.bos() >= 0 ? tok.token_to_piece(tok.bos(), true) : "";
        const std::string eos = tok.eos() >= 0 ? tok.token_to_piece(tok.eos(), true) : "";
        return copy_out(nt::apply_chat_template(kind, conv, add_generation_prompt != 0, bos, eos),
                        text, capacity, length);
    });
}

void nt_sampling_params_default(nt_sampling_params* p) {
    if (!p) return;
    const nt::SamplerParams d;
    *p = nt_sampling_params{};
    p->size = sizeof(nt_sampling_params);
    p->temperature = d.temperature;
    p->top_k = d.top_k;
    p->top_p = d.top_p;
    p->min_p = d.min_p;
    p->repeat_penalty = d.repeat_penalty;
    p->repeat_last_n = d.repeat_last_n;
    p->frequency_penalty = d.frequency_penalty;
    p->presence_penalty = d.presence_penalty;
    p->seed = d.seed;
    p->max_tokens = -1;
}

nt_status nt_session_create(nt_model* m, const nt_sampling_params* params, nt_session** out) {
    g_last_error.clear();
    NT_REQUIRE(m && out, "nt_session_create needs a model and an output pointer.");
    *out = nullptr;
    nt_sampling_params p;
    nt_sampling_params_default(&p);
    if (params) {
        NT_REQUIRE(
            params->size == sizeof(nt_sampling_params),
            "nt_sampling_params has the wrong size: fill it with nt_sampling_params_default().");
        p = *params;
    }
    return guarded(NT_ERR_INVALID_ARGUMENT, [&]() -> nt_status {
        auto s = std::make_unique<nt_session>();
        s->m = m;
        s->sp = to_params(p);
        s->max_tokens = p.max_tokens;
        s->sampler =
            std::make_unique<nt::Sampler>(s->sp, m->engine->n_vocab());  // checks the ranges
        s->slot = m->sched->reserve_slot();
        if (s->slot < 0)
            return set_error(
                NT_ERR_BUSY,
                nt::strfmt("all %d sequences of the model are taken; free a session or load "
                           "the model with a larger n_seq.",
                           m->n_seq));
        *out = s.release();
        return NT_OK;
    });
}

void nt_session_free(nt_session* s) {
    if (!s) return;
    if (running(s)) abandon(s, NT_FINISH_CANCELLED);
    s->m->sched->release_slot(s->slot);
    delete s;
}

nt_status nt_session_set_sampling(nt_session* s, const nt_sampling_params* params) {
    g_last_error.clear();
    NT_REQUIRE(s && params, "nt_session_set_sampling needs a session and parameters.");
    NT_REQUIRE(params->size == sizeof(nt_sampling_params),
               "nt_sampling_params has the wrong size: fill it with nt_sampling_params_default().");
    if (running(s))
        return set_error(NT_ERR_BUSY,
                         "a generation is running on this session; finish or cancel it first.");
    return guarded(NT_ERR_INVALID_ARGUMENT, [&]() -> nt_status {
        const nt::SamplerParams sp = to_params(*params);
        auto sampler = std::make_unique<nt::Sampler>(sp, s->m->engine->n_vocab());
        for (int32_t t : s->tokens) sampler->accept(t);
        s->sp = sp;
        s->max_tokens = params->max_tokens;
        s->sampler = std::move(sampler);
        return NT_OK;
    });
}

nt_status nt_session_submit_text(nt_session* s, const char* text, size_t len, int parse_special) {
    g_last_error.clear();
    NT_REQUIRE(s && text, "nt_session_submit_text needs a session and a text.");
    if (len == size_t(-1)) len = std::strlen(text);
    return guarded(NT_ERR_INVALID_ARGUMENT, [&]() -> nt_status {
        // BOS/EOS as the model asks only for the session's first input: later turns continue it.
        const std::vector<int32_t> ids = s->m->model->tokenizer->encode(
            std::string_view(text, len), s->tokens.empty(), parse_special != 0);
        return append_tokens(s, ids.data(), ids.size());
    });
}

nt_status nt_session_submit_tokens(nt_session* s, const int32_t* tokens, size_t n) {
    g_last_error.clear();
    NT_REQUIRE(s && (tokens || n == 0), "nt_session_submit_tokens needs a session and tokens.");
    return guarded(NT_ERR_INVALID_ARGUMENT,
                   [&]() -> nt_status { return append_tokens(s, tokens, n); });
}

nt_status nt_session_reset(nt_session* s) {
    g_last_error.clear();
    NT_REQUIRE(s, "nt_session_reset needs a session.");
    if (running(s))
        return set_error(NT_ERR_BUSY,
                         "a generation is running on this session; finish or cancel it first.");
    s->tokens.clear();  // kv_tokens stay: a conversation with the same start reuses them
    s->sampler->reset();
    s->last = nt_generation_result{};
    return NT_OK;
}

int32_t nt_session_n_tokens(const nt_session* s) {
    return s ? int32_t(s->tokens.size()) : 0;
}

nt_status nt_session_generate(nt_session* s, nt_token_callback callback, void* user_data,
                              nt_generation_result* result) {
    g_last_error.clear();
    NT_REQUIRE(s && callback, "nt_session_generate needs a session and a callback.");
    if (running(s))
        return set_error(
            NT_ERR_BUSY,
            "an iteration is running on this session; finish it with nt_session_next or "
            "cancel it first.");
    return guarded(NT_ERR_INVALID_ARGUMENT, [&]() -> nt_status {
        nt_status st = start(s);
        if (st != NT_OK) return st;
        nt_token tok;
        for (;;) {
            st = pull(s, &tok);
            if (st != NT_OK) break;
            if (callback(&tok, user_data) != 0) {
                abandon(s, NT_FINISH_CALLBACK);
                st = NT_OK;
                break;
            }
        }
        if (st == NT_DONE) st = NT_OK;
        if (result) *result = s->last;
        return st;
    });
}

nt_status nt_session_next(nt_session* s, nt_token* token) {
    g_last_error.clear();
    NT_REQUIRE(s && token, "nt_session_next needs a session and a token to fill.");
    return guarded(NT_ERR_INVALID_ARGUMENT, [&]() -> nt_status {
        if (!running(s)) {
            const nt_status st = start(s);
            if (st != NT_OK) return st;
        }
        return pull(s, token);
    });
}

nt_status nt_session_cancel(nt_session* s) {
    NT_REQUIRE(s, "nt_session_cancel needs a session.");
    std::lock_guard<std::mutex> lk(s->mu);
    if (s->job) {
        s->user_cancelled = true;
        s->job->cancel();
    }
    return NT_OK;
}

nt_status nt_session_result(const nt_session* s, nt_generation_result* result) {
    NT_REQUIRE(s && result, "nt_session_result needs a session and a result to fill.");
    *result = s->last;
    return NT_OK;
}

}  // extern "C"
