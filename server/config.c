/*
 * config.c: the one table of `streamsink serve` flags and their defaults.
 * server_config_defaults() parses the table's default strings with the same
 * parser the flags use, and server_config_usage() prints the same table, so
 * a default exists in exactly one place.
 */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

enum opt_type { OPT_STR, OPT_I64, OPT_SEC, OPT_FLAG /* no value: sets an int64 to 1 */ };

struct opt {
    const char *lng;
    const char *shrt; /* or NULL */
    enum opt_type type;
    size_t off;
    const char *def; /* NULL: computed (see help) */
    double lo, hi;
    const char *meta;
    const char *help;
};

#define OFF(f) offsetof(struct server_config, f)
#define GiB 1073741824.0

static const struct opt opts[] = {
    {"--host", NULL, OPT_STR, OFF(host), "127.0.0.1", 0, 0, "ADDR", "address to listen on"},
    {"--port", "-p", OPT_I64, OFF(port), "8080", 0, 65535, "N",
     "TCP port (0: any free port; the log says which)"},
    {"--model", "-m", OPT_STR, OFF(model), NULL, 0, 0, "FILE",
     "GGUF model (default: $STREAMSINK_MODEL, else "
     "${XDG_CACHE_HOME:-~/.cache}/streamsink/SmolLM2-135M-Instruct.Q4_1.gguf)"},
    {"--kv-policy", NULL, OPT_STR, OFF(kv_policy), "auto", 0, 0, "P",
     "default KV policy: auto | window | sinks:N | dense"},
    {"--window", NULL, OPT_I64, OFF(window), "4096", 0, 1e12, "N",
     "window tokens per sequence (0: the model's context length)"},
    {"--sinks", NULL, OPT_I64, OFF(sinks), "16", 0, 64, "N",
     "sink cells per KV slot (the most any sinks:N policy may pin)"},
    {"--max-seqs", NULL, OPT_I64, OFF(max_seqs), "8", 1, 4096, "N",
     "KV slots: sequences and sessions resident at once"},
    {"--max-queue", NULL, OPT_I64, OFF(max_queue), "16", 0, 1e6, "N",
     "requests that wait for a slot; beyond it: 429 with Retry-After"},
    {"--no-mmap", NULL, OPT_FLAG, OFF(no_mmap), NULL, 0, 0, "",
     "read the weights into memory instead of mapping the file (the file may then change)"},
    {"--backend", NULL, OPT_STR, OFF(backend), "cpu", 0, 0, "B",
     "cpu | cuda (CUDA: weights in FP16 on GPU 0, fused attention kernels)"},
    {"--threads", "-t", OPT_I64, OFF(threads), "2", 1, 256, "N", "CPU backend threads"},
    {"--chunk", NULL, OPT_I64, OFF(chunk), "256", 1, 65536, "N",
     "prompt tokens one sequence prefills per step"},
    {"--max-step-tokens", NULL, OPT_I64, OFF(max_step_tokens), "512", 1, 1e6, "N",
     "tokens in one batched step (decode + prefill)"},
    {"--max-prompt", NULL, OPT_I64, OFF(max_prompt), "0", 0, 1e12, "N",
     "longest prompt in tokens (0: the model's context length); longer ones get 400 "
     "before they reach the engine"},
    {"--session-idle", NULL, OPT_SEC, OFF(session_idle), "3600", 1, 1e9, "S",
     "an idle session frees its KV slot after S seconds"},
    {"--api-key", NULL, OPT_STR, OFF(api_key), "", 0, 0, "KEY",
     "require 'Authorization: Bearer KEY' on everything but /health and /metrics (visible in "
     "ps: prefer --api-key-file or $STREAMSINK_API_KEY; empty: open)"},
    {"--api-key-file", NULL, OPT_STR, OFF(api_key_file), "", 0, 0, "FILE",
     "accepted API keys, one per line ('#' comments); with --api-key, both count"},
    {"--model-alias", NULL, OPT_STR, OFF(model_alias), "", 0, 0, "NAMES",
     "more names (comma-separated) the 'model' field may use besides the served id"},
    {"--max-body", NULL, OPT_I64, OFF(max_body), "8388608", 1, GiB, "BYTES",
     "largest request body (413 beyond)"},
    {"--max-body-total", NULL, OPT_I64, OFF(max_body_total), "67108864", 0, 64 * GiB, "BYTES",
     "request body bytes all connections may hold at once (503 beyond; 0: no limit)"},
    {"--max-header", NULL, OPT_I64, OFF(max_header), "16384", 256, 1048576, "BYTES",
     "largest request line + headers (431 beyond)"},
    {"--max-conns", NULL, OPT_I64, OFF(max_conns), "1024", 1, 1e6, "N",
     "open connections (beyond it the longest-idle one is closed to make room; 503 when "
     "every one runs a request)"},
    {"--max-response", NULL, OPT_I64, OFF(max_response), "4194304", 1024, GiB, "BYTES",
     "text of one non-streamed answer (finish_reason length beyond)"},
    {"--high-water", NULL, OPT_I64, OFF(high_water), "65536", 1024, GiB, "BYTES",
     "write queue bytes that pause a stream's sequence"},
    {"--low-water", NULL, OPT_I64, OFF(low_water), "16384", 0, GiB, "BYTES",
     "write queue bytes that resume it"},
    {"--sndbuf", NULL, OPT_I64, OFF(sndbuf), "65536", 0, GiB, "BYTES",
     "kernel send buffer per connection, so backpressure starts early (0: the kernel's "
     "autotuning, which may absorb megabytes)"},
    {"--min-read-rate", NULL, OPT_I64, OFF(min_read_rate), "4096", 0, GiB, "BYTES",
     "a client with bytes waiting must read this many per second, judged over "
     "--write-stall-timeout, or be closed (0: off)"},
    {"--read-timeout", NULL, OPT_SEC, OFF(read_timeout), "30", 0.001, 1e6, "S",
     "a request must arrive within S seconds of its first byte (408)"},
    {"--keepalive-timeout", NULL, OPT_SEC, OFF(keepalive_timeout), "60", 0.001, 1e6, "S",
     "idle keep-alive connections close after S seconds"},
    {"--write-stall-timeout", NULL, OPT_SEC, OFF(write_stall_timeout), "30", 0.001, 1e6, "S",
     "a client that reads nothing for S seconds while paused is closed"},
    {"--sse-keepalive", NULL, OPT_SEC, OFF(sse_keepalive), "15", 0, 1e6, "S",
     "': keep-alive' comment interval on idle streams (0: off)"},
    {"--drain-timeout", NULL, OPT_SEC, OFF(drain_timeout), "30", 0, 1e6, "S",
     "on SIGTERM/SIGINT, let requests finish for S seconds, then cut them (a stream ends with "
     "an error event and [DONE])"},
    {"--stream-buffer", NULL, OPT_I64, OFF(stream_buffer), "4194304", 4096, GiB, "BYTES",
     "SSE bytes one stream keeps for a client that reconnects (GET /v1/streams/{id}); a "
     "stream with no client pauses its sequence when this much is undelivered"},
    {"--stream-buffer-total", NULL, OPT_I64, OFF(stream_buffer_total), "268435456", 4096, 64 * GiB,
     "BYTES",
     "bytes all stream buffers may hold together; at the limit delivered events are "
     "dropped first, then streams with no client pause"},
    {"--stream-grace", NULL, OPT_SEC, OFF(stream_grace), "30", 0, 86400, "S",
     "a stream whose client left is cancelled (its KV slot freed) unless resumed within S "
     "seconds; a finished one stays resumable as long (0: a disconnect cancels at once)"},
    {"--name", NULL, OPT_STR, OFF(name), "", 0, 0, "NAME",
     "replica name sent as X-Streamsink-Replica (default: hostname:port)"},
    {"--log-level", NULL, OPT_STR, OFF(log_level), "info", 0, 0, "L",
     "debug | info | warn | error"},
};

