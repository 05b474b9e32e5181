// AVX2 (+FMA, F16C) instantiation of the x86 dot-product kernels (dot_x86.h): tiles of 8 weight
// rows, PMADDUBSW + PMADDWD for the int8 products. Only the dispatcher calls into this file,
// after checking the CPU; it is built with the AVX2 flags.
#include <immintrin.h>

#include "quant/dot_x86.h"

namespace nt::quant_detail {
namespace {

using x86::load_i32;

struct Avx2 {
    static constexpr int L = 8;            // weight rows per tile (32-bit lanes)
    static constexpr int kCols = 4;        // activation columns per pass over a decoded block
    static constexpr int kLegacyCols = 4;  // the same for the 32-element formats
    // Row-direct kernels (up to x86::row_cols<T>() activation columns) in groups of kRowGroup.
    static constexpr int kRowGroup = 2;
    static constexpr int kFloatRows = 4, kFloatCols = 2;
    using VI = __m256i;
    using VF = __m256;

    static VI zero() { return _mm256_setzero_si256(); }
    static VI set1_i32(int v) { return _mm256_set1_epi32(v); }
    static VI set1_i8(char v) { return _mm256_set1_epi8(v); }
    static VI and_(VI a, VI b) { return _mm256_and_si256(a, b); }
    static VI or_(VI a, VI b) { return _mm256_or_si256(a, b); }
    static VI xor_(VI a, VI b) { return _mm256_xor_si256(a, b); }
    static VI slli16(VI a, int s) { return _mm256_slli_epi16(a, s); }
    static VI srli16(VI a, int s) { return _mm256_srli_epi16(a, s); }
    static VI slli32(VI a, int s) { return _mm256_slli_epi32(a, s); }
    static VI srli32(VI a, int s) { return _mm256_srli_epi32(a, s); }
    static VI srai32(VI a, int s) { return _mm256_srai_epi32(a, s); }
    static VI sub32(VI a, VI b) { return _mm256_sub_epi32(a, b); }
    static VI add32(VI a, VI b) { return _mm256_add_epi32(a, b); }
    static VI mullo32(VI a, VI b) { return _mm256_mullo_epi32(a, b); }

    static VF zero_ps() { return _mm256_setzero_ps(); }
    static VF set1_ps(float v) { return _mm256_set1_ps(v); }
    static VF loadu_ps(const float* p) { return _mm256_loadu_ps(p); }
    static VF cvt(VI a) { return _mm256_cvtepi32_ps(a); }
    static VF mul(VF a, VF b) { return _mm256_mul_ps(a, b); }
    static VF add_ps(VF a, VF b) { return _mm256_add_ps(a, b); }
    static VF fmadd(VF a, VF b, VF c) { return _mm256_fmadd_ps(a, b, c); }
    static VF fnmadd(VF a, VF b, VF c) { return _mm256_fnmadd_ps(a, b, c); }  // c - a * b
    static float reduce_ps(VF a) {
        __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
        s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
    }

