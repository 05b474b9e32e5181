// The pipe GEMV with its weights in flight in shared memory rather than in registers
// (internal; one activation row, sm_90+). The pipe kernel keeps each warp's next few units of
// raw weights in registers, which caps the bytes in flight at about 37 KB per multiprocessor:
// with HBM's latency under load that is ~3.3 TB/s, where the 8B decode GEMVs plateau
// (docs/BENCHMARKS.md). Here each warp owns a ring of shared-memory stages that the copy engine
// of the multiprocessor fills (cp.async.bulk, one instruction per row chunk, completion counted
// on an mbarrier per stage); about 8 KB per warp, so ~100-200 KB per multiprocessor in flight
// without holding a register.
//
// Work split, activations and epilogue are the pipe kernel's (matmul_gemv_pipe.cuh): warps take
// contiguous, balanced ranges of row groups (kV rows, or a SwiGLU pair's two), activations come
// from registers (kXU, rows of one or two units) or unit by unit through L1, and every lane
// accumulates its units in the same order, so each output is bit-identical to the pipe
// kernel's. A stage holds `cu` units of every row of a group (whole rows with register-held
// activations); lane 0 of the warp issues stage j + S once all lanes have read stage j.
#pragma once
#include <algorithm>
#include <cstdint>

#include "backend/cuda/cuda_check.cuh"
#include "backend/cuda/matmul_gemv_pipe.cuh"
#include "core/env.h"
#include "core/error.h"

namespace nt::cuda::detail {

constexpr int kTmaMaxStages = 8;
constexpr int kTmaBarrierBytes = kPipeWarps * kTmaMaxStages * 8;

// A warp's ring: `stages` slots of kV row chunks of `row_stride` bytes (cu units each).
struct TmaRing {
    int stages = 0;
    int cu = 0;
    int row_stride = 0;
};

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count)
                 : "memory");
}
// Makes the initialised barriers visible to the copy engine (the async proxy).
__device__ __forceinline__ void mbar_fence_init() {
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// The stage's one arrival, announcing the bytes its copies will bring.
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)),
                 "r"(bytes)
                 : "memory");
}
// bytes (a multiple of 16, both addresses 16-byte aligned) from global to shared memory,
// counted on bar when they land.
__device__ __forceinline__ void bulk_copy_g2s(void* dst, const void* src, uint32_t bytes,
                                              uint64_t* bar) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
            "r"(smem_u32(dst)),
        "l"(src), "r"(bytes), "r"(smem_u32(bar))
        : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
    uint32_t done = 0;
    do {
        asm volatile(
            "{\n\t.reg .pred p;\n\t"
            "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
            "selp.u32 %0, 1, 0, p;\n\t}"
            : "=r"(done)
            : "r"(smem_u32(bar)), "r"(parity)
            : "memory");
    } while (!done);
}
#endif

