#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "backend/vocab_draw.h"
#include "core/error.h"

namespace nt {

namespace {

constexpr size_t kTopPFirstPass = 256;  // top-p sorts this many first; most mass lies there
// top-k uses a bounded heap up to k = max(256, n_vocab / 64) and nth_element over the whole
// vocabulary above (measured crossover on a 128k vocabulary: between k = 1000 and k = 8000).
constexpr size_t kHeapTopKMin = 256;
constexpr size_t kHeapTopKVocabDiv = 64;
constexpr size_t kBlock = 64;  // top-k skips whole blocks whose maximum cannot enter

// Maximum of x[0..n) and whether any element is NaN (ignored by the maximum). GCC vector
// extensions keep four 4-wide accumulators in flight on any x86-64 (SSE2) or ARM target; the
// scalar loop it replaces ran at a quarter of the speed on a 128k vocabulary.
struct MaxScan {
    float max;
    bool nan;
};

MaxScan scan_max(const float* x, size_t n) {
    typedef float v4f __attribute__((vector_size(16)));
    typedef int32_t v4i __attribute__((vector_size(16)));
    const float ninf = -std::numeric_limits<float>::infinity();
    v4f m0 = {ninf, ninf, ninf, ninf}, m1 = m0, m2 = m0, m3 = m0;
    v4i bad = {0, 0, 0, 0};
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        v4f a, b, c, d;
        std::memcpy(&a, x + i, sizeof a);
        std::memcpy(&b, x + i + 4, sizeof b);
        std::memcpy(&c, x + i + 8, sizeof c);
        std::memcpy(&d, x + i + 12, sizeof d);
        m0 = a > m0 ? a : m0;
        m1 = b > m1 ? b : m1;
        m2 = c > m2 ? c : m2;
        m3 = d > m3 ? d : m3;
        bad |= (a != a) | (b != b) | (c != c) | (d != d);
    }
    m0 = m1 > m0 ? m1 : m0;
    m2 = m3 > m2 ? m3 : m2;
    m0 = m2 > m0 ? m2 : m0;
    MaxScan r{ninf, (bad[0] | bad[1] | bad[2] | bad[3]) != 0};
    for (int j = 0; j < 4; ++j) r.max = std::max(r.max, m0[j]);
    for (; i < n; ++i) {
        r.nan |= std::isnan(x[i]);
        if (x[i] > r.max) r.max = x[i];
    }
    return r;
}

// exp of a float, rounded to float from the double exp: a device that draws (logit_select.cu)
// computes its weights so, and a float exp is not correctly rounded everywhere (glibc's is
// within 0.502 ulp), which at a boundary of the cumulative weights could draw another token.
inline float exp_rounded(float x) {
    return float(std::exp(double(x)));
}

[[noreturn]] void fail_nan() {
    fail("sampler: the logits contain NaN; the model produced invalid values.");
}

}  // namespace

Sampler::Sampler(const SamplerParams& params, int n_vocab) : params_(params), n_vocab_(n_vocab) {
    const SamplerParams& p = params_;
    if (n_vocab <= 0) fail("sampler: the vocabulary size must be positive, got %d.", n_vocab);
    if (std::isnan(p.temperature) || std::isinf(p.temperature))
        fail("sampler: temperature must be a finite number, got %g.", double(p.temperature));
    if (!(p.top_p >= 0.f && p.top_p <= 1.f))
        fail("sampler: top_p must be between 0 and 1, got %g.", double(p.top_p));
    if (!(p.min_p >= 0.f && p.min_p <= 1.f))
        fail("sampler: min_p must be between 0 and 1, got %g.", double(p.min_p));
    if (!(p.repeat_penalty > 0.f) || !std::isfinite(p.repeat_penalty) ||
        !std::isfinite(1.f / p.repeat_penalty))
        fail("sampler: repeat_penalty must be a finite number greater than 0, got %g.",
             double(p.repeat_penalty));
    if (!std::isfinite(p.frequency_penalty))
        fail("sampler: frequency_penalty must be a finite number, got %g.",
             double(p.frequency_penalty));
    if (!std::isfinite(p.presence_penalty))
        fail("sampler: presence_penalty must be a finite number, got %g.",
             double(p.presence_penalty));
    if (p.repeat_last_n < -1)
        fail(
            "sampler: repeat_last_n must be -1 (whole sequence), 0 (off) or a window size, got "
            "%d.",
            p.repeat_last_n);

    work_.resize(size_t(n_vocab));
    run_sums_.resize((size_t(n_vocab) + kDrawRun - 1) / kDrawRun);
    block_sums_.resize((size_t(n_vocab) + kDrawBlock - 1) / kDrawBlock);
    cand_.resize(size_t(n_vocab));
    cand_at_.assign(size_t(n_vocab), -1);
    count_.assign(size_t(n_vocab), 0);
    slot_.assign(size_t(n_vocab), -1);
    if (p.repeat_last_n > 0) {
        ring_.resize(size_t(p.repeat_last_n));
        distinct_.reserve(std::min(size_t(p.repeat_last_n), size_t(n_vocab)));
    }
    reseed();
}