    // Doubles: the quantized kernels' sums (dot_x86.h, "Batch invariance"). A tile's L lanes
    // are two VD, lanes 0..3 and 4..7; D8 is the row-direct kernels' eight rows.
    using VD = __m256d;
    static VD zero_pd() { return _mm256_setzero_pd(); }
    static VD set1_pd(double v) { return _mm256_set1_pd(v); }
    static VD loadu_pd(const double* p) { return _mm256_loadu_pd(p); }
    static void storeu_pd(double* p, VD v) { _mm256_storeu_pd(p, v); }
    static VD mul_pd(VD a, VD b) { return _mm256_mul_pd(a, b); }
    static VD fmadd_pd(VD a, VD b, VD c) { return _mm256_fmadd_pd(a, b, c); }
    static VD fnmadd_pd(VD a, VD b, VD c) { return _mm256_fnmadd_pd(a, b, c); }  // c - a * b
    static VD cvt_lo_pd(VI a) { return _mm256_cvtepi32_pd(_mm256_castsi256_si128(a)); }
    static VD cvt_hi_pd(VI a) { return _mm256_cvtepi32_pd(_mm256_extracti128_si256(a, 1)); }
    static VD cvtps_lo_pd(VF a) { return _mm256_cvtps_pd(_mm256_castps256_ps128(a)); }
    static VD cvtps_hi_pd(VF a) { return _mm256_cvtps_pd(_mm256_extractf128_ps(a, 1)); }
    static VF cvtpd_ps(VD lo, VD hi) {  // round to nearest
        return _mm256_set_m128(_mm256_cvtpd_ps(hi), _mm256_cvtpd_ps(lo));
    }
    struct D8 {
        VD lo, hi;
    };
    static D8 d8_zero() { return {zero_pd(), zero_pd()}; }
    static D8 d8_add(D8 a, D8 b) { return {_mm256_add_pd(a.lo, b.lo), _mm256_add_pd(a.hi, b.hi)}; }
    static D8 d8_mul(D8 a, D8 b) { return {_mm256_mul_pd(a.lo, b.lo), _mm256_mul_pd(a.hi, b.hi)}; }
    static D8 d8_i32(__m256i a) { return {cvt_lo_pd(a), cvt_hi_pd(a)}; }
    static D8 d8_ps(__m256 a) { return {cvtps_lo_pd(a), cvtps_hi_pd(a)}; }
    static D8 d8_mul(D8 a, double b) {
        return {_mm256_mul_pd(a.lo, set1_pd(b)), _mm256_mul_pd(a.hi, set1_pd(b))};
    }
    static D8 d8_fmadd(D8 a, D8 b, D8 c) {
        return {_mm256_fmadd_pd(a.lo, b.lo, c.lo), _mm256_fmadd_pd(a.hi, b.hi, c.hi)};
    }
    static D8 d8_fnmadd(D8 a, D8 b, D8 c) {
        return {_mm256_fnmadd_pd(a.lo, b.lo, c.lo), _mm256_fnmadd_pd(a.hi, b.hi, c.hi)};
    }
    static __m256 d8_cvt_ps(D8 a) { return cvtpd_ps(a.lo, a.hi); }

    // f16 in the low / high half of each lane -> float.
    static VF half_lo(VI a) {
        const VI lo16 = _mm256_shuffle_epi8(
            a, _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1, 0, 1, 4,
                                5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1));
        return _mm256_cvtph_ps(_mm256_castsi256_si128(_mm256_permute4x64_epi64(lo16, 0x08)));
    }
    static VF half_hi(VI a) { return half_lo(_mm256_srli_epi32(a, 16)); }

