// Butterfly reductions over a whole warp, and over a whole block through one value a warp in
// shared memory: every thread gets the result. Device code only.
#pragma once
#include <cuda_runtime.h>

namespace nt::cuda::detail {

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
// The warp's sums of kV values at once (kV a power of two up to 32), each lane left with one:
// value lane / (32 / kV)'s. The first levels halve what a lane carries (it keeps the half its
// partner gives away), so kV values cost about as many shuffles as two do in butterflies of
// their own. Every sum adds the pair warp_sum adds, so the bits are warp_sum's.
template <int kV>
__device__ __forceinline__ double warp_sum_rows(const double (&v)[kV], int lane) {
    static_assert(kV >= 1 && kV <= 32 && (kV & (kV - 1)) == 0, "a power of two up to 32");
    double a[kV];
#pragma unroll
    for (int i = 0; i < kV; ++i) a[i] = v[i];
    int o = 16;
#pragma unroll
    for (int n = kV; n > 1; n >>= 1, o >>= 1) {
        const bool up = lane & o;
#pragma unroll
        for (int i = 0; i < n / 2; ++i) {
            const double keep = up ? a[i + n / 2] : a[i], give = up ? a[i] : a[i + n / 2];
            a[i] = keep + __shfl_xor_sync(0xffffffffu, give, o);
        }
    }
#pragma unroll
    for (; o > 0; o >>= 1) a[0] += __shfl_xor_sync(0xffffffffu, a[0], o);
    return a[0];
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ double warp_max(double v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmax(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ unsigned long long warp_max(unsigned long long v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

struct WarpSum {
    template <class T>
    __device__ T operator()(T v) const {
        return warp_sum(v);
    }
};
struct WarpMax {
    template <class T>
    __device__ T operator()(T v) const {
        return warp_max(v);
    }
};
// The reduction `op` (WarpSum, WarpMax) of v over the block (blockDim.x a multiple of 32):
// within each warp, then over the warps' results, which go through red (one T a warp, shared
// memory); `none` stands in for the lanes past the last warp. Every thread must call it.
template <class T, class Op>
__device__ __forceinline__ T block_reduce(T v, T* red, T none, Op op) {
    v = op(v);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = lane < int(blockDim.x / 32) ? red[lane] : none;
    return op(v);
}

}  // namespace nt::cuda::detail
