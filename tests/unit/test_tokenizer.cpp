// Tokenizer: hand-checkable SentencePiece and BPE vocabularies written with GgufWriter (merge
// order, score ties, byte fallback, special-token partition), the pre-tokenizer splits against
// the regexes they implement, Unicode tables, the stream decoder, vocabulary errors, and SmolLM2
// ids recorded from llama.cpp (tests/python/test_tokenizer_vs_llamacpp.py compares thousands more).
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>

#include "core/error.h"
#include "gguf/gguf.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace nt {
namespace {

using Ids = std::vector<int32_t>;

const std::string kSmolPath = NT_SOURCE_DIR "/models/SmolLM2-135M-Instruct.Q4_1.gguf";

struct TempGguf {
    std::string path;
    explicit TempGguf(const std::string& tag) {
        path = (std::filesystem::temp_directory_path() /
                ("nt_test_tok_" + std::to_string(getpid()) + "_" + tag + ".gguf"))
                   .string();
    }
    ~TempGguf() { std::remove(path.c_str()); }
};

// Writes the writer's file and loads its tokenizer.
std::unique_ptr<Tokenizer> load(GgufWriter& w, const std::string& tag) {
    TempGguf t(tag);
    w.set_string("general.architecture", "llama");
    w.write(t.path);
    auto f = GgufFile::open(t.path);
    return Tokenizer::from_gguf(*f);
}

std::string load_error(GgufWriter& w, const std::string& tag) {
    try {
        load(w, tag);
    } catch (const Error& e) {
        return e.what();
    }
    return "(no error)";
}

bool is_valid_utf8(const std::string& s) {
    for (size_t i = 0; i < s.size();) {
        const int n = unicode::valid_utf8_at(s, i);
        if (n <= 0) return false;
        i += size_t(n);
    }
    return true;
}

// ---- SentencePiece ----------------------------------------------------------------------------

// <unk> <s> </s>, 256 byte tokens, then a few pieces with chosen scores.
struct SpmVocab {
    std::vector<std::string> tokens{"<unk>", "<s>", "</s>"};
    std::vector<float> scores{0, 0, 0};
    std::vector<int32_t> types{2, 3, 3};
    SpmVocab() {
        for (int b = 0; b < 256; ++b) {
            tokens.push_back(strfmt("<0x%02X>", b));
            scores.push_back(0);
            types.push_back(6);
        }
    }
    int32_t add(const std::string& t, float score, int32_t type = 1) {
        tokens.push_back(t);
        scores.push_back(score);
        types.push_back(type);
        return int32_t(tokens.size() - 1);
    }
    void write_to(GgufWriter& w) const {
        w.set_string("tokenizer.ggml.model", "llama");
        w.set_string_array("tokenizer.ggml.tokens", tokens);
        w.set_f32_array("tokenizer.ggml.scores", scores);
        w.set_i32_array("tokenizer.ggml.token_type", types);
    }
};

constexpr int32_t kByte0 = 3;  // id of <0x00>

TEST(TokenizerSpm, MergesByScoreWithByteFallback) {
    SpmVocab v;
    const int32_t sp = v.add("\xE2\x96\x81", -10), a = v.add("a", -10), b = v.add("b", -10),
                  c = v.add("c", -10),
                  sp_a = v.add(
                      "\xE2\x96\x81"
                      "a",
                      -1),
                  ab = v.add("ab", -2), bc = v.add("bc", -0.5f);
    v.add("abc", -4);
    GgufWriter w;
    v.write_to(w);
    auto tok = load(w, "spm1");
    EXPECT_TRUE(tok->add_bos());
    EXPECT_EQ(tok->bos(), 1);
    EXPECT_EQ(tok->eos(), 2);
    // "▁abc": bc (-0.5) merges first, then ▁a (-1); "▁a"+"bc" is no token, and "ab" went stale.
    EXPECT_EQ(tok->encode("abc", false, false), (Ids{sp_a, bc}));
    EXPECT_EQ(tok->encode("abc", true, false), (Ids{1, sp_a, bc}));
    // Spaces become ▁ and every text run gets one in front.
    EXPECT_EQ(tok->encode("a b", false, false), (Ids{sp_a, sp, b}));
    // é has no piece: its UTF-8 bytes fall back to byte tokens.
    EXPECT_EQ(tok->encode("\xC3\xA9", false, false), (Ids{sp, kByte0 + 0xC3, kByte0 + 0xA9}));
    // Malformed UTF-8 is split by lead-byte length, like llama.cpp, then byte-encoded.
    EXPECT_EQ(tok->encode("c\xFF", false, false), (Ids{sp, c, kByte0 + 0xFF}));
    EXPECT_EQ(tok->encode("", false, false), Ids{});
    EXPECT_EQ(tok->encode("", true, false), Ids{1});

    EXPECT_EQ(tok->decode({1, sp_a, bc}), "abc");
    EXPECT_EQ(tok->decode({sp, kByte0 + 0xC3, kByte0 + 0xA9}), "\xC3\xA9");
    EXPECT_EQ(tok->decode({sp_a, sp, b}), "a b");
    EXPECT_EQ(tok->decode({1, sp_a}, true), "<s> a");  // only a leading space is dropped
    EXPECT_EQ(tok->token_to_piece(sp_a), " a");
    EXPECT_EQ(tok->token_to_piece(kByte0 + 0x41), "A");
    EXPECT_EQ(tok->token_to_piece(1, false), "");
    EXPECT_EQ(tok->token_to_piece(1, true), "<s>");
    EXPECT_EQ(tok->token_to_piece(ab), "ab");
    (void)a;
}

TEST(TokenizerSpm, EqualScoresMergeLeftmostFirst) {
    SpmVocab v;
    const int32_t a = v.add("a", -10), b = v.add("b", -10), c = v.add("c", -10);
    const int32_t ab = v.add("ab", -1), bc = v.add("bc", -1);
    GgufWriter w;
    v.write_to(w);
    w.set_bool("tokenizer.ggml.add_space_prefix", false);
    w.set_bool("tokenizer.ggml.add_bos_token", false);
    w.set_bool("tokenizer.ggml.add_eos_token", true);
    auto tok = load(w, "spm2");
    EXPECT_FALSE(tok->add_bos());
    EXPECT_EQ(tok->encode("abc", false, false), (Ids{ab, c}));
    EXPECT_EQ(tok->encode("bca", false, false), (Ids{bc, a}));
    EXPECT_EQ(tok->encode("abc", true, false), (Ids{ab, c, 2}));  // add_eos_token
    EXPECT_EQ(tok->decode({ab, c}), "abc");
    (void)b;
}

TEST(TokenizerSpm, SpecialTokensStartANewRun) {
    SpmVocab v;
    const int32_t sp = v.add("\xE2\x96\x81", -10), a = v.add("a", -10);
    const int32_t im = v.add("<|im|>", 0, 3), tool = v.add("<tool>", 0, 4);
    GgufWriter w;
    v.write_to(w);
    auto tok = load(w, "spm3");
    // A control token needs parse_special; the text after any special token gets a new ▁.
    EXPECT_EQ(tok->encode("a<|im|>a", false, true), (Ids{sp, a, im, sp, a}));
    // User-defined tokens are matched even without parse_special.
    EXPECT_EQ(tok->encode("a<tool>a", false, false), (Ids{sp, a, tool, sp, a}));
    const Ids plain = tok->encode("<|im|>", false, false);
    EXPECT_EQ(plain.size(), 7u);  // ▁ then bytes for < | i m | >
    EXPECT_EQ(tok->decode(plain), "<|im|>");
}

// ---- byte-level BPE ---------------------------------------------------------------------------

struct BpeVocab {
    // Byte-level characters for the ASCII we use; "Ġ" is the space.
    std::vector<std::string> tokens{"a",
                                    "b",
                                    "c",
                                    "<",
                                    "|",
                                    "x",
                                    ">",
                                    "u",
                                    "\xC4\xA0",
                                    "ab",
                                    "bc",
                                    "\xC4\xA0"
                                    "a"};
    std::vector<int32_t> types = std::vector<int32_t>(12, 1);
    int32_t id(const std::string& t) const {
        return int32_t(std::find(tokens.begin(), tokens.end(), t) - tokens.begin());
    }
    int32_t add(const std::string& t, int32_t type) {
        tokens.push_back(t);
        types.push_back(type);
        return int32_t(tokens.size() - 1);
    }
    void write_to(GgufWriter& w, const std::vector<std::string>& merges,
                  const std::string& pre = "gpt-2") const {
        w.set_string("tokenizer.ggml.model", "gpt2");
        w.set_string("tokenizer.ggml.pre", pre);
        w.set_string_array("tokenizer.ggml.tokens", tokens);
        w.set_i32_array("tokenizer.ggml.token_type", types);
        w.set_string_array("tokenizer.ggml.merges", merges);
    }
};

TEST(TokenizerBpe, LowestRankMergesFirst) {
    BpeVocab v;
    {
        GgufWriter w;
        v.write_to(w, {"b c", "a b", "\xC4\xA0 a"});
        auto tok = load(w, "bpe1");
        EXPECT_FALSE(tok->add_bos());  // BPE default, except Llama 3
        EXPECT_EQ(tok->encode("abc", false, false), (Ids{v.id("a"), v.id("bc")}));
        EXPECT_EQ(tok->encode("abc a", false, false), (Ids{v.id("a"), v.id("bc"),
                                                           v.id("\xC4\xA0"
                                                                "a")}));
        EXPECT_EQ(tok->decode(tok->encode("abc a", false, false)), "abc a");
        EXPECT_EQ(tok->token_to_piece(v.id("\xC4\xA0"
                                           "a")),
                  " a");
    }
    {
        GgufWriter w;
        v.write_to(w, {"a b", "b c", "\xC4\xA0 a"});
        auto tok = load(w, "bpe2");
        EXPECT_EQ(tok->encode("abc", false, false), (Ids{v.id("ab"), v.id("c")}));
    }
}

TEST(TokenizerBpe, SpecialPartitionLongestFirst) {
    BpeVocab v;
    const int32_t ctl = v.add("<|x|>", 3), u1 = v.add("<u>", 4), u2 = v.add("<u><u>", 4);
    GgufWriter w;
    v.write_to(w, {"a b"});
    w.set_u32("tokenizer.ggml.bos_token_id", uint32_t(ctl));
    w.set_bool("tokenizer.ggml.add_bos_token", true);
    auto tok = load(w, "bpe3");
    EXPECT_EQ(tok->encode("<u><u><u>", false, false), (Ids{u2, u1}));
    EXPECT_EQ(tok->encode("ab<|x|>ab", false, true), (Ids{v.id("ab"), ctl, v.id("ab")}));
    EXPECT_EQ(tok->encode("<|x|>", false, false),
              (Ids{v.id("<"), v.id("|"), v.id("x"), v.id("|"), v.id(">")}));
    EXPECT_EQ(tok->encode("ab", true, false), (Ids{ctl, v.id("ab")}));
    EXPECT_EQ(tok->decode({ctl, v.id("ab"), u1}), "ab<u>");  // user-defined always renders
    EXPECT_EQ(tok->decode({ctl, v.id("ab"), u1}, true), "<|x|>ab<u>");
}

TEST(TokenizerBpe, Llama3SkipsMergesForWholeTokens) {
    BpeVocab v;
    const int32_t abc = v.add("abc", 1);
    GgufWriter w;
    v.write_to(w, {"a b", "b c"}, "llama-bpe");
    auto tok = load(w, "bpe4");
    EXPECT_TRUE(tok->add_bos());  // Llama 3's default
    // "abc" is a token, so llama-bpe takes it whole although no merge builds it.
    EXPECT_EQ(tok->encode("abc", false, false), (Ids{abc}));
    GgufWriter w2;
    v.write_to(w2, {"a b", "b c"}, "gpt-2");
    EXPECT_EQ(load(w2, "bpe5")->encode("abc", false, false), (Ids{v.id("ab"), v.id("c")}));
}

// ---- vocabulary errors ------------------------------------------------------------------------

TEST(TokenizerErrors, OneSentenceNamingTheProblem) {
    {
        GgufWriter w;
        w.set_string("tokenizer.ggml.model", "bert");
        w.set_string_array("tokenizer.ggml.tokens", {"a"});
        EXPECT_NE(load_error(w, "e1").find("tokenizer.ggml.model 'bert' is not supported"),
                  std::string::npos);
    }
    {
        GgufWriter w;
        w.set_string_array("tokenizer.ggml.tokens", {"a"});
        EXPECT_NE(load_error(w, "e2").find("tokenizer.ggml.model is missing"), std::string::npos);
    }
    {
        BpeVocab v;
        GgufWriter w;
        v.write_to(w, {"a b"}, "no-such-pre");
        EXPECT_NE(load_error(w, "e3").find("tokenizer.ggml.pre 'no-such-pre' is not supported"),
                  std::string::npos);
    }
    {
        GgufWriter w;
        w.set_string("tokenizer.ggml.model", "gpt2");
        w.set_string_array("tokenizer.ggml.tokens", {"a", "b"});
        EXPECT_NE(load_error(w, "e4").find("tokenizer.ggml.merges is missing"), std::string::npos);
    }
    {
        GgufWriter w;
        w.set_string("tokenizer.ggml.model", "llama");
        w.set_string_array("tokenizer.ggml.tokens", {"a", "b", "a"});
        EXPECT_NE(load_error(w, "e5").find("repeats the token 'a' (ids 0 and 2)"),
                  std::string::npos);
    }
    {
        GgufWriter w;
        w.set_string("tokenizer.ggml.model", "llama");
        w.set_string_array("tokenizer.ggml.tokens", {"a", "b", "c"});
        w.set_f32_array("tokenizer.ggml.scores", {0, 0});
        EXPECT_NE(load_error(w, "e6").find("tokenizer.ggml.scores has 2 entries for 3 tokens"),
                  std::string::npos);
    }
    {
        GgufWriter w;
        w.set_string("tokenizer.ggml.model", "llama");
        w.set_i32_array("tokenizer.ggml.tokens", {1, 2});
        EXPECT_NE(load_error(w, "e7").find("must be an array of strings"), std::string::npos);
    }
    {
        GgufWriter w;
        w.set_string("tokenizer.ggml.model", "llama");
        w.set_string_array("tokenizer.ggml.tokens", {});
        EXPECT_NE(load_error(w, "e8").find("tokenizer.ggml.tokens is missing or empty"),
                  std::string::npos);
    }
}

// ---- pre-tokenizers ---------------------------------------------------------------------------

std::vector<std::string> words(pretok::Kind kind, const std::string& text) {
    const std::vector<uint32_t> cps = unicode::to_codepoints(text);
    std::vector<std::string> out;
    size_t start = 0;
    for (size_t len : pretok::split(kind, cps)) {
        std::string w;
        for (size_t i = start; i < start + len; ++i) unicode::append_utf8(w, cps[i]);
        out.push_back(w);
        start += len;
    }
    return out;
}

using Words = std::vector<std::string>;

TEST(TokenizerPretokenize, Llama3) {
    const auto k = pretok::Kind::Llama3;
    EXPECT_EQ(words(k, "Hello world"), (Words{"Hello", " world"}));
    EXPECT_EQ(words(k, "I'M here, it's"), (Words{"I", "'M", " here", ",", " it", "'s"}));
    EXPECT_EQ(words(k, "1234567"), (Words{"123", "456", "7"}));
    EXPECT_EQ(words(k, "a  b"), (Words{"a", " ", " b"}));
    EXPECT_EQ(words(k, "a\n\n  b"), (Words{"a", "\n\n", " ", " b"}));
    EXPECT_EQ(words(k, "x!!\n\ny"), (Words{"x", "!!\n\n", "y"}));
    EXPECT_EQ(words(k, "a   "), (Words{"a", "   "}));  // \s+ at the end takes the whole run
    EXPECT_EQ(words(k, "\xE6\x9D\xB1\xE4\xBA\xAC\xE3\x80\x82"),  // 東京。
              (Words{"\xE6\x9D\xB1\xE4\xBA\xAC", "\xE3\x80\x82"}));
    EXPECT_EQ(words(pretok::Kind::Qwen2, "x 123"), (Words{"x", " ", "1", "2", "3"}));
}

TEST(TokenizerPretokenize, Gpt2SmollmDefault) {
    const auto g = pretok::Kind::Gpt2;
    EXPECT_EQ(words(g, "it's IT'S"), (Words{"it", "'s", " IT", "'", "S"}));
    EXPECT_EQ(words(g, "a   b"), (Words{"a", "  ", " b"}));
    EXPECT_EQ(words(g, "x 123 y"), (Words{"x", " 123", " y"}));
    EXPECT_EQ(words(g, "f(x)+=1;"), (Words{"f", "(", "x", ")+=", "1", ";"}));
    // smollm isolates every digit before the GPT-2 split.
    EXPECT_EQ(words(pretok::Kind::Smollm, "x 123"), (Words{"x", " ", "1", "2", "3"}));
    // default: punctuation runs, GPT-2, number runs, then ASCII digit triples.
    EXPECT_EQ(words(pretok::Kind::Default, "a+=b 12345"),
              (Words{"a", "+=", "b", " ", "123", "45"}));
}

// ---- Unicode ----------------------------------------------------------------------------------

TEST(TokenizerUnicode, CategoriesAreUnicode15_1) {
    using namespace unicode;
    EXPECT_STREQ(kUnicodeVersion, "15.1.0");
    EXPECT_EQ(flags('A'), kLetter);
    EXPECT_EQ(flags('5'), kNumber);
    EXPECT_EQ(flags(' '), kSeparator | kWhitespace);
    EXPECT_EQ(flags('\n'), kControl | kWhitespace);
    EXPECT_EQ(flags(0x00A0), kSeparator | kWhitespace);
    EXPECT_EQ(flags(0x0301), kMark);
    EXPECT_EQ(flags(0x0663), kNumber);  // ARABIC-INDIC DIGIT THREE
    EXPECT_EQ(flags(0x216B), kNumber);  // ROMAN NUMERAL TWELVE (Nl)
    EXPECT_EQ(flags(0x3002), kPunctuation);
    EXPECT_EQ(flags(0x1F600), kSymbol);     // 😀
    EXPECT_EQ(flags(0x2EBF0), kLetter);     // CJK Extension I, new in 15.1
    EXPECT_EQ(flags(0x1CC00), kUndefined);  // assigned only in 16.0
    EXPECT_EQ(flags(0x0378), kUndefined);
    EXPECT_EQ(flags(0xE000), kControl);  // private use
    EXPECT_EQ(flags(0x110000), kUndefined);
}

TEST(TokenizerUnicode, DecodesMalformedInputLikeLlamaCpp) {
    // Overlong forms and surrogates decode; stray, truncated and > U+10FFFF bytes are U+FFFD each.
    EXPECT_EQ(unicode::to_codepoints("\xC0\xAF"), (std::vector<uint32_t>{0x2F}));
    EXPECT_EQ(unicode::to_codepoints("\xED\xA0\x80"), (std::vector<uint32_t>{0xD800}));
    EXPECT_EQ(unicode::to_codepoints("\x80"
                                     "a\xE2\x82"),
              (std::vector<uint32_t>{0xFFFD, 'a', 0xFFFD, 0xFFFD}));
    EXPECT_EQ(unicode::to_codepoints("\xF4\x90\x80\x80"),
              (std::vector<uint32_t>{0xFFFD, 0xFFFD, 0xFFFD, 0xFFFD}));
    EXPECT_EQ(unicode::byte_to_bpe_cp(' '), 0x120u);
    EXPECT_EQ(unicode::byte_to_bpe_cp('A'), uint32_t('A'));
    for (int b = 0; b < 256; ++b)
        EXPECT_EQ(unicode::bpe_cp_to_byte(unicode::byte_to_bpe_cp(uint8_t(b))), b);
    // Strict validation for output.
    EXPECT_EQ(unicode::valid_utf8_at("\xF0\x9F\x98\x80", 0), 4);
    EXPECT_EQ(unicode::valid_utf8_at("\xF0\x9F\x98", 0), -1);
    EXPECT_EQ(unicode::valid_utf8_at("\xC0\xAF", 0), 0);
    EXPECT_EQ(unicode::valid_utf8_at("\xED\xA0\x80", 0), 0);
}

// ---- SmolLM2 (ids recorded from llama.cpp 0.3.36 via llama-cpp-python) -------------------------

class TokenizerSmolLM2 : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        if (!std::filesystem::exists(kSmolPath)) return;
        file_ = GgufFile::open(kSmolPath).release();
        tok_ = Tokenizer::from_gguf(*file_).release();
    }
    static void TearDownTestSuite() {
        delete tok_;
        delete file_;
        tok_ = nullptr;
        file_ = nullptr;
    }
    void SetUp() override {
        if (!tok_) GTEST_SKIP() << kSmolPath << " is missing; run scripts/fetch-model.sh";
    }
    static int32_t byte_token(uint8_t b) {
        std::string s;
        unicode::append_utf8(s, unicode::byte_to_bpe_cp(b));
        return tok_->find_token(s);
    }
    static inline GgufFile* file_ = nullptr;
    static inline Tokenizer* tok_ = nullptr;
};

