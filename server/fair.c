/* fair.c: start-time fair queuing of jobs for a few workers (fair.h). */
#include "fair.h"

#include <stddef.h>
#include <stdlib.h>

void fair_init(struct fair_queue *q, int workers)
{
    q->head = q->tail = NULL;
    q->vtime = 0;
    q->n_running = 0;
    q->workers = workers < 1 ? 1 : workers;
}

void fair_push(struct fair_queue *q, struct fair_job *j)
{
    uint64_t base = q->vtime;
    for (const struct fair_job *w = q->head; w; w = w->next)
        if (w->group == j->group && w->tag > base)
            base = w->tag;
    j->tag = base + (j->cost > 0 ? j->cost : 1);
    j->next = NULL;
    if (q->tail)
        q->tail->next = j;
    else
        q->head = j;
    q->tail = j;
}

void fair_remove(struct fair_queue *q, struct fair_job *j)
{
    struct fair_job *prev = NULL;
    for (struct fair_job *w = q->head; w; prev = w, w = w->next) {
        if (w != j)
            continue;
        if (prev)
            prev->next = j->next;
        else
            q->head = j->next;
        if (q->tail == j)
            q->tail = prev;
        j->next = NULL;
        return;
    }
}

struct fair_job *fair_take(struct fair_queue *q)
{
    if (!q->head || q->n_running >= q->workers)
        return NULL;
    struct fair_job *best = q->head, *best_prev = NULL;
    for (struct fair_job *prev = q->head, *j = q->head->next; j; prev = j, j = j->next) {
        if (j->tag < best->tag) {
            best = j;
            best_prev = prev;
        }
    }
    if (best_prev)
        best_prev->next = best->next;
    else
        q->head = best->next;
    if (q->tail == best)
        q->tail = best_prev;
    best->next = NULL;
    if (best->tag > q->vtime)
        q->vtime = best->tag;
    q->n_running++;
    return best;
}

void fair_done(struct fair_queue *q)
{
    if (q->n_running > 0)
        q->n_running--;
}

int fair_pool_workers(void)
{
    const char *v = getenv("UV_THREADPOOL_SIZE");
    unsigned n = v ? (unsigned)atoi(v) : 4;
    if (n == 0)
        n = 1;
    return n > 1024 ? 1024 : (int)n;
}
