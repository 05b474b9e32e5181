// silu(g) * u as the CPU backend rounds it (internal; the SwiGLU kernel of elementwise.cu and the
// GEMV pairs' epilogues both use it, so that the fused and the separate paths give the same bits).
#pragma once
#include <cuda_runtime.h>

#include "backend/cuda/exp_double.cuh"

namespace nt::cuda::detail {

// exp in double rounded once to float, then each float operation rounded on its own: the CPU's
// g / (1 + e) * u. The double exp is what makes it the CPU's bits: __expf (what --use_fast_math
// makes of expf) is a few ulps off, and even glibc's expf misrounds 0.06% of inputs, while a
// double exp (glibc's there, exp_lean here), rounded to float, gives the correctly rounded value
// but for ties far below an activation's precision. One rounding apart is enough to move an activation across an 8-bit
// quantization step later in the pass, which is why it matters.
__device__ __forceinline__ float silu_mul(float g, float u) {
    const float e = __double2float_rn(exp_lean(-double(g)));
    return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.f, e)), u);
}

}  // namespace nt::cuda::detail
