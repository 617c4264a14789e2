/*
 * response.c: engine events -> OpenAI objects, in OpenAI's exact shapes.
 *
 *   completions, streamed:   {"id","object":"text_completion","created","model",
 *                             "choices":[{"text","index","logprobs","finish_reason"}]}
 *   completions, whole:      the same object with the whole text and "usage"
 *   chat, streamed:          {"id","object":"chat.completion.chunk","created","model",
 *                             "choices":[{"index","delta":{..},"logprobs","finish_reason"}]}
 *   chat, whole:             {"id","object":"chat.completion",...,"choices":[{"index",
 *                             "message":{"role","content","refusal"},"logprobs",
 *                             "finish_reason"}],"usage"}
 *   usage:                   {"prompt_tokens","completion_tokens","total_tokens"}
 *   logprobs, completions:   {"tokens":[..],"token_logprobs":[..],"top_logprobs":[{tok:lp}],
 *                             "text_offset":[..]}
 *   logprobs, chat:          {"content":[{"token","logprob","bytes",
 *                             "top_logprobs":[{"token","logprob","bytes"}]}],"refusal":null}
 *
 * These objects are written as JSON text, not built as cJSON trees, for two
 * reasons. Generated text may hold U+0000 (SmolLM2's token 190 is the byte
 * 0x00), and a cJSON string ends at the first NUL: here it goes out as
 * "\u0000" and the text after it is kept. And a whole answer's logprobs are
 * kept as the JSON they become (about 1 KB a token with 20 alternatives), not
 * as ~21 cJSON objects and a node per byte a token; the answer's text plus
 * that JSON stays within text_max (--max-response). Strings and numbers are
 * written as cJSON writes them.
 *
 * A TOKEN event whose token is -1 continues the previous token's text (long
 * pieces are cut by the engine) and carries no logprobs. Streamed chunks carry
 * "usage": null when include_usage is on, as OpenAI's do. A request of n
 * choices keeps each choice's text and logprobs apart (index = the events'
 * choice), and its usage sums the choices' tokens.
 */
#include "api.h"
#include "internal.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LP_FLOOR -9999.0 /* OpenAI's stand-in for log(0) */

const char *api_finish_reason(enum engine_finish f)
{
    return f == ENGINE_FINISH_LENGTH ? "length" : "stop";
}

int api_response_init(struct api_response *r, const struct api_request *meta, const char *model,
                      uint64_t id, int64_t created, size_t text_max,
                      const struct api_token_text *tt)
{
    memset(r, 0, sizeof *r);
    r->n_ch = (meta->n > 1 ? meta->n : 1) * (meta->n_prompts > 1 ? meta->n_prompts : 1);
    r->ch = calloc((size_t)r->n_ch, sizeof *r->ch);
    if (!r->ch) {
        r->n_ch = 0;
        return -ENOMEM;
    }
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
    for (int c = 0; c < r->n_ch; c++) {
        free(r->ch[c].text);
        for (int i = 0; i < 4; i++)
            free(r->ch[c].lp[i].p);
    }
    free(r->ch);
    r->ch = NULL;
    r->n_ch = 0;
    r->used = 0;
}

/* The choice an event is for (an index past the request's reads as 0: the
 * engine never sends one). */
static struct api_choice *choice_of(struct api_response *r, const struct engine_event *ev)
{
    return &r->ch[ev->choice >= 0 && ev->choice < r->n_ch ? ev->choice : 0];
}

/* Counts a DONE: its choice's finish and tokens, once. The usage counts
 * each prompt once: the most any of its choices reports (its first choice
 * prefilled it; the others took its cells), and so its cached tokens. */
