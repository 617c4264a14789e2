/*
 * http_conn.c: one HTTP/1.1 connection (see http_conn.h for its life).
 *
 * Invariants:
 *   - every callback checks c->state first; only set_state() changes it (the
 *     legal moves are one table, next_states), and set_state() arms the one
 *     timer for the new state;
 *   - the struct is freed only in the last of the two close callbacks (TCP
 *     handle and timer), never inside a read or write callback;
 *   - every buffer a client fills is bounded: the URL and the headers we keep
 *     are fixed arrays, the body is at most max_body, pipelined bytes wait in
 *     the fixed read buffer (reading stops while it is full);
 *   - bytes we queue are bounded by the producer pausing at high_water.
 */
#include "http_conn.h"

#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/ioctl.h>
#ifdef __linux__
#include <linux/sockios.h> /* SIOCOUTQNSD */
#endif

#include "engine.h"
#include "log.h"

/* an X-Session-Id clipped to what we keep is still longer than any id */
_Static_assert(HTTP_SESSION_MAX - 1 >= ENGINE_SESSION_ID_MAX, "X-Session-Id kept too short");

#define LINGER_MS 2000      /* after an error response: wait this long between reads */
#define LINGER_MAX_MS 30000 /* ... and this long in all for the client's FIN */
#define BODY_MIN_ALLOC 16384
#define WRITE_PIECE ((size_t)1 << 30) /* bytes per uv_buf_t of one write */
#define WRITE_PIECES 16               /* so one write holds up to 16 GiB */

#define CHUNK_EXT_MAX 16384 /* chunk extension bytes a request may send */

/* note_tail's line_state: the consumed input since its last LF */
enum { LINE_START = 0, LINE_BLANKS, LINE_TEXT };

enum header_which {
    HDR_NONE = 0,
    HDR_AUTH,
    HDR_SESSION,
    HDR_EXPECT,
    HDR_HOST,
    HDR_LAST_ID,
    HDR_TE,
    HDR_CE,
};

static const char *const header_names[] = {
    "",     "Authorization", "X-Session-Id",      "Expect",
    "Host", "Last-Event-ID", "Transfer-Encoding", "Content-Encoding"};

struct wreq {
    uv_write_t w;
    struct http_conn *c;
    char data[]; /* the bytes, inline */
};

static void set_state(struct http_conn *c, enum http_conn_state s);
static void conn_parse(struct http_conn *c);
static void on_timeout(uv_timer_t *t);
static void start_reading(struct http_conn *c);
static int too_slow(struct http_conn *c, size_t queued);
static void close_soon(struct http_conn *c);
static void note_taken(struct http_conn *c);

const char *http_conn_state_name(enum http_conn_state s)
{
    switch (s) {
    case HTTP_CONN_READING:
        return "reading";
    case HTTP_CONN_WAITING:
        return "waiting";
    case HTTP_CONN_HELD:
        return "held";
    case HTTP_CONN_STREAMING:
        return "streaming";
    case HTTP_CONN_DRAINING:
        return "draining";
    case HTTP_CONN_LINGERING:
        return "lingering";
    case HTTP_CONN_BROKEN:
        return "broken";
    case HTTP_CONN_CLOSING:
        return "closing";
    }
    return "?";
}

size_t http_conn_write_queue(const struct http_conn *c)
{
    return uv_stream_get_write_queue_size((const uv_stream_t *)&c->tcp);
}

int http_conn_pipelined(const struct http_conn *c)
{
    return c->rlen > c->rpos;
}

/* Pipelined bytes that begin a request: a parser skips CR and LF before one. */
static int request_pipelined(const struct http_conn *c)
{
    for (size_t i = c->rpos; i < c->rlen; i++)
        if (c->rbuf[i] != '\r' && c->rbuf[i] != '\n')
            return 1;
    return 0;
}

int http_conn_idle(const struct http_conn *c)
{
    return c->state == HTTP_CONN_READING && !c->request_begun;
}

/* A complete request is with the application, no response bytes sent yet. */
static int awaiting_response(const struct http_conn *c)
{
    return c->state == HTTP_CONN_WAITING || c->state == HTTP_CONN_HELD;
}

/* Input that arrives now is discarded: the last response is flushing or
 * flushed, and nothing after it is read as HTTP. */
static int discarding(const struct http_conn *c)
{
    return c->state == HTTP_CONN_LINGERING || (c->state == HTTP_CONN_DRAINING && c->close_after);
}

/* ---- status lines ---------------------------------------------------------------- */

const char *http_status_text(int status)
{
    switch (status) {
    case 100:
        return "Continue";
    case 200:
        return "OK";
    case 201:
        return "Created";
    case 204:
        return "No Content";
    case 400:
        return "Bad Request";
    case 401:
        return "Unauthorized";
    case 403:
        return "Forbidden";
    case 404:
        return "Not Found";
    case 405:
        return "Method Not Allowed";
    case 408:
        return "Request Timeout";
    case 409:
        return "Conflict";
    case 410:
        return "Gone";
    case 411:
        return "Length Required";
    case 413:
        return "Content Too Large";
    case 414:
        return "URI Too Long";
    case 415:
        return "Unsupported Media Type";
    case 422:
        return "Unprocessable Content";
    case 429:
        return "Too Many Requests";
    case 431:
        return "Request Header Fields Too Large";
    case 500:
        return "Internal Server Error";
    case 501:
        return "Not Implemented";
    case 503:
        return "Service Unavailable";
    case 505:
        return "HTTP Version Not Supported";
    default:
        return status < 400 ? "OK" : status < 500 ? "Bad Request" : "Internal Server Error";
    }
}

/* ---- timer ------------------------------------------------------------------ */

static void arm(struct http_conn *c, uint64_t ms, uint64_t repeat)
{
    if (c->state == HTTP_CONN_BROKEN)
        return; /* a close is already due on the next tick */
    uv_timer_stop(&c->timer);
    if (ms > 0)
        uv_timer_start(&c->timer, on_timeout, ms, repeat);
}

/* The one place that knows which deadline applies in which state. */
static void arm_for_state(struct http_conn *c)
{
    const struct http_limits *l = c->lim;
    switch (c->state) {
    case HTTP_CONN_READING:
        arm(c, c->request_begun ? l->read_timeout_ms : l->keepalive_timeout_ms, 0);
        break;
    case HTTP_CONN_WAITING:
        arm(c, 0, 0); /* the application answers when it can */
        break;
    case HTTP_CONN_HELD:
        arm(c, l->sse_keepalive_ms, l->sse_keepalive_ms);
        break;
    case HTTP_CONN_STREAMING:
        if (c->paused)
            arm(c, l->write_stall_timeout_ms, 0);
        else
            arm(c, l->sse_keepalive_ms, l->sse_keepalive_ms);
        break;
    case HTTP_CONN_DRAINING:
        c->drain_mark = http_conn_write_queue(c);
        note_taken(c); /* entered with a complete response, or re-armed on progress */
        arm(c, l->write_stall_timeout_ms, 0);
        break;
    case HTTP_CONN_LINGERING:
        arm(c, LINGER_MS, 0);
        break;
    case HTTP_CONN_BROKEN: /* close_soon armed the zero timeout */
        break;
    case HTTP_CONN_CLOSING:
        uv_timer_stop(&c->timer);
        break;
    }
}

