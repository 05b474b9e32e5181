// Chat templates against independent references:
//  1. tests/python/chat_template_fixtures.txt, written by
//  tests/python/gen_chat_template_fixtures.py:
//     llama.cpp's own rendering (llama_chat_apply_template via llama-cpp-python 0.3.36) of every
//     format on several conversations, and the real Jinja rendering (jinja2) of SmolLM2's own
//     template and Meta-Llama-3-Instruct's;
//  2. llama.cpp's expectations for llm_chat_detect_template/llm_chat_apply_template, copied
//     verbatim from llama.cpp's tests/test-chat-template.cpp (the llama.cpp vendored by
//     llama-cpp-python 0.3.36): template source, detected format, and rendered conversation.
#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/chat_template.h"

namespace nt {
namespace {

// ---------------------------------------------------------------------------------------------
// 1. Jinja fixture

struct JinjaTemplate {
    std::string name, kind, source;
};
struct FixtureCase {
    std::string name, kind;
    bool add_generation_prompt = false;
    std::vector<ChatMessage> messages;
    std::string llamacpp;  // llama.cpp's rendering
    bool has_jinja = false;
    std::string jinja;  // the model template's Jinja rendering, where there is one
};

class FixtureReader {
  public:
    explicit FixtureReader(const std::string& path) {
        std::ifstream f(path, std::ios::binary);
        if (!f) throw std::runtime_error("cannot open " + path);
        std::ostringstream ss;
        ss << f.rdbuf();
        data_ = ss.str();
    }
    bool done() const { return pos_ >= data_.size(); }
    std::string line() {
        const size_t e = data_.find('\n', pos_);
        if (e == std::string::npos) throw std::runtime_error("fixture: missing newline");
        std::string l = data_.substr(pos_, e - pos_);
        pos_ = e + 1;
        return l;
    }
    // "TAG VALUE" -> VALUE, checking TAG.
    std::string field(const std::string& tag) {
        const std::string l = line();
        if (l.compare(0, tag.size() + 1, tag + " ") != 0)
            throw std::runtime_error("fixture: expected '" + tag + "', got '" + l + "'");
        return l.substr(tag.size() + 1);
    }
    // "TAG LEN\n" + LEN bytes + "\n".
    std::string blob(const std::string& tag) {
        const size_t n = std::stoul(field(tag));
        if (pos_ + n + 1 > data_.size() || data_[pos_ + n] != '\n')
            throw std::runtime_error("fixture: bad blob '" + tag + "'");
        std::string b = data_.substr(pos_, n);
        pos_ += n + 1;
        return b;
    }
    std::string peek_tag() const {
        const size_t e = data_.find_first_of(" \n", pos_);
        return data_.substr(pos_, e - pos_);
    }

