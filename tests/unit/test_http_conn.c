/*
 * test_http_conn.c: server/http_conn.c on a real libuv loop, no engine.
 *
 * Each test listens on 127.0.0.1:0 with a small test handler, runs the loop
 * on this thread and drives it from a client thread that uses plain blocking
 * sockets (so the client can do what real clients do: pipeline, stall, stop
 * reading, hang up). When the client is done it wakes the loop with a
 * uv_async, the loop closes every handle and returns, and the test checks the
 * bytes the client saw and the callback counters the server kept (as libuv's
 * test-tcp-close.c does). Counters are read only after the client thread is
 * joined and the loop has stopped.
 */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "api/api.h"
#include "server/http_conn.h"
#include "test.h"

/* ---- the server side ------------------------------------------------------- */

#define MAX_CONNS 32

struct srv {
    uv_loop_t loop;
    uv_tcp_t listener;
    uv_async_t done;
    uv_timer_t later; /* answers /slow requests after a delay */
    struct http_limits lim;
    struct http_conn_ops ops;
    int port;
    struct http_conn *conns[MAX_CONNS];
    struct http_conn *slow[8]; /* pending /slow requests, answered in arrival order */
    int n_slow;
    /* counters (loop thread) */
    int accepted, requests, closes, frees, pauses, resumes, stalls, commits;
    int closed_waiting, closed_streaming;
    int closed_in[HTTP_CONN_CLOSING + 1]; /* closes by the state they began in */
    int free_before_close;                /* a free for a conn whose on_close had not run */
    size_t max_queue;
    size_t flood_total, flood_target;
    struct http_conn *flooder;
    char order[64]; /* one letter per event: c close, f free */
    int n_order;
};

static struct srv S;

#define BIG_RESPONSE (2 << 20)

static void rec(char ev)
{
    if (S.n_order < (int)sizeof S.order - 1)
        S.order[S.n_order++] = ev;
}

static void flood_more(struct http_conn *c)
{
    static char piece[16384];
    memset(piece, 'x', sizeof piece);
    while (!c->paused && S.flood_total < S.flood_target && c->state == HTTP_CONN_STREAMING) {
        http_conn_stream_write(c, piece, sizeof piece);
        S.flood_total += sizeof piece;
        size_t q = http_conn_write_queue(c);
        if (q > S.max_queue)
            S.max_queue = q;
    }
    if (S.flood_total >= S.flood_target && c->state == HTTP_CONN_STREAMING)
        http_conn_stream_end(c);
}

static void on_request(struct http_conn *c, void *arg)
{
    (void)arg;
    S.requests++;
    const char *url = c->req.url;
    char body[256];
    if (strncmp(url, "/slow", 5) == 0 && S.n_slow < 8) {
        S.slow[S.n_slow++] = c; /* answered by on_later */
        return;
    }
    if (strncmp(url, "/hang", 5) == 0)
        return; /* never answered: the client hangs up */
    if (strncmp(url, "/slowheld", 9) == 0 && S.n_slow < 8) {
        http_conn_hold_stream(c); /* a stream was expected, but on_later answers whole */
        S.slow[S.n_slow++] = c;
        return;
    }
    if (strncmp(url, "/shutdown", 9) == 0) {
        /* what the server does on SIGTERM: every connection finishes what it
         * is doing and closes (an idle one at once), this one included */
        for (int i = 0; i < MAX_CONNS; i++)
            if (S.conns[i])
                http_conn_finish_and_close(S.conns[i]); /* may clear S.conns[i] */
        http_conn_respond(c, 200, "text/plain", NULL, "bye", 3);
        return;
    }
    if (strncmp(url, "/held", 5) == 0) {
        http_conn_hold_stream(c); /* a stream is coming; keep-alive ticks commit it */
        return;
    }
    if (strncmp(url, "/stream", 7) == 0) {
        http_conn_stream_begin(c, 200, "text/event-stream", NULL);
        http_conn_stream_write(c, "hello", 5);
        http_conn_stream_write(c, " world", 6);
        http_conn_stream_end(c);
        return;
    }
    if (strncmp(url, "/flood", 6) == 0) {
        http_conn_stream_begin(c, 200, "application/octet-stream", NULL);
        S.flooder = c;
        flood_more(c);
        return;
    }
    if (strncmp(url, "/sid", 4) == 0) { /* what the request's headers said */
        int n =
            snprintf(body, sizeof body, "sid=%s auth=%s", c->req.session_id, c->req.authorization);
        http_conn_respond(c, 200, "text/plain", NULL, body, (size_t)n);
        return;
    }
    if (strncmp(url, "/nocontent", 10) == 0) { /* as DELETE /v1/sessions/{id} answers */
        http_conn_respond(c, 204, NULL, NULL, NULL, 0);
        return;
    }
    if (strncmp(url, "/big", 4) == 0) { /* one whole response, one write */
        static char big[BIG_RESPONSE];
        memset(big, 'B', sizeof big);
        http_conn_respond(c, 200, "application/octet-stream", NULL, big, sizeof big);
        return;
    }
    int n = snprintf(body, sizeof body, "%s %zu", url, c->req.body_len);
    http_conn_respond(c, 200, "text/plain", NULL, body, (size_t)n);
}

static void on_later(uv_timer_t *t)
{
    (void)t;
    for (int i = 0; i < S.n_slow; i++) {
        struct http_conn *c = S.slow[i];
        char body[256];
        int n = snprintf(body, sizeof body, "%s %zu", c->req.url, c->req.body_len);
        if (c->state == HTTP_CONN_WAITING || c->state == HTTP_CONN_HELD)
            http_conn_respond(c, 200, "text/plain", NULL, body, (size_t)n);
    }
    S.n_slow = 0;
}

static void on_stream_commit(struct http_conn *c, void *arg)
{
    (void)arg;
    S.commits++;
    http_conn_stream_begin(c, 200, "text/event-stream", NULL);
}

