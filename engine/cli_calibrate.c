/*
 * cli_calibrate.c: `streamsink calibrate`, the closed-form learned-sink
 * retrofit of a vanilla model (DESIGN.md "Model files"): one sink logit per
 * head, set so that a null key takes over the job of the first token.
 *
 * Estimator. Under dense attention a head's query t (context >= PROBE_MIN_CTX)
 * puts a_t = e^{z_t0} / (e^{z_t0} + R_t) on the first position, where
 * R_t = Σ_{j>0} e^{z_tj}. Once the first token is evicted, a null key with
 * logit s gets σ(s − log R_t) of the query's attention. For one query the
 * closed form s = log(a_t / (1 − a_t)) + log R_t = z_t0 hands the null key
 * exactly the first token's share. Over many queries no single s does that
 * for all, so we match the first moment, the quantity the probe reports:
 *
 *     mean_t σ(s − log R_t) = mean_t a_t,
 *
 * solved for s by bisection (the left side is increasing in s). This is
 * better behaved than averaging z_t0 itself: queries whose first-position
 * logit is large but whose mass is already ~1 (or ~0) saturate σ, so they
 * cannot drag s far, and a head that never looks at the first token gets a
 * very negative s (its null key stays silent) rather than an average of
 * arbitrary logits.
 *
 * probe_run only returns weights, not the logits z, so this file runs its own
 * copy of forward.c's step (same ops, same order) over the whole calibration
 * text in one dense step, and reads each layer's rotated q and k right after
 * the RoPE op. As a check it then runs probe_run on the same tokens and prints
 * the largest difference between its first-position mass and ours.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "engine.h"
#include "probe.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: streamsink calibrate [-m FILE] --text FILE --out FILE [--tokens N]\n"
               "\n"
               "Measures each head's attention on the first position under dense attention\n"
               "and writes one sink logit per head (layers x heads numbers, one line per\n"
               "layer) for tools/retrofit_sinks.py.\n"
               "\n"
               "  -m, --model FILE   GGUF model (default: the fetched SmolLM2-135M)\n"
               "      --text FILE    calibration text\n"
               "      --out FILE     where to write the sink logits\n"
               "      --tokens N     use the first N tokens of the text (default 1024)\n"
               "  -t, --threads N    CPU threads (default 2)\n"
               "  -h, --help         this text\n");
}

/* Per head, the statistics of each counted query t. */
struct calib_acc {
    int64_t n_q;  /* queries counted per head */
    double *logr; /* [L*H][n_q] log Σ_{j>0} e^{z_tj} */
    double *mass; /* [L*H] Σ_t a_t */
};

/* Scores every counted query of layer l against its keys 0..t (dense, one
 * sequence, T tokens starting at position 0): q (T, H*Dh) and k (T, Hkv*Dh),
 * both rotated at absolute positions. */
static void calib_layer(const struct model_hparams *hp, int l, const float *q, const float *k,
                        int64_t T, double *z, struct calib_acc *acc)
{
    const int H = hp->n_head, Hkv = hp->n_head_kv, Dh = hp->head_dim;
    const double scale = 1.0 / sqrt((double)Dh);
    for (int h = 0; h < H; h++) {
        const int hk = h / (H / Hkv);
        double *logr = acc->logr + ((size_t)l * H + h) * (size_t)acc->n_q;
        for (int64_t t = PROBE_MIN_CTX; t < T; t++) {
            const float *qt = q + (size_t)t * H * Dh + (size_t)h * Dh;
            double m = -INFINITY;
            for (int64_t j = 0; j <= t; j++) {
                const float *kj = k + (size_t)j * Hkv * Dh + (size_t)hk * Dh;
                double s = 0;
                for (int d = 0; d < Dh; d++)
                    s += (double)qt[d] * (double)kj[d];
                z[j] = s * scale;
                if (j > 0 && z[j] > m)
                    m = z[j];
            }
            double r = 0; /* Σ_{j>0} e^{z_j - m} */
            for (int64_t j = 1; j <= t; j++)
                r += exp(z[j] - m);
            double lr = m + log(r);
            logr[t - PROBE_MIN_CTX] = lr;
            acc->mass[(size_t)l * H + h] += 1.0 / (1.0 + exp(lr - z[0])); /* a_t */
        }
    }
}

/* forward.c's fwd_step for one dense sequence of T tokens in one step, with
 * calib_layer after each layer's RoPE. Returns 0 or a negative errno. */
