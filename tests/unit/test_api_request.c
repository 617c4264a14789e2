/*
 * test_api_request.c: api/request.c and api/chat_template.c, from JSON bodies
 * to struct engine_request, without an engine: every parameter's type and
 * range, the param named in each 400, stop strings, logprobs shapes, unknown
 * fields, session ids, kv_policy, and chat rendering per template format.
 */
#include "api.h"
#include "internal.h"
#include "options.h" /* engine__sampler_params: what the engine gives the sampler */
#include "sampler.h"
#include "test.h"

static const char *SMOL_TEMPLATE =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
    "'<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|im_start|>assistant\n' }}{% endif %}";

static struct engine_model_info model_info(void)
{
    struct engine_model_info mi;
    memset(&mi, 0, sizeof mi);
    snprintf(mi.name, sizeof mi.name, "test");
    mi.n_vocab = 100;
    mi.n_ctx_train = 8192;
    mi.max_seqs = 8;
    mi.chat_template = SMOL_TEMPLATE;
    return mi;
}

struct parsed {
    struct engine_request req;
    struct api_request meta;
    struct api_error err;
    int rc;
};

/* The context the server passes, without model names or a value limit. */
static struct api_parse_ctx base_ctx(const char *session_header)
{
    static struct engine_model_info mi;
    static struct api_chat_template chat;
    mi = model_info();
    api_chat_template_init(&chat, mi.chat_template);
    return (struct api_parse_ctx){.model = &mi,
                                  .chat = &chat,
                                  .session_header = session_header,
                                  .id = 42,
                                  .default_seed = 7,
                                  .max_stop_len = 256};
}

/* Parses len bytes of json (which may hold NULs, and need not end in one). */
static struct parsed parse_c(const struct api_parse_ctx *ctx, enum api_endpoint ep,
                             const char *json, size_t len)
{
    struct parsed p;
    p.rc = api_request_parse(ctx, ep, json, len, &p.req, &p.meta, &p.err);
    return p;
}

static struct parsed parse_h(enum api_endpoint ep, const char *json, const char *session_header)
{
    struct api_parse_ctx ctx = base_ctx(session_header);
    return parse_c(&ctx, ep, json, strlen(json));
}

static struct parsed parse(enum api_endpoint ep, const char *json)
{
    return parse_h(ep, json, NULL);
}

/* Expects a 400 naming param (NULL: a JSON null param). */
#define ASSERT_BAD(ep, json, param_)                                                               \
    do {                                                                                           \
        struct parsed p_ = parse(ep, json);                                                        \
        if (p_.rc == 0)                                                                            \
            engine_request_free(&p_.req);                                                          \
        ASSERT(p_.rc < 0);                                                                         \
        ASSERT_EQ(p_.err.status, 400);                                                             \
        ASSERT_STREQ(p_.err.param, (param_) ? (param_) : "");                                      \
        ASSERT_STREQ(p_.err.type, "invalid_request_error");                                        \
        ASSERT(p_.req.prompt == NULL && p_.req.stop[0] == NULL);                                   \
    } while (0)

/* Expects the parse result p to be a rejection with this status, param ("":
 * JSON null) and code, leaving nothing to free. */
#define ASSERT_REJECTED(p, status_, param_, code_)                                                 \
    do {                                                                                           \
        struct parsed q_ = (p);                                                                    \
        if (q_.rc == 0)                                                                            \
            engine_request_free(&q_.req);                                                          \
        ASSERT(q_.rc < 0);                                                                         \
        ASSERT_EQ(q_.err.status, status_);                                                         \
        ASSERT_STREQ(q_.err.param, param_);                                                        \
        ASSERT_STREQ(q_.err.code, code_);                                                          \
        ASSERT(q_.req.prompt == NULL && q_.req.stop[0] == NULL);                                   \
    } while (0)

/* Expects the parse result p to succeed, and frees it. */
#define ASSERT_ACCEPTED(p)                                                                         \
    do {                                                                                           \
        struct parsed q_ = (p);                                                                    \
        if (q_.rc < 0)                                                                             \
            FAIL_AT("rejected: %d param '%s': %s", q_.err.status, q_.err.param, q_.err.message);   \
        engine_request_free(&q_.req);                                                              \
    } while (0)

TEST(api_request_parses_a_minimal_completion_with_openai_defaults)
{
    struct parsed p = parse(API_COMPLETIONS, "{\"model\":\"x\",\"prompt\":\"Hello\"}");
    ASSERT_OK(p.rc);
    ASSERT_EQ(p.req.id, 42);
    ASSERT_STREQ(p.req.prompt, "Hello");
    ASSERT_EQ(p.req.prompt_len, 5);
    ASSERT_EQ(p.req.max_tokens, -1); /* absent: until EOS or the client leaves */
    ASSERT_NEAR(p.req.sampling.temperature, 1.0, 0);
    ASSERT_NEAR(p.req.sampling.top_p, 1.0, 0);
    ASSERT_EQ(p.req.sampling.seed, 7); /* the server's fresh seed */
    ASSERT_EQ(p.req.add_bos, 1);
    ASSERT_EQ(p.req.parse_special, 1);
    ASSERT_EQ(p.meta.stream, 0);
    ASSERT_EQ(p.meta.logprobs, 0);
    ASSERT(p.req.stop[0] == NULL);
    ASSERT_STREQ(p.req.session_id, "");
    ASSERT_EQ(p.req.has_policy, 0);
    engine_request_free(&p.req);
}

TEST(api_request_parses_every_sampling_parameter)
{
    struct parsed p = parse(API_COMPLETIONS,
                            "{\"prompt\":\"x\",\"max_tokens\":17,\"temperature\":0.5,\"top_p\":0.9,"
                            "\"top_k\":40,\"min_p\":0.05,\"seed\":-3,\"presence_penalty\":1.5,"
                            "\"frequency_penalty\":-0.5,\"user\":\"u\",\"n\":1,\"stream\":true}");
    ASSERT_OK(p.rc);
    ASSERT_EQ(p.req.max_tokens, 17);
    ASSERT_NEAR(p.req.sampling.temperature, 0.5, 1e-6);
    ASSERT_NEAR(p.req.sampling.top_p, 0.9, 1e-6);
    ASSERT_EQ(p.req.sampling.top_k, 40);
    ASSERT_NEAR(p.req.sampling.min_p, 0.05, 1e-6);
    ASSERT(p.req.sampling.seed == (uint64_t)(int64_t)-3);
    ASSERT_NEAR(p.req.sampling.presence_penalty, 1.5, 1e-6);
    ASSERT_NEAR(p.req.sampling.frequency_penalty, -0.5, 1e-6);
    ASSERT_EQ(p.meta.stream, 1);
    engine_request_free(&p.req);
}

TEST(api_request_top_p_zero_means_greedy)
{
    struct parsed p = parse(API_COMPLETIONS, "{\"prompt\":\"x\",\"top_p\":0}");
    ASSERT_OK(p.rc);
    ASSERT_NEAR(p.req.sampling.temperature, 0, 0);
    engine_request_free(&p.req);
}

TEST(api_request_null_means_absent)
{
    struct parsed p =
        parse(API_COMPLETIONS, "{\"prompt\":\"x\",\"max_tokens\":null,\"temperature\":"
                               "null,\"stop\":null,\"logprobs\":null,\"n\":null}");
    ASSERT_OK(p.rc);
    ASSERT_EQ(p.req.max_tokens, -1);
    ASSERT_NEAR(p.req.sampling.temperature, 1, 0);
    engine_request_free(&p.req);
}

TEST(api_request_names_the_param_with_a_wrong_type)
{
    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":\"x\",\"temperature\":\"hot\"}", "temperature");
    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":\"x\",\"max_tokens\":\"5\"}", "max_tokens");
    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":\"x\",\"max_tokens\":2.5}", "max_tokens");
    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":\"x\",\"top_p\":true}", "top_p");
    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":\"x\",\"top_k\":1.5}", "top_k");
    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":\"x\",\"seed\":\"1\"}", "seed");
    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":\"x\",\"stream\":1}", "stream");
    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":\"x\",\"model\":3}", "model");
    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":\"x\",\"user\":{}}", "user");
    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":\"x\",\"stop\":5}", "stop");
    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":\"x\",\"stop\":[\"a\",1]}", "stop");
    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":\"x\",\"session_id\":12}", "session_id");
    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":\"x\",\"kv_policy\":4}", "kv_policy");
    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":5}", "prompt");
    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":\"x\",\"stream\":true,\"stream_options\":[]}",
               "stream_options");
    ASSERT_BAD(API_COMPLETIONS,
               "{\"prompt\":\"x\",\"stream\":true,\"stream_options\":{\"include_usage\":1}}",
               "stream_options.include_usage");
}

/* top_k -1 is vLLM's "all tokens", and clients written for vLLM send it:
 * it is top_k 0 (off) here, not a 400. */
TEST(api_request_takes_top_k_minus_one_as_off)
{
    const char *bodies[] = {"{\"prompt\":\"x\",\"top_k\":-1}", "{\"prompt\":\"x\",\"top_k\":0}"};
    for (int k = 0; k < 2; k++) {
        struct parsed p = parse(API_COMPLETIONS, bodies[k]);
        ASSERT_OK(p.rc);
        ASSERT_EQ(p.req.sampling.top_k, 0);
        engine_request_free(&p.req);
    }
    struct parsed p =
        parse(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_k\":-1}");
    ASSERT_OK(p.rc);
    ASSERT_EQ(p.req.sampling.top_k, 0);
    engine_request_free(&p.req);
}

TEST(api_request_names_the_param_out_of_range)
{
    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":\"x\",\"temperature\":2.5}", "temperature");
    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":\"x\",\"temperature\":-0.1}", "temperature");
    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":\"x\",\"top_p\":1.1}", "top_p");
    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":\"x\",\"min_p\":2}", "min_p");
    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":\"x\",\"top_k\":-2}", "top_k");
    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":\"x\",\"max_tokens\":0}", "max_tokens");
    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":\"x\",\"presence_penalty\":3}", "presence_penalty");
    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":\"x\",\"frequency_penalty\":-2.5}",
               "frequency_penalty");
    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":\"x\",\"logprobs\":6}", "logprobs");
    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":[1,2,100]}", "prompt"); /* n_vocab is 100 */
    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":[1,-2]}", "prompt");
    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":[]}", "prompt");
    /* the bad item is named by its index, with its value: "token 1" read as
     * the id 1 */
    struct parsed p = parse(API_COMPLETIONS, "{\"prompt\":[5,1,100]}");
    ASSERT(p.rc < 0);
    ASSERT_STREQ(p.err.message,
                 "Invalid value for 'prompt': the token at index 2 is 100, not an id in [0, 100).");
    ASSERT_REJECTED(parse(API_COMPLETIONS, "{\"prompt\":[5,\"1\"]}"), 400, "prompt",
                    "invalid_type");
}

