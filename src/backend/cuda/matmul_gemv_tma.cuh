// The pipe GEMV with its weights in flight in shared memory rather than in registers
// (internal; one activation row, sm_90+, rows whose activations fit in registers: 8B's 4096
// columns in Q4_K, Q6_K and Q8_0, 70B's 8192 in Q4_K). The pipe kernel keeps each warp's next few
// units of raw weights in registers, which caps the bytes in flight per multiprocessor; here each
// warp owns a ring of shared-memory stages, each one group of whole rows, that the multiprocessor's
// copy engine fills (cp.async.bulk, one instruction a row, completion counted on an mbarrier per
// stage): about 8 KB a warp in flight without holding a register.
//
// Work split, register-held activations and epilogue are the pipe kernel's
// (matmul_gemv_pipe.cuh): warps take contiguous, balanced ranges of row groups (kV rows, or a
// SwiGLU pair's two), and every lane accumulates its units in the same order, so each output is
// bit-identical to the pipe kernel's. Lane 0 of the warp issues stage j + S once all lanes have
// read stage j.
//
// Rows too long for that (70B's 28672 columns, Q6_K's 8192 and 14336, Q8_0's 14336) go in
// column slices that it takes whole, the slices of a row range in one CTA (TmaSplit).
//
// The copies carry L2's evict-first policy (8B tg128, H200, with / without: Q4_K_M 463 / 455,
// Q6_K 367 / 363.5). Tried and not kept: asking L2 for a warp's next 1-8 stages before the wait
// (slower at every depth, Q4_K_M 439 down to 416), and fewer CTAs a multiprocessor so that the
// next kernel's could start beside them (2: 362, 3: 442).
//
// Where it runs (H200, bench_gemv --pdl, GB/s, TMA form / register ring): Q4_K 4096x4096
// 2133 / 1815, 128256x4096 3968 / 3501, 14336x4096 2641 / 2692; Q6_K 14336x4096 2801 / 2554,
// 128256x4096 3876 / 3089; the Q6_K SwiGLU pair most of all; in column slices, Q4_K 8192x28672
// 3855 / 3345, Q6_K 3520 / 2739. Whole models, tok/s: 8B Q4_K_M tg128 451 / 421, 8B Q6_K 343 /
// 289, 70B Q4_K_M tg64 64.5 / 59.6, and with column slices 70.0 / 64.9. A version for longer
// rows with stages of a few units and activations loaded unit by unit lost to the register ring
// on every such shape (Q4_K 4096x14336 2071 / 2893, 70B 8192x8192 1978 / 2997): it is not kept.
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <numeric>
#include <string>
#include <type_traits>
#include <utility>

#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/cuda_check.cuh"
#include "backend/cuda/device_limits.cuh"
#include "backend/cuda/ieee_float.cuh"
#include "backend/cuda/matmul_gemv_pipe.cuh"
#include "backend/cuda/phase_trace.cuh"
#include "backend/cuda/warp_reduce.cuh"
#include "core/env.h"
#include "core/error.h"

