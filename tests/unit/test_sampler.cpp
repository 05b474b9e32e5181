// Sampler tests, against two independent references:
//  - llama.cpp's own samplers: tests/python/sampler_fixtures.txt, written by
//    tests/python/gen_sampler_fixtures.py through llama-cpp-python (penalised logits, and the
//    candidates and probabilities the default chain leaves);
//  - brute force here (full sorts, double precision) from the semantics in engine/sampler.h.
// Statistical tests use fixed seeds (so they are deterministic) and a chi-square bound at
// p = 1e-6; each one also checks that the same statistic rejects a nearby wrong distribution, so
// it has the power to catch a real bug.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "backend/vocab_draw.h"
#include "core/error.h"
#include "engine/sampler.h"

namespace nt {
namespace {

SamplerParams plain(float temperature, uint64_t seed = 1234) {
    SamplerParams p;
    p.temperature = temperature;
    p.top_k = 0;
    p.top_p = 1.f;
    p.min_p = 0.f;
    p.seed = seed;
    return p;
}

std::vector<float> random_logits(int n, float scale, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.f, scale);
    std::vector<float> l(static_cast<size_t>(n));
    for (float& x : l) x = d(rng);
    return l;
}

// Token ids in llama.cpp's candidate order: descending logit, ascending id on ties.
std::vector<int> ranked(const std::vector<float>& l) {
    std::vector<int> idx(l.size());
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return l[a] > l[b]; });
    return idx;
}

// Reference distribution of the chain: top-k -> top-p -> min-p (all at temperature 1) ->
// temperature -> softmax. Returns a full-vocabulary probability vector (0 for excluded tokens).
std::vector<double> reference_probs(const std::vector<float>& l, const SamplerParams& p) {
    std::vector<int> keep = ranked(l);
    if (p.top_k > 0 && size_t(p.top_k) < keep.size()) keep.resize(size_t(p.top_k));
    if (p.top_p < 1.f) {
        double z = 0;
        for (int i : keep) z += std::exp(double(l[i]) - double(l[keep[0]]));
        double cum = 0;
        size_t n = keep.size();
        for (size_t j = 0; j < keep.size(); ++j) {
            cum += std::exp(double(l[keep[j]]) - double(l[keep[0]])) / z;
            if (cum >= double(p.top_p)) {
                n = j + 1;
                break;
            }
        }
        keep.resize(n);
    }
    if (p.min_p > 0.f) {
        const double pmax = 1.0;  // relative to the best kept token
        std::vector<int> k2;
        for (int i : keep)
            if (std::exp(double(l[i]) - double(l[keep[0]])) >= p.min_p * pmax - 1e-12)
                k2.push_back(i);
        keep = k2;
    }
    std::vector<double> probs(l.size(), 0.0);
    double z = 0;
    for (int i : keep) z += std::exp((double(l[i]) - double(l[keep[0]])) / p.temperature);
    for (int i : keep)
        probs[size_t(i)] = std::exp((double(l[i]) - double(l[keep[0]])) / p.temperature) / z;
    return probs;
}

std::vector<int> draw_counts(Sampler& s, const std::vector<float>& l, int n) {
    std::vector<int> counts(l.size(), 0);
    for (int i = 0; i < n; ++i) ++counts[size_t(s.sample(l.data()))];
    return counts;
}

// Pearson chi-square over the tokens with expected probability > 0; a token drawn with
// expected probability 0 is counted as infinitely unlikely.
double chi_square(const std::vector<int>& counts, const std::vector<double>& probs, int n,
                  int* df = nullptr) {
    double chi = 0;
    int bins = 0;
    for (size_t i = 0; i < counts.size(); ++i) {
        if (probs[i] <= 0) {
            if (counts[i] > 0) return INFINITY;
            continue;
        }
        const double e = probs[i] * n;
        chi += (counts[i] - e) * (counts[i] - e) / e;
        ++bins;
    }
    if (df) *df = bins - 1;
    return chi;
}

// Upper 1e-6 quantile of chi-square(df), Wilson-Hilferty approximation (z = 4.753).
double chi2_critical(int df) {
    const double z = 4.753, a = 2.0 / (9.0 * df);
    return df * std::pow(1 - a + z * std::sqrt(a), 3);
}

double entropy(const std::vector<double>& p) {
    double h = 0;
    for (double x : p)
        if (x > 0) h -= x * std::log(x);
    return h;
}

// ---------------------------------------------------------------------------------------------

// ---------------------------------------------------------------------------------------------
// llama.cpp fixture

struct LlamaCppCase {
    std::string name;
    SamplerParams params;
    std::vector<float> logits;
    std::vector<int32_t> accepted;
    std::map<int32_t, float> penalized;  // entries the penalties changed
    std::map<int32_t, double> kept;      // final candidates and their probabilities
};

