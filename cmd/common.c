/*
 * common.c: what every command shares (cmd.h): the default model path, one
 * way to open a decoder and report its failure, the sink warning, files and
 * time.
 */
#include "cmd.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "decoder.h"
#include "engine.h"

int cmd_kv_dtype(const char *name, int kv_f32, enum engine_kv_dtype *out)
{
    *out = ENGINE_KV_F16;
    if (name && engine_kv_dtype_parse(name, out) < 0) {
        fprintf(stderr, "error: --kv-dtype expects f16, f32 or q8_0, got '%s'\n", name);
        return CMD_EXIT_USAGE;
    }
    if (name && kv_f32 && *out != ENGINE_KV_F32) {
        fprintf(stderr, "error: --kv-f32 and --kv-dtype %s disagree\n", name);
        return CMD_EXIT_USAGE;
    }
    if (kv_f32)
        *out = ENGINE_KV_F32;
    return CMD_EXIT_OK;
}

const char *cmd_fetched_model(void)
{
    static char buf[4096];
    const char *cache = getenv("XDG_CACHE_HOME");
    if (cache && *cache)
        snprintf(buf, sizeof buf, "%s/streamsink/SmolLM2-135M-Instruct.Q4_1.gguf", cache);
    else
        snprintf(buf, sizeof buf, "%s/.cache/streamsink/SmolLM2-135M-Instruct.Q4_1.gguf",
                 getenv("HOME") ? getenv("HOME") : ".");
    return buf;
}

void cmd_model_hint(const char *path)
{
    if (strcmp(path, cmd_fetched_model()) == 0 && access(path, F_OK) != 0)
        fprintf(stderr, "hint: run scripts/fetch-model.sh to fetch the default model, "
                        "or pass -m FILE\n");
}

const char *cmd_default_model(void)
{
    const char *p = getenv("STREAMSINK_MODEL");
    return p && *p ? p : cmd_fetched_model();
}

int cmd_close_output(FILE *f, const char *path)
{
    /* fclose writes what is still buffered: a small file fails only there */
    int bad = ferror(f);
    int rc = fclose(f);
    if (rc != 0)
        fprintf(stderr, "error: writing %s: %s\n", path, strerror(errno));
    else if (bad)
        fprintf(stderr, "error: writing %s failed\n", path);
    return rc != 0 || bad ? CMD_EXIT_RUNTIME : CMD_EXIT_OK;
}

double cmd_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

char *cmd_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (n < cap)
            break;
        char *nb = realloc(buf, cap * 2 + 1);
        if (!nb) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = nb;
        cap *= 2;
    }
    int bad = ferror(f);
    fclose(f);
    if (!buf || bad) {
        free(buf);
        return NULL;
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

int cmd_open_decoder(struct decoder **d, const struct decoder_config *cfg)
{
    char err[512] = "";
    int rc = decoder_open(d, cfg, err, sizeof err);
    if (rc == 0)
        return CMD_EXIT_OK;
    fprintf(stderr, "error: %s\n", err);
    cmd_model_hint(cfg->model_path);
    return engine_error_is_model(rc) ? CMD_EXIT_MODEL : CMD_EXIT_RUNTIME;
}

int64_t cmd_tokenize_text(struct decoder *d, const char *text, size_t len, int add_bos,
                          int32_t **ids)
{
    int64_t cap = (int64_t)len + 2; /* a token is at least one byte, and BOS */
    *ids = malloc((size_t)cap * sizeof **ids);
    int64_t n = *ids ? decoder_tokenize(d, text, len, add_bos, 0, *ids, cap) : -ENOMEM;
    if (n >= 0 && n <= cap)
        return n;
    fprintf(stderr, "error: tokenizing the text failed: %s\n",
            n < 0 ? strerror((int)-n) : "more tokens than bytes");
    free(*ids);
    *ids = NULL;
    return -1;
}

void cmd_warn_sinks(struct decoder *d)
{
    struct decoder_info in;
    decoder_get_info(d, &in);
    if (in.needs_sinks)
        return;
    struct decoder_sink_check sc;
    decoder_sink_check(d, &sc);
    if (!sc.ran) {
        fprintf(stderr, "note: sink probe skipped (the window is too small for it)\n");
        return;
    }
    if (sc.warn)
        fprintf(stderr,
                "warning: this model is declared %s (evicts freely) but %.0f%% of its heads put "
                "more than %.0f%% of their attention on the first token: window-only eviction "
                "may hurt it (streamsink probe shows the details)\n",
                in.normalizer, 100.0 * sc.sink_rate, 100.0 * DECODER_PROBE_SINK_MASS);
}
