// Embedding lookup (every weight type), RMSNorm (alone, or fused with the residual add and the
// GEMV's activation quantization), rope, SwiGLU, residual add and row gathers.
// All are memory-bound and tiny next to the matmuls; they aim at one pass over their data with
// coalesced accesses, and at the CPU backend's arithmetic, operation for operation: products
// and sums that the CPU rounds separately use the _rn intrinsics so that --use_fast_math's
// contraction into FMAs does not change the last bit. Embed, rope, rmsnorm and SwiGLU give the
// CPU's bits: sums of squares in double, sin, cos and exp in double rounded once to float.
#include <cuda_fp16.h>

#include <type_traits>

#include "backend/cuda/cuda_check.cuh"
#include "backend/cuda/matmul_kernels.cuh"
#include "backend/cuda/matmul_quant.cuh"
#include "backend/cuda/ops.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/phase_trace.cuh"
#include "backend/cuda/quantize_q8.cuh"
#include "backend/cuda/rope.cuh"
#include "backend/cuda/swiglu.cuh"
#include "backend/cuda/warp_reduce.cuh"
#include "core/error.h"
#include "quant/types.h"

namespace nt::cuda {

namespace {

__device__ __forceinline__ float h2f(uint16_t h) {
    return __half2float(__ushort_as_half(h));
}
__device__ __forceinline__ float mul(float a, float b) {
    return __fmul_rn(a, b);
}
__device__ __forceinline__ float sub(float a, float b) {
    return __fsub_rn(a, b);
}
__device__ __forceinline__ float addf(float a, float b) {
    return __fadd_rn(a, b);
}

// ---- dequantization of one element of a GGML block ---------------------------------------------
// Deq<T>::at(block, j) returns element j (< QK) of the block at `b`, computed exactly as
// llama.cpp's dequantize_row_* (and gguf-py) compute it. Blocks are packed structs, so the
// compiler reads their fields with byte loads whatever the alignment.
template <GgmlType T>
struct Deq;

template <>
struct Deq<GgmlType::F32> {
    static constexpr int QK = 1, BYTES = 4;
    __device__ static float at(const uint8_t* b, int) { return *reinterpret_cast<const float*>(b); }
};
template <>
struct Deq<GgmlType::F16> {
    static constexpr int QK = 1, BYTES = 2;
    __device__ static float at(const uint8_t* b, int) {
        return h2f(*reinterpret_cast<const uint16_t*>(b));
    }
};
template <>
struct Deq<GgmlType::BF16> {
    static constexpr int QK = 1, BYTES = 2;
    __device__ static float at(const uint8_t* b, int) {
        return __uint_as_float(uint32_t(*reinterpret_cast<const uint16_t*>(b)) << 16);
    }
};
template <>
struct Deq<GgmlType::Q4_0> {
    static constexpr int QK = QK4_0, BYTES = sizeof(block_q4_0);
    __device__ static float at(const uint8_t* b, int j) {
        const block_q4_0* x = reinterpret_cast<const block_q4_0*>(b);
        const int q = j < 16 ? (x->qs[j] & 0xF) : (x->qs[j - 16] >> 4);
        return mul(float(q - 8), h2f(x->d));
    }
};
template <>
struct Deq<GgmlType::Q4_1> {
    static constexpr int QK = QK4_1, BYTES = sizeof(block_q4_1);
    __device__ static float at(const uint8_t* b, int j) {
        const block_q4_1* x = reinterpret_cast<const block_q4_1*>(b);
        const int q = j < 16 ? (x->qs[j] & 0xF) : (x->qs[j - 16] >> 4);
        return addf(mul(float(q), h2f(x->d)), h2f(x->m));
    }
};
__device__ __forceinline__ uint32_t load_qh(const uint8_t* qh) {
    return uint32_t(qh[0]) | uint32_t(qh[1]) << 8 | uint32_t(qh[2]) << 16 | uint32_t(qh[3]) << 24;
}
template <>
struct Deq<GgmlType::Q5_0> {
    static constexpr int QK = QK5_0, BYTES = sizeof(block_q5_0);
    __device__ static float at(const uint8_t* b, int j) {
        const block_q5_0* x = reinterpret_cast<const block_q5_0*>(b);
        const int lo = j < 16 ? (x->qs[j] & 0xF) : (x->qs[j - 16] >> 4);
        const int hi = int((load_qh(x->qh) >> j) & 1u) << 4;  // element j's fifth bit is bit j
        return mul(float((lo | hi) - 16), h2f(x->d));
    }
};
template <>
struct Deq<GgmlType::Q5_1> {
    static constexpr int QK = QK5_1, BYTES = sizeof(block_q5_1);
    __device__ static float at(const uint8_t* b, int j) {
        const block_q5_1* x = reinterpret_cast<const block_q5_1*>(b);
        const int lo = j < 16 ? (x->qs[j] & 0xF) : (x->qs[j - 16] >> 4);
        const int hi = int((load_qh(x->qh) >> j) & 1u) << 4;
        return addf(mul(float(lo | hi), h2f(x->d)), h2f(x->m));
    }
};
template <>
struct Deq<GgmlType::Q8_0> {
    static constexpr int QK = QK8_0, BYTES = sizeof(block_q8_0);
    __device__ static float at(const uint8_t* b, int j) {
        const block_q8_0* x = reinterpret_cast<const block_q8_0*>(b);
        return mul(float(x->qs[j]), h2f(x->d));
    }
};
// K-quants: 256 elements in halves of 128 (Q2_K, Q3_K, Q6_K) or groups of 64 (Q4_K, Q5_K).
template <>
struct Deq<GgmlType::Q2_K> {
    static constexpr int QK = QK_K, BYTES = sizeof(block_q2_K);
    __device__ static float at(const uint8_t* b, int e) {
        const block_q2_K* x = reinterpret_cast<const block_q2_K*>(b);
        const int n = e / 128, r = e % 128, j = r / 32, l = r % 32;
        const uint8_t sc = x->scales[n * 8 + j * 2 + l / 16];
        const int q = (x->qs[n * 32 + l] >> (2 * j)) & 3;
        const float dl = mul(h2f(x->d), float(sc & 0xF));
        const float ml = mul(h2f(x->dmin), float(sc >> 4));
        return sub(mul(dl, float(q)), ml);
    }
};
template <>
struct Deq<GgmlType::Q3_K> {
    static constexpr int QK = QK_K, BYTES = sizeof(block_q3_K);
    __device__ static float at(const uint8_t* b, int e) {
        const block_q3_K* x = reinterpret_cast<const block_q3_K*>(b);
        const int n = e / 128, r = e % 128, j = r / 32, l = r % 32;
        const int is = n * 8 + j * 2 + l / 16;  // which of the 16 six-bit scales
        const int sc_lo = (x->scales[is % 8] >> (4 * (is / 8))) & 0xF;
        const int sc_hi = (x->scales[8 + is % 4] >> (2 * (is / 4))) & 3;
        const int sc = int(int8_t(uint8_t(sc_lo | sc_hi << 4))) - 32;
        const int hbit = x->hmask[l] & (1 << (n * 4 + j));
        const int q = ((x->qs[n * 32 + l] >> (2 * j)) & 3) - (hbit ? 0 : 4);
        return mul(mul(h2f(x->d), float(sc)), float(q));
    }
};
template <>
struct Deq<GgmlType::Q4_K> {
    static constexpr int QK = QK_K, BYTES = sizeof(block_q4_K);
    __device__ static float at(const uint8_t* b, int e) {
        const block_q4_K* x = reinterpret_cast<const block_q4_K*>(b);
        const int g = e / 64, hi = (e % 64) / 32, l = e % 32;
        int sc, m;
        detail::scale_min_k4(g * 2 + hi, x->scales, sc, m);
        const uint8_t byte = x->qs[g * 32 + l];
        const int q = hi ? byte >> 4 : byte & 0xF;
        return sub(mul(mul(h2f(x->d), float(sc)), float(q)), mul(h2f(x->dmin), float(m)));
    }
};
template <>
struct Deq<GgmlType::Q5_K> {
    static constexpr int QK = QK_K, BYTES = sizeof(block_q5_K);
    __device__ static float at(const uint8_t* b, int e) {
        const block_q5_K* x = reinterpret_cast<const block_q5_K*>(b);
        const int g = e / 64, hi = (e % 64) / 32, l = e % 32;
        int sc, m;
        detail::scale_min_k4(g * 2 + hi, x->scales, sc, m);
        const uint8_t byte = x->qs[g * 32 + l];
        const int q = (hi ? byte >> 4 : byte & 0xF) + ((x->qh[l] >> (2 * g + hi)) & 1 ? 16 : 0);
        return sub(mul(mul(h2f(x->d), float(sc)), float(q)), mul(h2f(x->dmin), float(m)));
    }
};
template <>
struct Deq<GgmlType::Q6_K> {
    static constexpr int QK = QK_K, BYTES = sizeof(block_q6_K);
    __device__ static float at(const uint8_t* b, int e) {
        const block_q6_K* x = reinterpret_cast<const block_q6_K*>(b);
        const int n = e / 128, r = e % 128, quad = r / 32, l = r % 32;
        const uint8_t lbyte = x->ql[n * 64 + l + (quad & 1) * 32];
        const int lo = quad < 2 ? lbyte & 0xF : lbyte >> 4;
        const int hi = (x->qh[n * 32 + l] >> (2 * quad)) & 3;
        const int q = int(int8_t(uint8_t(lo | hi << 4))) - 32;
        const int sc = x->scales[n * 8 + l / 16 + quad * 2];
        return mul(mul(h2f(x->d), float(sc)), float(q));
    }
};

template <GgmlType T>
__device__ __forceinline__ float elem(const uint8_t* row, int64_t j) {
    using D = Deq<T>;
    return D::at(row + (j / D::QK) * D::BYTES, int(j % D::QK));
}

// Calls f(std::integral_constant<GgmlType, T>) for the run-time type t; false if unsupported.
template <class F>
bool dispatch_type(GgmlType t, F&& f) {
    switch (t) {
#define NT_CASE(T)                                          \
    case GgmlType::T:                                       \
        f(std::integral_constant<GgmlType, GgmlType::T>{}); \
        return true;
        NT_CASE(F32)
        NT_CASE(F16)
        NT_CASE(BF16)
        NT_CASE(Q4_0)
        NT_CASE(Q4_1)
        NT_CASE(Q5_0)
        NT_CASE(Q5_1)
        NT_CASE(Q8_0)
        NT_CASE(Q2_K)
        NT_CASE(Q3_K)
        NT_CASE(Q4_K)
        NT_CASE(Q5_K)
        NT_CASE(Q6_K)
#undef NT_CASE
        default:
            return false;
    }
}

// ---- kernels -----------------------------------------------------------------------------------

constexpr int kThreads = 256;

template <GgmlType T>
__global__ void embed_kernel(const uint8_t* table, size_t row_bytes, const int32_t* tokens,
                             const int32_t* fed, int64_t cols, float* x) {
    const int i = blockIdx.x;
    const int64_t j = int64_t(blockIdx.y) * blockDim.x + threadIdx.x;
    if (j >= cols) return;
    const int32_t t = tokens[i] == kFedToken ? *fed : tokens[i];
    x[int64_t(i) * cols + j] = elem<T>(table + size_t(t) * row_bytes, j);
}

// Sum over the block; every thread gets the result. `red` holds one double per warp.
__device__ __forceinline__ double block_sum(double v, double* red) {
    return detail::block_reduce(v, red, 0.0, detail::WarpSum{});
}

// The norm's scale from the row's sum of squares, as the CPU computes it: the squares summed in
// double (each one exact), the mean rounded once to float, then 1 / sqrt(mean + eps) with every
// float operation rounded on its own. Summed in double, the order (the CPU's sequential, the
// block's tree here) moves the sum by a few double ulps, far below the float the mean rounds to,
// so both backends get the same scale but for ties once in millions of rows; summed in float,
// they differed in the last bit of about every other row.
__device__ __forceinline__ float norm_scale(double sum_sq, int dim, float eps) {
    return __frcp_rn(__fsqrt_rn(addf(__double2float_rn(sum_sq / double(dim)), eps)));
}

// One block per row. The row is read twice (sum of squares, then scale); the second read hits
// L1/L2.
template <GgmlType T>
__global__ void rmsnorm_kernel(const float* x, const uint8_t* w, int dim, float eps, float* out) {
    __shared__ double red[32];
    const float* xr = x + int64_t(blockIdx.x) * dim;
    float* o = out + int64_t(blockIdx.x) * dim;
    double s = 0;
    auto sq = [](float v) { return double(v) * double(v); };
    if ((dim & 3) == 0) {
        const float4* x4 = reinterpret_cast<const float4*>(xr);
        for (int j = threadIdx.x; j < dim / 4; j += blockDim.x) {
            const float4 v = x4[j];
            s += sq(v.x) + sq(v.y) + sq(v.z) + sq(v.w);
        }
    } else {
        for (int j = threadIdx.x; j < dim; j += blockDim.x) s += sq(xr[j]);
    }
    // As the CPU: scale = 1 / sqrt(mean + eps), then (x * scale) * w, each rounded.
    const float scale = norm_scale(block_sum(s, red), dim, eps);
    for (int j = threadIdx.x; j < dim; j += blockDim.x)
        o[j] = mul(mul(xr[j], scale), elem<T>(w, j));
}

// x += y, the row's RMSNorm and, for MODE >= 0, the GEMV's int8 activations of the result
// (MODE = int(detail::ActQuant)), in one pass: one block per row, dim / 8 threads (dim a
// multiple of 256, at most 8192) holding 8 consecutive elements each, so the row is read once
// and stays in registers. The scale and the products are rmsnorm_kernel's, operation for
// operation (only the sum of squares runs in another order); the quantization is
// quantize_q8's (the same per-block functions on the same floats): Q8_0/Q8_1 with 4 threads
// per 32-element block, Q8_K with a warp per 256. WT: F32 (16-byte aligned) or F16 weights.
constexpr int kNoQuant = -1;
constexpr int kQ80 = int(detail::ActQuant::Q8_0), kQ81 = int(detail::ActQuant::Q8_1),
              kQ8K = int(detail::ActQuant::Q8_K);

template <GgmlType WT, int MODE>
__global__ void __launch_bounds__(1024)
    add_rmsnorm_kernel(float* x, const float* y, const uint8_t* w, int dim, float eps, float* out,
                       int8_t* xq, float2* xd) {
    NT_PHASE_TIME(t_entry);
    NT_PHASE_SLOTS(marks);
    __shared__ double red[32];
    // The GEMV that reads out (launched as a programmatic dependent) may start loading its
    // weights now; it waits for this grid to finish before it reads the activations.
    pdl_trigger();
    const int t = threadIdx.x;
    if (t == 0) NT_PHASE_RESERVE(marks, phase::kNorm, w, 4);
    const int64_t e0 = int64_t(blockIdx.x) * dim + t * 8;  // this thread's first element
    float v[8], wv[8];
    // The norm's weights before the wait (nothing in the stream writes them; their latency
    // hides behind the kernel before when this one is a programmatic dependent launch).
    if constexpr (WT == GgmlType::F32) {
        const float4 a = __ldg(reinterpret_cast<const float4*>(w) + t * 2);
        const float4 b = __ldg(reinterpret_cast<const float4*>(w) + t * 2 + 1);
        wv[0] = a.x, wv[1] = a.y, wv[2] = a.z, wv[3] = a.w, wv[4] = b.x, wv[5] = b.y, wv[6] = b.z,
        wv[7] = b.w;
    } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) wv[i] = elem<WT>(w, t * 8 + i);
    }
    pdl_wait(x, y, out, xq, xd);
    if (t == 0) {
        NT_PHASE_MARK_AT(marks, phase::kEntry, t_entry);
        NT_PHASE_MARK(marks, phase::kWaited);
    }
    {
        const float4 a = reinterpret_cast<const float4*>(x + e0)[0];
        const float4 b = reinterpret_cast<const float4*>(x + e0)[1];
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z,
        v[7] = b.w;
    }
    if (y) {
        const float4 a = reinterpret_cast<const float4*>(y + e0)[0];
        const float4 b = reinterpret_cast<const float4*>(y + e0)[1];
        v[0] = addf(v[0], a.x), v[1] = addf(v[1], a.y), v[2] = addf(v[2], a.z),
        v[3] = addf(v[3], a.w), v[4] = addf(v[4], b.x), v[5] = addf(v[5], b.y),
        v[6] = addf(v[6], b.z), v[7] = addf(v[7], b.w);
        reinterpret_cast<float4*>(x + e0)[0] = make_float4(v[0], v[1], v[2], v[3]);
        reinterpret_cast<float4*>(x + e0)[1] = make_float4(v[4], v[5], v[6], v[7]);
    }
    double s = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) s += double(v[i]) * double(v[i]);
    const float scale = norm_scale(block_sum(s, red), dim, eps);
    if (t == 0) NT_PHASE_MARK(marks, phase::kStep1);
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = mul(mul(v[i], scale), wv[i]);
    reinterpret_cast<float4*>(out + e0)[0] = make_float4(v[0], v[1], v[2], v[3]);
    reinterpret_cast<float4*>(out + e0)[1] = make_float4(v[4], v[5], v[6], v[7]);
    if constexpr (MODE != kNoQuant) {
        int q[8];
        const float2 dq = MODE == kQ8K ? detail::q8k_block(v, t & 31, q)
                                       : detail::q8_block<8, MODE == kQ81>(v, q);
        detail::store_q8(xq + e0, q);
        // Both layouts keep one pair per 32 elements, and 4 threads cover 32.
        if ((t & 3) == 0) xd[e0 / 32] = dq;
    }
    if (t == 0) NT_PHASE_MARK(marks, phase::kDone);
}

