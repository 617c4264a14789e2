/*
 * test_engine_sessions.c: session turns through the engine on the real
 * SmolLM2 file (STREAMSINK_MODEL; skipped, exit 77, when the file is absent),
 * whose steps are slow enough for a cancel to land inside a prompt.
 *
 *  - A turn cancelled while its prompt is being fed leaves the session with
 *    the whole prompt, never a part of it: the turn ends cancelled with no
 *    answer once the prompt is in, and the next turn answers what one
 *    request with the whole history answers.
 *  - A turn cancelled before any of its prompt is fed leaves the session as
 *    it was, the token its last turn left to feed included, and a session
 *    it would have started does not exist.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "support/engine_rig.h"
#include "test.h"

struct ended {
    int done, error;
    enum engine_finish finish;
    int64_t prompt_tokens, completion_tokens, tokens_seen;
};

/* Drains events until request id's DONE (or ERROR); once the first event
 * of request cue is out (cue != 0), cancels id. */
static struct ended run_until_done(struct rig *rig, uint64_t id, uint64_t cue)
{
    struct ended r = {0};
    struct engine_event ev[64];
    int cancelled = cue == 0;
    const time_t t0 = time(NULL);
    while (!r.done && !r.error && time(NULL) - t0 < 120) {
        size_t got = engine_drain(rig->e, ev, 64);
        for (size_t i = 0; i < got; i++) {
            if (ev[i].id == cue && !cancelled) {
                engine_cancel(rig->e, id);
                cancelled = 1;
            }
            if (ev[i].id != id)
                continue;
            if (ev[i].kind == ENGINE_EV_ERROR) {
                fprintf(stderr, "  error %d: %s\n", ev[i].status, ev[i].message);
                r.error = 1;
            }
            if (ev[i].kind == ENGINE_EV_DONE) {
                r.done = 1;
                r.finish = ev[i].finish;
                r.prompt_tokens = ev[i].prompt_tokens;
                r.completion_tokens = ev[i].completion_tokens;
                r.tokens_seen = ev[i].session.tokens_seen;
            }
        }
        if (got == 0)
            nanosleep(&(struct timespec){0, 1000000}, NULL);
    }
    return r;
}

/* A prompt of about 2,000 tokens: sixteen chunks of the rig's 128. */
static void long_text(char *text, size_t cap)
{
    text[0] = 0;
    for (int i = 0; i < 200; i++)
        strncat(text, "The quick brown fox jumps over the lazy dog. ", cap - strlen(text) - 1);
}

/* Checks that turn (a session's turn of max_tokens greedy tokens) gave what
 * one request with the whole history gives: the n parts of ids, in order. */
static int same_as_whole_history(struct rig *rig, const struct rig_result *turn, int64_t max_tokens,
                                 const int32_t *const *parts, const int64_t *lens, int n)
{
    int64_t total = 0;
    for (int i = 0; i < n; i++)
        total += lens[i];
    int32_t *all = malloc((size_t)total * sizeof *all);
    static struct rig_result whole;
    if (!all)
        return 0;
    for (int i = 0, at = 0; i < n; at += (int)lens[i], i++)
        memcpy(all + at, parts[i], (size_t)lens[i] * sizeof *all);
    struct engine_request w = rig_greedy(rig, max_tokens);
    rig_set_ids(&w, all, total, 1);
    int ok = rig_run(rig, &w, &whole) == 0 && !turn->error && !whole.error &&
             turn->n_tok == whole.n_tok &&
             memcmp(turn->toks, whole.toks, (size_t)turn->n_tok * sizeof *turn->toks) == 0;
    free(all);
    return ok;
}

TEST(a_session_turn_cancelled_during_its_prompt_keeps_the_whole_prompt)
{
    struct rig *rig = rig_smol();
    ASSERT(rig);
    static char text[16384];
    long_text(text, sizeof text);
    int32_t *ids = NULL, *more = NULL;
    const int64_t n = engine_tokenize(rig->e, text, strlen(text), 0, &ids);
    const char *next = " Then the fox ran into the woods and";
    const int64_t m = engine_tokenize(rig->e, next, strlen(next), 0, &more);
    ASSERT(n >= 1800 && m > 0); /* fifteen chunks of the rig's 128 and more */

    /* a's prompt goes in a chunk a step; b, echoed with log-probs, sends an
     * event after each of its steps of 32 tokens, the first once a has fed
     * a chunk or two: then a is cancelled, most of its prompt still to feed */
    struct engine_request a = rig_greedy(rig, 8);
    rig_set_ids(&a, ids, n, 1);
    snprintf(a.session_id, sizeof a.session_id, "cut-in-its-prompt");
    const uint64_t a_id = a.id;
    struct engine_request b = rig_greedy(rig, 0);
    rig_set_ids(&b, ids, 96, 1);
    b.echo = 1;
    b.logprobs = 1;
    const uint64_t b_id = b.id;
    ASSERT_OK(engine_submit(rig->e, &a));
    ASSERT_OK(engine_submit(rig->e, &b));
    struct ended r = run_until_done(rig, a_id, b_id);
    ASSERT(r.done && !r.error);
    ASSERT_EQ(r.finish, ENGINE_FINISH_CANCELLED);
    ASSERT_EQ(r.completion_tokens, 0);
    ASSERT(r.prompt_tokens >= n);
    ASSERT_EQ(r.tokens_seen, r.prompt_tokens); /* every prompt token (and BOS, if any) */

    /* the next turn answers what the whole history answers */
    struct engine_request t = rig_greedy(rig, 16);
    rig_set_ids(&t, more, m, 0);
    snprintf(t.session_id, sizeof t.session_id, "cut-in-its-prompt");
    static struct rig_result turn;
    ASSERT_OK(rig_run(rig, &t, &turn));
    ASSERT(!turn.error);
    ASSERT_EQ(turn.tokens_seen, r.prompt_tokens + m + turn.n_tok);
    ASSERT(same_as_whole_history(rig, &turn, 16, (const int32_t *const[]){ids, more},
                                 (const int64_t[]){n, m}, 2));
    free(ids);
    free(more);
}

