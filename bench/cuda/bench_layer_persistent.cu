// A decode step's layers as one persistent kernel: does a weight stream that never stops at a
// data dependency beat the engine's chain of launches?
//
// Decode spends about as long beyond its bytes as on them (8B Q4_K_M, H200: ~58 us a layer
// against ~31 for its bytes; BENCHMARKS.md, "What holds decode back"), and what is left is the
// kernel boundaries: every GEMV drains its grid before the next one's weights flow, and the
// latency-bound kernels between them (norms, attention) run while HBM idles. Every cross-CTA
// handoff tried inside the launches lost, because a fence costs 2.5-7 us while HBM streams
// (bench_sync_latency) and the streams stopped for it.
//
// Here one CTA a multiprocessor runs every layer. Each warp owns a ring of shared-memory stages
// that the copy engine fills (cp.async.bulk) with the warp's share of the weights in the order it
// will use them, across GEMVs and across layers: a weight row does not depend on any activation,
// so the ring runs ahead through every grid barrier, and the HBM keeps streaming while the CTAs
// wait for each other. The barriers (five a layer: after q/k/v, the attention, o, gate/up and
// down) are one release-add and an acquire spin of one thread a CTA. Activations are prepared
// redundantly in every CTA (norm and 8-bit quantization into shared memory), so the norms cost
// no handoff of their own; the attention is split-K over 128 CTAs, merged in o's preparation.
//
// What it found (H100, 8B Q4_K, 16 warps; BENCHMARKS.md, thirty-fifth session): the rings alone
// stream at 3175 GB/s (38.6 us a layer), but the whole layer takes 77.9 us, slower than the
// engine's launches (about 68 us a layer for Q4_K_M's slightly larger layers). Added one at a time:
// the GEMVs' arithmetic +8.5 us (it alone reaches only 82% of the stream), the preparations
// +9.1, the attention +4.2, the barriers +17.5 (3.5 us each while HBM streams). A ring can only
// hide a stall if the warps consume faster than HBM delivers, and these consume slower, so every
// stall adds. Kept as the measurement of that design and the starting point for a faster one.
//
// A layer, Llama-3 8B shapes, all one weight type (Q4_K or Q6_K), in this order:
//   x -> RMSNorm -> Q8_K -> q/k/v GEMV | RoPE, attention over the KV cache (a CTA a head and
//   quarter of the positions) |
//   Q8_K -> o GEMV, x += | RMSNorm -> Q8_K -> gate/up GEMV, silu(g) * u | Q8_K -> down, x +=
// with the GEMVs in the engine's arithmetic (Quant<T>: the CPU's vec_dot in double).
//
//   bench_layer_persistent [--type q4_K|q6_K] [--layers 32] [--ctx 256] [--warps 16]
//                          [--stages N (default: as many as fit)] [--iters 20] [--check]
//
// Prints, per mode: us a layer, GB/s of weights, and the share of the stream-only mode's rate.
// The modes add the layer's parts one at a time: `stream` (the rings alone: each warp waits for
// its stages and frees them; the ceiling for this access pattern), `+gemv` (the GEMVs'
// arithmetic), `+prep` (norms and quantization), `+attention`, and `+barriers` (the whole layer;
// only it computes the right values). --check runs two layers and compares x with the CPU
// (nt::vec_dot on nt::quantize_row's Q8_K, float norm, RoPE and attention).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/cuda_check.cuh"
#include "backend/cuda/matmul_quant.cuh"
#include "backend/cuda/quantize_q8.cuh"
#include "backend/cuda/rope.cuh"
#include "backend/cuda/swiglu.cuh"
#include "backend/cuda/warp_reduce.cuh"
#include "matmul_harness.h"

using namespace nt::cuda::detail;
using bench::DeviceBuffer;
using nt::GgmlType;

