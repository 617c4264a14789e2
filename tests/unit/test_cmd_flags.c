/*
 * test_cmd_flags.c: the command layer (cmd/cmd.h): the one flag parser every
 * command uses, its --help from the same table, the exit codes of bad flags in
 * real commands (run, serve, probe) before any model is loaded, and the one
 * default model path against scripts/fetch-model.sh's rule.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd.h"
#include "test.h"

struct vals {
    const char *s;
    int64_t n;
    float x;
    double sec;
    int b;
    enum engine_backend be;
    int n_seen;
};

static int parse(struct vals *v, int argc, char **argv)
{
    const struct cmd_flag flags[] = {
        {"-s", "--str", CMD_STR, &v->s, 0, 0, "dflt", "S", "a string", NULL},
        {"-n", "--num", CMD_I64, &v->n, -5, 100, "7", "N", "an integer", &v->n_seen},
        {NULL, "--x", CMD_F32, &v->x, 0, 1, "0.5", "X", "a number", NULL},
        {NULL, "--sec", CMD_SEC, &v->sec, 0.001, 60, "30", "S", "seconds", NULL},
        {NULL, "--flag", CMD_BOOL, &v->b, 0, 0, NULL, "", "a switch", NULL},
        {NULL, "--backend", CMD_BACKEND, &v->be, 0, 0, "cpu", "B", "cpu or cuda", NULL},
    };
    const struct cmd_spec spec = {"t", "[options]", "A test table.", flags, 6, NULL};
    memset(v, 0, sizeof *v);
    return cmd_parse(&spec, argc, argv);
}

#define ARGV(...) ((char *[]){"t", __VA_ARGS__, NULL})
#define ARGC(...) ((int)(sizeof((char *[]){"t", __VA_ARGS__}) / sizeof(char *)))
#define PARSE(v, ...) parse(v, ARGC(__VA_ARGS__), ARGV(__VA_ARGS__))

TEST(the_tables_defaults_are_parsed_into_every_flag)
{
    struct vals v;
    char *argv[] = {"t", NULL};
    ASSERT_EQ(parse(&v, 1, argv), -1);
    ASSERT_STREQ(v.s, "dflt");
    ASSERT_EQ(v.n, 7);
    ASSERT_NEAR(v.x, 0.5, 0);
    ASSERT_NEAR(v.sec, 30, 0);
    ASSERT_EQ(v.b, 0);
    ASSERT_EQ(v.be, ENGINE_BACKEND_CPU);
    ASSERT_EQ(v.n_seen, 0);
}

TEST(short_long_and_equals_spellings_all_set_a_flag)
{
    struct vals v;
    ASSERT_EQ(PARSE(&v, "-n", "3"), -1);
    ASSERT_EQ(v.n, 3);
    ASSERT_EQ(v.n_seen, 1);
    ASSERT_EQ(PARSE(&v, "--num", "-5", "--str", "abc", "--flag"), -1);
    ASSERT_EQ(v.n, -5);
    ASSERT_STREQ(v.s, "abc");
    ASSERT_EQ(v.b, 1);
    ASSERT_EQ(PARSE(&v, "--num=100", "--x=1", "--sec=0.25", "--backend=cuda", "--str="), -1);
    ASSERT_EQ(v.n, 100);
    ASSERT_NEAR(v.x, 1, 0);
    ASSERT_NEAR(v.sec, 0.25, 0);
    ASSERT_EQ(v.be, ENGINE_BACKEND_CUDA);
    ASSERT_STREQ(v.s, "");
}

TEST(bad_flags_are_usage_errors_exit_2)
{
    struct vals v;
    ASSERT_EQ(PARSE(&v, "--nope"), CMD_EXIT_USAGE);
    ASSERT_EQ(PARSE(&v, "--num"), CMD_EXIT_USAGE);        /* no value */
    ASSERT_EQ(PARSE(&v, "--num", "101"), CMD_EXIT_USAGE); /* above the range */
    ASSERT_EQ(PARSE(&v, "--num", "-6"), CMD_EXIT_USAGE);  /* below it */
    ASSERT_EQ(PARSE(&v, "--num", "3x"), CMD_EXIT_USAGE);  /* not a number */
    ASSERT_EQ(PARSE(&v, "--x", "nan"), CMD_EXIT_USAGE);   /* not finite */
    ASSERT_EQ(PARSE(&v, "--sec", "0"), CMD_EXIT_USAGE);   /* below the range */
    ASSERT_EQ(PARSE(&v, "--flag=1"), CMD_EXIT_USAGE);     /* a switch takes no value */
    ASSERT_EQ(PARSE(&v, "--backend", "gpu"), CMD_EXIT_USAGE);
    ASSERT_EQ(PARSE(&v, "--numx", "1"), CMD_EXIT_USAGE); /* no prefix matching */
    ASSERT_EQ(PARSE(&v, "-h"), CMD_EXIT_OK);
    ASSERT_EQ(PARSE(&v, "--num", "1", "--help"), CMD_EXIT_OK);
}

