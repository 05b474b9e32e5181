// bench: llama-bench-like throughput table, plus the decode step's bytes, bandwidth and the
// fraction of the measured memory ceiling it reaches.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>

#include "cli/common.h"
#include "core/error.h"

namespace nt::cli {

namespace {

struct Stat {
    double mean = 0, sd = 0;
};
Stat stats(const std::vector<double>& v) {
    Stat s;
    for (double x : v) s.mean += x;
    s.mean /= double(v.size());
    for (double x : v) s.sd += (x - s.mean) * (x - s.mean);
    s.sd = v.size() > 1 ? std::sqrt(s.sd / double(v.size() - 1)) : 0.0;
    return s;
}

// Bytes of weights one decode step reads: every layer, the final norm and the output matrix
// (the token embedding contributes one row).
size_t decode_bytes(const ModelWeights& w) {
    size_t b = w.output_norm.nbytes + w.output.nbytes;
    for (const auto& l : w.layers) b += l.nbytes();
    b += row_bytes(w.tok_embd.type, w.tok_embd.cols);
    return b;
}

}  // namespace

int cmd_bench(int argc, char** argv) {
    std::vector<Opt> opts = model_opts();
    opts.push_back({"-p,--n-prompt", "N", "prompt tokens for the pp test (0: skip)", "512"});
    opts.push_back({"-n,--n-gen", "N", "generated tokens for the tg test (0: skip)", "128"});
    opts.push_back({"-r,--repetitions", "N", "repetitions of each test", "3"});
    opts.push_back({"--ceiling", "GB/s", "memory bandwidth ceiling (default: measured now)", ""});
    opts.push_back(
        {"--readback", "WHAT",
         "what a tg step copies back: fed (greedy generation as generate runs it: the token "
         "chosen on the device feeds the next step, queued before the host has it), drawn (the "
         "same with generate's default sampler, top-k 40, drawn on the device and checked on "
         "the host), whole (the same at temperature 1 over the whole vocabulary, OpenAI's "
         "default, each draw checked on the host against the row), whole-host (the same drawn on the "
         "host from the row copied back after each step), top (the greedy token, after "
         "each step), sampled (the default sampler's candidates, drawn on the host after each "
         "step), row (the whole logit row, as llama-bench does) or none (nothing: the steps "
         "queue back to back)",
         "fed"});
    opts.push_back({"--json", "", "print the results as JSON", ""});
    Args a("bench", opts);
    a.set_summary(
        "Measures prompt processing (pp) and text generation (tg) throughput on random tokens.");
    if (!a.parse(argc, argv, 2)) return 0;
    const int n_prompt = a.integer("--n-prompt", 512), n_gen = a.integer("--n-gen", 128);
    const int reps = a.integer("--repetitions", 3);
    std::string readback = a.str("--readback", "fed");
    if (readback != "fed" && readback != "drawn" && readback != "whole" &&
        readback != "whole-host" && readback != "top" && readback != "sampled" &&
        readback != "row" && readback != "none")
        fail("--readback takes fed, drawn, whole, whole-host, top, sampled, row or none, not "
             "'%s'.",
             readback.c_str());
    if (n_prompt < 0 || n_gen < 0 || reps < 1)
        fail("-p and -n must be 0 or more and -r at least 1.");

    Loaded l = load_model(a);
    Engine& eng = *l.engine;
    if (n_prompt + 1 > eng.n_ctx() || n_gen + 1 > eng.n_ctx())
        fail("the tests need %d tokens of context but it holds %d; raise -c.",
             std::max(n_prompt, n_gen) + 1, eng.n_ctx());
    const double ceiling =
        a.has("--ceiling") ? a.number("--ceiling", 0) : eng.backend().measure_read_bandwidth();
    std::mt19937 rng(1234);
    std::uniform_int_distribution<int32_t> tok_dist(0, eng.n_vocab() - 1);
    std::vector<float> logits;
    SamplerParams gp;
    gp.temperature = 0.f;
    Sampler greedy(gp, eng.n_vocab());
    Sampler chain(SamplerParams{}, eng.n_vocab());  // generate's default
    SamplerParams wp;  // OpenAI's default: temperature 1 over the whole vocabulary
    wp.temperature = 1.f;
    wp.top_k = 0;
    wp.top_p = 1.f;
    wp.min_p = 0.f;
    Sampler whole(wp, eng.n_vocab());
    // A backend that cannot feed tokens copies them back instead.
    if (readback == "fed" && !eng.pipelines()) readback = "top";
    if (readback == "drawn" && !eng.pipelines()) readback = "sampled";
    if (readback == "whole" && !eng.pipelines()) readback = "whole-host";
    const bool whole_on_host = readback == "whole-host";
    int redrawn = 0;  // drawn: device draws the host's sampler drew otherwise

    using clock = std::chrono::steady_clock;
    std::vector<double> pp, tg;
    mem::WeightStreamer* ws = eng.streamer();  // streaming: per-stage stats of the last repetition
    mem::StreamStats pp_stream, tg_stream;
    // One untimed warm-up of each kind (page faults, kernel selection, graph capture).
    for (int r = -1; r < reps; r++) {
        if (n_prompt > 0) {
            std::vector<int32_t> toks(static_cast<size_t>(n_prompt));
            for (auto& t : toks) t = tok_dist(rng);
            eng.backend().kv_truncate(0, 0);
            if (ws) ws->reset_stats();
            auto t0 = clock::now();
            eng.prefill(0, 0, toks);
            const double s = std::chrono::duration<double>(clock::now() - t0).count();
            if (r >= 0) pp.push_back(n_prompt / s);
            if (ws) pp_stream = ws->stats();
        }
        if (n_gen > 0) {
            eng.backend().kv_truncate(0, 0);
            if (ws) ws->reset_stats();
            Batch b;
            auto t0 = clock::now();
            if (readback == "fed" || readback == "drawn" || readback == "whole") {
                // Generation as generate() runs it (FedSteps): each step is enqueued before
                // the host has the token it feeds, which the step before drew on the device
                // (greedy, or a sampler with each draw checked on the host).
                Sampler& s = readback == "fed" ? greedy : readback == "drawn" ? chain : whole;
                TokenDraw d;
                s.device_draw(d);
                FedSteps steps(eng, s, d, 0);
                auto take = [&](int refeed_pos) {
                    const DrawnToken t = steps.take(refeed_pos);
                    if (t.token != t.drawn) redrawn++;
                };
                for (int i = 0; i < n_gen; i++) {
                    steps.enqueue(i == 0 ? tok_dist(rng) : kFedToken, i);
                    if (i > 0) take(i);
                }
                take(-1);
            } else {
                for (int i = 0; i < n_gen; i++) {
                    b.clear();
                    b.add(tok_dist(rng), i, 0, true);
                    if (readback == "row") {
                        eng.eval(b, logits);
                    } else {
                        eng.forward(b);
                        // The token is not fed back.
                        if (readback == "top") eng.sample(greedy);
                        if (readback == "sampled") eng.sample(chain);
                        if (whole_on_host) eng.sample(whole);
                    }
                }
            }
            eng.backend().wait();
            const double s = std::chrono::duration<double>(clock::now() - t0).count();
            if (r >= 0) tg.push_back(n_gen / s);
            if (ws) tg_stream = ws->stats();
        }
    }
    write_trace_if_asked(a, eng);
    const LlamaHParams& hp = l.model->hp;
    const size_t bytes = decode_bytes(l.model->weights);
    const double size_gib = double(l.model->file->file_size()) / double(1 << 30);
    // The backend, and whether its prompts compute the CPU's arithmetic where that is a choice
    // (--exact or NT_EXACT_PROMPT=1 on a GPU): the prompt path it names runs at another speed.
    const bool exact = eng.backend().exact();
    const std::string backend =
        eng.backend().name() + (exact && eng.backend().name() != "cpu" ? " exact" : "");
    Stat sp = pp.empty() ? Stat{} : stats(pp), st = tg.empty() ? Stat{} : stats(tg);
    const double gbs = st.mean * double(bytes) / 1e9;
    if (a.has("--json")) {
        std::printf(
            "{\"model\": \"%s\", \"size_gib\": %.3f, \"params\": %lld, \"backend\": \"%s\", "
            "\"exact\": %s, \"threads\": %d,\n",
            hp.name.c_str(), size_gib, (long long)count_params(*l.model->file),
            eng.backend().name().c_str(), exact ? "true" : "false", a.integer("--threads", 0));
        std::printf(" \"pp\": {\"n\": %d, \"tok_s\": %.3f, \"sd\": %.3f},\n", n_prompt, sp.mean,
                    sp.sd);
        std::printf(" \"tg\": {\"n\": %d, \"tok_s\": %.3f, \"sd\": %.3f, \"readback\": \"%s\"},\n",
                    n_gen, st.mean, st.sd, readback.c_str());
        std::printf(
            " \"decode_bytes_per_token\": %zu, \"decode_gb_s\": %.3f, \"ceiling_gb_s\": %.3f, "
            "\"roofline_tok_s\": %.3f, "
            "\"fraction_of_ceiling\": %.4f}\n",
            bytes, gbs, ceiling, ceiling > 0 ? ceiling * 1e9 / double(bytes) : 0.0,
            ceiling > 0 ? gbs / ceiling : 0.0);
        return 0;
    }
    std::printf(
        "| model | size | params | backend | test | t/s |\n| --- | ---: | ---: | --- | ---: | ---: "
        "|\n");
    if (!pp.empty())
        std::printf("| %s | %.2f GiB | %.2f B | %s | pp%d | %.2f ± %.2f |\n", hp.name.c_str(),
                    size_gib, double(count_params(*l.model->file)) / 1e9, backend.c_str(), n_prompt,
                    sp.mean, sp.sd);
    if (!tg.empty())
        std::printf("| %s | %.2f GiB | %.2f B | %s | tg%d | %.2f ± %.2f |\n", hp.name.c_str(),
                    size_gib, double(count_params(*l.model->file)) / 1e9, backend.c_str(), n_gen,
                    st.mean, st.sd);
    if (!tg.empty()) {
        std::printf("\ndecode: %.1f MiB of weights per token, %.1f GB/s", double(bytes) / (1 << 20),
                    gbs);
        if (ceiling > 0)
            std::printf(" = %.1f%% of the %.0f GB/s ceiling (roofline %.1f tok/s)",
                        100.0 * gbs / ceiling, ceiling, ceiling * 1e9 / double(bytes));
        std::printf("; tg steps copy back: %s\n",
                    readback == "fed" ? "the greedy token, chosen and fed on the device"
                    : readback == "drawn"
                        ? "the default sampler's token and candidates, drawn and fed on the device"
                    : readback == "whole"
                        ? "the token drawn over the whole vocabulary and fed on the device, and "
                          "the row"
                    : whole_on_host ? "the whole logit row, drawn from on the host"
                    : readback == "top"     ? "the greedy token"
                    : readback == "sampled" ? "the default sampler's top-k candidates"
                    : readback == "row"     ? "the whole logit row"
                                            : "nothing");
        if (redrawn > 0)
            std::printf("%d device draws differed from the host sampler's\n", redrawn);
    }
    if (ws) {
        std::printf("\n%s", eng.memory().text.c_str());
        if (!pp.empty())
            std::printf(
                "%s",
                stream_report(eng, pp_stream, strfmt("pp%d, last run", n_prompt).c_str()).c_str());
        if (!tg.empty())
            std::printf(
                "%s",
                stream_report(eng, tg_stream, strfmt("tg%d, last run", n_gen).c_str()).c_str());
    }
    return 0;
}

}  // namespace nt::cli
