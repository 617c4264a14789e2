/*
 * bench_attention.c: single-thread timing of decode attention as the CPU
 * backend runs it (cpu_attention_span_rows over blocks of ATTN_KEY_BLOCK
 * keys, then cpu_attention_merge), on SmolLM2-135M's shape: 30 layers, 3 KV heads of
 * 64, 3 query heads per KV head, keys and values in f16 and in q8_0 (the
 * two KV dtypes the decode kernels read in place), timed side by side. One
 * "token" is one query per stream against every layer's window of W keys, so
 * a pass reads S * 30 * 3 * W * 2 rows of K and V of 128 bytes (f16) or 68
 * (q8_0): 94 MB or 50 MB for one stream at W = 4,100. Keys are random; the
 * kernels' speed does not depend on them.
 *
 * Reports, per configuration, the median over --reps passes of the thread's
 * CPU time (other processes on a shared machine cost precision, not the
 * figure): microseconds per token per stream, the K/V bytes read per second,
 * and the single-thread memcpy rate over the same buffers in the same run
 * (read + write bytes / s), the ceiling a pass that streams its K/V from
 * memory can approach. Each buffer is allocated twice, with 4 KiB pages
 * and with transparent huge pages (madvise), and both are timed side by
 * side.
 *
 * The spans of a pass lie back to back in memory unless --ring CELLS
 * places each (stream, layer, kv head) at the start of a ring of CELLS
 * cells, as the backend's KV pool does (a slot's ring holds sinks + window
 * + chunk cells, and a short context uses its first W): the hardware
 * prefetchers then start over at every span. --ahead SPANS (with a window
 * of at most one key block) asks for all the keys of the span SPANS after
 * the current one (ATTN_PREFETCH_KEYS) while the current one runs, with
 * the backend's doses (1 is what the backend does with the next task of a
 * decode step). The K/V rate counts the rows a pass reads; the
 * memcpy rate copies the whole buffers.
 *
 * With --prefill C it times a prompt chunk of C tokens of one stream at a
 * full window that slides (sinks:4, each token's window one key on from
 * the previous one's) in f16, two ways side by side: the chunk's tokens in
 * groups of 16 over the union of their keys (each row with its shift, as the
 * backend groups them), and each token on its own (its three query rows
 * over its own keys, as a decode step reads them). It reports the median
 * microseconds per chunk token of each and the median of the per-pass
 * ratios, and checks that both give the same bits.
 *
 *   build/bench_attention [--window W] [--streams S] [--reps R] [--ring CELLS]
 *                         [--ahead SPANS] [--prefill C]
 */
#include "cpu/attention.h"
#include "cpu/matmul.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define LAYERS 30
#define HKV 3
#define GROUP 3
#define DH 64
#define BLOCK ATTN_KEY_BLOCK

static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* n bytes of K or V rows in fmt, random: f16 values in [-1, 1); Q8_0
 * blocks with a scale of 1/64 and random int8. */
