/*
 * queue.c: the inbox and outbox rings between threads (queue.h). One mutex
 * guards both rings and the stats; two condition variables: `more` wakes the
 * engine (commands arrived, or close) and `room` wakes whoever waits for space
 * (the engine for outbox room, a controller for inbox room).
 */
#include "queue.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct ring_cmd {
    struct queue_cmd *buf;
    size_t cap, head, len;
};

struct ring_ev {
    struct engine_event *buf;
    size_t cap, head, len;
};

struct queue_impl {
    pthread_mutex_t mu;
    pthread_cond_t more, room;
    struct ring_cmd in;
    struct ring_ev out;
    size_t submit_cap, inflight;
    int closed, poked;
    struct engine_stats stats;
};

/* A lock and two condition variables whose timed waits count on the
 * monotonic clock (a wall-clock step must not stretch or cut a wait). */
static void sync_init(pthread_mutex_t *mu, pthread_cond_t *more, pthread_cond_t *room)
{
    pthread_mutex_init(mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(more, &ca);
    pthread_cond_init(room, &ca);
    pthread_condattr_destroy(&ca);
}

int queue_init(struct queue *q, size_t submit_cap, size_t ctl_cap, size_t ev_cap)
{
    struct queue_impl *qi = calloc(1, sizeof *qi);
    if (!qi)
        return -ENOMEM;
    qi->in.cap = submit_cap + ctl_cap;
    qi->in.buf = calloc(qi->in.cap, sizeof *qi->in.buf);
    qi->out.cap = ev_cap;
    qi->out.buf = calloc(ev_cap, sizeof *qi->out.buf);
    if (!qi->in.buf || !qi->out.buf) {
        free(qi->in.buf);
        free(qi->out.buf);
        free(qi);
        return -ENOMEM;
    }
    qi->submit_cap = submit_cap;
    sync_init(&qi->mu, &qi->more, &qi->room);
    q->impl = qi;
    return 0;
}

void queue_free(struct queue *q)
{
    struct queue_impl *qi = q->impl;
    if (!qi)
        return;
    for (size_t i = 0; i < qi->in.len; i++) {
        struct queue_cmd *c = &qi->in.buf[(qi->in.head + i) % qi->in.cap];
        if (c->kind == QUEUE_CMD_SUBMIT)
            engine_request_free(&c->req);
    }
    pthread_mutex_destroy(&qi->mu);
    pthread_cond_destroy(&qi->more);
    pthread_cond_destroy(&qi->room);
    free(qi->in.buf);
    free(qi->out.buf);
    free(qi);
    q->impl = NULL;
}

static void push_cmd(struct queue_impl *qi, const struct queue_cmd *c)
{
    qi->in.buf[(qi->in.head + qi->in.len) % qi->in.cap] = *c;
    qi->in.len++;
    pthread_cond_signal(&qi->more);
}

size_t queue_places(const struct engine_request *req)
{
    const size_t choices = req->n_choices > 1 ? (size_t)req->n_choices : 1;
    return choices * (req->n_prompts > 1 ? (size_t)req->n_prompts : 1);
}

int queue_submit(struct queue *q, struct engine_request *req)
{
    struct queue_impl *qi = q->impl;
    const size_t places = queue_places(req);
    int rc = 0;
    pthread_mutex_lock(&qi->mu);
    if (qi->closed) {
        rc = -ESHUTDOWN;
    } else if (qi->inflight + places > qi->submit_cap || qi->in.len >= qi->in.cap) {
        rc = -EBUSY;
    } else {
        struct queue_cmd c = {.kind = QUEUE_CMD_SUBMIT, .id = req->id, .req = *req};
        push_cmd(qi, &c);
        qi->inflight += places;
    }
    pthread_mutex_unlock(&qi->mu);
    if (rc == 0)
        memset(req, 0, sizeof *req); /* ownership moved */
    return rc;
}

void queue_control(struct queue *q, enum queue_cmd_kind kind, uint64_t id)
{
    struct queue_impl *qi = q->impl;
    pthread_mutex_lock(&qi->mu);
    while (qi->in.len >= qi->in.cap && !qi->closed)
        pthread_cond_wait(&qi->room, &qi->mu);
    if (!qi->closed || kind == QUEUE_CMD_CANCEL) {
        if (qi->in.len < qi->in.cap) {
            struct queue_cmd c = {.kind = kind, .id = id};
            push_cmd(qi, &c);
        }
    }
    pthread_mutex_unlock(&qi->mu);
}

void queue_request_done(struct queue *q, size_t places)
{
    struct queue_impl *qi = q->impl;
    pthread_mutex_lock(&qi->mu);
    qi->inflight -= places < qi->inflight ? places : qi->inflight;
    pthread_mutex_unlock(&qi->mu);
}

size_t queue_take(struct queue *q, struct queue_cmd *out, size_t max, int wait_ms)
{
    struct queue_impl *qi = q->impl;
    pthread_mutex_lock(&qi->mu);
    if (qi->in.len == 0 && wait_ms != 0 && !qi->closed && !qi->poked) {
        if (wait_ms < 0) {
            pthread_cond_wait(&qi->more, &qi->mu);
        } else {
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            ts.tv_sec += wait_ms / 1000;
            ts.tv_nsec += (long)(wait_ms % 1000) * 1000000L;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&qi->more, &qi->mu, &ts);
        }
    }
    qi->poked = 0;
    size_t n = 0;
    while (n < max && qi->in.len > 0) {
        out[n++] = qi->in.buf[qi->in.head];
        qi->in.head = (qi->in.head + 1) % qi->in.cap;
        qi->in.len--;
    }
    if (n > 0)
        pthread_cond_broadcast(&qi->room);
    pthread_mutex_unlock(&qi->mu);
    return n;
}

