// Causal attention over the F16 KV cache.
//
// Decode (few rows, each its own sequence): split-K flash decoding. Each block takes one row, one
// KV head (all the query heads of its GQA group, so K and V are read once per group) and one
// slice of the context; K/V tiles of 64 positions stream through shared memory with cp.async,
// double-buffered; an online softmax keeps the partial (max, sum, acc) per head; a second kernel
// merges the slices. The split count depends only on the row count, so the launch shape is fixed
// for a CUDA graph; the slice bounds come from the positions read on the device. In the tiled
// kernel the merge is done by the last slice of a (row, KV head) to finish (a counter per pair,
// left at zero for the next launch), and a context that fits in one slice is written directly:
// no second kernel, and at short contexts no partial results at all. Where the kernel does the
// rope (one decode row), the cache rows before the newest are final before the kernel before it
// ends, so its first two tiles load before the programmatic wait. The tiled kernel runs in its
// wide form, 256 threads: a decode step at short contexts waits on a block's serial work, which
// halves with each thread's share of the heads (the 128-thread form stays for comparison).
//
// Prompt (runs of consecutive positions of one sequence): flash attention on tensor cores.
// A block takes 64 query rows of one head; each of its 4 warps owns 16 rows and keeps Q, the
// scores and the output accumulator in mma.sync m16n8k16 fragments (F16 inputs, F32
// accumulation); K and V tiles of 64 positions come through shared memory (cp.async, the V
// load overlapping Q*K^T and the next K load overlapping P*V).
//
// A generic decode kernel (any even head_dim up to 256, any group size) backs both up.
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <utility>

#include "backend/cuda/arrival.cuh"
#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/cuda_check.cuh"
#include "backend/cuda/device_limits.cuh"
#include "backend/cuda/exp_double.cuh"
#include "backend/cuda/matmul_kernels.cuh"
#include "backend/cuda/ops.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/phase_trace.cuh"
#include "backend/cuda/quantize_q8.cuh"
#include "backend/cuda/rope.cuh"
#include "backend/cuda/warp_reduce.cuh"
#include "core/env.h"
#include "core/error.h"

namespace nt::cuda {

namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr int kThreads = 128;  // 4 warps a block (the tiled decode kernel's wide form: 8)
constexpr int kWideThreads = 256;
constexpr int kMaxSplits = 64;  // context slices per (row, kv head) in decode
constexpr int kMaxGroup = 16;   // query heads per KV head the tiled decode kernel handles
constexpr int kGenericMaxHd = 256;

// ---- PTX wrappers ------------------------------------------------------------------------------

using detail::cp_async16;
using detail::cp_async_commit;
using detail::cp_async_wait;
using detail::warp_max;
using detail::warp_sum;

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const __half* p) {
    const unsigned a = unsigned(__cvta_generic_to_shared(p));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const __half* p) {
    const unsigned a = unsigned(__cvta_generic_to_shared(p));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
// d += a * b for a 16x16 (row-major) by 16x8 (column-major) F16 product, F32 accumulators.
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);  // lo goes to the lower 16 bits (lower index)
    return *reinterpret_cast<const uint32_t*>(&h);
}

// ---- KV store ----------------------------------------------------------------------------------

__global__ void kv_store_kernel(const float* k, const float* v, const int32_t* pos,
                                const int32_t* seq, int kv_dim, int n_ctx, __half* kc, __half* vc) {
    const int i = blockIdx.x;
    const size_t cell = (size_t(seq[i]) * size_t(n_ctx) + size_t(pos[i])) * size_t(kv_dim);
    const float2* k2 = reinterpret_cast<const float2*>(k + size_t(i) * kv_dim);
    const float2* v2 = reinterpret_cast<const float2*>(v + size_t(i) * kv_dim);
    __half2* kd = reinterpret_cast<__half2*>(kc + cell);
    __half2* vd = reinterpret_cast<__half2*>(vc + cell);
    for (int j = threadIdx.x; j < kv_dim / 2; j += blockDim.x) {
        kd[j] = __float22half2_rn(k2[j]);  // round to nearest even, as nt::f32_to_f16
        vd[j] = __float22half2_rn(v2[j]);
    }
}

// ---- decode ------------------------------------------------------------------------------------

struct DecodeArgs {
    const float* q;
    __half* kc;  // written only with the rope (inv_freq)
    __half* vc;
    const int32_t* pos;
    const int32_t* seq;
    const int32_t* rows;
    double* part_acc;  // [n_rows][n_head][splits][head_dim]
    double2* part_ml;  // [n_rows][n_head][splits] (max, sum)
    float* out;
    int* done;  // tiled: [n_rows][n_head_kv] slices finished, zero between launches
    // tiled, optional: out's int8 activations for the next GEMV, as quantize_q8 makes them
    // (qmode = int(detail::ActQuant), -1 for none): xq [row][n_head * head_dim], xd per 32
    int8_t* xq;
    float2* xd;
    int qmode;
    bool sc_fences;  // tiled: arrival_sc_fences(), the merge's fences instead of its acquire-release count
    // tiled, optional (RopeIn): q, k and v as the GEMVs left them; the kernel turns q, and the
    // slice that holds a row's newest position turns k and stores that position's k and v in
    // the caches. inv_freq null: q turned and the cache filled before.
    const float* k_new;
    const float* v_new;
    const float* inv_freq;
    int n_head, head_dim, n_ctx, kv_dim, group, splits;
    float scale;  // 1/sqrt(head_dim)
};

// The decode kernels compute the CPU backend's arithmetic (CpuBackend::attention), so that
// their outputs are its bits but for ties far below float precision: each score a float sum of
// float products in order of the dims, times the scale; per chunk of kAttnChunk positions (a
// tile, TP below) the chunk's max, e = exp(s - max) in double rounded to float, the chunk's
// P*V a float sum over its positions in order and its sum of e in double; chunks, and the
// slices that hold them, meet in double, rescaled to the larger max; each output rounds to float
// once. Every float sum has the CPU's order; every sum in another order is in double.
static_assert(kAttnChunk == 64, "the tiles are the CPU's chunks");

// The decode kernels' exp, out of line: one copy of its code, fetched once a CTA. In place the
// attention's code comes cold from L2 behind the weights' traffic (its softmax took 3.5-4 us
// there, the whole kernel 3.6 us alone: forty-seventh session); inlined, each of its sites a step
// was another 67 instructions to fetch. H100, 8B tg128 against the inlined tree built beside it:
// Q4_K_M +0.2%, Q6_K +0.15% (fifty-second session; as a run-time switch with both forms in the
// binary it had lost 1.4%).
__device__ __noinline__ double exp_once(double x) {
    return detail::exp_lean(x);
}

// The chunk (tile) just scored, merged into a running (max m, sum l) in double: returns the
// factors for the running P*V (c_old) and the chunk's (c_new), as the CPU merges its chunks.
__device__ __forceinline__ void attn_merge_chunk(double& m, double& l, float chunk_max,
                                                 double chunk_sum, double& c_old, double& c_new) {
    // One of the two factors is e^0 = 1 (exp_lean(0) is exactly 1), the other e^-|m - max|:
    // one exp on lane 0's chain instead of two.
    const double cm = double(chunk_max), mn = fmax(m, cm);
    const double e = exp_once(fmin(m, cm) - mn);
    c_old = m < cm ? e : 1.0;
    c_new = cm < m ? e : 1.0;
    l = l * c_old + chunk_sum * c_new;
    m = mn;
}

// Slice `split` of a context of `len` positions: slices of equal length rounded up to `align`.
// Returns how many slices are not empty (the first ones).
__device__ __forceinline__ int split_range(int len, int splits, int split, int align, int& start,
                                           int& end) {
    int chunk = (len + splits - 1) / splits;
    chunk = (chunk + align - 1) / align * align;
    start = split * chunk;
    end = min(len, start + chunk);
    return (len + chunk - 1) / chunk;
}

