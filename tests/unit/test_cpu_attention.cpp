// The CPU backend's attention against the double-precision reference, across the chunks of
// kAttnChunk positions its softmax and P*V go in (CpuBackend::attention defines the arithmetic
// the CUDA decode kernels reproduce bit for bit; this checks that it is also accurate), and its
// batch invariance: a row gives the same bits alone or inside a prompt.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "../common/attention_reference.h"
#include "../common/fixtures.h"
#include "backend/cpu/cpu_backend.h"
#include "core/f16.h"

namespace {

using namespace nt;

TEST(CpuAttention, AgainstDoubleReferenceAcrossChunks) {
    static_assert(kAttnChunk == 64);
    for (const auto& [hd, nh, nkv] : std::vector<std::array<int, 3>>{{64, 9, 3}, {128, 4, 1}, {96, 4, 4}}) {
        const ModelShape s = make_shape(hd, nh, nkv);
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

// The CUDA decode kernels' order of the same arithmetic, emulated here: the context cut into
// slices of whole chunks (as split_range cuts it), each slice merging its chunks in double,
// then the slices merged in double with weights e^(m_s - M). The claim the kernels rest on is
// that this order gives the CPU backend's bits (differences in double vanish in the final
// rounding); this checks it for many slice counts and contexts, with glibc's exp standing in
// for the kernels' own double exp.
TEST(CpuAttention, SlicesMergedInDoubleGiveTheSameBits) {
    const ModelShape s = make_shape(64, 2, 1);
    const int n_ctx = 1100, hd = s.head_dim, kvd = hd;
    CpuBackend cpu;
    cpu.init(s, n_ctx, 1, n_ctx);
    const std::vector<float> k = random_floats(size_t(n_ctx) * kvd, 7, -1.f, 1.f);
    const std::vector<float> v = random_floats(size_t(n_ctx) * kvd, 8, -1.f, 1.f);
    KvMirror kv(kvd, 1, n_ctx);
    for (int p = 0; p < n_ctx; p++) kv.store(0, p, &k[size_t(p) * kvd], &v[size_t(p) * kvd]);
    const float scale = 1.0f / std::sqrt(float(hd));
    int rows = 0;
    for (int len : {1, 63, 64, 65, 200, 640, 1000, 1100}) {
        for (uint32_t seed = 0; seed < 4; seed++) {
            const std::vector<float> q = random_floats(size_t(s.n_head) * hd, 100 + seed, -3.f, 3.f);
            // The CPU: the positions before len are in the cache; one decode row at len - 1.
            Batch prompt;
            for (int p = 0; p < len; p++) prompt.add(1, p, 0, false);
            cpu.begin_step(prompt);
            Activations& a = cpu.acts();
            std::memcpy(a.k, k.data(), size_t(len) * kvd * sizeof(float));
            std::memcpy(a.v, v.data(), size_t(len) * kvd * sizeof(float));
            std::fill(a.q, a.q + size_t(len) * s.n_head * hd, 0.f);
            std::memcpy(a.q + size_t(len - 1) * s.n_head * hd, q.data(), q.size() * sizeof(float));
            cpu.attention(0, a.q, a.k, a.v, a.att);
            const float* want = a.att + size_t(len - 1) * s.n_head * hd;
            for (int splits : {1, 2, 3, 7, 16, 64}) {
                int chunk = (len + splits - 1) / splits;
                chunk = (chunk + kAttnChunk - 1) / kAttnChunk * kAttnChunk;
                for (int h = 0; h < s.n_head; h++) {
                    const float* qh = q.data() + size_t(h) * hd;
                    std::vector<double> ms, ls;
                    std::vector<std::vector<double>> accs;
                    for (int s0 = 0; s0 < len; s0 += chunk) {  // a slice
                        double m = -INFINITY, l = 0;
                        std::vector<double> acc(size_t(hd), 0.0);
                        for (int p0 = s0; p0 < std::min(len, s0 + chunk); p0 += kAttnChunk) {
                            const int np = std::min({kAttnChunk, len - p0, s0 + chunk - p0});
                            float sc[kAttnChunk], mx = -INFINITY;
                            for (int p = 0; p < np; p++) {
                                float d = 0;
                                for (int j = 0; j < hd; j++) d += qh[j] * kv.k[size_t(p0 + p) * kvd + j];
                                sc[p] = d * scale;
                                mx = std::max(mx, sc[p]);
                            }
                            double sum = 0;
                            std::vector<float> pv(size_t(hd), 0.f);
                            // The kernels sum e over the tile's lanes in a tree: here backwards.
                            for (int p = np - 1; p >= 0; p--) {
                                sc[p] = float(std::exp(double(sc[p]) - double(mx)));
                                sum += double(sc[p]);
                            }
                            for (int p = 0; p < np; p++)
                                for (int j = 0; j < hd; j++) pv[size_t(j)] += sc[p] * kv.v[size_t(p0 + p) * kvd + j];
                            const double mn = std::max(m, double(mx));
                            const double co = std::exp(m - mn), cn = std::exp(double(mx) - mn);
                            l = l * co + sum * cn;
                            for (int j = 0; j < hd; j++) acc[size_t(j)] = acc[size_t(j)] * co + double(pv[size_t(j)]) * cn;
                            m = mn;
                        }
                        ms.push_back(m), ls.push_back(l), accs.push_back(acc);
                    }
                    double M = -INFINITY, L = 0;
                    for (double m : ms) M = std::max(M, m);
                    std::vector<double> o(size_t(hd), 0.0);
                    for (size_t i = ms.size(); i-- > 0;) {  // slices last first
                        const double w = std::exp(ms[i] - M);
                        L += ls[i] * w;
                        for (int j = 0; j < hd; j++) o[size_t(j)] += accs[i][size_t(j)] * w;
                    }
                    for (int j = 0; j < hd; j++) {
                        const float got = float(o[size_t(j)] / L);
                        ASSERT_EQ(0, std::memcmp(&got, want + size_t(h) * hd + j, sizeof(float)))
                            << "context " << len << " slices " << splits << " head " << h << " dim " << j;
                    }
                    rows++;
                }
            }
        }
    }
    EXPECT_EQ(rows, 8 * 4 * 6 * 2);
}

}  // namespace
