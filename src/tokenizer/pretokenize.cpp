// Pre-tokenizer scanners; see pretokenize.h. The GPT-2 and Llama 3 scanners follow llama.cpp's
// unicode_regex_split_custom_gpt2/_llama3 step by step: where those differ from the regex they
// stand for (for instance, at the end of a segment "\s+(?!\S)" takes the whole run), token ids
// must still match llama.cpp, so the differences are kept. The remaining splits replace the
// std::regex passes llama.cpp runs over category-collapsed text.
#include "tokenizer/pretokenize.h"

#include <string>

#include "tokenizer/unicode.h"

namespace nt::pretok {

namespace {

using unicode::kLetter;
using unicode::kNumber;
using unicode::kWhitespace;

constexpr uint32_t kOutOfRange = 0xFFFFFFFF;

// One segment [ini, end) of the code points. Positions outside it read as kOutOfRange with no
// flags, so scanners stop at segment edges exactly as llama.cpp's do.
struct Segment {
    const uint32_t* cps;
    size_t ini, end;
    uint32_t cp(size_t p) const { return p >= ini && p < end ? cps[p] : kOutOfRange; }
    uint16_t fl(size_t p) const { return p >= ini && p < end ? unicode::flags(cps[p]) : 0; }
};

// Collects word lengths; add(end) closes the word that began at the previous end.
struct Words {
    std::vector<size_t>& out;
    size_t prev;
    size_t add(size_t end) {
        const size_t len = end - prev;
        if (len > 0) out.push_back(len);
        prev = end;
        return len;
    }
};

template <typename Fn>
std::vector<size_t> for_each_segment(const std::vector<uint32_t>& cps,
                                     const std::vector<size_t>& segs, Fn&& fn) {
    std::vector<size_t> out;
    out.reserve(segs.size() + cps.size() / 4);
    size_t start = 0;
    for (size_t len : segs) {
        fn(Segment{cps.data(), start, start + len}, Words{out, start});
        start += len;
    }
    return out;
}

bool is_ascii_lower(uint32_t c, char lower) {
    return c == uint32_t(lower) || c == uint32_t(lower - 32);
}

// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)
std::vector<size_t> split_gpt2(const std::vector<uint32_t>& cps, const std::vector<size_t>& segs) {
    return for_each_segment(cps, segs, [](const Segment s, Words w) {
        for (size_t pos = s.ini; pos < s.end;) {
            const uint32_t cpt = s.cp(pos);
            const uint16_t flags = s.fl(pos);
            if (cpt == '\'' && pos + 1 < s.end) {
                const uint32_t next = s.cp(pos + 1);
                if (next == 's' || next == 't' || next == 'm' || next == 'd') {
                    pos += w.add(pos + 2);
                    continue;
                }
                if (pos + 2 < s.end) {
                    const uint32_t next2 = s.cp(pos + 2);
                    if ((next == 'r' && next2 == 'e') || (next == 'v' && next2 == 'e') ||
                        (next == 'l' && next2 == 'l')) {
                        pos += w.add(pos + 3);
                        continue;
                    }
                }
            }
            uint16_t f2 = cpt == ' ' ? s.fl(pos + 1) : flags;
            if (f2 & kLetter) {  // ?\p{L}+
                pos += cpt == ' ';
                while (f2 & kLetter) f2 = s.fl(++pos);
                w.add(pos);
                continue;
            }
            if (f2 & kNumber) {  // ?\p{N}+
                pos += cpt == ' ';
                while (f2 & kNumber) f2 = s.fl(++pos);
                w.add(pos);
                continue;
            }
            if (!(f2 & (kWhitespace | kLetter | kNumber)) && f2) {  // ?[^\s\p{L}\p{N}]+
                pos += cpt == ' ';
                while (!(f2 & (kWhitespace | kLetter | kNumber)) && f2) f2 = s.fl(++pos);
                w.add(pos);
                continue;
            }
            size_t n_ws = 0;
            while (s.fl(pos + n_ws) & kWhitespace) ++n_ws;
            if (n_ws > 1 && s.cp(pos + n_ws) != kOutOfRange) {  // \s+(?!\S)
                pos += n_ws - 1;
                w.add(pos);
                continue;
            }
            if (n_ws > 0) {  // \s+
                pos += n_ws;
                w.add(pos);
                continue;
            }
            w.add(++pos);  // no match: the code point stands alone
        }
    });
}

// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max_digits}|
// ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
std::vector<size_t> split_llama3(const std::vector<uint32_t>& cps, const std::vector<size_t>& segs,
                                 size_t max_digits) {
    return for_each_segment(cps, segs, [max_digits](const Segment s, Words w) {
        for (size_t pos = s.ini; pos < s.end;) {
            const uint32_t cpt = s.cp(pos);
            const uint16_t flags = s.fl(pos);
            if (cpt == '\'' && pos + 1 < s.end) {
                // Only ASCII capitals lower-case to these letters, so ASCII folding suffices.
                const uint32_t next = s.cp(pos + 1);
                if (is_ascii_lower(next, 's') || is_ascii_lower(next, 't') ||
                    is_ascii_lower(next, 'm') || is_ascii_lower(next, 'd')) {
                    pos += w.add(pos + 2);
                    continue;
                }
                if (pos + 2 < s.end) {
                    const uint32_t next2 = s.cp(pos + 2);
                    if ((is_ascii_lower(next, 'r') && is_ascii_lower(next2, 'e')) ||
                        (is_ascii_lower(next, 'v') && is_ascii_lower(next2, 'e')) ||
                        (is_ascii_lower(next, 'l') && is_ascii_lower(next2, 'l'))) {
                        pos += w.add(pos + 3);
                        continue;
                    }
                }
            }
            if (!(cpt == '\r' || cpt == '\n' || (flags & kNumber))) {  // [^\r\n\p{L}\p{N}]?\p{L}+
                if ((flags & kLetter) || (s.fl(pos + 1) & kLetter)) {
                    ++pos;
                    while (s.fl(pos) & kLetter) ++pos;
                    w.add(pos);
                    continue;
                }
            }
            if (flags & kNumber) {  // \p{N}{1,max_digits}
                size_t ini = pos;
                while (s.fl(pos) & kNumber) {
                    if (++pos - ini >= max_digits) {
                        w.add(pos);
                        ini = pos;
                    }
                }
                w.add(pos);
                continue;
            }
            uint16_t f2 = cpt == ' ' ? s.fl(pos + 1) : flags;
            if (!(f2 & (kWhitespace | kLetter | kNumber)) && flags) {  // ?[^\s\p{L}\p{N}]+[\r\n]*
                pos += cpt == ' ';
                while (!(f2 & (kWhitespace | kLetter | kNumber)) && f2) f2 = s.fl(++pos);
                uint32_t c2 = s.cp(pos);
                while (c2 == '\r' || c2 == '\n') c2 = s.cp(++pos);
                w.add(pos);
                continue;
            }
            size_t n_ws = 0, last_newline_end = 0;
            while (s.fl(pos + n_ws) & kWhitespace) {
                const uint32_t c2 = s.cp(pos + n_ws);
                if (c2 == '\r' || c2 == '\n') last_newline_end = pos + n_ws + 1;
                ++n_ws;
            }
            if (last_newline_end > 0) {  // \s*[\r\n]+
                pos = last_newline_end;
                w.add(pos);
                continue;
            }
            if (n_ws > 1 && s.cp(pos + n_ws) != kOutOfRange) {  // \s+(?!\S)
                pos += n_ws - 1;
                w.add(pos);
                continue;
            }
            if (n_ws > 0) {  // \s+
                pos += n_ws;
                w.add(pos);
                continue;
            }
            w.add(++pos);
        }
    });
}

// What llama.cpp's std::regex passes do: successive leftmost matches of a simple pattern, with the
// text between matches kept as words of their own. match(s, pos) is the match length at pos.
template <typename Match>
std::vector<size_t> split_matches(const std::vector<uint32_t>& cps, const std::vector<size_t>& segs,
                                  Match&& match) {
    return for_each_segment(cps, segs, [&match](const Segment s, Words w) {
        for (size_t pos = s.ini; pos < s.end;) {
            const size_t n = match(s, pos);
            if (n == 0) {
                ++pos;
                continue;
            }
            w.add(pos);      // the gap before the match
            w.add(pos + n);  // the match
            pos += n;
        }
        w.add(s.end);
    });
}

bool is_number(uint32_t cp) {
    return unicode::flags(cp) & kNumber;
}

// [\p{P}\$\+<=>\^~\|]: llama.cpp runs it on collapsed text, where ASCII stands for itself
// (every ASCII punctuation or symbol but '`') and other code points match when their category is
// punctuation and they are not white space.
bool is_default_punct(uint32_t cp) {
    if (cp < 0x80)
        return cp != '`' && (unicode::flags(cp) & (unicode::kPunctuation | unicode::kSymbol));
    const uint16_t f = unicode::flags(cp);
    return !(f & kWhitespace) && (f & unicode::kCategoryMask) == unicode::kPunctuation;
}

size_t run_length(const Segment& s, size_t pos, bool (*pred)(uint32_t)) {
    size_t n = 0;
    while (pos + n < s.end && pred(s.cps[pos + n])) ++n;
    return n;
}

}  // namespace

bool kind_from_name(std::string_view pre, Kind& kind) {
    // llama.cpp's tokenizer.ggml.pre names for each split (and no other flag we would miss).
    static const struct {
        Kind kind;
        std::string_view names;  // space-separated
    } kNames[] = {
        {Kind::Default, "default"},
        {Kind::Llama3,
         "llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2 jina-v5-nano"},
        {Kind::Qwen2, "qwen2 deepseek-r1-qwen kormo f2llmv2 megrez stablelm2 hunyuan solar-open"},
        {Kind::Gpt2,
         "gpt-2 phi-2 gigachat a.x-4.0 mellum mpt olmo jais trillion granite-docling exaone4"},
        {Kind::Smollm, "smollm starcoder refact command-r codeshell exaone minerva-7b mellum2"},
    };
    if (pre.empty()) {  // llama.cpp warns and uses the default
        kind = Kind::Default;
        return true;
    }
    for (const auto& k : kNames) {
        for (size_t pos = 0; pos < k.names.size();) {
            size_t end = k.names.find(' ', pos);
            if (end == std::string_view::npos) end = k.names.size();
            if (k.names.substr(pos, end - pos) == pre) {
                kind = k.kind;
                return true;
            }
            pos = end + 1;
        }
    }
    return false;
}

std::vector<size_t> split(Kind kind, const std::vector<uint32_t>& cps) {
    if (cps.empty()) return {};
    std::vector<size_t> segs{cps.size()};
    switch (kind) {
        case Kind::Gpt2:
            return split_gpt2(cps, segs);
        case Kind::Llama3:
            return split_llama3(cps, segs, 3);
        case Kind::Qwen2:
            return split_llama3(cps, segs, 1);
        case Kind::Smollm:
            segs = split_matches(cps, segs, [](const Segment& s, size_t pos) -> size_t {
                return is_number(s.cps[pos]);  // \p{N}
            });
            return split_gpt2(cps, segs);
        case Kind::Default:
            segs = split_matches(cps, segs, [](const Segment& s, size_t pos) {
                return run_length(s, pos, is_default_punct);
            });
            segs = split_gpt2(cps, segs);
            segs = split_matches(cps, segs, [](const Segment& s, size_t pos) {
                return run_length(s, pos, is_number);  // \p{N}+
            });
            return split_matches(cps, segs, [](const Segment& s, size_t pos) -> size_t {
                const auto digit = [&](size_t p) {
                    return p < s.end && s.cps[p] >= '0' && s.cps[p] <= '9';
                };
                return digit(pos) && digit(pos + 1) && digit(pos + 2) ? 3 : 0;  // [0-9]{3}
            });
    }
    return segs;
}

}  // namespace nt::pretok
