/*
 * test_perplexity_recompute.c: `streamsink perplexity --policy recompute`
 * scores each token after re-running its window from scratch, and that
 * window must start as a fresh request does. For Gemma 3 (its tokenizer puts
 * <bos> first, tokenizer.ggml.add_bos_token) every recomputed window is <bos>
 * and the last W-1 tokens; for SmolLM2 (no BOS added) it is the last W
 * tokens, as before.
 *
 * The command runs in-process (cmd_perplexity with --json); the reference is
 * a fresh sequence of the same decoder configuration fed the prompt a new
 * request would get, built here from the tokenizer's own ids, scored with
 * decoder_nll. The Gemma case also checks that leaving <bos> out moves the
 * scores (so the comparison can tell the two apart).
 */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cmd.h"
#include "decoder.h"
#include "test.h"

static const char text[] =
    "In the beginning God created the heaven and the earth. And the earth was without form, "
    "and void; and darkness was upon the face of the deep. And the Spirit of God moved upon "
    "the face of the waters. And God said, Let there be light: and there was light.";

#define WINDOW 8
#define N_SCORE 24

/* the window a fresh request sees before token t+1: BOS (when the model adds
 * one) then the last tokens, WINDOW in all */
static int64_t fresh_prompt(const int32_t *ids, int64_t t, int32_t bos, int32_t *out)
{
    int64_t n = 0, keep = bos >= 0 ? WINDOW - 1 : WINDOW;
    if (t + 1 <= WINDOW) { /* nothing slid out yet: the text's own start */
        for (int64_t i = 0; i <= t; i++)
            out[n++] = ids[i];
        return n;
    }
    if (bos >= 0)
        out[n++] = bos;
    for (int64_t i = t + 1 - keep; i <= t; i++)
        out[n++] = ids[i];
    return n;
}

static double fresh_nll(struct decoder *d, int64_t seq, const int32_t *prompt, int64_t n,
                        int32_t next)
{
    decoder_seq_reset(d, seq);
    struct decoder_input in = {seq, prompt, n, DECODER_LOGITS_LAST};
    if (decoder_step(d, &in, 1) != 1)
        return NAN;
    return decoder_nll(d, decoder_logits(d), next);
}

/* Runs the command on text with model; compares every scored token's NLL
 * with a fresh request's. *max_nobos_diff: the largest change when the
 * window leaves out BOS (0 for a model that adds none). */
