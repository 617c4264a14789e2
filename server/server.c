/*
 * server.c: `streamsink serve` once its flags are parsed (server_run): start the
 * engine, listen, run the loop, drain on SIGTERM/SIGINT.
 *
 * The loop thread owns the listener, every connection and the slot table.
 * The engine thread calls wake() (uv_async_send, which coalesces), and
 * on_wake drains events until engine_drain returns 0, routing each by id.
 *
 * Shutdown: the first SIGTERM or SIGINT closes the listener, closes idle
 * connections and lets running requests finish (their connections close
 * after the response); a request whose headers end during the drain is
 * refused from them (router.c), and so is one still arriving when the
 * signal came, or pipelined behind a response that said keep-alive: the
 * drain waits for it. When none are left (and the engine has fed the rest
 * of any session turn whose client left during its prompt), or after
 * --drain-timeout, the rest are cut: each is cancelled and ends as a
 * client can tell (a stream, after the tokens the engine made up to the
 * cancel (waited for up to
 * CUT_ANSWER_S), with an error event, [DONE] and its last chunk; a request
 * with no bytes out yet, or still arriving, with a 503), the answers are
 * flushed for up to CUT_FLUSH_S, the engine is stopped (its thread joined,
 * its sessions saved) and the loop ends: exit 0. A second signal skips the
 * grace period; while the engine stops, a signal says what it waits for and
 * the next one exits at once (exit 1).
 *
 * At --max-conns, a new connection takes the place of one that runs no
 * request (reclaim_connection has the order); only when every connection
 * runs a request is it refused (503), so /health stays answerable under a
 * flood of idle sockets. --max-conns is lowered at start-up to what the
 * limit on open files leaves (fit_conns_to_fds).
 */
#include "server.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "owner.h"
#include "router.h"

#define EVENT_BATCH 64
/* Descriptors kept free beyond those open once the server listens: the one
 * accepted at --max-conns to take a slot or be refused, the files a session
 * save, load or listing holds (the session IO thread and the engine thread,
 * one or two each), and a margin for libraries that open one now and then. */
#define FD_SPARE 16
#define FD_MIN_CONNS 8   /* fewer connections than this: exit instead */
#define CUT_FLUSH_S 2.0  /* after cutting streams at shutdown: time to flush their endings */
#define CUT_ANSWER_S 1.0 /* ... of which the engine's answers to the cancels may take this much */

double server_now(void)
{
    return (double)uv_hrtime() * 1e-9;
}

/* ---- the slot table --------------------------------------------------------------- */

struct http_conn *server_find(struct server *s, uint64_t id)
{
    uint64_t slot = id % (uint64_t)s->cfg.max_conns;
    struct http_conn *c = s->conns[slot];
    if (!c || !c->user)
        return NULL;
    struct srv_req *r = c->user;
    return r->id == id ? c : NULL;
}

/* ---- shutdown ---------------------------------------------------------------------- */

/* A signal while the loop waits for the engine thread to end: the first
 * one says what the wait is for (a double Ctrl-C must not cost the sessions
 * of a shutdown that takes a second), the next one gives up on it. */
static volatile sig_atomic_t signals_while_stopping;
static volatile sig_atomic_t stopping_with_sessions; /* a --session-dir to write */

static void say(const char *msg, size_t len)
{
    ssize_t n = write(2, msg, len);
    (void)n;
}

static void on_signal_while_stopping(int signum)
{
    (void)signum;
    static const char saving[] = "signal while stopping: writing session snapshots; signal again "
                                 "to exit without them\n";
    static const char step[] = "signal while stopping: the engine ends its step; signal again to "
                               "exit now\n";
    static const char lost[] = "signal while stopping: exiting now; session snapshots not yet "
                               "written are lost\n";
    static const char now[] = "signal while stopping: exiting now\n";
    if (signals_while_stopping++ == 0) {
        if (stopping_with_sessions)
            say(saving, sizeof saving - 1);
        else
            say(step, sizeof step - 1);
        return;
    }
    if (stopping_with_sessions)
        say(lost, sizeof lost - 1);
    else
        say(now, sizeof now - 1);
    _exit(1);
}

/* The last step of stopping: once no worker thread tokenizes for us. */
void server_stop_engine(struct server *s)
{
    if (!s->stopped || s->tokenizing > 0 || !s->engine)
        return;
    streams_free(s); /* cancels what runs detached, closes the sweep timer */
    /* engine_stop waits for the engine's step in progress and for every
     * session save, and a save waits behind a file operation that may hang
     * (a dead NFS server). The loop cannot run on_signal meanwhile, so
     * further signals are taken here: the second ends the process. (Between
     * uv_signal_stop and sigaction a signal would find the default action.) */
    stopping_with_sessions = s->cfg.session_dir[0] != 0;
    uv_signal_stop(&s->sigterm);
    uv_signal_stop(&s->sigint);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal_while_stopping;
    /* the kernel may hand the signal to any thread: the session IO thread's
     * open or read of a hung file is resumed, not cut short with EINTR (the
     * wait given up, the shutdown ended by one signal) */
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    /* join the engine thread before closing the async handle it signals */
    engine_stop(s->engine);
    s->engine = NULL;
    sa.sa_handler = SIG_IGN; /* every snapshot is written: the exit is moments away */
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    if (s->listening) {
        uv_close((uv_handle_t *)&s->listener, NULL);
        s->listening = 0;
    }
    uv_close((uv_handle_t *)&s->wake, NULL);
    uv_close((uv_handle_t *)&s->sigterm, NULL);
    uv_close((uv_handle_t *)&s->sigint, NULL);
    uv_close((uv_handle_t *)&s->drain_timer, NULL);
}

