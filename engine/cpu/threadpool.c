/*
 * threadpool.c: see threadpool.h. A run is published by bumping a generation
 * counter; workers spin on it for a while (cheap to wake), then wait on a
 * condition variable. Completion is a counter the caller spins on.
 */
#include "threadpool.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>

/* Spin this many pause rounds (a few tens of microseconds) before yielding
 * the CPU; on an oversubscribed machine a spinning waiter would otherwise
 * burn the time slice the thread it waits for needs. */
#define SPIN_ROUNDS 20000
#define YIELD_ROUNDS 200

struct worker {
    struct threadpool *tp;
    pthread_t thread;
    int ith;
};

struct threadpool {
    int n;
    struct worker *workers;
    void (*fn)(void *, int, int);
    void *arg;
    unsigned gen; /* bumped per run (atomic) */
    int pending;  /* workers still running the current run (atomic) */
    int stop;     /* atomic */
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void *worker_main(void *p)
{
    struct worker *w = p;
    struct threadpool *tp = w->tp;
    unsigned seen = 0;
    for (;;) {
        unsigned g;
        int spins = 0;
        while ((g = __atomic_load_n(&tp->gen, __ATOMIC_ACQUIRE)) == seen &&
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
            while (__atomic_load_n(&tp->gen, __ATOMIC_ACQUIRE) == seen &&
                   !__atomic_load_n(&tp->stop, __ATOMIC_ACQUIRE))
                pthread_cond_wait(&tp->cv, &tp->mu);
            pthread_mutex_unlock(&tp->mu);
        }
        if (__atomic_load_n(&tp->stop, __ATOMIC_ACQUIRE))
            return NULL;
        seen = g;
        tp->fn(tp->arg, w->ith, tp->n);
        __atomic_fetch_sub(&tp->pending, 1, __ATOMIC_ACQ_REL);
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
    pthread_mutex_init(&tp->mu, NULL);
    pthread_cond_init(&tp->cv, NULL);
    tp->workers = calloc((size_t)n_threads, sizeof *tp->workers);
    if (!tp->workers) {
        free(tp);
        return -ENOMEM;
    }
    for (int i = 1; i < n_threads; i++) {
        tp->workers[i].tp = tp;
        tp->workers[i].ith = i;
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
    free(tp->workers);
    free(tp);
}

int threadpool_size(const struct threadpool *tp)
{
    return tp->n;
}

void threadpool_run(struct threadpool *tp, void (*fn)(void *arg, int ith, int nth), void *arg)
{
    if (tp->n == 1) {
        fn(arg, 0, 1);
        return;
    }
    tp->fn = fn;
    tp->arg = arg;
    __atomic_store_n(&tp->pending, tp->n - 1, __ATOMIC_RELEASE);
    pthread_mutex_lock(&tp->mu);
    __atomic_fetch_add(&tp->gen, 1, __ATOMIC_ACQ_REL);
    pthread_cond_broadcast(&tp->cv);
    pthread_mutex_unlock(&tp->mu);
    fn(arg, 0, tp->n);
    int spins = 0;
    while (__atomic_load_n(&tp->pending, __ATOMIC_ACQUIRE) > 0) {
        if (++spins < SPIN_ROUNDS)
            cpu_relax();
        else
            sched_yield(); /* the worker may be waiting for a CPU */
    }
}
