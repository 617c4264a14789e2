/*
 * router.h: what server.c (the loop, listener, engine wake-up, shutdown) and
 * router.c (method + path -> handler, requests -> engine, events -> HTTP)
 * share. Internal to server/.
 *
 * One libuv loop thread owns every socket; the engine thread owns the model.
 * They share only engine.h's queues. The server keeps a slot table of
 * connections: a request id is (sequence number * max_conns + slot), so an
 * engine event finds its connection in O(1), and a late event for a closed
 * connection (or for an earlier request on a reused slot) finds nothing and
 * is dropped. Streamed requests are found in the stream registry first
 * (streams.h): their client may be on another connection, or on none.
 */
#ifndef SS_ROUTER_H
#define SS_ROUTER_H

#include <stdint.h>
#include <uv.h>

#include "api.h"
#include "fair.h"
#include "server.h"
#include "http_conn.h"
#include "metrics.h"
#include "streams.h"

#define SERVER_MAX_KEYS 64
#define SERVER_MAX_MODEL_NAMES 16

struct server {
    uv_loop_t *loop;
    uv_tcp_t listener;
    uv_async_t wake; /* the engine thread's "events are ready" */
    uv_signal_t sigterm, sigint;
    uv_timer_t drain_timer;
    struct server_config cfg;
    struct http_limits lim;
    struct http_conn_ops ops;

    char *keys[SERVER_MAX_KEYS]; /* accepted API keys; none: open */
    size_t n_keys;
    unsigned char owner_secret[16];                  /* the hash key of owners (owner.h) */
    const char *model_names[SERVER_MAX_MODEL_NAMES]; /* model_id, then --model-alias names */
    size_t n_model_names;
    char alias_buf[1024];
    size_t body_bytes; /* request body bytes held by all connections (--max-body-total) */

    struct engine *engine;
    const struct engine_model_info *info;
    struct api_chat_template chat;
    char model_id[128]; /* the model's file name without .gguf */
    char headers[512];  /* sent with every response: X-Streamsink-Replica */
    int64_t started_at; /* unix seconds */

    struct http_conn **conns; /* [max_conns]: slot -> connection */
    int64_t *free_slots;      /* stack of free slot indices */
    int64_t n_free;
    uint64_t next_seq;
    int64_t inflight; /* requests submitted and not finished */

    struct metrics metrics;
    struct streams streams; /* resumable streams (streams.h) */
    int listening;
    int draining; /* SIGTERM/SIGINT: no new work, finish what runs */
    double drain_deadline;
    double cut_answer_deadline; /* cut streams wait for the engine's answer until then (0: none) */
    int cutting;                /* the drain is over: what runs is cut, what arrives refused */
    int drain_feed_logged;      /* the drain said it waits for the engine's feeding */
    int stopped;
    int64_t tokenizing;         /* prompts waiting for or on libuv's worker threads */
    struct fair_queue tok_fair; /* ... which of them gets a worker next (fair.h) */
    int64_t parked;             /* session requests waiting for such a prompt (router.c) */
    int64_t max_prompt_tokens;  /* --max-prompt, else the model's context length */
};

/* One API request between submit and its last event; c->user points here. */
struct srv_req {
    uint64_t id;
    enum metrics_endpoint ep;
    struct api_response resp;
    int stream;
    int started;  /* stream: headers and the first chunk are out */
    int overflow; /* non-streamed text reached --max-response: cancelled */
    int paused;   /* engine_pause sent */
    double t_submit;
    int64_t n_tokens;
    double *t_last; /* [n_t_last]: each sequence's last token (0: none yet) */
    int64_t n_t_last;
    int tokenizing;  /* the prompt is on a worker thread; not submitted yet */
    int *tok_cancel; /* ... and this flag, set when its client leaves, skips the work */
    /* ... the session it names, and whose: a session request for it sent
     * later waits (parked, with its engine request) until it is submitted */
    char tok_session[ENGINE_SESSION_ID_MAX];
    uint64_t tok_owner;
    int parked;
    struct engine_request parked_req;
    struct stream *st; /* streamed: the stream that owns this request */
    /* session API requests: the sessions the engine described, answered at DONE */
    enum engine_request_kind kind;
    struct engine_session_info *infos;
    size_t n_infos, cap_infos;
};

/* The API key c carries, as an index into s->keys: -1 on an open server
 * (no keys), -2 when it carries none of them. Every key is compared in time
 * that depends only on the lengths. */
int router_key_index(const struct server *s, const struct http_conn *c);

/* Frees a request (its response state and itself). */
void router_req_free(struct srv_req *r);
/* An engine event for a streamed request (wherever its client is). */
void router_on_stream_event(struct server *s, struct stream *st, const struct engine_event *ev);

/* http_conn_ops callbacks (arg is the struct server). */
int router_on_headers(struct http_conn *c, struct http_reject *rej, void *arg);
/* ops->on_refused: counts the connection's own error answer. */
void router_on_refused(struct http_conn *c, int status, void *arg);
/* Error bodies in OpenAI's shape, for the transport (http_conn_ops.error_body). */
char *router_error_body(int status, const char *param, const char *code, const char *message,
                        void *arg);
void router_on_request(struct http_conn *c, void *arg);
void router_on_stream_commit(struct http_conn *c, void *arg);
void router_on_pause(struct http_conn *c, void *arg);
void router_on_resume(struct http_conn *c, void *arg);
/* An engine event for the request running on c. */
void router_on_event(struct server *s, struct http_conn *c, const struct engine_event *ev);
/* c is closing: cancels and frees its request, if any. Returns 1 if one was
 * running. */
int router_forget(struct server *s, struct http_conn *c);
/* Shutdown: cancels the request running on c and ends its answer so that the
 * client can tell (an error event + [DONE] on a stream, else a 503). A
 * stream the engine runs ends when the engine's answer to the cancel comes,
 * after every token it made; a second cut ends it at once. */
void router_cut(struct server *s, struct http_conn *c);
/* 1 while a stream on c that was cut waits for that answer. */
int router_cut_pending(const struct http_conn *c);
/* Shutdown: a request still arriving on c when the drain ends gets 503
 * server_shutting_down (it was not going to be run). */
void router_refuse_arriving(struct server *s, struct http_conn *c);

/* server.c: called by the router when a request finishes (drain bookkeeping). */
void server_request_done(struct server *s);
double server_now(void);
/* The connection running request id, or NULL (it left). */
struct http_conn *server_find(struct server *s, uint64_t id);
/* Stopping: stops the engine once no prompt is being tokenized. */
void server_stop_engine(struct server *s);

#endif
