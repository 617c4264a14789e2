/*
 * test_engine_requests.c: requests through a running engine thread
 * (engine_start, engine_submit, engine_drain), on the tiny fixture model
 * (tests/fixtures/norm_softmax.gguf: byte-level vocab, add_bos_token true)
 * and on the real SmolLM2 file (STREAMSINK_MODEL; those tests say SKIP and
 * pass when it is absent).
 *
 *  - Every rejection by the engine names the field at fault (param) and,
 *    where one applies, an OpenAI-style code.
 *  - engine_tokenize, then the ids path, gives the text path's prompt and
 *    generated tokens (greedy): BOS is added to ids exactly as to text (fresh
 *    sequences only, when the model wants it), and max_prompt_tokens counts
 *    it the same way.
 *  - engine_tokenize from several threads at once, while the engine thread
 *    generates, gives the single-threaded ids.
 *  - Stop strings of 254..256 bytes, taken from the model's own greedy text,
 *    end the request where the text first contains them (the reference is
 *    the full text, cut by memmem).
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/engine.h"
#include "engine/sampler.h"
#include "test.h"

#define FIXTURE SS_FIXTURES_DIR "/norm_softmax.gguf"
#define MAX_GEN 512
#define TEXT_CAP 16384

/* ---- a running engine ------------------------------------------------------ */

struct rig {
    struct engine *e;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int woken;
    uint64_t next_id;
};

