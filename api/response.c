/*
 * response.c: engine events -> OpenAI objects, in OpenAI's exact shapes.
 *
 *   completions, streamed:   {"id","object":"text_completion","created","model",
 *                             "choices":[{"text","index":0,"logprobs","finish_reason"}]}
 *   completions, whole:      the same object with the whole text and "usage"
 *   chat, streamed:          {"id","object":"chat.completion.chunk","created","model",
 *                             "choices":[{"index":0,"delta":{..},"logprobs","finish_reason"}]}
 *   chat, whole:             {"id","object":"chat.completion",...,"choices":[{"index":0,
 *                             "message":{"role","content","refusal"},"logprobs",
 *                             "finish_reason"}],"usage"}
 *   usage:                   {"prompt_tokens","completion_tokens","total_tokens"}
 *   logprobs, completions:   {"tokens":[..],"token_logprobs":[..],"top_logprobs":[{tok:lp}],
 *                             "text_offset":[..]}
 *   logprobs, chat:          {"content":[{"token","logprob","bytes",
 *                             "top_logprobs":[{"token","logprob","bytes"}]}],"refusal":null}
 *
 * One small cJSON tree per chunk, printed unformatted and freed. A TOKEN event
 * whose token is -1 continues the previous token's text (long pieces are cut
 * by the engine) and carries no logprobs. Streamed chunks carry "usage": null
 * when include_usage is on, as OpenAI's do.
 */
#include "api.h"
#include "internal.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LP_MAX_TOKENS 65536 /* logprob entries kept for one non-streamed answer */
#define LP_FLOOR -9999.0    /* OpenAI's stand-in for log(0) */

const char *api_finish_reason(enum engine_finish f)
{
    return f == ENGINE_FINISH_LENGTH ? "length" : "stop";
}

int api_response_init(struct api_response *r, const struct api_request *meta, const char *model,
                      uint64_t id, int64_t created, size_t text_max,
                      const struct api_token_text *tt)
{
    memset(r, 0, sizeof *r);
    r->meta = *meta;
    r->created = created;
    r->text_max = text_max;
    if (tt)
        r->tt = *tt;
    snprintf(r->model, sizeof r->model, "%s", model ? model : "");
    /* unique within the process (ids are), and across restarts (created) */
    snprintf(r->id, sizeof r->id, "%s%08" PRIx64 "%012" PRIx64,
             meta->endpoint == API_CHAT ? "chatcmpl-" : "cmpl-", (uint64_t)created & 0xffffffffu,
             id);
    return 0;
}

void api_response_free(struct api_response *r)
{
    free(r->text);
    cJSON_Delete(r->lp);
    r->text = NULL;
    r->lp = NULL;
    r->text_len = r->text_cap = 0;
}

/* ---- helpers --------------------------------------------------------------- */

/* A JSON string from bytes that should be UTF-8 (invalid bytes -> U+FFFD). */
static cJSON *make_string(const char *s, size_t len)
{
    char small[1024];
    if (api__utf8_valid_prefix(s, len) == len && memchr(s, 0, len) == NULL && len < sizeof small) {
        memcpy(small, s, len);
        small[len] = 0;
        return cJSON_CreateString(small);
    }
    size_t cap = len * 3 + 1;
    char *buf = cap <= sizeof small ? small : malloc(cap);
    if (!buf)
        return NULL;
    api__utf8_sanitize(buf, cap, s, len);
    cJSON *v = cJSON_CreateString(buf);
    if (buf != small)
        free(buf);
    return v;
}

static double clamp_lp(float lp)
{
    return isfinite(lp) ? (double)lp : LP_FLOOR;
}

static cJSON *make_usage(const struct engine_event *ev)
{
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)ev->prompt_tokens);
    cJSON_AddNumberToObject(u, "completion_tokens", (double)ev->completion_tokens);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(ev->prompt_tokens + ev->completion_tokens));
    return u;
}

/* The object every response starts with. */
static cJSON *make_head(const struct api_response *r, const char *object)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", r->id);
    cJSON_AddStringToObject(o, "object", object);
    cJSON_AddNumberToObject(o, "created", (double)r->created);
    cJSON_AddStringToObject(o, "model", r->model);
    return o;
}

