/*
 * test_decoder_observer.c: the decoder's observer hook (decoder.h), through
 * the public facade only, on the tiny fixture models (CPU, f32 KV cache).
 *
 * The independent computation: the hook exposes each layer's rotated q and k,
 * so the attention weights can be recomputed here in double precision from
 * them (softmax over the keys a query sees, with softmax1's extra 1 in the
 * denominator) and compared with the weights the backend's attention reported
 * on the first positions. The probe's figures (decoder_probe_run, itself an
 * observer) must then match first-position masses computed from those
 * recomputed weights, and an observer that only looks must not change the
 * logits by a single bit.
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "decoder.h"
#include "test.h"

#define N_TOK 150 /* > DECODER_PROBE_MIN_CTX, fed in chunks of CHUNK */
#define CHUNK 40

static const char text[] =
    "In the beginning God created the heaven and the earth. And the earth was without form, "
    "and void; and darkness was upon the face of the deep. And the Spirit of God moved.";

static struct decoder *open_fixture(const char *name, int64_t max_tokens)
{
    char path[512], err[256];
    snprintf(path, sizeof path, "%s/%s", SS_FIXTURES_DIR, name);
    struct decoder_config c = {.model_path = path,
                               .backend = ENGINE_BACKEND_CPU,
                               .n_threads = 1,
                               .max_tokens = max_tokens,
                               .n_sinks = 0,
                               .window = 256,
                               .n_slots = 1,
                               .kv_dtype = ENGINE_KV_F32};
    struct decoder *d = NULL;
    if (decoder_open(&d, &c, err, sizeof err) < 0)
        fprintf(stderr, "  decoder_open(%s): %s\n", path, err);
    return d;
}

/* What the observer keeps: every layer's keys by position (the queries of a
 * later chunk see the keys of earlier ones), and the worst disagreement. */
struct recompute {
    int softmax1;
    int n_layer, H, Hkv, Dh;
    float *keys;     /* [L][N_TOK][Hkv*Dh] */
    double *mass1;   /* [L*H] Σ over queries at context >= MIN_CTX of the recomputed w_0 */
    double max_diff; /* |reported - recomputed| over every first-position weight */
    int64_t n_checked;
    int64_t calls;
    int bad_view;
};

static void on_layer(void *arg, const struct decoder_layer_view *v)
{
    struct recompute *r = arg;
    r->calls++;
    if (!v->q || !v->k || !v->first || v->n_head != r->H || v->head_dim != r->Dh) {
        r->bad_view = 1;
        return;
    }
    const int H = r->H, Hkv = r->Hkv, Dh = r->Dh, KD = Hkv * Dh;
    float *keys = r->keys + (size_t)v->layer * N_TOK * KD;
    for (int64_t t = 0; t < v->T; t++)
        memcpy(keys + (size_t)v->pos[t] * KD, v->k + (size_t)t * KD, (size_t)KD * sizeof(float));
    double z[N_TOK];
    for (int64_t t = 0; t < v->T; t++) {
        const int64_t p = v->pos[t];
        for (int h = 0; h < H; h++) {
            const float *q = v->q + (size_t)t * H * Dh + (size_t)h * Dh;
            const int hk = h / (H / Hkv);
            double m = r->softmax1 ? 0.0 : -INFINITY; /* softmax1: a null key with logit 0 */
            for (int64_t j = 0; j <= p; j++) {
                const float *k = keys + (size_t)j * KD + (size_t)hk * Dh;
                double s = 0;
                for (int e = 0; e < Dh; e++)
                    s += (double)q[e] * (double)k[e];
                z[j] = s / sqrt((double)Dh);
                m = z[j] > m ? z[j] : m;
            }
            double sum = r->softmax1 ? exp(0.0 - m) : 0.0;
            for (int64_t j = 0; j <= p; j++)
                sum += exp(z[j] - m);
            const float *got = v->first + ((size_t)t * H + h) * DECODER_FIRST_K;
            for (int64_t j = 0; j < DECODER_FIRST_K; j++) {
                double want = j <= p ? exp(z[j] - m) / sum : 0.0;
                double diff = fabs((double)got[j] - want);
                r->max_diff = diff > r->max_diff ? diff : r->max_diff;
                r->n_checked++;
            }
            if (p >= DECODER_PROBE_MIN_CTX)
                r->mass1[(size_t)v->layer * H + h] += exp(z[0] - m) / sum;
        }
    }
}

/* Feeds the text through a dense sequence with the recomputing observer. */
static int run_observed(struct decoder *d, struct recompute *r, int64_t *n_out)
{
    struct decoder_info in;
    decoder_get_info(d, &in);
    int32_t ids[512];
    int64_t n = decoder_tokenize(d, text, strlen(text), in.add_bos, 0, ids, 512);
    if (n < N_TOK)
        return -EINVAL;
    n = N_TOK;
    *r = (struct recompute){.softmax1 = strcmp(in.normalizer, "softmax1") == 0,
                            .n_layer = in.n_layer,
                            .H = in.n_head,
                            .Hkv = in.n_head_kv,
                            .Dh = in.head_dim};
    r->keys = calloc((size_t)in.n_layer * N_TOK * in.n_head_kv * in.head_dim, sizeof(float));
    r->mass1 = calloc((size_t)in.n_layer * in.n_head, sizeof(double));
    if (!r->keys || !r->mass1)
        return -ENOMEM;
    const struct decoder_observer obs = {DECODER_OBSERVE_FIRST | DECODER_OBSERVE_QK, on_layer, r};
    int rc = decoder_set_observer(d, &obs);
    if (rc < 0)
        return rc;
    const struct engine_policy dense = {ENGINE_POLICY_DENSE, 0};
    int64_t seq = decoder_seq_open(d, &dense, 0);
    if (seq < 0)
        return (int)seq;
    for (int64_t i = 0; i < n && rc == 0; i += CHUNK) {
        struct decoder_input step = {seq, ids + i, n - i < CHUNK ? n - i : CHUNK,
                                     DECODER_LOGITS_NONE};
        int64_t got = decoder_step(d, &step, 1);
        rc = got < 0 ? (int)got : 0;
    }
    decoder_seq_close(d, seq);
    decoder_set_observer(d, NULL);
    *n_out = n;
    return rc;
}

