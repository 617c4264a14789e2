/*
 * test.h: a tiny test harness. TEST(name) defines a test; main() comes from
 * TEST_MAIN() and runs every test, printing "N passed, N failed" last.
 * ASSERT_* print the expression and both values, then fail the current test.
 * TEST_SKIP(why) skips the current test only (it counts neither as passed
 * nor as failed); SKIP(why) exits the whole binary with 77 (ctest's
 * SKIP_RETURN_CODE), which is also the exit code when every test skipped.
 * TEST_NEED_MODEL() skips a test when the default model file is absent; a
 * file that is present must then load, or the test fails.
 */
#ifndef SS_TEST_H
#define SS_TEST_H

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void (*test_fn)(int *failed);
struct test_case {
    const char *name;
    test_fn fn;
};
#define TEST_MAX 256
static struct test_case test_cases[TEST_MAX];
static int test_count;

#define TEST(name)                                                                                 \
    static void test_##name(int *failed);                                                          \
    __attribute__((constructor)) static void register_##name(void)                                 \
    {                                                                                              \
        if (test_count < TEST_MAX)                                                                 \
            test_cases[test_count++] = (struct test_case){#name, test_##name};                     \
    }                                                                                              \
    static void test_##name(int *failed)

#define FAIL_AT(fmt, ...)                                                                          \
    do {                                                                                           \
        fprintf(stderr, "  %s:%d: " fmt "\n", __FILE__, __LINE__, __VA_ARGS__);                    \
        *failed = 1;                                                                               \
        return;                                                                                    \
    } while (0)

#define ASSERT(c)                                                                                  \
    do {                                                                                           \
        if (!(c))                                                                                  \
            FAIL_AT("ASSERT(%s)", #c);                                                             \
    } while (0)
#define ASSERT_EQ(a, b)                                                                            \
    do {                                                                                           \
        long long a_ = (long long)(a), b_ = (long long)(b);                                        \
        if (a_ != b_)                                                                              \
            FAIL_AT("ASSERT_EQ(%s, %s): %lld != %lld", #a, #b, a_, b_);                            \
    } while (0)
#define ASSERT_NEAR(a, b, tol)                                                                     \
    do {                                                                                           \
        double a_ = (double)(a), b_ = (double)(b);                                                 \
        if (!(fabs(a_ - b_) <= (tol)))                                                             \
            FAIL_AT("ASSERT_NEAR(%s, %s, %s): %.9g vs %.9g (diff %.3g)", #a, #b, #tol, a_, b_,     \
                    fabs(a_ - b_));                                                                \
    } while (0)
#define ASSERT_OK(e)                                                                               \
    do {                                                                                           \
        long long r_ = (long long)(e);                                                             \
        if (r_ < 0)                                                                                \
            FAIL_AT("ASSERT_OK(%s): returned %lld", #e, r_);                                       \
    } while (0)
#define ASSERT_STREQ(a, b)                                                                         \
    do {                                                                                           \
        const char *a_ = (a), *b_ = (b);                                                           \
        if (strcmp(a_, b_) != 0)                                                                   \
            FAIL_AT("ASSERT_STREQ(%s, %s): \"%s\" != \"%s\"", #a, #b, a_, b_);                     \
    } while (0)
#define TEST_SKIPPED 2 /* *failed value of a skipped test */
#define TEST_SKIP(why)                                                                             \
    do {                                                                                           \
        printf("  skip: %s\n", why);                                                               \
        *failed = TEST_SKIPPED;                                                                    \
        return;                                                                                    \
    } while (0)
#define SKIP(why)                                                                                  \
    do {                                                                                           \
        printf("SKIP: %s\n", why);                                                                 \
        exit(77);                                                                                  \
    } while (0)

#define TEST_MAIN()                                                                                \
    int main(void)                                                                                 \
    {                                                                                              \
        int passed = 0, nfailed = 0, skipped = 0;                                                  \
        for (int i = 0; i < test_count; i++) {                                                     \
            int f = 0;                                                                             \
            test_cases[i].fn(&f);                                                                  \
            printf("%s %s\n",                                                                      \
                   f == TEST_SKIPPED ? "skip"                                                      \
                   : f               ? "FAIL"                                                      \
                                     : "ok  ",                                                                   \
                   test_cases[i].name);                                                            \
            fflush(stdout);                                                                        \
            if (f == TEST_SKIPPED)                                                                 \
                skipped++;                                                                         \
            else if (f)                                                                            \
                nfailed++;                                                                         \
            else                                                                                   \
                passed++;                                                                          \
        }                                                                                          \
        printf("%d passed, %d skipped, %d failed\n", passed, skipped, nfailed);                    \
        return nfailed ? 1 : passed == 0 && skipped > 0 ? 77 : 0;                                  \
    }

/* Path of the default model (env STREAMSINK_MODEL, else the cache path of
 * scripts/fetch-model.sh). */
static inline const char *test_model_path(void)
{
    const char *p = getenv("STREAMSINK_MODEL");
    if (p && *p)
        return p;
    static char buf[4096];
    const char *home = getenv("XDG_CACHE_HOME");
    if (home && *home)
        snprintf(buf, sizeof buf, "%s/streamsink/SmolLM2-135M-Instruct.Q4_1.gguf", home);
    else
        snprintf(buf, sizeof buf, "%s/.cache/streamsink/SmolLM2-135M-Instruct.Q4_1.gguf",
                 getenv("HOME") ? getenv("HOME") : "/tmp");
    return buf;
}

/* Path of the Gemma 3 270M file (env STREAMSINK_GEMMA_MODEL, else the cache
 * path of `scripts/fetch-model.sh gemma3-270m`). */
static inline const char *test_gemma_model_path(void)
{
    const char *p = getenv("STREAMSINK_GEMMA_MODEL");
    if (p && *p)
        return p;
    static char buf[4096];
    const char *home = getenv("XDG_CACHE_HOME");
    if (home && *home)
        snprintf(buf, sizeof buf, "%s/streamsink/gemma-3-270m-q4_k_m.gguf", home);
    else
        snprintf(buf, sizeof buf, "%s/.cache/streamsink/gemma-3-270m-q4_k_m.gguf",
                 getenv("HOME") ? getenv("HOME") : "/tmp");
    return buf;
}

/* Skips the current test when the Gemma model file is absent; a file that is
 * present must then load, or the test fails. */
#define TEST_NEED_GEMMA_MODEL()                                                                    \
    do {                                                                                           \
        FILE *f_ = fopen(test_gemma_model_path(), "rb");                                           \
        if (!f_)                                                                                   \
            TEST_SKIP("no Gemma model file (run scripts/fetch-model.sh gemma3-270m)");             \
        fclose(f_);                                                                                \
    } while (0)

/* Skips the current test when the default model file is absent. */
#define TEST_NEED_MODEL()                                                                          \
    do {                                                                                           \
        FILE *f_ = fopen(test_model_path(), "rb");                                                 \
        if (!f_)                                                                                   \
            TEST_SKIP("no model file (run scripts/fetch-model.sh)");                               \
        fclose(f_);                                                                                \
    } while (0)

#endif
