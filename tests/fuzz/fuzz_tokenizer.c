/*
 * fuzz_tokenizer.c: libFuzzer target for engine/tokenizer.h: tok_encode on
 * arbitrary bytes, then decoding the ids back, piece by piece and streamed.
 *
 * Two vocabularies are loaded once. Byte-level BPE: the real model
 * ($STREAMSINK_MODEL, else
 * ${XDG_CACHE_HOME:-~/.cache}/streamsink/SmolLM2-135M-Instruct.Q4_1.gguf, where
 * scripts/fetch-model.sh leaves it), or tests/fixtures/norm_softmax.gguf (a
 * small byte-level vocabulary) when the model is absent. SentencePiece:
 * Gemma 3 ($STREAMSINK_GEMMA_MODEL, else gemma-3-270m-q4_k_m.gguf in the same
 * folder), or a small vocabulary written in memory here. Each input is the
 * text, encoded with each vocabulary twice: without special-token parsing
 * and without BOS, and with both. Checked:
 *   - there are no more tokens than bytes (+ BOS); the count is the same
 *     with no output buffer, and a small buffer gets the same first ids;
 *   - every id is in [0, n_vocab); BOS comes first when asked for;
 *   - decoding the ids gives the text back, byte for byte, except bytes that
 *     have no token in the vocabulary (SmolLM2 lacks 21 control bytes), which
 *     are dropped as Hugging Face drops them. With SentencePiece every byte
 *     has a token (byte fallback) and a literal U+2581 comes back as ' '.
 *     tokenizer_impl.h documents the round trip for invalid UTF-8 as well
 *     (each invalid byte becomes its byte's token), and test_tokenizer
 *     checks it on the Hugging Face fixture;
 *   - the streaming detokenizer emits only valid UTF-8, and exactly the
 *     decoded text when that is valid UTF-8;
 *   - tok_encode_max at limits at and under the count: the count and ids
 *     within the limit, limit + 1 past it.
 *
 * Build and run (clang only): as fuzz_http_conn.c says, with
 *   STREAMSINK_MODEL=/path/to/model.gguf \
 *   build-fuzz/tests/fuzz/fuzz_tokenizer <corpus dir> -max_total_time=60
 */
#include "gguf.h"
#include "tokenizer.h"
#include "../support/model_file.h"
#include "../support/utf8_check.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef SS_FIXTURES_DIR
#define SS_FIXTURES_DIR "tests/fixtures"
#endif

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define SMALL_CAP 3

struct vocab {
    struct tokenizer *t;
    int64_t n_vocab;
    int has_token[256]; /* a lone byte b encodes to at least one token */
    size_t max_piece;
    int spm;          /* SentencePiece: ' ' and a literal U+2581 both decode as ' ' */
    int space_prefix; /* SentencePiece add_space_prefix: decoding starts with a ' ' */
};

static struct vocab vocabs[2]; /* byte-level BPE, SentencePiece */
static int n_vocabs;
static struct vocab *T; /* the one being checked */

static void fail(const char *what, const uint8_t *text, size_t len)
{
    fprintf(stderr, "fuzz_tokenizer: %s (text of %zu bytes:", what, len);
    for (size_t i = 0; i < len && i < 64; i++)
        fprintf(stderr, " %02x", text[i]);
    fprintf(stderr, "%s)\n", len > 64 ? " ..." : "");
    abort();
}

static int load_bytes(const char *what, uint8_t *buf, size_t len)
{
    char err[256];
    struct gguf_file g;
    /* the tokenizer reads metadata only: a tensor count of 0 keeps it
     * independent of the tensor types this build can load */
    if (len >= 24)
        memset(buf + 8, 0, 8);
    int rc = gguf_parse(&g, buf, len, err, sizeof err);
    if (rc == 0) {
        rc = tok_load(&T->t, &g, err, sizeof err);
        gguf_free(&g); /* the tokenizer keeps its own copy */
    }
    if (rc < 0) {
        fprintf(stderr, "fuzz_tokenizer: %s: %s\n", what, err);
        return -1;
    }
    fprintf(stderr, "fuzz_tokenizer: vocabulary of %lld tokens from %s\n",
            (long long)tok_n_vocab(T->t), what);
    return 0;
}