    // acc += the four products of unsigned w bytes (at most 63: PMADDUBSW's 16-bit pair sums
    // cannot saturate against |y| <= 127) with the signed bytes y[0..3], per lane.
    static VI dot4(VI acc, VI w, const void* y) {
        const VI p = _mm256_maddubs_epi16(w, _mm256_set1_epi32(load_i32(y)));
        return _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
    }
    // The same for full-range unsigned bytes (Q8_0's q + 128): split into w & 127 and the top
    // bit, so that neither PMADDUBSW can saturate.
    static VI dot4_wide(VI acc, VI w, const void* y) {
        const VI yv = _mm256_set1_epi32(load_i32(y));
        const VI lo = _mm256_maddubs_epi16(_mm256_and_si256(w, _mm256_set1_epi8(0x7F)), yv);
        const VI hi = _mm256_maddubs_epi16(
            _mm256_and_si256(_mm256_srli_epi16(w, 7), _mm256_set1_epi8(1)), yv);
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(lo, _mm256_set1_epi16(1)));
        return _mm256_add_epi32(acc, _mm256_madd_epi16(hi, _mm256_set1_epi16(128)));
    }
    // The row-direct kernels' forms (same vectors): acc += w (u8, at most 128) . y (s8, |y| <=
    // 127) in groups of four, and acc += a . b in pairs of 16-bit values.
    static __m256i ydot(__m256i acc, __m256i w, __m256i y) {
        return _mm256_add_epi32(
            acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, y), _mm256_set1_epi16(1)));
    }
    static __m256i ydot16(__m256i acc, __m256i a, __m256i b) {
        return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
    }

    // acc += the two products of 16-bit pairs a with the pair b[0..1], per lane.
    static VI dot_pairs16(VI acc, VI a, const int16_t* b) {
        return _mm256_add_epi32(acc, _mm256_madd_epi16(a, _mm256_set1_epi32(load_i32(b))));
    }

    static VI mask(int nvalid) {
        return _mm256_cmpgt_epi32(_mm256_set1_epi32(nvalid),
                                  _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    }
    static VF load_rows(const float* p, int nvalid) {
        return nvalid == L ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, mask(nvalid));
    }
    static void store_rows(float* p, int nvalid, VF v) {
        if (nvalid == L) {
            _mm256_storeu_ps(p, v);
        } else {
            _mm256_maskstore_ps(p, mask(nvalid), v);
        }
    }

    template <GgmlType T>
    static VF load_weights(const uint8_t* p, int64_t i) {
        if constexpr (T == GgmlType::F32) {
            return _mm256_loadu_ps((const float*)(p + 4 * i));
        } else if constexpr (T == GgmlType::F16) {
            return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(p + 2 * i)));
        } else {
            const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)(p + 2 * i)));
            return _mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
        }
    }

    // Adds 16 to the bytes of w[k] (elements 4k..4k+3) whose bit 4k+j of the lane's qh is set.
    static void add_q5_high_bits(VI qh, VI w[8]) {
        for (int k = 0; k < 8; ++k) {
            const int b = (k / 2) * 0x01010101;
            const VI idx = _mm256_setr_epi32(b, 0x04040404 + b, 0x08080808 + b, 0x0C0C0C0C + b, b,
                                             0x04040404 + b, 0x08080808 + b, 0x0C0C0C0C + b);
            const VI sel = _mm256_shuffle_epi8(qh, idx);
            const int s = 4 * (k & 1);
            const VI bits = _mm256_set1_epi32(
                int((1u << s) | (2u << (s + 8)) | (4u << (s + 16)) | (8u << (s + 24))));
            const VI set = _mm256_cmpeq_epi8(_mm256_and_si256(sel, bits), bits);
            w[k] = _mm256_add_epi8(w[k], _mm256_and_si256(set, _mm256_set1_epi8(16)));
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

    struct Rows {
        const uint8_t* p[L];
        __m256i off;
        bool off32;
        int nvalid;

        Rows(const uint8_t* w, size_t stride, int n) : nvalid(n) {
            alignas(32) int32_t o[L];
            off32 = size_t(n - 1) * stride <= size_t(INT32_MAX);
            for (int i = 0; i < L; ++i) {
                const int r = std::min(i, n - 1);
                p[i] = w + size_t(r) * stride;
                o[i] = off32 ? int32_t(size_t(r) * stride) : 0;
            }
            off = _mm256_load_si256((const __m256i*)o);
        }

        VI gather(size_t at) const {
            if (off32) return _mm256_i32gather_epi32((const int*)(p[0] + at), off, 1);
            alignas(32) int32_t t[L];
            for (int i = 0; i < L; ++i) t[i] = load_i32(p[i] + at);
            return _mm256_load_si256((const __m256i*)t);
        }

        // Bytes at..at+15 of the 8 rows, transposed (see the AVX-512 version): 128-bit lane j of
        // z[a] is row 4j+a, then a 4x4 transpose of 32-bit words inside each 128-bit lane.
        void transpose16(size_t at, VI out[4]) const {
            VI z[4];
            for (int a = 0; a < 4; ++a) {
                const __m128i lo = _mm_loadu_si128((const __m128i*)(p[a] + at));
                z[a] = _mm256_inserti128_si256(_mm256_castsi128_si256(lo),
                                               _mm_loadu_si128((const __m128i*)(p[4 + a] + at)), 1);
            }
            const VI t0 = _mm256_unpacklo_epi32(z[0], z[1]), t1 = _mm256_unpackhi_epi32(z[0], z[1]);
            const VI t2 = _mm256_unpacklo_epi32(z[2], z[3]), t3 = _mm256_unpackhi_epi32(z[2], z[3]);
            out[0] = _mm256_unpacklo_epi64(t0, t2);
            out[1] = _mm256_unpackhi_epi64(t0, t2);
            out[2] = _mm256_unpacklo_epi64(t1, t3);
            out[3] = _mm256_unpackhi_epi64(t1, t3);
        }
    };
};

}  // namespace

const KernelTable& avx2_kernels() {
    static const KernelTable table = x86::make_table<Avx2>();
    return table;
}

}  // namespace nt::quant_detail
