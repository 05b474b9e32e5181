/* ntransformer — public C API.
 *
 * Load a Llama-family GGUF model, open sessions (independent conversations sharing the model's
 * KV cache), submit text or tokens, and stream generated tokens through a callback or an
 * iterator. Sessions used from different threads are decoded together: every forward step
 * batches the pending tokens of all of them (continuous batching).
 *
 * Errors: every function that can fail returns an nt_status; on failure, nt_last_error() gives
 * one sentence saying what went wrong and what to do, for the calling thread.
 *
 * Thread safety:
 *   - nt_model_load / nt_model_free: one thread, with no other call on that model running.
 *   - Functions taking a const nt_model* (tokenize, detokenize, chat template, queries) are safe
 *     from any number of threads at once.
 *   - A session is used by one thread at a time; different sessions of one model may be used
 *     from different threads concurrently (their generations share each forward step).
 *   - nt_session_cancel may be called from any thread while the session exists.
 *   - Callbacks run on the thread that called nt_session_generate.
 *   - nt_last_error is per thread.
 *
 * Structs with a leading `size` field are versioned: fill them with the matching *_default()
 * function before changing fields, so that a library built from a newer header can tell.
 */
#ifndef NTRANSFORMER_H
#define NTRANSFORMER_H

#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__)
#define NT_API __attribute__((visibility("default")))
#else
#define NT_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define NT_API_VERSION 1
#define NT_SEED_RANDOM 0xFFFFFFFFu /* nt_sampling_params.seed: draw a random seed */

typedef enum nt_status {
    NT_OK = 0,
    NT_DONE = 1,                  /* not an error: the generation has ended (nt_session_next) */
    NT_ERR_INVALID_ARGUMENT = -1, /* a NULL pointer, an option out of range, a wrong call order */
    NT_ERR_LOAD = -2,             /* bad, missing or unsupported file, or unusable device */
    NT_ERR_OUT_OF_MEMORY = -3,
    NT_ERR_CONTEXT_FULL = -4, /* the session's tokens do not fit its context */
    NT_ERR_BUSY = -5,         /* no free sequence for a new session, or a generation is running */
    NT_ERR_CANCELLED = -6,    /* nt_session_cancel ended the generation */
    NT_ERR_BUFFER_TOO_SMALL = -7, /* the output needs more room; the size needed is returned */
    NT_ERR_INTERNAL = -8          /* a failure inside the engine (a forward step failed) */
} nt_status;

typedef enum nt_finish_reason {
    NT_FINISH_NONE = 0,      /* no generation has finished yet */
    NT_FINISH_STOP = 1,      /* the model produced an end-of-generation token */
    NT_FINISH_LENGTH = 2,    /* max_tokens reached or the context is full */
    NT_FINISH_CALLBACK = 3,  /* the token callback asked to stop */
    NT_FINISH_CANCELLED = 4, /* nt_session_cancel */
    NT_FINISH_ERROR = 5
} nt_finish_reason;

typedef struct nt_model nt_model;
typedef struct nt_session nt_session;

typedef struct nt_model_options {
    uint32_t size;      /* sizeof(nt_model_options) */
    const char* device; /* "cpu", "cuda" or "auto" (CUDA when a GPU is usable); NULL: "auto" */
    int32_t n_ctx;      /* context of each session, in tokens; 0: the model's, capped at 4096 */
    int32_t n_seq;      /* sessions open at once (sequences sharing the KV cache); >= 1 */
    int32_t n_threads;  /* CPU threads; 0: all cores */
    int32_t max_batch;  /* tokens per forward step (prompt chunk size); 0: 512; at least n_seq */
    /* Memory budgets for the weights, in bytes; 0: no limit. Weights are resident in the device's
     * memory today, so a budget smaller than the weights fails to load (NT_ERR_OUT_OF_MEMORY)
     * instead of being silently exceeded; the tiered weight store will place layers within them. */
    uint64_t vram_budget;
    uint64_t ram_budget;
    /* Nonzero: a CUDA backend runs prompts with the CPU backend's arithmetic too (its decode
     * steps always do), so that every output is the CPU's bits; prompts run slower. 0 (default):
     * prompts on FP16 tensor cores, within FP16 rounding of the CPU. */
    int32_t exact;
} nt_model_options;

typedef struct nt_sampling_params {
    uint32_t size;           /* sizeof(nt_sampling_params) */
    float temperature;       /* <= 0: greedy; default 0.8 */
    int32_t top_k;           /* 0: off; default 40 */
    float top_p;             /* 1: off; default 0.95 */
    float min_p;             /* 0: off; default 0.05 */
    float repeat_penalty;    /* 1: off (default) */
    int32_t repeat_last_n;   /* tokens the penalties look at; default 64; -1: all */
    float frequency_penalty; /* default 0 */
    float presence_penalty;  /* default 0 */
    uint64_t seed;           /* NT_SEED_RANDOM (default): random */
    int32_t max_tokens; /* per generation; < 0 (default): until end of generation or full context */
} nt_sampling_params;

/* One generated token. */
typedef struct nt_token {
    int32_t id;       /* -1 for text that ends a generation without a token of its own: an
                         unfinished UTF-8 character, rendered as U+FFFD */
    const char* text; /* the complete UTF-8 text this token releases (may be empty while a
                         character spans several tokens); NUL-terminated; valid until the next
                         call on the session */
    size_t text_len;
    float logprob; /* log-probability of the token under the model (raw logits) */
} nt_token;

/* Returns 0 to continue, non-zero to stop the generation (NT_FINISH_CALLBACK). */
typedef int (*nt_token_callback)(const nt_token* token, void* user_data);