// Generic: one block per (slice, query head, row), any even head_dim up to kGenericMaxHd.
// Chunk by chunk of kAttnChunk positions: thread t < 64 scores position t (its dims in order),
// warp 0 takes the chunk's max and sum, and thread t takes dims t, t + 128, ... for P*V (its
// positions in order), merged into running double accumulators.
__global__ void __launch_bounds__(kThreads) attn_decode_generic(DecodeArgs a) {
    constexpr int TP = kAttnChunk, HPT = kGenericMaxHd / kThreads;
    __shared__ float qs[kGenericMaxHd];
    __shared__ float ps[TP];
    __shared__ double cf[2];  // this chunk's c_old, c_new
    const int split = blockIdx.x, h = blockIdx.y, z = blockIdx.z;
    const int row = a.rows[z];
    const int hd = a.head_dim, kvh = h / a.group;
    int start, end;
    split_range(a.pos[row] + 1, a.splits, split, TP, start, end);
    const size_t idx = (size_t(z) * a.n_head + h) * a.splits + split;
    if (start >= end) {  // only when splits > 1: this slice lies past the sequence's end
        if (threadIdx.x == 0) a.part_ml[idx] = make_double2(-INFINITY, 0.0);
        return;
    }
    for (int d = threadIdx.x; d < hd; d += kThreads)
        qs[d] = a.q[size_t(row) * a.n_head * hd + size_t(h) * hd + d];
    __syncthreads();

    const int t = threadIdx.x, lane = t % 32;
    const size_t base = size_t(a.seq[row]) * a.n_ctx * a.kv_dim + size_t(kvh) * hd;
    double m = -INFINITY, l = 0.0, acc[HPT];
#pragma unroll
    for (int j = 0; j < HPT; j++) acc[j] = 0.0;
    for (int p0 = start; p0 < end; p0 += TP) {
        const int np = min(TP, end - p0);
        if (t < TP) {
            float sc = -INFINITY;
            if (t < np) {
                const __half* kr = a.kc + base + size_t(p0 + t) * a.kv_dim;
                sc = 0.f;
                for (int d = 0; d < hd; d++) sc = __fadd_rn(sc, __fmul_rn(qs[d], __half2float(kr[d])));
                sc = __fmul_rn(sc, a.scale);
            }
            ps[t] = sc;
        }
        __syncthreads();
        if (t < 32) {
            const float s0 = ps[lane], s1 = ps[lane + 32];
            const float mx = warp_max(fmaxf(s0, s1));  // finite: the chunk has a position
            const float e0 = __double2float_rn(detail::exp_lean(double(s0) - double(mx)));
            const float e1 = __double2float_rn(detail::exp_lean(double(s1) - double(mx)));
            const double sum = warp_sum(double(e0) + double(e1));
            ps[lane] = e0;
            ps[lane + 32] = e1;
            if (lane == 0) attn_merge_chunk(m, l, mx, sum, cf[0], cf[1]);
        }
        __syncthreads();
        const double c_old = cf[0], c_new = cf[1];
#pragma unroll
        for (int j = 0; j < HPT; j++) {
            const int d = t + kThreads * j;
            if (d < hd) {
                float pv = 0.f;
                for (int p = 0; p < np; p++)
                    pv = __fadd_rn(pv, __fmul_rn(ps[p], __half2float(a.vc[base + size_t(p0 + p) * a.kv_dim + d])));
                acc[j] = acc[j] * c_old + double(pv) * c_new;
            }
        }
        __syncthreads();  // ps and cf are rewritten by the next chunk
    }
    // Thread 0 kept the running (m, l); every thread needs l.
    if (t == 0) cf[0] = l, cf[1] = m;
    __syncthreads();
    l = cf[0], m = cf[1];
#pragma unroll
    for (int j = 0; j < HPT; j++) {
        const int d = t + kThreads * j;
        if (d >= hd) continue;
        if (a.splits == 1)
            a.out[size_t(row) * a.n_head * hd + size_t(h) * hd + d] = float(acc[j] / l);
        else
            a.part_acc[idx * hd + d] = acc[j];
    }
    if (a.splits > 1 && t == 0) a.part_ml[idx] = make_double2(m, l);
}

// The tiled decode kernel's shape: HD head size, NT threads (kThreads, or kWideThreads for the
// wide form, which gives each thread half the heads in the score and P*V phases: a block's
// serial work, which a decode step at short contexts waits on, halves).
template <int HD, int NT = kThreads>
struct DecodeTile {
    static constexpr int TP = 64;                  // positions per tile
    static constexpr int ROW = HD + 8;             // padded smem row: conflict-free 16-byte reads
    static constexpr int SETS_S = NT / TP;         // head sets in the score phase
    static constexpr int SETS_PV = NT / (HD / 2);  // head sets in the P*V phase
    static constexpr int MAXJ_S = kMaxGroup / SETS_S;
    static constexpr int MAXJ_PV = kMaxGroup / SETS_PV;
    static_assert(NT % TP == 0 && NT % (HD / 2) == 0 && NT >= HD / 8,
                  "whole head sets in every phase; a thread per 16-byte chunk of a row");
    static size_t smem_bytes(int group) {  // (+ HD: the rope's cos and sin)
        return size_t(2 * 2 * TP * ROW) * sizeof(__half) + size_t(4 * group) * sizeof(double) +
               size_t(group * TP) * sizeof(double) + size_t(group * HD + HD) * sizeof(float);
    }
};
// The wide form runs at most 64 registers a thread: minimum blocks per multiprocessor for
// __launch_bounds__ (0 for the full form: no limit beyond the thread count).
constexpr int decode_min_blocks(int nt) {
    return nt == kThreads ? 0 : 65536 / (nt * 64);
}

// The G heads of a row one tiled block has finished (vals: G * HD floats in shared memory,
// written before a __syncthreads), quantized as detail::quantize_q8 would quantize them in the
// full row: they are whole blocks of it (G * HD a multiple of 256 for Q8_K, checked on the host).
template <int HD, int NT>
__device__ __forceinline__ void quantize_heads(const float* vals, int G, int row, int h0,
                                               const DecodeArgs& a) {
    const int t = threadIdx.x, lane = t % 32;
    const size_t e0 = size_t(row) * a.n_head * HD + size_t(h0) * HD;  // first element in the row
    int8_t* xq = a.xq + e0;
    float2* xd = a.xd + e0 / 32;
    const int n = G * HD;
    if (a.qmode == int(detail::ActQuant::Q8_K)) {
        for (int b = t / 32; b < n / 256; b += NT / 32) {  // a warp per 256 elements
            float v[8];
#pragma unroll
            for (int i = 0; i < 8; i++) v[i] = vals[b * 256 + lane * 8 + i];
            int q[8];
            const float2 dq = detail::q8k_block(v, lane, q);
            detail::store_q8(xq + b * 256 + lane * 8, q);
            if ((lane & 3) == 0) xd[b * 8 + (lane >> 2)] = dq;
        }
        return;
    }
    const bool q81 = a.qmode == int(detail::ActQuant::Q8_1);
    for (int b0 = 0; b0 < n / 32; b0 += NT / 8) {  // 8 threads per 32 elements
        const int b = b0 + t / 8, sub = t % 8;
        const bool live = b < n / 32;  // dead lanes still take part in the shuffles
        float v[4] = {0.f, 0.f, 0.f, 0.f};
        if (live)
#pragma unroll
            for (int i = 0; i < 4; i++) v[i] = vals[b * 32 + sub * 4 + i];
        int q[4];
        const float2 dq = q81 ? detail::q8_block<4, true>(v, q) : detail::q8_block<4, false>(v, q);
        if (live) {
            detail::store_q8(xq + b * 32 + sub * 4, q);
            if (sub == 0) xd[b] = dq;
        }
    }
}

