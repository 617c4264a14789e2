/*
 * test_tokenizer_limit.c: tok_encode_max, the tokenizer with a limit on the
 * count (what the server tokenizes a prompt with: its prompt-token limit), on
 * the real SmolLM2 (byte-level BPE) and Gemma 3 (SentencePiece) files; each
 * part skips when its file is absent.
 *
 *  - Within the limit the count and the ids are tok_encode's, bit for bit:
 *    every case of the Hugging Face / sentencepiece fixtures, with and without
 *    BOS, a long text cut every 997 bytes, at limits just below, at and above
 *    the count, and every token's own text at its own count (where the lower
 *    bound is tight). Over the limit the answer is exactly max + 1.
 *  - tok_max_token_bytes: 81 for SmolLM2 ("\n" and 80 spaces), 93 for Gemma 3
 *    (31 spaces, an added token, as the 3-byte '▁' x 31 it is matched as).
 *  - One enormous word (16 MB of 'a', ' ', '1' or '\n', the shape of the
 *    reviewer's starvation attack) is refused at a limit of 8,192 without
 *    tokenizing it: in well under a second and without growing the peak RSS
 *    (unlimited, 7 MB of 'a' took 2 s and 240 MB in the server). So is the
 *    longest such word the byte bound lets through, by its merge.
 *  - Bytes with no token (SmolLM2 has none for 0x04; Hugging Face drops
 *    them) count for nothing: 16 MB of them is 0 tokens, not "too many".
 */
#include "support/tok_check.h"
#include "test.h"

#include "tokenizer.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#ifndef SS_FIXTURES_DIR
#define SS_FIXTURES_DIR "tests/fixtures"
#endif

#define LIMIT 8192      /* SmolLM2's context, the server's default limit */
#define BIG (16u << 20) /* bytes of one enormous word */

static struct tok_real smol;
static struct tok_real gemma;
#define SMOL_TOK(t) TOK_REAL(t, smol, test_model_path(), 0, "scripts/fetch-model.sh")
#define GEMMA_TOK(t)                                                                               \
    TOK_REAL(t, gemma, test_gemma_model_path(), 1, "scripts/fetch-model.sh gemma3-270m")

static struct tok_fixture fx_smol = {.path = SS_FIXTURES_DIR "/tokenizer_ids.txt"};
static struct tok_fixture fx_gemma = {.path = SS_FIXTURES_DIR "/tokenizer_ids_gemma3.txt"};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static long peak_rss_kib(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss;
}

/* 1 if tok_encode_max(max) gives tok_encode's n ids want when n <= max, and
 * max + 1 otherwise; says what differs if not. */
static int agrees(const struct tokenizer *t, const char *s, size_t len, int bos, int special,
                  const int32_t *want, int64_t n, int64_t max)
{
    int32_t *got = malloc(((size_t)n + 1) * sizeof *got);
    int64_t m = got ? tok_encode_max(t, s, len, bos, special, max, got, n + 1) : -1;
    int ok = n <= max ? m == n && memcmp(got, want, (size_t)n * sizeof *got) == 0 : m == max + 1;

    if (!ok) {
        fprintf(stderr, "  %zu bytes, bos %d, special %d: %lld tokens, limit %lld: got %lld (%s)\n",
                len, bos, special, (long long)n, (long long)max, (long long)m,
                m == n ? "other ids" : "other count");
        tok_check_print_text(s, len);
    }
    free(got);
    return ok;
}

/* agrees() at limits 0, n - 1, n, n + 1 and 2n + 5. Returns the failures. */
static int agrees_around(const struct tokenizer *t, const char *s, size_t len, int bos, int special)
{
    int64_t n;
    int32_t *want = tok_check_encode(t, s, len, bos, special, &n);
    const int64_t limits[] = {0, n - 1, n, n + 1, 2 * n + 5};
    int bad = 0;

    if (!want)
        return 1;
    for (size_t k = 0; k < sizeof limits / sizeof limits[0]; k++)
        if (limits[k] >= 0)
            bad += !agrees(t, s, len, bos, special, want, n, limits[k]);
    free(want);
    return bad;
}