// Version 1: one block per batch row: the row's cos/sin table first (double precision, so the
// only difference from the CPU's cosf/sinf of the same float angle is the final rounding), then
// every pair of every q and k head in a loop (latency-bound: 7.5 us for 8B at batch 1).
__global__ void rope_kernel(float* q, float* k, const int32_t* pos, int n_head, int n_head_kv,
                            int head_dim, int half, const float* inv_freq) {
    extern __shared__ float cs[];  // [half] cos, then [half] sin
    const int i = blockIdx.x;
    for (int j = threadIdx.x; j < half; j += blockDim.x)
        detail::rope_angle(pos[i], inv_freq[j], cs[j], cs[half + j]);
    __syncthreads();
    const int pairs = (n_head + n_head_kv) * half;
    for (int t = threadIdx.x; t < pairs; t += blockDim.x) {
        const int h = t / half, j = t % half;
        float* v = h < n_head ? q + (int64_t(i) * n_head + h) * head_dim
                              : k + (int64_t(i) * n_head_kv + (h - n_head)) * head_dim;
        v += 2 * j;
        const float2 x = detail::rope_turn(v[0], v[1], cs[j], cs[half + j]);
        v[0] = x.x;
        v[1] = x.y;
    }
}

// Version 2: one thread per (row, pair), each turning its pair by its own cos/sin (the same
// double-precision sincos of the same float angle as version 1, so the same bits). Threads run
// along the pairs of a head, then the heads (q's, then k's), then the rows: a warp reads and
// writes consecutive pairs. VEC: q and k are 8-byte aligned (pairs as float2).
// STORE (rope_kv_store): the turned k pairs also go to the F16 K cache and, as n_head_kv more
// "heads" per row, the v pairs to the V cache (rounded as kv_store rounds them).
struct KvStoreArgs {
    const float* v = nullptr;
    const int32_t* seq = nullptr;
    int n_ctx = 0;
    __half* kc = nullptr;
    __half* vc = nullptr;
};
template <bool VEC, bool STORE = false>
__global__ void rope_pair_kernel(float* q, float* k, const int32_t* pos, int64_t total, int n_head,
                                 int n_head_kv, int head_dim, int half, const float* inv_freq,
                                 KvStoreArgs st = {}) {
    pdl_trigger();
    const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (t >= total) return;
    const int per_row = (n_head + (STORE ? 2 : 1) * n_head_kv) * half;
    const int64_t i = t / per_row;
    const int r = int(t - i * per_row);
    const int h = r / half, j = r - h * half;
    const int kv_dim = n_head_kv * head_dim;
    // Cache cell offset of this pair (k and v heads), when storing.
    const size_t cell = STORE ? (size_t(st.seq[i]) * size_t(st.n_ctx) + size_t(pos[i])) * kv_dim +
                                    size_t(h - n_head) % size_t(n_head_kv) * head_dim + 2 * j
                              : 0;
    // The angle needs only the step's positions (uploaded before the step's first kernel), so
    // as a programmatic dependent launch its double-precision sincos runs under the tail of the
    // GEMV before; q, k, v and the cache are touched after the wait.
    float c = 1.f, s = 0.f;
    if (!STORE || h < n_head + n_head_kv) detail::rope_angle(pos[i], inv_freq[j], c, s);
    pdl_wait(q, k, st.v, st.kc, st.vc);
    if (STORE && h >= n_head + n_head_kv) {  // a v pair: stored as it is
        const float* vp = st.v + i * kv_dim + (h - n_head - n_head_kv) * head_dim + 2 * j;
        const float2 p = VEC ? *reinterpret_cast<const float2*>(vp) : make_float2(vp[0], vp[1]);
        *reinterpret_cast<__half2*>(st.vc + cell) = __float22half2_rn(p);
        return;
    }
    float* v = h < n_head ? q + (i * n_head + h) * head_dim
                          : k + (i * n_head_kv + (h - n_head)) * head_dim;
    v += 2 * j;
    float a, b;
    if constexpr (VEC) {
        const float2 p = *reinterpret_cast<const float2*>(v);
        a = p.x, b = p.y;
    } else {
        a = v[0], b = v[1];
    }
    const float2 x = detail::rope_turn(a, b, c, s);
    const float x0 = x.x, x1 = x.y;
    if constexpr (VEC) {
        *reinterpret_cast<float2*>(v) = make_float2(x0, x1);
    } else {
        v[0] = x0, v[1] = x1;
    }
    if (STORE && h >= n_head)
        *reinterpret_cast<__half2*>(st.kc + cell) = __float22half2_rn(make_float2(x0, x1));
}