static void rig_wake(void *arg)
{
    struct rig *r = arg;
    pthread_mutex_lock(&r->mu);
    r->woken = 1;
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

static struct engine_config rig_config(const char *path)
{
    struct engine_config c = engine_default_config();
    c.model_path = path;
    c.n_threads = 2;
    c.max_seqs = 8; /* requests of a test run side by side */
    c.max_queue = 8;
    c.window = 512;
    c.chunk = 128;
    c.max_step_tokens = 256;
    return c;
}

/* Returns 0, or -1 with the reason printed. */
static int rig_open(struct rig *r, const struct engine_config *c)
{
    char err[256];
    memset(r, 0, sizeof *r);
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    r->next_id = 1;
    if (engine_start(&r->e, c, rig_wake, r, err, sizeof err) < 0) {
        fprintf(stderr, "  engine_start(%s): %s\n", c->model_path, err);
        return -1;
    }
    return 0;
}

static void rig_close(struct rig *r)
{
    engine_stop(r->e);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
}

struct result {
    int error, status;
    char param[32], code[32], message[160];
    int32_t toks[MAX_GEN];
    int n_tok;
    char text[TEXT_CAP];
    size_t n_text;
    enum engine_finish finish;
    int64_t prompt_tokens, completion_tokens;
};

/* Waits (at most ~10 minutes) for the events of requests ids[0..n) until
 * they all end; other requests' events are dropped. */
static int rig_wait_all(struct rig *r, const uint64_t *ids, struct result **outs, int n_req)
{
    struct engine_event ev[32];
    int left = n_req;
    for (int k = 0; k < n_req; k++)
        memset(outs[k], 0, sizeof *outs[k]);
    for (int spins = 0; spins < 60000 && left > 0;) {
        size_t n = engine_drain(r->e, ev, 32);
        for (size_t i = 0; i < n; i++) {
            const struct engine_event *v = &ev[i];
            int k = 0;
            while (k < n_req && ids[k] != v->id)
                k++;
            if (k == n_req)
                continue;
            struct result *out = outs[k];
            if (v->kind == ENGINE_EV_TOKEN) {
                if (v->token >= 0 && out->n_tok < MAX_GEN)
                    out->toks[out->n_tok++] = v->token;
                if (out->n_text + v->text_len < TEXT_CAP) {
                    memcpy(out->text + out->n_text, v->text, v->text_len);
                    out->n_text += v->text_len;
                }
            } else if (v->kind == ENGINE_EV_DONE) {
                out->finish = v->finish;
                out->prompt_tokens = v->prompt_tokens;
                out->completion_tokens = v->completion_tokens;
                left--;
            } else {
                out->error = 1;
                out->status = v->status;
                memcpy(out->param, v->param, sizeof out->param);
                memcpy(out->code, v->code, sizeof out->code);
                memcpy(out->message, v->message, sizeof out->message);
                left--;
            }
        }
        if (n > 0)
            continue;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 10 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_mutex_lock(&r->mu);
        if (!r->woken)
            pthread_cond_timedwait(&r->cv, &r->mu, &ts);
        r->woken = 0;
        pthread_mutex_unlock(&r->mu);
        spins++;
    }
    if (left == 0)
        return 0;
    fprintf(stderr, "  %d requests did not end in time\n", left);
    return -1;
}

static int rig_wait(struct rig *r, uint64_t id, struct result *out)
{
    return rig_wait_all(r, &id, &out, 1);
}

/* A greedy request with nothing in it yet. */
static struct engine_request greedy(struct rig *r, int64_t max_tokens)
{
    struct engine_request q;
    memset(&q, 0, sizeof q);
    q.id = r->next_id++;
    q.max_tokens = max_tokens;
    q.sampling = sampler_default_params();
    q.sampling.temperature = 0;
    return q;
}

static void set_text(struct engine_request *q, const char *text, int add_bos, int parse_special)
{
    q->prompt_len = strlen(text);
    q->prompt = malloc(q->prompt_len + 1);
    memcpy(q->prompt, text, q->prompt_len + 1);
    q->add_bos = add_bos;
    q->parse_special = parse_special;
}

static void set_ids(struct engine_request *q, const int32_t *ids, int64_t n, int add_bos)
{
    q->prompt_ids = malloc((size_t)(n > 0 ? n : 1) * sizeof *ids);
    if (n > 0)
        memcpy(q->prompt_ids, ids, (size_t)n * sizeof *ids);
    q->n_prompt_ids = n;
    q->add_bos = add_bos;
}

/* Submits q (ownership moves) and collects its result. */
static int rig_run(struct rig *r, struct engine_request *q, struct result *out)
{
    uint64_t id = q->id;
    int rc = engine_submit(r->e, q);
    if (rc < 0) {
        engine_request_free(q);
        fprintf(stderr, "  engine_submit: %d\n", rc);
        return -1;
    }
    return rig_wait(r, id, out);
}

static int model_present(void)
{
    if (access(test_model_path(), R_OK) == 0)
        return 1;
    printf("  SKIP: no model at %s (run scripts/fetch-model.sh)\n", test_model_path());
    return 0;
}

/* ---- errors name their parameter -------------------------------------------- */

/* Runs q and checks that it fails with status, param and code. */
#define EXPECT_ERROR(rig, q, st, prm, cd)                                                          \
    do {                                                                                           \
        struct result *res_ = malloc(sizeof *res_);                                                \
        ASSERT(res_);                                                                              \
        int rc_ = rig_run(rig, q, res_);                                                           \
        int ok_ = rc_ == 0 && res_->error && res_->status == (st) &&                               \
                  strcmp(res_->param, prm) == 0 && strcmp(res_->code, cd) == 0;                    \
        if (!ok_)                                                                                  \
            fprintf(stderr, "  got error %d status %d param '%s' code '%s' (%s)\n", res_->error,   \
                    res_->status, res_->param, res_->code, res_->message);                         \
        free(res_);                                                                                \
        ASSERT(ok_);                                                                               \
    } while (0)

TEST(engine_errors_name_the_parameter_at_fault)
{
    struct rig rig;
    struct engine_config c = rig_config(FIXTURE);
    c.max_prompt_tokens = 40;
    c.window = 32;
    ASSERT_OK(rig_open(&rig, &c));
    const int64_t V = engine_model_info(rig.e)->n_vocab;
    struct engine_request q;
    int32_t ids[100];
    for (int i = 0; i < 100; i++)
        ids[i] = 'a' + i % 26;

    q = greedy(&rig, 4); /* a token outside the vocabulary */
    ids[3] = (int32_t)V;
    set_ids(&q, ids, 8, 0);
    ids[3] = 'd';
    EXPECT_ERROR(&rig, &q, 400, "prompt", "invalid_value");

    q = greedy(&rig, 4); /* nothing to feed */
    set_ids(&q, ids, 0, 0);
    EXPECT_ERROR(&rig, &q, 400, "prompt", "invalid_value");

    q = greedy(&rig, 4); /* over max_prompt_tokens, as ids and as text */
    set_ids(&q, ids, 41, 0);
    EXPECT_ERROR(&rig, &q, 400, "prompt", "context_length_exceeded");
    q = greedy(&rig, 4);
    set_text(&q, "the quick brown fox jumps over the lazy dog, twice!", 1, 0);
    EXPECT_ERROR(&rig, &q, 400, "prompt", "context_length_exceeded");

    q = greedy(&rig, 4); /* dense: 30 tokens fit the window of 32, 35 do not */
    set_ids(&q, ids, 30, 0);
    q.has_policy = 1;
    q.policy = (struct kv_policy){KV_POLICY_DENSE, 0};
    struct result *ok = malloc(sizeof *ok);
    ASSERT(ok);
    ASSERT_OK(rig_run(&rig, &q, ok));
    ASSERT(!ok->error);
    free(ok);
    q = greedy(&rig, 4);
    set_ids(&q, ids, 35, 0);
    q.has_policy = 1;
    q.policy = (struct kv_policy){KV_POLICY_DENSE, 0};
    EXPECT_ERROR(&rig, &q, 400, "prompt", "context_length_exceeded");

    q = greedy(&rig, 4); /* policies this server cannot serve */
    set_ids(&q, ids, 8, 0);
    q.has_policy = 1;
    q.policy = (struct kv_policy){KV_POLICY_RECOMPUTE, 0};
    EXPECT_ERROR(&rig, &q, 400, "kv_policy", "invalid_value");
    q = greedy(&rig, 4);
    set_ids(&q, ids, 8, 0);
    q.has_policy = 1;
    q.policy = (struct kv_policy){KV_POLICY_SINKS, c.max_sinks + 1};
    EXPECT_ERROR(&rig, &q, 400, "kv_policy", "invalid_value");

    static const struct {
        const char *param;
        float temperature, top_p, min_p, repeat_penalty;
        int64_t top_k;
    } bad[] = {
        {"temperature", -1, 1, 0, 1, 0},   {"top_p", 1, 0, 0, 1, 0},
        {"top_p", 1, 1.5f, 0, 1, 0},       {"min_p", 1, 1, 2, 1, 0},
        {"repeat_penalty", 1, 1, 0, 0, 0}, {"top_k", 1, 1, 0, 1, -3},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        q = greedy(&rig, 4);
        set_ids(&q, ids, 8, 0);
        q.sampling.temperature = bad[i].temperature;
        q.sampling.top_p = bad[i].top_p;
        q.sampling.min_p = bad[i].min_p;
        q.sampling.repeat_penalty = bad[i].repeat_penalty;
        q.sampling.top_k = bad[i].top_k;
        EXPECT_ERROR(&rig, &q, 400, bad[i].param, "invalid_value");
    }

    q = greedy(&rig, 4); /* a stop string over the limit */
    set_ids(&q, ids, 8, 0);
    q.stop[0] = malloc(ENGINE_MAX_STOP_LEN + 2);
    memset(q.stop[0], 'x', ENGINE_MAX_STOP_LEN + 1);
    q.stop[0][ENGINE_MAX_STOP_LEN + 1] = 0;
    EXPECT_ERROR(&rig, &q, 400, "stop", "invalid_value");

    /* a session busy with a request refuses a second one (the first runs
     * until cancelled: greedy on this prompt never gives EOS) */
    q = greedy(&rig, -1);
    set_ids(&q, ids, 8, 0);
    snprintf(q.session_id, sizeof q.session_id, "s1");
    uint64_t first = q.id;
    ASSERT_OK(engine_submit(rig.e, &q));
    engine_pause(rig.e, first);
    q = greedy(&rig, 4);
    set_ids(&q, ids, 8, 0);
    snprintf(q.session_id, sizeof q.session_id, "s1");
    EXPECT_ERROR(&rig, &q, 409, "session_id", "session_busy");
    engine_cancel(rig.e, first);
    struct result *end = malloc(sizeof *end);
    ASSERT(end);
    ASSERT_OK(rig_wait(&rig, first, end));
    if (end->error)
        fprintf(stderr, "  first: %d %s\n", end->status, end->message);
    ASSERT(!end->error);
    free(end);
    rig_close(&rig);
}

/* ---- BOS on the ids path ------------------------------------------------------ */

/* Runs each of texts[0..n) (parse_special special[i]) through the text
 * path and through engine_tokenize + the ids path, all side by side; each
 * pair must give the same prompt token count and generated tokens. With a
 * session (n == 1), the pair runs in sessions "<session>-text" and
 * "<session>-ids". */
static int same_as_text(struct rig *rig, const char *const *texts, const int *special, int n,
                        int add_bos, int64_t max_tokens, const char *session)
{
    enum { MAX_PAIRS = 8 };
    struct result *res[2 * MAX_PAIRS];
    uint64_t ids_of[2 * MAX_PAIRS];
    int ok = n <= MAX_PAIRS && (n == 1 || !session), made = 0;
    for (int i = 0; i < n && ok; i++) {
        int32_t *ids = NULL;
        int64_t m = engine_tokenize(rig->e, texts[i], strlen(texts[i]), special[i], &ids);
        if (m < 0) {
            fprintf(stderr, "  engine_tokenize: %lld\n", (long long)m);
            ok = 0;
            break;
        }
        for (int path = 0; path < 2; path++) {
            struct engine_request q = greedy(rig, max_tokens);
            if (path == 0)
                set_text(&q, texts[i], add_bos, special[i]);
            else
                set_ids(&q, ids, m, add_bos);
            q.parse_special = special[i];
            if (session)
                snprintf(q.session_id, sizeof q.session_id, "%s-%s", session,
                         path ? "ids" : "text");
            res[made] = malloc(sizeof *res[made]);
            ids_of[made] = q.id;
            if (!res[made] || engine_submit(rig->e, &q) < 0) {
                engine_request_free(&q);
                free(res[made]);
                ok = 0;
                break;
            }
            made++;
        }
        free(ids);
    }
    if (made == 0 || rig_wait_all(rig, ids_of, res, made) < 0)
        ok = 0;
    for (int k = 0; ok && k + 1 < made; k += 2) {
        const struct result *a = res[k], *b = res[k + 1];
        int same = !a->error && !b->error && a->prompt_tokens == b->prompt_tokens &&
                   a->n_tok == b->n_tok && a->n_tok > 0 &&
                   memcmp(a->toks, b->toks, (size_t)a->n_tok * sizeof(int32_t)) == 0;
        if (!same)
            fprintf(stderr,
                    "  \"%.40s\" (special %d): text path error %d, %lld prompt tokens, %d "
                    "generated; ids path error %d, %lld prompt tokens, %d generated\n",
                    texts[k / 2], special[k / 2], a->error, (long long)a->prompt_tokens, a->n_tok,
                    b->error, (long long)b->prompt_tokens, b->n_tok);
        ok = ok && same;
    }
    for (int k = 0; k < made; k++)
        free(res[k]);
    return ok;
}

TEST(ids_path_adds_bos_like_the_text_path_on_fresh_sequences_only)
{
    struct rig rig;
    struct engine_config c = rig_config(FIXTURE);
    ASSERT_OK(rig_open(&rig, &c));
    const struct engine_model_info *mi = engine_model_info(rig.e);
    ASSERT(mi->bos >= 0); /* the fixture wants BOS */
    const char *text = "hello world, hello streams";
    int64_t len = (int64_t)strlen(text);

    /* fresh, with add_bos: BOS + one token per byte, in both paths */
    const int no_special[1] = {0};
    ASSERT(same_as_text(&rig, &text, no_special, 1, 1, 16, NULL));
    struct result *r = malloc(sizeof *r);
    ASSERT(r);
    int32_t *ids = NULL;
    ASSERT_EQ(engine_tokenize(rig.e, text, (size_t)len, 0, &ids), len); /* never BOS */
    struct engine_request q = greedy(&rig, 4);
    set_ids(&q, ids, len, 1);
    ASSERT_OK(rig_run(&rig, &q, r));
    ASSERT_EQ(r->prompt_tokens, len + 1);
    q = greedy(&rig, 4); /* add_bos off: the ids as given */
    set_ids(&q, ids, len, 0);
    ASSERT_OK(rig_run(&rig, &q, r));
    ASSERT_EQ(r->prompt_tokens, len);
    free(ids);

    /* sessions: BOS on the first request, none on the continuation */
    const char *more = " and more";
    ASSERT(same_as_text(&rig, &text, no_special, 1, 1, 8, "a"));
    ASSERT(same_as_text(&rig, &more, no_special, 1, 1, 8, "a"));
    ASSERT(engine_tokenize(rig.e, " and more", 9, 0, &ids) == 9);
    q = greedy(&rig, 4);
    set_ids(&q, ids, 9, 1);
    snprintf(q.session_id, sizeof q.session_id, "a-ids");
    ASSERT_OK(rig_run(&rig, &q, r));
    ASSERT_EQ(r->prompt_tokens, 9);
    free(ids);
    free(r);
    rig_close(&rig);
}

TEST(max_prompt_tokens_counts_bos_the_same_in_both_paths)
{
    const char *text = "hello world"; /* 11 bytes: 12 tokens with BOS */
    int32_t ids[11];
    for (int i = 0; i < 11; i++)
        ids[i] = (unsigned char)text[i];
    for (int64_t limit = 11; limit <= 12; limit++) {
        struct rig rig;
        struct engine_config c = rig_config(FIXTURE);
        c.max_prompt_tokens = limit;
        ASSERT_OK(rig_open(&rig, &c));
        struct result *a = malloc(sizeof *a), *b = malloc(sizeof *b);
        ASSERT(a && b);
        struct engine_request q = greedy(&rig, 2);
        set_text(&q, text, 1, 0);
        ASSERT_OK(rig_run(&rig, &q, a));
        q = greedy(&rig, 2);
        set_ids(&q, ids, 11, 1);
        ASSERT_OK(rig_run(&rig, &q, b));
        ASSERT_EQ(a->error, limit < 12);
        ASSERT_EQ(b->error, a->error);
        ASSERT_STREQ(b->code, a->code);
        ASSERT_EQ(b->prompt_tokens, a->prompt_tokens);
        free(a);
        free(b);
        rig_close(&rig);
    }
}

/* ---- the real model ----------------------------------------------------------- */

static const char *const prompts[] = {
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nName three "
    "rivers in Europe.<|im_end|>\n<|im_start|>assistant\n",
    "The year 2024 had 366 days; 1,000,000 seconds is about 11.57 days.",
    "Caf\xc3\xa9 na\xc3\xafve \xe5\xad\x97 \xf0\x9f\x98\x80 -- def f(x):\n    return x ** 2\n",
    "   leading spaces,\ttabs\n\nand <|im_start|> as plain text",
};
#define N_PROMPTS (sizeof prompts / sizeof prompts[0])

TEST(engine_tokenize_then_ids_generates_what_the_text_path_generates)
{
    if (!model_present())
        return;
    struct rig rig;
    struct engine_config c = rig_config(test_model_path());
    ASSERT_OK(rig_open(&rig, &c));
    const char *texts[2 * N_PROMPTS];
    int special[2 * N_PROMPTS];
    for (size_t i = 0; i < 2 * N_PROMPTS; i++) {
        texts[i] = prompts[i / 2];
        special[i] = (int)(i % 2);
    }
    ASSERT(same_as_text(&rig, texts, special, 2 * N_PROMPTS, 1, 16, NULL));
    rig_close(&rig);
}

struct tok_job {
    const struct engine *e;
    int rounds;
    int64_t want_n[N_PROMPTS][2];
    int32_t *want[N_PROMPTS][2];
    int bad;
};

static void *tok_thread(void *arg)
{
    struct tok_job *j = arg;
    for (int r = 0; r < j->rounds; r++) {
        for (size_t i = 0; i < N_PROMPTS; i++) {
            size_t k = (i + (size_t)r) % N_PROMPTS; /* threads interleave different texts */
            for (int sp = 0; sp <= 1; sp++) {
                int32_t *ids = NULL;
                int64_t n = engine_tokenize(j->e, prompts[k], strlen(prompts[k]), sp, &ids);
                if (n != j->want_n[k][sp] ||
                    memcmp(ids, j->want[k][sp], (size_t)n * sizeof *ids) != 0)
                    j->bad++;
                free(ids);
            }
        }
    }
    return NULL;
}

TEST(engine_tokenize_from_several_threads_while_the_engine_generates)
{
    if (!model_present())
        return;
    struct rig rig;
    struct engine_config c = rig_config(test_model_path());
    ASSERT_OK(rig_open(&rig, &c));
    enum { N_THREADS = 4 };
    static struct tok_job jobs[N_THREADS];
    struct tok_job ref = {.e = rig.e};
    for (size_t i = 0; i < N_PROMPTS; i++)
        for (int sp = 0; sp <= 1; sp++) {
            ref.want_n[i][sp] =
                engine_tokenize(rig.e, prompts[i], strlen(prompts[i]), sp, &ref.want[i][sp]);
            ASSERT(ref.want_n[i][sp] > 0);
        }
    /* a long text too: the encoder's scratch grows while others run */
    struct engine_request q = greedy(&rig, 48);
    set_text(&q, prompts[0], 1, 1);
    uint64_t gen_id = q.id;
    ASSERT_OK(engine_submit(rig.e, &q));
    pthread_t th[N_THREADS];
    for (int t = 0; t < N_THREADS; t++) {
        jobs[t] = ref;
        jobs[t].rounds = 40;
        ASSERT_EQ(pthread_create(&th[t], NULL, tok_thread, &jobs[t]), 0);
    }
    int bad = 0;
    for (int t = 0; t < N_THREADS; t++) {
        pthread_join(th[t], NULL);
        bad += jobs[t].bad;
    }
    struct result *r = malloc(sizeof *r);
    ASSERT(r);
    ASSERT_OK(rig_wait(&rig, gen_id, r));
    if (r->error)
        fprintf(stderr, "  generation: %d %s\n", r->status, r->message);
    ASSERT(!r->error);
    free(r);
    for (size_t i = 0; i < N_PROMPTS; i++)
        for (int sp = 0; sp <= 1; sp++)
            free(ref.want[i][sp]);
    ASSERT_EQ(bad, 0);
    /* errors: NULL text with a length; empty text is no tokens, with an array */
    int32_t dummy[1];
    int32_t *ids = dummy;
    ASSERT_EQ(engine_tokenize(rig.e, NULL, 3, 0, &ids), -EINVAL);
    ASSERT(ids == NULL);
    ASSERT_EQ(engine_tokenize(rig.e, "", 0, 0, &ids), 0);
    ASSERT(ids != NULL);
    free(ids);
    rig_close(&rig);
}

/* First occurrence of s in t, or -1. */
static long find(const char *t, size_t n, const char *s, size_t sl)
{
    for (size_t p = 0; p + sl <= n; p++)
        if (memcmp(t + p, s, sl) == 0)
            return (long)p;
    return -1;
}

TEST(stop_strings_of_254_to_256_bytes_end_generation_where_they_first_occur)
{
    if (!model_present())
        return;
    struct rig rig;
    struct engine_config c = rig_config(test_model_path());
    ASSERT_OK(rig_open(&rig, &c));
    const char *prompt = "<|im_start|>user\nWrite a long story about a lighthouse keeper and "
                         "the sea.<|im_end|>\n<|im_start|>assistant\n";
    enum { N_STOP = 6, GEN = 120 };
    struct result *full = malloc(sizeof *full), *res[N_STOP];
    uint64_t ids[N_STOP];
    long want[N_STOP];
    ASSERT(full);
    struct engine_request q = greedy(&rig, GEN);
    set_text(&q, prompt, 1, 1);
    ASSERT_OK(rig_run(&rig, &q, full));
    ASSERT(!full->error);
    printf("  greedy text without stops: %zu bytes, %d tokens\n", full->n_text, full->n_tok);
    ASSERT(full->n_text > 400);
    /* stops of 254, 255, 256 bytes from near the start and from later on:
     * the request must end where the text first contains them */
    for (int k = 0; k < N_STOP; k++) {
        size_t len = 254 + (size_t)(k % 3);
        size_t start = k < 3 ? 1 + (size_t)k : full->n_text - len - 40 - 13 * (size_t)k;
        while (((unsigned char)full->text[start] & 0xC0) == 0x80)
            start++; /* a character boundary */
        char stop[ENGINE_MAX_STOP_LEN + 1];
        memcpy(stop, full->text + start, len);
        stop[len] = 0;
        want[k] = find(full->text, full->n_text, stop, len); /* may be before start */
        ASSERT(want[k] >= 0);
        q = greedy(&rig, GEN);
        set_text(&q, prompt, 1, 1);
        q.stop[0] = strdup("a string that is never generated");
        q.stop[1] = strdup(stop);
        ids[k] = q.id;
        res[k] = malloc(sizeof *res[k]);
        ASSERT(res[k]);
        ASSERT_OK(engine_submit(rig.e, &q));
    }
    ASSERT_OK(rig_wait_all(&rig, ids, res, N_STOP));
    for (int k = 0; k < N_STOP; k++) {
        const struct result *r = res[k];
        int ok = !r->error && r->n_text == (size_t)want[k] &&
                 memcmp(r->text, full->text, (size_t)want[k]) == 0 &&
                 r->finish == ENGINE_FINISH_STOP;
        if (!ok)
            fprintf(stderr, "  stop %d of %d bytes, first at %ld: got %zu bytes, finish %d\n", k,
                    254 + k % 3, want[k], r->n_text, (int)r->finish);
        ASSERT(ok);
        free(res[k]);
    }
    free(full);
    rig_close(&rig);
}

TEST_MAIN()