#define N_OPTS (sizeof opts / sizeof opts[0])

static int set_value(struct server_config *cfg, const struct opt *o, const char *v, char *err,
                     size_t err_len)
{
    char *base = (char *)cfg + o->off;
    char *end = NULL;
    switch (o->type) {
    case OPT_STR:
        *(const char **)base = v;
        return 0;
    case OPT_FLAG:
        *(int64_t *)base = 1;
        return 0;
    case OPT_I64: {
        errno = 0;
        long long x = strtoll(v, &end, 10);
        if (errno || end == v || *end || (double)x < o->lo || (double)x > o->hi) {
            snprintf(err, err_len, "%s expects an integer in [%.0f, %.0f], got '%s'", o->lng, o->lo,
                     o->hi, v);
            return -EINVAL;
        }
        *(int64_t *)base = x;
        return 0;
    }
    case OPT_SEC: {
        errno = 0;
        double x = strtod(v, &end);
        if (errno || end == v || *end || !isfinite(x) || x < o->lo || x > o->hi) {
            snprintf(err, err_len, "%s expects seconds in [%g, %g], got '%s'", o->lng, o->lo, o->hi,
                     v);
            return -EINVAL;
        }
        *(double *)base = x;
        return 0;
    }
    }
    return -EINVAL;
}