using detail::silu_mul;

__global__ void swiglu_kernel(const float* gate, const float* up, int64_t n, float* out) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += int64_t(gridDim.x) * blockDim.x)
        out[i] = silu_mul(gate[i], up[i]);
}
__global__ void swiglu4_kernel(const float4* gate, const float4* up, int64_t n4, float4* out) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n4;
         i += int64_t(gridDim.x) * blockDim.x) {
        const float4 g = gate[i], u = up[i];
        out[i] = make_float4(silu_mul(g.x, u.x), silu_mul(g.y, u.y), silu_mul(g.z, u.z),
                             silu_mul(g.w, u.w));
    }
}

__global__ void add_kernel(float* x, const float* y, int64_t n) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += int64_t(gridDim.x) * blockDim.x)
        x[i] += y[i];
}
__global__ void add4_kernel(float4* x, const float4* y, int64_t n4) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n4;
         i += int64_t(gridDim.x) * blockDim.x) {
        float4 a = x[i];
        const float4 b = y[i];
        a.x += b.x;
        a.y += b.y;
        a.z += b.z;
        a.w += b.w;
        x[i] = a;
    }
}

__global__ void gather_kernel(const float* x, int dim, const int32_t* rows, float* dst) {
    const float* src = x + int64_t(rows[blockIdx.x]) * dim;
    float* d = dst + int64_t(blockIdx.x) * dim;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) d[j] = src[j];
}
// In-place compaction: rows[j] >= j, so copying rows in increasing j never overwrites a row that
// is still to be read; one block walks the rows in order.
__global__ void gather_inplace_kernel(float* x, int dim, const int32_t* rows, int n) {
    for (int j = 0; j < n; j++) {
        const int r = rows[j];
        if (r != j)
            for (int c = threadIdx.x; c < dim; c += blockDim.x)
                x[int64_t(j) * dim + c] = x[int64_t(r) * dim + c];
        __syncthreads();
    }
}