static char *print_and_free(cJSON *o)
{
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return s;
}

/* Token text as raw bytes (for logprobs). */
static size_t token_bytes(const struct api_response *r, int32_t id, char *buf, size_t cap)
{
    size_t n = r->tt.fn ? r->tt.fn(r->tt.arg, id, buf, cap) : 0;
    if (n >= cap)
        n = cap - 1;
    buf[n] = 0;
    return n;
}

static cJSON *make_bytes(const char *s, size_t n)
{
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; i < n; i++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber((unsigned char)s[i]));
    return a;
}

/* chat: {"token","logprob","bytes"} (+ "top_logprobs" for the chosen token) */
static cJSON *chat_lp_item(const struct api_response *r, int32_t id, float lp, int with_top,
                           const struct engine_event *ev)
{
    char buf[256];
    size_t n = token_bytes(r, id, buf, sizeof buf);
    cJSON *it = cJSON_CreateObject();
    cJSON_AddItemToObject(it, "token", make_string(buf, n));
    cJSON_AddNumberToObject(it, "logprob", clamp_lp(lp));
    cJSON_AddItemToObject(it, "bytes", make_bytes(buf, n));
    if (with_top) {
        cJSON *top = cJSON_AddArrayToObject(it, "top_logprobs");
        for (int k = 0; k < ev->n_top && k < r->meta.top_logprobs; k++)
            cJSON_AddItemToArray(top, chat_lp_item(r, ev->top_id[k], ev->top_logprob[k], 0, ev));
    }
    return it;
}

/* completions: appends the token to the four parallel arrays of lp. */
static void completion_lp_add(struct api_response *r, cJSON *lp, const struct engine_event *ev)
{
    char buf[256];
    size_t n = token_bytes(r, ev->token, buf, sizeof buf);
    cJSON_AddItemToArray(cJSON_GetObjectItem(lp, "tokens"), make_string(buf, n));
    cJSON_AddItemToArray(cJSON_GetObjectItem(lp, "token_logprobs"),
                         cJSON_CreateNumber(clamp_lp(ev->logprob)));
    cJSON *top = cJSON_CreateObject();
    for (int k = 0; k < ev->n_top && k < r->meta.top_logprobs; k++) {
        char tb[256], key[800];
        size_t tn = token_bytes(r, ev->top_id[k], tb, sizeof tb);
        api__utf8_sanitize(key, sizeof key, tb, tn);
        if (!cJSON_GetObjectItemCaseSensitive(top, key))
            cJSON_AddNumberToObject(top, key, clamp_lp(ev->top_logprob[k]));
    }
    cJSON_AddItemToArray(cJSON_GetObjectItem(lp, "top_logprobs"), top);
    cJSON_AddItemToArray(cJSON_GetObjectItem(lp, "text_offset"),
                         cJSON_CreateNumber((double)r->text_offset));
}

static cJSON *new_lp(const struct api_response *r)
{
    cJSON *lp = cJSON_CreateObject();
    if (r->meta.endpoint == API_CHAT) {
        cJSON_AddArrayToObject(lp, "content");
        cJSON_AddNullToObject(lp, "refusal");
    } else {
        cJSON_AddArrayToObject(lp, "tokens");
        cJSON_AddArrayToObject(lp, "token_logprobs");
        cJSON_AddArrayToObject(lp, "top_logprobs");
        cJSON_AddArrayToObject(lp, "text_offset");
    }
    return lp;
}

/* Adds ev's token to lp (a new_lp object). */
static void lp_add(struct api_response *r, cJSON *lp, const struct engine_event *ev)
{
    if (r->meta.endpoint == API_CHAT)
        cJSON_AddItemToArray(cJSON_GetObjectItem(lp, "content"),
                             chat_lp_item(r, ev->token, ev->logprob, 1, ev));
    else
        completion_lp_add(r, lp, ev);
}

static int wants_lp(const struct api_response *r, const struct engine_event *ev)
{
    return r->meta.logprobs && ev->kind == ENGINE_EV_TOKEN && ev->token >= 0;
}

