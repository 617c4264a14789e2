/*
 * streams.h: resumable streams. Internal to server/.
 *
 * Every streamed response is a stream: a random id (X-Stream-Id), its
 * events numbered from 1 (each SSE frame carries "id: N"), and a replay
 * buffer (stream_buf.h). The stream, not the connection, owns the request
 * (its srv_req) from submit to the end, so the request can outlive the TCP
 * connection that started it:
 *
 *   attached --connection closes--> detached --GET /v1/streams/{id}--> attached
 *      |                               |      (Last-Event-ID: replay, then live)
 *      | [DONE] delivered               | grace period over: cancelled, freed
 *      v                               v
 *   finished, detached: resumable for the grace period, then freed
 *
 * While detached, generation goes on into the buffer; when the undelivered
 * bytes reach --stream-buffer (or all buffers together --stream-buffer-total)
 * the sequence is paused with engine_pause, the slow-reader mechanism, and
 * nothing is dropped. Delivered events are dropped oldest first to keep a
 * buffer within its bound; a resume from before the oldest kept event is
 * 410. A second client that attaches takes the stream over and the first
 * connection is closed (a client reconnecting over a half-dead TCP
 * connection needs exactly that).
 *
 * Streams are found by engine request id (a hash table, every engine event)
 * and by stream id (a resume). Loop thread only.
 */
#ifndef SS_STREAMS_H
#define SS_STREAMS_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "stream_buf.h"

struct server;
struct srv_req;
struct http_conn;

struct stream {
    char sid[STREAM_ID_LEN + 1];
    uint64_t owner;  /* who may resume it (router's owner_of) */
    uint64_t group;  /* whose detached streams it counts among (--max-detached) */
    uint64_t req_id; /* the engine request */
    struct srv_req *req;
    struct stream_buf buf;
    struct http_conn *conn; /* the attached client, or NULL */
    int started;            /* response headers (with X-Stream-Id) went out */
    int finished;           /* the last event ([DONE]) is in the buffer */
    int engine_paused;      /* engine_pause sent */
    int full;               /* paused because its buffer (or all of them) is full */
    int dead;               /* lost an event (out of memory): not resumable, freed by the sweep */
    int cut;                /* cut at shutdown: ends with the engine's DONE of the cancel */
    /* finished: the connection its last events were queued on, while that
     * connection lives; the grace period runs once they have left it */
    struct http_conn *tail_conn;
    double deadline;      /* detached: dropped at this time (server_now) */
    struct stream *hnext; /* hash chain by req_id */
    struct stream *prev, *next;
};

struct streams {
    struct stream **buckets;    /* [n_buckets] by req_id */
    size_t n_buckets;           /* a power of two */
    struct stream *head, *tail; /* oldest first */
    int64_t count, cap;
    size_t bytes;     /* buffered by all streams */
    size_t max_bytes; /* --stream-buffer: undelivered bytes one stream may hold */
    size_t max_total; /* --stream-buffer-total */
    double grace;     /* --stream-grace seconds; 0: a disconnect cancels at once */
    uv_timer_t timer; /* the grace-period sweep, running while any are detached */
    int timer_on;
    uint64_t resumes;        /* clients attached with GET /v1/streams/{id} */
    uint64_t takeovers;      /* ... of them, to a stream that had a client (closed) */
    uint64_t expired;        /* running streams cancelled at the end of the grace period */
    uint64_t evicted;        /* finished streams dropped early to make room for a new one */
    int64_t max_detached;    /* --max-detached: running detached streams per group (0: any) */
    uint64_t detach_limited; /* ... cancelled, oldest first, over that limit */
};

/* Sets up the registry on s->loop. Returns 0 or a negative errno. */
int streams_init(struct server *s, int64_t cap, size_t max_bytes, size_t max_total, double grace);
/* c is closing: a finished stream whose last events were queued on it keeps
 * them for the grace period from now. */
void streams_conn_closed(struct server *s, struct http_conn *c);
/* Frees every stream (the engine is stopping) and closes the timer. */
void streams_free(struct server *s);

/* A new stream for r (a streamed request on c, not yet submitted), owned by
 * owner and counted in group for --max-detached (the owner, or the client's
 * address on an open server). The stream takes r. Returns NULL (r
 * untouched) if out of memory, out of randomness or full. */
struct stream *streams_create(struct server *s, struct srv_req *r, struct http_conn *c,
                              uint64_t owner, uint64_t group);
struct stream *streams_find_req(const struct streams *ss, uint64_t req_id);
struct stream *streams_find_sid(const struct streams *ss, const char *sid);

/* Appends one JSON chunk as the next event and sends what the client can take. */
void streams_emit_json(struct server *s, struct stream *st, const char *json);
/* Appends [DONE]: the stream is finished (the request is done). */
void streams_emit_done(struct server *s, struct stream *st);
/* Sends undelivered events while the connection takes them; ends the HTTP
 * response once the finished stream is delivered. */
void streams_pump(struct server *s, struct stream *st);
/* The attached connection crossed its write-queue marks. */
void streams_flow(struct server *s, struct stream *st);

/* c closed under the stream: detach it (resumable for the grace period) or,
 * when it cannot be resumed (headers not sent, grace 0, shutting down), drop
 * it. Past --max-detached running detached streams in its group, the one
 * detached longest is cancelled. */
void streams_detach(struct server *s, struct stream *st);
/* Attaches c (a GET /v1/streams/{id}) to st from event last_id on; an
 * attached connection is closed first. Returns 0 (the response is under
 * way), -ERANGE (last_id beyond the newest event) or -ESTALE (events after
 * last_id were dropped); nothing is sent on failure. */
int streams_attach(struct server *s, struct stream *st, struct http_conn *c, uint64_t last_id,
                   const char *headers);
/* Cancels the request (if it runs) and frees the stream. */
void streams_drop(struct server *s, struct stream *st);
/* Shutdown: drops every detached stream. */
void streams_drop_detached(struct server *s);

#endif