void Sampler::reseed() {
    if (params_.seed == kRandomSeed) {
        std::random_device rd;
        seed_ = (uint64_t(rd()) << 32) ^ uint64_t(rd());
    } else {
        seed_ = params_.seed;
    }
    rng_.seed(seed_);
    ahead_.clear();
}

void Sampler::reset() {
    for (int32_t t : distinct_) {
        count_[size_t(t)] = 0;
        slot_[size_t(t)] = -1;
    }
    distinct_.clear();
    ring_head_ = 0;
    ring_size_ = 0;
    last_prob_ = 0.f;
    reseed();
}

double Sampler::uniform01() {
    if (!ahead_.empty()) {
        const double u = ahead_.front();
        ahead_.pop_front();
        return u;
    }
    return double(rng_() >> 11) * 0x1.0p-53;
}

double Sampler::peek_uniform(size_t ahead) {
    while (ahead_.size() <= ahead) ahead_.push_back(double(rng_() >> 11) * 0x1.0p-53);
    return ahead_[ahead];
}

bool Sampler::penalties_configured() const {
    return params_.repeat_last_n != 0 &&
           !(params_.repeat_penalty == 1.f && params_.frequency_penalty == 0.f &&
             params_.presence_penalty == 0.f);
}

bool Sampler::top_k_on() const {
    return params_.top_k > 0 && params_.top_k < n_vocab_;
}

bool Sampler::penalties_active() const {
    return penalties_configured() && !distinct_.empty();
}

bool Sampler::device_draw(TokenDraw& d) const {
    if (penalties_configured()) return false;
    d = TokenDraw{};
    if (params_.temperature <= 0.f) return true;  // greedy: top_k 1
    if (top_k_on() ? params_.top_k > kMaxLogitCandidates : params_.top_p < 1.f) return false;
    d.top_k = top_k_on() ? params_.top_k : 0;  // 0: the whole vocabulary (draw_whole)
    d.temperature = params_.temperature;
    d.top_p = params_.top_p;
    d.min_p = params_.min_p;
    d.log_min_p = params_.min_p > 0.f ? std::log(params_.min_p) : 0.f;
    return true;
}

void Sampler::accept(int32_t token) {
    if (token < 0 || token >= n_vocab_)
        fail("sampler: token id %d is outside the vocabulary (0..%d).", token, n_vocab_ - 1);
    if (params_.repeat_last_n == 0) return;

    if (params_.repeat_last_n > 0 && ring_size_ == ring_.size()) {
        // Evict the oldest token of the window.
        const int32_t old = ring_[ring_head_];
        if (--count_[size_t(old)] == 0) {
            const int32_t s = slot_[size_t(old)];
            const int32_t last = distinct_.back();
            distinct_[size_t(s)] = last;
            slot_[size_t(last)] = s;
            distinct_.pop_back();
            slot_[size_t(old)] = -1;
        }
        ring_[ring_head_] = token;
        ring_head_ = (ring_head_ + 1) % ring_.size();
    } else if (params_.repeat_last_n > 0) {
        ring_[(ring_head_ + ring_size_) % ring_.size()] = token;
        ++ring_size_;
    }

    if (count_[size_t(token)]++ == 0) {
        slot_[size_t(token)] = int32_t(distinct_.size());
        distinct_.push_back(token);
    }
}

float Sampler::penalized(float l, int count) const {
    const float rp = params_.repeat_penalty;
    // Dividing a negative logit would make the token more likely; llama.cpp multiplies it.
    l = l <= 0.f ? l * rp : l / rp;
    return l -
           (float(count) * params_.frequency_penalty + float(count > 0) * params_.presence_penalty);
}

