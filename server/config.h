/*
 * config.h: struct server_config, the `streamsink serve` flags. Every default
 * lives in one table in config.c, which also writes --help, so the help text
 * and the defaults cannot drift apart.
 */
#ifndef SS_CONFIG_H
#define SS_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

struct server_config {
    /* listening */
    const char *host;
    int64_t port;
    const char *name; /* replica name for X-Streamsink-Replica ("" -> hostname:port) */
    const char *api_key;
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
    int64_t no_mmap;
    int64_t chunk;
    int64_t max_step_tokens;
    int64_t max_prompt;
    double session_idle;
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
    /* resumable streams */
    int64_t stream_buffer;       /* undelivered bytes one detached stream may buffer */
    int64_t stream_buffer_total; /* bytes all stream buffers may hold */
    double stream_grace;         /* seconds a stream waits for its client to come back */
    const char *log_level;
};

/* Fills every field from the table's defaults. */
void server_config_defaults(struct server_config *cfg);
/* Parses argv (argv[0] is the subcommand name). Returns 0, 1 if --help was
 * printed to stdout, or -EINVAL with a message in err. Strings point into
 * argv or the table. */
int server_config_parse(struct server_config *cfg, int argc, char **argv, char *err,
                        size_t err_len);
void server_config_usage(FILE *f);

#endif
