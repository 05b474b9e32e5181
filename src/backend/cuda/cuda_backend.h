// The CUDA backend: every Backend op on one NVIDIA GPU (compute capability 8.0+). Memory is
// planned once in init() (F16 KV cache, activations for the largest batch, attention and
// matmul scratch) and checked against the free memory first; weights are uploaded into one
// reservation or per tensor. Decode steps (at most kGraphMaxBatch rows) are recorded once as a
// CUDA graph per (batch size, logit rows, token chosen on the device) and replayed: the step's
// tokens, positions and sequences live in device tables that begin_step refreshes, so the
// graph stays valid while they change. NT_CUDA_GRAPHS=0 in the environment turns graphs off (debugging,
// compute-sanitizer).
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <tuple>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/device_info.h"

namespace nt {

namespace cuda {
struct MatmulWorkspace;
struct LogitAsk;
struct LogitSelection;

// The bytes of each of a and b that CudaBackend::warm_weights requests into L2 (0: none), given
// NT_L2_WARM's setting (-1: unset) and the GPU's L2 size. Host arithmetic only.
int64_t l2_warm_bytes(const WeightView& a, const WeightView& b, int64_t setting, int64_t l2);
}  // namespace cuda

class CudaBackend : public Backend {
  public:
    static constexpr int kGraphMaxBatch = 8;  // steps of at most this many rows use CUDA graphs

    // Throws nt::Error when there is no usable GPU `device`.
    explicit CudaBackend(int device = 0);
    ~CudaBackend() override;
    CudaBackend(const CudaBackend&) = delete;
    CudaBackend& operator=(const CudaBackend&) = delete;

    std::string name() const override { return "cuda"; }
    void init(const ModelShape& shape, int max_batch, int n_seq, int n_ctx) override;
    Activations& acts() override { return acts_; }
    void begin_step(const Batch& batch) override;
    void embed(const WeightView& tok_embd, float* x) override;
    void rmsnorm(const float* x, const WeightView& w, int n, int dim, float* out) override;
    // One kernel for the add, the norm and, for a decode step whose next matmul quantizes its
    // activations (`next` a quantized type), that quantization (cuda::add_rmsnorm).
    void add_rmsnorm(float* x, const float* y, const WeightView& w, int n, int dim, float* out,
                     GgmlType next) override;
    void matmul(const WeightView& w, const float* x, int n, float* y) override;
    // Decode steps whose q/k/v do not stack into one launch: k and v on two side streams,
    // concurrently with q (cuda::matmul_qkv).
    void qkv(const WeightView& wq, const WeightView& wk, const WeightView& wv, const float* x,
             int n, float* q, float* k, float* v) override;
    void rope(float* q, float* k) override;
    void attention(int layer, const float* q, const float* k, const float* v, float* out) override;
    // One kernel turns q and k and stores k and v in the cache (cuda::rope_kv_store); at decode
    // the attention kernel also quantizes out for the next matmul (`next`).
    void rope_attention(int layer, float* q, float* k, const float* v, float* out,
                        GgmlType next) override;
    void swiglu(const float* gate, const float* up, int64_t n, float* out) override;
    void ffn_gate_up(const WeightView& w_gate, const WeightView& w_up, const float* x, int n,
                     float* gate, float* up, GgmlType next) override;
    // The next matmul, where it is a TMA GEMV launched as a programmatic dependent (the o
    // projection, during the attention), also requests the first bytes of a and b into L2
    // (MatmulWorkspace::warm): NT_L2_WARM bytes of each (0 none), by default by a's type and size.
    void warm_weights(const WeightView& a, const WeightView& b) override;
    void add(float* x, const float* y, int64_t n) override;
    void gather_logit_rows(const float* x, int dim, float* dst) override;
    void download(const float* src, float* host_dst, size_t n) override;
    // Selects on the GPU (cuda::logit_select) and copies back only the candidates.
    void select_logits(const float* logits, int n_vocab, const std::vector<LogitRequest>& req,
                       std::vector<LogitCandidates>& out) override;
    void kv_truncate(int seq, int from) override;
    const void* upload_weight(const void* host, size_t nbytes) override;
    void end_step() override;
    void wait() override;
    bool feeds_tokens() const override { return true; }
    int32_t take_token(LogitCandidates* from = nullptr,
                       std::vector<float>* row = nullptr) override;
    double measure_read_bandwidth() override;
    // Reserves device memory for all weights at once (the sum of their sizes, plus slack for
    // rounding each tensor up to 256 bytes); throws nt::Error naming both sizes when it does
    // not fit. Uploads then carve from it; without a reservation, or past its end, each upload
    // allocates for itself.
    void reserve_weights(size_t total_bytes) override;
    // Device bytes one upload of nbytes takes in a reservation (rounded up to 256).
    static size_t weight_footprint(size_t nbytes) { return (nbytes + 255) / 256 * 256; }

