/*
 * test_threadpool.c: engine/cpu/threadpool.c. Every part of every run is
 * executed exactly once, whatever the pool size and part count, with back to
 * back runs (where a worker that wakes up late must not run a part of the
 * previous run, nor one of the next run twice); a run returns only after all
 * of its parts are done; parts report the part count they were given.
 * In a pool of two, a worker held up inside a part (as by a preemption) in
 * two runs close together sends the caller solo: the next runs' parts all
 * run on the caller's thread, and after the solo stretch the worker takes
 * parts again; two such runs far apart do not, nor two close together in a
 * pool of three. Not tested here: the 200 us floor, the rule that the wait
 * must outlast the caller's own work, the doubling and its 1 s cap. The
 * claiming checks run with solo off, so that the workers always take part.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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
    int run;                         /* the run this job belongs to */
    int hits[MAX_PARTS];             /* atomic: times part i ran */
    int bad_nth;                     /* atomic: calls whose nth was wrong */
    int nth;                         /* expected part count */
    volatile double sink[MAX_PARTS]; /* some work per part, a slot each */
    int *last_run_seen;              /* atomic: written by every part */
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
    j->sink[ith] = s;
    __atomic_fetch_add(&j->hits[ith], 1, __ATOMIC_RELAXED);
    __atomic_store_n(j->last_run_seen, j->run, __ATOMIC_RELAXED);
}

static void check_pool(int n_threads)
{
    struct threadpool *tp;
    CHECK(threadpool_init(&tp, n_threads) == 0, "init %d threads", n_threads);
    CHECK(threadpool_size(tp) == n_threads, "size");
    threadpool_allow_solo(tp, 0);
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

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0)
        ;
}

/* A run of two parts in which a worker runs one: the caller's part waits
 * (up to wait_ms) until a worker has started the other, which then sleeps
 * hold_ms, as a worker preempted in the middle of a part would. */
struct held {
    pthread_t caller;
    int hold_ms, wait_ms;
    int worker_started; /* atomic */
    int on_worker;      /* atomic: parts run off the caller's thread */
};

static void held_fn(void *arg, int ith, int nth)
{
    struct held *h = arg;
    (void)ith;
    (void)nth;
    if (pthread_equal(pthread_self(), h->caller)) {
        for (int i = 0; i < h->wait_ms && !__atomic_load_n(&h->worker_started, __ATOMIC_ACQUIRE);
             i++)
            sleep_ms(1);
        return;
    }
    __atomic_fetch_add(&h->on_worker, 1, __ATOMIC_RELAXED);
    __atomic_store_n(&h->worker_started, 1, __ATOMIC_RELEASE);
    sleep_ms(h->hold_ms);
}

/* Returns how many of the run's parts ran off the caller's thread. */
static int held_run(struct threadpool *tp, int hold_ms, int wait_ms)
{
    struct held h = {pthread_self(), hold_ms, wait_ms, 0, 0};
    threadpool_run_parts(tp, held_fn, &h, 2);
    return __atomic_load_n(&h.on_worker, __ATOMIC_RELAXED);
}

/* The same as an uneven run (threadpool_run_parts_uneven). */
static int held_run_uneven(struct threadpool *tp, int hold_ms, int wait_ms)
{
    struct held h = {pthread_self(), hold_ms, wait_ms, 0, 0};
    threadpool_run_parts_uneven(tp, held_fn, &h, 2);
    return __atomic_load_n(&h.on_worker, __ATOMIC_RELAXED);
}

static void check_solo(void)
{
    struct threadpool *tp;
    CHECK(threadpool_init(&tp, 2) == 0, "init");
    /* one held-up run, then a pause past the gap (50 ms): not solo */
    CHECK(held_run(tp, 25, 5000) == 1, "a worker ran the held part");
    sleep_ms(80);
    CHECK(held_run(tp, 25, 5000) == 1, "a worker ran the held part");
    CHECK(threadpool_solo_count(tp) == 0, "two stragglers 80 ms apart went solo");
    /* a second close after it: solo */
    CHECK(held_run(tp, 25, 5000) == 1, "a worker ran the held part");
    const double t0 = now_ms();
    CHECK(threadpool_solo_count(tp) == 1, "two stragglers within the gap: solo count %ld",
          threadpool_solo_count(tp));
    /* within the solo stretch (20 ms) no worker takes a part, although the
     * caller's part waits 4 ms for one (twice: it runs both parts); on a
     * machine so loaded that the stretch may have ended, not checked */
    const int on_worker = held_run(tp, 0, 4);
    if (now_ms() - t0 < 15.0)
        CHECK(on_worker == 0, "solo, yet a worker ran a part");
    else
        printf("test_threadpool: the solo run ended %.1f ms after solo began, not checked\n",
               now_ms() - t0);
    /* past it the worker is back */
    sleep_ms(40);
    CHECK(held_run(tp, 0, 5000) >= 1, "after the solo stretch no worker took a part");
    threadpool_free(tp);

    /* uneven runs held up back to back never send it solo */
    CHECK(threadpool_init(&tp, 2) == 0, "init");
    for (int i = 0; i < 3; i++)
        CHECK(held_run_uneven(tp, 25, 5000) == 1, "a worker ran the held part");
    CHECK(threadpool_solo_count(tp) == 0, "uneven runs went solo");
    threadpool_free(tp);

    /* a pool of three never goes solo */
    CHECK(threadpool_init(&tp, 3) == 0, "init");
    for (int i = 0; i < 3; i++)
        CHECK(held_run(tp, 25, 5000) >= 1, "a worker ran the held part");
    CHECK(threadpool_solo_count(tp) == 0, "a pool of three went solo");
    threadpool_free(tp);
}

int main(void)
{
    check_solo();
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
