// quantize_row and vec_dot_type: float32 -> block bytes with llama.cpp's reference rounding
// (ggml-quants.c quantize_row_*_ref), so files we write and activations we quantize match what
// llama.cpp would produce. gguf-py's gguf.quants.quantize matches the same references.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/f16.h"
#include "quant/kernels.h"
#include "quant/quant.h"

namespace nt {
namespace {

// ggml's nearest_int: round half to even through the float mantissa (|v| < 2^22).
inline int nearest_int(float v) {
    const float t = v + 12582912.f;
    int32_t i;
    std::memcpy(&i, &t, 4);
    return (i & 0x007fffff) - 0x00400000;
}

void q_q4_0(const float* x, block_q4_0* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, x += QK4_0) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < QK4_0; ++j) {
            if (amax < std::fabs(x[j])) {
                amax = std::fabs(x[j]);
                max = x[j];
            }
        }
        const float d = max / -8;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = f32_to_f16(d);
        for (int j = 0; j < QK4_0 / 2; ++j) {
            const int q0 = std::min(15, int(int8_t(x[j] * id + 8.5f)));
            const int q1 = std::min(15, int(int8_t(x[j + 16] * id + 8.5f)));
            y[i].qs[j] = uint8_t(q0 | (q1 << 4));
        }
    }
}

void q_q4_1(const float* x, block_q4_1* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, x += QK4_1) {
        float min = FLT_MAX, max = -FLT_MAX;
        for (int j = 0; j < QK4_1; ++j) {
            if (x[j] < min) min = x[j];
            if (x[j] > max) max = x[j];
        }
        const float d = (max - min) / 15;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = f32_to_f16(d);
        y[i].m = f32_to_f16(min);
        for (int j = 0; j < QK4_1 / 2; ++j) {
            const int q0 = std::min(15, int(int8_t((x[j] - min) * id + 0.5f)));
            const int q1 = std::min(15, int(int8_t((x[j + 16] - min) * id + 0.5f)));
            y[i].qs[j] = uint8_t(q0 | (q1 << 4));
        }
    }
}

void q_q5_0(const float* x, block_q5_0* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, x += QK5_0) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < QK5_0; ++j) {
            if (amax < std::fabs(x[j])) {
                amax = std::fabs(x[j]);
                max = x[j];
            }
        }
        const float d = max / -16;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = f32_to_f16(d);
        uint32_t qh = 0;
        for (int j = 0; j < QK5_0 / 2; ++j) {
            const int q0 = std::min(31, int(int8_t(x[j] * id + 16.5f)));
            const int q1 = std::min(31, int(int8_t(x[j + 16] * id + 16.5f)));
            y[i].qs[j] = uint8_t((q0 & 15) | ((q1 & 15) << 4));
            qh |= uint32_t(q0 >> 4) << j;
            qh |= uint32_t(q1 >> 4) << (j + 16);
        }
        std::memcpy(y[i].qh, &qh, 4);
    }
}

void q_q5_1(const float* x, block_q5_1* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, x += QK5_1) {
        float min = FLT_MAX, max = -FLT_MAX;
        for (int j = 0; j < QK5_1; ++j) {
            if (x[j] < min) min = x[j];
            if (x[j] > max) max = x[j];
        }
        const float d = (max - min) / 31;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = f32_to_f16(d);
        y[i].m = f32_to_f16(min);
        uint32_t qh = 0;
        for (int j = 0; j < QK5_1 / 2; ++j) {
            // ggml's reference does not clamp here: (max - min) * id rounds to at most 31.5.
            const int q0 = uint8_t((x[j] - min) * id + 0.5f);
            const int q1 = uint8_t((x[j + 16] - min) * id + 0.5f);
            y[i].qs[j] = uint8_t((q0 & 15) | ((q1 & 15) << 4));
            qh |= uint32_t((q0 & 0x10) >> 4) << j;
            qh |= uint32_t((q1 & 0x10) >> 4) << (j + 16);
        }
        std::memcpy(y[i].qh, &qh, 4);
    }
}

// An int8 quant from a scaled value already rounded to an integer (|v| <= 127 for every finite
// block). Blocks of subnormal floats overflow 1 / d to infinity; ggml's reference then converts
// inf or NaN to int8, which is undefined, so here NaN gives 0 and infinities clamp to +-127.
inline int8_t q8_clamp(float v) {
    if (!(v == v)) return 0;
    return int8_t(std::min(127.0f, std::max(-127.0f, v)));
}

// Q8_0 and Q8_1 share the scale: d = amax / 127, q = roundf(x / d) (half away from zero), which
// keeps |q| <= 127: the SIMD dot kernels rely on that.
template <typename Block>
float q8_block(const float* x, Block& y) {
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y.d = f32_to_f16(d);
    for (int j = 0; j < 32; ++j) y.qs[j] = q8_clamp(std::round(x[j] * id));
    return d;
}

void q_q8_0(const float* x, block_q8_0* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, x += QK8_0) q8_block(x, y[i]);
}

void q_q8_1(const float* x, block_q8_1* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, x += QK8_1) {
        const float d = q8_block(x, y[i]);
        int sum = 0;
        for (int j = 0; j < QK8_1; ++j) sum += y[i].qs[j];
        y[i].s = f32_to_f16(float(sum) * d);
    }
}

