/*
 * test_engine_tokenize.c: engine_tokenize on the real SmolLM2 file
 * (STREAMSINK_MODEL; skipped, exit 77, when the file is absent).
 *
 *  - engine_tokenize, then the ids path, gives the text path's prompt tokens
 *    and greedy generations, with and without parse_special (the reference
 *    is the engine's own text path, which tokenizes at admission).
 *  - engine_tokenize from four threads at once, while the engine thread
 *    generates, gives exactly the single-threaded ids.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/engine_rig.h"
#include "test.h"

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
    struct rig *rig = rig_smol();
    ASSERT(rig);
    /* with and without parse_special where the text has special tokens */
    const char *texts[] = {prompts[0], prompts[0], prompts[1], prompts[2], prompts[3], prompts[3]};
    const int special[] = {0, 1, 1, 0, 0, 1};
    ASSERT(rig_same_as_text(rig, texts, special, 6, 1, 8, NULL));
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
    struct rig *rig = rig_smol();
    ASSERT(rig);
    enum { N_THREADS = 4 };
    static struct tok_job jobs[N_THREADS];
    struct tok_job ref = {.e = rig->e};
    for (size_t i = 0; i < N_PROMPTS; i++)
        for (int sp = 0; sp <= 1; sp++) {
            ref.want_n[i][sp] =
                engine_tokenize(rig->e, prompts[i], strlen(prompts[i]), sp, &ref.want[i][sp]);
            ASSERT(ref.want_n[i][sp] > 0);
        }
    /* a long text too: the encoder's scratch grows while others run */
    struct engine_request q = rig_greedy(rig, 24);
    rig_set_text(&q, prompts[0], 1, 1);
    uint64_t gen_id = q.id;
    ASSERT_OK(engine_submit(rig->e, &q));
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
    struct rig_result *r = malloc(sizeof *r);
    ASSERT(r);
    ASSERT_OK(rig_wait(rig, gen_id, r));
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
    ASSERT_EQ(engine_tokenize(rig->e, NULL, 3, 0, &ids), -EINVAL);
    ASSERT(ids == NULL);
    ASSERT_EQ(engine_tokenize(rig->e, "", 0, 0, &ids), 0);
    ASSERT(ids != NULL);
    free(ids);
    rig_close(rig); /* the last test here */
}

/* First occurrence of s in t, or -1. */
TEST_MAIN()
