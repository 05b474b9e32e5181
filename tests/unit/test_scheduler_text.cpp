// StopTextStream: what a client sees of a job's tokens — complete UTF-8, cut before the first
// stop string, nothing released that could still become one — checked against the tokenizer's
// own decode of the same tokens.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "engine/engine.h"
#include "server/text_stream.h"
#include "smol_model_test.h"

namespace nt {
namespace {

using testing_smol::kSmolPath;

bool valid_utf8(const std::string& s) {
    size_t i = 0;
    while (i < s.size()) {
        const unsigned char c = static_cast<unsigned char>(s[i]);
        const int n = c < 0x80         ? 1
                      : (c >> 5) == 6  ? 2
                      : (c >> 4) == 14 ? 3
                      : (c >> 3) == 30 ? 4
                                       : 0;
        if (n == 0 || i + size_t(n) > s.size()) return false;
        for (int k = 1; k < n; k++)
            if ((static_cast<unsigned char>(s[i + size_t(k)]) >> 6) != 2) return false;
        i += size_t(n);
    }
    return true;
}

class TextStreamTest : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        if (std::filesystem::exists(kSmolPath)) {
            file_ = GgufFile::open(kSmolPath).release();
            tok_ = Tokenizer::from_gguf(*file_).release();
        }
    }
    static void TearDownTestSuite() {
        delete tok_;
        delete file_;
        tok_ = nullptr;
        file_ = nullptr;
    }
    void SetUp() override {
        if (!tok_) {
            if (testing_smol::missing_model_allowed()) GTEST_SKIP() << kSmolPath << " not present";
            FAIL() << kSmolPath << " is missing; run scripts/fetch-model.sh";
        }
    }

    // Feeds the tokens of `text`; returns every piece released (the last one from finish()).
    static std::vector<std::string> run(StopTextStream& s, const std::string& text) {
        std::vector<std::string> pieces;
        for (int32_t id : tok_->encode(text, false, false)) pieces.push_back(s.push(id));
        pieces.push_back(s.finish());
        return pieces;
    }
    static std::string join(const std::vector<std::string>& v) {
        std::string o;
        for (const std::string& s : v) o += s;
        return o;
    }

    static GgufFile* file_;
    static Tokenizer* tok_;
};
GgufFile* TextStreamTest::file_ = nullptr;
Tokenizer* TextStreamTest::tok_ = nullptr;

TEST_F(TextStreamTest, WithoutStopsItIsTheDecodedText) {
    const std::string text =
        "Hello, world! Numbers 12345, symbols #&*, and accents: café, naïve, Ελληνικά, 日本語 "
        "🦙.";
    StopTextStream s(*tok_, {});
    const auto pieces = run(s, text);
    EXPECT_EQ(join(pieces), tok_->decode(tok_->encode(text, false, false)));
    EXPECT_EQ(join(pieces), text);
    for (const std::string& p : pieces)
        EXPECT_TRUE(valid_utf8(p)) << "a piece splits a character: " << p;
    EXPECT_FALSE(s.stopped());
    EXPECT_EQ(s.released(), text.size());
}

TEST_F(TextStreamTest, CutsBeforeAStopSpanningTokens) {
    StopTextStream s(*tok_, {"unused stop", "end is"});
    const auto pieces = run(s, "Hello world. The end is near, they said.");
    EXPECT_EQ(join(pieces), "Hello world. The ");
    EXPECT_TRUE(s.stopped());
    EXPECT_EQ(s.push(tok_->encode(" more", false, false)[0]), "");  // later tokens are ignored
    EXPECT_EQ(s.released(), std::string("Hello world. The ").size());
}

TEST_F(TextStreamTest, HoldsBackAPossibleStopUntilItIsDecided) {
    // "near" might become "near!": it is held back while it could, and released at the end.
    StopTextStream s(*tok_, {"near!"});
    std::vector<int32_t> ids = tok_->encode("Hello near", false, false);
    std::string released;
    for (int32_t id : ids) released += s.push(id);
    EXPECT_EQ(released, "Hello ");
    EXPECT_EQ(s.finish(), "near");
    EXPECT_FALSE(s.stopped());

    // The same text followed by '!' stops instead.
    StopTextStream t(*tok_, {"near!"});
    EXPECT_EQ(join(run(t, "Hello near! Bye")), "Hello ");
    EXPECT_TRUE(t.stopped());
}

TEST_F(TextStreamTest, MultiByteStopsAndOffsets) {
    StopTextStream s(*tok_, {"☕"});
    const std::string text = "café ☕ naïve";
    std::vector<int32_t> ids = tok_->encode(text, false, false);
    std::string out;
    for (size_t i = 0; i < ids.size() && !s.stopped(); i++) {
        out += s.push(ids[i]);
        // The token's text begins where the decoded text of the tokens before it ends, when
        // that is whole characters (inside one, the held bytes are not text yet).
        const std::string before =
            tok_->decode(std::vector<int32_t>(ids.begin(), ids.begin() + int64_t(i)));
        if (!s.stopped() && valid_utf8(before)) {
            EXPECT_EQ(s.last_token_offset(), before.size());
        }
    }
    out += s.finish();
    EXPECT_EQ(out, "café ");
    EXPECT_TRUE(valid_utf8(out));
}

}  // namespace
}  // namespace nt
