/*
 * test_stream_oom.c: a resumable stream (server/streams.c) that runs out of
 * memory for an event, on a real libuv loop with a real accepted TCP
 * connection and no engine.
 *
 * Allocation failure is injected through stream_buf_alloc (a weak symbol in
 * stream_buf.c; this file's definition replaces it). The stream must end
 * cleanly: its request counted done exactly once, its client disconnected,
 * never resumable again (its buffer lacks the events that failed and the
 * [DONE]), freed later by the registry, and never freed while the code that
 * emitted into it still holds it: the router keeps emitting into the same
 * stream after a failed event (the final chunk, the usage chunk, [DONE]),
 * which under ASan is a use-after-free if the failure freed it.
 */
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include "server/router.h"
#include "server/streams.h"
#include "test.h"

static int fail_allocs; /* stream_buf_alloc fails while this is set */

void *stream_buf_alloc(size_t n)
{
    return fail_allocs ? NULL : malloc(n);
}

static struct server S;
static uv_loop_t loop;
static uv_tcp_t listener;
static struct http_limits lim;
static struct http_conn_ops ops;
static struct http_conn *accepted;
static int closes;

static void on_close(struct http_conn *c, void *arg)
{
    closes++;
    router_forget(arg, c); /* what the server does (server.c on_conn_close) */
}

static void on_request(struct http_conn *c, void *arg)
{
    (void)c;
    (void)arg;
}

static void on_connection(uv_stream_t *l, int status)
{
    if (status == 0)
        http_conn_accept(l, &lim, &ops, &accepted);
}

/* A loop, a listener and one accepted connection; returns the client fd. */
static int setup(double grace)
{
    memset(&S, 0, sizeof S);
    accepted = NULL;
    closes = 0;
    fail_allocs = 0;
    uv_loop_init(&loop);
    S.loop = &loop;
    lim = (struct http_limits){.max_header_bytes = 16384,
                               .max_body = 1 << 20,
                               .high_water = 65536,
                               .low_water = 16384,
                               .read_timeout_ms = 60000,
                               .keepalive_timeout_ms = 60000,
                               .write_stall_timeout_ms = 60000,
                               .sse_keepalive_ms = 60000,
                               .extra_headers = "",
                               .max_body_total = 1 << 24,
                               .body_budget = &S.body_bytes};
    ops = (struct http_conn_ops){.on_request = on_request, .on_close = on_close, .arg = &S};
    if (streams_init(&S, 16, 1 << 20, 1 << 24, grace) < 0)
        return -1;
    struct sockaddr_in addr;
    uv_ip4_addr("127.0.0.1", 0, &addr);
    uv_tcp_init(&loop, &listener);
    if (uv_tcp_bind(&listener, (const struct sockaddr *)&addr, 0) < 0 ||
        uv_listen((uv_stream_t *)&listener, 8, on_connection) < 0)
        return -1;
    struct sockaddr_in got;
    int len = sizeof got;
    uv_tcp_getsockname(&listener, (struct sockaddr *)&got, &len);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&got, sizeof got) < 0)
        return -1;
    for (int i = 0; i < 1000 && !accepted; i++)
        uv_run(&loop, UV_RUN_NOWAIT);
    return accepted ? fd : -1;
}

static void teardown(int fd)
{
    close(fd);
    streams_free(&S);
    uv_close((uv_handle_t *)&listener, NULL);
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
    free(S.streams.buckets);
}

/* A started stream on the accepted connection, its request in flight. */
static struct stream *attached_stream(void)
{
    struct srv_req *r = calloc(1, sizeof *r);
    r->id = 7;
    r->stream = 1;
    struct stream *st = streams_create(&S, r, accepted, 0, 0);
    if (!st)
        return NULL;
    accepted->user = r;
    st->started = 1; /* as if its headers went out */
    S.inflight = 1;
    return st;
}

/* Runs the loop until the registry is empty (the sweep frees the stream). */
static void run_until_freed(void)
{
    for (int i = 0; i < 400 && S.streams.count > 0; i++) {
        uv_run(&loop, UV_RUN_NOWAIT);
        usleep(5000);
    }
}

/* What the router does with a DONE whose final chunk fails: it goes on to
 * the usage chunk and [DONE] on the same stream. */
static void emit_like_the_router(struct stream *st)
{
    fail_allocs = 1;
    streams_emit_json(&S, st, "{\"final\":1}");
    fail_allocs = 0;
    if (!st->finished) /* the router's own check (router.c emit) */
        streams_emit_json(&S, st, "{\"usage\":1}");
    streams_emit_done(&S, st);
}

TEST(an_event_that_finds_no_memory_ends_the_stream_without_freeing_it_under_its_emitter)
{
    int fd = setup(0); /* grace 0: a disconnect would drop the stream at once */
    ASSERT(fd >= 0);
    struct stream *st = attached_stream();
    ASSERT(st != NULL);
    emit_like_the_router(st);
    ASSERT_EQ(closes, 1);     /* its client was disconnected */
    ASSERT_EQ(S.inflight, 0); /* the request counted done, once */
    ASSERT(accepted->user == NULL);
    run_until_freed();
    ASSERT_EQ(S.streams.count, 0);
    ASSERT_EQ(S.streams.bytes, 0);
    teardown(fd);
}

TEST(a_stream_cut_short_by_an_allocation_failure_is_not_resumable)
{
    int fd = setup(30); /* a disconnect would leave it resumable for 30 s */
    ASSERT(fd >= 0);
    struct stream *st = attached_stream();
    ASSERT(st != NULL);
    char sid[STREAM_ID_LEN + 1];
    memcpy(sid, st->sid, sizeof sid);
    emit_like_the_router(st);
    ASSERT_EQ(closes, 1);
    ASSERT_EQ(S.inflight, 0);
    /* a resume would replay a stream that lost events and never gets [DONE] */
    ASSERT(streams_find_sid(&S.streams, sid) == NULL);
    run_until_freed();
    ASSERT_EQ(S.streams.count, 0);
    teardown(fd);
}

TEST_MAIN()
