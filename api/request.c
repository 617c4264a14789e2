/*
 * request.c: a JSON body -> struct engine_request, with OpenAI's validation.
 *
 * One cJSON tree per request, parsed with the length (the body is not NUL
 * terminated) and freed on every path. cJSON is more lenient than JSON, and
 * its strings end at the first NUL, so one linear pass over the raw bytes
 * comes first (json_prescan): it holds the body to RFC 8259's lexical rules,
 * bounds the tree's size and depth before any node is allocated, and finds
 * strings holding U+0000, which the tree alone cannot show. Only whitespace
 * may follow the object.
 *
 * Every parameter is checked for its type and range; the first bad one fails
 * the request with a 400 naming it. Unknown fields are ignored, as OpenAI
 * does. Fields we know but do not implement (best_of or echo on
 * chat, suffix, tool calling, a JSON schema as the response format) fail
 * loudly rather than being silently dropped.
 *
 * Text prompts are passed as text (the engine thread tokenizes); special
 * tokens in them are parsed, as `streamsink run` does, so a completions
 * prompt and `streamsink run -p` of the same text give the same tokens.
 */
#include "api.h"
#include "internal.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OPENAI_MAX_STOP 4
#define COMPLETIONS_MAX_LOGPROBS 5 /* OpenAI's bound for the legacy endpoint */

/* ---- typed field access: each returns 1 if present, 0 if absent or null,
 *      -1 after filling err ------------------------------------------------- */

static const char *type_name(const cJSON *v)
{
    if (cJSON_IsString(v))
        return "a string";
    if (cJSON_IsNumber(v))
        return "a number";
    if (cJSON_IsBool(v))
        return "a boolean";
    if (cJSON_IsArray(v))
        return "an array";
    if (cJSON_IsObject(v))
        return "an object";
    return "null";
}

static int bad_type(struct api_error *err, const char *name, const char *want, const cJSON *v)
{
    api_error_set(err, 400, name, "invalid_type",
                  "Invalid type for '%s': expected %s, but got %s instead.", name, want,
                  type_name(v));
    return -1;
}

/* 1e400 parses as infinity: a number, but not one any parameter can take. */
static int not_finite(struct api_error *err, const char *name)
{
    api_error_set(err, 400, name, "invalid_value",
                  "Invalid value for '%s': the number is out of range (not finite).", name);
    return -1;
}

/* ---- numbers as sent ------------------------------------------------------
 *
 * cJSON keeps a number only as a double: exact for integers up to 2^53, the
 * nearest double beyond (9223372036854775807 reads as 2^63, past int64_t;
 * two seeds 1 apart read as one), and %g prints 2.0000001 as "2". So an
 * integer parameter beyond 2^53 is read from its literal in the body, and an
 * error message quotes the literal. The parameters are members of the root
 * object, and cJSON keeps members in document order, so a member's literal
 * is found by walking the root object's members in the text (the body has
 * already passed parse_body: strict JSON, an object, no key twice). The walk
 * is linear in the body and only runs for such integers and for errors. */

struct body {
    const cJSON *root;
    const char *text;
    size_t len;
};

static size_t skip_ws(const char *s, size_t len, size_t i)
{
    while (i < len && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r'))
        i++;
    return i;
}

/* s[i] is a string's opening quote: the index after its closing quote. */
static size_t skip_string(const char *s, size_t len, size_t i)
{
    size_t from = i + 1;
    while (from < len) {
        const char *q = memchr(s + from, '"', len - from);
        if (!q)
            return len;
        size_t j = (size_t)(q - s), bs = 0;
        while (j - bs > i + 1 && s[j - bs - 1] == '\\')
            bs++;
        if (bs % 2 == 0) /* not escaped */
            return j + 1;
        from = j + 1;
    }
    return len;
}

/* The index after the value that starts at s[i]. */
static size_t skip_value(const char *s, size_t len, size_t i)
{
    if (i < len && s[i] == '"')
        return skip_string(s, len, i);
    if (i < len && (s[i] == '{' || s[i] == '[')) {
        size_t depth = 0;
        while (i < len) {
            char c = s[i];
            if (c == '"') {
                i = skip_string(s, len, i);
                continue;
            }
            if (c == '{' || c == '[')
                depth++;
            else if ((c == '}' || c == ']') && --depth == 0)
                return i + 1;
            i++;
        }
        return len;
    }
    while (i < len && s[i] != ',' && s[i] != '}' && s[i] != ']' && s[i] != ' ' && s[i] != '\t' &&
           s[i] != '\n' && s[i] != '\r')
        i++;
    return i;
}

/* The literal of v, a member of b's root object, as sent. Returns its length
 * and sets *lit, or 0 when it is not found (not reached for a parsed body). */
static size_t member_literal(const struct body *b, const cJSON *v, const char **lit)
{
    const char *s = b->text;
    size_t len = b->len, i = 0, idx = 0;
    const cJSON *c = b->root->child;
    for (; c && c != v; c = c->next)
        idx++;
    if (!c || !s)
        return 0;
    if (len >= 3 && memcmp(s, "\xEF\xBB\xBF", 3) == 0)
        i = 3; /* skipped by cJSON too */
    i = skip_ws(s, len, i);
    if (i >= len || s[i] != '{')
        return 0;
    for (size_t k = 0;; k++) {
        i = skip_ws(s, len, i + 1);
        if (i >= len || s[i] != '"')
            return 0;
        i = skip_ws(s, len, skip_string(s, len, i));
        if (i >= len || s[i] != ':')
            return 0;
        size_t start = skip_ws(s, len, i + 1);
        i = skip_value(s, len, start);
        if (k == idx) {
            *lit = s + start;
            return i - start;
        }
        i = skip_ws(s, len, i);
        if (i >= len || s[i] != ',')
            return 0;
    }
}

/* v's literal for a message: at most 40 bytes of it, then "...". */
static const char *as_sent(const struct body *b, const cJSON *v, char *buf, size_t cap)
{
    const char *lit = NULL;
    size_t n = member_literal(b, v, &lit);
    if (n == 0)
        snprintf(buf, cap, "%.17g", v->valuedouble);
    else
        snprintf(buf, cap, "%.*s%s", n > 40 ? 40 : (int)n, lit, n > 40 ? "..." : "");
    return buf;
}

enum int_literal {
    INT_LITERAL_OK = 0,
    INT_LITERAL_FRACTION, /* not an integer */
    INT_LITERAL_RANGE,    /* an integer beyond int64_t */
};

/* The JSON number lit[0..n) read exactly (a JSON number: prescan checked the
 * grammar): value = mantissa digits * 10^exp, with the point dropped. */
static enum int_literal int_literal(const char *lit, size_t n, int64_t *out)
{
    size_t i = 0;
    int neg = 0;
    if (i < n && lit[i] == '-') {
        neg = 1;
        i++;
    }
    size_t mant = i, n_digits = 0, n_frac = 0;
    int frac = 0;
    for (; i < n && lit[i] != 'e' && lit[i] != 'E'; i++) {
        if (lit[i] == '.') {
            frac = 1;
            continue;
        }
        n_digits++;
        n_frac += (size_t)frac;
    }
    int64_t exp = 0; /* saturated well beyond any digit count that matters */
    if (i < n) {
        int eneg = 0;
        i++;
        if (i < n && (lit[i] == '+' || lit[i] == '-'))
            eneg = lit[i++] == '-';
        for (; i < n; i++)
            if (exp < ((int64_t)1 << 40))
                exp = exp * 10 + (lit[i] - '0');
        if (eneg)
            exp = -exp;
    }
    /* the significant digits: first and last nonzero (k0, k1), by digit index */
    size_t k = 0, k0 = SIZE_MAX, k1 = 0;
    for (size_t j = mant; k < n_digits; j++) {
        if (lit[j] == '.')
            continue;
        if (lit[j] != '0') {
            if (k0 == SIZE_MAX)
                k0 = k;
            k1 = k;
        }
        k++;
    }
    if (k0 == SIZE_MAX) {
        *out = 0;
        return INT_LITERAL_OK;
    }
    /* value = digits k0..k1 * 10^e10, the last of them nonzero */
    int64_t e10 = exp - (int64_t)n_frac + (int64_t)(n_digits - 1 - k1);
    if (e10 < 0)
        return INT_LITERAL_FRACTION;
    if ((int64_t)(k1 - k0 + 1) + e10 > 19) /* 10^19 > 2^63 */
        return INT_LITERAL_RANGE;
    uint64_t u = 0;
    k = 0;
    for (size_t j = mant; k <= k1; j++) {
        if (lit[j] == '.')
            continue;
        if (k >= k0)
            u = u * 10 + (uint64_t)(lit[j] - '0');
        k++;
    }
    for (int64_t e = 0; e < e10; e++)
        u *= 10; /* at most 19 digits: below 2^64 */
    if (u > (uint64_t)INT64_MAX + (uint64_t)neg)
        return INT_LITERAL_RANGE;
    if (neg)
        *out = u == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)u;
    else
        *out = (int64_t)u;
    return INT_LITERAL_OK;
}

