/*
 * fuzz_http_conn.c: libFuzzer target for the HTTP connection state machine
 * (server/http_conn.c with llhttp in strict mode) on a real libuv loop.
 *
 * Each input is one client connection. A listener on 127.0.0.1:0 and the loop
 * are made once and reused; per input a plain client socket connects, the
 * server side is accepted with http_conn_accept, and the request bytes are
 * written in pieces with the loop run (UV_RUN_NOWAIT) between them, so every
 * parser callback sees data cut at arbitrary places. Every request is
 * answered, at once or between later pieces, with a small response, an error,
 * a short stream or a stream big enough to cross the write queue's high-water
 * mark (the client's receive buffer is small and it reads only when the input
 * says so), which runs pipelining, keep-alive, backpressure and lingering.
 * Then the client hangs up (FIN, reset, or half-close and read to EOF) and
 * the loop runs until the connection is freed. Checked: on_close then on_free,
 * each exactly once; no handle left on the loop but the listener; what the
 * client read starts with a status line.
 *
 * Input layout (missing bytes read as 0):
 *   [0]      low 4 bits: number k of piece lengths that follow the header
 *   [1]      answer kinds, 2 bits per request (request i uses bits 2*(i%4)):
 *            0 respond, 1 short stream, 2 error, 3 big stream
 *   [2]      bit (i%8): answer request i later, between pieces, not at once
 *   [3]      bit 0: the client drains its socket between pieces
 *            bits 1-2: hang-up: 0 close, 1 half-close and read to EOF, 2 reset
 *            bit 3: http_conn_finish_and_close after the second answer
 *            bit 4: http_conn_hold_stream before answering later
 *            bit 5: hang up with a request still waiting for its answer
 *            bit 6: tight timeouts (1-2 ms; SSE keep-alive ticks commit held
 *                   streams) and a 1 ms pause after each of the first pieces,
 *                   so the read, keep-alive and write-stall deadlines fire
 *            bit 7: split invariance (without bit 6): the same bytes are sent
 *                   once whole and once in the pieces; the requests the
 *                   server dispatched (line, headers kept, body) and the
 *                   error it answered with must agree, up to where the
 *                   shorter run stopped (the client may hang up first)
 *   [4..4+k) piece lengths minus one; what is left after them is one last piece
 *   rest     the bytes the client sends
 *
 * Build and run (clang only):
 *
 *   cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DSTREAMSINK_FUZZ=ON \
 *         -DSTREAMSINK_CUDA=OFF
 *   cmake --build build-fuzz --target fuzz_http_conn
 *   cp -r tests/fuzz/corpus/fuzz_http_conn /tmp/http-corpus
 *   build-fuzz/tests/fuzz/fuzz_http_conn /tmp/http-corpus -max_total_time=60 \
 *         -max_len=20000 -timeout=10
 *
 * (scripts/fuzz.sh does all of that for every target.) With FUZZ_HTTP_VERBOSE
 * set, each request the server dispatched and what the client received are
 * printed, to see what an input does:
 *   FUZZ_HTTP_VERBOSE=1 build-fuzz/tests/fuzz/fuzz_http_conn <file>
 */
#include "http_conn.h"
#include "log.h"

#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define HEADER_BYTES 4
#define BIG_PIECE 1024
#define BIG_PIECES 24 /* 24 KiB: well past high_water below */
#define MAX_PAUSES 4  /* tight-timeout inputs pause after this many pieces at most */
#define MAX_RECORD 64 /* dispatched requests remembered for the split-invariance check */
#define OUR_ERROR 422 /* the status of our own error answers: not one http_conn rejects with */

enum answer { ANSWER_RESPOND = 0, ANSWER_STREAM, ANSWER_ERROR, ANSWER_BIG_STREAM };

/* Made once, reused by every input. */
static struct {
    int ready;
    uv_loop_t loop;
    uv_tcp_t listener;
    int port;
    struct http_limits lim, lim_tight;
    struct http_conn_ops ops;
    int verbose;
} G;

/* What the server made of one connection's bytes. */
struct record {
    uint64_t req[MAX_RECORD]; /* a hash of each dispatched request */
    int n;                    /* requests dispatched */
    int reject;               /* status of http_conn's own error answer, or 0 */
};

/* One input's connection. */
static struct {
    uint8_t kinds, later, flags;
    struct http_conn *conn;    /* accepted, on_close not yet run */
    struct http_conn *pending; /* a request to answer between pieces */
    int accepted, requests, answers, closes, frees;
    int free_before_close;
    struct record rec;
} R;

