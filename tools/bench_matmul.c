/*
 * bench_matmul.c: single-thread timing of cpu_matmul_rows on SmolLM2-135M's
 * shapes, at T = 1 (decode: reports weight bytes streamed per second) and
 * T = 64 (prefill: reports GFLOP/s, 2 * N * K * T per call). Weights are
 * random but well-formed; the matrix is copied into enough distinct buffers
 * to exceed the last-level cache, so T = 1 numbers are memory numbers (the
 * "cache-hot" column reuses one copy). Times are the thread's CPU time, so
 * other processes on a shared machine cost us less precision than wall time
 * would (they still share the memory bus).
 *
 * Standalone build (CMake: link it against ss_engine):
 *   gcc -std=c11 -D_GNU_SOURCE -O2 -Iengine -c engine/cpu/matmul_avx2.c -mavx2 -mfma -mf16c
 *   gcc -std=c11 -D_GNU_SOURCE -O2 -Iengine -c engine/cpu/matmul_avx512.c -mavx512f \
 *       -mavx512bw -mavx512vl -mavx512dq -mfma -mf16c -mavx2
 *   gcc -std=c11 -D_GNU_SOURCE -O2 -Iengine tools/bench_matmul.c engine/quant.c \
 *       engine/cpu/matmul.c matmul_avx2.o matmul_avx512.o -lm -lpthread
 *   ./a.out [isa]      (isa: scalar, avx2 or avx512; default: best available)
 */
#include "cpu/matmul.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define LLC_BYTES (64u << 20) /* cycle through at least this much weight memory */

struct shape {
    const char *name;
    enum qtype type;
    int64_t n;
    int64_t k;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static float frand(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)(rng_state >> 40) / (float)(1u << 24) * 2.0f - 1.0f;
}

/* Seconds per call: best of several rounds, each at least ~0.1 s long. */
static double time_calls(enum cpu_isa isa, const struct shape *s, char *const *w, int nw,
                         const void *act, int64_t T, float *y)
{
    double best = 1e30;
    int calls = 1;
    for (int round = 0; round < 6; round++) {
        double t0 = now_s();
        for (int c = 0; c < calls; c++)
            cpu_matmul_rows(isa, s->type, w[c % nw], s->k, 0, s->n, act, T, y, s->n);
        double dt = (now_s() - t0) / calls;
        if (dt < best)
            best = dt;
        if (dt * calls < 0.1)
            calls *= 2;
    }
    return best;
}

int main(int argc, char **argv)
{
    static const struct shape shapes[] = {
        {"attn_q/o  576x576   Q4_1", QTYPE_Q4_1, 576, 576},
        {"ffn_up   1536x576   Q4_1", QTYPE_Q4_1, 1536, 576},
        {"ffn_down  576x1536  Q4_1", QTYPE_Q4_1, 576, 1536},
        {"lm_head 49152x576   Q8_0", QTYPE_Q8_0, 49152, 576},
    };
    enum cpu_isa isa = cpu_isa_best();
    if (argc > 1) {
        for (int i = CPU_ISA_SCALAR; i <= CPU_ISA_AVX512; i++)
            if (strcmp(argv[1], cpu_isa_name((enum cpu_isa)i)) == 0 && i <= (int)cpu_isa_best())
                isa = (enum cpu_isa)i;
    }
    printf("isa %s (single thread)\n", cpu_isa_name(isa));

    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const struct shape *s = &shapes[si];
        size_t row_bytes = qtype_row_bytes(s->type, s->k);
        size_t mat_bytes = row_bytes * (size_t)s->n;
        int nw = (int)(LLC_BYTES / mat_bytes) + 1;
        const int64_t tmax = 64;
        char **w = malloc((size_t)nw * sizeof *w);
        float *x = malloc((size_t)(s->k > s->n ? s->k : s->n) * sizeof *x);
        char *act = malloc(quant_act_bytes(s->type, s->k) * (size_t)tmax);
        float *y = malloc((size_t)(s->n * tmax) * sizeof *y);
        if (!w || !x || !act || !y)
            return 1;

        w[0] = malloc(mat_bytes);
        if (!w[0])
            return 1;
        for (int64_t r = 0; r < s->n; r++) {
            for (int64_t i = 0; i < s->k; i++)
                x[i] = frand();
            quant_quantize_row(s->type, x, w[0] + (size_t)r * row_bytes, s->k);
        }
        for (int i = 1; i < nw; i++) {
            w[i] = malloc(mat_bytes);
            if (!w[i])
                return 1;
            memcpy(w[i], w[0], mat_bytes);
        }
        for (int64_t t = 0; t < tmax; t++) {
            for (int64_t i = 0; i < s->k; i++)
                x[i] = frand();
            cpu_prepare_act(isa, s->type, x, s->k,
                            act + (size_t)t * quant_act_bytes(s->type, s->k));
        }

        double t1 = time_calls(isa, s, w, nw, act, 1, y);
        double t1_hot = time_calls(isa, s, w, 1, act, 1, y);
        double t64 = time_calls(isa, s, w, 1, act, tmax, y);
        double flop = 2.0 * (double)s->n * (double)s->k;
        printf("%s  T=1: %6.1f GB/s (%6.1f GB/s cache-hot, %7.1f us)  T=64: %6.1f GFLOP/s "
               "(%7.1f us)\n",
               s->name, (double)mat_bytes / t1 * 1e-9, (double)mat_bytes / t1_hot * 1e-9, t1 * 1e6,
               flop * (double)tmax / t64 * 1e-9, t64 * 1e6);

        for (int i = 0; i < nw; i++)
            free(w[i]);
        free(w);
        free(x);
        free(act);
        free(y);
    }
    return 0;
}