/* n: 1 to 128 choices, at most --max-seqs (8 here), never on a session */
TEST(api_request_n_is_the_number_of_choices)
{
    struct parsed p = parse(API_COMPLETIONS, "{\"prompt\":\"x\"}");
    ASSERT_OK(p.rc);
    ASSERT_EQ(p.req.n_choices, 1);
    ASSERT_EQ(p.meta.n, 1);
    engine_request_free(&p.req);
    p = parse(API_COMPLETIONS, "{\"prompt\":\"x\",\"n\":3}");
    ASSERT_OK(p.rc);
    ASSERT_EQ(p.req.n_choices, 3);
    ASSERT_EQ(p.meta.n, 3);
    engine_request_free(&p.req);
    p = parse(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"n\":8}");
    ASSERT_OK(p.rc);
    ASSERT_EQ(p.req.n_choices, 8);
    engine_request_free(&p.req);
    ASSERT_BAD(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"n\":0}", "n");
    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":\"x\",\"n\":-1}", "n");
    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":\"x\",\"n\":9}", "n");   /* past --max-seqs */
    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":\"x\",\"n\":129}", "n"); /* past OpenAI's 128 */
    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":\"x\",\"n\":1.5}", "n");
    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":\"x\",\"n\":2,\"session_id\":\"s1\"}", "n");
    p = parse(API_COMPLETIONS, "{\"prompt\":\"x\",\"n\":1,\"session_id\":\"s1\"}");
    ASSERT_OK(p.rc);
    engine_request_free(&p.req);
}

/* echo: completions only, never on a session; max_tokens 0 only with it */
TEST(api_request_echo_is_for_completions_without_a_session)
{
    struct parsed p = parse(API_COMPLETIONS, "{\"prompt\":\"x\",\"echo\":true}");
    ASSERT_OK(p.rc);
    ASSERT_EQ(p.req.echo, 1);
    ASSERT_EQ(p.req.max_tokens, -1);
    engine_request_free(&p.req);
    p = parse(API_COMPLETIONS, "{\"prompt\":\"x\",\"max_tokens\":0,\"echo\":true,\"logprobs\":2}");
    ASSERT_OK(p.rc);
    ASSERT_EQ(p.req.echo, 1);
    ASSERT_EQ(p.req.max_tokens, 0);
    ASSERT_EQ(p.req.top_logprobs, 2);
    engine_request_free(&p.req);
    p = parse(API_COMPLETIONS, "{\"prompt\":\"x\"}");
    ASSERT_OK(p.rc);
    ASSERT_EQ(p.req.echo, 0);
    engine_request_free(&p.req);
    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":\"x\",\"max_tokens\":0}", "max_tokens");
    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":\"x\",\"max_tokens\":0,\"echo\":false}", "max_tokens");
    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":\"x\",\"echo\":true,\"session_id\":\"s1\"}", "echo");
    ASSERT_BAD(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"echo\":true}",
               "echo");
    ASSERT_BAD(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":0}",
               "max_tokens");
}

TEST(api_request_refuses_features_it_does_not_implement)
{
    ASSERT_BAD(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"best_of\":2}",
               "best_of");
    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":\"x\",\"suffix\":\"end\"}", "suffix");
    ASSERT_BAD(API_CHAT,
               "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tools\":[{\"type\":"
               "\"function\"}]}",
               "tools");
    ASSERT_BAD(API_CHAT,
               "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"response_format\":{"
               "\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\",\"schema\":{}}}}",
               "response_format");
    ASSERT_BAD(API_CHAT,
               "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"response_format\":{"
               "\"type\":\"yaml\"}}",
               "response_format");
    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":\"x\",\"response_format\":\"json_object\"}",
               "response_format");
    struct parsed p = parse(API_COMPLETIONS, "{\"prompt\":\"x\",\"echo\":false,\"best_of\":1,"
                                             "\"logit_bias\":{},\"suffix\":null}");
    ASSERT_OK(p.rc);
    engine_request_free(&p.req);
}

/* best_of (completions): best_of candidates run, scored, n answered; n to
 * 20, within --max-seqs, not streamed, not on a session */
TEST(api_request_best_of_runs_the_candidates_and_answers_n)
{
    struct parsed p = parse(API_COMPLETIONS, "{\"prompt\":\"x\",\"best_of\":5,\"n\":2}");
    ASSERT_OK(p.rc);
    ASSERT_EQ(p.req.n_choices, 5);
    ASSERT_EQ(p.req.score, 1);
    ASSERT_EQ(p.meta.n, 5);
    ASSERT_EQ(p.meta.n_return, 2);
    engine_request_free(&p.req);
    p = parse(API_COMPLETIONS, "{\"prompt\":\"x\",\"best_of\":3}");
    ASSERT_OK(p.rc);
    ASSERT_EQ(p.req.n_choices, 3);
    ASSERT_EQ(p.meta.n_return, 1);
    engine_request_free(&p.req);
    /* best_of equal to n: nothing to judge, so a stream may have it */
    p = parse(API_COMPLETIONS, "{\"prompt\":\"x\",\"best_of\":2,\"n\":2,\"stream\":true}");
    ASSERT_OK(p.rc);
    ASSERT_EQ(p.req.score, 0);
    ASSERT_EQ(p.meta.n_return, 0);
    engine_request_free(&p.req);
    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":\"x\",\"best_of\":2,\"n\":3}", "best_of");
    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":\"x\",\"best_of\":0}", "best_of");
    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":\"x\",\"best_of\":21}", "best_of");
    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":\"x\",\"best_of\":9}", "best_of"); /* 8 slots */
    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":\"x\",\"best_of\":2,\"stream\":true}", "best_of");
    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":\"x\",\"best_of\":2,\"session_id\":\"s1\"}",
               "best_of");
    /* with a list of prompts, best_of candidates of each */
    p = parse(API_COMPLETIONS, "{\"prompt\":[\"x\",\"y\"],\"best_of\":4}");
    ASSERT_OK(p.rc);
    ASSERT_EQ(p.req.n_choices, 4);
    ASSERT_EQ(p.req.n_prompts, 2);
    engine_request_free(&p.req);
    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":[\"x\",\"y\",\"z\"],\"best_of\":3}", "prompt");
}

/* cache_prompt (llama-server's): true by default; false asks for a whole
 * prefill */
TEST(api_request_cache_prompt_false_prefills_the_whole_prompt)
{
    struct parsed p = parse(API_COMPLETIONS, "{\"prompt\":\"x\"}");
    ASSERT_OK(p.rc);
    ASSERT_EQ(p.req.no_prefix, 0);
    engine_request_free(&p.req);
    p = parse(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                        "\"cache_prompt\":false}");
    ASSERT_OK(p.rc);
    ASSERT_EQ(p.req.no_prefix, 1);
    engine_request_free(&p.req);
    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":\"x\",\"cache_prompt\":0}", "cache_prompt");
}

/* response_format json_object (both endpoints) asks the engine for a JSON
 * object; text, absent or null does not */
TEST(api_request_response_format_json_object_reaches_the_engine)
{
    static const struct {
        enum api_endpoint ep;
        const char *body;
        int json;
    } cases[] = {
        {API_CHAT,
         "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"response_format\":{\"type\":"
         "\"json_object\"}}",
         1},
        {API_COMPLETIONS, "{\"prompt\":\"x\",\"response_format\":{\"type\":\"json_object\"}}", 1},
        {API_COMPLETIONS, "{\"prompt\":\"x\",\"response_format\":{\"type\":\"text\"}}", 0},
        {API_COMPLETIONS, "{\"prompt\":\"x\",\"response_format\":null}", 0},
        {API_COMPLETIONS, "{\"prompt\":\"x\"}", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        struct parsed p = parse(cases[i].ep, cases[i].body);
        ASSERT_OK(p.rc);
        ASSERT_EQ(p.req.json_object, cases[i].json);
        engine_request_free(&p.req);
    }
    /* the answer ends at its object's close: nothing can hold it open */
    ASSERT_BAD(API_COMPLETIONS,
               "{\"prompt\":\"x\",\"max_tokens\":9,\"ignore_eos\":true,\"response_format\":{"
               "\"type\":\"json_object\"}}",
               "ignore_eos");
    ASSERT_BAD(API_COMPLETIONS,
               "{\"prompt\":\"x\",\"min_tokens\":2,\"response_format\":{\"type\":\"json_object\"}}",
               "min_tokens");
    struct parsed p = parse(API_COMPLETIONS, "{\"prompt\":\"x\",\"response_format\":{\"type\":5}}");
    ASSERT(p.rc < 0 && strstr(p.err.message, "number"));
}

/* logit_bias as OpenAI sends it: ids as decimal strings, biases in
 * [-100, 100]; the engine gets them sorted by id. n_vocab is 100 here. */
TEST(api_request_logit_bias_is_parsed_sorted_and_bounded)
{
    struct parsed p = parse(API_COMPLETIONS, "{\"prompt\":\"x\",\"logit_bias\":{\"99\":-100,"
                                             "\"0\":100,\"7\":2.5,\"007\":1e-3}}");
    ASSERT(p.rc < 0); /* "7" and "007" are one token */
    ASSERT_EQ(p.err.status, 400);
    ASSERT(strstr(p.err.message, "token 7 is given twice") != NULL);
    p = parse(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                        "\"logit_bias\":{\"99\":-100,\"0\":100,\"7\":2.5}}");
    ASSERT_OK(p.rc);
    ASSERT_EQ(p.req.n_bias, 3);
    ASSERT_EQ(p.req.bias_id[0], 0);
    ASSERT_EQ(p.req.bias_id[1], 7);
    ASSERT_EQ(p.req.bias_id[2], 99);
    ASSERT(p.req.bias[0] == 100.0f && p.req.bias[1] == 2.5f && p.req.bias[2] == -100.0f);
    engine_request_free(&p.req);
    p = parse(API_COMPLETIONS, "{\"prompt\":\"x\",\"logit_bias\":null}");
    ASSERT_OK(p.rc);
    ASSERT_EQ(p.req.n_bias, 0);
    engine_request_free(&p.req);

    const char *bad[] = {
        "{\"prompt\":\"x\",\"logit_bias\":{\"100\":1}}",         /* past the vocabulary */
        "{\"prompt\":\"x\",\"logit_bias\":{\"-1\":1}}",          /* not an id */
        "{\"prompt\":\"x\",\"logit_bias\":{\"1.0\":1}}",         /* not an id */
        "{\"prompt\":\"x\",\"logit_bias\":{\"\":1}}",            /* not an id */
        "{\"prompt\":\"x\",\"logit_bias\":{\" 5\":1}}",          /* not an id */
        "{\"prompt\":\"x\",\"logit_bias\":{\"99999999999\":1}}", /* 11 digits */
        "{\"prompt\":\"x\",\"logit_bias\":{\"5\":100.5}}",       /* out of range */
        "{\"prompt\":\"x\",\"logit_bias\":{\"5\":-101}}",        /* out of range */
        "{\"prompt\":\"x\",\"logit_bias\":{\"5\":1e999}}",       /* not finite */
        "{\"prompt\":\"x\",\"logit_bias\":{\"5\":\"1\"}}",       /* not a number */
        "{\"prompt\":\"x\",\"logit_bias\":{\"5\":null}}",        /* not a number */
        "{\"prompt\":\"x\",\"logit_bias\":[5]}",                 /* not an object */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        ASSERT_BAD(API_COMPLETIONS, bad[i], "logit_bias");

    /* at most ENGINE_MAX_LOGIT_BIAS ids (their range aside: n_vocab is 100) */
    char *big = malloc(64 + (size_t)(ENGINE_MAX_LOGIT_BIAS + 1) * 8);
    ASSERT(big != NULL);
    size_t at = (size_t)sprintf(big, "{\"prompt\":\"x\",\"logit_bias\":{");
    for (int i = 0; i <= ENGINE_MAX_LOGIT_BIAS; i++)
        at += (size_t)sprintf(big + at, "%s\"%d\":1", i ? "," : "", i);
    sprintf(big + at, "}}");
    p = parse(API_COMPLETIONS, big);
    ASSERT(p.rc < 0);
    ASSERT(strstr(p.err.message, "at most 1024") != NULL);
    free(big);
}

TEST(api_request_rejects_bodies_that_are_not_json_objects)
{
    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":", NULL);
    ASSERT_BAD(API_COMPLETIONS, "[1,2]", NULL);
    ASSERT_BAD(API_COMPLETIONS, "", NULL);
    ASSERT_BAD(API_COMPLETIONS, "{}", "prompt");
    ASSERT_BAD(API_CHAT, "{}", "messages");
}

TEST(api_request_ignores_unknown_fields)
{
    struct parsed p = parse(API_COMPLETIONS, "{\"prompt\":\"x\",\"frobnicate\":[1,{\"a\":2}],"
                                             "\"metadata\":{\"k\":\"v\"},\"store\":true}");
    ASSERT_OK(p.rc);
    engine_request_free(&p.req);
}

TEST(api_request_takes_a_stop_string_or_an_array_of_up_to_four)
{
    struct parsed p = parse(API_COMPLETIONS, "{\"prompt\":\"x\",\"stop\":\"\\n\\n\"}");
    ASSERT_OK(p.rc);
    ASSERT_STREQ(p.req.stop[0], "\n\n");
    ASSERT(p.req.stop[1] == NULL);
    engine_request_free(&p.req);

    p = parse(API_COMPLETIONS, "{\"prompt\":\"x\",\"stop\":[\"a\",\"\",\"bc\",\"d\"]}");
    ASSERT_OK(p.rc);
    ASSERT_STREQ(p.req.stop[0], "a");
    ASSERT_STREQ(p.req.stop[1], "bc"); /* empty strings are dropped */
    ASSERT_STREQ(p.req.stop[2], "d");
    ASSERT(p.req.stop[3] == NULL);
    engine_request_free(&p.req);

    p = parse(API_COMPLETIONS, "{\"prompt\":\"x\",\"stop\":[\"a\",\"b\",\"c\",\"d\"]}");
    ASSERT_OK(p.rc);
    ASSERT_STREQ(p.req.stop[3], "d");
    engine_request_free(&p.req);

    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":\"x\",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}",
               "stop");
}

