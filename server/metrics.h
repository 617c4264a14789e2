/*
 * metrics.h: counters, gauges and histograms for GET /metrics, in the
 * Prometheus text exposition format (version 0.0.4). Owned and updated by the
 * loop thread only (no atomics); engine-side numbers come from
 * engine_get_stats() at render time. Latencies are measured on the loop
 * thread: time to first token from submit to the first token event, and
 * inter-token latency between consecutive token events of one request.
 */
#ifndef SS_METRICS_H
#define SS_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "engine.h"

#define METRICS_MAX_BUCKETS 16

struct metrics_hist {
    int n_le;                                 /* finite upper bounds */
    double le[METRICS_MAX_BUCKETS];           /* ascending; +Inf is implied */
    uint64_t counts[METRICS_MAX_BUCKETS + 1]; /* per bucket (not cumulative); last is +Inf */
    double sum;
    uint64_t count;
};

enum metrics_endpoint {
    METRICS_EP_COMPLETIONS = 0,
    METRICS_EP_CHAT,
    METRICS_EP_MODELS,
    METRICS_EP_HEALTH,
    METRICS_EP_METRICS,
    METRICS_EP_SESSIONS,
    METRICS_EP_STREAMS, /* GET /v1/streams/{id} (resume) */
    METRICS_EP_TOKENIZE,
    METRICS_EP_DETOKENIZE,
    METRICS_EP_OTHER,
    METRICS_EP_COUNT
};

#define METRICS_N_STATUS 20 /* the statuses we send, plus "other" */

struct metrics {
    struct metrics_hist ttft; /* seconds */
    struct metrics_hist itl;  /* seconds */
    uint64_t requests[METRICS_EP_COUNT][METRICS_N_STATUS];
    uint64_t streamed_tokens;    /* token events delivered to clients */
    uint64_t conns_accepted;     /* connections taken */
    uint64_t conns_rejected;     /* 503: over --max-conns */
    uint64_t write_stall_closes; /* closed by the write-stall timeout */
    uint64_t slow_reader_closes; /* closed for reading below --min-read-rate */
    uint64_t conns_reclaimed;    /* idle or unfinished connections closed to admit a new one */
    uint64_t client_disconnects; /* closed by the client mid-request */
};

/* Sampled from the connections when rendering. */
struct metrics_live {
    int64_t conns_open;
    int64_t conns_paused;      /* write queue above the high-water mark */
    int64_t requests_inflight; /* submitted to the engine, not finished */
    size_t write_queue_bytes;  /* bytes queued in user space, all connections */
    size_t write_queue_max;    /* the largest single connection's queue */
    size_t body_bytes;         /* request body bytes held, all connections */
    size_t body_total;         /* --max-body-total */
    size_t high_water;         /* configured marks, for reference */
    size_t low_water;
    int draining; /* SIGTERM received */
    /* resumable streams (streams.h) */
    int64_t streams;                 /* in the registry: running, or finished and resumable */
    int64_t streams_detached;        /* running with no client attached */
    int64_t streams_full;            /* ... of them, paused with a full buffer */
    size_t stream_buffer_bytes;      /* SSE bytes buffered by all streams */
    size_t stream_buffer_max;        /* --stream-buffer */
    size_t stream_buffer_total;      /* --stream-buffer-total */
    uint64_t stream_resumes;         /* successful GET /v1/streams/{id} */
    uint64_t stream_takeovers;       /* ... that closed another client's connection */
    uint64_t streams_expired;        /* running streams cancelled after the grace period */
    uint64_t streams_evicted;        /* finished streams dropped early for room */
    uint64_t streams_detach_limited; /* detached streams cancelled over --max-detached */
};

void metrics_init(struct metrics *m);
void metrics_hist_init(struct metrics_hist *h, const double *le, int n_le);
void metrics_hist_observe(struct metrics_hist *h, double v);
void metrics_count_request(struct metrics *m, enum metrics_endpoint ep, int status);
const char *metrics_endpoint_name(enum metrics_endpoint ep);

/* Writes the exposition text. es and mi may be NULL (no engine). Returns the
 * bytes needed; writes everything only if that is < cap (snprintf's rule). */
size_t metrics_render(const struct metrics *m, const struct metrics_live *live,
                      const struct engine_stats *es, const struct engine_model_info *mi, char *buf,
                      size_t cap);

#endif
