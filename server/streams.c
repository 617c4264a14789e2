/*
 * streams.c: the registry of resumable streams and their life (streams.h).
 *
 * Invariants:
 *   - a stream's undelivered events are never dropped; its engine sequence is
 *     paused while its client is backlogged (the connection's high-water
 *     mark) or, detached, while its buffer or all buffers are full;
 *   - the events a connection is sent are the buffer's events in order, each
 *     once per attachment: the cursor moves only after a write was queued;
 *   - a stream's request is counted in s->inflight until its last event is
 *     buffered or it is dropped, whichever comes first, exactly once.
 */
#include "streams.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "log.h"
#include "router.h"
#include "sse.h"

static void on_sweep(uv_timer_t *t);

static int random_bytes(unsigned char *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = getrandom(buf + got, n - got, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -errno;
        got += (size_t)r;
    }
    return 0;
}

static size_t bucket_of(const struct streams *ss, uint64_t req_id)
{
    uint64_t h = req_id * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 32) & (ss->n_buckets - 1);
}

int streams_init(struct server *s, int64_t cap, size_t max_bytes, size_t max_total, double grace)
{
    struct streams *ss = &s->streams;
    memset(ss, 0, sizeof *ss);
    ss->cap = cap;
    ss->max_bytes = max_bytes;
    ss->max_total = max_total;
    ss->grace = grace;
    ss->n_buckets = 16;
    while ((int64_t)ss->n_buckets < 2 * cap)
        ss->n_buckets *= 2;
    ss->buckets = calloc(ss->n_buckets, sizeof *ss->buckets);
    if (!ss->buckets)
        return -ENOMEM;
    uv_timer_init(s->loop, &ss->timer);
    ss->timer.data = s;
    return 0;
}

void streams_free(struct server *s)
{
    struct streams *ss = &s->streams;
    while (ss->head)
        streams_drop(s, ss->head);
    uv_timer_stop(&ss->timer);
    uv_close((uv_handle_t *)&ss->timer, NULL);
}

struct stream *streams_find_req(const struct streams *ss, uint64_t req_id)
{
    if (!ss->buckets)
        return NULL;
    for (struct stream *st = ss->buckets[bucket_of(ss, req_id)]; st; st = st->hnext)
        if (st->req_id == req_id)
            return st;
    return NULL;
}

struct stream *streams_find_sid(const struct streams *ss, const char *sid)
{
    /* every id is compared in full, in constant time: the position of a
     * match or of a near miss does not show in the time taken */
    struct stream *found = NULL;
    for (struct stream *st = ss->head; st; st = st->next) {
        int same = stream_id_equal(st->sid, sid);
        if (same && !found && !st->dead)
            found = st;
    }
    return found;
}

static void unlink_stream(struct streams *ss, struct stream *st)
{
    struct stream **p = &ss->buckets[bucket_of(ss, st->req_id)];
    while (*p && *p != st)
        p = &(*p)->hnext;
    if (*p)
        *p = st->hnext;
    if (st->prev)
        st->prev->next = st->next;
    else
        ss->head = st->next;
    if (st->next)
        st->next->prev = st->prev;
    else
        ss->tail = st->prev;
    ss->count--;
}

/* st's tail is no longer bound to a connection's queue. */
static void untail(struct stream *st)
{
    if (st->tail_conn) {
        st->tail_conn->user_tail = NULL;
        st->tail_conn = NULL;
    }
}

void streams_drop(struct server *s, struct stream *st)
{
    struct streams *ss = &s->streams;
    if (!st->finished) {
        st->finished = 1;
        if (s->engine)
            engine_cancel(s->engine, st->req_id); /* its KV slot is freed within one step */
        server_request_done(s);
    }
    if (st->conn && st->conn->user == st->req)
        st->conn->user = NULL;
    untail(st);
    unlink_stream(ss, st);
    ss->bytes -= st->buf.bytes;
    stream_buf_free(&st->buf);
    router_req_free(st->req);
    free(st);
}

