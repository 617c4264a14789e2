/*
 * test_sinks_oracle.c: DESIGN.md invariant 4, `sinks:N` == a brute-force
 * oracle that rebuilds the cache and re-encodes positions at every step.
 *
 * The oracle is an independent forward pass of the tiny random model
 * (tests/support/tiny_model.h) written here with plain loops in double. It keeps
 * every token's UNROTATED K and V per layer, computed once when the token is
 * fed, from the context the token saw then (exactly what the engine keeps:
 * a stored key is never recomputed, only, in the oracle, re-rotated). At
 * every step it builds the cache StreamingLLM describes,
 *     [first N tokens] + [last W tokens, the current one included],
 * rotates each key at its index 0..n-1 in that list and the query at n-1
 * (StreamingLLM §3.2: positions inside the cache), and attends with the
 * model's normalizer. The engine instead stores keys rotated once at their
 * absolute positions and rotates the query twice (kvcache.h); the two must
 * agree at every step.
 *
 * Streams of 4W tokens, token by token, for N in {1, 4} and W in {8, 32},
 * and the window policy (N = 0); also the sink normalizer with the window
 * policy (the "evict freely" case). The engine runs with f32 KV for the
 * tight comparison; one f16 KV run checks the default storage more loosely.
 *
 * Sink keys (blk.N.attn_sinks_k, gguf-normalizer.md): the oracle's sink
 * logit of head h is s_h + q.k_g / sqrt(Dh) with q the query BEFORE RoPE, in
 * double, straight from the definition (the sink at distance 0 from every
 * query); the engine rotates k_g with the query's own angles instead. A
 * control with the oracle ignoring the keys shows that they move the logits.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/quant.h"
#include "test.h"
#include "support/rng.h"
#include "support/tiny_model.h"

/*
 * Tolerances. The oracle computes in double; the engine in f32 (f32
 * activations and products, f32 RoPE tables and rotation, f32 online
 * softmax, f32 KV). Each f32 step rounds by 2^-24 ~ 6e-8 relative; the
 * sums run over D = 64 .. F = 128 terms, scores reach ~30 so their absolute
 * error is ~1e-6, and two layers carry that to ~1e-5 relative on logits of
 * magnitude ~30 (measured: 1.4e-5 .. 7.8e-5 over the cases below).
 * ORACLE_TOL = 2e-4: 2.5x the measured worst, while one key too many,
 * one missing or one at the wrong position moves logits by O(1) (the control
 * below shows how much re-encoding sink positions alone matters).
 *
 * With f16 KV (the default storage) K and V are rounded to 11 significant
 * bits (4.9e-4 relative) before attention: scores of magnitude ~30 move by
 * ~1e-2, attention weights by ~1%, logits by ~1e-1 at worst (measured:
 * 0.023). F16_TOL = 0.1: 4x that, and still far below the several units a
 * wrong key set moves logits by.
 */
#define ORACLE_TOL 2e-4
#define F16_TOL 0.1

#define MAX_TOK 256

/* ---- the oracle ---------------------------------------------------------- */

struct oracle {
    const struct model *m;
    int64_t n_sinks, window;
    int absolute_sink_positions; /* control: do NOT re-encode (rotate sinks at their own pos) */
    int ignore_sink_keys;        /* control: score the sink with s_h alone */
    int64_t n_tok;
    double *k_hist; /* [MAX_TOK][L][Hkv*Dh] unrotated keys */
    double *v_hist; /* [MAX_TOK][L][Hkv*Dh] */
};

static void mat_vec(const struct tensor *W, const double *x, double *y)
{
    float *row = malloc((size_t)W->ne0 * sizeof(float));
    for (int64_t n = 0; n < W->ne1; n++) {
        quant_dequant_row(W->type, (const char *)W->data + (size_t)n * W->row_bytes, row, W->ne0);
        double s = 0;
        for (int64_t i = 0; i < W->ne0; i++)
            s += (double)row[i] * x[i];
        y[n] = s;
    }
    free(row);
}

