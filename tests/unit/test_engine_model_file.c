/*
 * test_engine_model_file.c: the model file changing under a running engine.
 *
 *  - A mapped model file truncated while the engine serves: the next step
 *    touches weights past the new end of file (SIGBUS). The process must
 *    exit with the program's bad-model code (CMD_EXIT_MODEL, 3) and one line on stderr naming the
 * file, not die of the signal. Run in a forked child on a copy of the fixture.
 *  - A SIGBUS that is not in a model file still kills the process as before
 *    (the guard passes it on).
 *  - With no_mmap (MODEL_NO_MMAP) the weights are a private copy: truncating
 *    and overwriting the file changes nothing, and the logits are exactly
 *    those of the untouched file, mapped.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cmd/cmd.h"
#include "engine.h"
#include "engine/model.h"
#include "engine/sampler.h"
#include "test.h"
#include "support/tiny_model.h"

#define FIXTURE SS_FIXTURES_DIR "/norm_softmax.gguf"

/* Copies the fixture to a new temporary file; its path goes to path. */
static int copy_fixture(char *path, size_t cap)
{
    const char *dir = getenv("TMPDIR");
    snprintf(path, cap, "%s/streamsink-model-XXXXXX", dir && *dir ? dir : "/tmp");
    int out = mkstemp(path);
    int in = open(FIXTURE, O_RDONLY);
    char buf[65536];
    ssize_t n;
    int rc = out >= 0 && in >= 0 ? 0 : -1;
    while (rc == 0 && (n = read(in, buf, sizeof buf)) > 0)
        if (write(out, buf, (size_t)n) != n)
            rc = -1;
    if (in >= 0)
        close(in);
    if (out >= 0)
        close(out);
    return rc;
}

static void wake_nothing(void *arg)
{
    (void)arg;
}

/* Child: serves one request from path, truncating the file after start. */
static void child_truncate_while_serving(const char *path)
{
    struct engine_config c = engine_default_config();
    c.model_path = path;
    c.n_threads = 1;
    c.max_seqs = 1;
    c.window = 64;
    c.chunk = 64;
    c.max_step_tokens = 64;
    struct engine *e;
    char err[256];
    if (engine_start(&e, &c, wake_nothing, NULL, err, sizeof err) < 0) {
        fprintf(stderr, "engine_start: %s\n", err);
        _exit(90);
    }
    if (truncate(path, 0) < 0)
        _exit(91);
    struct engine_request q;
    memset(&q, 0, sizeof q);
    q.id = 1;
    q.max_tokens = 8;
    q.sampling = engine_sampling_defaults();
    q.prompt = strdup("hello");
    q.prompt_len = 5;
    if (engine_submit(e, &q) < 0)
        _exit(92);
    struct engine_event ev[16];
    for (int i = 0; i < 3000; i++) { /* the step must fault long before 30 s */
        size_t n = engine_drain(e, ev, 16);
        for (size_t k = 0; k < n; k++)
            if (ev[k].kind != ENGINE_EV_TOKEN)
                _exit(93);
        usleep(10000);
    }
    _exit(94);
}

/* Child: a SIGBUS in a file that is not a model, with the guard installed. */
static void child_foreign_sigbus(const char *model, const char *other)
{
    struct model m;
    char err[256];
    if (model_load(&m, model, err, sizeof err) < 0)
        _exit(90);
    int fd = open(other, O_RDONLY);
    const volatile char *p = fd >= 0 ? mmap(NULL, 65536, PROT_READ, MAP_PRIVATE, fd, 0) : NULL;
    if (!p || p == MAP_FAILED || truncate(other, 0) < 0)
        _exit(91);
    char c = p[60000]; /* SIGBUS */
    _exit(c == 0 ? 95 : 96);
}

/* Runs fn(a, b) in a child with stderr captured into out; returns the wait
 * status. */
static int run_child(void (*fn)(const char *, const char *), const char *a, const char *b,
                     char *out, size_t cap)
{
    int fds[2];
    if (pipe(fds) < 0)
        return -1;
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        dup2(fds[1], STDERR_FILENO);
        fn(a, b);
        _exit(97);
    }
    close(fds[1]);
    size_t n = 0;
    ssize_t r;
    while (n + 1 < cap && (r = read(fds[0], out + n, cap - 1 - n)) > 0)
        n += (size_t)r;
    out[n] = 0;
    close(fds[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    return st;
}

static void truncate_while_serving(const char *path, const char *unused)
{
    (void)unused;
    child_truncate_while_serving(path);
}

TEST(a_model_file_truncated_while_mapped_exits_3_with_one_clear_line)
{
    char path[512], out[4096], want[1024];
    ASSERT_OK(copy_fixture(path, sizeof path));
    int st = run_child(truncate_while_serving, path, NULL, out, sizeof out);
    unlink(path);
    snprintf(want, sizeof want,
             "fatal: the model file %s changed or was truncated while mapped; replace model files "
             "by rename, or run with --no-mmap\n",
             path);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != CMD_EXIT_MODEL || !strstr(out, want))
        fprintf(stderr, "  child: %s %d, stderr: \"%s\"\n", WIFEXITED(st) ? "exit" : "signal",
                WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st), out);
    ASSERT(WIFEXITED(st));
    ASSERT_EQ(WEXITSTATUS(st), CMD_EXIT_MODEL);
    ASSERT(strstr(out, want) != NULL);
}

