#include "server/server.h"

#include <dirent.h>
#include <httplib.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>

#include "core/error.h"
#include "server/metrics.h"
#include "server/openai.h"
#include "server/text_stream.h"

namespace nt::server {

namespace {

using Clock = std::chrono::steady_clock;

// cpp-httplib 0.11 (Debian 12) does not tell a handler that its client went away
// (Request::is_connection_closed came in later releases), and a non-streaming handler writes
// nothing until it is done. So the handler finds its own socket — the one whose peer and local
// addresses are the request's; a TCP 4-tuple names one live connection, and the socket cannot
// close while the handler runs — and polls it for the peer's hang-up.
class ConnectionWatch {
  public:
    explicit ConnectionWatch(const httplib::Request& req) {
        DIR* d = opendir("/proc/self/fd");
        if (!d) return;
        while (dirent* e = readdir(d)) {
            char* end = nullptr;
            const long fd = std::strtol(e->d_name, &end, 10);
            if (*end != '\0' || fd < 0 || fd == dirfd(d)) continue;
            struct stat st;
            if (fstat(int(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
            if (matches(int(fd), req)) {
                fd_ = int(fd);
                break;
            }
        }
        closedir(d);
    }

    // True once the client has closed or reset the connection.
    bool closed() const {
        if (fd_ < 0) return false;
        pollfd p{fd_, POLLRDHUP, 0};
        if (poll(&p, 1, 0) <= 0) return false;
        return (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
    }

  private:
    static bool endpoint(int fd, bool peer, std::string& host, int& port) {
        sockaddr_storage ss{};
        socklen_t len = sizeof(ss);
        auto* sa = reinterpret_cast<sockaddr*>(&ss);
        if ((peer ? getpeername(fd, sa, &len) : getsockname(fd, sa, &len)) != 0) return false;
        if (ss.ss_family != AF_INET && ss.ss_family != AF_INET6) return false;
        char h[NI_MAXHOST], s[NI_MAXSERV];
        if (getnameinfo(sa, len, h, sizeof(h), s, sizeof(s), NI_NUMERICHOST | NI_NUMERICSERV) != 0)
            return false;
        host = h;
        port = std::atoi(s);
        return true;
    }
    static bool matches(int fd, const httplib::Request& req) {
        std::string host;
        int port = 0;
        if (!endpoint(fd, true, host, port) || port != req.remote_port || host != req.remote_addr)
            return false;
        return endpoint(fd, false, host, port) && port == req.local_port;
    }
    int fd_ = -1;
};

const char* kRoutes[] = {"/",          "/health",         "/metrics",
                         "/v1/models", "/v1/completions", "/v1/chat/completions"};

std::string route_of(const std::string& path) {
    for (const char* r : kRoutes)
        if (path == r) return r;
    if (path.rfind("/v1/models/", 0) == 0) return "/v1/models/{id}";
    return "other";
}

bool constant_time_equal(const std::string& a, const std::string& b) {
    unsigned diff = unsigned(a.size() ^ b.size());
    for (size_t i = 0; i < a.size(); i++)
        diff |= unsigned(uint8_t(a[i]) ^ uint8_t(b[i % std::max<size_t>(1, b.size())]));
    return diff == 0;
}

std::string default_model_name(const std::string& path) {
    std::string name = path.substr(path.find_last_of('/') + 1);
    if (name.size() > 5 && name.compare(name.size() - 5, 5, ".gguf") == 0)
        name.resize(name.size() - 5);
    return name;
}

// The output of one generation as the client sees it: text cut at stop strings, and the
// tokens (with log-probabilities) whose text made it into the output.
class Output {
  public:
    Output(const Tokenizer& tok, std::vector<std::string> stops, bool logprobs, size_t offset_base)
        : tok_(tok), text_(tok, std::move(stops)), logprobs_(logprobs), base_(offset_base) {}

    // Absorbs tokens; returns the text released now and appends to `infos` the tokens whose
    // text began within it.
    std::string absorb(const std::vector<GeneratedToken>& toks, std::vector<TokenInfo>& infos) {
        std::string out;
        for (const GeneratedToken& g : toks) {
            if (text_.stopped()) break;
            out += text_.push(g.id);
            n_tokens_++;
            if (logprobs_) {
                TokenInfo t;
                t.id = g.id;
                t.piece = tok_.token_to_piece(g.id, false);
                t.logprob = g.logprob;
                for (const TokenLogprob& a : g.top)
                    t.top.emplace_back(tok_.token_to_piece(a.id, false), a.logprob);
                t.text_offset = base_ + text_.last_token_offset();
                pending_.push_back(std::move(t));
            }
            drain(infos);
        }
        return out;
    }
    // The end: text still held back; pending tokens go out unless a stop string cut them off.
    std::string finish(std::vector<TokenInfo>& infos) {
        std::string out = text_.finish();
        drain(infos);
        if (!text_.stopped())
            for (TokenInfo& t : pending_) infos.push_back(std::move(t));
        pending_.clear();
        return out;
    }
    bool stopped() const { return text_.stopped(); }
    int n_tokens() const { return n_tokens_; }

  private:
    void drain(std::vector<TokenInfo>& infos) {
        size_t k = 0;
        while (k < pending_.size() && pending_[k].text_offset - base_ < text_.released()) k++;
        for (size_t i = 0; i < k; i++) infos.push_back(std::move(pending_[i]));
        pending_.erase(pending_.begin(), pending_.begin() + int64_t(k));
    }
    const Tokenizer& tok_;
    StopTextStream text_;
    bool logprobs_;
    size_t base_;
    std::vector<TokenInfo> pending_;
    int n_tokens_ = 0;
};

}  // namespace

struct HttpServer::Impl {
    Model& model;
    Scheduler& sched;
    ServerOptions opt;
    const Tokenizer& tok;
    std::optional<ChatTemplateKind> tmpl;
    std::string bos_text, eos_text;
    std::vector<std::string> tmpl_stops;
    std::unique_ptr<Metrics> metrics;
    httplib::Server svr;
    time_t created = std::time(nullptr);
    int port = 0;

    Impl(Model& m, Scheduler& s, ServerOptions o)
        : model(m), sched(s), opt(std::move(o)), tok(*m.tokenizer) {
        if (opt.model_name.empty()) opt.model_name = default_model_name(model.file->path());
        tmpl = opt.chat_template;
        if (!tmpl) {
            const ChatTemplateKind k = detect_chat_template(tok.chat_template());
            if (k != ChatTemplateKind::Unknown) tmpl = k;
        }
        if (tmpl) tmpl_stops = template_stop_strings(*tmpl);
        bos_text = tok.bos() >= 0 ? tok.token_to_piece(tok.bos(), true) : "";
        eos_text = tok.eos() >= 0 ? tok.token_to_piece(tok.eos(), true) : "";

        ModelFacts f;
        f.model_name = opt.model_name;
        const std::string backend = sched.engine().backend().name();
        uint64_t total = 0;  // for_each_weight visits tied embeddings once
        for_each_weight(model.weights, [&](WeightView& v) { total += v.nbytes; });
        const MemoryReport& mem = sched.engine().memory();
        if (mem.planned && mem.plan.streams()) {
            // Streamed layers live in pinned RAM or on disk and cross PCIe once per step; the
            // rest (resident layers, embeddings, output) is in VRAM.
            const mem::TierPlan& p = mem.plan;
            f.tier_bytes[1] = p.bytes[1];
            f.tier_bytes[2] = p.bytes[2];
            f.tier_bytes[0] = total > p.bytes[1] + p.bytes[2] ? total - p.bytes[1] - p.bytes[2] : 0;
            f.step_bytes[0] = f.tier_bytes[0];
            f.step_bytes[2] = p.disk_per_step;
            f.step_bytes[1] = p.h2d_per_step > p.disk_per_step ? p.h2d_per_step - p.disk_per_step : 0;
        } else {
            const int t = backend.rfind("cuda", 0) == 0 ? 0 : 1;
            f.tier_bytes[t] = f.step_bytes[t] = total;
        }
        const ModelShape& sh = model.hp.shape;
        f.kv_cache_bytes = uint64_t(sh.n_layer) * 2 * uint64_t(sched.n_slots()) *
                           uint64_t(sched.n_ctx()) * uint64_t(sh.n_head_kv) *
                           uint64_t(sh.head_dim) * 2;
        f.n_ctx = sched.n_ctx();
        f.n_slots = sched.n_slots();
        metrics = std::make_unique<Metrics>(f);
        setup();
    }

    static void send_error(httplib::Response& res, const ApiError& e, int retry_after) {
        res.status = e.status;
        if (e.status == 503) res.set_header("Retry-After", std::to_string(retry_after));
        if (e.status == 401) res.set_header("WWW-Authenticate", "Bearer");
        res.set_content(error_body(e), "application/json");
    }

    void setup() {
        // Every running or queued request holds a connection thread while it waits (streaming or
        // not), and keep-alive connections hold one between requests: size for all of them, with
        // spare threads so /health, /metrics and 503 answers still get through.
        const int threads =
            opt.http_threads > 0 ? opt.http_threads : sched.n_slots() + sched.max_queue() + 16;
        svr.new_task_queue = [threads] { return new httplib::ThreadPool(size_t(threads)); };
        svr.set_payload_max_length(opt.max_body_bytes);
        svr.set_tcp_nodelay(true);
        // Slow clients get a few seconds per read and write, not forever.
        svr.set_read_timeout(10, 0);
        svr.set_write_timeout(10, 0);

        svr.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
            if (opt.api_key.empty() || req.path == "/health")
                return httplib::Server::HandlerResponse::Unhandled;
            const std::string h = req.get_header_value("Authorization");
            const std::string prefix = "Bearer ";
            if (h.size() > prefix.size() && h.compare(0, prefix.size(), prefix) == 0 &&
                constant_time_equal(h.substr(prefix.size()), opt.api_key))
                return httplib::Server::HandlerResponse::Unhandled;
            send_error(
                res,
                ApiError(401,
                         h.empty()
                             ? "this server needs an API key: send 'Authorization: Bearer KEY'."
                             : "the API key is not valid.",
                         "invalid_request_error", "", "invalid_api_key"),
                opt.retry_after_seconds);
            return httplib::Server::HandlerResponse::Handled;
        });

        // Statuses set by cpp-httplib itself (unknown route, body too large, malformed request)
        // get an OpenAI-shaped body too; handlers' own errors already have one.
        using HandlerResponse = httplib::Server::HandlerResponse;
        svr.set_error_handler(httplib::Server::HandlerWithResponse([this](
                                                                       const httplib::Request& req,
                                                                       httplib::Response& res) {
            if (!res.body.empty()) return HandlerResponse::Unhandled;
            std::string msg, code;
            switch (res.status) {
                case 404:
                    msg = strfmt("there is no route %s %s.", req.method.c_str(), req.path.c_str());
                    code = "unknown_url";
                    break;
                case 413:
                    msg = strfmt("the request body is larger than the limit of %zu bytes.",
                                 opt.max_body_bytes);
                    code = "request_too_large";
                    break;
                default:
                    msg = strfmt("the request could not be handled (HTTP %d).", res.status);
                    break;
            }
            res.set_content(
                error_body(res.status, msg,
                           res.status >= 500 ? "server_error" : "invalid_request_error", "", code),
                "application/json");
            return HandlerResponse::Handled;
        }));

        svr.set_exception_handler(
            [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
                std::string what = "unknown error";
                try {
                    std::rethrow_exception(ep);
                } catch (const std::exception& e) {
                    what = e.what();
                } catch (...) {
                }
                res.status = 500;
                res.set_content(error_body(500, "internal error: " + what, "server_error"),
                                "application/json");
            });

        svr.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
            metrics->count_request(route_of(req.path), res.status);
            if (opt.log_requests)
                std::fprintf(stderr, "%s %s %s -> %d\n", req.remote_addr.c_str(),
                             req.method.c_str(), req.path.c_str(), res.status);
        });

