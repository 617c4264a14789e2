/*
 * http_conn.h: one HTTP/1.1 connection on the loop thread. Internal to
 * server/ (and its tests).
 *
 * Life of a connection (RFC 9112): one enum, every transition in set_state()
 * in http_conn.c, which checks it against the table drawn here.
 *
 *            request line, headers, body            on_request
 *   +----> READING -------------------------------> WAITING --hold_stream--> HELD
 *   |        |  (idle until the first byte;            |  respond()            |
 *   |        |   read deadline from it)                |  stream_begin()       | keep-alive tick:
 *   |        | bad request / 408: answer                v                       | stream_begin()
 *   |        +--> WAITING (the error response)      STREAMING <----------------+
 *   |                                                  |  stream_end()
 *   | keep-alive: flushed below low water              v
 *   +---------------------------------------------- DRAINING (response complete)
 *                                                      | the last response (Connection: close,
 *                                                      | HTTP/1.0 stream, upgrade, error,
 *                                                      v shutdown): flushed, FIN sent
 *                                                   LINGERING: discard input until the client's
 *                                                      | FIN or the linger deadline
 *                                                      v
 *   any state ---- http_conn_close() --------------> CLOSING (both handles closing; freed in the
 *   any state ---- a write fails -----> BROKEN ----> last close callback)
 *                                  (closes on the next loop tick)
 *
 * One request at a time: llhttp's on_message_complete pauses the parser, the
 * bytes after it (pipelined requests) stay in the read buffer, and the parser
 * resumes when the response is finished, so responses go out in order.
 *
 * Strict HTTP/1.1 (RFC 9112): llhttp in strict mode frames the message; on
 * top of it only HTTP/1.0 and 1.1 are served (505), an HTTP/1.1 request needs
 * exactly one Host (400), Authorization, X-Session-Id, Last-Event-ID and Host may not repeat
 * (400), header values may not be obs-folded (400), and a request that asks
 * for an Upgrade is answered and the connection closed.
 *
 * Decisions from the headers: ops->on_headers sees the request line and the
 * headers before a single body byte is buffered or `100 Continue` is sent,
 * so a request that will be refused (no API key, no route, wrong method) is
 * refused from its headers. Bodies grow with what arrives (never allocated
 * from Content-Length up front) and every body in flight draws on one
 * server-wide budget as it grows (body_budget; 503 + Retry-After beyond it).
 * GET, HEAD and DELETE bodies are read and counted, never kept.
 *
 * Limits: request line + headers over max_header_bytes -> 431 (URL alone over
 * HTTP_URL_MAX -> 414), body over max_body -> 413, a request not complete
 * within read_timeout of its first byte -> 408 (slowloris), idle between
 * requests past keepalive_timeout -> closed. After an error response the
 * connection lingers: it half-closes, reads and discards what the client is
 * still sending (so the client reads the error instead of a reset), then
 * closes.
 *
 * Writes: one uv_write per call with the bytes inline, freed in on_write.
 * Backpressure: when libuv's write queue goes above high_water, ops->on_pause
 * runs (the server pauses the engine sequence) and the write-stall timer
 * starts; when it falls below low_water, ops->on_resume runs. A client that
 * reads nothing for write_stall_timeout is closed, and so is one that keeps
 * bytes waiting (queued, or unsent in the kernel) for a whole
 * write_stall_timeout while reading them slower than min_read_rate (a slow
 * reader holds its KV slot hostage otherwise).
 *
 * End of input: the client's FIN ends the connection; a request still being
 * answered is abandoned (its work cancelled, as nginx treats a client that
 * closes early), a response already complete is flushed first.
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
#define HTTP_LAST_ID_MAX 64
#define HTTP_RBUF_SIZE 16384 /* read buffer: pipelined bytes wait here */

enum http_conn_state {
    HTTP_CONN_READING = 0, /* a request may arrive: idle, or its line, headers and body arriving */
    HTTP_CONN_WAITING,     /* request complete and with ops->on_request; no response bytes yet */
    HTTP_CONN_HELD,        /* WAITING, with a stream coming: SSE keep-alive ticks may commit it */
    HTTP_CONN_STREAMING,   /* response headers sent; body going out in pieces */
    HTTP_CONN_DRAINING,    /* response complete; flushing before the next request or close */
    HTTP_CONN_LINGERING,   /* last response flushed, FIN sent: discarding input until the FIN */
    HTTP_CONN_BROKEN,      /* a write failed inside an application call: closing on the next tick */
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
    double min_read_rate;            /* bytes/s a backlogged client must read; 0 off */
    int sndbuf;                      /* SO_SNDBUF for accepted sockets; 0: kernel autotuning */
    const char *extra_headers;       /* sent with every response, each line ending \r\n */
    size_t max_body_total;           /* body bytes all connections may hold at once */
    size_t *body_budget;             /* bytes held now (shared by every connection) */
};

struct http_conn;