static void count_done(struct api_response *r, const struct engine_event *ev)
{
    struct api_choice *c = choice_of(r, ev);
    if (ev->prompt_tokens > c->prompt_tokens)
        c->prompt_tokens = ev->prompt_tokens;
    if (ev->cached_tokens > c->cached_tokens)
        c->cached_tokens = ev->cached_tokens;
    const int per = r->meta.n > 1 ? r->meta.n : 1;
    r->prompt_tokens = r->cached_tokens = 0;
    for (int p = 0; p < r->n_ch; p += per) {
        int64_t most = 0, cached = 0;
        for (int j = p; j < p + per && j < r->n_ch; j++) {
            most = r->ch[j].prompt_tokens > most ? r->ch[j].prompt_tokens : most;
            cached = r->ch[j].cached_tokens > cached ? r->ch[j].cached_tokens : cached;
        }
        r->prompt_tokens += most;
        r->cached_tokens += cached;
    }
    if (c->ended)
        return;
    c->ended = 1;
    c->finish = ev->finish;
    c->completion_tokens = ev->completion_tokens;
    c->lp_sum = ev->lp_sum;
    r->completion_tokens += ev->completion_tokens;
}

void api_done_cut(struct engine_event *ev, int64_t held)
{
    ev->finish = ENGINE_FINISH_LENGTH;
    if (ev->completion_tokens > 0)
        ev->lp_sum = ev->lp_sum / (double)ev->completion_tokens * (double)held;
    ev->completion_tokens = held;
}

void api_response_choice_done(struct api_response *r, const struct engine_event *ev)
{
    if (r->n_ch > 0)
        count_done(r, ev);
}

/* ---- JSON text ----------------------------------------------------------------- */

static void put_int(struct api_buf *b, int64_t x)
{
    char tmp[24];
    api__buf_put(b, tmp, (size_t)snprintf(tmp, sizeof tmp, "%" PRId64, x));
}

/* As cJSON prints a number: integers in int's range as such, else 15
 * significant digits when they read back (to a relative DBL_EPSILON), else 17. */
static void put_number(struct api_buf *b, double d)
{
    char tmp[32];
    int n;
    if (!isfinite(d)) {
        n = snprintf(tmp, sizeof tmp, "null");
    } else if (d == floor(d) && d >= INT_MIN && d <= INT_MAX) {
        n = snprintf(tmp, sizeof tmp, "%d", (int)d);
    } else {
        n = snprintf(tmp, sizeof tmp, "%1.15g", d);
        double back = strtod(tmp, NULL);
        if (fabs(back - d) > fmax(fabs(back), fabs(d)) * DBL_EPSILON)
            n = snprintf(tmp, sizeof tmp, "%1.17g", d);
    }
    api__buf_put(b, tmp, (size_t)n);
}

/* s[0..n), valid UTF-8, with JSON's escapes: cJSON's set, where every byte
 * below 0x20 is escaped, U+0000 included. */
static void put_escaped(struct api_buf *b, const char *s, size_t n)
{
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\')
            continue;
        api__buf_put(b, s + run, i - run);
        run = i + 1;
        char e[8];
        switch (c) {
        case '"':
            api__buf_puts(b, "\\\"");
            break;
        case '\\':
            api__buf_puts(b, "\\\\");
            break;
        case '\b':
            api__buf_puts(b, "\\b");
            break;
        case '\f':
            api__buf_puts(b, "\\f");
            break;
        case '\n':
            api__buf_puts(b, "\\n");
            break;
        case '\r':
            api__buf_puts(b, "\\r");
            break;
        case '\t':
            api__buf_puts(b, "\\t");
            break;
        default:
            api__buf_put(b, e, (size_t)snprintf(e, sizeof e, "\\u%04x", c));
        }
    }
    api__buf_put(b, s + run, n - run);
}

/* A JSON string from bytes that should be UTF-8: each maximal subpart that
 * is not (api__utf8_bad_len) becomes U+FFFD; every other byte is kept, NUL
 * included. */
static void put_string(struct api_buf *b, const char *s, size_t n)
{
    api__buf_put(b, "\"", 1);
    size_t i = 0;
    while (i < n) {
        size_t ok = api__utf8_valid_prefix(s + i, n - i);
        put_escaped(b, s + i, ok);
        i += ok;
        if (i < n) {
            api__buf_put(b, "\xEF\xBF\xBD", 3);
            i += api__utf8_bad_len(s + i, n - i);
        }
    }
    api__buf_put(b, "\"", 1);
}

/* The characters put_string writes for n bytes of s: code points of the
 * valid stretches, one U+FFFD for each maximal subpart outside them. text_offset counts
 * these, so text[text_offset[i]:] starts with token i's text in a client that
 * indexes by code point (Python's str, as vLLM counts them). */
