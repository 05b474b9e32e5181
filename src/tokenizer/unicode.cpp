// Unicode helpers for the tokenizers; see unicode.h.
#include "tokenizer/unicode.h"

#include <algorithm>
#include <array>

namespace nt::unicode {

namespace {

// Flags of the Basic Multilingual Plane in one flat table (128 KiB, built once); the rare code
// points above it take a binary search over the ranges.
struct BmpTable {
    std::vector<uint16_t> f;
    BmpTable() : f(0x10000) {
        for (size_t i = 0; i < kCategoryRangeCount; ++i) {
            const uint32_t lo = kCategoryRanges[i].first;
            if (lo >= 0x10000) break;
            const uint32_t hi = i + 1 < kCategoryRangeCount
                                    ? std::min<uint32_t>(kCategoryRanges[i + 1].first, 0x10000)
                                    : 0x10000;
            std::fill(f.begin() + lo, f.begin() + hi, kCategoryRanges[i].flags);
        }
        for (size_t i = 0; i < kWhiteSpaceCount; ++i) f[kWhiteSpace[i]] |= kWhitespace;
    }
};

const BmpTable& bmp() {
    static const BmpTable t;
    return t;
}

}  // namespace

uint16_t flags(uint32_t cp) {
    if (cp < 0x10000) return bmp().f[cp];
    if (cp > kMaxCodepoint) return kUndefined;
    // No astral code point is white space.
    const CpRange* end = kCategoryRanges + kCategoryRangeCount;
    const CpRange* it = std::upper_bound(kCategoryRanges, end, cp,
                                         [](uint32_t c, const CpRange& r) { return c < r.first; });
    return (it - 1)->flags;
}

uint32_t decode_utf8(std::string_view s, size_t& off) {
    const auto at = [&](size_t i) { return static_cast<uint8_t>(s[i]); };
    const auto cont = [&](size_t i) { return i < s.size() && (at(i) & 0xC0) == 0x80; };
    const uint8_t b = at(off);
    uint32_t cp = 0;
    size_t n = 0;
    if (b < 0x80) {
        cp = b, n = 1;
    } else if (b < 0xC0) {
        n = 0;  // stray continuation byte
    } else if (b < 0xE0) {
        if (cont(off + 1)) cp = ((b & 0x1Fu) << 6) | (at(off + 1) & 0x3Fu), n = 2;
    } else if (b < 0xF0) {
        if (cont(off + 1) && cont(off + 2))
            cp = ((b & 0x0Fu) << 12) | ((at(off + 1) & 0x3Fu) << 6) | (at(off + 2) & 0x3Fu), n = 3;
    } else if (b < 0xF8) {
        if (cont(off + 1) && cont(off + 2) && cont(off + 3)) {
            cp = ((b & 0x07u) << 18) | ((at(off + 1) & 0x3Fu) << 12) |
                 ((at(off + 2) & 0x3Fu) << 6) | (at(off + 3) & 0x3Fu);
            n = cp <= kMaxCodepoint ? 4 : 0;
        }
    }
    if (n == 0) {
        off += 1;
        return kReplacement;
    }
    off += n;
    return cp;
}

std::vector<uint32_t> to_codepoints(std::string_view s) {
    std::vector<uint32_t> cps;
    cps.reserve(s.size());
    for (size_t off = 0; off < s.size();) cps.push_back(decode_utf8(s, off));
    return cps;
}

void append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
        out.push_back(char(cp));
    } else if (cp < 0x800) {
        out.push_back(char(0xC0 | (cp >> 6)));
        out.push_back(char(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
        out.push_back(char(0xE0 | (cp >> 12)));
        out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(char(0x80 | (cp & 0x3F)));
    } else {
        out.push_back(char(0xF0 | (cp >> 18)));
        out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
        out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(char(0x80 | (cp & 0x3F)));
    }
}

int valid_utf8_at(std::string_view s, size_t off) {
    const uint8_t b = uint8_t(s[off]);
    if (b < 0x80) return 1;
    int n;
    uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte (excludes overlongs etc.)
    if (b >= 0xC2 && b <= 0xDF) {
        n = 2;
    } else if (b >= 0xE0 && b <= 0xEF) {
        n = 3;
        if (b == 0xE0) lo = 0xA0;
        if (b == 0xED) hi = 0x9F;  // surrogates
    } else if (b >= 0xF0 && b <= 0xF4) {
        n = 4;
        if (b == 0xF0) lo = 0x90;
        if (b == 0xF4) hi = 0x8F;
    } else {
        return 0;
    }
    for (int i = 1; i < n; ++i) {
        if (off + i >= s.size()) return -1;
        const uint8_t c = uint8_t(s[off + i]);
        if (i == 1 ? (c < lo || c > hi) : (c & 0xC0) != 0x80) return 0;
    }
    return n;
}

namespace {

// GPT-2's bytes_to_unicode(): printable Latin-1 bytes map to themselves, the other 68 bytes to
// U+0100 upwards in byte order.
struct ByteMap {
    std::array<uint32_t, 256> to_cp{};
    std::array<std::string, 256> to_utf8;
    std::array<int16_t, 256 + 68> from_cp;  // inverse of to_cp; -1 where unmapped
    ByteMap() {
        from_cp.fill(-1);
        int n = 0;
        for (int b = 0; b < 256; ++b) {
            const bool printable =
                (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
            to_cp[b] = printable ? uint32_t(b) : uint32_t(256 + n++);
            append_utf8(to_utf8[b], to_cp[b]);
            from_cp[to_cp[b]] = int16_t(b);
        }
    }
};

const ByteMap& byte_map() {
    static const ByteMap m;
    return m;
}

}  // namespace

uint32_t byte_to_bpe_cp(uint8_t b) {
    return byte_map().to_cp[b];
}

int bpe_cp_to_byte(uint32_t cp) {
    const ByteMap& m = byte_map();
    return cp < m.from_cp.size() ? m.from_cp[cp] : -1;
}

void append_bpe_bytes(std::string& out, std::string_view raw) {
    const ByteMap& m = byte_map();
    for (char c : raw) out += m.to_utf8[uint8_t(c)];
}

}  // namespace nt::unicode
