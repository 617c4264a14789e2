/*
 * router.c: method + path -> handler, and the life of one API request on the
 * loop thread:
 *
 *   on_request: route, authorize, parse (api/), engine_submit, hold the reply
 *   on_event:   TOKEN -> a chunk (streamed) or accumulated text (whole)
 *               DONE  -> the final chunk + usage + [DONE], or the whole object
 *               ERROR -> a plain HTTP error if nothing was sent yet, else an
 *                        OpenAI error frame followed by [DONE]
 *
 * Streamed responses hold their headers until the first engine event (or an
 * SSE keep-alive tick), so errors the engine finds before the first token
 * (prompt too long, busy session, bad policy) are plain HTTP errors.
 *
 * A streamed request belongs to its stream (streams.h), not to the
 * connection: its chunks become numbered events in the stream's buffer, the
 * attached connection (if any) is sent what it can take, and
 * GET /v1/streams/{id} attaches another connection to it.
 */
#include "router.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <time.h>

#include "log.h"
#include "owner.h"
#include "sse.h"

#define SSE_HEADERS "Cache-Control: no-cache\r\nX-Accel-Buffering: no\r\n"
#define STREAMS_PREFIX "/v1/streams/"
#define RETRY_AFTER "Retry-After: 1\r\n"

/* ---- replies --------------------------------------------------------------------- */

static void reply(struct server *s, struct http_conn *c, enum metrics_endpoint ep, int status,
                  const char *ctype, const char *extra, const char *body, size_t len)
{
    metrics_count_request(&s->metrics, ep, status);
    http_conn_respond(c, status, ctype, extra, body, len);
}

static void reply_json(struct server *s, struct http_conn *c, enum metrics_endpoint ep, int status,
                       char *json)
{
    if (!json) {
        metrics_count_request(&s->metrics, ep, 500);
        http_conn_respond_error(c, 500, NULL, NULL, NULL, "out of memory");
        return;
    }
    reply(s, c, ep, status, "application/json", NULL, json, strlen(json));
    free(json);
}

static void reply_error(struct server *s, struct http_conn *c, enum metrics_endpoint ep,
                        const struct api_error *e)
{
    const char *extra = e->status == 429 || e->status == 503 ? RETRY_AFTER : NULL;
    char *json = api_error_json(e);
    metrics_count_request(&s->metrics, ep, e->status);
    if (json)
        http_conn_respond(c, e->status, "application/json", extra, json, strlen(json));
    else
        http_conn_respond_error(c, e->status, NULL, NULL, extra, e->message);
    free(json);
}

char *router_error_body(int status, const char *param, const char *code, const char *message,
                        void *arg)
{
    struct api_error e;
    (void)arg;
    api_error_set(&e, status, param, code, "%s", message);
    return api_error_json(&e);
}

static void reply_err(struct server *s, struct http_conn *c, enum metrics_endpoint ep, int status,
                      const char *param, const char *code, const char *msg)
{
    struct api_error e;
    api_error_set(&e, status, param, code, "%s", msg);
    reply_error(s, c, ep, &e);
}

/* ---- simple endpoints ---------------------------------------------------------------- */

static void live_stats(struct server *s, struct metrics_live *l)
{
    memset(l, 0, sizeof *l);
    for (int64_t i = 0; i < s->cfg.max_conns; i++) {
        struct http_conn *c = s->conns[i];
        if (!c)
            continue;
        size_t q = http_conn_write_queue(c);
        l->conns_open++;
        l->conns_paused += c->paused;
        l->write_queue_bytes += q;
        if (q > l->write_queue_max)
            l->write_queue_max = q;
    }
    l->requests_inflight = s->inflight;
    l->body_bytes = s->body_bytes;
    l->body_total = (size_t)s->cfg.max_body_total;
    const struct streams *ss = &s->streams;
    for (const struct stream *st = ss->head; st; st = st->next) {
        l->streams++;
        l->streams_detached += !st->conn && !st->finished;
        l->streams_full += st->full;
    }
    l->stream_buffer_bytes = ss->bytes;
    l->stream_buffer_max = ss->max_bytes;
    l->stream_buffer_total = ss->max_total;
    l->stream_resumes = ss->resumes;
    l->stream_takeovers = ss->takeovers;
    l->streams_expired = ss->expired;
    l->streams_evicted = ss->evicted;
    l->streams_detach_limited = ss->detach_limited;
    l->high_water = s->lim.high_water;
    l->low_water = s->lim.low_water;
    l->draining = s->draining;
}

static void handle_metrics(struct server *s, struct http_conn *c)
{
    struct metrics_live live;
    struct engine_stats es;
    live_stats(s, &live);
    engine_get_stats(s->engine, &es);
    char small[16384];
    size_t n = metrics_render(&s->metrics, &live, &es, s->info, small, sizeof small);
    if (n < sizeof small) {
        reply(s, c, METRICS_EP_METRICS, 200, "text/plain; version=0.0.4; charset=utf-8", NULL,
              small, n);
        return;
    }
    char *big = malloc(n + 1);
    if (!big) {
        reply_err(s, c, METRICS_EP_METRICS, 500, NULL, NULL, "out of memory");
        return;
    }
    metrics_render(&s->metrics, &live, &es, s->info, big, n + 1);
    reply(s, c, METRICS_EP_METRICS, 200, "text/plain; version=0.0.4; charset=utf-8", NULL, big, n);
    free(big);
}

static void handle_health(struct server *s, struct http_conn *c)
{
    struct engine_stats es;
    engine_get_stats(s->engine, &es);
    const char *status = !es.healthy ? "unhealthy" : s->draining ? "draining" : "ok";
    reply_json(s, c, METRICS_EP_HEALTH, es.healthy && !s->draining ? 200 : 503,
               api_health_json(status, s->model_id, es.active_seqs, es.queued, es.slots_free,
                               es.slots_total));
}

static void handle_models(struct server *s, struct http_conn *c, const char *path)
{
    static const char prefix[] = "/v1/models/";
    if (strncmp(path, prefix, sizeof prefix - 1) == 0) {
        const char *want = path + sizeof prefix - 1;
        if (strcmp(want, s->model_id) != 0) {
            char msg[300];
            snprintf(msg, sizeof msg, "The model '%.200s' does not exist", want);
            reply_err(s, c, METRICS_EP_MODELS, 404, "model", "model_not_found", msg);
            return;
        }
        reply_json(s, c, METRICS_EP_MODELS, 200, api_model_json(s->model_id, s->started_at));
        return;
    }
    reply_json(s, c, METRICS_EP_MODELS, 200, api_models_json(s->model_id, s->started_at));
}

/* ---- authorization ------------------------------------------------------------------------ */

/* Compares in time that depends only on the lengths. */
static int same_secret(const char *a, size_t al, const char *b, size_t bl)
{
    volatile unsigned char d = (unsigned char)(al != bl); /* no early exit */
    for (size_t i = 0; i < al && i < bl; i++)
        d = (unsigned char)(d | ((unsigned char)a[i] ^ (unsigned char)b[i]));
    return d == 0;
}

/* The token of "Authorization: Bearer <token>", or NULL. */
static const char *bearer_token(const struct http_conn *c, size_t *len)
{
    const char *h = c->req.authorization;
    if (strncasecmp(h, "Bearer ", 7) != 0)
        return NULL;
    h += 7;
    while (*h == ' ')
        h++;
    size_t hl = strlen(h);
    while (hl > 0 && (h[hl - 1] == ' ' || h[hl - 1] == '\t'))
        hl--;
    *len = hl;
    return h;
}

