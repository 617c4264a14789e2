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
 */
#include "router.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "log.h"
#include "sse.h"

#define SSE_HEADERS "Cache-Control: no-cache\r\nX-Accel-Buffering: no\r\n"
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
    char body[512];
    engine_get_stats(s->engine, &es);
    const char *status = !es.healthy ? "unhealthy" : s->draining ? "draining" : "ok";
    int n = snprintf(body, sizeof body,
                     "{\"status\":\"%s\",\"model\":\"%s\",\"active_sequences\":%lld,"
                     "\"queued\":%lld,\"kv_slots_free\":%lld,\"kv_slots_total\":%lld}",
                     status, s->model_id, (long long)es.active_seqs, (long long)es.queued,
                     (long long)es.slots_free, (long long)es.slots_total);
    reply(s, c, METRICS_EP_HEALTH, es.healthy && !s->draining ? 200 : 503, "application/json", NULL,
          body, (size_t)n);
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
    unsigned char d = al != bl;
    for (size_t i = 0; i < al && i < bl; i++)
        d |= (unsigned char)(a[i] ^ b[i]);
    return d == 0;
}

static int authorized(const struct server *s, const struct http_conn *c)
{
    const char *key = s->cfg.api_key;
    if (!key || !key[0])
        return 1;
    const char *h = c->req.authorization;
    if (strncasecmp(h, "Bearer ", 7) != 0)
        return 0;
    h += 7;
    while (*h == ' ')
        h++;
    size_t hl = strlen(h);
    while (hl > 0 && (h[hl - 1] == ' ' || h[hl - 1] == '\t'))
        hl--;
    return same_secret(h, hl, key, strlen(key));
}

/* ---- API requests --------------------------------------------------------------------------- */

static size_t token_text(void *arg, int32_t id, char *buf, size_t cap)
{
    return engine_token_text(arg, id, buf, cap);
}

static void req_free(struct srv_req *r)
{
    api_response_free(&r->resp);
    free(r);
}

/* The request on c is over (answered, failed or abandoned). */
static void req_done(struct server *s, struct http_conn *c)
{
    struct srv_req *r = c->user;
    if (!r)
        return;
    c->user = NULL;
    req_free(r);
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
        .default_seed = fresh_seed(),
        .max_stop_len = 256,
    };
    struct engine_request req;
    struct api_request meta;
    struct api_error err;
    if (api_request_parse(&ctx, ep, c->req.body, c->req.body_len, &req, &meta, &err) < 0) {
        reply_error(s, c, mep, &err);
        return;
    }
    struct srv_req *r = calloc(1, sizeof *r);
    if (!r) {
        engine_request_free(&req);
        reply_err(s, c, mep, 500, NULL, NULL, "out of memory");
        return;
    }
    struct api_token_text tt = {token_text, s->engine};
    api_response_init(&r->resp, &meta, s->model_id, id, (int64_t)time(NULL),
                      (size_t)s->cfg.max_response, &tt);
    r->id = id;
    r->ep = mep;
    r->stream = meta.stream;
    int rc = engine_submit(s->engine, &req);
    if (rc < 0) {
        engine_request_free(&req);
        req_free(r);
        if (rc == -EBUSY)
            reply_err(s, c, mep, 429, NULL, "rate_limit_exceeded",
                      "all KV slots are busy and the wait queue is full; retry shortly");
        else
            reply_err(s, c, mep, 503, NULL, NULL, "the engine is not accepting requests");
        return;
    }
    r->t_submit = server_now();
    c->user = r;
    s->inflight++;
    if (r->stream)
        http_conn_hold_stream(c);
}

/* ---- routing ------------------------------------------------------------------------------- */

struct route {
    const char *path;
    int prefix; /* match path as a prefix */
    int method; /* llhttp method */
    const char *allow;
    enum metrics_endpoint ep;
};

