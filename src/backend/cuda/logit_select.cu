// The sampler's candidates selected where the logits are: a decode step copies back the k best
// logits of a row (and the logits of the few tokens the sampler changes) instead of the row,
// 513 KB for a 128k vocabulary, whose copy and host-side scan the GPU otherwise idles through.
//
// Each logit becomes a 64-bit key, its float bits made monotonic in the high word and the
// complement of its id in the low word, so that the larger key is the better candidate by the
// sampler's order (higher logit, then lower id) and no two keys are equal; 0 is no candidate
// (a NaN, or padding past the row). Two kernels, each launched once for all the rows of a call
// (a server step's rows in parallel, not one after another):
// 1. blocks of C positions keep their m best keys, unordered: a radix select over the keys in
//    shared memory finds the m-th best, and the keys from it up are kept (keys are distinct, so
//    exactly m); one best is a block maximum;
// 2. one block per row selects the m best of the blocks' candidates (at most kMergeKeys) the same way,
//    sorts those m (bitonic, at most kMaxLogitCandidates) and writes them, the logits of the
//    asked ids and whether any block saw a NaN. For decoding fed on the device (logit_choose,
//    inside the step's graph; kernel 1 then adds the draw's logit bias) it draws the token
//    from those m as the host's sampler would (draw_chain), writes it where the next step's
//    embedding reads it, and writes the answer straight into pinned host memory, so no copy
//    follows the step.
// The full sorts the radix select replaced cost about 100 us a token at top-k 40 in place (8B:
// sampled generation at 493 tok/s against 527 greedy); it passes over the keys once per 8 bits
// until the m-th is isolated (bench_elementwise: 15 us for the 40 best of 128256 logits, 10 for
// the best).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "backend/cuda/cuda_check.cuh"
#include "backend/cuda/ieee_float.cuh"
#include "backend/cuda/ops.cuh"
#include "backend/cuda/warp_reduce.cuh"
#include "backend/vocab_draw.h"

namespace nt::cuda {

namespace {

constexpr int kBlockThreads = 512;
constexpr int kMergeThreads = 1024;
constexpr int kMinChunk = 1024, kMaxChunk = 16384;  // positions a block of kernel 1 sorts

// From the bits alone (no float compare, which flushes subnormals under -ftz): -0 and +0 are
// one logit to the sampler, so both take +0's key.
__device__ __forceinline__ bool is_nan_bits(uint32_t u) {
    return (u & 0x7FFFFFFFu) > 0x7F800000u;
}
__device__ __forceinline__ unsigned long long logit_key(uint32_t u, int32_t id) {
    if ((u & 0x7FFFFFFFu) == 0) u = 0;
    const uint32_t ord = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return (static_cast<unsigned long long>(ord) << 32) | (0xFFFFFFFFu - static_cast<uint32_t>(id));
}

// Sorts s[0..n) (n a power of two) into descending order; every thread of the block calls it.
__device__ void bitonic_sort_desc(unsigned long long* s, int n) {
    __syncthreads();
    for (int k = 2; k <= n; k <<= 1)
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int i = threadIdx.x; i < n; i += blockDim.x) {
                const int p = i ^ j;
                if (p > i) {
                    const unsigned long long a = s[i], b = s[p];
                    // Descending runs where (i & k) == 0, ascending elsewhere: the last merge
                    // (k == n) leaves the whole array descending.
                    if (((i & k) == 0) == (a < b)) {
                        s[i] = b;
                        s[p] = a;
                    }
                }
            }
            __syncthreads();
        }
}