static void check_model(int *failed, const char *fixture)
{
    struct decoder *d = open_fixture(fixture, CHUNK);
    ASSERT(d != NULL);
    struct recompute r;
    int64_t n = 0;
    int rc = run_observed(d, &r, &n);
    if (rc < 0)
        fprintf(stderr, "  run_observed: %d\n", rc);
    ASSERT_OK(rc);
    ASSERT(!r.bad_view);
    /* once per layer per step */
    ASSERT_EQ(r.calls, (int64_t)r.n_layer * ((n + CHUNK - 1) / CHUNK));
    ASSERT(r.n_checked > 0);
    printf("  %s: %lld first-position weights, max |reported - recomputed| %.3g\n", fixture,
           (long long)r.n_checked, r.max_diff);
    ASSERT(r.max_diff < 2e-5);

    /* the probe's figures from the same tokens (dense, its own steps) */
    int32_t ids[512];
    struct decoder_info in;
    decoder_get_info(d, &in);
    ASSERT_EQ(decoder_tokenize(d, text, strlen(text), in.add_bos, 0, ids, 512) >= n, 1);
    struct decoder_probe pr;
    ASSERT_OK(decoder_probe_run(d, ids, n, &pr));
    ASSERT_EQ(pr.n_queries, n - DECODER_PROBE_MIN_CTX);
    double worst = 0;
    for (int i = 0; i < r.n_layer * r.H; i++) {
        double want = r.mass1[i] / (double)pr.n_queries;
        double diff = fabs((double)pr.mass1[i] - want);
        worst = diff > worst ? diff : worst;
        ASSERT(pr.mass1[i] <= pr.mass4[i] + 1e-6f && pr.mass4[i] <= pr.mass16[i] + 1e-6f);
    }
    printf("  %s: probe first-position mass vs recomputed: max diff %.3g\n", fixture, worst);
    ASSERT(worst < 2e-5);
    decoder_probe_free(&pr);
    free(r.keys);
    free(r.mass1);
    decoder_close(d);
}

TEST(observed_softmax_weights_match_a_recomputation_from_the_observed_q_and_k)
{
    check_model(failed, "norm_softmax.gguf");
}

TEST(observed_softmax1_weights_match_a_recomputation_with_the_null_key)
{
    check_model(failed, "norm_softmax1.gguf");
}

static void count_layer(void *arg, const struct decoder_layer_view *v)
{
    (void)v;
    ++*(int64_t *)arg;
}

/* Logits of the text's first 32 tokens, one step, optionally observed (QK). */
static int logits_of(struct decoder *d, int observe, float *out, int64_t *calls)
{
    struct decoder_info in;
    decoder_get_info(d, &in);
    int32_t ids[512];
    int64_t n = decoder_tokenize(d, text, strlen(text), in.add_bos, 0, ids, 512);
    if (n < 32)
        return -EINVAL;
    const struct decoder_observer obs = {DECODER_OBSERVE_QK, count_layer, calls};
    if (observe && decoder_set_observer(d, &obs) < 0)
        return -EINVAL;
    const struct engine_policy dense = {ENGINE_POLICY_DENSE, 0};
    int64_t seq = decoder_seq_open(d, &dense, 0);
    struct decoder_input step = {seq, ids, 32, DECODER_LOGITS_ALL};
    int64_t rows = seq < 0 ? seq : decoder_step(d, &step, 1);
    if (rows == 32)
        memcpy(out, decoder_logits(d), (size_t)32 * in.n_vocab * sizeof(float));
    decoder_seq_close(d, seq);
    decoder_set_observer(d, NULL);
    return rows == 32 ? 0 : -EIO;
}

TEST(an_observer_of_q_and_k_leaves_the_logits_bit_identical)
{
    struct decoder *d = open_fixture("norm_softmax.gguf", 32);
    ASSERT(d != NULL);
    struct decoder_info in;
    decoder_get_info(d, &in);
    float *a = malloc((size_t)32 * in.n_vocab * sizeof(float));
    float *b = malloc((size_t)32 * in.n_vocab * sizeof(float));
    int64_t calls = 0;
    ASSERT(a && b);
    ASSERT_OK(logits_of(d, 0, a, &calls));
    ASSERT_EQ(calls, 0);
    ASSERT_OK(logits_of(d, 1, b, &calls));
    ASSERT_EQ(calls, in.n_layer);
    ASSERT(memcmp(a, b, (size_t)32 * in.n_vocab * sizeof(float)) == 0);
    free(a);
    free(b);
    decoder_close(d);
}

TEST_MAIN()
