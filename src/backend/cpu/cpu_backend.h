// The CPU backend: the reference every other backend is tested against, and a real execution
// site (all cores, quantized dot products with SIMD, batched tiles for prompts).
#pragma once
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "core/threadpool.h"

namespace nt {

class CpuBackend : public Backend {
  public:
    explicit CpuBackend(int n_threads = 0);
    ~CpuBackend() override;
    std::string name() const override { return "cpu"; }

    void init(const ModelShape& shape, int max_batch, int n_seq, int n_ctx) override;
    Activations& acts() override { return acts_; }
    void begin_step(const Batch& batch) override;
    void embed(const WeightView& tok_embd, float* x) override;
    void rmsnorm(const float* x, const WeightView& w, int n, int dim, float* out) override;
    void matmul(const WeightView& w, const float* x, int n, float* y) override;
    void rope(float* q, float* k) override;
    void attention(int layer, const float* q, const float* k, const float* v, float* out) override;
    void swiglu(const float* gate, const float* up, int64_t n, float* out) override;
    void add(float* x, const float* y, int64_t n) override;
    void gather_logit_rows(const float* x, int dim, float* dst) override;
    void download(const float* src, float* host_dst, size_t n) override;
    // The logits are host memory already: selects straight from them, no copy.
    void select_logits(const float* logits, int n_vocab, const std::vector<LogitRequest>& req,
                       std::vector<LogitCandidates>& out) override;
    void kv_truncate(int seq, int from) override;
    const void* upload_weight(const void* host, size_t) override { return host; }

    double measure_read_bandwidth() override;

    int threads() const { return pool_.size(); }
    ThreadPool& pool() { return pool_; }

  private:
    void rope_rows(float* x, int n_heads) const;

    ThreadPool pool_;
    ModelShape shape_;
    int max_batch_ = 0, n_seq_ = 0, n_ctx_ = 0;
    Activations acts_;
    std::vector<float, std::allocator<float>> act_storage_;
    // F16 KV cache: [layer][seq * n_ctx + pos][n_head_kv * head_dim].
    std::vector<uint16_t> k_cache_, v_cache_;
    Batch batch_;
    std::vector<float> rope_inv_freq_;  // per pair: freq_scale * base^(-2i/n_rot) / factor_i
    // Activations quantized for the current matmul input; reused while the same input feeds
    // several matrices (q/k/v, gate/up).
    std::vector<float> norm_scratch_;  // a non-F32 norm weight, expanded
    std::vector<uint8_t> qact_;
    const float* qact_src_ = nullptr;
    GgmlType qact_type_ = GgmlType::F32;
    int qact_rows_ = 0;
    int64_t qact_cols_ = 0;
};

}  // namespace nt
