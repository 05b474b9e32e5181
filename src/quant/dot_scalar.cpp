// The portable dot products: the path used where no SIMD level applies, and the reference the
// SIMD paths are tested against, bit for bit.
//
// The arithmetic is the specification every backend follows (dot_x86.h, "Batch invariance"):
// each block's integer dot product exactly (int32), then each block's term in double, summed in
// double and rounded once to float at the end. The terms are exact or nearly so (every scale
// product is exact in double), and a double sum of them is within about 1e-16 relative of the
// exact sum, far below float's 6e-8, so the float is the same whatever the order of the sum: a
// GPU adding the same terms in a tree gets the same float except where the exact sum lies that
// close to a float rounding boundary (VecDot.QuantizedMatchesSpecification checks exactly
// this). A float sum (one rounding per block) differs from the exact sum rounded once at about
// half the outputs, and with 8-bit activations one ulp anywhere moves some activation across a
// quantization step and the whole forward pass apart (CPU and GPU then agreed on ~97% of top-1
// tokens).
// Here, as in the SIMD kernels, the sum is one double chain per output over the blocks in
// order, from +0, with the fused steps as std::fma (one rounding; the hardware instruction where
// the CPU has one, glibc's exact software fma elsewhere), so that every level gives the same
// bits by construction, not only almost surely:
//   32-element formats: f = fma(double(isum), double(dw) * double(dy), f);
//                       Q4_1/Q5_1 then f = fma(double(m), double(s), f)
//   K-quants:           f = fma(double(isum), double(d) * double(dy), f); with mins
//                       f = fma(-double(msum), double(dmin) * double(dy), f)
//   result:             float(f), round to nearest
// The products of two scales are exact in double (11 + 24 bits at most). The offsets (q - 8,
// q - 16, q - 4, q - 32) are inside isum, which is exact whatever the order of its terms. The
// mins of Q4_1/Q5_1 multiply the activation block's s = d * sum(q) field, as in llama.cpp (s is
// an f16: its rounding, 2^-12 relative, is part of the Q8_1 format); the K-quant mins use the
// exact Q8_K bsums (msum = sum(min_j * bsum_j)). CMake builds this file with -ffp-contract=off,
// so that the compiler cannot fuse the other multiplies and adds.
//
// The float weights (F32/F16/BF16) are not matched: the SIMD levels disagree among themselves
// there (AVX2 adds the elements in 8 fma chains, AVX-512 in 16), and an fma per element costs
// the portable code a library call each (F32: 21 -> 0.8 GFLOP/s on a Zen 4 core, bench_quant).
#include <cmath>

#include "core/f16.h"
#include "quant/kernels.h"

