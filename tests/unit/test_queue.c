/*
 * test_queue.c: the engine's two queues (engine/queue.c), the only code with
 * a mutex, driven from real threads: several producers submit and send
 * controls while an "engine" thread takes commands and pushes events and a
 * "loop" thread drains them. Nothing is lost, duplicated or reordered within
 * a producer, the in-flight bound holds, and close wakes every waiter. Also
 * run under ThreadSanitizer in CI (scripts/test.sh).
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "engine/queue.h"
#include "test.h"

#define PRODUCERS 4
#define PER_PRODUCER 2000
#define INFLIGHT 8

static struct queue Q;
static atomic_long submitted, busy, done_events, controls_taken;
static atomic_int engine_quit;

static void *producer(void *arg)
{
    uint64_t p = (uint64_t)(uintptr_t)arg;
    for (uint64_t i = 0; i < PER_PRODUCER;) {
        struct engine_request r;
        memset(&r, 0, sizeof r);
        r.id = p * 1000000 + i;
        r.prompt = malloc(8); /* owned by the queue once submitted */
        int rc = queue_submit(&Q, &r);
        if (rc == -EBUSY) {
            free(r.prompt); /* still ours */
            atomic_fetch_add(&busy, 1);
            continue;
        }
        if (rc < 0)
            abort();
        atomic_fetch_add(&submitted, 1);
        queue_control(&Q, QUEUE_CMD_CANCEL, p * 1000000 + i); /* may block: never lost */
        i++;
    }
    return NULL;
}

static uint64_t last_seen[PRODUCERS];

static void *engine(void *arg)
{
    (void)arg;
    struct queue_cmd cmds[16];
    long want = PRODUCERS * PER_PRODUCER;
    while (atomic_load(&done_events) < want || !atomic_load(&engine_quit)) {
        size_t n = queue_take(&Q, cmds, 16, 10);
        if (n == 0 && queue_closed(&Q))
            break;
        for (size_t i = 0; i < n; i++) {
            if (cmds[i].kind != QUEUE_CMD_SUBMIT) {
                atomic_fetch_add(&controls_taken, 1);
                continue;
            }
            uint64_t p = cmds[i].id / 1000000, k = cmds[i].id % 1000000;
            if (p >= PRODUCERS || (k > 0 && k != last_seen[p] + 1))
                abort(); /* a producer's submits arrive in order, each once */
            last_seen[p] = k;
            engine_request_free(&cmds[i].req);
            struct engine_event ev;
            memset(&ev, 0, sizeof ev);
            ev.id = cmds[i].id;
            ev.kind = ENGINE_EV_DONE;
            while (queue_push_event(&Q, &ev) < 0)
                queue_wait_room(&Q, 1);
            queue_request_done(&Q, 1);
        }
    }
    return NULL;
}

static void *loop(void *arg)
{
    (void)arg;
    struct engine_event ev[32];
    long want = PRODUCERS * PER_PRODUCER;
    while (atomic_load(&done_events) < want) {
        size_t n = queue_drain(&Q, ev, 32);
        for (size_t i = 0; i < n; i++)
            if (ev[i].kind == ENGINE_EV_DONE)
                atomic_fetch_add(&done_events, 1);
    }
    return NULL;
}

TEST(queue_moves_every_command_and_event_between_threads_exactly_once)
{
    ASSERT_OK(queue_init(&Q, INFLIGHT, 64, 16));
    pthread_t prod[PRODUCERS], eng, lp;
    ASSERT_OK(pthread_create(&eng, NULL, engine, NULL));
    ASSERT_OK(pthread_create(&lp, NULL, loop, NULL));
    for (int p = 0; p < PRODUCERS; p++)
        ASSERT_OK(pthread_create(&prod[p], NULL, producer, (void *)(uintptr_t)p));
    for (int p = 0; p < PRODUCERS; p++)
        pthread_join(prod[p], NULL);
    pthread_join(lp, NULL);
    atomic_store(&engine_quit, 1);
    queue_close(&Q);
    pthread_join(eng, NULL);
    ASSERT_EQ(atomic_load(&submitted), PRODUCERS * PER_PRODUCER);
    ASSERT_EQ(atomic_load(&done_events), PRODUCERS * PER_PRODUCER);
    ASSERT(atomic_load(&controls_taken) <= PRODUCERS * PER_PRODUCER);
    for (int p = 0; p < PRODUCERS; p++)
        ASSERT_EQ(last_seen[p], PER_PRODUCER - 1);
    queue_free(&Q);
}

/* A request of n choices takes n places of the bound, and gives them all
 * back when it is done. */
TEST(queue_counts_a_request_of_n_choices_as_n_places)
{
    struct queue q;
    ASSERT_OK(queue_init(&q, 4, 8, 4));
    struct engine_request r;
    memset(&r, 0, sizeof r);
    r.id = 1;
    r.n_choices = 3;
    ASSERT_EQ(queue_places(&r), 3);
    ASSERT_OK(queue_submit(&q, &r));
    memset(&r, 0, sizeof r);
    r.id = 2;
    r.n_choices = 2;
    ASSERT_EQ(queue_submit(&q, &r), -EBUSY); /* 3 + 2 > 4 */
    r.n_choices = 0;                         /* one place */
    ASSERT_EQ(queue_places(&r), 1);
    ASSERT_OK(queue_submit(&q, &r));
    memset(&r, 0, sizeof r);
    r.id = 3;
    ASSERT_EQ(queue_submit(&q, &r), -EBUSY); /* 4 of 4 */
    queue_request_done(&q, 3);
    r.n_choices = 3;
    ASSERT_OK(queue_submit(&q, &r));
    queue_close(&q);
    queue_free(&q);
}