TEST(help_lists_every_flag_of_the_table_with_its_default)
{
    const struct cmd_flag flags[] = {
        {"-a", "--alpha", CMD_I64, &(int64_t){0}, 0, 9, "4", "N", "alpha help", NULL},
        {NULL, "--beta", CMD_STR, &(const char *){NULL}, 0, 0, NULL, "FILE", "beta help", NULL},
        {NULL, "--gamma", CMD_BOOL, &(int){0}, 0, 0, NULL, "", "gamma help", NULL},
    };
    const struct cmd_spec spec = {"demo", "[opts]", "About demo.", flags, 3, "A note."};
    FILE *f = tmpfile();
    ASSERT(f != NULL);
    cmd_usage(&spec, f);
    char buf[4096];
    rewind(f);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    ASSERT(strstr(buf, "usage: streamsink demo [opts]") != NULL);
    ASSERT(strstr(buf, "About demo.") != NULL);
    ASSERT(strstr(buf, "-a, --alpha N") != NULL);
    ASSERT(strstr(buf, "alpha help (default 4)") != NULL);
    ASSERT(strstr(buf, "--beta FILE") != NULL);
    ASSERT(strstr(buf, "beta help\n") != NULL);
    ASSERT(strstr(buf, "--gamma ") != NULL);
    ASSERT(strstr(buf, "-h, --help") != NULL);
    ASSERT(strstr(buf, "A note.") != NULL);
    ASSERT(strstr(buf, "exit codes: 0 ok, 1 runtime failure, 2 bad usage, 3 bad") != NULL);
}

/* Real commands: their tables reject bad flags with 2 before any model loads
 * (the model path below does not exist, so reaching the load would be 3). */