namespace {

constexpr int kD = 4096, kHeads = 32, kKvHeads = 8, kHd = 128, kFf = 14336;
constexpr int kKvDim = kKvHeads * kHd, kQkv = kD + 2 * kKvDim;
constexpr float kEps = 1e-5f, kRopeBase = 500000.f;
constexpr int kMaxWarps = 16, kMaxStages = 4, kMaxCtx = 1024;
// The attention splits each head's positions in kChunks, a CTA a (head, chunk); the merge is
// part of the o projection's activation preparation. Each chunk leaves (max, sum, acc[kHd]).
constexpr int kChunks = 4, kPartFloats = 4 + kHd;  // acc 16-byte aligned
// A stage: two rows of the 4096-column matrices, one gate/up pair, or one of the two column parts
// of a down row (4 and 3 units of 8 blocks: both parts start 16-byte aligned for Q4_K and Q6_K).
constexpr int kStageRows = 2, kUnitBlocks = 8, kDownUnits = kFf / 256 / kUnitBlocks, kDownPart0 = 4;

// What a run does besides streaming the weights (bits of Params::mode), for the ablation.
enum Mode : int {
    kStream = 0,   // the rings alone
    kCompute = 1,  // the GEMVs' arithmetic (on whatever activations are there)
    kPrep = 2,     // the activations' norms, merge and quantization
    kAttend = 4,   // the attention
    kBarrier = 8,  // the grid barriers
    kFull = 15,
};
// The GEMVs of a layer, in stream order.
enum Phase { kPhQkv = 0, kPhO = 1, kPhGateUp = 2, kPhDown = 3, kPhases = 4 };

struct LayerW {
    const uint8_t *qkv, *o, *gate, *up, *down;
    const float *attn_norm, *ffn_norm;
};

struct Params {
    const LayerW* layers;
    int n_layers;
    float *x, *q, *knew, *vnew, *h;
    float* part;      // [kHeads][kChunks][kPartFloats]
    __half *kc, *vc;  // [layer][kMaxCtx][kKvDim]
    int pos;          // the step's position; the cache holds 0 .. pos - 1
    unsigned* bar;    // the grid barrier's counter, zero at launch
    int mode, stages, slot_bytes;
};

template <GgmlType T>
struct Shape {
    static constexpr int kBB = Quant<T>::kBlockBytes;
    static constexpr int kRowD = kD / 256 * kBB, kRowF = kFf / 256 * kBB;
    static constexpr int kPart0Bytes = kDownPart0 * kUnitBlocks * kBB;
    static constexpr int kSlot = kStageRows * kRowD > kPart0Bytes ? kStageRows* kRowD : kPart0Bytes;
};

// A balanced range of the CTA's balanced range of n items (rows, or gate/up pairs).
__device__ __forceinline__ void warp_range(int n, int warps_per_cta, int warp, int& b, int& e) {
    const int c0 = int(int64_t(n) * blockIdx.x / gridDim.x);
    const int c1 = int(int64_t(n) * (blockIdx.x + 1) / gridDim.x);
    b = c0 + (c1 - c0) * warp / warps_per_cta;
    e = c0 + (c1 - c0) * (warp + 1) / warps_per_cta;
}
__device__ __forceinline__ int phase_items(int ph) {
    return ph == kPhQkv ? kQkv : ph == kPhGateUp ? kFf : kD;
}
// Stages of the items [b, e) in phase ph.
__device__ __forceinline__ int phase_stages(int ph, int b, int e) {
    const int n = e - b;
    return ph == kPhDown ? 2 * n : ph == kPhGateUp ? n : (n + kStageRows - 1) / kStageRows;
}

// Where a warp's stream stands: layer, phase, the warp's first item there, and the next stage.
struct Cursor {
    int layer = 0, ph = -1, b = 0, e = 0, s = 0, ns = 0;
};
// Moves c to its next stage, across phases and layers; false past the last layer.
__device__ __forceinline__ bool settle(Cursor& c, int n_layers, int W, int warp) {
    while (c.s >= c.ns) {
        if (++c.ph == kPhases) c.ph = 0, ++c.layer;
        if (c.layer >= n_layers) return false;
        warp_range(phase_items(c.ph), W, warp, c.b, c.e);
        c.s = 0, c.ns = phase_stages(c.ph, c.b, c.e);
    }
    return true;
}

__device__ __forceinline__ void grid_barrier(unsigned* bar, unsigned target) {
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(bar) : "memory");
        unsigned v;
        do {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(bar) : "memory");
        } while (v < target);
    }
    __syncthreads();
}

__device__ __forceinline__ void ldcg8(const float* p, float (&v)[8]) {
    const float4 a = __ldcg(reinterpret_cast<const float4*>(p));
    const float4 c = __ldcg(reinterpret_cast<const float4*>(p + 4));
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = c.x, v[5] = c.y, v[6] = c.z, v[7] = c.w;
}