TEST_F(TokenizerSmolLM2, VocabularyFacts) {
    EXPECT_EQ(tok_->model(), "gpt2");
    EXPECT_EQ(tok_->pre(), "smollm");
    EXPECT_EQ(tok_->n_vocab(), 49152);
    EXPECT_EQ(tok_->bos(), 1);
    EXPECT_EQ(tok_->eos(), 2);
    EXPECT_EQ(tok_->eot(), 0);  // llama.cpp meets <|endoftext|> before <|im_end|>
    EXPECT_FALSE(tok_->add_bos());
    for (int32_t id = 0; id < 20; ++id)
        EXPECT_EQ(tok_->is_eog(id), id == 0 || id == 2 || id == 4) << id;
    EXPECT_NE(tok_->chat_template().find("<|im_start|>"), std::string::npos);
    EXPECT_THROW(tok_->token_to_piece(49152), Error);
    EXPECT_THROW(tok_->token_to_piece(-1), Error);
}

TEST_F(TokenizerSmolLM2, IdsMatchLlamaCpp) {
    EXPECT_EQ(tok_->encode("<|im_start|>user\nHi there!<|im_end|>\n", true, true),
              (Ids{1, 4093, 198, 26843, 665, 17, 2, 198}));
    EXPECT_EQ(tok_->encode("<|im_start|>user\nHi there!<|im_end|>\n", false, false),
              (Ids{44,  108, 306, 79,  3738, 108, 46,  4093, 198, 26843,
                   665, 17,  44,  108, 306,  79,  486, 108,  46,  198}));
    EXPECT_EQ(tok_->encode("x<|im_start|>", false, true), (Ids{104, 1}));
    EXPECT_EQ(tok_->encode("Hello world<|im_start|>user 123456 it's", true, true),
              (Ids{19556, 905, 1, 4093, 216, 33, 34, 35, 36, 37, 38, 357, 506}));
    EXPECT_EQ(tok_->encode("\xF0\x9F\x98\x80", false, false), (Ids{10813, 242, 218}));
}

