/*
 * threadpool.h: a fixed set of worker threads driven only from the engine
 * thread. threadpool_run(pool, fn, arg) calls fn(arg, i, n) once on every
 * thread i of n (the caller is thread 0) and returns when all are done. Workers
 * spin briefly between runs (a decode step issues hundreds of runs), then sleep.
 */
#ifndef SS_CPU_THREADPOOL_H
#define SS_CPU_THREADPOOL_H

struct threadpool;

/* n_threads >= 1 (the caller counts as one). Returns 0 or -errno. */
int threadpool_init(struct threadpool **out, int n_threads);
void threadpool_free(struct threadpool *tp);
int threadpool_size(const struct threadpool *tp);
void threadpool_run(struct threadpool *tp, void (*fn)(void *arg, int ith, int nth), void *arg);

#endif
