// Test tool: runs our tokenizer on raw bytes so Python tests can compare it with llama.cpp.
//
//   nt_tokenize MODEL.gguf [--bos] [--special] [--batch] [--decode] [--time]  < input
//   nt_tokenize MODEL.gguf --info
//   nt_tokenize MODEL.gguf --pieces [--special]
//
// Reads stdin as raw bytes (any byte survives). Without --batch the whole input is one text;
// with --batch it is a sequence of records "<byte count>\n<bytes>". For each text it prints one
// line of space-separated ids. --decode adds two lines per text: the hex of decode(ids), and the
// hex of each StreamDecoder chunk (push per id, then flush) joined by ','. --info prints the
// vocabulary facts as key=value lines and exits. --pieces prints the hex of
// token_to_piece(id, --special) for every id, one per line. --time prints the encode time to
// stderr.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include "core/error.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

namespace {

std::string hex(const std::string& s) {
    static const char* kDigits = "0123456789abcdef";
    std::string out;
    for (unsigned char c : s) {
        out += kDigits[c >> 4];
        out += kDigits[c & 15];
    }
    return out;
}

void print_ids(const std::vector<int32_t>& ids) {
    std::string line;
    for (size_t i = 0; i < ids.size(); ++i) {
        if (i) line += ' ';
        line += std::to_string(ids[i]);
    }
    std::printf("%s\n", line.c_str());
}

int run(int argc, char** argv) {
    if (argc < 2)
        nt::fail(
            "usage: nt_tokenize MODEL.gguf [--bos] [--special] [--batch] [--decode] [--time] | "
            "--info | --pieces [--special]");
    bool bos = false, special = false, batch = false, decode = false, info = false, timing = false,
         pieces = false;
    for (int i = 2; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--bos")
            bos = true;
        else if (a == "--special")
            special = true;
        else if (a == "--batch")
            batch = true;
        else if (a == "--decode")
            decode = true;
        else if (a == "--info")
            info = true;
        else if (a == "--time")
            timing = true;
        else if (a == "--pieces")
            pieces = true;
        else
            nt::fail("unknown option '%s'.", a.c_str());
    }
    auto file = nt::GgufFile::open(argv[1]);
    auto tok = nt::Tokenizer::from_gguf(*file);
    if (info) {
        std::printf(
            "model=%s\npre=%s\nn_vocab=%d\nbos=%d\neos=%d\neot=%d\nadd_bos=%d\n"
            "add_eos=%d\nadd_space_prefix=%d\n",
            tok->model().c_str(), tok->pre().c_str(), tok->n_vocab(), tok->bos(), tok->eos(),
            tok->eot(), int(tok->add_bos()), int(tok->add_eos()), int(tok->add_space_prefix()));
        std::vector<int32_t> eog;
        for (int32_t id = 0; id < tok->n_vocab(); ++id) {
            if (tok->is_eog(id)) eog.push_back(id);
        }
        std::printf("eog=");
        print_ids(eog);
        return 0;
    }

    if (pieces) {
        for (int32_t id = 0; id < tok->n_vocab(); ++id)
            std::printf("%s\n", hex(tok->token_to_piece(id, special)).c_str());
        return 0;
    }

    std::string input((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
    std::vector<std::string> texts;
    if (!batch) {
        texts.push_back(std::move(input));
    } else {
        for (size_t pos = 0; pos < input.size();) {
            const size_t nl = input.find('\n', pos);
            if (nl == std::string::npos)
                nt::fail("--batch input: record header without a newline.");
            const size_t n = std::stoul(input.substr(pos, nl - pos));
            if (nl + 1 + n > input.size()) nt::fail("--batch input: record longer than the input.");
            texts.push_back(input.substr(nl + 1, n));
            pos = nl + 1 + n;
        }
    }
    for (const std::string& text : texts) {
        const auto t0 = std::chrono::steady_clock::now();
        const std::vector<int32_t> ids = tok->encode(text, bos, special);
        const auto t1 = std::chrono::steady_clock::now();
        if (timing)
            std::fprintf(stderr, "encode_ms=%.3f bytes=%zu tokens=%zu\n",
                         std::chrono::duration<double, std::milli>(t1 - t0).count(), text.size(),
                         ids.size());
        print_ids(ids);
        if (decode) {
            std::printf("%s\n", hex(tok->decode(ids)).c_str());
            nt::StreamDecoder sd(*tok);
            std::string chunks;
            for (int32_t id : ids) chunks += hex(sd.push(id)) + ",";
            chunks += hex(sd.flush());
            std::printf("%s\n", chunks.c_str());
        }
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    try {
        return run(argc, argv);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "nt_tokenize: %s\n", e.what());
        return 1;
    }
}