int router_key_index(const struct server *s, const struct http_conn *c)
{
    if (s->n_keys == 0)
        return -1;
    size_t hl;
    const char *h = bearer_token(c, &hl);
    if (!h)
        return -2;
    unsigned idx = (unsigned)-2;
    for (size_t i = 0; i < s->n_keys; i++) { /* every key is compared: no early exit */
        unsigned m = 0u - (unsigned)same_secret(h, hl, s->keys[i], strlen(s->keys[i]));
        idx = (m & (unsigned)i) | (~m & idx);
    }
    return (int)idx;
}

static int authorized(const struct server *s, const struct http_conn *c)
{
    return router_key_index(s, c) != -2;
}

/* Who owns what an authorized request starts (a resumable stream, a
 * session): an opaque value derived from the key it presented, the same for
 * every request with that key, whatever its place in the key list, and
 * different for another key (a keyed hash, owner.h: no copy of the key is
 * kept and it cannot be guessed). 0 when the API is open. */
static uint64_t owner_of(const struct server *s, const struct http_conn *c)
{
    size_t len;
    const char *token = s->n_keys ? bearer_token(c, &len) : NULL;
    if (!token)
        return 0;
    return owner_of_token(s->owner_secret, token, len);
}

/* Whose detached streams a stream counts among (--max-detached): its
 * owner's when the API has keys; on an open server, where everyone is owner
 * 0, the client's address's (its IPv6 /64; owner.h). */
static uint64_t group_of(const struct server *s, const struct http_conn *c)
{
    if (s->n_keys)
        return owner_of(s, c);
    struct sockaddr_storage peer;
    int len = sizeof peer;
    if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&peer, &len) < 0)
        return 0;
    return owner_group_of_address(s->owner_secret, (const struct sockaddr *)&peer);
}

/* ---- API requests --------------------------------------------------------------------------- */

static size_t token_text(void *arg, int32_t id, char *buf, size_t cap)
{
    return engine_token_text(arg, id, buf, cap);
}

static const char *token_piece(void *arg, int32_t id, size_t *len)
{
    return engine_token_piece(arg, id, len);
}

static void tok_forget(int *cancel);

void router_req_free(struct srv_req *r)
{
    /* a prompt still waiting for a worker: tok_done will find nobody to give
     * its tokens to, so the worker skips it (one not handed to libuv yet is
     * dropped at once, its bytes of the body budget with it) */
    if (r->tokenizing)
        tok_forget(r->tok_cancel);
    engine_request_free(&r->parked_req); /* a session request's: owns nothing */
    api_response_free(&r->resp);
    free(r->infos);
    free(r->t_last);
    free(r);
}

/* The request on c is over (answered, failed or abandoned). A stream's
 * request goes with its stream. */
static void req_done(struct server *s, struct http_conn *c)
{
    struct srv_req *r = c->user;
    if (!r)
        return;
    c->user = NULL;
    if (r->st) {
        r->st->conn = NULL;
        streams_drop(s, r->st);
        return;
    }
    if (r->parked)
        s->parked--;
    router_req_free(r);
    server_request_done(s);
}

static uint64_t fresh_seed(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t x = (uint64_t)ts.tv_nsec * 0x9E3779B97F4A7C15ull ^ (uint64_t)ts.tv_sec;
    x ^= x >> 31;
    return x * 0xBF58476D1CE4E5B9ull;
}

/* BOS, when the model puts one before the request's prompt. */
static int64_t bos_tokens(const struct server *s, const struct engine_request *req)
{
    return req->add_bos && s->info->add_bos ? 1 : 0;
}

/* The 400 for a prompt over --max-prompt (or the model's context): n tokens,
 * BOS included, or, with more, more than the limit (a text prompt's count
 * stops there, so n is only a lower bound). which: the prompt's place in a
 * list of several, else -1. Takes req. */
static void reply_too_long(struct server *s, struct http_conn *c, struct srv_req *r,
                           struct engine_request *req, int64_t n, int more, int which)
{
    char msg[200], name[24] = "the prompt", param[32] = "prompt";
    if (which >= 0) {
        snprintf(name, sizeof name, "prompt %d", which);
        snprintf(param, sizeof param, "prompt[%d]", which);
    }
    if (more)
        snprintf(msg, sizeof msg,
                 "This model's maximum prompt length is %lld tokens; %s has more than %lld "
                 "tokens.",
                 (long long)s->max_prompt_tokens, name, (long long)s->max_prompt_tokens);
    else
        snprintf(msg, sizeof msg,
                 "This model's maximum prompt length is %lld tokens; %s has %lld tokens.",
                 (long long)s->max_prompt_tokens, name, (long long)n);
    engine_request_free(req);
    enum metrics_endpoint ep = r->ep;
    req_done(s, c);
    reply_err(s, c, ep, 400, ep == METRICS_EP_CHAT ? "messages" : param, "context_length_exceeded",
              msg);
}

/* Hands a tokenized request to the engine, or answers why not: a prompt
 * over --max-prompt (or the model's context) never reaches the engine.
 * Takes req. */
static void submit(struct server *s, struct http_conn *c, struct srv_req *r,
                   struct engine_request *req)
{
    for (int p = 0; p < (req->n_prompts > 1 ? req->n_prompts : 1); p++) {
        int64_t n = (p > 0 ? req->more[p - 1].n_ids : req->n_prompt_ids) + bos_tokens(s, req);
        if (n > s->max_prompt_tokens) {
            reply_too_long(s, c, r, req, n, 0, req->n_prompts > 1 ? p : -1);
            return;
        }
    }
    int rc = engine_submit(s->engine, req);
    if (rc < 0) {
        engine_request_free(req);
        enum metrics_endpoint ep = r->ep;
        req_done(s, c);
        if (rc == -EBUSY)
            reply_err(s, c, ep, 429, NULL, "rate_limit_exceeded",
                      "all KV slots are busy and the wait queue is full; retry shortly");
        else
            reply_err(s, c, ep, 503, NULL, NULL, "the engine is not accepting requests");
        return;
    }
    r->t_submit = server_now();
    if (r->stream)
        http_conn_hold_stream(c);
}

/* A text prompt is tokenized on one of libuv's worker threads, so that a
 * megabyte prompt stalls neither the loop nor the engine's running streams.
 * The tokenizer stops once the prompt is known to be over the limit, so a
 * prompt of megabytes holds a worker (there are 4) for what the limit's worth
 * of text costs, not for its length. The request is found again by id when
 * the tokens are back. */
struct tok_work {
    uv_work_t work;
    struct fair_job fj; /* waiting for a worker, by the client's group */
    int waiting;        /* in s->tok_fair, not yet handed to libuv */
    struct server *s;
    uint64_t id;
    struct engine_request req;
    int64_t max; /* the most tokens a prompt may have, BOS aside */
    int64_t n;   /* the first prompt's tokens; max + 1: one prompt has more than max */
    int which;   /* ... that prompt's place in a list of several (-1: the one prompt) */
    int32_t *ids;
    size_t held;            /* bytes of the body budget the prompt's copy holds until tok_done */
    int cancelled;          /* atomic: the client left before a worker took the job */
    int reply;              /* POST /tokenize: the ids are the answer, not a request's prompt */
    struct api_tokenize tk; /* POST /tokenize: how to answer */
};

