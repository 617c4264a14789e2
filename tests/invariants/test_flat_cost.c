/*
 * test_flat_cost.c: DESIGN.md invariant 5, flat cost: token 1,000,000 costs
 * the memory and time of token 10,000.
 *
 * 1,000,000 tokens stream through the tiny random model (tests/support/tiny_model.h)
 * one token per step with the window policy (W = 64, f16 KV, the default
 * storage), each step feeding back its own greedy token. Resident memory
 * (/proc/self/statm) after warm-up and at the end, and the per-token time of
 * the first and the last 20,000 tokens, are printed and compared. Then a
 * shorter run on SmolLM2 (W = 128, sinks:4, 1,500 tokens, eleven windows;
 * first 300 steps against the last 300; ~20 ms of CPU a step here).
 *
 * This checks scaling, not speed. A cost that grows with the stream (a
 * buffer that grows, attention over evicted keys, a position-dependent
 * search) shows up as a late/early ratio of many times, or as megabytes.
 *
 * Time estimator: the engine runs on this one thread, so its cost is this
 * thread's CPU time (CLOCK_THREAD_CPUTIME_ID), which does not count the
 * time other processes of a shared machine hold the cores; wall time is
 * printed alongside. Steps are timed in blocks and each span's figure is the
 * median block. Late/early < 1.5 is loose for that (cache and frequency
 * effects remain); a cost that grows with the stream exceeds it many times
 * over.
 *
 * One engine thread: the pool's workers spin between runs, and on a busy
 * 2-core machine a spinning worker that is descheduled costs far more than
 * the work of a tiny step, which would measure the machine, not the engine.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/tokenizer.h"
#include "test.h"
#include "support/tiny_model.h"

#define MEM_GROWTH_MAX (1024.0 * 1024.0) /* bytes after warm-up */
#define TIME_RATIO_MAX 1.5

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Resident set size in bytes, from /proc/self/statm (-1 if unreadable); *anon
 * gets the part not backed by files (resident - shared), where a leak would
 * show: file pages (the binary, the model's mmap) may be dropped and read back
 * by the kernel under memory pressure, which moves the total a little. */
static double rss_bytes(double *anon)
{
    FILE *f = fopen("/proc/self/statm", "r");
    long long size = 0, res = 0, shared = 0;
    *anon = -1;
    if (!f)
        return -1;
    int n = fscanf(f, "%lld %lld %lld", &size, &res, &shared);
    fclose(f);
    if (n != 3)
        return -1;
    double page = (double)sysconf(_SC_PAGESIZE);
    *anon = (double)(res - shared) * page;
    return (double)res * page;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

struct span_stats {
    double min, median, mean; /* seconds per token */
};

/* Per-token figures of n blocks of `per` tokens each. */
static struct span_stats span(const double *blocks, int n, int64_t per)
{
    double tmp[1024];
    struct span_stats s = {0, 0, 0};
    for (int i = 0; i < n; i++) {
        tmp[i] = blocks[i] / (double)per;
        s.mean += tmp[i] / n;
    }
    qsort(tmp, (size_t)n, sizeof tmp[0], cmp_double);
    s.min = tmp[0];
    s.median = tmp[n / 2];
    return s;
}

static int32_t argmax(const float *x, int64_t n)
{
    int64_t a = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[a])
            a = i;
    return (int32_t)a;
}

/* Streams n_steps tokens one per step, feeding back the greedy token;
 * times blocks of `per` steps (cpu_blocks and wall_blocks get n_steps / per
 * entries) and samples RSS after step warm_step and at the end. */
static int stream(struct tiny_rig *r, int32_t first, int64_t n_steps, int64_t per,
                  double *cpu_blocks, double *wall_blocks, int64_t warm_step, double rss_warm[2],
                  double rss_end[2], int *finite)
{
    const int64_t V = r->f.m->hp.n_vocab;
    int32_t tok = first;
    /* touch the timing arrays now: their pages are the test's, not the engine's */
    memset(cpu_blocks, 0, (size_t)(n_steps / per) * sizeof *cpu_blocks);
    memset(wall_blocks, 0, (size_t)(n_steps / per) * sizeof *wall_blocks);
    double t0 = now_s(), c0 = cpu_s();
    *finite = 1;
    for (int64_t i = 0; i < n_steps; i++) {
        struct fwd_input in = {&r->seq, &tok, 1, FWD_LOGITS_LAST};
        int64_t rv = fwd_step(&r->f, &in, 1);
        if (rv != 1) {
            fprintf(stderr, "  fwd_step at token %lld returned %lld\n", (long long)i,
                    (long long)rv);
            return -1;
        }
        tok = argmax(r->f.logits, V);
        if (!isfinite(r->f.logits[tok]))
            *finite = 0;
        if ((i + 1) % per == 0) {
            double t1 = now_s(), c1 = cpu_s();
            wall_blocks[i / per] = t1 - t0;
            cpu_blocks[i / per] = c1 - c0;
            t0 = t1;
            c0 = c1;
        }
        if (i + 1 == warm_step)
            rss_warm[0] = rss_bytes(&rss_warm[1]);
    }
    rss_end[0] = rss_bytes(&rss_end[1]);
    return 0;
}

/* early/late: the first and the last nb blocks of per tokens. */
static void check(const char *what, const double rss_warm[2], const double rss_end[2],
                  const double *cpu_blocks, const double *wall_blocks, int n_blocks, int nb,
                  int64_t per, int *failed)
{
    struct span_stats ce = span(cpu_blocks, nb, per),
                      cl = span(cpu_blocks + n_blocks - nb, nb, per);
    struct span_stats we = span(wall_blocks, nb, per);
    struct span_stats wl = span(wall_blocks + n_blocks - nb, nb, per);
    double growth = rss_end[0] - rss_warm[0], anon_growth = rss_end[1] - rss_warm[1];
    double ratio = cl.median / ce.median;
    printf("  %s: RSS %.2f MiB after warm-up, %.2f MiB at the end (growth %+.1f KiB; "
           "anonymous %.2f -> %.2f MiB, %+.1f KiB)\n",
           what, rss_warm[0] / 1048576.0, rss_end[0] / 1048576.0, growth / 1024.0,
           rss_warm[1] / 1048576.0, rss_end[1] / 1048576.0, anon_growth / 1024.0);
    printf("  %s: CPU per token early median %.2f us (min %.2f, mean %.2f), late median %.2f us "
           "(min %.2f, mean %.2f)\n",
           what, ce.median * 1e6, ce.min * 1e6, ce.mean * 1e6, cl.median * 1e6, cl.min * 1e6,
           cl.mean * 1e6);
    printf("  %s: wall per token early median %.2f us (mean %.2f), late median %.2f us (mean "
           "%.2f)\n",
           what, we.median * 1e6, we.mean * 1e6, wl.median * 1e6, wl.mean * 1e6);
    printf("  %s: late/early CPU %.3f (limit %.2f), wall %.3f\n", what, ratio, TIME_RATIO_MAX,
           wl.median / we.median);
    ASSERT(rss_warm[0] > 0 && rss_end[0] > 0 && rss_warm[1] > 0 && rss_end[1] > 0);
    ASSERT(growth < MEM_GROWTH_MAX);
    ASSERT(anon_growth < MEM_GROWTH_MAX);
    ASSERT(ratio < TIME_RATIO_MAX);
}

/* ---- the tiny model, 1,000,000 tokens ---- */

#define TINY_TOKENS 1000000
#define TINY_W 64
#define TINY_SPAN 20000 /* tokens compared at each end */
#define TINY_BLOCK 500  /* tokens per timed block */

TEST(a_million_tokens_cost_the_same_memory_and_time_per_token_as_the_first)
{
    struct tiny_config cfg = tiny_config_default();
    struct tiny_model tm;
    ASSERT_OK(tiny_model_init(&tm, &cfg));
    struct tiny_rig r;
    struct tiny_rig_config rc = {.policy = {KV_POLICY_WINDOW, 0},
                                 .window = TINY_W,
                                 .chunk = 1,
                                 .dtype = KV_DTYPE_F16,
                                 .n_threads = 1};
    ASSERT_OK(tiny_rig_open(&r, &tm.m, &rc));
    static double cpu_blocks[TINY_TOKENS / TINY_BLOCK], wall_blocks[TINY_TOKENS / TINY_BLOCK];
    double rss_warm[2] = {-1, -1}, rss_end[2] = {-1, -1}, t0 = now_s();
    int finite = 0;
    int rv = stream(&r, 1, TINY_TOKENS, TINY_BLOCK, cpu_blocks, wall_blocks, TINY_SPAN, rss_warm,
                    rss_end, &finite);
    double total = now_s() - t0;
    int64_t pos_next = r.seq.pos_next, evicted = r.seq.n_evicted;
    tiny_rig_close(&r);
    tiny_model_free(&tm);
    ASSERT_OK(rv);
    printf("  tiny model: %d tokens in %.1f s, W=%d window policy, f16 KV, 1 thread\n", TINY_TOKENS,
           total, TINY_W);
    check("tiny", rss_warm, rss_end, cpu_blocks, wall_blocks, TINY_TOKENS / TINY_BLOCK,
          TINY_SPAN / TINY_BLOCK, TINY_BLOCK, failed);
    /* the stream really went that far, evicting all along, with finite logits */
    ASSERT_EQ(pos_next, TINY_TOKENS);
    ASSERT_EQ(evicted, TINY_TOKENS - TINY_W);
    ASSERT(finite);
}

/* ---- SmolLM2, 1,500 tokens ---- */

#define SMOL_TOKENS 1500
#define SMOL_W 128
#define SMOL_SPAN 300
#define SMOL_BLOCK 20

TEST(smollm2_late_tokens_cost_the_same_as_early_ones)
{
    struct model m;
    char err[256];
    memset(&m, 0, sizeof m);
    TEST_LOAD_MODEL(&m, err);
    struct tokenizer *tok = NULL;
    int32_t first = 0;
    if (tok_load(&tok, &m.gguf, err, sizeof err) == 0) {
        first = tok_bos(tok) >= 0 ? tok_bos(tok) : 0;
        tok_free(tok);
    }
    struct tiny_rig r;
    struct tiny_rig_config rc = {.policy = {KV_POLICY_SINKS, KV_DEFAULT_SINKS},
                                 .window = SMOL_W,
                                 .chunk = 1,
                                 .dtype = KV_DTYPE_F16,
                                 .n_threads = 1};
    if (tiny_rig_open(&r, &m, &rc) < 0) {
        model_free(&m);
        ASSERT(0);
    }
    static double cpu_blocks[SMOL_TOKENS / SMOL_BLOCK], wall_blocks[SMOL_TOKENS / SMOL_BLOCK];
    double rss_warm[2] = {-1, -1}, rss_end[2] = {-1, -1}, t0 = now_s();
    int finite = 0;
    int rv = stream(&r, first, SMOL_TOKENS, SMOL_BLOCK, cpu_blocks, wall_blocks, SMOL_SPAN,
                    rss_warm, rss_end, &finite);
    double total = now_s() - t0;
    int64_t evicted = r.seq.n_evicted;
    tiny_rig_close(&r);
    model_free(&m);
    ASSERT_OK(rv);
    printf("  SmolLM2: %d tokens in %.1f s, W=%d sinks:4, f16 KV, 1 thread\n", SMOL_TOKENS, total,
           SMOL_W);
    check("smollm2", rss_warm, rss_end, cpu_blocks, wall_blocks, SMOL_TOKENS / SMOL_BLOCK,
          SMOL_SPAN / SMOL_BLOCK, SMOL_BLOCK, failed);
    ASSERT_EQ(evicted, SMOL_TOKENS - SMOL_W - KV_DEFAULT_SINKS);
    ASSERT(finite);
}

TEST_MAIN()