// n activations (n a multiple of 256) as Q8_K into xq / xd (one float2 a 32 elements: d,
// d * sum q), by the whole CTA. load(e, v) gives elements e .. e+7; scale multiplies them (the
// norm's).
template <class Load>
__device__ void quantize_all(int n, Load&& load, int8_t* xq, float2* xd) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, W = blockDim.x >> 5;
    for (int b = warp; b < n / 256; b += 2 * W) {
        // Two blocks' loads in flight before either is quantized.
        const int b2 = b + W;
        float v[8], v2[8];
        load(b * 256 + lane * 8, v);
        if (b2 < n / 256) load(b2 * 256 + lane * 8, v2);
        int q[8];
        float2 d = q8k_block(v, lane, q);
        store_q8(xq + b * 256 + lane * 8, q);
        if ((lane & 3) == 0) xd[b * 8 + lane / 4] = d;
        if (b2 < n / 256) {
            d = q8k_block(v2, lane, q);
            store_q8(xq + b2 * 256 + lane * 8, q);
            if ((lane & 3) == 0) xd[b2 * 8 + lane / 4] = d;
        }
    }
    __syncthreads();
}
// x's RMSNorm times w, quantized.
__device__ void prep_norm(const float* x, const float* w, int8_t* xq, float2* xd, float* red) {
    float ss = 0.f;
    for (int i = threadIdx.x * 4; i < kD; i += blockDim.x * 4) {
        const float4 v = __ldcg(reinterpret_cast<const float4*>(x + i));
        ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    ss = block_reduce(ss, red, 0.f, WarpSum{});
    const float scale = rsqrtf(ss / float(kD) + kEps);
    quantize_all(
        kD,
        [&](int e, float(&v)[8]) {
            ldcg8(x + e, v);
            for (int i = 0; i < 8; ++i) v[i] = v[i] * scale * __ldg(w + e + i);
        },
        xq, xd);
}
// The attention's output from its chunks (flash-decoding's merge), quantized.
__device__ void prep_attention(const float* part, int8_t* xq, float2* xd) {
    quantize_all(
        kD,
        [&](int e, float(&v)[8]) {
            const int head = e / kHd, d = e % kHd;
            const float* ph = part + head * kChunks * kPartFloats;
            float m = -INFINITY;
            for (int k = 0; k < kChunks; ++k) m = fmaxf(m, __ldcg(ph + k * kPartFloats));
            float s = 0.f;
            for (int i = 0; i < 8; ++i) v[i] = 0.f;
            for (int k = 0; k < kChunks; ++k) {
                const float mk = __ldcg(ph + k * kPartFloats);
                const float wk = mk == -INFINITY ? 0.f : __expf(mk - m);
                s += wk * __ldcg(ph + k * kPartFloats + 1);
                float a[8];
                ldcg8(ph + k * kPartFloats + 4 + d, a);
                for (int i = 0; i < 8; ++i) v[i] += wk * a[i];
            }
            for (int i = 0; i < 8; ++i) v[i] /= s;
        },
        xq, xd);
}
// h as it is, quantized.
__device__ void prep_plain(const float* h, int n, int8_t* xq, float2* xd) {
    quantize_all(
        n, [&](int e, float(&v)[8]) { ldcg8(h + e, v); }, xq, xd);
}

// RoPE (adjacent pairs, GGUF's Llama layout) of the 4 dims lane*4 .. lane*4+3 of one head, in
// the engine's arithmetic (rope.cuh).
__device__ __forceinline__ float4 rope4(float4 v, int lane, int pos) {
    float r[4] = {v.x, v.y, v.z, v.w};
    for (int k = 0; k < 2; ++k) {
        const int i = lane * 2 + k;  // pair index in the head
        float c, s;
        nt::cuda::detail::rope_angle(pos, powf(kRopeBase, -2.f * float(i) / float(kHd)), c, s);
        const float2 t = nt::cuda::detail::rope_turn(r[2 * k], r[2 * k + 1], c, s);
        r[2 * k] = t.x;
        r[2 * k + 1] = t.y;
    }
    return make_float4(r[0], r[1], r[2], r[3]);
}

// One chunk of one head's attention at position pos (CTA blockIdx.x = head * kChunks + chunk):
// the chunk's max score, sum of exps and exp-weighted sum of values into p.part.
__device__ void attention_chunk(const Params& p, int layer, float* sc, float* red) {
    const int head = blockIdx.x / kChunks, chunk = blockIdx.x % kChunks;
    const int g = head / (kHeads / kKvHeads);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, W = blockDim.x >> 5;
    const int ctx = p.pos + 1, t0 = ctx * chunk / kChunks, t1 = ctx * (chunk + 1) / kChunks;
    const size_t lc = size_t(layer) * kMaxCtx * kKvDim;
    const float4 q =
        rope4(__ldcg(reinterpret_cast<const float4*>(p.q + head * kHd + lane * 4)), lane, p.pos);
    const float4 kn =
        rope4(__ldcg(reinterpret_cast<const float4*>(p.knew + g * kHd + lane * 4)), lane, p.pos);
    if (head % (kHeads / kKvHeads) == 0 && chunk == 0 && warp == 0) {
        const float4 vn = __ldcg(reinterpret_cast<const float4*>(p.vnew + g * kHd + lane * 4));
        __half2* kd =
            reinterpret_cast<__half2*>(p.kc + lc + size_t(p.pos) * kKvDim + g * kHd + lane * 4);
        __half2* vd =
            reinterpret_cast<__half2*>(p.vc + lc + size_t(p.pos) * kKvDim + g * kHd + lane * 4);
        kd[0] = __floats2half2_rn(kn.x, kn.y), kd[1] = __floats2half2_rn(kn.z, kn.w);
        vd[0] = __floats2half2_rn(vn.x, vn.y), vd[1] = __floats2half2_rn(vn.z, vn.w);
    }
    const float scale = rsqrtf(float(kHd));
    for (int t = t0 + warp; t < t1; t += W) {
        float4 k = kn;
        if (t < p.pos) {
            const __half2* kp = reinterpret_cast<const __half2*>(p.kc + lc + size_t(t) * kKvDim +
                                                                 g * kHd + lane * 4);
            const float2 a = __half22float2(kp[0]), b = __half22float2(kp[1]);
            k = make_float4(a.x, a.y, b.x, b.y);
        }
        const float s = warp_sum(q.x * k.x + q.y * k.y + q.z * k.z + q.w * k.w) * scale;
        if (lane == 0) sc[t - t0] = s;
    }
    __syncthreads();
    float m = -INFINITY;
    for (int t = threadIdx.x; t < t1 - t0; t += blockDim.x) m = fmaxf(m, sc[t]);
    m = block_reduce(m, red, -INFINITY, WarpMax{});
    __syncthreads();
    float sum = 0.f;
    for (int t = threadIdx.x; t < t1 - t0; t += blockDim.x) {
        const float e = __expf(sc[t] - m);
        sc[t] = e;
        sum += e;
    }
    sum = block_reduce(sum, red + 32, 0.f, WarpSum{});
    // Dims over the threads, positions in `parts` interleaved sets, the parts added in order.
    const int parts = blockDim.x / kHd, d = threadIdx.x % kHd, pt = threadIdx.x / kHd;
    float acc = 0.f;
    if (pt < parts)
        for (int t = t0 + pt; t < t1; t += parts) {
            const float v = t < p.pos ? __half2float(p.vc[lc + size_t(t) * kKvDim + g * kHd + d])
                                      : __ldcg(p.vnew + g * kHd + d);
            acc += sc[t - t0] * v;
        }
    float* pacc = sc + kMaxCtx / kChunks;
    if (pt < parts) pacc[pt * kHd + d] = acc;
    __syncthreads();
    float* out = p.part + blockIdx.x * kPartFloats;
    if (threadIdx.x < kHd) {
        float o = 0.f;
        for (int k = 0; k < parts; ++k) o += pacc[k * kHd + threadIdx.x];
        out[4 + threadIdx.x] = o;
    }
    if (threadIdx.x == 0) out[0] = t1 > t0 ? m : -INFINITY, out[1] = sum;
}

template <GgmlType T>
__global__ void __launch_bounds__(kMaxWarps * 32, 1) layers_persistent(Params p) {
    using Q = Quant<T>;
    using S = Shape<T>;
    constexpr int kLPB = Q::kLanesPerBlock, kBB = Q::kBlockBytes;
    constexpr int kXU = kD / 256 / kUnitBlocks;  // units a lane holds for a 4096-column row
    static_assert(kLPB == 4 && 32 / kLPB == kUnitBlocks, "the 256-element K-quants");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ __align__(128) uint8_t smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, W = blockDim.x >> 5;
    const int part = lane % kLPB, sub = lane / kLPB;
    const int NS = p.stages;
    uint8_t* ring = smem + size_t(warp) * NS * p.slot_bytes;
    uint8_t* rest = smem + size_t(W) * NS * p.slot_bytes;
    uint64_t* bars = reinterpret_cast<uint64_t*>(rest) + warp * kMaxStages;
    float* red = reinterpret_cast<float*>(rest + kMaxWarps * kMaxStages * 8);  // 64 floats
    float2* xd = reinterpret_cast<float2*>(red + 64);                          // kFf / 32
    // The activations' quants and, in the attention, the scores (never both at once).
    int8_t* xq = reinterpret_cast<int8_t*>(xd + kFf / 32);
    float* sc = reinterpret_cast<float*>(xq);

    if (lane == 0) {
        for (int s = 0; s < NS; ++s) mbar_init(bars + s, 1);
        mbar_fence_init();
    }
    __syncwarp();
    const uint64_t policy = l2_evict_first_policy();
    // The stream: lane 0 issues the warp's next stage, across phases and layers, into slot
    // `islot`, counted along (a division by the run-time NS a stage cost the engine's GEMVs
    // 3%).
    Cursor ic;
    int islot = 0;
    auto issue_next = [&]() {
        if (!settle(ic, p.n_layers, W, warp)) return;
        const LayerW& L = p.layers[ic.layer];
        uint8_t* dst = ring + islot * p.slot_bytes;
        uint64_t* bar = bars + islot;
        const int s = ic.s;
        if (ic.ph == kPhDown) {
            const int r = ic.b + s / 2, off = (s & 1) ? S::kPart0Bytes : 0;
            const int bytes = (s & 1) ? S::kRowF - S::kPart0Bytes : S::kPart0Bytes;
            mbar_expect_tx(bar, uint32_t(bytes));
            bulk_copy_g2s(dst, L.down + size_t(r) * S::kRowF + off, bytes, bar, policy);
        } else if (ic.ph == kPhGateUp) {
            const int r = ic.b + s;
            mbar_expect_tx(bar, uint32_t(2 * S::kRowD));
            bulk_copy_g2s(dst, L.gate + size_t(r) * S::kRowD, S::kRowD, bar, policy);
            bulk_copy_g2s(dst + S::kRowD, L.up + size_t(r) * S::kRowD, S::kRowD, bar, policy);
        } else {
            const uint8_t* m = ic.ph == kPhQkv ? L.qkv : L.o;
            const int r0 = ic.b + s * kStageRows, n = min(kStageRows, ic.e - r0);
            mbar_expect_tx(bar, uint32_t(n * S::kRowD));
            for (int i = 0; i < n; ++i)
                bulk_copy_g2s(dst + i * S::kRowD, m + size_t(r0 + i) * S::kRowD, S::kRowD, bar,
                              policy);
        }
        ++ic.s;
        if (++islot == NS) islot = 0;
    };
    if (lane == 0)
        for (int s = 0; s < NS; ++s) issue_next();

    int uslot = 0;  // the next stage's slot and its phase, counted along
    uint32_t uphase = 0;
    unsigned epoch = 0;
    auto barrier = [&]() {
        ++epoch;
        if (p.mode & kBarrier) grid_barrier(p.bar, epoch * gridDim.x);
    };
    // The warp's stages of phase ph: fn(stage, its index, first item, items end) for each.
    auto consume = [&](int ph, auto&& fn) {
        int b, e;
        warp_range(phase_items(ph), W, warp, b, e);
        const int ns = phase_stages(ph, b, e);
        for (int s = 0; s < ns; ++s) {
            mbar_wait(bars + uslot, uphase);
            if (p.mode & kCompute) fn(ring + size_t(uslot) * p.slot_bytes, s, b, e);
            __syncwarp();
            if (++uslot == NS) uslot = 0, uphase ^= 1;
            if (lane == 0) issue_next();
        }
    };
    typename Q::X xr[kXU];
    auto hold_x = [&]() {
#pragma unroll
        for (int u = 0; u < kXU; ++u) {
            const int kb = u * kUnitBlocks + sub;
            Q::template load_x<true>(xq + kb * 256, xd + kb * 8, part, xr[u]);
        }
    };
    // Two 4096-column rows at st (the second only if two2) against the held x.
    auto dot2 = [&](const uint8_t* st, bool two, double(&acc)[2]) {
        acc[0] = acc[1] = 0.0;
#pragma unroll
        for (int u = 0; u < kXU; ++u) {
            const int kb = u * kUnitBlocks + sub;
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
                if (hh == 1 && !two) continue;
                typename Q::Raw r;
                Q::load_raw(st + hh * S::kRowD + kb * kBB, part, r);
                typename Q::W wr;
                Q::decode(r, part, wr);
                acc[hh] += Q::dot(wr, xr[u]);
            }
        }
        acc[0] = warp_sum(acc[0]);
        if (two) acc[1] = warp_sum(acc[1]);
    };
    // Units [U0, U1) of a down row (the part starts at unit U0), x from shared memory.
    auto dot_part = [&]<int U0, int U1>(const uint8_t* st, double acc) {
#pragma unroll
        for (int u = U0; u < U1; ++u) {
            const int kb = u * kUnitBlocks + sub;
            typename Q::Raw r;
            Q::load_raw(st + (kb - U0 * kUnitBlocks) * kBB, part, r);
            typename Q::X x;
            Q::template load_x<true>(xq + kb * 256, xd + kb * 8, part, x);
            typename Q::W wr;
            Q::decode(r, part, wr);
            acc += Q::dot(wr, x);
        }
        return acc;
    };

    double down_acc = 0.0;
    for (int l = 0; l < p.n_layers; ++l) {
        const LayerW& L = p.layers[l];
        if (p.mode & kPrep) prep_norm(p.x, L.attn_norm, xq, xd, red), hold_x();
        consume(kPhQkv, [&](const uint8_t* st, int s, int b, int e) {
            const int r0 = b + s * kStageRows;
            double v[2];
            dot2(st, r0 + 1 < e, v);
            if (lane < 2 && r0 + lane < e) {
                const int r = r0 + lane;
                const float y = float(lane ? v[1] : v[0]);
                (r < kD ? p.q[r] : r < kD + kKvDim ? p.knew[r - kD] : p.vnew[r - kD - kKvDim]) = y;
            }
        });
        barrier();
        if ((p.mode & kAttend) && blockIdx.x < kHeads * kChunks) attention_chunk(p, l, sc, red);
        barrier();
        if (p.mode & kPrep) prep_attention(p.part, xq, xd), hold_x();
        consume(kPhO, [&](const uint8_t* st, int s, int b, int e) {
            const int r0 = b + s * kStageRows;
            double v[2];
            dot2(st, r0 + 1 < e, v);
            if (lane < 2 && r0 + lane < e) p.x[r0 + lane] += float(lane ? v[1] : v[0]);
        });
        barrier();
        if (p.mode & kPrep) prep_norm(p.x, L.ffn_norm, xq, xd, red), hold_x();
        consume(kPhGateUp, [&](const uint8_t* st, int s, int b, int) {
            double v[2];
            dot2(st, true, v);
            if (lane == 0) p.h[b + s] = silu_mul(float(v[0]), float(v[1]));
        });
        barrier();
        if (p.mode & kPrep) prep_plain(p.h, kFf, xq, xd);
        consume(kPhDown, [&](const uint8_t* st, int s, int b, int) {
            if ((s & 1) == 0) {
                down_acc = dot_part.template operator()<0, kDownPart0>(st, 0.0);
            } else {
                const float y = float(
                    warp_sum(dot_part.template operator()<kDownPart0, kDownUnits>(st, down_acc)));
                if (lane == 0) p.x[b + s / 2] += y;
            }
        });
        barrier();
    }
#else
    __trap();  // the copy engine's bulk copies: sm_90+
#endif
}

