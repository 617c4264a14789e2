/*
 * server.h: the server module's public header, for the command layer
 * (cmd/serve.c): struct server_config, every `streamsink serve` setting, and
 * server_run. Everything else in server/ is internal (router.h holds what
 * server.c and router.c share).
 */
#ifndef SS_SERVER_H
#define SS_SERVER_H

#include <stdint.h>

#define SERVER_CONFIG_MAX_KEYS 64
/* bytes of server_config.name sent in X-Streamsink-Replica (a longer one is
 * cut); the caller keeps the name to printable ASCII, as a header value */
#define SERVER_REPLICA_NAME_MAX 200

struct server_config {
    /* listening */
    const char *host;
    int64_t port;
    const char *name; /* replica name for X-Streamsink-Replica ("" -> hostname:port) */
    const char *api_keys[SERVER_CONFIG_MAX_KEYS + 1]; /* --api-key, repeatable; NULL-ended */
    int64_t n_api_keys;
    const char *api_key_file;
    const char *model_alias; /* extra names clients may use for the model (comma-separated) */
    int64_t max_conns;
    /* model and engine */
    const char *model;
    const char *kv_policy;
    int64_t window;
    int64_t sinks;
    int64_t max_seqs;
    int64_t max_queue;
    int64_t threads;
    const char *backend;
    int no_mmap;
    int64_t chunk;
    int64_t max_step_tokens;
    int64_t max_prompt;
    double session_idle;
    const char *session_dir; /* "" : sessions in memory only */
    int64_t session_disk_max;
    const char *kv_dtype;
    const char *chat_template;      /* auto (NULL, ""): the GGUF's; else a format's name */
    const char *chat_template_file; /* a Jinja template to recognize instead ("": none) */
    /* resumable streams */
    int64_t stream_buffer;       /* undelivered bytes one detached stream may buffer */
    int64_t stream_buffer_total; /* bytes all stream buffers may hold */
    double stream_grace;         /* seconds a stream waits for its client to come back */
    int64_t max_detached;        /* running streams without a client one owner may keep (0: any) */
    /* limits and timeouts (seconds) */
    int64_t max_body;
    int64_t max_body_total;
    int64_t min_read_rate;
    int64_t max_header;
    int64_t max_response; /* bytes of text in one non-streamed answer */
    int64_t high_water;
    int64_t low_water;
    int64_t sndbuf;
    double read_timeout;
    double keepalive_timeout;
    double write_stall_timeout;
    double sse_keepalive;
    double drain_timeout;
    const char *log_level; /* debug | info | warn | error */
};

enum server_status {
    SERVER_OK = 0,     /* drained after SIGTERM/SIGINT */
    SERVER_FAILED,     /* a runtime failure (memory, the socket, the CUDA device) */
    SERVER_BAD_CONFIG, /* a setting the server cannot use (backend, policy, host, keys) */
    SERVER_BAD_MODEL,  /* the model file is missing, truncated, corrupt or unsupported */
};

/* Loads the model, serves until SIGTERM/SIGINT, drains. Prints one line on
 * stderr for every failure before serving. The strings in cfg must outlive
 * the call. */
enum server_status server_run(const struct server_config *cfg);

#endif