namespace nt::cuda::detail {

constexpr int kTmaMaxStages = 8;

// A warp's ring: `stages` slots of kV rows of `row_bytes` bytes each. With `evict_first` the
// weights stream through L2 with its evict-first policy: read once per token, they then push
// out less of what is read again (activations, the KV cache).
struct TmaRing {
    int stages = 0;
    int row_bytes = 0;
    int early = kTmaMaxStages;  // of the stages, the most requested before the programmatic wait
    bool evict_first = false;
    L2Warm warm;  // other weights the warps request into L2 early (MatmulWorkspace::warm)
};

// Shared memory of `warps` warps' rings of groups of kv rows, and their barriers (the layout
// gemv_q8_tma lays out; a column split's sums follow).
inline size_t tma_ring_smem(const TmaRing& ring, int warps, int kv) {
    return size_t(warps) * ring.stages * kv * ring.row_bytes + size_t(warps) * kTmaMaxStages * 8;
}

// A column split (gemv_q8_tma's kSplit): rows too long to hold their activations in registers
// (70B's 28672-column down projection, 8B's 14336) are cut into `slices` slices of whole
// units, each of which the TMA form takes whole, as if the matrix were `slices` matrices of
// short rows side by side. A CTA takes a balanced range of row groups in every slice, with
// kTmaCtaWarps / slices warps a slice; each warp leaves its sums in the CTA's shared memory,
// and after the CTA's barrier its threads add the slices in order into y.
//
// The slices of a row meet inside one CTA because a handoff between CTAs costs a fence, and a
// fence takes 2.5-7 us while HBM streams (bench_sync_latency). The first form spread a slice's
// warps over the grid, the last of a row's warps (counted by an atomic after a fence) adding
// the slices: tg128 on the H200, this form / that one, 8B Q6_K 397.7, 393.1 / 380.4, 381.1
// (+4.2%), Q4_K_M 507.1, 505.5 / 493.0, 493.0 (+2.7%), Q8_0 363.3 / 336.1, 336.3 (+8.4%);
// 70B Q4_K_M tg64 80.4 / 72.7, 72.7 (+10.5%); the same bits.
constexpr int kTmaMaxSlices = 8;
// A split CTA holds up to kTmaCtaWarps warps, a whole number a slice (7 for 8B's 14336 columns,
// which are 7 slices).
constexpr int kTmaCtaWarps = kTmaMaxSlices;
constexpr int tma_split_warps(int slices) {
    return kTmaCtaWarps / slices * slices;
}
struct TmaSplit {
    int slices = 1;
    int64_t stride = 0;  // bytes from one row to the next (slices * ring.row_bytes)
    int cta_rows = 0;    // the most rows a CTA takes
};

// The types with a TMA form.
template <GgmlType T>
constexpr bool tma_compiled() {
    return T == GgmlType::Q4_K || T == GgmlType::Q6_K || T == GgmlType::Q8_0;
}
// The row lengths (in units) whose activations the TMA form holds in registers: the pipe
// kernel's (pipe_x_units), and for Q4_K also 4 units (70B's 8192 columns), which fit here
// because no weights wait in registers; Q8_0 (units of 512 columns, 5 registers each) 4 and 8
// units (8B's 4096 columns, and slices of its 14336).
template <GgmlType T>
constexpr bool tma_x_units(int upr) {
    if (T == GgmlType::Q8_0) return upr == 4 || upr == 8;
    return pipe_x_units<T>(upr) || (T == GgmlType::Q4_K && upr == 4);
}
constexpr int tma_threads(bool split) {
    return split ? kTmaCtaWarps * 32 : kPipeThreads;
}
constexpr int tma_min_blocks(GgmlType t, int kxu, bool split = false, bool pair = false) {
    // In column slices, 2 CTAs a multiprocessor (up to 128 registers); a SwiGLU pair at one
    // unit a slice, 3 (80 registers, no spills). H200 tg128, 8B Q6_K: 3 CTAs for the single
    // matrices' one-unit slices (the down projection) too lost 2.2% (394.5 / 403.2).
    if (split) return pair && kxu == 1 && t != GgmlType::Q8_0 ? 3 : 2;
    return kxu >= 4 && t != GgmlType::Q8_0 ? 3 : 4;
}
// f(std::integral_constant<int, XU>{}) for every row length XU (units) whose activations the
// TMA form holds in registers (tma_x_units), in increasing order, until f returns true.
template <GgmlType T, class F>
bool any_tma_units(F&& f) {
    auto one = [&](auto xu_tag) {
        if constexpr (tma_x_units<T>(decltype(xu_tag)::value)) return bool(f(xu_tag));
        return false;
    };
    return one(std::integral_constant<int, 1>{}) || one(std::integral_constant<int, 2>{}) ||
           one(std::integral_constant<int, 4>{}) || one(std::integral_constant<int, 8>{});
}
// f(std::integral_constant<int, XU>{}) for the row length upr (units) if the TMA form holds
// such rows' activations in registers (tma_x_units); false otherwise.
template <GgmlType T, class F>
bool with_tma_units(int64_t upr, F&& f) {
    return any_tma_units<T>([&](auto xu_tag) {
        if (upr != decltype(xu_tag)::value) return false;
        f(xu_tag);
        return true;
    });
}

// Float activations quantized where they are read (gemv_q8_tma's kXF): the SwiGLU pair's
// output, which the pair otherwise quantizes itself behind fences (pipe_quantize_groups) so
// that the down projection can read int8. Types whose activations are Q8_K with 4 lanes to a
// 256-element block (Q4_K, Q6_K), one-unit column slices (8B's 14336 columns).
template <GgmlType T>
constexpr bool tma_float_x_compiled(int xu) {
    return (T == GgmlType::Q4_K || T == GgmlType::Q6_K) && xu == 1;
}

// Where lane `part` of a block's 4 holds its element i (0..63) of the block: the positions
// Quant<T>::load_x reads (Q4_K: 64 consecutive; Q6_K, the Q2_K layout: four runs of 16, 32
// apart, in the block's half part / 2), increasing in i.
template <GgmlType T>
__device__ __forceinline__ int x_lane_elem(int part, int i) {
    if constexpr (T == GgmlType::Q4_K) return 64 * part + i;
    return 128 * (part >> 1) + 32 * (i >> 4) + 16 * (part & 1) + (i & 15);
}

// Quant<T>::load_x's X for the block at xb (floats), quantized here as quantize_q8 would (Q8_K,
// q8k_block's arithmetic bit for bit): the block's 4 lanes (consecutive, lane % 4 = part) find
// its largest magnitude, ties to the lowest element index, and each rounds its own 64. `have`:
// whether the block exists (every lane must call it: shuffles; lanes without one get zeros).
// Every CTA of the down projection quantizes the whole row again, so the arithmetic is kept
// lean: the maximum first (one instruction an element), then the first element that reaches it;
// rint(t) for |t| <= 127 as the low byte of t + 1.5 * 2^23 (exact: the sum rounds to an integer,
// ties to even, as rint; the byte is t's two's complement) instead of a conversion, which issues
// at a quarter of the rate; NaN (t = 0 * inf, or a NaN element) to 0 as q8k_block does.
template <GgmlType T>
__device__ __forceinline__ void load_x_float(const float* xb, bool have, int part,
                                             typename Quant<T>::X& x) {
    static_assert(tma_float_x_compiled<T>(1), "Q8_K activations, 4 lanes a block");
    float v[64];
#pragma unroll
    for (int c = 0; c < 16; ++c) {
        float4 t = make_float4(0.f, 0.f, 0.f, 0.f);
        if (have)
            asm("ld.global.ca.v4.f32 {%0, %1, %2, %3}, [%4];"
                : "=f"(t.x), "=f"(t.y), "=f"(t.z), "=f"(t.w)
                : "l"(xb + x_lane_elem<T>(part, 4 * c)));
        v[4 * c] = t.x, v[4 * c + 1] = t.y, v[4 * c + 2] = t.z, v[4 * c + 3] = t.w;
    }
    // fmaxf skips NaN, as q8k_block's strict '>' does.
    float amax = 0.f;
#pragma unroll
    for (int i = 0; i < 64; ++i) amax = fmaxf(amax, fabsf(v[i]));
    float vmax = 0.f;
    int imax = 256;
#pragma unroll
    for (int i = 63; i >= 0; --i)  // backwards: the first one that reaches it stays
        if (fabsf(v[i]) == amax) vmax = v[i], imax = x_lane_elem<T>(part, i);
    if (amax == 0.f) vmax = 0.f, imax = 256;
#pragma unroll
    for (int o = 1; o < 4; o <<= 1) {
        const float a2 = __shfl_xor_sync(0xffffffffu, amax, o);
        const float v2 = __shfl_xor_sync(0xffffffffu, vmax, o);
        const int i2 = __shfl_xor_sync(0xffffffffu, imax, o);
        if (a2 > amax || (a2 == amax && i2 < imax)) amax = a2, vmax = v2, imax = i2;
    }
    const float iscale = amax != 0.f ? div_rn(-127.f, vmax) : 0.f;
    const float d = amax != 0.f ? div_rn(1.f, iscale) : 0.f;
    constexpr float kRound = 12582912.f;  // 1.5 * 2^23
    int packed[16];
#pragma unroll
    for (int c = 0; c < 16; ++c) {
        uint32_t b[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const float t = mul_rn(iscale, v[4 * c + k]);
            b[k] = __float_as_uint(t == t ? add_rn(t, kRound) : kRound);
        }
        packed[c] = int(__byte_perm(__byte_perm(b[0], b[1], 0x0040), __byte_perm(b[2], b[3], 0x0040),
                                    0x5410));
    }
    int s16[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        s16[j] = 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) s16[j] = dp4a(0x01010101u, packed[4 * j + i], s16[j]);
    }
    if constexpr (T == GgmlType::Q4_K) {
        const int sa = s16[0] + s16[1], sb = s16[2] + s16[3];
#pragma unroll
        for (int i = 0; i < 8; ++i) x.a[i] = packed[i], x.b[i] = packed[8 + i];
        x.da = make_float2(d, mul_rn(d, float(sa)));
        x.db = make_float2(d, mul_rn(d, float(sb)));
        x.s16 = (uint32_t(sa) & 0xFFFFu) | uint32_t(sb) << 16;
    } else {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
#pragma unroll
            for (int i = 0; i < 4; ++i) x.q[j][i] = packed[4 * j + i];
            x.o[j] = -32 * s16[j];
        }
        x.d = d;
    }
}