// Tiled: one block per (KV head, slice, row) and all `group` query heads of that KV head.
// Scores: thread t takes position t % TP for heads t / TP, t / TP + SETS_S, ... (q broadcast
// from shared memory, K rows read conflict-free thanks to the padding). Softmax: warp w takes
// heads w, w + NT / 32, ..., each lane TP / 32 positions. P*V: thread t takes dims
// 2(t % (HD/2)) and +1 for heads t / (HD/2), ... .
// GT: the group size when known at compile time (0: a.group, up to kMaxGroup). The per-thread
// head loops then have exactly the heads there are; sized for kMaxGroup, their idle
// iterations were issued predicated off (a decode step at 8 positions issued about 2400
// instructions per warp for some 600 useful ones).
template <int HD, int GT, int NT = kThreads>
__global__ void __launch_bounds__(NT, decode_min_blocks(NT)) attn_decode_tiled(DecodeArgs a) {
    using C = DecodeTile<HD, NT>;
    constexpr int TP = C::TP, ROW = C::ROW, PL = TP / 32;
    constexpr int MAXJ_S = GT > 0 ? (GT + C::SETS_S - 1) / C::SETS_S : C::MAXJ_S;
    constexpr int MAXJ_PV = GT > 0 ? (GT + C::SETS_PV - 1) / C::SETS_PV : C::MAXJ_PV;
    extern __shared__ __align__(16) unsigned char smem[];
    __half* kbuf = reinterpret_cast<__half*>(smem);  // [2][TP][ROW]
    __half* vbuf = kbuf + 2 * TP * ROW;              // [2][TP][ROW]
    const int G = GT > 0 ? GT : a.group;
    double* ms = reinterpret_cast<double*>(vbuf + 2 * TP * ROW);  // [G] running max
    double* ls = ms + G;                                           // [G] running sum
    double* co = ls + G;  // [G] this tile's factor for the running P*V
    double* cn = co + G;  // [G] and for the tile's own
    // [G][TP] scores, then weights (floats); in the merge, the slices' weights (doubles)
    float* ps = reinterpret_cast<float*>(cn + G);
    double* wts = cn + G;
    float* qs = ps + 2 * G * TP;  // [G][HD]
    float* rc = qs + G * HD;      // [HD / 2] rope cos, then sin

    NT_PHASE_TIME(t_entry);
    NT_PHASE_SLOTS(marks);
    pdl_trigger();
    const int kvh = blockIdx.x, split = blockIdx.y, z = blockIdx.z;
    const int t = threadIdx.x;
    const int row = a.rows[z];  // the step's rows and positions: uploaded before its first kernel
    const int h0 = kvh * G;
    int start, end;
    const int live = split_range(a.pos[row] + 1, a.splits, split, TP, start, end);
    if (start >= end) return;  // past the sequence's end: not counted, not merged
    if (t == 0) NT_PHASE_RESERVE(marks, phase::kAttention, a.kc, phase::kMarks);
    const size_t base = size_t(a.seq[row]) * a.n_ctx * a.kv_dim + size_t(kvh) * HD;
    const bool rope = a.inv_freq != nullptr;
    const int newest = a.pos[row];
    const __half* kg = a.kc + base;
    const __half* vg = a.vc + base;
    const int n_tiles = (end - start + TP - 1) / TP;
    constexpr int CH = HD / 8;  // 16-byte chunks of a K or V row: thread cc < CH takes chunk cc

    // With the rope: the newest position's k and v as the GEMVs left them (chunk cc: 8 of the
    // head's dims), then turned and rounded to F16 as rope_kv_store rounds them, into the
    // caches and straight into the tile that holds them.
    struct Newest {
        float2 k[4], v[4];
    };
    auto load_newest = [&](int cc) {
        const size_t e = size_t(row) * a.kv_dim + size_t(kvh) * HD + cc * 8;
        Newest n;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            n.k[i] = *reinterpret_cast<const float2*>(a.k_new + e + 2 * i);
            n.v[i] = *reinterpret_cast<const float2*>(a.v_new + e + 2 * i);
        }
        return n;
    };
    auto put_newest = [&](int tile, int cc, const Newest& n) {
        const int r = newest - (start + tile * TP), buf = tile & 1;
        uint4 kh, vh;
        __half2* k2 = reinterpret_cast<__half2*>(&kh);
        __half2* v2 = reinterpret_cast<__half2*>(&vh);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int j = cc * 4 + i;
            k2[i] = __float22half2_rn(detail::rope_turn(n.k[i].x, n.k[i].y, rc[j], rc[HD / 2 + j]));
            v2[i] = __float22half2_rn(n.v[i]);
        }
        *reinterpret_cast<uint4*>(kbuf + (buf * TP + r) * ROW + cc * 8) = kh;
        *reinterpret_cast<uint4*>(vbuf + (buf * TP + r) * ROW + cc * 8) = vh;
        const size_t off = size_t(newest) * a.kv_dim + cc * 8;
        *reinterpret_cast<uint4*>(a.kc + base + off) = kh;
        *reinterpret_cast<uint4*>(a.vc + base + off) = vh;
    };
    auto holds_newest = [&](int tile) {
        const int p0 = start + tile * TP;
        return rope && newest >= p0 && newest < min(end, p0 + TP);
    };
    // Rows of a tile past `end` are neither loaded nor read: the scores skip them and P*V stops
    // at the tile's last position (short contexts do a fraction of a tile's work). With the rope
    // the newest row is not loaded: put_newest writes it (after the wait: it needs k and v).
    auto load_tile = [&](int tile) {
        const int p0 = start + tile * TP, buf = tile & 1;
        const int nrows = min(TP, end - p0);
#pragma unroll 1  // a few passes: unrolled, its copies only lengthen the code fetched in place
        for (int c = t; c < nrows * CH; c += NT) {
            const int r = c / CH, cc = c % CH;
            if (rope && p0 + r == newest) continue;
            const size_t off = size_t(p0 + r) * a.kv_dim + cc * 8;
            cp_async16(kbuf + (buf * TP + r) * ROW + cc * 8, kg + off);
            cp_async16(vbuf + (buf * TP + r) * ROW + cc * 8, vg + off);
        }
        cp_async_commit();
    };
    // With the rope fused, this kernel is the only one of the step that writes this layer's
    // cache, and only at the newest position: every other row is final before the kernel before
    // has finished, so the first two tiles load before the wait, off the critical path.
    int issued = 0;
    if (rope)
        for (; issued < min(2, n_tiles); issued++) load_tile(issued);
    // The rope's angles need only the step's positions: computed before the wait, as the rope
    // kernel does.
    if (rope) {
        for (int j = t; j < HD / 2; j += NT)
            detail::rope_angle(newest, a.inv_freq[j], rc[j], rc[HD / 2 + j]);
        __syncthreads();
    }
    // q and the cache come from the kernels before (this may be a programmatic dependent launch)
    pdl_wait(a.q, a.kc, a.vc, a.out, a.part_acc, a.part_ml, a.done, a.xq, a.xd, a.k_new, a.v_new);
    if (t == 0) {
        NT_PHASE_MARK_AT(marks, phase::kEntry, t_entry);
        NT_PHASE_MARK(marks, phase::kWaited);
    }
    if (issued == 0) load_tile(issued++);
    // The newest k and v and q are each a trip to L2 (or further): all are requested before any
    // is used.
    int first_newest = -1;  // the loaded tile that holds the newest position, if any
    for (int i = 0; i < issued; i++)
        if (holds_newest(i)) first_newest = i;
    const bool put_first = first_newest >= 0 && t < CH;
    Newest nkv;
    if (put_first) nkv = load_newest(t);

    // q, turned first where the kernel does the rope (pair (2j, 2j + 1) of a head).
    const float2* qrow =
        reinterpret_cast<const float2*>(a.q + size_t(row) * a.n_head * HD + size_t(h0) * HD);
    for (int i = t; i < G * HD / 2; i += NT) {
        float2 v = qrow[i];
        if (rope) {
            const int j = i % (HD / 2);
            v = detail::rope_turn(v.x, v.y, rc[j], rc[HD / 2 + j]);
        }
        reinterpret_cast<float2*>(qs)[i] = v;
    }
    if (put_first) put_newest(first_newest, t, nkv);
    if (t < G) {
        ms[t] = -INFINITY;
        ls[t] = 0.0;
    }

    const int sp = t % TP, sg = t / TP;              // score phase
    const int d2 = t % (HD / 2), pg = t / (HD / 2);  // P*V phase
    const int warp = t / 32, lane = t % 32;          // softmax phase
    double2 acc[MAXJ_PV];