static int get_number(const struct body *b, const char *name, double lo, double hi, double *out,
                      struct api_error *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(b->root, name);
    if (!v || cJSON_IsNull(v))
        return 0;
    if (!cJSON_IsNumber(v))
        return bad_type(err, name, "a number", v);
    if (!isfinite(v->valuedouble))
        return not_finite(err, name);
    if (v->valuedouble < lo || v->valuedouble > hi) {
        char lit[48];
        api_error_set(err, 400, name, "invalid_value",
                      "Invalid value for '%s': %s is outside the range [%g, %g].", name,
                      as_sent(b, v, lit, sizeof lit), lo, hi);
        return -1;
    }
    *out = v->valuedouble;
    return 1;
}

static int int_out_of_range(const struct body *b, const cJSON *v, const char *name, int64_t lo,
                            int64_t hi, struct api_error *err)
{
    char lit[48];
    api_error_set(err, 400, name, "invalid_value",
                  "Invalid value for '%s': %s is outside the range [%lld, %lld].", name,
                  as_sent(b, v, lit, sizeof lit), (long long)lo, (long long)hi);
    return -1;
}

/* An integer in [lo, hi], exactly as sent (1.0 and 1e3 are integers). */
static int get_int(const struct body *b, const char *name, int64_t lo, int64_t hi, int64_t *out,
                   struct api_error *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(b->root, name);
    if (!v || cJSON_IsNull(v))
        return 0;
    if (!cJSON_IsNumber(v))
        return bad_type(err, name, "an integer", v);
    double d = v->valuedouble;
    if (!isfinite(d))
        return not_finite(err, name);
    int64_t x;
    /* Below 2^53 the double is taken as the value: a fraction within a
     * double's rounding of an integer (1.0000000000000001, 1e-400) reads as
     * that integer, as it always has. */
    if (fabs(d) < 0x1p53) {
        if (d != floor(d))
            return bad_type(err, name, "an integer", v);
        x = (int64_t)d;
    } else {
        const char *lit = NULL;
        size_t n = member_literal(b, v, &lit);
        enum int_literal k = n ? int_literal(lit, n, &x) : INT_LITERAL_RANGE;
        if (k == INT_LITERAL_FRACTION)
            return bad_type(err, name, "an integer", v);
        if (k == INT_LITERAL_RANGE)
            return int_out_of_range(b, v, name, lo, hi, err);
    }
    if (x < lo || x > hi)
        return int_out_of_range(b, v, name, lo, hi, err);
    *out = x;
    return 1;
}

static int get_bool(const cJSON *o, const char *name, int *out, struct api_error *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!v || cJSON_IsNull(v))
        return 0;
    if (!cJSON_IsBool(v))
        return bad_type(err, name, "a boolean", v);
    *out = cJSON_IsTrue(v);
    return 1;
}

static int get_string(const cJSON *o, const char *name, const char **out, struct api_error *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!v || cJSON_IsNull(v))
        return 0;
    if (!cJSON_IsString(v))
        return bad_type(err, name, "a string", v);
    *out = v->valuestring;
    return 1;
}

static int unsupported(struct api_error *err, const char *name, const char *what)
{
    api_error_set(err, 400, name, "unsupported_value", "'%s': %s is not supported.", name, what);
    return -1;
}

/* ---- parameter groups ---------------------------------------------------- */

/* A session id names a KV stream and a file in --session-dir: 1 to 127
 * characters of [A-Za-z0-9_-] (engine_session_id_valid), so no path trick
 * ("..", "/", NUL) can reach the file system. */
static int check_session(const char *s, const char *param, struct api_error *err)
{
    if (!engine_session_id_valid(s)) {
        api_error_set(err, 400, param, "invalid_value",
                      "Invalid value for '%s': expected 1 to %d characters of A-Z, a-z, 0-9, "
                      "'_' and '-'.",
                      param, ENGINE_SESSION_ID_MAX - 1);
        return -1;
    }
    return 0;
}

static int parse_stop(const cJSON *o, const struct api_parse_ctx *ctx, struct engine_request *r,
                      struct api_error *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "stop");
    const cJSON *items[OPENAI_MAX_STOP];
    int n = 0;
    if (!v || cJSON_IsNull(v))
        return 0;
    if (cJSON_IsString(v)) {
        items[n++] = v;
    } else if (cJSON_IsArray(v)) {
        int count = cJSON_GetArraySize(v);
        if (count > OPENAI_MAX_STOP || count > ENGINE_MAX_STOP) {
            api_error_set(err, 400, "stop", "invalid_value",
                          "Invalid value for 'stop': at most %d stop sequences.",
                          OPENAI_MAX_STOP < ENGINE_MAX_STOP ? OPENAI_MAX_STOP : ENGINE_MAX_STOP);
            return -1;
        }
        const cJSON *it;
        cJSON_ArrayForEach(it, v)
        {
            if (!cJSON_IsString(it))
                return bad_type(err, "stop", "a string or an array of strings", it);
            items[n++] = it;
        }
    } else {
        return bad_type(err, "stop", "a string or an array of strings", v);
    }
    int k = 0;
    for (int i = 0; i < n; i++) {
        const char *s = items[i]->valuestring;
        size_t len = strlen(s);
        if (len == 0)
            continue; /* an empty stop string would stop before the first token */
        if (ctx->max_stop_len > 0 && (int64_t)len > ctx->max_stop_len) {
            api_error_set(err, 400, "stop", "invalid_value",
                          "Invalid value for 'stop': each stop sequence is at most %lld bytes.",
                          (long long)ctx->max_stop_len);
            return -1;
        }
        r->stop[k] = strdup(s);
        if (!r->stop[k]) {
            api_error_set(err, 500, NULL, NULL, "out of memory");
            return -1;
        }
        k++;
    }
    return 0;
}

static int parse_sampling(const struct body *b, const struct api_parse_ctx *ctx,
                          struct engine_sampling *sp, struct api_error *err)
{
    double d;
    int64_t i;
    int rc;
    *sp = engine_sampling_defaults();
    sp->seed = ctx->default_seed;
    /* The range checks run on the double and carry over to the float it
     * becomes: rounding is monotone and every bound (0, 1, 2, -2) is a float.
     * A value that rounds to 0 is a valid setting for all but top_p
     * (temperature 0 is greedy, min_p and the penalties 0 are off). */
    if ((rc = get_number(b, "temperature", 0, 2, &d, err)) < 0)
        return -1;
    if (rc)
        sp->temperature = (float)d;
    /* top_p 0 keeps no mass but the top token's: greedy. So does a top_p that
     * rounds to 0 as a float (1e-46), which the sampler would refuse. */
    if ((rc = get_number(b, "top_p", 0, 1, &d, err)) < 0)
        return -1;
    if (rc && (float)d == 0)
        sp->temperature = 0;
    else if (rc)
        sp->top_p = (float)d;
    /* top_k 0 keeps every token; so does -1, the value vLLM documents for
     * "all" and clients written for it send. */
    if ((rc = get_int(b, "top_k", -1, (int64_t)1 << 31, &i, err)) < 0)
        return -1;
    if (rc)
        sp->top_k = i < 0 ? 0 : i;
    if ((rc = get_number(b, "min_p", 0, 1, &d, err)) < 0)
        return -1;
    if (rc)
        sp->min_p = (float)d;
    if ((rc = get_number(b, "presence_penalty", -2, 2, &d, err)) < 0)
        return -1;
    if (rc)
        sp->presence_penalty = (float)d;
    if ((rc = get_number(b, "frequency_penalty", -2, 2, &d, err)) < 0)
        return -1;
    if (rc)
        sp->frequency_penalty = (float)d;
    if ((rc = get_int(b, "seed", INT64_MIN, INT64_MAX, &i, err)) < 0)
        return -1;
    if (rc)
        sp->seed = (uint64_t)i;
    return 0;
}