struct Opts {
    GgmlType type = GgmlType::Q4_K;
    int layers = 32, ctx = 256, warps = 16, stages = 0, iters = 20;  // stages 0: as many as fit
    bool check = false;
};

// Shared memory beside the rings: mbarriers, the reductions' 64 floats, xd, and xq (which the
// attention's scores and partial sums reuse).
size_t extra_smem() {
    static_assert(kFf >= (kMaxCtx / kChunks + kMaxWarps * 32) * 4, "the attention fits xq's place");
    return size_t(kMaxWarps) * kMaxStages * 8 + 64 * 4 + size_t(kFf / 32) * 8 + kFf;
}

// The CPU's layer: RMSNorm in float, Q8_K activations and nt::vec_dot, RoPE and attention in
// float over the half cache.
struct CpuModel {
    GgmlType t;
    std::vector<std::vector<uint8_t>> qkv, o, gate, up, down;
    std::vector<std::vector<float>> an, fn;
    std::vector<std::vector<uint16_t>> kc, vc;  // [kMaxCtx][kKvDim]
};

std::vector<float> cpu_gemv(GgmlType t, const std::vector<uint8_t>& w, int rows, int cols,
                            const std::vector<float>& x) {
    std::vector<uint8_t> act(nt::row_bytes(GgmlType::Q8_K, cols));
    nt::quantize_row(GgmlType::Q8_K, x.data(), act.data(), cols);
    const size_t rb = nt::row_bytes(t, cols);
    std::vector<float> y(rows);
    for (int r = 0; r < rows; ++r) y[r] = nt::vec_dot(t, cols, w.data() + r * rb, act.data());
    return y;
}
std::vector<float> cpu_norm(const std::vector<float>& x, const std::vector<float>& w) {
    double ss = 0;
    for (float v : x) ss += double(v) * v;
    const float s = 1.f / std::sqrt(float(ss / x.size()) + kEps);
    std::vector<float> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * s * w[i];
    return y;
}
void cpu_rope(float* v, int pos) {
    for (int i = 0; i < kHd / 2; ++i) {
        const double th = double(pos) * std::pow(double(kRopeBase), -2.0 * i / kHd);
        const float c = float(std::cos(th)), s = float(std::sin(th));
        const float a = v[2 * i], b = v[2 * i + 1];
        v[2 * i] = a * c - b * s, v[2 * i + 1] = a * s + b * c;
    }
}
void cpu_layer(CpuModel& m, int l, std::vector<float>& x, int pos) {
    const GgmlType t = m.t;
    std::vector<float> qkv = cpu_gemv(t, m.qkv[l], kQkv, kD, cpu_norm(x, m.an[l]));
    for (int hd = 0; hd < kHeads; ++hd) cpu_rope(&qkv[hd * kHd], pos);
    for (int g = 0; g < kKvHeads; ++g) cpu_rope(&qkv[kD + g * kHd], pos);
    std::vector<float> att(kD);
    for (int hd = 0; hd < kHeads; ++hd) {
        const int g = hd / (kHeads / kKvHeads);
        std::vector<double> s(pos + 1);
        double mx = -1e300;
        for (int tp = 0; tp <= pos; ++tp) {
            double d = 0;
            for (int i = 0; i < kHd; ++i) {
                const float k = tp < pos
                                    ? nt::f16_to_f32(m.kc[l][size_t(tp) * kKvDim + g * kHd + i])
                                    : qkv[kD + g * kHd + i];
                d += double(qkv[hd * kHd + i]) * k;
            }
            s[tp] = d / std::sqrt(double(kHd));
            mx = std::max(mx, s[tp]);
        }
        double sum = 0;
        for (auto& v : s) sum += (v = std::exp(v - mx));
        for (int i = 0; i < kHd; ++i) {
            double o = 0;
            for (int tp = 0; tp <= pos; ++tp)
                o += s[tp] * (tp < pos ? nt::f16_to_f32(m.vc[l][size_t(tp) * kKvDim + g * kHd + i])
                                       : qkv[kD + kKvDim + g * kHd + i]);
            att[hd * kHd + i] = float(o / sum);
        }
    }
    std::vector<float> o = cpu_gemv(t, m.o[l], kD, kD, att);
    for (int i = 0; i < kD; ++i) x[i] += o[i];
    const std::vector<float> xn = cpu_norm(x, m.fn[l]);
    const std::vector<float> g = cpu_gemv(t, m.gate[l], kFf, kD, xn),
                             u = cpu_gemv(t, m.up[l], kFf, kD, xn);
    std::vector<float> h(kFf);
    for (int i = 0; i < kFf; ++i) h[i] = g[i] / (1.f + std::exp(-g[i])) * u[i];
    const std::vector<float> dn = cpu_gemv(t, m.down[l], kD, kFf, h);
    for (int i = 0; i < kD; ++i) x[i] += dn[i];
}

