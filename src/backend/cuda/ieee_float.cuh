// IEEE single-precision arithmetic rounded to nearest even and without flushing subnormals,
// whatever --use_fast_math (-ftz, approximate division) makes of the operators: for results
// that must be the CPU's bits (the GEMV's activation scales, the sampler's draw). Device code
// only; include from .cu files.
#pragma once
#include <cuda_runtime.h>

namespace nt::cuda {

// add_rn, sub_rn, mul_rn, div_rn: a + b, a - b, a * b, a / b.
#define NT_IEEE_BINARY(name, op)                                           \
    __device__ __forceinline__ float name(float a, float b) {             \
        float r;                                                           \
        asm(op ".rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));          \
        return r;                                                          \
    }
NT_IEEE_BINARY(add_rn, "add")
NT_IEEE_BINARY(sub_rn, "sub")
NT_IEEE_BINARY(mul_rn, "mul")
NT_IEEE_BINARY(div_rn, "div")
#undef NT_IEEE_BINARY

// float -> double (exact, subnormals kept) and double -> float (rounded to nearest even).
__device__ __forceinline__ double widen(float a) {
    double r;
    asm("cvt.f64.f32 %0, %1;" : "=d"(r) : "f"(a));
    return r;
}
__device__ __forceinline__ float narrow_rn(double a) {
    float r;
    asm("cvt.rn.f32.f64 %0, %1;" : "=f"(r) : "d"(a));
    return r;
}
// a >= b, subnormals compared as they are (false when either is a NaN).
__device__ __forceinline__ bool ge_exact(float a, float b) {
    return widen(a) >= widen(b);
}

}  // namespace nt::cuda
