/*
 * test_threadpool.c: engine/cpu/threadpool.c. Every part of every run is
 * executed exactly once, whatever the pool size and part count, with back to
 * back runs (where a worker that wakes up late must not run a part of the
 * previous run, nor one of the next run twice); a run returns only after all
 * of its parts are done; parts report the part count they were given.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/threadpool.h"

#define MAX_PARTS 97

static int failures;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                   \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

struct job {
    int run;              /* the run this job belongs to */
    int hits[MAX_PARTS];  /* atomic: times part i ran */
    int bad_nth;          /* atomic: calls whose nth was wrong */
    int nth;              /* expected part count */
    volatile double sink; /* some work per part */
    int *last_run_seen;   /* atomic: written by every part */
};

static void part_fn(void *arg, int ith, int nth)
{
    struct job *j = arg;
    if (nth != j->nth || ith < 0 || ith >= nth) {
        __atomic_fetch_add(&j->bad_nth, 1, __ATOMIC_RELAXED);
        return;
    }
    /* uneven work: later parts cost more */
    double s = 0;
    for (int i = 0; i < 200 * (ith % 7 + 1); i++)
        s += (double)i * 1e-9;
    j->sink = s;
    __atomic_fetch_add(&j->hits[ith], 1, __ATOMIC_RELAXED);
    __atomic_store_n(j->last_run_seen, j->run, __ATOMIC_RELAXED);
}

static void check_pool(int n_threads)
{
    struct threadpool *tp;
    CHECK(threadpool_init(&tp, n_threads) == 0, "init %d threads", n_threads);
    CHECK(threadpool_size(tp) == n_threads, "size");
    int last = -1;
    /* two jobs used alternately: a part run late against the wrong job, or
     * twice, shows up as a count other than 1 */
    static struct job jobs[2];
    for (int run = 0; run < 4000; run++) {
        struct job *j = &jobs[run & 1];
        memset(j->hits, 0, sizeof j->hits);
        j->bad_nth = 0;
        j->run = run;
        j->last_run_seen = &last;
        int parts = run % 5 == 0 ? 0 : (run * 7919) % MAX_PARTS + 1;
        if (parts == 0) {
            j->nth = n_threads;
            threadpool_run(tp, part_fn, j);
        } else {
            j->nth = parts;
            threadpool_run_parts(tp, part_fn, j, parts);
        }
        /* read right after the return: everything must be done */
        int bad = 0;
        for (int i = 0; i < j->nth; i++)
            bad += __atomic_load_n(&j->hits[i], __ATOMIC_RELAXED) != 1;
        for (int i = j->nth; i < MAX_PARTS; i++)
            bad += __atomic_load_n(&j->hits[i], __ATOMIC_RELAXED) != 0;
        CHECK(bad == 0, "%d threads, run %d (%d parts): %d parts not run exactly once", n_threads,
              run, j->nth, bad);
        CHECK(j->bad_nth == 0, "%d threads, run %d: wrong nth", n_threads, run);
        CHECK(__atomic_load_n(&last, __ATOMIC_RELAXED) == run, "a part of run %d ran late", run);
        if (failures)
            break;
    }
    threadpool_free(tp);
}

int main(void)
{
    for (int n = 1; n <= 5; n++)
        check_pool(n);
    /* more threads than this machine has cores: still exact */
    check_pool(16);
    if (failures) {
        fprintf(stderr, "%d failures\n", failures);
        return 1;
    }
    printf("test_threadpool: ok\n");
    return 0;
}
