/*
 * http_conn.h: one HTTP/1.1 connection on the loop thread. Internal to
 * server/ (and its tests).
 *
 * Life of a connection (one enum, every transition in set_state()):
 *
 *   READING ---request parsed---> WAITING ---stream_begin---> STREAMING
 *      ^                            |  respond()                  | stream_end()
 *      |                            v                             v
 *      +------ keep-alive, write queue below the low-water mark -- DRAINING
 *                                                                  | Connection: close,
 *   any state --- http_conn_close() ---> CLOSING (both handles     | error, timeout
 *                                        closing; freed in the     v
 *                                        last close callback)   CLOSING
 *
 * One request at a time: llhttp's on_message_complete pauses the parser, the
 * bytes after it (pipelined requests) stay in the read buffer, and the parser
 * resumes when the response is finished, so responses go out in order.
 *
 * Limits: request line + headers over max_header_bytes -> 431 (URL alone over
 * HTTP_URL_MAX -> 414), body over max_body -> 413, a request not complete
 * within read_timeout of its first byte -> 408 (slowloris), idle between
 * requests past keepalive_timeout -> closed.
 *
 * Writes: one uv_write per call with the bytes inline, freed in on_write.
 * Backpressure: when libuv's write queue goes above high_water, ops->on_pause
 * runs (the server pauses the engine sequence) and the write-stall timer
 * starts; when it falls below low_water, ops->on_resume runs. A client that
 * reads nothing for write_stall_timeout is closed.
 */
#ifndef SS_HTTP_CONN_H
#define SS_HTTP_CONN_H

#include <llhttp.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#define HTTP_URL_MAX 2048
#define HTTP_AUTH_MAX 512
#define HTTP_SESSION_MAX 160
#define HTTP_FIELD_MAX 64
#define HTTP_RBUF_SIZE 16384 /* read buffer: pipelined bytes wait here */

enum http_conn_state {
    HTTP_CONN_READING = 0, /* reading a request (or idle between requests) */
    HTTP_CONN_WAITING,     /* request handed to ops->on_request; no response bytes yet */
    HTTP_CONN_STREAMING,   /* response headers sent; body going out in pieces */
    HTTP_CONN_DRAINING,    /* response complete; flushing before the next request or close */
    HTTP_CONN_CLOSING,     /* uv_close called on both handles; waiting for the callbacks */
};

struct http_limits {
    size_t max_header_bytes;         /* request line + headers (431) */
    size_t max_body;                 /* request body (413) */
    size_t high_water;               /* write queue bytes that pause the producer */
    size_t low_water;                /* write queue bytes that resume it */
    uint64_t read_timeout_ms;        /* a started request must be complete by then (408) */
    uint64_t keepalive_timeout_ms;   /* idle between requests */
    uint64_t write_stall_timeout_ms; /* paused without progress: close */
    uint64_t sse_keepalive_ms;       /* ': keep-alive' comment interval while streaming; 0 off */
    int sndbuf;                      /* SO_SNDBUF for accepted sockets; 0: kernel autotuning */
    const char *extra_headers;       /* sent with every response, each line ending \r\n */
};

struct http_conn;

/* Hooks into the application. All run on the loop thread. */
struct http_conn_ops {
    /* A complete request is in c->req. Answer with http_conn_respond*, or
     * http_conn_stream_begin + writes + http_conn_stream_end, now or later. */
    void (*on_request)(struct http_conn *c, void *arg);
    /* Optional: a keep-alive tick while WAITING with c->stream_held set; the
     * handler commits its stream (http_conn_stream_begin) or does nothing. */
    void (*on_stream_commit)(struct http_conn *c, void *arg);
    /* Optional backpressure hooks (write queue crossed the marks). */
    void (*on_pause)(struct http_conn *c, void *arg);
    void (*on_resume)(struct http_conn *c, void *arg);
    /* The connection is closing (called once, from http_conn_close): forget
     * it, cancel its work. Memory stays valid until on_free. */
    void (*on_close)(struct http_conn *c, void *arg);
    /* Optional: both handles are closed; c is freed right after. */
    void (*on_free)(struct http_conn *c, void *arg);
    void *arg;
};

