// dequantize_row: block bytes -> float32, bit-identical to gguf-py's gguf.quants.dequantize.
//
// gguf-py computes in float32 numpy arrays, one rounding per operation, so every formula here
// keeps numpy's operation order (d * q + m is two roundings, never a fused multiply-add; this
// file is built as ISO C++, where GCC does not contract). Q8_1 and Q8_K, which gguf-py does not
// dequantize, follow the same d * q pattern as Q8_0.
#include <cstring>

#include "core/error.h"
#include "core/f16.h"
#include "quant/kernels.h"
#include "quant/quant.h"

namespace nt {
namespace {

using quant_detail::load_u16;

inline float h2f(f16_t h) {
    return f16_to_f32(h);
}

void dq_q4_0(const block_q4_0* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += QK4_0) {
        const float d = h2f(x[i].d);
        for (int j = 0; j < QK4_0 / 2; ++j) {
            y[j] = d * float((x[i].qs[j] & 15) - 8);
            y[j + 16] = d * float((x[i].qs[j] >> 4) - 8);
        }
    }
}

void dq_q4_1(const block_q4_1* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += QK4_1) {
        const float d = h2f(x[i].d), m = h2f(x[i].m);
        for (int j = 0; j < QK4_1 / 2; ++j) {
            const float a = d * float(x[i].qs[j] & 15);
            const float b = d * float(x[i].qs[j] >> 4);
            y[j] = a + m;
            y[j + 16] = b + m;
        }
    }
}

void dq_q5_0(const block_q5_0* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += QK5_0) {
        const float d = h2f(x[i].d);
        uint32_t qh;
        std::memcpy(&qh, x[i].qh, 4);
        for (int j = 0; j < QK5_0 / 2; ++j) {
            const int q0 = (x[i].qs[j] & 15) | int(((qh >> j) & 1) << 4);
            const int q1 = (x[i].qs[j] >> 4) | int(((qh >> (j + 16)) & 1) << 4);
            y[j] = d * float(q0 - 16);
            y[j + 16] = d * float(q1 - 16);
        }
    }
}

void dq_q5_1(const block_q5_1* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += QK5_1) {
        const float d = h2f(x[i].d), m = h2f(x[i].m);
        uint32_t qh;
        std::memcpy(&qh, x[i].qh, 4);
        for (int j = 0; j < QK5_1 / 2; ++j) {
            const int q0 = (x[i].qs[j] & 15) | int(((qh >> j) & 1) << 4);
            const int q1 = (x[i].qs[j] >> 4) | int(((qh >> (j + 16)) & 1) << 4);
            const float a = d * float(q0);
            const float b = d * float(q1);
            y[j] = a + m;
            y[j + 16] = b + m;
        }
    }
}

void dq_q8_0(const block_q8_0* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += QK8_0) {
        const float d = h2f(x[i].d);
        for (int j = 0; j < QK8_0; ++j) y[j] = float(x[i].qs[j]) * d;
    }
}

void dq_q8_1(const block_q8_1* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += QK8_1) {
        const float d = h2f(x[i].d);
        for (int j = 0; j < QK8_1; ++j) y[j] = float(x[i].qs[j]) * d;
    }
}

// Q2_K: 16 groups of 16; element h*128 + s*32 + l is bits 2s..2s+1 of qs[h*32 + l].
void dq_q2_K(const block_q2_K* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += QK_K) {
        const float d = h2f(x[i].d), dmin = h2f(x[i].dmin);
        for (int e = 0; e < QK_K; ++e) {
            const int h = e >> 7, s = (e >> 5) & 3, l = e & 31;
            const int q = (x[i].qs[h * 32 + l] >> (2 * s)) & 3;
            const uint8_t sc = x[i].scales[e >> 4];
            const float dl = d * float(sc & 15);
            const float ml = dmin * float(sc >> 4);
            const float t = dl * float(q);
            y[e] = t - ml;
        }
    }
}

// Q3_K: low two bits as Q2_K, the third from hmask bit (e / 32) of byte (e % 32); a clear bit
// subtracts 4.
void dq_q3_K(const block_q3_K* x, float* y, int64_t nb) {
    int8_t sc[16];
    for (int64_t i = 0; i < nb; ++i, y += QK_K) {
        const float d = h2f(x[i].d);
        quant_detail::unpack_q3k_scales(x[i].scales, sc);
        for (int e = 0; e < QK_K; ++e) {
            const int h = e >> 7, s = (e >> 5) & 3, l = e & 31;
            const int lo = (x[i].qs[h * 32 + l] >> (2 * s)) & 3;
            const int hi = (x[i].hmask[l] >> (e >> 5)) & 1;
            const float dl = d * float(sc[e >> 4]);
            y[e] = dl * float(lo - (hi ? 0 : 4));
        }
    }
}