__global__ void read_kernel(const uint4* buf, size_t n, uint32_t* sink) {
    uint32_t acc = 0;
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += size_t(gridDim.x) * blockDim.x) {
        const uint4 v = __ldcs(buf + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
    if (threadIdx.x == 0) sink[blockIdx.x] = acc;
}

// Grid for elementwise loops: enough blocks to fill any current GPU, grid-stride beyond.
int grid_for(int64_t n) {
    return int(std::min<int64_t>((n + kThreads - 1) / kThreads, 8192));
}

bool aligned16(const void* p) {
    return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}
bool aligned8(const void* p) {
    return (reinterpret_cast<uintptr_t>(p) & 7) == 0;
}

template <GgmlType WT>
void launch_add_rmsnorm(int mode, float* x, const float* y, const uint8_t* w, int n, int dim,
                        float eps, float* out, int8_t* xq, float2* xd, bool pdl,
                        cudaStream_t stream) {
    const dim3 grid{unsigned(n)}, threads{unsigned(dim / 8)};
    auto go = [&](auto kernel) {
        launch_kernel(pdl, kernel, grid, threads, 0, stream, "add_rmsnorm kernel", x, y, w, dim,
                      eps, out, xq, xd);
    };
    switch (mode) {
        case kNoQuant:
            return go(add_rmsnorm_kernel<WT, kNoQuant>);
        case kQ80:
            return go(add_rmsnorm_kernel<WT, kQ80>);
        case kQ81:
            return go(add_rmsnorm_kernel<WT, kQ81>);
        case kQ8K:
            return go(add_rmsnorm_kernel<WT, kQ8K>);
        default:
            fail("add_rmsnorm: unknown activation quantization %d.", mode);
    }
}

}  // namespace