template <GgmlType T, bool kPair, int kXU, int kV>
__global__ void __launch_bounds__(kPipeThreads, 4)
    gemv_q8_tma(GemvStack pr, const uint8_t* __restrict__ w2, int nb,
                const int8_t* __restrict__ xq, const float2* __restrict__ xd, PairQuant pq,
                bool early, TmaRing ring) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    using Q = Quant<T>;
    constexpr int kLPB = Q::kLanesPerBlock;
    constexpr int kBPU = 32 / kLPB;
    constexpr int kBB = Q::kBlockBytes;
    static_assert(!kPair || kV == 2, "a pair is a group of two rows");
    static_assert(kXU == 0 || pipe_x_units<T>(kXU), "register-held activations");
    extern __shared__ __align__(16) uint8_t smem[];

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int part = lane % kLPB, sub = lane / kLPB;
    const int S = ring.stages;
    const int stage_bytes = kV * ring.row_stride;
    uint8_t* buf = smem + size_t(warp) * S * stage_bytes;
    uint64_t* bars = reinterpret_cast<uint64_t*>(smem + size_t(kPipeWarps) * S * stage_bytes) +
                     warp * kTmaMaxStages;

    const int64_t rows = pr.rows();
    const int64_t gw = int64_t(blockIdx.x) * kPipeWarps + warp;
    const int64_t nw = int64_t(gridDim.x) * kPipeWarps;
    const int64_t groups = kPair ? rows : rows / kV;
    const int64_t g0 = groups * gw / nw, g1 = groups * (gw + 1) / nw;
    const int upr = (nb + kBPU - 1) / kBPU;
    const int chunks = (upr + ring.cu - 1) / ring.cu;  // stages per group
    const int64_t total = (g1 - g0) * chunks;         // stages of this warp
    const size_t row_bytes = size_t(nb) * kBB;
    constexpr int kUnitBytes = kBPU * kBB;
    auto row_of = [&](int64_t g, int h) {
        if constexpr (kPair) return (h ? w2 : pr.m0) + size_t(g) * row_bytes;
        const int64_t r = g * kV + h;
        const int m = pr.matrix(r);
        return pr.weights(m) + size_t(r - pr.begin(m)) * row_bytes;
    };
    // Stage j: chunk j % chunks of group j / chunks, into slot j % S (lane 0 only).
    auto issue = [&](int64_t j) {
        const int64_t g = g0 + j / chunks;
        const size_t off = size_t(j % chunks) * ring.cu * kUnitBytes;
        const size_t left = row_bytes - off, most = size_t(ring.cu) * kUnitBytes;
        const uint32_t len = uint32_t(left < most ? left : most);
        uint8_t* dst = buf + (j % S) * stage_bytes;
        uint64_t* bar = bars + j % S;
        mbar_expect_tx(bar, kV * len);
#pragma unroll
        for (int h = 0; h < kV; ++h) bulk_copy_g2s(dst + h * ring.row_stride, row_of(g, h) + off, len, bar);
    };

    if (lane == 0) {
        for (int s = 0; s < S; ++s) mbar_init(bars + s, 1);
        mbar_fence_init();
    }
    __syncwarp();
    // early: the first stages' weights are requested before waiting for the kernel before, as
    // the pipe kernel does (weights only; see there).
    pdl_trigger();
    if (!early) pdl_wait(xq, xd, pr.y0, pr.y1, pr.y2);
    if (lane == 0)
        for (int64_t j = 0; j < S && j < total; ++j) issue(j);
    if (early) pdl_wait(xq, xd, pr.y0, pr.y1, pr.y2);

    typename Q::X xr[kXU > 0 ? kXU : 1];
    if constexpr (kXU > 0) {
#pragma unroll
        for (int u = 0; u < kXU; ++u) {
            const int kb = u * kBPU + sub;
            if (kb < nb)
                Q::load_x(xq + int64_t(kb) * Q::kBlockElems,
                          xd + int64_t(kb) * (Q::kBlockElems / 32), part, xr[u]);
        }
    }
    // Activations loaded unit by unit run one unit ahead: the next unit's load is issued
    // before the wait for its stage, so its latency hides under the wait rather than after it.
    typename Q::X xn;
    auto load_next = [&](int ku) {
        const int kb = ku * kBPU + sub;
        if (kb < nb)
            Q::load_x(xq + int64_t(kb) * Q::kBlockElems, xd + int64_t(kb) * (Q::kBlockElems / 32),
                      part, xn);
    };
    if constexpr (kXU == 0)
        if (total > 0) load_next(0);
    float acc[kV];
#pragma unroll
    for (int h = 0; h < kV; ++h) acc[h] = 0.f;
    for (int64_t j = 0; j < total; ++j) {
        const int slot = int(j % S);
        const int c = int(j % chunks);
        mbar_wait(bars + slot, uint32_t((j / S) & 1));
        const uint8_t* st = buf + slot * stage_bytes;
        // Rows decoded one at a time right before their dot products, as in the pipe kernel.
        if constexpr (kXU > 0) {  // whole rows, one stage a group
#pragma unroll
            for (int u = 0; u < kXU; ++u) {
                const int kb = u * kBPU + sub;
                if (kb < nb) {
#pragma unroll
                    for (int h = 0; h < kV; ++h) {
                        typename Q::Raw r;
                        Q::load_raw(st + h * ring.row_stride + kb * kBB, part, r);
                        typename Q::W wr;
                        Q::decode(r, part, wr);
                        acc[h] += Q::dot(wr, xr[u]);
                    }
                }
            }
        } else {
            const int units = min(ring.cu, upr - c * ring.cu);
            for (int u = 0; u < units; ++u) {
                const int ku = c * ring.cu + u;
                const typename Q::X xv = xn;
                load_next(ku + 1 == upr ? 0 : ku + 1);
                const int kb = ku * kBPU + sub;
                if (kb < nb) {
#pragma unroll
                    for (int h = 0; h < kV; ++h) {
                        typename Q::Raw r;
                        Q::load_raw(st + h * ring.row_stride + (u * kBPU + sub) * kBB, part, r);
                        typename Q::W wr;
                        Q::decode(r, part, wr);
                        acc[h] += Q::dot(wr, xv);
                    }
                }
            }
        }
        __syncwarp();  // every lane has read the slot: it may be refilled
        if (lane == 0 && j + S < total) issue(j + S);
        if (c == chunks - 1) {  // a group is done
            const int64_t g = g0 + j / chunks;
            float v[kV];
#pragma unroll
            for (int h = 0; h < kV; ++h) {
                v[h] = acc[h];
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) v[h] += __shfl_xor_sync(0xffffffffu, v[h], o);
                acc[h] = 0.f;
            }
            if (lane == 0) {
                if constexpr (kPair) {
                    pr.y0[g] = pipe_silu_mul(v[0], v[1]);
                } else {
                    const int m = pr.matrix(g * kV);
                    const int64_t b = pr.begin(m);
#pragma unroll
                    for (int h = 0; h < kV; ++h) pr.out(m)[g * kV + h - b] = v[h];
                }
            }
        }
    }
    if constexpr (kPair)
        if (pq.mode >= 0) pipe_quantize_groups(pr.y0, g0, g1, pq, lane);
