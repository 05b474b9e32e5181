#include "cli/common.h"

#include "backend/select/select.h"
#include "core/error.h"

namespace nt::cli {

std::string require_model_path(const Args& a) {
    if (!a.has("--model")) fail("no model given; pass one with -m FILE (e.g. models/SmolLM2-135M-Instruct.Q4_1.gguf).");
    return a.str("--model");
}

std::unique_ptr<Backend> make_backend_for(const Args& a, int threads) {
    return make_backend(a.str("--device", "auto"), threads);
}

Loaded load_model(const Args& a, int n_seq) {
    Loaded l;
    l.model = Model::load(require_model_path(a));
    EngineOptions opt;
    opt.n_ctx = a.integer("--ctx-size", 0);
    if (opt.n_ctx < 0) fail("--ctx-size must be 0 or more.");
    opt.max_batch = a.integer("--batch-size", 512);
    if (opt.max_batch < 1) fail("--batch-size must be at least 1.");
    opt.n_seq = n_seq;
    const int threads = a.integer("--threads", 0);
    if (threads < 0) fail("--threads must be 0 or more.");
    l.engine = std::make_unique<Engine>(*l.model, make_backend(a.str("--device", "auto"), threads), opt);
    return l;
}

}  // namespace nt::cli