static void fail(const char *what)
{
    fprintf(stderr, "fuzz_http_conn: %s (accepted %d, requests %d, closes %d, frees %d)\n", what,
            R.accepted, R.requests, R.closes, R.frees);
    abort();
}

static void answer(struct http_conn *c, int idx)
{
    static char big[BIG_PIECE];
    enum answer kind = (enum answer)((R.kinds >> (2 * (idx % 4))) & 3);
    char body[64];
    int n;

    switch (kind) {
    case ANSWER_RESPOND:
        n = snprintf(body, sizeof body, "%d %zu", idx, c->req.body_len);
        http_conn_respond(c, 200, "text/plain", NULL, body, (size_t)n);
        break;
    case ANSWER_STREAM:
        http_conn_stream_begin(c, 200, "text/event-stream", "Cache-Control: no-cache\r\n");
        http_conn_stream_write(c, "data: a\n\n", 9);
        http_conn_stream_write(c, "", 0);
        http_conn_stream_write(c, "data: [DONE]\n\n", 14);
        http_conn_stream_end(c);
        break;
    case ANSWER_ERROR:
        http_conn_respond_error(c, OUR_ERROR, "prompt", "invalid_value", NULL, "bad \"prompt\"\n");
        break;
    case ANSWER_BIG_STREAM:
        memset(big, 'x', sizeof big);
        http_conn_stream_begin(c, 200, "application/octet-stream", NULL);
        for (int i = 0; i < BIG_PIECES; i++)
            http_conn_stream_write(c, big, sizeof big);
        http_conn_stream_end(c);
        break;
    }
    R.answers++;
    if ((R.flags & 8) && R.answers == 2 && R.conn == c)
        http_conn_finish_and_close(c);
}

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ULL;
    return h ^ n; /* lengths too, so fields cannot slide into each other */
}

static uint64_t request_hash(const struct http_request *r)
{
    int nums[5] = {r->method, r->http_major, r->http_minor, r->keep_alive, r->expect_continue};
    uint64_t h = fnv(0xcbf29ce484222325ULL, nums, sizeof nums);
    h = fnv(h, r->url, r->url_len);
    h = fnv(h, r->authorization, strlen(r->authorization));
    h = fnv(h, r->session_id, strlen(r->session_id));
    return fnv(h, r->body ? r->body : "", r->body_len);
}

static void on_request(struct http_conn *c, void *arg)
{
    (void)arg;
    int idx = R.requests++;
    if (c != R.conn)
        fail("a request on a connection that is not open");
    if (c->state != HTTP_CONN_WAITING)
        fail("on_request outside WAITING");
    if (c->req.body && c->req.body[c->req.body_len] != 0)
        fail("request body not NUL-terminated");
    if (c->req.body_len > G.lim.max_body || (c->req.body_len > 0 && !c->req.body))
        fail("request body over max_body, or missing");
    if (c->req.url_len >= HTTP_URL_MAX || strlen(c->req.url) != c->req.url_len)
        fail("url length");
    if (R.rec.n < MAX_RECORD)
        R.rec.req[R.rec.n] = request_hash(&c->req);
    if (G.verbose)
        fprintf(stderr,
                "\n[request %d: method %d HTTP/%d.%d keep-alive %d expect %d url '%s' auth '%s' "
                "session '%s' body %zu]\n",
                idx, c->req.method, c->req.http_major, c->req.http_minor, c->req.keep_alive,
                c->req.expect_continue, c->req.url, c->req.authorization, c->req.session_id,
                c->req.body_len);
    R.rec.n++;
    if ((R.later >> (idx % 8)) & 1) {
        if (R.pending)
            fail("two requests waiting at once");
        R.pending = c;
        if (R.flags & 16)
            http_conn_hold_stream(c);
        return;
    }
    answer(c, idx);
}

/* A keep-alive tick on a held request: start its stream; the rest of it
 * goes out when the request is answered. */
static void on_stream_commit(struct http_conn *c, void *arg)
{
    (void)arg;
    if (c != R.pending || c->state != HTTP_CONN_HELD)
        fail("on_stream_commit for a request that is not held");
    http_conn_stream_begin(c, 200, "text/event-stream", NULL);
}

static void on_close(struct http_conn *c, void *arg)
{
    (void)arg;
    if (c != R.conn)
        fail("on_close for a connection that is not open");
    R.closes++;
    R.conn = NULL;
    if (c->status != 0 && c->status != 200 && c->status != OUR_ERROR)
        R.rec.reject = c->status; /* the response in flight is http_conn's own error */
    if (R.pending == c)
        R.pending = NULL;
}