// nb: blocks of a stage's row (of a slice's, with kSplit). kXF: the activations are the floats
// at xf, quantized here (load_x_float); xq, xd unused.
template <GgmlType T, bool kPair, int kXU, int kV, bool kSplit, bool kXF = false>
__global__ void __launch_bounds__(tma_threads(kSplit), tma_min_blocks(T, kXU, kSplit, kPair))
    gemv_q8_tma(GemvStack pr, const uint8_t* __restrict__ w2, int nb, const int8_t* __restrict__ xq,
                const float2* __restrict__ xd, const float* __restrict__ xf, PairQuant pq,
                bool early, TmaRing ring, TmaSplit sp) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    NT_PHASE_TIME(t_entry);
    NT_PHASE_SLOTS(marks);
    using Q = Quant<T>;
    constexpr int kLPB = Q::kLanesPerBlock;
    constexpr int kBPU = 32 / kLPB;
    constexpr int kBB = Q::kBlockBytes;
    static_assert(!kPair || kV == 2, "a pair is a group of two rows");
    static_assert(tma_x_units<T>(kXU), "whole rows, activations in registers");
    static_assert(!kXF || (kSplit && !kPair && tma_float_x_compiled<T>(kXU)), "float activations");
    extern __shared__ __align__(16) uint8_t smem[];

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int part = lane % kLPB, sub = lane / kLPB;
    const int W = kSplit ? int(blockDim.x >> 5) : kPipeWarps;  // warps a CTA
    const int S = ring.stages;
    const int stage_bytes = kV * ring.row_bytes;
    uint8_t* buf = smem + size_t(warp) * S * stage_bytes;
    uint64_t* bars =
        reinterpret_cast<uint64_t*>(smem + size_t(W) * S * stage_bytes) + warp * kTmaMaxStages;
    // With kSplit: the slices' sums of the CTA's rows, [slices][sp.cta_rows], after the barriers
    // (double, as the accumulators: the row rounds to float once all slices are in).
    double* cta_part = reinterpret_cast<double*>(smem + size_t(W) * S * stage_bytes +
                                               size_t(W) * kTmaMaxStages * 8);

    const int64_t rows = pr.rows();
    const int64_t groups = kPair ? rows : rows / kV;
    int slice = 0;
    int64_t g0, g1, c0 = 0, c1 = 0;  // [c0, c1): with kSplit, the CTA's groups
    if constexpr (kSplit) {
        // The CTA takes a balanced range of groups in every slice; W / slices warps a slice
        // share it.
        const int m = W / sp.slices, r = warp % m;
        slice = warp / m;
        c0 = groups * blockIdx.x / gridDim.x;
        c1 = groups * (blockIdx.x + 1) / gridDim.x;
        g0 = c0 + (c1 - c0) * r / m;
        g1 = c0 + (c1 - c0) * (r + 1) / m;
    } else {
        const int64_t gw = int64_t(blockIdx.x) * kPipeWarps + warp;
        const int64_t warps = int64_t(gridDim.x) * kPipeWarps;
        g0 = groups * gw / warps;
        g1 = groups * (gw + 1) / warps;
    }
    const int64_t total = g1 - g0;  // stages (row groups) of this warp
    const size_t stride = kSplit ? size_t(sp.stride) : size_t(ring.row_bytes);
    const size_t at = size_t(slice) * ring.row_bytes;  // the slice's first byte in a row
    auto row_of = [&](int64_t g, int h) {
        if constexpr (kPair) return (h ? w2 : pr.m0) + size_t(g) * stride + at;
        const int64_t r = g * kV + h;
        const int m = pr.matrix(r);
        return pr.weights(m) + size_t(r - pr.begin(m)) * stride + at;
    };
    // One policy for every copy (evict-first, or normal for A/B runs), so that the copies are
    // one form.
    const uint64_t policy = ring.evict_first ? l2_evict_first_policy() : l2_evict_normal_policy();
    // Lane 0's next group to issue, and the groups before `same_to`, whose rows lie in one
    // matrix of the stack (row r at base + r * stride): for those a stage's copies cost an
    // address computation, and the stack's lookup (row_of) runs only where a group starts in
    // another matrix. A pair's rows are always found directly.
    int64_t next = g0, same_to = g0;
    uintptr_t base = 0;
    auto locate = [&](int64_t g) {
        const int m = pr.matrix(g * kV);
        if (m == pr.matrix(g * kV + kV - 1)) {
            base = reinterpret_cast<uintptr_t>(pr.weights(m)) + at - size_t(pr.begin(m)) * stride;
            same_to = pr.end(m) / kV;
        } else {
            same_to = g;  // rows of two matrices: this group row by row
        }
    };
    // The next group into `slot` (lane 0 only; groups in order from g0).
    auto issue = [&](int slot) {
        uint8_t* dst = buf + slot * stage_bytes;
        uint64_t* bar = bars + slot;
        mbar_expect_tx(bar, uint32_t(stage_bytes));
        auto copy_row = [&](int h, const uint8_t* from) {
            bulk_copy_g2s(dst + h * ring.row_bytes, from, uint32_t(ring.row_bytes), bar, policy);
        };
        if constexpr (kPair) {
            copy_row(0, row_of(next, 0));
            copy_row(1, row_of(next, 1));
        } else {
            if (next >= same_to) locate(next);
            if (next < same_to) {
                const uintptr_t first = base + size_t(next) * kV * stride;
                if constexpr (kSplit) {
#pragma unroll
                    for (int h = 0; h < kV; ++h)
                        copy_row(h, reinterpret_cast<const uint8_t*>(first + h * stride));
                } else {  // the group's rows are one span
                    bulk_copy_g2s(dst, reinterpret_cast<const uint8_t*>(first),
                                  uint32_t(stage_bytes), bar, policy);
                }
            } else {
#pragma unroll
                for (int h = 0; h < kV; ++h) copy_row(h, row_of(next, h));
            }
        }
        ++next;
    };

    if (lane == 0) {
        for (int s = 0; s < S; ++s) mbar_init(bars + s, 1);
        mbar_fence_init();
    }
    __syncwarp();
    // early: the first stages' weights are requested before waiting for the kernel before, as
    // the pipe kernel does (weights only; see there).
    pdl_trigger();
    if (lane == 0)
        NT_PHASE_RESERVE(marks, (kSplit ? phase::kGemvSplit : kPair ? phase::kGemvPair : phase::kGemv) |
                                 (T == GgmlType::Q4_K ? 4 : T == GgmlType::Q6_K ? 6 : 8) << 4,
                         pr.m0, warp == 0 ? 4 : 1);
    if (!early) pdl_wait(xq, xd, xf, pr.y0, pr.y1, pr.y2);
    const int before = early ? min(S, ring.early) : S;  // stages requested before the wait
    if (lane == 0)
        for (int j = 0; j < before && j < total; ++j) issue(j);
    // The weights of what comes after (ring.warm: CudaBackend::warm_weights) into L2 while HBM
    // is idle: before the wait, during the kernel before (latency-bound, the attention), or
    // with `after`, once it is done (this GEMV's weights already in flight, the norm after it);
    // the warps' shares in turn.
    auto warm_l2 = [&] {
        const int64_t nw = int64_t(gridDim.x) * W, gw = int64_t(blockIdx.x) * W + warp;
        const int64_t share = (ring.warm.bytes / nw + 15) / 16 * 16;
        const int64_t from = std::min(gw * share, ring.warm.bytes);
        const int64_t n = std::min(share, ring.warm.bytes - from) / 16 * 16;
        for (int m = 0; m < 2; ++m)
            if (ring.warm.p[m] && n > 0) bulk_prefetch_l2(ring.warm.p[m] + from, uint32_t(n));
    };
    const bool warm = early && lane == 0 && ring.warm.bytes > 0;
    if (warm && !ring.warm.after) warm_l2();
    if (early) pdl_wait(xq, xd, xf, pr.y0, pr.y1, pr.y2);
    if (lane == 0)
        for (int j = before; j < S && j < total; ++j) issue(j);
    if (warm && ring.warm.after) warm_l2();
    if (lane == 0 && warp == 0) {
        NT_PHASE_MARK_AT(marks, phase::kEntry, t_entry);
        NT_PHASE_MARK(marks, phase::kWaited);
    }
    if constexpr (kSplit) {
        xq += int64_t(slice) * nb * Q::kBlockElems;
        xd += int64_t(slice) * nb * (Q::kBlockElems / 32);
        if constexpr (kXF) xf += int64_t(slice) * nb * Q::kBlockElems;
    }

    typename Q::X xr[kXU];