TEST(api_request_takes_token_id_prompts)
{
    struct parsed p = parse(API_COMPLETIONS, "{\"prompt\":[1,2,99]}");
    ASSERT_OK(p.rc);
    ASSERT(p.req.prompt == NULL);
    ASSERT_EQ(p.req.n_prompt_ids, 3);
    ASSERT_EQ(p.req.prompt_ids[2], 99);
    ASSERT_EQ(p.req.add_bos, 0); /* ids are the prompt as sent: no BOS added */
    engine_request_free(&p.req);

    p = parse(API_COMPLETIONS, "{\"prompt\":[[5,6]]}");
    ASSERT_OK(p.rc);
    ASSERT_EQ(p.req.n_prompt_ids, 2);
    engine_request_free(&p.req);

    p = parse(API_COMPLETIONS, "{\"prompt\":[\"one\"]}");
    ASSERT_OK(p.rc);
    ASSERT_STREQ(p.req.prompt, "one");
    engine_request_free(&p.req);
}

/* A list of prompts: all strings or all arrays of ids, n choices each, all
 * run at once; item p names itself ("prompt[p]") when it is bad. */
TEST(api_request_takes_a_list_of_prompts)
{
    struct parsed p = parse(API_COMPLETIONS, "{\"prompt\":[\"one\",\"two\",\"\"],\"n\":2}");
    ASSERT_OK(p.rc);
    ASSERT_STREQ(p.req.prompt, "one");
    ASSERT_EQ(p.req.n_prompts, 3);
    ASSERT_EQ(p.meta.n_prompts, 3);
    ASSERT_EQ(p.meta.n, 2);
    ASSERT_STREQ(p.req.more[0].text, "two");
    ASSERT_EQ(p.req.more[0].text_len, 3);
    ASSERT_STREQ(p.req.more[1].text, "");
    ASSERT_EQ(p.req.add_bos, 1);
    engine_request_free(&p.req);

    p = parse(API_COMPLETIONS, "{\"prompt\":[[5,6],[7],[8,9,10]]}");
    ASSERT_OK(p.rc);
    ASSERT_EQ(p.req.n_prompts, 3);
    ASSERT_EQ(p.req.n_prompt_ids, 2);
    ASSERT_EQ(p.req.more[0].n_ids, 1);
    ASSERT_EQ(p.req.more[0].ids[0], 7);
    ASSERT_EQ(p.req.more[1].n_ids, 3);
    ASSERT_EQ(p.req.more[1].ids[2], 10);
    ASSERT(p.req.more[1].text == NULL);
    ASSERT_EQ(p.req.add_bos, 0);
    engine_request_free(&p.req);

    /* mixed, empty, bad ids: the item at fault is named */
    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":[\"one\",[5]]}", "prompt[1]");
    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":[[5],\"one\"]}", "prompt[1]");
    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":[[5],[6],[]]}", "prompt[2]");
    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":[[5],[6,-1]]}", "prompt[1]");
    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":[\"a\",null]}", "prompt[1]");
    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":[null,\"a\"]}", "prompt[0]");
    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":[null]}", "prompt");
    /* not on a session; not more sequences than the server runs */
    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":[\"a\",\"b\"],\"session_id\":\"s1\"}", "prompt");
    /* (the context's model runs 8 sequences) */
    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":[\"a\",\"b\",\"c\"],\"n\":3}", "prompt");
    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":[[1],[1],[1],[1],[1],[1],[1],[1],[1]]}", "prompt");
    p = parse(API_COMPLETIONS, "{\"prompt\":[\"a\",\"b\",\"c\",\"d\"],\"n\":2}");
    ASSERT_OK(p.rc);
    engine_request_free(&p.req);
    p = parse(API_COMPLETIONS, "{\"prompt\":[[1],[1],[1],[1],[1],[1],[1],[1]]}");
    ASSERT_OK(p.rc);
    ASSERT_EQ(p.req.n_prompts, 8);
    engine_request_free(&p.req);
}

TEST(api_request_completions_logprobs_is_the_number_of_alternatives)
{
    struct parsed p = parse(API_COMPLETIONS, "{\"prompt\":\"x\",\"logprobs\":3}");
    ASSERT_OK(p.rc);
    ASSERT_EQ(p.meta.logprobs, 1);
    ASSERT_EQ(p.meta.top_logprobs, 3);
    ASSERT_EQ(p.req.logprobs, 1);
    ASSERT_EQ(p.req.top_logprobs, 3);
    engine_request_free(&p.req);
    p = parse(API_COMPLETIONS, "{\"prompt\":\"x\",\"logprobs\":0}");
    ASSERT_OK(p.rc);
    ASSERT_EQ(p.meta.logprobs, 1);
    ASSERT_EQ(p.req.top_logprobs, 0);
    engine_request_free(&p.req);
    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":\"x\",\"logprobs\":true}", "logprobs");
}

TEST(api_request_chat_logprobs_is_a_boolean_with_top_logprobs)
{
    struct parsed p = parse(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                                      "\"logprobs\":true,\"top_logprobs\":20}");
    ASSERT_OK(p.rc);
    ASSERT_EQ(p.req.logprobs, 1);
    ASSERT_EQ(p.req.top_logprobs, 20);
    engine_request_free(&p.req);
    ASSERT_BAD(API_CHAT,
               "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"top_logprobs\":2}",
               "top_logprobs");
    ASSERT_BAD(API_CHAT,
               "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"logprobs\":true,"
               "\"top_logprobs\":21}",
               "top_logprobs");
    ASSERT_BAD(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"logprobs\":2}",
               "logprobs");
}

TEST(api_request_stream_options_need_stream)
{
    struct parsed p = parse(API_COMPLETIONS, "{\"prompt\":\"x\",\"stream\":true,"
                                             "\"stream_options\":{\"include_usage\":true}}");
    ASSERT_OK(p.rc);
    ASSERT_EQ(p.meta.include_usage, 1);
    engine_request_free(&p.req);
    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":\"x\",\"stream_options\":{\"include_usage\":true}}",
               "stream_options");
}

TEST(api_request_session_id_comes_from_the_body_or_the_header_and_they_must_agree)
{
    struct parsed p =
        parse_h(API_COMPLETIONS, "{\"prompt\":\"x\",\"session_id\":\"same\"}", "same");
    ASSERT_OK(p.rc);
    ASSERT_STREQ(p.req.session_id, "same");
    engine_request_free(&p.req);
    /* a proxy routes on the header, so a different body value is refused */
    p = parse_h(API_COMPLETIONS, "{\"prompt\":\"x\",\"session_id\":\"body-1\"}", "header-1");
    ASSERT(p.rc < 0);
    ASSERT_EQ(p.err.status, 400);
    ASSERT_STREQ(p.err.param, "session_id");
    p = parse_h(API_COMPLETIONS, "{\"prompt\":\"x\",\"session_id\":\"body-1\"}", NULL);
    ASSERT_OK(p.rc);
    ASSERT_STREQ(p.req.session_id, "body-1");
    engine_request_free(&p.req);
    p = parse_h(API_COMPLETIONS, "{\"prompt\":\"x\"}", "header-1");
    ASSERT_OK(p.rc);
    ASSERT_STREQ(p.req.session_id, "header-1");
    engine_request_free(&p.req);
    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":\"x\",\"session_id\":\"\"}", "session_id");
    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":\"x\",\"session_id\":\"has space\"}", "session_id");
    char big[400];
    snprintf(big, sizeof big, "{\"prompt\":\"x\",\"session_id\":\"%0200d\"}", 1);
    ASSERT_BAD(API_COMPLETIONS, big, "session_id");
    p = parse_h(API_COMPLETIONS, "{\"prompt\":\"x\"}", "bad header");
    ASSERT(p.rc < 0);
    ASSERT_STREQ(p.err.param, "X-Session-Id");
}

TEST(api_request_session_ids_are_safe_file_names_and_session_create_is_a_boolean)
{
    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":\"x\",\"session_id\":\"../up\"}", "session_id");
    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":\"x\",\"session_id\":\"a/b\"}", "session_id");
    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":\"x\",\"session_id\":\"a.snap\"}", "session_id");
    struct parsed p = parse_h(API_COMPLETIONS, "{\"prompt\":\"x\"}", "..");
    ASSERT(p.rc < 0);
    ASSERT_STREQ(p.err.param, "X-Session-Id");
    p = parse(API_COMPLETIONS, "{\"prompt\":\"x\",\"session_id\":\"Ok_1-2\"}");
    ASSERT_OK(p.rc);
    ASSERT_EQ(p.req.session_must_exist, 0); /* a gone session is started, and says so */
    engine_request_free(&p.req);
    p = parse(API_COMPLETIONS, "{\"prompt\":\"x\",\"session_id\":\"s\",\"session_create\":false}");
    ASSERT_OK(p.rc);
    ASSERT_EQ(p.req.session_must_exist, 1);
    engine_request_free(&p.req);
    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":\"x\",\"session_create\":\"no\"}", "session_create");
}

