// Two GEMVs with a norm between them in one launch (internal; one activation row, sm_90+, the
// TMA form's whole rows): the decode step's attention output projection, the residual add and
// RMSNorm before the feed-forward, and the feed-forward's SwiGLU pair.
//
//   ya = Wa xa;  x += ya;  out = rmsnorm(x) * w (and its int8 activations);  yb = silu(G out) * (U
//   out)
//
// Why one launch: between two GEMV launches HBM idles for about a memory latency, even with
// programmatic launches (pdl.cuh): the second kernel's CTAs only start, and only ask for their
// first weights, as the first kernel's CTAs leave, and those leave together at the end. Here
// every warp's TMA ring (matmul_gemv_tma.cuh) runs on from its rows of Wa into its rows of G
// and U without a break, so the pair's first weights are in flight while Wa's last rows are
// summed and while the norm runs; only the arithmetic waits for the norm.
//
// The norm runs once, in the CTA that finishes Wa last: every CTA counts itself on a 64-bit
// counter (`arrive`) after its warps' rows of ya are written; the CTA that brings the count to
// this launch's end adds, norms and quantizes the row (rmsnorm_q8.cuh: add_rmsnorm's kernel's
// operations in its order, so the same bits), then raises `flag` to that count; the others wait
// for it there, with their pair stages already landing. Both counters only grow, so no launch
// resets anything: a CTA reads `flag` at its start (the launch before on this pair of counters,
// long finished, left it at the count it reached), and the launch's end is that plus the grid.
// Every CTA waits on another, so the whole grid must be resident at once: the grid is what the
// occupancy calculator says fits, at the largest shared-memory carveout, and no larger.
//
// Bit for bit what the three launches give (matmul on Wa, add_rmsnorm, matmul_swiglu): each row
// is summed by the TMA form's code in its order, the norm is add_rmsnorm's, the pair's
// quantization of yb is the pair kernel's.
#pragma once
#include <cstdint>

#include "backend/cuda/matmul_gemv_tma.cuh"
#include "backend/cuda/rmsnorm_q8.cuh"