#define TO(s) (1u << (s))
/* The connection's life, as RFC 9112 tells it: a request arrives (READING),
 * is answered whole or streamed, and once the response is complete the
 * connection either persists (keep-alive: the next request) or ends (the
 * last response: FIN, then lingering close). Errors found while reading are
 * answered like any response (READING -> WAITING). BROKEN and CLOSING are
 * entered from anywhere (close_soon, http_conn_close) and left only for
 * CLOSING. */
static const unsigned next_states[] = {
    [HTTP_CONN_READING] = TO(HTTP_CONN_WAITING),
    [HTTP_CONN_WAITING] = TO(HTTP_CONN_HELD) | TO(HTTP_CONN_STREAMING) | TO(HTTP_CONN_DRAINING),
    [HTTP_CONN_HELD] = TO(HTTP_CONN_STREAMING) | TO(HTTP_CONN_DRAINING),
    [HTTP_CONN_STREAMING] = TO(HTTP_CONN_DRAINING),
    [HTTP_CONN_DRAINING] = TO(HTTP_CONN_READING) | TO(HTTP_CONN_LINGERING),
    [HTTP_CONN_LINGERING] = 0,
    [HTTP_CONN_BROKEN] = 0,
    [HTTP_CONN_CLOSING] = 0,
};

/* The one place the state changes (besides entering BROKEN and CLOSING). */
static void set_state(struct http_conn *c, enum http_conn_state s)
{
    if (c->state == HTTP_CONN_CLOSING || c->state == HTTP_CONN_BROKEN)
        return; /* a close is under way: final */
    assert(next_states[c->state] & TO(s));
    c->state = s;
    if (s == HTTP_CONN_READING)
        c->idle_since = uv_now(c->tcp.loop);
    arm_for_state(c);
}

/* ---- the body budget ------------------------------------------------------------ */

static void body_release(struct http_conn *c)
{
    /* without a bound (max_body_total 0) body_reserve counted nothing in it */
    if (c->body_reserved && c->lim->body_budget && c->lim->max_body_total)
        *c->lim->body_budget -= c->body_reserved;
    c->body_reserved = 0;
}

/* Takes n more bytes of the server-wide body budget. 0, or -1 if it is spent. */
static int body_reserve(struct http_conn *c, size_t n)
{
    size_t *b = c->lim->body_budget;
    if (!b || c->lim->max_body_total == 0) {
        c->body_reserved += n;
        return 0;
    }
    if (*b + n > c->lim->max_body_total)
        return -1;
    *b += n;
    c->body_reserved += n;
    return 0;
}

void http_conn_release_body(struct http_conn *c)
{
    free(c->req.body);
    c->req.body = NULL;
    c->req.body_len = c->req.body_cap = 0;
    body_release(c);
}

/* ---- close -------------------------------------------------------------------- */

static void on_handle_close(uv_handle_t *h)
{
    struct http_conn *c = h->data;
    if (--c->n_handles_open > 0)
        return;
    if (c->ops->on_free)
        c->ops->on_free(c, c->ops->arg);
    body_release(c);
    free(c->req.body);
    free(c);
}

void http_conn_close(struct http_conn *c)
{
    if (c->state == HTTP_CONN_CLOSING)
        return;
    if (c->state != HTTP_CONN_BROKEN) /* close_soon recorded the state it broke in */
        c->closed_in = c->state;
    c->state = HTTP_CONN_CLOSING;
    c->ops->on_close(c, c->ops->arg);
    uv_timer_stop(&c->timer);
    uv_close((uv_handle_t *)&c->tcp, on_handle_close);
    uv_close((uv_handle_t *)&c->timer, on_handle_close);
}

/* ---- writing ------------------------------------------------------------------ */

static void after_flush(struct http_conn *c);

static void on_write(uv_write_t *w, int status)
{
    struct wreq *r = (struct wreq *)w;
    struct http_conn *c = r->c;
    free(r);
    if (c->state == HTTP_CONN_CLOSING)
        return; /* cancelled by uv_close, or a late completion */
    if (status < 0) {
        log_msg(LOG_DEBUG, "write failed: %s", uv_strerror(status));
        http_conn_close(c);
        return;
    }
    if (c->state == HTTP_CONN_BROKEN)
        return; /* closing on the next tick */
    size_t q = http_conn_write_queue(c);
    if (too_slow(c, q)) {
        log_msg(LOG_INFO, "closing a connection that reads slower than %.0f bytes/s",
                c->lim->min_read_rate);
        c->slow = 1;
        http_conn_close(c);
        return;
    }
    if (c->paused && q <= c->lim->low_water) {
        c->paused = 0;
        if (c->ops->on_resume)
            c->ops->on_resume(c, c->ops->arg);
        if (c->state != HTTP_CONN_CLOSING)
            arm_for_state(c);
    } else if (c->paused) {
        arm_for_state(c); /* progress: the stall deadline starts over */
    }
    if (c->state == HTTP_CONN_DRAINING)
        after_flush(c);
    else if (c->shutting && http_conn_idle(c) && q == 0)
        http_conn_close(c); /* shutting down: the last response is out, and nothing follows */
}

/* Bytes the kernel holds for the client and has not sent: they wait for
 * room in the client's receive window. 0 where that cannot be asked. */
static uint64_t kernel_unsent(const struct http_conn *c)
{
#ifdef SIOCOUTQNSD
    uv_os_fd_t fd;
    int n = 0;
    if (uv_fileno((const uv_handle_t *)&c->tcp, &fd) == 0 && ioctl(fd, SIOCOUTQNSD, &n) == 0 &&
        n > 0)
        return (uint64_t)n;
#else
    (void)c;
#endif
    return 0;
}

/* Bytes that have left the kernel for the client: every byte queued, less
 * what waits in libuv's queue and unsent, what the kernel holds (all read
 * now: completed writes lag, as libuv hands the kernel several queued
 * writes before it calls back for the first). */
static uint64_t sent_on(const struct http_conn *c, uint64_t unsent)
{
    uint64_t held = http_conn_write_queue(c) + unsent;
    return c->bytes_queued > held ? c->bytes_queued - held : 0;
}

/* The client has taken what it has so far: the untaken time starts now. */
static void note_taken(struct http_conn *c)
{
    c->taken_mark = sent_on(c, kernel_unsent(c));
    c->taken_at = uv_now(c->tcp.loop);
}

uint64_t http_conn_untaken_ms(struct http_conn *c)
{
    if (c->state != HTTP_CONN_DRAINING || http_conn_write_queue(c) == 0)
        return 0;
    if (sent_on(c, kernel_unsent(c)) != c->taken_mark) { /* it took bytes since the last look */
        note_taken(c);
        return 0;
    }
    return uv_now(c->tcp.loop) - c->taken_at;
}

