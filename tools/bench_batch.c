/*
 * bench_batch.c: aggregate decode tokens/s of B greedy streams decoded
 * together by the CPU backend, for B in a list (tools/peer_bench.sh compares
 * it with llama-batched-bench).
 *
 *   bench_batch --model FILE [--threads N] [--window W] [--fill N]
 *               [--batches 1,4,8,16,32] [--steps N] [--reps R] [--kv-dtype T]
 *               [--temperature T [--top-p P] [--top-k K] [--min-p M]]
 *
 * Every one of max(B) sequences gets a window of W keys (sinks:4, KV in T:
 * f16 by default, f32 or q8_0) and
 * a prompt of --fill tokens (default W, so the window is full), prefilled in
 * chunks of 256. Then for each B, R times: B sequences decode --steps tokens
 * together, one token per sequence per forward step, each stream feeding back
 * the argmax of its own logits (greedy, the sampler's sampler_argmax as
 * the engine's greedy path runs it) or, with --temperature above 0, a token
 * drawn by its own sampler (sampler.h, seeded by the stream's index), the
 * streams' picks run on the backend's threads, one part each, as the engine
 * runs them. Prints one line per (B, repetition):
 *   batch B rep R tokens/s X
 * with X = B * steps / wall time of the steps (the sampling included). The
 * forward pass and backend are the engine's own (forward.h); the scheduler
 * thread and HTTP are not in the loop.
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
#include "sampler.h"

#define MAX_BATCHES 16
#define MAX_SEQS 256
#define CHUNK 256

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A step's picks: stream k's next token from its logits row. */
struct picks {
    struct sampler *smp;
    float *logits; /* (B, n_vocab); a sampler may change its row */
    int64_t n_vocab;
    int32_t *next;
};

static void pick_task(void *arg, int i, int n)
{
    const struct picks *p = arg;
    (void)n;
    p->next[i] = sampler_sample(&p->smp[i], p->logits + (int64_t)i * p->n_vocab, NULL);
}

static void usage(void)
{
    fprintf(stderr, "usage: bench_batch --model FILE [--threads N] [--window W] [--fill N]\n"
                    "                   [--batches 1,4,8,16,32] [--steps N] [--reps R]\n"
                    "                   [--kv-dtype f16|f32|q8_0]\n"
                    "                   [--temperature T [--top-p P] [--top-k K] [--min-p M]]\n");
}

