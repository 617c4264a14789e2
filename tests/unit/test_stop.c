/*
 * test_stop.c: the stop-string filter (engine/stop.h) against a brute-force
 * oracle. For a text T cut into pieces, everything the filter emits must be
 * T cut at the earliest occurrence of any stop string (all of T when none
 * occurs), and it must report a match exactly when T has one. Texts are
 * random UTF-8 over a small alphabet (so partial matches are everywhere),
 * stop strings are 1..ENGINE_MAX_STOP_LEN bytes (254, 255 and 256 often),
 * taken from the text, random, periodic ("aaaa", "abab") or prefixes of one
 * another, and pieces run from 1 byte to longer than the filter's buffer.
 * Along the way: every emitted chunk is whole UTF-8 characters, the filter
 * never holds more than it must (the longest tail of the text that may
 * still begin a stop string, plus an incomplete character), and never more
 * than STOP_HOLD_MAX bytes. Filters live on the heap with buf last, so ASan
 * sees a write past the buffer.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/stop.h"
#include "support/rng.h"
#include "test.h"

#define TEXT_MAX 4096

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint64_t rnd(void)
{
    return test_rng_u64(&rng_state);
}

static size_t rnd_below(size_t n)
{
    return (size_t)test_rng_below(&rng_state, n);
}

/* ---- the oracle ----------------------------------------------------------- */

/* Earliest start of any stop string in t[0..n), or SIZE_MAX. */
static size_t oracle_first(const char *t, size_t n, char stops[][ENGINE_MAX_STOP_LEN + 1],
                           int n_stop)
{
    for (size_t p = 0; p < n; p++)
        for (int i = 0; i < n_stop; i++) {
            size_t sl = strlen(stops[i]);
            if (sl > 0 && p + sl <= n && memcmp(t + p, stops[i], sl) == 0)
                return p;
        }
    return SIZE_MAX;
}

/* Smallest end of an occurrence of any stop string in t[0..n), or SIZE_MAX:
 * before it, no stop string is complete. */
static size_t oracle_first_end(const char *t, size_t n, char stops[][ENGINE_MAX_STOP_LEN + 1],
                               int n_stop)
{
    size_t best = SIZE_MAX;
    for (size_t p = 0; p < n; p++)
        for (int i = 0; i < n_stop; i++) {
            size_t sl = strlen(stops[i]);
            if (p + sl <= n && p + sl < best && memcmp(t + p, stops[i], sl) == 0)
                best = p + sl;
        }
    return best;
}

/* Length of the longest tail of t[0..n) that is a proper prefix of a stop. */
static size_t oracle_partial(const char *t, size_t n, char stops[][ENGINE_MAX_STOP_LEN + 1],
                             int n_stop)
{
    size_t best = 0;
    for (int i = 0; i < n_stop; i++) {
        size_t sl = strlen(stops[i]);
        for (size_t k = 1; k < sl && k <= n; k++)
            if (memcmp(t + n - k, stops[i], k) == 0 && k > best)
                best = k;
    }
    return best;
}

/* 1 if s[0..n) is whole, valid UTF-8. */
static int utf8_whole(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        size_t l = u[i] < 0x80 ? 1 : u[i] >= 0xF0 ? 4 : u[i] >= 0xE0 ? 3 : u[i] >= 0xC2 ? 2 : 0;
        if (l == 0 || i + l > n)
            return 0;
        for (size_t k = 1; k < l; k++)
            if ((u[i + k] & 0xC0) != 0x80)
                return 0;
        i += l;
    }
    return 1;
}

/* ---- generators ----------------------------------------------------------- */

static const char *const alphabet[] = {"a",
                                       "a",
                                       "a",
                                       "b",
                                       "b",
                                       " ",
                                       "\xc3\xa9" /* é */,
                                       "\xe5\xad\x97" /* 字 */,
                                       "\xf0\x9f\x98\x80" /* 😀 */};
#define N_ALPHA (sizeof alphabet / sizeof alphabet[0])

/* Appends random characters to s until it has about n bytes (never more than
 * cap - 1); returns the new length. ascii: only 'a' and 'b'. */
static size_t random_chars(char *s, size_t len, size_t n, size_t cap, int ascii)
{
    while (len < n) {
        const char *c = ascii ? (rnd() & 1 ? "a" : "b") : alphabet[rnd_below(N_ALPHA)];
        size_t cl = strlen(c);
        if (len + cl > n || len + cl >= cap)
            break;
        memcpy(s + len, c, cl);
        len += cl;
    }
    s[len] = 0;
    return len;
}

