/*
 * api.h: the OpenAI schema, and the one header server/ includes from api/.
 *
 * api/ knows JSON and engine.h, not sockets and not kernels. It turns a
 * request body into a struct engine_request (validating every parameter and
 * naming the bad one), turns engine events into OpenAI objects and chunks
 * (text_completion, chat.completion, chat.completion.chunk, usage, logprobs),
 * renders chat messages with the model's template, and shapes every error as
 * {"error":{"message","type","param","code"}}. Everything here is pure: no
 * globals, no threads, no I/O, so it is unit-tested from synthetic structs.
 *
 * Strings returned as char * are malloc'd; the caller frees them with free().
 */
#ifndef SS_API_H
#define SS_API_H

#include <stddef.h>
#include <stdint.h>

#include "engine.h"

enum api_endpoint {
    API_COMPLETIONS = 0, /* POST /v1/completions */
    API_CHAT,            /* POST /v1/chat/completions */
};

/* ---- errors (error.c) ---------------------------------------------------- */

struct api_error {
    int status;        /* HTTP status */
    char type[40];     /* invalid_request_error, server_error, ... */
    char param[64];    /* the offending parameter; "" is JSON null */
    char code[48];     /* machine-readable code; "" is JSON null */
    char message[256]; /* for humans */
};

/* Fills e; type follows from status (5xx server_error, 429 requests, else
 * invalid_request_error). param and code may be NULL. */
