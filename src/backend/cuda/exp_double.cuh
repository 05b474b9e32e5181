// exp in double for the kernels that must reproduce the CPU backend's bits (internal).
//
// The CPU rounds exp(x) computed in double to float, or keeps it in double inside sums that it
// rounds later; any double exp accurate to a few 1e-16 of its value gives the same floats but
// for ties once in about 1e8 values. CUDA's exp(double) is that accurate, but it is long and
// register-hungry with its special cases (inlined four times, it spilled the decode attention's
// 64-register form by 300 bytes). This one is Cody-Waite range reduction and a degree-12 Taylor
// polynomial (error below 2e-16 of the value over |r| <= ln2 / 2), with the ends cut short where
// nothing downstream can see the difference: below e^-708 it returns 0 (a float of it is 0, and
// next to the term of weight 1 in every merge it is far below a double's last bit), above
// e^709.78 +inf, NaN for NaN.
#pragma once
#include <cuda_runtime.h>

namespace nt::cuda::detail {

__device__ __forceinline__ double exp_lean(double x) {
    if (!(x > -708.0)) return x != x ? x : 0.0;  // NaN stays NaN; -inf and tiny give 0
    if (x > 709.782712893384) return __longlong_as_double(0x7ff0000000000000LL);  // +inf
    constexpr double kLog2e = 1.4426950408889634, kLn2Hi = 6.93147180369123816490e-01,
                     kLn2Lo = 1.90821492927058770002e-10;
    const double k = rint(x * kLog2e);
    const double r = fma(-k, kLn2Lo, fma(-k, kLn2Hi, x));  // x - k ln2, |r| <= ln2 / 2 + tiny
    // e^r = sum r^n / n!, n <= 12, by Horner
    double p = 1.0 / 479001600.0;
    p = fma(p, r, 1.0 / 39916800.0);
    p = fma(p, r, 1.0 / 3628800.0);
    p = fma(p, r, 1.0 / 362880.0);
    p = fma(p, r, 1.0 / 40320.0);
    p = fma(p, r, 1.0 / 5040.0);
    p = fma(p, r, 1.0 / 720.0);
    p = fma(p, r, 1.0 / 120.0);
    p = fma(p, r, 1.0 / 24.0);
    p = fma(p, r, 1.0 / 6.0);
    p = fma(p, r, 0.5);
    p = fma(p, r, 1.0);
    p = fma(p, r, 1.0);
    // times 2^k in two factors, each a normal double for |k| <= 1024
    const int ki = int(k), k1 = ki / 2, k2 = ki - k1;
    return p * __hiloint2double((k1 + 1023) << 20, 0) * __hiloint2double((k2 + 1023) << 20, 0);
}

}  // namespace nt::cuda::detail
