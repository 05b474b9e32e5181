// Per-type arithmetic on GGML blocks for the matmul kernels (internal to matmul_*.cu).
//
// For every quantized weight type, Quant<T> says how one lane of a warp takes its share of a
// block (`part`, one of kLanesPerBlock) into registers, takes the matching int8 activations,
// and forms its partial dot product; and how any 8 consecutive elements of a block dequantize
// (the GEMM path's FP16 copy). Every function is __host__ __device__ so a host build can check
// the bit manipulation against nt::dequantize_row without a GPU.
//
// Activations (x) for the integer path: per row, xq = int8 quants, xd = one float2 per 32
// elements: (d, d * sum(q)). A block of 256 weights meets 8 consecutive float2.
//
// dot() returns the lane's share of the block's term in double, the CPU's arithmetic
// (nt::vec_dot): every product of the weight's and the activation's scales and the exact integer
// sums formed in double, the shares added in double by the kernels in their own order, and the
// row's total rounded once to float. In double the order moves the total by about 1e-16 of
// itself, far below the float it rounds to, so the GPU's outputs are the CPU's bits but for
// ties. (Summed in float, the two orders differed in the last bit of about every other output,
// and with 8-bit activations one such bit anywhere moves the whole forward pass: top-1 agreement
// with the CPU stayed near 97%.)
#pragma once
#include <cstdint>
#include <cstring>

#include "core/f16.h"
#include "quant/types.h"

#ifdef __CUDACC__
#include <cuda_fp16.h>
#define NT_HD __host__ __device__ __forceinline__
#else
#define NT_HD inline
#endif

namespace nt::cuda::detail {

#ifndef __CUDACC__
struct float2 {
    float x, y;
};
#endif

// ---- loads that work on shared, global and host memory ----------------------------------

NT_HD float h2f(uint32_t h) {
#ifdef __CUDA_ARCH__
    return __half2float(__ushort_as_half((unsigned short)h));
#else
    return nt::f16_to_f32(uint16_t(h));
#endif
}

// A half (its bits in the low 16 of h) as a double, exactly: one conversion on the GPU, where
// going through float takes two more instructions (the half-to-float and, under fast math, a
// flush).
NT_HD double h2d(uint32_t h) {
#ifdef __CUDA_ARCH__
    double r;
    asm("cvt.f64.f16 %0, %1;" : "=d"(r) : "h"((unsigned short)h));
    return r;
#else
    return double(nt::f16_to_f32(uint16_t(h)));
#endif
}

// v from b = v + 2^31 (mod 2^32), exactly, for |v| < 2^31. On the GPU by one DADD on the FP64
// pipe: b is the low word of the double 2^52 + 2^31 + v, so subtracting 2^52 + 2^31 leaves v. A
// plain int -> double conversion goes through the conversion unit, a quarter of the FP64 pipe's
// rate on sm_80 and sm_90, and the blocks' terms convert an integer sum or two each. Integer sums
// that start at kI2dBias (an mma's accumulator seeded with it) come biased already.
constexpr uint32_t kI2dBias = 0x80000000u;
NT_HD double i2d_biased(uint32_t b) {
#ifdef __CUDA_ARCH__
    return __hiloint2double(0x43300000, int(b)) - 4503601774854144.0;
#else
    return double(int64_t(b) - int64_t(kI2dBias));
#endif
}
// double(v), exactly: i2d_biased of v with its sign bit flipped.
NT_HD double i2d(int v) {
    return i2d_biased(uint32_t(v) ^ kI2dBias);
}

NT_HD uint32_t ld_u16(const uint8_t* p) {  // p 2-byte aligned
#ifdef __CUDA_ARCH__
    return *reinterpret_cast<const uint16_t*>(p);
#else
    uint16_t v;
    std::memcpy(&v, p, 2);
    return v;
#endif
}
NT_HD uint32_t ld_u32(const uint8_t* p) {  // p 4-byte aligned
#ifdef __CUDA_ARCH__
    return *reinterpret_cast<const uint32_t*>(p);
#else
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
#endif
}
NT_HD uint32_t ld_u32_a2(const uint8_t* p) {  // p only 2-byte aligned
    return ld_u16(p) | (ld_u16(p + 2) << 16);
}
// Four consecutive little-endian words from an address that is only 2-byte aligned: four
// aligned word loads, a fifth half-word and funnel shifts rather than eight 16-bit loads (the
// load/store unit is what the unaligned types' blocks, Q8_0's 34 bytes and Q6_K's 210, spend
// most of their instructions on). The fifth load takes only the two bytes still inside the 16
// (none when p is 4-byte aligned): a whole word would read past a matrix's last block.
// p rounded down to 4 bytes by pointer arithmetic, not through an integer: the compiler then
// still knows the memory space (shared memory loads stay LDS with 32-bit addresses, where a
// round trip through uintptr_t made them generic 64-bit loads).
NT_HD const uint8_t* down4(const uint8_t* p) {
    return p - (reinterpret_cast<uintptr_t>(p) & 3);
}
NT_HD void ld_u32x4_a2(const uint8_t* p, uint32_t v[4]) {
#ifdef __CUDA_ARCH__
    const uint32_t* w = reinterpret_cast<const uint32_t*>(down4(p));
    const uint32_t sh = uint32_t(reinterpret_cast<uintptr_t>(p) & 2) * 8;
    const uint32_t w0 = w[0], w1 = w[1], w2 = w[2], w3 = w[3];
    const uint32_t w4 = sh ? ld_u16(reinterpret_cast<const uint8_t*>(w + 4)) : 0u;
    v[0] = __funnelshift_r(w0, w1, sh);
    v[1] = __funnelshift_r(w1, w2, sh);
    v[2] = __funnelshift_r(w2, w3, sh);
    v[3] = __funnelshift_r(w3, w4, sh);
#else
    std::memcpy(v, p, 16);
#endif
}
// The same split in two: the five aligned words (pure loads, so a pipelined kernel can issue
// them long before it needs them) and the funnel shifts that make the four words of them.
struct A2x4 {
    uint32_t w[5];
    uint32_t sh;  // bit offset: 0 or 16
};
NT_HD void ld_a2x4_raw(const uint8_t* p, A2x4& r) {
#ifdef __CUDA_ARCH__
    const uint32_t* w = reinterpret_cast<const uint32_t*>(down4(p));
    r.sh = uint32_t(reinterpret_cast<uintptr_t>(p) & 2) * 8;
    for (int i = 0; i < 4; ++i) r.w[i] = w[i];
    r.w[4] = r.sh ? ld_u16(reinterpret_cast<const uint8_t*>(w + 4)) : 0u;  // as in ld_u32x4_a2
#else
    std::memcpy(r.w, p, 16);
    r.w[4] = 0;
    r.sh = 0;
#endif
}
NT_HD void a2x4_words(const A2x4& r, uint32_t v[4]) {
#ifdef __CUDA_ARCH__
    for (int i = 0; i < 4; ++i) v[i] = __funnelshift_r(r.w[i], r.w[i + 1], r.sh);
#else
    for (int i = 0; i < 4; ++i) v[i] = r.w[i];
#endif
}
// Four consecutive 32-bit words from a 16-byte aligned address.
NT_HD void ld_u32x4(const uint8_t* p, uint32_t v[4]) {
#ifdef __CUDA_ARCH__
    const uint4 t = *reinterpret_cast<const uint4*>(p);
    v[0] = t.x, v[1] = t.y, v[2] = t.z, v[3] = t.w;
#else
    std::memcpy(v, p, 16);
#endif
}
// 16 activation quants (16-byte aligned). kAny: p may point to shared memory (a generic load)
// rather than only global memory. Global activations are read with coherent, L1-cached loads
// (ld.global.ca), never the read-only path (ld.global.nc, __ldg): under a programmatic
// dependent launch (pdl.cuh) the kernel that writes them may still be running when this one
// starts, so they are not read-only for this kernel's lifetime, and the compiler may move
// read-only loads above the wait for it. Pointers come through pdl_wait(p...) for the same
// reason at the compiler's level.
template <bool kAny = false>
NT_HD void ld_x16(const int8_t* p, int v[4]) {
#ifdef __CUDA_ARCH__
    if constexpr (kAny) {
        const int4 t = *reinterpret_cast<const int4*>(p);
        v[0] = t.x, v[1] = t.y, v[2] = t.z, v[3] = t.w;
    } else {
        asm("ld.global.ca.v4.s32 {%0, %1, %2, %3}, [%4];"
            : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3])
            : "l"(p));
    }
