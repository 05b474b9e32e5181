// generate: streams the continuation of a prompt to stdout, speeds to stderr.
#include <algorithm>
#include <cstdio>

#include "cli/common.h"
#include "core/error.h"

namespace nt::cli {

int cmd_generate(int argc, char** argv) {
    std::vector<Opt> opts = model_opts();
    opts.push_back({"-p,--prompt", "TEXT", "prompt text", ""});
    opts.push_back({"-f,--file", "FILE", "read the prompt from a file", ""});
    opts.push_back({"-n,--n-predict", "N", "tokens to generate (-1: until end of text or context)", "128"});
    opts.push_back({"--no-special", "", "do not parse special tokens written in the prompt", ""});
    opts.push_back({"--stats", "", "print per-step statistics to stderr", ""});
    for (auto& o : sampling_opts()) opts.push_back(o);
    Args a("generate", opts);
    a.set_summary("Continues a prompt; the continuation streams to stdout, prompt and decode speed go to stderr.");
    if (!a.parse(argc, argv, 2)) return 0;
    if (!a.positional().empty()) fail("unexpected argument '%s' for 'generate'.", a.positional()[0].c_str());
    if (a.has("--prompt") && a.has("--file")) fail("give the prompt with -p or -f, not both.");
    std::string prompt = a.has("--file") ? read_file(a.str("--file")) : a.str("--prompt");
    const int n_predict = a.integer("--n-predict", 128);
    SamplerParams sp = sampler_params(a);

    Loaded l = load_model(a);
    Engine& eng = *l.engine;
    const Tokenizer& tok = *l.model->tokenizer;
    std::vector<int32_t> ids = tok.encode(prompt, true, !a.has("--no-special"));
    if (ids.empty()) fail("the prompt is empty; give some text with -p.");
    if (int(ids.size()) >= eng.n_ctx())
        fail("the prompt has %zu tokens but the context holds %d; shorten it or raise -c.", ids.size(), eng.n_ctx());
    Sampler sampler(sp, eng.n_vocab());
    int pos = 0;
    if (eng.streamer()) eng.streamer()->reset_stats();
    GenerateStats st = generate(eng, sampler, 0, pos, ids, n_predict, [&](int32_t, const std::string& text) {
        std::fwrite(text.data(), 1, text.size(), stdout);
        std::fflush(stdout);
        return true;
    });
    std::printf("\n");
    std::fprintf(stderr, "\nprompt: %d tokens in %.3f s, %.2f tok/s | decode: %d tokens in %.3f s, %.2f tok/s | %s\n",
                 st.n_prompt, st.prompt_seconds, st.n_prompt / std::max(st.prompt_seconds, 1e-9), st.n_generated,
                 st.decode_seconds, st.n_generated > 1 ? (st.n_generated - 1) / std::max(st.decode_seconds, 1e-9) : 0.0,
                 eng.backend().name().c_str());
    if (a.has("--stats") && st.n_redrawn > 0)
        std::fprintf(stderr, "%d tokens drawn on the device differed from the host's draw (redrawn)\n",
                     st.n_redrawn);
    if (a.has("--stats") && eng.streamer())
        std::fprintf(stderr, "%s", stream_report(eng, eng.streamer()->stats(), "prompt and decode").c_str());
    write_trace_if_asked(a, eng);
    return 0;
}

}  // namespace nt::cli