// The smallest of the m best nonzero keys of s[0..n) (1 when there are at most m), found 8 bits
// at a time from the top: every thread of the block calls it; keys are distinct.
__device__ unsigned long long mth_best_key(const unsigned long long* s, int n, int m) {
    __shared__ unsigned int hist[256];
    __shared__ unsigned long long sh_prefix;
    __shared__ int sh_need, sh_done;
    unsigned long long prefix = 0, mask = 0;
    int need = m;
    for (int shift = 56; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
        __syncthreads();
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            const unsigned long long k = s[i];
            if (k != 0 && (k & mask) == prefix) atomicAdd(&hist[(k >> shift) & 255], 1u);
        }
        __syncthreads();
        if (threadIdx.x < 32) {
            // Lane l counts bins 255 - 8l down to 248 - 8l; the lane whose run holds the need-th
            // key from the top picks its bin.
            const int lane = threadIdx.x;
            unsigned c[8], run = 0;
#pragma unroll
            for (int j = 0; j < 8; j++) run += c[j] = hist[255 - 8 * lane - j];
            unsigned incl = run;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const unsigned v = __shfl_up_sync(0xffffffffu, incl, o);
                if (lane >= o) incl += v;
            }
            const unsigned above = incl - run, all = __shfl_sync(0xffffffffu, incl, 31);
            if (shift == 56 && all <= unsigned(need)) {
                if (lane == 0) sh_done = 1, sh_prefix = 1;
            } else if (above < unsigned(need) && unsigned(need) <= incl) {
                unsigned a = above;
                int j = 0;
                while (a + c[j] < unsigned(need)) a += c[j++];
                const unsigned long long p =
                    prefix | (static_cast<unsigned long long>(255 - 8 * lane - j) << shift);
                sh_prefix = p;
                sh_need = need - int(a);
                sh_done = a + c[j] == unsigned(need);  // the whole bin is in: every key from p up
            }
        }
        __syncthreads();
        if (sh_done) return sh_prefix;
        prefix = sh_prefix;
        need = sh_need;
        mask |= 0xFFull << shift;
    }
    return prefix;  // not reached: at the last digit a bin holds one key
}
// The block's maximum key; valid in every thread.
__device__ unsigned long long block_max_key(unsigned long long v) {
    __shared__ unsigned long long red[32];
    return detail::block_reduce(v, red, 0ull, detail::WarpMax{});
}

// Where the kernels find row y of a launch: row asks[y].row of the logits and its m, or (asks
// null: logit_choose) the launch's one row and m; the row's scratch; and (logit_choose) the
// draw whose logit bias applies to the row.
struct SelectRows {
    const float* logits;
    int n_vocab, m;
    const LogitAsk* asks;
    unsigned long long* keys;  // kMergeKeys a row
    int* nan;                  // nan_stride a row
    int nan_stride;
    const TokenDraw* draw;

    __device__ const float* row(int y) const {
        return asks ? logits + size_t(asks[y].row) * size_t(n_vocab) : logits;
    }
    __device__ int best(int y) const { return asks ? asks[y].m : m; }
    __device__ unsigned long long* row_keys(int y) const { return keys + size_t(y) * kMergeKeys; }
    __device__ int* row_nan(int y) const { return nan + size_t(y) * size_t(nan_stride); }
};

// Writes the nonzero keys of s[0..n) from t up to out[0..) in any order; returns how many, in
// every thread. Every thread of the block calls it.
__device__ int keep_from(const unsigned long long* s, int n, unsigned long long t,
                         unsigned long long* out) {
    __shared__ int kept;
    if (threadIdx.x == 0) kept = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        if (s[i] >= t && s[i] != 0) out[atomicAdd(&kept, 1)] = s[i];
    __syncthreads();
    return kept;
}

// Whether any of flags[0..n) is set, in every thread. Every thread of the block calls it.
__device__ bool any_flag(const int* flags, int n) {
    bool any = false;
    for (int i = threadIdx.x; i < n; i += blockDim.x) any |= flags[i] != 0;
    return __syncthreads_or(any);
}

