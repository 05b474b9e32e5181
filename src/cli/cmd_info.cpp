// info: what is inside a GGUF file — metadata, tensors by type, bytes per layer.
#include <cstdio>
#include <map>

#include "cli/common.h"
#include "core/error.h"

namespace nt::cli {

int cmd_info(int argc, char** argv) {
    Args a("info", {
        {"-m,--model", "FILE", "GGUF model file", ""},
        {"--tensors", "", "list every tensor", ""},
    });
    a.set_summary("Prints a GGUF file's metadata, its tensors grouped by type, and the bytes of each layer.");
    if (!a.parse(argc, argv, 2)) return 0;
    auto f = GgufFile::open(require_model_path(a));
    std::printf("file:        %s\n", f->path().c_str());
    std::printf("gguf:        version %u, alignment %zu, %zu metadata keys, %zu tensors, %.2f MiB\n", f->version(),
                f->alignment(), f->metadata().size(), f->tensors().size(), double(f->file_size()) / (1 << 20));
    std::printf("\nmetadata:\n");
    for (const auto& [key, value] : f->metadata()) std::printf("  %-44s %s\n", key.c_str(), describe_value(value, 8).c_str());

    struct Acc { int count = 0; size_t bytes = 0; int64_t elems = 0; };
    std::map<std::string, Acc> by_type;
    size_t total = 0;
    for (const auto& t : f->tensors()) {
        Acc& acc = by_type[type_name(t.type)];
        acc.count++;
        acc.bytes += t.nbytes;
        acc.elems += t.nelements();
        total += t.nbytes;
    }
    std::printf("\ntensors by type:\n");
    for (const auto& [name, acc] : by_type)
        std::printf("  %-6s %5d tensors %10.2f MiB  %.2f bits/weight\n", name.c_str(), acc.count,
                    double(acc.bytes) / (1 << 20), 8.0 * double(acc.bytes) / double(acc.elems));
    std::printf("  total  %5zu tensors %10.2f MiB\n", f->tensors().size(), double(total) / (1 << 20));

    if (a.has("--tensors")) {
        std::printf("\ntensors:\n");
        for (const auto& t : f->tensors()) {
            std::string shape;
            for (int64_t d : t.ne) shape += (shape.empty() ? "" : " x ") + std::to_string(d);
            std::printf("  %-36s %-6s [%s] %zu bytes\n", t.name.c_str(), type_name(t.type), shape.c_str(), t.nbytes);
        }
    }

    // The model view is optional: info works on any GGUF file, and says why it would not run.
    try {
        LlamaHParams hp = read_llama_hparams(*f);
        ModelWeights w = map_llama_weights(*f, hp);
        const ModelShape& s = hp.shape;
        std::printf("\nmodel:       %s (%s), %.1fM parameters\n", hp.name.c_str(), hp.arch.c_str(), double(count_params(*f)) / 1e6);
        std::printf("shape:       %d layers, embd %d, ff %d, heads %d (kv %d), head dim %d, vocab %d, context %d\n",
                    s.n_layer, s.n_embd, s.n_ff, s.n_head, s.n_head_kv, s.head_dim, s.n_vocab, hp.n_ctx_train);
        std::printf("rope:        base %g, scale %g%s\n", double(s.rope.freq_base), double(s.rope.freq_scale),
                    s.rope.freq_factors.empty() ? "" : ", llama3 frequency factors");
        std::printf("embeddings:  %s\n", w.output.data == w.tok_embd.data ? "tied (output uses token_embd)" : "separate output.weight");
        std::printf("\nbytes per layer:\n");
        for (int l = 0; l < s.n_layer; l++) {
            const LayerWeights& L = w.layers[size_t(l)];
            std::printf("  blk.%-3d %9.2f MiB  (q %s, k %s, v %s, o %s, gate %s, up %s, down %s)\n", l,
                        double(L.nbytes()) / (1 << 20), type_name(L.wq.type), type_name(L.wk.type), type_name(L.wv.type),
                        type_name(L.wo.type), type_name(L.w1.type), type_name(L.w3.type), type_name(L.w2.type));
        }
        std::printf("  token_embd %.2f MiB, output %.2f MiB\n", double(w.tok_embd.nbytes) / (1 << 20),
                    w.output.data == w.tok_embd.data ? 0.0 : double(w.output.nbytes) / (1 << 20));
    } catch (const Error& e) {
        std::printf("\nmodel:       not runnable by ntransformer: %s\n", e.what());
    }
    return 0;
}

}  // namespace nt::cli