TEST_F(TokenizerSmolLM2, StreamDecoderHoldsSplitCharacters) {
    const std::string family =
        "\xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F"
        "\x91\xA7\xE2\x80\x8D\xF0\x9F\x91\xA6";  // 👨‍👩‍👧‍👦
    // Token by token as the model would emit it (the first token is half an emoji).
    const Ids ids = tok_->encode(family, false, false);
    ASSERT_EQ(ids.size(), 18u);
    StreamDecoder sd(*tok_);
    EXPECT_EQ(sd.push(ids[0]), "");
    std::string all;
    for (size_t i = 1; i < ids.size(); ++i) {
        const std::string out = sd.push(ids[i]);
        EXPECT_TRUE(is_valid_utf8(out)) << i;
        all += out;
    }
    all += sd.flush();
    EXPECT_EQ(all, family);

    // One byte token at a time: output only appears when a character completes.
    StreamDecoder bytes(*tok_);
    all.clear();
    size_t emitted_at = 0;
    for (size_t i = 0; i < family.size(); ++i) {
        const int32_t id = byte_token(uint8_t(family[i]));
        ASSERT_GE(id, 0);
        const std::string out = bytes.push(id);
        if (!out.empty()) {
            EXPECT_EQ(out, family.substr(emitted_at, i + 1 - emitted_at));
            emitted_at = i + 1;
        }
        all += out;
    }
    EXPECT_EQ(bytes.flush(), "");
    EXPECT_EQ(all, family);
}

