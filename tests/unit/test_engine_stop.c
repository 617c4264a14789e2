/*
 * test_engine_stop.c: stop strings through the engine on the real SmolLM2
 * file (STREAMSINK_MODEL; skipped, exit 77, when the file is absent). Stop
 * strings of 254, 255 and 256 bytes (the API's limit is
 * ENGINE_MAX_STOP_LEN), cut from the model's own greedy text, must end the
 * request where the text first contains them: the emitted text is the full
 * greedy text cut at the first occurrence (found by a plain search), and the
 * finish reason is stop.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/engine_rig.h"
#include "test.h"

static long find(const char *t, size_t n, const char *s, size_t sl)
{
    for (size_t p = 0; p + sl <= n; p++)
        if (memcmp(t + p, s, sl) == 0)
            return (long)p;
    return -1;
}

/* A greedy request for gen tokens of a long story, with log-probs (and the
 * first alternative) when lp. */
static struct engine_request story(struct rig *rig, int64_t gen, int lp)
{
    struct engine_request q = rig_greedy(rig, gen);
    rig_set_text(&q,
                 "<|im_start|>user\nWrite a long story about a lighthouse keeper and the "
                 "sea.<|im_end|>\n<|im_start|>assistant\n",
                 1, 1);
    q.logprobs = lp;
    q.top_logprobs = lp;
    return q;
}

/* Submits q (its stop strings set): its id into *id, a result for it into *res. */
static int submit_story(struct rig *rig, struct engine_request *q, uint64_t *id,
                        struct rig_result **res)
{
    *id = q->id;
    *res = malloc(sizeof **res);
    if (!*res)
        return -ENOMEM;
    return engine_submit(rig->e, q);
}

