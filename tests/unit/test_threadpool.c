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
 * pool of three. threadpool_active says one thread takes part while solo,
 * the pool size before and after (and in pools of one and three). Where
 * the machine is loaded, the test's own clock tells which runs surely
 * counted as such (sure_straggler), and the close runs are repeated until
 * a pair does. Not tested here: the 200 us floor, the rule that the wait
 * must outlast the caller's own work, the doubling and its 1 s cap. The
 * claiming checks run with solo off, so that the workers always take part.
 * With STREAMSINK_TRACE_RUNS set, the pool writes a trace of its runs when
 * freed: every run's publication once, every part of it once, on a thread
 * of the pool, after the publication, start before end; the caller's runs
 * in a pool of one (which it runs alone) as well.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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

/* A run of parts in which workers run some: the caller's part waits (up to
 * wait_ms) until want workers' parts have started, each of which then
 * sleeps hold_ms, as a worker preempted in the middle of a part would. The
 * times are the first worker part's: in a pool of three, two workers may
 * run parts of one run at once. */
struct held {
    pthread_t caller;
    int hold_ms, wait_ms, want;
    int workers_started; /* atomic */
    int on_worker;       /* atomic: parts run off the caller's thread */
    double caller_end;   /* now_ms() as the caller's part returned (-1: none ran) */
    double worker_start; /* now_ms() as the first worker part began (-1: none ran) */
    double worker_end;   /* now_ms() as the first worker part returned (-1: none ran) */
};

/* A held run's parts off the caller's thread, and its times on the test's
 * clock: before the run, as the caller's part ended, as the worker's began
 * and ended, and after the run returned. */
struct held_times {
    int on_worker;
    double start, caller_end, worker_start, worker_end, ret;
};

static void held_fn(void *arg, int ith, int nth)
{
    struct held *h = arg;
    (void)ith;
    (void)nth;
    if (pthread_equal(pthread_self(), h->caller)) {
        for (int i = 0;
             i < h->wait_ms && __atomic_load_n(&h->workers_started, __ATOMIC_ACQUIRE) < h->want;
             i++)
            sleep_ms(1);
        h->caller_end = now_ms();
        return;
    }
    const double start = now_ms();
    const int first = __atomic_fetch_add(&h->on_worker, 1, __ATOMIC_RELAXED) == 0;
    if (first)
        h->worker_start = start;
    __atomic_fetch_add(&h->workers_started, 1, __ATOMIC_RELEASE);
    sleep_ms(h->hold_ms);
    if (first)
        h->worker_end = now_ms();
}

/* A held run of parts parts whose caller's part waits for parts - 1
 * workers' parts: returns how many ran off the caller's thread; its times
 * into *ht (unless NULL). */
static int held_run_parts(struct threadpool *tp, int parts, int hold_ms, int wait_ms,
                          struct held_times *ht)
{
    struct held h = {pthread_self(), hold_ms, wait_ms, parts - 1, 0, 0, -1.0, -1.0, -1.0};
    const double start = now_ms();
    threadpool_run_parts(tp, held_fn, &h, parts);
    const int on_worker = __atomic_load_n(&h.on_worker, __ATOMIC_RELAXED);
    if (ht) /* the run's return orders the parts' writes before these reads */
        *ht = (struct held_times){on_worker,      start,        h.caller_end,
                                  h.worker_start, h.worker_end, now_ms()};
    return on_worker;
}

static int held_run_timed(struct threadpool *tp, int hold_ms, int wait_ms, struct held_times *ht)
{
    return held_run_parts(tp, 2, hold_ms, wait_ms, ht);
}

static int held_run(struct threadpool *tp, int hold_ms, int wait_ms)
{
    return held_run_timed(tp, hold_ms, wait_ms, NULL);
}

/* The pool's rules (engine/cpu/threadpool.c): two stragglers within
 * GAP_MS send a pool of two solo for SOLO_MS. */
#define GAP_MS 50.0
#define SOLO_MS 20.0
/* How close the test's own times must be to the pool's (sure_straggler). */
#define CLEAN_MS 2.0
#define SURE_WAIT_MS 10.0

/* Whether a held run surely counted as a straggler in the pool, as its
 * times bound the pool's own: the caller ran one part and the worker the
 * other (a run the worker took whole is not counted); the caller's part
 * (its busy time) ended within CLEAN_MS of the start, the worker's well
 * after it (a wait over both the busy time and 200 us); and the run
 * returned within CLEAN_MS of that (the pool's straggler time lies between
 * the worker's end and the return). */
static int sure_straggler(const struct held_times *t)
{
    return t->on_worker == 1 && t->caller_end >= t->start && t->caller_end - t->start < CLEAN_MS &&
           t->worker_end - t->caller_end > SURE_WAIT_MS && t->ret - t->worker_end < CLEAN_MS;
}

