/*
 * fair.h: which waiting job gets a worker next when clients share a few
 * worker threads. Internal to server/.
 *
 * Prompts are tokenized on libuv's worker threads (4 unless
 * UV_THREADPOOL_SIZE says otherwise), which run jobs in the order they are
 * queued: a client that queues many long texts would hold every other
 * client's prompt behind all of them. So the router queues its jobs here
 * and hands libuv at most `workers` at a time, in fair queuing order by
 * cost (a job's texts: one prompt, or each of a list's): each job gets a tag
 * its cost past the later of the tag of its group's last waiting job and
 * the tag last started (`vtime`), and the job with the lowest tag starts
 * first (the earliest pushed among equal tags). Groups with jobs waiting
 * are served in turn, a cost of one each; a group's own jobs keep their
 * order; a worker is never left idle while a job waits. A group is an API key, or a client address
 * on an open server. Loop thread only; no allocation.
 */
#ifndef SS_FAIR_H
#define SS_FAIR_H

#include <stdint.h>

struct fair_job {
    uint64_t group;
    uint64_t cost; /* what the job takes of a worker, in texts (0 reads as 1) */
    uint64_t tag;  /* set by fair_push */
    struct fair_job *next;
};

struct fair_queue {
    struct fair_job *head, *tail; /* waiting, in the order pushed */
    uint64_t vtime;               /* the tag of the job started last */
    int workers;                  /* jobs that may run at once (at least 1) */
    int n_running;
};

void fair_init(struct fair_queue *q, int workers);
/* Adds j (its group set) to the waiting jobs. */
void fair_push(struct fair_queue *q, struct fair_job *j);
/* Takes j, which waits, out of the queue (its client left). */
void fair_remove(struct fair_queue *q, struct fair_job *j);
/* The job to start now, counted as running, or NULL when every worker is
 * taken or nothing waits. */
struct fair_job *fair_take(struct fair_queue *q);
/* A running job ended. */
void fair_done(struct fair_queue *q);
/* The workers libuv's pool has: UV_THREADPOOL_SIZE as libuv 1.44 reads it
 * (atoi as unsigned: 0 is 1, a negative number or over 1024 is 1024), 4
 * without it. */
int fair_pool_workers(void);

#endif