void Sampler::apply_penalties(float* logits) const {
    if (!penalties_active()) return;
    for (int32_t t : distinct_) logits[t] = penalized(logits[t], count_[size_t(t)]);
}

LogitRequest Sampler::request(const std::vector<int32_t>& changed) const {
    LogitRequest r;
    const bool greedy = params_.temperature <= 0.f;
    if (!greedy && !top_k_on()) return r;  // the whole row
    if (penalties_active()) r.ids = distinct_;
    for (int32_t t : changed)
        if (t >= 0 && t < n_vocab_) r.ids.push_back(t);
    std::sort(r.ids.begin(), r.ids.end());
    r.ids.erase(std::unique(r.ids.begin(), r.ids.end()), r.ids.end());
    const size_t k = greedy ? 1 : size_t(params_.top_k);
    if (k + r.ids.size() > size_t(kMaxLogitCandidates)) return LogitRequest{};
    r.k = int(k + r.ids.size());
    return r;
}

int32_t Sampler::sample(const LogitRequest& req, const LogitCandidates& c,
                        const std::vector<std::pair<int32_t, float>>& bias) {
    return sample_candidates(req, c, bias, nullptr);
}

int32_t Sampler::sample_with(const LogitRequest& req, const LogitCandidates& c, double u) {
    return sample_candidates(req, c, {}, &u);
}

int32_t Sampler::sample_candidates(const LogitRequest& req, const LogitCandidates& c,
                                   const std::vector<std::pair<int32_t, float>>& bias,
                                   const double* u) {
    if (req.k <= 0 || c.top_id.size() != c.top_logit.size() || c.id_logit.size() != req.ids.size())
        fail("sampler: the selection does not answer its request.");
    if (c.nan) fail_nan();
    // The candidates: the selection's best, then the asked tokens not among them. A token
    // outside both has at least req.k - ids.size() unchanged tokens above it (at most ids.size()
    // of the req.k best were changed), so it cannot enter the top k after the changes.
    size_t n = 0;
    auto add = [&](int32_t id, float logit) {
        if (cand_at_[size_t(id)] >= 0) return;
        cand_at_[size_t(id)] = int32_t(n);
        cand_[n++] = {logit, 0.f, id};
    };
    for (size_t i = 0; i < c.top_id.size(); ++i) add(c.top_id[i], c.top_logit[i]);
    for (size_t i = 0; i < req.ids.size(); ++i) add(req.ids[i], c.id_logit[i]);
    bool unasked = false;
    for (const auto& [id, b] : bias)
        if (id >= 0 && id < n_vocab_) {
            if (cand_at_[size_t(id)] < 0)
                unasked = true;
            else
                cand_[size_t(cand_at_[size_t(id)])].logit += b;
        }
    const bool penalize = penalties_active();
    for (size_t i = 0; i < n; ++i) {
        const int32_t id = cand_[i].id;
        cand_at_[size_t(id)] = -1;
        if (penalize && count_[size_t(id)] > 0)
            cand_[i].logit = penalized(cand_[i].logit, count_[size_t(id)]);
    }
    if (unasked) fail("sampler: a biased token was not asked for in the selection.");
    if (n == 0)
        fail("sampler: the logits have no finite maximum; the model produced invalid values.");

    auto cmp = [](const Candidate& a, const Candidate& b) { return ranks_before(a, b); };
    if (params_.temperature <= 0.f) {
        const Candidate best = *std::min_element(cand_.begin(), cand_.begin() + ptrdiff_t(n), cmp);
        last_prob_ = 1.f;
        return best.id;
    }
    const size_t k = size_t(params_.top_k);
    if (n < k) fail("sampler: the selection holds %zu candidates for top-k %zu.", n, k);
    std::partial_sort(cand_.begin(), cand_.begin() + ptrdiff_t(k), cand_.begin() + ptrdiff_t(n),
                      cmp);
    n = finish_top_k(k);
    n = apply_min_p(n);
    return draw(n, u);
}

int32_t Sampler::sample(const float* logits) {
    return sample_row(logits, nullptr);
}

int32_t Sampler::sample_with(const float* logits, double u) {
    return sample_row(logits, &u);
}