    // ---- beyond the Backend interface ----
    // Copies bytes from host memory to backend (device) memory and waits (tests, tools).
    void upload(void* dst, const void* host_src, size_t bytes);

    void set_graphs(bool on);
    bool graphs() const { return graphs_on_; }
    // Programmatic dependent launches for the GEMVs (on by default where the GPU has them).
    // Off for streamed layers, whose weights an earlier copy in the stream order writes.
    void set_pdl(bool on);
    // A decode step of one row turns q and k and stores the new K/V cell inside the attention
    // kernel rather than in a rope kernel before it (on unless NT_ROPE_FUSION=0; the same bits
    // either way). q and k are then left as the projections wrote them.
    void set_rope_fusion(bool on);
    // Prompt steps (more than kGraphMaxBatch rows) with the CPU backend's arithmetic: the
    // integer GEMM and the exact prefill attention, so that a prompt's outputs are the CPU's bits
    // as a decode step's always are (cuda::prompt_exact(): off unless NT_EXACT_PROMPT=1). About
    // 40% slower prompts on 8B Q4_K_M, and more at long contexts.
    void set_exact_prompt(bool on);
    bool exact() const override { return exact_prompt_; }
    struct GraphStats {
        int captures = 0;   // graphs recorded
        int replays = 0;    // steps served by a recorded graph
        int fallbacks = 0;  // steps that left their recorded op sequence and ran eagerly
    };
    const GraphStats& graph_stats() const { return stats_; }

    const CudaDeviceInfo& device() const { return dev_; }
    cudaStream_t stream() const { return stream_; }
    size_t kv_cache_bytes() const { return kv_bytes_; }
    // Context slices of the decode attention kernel for a step of n_rows decode rows.
    int decode_splits(int n_rows) const;

  private:
    enum class OpKind : int32_t {
        Embed,
        RmsNorm,
        AddRmsNorm,
        Matmul,
        Rope,
        Attention,
        RopeAttention,
        Swiglu,
        GateUp,
        Qkv,
        Add,
        Gather,
        WarmWeights,  // w and w2 into L2 by the next GEMV (MatmulWorkspace::warm)
        Choose        // the step's token, drawn on the device (Batch::choose, Batch::draw)
    };
    // One backend op with its arguments: executed at once, recorded into a graph, or compared
    // with the recorded sequence when a graph is replayed.
    struct Op {
        OpKind kind = OpKind::Embed;
        int32_t i0 = 0, i1 = 0;  // rows / layer / dim, by kind
        int64_t n = 0;           // element count (swiglu, add)
        const void* p[4] = {};
        WeightView w;
        WeightView w2;                  // gate_up: the up projection (w: the gate); qkv: wk
        WeightView w3;                  // qkv: wv
        GgmlType next = GgmlType::F32;  // add_rmsnorm: the next matmul's weight type
        bool operator==(const Op& o) const;
    };
    enum class Mode { Eager, Capture, Replay };
    struct Graph {
        cudaGraphExec_t exec = nullptr;
        std::vector<Op> ops;
        int failures = 0;  // steps that left `ops`; past a few the key stays eager
    };
    using GraphKey = std::tuple<int, int, int>;  // (batch rows, logit rows, top_k drawn from or 0)

    void submit(const Op& op);
    void attention_op(OpKind kind, int layer, const float* q, const float* k, const float* v,
                      float* out, GgmlType next);
    void run(const Op& op);
    void flush();             // ends a capture or replays the graph; afterwards the stream is eager
    void capture_failed();    // a capture broke: give up graphs for this key, run the step eagerly
    void leave_graph();       // the step left its recorded sequence: catch up eagerly
    void forget_quantized();  // the next matmul quantizes its activations whatever came before
    void drop_graphs();
    void release();  // frees everything init() allocated
    void require_init(const char* op) const;
    // cudaMalloc, or one sentence naming `what` and the `advice` where memory is short.
    void* device_alloc(size_t bytes, const char* what, const char* advice);
    void* alloc_weight(size_t bytes);

    CudaDeviceInfo dev_;
    cudaStream_t stream_ = nullptr;              // every op
    cudaStream_t copy_stream_ = nullptr;         // weight uploads
    cudaStream_t side_[2] = {nullptr, nullptr};  // q/k/v: k and v beside q
    cudaEvent_t fork_ = nullptr, join_[2] = {nullptr, nullptr};
    bool ready_ = false;

    ModelShape shape_;
    int max_batch_ = 0, n_seq_ = 0, n_ctx_ = 0, n_rot_ = 0;
    void* kv_ = nullptr;  // K cache then V cache, each [layer][seq * n_ctx + pos][kv_dim] F16
    size_t kv_bytes_ = 0;
    size_t kv_layer_elems_ = 0;
    void* scratch_ = nullptr;  // activations, step tables, rope table, attention and matmul scratch
    Activations acts_;
    float* rope_inv_freq_ = nullptr;
    float* attn_scratch_ = nullptr;
    int* attn_done_ = nullptr;  // decode attention's slice counters (zero between launches)
    std::unique_ptr<cuda::MatmulWorkspace> mm_;