std::vector<LlamaCppCase> load_llamacpp_cases() {
    std::ifstream f(std::string(NT_SOURCE_DIR) + "/tests/python/sampler_fixtures.txt");
    if (!f) throw std::runtime_error("cannot open tests/python/sampler_fixtures.txt");
    std::vector<LlamaCppCase> cases;
    std::string line;
    LlamaCppCase c;
    auto pairs = [](std::istringstream& in, auto& out) {
        size_t n = 0;
        in >> n;
        for (size_t i = 0; i < n; ++i) {
            std::string item;
            in >> item;
            const size_t colon = item.find(':');
            out[int32_t(std::stol(item.substr(0, colon)))] = std::stod(item.substr(colon + 1));
        }
    };
    while (std::getline(f, line)) {
        std::istringstream in(line);
        std::string tag;
        in >> tag;
        if (tag == "case") {
            c = LlamaCppCase{};
            in >> c.name;
        } else if (tag == "vocab") {
            size_t v = 0;
            in >> v;
            c.logits.resize(v);
        } else if (tag == "params") {
            SamplerParams& p = c.params;
            std::string tp, mp, t, rp, fp, pp;
            in >> p.top_k >> tp >> mp >> t >> rp >> p.repeat_last_n >> fp >> pp;
            p.top_p = std::strtof(tp.c_str(), nullptr);
            p.min_p = std::strtof(mp.c_str(), nullptr);
            p.temperature = std::strtof(t.c_str(), nullptr);
            p.repeat_penalty = std::strtof(rp.c_str(), nullptr);
            p.frequency_penalty = std::strtof(fp.c_str(), nullptr);
            p.presence_penalty = std::strtof(pp.c_str(), nullptr);
        } else if (tag == "logits") {
            for (float& x : c.logits) {
                std::string v;
                in >> v;
                x = std::strtof(v.c_str(), nullptr);  // exact: shortest float32 representations
            }
        } else if (tag == "accepted") {
            size_t n = 0;
            in >> n;
            c.accepted.resize(n);
            for (int32_t& t : c.accepted) in >> t;
        } else if (tag == "penalized") {
            std::map<int32_t, double> d;
            pairs(in, d);
            for (auto [id, v] : d) c.penalized[id] = float(v);
        } else if (tag == "kept") {
            pairs(in, c.kept);
        } else if (tag == "end") {
            cases.push_back(c);
        }
    }
    return cases;
}

TEST(Sampler, PenaltiesMatchLlamaCpp) {
    const auto cases = load_llamacpp_cases();
    ASSERT_EQ(cases.size(), 13u);
    int penalised_cases = 0;
    for (const LlamaCppCase& c : cases) {
        Sampler s(c.params, int(c.logits.size()));
        for (int32_t t : c.accepted) s.accept(t);
        std::vector<float> got(c.logits);
        s.apply_penalties(got.data());
        for (size_t i = 0; i < got.size(); ++i) {
            auto it = c.penalized.find(int32_t(i));
            EXPECT_FLOAT_EQ(got[i], it == c.penalized.end() ? c.logits[i] : it->second)
                << c.name << " token " << i;
        }
        penalised_cases += !c.penalized.empty();
    }
    EXPECT_EQ(penalised_cases, 6);
}

TEST(Sampler, ChainMatchesLlamaCpp) {
    for (const LlamaCppCase& c : load_llamacpp_cases()) {
        SamplerParams p = c.params;
        p.seed = 99;
        Sampler s(p, int(c.logits.size()));
        for (int32_t t : c.accepted) s.accept(t);
        ASSERT_FALSE(c.kept.empty()) << c.name;
        if (p.temperature <= 0.f) {
            ASSERT_EQ(c.kept.size(), 1u) << c.name;
            EXPECT_EQ(s.sample(c.logits.data()), c.kept.begin()->first) << c.name;
            continue;
        }
        // Every draw lies in llama.cpp's candidate set with llama.cpp's probability, and every
        // candidate with p >= 0.005 shows up (a miss has probability < 1e-8 in 4000 draws).
        std::set<int32_t> seen;
        for (int i = 0; i < 4000; ++i) {
            const int32_t t = s.sample(c.logits.data());
            auto it = c.kept.find(t);
            ASSERT_NE(it, c.kept.end()) << c.name << ": token " << t << " is not a candidate";
            ASSERT_NEAR(s.last_prob(), it->second, 1e-6 + 1e-4 * it->second) << c.name;
            seen.insert(t);
        }
        for (auto [id, prob] : c.kept) {
            if (prob >= 0.005) {
                EXPECT_TRUE(seen.count(id)) << c.name << ": never drew " << id;
            }
        }
    }
}

TEST(Sampler, GreedyIsArgmaxWithLowestIdOnTies) {
    for (float t : {0.f, -1.f}) {
        Sampler s(plain(t), 1000);
        for (uint32_t trial = 0; trial < 100; ++trial) {
            auto l = random_logits(1000, 2.f, trial);
            const int want = int(std::max_element(l.begin(), l.end()) - l.begin());
            EXPECT_EQ(s.sample(l.data()), want);
            EXPECT_EQ(s.last_prob(), 1.f);
        }
    }
    std::vector<float> tie = {0.f, 1.f, 3.f, -2.f, 3.f, 3.f, 2.f};
    Sampler s(plain(0.f), int(tie.size()));
    EXPECT_EQ(s.sample(tie.data()), 2);
}

TEST(Sampler, TopK1IsGreedyAtAnyTemperature) {
    SamplerParams p = plain(1.5f);
    p.top_k = 1;
    Sampler s(p, 500);
    for (uint32_t trial = 0; trial < 200; ++trial) {
        auto l = random_logits(500, 1.f, 1000 + trial);
        if (trial % 4 == 0) {  // a tie for the maximum: the lower id wins, as in greedy
            const int m = int(std::max_element(l.begin(), l.end()) - l.begin());
            l[size_t((m + 250) % 500)] = l[size_t(m)];
        }
        const int want = int(std::max_element(l.begin(), l.end()) - l.begin());
        EXPECT_EQ(s.sample(l.data()), want);
        EXPECT_FLOAT_EQ(s.last_prob(), 1.f);
    }
}