TEST_F(TokenizerSmolLM2, StreamDecoderReplacesBrokenBytes) {
    const std::string fffd = "\xEF\xBF\xBD";
    StreamDecoder sd(*tok_);
    EXPECT_EQ(sd.push(byte_token(0x80)), fffd);       // stray continuation byte
    EXPECT_EQ(sd.push(byte_token(0xF0)), "");         // may still complete...
    EXPECT_EQ(sd.push(byte_token('a')), fffd + "a");  // ...but does not
    EXPECT_EQ(sd.push(byte_token(0xE2)), "");
    EXPECT_EQ(sd.push(byte_token(0x82)), "");
    EXPECT_EQ(sd.flush(), fffd);  // cut off at the end
    EXPECT_EQ(sd.push(byte_token(0xE0)), "");
    EXPECT_EQ(sd.push(byte_token(0x80)), fffd + fffd);  // overlong form
    // Control tokens stay silent unless asked for.
    EXPECT_EQ(sd.push(2), "");
    StreamDecoder special(*tok_, true);
    EXPECT_EQ(special.push(2), "<|im_end|>");
}

TEST_F(TokenizerSmolLM2, DecodeRoundTrips) {
    for (const char* text :
         {"Hello, world!", "  two leading spaces", "tabs\tand\nnewlines\r\n",
          "caf\xC3\xA9 \xE6\x9D\xB1", "\xF0\x9F\x98\x80 emoji", "1234567890", ""}) {
        EXPECT_EQ(tok_->decode(tok_->encode(text, true, false)), text);
    }
    EXPECT_EQ(tok_->decode(tok_->encode("<|im_start|>hi", false, true), true), "<|im_start|>hi");
    EXPECT_EQ(tok_->decode(tok_->encode("<|im_start|>hi", false, true), false), "hi");
}

TEST_F(TokenizerSmolLM2, LargeTextIsFast) {
    std::string text;
    while (text.size() < 100000)
        text += "The quick brown fox, 12345 jumps; \xE6\x9D\xB1\xE4\xBA\xAC! <|im_end|>\n";
    const auto t0 = std::chrono::steady_clock::now();
    const Ids ids = tok_->encode(text, false, true);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(s, 0.5) << ids.size() << " tokens";
    EXPECT_EQ(tok_->decode(ids, true), text);
}

}  // namespace
}  // namespace nt
