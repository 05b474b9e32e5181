// The continuous-batching scheduler against the engine's own single-sequence loop (generate()):
// jobs batched together, chunked, queued, cancelled or continued on a reserved slot must produce
// exactly the tokens each produces alone, and the slot bookkeeping must hold.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "engine/engine.h"
#include "feeding_cpu_backend.h"
#include "server/scheduler.h"
#include "smol_model_test.h"

namespace nt {
namespace {

class SchedulerTest : public testing_smol::SmolModelTest {
  protected:

    static std::unique_ptr<Engine> engine(int n_seq, int n_ctx = 256, int max_batch = 64) {
        EngineOptions o;
        o.n_seq = n_seq;
        o.n_ctx = n_ctx;
        o.max_batch = max_batch;
        return std::make_unique<Engine>(*model_, std::make_unique<CpuBackend>(0), o);
    }
    static std::vector<int32_t> tokens(const std::string& text) {
        return model_->tokenizer->encode(text, true, false);
    }
    static SamplerParams greedy() {
        SamplerParams p;
        p.temperature = 0;
        return p;
    }
    // Bans every end-of-generation token, for jobs that must run to their length.
    static std::vector<std::pair<int32_t, float>> no_eog() {
        std::vector<std::pair<int32_t, float>> bias;
        for (int32_t t = 0; t < model_->tokenizer->n_vocab(); t++)
            if (model_->tokenizer->is_eog(t)) bias.emplace_back(t, -100.f);
        return bias;
    }
    static std::unique_ptr<Sampler> greedy_sampler(const std::vector<int32_t>& prompt) {
        auto s = std::make_unique<Sampler>(greedy(), model_->hp.shape.n_vocab);
        for (int32_t t : prompt) s->accept(t);
        return s;
    }

    // The reference: greedy decoding of one sequence on its own (prefill, then one token per
    // step); the generated tokens, end-of-generation excluded.
    static std::vector<int32_t> reference(Engine& eng, const std::vector<int32_t>& prompt, int n,
                                          int seq = 0) {
        std::vector<int32_t> ids;
        eng.backend().kv_truncate(seq, 0);
        std::vector<float> logits = eng.prefill(seq, 0, prompt);
        int pos = int(prompt.size());
        Batch b;
        for (int i = 0; i < n; i++) {
            int32_t best = 0;
            for (int32_t t = 1; t < eng.n_vocab(); t++)
                if (logits[size_t(t)] > logits[size_t(best)]) best = t;
            if (model_->tokenizer->is_eog(best)) break;
            ids.push_back(best);
            if (i + 1 == n || pos >= eng.n_ctx()) break;
            b.clear();
            b.add(best, pos++, seq, true);
            eng.eval(b, logits);
        }
        return ids;
    }

    // Greedy outputs of a job equal its single-sequence reference exactly: the CPU backend is
    // batch-invariant (a sequence's logits are bit-identical alone and among others, chunked or
    // not: tests/unit/test_batch_invariance.cpp), so any difference is a bug (a token from
    // another sequence, a stale cache cell, a wrong position).
    static void expect_same_greedy(const std::vector<int32_t>& ref, const std::vector<int32_t>& got,
                                   const std::string& what) {
        EXPECT_EQ(got, ref) << what << ": differs from the single-sequence run";
    }