static void on_pause(struct http_conn *c, void *arg)
{
    (void)c;
    (void)arg;
    S.pauses++;
}

static void on_resume(struct http_conn *c, void *arg)
{
    (void)arg;
    S.resumes++;
    if (c == S.flooder)
        flood_more(c);
}

static void on_close(struct http_conn *c, void *arg)
{
    (void)arg;
    S.closes++;
    rec('c');
    if (c->stalled)
        S.stalls++;
    if (c->closed_in == HTTP_CONN_WAITING)
        S.closed_waiting++;
    if (c->closed_in == HTTP_CONN_STREAMING)
        S.closed_streaming++;
    if (c->closed_in >= 0 && c->closed_in <= HTTP_CONN_CLOSING)
        S.closed_in[c->closed_in]++;
    if (c == S.flooder)
        S.flooder = NULL;
    for (int i = 0; i < S.n_slow; i++)
        if (S.slow[i] == c)
            S.slow[i] = S.slow[--S.n_slow];
    for (int i = 0; i < MAX_CONNS; i++)
        if (S.conns[i] == c)
            S.conns[i] = NULL;
    c->user = (void *)1; /* marks on_close done */
}

static void on_free(struct http_conn *c, void *arg)
{
    (void)arg;
    S.frees++;
    rec('f');
    if (c->user != (void *)1)
        S.free_before_close++;
}

static void on_connection(uv_stream_t *l, int status)
{
    struct http_conn *c;
    if (status < 0 || http_conn_accept(l, &S.lim, &S.ops, &c) < 0)
        return;
    S.accepted++;
    for (int i = 0; i < MAX_CONNS; i++) {
        if (!S.conns[i]) {
            S.conns[i] = c;
            break;
        }
    }
}

static void on_done(uv_async_t *a)
{
    (void)a;
    for (int i = 0; i < MAX_CONNS; i++)
        if (S.conns[i])
            http_conn_close(S.conns[i]); /* clears S.conns[i] */
    uv_close((uv_handle_t *)&S.listener, NULL);
    uv_close((uv_handle_t *)&S.later, NULL);
    uv_close((uv_handle_t *)&S.done, NULL);
}

static struct http_limits default_limits(void)
{
    return (struct http_limits){
        .max_header_bytes = 8192,
        .max_body = 1024,
        .high_water = 65536,
        .low_water = 16384,
        .read_timeout_ms = 3000,
        .keepalive_timeout_ms = 3000,
        .write_stall_timeout_ms = 3000,
        .sse_keepalive_ms = 0,
        .extra_headers = "X-Test: 1\r\n",
    };
}

/* Bodies of up to 100,000 bytes out of a 120,000-byte budget that every
 * connection draws on; *budget (zeroed here) counts what they hold. */
static struct http_limits budget_limits(size_t *budget)
{
    struct http_limits lim = default_limits();
    lim.max_body = 100000;
    lim.max_body_total = 120000;
    *budget = 0;
    lim.body_budget = budget;
    return lim;
}

/* The server's error bodies are the API's (router_error_body); the same here. */
static char *error_body(int status, const char *param, const char *code, const char *message,
                        void *arg)
{
    struct api_error e;
    (void)arg;
    api_error_set(&e, status, param, code, "%s", message);
    return api_error_json(&e);
}

static void srv_start(const struct http_limits *lim)
{
    memset(&S, 0, sizeof S);
    S.lim = *lim;
    S.ops = (struct http_conn_ops){.on_request = on_request,
                                   .on_stream_commit = on_stream_commit,
                                   .on_pause = on_pause,
                                   .on_resume = on_resume,
                                   .on_close = on_close,
                                   .on_free = on_free,
                                   .error_body = error_body};
    uv_loop_init(&S.loop);
    uv_tcp_init(&S.loop, &S.listener);
    uv_async_init(&S.loop, &S.done, on_done);
    uv_timer_init(&S.loop, &S.later);
    struct sockaddr_in a;
    uv_ip4_addr("127.0.0.1", 0, &a);
    uv_tcp_bind(&S.listener, (const struct sockaddr *)&a, 0);
    uv_listen((uv_stream_t *)&S.listener, 64, on_connection);
    struct sockaddr_in got;
    int len = sizeof got;
    uv_tcp_getsockname(&S.listener, (struct sockaddr *)&got, &len);
    S.port = ntohs(got.sin_port);
}

struct client {
    void (*fn)(struct client *);
    int port;
    char buf[1 << 16];
    size_t len;
    int eof;
    int n;
};

static void *client_main(void *arg)
{
    struct client *cl = arg;
    cl->fn(cl);
    uv_async_send(&S.done);
    return NULL;
}

/* Runs the loop until the client thread is done, then closes everything. */
static void run_with_client(struct client *cl)
{
    pthread_t th;
    cl->port = S.port;
    pthread_create(&th, NULL, client_main, cl);
    uv_run(&S.loop, UV_RUN_DEFAULT);
    pthread_join(th, NULL);
    uv_loop_close(&S.loop);
}

/* ---- the client side (client thread) ----------------------------------------- */

