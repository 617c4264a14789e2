/*
 * cli.h: shared plumbing for the engine's command-line tools: flag parsing
 * helpers and a loaded "local" decoder (model + tokenizer + CPU backend +
 * forward state) used on the calling thread. Internal to engine/.
 */
#ifndef SS_CLI_H
#define SS_CLI_H

#include <stdint.h>
#include <stdio.h>

#include "backend.h"
#include "forward.h"
#include "kvcache.h"
#include "model.h"
#include "tokenizer.h"

struct cli_local {
    struct model model;
    struct tokenizer *tok;
    struct backend backend;
    struct fwd fwd;
    int have_backend, have_fwd;
};

struct cli_local_config {
    const char *model_path;
    int n_threads;
    enum backend_kind backend;
    int64_t max_tokens; /* largest chunk per step */
    int64_t n_sinks;    /* sink cells per slot */
    int64_t window;     /* window cells per slot */
    int64_t n_slots;
    enum kv_dtype kv_dtype;
};

/* Loads everything; on failure prints one message to stderr and returns an
 * ENGINE_EXIT_* code (the model's errors give ENGINE_EXIT_MODEL). */
int cli_local_open(struct cli_local *c, const struct cli_local_config *cfg);
void cli_local_close(struct cli_local *c);
/* For a model declared softmax1 or sink: runs the sink probe on a built-in
 * text and warns on stderr when its sink rate is above PROBE_WARN_RATE
 * (window-only eviction may then hurt it). Needs a free slot and a window of
 * a few hundred tokens; otherwise it says it skipped. */
void cli_local_warn_sinks(struct cli_local *c);

/* Default model path: $STREAMSINK_MODEL or the cache path of scripts/fetch-model.sh. */
const char *cli_default_model(void);

/* One flag of a command's table (cli_parse). */
enum cli_opt_kind {
    CLI_STR,     /* const char ** */
    CLI_I64,     /* int64_t *, in [lo, hi] */
    CLI_F32,     /* float *, in [lo, hi] */
    CLI_BOOL,    /* int *: set to 1, takes no value */
    CLI_BACKEND, /* enum backend_kind *: cpu | cuda */
};
struct cli_opt {
    const char *shrt; /* "-m", or NULL */
    const char *lng;  /* "--model" */
    enum cli_opt_kind kind;
    void *dst;
    double lo, hi;
    int *seen; /* NULL, or set to 1 when the flag is given */
};
/* Parses argv[1..] against a command's table (-h/--help print usage to
 * stdout). Returns -1 when every flag parsed, ENGINE_EXIT_OK after help, or
 * ENGINE_EXIT_USAGE after one message naming the bad flag. */
int cli_parse(int argc, char **argv, const struct cli_opt *opts, int n_opts, const char *cmd,
              void (*usage)(FILE *));

/* Parses a flag value; print an error and return -1 when invalid. */
int cli_parse_i64(const char *flag, const char *s, int64_t lo, int64_t hi, int64_t *out);
int cli_parse_f32(const char *flag, const char *s, float lo, float hi, float *out);
/* 1 if arg a is the short flag s (may be NULL) or the long flag l. */
int cli_flag(const char *a, const char *s, const char *l);
/* Monotonic seconds. */
double cli_now(void);
/* Reads a whole file into a NUL-terminated malloc'd buffer. */
char *cli_read_file(const char *path, size_t *len);

#endif
