// GEMV for F32, F16 and BF16 weights with float activations (n <= 8). Same work split as the
// quantized kernels (matmul_gemv.cuh): 4-warp CTAs, row groups of 2 rows, ksplit warps per
// group. The vector path reads 8 weights per lane with 16-byte loads (two for F32) and needs
// cols % 8 == 0 and 16-byte aligned w and x; the scalar path takes anything.
#include "backend/cuda/matmul_gemv.cuh"

namespace nt::cuda::detail {
namespace {

constexpr int kFloatRows = 2;  // rows per warp

template <GgmlType T>
struct FloatWeight;
template <>
struct FloatWeight<GgmlType::F32> {
    static constexpr int kBytes = 4;
    __device__ static float one(const uint8_t* p) {
        return __ldg(reinterpret_cast<const float*>(p));
    }
    __device__ static void eight(const uint8_t* p, float* v) {
        const float4 a = __ldg(reinterpret_cast<const float4*>(p));
        const float4 b = __ldg(reinterpret_cast<const float4*>(p) + 1);
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z,
        v[7] = b.w;
    }
};
template <>
struct FloatWeight<GgmlType::F16> {
    static constexpr int kBytes = 2;
    __device__ static float one(const uint8_t* p) {
        return __half2float(__ldg(reinterpret_cast<const __half*>(p)));
    }
    __device__ static void eight(const uint8_t* p, float* v) {
        const uint4 a = __ldg(reinterpret_cast<const uint4*>(p));
        const uint32_t u[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&u[i]));
            v[2 * i] = f.x, v[2 * i + 1] = f.y;
        }
    }
};
template <>
struct FloatWeight<GgmlType::BF16> {
    static constexpr int kBytes = 2;
    __device__ static float one(const uint8_t* p) {
        return __uint_as_float(uint32_t(__ldg(reinterpret_cast<const unsigned short*>(p))) << 16);
    }
    __device__ static void eight(const uint8_t* p, float* v) {
        const uint4 a = __ldg(reinterpret_cast<const uint4*>(p));
        const uint32_t u[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            v[2 * i] = __uint_as_float(u[i] << 16);
            v[2 * i + 1] = __uint_as_float(u[i] & 0xFFFF0000u);
        }
    }
};

template <GgmlType T, int NX, bool VEC>
__global__ void __launch_bounds__(kGemvThreads, kGemvMinBlocks)
    gemv_float_kernel(const uint8_t* __restrict__ w, int64_t rows, int64_t cols,
                      const float* __restrict__ x, int n, float* __restrict__ y, int ksplit) {
    using F = FloatWeight<T>;
    constexpr int RW = kFloatRows;
    __shared__ float red[kGemvWarps * RW * NX];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int kpart = warp % ksplit;
    const int64_t row0 = (int64_t(blockIdx.x) * (kGemvWarps / ksplit) + warp / ksplit) * RW;
    const uint8_t* wrow[RW];
#pragma unroll
    for (int r = 0; r < RW; ++r) wrow[r] = w + (min(row0 + r, rows - 1)) * cols * F::kBytes;
    const float* xrow[NX];
#pragma unroll
    for (int k = 0; k < NX; ++k) xrow[k] = x + int64_t(k < n ? k : n - 1) * cols;

    float acc[RW][NX];
#pragma unroll
    for (int r = 0; r < RW; ++r)
#pragma unroll
        for (int k = 0; k < NX; ++k) acc[r][k] = 0.f;

    if constexpr (VEC) {
        // kSteps groups of 8 per lane per step keep 2 (F16/BF16) or 4 (F32) 16-byte loads in
        // flight per row; one step for NX = 8, where the activations already fill the registers.
        constexpr int kSteps = NX >= 8 ? 1 : 2;
        const int64_t ngroups = cols / 8;
        const int64_t stride = int64_t(32) * ksplit;
        for (int64_t g0 = int64_t(kpart) * 32 + lane; g0 < ngroups; g0 += kSteps * stride) {
            float wv[kSteps][RW][8];
            bool ok[kSteps];
#pragma unroll
            for (int s = 0; s < kSteps; ++s) {
                const int64_t g = g0 + s * stride;
                ok[s] = g < ngroups;
                if (ok[s]) {
#pragma unroll
                    for (int r = 0; r < RW; ++r) F::eight(wrow[r] + g * 8 * F::kBytes, wv[s][r]);
                }
            }
#pragma unroll
            for (int s = 0; s < kSteps; ++s) {
                if (!ok[s]) continue;
                const int64_t g = g0 + s * stride;
#pragma unroll
                for (int k = 0; k < NX; ++k) {
                    const float4 a = __ldg(reinterpret_cast<const float4*>(xrow[k] + g * 8));
                    const float4 b = __ldg(reinterpret_cast<const float4*>(xrow[k] + g * 8) + 1);
                    const float xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
                    for (int r = 0; r < RW; ++r)
#pragma unroll
                        for (int i = 0; i < 8; ++i) acc[r][k] = fmaf(wv[s][r][i], xv[i], acc[r][k]);
                }
            }
        }
    } else {
        for (int64_t c = int64_t(kpart) * 32 + lane; c < cols; c += int64_t(32) * ksplit) {
            float wv[RW];
#pragma unroll
            for (int r = 0; r < RW; ++r) wv[r] = F::one(wrow[r] + c * F::kBytes);
#pragma unroll
            for (int k = 0; k < NX; ++k) {
                const float xv = __ldg(xrow[k] + c);
#pragma unroll
                for (int r = 0; r < RW; ++r) acc[r][k] = fmaf(wv[r], xv, acc[r][k]);
            }
        }
    }
    gemv_reduce_store<NX, RW>(acc, red, ksplit, rows, n, y, blockIdx.x);
}

