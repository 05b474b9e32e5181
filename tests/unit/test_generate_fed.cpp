// generate() on a backend that draws tokens itself (Batch::choose, kFedToken, take_token), as
// the CUDA backend does, with a CPU backend standing in for the device: the tokens must be
// exactly those of the host's own loop (sample, then feed), including when the "device" draws
// a different token now and then (rounding on a real device), which the host must catch and
// redraw, and the sampler's random stream must end where the host loop leaves it.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "engine/engine.h"
#include "feeding_cpu_backend.h"
#include "smol_model_test.h"

namespace nt {
namespace {

class FedGenerateTest : public testing_smol::SmolModelTest {
  protected:
    struct Run {
        std::vector<int32_t> tokens;
        GenerateStats st;
        double next_uniform = 0;  // where the sampler's stream stands afterwards
    };
    // generate() from `prompt` on a CPU backend (fed by drawing itself, or not), with a sampler
    // of settings p.
    static Run run(const SamplerParams& p, bool feeds, int wrong_every, int n_predict,
                   int n_ctx = 256, int* wrong = nullptr, int* chosen = nullptr) {
        EngineOptions o;
        o.n_ctx = n_ctx;
        const int V = model_->hp.shape.n_vocab;
        std::unique_ptr<Backend> be;
        FeedingCpuBackend* fb = nullptr;
        if (feeds) {
            auto f = std::make_unique<FeedingCpuBackend>(p, V, wrong_every);
            fb = f.get();
            be = std::move(f);
        } else {
            be = std::make_unique<CpuBackend>(0);
        }
        Engine eng(*model_, std::move(be), o);
        EXPECT_EQ(eng.pipelines(), feeds);
        Sampler s(p, V);
        const std::vector<int32_t> prompt =
            model_->tokenizer->encode("The quick brown fox", true, false);
        Run r;
        int pos = 0;
        r.st = generate(eng, s, 0, pos, prompt, n_predict, [&](int32_t id, const std::string&) {
            if (id >= 0) r.tokens.push_back(id);
            return true;
        });
        r.next_uniform = s.peek_uniform(0);
        if (fb && wrong) *wrong = fb->wrong();
        if (fb && chosen) *chosen = fb->steps_chosen();
        return r;
    }
};

SamplerParams sampled(uint64_t seed) {
    SamplerParams p;  // the default chain: top-k 40, top-p 0.95, min-p 0.05, temperature 0.8
    p.seed = seed;
    p.temperature = 1.3f;  // a flatter distribution: more tokens in play
    return p;
}

TEST_F(FedGenerateTest, SampledTokensAreTheHostLoops) {
    const Run host = run(sampled(7), false, 0, 24);
    int chosen = 0;
    const Run fed = run(sampled(7), true, 1 << 30, 24, 256, nullptr, &chosen);
    EXPECT_EQ(fed.tokens, host.tokens);
    EXPECT_EQ(fed.st.n_redrawn, 0);
    EXPECT_EQ(fed.next_uniform, host.next_uniform);
    EXPECT_GE(chosen, int(host.tokens.size()));  // the prompt's step and each fed one
}

TEST_F(FedGenerateTest, DrawsThatDifferAreCaughtAndRedrawn) {
    for (int every : {1, 2, 3}) {
        const Run host = run(sampled(11), false, 0, 30);
        int wrong = 0;
        const Run fed = run(sampled(11), true, every, 30, 256, &wrong);
        EXPECT_EQ(fed.tokens, host.tokens) << "every " << every;
        EXPECT_GT(fed.st.n_redrawn, 0) << "every " << every;
        EXPECT_LE(fed.st.n_redrawn, wrong) << "every " << every;  // dropped draws are not taken
        EXPECT_EQ(fed.next_uniform, host.next_uniform) << "every " << every;
    }
}

SamplerParams whole_vocabulary(uint64_t seed, float min_p) {
    SamplerParams p;  // OpenAI's default: temperature 1 over every token (min-p a floor)
    p.seed = seed;
    p.temperature = 1.f;
    p.top_k = 0;
    p.top_p = 1.f;
    p.min_p = min_p;
    return p;
}

TEST_F(FedGenerateTest, WholeVocabularyDrawsAreTheHostLoops) {
    for (float min_p : {0.f, 0.02f}) {
        const Run host = run(whole_vocabulary(13, min_p), false, 0, 24);
        int chosen = 0;
        const Run fed = run(whole_vocabulary(13, min_p), true, 1 << 30, 24, 256, nullptr, &chosen);
        EXPECT_EQ(fed.tokens, host.tokens) << "min-p " << min_p;
        EXPECT_EQ(fed.st.n_redrawn, 0) << "min-p " << min_p;
        EXPECT_EQ(fed.next_uniform, host.next_uniform) << "min-p " << min_p;
        EXPECT_GE(chosen, int(host.tokens.size())) << "min-p " << min_p;
        // A draw that differs is caught against the row and redrawn.
        int wrong = 0;
        const Run bad = run(whole_vocabulary(13, min_p), true, 2, 24, 256, &wrong);
        EXPECT_EQ(bad.tokens, host.tokens) << "min-p " << min_p;
        EXPECT_GT(bad.st.n_redrawn, 0) << "min-p " << min_p;
        EXPECT_LE(bad.st.n_redrawn, wrong) << "min-p " << min_p;
    }
}

TEST_F(FedGenerateTest, GreedyAndTheContextsEnd) {
    SamplerParams g;
    g.temperature = 0.f;
    const Run host = run(g, false, 0, 20);
    const Run fed = run(g, true, 1 << 30, 20);
    EXPECT_EQ(fed.tokens, host.tokens);
    // Until the context is full (no limit on the tokens): the same tokens, the same stop.
    const Run host_ctx = run(sampled(3), false, 0, -1, 16);
    const Run fed_ctx = run(sampled(3), true, 4, -1, 16);
    EXPECT_EQ(fed_ctx.tokens, host_ctx.tokens);
    EXPECT_EQ(fed_ctx.st.n_generated, host_ctx.st.n_generated);
}

TEST_F(FedGenerateTest, PenaltiesKeepTheHostLoop) {
    SamplerParams p = sampled(5);
    p.repeat_penalty = 1.2f;  // the device has no window counts: nothing is drawn there
    int chosen = 0;
    const Run host = run(p, false, 0, 12);
    const Run fed = run(p, true, 1, 12, 256, nullptr, &chosen);
    EXPECT_EQ(fed.tokens, host.tokens);
    EXPECT_EQ(chosen, 0);
}

}  // namespace
}  // namespace nt
