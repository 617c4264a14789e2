/*
 * cli.h: shared plumbing for the command-line tools: flag parsing helpers
 * and opening a decoder (decoder.h) with one message and exit code per
 * failure.
 */
#ifndef SS_CLI_H
#define SS_CLI_H

#include <stdint.h>
#include <stdio.h>

#include "decoder.h"
#include "engine.h"

/* Opens a decoder; on failure prints one message to stderr (and a hint when
 * the default model is missing) and returns an ENGINE_EXIT_* code:
 * ENGINE_EXIT_MODEL when engine_error_is_model says the file is at fault. */
int cli_open(struct decoder **d, const struct decoder_config *cfg);
/* For a model that evicts freely (declared softmax1, sink or softpick): runs
 * the load-time sink check and, by decoder_sink_check's one policy, warns on
 * stderr when its sink rate says window-only eviction may hurt it. Says so
 * when the window is too small for the check. */
void cli_warn_sinks(struct decoder *d);

/* Default model path: $STREAMSINK_MODEL or the cache path of scripts/fetch-model.sh. */
const char *cli_default_model(void);

/* One flag of a command's table (cli_parse). */
enum cli_opt_kind {
    CLI_STR,     /* const char ** */
    CLI_I64,     /* int64_t *, in [lo, hi] */
    CLI_F32,     /* float *, in [lo, hi] */
    CLI_BOOL,    /* int *: set to 1, takes no value */
    CLI_BACKEND, /* enum engine_backend *: cpu | cuda */
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
