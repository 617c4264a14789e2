/*
 * serve.c: `streamsink serve`: its flags, parsed into struct server_config
 * (server.h) by the one flag parser, then server_run. Every serve flag and
 * default lives in the table below, which also prints --help.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "api.h"
#include "cmd.h"
#include "server.h"

#define GiB 1073741824.0

/* Checks what one flag alone cannot. Returns 0 or -1 after a message. */
static int check(const struct server_config *c)
{
    if (c->low_water > c->high_water) {
        fprintf(stderr, "error: --low-water (%lld) must not exceed --high-water (%lld)\n",
                (long long)c->low_water, (long long)c->high_water);
        return -1;
    }
    enum engine_kv_dtype kd;
    if (engine_kv_dtype_parse(c->kv_dtype, &kd) < 0) {
        fprintf(stderr, "error: --kv-dtype expects f16, f32 or q8_0, got '%s'\n", c->kv_dtype);
        return -1;
    }
    enum api_chat_format cf;
    if (strcmp(c->chat_template, "auto") != 0 && api_chat_format_parse(c->chat_template, &cf) < 0) {
        fprintf(stderr,
                "error: --chat-template expects auto, chatml, llama3, llama2 or gemma, got '%s'\n",
                c->chat_template);
        return -1;
    }
    if (strcmp(c->chat_template, "auto") != 0 && c->chat_template_file[0]) {
        fprintf(stderr, "error: --chat-template and --chat-template-file name the format twice; "
                        "give one\n");
        return -1;
    }
    /* sent as a header value (X-Streamsink-Replica): a CR or LF would end the
     * header and start one the client never got from us */
    for (const char *p = c->name; p && *p; p++) {
        if ((unsigned char)*p < 0x20 || (unsigned char)*p > 0x7e) {
            fprintf(stderr,
                    "error: --name may hold printable ASCII only (it is sent as the "
                    "X-Streamsink-Replica header); byte 0x%02x at %lld\n",
                    (unsigned char)*p, (long long)(p - c->name));
            return -1;
        }
    }
    if (c->name && strlen(c->name) > SERVER_REPLICA_NAME_MAX) {
        fprintf(stderr, "error: --name is longer than %d bytes\n", SERVER_REPLICA_NAME_MAX);
        return -1;
    }
    /* the engine checks it again once the model is loaded; a setting the
     * server cannot use is exit 2, and found before the model loads */
    if (c->session_dir && c->session_dir[0]) {
        char err[512];
        int fd = engine_session_dir_open(c->session_dir, err, sizeof err);
        if (fd < 0) {
            fprintf(stderr, "error: %s\n", err);
            return -1;
        }
        close(fd);
    }
    if (strcmp(c->log_level, "debug") != 0 && strcmp(c->log_level, "info") != 0 &&
        strcmp(c->log_level, "warn") != 0 && strcmp(c->log_level, "error") != 0) {
        fprintf(stderr, "error: --log-level expects debug, info, warn or error, got '%s'\n",
                c->log_level);
        return -1;
    }
    return 0;
}