static void on_free(struct http_conn *c, void *arg)
{
    (void)c;
    (void)arg;
    R.frees++;
    if (R.closes == 0)
        R.free_before_close++;
}

static void on_connection(uv_stream_t *l, int status)
{
    struct http_conn *c;
    if (status < 0)
        return;
    if (http_conn_accept(l, (R.flags & 64) ? &G.lim_tight : &G.lim, &G.ops, &c) < 0)
        return;
    R.accepted++;
    R.conn = c;
}

static void setup(void)
{
    struct sockaddr_in a;
    struct sockaddr_in got;
    int len = sizeof got;

    log_set_level(LOG_ERROR);
    signal(SIGPIPE, SIG_IGN); /* as the server does: a vanished peer is a write error */
    G.lim = (struct http_limits){
        .max_header_bytes = 2048,
        .max_body = 1024,
        .high_water = 8192,
        .low_water = 2048,
        .read_timeout_ms = 5000, /* never within one input, unless tight */
        .keepalive_timeout_ms = 5000,
        .write_stall_timeout_ms = 5000,
        .sse_keepalive_ms = 0,
        .sndbuf = 4096,
        .extra_headers = "X-Fuzz: 1\r\n",
    };
    G.lim_tight = G.lim;
    G.lim_tight.read_timeout_ms = 2;
    G.lim_tight.keepalive_timeout_ms = 1;
    G.lim_tight.write_stall_timeout_ms = 1;
    G.lim_tight.sse_keepalive_ms = 1;
    G.ops = (struct http_conn_ops){.on_request = on_request,
                                   .on_stream_commit = on_stream_commit,
                                   .on_close = on_close,
                                   .on_free = on_free};
    if (uv_loop_init(&G.loop) != 0 || uv_tcp_init(&G.loop, &G.listener) != 0)
        fail("loop setup");
    uv_ip4_addr("127.0.0.1", 0, &a);
    if (uv_tcp_bind(&G.listener, (const struct sockaddr *)&a, 0) != 0 ||
        uv_listen((uv_stream_t *)&G.listener, 16, on_connection) != 0 ||
        uv_tcp_getsockname(&G.listener, (struct sockaddr *)&got, &len) != 0)
        fail("listener setup");
    G.port = ntohs(got.sin_port);
    G.verbose = getenv("FUZZ_HTTP_VERBOSE") != NULL;
    G.ready = 1;
}

static int client_connect(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    int rcvbuf = 4096; /* small, so a big response fills it and the server's queue grows */
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)G.port)};

    if (fd < 0)
        fail("socket");
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0 && errno != EINPROGRESS)
        fail("connect");
    return fd;
}

static void spin(int n)
{
    for (int i = 0; i < n; i++)
        uv_run(&G.loop, UV_RUN_NOWAIT);
}

/* Reads what the server sent so far; checks it starts with a status line.
 * With FUZZ_HTTP_VERBOSE set it goes to stderr too. */
static char first[9];
static size_t n_first;

static int client_drain(int fd)
{
    char buf[16384];
    for (;;) {
        ssize_t r = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
        if (r == 0)
            return 1; /* EOF */
        if (r < 0)
            return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : 1;
        for (ssize_t i = 0; i < r && n_first < sizeof first; i++)
            first[n_first++] = buf[i];
        if (G.verbose)
            fwrite(buf, 1, (size_t)r, stderr);
    }
}

static void client_send(int fd, const uint8_t *p, size_t n)
{
    int tries = 0;
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
            continue;
        }
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && tries++ < 64) {
            spin(1);
            continue;
        }
        return; /* the server closed, or stopped reading for good: send no more */
    }
}

static void answer_pending(void)
{
    struct http_conn *c = R.pending;
    if (!c)
        return;
    R.pending = NULL;
    if (c->state == HTTP_CONN_WAITING || c->state == HTTP_CONN_HELD) {
        answer(c, R.requests - 1);
    } else if (c->state == HTTP_CONN_STREAMING) { /* committed by a keep-alive tick */
        http_conn_stream_write(c, "data: late\n\n", 12);
        http_conn_stream_end(c);
        R.answers++;
    }
}

static size_t count_handles_walk;

static void count_handle(uv_handle_t *h, void *arg)
{
    (void)h;
    (void)arg;
    count_handles_walk++;
}

