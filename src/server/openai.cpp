#include "server/openai.h"

#include <cmath>
#include <random>

#include "core/error.h"

namespace nt::server {

void bad_request(const std::string& message, const std::string& param, const std::string& code) {
    throw ApiError(400, message, "invalid_request_error", param, code);
}

std::string dump(const json& j) {
    return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string error_body(int status, const std::string& message, const std::string& type,
                       const std::string& param, const std::string& code) {
    (void)status;
    json e = {{"message", message}, {"type", type}, {"param", nullptr}, {"code", nullptr}};
    if (!param.empty()) e["param"] = param;
    if (!code.empty()) e["code"] = code;
    return dump(json{{"error", e}});
}

std::string make_id(const char* prefix) {
    thread_local std::mt19937_64 rng{std::random_device{}()};
    static const char* hex = "0123456789abcdef";
    std::string id = prefix;
    for (int i = 0; i < 24; i++) id += hex[rng() & 15];
    return id;
}

namespace {

[[noreturn]] void wrong_type(const std::string& field, const char* expected, const json& v) {
    bad_request(strfmt("'%s' must be %s, not %s.", field.c_str(), expected, v.type_name()), field,
                "invalid_type");
}

const json* field(const json& o, const char* key) {
    auto it = o.find(key);
    if (it == o.end() || it->is_null()) return nullptr;
    return &*it;
}

std::optional<double> get_number(const json& o, const char* key, double lo, double hi) {
    const json* v = field(o, key);
    if (!v) return std::nullopt;
    if (!v->is_number()) wrong_type(key, "a number", *v);
    const double x = v->get<double>();
    if (!std::isfinite(x) || x < lo || x > hi)
        bad_request(strfmt("'%s' must be between %g and %g, got %g.", key, lo, hi, x), key,
                    "invalid_value");
    return x;
}

std::optional<int64_t> get_int(const json& o, const char* key, int64_t lo, int64_t hi) {
    const json* v = field(o, key);
    if (!v) return std::nullopt;
    int64_t x = 0;
    if (v->is_number_integer()) {
        if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(INT64_MAX))
            bad_request(strfmt("'%s' is too large.", key), key, "invalid_value");
        x = v->get<int64_t>();
    } else if (v->is_number_float() && std::isfinite(v->get<double>()) &&
               v->get<double>() == std::floor(v->get<double>()) &&
               std::fabs(v->get<double>()) < 9.0e15) {
        x = int64_t(v->get<double>());  // 16.0 is an integer too
    } else {
        wrong_type(key, "an integer", *v);
    }
    if (x < lo || x > hi)
        bad_request(strfmt("'%s' must be between %lld and %lld, got %lld.", key, (long long)lo,
                           (long long)hi, (long long)x),
                    key, "invalid_value");
    return x;
}

std::optional<bool> get_bool(const json& o, const char* key) {
    const json* v = field(o, key);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) wrong_type(key, "a boolean", *v);
    return v->get<bool>();
}

std::optional<std::string> get_string(const json& o, const char* key) {
    const json* v = field(o, key);
    if (!v) return std::nullopt;
    if (!v->is_string()) wrong_type(key, "a string", *v);
    return v->get<std::string>();
}

std::vector<int32_t> token_array(const json& a, const char* key) {
    std::vector<int32_t> ids;
    ids.reserve(a.size());
    for (const json& t : a) {
        if (!t.is_number_integer()) wrong_type(key, "a string or an array of token ids", t);
        const int64_t id = t.get<int64_t>();
        if (id < 0 || id > INT32_MAX)
            bad_request(strfmt("token id %lld in '%s' is out of range.", (long long)id, key), key);
        ids.push_back(int32_t(id));
    }
    return ids;
}

void parse_prompt(const json& body, CompletionRequest& r) {
    const json* p = field(body, "prompt");
    if (!p) bad_request("'prompt' is required.", "prompt", "missing_required_parameter");
    if (p->is_string()) {
        r.prompt = p->get<std::string>();
        return;
    }
    if (!p->is_array()) wrong_type("prompt", "a string or an array", *p);
    if (p->empty()) bad_request("'prompt' must not be an empty array.", "prompt");
    const json& first = (*p)[0];
    if (first.is_string() || first.is_array()) {
        // A list of prompts: one completion per request is supported.
        if (p->size() != 1)
            bad_request("only one prompt per request is supported; send one request per prompt.",
                        "prompt");
        if (first.is_string()) {
            r.prompt = first.get<std::string>();
        } else {
            r.prompt_is_tokens = true;
            r.prompt_tokens = token_array(first, "prompt");
        }
        return;
    }
    r.prompt_is_tokens = true;
    r.prompt_tokens = token_array(*p, "prompt");
}

std::string message_content(const json& m, size_t i) {
    const std::string key = strfmt("messages[%zu].content", i);
    auto it = m.find("content");
    if (it == m.end() || it->is_null()) return "";
    if (it->is_string()) return it->get<std::string>();
    if (!it->is_array()) wrong_type(key, "a string or an array of content parts", *it);
    std::string text;
    for (const json& part : *it) {
        if (!part.is_object()) wrong_type(key, "an array of content parts", part);
        auto type = part.find("type");
        if (type == part.end() || !type->is_string() || *type != "text")
            bad_request(
                strfmt("'%s' holds a part that is not text; only text content is supported.",
                       key.c_str()),
                key);
        auto t = part.find("text");
        if (t == part.end() || !t->is_string())
            wrong_type(key + ".text", "a string", t == part.end() ? json() : *t);
        text += t->get<std::string>();
    }
    return text;
}

void parse_messages(const json& body, CompletionRequest& r) {
    const json* ms = field(body, "messages");
    if (!ms) bad_request("'messages' is required.", "messages", "missing_required_parameter");
    if (!ms->is_array()) wrong_type("messages", "an array", *ms);
    if (ms->empty()) bad_request("'messages' must hold at least one message.", "messages");
    for (size_t i = 0; i < ms->size(); i++) {
        const json& m = (*ms)[i];
        const std::string key = strfmt("messages[%zu]", i);
        if (!m.is_object()) wrong_type(key, "an object", m);
        auto role = m.find("role");
        if (role == m.end() || !role->is_string())
            bad_request(strfmt("'%s.role' must be a string.", key.c_str()), key + ".role",
                        "invalid_type");
        std::string rs = role->get<std::string>();
        if (rs == "developer") rs = "system";  // OpenAI's newer name for the system role
        r.messages.push_back({rs, message_content(m, i)});
    }
}

}  // namespace

