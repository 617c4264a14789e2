/*
 * threadpool.c: see threadpool.h. A run is published as one 64-bit state
 * word: generation (32 bits) | number of parts (16) | next unclaimed part
 * (16). Every participant (the caller and each worker) claims parts with a
 * compare-and-swap on that word, so a claim can only succeed for the
 * generation it read, and a worker that wakes up late finds every part taken
 * and goes back to waiting. The caller returns when the done counter reaches
 * the number of parts; it never waits for a worker that has claimed nothing.
 * The job (fn, arg) is read only after a successful claim: while a part of
 * generation g is claimed and unfinished, the caller cannot publish g + 1.
 *
 * A part that a worker has claimed cannot be taken back, so a worker that
 * the OS preempts in the middle of one (another process busy on its core)
 * holds the caller up for the rest of its time slice, milliseconds against
 * runs of microseconds. In a pool of two threads (the case measured, on a
 * 2-vCPU machine) the caller watches for that: a run in which it ran parts
 * itself and then waited for the last ones both long (over STRAGGLER_NS)
 * and longer than it had worked. One such run alone is let pass: on an idle
 * 2-vCPU VM such waits came about once or twice a second (page faults or
 * the host, presumably). A second within STRAGGLER_GAP_NS is taken for a
 * shared core, and the caller runs every part itself (solo) for a while,
 * then tries the worker again. The while starts at SOLO_MIN_NS and doubles,
 * up to SOLO_MAX_NS, each time the worker fails again sooner than the last
 * while lasted. The caller's own preemption during a wait counts as well.
 * Larger pools never go solo: one slow worker of many costs less than
 * dropping them all, and harmless waits would come n - 1 times as often.
 * Which thread runs a part never changes a result (parts depend only on i
 * and n).
 *
 * Run trace, for finding where a step's threads wait: with
 * STREAMSINK_TRACE_RUNS=FILE in the environment at threadpool_init, the pool
 * keeps each run's publication and each part's thread, start and end
 * (CLOCK_MONOTONIC ns) in memory, up to TRACE_MAX events (later ones are
 * counted, not kept), and threadpool_free writes them to FILE, one a line:
 *     run GEN FN T                      the caller published run GEN at T
 *     part GEN FN THREAD PART T0 T1     THREAD 0 is the caller, i worker i
 *     dropped N
 * FN is the part function's address less the load address of the object
 * that holds it (dladdr), which tools/run_trace.py names with nm. Without
 * the variable it costs one untaken branch per part.
 */
#include "threadpool.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Spin this many pause rounds (a few tens of microseconds) before yielding
 * the CPU; on an oversubscribed machine a spinning waiter would otherwise
 * burn the time slice the thread it waits for needs. */
#define SPIN_ROUNDS 20000
#define YIELD_ROUNDS 200

#define MAX_PARTS 65535

#define TRACE_MAX (4 << 20) /* events kept (128 MiB): about 35 s of 32-stream decode */

#define STRAGGLER_NS 200000LL       /* a wait for the last parts this long... */
#define STRAGGLER_GAP_NS 50000000LL /* ...twice within 50 ms, */
#define SOLO_MIN_NS 20000000LL      /* ...and the caller runs alone for 20 ms, */
#define SOLO_MAX_NS 1000000000LL    /* doubling up to 1 s while it recurs */

struct worker {
    struct threadpool *tp;
    pthread_t thread;
    int self; /* its index: 1 .. n - 1 (the caller is 0) */
};

struct trace_event {
    void (*fn)(void *, int, int);
    uint32_t gen;
    int thread; /* -1: the run's publication */
    int part;
    int64_t t0, t1;
};

