#include "backend/cpu/cpu_backend.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/f16.h"
#include "quant/quant.h"

namespace nt {

namespace {

// F16 -> F32 through a table: the attention inner loops read the F16 cache constantly.
const float* f16_table() {
    static const std::vector<float> table = [] {
        std::vector<float> t(65536);
        for (uint32_t i = 0; i < 65536; i++) t[i] = f16_to_f32(uint16_t(i));
        return t;
    }();
    return table.data();
}

}  // namespace

CpuBackend::CpuBackend(int n_threads) : pool_(n_threads) { f16_table(); }
CpuBackend::~CpuBackend() = default;

void CpuBackend::init(const ModelShape& shape, int max_batch, int n_seq, int n_ctx) {
    shape_ = shape;
    max_batch_ = max_batch;
    n_seq_ = n_seq;
    n_ctx_ = n_ctx;
    const int64_t qdim = int64_t(shape.n_head) * shape.head_dim;
    const int64_t kvdim = int64_t(shape.n_head_kv) * shape.head_dim;
    const int64_t widths[] = {shape.n_embd, shape.n_embd, qdim, kvdim, kvdim, qdim,
                              shape.n_ff,   shape.n_ff};
    int64_t total = 0;
    for (int64_t w : widths) total += w * max_batch;
    total += int64_t(shape.n_vocab) * max_batch;
    act_storage_.assign(size_t(total), 0.f);
    float* p = act_storage_.data();
    float** slots[] = {&acts_.x, &acts_.xn, &acts_.q, &acts_.k, &acts_.v, &acts_.att, &acts_.gate, &acts_.up};
    for (size_t i = 0; i < 8; i++) {
        *slots[i] = p;
        p += widths[i] * max_batch;
    }
    acts_.logits = p;
    acts_.max_batch = max_batch;

    const size_t kv_elems = size_t(shape.n_layer) * size_t(n_seq) * size_t(n_ctx) * size_t(kvdim);
    k_cache_.assign(kv_elems, 0);
    v_cache_.assign(kv_elems, 0);

    const int n_rot = shape.rope.n_rot > 0 ? shape.rope.n_rot : shape.head_dim;
    rope_inv_freq_.resize(size_t(n_rot / 2));
    for (int i = 0; i < n_rot / 2; i++) {
        float f = shape.rope.freq_scale * std::pow(shape.rope.freq_base, -2.0f * float(i) / float(n_rot));
        if (!shape.rope.freq_factors.empty()) f /= shape.rope.freq_factors[size_t(i)];
        rope_inv_freq_[size_t(i)] = f;
    }
}

void CpuBackend::begin_step(const Batch& batch) {
    qact_src_ = nullptr;  // only back-to-back matmuls share a quantized input
    if (batch.size() > max_batch_) fail("batch of %d tokens exceeds the maximum of %d.", batch.size(), max_batch_);
    for (int i = 0; i < batch.size(); i++) {
        if (batch.seq[size_t(i)] < 0 || batch.seq[size_t(i)] >= n_seq_)
            fail("sequence id %d is out of range (0..%d).", batch.seq[size_t(i)], n_seq_ - 1);
        if (batch.pos[size_t(i)] < 0 || batch.pos[size_t(i)] >= n_ctx_)
            fail("position %d is outside the context of %d tokens.", batch.pos[size_t(i)], n_ctx_);
        if (batch.tokens[size_t(i)] < 0 || batch.tokens[size_t(i)] >= shape_.n_vocab)
            fail("token id %d is outside the vocabulary (%d tokens).", batch.tokens[size_t(i)], shape_.n_vocab);
    }
    batch_ = batch;
}

void CpuBackend::embed(const WeightView& tok_embd, float* x) {
    qact_src_ = nullptr;  // only back-to-back matmuls share a quantized input
    const size_t rb = row_bytes(tok_embd.type, tok_embd.cols);
    for (int i = 0; i < batch_.size(); i++) {
        const uint8_t* row = static_cast<const uint8_t*>(tok_embd.data) + size_t(batch_.tokens[size_t(i)]) * rb;
        dequantize_row(tok_embd.type, row, x + int64_t(i) * tok_embd.cols, tok_embd.cols);
    }
}

void CpuBackend::rmsnorm(const float* x, const WeightView& w, int n, int dim, float* out) {
    qact_src_ = nullptr;  // only back-to-back matmuls share a quantized input
    // Norm weights are F32 in every file we know; other types are expanded into scratch.
    const float* wf = static_cast<const float*>(w.data);
    if (w.type != GgmlType::F32) {
        norm_scratch_.resize(size_t(dim));
        dequantize_row(w.type, w.data, norm_scratch_.data(), dim);
        wf = norm_scratch_.data();
    }
    for (int i = 0; i < n; i++) {
        const float* xr = x + int64_t(i) * dim;
        float* o = out + int64_t(i) * dim;
        double sum = 0;  // ggml accumulates the mean square in double
        for (int j = 0; j < dim; j++) sum += double(xr[j]) * double(xr[j]);
        const float scale = 1.0f / std::sqrt(float(sum / dim) + shape_.norm_eps);
        for (int j = 0; j < dim; j++) o[j] = xr[j] * scale * wf[j];
    }
}

void CpuBackend::matmul(const WeightView& w, const float* x, int n, float* y) {
    const int64_t cols = w.cols, rows = w.rows;
    const GgmlType at = vec_dot_type(w.type);
    const void* act = x;
    size_t act_stride = size_t(cols) * sizeof(float);
    if (at != GgmlType::F32) {
        act_stride = row_bytes(at, cols);
        // q/k/v (and gate/up) read the same normalised input: quantize it once per step.
        if (!(qact_src_ == x && qact_type_ == at && qact_rows_ == n && qact_cols_ == cols)) {
            qact_.resize(act_stride * size_t(n));
            pool_.parallel_for(n, 1, [&](int64_t b, int64_t e, int) {
                for (int64_t i = b; i < e; i++)
                    quantize_row(at, x + i * cols, qact_.data() + size_t(i) * act_stride, cols);
            });
            qact_src_ = x;
            qact_type_ = at;
            qact_rows_ = n;
            qact_cols_ = cols;
        }
        act = qact_.data();
    }
    const size_t w_stride = row_bytes(w.type, cols);
    const uint8_t* wp = static_cast<const uint8_t*>(w.data);
    const uint8_t* ap = static_cast<const uint8_t*>(act);
    // Tiles of weight rows x activation rows: each weight block is loaded once per tile and
    // reused across the activation rows, which stay in cache.
    constexpr int kRowTile = 64;  // the quant kernels amortise activation preparation over >= 64 rows
    constexpr int kColTile = 64;
    // A few columns (decode): each chunk of rows the pool hands out in one call, so that the
    // GEMV kernels can read rows far apart as separate streams. Every output is computed the same
    // way however the rows and columns are split (the kernels are batch-invariant).
    const int64_t row_tiles = (rows + kRowTile - 1) / kRowTile;
    const bool few = n <= 8;
    pool_.parallel_for(row_tiles, 1, [&](int64_t b, int64_t e, int) {
        for (int64_t t = b; t < e; t++) {
            const int64_t r0 = t * kRowTile;
            const int64_t r1 = few ? std::min(rows, e * kRowTile) : std::min(rows, r0 + kRowTile);
            const int nr = int(r1 - r0);
            for (int c0 = 0; c0 < n; c0 += kColTile) {
                const int nc = std::min(kColTile, n - c0);
                vec_dot_tile(w.type, cols, nr, nc, wp + size_t(r0) * w_stride, w_stride,
                             ap + size_t(c0) * act_stride, act_stride, y + int64_t(c0) * rows + r0, size_t(rows));
            }
            if (few) break;
        }
    });
    // The output may be the next matmul's input: it must not match a stale cached quantization.
    if (y == qact_src_) qact_src_ = nullptr;
}

void CpuBackend::rope_rows(float* x, int n_heads) const {
    const int hd = shape_.head_dim;
    const int half = int(rope_inv_freq_.size());
    for (int i = 0; i < batch_.size(); i++) {
        const float p = float(batch_.pos[size_t(i)]);
        for (int j = 0; j < half; j++) {
            // One rounding of pos x frequency (ggml multiplies the angle up step by step, which
            // drifts by ~1e-3 rad at long positions; the CUDA kernel computes it as here).
            const float theta = p * rope_inv_freq_[size_t(j)];
            // cos and sin in double, rounded once: the float result of the exact value (all but
            // never a last-bit tie), which any backend's double-precision sincos also gives.
            const float c = float(std::cos(double(theta))), s = float(std::sin(double(theta)));
            for (int h = 0; h < n_heads; h++) {
                float* v = x + (int64_t(i) * n_heads + h) * hd + 2 * j;
                const float a = v[0], b = v[1];
                v[0] = a * c - b * s;
                v[1] = a * s + b * c;
            }
        }
    }
}

void CpuBackend::rope(float* q, float* k) {
    qact_src_ = nullptr;  // only back-to-back matmuls share a quantized input
    rope_rows(q, shape_.n_head);
    rope_rows(k, shape_.n_head_kv);
}

void CpuBackend::attention(int layer, const float* q, const float* k, const float* v, float* out) {
    qact_src_ = nullptr;  // only back-to-back matmuls share a quantized input
    const int hd = shape_.head_dim;
    const int n_head = shape_.n_head, n_kv = shape_.n_head_kv;
    const int64_t kvdim = int64_t(n_kv) * hd;
    const size_t layer_off = size_t(layer) * size_t(n_seq_) * size_t(n_ctx_) * size_t(kvdim);
    uint16_t* kc = k_cache_.data() + layer_off;
    uint16_t* vc = v_cache_.data() + layer_off;
    const int B = batch_.size();
    for (int i = 0; i < B; i++) {
        const size_t cell = size_t(batch_.seq[size_t(i)]) * size_t(n_ctx_) + size_t(batch_.pos[size_t(i)]);
        for (int64_t j = 0; j < kvdim; j++) {
            kc[cell * size_t(kvdim) + size_t(j)] = f32_to_f16(k[int64_t(i) * kvdim + j]);
            vc[cell * size_t(kvdim) + size_t(j)] = f32_to_f16(v[int64_t(i) * kvdim + j]);
        }
    }
    const float* tab = f16_table();
    // The arithmetic, which the CUDA backend reproduces bit for bit in its own order (tiles of
    // kAttnChunk positions spread over blocks and merged): each score a float sum of float
    // products, d = 0..hd-1 in order; then chunk by chunk of kAttnChunk positions (from
    // position 0): the chunk's max m, e = exp(s - m) in double rounded to float, the chunk's
    // P*V a float sum over its positions in order, and its sum of e in double; the chunks meet
    // in double (rescaled to the largest max), and each output rounds to float once. What is
    // summed in float has one order on both backends; what the GPU sums in another order is
    // summed in double, where the order moves a result by about 1e-16 of itself, far below the
    // float it rounds to. (With 8-bit activations one last bit anywhere moves the rest of the
    // pass: a score sum in another order alone cost 3% of top-1 agreement with this code.)
    const float scale = 1.0f / std::sqrt(float(hd));
    const int group = n_head / n_kv;
    pool_.parallel_for(int64_t(B) * n_head, 1, [&](int64_t b, int64_t e, int) {
        float s[kAttnChunk], pv[kAttnMaxHd];
        double acc[kAttnMaxHd];
        for (int64_t t = b; t < e; t++) {
            const int i = int(t / n_head), h = int(t % n_head);
            const int kvh = h / group;
            const int len = batch_.pos[size_t(i)] + 1;
            const size_t base = size_t(batch_.seq[size_t(i)]) * size_t(n_ctx_);
            const float* qr = q + (int64_t(i) * n_head + h) * hd;
            double big_m = -INFINITY, big_l = 0;
            std::fill(acc, acc + hd, 0.0);
            for (int p0 = 0; p0 < len; p0 += kAttnChunk) {
                const int np = std::min(kAttnChunk, len - p0);
                // Four positions at a time: four independent chains (each one the dims in
                // order, as the GPU sums them) keep the adds' latency covered.
                float m = -INFINITY;
                for (int p = 0; p < np; p += 4) {
                    const uint16_t* kr[4];
                    for (int j = 0; j < 4; j++)
                        kr[j] = kc + (base + size_t(p0 + std::min(p + j, np - 1))) * size_t(kvdim) +
                                size_t(kvh) * size_t(hd);
                    float sc[4] = {0, 0, 0, 0};
                    for (int d = 0; d < hd; d++)
                        for (int j = 0; j < 4; j++) sc[j] += qr[d] * tab[kr[j][d]];
                    for (int j = 0; j < 4 && p + j < np; j++) {
                        s[p + j] = sc[j] * scale;
                        m = std::max(m, s[p + j]);
                    }
                }
                double l = 0;
                for (int p = 0; p < np; p++) {
                    s[p] = float(std::exp(double(s[p]) - double(m)));
                    l += double(s[p]);
                }
                std::fill(pv, pv + hd, 0.f);
                for (int p = 0; p < np; p++) {
                    const uint16_t* vr = vc + (base + size_t(p0 + p)) * size_t(kvdim) + size_t(kvh) * size_t(hd);
                    for (int d = 0; d < hd; d++) pv[d] += s[p] * tab[vr[d]];
                }
                // Into the running (max, sum, acc), all in double.
                const double new_m = std::max(big_m, double(m));
                const double c_old = std::exp(big_m - new_m), c_new = std::exp(double(m) - new_m);
                big_l = big_l * c_old + l * c_new;
                for (int d = 0; d < hd; d++) acc[d] = acc[d] * c_old + double(pv[d]) * c_new;
                big_m = new_m;
            }
            float* o = out + (int64_t(i) * n_head + h) * hd;
            for (int d = 0; d < hd; d++) o[d] = float(acc[d] / big_l);
        }
    });
}

void CpuBackend::swiglu(const float* gate, const float* up, int64_t n, float* out) {
    qact_src_ = nullptr;  // only back-to-back matmuls share a quantized input
    // exp in double, rounded once to float: the correctly rounded exp (up to ties far below any
    // activation's precision), which the CUDA backend's double exp gives too. glibc's expf
    // differs from it in about 0.06% of inputs, enough to move an activation across an 8-bit
    // quantization step somewhere in every forward pass.
    constexpr int64_t kChunk = 4096;
    pool_.parallel_for((n + kChunk - 1) / kChunk, 1, [&](int64_t b, int64_t e, int) {
        for (int64_t i = b * kChunk; i < std::min(n, e * kChunk); i++) {
            const float g = gate[i];
            const float ex = float(std::exp(-double(g)));
            out[i] = g / (1.0f + ex) * up[i];
        }
    });
}

void CpuBackend::add(float* x, const float* y, int64_t n) {
    qact_src_ = nullptr;  // only back-to-back matmuls share a quantized input
    for (int64_t i = 0; i < n; i++) x[i] += y[i];
}

void CpuBackend::gather_logit_rows(const float* x, int dim, float* dst) {
    qact_src_ = nullptr;  // only back-to-back matmuls share a quantized input
    int j = 0;
    for (int i = 0; i < batch_.size(); i++) {
        if (!batch_.want_logits[size_t(i)]) continue;
        if (dst + int64_t(j) * dim != x + int64_t(i) * dim)
            std::memmove(dst + int64_t(j) * dim, x + int64_t(i) * dim, sizeof(float) * size_t(dim));
        j++;
    }
}

void CpuBackend::download(const float* src, float* host_dst, size_t n) {
    if (src != host_dst) std::memcpy(host_dst, src, n * sizeof(float));
}

void CpuBackend::select_logits(const float* logits, int n_vocab,
                               const std::vector<LogitRequest>& req,
                               std::vector<LogitCandidates>& out) {
    out.resize(req.size());
    for (size_t i = 0; i < req.size(); i++) {
        if (req[i].row < 0) fail("logit selection: row %d does not exist.", req[i].row);
        select_logits_host(logits + size_t(req[i].row) * size_t(n_vocab), n_vocab, req[i], out[i]);
    }
}

void CpuBackend::kv_truncate(int, int) {
    // Cells are addressed by (sequence, position) and rewritten before they are read again.
}

double CpuBackend::measure_read_bandwidth() {
    // Sum a buffer much larger than the caches with every thread, as the GEMV loops read weights.
    const size_t n = size_t(1) << 30;  // 1 GiB
    // Integer sums vectorise freely (no float reassociation), so the loop is memory-bound.
    std::vector<uint64_t> buf(n / sizeof(uint64_t), 1);
    std::vector<uint64_t> partial(size_t(pool_.size()), 0);
    auto pass = [&] {
        pool_.parallel_for(int64_t(buf.size() / 8192), 16, [&](int64_t b, int64_t e, int th) {
            uint64_t s = 0;
            for (size_t i = size_t(b) * 8192; i < size_t(e) * 8192; i++) s += buf[i];
            partial[size_t(th)] += s;
        });
    };
    pass();  // warm up: pages faulted in
    double best = 0;
    for (int r = 0; r < 3; r++) {
        auto t0 = std::chrono::steady_clock::now();
        pass();
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        best = std::max(best, double(n) / s / 1e9);
    }
    volatile uint64_t sink = partial[0];
    (void)sink;
    return best;
}

}  // namespace nt