// Q4_K: 8 groups of 32; group 2c+half is nibble `half` of qs[c*32 + l].
void dq_q4_K(const block_q4_K* x, float* y, int64_t nb) {
    uint8_t sc[8], m[8];
    for (int64_t i = 0; i < nb; ++i, y += QK_K) {
        const float d = h2f(x[i].d), dmin = h2f(x[i].dmin);
        quant_detail::unpack_k4_scales(x[i].scales, sc, m);
        for (int g = 0; g < 8; ++g) {
            const float d1 = d * float(sc[g]);
            const float m1 = dmin * float(m[g]);
            const uint8_t* q = x[i].qs + (g >> 1) * 32;
            const int shift = (g & 1) * 4;
            for (int l = 0; l < 32; ++l) {
                const float t = d1 * float((q[l] >> shift) & 15);
                y[g * 32 + l] = t - m1;
            }
        }
    }
}

// Q5_K: Q4_K plus a fifth bit: bit g of qh[l] for group g.
void dq_q5_K(const block_q5_K* x, float* y, int64_t nb) {
    uint8_t sc[8], m[8];
    for (int64_t i = 0; i < nb; ++i, y += QK_K) {
        const float d = h2f(x[i].d), dmin = h2f(x[i].dmin);
        quant_detail::unpack_k4_scales(x[i].scales, sc, m);
        for (int g = 0; g < 8; ++g) {
            const float d1 = d * float(sc[g]);
            const float m1 = dmin * float(m[g]);
            const uint8_t* q = x[i].qs + (g >> 1) * 32;
            const int shift = (g & 1) * 4;
            for (int l = 0; l < 32; ++l) {
                const int v = ((q[l] >> shift) & 15) | (((x[i].qh[l] >> g) & 1) << 4);
                const float t = d1 * float(v);
                y[g * 32 + l] = t - m1;
            }
        }
    }
}

// Q6_K: element h*128 + s*64 + l (l < 64) takes nibble s of ql[h*64 + l]; element
// h*128 + s*32 + l (l < 32) takes bits 2s..2s+1 of qh[h*32 + l] as bits 4..5. Offset 32.
void dq_q6_K(const block_q6_K* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += QK_K) {
        const float d = h2f(x[i].d);
        for (int e = 0; e < QK_K; ++e) {
            const int h = e >> 7, r = e & 127;
            const int lo = (x[i].ql[h * 64 + (r & 63)] >> (4 * (r >> 6))) & 15;
            const int hi = (x[i].qh[h * 32 + (r & 31)] >> (2 * (r >> 5))) & 3;
            const float dl = d * float(x[i].scales[e >> 4]);
            y[e] = dl * float((lo | (hi << 4)) - 32);
        }
    }
}

void dq_q8_K(const block_q8_K* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += QK_K) {
        for (int j = 0; j < QK_K; ++j) y[j] = x[i].d * float(x[i].qs[j]);
    }
}

}  // namespace

void dequantize_row(GgmlType t, const void* src, float* dst, int64_t n) {
    const TypeTraits* tr = type_traits(uint32_t(t));
    if (!tr)
        fail("cannot dequantize tensor type id %u: it is not a GGML type this build knows.",
             unsigned(t));
    if (n % tr->block_elems != 0)
        fail("cannot dequantize %lld elements of type %s: not a multiple of its block size %d.",
             (long long)n, tr->name, tr->block_elems);
    const int64_t nb = n / tr->block_elems;
    switch (t) {
        case GgmlType::F32:
            std::memcpy(dst, src, size_t(n) * 4);
            return;
        case GgmlType::F16: {
            const auto* s = static_cast<const uint8_t*>(src);
            for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(load_u16(s + 2 * i));
            return;
        }
        case GgmlType::BF16: {
            const auto* s = static_cast<const uint8_t*>(src);
            for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(load_u16(s + 2 * i));
            return;
        }
        case GgmlType::Q4_0:
            return dq_q4_0(static_cast<const block_q4_0*>(src), dst, nb);
        case GgmlType::Q4_1:
            return dq_q4_1(static_cast<const block_q4_1*>(src), dst, nb);
        case GgmlType::Q5_0:
            return dq_q5_0(static_cast<const block_q5_0*>(src), dst, nb);
        case GgmlType::Q5_1:
            return dq_q5_1(static_cast<const block_q5_1*>(src), dst, nb);
        case GgmlType::Q8_0:
            return dq_q8_0(static_cast<const block_q8_0*>(src), dst, nb);
        case GgmlType::Q8_1:
            return dq_q8_1(static_cast<const block_q8_1*>(src), dst, nb);
        case GgmlType::Q2_K:
            return dq_q2_K(static_cast<const block_q2_K*>(src), dst, nb);
        case GgmlType::Q3_K:
            return dq_q3_K(static_cast<const block_q3_K*>(src), dst, nb);
        case GgmlType::Q4_K:
            return dq_q4_K(static_cast<const block_q4_K*>(src), dst, nb);
        case GgmlType::Q5_K:
            return dq_q5_K(static_cast<const block_q5_K*>(src), dst, nb);
        case GgmlType::Q6_K:
            return dq_q6_K(static_cast<const block_q6_K*>(src), dst, nb);
        case GgmlType::Q8_K:
            return dq_q8_K(static_cast<const block_q8_K*>(src), dst, nb);
    }
}

}  // namespace nt
