/*
 * queue.h: the only mutex/condvar code in the project. The inbox carries
 * commands (submit, cancel, pause, resume, retire) from any thread to the engine
 * thread; the outbox carries events, by value, from the engine thread to the
 * loop thread. Both are bounded rings allocated once. Internal to engine/.
 */
#ifndef SS_QUEUE_H
#define SS_QUEUE_H

#include <stddef.h>
#include <stdint.h>

#include "engine.h"

enum queue_cmd_kind {
    QUEUE_CMD_SUBMIT,
    QUEUE_CMD_CANCEL,
    QUEUE_CMD_PAUSE,
    QUEUE_CMD_RESUME,
    QUEUE_CMD_RETIRE, /* engine_retire_sessions */
};

struct queue_cmd {
    enum queue_cmd_kind kind;
    uint64_t id;
    struct engine_request req; /* SUBMIT: owned by the command until taken */
};

struct queue {
    void *impl;
};

/* submit_cap bounds the places of the requests in flight (submitted, not
 * yet finished): a request of n choices of k prompts takes n * k
 * (queue_places), any other one; ctl_cap and ev_cap size the rings. */
int queue_init(struct queue *q, size_t submit_cap, size_t ctl_cap, size_t ev_cap);
void queue_free(struct queue *q); /* frees requests still in the inbox */

/* The places of submit_cap that req takes while in flight: its choices, of
 * all its prompts (the sequences it runs). */
size_t queue_places(const struct engine_request *req);
/* Any thread. -EBUSY when req's places would take the requests in flight
 * past submit_cap, -ESHUTDOWN after queue_close. Takes ownership of req on
 * success only. */
int queue_submit(struct queue *q, struct engine_request *req);
/* Any thread. Waits (briefly, for the engine to drain) only if the control
 * ring is full, so a cancel is never lost. */
void queue_control(struct queue *q, enum queue_cmd_kind kind, uint64_t id);
/* Engine thread: a request finished (frees its places: queue_places of it
 * as it was submitted). */
void queue_request_done(struct queue *q, size_t places);

/* Engine thread: moves up to max commands out. If none are waiting and
 * wait_ms > 0, sleeps until one arrives or wait_ms passes (wait_ms < 0:
 * forever, until queue_close). */
size_t queue_take(struct queue *q, struct queue_cmd *out, size_t max, int wait_ms);
/* Engine thread: blocks until the outbox has room for n events (or closed). */
void queue_wait_room(struct queue *q, size_t n);
/* Engine thread: appends an event; -EAGAIN when the outbox is full (wake the
 * loop, queue_wait_room(q, 1), try again). */
int queue_push_event(struct queue *q, const struct engine_event *ev);
/* Loop thread: copies up to max events out. */
size_t queue_drain(struct queue *q, struct engine_event *out, size_t max);

/* Stats snapshot shared with other threads. */
void queue_set_stats(struct queue *q, const struct engine_stats *s);
void queue_get_stats(struct queue *q, struct engine_stats *s);

/* Any thread: wakes the engine thread from queue_take without a command
 * (the session writer finished a save). */
void queue_poke(struct queue *q);

/* Wakes the engine thread and makes queue_submit fail from now on. */
void queue_close(struct queue *q);
int queue_closed(struct queue *q);

/* A bounded FIFO of pointers between two threads (the session writer's
 * jobs and results). */
struct ptrq {
    void *impl;
};
int ptrq_init(struct ptrq *q, size_t cap);
void ptrq_free(struct ptrq *q);
/* Blocks while full. -ESHUTDOWN after ptrq_close. */
int ptrq_put(struct ptrq *q, void *p);
/* The oldest pointer, or NULL: none within wait_ms (0: do not wait; < 0:
 * until one comes or ptrq_close and the FIFO is empty). */
void *ptrq_get(struct ptrq *q, int wait_ms);
void ptrq_close(struct ptrq *q);

#endif
