#include "model/llama.h"

namespace nt {

void llama_forward(const LlamaHParams& hp, const ModelWeights& w, WeightSource& layers,
                   Backend& be, const Batch& batch) {
    const ModelShape& s = hp.shape;
    const int B = batch.size();
    const int64_t d = s.n_embd;
    Activations& a = be.acts();

    be.begin_step(batch);
    be.embed(w.tok_embd, a.x);
    for (int l = 0; l < s.n_layer; l++) {
        const LayerWeights& L = layers.acquire(l);
        // attention block
        be.rmsnorm(a.x, L.attn_norm, B, s.n_embd, a.xn);
        be.matmul(L.wq, a.xn, B, a.q);
        be.matmul(L.wk, a.xn, B, a.k);
        be.matmul(L.wv, a.xn, B, a.v);
        be.rope(a.q, a.k);
        be.attention(l, a.q, a.k, a.v, a.att);
        be.matmul(L.wo, a.att, B, a.xn);
        be.add(a.x, a.xn, B * d);
        // feed-forward block (SwiGLU)
        be.rmsnorm(a.x, L.ffn_norm, B, s.n_embd, a.xn);
        be.matmul(L.w1, a.xn, B, a.gate);
        be.matmul(L.w3, a.xn, B, a.up);
        be.swiglu(a.gate, a.up, int64_t(B) * s.n_ff, a.gate);
        be.matmul(L.w2, a.gate, B, a.xn);
        be.add(a.x, a.xn, B * d);
        layers.release(l);
    }
    // Only the rows whose logits are wanted go through the final norm and the vocabulary.
    const int n_out = batch.n_logits();
    be.gather_logit_rows(a.x, s.n_embd, a.xn);
    be.rmsnorm(a.xn, w.output_norm, n_out, s.n_embd, a.gate);
    be.matmul(w.output, a.gate, n_out, a.logits);
    be.end_step();
}

}  // namespace nt
