// ntransformer: the command-line front end. Every user error ends as one sentence on stderr
// and exit code 1.
#include <cstdio>
#include <cstring>
#include <new>
#include <string>

#include "cli/common.h"
#include "core/error.h"

namespace {

void usage() {
    std::printf(
        "ntransformer — run Llama-family GGUF models on the CPU and the GPU\n\n"
        "usage: ntransformer <command> [options]\n\n"
        "commands:\n"
        "  generate     continue a prompt (-m MODEL -p TEXT -n N)\n"
        "  chat         talk to a model interactively with its chat template\n"
        "  perplexity   perplexity of a text file, llama.cpp's method (-f FILE -c 512)\n"
        "  tokenize     show the tokens of a text\n"
        "  info         metadata, tensors and bytes per layer of a GGUF file\n"
        "  bench        prompt and decode throughput with bandwidth against the roofline\n"
        "  doctor       GPU, PCIe link, copy and disk bandwidth, pinnable memory: what is slow\n"
        "  serve        OpenAI-compatible HTTP server with continuous batching\n\n"
        "'ntransformer <command> --help' shows a command's options.\n");
}

}  // namespace

int main(int argc, char** argv) {
    using namespace nt::cli;
    if (argc < 2 || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "help")) {
        usage();
        return argc < 2 ? 1 : 0;
    }
    const std::string cmd = argv[1];
    try {
        if (cmd == "generate") return cmd_generate(argc, argv);
        if (cmd == "chat") return cmd_chat(argc, argv);
        if (cmd == "perplexity") return cmd_perplexity(argc, argv);
        if (cmd == "tokenize") return cmd_tokenize(argc, argv);
        if (cmd == "info") return cmd_info(argc, argv);
        if (cmd == "bench") return cmd_bench(argc, argv);
        if (cmd == "doctor") return cmd_doctor(argc, argv);
        if (cmd == "serve") return cmd_serve(argc, argv);
        std::fprintf(stderr, "error: unknown command '%s'; run 'ntransformer --help' for the list.\n", cmd.c_str());
        return 1;
    } catch (const nt::Error& e) {
        std::fflush(stdout);
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    } catch (const std::bad_alloc&) {
        std::fflush(stdout);
        std::fprintf(stderr, "error: out of memory; try a smaller context (-c) or batch (-b).\n");
        return 1;
    } catch (const std::exception& e) {
        std::fflush(stdout);
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
}