/* A name the server does not serve is a 404, as vLLM answers: a client
 * that asks for a model it does not get should hear so. No list: any name. */
static int check_model(const struct api_parse_ctx *ctx, const char *name, struct api_error *err)
{
    if (!ctx->model_names || ctx->n_model_names == 0)
        return 0;
    for (size_t i = 0; i < ctx->n_model_names; i++)
        if (ctx->model_names[i] && strcmp(ctx->model_names[i], name) == 0)
            return 0;
    size_t n = strlen(name);
    api_error_set(err, 404, "model", "model_not_found", "The model `%.*s%s` does not exist.",
                  n > 128 ? 128 : (int)n, name, n > 128 ? "..." : "");
    return -1;
}

/* Tool calling is not implemented. Fields that ask for a tool call fail
 * loudly; those that ask for none (an empty list, "none", "auto" with no
 * tools, parallel_tool_calls) are harmless, and clients send them by default. */
static int no_tools(struct api_error *err, const char *name)
{
    api_error_set(err, 400, name, "unsupported_parameter",
                  "Unsupported parameter: '%s': this server does not support tool calling.", name);
    return -1;
}

static int parse_tools(const cJSON *o, struct api_error *err)
{
    static const char *const lists[] = {"tools", "functions"};
    static const char *const choices[] = {"tool_choice", "function_call"};
    int b;
    for (int i = 0; i < 2; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, lists[i]);
        if (!v || cJSON_IsNull(v))
            continue;
        if (!cJSON_IsArray(v))
            return bad_type(err, lists[i], "an array", v);
        if (v->child)
            return no_tools(err, lists[i]);
    }
    for (int i = 0; i < 2; i++) {
        const char *name = choices[i];
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
        if (!v || cJSON_IsNull(v))
            continue;
        if (cJSON_IsObject(v)) /* names a function to call */
            return no_tools(err, name);
        if (!cJSON_IsString(v))
            return bad_type(err, name, "a string or an object", v);
        if (strcmp(v->valuestring, "none") == 0 || strcmp(v->valuestring, "auto") == 0)
            continue; /* with no tools, "auto" can only choose none */
        if (i == 0 && strcmp(v->valuestring, "required") == 0)
            return no_tools(err, name);
        api_error_set(err, 400, name, "invalid_value",
                      "Invalid value for '%s': expected none, auto%s or an object naming a "
                      "function.",
                      name, i == 0 ? ", required" : "");
        return -1;
    }
    return get_bool(o, "parallel_tool_calls", &b, err) < 0 ? -1 : 0;
}

struct bias_pair {
    int32_t id;
    float bias;
};

static int by_bias_id(const void *a, const void *b)
{
    int32_t x = ((const struct bias_pair *)a)->id, y = ((const struct bias_pair *)b)->id;
    return (x > y) - (x < y);
}

/* logit_bias: {"token id": bias}, ids as decimal strings (OpenAI's form),
 * biases in [-100, 100]. */
static int parse_logit_bias(const cJSON *o, const struct api_parse_ctx *ctx,
                            struct engine_request *r, struct api_error *err)
{
    const cJSON *lb = cJSON_GetObjectItemCaseSensitive(o, "logit_bias");
    if (!lb || cJSON_IsNull(lb))
        return 0;
    if (!cJSON_IsObject(lb))
        return bad_type(err, "logit_bias", "an object", lb);
    const int n = cJSON_GetArraySize(lb);
    if (n == 0)
        return 0;
    if (n > ENGINE_MAX_LOGIT_BIAS) {
        api_error_set(err, 400, "logit_bias", "invalid_value",
                      "Invalid value for 'logit_bias': %d tokens; at most %d may be biased.", n,
                      ENGINE_MAX_LOGIT_BIAS);
        return -1;
    }
    const int64_t n_vocab = ctx->model ? ctx->model->n_vocab : INT32_MAX;
    /* the pairs, sorted by id */
    struct bias_pair *pairs = malloc((size_t)n * sizeof *pairs);
    r->bias_id = malloc((size_t)n * sizeof *r->bias_id);
    r->bias = malloc((size_t)n * sizeof *r->bias);
    if (!pairs || !r->bias_id || !r->bias) {
        free(pairs);
        api_error_set(err, 500, NULL, NULL, "out of memory");
        return -1;
    }
    const cJSON *it;
    int k = 0;
    cJSON_ArrayForEach(it, lb)
    {
        const char *key = it->string;
        size_t len = strspn(key, "0123456789");
        int64_t id = -1;
        if (len > 0 && len <= 10 && key[len] == 0)
            id = strtoll(key, NULL, 10);
        if (id < 0 || id >= n_vocab) {
            free(pairs);
            api_error_set(err, 400, "logit_bias", "invalid_value",
                          "Invalid value for 'logit_bias': '%.40s' is not a token id in [0, "
                          "%lld).",
                          key, (long long)n_vocab);
            return -1;
        }
        if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble) || it->valuedouble < -100 ||
            it->valuedouble > 100) {
            free(pairs);
            api_error_set(err, 400, "logit_bias", "invalid_value",
                          "Invalid value for 'logit_bias': the bias of token %lld must be a "
                          "number in [-100, 100], not %s.",
                          (long long)id, cJSON_IsNumber(it) ? "one outside it" : type_name(it));
            return -1;
        }
        pairs[k++] = (struct bias_pair){(int32_t)id, (float)it->valuedouble};
    }
    qsort(pairs, (size_t)n, sizeof *pairs, by_bias_id);
    for (k = 0; k < n; k++) {
        if (k > 0 && pairs[k].id == pairs[k - 1].id) {
            api_error_set(err, 400, "logit_bias", "invalid_value",
                          "Invalid value for 'logit_bias': token %d is given twice.",
                          (int)pairs[k].id);
            free(pairs);
            return -1;
        }
        r->bias_id[k] = pairs[k].id;
        r->bias[k] = pairs[k].bias;
    }
    r->n_bias = n;
    free(pairs);
    return 0;
}

/* Fields both endpoints share, and the ones we refuse. */
static int parse_common(const struct body *b, const struct api_parse_ctx *ctx, enum api_endpoint ep,
                        struct engine_request *r, struct api_request *meta, struct api_error *err)
{
    const cJSON *o = b->root;
    const char *s = NULL;
    int64_t i;
    int echo = 0, rc;

    if ((rc = get_string(o, "model", &s, err)) < 0)
        return -1;
    if (rc && check_model(ctx, s, err) < 0)
        return -1;
    if (get_string(o, "user", &s, err) < 0)
        return -1;
    /* n choices: as OpenAI, 1 to 128, and at most the sequences this
     * server runs at once (each choice is one, admitted together) */
    if ((rc = get_int(b, "n", INT64_MIN, INT64_MAX, &i, err)) < 0)
        return -1;
    if (rc && (i < 1 || i > API_MAX_CHOICES)) {
        api_error_set(err, 400, "n", "invalid_value",
                      "Invalid value for 'n': %lld; expected 1 to %d.", (long long)i,
                      API_MAX_CHOICES);
        return -1;
    }
    r->n_choices = rc ? (int)i : 1;
    if (ctx->model && ctx->model->max_seqs > 0 && r->n_choices > ctx->model->max_seqs) {
        api_error_set(err, 400, "n", "invalid_value",
                      "Invalid value for 'n': %d; this server runs at most %lld sequences at once "
                      "(--max-seqs), one for each choice.",
                      r->n_choices, (long long)ctx->model->max_seqs);
        return -1;
    }

