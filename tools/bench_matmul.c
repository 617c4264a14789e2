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
 * Where the kernel takes repacked weights (cpu_matmul_packs: the sixteen-row
 * kernels, VNNI or AVX2), each SmolLM2 shape is also timed on its repacked copy
 * (cpu_pack_rows, as the CPU backend does at load), and each line shows the
 * single-thread memcpy rate over the same buffers in the same run (read +
 * write bytes / s), the ceiling a T = 1 product that streams its weights
 * from memory can approach.
 *
 * Build: the CMake target bench_matmul (it links ss_engine, which holds every
 * kernel and the run-time dispatch), then
 *   build/bench_matmul [isa]   (isa: scalar, avx2 or avx512; default: best available)
 *   build/bench_matmul formats (every weight format on Gemma 3 270M's shapes, on
 *                               every ISA this CPU has, side by side: GB/s and
 *                               rows/s at T = 1, GFLOP/s at T = 64)
 *   build/bench_matmul peak    (this core's measured throughput of 512-bit
 *                               VPDPBUSD and FMA: twelve independent chains,
 *                               instructions per ns and GOP/s, the ceiling the
 *                               GFLOP/s figures are read against; and
 *                               VPDPBUSD's rate in the repacked kernels'
 *                               instruction mix, an upper bound for those
 *                               kernels once their weights are in cache)
 *   build/bench_matmul batch   (SmolLM2's Q4_0 shapes, repacked, its Q8_0
 *                               output matrix, and attn_q/o and ffn_up in
 *                               Q8_0 as a Q8_0 copy of the model has them;
 *                               weights from memory, at T = 1, 2, 4, 8, 16,
 *                               32 and 64: microseconds per call and per
 *                               token, GFLOP/s; a batched decode step of T
 *                               streams runs these products at that T)
 *   build/bench_matmul decode  (one decode token's products in the engine's
 *                               order, each matrix in its own buffer and all
 *                               in one huge-page arena, in turn: ms per
 *                               token, GB/s, microseconds per call)
 * $BENCH_MATMUL_MIB sets the memory a matrix is cycled through "from memory"
 * (default 64 MiB; use more than the last-level cache).
 *
 * Q5_0 and K-quant weights are random bytes with finite f16 scales (there is
 * no quantizer for them here; the kernels' speed does not depend on the
 * values).
 */
#include "cpu/matmul.h"

#include <immintrin.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

/* Cycle through at least this much weight memory: 64 MiB, or
 * $BENCH_MATMUL_MIB MiB (above the last-level cache, so that "from memory"
 * is from DRAM). */
static size_t llc_bytes(void)
{
    const char *e = getenv("BENCH_MATMUL_MIB");
    long mib = e ? atol(e) : 0;
    return (size_t)(mib > 0 ? mib : 64) << 20;
}
#define LLC_BYTES llc_bytes()

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

/* Seconds per call: best of several rounds, each at least ~0.1 s long.
 * packed: w holds repacked copies (cpu_matmul_rows_packed). The calls go
 * round the nw copies without restarting at each round, so that with nw
 * copies above the last-level cache every call reads its copy from memory
 * (restarting would time the first few copies again, from the cache). */
static double time_calls(enum cpu_isa isa, const struct shape *s, char *const *w, int nw,
                         const void *act, int64_t T, float *y, int packed)
{
    double best = 1e30;
    int calls = 1, next = 0;
    for (int round = 0; round < 6; round++) {
        double t0 = now_s();
        for (int c = 0; c < calls; c++, next = (next + 1) % nw)
            if (packed)
                cpu_matmul_rows_packed(isa, s->type, w[next], s->k, s->n, 0, s->n, act, T, y, s->n);
            else
                cpu_matmul_rows(isa, s->type, w[next], s->k, 0, s->n, act, T, y, s->n);
        double dt = (now_s() - t0) / calls;
        if (dt < best)
            best = dt;
        if (dt * calls < 0.1)
            calls *= 2;
    }
    return best;
}