bool elementwise_supports(GgmlType t) {
    return dispatch_type(t, [](auto) {});
}

void embed(const WeightView& tok_embd, const int32_t* tokens, const int32_t* fed, int n, float* x,
           cudaStream_t stream) {
    if (n <= 0) return;
    const size_t rb = row_bytes(tok_embd.type, tok_embd.cols);
    const dim3 grid(unsigned(n), unsigned((tok_embd.cols + kThreads - 1) / kThreads));
    const bool ok = dispatch_type(tok_embd.type, [&](auto tag) {
        constexpr GgmlType T = decltype(tag)::value;
        embed_kernel<T><<<grid, kThreads, 0, stream>>>(static_cast<const uint8_t*>(tok_embd.data),
                                                       rb, tokens, fed, tok_embd.cols, x);
    });
    if (!ok)
        fail("token embeddings of type %s are not supported by the CUDA backend.",
             type_name(tok_embd.type));
    NT_CUDA_CHECK(cudaGetLastError(), "embed kernel");
}

void rmsnorm(const float* x, const WeightView& w, int n, int dim, float eps, float* out,
             cudaStream_t stream) {
    if (n <= 0) return;
    const int threads = dim >= 4096 ? 1024 : dim >= 1024 ? 512 : 256;
    const bool ok = dispatch_type(w.type, [&](auto tag) {
        constexpr GgmlType T = decltype(tag)::value;
        rmsnorm_kernel<T>
            <<<n, threads, 0, stream>>>(x, static_cast<const uint8_t*>(w.data), dim, eps, out);
    });
    if (!ok)
        fail("norm weights of type %s are not supported by the CUDA backend.", type_name(w.type));
    NT_CUDA_CHECK(cudaGetLastError(), "rmsnorm kernel");
}

