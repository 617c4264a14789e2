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

TEST(stop_strings_of_254_to_256_bytes_end_generation_where_they_first_occur)
{
    struct rig *rig = rig_smol();
    ASSERT(rig);
    const char *prompt = "<|im_start|>user\nWrite a long story about a lighthouse keeper and "
                         "the sea.<|im_end|>\n<|im_start|>assistant\n";
    enum { N_STOP = 3, GEN = 128 };
    struct rig_result *full = malloc(sizeof *full), *res[N_STOP];
    uint64_t ids[N_STOP];
    long want[N_STOP];
    ASSERT(full);
    struct engine_request q = rig_greedy(rig, GEN);
    rig_set_text(&q, prompt, 1, 1);
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
        q = rig_greedy(rig, GEN);
        rig_set_text(&q, prompt, 1, 1);
        q.stop[0] = strdup("a string that is never generated");
        q.stop[1] = strdup(stop);
        ids[k] = q.id;
        res[k] = malloc(sizeof *res[k]);
        ASSERT(res[k]);
        ASSERT_OK(engine_submit(rig->e, &q));
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
    rig_close(rig); /* the last test here */
}

TEST_MAIN()
