// Vocabulary loading, special-token partition, SentencePiece and byte-level BPE encoding, and
// decoding. The algorithms follow llama.cpp's llama-vocab.cpp so that ids match it exactly; the
// places where we knowingly differ are marked "Differs from llama.cpp".
#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <bitset>
#include <queue>

#include "core/error.h"
#include "tokenizer/unicode.h"

namespace nt {

namespace {

constexpr std::string_view kSpmSpace = "\xE2\x96\x81";  // U+2581 '▁'

// The C locale's isspace, which llama.cpp uses to strip around lstrip/rstrip tokens.
bool c_isspace(char c) {
    return c == ' ' || (c >= '\t' && c <= '\r');
}

const GgufArray* array_of(const GgufFile& f, const char* key, bool strings) {
    const GgufValue* v = f.find(key);
    if (!v) return nullptr;
    if (v->type != GgufValueType::ARRAY) fail("%s: %s is not an array.", f.path().c_str(), key);
    const GgufArray& a = v->as_array();
    const bool is_string = a.elem_type == GgufValueType::STRING;
    if (strings != is_string || (!strings && a.elem_type == GgufValueType::BOOL))
        fail("%s: %s must be an array of %s.", f.path().c_str(), key,
             strings ? "strings" : "numbers");
    return &a;
}

std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
    std::string out;
    out.reserve(s.size());
    size_t pos = 0;
    for (size_t hit; (hit = s.find(from, pos)) != std::string::npos; pos = hit + from.size()) {
        out.append(s, pos, hit - pos);
        out += to;
    }
    out.append(s, pos);
    return out;
}

int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Loading

std::unique_ptr<Tokenizer> Tokenizer::from_gguf(const GgufFile& f) {
    std::unique_ptr<Tokenizer> t(new Tokenizer());
    const char* path = f.path().c_str();

    const GgufValue* model = f.find("tokenizer.ggml.model");
    if (!model || model->type != GgufValueType::STRING)
        fail("%s: tokenizer.ggml.model is missing, so the file has no usable vocabulary.", path);
    t->model_ = model->as_string();
    t->pre_ = f.get_string("tokenizer.ggml.pre", "");
    t->chat_template_ = f.get_string("tokenizer.chat_template", "");

    // Defaults per vocabulary type, as llama.cpp sets them before reading the metadata.
    if (t->model_ == "llama") {
        t->type_ = Type::Spm;
        t->bos_ = 1, t->eos_ = 2, t->unk_ = 0;
        t->add_space_prefix_ = true;
        t->add_bos_ = true;
    } else if (t->model_ == "gpt2") {
        t->type_ = Type::Bpe;
        if (!pretok::kind_from_name(t->pre_, t->pre_kind_))
            fail(
                "%s: tokenizer.ggml.pre '%s' is not supported (supported: default, llama-bpe/"
                "llama3, qwen2, gpt-2, smollm/starcoder and their aliases).",
                path, t->pre_.c_str());
        t->bos_ = 11, t->eos_ = 11;
        t->add_bos_ = t->pre_kind_ == pretok::Kind::Llama3;
        t->ignore_merges_ = t->pre_kind_ == pretok::Kind::Llama3;

        const GgufArray* merges = array_of(f, "tokenizer.ggml.merges", true);
        if (!merges) fail("%s: tokenizer.ggml.merges is missing from a BPE vocabulary.", path);
        const auto intern = [&](const std::string& s) {
            return t->merge_symbols_.try_emplace(s, int32_t(t->merge_symbols_.size()))
                .first->second;
        };
        t->merges_.reserve(merges->items.size());
        for (size_t i = 0; i < merges->items.size(); ++i) {
            // llama.cpp splits at the first space after the first byte. Byte-level words never
            // contain a raw space, so a merge without exactly one space can never apply.
            const std::string& m = merges->items[i].as_string();
            const size_t sp = m.find(' ', 1);
            if (sp == std::string::npos || m.find(' ', sp + 1) != std::string::npos || m[0] == ' ')
                continue;
            const std::string left = m.substr(0, sp), right = m.substr(sp + 1);
            const uint64_t key = uint64_t(uint32_t(intern(left))) << 32 | uint32_t(intern(right));
            const int32_t merged = intern(left + right);
            t->merges_.try_emplace(key, Merge{int32_t(i), merged});
        }
    } else {
        fail("%s: tokenizer.ggml.model '%s' is not supported (supported: llama, gpt2).", path,
             t->model_.c_str());
    }
    t->add_space_prefix_ = f.get_bool("tokenizer.ggml.add_space_prefix", t->add_space_prefix_);

    const GgufArray* tokens = array_of(f, "tokenizer.ggml.tokens", true);
    if (!tokens || tokens->items.empty())
        fail("%s: tokenizer.ggml.tokens is missing or empty.", path);
    const size_t n = tokens->items.size();
    if (n > size_t(INT32_MAX)) fail("%s: tokenizer.ggml.tokens has too many entries.", path);
    const GgufArray* scores = array_of(f, "tokenizer.ggml.scores", false);
    const GgufArray* types = array_of(f, "tokenizer.ggml.token_type", false);
    if (scores && scores->items.size() < n)
        fail("%s: tokenizer.ggml.scores has %zu entries for %zu tokens.", path,
             scores->items.size(), n);
    if (types && types->items.size() < n)
        fail("%s: tokenizer.ggml.token_type has %zu entries for %zu tokens.", path,
             types->items.size(), n);

    t->tokens_.resize(n);
    t->scores_.assign(n, 0.0f);
    t->attrs_.assign(n, kAttrNormal);
    for (size_t i = 0; i < n; ++i) {
        std::string word = tokens->items[i].as_string();
        if (word.empty()) word = "[EMPTY_" + std::to_string(i) + "]";  // as llama.cpp renames it
        // Filled like llama.cpp's token_to_id (a libstdc++ unordered_map hashing the same bytes
        // with the same function, same insertion order), so that iterating it in the name-based
        // detection below visits tokens in the order llama.cpp does.
        auto [it, fresh] = t->token_to_id_.try_emplace(word, int32_t(i));
        if (!fresh)
            fail("%s: tokenizer.ggml.tokens repeats the token '%s' (ids %d and %zu).", path,
                 word.c_str(), it->second, i);
        t->tokens_[i] = std::move(word);
        if (scores) t->scores_[i] = float(scores->items[i].as_float());
        if (types) {
            // GGUF token types 0..6: undefined, normal, unknown, control, user-defined, unused,
            // byte.
            static constexpr uint32_t kTypeAttr[] = {kAttrUndefined, kAttrNormal,      kAttrUnknown,
                                                     kAttrControl,   kAttrUserDefined, kAttrUnused,
                                                     kAttrByte};
            const int64_t type = types->items[i].as_int();
            t->attrs_[i] = type >= 0 && type < 7 ? kTypeAttr[type] : kAttrUndefined;
        }
    }

    // Special ids: a default outside the vocabulary is dropped; a metadata id outside it is
    // ignored (llama.cpp warns and keeps the default).
    auto special = [&](const char* key, int32_t& id) {
        if (id >= int32_t(n)) id = -1;
        const GgufValue* v = f.find(key);
        if (v && v->is_int() && v->as_int() >= 0 && v->as_int() < int64_t(n))
            id = int32_t(v->as_int());
    };
    special("tokenizer.ggml.bos_token_id", t->bos_);
    special("tokenizer.ggml.eos_token_id", t->eos_);
    special("tokenizer.ggml.eot_token_id", t->eot_);
    special("tokenizer.ggml.eom_token_id", t->eom_);
    special("tokenizer.ggml.unknown_token_id", t->unk_);
    int32_t fim_pad = -1, fim_rep = -1, fim_sep = -1, fim_pre = -1, fim_suf = -1, fim_mid = -1;
    special("tokenizer.ggml.fim_pre_token_id", fim_pre);
    special("tokenizer.ggml.fim_suf_token_id", fim_suf);
    special("tokenizer.ggml.fim_mid_token_id", fim_mid);
    special("tokenizer.ggml.fim_pad_token_id", fim_pad);
    special("tokenizer.ggml.fim_rep_token_id", fim_rep);
    special("tokenizer.ggml.fim_sep_token_id", fim_sep);
    special("tokenizer.ggml.prefix_token_id", fim_pre);
    special("tokenizer.ggml.suffix_token_id", fim_suf);
    special("tokenizer.ggml.middle_token_id", fim_mid);

    t->add_bos_ = f.get_bool("tokenizer.ggml.add_bos_token", t->add_bos_);
    t->add_eos_ = f.get_bool("tokenizer.ggml.add_eos_token", t->add_eos_);
    // Differs from llama.cpp, which aborts when asked to add a token the vocabulary lacks.
    if (t->bos_ < 0) t->add_bos_ = false;
    if (t->eos_ < 0) t->add_eos_ = false;

    t->detect_special_tokens(fim_pre, fim_suf, fim_mid, fim_pad, fim_rep, fim_sep,
                             f.get_string("general.name", ""));

    if (t->type_ == Type::Spm) {
        static const char* kHex = "0123456789ABCDEF";
        t->spm_bytes_.assign(256, -1);
        for (int b = 0; b < 256; ++b) {
            const char name[6] = {'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>'};
            const char raw = char(b);
            int32_t id = t->find_token(std::string_view(name, 6));
            if (id < 0) id = t->find_token(std::string_view(&raw, 1));  // llama.cpp's fallback
            t->spm_bytes_[b] = id;
        }
    }

    t->pieces_.resize(n);
    for (size_t i = 0; i < n; ++i) t->pieces_[i] = t->make_piece(int32_t(i));
    return t;
}

// Recognises end-of-generation and FIM tokens by name and fixes their attributes, builds the
// special-token list for the partition, all as llama.cpp's llama_vocab::impl::load does.
void Tokenizer::detect_special_tokens(int32_t fim_pre, int32_t fim_suf, int32_t fim_mid,
                                      int32_t fim_pad, int32_t fim_rep, int32_t fim_sep,
                                      const std::string& general_name) {
    const auto any_of = [](const std::string& s, const auto& names) {
        return std::find(std::begin(names), std::end(names), s) != std::end(names);
    };
    // When several candidates exist (SmolLM2 has both <|im_end|> and <|endoftext|>), llama.cpp
    // keeps the first it meets in its hash map; token_to_id_ is the same container filled in the
    // same order, so iterating it here picks the same one.
    auto claim = [&](int32_t& slot, const std::pair<const std::string, int32_t>& t,
                     std::initializer_list<std::string_view> names) {
        if (slot == -1 && any_of(t.first, names)) {
            slot = t.second;
            attrs_[t.second] |= kAttrControl;
        }
    };
    for (const auto& t : token_to_id_) {
        claim(eot_, t,
              {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
               "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>",
               "<end_of_utterance>"});
        claim(eom_, t, {"<|eom_id|>"});
        claim(fim_pre, t,
              {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>",
               "▁<PRE>", "<|code_prefix|>", "<|prefix|>"});
        claim(fim_suf, t,
              {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>",
               "▁<SUF>", "<|code_suffix|>", "<|suffix|>"});
        claim(fim_mid, t,
              {"<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
               "<|code_middle|>", "<|middle|>"});
        claim(fim_pad, t, {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"});
        claim(fim_rep, t, {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"});
        claim(fim_sep, t, {"<|file_sep|>"});
    }

    // Control tokens named "unused..." are unused.
    for (size_t i = 0; i < tokens_.size(); ++i) {
        if ((attrs_[i] & kAttrControl) && tokens_[i].find("unused") != std::string::npos)
            attrs_[i] |= kAttrUnused;
    }

    std::vector<int32_t> eog;
    for (int32_t id : {fim_pad, fim_rep, fim_sep}) {
        if (id >= 0) eog.push_back(id);
    }
    // clang-format off
    static constexpr std::string_view kEogNames[] = {
        "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
        "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
        "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
        "<｜end▁of▁sentence｜>", "[e~["};
    // clang-format on
    for (size_t i = 0; i < tokens_.size(); ++i) {
        if (any_of(tokens_[i], kEogNames)) {
            eog.push_back(int32_t(i));
            attrs_[i] |= kAttrControl;
        }
    }
    // gpt-oss: these always render.
    for (size_t i = 0; i < tokens_.size(); ++i) {
        if (any_of(tokens_[i], std::initializer_list<std::string_view>{
                                   "<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"}))
            attrs_[i] = kAttrUserDefined;
    }
    for (int32_t id : {eos_, eot_, eom_}) {
        if (id >= 0) eog.push_back(id);
    }
    std::sort(eog.begin(), eog.end());
    eog.erase(std::unique(eog.begin(), eog.end()), eog.end());
    const auto in_eog = [&](std::string_view text) {
        for (int32_t id : eog) {
            if (tokens_[id] == text) return id;
        }
        return -1;
    };
    // gpt-oss / solar-open: "<|end|>" ends a message, not the generation, when "<|return|>" and
    // "<|call|>" (or "<|calls|>" and "<|flush|>") exist.
    const int32_t end_id = in_eog("<|end|>");
    const bool has_call = in_eog("<|call|>") >= 0 || in_eog("<|calls|>") >= 0;
    if (end_id >= 0 && has_call && (in_eog("<|return|>") >= 0 || in_eog("<|flush|>") >= 0)) {
        eog.erase(std::find(eog.begin(), eog.end(), end_id));
        attrs_[end_id] = kAttrUserDefined;
    }
    // Gemma 4 and PLaMo 2 have an ordinary "</s>".
    const int32_t s_id = in_eog("</s>");
    if (s_id >= 0 && (in_eog("<|tool_response>") >= 0 || in_eog("<|plamo:eos|>") >= 0)) {
        eog.erase(std::find(eog.begin(), eog.end(), s_id));
        attrs_[s_id] = kAttrNormal;
    }
    eog_ = std::move(eog);

    // Tokens the partition looks for, longest first. std::sort over ascending ids with this
    // comparator is what llama.cpp does, so ties between equal lengths break the same way.
    for (size_t i = 0; i < tokens_.size(); ++i) {
        if (attrs_[i] & (kAttrControl | kAttrUserDefined | kAttrUnknown))
            special_.push_back(int32_t(i));
    }
    std::sort(special_.begin(), special_.end(),
              [&](int32_t a, int32_t b) { return tokens_[a].size() > tokens_[b].size(); });

    // Phi-3's special tokens swallow the white space after them.
    std::string name = general_name;
    std::transform(name.begin(), name.end(), name.begin(),
                   [](char c) { return c >= 'A' && c <= 'Z' ? char(c + 32) : c; });
    if (name.find("phi-3") != std::string::npos || name.find("phi3") != std::string::npos) {
        for (int32_t id : special_) attrs_[id] |= kAttrRstrip;
        const auto set = [&](const char* text, bool on) {
            const int32_t id = find_token(text);
            if (id >= 0) attrs_[id] = on ? attrs_[id] | kAttrRstrip : attrs_[id] & ~kAttrRstrip;
        };
        set("</s>", true);
        for (const char* text : {"<unk>", "<s>", "<|endoftext|>"}) set(text, false);
    }
}

// ---------------------------------------------------------------------------------------------
// Accessors

const std::string& Tokenizer::token_text(int32_t id) const {
    static const std::string kEmpty;
    return id >= 0 && id < n_vocab() ? tokens_[id] : kEmpty;
}

int32_t Tokenizer::find_token(std::string_view text) const {
    const auto it = token_to_id_.find(text);
    return it == token_to_id_.end() ? -1 : it->second;
}

bool Tokenizer::is_control(int32_t id) const {
    return id >= 0 && id < n_vocab() && (attrs_[id] & kAttrControl);
}

bool Tokenizer::is_eog(int32_t id) const {
    return id >= 0 && std::binary_search(eog_.begin(), eog_.end(), id);
}

// ---------------------------------------------------------------------------------------------
// Encoding

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_bos,
                                       bool parse_special) const {
    std::vector<int32_t> out;
    out.reserve(text.size() / 3 + 2);
    if (add_bos && add_bos_) out.push_back(bos_);
    const std::vector<Fragment> frags = partition(text, parse_special);
    if (type_ == Type::Spm) {
        // Every text run that starts the input or follows a special token gets a leading space.
        bool prev_special = true;
        std::string escaped;  // spaces written as U+2581
        for (const Fragment& fr : frags) {
            if (fr.token >= 0) {
                out.push_back(fr.token);
                prev_special = true;
                continue;
            }
            escaped.clear();
            if (add_space_prefix_ && prev_special) escaped += kSpmSpace;
            for (const char c : text.substr(fr.offset, fr.length)) {
                if (c == ' ') {
                    escaped += kSpmSpace;
                } else {
                    escaped += c;
                }
            }
            encode_spm(escaped, out);
            prev_special = false;
        }
    } else {
        for (const Fragment& fr : frags) {
            if (fr.token >= 0) {
                out.push_back(fr.token);
            } else {
                encode_bpe(text.substr(fr.offset, fr.length), out);
            }
        }
    }
    if (add_bos && add_eos_) out.push_back(eos_);
    return out;
}

// llama.cpp's tokenizer_st_partition: for each special token, longest first, every text fragment
// is cut at each of its occurrences, left to right.
std::vector<Tokenizer::Fragment> Tokenizer::partition(std::string_view text,
                                                      bool parse_special) const {
    std::vector<Fragment> frags;
    if (text.empty()) return frags;
    frags.push_back({-1, 0, text.size()});

    // A token can only occur if its first two bytes occur next to each other somewhere; this
    // skips most of a large special-token list without scanning the text for each.
    std::bitset<256> bytes;
    std::vector<bool> pairs(65536);
    for (size_t i = 0; i < text.size(); ++i) {
        bytes.set(uint8_t(text[i]));
        if (i + 1 < text.size()) pairs[uint8_t(text[i]) << 8 | uint8_t(text[i + 1])] = true;
    }

    std::vector<Fragment> next;
    for (const int32_t id : special_) {
        const uint32_t attr = attrs_[id];
        if (!parse_special && (attr & (kAttrControl | kAttrUnknown))) continue;
        const std::string& tok = tokens_[id];
        if (tok.size() == 1 ? !bytes[uint8_t(tok[0])]
                            : !pairs[uint8_t(tok[0]) << 8 | uint8_t(tok[1])])
            continue;
        next.clear();
        for (const Fragment& fr : frags) {
            if (fr.token >= 0) {
                next.push_back(fr);
                continue;
            }
            size_t base = fr.offset, len = fr.length;
            while (len > 0) {
                const size_t match = text.substr(0, base + len).find(tok, base);
                if (match == std::string_view::npos) break;
                if (match > base) {
                    size_t left_len = match - base;
                    if (attr & kAttrLstrip) {
                        while (left_len > 0 && c_isspace(text[base + left_len - 1])) --left_len;
                    }
                    if (left_len > 0) next.push_back({-1, base, left_len});
                }
                next.push_back({id, match, tok.size()});
                const size_t end = match + tok.size();
                len = base + len - end;
                base = end;
                if (attr & kAttrRstrip) {
                    while (len > 0 && c_isspace(text[base])) ++base, --len;
                }
            }
            if (len > 0) next.push_back({-1, base, len});
        }
        frags.swap(next);
    }
    return frags;
}

// SentencePiece as llama.cpp runs it: start from UTF-8 characters and repeatedly merge the
// adjacent pair whose concatenation is the highest-scoring token; pieces that are not tokens
// fall back to byte tokens.
void Tokenizer::encode_spm(std::string_view text, std::vector<int32_t>& out) const {
    struct Symbol {
        int prev, next;
        const char* text;
        size_t n;
    };
    struct Bigram {
        int left, right;
        float score;
        size_t size;
    };
    const auto lower = [](const Bigram& l, const Bigram& r) {
        return l.score < r.score || (l.score == r.score && l.left > r.left);
    };
    std::vector<Symbol> sym;
    sym.reserve(text.size());
    for (size_t off = 0; off < text.size();) {
        const size_t n = std::min(unicode::utf8_len(uint8_t(text[off])), text.size() - off);
        const int idx = int(sym.size());
        sym.push_back({idx - 1, off + n == text.size() ? -1 : idx + 1, text.data() + off, n});
        off += n;
    }
    if (sym.empty()) return;

    std::priority_queue<Bigram, std::vector<Bigram>, decltype(lower)> queue(lower);
    const auto try_add = [&](int left, int right) {
        if (left < 0 || right < 0) return;
        const std::string_view s(sym[left].text, sym[left].n + sym[right].n);
        const int32_t id = find_token(s);
        if (id < 0) return;
        queue.push({left, right, scores_[id], s.size()});
    };
    for (int i = 1; i < int(sym.size()); ++i) try_add(i - 1, i);

    while (!queue.empty()) {
        const Bigram b = queue.top();
        queue.pop();
        Symbol& l = sym[b.left];
        Symbol& r = sym[b.right];
        if (l.n == 0 || r.n == 0 || l.n + r.n != b.size) continue;  // stale
        l.n += r.n;
        r.n = 0;
        l.next = r.next;
        if (r.next >= 0) sym[r.next].prev = b.left;
        try_add(l.prev, b.left);
        try_add(b.left, l.next);
    }

    // Every merged symbol is a token by construction, so only single characters can miss;
    // llama.cpp's rev_merge re-segmentation never applies and is left out.
    for (int i = 0; i != -1; i = sym[i].next) {
        const std::string_view s(sym[i].text, sym[i].n);
        const int32_t id = find_token(s);
        if (id >= 0) {
            out.push_back(id);
            continue;
        }
        for (char c : s) {
            const int32_t byte_id = spm_byte_token(uint8_t(c));
            if (byte_id >= 0) out.push_back(byte_id);
        }
    }
}

// Differs from llama.cpp, which throws (and aborts the tokenization) when a vocabulary has no
// token for a byte: we fall back to the unknown token, or drop the byte if there is none.
int32_t Tokenizer::spm_byte_token(uint8_t byte) const {
    const int32_t id = spm_bytes_[byte];
    return id >= 0 ? id : unk_;
}

int32_t Tokenizer::merge_symbol(std::string_view s) const {
    const auto it = merge_symbols_.find(s);
    return it == merge_symbols_.end() ? -1 : it->second;
}

// Byte-level BPE as llama.cpp runs it: pre-tokenize, map bytes to GPT-2's printable characters,
// then within each word merge the adjacent pair with the lowest merge rank until none applies.
void Tokenizer::encode_bpe(std::string_view text, std::vector<int32_t>& out) const {
    struct Symbol {
        int prev, next;
        size_t off, n;      // byte range within the word
        int32_t merge_sym;  // interned string, -1 if no merge involves it
    };
    struct Bigram {
        int left, right;
        int32_t rank, merged;
        size_t size;
    };
    const auto worse = [](const Bigram& l, const Bigram& r) {
        return l.rank > r.rank || (l.rank == r.rank && l.left > r.left);
    };

    const std::vector<uint32_t> cps = unicode::to_codepoints(text);
    const std::vector<size_t> lens = pretok::split(pre_kind_, cps);

    std::string raw, word;
    std::vector<Symbol> sym;
    std::vector<Bigram> heap;
    size_t start = 0;
    for (const size_t len : lens) {
        // Malformed input was decoded to U+FFFD above, so the word is re-encoded from code
        // points rather than copied from the input.
        raw.clear();
        for (size_t i = start; i < start + len; ++i) unicode::append_utf8(raw, cps[i]);
        start += len;
        word.clear();
        unicode::append_bpe_bytes(word, raw);

        if (ignore_merges_) {
            const int32_t id = find_token(word);
            if (id >= 0) {
                out.push_back(id);
                continue;
            }
        }

        sym.clear();
        for (size_t off = 0; off < word.size();) {
            const size_t n = std::min(unicode::utf8_len(uint8_t(word[off])), word.size() - off);
            const int idx = int(sym.size());
            sym.push_back({idx - 1, off + n == word.size() ? -1 : idx + 1, off, n,
                           merge_symbol(std::string_view(word).substr(off, n))});
            off += n;
        }
        const auto piece = [&](const Symbol& s) {
            return std::string_view(word).substr(s.off, s.n);
        };
        heap.clear();
        const auto try_add = [&](int left, int right) {
            if (left < 0 || right < 0 || sym[left].merge_sym < 0 || sym[right].merge_sym < 0)
                return;
            const auto it = merges_.find(uint64_t(uint32_t(sym[left].merge_sym)) << 32 |
                                         uint32_t(sym[right].merge_sym));
            if (it == merges_.end()) return;
            heap.push_back(
                {left, right, it->second.rank, it->second.merged, sym[left].n + sym[right].n});
            std::push_heap(heap.begin(), heap.end(), worse);
        };
        for (int i = 1; i < int(sym.size()); ++i) try_add(i - 1, i);

        while (!heap.empty()) {
            std::pop_heap(heap.begin(), heap.end(), worse);
            const Bigram b = heap.back();
            heap.pop_back();
            Symbol& l = sym[b.left];
            Symbol& r = sym[b.right];
            // Symbols only grow to the right, so an unchanged total size means an unchanged pair.
            if (l.n == 0 || r.n == 0 || l.n + r.n != b.size) continue;
            l.n += r.n;
            l.merge_sym = b.merged;
            r.n = 0;
            l.next = r.next;
            if (r.next >= 0) sym[r.next].prev = b.left;
            try_add(l.prev, b.left);
            try_add(b.left, l.next);
        }

        for (const Symbol& s : sym) {
            if (s.n == 0) continue;
            const int32_t id = find_token(piece(s));
            if (id >= 0) {
                out.push_back(id);
                continue;
            }
            // llama.cpp's fallback: each byte of the encoded piece as a one-byte token, if any.
            for (char c : piece(s)) {
                const int32_t byte_id = find_token(std::string_view(&c, 1));
                if (byte_id >= 0) out.push_back(byte_id);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Decoding

std::string Tokenizer::make_piece(int32_t id) const {
    const uint32_t attr = attrs_[id];
    const std::string& text = tokens_[id];
    if (attr & (kAttrUnknown | kAttrControl | kAttrUserDefined)) return text;
    if (attr & kAttrNormal) {
        if (type_ == Type::Spm) return replace_all(text, kSpmSpace, " ");
        std::string bytes;
        for (size_t off = 0; off < text.size();) {
            const uint32_t cp = unicode::decode_utf8(text, off);
            const int b = unicode::bpe_cp_to_byte(cp);
            // Differs from llama.cpp, which writes "[UNK_BYTE_0x..]" for a character outside
            // the byte map; we keep the character itself.
            if (b >= 0) {
                bytes.push_back(char(b));
            } else {
                unicode::append_utf8(bytes, cp);
            }
        }
        return bytes;
    }
    if (attr & kAttrByte) {
        if (text.size() >= 5 && hex_digit(text[3]) >= 0 && hex_digit(text[4]) >= 0)
            return std::string(1, char(hex_digit(text[3]) * 16 + hex_digit(text[4])));
        return text;
    }
    return {};  // unused and undefined tokens render as nothing
}

std::string Tokenizer::token_to_piece(int32_t id, bool render_special) const {
    if (id < 0 || id >= n_vocab())
        fail("Token id %d is outside the vocabulary (%d tokens).", id, n_vocab());
    if (!render_special && (attrs_[id] & (kAttrUnknown | kAttrControl))) return {};
    return pieces_[id];
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool render_special) const {
    std::string out;
    // Differs from llama.cpp, which keeps the space after a leading BOS: we drop the one space
    // that encode() put in front of the text, wherever the first text piece is.
    bool strip_space = type_ == Type::Spm && add_space_prefix_;
    for (const int32_t id : ids) {
        std::string piece = token_to_piece(id, render_special);
        if (piece.empty()) continue;
        if (strip_space && piece[0] == ' ') piece.erase(0, 1);
        strip_space = false;
        out += piece;
    }
    return out;
}

// ---------------------------------------------------------------------------------------------
// Streaming

std::string StreamDecoder::push(int32_t id) {
    pending_ += tok_.token_to_piece(id, render_special_);
    return drain(false);
}

std::string StreamDecoder::flush() {
    return drain(true);
}

std::string StreamDecoder::drain(bool final) {
    static constexpr std::string_view kReplacementUtf8 = "\xEF\xBF\xBD";
    std::string out;
    size_t i = 0;
    while (i < pending_.size()) {
        const int n = unicode::valid_utf8_at(pending_, i);
        if (n > 0) {
            out.append(pending_, i, size_t(n));
            i += size_t(n);
        } else if (n == 0) {
            out += kReplacementUtf8;
            i += 1;
        } else {
            // A character cut off by the end of what we have: wait for the next token.
            if (final) {
                out += kReplacementUtf8;
                i = pending_.size();
            }
            break;
        }
    }
    pending_.erase(0, i);
    return out;
}

}  // namespace nt