bool add_rmsnorm_fusable(const float* x, const float* y, const WeightView& w, int dim,
                         const float* out) {
    const bool weights = (w.type == GgmlType::F32 && aligned16(w.data)) || w.type == GgmlType::F16;
    return dim > 0 && dim % 256 == 0 && dim <= 8192 && weights && aligned16(x) &&
           (!y || aligned16(y)) && aligned16(out);
}

bool add_rmsnorm(float* x, const float* y, const WeightView& w, int n, int dim, float eps,
                 float* out, const ActivationSlot* quant, cudaStream_t stream, bool pdl) {
    if (n <= 0) return false;
    if (!add_rmsnorm_fusable(x, y, w, dim, out)) {
        if (y) add(x, y, int64_t(n) * dim, stream);
        rmsnorm(x, w, n, dim, eps, out, stream);
        return false;
    }
    const int mode = quant ? int(quant->mode) : kNoQuant;
    int8_t* xq = quant ? quant->xq : nullptr;
    float2* xd = quant ? quant->xd : nullptr;
    const auto* wd = static_cast<const uint8_t*>(w.data);
    if (w.type == GgmlType::F32)
        launch_add_rmsnorm<GgmlType::F32>(mode, x, y, wd, n, dim, eps, out, xq, xd, pdl, stream);
    else
        launch_add_rmsnorm<GgmlType::F16>(mode, x, y, wd, n, dim, eps, out, xq, xd, pdl, stream);
    NT_CUDA_CHECK(cudaGetLastError(), "add_rmsnorm kernel");
    return quant != nullptr;
}