namespace nt::cuda::detail {

// Columns of a row of kXU units of type T, and the norm's 1024s in it (its 128 threads hold 8
// elements each kNV times).
template <GgmlType T, int kXU>
constexpr int chain_nv() {
    return kXU * (32 / Quant<T>::kLanesPerBlock) * Quant<T>::kBlockElems / 1024;
}
// The types and row lengths (kXU units: the TMA form's register-held activations) with a chained
// kernel: Q4_K and Q6_K, rows of 4096 columns (8B) and Q4_K's of 8192 (70B).
template <GgmlType T, int kXU>
constexpr bool chain_compiled() {
    return (T == GgmlType::Q4_K || T == GgmlType::Q6_K) && tma_x_units<T>(kXU) &&
           (chain_nv<T, kXU>() == 4 || chain_nv<T, kXU>() == 8);
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ uint64_t ld_acquire_u64(const uint64_t* p) {
    uint64_t v;
    asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void st_release_u64(uint64_t* p, uint64_t v) {
    asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ uint64_t globaltimer_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
// Longer than any norm could take (a few microseconds): past it, the grid is not all resident.
constexpr uint64_t kChainWaitNs = 2000000000ull;
#endif

// The chained launch's norm, in the one CTA that runs it (128 threads standing in for
// add_rmsnorm's dim / 8: thread t of warp w for its threads (w kNV + j) 32 + t, j < kNV): x +=
// ya, out = rmsnorm(x) * w, out's int8 activations (MODE) into xq / xd. ya was written by other
// CTAs of this launch (read through L2); out may be ya (the decode step's case: each thread
// reads its elements before it writes them). Rows of 8192 (kNV 8) read x and ya twice rather
// than hold 64 floats a thread through the sum.
template <int kNV, int MODE>
__device__ __forceinline__ void chain_norm(const ChainArgs& c, float* red) {
    constexpr bool kHold = kNV <= 4;
    constexpr int kH = kHold ? kNV : 1;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    auto sum = [&](int j, float(&v)[8]) {
        const int64_t e0 = (int64_t(warp * kNV + j) * 32 + lane) * 8;
        const float4 a = __ldcg(reinterpret_cast<const float4*>(c.x + e0));
        const float4 b = __ldcg(reinterpret_cast<const float4*>(c.x + e0) + 1);
        const float4 ya = __ldcg(reinterpret_cast<const float4*>(c.ya + e0));
        const float4 yb = __ldcg(reinterpret_cast<const float4*>(c.ya + e0) + 1);
        v[0] = __fadd_rn(a.x, ya.x), v[1] = __fadd_rn(a.y, ya.y);
        v[2] = __fadd_rn(a.z, ya.z), v[3] = __fadd_rn(a.w, ya.w);
        v[4] = __fadd_rn(b.x, yb.x), v[5] = __fadd_rn(b.y, yb.y);
        v[6] = __fadd_rn(b.z, yb.z), v[7] = __fadd_rn(b.w, yb.w);
    };
    float v[kH][8];
#pragma unroll
    for (int j = 0; j < kNV; ++j) {
        float(&vj)[8] = v[kHold ? j : 0];
        sum(j, vj);
        const float s = warp_sum_xor(sum_sq8(vj));
        if (lane == 0) red[warp * kNV + j] = s;
    }
    __syncthreads();  // every thread has read its x and ya (the writes below may overwrite ya)
    const float scale = rms_scale(sum_of_warps(red, kNV * kPipeWarps, lane), c.dim, c.eps);
#pragma unroll
    for (int j = 0; j < kNV; ++j) {
        const int64_t e0 = (int64_t(warp * kNV + j) * 32 + lane) * 8;
        float(&vj)[8] = v[kHold ? j : 0];
        if constexpr (!kHold) sum(j, vj);
        reinterpret_cast<float4*>(c.x + e0)[0] = make_float4(vj[0], vj[1], vj[2], vj[3]);
        reinterpret_cast<float4*>(c.x + e0)[1] = make_float4(vj[4], vj[5], vj[6], vj[7]);
        const float4 wa = __ldg(reinterpret_cast<const float4*>(c.norm_w + e0));
        const float4 wb = __ldg(reinterpret_cast<const float4*>(c.norm_w + e0) + 1);
        const float w[8] = {wa.x, wa.y, wa.z, wa.w, wb.x, wb.y, wb.z, wb.w};
        float o[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) o[i] = rms_apply(vj[i], scale, w[i]);
        reinterpret_cast<float4*>(c.out + e0)[0] = make_float4(o[0], o[1], o[2], o[3]);
        reinterpret_cast<float4*>(c.out + e0)[1] = make_float4(o[4], o[5], o[6], o[7]);
        quantize8<MODE>(o, lane, c.xq_n, c.xd_n, e0);
    }
}

// nb: blocks of a row (Wa, G and U alike: cols = dim).
template <GgmlType T, int kXU>
__global__ void __launch_bounds__(kPipeThreads, tma_min_blocks(T, kXU))
    gemv_chain_tma(ChainArgs c, int nb, bool early, TmaRing ring) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    using Q = Quant<T>;
    constexpr int kNV = chain_nv<T, kXU>();
    constexpr int kLPB = Q::kLanesPerBlock;
    constexpr int kBPU = 32 / kLPB;
    constexpr int kBB = Q::kBlockBytes;
    constexpr int kV = 2;  // a stage: two rows of Wa, or a row of G and the same row of U
    constexpr int kMode = int(ActQuant::Q8_K);
    static_assert(chain_compiled<T, kXU>(), "whole rows, activations in registers");
    extern __shared__ __align__(16) uint8_t smem[];
    __shared__ float red[32];
    __shared__ int last_cta;

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int part = lane % kLPB, sub = lane / kLPB;
    const int S = ring.stages;
    const int stage_bytes = kV * ring.row_bytes;
    uint8_t* buf = smem + size_t(warp) * S * stage_bytes;
    uint64_t* bars = reinterpret_cast<uint64_t*>(smem + size_t(kPipeWarps) * S * stage_bytes) +
                     warp * kTmaMaxStages;

    // This warp's groups: [a0, a1) of Wa's row pairs, then [b0, b1) of the pair's rows, as one
    // run of stages j = 0 .. na + nb_ - 1.
    const int64_t nw = int64_t(gridDim.x) * kPipeWarps;
    const int64_t gw = int64_t(blockIdx.x) * kPipeWarps + warp;
    const int64_t ga = c.rows_a / kV;
    const int64_t a0 = ga * gw / nw, a1 = ga * (gw + 1) / nw;
    const int64_t b0 = c.rows_b * gw / nw, b1 = c.rows_b * (gw + 1) / nw;
    const int64_t na = a1 - a0, total = na + (b1 - b0);
    const size_t rb = size_t(ring.row_bytes);
    auto row_of = [&](int64_t j, int h) {
        if (j < na) return c.wa + size_t((a0 + j) * kV + h) * rb;
        return (h ? c.wu : c.wg) + size_t(b0 + j - na) * rb;
    };
    const uint64_t policy = ring.evict_first ? l2_evict_first_policy() : 0;
    auto issue = [&](int64_t j) {
        uint8_t* dst = buf + (j % S) * stage_bytes;
        uint64_t* bar = bars + j % S;
        mbar_expect_tx(bar, uint32_t(stage_bytes));
#pragma unroll
        for (int h = 0; h < kV; ++h) {
            if (ring.evict_first)
                bulk_copy_g2s(dst + h * rb, row_of(j, h), uint32_t(rb), bar, policy);
            else
                bulk_copy_g2s(dst + h * rb, row_of(j, h), uint32_t(rb), bar);
        }
    };
    // Stage j's two dot products with the activations xr.
    auto dots = [&](int64_t j, const typename Q::X(&xr)[kXU], float(&v)[kV]) {
        const int slot = int(j % S);
        mbar_wait(bars + slot, uint32_t((j / S) & 1));
        const uint8_t* st = buf + slot * stage_bytes;
        float acc[kV] = {0.f, 0.f};
#pragma unroll
        for (int u = 0; u < kXU; ++u) {
            const int kb = u * kBPU + sub;
            if (kb < nb) {
#pragma unroll
                for (int h = 0; h < kV; ++h) {
                    typename Q::Raw r;
                    Q::load_raw(st + h * rb + kb * kBB, part, r);
                    typename Q::W wr;
                    Q::decode(r, part, wr);
                    acc[h] += Q::dot(wr, xr[u]);
                }
            }
        }
        __syncwarp();  // every lane has read the slot: it may be refilled
        if (lane == 0 && j + S < total) issue(j + S);
#pragma unroll
        for (int h = 0; h < kV; ++h) {
            v[h] = acc[h];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) v[h] += __shfl_xor_sync(0xffffffffu, v[h], o);
        }
    };

    if (lane == 0) {
        for (int s = 0; s < S; ++s) mbar_init(bars + s, 1);
        mbar_fence_init();
    }
    __syncwarp();
    // The count the launch before on these counters left (only this launch's norm CTA raises
    // it, and not before every CTA, this one included, has counted itself).
    uint64_t* my_flag = c.flag + (blockIdx.x % kChainFlags) * kChainLineWords;
    uint64_t base = 0;
    if (threadIdx.x == 0) base = *reinterpret_cast<volatile const uint64_t*>(my_flag);
    pdl_trigger();
    // Before the wait only Wa's stages: the kernel before (the attention) is latency-bound, and
    // the pair's bytes requested under it would delay its reads (docs/BENCHMARKS.md: the L2
    // look-ahead in the attention's window lost more the more it asked for).
    int64_t issued = 0;
    if (early && lane == 0)
        for (; issued < S && issued < na; ++issued) issue(issued);
    pdl_wait(c.xq_a, c.xd_a, c.ya, c.x, c.out, c.xq_n, c.xd_n, c.yb);
    if (lane == 0)
        for (; issued < S && issued < total; ++issued) issue(issued);

    typename Q::X xr[kXU];
    auto load_acts = [&](const int8_t* xq, const float2* xd, auto from) {
#pragma unroll
        for (int u = 0; u < kXU; ++u) {
            const int kb = u * kBPU + sub;
            if (kb < nb)
                Q::template load_x<decltype(from)::value>(xq + int64_t(kb) * Q::kBlockElems,
                                                          xd + int64_t(kb) * (Q::kBlockElems / 32),
                                                          part, xr[u]);
        }
    };
    if (na > 0) load_acts(c.xq_a, c.xd_a, std::integral_constant<int, kXGlobal>{});
    int64_t j = 0;
    for (; j < na; ++j) {
        float v[kV];
        dots(j, xr, v);
        if (lane == 0)
#pragma unroll
            for (int h = 0; h < kV; ++h) c.ya[(a0 + j) * kV + h] = v[h];
    }

    // Every warp of the CTA has written its rows of ya: count the CTA; the last runs the norm.
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();  // this CTA's rows of ya are visible before it is counted
        const unsigned long long n =
            atomicAdd(reinterpret_cast<unsigned long long*>(c.arrive), 1ull);
        last_cta = n - base == gridDim.x - 1;
    }
    __syncthreads();
    const uint64_t end = base + gridDim.x;
    if (last_cta) {
        __threadfence();  // every CTA's ya, counted before this CTA's count, is visible now
        chain_norm<kNV, kMode>(c, red);
        __syncthreads();
        if (threadIdx.x == 0) {
            __threadfence();
            for (int i = 0; i < kChainFlags; ++i) st_release_u64(c.flag + i * kChainLineWords, end);
        }
    } else if (threadIdx.x == 0) {
        const uint64_t t0 = globaltimer_ns();
        while (ld_acquire_u64(my_flag) < end) {
            __nanosleep(128);
            // A grid not all resident at once would wait here for ever: fail the launch instead.
            if (globaltimer_ns() - t0 > kChainWaitNs) __trap();
        }
    }
    __syncthreads();

    // The pair, on the norm's activations (written by another CTA of this launch: through L2).
    if (b1 > b0) load_acts(c.xq_n, c.xd_n, std::integral_constant<int, kXGlobalL2>{});
    for (; j < total; ++j) {
        float v[kV];
        dots(j, xr, v);
        if (lane == 0) c.yb[b0 + j - na] = pipe_silu_mul(v[0], v[1]);
    }
    if (c.pq.mode >= 0) pipe_quantize_groups(c.yb, b0, b1, c.pq, lane);
#else
    __trap();  // launched only on compute capability 9.0+ (chain_usable)
#endif
}

// Chained launches so far (host-side count, for tests: a graph replay launches nothing).
inline int64_t& gemv_chain_launches() {
    static int64_t n = 0;
    return n;
}

// Per instantiation, once: the shared-memory limit raised to what a CTA may have besides the
// kernel's static shared memory, the largest carveout preferred (the occupancy below assumes
// it), and the CTAs a multiprocessor then holds with `smem` bytes of ring: the grid may be no
// larger than what is resident at once.
template <GgmlType T, int kXU>
int chain_ctas_per_sm(size_t smem) {
    auto* kernel = gemv_chain_tma<T, kXU>;
    static const bool set = [&] {
        cudaFuncAttributes attr{};
        NT_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel), "gemv chain attributes");
        NT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           tma_device().optin - int(attr.sharedSizeBytes)),
                      "gemv chain shared memory limit");
        NT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                           int(cudaSharedmemCarveoutMaxShared)),
                      "gemv chain carveout");
        return true;
    }();
    (void)set;
    int n = 0;
    NT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kPipeThreads, smem),
                  "gemv chain occupancy");
    return n;
}

