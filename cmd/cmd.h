/*
 * cmd.h: the streamsink program's command layer: the process exit codes, the
 * one flag parser every command uses (a table per command, which also prints
 * that command's --help), the default model path, and opening a decoder with
 * one message and one exit code per failure. Each command is one file
 * (run.c, perplexity.c, probe.c, calibrate.c, serve.c); main.c dispatches.
 *
 * The commands see the engine only through its facade (engine.h, decoder.h)
 * and the server only through server.h.
 */
#ifndef SS_CMD_H
#define SS_CMD_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "decoder.h"

/* Process exit codes, the same for every command (docs/serving.md). */
#define CMD_EXIT_OK 0
#define CMD_EXIT_RUNTIME 1 /* a failure while running */
#define CMD_EXIT_USAGE 2   /* bad command-line flags */
#define CMD_EXIT_MODEL 3   /* model file missing, truncated, corrupt or unsupported */

/* ---- flags ------------------------------------------------------------------- */

enum cmd_flag_kind {
    CMD_STR,     /* const char ** */
    CMD_I64,     /* int64_t *, in [lo, hi] */
    CMD_F32,     /* float *, in [lo, hi] */
    CMD_SEC,     /* double * (seconds), in [lo, hi] */
    CMD_BOOL,    /* int *: set to 1, takes no value */
    CMD_BACKEND, /* enum engine_backend *: cpu | cuda */
    CMD_STRV,    /* const char *[hi], NULL-terminated: each use appends one value */
};

struct cmd_flag {
    const char *shrt; /* "-m", or NULL */
    const char *lng;  /* "--model" */
    enum cmd_flag_kind kind;
    void *dst;
    double lo, hi;    /* CMD_I64: hi >= 9.2e18 means INT64_MAX */
    const char *def;  /* the default as text, parsed into dst before argv; NULL: the caller
                         set dst (the help says so in its text) */
    const char *meta; /* "FILE", "N" ... ("" for CMD_BOOL) */
    const char *help;
    int *seen; /* NULL, or set to 1 when the flag is given */
};

struct cmd_spec {
    const char *name;     /* "run" */
    const char *synopsis; /* after "usage: streamsink NAME " */
    const char *about;    /* a paragraph before the flags */
    const struct cmd_flag *flags;
    int n_flags;
    const char *notes; /* a paragraph after the flags, or NULL */
};

/* Sets every flag's default, then parses argv[1..] (argv[0] is the command
 * name) against the table: "--flag value", "-f value" and "--flag=value".
 * -h/--help prints the usage to stdout. Returns -1 when every flag parsed,
 * CMD_EXIT_OK after --help, or CMD_EXIT_USAGE after one message naming the
 * bad flag. */
int cmd_parse(const struct cmd_spec *spec, int argc, char **argv);
/* The usage: synopsis, about, one line per flag with its default, notes. */
void cmd_usage(const struct cmd_spec *spec, FILE *f);

/* The -m/--model help text every command shares. */
#define CMD_MODEL_HELP                                                                             \
    "GGUF model (default: $STREAMSINK_MODEL, else "                                                \
    "${XDG_CACHE_HOME:-~/.cache}/streamsink/SmolLM2-135M-Instruct.Q4_1.gguf, where "               \
    "scripts/fetch-model.sh puts it)"

/* ---- shared plumbing ----------------------------------------------------------- */

/* The default model path: $STREAMSINK_MODEL, else the cache path of
 * scripts/fetch-model.sh. The one copy of this rule in the program. */
const char *cmd_default_model(void);
/* ${XDG_CACHE_HOME:-$HOME/.cache}/streamsink/SmolLM2-135M-Instruct.Q4_1.gguf,
 * where scripts/fetch-model.sh puts the default model (a missing one there
 * earns the hint to run it; one named by $STREAMSINK_MODEL or -m does not). */
const char *cmd_fetched_model(void);
/* Tells stderr to run scripts/fetch-model.sh when path is cmd_fetched_model()
 * and no file is there; nothing for any other path. */
void cmd_model_hint(const char *path);

/* The KV storage of --kv-dtype NAME (NULL: f16), or f32 with --kv-f32.
 * CMD_EXIT_OK, or CMD_EXIT_USAGE after a message. */
int cmd_kv_dtype(const char *name, int kv_f32, enum engine_kv_dtype *out);

/* Opens a decoder; on failure prints one message to stderr (with a hint when
 * the default model is missing) and returns CMD_EXIT_MODEL when the model
 * file is at fault (engine_error_is_model), else CMD_EXIT_RUNTIME. */
int cmd_open_decoder(struct decoder **d, const struct decoder_config *cfg);
/* For a model that evicts freely (declared softmax1, sink or softpick): the
 * load-time sink check, and its warning on stderr when decoder_sink_check
 * says so. Says so when the window is too small for the check. */
void cmd_warn_sinks(struct decoder *d);

/* Closes a file the command wrote (stdout too; path names it in the
 * message): a write that failed, now or earlier (a full disk, /dev/full), is
 * one message and CMD_EXIT_RUNTIME, else CMD_EXIT_OK. */
int cmd_close_output(FILE *f, const char *path);

/* Monotonic seconds. */
double cmd_now(void);
/* Reads a whole file into a NUL-terminated malloc'd buffer; NULL with errno. */
char *cmd_read_file(const char *path, size_t *len);
/* A text file's tokens (no special tokens parsed; BOS first when add_bos)
 * in *ids (caller frees). Returns the count, or -1 after a message (out of
 * memory, a tokenizer error): a runtime failure, not the text's fault. */
int64_t cmd_tokenize_text(struct decoder *d, const char *text, size_t len, int add_bos,
                          int32_t **ids);

/* ---- perplexity ----------------------------------------------------------------- */

/* The tokens `perplexity --policy recompute` runs from scratch before scoring
 * token t+1 of ids: the last `window` of ids[0..t]. When the model's
 * tokenizer starts a text with BOS (bos >= 0, as ids[0]) and the window has
 * slid past it, the window is BOS and then the last window - 1 tokens, so it
 * starts as a fresh request does (Gemma needs its <bos> at position 0).
 * Writes at most window ids into out and returns the count. */
int64_t cmd_recompute_window(const int32_t *ids, int64_t t, int64_t window, int32_t bos,
                             int32_t *out);

/* ---- the commands: each returns the process exit code ---------------------------- */

int cmd_run(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);
int cmd_probe(int argc, char **argv);
int cmd_calibrate(int argc, char **argv);
int cmd_serve(int argc, char **argv);

#endif