void rope(float* q, float* k, const int32_t* pos, int n, int n_head, int n_head_kv, int head_dim,
          int n_rot, const float* inv_freq, cudaStream_t stream, int version) {
    if (n <= 0) return;
    const int half = n_rot / 2;
    if (half <= 0) return;  // nothing turns
    if (version == 1) {
        rope_kernel<<<n, 256, size_t(2 * half) * sizeof(float), stream>>>(
            q, k, pos, n_head, n_head_kv, head_dim, half, inv_freq);
    } else {
        const int64_t total = int64_t(n) * (n_head + n_head_kv) * half;
        constexpr int kRopeThreads = 128;  // 8B at batch 1: 2560 pairs, 20 blocks
        const unsigned blocks = unsigned((total + kRopeThreads - 1) / kRopeThreads);
        if (head_dim % 2 == 0 && aligned8(q) && aligned8(k))
            rope_pair_kernel<true><<<blocks, kRopeThreads, 0, stream>>>(
                q, k, pos, total, n_head, n_head_kv, head_dim, half, inv_freq);
        else
            rope_pair_kernel<false><<<blocks, kRopeThreads, 0, stream>>>(
                q, k, pos, total, n_head, n_head_kv, head_dim, half, inv_freq);
    }
    NT_CUDA_CHECK(cudaGetLastError(), "rope kernel");
}