static int calib_forward(struct fwd *f, struct kv_seq *seq, const int32_t *ids, int64_t T,
                         struct calib_acc *acc)
{
    const struct model_hparams *hp = &f->m->hp;
    const struct model_weights *w = &f->m->w;
    struct backend *b = f->b;
    const struct backend_ops *op = b->ops;
    struct backend_acts *a = &b->acts;
    if (T > f->max_tokens || kv_seq_can_append(seq, &f->pool.geo, T) < 0)
        return -EINVAL;
    for (int64_t t = 0; t < T; t++) {
        f->tokens[t] = ids[t];
        f->pos[t] = t;
        f->slot[t] = seq->slot;
        f->cell[t] = kv_seq_cell(seq, t);
        f->view[t] = kv_seq_view(seq, t);
        f->seq[t] = seq;
    }
    struct fwd_batch bt = {.T = T,
                           .tokens = f->tokens,
                           .pos = f->pos,
                           .slot = f->slot,
                           .cell = f->cell,
                           .view = f->view,
                           .seq = f->seq,
                           .n_out = 0,
                           .out_rows = f->out_rows};
    double *z = malloc((size_t)T * sizeof *z);
    if (!z)
        return -ENOMEM;
    if (op->begin_step(b, &bt) < 0) {
        free(z);
        return -EINVAL;
    }
    op->embed(b, a->x);
    for (int l = 0; l < hp->n_layer; l++) {
        const struct model_layer *ly = &w->layers[l];
        op->rmsnorm(b, a->x, &ly->attn_norm, a->xb, T);
        op->matmul(b, &ly->wq, a->xb, a->q, T);
        op->matmul(b, &ly->wk, a->xb, a->k, T);
        op->matmul(b, &ly->wv, a->xb, a->v, T);
        op->rope(b, a->q, a->qc, a->k);
        calib_layer(hp, l, a->q, a->k, T, z, acc); /* the one addition to fwd_step */
        op->kv_store(b, l, a->k, a->v);
        op->attention(b, l, a->q, a->qc, ly->attn_sinks, hp->normalizer, a->att, NULL);
        op->matmul(b, &ly->wo, a->att, a->xb2, T);
        op->add(b, a->x, a->xb2, T);
        op->rmsnorm(b, a->x, &ly->ffn_norm, a->xb, T);
        op->matmul(b, &ly->w_gate, a->xb, a->hb, T);
        op->matmul(b, &ly->w_up, a->xb, a->hb2, T);
        op->swiglu(b, a->hb, a->hb2, T);
        op->matmul(b, &ly->w_down, a->hb, a->xb2, T);
        op->add(b, a->x, a->xb2, T);
    }
    free(z);
    if (op->sync(b) < 0)
        return -EIO;
    kv_seq_advance(seq, T);
    return 0;
}

/* Solves mean_t σ(s − logr_t) = target for s (see the top of the file). */
static double solve_sink(const double *logr, int64_t n, double target)
{
    double lo = -60, hi = 60;
    if (target <= 0)
        return lo;
    for (int it = 0; it < 100; it++) {
        double s = 0.5 * (lo + hi), m = 0;
        for (int64_t t = 0; t < n; t++)
            m += 1.0 / (1.0 + exp(logr[t] - s));
        if (m / (double)n < target)
            lo = s;
        else
            hi = s;
    }
    return 0.5 * (lo + hi);
}

