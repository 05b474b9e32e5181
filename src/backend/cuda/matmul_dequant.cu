// The small kernels around the matrix products: activation quantization (GEMV path), fp32 ->
// fp16/bf16 conversion and weight dequantization to FP16 (GEMM path).
#include "backend/cuda/cuda_check.cuh"
#include "backend/cuda/matmul_kernels.cuh"
#include "backend/cuda/matmul_quant.cuh"
#include "backend/cuda/quantize_q8.cuh"

namespace nt::cuda::detail {
namespace {

constexpr size_t align256(size_t b) {
    return (b + 255) & ~size_t(255);
}

// Stores 4 or 8 rounded activations, q * d, as FP16 (one 8- or 16-byte store).
template <int E>
__device__ __forceinline__ void store_dq_f16(__half* dst, const int (&q)[E], float d) {
    uint32_t h[E / 2];
#pragma unroll
    for (int i = 0; i < E / 2; ++i) {
        const __half2 t =
            __floats2half2_rn(mul_rn(float(q[2 * i]), d), mul_rn(float(q[2 * i + 1]), d));
        h[i] = *reinterpret_cast<const uint32_t*>(&t);
    }
    if constexpr (E == 4)
        *reinterpret_cast<uint2*>(dst) = make_uint2(h[0], h[1]);
    else
        *reinterpret_cast<uint4*>(dst) = make_uint4(h[0], h[1], h[2], h[3]);
}

// Q8_0 / Q8_1: 8 threads per 32-element block, 4 elements each (q8_block). With F16OUT the
// block is written as FP16 values q * d to xh instead of (xq, xd): the GEMM path's activations.
template <bool VEC, bool Q81, bool F16OUT = false>
__global__ void __launch_bounds__(256)
    quantize_q8_kernel(const float* __restrict__ x, int64_t nblocks, int8_t* __restrict__ xq,
                       float2* __restrict__ xd, __half* __restrict__ xh = nullptr) {
    const int64_t blk = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 3;
    const int sub = threadIdx.x & 7;
    const bool live = blk < nblocks;  // dead lanes still take part in the shuffles
    float v[4] = {0.f, 0.f, 0.f, 0.f};
    if (live) {
        const float* p = x + blk * 32 + sub * 4;
        if constexpr (VEC) {
            const float4 t = __ldg(reinterpret_cast<const float4*>(p));
            v[0] = t.x, v[1] = t.y, v[2] = t.z, v[3] = t.w;
        } else {
#pragma unroll
            for (int i = 0; i < 4; ++i) v[i] = __ldg(p + i);
        }
    }
    int q[4];
    const float2 dq = q8_block<4, Q81>(v, q);
    if (F16OUT) {
        if (live) store_dq_f16(xh + blk * 32 + sub * 4, q, dq.x);
    } else if (live) {
        store_q8(xq + blk * 32 + sub * 4, q);
        if (sub == 0) xd[blk] = dq;
    }
}

// Q8_K: one warp per 256 elements, 8 per lane (q8k_block). F16OUT as above.
template <bool VEC, bool F16OUT = false>
__global__ void __launch_bounds__(256)
    quantize_q8k_kernel(const float* __restrict__ x, int64_t nblocks, int8_t* __restrict__ xq,
                        float2* __restrict__ xd, __half* __restrict__ xh = nullptr) {
    const int64_t blk = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (blk >= nblocks) return;  // whole warps: blk is uniform across the warp
    const float* p = x + blk * 256 + lane * 8;
    float v[8];
    if constexpr (VEC) {
        const float4 a = __ldg(reinterpret_cast<const float4*>(p));
        const float4 b = __ldg(reinterpret_cast<const float4*>(p) + 1);
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z,
        v[7] = b.w;
    } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = __ldg(p + i);
    }
    int q[8];
    const float2 dq = q8k_block(v, lane, q);
    if constexpr (F16OUT) {
        store_dq_f16(xh + blk * 256 + lane * 8, q, dq.x);
        return;
    }
    store_q8(xq + blk * 256 + lane * 8, q);
    if ((lane & 3) == 0) xd[blk * 8 + (lane >> 2)] = dq;
}

__global__ void to_f16_kernel(const float* __restrict__ x, int64_t count,
                              __half* __restrict__ out) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
         i += int64_t(gridDim.x) * blockDim.x)
        out[i] = __float2half_rn(x[i]);
}
__global__ void to_bf16_kernel(const float* __restrict__ x, int64_t count,
                               __nv_bfloat16* __restrict__ out) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
         i += int64_t(gridDim.x) * blockDim.x)
        out[i] = __float2bfloat16_rn(x[i]);
}
// Four elements per thread when aligned: 16-byte loads, 8-byte stores.
__global__ void to_f16x4_kernel(const float4* __restrict__ x, int64_t count4,
                                uint2* __restrict__ out) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count4;
         i += int64_t(gridDim.x) * blockDim.x) {
        const float4 v = __ldg(x + i);
        const __half2 a = __floats2half2_rn(v.x, v.y), b = __floats2half2_rn(v.z, v.w);
        out[i] = make_uint2(*reinterpret_cast<const uint32_t*>(&a),
                            *reinterpret_cast<const uint32_t*>(&b));
    }
}
__global__ void to_bf16x4_kernel(const float4* __restrict__ x, int64_t count4,
                                 uint2* __restrict__ out) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count4;
         i += int64_t(gridDim.x) * blockDim.x) {
        const float4 v = __ldg(x + i);
        const __nv_bfloat162 a = __floats2bfloat162_rn(v.x, v.y),
                             b = __floats2bfloat162_rn(v.z, v.w);
        out[i] = make_uint2(*reinterpret_cast<const uint32_t*>(&a),
                            *reinterpret_cast<const uint32_t*>(&b));
    }
}

