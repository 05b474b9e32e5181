// What the model-loading subcommands share: load a model, pick a backend, build an engine.
#pragma once
#include <memory>

#include "cli/args.h"
#include "engine/engine.h"
#include "memory/streamer.h"

namespace nt::cli {

struct Loaded {
    std::unique_ptr<Model> model;
    std::unique_ptr<Engine> engine;
};

// Loads -m with the engine options from the shared flags; `logits_all` sizes for perplexity.
// n_ctx >= 0 overrides -c (perplexity sizes the context from its own default).
Loaded load_model(const Args& a, int n_seq = 1, int n_ctx = -1);
std::string require_model_path(const Args& a);

// Tiered memory: the budgets and streaming flags of model_opts(); the streaming pipeline's
// report over a stats window (empty when nothing streams); the Chrome trace when --trace asks.
MemoryOptions memory_options(const Args& a);
std::string stream_report(Engine& eng, const mem::StreamStats& st, const char* what);
void write_trace_if_asked(const Args& a, Engine& eng);

int cmd_generate(int argc, char** argv);
int cmd_chat(int argc, char** argv);
int cmd_perplexity(int argc, char** argv);
int cmd_tokenize(int argc, char** argv);
int cmd_info(int argc, char** argv);
int cmd_bench(int argc, char** argv);
int cmd_doctor(int argc, char** argv);
int cmd_serve(int argc, char** argv);

}  // namespace nt::cli