int engine_cmd_calibrate(int argc, char **argv)
{
    const char *model = cli_default_model(), *text_path = NULL, *out_path = NULL;
    int64_t max_tok = 1024, threads = 2;
    const struct cli_opt opts[] = {
        {"-m", "--model", CLI_STR, &model, 0, 0, NULL},
        {NULL, "--text", CLI_STR, &text_path, 0, 0, NULL},
        {NULL, "--out", CLI_STR, &out_path, 0, 0, NULL},
        {NULL, "--tokens", CLI_I64, &max_tok, PROBE_MIN_CTX + 1, 8192, NULL},
        {"-t", "--threads", CLI_I64, &threads, 1, 256, NULL},
    };
    int prc = cli_parse(argc, argv, opts, (int)(sizeof opts / sizeof opts[0]), "calibrate", usage);
    if (prc >= 0)
        return prc;
    if (!text_path || !out_path) {
        fprintf(stderr, "error: calibrate needs --text FILE and --out FILE\n");
        usage(stderr);
        return ENGINE_EXIT_USAGE;
    }
    size_t len;
    char *text = cli_read_file(text_path, &len);
    if (!text) {
        fprintf(stderr, "error: cannot read %s: %s\n", text_path, strerror(errno));
        return ENGINE_EXIT_USAGE;
    }
    struct cli_local L;
    struct cli_local_config cfg = {.model_path = model,
                                   .n_threads = (int)threads,
                                   .max_tokens = max_tok,
                                   .n_sinks = 0,
                                   .window = max_tok,
                                   .n_slots = 1,
                                   .kv_dtype = KV_DTYPE_F32};
    int rc = cli_local_open(&L, &cfg);
    if (rc != ENGINE_EXIT_OK) {
        free(text);
        return rc;
    }
    const struct model_hparams *hp = &L.model.hp;
    const int LH = hp->n_layer * hp->n_head;
    int exit_code = ENGINE_EXIT_OK;
    struct calib_acc acc = {0};
    struct probe_result pr = {0};
    int64_t cap = (int64_t)len + 2;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    int64_t n = ids ? tok_encode(L.tok, text, len, tok_add_bos(L.tok), 0, ids, cap) : -ENOMEM;
    if (n > max_tok)
        n = max_tok;
    if (n <= PROBE_MIN_CTX) {
        fprintf(stderr, "error: calibration needs more than %d tokens of text (got %lld)\n",
                PROBE_MIN_CTX, (long long)n);
        exit_code = ENGINE_EXIT_USAGE;
        goto out;
    }
    acc.n_q = n - PROBE_MIN_CTX;
    acc.logr = malloc((size_t)LH * (size_t)acc.n_q * sizeof *acc.logr);
    acc.mass = calloc((size_t)LH, sizeof *acc.mass);
    if (!acc.logr || !acc.mass) {
        exit_code = ENGINE_EXIT_RUNTIME;
        goto out;
    }
    int64_t slot;
    if (kv_pool_acquire(&L.fwd.pool, &slot) < 0) {
        exit_code = ENGINE_EXIT_RUNTIME;
        goto out;
    }
    struct kv_seq seq;
    kv_seq_init(&seq, &L.fwd.pool.geo, slot, (struct kv_policy){KV_POLICY_DENSE, 0}, n, 0);
    rc = calib_forward(&L.fwd, &seq, ids, n, &acc);
    kv_pool_release(&L.fwd.pool, slot);
    if (rc < 0 || probe_run(&L.fwd, ids, n, &pr) < 0) {
        fprintf(stderr, "error: calibration forward failed (%d)\n", rc);
        exit_code = ENGINE_EXIT_RUNTIME;
        goto out;
    }
    FILE *f = fopen(out_path, "w");
    if (!f) {
        fprintf(stderr, "error: cannot write %s: %s\n", out_path, strerror(errno));
        exit_code = ENGINE_EXIT_USAGE;
        goto out;
    }
    fprintf(f,
            "# sink logits from streamsink calibrate: %d layers x %d heads, one line per layer\n"
            "# model %s, %lld tokens of %s, %lld queries per head; estimator: mean null-key\n"
            "# mass under window-only = mean first-position mass under dense attention\n",
            hp->n_layer, hp->n_head, hp->name, (long long)n, text_path, (long long)acc.n_q);
    double worst = 0;
    printf("layer  head  first1  sink_logit\n");
    for (int l = 0; l < hp->n_layer; l++) {
        for (int h = 0; h < hp->n_head; h++) {
            int i = l * hp->n_head + h;
            double a = acc.mass[i] / (double)acc.n_q;
            double s = solve_sink(acc.logr + (size_t)i * (size_t)acc.n_q, acc.n_q, a);
            double d = fabs(a - (double)pr.mass1[i]);
            worst = d > worst ? d : worst;
            fprintf(f, "%s%.6f", h ? " " : "", s);
            printf("%5d  %4d  %6.3f  %10.4f\n", l, h, a, s);
        }
        fprintf(f, "\n");
    }
    if (fclose(f) != 0)
        exit_code = ENGINE_EXIT_RUNTIME;
    printf("wrote %d sink logits to %s; first-position mass agrees with the probe to %.2e\n", LH,
           out_path, worst);
out:
    probe_free(&pr);
    free(acc.logr);
    free(acc.mass);
    free(ids);
    free(text);
    cli_local_close(&L);
    return exit_code;
}
