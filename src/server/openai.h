// The OpenAI wire format: request bodies of /v1/completions and /v1/chat/completions parsed and
// checked field by field, and the JSON of responses, stream chunks and errors.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "engine/chat_template.h"
#include "engine/sampler.h"

namespace nt::server {

using json = nlohmann::json;

// An error the client caused (or overload): the HTTP status and OpenAI's error object.
struct ApiError : std::runtime_error {
    ApiError(int status, std::string message, std::string type, std::string param = "",
             std::string code = "")
        : std::runtime_error(message),
          status(status),
          type(std::move(type)),
          param(std::move(param)),
          code(std::move(code)) {}
    int status;
    std::string type, param, code;
};

// 400 invalid_request_error naming the offending field.
[[noreturn]] void bad_request(const std::string& message, const std::string& param = "",
                              const std::string& code = "");

// {"error":{"message","type","param","code"}}, with null for empty param/code.
std::string error_body(int status, const std::string& message, const std::string& type,
                       const std::string& param = "", const std::string& code = "");
inline std::string error_body(const ApiError& e) {
    return error_body(e.status, e.what(), e.type, e.param, e.code);
}

// Serialises without throwing on invalid UTF-8 (token pieces may split characters): such bytes
// become U+FFFD.
std::string dump(const json& j);

struct CompletionRequest {
    bool chat = false;
    std::string model;
    // /v1/completions: text, or token ids when prompt_is_tokens.
    std::string prompt;
    bool prompt_is_tokens = false;
    std::vector<int32_t> prompt_tokens;
    // /v1/chat/completions
    std::vector<ChatMessage> messages;

    bool stream = false;
    bool include_usage = false;  // stream_options.include_usage
    bool echo = false;
    int max_tokens = -1;  // -1: until end of generation or a full context
    bool logprobs = false;
    int top_logprobs = 0;
    std::vector<std::string> stop;
    SamplerParams sampling;
    std::vector<std::pair<int32_t, float>> logit_bias;
    bool cache_prompt = true;  // llama.cpp's extension: reuse a cached prefix
};

// Parses and checks a request body; throws ApiError (400) naming the field that is wrong.
// Sampling defaults are OpenAI's (temperature 1, top_p 1, nothing else), not the CLI's.
CompletionRequest parse_completion_request(const std::string& body, bool chat);

// Generation output collected for a response.
struct TokenInfo {
    int32_t id = 0;
    std::string piece;  // the token's bytes
    float logprob = 0.f;
    std::vector<std::pair<std::string, float>> top;
    size_t text_offset = 0;
};
struct Usage {
    int prompt_tokens = 0, completion_tokens = 0;
};

// Logprobs objects: completions' {tokens, token_logprobs, top_logprobs, text_offset} and chat's
// {content: [{token, logprob, bytes, top_logprobs}]}.
json completion_logprobs(const std::vector<TokenInfo>& toks, bool with_top);
json chat_logprobs(const std::vector<TokenInfo>& toks, bool with_top);
json usage_json(const Usage& u);

// A random id such as "chatcmpl-3f2a..." for responses.
std::string make_id(const char* prefix);

}  // namespace nt::server
