// One decode row's attention with the output projection folded in (attn_out_decode).
//
// At short contexts a decode step's attention is pure latency: one launch whose few blocks wait
// on a chain of dependent trips, then the output projection's launch, whose weights only start
// streaming once the attention's blocks leave. Here one launch does both. The projection
// y = wo * att is cut by columns into slices of H heads of one GQA group (H * head_dim columns:
// whole quantization blocks of att) and by rows into chunks; block (slice, chunk) loads its
// chunk of the slice's weight bytes into shared memory as soon as it starts (before it waits
// for q, k and v: nothing in the stream writes weights), with the K/V cache rows older than the
// newest, then computes its heads' attention over the whole context itself, quantizes them as
// the matmul would quantize att, and multiplies them with the weights it already holds. Every
// chunk of a slice repeats the slice's attention: at short contexts that costs less than the
// second launch and a handoff between blocks (a fence costs microseconds while HBM streams,
// BENCHMARKS.md). Each block writes its rows' partial sums of y for its slice; add_rmsnorm adds
// the slices in slice order (ops.cuh).
//
// The attention is the tiled decode kernel's (attention.cu) in one block of 256 threads: K/V
// tiles of 64 positions double-buffered through shared memory by cp.async, an online softmax
// per head, q turned and k turned and stored into the cache here (the slice that holds the KV
// head's first query heads, in the first chunk, writes the cell).
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>

#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/cuda_check.cuh"
#include "backend/cuda/matmul_kernels.cuh"
#include "backend/cuda/matmul_quant.cuh"
#include "backend/cuda/ops.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/quantize_q8.cuh"
#include "backend/cuda/rope.cuh"
#include "core/error.h"

