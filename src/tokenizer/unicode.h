// The Unicode pieces the tokenizers need: code point categories (tables generated from Unicode
// 15.1, the version llama.cpp uses), UTF-8 decoding that treats malformed input exactly as
// llama.cpp does, and GPT-2's byte <-> printable-character mapping.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace nt::unicode {

// One category bit per code point (the general category's first letter), plus white space.
// The bit values match llama.cpp's unicode_cpt_flags so the scanners can be compared line by line.
enum CpFlag : uint16_t {
    kUndefined = 0x01,    // Cn: unassigned
    kNumber = 0x02,       // \p{N}
    kLetter = 0x04,       // \p{L}
    kSeparator = 0x08,    // \p{Z}
    kMark = 0x10,         // \p{M}
    kPunctuation = 0x20,  // \p{P}
    kSymbol = 0x40,       // \p{S}
    kControl = 0x80,      // \p{C}
    kCategoryMask = 0xFF,
    kWhitespace = 0x100,  // the White_Space property, what regex \s matches
};

struct CpRange {
    uint32_t first;
    uint16_t flags;
};

// Generated tables (unicode_tables.cpp).
extern const char* const kUnicodeVersion;
extern const CpRange kCategoryRanges[];
extern const size_t kCategoryRangeCount;
extern const uint32_t kWhiteSpace[];
extern const size_t kWhiteSpaceCount;

inline constexpr uint32_t kMaxCodepoint = 0x10FFFF;
inline constexpr uint32_t kReplacement = 0xFFFD;

// Category flags of a code point; kUndefined beyond U+10FFFF.
uint16_t flags(uint32_t cp);

// Length of a UTF-8 sequence from its first byte alone, as llama.cpp's unicode_len_utf8 does:
// continuation bytes and 0xF8..0xFF count as 1.
inline size_t utf8_len(uint8_t lead) {
    static constexpr uint8_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return kLen[lead >> 4];
}

// Decodes one code point at s[off] and advances off. Mirrors llama.cpp, which is lenient about
// overlong forms and surrogates (it decodes them) and turns every other malformed byte into
// U+FFFD, consuming one byte. Values above U+10FFFF (which llama.cpp cannot re-encode) are
// treated as malformed too.
uint32_t decode_utf8(std::string_view s, size_t& off);
std::vector<uint32_t> to_codepoints(std::string_view s);
void append_utf8(std::string& out, uint32_t cp);  // cp <= U+10FFFF

// Strict validation for text handed to users: length of the valid UTF-8 sequence at s[off],
// 0 if it is malformed, or -1 if it is a valid but incomplete prefix cut off by the end of s.
int valid_utf8_at(std::string_view s, size_t off);

// GPT-2 byte-level encoding: every byte maps to one printable code point (space -> U+0120 'Ġ').
uint32_t byte_to_bpe_cp(uint8_t b);
int bpe_cp_to_byte(uint32_t cp);  // -1 when cp is not one of the 256 mapped code points
// Appends the byte-level encoding of raw bytes.
void append_bpe_bytes(std::string& out, std::string_view raw);

}  // namespace nt::unicode