#else
    __trap();  // launched only on compute capability 9.0+ (tma_usable)
#endif
}

// Whether the TMA form may run: compute capability 9.0+ and not turned off (NT_GEMV_TMA=0,
// for A/B runs against the register-ring pipe kernel).
inline bool tma_usable() {
    static const bool ok = [] {
        if (!env_switch("NT_GEMV_TMA")) return false;
        int dev = 0, major = 0;
        NT_CUDA_CHECK(cudaGetDevice(&dev), "cudaGetDevice");
        NT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev),
                      "device attribute");
        return major >= 9;
    }();
    return ok;
}

// Bytes of shared memory a warp's ring aims at (NT_TMA_RING, default 8 KB: H200, 8B Q4_K_M
// tg128 426 tok/s with 8 KB, 374 with 16 KB, whose rings leave fewer warps per multiprocessor).
inline int tma_ring_bytes() {
    static const int bytes = [] {
        const char* e = std::getenv("NT_TMA_RING");
        const long v = e ? std::atol(e) : 8192;
        return int(std::clamp<long>(v, 1024, 49152));
    }();
    return bytes;
}

// Per instantiation: the shared-memory limit raised once, and the CTAs per multiprocessor that
// its registers allow (shared memory then decides per launch).
struct TmaFit {
    int sms = 0, per_sm_regs = 0, smem_per_sm = 0, reserved = 0;
};
template <GgmlType T, bool kPair, int kXU, int kV>
const TmaFit& tma_fit() {
    static const TmaFit fit = [] {
        TmaFit f;
        auto* kernel = gemv_q8_tma<T, kPair, kXU, kV>;
        int dev = 0, optin = 0;
        NT_CUDA_CHECK(cudaGetDevice(&dev), "cudaGetDevice");
        NT_CUDA_CHECK(cudaDeviceGetAttribute(&f.sms, cudaDevAttrMultiProcessorCount, dev),
                      "device attribute");
        NT_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev),
                      "device attribute");
        NT_CUDA_CHECK(
            cudaDeviceGetAttribute(&f.smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev),
            "device attribute");
        NT_CUDA_CHECK(
            cudaDeviceGetAttribute(&f.reserved, cudaDevAttrReservedSharedMemoryPerBlock, dev),
            "device attribute");
        NT_CUDA_CHECK(
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, optin),
            "gemv tma shared memory limit");
        NT_CUDA_CHECK(
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&f.per_sm_regs, kernel, kPipeThreads, 0),
            "gemv tma occupancy");
        return f;
    }();
    return fit;
}

// The ring for rows of `upr` units of `unit_bytes`, kV rows a stage; whole rows when the
// activations are held in registers.
inline TmaRing tma_ring(int upr, int unit_bytes, int kv, bool whole_rows) {
    const int target = tma_ring_bytes();
    TmaRing r;
    // Stages of at least a quarter of the ring (small copies cost as much to wait for).
    const int step = kv * unit_bytes;
    r.cu = whole_rows ? upr : std::clamp((target / 4 + step - 1) / step, 1, upr);
    r.row_stride = (r.cu * unit_bytes + 15) & ~15;
    r.stages = std::clamp(target / (kv * r.row_stride), 2, kTmaMaxStages);
    return r;
}