    /* echo (completions): the prompt's tokens come first in the answer,
     * with their log-probs when it asks for log-probs */
    if (get_bool(o, "echo", &echo, err) < 0)
        return -1;
    if (echo && ep == API_CHAT)
        return unsupported(err, "echo", "echo = true on chat completions");
    r->echo = echo;

    /* max_tokens: absent or null runs until EOS, a stop, or the client
     * leaves; 0 with echo answers the prompt alone */
    r->max_tokens = -1;
    if ((rc = get_int(b, "max_tokens", echo ? 0 : 1, INT64_MAX, &i, err)) < 0)
        return -1;
    if (rc)
        r->max_tokens = i;
    if (ep == API_CHAT) {
        if ((rc = get_int(b, "max_completion_tokens", 1, INT64_MAX, &i, err)) < 0)
            return -1;
        if (rc)
            r->max_tokens = i;
    }
    if (parse_sampling(b, ctx, &r->sampling, err) < 0)
        return -1;
    if (parse_stop(o, ctx, r, err) < 0)
        return -1;

    if (get_bool(o, "stream", &meta->stream, err) < 0)
        return -1;
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(o, "stream_options");
    if (so && !cJSON_IsNull(so)) {
        if (!cJSON_IsObject(so))
            return bad_type(err, "stream_options", "an object", so);
        if (!meta->stream) {
            api_error_set(err, 400, "stream_options", "invalid_value",
                          "The 'stream_options' parameter is only allowed when 'stream' is "
                          "enabled.");
            return -1;
        }
        if (get_bool(so, "include_usage", &meta->include_usage, err) < 0) {
            snprintf(err->param, sizeof err->param, "stream_options.include_usage");
            return -1;
        }
    }

    /* extensions: session_id (body or X-Session-Id header; both must agree), kv_policy */
    if ((rc = get_string(o, "session_id", &s, err)) < 0)
        return -1;
    if (rc) {
        if (check_session(s, "session_id", err) < 0)
            return -1;
        /* a proxy routes on the header: a different body value would land the
         * session on the wrong replica */
        if (ctx->session_header && ctx->session_header[0] && strcmp(ctx->session_header, s) != 0) {
            api_error_set(err, 400, "session_id", "invalid_value",
                          "session_id in the body differs from the X-Session-Id header");
            return -1;
        }
        snprintf(r->session_id, sizeof r->session_id, "%s", s);
    } else if (ctx->session_header && ctx->session_header[0]) {
        if (check_session(ctx->session_header, "X-Session-Id", err) < 0)
            return -1;
        snprintf(r->session_id, sizeof r->session_id, "%s", ctx->session_header);
    }
    /* session_create: false continues an existing session or fails with 404
     * session_not_found; true (the default) starts it when it is gone */
    int create = 1;
    if (get_bool(o, "session_create", &create, err) < 0)
        return -1;
    r->session_must_exist = !create;
    /* skip_special_tokens (vLLM's name): true, the default, leaves generated
     * control tokens' text out of the output, as vLLM and llama-server do */
    int skip_special = 1;
    if (get_bool(o, "skip_special_tokens", &skip_special, err) < 0)
        return -1;
    r->show_special = !skip_special;
    /* ignore_eos, as vLLM has it: an end-of-generation token is generated
     * and counted like any other and does not end the answer (llama-server
     * instead never generates one), for benchmarks that want answers of a
     * set length */
    if (get_bool(o, "ignore_eos", &r->ignore_eos, err) < 0)
        return -1;
    if (r->ignore_eos && r->max_tokens < 0) {
        api_error_set(err, 400, "ignore_eos", "invalid_value",
                      "ignore_eos needs max_tokens: without it the answer would never end.");
        return -1;
    }
    if (r->ignore_eos && r->session_id[0]) {
        api_error_set(err, 400, "ignore_eos", "invalid_value",
                      "ignore_eos cannot be used on a session: what the model writes past the end "
                      "of its answer would stay in the session's history.");
        return -1;
    }
    /* min_tokens, as vLLM has it: no end-of-generation token and no stop
     * string before that many tokens */
    if ((rc = get_int(b, "min_tokens", 0, INT64_MAX, &i, err)) < 0)
        return -1;
    r->min_tokens = rc ? i : 0;
    if (r->max_tokens >= 0 && r->min_tokens > r->max_tokens) {
        api_error_set(err, 400, "min_tokens", "invalid_value",
                      "min_tokens must be at most max_tokens.");
        return -1;
    }
    /* without max_tokens nothing else bounds it (as ignore_eos, an answer
     * that could not end): at most what one context holds */
    if (r->max_tokens < 0 && ctx->model && r->min_tokens > ctx->model->n_ctx_train) {
        api_error_set(err, 400, "min_tokens", "invalid_value",
                      "min_tokens without max_tokens must be at most the model's context length "
                      "(%lld).",
                      (long long)ctx->model->n_ctx_train);
        return -1;
    }
    if ((rc = get_string(o, "kv_policy", &s, err)) < 0)
        return -1;
    if (rc) {
        if (engine_policy_parse(s, &r->policy) < 0) {
            api_error_set(err, 400, "kv_policy", "invalid_value",
                          "Invalid value for 'kv_policy': expected auto, window, sinks:N or "
                          "dense.");
            return -1;
        }
        r->has_policy = 1;
    }

    if (r->n_choices > 1 && r->session_id[0]) {
        api_error_set(err, 400, "n", "invalid_value",
                      "n > 1 cannot be used on a session: a session holds one conversation.");
        return -1;
    }
    if (echo && r->session_id[0]) {
        api_error_set(err, 400, "echo", "invalid_value",
                      "echo cannot be used on a session: a session's prompt holds only its new "
                      "turns.");
        return -1;
    }

    /* cache_prompt (llama-server's): false prefills the whole prompt even
     * where a free KV slot holds its first tokens */
    int cache_prompt = 1;
    if (get_bool(o, "cache_prompt", &cache_prompt, err) < 0)
        return -1;
    r->no_prefix = !cache_prompt;
    /* best_of (completions): that many candidates of each prompt, of which
     * the n with the highest log-prob per token are answered; each is a
     * choice the engine runs, so the bounds of n hold for them */
    if ((rc = get_int(b, "best_of", INT64_MIN, INT64_MAX, &i, err)) < 0)
        return -1;
    if (rc && i != 1 && ep == API_CHAT)
        return unsupported(err, "best_of", "best_of on chat completions");
    if (rc && (i < r->n_choices || i > API_MAX_BEST_OF)) {
        api_error_set(err, 400, "best_of", "invalid_value",
                      "Invalid value for 'best_of': %lld; expected n (%d) to %d.", (long long)i,
                      r->n_choices, API_MAX_BEST_OF);
        return -1;
    }
    if (rc && i > r->n_choices) {
        const char *why = r->session_id[0] ? "cannot be used on a session"
                          : meta->stream   ? "cannot be streamed: the candidates are judged "
                                             "once they have ended"
                          : ctx->model && ctx->model->max_seqs > 0 && i > ctx->model->max_seqs
                              ? "is more than this server runs at once (--max-seqs), one "
                                "sequence for each candidate"
                              : NULL;
        if (why) {
            api_error_set(err, 400, "best_of", "invalid_value", "best_of greater than n %s.", why);
            return -1;
        }
        meta->n_return = r->n_choices;
        r->n_choices = (int)i;
        r->score = 1;
    }
    if ((rc = get_string(o, "suffix", &s, err)) < 0)
        return -1;
    if (rc && s[0])
        return unsupported(err, "suffix", "a suffix");
    if (parse_logit_bias(o, ctx, r, err) < 0)
        return -1;
    if (parse_tools(o, err) < 0)
        return -1;
    const cJSON *rf = cJSON_GetObjectItemCaseSensitive(o, "response_format");
    if (rf && !cJSON_IsNull(rf)) {
        const cJSON *t = cJSON_IsObject(rf) ? cJSON_GetObjectItemCaseSensitive(rf, "type") : NULL;
        if (!cJSON_IsString(t))
            return bad_type(err, "response_format", "an object with a string 'type'", t ? t : rf);
        if (strcmp(t->valuestring, "json_object") == 0)
            r->json_object = 1;
        else if (strcmp(t->valuestring, "json_schema") == 0)
            return unsupported(err, "response_format", "response_format json_schema");
        else if (strcmp(t->valuestring, "text") != 0) {
            api_error_set(err, 400, "response_format", "invalid_value",
                          "Invalid value for 'response_format.type': expected text, json_object "
                          "or json_schema.");
            return -1;
        }
    }
    /* a JSON answer ends at its object's close: nothing may hold it open */
    const char *open = r->ignore_eos ? "ignore_eos" : r->min_tokens > 0 ? "min_tokens" : NULL;
    if (r->json_object && open) {
        api_error_set(err, 400, open, "invalid_value",
                      "%s cannot be used with response_format json_object: the answer ends when "
                      "its object closes.",
                      open);
        return -1;
    }
    return 0;
}

