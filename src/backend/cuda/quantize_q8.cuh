// The per-block arithmetic of the GEMV's activation quantization (detail::quantize_q8), as
// device functions: the quantize kernels (matmul_dequant.cu) and the kernels that produce
// activations and quantize them on the way out (add_rmsnorm in elementwise.cu) share this one
// copy, so both give the same bits. Device code only; include from .cu files.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/ieee_float.cuh"

namespace nt::cuda::detail {

__device__ __forceinline__ float f16_round(float v) {
    return __half2float(__float2half_rn(v));
}

// Q8_0 / Q8_1 (the CPU's q8_block) of one 32-element block held by 32 / E consecutive lanes
// (aligned to 32 / E), E consecutive elements each: d = amax / 127, id = 1 / d, q = roundf(x *
// id) (half away from zero; NaN -> 0, clamped to +-127), d stored as FP16. Returns the block's
// xd = (f16(d), s) on every lane of the group, with s = f16(d) * sum(q) for Q8_0 (exact in
// float: 11 x 12 significant bits) and the CPU's stored s = f16(d * sum(q)) for Q8_1. Every lane
// of the warp must call it (shuffles); lanes without data pass zeros.
template <int E, bool Q81>
__device__ __forceinline__ float2 q8_block(const float (&v)[E], int (&q)[E]) {
    constexpr int kLanes = 32 / E;
    static_assert(E * kLanes == 32, "E must divide 32");
    // fmaxf ignores NaN, so the order of the maximum does not matter.
    float amax = fabsf(v[0]);
#pragma unroll
    for (int i = 1; i < E; ++i) amax = fmaxf(amax, fabsf(v[i]));
#pragma unroll
    for (int o = 1; o < kLanes; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float d = div_rn(amax, 127.f);
    const float id = d != 0.f ? div_rn(1.f, d) : 0.f;
    int s = 0;
#pragma unroll
    for (int i = 0; i < E; ++i) {
        const float r = roundf(mul_rn(v[i], id));
        q[i] = r == r ? int(fminf(127.f, fmaxf(-127.f, r))) : 0;
        s += q[i];
    }
#pragma unroll
    for (int o = 1; o < kLanes; o <<= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    const float d16 = f16_round(d);
    return make_float2(d16, Q81 ? f16_round(mul_rn(float(s), d)) : mul_rn(d16, float(s)));
}

// Q8_K (the CPU's q_q8_K) of one 256-element block held by a whole warp, elements lane * 8 ..
// lane * 8 + 7 on each lane: max = the first element of largest magnitude, iscale = -127 / max,
// q = rint(clamp(iscale * x, +-127)) (half to even; NaN -> 0), d = 1 / iscale (0 and q = 0 for
// an all-zero block). Returns (d, d * sum(q of sub-block k)) for the sub-block of 32 this lane
// belongs to (lanes 4k .. 4k+3 hold sub-block k), the per-32 pair the GEMV kernels read.
__device__ __forceinline__ float2 q8k_block(const float (&v)[8], int lane, int (&q)[8]) {
    // Largest magnitude, ties to the lowest index (the CPU scans forward with a strict '>').
    float amax = 0.f, vmax = 0.f;
    int imax = 256;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const float ax = fabsf(v[i]);
        if (ax > amax) amax = ax, vmax = v[i], imax = lane * 8 + i;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float a2 = __shfl_xor_sync(0xffffffffu, amax, o);
        const float v2 = __shfl_xor_sync(0xffffffffu, vmax, o);
        const int i2 = __shfl_xor_sync(0xffffffffu, imax, o);
        if (a2 > amax || (a2 == amax && i2 < imax)) amax = a2, vmax = v2, imax = i2;
    }
    const float iscale = amax != 0.f ? div_rn(-127.f, vmax) : 0.f;
    const float d = amax != 0.f ? div_rn(1.f, iscale) : 0.f;
    int s = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const float t = mul_rn(iscale, v[i]);
        q[i] = t == t ? __float2int_rn(fminf(127.f, fmaxf(-127.f, t))) : 0;
        s += q[i];
    }
    s += __shfl_xor_sync(0xffffffffu, s, 1);
    s += __shfl_xor_sync(0xffffffffu, s, 2);
    return make_float2(d, mul_rn(d, float(s)));
}

// Stores 4 or 8 quants (int8) at dst, which is 4- or 8-byte aligned.
__device__ __forceinline__ void store_q8(int8_t* dst, const int (&q)[4]) {
    *reinterpret_cast<char4*>(dst) =
        make_char4(int8_t(q[0]), int8_t(q[1]), int8_t(q[2]), int8_t(q[3]));
}
__device__ __forceinline__ void store_q8(int8_t* dst, const int (&q)[8]) {
    uint32_t lo = 0, hi = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        lo |= uint32_t(uint8_t(int8_t(q[i]))) << (8 * i);
        hi |= uint32_t(uint8_t(int8_t(q[4 + i]))) << (8 * i);
    }
    *reinterpret_cast<uint2*>(dst) = make_uint2(lo, hi);
}

}  // namespace nt::cuda::detail
