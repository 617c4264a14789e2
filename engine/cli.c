/* cli.c: shared plumbing for the engine's command-line tools (cli.h). */
#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine.h"

const char *cli_default_model(void)
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

int cli_parse_i64(const char *flag, const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    char *end = NULL;
    errno = 0;
    long long v = s ? strtoll(s, &end, 10) : 0;
    if (!s || errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "error: %s expects an integer in [%lld, %lld], got '%s'\n", flag,
                (long long)lo, (long long)hi, s ? s : "(nothing)");
        return -1;
    }
    *out = v;
    return 0;
}

int cli_parse_f32(const char *flag, const char *s, float lo, float hi, float *out)
{
    char *end = NULL;
    errno = 0;
    double v = s ? strtod(s, &end) : 0;
    if (!s || errno || end == s || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "error: %s expects a number in [%g, %g], got '%s'\n", flag, (double)lo,
                (double)hi, s ? s : "(nothing)");
        return -1;
    }
    *out = (float)v;
    return 0;
}

int cli_parse(int argc, char **argv, const struct cli_opt *opts, int n_opts, const char *cmd,
              void (*usage)(FILE *))
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (cli_flag(a, "-h", "--help")) {
            usage(stdout);
            return ENGINE_EXIT_OK;
        }
        const struct cli_opt *o = NULL;
        for (int k = 0; k < n_opts && !o; k++)
            if (cli_flag(a, opts[k].shrt, opts[k].lng))
                o = &opts[k];
        if (!o) {
            fprintf(stderr, "error: unknown flag '%s' (see streamsink %s --help)\n", a, cmd);
            return ENGINE_EXIT_USAGE;
        }
        if (o->seen)
            *o->seen = 1;
        if (o->kind == CLI_BOOL) {
            *(int *)o->dst = 1;
            continue;
        }
        const char *v = i + 1 < argc ? argv[++i] : NULL;
        if (!v) {
            fprintf(stderr, "error: %s needs a value\n", a);
            return ENGINE_EXIT_USAGE;
        }
        int ok = 1;
        switch (o->kind) {
        case CLI_STR:
            *(const char **)o->dst = v;
            break;
        case CLI_I64: /* hi >= 2^63 (as a double) means INT64_MAX */
            ok = cli_parse_i64(a, v, (int64_t)o->lo, o->hi >= 9.2e18 ? INT64_MAX : (int64_t)o->hi,
                               o->dst) == 0;
            break;
        case CLI_F32:
            ok = cli_parse_f32(a, v, (float)o->lo, (float)o->hi, o->dst) == 0;
            break;
        case CLI_BACKEND:
            ok = engine_backend_parse(v, o->dst) == 0;
            if (!ok)
                fprintf(stderr, "error: %s expects cpu or cuda, got '%s'\n", a, v);
            break;
        case CLI_BOOL:
            break;
        }
        if (!ok)
            return ENGINE_EXIT_USAGE;
    }
    return -1;
}

int cli_flag(const char *a, const char *s, const char *l)
{
    return (s && strcmp(a, s) == 0) || strcmp(a, l) == 0;
}

double cli_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

char *cli_read_file(const char *path, size_t *len)
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

int cli_open(struct decoder **d, const struct decoder_config *cfg)
{
    char err[512] = "";
    int rc = decoder_open(d, cfg, err, sizeof err);
    if (rc == 0)
        return ENGINE_EXIT_OK;
    fprintf(stderr, "error: %s\n", err);
    if (rc == -ENOENT && strcmp(cfg->model_path, cli_default_model()) == 0)
        fprintf(stderr, "hint: run scripts/fetch-model.sh to fetch the default model\n");
    return engine_error_is_model(rc) ? ENGINE_EXIT_MODEL : ENGINE_EXIT_RUNTIME;
}

void cli_warn_sinks(struct decoder *d)
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
