/*
 * perplexity.c: `streamsink perplexity`, StreamingLLM's evaluation
 * protocol: feed the text one token at a time, score the next token, let the
 * policy evict. Prints overall and per-bin perplexity, KV bytes and speed;
 * --json also writes every token's negative log-likelihood for plotting.
 *
 * recompute (StreamingLLM's "sliding window with re-computation" baseline)
 * re-runs the last W tokens from scratch, at positions 0..W-1, for every
 * scored token: O(W) work per token, so it is for short stretches. For a
 * model whose tokenizer puts BOS first (Gemma), the window is BOS and the
 * last W-1 tokens: each recomputed window starts as a fresh request does.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api.h"
#include "cmd.h"
#include "decoder.h"
#include "engine.h"

int64_t cmd_recompute_window(const int32_t *ids, int64_t t, int64_t window, int32_t bos,
                             int32_t *out)
{
    int64_t s0 = t + 1 > window ? t + 1 - window : 0, k = 0;
    if (s0 > 0 && bos >= 0 && window >= 2) { /* slid past ids[0] == BOS: keep it first */
        out[k++] = bos;
        s0++;
    }
    for (int64_t i = s0; i <= t; i++)
        out[k++] = ids[i];
    return k;
}

/* s as a JSON string (a model's general.name is whatever its file says);
 * 0, or -1 when out of memory. */
static int json_string(FILE *f, const char *s)
{
    char *j = api_json_string(s, strlen(s));
    if (!j)
        return -1;
    fputs(j, f);
    free(j);
    return 0;
}

static void progress(int64_t done, int64_t total, double nll_sum, double t0)
{
    double el = cmd_now() - t0;
    int width = 30, filled = total > 0 ? (int)((double)width * (double)done / (double)total) : 0;
    char bar[64];
    for (int i = 0; i < width; i++)
        bar[i] = i < filled ? '=' : (i == filled ? '>' : ' ');
    bar[width] = 0;
    fprintf(stderr, "\r[%s] %lld/%lld  ppl %.3f  %.1f tok/s ", bar, (long long)done,
            (long long)total, done > 0 ? exp(nll_sum / (double)done) : 0.0,
            el > 0 ? (double)done / el : 0.0);
}