#pragma unroll
    for (int j = 0; j < MAXJ_PV; j++) acc[j] = make_double2(0.0, 0.0);

    for (int tile = 0; tile < n_tiles; tile++) {
        const int buf = tile & 1;
        if (tile + 1 < n_tiles) {
            if (issued == tile + 1) {
                load_tile(issued++);
                if (holds_newest(tile + 1) && t < CH) put_newest(tile + 1, t, load_newest(t));
            }
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        if (tile == 0 && t == 0) NT_PHASE_MARK(marks, phase::kFirstData);

        const int np = min(TP, end - (start + tile * TP));  // positions of this tile
        // scores
        if (sp < np) {
            const __half* kr = kbuf + (buf * TP + sp) * ROW;
            // The CPU's order: one product after another, each rounded, dims in order.
            float sc[MAXJ_S];
#pragma unroll
            for (int j = 0; j < MAXJ_S; j++) sc[j] = 0.f;
#pragma unroll 2
            for (int c = 0; c < HD; c += 8) {
                const uint4 raw = *reinterpret_cast<const uint4*>(kr + c);
                float k[8];
                *reinterpret_cast<float2*>(k) = __half22float2(*reinterpret_cast<const __half2*>(&raw.x));
                *reinterpret_cast<float2*>(k + 2) = __half22float2(*reinterpret_cast<const __half2*>(&raw.y));
                *reinterpret_cast<float2*>(k + 4) = __half22float2(*reinterpret_cast<const __half2*>(&raw.z));
                *reinterpret_cast<float2*>(k + 6) = __half22float2(*reinterpret_cast<const __half2*>(&raw.w));
#pragma unroll
                for (int j = 0; j < MAXJ_S; j++) {
                    const int g = sg + C::SETS_S * j;
                    if (g < G) {
                        float q[8];
                        *reinterpret_cast<float4*>(q) = *reinterpret_cast<const float4*>(qs + g * HD + c);
                        *reinterpret_cast<float4*>(q + 4) = *reinterpret_cast<const float4*>(qs + g * HD + c + 4);
#pragma unroll
                        for (int e = 0; e < 8; e++) sc[j] = __fadd_rn(sc[j], __fmul_rn(q[e], k[e]));
                    }
                }
            }
#pragma unroll
            for (int j = 0; j < MAXJ_S; j++) {
                const int g = sg + C::SETS_S * j;
                if (g < G) ps[g * TP + sp] = __fmul_rn(sc[j], a.scale);
            }
        } else {
#pragma unroll
            for (int j = 0; j < MAXJ_S; j++) {
                const int g = sg + C::SETS_S * j;
                if (g < G) ps[g * TP + sp] = -INFINITY;
            }
        }
        __syncthreads();
        if (tile == 0 && t == 0) NT_PHASE_MARK(marks, phase::kStep1);

        // the tile's softmax per head (lane takes positions lane, lane + 32, ...), merged into
        // the running (max, sum) in double
        for (int g = warp; g < G; g += NT / 32) {
            float s[PL], mx = -INFINITY;
#pragma unroll
            for (int i = 0; i < PL; i++) {
                s[i] = ps[g * TP + lane + 32 * i];
                mx = fmaxf(mx, s[i]);
            }
            mx = warp_max(mx);  // finite: the tile has a position
            double e = 0.0;
#pragma unroll
            for (int i = 0; i < PL; i++) {
                // 0 past the tile's end
                s[i] = __double2float_rn(exp_once(double(s[i]) - double(mx)));
                e += double(s[i]);
            }
            const double sum = warp_sum(e);
#pragma unroll
            for (int i = 0; i < PL; i++) ps[g * TP + lane + 32 * i] = s[i];
            if (lane == 0) attn_merge_chunk(ms[g], ls[g], mx, sum, co[g], cn[g]);
        }
        __syncthreads();
        if (tile == 0 && t == 0) NT_PHASE_MARK(marks, phase::kStep2);

        // the tile's P * V in float, positions in order; then acc = acc * c_old + PV * c_new
        {
            const __half* vr = vbuf + buf * TP * ROW + 2 * d2;
            float2 pv[MAXJ_PV];
#pragma unroll
            for (int j = 0; j < MAXJ_PV; j++) pv[j] = make_float2(0.f, 0.f);
#pragma unroll 8
            for (int p = 0; p < np; p++) {
                const float2 vf = __half22float2(*reinterpret_cast<const __half2*>(vr + p * ROW));
#pragma unroll
                for (int j = 0; j < MAXJ_PV; j++) {
                    const int g = pg + C::SETS_PV * j;
                    if (g < G) {
                        const float w = ps[g * TP + p];
                        pv[j].x = __fadd_rn(pv[j].x, __fmul_rn(w, vf.x));
                        pv[j].y = __fadd_rn(pv[j].y, __fmul_rn(w, vf.y));
                    }
                }
            }
#pragma unroll
            for (int j = 0; j < MAXJ_PV; j++) {
                const int g = pg + C::SETS_PV * j;
                if (g < G) {
                    const double c_old = co[g], c_new = cn[g];
                    acc[j].x = acc[j].x * c_old + double(pv[j].x) * c_new;
                    acc[j].y = acc[j].y * c_old + double(pv[j].y) * c_new;
                }
            }
        }
        __syncthreads();  // the next iteration's load overwrites the buffer just read
        if (tile == 0 && t == 0) NT_PHASE_MARK(marks, phase::kStep3);
    }

#pragma unroll
    for (int j = 0; j < MAXJ_PV; j++) {
        const int g = pg + C::SETS_PV * j;
        if (g >= G) continue;
        const int h = h0 + g;
        if (live == 1) {  // the whole context in this slice: its softmax is complete
            const double l = ls[g];
            const float2 o = make_float2(float(acc[j].x / l), float(acc[j].y / l));
            *reinterpret_cast<float2*>(a.out + size_t(row) * a.n_head * HD + size_t(h) * HD +
                                       2 * d2) = o;
            if (a.qmode >= 0) *reinterpret_cast<float2*>(qs + g * HD + 2 * d2) = o;
        } else {
            const size_t idx = (size_t(z) * a.n_head + h) * a.splits + split;
            *reinterpret_cast<double2*>(a.part_acc + idx * HD + 2 * d2) = acc[j];
            if (d2 == 0) a.part_ml[idx] = make_double2(ms[g], ls[g]);
        }
    }
    if (live == 1) {
        if (t == 0) NT_PHASE_MARK(marks, phase::kStep4);
    } else {
        // The last of the `live` slices to finish merges them all: out = sum_s acc_s 2^(m_s - M) /
        // sum_s l_s 2^(m_s - M) per head, slices in order (what a separate merge kernel computed).
        // The slices count themselves as arrival.cuh describes.
        __shared__ int last;
        if (a.sc_fences) __threadfence();
        __syncthreads();  // this slice's partials are written before thread 0 counts them
        if (t == 0) {
            int* done = a.done + size_t(z) * (a.n_head / G) + kvh;
            last = (a.sc_fences ? atomicAdd(done, 1) : arrive_acq_rel(done, 1)) == live - 1;
            if (last) *done = 0;  // every other slice has counted: ready for the next launch
        }
        __syncthreads();  // and thread 0's acquire is before any thread reads the others' partials
        if (!last) {
            if (t == 0) NT_PHASE_MARK(marks, phase::kDone);
            return;
        }
        if (a.sc_fences) __threadfence();
        static_assert(kMaxSplits <= 2 * 32 && kMaxSplits <= TP,
                      "a lane reads two slices' (m, l); the weights take the scores' [G][TP] room");
        // Every read here comes from L2 and waits on the one before it unless issued together:
        // each (m, l) is read once, and the partials are read eight slices at a time. In double,
        // as the CPU merges its chunks.
        for (int g = warp; g < G; g += NT / 32) {
            const double2* ml = a.part_ml + (size_t(z) * a.n_head + h0 + g) * a.splits;
            const double2 none = make_double2(-INFINITY, 0.0);
            const double2 ml0 = lane < live ? __ldcg(ml + lane) : none;
            const double2 ml1 = lane + 32 < live ? __ldcg(ml + lane + 32) : none;
            // M is finite: every live slice has positions. A lane's second slice only past 32
            // (its weight would be 0): the loop is one copy of the call, not unrolled.
            const double M = warp_max(fmax(ml0.x, ml1.x));
            double L = 0.0;
#pragma unroll 1
            for (int i = 0; i < (live > 32 ? 2 : 1); i++) {
                const double2 mli = i ? ml1 : ml0;
                const double w = exp_once(mli.x - M);
                L += mli.y * w;
                if (lane + 32 * i < live) wts[g * TP + lane + 32 * i] = w;
            }
            L = warp_sum(L);
            if (lane == 0) ls[g] = L;
        }
        __syncthreads();
        constexpr int kBatch = 4;  // slices in flight (each a double2: 64 registers a thread)
        for (int u = t; u < G * HD / 2; u += NT) {  // 2 consecutive dims of one head
            const int g = u / (HD / 2), d = (u % (HD / 2)) * 2;
            const double2* pa = reinterpret_cast<const double2*>(
                a.part_acc + (size_t(z) * a.n_head + h0 + g) * a.splits * HD + d);
            const double* w = wts + g * TP;
            double2 o = make_double2(0.0, 0.0);
            for (int s0 = 0; s0 < live; s0 += kBatch) {
                double2 v[kBatch];
#pragma unroll
                for (int i = 0; i < kBatch; i++)
                    if (s0 + i < live) v[i] = __ldcg(pa + size_t(s0 + i) * (HD / 2));
#pragma unroll
                for (int i = 0; i < kBatch; i++)
                    if (s0 + i < live) {
                        const double ws = w[s0 + i];
                        o.x += v[i].x * ws;
                        o.y += v[i].y * ws;
                    }
            }
            const double L = ls[g];
            const float2 of = make_float2(float(o.x / L), float(o.y / L));
            *reinterpret_cast<float2*>(a.out + size_t(row) * a.n_head * HD + size_t(h0 + g) * HD +
                                       d) = of;
            if (a.qmode >= 0) *reinterpret_cast<float2*>(qs + g * HD + d) = of;
        }
    }
    // One quantization for both ends, so that its code is one copy (in place it is fetched
    // from L2 behind the weights' traffic).
    if (a.qmode >= 0) {
        __syncthreads();
        quantize_heads<HD, NT>(qs, G, row, h0, a);
    }
    if (t == 0) NT_PHASE_MARK(marks, phase::kDone);
}