// Launches the chain where it applies (chain_compiled, cols == c.dim, 16-byte aligned rows):
// true; otherwise false, nothing launched.
template <GgmlType T>
bool launch_chain(const ChainArgs& c, int64_t cols, bool pdl, cudaStream_t stream) {
    using Q = Quant<T>;
    const int64_t row_bytes = cols / Q::kBlockElems * Q::kBlockBytes;
    if (cols != c.dim || row_bytes % 16 != 0 || c.rows_a % 2 != 0 || !tma_usable()) return false;
    bool launched = false;
    with_tma_units<T>(pipe_units<T>(cols), [&](auto xu_tag) {
        constexpr int XU = decltype(xu_tag)::value;
        if constexpr (chain_compiled<T, XU>()) {
            const TmaRing ring = tma_ring(row_bytes, 2);
            const size_t smem =
                size_t(kPipeWarps) * ring.stages * 2 * ring.row_bytes + kTmaBarrierBytes;
            const int per_sm = chain_ctas_per_sm<T, XU>(smem);
            if (per_sm < 1) return;
            launch_kernel(pdl, gemv_chain_tma<T, XU>, dim3(unsigned(per_sm * tma_device().sms)),
                          dim3(kPipeThreads), smem, stream, "gemv chain (o, norm, gate/up)", c,
                          int(cols / Q::kBlockElems), pdl && pdl_prefetch_enabled(), ring);
            launched = true;
            ++gemv_chain_launches();
        }
    });
    return launched;
}

}  // namespace nt::cuda::detail