#pragma unroll
    for (int u = 0; u < kXU; ++u) {
        const int kb = u * kBPU + sub;
        if constexpr (kXF) {
            load_x_float<T>(xf + int64_t(kb) * Q::kBlockElems, kb < nb, part, xr[u]);
        } else if (kb < nb) {
            Q::load_x(xq + int64_t(kb) * Q::kBlockElems, xd + int64_t(kb) * (Q::kBlockElems / 32),
                      part, xr[u]);
        }
    }
    // After the stage's reduction each lane holds one row's sum: row `mine` of the group, in
    // the R lanes from R * mine (warp_sum_rows).
    constexpr int R = 32 / kV;
    const int mine = lane / R, pos = lane % R;
    float held = 0.f;  // a stage's output, until it is stored (below)
    // The slot and its phase counted along, not j % S and j / S (a division a stage).
    int slot = 0;
    uint32_t parity = 0;
    for (int64_t j = 0; j < total; ++j) {
        mbar_wait(bars + slot, parity);
        if (j == 0 && lane == 0 && warp == 0) NT_PHASE_MARK(marks, phase::kFirstData);
        const uint8_t* st = buf + slot * stage_bytes;
        double acc[kV];  // in double: see Quant<T>::dot
#pragma unroll
        for (int h = 0; h < kV; ++h) acc[h] = 0.0;
            // Rows decoded one at a time right before their dot products, as in the pipe kernel.
#pragma unroll
        for (int u = 0; u < kXU; ++u) {
            const int kb = u * kBPU + sub;
            if (kb < nb) {
#pragma unroll
                for (int h = 0; h < kV; ++h) {
                    typename Q::Raw r;
                    Q::load_raw(st + h * ring.row_bytes + kb * kBB, part, r);
                    typename Q::W wr;
                    Q::decode(r, part, wr);
                    acc[h] += Q::dot(wr, xr[u]);
                }
            }
        }
        __syncwarp();  // every lane has read the slot: it may be refilled
        if (lane == 0 && j + S < total) issue(slot);
        const int64_t g = g0 + j;
        const double v = warp_sum_rows(acc, lane);
        if constexpr (kSplit) {
            if (pos == 0) cta_part[slice * sp.cta_rows + (g - c0) * kV + mine] = v;
        } else {
            // Stage j's outputs wait in lanes j % R (one a row) and are stored R stages at a
            // time, every lane its own: the pair's SwiGLU (a double exp) and the stack's
            // lookups then run once for R stages rather than once a stage for the whole warp.
            const int k = int(j % R);
            if (pos == k) held = float(v);
            if (k == R - 1 || j + 1 == total) {
                const int64_t gl = g - k + pos;
                if constexpr (kPair) {
                    // row 1's output, to row 0's lanes
                    const float up = __shfl_down_sync(0xffffffffu, held, R);
                    if (mine == 0 && pos <= k) pr.y0[gl] = silu_mul(held, up);
                } else if (pos <= k) {
                    const int64_t row = gl * kV + mine;
                    const int m = pr.matrix(row);
                    pr.out(m)[row - pr.begin(m)] = held;
                }
            }
        }
        if (++slot == S) slot = 0, parity ^= 1;
    }
    if constexpr (kPair && !kSplit)
        if (pq.mode >= 0) pipe_quantize_groups(pr.y0, g0, g1, pq, lane);
    if constexpr (kSplit) {
        // Every slice of the CTA's rows is in shared memory: added in slice order.
        __syncthreads();
        auto sum = [&](int64_t r) {
            double s = cta_part[r];
            for (int q = 1; q < sp.slices; ++q) s += cta_part[q * sp.cta_rows + r];
            return float(s);
        };
        if constexpr (kPair) {
            for (int64_t r = threadIdx.x; r < c1 - c0; r += blockDim.x)
                pr.y0[c0 + r] = silu_mul(sum(2 * r), sum(2 * r + 1));
            if (pq.mode >= 0) {
                __syncthreads();  // the CTA's outputs are written before warp 0 counts them
                if (warp == 0) pipe_quantize_groups(pr.y0, c0, c1, pq, lane);
            }
        } else {
            for (int64_t r = threadIdx.x; r < (c1 - c0) * kV; r += blockDim.x)
                pr.y0[c0 * kV + r] = sum(r);
        }
    }
    if (lane == 0) NT_PHASE_MARK(marks, phase::kDone);
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

// A TMA GEMV setting read once from the environment, apart by weight type and by whether the
// launch is a SwiGLU pair's, for A/B runs. For a launch of type T (Q4_K, Q6_K or Q8_0) the first
// set of NT_<name>_PAIR_<T> (pairs only), NT_<name>_<T>, NT_<name>_PAIR (pairs only), NT_<name>
// holds; other types read the last two. Unset, `fallback(t, pair)` holds.
class TmaSetting {
  public:
    using Fallback = long long (*)(GgmlType, bool);
    TmaSetting(const char* name, Fallback fallback) {
        const std::string base = std::string("NT_") + name;
        for (int i = 0; i <= kTyped; ++i)
            for (const bool pair : {false, true}) {
                // The last row: every other type (F32 stands for them in the fallback).
                const Typed ty = i < kTyped ? kTypes[i] : Typed{GgmlType::F32, nullptr};
                long long v = env_int(base.c_str(), fallback(ty.type, pair));
                if (pair) v = env_int((base + "_PAIR").c_str(), v);
                if (ty.name) {
                    v = env_int((base + "_" + ty.name).c_str(), v);
                    if (pair) v = env_int((base + "_PAIR_" + ty.name).c_str(), v);
                }
                values_[i][pair] = v;
            }
    }
    long long operator()(GgmlType t, bool pair) const {
        int i = 0;
        while (i < kTyped && kTypes[i].type != t) ++i;
        return values_[i][pair];
    }

  private:
    struct Typed {
        GgmlType type;
        const char* name;  // in the variables' names
    };
    static constexpr int kTyped = 3;
    static constexpr Typed kTypes[kTyped] = {
        {GgmlType::Q4_K, "Q4_K"}, {GgmlType::Q6_K, "Q6_K"}, {GgmlType::Q8_0, "Q8_0"}};
    long long values_[kTyped + 1][2] = {};  // the last row: every other type
};

