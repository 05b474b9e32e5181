// Text <-> token ids from the vocabulary in a GGUF file's tokenizer.* metadata: SentencePiece
// ("llama") and byte-level BPE ("gpt2"). Ids equal llama.cpp's for the same file and text.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "gguf/gguf.h"
#include "tokenizer/pretokenize.h"

namespace nt {

class Tokenizer {
  public:
    // Throws nt::Error on an unsupported tokenizer.ggml.model / tokenizer.ggml.pre or a malformed
    // vocabulary.
    static std::unique_ptr<Tokenizer> from_gguf(const GgufFile& f);

    // add_bos: add the tokens the metadata asks for around a whole prompt (BOS when
    // tokenizer.ggml.add_bos_token, default true for SentencePiece and Llama 3, false for other
    // BPE; EOS when tokenizer.ggml.add_eos_token), like llama.cpp's add_special.
    // parse_special: control tokens written in the text (e.g. "<|im_start|>") become their ids.
    // User-defined tokens are always matched, as in llama.cpp.
    std::vector<int32_t> encode(std::string_view text, bool add_bos, bool parse_special) const;

    // Raw bytes of one token: SentencePiece "▁" -> space and <0xAB> -> that byte; BPE byte-level
    // characters -> bytes. Control and unknown tokens render as their text only when
    // render_special. Throws nt::Error for an id outside the vocabulary.
    std::string token_to_piece(int32_t id, bool render_special = true) const;

    // Concatenated pieces. For SentencePiece a space that starts the first non-empty piece is
    // dropped (the one encode() put in front of the text), so decode(encode(s)) == s for valid
    // UTF-8 text without special tokens (and, for SentencePiece, without a literal U+2581 '▁',
    // which stands for the space).
    std::string decode(const std::vector<int32_t>& ids, bool render_special = false) const;

    int32_t bos() const { return bos_; }
    int32_t eos() const { return eos_; }
    int32_t eot() const { return eot_; }  // -1 if none
    int32_t unk() const { return unk_; }  // -1 if none
    // End of generation: eos, eot, eom and the tokens llama.cpp recognises by name
    // (<|im_end|>, <|endoftext|>, <|eot_id|>, FIM pad/repo/file-separator tokens, ...).
    bool is_eog(int32_t id) const;
    bool add_bos() const { return add_bos_; }
    bool add_eos() const { return add_eos_; }
    // SentencePiece: encode() puts a space in front of the text (tokenizer.ggml.add_space_prefix).
    bool add_space_prefix() const { return type_ == Type::Spm && add_space_prefix_; }
    int32_t n_vocab() const { return int32_t(tokens_.size()); }
    const std::string& model() const { return model_; }
    const std::string& pre() const { return pre_; }
    std::string chat_template() const { return chat_template_; }  // tokenizer.chat_template or ""

    // The token's text as stored in the vocabulary; "" for an id outside it.
    const std::string& token_text(int32_t id) const;
    // Id of a token by its exact vocabulary text, or -1.
    int32_t find_token(std::string_view text) const;
    bool is_control(int32_t id) const;

    // Token attributes (llama.cpp's llama_token_attr bits).
    enum Attr : uint32_t {
        kAttrUndefined = 0,
        kAttrUnknown = 1 << 0,
        kAttrUnused = 1 << 1,
        kAttrNormal = 1 << 2,
        kAttrControl = 1 << 3,
        kAttrUserDefined = 1 << 4,
        kAttrByte = 1 << 5,
        kAttrLstrip = 1 << 7,
        kAttrRstrip = 1 << 8,
    };

  private:
    Tokenizer() = default;
    struct SvHash {
        using is_transparent = void;
        size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
    };
    using TextMap = std::unordered_map<std::string, int32_t, SvHash, std::equal_to<>>;

    // One fragment of the input after special-token partition: a token id or a byte range.
    struct Fragment {
        int32_t token;  // -1 for text
        size_t offset, length;
    };
    std::vector<Fragment> partition(std::string_view text, bool parse_special) const;
    void encode_spm(std::string_view text, std::vector<int32_t>& out) const;
    void encode_bpe(std::string_view text, std::vector<int32_t>& out) const;
    int32_t spm_byte_token(uint8_t byte) const;
    int32_t merge_symbol(std::string_view s) const;
    void detect_special_tokens(int32_t fim_pre, int32_t fim_suf, int32_t fim_mid, int32_t fim_pad,
                               int32_t fim_rep, int32_t fim_sep, const std::string& general_name);
    std::string make_piece(int32_t id) const;

    enum class Type { Spm, Bpe };
    Type type_ = Type::Spm;
    pretok::Kind pre_kind_ = pretok::Kind::Default;
    std::string model_, pre_, chat_template_;

    std::vector<std::string> tokens_;
    std::vector<float> scores_;
    std::vector<uint32_t> attrs_;
    std::vector<std::string> pieces_;  // token_to_piece(id, true), computed once
    TextMap token_to_id_;
    // BPE merges over interned strings: every string that is a side or the result of a merge
    // has an id, and (left id, right id) -> (rank, id of the merged string). A repeated merge
    // keeps its first rank, as in llama.cpp.
    struct Merge {
        int32_t rank, merged;
    };
    struct U64Hash {
        size_t operator()(uint64_t k) const { return size_t((k * 0x9E3779B97F4A7C15ull) >> 17); }
    };
    TextMap merge_symbols_;
    std::unordered_map<uint64_t, Merge, U64Hash> merges_;
    std::vector<int32_t> special_;    // control/user-defined/unknown ids, longest text first
    std::vector<int32_t> eog_;        // sorted
    std::vector<int32_t> spm_bytes_;  // SentencePiece byte tokens by byte value, -1 if missing

    int32_t bos_ = -1, eos_ = -1, eot_ = -1, eom_ = -1, unk_ = -1;
    bool add_bos_ = false, add_eos_ = false;
    bool add_space_prefix_ = false;  // SentencePiece: a space goes in front of each text run
    bool ignore_merges_ = false;     // Llama 3: a word that is a token is not merged
};

// Turns a stream of token ids into text, emitting only complete UTF-8: bytes of a character
// split across tokens are held back until it completes, and bytes that cannot start or continue
// a valid character come out as U+FFFD. Pieces render as token_to_piece(id, render_special).
class StreamDecoder {
  public:
    explicit StreamDecoder(const Tokenizer& tok, bool render_special = false)
        : tok_(tok), render_special_(render_special) {}
    std::string push(int32_t id);
    std::string flush();  // whatever is held back, an unfinished character as U+FFFD

  private:
    std::string drain(bool final);
    const Tokenizer& tok_;
    bool render_special_;
    std::string pending_;
};

}  // namespace nt