/* The same as an uneven run (threadpool_run_parts_uneven). */
static int held_run_uneven(struct threadpool *tp, int hold_ms, int wait_ms)
{
    struct held h = {pthread_self(), hold_ms, wait_ms, 1, 0, 0, -1.0, -1.0, -1.0};
    threadpool_run_parts_uneven(tp, held_fn, &h, 2);
    return __atomic_load_n(&h.on_worker, __ATOMIC_RELAXED);
}

#define SOLO_TRY_MS 30000.0

static void check_solo(void)
{
    struct threadpool *tp;
    CHECK(threadpool_init(&tp, 2) == 0, "init");
    CHECK(threadpool_active(tp) == 2, "a new pool of two: %d threads taking part",
          threadpool_active(tp));
    /* one held-up run, then a pause past the gap (50 ms): not solo (a run
     * whose both parts the worker took, the caller held up, is not counted:
     * that passes as well) */
    CHECK(held_run(tp, 25, 5000) >= 1, "the worker ran no part");
    sleep_ms(80);
    struct held_times prev, cur;
    CHECK(held_run_timed(tp, 25, 5000, &prev) >= 1, "the worker ran no part");
    CHECK(threadpool_solo_count(tp) == 0, "two stragglers 80 ms apart went solo");
    int have_prev = sure_straggler(&prev);
    cur = prev;
    /* a second close after it: solo. On a quiet machine the first close
     * run does it. On a loaded one a run may not count as a straggler (the
     * worker starts its part late, or the caller sees that late, and the
     * caller's part, which waits for that start, is then busy longer than
     * it waits), or two may end more than the gap apart. So the runs go on,
     * back to back, until a pair does, for up to SOLO_TRY_MS; but two runs
     * that surely counted (sure_straggler) and whose straggler times surely
     * lie within the gap must send the pool solo. */
    int tries = 0;
    const double t_try = now_ms();
    while (threadpool_solo_count(tp) == 0 && (tries == 0 || now_ms() - t_try < SOLO_TRY_MS)) {
        CHECK(held_run_timed(tp, 25, 5000, &cur) >= 1, "the worker ran no part");
        tries++;
        const int sure = sure_straggler(&cur);
        /* the pool's two straggler times lie within [prev.worker_end, cur.ret] */
        if (have_prev && sure && cur.ret - prev.worker_end < GAP_MS - 5.0)
            CHECK(threadpool_solo_count(tp) == 1,
                  "two stragglers %.1f ms apart at most, both sure, yet not solo",
                  cur.ret - prev.worker_end);
        if (failures)
            break;
        if (sure) {
            prev = cur;
            have_prev = 1;
        }
    }
    CHECK(threadpool_solo_count(tp) == 1,
          "%d runs held up back to back: solo count %ld (two stragglers within the gap)", tries,
          threadpool_solo_count(tp));
    if (tries > 1)
        printf("test_threadpool: solo after %d close runs (a loaded machine)\n", tries);
    if (threadpool_solo_count(tp) == 1) {
        /* gone solo: one thread takes part (no run since has found the
         * stretch over) */
        CHECK(threadpool_active(tp) == 1, "solo, yet %d threads taking part",
              threadpool_active(tp));
        /* within the solo stretch no worker takes a part, although the
         * caller's part waits 4 ms for one (twice: it runs both parts). The
         * stretch began at the pool's straggler time, after the worker's
         * part ended (cur.worker_end), and lasts SOLO_MS; a run that is not
         * solo was published after its caller found the stretch over, and a
         * worker's part of it began after that. So a worker's part that
         * began within SOLO_MS of cur.worker_end ran during the stretch. */
        struct held_times in;
        held_run_timed(tp, 0, 4, &in);
        CHECK(in.on_worker == 0 || in.worker_start - cur.worker_end >= SOLO_MS,
              "solo, yet a worker began a part %.1f ms after the stretch began at the latest",
              in.worker_start - cur.worker_end);
        /* past it the worker is back */
        sleep_ms(40);
        CHECK(held_run(tp, 0, 5000) >= 1, "after the solo stretch no worker took a part");
        CHECK(threadpool_active(tp) == 2, "after the solo stretch %d threads taking part",
              threadpool_active(tp));
    }
    threadpool_free(tp);

    /* uneven runs held up back to back never send it solo */
    CHECK(threadpool_init(&tp, 2) == 0, "init");
    for (int i = 0; i < 3; i++)
        CHECK(held_run_uneven(tp, 25, 5000) >= 1, "the worker ran no part");
    CHECK(threadpool_solo_count(tp) == 0, "uneven runs went solo");
    threadpool_free(tp);

    /* a pool of three never goes solo */
    CHECK(threadpool_init(&tp, 3) == 0, "init");
    for (int i = 0; i < 3; i++)
        CHECK(held_run(tp, 25, 5000) >= 1, "a worker ran the held part");
    /* three parts: the two workers hold one each, at once (under
     * ThreadSanitizer: held_fn records a worker's part without a race
     * between two workers) */
    CHECK(held_run_parts(tp, 3, 25, 5000, NULL) >= 2,
          "the workers ran fewer than two of the three parts");
    CHECK(threadpool_solo_count(tp) == 0, "a pool of three went solo");
    CHECK(threadpool_active(tp) == 3, "a pool of three: %d threads taking part",
          threadpool_active(tp));
    threadpool_free(tp);
    CHECK(threadpool_init(&tp, 1) == 0, "init");
    CHECK(threadpool_active(tp) == 1, "a pool of one: %d threads taking part",
          threadpool_active(tp));
    threadpool_free(tp);
}