TEST(api_request_parses_kv_policy)
{
    struct parsed p = parse(API_COMPLETIONS, "{\"prompt\":\"x\",\"kv_policy\":\"sinks:8\"}");
    ASSERT_OK(p.rc);
    ASSERT_EQ(p.req.has_policy, 1);
    ASSERT_EQ(p.req.policy.kind, ENGINE_POLICY_SINKS);
    ASSERT_EQ(p.req.policy.n_sinks, 8);
    engine_request_free(&p.req);
    p = parse(API_COMPLETIONS, "{\"prompt\":\"x\",\"kv_policy\":\"window\"}");
    ASSERT_OK(p.rc);
    ASSERT_EQ(p.req.policy.kind, ENGINE_POLICY_WINDOW);
    engine_request_free(&p.req);
    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":\"x\",\"kv_policy\":\"sideways\"}", "kv_policy");
}

TEST(api_request_chat_renders_chatml_with_the_templates_default_system_prompt)
{
    struct parsed p = parse(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}");
    ASSERT_OK(p.rc);
    ASSERT_STREQ(p.req.prompt, "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, "
                               "trained by Hugging Face<|im_end|>\n"
                               "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    engine_request_free(&p.req);

    p = parse(API_CHAT, "{\"messages\":[{\"role\":\"developer\",\"content\":\"Be brief.\"},"
                        "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"A\"},"
                        "{\"type\":\"text\",\"text\":\"B\"}]},"
                        "{\"role\":\"assistant\",\"content\":null}]}");
    ASSERT_OK(p.rc);
    ASSERT_STREQ(p.req.prompt, "<|im_start|>system\nBe brief.<|im_end|>\n"
                               "<|im_start|>user\nAB<|im_end|>\n"
                               "<|im_start|>assistant\n<|im_end|>\n<|im_start|>assistant\n");
    engine_request_free(&p.req);
}

TEST(api_request_chat_with_a_session_renders_only_the_given_turns)
{
    struct parsed p = parse(API_CHAT, "{\"session_id\":\"s1\",\"messages\":[{\"role\":\"user\","
                                      "\"content\":\"More\"}]}");
    ASSERT_OK(p.rc);
    ASSERT_STREQ(p.req.prompt, "<|im_start|>user\nMore<|im_end|>\n<|im_start|>assistant\n");
    /* what goes before the turns, by what the session turns out to be: the
     * default system turn if it is new, the end of the last assistant turn
     * if it continues */
    ASSERT_STREQ(p.req.open, "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, "
                             "trained by Hugging Face<|im_end|>\n");
    ASSERT_STREQ(p.req.close, "<|im_end|>\n");
    engine_request_free(&p.req);

    /* a conversation that opens with its own system turn gets no default one */
    p = parse(API_CHAT, "{\"session_id\":\"s1\",\"messages\":[{\"role\":\"system\","
                        "\"content\":\"Be brief.\"},{\"role\":\"user\",\"content\":\"Hi\"}]}");
    ASSERT_OK(p.rc);
    ASSERT(p.req.open == NULL);
    ASSERT_STREQ(p.req.close, "<|im_end|>\n");
    engine_request_free(&p.req);

    /* without a session the template renders everything itself */
    p = parse(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}");
    ASSERT_OK(p.rc);
    ASSERT(p.req.open == NULL && p.req.close == NULL);
    engine_request_free(&p.req);
}

TEST(api_request_chat_names_the_bad_message)
{
    ASSERT_BAD(API_CHAT, "{\"messages\":[]}", "messages");
    ASSERT_BAD(API_CHAT, "{\"messages\":{}}", "messages");
    ASSERT_BAD(API_CHAT,
               "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"wizard\","
               "\"content\":\"b\"}]}",
               "messages[1].role");
    ASSERT_BAD(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":5}]}",
               "messages[0].content");
    ASSERT_BAD(API_CHAT,
               "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}",
               "messages[0].content");
    ASSERT_BAD(API_CHAT, "{\"messages\":[\"hi\"]}", "messages[0]");
}

TEST(api_request_chat_max_completion_tokens_wins_over_max_tokens)
{
    struct parsed p = parse(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                                      "\"max_tokens\":5,\"max_completion_tokens\":9}");
    ASSERT_OK(p.rc);
    ASSERT_EQ(p.req.max_tokens, 9);
    engine_request_free(&p.req);
}

TEST(api_request_min_tokens_is_a_count_up_to_max_tokens)
{
    struct parsed p = parse(API_COMPLETIONS, "{\"prompt\":\"x\"}");
    ASSERT_OK(p.rc);
    ASSERT_EQ(p.req.min_tokens, 0);
    engine_request_free(&p.req);
    p = parse(API_COMPLETIONS, "{\"prompt\":\"x\",\"min_tokens\":7,\"max_tokens\":7}");
    ASSERT_OK(p.rc);
    ASSERT_EQ(p.req.min_tokens, 7);
    engine_request_free(&p.req);
    p = parse(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                        "\"min_tokens\":12,\"max_tokens\":null}");
    ASSERT_OK(p.rc);
    ASSERT_EQ(p.req.min_tokens, 12); /* no end given: the answer just may not end before 12 */
    engine_request_free(&p.req);
    p = parse(API_COMPLETIONS, "{\"prompt\":\"x\",\"min_tokens\":null}");
    ASSERT_OK(p.rc);
    ASSERT_EQ(p.req.min_tokens, 0);
    engine_request_free(&p.req);
    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":\"x\",\"min_tokens\":8,\"max_tokens\":7}",
               "min_tokens");
    ASSERT_BAD(API_CHAT,
               "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"min_tokens\":10,"
               "\"max_completion_tokens\":9}",
               "min_tokens");
    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":\"x\",\"min_tokens\":8193}", "min_tokens");
    p = parse(API_COMPLETIONS, "{\"prompt\":\"x\",\"min_tokens\":8192}");
    ASSERT_OK(p.rc); /* without max_tokens: at most the model's context */
    engine_request_free(&p.req);
    p = parse(API_COMPLETIONS, "{\"prompt\":\"x\",\"min_tokens\":9000,\"max_tokens\":9000}");
    ASSERT_OK(p.rc);
    engine_request_free(&p.req);
    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":\"x\",\"min_tokens\":-1}", "min_tokens");
    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":\"x\",\"min_tokens\":\"3\"}", "min_tokens");
    ASSERT_BAD(API_COMPLETIONS, "{\"prompt\":\"x\",\"min_tokens\":1.5}", "min_tokens");
}

TEST(api_chat_template_recognizes_llama3_and_llama2_and_falls_back_to_chatml)
{
    struct api_chat_template t;
    struct api_chat_message m[3] = {{"system", "S", 1}, {"user", "U", 1}, {"assistant", "A", 1}};
    char *out;
    size_t len;

    api_chat_template_init(&t, "{{ '<|start_header_id|>' + message['role'] }}");
    ASSERT_EQ(t.format, API_CHAT_LLAMA3);
    ASSERT_EQ(t.recognized, 1);
    ASSERT_OK(api_chat_render(&t, m, 2, 1, &out, &len));
    ASSERT_STREQ(out, "<|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|>"
                      "<|start_header_id|>user<|end_header_id|>\n\nU<|eot_id|>"
                      "<|start_header_id|>assistant<|end_header_id|>\n\n");
    free(out);

    api_chat_template_init(&t, "{{ bos_token + '[INST] ' + content + ' [/INST]' }}");
    ASSERT_EQ(t.format, API_CHAT_LLAMA2);
    struct api_chat_message m2[4] = {
        {"system", "S", 1}, {"user", "U", 1}, {"assistant", "A", 1}, {"user", "V", 1}};
    ASSERT_OK(api_chat_render(&t, m2, 4, 1, &out, &len));
    ASSERT_STREQ(out, "[INST] <<SYS>>\nS\n<</SYS>>\n\nU [/INST] A </s><s>[INST] V [/INST]");
    free(out);

    /* Gemma: the fixture's chat prompt (tools/make_gemma_logits_fixture.py) is
     * the user turn rendered this way */
    api_chat_template_init(&t, "{{ '<start_of_turn>' + role + '\\n' }}");
    ASSERT_EQ(t.format, API_CHAT_GEMMA);
    ASSERT_EQ(t.recognized, 1);
    ASSERT_OK(api_chat_render(&t, m2, 4, 1, &out, &len));
    ASSERT_STREQ(out,
                 "<start_of_turn>user\nS\n\nU<end_of_turn>\n<start_of_turn>model\nA<end_of_turn>\n"
                 "<start_of_turn>user\nV<end_of_turn>\n<start_of_turn>model\n");
    free(out);
    /* a system message before a model turn opens that turn (Gemma 3's own
     * template prefixes the first remaining message), so order is kept */
    ASSERT_OK(
        api_chat_render(&t, (struct api_chat_message[]){m2[0], m2[2], m2[3]}, 3, 1, &out, &len));
    ASSERT_STREQ(out,
                 "<start_of_turn>model\nS\n\nA<end_of_turn>\n<start_of_turn>user\nV<end_of_turn>\n"
                 "<start_of_turn>model\n");
    free(out);

    api_chat_template_init(&t, "{{ something we have never seen }}");
    ASSERT_EQ(t.format, API_CHAT_CHATML);
    ASSERT_EQ(t.recognized, 0);
    api_chat_template_init(&t, NULL);
    ASSERT_EQ(t.recognized, 0);
    ASSERT_OK(api_chat_render(&t, m + 1, 1, 1, &out, &len));
    ASSERT_STREQ(out, "<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n");
    ASSERT_EQ(len, strlen(out));
    free(out);
}

/* Gemma's, Llama-3's and Llama-2's own templates trim each message's
 * content (Jinja's trim, Python's str.strip(): Unicode whitespace too), as
 * vLLM and llama-server render them; ChatML (SmolLM2's) keeps it whole. The
 * expected prompts are those templates rendered with jinja2. */
TEST(api_chat_render_trims_contents_where_the_models_template_does)
{
    const char *const sys = " Be brief. \n", *const u1 = "  Hi there\n\n", *const a = " Hello! \n";
    const char *const u2 = "\tBye \xE3\x80\x80"; /* U+3000, an ideographic space, last */
    const struct api_chat_message m[4] = {{"system", sys, strlen(sys)},
                                          {"user", u1, strlen(u1)},
                                          {"assistant", a, strlen(a)},
                                          {"user", u2, strlen(u2)}};
    struct api_chat_template t;
    char *out;
    size_t len;

    api_chat_template_named(&t, API_CHAT_GEMMA);
    ASSERT_OK(api_chat_render(&t, m, 4, 1, &out, &len));
    ASSERT_STREQ(out, "<start_of_turn>user\n Be brief. \n\n\nHi there<end_of_turn>\n"
                      "<start_of_turn>model\nHello!<end_of_turn>\n"
                      "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n");
    ASSERT_EQ(len, strlen(out));
    free(out);

    api_chat_template_named(&t, API_CHAT_LLAMA3);
    ASSERT_OK(api_chat_render(&t, m, 4, 1, &out, &len));
    ASSERT_STREQ(out, "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
                      "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
                      "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
                      "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
                      "<|start_header_id|>assistant<|end_header_id|>\n\n");
    free(out);

    /* Llama-2 strips the first [INST]'s whole text: the system block and the
     * user's content, so the content keeps its leading whitespace there */
    api_chat_template_named(&t, API_CHAT_LLAMA2);
    ASSERT_OK(api_chat_render(&t, m, 4, 1, &out, &len));
    ASSERT_STREQ(out, "[INST] <<SYS>>\n Be brief. \n\n<</SYS>>\n\n  Hi there [/INST] Hello! "
                      "</s><s>[INST] Bye [/INST]");
    free(out);
    /* ... and with a blank user content, the block's own blank lines */
    const struct api_chat_message blank[2] = {{"system", "S", 1}, {"user", "  ", 2}};
    ASSERT_OK(api_chat_render(&t, blank, 2, 1, &out, &len));
    ASSERT_STREQ(out, "[INST] <<SYS>>\nS\n<</SYS>> [/INST]");
    free(out);

    api_chat_template_named(&t, API_CHAT_CHATML);
    ASSERT_OK(api_chat_render(&t, m + 1, 1, 1, &out, &len));
    ASSERT_STREQ(out, "<|im_start|>user\n  Hi there\n\n<|im_end|>\n<|im_start|>assistant\n");
    free(out);
}