static size_t text_chars(const char *s, size_t n)
{
    size_t chars = 0, i = 0;
    while (i < n) {
        size_t ok = api__utf8_valid_prefix(s + i, n - i);
        for (size_t k = 0; k < ok; k++)
            chars += ((unsigned char)s[i + k] & 0xC0) != 0x80;
        i += ok;
        if (i < n) {
            chars++;
            i += api__utf8_bad_len(s + i, n - i);
        }
    }
    return chars;
}

static void put_cstring(struct api_buf *b, const char *s)
{
    put_string(b, s, strlen(s));
}

/* ---- pieces -------------------------------------------------------------------- */

static void put_logprob(struct api_buf *b, float lp)
{
    put_number(b, isfinite(lp) ? (double)lp : LP_FLOOR);
}

static void put_usage(struct api_buf *b, const struct api_response *r)
{
    api__buf_puts(b, "{\"prompt_tokens\":");
    put_int(b, r->prompt_tokens);
    api__buf_puts(b, ",\"completion_tokens\":");
    put_int(b, r->completion_tokens);
    api__buf_puts(b, ",\"total_tokens\":");
    put_int(b, r->prompt_tokens + r->completion_tokens);
    if (r->cached_tokens > 0) {
        api__buf_puts(b, ",\"prompt_tokens_details\":{\"cached_tokens\":");
        put_int(b, r->cached_tokens);
        api__buf_puts(b, "}");
    }
    api__buf_puts(b, "}");
}