static int load(const char *path)
{
    struct stat st;
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return -1;
    if (fstat(fd, &st) < 0) {
        close(fd);
        return -1;
    }
    void *map = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED)
        return -1;
    int rc = load_bytes(path, map, (size_t)st.st_size);
    munmap(map, (size_t)st.st_size);
    return rc;
}

/* ---- a small SentencePiece vocabulary, written in memory ---- */

struct wbuf {
    uint8_t *p;
    size_t len;
    size_t cap;
};

static void w_bytes(struct wbuf *w, const void *src, size_t n)
{
    if (w->len + n > w->cap) {
        size_t cap = w->cap ? 2 * w->cap : 4096;
        while (cap < w->len + n)
            cap *= 2;
        uint8_t *p = realloc(w->p, cap);
        if (!p)
            abort();
        w->p = p;
        w->cap = cap;
    }
    memcpy(w->p + w->len, src, n);
    w->len += n;
}

static void w_u32(struct wbuf *w, uint32_t v)
{
    w_bytes(w, &v, 4);
}

static void w_u64(struct wbuf *w, uint64_t v)
{
    w_bytes(w, &v, 8);
}

static void w_str(struct wbuf *w, const char *s)
{
    w_u64(w, strlen(s));
    w_bytes(w, s, strlen(s));
}

/* <unk>, the 256 <0xXX> byte tokens, pieces over a small alphabet with tied
 * scores, a control <x>, user-defined <u> and a two-space run (spelled with
 * real spaces, as Gemma files do). */
static int load_small_spm(void)
{
    static const char *const pieces[] = {"a",
                                         "b",
                                         "c",
                                         "\xE2\x96\x81",
                                         "ab",
                                         "bc",
                                         "ca",
                                         "abc",
                                         "aa",
                                         "aaa",
                                         "\u2581a",
                                         "\xE2\x96\x81\xE2\x96\x81",
                                         "\xc3\xa9",
                                         "e\xcc\x81",
                                         "\xe4\xb8\xad",
                                         "<",
                                         "<x",
                                         "<x>",
                                         "<u>",
                                         "  "};
    static const float scores[] = {-100, -101, -102, -103, -1,   -1,   -2,  -3, -4,    -0.5f,
                                   -5,   -6,   -104, -7,   -105, -106, -10, 10, -1000, -1000};
    static const int32_t types[] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 3, 4, 4};
    const int np = (int)(sizeof pieces / sizeof pieces[0]);
    const uint64_t n = 1 + 256 + (uint64_t)np;
    struct wbuf w = {0};
    char name[8];

    w_bytes(&w, "GGUF", 4);
    w_u32(&w, 3);
    w_u64(&w, 0);
    w_u64(&w, 6);
    w_str(&w, "tokenizer.ggml.model");
    w_u32(&w, GGUF_TYPE_STRING);
    w_str(&w, "llama");
    w_str(&w, "tokenizer.ggml.tokens");
    w_u32(&w, GGUF_TYPE_ARRAY);
    w_u32(&w, GGUF_TYPE_STRING);
    w_u64(&w, n);
    w_str(&w, "<unk>");
    for (int b = 0; b < 256; b++) {
        snprintf(name, sizeof name, "<0x%02X>", b);
        w_str(&w, name);
    }
    for (int i = 0; i < np; i++)
        w_str(&w, pieces[i]);
    w_str(&w, "tokenizer.ggml.token_type");
    w_u32(&w, GGUF_TYPE_ARRAY);
    w_u32(&w, GGUF_TYPE_INT32);
    w_u64(&w, n);
    for (uint64_t i = 0; i < n; i++) {
        int32_t ty = i == 0 ? 2 : i <= 256 ? 6 : types[i - 257];
        w_bytes(&w, &ty, 4);
    }
    w_str(&w, "tokenizer.ggml.scores");
    w_u32(&w, GGUF_TYPE_ARRAY);
    w_u32(&w, GGUF_TYPE_FLOAT32);
    w_u64(&w, n);
    for (uint64_t i = 0; i < n; i++) {
        float v = i <= 256 ? 0.0f : scores[i - 257];
        w_bytes(&w, &v, 4);
    }
    w_str(&w, "tokenizer.ggml.add_space_prefix");
    w_u32(&w, GGUF_TYPE_BOOL);
    w_bytes(&w, "\0", 1);
    w_str(&w, "tokenizer.ggml.bos_token_id"); /* <x> */
    w_u32(&w, GGUF_TYPE_UINT32);
    w_u32(&w, 257 + 17);
    int rc = load_bytes("a small SentencePiece vocabulary", w.p, w.len);
    free(w.p);
    return rc;
}

