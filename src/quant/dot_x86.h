// The x86 SIMD dot-product kernels, written once over an ISA wrapper `I` and instantiated by
// dot_avx2.cpp (8 lanes, AVX2) and dot_avx512.cpp (16 lanes, AVX-512 VNNI). Include it only
// from those two files: the code needs their ISA flags.
//
// Quantized weights have two kernel shapes; each type switches from the first to the second at
// a measured column count (row_cols<T>(), the same for both ISAs):
//  - row-direct (few activation columns: the GEMV of decoding): eight weight rows at a time,
//    from eight regions of the matrix (each read as its own sequential stream); lanes are
//    elements for the integer dot products (blocks unpacked in registers with in-lane shifts and
//    masks, dotted with every column), rows for the float scaling. 256-bit vectors at both levels.
//  - transposed tiles (many columns: prompt processing): a tile is I::L weight rows, one per
//    32-bit lane. Each weight block of the tile's rows is unpacked to unsigned bytes in element
//    order and transposed, so that vector k holds elements 4k..4k+3 of each row in its lane; a
//    broadcast 4-byte group of an activation row then adds four products to every row's lane
//    (VPDPBUSD, or PMADDUBSW + PMADDWD), and the per-block float scaling is one multiply-add for
//    all rows. The unpacked block is stored once and reused for every column; the transposition
//    (about 2.4 cycles per 16 bytes of a row on Zen 4) is what the columns amortize.
// Offsets of the signed formats (q - 8, q - 16, q - 128, q - 4, q - 32) are applied exactly, as
// integer starting values -offset * sum(activation quants), or with the sign trick in the
// row-direct kernels; mins use the activation sums (Q8_1's s field, Q8_K's bsums).
//
// Float weights (F32/F16/BF16 against F32 activations) use the classic register-blocked shape:
// lanes are elements, R rows x C columns of accumulators.
//
// Batch invariance: an output element is bit-identical whatever the number of columns, the
// column's place among them and the rows around it, so that a sequence decodes to the same
// logits alone or inside a batch. The arithmetic is the one every backend follows
// (dot_scalar.cpp's header says why: the GPU sums the same double terms in another order and
// gets the same float): per lane (row), each block's integer dot product exactly (int32, whose
// sums do not depend on their order), then one double chain per output element over the blocks
// in order, from +0, rounded once to float at the end:
//   32-element formats: f = fma(double(isum), double(dw) * double(dy), f);
//                       Q4_1/Q5_1 then f = fma(double(m), double(s), f)
//   K-quants:           f = fma(double(isum), double(d) * double(dy), f); with mins
//                       f = f - double(msum) * (double(dmin) * double(dy)), fused
//   output:             float(f)
// where isum includes the sub-block scales and offsets and msum = sum(min_j * bsum_j). The
// scale products are exact in double. For the 32-element formats the whole products are too
// (|isum| < 2^19, d * dy two f16 values: 22 bits, exact even in float; m * s likewise), so the
// row-direct kernels form them as plain products, d * dy and m * s in float, and add them: the
// same roundings as the fused steps. The row-direct kernels compute the integers with lanes as
// elements, reduce them to one total per row, and run the same chains with eight rows as the
// lanes (8 doubles: two vectors at AVX2, one at AVX-512); the tiles keep a column's L lanes in
// two double vectors, in a scratch row between passes over chunks of blocks. The doubles cost
// the 32-element formats' tiles up to a quarter of their GEMM speed (the per-block scaling is
// twice the vector work it was in float), the GEMV and the K-quants a few percent (bench_quant,
// Zen 4, one thread, against the float chains). The float kernels (F32/F16/BF16, not part of
// that arithmetic) keep one float accumulator vector per output element in every shape.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include "core/f16.h"
#include "quant/kernels.h"