/* A greedy request of text for max_tokens, on session (or none: NULL). */
static struct engine_request text_req(struct rig *rig, const char *text, int64_t max_tokens,
                                      const char *session)
{
    struct engine_request q = rig_greedy(rig, max_tokens);
    rig_set_text(&q, text, 1, 0);
    if (session)
        snprintf(q.session_id, sizeof q.session_id, "%s", session);
    return q;
}

TEST(a_session_turn_cancelled_before_its_prompt_leaves_the_session_as_it_was)
{
    struct rig *rig = rig_smol();
    ASSERT(rig);
    const char *p1 = "The lighthouse keeper climbed the stairs", *p2 = " and then the storm came",
               *p3 = " Later that night";
    static struct rig_result r1, r3;
    struct engine_request q = text_req(rig, p1, 4, "kept-as-it-was");
    ASSERT_OK(rig_run(rig, &q, &r1));
    ASSERT(!r1.error && r1.n_tok == 4 && r1.tokens_seen > 4);

    /* two long prompts keep the engine in its steps, and their answers
     * until they are cancelled: however fast the steps, or late this thread
     * (the prompt is the one the test before fed, which a prefix could give
     * at once); each turn is paused as it is sent (the pause reaches the
     * engine with it, between two steps, so it is admitted paused) and
     * cancelled with none of its prompt fed */
    static char text[16384];
    long_text(text, sizeof text);
    struct engine_request x = text_req(rig, text, -1, NULL), y = text_req(rig, text, -1, NULL);
    x.ignore_eos = y.ignore_eos = 1;
    x.no_prefix = y.no_prefix = 1;
    struct engine_request z2 = text_req(rig, p2, 8, "kept-as-it-was");
    struct engine_request zn = text_req(rig, p2, 8, "never-started");
    const uint64_t ids[4] = {x.id, y.id, z2.id, zn.id};
    ASSERT_OK(engine_submit(rig->e, &x));
    ASSERT_OK(engine_submit(rig->e, &y));
    nanosleep(&(struct timespec){0, 100000000}, NULL);
    ASSERT_OK(engine_submit(rig->e, &z2));
    engine_pause(rig->e, ids[2]);
    ASSERT_OK(engine_submit(rig->e, &zn));
    engine_pause(rig->e, ids[3]);
    /* two steps later the engine has taken them and admitted them (paused),
     * however slow its steps (under ASan) */
    struct engine_stats st;
    engine_get_stats(rig->e, &st);
    const int64_t steps = st.steps_total;
    for (const time_t t0 = time(NULL); st.steps_total < steps + 2 && time(NULL) - t0 < 120;) {
        struct engine_event ev[32]; /* x's and y's tokens: the engine waits for room */
        engine_drain(rig->e, ev, 32);
        nanosleep(&(struct timespec){0, 10000000}, NULL);
        engine_get_stats(rig->e, &st);
    }
    ASSERT(st.steps_total >= steps + 2);
    engine_cancel(rig->e, ids[2]);
    engine_cancel(rig->e, ids[3]);
    struct ended c2 = run_until_done(rig, ids[2], 0);
    engine_cancel(rig->e, ids[0]);
    engine_cancel(rig->e, ids[1]);
    ASSERT(c2.done && !c2.error);
    ASSERT_EQ(c2.finish, ENGINE_FINISH_CANCELLED);
    ASSERT_EQ(c2.completion_tokens, 0);
    ASSERT_EQ(c2.tokens_seen, r1.tokens_seen); /* nothing of the turn, nothing lost */

    /* a session that must exist: the one never started does not */
    struct engine_request gone = text_req(rig, p3, 4, "never-started");
    gone.session_must_exist = 1;
    static struct rig_result rg;
    ASSERT_OK(rig_run(rig, &gone, &rg));
    ASSERT(rg.error && rg.status == 404);

    /* the next turn answers what the history without the cancelled turn
     * answers: the first prompt, its four tokens, the third prompt */
    struct engine_request t3 = rig_greedy(rig, 8);
    rig_set_text(&t3, p3, 0, 0);
    snprintf(t3.session_id, sizeof t3.session_id, "kept-as-it-was");
    ASSERT_OK(rig_run(rig, &t3, &r3));
    int32_t *a = NULL, *c = NULL;
    const int64_t na = engine_tokenize(rig->e, p1, strlen(p1), 0, &a);
    const int64_t nc = engine_tokenize(rig->e, p3, strlen(p3), 0, &c);
    ASSERT(na > 0 && nc > 0);
    ASSERT(same_as_whole_history(rig, &r3, 8, (const int32_t *const[]){a, r1.toks, c},
                                 (const int64_t[]){na, 4, nc}, 3));
    free(a);
    free(c);
}

TEST_MAIN()