void queue_wait_room(struct queue *q, size_t n)
{
    struct queue_impl *qi = q->impl;
    if (n > qi->out.cap)
        n = qi->out.cap;
    pthread_mutex_lock(&qi->mu);
    while (qi->out.cap - qi->out.len < n && !qi->closed)
        pthread_cond_wait(&qi->room, &qi->mu);
    pthread_mutex_unlock(&qi->mu);
}

int queue_push_event(struct queue *q, const struct engine_event *ev)
{
    struct queue_impl *qi = q->impl;
    int rc = -EAGAIN;
    pthread_mutex_lock(&qi->mu);
    if (qi->out.len < qi->out.cap) {
        qi->out.buf[(qi->out.head + qi->out.len) % qi->out.cap] = *ev;
        qi->out.len++;
        rc = 0;
    }
    pthread_mutex_unlock(&qi->mu);
    return rc;
}

size_t queue_drain(struct queue *q, struct engine_event *out, size_t max)
{
    struct queue_impl *qi = q->impl;
    pthread_mutex_lock(&qi->mu);
    size_t n = 0;
    while (n < max && qi->out.len > 0) {
        out[n++] = qi->out.buf[qi->out.head];
        qi->out.head = (qi->out.head + 1) % qi->out.cap;
        qi->out.len--;
    }
    if (n > 0)
        pthread_cond_broadcast(&qi->room);
    pthread_mutex_unlock(&qi->mu);
    return n;
}

void queue_set_stats(struct queue *q, const struct engine_stats *s)
{
    struct queue_impl *qi = q->impl;
    pthread_mutex_lock(&qi->mu);
    qi->stats = *s;
    pthread_mutex_unlock(&qi->mu);
}

void queue_get_stats(struct queue *q, struct engine_stats *s)
{
    struct queue_impl *qi = q->impl;
    pthread_mutex_lock(&qi->mu);
    *s = qi->stats;
    s->requests_open = (int64_t)qi->inflight;
    pthread_mutex_unlock(&qi->mu);
}

