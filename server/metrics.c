/* metrics.c: see metrics.h. */
#include "metrics.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "api.h"

static const int statuses[METRICS_N_STATUS - 1] = {200, 201, 204, 400, 401, 404, 405, 408, 409, 410,
                                                   413, 414, 422, 429, 431, 500, 501, 503, 505};

static const double ttft_le[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                 1,     2.5,  5,     10,   30,  60,   120};
static const double itl_le[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                0.25,  0.5,    1,     2.5,  5,     10};

void metrics_hist_init(struct metrics_hist *h, const double *le, int n_le)
{
    memset(h, 0, sizeof *h);
    h->n_le = n_le < METRICS_MAX_BUCKETS ? n_le : METRICS_MAX_BUCKETS;
    memcpy(h->le, le, (size_t)h->n_le * sizeof *le);
}

void metrics_init(struct metrics *m)
{
    memset(m, 0, sizeof *m);
    metrics_hist_init(&m->ttft, ttft_le, (int)(sizeof ttft_le / sizeof ttft_le[0]));
    metrics_hist_init(&m->itl, itl_le, (int)(sizeof itl_le / sizeof itl_le[0]));
}

void metrics_hist_observe(struct metrics_hist *h, double v)
{
    int i = 0;
    while (i < h->n_le && v > h->le[i])
        i++;
    h->counts[i]++;
    h->sum += v;
    h->count++;
}

static int status_slot(int status)
{
    for (int i = 0; i < METRICS_N_STATUS - 1; i++)
        if (statuses[i] == status)
            return i;
    return METRICS_N_STATUS - 1;
}

void metrics_count_request(struct metrics *m, enum metrics_endpoint ep, int status)
{
    if ((int)ep < 0 || ep >= METRICS_EP_COUNT)
        ep = METRICS_EP_OTHER;
    m->requests[ep][status_slot(status)]++;
}

const char *metrics_endpoint_name(enum metrics_endpoint ep)
{
    switch (ep) {
    case METRICS_EP_COMPLETIONS:
        return "/v1/completions";
    case METRICS_EP_CHAT:
        return "/v1/chat/completions";
    case METRICS_EP_MODELS:
        return "/v1/models";
    case METRICS_EP_HEALTH:
        return "/health";
    case METRICS_EP_METRICS:
        return "/metrics";
    case METRICS_EP_SESSIONS:
        return "/v1/sessions";
    case METRICS_EP_STREAMS:
        return "/v1/streams";
    case METRICS_EP_TOKENIZE:
        return "/tokenize";
    case METRICS_EP_DETOKENIZE:
        return "/detokenize";
    default:
        return "other";
    }
}

/* A bounded appender: counts what it would need once it runs out. */
struct out {
    char *buf;
    size_t cap, len;
};