/* ---- completions ----------------------------------------------------------- */

/* The token ids of arr (an array; each in [0, n_vocab)) into *ids (malloc'd,
 * caller frees, also on failure) and *n. 0, or -1 with a 400 naming param
 * that says which item (noun) is bad, or a 500. */
static int read_ids(const cJSON *arr, const struct api_parse_ctx *ctx, const char *param,
                    const char *noun, int32_t **ids, int64_t *n, struct api_error *err)
{
    const int64_t n_vocab = ctx->model ? ctx->model->n_vocab : INT32_MAX;
    const int count = cJSON_GetArraySize(arr);
    *n = 0;
    *ids = malloc((size_t)(count > 0 ? count : 1) * sizeof **ids);
    if (!*ids) {
        api_error_set(err, 500, NULL, NULL, "out of memory");
        return -1;
    }
    const cJSON *it;
    int k = 0;
    cJSON_ArrayForEach(it, arr)
    {
        double d = cJSON_IsNumber(it) ? it->valuedouble : -1;
        if (!isfinite(d)) {
            api_error_set(err, 400, param, "invalid_value",
                          "Invalid value for '%s': the %s at index %d is out of range (not "
                          "finite).",
                          param, noun, k);
            return -1;
        }
        if (!cJSON_IsNumber(it)) {
            api_error_set(err, 400, param, "invalid_type",
                          "Invalid type for '%s': the %s at index %d is not a number.", param, noun,
                          k);
            return -1;
        }
        if (d != floor(d) || d < 0 || d >= (double)n_vocab) {
            api_error_set(err, 400, param, "invalid_value",
                          "Invalid value for '%s': the %s at index %d is %.17g, not an id in [0, "
                          "%lld).",
                          param, noun, k, d, (long long)n_vocab);
            return -1;
        }
        (*ids)[k++] = (int32_t)d;
    }
    *n = k;
    return 0;
}

static int take_ids(const cJSON *arr, const struct api_parse_ctx *ctx, struct engine_request *r,
                    struct api_error *err)
{
    r->add_bos = 0; /* token ids are the prompt exactly as sent, as OpenAI and vLLM take them */
    return read_ids(arr, ctx, "prompt", "token", &r->prompt_ids, &r->n_prompt_ids, err);
}

static int take_text(const char *s, struct engine_request *r, struct api_error *err)
{
    r->prompt_len = strlen(s);
    r->prompt = malloc(r->prompt_len + 1);
    if (!r->prompt) {
        api_error_set(err, 500, NULL, NULL, "out of memory");
        return -1;
    }
    memcpy(r->prompt, s, r->prompt_len + 1);
    return 0;
}

/* Prompt p (> 0) of several, item v of the list, into r->more[p - 1]: a
 * string when the first is one, else a non-empty array of token ids. */
static int take_more(const cJSON *v, int p, int text, const struct api_parse_ctx *ctx,
                     struct engine_request *r, struct api_error *err)
{
    struct engine_prompt *m = &r->more[p - 1];
    char param[32];
    snprintf(param, sizeof param, "prompt[%d]", p);
    if (text && cJSON_IsString(v)) {
        m->text_len = strlen(v->valuestring);
        m->text = malloc(m->text_len + 1);
        if (!m->text) {
            api_error_set(err, 500, NULL, NULL, "out of memory");
            return -1;
        }
        memcpy(m->text, v->valuestring, m->text_len + 1);
        return 0;
    }
    if (!text && cJSON_IsArray(v) && cJSON_GetArraySize(v) > 0)
        return read_ids(v, ctx, param, "token", &m->ids, &m->n_ids, err);
    return bad_type(err, param,
                    text ? "a string, as the list's first prompt is"
                         : "a non-empty array of token ids, as the list's first prompt is",
                    v);
}

/* prompt: a string, an array of token ids, or a list of either (several
 * prompts: all strings, or all arrays of ids). */
static int parse_prompt(const cJSON *o, const struct api_parse_ctx *ctx, struct engine_request *r,
                        struct api_error *err)
{
    static const char *const want =
        "a string, an array of token ids, or a list of strings or of arrays of token ids";
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "prompt");
    if (!v || cJSON_IsNull(v)) {
        api_error_set(err, 400, "prompt", "missing_required_parameter",
                      "Missing required parameter: 'prompt'.");
        return -1;
    }
    if (cJSON_IsString(v))
        return take_text(v->valuestring, r, err);
    if (!cJSON_IsArray(v))
        return bad_type(err, "prompt", want, v);
    int n = cJSON_GetArraySize(v);
    if (n == 0) {
        api_error_set(err, 400, "prompt", "invalid_value",
                      "Invalid value for 'prompt': the array is empty.");
        return -1;
    }
    if (cJSON_IsNumber(v->child))
        return take_ids(v, ctx, r, err);
    const int text = cJSON_IsString(v->child);
    if (text) {
        if (take_text(v->child->valuestring, r, err) < 0)
            return -1;
    } else if (cJSON_IsArray(v->child) && cJSON_GetArraySize(v->child) > 0) {
        if (take_ids(v->child, ctx, r, err) < 0)
            return -1;
    } else {
        return bad_type(err, n > 1 ? "prompt[0]" : "prompt", want, v->child);
    }
    if (n == 1)
        return 0;
    /* several prompts: n choices each, all run at once (as n's are);
     * checked before any item is read */
    const int64_t k = n;
    const int64_t max =
        ctx->model && ctx->model->max_seqs > 0 ? ctx->model->max_seqs : API_MAX_CHOICES;
    if (r->session_id[0]) {
        api_error_set(err, 400, "prompt", "invalid_value",
                      "Invalid value for 'prompt': several prompts cannot be used on a session: "
                      "a session holds one conversation.");
        return -1;
    }
    if (k * r->n_choices > max) {
        api_error_set(err, 400, "prompt", "invalid_value",
                      "Invalid value for 'prompt': %lld prompts of %d choices (n, or best_of) "
                      "each are %lld sequences; this server runs at most %lld at once "
                      "(--max-seqs).",
                      (long long)k, r->n_choices, (long long)(k * r->n_choices), (long long)max);
        return -1;
    }
    r->more = calloc((size_t)n - 1, sizeof *r->more);
    if (!r->more) {
        api_error_set(err, 500, NULL, NULL, "out of memory");
        return -1;
    }
    r->n_prompts = n; /* (engine_request_free frees what more holds so far) */
    int p = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, v)
    {
        if (p > 0 && take_more(it, p, text, ctx, r, err) < 0)
            return -1;
        p++;
    }
    return 0;
}

static int parse_completions(const struct body *b, const struct api_parse_ctx *ctx,
                             struct engine_request *r, struct api_request *meta,
                             struct api_error *err)
{
    int64_t i;
    int rc;
    if (parse_prompt(b->root, ctx, r, err) < 0)
        return -1;
    const int64_t k = r->n_prompts > 1 ? r->n_prompts : 1;
    meta->n_prompts = (int)k;
    /* legacy logprobs: an integer, the number of alternatives (0..5) */
    if ((rc = get_int(b, "logprobs", 0, COMPLETIONS_MAX_LOGPROBS, &i, err)) < 0)
        return -1;
    if (rc) {
        meta->logprobs = 1;
        meta->top_logprobs = (int)i;
    }
    return 0;
}

