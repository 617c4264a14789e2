/*
 * flags.c: the one flag parser (cmd.h). A command describes its flags in one
 * table; cmd_parse sets the table's defaults with the same code that parses
 * argv, and cmd_usage prints the same table, so a flag, its default and its
 * help cannot drift apart, in any command.
 */
#include "cmd.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static int64_t i64_hi(double hi)
{
    return hi >= 9.2e18 ? INT64_MAX : (int64_t)hi;
}

/* Parses v into o->dst; prints one message and returns -1 when invalid. */
static int set_value(const struct cmd_flag *o, const char *v)
{
    char *end = NULL;
    errno = 0;
    switch (o->kind) {
    case CMD_STR:
        *(const char **)o->dst = v;
        return 0;
    case CMD_BOOL:
        *(int *)o->dst = 1;
        return 0;
    case CMD_I64: {
        long long x = strtoll(v, &end, 10);
        if (errno || end == v || *end || x < (int64_t)o->lo || x > i64_hi(o->hi)) {
            fprintf(stderr, "error: %s expects an integer in [%lld, %lld], got '%s'\n", o->lng,
                    (long long)o->lo, (long long)i64_hi(o->hi), v);
            return -1;
        }
        *(int64_t *)o->dst = x;
        return 0;
    }
    case CMD_F32:
    case CMD_SEC: {
        double x = strtod(v, &end);
        if (errno || end == v || *end || !isfinite(x) || x < o->lo || x > o->hi) {
            fprintf(stderr, "error: %s expects %s in [%g, %g], got '%s'\n", o->lng,
                    o->kind == CMD_SEC ? "seconds" : "a number", o->lo, o->hi, v);
            return -1;
        }
        if (o->kind == CMD_SEC)
            *(double *)o->dst = x;
        else
            *(float *)o->dst = (float)x;
        return 0;
    }
    case CMD_STRV: {
        const char **v_arr = o->dst;
        int64_t cap = (int64_t)o->hi, n = 0;
        while (n < cap && v_arr[n])
            n++;
        if (n + 1 >= cap) { /* one entry stays NULL */
            fprintf(stderr, "error: %s may be given at most %lld times\n", o->lng,
                    (long long)(cap - 1));
            return -1;
        }
        v_arr[n] = v;
        return 0;
    }
    case CMD_BACKEND:
        if (engine_backend_parse(v, o->dst) < 0) {
            fprintf(stderr, "error: %s expects cpu or cuda, got '%s'\n", o->lng, v);
            return -1;
        }
        return 0;
    }
    return -1;
}

/* The table entry for argument a, and the value after '=' if a has one. */
static const struct cmd_flag *find(const struct cmd_spec *spec, const char *a, const char **val)
{
    *val = NULL;
    for (int k = 0; k < spec->n_flags; k++) {
        const struct cmd_flag *o = &spec->flags[k];
        size_t ll = strlen(o->lng);
        if (strcmp(a, o->lng) == 0 || (o->shrt && strcmp(a, o->shrt) == 0))
            return o;
        if (strncmp(a, o->lng, ll) == 0 && a[ll] == '=') {
            *val = a + ll + 1;
            return o;
        }
    }
    return NULL;
}

int cmd_parse(const struct cmd_spec *spec, int argc, char **argv)
{
    for (int k = 0; k < spec->n_flags; k++) {
        const struct cmd_flag *o = &spec->flags[k];
        if (o->def && set_value(o, o->def) < 0)
            return CMD_EXIT_RUNTIME; /* a bad table: our bug, said out loud */
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            cmd_usage(spec, stdout);
            return CMD_EXIT_OK;
        }
        const char *v;
        const struct cmd_flag *o = find(spec, a, &v);
        if (!o) {
            fprintf(stderr, "error: unknown flag '%s' (see streamsink %s --help)\n", a, spec->name);
            return CMD_EXIT_USAGE;
        }
        if (o->kind == CMD_BOOL && v) {
            fprintf(stderr, "error: %s takes no value\n", o->lng);
            return CMD_EXIT_USAGE;
        }
        if (o->kind != CMD_BOOL && !v) {
            if (i + 1 >= argc) {
                fprintf(stderr, "error: %s needs a value\n", a);
                return CMD_EXIT_USAGE;
            }
            v = argv[++i];
        }
        if (o->seen)
            *o->seen = 1;
        if (set_value(o, v) < 0)
            return CMD_EXIT_USAGE;
    }
    return -1;
}

void cmd_usage(const struct cmd_spec *spec, FILE *f)
{
    fprintf(f, "usage: streamsink %s %s\n\n%s\n\n", spec->name, spec->synopsis, spec->about);
    for (int k = 0; k < spec->n_flags; k++) {
        const struct cmd_flag *o = &spec->flags[k];
        char flag[64];
        snprintf(flag, sizeof flag, "%s%s%s%s%s", o->shrt ? o->shrt : "", o->shrt ? ", " : "    ",
                 o->lng, o->meta[0] ? " " : "", o->meta);
        if (o->def && o->def[0] && o->kind != CMD_BOOL)
            fprintf(f, "  %-30s %s (default %s)\n", flag, o->help, o->def);
        else
            fprintf(f, "  %-30s %s\n", flag, o->help);
    }
    fprintf(f, "  %-30s %s\n", "-h, --help", "this text");
    if (spec->notes)
        fprintf(f, "\n%s\n", spec->notes);
    fprintf(f, "\nexit codes: 0 ok, 1 runtime failure, 2 bad usage, 3 bad or missing model file\n");
}