// Bytes of shared memory a warp's ring aims at (NT_TMA_RING, by type and pair as TmaSetting
// reads it; a ring has at least two stages). 16 KB, but 28 KB for the Q4_K and Q8_0 SwiGLU pairs
// and 12 KB for Q8_0's other rings.
// With two rows a stage 16 KB had lost (H200, 8B Q4_K_M tg128 374 against 426 tok/s with 8 KB:
// fewer warps a multiprocessor). With four rows a stage, 8B's 4096-column rings keep their two
// stages either way; where the 16 KB adds stages, the single matrices and column slices are
// level (bench_gemv), and the SwiGLU pair gains: Q4_K's 4.5 KB stages 3 instead of 2, at the
// same 4 CTAs a multiprocessor. H100, 8B tg128, 16 / 8 KB, same runs: Q4_K_M 462.7, 462.8 /
// 454.0, 454.0 (+1.9%); Q6_K 354.4, 354.5 / 353.1 (+0.4%); Q8_0 294.4 / 292.7 (+0.6%). 20 KB:
// Q6_K -4.4%; 24 KB: Q4_K_M +2.3%, Q6_K -4.8%; 32 KB: Q4_K_M -3.9%. Q4_K's pair at 24 KB: 5
// stages of 4.6 KB at 2 CTAs a multiprocessor instead of 3 at 4. H100, 8B tg128 in one run,
// alternating (fiftieth session): Q4_K_M 477.13, 477.36 against 472.52, 472.80 (+1.0%); every
// Q4_K ring at 24 KB only +0.5% (the other Q4_K rings at 24 KB -0.15%; 70B -0.3%, whose pairs
// keep 2 stages either way); Q6_K's pair at 24 KB -1.7%, every Q6_K ring -3.6%. At 28 KB (6
// stages; 70B's 9.2 KB pair stages 3 at 2 CTAs instead of 2 at 3), H100 in one run, alternating
// (fifty-first session): 8B 480.88, 480.98 against 480.05, 480.12 (+0.18%); 70B tg64 64.43,
// 64.44, 64.44 against 64.16, 64.17, 64.16 (+0.4%). 32 KB (1 CTA) -1.4%. Q8_0's pair (two
// column slices) at 28 KB, H100, 8B Q8_0 tg128 (fifty-second session): 305.81-305.94 against
// 300.14-300.60 (+1.8%); 24 KB +1.0%, 32 and 40 KB as 28. Q6_K's pair at 20 and 28 KB: -1.6%,
// -2.9%. Q8_0's other rings at 12 KB (the pair at 28), H100, 8B Q8_0 tg128 in one run,
// alternating (fifty-third session): 307.58-307.66 against 305.73-305.86 (+0.6%); 8 and 10 KB
// the same, 20 and 24 KB -1.4% and -1.1%. Q6_K's at 12 or 20 KB and Q4_K's at 12, 20 or 24 KB:
// level.
//
// One-unit column slices four rows a stage (8B's 14336-column down projections in Q4_K; kSplit
// launches with kV == 4 are only these) read their own setting, NT_TMA_RING_SLICES4 by type:
// 12 KB, two 4.6 KB stages at 3 CTAs a multiprocessor where 16 KB gave three at 2. H100, 8B
// Q4_K_M tg128, every Q4_K ring but the pair's at 12 KB (fifty-second session; of 8B's Q4_K
// rings only these change stages): 485.12-485.28 against 483.51-483.81 (+0.3%), 8 and 10 KB the
// same, 14 KB level.
// Column slices of one or two rows a stage (70B's two-unit slices in Q4_K; Q6_K's and Q8_0's)
// read NT_TMA_RING_SLICES by type, by default the type's NT_TMA_RING. 70B's keep 16 KB: alone
// at 12 and 20 KB they lose 0.46% and 0.65% (H100, 70B tg64 alternating, 64.38 and 64.26
// against 64.68; fifty-fourth session), and every Q4_K ring at 12 KB lost 0.5%.
// (decode_device.sh rings holds the pairs at these defaults while it sweeps a type's other rings.)
enum class TmaRingOf { Rows, Slices4, Slices };  // a pair's are Rows, by `pair`
inline int tma_ring_bytes(GgmlType t, bool pair, TmaRingOf of = TmaRingOf::Rows) {
    static const TmaSetting bytes("TMA_RING", [](GgmlType t, bool pair) -> long long {
        if (pair) return t == GgmlType::Q4_K || t == GgmlType::Q8_0 ? 28672 : 16384;
        return t == GgmlType::Q8_0 ? 12288 : 16384;
    });
    static const TmaSetting slices4_bytes("TMA_RING_SLICES4",
                                          [](GgmlType, bool) -> long long { return 12288; });
    static const TmaSetting slices_bytes(
        "TMA_RING_SLICES", [](GgmlType t, bool) -> long long { return bytes(t, false); });
    const long long b = pair                       ? bytes(t, true)
                        : of == TmaRingOf::Slices4 ? slices4_bytes(t, false)
                        : of == TmaRingOf::Slices  ? slices_bytes(t, false)
                                                   : bytes(t, false);
    return int(std::clamp(b, 1024LL, 49152LL));
}

// At most this many CTAs a multiprocessor (NT_TMA_CTAS, by type and pair); 0, the default,
// leaves it to shared memory and registers. For A/B runs: whether the Q4_K pair's 24 KB ring
// wins by its deeper stages or by its 2 CTAs a multiprocessor instead of 4 (room for the kernel
// after it to start beside): the stages (the 16 KB pair capped at 2 CTAs loses 4.6%).
inline int tma_ctas_cap(GgmlType t, bool pair) {
    static const TmaSetting cap("TMA_CTAS", [](GgmlType, bool) -> long long { return 0; });
    return int(cap(t, pair));
}

// Per instantiation, once: the shared-memory limit raised to the most a CTA may have, and the
// CTAs per multiprocessor that its registers allow at `warps` warps a CTA (kPipeWarps; with
// kSplit up to kTmaCtaWarps); shared memory then decides per launch.
template <GgmlType T, bool kPair, int kXU, int kV, bool kSplit = false, bool kXF = false>
int tma_ctas_by_registers(int warps = kPipeWarps) {
    constexpr int kMaxWarps = tma_threads(kSplit) / 32;
    static const std::array<int, kMaxWarps + 1> per_sm = [] {
        auto* kernel = gemv_q8_tma<T, kPair, kXU, kV, kSplit, kXF>;
        NT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           device_limits().optin),
                      "gemv tma shared memory limit");
        std::array<int, kMaxWarps + 1> n{};
        for (int w = 1; w <= kMaxWarps; ++w)
            NT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n[w], kernel, w * 32, 0),
                          "gemv tma occupancy");
        return n;
    }();
    return per_sm[std::clamp(warps, 1, kMaxWarps)];
}

// Whether weights stream with L2's evict-first policy (on unless NT_TMA_EVICT_FIRST=0, by type
// and pair: A/B runs). H100, 8B Q4_K_M tg128 with the Q4_K pair's off: -3.9% (fifty-first
// session).
inline bool tma_evict_first(GgmlType t, bool pair) {
    static const TmaSetting on("TMA_EVICT_FIRST", [](GgmlType, bool) -> long long { return 1; });
    return on(t, pair) != 0;
}

