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
// no handoff of their own.
//
// A layer, Llama-3 8B shapes, all one weight type (Q4_K or Q6_K), in this order:
//   x -> RMSNorm -> Q8_K -> q/k/v GEMV | RoPE, attention over the KV cache (a CTA a head) |
//   Q8_K -> o GEMV, x += | RMSNorm -> Q8_K -> gate/up GEMV, silu(g) * u | Q8_K -> down, x +=
// with the GEMVs in the engine's arithmetic (Quant<T>: the CPU's vec_dot in double).
//
//   bench_layer_persistent [--type q4_K|q6_K] [--layers 32] [--ctx 256] [--warps 7]
//                          [--stages 3] [--rows 4] [--iters 20] [--check]
//
// Prints, per mode: us a layer, GB/s of weights, and the share of the stream-only mode's rate.
// Modes: `full` (the layer as above), `no-barrier` (the same work without the grid barriers:
// wrong results, shows what the barriers cost) and `stream` (the rings alone: each warp waits
// for its stages and frees them; the ceiling for this access pattern). --check runs two layers
// and compares x with the CPU (nt::vec_dot on nt::quantize_row's Q8_K, float norm, RoPE and
// attention).
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
constexpr int kMaxWarps = 16, kMaxStages = 4, kMaxRows = 8, kMaxCtx = 1024;

enum Mode { kFull = 0, kNoBarrier = 1, kStream = 2 };
// The GEMVs of a layer, in stream order.
enum Phase { kPhQkv = 0, kPhO = 1, kPhGateUp = 2, kPhDown = 3, kPhases = 4 };

struct LayerW {
    const uint8_t *qkv, *o, *gate, *up, *down;
    const float *attn_norm, *ffn_norm;
};

struct Params {
    const LayerW* layers;
    int n_layers;
    float *x, *q, *knew, *vnew, *att, *h;
    __half *kc, *vc;  // [layer][kMaxCtx][kKvDim]
    int pos;          // the step's position; the cache holds 0 .. pos - 1
    unsigned* bar;    // the grid barrier's counter, zero at launch
    int mode, stages, rows;
    int slot_bytes;
};

template <GgmlType T>
struct Shape {
    static constexpr int kBB = Quant<T>::kBlockBytes;
    static constexpr int kRowD = kD / 256 * kBB, kRowF = kFf / 256 * kBB;
};

// The rows (or gate/up pairs) of phase ph that warp `gw` of `warps` takes: a balanced range of
// its CTA's balanced range.
__device__ __forceinline__ void warp_range(int n, int warps_per_cta, int warp, int& b, int& e) {
    const int c0 = int(int64_t(n) * blockIdx.x / gridDim.x);
    const int c1 = int(int64_t(n) * (blockIdx.x + 1) / gridDim.x);
    b = c0 + (c1 - c0) * warp / warps_per_cta;
    e = c0 + (c1 - c0) * (warp + 1) / warps_per_cta;
}
__device__ __forceinline__ int phase_items(int ph) {
    return ph == kPhQkv ? kQkv : ph == kPhGateUp ? kFf : kD;
}
// Items (rows, or pairs for gate/up) a stage holds in phase ph.
__device__ __forceinline__ int stage_items(int ph, int rows) {
    return ph == kPhDown ? 1 : ph == kPhGateUp ? rows / 2 : rows;
}

