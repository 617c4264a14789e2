/*
 * fuzz_tokenizer.c: libFuzzer target for engine/tokenizer.h: tok_encode on
 * arbitrary bytes, then decoding the ids back, piece by piece and streamed.
 *
 * The vocabulary is loaded once, from the real model ($STREAMSINK_MODEL, else
 * ${XDG_CACHE_HOME:-~/.cache}/streamsink/SmolLM2-135M-Instruct.Q4_1.gguf, where
 * scripts/fetch-model.sh leaves it), or from tests/fixtures/norm_softmax.gguf
 * (a small byte-level vocabulary) when the model is absent. Each input is the
 * text, encoded twice: without special-token parsing and without BOS, and
 * with both. Checked:
 *   - there are no more tokens than bytes (+ BOS); the count is the same
 *     with no output buffer, and a small buffer gets the same first ids;
 *   - every id is in [0, n_vocab); BOS comes first when asked for;
 *   - decoding the ids gives the text back, byte for byte, except bytes that
 *     have no token in the vocabulary (SmolLM2 lacks 21 control bytes), which
 *     are dropped as Hugging Face drops them. tokenizer_impl.h documents the round
 *     trip for invalid UTF-8 as well (each invalid byte becomes its byte's
 *     token), and test_tokenizer checks it on the Hugging Face fixture;
 *   - the streaming detokenizer emits only valid UTF-8, and exactly the
 *     decoded text when that is valid UTF-8.
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

static struct {
    struct tokenizer *t;
    int64_t n_vocab;
    int has_token[256]; /* a lone byte b encodes to at least one token */
    size_t max_piece;
} T;

static void fail(const char *what, const uint8_t *text, size_t len)
{
    fprintf(stderr, "fuzz_tokenizer: %s (text of %zu bytes:", what, len);
    for (size_t i = 0; i < len && i < 64; i++)
        fprintf(stderr, " %02x", text[i]);
    fprintf(stderr, "%s)\n", len > 64 ? " ..." : "");
    abort();
}

static int load(const char *path)
{
    char err[256];
    struct stat st;
    struct gguf_file g;
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return -1;
    if (fstat(fd, &st) < 0) {
        close(fd);
        return -1;
    }
    void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED)
        return -1;
    int rc = gguf_parse(&g, map, (size_t)st.st_size, err, sizeof err);
    if (rc == 0) {
        rc = tok_load(&T.t, &g, err, sizeof err);
        gguf_free(&g); /* the tokenizer keeps its own copy */
    }
    munmap(map, (size_t)st.st_size);
    if (rc < 0) {
        fprintf(stderr, "fuzz_tokenizer: %s: %s\n", path, err);
        return -1;
    }
    fprintf(stderr, "fuzz_tokenizer: vocabulary of %lld tokens from %s\n",
            (long long)tok_n_vocab(T.t), path);
    return 0;
}

static void setup(void)
{
    /* where scripts/fetch-model.sh leaves it, as the tests find it */
    const char *path = test_model_path();
    if (load(path) < 0 && load(SS_FIXTURES_DIR "/norm_softmax.gguf") < 0) {
        fprintf(stderr, "fuzz_tokenizer: no vocabulary could be loaded\n");
        exit(1);
    }
    T.n_vocab = tok_n_vocab(T.t);
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        T.has_token[b] = tok_encode(T.t, &c, 1, 0, 0, NULL, 0) > 0;
    }
    for (int32_t id = 0; id < T.n_vocab; id++) {
        size_t l = 0;
        if (tok_piece(T.t, id, &l) && l > T.max_piece)
            T.max_piece = l;
    }
}

/* Streams ids through tok_stream_push; checks every piece is valid UTF-8 and,
 * when want is valid UTF-8, that the pieces add up to it exactly. */
static void check_stream(const int32_t *ids, int64_t n, const char *want, size_t want_len,
                         const uint8_t *text, size_t len)
{
    struct tok_stream st = {0};
    size_t cap = 3 * T.max_piece + 8;
    char *buf = malloc(cap);
    int exact = test_valid_utf8((const unsigned char *)want, want_len);
    size_t got = 0;

    if (!buf)
        return;
    for (int64_t i = 0; i <= n; i++) {
        int64_t w =
            i < n ? tok_stream_push(T.t, &st, ids[i], buf, cap) : tok_stream_flush(&st, buf, cap);
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
    /* every token but BOS takes at least one byte of the text */
    int64_t cap = (int64_t)len + 1;
    int32_t small[SMALL_CAP];
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    if (!ids)
        return;
    int64_t n = tok_encode(T.t, (const char *)text, len, add_bos, parse_special, ids, cap);
    if (n < 0)
        fail("tok_encode failed", text, len);
    if (n > cap)
        fail("more tokens than bytes", text, len);
    /* a short buffer still gets the whole count (no buffer at all, or a small
     * one that gets the same first ids: one of the two per call, for speed) */
    if (!parse_special) {
        if (tok_encode(T.t, (const char *)text, len, add_bos, parse_special, NULL, 0) != n)
            fail("the count changed without an output buffer", text, len);
    } else {
        if (tok_encode(T.t, (const char *)text, len, add_bos, parse_special, small, SMALL_CAP) != n)
            fail("the count changed with a small output buffer", text, len);
        if (memcmp(small, ids, (size_t)(n < SMALL_CAP ? n : SMALL_CAP) * sizeof *ids) != 0)
            fail("a small output buffer got different ids", text, len);
    }

    int bos = add_bos && tok_bos(T.t) >= 0;
    if (bos && (n < 1 || ids[0] != tok_bos(T.t)))
        fail("BOS asked for and missing", text, len);
    size_t total = 0;
    for (int64_t i = 0; i < n; i++) {
        size_t l = 0;
        if (ids[i] < 0 || ids[i] >= T.n_vocab || !tok_piece(T.t, ids[i], &l))
            fail("an id outside the vocabulary", text, len);
        tok_is_eog(T.t, ids[i]);
        total += l;
    }

    /* decode (without BOS) and compare with the text minus tokenless bytes */
    char *back = malloc(total + 1);
    char *want = malloc(len + 1);
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
        const char *p = tok_piece(T.t, ids[i], &l);
        memcpy(back + blen, p, l);
        blen += l;
    }
    for (size_t i = 0; i < len; i++)
        if (T.has_token[text[i]])
            want[wlen++] = (char)text[i];
    if (blen != wlen || memcmp(back, want, blen) != 0)
        fail("decode(encode(text)) is not the text", text, len);
    check_stream(ids + bos, n - bos, back, blen, text, len);
    free(back);
    free(want);
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!T.t)
        setup();
    /* a private copy of exactly the text, so a read past it is an ASan error */
    uint8_t *text = malloc(size ? size : 1);
    if (!text)
        return 0;
    memcpy(text, data, size);
    check_encode(text, size, 0, 0);
    check_encode(text, size, 1, 1);
    free(text);
    return 0;
}
