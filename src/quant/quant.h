// Dequantization, activation quantization and dot products for every GGML type we support.
// SIMD paths (AVX2, AVX-512) are chosen once at run time; a portable path always exists and is
// the reference the SIMD paths are tested against.
#pragma once
#include <cstddef>
#include <cstdint>

#include "quant/types.h"

namespace nt {

// Dequantize n elements (a multiple of the block size) of type t starting at src.
// Bit-identical to gguf-py's gguf.quants.dequantize.
void dequantize_row(GgmlType t, const void* src, float* dst, int64_t n);

// The type activations are quantized to before a dot product with weights of type t:
// Q8_0 for Q4_0/Q5_0/Q8_0, Q8_1 for Q4_1/Q5_1, Q8_K for the K-quants, F32 for F32/F16/BF16.
GgmlType vec_dot_type(GgmlType t);

// Quantize n floats into type t (activation types Q8_0, Q8_1, Q8_K, F16, BF16, F32; also the
// weight types Q4_0..Q8_0 with llama.cpp's reference rounding, used by tools and tests).
void quantize_row(GgmlType t, const float* src, void* dst, int64_t n);
bool can_quantize(GgmlType t);

// Dot product of one weight row (type t) with one activation row (type vec_dot_type(t)),
// n elements. The result equals the float dot product of the dequantized rows up to float
// rounding.
float vec_dot(GgmlType t, int64_t n, const void* w_row, const void* act_row);

// Several weight rows against several activation rows at once:
//   out[j * out_stride + i] = vec_dot(t, n, w + i * w_stride, a + j * a_stride)
// for i < nrows, j < ncols. Kernels reuse each loaded weight block across the activation rows,
// which is what makes batched prompt processing faster than a loop of GEMVs.
void vec_dot_tile(GgmlType t, int64_t n, int nrows, int ncols, const void* w, size_t w_stride,
                  const void* a, size_t a_stride, float* out, size_t out_stride);

// Which SIMD level the dispatcher chose ("avx512", "avx2", "scalar"); NT_SIMD=scalar|avx2
// in the environment forces a lower level (tests compare levels against each other).
const char* simd_level();

}  // namespace nt
