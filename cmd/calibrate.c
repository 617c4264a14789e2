/*
 * calibrate.c: `streamsink calibrate`, the closed-form learned-sink
 * retrofit of a vanilla model (DESIGN.md "Model files"): one sink logit per
 * head, set so that a null key takes over the job of the first token.
 *
 * Estimator. Under dense attention a head's query t (position >= DECODER_PROBE_MIN_CTX)
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
 * The probe only returns weights, not the logits z, so this command runs the
 * whole calibration text through the decoder in one dense step with an
 * observer that asks for each layer's rotated q and k (decoder.h) and scores
 * them itself, as the layer does: its scale, and a local layer's sliding
 * window (a query that no longer sees position 0 has a_t = 0 there). As a
 * check it then runs the probe on the same tokens and prints the largest
 * difference between its first-position mass and ours. The observer asks
 * for the first-position weights too, unread: that puts this pass on the
 * probe's attention path, so the two passes compute the same activations
 * (on the other path they agree to rounding, which the 8-bit activations
 * of the products then carry into a difference of about 1e-2 a query).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"
#include "cmd.h"
#include "decoder.h"
#include "engine.h"

/* Per head, the statistics of each counted query t. */
struct calib_acc {
    int64_t n_q;  /* queries counted per head */
    double *logr; /* [L*H][n_q] log Σ_{j>0} e^{z_tj} */
    double *mass; /* [L*H] Σ_t a_t */
    double *z;    /* [T] one query's logits */
};

/* The observer: scores every counted query of a layer against its keys 0..t
 * (dense, one sequence, T tokens starting at position 0): q (T, H*Dh) and
 * k (T, Hkv*Dh), both rotated at absolute positions. */
static void calib_layer(void *arg, const struct decoder_layer_view *v)
{
    struct calib_acc *acc = arg;
    const int H = v->n_head, Hkv = v->n_head_kv, Dh = v->head_dim, l = v->layer;
    const float *q = v->q, *k = v->k;
    double *z = acc->z;
    const double scale = (double)v->scale;
    for (int h = 0; h < H; h++) {
        const int hk = h / (H / Hkv);
        double *logr = acc->logr + ((size_t)l * H + h) * (size_t)acc->n_q;
        for (int64_t t = DECODER_PROBE_MIN_CTX; t < v->T; t++) {
            const float *qt = q + (size_t)t * H * Dh + (size_t)h * Dh;
            /* the keys the query sees: all, or a local layer's newest window */
            const int64_t j0 = v->window > 0 && t + 1 > v->window ? t + 1 - v->window : 0;
            double m = -INFINITY;
            for (int64_t j = j0; j <= t; j++) {
                const float *kj = k + (size_t)j * Hkv * Dh + (size_t)hk * Dh;
                double s = 0;
                for (int d = 0; d < Dh; d++)
                    s += (double)qt[d] * (double)kj[d];
                z[j] = s * scale;
                if (j > 0 && z[j] > m)
                    m = z[j];
            }
            double r = 0; /* Σ_{j>0, seen} e^{z_j - m} */
            for (int64_t j = j0 > 1 ? j0 : 1; j <= t; j++)
                r += exp(z[j] - m);
            double lr = m + log(r);
            logr[t - DECODER_PROBE_MIN_CTX] = lr;
            if (j0 == 0)
                acc->mass[(size_t)l * H + h] += 1.0 / (1.0 + exp(lr - z[0])); /* a_t */
        }
    }
}

/* Runs ids[0..T) as one dense step of a fresh sequence with calib_layer
 * observing every layer. Returns 0 or a negative errno. */