    static std::vector<int32_t> collect(Job& job, std::vector<GeneratedToken>* full = nullptr) {
        std::vector<GeneratedToken> got;
        while (!job.take(got, std::chrono::milliseconds(200))) {
        }
        std::vector<int32_t> ids;
        for (const GeneratedToken& g : got) ids.push_back(g.id);
        if (full) *full = std::move(got);
        return ids;
    }

};

const std::vector<std::string> kPrompts = {
    "The capital of France is",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "def fibonacci(n):",
    "List three colors:\n1.",
    "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog. "
    "Then the fox",
};

TEST_F(SchedulerTest, ConcurrentGreedyOutputsEqualSingleRuns) {
    auto eng = engine(4);
    const int n = 24;
    std::vector<std::vector<int32_t>> prompts;
    std::vector<std::vector<int32_t>> refs;
    for (size_t i = 0; i < 4; i++) {
        prompts.push_back(tokens(kPrompts[i]));
        refs.push_back(reference(*eng, prompts.back(), n));
    }
    // 12-token steps: prompts are chunked and their chunks share steps with other jobs' decodes.
    SchedulerOptions so;
    so.n_slots = 4;
    so.max_step_tokens = 12;
    Scheduler sched(*eng, so);
    std::vector<std::shared_ptr<Job>> jobs;
    for (size_t i = 0; i < prompts.size(); i++) {
        GenerationParams gp;
        gp.sampling = greedy();
        gp.max_tokens = n;
        jobs.push_back(sched.submit(prompts[i], gp, greedy_sampler(prompts[i])));
        ASSERT_TRUE(jobs.back());
    }
    for (size_t i = 0; i < jobs.size(); i++) {
        const std::vector<int32_t> got = collect(*jobs[i]);
        expect_same_greedy(refs[i], got, "prompt " + std::to_string(i));
        EXPECT_EQ(jobs[i]->finish_reason(),
                  got.size() == size_t(n) ? FinishReason::Length : FinishReason::Stop);
    }
    const SchedulerStats st = sched.stats();
    size_t prompt_total = 0;
    for (auto& p : prompts) prompt_total += p.size();
    EXPECT_EQ(st.prompt_tokens, prompt_total);
    // Run one after another the jobs would need >= 4 * n steps; batched, the decodes overlap.
    EXPECT_LT(st.steps, uint64_t(n + prompt_total / 8 + 8));
    EXPECT_EQ(st.active, 0);
    EXPECT_EQ(st.jobs_finished, 4u);
}

// Jobs drawing over the whole vocabulary (OpenAI's default) in shared steps: their rows are
// drawn side by side on the host's threads (Engine::sample_rows), each with its own sampler;
// every job's tokens must be those it draws alone (the CPU backend is batch-invariant).
TEST_F(SchedulerTest, ConcurrentWholeVocabularyDrawsEqualSingleRuns) {
    auto eng = engine(4);
    const int n = 20;
    auto run = [&](const std::vector<size_t>& which) {
        SchedulerOptions so;
        so.n_slots = 4;
        Scheduler sched(*eng, so);
        std::vector<std::shared_ptr<Job>> jobs;
        for (size_t i : which) {
            GenerationParams gp;
            gp.sampling.temperature = 1.f;
            gp.sampling.top_k = 0;
            gp.sampling.top_p = 1.f;
            gp.sampling.min_p = i == 2 ? 0.01f : 0.f;
            gp.sampling.seed = 40 + i;
            gp.max_tokens = n;
            gp.logit_bias = no_eog();
            const std::vector<int32_t> prompt = tokens(kPrompts[i]);
            auto s = std::make_unique<Sampler>(gp.sampling, model_->hp.shape.n_vocab);
            for (int32_t t : prompt) s->accept(t);
            jobs.push_back(sched.submit(prompt, gp, std::move(s)));
        }
        std::vector<std::vector<int32_t>> got;
        for (auto& j : jobs) got.push_back(collect(*j));
        return got;
    };
    const auto together = run({0, 1, 2, 3});
    for (size_t i = 0; i < 4; i++) {
        const auto alone = run({i});
        ASSERT_EQ(together[i].size(), size_t(n)) << "job " << i;
        EXPECT_EQ(together[i], alone[0]) << "job " << i;
    }
}

TEST_F(SchedulerTest, MoreJobsThanSlotsQueueReuseSlotsAndPrefixes) {
    auto eng = engine(2);
    const int n = 12;
    std::vector<std::vector<int32_t>> prompts;
    std::vector<std::vector<int32_t>> refs;
    for (const std::string& p : kPrompts) {
        prompts.push_back(tokens(p));
        refs.push_back(reference(*eng, prompts.back(), n));
    }
    SchedulerOptions so;
    so.n_slots = 2;
    so.max_queue = 8;
    auto sched = std::make_unique<Scheduler>(*eng, so);
    GenerationParams gp;
    gp.sampling = greedy();
    gp.max_tokens = n;
    std::vector<std::shared_ptr<Job>> jobs;
    for (auto& p : prompts) {
        jobs.push_back(sched->submit(p, gp, greedy_sampler(p)));
        ASSERT_TRUE(jobs.back());
    }
    // Five jobs through two slots: the later ones waited, then ran in slots other jobs had used.
    for (size_t i = 0; i < jobs.size(); i++)
        expect_same_greedy(refs[i], collect(*jobs[i]), "prompt " + std::to_string(i));
    EXPECT_GT(jobs.back()->stats().queue_seconds, 0.0);

    // The last prompt again: its tokens are in a slot's cache (all but the last, which is fed
    // again for its logits).
    const std::vector<int32_t>& last = prompts.back();
    auto again = sched->submit(last, gp, greedy_sampler(last));
    const std::vector<int32_t> again_ids = collect(*again);
    expect_same_greedy(refs.back(), again_ids, "repeated prompt");
    EXPECT_EQ(again->stats().n_cached, int(last.size()) - 1);

    // A prompt extending a cached one (prompt + its answer) reuses the shared prefix and still
    // matches its own reference.
    std::vector<int32_t> longer = last;
    longer.insert(longer.end(), again_ids.begin(), again_ids.end());
    auto job = sched->submit(longer, gp, greedy_sampler(longer));
    const std::vector<int32_t> got = collect(*job);
    EXPECT_EQ(job->stats().n_cached, int(longer.size()) - 1);
    EXPECT_EQ(sched->stats().prompt_tokens_cached, uint64_t(last.size() - 1 + longer.size() - 1));
    sched.reset();  // the engine is free again for the reference
    expect_same_greedy(reference(*eng, longer, n), got, "extended prompt");
}

TEST_F(SchedulerTest, QueueLimitRejectsAndCancelFreesTheSlot) {
    auto eng = engine(1);
    SchedulerOptions so;
    so.n_slots = 1;
    so.max_queue = 1;
    Scheduler sched(*eng, so);
    const std::vector<int32_t> p = tokens(kPrompts[1]);
    GenerationParams forever;
    forever.sampling = greedy();
    forever.max_tokens = -1;  // until the context is full
    forever.logit_bias = no_eog();
    auto a = sched.submit(p, forever, greedy_sampler(p));
    ASSERT_TRUE(a);
    // Wait until a holds the slot (its first token is out); before that a is still queued and
    // the queue limit below would count it.
    std::vector<GeneratedToken> got;
    while (got.empty()) ASSERT_FALSE(a->take(got, std::chrono::milliseconds(2000)));
    auto b = sched.submit(p, forever, greedy_sampler(p));
    ASSERT_TRUE(b);
    EXPECT_EQ(sched.submit(p, forever, greedy_sampler(p)), nullptr);  // slot busy, queue full
    EXPECT_EQ(sched.stats().jobs_rejected, 1u);
    EXPECT_EQ(sched.stats().queued, 1);

    // Let a produce a few tokens, then cancel it: b takes the slot at once.
    while (got.size() < 3) ASSERT_FALSE(a->take(got, std::chrono::milliseconds(2000)));
    const auto t0 = std::chrono::steady_clock::now();
    a->cancel();
    a->wait_finished();
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
    EXPECT_EQ(a->finish_reason(), FinishReason::Cancelled);
    EXPECT_LT(a->stats().n_generated, 256 - int(p.size()));
    std::vector<GeneratedToken> gb;
    while (gb.empty()) ASSERT_FALSE(b->take(gb, std::chrono::milliseconds(2000)));
    EXPECT_EQ(sched.stats().queued, 0);
    EXPECT_EQ(b->stats().n_cached, 0);  // a's cells were dropped with it, not offered as a prefix

    // A queued job that is cancelled leaves the queue without running.
    auto c = sched.submit(p, forever, greedy_sampler(p));
    ASSERT_TRUE(c);
    c->cancel();
    c->wait_finished();
    EXPECT_EQ(c->finish_reason(), FinishReason::Cancelled);
    EXPECT_EQ(c->stats().n_generated, 0);
    b->cancel();
    b->wait_finished();
    EXPECT_EQ(sched.stats().active, 0);
}

TEST_F(SchedulerTest, StopKeepsTheCacheAndCancelDropsIt) {
    auto eng = engine(1);
    Scheduler sched(*eng, SchedulerOptions{1, 4, 0});
    const std::vector<int32_t> p = tokens(kPrompts[1]);
    GenerationParams gp;
    gp.sampling = greedy();
    gp.logit_bias = no_eog();
    auto run_until = [&](std::shared_ptr<Job> job, size_t n) {
        std::vector<GeneratedToken> got;
        while (got.size() < n) EXPECT_FALSE(job->take(got, std::chrono::milliseconds(2000)));
    };
    // Ended by its consumer's stop condition: reason Stop, the slot keeps prompt and answer.
    auto a = sched.submit(p, gp, greedy_sampler(p));
    run_until(a, 3);
    a->stop();
    a->cancel();  // too late: the first request decides
    a->wait_finished();
    EXPECT_EQ(a->finish_reason(), FinishReason::Stop);
    auto b = sched.submit(p, gp, greedy_sampler(p));
    run_until(b, 1);
    EXPECT_EQ(b->stats().n_cached, int(p.size()) - 1);
    // Cancelled (its client left): the cells go with it.
    b->cancel();
    b->wait_finished();
    EXPECT_EQ(b->finish_reason(), FinishReason::Cancelled);
    auto c = sched.submit(p, gp, greedy_sampler(p));
    run_until(c, 1);
    EXPECT_EQ(c->stats().n_cached, 0);
    c->cancel();
    c->wait_finished();
    const SchedulerStats st = sched.stats();
    EXPECT_EQ(st.finished_by_reason[int(FinishReason::Stop)], 1u);
    EXPECT_EQ(st.finished_by_reason[int(FinishReason::Cancelled)], 2u);
}

TEST_F(SchedulerTest, LimitsMaxTokensAndContext) {
    auto eng = engine(2, 64);
    Scheduler sched(*eng, SchedulerOptions{2, 4, 0});
    const std::vector<int32_t> p = tokens(kPrompts[0]);
    GenerationParams gp;
    gp.sampling = greedy();
    gp.logit_bias = no_eog();

    gp.max_tokens = 5;
    auto a = sched.submit(p, gp, greedy_sampler(p));
    EXPECT_EQ(collect(*a).size(), 5u);
    EXPECT_EQ(a->finish_reason(), FinishReason::Length);

    gp.max_tokens = 0;
    auto b = sched.submit(p, gp, greedy_sampler(p));
    EXPECT_TRUE(collect(*b).empty());
    EXPECT_EQ(b->finish_reason(), FinishReason::Length);

    // Until the context is full: the last token sampled needs no room (it is never fed).
    gp.max_tokens = -1;
    auto c = sched.submit(p, gp, greedy_sampler(p));
    EXPECT_EQ(collect(*c).size(), size_t(64 - int(p.size()) + 1));
    EXPECT_EQ(c->finish_reason(), FinishReason::Length);

    std::vector<int32_t> too_long(65, p[1]);
    EXPECT_THROW(sched.submit(too_long, gp, greedy_sampler(too_long)), Error);
    EXPECT_THROW(sched.submit({}, gp, greedy_sampler({})), Error);
    EXPECT_THROW(sched.submit({1 << 30}, gp, greedy_sampler({})), Error);
}

TEST_F(SchedulerTest, LogprobsMatchTheLogSoftmaxOfTheLogits) {
    auto eng = engine(1);
    const std::vector<int32_t> p = tokens(kPrompts[0]);
    eng->backend().kv_truncate(0, 0);
    const std::vector<float> logits = eng->prefill(0, 0, p);
    // Independent reference in double precision.
    double mx = logits[0];
    for (float l : logits) mx = std::max(mx, double(l));
    double sum = 0;
    for (float l : logits) sum += std::exp(double(l) - mx);
    size_t best = 0;
    for (size_t i = 1; i < logits.size(); i++)
        if (logits[i] > logits[best]) best = i;
    const double ref_lp = double(logits[best]) - mx - std::log(sum);

    Scheduler sched(*eng, SchedulerOptions{1, 4, 0});
    GenerationParams gp;
    gp.sampling = greedy();
    gp.max_tokens = 6;
    gp.n_logprobs = 3;
    auto job = sched.submit(p, gp, greedy_sampler(p));
    std::vector<GeneratedToken> got;
    collect(*job, &got);
    ASSERT_EQ(got.size(), 6u);
    EXPECT_EQ(got[0].id, int32_t(best));
    EXPECT_NEAR(got[0].logprob, ref_lp, 1e-4);
    for (const GeneratedToken& g : got) {
        ASSERT_EQ(g.top.size(), 3u);
        EXPECT_EQ(g.top[0].id, g.id);  // greedy takes the most likely token
        EXPECT_NEAR(g.top[0].logprob, g.logprob, 1e-5);
        EXPECT_LE(g.logprob, 0.f);
        EXPECT_GE(g.top[0].logprob, g.top[1].logprob);
        EXPECT_GE(g.top[1].logprob, g.top[2].logprob);
        double mass = 0;
        for (const TokenLogprob& t : g.top) mass += std::exp(double(t.logprob));
        EXPECT_LE(mass, 1.0 + 1e-5);
    }
}

TEST_F(SchedulerTest, ReservedSlotContinuesFromItsCache) {
    auto eng = engine(2);
    std::vector<int32_t> full = tokens(kPrompts[1]);
    const std::vector<int32_t> ref = reference(*eng, full, 16);
    const std::vector<int32_t> first(full.begin(), full.begin() + 9),
        rest(full.begin() + 9, full.end());

    Scheduler sched(*eng, SchedulerOptions{2, 4, 0});
    const int slot = sched.reserve_slot();
    ASSERT_GE(slot, 0);
    Sampler sampler(greedy(), eng->n_vocab());
    for (int32_t t : full) sampler.accept(t);
    GenerationParams gp;
    gp.sampling = greedy();
    gp.max_tokens = 1;  // evaluates `first`; its one sampled token is not fed
    auto a = sched.submit_pinned(slot, 0, first, gp, &sampler);
    collect(*a);
    EXPECT_EQ(a->stats().kv_end, int(first.size()));
    gp.max_tokens = 16;
    auto b = sched.submit_pinned(slot, int(first.size()), rest, gp, &sampler);
    const std::vector<int32_t> got = collect(*b);
    expect_same_greedy(ref, got, "continued slot");
    // Every delivered token but a last one cut by max_tokens went through the model.
    EXPECT_EQ(b->stats().kv_end, int(full.size()) + int(got.size()) -
                                     (b->finish_reason() == FinishReason::Length ? 1 : 0));
    // A reserved slot is not handed to unpinned jobs; one free slot remains.
    const int other = sched.reserve_slot();
    EXPECT_GE(other, 0);
    EXPECT_NE(other, slot);
    EXPECT_EQ(sched.reserve_slot(), -1);
    sched.release_slot(other);
    sched.release_slot(slot);
    EXPECT_EQ(sched.stats().reserved, 0);
}

// ---- fed decoding ------------------------------------------------------------------------------

// A job decoding alone, with a sampler the device can draw for, runs fed as generate() does (each
// step enqueued before the host has the token it feeds). Over a CPU backend that draws its own
// tokens, wrong on purpose every few sampled draws, every job's tokens must be those over the
// plain CPU backend, which samples on the host: alone, when another job arrives mid-run (the fed
// run stops for ordinary batched steps, and resumes), after a cancel, on a reserved slot, up to a
// full context.
class SchedulerFedTest : public SchedulerTest {
  protected:
    static SamplerParams sampled(uint64_t seed) {
        SamplerParams p;  // the default chain; a flatter distribution: more tokens in play
        p.seed = seed;
        p.temperature = 1.3f;
        return p;
    }
    // An engine of n_seq sequences over the feeding backend (drawing as `p` says, the draw
    // after every `wrong_every` - 1 right ones wrong) or over the plain one (fb null).
    static std::unique_ptr<Engine> engine_on(bool feeds, const SamplerParams& p, int wrong_every,
                                             FeedingCpuBackend** fb, int n_seq = 2,
                                             int n_ctx = 256) {
        EngineOptions o;
        o.n_seq = n_seq;
        o.n_ctx = n_ctx;
        o.max_batch = 64;
        std::unique_ptr<Backend> be;
        *fb = nullptr;
        if (feeds) {
            auto f = std::make_unique<FeedingCpuBackend>(p, model_->hp.shape.n_vocab, wrong_every);
            *fb = f.get();
            be = std::move(f);
        } else {
            be = std::make_unique<CpuBackend>(0);
        }
        auto eng = std::make_unique<Engine>(*model_, std::move(be), o);
        EXPECT_EQ(eng->pipelines(), feeds);
        return eng;
    }
    static std::unique_ptr<Sampler> sampler_for(const SamplerParams& p,
                                                const std::vector<int32_t>& prompt) {
        auto s = std::make_unique<Sampler>(p, model_->hp.shape.n_vocab);
        for (int32_t t : prompt) s->accept(t);
        return s;
    }
    static GenerationParams params(const SamplerParams& p, int max_tokens) {
        GenerationParams gp;
        gp.sampling = p;
        gp.max_tokens = max_tokens;
        return gp;
    }
};

TEST_F(SchedulerFedTest, ALoneJobGetsTheHostLoopsTokens) {
    const SamplerParams p = sampled(7);
    const std::vector<int32_t> prompt = tokens(kPrompts[1]);
    std::vector<int32_t> got[2];
    FinishReason why[2];
    for (int feeds : {0, 1}) {
        FeedingCpuBackend* fb = nullptr;
        auto eng = engine_on(feeds, p, 3, &fb);
        auto sched = std::make_unique<Scheduler>(*eng, SchedulerOptions{2, 4, 0});
        auto job = sched->submit(prompt, params(p, 40), sampler_for(p, prompt));
        got[feeds] = collect(*job);
        why[feeds] = job->finish_reason();
        EXPECT_EQ(job->stats().n_generated, int(got[feeds].size()));
        // The step's record follows its token's delivery.
        for (int i = 0; i < 200 && sched->stats().generated_tokens < got[feeds].size(); i++)
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        EXPECT_EQ(sched->stats().generated_tokens, got[feeds].size());
        sched.reset();
        if (fb) {
            EXPECT_GE(fb->steps_chosen(), int(got[feeds].size()) - 1);  // every token but the first
            EXPECT_GT(fb->wrong(), 0);
            EXPECT_EQ(fb->pending(), 0);  // every choice taken or dropped
        }
    }
    EXPECT_GE(got[0].size(), 20u);
    EXPECT_EQ(got[1], got[0]);
    EXPECT_EQ(why[1], why[0]);
}

TEST_F(SchedulerFedTest, AnotherJobInterruptsTheFedRun) {
    const SamplerParams p = sampled(21);
    const std::vector<int32_t> pa = tokens(kPrompts[1]), pb = tokens(kPrompts[3]);
    std::vector<int32_t> a_got[2], b_got[2];
    for (int feeds : {0, 1}) {
        FeedingCpuBackend* fb = nullptr;
        auto eng = engine_on(feeds, p, 2, &fb);
        auto sched = std::make_unique<Scheduler>(*eng, SchedulerOptions{2, 4, 0});
        auto a = sched->submit(pa, params(p, 48), sampler_for(p, pa));
        std::vector<GeneratedToken> first;
        while (first.size() < 6) ASSERT_FALSE(a->take(first, std::chrono::milliseconds(2000)));
        // b starts beside a: a's run stops for batched steps of both, then resumes alone.
        auto b = sched->submit(pb, params(p, 12), sampler_for(p, pb));
        b_got[feeds] = collect(*b);
        for (const GeneratedToken& g : first) a_got[feeds].push_back(g.id);
        for (int32_t id : collect(*a)) a_got[feeds].push_back(id);
        sched.reset();
        if (fb) {
            EXPECT_EQ(fb->pending(), 0);
        }
    }
    EXPECT_GE(a_got[0].size(), 30u);
    EXPECT_EQ(a_got[1], a_got[0]);
    EXPECT_EQ(b_got[1], b_got[0]);
}

TEST_F(SchedulerFedTest, EndedRunsLeaveNoChoiceBehind) {
    const SamplerParams p = sampled(5);
    SamplerParams g;
    g.temperature = 0.f;
    const std::vector<int32_t> pe = tokens(kPrompts[3]), pa = tokens(kPrompts[2]),
                               pb = tokens(kPrompts[0]);
    std::vector<int32_t> e_got[2], b_got[2];
    for (int feeds : {0, 1}) {
        FeedingCpuBackend* fb = nullptr;
        auto eng = engine_on(feeds, p, 4, &fb, 1);
        auto sched = std::make_unique<Scheduler>(*eng, SchedulerOptions{1, 4, 0});
        // Ended by the model (greedy, this prompt ends in 36 tokens): the step fed after the
        // end-of-generation token is dropped.
        auto e = sched->submit(pe, params(g, -1), sampler_for(g, pe));
        e_got[feeds] = collect(*e);
        EXPECT_EQ(e->finish_reason(), FinishReason::Stop);
        // Cancelled mid-run.
        auto a = sched->submit(pa, params(p, -1), sampler_for(p, pa));
        std::vector<GeneratedToken> got;
        while (got.size() < 4) ASSERT_FALSE(a->take(got, std::chrono::milliseconds(2000)));
        a->cancel();
        a->wait_finished();
        EXPECT_EQ(a->finish_reason(), FinishReason::Cancelled);
        // The next job starts on the same slot and backend: a choice left queued by a run
        // before would be taken as b's.
        auto b = sched->submit(pb, params(p, 16), sampler_for(p, pb));
        b_got[feeds] = collect(*b);
        sched.reset();
        if (fb) {
            EXPECT_EQ(fb->pending(), 0);
        }
    }
    EXPECT_FALSE(b_got[0].empty());
    EXPECT_EQ(e_got[1], e_got[0]);
    EXPECT_EQ(b_got[1], b_got[0]);
}

TEST_F(SchedulerFedTest, GreedyOnAReservedSlotToAFullContext) {
    SamplerParams g;
    g.temperature = 0.f;
    const std::vector<int32_t> prompt = tokens(kPrompts[4]);
    std::vector<int32_t> got[2];
    int kv_end[2] = {};
    for (int feeds : {0, 1}) {
        FeedingCpuBackend* fb = nullptr;
        auto eng = engine_on(feeds, g, 1, &fb, 2, 48);
        Scheduler sched(*eng, SchedulerOptions{2, 4, 0});
        const int slot = sched.reserve_slot();
        ASSERT_GE(slot, 0);
        Sampler s(g, eng->n_vocab());
        auto job = sched.submit_pinned(slot, 0, prompt, params(g, -1), &s);
        got[feeds] = collect(*job);
        kv_end[feeds] = job->stats().kv_end;
        if (job->finish_reason() == FinishReason::Length) {
            EXPECT_EQ(kv_end[feeds], 48);
        }
        sched.release_slot(slot);
    }
    EXPECT_EQ(got[1], got[0]);
    EXPECT_EQ(kv_end[1], kv_end[0]);
}

// The top-k chain and (OpenAI's default request) the draw over the whole vocabulary.
TEST_F(SchedulerFedTest, ALogitBiasGoesWithTheDraw) {
    SamplerParams whole = sampled(13);
    whole.temperature = 1.f;
    whole.top_k = 0;
    whole.top_p = 1.f;
    whole.min_p = 0.f;
    for (const SamplerParams& p : {sampled(13), whole}) {
        const std::string what = p.top_k == 0 ? "whole vocabulary" : "top-k";
        const std::vector<int32_t> prompt = tokens(kPrompts[3]);
        std::vector<int32_t> got[2];
        // End of generation banned (the prompt ends in 36 tokens greedily), one token pushed
        // up, one given twice.
        GenerationParams gp = params(p, 40);
        gp.logit_bias = no_eog();
        ASSERT_LE(gp.logit_bias.size() + 2, size_t(kMaxDrawBias));
        const int32_t up = tokens(" blue").back();
        gp.logit_bias.emplace_back(up, 9.f);
        gp.logit_bias.emplace_back(up, -0.75f);
        for (int feeds : {0, 1}) {
            FeedingCpuBackend* fb = nullptr;
            auto eng = engine_on(feeds, p, 3, &fb);
            auto sched = std::make_unique<Scheduler>(*eng, SchedulerOptions{2, 4, 0});
            auto job = sched->submit(prompt, gp, sampler_for(p, prompt));
            got[feeds] = collect(*job);
            EXPECT_EQ(job->finish_reason(), FinishReason::Length) << what;
            sched.reset();
            if (fb) {
                EXPECT_GE(fb->steps_chosen(), int(got[feeds].size()) - 1) << what;
            }
        }
        EXPECT_EQ(got[1], got[0]) << what;
        EXPECT_GT(std::count(got[0].begin(), got[0].end(), up), 0) << what;
    }
}

TEST_F(SchedulerFedTest, LogprobsPenaltiesOrALongBiasKeepTheHostLoop) {
    const SamplerParams p = sampled(9);
    const std::vector<int32_t> prompt = tokens(kPrompts[0]);
    FeedingCpuBackend* fb = nullptr;
    auto eng = engine_on(true, p, 1, &fb);
    auto sched = std::make_unique<Scheduler>(*eng, SchedulerOptions{2, 4, 0});
    GenerationParams logprobs = params(p, 8);
    logprobs.n_logprobs = 0;
    SamplerParams penalised = p;
    penalised.repeat_penalty = 1.2f;
    GenerationParams long_bias = params(p, 8);
    for (int32_t t = 0; t <= kMaxDrawBias; t++) long_bias.logit_bias.emplace_back(1000 + t, -1.f);
    collect(*sched->submit(prompt, logprobs, sampler_for(p, prompt)));
    collect(*sched->submit(prompt, params(penalised, 8), sampler_for(penalised, prompt)));
    collect(*sched->submit(prompt, long_bias, sampler_for(p, prompt)));
    sched.reset();
    EXPECT_EQ(fb->steps_chosen(), 0);
}

}  // namespace
}  // namespace nt