// Kernel 1: block (b, y) takes positions [b * chunk, (b + 1) * chunk) of row y and writes its m
// best keys to the row's keys[b * m ..] (0 where the block has fewer) and whether it saw a NaN
// to the row's nan[b]. Dynamic shared memory: chunk keys where any row's m is above 1.
__global__ void __launch_bounds__(kBlockThreads) select_block_best(SelectRows r, int chunk) {
    extern __shared__ unsigned long long s[];
    __shared__ int32_t bias_id[kMaxDrawBias];
    __shared__ float bias[kMaxDrawBias];
    const int y = blockIdx.y, m = r.best(y), n_vocab = r.n_vocab;
    const float* row = r.row(y);
    const int base = blockIdx.x * chunk;
    const int n_bias = r.draw ? r.draw->n_bias : 0;
    if (n_bias > 0) {
        if (threadIdx.x < n_bias) {
            bias_id[threadIdx.x] = r.draw->bias_id[threadIdx.x];
            bias[threadIdx.x] = r.draw->bias[threadIdx.x];
        }
        __syncthreads();
    }
    bool nan = false;
    unsigned long long best = 0;
    for (int i = threadIdx.x; i < chunk; i += blockDim.x) {
        const int id = base + i;
        unsigned long long key = 0;
        if (id < n_vocab) {
            float v = row[id];
            if (is_nan_bits(__float_as_uint(v))) {
                nan = true;
            } else {
                // The bias in the host sampler's order and rounding (a NaN is flagged unbiased).
                for (int j = 0; j < n_bias; j++)
                    if (bias_id[j] == id) v = add_rn(v, bias[j]);
                key = logit_key(__float_as_uint(v), id);
            }
        }
        if (m == 1)
            best = max(best, key);
        else
            s[i] = key;
    }
    nan = __syncthreads_or(nan);
    if (threadIdx.x == 0) r.row_nan(y)[blockIdx.x] = nan;
    unsigned long long* out = r.row_keys(y) + size_t(blockIdx.x) * m;
    if (m == 1) {
        best = block_max_key(best);
        if (threadIdx.x == 0) *out = best;
        return;
    }
    const int kept = keep_from(s, chunk, mth_best_key(s, chunk, m), out);
    for (int i = kept + threadIdx.x; i < m; i += blockDim.x) out[i] = 0;  // fewer than m
}

// The m best of the n_keys block candidates into best[0..p), best first, p the power of two
// from m (0 past the candidates); s: room for n_keys keys. Every thread of the block calls it.
__device__ void merge_best(const unsigned long long* keys, int n_keys, int m,
                           unsigned long long* s, unsigned long long* best) {
    for (int i = threadIdx.x; i < n_keys; i += blockDim.x) s[i] = keys[i];
    __syncthreads();
    const unsigned long long t = mth_best_key(s, n_keys, m);
    int p = 1;
    while (p < m) p <<= 1;
    for (int i = threadIdx.x; i < p; i += blockDim.x) best[i] = 0;
    keep_from(s, n_keys, t, best);  // its first barrier orders the zeros before the keys
    bitonic_sort_desc(best, p);
}

// A key's logit and token (logit_selection_unpack's decoding).
__device__ __forceinline__ float key_logit(unsigned long long key) {
    const uint32_t ord = uint32_t(key >> 32);
    return __uint_as_float((ord & 0x80000000u) ? (ord & 0x7FFFFFFFu) : ~ord);
}
__device__ __forceinline__ int32_t key_id(unsigned long long key) {
    return int32_t(0xFFFFFFFFu - uint32_t(key & 0xFFFFFFFFu));
}
// The draws' float arithmetic is the host's (ieee_float.cuh): this file is compiled with
// --use_fast_math, whose -ftz would flush subnormals in float operations and conversions (a
// weight of exp(-88) or less is one, at a low temperature, and the host's sums count it).
// exp of a float, rounded to float from the double exp, as the host's sampler computes it
// (the library's float exp is the fast approximation here).
__device__ __forceinline__ float exp_rounded(float x) {
    return narrow_rn(exp(widen(x)));
}