/* Llama-2: every user turn after an answer's </s> opens with <s>, also when
 * the answer came first (an assistant message before any user one). */
TEST(api_chat_render_llama2_opens_each_turn_after_an_answer_with_bos)
{
    const struct api_chat_message m[3] = {
        {"assistant", "Hi, how can I help?", 19}, {"user", "U", 1}, {"assistant", "A", 1}};
    struct api_chat_template t;
    char *out;
    size_t len;
    api_chat_template_named(&t, API_CHAT_LLAMA2);
    ASSERT_OK(api_chat_render(&t, m, 2, 1, &out, &len));
    ASSERT_STREQ(out, " Hi, how can I help? </s><s>[INST] U [/INST]");
    free(out);
    const struct api_chat_message s[3] = {{"system", "S", 1}, m[0], m[1]};
    ASSERT_OK(api_chat_render(&t, s, 3, 1, &out, &len));
    ASSERT_STREQ(out, " Hi, how can I help? </s><s>[INST] <<SYS>>\nS\n<</SYS>>\n\nU [/INST]");
    free(out);
}

/* serve --chat-template: the four names as the log writes them, nothing
 * else; a named format renders as recognized, with no default system turn
 * (the name carries no template to take one from). */
TEST(api_chat_format_names_parse_back_and_a_named_format_has_no_default_system)
{
    const enum api_chat_format all[] = {API_CHAT_CHATML, API_CHAT_LLAMA3, API_CHAT_LLAMA2,
                                        API_CHAT_GEMMA};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        enum api_chat_format f = (enum api_chat_format) - 1;
        ASSERT_OK(api_chat_format_parse(api_chat_format_name(all[i]), &f));
        ASSERT_EQ(f, all[i]);
    }
    const char *bad[] = {"", "auto", "ChatML", "chatml ", "llama", "gemma3", "llama3\n", "jinja"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        enum api_chat_format f = API_CHAT_GEMMA;
        ASSERT_EQ(api_chat_format_parse(bad[i], &f), -1);
        ASSERT_EQ(f, API_CHAT_GEMMA); /* untouched */
    }

    struct api_chat_template t;
    memset(&t, 0x5a, sizeof t); /* whatever was there before is gone */
    api_chat_template_named(&t, API_CHAT_CHATML);
    ASSERT_EQ(t.format, API_CHAT_CHATML);
    ASSERT_EQ(t.recognized, 1);
    ASSERT_EQ(t.default_system[0], 0);
    struct api_chat_message m = {"user", "U", 1};
    char *out, *open, *close;
    size_t len;
    ASSERT_OK(api_chat_render(&t, &m, 1, 1, &out, &len));
    ASSERT_STREQ(out, "<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n");
    free(out);
    ASSERT_OK(api_chat_session_texts(&t, &m, 1, &open, &close));
    ASSERT(open == NULL);
    ASSERT_STREQ(close, "<|im_end|>\n");
    free(close);

    api_chat_template_named(&t, API_CHAT_GEMMA);
    ASSERT_EQ(t.format, API_CHAT_GEMMA);
    ASSERT_OK(api_chat_render(&t, &m, 1, 1, &out, &len));
    ASSERT_STREQ(out, "<start_of_turn>user\nU<end_of_turn>\n<start_of_turn>model\n");
    free(out);
}

/* A chat session sends only new turns; the engine puts open before the first
 * (a new session) or close after the previous answer (a continuation). With
 * them, the turns of a session are the whole conversation rendered at once:
 * open + first turns + answer + close + next turns == all of them. */
static int session_turns(const struct api_chat_template *t, const struct api_chat_message *first,
                         size_t n_first, const char *answer, const struct api_chat_message *next,
                         size_t n_next, char *joined, char *whole, size_t cap)
{
    struct api_chat_message all[8];
    size_t n = 0, len;
    for (size_t i = 0; i < n_first; i++)
        all[n++] = first[i];
    all[n++] = (struct api_chat_message){"assistant", answer, strlen(answer)};
    for (size_t i = 0; i < n_next; i++)
        all[n++] = next[i];
    char *w = NULL, *a = NULL, *b = NULL, *open = NULL, *close = NULL;
    int rc = api_chat_render(t, all, n, 1, &w, &len) < 0 ||
                     api_chat_render(t, first, n_first, 0, &a, &len) < 0 ||
                     api_chat_render(t, next, n_next, 0, &b, &len) < 0 ||
                     api_chat_session_texts(t, first, n_first, &open, &close) < 0 || !close
                 ? -1
                 : 0;
    if (rc == 0) {
        snprintf(joined, cap, "%s%s%s%s%s", open ? open : "", a, answer, close, b);
        snprintf(whole, cap, "%s", w);
    }
    free(w);
    free(a);
    free(b);
    free(open);
    free(close);
    return rc;
}

/* The default system prompt is the literal that holds the whole turn, not
 * the first place the template opens one: Qwen2.5's opens it in its tools
 * branch first, with the text from a variable; and a literal's escaped
 * quote does not end it. */
TEST(api_chat_template_default_system_is_found_past_a_turn_opened_without_it)
{
    struct api_chat_template t;
    api_chat_template_init(
        &t,
        "{%- if tools %}{{- '<|im_start|>system\\n' }}"
        "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}"
        "{%- else %}{{- 'You are Qwen.' }}{%- endif %}"
        "{%- else %}{%- if messages[0]['role'] == 'system' %}"
        "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
        "{%- else %}{{- '<|im_start|>system\\nYou are Qwen, a helpful assistant.<|im_end|>\\n' }}"
        "{%- endif %}{%- endif %}");
    ASSERT_STREQ(t.default_system, "You are Qwen, a helpful assistant.");
    api_chat_template_init(&t, "{{ '<|im_start|>system\\nYou\\'re X.<|im_end|>\\n' }}");
    ASSERT_STREQ(t.default_system, "You're X.");
    api_chat_template_init(&t, "{{ \"<|im_start|>system\\nSay \\\"hi\\\".<|im_end|>\\n\" }}");
    ASSERT_STREQ(t.default_system, "Say \"hi\".");
    /* a system turn only ever opened for a variable's text: no default */
    api_chat_template_init(&t, "{{ '<|im_start|>system\\n' + messages[0]['content'] + "
                               "'<|im_end|>\\n' }}{{ '<|im_start|>' + message['role'] }}");
    ASSERT_EQ(t.default_system[0], 0);
    /* the first such literal, whatever its quotes */
    api_chat_template_init(&t, "{{ \"<|im_start|>system\\nFirst.<|im_end|>\\n\" }}"
                               "{{ '<|im_start|>system\\nSecond.<|im_end|>\\n' }}");
    ASSERT_STREQ(t.default_system, "First.");
    /* an unterminated literal at the end of the template */
    api_chat_template_init(&t, "{{ '<|im_start|>system\\nYou are X<|im_end|>");
    ASSERT_STREQ(t.default_system, "You are X");
}

/* A default system prompt is kept whole or not at all: one longer than the
 * room for it is dropped (the server warns), never cut, least of all inside
 * a character (the cut one went into every chat without a system message). */
TEST(api_chat_template_default_system_is_kept_whole_or_dropped)
{
    static struct api_chat_template t;
    const size_t room = sizeof t.default_system - 1;
    static char tmpl[3 * sizeof t.default_system], text[sizeof t.default_system + 8];
    for (int over = 0; over < 2; over++) {
        /* "é" (2 bytes) from start to end: a cut at the room falls inside one */
        const size_t n = room + (size_t)over;
        for (size_t i = 0; i < n; i += 2)
            memcpy(text + i, i + 1 < n ? "\xc3\xa9" : "x", i + 1 < n ? 2 : 1);
        text[n] = 0;
        snprintf(tmpl, sizeof tmpl, "{{ '<|im_start|>system\\n%s<|im_end|>\\n' }}", text);
        api_chat_template_init(&t, tmpl);
        ASSERT_EQ(t.format, API_CHAT_CHATML);
        if (over) {
            ASSERT_EQ(t.default_system[0], 0);
            ASSERT_EQ(t.default_system_dropped, n);
        } else {
            ASSERT_STREQ(t.default_system, text);
            ASSERT_EQ(t.default_system_dropped, 0);
        }
    }
    /* escapes count as the characters they give */
    memset(text, 'a', room - 1);
    text[room - 1] = 0;
    snprintf(tmpl, sizeof tmpl, "{{ '<|im_start|>system\\n%s\\n<|im_end|>' }}", text);
    api_chat_template_init(&t, tmpl);
    ASSERT_EQ(strlen(t.default_system), room);
    ASSERT_EQ(t.default_system[room - 1], '\n');
}

TEST(api_chat_session_texts_make_a_sessions_turns_the_whole_conversation)
{
    struct api_chat_template t;
    const struct api_chat_message sys_user[2] = {{"system", "S", 1}, {"user", "U", 1}};
    const struct api_chat_message user[1] = {{"user", "U", 1}};
    const struct api_chat_message next[1] = {{"user", "V", 1}};
    api_chat_template_init(&t, "{% if loop.first and messages[0]['role'] != 'system' %}"
                               "{{ '<|im_start|>system\\nYou are X<|im_end|>\\n' }}{% endif %}"
                               "{{ '<|im_start|>' + message['role'] }}");
    ASSERT_STREQ(t.default_system, "You are X");
    char joined[1024], whole[1024];
#define SAME(first, n_first)                                                                       \
    do {                                                                                           \
        ASSERT_OK(session_turns(&t, first, n_first, "A", next, 1, joined, whole, sizeof joined));  \
        ASSERT_STREQ(joined, whole);                                                               \
    } while (0)
    SAME(user, 1); /* the default system turn: open */
    SAME(sys_user, 2);
    api_chat_template_init(&t, "{{ '<|start_header_id|>' + message['role'] }}");
    SAME(sys_user, 2);
    SAME(user, 1);
    api_chat_template_init(&t, "{{ '<start_of_turn>' + role + '\\n' }}");
    SAME(sys_user, 2);
    SAME(user, 1);
#undef SAME
    /* Llama-2 puts a blank before the answer, which the model writes itself */
    api_chat_template_init(&t, "{{ bos_token + '[INST] ' + content + ' [/INST]' }}");
    char *open, *close;
    ASSERT_OK(api_chat_session_texts(&t, user, 1, &open, &close));
    ASSERT(open == NULL);
    ASSERT_STREQ(close, " </s><s>");
    free(close);
}

