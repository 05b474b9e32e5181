// Token sampling: repetition penalties over the recently accepted tokens, then either greedy
// argmax or llama.cpp's default chain top-k -> top-p -> min-p -> temperature -> draw.
#pragma once

#include <cstdint>
#include <deque>
#include <random>
#include <utility>
#include <vector>

#include "backend/backend.h"

namespace nt {

// Defaults are llama.cpp's common_params_sampling defaults.
struct SamplerParams {
    float temperature = 0.8f;     // <= 0: greedy argmax
    int top_k = 40;               // <= 0 or >= n_vocab: disabled
    float top_p = 0.95f;          // 1: disabled
    float min_p = 0.05f;          // 0: disabled
    float repeat_penalty = 1.0f;  // 1: disabled
    int repeat_last_n = 64;       // window of accepted tokens the penalties look at; 0: penalties
                                  // off, -1: every token accepted since the last reset()
    float frequency_penalty = 0.f;
    float presence_penalty = 0.f;
    uint64_t seed = 0xFFFFFFFF;  // 0xFFFFFFFF (llama.cpp's LLAMA_DEFAULT_SEED): a random seed
};

// One sampler per sequence. Not thread-safe; sample() allocates nothing.
//
// Semantics follow llama.cpp's sampler chain with default settings:
// - penalties: for each token with count c > 0 in the window, a logit l becomes
//   (l <= 0 ? l * repeat_penalty : l / repeat_penalty) - (c * frequency_penalty +
//   presence_penalty);
// - top-k keeps the k largest logits; top-p keeps the shortest prefix (by descending probability
//   at temperature 1) whose mass reaches top_p; min-p keeps tokens with p >= min_p * p_max; only
//   then are the survivors' logits divided by the temperature, softmaxed, and one is drawn.
// Ties are broken towards the lower token id everywhere (argmax, top-k boundary, sort order),
// which makes results independent of the standard library.
//
// Randomness: std::mt19937_64 seeded with params.seed, one 64-bit draw per sample() at
// temperature > 0, mapped to a double in [0, 1) as (x >> 11) * 2^-53. Same seed, same logits,
// same accepted tokens -> same tokens, on every platform.
//
// To match llama.cpp's penalties, accept() the prompt tokens as well as the generated ones.
class Sampler {
  public:
    static constexpr uint64_t kRandomSeed = 0xFFFFFFFF;

    // Throws nt::Error when a parameter is out of range (named in the message).
    Sampler(const SamplerParams& params, int n_vocab);

    // logits: n_vocab raw scores of the next token. Throws nt::Error when they contain NaN or
    // leave no finite candidate.
    int32_t sample(const float* logits);
    // sample(logits) drawing with the uniform u instead of the next of this sampler's stream
    // (see sample_with below).
    int32_t sample_with(const float* logits, double u);

    // What the next draw needs of the logit row when the row stays where it was computed
    // (Backend::select_logits): the k best logits and the logits of the tokens this sampler's
    // penalties change and of `changed` (tokens the caller adds a bias to). k is the k of top-k
    // (1 when greedy) plus the number of those tokens: together they hold the top-k set after
    // every change, whichever way the changes go. k == 0 when the draw needs the whole row:
    // top-k off at a temperature above 0, or more candidates than a selection holds.
    LogitRequest request(const std::vector<int32_t>& changed = {}) const;
    // The token sample(row) would return, from the selection `c` that answered request() for
    // that row; `bias` (token, value) is added to the logits first, as a caller adds it to a row
    // before sample(row) (its tokens must be among request()'s `changed`).
    int32_t sample(const LogitRequest& req, const LogitCandidates& c,
                   const std::vector<std::pair<int32_t, float>>& bias = {});

    // Whether a backend can draw this sampler's tokens by itself at the end of a step
    // (Batch::choose), and how (`d`, all but its uniform): greedy, the top-k chain with top-k
    // at most kMaxLogitCandidates, or without top-k and top-p the whole vocabulary (top_k 0,
    // vocab_draw.h); and no penalty that could change a logit.
    bool device_draw(TokenDraw& d) const;
    // The uniform of the draw `ahead` draws from now (0: the next sample() at a temperature
    // above 0), drawn from the stream now and kept until those draws use it: a token drawn
    // elsewhere with it (TokenDraw::u) is the one sample() draws from the same candidates.
    double peek_uniform(size_t ahead);
    // sample(req, c) drawing with the uniform u instead of the next of this sampler's stream,
    // which stays where it was: the draw another party makes with a uniform peeked here (what
    // a device's TokenDraw computes, on the host).
    int32_t sample_with(const LogitRequest& req, const LogitCandidates& c, double u);