static int fixture_agrees(const struct tokenizer *t, struct tok_fixture *f)
{
    int bad = 0;

    if (tok_fixture_load(f) <= 0)
        return 1;
    for (int i = 0; i < f->n && bad < 5; i++)
        for (int bos = 0; bos <= 1; bos++)
            bad += agrees_around(t, f->c[i].text, f->c[i].len, bos, f->c[i].special);
    return bad;
}

/* The fixtures' corpus eight times over, cut every 997 bytes (through words,
 * added tokens and UTF-8 sequences), with and without special tokens. */
static int long_text_agrees(const struct tokenizer *t)
{
    size_t corpus_len = 0;
    char *corpus = tok_check_read_file(SS_FIXTURES_DIR "/tokenizer_corpus.txt", &corpus_len);
    char *text = corpus ? malloc(8 * corpus_len) : NULL;
    int bad = 0;

    if (!text) {
        free(corpus);
        return 1;
    }
    for (int k = 0; k < 8; k++)
        memcpy(text + k * corpus_len, corpus, corpus_len);
    for (size_t len = 1; len <= 8 * corpus_len && bad < 5; len += 997)
        bad += agrees_around(t, text, len, 0, (int)(len / 997) & 1);
    free(text);
    free(corpus);
    return bad;
}

/* Each token's own text (with special tokens parsed), at limits n - 1 and n:
 * the longest tokens make the lower bound tight, so a max_token_bytes one
 * byte short would refuse them. */
static int every_token_agrees(const struct tokenizer *t)
{
    int bad = 0;

    for (int32_t id = 0; id < tok_n_vocab(t) && bad < 5; id++) {
        size_t len;
        const char *p = tok_piece(t, id, &len);
        int64_t n;
        int32_t *want = p ? tok_check_encode(t, p, len, 0, 1, &n) : NULL;
        if (!want)
            return 1;
        bad += !agrees(t, p, len, 0, 1, want, n, n);
        bad += n > 0 && !agrees(t, p, len, 0, 1, want, n, n - 1);
        free(want);
    }
    return bad;
}

/* BIG bytes of c at a limit of LIMIT: *n the count, *secs the time, *kib the
 * growth of the peak RSS. Returns 0, or -1 without memory. */
static int one_big_word(const struct tokenizer *t, char c, int64_t *n, double *secs, long *kib)
{
    char *text = malloc(BIG);
    int32_t *ids = malloc((LIMIT + 1) * sizeof *ids);

    if (!text || !ids) {
        free(text);
        free(ids);
        return -1;
    }
    memset(text, c, BIG);
    long rss0 = peak_rss_kib();
    double t0 = now_s();
    *n = tok_encode_max(t, text, BIG, 0, 1, LIMIT, ids, LIMIT + 1);
    *secs = now_s() - t0;
    *kib = peak_rss_kib() - rss0;
    free(text);
    free(ids);
    return 0;
}

static int big_words_refused(const struct tokenizer *t)
{
    static const char fills[] = {'a', ' ', '1', '\n'};
    int bad = 0;

    for (size_t k = 0; k < sizeof fills; k++) {
        int64_t n;
        double secs;
        long kib;
        if (one_big_word(t, fills[k], &n, &secs, &kib) < 0)
            return 1;
        printf("  16 MB of 0x%02x at a limit of %d: %lld in %.3f s, peak RSS +%ld KiB\n", fills[k],
               LIMIT, (long long)n, secs, kib);
        if (n != LIMIT + 1 || secs > 1.0 || kib > 16 * 1024) {
            fprintf(stderr, "  0x%02x: want %d fast and small\n", fills[k], LIMIT + 1);
            bad++;
        }
    }
    return bad;
}

/* Within the limit tok_encode_max is tok_encode: on f's cases, on the long
 * text and on every token's own text. */
static void within_the_limit_is_tok_encode(const struct tokenizer *t, struct tok_fixture *f,
                                           int *failed)
{
    ASSERT_EQ(fixture_agrees(t, f), 0);
    ASSERT_EQ(long_text_agrees(t), 0);
    ASSERT_EQ(every_token_agrees(t), 0);
}

/* ---- SmolLM2: byte-level BPE ---------------------------------------------- */

