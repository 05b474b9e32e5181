// Attention in double precision over a cache mirror, the reference the CPU backend's attention
// (tests/unit) and the CUDA attention kernels (tests/gpu) are both checked against.
#pragma once
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/backend.h"
#include "core/f16.h"

namespace nt {

// Keeps what the cache must hold for each (sequence, position): K and V rounded to F16.
struct KvMirror {
    int kv_dim, n_ctx;
    std::vector<float> k, v;  // [seq][pos][kv_dim]
    KvMirror(int kv_dim_, int n_seq, int n_ctx_)
        : kv_dim(kv_dim_), n_ctx(n_ctx_), k(size_t(n_seq) * n_ctx_ * kv_dim_), v(k.size()) {}
    void store(int seq, int pos, const float* kr, const float* vr) {
        const size_t o = (size_t(seq) * n_ctx + pos) * size_t(kv_dim);
        for (int j = 0; j < kv_dim; j++) {
            k[o + j] = f16_to_f32(f32_to_f16(kr[j]));
            v[o + j] = f16_to_f32(f32_to_f16(vr[j]));
        }
    }
};

// Causal attention of one query row (all heads) in double precision.
inline std::vector<float> reference_row(const ModelShape& s, const KvMirror& kv, const float* q, int seq,
                                 int pos) {
    const int hd = s.head_dim, group = s.n_head / s.n_head_kv;
    std::vector<float> out(size_t(s.n_head) * hd);
    std::vector<double> w(size_t(pos) + 1);
    for (int h = 0; h < s.n_head; h++) {
        const int kvh = h / group;
        double mx = -1e300;
        for (int p = 0; p <= pos; p++) {
            const float* kr = &kv.k[(size_t(seq) * kv.n_ctx + p) * kv.kv_dim + size_t(kvh) * hd];
            double d = 0;
            for (int j = 0; j < hd; j++) d += double(q[h * hd + j]) * kr[j];
            w[size_t(p)] = d / std::sqrt(double(hd));
            mx = std::max(mx, w[size_t(p)]);
        }
        double sum = 0;
        for (int p = 0; p <= pos; p++) sum += (w[size_t(p)] = std::exp(w[size_t(p)] - mx));
        for (int j = 0; j < hd; j++) {
            double a = 0;
            for (int p = 0; p <= pos; p++)
                a += w[size_t(p)] *
                     kv.v[(size_t(seq) * kv.n_ctx + p) * kv.kv_dim + size_t(kvh) * hd + j];
            out[size_t(h * hd + j)] = float(a / sum);
        }
    }
    return out;
}

}  // namespace nt