namespace nt::cuda {

namespace {

using detail::cp_async16;
using detail::cp_async_commit;
using detail::cp_async_wait_upto;

constexpr int kNT = 256;  // threads a block
constexpr int kTP = 64;   // positions a K/V tile
constexpr float kLog2e = 1.4426950408889634f;

constexpr size_t round16(size_t n) {
    return (n + 15) / 16 * 16;
}

// The quantization the matmul gives att for weights of type T (detail::act_quant).
constexpr detail::ActQuant act_quant_of(GgmlType t) {
    switch (t) {
        case GgmlType::Q4_1:
        case GgmlType::Q5_1:
            return detail::ActQuant::Q8_1;
        case GgmlType::Q2_K:
        case GgmlType::Q3_K:
        case GgmlType::Q4_K:
        case GgmlType::Q5_K:
        case GgmlType::Q6_K:
            return detail::ActQuant::Q8_K;
        default:
            return detail::ActQuant::Q8_0;
    }
}

// Shared memory of a block: the fixed part (K/V tiles, q, scores, softmax state, rope angles,
// P*V partials, att's quantization) at compile-time offsets, then the weights.
template <int HD, int H>
struct OutLayout {
    static constexpr int ROW = HD + 8;  // padded K/V row (halves): conflict-free 16-byte reads
    static constexpr int SE = H * HD;   // the slice's columns
    static constexpr size_t kv = size_t(2) * kTP * ROW * sizeof(__half);  // two tiles of K or V
    static constexpr size_t k_off = 0, v_off = kv, q_off = 2 * kv;
    static constexpr size_t ps_off = q_off + round16(SE * sizeof(float));
    static constexpr size_t st_off = ps_off + round16(size_t(H) * kTP * sizeof(float));
    static constexpr size_t rc_off = st_off + round16(3 * H * sizeof(float));
    static constexpr size_t red_off = rc_off + round16(HD * sizeof(float));
    static constexpr size_t xq_off = red_off + kNT * sizeof(float2);
    static constexpr size_t xd_off = xq_off + round16(SE);
    static constexpr size_t w_off = xd_off + round16(SE / 32 * sizeof(float2));
};

struct AttnOutArgs {
    const float* q;      // [row][n_head * HD], not yet turned
    const float* k_new;  // [row][kv_dim], not yet turned
    const float* v_new;
    const float* inv_freq;  // [HD / 2]
    __half* kc;             // this layer's caches
    __half* vc;
    const int32_t* pos;
    const int32_t* seq;
    const int32_t* rows;  // the step's one decode row
    const uint8_t* wo;
    int64_t wo_rows;
    size_t row_bytes;
    int slice_bytes, granule, chunk_rows, smem_row;
    float* part;  // [slice][wo_rows]
    int n_head, n_ctx, kv_dim, group;
    float scale_log2;
};

// Row r of a chunk: the slice's bytes [S, S + slice_bytes) of wo go to the row's shared memory
// at offset S - floor16(S), so that every block keeps its global address modulo 16 (the
// type's aligned loads stay valid), copied in granules of G (the row's alignment) from
// floor_G(S) to ceil_G(S + slice_bytes).
template <int G>
__device__ __forceinline__ void load_weight_rows(const AttnOutArgs& a, uint8_t* wsl, int slice,
                                                 int r0, int nrows) {
    const int per_row = a.smem_row / G;
    for (int c = threadIdx.x; c < nrows * per_row; c += kNT) {
        const int r = c / per_row, j = c % per_row;
        const size_t s = size_t(r0 + r) * a.row_bytes + size_t(slice) * size_t(a.slice_bytes);
        const size_t lo = s & ~size_t(G - 1);
        const size_t hi = (s + size_t(a.slice_bytes) + G - 1) & ~size_t(G - 1);
        const size_t g = lo + size_t(j) * G;
        if (g < hi)
            detail::cp_async_ca<G>(wsl + size_t(r) * a.smem_row + (g - (s & ~size_t(15))),
                                   a.wo + g);
    }
}

template <GgmlType T, int HD, int H>
__global__ void __launch_bounds__(kNT, 1) attn_out_kernel(AttnOutArgs a) {
    using Q = detail::Quant<T>;
    using L = OutLayout<HD, H>;
    constexpr int ROW = L::ROW, SE = L::SE, CH = HD / 8;  // CH: 16-byte chunks of a K/V row
    constexpr int NB = SE / Q::kBlockElems;               // weight blocks of a row's slice
    constexpr int LPR = NB * Q::kLanesPerBlock;           // lanes a row
    constexpr int RPS = 32 / LPR;                         // rows a warp step
    constexpr int TS = kNT / (H * kTP);                   // threads a score (head dims split)
    constexpr int U = SE / 2;                             // P*V: float2 outputs
    constexpr int NPART = kNT / U;                        // P*V: threads an output
    static_assert(SE % Q::kBlockElems == 0 && 32 % LPR == 0, "whole blocks, whole rows a warp");
    static_assert(kNT % (H * kTP) == 0 && (HD / TS) % 8 == 0, "whole scores");
    static_assert(kNT % U == 0 && CH <= kNT && H <= kNT / 32, "whole P*V outputs, a warp a head");
    constexpr detail::ActQuant kMode = act_quant_of(T);
    static_assert(kMode != detail::ActQuant::Q8_K || SE % 256 == 0, "Q8_K blocks of 256");

    extern __shared__ __align__(16) unsigned char smem[];
    __half* kbuf = reinterpret_cast<__half*>(smem + L::k_off);  // [2][kTP][ROW]
    __half* vbuf = reinterpret_cast<__half*>(smem + L::v_off);
    float* qs = reinterpret_cast<float*>(smem + L::q_off);    // [H][HD] pre-scaled; then att
    float* ps = reinterpret_cast<float*>(smem + L::ps_off);   // [H][kTP] scores, then weights
    float* ms = reinterpret_cast<float*>(smem + L::st_off);   // [H] running max
    float* ls = ms + H;                                       // [H] running sum
    float* cs = ls + H;                                       // [H] this tile's rescale
    float* rc = reinterpret_cast<float*>(smem + L::rc_off);   // [HD / 2] cos, then sin
    float2* red = reinterpret_cast<float2*>(smem + L::red_off);  // [NPART][U]
    int8_t* xq = reinterpret_cast<int8_t*>(smem + L::xq_off);    // att quantized
    float2* xd = reinterpret_cast<float2*>(smem + L::xd_off);
    uint8_t* wsl = smem + L::w_off;  // [chunk_rows][smem_row]

    pdl_trigger();
    const int t = threadIdx.x, lane = t % 32, warp = t / 32;
    const int slice = blockIdx.x, chunk = blockIdx.y;
    const int h0 = slice * H, kvh = h0 / a.group;
    // The step's tables are uploaded before its first kernel.
    const int row = a.rows[0];
    const int newest = a.pos[row], len = newest + 1;
    const int n_tiles = (len + kTP - 1) / kTP;
    const size_t base = size_t(a.seq[row]) * a.n_ctx * a.kv_dim + size_t(kvh) * HD;
    const __half* kg = a.kc + base;
    const __half* vg = a.vc + base;
    const int r0 = chunk * a.chunk_rows;
    const int nrows = min(a.chunk_rows, int(a.wo_rows - r0));

    // Cache rows older than the newest are final before this step's first kernel (this kernel
    // is the only one of the step that writes this layer's cache): they load before the wait.
    auto load_tile = [&](int tile) {
        const int p0 = tile * kTP, buf = tile & 1, np = min(kTP, len - p0);
        for (int c = t; c < np * CH; c += kNT) {
            const int r = c / CH, cc = c % CH;
            if (p0 + r == newest) continue;
            const size_t off = size_t(p0 + r) * a.kv_dim + cc * 8;
            cp_async16(kbuf + (buf * kTP + r) * ROW + cc * 8, kg + off);
            cp_async16(vbuf + (buf * kTP + r) * ROW + cc * 8, vg + off);
        }
        cp_async_commit();
    };
    // Copy groups in order: tile 0, tile 1 (if any), the weights, then one a tile from tile 2.
    load_tile(0);
    int issued = 1;
    if (n_tiles > 1) load_tile(issued++);
    switch (a.granule) {
        case 16: load_weight_rows<16>(a, wsl, slice, r0, nrows); break;
        case 8: load_weight_rows<8>(a, wsl, slice, r0, nrows); break;
        default: load_weight_rows<4>(a, wsl, slice, r0, nrows); break;
    }
    cp_async_commit();
    int groups = issued + 1;
    auto group_of = [](int tile) { return tile < 2 ? tile : tile + 1; };
    for (int j = t; j < HD / 2; j += kNT)
        detail::rope_angle(newest, a.inv_freq[j], rc[j], rc[HD / 2 + j]);

    // q, k and v come from the kernel before (this may be a programmatic dependent launch).
    pdl_wait(a.q, a.k_new, a.v_new, a.kc, a.vc, a.part);
    __syncthreads();  // the angles
    // The newest k (turned) and v of the KV head, rounded to F16 as rope_kv_store rounds them:
    // chunk t of 8 dims on thread t < CH, put into its tile when that is loaded.
    const int newest_tile = newest / kTP;
    uint4 nk = {}, nv = {};
    if (t < CH) {
        const size_t e = size_t(row) * a.kv_dim + size_t(kvh) * HD + t * 8;
        __half2* k2 = reinterpret_cast<__half2*>(&nk);
        __half2* v2 = reinterpret_cast<__half2*>(&nv);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float2 kf = *reinterpret_cast<const float2*>(a.k_new + e + 2 * i);
            const float2 vf = *reinterpret_cast<const float2*>(a.v_new + e + 2 * i);
            const int j = t * 4 + i;
            k2[i] = __float22half2_rn(detail::rope_turn(kf.x, kf.y, rc[j], rc[HD / 2 + j]));
            v2[i] = __float22half2_rn(vf);
        }
        if (chunk == 0 && h0 % a.group == 0) {
            const size_t off = size_t(newest) * a.kv_dim + t * 8;
            *reinterpret_cast<uint4*>(a.kc + base + off) = nk;
            *reinterpret_cast<uint4*>(a.vc + base + off) = nv;
        }
    }
    auto put_newest = [&](int tile) {
        if (t < CH && tile == newest_tile) {
            const int r = newest - tile * kTP, buf = tile & 1;
            *reinterpret_cast<uint4*>(kbuf + (buf * kTP + r) * ROW + t * 8) = nk;
            *reinterpret_cast<uint4*>(vbuf + (buf * kTP + r) * ROW + t * 8) = nv;
        }
    };
    for (int i = 0; i < issued; i++) put_newest(i);
    // q pre-scaled, turned first (pair (2j, 2j + 1) of a head).
    const float2* qrow =
        reinterpret_cast<const float2*>(a.q + size_t(row) * a.n_head * HD + size_t(h0) * HD);
    for (int i = t; i < SE / 2; i += kNT) {
        const int j = i % (HD / 2);
        const float2 v = detail::rope_turn(qrow[i].x, qrow[i].y, rc[j], rc[HD / 2 + j]);
        reinterpret_cast<float2*>(qs)[i] = make_float2(v.x * a.scale_log2, v.y * a.scale_log2);
    }
    if (t < H) {
        ms[t] = -INFINITY;
        ls[t] = 0.f;
    }

