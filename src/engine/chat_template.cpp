#include "engine/chat_template.h"

#include <cctype>
#include <utility>

#include "core/error.h"

namespace nt {

namespace {

struct NamedKind {
    const char* name;
    ChatTemplateKind kind;
};

constexpr NamedKind kNames[] = {
    {"chatml", ChatTemplateKind::ChatML},
    {"llama3", ChatTemplateKind::Llama3},
    {"llama2", ChatTemplateKind::Llama2},
    {"llama2-sys", ChatTemplateKind::Llama2Sys},
    {"llama2-sys-bos", ChatTemplateKind::Llama2SysBos},
    {"llama2-sys-strip", ChatTemplateKind::Llama2SysStrip},
    {"mistral-v1", ChatTemplateKind::MistralV1},
    {"mistral-v3", ChatTemplateKind::MistralV3},
    {"mistral-v3-tekken", ChatTemplateKind::MistralV3Tekken},
    {"mistral-v7", ChatTemplateKind::MistralV7},
    {"mistral-v7-tekken", ChatTemplateKind::MistralV7Tekken},
};

// Markers by which llama.cpp recognises formats we do not render, in llama.cpp's order, for the
// branches between its [INST] check and its Llama 3 check. A template matching one of these is
// some other format even if it also mentions Llama 3's header tokens. (Both strings must occur;
// an empty second string matches always.)
constexpr std::pair<const char*, const char*> kOtherFormats[] = {
    {"<|assistant|>", "<|end|>"},                      // phi3
    {"[gMASK]<sop>", ""},                              // chatglm4
    {"<|assistant|>", "<|user|>"},                     // falcon3, glmedge, exaone-moe
    {"<|{{ item['role'] }}|>", "<|begin_of_image|>"},  // glmedge
    {"<|user|>", "<|endoftext|>"},                     // zephyr
    {"bos_token + message['role']", ""},               // monarch
    {"<start_of_turn>", ""},                           // gemma
    {"'\\n\\nAssistant: ' + eos_token", ""},           // orion
    {"GPT4 Correct ", ""},                             // openchat
    {"USER: ", "ASSISTANT: "},                         // vicuna
    {"### Instruction:", "<|EOT|>"},                   // deepseek
    {"<|START_OF_TURN_TOKEN|>", "<|USER_TOKEN|>"},     // command-r
};

// llama.cpp's trim: ASCII whitespace as classified by isspace() in the C locale.
std::string trim(const std::string& s) {
    size_t b = 0, e = s.size();
    while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
    while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
    return s.substr(b, e - b);
}

std::string valid_names() {
    std::string out;
    for (const NamedKind& n : kNames) {
        if (!out.empty()) out += ", ";
        out += n.name;
    }
    return out;
}

}  // namespace

const char* chat_template_name(ChatTemplateKind kind) {
    for (const NamedKind& n : kNames)
        if (n.kind == kind) return n.name;
    return "unknown";
}

ChatTemplateKind parse_chat_template_name(const std::string& name) {
    for (const NamedKind& n : kNames)
        if (name == n.name) return n.kind;
    fail("unknown chat template '%s'; valid choices are: %s.", name.c_str(), valid_names().c_str());
}

ChatTemplateKind detect_chat_template(const std::string& tmpl) {
    for (const NamedKind& n : kNames)
        if (tmpl == n.name) return n.kind;

    auto has = [&tmpl](const char* s) { return tmpl.find(s) != std::string::npos; };

    if (has("<|im_start|>")) {
        // Phi-4 and SmolVLM use <|im_start|> but are not ChatML.
        if (has("<|im_sep|>") || has("<end_of_utterance>")) return ChatTemplateKind::Unknown;
        return ChatTemplateKind::ChatML;
    }
    if (tmpl.rfind("mistral", 0) == 0 || has("[INST]")) {
        if (has("[SYSTEM_PROMPT]")) return ChatTemplateKind::MistralV7;
        // The official Mistral 'v1' template, or the 'v3'/'v3-tekken' ones (with tools).
        if (has("' [INST] ' + system_message") || has("[AVAILABLE_TOOLS]")) {
            if (has(" [INST]")) return ChatTemplateKind::MistralV1;
            if (has("\"[INST]\"")) return ChatTemplateKind::MistralV3Tekken;
            return ChatTemplateKind::MistralV3;
        }
        // Llama 2 and its variants, by what the Jinja does with the system message.
        if (has("content.strip()")) return ChatTemplateKind::Llama2SysStrip;
        if (has("bos_token + '[INST]")) return ChatTemplateKind::Llama2SysBos;
        if (has("<<SYS>>")) return ChatTemplateKind::Llama2Sys;
        return ChatTemplateKind::Llama2;
    }
    for (const auto& [a, b] : kOtherFormats)
        if (has(a) && (*b == '\0' || has(b))) return ChatTemplateKind::Unknown;
    if (has("<|start_header_id|>") && has("<|end_header_id|>")) return ChatTemplateKind::Llama3;
    return ChatTemplateKind::Unknown;
}

std::string apply_chat_template(ChatTemplateKind kind, const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt, const std::string& bos_text,
                                const std::string& eos_text) {
    const std::string bos = bos_text.empty() ? "<s>" : bos_text;
    const std::string eos = eos_text.empty() ? "</s>" : eos_text;
    std::string out;

    switch (kind) {
        case ChatTemplateKind::ChatML:
            for (const ChatMessage& m : messages)
                out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
            if (add_generation_prompt) out += "<|im_start|>assistant\n";
            return out;

        case ChatTemplateKind::Llama3:
            for (const ChatMessage& m : messages)
                out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + trim(m.content) +
                       "<|eot_id|>";
            if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
            return out;

        case ChatTemplateKind::Llama2:
        case ChatTemplateKind::Llama2Sys:
        case ChatTemplateKind::Llama2SysBos:
        case ChatTemplateKind::Llama2SysStrip: {
            const bool system_block = kind != ChatTemplateKind::Llama2;
            const bool bos_in_history = kind == ChatTemplateKind::Llama2SysBos;
            const bool strip = kind == ChatTemplateKind::Llama2SysStrip;
            bool inside_turn = true;  // the first [INST] is written up front, without BOS
            out += "[INST] ";
            for (const ChatMessage& m : messages) {
                const std::string content = strip ? trim(m.content) : m.content;
                if (!inside_turn) {
                    inside_turn = true;
                    out += bos_in_history ? bos + "[INST] " : "[INST] ";
                }
                if (m.role == "system") {
                    // Without <<SYS>> support the system text still leads the first turn.
                    out += system_block ? "<<SYS>>\n" + content + "\n<</SYS>>\n\n" : content + "\n";
                } else if (m.role == "user") {
                    out += content + " [/INST]";
                } else {
                    out += content + eos;
                    inside_turn = false;
                }
            }
            return out;
        }

        case ChatTemplateKind::MistralV1:
        case ChatTemplateKind::MistralV3:
        case ChatTemplateKind::MistralV3Tekken: {
            const std::string lead = kind == ChatTemplateKind::MistralV1 ? " " : "";
            const std::string trail = kind == ChatTemplateKind::MistralV3Tekken ? "" : " ";
            const bool trim_assistant = kind == ChatTemplateKind::MistralV3;
            bool inside_turn = false;
            for (const ChatMessage& m : messages) {
                if (!inside_turn) {
                    out += lead + "[INST]" + trail;
                    inside_turn = true;
                }
                if (m.role == "system") {
                    out += m.content + "\n\n";
                } else if (m.role == "user") {
                    out += m.content + lead + "[/INST]";
                } else {
                    out += trail + (trim_assistant ? trim(m.content) : m.content) + eos;
                    inside_turn = false;
                }
            }
            return out;
        }

        case ChatTemplateKind::MistralV7:
        case ChatTemplateKind::MistralV7Tekken: {
            const std::string sp = kind == ChatTemplateKind::MistralV7 ? " " : "";
            for (const ChatMessage& m : messages) {
                if (m.role == "system")
                    out += "[SYSTEM_PROMPT]" + sp + m.content + "[/SYSTEM_PROMPT]";
                else if (m.role == "user")
                    out += "[INST]" + sp + m.content + "[/INST]";
                else
                    out += sp + m.content + eos;
            }
            return out;
        }

        case ChatTemplateKind::Unknown:
            break;
    }
    fail(
        "this model's chat template is not one we can render; choose one with --chat-template "
        "(%s).",
        valid_names().c_str());
}

std::vector<std::string> template_stop_strings(ChatTemplateKind kind) {
    switch (kind) {
        case ChatTemplateKind::ChatML:
            return {"<|im_end|>"};
        case ChatTemplateKind::Llama3:
            return {"<|eot_id|>"};
        case ChatTemplateKind::Llama2:
        case ChatTemplateKind::Llama2Sys:
        case ChatTemplateKind::Llama2SysBos:
        case ChatTemplateKind::Llama2SysStrip:
        case ChatTemplateKind::MistralV1:
        case ChatTemplateKind::MistralV3:
        case ChatTemplateKind::MistralV3Tekken:
        case ChatTemplateKind::MistralV7:
        case ChatTemplateKind::MistralV7Tekken:
            return {"</s>"};
        case ChatTemplateKind::Unknown:
            break;
    }
    return {};
}

}  // namespace nt
