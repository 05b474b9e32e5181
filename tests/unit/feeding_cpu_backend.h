// A CPU backend that draws each step's token itself, as the CUDA backend does on the device
// (Batch::choose, kFedToken, take_token), for testing the fed loops (generate(), the scheduler)
// on the CPU: tests/unit/test_generate_fed.cpp, tests/unit/test_scheduler.cpp.
#pragma once
#include <deque>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "engine/sampler.h"

namespace nt {

// The CPU backend with a token drawn at the end of each step that asks for one: from the
// step's k best logits (select_logits_host) with the step's uniform, as Sampler::sample_with
// draws, or with top_k 0 from the whole row. Every `wrong_every`-th sampled draw returns
// another candidate (another token) instead.
class FeedingCpuBackend : public CpuBackend {
  public:
    FeedingCpuBackend(const SamplerParams& p, int n_vocab, int wrong_every)
        : CpuBackend(0), drawer_(p, n_vocab), n_vocab_(n_vocab), wrong_every_(wrong_every) {}

    bool feeds_tokens() const override { return true; }
    void begin_step(const Batch& batch) override {
        Batch b = batch;
        for (int32_t& t : b.tokens)
            if (t == kFedToken) {
                if (ring_.empty() && !fed_) fail("a step names a token that was never drawn.");
                t = last_;
            }
        choose_ = batch.choose;
        draw_ = batch.draw;
        CpuBackend::begin_step(b);
    }
    void end_step() override {
        CpuBackend::end_step();
        if (!choose_) return;
        if (ring_.size() == size_t(kMaxChosen)) fail("the ring is full.");
        LogitRequest req;
        req.k = draw_.top_k > 0 ? draw_.top_k : 2;  // (the whole row: its best two, for a wrong token)
        Drawn d;
        d.row.assign(acts().logits, acts().logits + n_vocab_);
        std::vector<float> row = d.row;
        for (int i = 0; i < draw_.n_bias; i++) row[size_t(draw_.bias_id[i])] += draw_.bias[i];
        select_logits_host(row.data(), n_vocab_, req, d.from);
        d.token = !(draw_.temperature > 0.f) ? d.from.top_id[0]
                  : draw_.top_k > 0          ? drawer_.sample_with(req, d.from, draw_.u)
                                             : drawer_.sample_with(row.data(), draw_.u);
        if (draw_.temperature > 0.f && ++draws_ % wrong_every_ == 0) {
            d.token = d.token == d.from.top_id[0] ? d.from.top_id[1] : d.from.top_id[0];
            wrong_++;
        }
        if (draw_.top_k == 0) d.from = LogitCandidates{};
        ring_.push_back(d);
        last_ = d.token;
        fed_ = true;
        steps_chosen_++;
    }
    int32_t take_token(LogitCandidates* from, std::vector<float>* row) override {
        if (ring_.empty()) fail("take_token: no token was chosen.");
        const Drawn d = ring_.front();
        ring_.pop_front();
        if (from) *from = d.from;
        if (row) *row = d.row;
        return d.token;
    }
    int wrong() const { return wrong_; }
    int steps_chosen() const { return steps_chosen_; }
    int pending() const { return int(ring_.size()); }  // choices not taken yet

  private:
    struct Drawn {
        int32_t token = -1;
        LogitCandidates from;
        std::vector<float> row;  // as the step produced it (before the bias)
    };
    Sampler drawer_;  // its own stream is never used: every draw comes with its uniform
    int n_vocab_, wrong_every_;
    bool choose_ = false, fed_ = false;
    TokenDraw draw_;
    std::deque<Drawn> ring_;
    int32_t last_ = 0;
    int draws_ = 0, wrong_ = 0, steps_chosen_ = 0;
};

}  // namespace nt