CompletionRequest parse_completion_request(const std::string& text, bool chat) {
    json body;
    try {
        body = json::parse(text);
    } catch (const json::exception& e) {  // syntax, invalid UTF-8, numbers out of range
        bad_request(strfmt("the request body is not valid JSON (%s).", e.what()), "",
                    "invalid_json");
    }
    if (!body.is_object())
        bad_request(strfmt("the request body must be a JSON object, not %s.", body.type_name()));

    CompletionRequest r;
    r.chat = chat;
    r.model = get_string(body, "model").value_or("");
    if (chat)
        parse_messages(body, r);
    else
        parse_prompt(body, r);

    if (auto n = get_int(body, "n", 1, 128); n && *n != 1)
        bad_request("only n = 1 is supported; send several requests for several completions.", "n");
    if (auto b = get_int(body, "best_of", 1, 128); b && *b != 1)
        bad_request("only best_of = 1 is supported.", "best_of");
    r.stream = get_bool(body, "stream").value_or(false);
    if (const json* so = field(body, "stream_options")) {
        if (!so->is_object()) wrong_type("stream_options", "an object", *so);
        r.include_usage = get_bool(*so, "include_usage").value_or(false);
    }
    // Completions default to 16 tokens (OpenAI's legacy default); chat runs to the end of turn.
    r.max_tokens = chat ? -1 : 16;
    if (auto m = get_int(body, "max_tokens", 0, INT32_MAX)) r.max_tokens = int(*m);
    if (auto m = get_int(body, "max_completion_tokens", 0, INT32_MAX)) r.max_tokens = int(*m);

    if (const json* st = field(body, "stop")) {
        if (st->is_string()) {
            r.stop.push_back(st->get<std::string>());
        } else if (st->is_array()) {
            if (st->size() > 16) bad_request("'stop' holds at most 16 sequences.", "stop");
            for (const json& s : *st) {
                if (!s.is_string()) wrong_type("stop", "a string or an array of strings", s);
                r.stop.push_back(s.get<std::string>());
            }
        } else {
            wrong_type("stop", "a string or an array of strings", *st);
        }
        for (const std::string& s : r.stop)
            if (s.empty()) bad_request("'stop' sequences must not be empty.", "stop");
    }

    // OpenAI semantics: plain temperature + top-p sampling unless the extensions ask for more.
    SamplerParams& sp = r.sampling;
    sp.temperature = 1.0f;
    sp.top_k = 0;
    sp.top_p = 1.0f;
    sp.min_p = 0.0f;
    if (auto v = get_number(body, "temperature", 0.0, 2.0)) sp.temperature = float(*v);
    if (auto v = get_number(body, "top_p", 0.0, 1.0)) {
        if (*v <= 0) bad_request("'top_p' must be greater than 0.", "top_p", "invalid_value");
        sp.top_p = float(*v);
    }
    if (auto v = get_number(body, "presence_penalty", -2.0, 2.0)) sp.presence_penalty = float(*v);
    if (auto v = get_number(body, "frequency_penalty", -2.0, 2.0)) sp.frequency_penalty = float(*v);
    if (const json* v = field(body, "seed")) {  // any 64-bit integer, signed or not
        if (!v->is_number_integer()) wrong_type("seed", "an integer", *v);
        sp.seed = v->is_number_unsigned() ? v->get<uint64_t>() : uint64_t(v->get<int64_t>());
    }
    // llama.cpp's extensions.
    if (auto v = get_int(body, "top_k", 0, INT32_MAX)) sp.top_k = int(*v);
    if (auto v = get_number(body, "min_p", 0.0, 1.0)) {
        if (*v >= 1) bad_request("'min_p' must be less than 1.", "min_p", "invalid_value");
        sp.min_p = float(*v);
    }
    if (auto v = get_number(body, "repeat_penalty", 0.0, 100.0)) {
        if (*v <= 0)
            bad_request("'repeat_penalty' must be greater than 0.", "repeat_penalty",
                        "invalid_value");
        sp.repeat_penalty = float(*v);
    }
    if (auto v = get_int(body, "repeat_last_n", -1, INT32_MAX)) sp.repeat_last_n = int(*v);
    r.cache_prompt = get_bool(body, "cache_prompt").value_or(true);

    if (chat) {
        r.logprobs = get_bool(body, "logprobs").value_or(false);
        if (auto k = get_int(body, "top_logprobs", 0, 20)) {
            if (!r.logprobs && *k > 0)
                bad_request("'top_logprobs' needs 'logprobs': true.", "top_logprobs");
            r.top_logprobs = int(*k);
        }
    } else {
        if (auto k = get_int(body, "logprobs", 0, 20)) {
            r.logprobs = true;
            r.top_logprobs = int(*k);
        }
        r.echo = get_bool(body, "echo").value_or(false);
        if (r.echo && r.logprobs)
            bad_request("'echo' with 'logprobs' (prompt log-probabilities) is not supported.",
                        "echo");
        if (auto s = get_string(body, "suffix"); s && !s->empty())
            bad_request("'suffix' is not supported.", "suffix");
    }

    if (const json* lb = field(body, "logit_bias")) {
        if (!lb->is_object())
            wrong_type("logit_bias", "an object mapping token ids to numbers", *lb);
        for (const auto& [k, v] : lb->items()) {
            char* end = nullptr;
            const long id = std::strtol(k.c_str(), &end, 10);
            if (k.empty() || *end != '\0' || id < 0 || id > INT32_MAX)
                bad_request(strfmt("'logit_bias' key '%s' is not a token id.", k.c_str()),
                            "logit_bias");
            if (!v.is_number())
                wrong_type("logit_bias", "an object mapping token ids to numbers", v);
            const double b = v.get<double>();
            if (!std::isfinite(b) || b < -100 || b > 100)
                bad_request("'logit_bias' values must be between -100 and 100.", "logit_bias",
                            "invalid_value");
            r.logit_bias.emplace_back(int32_t(id), float(b));
        }
    }
    get_string(body, "user");  // accepted, type-checked, unused
    if (const json* t = field(body, "tools"); t && !(t->is_array() && t->empty()))
        bad_request("tools and function calling are not supported.", "tools");
    if (const json* f = field(body, "functions"); f && !(f->is_array() && f->empty()))
        bad_request("tools and function calling are not supported.", "functions");
    if (const json* rf = field(body, "response_format")) {
        if (!rf->is_object()) wrong_type("response_format", "an object", *rf);
        auto t = get_string(*rf, "type");
        if (t && *t != "text")
            bad_request("only response_format {\"type\": \"text\"} is supported.",
                        "response_format");
    }
    return r;
}