void rope_kv_store(float* q, float* k, const float* v, const int32_t* pos, const int32_t* seq,
                   int n, int n_head, int n_head_kv, int head_dim, const float* inv_freq, int n_ctx,
                   __half* k_cache, __half* v_cache, cudaStream_t stream, bool pdl) {
    if (n <= 0) return;
    if (head_dim % 2 != 0) fail("rope_kv_store: head_dim %d is odd.", head_dim);
    const int half = head_dim / 2;
    const int64_t total = int64_t(n) * (n_head + 2 * n_head_kv) * half;
    constexpr int kRopeThreads = 128;
    const unsigned blocks = unsigned((total + kRopeThreads - 1) / kRopeThreads);
    const KvStoreArgs st{v, seq, n_ctx, k_cache, v_cache};
    launch_kernel(pdl,
                  aligned8(q) && aligned8(k) && aligned8(v) ? rope_pair_kernel<true, true>
                                                            : rope_pair_kernel<false, true>,
                  dim3(blocks), dim3(kRopeThreads), 0, stream, "rope + kv store kernel", q, k, pos,
                  total, n_head, n_head_kv, head_dim, half, inv_freq, st);
}

void swiglu(const float* gate, const float* up, int64_t n, float* out, cudaStream_t stream) {
    if (n <= 0) return;
    if ((n & 3) == 0 && aligned16(gate) && aligned16(up) && aligned16(out))
        swiglu4_kernel<<<grid_for(n / 4), kThreads, 0, stream>>>(
            reinterpret_cast<const float4*>(gate), reinterpret_cast<const float4*>(up), n / 4,
            reinterpret_cast<float4*>(out));
    else
        swiglu_kernel<<<grid_for(n), kThreads, 0, stream>>>(gate, up, n, out);
    NT_CUDA_CHECK(cudaGetLastError(), "swiglu kernel");
}

void add(float* x, const float* y, int64_t n, cudaStream_t stream) {
    if (n <= 0) return;
    if ((n & 3) == 0 && aligned16(x) && aligned16(y))
        add4_kernel<<<grid_for(n / 4), kThreads, 0, stream>>>(
            reinterpret_cast<float4*>(x), reinterpret_cast<const float4*>(y), n / 4);
    else
        add_kernel<<<grid_for(n), kThreads, 0, stream>>>(x, y, n);
    NT_CUDA_CHECK(cudaGetLastError(), "add kernel");
}

void gather_rows(const float* x, int dim, const int32_t* rows, int n, float* dst,
                 cudaStream_t stream) {
    if (n <= 0) return;
    if (dst == x)
        gather_inplace_kernel<<<1, 1024, 0, stream>>>(dst, dim, rows, n);
    else
        gather_kernel<<<n, kThreads, 0, stream>>>(x, dim, rows, dst);
    NT_CUDA_CHECK(cudaGetLastError(), "gather_logit_rows kernel");
}

void read_bandwidth_kernel(const void* buf, size_t bytes, uint32_t* sink, int blocks,
                           cudaStream_t stream) {
    read_kernel<<<blocks, 512, 0, stream>>>(static_cast<const uint4*>(buf), bytes / 16, sink);
    NT_CUDA_CHECK(cudaGetLastError(), "read bandwidth kernel");
}

}  // namespace nt::cuda