/* The minimum read rate, judged over windows of write_stall_timeout while
 * bytes wait for the client, in the write queue or unsent in the kernel
 * (the window restarts when both are empty, so a client that keeps up is
 * never judged; the kernel's share counts too, or a small --high-water and
 * --low-water let the queue empty on every pause and a slow client escape).
 * The rate is of bytes that left the kernel for the client. Called after
 * each completed write with the queue left behind. Returns 1 if the client
 * is too slow. */
static int too_slow(struct http_conn *c, size_t queued)
{
    const struct http_limits *l = c->lim;
    if (l->min_read_rate <= 0 || l->write_stall_timeout_ms == 0) {
        c->rate_t0 = 0;
        return 0;
    }
    uint64_t unsent = kernel_unsent(c);
    if (queued == 0 && unsent == 0) {
        c->rate_t0 = 0;
        return 0;
    }
    uint64_t out = sent_on(c, unsent);
    uint64_t now = uv_now(c->tcp.loop);
    if (c->rate_t0 == 0) {
        c->rate_t0 = now;
        c->rate_b0 = out;
        return 0;
    }
    uint64_t dt = now - c->rate_t0;
    if (dt < l->write_stall_timeout_ms)
        return 0;
    double rate = (double)(out > c->rate_b0 ? out - c->rate_b0 : 0) * 1e3 / (double)dt;
    c->rate_t0 = now;
    c->rate_b0 = out;
    return rate < l->min_read_rate;
}

/* A write failed while the application may be in the middle of using c and
 * its c->user: close on the next loop tick, not inside this call. */
static void close_soon(struct http_conn *c)
{
    if (c->state == HTTP_CONN_BROKEN || c->state == HTTP_CONN_CLOSING)
        return;
    c->closed_in = c->state;
    c->state = HTTP_CONN_BROKEN;
    uv_timer_stop(&c->timer);
    uv_timer_start(&c->timer, on_timeout, 0, 0);
}

/* Queues the concatenation of n pieces as one write. */
static int write_parts(struct http_conn *c, const char *const *parts, const size_t *lens, int n)
{
    if (c->state == HTTP_CONN_CLOSING || c->state == HTTP_CONN_BROKEN)
        return -ECONNRESET;
    size_t total = 0;
    for (int i = 0; i < n; i++)
        total += lens[i];
    struct wreq *r = malloc(sizeof *r + total);
    if (!r) {
        close_soon(c);
        return -ENOMEM;
    }
    r->c = c;
    size_t o = 0;
    for (int i = 0; i < n; i++) {
        memcpy(r->data + o, parts[i], lens[i]);
        o += lens[i];
    }
    /* a uv_buf_t holds at most 4 GiB (unsigned int): a response escaped from
     * a --max-response of up to 1 GiB may be longer, so it goes in pieces */
    uv_buf_t b[WRITE_PIECES];
    unsigned nb = 0;
    for (size_t at = 0; at < total || nb == 0; at += WRITE_PIECE) {
        if (nb == WRITE_PIECES) {
            free(r);
            close_soon(c);
            return -EMSGSIZE;
        }
        size_t len = total - at < WRITE_PIECE ? total - at : WRITE_PIECE;
        b[nb++] = uv_buf_init(r->data + at, (unsigned int)len);
    }
    if (http_conn_write_queue(c) == 0 && c->rate_t0 != 0 && kernel_unsent(c) == 0)
        c->rate_t0 = 0; /* the client took everything since: a new backlog, a new window */
    int rc = uv_write(&r->w, (uv_stream_t *)&c->tcp, b, nb, on_write);
    if (rc < 0) {
        free(r); /* libuv: on error the callback never runs */
        close_soon(c);
        return rc;
    }
    c->bytes_queued += total;
    if (c->rate_t0 == 0 && http_conn_write_queue(c) > 0) { /* a backlog: start judging */
        c->rate_t0 = uv_now(c->tcp.loop);
        c->rate_b0 = sent_on(c, kernel_unsent(c));
    }
    if (!c->paused && http_conn_write_queue(c) > c->lim->high_water) {
        c->paused = 1;
        if (c->ops->on_pause)
            c->ops->on_pause(c, c->ops->arg);
        if (c->state == HTTP_CONN_STREAMING)
            arm_for_state(c);
    }
    return 0;
}

static int write_raw(struct http_conn *c, const char *data, size_t len)
{
    const char *parts[1] = {data};
    size_t lens[1] = {len};
    return write_parts(c, parts, lens, 1);
}

static int keep_alive(const struct http_conn *c)
{
    return c->req.keep_alive && !c->close_after && !c->shutting;
}

/* Status line and headers into buf. */
static size_t format_head(struct http_conn *c, char *buf, size_t cap, int status,
                          const char *content_type, const char *extra, int has_len, size_t len)
{
    char ct[160] = "", cl[64] = "";
    if (content_type)
        snprintf(ct, sizeof ct, "Content-Type: %s\r\n", content_type);
    if (has_len)
        snprintf(cl, sizeof cl, "Content-Length: %zu\r\n", len);
    else if (c->chunked)
        snprintf(cl, sizeof cl, "Transfer-Encoding: chunked\r\n");
    c->keep_alive_sent = keep_alive(c);
    int n = snprintf(buf, cap, "HTTP/1.1 %d %s\r\n%s%s%s%sConnection: %s\r\n\r\n", status,
                     http_status_text(status), ct, cl, extra ? extra : "",
                     c->lim->extra_headers ? c->lim->extra_headers : "",
                     c->keep_alive_sent ? "keep-alive" : "close");
    return n < 0 ? 0 : (size_t)n < cap ? (size_t)n : cap - 1;
}

/* The response is complete: next request, or close once flushed. */
static void finish_response(struct http_conn *c)
{
    if (c->state == HTTP_CONN_CLOSING || c->state == HTTP_CONN_BROKEN)
        return;
    if (!c->keep_alive_sent) /* what the response said; a shutdown since is after_flush's */
        c->close_after = 1;
    http_conn_release_body(c);
    set_state(c, HTTP_CONN_DRAINING);
    after_flush(c);
}

/* In DRAINING: once the queue is low (keep-alive) or empty (the last
 * response), move on: to the next request, or to the lingering close. */
static void after_flush(struct http_conn *c)
{
    assert(c->state == HTTP_CONN_DRAINING);
    size_t q = http_conn_write_queue(c);
    if (c->shutting && !c->close_after && q <= c->lim->low_water && !request_pipelined(c))
        c->close_after = 1; /* shutting down, and no request waits behind: this was the last */
    if (c->close_after) {
        if (q > 0)
            return;
        if (c->peer_eof) { /* the client is done sending: nothing to linger for */
            close_soon(c);
            return;
        }
        c->linger_until = uv_now(c->tcp.loop) + LINGER_MAX_MS;
        if (uv_shutdown(&c->shutdown_req, (uv_stream_t *)&c->tcp, NULL) < 0) {
            close_soon(c);
            return;
        }
        c->rpos = c->rlen = 0; /* lingering: read and discard until the client's FIN */
        set_state(c, HTTP_CONN_LINGERING);
        if (c->read_stopped)
            start_reading(c);
        return;
    }
    if (q > c->lim->low_water)
        return;
    /* next request: the parser resumes where it paused */
    c->request_begun = 0;
    c->status = 0;
    llhttp_resume(&c->parser);
    set_state(c, HTTP_CONN_READING);
    if (c->rpos < c->rlen)
        conn_parse(c);
    if (c->read_stopped && c->state != HTTP_CONN_CLOSING)
        start_reading(c);
}