static void stop(struct server *s)
{
    if (s->stopped)
        return;
    s->stopped = 1;
    log_msg(LOG_INFO, "stopping");
    for (int64_t i = 0; i < s->cfg.max_conns; i++)
        if (s->conns[i])
            http_conn_close(s->conns[i]); /* cancels what still runs */
    server_stop_engine(s);                /* now, or when the last tokenization returns */
}

static void on_drained(uv_timer_t *t);

/* Whether the engine still runs a sequence though no request is left: a
 * session turn whose client left while its prompt was fed goes on until the
 * whole prompt is in (a session never holds part of one), and the drain
 * waits for it; a cancel the engine has not taken yet counts too. The
 * queue's count is exact (a step's published figures lag a step behind). */
static int engine_still_feeding(struct server *s)
{
    if (!s->engine)
        return 0;
    struct engine_stats es;
    engine_get_stats(s->engine, &es);
    int busy = es.healthy && es.requests_open > 0;
    if (busy && !s->drain_feed_logged) {
        s->drain_feed_logged = 1;
        log_msg(LOG_INFO, "drain: the engine still runs %lld sequence(s) whose request ended",
                (long long)es.requests_open);
    }
    return busy;
}

void server_request_done(struct server *s)
{
    s->inflight--;
    if (s->draining && s->inflight == 0 && !s->stopped) {
        log_msg(LOG_INFO, "drained: every request finished");
        /* let the last responses flush before the connections close */
        uv_timer_start(&s->drain_timer, on_drained, 0, 0);
    }
}

/* Ends every running request so that its client can tell (router_cut),
 * then stops once the endings are flushed or CUT_FLUSH_S has passed. A
 * stream the engine runs first waits up to CUT_ANSWER_S for the engine's
 * answer to its cancel (its last tokens); a second cut ends it at once. */
static void cut_and_stop(struct server *s)
{
    if (s->stopped)
        return;
    s->cutting = 1;
    for (int64_t i = 0; i < s->cfg.max_conns; i++) {
        struct http_conn *c = s->conns[i];
        if (c && c->user)
            router_cut(s, c);
    }
    /* a request still arriving gets its 503 from on_drained, now and on
     * every round after (one pipelined behind a cut stream arrives later) */
    s->cut_answer_deadline = server_now() + CUT_ANSWER_S;
    s->drain_deadline = server_now() + CUT_FLUSH_S;
    uv_timer_start(&s->drain_timer, on_drained, 0, 0);
}

static void on_drain_timeout(uv_timer_t *t)
{
    struct server *s = t->data;
    if (s->inflight > 0)
        log_msg(LOG_WARN, "drain timeout: cancelling %lld running request(s)",
                (long long)s->inflight);
    cut_and_stop(s);
}

static void on_drained(uv_timer_t *t)
{
    struct server *s = t->data;
    if (s->cut_answer_deadline > 0 && server_now() >= s->cut_answer_deadline) {
        /* an engine step outlasted the wait (a long prefill chunk): what it
         * had not answered ends now, so its ending still has time to flush */
        s->cut_answer_deadline = 0;
        for (int64_t i = 0; i < s->cfg.max_conns; i++)
            if (s->conns[i] && router_cut_pending(s->conns[i]))
                router_cut(s, s->conns[i]);
    }
    int64_t queued = 0, arriving = 0;
    for (int64_t i = 0; i < s->cfg.max_conns; i++) {
        struct http_conn *c = s->conns[i];
        if (!c)
            continue;
        if (s->cutting)
            router_refuse_arriving(s, c);
        queued += (int64_t)http_conn_write_queue(c) + router_cut_pending(c);
        arriving += http_conn_receiving(c);
    }
    if (arriving > 0 && !s->cutting) {
        /* a request still arriving (or pipelined behind a response that said
         * keep-alive) is read and answered within the drain timeout */
        if (server_now() < s->drain_deadline)
            uv_timer_start(t, on_drained, 20, 0);
        else
            cut_and_stop(s);
        return;
    }
    if (queued > 0 && server_now() < s->drain_deadline) {
        uv_timer_start(t, on_drained, 20, 0); /* still flushing */
        return;
    }
    if (!s->cutting && engine_still_feeding(s) && server_now() < s->drain_deadline) {
        uv_timer_start(t, on_drained, 20, 0);
        return;
    }
    stop(s);
}

static void on_signal(uv_signal_t *h, int signum)
{
    struct server *s = h->data;
    if (s->draining) {
        log_msg(LOG_WARN, "second signal: stopping now");
        cut_and_stop(s);
        return;
    }
    s->draining = 1;
    s->drain_deadline = server_now() + s->cfg.drain_timeout;
    /* each session is written out once idle, so its next turn, refused here
     * from now on, finds it on the replica that takes the turn instead */
    if (s->engine)
        engine_retire_sessions(s->engine);
    log_msg(LOG_INFO, "%s: draining %lld running request(s) for up to %gs",
            signum == SIGTERM ? "SIGTERM" : "SIGINT", (long long)s->inflight, s->cfg.drain_timeout);
    if (s->listening) {
        uv_close((uv_handle_t *)&s->listener, NULL);
        s->listening = 0;
    }
    for (int64_t i = 0; i < s->cfg.max_conns; i++)
        if (s->conns[i])
            http_conn_finish_and_close(s->conns[i]);
    streams_drop_detached(s); /* nobody can come back for them now */
    if (s->inflight == 0)
        uv_timer_start(&s->drain_timer, on_drained, 0, 0);
    else
        uv_timer_start(&s->drain_timer, on_drain_timeout, (uint64_t)(s->cfg.drain_timeout * 1e3),
                       0);
}