struct threadpool {
    int n;
    struct worker *workers;
    void (*fn)(void *, int, int); /* atomic: written by the caller between runs */
    void *arg;                    /* atomic */
    uint64_t state;               /* gen << 32 | parts << 16 | next (atomic) */
    int done;                     /* parts finished in this run (atomic) */
    int sleepers;                 /* workers in pthread_cond_wait or about to be (atomic) */
    int stop;                     /* atomic */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* the caller's solo state (read and written by the caller only) */
    int solo_ok;            /* whether this pool may go solo */
    int64_t solo_until;     /* CLOCK_MONOTONIC ns; 0: not solo */
    int64_t solo_len;       /* the last solo stretch's length */
    int64_t shared_since;   /* when the workers were last taken back */
    int64_t last_straggler; /* when a run last waited that way */
    long solo_count;        /* solo stretches so far */
    /* the run trace (see the top of the file): NULL when off */
    struct trace_event *trace;
    char *trace_path;
    long trace_n;            /* atomic: events claimed, kept or not */
    uint32_t trace_solo_gen; /* numbering of the runs the caller ran alone */
};

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void trace_add(struct threadpool *tp, struct trace_event e)
{
    long i = __atomic_fetch_add(&tp->trace_n, 1, __ATOMIC_RELAXED);
    if (i < TRACE_MAX)
        tp->trace[i] = e;
}

static void trace_write(const struct threadpool *tp)
{
    FILE *f = fopen(tp->trace_path, "w");
    if (!f) {
        fprintf(stderr, "threadpool: cannot write the run trace to %s\n", tp->trace_path);
        return;
    }
    const long n = tp->trace_n < TRACE_MAX ? tp->trace_n : TRACE_MAX;
    for (long i = 0; i < n; i++) {
        const struct trace_event *e = &tp->trace[i];
        Dl_info di;
        unsigned long fn = (unsigned long)(uintptr_t)e->fn;
        if (dladdr((void *)(uintptr_t)fn, &di) && di.dli_fbase)
            fn -= (unsigned long)(uintptr_t)di.dli_fbase;
        if (e->thread < 0)
            fprintf(f, "run %u %lx %lld\n", e->gen, fn, (long long)e->t0);
        else
            fprintf(f, "part %u %lx %d %d %lld %lld\n", e->gen, fn, e->thread, e->part,
                    (long long)e->t0, (long long)e->t1);
    }
    fprintf(f, "dropped %ld\n", tp->trace_n - n);
    fclose(f);
}

/* Whether the caller runs this run alone (see the top of the file). */
static int caller_alone(struct threadpool *tp)
{
    if (tp->solo_until == 0)
        return 0;
    int64_t now = now_ns();
    if (now < tp->solo_until)
        return 1;
    tp->solo_until = 0;
    tp->shared_since = now;
    return 0;
}

/* After a run: busy = the caller's time until no part was left to claim,
 * wait = its time from then until the last part was done. */
