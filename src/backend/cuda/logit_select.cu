// The sampler's candidates selected where the logits are: a decode step copies back the k best
// logits of a row (and the logits of the few tokens the sampler changes) instead of the row,
// 513 KB for a 128k vocabulary, whose copy and host-side scan the GPU otherwise idles through.
//
// Each logit becomes a 64-bit key, its float bits made monotonic in the high word and the
// complement of its id in the low word, so that the larger key is the better candidate by the
// sampler's order (higher logit, then lower id) and no two keys are equal; 0 is no candidate
// (a NaN, or padding past the row). Two kernels:
// 1. blocks of C positions sort their keys in shared memory (bitonic) and keep their m best;
//    one best needs no sort, only a block maximum;
// 2. one block sorts the blocks' m best (at most kMergeKeys) and writes the m best of the row,
//    the logits of the asked ids and whether any block saw a NaN. For greedy decoding fed on
//    the device (logit_choose: one best, inside the step's graph) it writes the best token
//    where the next step's embedding reads it, and the answer straight into pinned host
//    memory, so no copy follows the step.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "backend/cuda/cuda_check.cuh"
#include "backend/cuda/ops.cuh"

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

// The block's maximum key; valid in every thread.
__device__ unsigned long long block_max_key(unsigned long long v) {
    __shared__ unsigned long long red[32];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = lane < int(blockDim.x / 32) ? red[lane] : 0ull;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Kernel 1: block b takes positions [b * chunk, (b + 1) * chunk) and writes its m best keys to
// keys[b * m ..] (0 where the block has fewer) and whether it saw a NaN to nan_blk[b].
__global__ void __launch_bounds__(kBlockThreads)
    select_block_best(const float* row, int n_vocab, int chunk, int m, unsigned long long* keys,
                      int* nan_blk) {
    extern __shared__ unsigned long long s[];
    const int base = blockIdx.x * chunk;
    bool nan = false;
    unsigned long long best = 0;
    for (int i = threadIdx.x; i < chunk; i += blockDim.x) {
        const int id = base + i;
        unsigned long long key = 0;
        if (id < n_vocab) {
            const uint32_t u = __float_as_uint(row[id]);
            if (is_nan_bits(u))
                nan = true;
            else
                key = logit_key(u, id);
        }
        if (m == 1)
            best = max(best, key);
        else
            s[i] = key;
    }
    nan = __syncthreads_or(nan);
    if (threadIdx.x == 0) nan_blk[blockIdx.x] = nan;
    if (m == 1) {
        best = block_max_key(best);
        if (threadIdx.x == 0) keys[blockIdx.x] = best;
        return;
    }
    bitonic_sort_desc(s, chunk);
    for (int i = threadIdx.x; i < m; i += blockDim.x) keys[size_t(blockIdx.x) * m + i] = s[i];
}

// Kernel 2: the m best of the n_keys block candidates (n a power of two >= n_keys), the logits
// of the asked ids, and the NaN flag of the n_blocks blocks.
__global__ void __launch_bounds__(kMergeThreads)
    select_merge(const unsigned long long* keys, int n_keys, int n, int m, const int* nan_blk,
                 int n_blocks, const float* row, LogitIds ids, LogitSelection* out) {
    extern __shared__ unsigned long long s[];
    for (int i = threadIdx.x; i < n; i += blockDim.x) s[i] = i < n_keys ? keys[i] : 0ull;
    bool nan = false;
    for (int i = threadIdx.x; i < n_blocks; i += blockDim.x) nan |= nan_blk[i] != 0;
    nan = __syncthreads_or(nan);
    for (int i = threadIdx.x; i < ids.n; i += blockDim.x) out->id_logit[i] = row[ids.id[i]];
    bitonic_sort_desc(s, n);
    for (int i = threadIdx.x; i < m; i += blockDim.x) out->key[i] = s[i];
    if (threadIdx.x == 0) out->nan = nan;
}
// Kernel 2 of logit_choose: the best of the n_keys block maxima, as LogitChoice says.
__global__ void __launch_bounds__(kMergeThreads)
    choose_merge(const unsigned long long* keys, int n_keys, const int* nan_blk, LogitChoice c) {
    unsigned long long best = 0;
    bool nan = false;
    for (int i = threadIdx.x; i < n_keys; i += blockDim.x) {
        best = max(best, keys[i]);
        nan |= nan_blk[i] != 0;
    }
    nan = __syncthreads_or(nan);
    best = block_max_key(best);
    if (threadIdx.x == 0) {
        const int count = *c.count;
        LogitSelection* out = c.ring + count % c.ring_size;
        out->key[0] = best;
        out->nan = nan;
        *c.fed = best ? int32_t(0xFFFFFFFFu - uint32_t(best & 0xFFFFFFFFu)) : 0;
        *c.count = count + 1;
        *c.pos += 1;
    }
}

int pow2_at_least(int n) {
    int p = 1;
    while (p < n) p <<= 1;
    return p;
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
}

void logit_select(const float* row, int n_vocab, int m, const LogitIds& ids,
                  unsigned long long* scratch_keys, int* scratch_nan, LogitSelection* out,
                  cudaStream_t stream) {
    const int chunk = select_chunk(n_vocab, m);
    if (m < 1 || m > kMaxLogitCandidates || chunk == 0 || ids.n < 0 || ids.n > kMaxLogitCandidates)
        fail("logit selection: %d best of %d logits do not fit the selection kernels.", m, n_vocab);
    const int blocks = (n_vocab + chunk - 1) / chunk;
    select_block_best<<<blocks, kBlockThreads,
                        m == 1 ? 0 : size_t(chunk) * sizeof(unsigned long long), stream>>>(
        row, n_vocab, chunk, m, scratch_keys, scratch_nan);
    NT_CUDA_CHECK(cudaGetLastError(), "logit selection kernel (blocks)");
    const int n_keys = blocks * m, n = pow2_at_least(n_keys);
    select_merge<<<1, kMergeThreads, size_t(n) * sizeof(unsigned long long), stream>>>(
        scratch_keys, n_keys, n, m, scratch_nan, blocks, row, ids, out);
    NT_CUDA_CHECK(cudaGetLastError(), "logit selection kernel (merge)");
}

void logit_choose(const float* row, int n_vocab, unsigned long long* scratch_keys,
                  int* scratch_nan, const LogitChoice& choice, cudaStream_t stream) {
    const int chunk = select_chunk(n_vocab, 1);
    if (chunk == 0 || n_vocab < 1)
        fail("logit selection: the best of %d logits does not fit the selection kernels.",
             n_vocab);
    const int blocks = (n_vocab + chunk - 1) / chunk;
    select_block_best<<<blocks, kBlockThreads, 0, stream>>>(row, n_vocab, chunk, 1, scratch_keys,
                                                            scratch_nan);
    NT_CUDA_CHECK(cudaGetLastError(), "token choice kernel (blocks)");
    choose_merge<<<1, kMergeThreads, 0, stream>>>(scratch_keys, blocks, scratch_nan, choice);
    NT_CUDA_CHECK(cudaGetLastError(), "token choice kernel (merge)");
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