struct http_request {
    int method; /* llhttp_method_t */
    int http_major, http_minor;
    int keep_alive; /* llhttp_should_keep_alive() */
    char url[HTTP_URL_MAX];
    size_t url_len;
    char authorization[HTTP_AUTH_MAX];
    char session_id[HTTP_SESSION_MAX];
    int expect_continue;
    char *body; /* malloc'd, NUL-terminated; freed when the response is finished */
    size_t body_len, body_cap;
};

struct http_conn {
    uv_tcp_t tcp;
    uv_timer_t timer; /* read deadline / keep-alive idle / write stall / SSE keep-alive */
    uv_shutdown_t shutdown_req;
    llhttp_t parser;
    enum http_conn_state state;
    const struct http_limits *lim;
    const struct http_conn_ops *ops;

    struct http_request req;
    int msg_begun;       /* bytes of the current request have arrived */
    size_t header_bytes; /* request line + headers so far */
    int err_status;      /* 413/414/431 chosen by a parser callback */
    char field[HTTP_FIELD_MAX];
    size_t field_len;
    int field_which; /* which header the current value belongs to */
    int value_overflow;

    char rbuf[HTTP_RBUF_SIZE];
    size_t rpos, rlen; /* unparsed bytes are rbuf[rpos..rlen) */
    int read_stopped;
    int in_parse;

    int chunked;      /* the response body uses chunked transfer coding */
    int close_after;  /* close once the current response is flushed */
    int no_keepalive; /* the application asked: finish the current response, then close */
    int paused;       /* write queue above high water; ops->on_pause ran */
    int stream_held;  /* a stream is coming: keep-alive ticks call on_stream_commit */
    int shutdown_sent;
    int broken; /* a write failed: closing on the next loop tick */
    int n_handles_open;
    int status;                     /* status of the current response, once sent */
    int stalled;                    /* closed by the write-stall timeout */
    enum http_conn_state closed_in; /* the state http_conn_close was called in */

    /* application state */
    uint64_t user_id;
    void *user;
};

/* Accepts a connection from server into a new http_conn and starts reading.
 * lim and ops must outlive the connection. Returns 0, or a negative errno
 * (nothing is left to free). */
int http_conn_accept(uv_stream_t *server, const struct http_limits *lim,
                     const struct http_conn_ops *ops, struct http_conn **out);

/* A whole response. content_type may be NULL (no body type); extra_headers
 * (lines ending \r\n) may be NULL. Finishes the request. */
int http_conn_respond(struct http_conn *c, int status, const char *content_type,
                      const char *extra_headers, const char *body, size_t len);
/* An OpenAI-shaped JSON error: {"error":{"message","type","param","code"}}. */
int http_conn_respond_error(struct http_conn *c, int status, const char *param, const char *code,
                            const char *extra_headers, const char *message);

/* Streaming: headers now (chunked on HTTP/1.1), then one write per piece. */
int http_conn_stream_begin(struct http_conn *c, int status, const char *content_type,
                           const char *extra_headers);
int http_conn_stream_write(struct http_conn *c, const char *data, size_t len);
/* The last piece was written: finishes the request. */
int http_conn_stream_end(struct http_conn *c);

/* While WAITING: a stream response is coming, so SSE keep-alive ticks may
 * commit it early through ops->on_stream_commit. */
void http_conn_hold_stream(struct http_conn *c);

/* Idempotent: unregisters via ops->on_close, closes both handles; memory is
 * released in the last close callback. */
void http_conn_close(struct http_conn *c);
/* Finish the response in progress (if any), then close: for shutdown. An
 * idle connection is closed at once. */
void http_conn_finish_and_close(struct http_conn *c);

/* Bytes waiting in libuv's write queue. */
size_t http_conn_write_queue(const struct http_conn *c);
/* 1 between requests (nothing of the next one has arrived). */
int http_conn_idle(const struct http_conn *c);
const char *http_conn_state_name(enum http_conn_state s);

#endif