static size_t stop_length(void)
{
    static const size_t edge[] = {1, 2, 3, 254, 255, 256, 256, 255, 254, 128, 200};
    if (rnd() & 1)
        return edge[rnd_below(sizeof edge / sizeof edge[0])];
    return 1 + rnd_below(ENGINE_MAX_STOP_LEN);
}

/* Some stop string of at most ENGINE_MAX_STOP_LEN bytes into out, perhaps
 * taken from text t[0..n) or from an earlier stop. */
static void make_stop(char *out, const char *t, size_t n, char stops[][ENGINE_MAX_STOP_LEN + 1],
                      int have)
{
    size_t l = stop_length();
    size_t kind = rnd_below(5);
    out[0] = 0;
    if (kind == 0 && n > 0) { /* a piece of the text, at character boundaries */
        size_t p = rnd_below(n);
        while (p > 0 && ((unsigned char)t[p] & 0xC0) == 0x80)
            p--;
        size_t e = p + l < n ? p + l : n;
        while (e > p && e < n && ((unsigned char)t[e] & 0xC0) == 0x80)
            e--;
        memcpy(out, t + p, e - p);
        out[e - p] = 0;
    } else if (kind == 1) { /* periodic: aaaa.., abab.., aab aab.. */
        static const char *const unit[] = {"a", "ab", "aab", "aba", "b "};
        const char *u = unit[rnd_below(5)];
        size_t ul = strlen(u);
        for (size_t i = 0; i < l; i++)
            out[i] = u[i % ul];
        out[l] = 0;
    } else if (kind == 2 && have > 0) { /* a prefix or an inner piece of an earlier stop */
        const char *o = stops[rnd_below((size_t)have)];
        size_t ol = strlen(o);
        size_t p = rnd() & 1 ? 0 : rnd_below(ol);
        while (p > 0 && ((unsigned char)o[p] & 0xC0) == 0x80)
            p--;
        size_t e = p + 1 + rnd_below(ol - p);
        while (e < ol && ((unsigned char)o[e] & 0xC0) == 0x80)
            e++;
        memcpy(out, o + p, e - p);
        out[e - p] = 0;
    } else {
        random_chars(out, 0, l, ENGINE_MAX_STOP_LEN + 1, kind == 3);
    }
    if (!out[0]) {
        out[0] = 'a';
        out[1] = 0;
    }
}

/* ---- the driver ----------------------------------------------------------- */

struct run {
    char out[TEXT_MAX + STOP_HOLD_MAX];
    size_t n_out;
    int matched;
    int whole;   /* every emitted chunk was whole UTF-8 */
    int held_ok; /* never held more than needed, nor more than STOP_HOLD_MAX */
    size_t fed;  /* bytes pushed before the match */
    char err[200];
};

/* Feeds t[0..n) cut at cuts[0..n_cut) (increasing, inside (0, n)). check:
 * also check after each piece that no more is held than must be (slow). */
static void run_filter(struct run *r, const char *t, size_t n, const size_t *cuts, size_t n_cut,
                       char stops[][ENGINE_MAX_STOP_LEN + 1], int n_stop, int check)
{
    size_t first_end = check ? oracle_first_end(t, n, stops, n_stop) : 0;
    struct stop_filter *f = malloc(sizeof *f);
    const char *ptrs[ENGINE_MAX_STOP];
    char *chunk = malloc(n + STOP_HOLD_MAX + 1);
    memset(r, 0, sizeof *r);
    r->whole = r->held_ok = 1;
    for (int i = 0; i < n_stop; i++)
        ptrs[i] = stops[i];
    if (!f || !chunk || stop_filter_init(f, ptrs, n_stop) != 0) {
        snprintf(r->err, sizeof r->err, "init failed");
        free(f);
        free(chunk);
        return;
    }
    size_t start = 0;
    for (size_t c = 0; c <= n_cut && !r->matched; c++) {
        size_t end = c < n_cut ? cuts[c] : n;
        size_t got = 0;
        int rc =
            stop_filter_push(f, t + start, end - start, chunk, end - start + STOP_HOLD_MAX, &got);
        if (rc < 0) {
            snprintf(r->err, sizeof r->err, "push returned %d", rc);
            break;
        }
        memcpy(r->out + r->n_out, chunk, got);
        r->n_out += got;
        r->fed = end;
        if (!utf8_whole(chunk, got))
            r->whole = 0;
        r->matched = rc == 1;
        if (!r->matched) {
            size_t held = end - r->n_out;
            if (held != f->n || held > STOP_HOLD_MAX)
                r->held_ok = 0;
            /* no stop string complete yet: only a possible start (plus an
             * incomplete character) may be held */
            if (check && end < first_end && held > oracle_partial(t, end, stops, n_stop) + 3)
                r->held_ok = 0;
        }
        start = end;
    }
    if (!r->matched && !r->err[0]) {
        size_t got = 0;
        int rc = stop_filter_flush(f, chunk, STOP_HOLD_MAX, &got);
        if (rc < 0)
            snprintf(r->err, sizeof r->err, "flush returned %d", rc);
        memcpy(r->out + r->n_out, chunk, got);
        r->n_out += got;
        if (!utf8_whole(chunk, got))
            r->whole = 0;
        r->matched = rc == 1;
    }
    free(chunk);
    free(f);
}

