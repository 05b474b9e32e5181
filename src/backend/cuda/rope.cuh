// GGML "normal" rope, one pair at a time (internal; the rope kernels of elementwise.cu and the
// decode attention kernel that turns q and k itself both use it, so that they give the same bits).
#pragma once
#include <cuda_runtime.h>

#include <cmath>

namespace nt::cuda::detail {

// cos and sin of x in double, for |x| < 2^31, within a few units in the last place: what the
// CPU backend's std::cos and std::sin give once rounded to float, but for ties once in about
// 1e8 values (RopeAngleHost checks every position of a 131072-token context). CUDA's sincos
// is as accurate, but its reduction for huge arguments keeps an array on the stack, and a
// kernel with a stack frame loads its stack pointer from the constant bank at entry: one more
// miss on the decode attention's way to its first tiles. This one reduces by pi/2 in three
// parts (Cody-Waite with fused multiply-adds: each step rounds once, relative to the reduced
// argument) and sums Taylor series to r^19 (sin) and r^20 (cos), truncated far below a double's
// last bit for |r| <= pi/4. __host__ as well, so that a host test can run the same operations.
__host__ __device__ inline void sincos_lean(double x, double* s, double* c) {
    constexpr double k2OverPi = 0.6366197723675814;
    constexpr double kPio2Hi = 1.5707963267948966;       // pi/2 rounded to double
    constexpr double kPio2Mid = 6.123233995736766e-17;   // pi/2 - kPio2Hi, rounded
    constexpr double kPio2Lo = -1.4973849048591698e-33;  // and what is left after that
    const double j = rint(x * k2OverPi);
    double r = fma(-j, kPio2Hi, x);
    r = fma(-j, kPio2Mid, r);
    r = fma(-j, kPio2Lo, r);
    const double z = r * r;
    double ps = 8.22063524662433e-18;  // 1/19!
    ps = fma(ps, z, -2.8114572543455206e-15);
    ps = fma(ps, z, 7.647163731819816e-13);
    ps = fma(ps, z, -1.6059043836821613e-10);
    ps = fma(ps, z, 2.505210838544172e-08);
    ps = fma(ps, z, -2.755731922398589e-06);
    ps = fma(ps, z, 0.0001984126984126984);
    ps = fma(ps, z, -0.008333333333333333);
    ps = fma(ps, z, 0.16666666666666666);
    const double sr = fma(-r * z, ps, r);  // r - r^3/3! + r^5/5! - ...
    double pc = 4.110317623312165e-19;     // 1/20!
    pc = fma(pc, z, -1.5619206968586225e-16);
    pc = fma(pc, z, 4.779477332387385e-14);
    pc = fma(pc, z, -1.1470745597729725e-11);
    pc = fma(pc, z, 2.08767569878681e-09);
    pc = fma(pc, z, -2.755731922398589e-07);
    pc = fma(pc, z, 2.48015873015873e-05);
    pc = fma(pc, z, -0.001388888888888889);
    pc = fma(pc, z, 0.041666666666666664);
    pc = fma(pc, z, -0.5);
    const double cr = fma(pc, z, 1.0);        // 1 - r^2/2! + r^4/4! - ...
    switch (static_cast<long long>(j) & 3) {  // x = r + j pi/2
        case 0:
            *s = sr, *c = cr;
            break;
        case 1:
            *s = cr, *c = -sr;
            break;
        case 2:
            *s = -sr, *c = -cr;
            break;
        default:
            *s = -cr, *c = sr;
            break;
    }
}

// cos and sin of pair j's angle at position pos: the float product pos * inv_freq[j], then a
// double-precision sincos (what the CPU backend computes), rounded to float.
__host__ __device__ inline void rope_angle(int pos, float inv_freq, float& c, float& s) {
#ifdef __CUDA_ARCH__
    const float theta = __fmul_rn(float(pos), inv_freq);
#else
    const float theta = float(pos) * inv_freq;
#endif
    double sd, cd;
    sincos_lean(double(theta), &sd, &cd);
    c = float(cd);
    s = float(sd);
}

// The pair (a, b) turned by the angle whose cos and sin are c and s, every operation rounded
// on its own (no contraction into fused multiply-adds, which would differ between kernels).
__device__ __forceinline__ float2 rope_turn(float a, float b, float c, float s) {
    return make_float2(__fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s)),
                       __fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c)));
}

}  // namespace nt::cuda::detail
