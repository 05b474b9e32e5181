#include "model/llama.h"

namespace nt {

void llama_forward(const LlamaHParams& hp, const ModelWeights& w, WeightSource& layers, Backend& be,
                   const Batch& batch) {
    const ModelShape& s = hp.shape;
    const int B = batch.size();
    const int64_t d = s.n_embd;
    Activations& a = be.acts();

    be.begin_step(batch);
    be.embed(w.tok_embd, a.x);
    const int n_out = batch.n_logits();
    // Each residual add is done by the norm that follows it (x += y, then the norm of x). A
    // block's last matmul carries that norm along (matmul_add_rmsnorm) where the norm's weights
    // are at hand: always after the attention; after the feed-forward where the next layer is
    // resident, or the last layer's output norm covers every row. Otherwise `residual` is the
    // block output still to be added to x by the next add_rmsnorm.
    const float* residual = nullptr;
    bool normed = false;  // a.xn already holds the norm of this layer's input
    for (int l = 0; l < s.n_layer; l++) {
        const LayerWeights& L = layers.acquire(l);
        // attention block
        if (!normed) be.add_rmsnorm(a.x, residual, L.attn_norm, B, s.n_embd, a.xn, L.wq.type);
        be.qkv(L.wq, L.wk, L.wv, a.xn, B, a.q, a.k, a.v);
        be.rope_attention(l, a.q, a.k, a.v, a.att, L.wo.type);
        be.matmul_add_rmsnorm(L.wo, a.att, B, a.xn, a.x, L.ffn_norm, a.xn, L.w1.type);
        // feed-forward block (SwiGLU)
        be.ffn_gate_up(L.w1, L.w3, a.xn, B, a.gate, a.up, L.w2.type);
        const LayerWeights* next = l + 1 < s.n_layer ? layers.resident(l + 1) : nullptr;
        normed = false;
        residual = nullptr;
        if (next) {
            be.matmul_add_rmsnorm(L.w2, a.gate, B, a.xn, a.x, next->attn_norm, a.xn, next->wq.type);
            normed = true;
        } else if (l + 1 == s.n_layer && n_out == B) {
            be.matmul_add_rmsnorm(L.w2, a.gate, B, a.xn, a.x, w.output_norm, a.gate, w.output.type);
            normed = true;
        } else {
            be.matmul(L.w2, a.gate, B, a.xn);
            residual = a.xn;
        }
        layers.release(l);
    }
    // Only the rows whose logits are wanted go through the final norm and the vocabulary (in
    // a.gate). When every row wants them (decode), the gather would copy x as it is: the last
    // add and the norm are done by the last matmul, or here.
    if (!normed && n_out == B) {
        be.add_rmsnorm(a.x, residual, w.output_norm, B, s.n_embd, a.gate, w.output.type);
    } else if (!normed) {
        if (residual) be.add(a.x, residual, B * d);
        be.gather_logit_rows(a.x, s.n_embd, a.xn);
        be.add_rmsnorm(a.xn, nullptr, w.output_norm, n_out, s.n_embd, a.gate, w.output.type);
    }
    be.matmul(w.output, a.gate, n_out, a.logits);
    be.end_step();
}

}  // namespace nt
