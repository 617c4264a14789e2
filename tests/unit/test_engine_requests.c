/*
 * test_engine_requests.c: requests through a running engine thread
 * (engine_start, engine_submit, engine_drain) on the tiny fixture model
 * (tests/fixtures/norm_softmax.gguf: byte-level vocab, add_bos_token true).
 *
 *  - Every rejection by the engine names the field at fault (param) and,
 *    where one applies, an OpenAI-style code.
 *  - BOS is added to ids exactly as to text (fresh sequences only, when the
 *    model wants it): the text path and engine_tokenize + the ids path give
 *    the same prompt tokens and greedy generations, in sessions too, and
 *    max_prompt_tokens counts BOS the same way in both.
 *  - Seeded sampled requests running side by side give the tokens and
 *    log-probs each gives alone: the streams of a step are sampled in
 *    parallel on the backend's threads, each with its sequence's scratch row
 *    (under ThreadSanitizer in scripts/test.sh).
 *  - An echoed prompt's log-probs are a decoder's fed one token at a time,
 *    through chunks and a window it overflows, and equal alone or batched.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "decoder.h"
#include "support/engine_rig.h"
#include "support/json_oracle.h"
#include "test.h"

/* ---- errors name their parameter -------------------------------------------- */

/* Runs q and checks that it fails with status, param and code. */
#define EXPECT_ERROR(rig, q, st, prm, cd)                                                          \
    do {                                                                                           \
        struct rig_result *res_ = malloc(sizeof *res_);                                            \
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
    struct engine_config c = rig_config(RIG_FIXTURE);
    c.max_prompt_tokens = 40;
    c.window = 32;
    ASSERT_OK(rig_open(&rig, &c));
    const int64_t V = engine_model_info(rig.e)->n_vocab;
    struct engine_request q;
    int32_t ids[100];
    for (int i = 0; i < 100; i++)
        ids[i] = 'a' + i % 26;

    q = rig_greedy(&rig, 4); /* a token outside the vocabulary */
    ids[3] = (int32_t)V;
    rig_set_ids(&q, ids, 8, 0);
    ids[3] = 'd';
    EXPECT_ERROR(&rig, &q, 400, "prompt", "invalid_value");

    q = rig_greedy(&rig, 4); /* nothing to feed */
    rig_set_ids(&q, ids, 0, 0);
    EXPECT_ERROR(&rig, &q, 400, "prompt", "invalid_value");

    q = rig_greedy(&rig, 4); /* over max_prompt_tokens, as ids and as text */
    rig_set_ids(&q, ids, 41, 0);
    EXPECT_ERROR(&rig, &q, 400, "prompt", "context_length_exceeded");
    q = rig_greedy(&rig, 4);
    rig_set_text(&q, "the quick brown fox jumps over the lazy dog, twice!", 1, 0);
    EXPECT_ERROR(&rig, &q, 400, "prompt", "context_length_exceeded");

    q = rig_greedy(&rig, 4); /* dense: 30 tokens fit the window of 32, 35 do not */
    rig_set_ids(&q, ids, 30, 0);
    q.has_policy = 1;
    q.policy = (struct engine_policy){ENGINE_POLICY_DENSE, 0};
    struct rig_result *ok = malloc(sizeof *ok);
    ASSERT(ok);
    ASSERT_OK(rig_run(&rig, &q, ok));
    ASSERT(!ok->error);
    free(ok);
    q = rig_greedy(&rig, 4);
    rig_set_ids(&q, ids, 35, 0);
    q.has_policy = 1;
    q.policy = (struct engine_policy){ENGINE_POLICY_DENSE, 0};
    EXPECT_ERROR(&rig, &q, 400, "prompt", "context_length_exceeded");

    q = rig_greedy(&rig, 4); /* policies this server cannot serve */
    rig_set_ids(&q, ids, 8, 0);
    q.has_policy = 1;
    q.policy = (struct engine_policy){ENGINE_POLICY_RECOMPUTE, 0};
    EXPECT_ERROR(&rig, &q, 400, "kv_policy", "invalid_value");
    q = rig_greedy(&rig, 4);
    rig_set_ids(&q, ids, 8, 0);
    q.has_policy = 1;
    q.policy = (struct engine_policy){ENGINE_POLICY_SINKS, c.max_sinks + 1};
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
        q = rig_greedy(&rig, 4);
        rig_set_ids(&q, ids, 8, 0);
        q.sampling.temperature = bad[i].temperature;
        q.sampling.top_p = bad[i].top_p;
        q.sampling.min_p = bad[i].min_p;
        q.sampling.repeat_penalty = bad[i].repeat_penalty;
        q.sampling.top_k = bad[i].top_k;
        EXPECT_ERROR(&rig, &q, 400, bad[i].param, "invalid_value");
    }

    q = rig_greedy(&rig, 4); /* a stop string over the limit */
    rig_set_ids(&q, ids, 8, 0);
    q.stop[0] = malloc(ENGINE_MAX_STOP_LEN + 2);
    memset(q.stop[0], 'x', ENGINE_MAX_STOP_LEN + 1);
    q.stop[0][ENGINE_MAX_STOP_LEN + 1] = 0;
    EXPECT_ERROR(&rig, &q, 400, "stop", "invalid_value");

    /* a session busy with a request refuses a second one (the first runs
     * until cancelled: greedy on this prompt never gives EOS) */
    q = rig_greedy(&rig, -1);
    rig_set_ids(&q, ids, 8, 0);
    snprintf(q.session_id, sizeof q.session_id, "s1");
    uint64_t first = q.id;
    ASSERT_OK(engine_submit(rig.e, &q));
    engine_pause(rig.e, first);
    q = rig_greedy(&rig, 4);
    rig_set_ids(&q, ids, 8, 0);
    snprintf(q.session_id, sizeof q.session_id, "s1");
    EXPECT_ERROR(&rig, &q, 409, "session_id", "session_busy");
    engine_cancel(rig.e, first);
    struct rig_result *end = malloc(sizeof *end);
    ASSERT(end);
    ASSERT_OK(rig_wait(&rig, first, end));
    if (end->error)
        fprintf(stderr, "  first: %d %s\n", end->status, end->message);
    ASSERT(!end->error);
    free(end);
    rig_close(&rig);
}

/* ---- BOS on the ids path ------------------------------------------------------ */