static const struct route routes[] = {
    {"/v1/completions", 0, HTTP_POST, "POST", METRICS_EP_COMPLETIONS},
    {"/v1/chat/completions", 0, HTTP_POST, "POST", METRICS_EP_CHAT},
    {"/v1/models", 0, HTTP_GET, "GET", METRICS_EP_MODELS},
    {"/v1/models/", 1, HTTP_GET, "GET", METRICS_EP_MODELS},
    {"/health", 0, HTTP_GET, "GET", METRICS_EP_HEALTH},
    {"/metrics", 0, HTTP_GET, "GET", METRICS_EP_METRICS},
};

void router_on_request(struct http_conn *c, void *arg)
{
    struct server *s = arg;
    char path[HTTP_URL_MAX];
    snprintf(path, sizeof path, "%s", c->req.url);
    path[strcspn(path, "?#")] = 0;

    const struct route *rt = NULL;
    for (size_t i = 0; i < sizeof routes / sizeof routes[0] && !rt; i++) {
        const struct route *r = &routes[i];
        if (r->prefix ? strncmp(path, r->path, strlen(r->path)) == 0 && path[strlen(r->path)]
                      : strcmp(path, r->path) == 0)
            rt = r;
    }
    if (!rt) {
        char msg[300];
        snprintf(msg, sizeof msg, "Unknown request URL: %s %.200s.",
                 llhttp_method_name((llhttp_method_t)c->req.method), path);
        reply_err(s, c, METRICS_EP_OTHER, 404, NULL, "unknown_url", msg);
        return;
    }
    if (c->req.method != rt->method) {
        char msg[300], allow[64];
        snprintf(msg, sizeof msg, "Method %s is not allowed on %.200s; use %s.",
                 llhttp_method_name((llhttp_method_t)c->req.method), path, rt->allow);
        snprintf(allow, sizeof allow, "Allow: %s\r\n", rt->allow);
        struct api_error e;
        api_error_set(&e, 405, NULL, "method_not_allowed", "%s", msg);
        char *json = api_error_json(&e);
        metrics_count_request(&s->metrics, rt->ep, 405);
        http_conn_respond(c, 405, "application/json", allow, json ? json : "{}",
                          json ? strlen(json) : 2);
        free(json);
        return;
    }
    if (strncmp(path, "/v1/", 4) == 0 && !authorized(s, c)) {
        reply_err(s, c, rt->ep, 401, NULL, "invalid_api_key",
                  "Incorrect API key provided. Send it as 'Authorization: Bearer <key>'.");
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
    default:
        reply_err(s, c, METRICS_EP_OTHER, 404, NULL, "unknown_url", "Unknown request URL.");
        break;
    }
}

/* ---- streaming ----------------------------------------------------------------------------- */

static void send_frame(struct http_conn *c, const char *json)
{
    char small[2048];
    size_t len = strlen(json);
    size_t need = sse_frame_data(small, sizeof small, json, len);
    if (need <= sizeof small) {
        http_conn_stream_write(c, small, need);
        return;
    }
    char *big = malloc(need);
    if (!big)
        return;
    sse_frame_data(big, need, json, len);
    http_conn_stream_write(c, big, need);
    free(big);
}

static void send_chunk(struct http_conn *c, char *json)
{
    if (json)
        send_frame(c, json);
    free(json);
}

static void send_done(struct http_conn *c)
{
    char buf[32];
    size_t n = sse_frame_done(buf, sizeof buf);
    http_conn_stream_write(c, buf, n);
}

/* Headers, then the chat stream's role chunk. */
static void begin_stream(struct server *s, struct http_conn *c, struct srv_req *r)
{
    if (r->started)
        return;
    r->started = 1;
    metrics_count_request(&s->metrics, r->ep, 200);
    if (http_conn_stream_begin(c, 200, "text/event-stream; charset=utf-8", SSE_HEADERS) < 0)
        return;
    send_chunk(c, api_response_role_chunk(&r->resp));
}