TEST(a_sigbus_outside_model_files_is_not_taken_for_one)
{
    char model[512], other[512], out[4096];
    ASSERT_OK(copy_fixture(model, sizeof model));
    ASSERT_OK(copy_fixture(other, sizeof other));
    int st = run_child(child_foreign_sigbus, model, other, out, sizeof out);
    unlink(model);
    unlink(other);
    /* killed by SIGBUS (or, under a sanitizer, its report and exit 1) */
    int killed = WIFSIGNALED(st) ? WTERMSIG(st) == SIGBUS : WEXITSTATUS(st) == 1;
    if (!killed || strstr(out, "fatal: the model file"))
        fprintf(stderr, "  child: %s %d, stderr: \"%.300s\"\n", WIFEXITED(st) ? "exit" : "signal",
                WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st), out);
    ASSERT(killed);
    ASSERT(strstr(out, "fatal: the model file") == NULL);
}

/* Logits of a fixed token stream on m (CPU, one thread). */
static int logits_of(const struct model *m, const int32_t *toks, int64_t n, float *out)
{
    struct tiny_rig r;
    struct tiny_rig_config rc = {.policy = {KV_POLICY_WINDOW, 0},
                                 .window = 64,
                                 .chunk = 16,
                                 .dtype = KV_DTYPE_F32,
                                 .n_threads = 1};
    if (tiny_rig_open(&r, m, &rc) < 0)
        return -1;
    int64_t rv = tiny_rig_feed(&r, toks, n, 16, out);
    tiny_rig_close(&r);
    return rv < 0 ? -1 : 0;
}

TEST(with_no_mmap_truncating_or_overwriting_the_file_changes_nothing)
{
    char path[512], err[256];
    struct model ref, copy;
    ASSERT_OK(copy_fixture(path, sizeof path));
    ASSERT_OK(model_load(&ref, FIXTURE, err, sizeof err));
    ASSERT_OK(model_open(&copy, path, MODEL_NO_MMAP, err, sizeof err));
    /* overwritten in place: truncated, then garbage of another length */
    int fd = open(path, O_WRONLY | O_TRUNC);
    ASSERT(fd >= 0);
    char junk[4096];
    memset(junk, 0x5A, sizeof junk);
    ASSERT_EQ(write(fd, junk, sizeof junk), (long long)sizeof junk);
    close(fd);
    ASSERT(copy.fd < 0); /* nothing of the file is kept open */

    enum { N = 40 };
    const int64_t V = ref.hp.n_vocab;
    int32_t toks[N];
    tiny_tokens(toks, N, V, 7);
    float *a = malloc((size_t)(N * V) * sizeof(float));
    float *b = malloc((size_t)(N * V) * sizeof(float));
    ASSERT(a && b);
    ASSERT_OK(logits_of(&ref, toks, N, a));
    ASSERT_OK(logits_of(&copy, toks, N, b));
    double mx = 0, d = tiny_max_diff(a, b, N * V, &mx);
    printf("  %d positions x %lld logits: max diff %.3g (max |logit| %.3g)\n", N, (long long)V, d,
           mx);
    ASSERT(mx > 0);
    ASSERT_EQ(d, 0);
    free(a);
    free(b);
    model_free(&copy);
    model_free(&ref);
    unlink(path);
}

TEST(with_no_mmap_an_engine_serves_on_after_its_file_is_truncated)
{
    char path[512], err[256];
    ASSERT_OK(copy_fixture(path, sizeof path));
    int32_t toks[2][8];
    for (int run = 0; run < 2; run++) {
        struct engine_config c = engine_default_config();
        c.model_path = run ? path : FIXTURE;
        c.no_mmap = run;
        c.n_threads = 1;
        c.max_seqs = 1;
        c.window = 64;
        c.chunk = 64;
        c.max_step_tokens = 64;
        struct engine *e;
        ASSERT_OK(engine_start(&e, &c, wake_nothing, NULL, err, sizeof err));
        if (run)
            ASSERT_OK(truncate(path, 0));
        struct engine_request q;
        memset(&q, 0, sizeof q);
        q.id = 1;
        q.max_tokens = 8;
        q.sampling = engine_sampling_defaults();
        q.sampling.temperature = 0;
        q.prompt = strdup("hello world");
        q.prompt_len = 11;
        q.add_bos = 1;
        ASSERT_OK(engine_submit(e, &q));
        struct engine_event ev[16];
        int n_tok = 0, done = 0;
        for (int i = 0; i < 30000 && !done; i++) {
            size_t n = engine_drain(e, ev, 16);
            for (size_t k = 0; k < n; k++) {
                if (ev[k].kind == ENGINE_EV_TOKEN && ev[k].token >= 0 && n_tok < 8)
                    toks[run][n_tok++] = ev[k].token;
                done |= ev[k].kind != ENGINE_EV_TOKEN;
            }
            if (!n)
                usleep(1000);
        }
        engine_stop(e);
        ASSERT(done);
        ASSERT_EQ(n_tok, 8);
    }
    unlink(path);
    ASSERT(memcmp(toks[0], toks[1], sizeof toks[0]) == 0);
}

TEST_MAIN()
