// Small fixtures the unit tests and the GPU tests share: random inputs and a model shape for
// kernel-level tests.
#pragma once
#include <cstdint>
#include <random>
#include <vector>

#include "backend/backend.h"

namespace nt {

inline std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -1.f, float hi = 1.f) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<float> v(n);
    for (float& x : v) x = d(rng);
    return v;
}

// A Llama-like shape from the attention's sizes (n_embd = n_head * head_dim, n_ff twice that).
inline ModelShape make_shape(int head_dim, int n_head, int n_head_kv, int n_layer = 1) {
    ModelShape s;
    s.head_dim = head_dim;
    s.n_head = n_head;
    s.n_head_kv = n_head_kv;
    s.n_embd = n_head * head_dim;
    s.n_layer = n_layer;
    s.n_ff = 2 * s.n_embd;
    s.n_vocab = 96;
    s.norm_eps = 1e-5f;
    s.rope.n_rot = head_dim;
    s.rope.freq_base = 10000.f;
    return s;
}

}  // namespace nt