/* At the cap: the oldest finished stream without a client makes room. */
static int evict_one(struct server *s)
{
    for (struct stream *st = s->streams.head; st; st = st->next) {
        if (st->finished && !st->conn) {
            s->streams.evicted++;
            streams_drop(s, st);
            return 1;
        }
    }
    return 0;
}

struct stream *streams_create(struct server *s, struct srv_req *r, struct http_conn *c,
                              uint64_t owner, uint64_t group)
{
    struct streams *ss = &s->streams;
    unsigned char rnd[16];
    if (ss->count >= ss->cap && !evict_one(s))
        return NULL;
    struct stream *st = calloc(1, sizeof *st);
    if (!st)
        return NULL;
    if (random_bytes(rnd, sizeof rnd) < 0) {
        log_msg(LOG_ERROR, "getrandom failed: no stream id");
        free(st);
        return NULL;
    }
    stream_id_format(st->sid, rnd);
    st->owner = owner;
    st->group = group;
    st->req_id = r->id;
    st->req = r;
    st->conn = c;
    stream_buf_init(&st->buf);
    r->st = st;
    size_t b = bucket_of(ss, st->req_id);
    st->hnext = ss->buckets[b];
    ss->buckets[b] = st;
    st->prev = ss->tail;
    if (ss->tail)
        ss->tail->next = st;
    else
        ss->head = st;
    ss->tail = st;
    ss->count++;
    return st;
}

/* ---- memory bounds ---------------------------------------------------------------- */

/* Drops delivered events of st beyond its own bound and, while all buffers
 * together are over theirs, as many as it takes. */
static void trim(struct streams *ss, struct stream *st)
{
    size_t keep = ss->max_bytes;
    if (ss->bytes > ss->max_total) {
        size_t over = ss->bytes - ss->max_total;
        size_t room = st->buf.bytes > over ? st->buf.bytes - over : 0;
        if (room < keep)
            keep = room;
    }
    ss->bytes -= stream_buf_trim(&st->buf, keep);
}

/* A stream with no client: its delivered events beyond half of
 * --stream-buffer go, oldest first, so that it can generate at least the
 * other half ahead and pause (streams_flow) with the whole buffer within
 * the bound. The newest delivered ones stay: its client may have lost them
 * in the connection that broke, and resumes from the last one it got. */
static void trim_detached(struct streams *ss, struct stream *st)
{
    ss->bytes -= stream_buf_trim(&st->buf, st->buf.unsent_bytes + ss->max_bytes / 2);
}

/* All buffers together are over --stream-buffer-total: delivered events
 * go, oldest streams first. */
static void make_room(struct streams *ss)
{
    for (struct stream *st = ss->head; st && ss->bytes > ss->max_total; st = st->next)
        trim(ss, st);
}

void streams_flow(struct server *s, struct stream *st)
{
    struct streams *ss = &s->streams;
    if (ss->bytes >= ss->max_total)
        make_room(ss);
    int full = !st->conn && (st->buf.bytes >= ss->max_bytes || ss->bytes >= ss->max_total);
    int want = st->finished ? 0 : st->conn ? st->conn->paused : full;
    st->full = full && !st->finished;
    if (want == st->engine_paused || st->finished)
        return;
    st->engine_paused = want;
    if (!s->engine)
        return;
    if (want)
        engine_pause(s->engine, st->req_id);
    else
        engine_resume(s->engine, st->req_id);
}

/* ---- events out ---------------------------------------------------------------------- */

static void start_sweep(struct server *s)
{
    struct streams *ss = &s->streams;
    if (ss->timer_on)
        return;
    double every = ss->grace / 4;
    every = every < 0.05 ? 0.05 : every > 1.0 ? 1.0 : every;
    uint64_t ms = (uint64_t)(every * 1e3);
    uv_timer_start(&ss->timer, on_sweep, ms, ms);
    ss->timer_on = 1;
}