static void note_wait(struct threadpool *tp, int64_t busy, int64_t wait, int64_t now)
{
    if (wait <= STRAGGLER_NS || wait <= busy)
        return;
    /* one alone is a page fault or a blip of the host; two close together
     * are a core shared with someone else */
    const int64_t prev = tp->last_straggler;
    tp->last_straggler = now;
    if (prev == 0 || now - prev > STRAGGLER_GAP_NS)
        return;
    tp->last_straggler = 0;
    /* the worker failed again within as long as the caller was alone */
    int again = tp->solo_len > 0 && now - tp->shared_since < tp->solo_len;
    int64_t len = again ? 2 * tp->solo_len : SOLO_MIN_NS;
    tp->solo_len = len < SOLO_MAX_NS ? len : SOLO_MAX_NS;
    tp->solo_until = now + tp->solo_len;
    tp->solo_count++;
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static inline uint32_t st_gen(uint64_t s)
{
    return (uint32_t)(s >> 32);
}

static inline int st_parts(uint64_t s)
{
    return (int)((s >> 16) & 0xffff);
}

static inline int st_next(uint64_t s)
{
    return (int)(s & 0xffff);
}

/* Runs parts of generation gen until none is left unclaimed (or the state has
 * moved on to another generation); returns how many it ran. self: the
 * running thread's index, for the trace. */
static int work(struct threadpool *tp, uint32_t gen, int self)
{
    int ran = 0;
    uint64_t s = __atomic_load_n(&tp->state, __ATOMIC_ACQUIRE);
    while (st_gen(s) == gen && st_next(s) < st_parts(s)) {
        if (!__atomic_compare_exchange_n(&tp->state, &s, s + 1, 1, __ATOMIC_ACQ_REL,
                                         __ATOMIC_ACQUIRE))
            continue; /* s now holds the current word */
        void (*fn)(void *, int, int) = __atomic_load_n(&tp->fn, __ATOMIC_RELAXED);
        void *arg = __atomic_load_n(&tp->arg, __ATOMIC_RELAXED);
        if (tp->trace) {
            const int64_t t0 = now_ns();
            fn(arg, st_next(s), st_parts(s));
            trace_add(tp, (struct trace_event){fn, gen, self, st_next(s), t0, now_ns()});
        } else {
            fn(arg, st_next(s), st_parts(s));
        }
        __atomic_fetch_add(&tp->done, 1, __ATOMIC_ACQ_REL);
        ran++;
        s = __atomic_load_n(&tp->state, __ATOMIC_ACQUIRE);
    }
    return ran;
}

static void *worker_main(void *p)
{
    struct worker *w = p;
    struct threadpool *tp = w->tp;
    /* generation 0 is the pool's before any run: a worker that starts after
     * the first run was published still joins it */
    uint32_t seen = 0;
    for (;;) {
        uint32_t g;
        int spins = 0;
        while ((g = st_gen(__atomic_load_n(&tp->state, __ATOMIC_ACQUIRE))) == seen &&
               !__atomic_load_n(&tp->stop, __ATOMIC_ACQUIRE)) {
            if (++spins < SPIN_ROUNDS) {
                cpu_relax();
                continue;
            }
            if (spins < SPIN_ROUNDS + YIELD_ROUNDS) {
                sched_yield();
                continue;
            }
            pthread_mutex_lock(&tp->mu);
            __atomic_fetch_add(&tp->sleepers, 1, __ATOMIC_SEQ_CST);
            while (st_gen(__atomic_load_n(&tp->state, __ATOMIC_SEQ_CST)) == seen &&
                   !__atomic_load_n(&tp->stop, __ATOMIC_ACQUIRE))
                pthread_cond_wait(&tp->cv, &tp->mu);
            __atomic_fetch_sub(&tp->sleepers, 1, __ATOMIC_SEQ_CST);
            pthread_mutex_unlock(&tp->mu);
        }
        if (__atomic_load_n(&tp->stop, __ATOMIC_ACQUIRE))
            return NULL;
        seen = g;
        (void)work(tp, g, w->self);
    }
}

int threadpool_init(struct threadpool **out, int n_threads)
{
    struct threadpool *tp = calloc(1, sizeof *tp);
    if (!tp)
        return -ENOMEM;
    if (n_threads < 1)
        n_threads = 1;
    tp->n = n_threads;
    tp->solo_ok = n_threads == 2;
    const char *trace = getenv("STREAMSINK_TRACE_RUNS");
    if (trace && *trace) {
        tp->trace = malloc(TRACE_MAX * sizeof *tp->trace);
        tp->trace_path = strdup(trace);
        if (!tp->trace || !tp->trace_path) {
            free(tp->trace);
            free(tp->trace_path);
            free(tp);
            return -ENOMEM;
        }
    }
    pthread_mutex_init(&tp->mu, NULL);
    pthread_cond_init(&tp->cv, NULL);
    tp->workers = calloc((size_t)n_threads, sizeof *tp->workers);
    if (!tp->workers) {
        free(tp->trace);
        free(tp->trace_path);
        free(tp);
        return -ENOMEM;
    }
    for (int i = 1; i < n_threads; i++) {
        tp->workers[i].tp = tp;
        tp->workers[i].self = i;
        if (pthread_create(&tp->workers[i].thread, NULL, worker_main, &tp->workers[i]) != 0) {
            tp->n = i; /* only join the ones that started */
            threadpool_free(tp);
            return -EAGAIN;
        }
    }
    *out = tp;
    return 0;
}

void threadpool_free(struct threadpool *tp)
{
    if (!tp)
        return;
    pthread_mutex_lock(&tp->mu);
    __atomic_store_n(&tp->stop, 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&tp->cv);
    pthread_mutex_unlock(&tp->mu);
    for (int i = 1; i < tp->n; i++)
        pthread_join(tp->workers[i].thread, NULL);
    pthread_mutex_destroy(&tp->mu);
    pthread_cond_destroy(&tp->cv);
    if (tp->trace)
        trace_write(tp);
    free(tp->trace);
    free(tp->trace_path);
    free(tp->workers);
    free(tp);
}

int threadpool_size(const struct threadpool *tp)
{
    return tp->n;
}

/* A run; timed: its waits may send the caller solo (note_wait). */
static void run_parts(struct threadpool *tp, void (*fn)(void *arg, int ith, int nth), void *arg,
                      int n_parts, int timed)
{
    if (n_parts < 1)
        n_parts = 1;
    if (n_parts > MAX_PARTS)
        n_parts = MAX_PARTS;
    if (tp->n == 1 || (tp->solo_ok && caller_alone(tp))) {
        /* traced as a run of its own generation (no worker can claim it) */
        const uint32_t gen = tp->trace ? ++tp->trace_solo_gen | 1u << 31 : 0;
        if (tp->trace)
            trace_add(tp, (struct trace_event){fn, gen, -1, 0, now_ns(), 0});
        for (int i = 0; i < n_parts; i++) {
            const int64_t t0 = tp->trace ? now_ns() : 0;
            fn(arg, i, n_parts);
            if (tp->trace)
                trace_add(tp, (struct trace_event){fn, gen, 0, i, t0, now_ns()});
        }
        return;
    }
    const int64_t t0 = tp->solo_ok ? now_ns() : 0;
    /* every part of the previous run is finished, so no thread reads these */
    __atomic_store_n(&tp->fn, fn, __ATOMIC_RELAXED);
    __atomic_store_n(&tp->arg, arg, __ATOMIC_RELAXED);
    __atomic_store_n(&tp->done, 0, __ATOMIC_RELAXED);
    uint32_t gen = st_gen(__atomic_load_n(&tp->state, __ATOMIC_RELAXED)) + 1;
    if (tp->trace)
        trace_add(tp, (struct trace_event){fn, gen, -1, 0, now_ns(), 0});
    __atomic_store_n(&tp->state, (uint64_t)gen << 32 | (uint64_t)n_parts << 16, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&tp->sleepers, __ATOMIC_SEQ_CST) > 0) {
        pthread_mutex_lock(&tp->mu);
        pthread_cond_broadcast(&tp->cv);
        pthread_mutex_unlock(&tp->mu);
    }
    const int ran = work(tp, gen, 0);
    if (__atomic_load_n(&tp->done, __ATOMIC_ACQUIRE) == n_parts)
        return;
    const int64_t t1 = tp->solo_ok ? now_ns() : 0;
    int spins = 0;
    while (__atomic_load_n(&tp->done, __ATOMIC_ACQUIRE) < n_parts) {
        if (++spins < SPIN_ROUNDS)
            cpu_relax();
        else
            sched_yield(); /* a worker that claimed a part may be waiting for a CPU */
    }
    if (timed && tp->solo_ok && ran > 0) { /* a run the worker took whole says nothing */
        const int64_t t2 = now_ns();
        note_wait(tp, t1 - t0, t2 - t1, t2);
    }
}

void threadpool_run_parts(struct threadpool *tp, void (*fn)(void *arg, int ith, int nth), void *arg,
                          int n_parts)
{
    run_parts(tp, fn, arg, n_parts, 1);
}

void threadpool_run_parts_uneven(struct threadpool *tp, void (*fn)(void *arg, int ith, int nth),
                                 void *arg, int n_parts)
{
    run_parts(tp, fn, arg, n_parts, 0);
}

int threadpool_active(const struct threadpool *tp)
{
    /* solo_until is cleared by the first run that finds the stretch over */
    return tp->solo_until != 0 ? 1 : tp->n;
}

long threadpool_solo_count(const struct threadpool *tp)
{
    return tp->solo_count;
}

void threadpool_allow_solo(struct threadpool *tp, int allow)
{
    tp->solo_ok = allow && tp->n == 2;
    tp->solo_until = 0;
}

void threadpool_run(struct threadpool *tp, void (*fn)(void *arg, int ith, int nth), void *arg)
{
    threadpool_run_parts(tp, fn, arg, tp->n);
}