/* RFC 9110 6.4.1: a 1xx, 204 or 304 response has no content; 1xx and 204
 * carry no Content-Length (8.6), and a 304 needs none. */
static int without_content(int status)
{
    return status < 200 || status == 204 || status == 304;
}

int http_conn_respond(struct http_conn *c, int status, const char *content_type,
                      const char *extra_headers, const char *body, size_t len)
{
    if (!awaiting_response(c))
        return -EINVAL;
    char head[2048];
    c->chunked = 0;
    c->status = status;
    const int framed = !without_content(status);
    size_t hl = format_head(c, head, sizeof head, status, content_type, extra_headers, framed, len);
    /* HEAD: the headers GET would send */
    int with_body = framed && body && c->req.method != HTTP_HEAD;
    const char *parts[2] = {head, with_body ? body : ""};
    size_t lens[2] = {hl, with_body ? len : 0};
    int rc = write_parts(c, parts, lens, 2);
    if (rc < 0)
        return rc;
    finish_response(c);
    return 0;
}

int http_conn_respond_error(struct http_conn *c, int status, const char *param, const char *code,
                            const char *extra_headers, const char *message)
{
    /* the body's schema is the application's (ops->error_body); plain text without one */
    char *body =
        c->ops->error_body ? c->ops->error_body(status, param, code, message, c->ops->arg) : NULL;
    int rc;
    if (body) {
        rc = http_conn_respond(c, status, "application/json", extra_headers, body, strlen(body));
    } else {
        char text[512];
        int n =
            snprintf(text, sizeof text, "%d %s: %s\n", status, http_status_text(status), message);
        size_t len = n < 0 ? 0 : (size_t)n < sizeof text ? (size_t)n : sizeof text - 1;
        rc = http_conn_respond(c, status, "text/plain; charset=utf-8", extra_headers, text, len);
    }
    free(body);
    return rc;
}

int http_conn_stream_begin(struct http_conn *c, int status, const char *content_type,
                           const char *extra_headers)
{
    if (!awaiting_response(c))
        return -EINVAL;
    char head[2048];
    c->status = status;
    /* HTTP/1.0 has no chunked coding: the body ends when the connection does */
    c->chunked = c->req.http_major == 1 && c->req.http_minor >= 1;
    if (!c->chunked)
        c->close_after = 1;
    size_t hl = format_head(c, head, sizeof head, status, content_type, extra_headers, 0, 0);
    int rc = write_raw(c, head, hl);
    if (rc < 0)
        return rc;
    set_state(c, HTTP_CONN_STREAMING);
    return 0;
}

int http_conn_stream_write(struct http_conn *c, const char *data, size_t len)
{
    if (c->state != HTTP_CONN_STREAMING)
        return -EINVAL;
    if (len == 0)
        return 0; /* a zero-length chunk would end the body */
    int rc;
    if (!c->chunked) {
        rc = write_raw(c, data, len);
    } else {
        char pre[24];
        int pl = snprintf(pre, sizeof pre, "%zx\r\n", len);
        const char *parts[3] = {pre, data, "\r\n"};
        size_t lens[3] = {(size_t)pl, len, 2};
        rc = write_parts(c, parts, lens, 3);
    }
    if (rc == 0 && !c->paused)
        arm_for_state(c); /* SSE keep-alive comments only on an idle stream */
    return rc;
}

int http_conn_stream_end(struct http_conn *c)
{
    if (c->state != HTTP_CONN_STREAMING)
        return -EINVAL;
    if (c->chunked) {
        int rc = write_raw(c, "0\r\n\r\n", 5);
        if (rc < 0)
            return rc;
    }
    finish_response(c);
    return 0;
}

void http_conn_hold_stream(struct http_conn *c)
{
    if (c->state == HTTP_CONN_WAITING)
        set_state(c, HTTP_CONN_HELD);
}

void http_conn_finish_and_close(struct http_conn *c)
{
    c->shutting = 1; /* every response from now on says Connection: close */
    if (http_conn_idle(c)) {
        if (http_conn_write_queue(c) == 0)
            http_conn_close(c);
        /* else the last response's tail is still queued: on_write closes once it is out */
    } else if (c->state == HTTP_CONN_DRAINING && !c->close_after)
        after_flush(c); /* it was draining to keep alive: now to close, or to answer the
                         * request pipelined behind it (promised by its keep-alive) */
}

/* An error found while reading: answer it and close (lingering). told: the
 * application chose it (ops->on_refused is for the connection's own). */
static void reject_with(struct http_conn *c, int status, const char *code, const char *extra,
                        const char *message, int told)
{
    c->close_after = 1;
    if (c->state == HTTP_CONN_READING)
        set_state(c, HTTP_CONN_WAITING); /* answered like any request */
    if (!awaiting_response(c))
        return;
    if (!told && c->ops->on_refused)
        c->ops->on_refused(c, status, c->ops->arg);
    http_conn_respond_error(c, status, NULL, code && code[0] ? code : NULL,
                            extra && extra[0] ? extra : NULL, message);
}

static void reject(struct http_conn *c, int status, const char *message, int told)
{
    reject_with(c, status, NULL, NULL, message, told);
}

int http_conn_receiving(const struct http_conn *c)
{
    return c->state == HTTP_CONN_READING && c->request_begun;
}

void http_conn_refuse(struct http_conn *c, const struct http_reject *rej)
{
    if (http_conn_receiving(c))
        reject_with(c, rej->status, rej->code, rej->extra_headers, rej->message, 1);
}

/* ---- timer callback ------------------------------------------------------------- */

static void on_timeout(uv_timer_t *t)
{
    struct http_conn *c = t->data;
    /* a comment line and no blank line: a blank line would dispatch an empty
     * event to clients that keep the last event id across events (the openai
     * Python client then parses "" as JSON and fails) */
    static const char ka[] = ": keep-alive\n";
    switch (c->state) {
    case HTTP_CONN_READING:
        if (c->request_begun)
            reject(c, 408, "the request did not arrive within the read timeout", 0);
        else
            http_conn_close(c); /* idle keep-alive connection */
        break;
    case HTTP_CONN_WAITING:
        break; /* no deadline while the application works */
    case HTTP_CONN_HELD:
        if (c->ops->on_stream_commit)
            c->ops->on_stream_commit(c, c->ops->arg);
        if (c->state == HTTP_CONN_STREAMING)
            http_conn_stream_write(c, ka, sizeof ka - 1);
        break;
    case HTTP_CONN_STREAMING:
        if (c->paused) {
            log_msg(LOG_INFO, "closing a connection that stopped reading (%zu bytes queued)",
                    http_conn_write_queue(c));
            c->stalled = 1;
            http_conn_close(c);
        } else {
            http_conn_stream_write(c, ka, sizeof ka - 1);
        }
        break;
    case HTTP_CONN_DRAINING: {
        /* One write may hold a whole response (up to --max-response), and
         * its completion is the only progress on_write sees: what the client
         * took of it since the timer was armed (libuv counts down the bytes
         * left) is progress too. Nothing: it stopped reading; less than
         * min_read_rate over the window: too slow. Either way, close. */
        const size_t q = http_conn_write_queue(c);
        const size_t took = c->drain_mark > q ? c->drain_mark - q : 0;
        const double need = c->lim->min_read_rate * (double)c->lim->write_stall_timeout_ms / 1e3;
        if (q > 0 && took > 0 && (double)took >= need) {
            arm_for_state(c); /* the stall deadline starts over */
            break;
        }
        if (took > 0) {
            c->slow = 1;
        } else if (q > 0) {
            log_msg(LOG_INFO, "closing a connection that stopped reading (%zu bytes queued)", q);
            c->stalled = 1;
        }
        http_conn_close(c);
        break;
    }
    case HTTP_CONN_LINGERING: /* no FIN within the linger time */
    case HTTP_CONN_BROKEN:    /* the tick close_soon asked for */
        http_conn_close(c);
        break;
    case HTTP_CONN_CLOSING:
        break;
    }
}

