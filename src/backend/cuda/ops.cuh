// The CUDA backend's kernels behind plain host launchers: elementwise ops (elementwise.cu) and
// attention (attention.cu). CudaBackend strings them together; the harnesses in bench/cuda call
// them directly. Every launcher only enqueues work on `stream` (no host synchronisation), so all
// of them can be captured into a CUDA graph; none launches anything when its row count is 0.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "backend/backend.h"
#include "backend/cuda/matmul.cuh"

namespace nt::cuda {

// ---- elementwise.cu ----------------------------------------------------------------------------

// True when embed/rmsnorm can read weights of this type.
bool elementwise_supports(GgmlType t);

// x[i] = row tokens[i] of tok_embd, dequantized (bit-identical to nt::dequantize_row); a token
// kFedToken is *fed (the token a logit selection chose on the device).
void embed(const WeightView& tok_embd, const int32_t* tokens, const int32_t* fed, int n, float* x,
           cudaStream_t stream);
// out[i] = x[i] / sqrt(mean(x[i]^2) + eps) * w for n rows of `dim`; out may be x.
void rmsnorm(const float* x, const WeightView& w, int n, int dim, float eps, float* out,
             cudaStream_t stream);
// x += y (y may be null), then out = rmsnorm(x) * w as rmsnorm() computes it, for n rows of
// `dim`; out may be x or y. When add_rmsnorm_fusable() this is one kernel that keeps each row
// in registers, and with `quant` it also writes out's int8 activations into the slot exactly
// as detail::quantize_q8(out, n, dim, quant->mode) would; it then returns true. Otherwise it
// runs add() and rmsnorm(), ignores `quant` and returns false. The choice depends only on the
// arguments, so it is the same whenever the same call is captured or run.
// pdl (here, for rope_kv_store and for attn_decode): the fused kernel is launched as a
// programmatic dependent (pdl.cuh): it starts while the kernel before finishes and waits for it
// before touching activations; only where nothing earlier in the stream writes its weights.
bool add_rmsnorm_fusable(const float* x, const float* y, const WeightView& w, int dim,
                         const float* out);
bool add_rmsnorm(float* x, const float* y, const WeightView& w, int n, int dim, float eps,
                 float* out, const ActivationSlot* quant, cudaStream_t stream, bool pdl = false);
// GGML "normal" rope in place on n rows of q [n_head][head_dim] and k [n_head_kv][head_dim]:
// pair (2j, 2j+1), j < n_rot/2, turns by pos[i] * inv_freq[j]. inv_freq is in device memory.
// `version`: 0 = best, 1 = a block per row looping over the pairs, 2 = a thread per pair (the
// harness compares them; all give the same bits).
void rope(float* q, float* k, const int32_t* pos, int n, int n_head, int n_head_kv, int head_dim,
          int n_rot, const float* inv_freq, cudaStream_t stream, int version = 0);
// rope on q and k (every pair: n_rot = head_dim) and, in the same kernel, kv_store of the
// turned k and of v into the F16 caches (k keeps its turned values too). The same bits as rope
// then kv_store.
void rope_kv_store(float* q, float* k, const float* v, const int32_t* pos, const int32_t* seq,
                   int n, int n_head, int n_head_kv, int head_dim, const float* inv_freq, int n_ctx,
                   __half* k_cache, __half* v_cache, cudaStream_t stream, bool pdl = false);
// out = silu(gate) * up; out may be gate or up.
void swiglu(const float* gate, const float* up, int64_t n, float* out, cudaStream_t stream);
// x += y.
void add(float* x, const float* y, int64_t n, cudaStream_t stream);
// dst[j] = x[rows[j]] for j < n (rows increasing); dst may be x itself (in-place compaction).
void gather_rows(const float* x, int dim, const int32_t* rows, int n, float* dst,
                 cudaStream_t stream);
// Streaming read of `bytes` bytes (a multiple of 16); sink receives one value per block so the
// reads cannot be optimised away. Used to measure memory bandwidth.
void read_bandwidth_kernel(const void* buf, size_t bytes, uint32_t* sink, int blocks,
                           cudaStream_t stream);

// ---- logit_select.cu ---------------------------------------------------------------------------

// What Backend::select_logits asks of one row and gets back, in device memory; a selection's
// keys encode (logit, id) as logit_select.cu describes.
constexpr int kMergeKeys = 8192;  // the blocks' candidates the merge sorts at most
struct LogitIds {
    int n = 0;
    int32_t id[kMaxLogitCandidates];
};
struct LogitAsk {
    int32_t row = 0;  // of the logits
    int m = 1;        // the best logits asked
    LogitIds ids;     // and the logits of these
};
struct LogitSelection {
    int nan;
    int token;  // logit_choose: the token drawn
    unsigned long long key[kMaxLogitCandidates];  // the m best, best first; 0: none
    float id_logit[kMaxLogitCandidates];
};
// Decoding fed on the device (CudaBackend, Batch::choose): the token drawn from the row as
// *draw says (device memory: the step's tables) goes into *fed, where the next step's
// embedding reads it; the answer (the token, the draw's top_k candidates and the NaN flag) into
// ring[*count % ring_size], a pinned host ring the kernel writes directly; then *count and *pos
// (the step tables' first position, so that the next fed step needs no upload) advance.
struct LogitChoice {
    int32_t* fed = nullptr;
    int* count = nullptr;
    LogitSelection* ring = nullptr;
    int ring_size = 0;
    int32_t* pos = nullptr;
    const TokenDraw* draw = nullptr;
};
// Whether logit_select takes the m best of a row of n_vocab.
bool logit_select_fits(int n_vocab, int m);
// Called once per process and device before the first launch (raises shared-memory limits).
void logit_select_init();
// The NaN flags a row of n_vocab logits needs in logit_select's scratch.
int logit_select_nan_stride(int n_vocab);
// For each of the n_rows asks[0..n_rows) (device memory; every m at most most_m, which
// logit_select_fits), the m best logits of its row of logits (rows of n_vocab), the logits of
// its ids and its NaN flag into out[i] (device memory); all rows in one pair of launches.
// Scratch for n_rows rows: scratch_keys n_rows * kMergeKeys keys, scratch_nan n_rows *
// logit_select_nan_stride(n_vocab) ints.
void logit_select(const float* logits, int n_vocab, const LogitAsk* asks, int n_rows, int most_m,
                  unsigned long long* scratch_keys, int* scratch_nan, LogitSelection* out,
                  cudaStream_t stream);
// A token of row[0..n_vocab) drawn as `choice` says, from the row's top_k best logits (top_k
// must equal choice.draw's, which the launch cannot read; 0 when the row has no candidate).
void logit_choose(const float* row, int n_vocab, int top_k, unsigned long long* scratch_keys,
                  int* scratch_nan, const LogitChoice& choice, cudaStream_t stream);
// The draw over the whole vocabulary (vocab_draw.h; choice.draw's top_k 0): its sums, and a ring
// of ring_size rows into which each choice copies the row it drew from, in its ring slot, for
// the host's check.
struct WholeDrawScratch {
    double* run_sums = nullptr;    // one a kDrawRun ids
    double* block_sums = nullptr;  // one a kDrawBlock ids
    float* rows = nullptr;         // ring_size * n_vocab
};
void logit_choose_whole(const float* row, int n_vocab, unsigned long long* scratch_keys,
                        int* scratch_nan, const WholeDrawScratch& w, const LogitChoice& choice,
                        cudaStream_t stream);
// A selection copied to the host, as Backend::select_logits answers.
void logit_selection_unpack(const LogitSelection& sel, int m, int n_ids, LogitCandidates& out);

// ---- attention.cu ------------------------------------------------------------------------------

// Layout of one layer's F16 KV cache (K and V separately): cell (seq * n_ctx + pos) holds the
// n_head_kv * head_dim values of that position, the same layout as the CPU backend's.
struct AttnShape {
    int n_head = 0, n_head_kv = 0, head_dim = 0, n_ctx = 0;
    int kv_dim() const { return n_head_kv * head_dim; }
    int q_dim() const { return n_head * head_dim; }
    int group() const { return n_head / n_head_kv; }
};

// A run of query rows of one sequence at consecutive positions: batch rows row0..row0+n_rows-1
// at positions pos0..pos0+n_rows-1 of sequence seq (n_rows <= kPrefillTileRows).
struct AttnTile {
    int32_t row0, n_rows, seq, pos0;
};
constexpr int kPrefillTileRows = 64;

// Whether the fast kernels (tiled split-K decode, tensor-core prefill) handle this shape; the
// generic decode kernel handles any head_dim <= 256 (even) and any group size.
bool attn_has_fast_decode(const AttnShape& s);
// exact: the prefill kernel with the CPU's arithmetic (decode's), for the prompt path of a
// backend set to it (CudaBackend::set_exact_prompt); it takes any group up to 64 query heads a KV
// head.
bool attn_has_prefill(const AttnShape& s, bool exact = false);

// Called once per process and device before the first launch (raises shared-memory limits).
void attn_init();

// Stores row i of k and v (f32, [n][kv_dim]) as F16 at cell seq[i] * n_ctx + pos[i].
void kv_store(const AttnShape& s, const float* k, const float* v, const int32_t* pos,
              const int32_t* seq, int n, __half* k_cache, __half* v_cache, cudaStream_t stream);

// How many pieces the decode kernel splits each (row, kv head)'s context into, for n_rows rows
// (enough blocks to fill the GPU). A function of the row count only, so a captured graph stays
// valid while positions change; blocks past a sequence's length exit at once.
int attn_decode_splits(const AttnShape& s, int n_rows, int sm_count);
// Floats of scratch the decode kernel needs for n_rows rows split `splits` ways (0 when 1 way).
size_t attn_decode_scratch_floats(const AttnShape& s, int n_rows, int splits);

// Causal attention for the batch rows listed in rows[0..n_rows): row r attends to positions
// 0..pos[r] of sequence seq[r] in the cache (split-K flash decoding, then a reduction).
// `done`: n_rows * n_head_kv ints, zero before the first call; each call leaves them zero (the
// tiled kernel's count of finished slices per (row, KV head); unused with one split).
// q and out are [batch][n_head * head_dim]. `version`: 0 = best for the shape, 1 = generic,
// 2 = tiled, 3 = tiled in its wide form (256 threads; what version 0 takes unless NT_ATTN_WIDE=0).
// The harness compares them.
// quant (optional): the tiled kernel also writes out's int8 activations into the slot, exactly
// as detail::quantize_q8(out, n_rows, q_dim, quant->mode) would, when every row of out is a
// decode row listed in rows; returns whether it did (it cannot where a kernel block's heads are
// not whole quantization blocks, or on the generic path).
// alone: the tiled kernel's blocks ask for most of a multiprocessor's shared memory, so that no
// CTA of the GEMV after them (a programmatic dependent, whose weight requests start at once)
// shares their multiprocessors.
// rope (optional, where attn_decode_fuses_rope): q as the GEMV left it, not yet turned; the kernel
// turns it, and turns rope->k and stores the newest position's k and v in the caches itself
// (what rope_kv_store does before an unfused call), with the same bits. Only then are the
// caches written.
struct RopeIn {
    const float* k = nullptr;  // [n_rows][kv_dim], not yet turned
    const float* v = nullptr;
    const float* inv_freq = nullptr;  // [head_dim / 2]: every pair turns
};
bool attn_decode(const AttnShape& s, const float* q, __half* k_cache, __half* v_cache,
                 const int32_t* pos, const int32_t* seq, const int32_t* rows, int n_rows,
                 int splits, float* scratch, int* done, float* out, cudaStream_t stream,
                 int version = 0, const ActivationSlot* quant = nullptr, bool pdl = false,
                 const RopeIn* rope = nullptr, bool alone = false);
// Whether attn_decode (version 0) can take a RopeIn: the tiled kernel, and one decode row (a
// row's newest position then is the only one its step writes: with several rows, one sequence's
// consecutive positions would need each other's cache cells within one launch).
bool attn_decode_fuses_rope(const AttnShape& s, int n_rows);

// Causal attention for whole tiles of consecutive positions (flash attention on tensor cores,
// online softmax, GQA). Needs attn_has_prefill(s, exact). exact: the CPU backend's arithmetic,
// as attn_decode computes it (the same bits as decode rows, far fewer reads of the cache).
void attn_prefill(const AttnShape& s, const float* q, const __half* k_cache, const __half* v_cache,
                  const AttnTile* tiles, int n_tiles, float* out, cudaStream_t stream,
                  bool exact = false);

}  // namespace nt::cuda