namespace nt::quant_detail {
namespace {

inline float h2f(f16_t h) {
    return f16_to_f32(h);
}

// One block's step of the chain: its exact integer sum times the two scales' (exact) product,
// fused.
inline double add_block(double acc, int isum, float dw, float dy) {
    return std::fma(double(isum), double(dw) * double(dy), acc);
}
// The mins of Q4_1/Q5_1: m * s, fused.
inline double add_min(double acc, float m, float s) {
    return std::fma(double(m), double(s), acc);
}
// The mins of a K-quant block, subtracted in one fused step (the x86 kernels' FNMADD).
inline double sub_mins(double acc, int msum, float dmin, float dy) {
    return std::fma(-double(msum), double(dmin) * double(dy), acc);
}

float dot_q4_0(int64_t n, const void* vw, const void* va) {
    const auto* w = static_cast<const block_q4_0*>(vw);
    const auto* a = static_cast<const block_q8_0*>(va);
    double acc = 0.0;
    for (int64_t b = 0; b < n / 32; ++b) {
        int s = 0;
        for (int j = 0; j < 16; ++j) {
            s += ((w[b].qs[j] & 15) - 8) * a[b].qs[j];
            s += ((w[b].qs[j] >> 4) - 8) * a[b].qs[j + 16];
        }
        acc = add_block(acc, s, h2f(w[b].d), h2f(a[b].d));
    }
    return float(acc);
}

float dot_q4_1(int64_t n, const void* vw, const void* va) {
    const auto* w = static_cast<const block_q4_1*>(vw);
    const auto* a = static_cast<const block_q8_1*>(va);
    double acc = 0.0;
    for (int64_t b = 0; b < n / 32; ++b) {
        int s = 0;
        for (int j = 0; j < 16; ++j) {
            s += (w[b].qs[j] & 15) * a[b].qs[j];
            s += (w[b].qs[j] >> 4) * a[b].qs[j + 16];
        }
        acc = add_block(acc, s, h2f(w[b].d), h2f(a[b].d));
        acc = add_min(acc, h2f(w[b].m), h2f(a[b].s));
    }
    return float(acc);
}

// The 5-bit quants of Q5_0/Q5_1 blocks, 0..31.
template <typename Block>
inline void q5_values(const Block& x, int q[32]) {
    uint32_t qh;
    std::memcpy(&qh, x.qh, 4);
    for (int j = 0; j < 16; ++j) {
        q[j] = (x.qs[j] & 15) | int(((qh >> j) & 1) << 4);
        q[j + 16] = (x.qs[j] >> 4) | int(((qh >> (j + 16)) & 1) << 4);
    }
}

float dot_q5_0(int64_t n, const void* vw, const void* va) {
    const auto* w = static_cast<const block_q5_0*>(vw);
    const auto* a = static_cast<const block_q8_0*>(va);
    double acc = 0.0;
    int q[32];
    for (int64_t b = 0; b < n / 32; ++b) {
        q5_values(w[b], q);
        int s = 0;
        for (int j = 0; j < 32; ++j) s += (q[j] - 16) * a[b].qs[j];
        acc = add_block(acc, s, h2f(w[b].d), h2f(a[b].d));
    }
    return float(acc);
}

float dot_q5_1(int64_t n, const void* vw, const void* va) {
    const auto* w = static_cast<const block_q5_1*>(vw);
    const auto* a = static_cast<const block_q8_1*>(va);
    double acc = 0.0;
    int q[32];
    for (int64_t b = 0; b < n / 32; ++b) {
        q5_values(w[b], q);
        int s = 0;
        for (int j = 0; j < 32; ++j) s += q[j] * a[b].qs[j];
        acc = add_block(acc, s, h2f(w[b].d), h2f(a[b].d));
        acc = add_min(acc, h2f(w[b].m), h2f(a[b].s));
    }
    return float(acc);
}

float dot_q8_0(int64_t n, const void* vw, const void* va) {
    const auto* w = static_cast<const block_q8_0*>(vw);
    const auto* a = static_cast<const block_q8_0*>(va);
    double acc = 0.0;
    for (int64_t b = 0; b < n / 32; ++b) {
        int s = 0;
        for (int j = 0; j < 32; ++j) s += w[b].qs[j] * a[b].qs[j];
        acc = add_block(acc, s, h2f(w[b].d), h2f(a[b].d));
    }
    return float(acc);
}

// K-quants: the integer part is sum over groups of scale * (quants . activation quants).
float dot_q2_K(int64_t n, const void* vw, const void* va) {
    const auto* w = static_cast<const block_q2_K*>(vw);
    const auto* a = static_cast<const block_q8_K*>(va);
    double acc = 0.0;
    for (int64_t b = 0; b < n / QK_K; ++b) {
        int isum = 0, msum = 0;
        for (int g = 0; g < 16; ++g) {
            int s = 0;
            for (int l = 0; l < 16; ++l) {
                const int e = g * 16 + l, h = e >> 7, sh = 2 * ((e >> 5) & 3);
                s += ((w[b].qs[h * 32 + (e & 31)] >> sh) & 3) * a[b].qs[e];
            }
            isum += (w[b].scales[g] & 15) * s;
            msum += (w[b].scales[g] >> 4) * a[b].bsums[g];
        }
        acc = add_block(acc, isum, h2f(w[b].d), a[b].d);
        acc = sub_mins(acc, msum, h2f(w[b].dmin), a[b].d);
    }
    return float(acc);
}

float dot_q3_K(int64_t n, const void* vw, const void* va) {
    const auto* w = static_cast<const block_q3_K*>(vw);
    const auto* a = static_cast<const block_q8_K*>(va);
    double acc = 0.0;
    int8_t sc[16];
    for (int64_t b = 0; b < n / QK_K; ++b) {
        unpack_q3k_scales(w[b].scales, sc);
        int isum = 0;
        for (int g = 0; g < 16; ++g) {
            int s = 0;
            for (int l = 0; l < 16; ++l) {
                const int e = g * 16 + l, h = e >> 7, sh = 2 * ((e >> 5) & 3);
                const int lo = (w[b].qs[h * 32 + (e & 31)] >> sh) & 3;
                const int hi = (w[b].hmask[e & 31] >> (e >> 5)) & 1;
                s += (lo - (hi ? 0 : 4)) * a[b].qs[e];
            }
            isum += sc[g] * s;
        }
        acc = add_block(acc, isum, h2f(w[b].d), a[b].d);
    }
    return float(acc);
}

template <bool kFive, typename Block>
float dot_q45_K(int64_t n, const void* vw, const void* va) {
    const auto* w = static_cast<const Block*>(vw);
    const auto* a = static_cast<const block_q8_K*>(va);
    double acc = 0.0;
    uint8_t sc[8], m[8];
    for (int64_t b = 0; b < n / QK_K; ++b) {
        unpack_k4_scales(w[b].scales, sc, m);
        int isum = 0, msum = 0;
        for (int g = 0; g < 8; ++g) {
            const uint8_t* q = w[b].qs + (g >> 1) * 32;
            const int sh = (g & 1) * 4;
            int s = 0;
            for (int l = 0; l < 32; ++l) {
                int v = (q[l] >> sh) & 15;
                if constexpr (kFive) v |= ((w[b].qh[l] >> g) & 1) << 4;
                s += v * a[b].qs[g * 32 + l];
            }
            isum += sc[g] * s;
            msum += m[g] * (a[b].bsums[2 * g] + a[b].bsums[2 * g + 1]);
        }
        acc = add_block(acc, isum, h2f(w[b].d), a[b].d);
        acc = sub_mins(acc, msum, h2f(w[b].dmin), a[b].d);
    }
    return float(acc);
}

float dot_q4_K(int64_t n, const void* w, const void* a) {
    return dot_q45_K<false, block_q4_K>(n, w, a);
}
float dot_q5_K(int64_t n, const void* w, const void* a) {
    return dot_q45_K<true, block_q5_K>(n, w, a);
}

float dot_q6_K(int64_t n, const void* vw, const void* va) {
    const auto* w = static_cast<const block_q6_K*>(vw);
    const auto* a = static_cast<const block_q8_K*>(va);
    double acc = 0.0;
    for (int64_t b = 0; b < n / QK_K; ++b) {
        int isum = 0;
        for (int g = 0; g < 16; ++g) {
            int s = 0;
            for (int l = 0; l < 16; ++l) {
                const int e = g * 16 + l, h = e >> 7, r = e & 127;
                const int lo = (w[b].ql[h * 64 + (r & 63)] >> (4 * (r >> 6))) & 15;
                const int hi = (w[b].qh[h * 32 + (r & 31)] >> (2 * (r >> 5))) & 3;
                s += ((lo | (hi << 4)) - 32) * a[b].qs[e];
            }
            isum += w[b].scales[g] * s;
        }
        acc = add_block(acc, isum, h2f(w[b].d), a[b].d);
    }
    return float(acc);
}

// Float weights against float activations: eight interleaved partial sums, added pairwise at
// the end, so long rows do not lose precision to one long serial sum.
template <typename Load>
float dot_float(int64_t n, const void* vw, const float* a, Load load) {
    const auto* w = static_cast<const uint8_t*>(vw);
    float p[8] = {};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        for (int k = 0; k < 8; ++k) p[k] += load(w, i + k) * a[i + k];
    }
    for (; i < n; ++i) p[0] += load(w, i) * a[i];
    return ((p[0] + p[4]) + (p[1] + p[5])) + ((p[2] + p[6]) + (p[3] + p[7]));
}

float dot_f32(int64_t n, const void* w, const void* a) {
    return dot_float(n, w, static_cast<const float*>(a), [](const uint8_t* p, int64_t i) {
        float v;
        std::memcpy(&v, p + 4 * i, 4);
        return v;
    });
}
float dot_f16(int64_t n, const void* w, const void* a) {
    return dot_float(n, w, static_cast<const float*>(a),
                     [](const uint8_t* p, int64_t i) { return f16_to_f32(load_u16(p + 2 * i)); });
}
float dot_bf16(int64_t n, const void* w, const void* a) {
    return dot_float(n, w, static_cast<const float*>(a),
                     [](const uint8_t* p, int64_t i) { return bf16_to_f32(load_u16(p + 2 * i)); });
}

template <float (*Dot)(int64_t, const void*, const void*)>
void tile(int64_t n, int nrows, int ncols, const void* w, size_t w_stride, const void* a,
          size_t a_stride, float* out, size_t out_stride) {
    const auto* wb = static_cast<const uint8_t*>(w);
    const auto* ab = static_cast<const uint8_t*>(a);
    for (int j = 0; j < ncols; ++j) {
        for (int i = 0; i < nrows; ++i) {
            out[size_t(j) * out_stride + size_t(i)] =
                Dot(n, wb + size_t(i) * w_stride, ab + size_t(j) * a_stride);
        }
    }
}

KernelTable make_table() {
    KernelTable t;
    t.tile[int(GgmlType::F32)] = tile<dot_f32>;
    t.tile[int(GgmlType::F16)] = tile<dot_f16>;
    t.tile[int(GgmlType::BF16)] = tile<dot_bf16>;
    t.tile[int(GgmlType::Q4_0)] = tile<dot_q4_0>;
    t.tile[int(GgmlType::Q4_1)] = tile<dot_q4_1>;
    t.tile[int(GgmlType::Q5_0)] = tile<dot_q5_0>;
    t.tile[int(GgmlType::Q5_1)] = tile<dot_q5_1>;
    t.tile[int(GgmlType::Q8_0)] = tile<dot_q8_0>;
    t.tile[int(GgmlType::Q2_K)] = tile<dot_q2_K>;
    t.tile[int(GgmlType::Q3_K)] = tile<dot_q3_K>;
    t.tile[int(GgmlType::Q4_K)] = tile<dot_q4_K>;
    t.tile[int(GgmlType::Q5_K)] = tile<dot_q5_K>;
    t.tile[int(GgmlType::Q6_K)] = tile<dot_q6_K>;
    return t;
}

}  // namespace

const KernelTable& scalar_kernels() {
    static const KernelTable table = make_table();
    return table;
}

}  // namespace nt::quant_detail