/* ---- llhttp callbacks ----------------------------------------------------------- */

static struct http_conn *conn_of(llhttp_t *p)
{
    return p->data;
}

static int over_header_limit(struct http_conn *c, size_t add)
{
    c->header_bytes += add;
    if (c->header_bytes > c->lim->max_header_bytes) {
        c->err_status = 431;
        return 1;
    }
    return 0;
}

static int on_message_begin(llhttp_t *p)
{
    struct http_conn *c = conn_of(p);
    char *body = c->req.body;
    memset(&c->req, 0, sizeof c->req);
    c->req.body = body; /* reused allocation is freed at finish; here it is NULL */
    c->request_begun = 1;
    c->header_bytes = 0;
    c->err_status = 0;
    c->err_told = 0;
    memset(&c->rej, 0, sizeof c->rej);
    c->seen = 0;
    c->body_want = 0;
    c->body_dropped = 0;
    c->in_trailers = 0;
    c->te_len = 0;
    c->te_other = 0;
    c->ce_len = 0;
    c->ce_other = 0;
    c->head_raw = 0;
    c->chunk_ext_bytes = 0;
    c->val_end = NULL;
    c->field_len = 0;
    c->field_which = HDR_NONE;
    arm_for_state(c); /* the read deadline starts at the first byte of the request */
    return 0;
}

static int on_url(llhttp_t *p, const char *at, size_t len)
{
    struct http_conn *c = conn_of(p);
    if (over_header_limit(c, len))
        return HPE_USER;
    if (c->req.url_len + len >= HTTP_URL_MAX) {
        c->err_status = 414;
        return HPE_USER;
    }
    memcpy(c->req.url + c->req.url_len, at, len);
    c->req.url_len += len;
    c->req.url[c->req.url_len] = 0;
    return 0;
}

static int on_header_field(llhttp_t *p, const char *at, size_t len)
{
    struct http_conn *c = conn_of(p);
    if (over_header_limit(c, len))
        return HPE_USER;
    size_t room = HTTP_FIELD_MAX - 1 - c->field_len;
    size_t n = len < room ? len : room;
    memcpy(c->field + c->field_len, at, n);
    c->field_len += n;
    c->field[c->field_len] = 0;
    if (n < len)
        c->field_len = HTTP_FIELD_MAX - 1; /* too long to be one we keep */
    return 0;
}

static int on_header_field_complete(llhttp_t *p)
{
    struct http_conn *c = conn_of(p);
    c->field_which = HDR_NONE;
    c->val_end = NULL;
    if (c->in_trailers)
        return 0; /* a trailer field is not a header (RFC 9110 6.5.1): none is acted on */
    if (strcasecmp(c->field, "authorization") == 0)
        c->field_which = HDR_AUTH;
    else if (strcasecmp(c->field, "x-session-id") == 0)
        c->field_which = HDR_SESSION;
    else if (strcasecmp(c->field, "expect") == 0) {
        c->field_which = HDR_EXPECT;
        c->expect_len = 0;
    } else if (strcasecmp(c->field, "transfer-encoding") == 0) {
        c->field_which = HDR_TE; /* llhttp frames by it; the codings are judged here */
        c->te_len = 0;
    } else if (strcasecmp(c->field, "content-encoding") == 0) {
        c->field_which = HDR_CE; /* a list, maybe over several fields */
        c->ce_len = 0;
    } else if (strcasecmp(c->field, "host") == 0)
        c->field_which = HDR_HOST;
    else if (strcasecmp(c->field, "last-event-id") == 0) {
        c->field_which = HDR_LAST_ID;
        c->req.has_last_event_id = 1;
    }
    c->value_overflow = 0;
    if (c->field_which != HDR_NONE && c->field_which != HDR_EXPECT && c->field_which != HDR_TE &&
        c->field_which != HDR_CE) {
        unsigned bit = 1u << c->field_which;
        if (c->seen & bit) { /* two values for one singleton field: which one is meant? */
            c->err_status = 400;
            snprintf(c->rej.message, sizeof c->rej.message,
                     "the request has more than one %s header", header_names[c->field_which]);
            snprintf(c->rej.code, sizeof c->rej.code, "duplicate_header");
            return HPE_USER;
        }
        c->seen |= bit;
        if (c->field_which == HDR_HOST)
            c->req.n_host++;
    }
    return 0;
}

/* The Content-Encoding coding gathered so far (blanks left out), at its
 * comma or the value's end: only identity is read (an empty element of the
 * list is none); any other leaves the body coded, which nothing here
 * decodes (415). */
static void judge_content_coding(struct http_conn *c)
{
    if (c->ce_len > 0 && (c->ce_len != 8 || strncasecmp(c->ce, "identity", 8) != 0))
        c->ce_other = 1;
    c->ce_len = 0;
}

static void append_value(struct http_conn *c, char *dst, size_t cap, const char *at, size_t len)
{
    size_t have = strlen(dst);
    if (have + len >= cap) {
        c->value_overflow = 1;
        return;
    }
    memcpy(dst + have, at, len);
    dst[have + len] = 0;
}

/* An empty value comes as an empty span at the start of the line after
 * it: no fold, unless the line that ends right before the span held only
 * blanks, a line folded onto the empty value. Looks back from at through
 * this call's input, then at what earlier calls left (note_tail). */
static int blank_line_before(const struct http_conn *c, const char *at)
{
    const char *p = at, *start = c->exec_start;
    if (p == start) /* the LF came in an earlier call */
        return c->line_state == LINE_START && c->last_line_blank;
    if (p[-1] != '\n')
        return 0;
    p--;
    int blanks = 0;
    while (p > start && (p[-1] == ' ' || p[-1] == '\t' || p[-1] == '\r')) {
        blanks |= p[-1] != '\r';
        p--;
    }
    if (p > start)
        return blanks && p[-1] == '\n';
    /* the line began in an earlier call */
    return c->line_state == LINE_BLANKS || (c->line_state == LINE_START && blanks);
}