  private:
    std::string data_;
    size_t pos_ = 0;
};

void load_fixture(std::vector<JinjaTemplate>& templates, std::vector<FixtureCase>& cases) {
    FixtureReader r(std::string(NT_SOURCE_DIR) + "/tests/python/chat_template_fixtures.txt");
    r.line();  // header comment
    while (!r.done()) {
        const std::string tag = r.peek_tag();
        if (tag == "template") {
            std::istringstream words(r.field("template"));
            JinjaTemplate t;
            words >> t.name >> t.kind;
            t.source = r.blob("source");
            templates.push_back(t);
        } else if (tag == "case") {
            FixtureCase c;
            c.name = r.field("case");
            c.kind = r.field("kind");
            c.add_generation_prompt = r.field("add_generation_prompt") == "1";
            const int n = std::stoi(r.field("messages"));
            for (int i = 0; i < n; ++i) {
                ChatMessage m;
                m.role = r.blob("role");
                m.content = r.blob("content");
                c.messages.push_back(m);
            }
            c.llamacpp = r.blob("llamacpp");
            if (r.peek_tag() == "jinja") {
                c.has_jinja = true;
                c.jinja = r.blob("jinja");
            }
            if (r.line() != "end") throw std::runtime_error("fixture: missing 'end'");
            cases.push_back(c);
        } else {
            throw std::runtime_error("fixture: unexpected line starting '" + tag + "'");
        }
    }
}

TEST(ChatTemplate, DetectsRealTemplatesFromFixture) {
    std::vector<JinjaTemplate> templates;
    std::vector<FixtureCase> cases;
    load_fixture(templates, cases);
    ASSERT_EQ(templates.size(), 2u);
    for (const JinjaTemplate& t : templates)
        EXPECT_EQ(detect_chat_template(t.source), parse_chat_template_name(t.kind)) << t.name;
}

TEST(ChatTemplate, MatchesLlamaCppRendering) {
    std::vector<JinjaTemplate> templates;
    std::vector<FixtureCase> cases;
    load_fixture(templates, cases);
    ASSERT_GE(cases.size(), 60u);
    std::set<std::string> kinds;
    for (const FixtureCase& c : cases) {
        // "<s>"/"</s>": what llama.cpp writes literally, and the Llama 2 / Mistral token texts.
        EXPECT_EQ(apply_chat_template(parse_chat_template_name(c.kind), c.messages,
                                      c.add_generation_prompt, "<s>", "</s>"),
                  c.llamacpp)
            << c.name;
        kinds.insert(c.kind);
    }
    EXPECT_EQ(kinds.size(), 11u);  // every format we render
}

TEST(ChatTemplate, MatchesJinjaRendering) {
    std::vector<JinjaTemplate> templates;
    std::vector<FixtureCase> cases;
    load_fixture(templates, cases);
    int jinja_cases = 0, default_system_cases = 0;
    for (const FixtureCase& c : cases) {
        if (!c.has_jinja) continue;
        ++jinja_cases;
        const std::string ours = apply_chat_template(parse_chat_template_name(c.kind), c.messages,
                                                     c.add_generation_prompt, "", "");
        const bool has_system = !c.messages.empty() && c.messages[0].role == "system";
        if (c.kind == "chatml" && !has_system) {
            // SmolLM2's Jinja inserts a default system prompt when the conversation has none;
            // llama.cpp's ChatML renderer does not, and we follow llama.cpp. That block must be
            // the only difference.
            ++default_system_cases;
            ASSERT_GT(c.jinja.size(), ours.size()) << c.name;
            const std::string prefix = c.jinja.substr(0, c.jinja.size() - ours.size());
            EXPECT_EQ(c.jinja.substr(prefix.size()), ours) << c.name;
            EXPECT_EQ(prefix.rfind("<|im_start|>system\n", 0), 0u) << c.name;
            EXPECT_EQ(prefix.find("<|im_start|>", 1), std::string::npos) << c.name;
            EXPECT_EQ(prefix.substr(prefix.size() - 11), "<|im_end|>\n") << c.name;
        } else {
            EXPECT_EQ(ours, c.jinja) << c.name;
        }
    }
    EXPECT_EQ(jinja_cases, 20);
    EXPECT_EQ(default_system_cases, 2);
}

// ---------------------------------------------------------------------------------------------
// 2. llama.cpp's expectations

struct LlamaCppCase {
    const char* name;
    ChatTemplateKind kind;
    const char* template_str;
    const char* expected;  // llm_chat_apply_template output, add_generation_prompt = true
};

// clang-format off
const LlamaCppCase kLlamaCppCases[] = {
    {"teknium/OpenHermes-2.5-Mistral-7B",
     ChatTemplateKind::ChatML,
     "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
     "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\nHi there<|im_end|>\n<|im_start|>user\nWho are you<|im_end|>\n<|im_start|>assistant\n   I am an assistant   <|im_end|>\n<|im_start|>user\nAnother question<|im_end|>\n<|im_start|>assistant\n"},
    {"mistralai/Mistral-7B-Instruct-v0.2 (NOTE: Old pre-v1 without a system prompt)",
     ChatTemplateKind::Llama2,
     "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}",
     "[INST] You are a helpful assistant\nHello [/INST]Hi there</s>[INST] Who are you [/INST]   I am an assistant   </s>[INST] Another question [/INST]"},
    {"TheBloke/FusionNet_34Bx2_MoE-AWQ",
     ChatTemplateKind::Llama2SysBos,
     "{%- for idx in range(0, messages|length) -%}\n{%- if messages[idx]['role'] == 'user' -%}\n{%- if idx > 1 -%}\n{{- bos_token + '[INST] ' + messages[idx]['content'] + ' [/INST]' -}}\n{%- else -%}\n{{- messages[idx]['content'] + ' [/INST]' -}}\n{%- endif -%}\n{% elif messages[idx]['role'] == 'system' %}\n{{- '[INST] <<SYS>>\\n' + messages[idx]['content'] + '\\n<</SYS>>\\n\\n' -}}\n{%- elif messages[idx]['role'] == 'assistant' -%}\n{{- ' '  + messages[idx]['content'] + ' ' + eos_token -}}\n{% endif %}\n{% endfor %}",
     "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST]Hi there</s><s>[INST] Who are you [/INST]   I am an assistant   </s><s>[INST] Another question [/INST]"},
    {"bofenghuang/vigogne-2-70b-chat",
     ChatTemplateKind::Llama2SysStrip,
     "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}{% elif true == true and not '<<SYS>>' in messages[0]['content'] %}{% set loop_messages = messages %}{% set system_message = 'Vous êtes Vigogne, un assistant IA créé par Zaion Lab. Vous suivez extrêmement bien les instructions. Aidez autant que vous le pouvez.' %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'system' %}{{ '<<SYS>>\\n' + content.strip() + '\\n<</SYS>>\\n\\n' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}",
     "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST]Hi there</s>[INST] Who are you [/INST]I am an assistant</s>[INST] Another question [/INST]"},
    {"mlabonne/AlphaMonarch-7B",
     ChatTemplateKind::Unknown,
     "{% for message in messages %}{{bos_token + message['role'] + '\\n' + message['content'] + eos_token + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ bos_token + 'assistant\\n' }}{% endif %}",
     "system\nYou are a helpful assistant</s>\n<s>user\nHello</s>\n<s>assistant\nHi there</s>\n<s>user\nWho are you</s>\n<s>assistant\n   I am an assistant   </s>\n<s>user\nAnother question</s>\n<s>assistant\n"},
    {"google/gemma-7b-it",
     ChatTemplateKind::Unknown,
     "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}",
     "<start_of_turn>user\nYou are a helpful assistant\n\nHello<end_of_turn>\n<start_of_turn>model\nHi there<end_of_turn>\n<start_of_turn>user\nWho are you<end_of_turn>\n<start_of_turn>model\nI am an assistant<end_of_turn>\n<start_of_turn>user\nAnother question<end_of_turn>\n<start_of_turn>model\n"},
    {"OrionStarAI/Orion-14B-Chat",
     ChatTemplateKind::Unknown,
     "{% for message in messages %}{% if loop.first %}{{ bos_token }}{% endif %}{% if message['role'] == 'user' %}{{ 'Human: ' + message['content'] + '\\n\\nAssistant: ' + eos_token }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}{% endif %}{% endfor %}",
     "Human: You are a helpful assistant\n\nHello\n\nAssistant: </s>Hi there</s>Human: Who are you\n\nAssistant: </s>   I am an assistant   </s>Human: Another question\n\nAssistant: </s>"},
    {"openchat/openchat-3.5-0106",
     ChatTemplateKind::Unknown,
     "{{ bos_token }}{% for message in messages %}{{ 'GPT4 Correct ' + message['role'].title() + ': ' + message['content'] + '<|end_of_turn|>'}}{% endfor %}{% if add_generation_prompt %}{{ 'GPT4 Correct Assistant:' }}{% endif %}",
     "You are a helpful assistant<|end_of_turn|>GPT4 Correct User: Hello<|end_of_turn|>GPT4 Correct Assistant: Hi there<|end_of_turn|>GPT4 Correct User: Who are you<|end_of_turn|>GPT4 Correct Assistant:    I am an assistant   <|end_of_turn|>GPT4 Correct User: Another question<|end_of_turn|>GPT4 Correct Assistant:"},
    {"deepseek-ai/deepseek-coder-33b-instruct",
     ChatTemplateKind::Unknown,
     "{% if not add_generation_prompt is defined %}\n{% set add_generation_prompt = false %}\n{% endif %}\n{%- set ns = namespace(found=false) -%}\n{%- for message in messages -%}\n    {%- if message['role'] == 'system' -%}\n        {%- set ns.found = true -%}\n    {%- endif -%}\n{%- endfor -%}\n{{bos_token}}{%- if not ns.found -%}\n{{'You are an AI programming assistant, utilizing the Deepseek Coder model, developed by Deepseek Company, and you only answer questions related to computer science. For politically sensitive questions, security and privacy issues, and other non-computer science questions, you will refuse to answer\\n'}}\n{%- endif %}\n{%- for message in messages %}\n    {%- if message['role'] == 'system' %}\n{{ message['content'] }}\n    {%- else %}\n        {%- if message['role'] == 'user' %}\n{{'### Instruction:\\n' + message['content'] + '\\n'}}\n        {%- else %}\n{{'### Response:\\n' + message['content'] + '\\n<|EOT|>\\n'}}\n        {%- endif %}\n    {%- endif %}\n{%- endfor %}\n{% if add_generation_prompt %}\n{{'### Response:'}}\n{% endif %}",
     "You are a helpful assistant### Instruction:\nHello\n### Response:\nHi there\n<|EOT|>\n### Instruction:\nWho are you\n### Response:\n   I am an assistant   \n<|EOT|>\n### Instruction:\nAnother question\n### Response:\n"},
    {"eachadea/vicuna-13b-1.1",
     ChatTemplateKind::Unknown,
     "{%- for message in messages %}{%- if message['role'] == 'system' -%}{{- '' + message['content'] + '\n\n' -}}{%- else -%}{%- if message['role'] == 'user' -%}{{-'USER: ' + message['content'] + '\n'-}}{%- else -%}{{-'ASSISTANT: ' + message['content'] + '</s>\n' -}}{%- endif -%}{%- endif -%}{%- endfor -%}{%- if add_generation_prompt -%}{{-'ASSISTANT:'-}}{%- endif -%}",
     "You are a helpful assistant\n\nUSER: Hello\nASSISTANT: Hi there</s>\nUSER: Who are you\nASSISTANT:    I am an assistant   </s>\nUSER: Another question\nASSISTANT:"},
    {"CohereForAI/c4ai-command-r-plus",
     ChatTemplateKind::Unknown,
     "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}{% elif false == true %}{% set loop_messages = messages %}{% set system_message = 'You are Command-R, a brilliant, sophisticated, AI-assistant trained to assist human users by providing thorough responses. You are trained by Cohere.' %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}{% if system_message != false %}{{ '<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>' + system_message + '<|END_OF_TURN_TOKEN|>' }}{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% set content = message['content'] %}{% if message['role'] == 'user' %}{{ '<|START_OF_TURN_TOKEN|><|USER_TOKEN|>' + content.strip() + '<|END_OF_TURN_TOKEN|>' }}{% elif message['role'] == 'assistant' %}{{ '<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>'  + content.strip() + '<|END_OF_TURN_TOKEN|>' }}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>' }}{% endif %}",
     "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>You are a helpful assistant<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>Hello<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>Hi there<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>Who are you<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>I am an assistant<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>Another question<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"},
    {"Llama-3",
     ChatTemplateKind::Llama3,
     "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}",
     "<|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHi there<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWho are you<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nI am an assistant<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nAnother question<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
    {"Phi-3-mini",
     ChatTemplateKind::Unknown,
     "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') %}{{'<|user|>' + '\n' + message['content'] + '<|end|>' + '\n' + '<|assistant|>' + '\n'}}{% elif (message['role'] == 'assistant') %}{{message['content'] + '<|end|>' + '\n'}}{% endif %}{% endfor %}",
     "<|system|>\nYou are a helpful assistant<|end|>\n<|user|>\nHello<|end|>\n<|assistant|>\nHi there<|end|>\n<|user|>\nWho are you<|end|>\n<|assistant|>\n   I am an assistant   <|end|>\n<|user|>\nAnother question<|end|>\n<|assistant|>\n"},
    {"ChatGLM4",
     ChatTemplateKind::Unknown,
     "[gMASK]<sop>{% for item in messages %}{% if item['tools'] is defined %}<|system|>\n你是一个名为 ChatGLM 的人工智能助手。你是基于智谱AI训练的语言模型 GLM-4 模型开发的，你的任务是针对用户的问题和要求提供适当的答复和支持。\n\n# 可用工具{% set tools = item['tools'] %}{% for tool in tools %}{% if tool['type'] == 'function' %}\n\n## {{ tool['function']['name'] }}\n\n{{ tool['function'] | tojson(indent=4) }}\n......{% endif %}{% endfor %}{% endif %}{% if item['content'] %}<|{{ item['role'] }}|>{{ item['metadata'] }}\n{{ item['content'] }}{% endif %}{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}",
     "[gMASK]<sop><|system|>\nYou are a helpful assistant<|user|>\nHello<|assistant|>\nHi there<|user|>\nWho are you<|assistant|>\n   I am an assistant   <|user|>\nAnother question<|assistant|>\n"},
    {"GLMEdge",
     ChatTemplateKind::Unknown,
     "{% for item in messages %}{% if item['role'] == 'system' %}<|system|>\n{{ item['content'] }}{% elif item['role'] == 'user' %}<|user|>\n{{ item['content'] }}{% elif item['role'] == 'assistant' %}<|assistant|>\n{{ item['content'] }}{% endif %}{% endfor %}<|assistant|>",
     "<|system|>\nYou are a helpful assistant<|user|>\nHello<|assistant|>\nHi there<|user|>\nWho are you<|assistant|>\n   I am an assistant   <|user|>\nAnother question<|assistant|>"},
    {"mistralai/Mistral-7B-Instruct-v0.2 (mistralai 'v1' template with a system prompt)",
     ChatTemplateKind::MistralV1,
     "{%- if messages[0]['role'] == 'system' %}\n    {%- set system_message = messages[0]['content'] %}\n    {%- set loop_messages = messages[1:] %}\n{%- else %}\n    {%- set loop_messages = messages %}\n{%- endif %}\n\n{{- bos_token }}\n{%- for message in loop_messages %}\n    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}\n        {{- raise_exception('After the optional system message, conversation roles must alternate user/assistant/user/assistant/...') }}\n    {%- endif %}\n    {%- if message['role'] == 'user' %}\n        {%- if loop.first and system_message is defined %}\n            {{- ' [INST] ' + system_message + '\\n\\n' + message['content'] + ' [/INST]' }}\n        {%- else %}\n            {{- ' [INST] ' + message['content'] + ' [/INST]' }}\n        {%- endif %}\n    {%- elif message['role'] == 'assistant' %}\n        {{- ' ' + message['content'] + eos_token}}\n    {%- else %}\n        {{- raise_exception('Only user and assistant roles are supported, with the exception of an initial optional system message!') }}\n    {%- endif %}\n{%- endfor %}\n",
     " [INST] You are a helpful assistant\n\nHello [/INST] Hi there</s> [INST] Who are you [/INST]    I am an assistant   </s> [INST] Another question [/INST]"},
    {"Mistral-Large-Instruct-2407 (mistralai 'v3' template; modified to have system prompt at start)",
     ChatTemplateKind::MistralV3,
     "{%- if messages[0][\"role\"] == \"system\" %}\n    {%- set system_message = messages[0][\"content\"] %}\n    {%- set loop_messages = messages[1:] %}\n{%- else %}\n    {%- set loop_messages = messages %}\n{%- endif %}\n{%- if not tools is defined %}\n    {%- set tools = none %}\n{%- endif %}\n{%- set user_messages = loop_messages | selectattr(\"role\", \"equalto\", \"user\") | list %}\n\n{#- This block checks for alternating user/assistant messages, skipping tool calling messages #}\n{%- set ns = namespace() %}\n{%- set ns.index = 0 %}\n{%- for message in loop_messages %}\n    {%- if not (message.role == \"tool\" or message.role == \"tool_results\" or (message.tool_calls is defined and message.tool_calls is not none)) %}\n        {%- if (message[\"role\"] == \"user\") != (ns.index % 2 == 0) %}\n            {{- raise_exception(\"After the optional system message, conversation roles must alternate user/assistant/user/assistant/...\") }}\n        {%- endif %}\n        {%- set ns.index = ns.index + 1 %}\n    {%- endif %}\n{%- endfor %}\n\n{{- bos_token }}\n{%- for message in loop_messages %}\n    {%- if message[\"role\"] == \"user\" %}\n        {%- if tools is not none and (message == user_messages[-1]) %}\n            {{- \"[AVAILABLE_TOOLS] [\" }}\n            {%- for tool in tools %}\n                {%- set tool = tool.function %}\n                {{- '{\"type\": \"function\", \"function\": {' }}\n                {%- for key, val in tool.items() if key != \"return\" %}\n                    {%- if val is string %}\n                        {{- '\"' + key + '\": \"' + val + '\"' }}\n                    {%- else %}\n                        {{- '\"' + key + '\": ' + val|tojson }}\n                    {%- endif %}\n                    {%- if not loop.last %}\n                        {{- \", \" }}\n                    {%- endif %}\n                {%- endfor %}\n                {{- \"}}\" }}\n                {%- if not loop.last %}\n                    {{- \", \" }}\n                {%- else %}\n                    {{- \"]\" }}\n                {%- endif %}\n            {%- endfor %}\n            {{- \"[/AVAILABLE_TOOLS]\" }}\n            {%- endif %}\n        {%- if loop.last and system_message is defined %}\n            {{- \"[INST] \" + system_message + \"\\n\\n\" + message[\"content\"] + \"[/INST]\" }}\n        {%- else %}\n            {{- \"[INST] \" + message[\"content\"] + \"[/INST]\" }}\n        {%- endif %}\n    {%- elif message.tool_calls is defined and message.tool_calls is not none %}\n        {{- \"[TOOL_CALLS] [\" }}\n        {%- for tool_call in message.tool_calls %}\n            {%- set out = tool_call.function|tojson %}\n            {{- out[:-1] }}\n            {%- if not tool_call.id is defined or tool_call.id|length != 9 %}\n                {{- raise_exception(\"Tool call IDs should be alphanumeric strings with length 9!\") }}\n            {%- endif %}\n            {{- ', \"id\": \"' + tool_call.id + '\"}' }}\n            {%- if not loop.last %}\n                {{- \", \" }}\n            {%- else %}\n                {{- \"]\" + eos_token }}\n            {%- endif %}\n        {%- endfor %}\n    {%- elif message[\"role\"] == \"assistant\" %}\n        {{- \" \" + message[\"content\"]|trim + eos_token}}\n    {%- elif message[\"role\"] == \"tool_results\" or message[\"role\"] == \"tool\" %}\n        {%- if message.content is defined and message.content.content is defined %}\n            {%- set content = message.content.content %}\n        {%- else %}\n            {%- set content = message.content %}\n        {%- endif %}\n        {{- '[TOOL_RESULTS] {\"content\": ' + content|string + \", \" }}\n        {%- if not message.tool_call_id is defined or message.tool_call_id|length != 9 %}\n            {{- raise_exception(\"Tool call IDs should be alphanumeric strings with length 9!\") }}\n        {%- endif %}\n        {{- '\"call_id\": \"' + message.tool_call_id + '\"}[/TOOL_RESULTS]' }}\n    {%- else %}\n        {{- raise_exception(\"Only user and assistant roles are supported, with the exception of an initial optional system message!\") }}\n    {%- endif %}\n{%- endfor %}\n",
     "[INST] You are a helpful assistant\n\nHello[/INST] Hi there</s>[INST] Who are you[/INST] I am an assistant</s>[INST] Another question[/INST]"},
    {"Mistral-Nemo-Instruct-2407 (mistralai 'v3-tekken' template; modified to have system prompt at start)",
     ChatTemplateKind::MistralV3Tekken,
     "{%- if messages[0][\"role\"] == \"system\" %}\n    {%- set system_message = messages[0][\"content\"] %}\n    {%- set loop_messages = messages[1:] %}\n{%- else %}\n    {%- set loop_messages = messages %}\n{%- endif %}\n{%- if not tools is defined %}\n    {%- set tools = none %}\n{%- endif %}\n{%- set user_messages = loop_messages | selectattr(\"role\", \"equalto\", \"user\") | list %}\n\n{#- This block checks for alternating user/assistant messages, skipping tool calling messages #}\n{%- set ns = namespace() %}\n{%- set ns.index = 0 %}\n{%- for message in loop_messages %}\n    {%- if not (message.role == \"tool\" or message.role == \"tool_results\" or (message.tool_calls is defined and message.tool_calls is not none)) %}\n        {%- if (message[\"role\"] == \"user\") != (ns.index % 2 == 0) %}\n            {{- raise_exception(\"After the optional system message, conversation roles must alternate user/assistant/user/assistant/...\") }}\n        {%- endif %}\n        {%- set ns.index = ns.index + 1 %}\n    {%- endif %}\n{%- endfor %}\n\n{{- bos_token }}\n{%- for message in loop_messages %}\n    {%- if message[\"role\"] == \"user\" %}\n        {%- if tools is not none and (message == user_messages[-1]) %}\n            {{- \"[AVAILABLE_TOOLS][\" }}\n            {%- for tool in tools %}\n                {%- set tool = tool.function %}\n                {{- '{\"type\": \"function\", \"function\": {' }}\n                {%- for key, val in tool.items() if key != \"return\" %}\n                    {%- if val is string %}\n                        {{- '\"' + key + '\": \"' + val + '\"' }}\n                    {%- else %}\n                        {{- '\"' + key + '\": ' + val|tojson }}\n                    {%- endif %}\n                    {%- if not loop.last %}\n                        {{- \", \" }}\n                    {%- endif %}\n                {%- endfor %}\n                {{- \"}}\" }}\n                {%- if not loop.last %}\n                    {{- \", \" }}\n                {%- else %}\n                    {{- \"]\" }}\n                {%- endif %}\n            {%- endfor %}\n            {{- \"[/AVAILABLE_TOOLS]\" }}\n            {%- endif %}\n        {%- if loop.last and system_message is defined %}\n            {{- \"[INST]\" + system_message + \"\\n\\n\" + message[\"content\"] + \"[/INST]\" }}\n        {%- else %}\n            {{- \"[INST]\" + message[\"content\"] + \"[/INST]\" }}\n        {%- endif %}\n    {%- elif (message.tool_calls is defined and message.tool_calls is not none) %}\n        {{- \"[TOOL_CALLS][\" }}\n        {%- for tool_call in message.tool_calls %}\n            {%- set out = tool_call.function|tojson %}\n            {{- out[:-1] }}\n            {%- if not tool_call.id is defined or tool_call.id|length != 9 %}\n                {{- raise_exception(\"Tool call IDs should be alphanumeric strings with length 9!\") }}\n            {%- endif %}\n            {{- ', \"id\": \"' + tool_call.id + '\"}' }}\n            {%- if not loop.last %}\n                {{- \", \" }}\n            {%- else %}\n                {{- \"]\" + eos_token }}\n            {%- endif %}\n        {%- endfor %}\n    {%- elif message[\"role\"] == \"assistant\" %}\n        {{- message[\"content\"] + eos_token}}\n    {%- elif message[\"role\"] == \"tool_results\" or message[\"role\"] == \"tool\" %}\n        {%- if message.content is defined and message.content.content is defined %}\n            {%- set content = message.content.content %}\n        {%- else %}\n            {%- set content = message.content %}\n        {%- endif %}\n        {{- '[TOOL_RESULTS]{\"content\": ' + content|string + \", \" }}\n        {%- if not message.tool_call_id is defined or message.tool_call_id|length != 9 %}\n            {{- raise_exception(\"Tool call IDs should be alphanumeric strings with length 9!\") }}\n        {%- endif %}\n        {{- '\"call_id\": \"' + message.tool_call_id + '\"}[/TOOL_RESULTS]' }}\n    {%- else %}\n        {{- raise_exception(\"Only user and assistant roles are supported, with the exception of an initial optional system message!\") }}\n    {%- endif %}\n{%- endfor %}\n",
     "[INST]You are a helpful assistant\n\nHello[/INST]Hi there</s>[INST]Who are you[/INST]   I am an assistant   </s>[INST]Another question[/INST]"},
    {"mistralai/Mistral-Large-Instruct-2411 (mistralai 'v7' template)",
     ChatTemplateKind::MistralV7,
     "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + '[/INST]' }}{% elif message['role'] == 'system' %}{{ '[SYSTEM_PROMPT] ' + message['content'] + '[/SYSTEM_PROMPT]' }}{% elif message['role'] == 'assistant' %}{{ ' ' + message['content'] + eos_token }}{% else %}{{ raise_exception('Only user, system and assistant roles are supported!') }}{% endif %}{% endfor %}",
     "[SYSTEM_PROMPT] You are a helpful assistant[/SYSTEM_PROMPT][INST] Hello[/INST] Hi there</s>[INST] Who are you[/INST]    I am an assistant   </s>[INST] Another question[/INST]"},
    {"phi-4",
     ChatTemplateKind::Unknown,
     "{% for message in messages %}{% if (message['role'] == 'system') %}{{'<|im_start|>system<|im_sep|>' + message['content'] + '<|im_end|>'}}{% elif (message['role'] == 'user') %}{{'<|im_start|>user<|im_sep|>' + message['content'] + '<|im_end|><|im_start|>assistant<|im_sep|>'}}{% elif (message['role'] == 'assistant') %}{{message['content'] + '<|im_end|>'}}{% endif %}{% endfor %}",
     "<|im_start|>system<|im_sep|>You are a helpful assistant<|im_end|><|im_start|>user<|im_sep|>Hello<|im_end|><|im_start|>assistant<|im_sep|>Hi there<|im_end|><|im_start|>user<|im_sep|>Who are you<|im_end|><|im_start|>assistant<|im_sep|>   I am an assistant   <|im_end|><|im_start|>user<|im_sep|>Another question<|im_end|><|im_start|>assistant<|im_sep|>"},};
// clang-format on

const std::vector<ChatMessage> kLlamaCppConversation = {
    {"system", "You are a helpful assistant"},
    {"user", "Hello"},
    {"assistant", "Hi there"},
    {"user", "Who are you"},
    {"assistant", "   I am an assistant   "},
    {"user", "Another question"},
};

TEST(ChatTemplate, DetectionMatchesLlamaCpp) {
    for (const LlamaCppCase& c : kLlamaCppCases)
        EXPECT_EQ(detect_chat_template(c.template_str), c.kind) << c.name;
}

TEST(ChatTemplate, RenderingMatchesLlamaCpp) {
    int rendered = 0;
    for (const LlamaCppCase& c : kLlamaCppCases) {
        if (c.kind == ChatTemplateKind::Unknown) continue;
        // Llama 2 / Mistral models' BOS and EOS texts, which llama.cpp writes literally.
        EXPECT_EQ(apply_chat_template(c.kind, kLlamaCppConversation, true, "<s>", "</s>"),
                  c.expected)
            << c.name;
        ++rendered;
    }
    EXPECT_EQ(rendered, 9);
}

// ---------------------------------------------------------------------------------------------
// Names, errors, edge cases

TEST(ChatTemplate, NamesRoundTripAndBadNameListsChoices) {
    for (ChatTemplateKind k :
         {ChatTemplateKind::ChatML, ChatTemplateKind::Llama3, ChatTemplateKind::Llama2,
          ChatTemplateKind::Llama2Sys, ChatTemplateKind::Llama2SysBos,
          ChatTemplateKind::Llama2SysStrip, ChatTemplateKind::MistralV1,
          ChatTemplateKind::MistralV3, ChatTemplateKind::MistralV3Tekken,
          ChatTemplateKind::MistralV7, ChatTemplateKind::MistralV7Tekken}) {
        EXPECT_EQ(parse_chat_template_name(chat_template_name(k)), k);
        EXPECT_EQ(detect_chat_template(chat_template_name(k)), k);  // as llama.cpp: names work
    }
    try {
        parse_chat_template_name("chatml2");
        FAIL() << "no error for a bad name";
    } catch (const Error& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("'chatml2'"), std::string::npos) << msg;
        EXPECT_NE(msg.find("chatml, llama3, llama2"), std::string::npos) << msg;
    }
}

TEST(ChatTemplate, UnknownCannotBeRenderedAndHasNoStops) {
    EXPECT_EQ(detect_chat_template(""), ChatTemplateKind::Unknown);
    EXPECT_EQ(detect_chat_template("{{ messages[0]['content'] }}"), ChatTemplateKind::Unknown);
    EXPECT_THROW(apply_chat_template(ChatTemplateKind::Unknown, {{"user", "hi"}}, true, "", ""),
                 Error);
    EXPECT_TRUE(template_stop_strings(ChatTemplateKind::Unknown).empty());
}

TEST(ChatTemplate, Llama3DetectionNeedsBothHeaderTokensAndYieldsToEarlierFormats) {
    EXPECT_EQ(detect_chat_template("<|start_header_id|>{{ role }}<|end_header_id|>"),
              ChatTemplateKind::Llama3);
    EXPECT_EQ(detect_chat_template("<|start_header_id|>{{ role }}"), ChatTemplateKind::Unknown);
    // llama.cpp checks Gemma's marker before Llama 3's.
    EXPECT_EQ(detect_chat_template("<start_of_turn><|start_header_id|><|end_header_id|>"),
              ChatTemplateKind::Unknown);
    // ChatML wins over everything else, as in llama.cpp.
    EXPECT_EQ(detect_chat_template("<|im_start|><|start_header_id|><|end_header_id|>"),
              ChatTemplateKind::ChatML);
}

TEST(ChatTemplate, Llama2VariantsFollowLlamaCppMarkers) {
    // Precedence as in llama.cpp: strip, then BOS inside history, then <<SYS>>.
    EXPECT_EQ(detect_chat_template("[INST] {{ m }} [/INST]"), ChatTemplateKind::Llama2);
    EXPECT_EQ(detect_chat_template("[INST] <<SYS>>\n{{ s }}\n<</SYS>>"),
              ChatTemplateKind::Llama2Sys);
    EXPECT_EQ(detect_chat_template("<<SYS>>{{ bos_token + '[INST] ' }}"),
              ChatTemplateKind::Llama2SysBos);
    EXPECT_EQ(detect_chat_template("<<SYS>>{{ bos_token + '[INST] ' + content.strip() }}"),
              ChatTemplateKind::Llama2SysStrip);
    EXPECT_EQ(detect_chat_template("mistral"), ChatTemplateKind::Llama2);  // llama.cpp: prefix
    EXPECT_EQ(detect_chat_template("[INST][SYSTEM_PROMPT]"), ChatTemplateKind::MistralV7);

    const std::vector<ChatMessage> conv = {{"system", " S "}, {"user", " u "}};
    EXPECT_EQ(apply_chat_template(ChatTemplateKind::Llama2, conv, true, "", ""),
              "[INST]  S \n u  [/INST]");
    EXPECT_EQ(apply_chat_template(ChatTemplateKind::Llama2Sys, conv, true, "", ""),
              "[INST] <<SYS>>\n S \n<</SYS>>\n\n u  [/INST]");
    EXPECT_EQ(apply_chat_template(ChatTemplateKind::Llama2SysStrip, conv, true, "", ""),
              "[INST] <<SYS>>\nS\n<</SYS>>\n\nu [/INST]");
}

TEST(ChatTemplate, StopStringsEndTheAssistantTurn) {
    const std::vector<ChatMessage> conv = {{"user", "q"}, {"assistant", "a"}};
    for (ChatTemplateKind k : {ChatTemplateKind::ChatML, ChatTemplateKind::Llama3,
                               ChatTemplateKind::Llama2Sys, ChatTemplateKind::MistralV7}) {
        const auto stops = template_stop_strings(k);
        ASSERT_EQ(stops.size(), 1u) << chat_template_name(k);
        const std::string text = apply_chat_template(k, conv, false, "<s>", "</s>");
        // The stop string is exactly what follows the assistant's content.
        EXPECT_NE(text.find("a" + stops[0]), std::string::npos) << chat_template_name(k) << text;
    }
}

TEST(ChatTemplate, ModelEosTextReplacesLiteralEos) {
    const std::vector<ChatMessage> conv = {{"user", "q"}, {"assistant", "a"}, {"user", "r"}};
    EXPECT_EQ(apply_chat_template(ChatTemplateKind::Llama2SysBos, conv, true, "<B>", "<E>"),
              "[INST] q [/INST]a<E><B>[INST] r [/INST]");
    EXPECT_EQ(apply_chat_template(ChatTemplateKind::Llama2SysBos, conv, true, "", ""),
              "[INST] q [/INST]a</s><s>[INST] r [/INST]");
}

}  // namespace
}  // namespace nt