// Of a ring's stages, the most requested before the programmatic wait (NT_TMA_EARLY, by type
// and pair; default all), for A/B runs. With the Q4_K pair's 6-stage rings about 29 MB of its
// 66 MB (8B) are requested while the norm before it runs, and the norm's reads queue behind
// them (3.1-3.9 us to its sum in the Q4_K layers, 1.2-1.6 in the others); the o projection's
// whole matrix is requested during the attention. Fewer lose: one stage early for the pair when
// it had 3, -0.2% (thirty-ninth session); H100, 8B Q4_K_M tg128 (fifty-first session), 3 of the
// Q4_K pair's, -0.14%; 1 of every other Q4_K GEMV's, -2.1%.
inline int tma_early_stages(GgmlType t, bool pair) {
    static const TmaSetting n("TMA_EARLY",
                              [](GgmlType, bool) -> long long { return kTmaMaxStages; });
    return int(std::clamp(n(t, pair), 0LL, (long long)kTmaMaxStages));
}

// The ring for groups of kv rows of row_bytes of type t (a SwiGLU pair's where pair, column
// slices' by `of`): as many stages as tma_ring_bytes holds.
inline TmaRing tma_ring(int64_t row_bytes, int kv, GgmlType t, bool pair,
                        TmaRingOf of = TmaRingOf::Rows) {
    TmaRing r;
    r.row_bytes = int(row_bytes);
    r.stages = std::clamp(int(tma_ring_bytes(t, pair, of) / (kv * row_bytes)), 2, kTmaMaxStages);
    r.early = tma_early_stages(t, pair);
    r.evict_first = tma_evict_first(t, pair);
    return r;
}

// nb: blocks of a stage's row (of a slice's with kSplit); kXF: the activations are the floats
// at xf (xq and xd unused).
template <GgmlType T, bool kPair, int kXU, int kV, bool kSplit = false, bool kXF = false>
void launch_tma_k(const GemvStack& pr, const uint8_t* w2, int nb, const int8_t* xq,
                  const float2* xd, bool pdl, cudaStream_t stream, const PairQuant& q,
                  TmaSplit sp = {}, const float* xf = nullptr) {
    using Q = Quant<T>;
    constexpr TmaRingOf of = !kSplit || kPair ? TmaRingOf::Rows
                             : kV == 4        ? TmaRingOf::Slices4
                                              : TmaRingOf::Slices;
    TmaRing ring = tma_ring(int64_t(nb) * Q::kBlockBytes, kV, T, kPair, of);
    const bool early = pdl && pdl_prefetch_enabled();  // its first stages before its wait
    if (early) ring.warm = std::exchange(pending_l2_warm(), {});
    // Warps a CTA: kPipeWarps; with kSplit a whole number a slice.
    const int W = kSplit ? tma_split_warps(sp.slices) : kPipeWarps;
    const int64_t groups = kPair ? pr.rows() : pr.rows() / kV;
    const DeviceLimits& d = device_limits();
    // As many CTAs as the GPU holds at once, at most one group a warp. With kSplit the slices'
    // sums of a CTA's rows follow its rings and barriers, and the grid sets how many rows that is.
    int64_t grid = (groups * sp.slices + W - 1) / W;
    size_t smem = 0;  // the rings and barriers (tma_ring_smem), with kSplit the sums after them
    auto size_smem = [&] {
        smem = tma_ring_smem(ring, W, kV);
        if constexpr (kSplit) {
            sp.cta_rows = int((groups + grid - 1) / grid * kV);
            smem += (size_t(sp.slices) * sp.cta_rows * sizeof(double) + 15) / 16 * 16;
        }
    };
    auto ctas_per_sm = [&] {
        size_smem();
        return std::min(tma_ctas_by_registers<T, kPair, kXU, kV, kSplit, kXF>(W),
                        int(d.smem_per_sm / (smem + d.reserved)));
    };
    for (int pass = 0; pass < (kSplit ? 3 : 1); ++pass) {
        int per_sm = ctas_per_sm();
        // A ring deeper than a multiprocessor's shared memory holds (NT_TMA_RING set high, a
        // column split's many warps) gives up stages, down to two.
        while (per_sm < 1 && ring.stages > 2) {
            --ring.stages;
            per_sm = ctas_per_sm();
        }
        if (per_sm < 1) nt::fail("gemv: the TMA ring of %zu bytes does not fit on this GPU.", smem);
        if (const int cap = tma_ctas_cap(T, kPair); cap > 0) per_sm = std::min(per_sm, cap);
        grid = std::min<int64_t>(grid, int64_t(per_sm) * d.sms);
    }
    size_smem();
    launch_kernel(pdl, gemv_q8_tma<T, kPair, kXU, kV, kSplit, kXF>, dim3(unsigned(grid)),
                  dim3(unsigned(W) * 32), smem, stream,
                  kSplit ? "gemv (pipe, tma ring, column slices)" : "gemv (pipe, tma ring)", pr, w2,
                  nb, xq, xd, xf, q, early, ring, sp);
}

// The fewest rows for which Q8_0's whole rows take the TMA form (NT_Q8_TMA_ROWS, for A/B runs;
// default 8192).
inline int64_t q8_tma_min_rows() {
    static const int64_t rows = env_int("NT_Q8_TMA_ROWS", 8192);
    return rows;
}

// Whether the TMA form takes a launch of `rows` rows of `cols` columns whole, wherever its
// matrices start (tma_fits adds their alignment): one activation row, sm_90+, rows whose
// activations it holds in registers (tma_x_units) and whose bytes are a multiple of 16, as the
// bulk copies need.
template <GgmlType T>
bool tma_whole_rows(int64_t rows, int64_t cols, int nx) {
    if constexpr (!tma_compiled<T>()) {
        return false;
    } else {
        const int64_t row_bytes = cols / Quant<T>::kBlockElems * Quant<T>::kBlockBytes;
        // Q8_0's whole rows only in large launches: H200, bench_gemv --pdl, TMA form / register
        // ring, us: 14336x4096 17.7 / 20.1, 128256x4096 132.7 / 168.4, but 4096x4096 7.30 / 6.66
        // (with two rows a warp its stages are 8.7 KB, so only 3 CTAs fit a multiprocessor).
        if (T == GgmlType::Q8_0 && rows < q8_tma_min_rows()) return false;
        return nx == 1 && tma_x_units<T>(int(pipe_units<T>(cols))) && row_bytes % 16 == 0 &&
               tma_usable();
    }
}

// Whether a launch takes the TMA form with whole rows: tma_whole_rows, and the matrices'
// starts 16-byte aligned.
template <GgmlType T>
bool tma_fits(const GemvStack& pr, const void* w2, int64_t cols, int nx) {
    auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    return tma_whole_rows<T>(pr.rows(), cols, nx) && aligned(pr.m0) && aligned(pr.m1) &&
           aligned(pr.m2) && aligned(w2);
}

// The column slices a SwiGLU pair's rows are cut into, sharing a CTA (1: whole rows;
// NT_PAIR_SLICES=N, by type, for A/B runs). H200 tg128, 8B, two slices against whole rows, same
// runs: Q6_K 402.6, 402.6 / 394.5, 394.9 and 402.4, 403.9 / 395.1 (+1.9%); Q8_0 370.3 / 364.6,
// 364.6 and 359.8 (mean of 3) / 357.5 (+0.6 to +1.6%); but Q4_K_M 505.8, 504.9 / 507.9, 508.9:
// Q4_K's pairs stay whole.
template <GgmlType T>
int tma_pair_slices() {
    static const TmaSetting n(
        "PAIR_SLICES", [](GgmlType t, bool) -> long long { return t == GgmlType::Q4_K ? 1 : 2; });
    return int(n(T, true));
}