/* Random but well-formed rows: quantized from random floats where quant.c has a
 * quantizer, random bytes with finite f16 scales for Q5_0 and the K-quants. */
static void fill_weights(enum qtype t, char *w, int64_t n, int64_t k, float *x)
{
    size_t row_bytes = qtype_row_bytes(t, k);
    if (!qtype_is_k(t)) {
        for (int64_t r = 0; r < n; r++) {
            for (int64_t i = 0; i < k; i++)
                x[i] = frand();
            quant_quantize_row(t, x, w + (size_t)r * row_bytes, k);
        }
        return;
    }
    size_t bb = qtype_block_bytes(t);
    size_t at[2] = {0, 2};
    int ns = t == QTYPE_Q4_K || t == QTYPE_Q5_K ? 2 : 1;
    if (t == QTYPE_Q3_K)
        at[0] = offsetof(struct block_q3_k, d);
    if (t == QTYPE_Q6_K)
        at[0] = offsetof(struct block_q6_k, d);
    for (size_t b = 0; b < row_bytes * (size_t)n / bb; b++) {
        char *blk = w + b * bb;
        for (size_t i = 0; i < bb; i++)
            blk[i] = (char)(frand() * 127.0f);
        for (int j = 0; j < ns; j++) {
            uint16_t h = quant_f32_to_f16(ldexpf(frand(), -6));
            memcpy(blk + at[j], &h, 2);
        }
    }
}

/* Seconds per memcpy of one matrix, cycling through the nw buffers (into the
 * next one): best of several rounds, going round the buffers as time_calls. */
static double time_copy(char *const *w, int nw, size_t bytes)
{
    double best = 1e30;
    int calls = 1, next = 0;
    for (int round = 0; round < 6; round++) {
        double t0 = now_s();
        for (int c = 0; c < calls; c++, next = (next + 1) % nw)
            memcpy(w[(next + 1) % nw], w[next], bytes);
        double dt = (now_s() - t0) / calls;
        if (dt < best)
            best = dt;
        if (dt * calls < 0.1)
            calls *= 2;
    }
    return best;
}

struct result {
    double gbs, gbs_hot, rows_per_s, us; /* T = 1 */
    double gflops, us64;                 /* T = 64 */
    double copy_gbs;                     /* memcpy, read + write */
};

/* One shape's buffers: nw copies of the matrix (repacked when packed),
 * enough to cycle through LLC_BYTES, tmax prepared activation rows, the
 * output. */
struct bench_mats {
    char **w;
    int nw;
    size_t mat_bytes;
    char *act;
    float *y;
};
#define BENCH_TMAX 64

static void mats_free(struct bench_mats *m)
{
    for (int i = 0; m->w && i < m->nw; i++)
        free(m->w[i]);
    free(m->w);
    free(m->act);
    free(m->y);
}

static int mats_make(enum cpu_isa isa, const struct shape *s, int packed, struct bench_mats *m)
{
    memset(m, 0, sizeof *m);
    m->mat_bytes = qtype_row_bytes(s->type, s->k) * (size_t)s->n;
    m->nw = (int)(LLC_BYTES / m->mat_bytes) + 1;
    m->w = calloc((size_t)m->nw, sizeof *m->w);
    float *x = malloc((size_t)(s->k > s->n ? s->k : s->n) * sizeof *x);
    m->act = malloc(quant_act_bytes(s->type, s->k) * (size_t)BENCH_TMAX);
    m->y = malloc((size_t)(s->n * BENCH_TMAX) * sizeof *m->y);
    int ok = m->w && x && m->act && m->y;
    for (int i = 0; ok && i < m->nw; i++)
        ok = (m->w[i] = malloc(m->mat_bytes)) != NULL;
    if (!ok) {
        free(x);
        mats_free(m);
        return -1;
    }
    fill_weights(s->type, m->w[0], s->n, s->k, x);
    if (packed) { /* w[0] becomes the repacked copy */
        char *p = malloc(m->mat_bytes);
        if (!p) {
            free(x);
            mats_free(m);
            return -1;
        }
        cpu_pack_rows(s->type, m->w[0], s->k, s->n, p);
        free(m->w[0]);
        m->w[0] = p;
    }
    for (int i = 1; i < m->nw; i++)
        memcpy(m->w[i], m->w[0], m->mat_bytes);
    for (int64_t t = 0; t < BENCH_TMAX; t++) {
        for (int64_t i = 0; i < s->k; i++)
            x[i] = frand();
        cpu_prepare_act(isa, s->type, x, s->k, m->act + (size_t)t * quant_act_bytes(s->type, s->k));
    }
    free(x);
    return 0;
}