TEST(api_request_non_finite_numbers_are_out_of_range_for_every_numeric_param)
{
    static const char *const completions[] = {
        "temperature", "top_p", "top_k",      "min_p",   "presence_penalty", "frequency_penalty",
        "seed",        "n",     "max_tokens", "best_of", "logprobs"};
    char body[256];
    for (size_t i = 0; i < sizeof completions / sizeof completions[0]; i++) {
        for (int neg = 0; neg < 2; neg++) {
            snprintf(body, sizeof body, "{\"prompt\":\"x\",\"%s\":%s1e400}", completions[i],
                     neg ? "-" : "");
            struct parsed p = parse(API_COMPLETIONS, body);
            ASSERT_REJECTED(p, 400, completions[i], "invalid_value");
            char want[160];
            snprintf(want, sizeof want,
                     "Invalid value for '%s': the number is out of range (not finite).",
                     completions[i]);
            ASSERT_STREQ(p.err.message, want);
        }
    }
    ASSERT_REJECTED(parse(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                                    "\"max_completion_tokens\":1e999}"),
                    400, "max_completion_tokens", "invalid_value");
    ASSERT_REJECTED(parse(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                                    "\"logprobs\":true,\"top_logprobs\":-1e999}"),
                    400, "top_logprobs", "invalid_value");
    struct parsed p = parse(API_COMPLETIONS, "{\"prompt\":[1,1e400]}");
    ASSERT_REJECTED(p, 400, "prompt", "invalid_value");
    ASSERT(strstr(p.err.message, "not finite") != NULL);
    /* finite but beyond int64: out of range, not "expected an integer" */
    p = parse(API_COMPLETIONS, "{\"prompt\":\"x\",\"max_tokens\":1e300}");
    ASSERT_REJECTED(p, 400, "max_tokens", "invalid_value");
    ASSERT(strstr(p.err.message, "outside the range") != NULL);
}

TEST(api_request_model_must_be_one_the_server_serves)
{
    static const char *const names[] = {"SmolLM2-135M-Instruct.Q4_1", "smol"};
    struct api_parse_ctx ctx = base_ctx(NULL);
    ctx.model_names = names;
    ctx.n_model_names = 2;
#define WITH_MODEL(m) "{\"prompt\":\"x\",\"model\":\"" m "\"}"
    ASSERT_ACCEPTED(parse_c(&ctx, API_COMPLETIONS, WITH_MODEL("smol"), strlen(WITH_MODEL("smol"))));
    const char *id = WITH_MODEL("SmolLM2-135M-Instruct.Q4_1");
    ASSERT_ACCEPTED(parse_c(&ctx, API_COMPLETIONS, id, strlen(id)));
    const char *other = WITH_MODEL("no-such-model");
    struct parsed p = parse_c(&ctx, API_COMPLETIONS, other, strlen(other));
    ASSERT_REJECTED(p, 404, "model", "model_not_found");
    ASSERT_STREQ(p.err.type, "invalid_request_error");
    ASSERT_STREQ(p.err.message, "The model `no-such-model` does not exist.");
    const char *upper = WITH_MODEL("SMOL"); /* names are case-sensitive, as vLLM's */
    ASSERT_REJECTED(parse_c(&ctx, API_COMPLETIONS, upper, strlen(upper)), 404, "model",
                    "model_not_found");
    const char *chat =
        "{\"model\":\"gpt-4o\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}";
    ASSERT_REJECTED(parse_c(&ctx, API_CHAT, chat, strlen(chat)), 404, "model", "model_not_found");
    const char *empty = WITH_MODEL("");
    ASSERT_REJECTED(parse_c(&ctx, API_COMPLETIONS, empty, strlen(empty)), 404, "model",
                    "model_not_found");
    /* no model (or null) is accepted, as it always was */
    ASSERT_ACCEPTED(parse_c(&ctx, API_COMPLETIONS, "{\"prompt\":\"x\"}", 14));
    const char *null_model = "{\"prompt\":\"x\",\"model\":null}";
    ASSERT_ACCEPTED(parse_c(&ctx, API_COMPLETIONS, null_model, strlen(null_model)));
    /* a long name is cut in the message, which stays valid UTF-8 */
    char big[700];
    size_t o = (size_t)snprintf(big, sizeof big, "{\"prompt\":\"x\",\"model\":\"x");
    for (int i = 0; i < 200; i++)
        o += (size_t)snprintf(big + o, sizeof big - o, "\xc3\xa9");
    snprintf(big + o, sizeof big - o, "\"}");
    p = parse_c(&ctx, API_COMPLETIONS, big, strlen(big));
    ASSERT_REJECTED(p, 404, "model", "model_not_found");
    ASSERT(strstr(p.err.message, "...` does not exist.") != NULL);
    char *json = api_error_json(&p.err);
    ASSERT(json != NULL);
    ASSERT_EQ(api__utf8_valid_prefix(json, strlen(json)), strlen(json));
    free(json);
    /* without a list any name is served (library users, tools) */
    ASSERT_ACCEPTED(parse(API_COMPLETIONS, WITH_MODEL("anything")));
#undef WITH_MODEL
}

TEST(api_request_refuses_tool_calling_and_takes_fields_that_ask_for_none)
{
#define CHAT_WITH(extra) "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]," extra "}"
    ASSERT_REJECTED(parse(API_CHAT, CHAT_WITH("\"tools\":[{\"type\":\"function\",\"function\":{"
                                              "\"name\":\"f\"}}]")),
                    400, "tools", "unsupported_parameter");
    ASSERT_REJECTED(parse(API_CHAT, CHAT_WITH("\"functions\":[{\"name\":\"f\"}]")), 400,
                    "functions", "unsupported_parameter");
    ASSERT_REJECTED(parse(API_CHAT, CHAT_WITH("\"tool_choice\":\"required\"")), 400, "tool_choice",
                    "unsupported_parameter");
    ASSERT_REJECTED(parse(API_CHAT, CHAT_WITH("\"tool_choice\":{\"type\":\"function\","
                                              "\"function\":{\"name\":\"f\"}}")),
                    400, "tool_choice", "unsupported_parameter");
    ASSERT_REJECTED(parse(API_CHAT, CHAT_WITH("\"function_call\":{\"name\":\"f\"}")), 400,
                    "function_call", "unsupported_parameter");
    ASSERT_REJECTED(parse(API_CHAT, CHAT_WITH("\"tool_choice\":\"sometimes\"")), 400, "tool_choice",
                    "invalid_value");
    ASSERT_REJECTED(parse(API_CHAT, CHAT_WITH("\"function_call\":\"always\"")), 400,
                    "function_call", "invalid_value");
    ASSERT_REJECTED(parse(API_CHAT, CHAT_WITH("\"tool_choice\":5")), 400, "tool_choice",
                    "invalid_type");
    ASSERT_REJECTED(parse(API_CHAT, CHAT_WITH("\"functions\":{}")), 400, "functions",
                    "invalid_type");
    ASSERT_REJECTED(parse(API_CHAT, CHAT_WITH("\"parallel_tool_calls\":\"yes\"")), 400,
                    "parallel_tool_calls", "invalid_type");
    ASSERT_REJECTED(parse(API_COMPLETIONS, "{\"prompt\":\"x\",\"tools\":[{}]}"), 400, "tools",
                    "unsupported_parameter");
    struct parsed p = parse(API_CHAT, CHAT_WITH("\"tools\":[{}]"));
    ASSERT(p.rc < 0);
    ASSERT(strstr(p.err.message, "does not support tool calling") != NULL);

    /* nothing here asks for a tool call */
    ASSERT_ACCEPTED(parse(API_CHAT, CHAT_WITH("\"tools\":[]")));
    ASSERT_ACCEPTED(parse(API_CHAT, CHAT_WITH("\"tool_choice\":\"none\"")));
    ASSERT_ACCEPTED(parse(API_CHAT, CHAT_WITH("\"tools\":[],\"tool_choice\":\"auto\"")));
    ASSERT_ACCEPTED(parse(API_CHAT, CHAT_WITH("\"tool_choice\":\"auto\"")));
    ASSERT_ACCEPTED(parse(API_CHAT, CHAT_WITH("\"functions\":[],\"function_call\":\"none\"")));
    ASSERT_ACCEPTED(parse(API_CHAT, CHAT_WITH("\"function_call\":\"auto\"")));
    ASSERT_ACCEPTED(parse(API_CHAT, CHAT_WITH("\"parallel_tool_calls\":false")));
    ASSERT_ACCEPTED(parse(API_CHAT, CHAT_WITH("\"tools\":null,\"tool_choice\":null,"
                                              "\"functions\":null,\"function_call\":null,"
                                              "\"parallel_tool_calls\":null")));
#undef CHAT_WITH

    /* an earlier turn's tool calls cannot be rendered: not dropped, refused */
#define TURNS(assistant)                                                                           \
    "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather in "                                  \
    "Paris?\"},{\"role\":\"assistant\"," assistant                                                 \
    "},{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"18C\"}]}"
    ASSERT_REJECTED(
        parse(API_CHAT, TURNS("\"content\":null,\"tool_calls\":[{\"id\":\"c1\",\"type\":"
                              "\"function\",\"function\":{\"name\":\"w\",\"arguments\":"
                              "\"{}\"}}]")),
        400, "messages[1].tool_calls", "unsupported_parameter");
    ASSERT_REJECTED(parse(API_CHAT, TURNS("\"content\":null,\"function_call\":{\"name\":\"w\","
                                          "\"arguments\":\"{}\"}")),
                    400, "messages[1].function_call", "unsupported_parameter");
    ASSERT_REJECTED(parse(API_CHAT, TURNS("\"content\":\"x\",\"tool_calls\":{}")), 400,
                    "messages[1].tool_calls", "unsupported_parameter");
    /* ... while fields that call nothing are taken */
    ASSERT_ACCEPTED(parse(API_CHAT, TURNS("\"content\":\"Sunny.\",\"tool_calls\":[]")));
    ASSERT_ACCEPTED(parse(API_CHAT, TURNS("\"content\":\"Sunny.\",\"tool_calls\":null,"
                                          "\"function_call\":null")));
#undef TURNS
}

TEST(api_request_chat_messages_other_than_the_assistants_need_content)
{
    ASSERT_REJECTED(parse(API_CHAT, "{\"messages\":[{\"role\":\"user\"}]}"), 400,
                    "messages[0].content", "invalid_value");
    ASSERT_REJECTED(parse(API_CHAT,
                          "{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
                          "{\"role\":\"user\",\"content\":null}]}"),
                    400, "messages[1].content", "invalid_value");
    ASSERT_ACCEPTED(parse(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"},"
                                    "{\"role\":\"assistant\"}]}"));
}

/* ---- strict JSON: what cJSON alone would let through -------------------- */

