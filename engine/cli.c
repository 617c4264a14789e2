/* cli.c: shared plumbing for the engine's command-line tools (cli.h). */
#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine.h"
#include "probe.h"

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
            ok = backend_kind_parse(v, o->dst) == 0;
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

int cli_local_open(struct cli_local *c, const struct cli_local_config *cfg)
{
    char err[512] = "";
    memset(c, 0, sizeof *c);
    int rc = model_load(&c->model, cfg->model_path, err, sizeof err);
    if (rc < 0) {
        fprintf(stderr, "error: %s\n", err);
        if (rc == -ENOENT && strcmp(cfg->model_path, cli_default_model()) == 0)
            fprintf(stderr, "hint: run scripts/fetch-model.sh to fetch the default model\n");
        return ENGINE_EXIT_MODEL;
    }
    rc = tok_load(&c->tok, &c->model.gguf, err, sizeof err);
    if (rc < 0) {
        fprintf(stderr, "error: %s: %s\n", cfg->model_path, err);
        cli_local_close(c);
        return ENGINE_EXIT_MODEL;
    }
    struct backend_config bc = {
        .kind = cfg->backend, .n_threads = cfg->n_threads, .max_tokens = cfg->max_tokens};
    rc = backend_init(&c->backend, &c->model, &bc, err, sizeof err);
    if (rc < 0) {
        fprintf(stderr, "error: %s\n", err);
        cli_local_close(c);
        return ENGINE_EXIT_RUNTIME;
    }
    c->have_backend = 1;
    const struct model_hparams *hp = &c->model.hp;
    int64_t window = cfg->window;
    if (window <= 0 || window > hp->n_ctx_train)
        window = hp->n_ctx_train; /* no window beyond what the model was trained on */
    struct kv_geometry g = {
        .n_layer = hp->n_layer,
        .n_kv_head = hp->n_head_kv,
        .head_dim = hp->head_dim,
        .n_sinks = cfg->n_sinks,
        .window = window,
        .chunk = cfg->max_tokens,
        .n_slots = cfg->n_slots,
        .dtype = cfg->kv_dtype,
    };
    rc = fwd_init(&c->fwd, &c->model, &c->backend, &g, err, sizeof err);
    if (rc < 0) {
        fprintf(stderr, "error: %s\n", err);
        cli_local_close(c);
        return ENGINE_EXIT_RUNTIME;
    }
    c->have_fwd = 1;
    return ENGINE_EXIT_OK;
}

void cli_local_close(struct cli_local *c)
{
    if (c->have_fwd)
        fwd_free(&c->fwd);
    if (c->have_backend)
        c->backend.ops->free(&c->backend);
    tok_free(c->tok);
    model_free(&c->model);
    memset(c, 0, sizeof *c);
}

void cli_local_warn_sinks(struct cli_local *c)
{
    enum model_normalizer nz = c->model.hp.normalizer;
    if (nz != MODEL_NORM_SOFTMAX1 && nz != MODEL_NORM_SINK)
        return;
    int32_t ids[1024];
    int64_t n = tok_encode(c->tok, probe_builtin_text, strlen(probe_builtin_text),
                           tok_add_bos(c->tok), 0, ids, 1024);
    struct probe_result pr;
    if (n <= 0 || n > 1024 || probe_run(&c->fwd, ids, n, &pr) < 0) {
        fprintf(stderr, "note: sink probe skipped (the window is too small for it)\n");
        return;
    }
    if (pr.sink_rate > PROBE_WARN_RATE)
        fprintf(stderr,
                "warning: this model is declared %s (evicts freely) but %.0f%% of its heads put "
                "more than %.0f%% of their attention on the first token: window-only eviction "
                "may hurt it (streamsink probe shows the details)\n",
                model_normalizer_name(nz), 100.0 * pr.sink_rate, 100.0 * PROBE_SINK_MASS);
    probe_free(&pr);
}