static int on_header_value(llhttp_t *p, const char *at, size_t len)
{
    struct http_conn *c = conn_of(p);
    if (over_header_limit(c, len))
        return HPE_USER;
    /* obs-fold (RFC 9112 5.2): llhttp gives one span per contiguous run of the
     * value within one execute call, so a second span in the same call, or one
     * that does not start where the previous call's input ended, skipped a
     * line break. So does a span that a line break precedes, past blanks: a
     * value folded onto the next line from an empty first line ("Field:" CRLF
     * SP "chunked") comes as one span, preceded by that CRLF, which may
     * have come in an earlier call. */
    int folded = memchr(at, '\r', len) || memchr(at, '\n', len);
    if (c->val_end && (c->val_seq == c->exec_seq || c->val_end != c->val_exec_end))
        folded = 1;
    const char *q = at;
    while (q > c->exec_start && (q[-1] == ' ' || q[-1] == '\t'))
        q--;
    const char before = q > c->exec_start ? q[-1] : c->exec_tail;
    if (len > 0 && (before == '\n' || before == '\r'))
        folded = 1;
    if (len == 0 && blank_line_before(c, at))
        folded = 1; /* "Field:" CRLF SP CRLF: a line of blanks folded on */
    c->val_end = at + len;
    c->val_seq = c->exec_seq;
    c->val_exec_end = c->exec_end;
    if (folded) {
        c->err_status = 400;
        snprintf(c->rej.message, sizeof c->rej.message,
                 "header values may not be folded over several lines");
        return HPE_USER;
    }
    switch (c->field_which) {
    case HDR_AUTH: /* longer than any key: a wrong key (401), not a header too large */
        if (!c->req.authorization_long)
            append_value(c, c->req.authorization, sizeof c->req.authorization, at, len);
        if (c->value_overflow) {
            c->value_overflow = 0;
            c->req.authorization_long = 1;
            c->req.authorization[0] = 0;
        }
        break;
    case HDR_SESSION: {
        /* longer than we keep is longer than any session id: kept clipped,
         * still too long, so the request's own check answers 400
         * invalid_value naming X-Session-Id (not 431, which is for headers
         * the server cannot take at all) */
        size_t have = strlen(c->req.session_id), room = sizeof c->req.session_id - 1 - have;
        size_t n = len < room ? len : room;
        memcpy(c->req.session_id + have, at, n);
        c->req.session_id[have + n] = 0;
        break;
    }
    case HDR_LAST_ID: /* too long to be an event id: the application answers 400 */
        append_value(c, c->req.last_event_id, sizeof c->req.last_event_id, at, len);
        if (c->value_overflow) {
            c->value_overflow = 0;
            c->req.last_event_id_long = 1;
        }
        break;
    case HDR_TE: /* judged whole at value complete; "chunked" has no blanks */
        for (size_t i = 0; i < len; i++) {
            if (at[i] == ' ' || at[i] == '\t')
                continue;
            if (c->te_len + 1 < sizeof c->te)
                c->te[c->te_len++] = at[i];
            else
                c->te_other = 1; /* longer than chunked */
        }
        break;
    case HDR_CE: /* each coding of the list judged at its comma or the value's end */
        for (size_t i = 0; i < len; i++) {
            if (at[i] == ',')
                judge_content_coding(c);
            else if (at[i] == ' ' || at[i] == '\t')
                continue;
            else if (c->ce_len + 1 < sizeof c->ce)
                c->ce[c->ce_len++] = at[i];
            else
                c->ce_other = 1; /* longer than identity */
        }
        break;
    case HDR_EXPECT: /* judged whole at value complete: it may come in pieces */
        if (c->expect_len + len < sizeof c->expect) {
            memcpy(c->expect + c->expect_len, at, len);
            c->expect_len += len;
        } else {
            c->expect_len = sizeof c->expect; /* longer than any value we act on */
        }
        break;
    default:
        break;
    }
    return 0;
}

static int on_header_value_complete(llhttp_t *p)
{
    struct http_conn *c = conn_of(p);
    if (c->field_which == HDR_EXPECT) {
        size_t n = c->expect_len;
        while (n > 0 && (c->expect[n - 1] == ' ' || c->expect[n - 1] == '\t'))
            n--; /* llhttp leaves trailing OWS in the value */
        if (n == 12 && strncasecmp(c->expect, "100-continue", 12) == 0)
            c->req.expect_continue = 1;
        c->expect_len = 0;
    }
    if (c->field_which == HDR_CE)
        judge_content_coding(c);
    if (c->field_which == HDR_TE) {
        if (c->te_len != 7 || strncasecmp(c->te, "chunked", 7) != 0)
            c->te_other = 1; /* "gzip, chunked": the body would be read still coded */
        c->te_len = 0;
    }
    c->field_len = 0;
    c->field[0] = 0;
    c->field_which = HDR_NONE;
    c->val_end = NULL;
    return 0;
}

/* RFC 9112 3.2: a 1.1 request carries exactly one Host; 1.0 at most one. */
static int check_framing(struct http_conn *c, llhttp_t *p)
{
    if (p->http_major != 1 || p->http_minor > 1) {
        c->err_status = 505;
        snprintf(c->rej.message, sizeof c->rej.message,
                 "HTTP/%d.%d is not served here; use HTTP/1.1", p->http_major, p->http_minor);
        return -1;
    }
    if (c->req.n_host > 1 || (p->http_minor == 1 && c->req.n_host != 1)) {
        c->err_status = 400;
        snprintf(c->rej.message, sizeof c->rej.message,
                 "an HTTP/1.1 request needs exactly one Host header");
        return -1;
    }
    /* RFC 9112 6.1: Transfer-Encoding in HTTP/1.0 is faulty framing (an
     * HTTP/1.0 hop in front would read the chunks as the next request) */
    if (p->http_minor == 0 && (p->flags & (F_TRANSFER_ENCODING | F_CHUNKED))) {
        c->err_status = 400;
        snprintf(c->rej.message, sizeof c->rej.message,
                 "an HTTP/1.0 request may not carry Transfer-Encoding");
        return -1;
    }
    if (c->te_other) {
        c->err_status = 501;
        snprintf(c->rej.message, sizeof c->rej.message,
                 "the only transfer coding served is chunked");
        return -1;
    }
    /* RFC 9110 15.5.16: a content coding not accepted is a 415 that names
     * the ones that are (here none but identity) */
    if (c->ce_other) {
        c->err_status = 415;
        snprintf(c->rej.message, sizeof c->rej.message,
                 "the request body has a Content-Encoding this server does not decode; send it "
                 "uncoded");
        snprintf(c->rej.code, sizeof c->rej.code, "unsupported_content_encoding");
        snprintf(c->rej.extra_headers, sizeof c->rej.extra_headers,
                 "Accept-Encoding: identity\r\n");
        return -1;
    }
    return 0;
}

/* The body budget (--max-body-total) has no room: parse_error answers 503
 * server_busy with Retry-After, and closes. */