/* ---- chat ------------------------------------------------------------------ */

static int msg_error(struct api_error *err, int idx, const char *field, const char *msg)
{
    char param[64];
    snprintf(param, sizeof param, "messages[%d]%s%s", idx, field[0] ? "." : "", field);
    api_error_set(err, 400, param, "invalid_value", "Invalid value for '%s': %s", param, msg);
    return -1;
}

/* content: a string, null (an assistant turn with tool calls), or an array
 * of {"type":"text","text":...} parts, concatenated. Returns a malloc'd copy. */
static int message_text(const cJSON *content, int idx, char **out, size_t *len,
                        struct api_error *err)
{
    *out = NULL;
    *len = 0;
    if (!content || cJSON_IsNull(content)) {
        *out = strdup("");
        return *out ? 0 : -ENOMEM;
    }
    if (cJSON_IsString(content)) {
        *len = strlen(content->valuestring);
        *out = strdup(content->valuestring);
        return *out ? 0 : -ENOMEM;
    }
    if (!cJSON_IsArray(content))
        return msg_error(err, idx, "content", "expected a string or an array of text parts.");
    size_t total = 0;
    const cJSON *part;
    cJSON_ArrayForEach(part, content)
    {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsObject(part) || !cJSON_IsString(type) ||
            strcmp(type->valuestring, "text") != 0 || !cJSON_IsString(text))
            return msg_error(err, idx, "content", "only text content parts are supported.");
        total += strlen(text->valuestring);
    }
    char *buf = malloc(total + 1);
    if (!buf)
        return -ENOMEM;
    size_t o = 0;
    cJSON_ArrayForEach(part, content)
    {
        const char *t = cJSON_GetObjectItemCaseSensitive(part, "text")->valuestring;
        size_t n = strlen(t);
        memcpy(buf + o, t, n);
        o += n;
    }
    buf[o] = 0;
    *out = buf;
    *len = o;
    return 0;
}

static int known_role(const char *r)
{
    static const char *const roles[] = {"system",    "developer", "user",
                                        "assistant", "tool",      "function"};
    for (size_t i = 0; i < sizeof roles / sizeof roles[0]; i++)
        if (strcmp(r, roles[i]) == 0)
            return 1;
    return 0;
}

/* An earlier assistant turn that called tools (tool_calls, or the older
 * function_call) cannot be rendered without them, and dropping them would
 * leave the model a conversation that never happened: 400, as the request
 * fields that ask for tools get. An empty tool_calls list calls nothing. */
static int message_calls_tools(const cJSON *m, int idx, struct api_error *err)
{
    static const char *const fields[] = {"tool_calls", "function_call"};
    for (int i = 0; i < 2; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(m, fields[i]);
        if (!v || cJSON_IsNull(v) || (cJSON_IsArray(v) && !v->child))
            continue;
        char param[64];
        snprintf(param, sizeof param, "messages[%d].%s", idx, fields[i]);
        return no_tools(err, param);
    }
    return 0;
}

static int parse_messages(const cJSON *o, const struct api_parse_ctx *ctx, struct engine_request *r,
                          struct api_error *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "messages");
    if (!v || cJSON_IsNull(v)) {
        api_error_set(err, 400, "messages", "missing_required_parameter",
                      "Missing required parameter: 'messages'.");
        return -1;
    }
    if (!cJSON_IsArray(v))
        return bad_type(err, "messages", "an array", v);
    int n = cJSON_GetArraySize(v);
    if (n == 0) {
        api_error_set(err, 400, "messages", "invalid_value",
                      "Invalid value for 'messages': expected at least one message.");
        return -1;
    }
    struct api_chat_message *msgs = calloc((size_t)n, sizeof *msgs);
    char **texts = calloc((size_t)n, sizeof *texts);
    int rc = -1, k = 0;
    if (!msgs || !texts) {
        api_error_set(err, 500, NULL, NULL, "out of memory");
        goto out;
    }
    const cJSON *m;
    cJSON_ArrayForEach(m, v)
    {
        if (!cJSON_IsObject(m)) {
            msg_error(err, k, "", "expected an object.");
            goto out;
        }
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (!cJSON_IsString(role) || !known_role(role->valuestring)) {
            msg_error(err, k, "role",
                      "expected one of system, developer, user, assistant, tool, function.");
            goto out;
        }
        if (message_calls_tools(m, k, err) < 0)
            goto out;
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        if ((!content || cJSON_IsNull(content)) && strcmp(role->valuestring, "assistant") != 0) {
            msg_error(err, k, "content", "a message of this role needs content.");
            goto out;
        }
        size_t len;
        int trc = message_text(content, k, &texts[k], &len, err);
        if (trc == -ENOMEM)
            api_error_set(err, 500, NULL, NULL, "out of memory");
        if (trc < 0)
            goto out;
        msgs[k] = (struct api_chat_message){role->valuestring, texts[k], len};
        k++;
    }
    if (api_chat_render(ctx->chat, msgs, (size_t)n, r->session_id[0] == 0, &r->prompt,
                        &r->prompt_len) < 0 ||
        (r->session_id[0] &&
         api_chat_session_texts(ctx->chat, msgs, (size_t)n, &r->open, &r->close) < 0)) {
        api_error_set(err, 500, NULL, NULL, "out of memory");
        goto out;
    }
    rc = 0;
out:
    for (int i = 0; texts && i < n; i++)
        free(texts[i]);
    free(texts);
    free(msgs);
    return rc;
}

static int parse_chat(const struct body *b, const struct api_parse_ctx *ctx,
                      struct engine_request *r, struct api_request *meta, struct api_error *err)
{
    int lp = 0, rc;
    int64_t i;
    if (!ctx->chat) {
        api_error_set(err, 500, NULL, NULL, "no chat template configured");
        return -1;
    }
    if (parse_messages(b->root, ctx, r, err) < 0)
        return -1;
    if (get_bool(b->root, "logprobs", &lp, err) < 0)
        return -1;
    if ((rc = get_int(b, "top_logprobs", 0, ENGINE_MAX_TOP_LOGPROBS, &i, err)) < 0)
        return -1;
    if (rc && !lp) {
        api_error_set(err, 400, "top_logprobs", "invalid_value",
                      "Invalid value for 'top_logprobs': 'logprobs' must be true to use it.");
        return -1;
    }
    meta->logprobs = lp;
    meta->top_logprobs = rc ? (int)i : 0;
    return 0;
}

/* ---- the raw body, before cJSON ------------------------------------------ */

/* What cJSON 1.7 lets through that JSON does not, and how each is closed:
 * - any byte up to 0x20 counts as whitespace: only space, tab, CR and LF do;
 * - raw control characters in strings: they must be escaped;
 * - numbers are whatever strtod reads (012, 1., -.5): JSON's grammar only;
 * - a raw or escaped U+0000 ends the C string early ("a\u0000b" reads as "a"),
 *   and the tree cannot show it: the scan notes which string held it;
 * - no limit on values (each is a node of about 80 bytes) and a nesting limit
 *   of 1000: at most max_values values and API_JSON_MAX_DEPTH levels;
 * - a key given twice reads as its first value (most parsers keep the last):
 *   refused once the tree is built (unique_keys).
 * The grammar (brackets, commas, colons, literals, escapes other than \u)
 * stays cJSON's job, as do bytes after the object (cJSON reports where it
 * stopped). Strings must also be valid UTF-8 (RFC 8259 section 8.1). */

enum bad_string {
    BAD_STRING_NONE = 0,
    BAD_STRING_NUL,  /* holds U+0000, raw or escaped */
    BAD_STRING_UTF8, /* not valid UTF-8 */
};

struct json_scan {
    long bad_ordinal; /* the first bad string, counted in document order, keys included */
    enum bad_string bad;
};