TEST(Sampler, UntruncatedDrawsFollowSoftmax) {
    const int V = 16, N = 100000;
    std::vector<float> l(V);
    for (int i = 0; i < V; ++i) l[size_t(i)] = -3.f + 5.f * float((i * 7) % V) / V;
    Sampler s(plain(1.f), V);
    const auto counts = draw_counts(s, l, N);
    int df = 0;
    const double chi = chi_square(counts, reference_probs(l, plain(1.f)), N, &df);
    EXPECT_EQ(df, V - 1);
    EXPECT_LT(chi, chi2_critical(df));
    // Power: the same draws are far from softmax at temperature 0.9.
    EXPECT_GT(chi_square(counts, reference_probs(l, plain(0.9f)), N), 3 * chi2_critical(df));
}

TEST(Sampler, TruncationExcludesAndRenormalises) {
    const int V = 24, N = 100000;
    std::vector<float> l(V);
    for (int i = 0; i < V; ++i) l[size_t(i)] = 2.5f - 0.35f * float((i * 5) % V);
    struct Case {
        const char* name;
        int top_k;
        float top_p, min_p, temperature;
    };
    const Case cases[] = {
        {"top-k", 6, 1.f, 0.f, 1.f},
        {"top-p", 0, 0.8f, 0.f, 1.f},
        {"min-p", 0, 1.f, 0.1f, 1.f},
        {"top-k, min-p", 10, 1.f, 0.2f, 1.f},
        {"all, temperature 0.6", 10, 0.9f, 0.05f, 0.6f},
        {"all, temperature 1.7", 10, 0.9f, 0.05f, 1.7f},
    };
    for (const Case& c : cases) {
        SamplerParams p = plain(c.temperature, 77);
        p.top_k = c.top_k;
        p.top_p = c.top_p;
        p.min_p = c.min_p;
        const auto want = reference_probs(l, p);
        const int kept =
            int(std::count_if(want.begin(), want.end(), [](double x) { return x > 0; }));
        ASSERT_GT(kept, 2) << c.name;
        ASSERT_LT(kept, V) << c.name;
        Sampler s(p, V);
        const auto counts = draw_counts(s, l, N);
        for (int i = 0; i < V; ++i)
            if (want[size_t(i)] == 0) {
                EXPECT_EQ(counts[size_t(i)], 0) << c.name << " token " << i;
            }
        int df = 0;
        const double chi = chi_square(counts, want, N, &df);
        EXPECT_LT(chi, chi2_critical(df)) << c.name;
        // Power: the same kept set without renormalisation is rejected (pmf over the whole
        // vocabulary restricted to the set).
        auto unnormalised = reference_probs(l, plain(c.temperature));
        for (int i = 0; i < V; ++i)
            if (want[size_t(i)] == 0) unnormalised[size_t(i)] = 0;
        double mass = 0;
        for (double x : unnormalised) mass += x;
        if (mass < 0.97) {  // dividing by that mass is exactly what renormalisation does
            std::vector<double> wrong = unnormalised;
            wrong[size_t(ranked(l)[0])] += 1 - mass;  // a plausible bug: leftover mass on top-1
            EXPECT_GT(chi_square(counts, wrong, N), chi2_critical(df)) << c.name;
        }
    }
}

TEST(Sampler, TruncationRunsAtTemperatureOneBeforeTemperature) {
    // llama.cpp's order: top-p/min-p see temperature-1 probabilities. At temperature 3 the
    // flattened distribution would need more tokens to reach top_p; they must not appear.
    const int V = 20, N = 40000;
    std::vector<float> l(V);
    for (int i = 0; i < V; ++i) l[size_t(i)] = -0.6f * float(i);
    SamplerParams p = plain(3.f, 5);
    p.top_p = 0.7f;
    const auto want = reference_probs(l, p);
    const int kept = int(std::count_if(want.begin(), want.end(), [](double x) { return x > 0; }));
    SamplerParams flat = plain(1.f);
    flat.top_p = 0.7f;
    std::vector<float> scaled(l);
    for (float& x : scaled) x /= 3.f;
    const auto wrong_order = reference_probs(scaled, flat);
    const int kept_wrong =
        int(std::count_if(wrong_order.begin(), wrong_order.end(), [](double x) { return x > 0; }));
    ASSERT_LT(kept, kept_wrong);
    Sampler s(p, V);
    const auto counts = draw_counts(s, l, N);
    for (int i = kept; i < V; ++i) EXPECT_EQ(counts[size_t(i)], 0) << "token " << i;
    int df = 0;
    const double chi = chi_square(counts, want, N, &df);
    EXPECT_LT(chi, chi2_critical(df));
}

TEST(Sampler, TemperatureScalesEntropy) {
    const int V = 32, N = 100000;
    const auto l = random_logits(V, 1.5f, 99);
    double prev_h = -1;
    for (float t : {0.5f, 1.f, 2.f}) {
        Sampler s(plain(t, 11), V);
        const auto counts = draw_counts(s, l, N);
        std::vector<double> emp(V);
        for (int i = 0; i < V; ++i) emp[size_t(i)] = double(counts[size_t(i)]) / N;
        const auto want = reference_probs(l, plain(t));
        const double h_emp = entropy(emp), h_ref = entropy(want);
        EXPECT_NEAR(h_emp, h_ref, 0.01) << "temperature " << t;
        EXPECT_GT(h_ref, prev_h + 0.1) << "temperature " << t;
        prev_h = h_ref;
        int df = 0;
        const double chi = chi_square(counts, want, N, &df);
        EXPECT_LT(chi, chi2_critical(df)) << "temperature " << t;
    }
}