/* ---- connections ------------------------------------------------------------------- */

static void on_conn_close(struct http_conn *c, void *arg)
{
    struct server *s = arg;
    streams_conn_closed(s, c);
    /* a client that stopped reading (or reads too slowly) counts whether its
     * response still ran or had ended and waited in the queue */
    int ran = router_forget(s, c);
    if (c->stalled)
        s->metrics.write_stall_closes++;
    else if (c->slow)
        s->metrics.slow_reader_closes++;
    else if (ran)
        s->metrics.client_disconnects++;
    int64_t slot = (int64_t)c->user_id;
    if (s->conns[slot] == c) {
        s->conns[slot] = NULL;
        s->free_slots[s->n_free++] = slot;
    }
}

static void on_reject_close(uv_handle_t *h)
{
    free(h);
}

/* Over --max-conns: a canned 503 and close, without an http_conn. */
static void reject_connection(struct server *s)
{
    static const char body[] =
        "{\"error\":{\"message\":\"too many connections; retry shortly\",\"type\":"
        "\"server_error\",\"param\":null,\"code\":\"too_many_connections\"}}";
    char resp[512];
    int n = snprintf(resp, sizeof resp,
                     "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\nRetry-After: 1\r\n%sConnection: close\r\n\r\n%s",
                     sizeof body - 1, s->headers, body);
    uv_tcp_t *t = malloc(sizeof *t);
    if (!t)
        return;
    uv_tcp_init(s->loop, t);
    if (uv_accept((uv_stream_t *)&s->listener, (uv_stream_t *)t) == 0) {
        uv_buf_t b = uv_buf_init(resp, (unsigned int)n);
        uv_try_write((uv_stream_t *)t, &b, 1); /* best effort: a fresh socket has room */
    }
    s->metrics.conns_rejected++;
    uv_close((uv_handle_t *)t, on_reject_close);
}

/* A complete answer whose client has taken none of it for this long may be
 * closed to admit a new connection at --max-conns, last of all (after every
 * half-sent request): a client reading steadily takes bytes many times a
 * second, but one reading in bursts may pause longer; one that takes
 * nothing holds a slot and up to --max-response of memory for nothing. */
#define UNTAKEN_RECLAIM_MS 1000

/* At --max-conns: closes the connection lingering longest (its last response
 * was sent; it waits only for the client's FIN), else the one idle the
 * longest, else, of those whose client sent more requests than it has read
 * answers to (the next request waits behind a complete answer), the one
 * holding the most answer bytes, else the oldest one still sending its
 * request, else, of those whose complete answer the client has taken none
 * of for UNTAKEN_RECLAIM_MS, the one holding the most answer bytes (nothing
 * runs for any of them). A client that keeps connections lingering by
 * trickling bytes after an error (a 401 needs no key), or busy by
 * pipelining requests to /metrics, or by asking for large answers
 * (/detokenize) and reading none of them, must not hold every slot; a
 * client reading its answer, even in bursts with pauses, goes only after
 * every half-sent request. Returns 1 if a slot was freed. */
static int reclaim_connection(struct server *s)
{
    struct http_conn *lingering = NULL, *idle = NULL, *unread = NULL, *partial = NULL,
                     *untaken = NULL;
    for (int64_t i = 0; i < s->cfg.max_conns; i++) {
        struct http_conn *c = s->conns[i];
        if (!c || c->user)
            continue; /* a request of its own runs */
        if (c->state == HTTP_CONN_LINGERING) {
            if (!lingering || c->linger_until < lingering->linger_until)
                lingering = c;
        } else if (c->state == HTTP_CONN_DRAINING) {
            /* asked every time, so that taking bytes between two looks counts */
            const int stalled = http_conn_untaken_ms(c) >= UNTAKEN_RECLAIM_MS;
            struct http_conn **best = http_conn_pipelined(c) ? &unread : stalled ? &untaken : NULL;
            if (best && (!*best || http_conn_write_queue(c) > http_conn_write_queue(*best)))
                *best = c;
        } else if (c->state == HTTP_CONN_READING) {
            struct http_conn **best = http_conn_idle(c) ? &idle : &partial;
            if (!*best || c->idle_since < (*best)->idle_since)
                *best = c;
        }
    }
    struct http_conn *victim = lingering ? lingering
                               : idle    ? idle
                               : unread  ? unread
                               : partial ? partial
                                         : untaken;
    if (!victim)
        return 0;
    log_msg(LOG_DEBUG, "max-conns: closing %s connection to admit a new one",
            lingering ? "a lingering"
            : idle    ? "an idle"
            : unread  ? "an unread"
            : partial ? "an unfinished"
                      : "a stalled");
    s->metrics.conns_reclaimed++;
    http_conn_close(victim); /* on_conn_close returns its slot now */
    return s->n_free > 0;
}

