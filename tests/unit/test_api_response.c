/*
 * test_api_response.c: api/response.c and api/error.c, from synthetic engine
 * events to OpenAI's JSON, compared as exact strings: text_completion,
 * chat.completion, chat.completion.chunk, usage, logprobs for both endpoints,
 * and the error object.
 */
#include <errno.h>

#include "api.h"
#include "test.h"

/* token id -> text: 1 " Hello", 2 " world", 3 the first byte of "é" (partial) */
static size_t tt_fn(void *arg, int32_t id, char *buf, size_t cap)
{
    (void)arg;
    const char *s = id == 1 ? " Hello" : id == 2 ? " world" : id == 3 ? "\xC3" : "?";
    size_t n = strlen(s);
    if (n >= cap)
        n = cap - 1;
    memcpy(buf, s, n);
    return n;
}

static const struct api_token_text TT = {tt_fn, NULL};

static struct engine_event tok(int32_t id, const char *text, float lp)
{
    struct engine_event ev;
    memset(&ev, 0, sizeof ev);
    ev.id = 9;
    ev.kind = ENGINE_EV_TOKEN;
    ev.token = id;
    ev.text_len = (uint32_t)strlen(text);
    memcpy(ev.text, text, ev.text_len);
    ev.logprob = lp;
    return ev;
}

static struct engine_event done(enum engine_finish f, int64_t p, int64_t c)
{
    struct engine_event ev;
    memset(&ev, 0, sizeof ev);
    ev.id = 9;
    ev.kind = ENGINE_EV_DONE;
    ev.token = -1;
    ev.finish = f;
    ev.prompt_tokens = p;
    ev.completion_tokens = c;
    return ev;
}

static void init(struct api_response *r, enum api_endpoint ep, int stream, int usage, int lp,
                 int top)
{
    struct api_request meta = {.endpoint = ep,
                               .stream = stream,
                               .include_usage = usage,
                               .logprobs = lp,
                               .top_logprobs = top};
    api_response_init(r, &meta, "smol", 0x2a, 1700000000, 1 << 20, &TT);
}

#define ASSERT_JSON(got, want)                                                                     \
    do {                                                                                           \
        char *g_ = (got);                                                                          \
        ASSERT(g_ != NULL);                                                                        \
        int same_ = strcmp(g_, (want)) == 0;                                                       \
        if (!same_)                                                                                \
            fprintf(stderr, "  got:  %s\n  want: %s\n", g_, (want));                               \
        free(g_);                                                                                  \
        ASSERT(same_);                                                                             \
    } while (0)

#define CMPL_HEAD                                                                                  \
    "{\"id\":\"cmpl-6553f10000000000002a\",\"object\":\"text_completion\","                        \
    "\"created\":1700000000,\"model\":\"smol\","
#define CHAT_HEAD                                                                                  \
    "{\"id\":\"chatcmpl-6553f10000000000002a\",\"object\":\"chat.completion\","                    \
    "\"created\":1700000000,\"model\":\"smol\","
#define CHUNK_HEAD                                                                                 \
    "{\"id\":\"chatcmpl-6553f10000000000002a\",\"object\":\"chat.completion.chunk\","              \
    "\"created\":1700000000,\"model\":\"smol\","

TEST(api_response_streams_text_completion_chunks)
{
    struct api_response r;
    init(&r, API_COMPLETIONS, 1, 0, 0, 0);
    ASSERT(api_response_role_chunk(&r) == NULL);
    struct engine_event ev = tok(1, " Hello", -0.5f);
    ASSERT_JSON(api_response_chunk(&r, &ev),
                CMPL_HEAD "\"choices\":[{\"text\":\" Hello\",\"index\":0,\"logprobs\":null,"
                          "\"finish_reason\":null}]}");
    struct engine_event held = tok(2, "", -1.0f); /* text held back (a partial stop) */
    ASSERT(api_response_chunk(&r, &held) == NULL);
    struct engine_event d = done(ENGINE_FINISH_LENGTH, 3, 2);
    ASSERT_JSON(api_response_final_chunk(&r, &d),
                CMPL_HEAD "\"choices\":[{\"text\":\"\",\"index\":0,\"logprobs\":null,"
                          "\"finish_reason\":\"length\"}]}");
    api_response_free(&r);
}