TEST(Sampler, PenaltiesFollowFormulaOverWindow) {
    const int V = 50;
    auto l = random_logits(V, 2.f, 3);
    l[7] = 0.f;  // exactly zero is multiplied (stays 0) before the subtraction
    const std::vector<int> history = {1, 2, 3, 7, 7, 9, 1, 1, 40, 2, 7, 11, 1, 30, 30, 2};

    for (int last_n : {8, -1, 0, 100}) {
        SamplerParams p = plain(1.f);
        p.repeat_penalty = 1.3f;
        p.frequency_penalty = 0.2f;
        p.presence_penalty = 0.5f;
        p.repeat_last_n = last_n;
        Sampler s(p, V);
        for (int t : history) s.accept(t);

        std::map<int, int> count;
        const size_t from =
            last_n < 0 ? 0 : history.size() - std::min(history.size(), size_t(last_n));
        for (size_t i = from; i < history.size(); ++i) ++count[history[i]];
        std::vector<float> got(l);
        s.apply_penalties(got.data());
        for (int t = 0; t < V; ++t) {
            float want = l[size_t(t)];
            auto it = count.find(t);
            if (it != count.end()) {
                want = want <= 0 ? want * p.repeat_penalty : want / p.repeat_penalty;
                want -= float(it->second) * p.frequency_penalty + p.presence_penalty;
            }
            EXPECT_FLOAT_EQ(got[size_t(t)], want) << "last_n " << last_n << " token " << t;
        }
        if (last_n == 8) {
            EXPECT_EQ(count.count(3), 0u);  // evicted from the window
        }
        if (last_n == 0) {
            EXPECT_TRUE(count.empty());
        }

        s.reset();
        std::vector<float> after_reset(l);
        s.apply_penalties(after_reset.data());
        EXPECT_EQ(after_reset, l);
    }
}

TEST(Sampler, PenaltiesChangeWhatIsSampled) {
    std::vector<float> l = {5.0f, 4.9f, -1.f, -2.f};
    SamplerParams p = plain(0.f);
    p.presence_penalty = 0.5f;
    Sampler s(p, 4);
    EXPECT_EQ(s.sample(l.data()), 0);
    s.accept(0);
    EXPECT_EQ(s.sample(l.data()), 1);
    // Negative logits get more negative under a repeat penalty (multiplied, not divided).
    SamplerParams q = plain(0.f);
    q.repeat_penalty = 2.f;
    std::vector<float> neg = {-1.f, -1.5f};
    Sampler r(q, 2);
    r.accept(0);
    EXPECT_EQ(r.sample(neg.data()), 1);  // -2 < -1.5
}

TEST(Sampler, SameSeedSameTokensDifferentSeedDifferent) {
    const int V = 300;
    const auto l = random_logits(V, 1.f, 8);
    auto run = [&](Sampler& s) {
        std::vector<int32_t> out;
        for (int i = 0; i < 500; ++i) {
            out.push_back(s.sample(l.data()));
            s.accept(out.back());
        }
        return out;
    };
    SamplerParams p;  // llama.cpp defaults (top-k 40, top-p 0.95, min-p 0.05, temperature 0.8)
    p.repeat_penalty = 1.1f;
    p.seed = 42;
    Sampler a(p, V), b(p, V);
    const auto ra = run(a);
    EXPECT_EQ(ra, run(b));
    a.reset();
    EXPECT_EQ(run(a), ra);  // reset replays a fixed seed
    p.seed = 43;
    Sampler c(p, V);
    EXPECT_NE(run(c), ra);
    EXPECT_EQ(a.seed(), 42u);

    p.seed = Sampler::kRandomSeed;
    Sampler d(p, V), e(p, V);
    EXPECT_NE(d.seed(), e.seed());
}

TEST(Sampler, DrawUsesTheDocumentedRandomStream) {
    // Untruncated and unsorted: candidates in id order, one mt19937_64 draw mapped to [0, 1).
    const std::vector<float> l = {0.1f, 1.3f, -0.4f, 0.9f, 0.f};
    const uint64_t seed = 2024;
    Sampler s(plain(1.f, seed), int(l.size()));
    std::mt19937_64 rng(seed);
    const auto probs = reference_probs(l, plain(1.f));
    for (int i = 0; i < 200; ++i) {
        const double u = double(rng() >> 11) * 0x1.0p-53;
        double cum = 0;
        int want = 0;
        for (int t = 0; t < int(l.size()); ++t) {
            cum += probs[size_t(t)];
            if (cum >= u) {
                want = t;
                break;
            }
        }
        ASSERT_EQ(s.sample(l.data()), want) << "draw " << i;
        EXPECT_NEAR(s.last_prob(), probs[size_t(want)], 1e-6);
    }
}