/* $STREAMSINK_MODEL, else the cache path of scripts/fetch-model.sh (the same
 * rule as `streamsink run`). */
static const char *default_model(void)
{
    static char buf[4096];
    const char *p = getenv("STREAMSINK_MODEL");
    if (p && *p)
        return p;
    const char *cache = getenv("XDG_CACHE_HOME");
    if (cache && *cache)
        snprintf(buf, sizeof buf, "%s/streamsink/SmolLM2-135M-Instruct.Q4_1.gguf", cache);
    else
        snprintf(buf, sizeof buf, "%s/.cache/streamsink/SmolLM2-135M-Instruct.Q4_1.gguf",
                 getenv("HOME") ? getenv("HOME") : ".");
    return buf;
}

void server_config_defaults(struct server_config *cfg)
{
    char err[256];
    memset(cfg, 0, sizeof *cfg);
    for (size_t i = 0; i < N_OPTS; i++)
        if (opts[i].def)
            set_value(cfg, &opts[i], opts[i].def, err, sizeof err); /* the table is valid */
    cfg->model = default_model();
}

void server_config_usage(FILE *f)
{
    fprintf(f, "usage: streamsink serve [options]\n"
               "\n"
               "Serves the OpenAI API (/v1/completions, /v1/chat/completions, /v1/models)\n"
               "plus /health and /metrics, streaming tokens as server-sent events.\n"
               "\n");
    for (size_t i = 0; i < N_OPTS; i++) {
        const struct opt *o = &opts[i];
        char flag[64];
        snprintf(flag, sizeof flag, "%s%s%s %s", o->shrt ? o->shrt : "", o->shrt ? ", " : "    ",
                 o->lng, o->meta);
        if (o->def && o->def[0])
            fprintf(f, "  %-30s %s (default %s)\n", flag, o->help, o->def);
        else
            fprintf(f, "  %-30s %s\n", flag, o->help);
    }
    fprintf(f, "  %-30s %s\n", "-h, --help", "this text");
    fprintf(f, "\nSIGTERM or SIGINT drains: no new connections, running requests finish\n"
               "within --drain-timeout, then the rest are cut; exit 0. docs/limits.md lists\n"
               "every limit and what a client gets beyond it.\n"
               "exit codes: 0 ok, 1 runtime failure, 2 bad usage, 3 bad or missing model file\n");
}

int server_config_parse(struct server_config *cfg, int argc, char **argv, char *err, size_t err_len)
{
    server_config_defaults(cfg);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            server_config_usage(stdout);
            return 1;
        }
        const char *val = NULL;
        const struct opt *o = NULL;
        for (size_t k = 0; k < N_OPTS && !o; k++) {
            size_t ll = strlen(opts[k].lng);
            if (strcmp(a, opts[k].lng) == 0 || (opts[k].shrt && strcmp(a, opts[k].shrt) == 0)) {
                o = &opts[k];
            } else if (strncmp(a, opts[k].lng, ll) == 0 && a[ll] == '=') {
                o = &opts[k];
                val = a + ll + 1; /* --flag=value */
            }
        }
        if (!o) {
            snprintf(err, err_len, "unknown option '%s' (see streamsink serve --help)", a);
            return -EINVAL;
        }
        if (!val && o->type == OPT_FLAG) {
            val = "1";
        } else if (!val) {
            if (i + 1 >= argc) {
                snprintf(err, err_len, "%s needs a value", a);
                return -EINVAL;
            }
            val = argv[++i];
        }
        if (set_value(cfg, o, val, err, err_len) < 0)
            return -EINVAL;
    }
    if (cfg->low_water > cfg->high_water) {
        snprintf(err, err_len, "--low-water (%lld) must not exceed --high-water (%lld)",
                 (long long)cfg->low_water, (long long)cfg->high_water);
        return -EINVAL;
    }
    if (strcmp(cfg->log_level, "debug") != 0 && strcmp(cfg->log_level, "info") != 0 &&
        strcmp(cfg->log_level, "warn") != 0 && strcmp(cfg->log_level, "error") != 0) {
        snprintf(err, err_len, "--log-level expects debug, info, warn or error, got '%s'",
                 cfg->log_level);
        return -EINVAL;
    }
    return 0;
}