#else
    std::memcpy(v, p, 16);
#endif
}
template <bool kAny = false>
NT_HD float2 ld_xd(const float2* p) {
#ifdef __CUDA_ARCH__
    if constexpr (kAny) {
        return *p;
    } else {
        float2 r;
        asm("ld.global.ca.v2.f32 {%0, %1}, [%2];" : "=f"(r.x), "=f"(r.y) : "l"(p));
        return r;
    }
#else
    return *p;
#endif
}

// Byte i (0..7) of two little-endian words.
NT_HD int byte_of(const uint32_t (&v)[2], int i) {
    return int((v[i >> 2] >> (8 * (i & 3))) & 0xFF);
}
NT_HD void ld_8_a2(const uint8_t* p, uint32_t (&v)[2]) {
    v[0] = ld_u32_a2(p), v[1] = ld_u32_a2(p + 4);
}
NT_HD void ld_8_a4(const uint8_t* p, uint32_t (&v)[2]) {
    v[0] = ld_u32(p), v[1] = ld_u32(p + 4);
}

// Four int8 products summed into c.
NT_HD int dp4a(uint32_t a, int b, int c) {
#ifdef __CUDA_ARCH__
    return __dp4a(int(a), b, c);
#else
    for (int i = 0; i < 4; ++i)
        c += int(int8_t(uint8_t(a >> (8 * i)))) * int(int8_t(uint8_t(uint32_t(b) >> (8 * i))));
    return c;
#endif
}

// c + the dot product of a's four unsigned bytes with b's four signed ones.
NT_HD int dp4a_us(uint32_t a, int b, int c) {
#ifdef __CUDA_ARCH__
    int r;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
#else
    for (int i = 0; i < 4; ++i)
        c += int(uint8_t(a >> (8 * i))) * int(int8_t(uint8_t(uint32_t(b) >> (8 * i))));
    return c;
#endif
}