static int bench_shape(enum cpu_isa isa, const struct shape *s, struct result *res, int packed)
{
    struct bench_mats m;
    if (mats_make(isa, s, packed, &m) < 0)
        return -1;
    char **w = m.w;
    const int nw = m.nw;
    const size_t mat_bytes = m.mat_bytes;
    const int64_t tmax = BENCH_TMAX;
    const char *act = m.act;
    float *y = m.y;

    double t1 = time_calls(isa, s, w, nw, act, 1, y, packed);
    double t1_hot = time_calls(isa, s, w, 1, act, 1, y, packed);
    double t64 = time_calls(isa, s, w, 1, act, tmax, y, packed);
    res->copy_gbs = nw > 1 ? 2.0 * (double)mat_bytes / time_copy(w, nw, mat_bytes) * 1e-9 : 0.0;
    double flop = 2.0 * (double)s->n * (double)s->k;
    res->gbs = (double)mat_bytes / t1 * 1e-9;
    res->gbs_hot = (double)mat_bytes / t1_hot * 1e-9;
    res->rows_per_s = (double)s->n / t1;
    res->us = t1 * 1e6;
    res->gflops = flop * (double)tmax / t64 * 1e-9;
    res->us64 = t64 * 1e6;
    mats_free(&m);
    return 0;
}

/* Every format on Gemma 3 270M's shapes (D = 640, F = 2048, 4 x 256 query
 * heads), on every ISA here, one line each. */
static int bench_formats(void)
{
    static const struct shape shapes[] = {
        {"ffn_up    2048x640  Q5_0", QTYPE_Q5_0, 2048, 640},
        {"attn_o    640x1024  Q4_K", QTYPE_Q4_K, 640, 1024},
        {"ffn_down  640x2048  Q4_K", QTYPE_Q4_K, 640, 2048},
        {"ffn_down  640x2048  Q5_K", QTYPE_Q5_K, 640, 2048},
        {"ffn_down  640x2048  Q6_K", QTYPE_Q6_K, 640, 2048},
        {"ffn_down  640x2048  Q3_K", QTYPE_Q3_K, 640, 2048},
        {"ffn_up    2048x640  Q8_0", QTYPE_Q8_0, 2048, 640},
        {"ffn_up    2048x640  Q4_0", QTYPE_Q4_0, 2048, 640},
        {"ffn_up    2048x640  Q4_1", QTYPE_Q4_1, 2048, 640},
    };
    printf("single thread; T=1: weight bytes / s and rows / s (matrix cycled through %u MiB); "
           "T=64: GFLOP/s\n",
           (unsigned)(LLC_BYTES >> 20));
    printf("%-25s %-7s %9s %9s %12s %9s %9s\n", "shape", "isa", "T=1 GB/s", "hot GB/s", "rows/s",
           "T=1 us", "T=64 GF/s");
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        for (int i = CPU_ISA_SCALAR; i <= (int)cpu_isa_best(); i++) {
            struct result r;
            if (bench_shape((enum cpu_isa)i, &shapes[si], &r, 0) < 0)
                return 1;
            printf("%-25s %-7s %9.2f %9.2f %12.0f %9.1f %9.1f\n", shapes[si].name,
                   cpu_isa_name((enum cpu_isa)i), r.gbs, r.gbs_hot, r.rows_per_s, r.us, r.gflops);
            fflush(stdout);
        }
    }
    return 0;
}

/* Instructions per ns of 512-bit VPDPBUSD (64 multiply-adds each) and FMA
 * (16), twelve independent accumulators each, single thread (wall time). */
