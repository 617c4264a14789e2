/*
 * threadpool.h: a fixed set of worker threads driven only from the engine
 * thread. threadpool_run(pool, fn, arg) calls fn(arg, i, n) exactly once for
 * every part i of n (n = the pool size) and returns when all are done. Parts
 * are claimed, not assigned: whichever thread is running takes the next
 * unclaimed part, so a worker the OS has not scheduled yet costs nothing (the
 * caller runs its part instead) and an oversubscribed machine slows a run
 * down instead of stalling it. fn must therefore not assume that part i runs
 * on thread i; results depend only on i and n. Workers spin briefly between
 * runs (a decode step issues hundreds of runs), then sleep. In a pool of
 * two threads, a worker that the OS preempts in the middle of a part (a
 * core busy with another process) would hold runs up for its time slice;
 * when the caller's waits for the last parts of its runs show that twice
 * within 50 ms, it runs every part itself for a while (20 ms, doubling up
 * to 1 s while it recurs), then tries the worker again.
 */
#ifndef SS_CPU_THREADPOOL_H
#define SS_CPU_THREADPOOL_H

struct threadpool;

/* n_threads >= 1 (the caller counts as one). Returns 0 or -errno. */
int threadpool_init(struct threadpool **out, int n_threads);
void threadpool_free(struct threadpool *tp);
int threadpool_size(const struct threadpool *tp);
void threadpool_run(struct threadpool *tp, void (*fn)(void *arg, int ith, int nth), void *arg);
/* The same with n_parts parts (1 <= n_parts <= 65535) instead of the pool
 * size: finer parts balance better when threads run at unequal speeds. */
void threadpool_run_parts(struct threadpool *tp, void (*fn)(void *arg, int ith, int nth), void *arg,
                          int n_parts);
/* The same for work whose parts may be long and uneven (a step's sampling,
 * some streams asking for log-probs): the caller's waits in it say nothing
 * of a preempted worker, so they do not count toward going solo. */
void threadpool_run_parts_uneven(struct threadpool *tp, void (*fn)(void *arg, int ith, int nth),
                                 void *arg, int n_parts);
/* The threads that take part in runs now: the pool size, or 1 while the
 * caller runs every part alone. Parts counted from it give a solo caller
 * the parts one thread would have: parts are claimed in order, and fewer
 * start cold. (A stretch that ends before the run only makes the run's
 * parts coarser.) Caller's thread only. */
int threadpool_active(const struct threadpool *tp);
/* How many times the caller has gone solo (for tests and diagnostics).
 * Caller's thread only, as is threadpool_allow_solo. */
long threadpool_solo_count(const struct threadpool *tp);
/* Whether the pool may go solo (default: yes for two threads; never for
 * other sizes). Tests of the claiming turn it off, so that the workers
 * always take part. */
void threadpool_allow_solo(struct threadpool *tp, int allow);

#endif
