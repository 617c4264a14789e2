/*
 * test_engine_sessions.c: session turns through the engine on the real
 * SmolLM2 file (STREAMSINK_MODEL; skipped, exit 77, when the file is absent),
 * whose steps are slow enough for a cancel to land inside a prompt.
 *
 *  - A turn cancelled while its prompt is being fed leaves the session with
 *    the whole prompt, never a part of it: the turn ends cancelled with no
 *    answer once the prompt is in, and the next turn answers what one
 *    request with the whole history answers.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "support/engine_rig.h"
#include "test.h"

struct ended {
    int done, error, events;
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
            r.events++;
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

TEST(a_session_turn_cancelled_during_its_prompt_keeps_the_whole_prompt)
{
    struct rig *rig = rig_smol();
    ASSERT(rig);
    char text[8192] = "";
    for (int i = 0; i < 100; i++)
        strcat(text, "The quick brown fox jumps over the lazy dog. ");
    int32_t *ids = NULL, *more = NULL;
    const int64_t n = engine_tokenize(rig->e, text, strlen(text), 0, &ids);
    const char *next = " Then the fox ran into the woods and";
    const int64_t m = engine_tokenize(rig->e, next, strlen(next), 0, &more);
    ASSERT(n >= 900 && m > 0); /* eight chunks of the rig's 128 and more */

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
    static struct rig_result turn, whole;
    ASSERT_OK(rig_run(rig, &t, &turn));
    int32_t *all = malloc((size_t)(n + m) * sizeof *all);
    ASSERT(all);
    memcpy(all, ids, (size_t)n * sizeof *all);
    memcpy(all + n, more, (size_t)m * sizeof *all);
    struct engine_request w = rig_greedy(rig, 16);
    rig_set_ids(&w, all, n + m, 1);
    ASSERT_OK(rig_run(rig, &w, &whole));
    ASSERT(!turn.error && !whole.error);
    ASSERT_EQ(turn.tokens_seen, r.prompt_tokens + m + turn.n_tok);
    ASSERT_EQ(turn.n_tok, whole.n_tok);
    ASSERT(memcmp(turn.toks, whole.toks, (size_t)turn.n_tok * sizeof *turn.toks) == 0);
    free(all);
    free(ids);
    free(more);
}

TEST_MAIN()