TEST(stop_strings_of_254_to_256_bytes_end_generation_where_they_first_occur)
{
    struct rig *rig = rig_smol();
    ASSERT(rig);
    enum { N_STOP = 3, GEN = 128 };
    struct rig_result *full = malloc(sizeof *full), *res[N_STOP];
    uint64_t ids[N_STOP];
    long want[N_STOP];
    ASSERT(full);
    struct engine_request q = story(rig, GEN, 0);
    ASSERT_OK(rig_run(rig, &q, full));
    ASSERT(!full->error);
    printf("  greedy text without stops: %zu bytes, %d tokens\n", full->n_text, full->n_tok);
    ASSERT(full->n_text > 40 + ENGINE_MAX_STOP_LEN + 20);
    /* stops of 254, 255 and 256 bytes from 1, 20 and 40 bytes in: the
     * request must end where the text first contains them */
    for (int k = 0; k < N_STOP; k++) {
        size_t len = 254 + (size_t)(k % 3);
        size_t start = k == 0 ? 1 : 20 * (size_t)k;
        while (((unsigned char)full->text[start] & 0xC0) == 0x80)
            start++; /* a character boundary */
        char stop[ENGINE_MAX_STOP_LEN + 1];
        memcpy(stop, full->text + start, len);
        stop[len] = 0;
        want[k] = find(full->text, full->n_text, stop, len); /* may be before start */
        ASSERT(want[k] >= 0);
        q = story(rig, GEN, 0);
        q.stop[0] = strdup("a string that is never generated");
        q.stop[1] = strdup(stop);
        ASSERT_OK(submit_story(rig, &q, &ids[k], &res[k]));
    }
    ASSERT_OK(rig_wait_all(rig, ids, res, N_STOP));
    for (int k = 0; k < N_STOP; k++) {
        const struct rig_result *r = res[k];
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
}

/* A request with stop strings and log-probs gets the log-probs of exactly
 * the tokens whose text it was sent, each on the event that starts that
 * token's text: the same tokens, log-probs and text offsets as the request
 * without stop strings, up to where the stop string starts (a token whose
 * text starts before it keeps its log-probs; one that starts at or after it
 * has none), and all of them when the stop string never completes but holds
 * text back on the way. */
TEST(a_stop_string_s_tokens_send_no_logprobs_and_held_tokens_send_theirs_with_their_text)
{
    struct rig *rig = rig_smol();
    ASSERT(rig);
    enum { N_STOP = 4, GEN = 64 };
    struct rig_result *full = malloc(sizeof *full), *res[N_STOP];
    ASSERT(full);
    struct engine_request q = story(rig, GEN, 1);
    ASSERT_OK(rig_run(rig, &q, full));
    ASSERT(!full->error && full->n_tok == GEN && full->n_lp == GEN);
    ASSERT(memcmp(full->lp_tok, full->toks, GEN * sizeof(int32_t)) == 0);
    /* a token j past the first few whose text has two bytes or more */
    int j = 8;
    while (j + 1 < GEN && full->lp_at[j + 1] - full->lp_at[j] < 2)
        j++;
    ASSERT(j + 1 < GEN && full->lp_at[j] + 24 < full->n_text);
    const size_t sj = full->lp_at[j];
    /* stops: at token j's start; one byte into its text; at token j's start
     * with a byte never generated after a part of the text (held, never
     * matched); and two stops, the earlier of which wins */
    char stops[N_STOP][2][32];
    memset(stops, 0, sizeof stops);
    memcpy(stops[0][0], full->text + sj, 12);
    memcpy(stops[1][0], full->text + sj + 1, 12);
    memcpy(stops[2][0], full->text + sj, 6);
    stops[2][0][6] = '\x01';
    memcpy(stops[3][0], full->text + sj + 1, 12);
    memcpy(stops[3][1], full->text + sj, 3);
    uint64_t ids[N_STOP];
    for (int k = 0; k < N_STOP; k++) {
        q = story(rig, GEN, 1);
        for (int i = 0; i < 2; i++)
            q.stop[i] = stops[k][i][0] ? strdup(stops[k][i]) : NULL;
        ASSERT_OK(submit_story(rig, &q, &ids[k], &res[k]));
    }
    ASSERT_OK(rig_wait_all(rig, ids, res, N_STOP));
    for (int k = 0; k < N_STOP; k++) {
        const struct rig_result *r = res[k];
        /* where the text is cut: the first occurrence of any of its stops */
        long cut = -1;
        for (int i = 0; i < 2; i++) {
            long at = stops[k][i][0]
                          ? find(full->text, full->n_text, stops[k][i], strlen(stops[k][i]))
                          : -1;
            if (at >= 0 && (cut < 0 || at < cut))
                cut = at;
        }
        const size_t n_text = cut < 0 ? full->n_text : (size_t)cut;
        int n_lp = 0; /* the tokens whose text starts before the cut */
        while (n_lp < GEN && (cut < 0 || full->lp_at[n_lp] < (size_t)cut))
            n_lp++;
        printf("  stop %d: text cut at %ld, log-probs of %d tokens of %d\n", k, cut, n_lp,
               r->n_tok);
        ASSERT(!r->error);
        ASSERT_EQ(r->finish, cut < 0 ? ENGINE_FINISH_LENGTH : ENGINE_FINISH_STOP);
        ASSERT(r->n_text == n_text && memcmp(r->text, full->text, n_text) == 0);
        ASSERT(memcmp(r->toks, full->toks, (size_t)r->n_tok * sizeof(int32_t)) == 0);
        ASSERT_EQ(r->n_lp, n_lp);
        for (int i = 0; i < n_lp; i++) {
            ASSERT_EQ(r->lp_tok[i], full->toks[i]);
            ASSERT(memcmp(&r->logprob[i], &full->logprob[i], sizeof(float)) == 0);
            ASSERT_EQ(r->top_id[i], full->top_id[i]);
            ASSERT_EQ(r->lp_at[i], full->lp_at[i]);
        }
        free(res[k]);
    }
    free(full);
}

/* A session keeps what its client was sent: a stop string of the longest
 * length (many tokens) that starts where token i's text starts leaves the
 * session holding the prompt and tokens 0 .. i-1, as if the turn had been
 * cut by max_tokens there. Then min_tokens: with the same stop string and
 * min_tokens i + 1 the occurrence inside the first i + 1 tokens' text is not
 * a match, and the answer is the whole greedy text. */
TEST(a_session_gives_back_a_stop_string_s_tokens_and_min_tokens_defers_stops)
{
    struct rig *rig = rig_smol();
    ASSERT(rig);
    enum { GEN = 160 };
    struct rig_result *full = malloc(sizeof *full), *res = malloc(sizeof *res);
    ASSERT(full && res);
    struct engine_request q = story(rig, GEN, 1);
    ASSERT_OK(rig_run(rig, &q, full));
    ASSERT(!full->error && full->n_tok == GEN && full->n_lp == GEN);
    /* a token i whose text starts a 256-byte stretch found nowhere earlier */
    int i = 3;
    char stop[ENGINE_MAX_STOP_LEN + 1];
    for (;; i++) {
        ASSERT(i + 1 < GEN && full->lp_at[i] + ENGINE_MAX_STOP_LEN <= full->n_text);
        memcpy(stop, full->text + full->lp_at[i], ENGINE_MAX_STOP_LEN);
        stop[ENGINE_MAX_STOP_LEN] = 0;
        if (strlen(stop) == ENGINE_MAX_STOP_LEN &&
            find(full->text, full->n_text, stop, ENGINE_MAX_STOP_LEN) == (long)full->lp_at[i])
            break;
    }
    q = story(rig, GEN, 0);
    snprintf(q.session_id, sizeof q.session_id, "%s", "give-back");
    q.stop[0] = strdup(stop);
    ASSERT_OK(rig_run(rig, &q, res));
    ASSERT(!res->error && res->finish == ENGINE_FINISH_STOP);
    ASSERT(res->n_text == full->lp_at[i] && memcmp(res->text, full->text, res->n_text) == 0);
    printf("  stop string of %d bytes at token %d: %d tokens generated, %d kept\n",
           ENGINE_MAX_STOP_LEN, i, res->n_tok, i);
    ASSERT(res->n_tok > i + 20); /* the stop string's tokens were many */
    ASSERT_EQ(res->tokens_seen, res->prompt_tokens + i);

    /* a stop string settled at the end of the text: "bc" completes inside
     * token i + 1 while "abcd", which would start a byte earlier, waits for
     * a byte never generated; max_tokens ends the text there, and the flush
     * cuts at "bc", inside token i, which stays */
    int k = 3;
    while (k + 2 < GEN && full->lp_at[k + 1] - full->lp_at[k] < 2)
        k++;
    ASSERT(k + 2 < GEN);
    const size_t x = full->lp_at[k], z = full->lp_at[k + 2];
    char abcd[64] = {0}, bc[64] = {0};
    ASSERT(z - x + 2 <= sizeof abcd);
    memcpy(abcd, full->text + x, z - x);
    abcd[z - x] = '\x01';
    memcpy(bc, full->text + x + 1, z - x - 1);
    ASSERT(find(full->text, full->n_text, bc, strlen(bc)) == (long)x + 1);
    q = story(rig, k + 2, 0);
    snprintf(q.session_id, sizeof q.session_id, "%s", "give-back-at-flush");
    q.stop[0] = strdup(bc);
    q.stop[1] = strdup(abcd);
    ASSERT_OK(rig_run(rig, &q, res));
    ASSERT(!res->error && res->finish == ENGINE_FINISH_STOP && res->n_tok == k + 2);
    ASSERT(res->n_text == x + 1 && memcmp(res->text, full->text, x + 1) == 0);
    ASSERT_EQ(res->tokens_seen, res->prompt_tokens + k + 1);

    /* a stop string at the very start gives every token back; the session
     * then holds the prompt alone, and an empty prompt continues it with the
     * same greedy tokens */
    char first[64] = {0};
    ASSERT(full->lp_at[2] < sizeof first);
    memcpy(first, full->text, full->lp_at[2]);
    q = story(rig, GEN, 0);
    snprintf(q.session_id, sizeof q.session_id, "%s", "give-back-all");
    q.stop[0] = strdup(first);
    ASSERT_OK(rig_run(rig, &q, res));
    ASSERT(!res->error && res->finish == ENGINE_FINISH_STOP && res->n_text == 0);
    ASSERT_EQ(res->tokens_seen, res->prompt_tokens);
    q = rig_greedy(rig, 8);
    rig_set_text(&q, "", 0, 1);
    snprintf(q.session_id, sizeof q.session_id, "%s", "give-back-all");
    ASSERT_OK(rig_run(rig, &q, res));
    ASSERT(!res->error && res->n_tok == 8);
    ASSERT(memcmp(res->toks, full->toks, 8 * sizeof(int32_t)) == 0);

    q = story(rig, GEN, 0);
    q.stop[0] = strdup(stop);
    q.min_tokens = i + 1;
    ASSERT_OK(rig_run(rig, &q, res));
    ASSERT(!res->error && res->finish == ENGINE_FINISH_LENGTH && res->n_tok == GEN);
    ASSERT(res->n_text == full->n_text && memcmp(res->text, full->text, res->n_text) == 0);
    free(res);
    free(full);
}

/* A character made of several byte tokens (an emoji): its first tokens have
 * no text until the last one completes it, and when a stop string starts
 * with it they send no log-probs either. */
TEST(a_stop_string_that_starts_inside_a_character_s_tokens_sends_no_logprobs)
{
    struct rig *rig = rig_smol();
    ASSERT(rig);
    struct rig_result *full = malloc(sizeof *full), *cut = malloc(sizeof *cut);
    ASSERT(full && cut);
    struct engine_request q = rig_greedy(rig, 8);
    rig_set_text(&q, "Emoji story: \xF0\x9F\x90\xB6\xF0\x9F\x90\xB1", 1, 0);
    q.logprobs = 1;
    ASSERT_OK(rig_run(rig, &q, full));
    ASSERT(!full->error && full->n_lp == full->n_tok);
    /* the first character of several tokens (its first token's text starts
     * where the next one's does) */
    int j = 0;
    while (j + 1 < full->n_lp && full->lp_at[j + 1] != full->lp_at[j])
        j++;
    ASSERT(j + 1 < full->n_lp);
    size_t at = full->lp_at[j], len = 1;
    while (at + len < full->n_text && ((unsigned char)full->text[at + len] & 0xC0) == 0x80)
        len++;
    ASSERT(len > 1);
    char stop[8] = {0};
    memcpy(stop, full->text + at, len);
    q = rig_greedy(rig, 8);
    rig_set_text(&q, "Emoji story: \xF0\x9F\x90\xB6\xF0\x9F\x90\xB1", 1, 0);
    q.logprobs = 1;
    q.stop[0] = strdup(stop);
    ASSERT_OK(rig_run(rig, &q, cut));
    const long first = find(full->text, full->n_text, stop, len);
    int n_lp = 0;
    while (n_lp < full->n_lp && full->lp_at[n_lp] < (size_t)first)
        n_lp++;
    printf("  a %zu-byte character at %zu, first at %ld: log-probs of %d tokens, %d sent\n", len,
           at, first, n_lp, cut->n_lp);
    ASSERT(!cut->error && cut->finish == ENGINE_FINISH_STOP && cut->n_text == (size_t)first);
    ASSERT_EQ(cut->n_lp, n_lp);
    ASSERT(memcmp(cut->lp_tok, full->toks, (size_t)n_lp * sizeof(int32_t)) == 0);
    /* min_tokens ending at the character's first token: the character began
     * inside the first min_tokens tokens, so the stop string it is does not
     * match there (stop strings were armed once it was whole, not while its
     * first byte was held) */
    ASSERT_EQ(first, (long)at);
    q = rig_greedy(rig, 8);
    rig_set_text(&q, "Emoji story: \xF0\x9F\x90\xB6\xF0\x9F\x90\xB1", 1, 0);
    q.stop[0] = strdup(stop);
    q.min_tokens = j + 1;
    ASSERT_OK(rig_run(rig, &q, cut));
    const long next = find(full->text + at + len, full->n_text - at - len, stop, len);
    const size_t want = next < 0 ? full->n_text : at + len + (size_t)next;
    ASSERT(!cut->error && cut->n_text == want && memcmp(cut->text, full->text, want) == 0);
    free(full);
    free(cut);
    rig_close(rig); /* the last test here */
}

TEST_MAIN()