static void on_connection(uv_stream_t *l, int status)
{
    struct server *s = l->data;
    if (status < 0) {
        log_msg(LOG_WARN, "accept: %s", uv_strerror(status));
        return;
    }
    if (s->n_free == 0 && !reclaim_connection(s)) {
        reject_connection(s);
        return;
    }
    struct http_conn *c;
    int rc = http_conn_accept(l, &s->lim, &s->ops, &c);
    if (rc < 0) {
        log_msg(LOG_WARN, "accept: %s", uv_strerror(rc));
        return;
    }
    int64_t slot = s->free_slots[--s->n_free];
    c->user_id = (uint64_t)slot;
    s->conns[slot] = c;
    s->metrics.conns_accepted++;
}

/* ---- descriptors ---------------------------------------------------------------------- */

/* Every connection holds a descriptor: the soft limit goes up to the hard one. */
static void raise_fd_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl); /* best effort: fit_conns_to_fds sees what it got */
    }
}

/* Descriptors open now below limit. */
static int64_t open_fds(int64_t limit)
{
    int64_t n = 0;
    DIR *d = opendir("/proc/self/fd");
    if (d) {
        const int self = dirfd(d);
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (e->d_name[0] == '.')
                continue;
            const long fd = strtol(e->d_name, NULL, 10);
            if (fd != self && fd < limit)
                n++;
        }
        closedir(d);
        return n;
    }
    for (int64_t fd = 0; fd < limit && fd < 65536; fd++)
        if (fcntl((int)fd, F_GETFD) != -1)
            n++;
    return n;
}

/* Lowers --max-conns to what the limit on open files leaves once the server
 * listens (the listener, the model, libuv's own, whatever the backend
 * opened), less FD_SPARE. Past the limit, accept fails with EMFILE, libuv
 * drops the new socket itself and no slot is reclaimed for it: a flood of
 * idle sockets would lock everyone out. Called before the first accept.
 * Returns 0, or -1 after a message when fewer than FD_MIN_CONNS fit. */
static int fit_conns_to_fds(struct server *s)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur == RLIM_INFINITY ||
        rl.rlim_cur > (rlim_t)INT64_MAX)
        return 0;
    const int64_t limit = (int64_t)rl.rlim_cur;
    const int64_t other = open_fds(limit) + FD_SPARE;
    const int64_t room = limit - other;
    if (s->cfg.max_conns <= room)
        return 0;
    if (room < FD_MIN_CONNS) {
        fprintf(stderr,
                "error: the limit on open files (%lld, ulimit -n) leaves room for fewer than %d "
                "connections (the server needs %lld files besides them); raise the limit\n",
                (long long)limit, FD_MIN_CONNS, (long long)other);
        return -1;
    }
    log_msg(LOG_WARN,
            "--max-conns lowered from %lld to %lld: the limit on open files is %lld (ulimit -n, "
            "raised to the hard limit) and the server needs %lld of them besides connections",
            (long long)s->cfg.max_conns, (long long)room, (long long)limit, (long long)other);
    s->cfg.max_conns = room; /* the slot table was sized for more: its tail stays unused */
    for (int64_t i = 0; i < room; i++)
        s->free_slots[i] = room - 1 - i;
    s->n_free = room;
    return 0;
}

/* ---- engine events -------------------------------------------------------------------- */

static void wake(void *arg) /* engine thread */
{
    uv_async_send(arg);
}

static void on_wake(uv_async_t *a)
{
    struct server *s = a->data;
    struct engine_event ev[EVENT_BATCH];
    size_t n;
    if (!s->engine)
        return;
    /* uv_async_send coalesces: drain until empty, never one event per wake */
    while ((n = engine_drain(s->engine, ev, EVENT_BATCH)) > 0) {
        for (size_t i = 0; i < n; i++) {
            struct stream *st = streams_find_req(&s->streams, ev[i].id);
            if (st) { /* a stream, wherever its client is */
                router_on_stream_event(s, st, &ev[i]);
                continue;
            }
            struct http_conn *c = server_find(s, ev[i].id);
            if (c)
                router_on_event(s, c, &ev[i]);
        }
    }
}

/* ---- startup ------------------------------------------------------------------------------ */

/* The served id: the file's name without ".gguf", fit for every answer that
 * carries it (api_text_clean). */
static void model_id_from_path(char *dst, size_t cap, const char *path)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    api_text_clean(dst, cap, base);
    size_t n = strlen(dst);
    if (n > 5 && strcmp(dst + n - 5, ".gguf") == 0)
        dst[n - 5] = 0;
}

static int parse_host(const struct server_config *cfg, struct sockaddr_storage *addr)
{
    return strchr(cfg->host, ':')
               ? uv_ip6_addr(cfg->host, (int)cfg->port, (struct sockaddr_in6 *)addr)
               : uv_ip4_addr(cfg->host, (int)cfg->port, (struct sockaddr_in *)addr);
}