namespace nt::quant_detail::x86 {

// Up to this many activation columns a type takes the row-direct kernels, beyond it the
// transposed tiles. Measured on Zen 4 (bench_quant --sweep): the tiles' transposition pays off
// from 2 columns for the 32-element formats, from 5-8 for the K-quants.
template <GgmlType T>
constexpr int row_cols() {
    switch (T) {
        case GgmlType::Q8_0:
            return 2;
        case GgmlType::Q4_K:
            return 4;
        case GgmlType::Q5_K:
            return 5;
        case GgmlType::Q2_K:
        case GgmlType::Q3_K:
        case GgmlType::Q6_K:
            return 6;
        default:
            return 1;
    }
}

inline int32_t load_i32(const void* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

template <typename T>
T* scratch(std::vector<T>& v, size_t n) {
    if (v.size() < n) v.resize(n);
    return v.data();
}

// Bits of one byte moved: every byte's bits from..from+width-1 to to..to+width-1, others clear.
template <class I>
inline typename I::VI move_bits(typename I::VI v, int from, int to, int width) {
    const typename I::VI s = to >= from ? I::slli16(v, to - from) : I::srli16(v, from - to);
    return I::and_(s, I::set1_i8(char(((1u << width) - 1) << to)));
}
template <class I>
inline typename I::VI low_nibbles(typename I::VI v) {
    return I::and_(v, I::set1_i8(0x0F));
}
template <class I>
inline typename I::VI high_nibbles(typename I::VI v) {
    return I::and_(I::srli16(v, 4), I::set1_i8(0x0F));
}
template <class I>
inline typename I::VI byte_of(typename I::VI v, int i) {  // byte i of each lane, zero-extended
    return I::and_(I::srli32(v, 8 * i), I::set1_i32(0xFF));
}

// ---------------------------------------------------------------------------------------------
// Activations, prepared once per call.

// Q8_0 / Q8_1 rows: the f16 scales (and Q8_1's s = d * sum(q)) as floats; for the Q8_0 types
// on the many-column path also the exact sums of each block's quants (their offsets need them).
struct ActQ8 {
    const uint8_t* a;
    size_t stride;
    int64_t nb;
    size_t block;   // bytes per block
    size_t qs_off;  // offset of the quants in a block
    const float* dy;
    const float* ds;    // Q8_1 only
    const int32_t* sy;  // Q8_0 with sums only

    const uint8_t* qs(int c, int64_t b) const {
        return a + size_t(c) * stride + size_t(b) * block + qs_off;
    }
    size_t idx(int c, int64_t b) const { return size_t(c) * size_t(nb) + size_t(b); }
};

template <class I>
ActQ8 prepare_q8(const void* a, size_t stride, int ncols, int64_t nb, bool q8_1, bool sums) {
    thread_local std::vector<float> dyv, dsv;
    thread_local std::vector<int32_t> syv;
    ActQ8 r{static_cast<const uint8_t*>(a),
            stride,
            nb,
            q8_1 ? sizeof(block_q8_1) : sizeof(block_q8_0),
            q8_1 ? size_t(4) : size_t(2),
            nullptr,
            nullptr,
            nullptr};
    const size_t count = size_t(ncols) * size_t(nb);
    float* dy = scratch(dyv, count);
    float* ds = q8_1 ? scratch(dsv, count) : nullptr;
    int32_t* sy = !q8_1 && sums ? scratch(syv, count) : nullptr;
    for (int c = 0; c < ncols; ++c) {
        const uint8_t* row = r.a + size_t(c) * stride;
        for (int64_t b = 0; b < nb; ++b) {
            const uint8_t* blk = row + size_t(b) * r.block;
            dy[r.idx(c, b)] = _cvtsh_ss(load_u16(blk));
            if (ds) ds[r.idx(c, b)] = _cvtsh_ss(load_u16(blk + 2));
        }
        if (sy) I::q8_sums(row, r.block, r.qs_off, nb, sy + r.idx(c, 0));
    }
    r.dy = dy;
    r.ds = ds;
    r.sy = sy;
    return r;
}

// Q8_K rows are used in place; Q3_K and Q6_K also need -offset * bsum per 16 quants as 32-bit
// values (the starting values of their sub-block sums).
struct ActQ8K {
    const uint8_t* a;
    size_t stride;
    int64_t nb;
    const int32_t* corr;  // [col][block][16]

    const block_q8_K* blk(int c, int64_t b) const {
        return reinterpret_cast<const block_q8_K*>(a + size_t(c) * stride) + b;
    }
    const int32_t* corr_of(int c, int64_t b) const {
        return corr + (size_t(c) * size_t(nb) + size_t(b)) * 16;
    }
};

inline ActQ8K prepare_q8k(const void* a, size_t stride, int ncols, int64_t nb, int offset) {
    thread_local std::vector<int32_t> corrv;
    ActQ8K r{static_cast<const uint8_t*>(a), stride, nb, nullptr};
    if (offset == 0) return r;
    int32_t* corr = scratch(corrv, size_t(ncols) * size_t(nb) * 16);
    for (int c = 0; c < ncols; ++c) {
        for (int64_t b = 0; b < nb; ++b) {
            const int16_t* bs = r.blk(c, b)->bsums;
            int32_t* o = corr + (size_t(c) * size_t(nb) + size_t(b)) * 16;
            for (int j = 0; j < 16; ++j) o[j] = -offset * bs[j];
        }
    }
    r.corr = corr;
    return r;
}

// ---------------------------------------------------------------------------------------------
// The 32-element formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0.

template <GgmlType T>
constexpr bool kHasMin = T == GgmlType::Q4_1 || T == GgmlType::Q5_1;
template <GgmlType T>
constexpr int kOffset = T == GgmlType::Q4_0   ? 8
                        : T == GgmlType::Q5_0 ? 16
                        : T == GgmlType::Q8_0 ? 128
                                              : 0;
template <GgmlType T>
constexpr size_t kBlockBytes = T == GgmlType::Q4_0   ? sizeof(block_q4_0)
                               : T == GgmlType::Q4_1 ? sizeof(block_q4_1)
                               : T == GgmlType::Q5_0 ? sizeof(block_q5_0)
                               : T == GgmlType::Q5_1 ? sizeof(block_q5_1)
                                                     : sizeof(block_q8_0);

template <class I>
struct LegacyBlock {
    typename I::VI w[8];        // unsigned quants (Q8_0: q + 128)
    typename I::VD d[2], m[2];  // the scales, lanes 0..L/2-1 and L/2..L-1
};

// A tile's L float lanes as two double vectors, exactly.
template <class I>
inline void to_pd(typename I::VF v, typename I::VD out[2]) {
    out[0] = I::cvtps_lo_pd(v);
    out[1] = I::cvtps_hi_pd(v);
}

template <class I, GgmlType T>
inline void decode_legacy(const typename I::Rows& rows, int64_t b, LegacyBlock<I>& out) {
    using VI = typename I::VI;
    const size_t at = size_t(b) * kBlockBytes<T>;
    const VI dm = rows.gather(at);  // d (and m) in the first 32-bit word of every block
    to_pd<I>(I::half_lo(dm), out.d);
    if constexpr (kHasMin<T>) to_pd<I>(I::half_hi(dm), out.m);
    VI q[4];
    if constexpr (T == GgmlType::Q8_0) {
        const VI flip = I::set1_i8(char(0x80));
        rows.transpose16(at + 2, q);
        for (int k = 0; k < 4; ++k) out.w[k] = I::xor_(q[k], flip);
        rows.transpose16(at + 18, q);
        for (int k = 0; k < 4; ++k) out.w[k + 4] = I::xor_(q[k], flip);
    } else {
        constexpr size_t qs_off = T == GgmlType::Q4_0   ? 2
                                  : T == GgmlType::Q4_1 ? 4
                                  : T == GgmlType::Q5_0 ? 6
                                                        : 8;
        rows.transpose16(at + qs_off, q);
        for (int k = 0; k < 4; ++k) {
            out.w[k] = low_nibbles<I>(q[k]);
            out.w[k + 4] = high_nibbles<I>(q[k]);
        }
        if constexpr (T == GgmlType::Q5_0 || T == GgmlType::Q5_1) {
            I::add_q5_high_bits(rows.gather(at + (T == GgmlType::Q5_0 ? 2 : 4)), out.w);
        }
    }
}

// One decoded block against columns c0..c0+G-1, in double: f[g] = fma(isum, d * dy, f[g]),
// then for Q4_1/Q5_1 f[g] = fma(m, s, f[g]); f[g][0] holds lanes 0..L/2-1, f[g][1] the rest.
template <class I, GgmlType T, int G>
inline void legacy_block(const LegacyBlock<I>& B, int64_t b, const ActQ8& act, int c0,
                         typename I::VD (*f)[2]) {
    using VI = typename I::VI;
    VI acc[G];
    for (int g = 0; g < G; ++g) {
        acc[g] = kOffset<T> ? I::set1_i32(-kOffset<T> * act.sy[act.idx(c0 + g, b)]) : I::zero();
    }
    for (int k = 0; k < 8; ++k) {
        const VI wk = B.w[k];
        for (int g = 0; g < G; ++g) {
            if constexpr (T == GgmlType::Q8_0) {
                acc[g] = I::dot4_wide(acc[g], wk, act.qs(c0 + g, b) + 4 * k);
            } else {
                acc[g] = I::dot4(acc[g], wk, act.qs(c0 + g, b) + 4 * k);
            }
        }
    }
    for (int g = 0; g < G; ++g) {
        const size_t ci = act.idx(c0 + g, b);
        const typename I::VD dy = I::set1_pd(act.dy[ci]);
        f[g][0] = I::fmadd_pd(I::cvt_lo_pd(acc[g]), I::mul_pd(B.d[0], dy), f[g][0]);
        f[g][1] = I::fmadd_pd(I::cvt_hi_pd(acc[g]), I::mul_pd(B.d[1], dy), f[g][1]);
        if constexpr (kHasMin<T>) {
            const typename I::VD ds = I::set1_pd(act.ds[ci]);
            f[g][0] = I::fmadd_pd(B.m[0], ds, f[g][0]);
            f[g][1] = I::fmadd_pd(B.m[1], ds, f[g][1]);
        }
    }
}

// The double sums of a tile's columns between passes over its blocks: column c's L lanes at
// acc + c * L. The first pass starts them at +0, the last rounds them to float into out.
template <class I, int G>
inline void load_sums(const double* acc, int c0, bool first, typename I::VD (*f)[2]) {
    for (int g = 0; g < G; ++g) {
        const double* p = acc + size_t(c0 + g) * I::L;
        f[g][0] = first ? I::zero_pd() : I::loadu_pd(p);
        f[g][1] = first ? I::zero_pd() : I::loadu_pd(p + I::L / 2);
    }
}
template <class I, int G>
inline void store_sums(typename I::VD (*f)[2], double* acc, int c0, bool last, float* out,
                       size_t out_stride, int nvalid) {
    for (int g = 0; g < G; ++g) {
        if (last) {
            I::store_rows(out + size_t(c0 + g) * out_stride, nvalid, I::cvtpd_ps(f[g][0], f[g][1]));
        } else {
            double* p = acc + size_t(c0 + g) * I::L;
            I::storeu_pd(p, f[g][0]);
            I::storeu_pd(p + I::L / 2, f[g][1]);
        }
    }
}

// Many columns: a chunk of blocks decoded once, then every column group runs over it.
template <class I, GgmlType T, int G>
void legacy_chunk_cols(const LegacyBlock<I>* blk, int nbc, int64_t b0, const ActQ8& act, int c0,
                       double* acc, bool first, bool last, float* out, size_t out_stride,
                       int nvalid) {
    typename I::VD f[G][2];
    load_sums<I, G>(acc, c0, first, f);
    for (int i = 0; i < nbc; ++i) legacy_block<I, T, G>(blk[i], b0 + i, act, c0, f);
    store_sums<I, G>(f, acc, c0, last, out, out_stride, nvalid);
}

// Calls fn.template operator()<G>(c0) over ncols in groups of kG and one remainder group.
template <int kG, typename F>
inline void for_col_groups(int ncols, F&& fn) {
    int c0 = 0;
    for (; c0 + kG <= ncols; c0 += kG) fn.template operator()<kG>(c0);
    const int rem = ncols - c0;
    if constexpr (kG > 1) {
        if (rem == 1) fn.template operator()<1>(c0);
    }
    if constexpr (kG > 2) {
        if (rem == 2) fn.template operator()<2>(c0);
    }
    if constexpr (kG > 3) {
        if (rem == 3) fn.template operator()<3>(c0);
    }
    if constexpr (kG > 4) {
        if (rem == 4) fn.template operator()<4>(c0);
    }
    if constexpr (kG > 5) {
        if (rem == 5) fn.template operator()<5>(c0);
    }
    if constexpr (kG > 6) {
        if (rem == 6) fn.template operator()<6>(c0);
    }
    if constexpr (kG > 7) {
        if (rem == 7) fn.template operator()<7>(c0);
    }
}

// Float zeros for a tile whose rows have no blocks (n = 0).
template <class I>
inline void zero_tile(float* out, size_t out_stride, int ncols, int nvalid) {
    for (int c = 0; c < ncols; ++c)
        I::store_rows(out + size_t(c) * out_stride, nvalid, I::zero_ps());
}

// K-quant block constants (used by the row-direct kernels below and the K tiles further on).
template <GgmlType T>
constexpr int kSubBlocks = (T == GgmlType::Q4_K || T == GgmlType::Q5_K) ? 8 : 16;
template <GgmlType T>
constexpr int kKOffset = T == GgmlType::Q3_K   ? 4
                         : T == GgmlType::Q6_K ? 32
                                               : 0;
template <GgmlType T>
constexpr bool kKMins = T == GgmlType::Q2_K || T == GgmlType::Q4_K || T == GgmlType::Q5_K;
template <GgmlType T>
constexpr size_t kKBlockBytes = T == GgmlType::Q2_K   ? sizeof(block_q2_K)
                                : T == GgmlType::Q3_K ? sizeof(block_q3_K)
                                : T == GgmlType::Q4_K ? sizeof(block_q4_K)
                                : T == GgmlType::Q5_K ? sizeof(block_q5_K)
                                                      : sizeof(block_q6_K);

// ---------------------------------------------------------------------------------------------
// Row-direct kernels for few activation columns (the GEMV of decoding). The integer part runs
// one weight row at a time with lanes as elements: a row's block is unpacked in registers with
// in-lane shifts and masks (256-bit vectors at both levels; no transposition) and dotted with
// every column. The signed formats use the sign trick (|w| against y with w's sign), exact
// because quantize_row never produces -128. The float part must be the tiles' (batch
// invariance), so eight rows go together: each block's integer vectors of the eight rows are
// reduced to one exact total per row, and the tiles' per-lane formula runs with the rows as
// lanes. The eight rows are r, r + S, ..., r + 7S (see lane_spacing), so that each lane reads its
// own stretch of the weights front to back: interleaving rows that share 4 KiB pages defeats the
// hardware prefetchers and halves the speed from DRAM.

// Exact int32 totals of eight vectors: lane i of the result is the sum of v[i]'s eight lanes.
inline __m256i hsum8x8_epi32(const __m256i* v) {
    const __m256i ab =
        _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    const __m256i cd =
        _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(ab, cd, 0x20),
                            _mm256_permute2x128_si256(ab, cd, 0x31));
}
// The f16 values in the low (high) halves of the eight 32-bit lanes, as floats.
inline __m256 f16_lo8(__m256i a) {
    const __m256i p = _mm256_shuffle_epi8(
        a, _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1, 0, 1, 4, 5, 8,
                            9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1));
    return _mm256_cvtph_ps(_mm256_castsi256_si128(_mm256_permute4x64_epi64(p, 0x08)));
}
inline __m256 f16_hi8(__m256i a) {
    return f16_lo8(_mm256_srli_epi32(a, 16));
}
// The 32-bit word at byte `at` of each of the eight rows.
inline __m256i words8(const uint8_t* const* rows, size_t at) {
    return _mm256_setr_epi32(load_i32(rows[0] + at), load_i32(rows[1] + at), load_i32(rows[2] + at),
                             load_i32(rows[3] + at), load_i32(rows[4] + at), load_i32(rows[5] + at),
                             load_i32(rows[6] + at), load_i32(rows[7] + at));
}
inline __m256i bytes_mask(uint8_t m) {
    return _mm256_set1_epi8(char(m));
}
// Bits from..from+width-1 of every byte moved to to..to+width-1, others clear.
inline __m256i ymove_bits(__m256i v, int from, int to, int width) {
    const __m256i s =
        to >= from ? _mm256_slli_epi16(v, to - from) : _mm256_srli_epi16(v, from - to);
    return _mm256_and_si256(s, bytes_mask(uint8_t(((1u << width) - 1) << to)));
}
// 32 bits -> 32 bytes, 0xFF where the bit is set (bit j -> byte j).
inline __m256i bits_to_bytes(uint32_t x) {
    const __m256i spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(int(x)), _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                                     0x0101010101010101, 0x0000000000000000));
    const __m256i probe = _mm256_set1_epi64x(0x8040201008040201);
    return _mm256_cmpeq_epi8(_mm256_and_si256(spread, probe), probe);
}
// Signed weights against signed activations: |w| . (y with w's sign).
template <class I>
inline __m256i ydot_signed(__m256i acc, __m256i ws, __m256i y) {
    return I::ydot(acc, _mm256_abs_epi8(ws), _mm256_sign_epi8(y, ws));
}