TEST(ids_path_adds_bos_like_the_text_path_on_fresh_sequences_only)
{
    struct rig rig;
    struct engine_config c = rig_config(RIG_FIXTURE);
    ASSERT_OK(rig_open(&rig, &c));
    const struct engine_model_info *mi = engine_model_info(rig.e);
    ASSERT(mi->bos >= 0); /* the fixture wants BOS */
    const char *text = "hello world, hello streams";
    int64_t len = (int64_t)strlen(text);

    /* fresh, with add_bos: BOS + one token per byte, in both paths */
    const int no_special[1] = {0};
    ASSERT(rig_same_as_text(&rig, &text, no_special, 1, 1, 16, NULL));
    struct rig_result *r = malloc(sizeof *r);
    ASSERT(r);
    int32_t *ids = NULL;
    ASSERT_EQ(engine_tokenize(rig.e, text, (size_t)len, 0, &ids), len); /* never BOS */
    struct engine_request q = rig_greedy(&rig, 4);
    rig_set_ids(&q, ids, len, 1);
    ASSERT_OK(rig_run(&rig, &q, r));
    ASSERT_EQ(r->prompt_tokens, len + 1);
    q = rig_greedy(&rig, 4); /* add_bos off: the ids as given */
    rig_set_ids(&q, ids, len, 0);
    ASSERT_OK(rig_run(&rig, &q, r));
    ASSERT_EQ(r->prompt_tokens, len);
    free(ids);

    /* sessions: BOS on the first request, none on the continuation */
    const char *more = " and more";
    ASSERT(rig_same_as_text(&rig, &text, no_special, 1, 1, 8, "a"));
    ASSERT(rig_same_as_text(&rig, &more, no_special, 1, 1, 8, "a"));
    ASSERT(engine_tokenize(rig.e, " and more", 9, 0, &ids) == 9);
    q = rig_greedy(&rig, 4);
    rig_set_ids(&q, ids, 9, 1);
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
        struct engine_config c = rig_config(RIG_FIXTURE);
        c.max_prompt_tokens = limit;
        ASSERT_OK(rig_open(&rig, &c));
        struct rig_result *a = malloc(sizeof *a), *b = malloc(sizeof *b);
        ASSERT(a && b);
        struct engine_request q = rig_greedy(&rig, 2);
        rig_set_text(&q, text, 1, 0);
        ASSERT_OK(rig_run(&rig, &q, a));
        q = rig_greedy(&rig, 2);
        rig_set_ids(&q, ids, 11, 1);
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

/* ---- a pause that comes while the request waits for a slot ------------------- */

/* Two requests' tokens and ends, as the events come. */
struct two {
    uint64_t id[2];
    int n[2], done[2];
    int events[2];                /* of any kind */
    enum engine_finish finish[2]; /* of the DONE */
};

/* Drains events for about ms milliseconds, or until request k ends. */
static void drain_for(struct rig *r, int ms, struct two *t, int k)
{
    struct engine_event ev[32];
    for (int waited = 0; waited < ms && !t->done[k];) {
        size_t got = engine_drain(r->e, ev, 32);
        for (size_t i = 0; i < got; i++) {
            for (int j = 0; j < 2; j++) {
                if (ev[i].id != t->id[j])
                    continue;
                t->events[j]++;
                if (ev[i].kind == ENGINE_EV_TOKEN && ev[i].token >= 0) {
                    t->n[j]++;
                } else if (ev[i].kind != ENGINE_EV_TOKEN) {
                    t->done[j] = 1;
                    t->finish[j] = ev[i].finish;
                }
            }
        }
        if (got == 0) {
            struct timespec ts = {0, 10 * 1000 * 1000};
            nanosleep(&ts, NULL);
            waited += 10;
        }
    }
}

/* Opens rig with one slot, taken by an endless request a that has made
 * tokens, then submits b (at most 5 tokens), which waits for the slot. t
 * holds both ids. */
static void one_slot_taken(int *failed, struct rig *rig, struct two *t)
{
    struct engine_config c = rig_config(RIG_FIXTURE);
    c.max_seqs = 1;
    c.max_queue = 4;
    ASSERT_OK(rig_open(rig, &c));
    int32_t ids[8] = {'a', 'b', 'c', 'd', 'e', 'f', 'g', 'h'};
    struct engine_request qa = rig_greedy(rig, 1000000);
    rig_set_ids(&qa, ids, 8, 1);
    struct engine_request qb = rig_greedy(rig, 5);
    rig_set_ids(&qb, ids, 8, 1);
    *t = (struct two){.id = {qa.id, qb.id}};
    ASSERT_OK(engine_submit(rig->e, &qa));
    for (int i = 0; i < 100 && t->n[0] == 0 && !t->done[0]; i++)
        drain_for(rig, 100, t, 0);
    ASSERT(t->n[0] > 0 && !t->done[0]); /* a holds the only slot */
    ASSERT_OK(engine_submit(rig->e, &qb));
}

TEST(a_pause_sent_while_the_request_waits_for_a_slot_holds_once_it_is_admitted)
{
    struct rig rig;
    struct two t;
    one_slot_taken(failed, &rig, &t);
    if (*failed)
        return;
    engine_pause(rig.e, t.id[1]);  /* b is queued, not running */
    engine_cancel(rig.e, t.id[0]); /* b gets the slot */
    for (int i = 0; i < 100 && !t.done[0]; i++)
        drain_for(&rig, 100, &t, 0);
    ASSERT(t.done[0]);
    drain_for(&rig, 600, &t, 1);
    ASSERT_EQ(t.n[1], 0); /* admitted paused: no token until it is resumed */
    ASSERT(!t.done[1]);
    struct engine_stats st;
    engine_get_stats(rig.e, &st);
    ASSERT_EQ(st.active_seqs, 1);
    ASSERT_EQ(st.paused_seqs, 1);
    engine_resume(rig.e, t.id[1]);
    for (int i = 0; i < 100 && !t.done[1]; i++)
        drain_for(&rig, 100, &t, 1);
    ASSERT(t.done[1]);
    ASSERT(t.n[1] >= 1 && t.n[1] <= 5);
    rig_close(&rig);
}

/* Every request that was not over yet ends with one DONE when cancelled,
 * also one still waiting for a slot: a caller that waits for the end of a
 * cancelled request (the server's cut at shutdown) always gets it. */
TEST(a_request_cancelled_while_it_waits_for_a_slot_ends_with_done_cancelled)
{
    struct rig rig;
    struct two t;
    one_slot_taken(failed, &rig, &t);
    if (*failed)
        return;
    engine_cancel(rig.e, t.id[1]);
    for (int i = 0; i < 50 && !t.done[1]; i++)
        drain_for(&rig, 100, &t, 1);
    ASSERT(t.done[1]);
    ASSERT_EQ(t.finish[1], ENGINE_FINISH_CANCELLED);
    ASSERT_EQ(t.events[1], 1);     /* its DONE alone: no token, no error */
    engine_cancel(rig.e, t.id[1]); /* over: a second cancel brings nothing */
    engine_cancel(rig.e, t.id[0]);
    for (int i = 0; i < 100 && !t.done[0]; i++)
        drain_for(&rig, 100, &t, 0);
    ASSERT(t.done[0]);
    t.done[1] = 0;
    drain_for(&rig, 300, &t, 1);
    ASSERT_EQ(t.events[1], 1);
    rig_close(&rig);
}

/* ---- sampled streams side by side -------------------------------------------- */

#define N_SAMPLED 4

/* Request k of the side-by-side test: seeded, sampled, half with log-probs. */
static struct engine_request sampled(struct rig *rig, int k)
{
    static const int32_t ids[4][6] = {{'t', 'h', 'e', ' ', 'c', 'a'},
                                      {'o', 'n', 'c', 'e', ' ', 'u'},
                                      {'t', 'h', 'e', ' ', 'c', 'a'},
                                      {'a', 'b', 'c', ' ', 'x', 'y'}};
    struct engine_request q = rig_greedy(rig, 16);
    rig_set_ids(&q, ids[k], 6, 1);
    q.sampling.temperature = 1.0f;
    q.sampling.top_p = 0.9f;
    q.sampling.seed = 77 + (uint64_t)k;
    q.logprobs = 1;
    q.top_logprobs = k % 2 ? 2 : 0;
    return q;
}

TEST(sampled_streams_side_by_side_equal_their_solo_runs)
{
    struct rig rig;
    struct engine_config c = rig_config(RIG_FIXTURE);
    c.n_threads = 2;
    c.max_seqs = N_SAMPLED;
    c.max_queue = N_SAMPLED;
    ASSERT_OK(rig_open(&rig, &c));
    static struct rig_result solo[N_SAMPLED], together[N_SAMPLED];
    for (int k = 0; k < N_SAMPLED; k++) {
        struct engine_request q = sampled(&rig, k);
        ASSERT_OK(rig_run(&rig, &q, &solo[k]));
        ASSERT(!solo[k].error && solo[k].n_tok > 0);
    }
    uint64_t ids[N_SAMPLED];
    struct rig_result *outs[N_SAMPLED];
    for (int k = 0; k < N_SAMPLED; k++) {
        struct engine_request q = sampled(&rig, k);
        ids[k] = q.id;
        outs[k] = &together[k];
        ASSERT_OK(engine_submit(rig.e, &q));
    }
    ASSERT_OK(rig_wait_all(&rig, ids, outs, N_SAMPLED));
    for (int k = 0; k < N_SAMPLED; k++) {
        ASSERT_EQ(together[k].n_tok, solo[k].n_tok);
        ASSERT(memcmp(together[k].toks, solo[k].toks, (size_t)solo[k].n_tok * 4) == 0);
        /* no stop strings: every token's log-probs, in order */
        ASSERT_EQ(solo[k].n_lp, solo[k].n_tok);
        ASSERT_EQ(together[k].n_lp, solo[k].n_tok);
        ASSERT(memcmp(solo[k].lp_tok, solo[k].toks, (size_t)solo[k].n_tok * 4) == 0);
        ASSERT(memcmp(together[k].logprob, solo[k].logprob, (size_t)solo[k].n_tok * 4) == 0);
        ASSERT(memcmp(together[k].top_id, solo[k].top_id, (size_t)solo[k].n_tok * 4) == 0);
        int some_below_zero = 0;
        for (int i = 0; i < solo[k].n_tok; i++) {
            ASSERT(solo[k].logprob[i] <= 0);
            ASSERT((solo[k].top_id[i] >= 0) == (k % 2 == 1));
            some_below_zero |= solo[k].logprob[i] < 0;
        }
        ASSERT(some_below_zero);
    }
    /* the same prompt with another seed samples another stream */
    ASSERT(solo[0].n_tok != solo[2].n_tok ||
           memcmp(solo[0].toks, solo[2].toks, (size_t)solo[0].n_tok * 4) != 0);
    rig_close(&rig);
}

/* ---- n choices ------------------------------------------------------------------ */

#define N_CHOICES 3

/* got, one choice of a request, is want, the request of one run alone:
 * tokens, text, log-probs, finish and usage; it ended once. */
static void same_answer(int *failed, const struct rig_result *got, const struct rig_result *want)
{
    ASSERT(!got->error);
    ASSERT_EQ(got->ended, 1);
    ASSERT_EQ(got->n_tok, want->n_tok);
    ASSERT(memcmp(got->toks, want->toks, (size_t)want->n_tok * 4) == 0);
    ASSERT_EQ(got->n_text, want->n_text);
    ASSERT(memcmp(got->text, want->text, want->n_text) == 0);
    ASSERT_EQ(got->n_lp, want->n_lp);
    ASSERT(memcmp(got->logprob, want->logprob, (size_t)want->n_lp * 4) == 0);
    ASSERT_EQ(got->finish, want->finish);
    ASSERT_EQ(got->prompt_tokens, want->prompt_tokens);
    ASSERT_EQ(got->completion_tokens, want->completion_tokens);
}

/* A request of n choices is n requests of one, seeds one apart: choice i's
 * tokens, text, log-probs, finish and usage are those of a request of one
 * with seed + i run alone, and every choice ends with its own DONE. */
TEST(choices_equal_requests_of_one_with_seeds_one_apart)
{
    struct rig rig;
    struct engine_config c = rig_config(RIG_FIXTURE);
    c.max_seqs = N_CHOICES;
    c.max_queue = 2;
    ASSERT_OK(rig_open(&rig, &c));
    static struct rig_result solo[N_CHOICES], choice[N_CHOICES];
    struct rig_result *outs[N_CHOICES];
    for (int echo = 0; echo < 2; echo++) {
        for (int k = 0; k < N_CHOICES; k++) {
            struct engine_request q = sampled(&rig, 1);
            q.sampling.seed = 500 + (uint64_t)k;
            q.echo = echo;
            ASSERT_OK(rig_run(&rig, &q, &solo[k]));
            ASSERT(!solo[k].error && solo[k].n_tok > 0);
            outs[k] = &choice[k];
        }
        struct engine_request q = sampled(&rig, 1);
        q.sampling.seed = 500;
        q.echo = echo;
        q.n_choices = N_CHOICES;
        uint64_t id = q.id;
        struct engine_stats before, after;
        engine_get_stats(rig.e, &before);
        ASSERT_OK(engine_submit(rig.e, &q));
        ASSERT_OK(rig_wait_choices(&rig, id, outs, N_CHOICES));
        engine_get_stats(rig.e, &after);
        /* the first choice prefills the prompt for all, unless each scores
         * it (echo) */
        /* (less what a free slot held: prefix.h) */
        ASSERT_EQ(after.prompt_tokens_total - before.prompt_tokens_total +
                      after.prompt_tokens_cached_total - before.prompt_tokens_cached_total,
                  solo[0].prompt_tokens * (echo ? N_CHOICES : 1));
        for (int k = 0; k < N_CHOICES; k++) {
            same_answer(failed, &choice[k], &solo[k]);
            if (*failed)
                return;
        }
        /* the seeds sample different answers */
        ASSERT(solo[0].n_tok != solo[1].n_tok ||
               memcmp(solo[0].toks, solo[1].toks, (size_t)solo[0].n_tok * 4) != 0);
    }
    rig_close(&rig);
}

/* The prompt the first choice prefills and the others take is exact when
 * it is longer than the window and prefilled in chunks (the ring wraps,
 * sinks pinned): each choice still equals its request of one. */
TEST(choices_share_a_prompt_longer_than_the_window_exactly)
{
    struct rig rig;
    struct engine_config c = rig_config(RIG_FIXTURE);
    c.max_seqs = N_CHOICES;
    c.window = 24;
    c.chunk = 8;
    c.max_step_tokens = 16;
    ASSERT_OK(rig_open(&rig, &c));
    int32_t ids[90];
    for (int i = 0; i < 90; i++)
        ids[i] = 'a' + (i * 7) % 26;
    static struct rig_result solo[N_CHOICES], choice[N_CHOICES];
    struct rig_result *outs[N_CHOICES];
    for (int pol = 0; pol < 2; pol++) {
        for (int k = 0; k <= N_CHOICES; k++) {
            struct engine_request q = rig_greedy(&rig, 20);
            rig_set_ids(&q, ids, 90, 1);
            q.sampling.temperature = 1.0f;
            q.sampling.seed = 40 + (uint64_t)(k % N_CHOICES);
            q.has_policy = 1;
            q.policy = pol ? (struct engine_policy){ENGINE_POLICY_SINKS, 4}
                           : (struct engine_policy){ENGINE_POLICY_WINDOW, 0};
            if (k < N_CHOICES) {
                ASSERT_OK(rig_run(&rig, &q, &solo[k]));
                ASSERT(!solo[k].error && solo[k].n_tok == 20);
                outs[k] = &choice[k];
                continue;
            }
            q.sampling.seed = 40;
            q.n_choices = N_CHOICES;
            uint64_t id = q.id;
            ASSERT_OK(engine_submit(rig.e, &q));
            ASSERT_OK(rig_wait_choices(&rig, id, outs, N_CHOICES));
        }
        for (int k = 0; k < N_CHOICES; k++) {
            ASSERT_EQ(choice[k].n_tok, solo[k].n_tok);
            ASSERT(memcmp(choice[k].toks, solo[k].toks, (size_t)solo[k].n_tok * 4) == 0);
        }
        ASSERT(memcmp(solo[0].toks, solo[1].toks, (size_t)solo[0].n_tok * 4) != 0);
    }
    rig_close(&rig);
}

/* A request with score ends each choice with the sum of its tokens'
 * log-probs: those the same request reports when it asks for log-probs,
 * summed in order; the tokens do not change. Choices share a prompt (the
 * siblings' rows are copies) and score as requests of one. */
TEST(a_scored_choice_ends_with_the_sum_of_its_tokens_logprobs)
{
    struct rig rig;
    struct engine_config c = rig_config(RIG_FIXTURE);
    c.max_seqs = N_CHOICES;
    ASSERT_OK(rig_open(&rig, &c));
    static struct rig_result asked[N_CHOICES], scored[N_CHOICES];
    struct rig_result *outs[N_CHOICES];
    for (int k = 0; k < N_CHOICES; k++) {
        struct engine_request q = sampled(&rig, 0); /* log-probs, no alternatives */
        q.sampling.seed = 900 + (uint64_t)k;
        ASSERT_OK(rig_run(&rig, &q, &asked[k]));
        ASSERT(!asked[k].error && asked[k].n_lp == asked[k].n_tok && asked[k].n_tok > 1);
        ASSERT(asked[k].lp_sum == 0); /* not asked for */
        outs[k] = &scored[k];
    }
    struct engine_request q = sampled(&rig, 0);
    q.logprobs = 0;
    q.sampling.seed = 900;
    q.n_choices = N_CHOICES;
    q.score = 1;
    uint64_t id = q.id;
    ASSERT_OK(engine_submit(rig.e, &q));
    ASSERT_OK(rig_wait_choices(&rig, id, outs, N_CHOICES));
    for (int k = 0; k < N_CHOICES; k++) {
        ASSERT_EQ(scored[k].n_lp, 0); /* the events carry none */
        ASSERT_EQ(scored[k].n_tok, asked[k].n_tok);
        ASSERT(memcmp(scored[k].toks, asked[k].toks, (size_t)asked[k].n_tok * 4) == 0);
        double sum = 0;
        for (int i = 0; i < asked[k].n_lp; i++)
            sum += (double)asked[k].logprob[i];
        ASSERT(sum < 0);
        ASSERT(scored[k].lp_sum == sum);
    }
    rig_close(&rig);
}

/* Events of request id, by choice, for the tests below. */
struct choice_track {
    uint64_t id;
    int tokens[N_CHOICES + 1], dones[N_CHOICES + 1];
    enum engine_finish finish[N_CHOICES + 1];
    int over;           /* the DONE with choices_left 0 came */
    uint64_t first_out; /* its first token's place among all tokens tracked (0: none yet) */
};

/* Drains for about ms milliseconds, routing the events of the tracked
 * requests. */
static void track_for(struct rig *r, int ms, struct choice_track *t, int n)
{
    static uint64_t tokens_seen;
    struct engine_event ev[32];
    for (int waited = 0; waited < ms;) {
        size_t got = engine_drain(r->e, ev, 32);
        for (size_t i = 0; i < got; i++) {
            for (int j = 0; j < n; j++) {
                if (ev[i].id != t[j].id || ev[i].choice < 0 || ev[i].choice > N_CHOICES)
                    continue;
                if (ev[i].kind == ENGINE_EV_TOKEN && ev[i].token >= 0) {
                    t[j].tokens[ev[i].choice]++;
                    if (!t[j].first_out)
                        t[j].first_out = ++tokens_seen;
                }
                if (ev[i].kind == ENGINE_EV_DONE) {
                    t[j].dones[ev[i].choice]++;
                    t[j].finish[ev[i].choice] = ev[i].finish;
                    t[j].over |= ev[i].choices_left == 0;
                }
                if (ev[i].kind == ENGINE_EV_ERROR)
                    t[j].over = -1;
            }
        }
        if (got == 0) {
            struct timespec ts = {0, 10 * 1000 * 1000};
            nanosleep(&ts, NULL);
            waited += 10;
        }
    }
}

/* A request of three choices waits until three slots are free, and later
 * requests of one that need a slot (no session, or a new one) wait behind
 * it rather than taking a slot as one frees; pause and resume hold and free
 * all three; a cancel ends each with its DONE, the last ending the
 * request. */
TEST(choices_wait_for_their_slots_together_and_a_cancel_ends_them_all)
{
    struct rig rig;
    struct engine_config c = rig_config(RIG_FIXTURE);
    c.max_seqs = N_CHOICES;
    c.max_queue = 4;
    ASSERT_OK(rig_open(&rig, &c));
    int32_t ids[8] = {'a', 'b', 'c', 'd', 'e', 'f', 'g', 'h'};
    struct choice_track t[4];
    memset(t, 0, sizeof t);
    struct engine_request qa = rig_greedy(&rig, 1000000); /* endless: holds a slot */
    rig_set_ids(&qa, ids, 8, 1);
    struct engine_request qb = rig_greedy(&rig, 1000000);
    rig_set_ids(&qb, ids, 8, 1);
    qb.n_choices = N_CHOICES;
    struct engine_request qc = rig_greedy(&rig, 4);
    rig_set_ids(&qc, ids, 8, 1);
    struct engine_request qd = rig_greedy(&rig, 4); /* starts a session: needs a slot */
    rig_set_ids(&qd, ids, 8, 1);
    snprintf(qd.session_id, sizeof qd.session_id, "later");
    t[0].id = qa.id, t[1].id = qb.id, t[2].id = qc.id, t[3].id = qd.id;
    ASSERT_OK(engine_submit(rig.e, &qa));
    for (int i = 0; i < 100 && t[0].tokens[0] == 0; i++)
        track_for(&rig, 100, t, 4);
    ASSERT(t[0].tokens[0] > 0);
    ASSERT_OK(engine_submit(rig.e, &qb)); /* two slots free: it waits */
    ASSERT_OK(engine_submit(rig.e, &qc)); /* one would fit; it waits behind b */
    ASSERT_OK(engine_submit(rig.e, &qd)); /* so does a new session */
    track_for(&rig, 500, t, 4);
    for (int k = 0; k < N_CHOICES; k++)
        ASSERT_EQ(t[1].tokens[k] + t[1].dones[k], 0);
    ASSERT_EQ(t[2].tokens[0] + t[2].dones[0], 0);
    ASSERT_EQ(t[3].tokens[0] + t[3].dones[0], 0);

    engine_cancel(rig.e, t[0].id); /* three slots: b runs, all its choices */
    for (int i = 0; i < 100 && (t[1].tokens[0] == 0 || t[1].tokens[1] == 0 || t[1].tokens[2] == 0);
         i++)
        track_for(&rig, 100, t, 4);
    ASSERT(t[0].over == 1);
    for (int k = 0; k < N_CHOICES; k++)
        ASSERT(t[1].tokens[k] > 0);
    ASSERT_EQ(t[2].tokens[0] + t[2].dones[0], 0); /* no slot for c or d while b runs */
    ASSERT_EQ(t[3].tokens[0] + t[3].dones[0], 0);

    engine_pause(rig.e, t[1].id);
    track_for(&rig, 300, t, 4); /* what was made before the pause took */
    int before[N_CHOICES];
    for (int k = 0; k < N_CHOICES; k++)
        before[k] = t[1].tokens[k];
    track_for(&rig, 400, t, 4);
    for (int k = 0; k < N_CHOICES; k++)
        ASSERT_EQ(t[1].tokens[k], before[k]);
    engine_resume(rig.e, t[1].id);
    track_for(&rig, 400, t, 4);
    for (int k = 0; k < N_CHOICES; k++)
        ASSERT(t[1].tokens[k] > before[k]);

    engine_cancel(rig.e, t[1].id);
    for (int i = 0; i < 100 && (!t[2].over || !t[3].over); i++)
        track_for(&rig, 100, t, 4);
    ASSERT_EQ(t[1].over, 1);
    for (int k = 0; k < N_CHOICES; k++) {
        ASSERT_EQ(t[1].dones[k], 1);
        ASSERT_EQ(t[1].finish[k], ENGINE_FINISH_CANCELLED);
    }
    ASSERT_EQ(t[2].over, 1); /* c and d ran once b left */
    ASSERT(t[2].tokens[0] >= 1 && t[2].tokens[0] <= 4);
    ASSERT_EQ(t[3].over, 1);
    ASSERT(t[3].tokens[0] >= 1 && t[3].tokens[0] <= 4);
    rig_close(&rig);
}

/* The hold behind a request of several choices is bounded: with its slots
 * held by a request that never ends, later requests of one waited behind
 * it for ever (two requests of one client stopped every admission). After
 * choices_hold_s they pass it; a second such request that comes while the
 * first still waits gets no hold of its own; once the endless one ends, the
 * first takes its slots. */
TEST(the_hold_behind_choices_ends_when_their_slots_do_not_come_free)
{
    struct rig rig;
    struct engine_config c = rig_config(RIG_FIXTURE);
    c.max_seqs = N_CHOICES;
    c.max_queue = 8;
    c.choices_hold_s = 0.5;
    ASSERT_OK(rig_open(&rig, &c));
    int32_t ids[8] = {'a', 'b', 'c', 'd', 'e', 'f', 'g', 'h'};
    struct choice_track t[5];
    memset(t, 0, sizeof t);
    struct engine_request q[5];
    for (int i = 0; i < 5; i++) {
        q[i] = rig_greedy(&rig, i == 0 ? 1000000 : 4); /* 0: endless, holds a slot */
        rig_set_ids(&q[i], ids, 8, 1);
        t[i].id = q[i].id;
    }
    q[1].n_choices = N_CHOICES; /* 1 and 3: every slot; 2 and 4: one */
    q[3].n_choices = N_CHOICES;
    ASSERT_OK(engine_submit(rig.e, &q[0]));
    for (int i = 0; i < 100 && t[0].tokens[0] == 0; i++)
        track_for(&rig, 100, t, 5);
    ASSERT(t[0].tokens[0] > 0);
    ASSERT_OK(engine_submit(rig.e, &q[1]));
    ASSERT_OK(engine_submit(rig.e, &q[2]));
    track_for(&rig, 200, t, 5); /* within the hold: 2 waits behind 1 */
    ASSERT_EQ(t[2].tokens[0] + t[2].dones[0], 0);
    for (int i = 0; i < 100 && t[2].over == 0; i++)
        track_for(&rig, 100, t, 5);
    ASSERT_EQ(t[2].over, 1); /* past it: 2 ran on a free slot, 1 still waits */
    ASSERT_EQ(t[1].tokens[0] + t[1].dones[0], 0);
    ASSERT_OK(engine_submit(rig.e, &q[3]));
    ASSERT_OK(engine_submit(rig.e, &q[4]));
    for (int i = 0; i < 30 && t[4].over == 0; i++)
        track_for(&rig, 10, t, 5); /* no new hold: well within another 0.5 s */
    ASSERT_EQ(t[4].over, 1);
    ASSERT_EQ(t[3].tokens[0] + t[3].dones[0], 0);
    engine_cancel(rig.e, t[0].id);
    for (int i = 0; i < 200 && (t[1].over == 0 || t[3].over == 0); i++)
        track_for(&rig, 100, t, 5);
    ASSERT_EQ(t[1].over, 1); /* each of three choices, in turn */
    ASSERT_EQ(t[3].over, 1);
    for (int k = 0; k < N_CHOICES; k++)
        ASSERT(t[1].tokens[k] >= 1 && t[3].tokens[k] >= 1);
    rig_close(&rig);
}

/* Tracks events until the engine has n sequences paused (2 s at most);
 * returns how many it has. */
static int64_t paused_after(struct rig *r, struct choice_track *t, int n_t, int64_t n)
{
    struct engine_stats st;
    for (int i = 0; i < 200 && (engine_get_stats(r->e, &st), st.paused_seqs < n); i++)
        track_for(r, 10, t, n_t);
    return st.paused_seqs;
}

/* Prompts are fed in the order they were admitted. Slots are reused lowest
 * first, and prefill walked the slots in order: a long prompt admitted into
 * a freed low slot took every step's budget from one admitted before it
 * into a higher slot (one client sending long prompts kept another's short
 * one waiting for as long as it went on). Three endless requests hold the
 * slots; B, paused while it waits, is admitted into slot 1 when its holder
 * ends, then L, paused too, into slot 0. Let go together (L first, its
 * head start the wrong way), with 4 tokens a step, B's token comes first. */
TEST(prompts_are_fed_in_the_order_they_were_admitted)
{
    struct rig rig;
    struct engine_config c = rig_config(RIG_FIXTURE);
    c.max_seqs = 3;
    c.chunk = 4;
    c.max_step_tokens = 4;
    c.policy = (struct engine_policy){ENGINE_POLICY_WINDOW, 0}; /* no end at a full window */
    ASSERT_OK(rig_open(&rig, &c));
    int32_t ids[200], other[200];
    for (int i = 0; i < 200; i++) {
        ids[i] = 'a' + i % 26;
        other[i] = 'z' - i % 26; /* no prefix of B's for L to reuse */
    }
    enum { H0, H1, H2, B, L, N };
    struct choice_track t[N];
    memset(t, 0, sizeof t);
    struct engine_request q[N];
    for (int i = 0; i < N; i++) {
        q[i] = rig_greedy(&rig, i < B ? 1000000 : 2);
        q[i].ignore_eos = i < B; /* the holders end only when cancelled */
        rig_set_ids(&q[i], i == L ? other : ids, i < B ? 1 : 200, 0);
        t[i].id = q[i].id;
    }
    for (int i = H0; i <= H2; i++) {
        ASSERT_OK(engine_submit(rig.e, &q[i])); /* slot i */
        for (int k = 0; k < 200 && t[i].tokens[0] == 0; k++)
            track_for(&rig, 10, t, N);
        ASSERT(t[i].tokens[0] > 0);
    }
    ASSERT_OK(engine_submit(rig.e, &q[B])); /* no slot: it waits */
    engine_pause(rig.e, t[B].id);
    engine_cancel(rig.e, t[H1].id); /* B takes slot 1, paused */
    ASSERT_EQ(paused_after(&rig, t, N, 1), 1);
    ASSERT_OK(engine_submit(rig.e, &q[L]));
    engine_pause(rig.e, t[L].id);
    engine_cancel(rig.e, t[H0].id); /* L takes slot 0, paused */
    ASSERT_EQ(paused_after(&rig, t, N, 2), 2);
    ASSERT_EQ(t[B].tokens[0] + t[L].tokens[0], 0);
    engine_resume(rig.e, t[L].id);
    engine_resume(rig.e, t[B].id);
    for (int i = 0; i < 1000 && (t[B].over == 0 || t[L].over == 0); i++)
        track_for(&rig, 10, t, N);
    ASSERT_EQ(t[B].over, 1);
    ASSERT_EQ(t[L].over, 1);
    ASSERT(t[B].first_out > 0 && t[B].first_out < t[L].first_out); /* B's came out first */
    engine_cancel(rig.e, t[H2].id);
    rig_close(&rig);
}

/* A request of several choices cancelled while it waits ends with one
 * DONE, choices_left 0; one that fails at admission with one ERROR. */
TEST(choices_cancelled_while_waiting_or_refused_end_once)
{
    struct rig rig;
    struct engine_config c = rig_config(RIG_FIXTURE);
    c.max_seqs = 2;
    c.max_queue = 4;
    c.max_prompt_tokens = 16;
    ASSERT_OK(rig_open(&rig, &c));
    int32_t ids[20];
    for (int i = 0; i < 20; i++)
        ids[i] = 'a' + i;
    struct choice_track t[2];
    memset(t, 0, sizeof t);
    struct engine_request qa = rig_greedy(&rig, 1000000);
    rig_set_ids(&qa, ids, 8, 1);
    struct engine_request qb = rig_greedy(&rig, 8);
    rig_set_ids(&qb, ids, 8, 1);
    qb.n_choices = 2;
    t[0].id = qa.id, t[1].id = qb.id;
    ASSERT_OK(engine_submit(rig.e, &qa));
    for (int i = 0; i < 100 && t[0].tokens[0] == 0; i++)
        track_for(&rig, 100, t, 2);
    ASSERT_OK(engine_submit(rig.e, &qb));
    track_for(&rig, 200, t, 2);
    ASSERT_EQ(t[1].tokens[0] + t[1].dones[0], 0);
    engine_cancel(rig.e, t[1].id);
    for (int i = 0; i < 50 && !t[1].over; i++)
        track_for(&rig, 100, t, 2);
    ASSERT_EQ(t[1].over, 1);
    ASSERT_EQ(t[1].dones[0] + t[1].dones[1], 1);
    ASSERT_EQ(t[1].tokens[0] + t[1].tokens[1], 0);
    engine_cancel(rig.e, t[0].id);
    for (int i = 0; i < 50 && !t[0].over; i++)
        track_for(&rig, 100, t, 2);

    /* a prompt over the limit: one ERROR for the request, nothing else */
    struct engine_request q = rig_greedy(&rig, 4);
    rig_set_ids(&q, ids, 20, 1);
    q.n_choices = 2;
    static struct rig_result res[2];
    struct rig_result *outs[2] = {&res[0], &res[1]};
    uint64_t id = q.id;
    ASSERT_OK(engine_submit(rig.e, &q));
    ASSERT_OK(rig_wait_choices(&rig, id, outs, 2));
    ASSERT(res[0].error && res[0].status == 400);
    ASSERT_EQ(strcmp(res[0].code, "context_length_exceeded"), 0);
    ASSERT_EQ(res[1].ended, 0);
    /* the slots are free again: two choices run */
    q = rig_greedy(&rig, 4);
    rig_set_ids(&q, ids, 8, 1);
    q.n_choices = 2;
    id = q.id;
    ASSERT_OK(engine_submit(rig.e, &q));
    ASSERT_OK(rig_wait_choices(&rig, id, outs, 2));
    ASSERT(!res[0].error && res[0].ended == 1 && res[1].ended == 1);
    ASSERT_EQ(res[0].n_tok, 4);
    ASSERT_EQ(res[1].n_tok, 4); /* greedy: the same answer twice */
    ASSERT(memcmp(res[0].toks, res[1].toks, 4 * sizeof(int32_t)) == 0);
    rig_close(&rig);
}

/* --max-queue counts places, not requests: a request of n choices holds n
 * of the max_seqs + max_queue, so with no queue, two choices on two slots
 * leave no room for a third request until they end. */
TEST(a_request_of_n_choices_holds_n_places_of_the_queue)
{
    struct rig rig;
    struct engine_config c = rig_config(RIG_FIXTURE);
    c.max_seqs = 2;
    c.max_queue = 0;
    ASSERT_OK(rig_open(&rig, &c));
    int32_t ids[8] = {'a', 'b', 'c', 'd', 'e', 'f', 'g', 'h'};
    struct choice_track t[1];
    memset(t, 0, sizeof t);
    struct engine_request qa = rig_greedy(&rig, 1000000);
    rig_set_ids(&qa, ids, 8, 1);
    qa.n_choices = 2;
    t[0].id = qa.id;
    ASSERT_OK(engine_submit(rig.e, &qa));
    struct engine_request qb = rig_greedy(&rig, 4);
    rig_set_ids(&qb, ids, 8, 1);
    ASSERT_EQ(engine_submit(rig.e, &qb), -EBUSY); /* no place: the caller still owns it */
    engine_cancel(rig.e, t[0].id);
    for (int i = 0; i < 50 && !t[0].over; i++)
        track_for(&rig, 100, t, 1);
    ASSERT_EQ(t[0].over, 1);
    static struct rig_result res;
    ASSERT_OK(rig_run(&rig, &qb, &res)); /* its places are back */
    ASSERT(!res.error && res.n_tok == 4);
    rig_close(&rig);
}

/* ---- several prompts ------------------------------------------------------------ */

#define N_PROMPTS 3
#define PER_PROMPT 2

/* Prompt p of the tests below: token ids, text, token ids. */
static void prompt_of(struct engine_request *q, int p)
{
    static const int32_t a[7] = {'t', 'h', 'e', ' ', 'c', 'a', 't'};
    static const int32_t c[5] = {'a', 'b', 'c', ' ', 'x'};
    if (p == 1)
        rig_set_text(q, "once upon a time", 1, 0);
    else
        rig_set_ids(q, p == 0 ? a : c, p == 0 ? 7 : 5, 1);
}

/* Gives q (whose prompt is prompt 0) prompts 1..k-1. 0, or -1. */
static int add_prompts(struct rig *rig, struct engine_request *q, int k)
{
    q->n_prompts = k;
    q->more = calloc((size_t)k - 1, sizeof *q->more);
    for (int p = 1; q->more && p < k; p++) {
        struct engine_request one = rig_greedy(rig, 1);
        prompt_of(&one, p);
        q->more[p - 1] = (struct engine_prompt){.text = one.prompt,
                                                .text_len = one.prompt_len,
                                                .ids = one.prompt_ids,
                                                .n_ids = one.n_prompt_ids};
    }
    return q->more ? 0 : -1;
}

/* A request of k prompts of n choices each is k * n requests of one:
 * choice p * n + j equals the request of prompt p alone with seed + j
 * (tokens, text, log-probs, finish, usage); each prompt is prefilled once
 * for its choices (or by each, with echo). */
TEST(several_prompts_answer_each_as_requests_of_one)
{
    struct rig rig;
    struct engine_config c = rig_config(RIG_FIXTURE);
    c.max_seqs = N_PROMPTS * PER_PROMPT;
    c.max_queue = 2;
    ASSERT_OK(rig_open(&rig, &c));
    enum { N = N_PROMPTS * PER_PROMPT };
    static struct rig_result solo[N], choice[N];
    struct rig_result *outs[N];
    for (int round = 0; round < 3; round++) {
        const int per = round == 0 ? 1 : PER_PROMPT, echo = round == 2;
        const int n = N_PROMPTS * per;
        int64_t prompts = 0; /* the tokens of the prompts, one of each */
        for (int k = 0; k < n; k++) {
            struct engine_request q = sampled(&rig, 1);
            free(q.prompt_ids);
            q.prompt_ids = NULL;
            prompt_of(&q, k / per);
            q.sampling.seed = 300 + (uint64_t)(k % per);
            q.echo = echo;
            ASSERT_OK(rig_run(&rig, &q, &solo[k]));
            ASSERT(!solo[k].error && solo[k].n_tok > 0);
            prompts += k % per == 0 ? solo[k].prompt_tokens : 0;
            outs[k] = &choice[k];
        }
        struct engine_request q = sampled(&rig, 1);
        free(q.prompt_ids);
        q.prompt_ids = NULL;
        prompt_of(&q, 0);
        q.sampling.seed = 300;
        q.echo = echo;
        q.n_choices = per;
        ASSERT_OK(add_prompts(&rig, &q, N_PROMPTS));
        uint64_t id = q.id;
        struct engine_stats before, after;
        engine_get_stats(rig.e, &before);
        ASSERT_OK(engine_submit(rig.e, &q));
        ASSERT_OK(rig_wait_choices(&rig, id, outs, n));
        engine_get_stats(rig.e, &after);
        ASSERT_EQ(after.prompt_tokens_total - before.prompt_tokens_total +
                      after.prompt_tokens_cached_total - before.prompt_tokens_cached_total,
                  echo ? prompts * per : prompts);
        for (int k = 0; k < n; k++) {
            same_answer(failed, &choice[k], &solo[k]);
            if (*failed)
                return;
        }
        /* the prompts differ, and so do their answers */
        ASSERT(solo[0].prompt_tokens != solo[per].prompt_tokens);
        ASSERT(solo[0].n_text != solo[per].n_text ||
               memcmp(solo[0].text, solo[per].text, solo[0].n_text) != 0);
    }
    rig_close(&rig);
}

/* Several prompts hold a place each (times n) of max_seqs + max_queue, and
 * more sequences than max_seqs are refused with a 400 naming the prompt.
 * The places are seen while a list decodes (it cannot end before the
 * cancel), so no submit races the engine thread: two prompts on the two
 * slots and one request queued leave no place of three for a fourth. */
TEST(several_prompts_hold_their_places_and_fit_the_slots)
{
    struct rig rig;
    struct engine_config c = rig_config(RIG_FIXTURE);
    c.max_seqs = 2;
    c.max_queue = 1;
    ASSERT_OK(rig_open(&rig, &c));
    struct choice_track t[2];
    memset(t, 0, sizeof t);
    struct engine_request qa = rig_greedy(&rig, 1000000);
    prompt_of(&qa, 0);
    ASSERT_OK(add_prompts(&rig, &qa, 2));
    t[0].id = qa.id;
    ASSERT_OK(engine_submit(rig.e, &qa)); /* two places of three */
    struct engine_request qb = rig_greedy(&rig, 4);
    prompt_of(&qb, 2);
    t[1].id = qb.id;
    ASSERT_OK(engine_submit(rig.e, &qb)); /* the third, queued */
    struct engine_request qc = rig_greedy(&rig, 4);
    prompt_of(&qc, 2);
    ASSERT_EQ(engine_submit(rig.e, &qc), -EBUSY); /* none left: the caller still owns it */
    engine_cancel(rig.e, t[0].id);
    engine_cancel(rig.e, t[1].id);
    for (int i = 0; i < 50 && (!t[0].over || !t[1].over); i++)
        track_for(&rig, 100, t, 2);
    ASSERT_EQ(t[0].over, 1);
    ASSERT_EQ(t[1].over, 1);
    static struct rig_result res;
    ASSERT_OK(rig_run(&rig, &qc, &res)); /* the places are back */
    ASSERT(!res.error && res.n_tok == 4);
    /* three prompts fit the places but not the two slots */
    struct engine_request qd = rig_greedy(&rig, 4);
    prompt_of(&qd, 0);
    ASSERT_OK(add_prompts(&rig, &qd, 3));
    ASSERT_OK(rig_run(&rig, &qd, &res));
    ASSERT_EQ(res.error, 1);
    ASSERT_EQ(res.status, 400);
    ASSERT_STREQ(res.param, "prompt");
    rig_close(&rig);
}

/* ---- prompt prefixes kept in free slots ------------------------------------------- */

/* A sampled request with log-probs of prompt ids[0..n), seed 5. */
static struct engine_request prefixed(struct rig *rig, const int32_t *ids, int64_t n, int no_prefix)
{
    struct engine_request q = rig_greedy(rig, 12);
    rig_set_ids(&q, ids, n, 0); /* (no BOS: prompts that differ share no first token) */
    q.sampling.temperature = 1.0f;
    q.sampling.seed = 5;
    q.logprobs = 1;
    q.no_prefix = no_prefix;
    return q;
}

/* The same under a KV policy of its own. */
static struct engine_request prefixed_under(struct rig *rig, const int32_t *ids, int64_t n,
                                            int no_prefix, struct engine_policy policy)
{
    struct engine_request q = prefixed(rig, ids, n, no_prefix);
    q.has_policy = 1;
    q.policy = policy;
    return q;
}

static const struct engine_policy pol_window = {ENGINE_POLICY_WINDOW, 0};
static const struct engine_policy pol_sinks4 = {ENGINE_POLICY_SINKS, 4};

/* The prompt-prefix tests' rig: three slots, each (small) a ring of 64 + 16
 * cells (window 64, chunk 16) or the fixture's own, and 200 prompt ids
 * 'a' + (i * stride) % 26. */
static int prefix_rig(struct rig *rig, int small, int32_t ids[200], int stride)
{
    struct engine_config c = rig_config(RIG_FIXTURE);
    c.max_seqs = 3;
    if (small) {
        c.window = 64;
        c.chunk = 16;
    }
    for (int i = 0; i < 200; i++)
        ids[i] = 'a' + (i * stride) % 26;
    return rig_open(rig, &c);
}

/* got, a request that started after cached prompt tokens, is exactly want,
 * the same request prefilled whole: tokens, text and log-probs, bit for
 * bit. */
static void same_tokens(int *failed, const struct rig_result *got, const struct rig_result *want)
{
    ASSERT(!got->error && !want->error);
    ASSERT_EQ(got->n_tok, want->n_tok);
    ASSERT(memcmp(got->toks, want->toks, (size_t)want->n_tok * 4) == 0);
    ASSERT_EQ(got->n_text, want->n_text);
    ASSERT(memcmp(got->text, want->text, want->n_text) == 0);
    ASSERT_EQ(got->n_lp, want->n_lp);
    ASSERT(memcmp(got->logprob, want->logprob, (size_t)want->n_lp * 4) == 0);
    ASSERT_EQ(got->prompt_tokens, want->prompt_tokens);
}

/* A conversation sent whole each turn: the second turn's prompt is the
 * first's, its answer and more. The slot the first turn left holds its
 * prompt and answer, so the second prefills only what is new; its answer
 * is bit for bit the one a whole prefill gives. Under window and sinks:4,
 * across a wrapped ring (then nothing is kept), a prompt that differs part
 * way (kept up to there), another policy (nothing), and a request of
 * several choices (the first takes the prefix, the others its cells). */
TEST(a_prompt_starts_after_the_prefix_a_free_slot_holds_exactly)
{
    struct rig rig;
    int32_t ids[200];
    ASSERT_OK(prefix_rig(&rig, 1, ids, 11));
    static struct rig_result first, turn, whole;
    for (int pol = 0; pol < 2; pol++) {
        const struct engine_policy policy = pol ? pol_sinks4 : pol_window;
        for (int wrap = 0; wrap < 2; wrap++) {
            /* turn 1: 30 tokens (+ BOS), or 80 (past the ring of 64 + 16
             * with its answer: nothing can be kept) */
            const int64_t n1 = wrap ? 80 : 30;
            const int32_t *base = ids + 30 * (2 * pol + wrap); /* no other slot's prefix */
            struct engine_request q = prefixed_under(&rig, base, n1, 0, policy);
            ASSERT_OK(rig_run(&rig, &q, &first));
            ASSERT(!first.error && first.n_tok == 12);
            int32_t next[200];
            memcpy(next, base, (size_t)n1 * 4);
            memcpy(next + n1, first.toks, 12 * 4);
            memcpy(next + n1 + 12, ids + 180, 8 * 4);
            const int64_t n2 = n1 + 20;
            for (int k = 0; k < 2; k++) {
                struct engine_request t = prefixed_under(&rig, next, n2, k, policy);
                struct engine_stats before, after;
                engine_get_stats(rig.e, &before);
                ASSERT_OK(rig_run(&rig, &t, k ? &whole : &turn));
                engine_get_stats(rig.e, &after);
                const struct rig_result *r = k ? &whole : &turn;
                /* kept: the prompt and 11 of the answer's 12 tokens (its
                 * last was never fed), also from a ring that wrapped: this
                 * turn starts where that one ended */
                const int64_t kept = k ? 0 : n1 + 11;
                ASSERT_EQ(r->cached_tokens, kept);
                ASSERT_EQ(after.prompt_tokens_total - before.prompt_tokens_total,
                          r->prompt_tokens - kept);
                ASSERT_EQ(after.prompt_tokens_cached_total - before.prompt_tokens_cached_total,
                          kept);
            }
            same_tokens(failed, &turn, &whole);
            if (*failed)
                return;
        }
    }
    /* a ring that wrapped (80 + 11 tokens stored, 91 > 64 + 16) keeps the
     * cells of a start at 75 (91 - the chunk of 16) or later: a prompt
     * that follows the record that far is kept, one that leaves it at 74
     * is not (its window's first cells were written over) */
    for (int k = 0; k < 2; k++) {
        struct engine_request q1 = prefixed(&rig, ids + 110, 80, 0);
        ASSERT_OK(rig_run(&rig, &q1, &first));
        int32_t tail[100];
        memcpy(tail, ids + 110, 80 * 4);
        memcpy(tail + 80, first.toks, 11 * 4);
        const int64_t at = k ? 74 : 75;
        for (int64_t i = at; i < 100; i++)
            tail[i] = 'A' + (int32_t)(i % 7); /* (no id of the record: 'a' to 'z') */
        for (int w = 0; w < 2; w++) {
            struct engine_request t = prefixed(&rig, tail, 100, w);
            ASSERT_OK(rig_run(&rig, &t, w ? &whole : &turn));
        }
        ASSERT_EQ(turn.cached_tokens, k ? 0 : 75);
        same_tokens(failed, &turn, &whole);
        if (*failed)
            return;
    }
    /* a prompt that differs from the slot's after 10 tokens: 10 kept */
    struct engine_request q = prefixed(&rig, ids, 30, 0);
    ASSERT_OK(rig_run(&rig, &q, &first));
    int32_t other[40];
    memcpy(other, ids, sizeof other);
    other[10] = 'z' + 1;
    for (int k = 0; k < 2; k++) {
        struct engine_request t = prefixed(&rig, other, 40, k);
        ASSERT_OK(rig_run(&rig, &t, k ? &whole : &turn));
    }
    ASSERT_EQ(turn.cached_tokens, 10);
    same_tokens(failed, &turn, &whole);
    if (*failed)
        return;
    /* another policy than the slot's: nothing kept (a prompt no other slot
     * holds, then the same under the first's policy: kept) */
    for (int k = 0; k < 3; k++) {
        q = prefixed_under(&rig, ids + 150, k ? 40 : 30, 0, k == 1 ? pol_sinks4 : pol_window);
        ASSERT_OK(rig_run(&rig, &q, &turn));
        ASSERT_EQ(turn.cached_tokens, k == 2 ? 30 : 0);
    }
    /* another group (API key, or client) than the slot's: nothing kept; the
     * same: kept */
    for (int k = 0; k < 3; k++) {
        q = prefixed(&rig, ids + 120, k ? 40 : 30, 0);
        q.prefix_group = k == 1 ? 8 : 7;
        ASSERT_OK(rig_run(&rig, &q, &turn));
        ASSERT_EQ(turn.cached_tokens, k == 2 ? 30 : 0);
    }
    /* choices: the first takes the prefix, the second the first's cells */
    static struct rig_result ch[2][2];
    for (int k = 0; k < 2; k++) {
        q = prefixed(&rig, ids, 30, 0);
        ASSERT_OK(rig_run(&rig, &q, &first));
        struct engine_request t = prefixed(&rig, ids, 45, k);
        t.n_choices = 2;
        uint64_t id = t.id;
        struct rig_result *outs[2] = {&ch[k][0], &ch[k][1]};
        ASSERT_OK(engine_submit(rig.e, &t));
        ASSERT_OK(rig_wait_choices(&rig, id, outs, 2));
    }
    ASSERT_EQ(ch[0][0].cached_tokens, 30);
    ASSERT_EQ(ch[1][0].cached_tokens, 0);
    /* a request undone at admission (its second prompt empty) served no
     * cached tokens: the metric does not count the first prompt's */
    q = prefixed(&rig, ids, 30, 0);
    ASSERT_OK(rig_run(&rig, &q, &first));
    struct engine_request bad = prefixed(&rig, ids, 40, 0);
    bad.n_prompts = 2;
    bad.more = calloc(1, sizeof *bad.more);
    ASSERT(bad.more);
    struct engine_stats before, after;
    engine_get_stats(rig.e, &before);
    ASSERT_OK(rig_run(&rig, &bad, &turn));
    engine_get_stats(rig.e, &after);
    ASSERT(turn.error && turn.status == 400);
    ASSERT_EQ(after.prompt_tokens_cached_total, before.prompt_tokens_cached_total);
    for (int j = 0; j < 2; j++) {
        same_tokens(failed, &ch[0][j], &ch[1][j]);
        if (*failed)
            return;
    }
    rig_close(&rig);
}

/* A request of several sequences takes all its slots before its first
 * choice looks for a prefix: a record in a slot taken for its second
 * choice (or another prompt of its list) is still its to take. P is kept
 * in slot 0, Q in slot 1; Q and more with n = 2 takes slots 0 and 1, so
 * its first choice finds Q's record in its sibling's slot; a list [Q', P']
 * finds both. */
TEST(a_request_of_several_sequences_finds_a_prefix_in_any_slot_it_took)
{
    struct rig rig;
    int32_t ids[200];
    ASSERT_OK(prefix_rig(&rig, 0, ids, 11));
    static struct rig_result res, outs_[2][2];
    const int32_t *P = ids, *Q = ids + 100;
    for (int list = 0; list < 2; list++) {
        for (int k = 0; k < 2; k++) { /* P, then Q: slot 0 and another */
            struct engine_request q = prefixed(&rig, k ? Q : P, 30, 0);
            ASSERT_OK(rig_run(&rig, &q, &res));
            ASSERT_EQ(res.cached_tokens, 0);
        }
        struct engine_request t = prefixed(&rig, Q, 40, 0);
        if (list) { /* [Q', P'] */
            t.n_prompts = 2;
            t.more = calloc(1, sizeof *t.more);
            ASSERT(t.more);
            t.more[0].ids = malloc(40 * sizeof(int32_t));
            ASSERT(t.more[0].ids);
            memcpy(t.more[0].ids, P, 40 * sizeof(int32_t));
            t.more[0].n_ids = 40;
        } else {
            t.n_choices = 2;
        }
        uint64_t id = t.id;
        struct rig_result *outs[2] = {&outs_[list][0], &outs_[list][1]};
        ASSERT_OK(engine_submit(rig.e, &t));
        ASSERT_OK(rig_wait_choices(&rig, id, outs, 2));
        ASSERT_EQ(outs_[list][0].cached_tokens, 30);
        ASSERT_EQ(outs_[list][1].cached_tokens, list ? 30 : 0); /* (a choice takes cells) */
        /* the records this left are the new prompts': P and Q again from 0 */
        for (int k = 0; k < 2; k++) {
            struct engine_request q = prefixed(&rig, ids + 150, 10, 1);
            ASSERT_OK(rig_run(&rig, &q, &res));
        }
    }
    rig_close(&rig);
}

/* A record a later request shortened: A stores 91 (or 111) positions and
 * wraps the ring of 64 + 16; B takes A's slot 16 tokens before A's end
 * (allowed) and stores fewer positions than A did, so A's later positions
 * still overwrite B's first cells. C, whose prompt follows B's record to a
 * point that B's record alone would allow (any, B's 77 being within the
 * ring; or 85, at least 97 - 16), must not start from it: its window would
 * read cells A wrote over. It prefills whole, bit for bit. */
TEST(a_record_shortened_by_its_taker_keeps_the_first_writer_s_bound)
{
    struct rig rig;
    int32_t ids[200];
    ASSERT_OK(prefix_rig(&rig, 1, ids, 11));
    static struct rig_result a, b, turn, whole;
    for (int pol = 0; pol < 2; pol++) {
        for (int v = 0; v < 2; v++) {
            const struct engine_policy policy = pol ? pol_sinks4 : pol_window;
            const int64_t na = v ? 100 : 80; /* A stores na + 11 */
            const int64_t mb = v ? 96 : 76;  /* B's start, at least A's end - 16 */
            const int64_t mc = v ? 85 : 50;  /* C's prompt follows the records this far */
            const int32_t *base = ids + (pol * 2 + v) * 3; /* no other slot's prefix */
            struct engine_request qa = prefixed_under(&rig, base, na, 0, policy);
            ASSERT_OK(rig_run(&rig, &qa, &a));
            ASSERT(!a.error && a.n_tok == 12);
            int32_t stored[200], pb[200], pc[200];
            memcpy(stored, base, (size_t)na * 4);
            memcpy(stored + na, a.toks, 11 * 4);
            memcpy(pb, stored, (size_t)mb * 4);
            pb[mb] = 'A';
            struct engine_request qb = prefixed_under(&rig, pb, mb + 1, 0, policy);
            qb.max_tokens = 1;
            ASSERT_OK(rig_run(&rig, &qb, &b));
            ASSERT_EQ(b.cached_tokens, mb);
            memcpy(pc, stored, (size_t)mc * 4);
            for (int64_t i = mc; i < mc + 20; i++)
                pc[i] = 'A' + (int32_t)(i % 7);
            for (int w = 0; w < 2; w++) {
                struct engine_request t = prefixed_under(&rig, pc, mc + 20, w, policy);
                ASSERT_OK(rig_run(&rig, &t, w ? &whole : &turn));
            }
            ASSERT_EQ(turn.cached_tokens, 0);
            same_tokens(failed, &turn, &whole);
            if (*failed)
                return;
        }
    }
    rig_close(&rig);
}

/* A choice that took its first choice's prompt cells holds only those a
 * snapshot copies (the window's): a prompt longer than the window leaves
 * its first cells another request's, so its slot must not offer the
 * prompt's first tokens to a later request. Here the later request's
 * prefix matches both choices' slots; the second's is the lower one (the
 * first traded its slot for an empty one), which a tie would pick. */
TEST(a_choice_given_its_first_choice_s_cells_keeps_no_record_of_cells_it_lacks)
{
    struct rig rig;
    int32_t ids[200];
    ASSERT_OK(prefix_rig(&rig, 1, ids, 7));
    static struct rig_result res, outs_[2], turn, whole;
    struct engine_request q = prefixed_under(&rig, ids + 150, 20, 0, pol_window); /* slot 0 */
    ASSERT_OK(rig_run(&rig, &q, &res));
    q = prefixed_under(&rig, ids, 70, 0, pol_window); /* 70 > the window of 64, in its ring of 80 */
    q.max_tokens = 4;
    q.n_choices = 2;
    uint64_t id = q.id;
    struct rig_result *outs[2] = {&outs_[0], &outs_[1]};
    ASSERT_OK(engine_submit(rig.e, &q));
    ASSERT_OK(rig_wait_choices(&rig, id, outs, 2));
    int32_t next[72];
    memcpy(next, ids, 60 * 4);
    memcpy(next + 60, ids + 100, 12 * 4);
    for (int k = 0; k < 2; k++) {
        struct engine_request t = prefixed_under(&rig, next, 72, k, pol_window);
        ASSERT_OK(rig_run(&rig, &t, k ? &whole : &turn));
    }
    ASSERT_EQ(turn.cached_tokens, 60); /* from the first choice's slot */
    same_tokens(failed, &turn, &whole);
    if (*failed)
        return;
    rig_close(&rig);
}

/* ---- response_format json_object ------------------------------------------- */

#define N_JSON 4

/* Request k of the JSON test: sampled hot, so that the tiny random model
 * would write anything at all; json says whether it asks for an object. */
static struct engine_request json_request(struct rig *rig, int k, int json)
{
    static const int32_t ids[2][4] = {{'{', '"', 'a', '"'}, {'x', 'y', 'z', ' '}};
    struct engine_request q = rig_greedy(rig, 160);
    rig_set_ids(&q, ids[k % 2], 4, 1);
    q.sampling.temperature = k == 0 ? 0.0f : 1.0f + 0.25f * (float)k;
    q.sampling.top_k = k == 3 ? 8 : 0;
    q.sampling.seed = 900 + (uint64_t)k;
    q.json_object = json;
    return q;
}

/* Every answer of the tiny random model under json_object is, for the
 * oracle of tests/support/json_oracle.c, a whole object that ended it
 * (STOP) or a prefix of one that max_tokens cut (LENGTH), greedy and
 * sampled; the same requests without it are not. Side by side with each
 * other and a plain stream, each equals its solo run: the mask depends on
 * its own sequence only. */
TEST(json_object_answers_obey_the_grammar_and_do_not_depend_on_the_batch)
{
    struct rig rig;
    struct engine_config c = rig_config(RIG_FIXTURE);
    c.n_threads = 2;
    c.max_seqs = N_JSON + 1;
    c.max_queue = N_JSON + 1;
    ASSERT_OK(rig_open(&rig, &c));
    static struct rig_result solo[N_JSON + 1], together[N_JSON + 1], free_form;
    int whole = 0;
    for (int k = 0; k < N_JSON; k++) {
        struct engine_request q = json_request(&rig, k, 1);
        ASSERT_OK(rig_run(&rig, &q, &solo[k]));
        ASSERT(!solo[k].error && solo[k].n_tok > 0);
        enum json_verdict v = json_oracle(solo[k].text, solo[k].n_text);
        fprintf(stderr, "  json %d: %d tokens, %s: %.60s\n", k, solo[k].n_tok,
                v == COMPLETE     ? "whole"
                : v == INCOMPLETE ? "a prefix"
                                  : "NOT JSON",
                solo[k].text);
        if (v == COMPLETE) {
            ASSERT_EQ(solo[k].finish, ENGINE_FINISH_STOP);
            whole++;
        } else {
            ASSERT_EQ(v, INCOMPLETE);
            ASSERT_EQ(solo[k].finish, ENGINE_FINISH_LENGTH);
            ASSERT_EQ(solo[k].n_tok, 160);
        }
        q = json_request(&rig, k, 0);
        ASSERT_OK(rig_run(&rig, &q, &free_form));
        ASSERT(json_oracle(free_form.text, free_form.n_text) == BAD);
    }
    ASSERT(whole > 0);
    {
        struct engine_request q = sampled(&rig, 1);
        ASSERT_OK(rig_run(&rig, &q, &solo[N_JSON]));
    }
    uint64_t ids[N_JSON + 1];
    struct rig_result *outs[N_JSON + 1];
    for (int k = 0; k <= N_JSON; k++) {
        struct engine_request q = k < N_JSON ? json_request(&rig, k, 1) : sampled(&rig, 1);
        ids[k] = q.id;
        outs[k] = &together[k];
        ASSERT_OK(engine_submit(rig.e, &q));
    }
    ASSERT_OK(rig_wait_all(&rig, ids, outs, N_JSON + 1));
    for (int k = 0; k <= N_JSON; k++) {
        ASSERT_EQ(together[k].n_tok, solo[k].n_tok);
        ASSERT(memcmp(together[k].toks, solo[k].toks, (size_t)solo[k].n_tok * 4) == 0);
        ASSERT_EQ(together[k].finish, solo[k].finish);
    }
    rig_close(&rig);
}

/* A model whose output has more rows than its tokenizer has tokens (the
 * fixture padded from 257 to 320 rows, as real models pad theirs): the ids
 * past the tokenizer have no text, so the JSON grammar never allows them,
 * and hot JSON answers still obey it. (The mask's table was the
 * tokenizer's size and was read past its end.) A plain hot answer does
 * pick such ids, so the test would see them. */
TEST(json_object_never_picks_an_id_past_the_tokenizer)
{
    struct rig rig;
    struct engine_config c = rig_config(SS_FIXTURES_DIR "/norm_softmax_padded.gguf");
    ASSERT_OK(rig_open(&rig, &c));
    static struct rig_result r;
    int past = 0;
    for (int k = 0; k < 4; k++) {
        struct engine_request q = json_request(&rig, 1 + k % 3, 1);
        q.sampling.seed = 40 + (uint64_t)k;
        ASSERT_OK(rig_run(&rig, &q, &r));
        ASSERT(!r.error && r.n_tok > 0);
        for (int i = 0; i < r.n_tok; i++)
            ASSERT(r.toks[i] < 257);
        ASSERT(json_oracle(r.text, r.n_text) != BAD);
        q = json_request(&rig, 1 + k % 3, 0);
        q.sampling.seed = 40 + (uint64_t)k;
        ASSERT_OK(rig_run(&rig, &q, &r));
        for (int i = 0; i < r.n_tok; i++)
            past += r.toks[i] >= 257;
    }
    ASSERT(past > 0);
    rig_close(&rig);
}

/* ---- echo ------------------------------------------------------------------- */

/* An echoed prompt: each token after the first (BOS, which the engine adds,
 * is not echoed, so the text's first token has its log-prob given BOS) comes
 * with its log-prob given the tokens before it, as the decoder fed one token
 * at a time scores it (decoder_nll, in double), through chunks of 5 tokens
 * and a window of 48 that the prompt overflows; its alternatives are the
 * row's best tokens. Its text is the prompt's. max_tokens 0 ends it there;
 * one side by side with max_tokens 3 echoes the same, then answers. */
TEST(an_echoed_prompt_has_each_token_s_logprob_given_the_tokens_before_it)
{
    enum { WINDOW = 48, N = 130 };
    struct rig rig;
    struct engine_config c = rig_config(RIG_FIXTURE);
    c.window = WINDOW;
    c.chunk = 5;
    ASSERT_OK(rig_open(&rig, &c));
    char text[N + 1];
    for (int i = 0; i < N; i++)
        text[i] = "the quick brown fox jumps over a lazy dog; "[i % 43];
    text[N] = 0;
    static struct rig_result res[2];
    uint64_t ids[2];
    struct rig_result *outs[2] = {&res[0], &res[1]};
    for (int k = 0; k < 2; k++) {
        struct engine_request q = rig_greedy(&rig, k == 0 ? 0 : 3);
        rig_set_text(&q, text, 1, 0);
        q.echo = 1;
        q.logprobs = 1;
        q.top_logprobs = 3;
        ids[k] = q.id;
        ASSERT_OK(engine_submit(rig.e, &q));
    }
    ASSERT_OK(rig_wait_all(&rig, ids, outs, 2));

    /* the reference: a decoder fed one token at a time */
    struct decoder *d = NULL;
    struct decoder_config dc = {.model_path = RIG_FIXTURE,
                                .n_threads = 1,
                                .backend = ENGINE_BACKEND_CPU,
                                .max_tokens = 1,
                                .chunk = 1,
                                .n_sinks = DECODER_DEFAULT_SINKS,
                                .window = WINDOW,
                                .n_slots = 1,
                                .kv_dtype = ENGINE_KV_F16};
    char err[256];
    ASSERT_OK(decoder_open(&d, &dc, err, sizeof err));
    struct decoder_info info;
    decoder_get_info(d, &info);
    int32_t tok[N + 1];
    int64_t n = decoder_tokenize(d, text, N, 1, 0, tok, N + 1);
    ASSERT(info.add_bos && n == N + 1 && tok[0] == info.bos);
    struct engine_policy pol;
    ASSERT_OK(engine_policy_parse("auto", &pol));
    int64_t seq = decoder_seq_open(d, &pol, WINDOW);
    ASSERT(seq >= 0);
    double worst = 0;
    int top_ok = 1;
    for (int64_t i = 0; i + 1 < n; i++) {
        struct decoder_input in = {seq, &tok[i], 1, DECODER_LOGITS_LAST};
        ASSERT_EQ(decoder_step(d, &in, 1), 1);
        const float *row = decoder_logits(d);
        double want = -decoder_nll(d, row, tok[i + 1]);
        int64_t best = 0;
        for (int64_t v = 1; v < info.n_vocab; v++)
            if (row[v] > row[best])
                best = v;
        for (int k = 0; k < 2; k++) {
            double diff = fabs(res[k].logprob[i] - want);
            worst = diff > worst ? diff : worst;
            top_ok &= res[k].top_id[i] == best;
        }
    }
    decoder_close(d);
    printf("  %lld prompt tokens echoed; worst log-prob difference %.2e\n", (long long)(n - 1),
           worst);
    for (int k = 0; k < 2; k++) {
        const struct rig_result *r = &res[k];
        ASSERT(!r->error);
        ASSERT_EQ(r->prompt_tokens, n);
        ASSERT_EQ(r->completion_tokens, k == 0 ? 0 : 3);
        ASSERT_EQ(r->n_tok, k == 0 ? 0 : 3);
        ASSERT_EQ(r->finish, ENGINE_FINISH_LENGTH);
        ASSERT_EQ(r->n_lp, (int)(n - 1) + r->n_tok); /* BOS is not echoed */
        ASSERT(memcmp(r->lp_tok, tok + 1, (size_t)(n - 1) * sizeof *tok) == 0);
        ASSERT(r->n_text >= N && memcmp(r->text, text, N) == 0);
        if (k == 0)
            ASSERT_EQ(r->n_text, (size_t)N); /* the prompt alone */
        for (int64_t i = 0; i + 1 < n; i++)
            ASSERT(isfinite(r->logprob[i]));
    }
    ASSERT(worst < 1e-5);
    ASSERT(top_ok);
    rig_close(&rig);
}

/* Echoes in a batch with other sequences read their own logits rows: two
 * echoes of different texts (one the prompt alone, one then answering),
 * submitted while a third request decodes, give exactly the tokens, text,
 * log-probs and alternatives each gives alone (batch invariance), three
 * times with the third request at a different point of its answer. */
TEST(echoes_side_by_side_with_a_decoding_stream_equal_their_solo_runs)
{
    struct rig rig;
    struct engine_config c = rig_config(RIG_FIXTURE);
    c.window = 48;
    c.chunk = 5;
    ASSERT_OK(rig_open(&rig, &c));
    static const char *const texts[3] = {
        "pack my box with five dozen liquor jugs; pack my box with five dozen liquor jugs.",
        "sphinx of black quartz, judge my vow! the five boxing wizards jump quickly; how "
        "vexingly quick daft zebras jump",
        "the quick brown fox jumps over a lazy dog"};
    static struct rig_result solo[2], mix[3];
    for (int k = 0; k < 2; k++) {
        struct engine_request q = rig_greedy(&rig, k == 0 ? 0 : 4);
        rig_set_text(&q, texts[k], 1, 0);
        q.echo = 1;
        q.logprobs = 1;
        q.top_logprobs = 3;
        ASSERT_OK(rig_run(&rig, &q, &solo[k]));
        ASSERT(!solo[k].error && solo[k].n_lp > 40);
    }
    for (int rep = 0; rep < 3; rep++) {
        uint64_t ids[3];
        struct rig_result *outs[3] = {&mix[0], &mix[1], &mix[2]};
        struct engine_request p = rig_greedy(&rig, 60);
        rig_set_text(&p, texts[2], 1, 0);
        p.logprobs = 1;
        ids[0] = p.id;
        ASSERT_OK(engine_submit(rig.e, &p));
        struct timespec ts = {0, (rep * 3 + 1) * 1000000L};
        nanosleep(&ts, NULL);
        for (int k = 0; k < 2; k++) {
            struct engine_request q = rig_greedy(&rig, k == 0 ? 0 : 4);
            rig_set_text(&q, texts[k], 1, 0);
            q.echo = 1;
            q.logprobs = 1;
            q.top_logprobs = 3;
            ids[1 + k] = q.id;
            ASSERT_OK(engine_submit(rig.e, &q));
        }
        ASSERT_OK(rig_wait_all(&rig, ids, outs, 3));
        for (int k = 0; k < 2; k++) {
            const struct rig_result *x = &mix[1 + k], *y = &solo[k];
            ASSERT(!x->error && x->n_lp == y->n_lp && x->n_tok == y->n_tok);
            ASSERT(x->n_text == y->n_text && memcmp(x->text, y->text, x->n_text) == 0);
            ASSERT(memcmp(x->lp_tok, y->lp_tok, (size_t)x->n_lp * sizeof *x->lp_tok) == 0);
            ASSERT(memcmp(x->top_id, y->top_id, (size_t)x->n_lp * sizeof *x->top_id) == 0);
            ASSERT(isnan(y->logprob[0]) == 0);
            ASSERT(memcmp(x->logprob, y->logprob, (size_t)x->n_lp * sizeof *x->logprob) == 0);
        }
    }
    rig_close(&rig);
}

/* A prompt echoed with log-probs costs a log-sum-exp and a top-k over the
 * vocabulary a row, on the engine thread alone on a backend without CPU
 * threads, so it prefills at most 32 tokens a step whatever --chunk says:
 * 130 prompt tokens with a chunk of 128 take 5 steps (2 without log-probs,
 * and 2 before the bound, when every other stream waited for 128 rows). */
TEST(a_prompt_echoed_with_logprobs_prefills_32_tokens_a_step)
{
    struct rig rig;
    struct engine_config c = rig_config(RIG_FIXTURE);
    ASSERT_EQ(c.chunk, 128);
    ASSERT_OK(rig_open(&rig, &c));
    char text[131];
    for (int i = 0; i < 130; i++)
        text[i] = "sphinx of black quartz, judge my vow. "[i % 38];
    text[130] = 0;
    static struct rig_result r;
    int64_t steps[2];
    for (int lp = 0; lp < 2; lp++) {
        struct engine_stats before, after;
        engine_get_stats(rig.e, &before);
        struct engine_request q = rig_greedy(&rig, 0);
        rig_set_text(&q, text, 0, 0);
        q.echo = 1;
        q.logprobs = lp;
        ASSERT_OK(rig_run(&rig, &q, &r));
        ASSERT(!r.error && r.prompt_tokens == 130 && r.n_text == 130);
        engine_get_stats(rig.e, &after);
        steps[lp] = after.steps_total - before.steps_total;
    }
    printf("  130 prompt tokens: %lld steps echoed, %lld with log-probs\n", (long long)steps[0],
           (long long)steps[1]);
    ASSERT_EQ(steps[0], 2);
    ASSERT_EQ(steps[1], 5);
    rig_close(&rig);
}

/* The counters a client reads once it has a request's last event count
 * that request's work: a prompt echoed with nothing to generate, finished
 * in a step in which another stream still decodes, has all of its prompt
 * tokens in prompt_tokens_total (plus what a free slot held) as soon as its
 * done event can be drained. Events are read as the engine pushes them (no
 * waiting for its wake-up), twenty times over, each time counted from the
 * done event before (the first echo only sets that up: the stream's first
 * token may be out before its prefill is counted, a token event carrying
 * no such promise). */
TEST(the_counters_include_a_request_once_its_last_event_is_out)
{
    struct rig rig;
    struct engine_config c = rig_config(RIG_FIXTURE);
    ASSERT_OK(rig_open(&rig, &c));
    struct engine_request a = rig_greedy(&rig, 100000);
    rig_set_text(&a, "the quick brown fox", 1, 0);
    a.ignore_eos = 1;
    const uint64_t a_id = a.id;
    ASSERT_OK(engine_submit(rig.e, &a));
    struct engine_event ev[64];
    int a_tokens = 0;
    for (const time_t t0 = time(NULL); a_tokens == 0 && time(NULL) - t0 < 30;) {
        size_t got = engine_drain(rig.e, ev, 64); /* until the stream decodes */
        for (size_t i = 0; i < got; i++)
            a_tokens += ev[i].id == a_id && ev[i].kind == ENGINE_EV_TOKEN;
    }
    ASSERT(a_tokens > 0);
    for (int rep = 0; rep < 21; rep++) {
        struct engine_stats before, after;
        engine_get_stats(rig.e, &before);
        struct engine_request b = rig_greedy(&rig, 0);
        rig_set_text(&b, "sphinx of black quartz, judge my vow", 1, 0);
        b.echo = 1;
        const uint64_t b_id = b.id;
        ASSERT_OK(engine_submit(rig.e, &b));
        int64_t prompt = -1;
        const time_t t0 = time(NULL);
        while (prompt < 0 && time(NULL) - t0 < 30) {
            size_t got = engine_drain(rig.e, ev, 64);
            for (size_t i = 0; i < got; i++)
                if (ev[i].id == b_id && ev[i].kind != ENGINE_EV_TOKEN) {
                    ASSERT_EQ(ev[i].kind, ENGINE_EV_DONE);
                    prompt = ev[i].prompt_tokens;
                }
        }
        engine_get_stats(rig.e, &after);
        ASSERT(prompt > 0);
        if (rep == 0) /* before it, the stream's own prefill may not be out */
            continue;
        ASSERT_EQ(after.prompt_tokens_total - before.prompt_tokens_total +
                      after.prompt_tokens_cached_total - before.prompt_tokens_cached_total,
                  prompt);
    }
    engine_cancel(rig.e, a_id);
    rig_close(&rig);
}

/* Without BOS the first token has nothing before it: its log-prob is null
 * (NaN here); without log-probs the echo is text alone. */
/* A dense context of W tokens holds a prompt of W tokens echoed with
 * max_tokens 0 (nothing to generate, so no cell for an answer), but not one
 * of W + 1, nor W with a token to generate. */
TEST(a_dense_context_holds_an_echoed_prompt_of_its_whole_length)
{
    struct rig rig;
    struct engine_config c = rig_config(RIG_FIXTURE);
    c.window = 48;
    ASSERT_OK(rig_open(&rig, &c));
    static struct rig_result r;
    int32_t ids[49];
    for (int i = 0; i < 49; i++)
        ids[i] = 'a' + i % 26;
    static const struct {
        int64_t n, max_tokens;
        int fits;
    } cases[] = {{48, 0, 1}, {49, 0, 0}, {48, 1, 0}, {47, 1, 1}};
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        struct engine_request q = rig_greedy(&rig, cases[k].max_tokens);
        rig_set_ids(&q, ids, cases[k].n, 0);
        q.echo = 1;
        q.logprobs = 1;
        q.has_policy = 1;
        ASSERT_OK(engine_policy_parse("dense", &q.policy));
        ASSERT_OK(rig_run(&rig, &q, &r));
        if (!cases[k].fits) {
            ASSERT(r.error && r.status == 400);
            ASSERT_STREQ(r.code, "context_length_exceeded");
            continue;
        }
        ASSERT(!r.error);
        ASSERT_EQ(r.n_lp, cases[k].n + cases[k].max_tokens);
        ASSERT(r.n_text >= (size_t)cases[k].n);
        ASSERT(memcmp(r.text, "abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuv", 47) == 0);
    }
    rig_close(&rig);
}