    // Records a token of the sequence for the penalties (prompt or generated).
    void accept(int32_t token);

    // Forgets the accepted tokens and restarts the random stream (a fixed seed replays the same
    // sequence; the random seed draws a fresh one).
    void reset();

    // Probability of the last sampled token in the distribution it was drawn from (after
    // penalties, truncation and temperature; 1 for greedy).
    float last_prob() const { return last_prob_; }

    // The k most likely tokens under the log-softmax of the raw logits (no penalties, no
    // temperature), most likely first, as (token, log-probability).
    std::vector<std::pair<int32_t, float>> top_logprobs(const float* logits, int k) const;

    // Applies the repetition/frequency/presence penalties of the current window in place.
    // sample() uses it; exposed so that callers and tests can see the penalised logits.
    void apply_penalties(float* logits) const;

    uint64_t seed() const { return seed_; }  // the seed in use (drawn when params.seed is random)
    const SamplerParams& params() const { return params_; }
    int n_vocab() const { return n_vocab_; }

  private:
    struct Candidate {
        float logit;
        float p;
        int32_t id;
    };

    bool top_k_on() const;              // 0 < top_k < n_vocab
    bool penalties_configured() const;  // the parameters can change a logit
    bool penalties_active() const;      // ... and the window holds a token
    int32_t sample_greedy(const float* logits);
    // Each fills cand_ with the candidates and returns their count.
    size_t select_top_k(const float* logits);     // top-k (sorted), then top-p
    float finite_max(const float* logits) const;  // the row's maximum; throws on NaN or none finite
    size_t select_all(const float* logits);       // no top-k: top-p or min-p over the vocabulary
    size_t finish_top_k(size_t k);                // cand_[0..k): the top k, sorted; then top-p
    // sample(req, c, bias), drawing with *u when given, else with the stream's next uniform.
    int32_t sample_candidates(const LogitRequest& req, const LogitCandidates& c,
                              const std::vector<std::pair<int32_t, float>>& bias, const double* u);
    float penalized(float logit, int count) const;
    size_t apply_top_p(size_t n, float max_l, double z);  // z: sum of exp(logit - max_l)
    size_t apply_min_p(size_t n);
    int32_t draw(size_t n, const double* u = nullptr);  // u: the uniform, else the stream's next
    // sample(logits) drawing with *u when given, else with the stream's next uniform.
    int32_t sample_row(const float* logits, const double* u);
    // No top-k and no top-p (OpenAI's default; min-p as a floor): vocab_draw.h's draw over every
    // token, summed in the hierarchy a device sums in, with no candidates built.
    int32_t draw_whole(const float* logits, const double* u);
    double uniform01();
    void reseed();

    SamplerParams params_;
    int n_vocab_;
    uint64_t seed_ = 0;
    std::mt19937_64 rng_;
    std::deque<double> ahead_;  // uniforms drawn by peek_uniform, not yet used, in stream order
    float last_prob_ = 0.f;

    std::vector<float> work_;  // penalised copy of the logits; draw_whole's weights
    std::vector<double> run_sums_, block_sums_;  // draw_whole's sums
    std::vector<Candidate> cand_;  // candidate set; its first n entries are live
    std::vector<int32_t> cand_at_;  // n_vocab: a token's index in cand_ while a selection is
                                    // sampled, else -1
    bool sorted_ = false;           // whether cand_[0..n) is in descending order

    // Penalty window: a ring of the last repeat_last_n accepted tokens (unused when the window
    // is unbounded: nothing is ever evicted), per-token counts, and the distinct tokens with
    // count > 0 so that applying the penalties costs O(distinct tokens), not O(n_vocab).
    std::vector<int32_t> ring_;
    size_t ring_head_ = 0;  // index of the oldest token when the ring is full
    size_t ring_size_ = 0;
    std::vector<int32_t> count_;     // n_vocab
    std::vector<int32_t> slot_;      // n_vocab: index in distinct_, or -1
    std::vector<int32_t> distinct_;  // tokens with count_ > 0
};

}  // namespace nt