int32_t Sampler::sample_row(const float* logits, const double* u) {
    const float* src = logits;
    if (penalties_active()) {
        std::copy(logits, logits + n_vocab_, work_.begin());
        apply_penalties(work_.data());
        src = work_.data();
    }
    if (params_.temperature <= 0.f) return sample_greedy(src);
    if (!top_k_on() && params_.top_p >= 1.f) return draw_whole(src, u);

    size_t n = top_k_on() ? select_top_k(src) : select_all(src);
    n = apply_min_p(n);
    return draw(n, u);
}

int32_t Sampler::sample_greedy(const float* logits) {
    const MaxScan m = scan_max(logits, size_t(n_vocab_));
    if (m.nan) fail_nan();
    // The first occurrence of the maximum: the lowest id wins a tie.
    const int32_t best = int32_t(std::find(logits, logits + n_vocab_, m.max) - logits);
    last_prob_ = 1.f;
    return best;
}

size_t Sampler::select_top_k(const float* logits) {
    const size_t V = size_t(n_vocab_);
    const size_t k = size_t(params_.top_k);
    auto cmp = [](const Candidate& a, const Candidate& b) { return ranks_before(a, b); };

    if (k > std::max(kHeapTopKMin, V / kHeapTopKVocabDiv)) {
        if (scan_max(logits, V).nan) fail_nan();
        for (size_t i = 0; i < V; ++i) cand_[i] = {logits[i], 0.f, int32_t(i)};
        std::nth_element(cand_.begin(), cand_.begin() + ptrdiff_t(k), cand_.end(), cmp);
        std::sort(cand_.begin(), cand_.begin() + ptrdiff_t(k), cmp);
    } else {
        // A bounded heap whose front is the worst of the k best so far. Once it has warmed up,
        // almost every block of logits has a maximum below that front and is skipped whole, so
        // this costs about one vectorised pass over the vocabulary.
        for (size_t i = 0; i < k; ++i) cand_[i] = {logits[i], 0.f, int32_t(i)};
        if (scan_max(logits, k).nan) fail_nan();
        std::make_heap(cand_.begin(), cand_.begin() + ptrdiff_t(k), cmp);
        float worst = cand_[0].logit;
        for (size_t b = k; b < V; b += kBlock) {
            const size_t e = std::min(V, b + kBlock);
            const MaxScan m = scan_max(logits + b, e - b);
            if (m.nan) fail_nan();
            if (!(m.max > worst)) continue;
            for (size_t i = b; i < e; ++i) {
                // Strict: ids grow along the scan, so a tie with the current worst loses.
                if (logits[i] > worst) {
                    std::pop_heap(cand_.begin(), cand_.begin() + ptrdiff_t(k), cmp);
                    cand_[k - 1] = {logits[i], 0.f, int32_t(i)};
                    std::push_heap(cand_.begin(), cand_.begin() + ptrdiff_t(k), cmp);
                    worst = cand_[0].logit;
                }
            }
        }
        std::sort_heap(cand_.begin(), cand_.begin() + ptrdiff_t(k), cmp);  // best first
    }
    return finish_top_k(k);
}

size_t Sampler::finish_top_k(size_t k) {
    sorted_ = true;
    if (params_.top_p >= 1.f) return k;
    const float max_l = cand_[0].logit;
    double z = 0.0;
    for (size_t i = 0; i < k; ++i) z += exp_rounded(cand_[i].logit - max_l);
    return apply_top_p(k, max_l, z);
}

float Sampler::finite_max(const float* logits) const {
    const MaxScan m = scan_max(logits, size_t(n_vocab_));
    if (m.nan) fail_nan();
    if (!std::isfinite(m.max))
        fail("sampler: the logits have no finite maximum; the model produced invalid values.");
    return m.max;
}

