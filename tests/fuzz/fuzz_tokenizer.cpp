// libFuzzer target for the tokenizers. The first input byte picks what to do with the rest:
//   bit 7 set: the rest is a GGUF image; loading its vocabulary must succeed or throw nt::Error,
//              and a loaded one must encode and decode a few texts;
//   otherwise: the rest is text, encoded (bit 0: add BOS, bit 1: parse special tokens) by every
//              tokenizer we have, which must give in-range ids, a stream decoder that only ever
//              emits valid UTF-8, and decode(encode(x)) == x where that is promised.
// Tokenizers: a small SentencePiece and a small byte-level BPE vocabulary built here, and
// SmolLM2's from $NT_FUZZ_MODEL (default models/SmolLM2-135M-Instruct.Q4_1.gguf in the
// repository) when that file exists.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace {

struct Entry {
    std::unique_ptr<nt::GgufFile> file;
    std::unique_ptr<nt::Tokenizer> tok;
    bool spm = false;
    std::vector<bool> byte_missing;  // BPE: bytes with no token (encode drops them)
};

std::unique_ptr<nt::GgufFile> write_and_open(nt::GgufWriter& w, const char* tag) {
    const std::string path = (std::filesystem::temp_directory_path() /
                              ("nt_fuzz_tok_" + std::to_string(getpid()) + tag + ".gguf"))
                                 .string();
    w.set_string("general.architecture", "llama");
    w.write(path);
    auto f = nt::GgufFile::open(path);
    std::remove(path.c_str());  // the mapping stays valid
    return f;
}

Entry make_spm() {
    std::vector<std::string> tokens{"<unk>", "<s>", "</s>"};
    std::vector<int32_t> types{2, 3, 3};
    for (int b = 0; b < 256; ++b) {
        tokens.push_back(nt::strfmt("<0x%02X>", b));
        types.push_back(6);
    }
    for (const char* t :
         {"\xE2\x96\x81", "a", "b", "e", "t", "h", "\xE2\x96\x81t", "he", "\xE2\x96\x81the", "th",
          "\xE2\x96\x81\xE2\x96\x81", "\xC3\xA9", "<|ctl|>"}) {
        tokens.push_back(t);
        types.push_back(std::string(t) == "<|ctl|>" ? 3 : 1);
    }
    std::vector<float> scores;
    for (size_t i = 0; i < tokens.size(); ++i) scores.push_back(-float(i % 7));
    nt::GgufWriter w;
    w.set_string("tokenizer.ggml.model", "llama");
    w.set_string_array("tokenizer.ggml.tokens", tokens);
    w.set_f32_array("tokenizer.ggml.scores", scores);
    w.set_i32_array("tokenizer.ggml.token_type", types);
    Entry e;
    e.file = write_and_open(w, "spm");
    e.tok = nt::Tokenizer::from_gguf(*e.file);
    e.spm = true;
    return e;
}

Entry make_bpe() {
    std::vector<std::string> tokens;
    for (int b = 0; b < 256; ++b) {
        std::string s;
        nt::unicode::append_utf8(s, nt::unicode::byte_to_bpe_cp(uint8_t(b)));
        tokens.push_back(s);
    }
    std::vector<std::string> merges{
        "t h", "th e", "\xC4\xA0 th", "\xC4\xA0th e", "e r", "\xC4\xA0 \xC4\xA0", "1 2", "12 3"};
    for (const std::string& m : merges) {
        const size_t sp = m.find(' ');
        tokens.push_back(m.substr(0, sp) + m.substr(sp + 1));
    }
    std::vector<int32_t> types(tokens.size(), 1);
    for (const char* t : {"<|begin|>", "<|end|>", "<tool>"}) {
        tokens.push_back(t);
        types.push_back(std::string(t) == "<tool>" ? 4 : 3);
    }
    nt::GgufWriter w;
    w.set_string("tokenizer.ggml.model", "gpt2");
    w.set_string("tokenizer.ggml.pre", "llama-bpe");
    w.set_string_array("tokenizer.ggml.tokens", tokens);
    w.set_i32_array("tokenizer.ggml.token_type", types);
    w.set_string_array("tokenizer.ggml.merges", merges);
    w.set_u32("tokenizer.ggml.bos_token_id", uint32_t(tokens.size() - 3));
    w.set_u32("tokenizer.ggml.eos_token_id", uint32_t(tokens.size() - 2));
    Entry e;
    e.file = write_and_open(w, "bpe");
    e.tok = nt::Tokenizer::from_gguf(*e.file);
    return e;
}