// Sampler::sample's chain over the sorted candidates best[0..m) (top-k done): top-p at
// temperature 1, min-p, then the temperature and the draw with d.u, each sum in the host's
// order with the host's roundings (no fused multiply-adds). The exps are taken by the whole
// block into p1 (temperature 1) and pt (temperature d.temperature), the sums by thread 0, which
// alone returns the token. Every thread of the block calls it.
__device__ int32_t draw_chain(const unsigned long long* best, int m, const TokenDraw& d,
                              float* p1, float* pt) {
    const float max_l = key_logit(best[0]);
    for (int i = threadIdx.x; i < m; i += blockDim.x) {
        const float x = sub_rn(key_logit(best[i]), max_l);
        p1[i] = exp_rounded(x);
        pt[i] = exp_rounded(div_rn(x, d.temperature));
    }
    __syncthreads();
    if (threadIdx.x != 0) return 0;
    int n = 0;
    while (n < m && best[n] != 0) n++;  // a row with NaN (flagged) may hold fewer
    if (n == 0) return 0;
    if (d.top_p < 1.f) {
        double z = 0.0;
        for (int i = 0; i < n; i++) z = __dadd_rn(z, widen(p1[i]));
        const double inv_z = __ddiv_rn(1.0, z);
        double cum = 0.0;
        for (int i = 0; i < n; i++) {
            cum = __dadd_rn(cum, __dmul_rn(widen(p1[i]), inv_z));
            if (cum >= double(d.top_p)) {
                n = i + 1;
                break;
            }
        }
    }
    if (d.min_p > 0.f) {
        const float min_logit = add_rn(max_l, d.log_min_p);
        int i = 1;  // the most likely token always stays
        while (i < n && ge_exact(key_logit(best[i]), min_logit)) i++;
        n = i;
    }
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum = __dadd_rn(sum, widen(pt[i]));
    double run = 0.0;
    return key_id(
        best[walk_level([&](int i) { return widen(pt[i]); }, n, __dmul_rn(sum, d.u), run)]);
}

// Kernel 2, block y: row y's m best of its n_blocks blocks' candidates, best first, the logits of
// its asked ids, and its NaN flag, into out[y].
__global__ void __launch_bounds__(kMergeThreads)
    select_merge(SelectRows r, int n_blocks, LogitSelection* out) {
    extern __shared__ unsigned long long s[];
    __shared__ unsigned long long best[kMaxLogitCandidates];
    const int y = blockIdx.x, m = r.best(y);
    const bool nan = any_flag(r.row_nan(y), n_blocks);
    const float* row = r.row(y);
    const LogitIds& ids = r.asks[y].ids;
    out += y;
    for (int i = threadIdx.x; i < ids.n; i += blockDim.x) out->id_logit[i] = row[ids.id[i]];
    merge_best(r.row_keys(y), n_blocks * m, m, s, best);
    for (int i = threadIdx.x; i < m; i += blockDim.x) out->key[i] = best[i];
    if (threadIdx.x == 0) out->nan = nan;
}

// Kernel 2 of logit_choose: the m best of the block candidates, the token drawn from them as
// LogitChoice says, and the answer in the ring.
__global__ void __launch_bounds__(kMergeThreads)
    choose_merge(SelectRows r, int n_blocks, LogitChoice c) {
    extern __shared__ unsigned long long s[];
    __shared__ unsigned long long best[kMaxLogitCandidates];
    __shared__ float p1[kMaxLogitCandidates], pt[kMaxLogitCandidates];
    __shared__ LogitSelection* out;
    const int m = r.m;
    const bool nan = any_flag(r.row_nan(0), n_blocks);
    merge_best(r.row_keys(0), n_blocks * m, m, s, best);
    const TokenDraw& d = *c.draw;
    const bool greedy = m == 1 || !(d.temperature > 0.f) || best[0] == 0;
    const int32_t drawn = greedy ? 0 : draw_chain(best, m, d, p1, pt);
    if (threadIdx.x == 0) {
        const int count = *c.count;
        out = c.ring + count % c.ring_size;
        const int32_t token = best[0] == 0 ? 0 : greedy ? key_id(best[0]) : drawn;
        out->nan = nan;
        out->token = token;
        *c.fed = token;
        *c.count = count + 1;
        *c.pos += 1;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < m; i += blockDim.x) out->key[i] = best[i];
}