static int listen_on(struct server *s, int *port_out)
{
    struct sockaddr_storage addr;
    int rc = parse_host(&s->cfg, &addr);
    if (rc < 0)
        return rc; /* checked before the model was loaded */
    uv_tcp_init(s->loop, &s->listener);
    s->listener.data = s;
    s->listening = 1;
    rc = uv_tcp_bind(&s->listener, (const struct sockaddr *)&addr, 0);
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)&s->listener, 511, on_connection);
    if (rc < 0) {
        log_msg(LOG_ERROR, "cannot listen on %s:%lld: %s", s->cfg.host, (long long)s->cfg.port,
                uv_strerror(rc));
        return rc;
    }
    struct sockaddr_storage got;
    int len = sizeof got;
    uv_tcp_getsockname(&s->listener, (struct sockaddr *)&got, &len);
    *port_out = got.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&got)->sin6_port)
                                          : ntohs(((struct sockaddr_in *)&got)->sin_port);
    return 0;
}

static enum log_level level_of(const char *s)
{
    return strcmp(s, "debug") == 0   ? LOG_DEBUG
           : strcmp(s, "warn") == 0  ? LOG_WARN
           : strcmp(s, "error") == 0 ? LOG_ERROR
                                     : LOG_INFO;
}

/* The engine's messages, in the server's log (any thread: one fprintf a line). */
static void engine_log(enum engine_log_level level, const char *msg, void *arg)
{
    (void)arg;
    log_msg(level == ENGINE_LOG_ERROR  ? LOG_ERROR
            : level == ENGINE_LOG_WARN ? LOG_WARN
                                       : LOG_INFO,
            "%s", msg);
}

static int engine_config_from(const struct server_config *cfg, struct engine_config *ec)
{
    *ec = engine_default_config();
    ec->log = engine_log;
    ec->model_path = cfg->model;
    ec->n_threads = (int)cfg->threads;
    ec->no_mmap = cfg->no_mmap != 0;
    if (engine_backend_parse(cfg->backend, &ec->backend) < 0) {
        fprintf(stderr, "error: --backend expects cpu or cuda, got '%s'\n", cfg->backend);
        return -EINVAL;
    }
    ec->max_seqs = cfg->max_seqs;
    ec->max_queue = cfg->max_queue;
    ec->window = cfg->window;
    ec->max_sinks = cfg->sinks;
    ec->chunk = cfg->chunk;
    ec->max_step_tokens =
        cfg->max_step_tokens > cfg->max_seqs ? cfg->max_step_tokens : cfg->max_seqs;
    if (ec->backend == ENGINE_BACKEND_CUDA && ec->max_step_tokens > 65535) {
        fprintf(stderr, "error: --backend cuda takes at most 65535 tokens per step "
                        "(--max-step-tokens, --max-seqs)\n");
        return -EINVAL;
    }
    ec->max_prompt_tokens = cfg->max_prompt;
    ec->session_idle_s = (int64_t)cfg->session_idle;
    ec->session_dir = cfg->session_dir[0] ? cfg->session_dir : NULL;
    ec->session_disk_max = cfg->session_disk_max;
    if (engine_kv_dtype_parse(cfg->kv_dtype, &ec->kv_dtype) < 0) {
        fprintf(stderr, "error: --kv-dtype expects f16, f32 or q8_0, got '%s'\n", cfg->kv_dtype);
        return -EINVAL;
    }
    if (engine_policy_parse(cfg->kv_policy, &ec->policy) < 0 ||
        ec->policy.kind == ENGINE_POLICY_RECOMPUTE) { /* recompute: streamsink perplexity only */
        fprintf(stderr, "error: --kv-policy expects auto, window, sinks:N or dense, got '%s'\n",
                cfg->kv_policy);
        return -EINVAL;
    }
    return 0;
}

/* ---- API keys -------------------------------------------------------------------------- */

/* The longest key a request can send: the Authorization value is read up to
 * HTTP_AUTH_MAX - 1 bytes, "Bearer " and the key. A longer key could never
 * match: it is refused at start-up. */
#define KEY_MAX (HTTP_AUTH_MAX - 1 - 7)

/* Adds one key, its blanks around it trimmed. A line of --api-key-file
 * that is blank or starts with '#' is none (returns 0); a blank key from the
 * flag or the environment is an error (-ENOKEY), since the mistake it
 * stands for (`--api-key "$KEY"` with KEY unset) would serve an open API.
 * A key with a control character could never match (a header value cannot
 * carry one): -EILSEQ. */
static int add_key(struct server *s, const char *k, size_t len, int from_file)
{
    while (len > 0 && (k[len - 1] == ' ' || k[len - 1] == '\t' || k[len - 1] == '\r'))
        len--;
    while (len > 0 && (*k == ' ' || *k == '\t')) {
        k++;
        len--;
    }
    if (from_file && (len == 0 || *k == '#'))
        return 0;
    if (len == 0)
        return -ENOKEY;
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)k[i] < 0x20 || k[i] == 0x7f)
            return -EILSEQ;
    if (len > KEY_MAX)
        return -EMSGSIZE;
    if (s->n_keys == SERVER_MAX_KEYS)
        return -E2BIG;
    char *dup = malloc(len + 1);
    if (!dup)
        return -ENOMEM;
    memcpy(dup, k, len);
    dup[len] = 0;
    s->keys[s->n_keys++] = dup;
    return 0;
}

/* The accepted keys: --api-key, the lines of --api-key-file, else
 * $STREAMSINK_API_KEY. None: the API is open. */