        svr.Get("/", [](const httplib::Request&, httplib::Response& res) {
            res.set_content(web_page_html(), "text/html; charset=utf-8");
        });
        svr.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
            const SchedulerStats s = sched.stats();
            json j = {{"status", "ok"},
                      {"slots_idle", s.slots - s.active - s.reserved},
                      {"slots_busy", s.active},
                      {"queue", s.queued}};
            res.set_content(dump(j), "application/json");
        });
        svr.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
            res.set_content(metrics->render(sched.stats()),
                            "text/plain; version=0.0.4; charset=utf-8");
        });
        svr.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
            res.set_content(dump(json{{"object", "list"}, {"data", json::array({model_json()})}}),
                            "application/json");
        });
        svr.Get(R"(/v1/models/(.+))", [this](const httplib::Request& req, httplib::Response& res) {
            if (req.matches[1] != opt.model_name) {
                send_error(res,
                           ApiError(404,
                                    strfmt("the model '%s' does not exist; this server has '%s'.",
                                           req.matches[1].str().c_str(), opt.model_name.c_str()),
                                    "invalid_request_error", "model", "model_not_found"),
                           opt.retry_after_seconds);
                return;
            }
            res.set_content(dump(model_json()), "application/json");
        });
        auto generation = [this](bool chat) {
            return [this, chat](const httplib::Request& req, httplib::Response& res) {
                try {
                    handle_generation(req, res, chat);
                } catch (const ApiError& e) {
                    send_error(res, e, opt.retry_after_seconds);
                }
            };
        };
        svr.Post("/v1/completions", generation(false));
        svr.Post("/v1/chat/completions", generation(true));
    }

    json model_json() const {
        return json{{"id", opt.model_name},
                    {"object", "model"},
                    {"created", int64_t(created)},
                    {"owned_by", "ntransformer"},
                    {"meta",
                     {{"n_ctx", sched.n_ctx()},
                      {"n_slots", sched.n_slots()},
                      {"n_vocab", model.hp.shape.n_vocab},
                      {"n_ctx_train", model.hp.n_ctx_train},
                      {"chat_template", tmpl ? chat_template_name(*tmpl) : "none"}}}};
    }

    json chunk_json(const std::string& id, bool chat, const std::string& text,
                    const std::vector<TokenInfo>& infos, bool logprobs, bool with_top,
                    const char* finish, bool first) const {
        json choice = {{"index", 0}, {"finish_reason", finish ? json(finish) : json(nullptr)}};
        json lp = logprobs && !infos.empty() ? (chat ? chat_logprobs(infos, with_top)
                                                     : completion_logprobs(infos, with_top))
                                             : json(nullptr);
        choice["logprobs"] = lp;
        if (chat) {
            json delta = json::object();
            if (first) delta["role"] = "assistant";
            if (!text.empty() || first) delta["content"] = text;
            choice["delta"] = delta;
        } else {
            choice["text"] = text;
        }
        return json{{"id", id},
                    {"object", chat ? "chat.completion.chunk" : "text_completion"},
                    {"created", int64_t(std::time(nullptr))},
                    {"model", opt.model_name},
                    {"choices", json::array({choice})}};
    }

    void handle_generation(const httplib::Request& req, httplib::Response& res, bool chat) {
        CompletionRequest cr = parse_completion_request(req.body, chat);
        std::vector<int32_t> prompt;
        std::vector<std::string> stops = cr.stop;
        std::string echo_text;
        const int n_vocab = model.hp.shape.n_vocab;
        if (chat) {
            if (!tmpl)
                throw ApiError(400,
                               "the model's chat template is not one ntransformer knows; start the "
                               "server with "
                               "--chat-template chatml|llama3|llama2.",
                               "invalid_request_error", "messages");
            std::string text;
            try {
                text = apply_chat_template(*tmpl, cr.messages, true, bos_text, eos_text);
            } catch (const nt::Error& e) {
                bad_request(e.what(), "messages");
            }
            prompt = tok.encode(text, true, true);
            stops.insert(stops.end(), tmpl_stops.begin(), tmpl_stops.end());
        } else if (cr.prompt_is_tokens) {
            prompt = cr.prompt_tokens;
            for (int32_t t : prompt)
                if (t >= n_vocab)
                    bad_request(
                        strfmt("token id %d is outside the vocabulary of %d tokens.", t, n_vocab),
                        "prompt");
            if (cr.echo) echo_text = tok.decode(prompt);
        } else {
            prompt = tok.encode(cr.prompt, true, true);
            if (cr.echo) echo_text = cr.prompt;
        }
        if (prompt.empty()) bad_request("the prompt is empty.", chat ? "messages" : "prompt");
        const int n_ctx = sched.n_ctx();
        const int64_t need = int64_t(prompt.size()) + std::max(1, cr.max_tokens);
        if (need > n_ctx)
            throw ApiError(
                400,
                strfmt("this model's context holds %d tokens, but the request needs %lld (%zu in "
                       "the prompt, "
                       "%d to generate); shorten the prompt or lower max_tokens.",
                       n_ctx, (long long)need, prompt.size(), std::max(1, cr.max_tokens)),
                "invalid_request_error", chat ? "messages" : "prompt", "context_length_exceeded");
        for (const auto& [id, b] : cr.logit_bias)
            if (id >= n_vocab)
                bad_request(
                    strfmt("'logit_bias' names token %d, outside the vocabulary of %d tokens.", id,
                           n_vocab),
                    "logit_bias");

        GenerationParams gp;
        gp.sampling = cr.sampling;
        gp.max_tokens = cr.max_tokens;
        gp.n_logprobs = cr.logprobs ? cr.top_logprobs : -1;
        gp.logit_bias = cr.logit_bias;
        gp.cache_prompt = cr.cache_prompt;
        std::unique_ptr<Sampler> sampler;
        try {
            sampler = std::make_unique<Sampler>(gp.sampling, n_vocab);
        } catch (const nt::Error& e) {
            bad_request(e.what());
        }
        for (int32_t t : prompt) sampler->accept(t);
        const int n_prompt = int(prompt.size());
        std::shared_ptr<Job> job = sched.submit(std::move(prompt), gp, std::move(sampler));
        if (!job) {
            const SchedulerStats s = sched.stats();
            throw ApiError(503,
                           strfmt("the server is busy: all %d slots are in use and %d requests are "
                                  "waiting; retry later.",
                                  s.slots, s.queued),
                           "server_error", "", "server_overloaded");
        }

        auto out = std::make_shared<Output>(tok, std::move(stops), cr.logprobs, echo_text.size());
        const std::string id = make_id(chat ? "chatcmpl-" : "cmpl-");
        if (cr.stream)
            stream_response(req, res, job, out, cr, id, echo_text, n_prompt);
        else
            blocking_response(req, res, job, out, cr, id, echo_text, n_prompt);
    }

    static const char* finish_name(FinishReason r, bool stopped) {
        if (stopped) return "stop";
        return r == FinishReason::Length ? "length" : "stop";
    }

    void blocking_response(const httplib::Request& req, httplib::Response& res,
                           const std::shared_ptr<Job>& job, const std::shared_ptr<Output>& out,
                           const CompletionRequest& cr, const std::string& id,
                           const std::string& echo_text, int n_prompt) {
        ConnectionWatch watch(req);
        std::vector<GeneratedToken> toks;
        std::vector<TokenInfo> infos;
        std::string text = echo_text;
        bool finished = false;
        for (;;) {
            toks.clear();
            finished = job->take(toks, std::chrono::milliseconds(100));
            text += out->absorb(toks, infos);
            if (out->stopped() || finished) break;
            if (watch.closed()) {
                // Nobody is listening: free the slot now. 499 (client closed request) shows in
                // metrics.
                job->cancel();
                res.status = 499;
                return;
            }
        }
        if (out->stopped()) job->stop();
        const FinishReason fr = finished ? job->finish_reason() : FinishReason::Stop;
        if (fr == FinishReason::Error) throw ApiError(500, job->error(), "server_error");
        text += out->finish(infos);
        json choice = {{"index", 0}, {"finish_reason", finish_name(fr, out->stopped())}};
        json lp = nullptr;
        if (cr.logprobs)
            lp = cr.chat ? chat_logprobs(infos, cr.top_logprobs > 0)
                         : completion_logprobs(infos, cr.top_logprobs > 0);
        choice["logprobs"] = lp;
        if (cr.chat)
            choice["message"] = {{"role", "assistant"}, {"content", text}};
        else
            choice["text"] = text;
        json body = {{"id", id},
                     {"object", cr.chat ? "chat.completion" : "text_completion"},
                     {"created", int64_t(std::time(nullptr))},
                     {"model", opt.model_name},
                     {"choices", json::array({choice})},
                     {"usage", usage_json({n_prompt, out->n_tokens()})}};
        res.set_content(dump(body), "application/json");
    }

    struct StreamState {
        std::shared_ptr<Job> job;
        std::shared_ptr<Output> out;
        ConnectionWatch watch;
        bool started = false;
        StreamState(std::shared_ptr<Job> j, std::shared_ptr<Output> o, const httplib::Request& req)
            : job(std::move(j)), out(std::move(o)), watch(req) {}
    };

    void stream_response(const httplib::Request& req, httplib::Response& res,
                         const std::shared_ptr<Job>& job, const std::shared_ptr<Output>& out,
                         const CompletionRequest& cr, const std::string& id,
                         const std::string& echo_text, int n_prompt) {
        auto st = std::make_shared<StreamState>(job, out, req);
        res.set_header("Cache-Control", "no-cache");
        res.set_header("X-Accel-Buffering", "no");
        const bool chat = cr.chat, logprobs = cr.logprobs, with_top = cr.top_logprobs > 0,
                   usage = cr.include_usage;
        res.set_chunked_content_provider(
            "text/event-stream",
            [this, st, chat, logprobs, with_top, usage, id, echo_text, n_prompt](
                size_t, httplib::DataSink& sink) {
                auto event = [](const json& j) { return "data: " + dump(j) + "\n\n"; };
                std::string wire;
                if (!st->started) {
                    st->started = true;
                    if (chat || !echo_text.empty())
                        wire +=
                            event(chunk_json(id, chat, echo_text, {}, false, false, nullptr, chat));
                }
                if (st->watch.closed()) {
                    st->job->cancel();
                    return false;
                }
                std::vector<GeneratedToken> toks;
                std::vector<TokenInfo> infos;
                bool finished = st->job->take(toks, std::chrono::milliseconds(200));
                std::string text = st->out->absorb(toks, infos);
                if (st->out->stopped()) {
                    st->job->stop();  // a stop string ended it: do not wait for the scheduler
                    finished = true;
                }
                if (finished) {
                    const FinishReason fr =
                        st->out->stopped() ? FinishReason::Stop : st->job->finish_reason();
                    if (fr == FinishReason::Error) {
                        if (!text.empty() || !infos.empty())
                            wire += event(chunk_json(id, chat, text, infos, logprobs, with_top,
                                                     nullptr, false));
                        wire +=
                            event(json::parse(error_body(500, st->job->error(), "server_error")));
                    } else {
                        text += st->out->finish(infos);
                        if (!text.empty() || !infos.empty())
                            wire += event(chunk_json(id, chat, text, infos, logprobs, with_top,
                                                     nullptr, false));
                        wire += event(chunk_json(id, chat, "", {}, false, false,
                                                 finish_name(fr, st->out->stopped()), false));
                        if (usage) {
                            json u = chunk_json(id, chat, "", {}, false, false, nullptr, false);
                            u["choices"] = json::array();
                            u["usage"] = usage_json({n_prompt, st->out->n_tokens()});
                            wire += event(u);
                        }
                    }
                    wire += "data: [DONE]\n\n";
                } else if (!text.empty() || !infos.empty()) {
                    wire += event(
                        chunk_json(id, chat, text, infos, logprobs, with_top, nullptr, false));
                }
                if (!wire.empty() && !sink.write(wire.data(), wire.size())) {
                    st->job->cancel();
                    return false;
                }
                if (finished) sink.done();
                return true;
            },
            [st](bool) { st->job->cancel(); });
    }
};

HttpServer::HttpServer(Model& model, Scheduler& sched, ServerOptions opt)
    : impl_(std::make_unique<Impl>(model, sched, std::move(opt))) {}

HttpServer::~HttpServer() = default;

int HttpServer::bind() {
    Impl& s = *impl_;
    if (s.opt.port == 0) {
        s.port = s.svr.bind_to_any_port(s.opt.host);
        if (s.port < 0)
            fail("cannot listen on %s (any port): the address is not usable here.",
                 s.opt.host.c_str());
    } else {
        if (!s.svr.bind_to_port(s.opt.host, s.opt.port))
            fail(
                "cannot listen on %s:%d: the port is in use or the address is not usable here; "
                "pick another with "
                "--host/--port.",
                s.opt.host.c_str(), s.opt.port);
        s.port = s.opt.port;
    }
    return s.port;
}

void HttpServer::run() {
    impl_->svr.listen_after_bind();
}

void HttpServer::stop() {
    impl_->svr.stop();
}

}  // namespace nt::server
