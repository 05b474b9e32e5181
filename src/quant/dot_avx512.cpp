// AVX-512 (F, BW, VL, DQ, VNNI) instantiation of the x86 dot-product kernels (dot_x86.h):
// tiles of 16 weight rows, VPDPBUSD for the int8 products. Only the dispatcher calls into this
// file, after checking the CPU; it is built with the AVX-512 flags.

// GCC 12's AVX-512 intrinsics initialise their "undefined" operands from themselves and trip
// -W(maybe-)uninitialized when inlined (a false positive; GCC bug 105593).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include "quant/dot_x86.h"

namespace nt::quant_detail {
namespace {

using x86::load_i32;

struct Avx512 {
    static constexpr int L = 16;     // weight rows per tile (32-bit lanes)
    static constexpr int kCols = 8;  // activation columns per pass over a decoded block
    // The same for the 32-element formats: their double sums (two vectors per column) leave too
    // few registers for 8 columns (4 runs 3-5% faster on Zen 4, bench_quant GEMM).
    static constexpr int kLegacyCols = 4;
    // Row-direct kernels (up to x86::row_cols<T>() activation columns) in groups of kRowGroup.
    static constexpr int kRowGroup = 4;
    static constexpr int kFloatRows = 4, kFloatCols = 4;
    using VI = __m512i;
    using VF = __m512;

    static VI zero() { return _mm512_setzero_si512(); }
    static VI set1_i32(int v) { return _mm512_set1_epi32(v); }
    static VI set1_i8(char v) { return _mm512_set1_epi8(v); }
    static VI and_(VI a, VI b) { return _mm512_and_si512(a, b); }
    static VI or_(VI a, VI b) { return _mm512_or_si512(a, b); }
    static VI xor_(VI a, VI b) { return _mm512_xor_si512(a, b); }
    static VI slli16(VI a, int s) { return _mm512_slli_epi16(a, unsigned(s)); }
    static VI srli16(VI a, int s) { return _mm512_srli_epi16(a, unsigned(s)); }
    static VI slli32(VI a, int s) { return _mm512_slli_epi32(a, unsigned(s)); }
    static VI srli32(VI a, int s) { return _mm512_srli_epi32(a, unsigned(s)); }
    static VI srai32(VI a, int s) { return _mm512_srai_epi32(a, unsigned(s)); }
    static VI sub32(VI a, VI b) { return _mm512_sub_epi32(a, b); }
    static VI add32(VI a, VI b) { return _mm512_add_epi32(a, b); }
    static VI mullo32(VI a, VI b) { return _mm512_mullo_epi32(a, b); }

    static VF zero_ps() { return _mm512_setzero_ps(); }
    static VF set1_ps(float v) { return _mm512_set1_ps(v); }
    static VF loadu_ps(const float* p) { return _mm512_loadu_ps(p); }
    static VF cvt(VI a) { return _mm512_cvtepi32_ps(a); }
    static VF mul(VF a, VF b) { return _mm512_mul_ps(a, b); }
    static VF add_ps(VF a, VF b) { return _mm512_add_ps(a, b); }
    static VF fmadd(VF a, VF b, VF c) { return _mm512_fmadd_ps(a, b, c); }
    static VF fnmadd(VF a, VF b, VF c) { return _mm512_fnmadd_ps(a, b, c); }  // c - a * b
    static float reduce_ps(VF a) { return _mm512_reduce_add_ps(a); }

