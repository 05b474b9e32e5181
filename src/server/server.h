// The OpenAI-compatible HTTP server: routes, Bearer auth, limits, JSON errors and SSE streaming
// in front of a Scheduler. cpp-httplib stays behind this header.
#pragma once
#include <cstddef>
#include <memory>
#include <optional>
#include <string>

#include "engine/chat_template.h"
#include "engine/engine.h"
#include "server/scheduler.h"

namespace nt::server {

struct ServerOptions {
    std::string host = "127.0.0.1";
    int port = 8080;      // 0: any free port (bind() returns it)
    std::string api_key;  // non-empty: "Authorization: Bearer KEY" on every route but /health
    size_t max_body_bytes = size_t(1) << 20;
    int http_threads = 0;    // 0: enough for every slot and queued request, plus spare ones
    std::string model_name;  // id in /v1/models; default: the file name without .gguf
    std::optional<ChatTemplateKind> chat_template;  // default: detected from the model file
    int retry_after_seconds = 1;
    bool log_requests = false;  // one line per request on stderr
};

class HttpServer {
  public:
    // The model and scheduler must outlive the server.
    HttpServer(Model& model, Scheduler& sched, ServerOptions opt);
    ~HttpServer();
    HttpServer(const HttpServer&) = delete;
    HttpServer& operator=(const HttpServer&) = delete;

    // Opens the listening socket; returns the port. Throws nt::Error when it cannot.
    int bind();
    // Serves until stop() is called from another thread.
    void run();
    void stop();

  private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

// The chat page served at / (plain HTML and JavaScript, embedded at build time).
const char* web_page_html();

}  // namespace nt::server