void api_error_set(struct api_error *e, int status, const char *param, const char *code,
                   const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* {"error":{"message":..,"type":..,"param":..,"code":..}}, unformatted.
 * Returns a malloc'd string (caller frees), or NULL when out of memory. */
char *api_error_json(const struct api_error *e);

/* ---- chat templates (chat_template.c) ------------------------------------ */

enum api_chat_format {
    API_CHAT_CHATML = 0, /* <|im_start|>role\ncontent<|im_end|>\n (SmolLM2, Qwen, ...) */
    API_CHAT_LLAMA3,     /* <|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|> */
    API_CHAT_LLAMA2,     /* [INST] <<SYS>>\n..\n<</SYS>>\n\nuser [/INST] assistant </s><s> */
    API_CHAT_GEMMA,      /* <start_of_turn>user\n[system\n\n]content<end_of_turn>\n (Gemma) */
};

struct api_chat_template {
    enum api_chat_format format;
    int recognized;            /* 0: unknown or missing template, fell back to ChatML */
    char default_system[4096]; /* system prompt the template adds when none is given */
    /* the length of a default system prompt too long for default_system:
     * none is added (never a part of one); the server warns */
    size_t default_system_dropped;
};

/* Recognizes the format by its markers in tmpl (tokenizer.chat_template; may
 * be NULL). An unrecognized template falls back to ChatML with recognized = 0,
 * and the caller logs a warning. */
void api_chat_template_init(struct api_chat_template *t, const char *tmpl);
const char *api_chat_format_name(enum api_chat_format f);
/* The format named name (chatml, llama3, llama2 or gemma, as
 * api_chat_format_name writes them): 0, or -1 for any other name. */
int api_chat_format_parse(const char *name, enum api_chat_format *f);
/* A template of format f named by the operator: recognized, with no default
 * system prompt (a name carries none). */
void api_chat_template_named(struct api_chat_template *t, enum api_chat_format f);

struct api_chat_message {
    const char *role; /* system, developer (as system), user, assistant, tool */
    const char *content;
    size_t content_len;
};

/* Renders messages, then the assistant generation prompt. with_default_system
 * adds the template's default system prompt when the first message is not a
 * system one (off for session continuations: the client sends only new turns).
 * Returns 0 and a malloc'd NUL-terminated *out, or -ENOMEM. */
int api_chat_render(const struct api_chat_template *t, const struct api_chat_message *msgs,
                    size_t n, int with_default_system, char **out, size_t *out_len);
/* For a request on a session, where only the engine knows whether the
 * session exists: *open, the text the template puts before messages that
 * start a conversation (the default system turn, when the first message is
 * not a system one; NULL if none), and *close, the text that ends an
 * assistant turn before the next message (ChatML "<|im_end|>\n"), which a
 * continuation needs after the previous turn's last token. Each malloc'd
 * or NULL. Returns 0, or -ENOMEM. */
int api_chat_session_texts(const struct api_chat_template *t, const struct api_chat_message *msgs,
                           size_t n, char **open, char **close);

/* ---- requests (request.c) ------------------------------------------------ */

/* What the loop thread knows when it parses a body. */
struct api_parse_ctx {
    const struct engine_model_info *model; /* n_vocab for token prompts */
    const struct api_chat_template *chat;
    const char *session_header; /* X-Session-Id, or NULL (the body's session_id wins) */
    uint64_t id;                /* engine request id */
    uint64_t owner;             /* who asks: engine_request.owner */
    uint64_t default_seed;      /* seed when the body gives none */
    int64_t max_stop_len;       /* longest stop string accepted (bytes) */
    /* The model names this server answers to (its id, then any aliases). A
     * body naming another model is a 404 model_not_found; NULL or 0 names
     * accept any model. A body without "model" is accepted either way. */
    const char *const *model_names;
    size_t n_model_names;
    /* Most JSON values a body may hold (object keys count as values), checked
     * by a linear scan before cJSON builds its tree (about 80 bytes a value):
     * more is a 413. 0: API_JSON_DEFAULT_MAX_VALUES. */
    size_t max_json_values;
};

#define API_JSON_DEFAULT_MAX_VALUES ((size_t)1 << 20)
#define API_JSON_MAX_DEPTH 64 /* nesting deeper than this is a 400 */

#define API_MAX_CHOICES 128 /* n, as OpenAI bounds it */
#define API_MAX_BEST_OF 20  /* best_of, as OpenAI bounds it */

/* What the response side needs to remember about a request. */
struct api_request {
    enum api_endpoint endpoint;
    int n;         /* choices of each prompt (1 to API_MAX_CHOICES); with best_of, its candidates */
    int n_return;  /* best_of: the n of each prompt's candidates answered (0: all of them) */
    int n_prompts; /* completions: prompts (0 or 1: one); choice p * n + j is prompt p's j */
    int stream;    /* SSE */
    int include_usage; /* stream_options.include_usage */
    int logprobs;      /* report logprobs (completions: logprobs given; chat: logprobs true) */
    int top_logprobs;  /* alternatives per token */
};

/* Parses a JSON body for endpoint ep into out (an engine request with id
 * ctx->id) and meta. The body must be one strict JSON object (RFC 8259; only
 * whitespace after it; no key twice; strings valid UTF-8 without U+0000),
 * else a 400 (named after the string or key at fault where there is one).
 * Unknown fields are ignored; a wrong type or an out-of-range value fails
 * with a 400 that names the param and quotes the number as sent (integers
 * are read exactly over int64_t's range, beyond 2^53 from their literal,
 * which a double cannot hold); a model not in ctx->model_names is a 404;
 * a body over ctx->max_json_values values is a 413. Returns 0, or -EINVAL
 * with err filled and out left empty (nothing to free). On success the
 * caller owns out (engine_request_free, or engine_submit). */
int api_request_parse(const struct api_parse_ctx *ctx, enum api_endpoint ep, const char *body,
                      size_t len, struct engine_request *out, struct api_request *meta,
                      struct api_error *err);

/* ---- tokenize and detokenize (request.c, response.c) ---------------------- */

/* What a POST /tokenize asks besides the text. */
struct api_tokenize {
    const char *param; /* the name the text came under: "content" or "prompt" */
    int with_pieces;   /* answer each token with its text (api_tokens_json) */
};
/* POST /tokenize: {"content": text} ("prompt", vLLM's name, is taken too),
 * "add_special" (false: BOS as the model wants it when true), "parse_special"
 * (true: <|im_start|> and the like are one token each), "with_pieces"
 * (false). *out gets the text as a prompt with add_bos and parse_special set
 * (ctx->id and owner too), *tk the rest. 0, or -EINVAL with err. */
int api_tokenize_parse(const struct api_parse_ctx *ctx, const char *body, size_t len,
                       struct engine_request *out, struct api_tokenize *tk, struct api_error *err);
/* POST /detokenize: {"tokens": [id, ...]}, ids in [0, n_vocab). *ids is
 * malloc'd (caller frees; NULL on failure). 0, or -EINVAL with err. */
int api_detokenize_parse(const struct api_parse_ctx *ctx, const char *body, size_t len,
                         int32_t **ids, int64_t *n, struct api_error *err);
/* {"tokens":[first (if >= 0), ids...],"count":N}, malloc'd, or NULL. With
 * piece (llama-server's with_pieces), each token is {"id":id,"piece":P}
 * instead: P its text (piece(arg, id, &len) gives its bytes) as a string
 * when the bytes are UTF-8, else as the list of byte values. */
char *api_tokens_json(int32_t first, const int32_t *ids, int64_t n,
                      const char *(*piece)(void *arg, int32_t id, size_t *len), void *arg);
/* {"content":"..."}: text as a JSON string (each maximal subpart that is not
 * UTF-8 as one U+FFFD, as Python's errors="replace" and Hugging Face's
 * decode write it). */
char *api_content_json(const char *text, size_t len);
/* s as one JSON string, quotes included: '"', '\\' and C0 controls escaped,
 * each maximal subpart that is not UTF-8 as U+FFFD; malloc'd, or NULL. */
char *api_json_string(const char *s, size_t len);
/* /health's body: {"status","model","active_sequences","queued",
 * "kv_slots_free","kv_slots_total"}, malloc'd, or NULL. */
char *api_health_json(const char *status, const char *model, int64_t active, int64_t queued,
                      int64_t slots_free, int64_t slots_total);
/* src as a name fit for any output (a JSON string, a metrics label, a log
 * line): valid UTF-8 with no C0 control or DEL (the bytes that break a
 * line or a format), each of those and each maximal subpart that is not
 * UTF-8 (a cut or broken character, as Python's errors="replace" reads it)
 * written as U+FFFD, cut at a character's end to fit cap bytes with its
 * NUL. Other code points (C1 controls, U+2028) pass as they are. The log
 * (server/log.c) does not use it: it keeps every byte, a control one as
 * \xNN, as an operator wants to see a name that went wrong. */
void api_text_clean(char *dst, size_t cap, const char *src);

/* ---- responses (response.c) ---------------------------------------------- */

/* Token text for logprobs (raw bytes; engine_token_text in the server). */
struct api_token_text {
    size_t (*fn)(void *arg, int32_t id, char *buf, size_t cap);
    void *arg;
};

/* A growable string (api/buf.c), internal to api/: response.c's JSON text, chat_template.c's
 * prompts. */
struct api_buf {
    char *p;
    size_t len, cap;
    int oom; /* an allocation failed: the text is incomplete */
};

/* One choice of an answer. Non-streaming: its text, and its logprobs
 * serialized as they come (chat: lp[0] holds the items of "content";
 * completions: lp[0..3] those of "tokens", "token_logprobs",
 * "top_logprobs", "text_offset"). */
struct api_choice {
    char *text;
    size_t text_len, text_cap;
    struct api_buf lp[4];
    size_t lp_len;      /* bytes in lp[0..3] */
    size_t no_text;     /* tokens that came with no text (a hidden control token, a part of a
                           character): each counts one byte, so the bound ends any answer */
    size_t text_offset; /* completions logprobs: the next token's text's start, in characters */
    /* the tokens its text holds (a token counts once its text, or its
     * logprobs, is in: a stop string's possible start holds a token's text
     * back, and if the text is refused when it comes, the token is not in
     * the answer), and those accepted whose text has not come yet */
    int64_t tokens_held, tokens_pending;
    int ended; /* its DONE is in (finish, completion_tokens, lp_sum) */
    enum engine_finish finish;
    int64_t prompt_tokens, completion_tokens;
    int64_t cached_tokens; /* of prompt_tokens, those a free KV slot held */
    double lp_sum;         /* best_of: its tokens' log-probs, summed */
};

struct api_response {
    struct api_request meta;
    char id[48];     /* cmpl-... or chatcmpl-... */
    int64_t created; /* unix seconds */
    char model[128];
    struct api_token_text tt;
    struct api_choice *ch; /* [n_ch]: meta.n choices (at least 1) of each of meta.n_prompts */
    int n_ch;
    /* Non-streaming: all choices' text_len + lp_len + no_text never exceed
     * text_max (used is that sum). */
    size_t text_max, used;
    /* usage: each prompt's tokens once, and every ended choice's tokens;
     * of the prompts' tokens, those a free KV slot held (reported as
     * prompt_tokens_details.cached_tokens when there are any) */
    int64_t prompt_tokens, completion_tokens, cached_tokens;
};

/* Sets up r for one request. model is the served model's id. text_max bounds
 * a non-streamed answer: its choices' text bytes plus their logprobs' JSON
 * bytes. Returns 0, or -ENOMEM (r is then empty: api_response_free is a
 * no-op). */
int api_response_init(struct api_response *r, const struct api_request *meta, const char *model,
                      uint64_t id, int64_t created, size_t text_max,
                      const struct api_token_text *tt);
void api_response_free(struct api_response *r);

/* Streaming. Each returns one chunk's JSON (for a `data:` frame), or NULL.
 * Every chunk names its choice ("index").
 * role_chunk: the chat stream's first chunk of choice i, delta
 *             {"role":"assistant","content":""} (NULL for completions).
 * chunk: a TOKEN event; NULL when it carries neither text nor logprobs.
 * final_chunk: a DONE event's finish_reason chunk for its choice (the DONE
 *             is counted in the usage, once).
 * usage_chunk: with include_usage, the last chunk: choices [] and the usage
 *             of every choice ended. */
char *api_response_role_chunk(struct api_response *r, int i);
char *api_response_chunk(struct api_response *r, const struct engine_event *ev);
char *api_response_final_chunk(struct api_response *r, const struct engine_event *ev);
char *api_response_usage_chunk(struct api_response *r);
/* The final chunk and the whole body of a request with a session carry
 * "session": {"id", "object", "tokens_seen", "position", "kv_policy",
 * "in_memory", "on_disk", "bytes", "created", "restored"}. */

/* The session API: one session object, a list of them, a new id. */
char *api_session_json(const struct engine_session_info *in);
char *api_session_list_json(const struct engine_session_info *in, size_t n);
char *api_session_new_json(const char *id);

/* Non-streaming: add a TOKEN event. Returns 0, or -E2BIG when the event's
 * text and logprobs would take the answer past text_max (they are not added;
 * the caller cancels and answers with finish_reason "length"), or -ENOMEM
 * (likewise). */
int api_response_add(struct api_response *r, const struct engine_event *ev);
/* Non-streaming: ev, a DONE of a choice whose answer was cut at text_max,
 * as the answer has it: finish LENGTH, completion_tokens the held tokens
 * (the refused token and those made before the cancel took are not in the
 * answer, so not in its usage), and lp_sum scaled to them at its per-token
 * mean (best_of's score). */
void api_done_cut(struct engine_event *ev, int64_t held);
/* Non-streaming: a DONE of one choice while others run: its finish reason
 * and tokens, counted once. */
void api_response_choice_done(struct api_response *r, const struct engine_event *ev);
/* Non-streaming: the whole text_completion / chat.completion for the
 * request's last DONE, ev (counted as choice_done counts it). Choices with
 * no DONE of their own (cancelled before they ran) take ev's finish reason.
 * With best_of (meta.n_return < meta.n), of each prompt's meta.n candidates
 * the meta.n_return with the highest log-prob per token (lp_sum over
 * completion_tokens) are answered, best first, indexed in that order; the
 * usage counts every candidate's tokens. */
char *api_response_body(struct api_response *r, const struct engine_event *ev);

/* "stop", "length" (cancelled reports "stop"). */
const char *api_finish_reason(enum engine_finish f);

/* ---- models (response.c) ------------------------------------------------- */

/* GET /v1/models: {"object":"list","data":[{"id","object":"model","created","owned_by"}]}. */
char *api_models_json(const char *model_id, int64_t created);
/* GET /v1/models/{id}: one model object. */
char *api_model_json(const char *model_id, int64_t created);

#endif