    const int sp = t / TS, sq = t % TS;              // score phase: (head, position), dims part
    const int sh = sp / kTP, spos = sp % kTP;
    const int u = t % U, part = t / U;               // P*V phase: output, positions part
    const int ph = u / (HD / 2), d2 = u % (HD / 2);
    float2 acc = make_float2(0.f, 0.f);
    for (int tile = 0; tile < n_tiles; tile++) {
        const int buf = tile & 1;
        if (tile + 1 < n_tiles && issued == tile + 1) {
            load_tile(issued);
            put_newest(issued++);
            groups++;
        }
        cp_async_wait_upto(groups - 1 - group_of(tile));
        __syncthreads();

        const int np = min(kTP, len - tile * kTP);
        {
            float s = 0.f;
            if (spos < np) {
                const __half* kr = kbuf + (buf * kTP + spos) * ROW + sq * (HD / TS);
                const float* qh = qs + sh * HD + sq * (HD / TS);
#pragma unroll
                for (int c = 0; c < HD / TS; c += 8) {
                    const uint4 raw = *reinterpret_cast<const uint4*>(kr + c);
                    const float2 k0 = __half22float2(*reinterpret_cast<const __half2*>(&raw.x));
                    const float2 k1 = __half22float2(*reinterpret_cast<const __half2*>(&raw.y));
                    const float2 k2 = __half22float2(*reinterpret_cast<const __half2*>(&raw.z));
                    const float2 k3 = __half22float2(*reinterpret_cast<const __half2*>(&raw.w));
                    const float4 qa = *reinterpret_cast<const float4*>(qh + c);
                    const float4 qb = *reinterpret_cast<const float4*>(qh + c + 4);
                    s += qa.x * k0.x + qa.y * k0.y + qa.z * k1.x + qa.w * k1.y + qb.x * k2.x +
                         qb.y * k2.y + qb.z * k3.x + qb.w * k3.y;
                }
            }
#pragma unroll
            for (int o = 1; o < TS; o <<= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
            if (sq == 0) ps[sh * kTP + spos] = spos < np ? s : -INFINITY;
        }
        __syncthreads();

        // online softmax: warp g takes head g, each lane kTP / 32 positions
        if (warp < H) {
            const int g = warp;
            float s[kTP / 32], mx = -INFINITY;
#pragma unroll
            for (int i = 0; i < kTP / 32; i++) {
                s[i] = ps[g * kTP + lane + 32 * i];
                mx = fmaxf(mx, s[i]);
            }
            const float m_old = ms[g];
            const float m_new = fmaxf(m_old, detail::warp_max(mx));  // finite: np >= 1
            float e = 0.f;
#pragma unroll
            for (int i = 0; i < kTP / 32; i++) {
                s[i] = exp2f(s[i] - m_new);
                e += s[i];
            }
            const float sum = detail::warp_sum(e);
#pragma unroll
            for (int i = 0; i < kTP / 32; i++) ps[g * kTP + lane + 32 * i] = s[i];
            __syncwarp();  // every lane has read ms[g]
            if (lane == 0) {
                const float c = exp2f(m_old - m_new);
                cs[g] = c;
                ls[g] = ls[g] * c + sum;
                ms[g] = m_new;
            }
        }
        __syncthreads();

        // acc = acc * c + P * V over this thread's positions part, part + NPART, ...
        {
            const float c = cs[ph];
            acc.x *= c;
            acc.y *= c;
            const __half* vr = vbuf + buf * kTP * ROW + 2 * d2;
            const float* w = ps + ph * kTP;
            for (int p = part; p < np; p += NPART) {
                const float2 vf = __half22float2(*reinterpret_cast<const __half2*>(vr + p * ROW));
                const float wp = w[p];
                acc.x += wp * vf.x;
                acc.y += wp * vf.y;
            }
        }
        __syncthreads();  // the next tile's load overwrites the buffer just read
    }

    // att = the parts' sums in order, over the softmax's sum; then quantized as the matmul would.
    red[part * U + u] = acc;
    __syncthreads();
    if (t < U) {
        float2 o = red[t];
#pragma unroll
        for (int p = 1; p < NPART; p++) {
            o.x += red[p * U + t].x;
            o.y += red[p * U + t].y;
        }
        const float inv = 1.f / ls[t / (HD / 2)];
        reinterpret_cast<float2*>(qs)[t] = make_float2(o.x * inv, o.y * inv);
    }
    __syncthreads();
    detail::quantize_span<kNT>(qs, SE, kMode == detail::ActQuant::Q8_K,
                               kMode == detail::ActQuant::Q8_1, xq, xd);
    cp_async_wait_upto(0);  // the weights
    __syncthreads();

    // y's partial sums for this slice: LPR lanes a row (kLanesPerBlock a block), RPS rows a
    // warp step, the lanes' dot products summed by shuffles.
    const int sub = lane % LPR, blk = sub / Q::kLanesPerBlock, bpart = sub % Q::kLanesPerBlock;
    typename Q::X x;
    Q::template load_x<true>(xq + blk * Q::kBlockElems, xd + blk * (Q::kBlockElems / 32), bpart,
                             x);
    for (int rb = warp * RPS; rb < nrows; rb += (kNT / 32) * RPS) {
        const int r = rb + lane / LPR;
        float d = 0.f;
        if (r < nrows) {
            const size_t s = size_t(r0 + r) * a.row_bytes + size_t(slice) * size_t(a.slice_bytes);
            const uint8_t* b = wsl + size_t(r) * a.smem_row + (s & 15) + blk * Q::kBlockBytes;
            typename Q::W w;
            Q::load_w(b, bpart, w);
            d = Q::dot(w, x);
        }
#pragma unroll
        for (int o = 1; o < LPR; o <<= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
        if (sub == 0 && r < nrows) a.part[size_t(slice) * a.wo_rows + r0 + r] = d;
    }
}

// f(the kernel for weights of type t, head size hd and `heads` heads a slice); false where none
// is compiled: K-quants take 256 / hd heads a slice (one block of a row), the 32-element types
// one or two heads.
template <class F>
bool with_kernel(GgmlType t, int hd, int heads, F&& f) {
    auto by_type = [&](auto tag) {
        constexpr GgmlType T = decltype(tag)::value;
        constexpr bool k_quant = detail::Quant<T>::kBlockElems == 256;
        if constexpr (k_quant) {
            if (hd == 64 && heads == 4) return f(attn_out_kernel<T, 64, 4>), true;
            if (hd == 128 && heads == 2) return f(attn_out_kernel<T, 128, 2>), true;
            return false;
        } else {
            if (hd == 64 && heads == 1) return f(attn_out_kernel<T, 64, 1>), true;
            if (hd == 64 && heads == 2) return f(attn_out_kernel<T, 64, 2>), true;
            if (hd == 128 && heads == 1) return f(attn_out_kernel<T, 128, 1>), true;
            if (hd == 128 && heads == 2) return f(attn_out_kernel<T, 128, 2>), true;
            return false;
        }
    };
    switch (t) {
#define NT_CASE(T) \
    case GgmlType::T: return by_type(std::integral_constant<GgmlType, GgmlType::T>{});
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

size_t fixed_smem(int hd, int heads) {
    switch (hd * 8 + heads) {
        case 64 * 8 + 1: return OutLayout<64, 1>::w_off;
        case 64 * 8 + 2: return OutLayout<64, 2>::w_off;
        case 64 * 8 + 4: return OutLayout<64, 4>::w_off;
        case 128 * 8 + 1: return OutLayout<128, 1>::w_off;
        case 128 * 8 + 2: return OutLayout<128, 2>::w_off;
        default: return 0;
    }
}

}  // namespace

bool attn_out_plan(const AttnShape& s, const WeightView& wo, int sm_count, size_t smem_optin,
                   AttnOutPlan* plan) {
    const int hd = s.head_dim, group = s.n_head_kv > 0 ? s.group() : 0;
    if ((hd != 64 && hd != 128) || group <= 0 || s.n_head % s.n_head_kv != 0 ||
        wo.cols != s.q_dim() || wo.rows <= 0 || sm_count <= 0 ||
        (reinterpret_cast<uintptr_t>(wo.data) & 15) != 0)
        return false;
    const TypeTraits& tr = traits(wo.type);
    if (wo.cols % tr.block_elems != 0) return false;
    const size_t rb = row_bytes(wo.type, wo.cols);
    const int granule = rb % 16 == 0 ? 16 : rb % 8 == 0 ? 8 : rb % 4 == 0 ? 4 : 0;
    if (granule == 0) return false;
    const int first = tr.block_elems == 256 ? 256 / hd : 1, last = tr.block_elems == 256 ? first : 2;
    for (int heads = first; heads <= last; heads *= 2) {
        if (group % heads != 0 || !with_kernel(wo.type, hd, heads, [](auto) {})) continue;
        AttnOutPlan p;
        p.heads = heads;
        p.slices = s.n_head / heads;
        if (p.slices > sm_count) continue;  // one wave: every block starts at once
        p.granule = granule;
        p.slice_bytes = heads * hd / tr.block_elems * tr.block_bytes;
        // The most bytes a row's slice spans from the 16-byte boundary at or below it: over a
        // period of 16 rows and every slice (only the start modulo 16 matters).
        size_t span = 0;
        for (int r = 0; r < 16; r++)
            for (int sl = 0; sl < p.slices; sl++) {
                const size_t st = size_t(r) * rb + size_t(sl) * size_t(p.slice_bytes);
                const size_t hi = (st + size_t(p.slice_bytes) + granule - 1) / granule * granule;
                span = std::max(span, hi - st / 16 * 16);
            }
        p.smem_row = int(round16(span));
        const int chunks = std::max(1, sm_count / p.slices);
        p.chunk_rows = int((wo.rows + chunks - 1) / chunks);
        p.chunks = int((wo.rows + p.chunk_rows - 1) / p.chunk_rows);
        p.smem = fixed_smem(hd, heads) + size_t(p.chunk_rows) * size_t(p.smem_row);
        if (p.smem > smem_optin) continue;
        *plan = p;
        return true;
    }
    return false;
}

void attn_out_init(size_t smem_optin) {
    for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1,
                       GgmlType::Q8_0, GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K,
                       GgmlType::Q5_K, GgmlType::Q6_K})
        for (int hd : {64, 128})
            for (int heads : {1, 2, 4})
                with_kernel(t, hd, heads, [&](auto kernel) {
                    NT_CUDA_CHECK(cudaFuncSetAttribute(kernel,
                                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                       int(smem_optin)),
                                  "cudaFuncSetAttribute attention + output projection kernel");
                });
}

void attn_out_decode(const AttnShape& s, const AttnOutPlan& p, const WeightView& wo,
                     const float* q, const float* k, const float* v, const float* inv_freq,
                     __half* k_cache, __half* v_cache, const int32_t* pos, const int32_t* seq,
                     const int32_t* rows, float* partials, bool pdl, cudaStream_t stream) {
    AttnOutArgs a;
    a.q = q;
    a.k_new = k;
    a.v_new = v;
    a.inv_freq = inv_freq;
    a.kc = k_cache;
    a.vc = v_cache;
    a.pos = pos;
    a.seq = seq;
    a.rows = rows;
    a.wo = static_cast<const uint8_t*>(wo.data);
    a.wo_rows = wo.rows;
    a.row_bytes = row_bytes(wo.type, wo.cols);
    a.slice_bytes = p.slice_bytes;
    a.granule = p.granule;
    a.chunk_rows = p.chunk_rows;
    a.smem_row = p.smem_row;
    a.part = partials;
    a.n_head = s.n_head;
    a.n_ctx = s.n_ctx;
    a.kv_dim = s.kv_dim();
    a.group = s.group();
    a.scale_log2 = kLog2e / std::sqrt(float(s.head_dim));
    const dim3 grid(unsigned(p.slices), unsigned(p.chunks));
    const bool ok = with_kernel(wo.type, s.head_dim, p.heads, [&](auto kernel) {
        launch_kernel(pdl, kernel, grid, dim3(kNT), p.smem, stream,
                      "attention + output projection kernel", a);
    });
    if (!ok)
        fail("attention + output projection: no kernel for %s weights, head size %d, %d heads a "
             "slice.",
             type_name(wo.type), s.head_dim, p.heads);
}

}  // namespace nt::cuda