/* Random cut points: mostly token-sized pieces, sometimes long ones. */
static size_t random_cuts(size_t *cuts, const char *t, size_t n, int at_chars)
{
    size_t k = 0, p = 0;
    int mode = (int)rnd_below(4);
    for (;;) {
        size_t step;
        if (mode == 0)
            step = 1 + rnd_below(4);
        else if (mode == 1)
            step = 1 + rnd_below(16);
        else if (mode == 2)
            step = 1 + rnd_below(700); /* longer than the filter's buffer */
        else
            step = rnd() % 8 ? 1 + rnd_below(8) : 200 + rnd_below(1500);
        p += step;
        if (at_chars)
            while (p < n && ((unsigned char)t[p] & 0xC0) == 0x80)
                p++;
        if (p >= n)
            break;
        cuts[k++] = p;
    }
    return k;
}

static void show(const char *what, const char *s, size_t n)
{
    fprintf(stderr, "    %s (%zu bytes): \"", what, n);
    for (size_t i = 0; i < n && i < 300; i++)
        fputc(s[i] >= 32 && s[i] < 127 ? s[i] : '.', stderr);
    fputs(n > 300 ? "...\"\n" : "\"\n", stderr);
}

/* ---- tests ------------------------------------------------------------------ */

TEST(stop_filter_matches_the_oracle_on_random_utf8_texts_and_pieces)
{
    static char t[TEXT_MAX];
    static size_t cuts[TEXT_MAX];
    static struct run r;
    char stops[ENGINE_MAX_STOP][ENGINE_MAX_STOP_LEN + 1];
    int n_match = 0, n_long = 0;
    for (int trial = 0; trial < 4000; trial++) {
        size_t n = random_chars(t, 0, rnd_below(2500), TEXT_MAX, rnd() % 4 == 0);
        int n_stop = 1 + (int)rnd_below(ENGINE_MAX_STOP);
        for (int i = 0; i < n_stop; i++)
            make_stop(stops[i], t, n, stops, i);
        if (rnd() & 1) { /* plant a stop string (or most of one) in the text */
            const char *s = stops[rnd_below((size_t)n_stop)];
            size_t sl = strlen(s), keep = rnd() % 3 ? sl : sl / 2;
            size_t p = rnd_below(n + 1);
            while (p < n && ((unsigned char)t[p] & 0xC0) == 0x80)
                p++;
            while (keep > 0 && keep < sl && ((unsigned char)s[keep] & 0xC0) == 0x80)
                keep--; /* whole characters */
            if (n + keep < TEXT_MAX - 1) {
                memmove(t + p + keep, t + p, n - p);
                memcpy(t + p, s, keep);
                n += keep;
                t[n] = 0;
            }
        }
        ASSERT(utf8_whole(t, n));
        int at_chars = rnd() % 4 != 0;
        size_t n_cut = random_cuts(cuts, t, n, at_chars);
        run_filter(&r, t, n, cuts, n_cut, stops, n_stop, trial % 8 == 0);

        size_t p = oracle_first(t, n, stops, n_stop);
        size_t want = p == SIZE_MAX ? n : p;
        /* whole characters even when the cuts are not (the filter holds an
         * incomplete one back) */
        int ok = !r.err[0] && r.matched == (p != SIZE_MAX) && r.n_out == want &&
                 memcmp(r.out, t, want) == 0 && r.held_ok && r.whole;
        if (!ok) {
            fprintf(stderr, "  trial %d: %d stops, %zu pieces%s, err '%s'\n", trial, n_stop,
                    n_cut + 1, at_chars ? "" : " (cut inside characters)", r.err);
            fprintf(stderr, "    matched %d (want %d), whole %d, held_ok %d\n", r.matched,
                    p != SIZE_MAX, r.whole, r.held_ok);
            for (int i = 0; i < n_stop; i++)
                show("stop", stops[i], strlen(stops[i]));
            show("text", t, n);
            show("want", t, want);
            show("got ", r.out, r.n_out);
        }
        ASSERT(ok);
        int has_long = 0;
        for (int i = 0; i < n_stop; i++)
            has_long |= strlen(stops[i]) >= 254;
        n_match += p != SIZE_MAX;
        n_long += has_long && p != SIZE_MAX;
    }
    printf("  4000 texts: %d with a stop string, %d of them with stops of 254+ bytes\n", n_match,
           n_long);
    ASSERT(n_match > 1000);
    ASSERT(n_long > 100);
}