template <GgmlType T, bool kPair, int kXU, int kV>
void launch_tma_k(const GemvStack& pr, const uint8_t* w2, int64_t cols, const int8_t* xq,
                  const float2* xd, bool pdl, cudaStream_t stream, const PairQuant& q) {
    using Q = Quant<T>;
    constexpr int kBPU = 32 / Q::kLanesPerBlock;
    const int nb = int(cols / Q::kBlockElems);
    const int upr = (nb + kBPU - 1) / kBPU;
    const TmaRing ring = tma_ring(upr, kBPU * Q::kBlockBytes, kV, kXU > 0);
    const size_t smem = size_t(kPipeWarps) * ring.stages * kV * ring.row_stride + kTmaBarrierBytes;
    const TmaFit& f = tma_fit<T, kPair, kXU, kV>();
    const int per_sm = std::min(f.per_sm_regs, int(f.smem_per_sm / (smem + f.reserved)));
    if (per_sm < 1) nt::fail("gemv: the TMA ring of %zu bytes does not fit on this GPU.", smem);
    const int64_t groups = kPair ? pr.rows() : pr.rows() / kV;
    const int64_t grid =
        std::min<int64_t>((groups + kPipeWarps - 1) / kPipeWarps, int64_t(per_sm) * f.sms);
    launch_kernel(pdl, gemv_q8_tma<T, kPair, kXU, kV>, dim3(unsigned(grid)), dim3(kPipeThreads),
                  smem, stream, "gemv (pipe, tma ring)", pr, w2, nb, xq, xd, q,
                  pdl && pdl_prefetch_enabled(), ring);
}

// Whether a launch may take the TMA form: one activation row, sm_90+, and rows whose bytes
// (and the matrices' starts) are 16-byte aligned, as the bulk copies need.
template <GgmlType T>
bool tma_fits(const GemvStack& pr, const void* w2, int64_t cols, int nx) {
    const int64_t row_bytes = cols / Quant<T>::kBlockElems * Quant<T>::kBlockBytes;
    auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    return nx == 1 && row_bytes % 16 == 0 && aligned(pr.m0) && aligned(pr.m1) &&
           aligned(pr.m2) && aligned(w2) && tma_usable();
}

// launch_pipe's choices (register-held activations, two rows a warp) for the TMA form.
template <GgmlType T, bool kPair>
void launch_tma(const GemvStack& pr, const uint8_t* w2, int64_t cols, const int8_t* xq,
                const float2* xd, bool pdl, cudaStream_t stream, const PairQuant& q) {
    constexpr int kBPU = 32 / Quant<T>::kLanesPerBlock;
    constexpr int kV = kPair ? 2 : 1;
    const int64_t upr = (cols / Quant<T>::kBlockElems + kBPU - 1) / kBPU;
    const bool two = !kPair && pr.e0 % 2 == 0 && pr.e1 % 2 == 0 && pr.e2 % 2 == 0 &&
                     pipe_two_rows_enabled() &&
                     pr.rows() >= int64_t(pipe_resident_ctas<T, 1, false, 0, 2>()) * kPipeWarps;
    if constexpr (pipe_x_units<T>(2)) {
        if (upr == 1) {
            if (two) return launch_tma_k<T, false, 1, 2>(pr, w2, cols, xq, xd, pdl, stream, q);
            return launch_tma_k<T, kPair, 1, kV>(pr, w2, cols, xq, xd, pdl, stream, q);
        }
        if (upr == 2) {
            if (two) return launch_tma_k<T, false, 2, 2>(pr, w2, cols, xq, xd, pdl, stream, q);
            return launch_tma_k<T, kPair, 2, kV>(pr, w2, cols, xq, xd, pdl, stream, q);
        }
    }
    if (two) return launch_tma_k<T, false, 0, 2>(pr, w2, cols, xq, xd, pdl, stream, q);
    launch_tma_k<T, kPair, 0, kV>(pr, w2, cols, xq, xd, pdl, stream, q);
}

// The pipe kernel, in its TMA form where that can run (tma_fits), else with its register ring.
template <GgmlType T>
void launch_pipe_any(const GemvStack& pr, const void* w2, int64_t cols, const int8_t* xq,
                     const float2* xd, int n, int nx, bool pdl, cudaStream_t stream,
                     const PairQuant& q = {}) {
    if (tma_fits<T>(pr, w2, cols, nx)) {
        const auto* b = static_cast<const uint8_t*>(w2);
        if (b) return launch_tma<T, true>(pr, b, cols, xq, xd, pdl, stream, q);
        return launch_tma<T, false>(pr, pr.m0, cols, xq, xd, pdl, stream, PairQuant{});
    }
    launch_pipe_nx<T>(pr, w2, cols, xq, xd, n, nx, pdl, stream, q);
}

// One-time setup of every TMA instantiation (never first inside a graph capture).
template <GgmlType T>
void prepare_tma() {
    if (!tma_usable()) return;
    tma_fit<T, false, 0, 1>();
    tma_fit<T, false, 0, 2>();
    tma_fit<T, true, 0, 2>();
    if constexpr (pipe_x_units<T>(2)) {
        tma_fit<T, false, 1, 1>();
        tma_fit<T, false, 1, 2>();
        tma_fit<T, true, 1, 2>();
        tma_fit<T, false, 2, 1>();
        tma_fit<T, false, 2, 2>();
        tma_fit<T, true, 2, 2>();
    }
}

}  // namespace nt::cuda::detail