// ---- The draw over the whole vocabulary (TokenDraw::top_k 0), as vocab_draw.h defines it ----
// Kernel 1 (select_block_best, one best per block of kDrawBlock ids) leaves each block's
// maximum and NaN flag; whole_sums (a block per kDrawBlock ids) takes the row's maximum from
// those, its ids' weights, its run sums and its block sum, and copies the row into the ring for
// the host's check; whole_pick (one warp) sums the blocks, walks block -> run -> id and answers.

// Token id's weight: its logit, biased as kernel 1 biased it, at the host's roundings.
__device__ __forceinline__ float whole_weight(const SelectRows& r, int id, float max_l, float floor,
                                              float temperature) {
    const TokenDraw& d = *r.draw;
    float v = r.logits[id];
    for (int j = 0; j < d.n_bias; j++)
        if (d.bias_id[j] == id) v = add_rn(v, d.bias[j]);
    if (!ge_exact(v, floor)) return 0.f;  // (a NaN, flagged by kernel 1, too)
    return exp_rounded(div_rn(sub_rn(v, max_l), temperature));
}

// The row's maximum and min-p's floor from kernel 1's block maxima; every thread of the block
// calls it (a single warp, or a block of whole warps).
struct WholeMax {
    unsigned long long key;
    float logit, floor;
};
__device__ WholeMax whole_max(const SelectRows& r, int n_blocks) {
    unsigned long long k = 0;
    for (int i = threadIdx.x; i < n_blocks; i += blockDim.x) k = max(k, r.row_keys(0)[i]);
    k = blockDim.x == 32 ? detail::warp_max(k) : block_max_key(k);
    const TokenDraw& d = *r.draw;
    const float m = key_logit(k);
    return {k, m, d.min_p > 0.f ? add_rn(m, d.log_min_p) : -INFINITY};
}

__global__ void __launch_bounds__(kDrawBlock)
    whole_sums(SelectRows r, int n_blocks, WholeDrawScratch w, LogitChoice c) {
    __shared__ float p[kDrawBlock];
    __shared__ double run_sum[kDrawBlockRuns];
    const WholeMax m = whole_max(r, n_blocks);
    const int id = blockIdx.x * kDrawBlock + threadIdx.x;
    float x = 0.f;
    if (id < r.n_vocab) {
        // The row as the step left it, for the host's check (the slot this choice answers in).
        w.rows[size_t(*c.count % c.ring_size) * size_t(r.n_vocab) + size_t(id)] = r.logits[id];
        x = whole_weight(r, id, m.logit, m.floor, r.draw->temperature);
    }
    p[threadIdx.x] = x;
    __syncthreads();
    const int warp = threadIdx.x / 32;
    if (threadIdx.x % 32 == 0) {
        double s = 0.0;
        for (int i = 0; i < kDrawRun; i++) s = __dadd_rn(s, widen(p[warp * kDrawRun + i]));
        run_sum[warp] = s;
        w.run_sums[blockIdx.x * kDrawBlockRuns + warp] = s;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        double s = 0.0;
        for (int i = 0; i < kDrawBlockRuns; i++) s = __dadd_rn(s, run_sum[i]);
        w.block_sums[blockIdx.x] = s;
    }
}