    // Doubles: the quantized kernels' sums (dot_x86.h, "Batch invariance"). A tile's L lanes
    // are two VD, lanes 0..7 and 8..15; D8 is the row-direct kernels' eight rows.
    using VD = __m512d;
    static VD zero_pd() { return _mm512_setzero_pd(); }
    static VD set1_pd(double v) { return _mm512_set1_pd(v); }
    static VD loadu_pd(const double* p) { return _mm512_loadu_pd(p); }
    static void storeu_pd(double* p, VD v) { _mm512_storeu_pd(p, v); }
    static VD mul_pd(VD a, VD b) { return _mm512_mul_pd(a, b); }
    static VD fmadd_pd(VD a, VD b, VD c) { return _mm512_fmadd_pd(a, b, c); }
    static VD fnmadd_pd(VD a, VD b, VD c) { return _mm512_fnmadd_pd(a, b, c); }  // c - a * b
    static VD cvt_lo_pd(VI a) { return _mm512_cvtepi32_pd(_mm512_castsi512_si256(a)); }
    static VD cvt_hi_pd(VI a) { return _mm512_cvtepi32_pd(_mm512_extracti64x4_epi64(a, 1)); }
    static VD cvtps_lo_pd(VF a) { return _mm512_cvtps_pd(_mm512_castps512_ps256(a)); }
    static VD cvtps_hi_pd(VF a) { return _mm512_cvtps_pd(_mm512_extractf32x8_ps(a, 1)); }
    static VF cvtpd_ps(VD lo, VD hi) {  // round to nearest
        return _mm512_insertf32x8(_mm512_castps256_ps512(_mm512_cvtpd_ps(lo)), _mm512_cvtpd_ps(hi),
                                  1);
    }
    using D8 = __m512d;
    static D8 d8_zero() { return _mm512_setzero_pd(); }
    static D8 d8_add(D8 a, D8 b) { return _mm512_add_pd(a, b); }
    static D8 d8_mul(D8 a, D8 b) { return _mm512_mul_pd(a, b); }
    static D8 d8_i32(__m256i a) { return _mm512_cvtepi32_pd(a); }
    static D8 d8_ps(__m256 a) { return _mm512_cvtps_pd(a); }
    static D8 d8_mul(D8 a, double b) { return _mm512_mul_pd(a, _mm512_set1_pd(b)); }
    static D8 d8_fmadd(D8 a, D8 b, D8 c) { return _mm512_fmadd_pd(a, b, c); }
    static D8 d8_fnmadd(D8 a, D8 b, D8 c) { return _mm512_fnmadd_pd(a, b, c); }
    static __m256 d8_cvt_ps(D8 a) { return _mm512_cvtpd_ps(a); }

    // f16 in the low / high half of each lane -> float.
    static VF half_lo(VI a) { return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(a)); }
    static VF half_hi(VI a) { return half_lo(_mm512_srli_epi32(a, 16)); }

    // acc += the four products of unsigned w bytes with the signed bytes y[0..3], per lane. The
    // four bytes come in as VPDPBUSD's embedded broadcast ({1to16}): GCC does not fold
    // _mm512_set1_epi32(load) into the instruction, and the separate VPBROADCASTD costs ~5% of
    // the GEMM on Zen 4 (bench_quant --sweep).
    static VI dot4(VI acc, VI w, const void* y) {
        __asm__("vpdpbusd %2%{1to16%}, %1, %0"
                : "+v"(acc)
                : "v"(w), "m"(*static_cast<const int32_t*>(y)));
        return acc;
    }
    static VI dot4_wide(VI acc, VI w, const void* y) { return dot4(acc, w, y); }
    // 256-bit forms for the row-direct kernels: acc += w (u8) . y (s8) in groups of four, and
    // acc += a . b in pairs of 16-bit values.
    static __m256i ydot(__m256i acc, __m256i w, __m256i y) {
        return _mm256_dpbusd_epi32(acc, w, y);
    }
    static __m256i ydot16(__m256i acc, __m256i a, __m256i b) {
        return _mm256_dpwssd_epi32(acc, a, b);
    }

    // acc += the two products of 16-bit pairs a with the pair b[0..1], per lane.
    static VI dot_pairs16(VI acc, VI a, const int16_t* b) {
        return _mm512_dpwssd_epi32(acc, a, _mm512_set1_epi32(load_i32(b)));
    }

    static __mmask16 mask(int nvalid) { return __mmask16((1u << nvalid) - 1); }
    static VF load_rows(const float* p, int nvalid) {
        return _mm512_maskz_loadu_ps(mask(nvalid), p);
    }
    static void store_rows(float* p, int nvalid, VF v) {
        _mm512_mask_storeu_ps(p, mask(nvalid), v);
    }