/* {"index":0, <text or delta>, "logprobs", "finish_reason"} in a one-element array */
static cJSON *add_choice(cJSON *o)
{
    cJSON *choices = cJSON_AddArrayToObject(o, "choices");
    cJSON *c = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, c);
    return c;
}

/* ---- streaming --------------------------------------------------------------- */

static cJSON *stream_head(const struct api_response *r)
{
    return make_head(r, r->meta.endpoint == API_CHAT ? "chat.completion.chunk" : "text_completion");
}

static void stream_tail(const struct api_response *r, cJSON *o)
{
    if (r->meta.include_usage)
        cJSON_AddNullToObject(o, "usage");
}

char *api_response_role_chunk(struct api_response *r)
{
    if (r->meta.endpoint != API_CHAT)
        return NULL;
    cJSON *o = stream_head(r);
    cJSON *c = add_choice(o);
    cJSON_AddNumberToObject(c, "index", 0);
    cJSON *d = cJSON_AddObjectToObject(c, "delta");
    cJSON_AddStringToObject(d, "role", "assistant");
    cJSON_AddStringToObject(d, "content", "");
    cJSON_AddNullToObject(c, "logprobs");
    cJSON_AddNullToObject(c, "finish_reason");
    stream_tail(r, o);
    return print_and_free(o);
}

char *api_response_chunk(struct api_response *r, const struct engine_event *ev)
{
    int lp = wants_lp(r, ev);
    if (ev->kind != ENGINE_EV_TOKEN || (ev->text_len == 0 && !lp))
        return NULL;
    cJSON *o = stream_head(r);
    cJSON *c = add_choice(o);
    if (r->meta.endpoint == API_CHAT) {
        cJSON_AddNumberToObject(c, "index", 0);
        cJSON *d = cJSON_AddObjectToObject(c, "delta");
        cJSON_AddItemToObject(d, "content", make_string(ev->text, ev->text_len));
    } else {
        cJSON_AddItemToObject(c, "text", make_string(ev->text, ev->text_len));
        cJSON_AddNumberToObject(c, "index", 0);
    }
    if (lp) {
        cJSON *l = new_lp(r);
        lp_add(r, l, ev);
        cJSON_AddItemToObject(c, "logprobs", l);
    } else {
        cJSON_AddNullToObject(c, "logprobs");
    }
    cJSON_AddNullToObject(c, "finish_reason");
    stream_tail(r, o);
    r->text_offset += ev->text_len;
    return print_and_free(o);
}

static cJSON *session_obj(const struct engine_session_info *in, int with_flags)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", in->id);
    cJSON_AddStringToObject(o, "object", "session");
    cJSON_AddNumberToObject(o, "tokens_seen", (double)in->tokens_seen);
    cJSON_AddNumberToObject(o, "position", (double)in->position);
    cJSON_AddStringToObject(o, "kv_policy", in->policy);
    cJSON_AddBoolToObject(o, "in_memory", in->in_memory);
    cJSON_AddBoolToObject(o, "on_disk", in->on_disk);
    cJSON_AddNumberToObject(o, "bytes", (double)in->bytes);
    if (with_flags) {
        cJSON_AddBoolToObject(o, "created", in->created);
        cJSON_AddBoolToObject(o, "restored", in->restored);
    }
    return o;
}

/* A request with a session says what became of it: "session": {"id",
 * "created", "restored", ...}. */
static void add_session(cJSON *o, const struct engine_event *ev)
{
    if (ev->session.id[0])
        cJSON_AddItemToObject(o, "session", session_obj(&ev->session, 1));
}

char *api_session_json(const struct engine_session_info *in)
{
    return print_and_free(session_obj(in, 0));
}

char *api_session_list_json(const struct engine_session_info *in, size_t n)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    cJSON *arr = cJSON_AddArrayToObject(o, "data");
    for (size_t i = 0; i < n; i++)
        cJSON_AddItemToArray(arr, session_obj(&in[i], 0));
    return print_and_free(o);
}

char *api_session_new_json(const char *id)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "object", "session");
    return print_and_free(o);
}

