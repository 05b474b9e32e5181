// perplexity: llama.cpp's method, so the numbers compare directly with llama-perplexity.
#include <cstdio>

#include "cli/common.h"
#include "core/error.h"

namespace nt::cli {

int cmd_perplexity(int argc, char** argv) {
    std::vector<Opt> opts = model_opts();
    opts.push_back({"-f,--file", "FILE", "text file to score", ""});
    opts.push_back({"--chunks", "N", "score at most N chunks (-1: all)", "-1"});
    Args a("perplexity", opts);
    a.set_summary("Splits the text into non-overlapping chunks of -c tokens (default 512) and scores the second\n"
                  "half of each, as llama.cpp's perplexity tool does. Prints the estimate with its error.");
    if (!a.parse(argc, argv, 2)) return 0;
    if (!a.has("--file")) fail("no text given; pass a file with -f FILE.");
    const std::string text = read_file(a.str("--file"));
    const int n_ctx = a.integer("--ctx-size", 512) > 0 ? a.integer("--ctx-size", 512) : 512;
    if (n_ctx < 8) fail("-c must be at least 8 for perplexity.");
    const int max_chunks = a.integer("--chunks", -1);

    // The engine clamps its step to the context, so chunks of -c tokens go in ceil(c / -b) steps.
    Loaded l = load_model(a, 1, n_ctx);
    std::vector<int32_t> tokens = l.model->tokenizer->encode(text, true, false);
    if (max_chunks > 0 && int64_t(tokens.size()) > int64_t(max_chunks) * n_ctx) tokens.resize(size_t(max_chunks) * size_t(n_ctx));
    std::fprintf(stderr, "perplexity: %zu tokens, %zu chunks of %d\n", tokens.size(), tokens.size() / size_t(n_ctx), n_ctx);
    PerplexityResult r = perplexity(*l.engine, tokens, n_ctx, [](int i, double ppl) {
        std::printf("[%d]%.4f,", i + 1, ppl);
        std::fflush(stdout);
    });
    std::printf("\nFinal estimate: PPL = %.4f +/- %.5f\n", r.ppl, r.ppl_err);
    return 0;
}

}  // namespace nt::cli