/* The vocabulary's facts the checks need, measured through the API. */
static void describe(struct vocab *v)
{
    int32_t ids[4];
    size_t l = 0;

    v->n_vocab = tok_n_vocab(v->t);
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        v->has_token[b] = tok_encode(v->t, &c, 1, 0, 0, NULL, 0) > 0;
    }
    for (int32_t id = 0; id < v->n_vocab; id++) {
        if (tok_piece(v->t, id, &l) && l > v->max_piece)
            v->max_piece = l;
    }
    /* "a" decodes as " a" when a space prefix is added */
    if (tok_encode(v->t, "a", 1, 0, 0, ids, 4) >= 1) {
        const char *p = tok_piece(v->t, ids[0], &l);
        v->space_prefix = v->spm && p && l >= 1 && p[0] == ' ';
    }
}

static void setup(void)
{
    char path[4096];
    /* where scripts/fetch-model.sh leaves them, as the tests find them */
    snprintf(path, sizeof path, "%s", test_model_path());
    T = &vocabs[n_vocabs];
    if (load(path) < 0 && load(SS_FIXTURES_DIR "/norm_softmax.gguf") < 0) {
        fprintf(stderr, "fuzz_tokenizer: no byte-level vocabulary could be loaded\n");
        exit(1);
    }
    describe(&vocabs[n_vocabs++]);
    /* the SentencePiece path: Gemma 3's vocabulary, else a small one */
    T = &vocabs[n_vocabs];
    T->spm = 1;
    snprintf(path, sizeof path, "%s", test_gemma_model_path());
    if (load(path) < 0 && load_small_spm() < 0) {
        fprintf(stderr, "fuzz_tokenizer: no SentencePiece vocabulary could be loaded\n");
        exit(1);
    }
    describe(&vocabs[n_vocabs++]);
}

/* Streams ids through tok_stream_push; checks every piece is valid UTF-8 and,
 * when want is valid UTF-8, that the pieces add up to it exactly. */
static void check_stream(const int32_t *ids, int64_t n, const char *want, size_t want_len,
                         const uint8_t *text, size_t len)
{
    struct tok_stream st = {0};
    size_t cap = 3 * T->max_piece + 8;
    char *buf = malloc(cap);
    int exact = test_valid_utf8((const unsigned char *)want, want_len);
    size_t got = 0;

    if (!buf)
        return;
    for (int64_t i = 0; i <= n; i++) {
        int64_t w =
            i < n ? tok_stream_push(T->t, &st, ids[i], buf, cap) : tok_stream_flush(&st, buf, cap);
        if (w < 0)
            fail("tok_stream_push failed on a valid id with a big enough buffer", text, len);
        if (!test_valid_utf8((const unsigned char *)buf, (size_t)w))
            fail("the stream emitted invalid UTF-8", text, len);
        if (exact && (got + (size_t)w > want_len || memcmp(want + got, buf, (size_t)w) != 0))
            fail("the stream differs from the decoded text", text, len);
        got += (size_t)w;
    }
    if (exact && got != want_len)
        fail("the stream is shorter than the decoded text", text, len);
    free(buf);
}