__global__ void __launch_bounds__(32)
    whole_pick(SelectRows r, int n_blocks, WholeDrawScratch w, LogitChoice c) {
    const TokenDraw& d = *c.draw;
    const WholeMax m = whole_max(r, n_blocks);
    bool nan = false;
    for (int i = threadIdx.x; i < n_blocks; i += 32) nan |= r.row_nan(0)[i] != 0;
    nan = __any_sync(0xffffffffu, nan);
    const bool finite = isfinite(m.logit);
    // Lane 0 walks the blocks and the block's runs; the run's weights are the lanes'.
    int run_index = 0;
    double run = 0.0, target = 0.0;
    if (threadIdx.x == 0 && finite) {
        double total = 0.0;
        for (int b = 0; b < n_blocks; b++) total = __dadd_rn(total, w.block_sums[b]);
        target = __dmul_rn(total, d.u);
        const int b = walk_level([&](int i) { return w.block_sums[i]; }, n_blocks, target, run);
        const double* runs = w.run_sums + b * kDrawBlockRuns;
        run_index = b * kDrawBlockRuns +
                    walk_level([&](int i) { return runs[i]; }, kDrawBlockRuns, target, run);
    }
    run_index = __shfl_sync(0xffffffffu, run_index, 0);
    const int id = run_index * kDrawRun + int(threadIdx.x);
    const float x = finite && id < r.n_vocab ? whole_weight(r, id, m.logit, m.floor, d.temperature) : 0.f;
    float weights[kDrawRun];
#pragma unroll
    for (int i = 0; i < kDrawRun; i++) weights[i] = __shfl_sync(0xffffffffu, x, i);
    if (threadIdx.x != 0) return;
    const int token =
        finite ? run_index * kDrawRun +
                     walk_level([&](int i) { return widen(weights[i]); }, kDrawRun, target, run)
               : 0;  // no finite logit: the host's check says so
    const int count = *c.count;
    LogitSelection* out = c.ring + count % c.ring_size;
    out->nan = nan;
    out->token = token;
    out->key[0] = m.key;
    *c.fed = token;
    *c.count = count + 1;
    *c.pos += 1;
}

// Positions a block of kernel 1 takes: the smallest power of two from kMinChunk whose blocks'
// candidates fit kernel 2 (0: none does).
int select_chunk(int n_vocab, int m) {
    for (int c = kMinChunk; c <= kMaxChunk; c <<= 1) {
        const int blocks = (n_vocab + c - 1) / c;
        if (int64_t(blocks) * m <= kMergeKeys) return c;
    }
    return 0;
}

}  // namespace

bool logit_select_fits(int n_vocab, int m) {
    return n_vocab > 0 && m >= 1 && m <= kMaxLogitCandidates && select_chunk(n_vocab, m) > 0;
}

void logit_select_init() {
    NT_CUDA_CHECK(
        cudaFuncSetAttribute(select_block_best, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             int(kMaxChunk * sizeof(unsigned long long))),
        "cudaFuncSetAttribute select_block_best");
    NT_CUDA_CHECK(cudaFuncSetAttribute(select_merge, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       int(kMergeKeys * sizeof(unsigned long long))),
                  "cudaFuncSetAttribute select_merge");
    NT_CUDA_CHECK(cudaFuncSetAttribute(choose_merge, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       int(kMergeKeys * sizeof(unsigned long long))),
                  "cudaFuncSetAttribute choose_merge");
}

int logit_select_nan_stride(int n_vocab) {
    return n_vocab / kMinChunk + 1;
}

namespace {
// Kernel 1 over n_rows rows of which the largest m is most_m: each block's m best into the
// rows' scratch; returns the number of blocks a row.
int select_blocks(const SelectRows& r, int n_rows, int most_m, cudaStream_t stream) {
    const int chunk = select_chunk(r.n_vocab, most_m);
    if (most_m < 1 || most_m > kMaxLogitCandidates || chunk == 0)
        fail("logit selection: %d best of %d logits do not fit the selection kernels.", most_m,
             r.n_vocab);
    const int blocks = (r.n_vocab + chunk - 1) / chunk;
    select_block_best<<<dim3(unsigned(blocks), unsigned(n_rows)), kBlockThreads,
                        most_m == 1 ? 0 : size_t(chunk) * sizeof(unsigned long long), stream>>>(
        r, chunk);
    NT_CUDA_CHECK(cudaGetLastError(), "logit selection kernel (blocks)");
    return blocks;
}
}  // namespace