// Four rows a stage where launch_pipe would take two (single matrices and stacks of whole
// rows of up to two units: 8B's 4096 columns in Q4_K and Q6_K), on unless NT_TMA_FOUR_ROWS=0
// (by type: A/B runs). A stage's fixed work (the wait, lane 0's copy, the reduction: warp_sum_rows)
// then serves twice the bytes, and each warp has twice the bytes in flight (two 9.2 KB stages for
// Q4_K; 3 CTAs a multiprocessor by shared memory instead of 4). H100, 8B tg128, four rows /
// two: Q4_K_M 439.0, 440.0 / 429.7, 429.6 (+2.3%); Q6_K 347.5 / 344.3 (+0.9%). Not for
// 70B's 8192-column rows (four units: 37 KB a warp, one CTA a multiprocessor) nor Q8_0 (not
// measured).
template <GgmlType T>
constexpr bool tma_four_rows_compiled(int xu) {
    return xu <= 2 && (T == GgmlType::Q4_K || T == GgmlType::Q6_K);
}
inline bool tma_four_rows(GgmlType t) {
    static const TmaSetting on("TMA_FOUR_ROWS", [](GgmlType, bool) -> long long { return 1; });
    return on(t, false) != 0;
}
// Whether a multiprocessor holds at least 2 CTAs of four-row rings of row_bytes rows (the H100
// and H200: Q4_K 3, Q6_K 2): where shared memory is smaller, twice the bytes a stage would
// leave one CTA or none.
inline bool tma_four_rows_fit(int64_t row_bytes, GgmlType t) {
    const size_t smem = tma_ring_smem(tma_ring(row_bytes, 4, t, false), kPipeWarps, 4);
    const DeviceLimits& d = device_limits();
    return d.smem_per_sm / (smem + d.reserved) >= 2;
}

// launch_pipe's choices (two rows a warp for a single matrix with a row per resident warp)
// for the TMA form; tma_fits holds.
template <GgmlType T, bool kPair>
void launch_tma(const GemvStack& pr, const uint8_t* w2, int64_t cols, const int8_t* xq,
                const float2* xd, bool pdl, cudaStream_t stream, const PairQuant& q) {
    constexpr int kV = kPair ? 2 : 1;
    const int nb = int(cols / Quant<T>::kBlockElems);
    const bool two = !kPair && pipe_two_rows<T, 1, 0>(pr);
    if constexpr (kPair) {
        const int ps = tma_pair_slices<T>();
        const int64_t upr = pipe_units<T>(cols);
        if (ps > 1 && ps <= kTmaMaxSlices && upr % ps == 0 &&
            with_tma_units<T>(upr / ps, [&](auto xu_tag) {
                constexpr int XU = decltype(xu_tag)::value;
                const TmaSplit sp{ps, int64_t(nb) * Quant<T>::kBlockBytes};
                launch_tma_k<T, true, XU, 2, true>(pr, w2, nb / ps, xq, xd, pdl, stream, q, sp);
            }))
            return;
    }
    const bool four = two && tma_four_rows(T) && pr.e0 % 4 == 0 && pr.e1 % 4 == 0 &&
                      pr.e2 % 4 == 0 && tma_four_rows_fit(int64_t(nb) * Quant<T>::kBlockBytes, T);
    const bool launched = with_tma_units<T>(pipe_units<T>(cols), [&](auto xu_tag) {
        constexpr int XU = decltype(xu_tag)::value;
        if constexpr (tma_four_rows_compiled<T>(XU))
            if (four) return launch_tma_k<T, false, XU, 4>(pr, w2, nb, xq, xd, pdl, stream, q);
        if (two) return launch_tma_k<T, false, XU, 2>(pr, w2, nb, xq, xd, pdl, stream, q);
        launch_tma_k<T, kPair, XU, kV>(pr, w2, nb, xq, xd, pdl, stream, q);
    });
    if (!launched)
        nt::fail("gemv: no TMA form for %s rows of %lld.", type_name(T), (long long)cols);
}

// Whether rows too long for the TMA form are cut into column slices (on unless
// NT_GEMV_SPLIT=0, for A/B runs against the register ring).
inline bool tma_split_enabled() {
    static const bool on = env_switch("NT_GEMV_SPLIT");
    return on;
}

// One-unit column slices (8B's 14336 columns) four rows a stage, on unless
// NT_TMA_SPLIT_FOUR=0 (by type: A/B runs): Q4_K's run only so (tma_slice_units, launch_tma_split).
// 8B tg128 on an H100, with / without: Q4_K_M 458.5 / 449.4 tok/s (+2.0%; its Q4_K down projections
// off the register ring, its Q6_K ones from two rows a stage), Q6_K 361.6 / 356.2
// (+1.5%). Two-unit slices (70B) take two rows a stage.
template <GgmlType T>
constexpr bool tma_split_four_compiled(int xu) {
    return xu == 1 && tma_four_rows_compiled<T>(xu);
}
inline bool tma_split_four(GgmlType t) {
    static const TmaSetting on("TMA_SPLIT_FOUR", [](GgmlType, bool) -> long long { return 1; });
    return on(t, false) != 0;
}

// The slice width (units) for rows of `upr` units that the TMA form does not take whole: the
// widest it takes whole that cuts the row into 2 .. kTmaMaxSlices equal slices; 0 for none.
// 70B's 28672 columns (14 units): 7 slices of 2; Q6_K's 8192 (4): 2 of 2; 8B's 14336 (7): 7 of
// 1. H200, bench_gemv --pdl, GB/s, column slices / register ring: Q4_K 8192x28672 3855 / 3345;
// Q6_K 8192x28672 3520 / 2739, 28672x8192 3651 / 2776, 8192x8192 2832 / 2537, 4096x14336
// 2779 / 2463. But Q4_K's one-unit slices (1152 bytes a row) lost at two rows a stage
// (4096x14336 2275 / 2921: too little work between one row's reductions and the next), so
// they are cut only where they run four rows a stage (tma_split_four).
template <GgmlType T>
int tma_slice_units(int64_t upr) {
    if (tma_x_units<T>(int(upr))) return 0;
    const bool one = T == GgmlType::Q6_K || (T == GgmlType::Q4_K && tma_split_four(T));
    for (int su : {8, 4, 2, 1})
        if (tma_x_units<T>(su) && (su > 1 || one) && upr % su == 0 && upr / su >= 2 &&
            upr / su <= kTmaMaxSlices)
            return su;
    return 0;
}

// The slices a single matrix's rows of `cols` columns are cut into at nx activation rows (the
// TMA form, on this GPU, unless NT_GEMV_SPLIT=0); 0 where they are not.
template <GgmlType T>
int tma_split_slices(int64_t cols, int nx) {
    if constexpr (!tma_compiled<T>()) {
        return 0;
    } else {
        using Q = Quant<T>;
        constexpr int kBPU = 32 / Q::kLanesPerBlock;
        const int64_t nb = cols / Q::kBlockElems;
        if (nx != 1 || nb % kBPU != 0 || !tma_split_enabled() || !tma_usable()) return 0;
        const int su = tma_slice_units<T>(nb / kBPU);
        if (su == 0) return 0;
        const int slices = int(nb / kBPU / su);
        return nb * Q::kBlockBytes % (16 * slices) == 0 ? slices : 0;  // 16-byte aligned slices
    }
}