#define PEAK_ROUNDS 20000000L
#define DP(a) __asm__ volatile("vpdpbusd %2, %1, %0" : "+v"(a) : "v"(u), "v"(s))
#define FM(a) __asm__ volatile("vfmadd231ps %2, %1, %0" : "+v"(a) : "v"(fu), "v"(fs))
static double ns_between(const struct timespec *t0, const struct timespec *t1)
{
    return (double)(t1->tv_sec - t0->tv_sec) * 1e9 + (double)(t1->tv_nsec - t0->tv_nsec);
}

__attribute__((target("avx512f,avx512bw"))) static void peak_avx512(double *dp, double *fma)
{
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0,
            a7 = a0, a8 = a0, a9 = a0, a10 = a0, a11 = a0;
    const __m512i u = _mm512_set1_epi32(0x01020304), s = _mm512_set1_epi32(0x01010101);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long i = 0; i < PEAK_ROUNDS; i++) {
        DP(a0);
        DP(a1);
        DP(a2);
        DP(a3);
        DP(a4);
        DP(a5);
        DP(a6);
        DP(a7);
        DP(a8);
        DP(a9);
        DP(a10);
        DP(a11);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    *dp = 12.0 * PEAK_ROUNDS / ns_between(&t0, &t1);
    __m512 f0 = _mm512_setzero_ps(), f1 = f0, f2 = f0, f3 = f0, f4 = f0, f5 = f0, f6 = f0, f7 = f0,
           f8 = f0, f9 = f0, f10 = f0, f11 = f0;
    const __m512 fu = _mm512_set1_ps(1.0001f), fs = _mm512_set1_ps(0.9999f);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long i = 0; i < PEAK_ROUNDS; i++) {
        FM(f0);
        FM(f1);
        FM(f2);
        FM(f3);
        FM(f4);
        FM(f5);
        FM(f6);
        FM(f7);
        FM(f8);
        FM(f9);
        FM(f10);
        FM(f11);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    *fma = 12.0 * PEAK_ROUNDS / ns_between(&t0, &t1);
}

/* VPDPBUSD per ns in the repacked kernels' mix: per block and activation row,
 * eight VPDPBUSD, then one convert, one multiply and one FMA (the block's
 * integer sum to f32, the two scales' product, the accumulation). Twice per
 * round on independent registers, so no chain limits it. */
#define CV(c, a) __asm__ volatile("vcvtdq2ps %1, %0" : "=v"(c) : "v"(a))
#define MU(m) __asm__ volatile("vmulps %2, %1, %0" : "=v"(m) : "v"(fu), "v"(fs))
#define FMV(f, c, m) __asm__ volatile("vfmadd231ps %2, %1, %0" : "+v"(f) : "v"(c), "v"(m))
__attribute__((target("avx512f,avx512bw"))) static double peak_mix_avx512(void)
{
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0,
            a7 = a0, a8 = a0, a9 = a0, a10 = a0, a11 = a0, a12 = a0, a13 = a0, a14 = a0, a15 = a0;
    const __m512i u = _mm512_set1_epi32(0x01020304), s = _mm512_set1_epi32(0x01010101);
    const __m512 fu = _mm512_set1_ps(1.0001f), fs = _mm512_set1_ps(0.9999f);
    __m512 f0 = _mm512_setzero_ps(), f1 = f0, c0, c1, m0, m1;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long i = 0; i < PEAK_ROUNDS / 2; i++) {
        DP(a0);
        DP(a1);
        DP(a2);
        DP(a3);
        DP(a4);
        DP(a5);
        DP(a6);
        DP(a7);
        CV(c0, a0);
        MU(m0);
        FMV(f0, c0, m0);
        DP(a8);
        DP(a9);
        DP(a10);
        DP(a11);
        DP(a12);
        DP(a13);
        DP(a14);
        DP(a15);
        CV(c1, a8);
        MU(m1);
        FMV(f1, c1, m1);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    volatile float sink = _mm512_reduce_add_ps(_mm512_add_ps(f0, f1));
    (void)sink;
    return 16.0 * (PEAK_ROUNDS / 2) / ns_between(&t0, &t1);
}