int cmd_serve(int argc, char **argv)
{
    struct server_config c;
    memset(&c, 0, sizeof c);
    c.model = cmd_default_model();
    const struct cmd_flag flags[] = {
        {NULL, "--host", CMD_STR, &c.host, 0, 0, "127.0.0.1", "ADDR", "address to listen on", NULL},
        {"-p", "--port", CMD_I64, &c.port, 0, 65535, "8080", "N",
         "TCP port (0: any free port; the log says which)", NULL},
        {"-m", "--model", CMD_STR, &c.model, 0, 0, NULL, "FILE", CMD_MODEL_HELP, NULL},
        {NULL, "--kv-policy", CMD_STR, &c.kv_policy, 0, 0, "auto", "P",
         "default KV policy: auto | window | sinks:N | dense", NULL},
        {NULL, "--window", CMD_I64, &c.window, 0, 1e12, "4096", "N",
         "window tokens per sequence (0: the model's context length)", NULL},
        {NULL, "--sinks", CMD_I64, &c.sinks, 0, DECODER_MAX_SINKS, "16", "N",
         "sink cells per KV slot (the most any sinks:N policy may pin)", NULL},
        {NULL, "--max-seqs", CMD_I64, &c.max_seqs, 1, 4096, "8", "N",
         "KV slots: sequences and sessions resident at once", NULL},
        {NULL, "--max-queue", CMD_I64, &c.max_queue, 0, 1e6, "16", "N",
         "requests that wait for a slot; beyond it: 429 with Retry-After", NULL},
        {NULL, "--no-mmap", CMD_BOOL, &c.no_mmap, 0, 0, NULL, "",
         "read the weights into memory instead of mapping the file (the file may then change)",
         NULL},
        {NULL, "--backend", CMD_STR, &c.backend, 0, 0, "cpu", "B",
         "cpu | cuda (CUDA: weights in FP16 on GPU 0, fused attention kernels)", NULL},
        {"-t", "--threads", CMD_I64, &c.threads, 1, 256, "2", "N", "CPU backend threads", NULL},
        {NULL, "--chunk", CMD_I64, &c.chunk, 1, 65536, "256", "N",
         "prompt tokens one sequence prefills per step (at most the model's context)", NULL},
        {NULL, "--max-step-tokens", CMD_I64, &c.max_step_tokens, 1, 1e6, "512", "N",
         "tokens in one batched step (decode + prefill; at most --max-seqs x --chunk)", NULL},
        {NULL, "--max-prompt", CMD_I64, &c.max_prompt, 0, 1e12, "0", "N",
         "longest prompt in tokens (0: the model's context length); longer ones get 400 "
         "before they reach the engine",
         NULL},
        {NULL, "--session-idle", CMD_SEC, &c.session_idle, 1, 1e9, "3600", "S",
         "an idle session frees its KV slot after S seconds", NULL},
        {NULL, "--session-dir", CMD_STR, &c.session_dir, 0, 0, "", "DIR",
         "write a session leaving memory (idle, LRU, SIGTERM, POST /v1/sessions/ID/save) to "
         "DIR/ID.snap and restore it on its next request (empty: sessions live in memory only)",
         NULL},
        {NULL, "--session-disk-max", CMD_I64, &c.session_disk_max, 0, 1e15, "0", "BYTES",
         "snapshot bytes kept in --session-dir; beyond it the least recently written of "
         "the API key with the most bytes on disk are deleted (0: no bound)",
         NULL},
        {NULL, "--kv-dtype", CMD_STR, &c.kv_dtype, 0, 0, "f16", "T",
         "KV cache storage: f16 | f32 | q8_0 (8-bit blocks of 32 with an f16 scale: about "
         "half f16's bytes and memory traffic; CPU backend only)",
         NULL},
        {NULL, "--chat-template", CMD_STR, &c.chat_template, 0, 0, "auto", "FORMAT",
         "how chat messages are rendered: auto (the model's tokenizer.chat_template, ChatML "
         "when it has none we recognize) | chatml | llama3 | llama2 | gemma",
         NULL},
        {NULL, "--chat-template-file", CMD_STR, &c.chat_template_file, 0, 0, "", "FILE",
         "a Jinja chat template (Hugging Face's tokenizer_config.json chat_template, as text) "
         "to recognize instead of the model's; a template in none of those formats is an error",
         NULL},
        {NULL, "--api-key", CMD_STRV, c.api_keys, 0, SERVER_CONFIG_MAX_KEYS + 1, NULL, "KEY",
         "require 'Authorization: Bearer KEY' on everything but /health and /metrics; repeat "
         "it for several keys (visible in ps: prefer --api-key-file or $STREAMSINK_API_KEY; "
         "none: open)",
         NULL},
        {NULL, "--api-key-file", CMD_STR, &c.api_key_file, 0, 0, "", "FILE",
         "accepted API keys, one per line ('#' comments); with --api-key, both count", NULL},
        {NULL, "--model-alias", CMD_STR, &c.model_alias, 0, 0, "", "NAMES",
         "more names (comma-separated) the 'model' field may use besides the served id", NULL},
        {NULL, "--max-body", CMD_I64, &c.max_body, 1, GiB, "8388608", "BYTES",
         "largest request body (413 beyond)", NULL},
        {NULL, "--max-body-total", CMD_I64, &c.max_body_total, 0, 64 * GiB, "67108864", "BYTES",
         "request body bytes all connections may hold at once (503 beyond; 0: no limit)", NULL},
        {NULL, "--max-header", CMD_I64, &c.max_header, 256, 1048576, "16384", "BYTES",
         "largest request line + headers (431 beyond)", NULL},
        {NULL, "--max-conns", CMD_I64, &c.max_conns, 1, 1e6, "1024", "N",
         "open connections (beyond it the longest-idle one is closed to make room; 503 when "
         "every one runs a request)",
         NULL},
        {NULL, "--max-response", CMD_I64, &c.max_response, 1024, GiB, "4194304", "BYTES",
         "text of one non-streamed answer (finish_reason length beyond)", NULL},
        {NULL, "--high-water", CMD_I64, &c.high_water, 1024, GiB, "65536", "BYTES",
         "write queue bytes that pause a stream's sequence", NULL},
        {NULL, "--low-water", CMD_I64, &c.low_water, 0, GiB, "16384", "BYTES",
         "write queue bytes that resume it", NULL},
        {NULL, "--sndbuf", CMD_I64, &c.sndbuf, 0, GiB, "65536", "BYTES",
         "kernel send buffer per connection, so backpressure starts early (0: the kernel's "
         "autotuning, which may absorb megabytes)",
         NULL},
        {NULL, "--min-read-rate", CMD_I64, &c.min_read_rate, 0, GiB, "4096", "BYTES",
         "a client with bytes waiting must read this many per second, judged over "
         "--write-stall-timeout, or be closed (0: off)",
         NULL},
        {NULL, "--read-timeout", CMD_SEC, &c.read_timeout, 0.001, 1e6, "30", "S",
         "a request must arrive within S seconds of its first byte (408)", NULL},
        {NULL, "--keepalive-timeout", CMD_SEC, &c.keepalive_timeout, 0.001, 1e6, "60", "S",
         "idle keep-alive connections close after S seconds", NULL},
        {NULL, "--write-stall-timeout", CMD_SEC, &c.write_stall_timeout, 0.001, 1e6, "30", "S",
         "a client that reads nothing for S seconds while paused is closed", NULL},
        {NULL, "--sse-keepalive", CMD_SEC, &c.sse_keepalive, 0, 1e6, "15", "S",
         "': keep-alive' comment interval on idle streams (0: off)", NULL},
        {NULL, "--drain-timeout", CMD_SEC, &c.drain_timeout, 0, 1e6, "30", "S",
         "on SIGTERM/SIGINT, let requests finish for S seconds, then cut them (a stream ends "
         "with an error event and [DONE])",
         NULL},
        {NULL, "--stream-buffer", CMD_I64, &c.stream_buffer, 4096, GiB, "4194304", "BYTES",
         "SSE bytes one stream keeps for a client that reconnects (GET /v1/streams/{id}); a "
         "stream with no client pauses its sequence when this much is undelivered",
         NULL},
        {NULL, "--stream-buffer-total", CMD_I64, &c.stream_buffer_total, 4096, 64 * GiB,
         "268435456", "BYTES",
         "bytes all stream buffers may hold together; at the limit delivered events are "
         "dropped first, then streams with no client pause",
         NULL},
        {NULL, "--stream-grace", CMD_SEC, &c.stream_grace, 0, 86400, "30", "S",
         "a stream whose client left is cancelled (its KV slot freed) unless resumed within S "
         "seconds; a finished one stays resumable as long (0: a disconnect cancels at once)",
         NULL},
        {NULL, "--max-detached", CMD_I64, &c.max_detached, 0, 1 << 20, "4", "N",
         "running streams without a client one owner (an API key; on an open server the "
         "client's IPv4 address or IPv6 /64) may keep; past N its oldest detached stream is "
         "cancelled (0: no limit)",
         NULL},
        {NULL, "--name", CMD_STR, &c.name, 0, 0, "", "NAME",
         "replica name sent as X-Streamsink-Replica (default: hostname:port; printable ASCII, "
         "at most 200 bytes)",
         NULL},
        {NULL, "--log-level", CMD_STR, &c.log_level, 0, 0, "info", "L",
         "debug | info | warn | error", NULL},
    };
    const struct cmd_spec spec = {
        "serve",
        "[options]",
        "Serves the OpenAI API (/v1/completions, /v1/chat/completions, /v1/models)\n"
        "plus /tokenize, /detokenize, /health and /metrics, streaming tokens as\n"
        "server-sent events.",
        flags,
        (int)(sizeof flags / sizeof flags[0]),
        "SIGTERM or SIGINT drains: no new connections, running requests finish\n"
        "within --drain-timeout, then the rest are cut; exit 0. docs/limits.md lists\n"
        "every limit and what a client gets beyond it."};
    int prc = cmd_parse(&spec, argc, argv);
    if (prc >= 0)
        return prc;
    if (check(&c) < 0)
        return CMD_EXIT_USAGE;
    while (c.api_keys[c.n_api_keys])
        c.n_api_keys++;
    switch (server_run(&c)) {
    case SERVER_OK:
        return CMD_EXIT_OK;
    case SERVER_BAD_CONFIG:
        return CMD_EXIT_USAGE;
    case SERVER_BAD_MODEL:
        cmd_model_hint(c.model);
        return CMD_EXIT_MODEL;
    case SERVER_FAILED:
        break;
    }
    return CMD_EXIT_RUNTIME;
}