// Q8_K: scale from the signed value of largest magnitude, iscale = -127 / max, rounded half to
// even; bsums are the sums of each 16 quants (the K-quant dot products use them for mins).
void q_q8_K(const float* x, block_q8_K* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, x += QK_K) {
        float max = 0.0f, amax = 0.0f;
        for (int j = 0; j < QK_K; ++j) {
            const float ax = std::fabs(x[j]);
            if (ax > amax) {
                amax = ax;
                max = x[j];
            }
        }
        if (amax == 0.0f) {
            y[i].d = 0.0f;
            std::memset(y[i].qs, 0, sizeof(y[i].qs));
            std::memset(y[i].bsums, 0, sizeof(y[i].bsums));
            continue;
        }
        // Scaled values are clamped to [-127, 127] first (a no-op for finite blocks, where
        // |iscale * x| <= 127 up to rounding; it defines the subnormal blocks whose iscale
        // overflows, see q8_clamp).
        const float iscale = -127.f / max;
        for (int j = 0; j < QK_K; ++j) {
            const float v = iscale * x[j];
            y[i].qs[j] = int8_t(v == v ? nearest_int(std::min(127.0f, std::max(-127.0f, v))) : 0);
        }
        for (int g = 0; g < QK_K / 16; ++g) {
            int sum = 0;
            for (int j = 0; j < 16; ++j) sum += y[i].qs[g * 16 + j];
            y[i].bsums[g] = int16_t(sum);
        }
        y[i].d = 1 / iscale;
    }
}

}  // namespace

GgmlType vec_dot_type(GgmlType t) {
    switch (t) {
        case GgmlType::F32:
        case GgmlType::F16:
        case GgmlType::BF16:
            return GgmlType::F32;
        case GgmlType::Q4_0:
        case GgmlType::Q5_0:
        case GgmlType::Q8_0:
            return GgmlType::Q8_0;
        case GgmlType::Q4_1:
        case GgmlType::Q5_1:
            return GgmlType::Q8_1;
        case GgmlType::Q2_K:
        case GgmlType::Q3_K:
        case GgmlType::Q4_K:
        case GgmlType::Q5_K:
        case GgmlType::Q6_K:
            return GgmlType::Q8_K;
        case GgmlType::Q8_1:
        case GgmlType::Q8_K:
            break;
    }
    fail("tensor type %s has no dot product: it is an activation format, not a weight type.",
         type_name(t));
}

bool can_quantize(GgmlType t) {
    switch (t) {
        case GgmlType::F32:
        case GgmlType::F16:
        case GgmlType::BF16:
        case GgmlType::Q4_0:
        case GgmlType::Q4_1:
        case GgmlType::Q5_0:
        case GgmlType::Q5_1:
        case GgmlType::Q8_0:
        case GgmlType::Q8_1:
        case GgmlType::Q8_K:
            return true;
        default:
            return false;
    }
}

void quantize_row(GgmlType t, const float* src, void* dst, int64_t n) {
    const TypeTraits* tr = type_traits(uint32_t(t));
    if (tr && can_quantize(t) && n % tr->block_elems == 0) {
        if (quant_detail::QuantizeFn f =
                quant_detail::quantize_kernel(quant_detail::active_level(), t)) {
            return f(src, dst, n);
        }
    }
    quant_detail::quantize_row_scalar(t, src, dst, n);
}

void quant_detail::quantize_row_scalar(GgmlType t, const float* src, void* dst, int64_t n) {
    const TypeTraits* tr = type_traits(uint32_t(t));
    if (!tr || !can_quantize(t))
        fail(
            "cannot quantize to tensor type %s: only f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, "
            "q8_0, q8_1 and q8_K are supported.",
            tr ? tr->name : "unknown");
    if (n % tr->block_elems != 0)
        fail("cannot quantize %lld elements to type %s: not a multiple of its block size %d.",
             (long long)n, tr->name, tr->block_elems);
    const int64_t nb = n / tr->block_elems;
    auto* d8 = static_cast<uint8_t*>(dst);
    switch (t) {
        case GgmlType::F32:
            std::memcpy(dst, src, size_t(n) * 4);
            return;
        case GgmlType::F16:
            for (int64_t i = 0; i < n; ++i) {
                const uint16_t h = f32_to_f16(src[i]);
                std::memcpy(d8 + 2 * i, &h, 2);
            }
            return;
        case GgmlType::BF16:
            for (int64_t i = 0; i < n; ++i) {
                const uint16_t h = f32_to_bf16(src[i]);
                std::memcpy(d8 + 2 * i, &h, 2);
            }
            return;
        case GgmlType::Q4_0:
            return q_q4_0(src, static_cast<block_q4_0*>(dst), nb);
        case GgmlType::Q4_1:
            return q_q4_1(src, static_cast<block_q4_1*>(dst), nb);
        case GgmlType::Q5_0:
            return q_q5_0(src, static_cast<block_q5_0*>(dst), nb);
        case GgmlType::Q5_1:
            return q_q5_1(src, static_cast<block_q5_1*>(dst), nb);
        case GgmlType::Q8_0:
            return q_q8_0(src, static_cast<block_q8_0*>(dst), nb);
        case GgmlType::Q8_1:
            return q_q8_1(src, static_cast<block_q8_1*>(dst), nb);
        case GgmlType::Q8_K:
            return q_q8_K(src, static_cast<block_q8_K*>(dst), nb);
        default:
            return;  // rejected above
    }
}

}  // namespace nt