void streams_pump(struct server *s, struct stream *st)
{
    struct http_conn *c = st->conn;
    if (!c || !st->started) {
        trim_detached(&s->streams, st);
        streams_flow(s, st); /* detached: generation goes on until the buffer is full */
        return;
    }
    const struct stream_event *e;
    while (!c->paused && (e = stream_buf_next(&st->buf)) != NULL) {
        if (http_conn_stream_write(c, e->data, e->len) < 0)
            break; /* the connection is closing: the event stays for a resume */
        stream_buf_advance(&st->buf);
    }
    trim(&s->streams, st);
    if (st->finished && !stream_buf_next(&st->buf)) {
        /* all delivered: the response ends, the tail stays for the grace period */
        c->user = NULL;
        st->conn = NULL;
        st->deadline = server_now() + s->streams.grace;
        if (s->streams.grace > 0 && !s->draining && !s->stopped) {
            /* the events are queued, not delivered: while they wait in c's
             * queue (a client that stopped reading) the grace does not run */
            if (c->user_tail)
                untail(c->user_tail); /* an earlier stream's tail, gone before this one */
            c->user_tail = st;
            st->tail_conn = c;
            start_sweep(s);
        } else {
            streams_drop(s, st);
        }
        /* last: ending the response may run the connection's next pipelined
         * request (a resume of this very stream, a request that evicts it),
         * so st must not be touched after this */
        http_conn_stream_end(c);
        return;
    }
    streams_flow(s, st);
}

/* Out of memory for an event: the stream has lost an event, so it ends: its
 * request is cancelled, its client (if any) disconnected, and it is no
 * longer resumable (a resume would replay a stream with a hole and no
 * [DONE]). It is not freed here: whoever emitted into it (the router, which
 * may go on with the next chunk of the same engine event) still holds it;
 * the sweep frees it. */
static void out_of_memory(struct server *s, struct stream *st)
{
    log_msg(LOG_ERROR, "out of memory buffering a stream: cancelling it");
    if (!st->finished) {
        st->finished = 1;
        if (s->engine)
            engine_cancel(s->engine, st->req_id);
        server_request_done(s);
    }
    st->dead = 1;
    st->full = 0;
    st->deadline = 0; /* the next sweep frees it */
    struct http_conn *c = st->conn;
    if (c) {
        st->conn = NULL;
        if (c->user == st->req)
            c->user = NULL; /* closing c must not detach or drop st */
        http_conn_close(c);
    }
    start_sweep(s);
}

/* Appends a framed event. Returns 0, or -ENOMEM (st is then dead, not freed). */
static int push(struct server *s, struct stream *st, const char *frame, size_t len)
{
    size_t before = st->buf.bytes;
    if (stream_buf_push(&st->buf, frame, len) == 0) {
        out_of_memory(s, st);
        return -ENOMEM;
    }
    s->streams.bytes += st->buf.bytes - before;
    return 0;
}

void streams_emit_json(struct server *s, struct stream *st, const char *json)
{
    if (st->finished)
        return;
    char small[2048];
    size_t len = strlen(json);
    size_t need = sse_frame_data(small, sizeof small, json, len);
    int rc;
    if (need <= sizeof small) {
        rc = push(s, st, small, need);
    } else {
        char *big = malloc(need);
        if (!big) {
            out_of_memory(s, st);
            return;
        }
        sse_frame_data(big, need, json, len);
        rc = push(s, st, big, need);
        free(big);
    }
    if (rc == 0)
        streams_pump(s, st);
}

void streams_emit_done(struct server *s, struct stream *st)
{
    if (st->finished)
        return;
    char buf[32];
    size_t n = sse_frame_done(buf, sizeof buf);
    if (push(s, st, buf, n) < 0)
        return;
    st->finished = 1;
    st->full = 0;
    server_request_done(s);
    streams_pump(s, st);
}

/* ---- attach and detach ------------------------------------------------------------------ */

/* A running stream with no client: it holds a KV slot nobody reads. */
static int running_detached(const struct stream *st)
{
    return !st->conn && !st->finished && !st->dead;
}

