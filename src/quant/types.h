// The GGML tensor types and their block layouts, byte for byte as GGUF files store them.
// Every backend (CPU, CUDA) and the GGUF reader agree on these definitions.
#pragma once
#include <cstddef>
#include <cstdint>

namespace nt {

// Values are GGML's type ids as written in GGUF tensor infos.
enum class GgmlType : uint32_t {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q8_1 = 9,
    Q2_K = 10,
    Q3_K = 11,
    Q4_K = 12,
    Q5_K = 13,
    Q6_K = 14,
    Q8_K = 15,
    BF16 = 30,
};

constexpr int QK4_0 = 32, QK4_1 = 32, QK5_0 = 32, QK5_1 = 32, QK8_0 = 32, QK8_1 = 32;
constexpr int QK_K = 256;
constexpr int K_SCALE_SIZE = 12;

using f16_t = uint16_t;  // raw IEEE half bits

#pragma pack(push, 1)
struct block_q4_0 { f16_t d; uint8_t qs[QK4_0 / 2]; };
struct block_q4_1 { f16_t d; f16_t m; uint8_t qs[QK4_1 / 2]; };
struct block_q5_0 { f16_t d; uint8_t qh[4]; uint8_t qs[QK5_0 / 2]; };
struct block_q5_1 { f16_t d; f16_t m; uint8_t qh[4]; uint8_t qs[QK5_1 / 2]; };
struct block_q8_0 { f16_t d; int8_t qs[QK8_0]; };
struct block_q8_1 { f16_t d; f16_t s; int8_t qs[QK8_1]; };  // s = d * sum(qs)
struct block_q2_K { uint8_t scales[QK_K / 16]; uint8_t qs[QK_K / 4]; f16_t d; f16_t dmin; };
struct block_q3_K { uint8_t hmask[QK_K / 8]; uint8_t qs[QK_K / 4]; uint8_t scales[12]; f16_t d; };
struct block_q4_K { f16_t d; f16_t dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qs[QK_K / 2]; };
struct block_q5_K { f16_t d; f16_t dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qh[QK_K / 8]; uint8_t qs[QK_K / 2]; };
struct block_q6_K { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; f16_t d; };
struct block_q8_K { float d; int8_t qs[QK_K]; int16_t bsums[QK_K / 16]; };
#pragma pack(pop)

static_assert(sizeof(block_q4_0) == 18);
static_assert(sizeof(block_q4_1) == 20);
static_assert(sizeof(block_q5_0) == 22);
static_assert(sizeof(block_q5_1) == 24);
static_assert(sizeof(block_q8_0) == 34);
static_assert(sizeof(block_q8_1) == 36);
static_assert(sizeof(block_q2_K) == 84);
static_assert(sizeof(block_q3_K) == 110);
static_assert(sizeof(block_q4_K) == 144);
static_assert(sizeof(block_q5_K) == 176);
static_assert(sizeof(block_q6_K) == 210);
static_assert(sizeof(block_q8_K) == 292);

struct TypeTraits {
    const char* name;      // as llama.cpp prints it: "q4_K", "f16", ...
    int block_elems;       // elements per block (1 for plain floats)
    int block_bytes;       // bytes per block
    bool weight_type;      // appears as a weight type in model files we accept
};

// nullptr for ids we do not know.
const TypeTraits* type_traits(uint32_t id);
inline const TypeTraits& traits(GgmlType t) { return *type_traits(uint32_t(t)); }
const char* type_name(GgmlType t);

// Bytes of a row of n elements; n must be a multiple of the block size.
inline size_t row_bytes(GgmlType t, int64_t n) {
    const TypeTraits& tr = traits(t);
    return size_t(n / tr.block_elems) * size_t(tr.block_bytes);
}

// Byte offsets of a quantized block's f16 scale fields: d, and dmin (the K-quants) or m (Q4_1,
// Q5_1); -1 where the type has none. Tests and benchmarks that fill blocks with random bytes
// give these fields finite values.
struct BlockScales {
    int d = -1, min = -1;
};
constexpr BlockScales block_scales(GgmlType t) {
    switch (t) {
        case GgmlType::Q4_0:
        case GgmlType::Q5_0:
        case GgmlType::Q8_0:
            return {0, -1};
        case GgmlType::Q4_1:
        case GgmlType::Q5_1:
        case GgmlType::Q4_K:
        case GgmlType::Q5_K:
            return {0, 2};
        case GgmlType::Q2_K:
            return {80, 82};
        case GgmlType::Q3_K:
            return {108, -1};
        case GgmlType::Q6_K:
            return {208, -1};
        default:
            return {};
    }
}

}  // namespace nt
