/* A two-turn chat through the C API: the first answer streams through a callback, the second
 * through the iterator. Greedy decoding, so the output is reproducible.
 *
 *   nt_example_chat MODEL.gguf ["first question" ["second question"]]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ntransformer.h"

/* The answer collected while it streams. */
typedef struct {
    char text[4096];
    size_t len;
} answer_t;

static int on_token(const nt_token* token, void* user_data) {
    answer_t* a = user_data;
    fwrite(token->text, 1, token->text_len, stdout);
    fflush(stdout);
    if (a->len + token->text_len < sizeof(a->text)) {
        memcpy(a->text + a->len, token->text, token->text_len);
        a->len += token->text_len;
        a->text[a->len] = '\0';
    }
    return 0; /* keep going */
}

static int die(const char* what, nt_status st) {
    fprintf(stderr, "error: %s: %s (%s)\n", what, nt_last_error(), nt_status_name(st));
    return 1;
}

/* Renders the conversation with the model's chat template and makes it the session's input.
 * The session keeps its cache across nt_session_reset, so the turns already evaluated are
 * reused and only the new one goes through the model. */
static nt_status submit_conversation(const nt_model* model, nt_session* session,
                                     const nt_chat_message* msgs, size_t n) {
    size_t len = 0;
    nt_status st = nt_chat_apply_template(model, msgs, n, 1, NULL, 0, &len);
    if (st != NT_ERR_BUFFER_TOO_SMALL) return st;
    char* text = malloc(len + 1);
    if (!text) return NT_ERR_OUT_OF_MEMORY;
    st = nt_chat_apply_template(model, msgs, n, 1, text, len + 1, &len);
    if (st == NT_OK) st = nt_session_reset(session);
    if (st == NT_OK) st = nt_session_submit_text(session, text, len, 1);
    free(text);
    return st;
}

int main(int argc, char** argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL.gguf [QUESTION [SECOND_QUESTION]]\n", argv[0]);
        return 2;
    }
    const char* q1 = argc > 2 ? argv[2] : "What is the capital of France?";
    const char* q2 = argc > 3 ? argv[3] : "And of Italy?";

    nt_model_options mo;
    nt_model_options_default(&mo);
    mo.n_ctx = 1024;
    mo.device = "cpu";
    nt_model* model = NULL;
    nt_status st = nt_model_load(argv[1], &mo, &model);
    if (st != NT_OK) return die("loading the model", st);

    nt_sampling_params sp;
    nt_sampling_params_default(&sp);
    sp.temperature = 0.0f; /* greedy */
    sp.max_tokens = 48;
    nt_session* session = NULL;
    st = nt_session_create(model, &sp, &session);
    if (st != NT_OK) return die("creating a session", st);

    /* Turn 1: callback. */
    static answer_t a1;
    nt_chat_message conv[3] = {{"user", q1}, {"assistant", ""}, {"user", q2}};
    printf("> %s\n", q1);
    if ((st = submit_conversation(model, session, conv, 1)) != NT_OK) return die("submitting", st);
    nt_generation_result r;
    st = nt_session_generate(session, on_token, &a1, &r);
    if (st != NT_OK) return die("generating", st);
    printf("\n[%d prompt tokens, %d generated, %s]\n", r.n_prompt, r.n_generated,
           r.finish == NT_FINISH_STOP ? "end of turn" : "length");

    /* Turn 2: iterator. */
    conv[1].content = a1.text;
    printf("> %s\n", q2);
    if ((st = submit_conversation(model, session, conv, 3)) != NT_OK) return die("submitting", st);
    nt_token tok;
    while ((st = nt_session_next(session, &tok)) == NT_OK) {
        fwrite(tok.text, 1, tok.text_len, stdout);
        fflush(stdout);
    }
    if (st != NT_DONE) return die("iterating", st);
    nt_session_result(session, &r);
    printf("\n[%d prompt tokens, %d generated, %s]\n", r.n_prompt, r.n_generated,
           r.finish == NT_FINISH_STOP ? "end of turn" : "length");

    nt_session_free(session);
    nt_model_free(model);
    return 0;
}