void find_missing_bytes(Entry& e) {
    e.byte_missing.assign(256, false);
    for (int b = 0; b < 256; ++b) {
        std::string s;
        nt::unicode::append_utf8(s, nt::unicode::byte_to_bpe_cp(uint8_t(b)));
        e.byte_missing[b] = e.tok->find_token(s) < 0;
    }
}

std::vector<Entry>& tokenizers() {
    static std::vector<Entry>* all = [] {
        auto* v = new std::vector<Entry>;
        v->push_back(make_spm());
        v->push_back(make_bpe());
        const char* env = std::getenv("NT_FUZZ_MODEL");
        const std::filesystem::path repo =
            std::filesystem::path(__FILE__).parent_path().parent_path().parent_path();
        const std::filesystem::path model =
            env ? std::filesystem::path(env) : repo / "models/SmolLM2-135M-Instruct.Q4_1.gguf";
        if (std::filesystem::exists(model)) {
            Entry e;
            e.file = nt::GgufFile::open(model.string());
            e.tok = nt::Tokenizer::from_gguf(*e.file);
            v->push_back(std::move(e));
        } else {
            std::fprintf(stderr,
                         "fuzz_tokenizer: %s not found; fuzzing the built-in vocabularies only\n",
                         model.string().c_str());
        }
        for (Entry& e : *v) {
            if (!e.spm) find_missing_bytes(e);
        }
        return v;
    }();
    return *all;
}

bool valid_utf8(const std::string& s) {
    for (size_t i = 0; i < s.size();) {
        const int n = nt::unicode::valid_utf8_at(s, i);
        if (n <= 0) return false;
        i += size_t(n);
    }
    return true;
}

void check(const Entry& e, const std::string& text, bool bos, bool special) {
    const nt::Tokenizer& tok = *e.tok;
    const std::vector<int32_t> ids = tok.encode(text, bos, special);
    for (int32_t id : ids) {
        if (id < 0 || id >= tok.n_vocab()) __builtin_trap();
    }
    if (bos && tok.add_bos() && (ids.empty() || ids[0] != tok.bos())) __builtin_trap();

    for (bool render : {false, true}) {
        nt::StreamDecoder sd(tok, render);
        for (int32_t id : ids) {
            if (!valid_utf8(sd.push(id))) __builtin_trap();
        }
        if (!valid_utf8(sd.flush())) __builtin_trap();
    }

    // Round trip: without special parsing, control tokens are never produced, and user-defined
    // ones render as their text. It needs valid UTF-8: SentencePiece splits malformed text by
    // lead-byte length, so a bad lead byte can swallow the escaped space after it, and
    // byte-level BPE turns malformed bytes into U+FFFD. SentencePiece also adds a space after a
    // special token and reads a literal U+2581 as the space it stands for; BPE drops bytes that
    // have no token.
    if (special || !valid_utf8(text)) return;
    bool promised = true;
    if (e.spm) {
        promised = text.find("<|ctl|>") == std::string::npos &&
                   text.find("\xE2\x96\x81") == std::string::npos;
    } else {
        for (unsigned char c : text) promised = promised && !e.byte_missing[c];
    }
    if (promised && tok.decode(tok.encode(text, false, false)) != text) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0) return 0;
    const uint8_t mode = data[0];
    if (mode & 0x80) {
        try {
            auto f = nt::GgufFile::parse(data + 1, size - 1, "fuzz.gguf");
            auto tok = nt::Tokenizer::from_gguf(*f);
            for (const char* text :
                 {"", "Hello world", " a\n\tb  ", "\xF0\x9F\x98\x80\xFF", "<s>"}) {
                for (int32_t id : tok->encode(text, true, true)) {
                    if (id < 0 || id >= tok->n_vocab()) __builtin_trap();
                    (void)tok->token_to_piece(id);
                }
            }
        } catch (const nt::Error&) {
        }
        return 0;
    }
    const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
    for (const Entry& e : tokenizers()) check(e, text, mode & 1, mode & 2);
    return 0;
}