static void tok_run(uv_work_t *w) /* a worker thread */
{
    struct tok_work *t = w->data;
    if (__atomic_load_n(&t->cancelled, __ATOMIC_ACQUIRE)) {
        t->n = -ECANCELED; /* tok_done drops it: nobody waits for these tokens */
        return;
    }
    struct engine_request *q = &t->req;
    t->which = -1;
    t->n = engine_tokenize_max(t->s->engine, q->prompt, q->prompt_len, q->parse_special, t->max,
                               &t->ids);
    if (t->n > t->max && q->n_prompts > 1)
        t->which = 0;
    for (int p = 1; p < q->n_prompts && t->n >= 0 && t->n <= t->max; p++) {
        if (__atomic_load_n(&t->cancelled, __ATOMIC_ACQUIRE)) {
            t->n = -ECANCELED; /* its client left: the rest is not tokenized */
            return;
        }
        struct engine_prompt *m = &q->more[p - 1];
        int64_t n = engine_tokenize_max(t->s->engine, m->text, m->text_len, q->parse_special,
                                        t->max, &m->ids);
        if (n < 0 || n > t->max) {
            t->n = n; /* (the first prompt's ids are freed with t->ids) */
            t->which = p;
        }
        m->n_ids = n >= 0 && n <= t->max ? n : 0;
    }
}

static void release_parked(struct server *s);
static void tok_done_(uv_work_t *w, int status);

static void tok_dispatch(struct server *s);

/* A prompt's tokens are back (or its request is gone): it goes to the
 * engine, then the session requests that waited for it, and its worker to
 * the next job. */
static void tok_done(uv_work_t *w, int status)
{
    struct tok_work *t = w->data;
    struct server *s = t->s;
    fair_done(&s->tok_fair);
    tok_dispatch(s); /* the worker's next job first */
    tok_done_(w, status);
    release_parked(s);
}

/* The client of the job whose cancel flag is cancel left: a job still
 * waiting in the fair queue is dropped now (nobody waits for its tokens),
 * one handed to libuv is skipped by its worker. */
static void tok_forget(int *cancel)
{
    struct tok_work *t = (struct tok_work *)((char *)cancel - offsetof(struct tok_work, cancelled));
    __atomic_store_n(cancel, 1, __ATOMIC_RELEASE);
    if (!t->waiting)
        return;
    struct server *s = t->s;
    fair_remove(&s->tok_fair, &t->fj);
    s->tokenizing--;
    s->body_bytes -= t->held;
    engine_request_free(&t->req);
    free(t);
    server_stop_engine(s); /* when it was the last, and the server is stopping */
}

/* Hands libuv the jobs that may run now, fairly between clients (fair.h). A
 * job libuv will not take ends as a failed one. */
static void tok_dispatch(struct server *s)
{
    struct fair_job *j;
    while ((j = fair_take(&s->tok_fair))) {
        struct tok_work *t = (struct tok_work *)((char *)j - offsetof(struct tok_work, fj));
        t->waiting = 0;
        if (uv_queue_work(s->loop, &t->work, tok_run, tok_done) == 0)
            continue;
        fair_done(&s->tok_fair);
        tok_done_(&t->work, -1); /* 500 to its client, if it is still there */
        release_parked(s);
    }
}

/* Bytes of text of the tokens first (if >= 0) and ids[0..n). */
static size_t pieces_bytes(const struct server *s, int32_t first, const int32_t *ids, int64_t n)
{
    size_t total = 0, len;
    for (int64_t i = first >= 0 ? -1 : 0; i < n; i++)
        total += engine_token_piece(s->engine, i < 0 ? first : ids[i], &len) ? len : 0;
    return total;
}

/* POST /tokenize's answer: the ids (BOS first when asked for and the model
 * wants one), or 400 when the text has more tokens than a prompt may. Takes
 * t. */
static void reply_tokens(struct server *s, struct http_conn *c, struct tok_work *t)
{
    const enum metrics_endpoint ep = METRICS_EP_TOKENIZE;
    const int32_t bos = bos_tokens(s, &t->req) ? s->info->bos : -1;
    req_done(s, c);
    /* (past the limit the count stopped and there are no ids) */
    const size_t pieces =
        t->tk.with_pieces && t->n <= t->max ? pieces_bytes(s, bos, t->ids, t->n) : 0;
    if (t->n > t->max) {
        char msg[200];
        snprintf(msg, sizeof msg,
                 "the %s has more than %lld tokens, the longest prompt this server takes "
                 "(--max-prompt, or the model's context length)",
                 t->tk.param, (long long)s->max_prompt_tokens);
        reply_err(s, c, ep, 400, t->tk.param, "context_length_exceeded", msg);
    } else if (pieces > (size_t)s->cfg.max_response) {
        char msg[200]; /* an answer's bound, as /detokenize's */
        snprintf(msg, sizeof msg,
                 "the tokens' pieces are %zu bytes, more than an answer may hold "
                 "(--max-response, %lld)",
                 pieces, (long long)s->cfg.max_response);
        reply_err(s, c, ep, 413, "with_pieces", "request_too_large", msg);
    } else {
        reply_json(
            s, c, ep, 200,
            api_tokens_json(bos, t->ids, t->n, t->tk.with_pieces ? token_piece : NULL, s->engine));
    }
    free(t->ids);
    engine_request_free(&t->req);
    free(t);
}

static void tok_done_(uv_work_t *w, int status)
{
    struct tok_work *t = w->data;
    struct server *s = t->s;
    s->tokenizing--;
    s->body_bytes -= t->held;
    struct http_conn *c = s->stopped ? NULL : server_find(s, t->id);
    struct srv_req *r = c ? c->user : NULL;
    if (!r || !r->tokenizing) { /* the client left, or the server is stopping */
        free(t->ids);
        engine_request_free(&t->req);
        free(t);
        server_stop_engine(s);
        return;
    }
    r->tokenizing = 0;
    r->tok_cancel = NULL;
    if (status < 0 || t->n < 0) {
        free(t->ids);
        engine_request_free(&t->req);
        free(t);
        enum metrics_endpoint ep = r->ep;
        req_done(s, c);
        reply_err(s, c, ep, 500, NULL, NULL, "tokenizing the prompt failed");
        return;
    }
    if (t->reply) {
        reply_tokens(s, c, t);
        return;
    }
    if (t->n > t->max) { /* the count stopped there */
        struct engine_request req = t->req;
        const int which = t->which;
        free(t->ids);
        free(t);
        reply_too_long(s, c, r, &req, s->max_prompt_tokens + 1, 1, which);
        return;
    }
    free(t->req.prompt); /* the engine gets the tokens */
    t->req.prompt = NULL;
    t->req.prompt_len = 0;
    t->req.prompt_ids = t->ids;
    t->req.n_prompt_ids = t->n;
    t->req.ids_of_text = t->n > 0;
    for (int p = 1; p < t->req.n_prompts; p++) {
        struct engine_prompt *m = &t->req.more[p - 1];
        free(m->text);
        m->text = NULL;
        m->text_len = 0;
        m->ids_of_text = m->n_ids > 0;
    }
    struct engine_request req = t->req;
    free(t);
    submit(s, c, r, &req);
}

/* The bytes of req's text prompts (several are all texts, or all ids). */
static size_t text_bytes(const struct engine_request *req)
{
    size_t bytes = req->prompt ? req->prompt_len : 0;
    for (int p = 1; req->prompt && p < req->n_prompts; p++)
        bytes += req->more[p - 1].text_len;
    return bytes;
}

/* A queued prompt's copy outlives its connection (the job runs on, and the
 * body is given back when the client leaves), so it holds its bytes of the
 * body budget until its job is done: one client cannot queue prompt after
 * prompt and hang up, past the bound every body keeps to. 1 when req's text
 * cannot be held now (answered, req freed), else 0. */