/* Runs runs runs of parts parts on a traced pool of n_threads, frees it and
 * checks the trace file. */
static void check_trace(int n_threads, int runs, int parts)
{
    char path[] = "/tmp/ss_trace_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    if (fd < 0)
        return;
    close(fd);
    setenv("STREAMSINK_TRACE_RUNS", path, 1);
    struct threadpool *tp;
    CHECK(threadpool_init(&tp, n_threads) == 0, "init %d threads traced", n_threads);
    unsetenv("STREAMSINK_TRACE_RUNS");
    threadpool_allow_solo(tp, 0);
    static struct job job;
    int last = -1;
    for (int run = 0; run < runs; run++) {
        memset(job.hits, 0, sizeof job.hits);
        job.run = run;
        job.nth = parts;
        job.last_run_seen = &last;
        threadpool_run_parts(tp, part_fn, &job, parts);
    }
    threadpool_free(tp);

    FILE *f = fopen(path, "r");
    CHECK(f != NULL, "no trace written to %s", path);
    if (!f)
        return;
    enum { MAX_RUNS = 64 };
    unsigned gens[MAX_RUNS];
    long long pub_t[MAX_RUNS];
    unsigned long fn0 = 0;
    int n_runs = 0, n_parts = 0, dropped = -1, seen[MAX_RUNS][MAX_PARTS] = {{0}};
    char kind[16];
    while (fscanf(f, "%15s", kind) == 1) {
        unsigned gen;
        unsigned long fn;
        if (!strcmp(kind, "run")) {
            long long t;
            CHECK(fscanf(f, "%u %lx %lld", &gen, &fn, &t) == 3, "a run line");
            CHECK(n_runs < MAX_RUNS, "more runs traced than made");
            if (n_runs >= MAX_RUNS)
                break;
            for (int i = 0; i < n_runs; i++)
                CHECK(gens[i] != gen, "run %u traced twice", gen);
            gens[n_runs] = gen;
            pub_t[n_runs++] = t;
            fn0 = fn0 ? fn0 : fn;
            CHECK(fn == fn0 && fn != 0, "runs name different functions");
        } else if (!strcmp(kind, "part")) {
            int thr, part;
            long long t0, t1;
            CHECK(fscanf(f, "%u %lx %d %d %lld %lld", &gen, &fn, &thr, &part, &t0, &t1) == 6,
                  "a part line");
            int r = 0;
            while (r < n_runs && gens[r] != gen)
                r++;
            CHECK(r < n_runs, "part of run %u before its publication", gen);
            CHECK(fn == fn0, "a part names another function");
            CHECK(thr >= 0 && thr < n_threads, "thread %d in a pool of %d", thr, n_threads);
            CHECK(part >= 0 && part < parts, "part %d of %d", part, parts);
            if (r < n_runs && part >= 0 && part < parts) {
                seen[r][part]++;
                CHECK(pub_t[r] <= t0 && t0 <= t1,
                      "part %d of run %u: published %lld, ran %lld-%lld", part, gen, pub_t[r], t0,
                      t1);
            }
            n_parts++;
        } else if (!strcmp(kind, "dropped")) {
            CHECK(fscanf(f, "%d", &dropped) == 1, "the dropped line");
        } else {
            CHECK(0, "unknown line kind %s", kind);
            break;
        }
    }
    fclose(f);
    remove(path);
    CHECK(n_runs == runs, "%d runs traced of %d", n_runs, runs);
    CHECK(n_parts == runs * parts, "%d parts traced of %d", n_parts, runs * parts);
    for (int r = 0; r < n_runs; r++)
        for (int i = 0; i < parts; i++)
            CHECK(seen[r][i] == 1, "run %d part %d traced %d times", r, i, seen[r][i]);
    CHECK(dropped == 0, "dropped %d", dropped);
}

int main(void)
{
    check_solo();
    for (int n = 1; n <= 5; n++)
        check_pool(n);
    /* more threads than this machine has cores: still exact */
    check_pool(16);
    check_trace(3, 40, 7);
    check_trace(1, 5, 3); /* the caller alone */
    if (failures) {
        fprintf(stderr, "%d failures\n", failures);
        return 1;
    }
    printf("test_threadpool: ok\n");
    return 0;
}
