// Chat prompt formatting: recognises a model's Jinja chat template by the substring heuristics of
// llama.cpp's llm_chat_detect_template and renders conversations exactly as llama.cpp's built-in
// (non-Jinja) llm_chat_apply_template does for the formats supported here.
#pragma once

#include <string>
#include <vector>

namespace nt {

struct ChatMessage {
    std::string role;  // "system", "user", "assistant" (others are passed through as in llama.cpp)
    std::string content;
};

// Names (for --chat-template) are llama.cpp's: chatml, llama3, llama2, llama2-sys,
// llama2-sys-bos, llama2-sys-strip, mistral-v1, mistral-v3, mistral-v3-tekken, mistral-v7,
// mistral-v7-tekken.
enum class ChatTemplateKind {
    ChatML,
    Llama3,
    Llama2,          // [INST] ... [/INST]; a system message is prepended to the first turn as text
    Llama2Sys,       // system message inside <<SYS>> ... <</SYS>>
    Llama2SysBos,    // as Llama2Sys, and every later turn starts with BOS
    Llama2SysStrip,  // as Llama2Sys, with every message stripped of surrounding whitespace
    MistralV1,
    MistralV3,
    MistralV3Tekken,
    MistralV7,
    MistralV7Tekken,
    Unknown,  // a template we do not render (including formats llama.cpp knows and we do not)
};

// Recognises the format of a tokenizer.chat_template Jinja source. A template that llama.cpp
// would recognise as some other format (Phi-4, Gemma, ...) yields Unknown, never a wrong guess.
// A bare template name (as accepted by parse_chat_template_name) is recognised too.
ChatTemplateKind detect_chat_template(const std::string& jinja_source);

// "chatml", "llama3", "llama2", ... -> kind. Throws nt::Error naming the valid choices.
ChatTemplateKind parse_chat_template_name(const std::string& name);

// The llama.cpp name of a kind ("unknown" for Unknown).
const char* chat_template_name(ChatTemplateKind kind);

// Renders a conversation. add_generation_prompt appends the assistant header where the format
// has one (ChatML, Llama 3; the [INST] formats end a user turn with [/INST] and need none).
// bos_text/eos_text are the model's BOS/EOS token texts; they stand where llama.cpp writes the
// literal "<s>"/"</s>" (Llama 2 and Mistral formats), and those literals are used when empty.
// Like llama.cpp, no BOS is written at the start: the tokenizer adds it.
// Throws nt::Error for Unknown.
std::string apply_chat_template(ChatTemplateKind kind, const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt, const std::string& bos_text,
                                const std::string& eos_text);

// Text that ends an assistant turn in this format; generation stops when it appears.
std::vector<std::string> template_stop_strings(ChatTemplateKind kind);

}  // namespace nt