// The spacing S, in rows, of the rows that one row-direct step reads together: the rows go in
// bands of lanes x S rows, lane i reading rows i*S .. i*S + S-1 of each band. About 64 KiB (or
// nrows / lanes when smaller) keeps the lanes' streams apart in their own pages yet near each
// other (lanes megabytes apart ran up to 30% slower from DRAM), and S is raised until the lanes'
// bytes at one offset fall in different L1 sets (rows a multiple of 4 KiB apart all compete for
// one set of eight ways). A row stride that is a multiple of 4 KiB leaves no choice there.
inline int lane_spacing(int nrows, int lanes, size_t w_stride) {
    if (nrows <= 1 || w_stride == 0) return 1;
    // Bands of equal size (a short last band would leave lanes idle).
    const size_t target = std::max<size_t>(1, (size_t(64) << 10) / w_stride);
    const size_t bands = std::max<size_t>(1, size_t(nrows) / (size_t(lanes) * target));
    const int S = int((size_t(nrows) + size_t(lanes) * bands - 1) / (size_t(lanes) * bands));
    for (int s = S; s < S + 64; ++s) {
        uint64_t used = 0;  // the 64 sets of 64 bytes in 4 KiB
        int i = 0;
        for (; i < lanes; ++i) {
            const uint64_t set = uint64_t(1) << (size_t(i) * size_t(s) * w_stride % 4096 / 64);
            if (used & set) break;
            used |= set;
        }
        if (i == lanes) return s;
    }
    return S;
}

// Calls fn(row0, S) for every step: lane i takes row row0 + i * S (see lane_spacing), and
// lanes whose row is past the last one take row0's.
template <typename F>
inline void lane_steps(int nrows, int lanes, size_t w_stride, F&& fn) {
    const int S = lane_spacing(nrows, lanes, w_stride);
    for (int band = 0; band < nrows; band += lanes * S)
        for (int t = 0; t < S && band + t < nrows; ++t) fn(band + t, S);
}

// Calls fn.template operator()<G>(rows, c0, f) for every step of eight rows (see above) and
// group of <= kG columns; lane i of f[g] is then stored to out[(c0 + g) * out_stride + row i].
// Lanes past the last row repeat the step's first row; their results are not stored.
template <int kG, typename F>
inline void row_direct(int nrows, int ncols, const uint8_t* w, size_t w_stride, float* out,
                       size_t out_stride, F&& fn) {
    lane_steps(nrows, 8, w_stride, [&](int r0, int S) {
        const uint8_t* rows[8];
        for (int i = 0; i < 8; ++i) {
            const int r = r0 + i * S;
            rows[i] = w + size_t(r < nrows ? r : r0) * w_stride;
        }
        for_col_groups<kG>(ncols, [&]<int G>(int c0) {
            __m256 f[G];
            fn.template operator()<G>(rows, c0, f);
            for (int g = 0; g < G; ++g) {
                alignas(32) float v[8];
                _mm256_store_ps(v, f[g]);
                for (int i = 0; i < 8 && r0 + i * S < nrows; ++i)
                    out[size_t(c0 + g) * out_stride + size_t(r0 + i * S)] = v[i];
            }
        });
    });
}

// The 32 quants of a 32-element block in element order: unsigned (min formats) or signed
// (offset formats, for the sign trick).
template <GgmlType T>
inline __m256i rd_legacy_quants(const uint8_t* x) {
    if constexpr (T == GgmlType::Q8_0) {
        return _mm256_loadu_si256((const __m256i*)(x + 2));
    } else {
        constexpr size_t qs_off = T == GgmlType::Q4_0   ? 2
                                  : T == GgmlType::Q4_1 ? 4
                                  : T == GgmlType::Q5_0 ? 6
                                                        : 8;
        // The 16 bytes in both halves (a load, no shuffle), the high half shifted by a nibble.
        const __m256i q =
            _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)(x + qs_off)));
        __m256i w = _mm256_and_si256(
            _mm256_srlv_epi32(q, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4)), bytes_mask(0x0F));
        if constexpr (T == GgmlType::Q5_0 || T == GgmlType::Q5_1) {
            const uint32_t qh = uint32_t(load_i32(x + (T == GgmlType::Q5_0 ? 2 : 4)));
            w = _mm256_or_si256(w, _mm256_and_si256(bits_to_bytes(qh), bytes_mask(0x10)));
        }
        if constexpr (kOffset<T> != 0) w = _mm256_sub_epi8(w, _mm256_set1_epi8(char(kOffset<T>)));
        return w;
    }
}