void logit_select(const float* logits, int n_vocab, const LogitAsk* asks, int n_rows, int most_m,
                  unsigned long long* scratch_keys, int* scratch_nan, LogitSelection* out,
                  cudaStream_t stream) {
    if (n_rows < 1) return;
    const SelectRows r{logits,      n_vocab,     most_m, asks, scratch_keys,
                       scratch_nan, logit_select_nan_stride(n_vocab), nullptr};
    const int blocks = select_blocks(r, n_rows, most_m, stream);
    select_merge<<<n_rows, kMergeThreads,
                   size_t(blocks) * size_t(most_m) * sizeof(unsigned long long), stream>>>(
        r, blocks, out);
    NT_CUDA_CHECK(cudaGetLastError(), "logit selection kernel (merge)");
}

void logit_choose(const float* row, int n_vocab, int top_k, unsigned long long* scratch_keys,
                  int* scratch_nan, const LogitChoice& choice, cudaStream_t stream) {
    const SelectRows r{row,         n_vocab,     top_k, nullptr, scratch_keys,
                       scratch_nan, logit_select_nan_stride(n_vocab), choice.draw};
    const int blocks = select_blocks(r, 1, top_k, stream);
    choose_merge<<<1, kMergeThreads, size_t(blocks) * size_t(top_k) * sizeof(unsigned long long),
                   stream>>>(r, blocks, choice);
    NT_CUDA_CHECK(cudaGetLastError(), "token choice kernel (merge)");
}

void logit_choose_whole(const float* row, int n_vocab, unsigned long long* scratch_keys,
                        int* scratch_nan, const WholeDrawScratch& w, const LogitChoice& choice,
                        cudaStream_t stream) {
    static_assert(kMinChunk == kDrawBlock, "kernel 1's one-best blocks are the draw's blocks");
    const SelectRows r{row,         n_vocab,     1, nullptr, scratch_keys,
                       scratch_nan, logit_select_nan_stride(n_vocab), choice.draw};
    const int blocks = select_blocks(r, 1, 1, stream);
    if (blocks != (n_vocab + kDrawBlock - 1) / kDrawBlock)
        fail("token choice: %d logits are too many for a draw over the whole vocabulary.", n_vocab);
    whole_sums<<<blocks, kDrawBlock, 0, stream>>>(r, blocks, w, choice);
    NT_CUDA_CHECK(cudaGetLastError(), "token choice kernel (whole vocabulary, sums)");
    whole_pick<<<1, 32, 0, stream>>>(r, blocks, w, choice);
    NT_CUDA_CHECK(cudaGetLastError(), "token choice kernel (whole vocabulary, draw)");
}

void logit_selection_unpack(const LogitSelection& sel, int m, int n_ids, LogitCandidates& out) {
    out.top_id.clear();
    out.top_logit.clear();
    for (int i = 0; i < m; i++) {
        const unsigned long long key = sel.key[i];
        if (key == 0) break;  // the row had fewer candidates
        const uint32_t ord = uint32_t(key >> 32);
        const uint32_t u = (ord & 0x80000000u) ? (ord & 0x7FFFFFFFu) : ~ord;
        float v;
        std::memcpy(&v, &u, sizeof v);
        out.top_id.push_back(int32_t(0xFFFFFFFFu - uint32_t(key & 0xFFFFFFFFu)));
        out.top_logit.push_back(v);
    }
    out.id_logit.assign(sel.id_logit, sel.id_logit + n_ids);
    out.nan = sel.nan != 0;
}

}  // namespace nt::cuda