static void check_encode(const uint8_t *text, size_t len, int add_bos, int parse_special)
{
    /* every token but BOS (and SentencePiece's space prefix) takes at least
     * one byte of the text */
    int64_t cap = (int64_t)len + 1 + T->space_prefix;
    int32_t small[SMALL_CAP];
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    if (!ids)
        return;
    int64_t n = tok_encode(T->t, (const char *)text, len, add_bos, parse_special, ids, cap);
    if (n < 0)
        fail("tok_encode failed", text, len);
    if (n > cap)
        fail("more tokens than bytes", text, len);
    /* a short buffer still gets the whole count (no buffer at all, or a small
     * one that gets the same first ids: one of the two per call, for speed) */
    if (!parse_special) {
        if (tok_encode(T->t, (const char *)text, len, add_bos, parse_special, NULL, 0) != n)
            fail("the count changed without an output buffer", text, len);
    } else {
        if (tok_encode(T->t, (const char *)text, len, add_bos, parse_special, small, SMALL_CAP) !=
            n)
            fail("the count changed with a small output buffer", text, len);
        if (memcmp(small, ids, (size_t)(n < SMALL_CAP ? n : SMALL_CAP) * sizeof *ids) != 0)
            fail("a small output buffer got different ids", text, len);
    }

    /* with a limit on the count (the server's prompt limit): the same count
     * and ids up to it, max + 1 past it; limits at, just under and well under
     * the count, where the early refusals decide */
    int32_t *lim = malloc((size_t)cap * sizeof *lim);
    const int64_t maxes[3] = {n, n - 1, (int64_t)(len % 7) * n / 8};
    for (int k = 0; lim && k < 3; k++) {
        int64_t max = maxes[k] < 0 ? 0 : maxes[k];
        int64_t m =
            tok_encode_max(T->t, (const char *)text, len, add_bos, parse_special, max, lim, cap);
        if (n <= max ? m != n || memcmp(lim, ids, (size_t)n * sizeof *ids) != 0 : m != max + 1)
            fail("tok_encode_max disagrees with tok_encode", text, len);
    }
    free(lim);

    int bos = add_bos && tok_bos(T->t) >= 0;
    if (bos && (n < 1 || ids[0] != tok_bos(T->t)))
        fail("BOS asked for and missing", text, len);
    size_t total = 0;
    for (int64_t i = 0; i < n; i++) {
        size_t l = 0;
        if (ids[i] < 0 || ids[i] >= T->n_vocab || !tok_piece(T->t, ids[i], &l))
            fail("an id outside the vocabulary", text, len);
        tok_is_eog(T->t, ids[i]);
        total += l;
    }

    /* decode (without BOS) and compare with the text minus tokenless bytes */
    char *back = malloc(total + 1);
    char *want = malloc(len + 2);
    if (!back || !want) {
        free(back);
        free(want);
        free(ids);
        return;
    }
    size_t blen = 0;
    size_t wlen = 0;
    for (int64_t i = bos; i < n; i++) {
        size_t l = 0;
        const char *p = tok_piece(T->t, ids[i], &l);
        memcpy(back + blen, p, l);
        blen += l;
    }
    if (T->spm) {
        /* a literal U+2581 is SentencePiece's space */
        if (T->space_prefix && len > 0)
            want[wlen++] = ' ';
        for (size_t i = 0; i < len; i++) {
            if (i + 3 <= len && memcmp(text + i, "\xE2\x96\x81", 3) == 0) {
                want[wlen++] = ' ';
                i += 2;
            } else {
                want[wlen++] = (char)text[i];
            }
        }
    } else {
        for (size_t i = 0; i < len; i++)
            if (T->has_token[text[i]])
                want[wlen++] = (char)text[i];
    }
    if (blen != wlen || memcmp(back, want, blen) != 0)
        fail("decode(encode(text)) is not the text", text, len);
    check_stream(ids + bos, n - bos, back, blen, text, len);
    free(back);
    free(want);
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (n_vocabs == 0)
        setup();
    /* a private copy of exactly the text, so a read past it is an ASan error */
    uint8_t *text = malloc(size ? size : 1);
    if (!text)
        return 0;
    memcpy(text, data, size);
    for (int v = 0; v < n_vocabs; v++) {
        T = &vocabs[v];
        check_encode(text, size, 0, 0);
        check_encode(text, size, 1, 1);
    }
    free(text);
    return 0;
}