// One thread per 8 consecutive output elements (one 16-byte store); kDequantUnroll groups per
// thread, a CTA apart, so a warp's loads and stores stay contiguous.
constexpr int kDequantThreads = 256, kDequantUnroll = 4;

template <GgmlType T>
__global__ void __launch_bounds__(kDequantThreads)
    dequant_f16_kernel(const uint8_t* __restrict__ w, int64_t ngroups, __half* __restrict__ out) {
    using Q = Quant<T>;
    constexpr int kGroupsPerBlock = Q::kBlockElems / 8;
    const int64_t g0 = int64_t(blockIdx.x) * (kDequantThreads * kDequantUnroll) + threadIdx.x;
    float v[kDequantUnroll][8];
#pragma unroll
    for (int u = 0; u < kDequantUnroll; ++u) {
        const int64_t g = g0 + u * kDequantThreads;
        if (g < ngroups)
            Q::dequant8(w + (g / kGroupsPerBlock) * Q::kBlockBytes, int(g % kGroupsPerBlock), v[u]);
    }
#pragma unroll
    for (int u = 0; u < kDequantUnroll; ++u) {
        const int64_t g = g0 + u * kDequantThreads;
        if (g < ngroups) {
            uint4 o;
            uint32_t* p = reinterpret_cast<uint32_t*>(&o);
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const __half2 h = __floats2half2_rn(v[u][2 * i], v[u][2 * i + 1]);
                p[i] = *reinterpret_cast<const uint32_t*>(&h);
            }
            reinterpret_cast<uint4*>(out)[g] = o;
        }
    }
}

template <GgmlType T>
void launch_dequant(const void* w, int64_t rows, int64_t cols, __half* out, cudaStream_t stream) {
    const int64_t ngroups = rows * cols / 8;
    const int64_t per_cta = int64_t(kDequantThreads) * kDequantUnroll;
    dequant_f16_kernel<T>
        <<<unsigned((ngroups + per_cta - 1) / per_cta), kDequantThreads, 0, stream>>>(
            static_cast<const uint8_t*>(w), ngroups, out);
    NT_CUDA_CHECK(cudaGetLastError(), "dequantize to f16");
}

unsigned grid_for(int64_t count, int threads) {
    const int64_t b = (count + threads - 1) / threads;
    return unsigned(b < 65536 ? (b > 0 ? b : 1) : 65536);
}

}  // namespace

size_t q8_bytes(int n, int64_t cols) {
    return align256(size_t(n) * cols) + align256(size_t(n) * (cols / 32) * sizeof(float2));
}

ActQuant act_quant(GgmlType t) {
    switch (t) {
        case GgmlType::Q4_1:
        case GgmlType::Q5_1:
            return ActQuant::Q8_1;
        case GgmlType::Q2_K:
        case GgmlType::Q3_K:
        case GgmlType::Q4_K:
        case GgmlType::Q5_K:
        case GgmlType::Q6_K:
            return ActQuant::Q8_K;
        default:
            return ActQuant::Q8_0;
    }
}