// The warps of the GPU at once for column slices of kXU units, kV rows a stage, `warps` warps a
// CTA: each of them must get a group of rows.
template <GgmlType T, int kXU, int kV>
int64_t tma_split_resident_warps(int warps) {
    return int64_t(tma_ctas_by_registers<T, false, kXU, kV, true>(warps)) * device_limits().sms *
           warps;
}

// How launch_tma_split runs a single matrix of `rows` rows of `cols` columns at weights w:
// its slices (0: not in slices) and rows a stage.
struct TmaSplitPlan {
    int slices = 0;
    int kv = 1;
};
template <GgmlType T>
TmaSplitPlan tma_split_plan(const void* w, int64_t rows, int64_t cols, int nx) {
    TmaSplitPlan p;
    if constexpr (tma_compiled<T>()) {
        const int slices = tma_split_slices<T>(cols, nx);
        if (slices == 0 || reinterpret_cast<uintptr_t>(w) % 16 != 0) return p;
        const int W = tma_split_warps(slices);
        const int xu = int(pipe_units<T>(cols) / slices);
        // One-unit slices four rows a stage (tma_split_four) where every warp gets a group.
        // Q4_K's run only so: elsewhere the register ring takes the rows whole. Q6_K's take two
        // rows a stage there.
        if constexpr (tma_split_four_compiled<T>(1)) {
            if (xu == 1 && tma_split_four(T)) {
                if (rows % 4 == 0 && rows / 4 * slices >= tma_split_resident_warps<T, 1, 4>(W))
                    return {slices, 4};
                if (T == GgmlType::Q4_K) return p;
            }
        }
        // Two rows a warp where every warp of the GPU still gets a group (pipe_two_rows).
        bool two = false;
        with_tma_units<T>(xu, [&](auto xu_tag) {
            two = rows % 2 == 0 && pipe_two_rows_enabled() &&
                  rows / 2 * slices >= tma_split_resident_warps<T, decltype(xu_tag)::value, 2>(W);
        });
        p = {slices, two ? 2 : 1};
    }
    return p;
}

// Whether rows of `cols` columns are cut into slices whose form quantizes float activations
// itself (tma_float_x_compiled), whatever the rows; and whether launch_tma_split takes a single
// matrix's float activations (xf): such slices, and the plan cuts this one.
template <GgmlType T>
bool tma_float_x_cols(int64_t cols) {
    const int slices = tma_split_slices<T>(cols, 1);
    return slices > 0 && tma_float_x_compiled<T>(int(pipe_units<T>(cols) / slices));
}
template <GgmlType T>
bool tma_split_float_x(const void* w, int64_t rows, int64_t cols) {
    return tma_float_x_cols<T>(cols) && tma_split_plan<T>(w, rows, cols, 1).slices > 0;
}

// A single matrix whose rows the TMA form takes in column slices (tma_split_plan): launched,
// true; otherwise false, nothing launched. With xf the activations are those floats, xq and xd
// unused, and false where the slices' form does not quantize them (tma_split_float_x).
template <GgmlType T>
bool launch_tma_split(const GemvStack& pr, int64_t cols, const int8_t* xq, const float2* xd, int nx,
                      bool pdl, cudaStream_t stream, const float* xf = nullptr) {
    if constexpr (!tma_compiled<T>()) {
        return false;
    } else {
        if (pr.count != 1) return false;
        const TmaSplitPlan p = tma_split_plan<T>(pr.m0, pr.rows(), cols, nx);
        if (p.slices == 0) return false;
        const int xu = int(pipe_units<T>(cols) / p.slices);  // a slice's units
        if (xf && !tma_float_x_compiled<T>(xu)) return false;
        using Q = Quant<T>;
        const int64_t nb = cols / Q::kBlockElems;
        const TmaSplit sp{p.slices, nb * Q::kBlockBytes};
        const int snb = int(nb / p.slices);
        auto go = [&](auto xu_tag) {
            constexpr int XU = decltype(xu_tag)::value;
            auto with_kv = [&](auto kv_tag) {
                constexpr int KV = decltype(kv_tag)::value;
                if constexpr (tma_float_x_compiled<T>(XU))
                    if (xf)
                        return launch_tma_k<T, false, XU, KV, true, true>(
                            pr, nullptr, snb, nullptr, nullptr, pdl, stream, {}, sp, xf);
                launch_tma_k<T, false, XU, KV, true>(pr, nullptr, snb, xq, xd, pdl, stream, {}, sp);
            };
            if constexpr (tma_split_four_compiled<T>(XU))
                if (p.kv == 4) return with_kv(std::integral_constant<int, 4>{});
            if (p.kv == 2) return with_kv(std::integral_constant<int, 2>{});
            with_kv(std::integral_constant<int, 1>{});
        };
        with_tma_units<T>(xu, go);
        return true;
    }
}

// Whether the TMA form takes a single matrix's rows of `cols` columns at one activation row on
// this GPU, whole or in column slices.
template <GgmlType T>
bool tma_takes(int64_t cols) {
    if constexpr (!tma_compiled<T>()) {
        return false;
    } else {
        return tma_usable() &&
               (tma_x_units<T>(int(pipe_units<T>(cols))) || tma_split_slices<T>(cols, 1) > 0);
    }
}

// The pipe kernel, in its TMA form where that can run: whole rows (tma_fits), or, where `split`
// allows it, a single matrix in column slices (launch_tma_split); else with its register ring.
template <GgmlType T>
void launch_pipe_any(const GemvStack& pr, const void* w2, int64_t cols, const int8_t* xq,
                     const float2* xd, int n, int nx, bool pdl, cudaStream_t stream,
                     const PairQuant& q = {}, bool split = false) {
    if (split && !w2 && launch_tma_split<T>(pr, cols, xq, xd, nx, pdl, stream)) return;
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
    if constexpr (tma_compiled<T>()) {
        if (!tma_usable()) return;
        any_tma_units<T>([](auto xu_tag) {
            constexpr int XU = decltype(xu_tag)::value;
            tma_ctas_by_registers<T, false, XU, 1>();
            tma_ctas_by_registers<T, false, XU, 2>();
            if constexpr (tma_four_rows_compiled<T>(XU)) tma_ctas_by_registers<T, false, XU, 4>();
            tma_ctas_by_registers<T, true, XU, 2>();
            tma_ctas_by_registers<T, false, XU, 1, true>();
            tma_ctas_by_registers<T, false, XU, 2, true>();
            if constexpr (tma_split_four_compiled<T>(XU))
                tma_ctas_by_registers<T, false, XU, 4, true>();
            tma_ctas_by_registers<T, true, XU, 2, true>();
            if constexpr (tma_float_x_compiled<T>(XU)) {
                tma_ctas_by_registers<T, false, XU, 1, true, true>();
                tma_ctas_by_registers<T, false, XU, 2, true, true>();
                if constexpr (tma_split_four_compiled<T>(XU))
                    tma_ctas_by_registers<T, false, XU, 4, true, true>();
            }
            return false;  // every one
        });
    }
}

}  // namespace nt::cuda::detail