// Eight rows against columns c0..c0+G-1, block after block: legacy_block's formula on the rows'
// lanes, in double: t = fma(isum, d * dy, t), then for Q4_1/Q5_1 t = fma(m, s, t); f = float(t).
template <class I, GgmlType T, int G>
void rd_legacy(int64_t nb, const uint8_t* const* rows, const ActQ8& act, int c0, __m256* f) {
    typename I::D8 sum[G];
    for (int g = 0; g < G; ++g) sum[g] = I::d8_zero();
    for (int64_t b = 0; b < nb; ++b) {
        const size_t at = size_t(b) * kBlockBytes<T>;
        const __m256i dm = words8(rows, at);  // d (and m) of each row's block
        __m256i isum[G][8];
        for (int i = 0; i < 8; ++i) {
            const __m256i w = rd_legacy_quants<T>(rows[i] + at);
            for (int g = 0; g < G; ++g) {
                const __m256i y = _mm256_loadu_si256((const __m256i*)act.qs(c0 + g, b));
                if constexpr (kHasMin<T>) {
                    isum[g][i] = I::ydot(_mm256_setzero_si256(), w, y);
                } else {
                    isum[g][i] = ydot_signed<I>(_mm256_setzero_si256(), w, y);
                }
            }
        }
        const __m256 d = f16_lo8(dm);
        __m256 m;
        if constexpr (kHasMin<T>) m = f16_hi8(dm);
        for (int g = 0; g < G; ++g) {  // exact products, rounded sums (see the file's header)
            const size_t ci = act.idx(c0 + g, b);
            const __m256 dd = _mm256_mul_ps(d, _mm256_set1_ps(act.dy[ci]));
            sum[g] = I::d8_add(sum[g], I::d8_mul(I::d8_i32(hsum8x8_epi32(isum[g])), I::d8_ps(dd)));
            if constexpr (kHasMin<T>)
                sum[g] = I::d8_add(sum[g], I::d8_ps(_mm256_mul_ps(m, _mm256_set1_ps(act.ds[ci]))));
        }
    }
    for (int g = 0; g < G; ++g) f[g] = I::d8_cvt_ps(sum[g]);
}

// The 12 scale bytes of Q4_K/Q5_K -> bytes 0..7: the 6-bit scales, 8..15: the 6-bit mins,
// computed on 32-bit words (a = bytes 0..3, b = 4..7, c = 8..11): scale j < 4 is a's byte j,
// min j < 4 is b's; for j >= 4 the low four bits come from c's byte j-4 (low nibble: scale,
// high: min), the top two from the top bits of a's (scale) or b's (min) byte j-4.
inline __m128i k4_scales_mins(const uint8_t* s) {
    const uint32_t a = uint32_t(load_i32(s)), b = uint32_t(load_i32(s + 4)),
                   c = uint32_t(load_i32(s + 8));
    const uint32_t sc_lo = a & 0x3F3F3F3Fu, m_lo = b & 0x3F3F3F3Fu;
    const uint32_t sc_hi = (c & 0x0F0F0F0Fu) | ((a >> 2) & 0x30303030u);
    const uint32_t m_hi = ((c >> 4) & 0x0F0F0F0Fu) | ((b >> 2) & 0x30303030u);
    return _mm_set_epi32(int(m_hi), int(m_lo), int(sc_hi), int(sc_lo));
}
// The 12 scale bytes of Q3_K -> the 16 signed scales (6-bit value - 32), as unpack_q3k_scales.
inline __m128i q3k_scales(const uint8_t* s) {
    const uint32_t a = uint32_t(load_i32(s)), b = uint32_t(load_i32(s + 4)),
                   c = uint32_t(load_i32(s + 8));
    const uint32_t m4 = 0x0F0F0F0Fu, m2 = 0x03030303u;
    const uint32_t w0 = (a & m4) | ((c & m2) << 4), w1 = (b & m4) | (((c >> 2) & m2) << 4);
    const uint32_t w2 = ((a >> 4) & m4) | (((c >> 4) & m2) << 4),
                   w3 = ((b >> 4) & m4) | (((c >> 6) & m2) << 4);
    return _mm_sub_epi8(_mm_set_epi32(int(w3), int(w2), int(w1), int(w0)), _mm_set1_epi8(32));
}

// The 16-bit multipliers of the maddubs products (16 per 32 elements), built once per block:
// each 128-bit lane of `lo` holds scales 0..7 (as 16-bit values), of `hi` scales 8..15; an
// in-lane byte shuffle then picks a sub-block's scale for every product.
struct ScaleLanes {
    __m256i lo, hi;
    explicit ScaleLanes(__m256i s16)  // 16 scales as 16-bit values
        : lo(_mm256_permute2x128_si256(s16, s16, 0x00)),
          hi(_mm256_permute2x128_si256(s16, s16, 0x11)) {}
    // Sub-blocks of 16 elements: [scale 2p x 8 | scale 2p+1 x 8].
    __m256i pair(int p) const {
        const int a = (2 * p) % 8, b = (2 * p + 1) % 8;
        const __m256i ctrl = _mm256_setr_epi8(
            char(2 * a), char(2 * a + 1), char(2 * a), char(2 * a + 1), char(2 * a),
            char(2 * a + 1), char(2 * a), char(2 * a + 1), char(2 * a), char(2 * a + 1),
            char(2 * a), char(2 * a + 1), char(2 * a), char(2 * a + 1), char(2 * a),
            char(2 * a + 1), char(2 * b), char(2 * b + 1), char(2 * b), char(2 * b + 1),
            char(2 * b), char(2 * b + 1), char(2 * b), char(2 * b + 1), char(2 * b),
            char(2 * b + 1), char(2 * b), char(2 * b + 1), char(2 * b), char(2 * b + 1),
            char(2 * b), char(2 * b + 1));
        return _mm256_shuffle_epi8(p < 4 ? lo : hi, ctrl);
    }
    // Sub-blocks of 32 elements (scales 0..7 only): scale j x 16.
    __m256i single(int j) const {
        return _mm256_shuffle_epi8(lo, _mm256_set1_epi16(short((2 * j + 1) << 8 | 2 * j)));
    }
};