TEST(Sampler, LargeVocabularyMatchesBruteForce) {
    const int V = 128256;  // Llama 3
    const auto l = random_logits(V, 3.f, 17);
    struct Case {
        const char* name;
        int top_k;
        float top_p, min_p, temperature;
        int min_kept, max_kept;  // to be sure the path of interest runs and truncates
    };
    const Case cases[] = {
        {"defaults", 40, 0.95f, 0.05f, 0.8f, 2, 39},
        {"top-k 40, min-p 0.2", 40, 1.f, 0.2f, 0.8f, 2, 39},
        {"top-k 1000 (heap)", 1000, 1.f, 0.f, 1.f, 1000, 1000},
        {"top-k 5000 (nth_element), top-p", 5000, 0.99f, 0.f, 1.1f, 1000, 4999},
        {"top-p over the whole vocabulary, < 256 kept", 0, 0.3f, 0.f, 1.f, 20, 255},
        {"top-p over the whole vocabulary, > 256 kept", 0, 0.9f, 0.f, 1.f, 257, V - 1},
        {"min-p over the whole vocabulary", 0, 1.f, 0.001f, 1.2f, 20, V - 1},
        {"untruncated", 0, 1.f, 0.f, 1.f, V, V},
    };
    for (const Case& c : cases) {
        SamplerParams p = plain(c.temperature, 5);
        p.top_k = c.top_k;
        p.top_p = c.top_p;
        p.min_p = c.min_p;
        const auto want = reference_probs(l, p);
        const int kept =
            int(std::count_if(want.begin(), want.end(), [](double x) { return x > 0; }));
        ASSERT_GE(kept, c.min_kept) << c.name;
        ASSERT_LE(kept, c.max_kept) << c.name;
        Sampler s(p, V);
        for (int i = 0; i < 200; ++i) {
            const int32_t t = s.sample(l.data());
            ASSERT_GT(want[size_t(t)], 0.0) << c.name << ": excluded token " << t;
            ASSERT_NEAR(s.last_prob(), want[size_t(t)], 1e-5 + 1e-4 * want[size_t(t)]) << c.name;
        }
    }
}

// The draw over the whole vocabulary sums in vocab_draw.h's hierarchy; whatever the order, it
// is the inverse of the weights' cumulative distribution: the token t drawn with uniform u has
// S(t) <= u * S(V) <= S(t + 1), S(i) the exact sum of the first i weights (long double here,
// a relative slack of 1e-12 for the rounding of double sums), and a positive weight. Rows of
// 128k and of a vocabulary with a partial last run and block, -inf logits, the maximum held by
// both +0 and -0, min-p's floor; uniforms at random, at both ends and exactly at boundaries.
TEST(Sampler, WholeVocabularyDrawInvertsTheCumulativeWeights) {
    for (int V : {128256, 100003, 40}) {
        auto l = random_logits(V, 3.f, uint32_t(V));
        for (float& x : l) x = std::min(x, 0.f);
        l[7] = 0.f;
        l[9] = -0.f;
        l[11] = -INFINITY;
        for (float t : {0.8f, 1.f, 1.7f})
            for (float min_p : {0.f, 0.01f}) {
                SamplerParams p = plain(t, 99);
                p.min_p = min_p;
                Sampler s(p, V);
                const float floor = min_p > 0.f ? std::log(min_p) : -INFINITY;  // max is 0
                std::vector<float> w(static_cast<size_t>(V));
                std::vector<long double> cum(size_t(V) + 1, 0.L);
                for (int i = 0; i < V; ++i) {
                    w[size_t(i)] = l[size_t(i)] >= floor ? std::exp(l[size_t(i)] / t) : 0.f;
                    cum[size_t(i) + 1] = cum[size_t(i)] + w[size_t(i)];
                }
                const long double total = cum[size_t(V)];
                std::mt19937_64 rng(uint64_t(V) + uint64_t(t * 10));
                std::vector<double> us = {0.0, 1.0 - 0x1.0p-53};
                for (int i = 0; i < 200; ++i) us.push_back(double(rng() >> 11) * 0x1.0p-53);
                for (int i = 0; i < 40; ++i)  // exactly at (or a rounding from) a boundary
                    us.push_back(double(cum[size_t(rng() % uint64_t(V))] / total));
                for (double u : us) {
                    const std::string what = "V " + std::to_string(V) + " t " +
                                             std::to_string(t) + " min-p " +
                                             std::to_string(min_p) + " u " + std::to_string(u);
                    const int32_t tok = s.sample_with(l.data(), u);
                    ASSERT_GE(tok, 0) << what;
                    ASSERT_LT(tok, V) << what;
                    ASSERT_GT(w[size_t(tok)], 0.f) << what;
                    const long double target = total * u, slack = total * 1e-12L;
                    ASSERT_LE(cum[size_t(tok)], target + slack) << what << " token " << tok;
                    ASSERT_GE(cum[size_t(tok) + 1], target - slack) << what << " token " << tok;
                    ASSERT_NEAR(s.last_prob(), double(w[size_t(tok)] / total),
                                1e-6 * double(w[size_t(tok)] / total))
                        << what;
                }
            }
    }
}

// The walk of vocab_draw.h at one level: the first positive weight whose running sum reaches
// the target, and the running sum before it; where rounding leaves the target past the running
// sum (1 + 2^-53 rounds back to 1), the last positive weight and the sum before that.
TEST(Sampler, WalkLevelFallsBackToTheLastPositiveWeight) {
    const std::vector<double> w = {0.0, 0.5, 0.0, 0.25, 0.25, 0.0};
    auto at = [&](int i) { return w[size_t(i)]; };
    double run = 0.0;
    EXPECT_EQ(walk_level(at, 6, 0.0, run), 1);  // a zero target: the first positive weight
    EXPECT_EQ(run, 0.0);
    run = 0.0;
    EXPECT_EQ(walk_level(at, 6, 0.5, run), 1);  // a running sum equal to the target reaches it
    run = 0.0;
    EXPECT_EQ(walk_level(at, 6, 0.6, run), 3);
    EXPECT_EQ(run, 0.5);
    run = 1.0;  // a level below starts from the sum before its parent
    EXPECT_EQ(walk_level(at, 6, 1.8, run), 4);
    EXPECT_EQ(run, 1.75);
    const std::vector<double> tiny = {0x1.0p-53, 0x1.0p-53, 0.0};
    run = 1.0;
    EXPECT_EQ(walk_level([&](int i) { return tiny[size_t(i)]; }, 3, 1.0 + 0x1.0p-52, run), 1);
    EXPECT_EQ(run, 1.0);
}