static int load_keys(struct server *s, char *err, size_t err_len)
{
    const struct server_config *cfg = &s->cfg;
    int rc = 0;
    if (cfg->n_api_keys > 0)
        log_msg(LOG_WARN, "--api-key is visible to every user of this machine (ps); prefer "
                          "--api-key-file or $STREAMSINK_API_KEY");
    for (int64_t i = 0; rc == 0 && i < cfg->n_api_keys; i++)
        rc = add_key(s, cfg->api_keys[i], strlen(cfg->api_keys[i]), 0);
    if (rc == 0 && cfg->api_key_file[0]) {
        FILE *f = fopen(cfg->api_key_file, "r");
        if (!f) {
            snprintf(err, err_len, "--api-key-file %s: %s", cfg->api_key_file, strerror(errno));
            return -errno;
        }
        char line[HTTP_AUTH_MAX + 2];
        size_t before = s->n_keys;
        while (rc == 0 && fgets(line, sizeof line, f)) {
            size_t n = strcspn(line, "\n");
            if (n == sizeof line - 1) {
                snprintf(err, err_len, "--api-key-file %s: a line is longer than %d bytes",
                         cfg->api_key_file, HTTP_AUTH_MAX);
                fclose(f);
                return -EINVAL;
            }
            rc = add_key(s, line, n, 1);
        }
        if (rc == 0 && ferror(f)) { /* a directory (EISDIR), a read error */
            int e = errno;
            snprintf(err, err_len, "--api-key-file %s: %s", cfg->api_key_file, strerror(e));
            fclose(f);
            return -e;
        }
        fclose(f);
        if (rc == 0 && s->n_keys == before) {
            snprintf(err, err_len, "--api-key-file %s holds no key", cfg->api_key_file);
            return -EINVAL;
        }
    }
    const char *env = getenv("STREAMSINK_API_KEY");
    if (rc == 0 && s->n_keys == 0 && env)
        rc = add_key(s, env, strlen(env), 0);
    if (rc == -ENOKEY)
        snprintf(err, err_len,
                 "an API key is empty (--api-key or $STREAMSINK_API_KEY); to serve without "
                 "keys, give none");
    else if (rc == -EILSEQ)
        snprintf(err, err_len,
                 "an API key holds a control character, which no Authorization header can "
                 "carry");
    else if (rc == -EMSGSIZE)
        snprintf(err, err_len,
                 "an API key is longer than %d bytes, the longest a request's Authorization "
                 "header can carry",
                 KEY_MAX);
    else if (rc < 0)
        snprintf(err, err_len, "API keys: %s (at most %d)", strerror(-rc), SERVER_MAX_KEYS);
    return rc;
}

/* The largest --chat-template-file read (Hugging Face's longest templates are
 * tens of KB). */
#define CHAT_TEMPLATE_FILE_MAX (1 << 20)

/* How chat messages are rendered when a flag says: --chat-template-file's
 * template, else the format --chat-template names; *from says which, for the
 * log, and stays NULL when neither is given (the model's own template, once
 * it has loaded, decides). Checked before the model loads. */
static int chat_template_from_flags(struct server *s, const char **from, char *err, size_t err_len)
{
    const char *name = s->cfg.chat_template, *path = s->cfg.chat_template_file;
    if (path && path[0]) {
        FILE *f = fopen(path, "rb");
        if (!f) {
            snprintf(err, err_len, "--chat-template-file %s: %s", path, strerror(errno));
            return -1;
        }
        char *text = malloc(CHAT_TEMPLATE_FILE_MAX + 1);
        size_t n = text ? fread(text, 1, CHAT_TEMPLATE_FILE_MAX + 1, f) : 0;
        int bad = !text ? ENOMEM : ferror(f) ? (errno ? errno : EIO) : 0; /* EISDIR */
        fclose(f);
        if (bad || n > CHAT_TEMPLATE_FILE_MAX) {
            if (bad)
                snprintf(err, err_len, "--chat-template-file %s: %s", path, strerror(bad));
            else
                snprintf(err, err_len, "--chat-template-file %s is larger than %d bytes", path,
                         CHAT_TEMPLATE_FILE_MAX);
            free(text);
            return -1;
        }
        text[n] = 0;
        /* a whole tokenizer_config.json ({"...": ...}) would match the markers
         * too, with its strings still JSON-escaped: refused, not misread */
        const char *p = text + strspn(text, " \t\r\n");
        int json = *p == '{' && p[1 + strspn(p + 1, " \t\r\n")] == '"';
        if (json) {
            snprintf(err, err_len,
                     "--chat-template-file %s is a JSON object (a tokenizer_config.json?); give "
                     "the text of its chat_template",
                     path);
            free(text);
            return -1;
        }
        api_chat_template_init(&s->chat, text);
        free(text);
        if (!s->chat.recognized) {
            snprintf(err, err_len,
                     "--chat-template-file %s: not a template streamsink can render (it looks "
                     "for the markers of ChatML, Llama-3, Llama-2 or Gemma); --chat-template "
                     "names a format instead",
                     path);
            return -1;
        }
        *from = "--chat-template-file";
        return 0;
    }
    enum api_chat_format format;
    if (name && name[0] && strcmp(name, "auto") != 0) {
        if (api_chat_format_parse(name, &format) < 0) {
            snprintf(err, err_len, "--chat-template: unknown format '%s'", name);
            return -1;
        }
        api_chat_template_named(&s->chat, format);
        *from = "--chat-template";
    }
    return 0;
}