// The integer sums of one row's block x (block b) against columns c0..c0+G-1, as vectors whose
// lanes add up to them: isum, the sub-block sums times their scales with the offsets (Q3_K, Q6_K)
// in its start, and for the formats with mins msum = sum(min_j * bsum_j).
template <class I, GgmlType T, int G>
inline void rd_k_ints(const uint8_t* x, int64_t b, const ActQ8K& act, int c0, __m256i* isum_out,
                      __m256i* msum) {
    const block_q8_K* y[G];
    __m256i isum[G], isum2[G];  // two chains of sub-blocks (even, odd), added at the end
    for (int g = 0; g < G; ++g) y[g] = act.blk(c0 + g, b);
    // Elements e..e+31 of the block into chain `odd`.
    auto madd_q = [&](__m256i q, int e, __m256i scale, bool odd) {
        for (int g = 0; g < G; ++g) {
            const __m256i p =
                _mm256_maddubs_epi16(q, _mm256_loadu_si256((const __m256i*)(y[g]->qs + e)));
            if (odd) {
                isum2[g] = I::ydot16(isum2[g], p, scale);
            } else {
                isum[g] = I::ydot16(isum[g], p, scale);
            }
        }
    };
    for (int g = 0; g < G; ++g) isum2[g] = _mm256_setzero_si256();
    if constexpr (T == GgmlType::Q4_K || T == GgmlType::Q5_K) {
        const __m128i scm = k4_scales_mins(x + 4);  // scales 0..7, mins 0..7
        const __m128i mins16 = _mm_cvtepu8_epi16(_mm_srli_si128(scm, 8));
        const ScaleLanes scl(_mm256_cvtepu8_epi16(scm));
        for (int g = 0; g < G; ++g) {
            isum[g] = _mm256_setzero_si256();
            const __m256i bs = _mm256_loadu_si256((const __m256i*)y[g]->bsums);
            const __m128i bs32 =
                _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
            msum[g] = _mm256_set_m128i(_mm_setzero_si128(), _mm_madd_epi16(mins16, bs32));
        }
        const uint8_t* qs = x + (T == GgmlType::Q4_K ? 16 : 48);
        __m256i hb;
        if constexpr (T == GgmlType::Q5_K) hb = _mm256_loadu_si256((const __m256i*)(x + 16));
        for (int c = 0; c < 4; ++c) {
            const __m256i q = _mm256_loadu_si256((const __m256i*)(qs + 32 * c));
            __m256i lo = _mm256_and_si256(q, bytes_mask(0x0F));
            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), bytes_mask(0x0F));
            if constexpr (T == GgmlType::Q5_K) {  // bit g of qh[l] is the fifth bit of sub-block g
                lo = _mm256_or_si256(lo, ymove_bits(hb, 2 * c, 4, 1));
                hi = _mm256_or_si256(hi, ymove_bits(hb, 2 * c + 1, 4, 1));
            }
            madd_q(lo, 64 * c, scl.single(2 * c), false);
            madd_q(hi, 64 * c + 32, scl.single(2 * c + 1), true);
        }
    } else if constexpr (T == GgmlType::Q6_K) {
        const auto* blk = reinterpret_cast<const block_q6_K*>(x);
        const __m256i s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)blk->scales));
        const ScaleLanes scl(s16);
        for (int g = 0; g < G; ++g) {  // the offset: -32 * sum_j scale_j * bsum_j
            const __m256i bs = _mm256_loadu_si256((const __m256i*)y[g]->bsums);
            isum[g] = _mm256_sub_epi32(_mm256_setzero_si256(),
                                       _mm256_slli_epi32(_mm256_madd_epi16(bs, s16), 5));
        }
        for (int h = 0; h < 2; ++h) {
            const __m256i l0 = _mm256_loadu_si256((const __m256i*)(blk->ql + 64 * h));
            const __m256i l1 = _mm256_loadu_si256((const __m256i*)(blk->ql + 64 * h + 32));
            const __m256i hq = _mm256_loadu_si256((const __m256i*)(blk->qh + 32 * h));
            const __m256i m4 = bytes_mask(0x0F);
            madd_q(_mm256_or_si256(_mm256_and_si256(l0, m4), ymove_bits(hq, 0, 4, 2)), 128 * h,
                   scl.pair(4 * h), false);
            madd_q(_mm256_or_si256(_mm256_and_si256(l1, m4), ymove_bits(hq, 2, 4, 2)), 128 * h + 32,
                   scl.pair(4 * h + 1), true);
            madd_q(_mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                   ymove_bits(hq, 4, 4, 2)),
                   128 * h + 64, scl.pair(4 * h + 2), false);
            madd_q(_mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                   ymove_bits(hq, 6, 4, 2)),
                   128 * h + 96, scl.pair(4 * h + 3), true);
        }
    } else if constexpr (T == GgmlType::Q3_K) {
        const auto* blk = reinterpret_cast<const block_q3_K*>(x);
        const __m256i s16 = _mm256_cvtepi8_epi16(q3k_scales(blk->scales));
        const ScaleLanes scl(s16);
        for (int g = 0; g < G; ++g) {  // the offset: -4 * sum_j scale_j * bsum_j
            const __m256i bs = _mm256_loadu_si256((const __m256i*)y[g]->bsums);
            isum[g] = _mm256_sub_epi32(_mm256_setzero_si256(),
                                       _mm256_slli_epi32(_mm256_madd_epi16(bs, s16), 2));
        }
        const __m256i hm = _mm256_loadu_si256((const __m256i*)blk->hmask);
        for (int h = 0; h < 2; ++h) {
            const __m256i q = _mm256_loadu_si256((const __m256i*)(blk->qs + 32 * h));
            for (int sh = 0; sh < 4; ++sh) {  // q + 4 = low two bits + 4 * hmask bit
                const __m256i v =
                    _mm256_or_si256(ymove_bits(q, 2 * sh, 0, 2), ymove_bits(hm, 4 * h + sh, 2, 1));
                madd_q(v, 128 * h + 32 * sh, scl.pair(4 * h + sh), sh & 1);
            }
        }
    } else {  // Q2_K
        const auto* blk = reinterpret_cast<const block_q2_K*>(x);
        const __m128i raw = _mm_loadu_si128((const __m128i*)blk->scales);
        const ScaleLanes scl(_mm256_cvtepu8_epi16(_mm_and_si128(raw, _mm_set1_epi8(0x0F))));
        const __m256i m16 =
            _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), _mm_set1_epi8(0x0F)));
        for (int g = 0; g < G; ++g) {
            isum[g] = _mm256_setzero_si256();
            const __m256i bs = _mm256_loadu_si256((const __m256i*)y[g]->bsums);
            msum[g] = _mm256_madd_epi16(m16, bs);
        }
        for (int h = 0; h < 2; ++h) {
            const __m256i q = _mm256_loadu_si256((const __m256i*)(blk->qs + 32 * h));
            for (int sh = 0; sh < 4; ++sh)
                madd_q(ymove_bits(q, 2 * sh, 0, 2), 128 * h + 32 * sh, scl.pair(4 * h + sh),
                       sh & 1);
        }
    }
    for (int g = 0; g < G; ++g) isum_out[g] = _mm256_add_epi32(isum[g], isum2[g]);
}

// Eight rows against columns c0..c0+G-1, block after block: KAccum::finish's formula on the
// rows' lanes, in double: s = fma(isum, d * dy, s), then with mins s = s - msum * (dmin * dy)
// (fused); f = float(s).
template <class I, GgmlType T, int G>
void rd_k(int64_t nb, const uint8_t* const* rows, const ActQ8K& act, int c0, __m256* f) {
    // Where the f16 d (low half; dmin in the high half) sits, as in decode_k_scales.
    constexpr size_t kD = T == GgmlType::Q2_K   ? 80
                          : T == GgmlType::Q3_K ? 106
                          : T == GgmlType::Q6_K ? 206
                                                : 0;
    typename I::D8 sum[G];
    for (int g = 0; g < G; ++g) sum[g] = I::d8_zero();
    for (int64_t b = 0; b < nb; ++b) {
        const size_t at = size_t(b) * kKBlockBytes<T>;
        __m256i isum[G][8], msum[G][8];
        for (int i = 0; i < 8; ++i) {
            __m256i is[G], ms[G];
            rd_k_ints<I, T, G>(rows[i] + at, b, act, c0, is, ms);
            for (int g = 0; g < G; ++g) {
                isum[g][i] = is[g];
                if constexpr (kKMins<T>) msum[g][i] = ms[g];
            }
        }
        const __m256i dd = words8(rows, at + kD);
        const typename I::D8 d =
            I::d8_ps(T == GgmlType::Q3_K || T == GgmlType::Q6_K ? f16_hi8(dd) : f16_lo8(dd));
        typename I::D8 dmin;
        if constexpr (kKMins<T>) dmin = I::d8_ps(f16_hi8(dd));
        for (int g = 0; g < G; ++g) {
            const double dy = act.blk(c0 + g, b)->d;
            sum[g] = I::d8_fmadd(I::d8_i32(hsum8x8_epi32(isum[g])), I::d8_mul(d, dy), sum[g]);
            if constexpr (kKMins<T>)
                sum[g] =
                    I::d8_fnmadd(I::d8_i32(hsum8x8_epi32(msum[g])), I::d8_mul(dmin, dy), sum[g]);
        }
    }
    for (int g = 0; g < G; ++g) f[g] = I::d8_cvt_ps(sum[g]);
}