TEST(api_response_streams_chat_chunks_with_role_first_and_usage_last)
{
    struct api_response r;
    init(&r, API_CHAT, 1, 1, 0, 0);
    ASSERT_JSON(api_response_role_chunk(&r),
                CHUNK_HEAD "\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\","
                           "\"content\":\"\"},\"logprobs\":null,\"finish_reason\":null}],"
                           "\"usage\":null}");
    struct engine_event ev = tok(1, " Hello \"q\"\n", -0.5f);
    ASSERT_JSON(api_response_chunk(&r, &ev),
                CHUNK_HEAD "\"choices\":[{\"index\":0,\"delta\":{\"content\":\" Hello "
                           "\\\"q\\\"\\n\"},\"logprobs\":null,\"finish_reason\":null}],"
                           "\"usage\":null}");
    struct engine_event d = done(ENGINE_FINISH_STOP, 5, 1);
    ASSERT_JSON(api_response_final_chunk(&r, &d),
                CHUNK_HEAD "\"choices\":[{\"index\":0,\"delta\":{},\"logprobs\":null,"
                           "\"finish_reason\":\"stop\"}],\"usage\":null}");
    ASSERT_JSON(api_response_usage_chunk(&r, &d),
                CHUNK_HEAD "\"choices\":[],\"usage\":{\"prompt_tokens\":5,"
                           "\"completion_tokens\":1,\"total_tokens\":6}}");
    api_response_free(&r);
}

TEST(api_response_builds_a_whole_text_completion_with_usage)
{
    struct api_response r;
    init(&r, API_COMPLETIONS, 0, 0, 0, 0);
    struct engine_event a = tok(1, " Hello", -0.5f), b = tok(2, " world", -0.25f);
    ASSERT_OK(api_response_add(&r, &a));
    ASSERT_OK(api_response_add(&r, &b));
    struct engine_event d = done(ENGINE_FINISH_STOP, 4, 2);
    ASSERT_JSON(api_response_body(&r, &d),
                CMPL_HEAD "\"choices\":[{\"text\":\" Hello world\",\"index\":0,\"logprobs\":null,"
                          "\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":4,"
                          "\"completion_tokens\":2,\"total_tokens\":6}}");
    api_response_free(&r);
}

TEST(api_response_builds_a_whole_chat_completion)
{
    struct api_response r;
    init(&r, API_CHAT, 0, 0, 0, 0);
    struct engine_event a = tok(1, " Hello", -0.5f);
    ASSERT_OK(api_response_add(&r, &a));
    struct engine_event d = done(ENGINE_FINISH_LENGTH, 10, 1);
    ASSERT_JSON(api_response_body(&r, &d),
                CHAT_HEAD "\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\","
                          "\"content\":\" Hello\",\"refusal\":null},\"logprobs\":null,"
                          "\"finish_reason\":\"length\"}],\"usage\":{\"prompt_tokens\":10,"
                          "\"completion_tokens\":1,\"total_tokens\":11}}");
    api_response_free(&r);
}

TEST(api_response_completion_logprobs_have_the_legacy_shape)
{
    struct api_response r;
    init(&r, API_COMPLETIONS, 0, 0, 1, 2);
    struct engine_event a = tok(1, " Hello", -0.5f);
    a.n_top = 2;
    a.top_id[0] = 1;
    a.top_logprob[0] = -0.5f;
    a.top_id[1] = 2;
    a.top_logprob[1] = -1.5f;
    struct engine_event b = tok(2, " world", -0.25f);
    b.n_top = 2;
    b.top_id[0] = 2;
    b.top_logprob[0] = -0.25f;
    b.top_id[1] = 1;
    b.top_logprob[1] = -2.0f;
    struct engine_event cont = tok(-1, "!", 0); /* continues the previous token's text */
    ASSERT_OK(api_response_add(&r, &a));
    ASSERT_OK(api_response_add(&r, &b));
    ASSERT_OK(api_response_add(&r, &cont));
    struct engine_event d = done(ENGINE_FINISH_STOP, 1, 2);
    ASSERT_JSON(api_response_body(&r, &d),
                CMPL_HEAD "\"choices\":[{\"text\":\" Hello world!\",\"index\":0,\"logprobs\":{"
                          "\"tokens\":[\" Hello\",\" world\"],\"token_logprobs\":[-0.5,-0.25],"
                          "\"top_logprobs\":[{\" Hello\":-0.5,\" world\":-1.5},{\" world\":-0.25,"
                          "\" Hello\":-2}],\"text_offset\":[0,6]},\"finish_reason\":\"stop\"}],"
                          "\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2,"
                          "\"total_tokens\":3}}");
    api_response_free(&r);
}