static int bench_peak(void)
{
    if (cpu_isa_best() != CPU_ISA_AVX512 || !cpu_matmul_packs(CPU_ISA_AVX512, QTYPE_Q4_0)) {
        printf("peak: this CPU has no AVX512-VNNI (or STREAMSINK_ISA caps it)\n");
        return 0;
    }
    for (int r = 0; r < 3; r++) {
        double dp, fma;
        peak_avx512(&dp, &fma);
        const double mix = peak_mix_avx512();
        printf("peak, one thread: VPDPBUSD zmm %.2f/ns = %.0f int8 GOP/s; FMA zmm %.2f/ns = "
               "%.0f GFLOP/s; VPDPBUSD in the kernels' mix %.2f/ns (%.0f%% of alone)\n",
               dp, dp * 128.0, fma, fma * 32.0, mix, 100.0 * mix / dp);
    }
    return 0;
}

/* Per-call time from memory (the matrix cycled through LLC_BYTES, as a
 * decode step meets it) for T activation rows, T = 1 .. 64. */
static int bench_batch_ts(enum cpu_isa isa)
{
    static const struct shape shapes[] = {
        {"attn_q/o  576x576   Q4_0", QTYPE_Q4_0, 576, 576},
        {"ffn_up   1536x576   Q4_0", QTYPE_Q4_0, 1536, 576},
        {"ffn_down  576x1536  Q4_0", QTYPE_Q4_0, 576, 1536},
        {"lm_head 49152x576   Q8_0", QTYPE_Q8_0, 49152, 576},
        {"attn_q/o  576x576   Q8_0", QTYPE_Q8_0, 576, 576},
        {"ffn_up   1536x576   Q8_0", QTYPE_Q8_0, 1536, 576},
    };
    static const int64_t ts[] = {1, 2, 4, 8, 16, 32, 64};
    const int nts = (int)(sizeof ts / sizeof ts[0]);
    printf("isa %s (single thread), weights from memory (cycled through %u MiB)\n",
           cpu_isa_name(isa), (unsigned)(LLC_BYTES >> 20));
    printf("%-25s %-8s %4s %10s %10s %12s %9s %9s\n", "shape", "layout", "T", "us/call", "hot us",
           "us/token", "GFLOP/s", "GB/s");
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const struct shape *s = &shapes[si];
        const int packed = cpu_matmul_packs(isa, s->type);
        struct bench_mats m;
        if (mats_make(isa, s, packed, &m) < 0)
            return 1;
        for (int i = 0; i < nts; i++) {
            const double sec = time_calls(isa, s, m.w, m.nw, m.act, ts[i], m.y, packed);
            const double hot = time_calls(isa, s, m.w, 1, m.act, ts[i], m.y, packed);
            printf("%s %-8s %4lld %10.1f %10.1f %12.2f %9.1f %9.1f\n", s->name,
                   packed ? "repacked" : "rows", (long long)ts[i], sec * 1e6, hot * 1e6,
                   sec * 1e6 / (double)ts[i],
                   2.0 * (double)s->n * (double)s->k * (double)ts[i] / sec * 1e-9,
                   (double)m.mat_bytes / sec * 1e-9);
            fflush(stdout);
        }
        mats_free(&m);
    }
    return 0;
}

/* One decode token's products in the engine's order, T = 1: for each of 30
 * layers the fused QKV (960 x 576), the attention output (576 x 576), the
 * fused gate|up (3,072 x 576) and the down projection (576 x 1,536), Q4_0
 * (repacked where the kernel takes it), then the 49,152-row Q8_0 output
 * matrix. A token's 90 MB stream from memory once, a different matrix at
 * every call, which a shape timed alone (the modes above) does not
 * reproduce: there the same pattern repeats call after call. Two
 * placements of the same bytes, timed token by token in turn: every matrix
 * in its own malloc'd buffer (4 KiB pages), and all of them in one arena in
 * call order on transparent huge pages, as the CPU backend keeps its
 * repacked weights. Prints, per placement, the median and fastest of 15
 * tokens (wall time) and the median microseconds per call of each shape. */