static void rms_norm(const double *x, const struct tensor *g, double eps, int64_t D, double *out)
{
    const float *gw = g->data;
    double ss = 0;
    for (int64_t i = 0; i < D; i++)
        ss += x[i] * x[i];
    double inv = 1.0 / sqrt(ss / (double)D + eps);
    for (int64_t i = 0; i < D; i++)
        out[i] = x[i] * inv * (double)gw[i];
}

/* Pairwise (adjacent-element) RoPE at position pos, all in double. */
static void rope_d(const double *in, double *out, int dh, int64_t pos, double base)
{
    for (int i = 0; i < dh / 2; i++) {
        double theta = pow(base, -2.0 * i / (double)dh);
        double a = (double)pos * theta, c = cos(a), s = sin(a);
        out[2 * i] = in[2 * i] * c - in[2 * i + 1] * s;
        out[2 * i + 1] = in[2 * i] * s + in[2 * i + 1] * c;
    }
}

/* Feeds token t = o->n_tok (its id tok) and writes its logits (V). */
static void oracle_step(struct oracle *o, int32_t tok, double *logits)
{
    const struct model_hparams *hp = &o->m->hp;
    const struct model_weights *w = &o->m->w;
    const int64_t D = hp->n_embd, F = hp->n_ff;
    const int H = hp->n_head, Hkv = hp->n_head_kv, Dh = hp->head_dim, group = H / Hkv;
    const int64_t DKV = (int64_t)Hkv * Dh;
    const int64_t t = o->n_tok;
    double x[256], xn[256], q[256], att[256], tmp[256], gate[512], up[512];
    double qr[64], kr[64];
    float row[256];

    /* the cache this token sees: first N tokens, then the last W (deduplicated) */
    int64_t list[MAX_TOK], n = 0;
    for (int64_t j = 0; j < o->n_sinks && j <= t; j++)
        list[n++] = j;
    for (int64_t j = t - o->window + 1 > o->n_sinks ? t - o->window + 1 : o->n_sinks; j <= t; j++)
        list[n++] = j;

    quant_dequant_row(w->tok_embd.type,
                      (const char *)w->tok_embd.data + (size_t)tok * w->tok_embd.row_bytes, row, D);
    for (int64_t i = 0; i < D; i++)
        x[i] = row[i];
    for (int l = 0; l < hp->n_layer; l++) {
        const struct model_layer *ly = &w->layers[l];
        double *kt = o->k_hist + ((size_t)t * (size_t)hp->n_layer + (size_t)l) * (size_t)DKV;
        double *vt = o->v_hist + ((size_t)t * (size_t)hp->n_layer + (size_t)l) * (size_t)DKV;
        rms_norm(x, &ly->attn_norm, hp->norm_eps, D, xn);
        mat_vec(&ly->wq, xn, q);
        mat_vec(&ly->wk, xn, kt); /* stored unrotated, once, from this token's context */
        mat_vec(&ly->wv, xn, vt);
        for (int h = 0; h < H; h++) {
            const int g = h / group;
            double z[MAX_TOK], mx = -INFINITY;
            for (int64_t i = 0; i < n; i++) {
                const double *kj =
                    o->k_hist + ((size_t)list[i] * (size_t)hp->n_layer + (size_t)l) * (size_t)DKV +
                    (size_t)g * (size_t)Dh;
                /* re-encoded: the key at its index in the cache, the query at the last */
                int64_t kpos = i, qpos = n - 1;
                if (o->absolute_sink_positions && list[i] < o->n_sinks) {
                    kpos = list[i];
                    qpos = t;
                }
                rope_d(q + (int64_t)h * Dh, qr, Dh, qpos, hp->rope_base);
                rope_d(kj, kr, Dh, kpos, hp->rope_base);
                double s = 0;
                for (int d = 0; d < Dh; d++)
                    s += qr[d] * kr[d];
                z[i] = s / sqrt((double)Dh);
                if (z[i] > mx)
                    mx = z[i];
            }
            /* sink term: a virtual key with logit s_h and a zero value */
            double sink = -INFINITY;
            if (hp->normalizer == MODEL_NORM_SINK)
                sink = (double)ly->attn_sinks[h];
            if (hp->normalizer == MODEL_NORM_SINK && ly->attn_sinks_k.data &&
                !o->ignore_sink_keys) {
                const float *kg = (const float *)ly->attn_sinks_k.data + (int64_t)g * Dh;
                double s = 0;
                for (int d = 0; d < Dh; d++)
                    s += q[(int64_t)h * Dh + d] * (double)kg[d]; /* q before RoPE */
                sink += s / sqrt((double)Dh);
            } else if (hp->normalizer == MODEL_NORM_SOFTMAX1)
                sink = 0.0;
            if (sink > mx)
                mx = sink;
            double den = isinf(sink) ? 0.0 : exp(sink - mx);
            for (int64_t i = 0; i < n; i++)
                den += exp(z[i] - mx);
            for (int d = 0; d < Dh; d++) {
                double a = 0;
                for (int64_t i = 0; i < n; i++)
                    a += exp(z[i] - mx) *
                         o->v_hist[((size_t)list[i] * (size_t)hp->n_layer + (size_t)l) *
                                       (size_t)DKV +
                                   (size_t)g * (size_t)Dh + (size_t)d];
                att[(int64_t)h * Dh + d] = a / den;
            }
        }
        mat_vec(&ly->wo, att, tmp);
        for (int64_t i = 0; i < D; i++)
            x[i] += tmp[i];
        rms_norm(x, &ly->ffn_norm, hp->norm_eps, D, xn);
        mat_vec(&ly->w_gate, xn, gate);
        mat_vec(&ly->w_up, xn, up);
        for (int64_t i = 0; i < F; i++)
            gate[i] = gate[i] / (1.0 + exp(-gate[i])) * up[i];
        mat_vec(&ly->w_down, gate, tmp);
        for (int64_t i = 0; i < D; i++)
            x[i] += tmp[i];
    }
    rms_norm(x, &w->output_norm, hp->norm_eps, D, xn);
    mat_vec(&w->output, xn, logits);
    o->n_tok++;
}