// c + a's low 16-bit half (signed) times b's byte 2 (signed) + a's high half times b's byte 3,
// modulo 2^32.
NT_HD uint32_t dp2a_hi(uint32_t a, uint32_t b, uint32_t c) {
#ifdef __CUDA_ARCH__
    uint32_t r;
    asm("dp2a.hi.s32.s32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
#else
    return c + uint32_t(int(int16_t(a & 0xFFFF)) * int(int8_t(b >> 16))) +
           uint32_t(int(int16_t(a >> 16)) * int(int8_t(b >> 24)));
#endif
}

// Byte-wise a - b for bytes whose true difference lies in [-128, 127] and a < 128: setting the
// top bit of each byte of a stops borrows crossing bytes; the xor puts the sign right.
NT_HD uint32_t sub_bytes(uint32_t a, uint32_t b) {
    return ((a | 0x80808080u) - b) ^ 0x80808080u;
}

// Bits 0..3 of b moved to bit 4 of bytes 0..3 (the fifth bit of Q5_0/Q5_1 quants).
NT_HD uint32_t spread4_to_bit4(uint32_t b) {
    return ((b & 1u) << 4) | ((b & 2u) << 11) | ((b & 4u) << 18) | ((b & 8u) << 25);
}

// Four Q6_K quants q (0..63, a byte each): the nibble t >> 1 of each byte of a word of ql with
// bits 2t of the matching word of qh above it, for the quants' index t = 0..3 within their group.
NT_HD uint32_t q6k_quants4_u(uint32_t ql, uint32_t qh, int t) {
    const uint32_t lo = (ql >> (4 * (t >> 1))) & 0x0F0F0F0Fu;
    const uint32_t hi = (t == 0 ? qh << 4 : t == 1 ? qh << 2 : t == 2 ? qh : qh >> 2) & 0x30303030u;
    return lo | hi;
}
// The same as int8 (q - 32).
NT_HD uint32_t q6k_quants4(uint32_t ql, uint32_t qh, int t) {
    return sub_bytes(q6k_quants4_u(ql, qh, t), 0x20202020u);
}

// Q6_K on int8 tensor cores (sm90a/matmul_mmq_wgmma.cu): a scale sc (int8) times a quant
// q' = q - 32 (in [-32, 31]) needs 13 bits, so sc is split into three balanced base-8 digits,
// sc = 64 c2 + 8 c1 + c0 with every c in [-3, 4], and every c q' is an int8 (in [-128, 124]).
// The digits of four scales (the bytes of s), plus 3, as bytes e_m = c_m + 3 in [0, 7]:
// e0 = (sc + 3) mod 8; with h = floor((sc + 3) / 8) + 16 in [0, 32] (sc = 8 (h - 16) + c0),
// e1 = (h + 3) mod 8 and e2 = floor((h + 3) / 8) + 1 (h - 16 = 8 c2 + c1). No byte carries
// into the next: floor(sc / 8) + 16 is the byte's top five bits with the fifth flipped.
NT_HD void q6k_scale_digits(uint32_t s, uint32_t (&e)[3]) {
    const uint32_t lo = (s & 0x07070707u) + 0x03030303u;  // (sc mod 8) + 3, in [3, 10]
    e[0] = lo & 0x07070707u;
    const uint32_t h3 =
        (((s >> 3) & 0x1F1F1F1Fu) ^ 0x10101010u) + ((lo >> 3) & 0x01010101u) + 0x03030303u;
    e[1] = h3 & 0x07070707u;
    e[2] = ((h3 >> 3) & 0x07070707u) + 0x01010101u;
}
// Four quants (the bytes of u, in [0, 63]) times a digit c = e - 3, as int8 bytes c (q - 32):
// with w = u - 0x20202020 (sum (q_b - 32) 256^b as one integer) and z = 0x80808080 - 3 w,
// e w + z = c w + 0x80808080 has every byte c (q_b - 32) + 128 in [0, 252] (no carries), and
// the xor turns those into two's complement. One IMAD and one LOP3 a digit (w and z are shared).
NT_HD uint32_t q6k_digit_times(uint32_t e, uint32_t u) {
    const uint32_t w = u - 0x20202020u, z = 0x80808080u - 3u * w;
    return (e * w + z) ^ 0x80808080u;
}

// K-quant 6-bit scale and min j (0..7) from the 12 packed bytes (ggml's get_scale_min_k4).
NT_HD void scale_min_k4(int j, const uint8_t* s, int& sc, int& m) {
    if (j < 4) {
        sc = s[j] & 63;
        m = s[j + 4] & 63;
    } else {
        sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

// The same from the packed bytes held as three little-endian words (bytes 0-3, 4-7, 8-11),
// without indexing an array by a run-time value (which would put it in local memory).
NT_HD void scale_min_k4_words(int j, uint32_t v0, uint32_t v1, uint32_t v2, int& sc, int& m) {
    // Both forms, then a select: j depends on the lane in the GEMV kernels, and a branch on it
    // diverges inside every warp.
    const int k = (j & 3) * 8;
    const int b0 = (v0 >> k) & 0xFF, b1 = (v1 >> k) & 0xFF, b2 = (v2 >> k) & 0xFF;
    const int sc_lo = b0 & 63, m_lo = b1 & 63;
    const int sc_hi = (b2 & 0xF) | ((b0 >> 2) & 0x30), m_hi = (b2 >> 4) | ((b1 >> 2) & 0x30);
    sc = j < 4 ? sc_lo : sc_hi;
    m = j < 4 ? m_lo : m_hi;
}

// __byte_perm on the host too: byte i of the result is byte (s >> 4i) & 7 of the eight bytes
// of b:a (a's the first four).
NT_HD uint32_t byte_perm(uint32_t a, uint32_t b, uint32_t s) {
#ifdef __CUDA_ARCH__
    return __byte_perm(a, b, s);
#else
    const uint64_t v = uint64_t(b) << 32 | a;
    uint32_t r = 0;
    for (int i = 0; i < 4; ++i) r |= uint32_t((v >> (8 * ((s >> (4 * i)) & 7))) & 0xFF) << (8 * i);
    return r;
#endif
}

// scale_min_k4_words of sub-blocks 2c and 2c + 1 at once, packed sc1 | sc2 << 8 | m1 << 16 |
// m2 << 24 (as Quant<Q4_K>::W::sm): two byte permutes and a few masks, no branch on c (a lane's
// part in the GEMV kernels, which differs inside a warp). With i = 2c mod 4, P holds bytes i,
// i + 1 of v0 and v1; for c < 2 those are the values' low 6 bits, for c >= 2 their top 2 bits
// (P's bits 6-7), whose low 4 bits are the nibbles of v2's bytes i, i + 1 (low for the scales,
// high for the mins).
NT_HD uint32_t scale_min_k4_packed(int c, uint32_t v0, uint32_t v1, uint32_t v2) {
    const uint32_t i = uint32_t(2 * c) & 3;
    const uint32_t p = byte_perm(v0, v1, i | (i + 1) << 4 | (i + 4) << 8 | (i + 5) << 12);
    const uint32_t l = byte_perm(v2, v2, i | (i + 1) << 4 | i << 8 | (i + 1) << 12);
    const uint32_t lo = p & 0x3F3F3F3Fu;
    const uint32_t hi = ((p >> 2) & 0x30303030u) | (l & 0x00000F0Fu) | ((l >> 4) & 0x0F0F0000u);
    return c < 2 ? lo : hi;
}

// Q3_K 6-bit signed scale s (0..15), minus 32, from the 12 packed bytes as three words.
NT_HD int scale_q3k_words(int s, uint32_t v0, uint32_t v1, uint32_t v2) {
    const int i = s & 3, g = s >> 2;
    const int lo = (((g & 1) ? v1 : v0) >> (8 * i + 4 * (g >> 1))) & 0xF;
    const int hi = (v2 >> (8 * i + 2 * g)) & 3;
    return (lo | (hi << 4)) - 32;
}
NT_HD int scale_q3k(int s, const uint8_t* sc) {
    const int i = s & 3, g = s >> 2;
    const int lo = (sc[(g & 1) * 4 + i] >> (4 * (g >> 1))) & 0xF;
    const int hi = (sc[8 + i] >> (2 * g)) & 3;
    return (lo | (hi << 4)) - 32;
}

template <GgmlType T>
struct Quant;

// Every type defines:
//   kBlockElems, kBlockBytes, kLanesPerBlock, kUnits (blocks a lane visits per staged chunk),
//   struct W (a lane's weights), struct X (its activations for one x row),
//   load_w(block, part, W&), load_x(xq at block start, xd at block start, part, X&),
//   dot(W, X) -> double, dequant8(block, group, float[8]) for elements 8*group .. 8*group+7.

// ---- 32-element types: one lane per block (Q8_0: two) ------------------------------------

template <>
struct Quant<GgmlType::Q4_0> {
    static constexpr int kBlockElems = 32, kBlockBytes = 18, kLanesPerBlock = 1, kUnits = 2;
    struct W {
        uint32_t q[4];
        float d;
    };
    struct X {
        int lo[4], hi[4];
        float2 d;
    };
    NT_HD static void load_w(const uint8_t* b, int, W& w) {
        w.d = h2f(ld_u16(b));
        ld_u32x4_a2(b + 2, w.q);
    }
    template <bool kAny = false>
    NT_HD static void load_x(const int8_t* xq, const float2* xd, int, X& x) {
        ld_x16<kAny>(xq, x.lo);
        ld_x16<kAny>(xq + 16, x.hi);
        x.d = ld_xd<kAny>(xd);
    }
    // sum (q - 8) x = sum q x - 8 sum x: x.d.y = d * sum x is exact in float (an f16 times at
    // most 32 * 127), so the offset's term is exact in double too.
    NT_HD static double dot(const W& w, const X& x) {
        int s = 0;
        for (int i = 0; i < 4; ++i) {
            s = dp4a(w.q[i] & 0x0F0F0F0Fu, x.lo[i], s);
            s = dp4a((w.q[i] >> 4) & 0x0F0F0F0Fu, x.hi[i], s);
        }
        return double(w.d) * (double(x.d.x) * i2d(s) - 8.0 * double(x.d.y));
    }
    NT_HD static void dequant8(const uint8_t* b, int g, float* out) {
        const float d = h2f(ld_u16(b));
        const int sh = (g >> 1) * 4;
        uint32_t q[2];
        ld_8_a2(b + 2 + (g & 1) * 8, q);
        for (int l = 0; l < 8; ++l) out[l] = d * float(((byte_of(q, l) >> sh) & 15) - 8);
    }
};

template <>
struct Quant<GgmlType::Q4_1> {
    static constexpr int kBlockElems = 32, kBlockBytes = 20, kLanesPerBlock = 1, kUnits = 2;
    struct W {
        uint32_t q[4];
        float d, m;
    };
    using X = Quant<GgmlType::Q4_0>::X;
    NT_HD static void load_w(const uint8_t* b, int, W& w) {
        w.d = h2f(ld_u16(b));
        w.m = h2f(ld_u16(b + 2));
        for (int i = 0; i < 4; ++i) w.q[i] = ld_u32(b + 4 + 4 * i);
    }
    template <bool kAny = false>
    NT_HD static void load_x(const int8_t* xq, const float2* xd, int part, X& x) {
        Quant<GgmlType::Q4_0>::load_x<kAny>(xq, xd, part, x);
    }
    // The min meets Q8_1's s field (x.d.y), as on the CPU.
    NT_HD static double dot(const W& w, const X& x) {
        int s = 0;
        for (int i = 0; i < 4; ++i) {
            s = dp4a(w.q[i] & 0x0F0F0F0Fu, x.lo[i], s);
            s = dp4a((w.q[i] >> 4) & 0x0F0F0F0Fu, x.hi[i], s);
        }
        return i2d(s) * (double(w.d) * double(x.d.x)) + double(w.m) * double(x.d.y);
    }
    NT_HD static void dequant8(const uint8_t* b, int g, float* out) {
        const float d = h2f(ld_u16(b)), m = h2f(ld_u16(b + 2));
        const int sh = (g >> 1) * 4;
        uint32_t q[2];
        ld_8_a4(b + 4 + (g & 1) * 8, q);
        for (int l = 0; l < 8; ++l) out[l] = d * float((byte_of(q, l) >> sh) & 15) + m;
    }
};

template <>
struct Quant<GgmlType::Q5_0> {
    static constexpr int kBlockElems = 32, kBlockBytes = 22, kLanesPerBlock = 1, kUnits = 2;
    struct W {
        uint32_t lo[4], hi[4];
        float d;
    };  // 5-bit quants, unsigned
    using X = Quant<GgmlType::Q4_0>::X;
    NT_HD static void load_w(const uint8_t* b, int, W& w) {
        w.d = h2f(ld_u16(b));
        const uint32_t qh = ld_u32_a2(b + 2);
        uint32_t qs[4];
        ld_u32x4_a2(b + 6, qs);
        for (int i = 0; i < 4; ++i) {
            const uint32_t q = qs[i];
            w.lo[i] = (q & 0x0F0F0F0Fu) | spread4_to_bit4((qh >> (4 * i)) & 0xF);
            w.hi[i] = ((q >> 4) & 0x0F0F0F0Fu) | spread4_to_bit4((qh >> (16 + 4 * i)) & 0xF);
        }
    }
    template <bool kAny = false>
    NT_HD static void load_x(const int8_t* xq, const float2* xd, int part, X& x) {
        Quant<GgmlType::Q4_0>::load_x<kAny>(xq, xd, part, x);
    }
    NT_HD static double dot(const W& w, const X& x) {  // the offset as Q4_0's
        int s = 0;
        for (int i = 0; i < 4; ++i) {
            s = dp4a(w.lo[i], x.lo[i], s);
            s = dp4a(w.hi[i], x.hi[i], s);
        }
        return double(w.d) * (double(x.d.x) * i2d(s) - 16.0 * double(x.d.y));
    }
    NT_HD static void dequant8(const uint8_t* b, int g, float* out) {
        const float d = h2f(ld_u16(b));
        const uint32_t qh = ld_u32_a2(b + 2);
        const int sh = (g >> 1) * 4;
        uint32_t qs[2];
        ld_8_a2(b + 6 + (g & 1) * 8, qs);
        for (int l = 0; l < 8; ++l) {
            const int e = g * 8 + l;
            const int q = ((byte_of(qs, l) >> sh) & 15) | int(((qh >> e) & 1) << 4);
            out[l] = d * float(q - 16);
        }
    }
};

template <>
struct Quant<GgmlType::Q5_1> {
    static constexpr int kBlockElems = 32, kBlockBytes = 24, kLanesPerBlock = 1, kUnits = 2;
    struct W {
        uint32_t lo[4], hi[4];
        float d, m;
    };
    using X = Quant<GgmlType::Q4_0>::X;
    NT_HD static void load_w(const uint8_t* b, int, W& w) {
        w.d = h2f(ld_u16(b));
        w.m = h2f(ld_u16(b + 2));
        const uint32_t qh = ld_u32(b + 4);
        for (int i = 0; i < 4; ++i) {
            const uint32_t q = ld_u32(b + 8 + 4 * i);
            w.lo[i] = (q & 0x0F0F0F0Fu) | spread4_to_bit4((qh >> (4 * i)) & 0xF);
            w.hi[i] = ((q >> 4) & 0x0F0F0F0Fu) | spread4_to_bit4((qh >> (16 + 4 * i)) & 0xF);
        }
    }
    template <bool kAny = false>
    NT_HD static void load_x(const int8_t* xq, const float2* xd, int part, X& x) {
        Quant<GgmlType::Q4_0>::load_x<kAny>(xq, xd, part, x);
    }
    NT_HD static double dot(const W& w, const X& x) {
        int s = 0;
        for (int i = 0; i < 4; ++i) {
            s = dp4a(w.lo[i], x.lo[i], s);
            s = dp4a(w.hi[i], x.hi[i], s);
        }
        return i2d(s) * (double(w.d) * double(x.d.x)) + double(w.m) * double(x.d.y);
    }
    NT_HD static void dequant8(const uint8_t* b, int g, float* out) {
        const float d = h2f(ld_u16(b)), m = h2f(ld_u16(b + 2));
        const uint32_t qh = ld_u32(b + 4);
        const int sh = (g >> 1) * 4;
        uint32_t qs[2];
        ld_8_a4(b + 8 + (g & 1) * 8, qs);
        for (int l = 0; l < 8; ++l) {
            const int e = g * 8 + l;
            const int q = ((byte_of(qs, l) >> sh) & 15) | int(((qh >> e) & 1) << 4);
            out[l] = d * float(q) + m;
        }
    }
};

// Q8_0: two lanes per block, 16 quants each.
template <>
struct Quant<GgmlType::Q8_0> {
    static constexpr int kBlockElems = 32, kBlockBytes = 34, kLanesPerBlock = 2, kUnits = 2;
    struct W {
        uint32_t q[4];
        float d;
    };
    struct X {
        int q[4];
        float d;
    };
    // Raw: the lane's bytes as loaded (load_raw issues only loads; decode does the rest).
    struct Raw {
        A2x4 q;
        uint32_t d;
    };
    NT_HD static void load_raw(const uint8_t* b, int part, Raw& r) {
        r.d = ld_u16(b);
        ld_a2x4_raw(b + 2 + 16 * part, r.q);
    }
    NT_HD static void decode(const Raw& r, int /*part*/, W& w) {
        w.d = h2f(r.d);
        a2x4_words(r.q, w.q);
    }
    NT_HD static void load_w(const uint8_t* b, int part, W& w) {
        Raw r;
        load_raw(b, part, r);
        decode(r, part, w);
    }
    template <bool kAny = false>
    NT_HD static void load_x(const int8_t* xq, const float2* xd, int part, X& x) {
        ld_x16<kAny>(xq + 16 * part, x.q);
        x.d = ld_xd<kAny>(xd).x;
    }
    NT_HD static double dot(const W& w, const X& x) {
        int s = 0;
        for (int i = 0; i < 4; ++i) s = dp4a(w.q[i], x.q[i], s);
        return i2d(s) * (double(w.d) * double(x.d));
    }
    NT_HD static void dequant8(const uint8_t* b, int g, float* out) {
        const float d = h2f(ld_u16(b));
        uint32_t q[2];
        ld_8_a2(b + 2 + g * 8, q);
        for (int l = 0; l < 8; ++l) out[l] = float(int8_t(uint8_t(byte_of(q, l)))) * d;
    }
};

// ---- K-quants: 256 elements, four lanes per block ------------------------------------------

// Q2_K: scales[16] @0, qs[64] @16, d @80, dmin @82. Element 128n + 32j + 16s + l is bits 2j
// of qs[32n + 16s + l], with scale byte 8n + 2j + s (low nibble scale, high nibble min).
// Lane part p = 2n + s takes those 16 qs bytes for all four j: 64 elements, four half x-blocks.
template <>
struct Quant<GgmlType::Q2_K> {
    static constexpr int kBlockElems = 256, kBlockBytes = 84, kLanesPerBlock = 4, kUnits = 2;
    struct W {
        uint32_t q[4];
        uint32_t sc;
        float d, dmin;
    };  // sc: the 4 scale bytes, j = 0..3
    // q[j]: 16 quants of x block j; s[j]: their sum (for the mins, and for Q6_K's offset of
    // 32), formed once per load so that register-held activations pay for it once per kernel;
    // d: Q8_K's one scale for the whole block.
    struct X {
        int q[4][4];
        int s[4];
        float d;
    };
    NT_HD static void load_w(const uint8_t* b, int part, W& w) {
        const int n = part >> 1, s = part & 1;
        for (int i = 0; i < 4; ++i) w.q[i] = ld_u32(b + 16 + 32 * n + 16 * s + 4 * i);
        const uint32_t s0 = ld_u32(b + 8 * n), s1 = ld_u32(b + 8 * n + 4);
        // bytes s, s+2 of s0 then of s1
        const uint32_t a = s ? (s0 >> 8) : s0, c = s ? (s1 >> 8) : s1;
        w.sc = (a & 0xFFu) | ((a >> 8) & 0xFF00u) | ((c & 0xFFu) << 16) | ((c & 0xFF0000u) << 8);
        w.d = h2f(ld_u16(b + 80));
        w.dmin = h2f(ld_u16(b + 82));
    }
    template <bool kAny = false>
    NT_HD static void load_x(const int8_t* xq, const float2* xd, int part, X& x) {
        const int n = part >> 1, s = part & 1;
        x.d = ld_xd<kAny>(xd + 4 * n).x;
        for (int j = 0; j < 4; ++j) {
            ld_x16<kAny>(xq + 128 * n + 32 * j + 16 * s, x.q[j]);
            x.s[j] = 0;
            for (int i = 0; i < 4; ++i) x.s[j] = dp4a(0x01010101u, x.q[j][i], x.s[j]);
        }
    }
    // The scales and mins as integers (the CPU's isum and msum, in part), then d * dx and
    // dmin * dx in double. (Integers first keep the double temporaries, and registers, few.)
    NT_HD static double dot(const W& w, const X& x) {
        int isum = 0, msum = 0;
        for (int j = 0; j < 4; ++j) {
            int sq = 0;
            for (int i = 0; i < 4; ++i) sq = dp4a((w.q[i] >> (2 * j)) & 0x03030303u, x.q[j][i], sq);
            const int sc = (w.sc >> (8 * j)) & 0xFF;
            isum += sq * (sc & 0xF);
            msum += x.s[j] * (sc >> 4);
        }
        const double dx = double(x.d);
        return i2d(isum) * (double(w.d) * dx) - i2d(msum) * (double(w.dmin) * dx);
    }
    NT_HD static void dequant8(const uint8_t* b, int g, float* out) {
        const int e0 = g * 8, n = e0 >> 7, j = (e0 >> 5) & 3, s = (e0 >> 4) & 1, l0 = e0 & 15;
        const int sc = b[8 * n + 2 * j + s];
        const float dl = h2f(ld_u16(b + 80)) * float(sc & 0xF);
        const float ml = h2f(ld_u16(b + 82)) * float(sc >> 4);
        uint32_t q[2];
        ld_8_a4(b + 16 + 32 * n + 16 * s + l0, q);
        for (int l = 0; l < 8; ++l) out[l] = dl * float((byte_of(q, l) >> (2 * j)) & 3) - ml;
    }
};

// Q3_K: hmask[32] @0, qs[64] @32, scales[12] @96, d @108 (blocks only 2-byte aligned).
// Element 128n + 32j + 16s + l: low bits as Q2_K, third bit = bit 4n + j of hmask[16s + l]
// (clear means -4), signed 6-bit scale 8n + 2j + s. Lane part p = 2n + s.
template <>
struct Quant<GgmlType::Q3_K> {
    static constexpr int kBlockElems = 256, kBlockBytes = 110, kLanesPerBlock = 4, kUnits = 2;
    struct W {
        uint32_t q[4], h[4];
        int sc[4];
        float d;
    };
    using X = Quant<GgmlType::Q2_K>::X;
    NT_HD static void load_w(const uint8_t* b, int part, W& w) {
        const int n = part >> 1, s = part & 1;
        ld_u32x4_a2(b + 32 + 32 * n + 16 * s, w.q);
        ld_u32x4_a2(b + 16 * s, w.h);
        for (int i = 0; i < 4; ++i) w.h[i] >>= 4 * n;
        const uint32_t v0 = ld_u32_a2(b + 96), v1 = ld_u32_a2(b + 100), v2 = ld_u32_a2(b + 104);
        for (int j = 0; j < 4; ++j) w.sc[j] = scale_q3k_words(8 * n + 2 * j + s, v0, v1, v2);
        w.d = h2f(ld_u16(b + 108));
    }
    template <bool kAny = false>
    NT_HD static void load_x(const int8_t* xq, const float2* xd, int part, X& x) {
        Quant<GgmlType::Q2_K>::load_x<kAny>(xq, xd, part, x);
    }
    NT_HD static double dot(const W& w, const X& x) {
        int isum = 0;
        for (int j = 0; j < 4; ++j) {
            int sq = 0;
            for (int i = 0; i < 4; ++i) {
                const uint32_t lo = (w.q[i] >> (2 * j)) & 0x03030303u;
                const uint32_t neg = ((~w.h[i] >> j) & 0x01010101u) << 2;
                sq = dp4a(sub_bytes(lo, neg), x.q[j][i], sq);
            }
            isum += sq * w.sc[j];
        }
        return i2d(isum) * (double(w.d) * double(x.d));
    }
    NT_HD static void dequant8(const uint8_t* b, int g, float* out) {
        const int e0 = g * 8, n = e0 >> 7, j = (e0 >> 5) & 3, s = (e0 >> 4) & 1, l0 = e0 & 15;
        const float dl = h2f(ld_u16(b + 108)) * float(scale_q3k(8 * n + 2 * j + s, b + 96));
        uint32_t q[2], h[2];
        ld_8_a2(b + 32 + 32 * n + 16 * s + l0, q);
        ld_8_a2(b + 16 * s + l0, h);
        for (int l = 0; l < 8; ++l) {
            const int lo = (byte_of(q, l) >> (2 * j)) & 3;
            const int hi = (byte_of(h, l) >> (4 * n + j)) & 1;
            out[l] = dl * float(lo - (hi ? 0 : 4));
        }
    }
};

// Q4_K: d @0, dmin @2, scales[12] @4, qs[128] @16 (144 bytes: blocks 16-byte aligned).
// Elements 64c + l (l < 32) are the low nibbles of qs[32c + l] (sub-block 2c), elements
// 64c + 32 + l the high nibbles (sub-block 2c + 1). Lane part c takes those 32 bytes.
// A lane's share of a Q4_K or Q5_K block's term: its two sub-blocks' integer sums sa, sb
// times their 6-bit scales and the quants' sums times their 6-bit mins, as integers (the CPU's
// isum and msum, in part), then d * dx and dmin * dx in double (x.da.x is Q8_K's one dx for the
// block). Integers first keep the double temporaries few: the TMA kernel's CTAs a
// multiprocessor holds are counted in registers.
template <class W, class X>
NT_HD double k_quant_share(const W& w, const X& x, int sa, int sb) {
    // sm's bytes are 6-bit values (scale_min_k4_packed): whole bytes taken, which the compiler
    // can extract in one instruction each.
    // Both sums formed biased (i2d_biased), in unsigned arithmetic, where they wrap by design.
    const uint32_t isum =
        kI2dBias + uint32_t(sa) * (w.sm & 0xFF) + uint32_t(sb) * ((w.sm >> 8) & 0xFF);
    const uint32_t msum = dp2a_hi(x.s16, w.sm, kI2dBias);  // x.sa * m1 + x.sb * m2
    const double dx = double(x.da.x);
    return i2d_biased(isum) * (h2d(w.dm & 0xFFFF) * dx) -
           i2d_biased(msum) * (h2d(w.dm >> 16) * dx);
}

template <>
struct Quant<GgmlType::Q4_K> {
    static constexpr int kBlockElems = 256, kBlockBytes = 144, kLanesPerBlock = 4, kUnits = 1;
    // sm: the lane's two sub-blocks' 6-bit scales and mins, bytes sc1, sc2, m1, m2.
    // dm: d and dmin as the block stores them (two halves), converted where they are used.
    struct W {
        uint32_t q[8];
        uint32_t dm;
        uint32_t sm;
    };
    // sa, sb: the sums of the two 32-element halves' quants (for the mins), formed once per
    // load so that register-held activations pay for them once per kernel.
    struct X {
        int a[8], b[8];
        float2 da, db;
        uint32_t s16;  // the sums as two 16-bit halves (|sum| <= 32 * 128), for dp2a_hi
    };
    struct Raw {
        uint32_t h[4], q[8];
    };
    NT_HD static void load_raw(const uint8_t* b, int part, Raw& r) {
        ld_u32x4(b, r.h);
        ld_u32x4(b + 16 + 32 * part, r.q);
        ld_u32x4(b + 32 + 32 * part, r.q + 4);
    }
    NT_HD static void decode(const Raw& r, int part, W& w) {
        scales_from_header(r.h, part, w);
        for (int i = 0; i < 8; ++i) w.q[i] = r.q[i];
    }
    template <class WT>
    NT_HD static void load_scales(const uint8_t* b, int c, WT& w) {
        uint32_t hdr[4];
        ld_u32x4(b, hdr);
        scales_from_header(hdr, c, w);
    }
    template <class WT>
    NT_HD static void scales_from_header(const uint32_t (&hdr)[4], int c, WT& w) {
        w.dm = hdr[0];
        w.sm = scale_min_k4_packed(c, hdr[1], hdr[2], hdr[3]);
    }
    NT_HD static void load_w(const uint8_t* b, int part, W& w) {
        Raw r;
        load_raw(b, part, r);
        decode(r, part, w);
    }
    template <bool kAny = false>
    NT_HD static void load_x(const int8_t* xq, const float2* xd, int part, X& x) {
        ld_x16<kAny>(xq + 64 * part, x.a);
        ld_x16<kAny>(xq + 64 * part + 16, x.a + 4);
        ld_x16<kAny>(xq + 64 * part + 32, x.b);
        ld_x16<kAny>(xq + 64 * part + 48, x.b + 4);
        x.da = ld_xd<kAny>(xd + 2 * part);
        x.db = ld_xd<kAny>(xd + 2 * part + 1);
        int sa = 0, sb = 0;
        for (int i = 0; i < 8; ++i) {
            sa = dp4a(0x01010101u, x.a[i], sa);
            sb = dp4a(0x01010101u, x.b[i], sb);
        }
        x.s16 = (uint32_t(sa) & 0xFFFFu) | uint32_t(sb) << 16;
    }
    // The mins meet the exact sums of the activation quants (x.s16). The high nibbles
    // are dotted in place (16 q, unsigned bytes) and the sum divided by 16 after, exactly: a
    // shift fewer a word.
    NT_HD static double dot(const W& w, const X& x) {
        int sa = 0, sb16 = 0;
        for (int i = 0; i < 8; ++i) {
            sa = dp4a(w.q[i] & 0x0F0F0F0Fu, x.a[i], sa);
            sb16 = dp4a_us(w.q[i] & 0xF0F0F0F0u, x.b[i], sb16);
        }
        return k_quant_share(w, x, sa, sb16 >> 4);
    }
    NT_HD static void dequant8(const uint8_t* b, int g, float* out) {
        const int e0 = g * 8, sub = e0 >> 5, c = sub >> 1, l0 = e0 & 31;
        int sc, m;
        scale_min_k4(sub, b + 4, sc, m);
        const float d1 = h2f(ld_u16(b)) * float(sc), m1 = h2f(ld_u16(b + 2)) * float(m);
        const int sh = (sub & 1) * 4;
        uint32_t q[2];
        ld_8_a4(b + 16 + 32 * c + l0, q);
        for (int l = 0; l < 8; ++l) out[l] = d1 * float((byte_of(q, l) >> sh) & 15) - m1;
    }
};

// Q5_K: d, dmin, scales as Q4_K; qh[32] @16, qs[128] @48 (176 bytes, 16-byte aligned).
// Element 64c + 32h + l takes nibble h of qs[32c + l] and bit 2c + h of qh[l] as its fifth bit.
template <>
struct Quant<GgmlType::Q5_K> {
    static constexpr int kBlockElems = 256, kBlockBytes = 176, kLanesPerBlock = 4, kUnits = 1;
    struct W {  // scales as Q4_K's
        uint32_t a[8], b[8];
        uint32_t dm;
        uint32_t sm;
    };
    using X = Quant<GgmlType::Q4_K>::X;
    NT_HD static void load_w(const uint8_t* b, int part, W& w) {
        Quant<GgmlType::Q4_K>::load_scales(b, part, w);
        uint32_t q[8], h[8];
        ld_u32x4(b + 48 + 32 * part, q);
        ld_u32x4(b + 64 + 32 * part, q + 4);
        ld_u32x4(b + 16, h);
        ld_u32x4(b + 32, h + 4);
        for (int i = 0; i < 8; ++i) {
            const uint32_t hh = h[i] >> (2 * part);
            w.a[i] = (q[i] & 0x0F0F0F0Fu) | ((hh & 0x01010101u) << 4);
            w.b[i] = ((q[i] >> 4) & 0x0F0F0F0Fu) | ((hh & 0x02020202u) << 3);
        }
    }
    template <bool kAny = false>
    NT_HD static void load_x(const int8_t* xq, const float2* xd, int part, X& x) {
        Quant<GgmlType::Q4_K>::load_x<kAny>(xq, xd, part, x);
    }
    NT_HD static double dot(const W& w, const X& x) {
        int sa = 0, sb = 0;
        for (int i = 0; i < 8; ++i) {
            sa = dp4a(w.a[i], x.a[i], sa);
            sb = dp4a(w.b[i], x.b[i], sb);
        }
        return k_quant_share(w, x, sa, sb);
    }
    NT_HD static void dequant8(const uint8_t* b, int g, float* out) {
        const int e0 = g * 8, sub = e0 >> 5, c = sub >> 1, l0 = e0 & 31;
        int sc, m;
        scale_min_k4(sub, b + 4, sc, m);
        const float d1 = h2f(ld_u16(b)) * float(sc), m1 = h2f(ld_u16(b + 2)) * float(m);
        const int sh = (sub & 1) * 4;
        uint32_t ql[2], qh[2];
        ld_8_a4(b + 48 + 32 * c + l0, ql);
        ld_8_a4(b + 16 + l0, qh);
        for (int l = 0; l < 8; ++l) {
            const int q = ((byte_of(ql, l) >> sh) & 15) | (((byte_of(qh, l) >> sub) & 1) << 4);
            out[l] = d1 * float(q) - m1;
        }
    }
};

// Q6_K: ql[128] @0, qh[64] @128, scales[16] (int8) @192, d @208 (210 bytes, 2-byte aligned).
// Element 128n + 32t + l (l < 32): nibble t>>1 of ql[64n + 32(t&1) + l], bits 2t of
// qh[32n + l] as bits 4..5, minus 32; scale 8n + 2t + l/16. Lane part p = 2n + h takes
// l in [16h, 16h + 16) for all four t: 64 elements, four half x-blocks.
template <>
struct Quant<GgmlType::Q6_K> {
    static constexpr int kBlockElems = 256, kBlockBytes = 210, kLanesPerBlock = 4, kUnits = 1;
    struct W {
        uint32_t la[4], lb[4], h[4];
        int sc[4];
        uint32_t d;  // as the block stores it (a half), converted where it is used
    };
    // Q2_K's activations, with each sum s[j] held as -32 s[j] (o): the quants' offset of 32,
    // where each dp4a chain starts.
    struct X {
        int q[4][4];
        int o[4];
        float d;
    };
    // Raw: the lane's bytes as loaded. Every span the lane reads starts at an even offset
    // with the same value mod 4, so one shift serves them all.
    struct Raw {
        A2x4 la, lb, h;
        uint32_t s[3], d;
    };
    NT_HD static void load_raw(const uint8_t* b, int part, Raw& r) {
        const int n = part >> 1, hf = part & 1;
        ld_a2x4_raw(b + 64 * n + 16 * hf, r.la);
        ld_a2x4_raw(b + 64 * n + 32 + 16 * hf, r.lb);
        ld_a2x4_raw(b + 128 + 32 * n + 16 * hf, r.h);
#ifdef __CUDA_ARCH__
        // The third word only where the 8 scale bytes are not 4-byte aligned, and only its
        // half inside the block (a whole word would read past a matrix's last block).
        const uint32_t* sw = reinterpret_cast<const uint32_t*>(down4(b + 192 + 8 * n));
        r.s[0] = sw[0], r.s[1] = sw[1];
        r.s[2] = r.la.sh ? ld_u16(reinterpret_cast<const uint8_t*>(sw + 2)) : 0u;
#else
        std::memcpy(r.s, b + 192 + 8 * n, 8);
        r.s[2] = 0;
#endif
        r.d = ld_u16(b + 208);
    }
    NT_HD static void decode(const Raw& r, int part, W& w) {
        const int hf = part & 1;
        a2x4_words(r.la, w.la);
        a2x4_words(r.lb, w.lb);
        a2x4_words(r.h, w.h);
#ifdef __CUDA_ARCH__
        const uint32_t s0 = __funnelshift_r(r.s[0], r.s[1], r.la.sh);
        const uint32_t s1 = __funnelshift_r(r.s[1], r.s[2], r.la.sh);
#else
        const uint32_t s0 = r.s[0], s1 = r.s[1];
#endif
        const int sh = 8 * hf;
        w.sc[0] = int8_t(uint8_t(s0 >> sh));
        w.sc[1] = int8_t(uint8_t(s0 >> (16 + sh)));
        w.sc[2] = int8_t(uint8_t(s1 >> sh));
        w.sc[3] = int8_t(uint8_t(s1 >> (16 + sh)));
        w.d = r.d;
    }
    NT_HD static void load_w(const uint8_t* b, int part, W& w) {
        Raw r;
        load_raw(b, part, r);
        decode(r, part, w);
    }
    template <bool kAny = false>
    NT_HD static void load_x(const int8_t* xq, const float2* xd, int part, X& x) {
        Quant<GgmlType::Q2_K>::X x2;
        Quant<GgmlType::Q2_K>::load_x<kAny>(xq, xd, part, x2);
        for (int j = 0; j < 4; ++j) {
            for (int i = 0; i < 4; ++i) x.q[j][i] = x2.q[j][i];
            x.o[j] = -32 * x2.s[j];
        }
        x.d = x2.d;
    }
    // sum (q - 32) x = sum q x - 32 sum x, exactly (integers): the quants stay unsigned (0..63,
    // so dp4a's signed bytes read them right) and the offset is where each chain of dp4a
    // starts (x.o), not a byte-wise subtraction per word. The high bits are moved into place
    // by one shift and one mask, which the compiler merges with the low nibble's mask. The
    // sum is formed biased (i2d_biased), in unsigned arithmetic, where it wraps by design.
    NT_HD static double dot(const W& w, const X& x) {
        uint32_t isum = kI2dBias;
        for (int t = 0; t < 4; ++t) {
            int sq = x.o[t];
            for (int i = 0; i < 4; ++i)
                sq = dp4a(q6k_quants4_u(t & 1 ? w.lb[i] : w.la[i], w.h[i], t), x.q[t][i], sq);
            isum += uint32_t(sq) * uint32_t(w.sc[t]);
        }
        return i2d_biased(isum) * (h2d(w.d) * double(x.d));
    }
    NT_HD static void dequant8(const uint8_t* b, int g, float* out) {
        const int e0 = g * 8, n = e0 >> 7, t = (e0 >> 5) & 3, l0 = e0 & 31;
        const float dl = h2f(ld_u16(b + 208)) * float(int8_t(b[192 + 8 * n + 2 * t + (l0 >> 4)]));
        uint32_t ql[2], qh[2];
        ld_8_a2(b + 64 * n + 32 * (t & 1) + l0, ql);
        ld_8_a2(b + 128 + 32 * n + l0, qh);
        for (int l = 0; l < 8; ++l) {
            const int lo = (byte_of(ql, l) >> (4 * (t >> 1))) & 15;
            const int hi = (byte_of(qh, l) >> (2 * t)) & 3;
            out[l] = dl * float((lo | (hi << 4)) - 32);
        }
    }
};

}  // namespace nt::cuda::detail