template <class I, GgmlType T>
void tile_legacy(int64_t n, int nrows, int ncols, const void* w, size_t w_stride, const void* a,
                 size_t a_stride, float* out, size_t out_stride) {
    constexpr int kChunk = 8;  // blocks decoded at a time on the many-column path
    const int64_t nb = n / 32;
    const bool few = ncols <= row_cols<T>();
    const ActQ8 act = prepare_q8<I>(a, a_stride, ncols, nb, kHasMin<T>, !few);
    const auto* wb = static_cast<const uint8_t*>(w);
    if (few) {
        row_direct<I::kRowGroup>(nrows, ncols, wb, w_stride, out, out_stride,
                                 [&]<int G>(const uint8_t* const* rows, int c0, __m256* f) {
                                     rd_legacy<I, T, G>(nb, rows, act, c0, f);
                                 });
        return;
    }
    thread_local std::vector<double> accv;
    double* acc = scratch(accv, size_t(ncols) * I::L);
    for (int r0 = 0; r0 < nrows; r0 += I::L) {
        const typename I::Rows rows(wb + size_t(r0) * w_stride, w_stride,
                                    std::min(I::L, nrows - r0));
        float* o = out + r0;
        alignas(64) LegacyBlock<I> blk[kChunk];
        if (nb == 0) zero_tile<I>(o, out_stride, ncols, rows.nvalid);
        for (int64_t b0 = 0; b0 < nb; b0 += kChunk) {
            const int nbc = int(std::min<int64_t>(kChunk, nb - b0));
            const bool first = b0 == 0, last = b0 + nbc == nb;
            for (int i = 0; i < nbc; ++i) decode_legacy<I, T>(rows, b0 + i, blk[i]);
            for_col_groups<I::kLegacyCols>(ncols, [&]<int G>(int c0) {
                legacy_chunk_cols<I, T, G>(blk, nbc, b0, act, c0, acc, first, last, o, out_stride,
                                           rows.nvalid);
            });
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The K-quants: 256-element blocks of 8 (Q4_K, Q5_K) or 16 (Q2_K, Q3_K, Q6_K) scaled
// sub-blocks. Each sub-block's integer sum is multiplied by its integer scale and added up
// exactly (as the row-direct kernels do), then scaled by d in float; the mins are one more integer
// dot product (16-bit mins with the activation's 16-bit bsums); the offsets of Q3_K (q - 4) and
// Q6_K (q - 32) start each sub-block sum at -offset * bsum.

template <class I>
struct KScales {
    typename I::VI sc[16];         // the integer scale of each sub-block (signed for Q3_K, Q6_K)
    typename I::VI mins[8];        // 16-bit pairs of mins, matched to 32-bit words of the bsums
    typename I::VD d[2], dmin[2];  // lanes 0..L/2-1 and L/2..L-1
};

template <class I, GgmlType T>
inline void decode_k_scales(const typename I::Rows& rows, int64_t b, KScales<I>& out) {
    using VI = typename I::VI;
    const size_t at = size_t(b) * kKBlockBytes<T>;
    if constexpr (T == GgmlType::Q4_K || T == GgmlType::Q5_K) {
        const VI dd = rows.gather(at);
        to_pd<I>(I::half_lo(dd), out.d);
        to_pd<I>(I::half_hi(dd), out.dmin);
        // 6-bit scales and mins: bytes 0..3 low six bits are sc0..3, bytes 4..7 m0..3; bytes
        // 8..11 hold the low four bits of sc4..7 / m4..7, their top two bits are bytes 0..7's.
        const VI s0 = rows.gather(at + 4), s1 = rows.gather(at + 8), s2 = rows.gather(at + 12);
        const VI sc_lo = I::and_(s0, I::set1_i8(0x3F)), m_lo = I::and_(s1, I::set1_i8(0x3F));
        const VI sc_hi = I::or_(low_nibbles<I>(s2), move_bits<I>(s0, 6, 4, 2));
        const VI m_hi = I::or_(high_nibbles<I>(s2), move_bits<I>(s1, 6, 4, 2));
        for (int j = 0; j < 4; ++j) {
            out.sc[j] = byte_of<I>(sc_lo, j);
            out.sc[j + 4] = byte_of<I>(sc_hi, j);
            const VI x = byte_of<I>(m_lo, j), y = byte_of<I>(m_hi, j);
            out.mins[j] = I::or_(x, I::slli32(x, 16));
            out.mins[j + 4] = I::or_(y, I::slli32(y, 16));
        }
    } else if constexpr (T == GgmlType::Q6_K) {
        to_pd<I>(I::half_hi(rows.gather(at + 206)), out.d);
        for (int i = 0; i < 4; ++i) {
            const VI g = rows.gather(at + 192 + 4 * i);
            for (int j = 0; j < 4; ++j) out.sc[4 * i + j] = I::srai32(I::slli32(g, 24 - 8 * j), 24);
        }
    } else if constexpr (T == GgmlType::Q3_K) {
        to_pd<I>(I::half_hi(rows.gather(at + 106)), out.d);
        const VI a = rows.gather(at + 96), bb = rows.gather(at + 100), c = rows.gather(at + 104);
        // Scale j: low four bits from byte j % 8 (low nibble for j < 8, high for j >= 8), top two
        // bits from byte 8 + j % 4 at bit 2 * (j / 4).
        const VI lows[4] = {low_nibbles<I>(a), low_nibbles<I>(bb), high_nibbles<I>(a),
                            high_nibbles<I>(bb)};
        for (int t = 0; t < 4; ++t) {
            const VI sc = I::or_(lows[t], move_bits<I>(c, 2 * t, 4, 2));  // scale + 32
            for (int j = 0; j < 4; ++j)
                out.sc[4 * t + j] = I::sub32(byte_of<I>(sc, j), I::set1_i32(32));
        }
    } else {  // Q2_K: scale in the low nibble, min in the high nibble of scales[j]
        const VI dd = rows.gather(at + 80);
        to_pd<I>(I::half_lo(dd), out.d);
        to_pd<I>(I::half_hi(dd), out.dmin);
        for (int i = 0; i < 4; ++i) {
            const VI g = rows.gather(at + 4 * i);
            for (int j = 0; j < 4; ++j)
                out.sc[4 * i + j] = I::and_(byte_of<I>(g, j), I::set1_i32(15));
            for (int p = 0; p < 2; ++p) {  // mins of sub-blocks 4i+2p and 4i+2p+1
                const VI x = I::srli32(g, 16 * p);
                out.mins[2 * i + p] = I::or_(I::and_(I::srli32(x, 4), I::set1_i32(0x0F)),
                                             I::and_(I::slli32(x, 4), I::set1_i32(0xF0000)));
            }
        }
    }
}

// Unpacks the quants of block b of the tile's rows and calls fn(k, w) for the element groups
// k = 0..63 in order (w: the unsigned quants of elements 4k..4k+3 of every row).
template <class I, GgmlType T, typename F>
inline void decode_k_quants(const typename I::Rows& rows, int64_t b, F&& fn) {
    using VI = typename I::VI;
    const size_t at = size_t(b) * kKBlockBytes<T>;
    if constexpr (T == GgmlType::Q4_K || T == GgmlType::Q5_K) {
        constexpr size_t qs = T == GgmlType::Q4_K ? 16 : 48;
        VI h[8];
        if constexpr (T == GgmlType::Q5_K) {  // fifth bit of sub-block g: bit g of qh[l]
            rows.transpose16(at + 16, h);
            rows.transpose16(at + 32, h + 4);
        }
        for (int c = 0; c < 4; ++c) {  // qs[32c..32c+31]: sub-block 2c (low nibbles), 2c+1 (high)
            VI p[8];
            rows.transpose16(at + qs + 32 * c, p);
            rows.transpose16(at + qs + 32 * c + 16, p + 4);
            for (int k = 0; k < 8; ++k) {
                VI lo = low_nibbles<I>(p[k]);
                if constexpr (T == GgmlType::Q5_K) lo = I::or_(lo, move_bits<I>(h[k], 2 * c, 4, 1));
                fn(16 * c + k, lo);
            }
            for (int k = 0; k < 8; ++k) {
                VI hi = high_nibbles<I>(p[k]);
                if constexpr (T == GgmlType::Q5_K)
                    hi = I::or_(hi, move_bits<I>(h[k], 2 * c + 1, 4, 1));
                fn(16 * c + 8 + k, hi);
            }
        }
    } else if constexpr (T == GgmlType::Q6_K) {
        // Element 128h + r: low four bits are nibble r / 64 of ql[64h + r % 64], the top two are
        // bits 2 * (r / 32) of qh[32h + r % 32].
        for (int half = 0; half < 2; ++half) {
            VI l[16], hb[8];
            for (int t = 0; t < 4; ++t) rows.transpose16(at + 64 * half + 16 * t, l + 4 * t);
            rows.transpose16(at + 128 + 32 * half, hb);
            rows.transpose16(at + 128 + 32 * half + 16, hb + 4);
            for (int kk = 0; kk < 32; ++kk) {
                const VI lv = l[kk % 16];
                const VI lo = kk < 16 ? low_nibbles<I>(lv) : high_nibbles<I>(lv);
                fn(32 * half + kk, I::or_(lo, move_bits<I>(hb[kk % 8], 2 * (kk / 8), 4, 2)));
            }
        }
    } else if constexpr (T == GgmlType::Q3_K) {
        // Element 128h + 32s + l: bits 2s..2s+1 of qs[32h + l], plus 4 when bit 4h + s of
        // hmask[l] is set (q + 4, 0..7).
        VI m[8];
        rows.transpose16(at, m);
        rows.transpose16(at + 16, m + 4);
        for (int half = 0; half < 2; ++half) {
            VI q[8];
            rows.transpose16(at + 32 + 32 * half, q);
            rows.transpose16(at + 48 + 32 * half, q + 4);
            for (int kk = 0; kk < 32; ++kk) {
                const int s = kk / 8;
                const VI lo = move_bits<I>(q[kk % 8], 2 * s, 0, 2);
                fn(32 * half + kk, I::or_(lo, move_bits<I>(m[kk % 8], 4 * half + s, 2, 1)));
            }
        }
    } else {  // Q2_K: element 128h + 32s + l is bits 2s..2s+1 of qs[32h + l]
        for (int half = 0; half < 2; ++half) {
            VI q[8];
            rows.transpose16(at + 16 + 32 * half, q);
            rows.transpose16(at + 32 + 32 * half, q + 4);
            for (int kk = 0; kk < 32; ++kk)
                fn(32 * half + kk, move_bits<I>(q[kk % 8], 2 * (kk / 8), 0, 2));
        }
    }
}

// The K-quant dot products of one block for columns c0..c0+G-1, given the quants as
// quant(k) for k = 0..63: fb[g] accumulates sum over sub-blocks of d*scale*sum, minus the mins.
template <class I, GgmlType T, int G>
struct KAccum {
    using VI = typename I::VI;
    using VF = typename I::VF;
    static constexpr int K = 64 / kSubBlocks<T>;  // element groups per sub-block
    const KScales<I>& S;
    const ActQ8K& act;
    int64_t b;
    int c0;
    const int8_t* y[G];
    VI acc[G];   // the current sub-block's sum
    VI isum[G];  // sum of scale * sub-block sum, exact

    KAccum(const KScales<I>& s, const ActQ8K& a, int64_t blk, int col0)
        : S(s), act(a), b(blk), c0(col0) {
        for (int g = 0; g < G; ++g) {
            y[g] = act.blk(c0 + g, b)->qs;
            acc[g] = I::zero();  // set again at each sub-block's start; this keeps GCC sure of it
            isum[g] = I::zero();
        }
    }
    inline void operator()(int k, VI wk) {
        const int j = k / K;
        if (k % K == 0) {
            for (int g = 0; g < G; ++g) {
                if constexpr (kKOffset<T> != 0) {
                    acc[g] = I::set1_i32(act.corr_of(c0 + g, b)[j]);
                } else {
                    acc[g] = I::zero();
                }
            }
        }
        for (int g = 0; g < G; ++g) acc[g] = I::dot4(acc[g], wk, y[g] + 4 * k);
        if (k % K == K - 1) {
            for (int g = 0; g < G; ++g) isum[g] = I::add32(isum[g], I::mullo32(acc[g], S.sc[j]));
        }
    }
    // In double: f[g] = fma(isum, d * dy, f[g]), then f[g] = fma(-msum, dmin * dy, f[g]) with
    // msum = sum(mins * bsums): the row-direct kernels' chain.
    inline void finish(typename I::VD (*f)[2]) {
        using VD = typename I::VD;
        for (int g = 0; g < G; ++g) {
            const block_q8_K* yb = act.blk(c0 + g, b);
            const VD dy = I::set1_pd(yb->d);
            f[g][0] = I::fmadd_pd(I::cvt_lo_pd(isum[g]), I::mul_pd(S.d[0], dy), f[g][0]);
            f[g][1] = I::fmadd_pd(I::cvt_hi_pd(isum[g]), I::mul_pd(S.d[1], dy), f[g][1]);
            if constexpr (kKMins<T>) {
                VI m = I::zero();
                for (int i = 0; i < 8; ++i) m = I::dot_pairs16(m, S.mins[i], yb->bsums + 2 * i);
                f[g][0] = I::fnmadd_pd(I::cvt_lo_pd(m), I::mul_pd(S.dmin[0], dy), f[g][0]);
                f[g][1] = I::fnmadd_pd(I::cvt_hi_pd(m), I::mul_pd(S.dmin[1], dy), f[g][1]);
            }
        }
    }
};

template <class I>
struct KBlock {
    typename I::VI w[64];
    KScales<I> s;
};

template <class I, GgmlType T, int G>
void k_block_cols(const KBlock<I>& B, int64_t b, const ActQ8K& act, int c0, double* sums,
                  bool first, bool last, float* out, size_t out_stride, int nvalid) {
    KAccum<I, T, G> acc(B.s, act, b, c0);
    for (int k = 0; k < 64; ++k) acc(k, B.w[k]);
    typename I::VD f[G][2];
    load_sums<I, G>(sums, c0, first, f);
    acc.finish(f);
    store_sums<I, G>(f, sums, c0, last, out, out_stride, nvalid);
}

template <class I, GgmlType T>
void tile_k(int64_t n, int nrows, int ncols, const void* w, size_t w_stride, const void* a,
            size_t a_stride, float* out, size_t out_stride) {
    const int64_t nb = n / QK_K;
    const auto* wb = static_cast<const uint8_t*>(w);
    if (ncols <= row_cols<T>()) {
        const ActQ8K act{static_cast<const uint8_t*>(a), a_stride, nb, nullptr};
        row_direct<I::kRowGroup>(nrows, ncols, wb, w_stride, out, out_stride,
                                 [&]<int G>(const uint8_t* const* rows, int c0, __m256* f) {
                                     rd_k<I, T, G>(nb, rows, act, c0, f);
                                 });
        return;
    }
    const ActQ8K act = prepare_q8k(a, a_stride, ncols, nb, kKOffset<T>);
    thread_local const std::unique_ptr<KBlock<I>> blk(new KBlock<I>);  // 6 KiB, per thread
    thread_local std::vector<double> sumv;
    double* sums = scratch(sumv, size_t(ncols) * I::L);
    for (int r0 = 0; r0 < nrows; r0 += I::L) {
        const typename I::Rows rows(wb + size_t(r0) * w_stride, w_stride,
                                    std::min(I::L, nrows - r0));
        float* o = out + r0;
        if (nb == 0) zero_tile<I>(o, out_stride, ncols, rows.nvalid);
        for (int64_t b = 0; b < nb; ++b) {
            decode_k_scales<I, T>(rows, b, blk->s);
            decode_k_quants<I, T>(rows, b, [&](int k, typename I::VI wk) { blk->w[k] = wk; });
            for_col_groups<I::kCols>(ncols, [&]<int G>(int c0) {
                k_block_cols<I, T, G>(*blk, b, act, c0, sums, b == 0, b == nb - 1, o, out_stride,
                                      rows.nvalid);
            });
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Float weights against float activations: lanes are elements, R x C accumulators.

// R weight rows x C activation rows, one accumulator vector per pair: the same arithmetic for
// every R and C (batch invariance).
template <class I, GgmlType T, int R, int C>
void float_block(int64_t n, const uint8_t* const* w, const float* const* a, float* out,
                 size_t out_stride) {
    using VF = typename I::VF;
    constexpr int L = I::L;
    VF acc[R][C];
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) acc[r][c] = I::zero_ps();
    int64_t i = 0;
    for (; i + L <= n; i += L) {
        VF av[C];
        for (int c = 0; c < C; ++c) av[c] = I::loadu_ps(a[c] + i);
        for (int r = 0; r < R; ++r) {
            const VF wv = I::template load_weights<T>(w[r], i);
            for (int c = 0; c < C; ++c) acc[r][c] = I::fmadd(wv, av[c], acc[r][c]);
        }
    }
    if (i < n) {  // the tail, zero-padded
        constexpr size_t es = T == GgmlType::F32 ? 4 : 2;
        alignas(64) uint8_t wt[L * 4];
        alignas(64) float at[L];
        VF av[C];
        for (int c = 0; c < C; ++c) {
            std::memset(at, 0, sizeof at);
            std::memcpy(at, a[c] + i, size_t(n - i) * 4);
            av[c] = I::loadu_ps(at);
        }
        for (int r = 0; r < R; ++r) {
            std::memset(wt, 0, sizeof wt);
            std::memcpy(wt, w[r] + size_t(i) * es, size_t(n - i) * es);
            const VF wv = I::template load_weights<T>(wt, 0);
            for (int c = 0; c < C; ++c) acc[r][c] = I::fmadd(wv, av[c], acc[r][c]);
        }
    }
    for (int r = 0; r < R; ++r) {
        for (int c = 0; c < C; ++c) {
            out[size_t(c) * out_stride + size_t(r)] = I::reduce_ps(acc[r][c]);
        }
    }
}

template <class I, GgmlType T, int R>
inline void float_cols(int64_t n, const uint8_t* const* w, const float* a, size_t a_stride,
                       int ncols, float* out, size_t out_stride) {
    constexpr int C = I::kFloatCols;
    int c0 = 0;
    const float* ap[C];
    for (; c0 + C <= ncols; c0 += C) {
        for (int c = 0; c < C; ++c)
            ap[c] = reinterpret_cast<const float*>(reinterpret_cast<const uint8_t*>(a) +
                                                   size_t(c0 + c) * a_stride);
        float_block<I, T, R, C>(n, w, ap, out + size_t(c0) * out_stride, out_stride);
    }
    for (; c0 < ncols; ++c0) {
        ap[0] = reinterpret_cast<const float*>(reinterpret_cast<const uint8_t*>(a) +
                                               size_t(c0) * a_stride);
        float_block<I, T, R, 1>(n, w, ap, out + size_t(c0) * out_stride, out_stride);
    }
}

template <class I, GgmlType T>
void tile_float(int64_t n, int nrows, int ncols, const void* w, size_t w_stride, const void* a,
                size_t a_stride, float* out, size_t out_stride) {
    constexpr int R = I::kFloatRows;
    const auto* wb = static_cast<const uint8_t*>(w);
    const auto* af = static_cast<const float*>(a);
    if (ncols == 1) {
        // GEMV: R rows at a time for R independent chains, each from its own stretch of rows
        // (lane_steps) so that each is its own sequential stream.
        lane_steps(nrows, R, w_stride, [&](int r0, int S) {
            const uint8_t* wp[R];
            for (int i = 0; i < R; ++i) {
                const int r = r0 + i * S;
                wp[i] = wb + size_t(r < nrows ? r : r0) * w_stride;
            }
            float v[R];
            float_block<I, T, R, 1>(n, wp, &af, v, 1);
            for (int i = 0; i < R && r0 + i * S < nrows; ++i) out[size_t(r0 + i * S)] = v[i];
        });
        return;
    }
    const uint8_t* wp[R];
    int r0 = 0;
    for (; r0 + R <= nrows; r0 += R) {
        for (int r = 0; r < R; ++r) wp[r] = wb + size_t(r0 + r) * w_stride;
        float_cols<I, T, R>(n, wp, af, a_stride, ncols, out + r0, out_stride);
    }
    for (; r0 < nrows; ++r0) {
        wp[0] = wb + size_t(r0) * w_stride;
        float_cols<I, T, 1>(n, wp, af, a_stride, ncols, out + r0, out_stride);
    }
}

// ---------------------------------------------------------------------------------------------
// Activation quantizers, bit-identical to quantize.cpp's reference code (same IEEE operations in
// the same order; the roundings are emulated exactly). 256-bit code, shared by both levels.

inline float hmax8(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}
inline int hsum8i(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 1)));
}
inline __m256 abs8(__m256 v) {
    return _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF)));
}