TEST(smollm2_one_huge_word_is_refused_without_tokenizing_it)
{
    SMOL_TOK(t);
    ASSERT_EQ(big_words_refused(t), 0);
}

TEST(smollm2_longest_token_is_81_bytes)
{
    SMOL_TOK(t);
    ASSERT_EQ(tok_max_token_bytes(t), 81);
}

TEST(smollm2_within_the_limit_is_tok_encode_bit_for_bit)
{
    SMOL_TOK(t);
    within_the_limit_is_tok_encode(t, &fx_smol, failed);
}

TEST(smollm2_the_longest_word_the_byte_bound_passes_is_refused_by_its_merge)
{
    SMOL_TOK(t);
    size_t at = (size_t)LIMIT * tok_max_token_bytes(t); /* ceil(at / 81) == LIMIT */
    char *text = malloc(at + 1);
    int32_t *ids = malloc((LIMIT + 1) * sizeof *ids);
    ASSERT(text && ids);
    memset(text, 'a', at + 1);
    ASSERT_EQ(tok_encode_max(t, text, at, 0, 0, LIMIT, ids, LIMIT + 1), LIMIT + 1);
    ASSERT_EQ(tok_encode_max(t, text, at + 1, 0, 0, LIMIT, ids, LIMIT + 1), LIMIT + 1);
    /* and a word of 'a' that fits: 81 bytes of it are 10 or fewer tokens */
    int64_t n = tok_encode(t, text, 8100, 0, 0, NULL, 0);
    ASSERT(n > 0 && n <= LIMIT);
    ASSERT_EQ(tok_encode_max(t, text, 8100, 0, 0, n, ids, LIMIT + 1), n);
    ASSERT_EQ(tok_encode_max(t, text, 8100, 0, 0, n - 1, ids, LIMIT + 1), n);
    free(text);
    free(ids);
}

TEST(smollm2_bytes_without_a_token_count_for_nothing)
{
    SMOL_TOK(t);
    char *text = malloc(BIG);
    int32_t ids[2];
    ASSERT(text);
    memset(text, 0x04, BIG);
    ASSERT_EQ(tok_encode(t, text, 4096, 0, 0, NULL, 0), 0); /* dropped, as HF does */
    ASSERT_EQ(tok_encode_max(t, text, BIG, 0, 0, LIMIT, ids, 2), 0);
    ASSERT_EQ(tok_encode_max(t, text, BIG, 0, 0, 0, ids, 2), 0);
    text[BIG / 2] = 'x';
    ASSERT_EQ(tok_encode_max(t, text, BIG, 0, 0, 1, ids, 2), 1);
    ASSERT_EQ(tok_encode_max(t, text, BIG, 0, 0, 0, ids, 2), 1); /* 0 + 1: more */
    free(text);
}

TEST(smollm2_bos_counts_and_the_limit_may_be_zero)
{
    SMOL_TOK(t);
    int32_t ids[4];
    ASSERT_EQ(tok_encode_max(t, "", 0, 1, 0, 0, ids, 4), 1); /* BOS alone is over 0 */
    ASSERT_EQ(tok_encode_max(t, "", 0, 1, 0, 1, ids, 4), 1);
    ASSERT_EQ(ids[0], tok_bos(t));
    ASSERT_EQ(tok_encode_max(t, "", 0, 0, 0, 0, ids, 4), 0);
    ASSERT_EQ(tok_encode_max(t, "Hi", 2, 0, 0, -1, ids, 4), -EINVAL);
}

/* ---- Gemma 3: SentencePiece ---------------------------------------------- */

TEST(gemma3_one_huge_word_is_refused_without_tokenizing_it)
{
    GEMMA_TOK(t);
    ASSERT_EQ(big_words_refused(t), 0);
}

TEST(gemma3_longest_token_is_93_normalized_bytes)
{
    GEMMA_TOK(t);
    ASSERT_EQ(tok_max_token_bytes(t), 93);
}

TEST(gemma3_within_the_limit_is_tok_encode_bit_for_bit)
{
    GEMMA_TOK(t);
    within_the_limit_is_tok_encode(t, &fx_gemma, failed);
}

TEST_MAIN()