TEST(Sampler, TopKBoundaryTiesKeepLowerIds) {
    // Six tokens tie at the top-3 boundary: ids 2, 4 (and the strictly larger 9) survive.
    std::vector<float> l = {0.f, 0.f, 1.f, 0.f, 1.f, 1.f, 1.f, 0.f, 1.f, 2.f};
    SamplerParams p = plain(1.f, 3);
    p.top_k = 3;
    Sampler s(p, int(l.size()));
    std::set<int32_t> seen;
    for (int i = 0; i < 2000; ++i) seen.insert(s.sample(l.data()));
    EXPECT_EQ(seen, (std::set<int32_t>{2, 4, 9}));

    // Ties at the boundary after the largest logit: the first of them stays.
    std::vector<float> l2 = {1.f, 1.f, 3.f, 1.f, 1.f};
    p.top_k = 2;
    Sampler s2(p, int(l2.size()));
    seen.clear();
    for (int i = 0; i < 2000; ++i) seen.insert(s2.sample(l2.data()));
    EXPECT_EQ(seen, (std::set<int32_t>{0, 2}));
}

TEST(Sampler, TopLogprobsAreLogSoftmaxOfRawLogits) {
    const int V = 1000;
    auto l = random_logits(V, 2.f, 21);
    l[500] = l[10];  // a tie: the lower id comes first
    SamplerParams p;
    p.repeat_penalty = 2.f;
    Sampler s(p, V);
    s.accept(int32_t(std::max_element(l.begin(), l.end()) - l.begin()));  // must not matter
    double m = *std::max_element(l.begin(), l.end()), z = 0;
    for (float x : l) z += std::exp(double(x) - m);
    const double log_z = m + std::log(z);
    const auto order = ranked(l);

    const auto top = s.top_logprobs(l.data(), 8);
    ASSERT_EQ(top.size(), 8u);
    for (size_t i = 0; i < top.size(); ++i) {
        EXPECT_EQ(top[i].first, order[i]);
        EXPECT_NEAR(top[i].second, double(l[size_t(order[i])]) - log_z, 1e-5);
    }
    const auto all = s.top_logprobs(l.data(), V + 5);
    ASSERT_EQ(all.size(), size_t(V));
    double total = 0;
    for (const auto& [id, lp] : all) total += std::exp(double(lp));
    EXPECT_NEAR(total, 1.0, 1e-4);
    const auto it10 = std::find_if(all.begin(), all.end(), [](auto& x) { return x.first == 10; });
    const auto it500 = std::find_if(all.begin(), all.end(), [](auto& x) { return x.first == 500; });
    EXPECT_LT(it10, it500);
    EXPECT_TRUE(s.top_logprobs(l.data(), 0).empty());
}

TEST(Sampler, RejectsBadParametersTokensAndLogits) {
    auto bad = [](auto mutate) {
        SamplerParams p;
        mutate(p);
        EXPECT_THROW(Sampler(p, 10), Error);
    };
    bad([](SamplerParams& p) { p.temperature = NAN; });
    bad([](SamplerParams& p) { p.top_p = 1.5f; });
    bad([](SamplerParams& p) { p.top_p = -0.1f; });
    bad([](SamplerParams& p) { p.min_p = 2.f; });
    bad([](SamplerParams& p) { p.repeat_penalty = 0.f; });
    bad([](SamplerParams& p) { p.repeat_penalty = INFINITY; });
    bad([](SamplerParams& p) { p.frequency_penalty = NAN; });
    bad([](SamplerParams& p) { p.presence_penalty = INFINITY; });
    bad([](SamplerParams& p) { p.repeat_last_n = -2; });
    EXPECT_THROW(Sampler(SamplerParams{}, 0), Error);

    Sampler s(SamplerParams{}, 10);
    EXPECT_THROW(s.accept(10), Error);
    EXPECT_THROW(s.accept(-1), Error);
    std::vector<float> l(10, 0.f);
    l[6] = NAN;
    EXPECT_THROW(s.sample(l.data()), Error);
    Sampler g(plain(0.f), 10);
    EXPECT_THROW(g.sample(l.data()), Error);
    std::vector<float> none(10, -INFINITY);
    EXPECT_THROW(s.sample(none.data()), Error);

    // NaN deep inside a large vocabulary, on every path (greedy, heap top-k, large top-k,
    // whole-vocabulary top-p and min-p, untruncated).
    std::vector<float> big = random_logits(5000, 1.f, 4);
    big[2517] = NAN;
    for (int top_k : {0, 40, 1000}) {
        for (float top_p : {1.f, 0.9f}) {
            for (float t : {0.f, 1.f}) {
                SamplerParams q = plain(t);
                q.top_k = top_k;
                q.top_p = top_p;
                q.min_p = 0.05f;
                Sampler n(q, int(big.size()));
                EXPECT_THROW(n.sample(big.data()), Error)
                    << "top_k " << top_k << " top_p " << top_p << " temperature " << t;
            }
        }
    }
}

}  // namespace
}  // namespace nt

// ---- sampling from a selection (the logits stay on the device) ----------------------------------