size_t Sampler::select_all(const float* logits) {
    const size_t V = size_t(n_vocab_);
    const float max_l = finite_max(logits);

    // The first truncation's threshold is applied while filling the candidates, so that the
    // whole vocabulary is not moved around, and each keeps exactly the set the step would keep:
    // - min-p first (top-p off): logit >= max + log(min_p);
    // - top-p first: tokens with p < eps = (1 - top_p) / V hold less than 1 - top_p of the mass
    //   together, so the nucleus is complete before the walk reaches any of them; the walk
    //   below still normalises by the whole vocabulary's sum z.
    float floor = -std::numeric_limits<float>::infinity();
    double z = 0.0;
    if (params_.top_p < 1.f) {
        for (size_t i = 0; i < V; ++i) z += std::exp(logits[i] - max_l);
        const double eps = (1.0 - double(params_.top_p)) / double(V);
        floor = float(double(max_l) + std::log(eps * z) - 1e-3);  // margin: keep a superset
    } else if (params_.min_p > 0.f) {
        floor = max_l + std::log(params_.min_p);
    }
    size_t n = 0;
    for (size_t i = 0; i < V; ++i)
        if (logits[i] >= floor) cand_[n++] = {logits[i], 0.f, int32_t(i)};
    sorted_ = false;
    if (params_.top_p >= 1.f) return n;
    return apply_top_p(n, max_l, z);
}

size_t Sampler::apply_top_p(size_t n, float max_l, double z) {
    // Probabilities at temperature 1: top-p runs before the temperature in llama.cpp's chain.
    const double inv_z = 1.0 / z;
    for (size_t i = 0; i < n; ++i) cand_[i].p = exp_rounded(cand_[i].logit - max_l);

    // Sort only as far as the walk needs: [0, sorted_prefix) is sorted and everything after
    // ranks below it. The prefix starts at 256 and doubles, each step one nth_element over the
    // unsorted rest, so a nucleus of thousands of tokens does not cost a full sort.
    auto cmp = [](const Candidate& a, const Candidate& b) { return ranks_before(a, b); };
    size_t sorted_prefix = sorted_ ? n : 0;
    auto extend = [&](size_t want) {
        want = std::min(want, n);
        auto first = cand_.begin() + ptrdiff_t(sorted_prefix);
        if (want < n)
            std::nth_element(first, cand_.begin() + ptrdiff_t(want), cand_.begin() + ptrdiff_t(n),
                             cmp);
        std::sort(first, cand_.begin() + ptrdiff_t(want), cmp);
        sorted_prefix = want;
    };
    if (!sorted_) extend(kTopPFirstPass);
    sorted_ = true;
    double cum = 0.0;
    for (size_t i = 0; i < n; ++i) {
        if (i == sorted_prefix) extend(2 * sorted_prefix);
        cum += double(cand_[i].p) * inv_z;
        if (cum >= double(params_.top_p)) return i + 1;
    }
    return n;  // rounding kept the mass just below top_p: keep everything (now fully sorted)
}

size_t Sampler::apply_min_p(size_t n) {
    if (params_.min_p <= 0.f) return n;
    // p_i >= min_p * p_max  <=>  logit_i >= logit_max + log(min_p), at temperature 1.
    if (sorted_) {
        const float min_logit = cand_[0].logit + std::log(params_.min_p);
        size_t i = 1;  // the most likely token always stays
        while (i < n && cand_[i].logit >= min_logit) ++i;
        return i;
    }
    float max_l = cand_[0].logit;
    for (size_t i = 1; i < n; ++i) max_l = std::max(max_l, cand_[i].logit);
    const float min_logit = max_l + std::log(params_.min_p);
    size_t kept = 0;
    for (size_t i = 0; i < n; ++i)
        if (cand_[i].logit >= min_logit) cand_[kept++] = cand_[i];
    return kept;
}