// C's roundf (half away from zero): truncate, then step away from zero when the dropped
// fraction (exact: v - trunc(v)) is at least one half. For |v| < 2^23.
inline __m256 round_half_away(__m256 v) {
    const __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 away = _mm256_cmp_ps(abs8(_mm256_sub_ps(v, t)), _mm256_set1_ps(0.5f), _CMP_GE_OQ);
    const __m256 one =
        _mm256_or_ps(_mm256_set1_ps(1.0f),
                     _mm256_andnot_ps(_mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF)), v));
    return _mm256_add_ps(t, _mm256_and_ps(away, one));
}
// q8_clamp of quantize.cpp: NaN -> 0, then clamp to [-127, 127].
inline __m256 clamp127(__m256 v) {
    v = _mm256_and_ps(v, _mm256_cmp_ps(v, v, _CMP_ORD_Q));
    return _mm256_min_ps(_mm256_max_ps(v, _mm256_set1_ps(-127.0f)), _mm256_set1_ps(127.0f));
}
// Four vectors of 8 int32 (each within int8) -> 32 int8 in order.
inline __m256i pack_i8(__m256i a, __m256i b, __m256i c, __m256i d) {
    const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, d));
    return _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// Q8_0 / Q8_1: d = amax / 127, q = roundf(x / d) (x * (1/d)); Q8_1 adds s = f16(sum(q) * d).
