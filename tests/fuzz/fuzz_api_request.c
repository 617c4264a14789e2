/*
 * fuzz_api_request.c: libFuzzer target for api_request_parse (api/request.c),
 * the JSON body -> engine request step every POST goes through.
 *
 * The first byte picks the endpoint and the context; the rest is the body,
 * in a buffer of exactly its length (not NUL-terminated, as the server hands
 * it over), so ASan sees any read past it. Checked on success: the body is a
 * JSON object to cJSON too and names no model the server does not serve; the
 * request is well formed (a NUL-terminated prompt of the stated length, or
 * token ids in [0, n_vocab); stop strings non-empty and within the limit,
 * packed first; sampling values in their documented ranges; logit_bias ids
 * distinct, ascending and in the vocabulary, biases in [-100, 100]; a printable
 * session id) and is released with engine_request_free; the same body is
 * also parsed as POST /tokenize and /detokenize bodies. On failure: -EINVAL,
 * nothing left to free, a status in 400..599 (a 404 only for an unknown
 * model), a type and a message, and api_error_json gives the OpenAI error
 * object, valid UTF-8, with the same message when that was valid UTF-8 (a
 * message quoting the client may not be).
 *
 * Byte 0:  bit 0 endpoint (0 completions, 1 chat)
 *          bits 1-2 chat template: SmolLM2's ChatML (default system prompt),
 *                   Llama-3, Llama-2, none (ChatML fallback)
 *          bit 3 an X-Session-Id header is present
 *          bit 4 no model info (token ids bounded by INT32_MAX)
 *          bits 5-6 max_stop_len: 0 (no limit), 8, 64, 4096
 *          bit 7 the server names its models (a body naming another one is
 *                a 404) and takes at most 64 JSON values (more is a 413)
 *
 * Build and run (clang only): as fuzz_http_conn.c says, with
 *   build-fuzz/tests/fuzz/fuzz_api_request <corpus dir> -max_total_time=60
 */
#include "api.h"
#include "../support/utf8_check.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define N_VOCAB 49152

static const char *const templates[4] = {
    /* SmolLM2-Instruct's, as its GGUF carries it (the \n are Jinja escapes) */
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}",
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}",
    "{{ bos_token + '[INST] ' + message['content'] + ' [/INST]' }}",
    NULL,
};

static void fail(const char *what, const struct api_error *e)
{
    fprintf(stderr, "fuzz_api_request: %s (status %d, param '%s', message '%s')\n", what,
            e ? e->status : 0, e ? e->param : "", e ? e->message : "");
    abort();
}

static int terminated(const char *s, size_t cap)
{
    return memchr(s, 0, cap) != NULL;
}

static void check_error(int rc, const struct engine_request *out, const struct api_error *e)
{
    static const struct engine_request zero;
    if (rc != -EINVAL)
        fail("failure is not -EINVAL", e);
    if (memcmp(out, &zero, sizeof zero) != 0)
        fail("a failed parse left something in the request", e);
    if (e->status < 400 || e->status > 599)
        fail("error status outside 400..599", e);
    if (e->status == 404 && strcmp(e->code, "model_not_found") != 0)
        fail("a 404 that is not model_not_found", e);
    if (!terminated(e->type, sizeof e->type) || !terminated(e->param, sizeof e->param) ||
        !terminated(e->code, sizeof e->code) || !terminated(e->message, sizeof e->message))
        fail("error field not NUL-terminated", e);
    if (!e->type[0] || !e->message[0])
        fail("error without a type or a message", e);

    char *json = api_error_json(e);
    if (!json)
        return; /* out of memory */
    cJSON *root = cJSON_Parse(json);
    const cJSON *err = cJSON_GetObjectItemCaseSensitive(root, "error");
    const cJSON *msg = cJSON_GetObjectItemCaseSensitive(err, "message");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(err, "type");
    const cJSON *param = cJSON_GetObjectItemCaseSensitive(err, "param");
    const cJSON *code = cJSON_GetObjectItemCaseSensitive(err, "code");
    if (!cJSON_IsString(msg) || !msg->valuestring[0] || !cJSON_IsString(type) || !param || !code)
        fail("api_error_json does not give the error object", e);
    if (test_valid_utf8((const unsigned char *)e->message, strlen(e->message)) &&
        strcmp(msg->valuestring, e->message) != 0)
        fail("api_error_json changed a valid message", e);
    if (!test_valid_utf8((const unsigned char *)json, strlen(json)))
        fail("api_error_json is not valid UTF-8", e);
    if (e->param[0] ? !cJSON_IsString(param) : !cJSON_IsNull(param))
        fail("error param is not a string or null as it should be", e);
    if (e->code[0] ? !cJSON_IsString(code) : !cJSON_IsNull(code))
        fail("error code is not a string or null as it should be", e);
    cJSON_Delete(root);
    free(json);
}