TEST(api_request_rejects_bytes_after_the_json_object)
{
    ASSERT_REJECTED(parse(API_COMPLETIONS, "{\"model\":\"x\",\"prompt\":\"hi\"} xyz"), 400, "",
                    "invalid_json");
    ASSERT_REJECTED(parse(API_COMPLETIONS, "{\"prompt\":\"hi\"}{\"prompt\":\"again\"}"), 400, "",
                    "invalid_json");
    ASSERT_REJECTED(parse(API_COMPLETIONS, "{\"prompt\":\"hi\"}]"), 400, "", "invalid_json");
    static const char nul_after[] = "{\"prompt\":\"hi\"}\0";
    struct api_parse_ctx ctx = base_ctx(NULL);
    ASSERT_REJECTED(parse_c(&ctx, API_COMPLETIONS, nul_after, sizeof nul_after - 1), 400, "",
                    "invalid_json");
    struct parsed p = parse(API_COMPLETIONS, "{\"prompt\":\"hi\"}x");
    ASSERT(p.rc < 0);
    ASSERT(strstr(p.err.message, "after the JSON object") != NULL);
    /* JSON whitespace may follow (and precede) */
    ASSERT_ACCEPTED(parse(API_COMPLETIONS, " \r\n\t{\"prompt\":\"hi\"} \r\n\t"));
}

TEST(api_request_takes_only_strict_json_whitespace_strings_and_numbers)
{
    /* cJSON skips any byte up to 0x20 as whitespace */
    ASSERT_REJECTED(parse(API_COMPLETIONS, "{\"prompt\":\x01\"hi\"}"), 400, "", "invalid_json");
    ASSERT_REJECTED(parse(API_COMPLETIONS, "\x0c{\"prompt\":\"hi\"}"), 400, "", "invalid_json");
    /* control characters must be escaped inside strings (RFC 8259 section 7) */
    ASSERT_REJECTED(parse(API_COMPLETIONS, "{\"prompt\":\"a\x01z\"}"), 400, "", "invalid_json");
    ASSERT_REJECTED(parse(API_COMPLETIONS, "{\"prompt\":\"line\nbreak\"}"), 400, "",
                    "invalid_json");
    /* numbers strtod reads but JSON does not have */
    ASSERT_REJECTED(parse(API_COMPLETIONS, "{\"prompt\":\"x\",\"max_tokens\":012}"), 400, "",
                    "invalid_json");
    ASSERT_REJECTED(parse(API_COMPLETIONS, "{\"prompt\":\"x\",\"temperature\":1.}"), 400, "",
                    "invalid_json");
    ASSERT_REJECTED(parse(API_COMPLETIONS, "{\"prompt\":\"x\",\"temperature\":-.5}"), 400, "",
                    "invalid_json");
    ASSERT_REJECTED(parse(API_COMPLETIONS, "{\"prompt\":\"x\",\"temperature\":1.e1}"), 400, "",
                    "invalid_json");
    ASSERT_REJECTED(parse(API_COMPLETIONS, "{\"prompt\":[00]}"), 400, "", "invalid_json");
    /* and what JSON does have */
    struct parsed p = parse(API_COMPLETIONS, "{\"prompt\":[0,1e1,2E+0,30e-1],\"temperature\":-0.0,"
                                             "\"top_p\":0.5e0,\"seed\":-12,\"x\":\"\\t\\u00e9\"}");
    ASSERT_OK(p.rc);
    ASSERT_EQ(p.req.n_prompt_ids, 4);
    ASSERT_EQ(p.req.prompt_ids[1], 10);
    ASSERT_EQ(p.req.prompt_ids[3], 3);
    engine_request_free(&p.req);
    /* a parse error says where */
    p = parse(API_COMPLETIONS, "{\"prompt\":\"x\",,}");
    ASSERT(p.rc < 0);
    ASSERT_STREQ(p.err.code, "invalid_json");
    ASSERT(strstr(p.err.message, "near byte 1") != NULL); /* cJSON says 15 */
}

TEST(api_request_refuses_u0000_in_any_string_naming_its_param)
{
    /* cJSON strings end at the first NUL: "a\u0000b" would silently become "a" */
    ASSERT_REJECTED(parse(API_COMPLETIONS, "{\"prompt\":\"a\\u0000b\"}"), 400, "prompt",
                    "invalid_value");
    ASSERT_REJECTED(parse(API_COMPLETIONS, "{\"prompt\":[\"a\\u0000\"]}"), 400, "prompt",
                    "invalid_value");
    ASSERT_REJECTED(parse(API_COMPLETIONS, "{\"prompt\":\"x\",\"stop\":\"\\u0000end\"}"), 400,
                    "stop", "invalid_value");
    ASSERT_REJECTED(parse(API_COMPLETIONS, "{\"prompt\":\"x\",\"stop\":[\"a\",\"b\\u0000c\"]}"),
                    400, "stop", "invalid_value");
    ASSERT_REJECTED(parse(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},"
                                    "{\"role\":\"user\",\"content\":\"x\\u0000y\"}]}"),
                    400, "messages[1].content", "invalid_value");
    ASSERT_REJECTED(parse(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":"
                                    "\"text\",\"text\":\"a\"},{\"type\":\"text\",\"text\":"
                                    "\"\\u0000\"}]}]}"),
                    400, "messages[0].content[1].text", "invalid_value");
    /* "user\u0000x" would pass as the role "user" */
    ASSERT_REJECTED(
        parse(API_CHAT, "{\"messages\":[{\"role\":\"user\\u0000x\",\"content\":\"hi\"}]}"), 400,
        "messages[0].role", "invalid_value");
    ASSERT_REJECTED(parse(API_COMPLETIONS, "{\"prompt\":\"x\",\"model\":\"m\\u0000\"}"), 400,
                    "model", "invalid_value");
    ASSERT_REJECTED(parse(API_COMPLETIONS, "{\"prompt\":\"x\",\"session_id\":\"s\\u0000t\"}"), 400,
                    "session_id", "invalid_value");
    /* in a key: "prompt\u0000x" would be read as "prompt" */
    ASSERT_REJECTED(parse(API_COMPLETIONS, "{\"prompt\\u0000x\":\"a\",\"prompt\":\"b\"}"), 400,
                    "prompt", "invalid_value");
    /* even in a field we ignore, named by its path */
    ASSERT_REJECTED(parse(API_COMPLETIONS, "{\"prompt\":\"x\",\"metadata\":{\"k\":\"v\\u0000\"}}"),
                    400, "metadata.k", "invalid_value");
    /* a raw NUL byte inside a string is the same character */
    static const char raw[] = "{\"prompt\":\"a\0b\"}";
    struct api_parse_ctx ctx = base_ctx(NULL);
    ASSERT_REJECTED(parse_c(&ctx, API_COMPLETIONS, raw, sizeof raw - 1), 400, "prompt",
                    "invalid_value");
    struct parsed p = parse(API_COMPLETIONS, "{\"prompt\":\"a\\u0000b\"}");
    ASSERT(p.rc < 0);
    ASSERT_STREQ(p.err.message,
                 "Invalid value for 'prompt': strings may not contain U+0000 (NUL).");

    /* an escaped backslash followed by u0000 is six characters, not a NUL */
    p = parse(API_COMPLETIONS, "{\"prompt\":\"a\\\\u0000b\",\"stop\":\"\\\\u0000\"}");
    ASSERT_OK(p.rc);
    ASSERT_STREQ(p.req.prompt, "a\\u0000b");
    ASSERT_EQ(p.req.prompt_len, 8);
    ASSERT_STREQ(p.req.stop[0], "\\u0000");
    engine_request_free(&p.req);
    /* ... but an escaped backslash and then \u0000 is a NUL */
    ASSERT_REJECTED(parse(API_COMPLETIONS, "{\"prompt\":\"a\\\\\\u0000\"}"), 400, "prompt",
                    "invalid_value");
    /* other escapes are fine, and so is an escaped quote before the string goes on */
    p = parse(API_COMPLETIONS, "{\"prompt\":\"\\\"\\u0001\\u0100\\ud83d\\ude00\\/\"}");
    ASSERT_OK(p.rc);
    ASSERT_STREQ(p.req.prompt, "\"\x01\xc4\x80\xf0\x9f\x98\x80/");
    engine_request_free(&p.req);
}

TEST(api_request_refuses_strings_that_are_not_utf8_naming_their_param)
{
    /* RFC 8259 section 8.1: JSON text is UTF-8; cJSON passes any byte through */
    ASSERT_REJECTED(parse(API_COMPLETIONS, "{\"prompt\":\"caf\xe9\"}"), 400, "prompt",
                    "invalid_value");
    ASSERT_REJECTED(parse(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"\xc3\"}]}"),
                    400, "messages[0].content", "invalid_value");
    ASSERT_REJECTED(parse(API_COMPLETIONS, "{\"prompt\":\"x\",\"model\":\"\xff\"}"), 400, "model",
                    "invalid_value");
    ASSERT_REJECTED(parse(API_COMPLETIONS, "{\"prompt\":\"\xed\xa0\x80\"}"), 400, "prompt",
                    "invalid_value"); /* a UTF-16 surrogate */
    ASSERT_REJECTED(parse(API_COMPLETIONS, "{\"prompt\":\"\xc0\xaf\"}"), 400, "prompt",
                    "invalid_value"); /* overlong */
    struct parsed p = parse(API_COMPLETIONS, "{\"prompt\":\"x\",\"stop\":[\"ok\",\"\xfe\"]}");
    ASSERT_REJECTED(p, 400, "stop", "invalid_value");
    ASSERT_STREQ(p.err.message, "Invalid value for 'stop': strings must be valid UTF-8.");
    p = parse(API_COMPLETIONS, "{\"prompt\":\"caf\xc3\xa9 \xf0\x9f\x98\x80\"}");
    ASSERT_OK(p.rc);
    ASSERT_STREQ(p.req.prompt, "caf\xc3\xa9 \xf0\x9f\x98\x80");
    engine_request_free(&p.req);
}

TEST(api_request_refuses_a_key_given_twice_naming_it)
{
    /* cJSON would read the first max_tokens, Python's json (a proxy) the last */
    struct parsed p =
        parse(API_COMPLETIONS, "{\"prompt\":\"x\",\"max_tokens\":1,\"max_tokens\":-1e400}");
    ASSERT_REJECTED(p, 400, "max_tokens", "invalid_value");
    ASSERT_STREQ(p.err.message, "Invalid value for 'max_tokens': the key appears more than once.");
    ASSERT_REJECTED(parse(API_CHAT,
                          "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":"
                          "\"user\",\"content\":\"b\",\"role\":\"system\"}]}"),
                    400, "messages[1].role", "invalid_value");
    ASSERT_REJECTED(
        parse(API_COMPLETIONS, "{\"prompt\":\"x\",\"metadata\":{\"a\":1,\"b\":2,\"a\":3}}"), 400,
        "metadata.a", "invalid_value");
    /* the same key in different objects is fine */
    ASSERT_ACCEPTED(parse(API_CHAT,
                          "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":"
                          "\"assistant\",\"content\":\"b\"}],\"x\":{\"messages\":1}}"));
}

/* "{"prompt":[1,1,...]}" with n ids: n + 3 values (object, key, array). */
static char *token_body(size_t n)
{
    char *b = malloc(2 * n + 16);
    if (!b)
        return NULL;
    size_t o = (size_t)sprintf(b, "{\"prompt\":[");
    for (size_t i = 0; i < n; i++) {
        b[o++] = '1';
        b[o++] = ',';
    }
    b[o - 1] = ']';
    b[o++] = '}';
    b[o] = 0;
    return b;
}