TEST(every_command_parses_with_the_shared_parser)
{
    char *bad_run[] = {"run", "-m", "/nonexistent.gguf", "-p", "hi", "--temp", "101", NULL};
    ASSERT_EQ(cmd_run(7, bad_run), CMD_EXIT_USAGE);
    char *no_prompt[] = {"run", "-m", "/nonexistent.gguf", NULL};
    ASSERT_EQ(cmd_run(3, no_prompt), CMD_EXIT_USAGE);
    char *bad_policy[] = {"run", "-m",          "/nonexistent.gguf", "-p",
                          "x",   "--kv-policy", "recompute",         NULL};
    ASSERT_EQ(cmd_run(7, bad_policy), CMD_EXIT_USAGE);
    char *missing[] = {"run", "-m", "/nonexistent.gguf", "-p", "hi", NULL};
    ASSERT_EQ(cmd_run(5, missing), CMD_EXIT_MODEL);
    char *serve_unknown[] = {"serve", "--bogus", NULL};
    ASSERT_EQ(cmd_serve(2, serve_unknown), CMD_EXIT_USAGE);
    char *serve_port[] = {"serve", "--port=70000", NULL};
    ASSERT_EQ(cmd_serve(2, serve_port), CMD_EXIT_USAGE);
    char *serve_water[] = {"serve", "--high-water", "2048", "--low-water", "4096", NULL};
    ASSERT_EQ(cmd_serve(5, serve_water), CMD_EXIT_USAGE);
    char *serve_log[] = {"serve", "--log-level", "loud", NULL};
    ASSERT_EQ(cmd_serve(3, serve_log), CMD_EXIT_USAGE);
    char *serve_missing[] = {"serve", "-m", "/nonexistent.gguf", "--port", "0", NULL};
    ASSERT_EQ(cmd_serve(5, serve_missing), CMD_EXIT_MODEL);
    /* with keys loaded: the early exits free them (LeakSanitizer in the ASan run) */
    char *serve_keyed_host[] = {"serve", "--api-key", "k1", "--host", "not-an-address", NULL};
    ASSERT_EQ(cmd_serve(5, serve_keyed_host), CMD_EXIT_USAGE);
    char *serve_keyed_missing[] = {"serve", "--api-key", "k1", "-m", "/nonexistent.gguf", NULL};
    ASSERT_EQ(cmd_serve(5, serve_keyed_missing), CMD_EXIT_MODEL);
    char *serve_chat[] = {"serve", "--chat-template", "jinja", NULL};
    ASSERT_EQ(cmd_serve(3, serve_chat), CMD_EXIT_USAGE);
    char *serve_chat_twice[] = {
        "serve", "--chat-template", "gemma", "--chat-template-file", "/nonexistent.j2", NULL};
    ASSERT_EQ(cmd_serve(5, serve_chat_twice), CMD_EXIT_USAGE);
    /* a name that parses reaches the model's load (3 here), as auto does */
    char *serve_chat_ok[] = {"serve",  "-m", "/nonexistent.gguf", "--port", "0", "--chat-template",
                             "llama2", NULL};
    ASSERT_EQ(cmd_serve(7, serve_chat_ok), CMD_EXIT_MODEL);
    /* a template file is read before the model loads: its errors are usage (2) */
    char *serve_chat_file[] = {"serve",           "-m", "/nonexistent.gguf",
                               "--port",          "0",  "--chat-template-file",
                               "/nonexistent.j2", NULL};
    ASSERT_EQ(cmd_serve(7, serve_chat_file), CMD_EXIT_USAGE);
    char *probe_tokens[] = {"probe", "--tokens", "64", NULL}; /* needs > 64 */
    ASSERT_EQ(cmd_probe(3, probe_tokens), CMD_EXIT_USAGE);
    char *calib_need[] = {"calibrate", "-m", "/nonexistent.gguf", NULL};
    ASSERT_EQ(cmd_calibrate(3, calib_need), CMD_EXIT_USAGE);
    char *ppl_need[] = {"perplexity", "-m", "/nonexistent.gguf", NULL};
    ASSERT_EQ(cmd_perplexity(3, ppl_need), CMD_EXIT_USAGE);
}

/* scripts/fetch-model.sh: DIR="${XDG_CACHE_HOME:-$HOME/.cache}/streamsink" */
TEST(the_default_model_path_follows_fetch_model_sh)
{
    const char *keep_m = getenv("STREAMSINK_MODEL"), *keep_x = getenv("XDG_CACHE_HOME");
    const char *keep_h = getenv("HOME");
    char km[4096] = "", kx[4096] = "", kh[4096] = "";
    snprintf(km, sizeof km, "%s", keep_m ? keep_m : "");
    snprintf(kx, sizeof kx, "%s", keep_x ? keep_x : "");
    snprintf(kh, sizeof kh, "%s", keep_h ? keep_h : "");

    setenv("STREAMSINK_MODEL", "/models/x.gguf", 1);
    ASSERT_STREQ(cmd_default_model(), "/models/x.gguf");
    setenv("STREAMSINK_MODEL", "", 1); /* empty: as unset, like ${VAR:-...} */
    setenv("XDG_CACHE_HOME", "/xdg", 1);
    ASSERT_STREQ(cmd_default_model(), "/xdg/streamsink/SmolLM2-135M-Instruct.Q4_1.gguf");
    unsetenv("XDG_CACHE_HOME");
    setenv("HOME", "/home/u", 1);
    ASSERT_STREQ(cmd_default_model(), "/home/u/.cache/streamsink/SmolLM2-135M-Instruct.Q4_1.gguf");
    ASSERT_STREQ(test_model_path(), cmd_default_model());

    if (keep_m)
        setenv("STREAMSINK_MODEL", km, 1);
    else
        unsetenv("STREAMSINK_MODEL");
    if (keep_x)
        setenv("XDG_CACHE_HOME", kx, 1);
    if (keep_h)
        setenv("HOME", kh, 1);
}

TEST_MAIN()