/* An accepted body is one JSON object; if it names a model, the server serves it. */
static void check_body(const struct api_parse_ctx *ctx, const char *body, size_t len)
{
    cJSON *root = cJSON_ParseWithLength(body, len);
    if (!cJSON_IsObject(root))
        fail("an accepted body is not a JSON object to cJSON", NULL);
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (ctx->n_model_names > 0 && cJSON_IsString(model)) {
        int known = 0;
        for (size_t i = 0; i < ctx->n_model_names; i++)
            known |= strcmp(ctx->model_names[i], model->valuestring) == 0;
        if (!known)
            fail("a body naming a model the server does not serve was accepted", NULL);
    }
    cJSON_Delete(root);
}

static void check_request(const struct api_parse_ctx *ctx, enum api_endpoint ep,
                          const struct engine_request *r, const struct api_request *m)
{
    int64_t n_vocab = ctx->model ? ctx->model->n_vocab : INT32_MAX;

    /* text prompts get the model's BOS; token ids are taken as sent */
    if (r->id != ctx->id || m->endpoint != ep || r->add_bos != (r->prompt != NULL) ||
        !r->parse_special)
        fail("request id, endpoint or flags", NULL);
    if (r->prompt) {
        if (r->prompt_ids || r->prompt[r->prompt_len] != 0 || strlen(r->prompt) != r->prompt_len)
            fail("text prompt length", NULL);
    } else {
        if (ep == API_CHAT || !r->prompt_ids || r->n_prompt_ids < 1)
            fail("no prompt", NULL);
        for (int64_t i = 0; i < r->n_prompt_ids; i++)
            if (r->prompt_ids[i] < 0 || r->prompt_ids[i] >= n_vocab)
                fail("token id outside the vocabulary", NULL);
    }
    if (r->max_tokens != -1 && r->max_tokens < 1)
        fail("max_tokens", NULL);
    if (!(r->sampling.temperature >= 0 && r->sampling.temperature <= 2) ||
        !(r->sampling.top_p >= 0 && r->sampling.top_p <= 1) ||
        !(r->sampling.min_p >= 0 && r->sampling.min_p <= 1) || r->sampling.top_k < 0 ||
        !(r->sampling.presence_penalty >= -2 && r->sampling.presence_penalty <= 2) ||
        !(r->sampling.frequency_penalty >= -2 && r->sampling.frequency_penalty <= 2))
        fail("sampling parameter out of range", NULL);
    for (int i = 0; i < ENGINE_MAX_STOP; i++) {
        if (!r->stop[i]) {
            for (int j = i + 1; j < ENGINE_MAX_STOP; j++)
                if (r->stop[j])
                    fail("stop strings not packed", NULL);
            break;
        }
        size_t n = strlen(r->stop[i]);
        if (n == 0 || (ctx->max_stop_len > 0 && (int64_t)n > ctx->max_stop_len))
            fail("stop string empty or over the limit", NULL);
    }
    if (r->n_bias < 0 || r->n_bias > ENGINE_MAX_LOGIT_BIAS || (r->n_bias > 0) != !!r->bias_id ||
        (r->n_bias > 0) != !!r->bias)
        fail("logit_bias count", NULL);
    for (int i = 0; i < r->n_bias; i++)
        if (r->bias_id[i] < 0 || r->bias_id[i] >= n_vocab ||
            (i > 0 && r->bias_id[i] <= r->bias_id[i - 1]) ||
            !(r->bias[i] >= -100 && r->bias[i] <= 100))
            fail("logit_bias ids not distinct, ascending, in the vocabulary, or a bias out of "
                 "[-100, 100]",
                 NULL);
    if (!terminated(r->session_id, sizeof r->session_id))
        fail("session id not NUL-terminated", NULL);
    for (const char *p = r->session_id; *p; p++)
        if (*p < 0x21 || *p > 0x7e)
            fail("session id not printable ASCII", NULL);
    if (!r->session_id[0] && ctx->session_header)
        fail("the session header was dropped", NULL);
    if (m->top_logprobs < 0 || m->top_logprobs > ENGINE_MAX_TOP_LOGPROBS ||
        (ep == API_COMPLETIONS && m->top_logprobs > 5) || (m->top_logprobs && !m->logprobs))
        fail("logprobs", NULL);
    if (r->logprobs != m->logprobs || r->top_logprobs != m->top_logprobs)
        fail("logprobs differ between request and meta", NULL);
    if (m->include_usage && !m->stream)
        fail("include_usage without stream", NULL);
}