static void check_model(int *failed, const char *model, int expect_bos, double *max_nobos_diff)
{
    char txt[] = "/tmp/ss_ppl_recompute_XXXXXX", json[64];
    int fd = mkstemp(txt);
    ASSERT(fd >= 0);
    ASSERT_EQ(write(fd, text, strlen(text)), (long long)strlen(text));
    close(fd);
    snprintf(json, sizeof json, "%s.json", txt);
    char window_s[16], n_s[16];
    snprintf(window_s, sizeof window_s, "%d", WINDOW);
    snprintf(n_s, sizeof n_s, "%d", N_SCORE);
    char *argv[] = {"perplexity", "-m",       (char *)model, "--text",       txt, "--policy",
                    "recompute",  "--window", window_s,      "--max-tokens", n_s, "-t",
                    "1",          "--json",   json,          "--no-progress"};
    ASSERT_EQ(cmd_perplexity((int)(sizeof argv / sizeof argv[0]), argv), CMD_EXIT_OK);
    size_t jlen = 0;
    char *jtext = cmd_read_file(json, &jlen);
    unlink(json);
    ASSERT(jtext != NULL);
    cJSON *root = cJSON_Parse(jtext);
    free(jtext);
    ASSERT(root != NULL);
    cJSON *jnll = cJSON_GetObjectItem(root, "nll"), *jpos = cJSON_GetObjectItem(root, "scored");
    int n_json = cJSON_GetArraySize(jnll);
    double got[N_SCORE];
    int64_t got_pos[N_SCORE];
    for (int i = 0; i < n_json && i < N_SCORE; i++) {
        got[i] = cJSON_GetArrayItem(jnll, i)->valuedouble;
        got_pos[i] = (int64_t)cJSON_GetArrayItem(jpos, i)->valuedouble;
    }
    cJSON_Delete(root);
    ASSERT_EQ(n_json, N_SCORE);

    /* the reference: the command's decoder configuration, a fresh sequence per token */
    struct decoder *d = NULL;
    struct decoder_config cfg = {
        .model_path = model,
        .n_threads = 1,
        .backend = ENGINE_BACKEND_CPU,
        .max_tokens = WINDOW,
        .n_sinks = DECODER_DEFAULT_SINKS,
        .window = WINDOW,
        .n_slots = 1,
        .kv_dtype = ENGINE_KV_F16,
    };
    char err[256];
    ASSERT_OK(decoder_open(&d, &cfg, err, sizeof err));
    struct decoder_info info;
    decoder_get_info(d, &info);
    int32_t ids[512], prompt[WINDOW];
    int64_t n = decoder_tokenize(d, text, strlen(text), info.add_bos, 0, ids, 512);
    struct engine_policy pol;
    int64_t seq = -1;
    int ok = n > N_SCORE + 1 && info.add_bos == expect_bos && (!expect_bos || ids[0] == info.bos) &&
             engine_policy_parse("recompute", &pol) == 0 &&
             (seq = decoder_seq_open(d, &pol, WINDOW)) >= 0;
    *max_nobos_diff = 0;
    for (int i = 0; ok && i < N_SCORE; i++) {
        int64_t t = got_pos[i];
        int64_t np = fresh_prompt(ids, t, info.add_bos ? info.bos : -1, prompt);
        double want = fresh_nll(d, seq, prompt, np, ids[t + 1]);
        if (!(fabs(got[i] - want) <= 1e-4)) { /* the JSON prints 5 decimals */
            fprintf(stderr, "  token %lld: command %.5f, fresh request %.5f\n", (long long)t,
                    got[i], want);
            ok = 0;
        }
        if (info.add_bos && t + 1 > WINDOW) { /* the same window without BOS */
            double nobos = fresh_nll(d, seq, ids + t + 1 - WINDOW, WINDOW, ids[t + 1]);
            if (fabs(nobos - want) > *max_nobos_diff)
                *max_nobos_diff = fabs(nobos - want);
        }
    }
    decoder_seq_close(d, seq);
    decoder_close(d);
    unlink(txt);
    ASSERT(ok);
}

TEST(recompute_window_keeps_bos)
{
    int32_t ids[12], out[12];
    for (int i = 0; i < 12; i++)
        ids[i] = i == 0 ? 2 : 100 + i;
    /* before the window slides: the text's own start, BOS included */
    ASSERT_EQ(cmd_recompute_window(ids, 3, 4, 2, out), 4);
    ASSERT_EQ(out[0], 2);
    ASSERT_EQ(out[3], 103);
    /* slid: BOS, then the last 3 */
    ASSERT_EQ(cmd_recompute_window(ids, 9, 4, 2, out), 4);
    ASSERT_EQ(out[0], 2);
    ASSERT_EQ(out[1], 107);
    ASSERT_EQ(out[3], 109);
    /* no BOS added by the model: the last 4 */
    ASSERT_EQ(cmd_recompute_window(ids, 9, 4, -1, out), 4);
    ASSERT_EQ(out[0], 106);
    ASSERT_EQ(out[3], 109);
    /* a window of one holds only the last token */
    ASSERT_EQ(cmd_recompute_window(ids, 9, 1, 2, out), 1);
    ASSERT_EQ(out[0], 109);
}

TEST(gemma_recompute_starts_with_bos)
{
    TEST_NEED_GEMMA_MODEL();
    double nobos = 0;
    check_model(failed, test_gemma_model_path(), 1, &nobos);
    if (*failed)
        return;
    printf("  Gemma: largest NLL change without <bos> %.3f\n", nobos);
    ASSERT(nobos > 0.05); /* the check above can tell a window without <bos> apart */
}

TEST(smollm2_recompute_is_the_last_window)
{
    TEST_NEED_MODEL();
    double nobos = 0;
    check_model(failed, test_model_path(), 0, &nobos);
}

TEST_MAIN()