static int json_syntax(struct api_error *err, size_t at, const char *what)
{
    api_error_set(err, 400, NULL, "invalid_json",
                  "We could not parse the JSON body of your request: %s at byte %zu.", what, at);
    return -1;
}

static int is_digit(unsigned char c)
{
    return c >= '0' && c <= '9';
}

static int is_hex(unsigned char c)
{
    return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* The string whose opening quote is at s[i]: returns the index after its
 * closing quote and sets *bad, or 0 after filling err. */
static size_t scan_string(const unsigned char *s, size_t len, size_t i, enum bad_string *bad,
                          struct api_error *err)
{
    size_t start = ++i;
    *bad = BAD_STRING_NONE;
    while (i < len && s[i] != '"') {
        if (s[i] == '\\') {
            if (i + 1 < len && s[i + 1] == 'u') {
                if (i + 6 > len || !is_hex(s[i + 2]) || !is_hex(s[i + 3]) || !is_hex(s[i + 4]) ||
                    !is_hex(s[i + 5]))
                    return json_syntax(err, i, "an invalid \\u escape"), 0;
                if (memcmp(s + i + 2, "0000", 4) == 0)
                    *bad = BAD_STRING_NUL;
                i += 6;
            } else {
                i += 2; /* cJSON checks which escapes exist */
            }
        } else if (s[i] == 0) {
            *bad = BAD_STRING_NUL;
            i++;
        } else if (s[i] < 0x20) {
            return json_syntax(err, i, "a control character inside a string"), 0;
        } else {
            i++;
        }
    }
    if (i >= len)
        return json_syntax(err, start - 1, "an unterminated string"), 0;
    if (!*bad && api__utf8_valid_prefix((const char *)s + start, i - start) != i - start)
        *bad = BAD_STRING_UTF8;
    return i + 1;
}

/* The number at s[i] ('-' or a digit): returns the index after it, or 0
 * after filling err. JSON: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? */
static size_t scan_number(const unsigned char *s, size_t len, size_t i, struct api_error *err)
{
    size_t start = i;
    if (s[i] == '-')
        i++;
    if (i < len && s[i] == '0') {
        i++;
    } else if (i < len && is_digit(s[i])) {
        while (i < len && is_digit(s[i]))
            i++;
    } else {
        return json_syntax(err, start, "an invalid number"), 0;
    }
    if (i < len && s[i] == '.') {
        if (++i >= len || !is_digit(s[i]))
            return json_syntax(err, start, "an invalid number"), 0;
        while (i < len && is_digit(s[i]))
            i++;
    }
    if (i < len && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < len && (s[i] == '+' || s[i] == '-'))
            i++;
        if (i >= len || !is_digit(s[i]))
            return json_syntax(err, start, "an invalid number"), 0;
        while (i < len && is_digit(s[i]))
            i++;
    }
    if (i < len &&
        (is_digit(s[i]) || s[i] == '.' || s[i] == 'e' || s[i] == 'E' || s[i] == '+' || s[i] == '-'))
        return json_syntax(err, start, "an invalid number"), 0;
    return i;
}

/* One pass over the raw body. Returns 0 with *sc filled, or -1 after filling
 * err (400 invalid_json or json_too_deep, 413 request_too_large). */
static int json_prescan(const char *body, size_t len, size_t max_values, struct json_scan *sc,
                        struct api_error *err)
{
    const unsigned char *s = (const unsigned char *)body;
    size_t i = 0, n_values = 0;
    long n_strings = 0;
    int depth = 0;
    sc->bad_ordinal = -1;
    sc->bad = BAD_STRING_NONE;
    if (len >= 3 && memcmp(s, "\xEF\xBB\xBF", 3) == 0)
        i = 3; /* a UTF-8 byte order mark, which cJSON skips too */
    while (i < len) {
        unsigned char c = s[i];
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
            i++;
            continue;
        }
        if (c < 0x20)
            return json_syntax(err, i, "a control character outside a string");
        int value = c == '{' || c == '[' || c == '"' || c == '-' || is_digit(c) || c == 't' ||
                    c == 'f' || c == 'n';
        if (value && ++n_values > max_values) {
            api_error_set(err, 413, NULL, "request_too_large",
                          "The JSON body holds more than %zu values (object keys count as "
                          "values); a long prompt can be sent as text instead of token ids.",
                          max_values);
            return -1;
        }
        if (c == '{' || c == '[') {
            if (++depth > API_JSON_MAX_DEPTH) {
                api_error_set(err, 400, NULL, "json_too_deep",
                              "The JSON body nests deeper than %d levels.", API_JSON_MAX_DEPTH);
                return -1;
            }
            i++;
        } else if (c == '}' || c == ']') {
            depth--; /* a stray one is cJSON's to reject */
            i++;
        } else if (c == '"') {
            enum bad_string bad;
            if ((i = scan_string(s, len, i, &bad, err)) == 0)
                return -1;
            if (bad && sc->bad_ordinal < 0) {
                sc->bad_ordinal = n_strings;
                sc->bad = bad;
            }
            n_strings++;
        } else if (c == '-' || is_digit(c)) {
            if ((i = scan_number(s, len, i, err)) == 0)
                return -1;
        } else if (c >= 'a' && c <= 'z') {
            while (i < len && s[i] >= 'a' && s[i] <= 'z')
                i++; /* true, false, null: cJSON checks the spelling */
        } else {
            i++; /* , : and anything cJSON will refuse */
        }
    }
    return 0;
}

/* ---- the tree, after cJSON ------------------------------------------------ */

/* The param that names child c of container v (v's own name is path[0..base)):
 * object members as .name, array items that are objects as [i]; other array
 * items are named by their array, as elsewhere here ("stop", "prompt"). */
static void child_path(const cJSON *v, const cJSON *c, int idx, char *path, size_t base, size_t cap)
{
    if (cJSON_IsObject(v))
        snprintf(path + base, cap - base, "%s%s", base ? "." : "", c->string);
    else if (cJSON_IsObject(c))
        snprintf(path + base, cap - base, "[%d]", idx);
    else
        path[base] = 0;
}

/* Finds the string json_prescan counted as *left (keys and values in document
 * order, as cJSON keeps them) and writes the param that names it into path.
 * Returns 0 when not under v, 1 for a value, 2 for a key. */
static int find_string(const cJSON *v, long *left, char *path, size_t cap)
{
    if (cJSON_IsString(v))
        return (*left)-- == 0;
    if (!cJSON_IsObject(v) && !cJSON_IsArray(v))
        return 0;
    size_t base = strlen(path);
    int idx = 0;
    for (const cJSON *c = v->child; c; c = c->next, idx++) {
        child_path(v, c, idx, path, base, cap);
        if (cJSON_IsObject(v) && (*left)-- == 0)
            return 2;
        int found = find_string(c, left, path, cap);
        if (found)
            return found;
        path[base] = 0;
    }
    return 0;
}

static int cmp_keys(const void *a, const void *b)
{
    return strcmp((*(const cJSON *const *)a)->string, (*(const cJSON *const *)b)->string);
}

/* Every object's keys must be unique: cJSON's lookups find the first of two,
 * most other parsers keep the last, so a proxy that checked the body and
 * this server would read different values. Sorting keeps a hostile object
 * of many keys O(n log n). Returns 0, or -1 after filling err. */
static int unique_keys(const cJSON *v, char *path, size_t cap, struct api_error *err)
{
    if (!cJSON_IsObject(v) && !cJSON_IsArray(v))
        return 0;
    size_t base = strlen(path);
    if (cJSON_IsObject(v) && v->child && v->child->next) {
        size_t n = 0, k = 0;
        for (const cJSON *c = v->child; c; c = c->next)
            n++;
        const cJSON **keys = malloc(n * sizeof *keys);
        if (!keys) {
            api_error_set(err, 500, NULL, NULL, "out of memory");
            return -1;
        }
        for (const cJSON *c = v->child; c; c = c->next)
            keys[k++] = c;
        qsort(keys, n, sizeof *keys, cmp_keys);
        const cJSON *dup = NULL;
        for (k = 1; k < n && !dup; k++)
            if (strcmp(keys[k - 1]->string, keys[k]->string) == 0)
                dup = keys[k];
        free(keys);
        if (dup) {
            child_path(v, dup, 0, path, base, cap);
            api_error_set(err, 400, path, "invalid_value",
                          "Invalid value for '%s': the key appears more than once.", path);
            return -1;
        }
    }
    int idx = 0;
    for (const cJSON *c = v->child; c; c = c->next, idx++) {
        child_path(v, c, idx, path, base, cap);
        if (unique_keys(c, path, cap, err) < 0)
            return -1;
        path[base] = 0;
    }
    return 0;
}