static int over_budget(struct server *s, struct http_conn *c, enum metrics_endpoint mep,
                       struct engine_request *req)
{
    const size_t bytes = text_bytes(req);
    if (req->prompt && s->cfg.max_body_total > 0 &&
        bytes > (size_t)s->cfg.max_body_total) { /* no retry can help */
        engine_request_free(req);
        reply_err(s, c, mep, 413, NULL, "request_too_large",
                  mep == METRICS_EP_TOKENIZE
                      ? "the content is larger than the server holds at once (--max-body-total)"
                      : "the prompt, as the chat template renders it, is larger than the server "
                        "holds at once (--max-body-total)");
        return 1;
    }
    if (req->prompt && s->cfg.max_body_total > 0 &&
        s->body_bytes + bytes > (size_t)s->cfg.max_body_total) {
        engine_request_free(req);
        reply_err(s, c, mep, 503, NULL, "server_busy",
                  "the server holds as many prompts as it can; retry shortly");
        return 1;
    }
    return 0;
}

/* Sends req's text to a worker thread (t, zeroed, takes req): tok_done then
 * submits it, or with reply answers POST /tokenize. r is c's request. */
static void queue_tokenize(struct server *s, struct http_conn *c, struct srv_req *r,
                           struct tok_work *t, struct engine_request *req, int reply)
{
    t->s = s;
    t->id = r->id;
    t->req = *req;
    t->reply = reply;
    t->max = s->max_prompt_tokens - bos_tokens(s, req);
    if (t->max < 0)
        t->max = 0;
    t->work.data = t;
    t->fj.group = group_of(s, c);
    t->fj.cost = (uint64_t)(t->req.n_prompts > 1 ? t->req.n_prompts : 1);
    r->tokenizing = 1;
    r->tok_cancel = &t->cancelled;
    snprintf(r->tok_session, sizeof r->tok_session, "%s", t->req.session_id);
    r->tok_owner = t->req.owner;
    s->tokenizing++;
    t->held = text_bytes(&t->req);
    s->body_bytes += t->held;
    t->waiting = 1;
    fair_push(&s->tok_fair, &t->fj);
    tok_dispatch(s);
}

/* The most values a body may hold: a token-array prompt (or /detokenize's
 * ids) may be as long as the longest prompt, with room. */
static size_t max_json_values(const struct server *s)
{
    return (size_t)(4 * s->max_prompt_tokens > 65536 ? 4 * s->max_prompt_tokens : 65536);
}

static void handle_generate(struct server *s, struct http_conn *c, enum api_endpoint ep,
                            enum metrics_endpoint mep)
{
    if (s->draining) {
        reply_err(s, c, mep, 503, NULL, "server_shutting_down", "the server is shutting down");
        return;
    }
    uint64_t id = s->next_seq++ * (uint64_t)s->cfg.max_conns + c->user_id;
    struct api_parse_ctx ctx = {
        .model = s->info,
        .chat = &s->chat,
        .session_header = c->req.session_id[0] ? c->req.session_id : NULL,
        .id = id,
        .owner = owner_of(s, c),
        .default_seed = fresh_seed(),
        .max_stop_len = ENGINE_MAX_STOP_LEN,
        .model_names = s->model_names,
        .n_model_names = s->n_model_names,
        .max_json_values = max_json_values(s),
    };
    struct engine_request req;
    struct api_request meta;
    struct api_error err;
    if (api_request_parse(&ctx, ep, c->req.body, c->req.body_len, &req, &meta, &err) < 0) {
        reply_error(s, c, mep, &err);
        return;
    }
    http_conn_release_body(c); /* the request holds what it needs of it */
    req.prefix_group = group_of(s, c);
    if (over_budget(s, c, mep, &req))
        return;
    struct srv_req *r = calloc(1, sizeof *r);
    struct tok_work *t = req.prompt ? calloc(1, sizeof *t) : NULL;
    struct api_token_text tt = {token_text, s->engine};
    /* each of the request's sequences (choices of every prompt) its own
     * inter-token clock */
    const int64_t places =
        (int64_t)(req.n_choices > 1 ? req.n_choices : 1) * (req.n_prompts > 1 ? req.n_prompts : 1);
    double *t_last = calloc((size_t)places, sizeof *t_last);
    if (!r || (req.prompt && !t) || !t_last ||
        api_response_init(&r->resp, &meta, s->model_id, id, (int64_t)time(NULL),
                          (size_t)s->cfg.max_response, &tt) < 0) {
        free(r);
        free(t);
        free(t_last);
        engine_request_free(&req);
        reply_err(s, c, mep, 500, NULL, NULL, "out of memory");
        return;
    }
    r->id = id;
    r->ep = mep;
    r->t_last = t_last;
    r->n_t_last = places;
    r->stream = meta.stream;
    if (r->stream && !streams_create(s, r, c, owner_of(s, c), group_of(s, c))) {
        router_req_free(r);
        free(t);
        engine_request_free(&req);
        reply_err(s, c, mep, 503, NULL, "server_busy",
                  "the server holds as many streams as it can; retry shortly");
        return;
    }
    c->user = r;
    s->inflight++;
    if (!t) { /* token ids from the client */
        submit(s, c, r, &req);
        return;
    }
    queue_tokenize(s, c, r, t, &req, 0);
}

/* POST /tokenize: the text goes to a worker as a prompt's would, under the
 * same limits (the body budget; the count stops past the longest prompt). */
static void handle_tokenize(struct server *s, struct http_conn *c)
{
    const enum metrics_endpoint mep = METRICS_EP_TOKENIZE;
    if (s->draining) {
        reply_err(s, c, mep, 503, NULL, "server_shutting_down", "the server is shutting down");
        return;
    }
    uint64_t id = s->next_seq++ * (uint64_t)s->cfg.max_conns + c->user_id;
    struct api_parse_ctx ctx = {.model = s->info, .id = id, .max_json_values = max_json_values(s)};
    struct engine_request req;
    struct api_tokenize tk;
    struct api_error err;
    if (api_tokenize_parse(&ctx, c->req.body, c->req.body_len, &req, &tk, &err) < 0) {
        reply_error(s, c, mep, &err);
        return;
    }
    http_conn_release_body(c);
    if (over_budget(s, c, mep, &req))
        return;
    struct srv_req *r = calloc(1, sizeof *r);
    struct tok_work *t = calloc(1, sizeof *t);
    if (!r || !t) {
        free(r);
        free(t);
        engine_request_free(&req);
        reply_err(s, c, mep, 500, NULL, NULL, "out of memory");
        return;
    }
    r->id = id;
    r->ep = mep;
    c->user = r;
    s->inflight++;
    t->tk = tk; /* param points at a string constant */
    queue_tokenize(s, c, r, t, &req, 1);
}

/* POST /detokenize: the ids' bytes joined, on the loop (the body's value
 * limit bounds the ids; each is a table lookup). */
static void handle_detokenize(struct server *s, struct http_conn *c)
{
    const enum metrics_endpoint mep = METRICS_EP_DETOKENIZE;
    struct api_parse_ctx ctx = {
        .model = s->info,
        .max_json_values = max_json_values(s),
    };
    int32_t *ids;
    int64_t n;
    struct api_error err;
    if (api_detokenize_parse(&ctx, c->req.body, c->req.body_len, &ids, &n, &err) < 0) {
        reply_error(s, c, mep, &err);
        return;
    }
    size_t total = pieces_bytes(s, -1, ids, n), len;
    if (total > (size_t)s->cfg.max_response) { /* an answer's bound, as a completion's */
        char msg[200];
        free(ids);
        snprintf(msg, sizeof msg,
                 "the tokens' text is %zu bytes, more than an answer may hold (--max-response, "
                 "%lld)",
                 total, (long long)s->cfg.max_response);
        reply_err(s, c, mep, 413, "tokens", "request_too_large", msg);
        return;
    }
    char *text = malloc(total + 1);
    if (!text) {
        free(ids);
        reply_err(s, c, mep, 500, NULL, NULL, "out of memory");
        return;
    }
    size_t at = 0;
    for (int64_t i = 0; i < n; i++) {
        const char *p = engine_token_piece(s->engine, ids[i], &len);
        if (p) {
            memcpy(text + at, p, len);
            at += len;
        }
    }
    free(ids);
    reply_json(s, c, mep, 200, api_content_json(text, at));
    free(text);
}

