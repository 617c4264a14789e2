/*
 * test_api_response.c: api/response.c and api/error.c, from synthetic engine
 * events to OpenAI's JSON, compared as exact strings: text_completion,
 * chat.completion, chat.completion.chunk, usage, logprobs for both endpoints,
 * and the error object.
 */
#include <cjson/cJSON.h>
#include <errno.h>

#include "api.h"
#include "test.h"

/* token id -> text: 1 " Hello", 2 " world", 3 the first byte of "é" (partial),
 * 4 the byte 0x00 (SmolLM2's token 190), 5 "a\0b" */
static size_t tt_fn(void *arg, int32_t id, char *buf, size_t cap)
{
    (void)arg;
    const char *s = id == 1   ? " Hello"
                    : id == 2 ? " world"
                    : id == 3 ? "\xC3"
                    : id == 4 ? ""
                    : id == 5 ? "a\0b"
                              : "?";
    size_t n = id == 4 ? 1 : id == 5 ? 3 : strlen(s);
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
    ev.has_lp = id >= 0; /* as the engine sends a token: its log-probs with it */
    ev.lp_token = id;
    ev.text_len = (uint32_t)strlen(text);
    memcpy(ev.text, text, ev.text_len);
    ev.logprob = lp;
    return ev;
}

/* A token event whose text is len bytes (NULs allowed). */
static struct engine_event tokn(int32_t id, const char *text, size_t len, float lp)
{
    struct engine_event ev = tok(id, "", lp);
    memcpy(ev.text, text, len);
    ev.text_len = (uint32_t)len;
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
    ASSERT(api_response_role_chunk(&r, 0) == NULL);
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
    ASSERT_JSON(api_response_role_chunk(&r, 0),
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
    ASSERT_JSON(api_response_usage_chunk(&r),
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

/* Choices: each chunk names its choice, each choice its own text,
 * logprobs and finish reason, the usage is the prompt once and every
 * choice's tokens, and --max-response bounds all choices together. */
static struct engine_event of_choice(struct engine_event ev, int32_t choice, int32_t left)
{
    ev.choice = choice;
    ev.choices_left = left;
    return ev;
}

TEST(api_response_keeps_each_choice_apart_and_counts_them_all)
{
    struct api_response r;
    struct api_request meta = {.endpoint = API_COMPLETIONS, .n = 3, .logprobs = 1};
    ASSERT_OK(api_response_init(&r, &meta, "smol", 0x2a, 1700000000, 1 << 20, &TT));
    struct engine_event a0 = of_choice(tok(1, "ab", -0.5f), 0, 0);
    struct engine_event a2 = of_choice(tok(2, "xyz", -0.25f), 2, 0);
    struct engine_event b0 = of_choice(tok(1, "c", -1.0f), 0, 0);
    ASSERT_OK(api_response_add(&r, &a0));
    ASSERT_OK(api_response_add(&r, &a2));
    ASSERT_OK(api_response_add(&r, &b0));
    struct engine_event d2 = of_choice(done(ENGINE_FINISH_STOP, 4, 1), 2, 2);
    api_response_choice_done(&r, &d2);
    api_response_choice_done(&r, &d2); /* counted once */
    struct engine_event d1 = of_choice(done(ENGINE_FINISH_STOP, 4, 0), 1, 1);
    api_response_choice_done(&r, &d1);
    struct engine_event d0 = of_choice(done(ENGINE_FINISH_LENGTH, 4, 2), 0, 0);
    ASSERT_JSON(api_response_body(&r, &d0), CMPL_HEAD
                "\"choices\":[{\"text\":\"abc\",\"index\":0,\"logprobs\":{\"tokens\":"
                "[\" Hello\",\" Hello\"],\"token_logprobs\":[-0.5,-1],\"top_logprobs\":[{},{}],"
                "\"text_offset\":[0,2]},\"finish_reason\":\"length\"},"
                "{\"text\":\"\",\"index\":1,\"logprobs\":{\"tokens\":[],"
                "\"token_logprobs\":[],\"top_logprobs\":[],\"text_offset\":[]},"
                "\"finish_reason\":\"stop\"},"
                "{\"text\":\"xyz\",\"index\":2,\"logprobs\":{\"tokens\":[\" world\"],"
                "\"token_logprobs\":[-0.25],\"top_logprobs\":[{}],\"text_offset\":[0]},"
                "\"finish_reason\":\"stop\"}],"
                "\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":3,"
                "\"total_tokens\":7}}");
    api_response_free(&r);

    /* streamed: the index is the choice's, text_offset counts per choice */
    meta = (struct api_request){.endpoint = API_CHAT, .n = 2, .stream = 1, .include_usage = 1};
    ASSERT_OK(api_response_init(&r, &meta, "smol", 0x2a, 1700000000, 1 << 20, &TT));
    ASSERT_JSON(api_response_role_chunk(&r, 1),
                CHUNK_HEAD "\"choices\":[{\"index\":1,\"delta\":{\"role\":\"assistant\","
                           "\"content\":\"\"},\"logprobs\":null,\"finish_reason\":null}],"
                           "\"usage\":null}");
    struct engine_event c1 = of_choice(tok(1, "yo", -0.5f), 1, 0);
    ASSERT_JSON(api_response_chunk(&r, &c1),
                CHUNK_HEAD "\"choices\":[{\"index\":1,\"delta\":{\"content\":\"yo\"},"
                           "\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}");
    struct engine_event e1 = of_choice(done(ENGINE_FINISH_STOP, 6, 2), 1, 1);
    ASSERT_JSON(api_response_final_chunk(&r, &e1),
                CHUNK_HEAD "\"choices\":[{\"index\":1,\"delta\":{},\"logprobs\":null,"
                           "\"finish_reason\":\"stop\"}],\"usage\":null}");
    struct engine_event e0 = of_choice(done(ENGINE_FINISH_LENGTH, 6, 5), 0, 0);
    free(api_response_final_chunk(&r, &e0));
    ASSERT_JSON(api_response_usage_chunk(&r),
                CHUNK_HEAD "\"choices\":[],\"usage\":{\"prompt_tokens\":6,"
                           "\"completion_tokens\":7,\"total_tokens\":13}}");
    api_response_free(&r);

    /* one bound for all: 8 bytes, 5 in choice 0, 3 more in choice 1 fit, 1 more does not */
    meta = (struct api_request){.endpoint = API_COMPLETIONS, .n = 2};
    ASSERT_OK(api_response_init(&r, &meta, "smol", 1, 1, 8, &TT));
    struct engine_event f0 = of_choice(tok(1, "hello", 0), 0, 0);
    struct engine_event f1 = of_choice(tok(1, "abc", 0), 1, 0);
    struct engine_event g1 = of_choice(tok(1, "d", 0), 1, 0);
    ASSERT_OK(api_response_add(&r, &f0));
    ASSERT_OK(api_response_add(&r, &f1));
    ASSERT_EQ(api_response_add(&r, &g1), -E2BIG);
    ASSERT_EQ(r.ch[0].tokens_held, 1);
    ASSERT_EQ(r.ch[1].tokens_held, 1);
    ASSERT_EQ(r.ch[1].text_len, 3);
    api_response_free(&r);
}

/* Several prompts of n choices: n_prompts * n choices, choice p * n + j of
 * prompt p; the usage counts each prompt once (its choices report it
 * alike) and every choice's tokens. */
TEST(api_response_counts_each_of_several_prompts_once)
{
    struct api_response r;
    struct api_request meta = {.endpoint = API_COMPLETIONS, .n = 2, .n_prompts = 3};
    ASSERT_OK(api_response_init(&r, &meta, "smol", 0x2a, 1700000000, 1 << 20, &TT));
    ASSERT_EQ(r.n_ch, 6);
    const int64_t prompt[3] = {4, 9, 2};
    for (int k = 5; k >= 1; k--) {
        struct engine_event t = of_choice(tok(1, k == 5 ? "e" : "x", 0), k, 0);
        ASSERT_OK(api_response_add(&r, &t));
        struct engine_event d = of_choice(done(ENGINE_FINISH_STOP, prompt[k / 2], 1), k, k);
        api_response_choice_done(&r, &d);
    }
    struct engine_event d0 = of_choice(done(ENGINE_FINISH_LENGTH, prompt[0], 3), 0, 0);
    char *body = api_response_body(&r, &d0);
    ASSERT(body != NULL);
    ASSERT(
        strstr(body, "{\"text\":\"e\",\"index\":5,\"logprobs\":null,\"finish_reason\":\"stop\"}"));
    ASSERT(strstr(body, "\"usage\":{\"prompt_tokens\":15,\"completion_tokens\":8,"
                        "\"total_tokens\":23}"));
    free(body);
    api_response_free(&r);

    /* streamed: the usage chunk after the last choice */
    meta.stream = 1;
    meta.include_usage = 1;
    ASSERT_OK(api_response_init(&r, &meta, "smol", 0x2a, 1700000000, 1 << 20, &TT));
    for (int k = 0; k < 6; k++) {
        struct engine_event d = of_choice(done(ENGINE_FINISH_STOP, prompt[k / 2], 2), k, 5 - k);
        free(api_response_final_chunk(&r, &d));
    }
    ASSERT_JSON(api_response_usage_chunk(&r),
                "{\"id\":\"cmpl-6553f10000000000002a\",\"object\":\"text_completion\","
                "\"created\":1700000000,\"model\":\"smol\",\"choices\":[],\"usage\":"
                "{\"prompt_tokens\":15,\"completion_tokens\":12,\"total_tokens\":27}}");
    api_response_free(&r);
}

/* best_of: of each prompt's candidates, the n_return with the highest
 * log-prob per token (not in total) are answered, best first (the earlier
 * of two equal), indexed in that order; the usage counts every candidate. */
TEST(api_response_answers_the_best_of_each_prompt_s_candidates)
{
    struct api_response r;
    struct api_request meta = {.endpoint = API_COMPLETIONS, .n = 3, .n_return = 2, .n_prompts = 2};
    ASSERT_OK(api_response_init(&r, &meta, "smol", 0x2a, 1700000000, 1 << 20, &TT));
    /* prompt 0: a -1.0 a token over 2, b -0.5 over 4 (lowest total, best
     * per token), c -0.25 over 1; prompt 1: d and e equal, f worse */
    static const char *const text[6] = {"a", "b", "c", "d", "e", "f"};
    static const double sum[6] = {-2.0, -2.0, -0.25, -3.0, -3.0, -4.0};
    static const int64_t toks[6] = {2, 4, 1, 3, 3, 3};
    for (int k = 0; k < 6; k++) {
        struct engine_event t = of_choice(tok(1, text[k], 0), k, 0);
        ASSERT_OK(api_response_add(&r, &t));
        struct engine_event d = of_choice(done(ENGINE_FINISH_STOP, 5, toks[k]), k, 5 - k);
        d.lp_sum = sum[k];
        if (k < 5)
            api_response_choice_done(&r, &d);
        else
            ASSERT_JSON(api_response_body(&r, &d),
                        CMPL_HEAD "\"choices\":["
                                  "{\"text\":\"c\",\"index\":0,\"logprobs\":null,"
                                  "\"finish_reason\":\"stop\"},"
                                  "{\"text\":\"b\",\"index\":1,\"logprobs\":null,"
                                  "\"finish_reason\":\"stop\"},"
                                  "{\"text\":\"d\",\"index\":2,\"logprobs\":null,"
                                  "\"finish_reason\":\"stop\"},"
                                  "{\"text\":\"e\",\"index\":3,\"logprobs\":null,"
                                  "\"finish_reason\":\"stop\"}],"
                                  "\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":16,"
                                  "\"total_tokens\":26}}");
    }
    api_response_free(&r);
}

/* Prompt tokens a free KV slot held are reported as OpenAI reports cached
 * ones, in usage.prompt_tokens_details, counted once a prompt (its choices
 * after the first took their cells and report none); none: no details. */
TEST(api_response_reports_cached_prompt_tokens)
{
    struct api_response r;
    struct api_request meta = {.endpoint = API_COMPLETIONS, .n = 2};
    ASSERT_OK(api_response_init(&r, &meta, "smol", 0x2a, 1700000000, 1 << 20, &TT));
    struct engine_event d1 = of_choice(done(ENGINE_FINISH_STOP, 40, 3), 1, 1);
    api_response_choice_done(&r, &d1);
    struct engine_event d0 = of_choice(done(ENGINE_FINISH_STOP, 40, 2), 0, 0);
    d0.cached_tokens = 31;
    char *body = api_response_body(&r, &d0);
    ASSERT(body != NULL);
    ASSERT(strstr(body, "\"usage\":{\"prompt_tokens\":40,\"completion_tokens\":5,"
                        "\"total_tokens\":45,\"prompt_tokens_details\":{\"cached_tokens\":31}}"));
    free(body);
    api_response_free(&r);
    ASSERT_OK(api_response_init(&r, &meta, "smol", 0x2a, 1700000000, 1 << 20, &TT));
    d0.cached_tokens = 0;
    api_response_choice_done(&r, &d1);
    body = api_response_body(&r, &d0);
    ASSERT(body != NULL);
    ASSERT(strstr(body, "\"total_tokens\":45}") && !strstr(body, "prompt_tokens_details"));
    free(body);
    api_response_free(&r);
}

/* A best_of answer cut at --max-response: each candidate's DONE is cut to
 * the tokens the answer holds, and its score keeps its per-token mean over
 * the tokens the engine summed, so the candidate with the better mean wins
 * however much of it the bound left (a is better per token; its sum over
 * all its tokens divided by its 2 held ones would rank it below b). */
TEST(api_response_judges_cut_candidates_by_the_mean_they_had)
{
    struct api_response r;
    struct api_request meta = {.endpoint = API_COMPLETIONS, .n = 2, .n_return = 1};
    ASSERT_OK(api_response_init(&r, &meta, "smol", 0x2a, 1700000000, 1 << 20, &TT));
    struct engine_event ta = of_choice(tok(1, "a", 0), 0, 0), tb = of_choice(tok(1, "b", 0), 1, 0);
    ASSERT_OK(api_response_add(&r, &ta));
    ASSERT_OK(api_response_add(&r, &tb));
    struct engine_event da = of_choice(done(ENGINE_FINISH_CANCELLED, 5, 10), 0, 1);
    da.lp_sum = -3.0; /* -0.3 a token */
    api_done_cut(&da, 2);
    ASSERT_EQ(da.completion_tokens, 2);
    ASSERT_EQ(da.finish, ENGINE_FINISH_LENGTH);
    ASSERT_NEAR(da.lp_sum, -0.6, 1e-12);
    api_response_choice_done(&r, &da);
    struct engine_event db = of_choice(done(ENGINE_FINISH_CANCELLED, 5, 10), 1, 0);
    db.lp_sum = -5.0; /* -0.5 a token */
    api_done_cut(&db, 9);
    char *body = api_response_body(&r, &db);
    ASSERT(body != NULL);
    ASSERT(strstr(body, "\"choices\":[{\"text\":\"a\",\"index\":0,\"logprobs\":null,"
                        "\"finish_reason\":\"length\"}]"));
    ASSERT(strstr(body, "\"completion_tokens\":11,"));
    free(body);
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

/* An echoed prompt: its tokens are events of token -1 whose log-probs name
 * lp_token; the first has none (lp_null): null in token_logprobs and in
 * top_logprobs, in the whole answer and in its chunk. */
TEST(api_response_an_echoed_first_token_has_null_logprobs)
{
    struct api_response r;
    init(&r, API_COMPLETIONS, 0, 0, 1, 1);
    struct engine_event a = tok(-1, " Hello", 0);
    a.has_lp = 1;
    a.lp_null = 1;
    a.lp_token = 1;
    struct engine_event b = tok(-1, " world", -0.25f);
    b.has_lp = 1;
    b.lp_token = 2;
    b.n_top = 1;
    b.top_id[0] = 1;
    b.top_logprob[0] = -0.125f;
    ASSERT_OK(api_response_add(&r, &a));
    ASSERT_OK(api_response_add(&r, &b));
    struct engine_event d = done(ENGINE_FINISH_LENGTH, 2, 0);
    ASSERT_JSON(api_response_body(&r, &d),
                CMPL_HEAD "\"choices\":[{\"text\":\" Hello world\",\"index\":0,\"logprobs\":{"
                          "\"tokens\":[\" Hello\",\" world\"],\"token_logprobs\":[null,-0.25],"
                          "\"top_logprobs\":[null,{\" Hello\":-0.125}],\"text_offset\":[0,6]},"
                          "\"finish_reason\":\"length\"}],"
                          "\"usage\":{\"prompt_tokens\":2,\"completion_tokens\":0,"
                          "\"total_tokens\":2}}");
    api_response_free(&r);
    init(&r, API_COMPLETIONS, 1, 0, 1, 1);
    char *c = api_response_chunk(&r, &a);
    ASSERT(c != NULL);
    ASSERT(strstr(c, "\"token_logprobs\":[null],\"top_logprobs\":[null]") != NULL);
    free(c);
    api_response_free(&r);
}

/* text_offset counts characters (code points, as Python indexes a str and
 * vLLM counts them), not bytes: after "é" (2 bytes) the next token starts at
 * 1. A byte the text cannot carry is one U+FFFD in it, so it counts one. The
 * whole answer and the streamed chunks agree. */
TEST(api_response_text_offset_counts_characters)
{
    static const char *const texts[] = {"\xC3\xA9",
                                        "\xE2\x82\xAC"
                                        "x",
                                        "\xF0\x9F\x98\x80", "\xFF", "a"};
    static const int want[] = {0, 1, 3, 4, 5};
    for (int stream = 0; stream < 2; stream++) {
        struct api_response r;
        init(&r, API_COMPLETIONS, stream, 0, 1, 0);
        for (int k = 0; k < 5; k++) {
            struct engine_event ev = tok(1, texts[k], -0.5f);
            if (!stream) {
                ASSERT_OK(api_response_add(&r, &ev));
                continue;
            }
            char *chunk = api_response_chunk(&r, &ev);
            cJSON *o = cJSON_Parse(chunk);
            free(chunk);
            const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
            const cJSON *lp = cJSON_GetObjectItem(c, "logprobs");
            const cJSON *off = cJSON_GetArrayItem(cJSON_GetObjectItem(lp, "text_offset"), 0);
            ASSERT(cJSON_IsNumber(off));
            ASSERT_EQ((int)off->valuedouble, want[k]);
            cJSON_Delete(o);
        }
        if (stream) {
            api_response_free(&r);
            continue;
        }
        struct engine_event d = done(ENGINE_FINISH_STOP, 1, 5);
        char *body = api_response_body(&r, &d);
        cJSON *o = cJSON_Parse(body);
        free(body);
        const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
        const cJSON *offs = cJSON_GetObjectItem(cJSON_GetObjectItem(c, "logprobs"), "text_offset");
        ASSERT_EQ(cJSON_GetArraySize(offs), 5);
        for (int k = 0; k < 5; k++)
            ASSERT_EQ((int)cJSON_GetArrayItem(offs, k)->valuedouble, want[k]);
        ASSERT_STREQ(cJSON_GetObjectItem(c, "text")->valuestring, "\xC3\xA9\xE2\x82\xAC"
                                                                  "x\xF0\x9F\x98\x80\xEF\xBF\xBD"
                                                                  "a");
        cJSON_Delete(o);
        api_response_free(&r);
    }
}

/* With stop strings a token's log-probs may come on a later event than the
 * token (lp_token, with the first byte of its text), and a token may come
 * with none (its text is a stop string's): the entries follow has_lp and
 * lp_token, not token, and text_offset is where each entry's event starts. */
TEST(api_response_logprobs_follow_lp_token_not_token)
{
    struct api_response r;
    init(&r, API_COMPLETIONS, 0, 0, 1, 0);
    struct engine_event a = tok(2, "", -0.75f); /* " world" generated, its text held */
    a.has_lp = 0;
    struct engine_event b = tok(-1, "!", 0);           /* text of a token sent before */
    struct engine_event c = tok(-1, " world", -0.75f); /* the held text and its log-probs */
    c.has_lp = 1;
    c.lp_token = 2;
    struct engine_event d = tok(1, "", -0.5f); /* " Hello": a stop string's, no log-probs */
    d.has_lp = 0;
    ASSERT_OK(api_response_add(&r, &a));
    ASSERT_OK(api_response_add(&r, &b));
    ASSERT_OK(api_response_add(&r, &c));
    ASSERT_OK(api_response_add(&r, &d));
    struct engine_event e = done(ENGINE_FINISH_STOP, 1, 2);
    ASSERT_JSON(api_response_body(&r, &e),
                CMPL_HEAD "\"choices\":[{\"text\":\"! world\",\"index\":0,\"logprobs\":{"
                          "\"tokens\":[\" world\"],\"token_logprobs\":[-0.75],"
                          "\"top_logprobs\":[{}],\"text_offset\":[1]},\"finish_reason\":\"stop\"}],"
                          "\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2,"
                          "\"total_tokens\":3}}");
    api_response_free(&r);

    init(&r, API_CHAT, 1, 0, 1, 0);
    ASSERT(api_response_chunk(&r, &a) == NULL); /* no text, no log-probs: no chunk */
    ASSERT_JSON(api_response_chunk(&r, &c),
                CHUNK_HEAD "\"choices\":[{\"index\":0,\"delta\":{\"content\":\" world\"},"
                           "\"logprobs\":{\"content\":[{\"token\":\" world\",\"logprob\":-0.75,"
                           "\"bytes\":[32,119,111,114,108,100],\"top_logprobs\":[]}],"
                           "\"refusal\":null},\"finish_reason\":null}]}");
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
    ASSERT_EQ(r.ch[0].text_len, 6);
    api_response_free(&r);
}

/* A model that repeats a hidden control token (a token event with no text)
 * still reaches the bound: each counts one byte. Events that carry text of
 * tokens already counted (token -1) do not. */
TEST(api_response_bounds_an_answer_of_tokens_with_no_text)
{
    struct api_response r;
    struct api_request meta = {.endpoint = API_COMPLETIONS};
    api_response_init(&r, &meta, "smol", 1, 1, 8, &TT);
    struct engine_event hidden = tok(1, "", -0.5f);
    struct engine_event tail = tok(-1, "", 0);
    struct engine_event a = tok(5, "ab", -0.5f);
    ASSERT_OK(api_response_add(&r, &a));
    for (int i = 0; i < 100; i++)
        ASSERT_OK(api_response_add(&r, &tail));
    for (int i = 0; i < 6; i++)
        ASSERT_OK(api_response_add(&r, &hidden));
    ASSERT_EQ(api_response_add(&r, &hidden), -E2BIG);
    ASSERT_EQ(api_response_add(&r, &a), -E2BIG);
    ASSERT_EQ(r.ch[0].text_len, 2);
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

TEST(api_response_keeps_the_text_after_a_nul_streamed_and_whole)
{
    struct api_response r;
    struct engine_event ev = tokn(4, "A\0BC", 4, -0.5f);
    struct engine_event d = done(ENGINE_FINISH_STOP, 1, 1);

    init(&r, API_COMPLETIONS, 1, 0, 0, 0);
    ASSERT_JSON(api_response_chunk(&r, &ev),
                CMPL_HEAD "\"choices\":[{\"text\":\"A\\u0000BC\",\"index\":0,\"logprobs\":null,"
                          "\"finish_reason\":null}]}");
    api_response_free(&r);

    init(&r, API_CHAT, 1, 0, 0, 0);
    ASSERT_JSON(api_response_chunk(&r, &ev),
                CHUNK_HEAD "\"choices\":[{\"index\":0,\"delta\":{\"content\":\"A\\u0000BC\"},"
                           "\"logprobs\":null,\"finish_reason\":null}]}");
    api_response_free(&r);

    init(&r, API_COMPLETIONS, 0, 0, 0, 0);
    ASSERT_OK(api_response_add(&r, &ev));
    ASSERT_OK(api_response_add(&r, &ev));
    ASSERT_JSON(api_response_body(&r, &d),
                CMPL_HEAD "\"choices\":[{\"text\":\"A\\u0000BCA\\u0000BC\",\"index\":0,"
                          "\"logprobs\":null,\"finish_reason\":\"stop\"}],\"usage\":{"
                          "\"prompt_tokens\":1,\"completion_tokens\":1,\"total_tokens\":2}}");
    api_response_free(&r);

    init(&r, API_CHAT, 0, 0, 0, 0);
    ASSERT_OK(api_response_add(&r, &ev));
    ASSERT_JSON(api_response_body(&r, &d),
                CHAT_HEAD "\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\","
                          "\"content\":\"A\\u0000BC\",\"refusal\":null},\"logprobs\":null,"
                          "\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":1,"
                          "\"completion_tokens\":1,\"total_tokens\":2}}");
    api_response_free(&r);

    /* the other control characters as cJSON escapes them */
    init(&r, API_COMPLETIONS, 1, 0, 0, 0);
    struct engine_event ctl = tokn(1, "\x01\x1f\b\f\t\r\n\"\\/\x7f", 11, 0);
    ASSERT_JSON(api_response_chunk(&r, &ctl),
                CMPL_HEAD "\"choices\":[{\"text\":\"\\u0001\\u001f\\b\\f\\t\\r\\n\\\"\\\\/\x7f\","
                          "\"index\":0,\"logprobs\":null,\"finish_reason\":null}]}");
    api_response_free(&r);
}

TEST(api_response_logprobs_keep_a_token_that_holds_a_nul)
{
    struct api_response r;
    struct engine_event ev = tokn(4, "\0", 1, -0.5f);
    ev.n_top = 3;
    ev.top_id[0] = 4;
    ev.top_logprob[0] = -0.5f;
    ev.top_id[1] = 5;
    ev.top_logprob[1] = -1.5f;
    ev.top_id[2] = 1;
    ev.top_logprob[2] = -2.0f;
    struct engine_event d = done(ENGINE_FINISH_STOP, 1, 1);

    init(&r, API_CHAT, 1, 0, 1, 2);
    ASSERT_JSON(api_response_chunk(&r, &ev),
                CHUNK_HEAD "\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\\u0000\"},"
                           "\"logprobs\":{\"content\":[{\"token\":\"\\u0000\",\"logprob\":-0.5,"
                           "\"bytes\":[0],\"top_logprobs\":[{\"token\":\"\\u0000\",\"logprob\":"
                           "-0.5,\"bytes\":[0]},{\"token\":\"a\\u0000b\",\"logprob\":-1.5,"
                           "\"bytes\":[97,0,98]}]}],\"refusal\":null},\"finish_reason\":null}]}");
    api_response_free(&r);

    init(&r, API_COMPLETIONS, 0, 0, 1, 3);
    ASSERT_OK(api_response_add(&r, &ev));
    ASSERT_JSON(api_response_body(&r, &d), CMPL_HEAD
                "\"choices\":[{\"text\":\"\\u0000\",\"index\":0,\"logprobs\":{"
                "\"tokens\":[\"\\u0000\"],\"token_logprobs\":[-0.5],\"top_logprobs\":[{"
                "\"\\u0000\":-0.5,\"a\\u0000b\":-1.5,\" Hello\":-2}],\"text_offset\":[0]},"
                "\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":1,"
                "\"completion_tokens\":1,\"total_tokens\":2}}");
    api_response_free(&r);
}

/* A token with 20 alternatives, as a chat request with top_logprobs 20 gets. */
static struct engine_event token_with_20_alternatives(void)
{
    struct engine_event ev = tok(1, " Hello", -0.123456789f);
    ev.n_top = 20;
    for (int k = 0; k < 20; k++) {
        ev.top_id[k] = 1 + k % 3;
        ev.top_logprob[k] = -0.987654321f * (float)(k + 1);
    }
    return ev;
}

TEST(api_response_bounds_a_whole_answers_logprobs_with_its_text)
{
    const size_t budget = 16384;
    static const enum api_endpoint eps[] = {API_CHAT, API_COMPLETIONS};
    for (int e = 0; e < 2; e++) {
        struct api_response r;
        struct api_request meta = {
            .endpoint = eps[e], .logprobs = 1, .top_logprobs = eps[e] == API_CHAT ? 20 : 5};
        api_response_init(&r, &meta, "smol", 1, 1, budget, &TT);
        struct engine_event ev = token_with_20_alternatives();
        int n = 0;
        while (n < 100000 && api_response_add(&r, &ev) == 0)
            n++;
        ASSERT_EQ(api_response_add(&r, &ev), -E2BIG); /* and it stays ended */
        ASSERT_EQ(r.ch[0].text_len, 6 * (size_t)n);   /* the refused token left no text */
        struct engine_event d = done(ENGINE_FINISH_LENGTH, 1, n);
        char *body = api_response_body(&r, &d);
        ASSERT(body != NULL);
        size_t len = strlen(body);
        /* the text and the logprobs' JSON fill the budget, give or take a
         * token's entry; the rest of the body is its fixed frame */
        if (len > budget + 512 || len + 2048 < budget) {
            free(body);
            FAIL_AT("endpoint %d: %d tokens, a body of %zu bytes for a budget of %zu", e, n, len,
                    budget);
        }
        /* whole entries only: one per token kept, and valid JSON */
        cJSON *o = cJSON_Parse(body);
        free(body);
        ASSERT(o != NULL);
        const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
        const cJSON *lp = cJSON_GetObjectItem(c, "logprobs");
        const cJSON *items = cJSON_GetObjectItem(lp, eps[e] == API_CHAT ? "content" : "tokens");
        int n_items = cJSON_GetArraySize(items);
        int n_offsets = cJSON_GetArraySize(cJSON_GetObjectItem(lp, "text_offset"));
        cJSON_Delete(o);
        ASSERT_EQ(n_items, n);
        if (eps[e] == API_COMPLETIONS)
            ASSERT_EQ(n_offsets, n);
        api_response_free(&r);
    }
}

TEST(api_response_streamed_logprobs_hold_nothing_between_chunks)
{
    struct api_response r;
    init(&r, API_CHAT, 1, 0, 1, 20);
    struct engine_event ev = token_with_20_alternatives();
    char *first = api_response_chunk(&r, &ev);
    ASSERT(first != NULL);
    size_t len = strlen(first);
    free(first);
    for (int i = 0; i < 10000; i++) {
        char *c = api_response_chunk(&r, &ev);
        ASSERT(c != NULL);
        size_t n = strlen(c);
        free(c);
        ASSERT_EQ(n, len); /* every chunk one token's worth */
    }
    ASSERT(r.ch[0].text == NULL && r.ch[0].text_len == 0);
    api_response_free(&r);
}

/* Pieces for api_tokens_json: id 0 "Hi", 1 " there", 2 the first byte of
 * U+1F36E (not UTF-8 alone), 3 an empty piece, 4 a quote and a backslash. */
static const char *test_piece(void *arg, int32_t id, size_t *len)
{
    static const char *const p[] = {"Hi", " there", "\xf0", "", "\"\\"};
    (void)arg;
    *len = strlen(p[id]);
    return p[id];
}

TEST(api_tokens_json_gives_ids_or_pieces_as_text_or_bytes)
{
    const int32_t ids[] = {0, 1, 2, 3, 4};
    char *plain = api_tokens_json(-1, ids, 5, NULL, NULL);
    ASSERT_STREQ(plain, "{\"tokens\":[0,1,2,3,4],\"count\":5}");
    free(plain);
    char *bos = api_tokens_json(1, ids, 1, NULL, NULL);
    ASSERT_STREQ(bos, "{\"tokens\":[1,0],\"count\":2}");
    free(bos);
    char *js = api_tokens_json(4, ids, 4, test_piece, NULL);
    ASSERT_STREQ(js, "{\"tokens\":[{\"id\":4,\"piece\":\"\\\"\\\\\"},"
                     "{\"id\":0,\"piece\":\"Hi\"},{\"id\":1,\"piece\":\" there\"},"
                     "{\"id\":2,\"piece\":[240]},{\"id\":3,\"piece\":\"\"}],\"count\":5}");
    free(js);
}

TEST(api_text_clean_leaves_valid_utf8_with_no_control_and_cuts_at_a_character)
{
    char out[64];
    api_text_clean(out, sizeof out, "a\"b\\c\r\n\t\x7f\xe2\x82\xff\xc3\xa9");
    /* each control, the cut character e2 82 and the byte ff: U+FFFD */
    ASSERT_STREQ(out, "a\"b\\c\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"
                      "\xef\xbf\xbd\xef\xbf\xbd\xc3\xa9");
    char small[5];
    api_text_clean(small, sizeof small, "ab\xc3\xa9\xc3\xa9"); /* "abé" + NUL fits, no half "é" */
    ASSERT_STREQ(small, "ab\xc3\xa9");
    api_text_clean(small, 4, "ab\xc3\xa9");
    ASSERT_STREQ(small, "ab");
}

TEST(api_health_json_escapes_the_model_id)
{
    char *js = api_health_json("ok", "we\"ird\\", 1, 2, 3, 4);
    ASSERT_STREQ(js, "{\"status\":\"ok\",\"model\":\"we\\\"ird\\\\\",\"active_sequences\":1,"
                     "\"queued\":2,\"kv_slots_free\":3,\"kv_slots_total\":4}");
    free(js);
}

TEST(api_json_string_escapes_and_replaces_what_is_not_utf8)
{
    /* a cut character (e2 82) is one U+FFFD, as Python's errors="replace"
     * reads it; so is a byte that starts none (ff) */
    const char in[] = "a\"b\\c\r\n\x01\xe2\x82\xff\xc3\xa9";
    char *js = api_json_string(in, sizeof in - 1);
    ASSERT_STREQ(js, "\"a\\\"b\\\\c\\r\\n\\u0001\xef\xbf\xbd\xef\xbf\xbd\xc3\xa9\"");
    free(js);
}

TEST_MAIN()
