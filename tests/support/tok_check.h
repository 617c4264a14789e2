/*
 * tok_check.h: what the tokenizer tests share. A real model's tokenizer loaded
 * once, encode and decode into fresh arrays, and the reference fixtures that
 * tools/make_tokenizer_fixture.py (Hugging Face tokenizers) and
 * tools/make_spm_tokenizer_fixture.py (sentencepiece) write: one case a line,
 * "flags TAB hex(text) TAB ids", flags 's' (parse special tokens) and 'r' (the
 * reference decodes the ids back to the text), '#' lines are comments.
 */
#ifndef SS_TESTS_SUPPORT_TOK_CHECK_H
#define SS_TESTS_SUPPORT_TOK_CHECK_H

#include "engine/gguf.h"
#include "engine/tokenizer.h"

#include <stddef.h>
#include <stdint.h>

/* A model file mapped privately and its tokenizer; zero-initialize. */
struct tok_real {
    int tried;
    void *map;
    size_t len;
    struct gguf_file g;
    struct tokenizer *t;
};

/* Loads path's tokenizer the first time (later calls return the same one).
 * NULL if the file is absent or does not load; r->map then tells which. With
 * metadata_only the tensor count is zeroed in the private copy-on-write
 * mapping, so the test does not depend on the tensor types the build loads. */
struct tokenizer *tok_real_load(struct tok_real *r, const char *path, int metadata_only);

/* In a TEST: t is r's tokenizer; skip when the file is absent, fail when it is
 * present but does not load. */
#define TOK_REAL(t, r, path, metadata_only, fetch_hint)                                            \
    struct tokenizer *t = tok_real_load(&(r), (path), (metadata_only));                            \
    if (!t) {                                                                                      \
        ASSERT(!(r).map || !"model file present but its tokenizer did not load");                  \
        TEST_SKIP("no model file (run " fetch_hint ")");                                           \
    }

/* Encodes into a malloc'd array (caller frees); *n gets the count, or a
 * negative errno with NULL returned. */
int32_t *tok_check_encode(const struct tokenizer *t, const char *s, size_t len, int bos,
                          int special, int64_t *n);
/* Concatenated raw pieces of ids, malloc'd and NUL-terminated (caller frees);
 * NULL on a bad id. */
char *tok_check_decode(const struct tokenizer *t, const int32_t *ids, int64_t n, size_t *len);
/* 1 if decode(encode(s)) == s. */
int tok_check_roundtrips(const struct tokenizer *t, const char *s, size_t len, int special);
/* Streams ids one at a time through tok_stream_push; 1 if every piece is
 * valid UTF-8 and the pieces concatenated are want. */
int tok_check_stream_equals(const struct tokenizer *t, const int32_t *ids, int64_t n,
                            const char *want, size_t want_len);
/* Encodes text, prints the speed, 1 if it round-trips. */
int tok_check_encode_long(const struct tokenizer *t, const char *what, const char *text,
                          size_t len);
/* The count of tokens tok_is_control calls control, or -1 when, for some id,
 * it disagrees with the file's tokenizer.ggml.token_type (3, CONTROL, with
 * text to leave out) or the types cannot be read; the first such id is
 * printed. */
int64_t tok_check_controls(const struct tok_real *r, const struct tokenizer *t);
/* A whole file, malloc'd and NUL-terminated; NULL if unreadable. */
char *tok_check_read_file(const char *path, size_t *len);
/* The first 120 bytes of s on stderr, escaped. */
void tok_check_print_text(const char *s, size_t len);

struct tok_case {
    char *text;
    size_t len;
    int32_t *ids;
    int64_t n_ids;
    int special;    /* 's': parse special tokens */
    int roundtrips; /* 'r': the reference decodes the ids back to the text */
};

struct tok_fixture {
    const char *path;
    int loaded;
    struct tok_case *c;
    int n;
};

/* Reads f->path the first time; the number of cases, -1 if unreadable or bad. */
int tok_fixture_load(struct tok_fixture *f);
/* Encodes every case with t; how many differ from the reference (the first
 * few printed). */
int tok_fixture_mismatches(const struct tokenizer *t, const struct tok_fixture *f);

#endif