// Merges the slices of one (row, head), in double as the tiled kernel's last slice does:
// out = sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M).
__global__ void __launch_bounds__(kThreads)
    attn_merge_kernel(const double* part_acc, const double2* part_ml, const int32_t* rows,
                      int n_head, int hd, int splits, float* out) {
    __shared__ double w[kMaxSplits];
    __shared__ double total;
    const int z = blockIdx.x, h = blockIdx.y;
    const size_t idx0 = (size_t(z) * n_head + h) * splits;
    if (threadIdx.x < 32) {
        double M = -INFINITY;
        for (int s = threadIdx.x; s < splits; s += 32) M = fmax(M, part_ml[idx0 + s].x);
        M = warp_max(M);  // finite: slice 0 always holds position 0
        double L = 0.0;
        for (int s = threadIdx.x; s < splits; s += 32) {
            const double2 ml = part_ml[idx0 + s];
            w[s] = detail::exp_lean(ml.x - M);  // 0 for empty slices (m = -inf, l = 0)
            L += ml.y * w[s];
        }
        L = warp_sum(L);
        if (threadIdx.x == 0) total = L;
    }
    __syncthreads();
    float* o = out + size_t(rows[z]) * n_head * hd + size_t(h) * hd;
    for (int d = threadIdx.x; d < hd; d += kThreads) {
        double acc = 0.0;
        for (int s = 0; s < splits; s++)
            if (w[s] != 0.0) acc += part_acc[(idx0 + s) * hd + d] * w[s];
        o[d] = float(acc / total);
    }
}

// ---- prefill -----------------------------------------------------------------------------------

struct PrefillArgs {
    const float* q;
    const __half* kc;
    const __half* vc;
    const AttnTile* tiles;
    float* out;
    int n_head, n_head_kv, n_ctx, kv_dim, group, n_tiles;
    float scale_log2;
    int parts;    // the exact kernel: blocks a tile (kXP / group rows each)
    float scale;  // the exact kernel: 1/sqrt(head_dim), the CPU's
};

template <int HD>
struct PrefillTile {
    static constexpr int BR = kPrefillTileRows;  // query rows per block (16 per warp)
    static constexpr int BC = 64;                // keys per tile
    static constexpr int ROW = HD + 8;           // padded smem row: conflict-free ldmatrix
    static constexpr size_t smem_bytes() { return size_t(BR + 2 * BC) * ROW * sizeof(__half); }
};

// Fragment layouts (PTX ISA, mma.m16n8k16): lane = 4 * g + t4. A (16x16): a0 = (g, 2t4..+1),
// a1 = (g+8, 2t4..), a2 = (g, 2t4+8..), a3 = (g+8, 2t4+8..). B (16x8): b0 = (k 2t4..+1, n g),
// b1 = (k 2t4+8.., n g). C (16x8): c0,c1 = (g, 2t4..+1), c2,c3 = (g+8, 2t4..+1).
template <int HD>
__global__ void __launch_bounds__(kThreads) attn_prefill_kernel(PrefillArgs a) {
    using C = PrefillTile<HD>;
    constexpr int BR = C::BR, BC = C::BC, ROW = C::ROW;
    constexpr int KD = HD / 16;  // k-steps of Q*K^T over the head dimension
    constexpr int ND = HD / 8;   // n-tiles of the output
    constexpr int NT = BC / 8;   // n-tiles of the scores
    extern __shared__ __align__(16) unsigned char smem[];
    __half* qsm = reinterpret_cast<__half*>(smem);  // [BR][ROW]
    __half* ksm = qsm + BR * ROW;                   // [BC][ROW]
    __half* vsm = ksm + BC * ROW;                   // [BC][ROW]

    // The longest tiles (latest positions) first, so the tail of the grid is short work.
    const AttnTile tile = a.tiles[a.n_tiles - 1 - blockIdx.y];
    const int h = blockIdx.x, kvh = h / a.group;
    const int t = threadIdx.x, warp = t / 32, lane = t % 32;
    const int g = lane >> 2, t4 = lane & 3;
    const int q_dim = a.n_head * HD;
    const int kv_len = tile.pos0 + tile.n_rows;
    const size_t base = size_t(tile.seq) * a.n_ctx * a.kv_dim + size_t(kvh) * HD;
    const __half* kg = a.kc + base;
    const __half* vg = a.vc + base;

    // Keys past kv_len are zero-filled (finite), and only padded query rows can weight them.
    auto load = [&](__half* dst, const __half* src, int k0) {
        constexpr int CH = HD / 8;
        for (int c = t; c < BC * CH; c += kThreads) {
            const int r = c / CH, cc = c % CH;
            const bool valid = k0 + r < kv_len;
            cp_async16(dst + r * ROW + cc * 8, src + size_t(valid ? k0 + r : 0) * a.kv_dim + cc * 8,
                       valid ? 16 : 0);
        }
        cp_async_commit();
    };
    load(ksm, kg, 0);

    // Q tile to F16, pre-scaled by log2(e)/sqrt(HD); padded rows are zero.
    {
        constexpr int C4 = HD / 4;
        const float s = a.scale_log2;
        for (int c = t; c < BR * C4; c += kThreads) {
            const int r = c / C4, col = (c % C4) * 4;
            float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
            if (r < tile.n_rows)
                v = *reinterpret_cast<const float4*>(a.q + size_t(tile.row0 + r) * q_dim +
                                                     size_t(h) * HD + col);
            __half2* dst = reinterpret_cast<__half2*>(qsm + r * ROW + col);
            dst[0] = __floats2half2_rn(v.x * s, v.y * s);
            dst[1] = __floats2half2_rn(v.z * s, v.w * s);
        }
    }
    __syncthreads();
    uint32_t qf[KD][4];
#pragma unroll
    for (int kd = 0; kd < KD; kd++)
        ldmatrix_x4(qf[kd], qsm + (warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * ROW + kd * 16 +
                                (lane >> 4) * 8);

    float o[ND][4];
#pragma unroll
    for (int nd = 0; nd < ND; nd++) o[nd][0] = o[nd][1] = o[nd][2] = o[nd][3] = 0.f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;  // rows g and g + 8 of the warp
    const int warp_first = tile.pos0 + warp * 16;              // position of the warp's first row
    const int qp0 = warp_first + g, qp1 = qp0 + 8;
    const int n_kt = (kv_len + BC - 1) / BC;

    for (int kt = 0; kt < n_kt; kt++) {
        const int k0 = kt * BC;
        cp_async_wait<0>();
        __syncthreads();  // K tile kt landed; every warp is done with the previous V tile
        load(vsm, vg, k0);
        // A warp whose rows all precede this tile has nothing to add (tile 0 is never skipped,
        // so m0/m1 are finite from then on).
        const bool active = k0 <= warp_first + 15;
        uint32_t pf[BC / 16][4];
        if (active) {
            float s[NT][4];
#pragma unroll
            for (int nt = 0; nt < NT; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
            for (int kd = 0; kd < KD; kd++) {
#pragma unroll
                for (int np = 0; np < NT / 2; np++) {
                    uint32_t b[4];
                    ldmatrix_x4(b, ksm + (np * 16 + (lane >> 4) * 8 + (lane & 7)) * ROW + kd * 16 +
                                       ((lane >> 3) & 1) * 8);
                    mma_16816(s[2 * np], qf[kd], b[0], b[1]);
                    mma_16816(s[2 * np + 1], qf[kd], b[2], b[3]);
                }
            }
            if (k0 + BC - 1 > warp_first) {  // the causal diagonal crosses this tile
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    const int key = k0 + nt * 8 + 2 * t4;
                    if (key > qp0) s[nt][0] = -INFINITY;
                    if (key + 1 > qp0) s[nt][1] = -INFINITY;
                    if (key > qp1) s[nt][2] = -INFINITY;
                    if (key + 1 > qp1) s[nt][3] = -INFINITY;
                }
            }
            float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                mx0 = fmaxf(mx0, fmaxf(s[nt][0], s[nt][1]));
                mx1 = fmaxf(mx1, fmaxf(s[nt][2], s[nt][3]));
            }
            // The 4 lanes of a quad share a row.
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
            const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
            const float c0 = exp2f(m0 - mn0), c1 = exp2f(m1 - mn1);
            m0 = mn0;
            m1 = mn1;
            l0 *= c0;
            l1 *= c1;
#pragma unroll
            for (int nd = 0; nd < ND; nd++) {
                o[nd][0] *= c0;
                o[nd][1] *= c0;
                o[nd][2] *= c1;
                o[nd][3] *= c1;
            }
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                s[nt][0] = exp2f(s[nt][0] - m0);
                s[nt][1] = exp2f(s[nt][1] - m0);
                s[nt][2] = exp2f(s[nt][2] - m1);
                s[nt][3] = exp2f(s[nt][3] - m1);
                l0 +=
                    s[nt][0] + s[nt][1];  // per-lane partial sums; the quad adds them up at the end
                l1 += s[nt][2] + s[nt][3];
            }
            // The score accumulators of n-tiles 2kk and 2kk+1 are exactly the A fragment of P
            // for k-step kk.
#pragma unroll
            for (int kk = 0; kk < BC / 16; kk++) {
                pf[kk][0] = pack_half2(s[2 * kk][0], s[2 * kk][1]);
                pf[kk][1] = pack_half2(s[2 * kk][2], s[2 * kk][3]);
                pf[kk][2] = pack_half2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
                pf[kk][3] = pack_half2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
            }
        }
        cp_async_wait<0>();
        __syncthreads();  // V tile kt landed; every warp is done with K tile kt
        if (kt + 1 < n_kt) load(ksm, kg, k0 + BC);
        if (active) {
#pragma unroll
            for (int kk = 0; kk < BC / 16; kk++) {
#pragma unroll
                for (int dp = 0; dp < ND / 2; dp++) {
                    uint32_t b[4];
                    ldmatrix_x4_trans(b, vsm +
                                             (kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * ROW +
                                             dp * 16 + (lane >> 4) * 8);
                    mma_16816(o[2 * dp], pf[kk], b[0], b[1]);
                    mma_16816(o[2 * dp + 1], pf[kk], b[2], b[3]);
                }
            }
        }
    }

    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    const float i0 = 1.f / l0, i1 = 1.f / l1;
    const int r0 = warp * 16 + g, r1 = r0 + 8;
    if (r0 < tile.n_rows) {
        float* dst = a.out + size_t(tile.row0 + r0) * q_dim + size_t(h) * HD + 2 * t4;
#pragma unroll
        for (int nd = 0; nd < ND; nd++)
            *reinterpret_cast<float2*>(dst + nd * 8) = make_float2(o[nd][0] * i0, o[nd][1] * i0);
    }
    if (r1 < tile.n_rows) {
        float* dst = a.out + size_t(tile.row0 + r1) * q_dim + size_t(h) * HD + 2 * t4;
#pragma unroll
        for (int nd = 0; nd < ND; nd++)
            *reinterpret_cast<float2*>(dst + nd * 8) = make_float2(o[nd][2] * i1, o[nd][3] * i1);
    }
}