/* ---- the session API ------------------------------------------------------------------------ */

/* A new session id: "sess_" and 128 random bits from getrandom (never
 * guessed from another id). Returns 0 or -errno. */
static int mint_session_id(char *buf, size_t cap)
{
    unsigned char r[16];
    size_t got = 0;
    while (got < sizeof r) {
        ssize_t n = getrandom(r + got, sizeof r - got, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -EIO;
        got += (size_t)n;
    }
    static const char hex[] = "0123456789abcdef";
    if (cap < 5 + 2 * sizeof r + 1)
        return -ENOSPC;
    memcpy(buf, "sess_", 5);
    for (size_t i = 0; i < sizeof r; i++) {
        buf[5 + 2 * i] = hex[r[i] >> 4];
        buf[6 + 2 * i] = hex[r[i] & 15];
    }
    buf[5 + 2 * sizeof r] = 0;
    return 0;
}

static void submit_session(struct server *s, struct http_conn *c, struct srv_req *r,
                           struct engine_request *req)
{
    int rc = engine_submit(s->engine, req);
    if (rc < 0) {
        req_done(s, c);
        if (rc == -EBUSY)
            reply_err(s, c, METRICS_EP_SESSIONS, 429, NULL, "rate_limit_exceeded",
                      "the engine's queue is full; retry shortly");
        else
            reply_err(s, c, METRICS_EP_SESSIONS, 503, NULL, NULL,
                      "the engine is not accepting requests");
        return;
    }
    r->t_submit = server_now();
}

/* 1 if a request of owner naming session id is being tokenized: sent
 * before, and not yet in the engine's queue. */
static int prompt_ahead(const struct server *s, uint64_t owner, const char *id)
{
    for (int64_t i = 0; s->tokenizing > 0 && i < s->cfg.max_conns; i++) {
        const struct http_conn *c = s->conns[i];
        const struct srv_req *r = c ? c->user : NULL;
        if (r && r->tokenizing && r->tok_owner == owner && r->tok_session[0] &&
            engine_session_id_equal(r->tok_session, id))
            return 1;
    }
    return 0;
}

/* Submits the parked session requests that no prompt is ahead of any
 * more, in the order they came (their ids grow with arrival). */
static void release_parked(struct server *s)
{
    while (s->parked > 0 && !s->stopped) {
        struct http_conn *first = NULL;
        for (int64_t i = 0; i < s->cfg.max_conns; i++) {
            struct http_conn *c = s->conns[i];
            struct srv_req *r = c ? c->user : NULL;
            if (r && r->parked && !prompt_ahead(s, r->parked_req.owner, r->parked_req.session_id) &&
                (!first || r->id < ((struct srv_req *)first->user)->id))
                first = c;
        }
        if (!first)
            return;
        struct srv_req *r = first->user;
        r->parked = 0;
        s->parked--;
        struct engine_request req = r->parked_req;
        submit_session(s, first, r, &req);
    }
}

/* GET /v1/sessions, POST /v1/sessions (a new id), GET and DELETE
 * /v1/sessions/{id}, POST /v1/sessions/{id}/save: a session request to the
 * engine, bound to the caller's key, answered when its DONE arrives. */
static void handle_sessions(struct server *s, struct http_conn *c, const char *path)
{
    static const char base[] = "/v1/sessions";
    const char *rest = path + sizeof base - 1; /* "" or "/id" or "/id/save" */
    enum engine_request_kind kind;
    /* nothing of a body is used here: its room goes back to --max-body-total
     * now, not when the session IO thread answers */
    http_conn_release_body(c);
    char id[ENGINE_SESSION_ID_MAX] = "";
    if (!rest[0]) {
        if (c->req.method == HTTP_POST) {
            char fresh[64];
            if (mint_session_id(fresh, sizeof fresh) < 0) {
                reply_err(s, c, METRICS_EP_SESSIONS, 500, NULL, NULL,
                          "no random bytes for a session id");
                return;
            }
            reply_json(s, c, METRICS_EP_SESSIONS, 201, api_session_new_json(fresh));
            return;
        }
        kind = ENGINE_REQ_SESSION_LIST;
    } else {
        const char *p = rest + 1;
        size_t n = strcspn(p, "/");
        const char *tail = p + n;
        if (n == 0 || n >= sizeof id) {
            reply_err(s, c, METRICS_EP_SESSIONS, 400, "session_id", "invalid_value",
                      "Invalid session id in the URL.");
            return;
        }
        memcpy(id, p, n);
        id[n] = 0;
        if (!engine_session_id_valid(id)) {
            reply_err(s, c, METRICS_EP_SESSIONS, 400, "session_id", "invalid_value",
                      "Invalid session id: expected 1 to 127 characters of A-Z, a-z, 0-9, '_' "
                      "and '-'.");
            return;
        }
        int m = c->req.method;
        if (strcmp(tail, "/save") == 0 && m == HTTP_POST)
            kind = ENGINE_REQ_SESSION_SAVE;
        else if (!tail[0] && (m == HTTP_GET || m == HTTP_HEAD))
            kind = ENGINE_REQ_SESSION_GET;
        else if (!tail[0] && m == HTTP_DELETE)
            kind = ENGINE_REQ_SESSION_DELETE;
        else if (tail[0] && strcmp(tail, "/save") != 0) {
            reply_err(s, c, METRICS_EP_SESSIONS, 404, NULL, "unknown_url", "Unknown request URL.");
            return;
        } else {
            reply_err(s, c, METRICS_EP_SESSIONS, 405, NULL, "method_not_allowed",
                      tail[0] ? "Use POST on /v1/sessions/{id}/save."
                              : "Use GET or DELETE on /v1/sessions/{id}.");
            return;
        }
    }
    if (s->draining) {
        reply_err(s, c, METRICS_EP_SESSIONS, 503, NULL, "server_shutting_down",
                  "the server is shutting down");
        return;
    }
    struct srv_req *r = calloc(1, sizeof *r);
    if (!r) {
        reply_err(s, c, METRICS_EP_SESSIONS, 500, NULL, NULL, "out of memory");
        return;
    }
    uint64_t rid = s->next_seq++ * (uint64_t)s->cfg.max_conns + c->user_id;
    struct engine_request req;
    memset(&req, 0, sizeof req);
    req.id = rid;
    req.kind = kind;
    req.owner = owner_of(s, c);
    snprintf(req.session_id, sizeof req.session_id, "%s", id);
    r->id = rid;
    r->ep = METRICS_EP_SESSIONS;
    r->kind = kind;
    c->user = r;
    s->inflight++;
    if (kind != ENGINE_REQ_SESSION_LIST && prompt_ahead(s, req.owner, id)) {
        /* a completion naming the session came first and is still being
         * tokenized: the engine must see it first (a DELETE would
         * otherwise overtake it) */
        r->parked = 1;
        r->parked_req = req;
        s->parked++;
        return;
    }
    submit_session(s, c, r, &req);
}

static void on_session_event(struct server *s, struct http_conn *c, struct srv_req *r,
                             const struct engine_event *ev)
{
    if (ev->kind == ENGINE_EV_SESSION) {
        if (r->n_infos == r->cap_infos) {
            size_t nc = r->cap_infos ? 2 * r->cap_infos : 8;
            void *p = realloc(r->infos, nc * sizeof *r->infos);
            if (!p)
                return;
            r->infos = p;
            r->cap_infos = nc;
        }
        r->infos[r->n_infos++] = ev->session;
        return;
    }
    if (ev->kind == ENGINE_EV_ERROR) {
        struct api_error e;
        int status = ev->status >= 400 && ev->status <= 599 ? ev->status : 500;
        api_error_set(&e, status, ev->param[0] ? ev->param : NULL, ev->code[0] ? ev->code : NULL,
                      "%s", ev->message[0] ? ev->message : "engine error");
        req_done(s, c);
        reply_error(s, c, METRICS_EP_SESSIONS, &e);
        return;
    }
    char *json = NULL;
    int status = 200;
    if (r->kind == ENGINE_REQ_SESSION_LIST) {
        json = api_session_list_json(r->infos, r->n_infos);
    } else if (r->kind == ENGINE_REQ_SESSION_DELETE) {
        status = 204;
    } else if (r->n_infos > 0) {
        json = api_session_json(&r->infos[0]);
    }
    req_done(s, c);
    if (status == 204)
        reply(s, c, METRICS_EP_SESSIONS, 204, NULL, NULL, NULL, 0);
    else
        reply_json(s, c, METRICS_EP_SESSIONS, status, json);
}

/* ---- resuming a stream ---------------------------------------------------------------- */

/* The response headers of a stream: SSE's, and the stream's id. */
static void stream_headers(const struct stream *st, char *buf, size_t cap)
{
    snprintf(buf, cap, "%sX-Stream-Id: %s\r\n", SSE_HEADERS, st->sid);
}

/* GET /v1/streams/{id} with Last-Event-ID: the events after it, then the
 * live stream. A stream another key started does not exist for this one. */
static void handle_resume(struct server *s, struct http_conn *c, const char *path)
{
    const enum metrics_endpoint ep = METRICS_EP_STREAMS;
    const char *sid = path + strlen(STREAMS_PREFIX);
    if (c->req.method != HTTP_GET) {
        struct api_error e;
        api_error_set(&e, 405, NULL, "method_not_allowed",
                      "Method %s is not allowed on " STREAMS_PREFIX "{id}; use GET.",
                      llhttp_method_name((llhttp_method_t)c->req.method));
        char *json = api_error_json(&e);
        metrics_count_request(&s->metrics, ep, 405);
        if (json)
            http_conn_respond(c, 405, "application/json", "Allow: GET\r\n", json, strlen(json));
        else
            http_conn_respond_error(c, 405, NULL, NULL, "Allow: GET\r\n", e.message);
        free(json);
        return;
    }
    if (s->draining) {
        reply_err(s, c, ep, 503, NULL, "server_shutting_down", "the server is shutting down");
        return;
    }
    if (!stream_id_valid(sid, strlen(sid))) {
        reply_err(s, c, ep, 400, NULL, "invalid_stream_id",
                  "a stream id is 32 lowercase hexadecimal characters (the X-Stream-Id header)");
        return;
    }
    struct stream *st = streams_find_sid(&s->streams, sid);
    if (!st || !st->started || st->owner != owner_of(s, c)) {
        reply_err(s, c, ep, 404, NULL, "stream_not_found",
                  "no such stream: it never existed, or it ended or was left unclaimed longer "
                  "than the server's grace period");
        return;
    }
    uint64_t last = 0;
    if (c->req.has_last_event_id &&
        (c->req.last_event_id_long ||
         stream_event_id_parse(c->req.last_event_id, strlen(c->req.last_event_id), &last) < 0)) {
        reply_err(s, c, ep, 400, NULL, "invalid_last_event_id",
                  "Last-Event-ID must be the decimal id of an event of this stream");
        return;
    }
    char headers[256];
    stream_headers(st, headers, sizeof headers);
    uint64_t newest = st->buf.last;
    uint64_t oldest = stream_buf_oldest_resumable(&st->buf);
    int rc = streams_attach(s, st, c, last, headers);
    if (rc == -ERANGE) {
        char msg[200];
        snprintf(msg, sizeof msg,
                 "Last-Event-ID %llu is beyond the last event of this stream (%llu)",
                 (unsigned long long)last, (unsigned long long)newest);
        reply_err(s, c, ep, 400, NULL, "invalid_last_event_id", msg);
        return;
    }
    if (rc == -ESTALE) {
        char msg[200];
        snprintf(msg, sizeof msg,
                 "the events after %llu are no longer buffered; the oldest id this stream can "
                 "resume from is %llu",
                 (unsigned long long)last, (unsigned long long)oldest);
        reply_err(s, c, ep, 410, NULL, "stream_events_expired", msg);
        return;
    }
    metrics_count_request(&s->metrics, ep, 200);
}

/* ---- routing ------------------------------------------------------------------------------- */

struct route {
    const char *path;
    int prefix;  /* match path as a prefix */
    int method;  /* llhttp method */
    int method2; /* a second one, or -1 */
    const char *allow;
    enum metrics_endpoint ep;
    int open; /* answered without an API key (probes) */
};

static const struct route routes[] = {
    {"/v1/completions", 0, HTTP_POST, -1, "POST", METRICS_EP_COMPLETIONS, 0},
    {"/v1/chat/completions", 0, HTTP_POST, -1, "POST", METRICS_EP_CHAT, 0},
    {"/v1/models", 0, HTTP_GET, -1, "GET, HEAD", METRICS_EP_MODELS, 0},
    {"/v1/models/", 1, HTTP_GET, -1, "GET, HEAD", METRICS_EP_MODELS, 0},
    {"/v1/sessions", 0, HTTP_GET, HTTP_POST, "GET, HEAD, POST", METRICS_EP_SESSIONS, 0},
    /* GET, DELETE /v1/sessions/{id}; POST /v1/sessions/{id}/save (handle_sessions) */
    {"/v1/sessions/", 1, HTTP_GET, HTTP_DELETE, "GET, HEAD, DELETE, POST", METRICS_EP_SESSIONS, 0},
    {STREAMS_PREFIX, 1, HTTP_GET, -1, "GET", METRICS_EP_STREAMS, 0},
    {"/tokenize", 0, HTTP_POST, -1, "POST", METRICS_EP_TOKENIZE, 0},
    {"/detokenize", 0, HTTP_POST, -1, "POST", METRICS_EP_DETOKENIZE, 0},
    {"/health", 0, HTTP_GET, -1, "GET, HEAD", METRICS_EP_HEALTH, 1},
    {"/metrics", 0, HTTP_GET, -1, "GET, HEAD", METRICS_EP_METRICS, 1},
};

/* The path of the request target: origin form as sent, the absolute form
 * ("http://host/path", RFC 9112 3.2.2: a server must take it) past its
 * scheme and authority. */
static void path_of(const struct http_conn *c, char *path, size_t cap)
{
    const char *u = c->req.url;
    size_t scheme = strncasecmp(u, "http://", 7) == 0    ? 7
                    : strncasecmp(u, "https://", 8) == 0 ? 8
                                                         : 0;
    if (scheme) {
        u += scheme + strcspn(u + scheme, "/?#");
        if (*u != '/') { /* no path: the root, and then its query */
            snprintf(path, cap, "/");
            return;
        }
    }
    snprintf(path, cap, "%s", u);
    path[strcspn(path, "?#")] = 0;
}

static const struct route *find_route(const char *path)
{
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
        const struct route *r = &routes[i];
        if (r->prefix ? strncmp(path, r->path, strlen(r->path)) == 0 && path[strlen(r->path)]
                      : strcmp(path, r->path) == 0)
            return r;
    }
    return NULL;
}