/* One connection: the bytes in pieces of lens[0..k) + 1 bytes, then the rest. */
static void run_conn(const uint8_t *hdr, const uint8_t *lens, size_t k, const uint8_t *data,
                     size_t size)
{
    size_t pos = 0;
    int fd;
    int eof = 0;

    memset(&R, 0, sizeof R);
    n_first = 0;
    R.kinds = hdr[1];
    R.later = hdr[2];
    R.flags = hdr[3];
    fd = client_connect();
    for (int i = 0; i < 1000 && !R.accepted; i++)
        uv_run(&G.loop, i < 10 ? UV_RUN_NOWAIT : UV_RUN_ONCE);
    if (!R.accepted)
        fail("the listener accepted nothing");

    for (size_t piece = 0; pos < size && R.conn; piece++) {
        size_t n = piece < k ? (size_t)lens[piece] + 1 : size - pos;
        if (n > size - pos)
            n = size - pos;
        client_send(fd, data + pos, n);
        pos += n;
        spin(2);
        if ((R.flags & 1) && !eof)
            eof = client_drain(fd);
        if ((R.flags & 64) && piece < MAX_PAUSES) { /* tight deadlines fire, a tick commits */
            struct timespec pause = {0, 1000000};
            nanosleep(&pause, NULL);
            spin(1);
        }
        if (pos < size || !(R.flags & 32))
            answer_pending();
        spin(1);
    }
    /* answer what is waiting (each answer may let a pipelined request in),
     * unless the input says to hang up on the last one */
    for (int i = 0; i < 64 && R.pending && !(R.flags & 32); i++) {
        answer_pending();
        spin(2);
    }
    spin(1);
    if ((R.flags & 1) && !eof)
        client_drain(fd);

    switch ((R.flags >> 1) & 3) {
    case 1: /* half-close, then read until the server closes too */
        shutdown(fd, SHUT_WR);
        while (!eof && R.frees == 0) {
            uv_run(&G.loop, UV_RUN_ONCE);
            eof = client_drain(fd);
        }
        break;
    case 2: { /* reset */
        struct linger lg = {1, 0};
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
        break;
    }
    default:
        break;
    }
    close(fd);
    while (R.frees == 0)
        uv_run(&G.loop, UV_RUN_ONCE);
    spin(1);

    if (G.verbose)
        fprintf(stderr, "\n[fuzz_http_conn: %d requests, %d answers]\n", R.requests, R.answers);
    if (R.accepted != 1 || R.closes != 1 || R.frees != 1 || R.free_before_close)
        fail("a connection must close once and be freed once, after it closed");
    count_handles_walk = 0;
    uv_walk(&G.loop, count_handle, NULL);
    if (count_handles_walk != 1)
        fail("handles left on the loop besides the listener");
    if (n_first > 0 && memcmp(first, "HTTP/1.", n_first < 7 ? n_first : 7) != 0)
        fail("the response does not start with a status line");
}

/* Split invariance: whole (w) and in pieces (p) agree up to where the shorter
 * run stopped, and a run that answered with an error dispatched no more than
 * the other. 408 is timing, not parsing: such runs are not compared. */
static void compare_runs(const struct record *w, const struct record *p)
{
    int n = w->n < p->n ? w->n : p->n;
    if (w->reject == 408 || p->reject == 408)
        return;
    for (int i = 0; i < n && i < MAX_RECORD; i++)
        if (w->req[i] != p->req[i])
            fail("split invariance: a request parsed differently when its bytes came in pieces");
    if ((w->reject && p->n > w->n) || (p->reject && w->n > p->n))
        fail("split invariance: one run refused a request the other dispatched");
    if (w->reject && p->reject && (w->reject != p->reject || w->n != p->n))
        fail("split invariance: the two runs refused differently");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t hdr[HEADER_BYTES] = {0};
    size_t pos = size < HEADER_BYTES ? size : HEADER_BYTES;
    size_t k;

    if (!G.ready)
        setup();
    memcpy(hdr, data, pos);
    k = hdr[0] & 15;
    if (k > size - pos)
        k = size - pos;
    const uint8_t *lens = data + pos;
    pos += k;
    if ((hdr[3] & 128) && !(hdr[3] & 64) && k > 0) {
        struct record whole;
        run_conn(hdr, NULL, 0, data + pos, size - pos);
        whole = R.rec;
        run_conn(hdr, lens, k, data + pos, size - pos);
        compare_runs(&whole, &R.rec);
    } else {
        run_conn(hdr, lens, k, data + pos, size - pos);
    }
    return 0;
}