#define DEC_LAYERS 30
#define DEC_NM (DEC_LAYERS * 4 + 1)
#define DEC_REPS 15
static double wall_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static const struct shape dec_layer[4] = {
    {"attn_qkv   960x576   Q4_0", QTYPE_Q4_0, 960, 576},
    {"attn_o     576x576   Q4_0", QTYPE_Q4_0, 576, 576},
    {"gate|up   3072x576   Q4_0", QTYPE_Q4_0, 3072, 576},
    {"ffn_down   576x1536  Q4_0", QTYPE_Q4_0, 576, 1536},
};
static const struct shape dec_out = {"output   49152x576   Q8_0", QTYPE_Q8_0, 49152, 576};

static const struct shape *dec_shape(int i)
{
    return i < DEC_NM - 1 ? &dec_layer[i % 4] : &dec_out;
}

static size_t dec_bytes(int i)
{
    return qtype_row_bytes(dec_shape(i)->type, dec_shape(i)->k) * (size_t)dec_shape(i)->n;
}

/* Bytes matrix i takes in the arena: its own, rounded up to a cache line. */
static size_t dec_room(int i)
{
    return (dec_bytes(i) + 63) / 64 * 64;
}

/* One token's products over the matrices w; seconds per shape into sum. */
static double dec_token(enum cpu_isa isa, char *const *w, const char *act, float *y, double *sum)
{
    const double t0 = wall_s();
    for (int i = 0; i < DEC_NM; i++) {
        const struct shape *s = dec_shape(i);
        const double c0 = wall_s();
        if (cpu_matmul_packs(isa, s->type))
            cpu_matmul_rows_packed(isa, s->type, w[i], s->k, s->n, 0, s->n, act, 1, y, s->n);
        else
            cpu_matmul_rows(isa, s->type, w[i], s->k, 0, s->n, act, 1, y, s->n);
        sum[i < DEC_NM - 1 ? i % 4 : 4] += wall_s() - c0;
    }
    return wall_s() - t0;
}

static int bench_decode(enum cpu_isa isa)
{
    static char *own[DEC_NM], *in_arena[DEC_NM];
    static double tok[2][DEC_REPS], per[2][5][DEC_REPS];
    const size_t huge = (size_t)2 << 20;
    size_t total = 0;
    for (int i = 0; i < DEC_NM; i++)
        total += dec_room(i);
    const size_t arena_bytes = (total + huge - 1) / huge * huge;
    char *arena = NULL;
    float *x = malloc((size_t)dec_out.n * sizeof *x), *y = malloc((size_t)dec_out.n * sizeof *y);
    char *act = malloc(quant_act_bytes(QTYPE_Q4_0, 1536));
    if (!x || !y || !act || posix_memalign((void **)&arena, huge, arena_bytes) != 0)
        return 1;
    (void)madvise(arena, arena_bytes, MADV_HUGEPAGE);
    size_t off = 0;
    for (int i = 0; i < DEC_NM; i++) {
        const struct shape *s = dec_shape(i);
        char *rows = malloc(dec_bytes(i));
        own[i] = malloc(dec_bytes(i));
        if (!rows || !own[i])
            return 1;
        fill_weights(s->type, rows, s->n, s->k, x);
        if (cpu_matmul_packs(isa, s->type))
            cpu_pack_rows(s->type, rows, s->k, s->n, own[i]);
        else
            memcpy(own[i], rows, dec_bytes(i));
        in_arena[i] = arena + off;
        memcpy(in_arena[i], own[i], dec_bytes(i));
        off += dec_room(i);
        free(rows);
    }
    for (int64_t i = 0; i < 1536; i++)
        x[i] = frand();
    cpu_prepare_act(isa, QTYPE_Q4_0, x, 1536, act); /* its first 576 serve K = 576 */
    for (int r = 0; r < DEC_REPS; r++)
        for (int pl = 0; pl < 2; pl++) {
            double sum[5] = {0};
            tok[pl][r] = dec_token(isa, pl ? in_arena : own, act, y, sum);
            for (int k = 0; k < 5; k++)
                per[pl][k][r] = sum[k] / (k < 4 ? DEC_LAYERS : 1);
        }
    printf("isa %s (single thread), one decode token's products in the engine's order, %d "
           "tokens per placement, in turn\n",
           cpu_isa_name(isa), DEC_REPS);
    for (int pl = 0; pl < 2; pl++) {
        qsort(tok[pl], DEC_REPS, sizeof tok[pl][0], cmp_double);
        printf("%s: %.1f MB per token, median %.2f ms (%.1f GB/s), fastest %.2f ms\n",
               pl ? "one arena, huge pages" : "own buffers, 4 KiB pages", (double)total * 1e-6,
               tok[pl][DEC_REPS / 2] * 1e3, (double)total / tok[pl][DEC_REPS / 2] * 1e-9,
               tok[pl][0] * 1e3);
        for (int k = 0; k < 5; k++) {
            qsort(per[pl][k], DEC_REPS, sizeof per[pl][k][0], cmp_double);
            const struct shape *s = k < 4 ? &dec_layer[k] : &dec_out;
            const double bytes = (double)qtype_row_bytes(s->type, s->k) * (double)s->n;
            printf("  %s: %9.1f us per call (%.1f GB/s)\n", s->name, per[pl][k][DEC_REPS / 2] * 1e6,
                   bytes / per[pl][k][DEC_REPS / 2] * 1e-9);
        }
    }
    for (int i = 0; i < DEC_NM; i++)
        free(own[i]);
    free(arena);
    free(x);
    free(y);
    free(act);
    return 0;
}