/* st just detached: while its group has more running detached streams than
 * --max-detached, the one detached longest is cancelled (one client cannot
 * hold every KV slot by starting streams and dropping them). */
static void limit_detached(struct server *s, struct stream *st)
{
    struct streams *ss = &s->streams;
    if (ss->max_detached <= 0)
        return;
    for (;;) {
        int64_t n = 0;
        struct stream *oldest = NULL;
        for (struct stream *o = ss->head; o; o = o->next) {
            if (o->group != st->group || !running_detached(o))
                continue;
            n++;
            if (o != st && (!oldest || o->deadline < oldest->deadline))
                oldest = o;
        }
        if (n <= ss->max_detached || !oldest)
            return;
        ss->detach_limited++;
        log_msg(LOG_INFO,
                "an owner has more than %lld streams without a client; cancelled the one "
                "detached longest",
                (long long)ss->max_detached);
        streams_drop(s, oldest);
    }
}

void streams_detach(struct server *s, struct stream *st)
{
    st->conn = NULL;
    if (!st->started || s->streams.grace <= 0 || s->draining || s->stopped) {
        streams_drop(s, st); /* nobody can resume it */
        return;
    }
    st->deadline = server_now() + s->streams.grace;
    trim_detached(&s->streams, st); /* else one full at the detach pauses with nothing ahead */
    streams_flow(s, st);
    start_sweep(s);
    limit_detached(s, st);
}

int streams_attach(struct server *s, struct stream *st, struct http_conn *c, uint64_t last_id,
                   const char *headers)
{
    int rc = stream_buf_rewind(&st->buf, last_id);
    if (rc < 0)
        return rc;
    struct http_conn *old = st->conn;
    if (old) { /* the new client takes over; the old connection ends */
        old->user = NULL;
        st->conn = NULL;
        s->streams.takeovers++;
        http_conn_close(old);
    }
    rc = http_conn_stream_begin(c, 200, "text/event-stream; charset=utf-8", headers);
    if (rc < 0) { /* c is closing: back to detached */
        streams_detach(s, st);
        return 0;
    }
    untail(st);
    st->conn = c;
    c->user = st->req;
    s->streams.resumes++;
    streams_pump(s, st);
    return 0;
}

void streams_conn_closed(struct server *s, struct http_conn *c)
{
    struct stream *st = c->user_tail;
    if (!st)
        return;
    untail(st);
    double deadline = server_now() + s->streams.grace;
    if (!st->conn && st->deadline < deadline)
        st->deadline = deadline; /* what it had queued may be lost with c */
}

void streams_drop_detached(struct server *s)
{
    struct stream *st = s->streams.head;
    while (st) {
        struct stream *next = st->next;
        if (!st->conn)
            streams_drop(s, st);
        st = next;
    }
}

static void on_sweep(uv_timer_t *t)
{
    struct server *s = t->data;
    struct streams *ss = &s->streams;
    double now = server_now();
    int detached = 0;
    struct stream *st = ss->head;
    while (st) {
        struct stream *next = st->next;
        if (st->tail_conn) {
            if (http_conn_write_queue(st->tail_conn) == 0)
                untail(st); /* its tail has left (what came after it goes later) */
            else if (st->deadline < now + ss->grace)
                st->deadline = now + ss->grace;
        }
        if (!st->conn && now >= st->deadline) {
            if (!st->finished) {
                ss->expired++;
                log_msg(LOG_DEBUG, "stream %s: nobody resumed it within %gs; cancelled", st->sid,
                        ss->grace);
            }
            streams_drop(s, st);
        } else if (!st->conn) {
            detached = 1;
        }
        st = next;
    }
    /* A stream paused because all buffers together were full (a detached
     * one: the sweep runs) goes on once drops made room: nothing else
     * looks at it again until its client comes back. */
    for (st = ss->head; st; st = st->next)
        if (st->full)
            streams_flow(s, st);
    if (!detached) {
        uv_timer_stop(&ss->timer);
        ss->timer_on = 0;
    }
}
