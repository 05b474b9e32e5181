// tokenize: shows how the model's tokenizer splits a text.
#include <cstdio>

#include "cli/common.h"
#include "core/error.h"

namespace nt::cli {

int cmd_tokenize(int argc, char** argv) {
    Args a("tokenize", {
        {"-m,--model", "FILE", "GGUF model file (only its vocabulary is read)", ""},
        {"-p,--prompt", "TEXT", "text to tokenize", ""},
        {"-f,--file", "FILE", "read the text from a file", ""},
        {"--ids", "", "print only the token ids, as [1, 2, 3]", ""},
        {"--no-bos", "", "do not add the BOS token", ""},
        {"--no-special", "", "do not parse special tokens written in the text", ""},
    });
    a.set_summary("Prints the tokens of a text: one 'id -> piece' per line, or the id list with --ids.");
    if (!a.parse(argc, argv, 2)) return 0;
    if (a.has("--prompt") && a.has("--file")) fail("give the text with -p or -f, not both.");
    if (!a.has("--prompt") && !a.has("--file")) fail("no text given; pass it with -p TEXT or -f FILE.");
    const std::string text = a.has("--file") ? read_file(a.str("--file")) : a.str("--prompt");
    auto file = GgufFile::open(require_model_path(a));
    auto tok = Tokenizer::from_gguf(*file);
    std::vector<int32_t> ids = tok->encode(text, !a.has("--no-bos"), !a.has("--no-special"));
    if (a.has("--ids")) {
        std::printf("[");
        for (size_t i = 0; i < ids.size(); i++) std::printf(i ? ", %d" : "%d", ids[i]);
        std::printf("]\n");
    } else {
        for (int32_t id : ids) {
            std::string piece = tok->token_to_piece(id, true);
            std::printf("%6d -> '%s'\n", id, piece.c_str());
        }
    }
    return 0;
}

}  // namespace nt::cli