// ---- prefill with the CPU's arithmetic ---------------------------------------------------------
//
// The decode kernels' arithmetic (the CPU's, above attn_merge_chunk) for runs of prompt rows,
// which as decode rows would each read their whole context for themselves. A block takes R
// consecutive rows of one tile and all G query heads of one KV head: P = R G (row, head) pairs,
// R = kXP / G, sharing every K/V chunk. Per chunk of kAttnChunk positions, in shared memory as
// floats:
//   scores  a thread takes 4 pairs by 4 positions (16 chains, each the dims in order, fmul then
//           fadd as the CPU); the warp's two pair groups read their q as broadcasts;
//   softmax a warp per pair: the chunk's max over the pair's live positions, e = exp in double
//           rounded to float, their sum in double, merged into the pair's running (max, sum);
//   P*V     a thread takes HD / 16 pairs by 4 dims, each a float chain over the positions in
//           order, merged into double accumulators that stay in registers for the whole block.
// Positions past a pair's row weigh 0 and past the block's last row are zeros in shared memory,
// so the float chains see the CPU's terms and +0s. One block does the whole context of its rows
// (no slices to merge); blocks go longest first.
constexpr int kXP = 64;  // (row, head) pairs a block
constexpr int kXThreads = 256;

template <int HD>
struct ExactPrefill {
    static constexpr int TP = kAttnChunk;
    static constexpr int ROW = HD + 4;                // floats: 16-byte rows in distinct banks
    static constexpr int SROW = TP + 4;               // scores [pair][pos]
    static constexpr int EROW = kXP + 4;              // weights [pos][pair], over the K chunk
    static constexpr int DG = HD / 4;                 // P*V: dim groups of 4
    static constexpr int PPT = kXP * DG / kXThreads;  // P*V: pairs a thread
    static_assert(TP * EROW <= TP * ROW && kXThreads % DG == 0 && PPT * kXThreads == kXP * DG);
    static constexpr size_t kQ = 0, kK = kQ + size_t(kXP) * ROW * 4, kV = kK + size_t(TP) * ROW * 4,
                            kS = kV + size_t(TP) * ROW * 4, kML = kS + size_t(kXP) * SROW * 4;
    static constexpr size_t smem_bytes() { return kML + size_t(kXP) * 4 * sizeof(double); }
};

template <int HD>
__global__ void __launch_bounds__(kXThreads, 1) attn_prefill_exact_kernel(PrefillArgs a) {
    using X = ExactPrefill<HD>;
    constexpr int TP = X::TP, ROW = X::ROW;
    extern __shared__ __align__(16) uint8_t smem[];
    float* qs = reinterpret_cast<float*>(smem + X::kQ);
    float* ks = reinterpret_cast<float*>(smem + X::kK);
    float* es = ks;  // the chunk's weights, once its scores are taken
    float* vs = reinterpret_cast<float*>(smem + X::kV);
    float* ss = reinterpret_cast<float*>(smem + X::kS);
    double* ml = reinterpret_cast<double*>(smem + X::kML);  // [pair]: max, sum, c_old, c_new

    // Longest first: the last tile's last part, every KV head, then backwards.
    const int kvh = blockIdx.x % a.n_head_kv;
    const int rest = a.n_tiles * a.parts - 1 - int(blockIdx.x / a.n_head_kv);
    const AttnTile tile = a.tiles[rest / a.parts];
    const int G = a.group, R = kXP / G;
    const int r0 = (rest % a.parts) * R;
    const int nr = min(R, tile.n_rows - r0);
    if (nr <= 0) return;
    const int P = nr * G;
    const int last = tile.pos0 + r0 + nr;  // positions 0..last-1 are read
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int q_dim = a.n_head * HD;
    // pair i: row r0 + i / G, head kvh G + i % G
    auto pair_len = [&](int i) { return i < P ? tile.pos0 + r0 + i / G + 1 : 0; };

    for (int i = tid; i < kXP * (HD / 4); i += kXThreads) {
        const int pr = i / (HD / 4), c = i % (HD / 4);
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (pr < P)
            v = *reinterpret_cast<const float4*>(a.q + size_t(tile.row0 + r0 + pr / G) * q_dim +
                                                 size_t(kvh * G + pr % G) * HD + 4 * c);
        *reinterpret_cast<float4*>(qs + pr * ROW + 4 * c) = v;
    }
    if (tid < kXP) {
        ml[4 * tid] = -INFINITY;
        ml[4 * tid + 1] = 0.0;
    }

    // P*V: pairs pp0.. (PPT of them), dims 4 dg..
    const int dg = tid % X::DG, pp0 = (tid / X::DG) * X::PPT;
    double acc[X::PPT][4];
#pragma unroll
    for (int i = 0; i < X::PPT; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0;
    // scores: pairs 4 sg.., positions sp + 16 j
    const int sg = 2 * warp + (lane >> 4), sp = lane & 15;
    const size_t base = size_t(tile.seq) * a.n_ctx * a.kv_dim + size_t(kvh) * HD;

    for (int p0 = 0; p0 < last; p0 += TP) {
        const int np = min(TP, last - p0);
        __syncthreads();  // the last chunk's P*V is done with es and vs (and qs, ml are written)
        for (int i = tid; i < TP * (HD / 8); i += kXThreads) {
            const int p = i / (HD / 8), c = i % (HD / 8);
            uint4 kr = make_uint4(0, 0, 0, 0), vr = kr;  // zeros past the block's last row
            if (p < np) {
                const size_t off = base + size_t(p0 + p) * a.kv_dim + 8 * c;
                kr = *reinterpret_cast<const uint4*>(a.kc + off);
                vr = *reinterpret_cast<const uint4*>(a.vc + off);
            }
            const __half2* kh = reinterpret_cast<const __half2*>(&kr);
            const __half2* vh = reinterpret_cast<const __half2*>(&vr);
            float* kd = ks + p * ROW + 8 * c;
            float* vd = vs + p * ROW + 8 * c;
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const float2 k0 = __half22float2(kh[2 * j]), k1 = __half22float2(kh[2 * j + 1]);
                const float2 v0 = __half22float2(vh[2 * j]), v1 = __half22float2(vh[2 * j + 1]);
                *reinterpret_cast<float4*>(kd + 4 * j) = make_float4(k0.x, k0.y, k1.x, k1.y);
                *reinterpret_cast<float4*>(vd + 4 * j) = make_float4(v0.x, v0.y, v1.x, v1.y);
            }
        }
        __syncthreads();

        // Scores, each the CPU's chain: fmul then fadd, dims in order, then times the scale.
        {
            float sc[4][4];
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) sc[i][j] = 0.f;
            const float* qr = qs + 4 * sg * ROW;
            const float* kr = ks + sp * ROW;
#pragma unroll 4
            for (int d = 0; d < HD; d += 4) {
                float4 qv[4], kv[4];
#pragma unroll
                for (int i = 0; i < 4; ++i)
                    qv[i] = *reinterpret_cast<const float4*>(qr + i * ROW + d);
#pragma unroll
                for (int j = 0; j < 4; ++j)
                    kv[j] = *reinterpret_cast<const float4*>(kr + 16 * j * ROW + d);
#pragma unroll
                for (int i = 0; i < 4; ++i)
#pragma unroll
                    for (int j = 0; j < 4; ++j) {
                        float c = sc[i][j];
                        c = __fadd_rn(c, __fmul_rn(qv[i].x, kv[j].x));
                        c = __fadd_rn(c, __fmul_rn(qv[i].y, kv[j].y));
                        c = __fadd_rn(c, __fmul_rn(qv[i].z, kv[j].z));
                        c = __fadd_rn(c, __fmul_rn(qv[i].w, kv[j].w));
                        sc[i][j] = c;
                    }
            }
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j)
                    ss[(4 * sg + i) * X::SROW + sp + 16 * j] = __fmul_rn(sc[i][j], a.scale);
        }
        __syncthreads();

        // Softmax of the chunk, a warp per pair; weights into es[pos][pair].
        for (int i = warp; i < kXP; i += kXThreads / 32) {
            const int live = min(np, pair_len(i) - p0);  // the pair's positions in the chunk
            const float s0 = ss[i * X::SROW + lane], s1 = ss[i * X::SROW + lane + 32];
            if (live <= 0) {  // nothing of this pair here (or no pair): weight 0, no merge
                es[lane * X::EROW + i] = 0.f;
                es[(lane + 32) * X::EROW + i] = 0.f;
                if (lane == 0) ml[4 * i + 2] = 1.0, ml[4 * i + 3] = 0.0;
                continue;
            }
            const bool l0 = lane < live, l1 = lane + 32 < live;
            const float mx = warp_max(fmaxf(l0 ? s0 : -INFINITY, l1 ? s1 : -INFINITY));
            const float e0 =
                l0 ? __double2float_rn(detail::exp_lean(double(s0) - double(mx))) : 0.f;
            const float e1 =
                l1 ? __double2float_rn(detail::exp_lean(double(s1) - double(mx))) : 0.f;
            const double sum = warp_sum(double(e0) + double(e1));
            es[lane * X::EROW + i] = e0;
            es[(lane + 32) * X::EROW + i] = e1;
            if (lane == 0) {
                double m = ml[4 * i], l = ml[4 * i + 1];
                attn_merge_chunk(m, l, mx, sum, ml[4 * i + 2], ml[4 * i + 3]);
                ml[4 * i] = m;
                ml[4 * i + 1] = l;
            }
        }
        __syncthreads();

        // P*V: each a float chain over the chunk's positions in order, then into double.
        {
            float pv[X::PPT][4];
#pragma unroll
            for (int i = 0; i < X::PPT; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) pv[i][j] = 0.f;
            for (int p = 0; p < np; ++p) {
                const float4 v = *reinterpret_cast<const float4*>(vs + p * ROW + 4 * dg);
                float e[X::PPT];
#pragma unroll
                for (int i = 0; i < X::PPT; i += 4)
                    *reinterpret_cast<float4*>(e + i) =
                        *reinterpret_cast<const float4*>(es + p * X::EROW + pp0 + i);
#pragma unroll
                for (int i = 0; i < X::PPT; ++i) {
                    pv[i][0] = __fadd_rn(pv[i][0], __fmul_rn(e[i], v.x));
                    pv[i][1] = __fadd_rn(pv[i][1], __fmul_rn(e[i], v.y));
                    pv[i][2] = __fadd_rn(pv[i][2], __fmul_rn(e[i], v.z));
                    pv[i][3] = __fadd_rn(pv[i][3], __fmul_rn(e[i], v.w));
                }
            }
#pragma unroll
            for (int i = 0; i < X::PPT; ++i) {
                const double c_old = ml[4 * (pp0 + i) + 2], c_new = ml[4 * (pp0 + i) + 3];
#pragma unroll
                for (int j = 0; j < 4; ++j)
                    acc[i][j] = acc[i][j] * c_old + double(pv[i][j]) * c_new;
            }
        }
    }
