// The CPU backend's attention against the double-precision reference, across the chunks of
// kAttnChunk positions its softmax and P*V go in (CpuBackend::attention defines the arithmetic
// the CUDA decode kernels reproduce bit for bit; this checks that it is also accurate), and its
// batch invariance: a row gives the same bits alone or inside a prompt.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "../common/attention_reference.h"
#include "backend/cpu/cpu_backend.h"
#include "core/f16.h"

namespace {

using namespace nt;

ModelShape attention_shape(int head_dim, int n_head, int n_head_kv) {
    ModelShape s;
    s.head_dim = head_dim;
    s.n_head = n_head;
    s.n_head_kv = n_head_kv;
    s.n_embd = n_head * head_dim;
    s.n_layer = 1;
    s.n_ff = 2 * s.n_embd;
    s.n_vocab = 32;
    s.norm_eps = 1e-5f;
    s.rope.n_rot = head_dim;
    s.rope.freq_base = 10000.f;
    return s;
}

std::vector<float> random_floats(size_t n, uint32_t seed, float lo, float hi) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(lo, hi);
    std::vector<float> v(n);
    for (float& x : v) x = u(rng);
    return v;
}

TEST(CpuAttention, AgainstDoubleReferenceAcrossChunks) {
    static_assert(kAttnChunk == 64);
    for (const auto& [hd, nh, nkv] : std::vector<std::array<int, 3>>{{64, 9, 3}, {128, 4, 1}, {96, 4, 4}}) {
        const ModelShape s = attention_shape(hd, nh, nkv);
        const int n = 200;  // positions 0..199: four chunks, the last partial
        CpuBackend cpu;
        cpu.init(s, n, 1, 256);
        const size_t qd = size_t(nh) * hd, kvd = size_t(nkv) * hd;
        // A peaked softmax (|q| up to 3) and a flat one.
        for (float qmax : {3.f, 0.2f}) {
            const std::vector<float> q = random_floats(n * qd, uint32_t(hd + nh), -qmax, qmax);
            const std::vector<float> k = random_floats(n * kvd, uint32_t(hd + nh + 1), -1.f, 1.f);
            const std::vector<float> v = random_floats(n * kvd, uint32_t(hd + nh + 2), -1.f, 1.f);
            Batch b;
            for (int i = 0; i < n; i++) b.add(1, i, 0, false);
            cpu.begin_step(b);
            Activations& a = cpu.acts();
            std::memcpy(a.q, q.data(), q.size() * sizeof(float));
            std::memcpy(a.k, k.data(), k.size() * sizeof(float));
            std::memcpy(a.v, v.data(), v.size() * sizeof(float));
            cpu.attention(0, a.q, a.k, a.v, a.att);
            std::vector<float> prompt(a.att, a.att + n * qd);
            KvMirror kv(int(kvd), 1, n);
            for (int i = 0; i < n; i++) kv.store(0, i, &k[size_t(i) * kvd], &v[size_t(i) * kvd]);
            double worst = 0;
            for (int i : {0, 1, 62, 63, 64, 65, 127, 128, 150, 199}) {
                const std::vector<float> want = reference_row(s, kv, &q[size_t(i) * qd], 0, i);
                for (size_t e = 0; e < qd; e++)
                    worst = std::max(worst, std::fabs(double(prompt[size_t(i) * qd + e]) - want[e]));
            }
            // Scores and each chunk's P*V are float sums (a few ulps of |score| <= 3 sqrt(hd)
            // and of |v| <= 1); everything across chunks is double. Measured: at most 2.7e-7
            // (the float arithmetic before chunks, one softmax over the whole context with the
            // weights normalised before P*V: 2.7e-7 too).
            EXPECT_LT(worst, 1e-6) << "head_dim " << hd << " |q| " << qmax;

            // The last row again, alone (a decode step over the cached positions): same bits.
            Batch one;
            one.add(1, n - 1, 0, true);
            cpu.begin_step(one);
            std::memcpy(a.q, q.data() + (n - 1) * qd, qd * sizeof(float));
            std::memcpy(a.k, k.data() + (n - 1) * kvd, kvd * sizeof(float));
            std::memcpy(a.v, v.data() + (n - 1) * kvd, kvd * sizeof(float));
            cpu.attention(0, a.q, a.k, a.v, a.att);
            EXPECT_EQ(0, std::memcmp(a.att, prompt.data() + (n - 1) * qd, qd * sizeof(float)))
                << "head_dim " << hd << ": the decode row differs from the prompt's";
        }
    }
}

}  // namespace