int32_t Sampler::draw_whole(const float* logits, const double* u) {
    const int V = n_vocab_;
    const float max_l = finite_max(logits);
    // vocab_draw.h's draw, which a device makes the same way: the weights (0 below min-p's
    // floor; the maximum of +0 and -0 either: x - 0 and x - -0 have one exp), summed by runs,
    // blocks and the total, then walked down the same hierarchy. The weights go to work_ (in
    // place when it holds penalised logits).
    const float floor = params_.min_p > 0.f ? max_l + std::log(params_.min_p)
                                            : -std::numeric_limits<float>::infinity();
    const float t = params_.temperature;
    float* p = work_.data();
    const int n_runs = int(run_sums_.size()), n_blocks = int(block_sums_.size());
    for (int i = 0; i < V; ++i)
        p[i] = logits[i] >= floor ? exp_rounded((logits[i] - max_l) / t) : 0.f;
    // Four runs at a time: each its own chain of adds in id order, the four side by side.
    int rs = 0;
    for (; rs + 4 <= n_runs && (rs + 4) * kDrawRun <= V; rs += 4) {
        double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
        const float* q = p + size_t(rs) * kDrawRun;
        for (int i = 0; i < kDrawRun; ++i) {
            s0 += q[i];
            s1 += q[kDrawRun + i];
            s2 += q[2 * kDrawRun + i];
            s3 += q[3 * kDrawRun + i];
        }
        run_sums_[size_t(rs)] = s0;
        run_sums_[size_t(rs) + 1] = s1;
        run_sums_[size_t(rs) + 2] = s2;
        run_sums_[size_t(rs) + 3] = s3;
    }
    for (; rs < n_runs; ++rs) {
        double sum = 0.0;
        for (int i = rs * kDrawRun, e = std::min(V, i + kDrawRun); i < e; ++i) sum += p[i];
        run_sums_[size_t(rs)] = sum;
    }
    double total = 0.0;
    for (int b = 0; b < n_blocks; ++b) {
        double sum = 0.0;
        for (int r = b * kDrawBlockRuns, e = std::min(n_runs, r + kDrawBlockRuns); r < e; ++r)
            sum += run_sums_[size_t(r)];
        block_sums_[size_t(b)] = sum;
        total += sum;
    }
    const double target = total * (u ? *u : uniform01());
    double run = 0.0;
    const int b = walk_level([&](int i) { return block_sums_[size_t(i)]; }, n_blocks, target, run);
    const int r0 = b * kDrawBlockRuns;
    const int r = r0 + walk_level([&](int i) { return run_sums_[size_t(r0 + i)]; },
                                  std::min(kDrawBlockRuns, n_runs - r0), target, run);
    const int i0 = r * kDrawRun;
    const int sel = i0 + walk_level([&](int i) { return double(p[i0 + i]); },
                                    std::min(kDrawRun, V - i0), target, run);
    last_prob_ = float(double(p[sel]) / total);
    return sel;
}

int32_t Sampler::draw(size_t n, const double* u) {
    float max_l = cand_[0].logit;
    if (!sorted_)
        for (size_t i = 1; i < n; ++i) max_l = std::max(max_l, cand_[i].logit);
    if (!std::isfinite(max_l))
        fail("sampler: the logits have no finite maximum; the model produced invalid values.");

    const float t = params_.temperature;
    double sum = 0.0;
    for (size_t i = 0; i < n; ++i) {
        cand_[i].p = exp_rounded((cand_[i].logit - max_l) / t);
        sum += cand_[i].p;
    }
    double run = 0.0;
    const size_t sel = size_t(walk_level([&](int i) { return double(cand_[size_t(i)].p); },
                                         int(n), sum * (u ? *u : uniform01()), run));
    last_prob_ = float(double(cand_[sel].p) / sum);
    return cand_[sel].id;
}

std::vector<std::pair<int32_t, float>> Sampler::top_logprobs(const float* logits, int k) const {
    std::vector<std::pair<int32_t, float>> out;
    if (k <= 0) return out;
    const size_t V = size_t(n_vocab_);
    const size_t kk = std::min(size_t(k), V);

    float max_l = logits[0];
    for (size_t i = 1; i < V; ++i) max_l = std::max(max_l, logits[i]);
    double sum = 0.0;
    for (size_t i = 0; i < V; ++i) sum += std::exp(double(logits[i]) - double(max_l));
    const double log_z = double(max_l) + std::log(sum);

    struct Item {
        float logit;
        int32_t id;
    };
    auto cmp = [](const Item& a, const Item& b) { return ranks_before(a, b); };
    std::vector<Item> heap(kk);
    for (size_t i = 0; i < kk; ++i) heap[i] = {logits[i], int32_t(i)};
    std::make_heap(heap.begin(), heap.end(), cmp);
    for (size_t i = kk; i < V; ++i) {
        if (logits[i] > heap[0].logit) {
            std::pop_heap(heap.begin(), heap.end(), cmp);
            heap.back() = {logits[i], int32_t(i)};
            std::push_heap(heap.begin(), heap.end(), cmp);
        }
    }
    std::sort_heap(heap.begin(), heap.end(), cmp);
    out.reserve(kk);
    for (const Item& it : heap) out.emplace_back(it.id, float(double(it.logit) - log_z));
    return out;
}

}  // namespace nt