/* What the request line and headers alone decide, in this order: the key
 * (before anything else is revealed, even whether the path exists), the
 * route, the method. Returns 0 and *out, or a status with rej filled. */
static int check_request(const struct server *s, const struct http_conn *c, const char *path,
                         const struct route **out, struct http_reject *rej)
{
    const struct route *rt = find_route(path);
    *out = rt;
    memset(rej, 0, sizeof *rej);
    if ((!rt || !rt->open) && !authorized(s, c)) {
        rej->status = 401;
        snprintf(rej->code, sizeof rej->code, "invalid_api_key");
        snprintf(rej->message, sizeof rej->message,
                 "Incorrect API key provided. Send it as 'Authorization: Bearer <key>'.");
        return 401;
    }
    const char *method = llhttp_method_name((llhttp_method_t)c->req.method);
    if (!rt) {
        rej->status = 404;
        snprintf(rej->code, sizeof rej->code, "unknown_url");
        snprintf(rej->message, sizeof rej->message, "Unknown request URL: %s %.200s.", method,
                 path);
        return 404;
    }
    int post_save = rt->ep == METRICS_EP_SESSIONS && rt->prefix && c->req.method == HTTP_POST;
    if (c->req.method != rt->method && c->req.method != rt->method2 && !post_save &&
        !(c->req.method == HTTP_HEAD && rt->method == HTTP_GET)) {
        rej->status = 405;
        snprintf(rej->code, sizeof rej->code, "method_not_allowed");
        snprintf(rej->message, sizeof rej->message, "Method %s is not allowed on %.150s; use %s.",
                 method, path, rt->allow);
        snprintf(rej->extra_headers, sizeof rej->extra_headers, "Allow: %s\r\n", rt->allow);
        return 405;
    }
    return 0;
}