TEST(stop_strings_of_254_to_256_bytes_match_in_token_sized_pieces)
{
    static struct run r;
    static size_t cuts[2048];
    for (size_t l = 250; l <= ENGINE_MAX_STOP_LEN; l++) {
        char stops[1][ENGINE_MAX_STOP_LEN + 1];
        char t[1024];
        for (size_t i = 0; i < l; i++) /* not periodic: each prefix occurs once */
            stops[0][i] = (char)('a' + (i * 7 + i / 26) % 26);
        stops[0][l] = 0;
        size_t n = (size_t)snprintf(t, sizeof t, "Hello, world. %s and the rest", stops[0]);
        for (size_t step = 1; step <= 5; step++) {
            size_t k = 0;
            for (size_t p = step; p < n; p += step)
                cuts[k++] = p;
            run_filter(&r, t, n, cuts, k, stops, 1, 1);
            ASSERT(!r.err[0]);
            ASSERT_EQ(r.matched, 1);
            ASSERT_EQ(r.n_out, oracle_first(t, n, stops, 1));
            ASSERT_EQ(r.n_out, 14); /* "Hello, world. " */
            ASSERT(memcmp(r.out, t, r.n_out) == 0);
            ASSERT(r.held_ok);
        }
        run_filter(&r, t, n, cuts, 0, stops, 1, 1); /* one piece */
        ASSERT_EQ(r.matched, 1);
        ASSERT_EQ(r.n_out, 14);
    }
}

TEST(stop_filter_waits_for_a_longer_stop_that_starts_earlier)
{
    static struct run r;
    char stops[2][ENGINE_MAX_STOP_LEN + 1] = {"bc", "abcd"};
    size_t cut = 4;
    run_filter(&r, "xabcd", 5, &cut, 1, stops, 2, 1); /* "xabc" | "d" */
    ASSERT_EQ(r.matched, 1);
    ASSERT_EQ(r.n_out, 1);
    ASSERT_EQ(r.fed, 5);
    run_filter(&r, "xabce", 5, &cut, 1, stops, 2, 1); /* "bc" wins once "abcd" cannot */
    ASSERT_EQ(r.matched, 1);
    ASSERT_EQ(r.n_out, 2);
    ASSERT(memcmp(r.out, "xa", 2) == 0);
    run_filter(&r, "xabc", 4, NULL, 0, stops, 2, 1); /* the text ends: "bc" */
    ASSERT_EQ(r.matched, 1);
    ASSERT_EQ(r.n_out, 2);
}

TEST(stop_filter_refuses_too_many_or_too_long_stop_strings)
{
    static struct stop_filter filter;
    struct stop_filter *f = &filter;
    char long_stop[ENGINE_MAX_STOP_LEN + 2];
    memset(long_stop, 'x', sizeof long_stop - 1);
    long_stop[sizeof long_stop - 1] = 0;
    const char *one[1] = {long_stop};
    ASSERT_EQ(stop_filter_init(f, one, 1), -EINVAL);
    long_stop[ENGINE_MAX_STOP_LEN] = 0; /* exactly the limit */
    ASSERT_EQ(stop_filter_init(f, one, 1), 0);
    const char *many[ENGINE_MAX_STOP + 1] = {"a", "b", "c", "d", "e"};
    ASSERT_EQ(stop_filter_init(f, many, ENGINE_MAX_STOP + 1), -EINVAL);
    const char *with_empty[3] = {"", "b", NULL};
    ASSERT_EQ(stop_filter_init(f, with_empty, 3), 0);
    char out[64];
    size_t n = 0;
    ASSERT_EQ(stop_filter_push(f, "aab", 3, out, sizeof out, &n), 1); /* "" never matches */
    ASSERT_EQ(n, 2);
    ASSERT_EQ(stop_filter_init(f, NULL, 0), 0); /* no stops: straight through */
    ASSERT_EQ(stop_filter_push(f, "abc", 3, out, sizeof out, &n), 0);
    ASSERT_EQ(n, 3);
    ASSERT_EQ(stop_filter_push(f, "abc", 3, out, 2, &n), -ENOSPC);
}

TEST_MAIN()