/* {"id","object","created","model" (the object is left open) */
static void put_head(struct api_buf *b, const struct api_response *r, const char *object)
{
    api__buf_puts(b, "{\"id\":");
    put_cstring(b, r->id);
    api__buf_puts(b, ",\"object\":");
    put_cstring(b, object);
    api__buf_puts(b, ",\"created\":");
    put_int(b, r->created);
    api__buf_puts(b, ",\"model\":");
    put_cstring(b, r->model);
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

/* chat: {"token","logprob","bytes"}, with "top_logprobs" when ev is given
 * (the chosen token) */
static void put_chat_lp_item(struct api_buf *b, const struct api_response *r, int32_t id, float lp,
                             const struct engine_event *ev)
{
    char tb[256];
    size_t n = token_bytes(r, id, tb, sizeof tb);
    api__buf_puts(b, "{\"token\":");
    put_string(b, tb, n);
    api__buf_puts(b, ",\"logprob\":");
    put_logprob(b, lp);
    api__buf_puts(b, ",\"bytes\":[");
    for (size_t i = 0; i < n; i++) {
        if (i)
            api__buf_put(b, ",", 1);
        put_int(b, (unsigned char)tb[i]);
    }
    api__buf_puts(b, "]");
    if (ev) {
        api__buf_puts(b, ",\"top_logprobs\":[");
        for (int k = 0; k < ev->n_top && k < r->meta.top_logprobs; k++) {
            if (k)
                api__buf_put(b, ",", 1);
            put_chat_lp_item(b, r, ev->top_id[k], ev->top_logprob[k], NULL);
        }
        api__buf_puts(b, "]");
    }
    api__buf_puts(b, "}");
}

/* completions: the chosen token's text */
static void put_cmpl_token(struct api_buf *b, const struct api_response *r,
                           const struct engine_event *ev)
{
    char tb[256];
    size_t n = token_bytes(r, ev->lp_token, tb, sizeof tb);
    put_string(b, tb, n);
}

/* completions: the chosen token's logprob; null for an echoed prompt's
 * first token, which nothing comes before */
static void put_cmpl_logprob(struct api_buf *b, const struct engine_event *ev)
{
    if (ev->lp_null)
        api__buf_puts(b, "null");
    else
        put_logprob(b, ev->logprob);
}

/* completions: {text: logprob} of the alternatives (null where the logprob
 * is). Two tokens whose texts read the same (a lone byte of a character
 * reads as U+FFFD) would give one key twice: the first, more likely one is
 * kept. */
static void put_cmpl_top(struct api_buf *b, const struct api_response *r,
                         const struct engine_event *ev)
{
    size_t key_at[ENGINE_MAX_TOP_LOGPROBS], key_len[ENGINE_MAX_TOP_LOGPROBS];
    int n_keys = 0;
    if (ev->lp_null) {
        api__buf_puts(b, "null");
        return;
    }
    api__buf_puts(b, "{");
    for (int k = 0; k < ev->n_top && k < r->meta.top_logprobs && k < ENGINE_MAX_TOP_LOGPROBS; k++) {
        char tb[256];
        size_t tn = token_bytes(r, ev->top_id[k], tb, sizeof tb);
        size_t mark = b->len;
        if (n_keys)
            api__buf_put(b, ",", 1);
        size_t at = b->len;
        put_string(b, tb, tn);
        if (b->oom)
            return;
        size_t len = b->len - at;
        int dup = 0;
        for (int j = 0; j < n_keys && !dup; j++)
            dup = key_len[j] == len && memcmp(b->p + key_at[j], b->p + at, len) == 0;
        if (dup) {
            api__buf_cut(b, mark);
            continue;
        }
        key_at[n_keys] = at;
        key_len[n_keys++] = len;
        api__buf_put(b, ":", 1);
        put_logprob(b, ev->top_logprob[k]);
    }
    api__buf_puts(b, "}");
}

static int wants_lp(const struct api_response *r, const struct engine_event *ev)
{
    return r->meta.logprobs && ev->kind == ENGINE_EV_TOKEN && ev->has_lp;
}

/* ---- streaming --------------------------------------------------------------- */

static void stream_head(struct api_buf *b, const struct api_response *r)
{
    put_head(b, r, r->meta.endpoint == API_CHAT ? "chat.completion.chunk" : "text_completion");
}

static void stream_tail(struct api_buf *b, const struct api_response *r)
{
    if (r->meta.include_usage)
        api__buf_puts(b, ",\"usage\":null");
}

char *api_response_role_chunk(struct api_response *r, int i)
{
    if (r->meta.endpoint != API_CHAT)
        return NULL;
    struct api_buf b = {0};
    stream_head(&b, r);
    api__buf_puts(&b, ",\"choices\":[{\"index\":");
    put_int(&b, i);
    api__buf_puts(&b, ",\"delta\":{\"role\":\"assistant\",\"content\":\"\"},"
                      "\"logprobs\":null,\"finish_reason\":null}]");
    stream_tail(&b, r);
    api__buf_puts(&b, "}");
    return api__buf_finish(&b);
}

/* One token's logprobs, as one chunk carries them. */
static void put_chunk_lp(struct api_buf *b, const struct api_response *r,
                         const struct api_choice *c, const struct engine_event *ev)
{
    if (r->meta.endpoint == API_CHAT) {
        api__buf_puts(b, "{\"content\":[");
        put_chat_lp_item(b, r, ev->lp_token, ev->logprob, ev);
        api__buf_puts(b, "],\"refusal\":null}");
        return;
    }
    api__buf_puts(b, "{\"tokens\":[");
    put_cmpl_token(b, r, ev);
    api__buf_puts(b, "],\"token_logprobs\":[");
    put_cmpl_logprob(b, ev);
    api__buf_puts(b, "],\"top_logprobs\":[");
    put_cmpl_top(b, r, ev);
    api__buf_puts(b, "],\"text_offset\":[");
    put_int(b, (int64_t)c->text_offset);
    api__buf_puts(b, "]}");
}

char *api_response_chunk(struct api_response *r, const struct engine_event *ev)
{
    int lp = wants_lp(r, ev);
    if (ev->kind != ENGINE_EV_TOKEN || (ev->text_len == 0 && !lp) || r->n_ch < 1)
        return NULL;
    struct api_choice *c = choice_of(r, ev);
    struct api_buf b = {0};
    stream_head(&b, r);
    if (r->meta.endpoint == API_CHAT) {
        api__buf_puts(&b, ",\"choices\":[{\"index\":");
        put_int(&b, c - r->ch);
        api__buf_puts(&b, ",\"delta\":{\"content\":");
        put_string(&b, ev->text, ev->text_len);
        api__buf_puts(&b, "}");
    } else {
        api__buf_puts(&b, ",\"choices\":[{\"text\":");
        put_string(&b, ev->text, ev->text_len);
        api__buf_puts(&b, ",\"index\":");
        put_int(&b, c - r->ch);
    }
    api__buf_puts(&b, ",\"logprobs\":");
    if (lp)
        put_chunk_lp(&b, r, c, ev);
    else
        api__buf_puts(&b, "null");
    api__buf_puts(&b, ",\"finish_reason\":null}]");
    stream_tail(&b, r);
    api__buf_puts(&b, "}");
    c->text_offset += text_chars(ev->text, ev->text_len);
    return api__buf_finish(&b);
}

/* ---- sessions (small objects: cJSON) --------------------------------------------- */

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

static char *print_and_free(cJSON *o)
{
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return s;
}

/* A request with a session says what became of it: ,"session": {"id",
 * "created", "restored", ...}. */
static void put_session(struct api_buf *b, const struct engine_event *ev)
{
    if (!ev->session.id[0])
        return;
    char *s = print_and_free(session_obj(&ev->session, 1));
    if (!s) {
        b->oom = 1;
        return;
    }
    api__buf_puts(b, ",\"session\":");
    api__buf_puts(b, s);
    free(s);
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

/* ---- the end of a stream -------------------------------------------------------- */

char *api_response_final_chunk(struct api_response *r, const struct engine_event *ev)
{
    if (r->n_ch < 1)
        return NULL;
    count_done(r, ev);
    const int64_t i = choice_of(r, ev) - r->ch;
    struct api_buf b = {0};
    stream_head(&b, r);
    if (r->meta.endpoint == API_CHAT) {
        api__buf_puts(&b, ",\"choices\":[{\"index\":");
        put_int(&b, i);
        api__buf_puts(&b, ",\"delta\":{}");
    } else {
        api__buf_puts(&b, ",\"choices\":[{\"text\":\"\",\"index\":");
        put_int(&b, i);
    }
    api__buf_puts(&b, ",\"logprobs\":null,\"finish_reason\":");
    put_cstring(&b, api_finish_reason(ev->finish));
    api__buf_puts(&b, "}]");
    stream_tail(&b, r);
    put_session(&b, ev);
    api__buf_puts(&b, "}");
    return api__buf_finish(&b);
}

char *api_response_usage_chunk(struct api_response *r)
{
    struct api_buf b = {0};
    stream_head(&b, r);
    api__buf_puts(&b, ",\"choices\":[],\"usage\":");
    put_usage(&b, r);
    api__buf_puts(&b, "}");
    return api__buf_finish(&b);
}

/* ---- whole responses ---------------------------------------------------------- */

/* The next item of an array being built in a: a comma after the first. */
static struct api_buf *next_item(struct api_buf *a)
{
    if (a->len)
        api__buf_put(a, ",", 1);
    return a;
}

/* Appends ev's logprobs to the arrays in c->lp. */
static void lp_append(const struct api_response *r, struct api_choice *c,
                      const struct engine_event *ev)
{
    if (r->meta.endpoint == API_CHAT) {
        put_chat_lp_item(next_item(&c->lp[0]), r, ev->lp_token, ev->logprob, ev);
        return;
    }
    put_cmpl_token(next_item(&c->lp[0]), r, ev);
    put_cmpl_logprob(next_item(&c->lp[1]), ev);
    put_cmpl_top(next_item(&c->lp[2]), r, ev);
    put_int(next_item(&c->lp[3]), (int64_t)c->text_offset);
}

/* The logprobs are counted in the answer's bound as the bytes of JSON they
 * add, so a whole answer's memory and body are bounded whatever it asks for:
 * with 20 alternatives a token adds about 1 KB, its text a few bytes. A token
 * of no text counts one byte, so that a model repeating hidden control tokens
 * still reaches the bound. The bound is on all choices together. */
int api_response_add(struct api_response *r, const struct engine_event *ev)
{
    if (ev->kind != ENGINE_EV_TOKEN || r->n_ch < 1)
        return 0;
    struct api_choice *c = choice_of(r, ev);
    const size_t empty = ev->token >= 0 && ev->text_len == 0;
    if (r->used + empty + ev->text_len > r->text_max)
        return -E2BIG;
    if (c->text_len + ev->text_len + 1 > c->text_cap) {
        size_t cap = c->text_cap ? c->text_cap : 256;
        while (cap < c->text_len + ev->text_len + 1)
            cap *= 2;
        char *p = realloc(c->text, cap);
        if (!p)
            return -ENOMEM;
        c->text = p;
        c->text_cap = cap;
    }
    size_t added = 0;
    if (wants_lp(r, ev)) {
        size_t mark[4];
        int oom = 0;
        for (int i = 0; i < 4; i++)
            mark[i] = c->lp[i].len;
        lp_append(r, c, ev);
        for (int i = 0; i < 4; i++) {
            added += c->lp[i].len - mark[i];
            oom |= c->lp[i].oom;
        }
        if (oom || r->used + empty + ev->text_len + added > r->text_max) {
            for (int i = 0; i < 4; i++) { /* as if the token never came */
                api__buf_cut(&c->lp[i], mark[i]);
                c->lp[i].oom = 0;
            }
            return oom ? -ENOMEM : -E2BIG;
        }
        c->lp_len += added;
    }
    memcpy(c->text + c->text_len, ev->text, ev->text_len);
    c->text_len += ev->text_len;
    c->no_text += empty;
    c->text[c->text_len] = 0;
    c->text_offset += text_chars(ev->text, ev->text_len);
    r->used += empty + ev->text_len + added;
    c->tokens_pending += ev->token >= 0;
    if (ev->text_len > 0 || ev->has_lp) {
        c->tokens_held += c->tokens_pending;
        c->tokens_pending = 0;
    }
    return 0;
}

/* The whole logprobs object from the arrays in c->lp. */
static void put_whole_lp(struct api_buf *b, const struct api_response *r,
                         const struct api_choice *c)
{
    const struct api_buf *lp = c->lp;
    if (r->meta.endpoint == API_CHAT) {
        api__buf_puts(b, "{\"content\":[");
        api__buf_put(b, lp[0].p, lp[0].len);
        api__buf_puts(b, "],\"refusal\":null}");
        return;
    }
    api__buf_puts(b, "{\"tokens\":[");
    api__buf_put(b, lp[0].p, lp[0].len);
    api__buf_puts(b, "],\"token_logprobs\":[");
    api__buf_put(b, lp[1].p, lp[1].len);
    api__buf_puts(b, "],\"top_logprobs\":[");
    api__buf_put(b, lp[2].p, lp[2].len);
    api__buf_puts(b, "],\"text_offset\":[");
    api__buf_put(b, lp[3].p, lp[3].len);
    api__buf_puts(b, "]}");
}

/* best_of: a candidate's log-prob per token (-inf with no tokens: nothing
 * to judge it by). */
static double per_token(const struct api_choice *c)
{
    return c->ended && c->completion_tokens > 0 ? c->lp_sum / (double)c->completion_tokens
                                                : -INFINITY;
}

/* The choices an answer holds, in order, into order[] (n_ch places):
 * all of them, or with best_of, of each prompt's candidates the n_return
 * with the highest log-prob per token, best first (the earlier candidate
 * of two equal ones). Returns how many. */
static int answered(const struct api_response *r, int *order)
{
    const int per = r->meta.n > 1 ? r->meta.n : 1;
    const int keep = r->meta.n_return > 0 && r->meta.n_return < per ? r->meta.n_return : per;
    int m = 0;
    for (int p = 0; p < r->n_ch; p += per) {
        int *best = order + m, got = 0;
        for (int j = p; j < p + per && j < r->n_ch; j++) { /* insertion, stable */
            int at = got++;
            while (keep < per && at > 0 && per_token(&r->ch[j]) > per_token(&r->ch[best[at - 1]])) {
                best[at] = best[at - 1];
                at--;
            }
            best[at] = j;
        }
        m += got < keep ? got : keep;
    }
    return m;
}

char *api_response_body(struct api_response *r, const struct engine_event *ev)
{
    if (r->n_ch < 1)
        return NULL;
    count_done(r, ev);
    int *order = malloc((size_t)r->n_ch * sizeof *order);
    if (!order)
        return NULL;
    const int n_out = answered(r, order);
    int chat = r->meta.endpoint == API_CHAT;
    struct api_buf b = {0};
    api__buf_reserve(&b, r->used + 1024 * (size_t)r->n_ch); /* one allocation unless text
                                                               needs escapes */
    put_head(&b, r, chat ? "chat.completion" : "text_completion");
    api__buf_puts(&b, ",\"choices\":[");
    for (int i = 0; i < n_out; i++) {
        const struct api_choice *c = &r->ch[order[i]];
        if (i)
            api__buf_puts(&b, ",");
        if (chat) {
            api__buf_puts(&b, "{\"index\":");
            put_int(&b, i);
            api__buf_puts(&b, ",\"message\":{\"role\":\"assistant\",\"content\":");
        } else {
            api__buf_puts(&b, "{\"text\":");
        }
        put_string(&b, c->text ? c->text : "", c->text_len);
        if (chat) {
            api__buf_puts(&b, ",\"refusal\":null}");
        } else {
            api__buf_puts(&b, ",\"index\":");
            put_int(&b, i);
        }
        api__buf_puts(&b, ",\"logprobs\":");
        if (r->meta.logprobs)
            put_whole_lp(&b, r, c);
        else
            api__buf_puts(&b, "null");
        api__buf_puts(&b, ",\"finish_reason\":");
        put_cstring(&b, api_finish_reason(c->ended ? c->finish : ev->finish));
        api__buf_puts(&b, "}");
    }
    free(order);
    api__buf_puts(&b, "],\"usage\":");
    put_usage(&b, r);
    put_session(&b, ev);
    api__buf_puts(&b, "}");
    return api__buf_finish(&b);
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

/* One token of a /tokenize answer: its id, or with piece {"id","piece"}. */
static void put_token(struct api_buf *b, int32_t id,
                      const char *(*piece)(void *arg, int32_t id, size_t *len), void *arg)
{
    if (!piece) {
        put_int(b, id);
        return;
    }
    size_t len = 0;
    const char *p = piece(arg, id, &len);
    if (!p) { /* not in the vocabulary: no text */
        p = "";
        len = 0;
    }
    api__buf_puts(b, "{\"id\":");
    put_int(b, id);
    api__buf_puts(b, ",\"piece\":");
    if (api__utf8_valid_prefix(p, len) == len) {
        put_string(b, p, len);
    } else { /* part of a character: its bytes, as llama-server gives them */
        api__buf_puts(b, "[");
        for (size_t i = 0; i < len; i++) {
            if (i)
                api__buf_puts(b, ",");
            put_int(b, (unsigned char)p[i]);
        }
        api__buf_puts(b, "]");
    }
    api__buf_puts(b, "}");
}

char *api_tokens_json(int32_t first, const int32_t *ids, int64_t n,
                      const char *(*piece)(void *arg, int32_t id, size_t *len), void *arg)
{
    struct api_buf b = {0};
    api__buf_puts(&b, "{\"tokens\":[");
    if (first >= 0)
        put_token(&b, first, piece, arg);
    for (int64_t i = 0; i < n; i++) {
        if (i > 0 || first >= 0)
            api__buf_puts(&b, ",");
        put_token(&b, ids[i], piece, arg);
    }
    api__buf_puts(&b, "],\"count\":");
    put_int(&b, n + (first >= 0));
    api__buf_puts(&b, "}");
    return api__buf_finish(&b);
}

char *api_content_json(const char *text, size_t len)
{
    struct api_buf b = {0};
    api__buf_puts(&b, "{\"content\":");
    put_string(&b, text, len);
    api__buf_puts(&b, "}");
    return api__buf_finish(&b);
}

char *api_json_string(const char *s, size_t len)
{
    struct api_buf b = {0};
    put_string(&b, s, len);
    return api__buf_finish(&b);
}

char *api_health_json(const char *status, const char *model, int64_t active, int64_t queued,
                      int64_t slots_free, int64_t slots_total)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "status", status);
    cJSON_AddStringToObject(o, "model", model);
    cJSON_AddNumberToObject(o, "active_sequences", (double)active);
    cJSON_AddNumberToObject(o, "queued", (double)queued);
    cJSON_AddNumberToObject(o, "kv_slots_free", (double)slots_free);
    cJSON_AddNumberToObject(o, "kv_slots_total", (double)slots_total);
    return print_and_free(o);
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