void queue_poke(struct queue *q)
{
    struct queue_impl *qi = q->impl;
    pthread_mutex_lock(&qi->mu);
    qi->poked = 1;
    pthread_cond_broadcast(&qi->more);
    pthread_mutex_unlock(&qi->mu);
}

void queue_close(struct queue *q)
{
    struct queue_impl *qi = q->impl;
    pthread_mutex_lock(&qi->mu);
    qi->closed = 1;
    pthread_cond_broadcast(&qi->more);
    pthread_cond_broadcast(&qi->room);
    pthread_mutex_unlock(&qi->mu);
}

int queue_closed(struct queue *q)
{
    struct queue_impl *qi = q->impl;
    pthread_mutex_lock(&qi->mu);
    int c = qi->closed;
    pthread_mutex_unlock(&qi->mu);
    return c;
}

/* ---- ptrq ---------------------------------------------------------------------------------- */

struct ptrq_impl {
    pthread_mutex_t mu;
    pthread_cond_t more, room;
    void **buf;
    size_t cap, head, len;
    int closed;
};

int ptrq_init(struct ptrq *q, size_t cap)
{
    struct ptrq_impl *pi = calloc(1, sizeof *pi);
    void **buf = calloc(cap ? cap : 1, sizeof *buf);
    if (!pi || !buf) {
        free(pi);
        free(buf);
        return -ENOMEM;
    }
    pi->buf = buf;
    pi->cap = cap ? cap : 1;
    sync_init(&pi->mu, &pi->more, &pi->room);
    q->impl = pi;
    return 0;
}

void ptrq_free(struct ptrq *q)
{
    struct ptrq_impl *pi = q->impl;
    if (!pi)
        return;
    pthread_mutex_destroy(&pi->mu);
    pthread_cond_destroy(&pi->more);
    pthread_cond_destroy(&pi->room);
    free(pi->buf);
    free(pi);
    q->impl = NULL;
}

int ptrq_put(struct ptrq *q, void *p)
{
    struct ptrq_impl *pi = q->impl;
    pthread_mutex_lock(&pi->mu);
    while (pi->len == pi->cap && !pi->closed)
        pthread_cond_wait(&pi->room, &pi->mu);
    int rc = -ESHUTDOWN;
    if (!pi->closed) {
        pi->buf[(pi->head + pi->len) % pi->cap] = p;
        pi->len++;
        pthread_cond_broadcast(&pi->more);
        rc = 0;
    }
    pthread_mutex_unlock(&pi->mu);
    return rc;
}

void *ptrq_get(struct ptrq *q, int wait_ms)
{
    struct ptrq_impl *pi = q->impl;
    struct timespec ts;
    if (wait_ms > 0) {
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_sec += wait_ms / 1000;
        ts.tv_nsec += (long)(wait_ms % 1000) * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
    }
    pthread_mutex_lock(&pi->mu);
    while (pi->len == 0 && !pi->closed && wait_ms != 0) {
        if (wait_ms < 0)
            pthread_cond_wait(&pi->more, &pi->mu);
        else if (pthread_cond_timedwait(&pi->more, &pi->mu, &ts) == ETIMEDOUT)
            break;
    }
    void *p = NULL;
    if (pi->len > 0) {
        p = pi->buf[pi->head];
        pi->head = (pi->head + 1) % pi->cap;
        pi->len--;
        pthread_cond_broadcast(&pi->room);
    }
    pthread_mutex_unlock(&pi->mu);
    return p;
}

void ptrq_close(struct ptrq *q)
{
    struct ptrq_impl *pi = q->impl;
    pthread_mutex_lock(&pi->mu);
    pi->closed = 1;
    pthread_cond_broadcast(&pi->more);
    pthread_cond_broadcast(&pi->room);
    pthread_mutex_unlock(&pi->mu);
}