    template <GgmlType T>
    static VF load_weights(const uint8_t* p, int64_t i) {
        if constexpr (T == GgmlType::F32) {
            return _mm512_loadu_ps(p + 4 * i);
        } else if constexpr (T == GgmlType::F16) {
            return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(p + 2 * i)));
        } else {
            const __m512i h =
                _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(p + 2 * i)));
            return _mm512_castsi512_ps(_mm512_slli_epi32(h, 16));
        }
    }

    // Adds 16 to the bytes of w[k] (elements 4k..4k+3) whose bit 4k+j of the lane's qh is set.
    static void add_q5_high_bits(VI qh, VI w[8]) {
        for (int k = 0; k < 8; ++k) {
            // Byte k/2 of each lane's qh into all four bytes, then test bits 4(k&1)+0..3.
            const int b = (k / 2) * 0x01010101;
            const VI sel = _mm512_shuffle_epi8(
                qh, _mm512_set4_epi32(0x0C0C0C0C + b, 0x08080808 + b, 0x04040404 + b, b));
            const int s = 4 * (k & 1);
            const VI bits = _mm512_set1_epi32(
                int((1u << s) | (2u << (s + 8)) | (4u << (s + 16)) | (8u << (s + 24))));
            w[k] = _mm512_mask_add_epi8(w[k], _mm512_test_epi8_mask(sel, bits), w[k],
                                        _mm512_set1_epi8(16));
        }
    }

    // The sums of the quants of nb Q8_0 blocks of one row: sum(q) = sum(q + 128) - 32 * 128,
    // the unsigned sums from SAD.
    static void q8_sums(const uint8_t* row, size_t block, size_t qs_off, int64_t nb, int32_t* sy) {
        const __m256i flip = _mm256_set1_epi8(char(0x80));
        for (int64_t b = 0; b < nb; ++b) {
            const uint8_t* blk = row + size_t(b) * block;
            const __m256i q =
                _mm256_xor_si256(_mm256_loadu_si256((const __m256i*)(blk + qs_off)), flip);
            const __m256i s = _mm256_sad_epu8(q, _mm256_setzero_si256());
            const __m128i h =
                _mm_add_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
            sy[b] = int32_t(_mm_cvtsi128_si32(h) + _mm_extract_epi32(h, 2)) - 4096;
        }
    }

    // The rows of one tile. Lanes past the last row repeat it, so every load stays inside the
    // weights; their results are not stored.
    struct Rows {
        const uint8_t* p[L];
        __m512i off;  // lane -> byte offset of its row from p[0], for gathers
        bool off32;   // the offsets fit in int32
        int nvalid;

        Rows(const uint8_t* w, size_t stride, int n) : nvalid(n) {
            alignas(64) int32_t o[L];
            off32 = size_t(n - 1) * stride <= size_t(INT32_MAX);
            for (int i = 0; i < L; ++i) {
                const int r = std::min(i, n - 1);
                p[i] = w + size_t(r) * stride;
                o[i] = off32 ? int32_t(size_t(r) * stride) : 0;
            }
            off = _mm512_load_si512(o);
        }

        // The 32-bit word at byte offset `at` of every row.
        VI gather(size_t at) const {
            if (off32) return _mm512_i32gather_epi32(off, p[0] + at, 1);
            alignas(64) int32_t t[L];
            for (int i = 0; i < L; ++i) t[i] = load_i32(p[i] + at);
            return _mm512_load_si512(t);
        }

        // Bytes at..at+15 of every row, transposed: out[k] holds bytes at+4k..at+4k+3 of row i in
        // lane i. Four rows per register (128-bit lane j of z[a] is row 4j+a), then a 4x4
        // transpose of 32-bit words inside each 128-bit lane.
        void transpose16(size_t at, VI out[4]) const {
            VI z[4];
            for (int a = 0; a < 4; ++a) {
                VI v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i*)(p[a] + at)));
                v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i*)(p[4 + a] + at)), 1);
                v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i*)(p[8 + a] + at)), 2);
                z[a] = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i*)(p[12 + a] + at)), 3);
            }
            const VI t0 = _mm512_unpacklo_epi32(z[0], z[1]), t1 = _mm512_unpackhi_epi32(z[0], z[1]);
            const VI t2 = _mm512_unpacklo_epi32(z[2], z[3]), t3 = _mm512_unpackhi_epi32(z[2], z[3]);
            out[0] = _mm512_unpacklo_epi64(t0, t2);
            out[1] = _mm512_unpackhi_epi64(t0, t2);
            out[2] = _mm512_unpacklo_epi64(t1, t3);
            out[3] = _mm512_unpackhi_epi64(t1, t3);
        }
    };
};

}  // namespace

const KernelTable& avx512_kernels() {
    static const KernelTable table = x86::make_table<Avx512>();
    return table;
}

}  // namespace nt::quant_detail
