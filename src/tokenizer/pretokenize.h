// Byte-level BPE pre-tokenizers: split text into the words that BPE merges stay inside. Each is a
// hand-written scanner over code points that reproduces llama.cpp's split for the same
// tokenizer.ggml.pre, quirks included (its own scanners stand in for the published regexes).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace nt::pretok {

enum class Kind {
    // llama.cpp's fallback for "default" or a missing pre: punctuation runs, then GPT-2, then
    // number runs, then ASCII digit triples.
    Default,
    // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)
    Gpt2,
    // \p{N} isolated first, then Gpt2 (starcoder, smollm, ...).
    Smollm,
    // (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
    // \s*[\r\n]+|\s+(?!\S)|\s+
    Llama3,
    // Llama3 with \p{N} instead of \p{N}{1,3}.
    Qwen2,
};

// Maps tokenizer.ggml.pre to a Kind (llama.cpp's names); false when not supported.
bool kind_from_name(std::string_view pre, Kind& kind);

// Splits code points into words; returns their lengths in code points (all > 0, summing to
// cps.size()).
std::vector<size_t> split(Kind kind, const std::vector<uint32_t>& cps);

}  // namespace nt::pretok