static void *alloc_kv(size_t n, int huge, int fmt)
{
    const size_t h = (size_t)2 << 20;
    size_t rounded = (n + h - 1) / h * h;
    void *p = NULL;
    if (posix_memalign(&p, huge ? h : 4096, rounded) != 0)
        return NULL;
    (void)madvise(p, rounded, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    uint64_t s = 0x9E3779B97F4A7C15ull;
    uint16_t *u = p;
    for (size_t i = 0; i < rounded / 2; i++) { /* f16 in [-1, 1): sign, exponent 0..14 */
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        u[i] = (uint16_t)((s & 0x83FF) | ((s >> 16) % 15) << 10);
    }
    if (fmt == ATTN_Q8_0) /* every 34-byte block's scale: 2^-6 */
        for (size_t o = 0; o + 34 <= rounded; o += 34)
            memcpy((char *)p + o, &(uint16_t){0x2400}, 2);
    return p;
}

/* Merges row r's partial states (nb blocks of `stride` floats in part, each
 * holding nr rows' m, then their l, then their acc) into out, as the
 * backend's merge does. */
static void merge_row(const struct attn_kernels *kr, int64_t nb, const float *part, int stride,
                      int nr, int r, float *out)
{
    float m[ATTN_MAX_BLOCKS], lsum[ATTN_MAX_BLOCKS];
    for (int64_t b = 0; b < nb; b++) {
        m[b] = part[b * stride + r];
        lsum[b] = part[b * stride + nr + r];
    }
    cpu_attention_merge(kr, (int)nb, m, lsum, part + 2 * nr + r * DH, stride, DH,
                        MODEL_NORM_SOFTMAX, 0.0f, NULL, out);
}

/* The keys of span i (stream, layer and kv head in that order): the first
 * W cells of its ring of R. */
static struct attn_keys span_keys(const char *k, const char *v, int fmt, int64_t W, int64_t R,
                                  int64_t i)
{
    const size_t off = (size_t)i * (size_t)R * attn_row_bytes(fmt, DH);
    struct attn_keys keys = {.k = k + off, .v = v + off, .fmt = fmt, .head_dim = DH};
    keys.run_len[0] = W;
    return keys;
}

/* One token for every stream: each (stream, layer, kv head) in blocks of
 * BLOCK keys, then the merge, as the backend's tasks do on one thread.
 * ahead (> 0, with one block a span: W up to BLOCK, as main requires):
 * each span asks for the keys of the span `ahead` spans on
 * (ATTN_PREFETCH_KEYS: all of them), as a decode step's tasks ask for the
 * next task's; the bench's spans go stream, layer, head, where a step's
 * attention run goes token, head within one layer. */
static void pass(const struct attn_kernels *kr, const char *k, const char *v, int fmt, int64_t W,
                 int64_t R, int S, int ahead, const float *q, float *part, float *out)
{
    const int64_t nb = (W + BLOCK - 1) / BLOCK, n = (int64_t)S * LAYERS * HKV;
    const float scale = 1.0f / sqrtf((float)DH);
    for (int64_t i = 0; i < n; i++) {
        const struct attn_keys keys = span_keys(k, v, fmt, W, R, i);
        for (int64_t b = 0; b < nb; b++) {
            struct attn_ahead ah, *a = NULL;
            if (ahead && i + ahead < n) {
                const struct attn_keys nk = span_keys(k, v, fmt, W, R, i + ahead);
                cpu_attention_ahead_init(&ah, &nk, 0, ATTN_PREFETCH_KEYS);
                a = &ah;
            }
            cpu_attention_ahead_issue(a, ATTN_AHEAD_FIRST);
            float *st = part + b * GROUP * (DH + 2);
            struct attn_row rows[GROUP];
            for (int h = 0; h < GROUP; h++)
                rows[h] = (struct attn_row){
                    q + h * DH, q + h * DH, W, st + h, st + GROUP + h, st + 2 * GROUP + h * DH, 0};
            cpu_attention_span_rows(kr, GROUP, rows, &keys, b * BLOCK, (b + 1) * BLOCK, scale, 0,
                                    a);
            cpu_attention_ahead_issue(a, -1);
        }
        for (int h = 0; h < GROUP; h++)
            merge_row(kr, nb, part, GROUP * (DH + 2), GROUP, h, out + h * DH);
    }
}

#define PREFILL_SINKS 4
#define PREFILL_GROUP 16 /* the backend's ATTN_GROUP_TOKENS */

/* A chunk of C tokens at a full sliding window of W keys (PREFILL_SINKS of
 * them sinks) for every layer and kv head: K/V of a (layer, head) are the
 * sink cells, then a ring of W - PREFILL_SINKS + C cells in which token i's
 * window starts at cell i. grouped: PREFILL_GROUP tokens a call over the
 * union of their keys; else each token alone over its own. */
static void prefill_pass(const struct attn_kernels *kr, const char *k, const char *v, int64_t W,
                         int C, int grouped, const float *q, float *part, float *out)
{
    const size_t rb = attn_row_bytes(ATTN_F16, DH), cells = (size_t)(W + C);
    const int64_t nb = (W + BLOCK - 1) / BLOCK, wl = W - PREFILL_SINKS;
    const int part_n = PREFILL_GROUP * GROUP * (DH + 2); /* floats of a block's states */
    const float scale = 1.0f / sqrtf((float)DH);
    const int per = grouped ? PREFILL_GROUP : 1;
    for (int l = 0; l < LAYERS; l++)
        for (int g = 0; g < HKV; g++) {
            const size_t off = ((size_t)l * HKV + (size_t)g) * cells * rb;
            for (int a = 0; a < C; a += per) {
                const int nt = C - a < per ? C - a : per, nr = nt * GROUP;
                struct attn_keys keys = {
                    .k = k + off, .v = v + off, .fmt = ATTN_F16, .head_dim = DH};
                keys.run_len[0] = PREFILL_SINKS;
                keys.run_uses_qc[0] = 1;
                keys.run_start[1] = PREFILL_SINKS + a;
                keys.run_len[1] = wl + nt - 1;
                for (int64_t b = 0; b < nb; b++) {
                    float *st = part + b * part_n;
                    struct attn_row rows[PREFILL_GROUP * GROUP];
                    for (int r = 0; r < nr; r++) {
                        const float *qr = q + ((size_t)(a + r / GROUP) * HKV * GROUP +
                                               (size_t)g * GROUP + (size_t)(r % GROUP)) *
                                                  DH;
                        rows[r] = (struct attn_row){
                            qr, qr, W, st + r, st + nr + r, st + 2 * nr + r * DH, r / GROUP};
                    }
                    cpu_attention_span_rows(kr, nr, rows, &keys, b * BLOCK, (b + 1) * BLOCK, scale,
                                            0, NULL);
                }
                for (int r = 0; r < nr; r++)
                    merge_row(
                        kr, nb, part, part_n, nr, r,
                        out +
                            (((size_t)(a + r / GROUP) * LAYERS + (size_t)l) * HKV + (size_t)g) *
                                GROUP * DH +
                            (size_t)(r % GROUP) * DH);
            }
        }
}

static int prefill_bench(const struct attn_kernels *kr, int64_t W, int C, int reps)
{
    const size_t bytes = (size_t)LAYERS * HKV * (size_t)(W + C) * attn_row_bytes(ATTN_F16, DH);
    const size_t nq = (size_t)C * HKV * GROUP * DH, no = nq * LAYERS;
    char *k = alloc_kv(bytes, 0, ATTN_F16), *v = alloc_kv(bytes, 0, ATTN_F16);
    float *q = malloc(nq * sizeof(float)), *o1 = malloc(no * sizeof(float)),
          *o2 = malloc(no * sizeof(float));
    float *part = malloc((size_t)((W + BLOCK - 1) / BLOCK) * PREFILL_GROUP * GROUP * (DH + 2) *
                         sizeof(float));
    if (!k || !v || !q || !o1 || !o2 || !part)
        return 1;
    for (size_t i = 0; i < nq; i++)
        q[i] = (float)((int)(i * 37 % 101) - 50) / 50.0f;
    double tg[99], ta[99], ratio[99];
    for (int r = 0; r < reps; r++) { /* the two ways in turn, the order alternating */
        for (int i = 0; i < 2; i++) {
            const int grouped = (r + i) % 2;
            double t0 = cpu_now();
            prefill_pass(kr, k, v, W, C, grouped, q, part, grouped ? o1 : o2);
            (grouped ? tg : ta)[r] = cpu_now() - t0;
        }
        ratio[r] = ta[r] / tg[r];
    }
    const int same = memcmp(o1, o2, no * sizeof(float)) == 0;
    qsort(tg, (size_t)reps, sizeof tg[0], cmp_d);
    qsort(ta, (size_t)reps, sizeof ta[0], cmp_d);
    qsort(ratio, (size_t)reps, sizeof ratio[0], cmp_d);
    printf("prefill chunk of %d tokens at a full sliding window of %lld keys (sinks:4), f16, %d "
           "layers x %d kv heads, median of %d single-thread passes each\n",
           C, (long long)W, LAYERS, HKV, reps);
    printf("| way | us per chunk token |\n|---|---|\n");
    printf("| %d tokens a call, shifted rows | %.0f |\n", PREFILL_GROUP, tg[reps / 2] / C * 1e6);
    printf("| each token alone | %.0f |\n", ta[reps / 2] / C * 1e6);
    printf("alone / grouped: median %.2f, range %.2f-%.2f; outputs %s\n", ratio[reps / 2], ratio[0],
           ratio[reps - 1], same ? "bit-identical" : "DIFFER");
    free(k);
    free(v);
    free(q);
    free(o1);
    free(o2);
    free(part);
    return same ? 0 : 1;
}

#define RING_MAX (1 << 22) /* cells; the window's own limit is 2 Mi keys */
#define KV_BYTES_MAX 64e9

static int usage(void)
{
    fprintf(stderr,
            "usage: bench_attention [--window 1..%d] [--streams 1..%d] [--reps 1..99] "
            "[--ring CELLS] [--ahead SPANS] [--prefill 0..4096]\n",
            ATTN_MAX_BLOCKS * BLOCK, 1 << 20);
    return 2;
}

/* Whether s is a whole decimal integer in range (stored in *x). */
static int parse_ll(const char *s, long long *x)
{
    char *end;
    errno = 0;
    *x = strtoll(s, &end, 10);
    return end != s && *end == '\0' && errno == 0;
}

int main(int argc, char **argv)
{
    int64_t W = 4100;
    int S = 1, reps = 9, prefill = 0;
    int64_t R = 0;
    int ahead = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *a = argv[i];
        long long x;
        if (!parse_ll(argv[i + 1], &x))
            return usage();
        if (!strcmp(a, "--window") && x >= 1 && x <= (long long)ATTN_MAX_BLOCKS * BLOCK)
            W = x;
        else if (!strcmp(a, "--streams") && x >= 1 && x <= 1 << 20)
            S = (int)x;
        else if (!strcmp(a, "--reps") && x >= 1 && x <= 99)
            reps = (int)x;
        else if (!strcmp(a, "--prefill") && x >= 0 && x <= 4096)
            prefill = (int)x;
        else if (!strcmp(a, "--ahead") && x >= 0 && x <= 1 << 20)
            ahead = (int)x;
        else if (!strcmp(a, "--ring") && x >= 0 && x <= RING_MAX)
            R = x;
        else
            return usage();
    }
    if (argc % 2 == 0)
        return usage();
    if (prefill > 0 && (W <= PREFILL_SINKS || R != 0 || ahead != 0 || S != 1)) {
        fprintf(stderr,
                "bench_attention: --prefill takes a window above %d, and no --ring, "
                "--ahead or --streams\n",
                PREFILL_SINKS);
        return 2;
    }
    if (R == 0)
        R = W;
    /* the f16 buffers' bytes, and every offset into them, fit a size_t */
    const double kv_bytes =
        (double)S * LAYERS * HKV * (double)R * (double)attn_row_bytes(ATTN_F16, DH);
    if (R < W || kv_bytes > KV_BYTES_MAX) {
        fprintf(stderr, "bench_attention: --ring from the window up, and under %.0f GB of K\n",
                KV_BYTES_MAX / 1e9);
        return 2;
    }
    if (ahead > 0 && W > BLOCK) {
        fprintf(stderr, "bench_attention: --ahead with a window of at most %d keys\n", BLOCK);
        return 2;
    }
    struct attn_kernels kr;
    int isa = (int)cpu_isa_best();
    cpu_attention_kernels(&kr, isa);
    if (prefill)
        return prefill_bench(&kr, W, prefill, reps);
    const size_t rows = (size_t)S * LAYERS * HKV * (size_t)R; /* of K, and of V */
    const size_t read = (size_t)S * LAYERS * HKV * (size_t)W; /* rows a pass reads */
    float q[GROUP * DH], out[GROUP * DH];
    for (int i = 0; i < GROUP * DH; i++)
        q[i] = (float)((i * 37 % 101) - 50) / 50.0f;
    float *part = malloc((size_t)((W + BLOCK - 1) / BLOCK) * GROUP * (DH + 2) * sizeof(float));
    char *dst = malloc(rows * attn_row_bytes(ATTN_F16, DH));
    if (!part || !dst) {
        fprintf(stderr, "bench_attention: no memory for %zu bytes of copy buffer\n",
                rows * attn_row_bytes(ATTN_F16, DH));
        return 1;
    }
    char place[64];
    if (R == W)
        snprintf(place, sizeof place, "spans back to back");
    else
        snprintf(place, sizeof place, "rings of %lld cells", (long long)R);
    printf("attention, %d stream(s) x %d layers x %d kv heads x %lld keys (%s, ahead %d), isa "
           "level %d, median of %d single-thread passes\n",
           S, LAYERS, HKV, (long long)W, place, ahead, isa, reps);
    printf("| KV dtype | pages | us per token per stream | K/V GB/s | memcpy GB/s (same buffers) "
           "|\n");
    printf("|---|---|---|---|---|\n");
    const int fmts[2] = {ATTN_F16, ATTN_Q8_0};
    for (int f = 0; f < 2; f++) {
        const size_t bytes = rows * attn_row_bytes(fmts[f], DH); /* K or V */
        for (int huge = 0; huge < 2; huge++) {
            char *k = alloc_kv(bytes, huge, fmts[f]), *v = alloc_kv(bytes, huge, fmts[f]);
            if (!k || !v) {
                fprintf(stderr, "bench_attention: no memory for 2 x %zu bytes of K and V\n", bytes);
                free(k);
                free(v);
                return 1;
            }
            double t[99], c[99];
            for (int r = 0; r < reps; r++) {
                double t0 = cpu_now();
                pass(&kr, k, v, fmts[f], W, R, S, ahead, q, part, out);
                t[r] = cpu_now() - t0;
                t0 = cpu_now();
                memcpy(dst, k, bytes);
                memcpy(dst, v, bytes);
                c[r] = cpu_now() - t0;
            }
            qsort(t, (size_t)reps, sizeof t[0], cmp_d);
            qsort(c, (size_t)reps, sizeof c[0], cmp_d);
            double tm = t[reps / 2], cm = c[reps / 2];
            printf("| %s | %s | %.0f | %.2f | %.2f |\n", fmts[f] == ATTN_F16 ? "f16" : "q8_0",
                   huge ? "2 MiB (THP)" : "4 KiB", tm / S * 1e6,
                   2.0 * (double)(read * attn_row_bytes(fmts[f], DH)) / tm / 1e9,
                   4.0 * (double)bytes / cm / 1e9);
            free(k);
            free(v);
            if (!isfinite(out[0]))
                return 1;
        }
    }
    free(part);
    free(dst);
    return 0;
}