static void set_busy_error(struct http_conn *c)
{
    c->err_status = 503;
    snprintf(c->rej.message, sizeof c->rej.message,
             "the server holds as many request bodies as it can; retry shortly");
    snprintf(c->rej.code, sizeof c->rej.code, "server_busy");
    snprintf(c->rej.extra_headers, sizeof c->rej.extra_headers, "Retry-After: 1\r\n");
}

static int on_headers_complete(llhttp_t *p)
{
    struct http_conn *c = conn_of(p);
    c->in_trailers = 1;
    size_t cap = 0, want = 0;
    c->req.method = p->method;
    c->req.http_major = p->http_major;
    c->req.http_minor = p->http_minor;
    if (check_framing(c, p) < 0)
        return -1;
    if (p->http_minor == 0)
        c->req.expect_continue = 0; /* RFC 9110 10.1.1: ignored in HTTP/1.0 */
    if (c->ops->on_headers) {
        int st = c->ops->on_headers(c, &c->rej, c->ops->arg);
        if (st) {
            c->err_status = st;
            c->err_told = 1;
            return -1;
        }
    }
    if (p->flags & F_CONTENT_LENGTH) {
        if (p->content_length > c->lim->max_body) {
            c->err_status = 413;
            return -1;
        }
        want = (size_t)p->content_length + 1;
        cap = want < BODY_MIN_ALLOC ? want : BODY_MIN_ALLOC; /* grows as bytes arrive */
        c->body_want = want;
    } else if (p->flags & F_CHUNKED) {
        cap = 4096 < c->lim->max_body + 1 ? 4096 : c->lim->max_body + 1;
    }
    /* No GET, HEAD or DELETE endpoint takes a body: one is read and dropped,
     * holding neither memory nor budget (GET /health and /metrics need no
     * key, so a kept body there let anyone hold the budget). */
    c->body_discard = p->method == HTTP_GET || p->method == HTTP_HEAD || p->method == HTTP_DELETE;
    if (c->body_discard)
        cap = 0;
    /* The budget is drawn as the body's buffer grows, never from
     * Content-Length up front: announcing 8 MiB and sending nothing holds
     * what was allocated, not 8 MiB of every client's budget. A client that
     * waits for 100 Continue is told now if the body it announces cannot fit
     * the budget as it stands (nothing is held for it either way). */
    const size_t *budget = c->lim->body_budget;
    const int wont_fit = c->req.expect_continue && !c->body_discard && c->body_want > 1 && budget &&
                         c->lim->max_body_total && *budget + c->body_want > c->lim->max_body_total;
    if (wont_fit || (cap > 0 && body_reserve(c, cap) < 0)) {
        set_busy_error(c);
        return -1;
    }
    if (cap > 0) {
        c->req.body = malloc(cap);
        if (!c->req.body) {
            c->err_status = 503;
            return -1;
        }
        c->req.body_cap = cap;
    }
    const int discarded_body = c->body_discard && (c->body_want > 1 || (p->flags & F_CHUNKED));
    if (c->req.expect_continue && (cap > 1 || discarded_body)) {
        static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
        write_raw(c, cont, sizeof cont - 1);
    }
    return 0;
}

static int on_body(llhttp_t *p, const char *at, size_t len)
{
    struct http_conn *c = conn_of(p);
    struct http_request *r = &c->req;
    if (c->body_discard) { /* counted against --max-body, not kept: the request has no body */
        if (c->body_dropped + len > c->lim->max_body) {
            c->err_status = 413;
            return HPE_USER;
        }
        c->body_dropped += len;
        return 0;
    }
    if (r->body_len + len > c->lim->max_body) {
        c->err_status = 413;
        return HPE_USER;
    }
    if (r->body_len + len + 1 > r->body_cap) { /* grow with what arrives, bounded by max_body */
        size_t cap = r->body_cap ? r->body_cap : 4096;
        while (cap < r->body_len + len + 1)
            cap *= 2;
        if (cap > c->lim->max_body + 1)
            cap = c->lim->max_body + 1;
        if (c->body_want && cap > c->body_want)
            cap = c->body_want; /* a Content-Length body needs no more */
        if (cap > c->body_reserved && body_reserve(c, cap - c->body_reserved) < 0) {
            set_busy_error(c); /* bodies draw on the budget as they grow */
            return HPE_USER;
        }
        char *nb = realloc(r->body, cap);
        if (!nb) {
            c->err_status = 503;
            return HPE_USER;
        }
        r->body = nb;
        r->body_cap = cap;
    }
    memcpy(r->body + r->body_len, at, len);
    r->body_len += len;
    return 0;
}

/* Chunk extensions are read and dropped; their names and values count
 * against CHUNK_EXT_MAX per request (413 beyond), or a two-byte body could
 * carry megabytes of them. */
static int on_chunk_extension(llhttp_t *p, const char *at, size_t len)
{
    struct http_conn *c = conn_of(p);
    (void)at;
    c->chunk_ext_bytes += len;
    if (c->chunk_ext_bytes > CHUNK_EXT_MAX) {
        c->err_status = 413;
        snprintf(c->rej.message, sizeof c->rej.message,
                 "the request's chunk extensions are longer than this server accepts");
        return HPE_USER;
    }
    return 0;
}

static int on_message_complete(llhttp_t *p)
{
    struct http_conn *c = conn_of(p);
    c->req.method = p->method;
    c->req.http_major = p->http_major;
    c->req.http_minor = p->http_minor;
    c->req.keep_alive = llhttp_should_keep_alive(p);
    if (p->upgrade)
        c->close_after = 1; /* no protocol switch: answer, then close; what follows is not HTTP */
    if (c->req.body)
        c->req.body[c->req.body_len] = 0;
    return HPE_PAUSED; /* one request at a time: resume when the response is done */
}

static const llhttp_settings_t *settings(void)
{
    static llhttp_settings_t s;
    static int init;
    if (!init) {
        llhttp_settings_init(&s);
        s.on_message_begin = on_message_begin;
        s.on_url = on_url;
        s.on_header_field = on_header_field;
        s.on_header_field_complete = on_header_field_complete;
        s.on_header_value = on_header_value;
        s.on_header_value_complete = on_header_value_complete;
        s.on_headers_complete = on_headers_complete;
        s.on_body = on_body;
        s.on_chunk_extension_name = on_chunk_extension;
        s.on_chunk_extension_value = on_chunk_extension;
        s.on_message_complete = on_message_complete;
        init = 1; /* loop thread only */
    }
    return &s;
}

/* ---- reading -------------------------------------------------------------------- */

static void dispatch(struct http_conn *c)
{
    set_state(c, HTTP_CONN_WAITING);
    c->ops->on_request(c, c->ops->arg);
}

static void parse_error(struct http_conn *c, llhttp_errno_t e)
{
    if (c->err_status && c->rej.message[0])
        reject_with(c, c->err_status, c->rej.code, c->rej.extra_headers, c->rej.message,
                    c->err_told);
    else if (c->err_status == 413)
        reject(c, 413, "the request body is larger than this server accepts", c->err_told);
    else if (c->err_status == 414)
        reject(c, 414, "the request URL is too long", c->err_told);
    else if (c->err_status == 431)
        reject(c, 431, "the request headers are larger than this server accepts", c->err_told);
    else if (c->err_status)
        reject(c, c->err_status, "the server could not take this request", c->err_told);
    else {
        char msg[200];
        snprintf(msg, sizeof msg, "malformed HTTP request: %s", llhttp_errno_name(e));
        reject(c, e == HPE_INVALID_VERSION ? 505 : 400, msg, 0);
    }
}