/* The endpoints a draining server refuses (503): those that start work. */
static int draining_refuses(enum metrics_endpoint ep)
{
    return ep == METRICS_EP_COMPLETIONS || ep == METRICS_EP_CHAT || ep == METRICS_EP_SESSIONS ||
           ep == METRICS_EP_STREAMS || ep == METRICS_EP_TOKENIZE;
}

static int shutting_down(struct http_reject *rej)
{
    rej->status = 503;
    snprintf(rej->code, sizeof rej->code, "server_shutting_down");
    snprintf(rej->message, sizeof rej->message, "the server is shutting down");
    snprintf(rej->extra_headers, sizeof rej->extra_headers, RETRY_AFTER);
    return rej->status;
}

/* The endpoint a refusal of c is counted under: its route's once its
 * headers are in and the route is open or the key right; else "other", so
 * that the open /metrics does not tell a client without the key which
 * paths exist (a 401 is decided before the path is looked at). */
static enum metrics_endpoint refused_ep(const struct server *s, const struct http_conn *c,
                                        int status)
{
    if (status == 401 || !c->in_trailers)
        return METRICS_EP_OTHER;
    char path[HTTP_URL_MAX];
    path_of(c, path, sizeof path);
    const struct route *rt = find_route(path);
    return rt && (rt->open || authorized(s, c)) ? rt->ep : METRICS_EP_OTHER;
}

int router_on_headers(struct http_conn *c, struct http_reject *rej, void *arg)
{
    struct server *s = arg;
    char path[HTTP_URL_MAX];
    const struct route *rt;
    path_of(c, path, sizeof path);
    int st = check_request(s, c, path, &rt, rej);
    if (!st && s->draining && draining_refuses(rt->ep))
        st = shutting_down(rej); /* from the headers: no 100 Continue, no body for nothing */
    if (st)
        metrics_count_request(&s->metrics, refused_ep(s, c, st), st);
    return st;
}

void router_on_refused(struct http_conn *c, int status, void *arg)
{
    struct server *s = arg;
    metrics_count_request(&s->metrics, refused_ep(s, c, status), status);
}

void router_refuse_arriving(struct server *s, struct http_conn *c)
{
    struct http_reject rej;
    if (!http_conn_receiving(c))
        return;
    metrics_count_request(&s->metrics, refused_ep(s, c, 503), shutting_down(&rej));
    http_conn_refuse(c, &rej);
}

void router_on_request(struct http_conn *c, void *arg)
{
    struct server *s = arg;
    char path[HTTP_URL_MAX];
    const struct route *rt;
    struct http_reject rej;
    path_of(c, path, sizeof path);
    if (check_request(s, c, path, &rt, &rej)) { /* refused from the headers already, normally */
        metrics_count_request(&s->metrics, refused_ep(s, c, rej.status), rej.status);
        http_conn_respond_error(c, rej.status, NULL, rej.code,
                                rej.extra_headers[0] ? rej.extra_headers : NULL, rej.message);
        return;
    }
    switch (rt->ep) {
    case METRICS_EP_COMPLETIONS:
        handle_generate(s, c, API_COMPLETIONS, rt->ep);
        break;
    case METRICS_EP_CHAT:
        handle_generate(s, c, API_CHAT, rt->ep);
        break;
    case METRICS_EP_MODELS:
        handle_models(s, c, path);
        break;
    case METRICS_EP_HEALTH:
        handle_health(s, c);
        break;
    case METRICS_EP_METRICS:
        handle_metrics(s, c);
        break;
    case METRICS_EP_SESSIONS:
        handle_sessions(s, c, path);
        break;
    case METRICS_EP_STREAMS:
        handle_resume(s, c, path);
        break;
    case METRICS_EP_TOKENIZE:
        handle_tokenize(s, c);
        break;
    case METRICS_EP_DETOKENIZE:
        handle_detokenize(s, c);
        break;
    default:
        reply_err(s, c, METRICS_EP_OTHER, 404, NULL, "unknown_url", "Unknown request URL.");
        break;
    }
}

/* ---- streaming ----------------------------------------------------------------------------- */

/* Headers (with X-Stream-Id), then the chat stream's role chunk. */
static void begin_stream(struct server *s, struct stream *st)
{
    struct http_conn *c = st->conn;
    if (st->started || !c)
        return;
    char headers[256];
    stream_headers(st, headers, sizeof headers);
    metrics_count_request(&s->metrics, st->req->ep, 200);
    if (http_conn_stream_begin(c, 200, "text/event-stream; charset=utf-8", headers) < 0)
        return;
    st->started = 1;
    for (int i = 0; i < st->req->resp.n_ch && !st->finished; i++) {
        char *json = api_response_role_chunk(&st->req->resp, i);
        if (json)
            streams_emit_json(s, st, json);
        free(json);
    }
}

void router_on_stream_commit(struct http_conn *c, void *arg)
{
    struct srv_req *r = c->user;
    if (r && r->st)
        begin_stream(arg, r->st);
}

void router_on_pause(struct http_conn *c, void *arg)
{
    struct server *s = arg;
    struct srv_req *r = c->user;
    if (r && r->st) {
        streams_flow(s, r->st);
    } else if (r && !r->paused) {
        r->paused = 1;
        engine_pause(s->engine, r->id);
    }
}

void router_on_resume(struct http_conn *c, void *arg)
{
    struct server *s = arg;
    struct srv_req *r = c->user;
    if (r && r->st) {
        streams_pump(s, r->st); /* what waited in the buffer, then the engine again */
    } else if (r && r->paused) {
        r->paused = 0;
        engine_resume(s->engine, r->id);
    }
}