/* A refusal decided from the headers (ops->on_headers). */
struct http_reject {
    int status;
    char code[48];
    char message[256];
    char extra_headers[128]; /* e.g. "Allow: GET\r\n" or "" */
};

/* Hooks into the application. All run on the loop thread. */
struct http_conn_ops {
    /* Optional: the request line and headers are in c->req (no body yet).
     * Return 0 to read the request, or fill *rej and return its status to
     * refuse it now: nothing of the body is kept and no 100 Continue goes out. */
    int (*on_headers)(struct http_conn *c, struct http_reject *rej, void *arg);
    /* A complete request is in c->req. Answer with http_conn_respond*, or
     * http_conn_stream_begin + writes + http_conn_stream_end, now or later. */
    void (*on_request)(struct http_conn *c, void *arg);
    /* Optional: a keep-alive tick while HELD (http_conn_hold_stream); the
     * handler commits its stream (http_conn_stream_begin) or does nothing. */
    void (*on_stream_commit)(struct http_conn *c, void *arg);
    /* Optional backpressure hooks (write queue crossed the marks). */
    void (*on_pause)(struct http_conn *c, void *arg);
    void (*on_resume)(struct http_conn *c, void *arg);
    /* Optional: the body of an error response (malloc'd JSON, freed by the
     * connection; NULL: a plain-text body). The transport knows status
     * lines, not the API's error schema. */
    char *(*error_body)(int status, const char *param, const char *code, const char *message,
                        void *arg);
    /* Optional: the connection answered a request with an error of its own
     * (bad framing, a limit, the read timeout, no room for the body), not
     * one that ops->on_headers or http_conn_refuse chose; it closes after. */
    void (*on_refused)(struct http_conn *c, int status, void *arg);
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
    char authorization[HTTP_AUTH_MAX]; /* "" when longer than HTTP_AUTH_MAX - 1: no key */
    int authorization_long;            /* ... it was */
    char session_id[HTTP_SESSION_MAX];
    char last_event_id[HTTP_LAST_ID_MAX]; /* the Last-Event-ID header (SSE resume) */
    int has_last_event_id;                /* ... was sent (it may be empty) */
    int last_event_id_long;               /* ... longer than HTTP_LAST_ID_MAX - 1 */
    int expect_continue;
    int n_host; /* Host header lines seen */
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
    size_t header_bytes;    /* request line + headers so far */
    int err_status;         /* 400/413/414/431/503 chosen by a parser callback */
    int err_told;           /* ... by ops->on_headers, which counted it itself */
    struct http_reject rej; /* err_status's message when a hook or a header check chose it */
    unsigned seen;          /* singleton headers seen in this request (bit per HDR_*) */
    size_t body_reserved;   /* bytes of *lim->body_budget this request holds */
    size_t body_want;       /* Content-Length + 1, or 0 (chunked) */
    int body_discard;       /* a GET, HEAD or DELETE: its body is read, counted, not kept */
    size_t body_dropped;    /* ... the bytes of it so far (req.body_len stays 0) */
    int in_trailers;        /* the headers are complete: fields now are a chunked trailer */
    char field[HTTP_FIELD_MAX];
    size_t field_len;
    int field_which; /* which header the current value belongs to */
    int value_overflow;
    char expect[16]; /* the Expect value so far (only 100-continue is acted on) */
    size_t expect_len;
    char te[16]; /* the Transfer-Encoding value so far, blanks left out */
    size_t te_len;
    int te_other; /* a coding other than chunked was named (501) */
    char ce[16];  /* the Content-Encoding coding so far, blanks left out */
    size_t ce_len;
    int ce_other;           /* a content coding other than identity was named (415) */
    size_t head_raw;        /* bytes of execute calls that ended inside the head */
    size_t chunk_ext_bytes; /* chunk extension names and values so far */
    uint64_t exec_seq;      /* llhttp_execute calls so far */
    const char *exec_start; /* the input of the current call: [exec_start, exec_end) */
    const char *exec_end;
    char exec_tail;      /* the last byte other than SP and HT that earlier calls consumed */
    int line_state;      /* what earlier calls consumed since their last LF: LINE_* */
    int last_line_blank; /* the line their last LF ended held only blanks (SP, HT, CR) */
    const char *val_end; /* end of the current header value's last span, or NULL */
    uint64_t val_seq;    /* ... the call it came from, and that call's input end */
    const char *val_exec_end;

    char rbuf[HTTP_RBUF_SIZE];
    size_t rpos, rlen; /* unparsed bytes are rbuf[rpos..rlen) */