namespace {

// One launch of the quantize kernels for `mode`: to (xq, xd), or, with F16OUT, to xh.
template <bool F16OUT>
void launch_quantize(const float* x, int n, int64_t cols, ActQuant mode, int8_t* xq, float2* xd,
                     __half* xh, cudaStream_t stream) {
    const int block = mode == ActQuant::Q8_K ? 256 : 32;
    if (cols % block != 0)
        nt::fail("quantize_q8: %lld columns are not a multiple of %d.", (long long)cols, block);
    const bool vec = reinterpret_cast<uintptr_t>(x) % 16 == 0;
    const int64_t nblocks = int64_t(n) * (cols / block);
    if (mode == ActQuant::Q8_K) {
        const unsigned grid = unsigned((nblocks * 32 + 255) / 256);
        if (vec)
            quantize_q8k_kernel<true, F16OUT><<<grid, 256, 0, stream>>>(x, nblocks, xq, xd, xh);
        else
            quantize_q8k_kernel<false, F16OUT><<<grid, 256, 0, stream>>>(x, nblocks, xq, xd, xh);
    } else {
        const unsigned grid = unsigned((nblocks * 8 + 255) / 256);
        const bool q81 = mode == ActQuant::Q8_1;
        if (vec && q81)
            quantize_q8_kernel<true, true, F16OUT>
                <<<grid, 256, 0, stream>>>(x, nblocks, xq, xd, xh);
        else if (vec)
            quantize_q8_kernel<true, false, F16OUT>
                <<<grid, 256, 0, stream>>>(x, nblocks, xq, xd, xh);
        else if (q81)
            quantize_q8_kernel<false, true, F16OUT>
                <<<grid, 256, 0, stream>>>(x, nblocks, xq, xd, xh);
        else
            quantize_q8_kernel<false, false, F16OUT>
                <<<grid, 256, 0, stream>>>(x, nblocks, xq, xd, xh);
    }
    NT_CUDA_CHECK(cudaGetLastError(), "quantize activations");
}

}  // namespace

void quantize_q8(const float* x, int n, int64_t cols, ActQuant mode, int8_t* xq, float2* xd,
                 cudaStream_t stream) {
    launch_quantize<false>(x, n, cols, mode, xq, xd, nullptr, stream);
}

void quantize_to_f16(const float* x, int n, int64_t cols, ActQuant mode, __half* out,
                     cudaStream_t stream) {
    if (reinterpret_cast<uintptr_t>(out) % 16 != 0)
        nt::fail("quantize_to_f16: the output is not 16-byte aligned.");
    launch_quantize<true>(x, n, cols, mode, nullptr, nullptr, out, stream);
}

void convert_to_f16(const float* x, int64_t count, __half* out, cudaStream_t stream) {
    if (count % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
        reinterpret_cast<uintptr_t>(out) % 8 == 0)
        to_f16x4_kernel<<<grid_for(count / 4, 256), 256, 0, stream>>>(
            reinterpret_cast<const float4*>(x), count / 4, reinterpret_cast<uint2*>(out));
    else
        to_f16_kernel<<<grid_for(count, 256), 256, 0, stream>>>(x, count, out);
    NT_CUDA_CHECK(cudaGetLastError(), "convert activations to f16");
}

void convert_to_bf16(const float* x, int64_t count, __nv_bfloat16* out, cudaStream_t stream) {
    if (count % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
        reinterpret_cast<uintptr_t>(out) % 8 == 0)
        to_bf16x4_kernel<<<grid_for(count / 4, 256), 256, 0, stream>>>(
            reinterpret_cast<const float4*>(x), count / 4, reinterpret_cast<uint2*>(out));
    else
        to_bf16_kernel<<<grid_for(count, 256), 256, 0, stream>>>(x, count, out);
    NT_CUDA_CHECK(cudaGetLastError(), "convert activations to bf16");
}

void dequant_to_f16(GgmlType t, const void* w, int64_t rows, int64_t cols, __half* out,
                    cudaStream_t stream) {
    switch (t) {
        case GgmlType::Q4_0:
            return launch_dequant<GgmlType::Q4_0>(w, rows, cols, out, stream);
        case GgmlType::Q4_1:
            return launch_dequant<GgmlType::Q4_1>(w, rows, cols, out, stream);
        case GgmlType::Q5_0:
            return launch_dequant<GgmlType::Q5_0>(w, rows, cols, out, stream);
        case GgmlType::Q5_1:
            return launch_dequant<GgmlType::Q5_1>(w, rows, cols, out, stream);
        case GgmlType::Q8_0:
            return launch_dequant<GgmlType::Q8_0>(w, rows, cols, out, stream);
        case GgmlType::Q2_K:
            return launch_dequant<GgmlType::Q2_K>(w, rows, cols, out, stream);
        case GgmlType::Q3_K:
            return launch_dequant<GgmlType::Q3_K>(w, rows, cols, out, stream);
        case GgmlType::Q4_K:
            return launch_dequant<GgmlType::Q4_K>(w, rows, cols, out, stream);
        case GgmlType::Q5_K:
            return launch_dequant<GgmlType::Q5_K>(w, rows, cols, out, stream);
        case GgmlType::Q6_K:
            return launch_dequant<GgmlType::Q6_K>(w, rows, cols, out, stream);
        default:
            nt::fail("dequant_to_f16: type %s is not a quantized weight type.", type_name(t));
    }
}

}  // namespace nt::cuda::detail