TEST(api_request_bounds_json_values_before_building_the_tree)
{
    struct api_parse_ctx ctx = base_ctx(NULL);
    ctx.max_json_values = 100;
    char *at = token_body(97); /* exactly 100 values */
    char *over = token_body(98);
    ASSERT(at && over);
    ASSERT_ACCEPTED(parse_c(&ctx, API_COMPLETIONS, at, strlen(at)));
    struct parsed p = parse_c(&ctx, API_COMPLETIONS, over, strlen(over));
    free(at);
    free(over);
    ASSERT_REJECTED(p, 413, "", "request_too_large");
    ASSERT(strstr(p.err.message, "100") != NULL);
    /* keys count: a body of many small fields is as big a tree */
    char fields[512];
    size_t o = (size_t)snprintf(fields, sizeof fields, "{\"prompt\":\"x\"");
    for (int i = 0; i < 49; i++)
        o += (size_t)snprintf(fields + o, sizeof fields - o, ",\"%c\":0", 'A' + (i % 26));
    snprintf(fields + o, sizeof fields - o, "}");
    ASSERT_REJECTED(parse_c(&ctx, API_COMPLETIONS, fields, strlen(fields)), 413, "",
                    "request_too_large"); /* 1 + 2 + 49 * 2 = 101 */
    /* brackets and commas inside strings are text */
    const char *text =
        "{\"prompt\":\"[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,"
        "1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,"
        "1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1\\\"]\"}";
    ASSERT_ACCEPTED(parse_c(&ctx, API_COMPLETIONS, text, strlen(text)));

    /* the default: 2^20 values */
    ctx.max_json_values = 0;
    char *big = token_body(API_JSON_DEFAULT_MAX_VALUES - 2);
    ASSERT(big != NULL);
    p = parse_c(&ctx, API_COMPLETIONS, big, strlen(big));
    free(big);
    ASSERT_REJECTED(p, 413, "", "request_too_large");
}

TEST(api_request_bounds_json_nesting_depth)
{
    /* the root object is level 1; 63 arrays inside it make 64 */
    char body[512];
    for (int extra = 0; extra < 2; extra++) {
        int levels = 63 + extra;
        size_t o = (size_t)snprintf(body, sizeof body, "{\"prompt\":\"x\",\"deep\":");
        for (int i = 0; i < levels; i++)
            body[o++] = '[';
        for (int i = 0; i < levels; i++)
            body[o++] = ']';
        snprintf(body + o, sizeof body - o, "}");
        if (extra)
            ASSERT_REJECTED(parse(API_COMPLETIONS, body), 400, "", "json_too_deep");
        else
            ASSERT_ACCEPTED(parse(API_COMPLETIONS, body));
    }
    /* far deeper than cJSON's own limit of 1000 is the same clean 400 */
    static char deep[20000];
    memset(deep, '[', sizeof deep - 1);
    ASSERT_REJECTED(parse(API_COMPLETIONS, deep), 400, "", "json_too_deep");
}

/* 1 when the engine's sampler takes the parsed sampling parameters (the
 * engine answers "invalid sampling parameter" for those it does not). */
static int sampler_takes(const struct engine_sampling *sp)
{
    struct sampler_params p = engine__sampler_params(sp);
    struct sampler s;
    int rc = sampler_init(&s, &p, 16);
    if (rc == 0)
        sampler_free(&s);
    return rc == 0;
}

TEST(api_request_a_top_p_that_rounds_to_zero_is_greedy_like_zero)
{
    /* 1e-46 is inside [0, 1] but is 0.0f as a float; 1e-40 is a subnormal float */
    static const char *const tiny[] = {"0", "1e-46", "4e-50", "1e-40", "1e-30", "1e-300", "-0.0"};
    char body[160];
    for (size_t i = 0; i < sizeof tiny / sizeof tiny[0]; i++) {
        snprintf(body, sizeof body, "{\"prompt\":\"x\",\"top_p\":%s}", tiny[i]);
        struct parsed p = parse(API_COMPLETIONS, body);
        if (p.rc < 0)
            FAIL_AT("top_p %s: %s", tiny[i], p.err.message);
        int ok = sampler_takes(&p.req.sampling);
        float t = p.req.sampling.temperature, top_p = p.req.sampling.top_p;
        engine_request_free(&p.req);
        if (!ok)
            FAIL_AT("top_p %s: the sampler refuses temperature %g top_p %g", tiny[i], t, top_p);
        if ((float)strtod(tiny[i], NULL) == 0 && t != 0)
            FAIL_AT("top_p %s rounds to 0 but is not greedy (temperature %g)", tiny[i], t);
    }
}

TEST(api_request_every_float_param_the_range_takes_is_one_the_sampler_takes)
{
    static const char *const params[] = {"temperature", "top_p", "min_p", "presence_penalty",
                                         "frequency_penalty"};
    static const char *const values[] = {"0",
                                         "-0.0",
                                         "1e-46",
                                         "1e-40",
                                         "1e-300",
                                         "-1e-46",
                                         "-1e-40",
                                         "0.5",
                                         "1",
                                         "2",
                                         "-2",
                                         "1.0000000000000001",
                                         "1.99999999999999999",
                                         "-1.99999999999999999"};
    char body[200];
    for (size_t i = 0; i < sizeof params / sizeof params[0]; i++) {
        for (size_t j = 0; j < sizeof values / sizeof values[0]; j++) {
            snprintf(body, sizeof body, "{\"prompt\":\"x\",\"%s\":%s}", params[i], values[j]);
            struct parsed p = parse(API_COMPLETIONS, body);
            if (p.rc < 0)
                continue; /* outside the documented range: a 400 naming the param */
            int ok = sampler_takes(&p.req.sampling);
            engine_request_free(&p.req);
            if (!ok)
                FAIL_AT("%s = %s is accepted here but refused by the sampler", params[i],
                        values[j]);
        }
    }
}

TEST(api_request_takes_every_int64_exactly)
{
    struct parsed p =
        parse(API_COMPLETIONS, "{\"prompt\":\"x\",\"max_tokens\":9223372036854775807}");
    ASSERT_OK(p.rc);
    ASSERT(p.req.max_tokens == INT64_MAX);
    engine_request_free(&p.req);
    p = parse(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                        "\"max_completion_tokens\":9223372036854775807}");
    ASSERT_OK(p.rc);
    ASSERT(p.req.max_tokens == INT64_MAX);
    engine_request_free(&p.req);

    static const struct {
        const char *lit;
        int64_t want;
    } seeds[] = {
        {"9223372036854775807", INT64_MAX},
        {"-9223372036854775808", INT64_MIN},
        {"9200000000000000000", 9200000000000000000LL},
        {"9.2e18", 9200000000000000000LL},
        {"9007199254740993", 9007199254740993LL}, /* 2^53 + 1: no double holds it */
        {"9007199254740992", 9007199254740992LL},
        {"-9007199254740993", -9007199254740993LL},
        {"92233720368547758.07e2", INT64_MAX},
        {"922337203685477580700e-2", INT64_MAX},
        {"1234567890123456789.000", 1234567890123456789LL},
        {"1e18", 1000000000000000000LL},
        {"3", 3},
        /* below 2^53 the double decides: a fraction it rounds away is
         * that integer (limits.md) */
        {"2.0000000000000001", 2},
        {"1e-400", 0},
    };
    char body[200];
    for (size_t i = 0; i < sizeof seeds / sizeof seeds[0]; i++) {
        snprintf(body, sizeof body, "{\"prompt\":\"x\",\"seed\":%s}", seeds[i].lit);
        p = parse(API_COMPLETIONS, body);
        if (p.rc < 0)
            FAIL_AT("seed %s: %s", seeds[i].lit, p.err.message);
        uint64_t got = p.req.sampling.seed;
        engine_request_free(&p.req);
        if (got != (uint64_t)seeds[i].want)
            FAIL_AT("seed %s read as %lld", seeds[i].lit, (long long)got);
    }
    /* found by member, wherever it is and however its key is spelled */
    p = parse(API_COMPLETIONS,
              "\xEF\xBB\xBF {\"prompt\" : \"a\\\"b]},\\\\\",\"stop\":[\"x\",\"]\"],"
              "\"stream_options\":null,\"extra\":{\"a\":[{}]}, \"se\\u0065d\" "
              ": 9007199254740993 , \"n\":1}");
    ASSERT_OK(p.rc);
    ASSERT(p.req.sampling.seed == 9007199254740993ULL);
    engine_request_free(&p.req);
}

TEST(api_request_quotes_a_number_out_of_range_as_sent)
{
    static const struct {
        const char *body, *param, *code, *message;
    } cases[] = {
        {"{\"prompt\":\"x\",\"seed\":9223372036854775808}", "seed", "invalid_value",
         "Invalid value for 'seed': 9223372036854775808 is outside the range "
         "[-9223372036854775808, 9223372036854775807]."},
        {"{\"prompt\":\"x\",\"seed\":-9223372036854775809}", "seed", "invalid_value",
         "Invalid value for 'seed': -9223372036854775809 is outside the range "
         "[-9223372036854775808, 9223372036854775807]."},
        {"{\"prompt\":\"x\",\"max_tokens\":1e19}", "max_tokens", "invalid_value",
         "Invalid value for 'max_tokens': 1e19 is outside the range [1, 9223372036854775807]."},
        {"{\"prompt\":\"x\",\"max_tokens\":-1e300}", "max_tokens", "invalid_value",
         "Invalid value for 'max_tokens': -1e300 is outside the range [1, 9223372036854775807]."},
        {"{\"prompt\":\"x\",\"top_k\":3000000000}", "top_k", "invalid_value",
         "Invalid value for 'top_k': 3000000000 is outside the range [-1, 2147483648]."},
        {"{\"prompt\":\"x\",\"top_k\":9007199254740993}", "top_k", "invalid_value",
         "Invalid value for 'top_k': 9007199254740993 is outside the range [-1, 2147483648]."},
        {"{\"prompt\":\"x\",\"logprobs\":6.0}", "logprobs", "invalid_value",
         "Invalid value for 'logprobs': 6.0 is outside the range [0, 5]."},
        {"{\"prompt\":\"x\",\"temperature\":2.0000001}", "temperature", "invalid_value",
         "Invalid value for 'temperature': 2.0000001 is outside the range [0, 2]."},
        {"{\"prompt\":\"x\",\"top_p\":-1e-300}", "top_p", "invalid_value",
         "Invalid value for 'top_p': -1e-300 is outside the range [0, 1]."},
        {"{\"prompt\":\"x\",\"seed\":123456789012345678901234567890123456789012345678901234567890}",
         "seed", "invalid_value",
         "Invalid value for 'seed': 1234567890123456789012345678901234567890... is outside the "
         "range [-9223372036854775808, 9223372036854775807]."},
        /* a fraction no double shows: not an integer */
        {"{\"prompt\":\"x\",\"seed\":9007199254740993.5}", "seed", "invalid_type",
         "Invalid type for 'seed': expected an integer, but got a number instead."},
        {"{\"prompt\":\"x\",\"max_tokens\":92233720368547758.075e2}", "max_tokens", "invalid_type",
         "Invalid type for 'max_tokens': expected an integer, but got a number instead."},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct parsed p = parse(API_COMPLETIONS, cases[i].body);
        ASSERT_REJECTED(p, 400, cases[i].param, cases[i].code);
        if (strcmp(p.err.message, cases[i].message) != 0)
            FAIL_AT("%s:\n    got  %s\n    want %s", cases[i].body, p.err.message,
                    cases[i].message);
    }
}

TEST_MAIN()