static int cl_connect(int port, int rcvbuf)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (rcvbuf > 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static void cl_send(int fd, const char *s, size_t n)
{
    while (n > 0) {
        ssize_t w = send(fd, s, n, MSG_NOSIGNAL);
        if (w <= 0)
            return;
        s += w;
        n -= (size_t)w;
    }
}

static void cl_sends(int fd, const char *s)
{
    cl_send(fd, s, strlen(s));
}

/* Reads into cl->buf until needle has appeared count times, EOF, or timeout. */
static void cl_read_until(struct client *cl, int fd, const char *needle, int count, int timeout_ms)
{
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        int seen = 0;
        const char *p = cl->buf;
        cl->buf[cl->len] = 0;
        while (needle && (p = strstr(p, needle)) != NULL) {
            seen++;
            p++;
        }
        if (needle && seen >= count)
            return;
        struct timespec t;
        clock_gettime(CLOCK_MONOTONIC, &t);
        long el = (t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000;
        if (el >= timeout_ms)
            return;
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        if (poll(&pfd, 1, (int)(timeout_ms - el)) <= 0)
            return;
        ssize_t r = recv(fd, cl->buf + cl->len, sizeof cl->buf - 1 - cl->len, 0);
        if (r <= 0) {
            cl->eof = 1;
            return;
        }
        cl->len += (size_t)r;
    }
}

static void ms_sleep(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* ---- tests --------------------------------------------------------------------- */

static void cl_pipeline(struct client *cl)
{
    int fd = cl_connect(cl->port, 0);
    /* three requests in one write; the first is answered last in time (50 ms
     * later) but must still come first on the wire */
    cl_sends(fd, "GET /slow/1 HTTP/1.1\r\nHost: x\r\n\r\n"
                 "POST /fast/2 HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc"
                 "GET /slow/3 HTTP/1.1\r\nHost: x\r\n\r\n");
    cl_read_until(cl, fd, "HTTP/1.1 200", 3, 3000);
    close(fd);
}

TEST(http_conn_answers_pipelined_requests_in_order)
{
    struct http_limits lim = default_limits();
    srv_start(&lim);
    struct client *cl = calloc(1, sizeof *cl);
    cl->fn = cl_pipeline;
    /* /slow requests are answered by a timer every 50 ms */
    uv_timer_start(&S.later, on_later, 50, 50);
    run_with_client(cl);
    const char *a = strstr(cl->buf, "/slow/1 0");
    const char *b = strstr(cl->buf, "/fast/2 3");
    const char *c = strstr(cl->buf, "/slow/3 0");
    ASSERT(a && b && c);
    ASSERT(a < b && b < c);
    ASSERT(strstr(cl->buf, "X-Test: 1\r\n") != NULL);
    ASSERT(strstr(cl->buf, "Connection: keep-alive\r\n") != NULL);
    ASSERT_EQ(S.requests, 3);
    free(cl);
}

static void cl_no_content(struct client *cl)
{
    int fd = cl_connect(cl->port, 0);
    cl_sends(fd, "DELETE /nocontent HTTP/1.1\r\nHost: x\r\n\r\n"
                 "GET /after HTTP/1.1\r\nHost: x\r\n\r\n");
    cl_read_until(cl, fd, "/after 0", 1, 3000);
    close(fd);
}

TEST(http_conn_answers_204_without_content_length_or_body)
{
    struct http_limits lim = default_limits();
    srv_start(&lim);
    struct client *cl = calloc(1, sizeof *cl);
    cl->fn = cl_no_content;
    run_with_client(cl);
    ASSERT(strncmp(cl->buf, "HTTP/1.1 204 No Content\r\n", 25) == 0);
    const char *end = strstr(cl->buf, "\r\n\r\n");
    const char *next = strstr(cl->buf + 1, "HTTP/1.1 200 ");
    ASSERT(end && next);
    ASSERT(end + 4 == next); /* nothing between the 204's head and the next response */
    const char *cl_len = strstr(cl->buf, "Content-Length");
    ASSERT(cl_len && cl_len > next); /* only the 200 has one */
    ASSERT_EQ(S.requests, 2);
    free(cl);
}

static void cl_big_body(struct client *cl)
{
    int fd = cl_connect(cl->port, 0);
    cl_sends(fd, "POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\nabcdef");
    cl_read_until(cl, fd, NULL, 0, 3000);
    close(fd);
}

/* Expect: 100-continue with its value cut between two reads (found by
 * fuzz_http_conn's split invariance), then a value that only starts with it. */
static void cl_expect_split(struct client *cl)
{
    int fd = cl_connect(cl->port, 0);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    cl_sends(fd, "POST /split HTTP/1.1\r\nHost: x\r\nExpect: 100-con");
    ms_sleep(100); /* the server reads what came so far */
    cl_sends(fd, "tinue\r\nContent-Length: 2\r\n\r\n");
    cl_read_until(cl, fd, "100 Continue", 1, 2000);
    cl_sends(fd, "hi");
    cl_read_until(cl, fd, "HTTP/1.1 200", 1, 2000);
    cl_sends(fd, "POST /long HTTP/1.1\r\nHost: x\r\nExpect: 100-continuexyz\r\n"
                 "Content-Length: 2\r\nConnection: close\r\n\r\nhi");
    cl_read_until(cl, fd, NULL, 0, 2000);
    close(fd);
}

TEST(http_conn_sends_100_continue_for_a_value_split_across_reads_only)
{
    struct http_limits lim = default_limits();
    srv_start(&lim);
    struct client *cl = calloc(1, sizeof *cl);
    cl->fn = cl_expect_split;
    run_with_client(cl);
    const char *cont = strstr(cl->buf, "HTTP/1.1 100 Continue\r\n\r\n");
    ASSERT(cont != NULL);
    ASSERT(strstr(cont + 12, "100 Continue") == NULL); /* not for 100-continuexyz */
    ASSERT_EQ(S.requests, 2);
    free(cl);
}

TEST(http_conn_answers_413_for_a_body_over_the_limit)
{
    struct http_limits lim = default_limits();
    srv_start(&lim);
    struct client *cl = calloc(1, sizeof *cl);
    cl->fn = cl_big_body;
    run_with_client(cl);
    ASSERT(strncmp(cl->buf, "HTTP/1.1 413 ", 13) == 0);
    ASSERT(strstr(cl->buf, "Connection: close\r\n") != NULL);
    ASSERT(strstr(cl->buf, "\"type\":\"invalid_request_error\"") != NULL);
    ASSERT(cl->eof);
    ASSERT_EQ(S.requests, 0);
    free(cl);
}

static void cl_chunked_big_body(struct client *cl)
{
    int fd = cl_connect(cl->port, 0);
    cl_sends(fd, "POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n");
    char chunk[600];
    memset(chunk, 'a', sizeof chunk);
    for (int i = 0; i < 3; i++) {
        cl_sends(fd, "258\r\n");
        cl_send(fd, chunk, sizeof chunk);
        cl_sends(fd, "\r\n");
    }
    cl_read_until(cl, fd, NULL, 0, 3000);
    close(fd);
}

TEST(http_conn_answers_413_for_a_chunked_body_over_the_limit)
{
    struct http_limits lim = default_limits();
    srv_start(&lim);
    struct client *cl = calloc(1, sizeof *cl);
    cl->fn = cl_chunked_big_body;
    run_with_client(cl);
    ASSERT(strncmp(cl->buf, "HTTP/1.1 413 ", 13) == 0);
    free(cl);
}

static void cl_big_headers(struct client *cl)
{
    int fd = cl_connect(cl->port, 0);
    cl_sends(fd, "GET / HTTP/1.1\r\nHost: x\r\n");
    char line[1100];
    memset(line, 'v', sizeof line);
    memcpy(line, "X-Big: ", 7);
    line[sizeof line - 2] = '\r';
    line[sizeof line - 1] = '\n';
    for (int i = 0; i < 10; i++)
        cl_send(fd, line, sizeof line);
    cl_sends(fd, "\r\n");
    cl_read_until(cl, fd, NULL, 0, 3000);
    close(fd);
}

TEST(http_conn_answers_431_for_headers_over_the_limit)
{
    struct http_limits lim = default_limits();
    srv_start(&lim);
    struct client *cl = calloc(1, sizeof *cl);
    cl->fn = cl_big_headers;
    run_with_client(cl);
    ASSERT(strncmp(cl->buf, "HTTP/1.1 431 ", 13) == 0);
    ASSERT_EQ(S.requests, 0);
    free(cl);
}

static void cl_slowloris(struct client *cl)
{
    int fd = cl_connect(cl->port, 0);
    cl_sends(fd, "GET / HTTP/1.1\r\nHo");
    for (int i = 0; i < 10 && !cl->eof; i++) {
        cl_sends(fd, "s"); /* a byte at a time does not extend the deadline */
        cl_read_until(cl, fd, "\r\n\r\n", 1, 60);
    }
    cl_read_until(cl, fd, NULL, 0, 2000);
    close(fd);
}

TEST(http_conn_answers_408_when_a_request_outlives_the_read_timeout)
{
    struct http_limits lim = default_limits();
    lim.read_timeout_ms = 200;
    srv_start(&lim);
    struct client *cl = calloc(1, sizeof *cl);
    cl->fn = cl_slowloris;
    run_with_client(cl);
    ASSERT(strncmp(cl->buf, "HTTP/1.1 408 ", 13) == 0);
    ASSERT(cl->eof);
    ASSERT_EQ(S.requests, 0);
    free(cl);
}

static void cl_keepalive(struct client *cl)
{
    int fd = cl_connect(cl->port, 0);
    cl_sends(fd, "GET /one HTTP/1.1\r\nHost: x\r\n\r\n");
    cl_read_until(cl, fd, "/one 0", 1, 2000);
    cl_sends(fd, "GET /two HTTP/1.1\r\nHost: x\r\n\r\n");
    cl_read_until(cl, fd, "/two 0", 1, 2000);
    cl->n = cl->eof;                      /* still open after two requests */
    cl_read_until(cl, fd, NULL, 0, 3000); /* then idle: the server closes */
    close(fd);
}

TEST(http_conn_keeps_alive_then_closes_when_idle)
{
    struct http_limits lim = default_limits();
    lim.keepalive_timeout_ms = 300;
    srv_start(&lim);
    struct client *cl = calloc(1, sizeof *cl);
    cl->fn = cl_keepalive;
    run_with_client(cl);
    ASSERT_EQ(cl->n, 0);
    ASSERT(cl->eof);
    ASSERT_EQ(S.requests, 2);
    ASSERT_EQ(S.accepted, 1);
    ASSERT_EQ(S.closes, 1);
    ASSERT_EQ(S.frees, 1);
    free(cl);
}

static void cl_connection_close(struct client *cl)
{
    int fd = cl_connect(cl->port, 0);
    cl_sends(fd, "GET /bye HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
                 "GET /never HTTP/1.1\r\nHost: x\r\n\r\n");
    cl_read_until(cl, fd, NULL, 0, 3000);
    close(fd);
}

TEST(http_conn_closes_after_connection_close)
{
    struct http_limits lim = default_limits();
    srv_start(&lim);
    struct client *cl = calloc(1, sizeof *cl);
    cl->fn = cl_connection_close;
    run_with_client(cl);
    ASSERT(strstr(cl->buf, "/bye 0") != NULL);
    ASSERT(strstr(cl->buf, "Connection: close\r\n") != NULL);
    ASSERT(strstr(cl->buf, "/never") == NULL);
    ASSERT(cl->eof);
    ASSERT_EQ(S.requests, 1);
    free(cl);
}

static void cl_stream(struct client *cl)
{
    int fd = cl_connect(cl->port, 0);
    cl_sends(fd, "GET /stream HTTP/1.1\r\nHost: x\r\n\r\n");
    cl_read_until(cl, fd, "0\r\n\r\n", 1, 2000);
    cl_sends(fd, "GET /stream HTTP/1.0\r\n\r\n");
    cl->n = (int)cl->len;
    cl_read_until(cl, fd, NULL, 0, 2000);
    close(fd);
}

TEST(http_conn_streams_chunked_on_1_1_and_raw_until_close_on_1_0)
{
    struct http_limits lim = default_limits();
    srv_start(&lim);
    struct client *cl = calloc(1, sizeof *cl);
    cl->fn = cl_stream;
    run_with_client(cl);
    const char *want11 = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                         "Transfer-Encoding: chunked\r\nX-Test: 1\r\nConnection: keep-alive\r\n\r\n"
                         "5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n";
    ASSERT_EQ(cl->n, strlen(want11));
    ASSERT(memcmp(cl->buf, want11, strlen(want11)) == 0);
    const char *want10 = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                         "X-Test: 1\r\nConnection: close\r\n\r\nhello world";
    ASSERT_STREQ(cl->buf + cl->n, want10);
    ASSERT(cl->eof);
    free(cl);
}

static void cl_malformed(struct client *cl)
{
    int fd = cl_connect(cl->port, 0);
    cl_sends(fd, "GET / HTTP/1.1\r\nBad Header Line\r\n\r\n");
    cl_read_until(cl, fd, NULL, 0, 2000);
    close(fd);
}

TEST(http_conn_without_an_error_schema_answers_plain_text)
{
    struct http_limits lim = default_limits();
    srv_start(&lim);
    S.ops.error_body = NULL; /* the transport alone knows status lines, not JSON */
    struct client *cl = calloc(1, sizeof *cl);
    cl->fn = cl_malformed;
    run_with_client(cl);
    ASSERT(strncmp(cl->buf, "HTTP/1.1 400 Bad Request\r\n", 26) == 0);
    ASSERT(strstr(cl->buf, "Content-Type: text/plain") != NULL);
    ASSERT(strstr(cl->buf, "\r\n\r\n400 Bad Request: malformed HTTP request") != NULL);
    ASSERT(strstr(cl->buf, "{\"error\"") == NULL);
    free(cl);
}

TEST(http_status_text_is_the_rfc_reason_phrase)
{
    ASSERT_STREQ(http_status_text(431), "Request Header Fields Too Large");
    ASSERT_STREQ(http_status_text(413), "Content Too Large");
    ASSERT_STREQ(http_status_text(505), "HTTP Version Not Supported");
    /* statuses the server sends (a new session, an expired stream, a
     * snapshot of another model): each its own phrase, not "OK" or "Bad Request" */
    ASSERT_STREQ(http_status_text(201), "Created");
    ASSERT_STREQ(http_status_text(410), "Gone");
    ASSERT_STREQ(http_status_text(422), "Unprocessable Content");
}

TEST(http_conn_answers_400_to_a_malformed_request)
{
    struct http_limits lim = default_limits();
    srv_start(&lim);
    struct client *cl = calloc(1, sizeof *cl);
    cl->fn = cl_malformed;
    run_with_client(cl);
    ASSERT(strncmp(cl->buf, "HTTP/1.1 400 ", 13) == 0);
    ASSERT(strstr(cl->buf, "{\"error\":{\"message\":") != NULL);
    ASSERT(cl->eof);
    free(cl);
}

/* Header values folded onto a further line (obs-fold, RFC 9112 5.2), each
 * sent in the pieces given (the server reads each piece on its own): every
 * one must be refused with 400, whatever line the fold starts from and
 * wherever the reads cut it. A Transfer-Encoding folded from an empty first
 * line was taken as chunked (a request smuggling vector behind a proxy that
 * reads the header otherwise). */
static const char *const folds[][3] = {
    {"POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding:\r\n chunked\r\n\r\n"
     "2\r\n{}\r\n0\r\n\r\n"},
    {"POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding:\r\n",
     " chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n"},
    {"POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding:\r\n\t",
     "chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n"},
    {"POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding:  ", "\r\n", "  chunked\r\n\r\n0\r\n\r\n"},
    {"GET /x HTTP/1.1\r\nHost: x\r\nX-Note: a\r\n b\r\n\r\n"},
    {"GET /x HTTP/1.1\r\nHost: x\r\nX-Note: a", "\r\n b\r\n\r\n"},
    {"GET /x HTTP/1.1\r\nHost: x\r\nX-Note: a\r\n", " b\r\n\r\n"},
};
#define N_FOLDS (sizeof folds / sizeof folds[0])

static int fold_refused[N_FOLDS];

static void cl_folds(struct client *cl)
{
    int one = 1;
    for (size_t i = 0; i < N_FOLDS; i++) {
        int fd = cl_connect(cl->port, 0);
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        for (int k = 0; k < 3 && folds[i][k]; k++) {
            if (k > 0)
                ms_sleep(50); /* the server reads what came so far */
            cl_sends(fd, folds[i][k]);
        }
        cl->len = 0;
        cl->eof = 0;
        cl_read_until(cl, fd, NULL, 0, 2000);
        cl->buf[cl->len] = 0;
        fold_refused[i] = strncmp(cl->buf, "HTTP/1.1 400 ", 13) == 0 &&
                          strstr(cl->buf, "folded") != NULL && cl->eof;
        close(fd);
    }
}

TEST(http_conn_refuses_folded_header_values_wherever_the_reads_cut_them)
{
    struct http_limits lim = default_limits();
    srv_start(&lim);
    struct client *cl = calloc(1, sizeof *cl);
    cl->fn = cl_folds;
    run_with_client(cl);
    size_t refused = 0;
    for (size_t i = 0; i < N_FOLDS; i++) {
        if (!fold_refused[i])
            fprintf(stderr, "fold case %zu was not refused\n", i);
        refused += fold_refused[i] != 0;
    }
    ASSERT_EQ(refused, N_FOLDS);
    ASSERT_EQ(S.requests, 0); /* none reached the handler */
    free(cl);
}

/* The body budget holds what bodies have taken, not what they announce: a
 * POST that announces 100,000 bytes and sends 10, and a GET (no key needed
 * for /health) that sends most of 100,000, must not crowd a real 50,000-byte
 * POST out of a 120,000-byte budget. Both reserved their Content-Length (or
 * kept the GET's body) before, and the POST got 503. */
static void cl_budget(struct client *cl)
{
    static char body[100000];
    memset(body, 'b', sizeof body);
    int hold = cl_connect(cl->port, 0);
    cl_sends(hold, "POST /hold HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n0123456789");
    int get = cl_connect(cl->port, 0);
    cl_sends(get, "GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n");
    cl_send(get, body, 99000);
    ms_sleep(200); /* the server has read both */
    int fd = cl_connect(cl->port, 0);
    cl_sends(fd, "POST /real HTTP/1.1\r\nHost: x\r\nContent-Length: 50000\r\n"
                 "Connection: close\r\n\r\n");
    cl_send(fd, body, 50000);
    cl_read_until(cl, fd, NULL, 0, 3000);
    close(fd);
    cl_send(get, body, 1000); /* the GET completes: its body was read and dropped */
    cl_read_until(cl, get, "/health 0", 1, 3000);
    close(get);
    close(hold);
}

TEST(http_conn_body_budget_holds_what_bodies_took_not_what_they_announce)
{
    static size_t budget;
    struct http_limits lim = budget_limits(&budget);
    srv_start(&lim);
    struct client *cl = calloc(1, sizeof *cl);
    cl->fn = cl_budget;
    run_with_client(cl);
    ASSERT(strncmp(cl->buf, "HTTP/1.1 200 ", 13) == 0);
    ASSERT(strstr(cl->buf, "/real 50000") != NULL);
    ASSERT(strstr(cl->buf, "/health 0") != NULL); /* answered once all of it was read */
    ASSERT_EQ(budget, 0);                         /* every connection gave back what it held */
    free(cl);
}

static void cl_one_post(struct client *cl)
{
    int fd = cl_connect(cl->port, 0);
    cl_sends(fd, "POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: close\r\n\r\n"
                 "hello");
    cl_read_until(cl, fd, NULL, 0, 3000);
    close(fd);
}

/* With no bound (max_body_total 0) nothing is counted in the shared budget,
 * so nothing may be taken out of it (it wrapped below zero). */
TEST(http_conn_body_budget_without_a_bound_stays_zero)
{
    static size_t budget;
    struct http_limits lim = default_limits();
    lim.max_body_total = 0;
    budget = 0;
    lim.body_budget = &budget;
    srv_start(&lim);
    struct client *cl = calloc(1, sizeof *cl);
    cl->fn = cl_one_post;
    run_with_client(cl);
    ASSERT(strstr(cl->buf, "/x 5") != NULL);
    ASSERT_EQ(budget, 0);
    free(cl);
}

/* Reads a /big response at about 1.6 MB/s (32 KiB every 20 ms) until the
 * server closes; returns the body bytes read. read_after_ms: nothing is read
 * for that long first. */
static size_t read_big(int port, int read_after_ms)
{
    int fd = cl_connect(port, 8192);
    cl_sends(fd, "GET /big HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    ms_sleep(read_after_ms);
    static char buf[32768];
    size_t total = 0;
    for (int i = 0; i < 1000; i++) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        if (poll(&pfd, 1, 3000) <= 0)
            break;
        ssize_t r = recv(fd, buf, sizeof buf, 0);
        if (r <= 0)
            break;
        total += (size_t)r;
        ms_sleep(20);
    }
    close(fd);
    return total;
}

static size_t big_steady, big_stopped;

static void cl_big_reader(struct client *cl)
{
    big_steady = read_big(cl->port, 0);
    big_stopped = read_big(cl->port, 1000);
}

/* A whole response is one write, which on_write sees only when it is done:
 * a client reading it steadily for longer than the stall timeout was cut off
 * as if it had stopped. It must get all of it; one that reads nothing for
 * longer than the timeout must still be closed. */
TEST(http_conn_a_steady_reader_of_a_large_response_is_not_taken_for_a_stalled_one)
{
    struct http_limits lim = default_limits();
    lim.write_stall_timeout_ms = 300;
    lim.min_read_rate = 100000; /* the steady reader takes about 1.6 MB/s */
    lim.sndbuf = 16384;
    srv_start(&lim);
    struct client *cl = calloc(1, sizeof *cl);
    cl->fn = cl_big_reader;
    run_with_client(cl);
    ASSERT(big_steady > BIG_RESPONSE); /* the body and its headers */
    ASSERT(big_stopped < BIG_RESPONSE);
    free(cl);
}

static void cl_trailers(struct client *cl)
{
    int fd = cl_connect(cl->port, 0);
    cl_sends(fd, "POST /sid HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                 "Connection: close\r\n\r\n2\r\n{}\r\n0\r\n"
                 "X-Session-Id: from-trailer\r\nAuthorization: Bearer from-trailer\r\n\r\n");
    cl_read_until(cl, fd, NULL, 0, 3000);
    close(fd);
}

/* Fields in a chunked body's trailer are not headers: a session id or a key
 * sent there (past a proxy that routes on the headers) must not count. */
TEST(http_conn_ignores_fields_in_a_chunked_trailer)
{
    struct http_limits lim = default_limits();
    srv_start(&lim);
    struct client *cl = calloc(1, sizeof *cl);
    cl->fn = cl_trailers;
    run_with_client(cl);
    ASSERT(strncmp(cl->buf, "HTTP/1.1 200 ", 13) == 0);
    ASSERT(strstr(cl->buf, "sid= auth=") != NULL);
    ASSERT(strstr(cl->buf, "from-trailer") == NULL);
    free(cl);
}

/* 100 Continue promises that the headers passed every check: with the body
 * budget drawn as bodies grow, a client that announces more than the budget
 * has room for was told to go on, then refused half way through its body. A
 * GET's body is dropped, not refused: it still gets its 100 Continue. */
static void cl_expect_budget(struct client *cl)
{
    static char body[100000];
    memset(body, 'b', sizeof body);
    int hold = cl_connect(cl->port, 0);
    cl_sends(hold, "POST /hold HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n");
    cl_send(hold, body, 99000);
    ms_sleep(200); /* the server holds 100,001 of its 120,000 */
    int fd = cl_connect(cl->port, 0);
    cl_sends(fd, "POST /late HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                 "Content-Length: 50000\r\n\r\n");
    cl_read_until(cl, fd, NULL, 0, 1000);
    close(fd);
    int get = cl_connect(cl->port, 0);
    cl_sends(get, "GET /g HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 5\r\n"
                  "Connection: close\r\n\r\n");
    cl_read_until(cl, get, "100 Continue", 2, 1000);
    cl_sends(get, "hello");
    cl_read_until(cl, get, "/g 0", 1, 2000);
    close(get);
    close(hold);
}

TEST(http_conn_sends_100_continue_only_for_a_body_the_budget_has_room_for)
{
    static size_t budget;
    struct http_limits lim = budget_limits(&budget);
    srv_start(&lim);
    struct client *cl = calloc(1, sizeof *cl);
    cl->fn = cl_expect_budget;
    run_with_client(cl);
    const char *first = strstr(cl->buf, "HTTP/1.1 503 ");
    ASSERT(first == cl->buf); /* /late: refused from its headers, no 100 first */
    const char *cont = strstr(cl->buf, "100 Continue");
    ASSERT(cont != NULL && cont > first); /* /g's */
    ASSERT(strstr(cl->buf, "/g 0") != NULL);
    ASSERT_EQ(budget, 0);
    free(cl);
}

/* A GET's chunked body is read and dropped like one with Content-Length: a
 * client that asked for 100 Continue gets it, or it waits for nothing. */
static void cl_expect_chunked_get(struct client *cl)
{
    int fd = cl_connect(cl->port, 0);
    cl_sends(fd, "GET /cg HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                 "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n");
    cl_read_until(cl, fd, "100 Continue", 1, 1000);
    cl_sends(fd, "5\r\nhello\r\n0\r\n\r\n");
    cl_read_until(cl, fd, "/cg 0", 1, 2000);
    close(fd);
}

TEST(http_conn_sends_100_continue_for_a_chunked_body_it_drops)
{
    struct http_limits lim = default_limits();
    srv_start(&lim);
    struct client *cl = calloc(1, sizeof *cl);
    cl->fn = cl_expect_chunked_get;
    run_with_client(cl);
    ASSERT(strncmp(cl->buf, "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 ", 37) == 0);
    ASSERT(strstr(cl->buf, "/cg 0") != NULL);
    free(cl);
}

static void cl_hangup(struct client *cl)
{
    int fd = cl_connect(cl->port, 0);
    cl_sends(fd, "GET /hang HTTP/1.1\r\nHost: x\r\n\r\n");
    ms_sleep(100);
    close(fd); /* mid-request */
    ms_sleep(200);
}

TEST(http_conn_closes_once_and_frees_after_close_when_the_client_hangs_up)
{
    struct http_limits lim = default_limits();
    srv_start(&lim);
    struct client *cl = calloc(1, sizeof *cl);
    cl->fn = cl_hangup;
    run_with_client(cl);
    ASSERT_EQ(S.requests, 1);
    ASSERT_EQ(S.closed_waiting, 1);
    ASSERT_EQ(S.closes, 1);
    ASSERT_EQ(S.frees, 1);
    ASSERT_EQ(S.free_before_close, 0);
    ASSERT_STREQ(S.order, "cf");
    free(cl);
}

static void cl_slow_reader(struct client *cl)
{
    int fd = cl_connect(cl->port, 4096);
    cl_sends(fd, "GET /flood HTTP/1.1\r\nHost: x\r\n\r\n");
    ms_sleep(500); /* not reading: the server's queue fills and it pauses */
    size_t total = 0;
    char buf[65536];
    for (;;) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        if (poll(&pfd, 1, 3000) <= 0)
            break;
        ssize_t r = recv(fd, buf, sizeof buf, 0);
        if (r <= 0)
            break;
        total += (size_t)r;
        if (total >= 4u * 1024 * 1024 && memmem(buf, (size_t)r, "0\r\n\r\n", 5))
            break;
    }
    cl->n = (int)(total / 1024);
    close(fd);
}

TEST(http_conn_pauses_at_high_water_and_resumes_at_low_water)
{
    struct http_limits lim = default_limits();
    srv_start(&lim);
    S.flood_target = 4u * 1024 * 1024;
    struct client *cl = calloc(1, sizeof *cl);
    cl->fn = cl_slow_reader;
    run_with_client(cl);
    ASSERT(S.pauses >= 1);
    ASSERT(S.resumes >= 1);
    ASSERT(S.max_queue <= lim.high_water + 16384 + 64);
    ASSERT(cl->n >= 4096); /* every byte arrived */
    ASSERT_EQ(S.stalls, 0);
    free(cl);
}

static void cl_stalled_reader(struct client *cl)
{
    int fd = cl_connect(cl->port, 4096);
    cl_sends(fd, "GET /flood HTTP/1.1\r\nHost: x\r\n\r\n");
    ms_sleep(1200); /* never reads: closed by the write-stall timeout */
    close(fd);
}

TEST(http_conn_closes_a_client_that_stops_reading_after_the_stall_timeout)
{
    struct http_limits lim = default_limits();
    lim.write_stall_timeout_ms = 300;
    srv_start(&lim);
    S.flood_target = 64u * 1024 * 1024;
    struct client *cl = calloc(1, sizeof *cl);
    cl->fn = cl_stalled_reader;
    run_with_client(cl);
    ASSERT_EQ(S.stalls, 1);
    ASSERT_EQ(S.closed_streaming, 1);
    ASSERT(S.flood_total < 16u * 1024 * 1024); /* bounded by the pause, not the target */
    ASSERT_EQ(S.free_before_close, 0);
    free(cl);
}

static void cl_held(struct client *cl)
{
    int fd = cl_connect(cl->port, 0);
    cl_sends(fd, "GET /held HTTP/1.1\r\nHost: x\r\n\r\n");
    cl_read_until(cl, fd, ": keep-alive\n", 2, 3000);
    close(fd);
}

TEST(http_conn_sends_sse_keepalives_and_commits_a_held_stream_on_the_first_tick)
{
    struct http_limits lim = default_limits();
    lim.sse_keepalive_ms = 100;
    srv_start(&lim);
    struct client *cl = calloc(1, sizeof *cl);
    cl->fn = cl_held;
    run_with_client(cl);
    ASSERT_EQ(S.commits, 1);
    ASSERT(strncmp(cl->buf, "HTTP/1.1 200 OK\r\n", 17) == 0);
    const char *body = strstr(cl->buf, "\r\n\r\n");
    ASSERT(body != NULL);
    /* a comment line alone: no blank line, which would dispatch an empty event */
    ASSERT(strncmp(body + 4, "d\r\n: keep-alive\n\r\nd\r\n: keep-alive\n\r\n", 36) == 0);
    free(cl);
}

/* An error response is the last: the server half-closes after it, discards
 * what the client still sends (no reset, so the client reads the answer),
 * and closes on the client's FIN. */
static void cl_linger(struct client *cl)
{
    int fd = cl_connect(cl->port, 0);
    cl_sends(fd, "POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n");
    char more[1000];
    memset(more, 'a', sizeof more);
    for (int i = 0; i < 4; i++) { /* the body the server refused keeps coming */
        cl_send(fd, more, sizeof more);
        ms_sleep(20);
    }
    cl_read_until(cl, fd, NULL, 0, 3000);           /* the 413, then the server's FIN */
    cl->n = (int)send(fd, "late", 4, MSG_NOSIGNAL); /* our half is still open */
    ms_sleep(100);
    close(fd);
    ms_sleep(100);
}

TEST(http_conn_lingers_after_an_error_response_until_the_clients_fin)
{
    struct http_limits lim = default_limits();
    srv_start(&lim);
    struct client *cl = calloc(1, sizeof *cl);
    cl->fn = cl_linger;
    run_with_client(cl);
    ASSERT(strncmp(cl->buf, "HTTP/1.1 413 ", 13) == 0);
    ASSERT(strstr(cl->buf, "Connection: close\r\n") != NULL);
    ASSERT(cl->eof);
    ASSERT_EQ(cl->n, 4);
    ASSERT_EQ(S.requests, 0);
    ASSERT_EQ(S.closes, 1);
    ASSERT_EQ(S.closed_in[HTTP_CONN_LINGERING], 1);
    free(cl);
}

/* One idle keep-alive connection, then a request that shuts the server down:
 * the idle one closes at once, the busy one after its response. */
static void cl_shutdown(struct client *cl)
{
    int a = cl_connect(cl->port, 0);
    cl_sends(a, "GET /first HTTP/1.1\r\nHost: x\r\n\r\n");
    cl_read_until(cl, a, "/first 0", 1, 2000);
    int b = cl_connect(cl->port, 0);
    ms_sleep(50); /* b is accepted before its request arrives */
    cl_sends(b, "GET /shutdown HTTP/1.1\r\nHost: x\r\n\r\n");
    size_t before = cl->len;
    cl_read_until(cl, b, NULL, 0, 2000);
    cl->n = (int)(cl->len - before); /* b's bytes */
    int b_eof = cl->eof;
    cl->eof = 0;
    cl_read_until(cl, a, NULL, 0, 2000);
    cl->eof = cl->eof && b_eof;
    close(a);
    close(b);
}

TEST(http_conn_finish_and_close_closes_idle_at_once_and_busy_after_the_response)
{
    struct http_limits lim = default_limits();
    srv_start(&lim);
    struct client *cl = calloc(1, sizeof *cl);
    cl->fn = cl_shutdown;
    run_with_client(cl);
    ASSERT_EQ(S.requests, 2);
    const char *bye = strstr(cl->buf, "HTTP/1.1 200 OK\r\n");
    ASSERT(bye != NULL);
    bye = strstr(bye + 1, "HTTP/1.1 200 OK\r\n"); /* b's response */
    ASSERT(bye != NULL);
    ASSERT(strstr(bye, "Connection: close\r\n") != NULL);
    ASSERT(strstr(bye, "\r\n\r\nbye") != NULL);
    ASSERT(cl->eof); /* both closed by the server */
    ASSERT_EQ(S.closes, 2);
    ASSERT_EQ(S.closed_in[HTTP_CONN_READING], 1); /* a: idle */
    ASSERT_EQ(S.free_before_close, 0);
    free(cl);
}

/* A request marked as a coming stream (HELD) that is answered whole before
 * any keep-alive tick: an ordinary response, and the connection persists. */
static void cl_held_answered_whole(struct client *cl)
{
    int fd = cl_connect(cl->port, 0);
    cl_sends(fd, "GET /slowheld HTTP/1.1\r\nHost: x\r\n\r\n");
    cl_read_until(cl, fd, "/slowheld 0", 1, 2000);
    cl_sends(fd, "GET /after HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    cl_read_until(cl, fd, NULL, 0, 2000);
    close(fd);
}

TEST(http_conn_answers_a_held_request_whole_and_keeps_the_connection)
{
    struct http_limits lim = default_limits();
    srv_start(&lim);
    struct client *cl = calloc(1, sizeof *cl);
    cl->fn = cl_held_answered_whole;
    uv_timer_start(&S.later, on_later, 50, 50);
    run_with_client(cl);
    ASSERT(strncmp(cl->buf, "HTTP/1.1 200 OK\r\n", 17) == 0);
    ASSERT(strstr(cl->buf, "Content-Length: 11\r\n") != NULL);
    ASSERT(strstr(cl->buf, "Transfer-Encoding") == NULL);
    ASSERT(strstr(cl->buf, "/after 0") != NULL);
    ASSERT_EQ(S.requests, 2);
    ASSERT_EQ(S.accepted, 1);
    ASSERT_EQ(S.commits, 0);
    free(cl);
}

TEST_MAIN()
