// A Llama-family model (Llama 1/2/3/3.1/3.2, Mistral-style files): hyperparameters and weight
// views read from a GGUF file, and the forward pass over a batch. The forward pass is the one
// place where a whole layer reads top to bottom; it runs on any Backend.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "gguf/gguf.h"

namespace nt {

struct LlamaHParams {
    std::string arch;  // "llama" or "mistral"
    int n_ctx_train = 0;
    ModelShape shape;
    std::string name;
};

// One layer's weights, in the paper's names.
struct LayerWeights {
    WeightView attn_norm, wq, wk, wv, wo;
    WeightView ffn_norm, w1 /*gate*/, w3 /*up*/, w2 /*down*/;
    size_t nbytes() const;
};

struct ModelWeights {
    WeightView tok_embd, output_norm, output;
    std::vector<LayerWeights> layers;
};

// Parameters of the model as stored: the elements of every tensor (tied embeddings once).
int64_t count_params(const GgufFile& f);

// Reads and validates hyperparameters; throws nt::Error naming the file and the problem.
LlamaHParams read_llama_hparams(const GgufFile& f);
// Weight views pointing into the mapped file; validates presence, types and shapes.
ModelWeights map_llama_weights(const GgufFile& f, const LlamaHParams& hp);

// Applies `fn` to every weight view (for moving weights to a device).
template <class Fn>
void for_each_weight(ModelWeights& w, Fn&& fn) {
    fn(w.tok_embd);
    fn(w.output_norm);
    if (w.output.data != w.tok_embd.data) fn(w.output);
    for (auto& l : w.layers)
        for (WeightView* v : {&l.attn_norm, &l.wq, &l.wk, &l.wv, &l.wo, &l.ffn_norm, &l.w1, &l.w3, &l.w2}) fn(*v);
}

// Supplies each layer's weights to the forward pass. Resident models return their views; a
// streaming source may wait for a layer to arrive and recycle its slot after release().
class WeightSource {
public:
    virtual ~WeightSource() = default;
    virtual const LayerWeights& acquire(int layer) = 0;
    virtual void release(int /*layer*/) {}
};

class ResidentWeights : public WeightSource {
public:
    explicit ResidentWeights(const ModelWeights& w) : w_(w) {}
    const LayerWeights& acquire(int layer) override { return w_.layers[size_t(layer)]; }

private:
    const ModelWeights& w_;
};

// Runs one step: the batch's tokens through every layer; logits of the rows flagged in the
// batch end up in backend.acts().logits ([n_logits][n_vocab], backend memory).
void llama_forward(const LlamaHParams& hp, const ModelWeights& w, WeightSource& layers,
                   Backend& be, const Batch& batch);

}  // namespace nt