    // The step's tables: device copies at fixed addresses (graphs bake them in), filled from
    // a pinned host mirror. Regions: tokens, pos, seq, logit rows, decode rows (int32 x
    // stride_ each, stride_ the step's rows rounded up to 4, so that a graph's key fixes the
    // layout and a decode step copies a few dozen bytes), the step's TokenDraw (kDrawInts), then
    // attention tiles (AttnTile x n_tiles_). tables_ is what the device holds, as far as the host knows (a choice
    // advances the first position there): a step whose tables equal it uploads nothing.
    int32_t* d_step_ = nullptr;
    int32_t* h_step_ = nullptr;
    size_t step_bytes_ = 0;
    cudaEvent_t step_uploaded_ = nullptr;
    std::vector<int32_t> tables_, staged_;
    bool tables_known_ = false;
    int stride_ = 0;
    int n_rows_ = 0, n_logits_ = 0, n_dec_ = 0, n_tiles_ = 0, splits_ = 1;
    // The step open now ends with a draw from its choose_k_ best logits, or (kChooseWhole) over
    // the whole vocabulary.
    static constexpr int kChooseWhole = -1;
    int choose_k_ = 0;

    float* h_download_ = nullptr;  // pinned bounce buffer for download()

    // select_logits, sel_rows_ rows at a time: the asks (pinned, and their device copy), device
    // scratch, the answers and their pinned copy.
    int sel_rows_ = 1;
    cuda::LogitAsk* h_asks_ = nullptr;
    cuda::LogitAsk* sel_asks_ = nullptr;
    unsigned long long* sel_keys_ = nullptr;
    int* sel_nan_ = nullptr;
    cuda::LogitSelection* sel_out_ = nullptr;
    cuda::LogitSelection* h_sel_ = nullptr;
    // Tokens chosen on the device (Batch::choose) and taken by take_token: a pinned ring of
    // kMaxChosen answers that the choice kernel writes directly (slot: the device's count of
    // choices made, which chosen_made_ mirrors), each with its event; the chosen token itself,
    // which kFedToken names in the next step.
    cuda::LogitSelection* h_chosen_ = nullptr;
    cuda::LogitSelection* h_chosen_on_device_ = nullptr;  // the same ring, as the kernel sees it
    int* chosen_on_device_ = nullptr;                      // the device's count of choices
    cudaEvent_t chosen_ready_[kMaxChosen] = {};
    int chosen_k_[kMaxChosen] = {};  // each answer's candidates (kChooseWhole: a row)
    // The draw over the whole vocabulary: its sums, and its rows, ring slot for slot with the
    // answers (cuda::WholeDrawScratch).
    double* whole_run_sums_ = nullptr;
    double* whole_block_sums_ = nullptr;
    float* whole_rows_ = nullptr;
    float* h_row_ = nullptr;         // pinned: a row on its way to take_token's caller
    int64_t chosen_made_ = 0;
    int chosen_count_ = 0;  // made and not yet taken
    int32_t* fed_token_ = nullptr;

    struct Arena {
        char* base = nullptr;
        size_t size = 0, used = 0;
    };
    std::vector<Arena> arenas_;         // weight reservations (bump-allocated)
    std::vector<void*> weight_allocs_;  // per-tensor allocations made without a reservation
    void* h_upload_[2] = {nullptr, nullptr};
    cudaEvent_t upload_done_[2] = {nullptr, nullptr};

    bool pdl_allowed_ = true;
    bool pdl_supported_ = false;  // matmul_init's verdict for this GPU (and NT_PDL)
    bool graphs_on_ = true;
    bool rope_fusion_ = true;
    // attn_decode's `alone`: 1 where it wins (o in Q6_K), 0 never, 2 for every o (NT_ATTN_ALONE)
    int attn_alone_ = 1;
    int64_t l2_warm_ = -1;  // warm_weights' bytes (NT_L2_WARM), -1 by the weights' type and size
    bool l2_warm_after_ = false;  // requested after the o projection's wait (NT_L2_WARM_AFTER)
    // The prompt path's setting, which mm_->exact mirrors: the backend's own, because
    // matmul_free (release, before every init) resets the workspace.
    bool exact_prompt_ = false;
    Mode mode_ = Mode::Eager;
    std::map<GraphKey, Graph> graphs_;
    GraphKey key_{0, 0, 0};
    std::vector<Op> recording_;  // Capture: ops of this step, in order
    std::vector<Op> pending_;    // Replay: ops matched so far, not yet executed
    size_t replay_pos_ = 0;
    // The op run last left quantized activations in the matmul workspace (a matmul, or an
    // add_rmsnorm that quantized its output) and wrote nothing after them, so the next matmul may
    // reuse them (q/k/v and gate/up share one quantization, made by the norm before them).
    // Cleared at every break in the sequence.
    bool after_matmul_ = false;
    GraphStats stats_;
};

}  // namespace nt