#pragma unroll
    for (int i = 0; i < X::PPT; ++i) {
        const int pr = pp0 + i;
        if (pr >= P) continue;
        const double l = ml[4 * pr + 1];
        float* dst = a.out + size_t(tile.row0 + r0 + pr / G) * q_dim +
                     size_t(kvh * G + pr % G) * HD + 4 * dg;
        *reinterpret_cast<float4*>(dst) = make_float4(float(acc[i][0] / l), float(acc[i][1] / l),
                                                      float(acc[i][2] / l), float(acc[i][3] / l));
    }
}

float scale_log2(int head_dim) {
    return kLog2e / std::sqrt(float(head_dim));
}
// The scores' scale as the CPU computes it (the kernels with its arithmetic).
float cpu_scale(int head_dim) {
    return 1.0f / std::sqrt(float(head_dim));
}

void check_shape(const AttnShape& s) {
    if (s.n_head <= 0 || s.n_head_kv <= 0 || s.n_head % s.n_head_kv != 0)
        fail("attention needs n_head (%d) to be a multiple of n_head_kv (%d).", s.n_head,
             s.n_head_kv);
    if (s.head_dim <= 0 || s.head_dim % 2 != 0 || s.head_dim > kGenericMaxHd)
        fail("head_dim %d is not supported by the CUDA attention kernels (even, at most %d).",
             s.head_dim, kGenericMaxHd);
}

}  // namespace

bool attn_has_fast_decode(const AttnShape& s) {
    return (s.head_dim == 64 || s.head_dim == 128) && s.group() <= kMaxGroup;
}
bool attn_decode_fuses_rope(const AttnShape& s, int n_rows) {
    return n_rows == 1 && attn_has_fast_decode(s);
}
bool attn_has_prefill(const AttnShape& s, bool exact) {
    return (s.head_dim == 64 || s.head_dim == 128) && (!exact || s.group() <= kXP);
}

// The groups the tiled decode kernel is compiled for (those of common models: Llama 3 8B 4,
// 70B 8, SmolLM2 3); any other group runs its runtime-group loop (GT = 0).
using TiledGroups = std::integer_sequence<int, 1, 2, 3, 4, 6, 8>;

// f(the tiled decode kernel of NT threads for head size HD and this group).
template <int NT, int HD, class F, int... G>
void with_tiled_decode(int group, F&& f, std::integer_sequence<int, G...>) {
    const bool compiled = ((group == G && (f(attn_decode_tiled<HD, G, NT>), true)) || ...);
    if (!compiled) f(attn_decode_tiled<HD, 0, NT>);
}

// The shared memory a decode block asks for to have its multiprocessor to itself (attn_decode's
// `alone`): 200 KB, or the most a block may have where that is less. What is left (about 27
// KB on the H100 and H200) holds none of the next GEMV's CTAs.
static size_t alone_smem() {
    return std::min<size_t>(200 * 1024, size_t(detail::device_limits().optin));
}

// Every tiled decode kernel of NT threads and head size HD may use the shared memory of the
// largest group, or alone_smem().
template <int NT, int HD, int... G>
void init_tiled_decode(std::integer_sequence<int, G...>) {
    const size_t most = std::max(DecodeTile<HD, NT>::smem_bytes(kMaxGroup), alone_smem());
    for (auto kernel : {attn_decode_tiled<HD, G, NT>..., attn_decode_tiled<HD, 0, NT>})
        NT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           int(most)),
                      "cudaFuncSetAttribute attn_decode_tiled");
}

template <int NT, int HD>
void launch_tiled_decode(const DecodeArgs& a, dim3 grid, bool pdl, bool alone,
                         cudaStream_t stream) {
    size_t smem = DecodeTile<HD, NT>::smem_bytes(a.group);
    if (alone) smem = std::max(smem, alone_smem());
    with_tiled_decode<NT, HD>(
        a.group,
        [&](auto kernel) {
            launch_kernel(pdl, kernel, grid, dim3(NT), smem, stream,
                          "attention decode kernel (tiled)", a);
        },
        TiledGroups{});
}

// Whether version 0 takes the wide tiled form (on unless NT_ATTN_WIDE=0, for A/B runs): faster
// than the full form at every context with one row (8B Q4_K_M decode +1.8%, BENCHMARKS twelfth
// session), within 3% of it at four rows and long contexts.
static bool attn_wide_enabled() {
    static const bool on = env_switch("NT_ATTN_WIDE");
    return on;
}