json completion_logprobs(const std::vector<TokenInfo>& toks, bool with_top) {
    json tokens = json::array(), lps = json::array(), tops = json::array(), offs = json::array();
    for (const TokenInfo& t : toks) {
        tokens.push_back(t.piece);
        lps.push_back(t.logprob);
        offs.push_back(t.text_offset);
        if (with_top) {
            json m = json::object();
            for (const auto& [piece, lp] : t.top) m[piece] = lp;
            tops.push_back(m);
        }
    }
    return json{{"tokens", tokens},
                {"token_logprobs", lps},
                {"top_logprobs", with_top ? tops : json(nullptr)},
                {"text_offset", offs}};
}

namespace {
json bytes_of(const std::string& s) {
    json b = json::array();
    for (unsigned char c : s) b.push_back(int(c));
    return b;
}
}  // namespace

json chat_logprobs(const std::vector<TokenInfo>& toks, bool with_top) {
    json content = json::array();
    for (const TokenInfo& t : toks) {
        json top = json::array();
        if (with_top)
            for (const auto& [piece, lp] : t.top)
                top.push_back({{"token", piece}, {"logprob", lp}, {"bytes", bytes_of(piece)}});
        content.push_back({{"token", t.piece},
                           {"logprob", t.logprob},
                           {"bytes", bytes_of(t.piece)},
                           {"top_logprobs", top}});
    }
    return json{{"content", content}};
}

json usage_json(const Usage& u) {
    return json{{"prompt_tokens", u.prompt_tokens},
                {"completion_tokens", u.completion_tokens},
                {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}

}  // namespace nt::server