/* ---- engine events ----------------------------------------------------------------------------
 */

static void count_token(struct server *s, struct srv_req *r, const struct engine_event *ev)
{
    if (ev->token < 0)
        return;
    double t = server_now();
    if (r->n_tokens == 0)
        metrics_hist_observe(&s->metrics.ttft, t - r->t_submit);
    /* inter-token latency is each choice's own: n choices step together, and
     * the gaps between their tokens of one step are none */
    int64_t k = ev->choice;
    if (k >= 0 && k < r->n_t_last) {
        if (r->t_last[k] > 0)
            metrics_hist_observe(&s->metrics.itl, t - r->t_last[k]);
        r->t_last[k] = t;
    }
    r->n_tokens++;
    s->metrics.streamed_tokens++;
}

/* A non-streamed request's token: accumulated until DONE. */
static void on_token(struct server *s, struct srv_req *r, const struct engine_event *ev)
{
    count_token(s, r, ev);
    if (r->overflow)
        return;
    if (api_response_add(&r->resp, ev) < 0) {
        /* --max-response reached: stop the sequences; DONE answers "length" */
        r->overflow = 1;
        engine_cancel(s->engine, r->id);
    }
}

static void on_done(struct server *s, struct http_conn *c, struct srv_req *r,
                    const struct engine_event *ev)
{
    struct engine_event done = *ev;
    if (r->overflow && done.choice >= 0 && done.choice < r->resp.n_ch)
        api_done_cut(&done, r->resp.ch[done.choice].tokens_held);
    if (done.choices_left > 0) { /* one choice ended; others run */
        api_response_choice_done(&r->resp, &done);
        return;
    }
    char *body = api_response_body(&r->resp, &done);
    enum metrics_endpoint ep = r->ep;
    req_done(s, c);
    reply_json(s, c, ep, 200, body);
}

/* Ends a stream with an error: a plain HTTP error while nothing was sent
 * (its client is then attached: a stream is resumable only once started),
 * else an OpenAI error frame followed by [DONE]. */
static void fail_stream(struct server *s, struct stream *st, const struct api_error *err)
{
    if (!st->started) {
        struct http_conn *c = st->conn;
        const struct api_error e = *err;
        enum metrics_endpoint ep = st->req->ep;
        if (!c) {
            streams_drop(s, st);
            return;
        }
        req_done(s, c); /* drops st */
        reply_error(s, c, ep, &e);
        return;
    }
    char *json = api_error_json(err);
    if (json)
        streams_emit_json(s, st, json);
    free(json);
    streams_emit_done(s, st);
}

static void engine_error(const struct srv_req *r, const struct engine_event *ev,
                         struct api_error *e)
{
    int status = ev->status >= 400 && ev->status <= 599 ? ev->status : 500;
    const char *code = ev->code[0]     ? ev->code
                       : status == 409 ? "session_busy"
                       : status == 429 ? "rate_limit_exceeded"
                                       : NULL;
    const char *param = ev->param[0] ? ev->param : NULL;
    if (param && strcmp(param, "prompt") == 0 && r->ep == METRICS_EP_CHAT)
        param = "messages"; /* the chat prompt is rendered from the messages */
    api_error_set(e, status, param, code, "%s", ev->message[0] ? ev->message : "engine error");
}

/* Emits a chunk unless the stream ended meanwhile (an emit can end it). */
static void emit(struct server *s, struct stream *st, char *json)
{
    if (json && !st->finished)
        streams_emit_json(s, st, json);
    free(json);
}

static void cut_error(struct api_error *e)
{
    api_error_set(e, 503, NULL, "server_shutting_down",
                  "the server is shutting down; this request was cut at the drain timeout");
}

int router_cut_pending(const struct http_conn *c)
{
    const struct srv_req *r = c->user;
    return r && r->st && r->st->cut && !r->st->finished;
}

void router_on_stream_event(struct server *s, struct stream *st, const struct engine_event *ev)
{
    struct srv_req *r = st->req;
    if (st->finished)
        return; /* after a cut or a cancel: the engine's last word is not news */
    switch (ev->kind) {
    case ENGINE_EV_TOKEN:
        count_token(s, r, ev);
        begin_stream(s, st);
        emit(s, st, api_response_chunk(&r->resp, ev));
        break;
    case ENGINE_EV_DONE:
        if (st->cut && ev->finish == ENGINE_FINISH_CANCELLED) {
            if (ev->choices_left > 0)
                break; /* the cut's error frame ends the stream at the last */
            struct api_error e;
            cut_error(&e);
            fail_stream(s, st, &e);
            break;
        }
        begin_stream(s, st);
        emit(s, st, api_response_final_chunk(&r->resp, ev));
        if (ev->choices_left > 0)
            break; /* one choice ended; others run */
        /* choices that never ran (cancelled while waiting) end with it */
        for (int i = 0; i < r->resp.n_ch; i++) {
            if (r->resp.ch[i].ended)
                continue;
            struct engine_event other = *ev;
            other.choice = i;
            other.completion_tokens = 0;
            emit(s, st, api_response_final_chunk(&r->resp, &other));
        }
        if (r->resp.meta.include_usage)
            emit(s, st, api_response_usage_chunk(&r->resp));
        streams_emit_done(s, st);
        break;
    case ENGINE_EV_ERROR: {
        struct api_error e;
        engine_error(r, ev, &e);
        fail_stream(s, st, &e);
        break;
    }
    case ENGINE_EV_SESSION: /* only session requests get these, never streamed */
        break;
    }
}

void router_cut(struct server *s, struct http_conn *c)
{
    struct srv_req *r = c->user;
    if (!r)
        return;
    if (!r->tokenizing) /* a text on a worker is not in the engine */
        engine_cancel(s->engine, r->id);
    struct api_error e;
    cut_error(&e);
    if (r->st) {
        /* In the engine, it may have made tokens the stream has not had
         * yet (a session keeps them): they come before the cancel's DONE, and
         * the stream ends there, its client having had every token. A
         * second cut (a second signal) ends it now. */
        if (!r->tokenizing && !r->parked && !r->st->cut) {
            r->st->cut = 1;
            return;
        }
        fail_stream(s, r->st, &e);
        return;
    }
    enum metrics_endpoint ep = r->ep;
    req_done(s, c);
    reply_error(s, c, ep, &e);
}

void router_on_event(struct server *s, struct http_conn *c, const struct engine_event *ev)
{
    struct srv_req *r = c->user;
    if (r->kind != ENGINE_REQ_GENERATE) {
        on_session_event(s, c, r, ev);
        return;
    }
    switch (ev->kind) {
    case ENGINE_EV_SESSION:
        break;
    case ENGINE_EV_TOKEN:
        on_token(s, r, ev);
        break;
    case ENGINE_EV_DONE:
        on_done(s, c, r, ev);
        break;
    case ENGINE_EV_ERROR: {
        struct api_error e;
        engine_error(r, ev, &e);
        enum metrics_endpoint ep = r->ep;
        req_done(s, c);
        reply_error(s, c, ep, &e);
        break;
    }
    }
}

int router_forget(struct server *s, struct http_conn *c)
{
    struct srv_req *r = c->user;
    if (!r)
        return 0;
    c->user = NULL;
    if (r->st) { /* the stream goes on without a client, for a while */
        streams_detach(s, r->st);
        return 1;
    }
    if (r->parked) /* never submitted: nothing to cancel */
        s->parked--;
    else if (!r->tokenizing)             /* (a text on a worker is not in the engine either) */
        engine_cancel(s->engine, r->id); /* its KV slot is freed within one step */
    router_req_free(r);
    server_request_done(s);
    return 1;
}