int cmd_perplexity(int argc, char **argv)
{
    const char *model = cmd_default_model(), *text_path = NULL, *json = NULL, *policy_s;
    const char *kv_dtype_s = NULL;
    enum engine_kv_dtype kv_dtype;
    char policy_buf[32];
    enum engine_backend backend;
    int64_t window, max_tokens = 0, bin, threads, sinks = -1, stride;
    int kv_f32 = 0, no_progress = 0, window_set = 0, policy_set = 0;
    const struct cmd_flag flags[] = {
        {"-m", "--model", CMD_STR, &model, 0, 0, NULL, "FILE", CMD_MODEL_HELP, NULL},
        {NULL, "--text", CMD_STR, &text_path, 0, 0, NULL, "FILE", "UTF-8 text to score", NULL},
        {NULL, "--policy", CMD_STR, &policy_s, 0, 0, "auto", "P",
         "auto | window | sinks:N | dense | recompute", &policy_set},
        {NULL, "--window", CMD_I64, &window, 1, (double)((int64_t)1 << 32), "1024", "W",
         "window tokens (dense without --window: the model's context)", &window_set},
        {NULL, "--sinks", CMD_I64, &sinks, 0, DECODER_MAX_SINKS, NULL, "N",
         "shorthand for --policy sinks:N", NULL},
        {NULL, "--max-tokens", CMD_I64, &max_tokens, 1, (double)((int64_t)1 << 40), NULL, "N",
         "score at most N tokens (default: the whole text)", NULL},
        {NULL, "--bin", CMD_I64, &bin, 1, (double)((int64_t)1 << 30), "512", "N",
         "tokens per reported bin", NULL},
        {NULL, "--stride", CMD_I64, &stride, 1, 1 << 20, "1", "K",
         "recompute only: score every K-th token", NULL},
        {NULL, "--json", CMD_STR, &json, 0, 0, NULL, "FILE",
         "write the results and every token's NLL as JSON", NULL},
        {"-t", "--threads", CMD_I64, &threads, 1, 256, "2", "N", "CPU threads", NULL},
        {NULL, "--backend", CMD_BACKEND, &backend, 0, 0, "cpu", "B", "cpu or cuda", NULL},
        {NULL, "--kv-dtype", CMD_STR, &kv_dtype_s, 0, 0, NULL, "T",
         "KV cache storage: f16 (default) | f32 | q8_0", NULL},
        {NULL, "--kv-f32", CMD_BOOL, &kv_f32, 0, 0, NULL, "", "the same as --kv-dtype f32", NULL},
        {NULL, "--no-progress", CMD_BOOL, &no_progress, 0, 0, NULL, "",
         "no progress bar even on a terminal", NULL},
    };
    const struct cmd_spec spec = {
        "perplexity",
        "[-m FILE] --text FILE [--policy P] [--window W] [--sinks N] [options]",
        "Scores a text one token at a time under a KV eviction policy (StreamingLLM's\n"
        "protocol) and prints perplexity overall and per bin, KV bytes and tokens/s.",
        flags,
        (int)(sizeof flags / sizeof flags[0]),
        NULL};
    int prc = cmd_parse(&spec, argc, argv);
    if (prc >= 0)
        return prc;
    if (!text_path) {
        fprintf(stderr, "error: --text FILE is required\n");
        return CMD_EXIT_USAGE;
    }
    if (cmd_kv_dtype(kv_dtype_s, kv_f32, &kv_dtype) != CMD_EXIT_OK)
        return CMD_EXIT_USAGE;
    struct engine_policy pol;
    if (engine_policy_parse(policy_s, &pol) < 0) {
        fprintf(stderr, "error: --policy '%s' (auto, window, sinks:N, dense or recompute)\n",
                policy_s);
        return CMD_EXIT_USAGE;
    }
    if (sinks >= 0) {
        if (policy_set && (pol.kind != ENGINE_POLICY_SINKS || pol.n_sinks != sinks)) {
            fprintf(stderr, "error: --sinks %lld means --policy sinks:%lld, but --policy is '%s'\n",
                    (long long)sinks, (long long)sinks, policy_s);
            return CMD_EXIT_USAGE;
        }
        snprintf(policy_buf, sizeof policy_buf, "sinks:%lld", (long long)sinks);
        policy_s = policy_buf;
        if (engine_policy_parse(policy_s, &pol) < 0) {
            fprintf(stderr, "error: --sinks %lld is not a policy\n", (long long)sinks);
            return CMD_EXIT_USAGE;
        }
    }
    if (pol.kind == ENGINE_POLICY_DENSE && window_set && window < 2) {
        fprintf(stderr,
                "error: --policy dense with --window %lld scores no token: a token is "
                "scored from those before it in the window (--window 2 or more)\n",
                (long long)window);
        return CMD_EXIT_USAGE;
    }
    if (stride > 1 && pol.kind != ENGINE_POLICY_RECOMPUTE) {
        fprintf(stderr, "error: --stride is for --policy recompute (the others must feed every "
                        "token anyway)\n");
        return CMD_EXIT_USAGE;
    }
    size_t text_len = 0;
    char *text = cmd_read_file(text_path, &text_len);
    if (!text) {
        fprintf(stderr, "error: cannot read %s: %s\n", text_path, strerror(errno));
        return CMD_EXIT_USAGE;
    }

    /* Open once with the largest window any policy here may need; the
     * sequence itself gets the policy's window. recompute re-runs a window in
     * one step: no longer than the text can make (one token per byte, plus
     * BOS), and the decoder keeps it within the model's context. */
    int is_dense = pol.kind == ENGINE_POLICY_DENSE, is_rec = pol.kind == ENGINE_POLICY_RECOMPUTE;
    int64_t step_max = window < (int64_t)text_len + 2 ? window : (int64_t)text_len + 2;
    struct decoder *d;
    struct decoder_config cfg = {
        .model_path = model,
        .n_threads = (int)threads,
        .backend = backend,
        .max_tokens = is_rec ? step_max : 1,
        .n_sinks = pol.kind == ENGINE_POLICY_SINKS && pol.n_sinks > DECODER_DEFAULT_SINKS
                       ? pol.n_sinks
                       : DECODER_DEFAULT_SINKS,
        .window = is_dense && !window_set ? 0 : window,
        .n_slots = 1,
        .kv_dtype = kv_dtype,
    };
    int rc = cmd_open_decoder(&d, &cfg);
    if (rc != CMD_EXIT_OK) {
        free(text);
        return rc;
    }
    cmd_warn_sinks(d);
    struct decoder_info info;
    decoder_get_info(d, &info);
    const int64_t window_asked = window;
    window = info.window; /* at most the model's context */

    int exit_code = CMD_EXIT_OK;
    int32_t *ids = NULL;
    double *nll = NULL;
    int32_t *win_ids = NULL; /* recompute: the window it re-runs */
    int64_t *pos = NULL, n_done = 0, seq = -1;
    int64_t n = cmd_tokenize_text(d, text, text_len, info.add_bos, &ids);
    if (n < 0) {
        exit_code = CMD_EXIT_RUNTIME;
        goto out;
    }
    if (n < 2) {
        fprintf(stderr, "error: the text gives %lld tokens; at least 2 are needed\n", (long long)n);
        exit_code = CMD_EXIT_USAGE;
        goto out;
    }
    int64_t n_score = n - 1; /* token t predicts t + 1 */
    if (max_tokens > 0 && n_score > max_tokens)
        n_score = max_tokens;
    if (is_dense && n_score > window - 1) {
        if (window_set && window_asked == window)
            fprintf(stderr, "note: dense stops at --window %lld: scoring %lld of %lld tokens\n",
                    (long long)window, (long long)(window - 1), (long long)n_score);
        else
            fprintf(stderr,
                    "note: dense stops at the model's context (%lld): scoring %lld of %lld "
                    "tokens\n",
                    (long long)window, (long long)(window - 1), (long long)n_score);
        n_score = window - 1;
    }
    if (n_score < 1) { /* a window of one token (the flag checks it; here for any model) */
        fprintf(stderr, "error: a window of %lld tokens leaves no token to score\n",
                (long long)window);
        exit_code = CMD_EXIT_USAGE;
        goto out;
    }
    nll = malloc((size_t)n_score * sizeof *nll);
    pos = malloc((size_t)n_score * sizeof *pos);
    if (is_rec)
        win_ids = malloc((size_t)window * sizeof *win_ids);
    if (!nll || !pos || (is_rec && !win_ids)) {
        exit_code = CMD_EXIT_RUNTIME;
        goto out;
    }
    /* recompute runs dense in a sequence it empties before every scored token */
    seq = decoder_seq_open(d, &pol, window);
    if (seq < 0) {
        fprintf(stderr, "error: cannot open a sequence (%lld)\n", (long long)seq);
        exit_code = CMD_EXIT_RUNTIME;
        goto out;
    }
    const int show = !no_progress && isatty(2);
    double t0 = cmd_now(), nll_sum = 0;
    for (int64_t t = 0; t < n_score; t++) {
        int64_t r;
        if (is_rec && t % stride != 0)
            continue;
        if (is_rec) { /* rebuild the window from scratch at positions 0.. */
            int64_t nw =
                cmd_recompute_window(ids, t, window, info.add_bos ? info.bos : -1, win_ids);
            decoder_seq_reset(d, seq);
            struct decoder_input in = {seq, win_ids, nw, DECODER_LOGITS_LAST};
            r = decoder_step(d, &in, 1);
        } else {
            struct decoder_input in = {seq, ids + t, 1, DECODER_LOGITS_LAST};
            r = decoder_step(d, &in, 1);
        }
        if (r < 0) {
            fprintf(stderr, "\nerror: forward step failed at token %lld (%lld)\n", (long long)t,
                    (long long)r);
            exit_code = CMD_EXIT_RUNTIME;
            goto out;
        }
        nll[n_done] = decoder_nll(d, decoder_logits(d), ids[t + 1]);
        pos[n_done] = t;
        nll_sum += nll[n_done++];
        if (show && (n_done % 64 == 1 || t + stride >= n_score))
            progress(t + 1, n_score, nll_sum / (double)n_done * (double)(t + 1), t0);
    }
    double el = cmd_now() - t0;
    if (show)
        fprintf(stderr, "\n");
    size_t kv_bytes = info.kv_bytes_per_slot;
    char pname[32];
    if (is_rec) /* the sequence itself runs dense */
        engine_policy_name(&pol, pname, sizeof pname);
    else
        decoder_seq_policy_name(d, seq, pname, sizeof pname);
    double ppl = exp(nll_sum / (double)n_done);
    printf("model       %s\n", info.name);
    printf("normalizer  %s\n", info.normalizer);
    printf("policy      %s\n", pname);
    printf("window      %lld\n", (long long)window);
    printf("tokens      %lld scored%s\n", (long long)n_done,
           stride > 1 ? " (every stride-th)" : "");
    printf("perplexity  %.4f\n", ppl);
    printf("kv bytes    %zu (%s)\n", kv_bytes, engine_kv_dtype_name(kv_dtype));
    printf("tokens/s    %.1f (scored tokens per second)\n", (double)n_done / el);
    printf("bins        start  end  perplexity\n");
    for (int64_t b0 = 0, i = 0; b0 < n_score; b0 += bin) {
        int64_t b1 = b0 + bin < n_score ? b0 + bin : n_score, cnt = 0;
        double s = 0;
        for (; i < n_done && pos[i] < b1; i++, cnt++)
            s += nll[i];
        if (cnt > 0)
            printf("            %lld %lld %.4f\n", (long long)b0, (long long)b1,
                   exp(s / (double)cnt));
    }
    if (json) {
        FILE *jf = fopen(json, "w");
        if (!jf) {
            fprintf(stderr, "error: cannot write %s: %s\n", json, strerror(errno));
            exit_code = CMD_EXIT_RUNTIME;
            goto out;
        }
        int bad = 0;
        fprintf(jf, "{\"model\": ");
        bad |= json_string(jf, info.name);
        fprintf(jf, ", \"normalizer\": ");
        bad |= json_string(jf, info.normalizer);
        fprintf(jf, ", \"policy\": ");
        bad |= json_string(jf, pname);
        fprintf(jf,
                ", \"window\": %lld, \"tokens\": %lld, \"perplexity\": %.6f, \"kv_bytes\": %zu, "
                "\"kv_dtype\": \"%s\", \"tokens_per_s\": %.2f, \"nll\": [",
                (long long)window, (long long)n_done, ppl, kv_bytes, engine_kv_dtype_name(kv_dtype),
                (double)n_done / el);
        for (int64_t t = 0; t < n_done; t++)
            fprintf(jf, "%s%.5f", t ? "," : "", nll[t]);
        fprintf(jf, "], \"scored\": [");
        for (int64_t t = 0; t < n_done; t++)
            fprintf(jf, "%s%lld", t ? "," : "", (long long)pos[t]);
        fprintf(jf, "]}\n");
        if (bad)
            fprintf(stderr, "error: out of memory writing %s\n", json);
        if (cmd_close_output(jf, json) != CMD_EXIT_OK || bad)
            exit_code = CMD_EXIT_RUNTIME;
    }
out:
    decoder_seq_close(d, seq);
    free(nll);
    free(pos);
    free(win_ids);
    free(ids);
    free(text);
    decoder_close(d);
    return exit_code;
}
