// IEEE half and bfloat16 conversions, bit-exact with numpy (round to nearest even).
#pragma once
#include <cstdint>
#include <cstring>

namespace nt {

inline float f16_to_f32(uint16_t h) {
    const uint32_t sign = uint32_t(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    uint32_t bits;
    if (exp == 0) {
        if (mant == 0) {
            bits = sign;
        } else {  // subnormal: normalise
            exp = 127 - 15 + 1;
            while ((mant & 0x400) == 0) {
                mant <<= 1;
                exp--;
            }
            mant &= 0x3ff;
            bits = sign | (exp << 23) | (mant << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    }
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

inline uint16_t f32_to_f16(float f) {
    uint32_t x;
    std::memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000;
    const uint32_t absx = x & 0x7fffffff;
    if (absx >= 0x7f800000u) return uint16_t(sign | 0x7c00 | (absx > 0x7f800000u ? 0x200 : 0));
    if (absx >= 0x477ff000u) return uint16_t(sign | 0x7c00);  // overflow rounds to inf
    if (absx < 0x38800000u) {                                  // subnormal or zero in half
        if (absx < 0x33000000u) return uint16_t(sign);
        const uint32_t e = absx >> 23;
        const uint32_t m = (absx & 0x7fffff) | 0x800000;
        const uint32_t shift = 126 - e;  // 14 + (112 - e) ... position of half's LSB
        const uint32_t half_m = m >> shift;
        const uint32_t rem = m & ((1u << shift) - 1);
        const uint32_t halfway = 1u << (shift - 1);
        uint32_t r = half_m + ((rem > halfway || (rem == halfway && (half_m & 1))) ? 1 : 0);
        return uint16_t(sign | r);
    }
    uint32_t r = absx - 0x38000000u;  // rebias exponent
    const uint32_t rem = r & 0x1fff;
    r >>= 13;
    if (rem > 0x1000 || (rem == 0x1000 && (r & 1))) r++;
    return uint16_t(sign | r);
}

inline float bf16_to_f32(uint16_t h) {
    uint32_t bits = uint32_t(h) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

inline uint16_t f32_to_bf16(float f) {
    uint32_t x;
    std::memcpy(&x, &f, 4);
    if ((x & 0x7fffffff) > 0x7f800000u) return uint16_t((x >> 16) | 0x40);  // quiet NaN
    return uint16_t((x + (0x7fff + ((x >> 16) & 1))) >> 16);
}

}  // namespace nt
