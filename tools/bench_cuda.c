/*
 * bench_cuda.c: decode and prefill speed of a backend with full windows, and
 * the attention op's achieved memory bandwidth (run by
 * tools/gpu-check.sh). Works with --backend cpu too (small settings), which
 * is how the tool itself is checked on machines without a GPU.
 *
 *   bench_cuda [--model FILE | --synthetic] [--backend cuda|cpu] [--window W]
 *              [--batches 1,16,64] [--steps N] [--attn-reps N]
 *
 * --synthetic builds random weights with SmolLM2-135M's shapes in memory
 * (tests/support/tiny_model.h: 30 layers, D 576, 9/3 heads of 64, FFN 1536, vocab
 * 49152, Q8_0 matrices): the same work per token as the real file, for
 * machines the 98 MB file cannot be carried to. Speed does not depend on the
 * values (the CUDA backend multiplies FP16 copies either way).
 *
 * 1. Prefill: every sequence (as many as the largest batch) is filled with
 *    W + 64 tokens in chunks of 256, two sequences per step (512 tokens):
 *    prompt tokens/s over all of it. With sinks:4 the window is then full and
 *    evicting, so every later query sees 4 + W keys.
 * 2. Decode: for each batch size B, B sequences decode one token per step
 *    together; 4 warm-up steps (CUDA graph capture), then N timed steps:
 *    tokens/s = B * N / time, and the median step time.
 * 3. Attention bandwidth: one decode batch of the largest B, the attention op
 *    of the first global layer alone (layer 0 for Llama; for Gemma 3 layer 5,
 *    whose keys grow with W), R times in one step (a CUDA graph after one warm-up);
 *    bytes = the K and V rows every query reads (4 + W per kv head) plus q,
 *    qc and the output, over the wall time of the step.
 * 4. Device-to-device cudaMemcpy of 1 GiB (bytes read + bytes written per
 *    second), the ceiling the attention figure is compared with.
 * Output: one markdown table on stdout, progress on stderr.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "forward.h"
#include "kvcache.h"
#include "model.h"
#include "tests/support/tiny_model.h"

#define MAX_BATCHES 8
#define MAX_SEQS 256

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void usage(void)
{
    fprintf(stderr, "usage: bench_cuda [--model FILE | --synthetic] [--backend cuda|cpu]\n"
                    "                  [--window W] [--batches 1,16,64] [--steps N] "
                    "[--attn-reps N]\n");
}

int main(int argc, char **argv)
{
    const char *model_path = getenv("STREAMSINK_MODEL");
    enum backend_kind kind = BACKEND_CUDA;
    int64_t window = 4096, steps = 32, attn_reps = 20;
    int64_t batches[MAX_BATCHES] = {1, 16, 64};
    int n_batches = 3, synthetic = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--synthetic") == 0) {
            synthetic = 1;
            continue;
        }
        if (!v) {
            usage();
            return 2;
        }
        if (strcmp(a, "--model") == 0) {
            model_path = v;
        } else if (strcmp(a, "--backend") == 0) {
            if (backend_kind_parse(v, &kind) < 0) {
                usage();
                return 2;
            }
        } else if (strcmp(a, "--window") == 0) {
            window = strtoll(v, NULL, 10);
        } else if (strcmp(a, "--steps") == 0) {
            steps = strtoll(v, NULL, 10);
        } else if (strcmp(a, "--attn-reps") == 0) {
            attn_reps = strtoll(v, NULL, 10);
        } else if (strcmp(a, "--batches") == 0) {
            n_batches = 0;
            for (const char *p = v; *p && n_batches < MAX_BATCHES;) {
                char *end;
                batches[n_batches++] = strtoll(p, &end, 10);
                p = *end == ',' ? end + 1 : end;
                if (end == p && *p)
                    break;
            }
        } else {
            usage();
            return 2;
        }
        i++;
    }
    int64_t max_b = 1;
    for (int i = 0; i < n_batches; i++) {
        if (batches[i] < 1 || batches[i] > MAX_SEQS) {
            fprintf(stderr, "bench_cuda: batch sizes 1..%d\n", MAX_SEQS);
            return 2;
        }
        max_b = batches[i] > max_b ? batches[i] : max_b;
    }
    if ((!model_path && !synthetic) || window < 16 || steps < 1 || attn_reps < 1) {
        usage();
        return 2;
    }

    char err[512];
    static struct tiny_model tm;
    struct model m;
    if (synthetic) {
        struct tiny_config tc = tiny_config_default();
        tc.n_layer = 30;
        tc.n_embd = 576;
        tc.n_head = 9;
        tc.n_head_kv = 3;
        tc.head_dim = 64;
        tc.n_ff = 1536;
        tc.n_vocab = 49152;
        tc.rope_base = 100000.0;
        tc.wtype = QTYPE_Q8_0;
        if (tiny_model_init(&tm, &tc) < 0) {
            fprintf(stderr, "bench_cuda: cannot build the synthetic model\n");
            return 1;
        }
        m = tm.m;
    } else if (model_load(&m, model_path, err, sizeof err) < 0) {
        fprintf(stderr, "bench_cuda: %s\n", err);
        return 3;
    }
    const struct model_hparams *hp = &m.hp;
    const int64_t chunk = 256, max_tokens = 2 * chunk > max_b ? 2 * chunk : max_b;
    struct backend b;
    struct backend_config bc = {.kind = kind, .n_threads = 2, .max_tokens = max_tokens};
    if (backend_init(&b, &m, &bc, err, sizeof err) < 0) {
        fprintf(stderr, "bench_cuda: %s\n", err);
        synthetic ? tiny_model_free(&tm) : model_free(&m);
        return 1;
    }
    struct kv_geometry g = {.n_layer = hp->n_layer,
                            .n_kv_head = hp->n_head_kv,
                            .head_dim = hp->head_dim,
                            .n_sinks = 4,
                            .window = window,
                            .chunk = chunk,
                            .n_slots = max_b,
                            .dtype = KV_DTYPE_F16};
    struct fwd f;
    if (fwd_init(&f, &m, &b, &g, err, sizeof err) < 0) {
        fprintf(stderr, "bench_cuda: %s\n", err);
        b.ops->free(&b);
        synthetic ? tiny_model_free(&tm) : model_free(&m);
        return 1;
    }
    static struct kv_seq seq[MAX_SEQS];
    const struct kv_policy pol = {KV_POLICY_SINKS, 4};
    for (int64_t i = 0; i < max_b; i++)
        if (kv_seq_init(&seq[i], &f.pool.geo, i, pol, window, 0) < 0) {
            fprintf(stderr, "bench_cuda: cannot set up sequence %lld\n", (long long)i);
            fwd_free(&f);
            b.ops->free(&b);
            synthetic ? tiny_model_free(&tm) : model_free(&m);
            return 1;
        }
    int32_t *toks = malloc((size_t)max_tokens * sizeof(int32_t));
    struct fwd_input *in = malloc((size_t)max_b * sizeof *in);
    int exit_code = 0;
    if (!toks || !in) {
        fprintf(stderr, "bench_cuda: out of memory\n");
        exit_code = 1;
        goto out;
    }
    for (int64_t i = 0; i < max_tokens; i++)
        toks[i] = (int32_t)((1000 + (i * 7919) % 30000) % hp->n_vocab);

    /* 1. prefill every sequence to a full, evicting window */
    const int64_t fill = window + 64;
    double t0 = now();
    int64_t prompt_tokens = 0;
    for (int64_t s0 = 0; s0 < max_b; s0 += 2) {
        int ns = s0 + 1 < max_b ? 2 : 1;
        for (int64_t done = 0; done < fill; done += chunk) {
            int64_t n = fill - done < chunk ? fill - done : chunk;
            for (int k = 0; k < ns; k++)
                in[k] = (struct fwd_input){&seq[s0 + k], toks + k * chunk, n, FWD_LOGITS_LAST};
            if (fwd_step(&f, in, ns) < 0) {
                fprintf(stderr, "bench_cuda: a prefill step failed\n");
                exit_code = 1;
                goto out;
            }
            prompt_tokens += n * ns;
        }
        fprintf(stderr, "\rprefill %lld/%lld sequences", (long long)(s0 + ns), (long long)max_b);
    }
    const double prompt_tps = (double)prompt_tokens / (now() - t0);
    fprintf(stderr, "\n");

    /* 2. decode at each batch size */
    double decode_tps[MAX_BATCHES], step_ms[MAX_BATCHES];
    double *dt = malloc((size_t)steps * sizeof(double));
    if (!dt) {
        exit_code = 1;
        goto out;
    }
    for (int bi = 0; bi < n_batches; bi++) {
        const int64_t B = batches[bi];
        for (int64_t s = -4; s < steps; s++) {
            for (int64_t k = 0; k < B; k++)
                in[k] = (struct fwd_input){&seq[k], toks + (k + s + 4) % max_tokens, 1,
                                           FWD_LOGITS_LAST};
            double ts = now();
            if (fwd_step(&f, in, (int)B) < 0) {
                fprintf(stderr, "bench_cuda: a decode step failed\n");
                free(dt);
                exit_code = 1;
                goto out;
            }
            if (s >= 0)
                dt[s] = now() - ts;
        }
        double total = 0;
        for (int64_t s = 0; s < steps; s++)
            total += dt[s];
        qsort(dt, (size_t)steps, sizeof *dt, cmp_double);
        decode_tps[bi] = (double)(B * steps) / total;
        step_ms[bi] = dt[steps / 2] * 1e3;
        fprintf(stderr, "decode batch %lld: %.1f tok/s\n", (long long)B, decode_tps[bi]);
    }
    free(dt);

    /* 3. the attention op alone, on a decode batch of the largest B */
    int64_t pos[MAX_SEQS], slot[MAX_SEQS], cell[MAX_SEQS], cell_local[MAX_SEQS], out_rows[1] = {0};
    int32_t btok[MAX_SEQS];
    struct kv_view view[MAX_SEQS], view_local[MAX_SEQS];
    const int has_local = f.pool.geo.swa_period > 0;
    int la = 0; /* the first global layer: the one whose keys grow with W (Gemma 3: layer 5) */
    while (la < hp->n_layer - 1 && model_layer_is_local(hp, la))
        la++;
    const struct kv_seq *seqp[MAX_SEQS];
    double key_bytes = 0;
    const size_t esz = 2; /* f16 KV */
    for (int64_t k = 0; k < max_b; k++) {
        pos[k] = seq[k].pos_next - 1; /* the last stored token: its view is full */
        slot[k] = seq[k].slot;
        cell[k] = kv_seq_cell(&seq[k], pos[k]);
        view[k] = kv_seq_view(&seq[k], pos[k]);
        seqp[k] = &seq[k];
        if (has_local) { /* the local layers' own rings (begin_step copies them too) */
            struct kv_seq local = kv_seq_local(&seq[k], &f.pool.geo);
            cell_local[k] = kv_seq_cell(&local, pos[k]);
            view_local[k] = kv_seq_view(&local, pos[k]);
        }
        btok[k] = toks[k];
        key_bytes += (double)(view[k].n_sinks + view[k].win_len) * hp->n_head_kv * hp->head_dim *
                     2.0 * (double)esz;
    }
    const double act_bytes = (double)max_b * hp->n_head * hp->head_dim * 4.0 * 3.0;
    struct fwd_batch bt = {.T = max_b,
                           .tokens = btok,
                           .pos = pos,
                           .slot = slot,
                           .cell = cell,
                           .view = view,
                           .seq = seqp,
                           .cell_local = has_local ? cell_local : NULL,
                           .view_local = has_local ? view_local : NULL,
                           .n_out = 0,
                           .out_rows = out_rows};
    double attn_gbps = -1, attn_ms = 0;
    /* pass 0 runs eagerly, pass 1 captures a CUDA graph, pass 2 (timed) replays it */
    for (int pass = 0; pass < 3; pass++) {
        if (b.ops->begin_step(&b, &bt) < 0) {
            exit_code = 1;
            goto out;
        }
        double ts = now();
        for (int64_t r = 0; r < attn_reps; r++)
            b.ops->attention(&b, la, b.acts.q, b.acts.qc, m.w.layers[la].attn_sinks, hp->normalizer,
                             b.acts.att, NULL);
        if (b.ops->sync(&b) < 0) {
            fprintf(stderr, "bench_cuda: the attention step failed\n");
            exit_code = 1;
            goto out;
        }
        double el = now() - ts;
        attn_ms = el / (double)attn_reps * 1e3;
        attn_gbps = (key_bytes + act_bytes) * (double)attn_reps / el / 1e9;
    }
    double copy_gbps = kind == BACKEND_CUDA ? backend_cuda_copy_gbps(0, (size_t)1 << 30, 10) : -1;

    printf("| figure | value |\n|---|---|\n");
    printf("| backend | %s |\n", backend_kind_name(kind));
    printf("| model | %s |\n",
           synthetic ? "synthetic, SmolLM2-135M shapes, random Q8_0 weights" : model_path);
    printf("| window | sinks:4 + %lld keys (full, evicting), f16 KV |\n", (long long)window);
    printf("| prompt tokens/s (chunks of %lld, 2 sequences per step) | %.0f |\n", (long long)chunk,
           prompt_tps);
    for (int bi = 0; bi < n_batches; bi++)
        printf("| decode tokens/s, batch %lld (median step %.2f ms) | %.0f |\n",
               (long long)batches[bi], step_ms[bi], decode_tps[bi]);
    printf("| attention op, batch %lld, layer %d: time per call | %.3f ms |\n", (long long)max_b,
           la, attn_ms);
    printf("| attention op: memory traffic | %.0f GB/s |\n", attn_gbps);
    if (copy_gbps > 0) {
        printf("| device-to-device copy, 1 GiB (read + write) | %.0f GB/s |\n", copy_gbps);
        printf("| attention / copy | %.0f%% |\n", 100.0 * attn_gbps / copy_gbps);
    }
out:
    free(toks);
    free(in);
    fwd_free(&f);
    b.ops->free(&b);
    if (synthetic)
        tiny_model_free(&tm);
    else
        model_free(&m);
    return exit_code;
}