char *api_response_final_chunk(struct api_response *r, const struct engine_event *ev)
{
    cJSON *o = stream_head(r);
    cJSON *c = add_choice(o);
    if (r->meta.endpoint == API_CHAT) {
        cJSON_AddNumberToObject(c, "index", 0);
        cJSON_AddObjectToObject(c, "delta");
    } else {
        cJSON_AddStringToObject(c, "text", "");
        cJSON_AddNumberToObject(c, "index", 0);
    }
    cJSON_AddNullToObject(c, "logprobs");
    cJSON_AddStringToObject(c, "finish_reason", api_finish_reason(ev->finish));
    stream_tail(r, o);
    add_session(o, ev);
    return print_and_free(o);
}

char *api_response_usage_chunk(struct api_response *r, const struct engine_event *ev)
{
    cJSON *o = stream_head(r);
    cJSON_AddArrayToObject(o, "choices");
    cJSON_AddItemToObject(o, "usage", make_usage(ev));
    return print_and_free(o);
}

/* ---- whole responses ---------------------------------------------------------- */

int api_response_add(struct api_response *r, const struct engine_event *ev)
{
    if (ev->kind != ENGINE_EV_TOKEN)
        return 0;
    if (r->text_len + ev->text_len > r->text_max)
        return -E2BIG;
    if (r->text_len + ev->text_len + 1 > r->text_cap) {
        size_t cap = r->text_cap ? r->text_cap : 256;
        while (cap < r->text_len + ev->text_len + 1)
            cap *= 2;
        char *p = realloc(r->text, cap);
        if (!p)
            return -ENOMEM;
        r->text = p;
        r->text_cap = cap;
    }
    if (wants_lp(r, ev)) {
        if (!r->lp)
            r->lp = new_lp(r);
        cJSON *arr =
            cJSON_GetObjectItem(r->lp, r->meta.endpoint == API_CHAT ? "content" : "tokens");
        if (!r->lp || cJSON_GetArraySize(arr) >= LP_MAX_TOKENS)
            return -E2BIG;
        lp_add(r, r->lp, ev);
    }
    memcpy(r->text + r->text_len, ev->text, ev->text_len);
    r->text_len += ev->text_len;
    r->text[r->text_len] = 0;
    r->text_offset += ev->text_len;
    return 0;
}

char *api_response_body(struct api_response *r, const struct engine_event *ev)
{
    int chat = r->meta.endpoint == API_CHAT;
    cJSON *o = make_head(r, chat ? "chat.completion" : "text_completion");
    cJSON *c = add_choice(o);
    cJSON *text = make_string(r->text ? r->text : "", r->text_len);
    if (chat) {
        cJSON_AddNumberToObject(c, "index", 0);
        cJSON *m = cJSON_AddObjectToObject(c, "message");
        cJSON_AddStringToObject(m, "role", "assistant");
        cJSON_AddItemToObject(m, "content", text);
        cJSON_AddNullToObject(m, "refusal");
    } else {
        cJSON_AddItemToObject(c, "text", text);
        cJSON_AddNumberToObject(c, "index", 0);
    }
    if (r->meta.logprobs) {
        cJSON *lp = r->lp ? r->lp : new_lp(r);
        r->lp = NULL; /* moved into the tree */
        cJSON_AddItemToObject(c, "logprobs", lp);
    } else {
        cJSON_AddNullToObject(c, "logprobs");
    }
    cJSON_AddStringToObject(c, "finish_reason", api_finish_reason(ev->finish));
    cJSON_AddItemToObject(o, "usage", make_usage(ev));
    add_session(o, ev);
    return print_and_free(o);
}

/* ---- models -------------------------------------------------------------------- */

static cJSON *model_obj(const char *model_id, int64_t created)
{
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", model_id);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)created);
    cJSON_AddStringToObject(m, "owned_by", "streamsink");
    return m;
}

char *api_models_json(const char *model_id, int64_t created)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(o, "data");
    cJSON_AddItemToArray(data, model_obj(model_id, created));
    return print_and_free(o);
}

char *api_model_json(const char *model_id, int64_t created)
{
    return print_and_free(model_obj(model_id, created));
}