template <GgmlType T>
int run(const Opts& o) {
    using S = Shape<T>;
    int dev = 0, sms = 0, optin = 0;
    NT_CUDA_CHECK(cudaGetDevice(&dev), "device");
    NT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "attr");
    NT_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev),
                  "attr");
    cudaDeviceProp prop{};
    NT_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev), "props");
    const int layers = o.check ? 2 : o.layers;
    const int pos = o.ctx - 1;
    const int slot = Shape<T>::kSlot;
    if (o.warps < 4 || o.warps > kMaxWarps || o.stages < 0 || o.stages > kMaxStages || o.ctx < 1 ||
        o.ctx > kMaxCtx)
        nt::fail("--warps 4..%d, --stages 0..%d, --ctx 1..%d.", kMaxWarps, kMaxStages, kMaxCtx);
    const int stages =
        o.stages
            ? o.stages
            : std::min<int>(kMaxStages, (size_t(optin) - extra_smem()) / (size_t(o.warps) * slot));
    const size_t smem = size_t(o.warps) * stages * slot + extra_smem();
    if (stages < 1 || smem > size_t(optin))
        nt::fail(
            "%zu bytes of shared memory a CTA needed, the GPU allows %d: fewer --warps or "
            "--stages.",
            smem, optin);
    if (sms < kHeads * kChunks)
        nt::fail("the attention wants %d CTAs, one a multiprocessor; this GPU has %d.",
                 kHeads * kChunks, sms);
    auto kern = layers_persistent<T>;
    NT_CUDA_CHECK(
        cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
        "smem attribute");
    int per_sm = 0;
    NT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, o.warps * 32, smem),
                  "occupancy");
    if (per_sm < 1) nt::fail("the kernel does not fit a multiprocessor at this size.");

    // Weights: distinct per layer (no L2 reuse across layers), random K-quant blocks.
    const size_t b_qkv = size_t(kQkv) * S::kRowD, b_o = size_t(kD) * S::kRowD,
                 b_ff = size_t(kFf) * S::kRowD, b_down = size_t(kD) * S::kRowF;
    const size_t per_layer = b_qkv + b_o + 2 * b_ff + b_down;
    CpuModel cm{T};
    DeviceBuffer<uint8_t> wbuf(per_layer * layers);
    DeviceBuffer<float> norms(size_t(2) * kD * layers);
    std::vector<LayerW> lw(layers);
    DeviceBuffer<__half> kc(size_t(layers) * kMaxCtx * kKvDim),
        vc(size_t(layers) * kMaxCtx * kKvDim);
    {
        // One random layer uploaded to every layer's place unless checking (fast to build).
        const int distinct = o.check ? layers : 1;
        for (int l = 0; l < layers; ++l) {
            const int s = l % distinct;
            auto qkv = bench::random_weights(T, kQkv, kD, 11 + 7 * s);
            auto wo = bench::random_weights(T, kD, kD, 12 + 7 * s);
            auto wg = bench::random_weights(T, kFf, kD, 13 + 7 * s);
            auto wu = bench::random_weights(T, kFf, kD, 14 + 7 * s);
            auto wd = bench::random_weights(T, kD, kFf, 15 + 7 * s);
            uint8_t* base = wbuf.p + per_layer * l;
            NT_CUDA_CHECK(cudaMemcpy(base, qkv.data(), b_qkv, cudaMemcpyHostToDevice), "up");
            NT_CUDA_CHECK(cudaMemcpy(base + b_qkv, wo.data(), b_o, cudaMemcpyHostToDevice), "up");
            NT_CUDA_CHECK(cudaMemcpy(base + b_qkv + b_o, wg.data(), b_ff, cudaMemcpyHostToDevice),
                          "up");
            NT_CUDA_CHECK(
                cudaMemcpy(base + b_qkv + b_o + b_ff, wu.data(), b_ff, cudaMemcpyHostToDevice),
                "up");
            NT_CUDA_CHECK(cudaMemcpy(base + b_qkv + b_o + 2 * b_ff, wd.data(), b_down,
                                     cudaMemcpyHostToDevice),
                          "up");
            lw[l] = {base,
                     base + b_qkv,
                     base + b_qkv + b_o,
                     base + b_qkv + b_o + b_ff,
                     base + b_qkv + b_o + 2 * b_ff,
                     norms.p + size_t(2) * kD * l,
                     norms.p + size_t(2) * kD * l + kD};
            auto nw = bench::random_activations(2, kD, 21 + l);
            for (auto& v : nw) v = 1.f + 0.1f * v;
            NT_CUDA_CHECK(cudaMemcpy(norms.p + size_t(2) * kD * l, nw.data(), nw.size() * 4,
                                     cudaMemcpyHostToDevice),
                          "up");
            auto kv = bench::random_activations(2, size_t(kMaxCtx) * kKvDim / 1, 31 + l);
            std::vector<uint16_t> kh(size_t(kMaxCtx) * kKvDim), vh(kh.size());
            for (size_t i = 0; i < kh.size(); ++i)
                kh[i] = nt::f32_to_f16(kv[i]), vh[i] = nt::f32_to_f16(kv[kh.size() + i]);
            NT_CUDA_CHECK(cudaMemcpy(kc.p + size_t(l) * kMaxCtx * kKvDim, kh.data(), kh.size() * 2,
                                     cudaMemcpyHostToDevice),
                          "up");
            NT_CUDA_CHECK(cudaMemcpy(vc.p + size_t(l) * kMaxCtx * kKvDim, vh.data(), vh.size() * 2,
                                     cudaMemcpyHostToDevice),
                          "up");
            if (o.check) {
                cm.qkv.push_back(std::move(qkv)), cm.o.push_back(std::move(wo));
                cm.gate.push_back(std::move(wg)), cm.up.push_back(std::move(wu));
                cm.down.push_back(std::move(wd));
                cm.an.emplace_back(nw.begin(), nw.begin() + kD);
                cm.fn.emplace_back(nw.begin() + kD, nw.end());
                cm.kc.push_back(std::move(kh)), cm.vc.push_back(std::move(vh));
            }
        }
    }
    DeviceBuffer<LayerW> dl(layers);
    dl.upload(lw.data(), layers);
    DeviceBuffer<float> x(kD), q(kD), kn(kKvDim), vn(kKvDim), h(kFf),
        part(size_t(kHeads) * kChunks * kPartFloats);
    DeviceBuffer<unsigned> bar(1);
    const std::vector<float> x0 = bench::random_activations(1, kD, 5);

    Params p{dl.p, layers, x.p, q.p,   kn.p,  vn.p,   h.p, part.p,
             kc.p, vc.p,   pos, bar.p, kFull, stages, slot};
    cudaStream_t st;
    NT_CUDA_CHECK(cudaStreamCreate(&st), "stream");
    auto launch = [&](int mode) {
        p.mode = mode;
        NT_CUDA_CHECK(cudaMemsetAsync(bar.p, 0, sizeof(unsigned), st), "memset");
        void* args[] = {&p};
        NT_CUDA_CHECK(cudaLaunchCooperativeKernel(reinterpret_cast<void*>(kern), dim3(sms),
                                                  dim3(o.warps * 32), args, smem, st),
                      "persistent layers");
    };
    std::printf(
        "%s, %d layers of 8B shapes (%.1f MB each), ctx %d, %d SMs x %d warps, %d stages of "
        "%d B (%zu B shared), %s\n",
        nt::traits(T).name, layers, per_layer / 1e6, o.ctx, sms, o.warps, stages, slot, smem,
        prop.name);
    if (o.check) {
        x.upload(x0.data(), kD);
        launch(kFull);
        NT_CUDA_CHECK(cudaStreamSynchronize(st), "check run");
        const std::vector<float> xg = x.download(kD);
        std::vector<float> xc = x0;
        for (int l = 0; l < layers; ++l) cpu_layer(cm, l, xc, pos);
        double worst = 0, rms = 0;
        for (int i = 0; i < kD; ++i) {
            worst = std::max(worst, double(std::fabs(xg[i] - xc[i])));
            rms += double(xc[i]) * xc[i];
        }
        rms = std::sqrt(rms / kD);
        const bool ok = worst <= 1e-2 * rms && std::isfinite(worst);
        std::printf("check: max |x_gpu - x_cpu| = %.3g, %.2e of x's rms %.3g: %s\n", worst,
                    worst / rms, rms, ok ? "PASS" : "FAIL");
        return ok ? 0 : 1;
    }
    // Each mode adds one part to the one before it; the last is the whole layer.
    const std::pair<const char*, int> modes[] = {{"stream", kStream},
                                                 {"+gemv", kCompute},
                                                 {"+prep", kCompute | kPrep},
                                                 {"+attention", kCompute | kPrep | kAttend},
                                                 {"+barriers", kFull}};
    double stream_us = 0;
    for (const auto& [name, m] : modes) {
        x.upload(x0.data(), kD);
        launch(m);
        cudaEvent_t a, b;
        NT_CUDA_CHECK(cudaEventCreate(&a), "event");
        NT_CUDA_CHECK(cudaEventCreate(&b), "event");
        NT_CUDA_CHECK(cudaEventRecord(a, st), "record");
        for (int i = 0; i < o.iters; ++i) launch(m);
        NT_CUDA_CHECK(cudaEventRecord(b, st), "record");
        NT_CUDA_CHECK(cudaEventSynchronize(b), "sync");
        float ms = 0;
        NT_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b), "elapsed");
        const double us = double(ms) * 1e3 / o.iters / layers;
        if (m == kStream) stream_us = us;
        std::printf("%-11s %7.2f us a layer, %7.1f GB/s, %5.1f%% of stream\n", name, us,
                    per_layer / us / 1e3, 100.0 * stream_us / us);
        cudaEventDestroy(a);
        cudaEventDestroy(b);
    }
    cudaStreamDestroy(st);
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    Opts o;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto next = [&]() -> int {
            if (i + 1 >= argc) nt::fail("%s needs a value.", a.c_str());
            return std::atoi(argv[++i]);
        };
        if (a == "--type") {
            if (i + 1 >= argc) nt::fail("--type needs a value.");
            const std::string t = argv[++i];
            if (t == "q4_K")
                o.type = GgmlType::Q4_K;
            else if (t == "q6_K")
                o.type = GgmlType::Q6_K;
            else
                nt::fail("--type is q4_K or q6_K.");
        } else if (a == "--layers")
            o.layers = next();
        else if (a == "--ctx")
            o.ctx = next();
        else if (a == "--warps")
            o.warps = next();
        else if (a == "--stages")
            o.stages = next();
        else if (a == "--iters")
            o.iters = next();
        else if (a == "--check")
            o.check = true;
        else {
            std::fprintf(stderr,
                         "usage: bench_layer_persistent [--type q4_K|q6_K] [--layers N] "
                         "[--ctx N] [--warps N] [--stages N] [--iters N] [--check]\n");
            return 2;
        }
    }
    try {
        return o.type == GgmlType::Q4_K ? run<GgmlType::Q4_K>(o) : run<GgmlType::Q6_K>(o);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_layer_persistent: %s\n", e.what());
        return 1;
    }
}