TEST(api_response_chat_logprobs_have_token_bytes_and_top_logprobs)
{
    struct api_response r;
    init(&r, API_CHAT, 1, 0, 1, 1);
    struct engine_event a = tok(3, "", -0.5f); /* a partial UTF-8 token: text held */
    a.n_top = 1;
    a.top_id[0] = 3;
    a.top_logprob[0] = -0.5f;
    ASSERT_JSON(api_response_chunk(&r, &a),
                CHUNK_HEAD "\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\"},\"logprobs\":{"
                           "\"content\":[{\"token\":\"\xEF\xBF\xBD\",\"logprob\":-0.5,\"bytes\":["
                           "195],\"top_logprobs\":[{\"token\":\"\xEF\xBF\xBD\",\"logprob\":-0.5,"
                           "\"bytes\":[195]}]}],\"refusal\":null},\"finish_reason\":null}]}");
    api_response_free(&r);

    init(&r, API_CHAT, 0, 0, 1, 0);
    struct engine_event b = tok(1, " Hello", -0.5f);
    ASSERT_OK(api_response_add(&r, &b));
    struct engine_event d = done(ENGINE_FINISH_STOP, 1, 1);
    ASSERT_JSON(api_response_body(&r, &d),
                CHAT_HEAD "\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\","
                          "\"content\":\" Hello\",\"refusal\":null},\"logprobs\":{\"content\":[{"
                          "\"token\":\" Hello\",\"logprob\":-0.5,\"bytes\":[32,72,101,108,108,"
                          "111],\"top_logprobs\":[]}],\"refusal\":null},\"finish_reason\":"
                          "\"stop\"}],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1,"
                          "\"total_tokens\":2}}");
    api_response_free(&r);
}

TEST(api_response_bounds_a_whole_answer)
{
    struct api_response r;
    struct api_request meta = {.endpoint = API_COMPLETIONS};
    api_response_init(&r, &meta, "smol", 1, 1, 8, &TT);
    struct engine_event a = tok(1, " Hello", -0.5f);
    ASSERT_OK(api_response_add(&r, &a));
    ASSERT_EQ(api_response_add(&r, &a), -E2BIG);
    ASSERT_EQ(r.text_len, 6);
    api_response_free(&r);
}

TEST(api_response_finish_reasons_are_stop_or_length)
{
    ASSERT_STREQ(api_finish_reason(ENGINE_FINISH_STOP), "stop");
    ASSERT_STREQ(api_finish_reason(ENGINE_FINISH_LENGTH), "length");
    ASSERT_STREQ(api_finish_reason(ENGINE_FINISH_CANCELLED), "stop");
}

TEST(api_error_has_openai_shape_with_string_or_null_param_and_code)
{
    struct api_error e;
    api_error_set(&e, 400, "temperature", "invalid_value", "bad %s", "\"value\"");
    ASSERT_JSON(api_error_json(&e), "{\"error\":{\"message\":\"bad \\\"value\\\"\",\"type\":"
                                    "\"invalid_request_error\",\"param\":\"temperature\","
                                    "\"code\":\"invalid_value\"}}");
    api_error_set(&e, 500, NULL, NULL, "boom");
    ASSERT_JSON(api_error_json(&e), "{\"error\":{\"message\":\"boom\",\"type\":\"server_error\","
                                    "\"param\":null,\"code\":null}}");
    api_error_set(&e, 429, NULL, "rate_limit_exceeded", "busy");
    ASSERT_STREQ(e.type, "requests");
}

TEST(api_models_lists_the_served_model)
{
    ASSERT_JSON(api_models_json("smol", 5), "{\"object\":\"list\",\"data\":[{\"id\":\"smol\","
                                            "\"object\":\"model\",\"created\":5,\"owned_by\":"
                                            "\"streamsink\"}]}");
}

TEST_MAIN()