/* ---- engine vs oracle ----------------------------------------------------- */

struct result {
    double max_diff, max_abs;
    int64_t worst_step;
    int ok;
};

/* compare's oracle ignores the model's sink keys (the control only) */
static int g_oracle_ignores_sink_keys;

static struct result compare(const struct model *m, int64_t n_sinks, int64_t W, enum kv_dtype dt,
                             int n_threads, int absolute_sinks_in_oracle)
{
    struct result res = {0, 0, -1, 0};
    const int64_t V = m->hp.n_vocab, n_tok = 4 * W;
    struct kv_policy pol = n_sinks > 0 ? (struct kv_policy){KV_POLICY_SINKS, n_sinks}
                                       : (struct kv_policy){KV_POLICY_WINDOW, 0};
    struct tiny_rig r;
    struct tiny_rig_config rc = {
        .policy = pol, .window = W, .chunk = 1, .dtype = dt, .n_threads = n_threads};
    if (n_tok > MAX_TOK || m->hp.n_embd > 256 || m->hp.n_ff > 512 || m->hp.head_dim > 64 ||
        tiny_rig_open(&r, m, &rc) < 0)
        return res;
    const size_t per_tok = (size_t)m->hp.n_layer * (size_t)m->hp.n_head_kv * (size_t)m->hp.head_dim;
    struct oracle o = {.m = m,
                       .n_sinks = n_sinks,
                       .window = W,
                       .absolute_sink_positions = absolute_sinks_in_oracle,
                       .ignore_sink_keys = g_oracle_ignores_sink_keys,
                       .k_hist = calloc(MAX_TOK * per_tok, sizeof(double)),
                       .v_hist = calloc(MAX_TOK * per_tok, sizeof(double))};
    double *ol = malloc((size_t)V * sizeof(double));
    int32_t *toks = malloc((size_t)n_tok * sizeof *toks);
    if (!o.k_hist || !o.v_hist || !ol || !toks)
        goto out;
    tiny_tokens(toks, n_tok, V, 1234 + (uint64_t)W + (uint64_t)n_sinks);
    for (int64_t t = 0; t < n_tok; t++) {
        struct fwd_input in = {&r.seq, toks + t, 1, FWD_LOGITS_LAST};
        if (fwd_step(&r.f, &in, 1) != 1)
            goto out;
        oracle_step(&o, toks[t], ol);
        for (int64_t v = 0; v < V; v++) {
            double e = fabs((double)r.f.logits[v] - ol[v]);
            if (isnan(e))
                e = INFINITY;
            if (e > res.max_diff) {
                res.max_diff = e;
                res.worst_step = t;
            }
            if (fabs(ol[v]) > res.max_abs)
                res.max_abs = fabs(ol[v]);
        }
        if (res.worst_step == t && res.max_diff > ORACLE_TOL && !absolute_sinks_in_oracle &&
            dt == KV_DTYPE_F32)
            fprintf(stderr, "    step %lld: engine %.7g %.7g %.7g oracle %.7g %.7g %.7g\n",
                    (long long)t, (double)r.f.logits[0], (double)r.f.logits[1],
                    (double)r.f.logits[2], ol[0], ol[1], ol[2]);
    }
    res.ok = 1;
out:
    free(o.k_hist);
    free(o.v_hist);
    free(ol);
    free(toks);
    tiny_rig_close(&r);
    return res;
}