/* Token pieces for the /tokenize answer: token i is the input's bytes
 * [4i, 4i + i % 7), whatever they are (a piece may be any bytes). */
struct pieces {
    const char *data;
    size_t len;
};
static const char *fuzz_piece(void *arg, int32_t id, size_t *len)
{
    const struct pieces *p = arg;
    size_t at = 4 * (size_t)id, n = (size_t)id % 7;
    if (at > p->len)
        at = p->len;
    *len = n < p->len - at ? n : p->len - at;
    return p->data + at;
}

/* A /tokenize answer with pieces built from the input: JSON that holds each
 * piece's bytes, as a string when they are UTF-8, else as their values. */
static void check_pieces(const char *data, size_t size)
{
    struct pieces p = {data, size};
    int32_t ids[8];
    for (int i = 0; i < 8; i++)
        ids[i] = i;
    char *json = api_tokens_json(7, ids, 7, fuzz_piece, &p);
    cJSON *root = json ? cJSON_Parse(json) : NULL;
    const cJSON *toks = cJSON_GetObjectItemCaseSensitive(root, "tokens");
    if (cJSON_GetArraySize(toks) != 8)
        fail("tokenize: pieces answer", NULL);
    for (int i = 0; i < 8; i++) {
        const cJSON *t = cJSON_GetArrayItem(toks, i);
        int32_t id = i == 0 ? 7 : ids[i - 1];
        size_t n;
        const char *want = fuzz_piece(&p, id, &n);
        const cJSON *jid = cJSON_GetObjectItemCaseSensitive(t, "id");
        const cJSON *pc = cJSON_GetObjectItemCaseSensitive(t, "piece");
        if (!cJSON_IsNumber(jid) || jid->valuedouble != id)
            fail("tokenize: piece id", NULL);
        int utf8 = test_valid_utf8((const unsigned char *)want, n);
        if (cJSON_IsString(pc)) {
            /* (cJSON ends a string at U+0000: such a piece is checked up to it) */
            size_t k = memchr(want, 0, n) ? (size_t)((const char *)memchr(want, 0, n) - want) : n;
            if (!utf8 || strlen(pc->valuestring) != k || memcmp(pc->valuestring, want, k) != 0)
                fail("tokenize: piece text", NULL);
        } else if (cJSON_IsArray(pc)) {
            if (utf8 || (size_t)cJSON_GetArraySize(pc) != n)
                fail("tokenize: piece bytes", NULL);
            for (size_t k = 0; k < n; k++)
                if (cJSON_GetArrayItem(pc, (int)k)->valuedouble != (unsigned char)want[k])
                    fail("tokenize: piece byte", NULL);
        } else {
            fail("tokenize: piece", NULL);
        }
    }
    cJSON_Delete(root);
    free(json);
}