/* Remembers the last byte other than SP and HT of [from, to), the input an
 * execute call consumed, and what the line it ends in holds so far, for
 * on_header_value's look back past the start of the next call's input. */
static void note_tail(struct http_conn *c, const char *from, const char *to)
{
    for (const char *b = from; b < to; b++) { /* the line the input ends in */
        if (*b == '\n') {
            c->last_line_blank = c->line_state == LINE_BLANKS;
            c->line_state = LINE_START;
        } else if (*b == ' ' || *b == '\t') {
            if (c->line_state == LINE_START)
                c->line_state = LINE_BLANKS;
        } else if (*b != '\r') {
            c->line_state = LINE_TEXT;
        }
    }
    while (to > from && (to[-1] == ' ' || to[-1] == '\t'))
        to--;
    if (to > from)
        c->exec_tail = to[-1];
}

/* Feeds the buffered bytes to llhttp while READING. Re-entrant calls (a
 * handler that answers at once) return; the outer loop goes on. */
static void conn_parse(struct http_conn *c)
{
    if (c->in_parse)
        return;
    c->in_parse = 1;
    while (c->state == HTTP_CONN_READING && c->rpos < c->rlen) {
        const char *start = c->rbuf + c->rpos;
        c->exec_seq++;
        c->exec_start = start;
        c->exec_end = c->rbuf + c->rlen;
        llhttp_errno_t e = llhttp_execute(&c->parser, start, c->rlen - c->rpos);
        note_tail(c, start,
                  e == HPE_OK                                  ? c->exec_end
                  : e == HPE_PAUSED || e == HPE_PAUSED_UPGRADE ? llhttp_get_error_pos(&c->parser)
                                                               : start);
        if (e == HPE_OK && c->request_begun && !c->in_trailers) {
            /* the whole input went into a head not yet complete: blanks in
             * the request line or before a value reach no callback, and
             * count here (at most one read past the limit) */
            c->head_raw += c->rlen - c->rpos;
            if (c->head_raw > c->lim->max_header_bytes) {
                c->err_status = 431;
                parse_error(c, HPE_USER);
                break;
            }
        }
        if (e == HPE_OK) {
            c->rpos = c->rlen;
        } else if (e == HPE_PAUSED || e == HPE_PAUSED_UPGRADE) {
            c->rpos = (size_t)(llhttp_get_error_pos(&c->parser) - c->rbuf);
            if (e == HPE_PAUSED_UPGRADE)
                c->close_after = 1; /* no upgrades: answer, then close */
            dispatch(c);
        } else {
            parse_error(c, e);
            break;
        }
    }
    if (c->rpos == c->rlen) {
        c->rpos = c->rlen = 0;
    } else if (c->rpos > 0 && c->state != HTTP_CONN_CLOSING) {
        memmove(c->rbuf, c->rbuf + c->rpos, c->rlen - c->rpos);
        c->rlen -= c->rpos;
        c->rpos = 0;
    }
    c->in_parse = 0;
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    struct http_conn *c = h->data;
    (void)suggested;
    if (discarding(c))
        c->rpos = c->rlen = 0; /* what arrives is discarded */
    *buf = uv_buf_init(c->rbuf + c->rlen, (unsigned int)(sizeof c->rbuf - c->rlen));
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    struct http_conn *c = s->data;
    (void)buf;
    if (c->state == HTTP_CONN_CLOSING || c->state == HTTP_CONN_BROKEN)
        return;                /* BROKEN: closing on the next tick */
    if (nread == UV_ENOBUFS) { /* buffer full of pipelined requests: wait */
        uv_read_stop(s);
        c->read_stopped = 1;
        return;
    }
    if (nread < 0) {
        if (nread == UV_EOF && c->state == HTTP_CONN_DRAINING) {
            /* a complete response is still flushing: finish it, then close */
            c->peer_eof = 1;
            c->close_after = 1;
            uv_read_stop(s);
            c->read_stopped = 1;
            after_flush(c);
            return;
        }
        if (c->state == HTTP_CONN_READING && c->request_begun && nread == UV_EOF) {
            llhttp_errno_t e = llhttp_finish(&c->parser);
            if (e != HPE_OK && e != HPE_PAUSED) {
                http_conn_close(c); /* the client gave up mid-request */
                return;
            }
        }
        /* EOF or error: whatever is running is for nobody now */
        http_conn_close(c);
        return;
    }
    if (nread == 0)
        return;
    if (discarding(c)) {
        /* the last response is out: discard, and wait a little longer for the FIN */
        if (c->state == HTTP_CONN_LINGERING && uv_now(c->tcp.loop) < c->linger_until)
            arm(c, LINGER_MS, 0);
        return;
    }
    c->rlen += (size_t)nread;
    if (c->state == HTTP_CONN_READING)
        conn_parse(c);
    if (c->state != HTTP_CONN_CLOSING && c->rlen == sizeof c->rbuf) {
        uv_read_stop(s); /* pipelined bytes fill the buffer: stop until they are parsed */
        c->read_stopped = 1;
    }
}

static void start_reading(struct http_conn *c)
{
    if (c->rlen < sizeof c->rbuf && uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) == 0)
        c->read_stopped = 0;
}

int http_conn_accept(uv_stream_t *server, const struct http_limits *lim,
                     const struct http_conn_ops *ops, struct http_conn **out)
{
    struct http_conn *c = calloc(1, sizeof *c);
    if (!c)
        return -ENOMEM;
    c->lim = lim;
    c->ops = ops;
    int rc = uv_tcp_init(server->loop, &c->tcp);
    if (rc < 0) {
        free(c);
        return rc;
    }
    c->tcp.data = c;
    c->n_handles_open = 1;
    rc = uv_timer_init(server->loop, &c->timer);
    if (rc == 0) {
        c->timer.data = c;
        c->n_handles_open = 2;
        rc = uv_accept(server, (uv_stream_t *)&c->tcp);
    }
    if (rc == 0) {
        uv_tcp_nodelay(&c->tcp, 1); /* tokens go out as they come */
        if (lim->sndbuf > 0) {
            int v = lim->sndbuf;
            uv_send_buffer_size((uv_handle_t *)&c->tcp, &v);
        }
        rc = uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
    }
    if (rc < 0) {
        /* not registered anywhere yet: close without calling ops->on_close */
        c->state = HTTP_CONN_CLOSING;
        uv_close((uv_handle_t *)&c->tcp, on_handle_close);
        if (c->n_handles_open == 2)
            uv_close((uv_handle_t *)&c->timer, on_handle_close);
        return rc;
    }
    llhttp_init(&c->parser, HTTP_REQUEST, settings());
    c->parser.data = c;
    c->state = HTTP_CONN_READING;
    c->idle_since = uv_now(c->tcp.loop);
    arm_for_state(c);
    *out = c;
    return 0;
}