int main(int argc, char **argv)
{
    static const struct shape shapes[] = {
        {"attn_q/o  576x576   Q4_0", QTYPE_Q4_0, 576, 576},
        {"ffn_up   1536x576   Q4_0", QTYPE_Q4_0, 1536, 576},
        {"ffn_down  576x1536  Q4_0", QTYPE_Q4_0, 576, 1536},
        {"attn_q/o  576x576   Q4_1", QTYPE_Q4_1, 576, 576},
        {"ffn_up   1536x576   Q4_1", QTYPE_Q4_1, 1536, 576},
        {"ffn_down  576x1536  Q4_1", QTYPE_Q4_1, 576, 1536},
        {"lm_head 49152x576   Q8_0", QTYPE_Q8_0, 49152, 576},
    };
    enum cpu_isa isa = cpu_isa_best();
    if (argc > 1 && strcmp(argv[1], "formats") == 0)
        return bench_formats();
    if (argc > 1 && strcmp(argv[1], "batch") == 0)
        return bench_batch_ts(isa);
    if (argc > 1 && strcmp(argv[1], "peak") == 0)
        return bench_peak();
    if (argc > 1 && strcmp(argv[1], "decode") == 0)
        return bench_decode(isa);
    if (argc > 1) {
        for (int i = CPU_ISA_SCALAR; i <= CPU_ISA_AVX512; i++)
            if (strcmp(argv[1], cpu_isa_name((enum cpu_isa)i)) == 0 && i <= (int)cpu_isa_best())
                isa = (enum cpu_isa)i;
    }
    printf("isa %s (single thread)\n", cpu_isa_name(isa));

    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const struct shape *s = &shapes[si];
        for (int packed = 0; packed <= cpu_matmul_packs(isa, s->type); packed++) {
            struct result r;
            if (bench_shape(isa, s, &r, packed) < 0)
                return 1;
            printf("%s %-8s T=1: %6.1f GB/s (%6.1f GB/s cache-hot, %7.1f us)  T=64: %6.1f "
                   "GFLOP/s (%7.1f us)  memcpy %5.1f GB/s\n",
                   s->name, packed ? "repacked" : "rows", r.gbs, r.gbs_hot, r.us, r.gflops, r.us64,
                   r.copy_gbs);
            fflush(stdout);
        }
    }
    return 0;
}