/* The same body as POST /tokenize and POST /detokenize: on success a
 * NUL-terminated text of the stated length, or ids in the vocabulary; on
 * failure nothing left and a well-formed error. */
static void check_tokenize(const struct api_parse_ctx *ctx, const char *body, size_t len)
{
    struct engine_request out;
    struct api_tokenize tk;
    struct api_error err;
    const int64_t n_vocab = ctx->model ? ctx->model->n_vocab : INT32_MAX;
    int rc = api_tokenize_parse(ctx, body, len, &out, &tk, &err);
    if (rc == 0) {
        if (!out.prompt || strlen(out.prompt) != out.prompt_len || out.prompt_ids)
            fail("tokenize: text prompt", NULL);
        if ((strcmp(tk.param, "content") != 0 && strcmp(tk.param, "prompt") != 0) ||
            (tk.with_pieces != 0 && tk.with_pieces != 1))
            fail("tokenize: param or with_pieces", NULL);
        engine_request_free(&out);
    } else {
        check_error(rc, &out, &err);
    }
    int32_t *ids = (int32_t *)1;
    int64_t n = -1;
    rc = api_detokenize_parse(ctx, body, len, &ids, &n, &err);
    if (rc == 0) {
        if (n < 0 || (n > 0 && !ids))
            fail("detokenize: ids", NULL);
        for (int64_t i = 0; i < n; i++)
            if (ids[i] < 0 || ids[i] >= n_vocab)
                fail("detokenize: id outside the vocabulary", NULL);
        free(ids);
    } else {
        static const struct engine_request zero;
        check_error(rc, &zero, &err);
        if (ids || n != 0)
            fail("detokenize: a failure left ids", &err);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const int64_t stop_lens[4] = {0, 8, 64, 4096};
    static const char *const names[2] = {"SmolLM2-135M-Instruct", "smollm2"};
    static struct api_chat_template chat[4];
    static struct engine_model_info info;
    static int ready;
    struct api_parse_ctx ctx;
    struct engine_request out;
    struct api_request meta;
    struct api_error err;

    if (!ready) {
        for (int i = 0; i < 4; i++)
            api_chat_template_init(&chat[i], templates[i]);
        snprintf(info.name, sizeof info.name, "SmolLM2-135M-Instruct");
        info.n_vocab = N_VOCAB;
        info.bos = 1;
        info.eos = 2;
        ready = 1;
    }
    if (size < 1)
        return 0;
    uint8_t cfg = data[0];
    enum api_endpoint ep = (cfg & 1) ? API_CHAT : API_COMPLETIONS;
    ctx = (struct api_parse_ctx){
        .model = (cfg & 16) ? NULL : &info,
        .chat = &chat[(cfg >> 1) & 3],
        .session_header = (cfg & 8) ? "fuzz-session" : NULL,
        .id = 42,
        .default_seed = 7,
        .max_stop_len = stop_lens[(cfg >> 5) & 3],
        .model_names = (cfg & 128) ? names : NULL,
        .n_model_names = (cfg & 128) ? 2 : 0,
        .max_json_values = (cfg & 128) ? 64 : 0,
    };
    size_t len = size - 1;
    char *body = malloc(len ? len : 1); /* exactly the body: no NUL after it */
    if (!body)
        return 0;
    memcpy(body, data + 1, len);

    int rc = api_request_parse(&ctx, ep, body, len, &out, &meta, &err);
    if (rc == 0) {
        check_body(&ctx, body, len);
        check_request(&ctx, ep, &out, &meta);
        engine_request_free(&out);
    } else {
        check_error(rc, &out, &err);
    }
    check_tokenize(&ctx, body, len);
    check_pieces((const char *)data, size);
    free(body);
    return 0;
}
