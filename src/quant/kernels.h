// Internal to src/quant: the per-SIMD-level kernel tables behind quant.h, the block decoding
// helpers shared by the scalar and SIMD paths, and hooks that let tests run any level directly.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "quant/types.h"

namespace nt::quant_detail {

enum class SimdLevel : int { Scalar = 0, Avx2 = 1, Avx512 = 2 };
constexpr int kNumLevels = 3;

// The vec_dot_tile contract: out[j * out_stride + i] = dot(weight row i, activation row j).
using TileFn = void (*)(int64_t n, int nrows, int ncols, const void* w, size_t w_stride,
                        const void* a, size_t a_stride, float* out, size_t out_stride);

constexpr int kMaxTypeId = 31;  // GgmlType ids are < 31

// quantize_row for one activation format: n floats (a multiple of the block size) -> blocks.
using QuantizeFn = void (*)(const float* src, void* dst, int64_t n);

// One SIMD level's kernels, indexed by GgmlType id. nullptr: the level has no kernel of its own
// for that type and the dispatcher uses the next lower level. Every level's quantize output is
// bit-identical to the scalar reference.
struct KernelTable {
    TileFn tile[kMaxTypeId] = {};
    QuantizeFn quantize[kMaxTypeId] = {};  // activation formats only (Q8_0, Q8_1, Q8_K, F16, BF16)
};

const KernelTable& scalar_kernels();
const KernelTable& avx2_kernels();    // defined in dot_avx2.cpp
const KernelTable& avx512_kernels();  // defined in dot_avx512.cpp

// The best level this CPU supports, ignoring NT_SIMD.
SimdLevel cpu_level();
// The level NT_SIMD names (nullptr or "" means no limit: the CPU's best). Throws nt::Error for
// a value that is not a level name. A request above what the CPU supports gives the CPU's best.
SimdLevel level_from_env(const char* value);
const char* level_name(SimdLevel level);
// The kernel a given level uses for type t (falls back to lower levels); nullptr if the type has
// no dot product at all. Tests call this to compare levels against each other.
TileFn tile_kernel(SimdLevel level, GgmlType t);
// The activation quantizer a SIMD level uses for t (falls back to lower levels); nullptr at the
// scalar level and for the weight formats, which use the reference code alone.
QuantizeFn quantize_kernel(SimdLevel level, GgmlType t);
// quantize_row's reference (scalar) code for every type it supports; the SIMD quantizers match
// it bit for bit.
void quantize_row_scalar(GgmlType t, const float* src, void* dst, int64_t n);
// The level the process runs at (the CPU's best, capped by NT_SIMD).
SimdLevel active_level();
// Tests: run the whole process (vec_dot_tile, quantize_row and everything above them) at
// `level` from now on, capped at the CPU's best; returns the level it replaces. Not for use
// while another thread computes.
SimdLevel set_active_level(SimdLevel level);

// ---- helpers shared by the scalar and SIMD code ----

inline uint16_t load_u16(const void* p) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return v;
}

// The 6-bit scales and mins of Q4_K/Q5_K: 8 of each packed into 12 bytes.
//   j < 4: sc = s[j] & 63, m = s[j+4] & 63
//   j >= 4: sc = (s[j+4] & 15) | ((s[j-4] >> 6) << 4), m = (s[j+4] >> 4) | ((s[j] >> 6) << 4)
inline void unpack_k4_scales(const uint8_t* s, uint8_t sc[8], uint8_t m[8]) {
    for (int j = 0; j < 4; ++j) {
        sc[j] = s[j] & 63;
        m[j] = s[j + 4] & 63;
        sc[j + 4] = uint8_t((s[j + 8] & 15) | ((s[j] >> 6) << 4));
        m[j + 4] = uint8_t((s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4));
    }
}

// The 16 6-bit scales of Q3_K (before subtracting 32): low nibbles from bytes 0..7, high two
// bits from bytes 8..11.
inline void unpack_q3k_scales(const uint8_t* s, int8_t out[16]) {
    for (int j = 0; j < 16; ++j) {
        const int lo = j < 8 ? (s[j] & 15) : (s[j - 8] >> 4);
        const int hi = (s[8 + (j & 3)] >> (2 * (j >> 2))) & 3;
        out[j] = int8_t((lo | (hi << 4)) - 32);
    }
}

}  // namespace nt::quant_detail