template <GgmlType T, int NX>
void launch_float(const void* w, int64_t rows, int64_t cols, const float* x, int n, float* y,
                  bool vec, int ksplit, cudaStream_t stream) {
    const int64_t rows_per_cta = int64_t(kGemvWarps / ksplit) * kFloatRows;
    const dim3 grid(unsigned((rows + rows_per_cta - 1) / rows_per_cta));
    const auto* wb = static_cast<const uint8_t*>(w);
    if (vec)
        gemv_float_kernel<T, NX, true>
            <<<grid, kGemvThreads, 0, stream>>>(wb, rows, cols, x, n, y, ksplit);
    else
        gemv_float_kernel<T, NX, false>
            <<<grid, kGemvThreads, 0, stream>>>(wb, rows, cols, x, n, y, ksplit);
    NT_CUDA_CHECK(cudaGetLastError(), "gemv (float weights)");
}

template <GgmlType T>
void launch_float_nx(const void* w, int64_t rows, int64_t cols, const float* x, int n, float* y,
                     bool vec, int ksplit, cudaStream_t stream) {
    if (n <= 1) return launch_float<T, 1>(w, rows, cols, x, n, y, vec, ksplit, stream);
    if (n <= 2) return launch_float<T, 2>(w, rows, cols, x, n, y, vec, ksplit, stream);
    if (n <= 4) return launch_float<T, 4>(w, rows, cols, x, n, y, vec, ksplit, stream);
    return launch_float<T, 8>(w, rows, cols, x, n, y, vec, ksplit, stream);
}

}  // namespace

void gemv_float(GgmlType t, const void* w, int64_t rows, int64_t cols, const float* x, int n,
                float* y, int sm_count, cudaStream_t stream) {
    if (n < 1 || n > 8) nt::fail("gemv_float: batch %d is outside 1..8.", n);
    const bool vec = cols % 8 == 0 && reinterpret_cast<uintptr_t>(w) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(x) % 16 == 0;
    // Split the columns over more warps when there are too few row groups to fill the GPU.
    const int64_t warps_wanted = int64_t(16) * (sm_count > 0 ? sm_count : 132);
    int ksplit = 1;
    while (ksplit < kGemvWarps && (rows / kFloatRows) * ksplit < warps_wanted &&
           cols >= 512 * ksplit)
        ksplit *= 2;
    switch (t) {
        case GgmlType::F32:
            return launch_float_nx<GgmlType::F32>(w, rows, cols, x, n, y, vec, ksplit, stream);
        case GgmlType::F16:
            return launch_float_nx<GgmlType::F16>(w, rows, cols, x, n, y, vec, ksplit, stream);
        case GgmlType::BF16:
            return launch_float_nx<GgmlType::BF16>(w, rows, cols, x, n, y, vec, ksplit, stream);
        default:
            nt::fail("gemv_float: type %s is not a float type.", type_name(t));
    }
}

}  // namespace nt::cuda::detail