/* The served model id (the file name without .gguf), then --model-alias names. */
static int load_model_names(struct server *s, char *err, size_t err_len)
{
    s->model_names[s->n_model_names++] = s->model_id;
    snprintf(s->alias_buf, sizeof s->alias_buf, "%s", s->cfg.model_alias);
    if (strlen(s->cfg.model_alias) >= sizeof s->alias_buf) {
        snprintf(err, err_len, "--model-alias is longer than %zu bytes", sizeof s->alias_buf - 1);
        return -EINVAL;
    }
    for (char *save = NULL, *tok = strtok_r(s->alias_buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        if (!tok[0])
            continue;
        if (s->n_model_names == SERVER_MAX_MODEL_NAMES) {
            snprintf(err, err_len, "--model-alias: at most %d names", SERVER_MAX_MODEL_NAMES - 1);
            return -EINVAL;
        }
        s->model_names[s->n_model_names++] = tok;
    }
    return 0;
}

static void free_keys(struct server *s)
{
    for (size_t i = 0; i < s->n_keys; i++)
        free(s->keys[i]);
    s->n_keys = 0;
}

enum server_status server_run(const struct server_config *cfg)
{
    struct server *s = calloc(1, sizeof *s);
    char err[512];
    enum server_status code = SERVER_FAILED;
    int rc;
    if (!s) {
        fprintf(stderr, "error: out of memory\n");
        return SERVER_FAILED;
    }
    s->cfg = *cfg;
    log_set_level(level_of(s->cfg.log_level));
    if (load_keys(s, err, sizeof err) < 0) {
        fprintf(stderr, "error: %s\n", err);
        free_keys(s);
        free(s);
        return SERVER_BAD_CONFIG;
    }
    const char *chat_from = NULL; /* NULL: the model's template, known once it loads */
    if (chat_template_from_flags(s, &chat_from, err, sizeof err) < 0) {
        fprintf(stderr, "error: %s\n", err);
        free_keys(s);
        free(s);
        return SERVER_BAD_CONFIG;
    }
    struct engine_config ec;
    struct sockaddr_storage addr;
    if (engine_config_from(&s->cfg, &ec) < 0) {
        free_keys(s);
        free(s);
        return SERVER_BAD_CONFIG;
    }
    if (parse_host(&s->cfg, &addr) < 0) {
        fprintf(stderr, "error: --host expects an IPv4 or IPv6 address, got '%s'\n", s->cfg.host);
        free_keys(s);
        free(s);
        return SERVER_BAD_CONFIG;
    }
    if (access(s->cfg.model, R_OK) != 0) {
        fprintf(stderr, "error: %s: %s\n", s->cfg.model, strerror(errno));
        free_keys(s);
        free(s);
        return SERVER_BAD_MODEL;
    }
    signal(SIGPIPE, SIG_IGN); /* a peer that vanished is a write error, not a death */
    signal(SIGXFSZ, SIG_IGN); /* a file over RLIMIT_FSIZE is a failed save (EFBIG), not a death */
    raise_fd_limit();

    s->loop = uv_default_loop();
    s->conns = calloc((size_t)s->cfg.max_conns, sizeof *s->conns);
    s->free_slots = calloc((size_t)s->cfg.max_conns, sizeof *s->free_slots);
    if (!s->conns || !s->free_slots) {
        fprintf(stderr, "error: out of memory\n");
        goto out_free;
    }
    for (int64_t i = 0; i < s->cfg.max_conns; i++)
        s->free_slots[i] = s->cfg.max_conns - 1 - i;
    s->n_free = s->cfg.max_conns;
    fair_init(&s->tok_fair, fair_pool_workers());
    metrics_init(&s->metrics);
    /* every connection's stream, plus those running or queued without one */
    rc = streams_init(s, s->cfg.max_conns + s->cfg.max_seqs + s->cfg.max_queue,
                      (size_t)s->cfg.stream_buffer, (size_t)s->cfg.stream_buffer_total,
                      s->cfg.stream_grace);
    s->streams.max_detached = s->cfg.max_detached;
    if (rc < 0) {
        fprintf(stderr, "error: streams: %s\n", strerror(-rc));
        goto out_free;
    }
    s->started_at = (int64_t)time(NULL);
    s->next_seq = 1;

    uv_async_init(s->loop, &s->wake, on_wake);
    s->wake.data = s;
    uv_signal_init(s->loop, &s->sigterm);
    uv_signal_init(s->loop, &s->sigint);
    uv_timer_init(s->loop, &s->drain_timer);
    s->sigterm.data = s->sigint.data = s->drain_timer.data = s;
    /* a signal while the model loads is handled once the loop runs: exit 0 */
    uv_signal_start(&s->sigterm, on_signal, SIGTERM);
    uv_signal_start(&s->sigint, on_signal, SIGINT);

    log_msg(LOG_INFO, "loading %s", s->cfg.model);
    rc = engine_start(&s->engine, &ec, wake, &s->wake, err, sizeof err);
    if (rc < 0) {
        fprintf(stderr, "error: %s\n", err);
        code = engine_error_is_model(rc) ? SERVER_BAD_MODEL : SERVER_FAILED;
        s->engine = NULL;
        goto out_close;
    }
    /* after the engine has checked the session directory; an open server
     * has one owner (0) and needs no secret */
    if (owner_secret_load(s->n_keys ? s->cfg.session_dir : NULL, s->owner_secret, err, sizeof err) <
        0) {
        fprintf(stderr, "error: %s\n", err);
        goto out_close;
    }
    s->info = engine_model_info(s->engine);
    model_id_from_path(s->model_id, sizeof s->model_id, s->cfg.model);
    s->max_prompt_tokens = s->cfg.max_prompt > 0 ? s->cfg.max_prompt : s->info->n_ctx_train;
    if (load_model_names(s, err, sizeof err) < 0) {
        fprintf(stderr, "error: %s\n", err);
        code = SERVER_BAD_CONFIG;
        goto out_close;
    }
    if (!chat_from) {
        api_chat_template_init(&s->chat, s->info->chat_template);
        chat_from = s->chat.recognized ? "the model's template" : "the fallback";
    }
    if (s->info->probe_sink_rate >= 0)
        log_msg(LOG_INFO, "sink probe: %.0f%% of heads put more than 0.3 on the first token",
                100.0 * s->info->probe_sink_rate);
    if (s->info->probe_warning)
        log_msg(LOG_WARN,
                "this model is declared %s (auto evicts freely) but %.0f%% of its heads put more "
                "than 0.3 of their attention on the first token: window-only eviction may hurt "
                "it (streamsink probe shows the details; --kv-policy sinks:4 pins them)",
                s->info->normalizer, 100.0 * s->info->probe_sink_rate);
    if (!s->chat.recognized) /* only the GGUF's own template can be unknown */
        log_msg(LOG_WARN,
                "the model's chat template is %s; chat messages are rendered as ChatML "
                "(<|im_start|>role\\ncontent<|im_end|>)",
                s->info->chat_template ? "not one we recognize" : "missing");

    int port = 0;
    if (listen_on(s, &port) < 0)
        goto out_close;
    if (fit_conns_to_fds(s) < 0) {
        code = SERVER_BAD_CONFIG;
        goto out_close;
    }
    char host[256] = "localhost";
    gethostname(host, sizeof host - 1);
    if (s->cfg.name && s->cfg.name[0])
        snprintf(s->headers, sizeof s->headers, "X-Streamsink-Replica: %.*s\r\n",
                 SERVER_REPLICA_NAME_MAX, s->cfg.name);
    else
        snprintf(s->headers, sizeof s->headers, "X-Streamsink-Replica: %.*s:%d\r\n",
                 SERVER_REPLICA_NAME_MAX, host, port);

    s->lim = (struct http_limits){
        .max_header_bytes = (size_t)s->cfg.max_header,
        .max_body = (size_t)s->cfg.max_body,
        .high_water = (size_t)s->cfg.high_water,
        .low_water = (size_t)s->cfg.low_water,
        .read_timeout_ms = (uint64_t)(s->cfg.read_timeout * 1e3),
        .keepalive_timeout_ms = (uint64_t)(s->cfg.keepalive_timeout * 1e3),
        .write_stall_timeout_ms = (uint64_t)(s->cfg.write_stall_timeout * 1e3),
        .sse_keepalive_ms = (uint64_t)(s->cfg.sse_keepalive * 1e3),
        .sndbuf = (int)s->cfg.sndbuf,
        .min_read_rate = (double)s->cfg.min_read_rate,
        .extra_headers = s->headers,
        .max_body_total = (size_t)s->cfg.max_body_total,
        .body_budget = &s->body_bytes,
    };
    s->ops = (struct http_conn_ops){
        .on_headers = router_on_headers,
        .on_refused = router_on_refused,
        .error_body = router_error_body,
        .on_request = router_on_request,
        .on_stream_commit = router_on_stream_commit,
        .on_pause = router_on_pause,
        .on_resume = router_on_resume,
        .on_close = on_conn_close,
        .arg = s,
    };
    if (s->chat.default_system_dropped)
        log_msg(LOG_WARN,
                "the chat template's default system prompt (%zu bytes) is longer than the "
                "%zu streamsink keeps: chats that send no system message get none",
                s->chat.default_system_dropped, sizeof s->chat.default_system - 1);
    log_msg(LOG_INFO,
            "listening on http://%s:%d (model %s, %s, policy %s, window %lld, %lld slots, "
            "chat %s from %s)",
            s->cfg.host, port, s->model_id, s->info->normalizer, s->info->default_policy,
            (long long)s->info->window, (long long)s->info->max_seqs,
            api_chat_format_name(s->chat.format), chat_from);

    uv_run(s->loop, UV_RUN_DEFAULT);
    code = SERVER_OK;
    log_msg(LOG_INFO, "bye");
    goto out_free;

out_close:
    engine_stop(s->engine);
    s->engine = NULL;
    if (s->listening)
        uv_close((uv_handle_t *)&s->listener, NULL);
    uv_close((uv_handle_t *)&s->wake, NULL);
    uv_close((uv_handle_t *)&s->sigterm, NULL);
    uv_close((uv_handle_t *)&s->sigint, NULL);
    uv_close((uv_handle_t *)&s->drain_timer, NULL);
    uv_close((uv_handle_t *)&s->streams.timer, NULL);
    uv_run(s->loop, UV_RUN_DEFAULT);
out_free:
    if (s->loop)
        uv_loop_close(s->loop);
    free(s->conns);
    free(s->free_slots);
    free(s->streams.buckets);
    free_keys(s);
    free(s);
    return code;
}