static int bad_string(const cJSON *root, const struct json_scan *sc, struct api_error *err)
{
    char path[sizeof err->param] = "";
    long left = sc->bad_ordinal;
    int found = find_string(root, &left, path, sizeof path);
    const char *what =
        sc->bad == BAD_STRING_NUL ? "may not contain U+0000 (NUL)" : "must be valid UTF-8";
    if (found == 2)
        api_error_set(err, 400, path, "invalid_value", "Invalid key '%s': keys %s.", path, what);
    else if (found == 1 && path[0])
        api_error_set(err, 400, path, "invalid_value", "Invalid value for '%s': strings %s.", path,
                      what);
    else /* not reached: the scan and cJSON see the same strings */
        api_error_set(err, 400, NULL, "invalid_value", "Strings %s.", what);
    return -1;
}

/* The body as a tree, checked as strict JSON: one object, nothing after it,
 * no string with U+0000 or invalid UTF-8, no key twice, within the size and
 * depth limits. Returns the tree (caller deletes), or NULL after filling err. */
static cJSON *parse_body(const struct api_parse_ctx *ctx, const char *body, size_t len,
                         struct api_error *err)
{
    size_t max_values = ctx->max_json_values ? ctx->max_json_values : API_JSON_DEFAULT_MAX_VALUES;
    struct json_scan sc;
    const char *end = NULL;
    char path[sizeof err->param] = "";
    if (!body || len == 0) {
        api_error_set(err, 400, NULL, "invalid_json",
                      "We could not parse the JSON body of your request: it is empty. The body "
                      "must be a JSON object.");
        return NULL;
    }
    if (json_prescan(body, len, max_values, &sc, err) < 0)
        return NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(body, len, &end, 0);
    if (!root) {
        api_error_set(err, 400, NULL, "invalid_json",
                      "We could not parse the JSON body of your request (error near byte %zu). "
                      "The body must be a JSON object.",
                      end ? (size_t)(end - body) : 0);
        return NULL;
    }
    for (const char *p = end; p < body + len; p++) {
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            json_syntax(err, (size_t)(p - body), "unexpected data after the JSON object");
            goto fail;
        }
    }
    if (!cJSON_IsObject(root)) {
        api_error_set(err, 400, NULL, NULL, "The request body must be a JSON object.");
        goto fail;
    }
    if (sc.bad_ordinal >= 0) {
        bad_string(root, &sc, err);
        goto fail;
    }
    if (unique_keys(root, path, sizeof path, err) < 0)
        goto fail;
    return root;
fail:
    cJSON_Delete(root);
    return NULL;
}

/* ---- entry ----------------------------------------------------------------- */

/* A parse's end: the tree deleted, and on failure (rc < 0) the request
 * freed and err filled. Returns 0 or -EINVAL. */
static int parse_end(cJSON *root, int rc, struct engine_request *out, struct api_error *err)
{
    cJSON_Delete(root);
    if (rc < 0) {
        engine_request_free(out);
        if (!err->status)
            api_error_set(err, 400, NULL, NULL, "invalid request");
        return -EINVAL;
    }
    return 0;
}

int api_request_parse(const struct api_parse_ctx *ctx, enum api_endpoint ep, const char *body,
                      size_t len, struct engine_request *out, struct api_request *meta,
                      struct api_error *err)
{
    memset(out, 0, sizeof *out);
    memset(meta, 0, sizeof *meta);
    memset(err, 0, sizeof *err);
    meta->endpoint = ep;
    out->id = ctx->id;
    out->owner = ctx->owner;
    out->add_bos = 1;
    out->parse_special = 1;

    cJSON *root = parse_body(ctx, body, len, err);
    int rc = -1;
    if (!root)
        goto out;
    /* common first: the session decides how chat messages are rendered */
    struct body b = {root, body, len};
    if (parse_common(&b, ctx, ep, out, meta, err) < 0)
        goto out;
    rc = ep == API_CHAT ? parse_chat(&b, ctx, out, meta, err)
                        : parse_completions(&b, ctx, out, meta, err);
    if (rc < 0)
        goto out;
    out->logprobs = meta->logprobs;
    out->top_logprobs = meta->top_logprobs;
    meta->n = out->n_choices;
    rc = 0;
out:
    return parse_end(root, rc, out, err);
}

/* ---- tokenize and detokenize ------------------------------------------------ */

int api_tokenize_parse(const struct api_parse_ctx *ctx, const char *body, size_t len,
                       struct engine_request *out, struct api_tokenize *tk, struct api_error *err)
{
    memset(out, 0, sizeof *out);
    tk->param = "content";
    tk->with_pieces = 0;
    memset(err, 0, sizeof *err);
    out->id = ctx->id;
    out->owner = ctx->owner;
    cJSON *root = parse_body(ctx, body, len, err);
    int rc = -1, add = 0, special = 1;
    const char *text = NULL;
    if (!root)
        goto out;
    /* content (llama-server's name) or prompt (vLLM's), not both */
    int has_c = get_string(root, "content", &text, err);
    if (has_c < 0)
        goto out;
    const char *p = NULL;
    int has_p = get_string(root, "prompt", &p, err);
    if (has_p < 0)
        goto out;
    if (has_c && has_p) {
        api_error_set(err, 400, "prompt", "invalid_value",
                      "Give the text as 'content' or as 'prompt', not both.");
        goto out;
    }
    if (has_p) {
        text = p;
        tk->param = "prompt";
    }
    if (!text) {
        api_error_set(err, 400, "content", "missing_required_parameter",
                      "Missing required parameter: 'content' (the text to tokenize).");
        goto out;
    }
    /* add_special (llama-server's name) or add_special_tokens (vLLM's) */
    int has_add = get_bool(root, "add_special", &add, err);
    if (has_add < 0 || (!has_add && get_bool(root, "add_special_tokens", &add, err) < 0) ||
        get_bool(root, "parse_special", &special, err) < 0 ||
        get_bool(root, "with_pieces", &tk->with_pieces, err) < 0)
        goto out;
    out->prompt_len = strlen(text); /* strings with U+0000 were refused by the pre-scan */
    out->prompt = malloc(out->prompt_len + 1);
    if (!out->prompt) {
        api_error_set(err, 500, NULL, NULL, "out of memory");
        goto out;
    }
    memcpy(out->prompt, text, out->prompt_len + 1);
    out->add_bos = add;
    out->parse_special = special;
    rc = 0;
out:
    return parse_end(root, rc, out, err);
}

int api_detokenize_parse(const struct api_parse_ctx *ctx, const char *body, size_t len,
                         int32_t **ids, int64_t *n, struct api_error *err)
{
    *ids = NULL;
    *n = 0;
    memset(err, 0, sizeof *err);
    cJSON *root = parse_body(ctx, body, len, err);
    if (!root)
        return -EINVAL;
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(root, "tokens");
    int rc = -EINVAL;
    if (!arr || cJSON_IsNull(arr)) {
        api_error_set(err, 400, "tokens", "missing_required_parameter",
                      "Missing required parameter: 'tokens' (an array of token ids).");
        goto out;
    }
    if (!cJSON_IsArray(arr)) {
        bad_type(err, "tokens", "an array of token ids", arr);
        goto out;
    }
    if (read_ids(arr, ctx, "tokens", "item", ids, n, err) < 0)
        goto out;
    rc = 0;
out:
    cJSON_Delete(root);
    if (rc < 0) {
        free(*ids);
        *ids = NULL;
        *n = 0;
    }
    return rc;
}