static int calib_forward(struct decoder *d, const int32_t *ids, int64_t T, struct calib_acc *acc)
{
    const struct engine_policy dense = {ENGINE_POLICY_DENSE, 0};
    const struct decoder_observer obs = {DECODER_OBSERVE_QK | DECODER_OBSERVE_FIRST, calib_layer,
                                         acc};
    int64_t seq = decoder_seq_open(d, &dense, T);
    if (seq < 0)
        return (int)seq;
    int rc = decoder_set_observer(d, &obs);
    if (rc == 0) {
        struct decoder_input in = {seq, ids, T, DECODER_LOGITS_NONE};
        int64_t r = decoder_step(d, &in, 1);
        rc = r < 0 ? (int)r : 0;
        decoder_set_observer(d, NULL);
    }
    decoder_seq_close(d, seq);
    return rc;
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

int cmd_calibrate(int argc, char **argv)
{
    const char *model = cmd_default_model(), *text_path = NULL, *out_path = NULL;
    int64_t max_tok, threads;
    const struct cmd_flag flags[] = {
        {"-m", "--model", CMD_STR, &model, 0, 0, NULL, "FILE", CMD_MODEL_HELP, NULL},
        {NULL, "--text", CMD_STR, &text_path, 0, 0, NULL, "FILE", "calibration text", NULL},
        {NULL, "--out", CMD_STR, &out_path, 0, 0, NULL, "FILE", "where to write the sink logits",
         NULL},
        {NULL, "--tokens", CMD_I64, &max_tok, DECODER_PROBE_MIN_CTX + 1, 8192, "1024", "N",
         "use the first N tokens of the text", NULL},
        {"-t", "--threads", CMD_I64, &threads, 1, 256, "2", "N", "CPU threads", NULL},
    };
    const struct cmd_spec spec = {
        "calibrate",
        "[-m FILE] --text FILE --out FILE [--tokens N]",
        "Measures each head's attention on the first position under dense attention\n"
        "and writes one sink logit per head (layers x heads numbers, one line per\n"
        "layer) for tools/retrofit_sinks.py.",
        flags,
        (int)(sizeof flags / sizeof flags[0]),
        NULL};
    int prc = cmd_parse(&spec, argc, argv);
    if (prc >= 0)
        return prc;
    if (!text_path || !out_path) {
        fprintf(stderr, "error: calibrate needs --text FILE and --out FILE\n");
        cmd_usage(&spec, stderr);
        return CMD_EXIT_USAGE;
    }
    size_t len;
    char *text = cmd_read_file(text_path, &len);
    if (!text) {
        fprintf(stderr, "error: cannot read %s: %s\n", text_path, strerror(errno));
        return CMD_EXIT_USAGE;
    }
    struct decoder *d;
    struct decoder_config cfg = {.model_path = model,
                                 .n_threads = (int)threads,
                                 .max_tokens = max_tok,
                                 .n_sinks = 0,
                                 .window = max_tok,
                                 .n_slots = 1,
                                 .kv_dtype = ENGINE_KV_F32};
    int rc = cmd_open_decoder(&d, &cfg);
    if (rc != CMD_EXIT_OK) {
        free(text);
        return rc;
    }
    struct decoder_info hp;
    decoder_get_info(d, &hp);
    const int LH = hp.n_layer * hp.n_head;
    int exit_code = CMD_EXIT_OK;
    struct calib_acc acc = {0};
    struct decoder_probe pr = {0};
    int32_t *ids = NULL;
    int64_t n = cmd_tokenize_text(d, text, len, hp.add_bos, &ids);
    if (n < 0) {
        exit_code = CMD_EXIT_RUNTIME;
        goto out;
    }
    if (n > max_tok)
        n = max_tok;
    if (n <= DECODER_PROBE_MIN_CTX) {
        fprintf(stderr, "error: calibration needs more than %d tokens of text (got %lld)\n",
                DECODER_PROBE_MIN_CTX, (long long)n);
        exit_code = CMD_EXIT_USAGE;
        goto out;
    }
    acc.n_q = n - DECODER_PROBE_MIN_CTX;
    acc.logr = malloc((size_t)LH * (size_t)acc.n_q * sizeof *acc.logr);
    acc.mass = calloc((size_t)LH, sizeof *acc.mass);
    acc.z = malloc((size_t)n * sizeof *acc.z);
    if (!acc.logr || !acc.mass || !acc.z) {
        exit_code = CMD_EXIT_RUNTIME;
        goto out;
    }
    rc = calib_forward(d, ids, n, &acc);
    if (rc < 0 || decoder_probe_run(d, ids, n, &pr) < 0) {
        fprintf(stderr, "error: calibration forward failed (%d)\n", rc);
        exit_code = CMD_EXIT_RUNTIME;
        goto out;
    }
    FILE *f = fopen(out_path, "w");
    if (!f) {
        fprintf(stderr, "error: cannot write %s: %s\n", out_path, strerror(errno));
        exit_code = CMD_EXIT_USAGE;
        goto out;
    }
    /* the names are anybody's bytes: a newline in one would end its comment
     * line, and the next would not parse as numbers (each byte may become
     * U+FFFD's three) */
    size_t name_cap = 3 * strlen(hp.name) + 1, text_cap = 3 * strlen(text_path) + 1;
    char *name = malloc(name_cap), *text_name = malloc(text_cap);
    if (!name || !text_name) {
        free(name);
        free(text_name);
        fclose(f);
        exit_code = CMD_EXIT_RUNTIME;
        goto out;
    }
    api_text_clean(name, name_cap, hp.name);
    api_text_clean(text_name, text_cap, text_path);
    fprintf(f,
            "# sink logits from streamsink calibrate: %d layers x %d heads, one line per layer\n"
            "# model %s, %lld tokens of %s, %lld queries per head; estimator: mean null-key\n"
            "# mass under window-only = mean first-position mass under dense attention\n",
            hp.n_layer, hp.n_head, name, (long long)n, text_name, (long long)acc.n_q);
    free(name);
    free(text_name);
    double worst = 0;
    printf("layer  head  first1  sink_logit\n");
    for (int l = 0; l < hp.n_layer; l++) {
        for (int h = 0; h < hp.n_head; h++) {
            int i = l * hp.n_head + h;
            double a = acc.mass[i] / (double)acc.n_q;
            double s = solve_sink(acc.logr + (size_t)i * (size_t)acc.n_q, acc.n_q, a);
            double diff = fabs(a - (double)pr.mass1[i]);
            worst = diff > worst ? diff : worst;
            fprintf(f, "%s%.6f", h ? " " : "", s);
            printf("%5d  %4d  %6.3f  %10.4f\n", l, h, a, s);
        }
        fprintf(f, "\n");
    }
    if (cmd_close_output(f, out_path) != CMD_EXIT_OK) {
        exit_code = CMD_EXIT_RUNTIME;
        goto out;
    }
    printf("wrote %d sink logits to %s; first-position mass agrees with the probe to %.2e\n", LH,
           out_path, worst);
out:
    decoder_probe_free(&pr);
    free(acc.logr);
    free(acc.mass);
    free(acc.z);
    free(ids);
    free(text);
    decoder_close(d);
    return exit_code;
}