int main(int argc, char **argv)
{
    const char *model_path = getenv("STREAMSINK_MODEL");
    int64_t window = 1024, fill = -1, steps = 32, reps = 1, threads = 2;
    int64_t batches[MAX_BATCHES] = {1, 4, 8, 16, 32};
    int n_batches = 5;
    enum kv_dtype kv_dtype = KV_DTYPE_F16;
    struct sampler_params sp = sampler_default_params();
    sp.temperature = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            usage();
            return 2;
        }
        if (strcmp(a, "--model") == 0) {
            model_path = v;
        } else if (strcmp(a, "--threads") == 0) {
            threads = strtoll(v, NULL, 10);
        } else if (strcmp(a, "--window") == 0) {
            window = strtoll(v, NULL, 10);
        } else if (strcmp(a, "--kv-dtype") == 0) {
            if (kv_dtype_parse(v, &kv_dtype) < 0) {
                usage();
                return 2;
            }
        } else if (strcmp(a, "--temperature") == 0) {
            sp.temperature = strtof(v, NULL);
        } else if (strcmp(a, "--top-p") == 0) {
            sp.top_p = strtof(v, NULL);
        } else if (strcmp(a, "--top-k") == 0) {
            sp.top_k = strtoll(v, NULL, 10);
        } else if (strcmp(a, "--min-p") == 0) {
            sp.min_p = strtof(v, NULL);
        } else if (strcmp(a, "--fill") == 0) {
            fill = strtoll(v, NULL, 10);
        } else if (strcmp(a, "--steps") == 0) {
            steps = strtoll(v, NULL, 10);
        } else if (strcmp(a, "--reps") == 0) {
            reps = strtoll(v, NULL, 10);
        } else if (strcmp(a, "--batches") == 0) {
            n_batches = 0;
            const char *p = v;
            while (*p && n_batches < MAX_BATCHES) {
                char *end;
                batches[n_batches++] = strtoll(p, &end, 10);
                if (end == p)
                    break;
                p = *end == ',' ? end + 1 : end;
            }
        } else {
            usage();
            return 2;
        }
        i++;
    }
    if (fill < 0)
        fill = window;
    int64_t max_b = 1;
    for (int i = 0; i < n_batches; i++) {
        if (batches[i] < 1 || batches[i] > MAX_SEQS) {
            fprintf(stderr, "bench_batch: batch sizes 1..%d\n", MAX_SEQS);
            return 2;
        }
        max_b = batches[i] > max_b ? batches[i] : max_b;
    }
    if (!model_path || window < 16 || steps < 1 || reps < 1 || threads < 1 || threads > 256 ||
        fill < 1) {
        usage();
        return 2;
    }

    char err[512];
    struct model m;
    if (model_load(&m, model_path, err, sizeof err) < 0) {
        fprintf(stderr, "bench_batch: %s\n", err);
        return 3;
    }
    const struct model_hparams *hp = &m.hp;
    const int64_t max_tokens = 2 * CHUNK > max_b ? 2 * CHUNK : max_b;
    struct backend b;
    struct backend_config bc = {
        .kind = BACKEND_CPU, .n_threads = (int)threads, .max_tokens = max_tokens};
    if (backend_init(&b, &m, &bc, err, sizeof err) < 0) {
        fprintf(stderr, "bench_batch: %s\n", err);
        model_free(&m);
        return 1;
    }
    struct kv_geometry g = {.n_layer = hp->n_layer,
                            .n_kv_head = hp->n_head_kv,
                            .head_dim = hp->head_dim,
                            .n_sinks = 4,
                            .window = window,
                            .chunk = CHUNK,
                            .n_slots = max_b,
                            .dtype = kv_dtype};
    struct fwd f;
    if (fwd_init(&f, &m, &b, &g, err, sizeof err) < 0) {
        fprintf(stderr, "bench_batch: %s\n", err);
        b.ops->free(&b);
        model_free(&m);
        return 1;
    }
    static struct kv_seq seq[MAX_SEQS];
    static struct sampler smp[MAX_SEQS];
    const struct kv_policy pol = {KV_POLICY_SINKS, 4};
    int exit_code = 0;
    int32_t *toks = malloc((size_t)CHUNK * 2 * sizeof(int32_t));
    int32_t *next = malloc((size_t)max_b * sizeof(int32_t));
    struct fwd_input *in = malloc((size_t)max_b * sizeof *in);
    if (!toks || !next || !in) {
        fprintf(stderr, "bench_batch: out of memory\n");
        exit_code = 1;
        goto out;
    }
    for (int64_t i = 0; i < max_b; i++) {
        struct sampler_params spi = sp;
        spi.seed = (uint64_t)i;
        if (sampler_init(&smp[i], &spi, hp->n_vocab) < 0) {
            fprintf(stderr, "bench_batch: bad sampling parameters\n");
            exit_code = 2;
            goto out;
        }
    }
    for (int64_t i = 0; i < max_b; i++)
        if (kv_seq_init(&seq[i], &f.pool.geo, i, pol, window, 0) < 0) {
            fprintf(stderr, "bench_batch: cannot set up sequence %lld\n", (long long)i);
            exit_code = 1;
            goto out;
        }
    for (int64_t i = 0; i < 2 * CHUNK; i++)
        toks[i] = (int32_t)((1000 + (i * 7919) % 30000) % hp->n_vocab);

    /* prefill, two sequences per step */
    double t0 = now();
    for (int64_t s0 = 0; s0 < max_b; s0 += 2) {
        int ns = s0 + 1 < max_b ? 2 : 1;
        for (int64_t done = 0; done < fill; done += CHUNK) {
            int64_t n = fill - done < CHUNK ? fill - done : CHUNK;
            for (int k = 0; k < ns; k++)
                in[k] = (struct fwd_input){&seq[s0 + k], toks + k * CHUNK, n, FWD_LOGITS_LAST};
            if (fwd_step(&f, in, ns) < 0) {
                fprintf(stderr, "bench_batch: a prefill step failed\n");
                exit_code = 1;
                goto out;
            }
            if (done + n >= fill)
                for (int k = 0; k < ns; k++)
                    next[s0 + k] =
                        (int32_t)sampler_argmax(f.logits + (int64_t)k * hp->n_vocab, hp->n_vocab);
        }
    }
    fprintf(stderr, "prefill: %lld sequences x %lld tokens in %.1f s\n", (long long)max_b,
            (long long)fill, now() - t0);

    for (int bi = 0; bi < n_batches; bi++) {
        const int64_t B = batches[bi];
        for (int64_t r = 0; r < reps; r++) {
            double ts = now();
            for (int64_t s = 0; s < steps; s++) {
                for (int64_t k = 0; k < B; k++)
                    in[k] = (struct fwd_input){&seq[k], &next[k], 1, FWD_LOGITS_LAST};
                if (fwd_step(&f, in, (int)B) < 0) {
                    fprintf(stderr, "bench_batch: a decode step failed\n");
                    exit_code = 1;
                    goto out;
                }
                struct picks pk = {smp, f.logits, hp->n_vocab, next};
                if (B > 1 && b.ops->run_parts)
                    b.ops->run_parts(&b, pick_task, &pk, (int)B);
                else
                    for (int k = 0; k < (int)B; k++)
                        pick_task(&pk, k, (int)B);
            }
            double el = now() - ts;
            printf("batch %lld rep %lld tokens/s %.2f\n", (long long)B, (long long)r,
                   (double)(B * steps) / el);
            fflush(stdout);
        }
    }
out:
    for (int64_t i = 0; i < max_b; i++)
        sampler_free(&smp[i]);
    free(toks);
    free(next);
    free(in);
    fwd_free(&f);
    b.ops->free(&b);
    model_free(&m);
    return exit_code;
}
