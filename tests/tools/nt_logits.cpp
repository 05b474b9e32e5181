// Test tool: runs token ids through the engine and writes the logits of every position as raw
// float32 ([n_tokens][n_vocab]), so Python tests can compare against an independent engine.
//   nt_logits MODEL IDS_FILE OUT_FILE [--device cpu|cuda] [--batch N] [--threads N]
// IDS_FILE holds whitespace-separated token ids. With several lines, each line is a separate
// prompt evaluated from position 0 as its own sequence, in one batch per step.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "backend/select/select.h"
#include "core/error.h"
#include "engine/engine.h"

int main(int argc, char** argv) {
    if (argc < 4) {
        std::fprintf(stderr, "usage: nt_logits MODEL IDS_FILE OUT_FILE [--device D] [--batch N] [--threads N]\n");
        return 2;
    }
    std::string device = "cpu";
    int batch = 512, threads = 0;
    for (int i = 4; i + 1 < argc; i += 2) {
        if (!std::strcmp(argv[i], "--device")) device = argv[i + 1];
        else if (!std::strcmp(argv[i], "--batch")) batch = std::atoi(argv[i + 1]);
        else if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(argv[i + 1]);
    }
    try {
        std::vector<std::vector<int32_t>> prompts;
        std::ifstream in(argv[2]);
        std::string line;
        size_t longest = 0;
        while (std::getline(in, line)) {
            std::istringstream ss(line);
            std::vector<int32_t> ids;
            int32_t id;
            while (ss >> id) ids.push_back(id);
            if (!ids.empty()) prompts.push_back(ids), longest = std::max(longest, ids.size());
        }
        auto model = nt::Model::load(argv[1]);
        nt::EngineOptions opt;
        opt.n_ctx = int(longest) + 1;
        opt.n_seq = int(prompts.size());
        opt.max_batch = batch;
        nt::Engine eng(*model, nt::make_backend(device, threads), opt);
        // Interleave the prompts: each step carries up to `batch` entries across sequences.
        std::vector<std::vector<float>> out(prompts.size());
        std::vector<size_t> next(prompts.size(), 0);
        std::vector<float> logits;
        const size_t nv = size_t(eng.n_vocab());
        for (;;) {
            nt::Batch b;
            std::vector<size_t> owner;
            for (size_t s = 0; s < prompts.size(); s++)
                while (next[s] < prompts[s].size() && b.size() < eng.max_batch()) {
                    b.add(prompts[s][next[s]], int(next[s]), int(s), true);
                    owner.push_back(s);
                    next[s]++;
                }
            if (b.size() == 0) break;
            eng.eval(b, logits);
            for (size_t i = 0; i < owner.size(); i++)
                out[owner[i]].insert(out[owner[i]].end(), logits.begin() + int64_t(i * nv), logits.begin() + int64_t((i + 1) * nv));
        }
        std::ofstream o(argv[3], std::ios::binary);
        for (auto& v : out) o.write(reinterpret_cast<const char*>(v.data()), std::streamsize(v.size() * sizeof(float)));
    } catch (const nt::Error& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return 0;
}