static void oracle_case(enum model_normalizer norm, int64_t n_sinks, int64_t W, int n_threads,
                        int *failed)
{
    struct tiny_config cfg = tiny_config_default();
    cfg.normalizer = norm;
    struct tiny_model tm;
    ASSERT_OK(tiny_model_init(&tm, &cfg));
    struct result r = compare(&tm.m, n_sinks, W, KV_DTYPE_F32, n_threads, 0);
    char pol[32];
    if (n_sinks)
        snprintf(pol, sizeof pol, "sinks:%lld", (long long)n_sinks);
    else
        snprintf(pol, sizeof pol, "window");
    printf("  %-8s %-7s W=%-2lld %3lld tokens, %d thr: max logit diff vs oracle %.3g at step "
           "%lld (max |logit| %.3g)\n",
           model_normalizer_name(norm), pol, (long long)W, (long long)(4 * W), n_threads,
           r.max_diff, (long long)r.worst_step, r.max_abs);
    tiny_model_free(&tm);
    ASSERT(r.ok);
    ASSERT(r.max_diff <= ORACLE_TOL);
}

TEST(sinks1_window8_matches_the_reencoding_oracle)
{
    oracle_case(MODEL_NORM_SOFTMAX, 1, 8, 1, failed);
}

TEST(sinks1_window32_matches_the_reencoding_oracle)
{
    oracle_case(MODEL_NORM_SOFTMAX, 1, 32, 1, failed);
}

TEST(sinks4_window8_matches_the_reencoding_oracle)
{
    oracle_case(MODEL_NORM_SOFTMAX, 4, 8, 1, failed);
}

TEST(sinks4_window32_matches_the_reencoding_oracle)
{
    oracle_case(MODEL_NORM_SOFTMAX, 4, 32, 1, failed);
}

TEST(window_policy_matches_the_reencoding_oracle)
{
    oracle_case(MODEL_NORM_SOFTMAX, 0, 8, 1, failed);
    oracle_case(MODEL_NORM_SOFTMAX, 0, 32, 1, failed);
}

TEST(sink_normalizer_with_window_policy_matches_the_oracle)
{
    oracle_case(MODEL_NORM_SINK, 0, 8, 1, failed);
    oracle_case(MODEL_NORM_SOFTMAX1, 4, 8, 1, failed);
}

/* Two threads: decode steps split each row's keys across threads and merge
 * the partial states with the sink term added once (flash-decoding); the
 * splits cut between sink and window keys too. Same ORACLE_TOL: only the
 * order of f32 sums changes. */
TEST(split_key_attention_on_two_threads_matches_the_oracle)
{
    oracle_case(MODEL_NORM_SOFTMAX, 4, 32, 2, failed);
    oracle_case(MODEL_NORM_SINK, 0, 32, 2, failed);
    oracle_case(MODEL_NORM_SOFTMAX1, 1, 8, 2, failed);
}