template <bool kQ8_1>
void quantize_q8(const float* x, void* dst, int64_t n) {
    using Block = std::conditional_t<kQ8_1, block_q8_1, block_q8_0>;
    auto* y = static_cast<Block*>(dst);
    for (int64_t b = 0; b < n / 32; ++b, x += 32) {
        __m256 v[4];
        __m256 m = _mm256_setzero_ps();
        for (int k = 0; k < 4; ++k) {
            v[k] = _mm256_loadu_ps(x + 8 * k);
            m = _mm256_max_ps(m, abs8(v[k]));
        }
        const float amax = hmax8(m);
        const float d = amax / 127;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = f32_to_f16(d);
        __m256i q[4];
        for (int k = 0; k < 4; ++k) {
            q[k] = _mm256_cvttps_epi32(
                clamp127(round_half_away(_mm256_mul_ps(v[k], _mm256_set1_ps(id)))));
        }
        _mm256_storeu_si256((__m256i*)y[b].qs, pack_i8(q[0], q[1], q[2], q[3]));
        if constexpr (kQ8_1) {
            const int sum = hsum8i(
                _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
            y[b].s = f32_to_f16(float(sum) * d);
        }
    }
}

// Q8_K: iscale = -127 / (the first value of largest magnitude), q = min(127, rint(iscale * x)),
// d = 1 / iscale, bsums = sums of 16 quants.
inline void quantize_q8_K(const float* x, void* dst, int64_t n) {
    auto* y = static_cast<block_q8_K*>(dst);
    for (int64_t b = 0; b < n / QK_K; ++b, x += QK_K) {
        __m256 m = _mm256_setzero_ps();
        for (int k = 0; k < 32; ++k) m = _mm256_max_ps(m, abs8(_mm256_loadu_ps(x + 8 * k)));
        const float amax = hmax8(m);
        if (amax == 0.0f) {
            std::memset(&y[b], 0, sizeof(block_q8_K));
            continue;
        }
        float max = 0.0f;
        for (int k = 0; k < 32; ++k) {
            const int hit = _mm256_movemask_ps(
                _mm256_cmp_ps(abs8(_mm256_loadu_ps(x + 8 * k)), _mm256_set1_ps(amax), _CMP_EQ_OQ));
            if (hit) {
                max = x[8 * k + __builtin_ctz(unsigned(hit))];
                break;
            }
        }
        const float iscale = -127.f / max;
        const __m256 is = _mm256_set1_ps(iscale);
        for (int k = 0; k < 8; ++k) {  // 32 quants at a time
            __m256i q[4];
            for (int j = 0; j < 4; ++j) {
                const __m256 v = clamp127(_mm256_mul_ps(is, _mm256_loadu_ps(x + 32 * k + 8 * j)));
                q[j] = _mm256_cvtps_epi32(
                    _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
            }
            _mm256_storeu_si256((__m256i*)(y[b].qs + 32 * k), pack_i8(q[0], q[1], q[2], q[3]));
            y[b].bsums[2 * k] = int16_t(hsum8i(_mm256_add_epi32(q[0], q[1])));
            y[b].bsums[2 * k + 1] = int16_t(hsum8i(_mm256_add_epi32(q[2], q[3])));
        }
        y[b].d = 1 / iscale;
    }
}

// F16 with round to nearest even (F16C), NaNs as f32_to_f16 writes them (sign | 0x7E00).
inline void quantize_f16(const float* x, void* dst, int64_t n) {
    auto* y = static_cast<uint8_t*>(dst);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __m256i nan32 = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        const __m128i nan =
            _mm_packs_epi32(_mm256_castsi256_si128(nan32), _mm256_extracti128_si256(nan32, 1));
        if (!_mm_testz_si128(nan, nan)) {
            const __m128i sign = _mm_and_si128(h, _mm_set1_epi16(short(0x8000)));
            h = _mm_blendv_epi8(h, _mm_or_si128(sign, _mm_set1_epi16(0x7E00)), nan);
        }
        _mm_storeu_si128((__m128i*)(y + 2 * i), h);
    }
    for (; i < n; ++i) {
        const uint16_t h = f32_to_f16(x[i]);
        std::memcpy(y + 2 * i, &h, 2);
    }
}

// BF16: round to nearest even on the bits; NaNs quieted (| 0x40), as f32_to_bf16.
inline void quantize_bf16(const float* x, void* dst, int64_t n) {
    auto* y = static_cast<uint8_t*>(dst);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256i v = _mm256_loadu_si256((const __m256i*)(x + i));
        const __m256i rounded = _mm256_srli_epi32(
            _mm256_add_epi32(v, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF),
                                                 _mm256_and_si256(_mm256_srli_epi32(v, 16),
                                                                  _mm256_set1_epi32(1)))),
            16);
        const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(v, 16), _mm256_set1_epi32(0x40));
        const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(v, _mm256_set1_epi32(0x7FFFFFFF)),
                                               _mm256_set1_epi32(0x7F800000));
        const __m256i r = _mm256_blendv_epi8(rounded, quiet, nan);
        const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
        _mm_storeu_si128((__m128i*)(y + 2 * i), _mm256_castsi256_si128(packed));
    }
    for (; i < n; ++i) {
        const uint16_t h = f32_to_bf16(x[i]);
        std::memcpy(y + 2 * i, &h, 2);
    }
}

// ---------------------------------------------------------------------------------------------

template <class I>
KernelTable make_table() {
    KernelTable t;
    t.tile[int(GgmlType::F32)] = tile_float<I, GgmlType::F32>;
    t.tile[int(GgmlType::F16)] = tile_float<I, GgmlType::F16>;
    t.tile[int(GgmlType::BF16)] = tile_float<I, GgmlType::BF16>;
    t.tile[int(GgmlType::Q4_0)] = tile_legacy<I, GgmlType::Q4_0>;
    t.tile[int(GgmlType::Q4_1)] = tile_legacy<I, GgmlType::Q4_1>;
    t.tile[int(GgmlType::Q5_0)] = tile_legacy<I, GgmlType::Q5_0>;
    t.tile[int(GgmlType::Q5_1)] = tile_legacy<I, GgmlType::Q5_1>;
    t.tile[int(GgmlType::Q8_0)] = tile_legacy<I, GgmlType::Q8_0>;
    t.tile[int(GgmlType::Q2_K)] = tile_k<I, GgmlType::Q2_K>;
    t.tile[int(GgmlType::Q3_K)] = tile_k<I, GgmlType::Q3_K>;
    t.tile[int(GgmlType::Q4_K)] = tile_k<I, GgmlType::Q4_K>;
    t.tile[int(GgmlType::Q5_K)] = tile_k<I, GgmlType::Q5_K>;
    t.tile[int(GgmlType::Q6_K)] = tile_k<I, GgmlType::Q6_K>;
    t.quantize[int(GgmlType::Q8_0)] = quantize_q8<false>;
    t.quantize[int(GgmlType::Q8_1)] = quantize_q8<true>;
    t.quantize[int(GgmlType::Q8_K)] = quantize_q8_K;
    t.quantize[int(GgmlType::F16)] = quantize_f16;
    t.quantize[int(GgmlType::BF16)] = quantize_bf16;
    return t;
}

}  // namespace nt::quant_detail::x86