// Where a warp's stream stands: layer, phase, and the next item of the warp's range.
struct Cursor {
    int layer = 0, ph = 0, item = 0, end = 0;
};
// Moves c to its first non-empty phase at or after (layer, ph); false past the last layer.
__device__ __forceinline__ bool settle(Cursor& c, int n_layers, int W, int warp) {
    while (c.layer < n_layers) {
        if (c.item < c.end) return true;
        if (++c.ph == kPhases) c.ph = 0, ++c.layer;
        if (c.layer >= n_layers) break;
        warp_range(phase_items(c.ph), W, warp, c.item, c.end);
    }
    return false;
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

// n floats of src (n a multiple of 256), times rsqrt(mean square) * w when w is given, as Q8_K
// into xq / xd (one float2 a 32 elements: d, d * sum q), by the whole CTA.
__device__ void prep_activations(const float* src, int n, const float* w, int8_t* xq, float2* xd,
                                 float* red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, W = blockDim.x >> 5;
    float scale = 1.f;
    if (w) {
        float ss = 0.f;
        for (int i = threadIdx.x * 4; i < n; i += blockDim.x * 4) {
            const float4 v = __ldcg(reinterpret_cast<const float4*>(src + i));
            ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
        }
        ss = block_reduce(ss, red, 0.f, WarpSum{});
        scale = rsqrtf(ss / float(n) + kEps);
    }
    for (int b = warp; b < n / 256; b += W) {
        const int e = b * 256 + lane * 8;
        float v[8];
        const float4 a = __ldcg(reinterpret_cast<const float4*>(src + e));
        const float4 c = __ldcg(reinterpret_cast<const float4*>(src + e + 4));
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = c.x, v[5] = c.y, v[6] = c.z,
        v[7] = c.w;
        if (w)
            for (int i = 0; i < 8; ++i) v[i] = v[i] * scale * __ldg(w + e + i);
        int q[8];
        const float2 d = q8k_block(v, lane, q);
        store_q8(xq + e, q);
        if ((lane & 3) == 0) xd[b * 8 + lane / 4] = d;
    }
    __syncthreads();
}

// RoPE (adjacent pairs, GGUF's Llama layout) of the 4 dims lane*4 .. lane*4+3 of one head.
__device__ __forceinline__ float4 rope4(float4 v, int lane, int pos) {
    float r[4] = {v.x, v.y, v.z, v.w};
    for (int k = 0; k < 2; ++k) {
        const int i = lane * 2 + k;  // pair index in the head
        const float th = float(pos) * powf(kRopeBase, -2.f * float(i) / float(kHd));
        float s, c;
        sincosf(th, &s, &c);
        const float a = r[2 * k], b = r[2 * k + 1];
        r[2 * k] = a * c - b * s;
        r[2 * k + 1] = a * s + b * c;
    }
    return make_float4(r[0], r[1], r[2], r[3]);
}

// One head's attention at position pos over the cache and the new k/v (CTA blockIdx.x = head).
__device__ void attention_head(const Params& p, int layer, float* sc, float* red) {
    const int head = blockIdx.x, g = head / (kHeads / kKvHeads);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, W = blockDim.x >> 5;
    const size_t lc = size_t(layer) * kMaxCtx * kKvDim;
    const float4 q =
        rope4(__ldcg(reinterpret_cast<const float4*>(p.q + head * kHd + lane * 4)), lane, p.pos);
    const float4 kn =
        rope4(__ldcg(reinterpret_cast<const float4*>(p.knew + g * kHd + lane * 4)), lane, p.pos);
    if (head % (kHeads / kKvHeads) == 0 && warp == 0) {
        const float4 vn = __ldcg(reinterpret_cast<const float4*>(p.vnew + g * kHd + lane * 4));
        __half* kd = p.kc + lc + size_t(p.pos) * kKvDim + g * kHd + lane * 4;
        __half* vd = p.vc + lc + size_t(p.pos) * kKvDim + g * kHd + lane * 4;
        kd[0] = __float2half(kn.x), kd[1] = __float2half(kn.y), kd[2] = __float2half(kn.z),
        kd[3] = __float2half(kn.w);
        vd[0] = __float2half(vn.x), vd[1] = __float2half(vn.y), vd[2] = __float2half(vn.z),
        vd[3] = __float2half(vn.w);
    }
    const float scale = rsqrtf(float(kHd));
    for (int t = warp; t <= p.pos; t += W) {
        float4 k = kn;
        if (t < p.pos) {
            const __half2* kp = reinterpret_cast<const __half2*>(p.kc + lc + size_t(t) * kKvDim +
                                                                 g * kHd + lane * 4);
            const float2 a = __half22float2(kp[0]), b = __half22float2(kp[1]);
            k = make_float4(a.x, a.y, b.x, b.y);
        }
        const float s = warp_sum(q.x * k.x + q.y * k.y + q.z * k.z + q.w * k.w) * scale;
        if (lane == 0) sc[t] = s;
    }
    __syncthreads();
    float m = -INFINITY;
    for (int t = threadIdx.x; t <= p.pos; t += blockDim.x) m = fmaxf(m, sc[t]);
    m = block_reduce(m, red, -INFINITY, WarpMax{});
    __syncthreads();
    float sum = 0.f;
    for (int t = threadIdx.x; t <= p.pos; t += blockDim.x) {
        const float e = __expf(sc[t] - m);
        sc[t] = e;
        sum += e;
    }
    sum = block_reduce(sum, red + 32, 0.f, WarpSum{});
    // Dims over the threads, positions split in `parts` interleaved sets; parts added in order.
    const int parts = blockDim.x / kHd, d = threadIdx.x % kHd, part = threadIdx.x / kHd;
    float acc = 0.f;
    if (part < parts)
        for (int t = part; t <= p.pos; t += parts) {
            const float v = t < p.pos ? __half2float(p.vc[lc + size_t(t) * kKvDim + g * kHd + d])
                                      : __ldcg(p.vnew + g * kHd + d);
            acc += sc[t] * v;
        }
    __syncthreads();
    float* part_acc = sc;  // the scores are spent
    if (part < parts) part_acc[part * kHd + d] = acc;
    __syncthreads();
    if (threadIdx.x < kHd) {
        float o = 0.f;
        for (int k = 0; k < parts; ++k) o += part_acc[k * kHd + threadIdx.x];
        p.att[head * kHd + threadIdx.x] = o / sum;
    }
}

template <GgmlType T>
__global__ void __launch_bounds__(kMaxWarps * 32, 1) layers_persistent(Params p) {
    using Q = Quant<T>;
    using S = Shape<T>;
    constexpr int kLPB = Q::kLanesPerBlock, kBPU = 32 / kLPB, kBB = Q::kBlockBytes;
    constexpr int kXU = kD / 256 / kBPU;  // units a lane holds for a 4096-column row
    constexpr int kXUF = kFf / 256 / kBPU;
    static_assert(kLPB == 4, "the 256-element K-quants");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ __align__(128) uint8_t smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, W = blockDim.x >> 5;
    const int part = lane % kLPB, sub = lane / kLPB;
    const int NS = p.stages;
    uint8_t* ring = smem + size_t(warp) * NS * p.slot_bytes;
    uint8_t* rest = smem + size_t(W) * NS * p.slot_bytes;
    uint64_t* bars = reinterpret_cast<uint64_t*>(rest) + warp * kMaxStages;
    float* red = reinterpret_cast<float*>(rest + kMaxWarps * kMaxStages * 8);  // 64 floats
    float2* xd = reinterpret_cast<float2*>(red + 64);                           // kFf / 32
    // The activations' quants and, in the attention, the scores (never both at once).
    int8_t* xq = reinterpret_cast<int8_t*>(xd + kFf / 32);
    float* sc = reinterpret_cast<float*>(xq);

    if (lane == 0) {
        for (int s = 0; s < NS; ++s) mbar_init(bars + s, 1);
        mbar_fence_init();
    }
    __syncwarp();
    const uint64_t policy = l2_evict_first_policy();
    // The stream: lane 0 issues stage j (the next of the warp's stages across phases and
    // layers) into slot j % NS.
    Cursor ic;
    warp_range(phase_items(0), W, warp, ic.item, ic.end);
    long long issued = 0;
    auto issue_next = [&]() {
        if (!settle(ic, p.n_layers, W, warp)) return;
        const LayerW& L = p.layers[ic.layer];
        const int n = min(stage_items(ic.ph, p.rows), ic.end - ic.item);
        uint8_t* dst = ring + (issued % NS) * p.slot_bytes;
        uint64_t* bar = bars + issued % NS;
        const int rb = ic.ph == kPhDown ? S::kRowF : S::kRowD;
        const int per = ic.ph == kPhGateUp ? 2 : 1;
        mbar_expect_tx(bar, uint32_t(n * per * rb));
        for (int i = 0; i < n; ++i) {
            const int r = ic.item + i;
            if (ic.ph == kPhGateUp) {
                bulk_copy_g2s(dst + (2 * i) * rb, L.gate + size_t(r) * rb, rb, bar, policy);
                bulk_copy_g2s(dst + (2 * i + 1) * rb, L.up + size_t(r) * rb, rb, bar, policy);
            } else {
                const uint8_t* m = ic.ph == kPhQkv ? L.qkv : ic.ph == kPhO ? L.o : L.down;
                bulk_copy_g2s(dst + i * rb, m + size_t(r) * rb, rb, bar, policy);
            }
        }
        ic.item += n;
        ++issued;
    };
    if (lane == 0)
        for (int s = 0; s < NS; ++s) issue_next();

    long long used = 0;
    unsigned epoch = 0;
    auto barrier = [&]() {
        ++epoch;
        if (p.mode == kFull) grid_barrier(p.bar, epoch * gridDim.x);
    };
    // The warp's stages of phase ph in this layer: fn(slot, first item, items) for each.
    auto consume = [&](int ph, auto&& fn) {
        int b, e;
        warp_range(phase_items(ph), W, warp, b, e);
        const int per_stage = stage_items(ph, p.rows);
        for (int it = b; it < e; it += per_stage) {
            const int n = min(per_stage, e - it);
            const int slot = int(used % NS);
            mbar_wait(bars + slot, uint32_t((used / NS) & 1));
            if (p.mode != kStream) fn(ring + size_t(slot) * p.slot_bytes, it, n);
            __syncwarp();
            ++used;
            if (lane == 0) issue_next();
        }
    };
    // One row of `nb` blocks at `row` against x held in registers (xr) or read from shared memory.
    auto dot_row = [&](const uint8_t* row, const typename Q::X* xr, int units) {
        double acc = 0.0;
        for (int u = 0; u < units; ++u) {
            const int kb = u * kBPU + sub;
            typename Q::Raw r;
            Q::load_raw(row + kb * kBB, part, r);
            typename Q::W wr;
            Q::decode(r, part, wr);
            if (xr) {
                acc += Q::dot(wr, xr[u]);
            } else {
                typename Q::X x;
                Q::template load_x<true>(xq + kb * 256, xd + kb * 8, part, x);
                acc += Q::dot(wr, x);
            }
        }
        return warp_sum(acc);
    };
    typename Q::X xr[kXU];
    auto hold_x = [&]() {
#pragma unroll
        for (int u = 0; u < kXU; ++u) {
            const int kb = u * kBPU + sub;
            Q::template load_x<true>(xq + kb * 256, xd + kb * 8, part, xr[u]);
        }
    };

    for (int l = 0; l < p.n_layers; ++l) {
        const LayerW& L = p.layers[l];
        // q/k/v
        if (p.mode != kStream) prep_activations(p.x, kD, L.attn_norm, xq, xd, red), hold_x();
        consume(kPhQkv, [&](const uint8_t* st, int r0, int n) {
            for (int i = 0; i < n; ++i) {
                const float v = float(dot_row(st + i * S::kRowD, xr, kXU));
                const int r = r0 + i;
                if (lane == 0) (r < kD ? p.q[r] : r < kD + kKvDim ? p.knew[r - kD] : p.vnew[r - kD - kKvDim]) = v;
            }
        });
        barrier();
        if (p.mode != kStream && blockIdx.x < kHeads) attention_head(p, l, sc, red);
        barrier();
        if (p.mode != kStream) prep_activations(p.att, kD, nullptr, xq, xd, red), hold_x();
        consume(kPhO, [&](const uint8_t* st, int r0, int n) {
            for (int i = 0; i < n; ++i) {
                const float v = float(dot_row(st + i * S::kRowD, xr, kXU));
                if (lane == 0) p.x[r0 + i] += v;
            }
        });
        barrier();
        if (p.mode != kStream) prep_activations(p.x, kD, L.ffn_norm, xq, xd, red), hold_x();
        consume(kPhGateUp, [&](const uint8_t* st, int r0, int n) {
            for (int i = 0; i < n; ++i) {
                const float g = float(dot_row(st + (2 * i) * S::kRowD, xr, kXU));
                const float u = float(dot_row(st + (2 * i + 1) * S::kRowD, xr, kXU));
                if (lane == 0) p.h[r0 + i] = silu_mul(g, u);
            }
        });
        barrier();
        if (p.mode != kStream) prep_activations(p.h, kFf, nullptr, xq, xd, red);
        consume(kPhDown, [&](const uint8_t* st, int r0, int n) {
            const float v = float(dot_row(st, nullptr, kXUF));
            if (lane == 0) p.x[r0] += v;
        });
        barrier();
    }
#else
    __trap();  // the copy engine's bulk copies: sm_90+
#endif
}

struct Opts {
    GgmlType type = GgmlType::Q4_K;
    int layers = 32, ctx = 256, warps = 7, stages = 3, rows = 4, iters = 20;
    bool check = false;
};

template <GgmlType T>
int slot_bytes(int rows) {
    return std::max(rows * Shape<T>::kRowD, Shape<T>::kRowF);
}
size_t extra_smem() {
    return size_t(kMaxWarps) * kMaxStages * 8 + 64 * 4 + size_t(kFf / 32) * 8 +
           std::max<size_t>(kFf, size_t(kMaxCtx) * 4);
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
                const float k = tp < pos ? nt::f16_to_f32(m.kc[l][size_t(tp) * kKvDim + g * kHd + i])
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
    const std::vector<float> g = cpu_gemv(t, m.gate[l], kFf, kD, xn), u = cpu_gemv(t, m.up[l], kFf, kD, xn);
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
    const int slot = slot_bytes<T>(o.rows);
    const size_t smem = size_t(o.warps) * o.stages * slot + extra_smem();
    if (o.warps < 4 || o.warps > kMaxWarps || o.stages < 1 || o.stages > kMaxStages ||
        o.rows < 2 || o.rows > kMaxRows || o.rows % 2 || o.ctx < 1 || o.ctx > kMaxCtx)
        nt::fail("--warps 4..%d, --stages 1..%d, --rows even 2..%d, --ctx 1..%d.", kMaxWarps,
                 kMaxStages, kMaxRows, kMaxCtx);
    if (smem > size_t(optin))
        nt::fail("%zu bytes of shared memory a CTA needed, the GPU allows %d: fewer --warps, "
                 "--stages or --rows.", smem, optin);
    auto kern = layers_persistent<T>;
    NT_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
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
    DeviceBuffer<__half> kc(size_t(layers) * kMaxCtx * kKvDim), vc(size_t(layers) * kMaxCtx * kKvDim);
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
            NT_CUDA_CHECK(cudaMemcpy(base + b_qkv + b_o, wg.data(), b_ff, cudaMemcpyHostToDevice), "up");
            NT_CUDA_CHECK(cudaMemcpy(base + b_qkv + b_o + b_ff, wu.data(), b_ff, cudaMemcpyHostToDevice), "up");
            NT_CUDA_CHECK(cudaMemcpy(base + b_qkv + b_o + 2 * b_ff, wd.data(), b_down, cudaMemcpyHostToDevice), "up");
            lw[l] = {base, base + b_qkv, base + b_qkv + b_o, base + b_qkv + b_o + b_ff,
                     base + b_qkv + b_o + 2 * b_ff, norms.p + size_t(2) * kD * l,
                     norms.p + size_t(2) * kD * l + kD};
            auto nw = bench::random_activations(2, kD, 21 + l);
            for (auto& v : nw) v = 1.f + 0.1f * v;
            NT_CUDA_CHECK(cudaMemcpy(norms.p + size_t(2) * kD * l, nw.data(), nw.size() * 4, cudaMemcpyHostToDevice), "up");
            auto kv = bench::random_activations(2, size_t(kMaxCtx) * kKvDim / 1, 31 + l);
            std::vector<uint16_t> kh(size_t(kMaxCtx) * kKvDim), vh(kh.size());
            for (size_t i = 0; i < kh.size(); ++i) kh[i] = nt::f32_to_f16(kv[i]), vh[i] = nt::f32_to_f16(kv[kh.size() + i]);
            NT_CUDA_CHECK(cudaMemcpy(kc.p + size_t(l) * kMaxCtx * kKvDim, kh.data(), kh.size() * 2, cudaMemcpyHostToDevice), "up");
            NT_CUDA_CHECK(cudaMemcpy(vc.p + size_t(l) * kMaxCtx * kKvDim, vh.data(), vh.size() * 2, cudaMemcpyHostToDevice), "up");
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
    DeviceBuffer<float> x(kD), q(kD), kn(kKvDim), vn(kKvDim), att(kD), h(kFf);
    DeviceBuffer<unsigned> bar(1);
    const std::vector<float> x0 = bench::random_activations(1, kD, 5);

    Params p{dl.p, layers, x.p, q.p, kn.p, vn.p, att.p, h.p, kc.p, vc.p, pos, bar.p, kFull,
             o.stages, o.rows, slot};
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
    std::printf("%s, %d layers of 8B shapes (%.1f MB each), ctx %d, %d SMs x %d warps, %d stages of "
                "%d B (%zu B shared), %s\n",
                nt::traits(T).name, layers, per_layer / 1e6, o.ctx, sms, o.warps, o.stages, slot,
                smem, prop.name);
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
    const char* names[] = {"full", "no-barrier", "stream"};
    double us[3];
    for (int m : {kStream, kFull, kNoBarrier}) {
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
        us[m] = double(ms) * 1e3 / o.iters / layers;
        cudaEventDestroy(a);
        cudaEventDestroy(b);
    }
    for (int m : {kFull, kNoBarrier, kStream})
        std::printf("%-11s %7.2f us a layer, %7.1f GB/s, %5.1f%% of stream\n", names[m], us[m],
                    per_layer / us[m] / 1e3, 100.0 * us[kStream] / us[m]);
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
            if (t == "q4_K") o.type = GgmlType::Q4_K;
            else if (t == "q6_K") o.type = GgmlType::Q6_K;
            else nt::fail("--type is q4_K or q6_K.");
        } else if (a == "--layers") o.layers = next();
        else if (a == "--ctx") o.ctx = next();
        else if (a == "--warps") o.warps = next();
        else if (a == "--stages") o.stages = next();
        else if (a == "--rows") o.rows = next();
        else if (a == "--iters") o.iters = next();
        else if (a == "--check") o.check = true;
        else {
            std::fprintf(stderr, "usage: bench_layer_persistent [--type q4_K|q6_K] [--layers N] "
                                 "[--ctx N] [--warps N] [--stages N] [--rows N] [--iters N] [--check]\n");
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