typedef struct nt_generation_result {
    nt_finish_reason finish;
    int32_t n_prompt;    /* input tokens evaluated by this generation */
    int32_t n_generated; /* tokens delivered (the end-of-generation token excluded) */
    double prompt_seconds, decode_seconds;
} nt_generation_result;

typedef struct nt_chat_message {
    const char* role; /* "system", "user", "assistant" */
    const char* content;
} nt_chat_message;

/* ---- library ---- */
NT_API const char* nt_version(void);
NT_API const char* nt_status_name(nt_status status); /* "NT_OK", "NT_ERR_LOAD", ... */
/* The last error of this thread: one sentence; "" when the last failing call left none. */
NT_API const char* nt_last_error(void);

/* ---- models ---- */
NT_API void nt_model_options_default(nt_model_options* options);
/* options may be NULL (defaults). On success *out holds the model. */
NT_API nt_status nt_model_load(const char* path, const nt_model_options* options, nt_model** out);
/* Ends any running generation. Free the model's sessions first: a session must not be used
 * after its model is freed. NULL is ignored. */
NT_API void nt_model_free(nt_model* model);
NT_API int32_t nt_model_n_vocab(const nt_model* model);
NT_API int32_t nt_model_n_ctx(const nt_model* model);
NT_API int32_t nt_model_n_seq(const nt_model* model);
NT_API const char* nt_model_backend(const nt_model* model); /* "cpu" or "cuda" */
NT_API int32_t nt_token_bos(const nt_model* model);         /* -1 if none */
NT_API int32_t nt_token_eos(const nt_model* model);
NT_API int nt_token_is_eog(const nt_model* model, int32_t token);

/* ---- text ---- */
/* Text (len bytes; len == (size_t)-1: NUL-terminated) to token ids. add_special: add BOS/EOS
 * as the model asks; parse_special: control tokens written in the text ("<|im_start|>") become
 * their ids. On NT_ERR_BUFFER_TOO_SMALL, *n_tokens is the count needed. */
NT_API nt_status nt_tokenize(const nt_model* model, const char* text, size_t len, int add_special,
                             int parse_special, int32_t* tokens, size_t capacity, size_t* n_tokens);
/* Token ids to text, NUL-terminated. *length excludes the NUL; on NT_ERR_BUFFER_TOO_SMALL it is
 * the length needed (the buffer needs one byte more). */
NT_API nt_status nt_detokenize(const nt_model* model, const int32_t* tokens, size_t n_tokens,
                               int render_special, char* text, size_t capacity, size_t* length);
/* A conversation rendered with the model's chat template, ready for nt_session_submit_text
 * with parse_special = 1. Same buffer convention as nt_detokenize. */
NT_API nt_status nt_chat_apply_template(const nt_model* model, const nt_chat_message* messages,
                                        size_t n_messages, int add_generation_prompt, char* text,
                                        size_t capacity, size_t* length);

/* ---- sessions ---- */
NT_API void nt_sampling_params_default(nt_sampling_params* params);
/* A session takes one of the model's n_seq sequences until freed (NT_ERR_BUSY when all are
 * taken). params may be NULL (defaults). */
NT_API nt_status nt_session_create(nt_model* model, const nt_sampling_params* params,
                                   nt_session** out);
/* Cancels a running generation, waits for it, and returns the sequence. NULL is ignored. */
NT_API void nt_session_free(nt_session* session);
/* Applies to the next generation; the penalty window starts afresh with the session's tokens. */
NT_API nt_status nt_session_set_sampling(nt_session* session, const nt_sampling_params* params);

/* Appends input. The first input of a session gets BOS when the model wants one. Input is
 * evaluated by the next generation; everything submitted and generated stays in the session
 * (later turns continue the conversation). NT_ERR_CONTEXT_FULL when it would not fit. */
NT_API nt_status nt_session_submit_text(nt_session* session, const char* text, size_t len,
                                        int parse_special);
NT_API nt_status nt_session_submit_tokens(nt_session* session, const int32_t* tokens,
                                          size_t n_tokens);
/* Forgets the session's tokens and penalty history. The cache is kept: a new conversation that
 * starts with the same tokens (a chat re-rendered with one more turn) does not evaluate them again.
 */
NT_API nt_status nt_session_reset(nt_session* session);
NT_API int32_t nt_session_n_tokens(const nt_session* session); /* submitted + generated tokens */

/* Generates with a callback: evaluates the pending input, then calls callback for every token
 * until end of generation, max_tokens, a full context, a non-zero return from the callback, or
 * nt_session_cancel. Returns NT_OK, NT_ERR_CANCELLED (cancelled) or an error. result may be NULL.
 */
NT_API nt_status nt_session_generate(nt_session* session, nt_token_callback callback,
                                     void* user_data, nt_generation_result* result);
/* Generates with an iterator: each call returns NT_OK with the next token in *token, then NT_DONE
 * once the generation has ended (or NT_ERR_CANCELLED / an error). The call after NT_DONE starts a
 * new generation that continues the session. */
NT_API nt_status nt_session_next(nt_session* session, nt_token* token);
/* Ends the running generation of this session (callback or iterator) as soon as possible; the
 * generating call returns NT_ERR_CANCELLED. Without a running generation it does nothing. */
NT_API nt_status nt_session_cancel(nt_session* session);
/* How the last finished generation ended. */
NT_API nt_status nt_session_result(const nt_session* session, nt_generation_result* result);

#ifdef __cplusplus
}
#endif

#endif /* NTRANSFORMER_H */
