#include "model/llama.h"

#include "core/error.h"

namespace nt {

void llama_forward(const LlamaHParams& hp, const ModelWeights& w, WeightSource& layers,
                   Backend& be, const Batch& batch) {
    const ModelShape& s = hp.shape;
    const int B = batch.size();
    const int64_t d = s.n_embd;
    Activations& a = be.acts();
    if (batch.choose && !be.feeds_tokens())
        fail("the %s backend does not choose tokens on the device.", be.name().c_str());

    be.begin_step(batch);
    be.embed(w.tok_embd, a.x);
    // Each residual add is done by the norm that follows it (add_rmsnorm: x += y, then the norm
    // of x); `residual` is the block output still to be added to x.
    const float* residual = nullptr;
    for (int l = 0; l < s.n_layer; l++) {
        const LayerWeights& L = layers.acquire(l);
        // attention block
        be.add_rmsnorm(a.x, residual, L.attn_norm, B, s.n_embd, a.xn, L.wq.type);
        be.qkv(L.wq, L.wk, L.wv, a.xn, B, a.q, a.k, a.v);
        be.rope_attention(l, a.q, a.k, a.v, a.att, L.wo.type);
        be.warm_weights(L.w1, L.w3);  // the feed-forward's first weights, while wo runs
        be.matmul(L.wo, a.att, B, a.xn);
        // feed-forward block (SwiGLU), after x += attention output
        be.add_rmsnorm(a.x, a.xn, L.ffn_norm, B, s.n_embd, a.xn, L.w1.type);
        be.ffn_gate_up(L.w1, L.w3, a.xn, B, a.gate, a.up, L.w2.type);
        be.matmul(L.w2, a.gate, B, a.xn);
        residual = a.xn;
        layers.release(l);
    }
    // Only the rows whose logits are wanted go through the final norm and the vocabulary. When
    // every row wants them (decode), the gather would copy x as it is: the last add folds into
    // the norm instead.
    const int n_out = batch.n_logits();
    if (n_out == 0) {  // a prompt chunk before the last: its work is the KV cache it filled
        be.end_step();
        return;
    }
    if (n_out == B) {
        be.add_rmsnorm(a.x, residual, w.output_norm, B, s.n_embd, a.gate, w.output.type);
    } else {
        if (residual) be.add(a.x, residual, B * d);
        be.gather_logit_rows(a.x, s.n_embd, a.xn);
        be.add_rmsnorm(a.xn, nullptr, w.output_norm, n_out, s.n_embd, a.gate, w.output.type);
    }
    be.matmul(w.output, a.gate, n_out, a.logits);
    be.end_step();
}

}  // namespace nt
