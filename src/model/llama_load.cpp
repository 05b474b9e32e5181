#include <cmath>

#include "core/error.h"
#include "model/llama.h"

namespace nt {

int64_t count_params(const GgufFile& f) {
    int64_t n = 0;
    for (const GgufTensorInfo& t : f.tensors()) n += t.nelements();
    return n;
}

size_t LayerWeights::nbytes() const {
    size_t n = 0;
    for (const WeightView* v : {&attn_norm, &wq, &wk, &wv, &wo, &ffn_norm, &w1, &w3, &w2}) n += v->nbytes;
    return n;
}

namespace {

// Llama 3.1 "llama3" rope scaling: per-frequency divisors, as Meta's reference computes them.
std::vector<float> llama3_freq_factors(int n_rot, float base, float factor, float low_freq_factor,
                                       float high_freq_factor, float orig_ctx) {
    std::vector<float> out(static_cast<size_t>(n_rot / 2));
    const float low_wavelen = orig_ctx / low_freq_factor;
    const float high_wavelen = orig_ctx / high_freq_factor;
    for (int i = 0; i < n_rot / 2; i++) {
        const float freq = std::pow(base, -2.0f * float(i) / float(n_rot));
        const float wavelen = 2.0f * float(M_PI) / freq;
        float f;
        if (wavelen < high_wavelen) {
            f = 1.0f;
        } else if (wavelen > low_wavelen) {
            f = factor;
        } else {
            const float smooth = (orig_ctx / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
            f = 1.0f / ((1 - smooth) / factor + smooth);
        }
        out[size_t(i)] = f;
    }
    return out;
}

}  // namespace

LlamaHParams read_llama_hparams(const GgufFile& f) {
    LlamaHParams hp;
    const std::string& path = f.path();
    hp.arch = f.get_string("general.architecture", "");
    if (hp.arch.empty()) fail("%s: missing required key 'general.architecture'.", path.c_str());
    if (hp.arch != "llama" && hp.arch != "mistral")
        fail("%s: architecture '%s' is not supported (ntransformer runs Llama-family models: llama, mistral).",
             path.c_str(), hp.arch.c_str());
    hp.name = f.get_string("general.name", "");
    const std::string a = hp.arch + ".";
    if (f.get_int(a + "expert_count", 0) > 0)
        fail("%s: mixture-of-experts models are not supported (%s.expert_count is set).", path.c_str(), hp.arch.c_str());

    ModelShape& s = hp.shape;
    auto positive = [&](const std::string& key, int64_t v, int64_t max) {
        if (v <= 0 || v > max) fail("%s: %s = %lld is out of range.", path.c_str(), key.c_str(), (long long)v);
        return int(v);
    };
    s.n_embd = positive(a + "embedding_length", f.require_int(a + "embedding_length"), 1 << 17);
    s.n_layer = positive(a + "block_count", f.require_int(a + "block_count"), 4096);
    s.n_ff = positive(a + "feed_forward_length", f.require_int(a + "feed_forward_length"), 1 << 20);
    s.n_head = positive(a + "attention.head_count", f.require_int(a + "attention.head_count"), 4096);
    s.n_head_kv = positive(a + "attention.head_count_kv",
                           f.get_int(a + "attention.head_count_kv", s.n_head), 4096);
    hp.n_ctx_train = positive(a + "context_length", f.get_int(a + "context_length", 2048), 1 << 24);
    if (s.n_embd % s.n_head != 0)
        fail("%s: embedding length %d is not a multiple of the head count %d.", path.c_str(), s.n_embd, s.n_head);
    s.head_dim = int(f.get_int(a + "attention.key_length", s.n_embd / s.n_head));
    if (s.head_dim <= 0 || s.head_dim % 2 != 0 || s.head_dim > kAttnMaxHd)
        fail("%s: head dimension %d is not supported.", path.c_str(), s.head_dim);
    if (f.get_int(a + "attention.value_length", s.head_dim) != s.head_dim)
        fail("%s: different key and value head sizes are not supported.", path.c_str());
    if (s.n_head % s.n_head_kv != 0)
        fail("%s: head count %d is not a multiple of the KV head count %d.", path.c_str(), s.n_head, s.n_head_kv);
    s.norm_eps = float(f.get_float(a + "attention.layer_norm_rms_epsilon", 1e-5));
    if (!(s.norm_eps > 0 && s.norm_eps < 1))
        fail("%s: RMS norm epsilon %g is out of range.", path.c_str(), double(s.norm_eps));

    s.rope.n_rot = int(f.get_int(a + "rope.dimension_count", s.head_dim));
    if (s.rope.n_rot != s.head_dim)
        fail("%s: partial rotary embeddings (rope.dimension_count %d != head dim %d) are not supported.",
             path.c_str(), s.rope.n_rot, s.head_dim);
    s.rope.freq_base = float(f.get_float(a + "rope.freq_base", 10000.0));
    if (!(s.rope.freq_base > 1)) fail("%s: rope.freq_base %g is out of range.", path.c_str(), double(s.rope.freq_base));
    const std::string scaling = f.get_string(a + "rope.scaling.type", "none");
    double factor = f.get_float(a + "rope.scaling.factor", 0.0);
    if (scaling == "linear" && factor > 0) {
        s.rope.freq_scale = float(1.0 / factor);
    } else if (scaling == "llama3") {
        if (!f.tensor("rope_freqs.weight")) {
            s.rope.freq_factors = llama3_freq_factors(
                s.rope.n_rot, s.rope.freq_base, float(factor > 0 ? factor : 8.0),
                float(f.get_float(a + "rope.scaling.low_freq_factor", 1.0)),
                float(f.get_float(a + "rope.scaling.high_freq_factor", 4.0)),
                float(f.get_int(a + "rope.scaling.original_context_length", 8192)));
        }
    } else if (scaling != "none" && scaling != "") {
        fail("%s: rope scaling type '%s' is not supported (supported: none, linear, llama3).", path.c_str(),
             scaling.c_str());
    }
    // Llama 3.1 files converted by llama.cpp carry the factors as a tensor.
    if (const GgufTensorInfo* t = f.tensor("rope_freqs.weight")) {
        if (t->type != GgmlType::F32 || t->nelements() != s.rope.n_rot / 2)
            fail("%s: rope_freqs.weight must be %d f32 values.", path.c_str(), s.rope.n_rot / 2);
        const float* p = reinterpret_cast<const float*>(f.tensor_data(*t));
        s.rope.freq_factors.assign(p, p + s.rope.n_rot / 2);
        for (float x : s.rope.freq_factors)
            if (!(x > 0) || !std::isfinite(x)) fail("%s: rope_freqs.weight holds a non-positive factor.", path.c_str());
    }

    const GgufTensorInfo* emb = f.tensor("token_embd.weight");
    if (!emb) fail("%s: missing tensor 'token_embd.weight'.", path.c_str());
    if (emb->ne.size() != 2) fail("%s: token_embd.weight must be 2-dimensional.", path.c_str());
    s.n_vocab = int(emb->ne[1]);
    if (const GgufArray* toks = f.get_array("tokenizer.ggml.tokens"))
        if (int64_t(toks->items.size()) != s.n_vocab)
            fail("%s: the vocabulary has %zu tokens but token_embd.weight has %d rows.", path.c_str(),
                 toks->items.size(), s.n_vocab);
    return hp;
}

namespace {

WeightView view_of(const GgufFile& f, const std::string& name, std::vector<int64_t> want, bool optional = false) {
    const GgufTensorInfo* t = f.tensor(name);
    if (!t) {
        if (optional) return {};
        fail("%s: missing tensor '%s'.", f.path().c_str(), name.c_str());
    }
    const TypeTraits* tr = type_traits(uint32_t(t->type));
    if (!tr || !tr->weight_type)
        fail("%s: tensor '%s' has type %s, which is not supported as a weight.", f.path().c_str(), name.c_str(),
             tr ? tr->name : "unknown");
    std::vector<int64_t> ne = t->ne;
    while (ne.size() > want.size() && ne.back() == 1) ne.pop_back();
    if (ne != want) {
        std::string got, exp;
        for (int64_t x : t->ne) got += (got.empty() ? "" : " x ") + std::to_string(x);
        for (int64_t x : want) exp += (exp.empty() ? "" : " x ") + std::to_string(x);
        fail("%s: tensor '%s' has shape [%s] but the hyperparameters need [%s].", f.path().c_str(), name.c_str(),
             got.c_str(), exp.c_str());
    }
    WeightView v;
    v.type = t->type;
    v.cols = want[0];
    v.rows = want.size() > 1 ? want[1] : 1;
    v.data = f.tensor_data(*t);
    v.nbytes = t->nbytes;
    return v;
}

}  // namespace

ModelWeights map_llama_weights(const GgufFile& f, const LlamaHParams& hp) {
    const ModelShape& s = hp.shape;
    const int64_t d = s.n_embd, qdim = int64_t(s.n_head) * s.head_dim, kvdim = int64_t(s.n_head_kv) * s.head_dim;
    ModelWeights w;
    w.tok_embd = view_of(f, "token_embd.weight", {d, s.n_vocab});
    w.output_norm = view_of(f, "output_norm.weight", {d});
    w.output = view_of(f, "output.weight", {d, s.n_vocab}, /*optional=*/true);
    if (!w.output.data) w.output = w.tok_embd;  // tied embeddings
    w.layers.resize(size_t(s.n_layer));
    for (int l = 0; l < s.n_layer; l++) {
        const std::string p = "blk." + std::to_string(l) + ".";
        LayerWeights& L = w.layers[size_t(l)];
        if (f.tensor(p + "ffn_gate_inp.weight"))
            fail("%s: mixture-of-experts layers are not supported.", f.path().c_str());
        L.attn_norm = view_of(f, p + "attn_norm.weight", {d});
        L.wq = view_of(f, p + "attn_q.weight", {d, qdim});
        L.wk = view_of(f, p + "attn_k.weight", {d, kvdim});
        L.wv = view_of(f, p + "attn_v.weight", {d, kvdim});
        L.wo = view_of(f, p + "attn_output.weight", {qdim, d});
        L.ffn_norm = view_of(f, p + "ffn_norm.weight", {d});
        L.w1 = view_of(f, p + "ffn_gate.weight", {d, s.n_ff});
        L.w3 = view_of(f, p + "ffn_up.weight", {d, s.n_ff});
        L.w2 = view_of(f, p + "ffn_down.weight", {s.n_ff, d});
    }
    return w;
}

}  // namespace nt