namespace nt {
namespace {

// A logit row with the cases a selection must get right: ties (a few values repeated), both
// zeros, infinities, and a wide spread.
std::vector<float> awkward_logits(int n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.f, 3.f);
    std::vector<float> l(static_cast<size_t>(n));
    const float common[] = {1.5f, 2.25f, -0.f, 0.f, 4.f};
    for (float& x : l) {
        const uint32_t r = rng() % 100;
        x = r < 10 ? common[r % 5] : r < 11 ? -INFINITY : d(rng);
    }
    l[size_t(rng() % uint32_t(n))] = 9.f;  // a clear leader sometimes, ties at 9 sometimes
    l[size_t(rng() % uint32_t(n))] = 9.f;
    return l;
}

// Samples the same stream of draws twice, from the whole row and from the selection a backend
// would return for each request, with the same accepted tokens: every token must agree.
void expect_selection_matches_row(const SamplerParams& p, int n_vocab,
                                  const std::vector<std::pair<int32_t, float>>& bias,
                                  uint32_t seed) {
    Sampler whole(p, n_vocab), sel(p, n_vocab);
    std::mt19937 rng(seed);
    for (int step = 0; step < 40; step++) {
        std::vector<float> row = awkward_logits(n_vocab, rng());
        std::vector<int32_t> changed;
        for (const auto& [id, b] : bias) changed.push_back(id);
        LogitRequest req = sel.request(changed);
        ASSERT_GT(req.k, 0) << "this configuration should not need the whole row";
        LogitCandidates c;
        select_logits_host(row.data(), n_vocab, req, c);
        std::vector<float> biased = row;
        for (const auto& [id, b] : bias)
            if (id >= 0 && id < n_vocab) biased[size_t(id)] += b;
        const int32_t a = whole.sample(biased.data()), s = sel.sample(req, c, bias);
        ASSERT_EQ(a, s) << "step " << step << ", k " << req.k << ", ids " << req.ids.size();
        ASSERT_FLOAT_EQ(whole.last_prob(), sel.last_prob());
        // Accept a token of the leading pack, so the penalties keep hitting tokens near the top.
        const int32_t acc = step % 3 == 0 ? a : int32_t(rng() % uint32_t(n_vocab));
        whole.accept(acc);
        sel.accept(acc);
    }
}

TEST(SamplerSelection, HostSelectionIsTheBestFirstWithLowerIdsOnTies) {
    const std::vector<float> row = awkward_logits(3000, 7);
    LogitRequest req;
    req.k = 50;
    req.ids = {0, 17, 2999};
    LogitCandidates c;
    select_logits_host(row.data(), 3000, req, c);
    std::vector<int> order = ranked(row);
    order.erase(std::remove_if(order.begin(), order.end(),
                               [&](int i) { return std::isnan(row[size_t(i)]); }),
                order.end());
    ASSERT_EQ(c.top_id.size(), 50u);
    for (int i = 0; i < 50; i++) {
        EXPECT_EQ(c.top_id[size_t(i)], order[size_t(i)]) << i;
        EXPECT_EQ(c.top_logit[size_t(i)], row[size_t(order[size_t(i)])]);
    }
    ASSERT_EQ(c.id_logit.size(), 3u);
    EXPECT_EQ(c.id_logit[1], row[17]);
    EXPECT_FALSE(c.nan);
    std::vector<float> bad = row;
    bad[5] = NAN;
    select_logits_host(bad.data(), 3000, req, c);
    EXPECT_TRUE(c.nan);
    req.k = 300;  // with 3 ids: past kMaxLogitCandidates
    EXPECT_THROW(select_logits_host(row.data(), 3000, req, c), Error);
    req.k = 5;
    req.ids = {3000};
    EXPECT_THROW(select_logits_host(row.data(), 3000, req, c), Error);
}

TEST(SamplerSelection, GreedyFromASelectionIsGreedyFromTheRow) {
    SamplerParams p = plain(0.f);
    expect_selection_matches_row(p, 5000, {}, 1);
    p.repeat_penalty = 1.3f;
    p.frequency_penalty = 0.2f;
    p.presence_penalty = 0.5f;
    p.repeat_last_n = 16;
    expect_selection_matches_row(p, 5000, {}, 2);
    // Penalties that raise logits (a penalty below 1, negative frequency and presence): a
    // penalised token from far down the row can win.
    p.repeat_penalty = 0.5f;
    p.frequency_penalty = -1.f;
    p.presence_penalty = -2.f;
    expect_selection_matches_row(p, 5000, {}, 3);
}

TEST(SamplerSelection, TopKChainFromASelectionDrawsWhatTheRowDraws) {
    SamplerParams p;  // llama.cpp's defaults: top-k 40, top-p 0.95, min-p 0.05, temperature 0.8
    p.seed = 99;
    expect_selection_matches_row(p, 20000, {}, 4);
    p.top_p = 0.5f;
    p.min_p = 0.f;
    p.temperature = 1.7f;
    p.repeat_penalty = 1.1f;
    p.repeat_last_n = 64;
    p.presence_penalty = -0.7f;
    expect_selection_matches_row(p, 20000, {}, 5);
    p.top_k = 1;
    expect_selection_matches_row(p, 20000, {}, 6);
}

TEST(SamplerSelection, BiasesTravelWithTheRequest) {
    SamplerParams p;
    p.seed = 5;
    // A bias that lifts a token from nowhere to the top, one that buries the leader, one out of
    // the vocabulary (ignored, as on a row) and one token twice (both added).
    const std::vector<std::pair<int32_t, float>> bias = {
        {123, 30.f}, {7, -100.f}, {-4, 1.f}, {4321, 2.f}, {4321, 3.f}};
    expect_selection_matches_row(p, 8000, bias, 7);
    expect_selection_matches_row(plain(0.f), 8000, bias, 8);
}

TEST(SamplerSelection, WholeRowWhenTheDrawNeedsIt) {
    SamplerParams p;
    p.top_k = 0;  // top-p over the whole vocabulary
    EXPECT_EQ(Sampler(p, 1000).request().k, 0);
    p.top_k = 1000;  // top-k as large as the vocabulary: off
    EXPECT_EQ(Sampler(p, 1000).request().k, 0);
    p.top_k = 250;
    Sampler s(p, 1000);
    EXPECT_EQ(s.request().k, 250);
    EXPECT_EQ(s.request({1, 2, 3, 3, 5000}).k, 253);  // deduplicated, out of range dropped
    EXPECT_EQ(s.request({1, 2, 3, 4, 5, 6, 7}).k,
              0);  // 257 candidates: more than a selection holds
    // A selection that does not answer its request, and one with a NaN, are errors.
    LogitRequest req = s.request();
    LogitCandidates c;
    EXPECT_THROW(s.sample(req, c), Error);
    std::vector<float> row = random_logits(1000, 1.f, 3);
    row[10] = NAN;
    select_logits_host(row.data(), 1000, req, c);
    EXPECT_THROW(s.sample(req, c), Error);
}

// The uniforms drawn ahead (for draws made elsewhere, TokenDraw::u) are the ones the sampler's
// own draws then use: peeking changes no token of the stream.
TEST(SamplerDeviceDraw, PeekedUniformsAreTheStreamsOwn) {
    SamplerParams p;
    p.seed = 42;
    Sampler plain_stream(p, 3000), peeking(p, 3000);
    std::mt19937 rng(9);
    for (int step = 0; step < 30; step++) {
        const std::vector<float> row = awkward_logits(3000, rng());
        if (step % 4 == 0) {  // look one to three draws ahead; the values stay put
            const double u0 = peeking.peek_uniform(0), u2 = peeking.peek_uniform(2);
            EXPECT_EQ(peeking.peek_uniform(0), u0);
            EXPECT_EQ(peeking.peek_uniform(2), u2);
            EXPECT_TRUE(u0 >= 0.0 && u0 < 1.0);
        }
        ASSERT_EQ(plain_stream.sample(row.data()), peeking.sample(row.data())) << step;
    }
    peeking.peek_uniform(5);
    peeking.reset();  // restarts the stream: what was drawn ahead is gone
    plain_stream.reset();
    const std::vector<float> row = awkward_logits(3000, 1);
    EXPECT_EQ(plain_stream.sample(row.data()), peeking.sample(row.data()));
}

// A draw with a given uniform (the host's copy of a device's draw) is the draw sample() makes
// with that uniform, and leaves the stream where it was.
TEST(SamplerDeviceDraw, DrawWithAGivenUniform) {
    SamplerParams p;
    p.seed = 8;
    p.temperature = 1.4f;
    Sampler a(p, 3000), b(p, 3000);
    std::mt19937 rng(3);
    for (int step = 0; step < 20; step++) {
        const std::vector<float> row = awkward_logits(3000, rng());
        LogitRequest req = a.request();
        LogitCandidates c;
        select_logits_host(row.data(), 3000, req, c);
        const double u = b.peek_uniform(0);
        EXPECT_EQ(b.sample_with(req, c, u), a.sample(req, c)) << step;
        EXPECT_EQ(b.peek_uniform(0), u);  // not used up
        b.sample(req, c);                 // now it is
    }
}

// Which samplers a backend can draw for by itself, and with what.
TEST(SamplerDeviceDraw, GreedyTheTopKChainAndTheWholeVocabularyWithoutPenalties) {
    TokenDraw d;
    EXPECT_TRUE(Sampler(plain(0.f), 1000).device_draw(d));
    EXPECT_EQ(d.top_k, 1);
    EXPECT_EQ(d.temperature, 0.f);
    SamplerParams p;  // the default chain
    ASSERT_TRUE(Sampler(p, 1000).device_draw(d));
    EXPECT_EQ(d.top_k, 40);
    EXPECT_EQ(d.temperature, 0.8f);
    EXPECT_EQ(d.top_p, 0.95f);
    EXPECT_EQ(d.min_p, 0.05f);
    EXPECT_EQ(d.log_min_p, std::log(0.05f));
    p.top_k = 0;  // top-p over the whole row
    EXPECT_FALSE(Sampler(p, 1000).device_draw(d));
    p.top_p = 1.f;  // the whole vocabulary, min-p its floor (vocab_draw.h)
    ASSERT_TRUE(Sampler(p, 1000).device_draw(d));
    EXPECT_EQ(d.top_k, 0);
    EXPECT_EQ(d.top_p, 1.f);
    EXPECT_EQ(d.min_p, 0.05f);
    p.top_k = 1000;  // top-k of the whole vocabulary is off
    ASSERT_TRUE(Sampler(p, 1000).device_draw(d));
    EXPECT_EQ(d.top_k, 0);
    p.top_p = 0.95f;
    p.top_k = kMaxLogitCandidates + 1;
    EXPECT_FALSE(Sampler(p, 1000).device_draw(d));
    p.top_k = 40;
    p.repeat_penalty = 1.1f;  // the device has no window counts
    EXPECT_FALSE(Sampler(p, 1000).device_draw(d));
    p.repeat_penalty = 1.f;
    p.presence_penalty = 0.5f;
    EXPECT_FALSE(Sampler(p, 1000).device_draw(d));
    p.presence_penalty = 0.f;
    p.temperature = 0.f;
    EXPECT_TRUE(Sampler(p, 1000).device_draw(d));  // greedy whatever the top-k
    EXPECT_EQ(d.top_k, 1);
}

}  // namespace
}  // namespace nt