    /* Flags beside the state, each for something the state does not say:
     *  request_begun  READING only: the first byte of a request has arrived
     *                 (the read deadline runs, not the keep-alive one). Idle
     *                 and mid-request are both READING because the server's
     *                 connection reclaim looks at them together.
     *  read_stopped   reading paused because the read buffer is full of
     *                 pipelined bytes: flow control of the read half, in any
     *                 state that reads.
     *  in_parse       conn_parse is on the stack (a handler answered at once):
     *                 a re-entrancy guard, not a stage of the connection.
     *  chunked        the framing of the current response (Transfer-Encoding:
     *                 chunked or raw until close), chosen at stream_begin.
     *  close_after    the persistence decision (RFC 9112 9.3) that this
     *                 response is the last, made whenever it becomes known:
     *                 from the request (Connection: close, HTTP/1.0 stream,
     *                 upgrade), an error, or its own Connection header; read
     *                 when the response ends.
     *  keep_alive_sent the current response's Connection header said
     *                 keep-alive.
     *  shutting       the server is shutting down: every response from now on
     *                 says Connection: close, and one that already said
     *                 keep-alive is the last unless a request was pipelined
     *                 behind it, which is then read and answered (it was sent
     *                 on the promise of that header).
     *  paused         the write queue went above high water and ops->on_pause
     *                 ran: backpressure on the write half, independent of
     *                 which request or response is in progress.
     *  peer_eof       the client's FIN arrived while a complete response was
     *                 still flushing (the read half is done): close after the
     *                 flush instead of lingering.
     *  stalled, slow  why the connection was closed (write-stall timeout,
     *                 below min_read_rate), set just before http_conn_close
     *                 for the server's metrics. */
    int request_begun;
    int read_stopped;
    int in_parse;
    int chunked;
    int close_after;
    int keep_alive_sent;
    int shutting;
    int paused;
    int peer_eof;
    int stalled;
    int slow;

    int n_handles_open;
    int status;                     /* status of the current response, once sent */
    uint64_t idle_since;            /* loop time (ms) the connection became idle */
    uint64_t linger_until;          /* loop time (ms) lingering ends at the latest */
    uint64_t bytes_queued;          /* bytes handed to uv_write */
    uint64_t rate_t0, rate_b0;      /* backlog window: start (ms, 0 none), bytes sent on then */
    size_t drain_mark;              /* DRAINING: bytes queued when its stall timer was armed */
    uint64_t taken_mark;            /* DRAINING: bytes the client had taken when last seen ... */
    uint64_t taken_at;              /* ... to take more (loop time, ms) */
    enum http_conn_state closed_in; /* the state a close began in (before BROKEN, if it broke) */

    /* application state */
    uint64_t user_id;
    void *user;
    void *user_tail; /* a response that ended but may still be queued here (the server's streams) */
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
/* An error response: the body comes from ops->error_body (the server's is
 * OpenAI's {"error":{"message","type","param","code"}}). */
int http_conn_respond_error(struct http_conn *c, int status, const char *param, const char *code,
                            const char *extra_headers, const char *message);

/* Streaming: headers now (chunked on HTTP/1.1), then one write per piece. */
int http_conn_stream_begin(struct http_conn *c, int status, const char *content_type,
                           const char *extra_headers);
int http_conn_stream_write(struct http_conn *c, const char *data, size_t len);
/* The last piece was written: finishes the request. */
int http_conn_stream_end(struct http_conn *c);

/* While WAITING: a stream response is coming (HELD), so SSE keep-alive ticks
 * may commit it early through ops->on_stream_commit. */
void http_conn_hold_stream(struct http_conn *c);

/* Idempotent: unregisters via ops->on_close, closes both handles; memory is
 * released in the last close callback. */
void http_conn_close(struct http_conn *c);
/* Finish the response in progress (if any), then close: for shutdown. An
 * idle connection is closed once its last response has left the write
 * queue (at once if it has); a request still arriving is read and
 * answered with Connection: close, and so is one pipelined behind a
 * response that said keep-alive. */
void http_conn_finish_and_close(struct http_conn *c);
/* 1 while a request is arriving (its first byte is in, the last is not). */
int http_conn_receiving(const struct http_conn *c);
/* Answers a request still arriving with rej, and closes after it. */
void http_conn_refuse(struct http_conn *c, const struct http_reject *rej);

/* The application has taken what it needs from the request body: it is
 * freed and its bytes go back to the body budget now, not when the response
 * is finished. */
void http_conn_release_body(struct http_conn *c);
/* Bytes waiting in libuv's write queue. */
size_t http_conn_write_queue(const struct http_conn *c);
/* 1 if the client has sent bytes of a next request that wait unparsed
 * behind the current response. */
int http_conn_pipelined(const struct http_conn *c);
/* A complete response is still queued and the client has taken no byte of
 * it (the kernel sent none on) for this many milliseconds; 0 when it is
 * taking bytes or none are queued. Counted from the moment the response was
 * complete, or from the last call that saw the client take bytes. */
uint64_t http_conn_untaken_ms(struct http_conn *c);
/* 1 between requests (nothing of the next one has arrived). */
int http_conn_idle(const struct http_conn *c);
const char *http_conn_state_name(enum http_conn_state s);
/* The reason phrase of an HTTP status ("Not Found"). */
const char *http_status_text(int status);

#endif