TEST(queue_bounds_requests_in_flight_and_refuses_after_close)
{
    struct queue q;
    ASSERT_OK(queue_init(&q, 2, 8, 4));
    struct engine_request r;
    for (int i = 0; i < 2; i++) {
        memset(&r, 0, sizeof r);
        r.id = (uint64_t)i + 1;
        ASSERT_OK(queue_submit(&q, &r));
    }
    memset(&r, 0, sizeof r);
    r.id = 3;
    ASSERT_EQ(queue_submit(&q, &r), -EBUSY); /* two in flight: the third waits outside */
    struct queue_cmd c[4];
    ASSERT_EQ(queue_take(&q, c, 4, 0), 2);
    ASSERT_EQ(queue_submit(&q, &r), -EBUSY); /* taken is not finished */
    queue_request_done(&q, 1);
    ASSERT_OK(queue_submit(&q, &r));
    queue_close(&q);
    ASSERT(queue_closed(&q));
    memset(&r, 0, sizeof r);
    r.id = 4;
    ASSERT_EQ(queue_submit(&q, &r), -ESHUTDOWN);
    ASSERT_EQ(queue_take(&q, c, 4, -1), 1); /* what was queued is still handed out */
    ASSERT_EQ(queue_take(&q, c, 4, -1), 0); /* then closed: no waiting for ever */
    queue_free(&q);
}

TEST(queue_outbox_is_bounded_and_drains_in_order)
{
    struct queue q;
    ASSERT_OK(queue_init(&q, 4, 8, 3));
    struct engine_event ev;
    memset(&ev, 0, sizeof ev);
    int pushed = 0;
    for (int i = 0; i < 5; i++) {
        ev.id = (uint64_t)i;
        if (queue_push_event(&q, &ev) == 0)
            pushed++;
    }
    ASSERT_EQ(pushed, 3);
    struct engine_event out[8];
    ASSERT_EQ(queue_drain(&q, out, 8), 3);
    for (int i = 0; i < 3; i++)
        ASSERT_EQ(out[i].id, (uint64_t)i);
    ASSERT_EQ(queue_drain(&q, out, 8), 0);
    queue_free(&q);
}

/* ptrq: the session writer's FIFOs. A producer and a consumer thread through
 * a FIFO of 2 (the producer blocks while it is full): every pointer arrives
 * once, in order; results come back through a second FIFO. */
#define JOBS 5000
static struct ptrq JOBQ, DONEQ;
static long job_vals[JOBS];

static void *ptrq_worker(void *arg)
{
    (void)arg;
    long *p;
    while ((p = ptrq_get(&JOBQ, -1))) {
        *p = -*p; /* the worker writes what it was handed */
        if (ptrq_put(&DONEQ, p) < 0)
            return NULL;
    }
    return NULL;
}

TEST(ptrq_moves_every_pointer_in_order_and_close_ends_the_waiter)
{
    ASSERT_OK(ptrq_init(&JOBQ, 2));
    ASSERT_OK(ptrq_init(&DONEQ, 2));
    pthread_t w;
    ASSERT_OK(pthread_create(&w, NULL, ptrq_worker, NULL));
    long next_done = 0;
    for (long i = 0; i < JOBS; i++) {
        job_vals[i] = i + 1;
        /* at most two jobs outstanding, as the engine keeps SESSION_SAVES_MAX */
        while (i - next_done >= 2) {
            long *p = ptrq_get(&DONEQ, -1);
            ASSERT(p == &job_vals[next_done]);
            ASSERT_EQ(*p, -(next_done + 1));
            next_done++;
        }
        ASSERT_OK(ptrq_put(&JOBQ, &job_vals[i]));
    }
    while (next_done < JOBS) {
        long *p = ptrq_get(&DONEQ, -1);
        ASSERT(p == &job_vals[next_done]);
        ASSERT_EQ(*p, -(next_done + 1));
        next_done++;
    }
    ASSERT(ptrq_get(&DONEQ, 0) == NULL);  /* empty: no wait */
    ASSERT(ptrq_get(&DONEQ, 20) == NULL); /* empty: waits 20 ms, then none */
    ptrq_close(&JOBQ);
    pthread_join(w, NULL); /* close wakes the worker blocked in ptrq_get */
    ASSERT_EQ(ptrq_put(&JOBQ, &job_vals[0]), -ESHUTDOWN);
    ptrq_free(&JOBQ);
    ptrq_free(&DONEQ);
}

TEST(queue_poke_ends_one_wait_without_a_command)
{
    struct queue q;
    ASSERT_OK(queue_init(&q, 2, 8, 4));
    struct queue_cmd c[2];
    queue_poke(&q);
    ASSERT_EQ(queue_take(&q, c, 2, -1), 0); /* returns at once: poked */
    ASSERT_EQ(queue_take(&q, c, 2, 30), 0); /* the poke was used up: waits 30 ms */
    queue_free(&q);
}

TEST_MAIN()