void attn_init() {
    init_tiled_decode<kThreads, 64>(TiledGroups{});
    init_tiled_decode<kThreads, 128>(TiledGroups{});
    init_tiled_decode<kWideThreads, 64>(TiledGroups{});
    init_tiled_decode<kWideThreads, 128>(TiledGroups{});
    NT_CUDA_CHECK(
        cudaFuncSetAttribute(attn_prefill_kernel<64>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             int(PrefillTile<64>::smem_bytes())),
        "cudaFuncSetAttribute attn_prefill_kernel<64>");
    NT_CUDA_CHECK(
        cudaFuncSetAttribute(attn_prefill_kernel<128>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             int(PrefillTile<128>::smem_bytes())),
        "cudaFuncSetAttribute attn_prefill_kernel<128>");
    NT_CUDA_CHECK(cudaFuncSetAttribute(attn_prefill_exact_kernel<64>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       int(ExactPrefill<64>::smem_bytes())),
                  "cudaFuncSetAttribute attn_prefill_exact_kernel<64>");
    NT_CUDA_CHECK(cudaFuncSetAttribute(attn_prefill_exact_kernel<128>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       int(ExactPrefill<128>::smem_bytes())),
                  "cudaFuncSetAttribute attn_prefill_exact_kernel<128>");
}

void kv_store(const AttnShape& s, const float* k, const float* v, const int32_t* pos,
              const int32_t* seq, int n, __half* k_cache, __half* v_cache, cudaStream_t stream) {
    if (n <= 0) return;
    kv_store_kernel<<<n, 256, 0, stream>>>(k, v, pos, seq, s.kv_dim(), s.n_ctx, k_cache, v_cache);
    NT_CUDA_CHECK(cudaGetLastError(), "kv_store kernel");
}

int attn_decode_splits(const AttnShape& s, int n_rows, int sm_count) {
    if (n_rows <= 0) return 1;
    // About two blocks per SM in flight, each slice at least 128 positions of a full context.
    const int64_t target = 2 * int64_t(std::max(sm_count, 1));
    const int64_t per_split = int64_t(n_rows) * s.n_head_kv;
    int64_t splits = (target + per_split - 1) / per_split;
    const int64_t max_splits = std::min<int64_t>(kMaxSplits, std::max(1, (s.n_ctx + 127) / 128));
    return int(std::clamp<int64_t>(splits, 1, max_splits));
}

size_t attn_decode_scratch_floats(const AttnShape& s, int n_rows, int splits) {
    if (splits <= 1) return 0;
    // Each slice's partial P*V and (max, sum), in double.
    return 2 * size_t(n_rows) * size_t(s.n_head) * size_t(splits) * size_t(s.head_dim + 2);
}

bool attn_decode(const AttnShape& s, const float* q, __half* k_cache, __half* v_cache,
                 const int32_t* pos, const int32_t* seq, const int32_t* rows, int n_rows,
                 int splits, float* scratch, int* done, float* out, cudaStream_t stream,
                 int version, const ActivationSlot* quant, bool pdl, const RopeIn* rope,
                 bool alone) {
    if (n_rows <= 0) return false;
    check_shape(s);
    if (splits < 1 || splits > kMaxSplits)
        fail("attention: %d context slices (1..%d).", splits, kMaxSplits);
    if (n_rows > 65535) fail("attention: %d decode rows in one launch (at most 65535).", n_rows);
    DecodeArgs a;
    a.q = q;
    a.kc = k_cache;
    a.vc = v_cache;
    a.pos = pos;
    a.seq = seq;
    a.rows = rows;
    if (reinterpret_cast<uintptr_t>(scratch) % 16 != 0)
        fail("attention: the decode scratch is not 16-byte aligned.");
    a.part_acc = reinterpret_cast<double*>(scratch);
    a.part_ml = reinterpret_cast<double2*>(a.part_acc + size_t(n_rows) * s.n_head * splits * s.head_dim);
    a.out = out;
    a.done = done;
    a.n_head = s.n_head;
    a.head_dim = s.head_dim;
    a.n_ctx = s.n_ctx;
    a.kv_dim = s.kv_dim();
    a.group = s.group();
    a.splits = splits;
    a.scale = cpu_scale(s.head_dim);
    a.xq = nullptr;
    a.xd = nullptr;
    a.qmode = -1;
    a.sc_fences = arrival_sc_fences();
    a.k_new = a.v_new = a.inv_freq = nullptr;
    // The wide tiled form: version 3, or version 0 unless NT_ATTN_WIDE=0.
    const bool wide =
        version == 3 || (version == 0 && attn_has_fast_decode(s) && attn_wide_enabled());
    if (rope) {
        if (version == 1 || !attn_decode_fuses_rope(s, n_rows))
            fail("attention: the decode kernel cannot do the rope here (%d rows).", n_rows);
        a.k_new = rope->k;
        a.v_new = rope->v;
        a.inv_freq = rope->inv_freq;
    }
    const bool tiled = version == 2 || wide || (version == 0 && attn_has_fast_decode(s));
    if (tiled && !attn_has_fast_decode(s))
        fail("attention: no tiled decode kernel for head_dim %d.", s.head_dim);
    if (tiled) {
        // A block's heads must be whole quantization blocks of the row.
        const int heads = s.group() * s.head_dim;
        if (quant && heads % (quant->mode == detail::ActQuant::Q8_K ? 256 : 32) == 0) {
            a.xq = quant->xq;
            a.xd = quant->xd;
            a.qmode = int(quant->mode);
        }
        if (splits > 1 && !done) fail("attention: the split decode kernel needs its counters.");
        // KV heads fastest: the blocks are dispatched in order, so the first slices (the only
        // ones a short context has) get multiprocessors first, ahead of the blocks that exit.
        const dim3 grid(unsigned(s.n_head_kv), unsigned(splits), unsigned(n_rows));
        if (s.head_dim == 64)
            wide ? launch_tiled_decode<kWideThreads, 64>(a, grid, pdl, alone, stream)
                 : launch_tiled_decode<kThreads, 64>(a, grid, pdl, alone, stream);
        else
            wide ? launch_tiled_decode<kWideThreads, 128>(a, grid, pdl, alone, stream)
                 : launch_tiled_decode<kThreads, 128>(a, grid, pdl, alone, stream);
        return a.qmode >= 0;  // merged (and quantized) by the kernel itself
    }
    const dim3 grid(unsigned(splits), unsigned(s.n_head), unsigned(n_rows));
    attn_decode_generic<<<grid, kThreads, 0, stream>>>(a);
    NT_CUDA_CHECK(cudaGetLastError(), "attention decode kernel (generic)");
    if (splits > 1) {
        attn_merge_kernel<<<dim3(unsigned(n_rows), unsigned(s.n_head)), kThreads, 0, stream>>>(
            a.part_acc, a.part_ml, rows, s.n_head, s.head_dim, splits, out);
        NT_CUDA_CHECK(cudaGetLastError(), "attention merge kernel");
    }
    return false;
}

void attn_prefill(const AttnShape& s, const float* q, const __half* k_cache, const __half* v_cache,
                  const AttnTile* tiles, int n_tiles, float* out, cudaStream_t stream, bool exact) {
    if (n_tiles <= 0) return;
    check_shape(s);
    if (!attn_has_prefill(s, exact))
        fail("attention: no prefill kernel for head_dim %d and %d query heads a KV head.",
             s.head_dim, s.group());
    PrefillArgs a;
    a.q = q;
    a.kc = k_cache;
    a.vc = v_cache;
    a.tiles = tiles;
    a.out = out;
    a.n_head = s.n_head;
    a.n_head_kv = s.n_head_kv;
    a.n_ctx = s.n_ctx;
    a.kv_dim = s.kv_dim();
    a.group = s.group();
    a.n_tiles = n_tiles;
    a.scale_log2 = scale_log2(s.head_dim);
    a.parts = (kPrefillTileRows + kXP / s.group() - 1) / (kXP / s.group());
    a.scale = cpu_scale(s.head_dim);
    if (exact) {
        const unsigned blocks = unsigned(s.n_head_kv) * unsigned(n_tiles) * unsigned(a.parts);
        if (s.head_dim == 64)
            attn_prefill_exact_kernel<64>
                <<<blocks, kXThreads, ExactPrefill<64>::smem_bytes(), stream>>>(a);
        else
            attn_prefill_exact_kernel<128>
                <<<blocks, kXThreads, ExactPrefill<128>::smem_bytes(), stream>>>(a);
        NT_CUDA_CHECK(cudaGetLastError(), "attention prefill kernel (exact)");
        return;
    }
    const dim3 grid(unsigned(s.n_head), unsigned(n_tiles));
    if (s.head_dim == 64)
        attn_prefill_kernel<64><<<grid, kThreads, PrefillTile<64>::smem_bytes(), stream>>>(a);
    else
        attn_prefill_kernel<128><<<grid, kThreads, PrefillTile<128>::smem_bytes(), stream>>>(a);
    NT_CUDA_CHECK(cudaGetLastError(), "attention prefill kernel");
}

}  // namespace nt::cuda