TEST(an_echoed_first_token_without_bos_has_a_null_logprob)
{
    struct rig rig;
    struct engine_config c = rig_config(RIG_FIXTURE);
    ASSERT_OK(rig_open(&rig, &c));
    static struct rig_result r;
    int32_t ids[6] = {'h', 'e', 'l', 'l', 'o', '!'};
    struct engine_request q = rig_greedy(&rig, 0);
    rig_set_ids(&q, ids, 6, 0);
    q.echo = 1;
    q.logprobs = 1;
    ASSERT_OK(rig_run(&rig, &q, &r));
    ASSERT(!r.error && r.n_lp == 6 && isnan(r.logprob[0]));
    for (int i = 1; i < 6; i++)
        ASSERT(isfinite(r.logprob[i]) && r.logprob[i] <= 0);
    ASSERT(r.n_text == 6 && memcmp(r.text, "hello!", 6) == 0);
    q = rig_greedy(&rig, 0);
    rig_set_ids(&q, ids, 6, 0);
    q.echo = 1;
    ASSERT_OK(rig_run(&rig, &q, &r));
    ASSERT(!r.error && r.n_lp == 0 && r.n_tok == 0);
    ASSERT(r.n_text == 6 && memcmp(r.text, "hello!", 6) == 0);
    rig_close(&rig);
}

TEST_MAIN()
