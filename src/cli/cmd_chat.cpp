// chat: an interactive conversation using the chat template stored in the model file.
#include <algorithm>
#include <cstdio>
#include <iostream>

#include "cli/common.h"
#include "core/error.h"
#include "engine/chat_template.h"

namespace nt::cli {

int cmd_chat(int argc, char** argv) {
    std::vector<Opt> opts = model_opts();
    opts.push_back({"--system", "TEXT", "system prompt", ""});
    opts.push_back({"--chat-template", "NAME", "override the file's template: chatml, llama3 or llama2", ""});
    opts.push_back({"-n,--n-predict", "N", "maximum tokens per answer (-1: until end of turn)", "-1"});
    for (auto& o : sampling_opts()) opts.push_back(o);
    Args a("chat", opts);
    a.set_summary("Interactive chat. Type a message and press Enter; /clear starts over, /exit or Ctrl-D quits.");
    if (!a.parse(argc, argv, 2)) return 0;
    SamplerParams sp = sampler_params(a);
    const int n_predict = a.integer("--n-predict", -1);

    Loaded l = load_model(a);
    Engine& eng = *l.engine;
    const Tokenizer& tok = *l.model->tokenizer;
    ChatTemplateKind kind;
    if (a.has("--chat-template")) {
        kind = parse_chat_template_name(a.str("--chat-template"));
    } else {
        kind = detect_chat_template(tok.chat_template());
        if (kind == ChatTemplateKind::Unknown)
            fail("%s: the model's chat template is not one ntransformer knows; pick one with --chat-template "
                 "chatml|llama3|llama2.", l.model->file->path().c_str());
    }
    const std::string bos_text = tok.bos() >= 0 ? tok.token_to_piece(tok.bos(), true) : "";
    const std::string eos_text = tok.eos() >= 0 ? tok.token_to_piece(tok.eos(), true) : "";

    std::vector<ChatMessage> msgs;
    if (a.has("--system")) msgs.push_back({"system", a.str("--system")});
    std::vector<int32_t> evaluated;  // tokens whose K/V are in the cache, from position 0
    Sampler sampler(sp, eng.n_vocab());
    std::string line;
    for (;;) {
        std::fprintf(stdout, "> ");
        std::fflush(stdout);
        if (!std::getline(std::cin, line)) break;
        if (line == "/exit" || line == "/quit") break;
        if (line == "/clear") {
            msgs.erase(std::remove_if(msgs.begin(), msgs.end(), [](const ChatMessage& m) { return m.role != "system"; }),
                       msgs.end());
            evaluated.clear();
            continue;
        }
        if (line.empty()) continue;
        msgs.push_back({"user", line});
        const std::string text = apply_chat_template(kind, msgs, true, bos_text, eos_text);
        std::vector<int32_t> ids = tok.encode(text, true, true);
        // Reuse the cached prefix; only the new tokens go through the model.
        size_t common = 0;
        while (common < ids.size() && common < evaluated.size() && ids[common] == evaluated[common]) common++;
        if (common == ids.size()) common--;  // at least one token must be evaluated for logits
        eng.backend().kv_truncate(0, int(common));
        if (int(ids.size()) + 1 >= eng.n_ctx()) {
            std::fprintf(stderr, "error: the conversation (%zu tokens) no longer fits the context of %d; use /clear or raise -c.\n",
                         ids.size(), eng.n_ctx());
            msgs.pop_back();
            continue;
        }
        std::vector<int32_t> fresh(ids.begin() + int64_t(common), ids.end());
        int pos = int(common);
        std::string answer;
        std::vector<int32_t> answer_ids;
        generate(eng, sampler, 0, pos, fresh, n_predict, [&](int32_t id, const std::string& piece) {
            if (id >= 0) answer_ids.push_back(id);
            answer += piece;
            std::fwrite(piece.data(), 1, piece.size(), stdout);
            std::fflush(stdout);
            return true;
        });
        std::printf("\n");
        msgs.push_back({"assistant", answer});
        evaluated = ids;
        // The answer's last token was sampled but not evaluated, so it is not in the cache.
        if (!answer_ids.empty()) evaluated.insert(evaluated.end(), answer_ids.begin(), answer_ids.end() - 1);
    }
    return 0;
}

}  // namespace nt::cli