TEST(f16_kv_matches_the_oracle_within_f16_rounding)
{
    struct tiny_config cfg = tiny_config_default();
    struct tiny_model tm;
    ASSERT_OK(tiny_model_init(&tm, &cfg));
    struct result r = compare(&tm.m, 4, 8, KV_DTYPE_F16, 1, 0);
    printf("  f16 KV, sinks:4 W=8: max logit diff vs oracle %.3g (tolerance %g)\n", r.max_diff,
           F16_TOL);
    tiny_model_free(&tm);
    ASSERT(r.ok);
    ASSERT(r.max_diff <= F16_TOL);
}

TEST(control_sink_positions_matter_so_the_oracle_comparison_can_fail)
{
    /* An oracle that keeps sink keys at their absolute positions (no
     * re-encoding) must disagree with the engine by far more than
     * ORACLE_TOL, or the tests above could not tell the schemes apart. */
    struct tiny_config cfg = tiny_config_default();
    struct tiny_model tm;
    ASSERT_OK(tiny_model_init(&tm, &cfg));
    struct result r = compare(&tm.m, 4, 8, KV_DTYPE_F32, 1, 1);
    printf("  control: engine vs oracle without re-encoding, sinks:4 W=8: max logit diff %.3g\n",
           r.max_diff);
    tiny_model_free(&tm);
    ASSERT(r.ok);
    ASSERT(r.max_diff > 100 * ORACLE_TOL);
}

/* Random sink keys k_g ~ N(0, 1) on every layer of a sink model (the
 * tensors model_load would bind from blk.N.attn_sinks_k); keys[] holds them. */
static void set_sink_keys(struct tiny_model *tm, float *keys)
{
    const struct model_hparams *hp = &tm->m.hp;
    const int64_t n = (int64_t)hp->n_head_kv * hp->head_dim;
    uint64_t s = 77;
    for (int l = 0; l < hp->n_layer; l++) {
        for (int64_t i = 0; i < n; i++)
            keys[l * n + i] = (float)test_rng_normal(&s);
        tm->m.w.layers[l].attn_sinks_k = (struct tensor){.data = keys + l * n,
                                                         .type = QTYPE_F32,
                                                         .ne0 = hp->head_dim,
                                                         .ne1 = hp->n_head_kv,
                                                         .row_bytes = (size_t)hp->head_dim * 4};
    }
}

static void sink_key_case(int64_t n_sinks, int64_t W, int n_threads, int ignore_keys,
                          double *max_diff, int *failed)
{
    struct tiny_config cfg = tiny_config_default();
    cfg.normalizer = MODEL_NORM_SINK;
    struct tiny_model tm;
    ASSERT_OK(tiny_model_init(&tm, &cfg));
    float keys[8 * 2 * 16];
    ASSERT((size_t)cfg.n_layer * cfg.n_head_kv * cfg.head_dim <= sizeof keys / sizeof keys[0]);
    set_sink_keys(&tm, keys);
    g_oracle_ignores_sink_keys = ignore_keys;
    struct result r = compare(&tm.m, n_sinks, W, KV_DTYPE_F32, n_threads, 0);
    g_oracle_ignores_sink_keys = 0;
    printf("  sink keys%s, %s%lld W=%-2lld %d thr: max logit diff vs oracle %.3g at step %lld\n",
           ignore_keys ? " (oracle ignores them)" : "", n_sinks ? "sinks:" : "window ",
           (long long)n_sinks, (long long)W, n_threads, r.max_diff, (long long)r.worst_step);
    tiny_model_free(&tm);
    ASSERT(r.ok);
    *max_diff = r.max_diff;
}

TEST(sink_keys_match_the_oracle_that_scores_q_before_rope)
{
    double d;
    sink_key_case(0, 8, 1, 0, &d, failed);
    ASSERT(d <= ORACLE_TOL);
    sink_key_case(0, 32, 2, 0, &d, failed);
    ASSERT(d <= ORACLE_TOL);
    sink_key_case(4, 8, 1, 0, &d, failed); /* pinned sinks too: qc rotates differently */
    ASSERT(d <= ORACLE_TOL);
}

TEST(control_sink_keys_matter_so_the_comparison_can_fail)
{
    double d;
    sink_key_case(0, 8, 1, 1, &d, failed);
    ASSERT(d > 100 * ORACLE_TOL);
}

TEST_MAIN()