void router_on_stream_commit(struct http_conn *c, void *arg)
{
    struct srv_req *r = c->user;
    if (r && r->stream)
        begin_stream(arg, c, r);
}

void router_on_pause(struct http_conn *c, void *arg)
{
    struct server *s = arg;
    struct srv_req *r = c->user;
    if (r && !r->paused) {
        r->paused = 1;
        engine_pause(s->engine, r->id);
    }
}

void router_on_resume(struct http_conn *c, void *arg)
{
    struct server *s = arg;
    struct srv_req *r = c->user;
    if (r && r->paused) {
        r->paused = 0;
        engine_resume(s->engine, r->id);
    }
}

/* ---- engine events ----------------------------------------------------------------------------
 */

static void on_token(struct server *s, struct http_conn *c, struct srv_req *r,
                     const struct engine_event *ev)
{
    if (ev->token >= 0) {
        double t = server_now();
        if (r->n_tokens == 0)
            metrics_hist_observe(&s->metrics.ttft, t - r->t_submit);
        else
            metrics_hist_observe(&s->metrics.itl, t - r->t_last);
        r->t_last = t;
        r->n_tokens++;
        s->metrics.streamed_tokens++;
    }
    if (r->stream) {
        begin_stream(s, c, r);
        send_chunk(c, api_response_chunk(&r->resp, ev));
        return;
    }
    if (r->overflow)
        return;
    if (api_response_add(&r->resp, ev) < 0) {
        /* --max-response reached: stop the sequence; DONE answers "length" */
        r->overflow = 1;
        engine_cancel(s->engine, r->id);
    }
}

static void on_done(struct server *s, struct http_conn *c, struct srv_req *r,
                    const struct engine_event *ev)
{
    struct engine_event done = *ev;
    if (r->overflow)
        done.finish = ENGINE_FINISH_LENGTH;
    if (r->stream) {
        begin_stream(s, c, r);
        send_chunk(c, api_response_final_chunk(&r->resp, &done));
        if (r->resp.meta.include_usage)
            send_chunk(c, api_response_usage_chunk(&r->resp, &done));
        send_done(c);
        req_done(s, c);
        http_conn_stream_end(c);
        return;
    }
    char *body = api_response_body(&r->resp, &done);
    enum metrics_endpoint ep = r->ep;
    req_done(s, c);
    reply_json(s, c, ep, 200, body);
}

static void on_error(struct server *s, struct http_conn *c, struct srv_req *r,
                     const struct engine_event *ev)
{
    struct api_error e;
    int status = ev->status >= 400 && ev->status <= 599 ? ev->status : 500;
    const char *code = status == 409   ? "session_busy"
                       : status == 429 ? "rate_limit_exceeded"
                                       : NULL;
    api_error_set(&e, status, NULL, code, "%s", ev->message[0] ? ev->message : "engine error");
    enum metrics_endpoint ep = r->ep;
    if (r->started) { /* headers are out: an error frame, then [DONE] */
        char *json = api_error_json(&e);
        send_chunk(c, json);
        send_done(c);
        req_done(s, c);
        http_conn_stream_end(c);
        return;
    }
    req_done(s, c);
    reply_error(s, c, ep, &e);
}

void router_on_event(struct server *s, struct http_conn *c, const struct engine_event *ev)
{
    struct srv_req *r = c->user;
    switch (ev->kind) {
    case ENGINE_EV_TOKEN:
        on_token(s, c, r, ev);
        break;
    case ENGINE_EV_DONE:
        on_done(s, c, r, ev);
        break;
    case ENGINE_EV_ERROR:
        on_error(s, c, r, ev);
        break;
    }
}

int router_forget(struct server *s, struct http_conn *c)
{
    struct srv_req *r = c->user;
    if (!r)
        return 0;
    engine_cancel(s->engine, r->id); /* its KV slot is freed within one step */
    req_done(s, c);
    return 1;
}