static void put(struct out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(struct out *o, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    size_t room = o->len < o->cap ? o->cap - o->len : 0;
    int n = vsnprintf(room ? o->buf + o->len : NULL, room, fmt, ap);
    va_end(ap);
    if (n > 0)
        o->len += (size_t)n;
}

/* A label value: valid UTF-8 with no control character (api_text_clean; a
 * model file's name is anybody's bytes, and the format has no escape but
 * for newlines), then " and \ escaped; cut at a character's end to fit. */
static const char *label(char *buf, size_t cap, const char *raw)
{
    char clean[512];
    api_text_clean(clean, sizeof clean, raw);
    size_t o = 0;
    for (const unsigned char *s = (const unsigned char *)clean; *s;) {
        size_t n = *s < 0x80 ? 1 : *s >= 0xF0 ? 4 : *s >= 0xE0 ? 3 : 2;
        int esc = *s == '"' || *s == '\\';
        if (o + n + (size_t)esc >= cap)
            break;
        if (esc)
            buf[o++] = '\\';
        memcpy(buf + o, s, n);
        o += n;
        s += n;
    }
    buf[o] = 0;
    return buf;
}

static void head(struct out *o, const char *name, const char *type, const char *help)
{
    put(o, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void gauge(struct out *o, const char *name, const char *help, double v)
{
    head(o, name, "gauge", help);
    put(o, "%s %.17g\n", name, v);
}

static void counter(struct out *o, const char *name, const char *help, double v)
{
    head(o, name, "counter", help);
    put(o, "%s %.17g\n", name, v);
}

/* A histogram from the engine's cumulative snapshot buckets. */
static void snap_hist(struct out *o, const char *name, const char *help, const int64_t *cum,
                      int64_t count, double sum)
{
    static const double le[ENGINE_SNAP_BUCKETS] = ENGINE_SNAP_BUCKET_BOUNDS;
    head(o, name, "histogram", help);
    for (int i = 0; i < ENGINE_SNAP_BUCKETS; i++)
        put(o, "%s_bucket{le=\"%g\"} %lld\n", name, le[i], (long long)cum[i]);
    put(o, "%s_bucket{le=\"+Inf\"} %lld\n", name, (long long)count);
    put(o, "%s_sum %.17g\n", name, sum);
    put(o, "%s_count %lld\n", name, (long long)count);
}

static void hist(struct out *o, const char *name, const char *help, const struct metrics_hist *h)
{
    uint64_t cum = 0;
    head(o, name, "histogram", help);
    for (int i = 0; i < h->n_le; i++) {
        cum += h->counts[i];
        put(o, "%s_bucket{le=\"%g\"} %llu\n", name, h->le[i], (unsigned long long)cum);
    }
    cum += h->counts[h->n_le];
    put(o, "%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)cum);
    put(o, "%s_sum %.17g\n", name, h->sum);
    put(o, "%s_count %llu\n", name, (unsigned long long)h->count);
}

size_t metrics_render(const struct metrics *m, const struct metrics_live *live,
                      const struct engine_stats *es, const struct engine_model_info *mi, char *buf,
                      size_t cap)
{
    struct out o = {buf, cap, 0};

    head(&o, "streamsink_requests_total", "counter",
         "HTTP requests answered, by endpoint and status");
    for (int e = 0; e < METRICS_EP_COUNT; e++) {
        for (int s = 0; s < METRICS_N_STATUS; s++) {
            if (!m->requests[e][s])
                continue;
            if (s < METRICS_N_STATUS - 1)
                put(&o, "streamsink_requests_total{endpoint=\"%s\",status=\"%d\"} %llu\n",
                    metrics_endpoint_name((enum metrics_endpoint)e), statuses[s],
                    (unsigned long long)m->requests[e][s]);
            else
                put(&o, "streamsink_requests_total{endpoint=\"%s\",status=\"other\"} %llu\n",
                    metrics_endpoint_name((enum metrics_endpoint)e),
                    (unsigned long long)m->requests[e][s]);
        }
    }
    hist(&o, "streamsink_time_to_first_token_seconds",
         "Time from submit to the first token event, measured on the loop thread", &m->ttft);
    hist(&o, "streamsink_inter_token_latency_seconds",
         "Time between consecutive token events of one choice of a request", &m->itl);
    counter(&o, "streamsink_streamed_tokens_total",
            "Token events the engine handed to the server (sent, buffered or left by their client)",
            (double)m->streamed_tokens);
    counter(&o, "streamsink_connections_accepted_total", "Connections accepted",
            (double)m->conns_accepted);
    counter(&o, "streamsink_connections_rejected_total", "Connections refused over --max-conns",
            (double)m->conns_rejected);
    counter(&o, "streamsink_write_stall_closes_total",
            "Connections closed because the client stopped reading", (double)m->write_stall_closes);
    counter(&o, "streamsink_slow_reader_closes_total",
            "Connections closed because the client read slower than --min-read-rate",
            (double)m->slow_reader_closes);
    counter(&o, "streamsink_connections_reclaimed_total",
            "Idle or unfinished connections closed at --max-conns to admit a new one",
            (double)m->conns_reclaimed);
    counter(&o, "streamsink_client_disconnects_total",
            "Connections closed by the client while a request was running",
            (double)m->client_disconnects);

    if (live) {
        gauge(&o, "streamsink_connections_open", "Open connections", (double)live->conns_open);
        gauge(&o, "streamsink_connections_paused",
              "Connections whose write queue is above the high-water mark",
              (double)live->conns_paused);
        gauge(&o, "streamsink_requests_inflight",
              "Requests being answered: submitted, not finished, not left by their client",
              (double)live->requests_inflight);
        gauge(&o, "streamsink_write_queue_bytes", "Bytes queued for clients, all connections",
              (double)live->write_queue_bytes);
        gauge(&o, "streamsink_write_queue_max_bytes",
              "The largest write queue of a single connection", (double)live->write_queue_max);
        gauge(&o, "streamsink_request_body_bytes",
              "Request body bytes held by all connections, against --max-body-total",
              (double)live->body_bytes);
        gauge(&o, "streamsink_request_body_total_limit_bytes", "--max-body-total",
              (double)live->body_total);
        gauge(&o, "streamsink_write_queue_high_water_bytes",
              "Write queue size that pauses a sequence", (double)live->high_water);
        gauge(&o, "streamsink_write_queue_low_water_bytes",
              "Write queue size that resumes a paused sequence", (double)live->low_water);
        gauge(&o, "streamsink_draining", "1 while shutting down", (double)live->draining);
        gauge(&o, "streamsink_streams",
              "Resumable streams held: running, or finished within the grace period",
              (double)live->streams);
        gauge(&o, "streamsink_streams_detached",
              "Running streams with no client attached (generating into their buffer)",
              (double)live->streams_detached);
        gauge(&o, "streamsink_streams_buffer_full",
              "Detached streams paused because their buffer (or all buffers) is full",
              (double)live->streams_full);
        gauge(&o, "streamsink_stream_buffer_bytes", "SSE bytes buffered by all streams",
              (double)live->stream_buffer_bytes);
        gauge(&o, "streamsink_stream_buffer_limit_bytes",
              "Undelivered bytes one detached stream may buffer (--stream-buffer)",
              (double)live->stream_buffer_max);
        gauge(&o, "streamsink_stream_buffer_total_limit_bytes",
              "Bytes all stream buffers may hold (--stream-buffer-total)",
              (double)live->stream_buffer_total);
        counter(&o, "streamsink_stream_resumes_total",
                "Clients attached to a stream with GET /v1/streams/{id}",
                (double)live->stream_resumes);
        counter(&o, "streamsink_stream_takeovers_total",
                "Resumes that closed the connection of the client attached before",
                (double)live->stream_takeovers);
        counter(&o, "streamsink_streams_expired_total",
                "Running streams cancelled because nobody resumed them within --stream-grace",
                (double)live->streams_expired);
        counter(&o, "streamsink_streams_evicted_total",
                "Finished streams dropped before their grace period ended to make room",
                (double)live->streams_evicted);
        counter(&o, "streamsink_streams_detach_limited_total",
                "Running streams without a client cancelled because their owner had more than "
                "--max-detached",
                (double)live->streams_detach_limited);
    }
    if (es) {
        gauge(&o, "streamsink_active_sequences", "Sequences running in the engine",
              (double)es->active_seqs);
        gauge(&o, "streamsink_paused_sequences", "Sequences paused by backpressure",
              (double)es->paused_seqs);
        gauge(&o, "streamsink_queued_requests", "Requests waiting for a KV slot",
              (double)es->queued);
        gauge(&o, "streamsink_sessions", "Sessions holding a KV slot", (double)es->sessions);
        gauge(&o, "streamsink_kv_slots_total", "KV slots in the pool", (double)es->slots_total);
        gauge(&o, "streamsink_kv_slots_free", "KV slots free", (double)es->slots_free);
        gauge(&o, "streamsink_kv_slots_used", "KV slots in use",
              (double)(es->slots_total - es->slots_free));
        gauge(&o, "streamsink_kv_bytes", "Bytes of KV cache allocated", (double)es->kv_bytes);
        counter(&o, "streamsink_prompt_tokens_total", "Prompt tokens processed",
                (double)es->prompt_tokens_total);
        counter(&o, "streamsink_prompt_tokens_cached_total",
                "Prompt tokens a free KV slot held from an earlier request (not prefilled)",
                (double)es->prompt_tokens_cached_total);
        counter(&o, "streamsink_generated_tokens_total", "Tokens generated",
                (double)es->gen_tokens_total);
        counter(&o, "streamsink_engine_steps_total", "Batched engine steps",
                (double)es->steps_total);
        /* one series for each policy that evicted, and the default's always */
        head(&o, "streamsink_kv_evicted_tokens_total", "counter",
             "Tokens evicted from KV windows, by the policy of the sequence that evicted them");
        const char *def = mi && mi->default_policy[0] ? mi->default_policy : "";
        int def_put = 0;
        for (int64_t k = -1; k <= ENGINE_MAX_SINKS; k++) {
            char name[32];
            if (k < 0)
                snprintf(name, sizeof name, "window");
            else
                snprintf(name, sizeof name, "sinks:%lld", (long long)k);
            int64_t n = k < 0 ? es->evicted_window_total : es->evicted_sinks_total[k];
            int is_def = strcmp(name, def) == 0;
            def_put |= is_def;
            if (n > 0 || is_def)
                put(&o, "streamsink_kv_evicted_tokens_total{policy=\"%s\"} %lld\n", name,
                    (long long)n);
        }
        if (!def_put && def[0]) { /* dense: evicts none */
            char pl[80];
            put(&o, "streamsink_kv_evicted_tokens_total{policy=\"%s\"} 0\n",
                label(pl, sizeof pl, def));
        }
        gauge(&o, "streamsink_engine_healthy", "0 after a backend failure", (double)es->healthy);
        gauge(&o, "streamsink_sessions_on_disk", "Session snapshots in --session-dir",
              (double)es->sessions_on_disk);
        gauge(&o, "streamsink_session_snapshot_bytes", "Bytes of session snapshots on disk",
              (double)es->snapshot_bytes);
        counter(&o, "streamsink_session_saves_total", "Sessions written to --session-dir",
                (double)es->saves_total);
        counter(&o, "streamsink_session_save_failures_total",
                "Session saves that failed (the session stayed in memory)",
                (double)es->save_failures_total);
        counter(&o, "streamsink_session_restores_total", "Sessions read back from --session-dir",
                (double)es->restores_total);
        counter(&o, "streamsink_session_restore_failures_total",
                "Snapshots that could not be restored", (double)es->restore_failures_total);
        counter(&o, "streamsink_session_disk_evictions_total",
                "Snapshots deleted to stay under --session-disk-max",
                (double)es->disk_evictions_total);
        gauge(&o, "streamsink_snapshot_saves_inflight",
              "Session snapshots copied out of the KV cache and not yet written",
              (double)es->snapshot_saves_inflight);
        gauge(&o, "streamsink_snapshot_saves_held",
              "Session snapshots whose write failed, kept in memory for another try",
              (double)es->snapshot_saves_held);
        counter(&o, "streamsink_session_save_engine_seconds_total",
                "Engine-thread time of session saves (the KV copy; streams wait for it)",
                es->save_engine_seconds_total);
        snap_hist(&o, "streamsink_session_save_seconds",
                  "Time to save one session snapshot, copy to rename (mostly on the writer thread)",
                  es->save_hist, es->saves_total, es->save_seconds_total);
        snap_hist(
            &o, "streamsink_session_restore_seconds",
            "Engine-thread time to restore one session snapshot (checks and copy in; the file "
            "is read before on the session IO thread)",
            es->restore_hist, es->restores_total, es->restore_seconds_total);
    }
    if (mi) {
        char l1[300], l2[80], l3[40], l4[80];
        head(&o, "streamsink_model_info", "gauge", "The loaded model");
        put(&o,
            "streamsink_model_info{name=\"%s\",arch=\"%s\",normalizer=\"%s\","
            "default_policy=\"%s\"} 1\n",
            label(l1, sizeof l1, mi->name), label(l2, sizeof l2, mi->arch),
            label(l3, sizeof l3, mi->normalizer), label(l4, sizeof l4, mi->default_policy));
        gauge(&o, "streamsink_kv_window_tokens", "Window tokens per sequence", (double)mi->window);
        gauge(&o, "streamsink_sink_probe_rate",
              "Share of heads putting more than 0.3 of their attention on the first token "
              "(load-time probe; -1 if it did not run)",
              (double)mi->probe_sink_rate);
        gauge(&o, "streamsink_sink_probe_first_token_mass",
              "Mean attention mass on the first token over all heads (load-time probe)",
              (double)mi->probe_first_mass);
    }
    return o.len;
}
