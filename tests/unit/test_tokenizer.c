/*
 * test_tokenizer.c: the byte-level BPE tokenizer (engine/tokenizer.h).
 *
 * On the real SmolLM2 file: token ids identical to Hugging Face `tokenizers`
 * for every case of tests/fixtures/tokenizer_ids.txt (made by
 * tools/make_tokenizer_fixture.py), decode(encode(x)) == x, the streaming
 * detokenizer, special tokens, long inputs and bad ids. Those tests skip when
 * the model file is absent (test_model_path()); a file that is present must
 * load.
 *
 * On small GGUF files built in memory: the GPT-2 vs smollm pre-tokenizers,
 * added-token matching rules, and every load error; truncated and corrupted
 * files must give an error or a working tokenizer, never a crash (run under
 * ASan/UBSan).
 */
#include "support/gguf_writer.h"
#include "support/rng.h"
#include "support/tok_check.h"
#include "support/utf8_check.h"
#include "test.h"

#include "gguf.h"
#include "tokenizer.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifndef SS_FIXTURES_DIR
#define SS_FIXTURES_DIR "tests/fixtures"
#endif

/* ---- the real model, loaded once, and the HF fixtures --------------------- */

static struct tok_real real;
#define REAL_TOK(t) TOK_REAL(t, real, test_model_path(), 0, "scripts/fetch-model.sh")

static struct tok_fixture fx = {.path = SS_FIXTURES_DIR "/tokenizer_ids.txt"};
static struct tok_fixture fx_gpt2 = {.path = SS_FIXTURES_DIR "/tokenizer_ids_gpt2.txt"};

/* ---- real-model tests --------------------------------------------------- */

TEST(tokenizer_loads_smollm2_metadata)
{
    REAL_TOK(t);
    ASSERT_EQ(tok_n_vocab(t), 49152);
    ASSERT_EQ(tok_bos(t), 1);
    ASSERT_EQ(tok_eos(t), 2);
    ASSERT_EQ(tok_add_bos(t), 0);
    ASSERT(tok_warning(t) == NULL);
    ASSERT(tok_is_eog(t, 2));  /* <|im_end|>, eos */
    ASSERT(tok_is_eog(t, 0));  /* <|endoftext|> */
    ASSERT(!tok_is_eog(t, 1)); /* <|im_start|> */
    ASSERT(!tok_is_eog(t, 100));
    ASSERT(!tok_is_eog(t, -1));
    ASSERT(!tok_is_eog(t, 49152));
}

/* tok_is_control against the file's own token types, id by id: the 17
 * CONTROL tokens of SmolLM2 (<|endoftext|>, <|im_start|>, <|im_end|>,
 * <repo_name>...), and nothing else */
TEST(tokenizer_control_tokens_are_the_files_token_type_3)
{
    REAL_TOK(t);
    ASSERT_EQ(tok_check_controls(&real, t), 17);
    ASSERT(tok_is_control(t, 1)); /* <|im_start|> */
}

TEST(tokenizer_ids_match_hugging_face_for_every_fixture_case)
{
    REAL_TOK(t);
    ASSERT(tok_fixture_load(&fx) > 0);
    ASSERT_EQ(tok_fixture_mismatches(t, &fx), 0);
}

TEST(tokenizer_decode_of_encode_is_the_text_for_every_fixture_case)
{
    int n;
    int checked = 0;

    REAL_TOK(t);
    n = tok_fixture_load(&fx);
    ASSERT(n > 0);
    for (int i = 0; i < n; i++) {
        const struct tok_case *c = &fx.c[i];
        int64_t n_ids;
        int32_t *ids = tok_check_encode(t, c->text, c->len, 0, c->special, &n_ids);
        size_t len = 0;
        char *back = ids ? tok_check_decode(t, ids, n_ids, &len) : NULL;
        int same = back && len == c->len && memcmp(back, c->text, len) == 0;

        free(ids);
        free(back);
        /* Cases HF cannot round-trip hold bytes without a token (dropped). */
        if (c->roundtrips) {
            if (!same)
                tok_check_print_text(c->text, c->len);
            ASSERT(same);
            checked++;
        }
    }
    printf("  %d cases round-trip\n", checked);
}

TEST(tokenizer_stream_emits_exactly_the_text_in_valid_utf8_pieces)
{
    int n;
    int checked = 0;

    REAL_TOK(t);
    n = tok_fixture_load(&fx);
    ASSERT(n > 0);
    for (int i = 0; i < n; i++) {
        const struct tok_case *c = &fx.c[i];
        if (!c->roundtrips)
            continue;
        if (!tok_check_stream_equals(t, c->ids, c->n_ids, c->text, c->len))
            tok_check_print_text(c->text, c->len);
        ASSERT(tok_check_stream_equals(t, c->ids, c->n_ids, c->text, c->len));
        checked++;
    }
    printf("  %d cases streamed\n", checked);
}

/* The token whose piece is the single byte b, or -1. */
static int32_t byte_token(const struct tokenizer *t, unsigned char b)
{
    for (int32_t id = 0; id < tok_n_vocab(t); id++) {
        size_t l;
        const char *p = tok_piece(t, id, &l);
        if (l == 1 && (unsigned char)p[0] == b)
            return id;
    }
    return -1;
}

TEST(tokenizer_stream_holds_back_a_character_split_across_byte_tokens)
{
    static const unsigned char emoji[4] = {0xF0, 0x9F, 0x98, 0x80}; /* U+1F600 */
    struct tok_stream st = {0};
    char buf[64];
    int32_t ids[4];
    int32_t a;

    REAL_TOK(t);
    for (int i = 0; i < 4; i++) {
        ids[i] = byte_token(t, emoji[i]);
        ASSERT(ids[i] >= 0);
    }
    for (int i = 0; i < 3; i++)
        ASSERT_EQ(tok_stream_push(t, &st, ids[i], buf, sizeof buf), 0);
    ASSERT_EQ(tok_stream_push(t, &st, ids[3], buf, sizeof buf), 4);
    ASSERT(memcmp(buf, emoji, 4) == 0);
    ASSERT_EQ(tok_stream_flush(&st, buf, sizeof buf), 0);

    /* A broken sequence becomes one U+FFFD and the next character follows. */
    a = byte_token(t, 'a');
    ASSERT(a >= 0);
    ASSERT_EQ(tok_stream_push(t, &st, ids[0], buf, sizeof buf), 0);
    ASSERT_EQ(tok_stream_push(t, &st, ids[1], buf, sizeof buf), 0);
    ASSERT_EQ(tok_stream_push(t, &st, a, buf, sizeof buf), 4);
    ASSERT(memcmp(buf, "\xEF\xBF\xBD\x61", 4) == 0);
    /* A lone continuation byte is U+FFFD at once. */
    ASSERT_EQ(tok_stream_push(t, &st, ids[3], buf, sizeof buf), 3);
    ASSERT(memcmp(buf, "\xEF\xBF\xBD", 3) == 0);
    /* A tail left at the end is flushed as U+FFFD. */
    ASSERT_EQ(tok_stream_push(t, &st, ids[0], buf, sizeof buf), 0);
    ASSERT_EQ(tok_stream_flush(&st, buf, 2), -ENOSPC);
    ASSERT_EQ(st.n_pend, 1);
    ASSERT_EQ(tok_stream_flush(&st, buf, sizeof buf), 3);
    ASSERT_EQ(st.n_pend, 0);

    /* Too small a buffer leaves the state as it was. */
    ASSERT_EQ(tok_stream_push(t, &st, ids[0], buf, sizeof buf), 0);
    ASSERT_EQ(tok_stream_push(t, &st, ids[1], buf, sizeof buf), 0);
    ASSERT_EQ(tok_stream_push(t, &st, ids[2], buf, sizeof buf), 0);
    ASSERT_EQ(tok_stream_push(t, &st, ids[3], buf, 3), -ENOSPC);
    ASSERT_EQ(st.n_pend, 3);
    ASSERT_EQ(tok_stream_push(t, &st, ids[3], buf, 4), 4);
    ASSERT(memcmp(buf, emoji, 4) == 0);
}

/* The token whose piece is exactly the bytes s (NUL-free), or -1. */
static int32_t piece_token(const struct tokenizer *t, const char *s)
{
    const size_t n = strlen(s);
    for (int32_t id = 0; id < tok_n_vocab(t); id++) {
        size_t l;
        const char *p = tok_piece(t, id, &l);
        if (l == n && memcmp(p, s, n) == 0)
            return id;
    }
    return -1;
}

/* Pieces pushed one by one: each push's output and n_earlier, then the
 * flush's output. The expectations are Python's: out is what
 * codecs.getincrementaldecoder("utf-8")("replace") gives for each piece
 * (and for the end, final=True); earlier is, where decoding the bytes before
 * the piece and from it apart gives the text of the whole (the piece starts a
 * character or a U+FFFD), the bytes by which the decoding of those before it
 * is longer than what they were given, else 0. */
struct stream_case {
    const char *name;
    int n;
    const char *piece[4];
    const char *out[4];
    int earlier[4];
    const char *flush;
};

static const struct stream_case stream_cases[] = {
    {"a tail broken by the next token's first byte",
     2,
     {"\xF0\x9F", "\x41"},
     {"", "\xEF\xBF\xBD\x41"},
     {0, 3},
     ""},
    {"each tail broken by the next one",
     3,
     {"\xF0\x9F", "\xF0\x9F", "\xF0\x9F"},
     {"", "\xEF\xBF\xBD", "\xEF\xBF\xBD"},
     {0, 3, 3},
     "\xEF\xBF\xBD"},
    {"U+1F600 in four byte tokens",
     4,
     {"\xF0", "\x9F", "\x98", "\x80"},
     {"", "", "", "\xF0\x9F\x98\x80"},
     {0, 0, 0, 0},
     ""},
    {"U+1F212 in two tokens of two bytes",
     2,
     {"\xF0\x9F", "\x88\x92"},
     {"", "\xF0\x9F\x88\x92"},
     {0, 0},
     ""},
    {"a tail of two tokens broken by a third",
     3,
     {"\xF0", "\x9F", "\x43"},
     {"", "", "\xEF\xBF\xBD\x43"},
     {0, 0, 3},
     ""},
    {"E0 needs A0..BF next", 2, {"\xE0", "\x80"}, {"", "\xEF\xBF\xBD\xEF\xBF\xBD"}, {0, 3}, ""},
    {"a lone continuation byte with nothing held",
     2,
     {"\x61", "\x80"},
     {"\x61", "\xEF\xBF\xBD"},
     {0, 0},
     ""},
    {"a euro sign completed by a two-byte token",
     2,
     {"\xE2", "\x82\xAC"},
     {"", "\xE2\x82\xAC"},
     {0, 0},
     ""},
    {"a three-byte tail over two tokens, broken",
     3,
     {"\xF0", "\x9F\xA5", "\x41"},
     {"", "", "\xEF\xBF\xBD\x41"},
     {0, 0, 3},
     ""},
    {"a character completed, then a continuation byte of its own",
     2,
     {"\xC3", "\x82\xAC"},
     {"", "\xC3\x82\xEF\xBF\xBD"},
     {0, 0},
     ""},
    {"a broken tail, then a character and a tail of its own",
     2,
     {"\xF0\x9F", "\xD0\xBE\xD0"},
     {"", "\xEF\xBF\xBD\xD0\xBE"},
     {0, 3},
     "\xEF\xBF\xBD"},
};

TEST(tokenizer_stream_says_which_bytes_end_earlier_tokens_text)
{
    REAL_TOK(t);
    for (size_t c = 0; c < sizeof stream_cases / sizeof stream_cases[0]; c++) {
        const struct stream_case *k = &stream_cases[c];
        struct tok_stream st = {0};
        char buf[64];

        printf("  %s\n", k->name);
        for (int i = 0; i < k->n; i++) {
            int32_t id = piece_token(t, k->piece[i]);
            ASSERT(id >= 0);
            st.n_earlier = -1;
            ASSERT_EQ(tok_stream_push(t, &st, id, buf, sizeof buf), (int64_t)strlen(k->out[i]));
            ASSERT(memcmp(buf, k->out[i], strlen(k->out[i])) == 0);
            ASSERT_EQ(st.n_earlier, k->earlier[i]);
        }
        ASSERT_EQ(tok_stream_flush(&st, buf, sizeof buf), (int64_t)strlen(k->flush));
        ASSERT(memcmp(buf, k->flush, strlen(k->flush)) == 0);
    }
}

TEST(tokenizer_parses_special_tokens_only_when_asked)
{
    static const char text[] = "<|im_start|>user\nHi<|im_end|>";
    int64_t n_on;
    int64_t n_off;
    int32_t *on;
    int32_t *off;
    size_t len = 0;
    char *back;

    REAL_TOK(t);
    on = tok_check_encode(t, text, strlen(text), 0, 1, &n_on);
    off = tok_check_encode(t, text, strlen(text), 0, 0, &n_off);
    ASSERT(on && off);
    ASSERT(n_on >= 4);
    ASSERT_EQ(on[0], 1);
    ASSERT_EQ(on[n_on - 1], 2);
    ASSERT(n_off > n_on);
    for (int64_t i = 0; i < n_off; i++)
        ASSERT(off[i] != 1 && off[i] != 2);
    back = tok_check_decode(t, off, n_off, &len);
    ASSERT(back && len == strlen(text) && memcmp(back, text, len) == 0);
    free(back);
    back = tok_check_decode(t, on, n_on, &len);
    ASSERT(back && len == strlen(text) && memcmp(back, text, len) == 0);
    free(back);
    free(on);
    free(off);
}

TEST(tokenizer_adds_bos_when_asked_and_counts_past_cap)
{
    static const char text[] = "Hello world, 12345!";
    int32_t ids[64];
    int32_t small[3];
    int64_t n;
    int64_t n_bos;

    REAL_TOK(t);
    n = tok_encode(t, text, strlen(text), 0, 0, ids, 64);
    ASSERT(n > 3 && n < 60);
    n_bos = tok_encode(t, text, strlen(text), 1, 0, ids + 1, 63);
    ASSERT_EQ(n_bos, n + 1);
    ASSERT_EQ(ids[1], tok_bos(t));
    /* A small cap still returns the full count and fills what fits. */
    ASSERT_EQ(tok_encode(t, text, strlen(text), 0, 0, small, 3), n);
    ASSERT_EQ(small[0], ids[2]);
    ASSERT_EQ(tok_encode(t, text, strlen(text), 0, 0, NULL, 0), n);
    ASSERT_EQ(tok_encode(t, "", 0, 0, 0, NULL, 0), 0);
    ASSERT_EQ(tok_encode(t, NULL, 0, 1, 0, ids, 64), 1);
    ASSERT_EQ(tok_encode(t, NULL, 5, 0, 0, ids, 64), -EINVAL);
    ASSERT_EQ(tok_encode(t, text, strlen(text), 0, 0, ids, -1), -EINVAL);
}

TEST(tokenizer_bad_ids_give_null_and_errors)
{
    struct tok_stream st = {0};
    size_t len = 7;
    char buf[16];

    REAL_TOK(t);
    ASSERT(tok_piece(t, -1, &len) == NULL);
    ASSERT(tok_piece(t, (int32_t)tok_n_vocab(t), &len) == NULL);
    ASSERT(tok_piece(t, INT32_MAX, &len) == NULL);
    ASSERT(tok_piece(t, INT32_MIN, NULL) == NULL);
    ASSERT(tok_piece(t, 0, NULL) != NULL);
    ASSERT_EQ(tok_stream_push(t, &st, -3, buf, sizeof buf), -EINVAL);
    ASSERT_EQ(tok_stream_push(t, &st, 1 << 30, buf, sizeof buf), -EINVAL);
    ASSERT_EQ(st.n_pend, 0);
}

TEST(tokenizer_passes_invalid_utf8_through_as_bytes)
{
    /* stray continuation bytes, a truncated 3-byte sequence, a surrogate */
    static const char text[] = "a\x80\xbf b \xe4\xb8 c\xed\xa0\x80 d";
    int64_t n;
    int32_t *ids;
    size_t len = 0;
    char *back;

    REAL_TOK(t);
    ids = tok_check_encode(t, text, sizeof text - 1, 0, 1, &n);
    ASSERT(ids && n > 0);
    back = tok_check_decode(t, ids, n, &len);
    ASSERT(back && len == sizeof text - 1 && memcmp(back, text, len) == 0);
    free(back);
    free(ids);
    /* 0xFF has no token in SmolLM2's vocab: dropped, as HF drops it. */
    ASSERT_EQ(tok_encode(t, "\xff", 1, 0, 0, NULL, 0), 0);
}

TEST(tokenizer_encodes_long_inputs)
{
    size_t corpus_len;
    char *corpus;
    char *text;
    size_t len = 0;
    size_t chars = 0;

    REAL_TOK(t);
    corpus = tok_check_read_file(SS_FIXTURES_DIR "/tokenizer_corpus.txt", &corpus_len);
    text = malloc(1 << 21);
    ASSERT(corpus && corpus_len > 0 && corpus_len < 100000 && text);
    /* The corpus, repeated past 200k characters (code points). */
    while (chars < 200000) {
        memcpy(text + len, corpus, corpus_len);
        for (size_t i = 0; i < corpus_len; i++)
            chars += ((unsigned char)corpus[i] & 0xC0) != 0x80;
        len += corpus_len;
    }
    ASSERT(tok_check_encode_long(t, "mixed text", text, len));
    /* Pathological words: one 200k-letter word, 200k digits, 200k spaces. */
    memset(text, 'a', 200000);
    ASSERT(tok_check_encode_long(t, "200k x 'a'", text, 200000));
    memset(text, '7', 200000);
    ASSERT(tok_check_encode_long(t, "200k digits", text, 200000));
    memset(text, ' ', 200000);
    ASSERT(tok_check_encode_long(t, "200k spaces", text, 200000));
    for (len = 0; len + 4 <= 800000; len += 4)
        memcpy(text + len, "\xF0\x9F\x98\x80", 4);
    ASSERT(tok_check_encode_long(t, "200k emoji", text, len));
    free(text);
    free(corpus);
}

/* ---- small synthetic files ---------------------------------------------- */

/* What a synthetic tokenizer file holds: the 256 byte tokens (id = byte), then
 * extra[] with types[]. NULL / negative fields leave the key out. */
struct syn {
    const char *model;
    const char *pre;
    const char *const *extra;
    const int32_t *types;
    int n_extra;
    const char *const *merges;
    int n_merges; /* -1: no merges key */
    int64_t bos;
    int no_tokens;
};

/* GPT-2's bytes_to_unicode, written out again as the test's own reference. */
static void byte_char(int b, char out[3])
{
    int n = 0;
    int cp = -1;

    for (int c = 0; c < 256 && cp < 0; c++) {
        int printable = (c >= 33 && c <= 126) || (c >= 161 && c <= 172) || c >= 174;
        if (c == b)
            cp = printable ? c : 256 + n;
        n += !printable;
    }
    memset(out, 0, 3);
    if (cp < 0x80) {
        out[0] = (char)cp;
    } else {
        out[0] = (char)(0xC0 | cp >> 6);
        out[1] = (char)(0x80 | (cp & 0x3F));
    }
}

static struct gw_buf syn_file(const struct syn *s)
{
    struct gw_buf w = {0};
    uint64_t n_kv = 0;
    size_t n_kv_at;
    char bc[3];

    gw_bytes(&w, "GGUF", 4);
    gw_u32(&w, 3);
    gw_u64(&w, 0);
    n_kv_at = w.len;
    gw_u64(&w, 0);
    if (s->model) {
        gw_key(&w, "tokenizer.ggml.model", GGUF_TYPE_STRING);
        gw_str(&w, s->model);
        n_kv++;
    }
    if (s->pre) {
        gw_key(&w, "tokenizer.ggml.pre", GGUF_TYPE_STRING);
        gw_str(&w, s->pre);
        n_kv++;
    }
    if (!s->no_tokens) {
        gw_key(&w, "tokenizer.ggml.tokens", GGUF_TYPE_ARRAY);
        gw_u32(&w, GGUF_TYPE_STRING);
        gw_u64(&w, 256 + (uint64_t)s->n_extra);
        for (int b = 0; b < 256; b++) {
            byte_char(b, bc);
            gw_str(&w, bc);
        }
        for (int i = 0; i < s->n_extra; i++)
            gw_str(&w, s->extra[i]);
        gw_key(&w, "tokenizer.ggml.token_type", GGUF_TYPE_ARRAY);
        gw_u32(&w, GGUF_TYPE_INT32);
        gw_u64(&w, 256 + (uint64_t)s->n_extra);
        for (int i = 0; i < 256 + s->n_extra; i++) {
            int32_t ty = i < 256 ? 1 : s->types[i - 256];
            gw_bytes(&w, &ty, 4);
        }
        n_kv += 2;
    }
    if (s->n_merges >= 0) {
        gw_key(&w, "tokenizer.ggml.merges", GGUF_TYPE_ARRAY);
        gw_u32(&w, GGUF_TYPE_STRING);
        gw_u64(&w, (uint64_t)s->n_merges);
        for (int i = 0; i < s->n_merges; i++)
            gw_str(&w, s->merges[i]);
        n_kv++;
    }
    if (s->bos >= 0) {
        gw_key(&w, "tokenizer.ggml.bos_token_id", GGUF_TYPE_UINT32);
        gw_u32(&w, (uint32_t)s->bos);
        n_kv++;
    }
    memcpy(w.p + n_kv_at, &n_kv, 8);
    return w;
}

/* Builds and loads s. Returns tok_load's result; err gets its message. */
static int syn_load(const struct syn *s, struct tokenizer **t, char *err, size_t err_len)
{
    struct gw_buf w = syn_file(s);
    struct gguf_file g;
    int rc = gguf_parse(&g, w.p, w.len, err, err_len);

    *t = NULL;
    if (rc == 0) {
        rc = tok_load(t, &g, err, err_len);
        gguf_free(&g);
    }
    free(w.p); /* the tokenizer copies what it needs */
    return rc;
}

/* The byte tokens are ids 0..255 (id = byte); extras follow at 256 ("Ġ1" first). */
static const char *const syn_extra[] = {"\xC4\xA0\x31", "12",   "23",       "<c>", "<u>",
                                        "<a>",          "<a>b", "\xff\xfe", "ab",  "<|im_end|>"};
static const int32_t syn_types[] = {1, 1, 1, 3, 4, 3, 3, 1, 1, 3};
static const char *const syn_merges[] = {"\xC4\xA0 1", "1 2", "2 3", "x y", "nospace", "a b"};

static struct syn syn_default(void)
{
    return (struct syn){
        .model = "gpt2",
        .pre = "smollm",
        .extra = syn_extra,
        .types = syn_types,
        .n_extra = (int)(sizeof syn_extra / sizeof syn_extra[0]),
        .merges = syn_merges,
        .n_merges = (int)(sizeof syn_merges / sizeof syn_merges[0]),
        .bos = 258,
    };
}

static int ids_are(const struct tokenizer *t, const char *text, int special, const int32_t *want,
                   int64_t n_want)
{
    int32_t got[64];
    int64_t n = tok_encode(t, text, strlen(text), 0, special, got, 64);

    if (n != n_want || memcmp(got, want, (size_t)n * sizeof *got) != 0) {
        fprintf(stderr, "  \"%s\": got", text);
        for (int64_t i = 0; i < n && i < 64; i++)
            fprintf(stderr, " %d", got[i]);
        fputc('\n', stderr);
        return 0;
    }
    return 1;
}

TEST(tokenizer_smollm_isolates_digits_and_gpt2_keeps_number_runs)
{
    struct syn s = syn_default();
    struct tokenizer *t;
    char err[256];

    ASSERT_OK(syn_load(&s, &t, err, sizeof err));
    /* smollm: " ", "1", "2", "3" are four words, so no merge applies */
    ASSERT(ids_are(t, " 123", 0, (int32_t[]){' ', '1', '2', '3'}, 4));
    ASSERT(tok_warning(t) == NULL);
    tok_free(t);

    /* gpt2: " 123" is one word; (Ġ,1) ranks first, then (2,3) */
    s.pre = "gpt2";
    ASSERT_OK(syn_load(&s, &t, err, sizeof err));
    ASSERT(ids_are(t, " 123", 0, (int32_t[]){256, 258}, 2));
    ASSERT(tok_warning(t) == NULL);
    tok_free(t);

    /* unknown pre: GPT-2's pattern and a warning */
    s.pre = "made-up";
    ASSERT_OK(syn_load(&s, &t, err, sizeof err));
    ASSERT(ids_are(t, " 123", 0, (int32_t[]){256, 258}, 2));
    ASSERT(tok_warning(t) != NULL && strstr(tok_warning(t), "made-up") != NULL);
    tok_free(t);
}

TEST(tokenizer_matches_control_tokens_only_when_asked_and_user_tokens_always)
{
    struct syn s = syn_default();
    struct tokenizer *t;
    char err[256];

    ASSERT_OK(syn_load(&s, &t, err, sizeof err));
    /* <c> is CONTROL (259), <u> USER_DEFINED (260) */
    ASSERT(ids_are(t, "x<c>y<u>z", 1, (int32_t[]){'x', 259, 'y', 260, 'z'}, 5));
    ASSERT(ids_are(t, "x<c>y<u>z", 0, (int32_t[]){'x', '<', 'c', '>', 'y', 260, 'z'}, 7));
    /* longest match first: <a>b (262) over <a> (261) */
    ASSERT(ids_are(t, "<a>bc<a>", 1, (int32_t[]){262, 'c', 261}, 3));
    /* "a b" merges into ab (264); "x y" has no result token and is skipped */
    ASSERT(ids_are(t, "ab xy", 0, (int32_t[]){264, ' ', 'x', 'y'}, 4));
    ASSERT(tok_is_eog(t, 265));
    ASSERT(!tok_is_eog(t, 259));
    /* output leaves out CONTROL tokens' text only */
    ASSERT(tok_is_control(t, 259));
    ASSERT(!tok_is_control(t, 260));
    ASSERT(!tok_is_control(t, 'x'));
    ASSERT(!tok_is_control(t, -1));
    ASSERT(!tok_is_control(t, 1 << 30));
    ASSERT_EQ(tok_bos(t), 258);
    ASSERT_EQ(tok_eos(t), -1);
    tok_free(t);
}

TEST(tokenizer_decodes_tokens_outside_the_byte_alphabet_as_raw_text)
{
    struct syn s = syn_default();
    struct tokenizer *t;
    char err[256];
    size_t len;
    const char *p;

    ASSERT_OK(syn_load(&s, &t, err, sizeof err));
    p = tok_piece(t, 256, &len); /* "Ġ1" */
    ASSERT(p && len == 2 && memcmp(p, " 1", 2) == 0);
    p = tok_piece(t, 263, &len); /* invalid UTF-8 in the vocab: raw bytes */
    ASSERT(p && len == 2 && memcmp(p, "\xff\xfe", 2) == 0);
    p = tok_piece(t, 0xAD, &len); /* soft hyphen byte, mapped to U+0143 */
    ASSERT(p && len == 1 && (unsigned char)p[0] == 0xAD);
    tok_free(t);
}

TEST(tokenizer_rejects_bad_metadata_with_a_message)
{
    struct syn s;
    struct tokenizer *t;
    char err[256];

    s = syn_default();
    s.model = "bert";
    ASSERT_EQ(syn_load(&s, &t, err, sizeof err), -EINVAL);
    ASSERT(t == NULL && strstr(err, "gpt2") != NULL);

    s = syn_default();
    s.model = NULL;
    ASSERT_EQ(syn_load(&s, &t, err, sizeof err), -EINVAL);
    ASSERT(strstr(err, "tokenizer.ggml.model") != NULL);

    s = syn_default();
    s.n_merges = -1;
    ASSERT_EQ(syn_load(&s, &t, err, sizeof err), -EINVAL);
    ASSERT(strstr(err, "merges") != NULL);

    s = syn_default();
    s.no_tokens = 1;
    ASSERT_EQ(syn_load(&s, &t, err, sizeof err), -EINVAL);
    ASSERT(strstr(err, "tokenizer.ggml.tokens") != NULL);

    s = syn_default();
    s.bos = 100000;
    ASSERT_EQ(syn_load(&s, &t, err, sizeof err), -EINVAL);
    ASSERT(strstr(err, "bos_token_id") != NULL);
}

TEST(tokenizer_survives_truncated_and_corrupted_files)
{
    struct syn s = syn_default();
    struct gw_buf w = syn_file(&s);
    uint8_t *copy = malloc(w.len);
    uint64_t rng = 0x9E3779B97F4A7C15ull;
    int loaded = 0;
    static const char text[] = "x<c>y 123 <a>b \xe4\xb8\xad!";

    ASSERT(copy);
    for (int trial = 0; trial < 3000; trial++) {
        struct gguf_file g;
        struct tokenizer *t = NULL;
        char err[256];
        size_t len = w.len;

        memcpy(copy, w.p, w.len);
        if (trial < 1000) {
            len = (size_t)trial * w.len / 1000; /* truncated */
        } else {
            for (int k = 0; k < 1 + trial % 8; k++) { /* a few random bytes changed */
                uint64_t r = test_rng_u64(&rng);
                copy[(r >> 33) % w.len] = (uint8_t)(r >> 20);
            }
        }
        if (gguf_parse(&g, copy, len, err, sizeof err) < 0)
            continue;
        if (tok_load(&t, &g, err, sizeof err) == 0) {
            int32_t ids[64];
            struct tok_stream st = {0};
            char out[256];
            int64_t n = tok_encode(t, text, sizeof text - 1, 1, 1, ids, 64);
            for (int64_t i = 0; i < n && i < 64; i++)
                ASSERT(tok_stream_push(t, &st, ids[i], out, sizeof out) >= 0);
            loaded++;
            tok_free(t);
        }
        gguf_free(&g);
    }
    printf("  %d of 3000 damaged files still loaded\n", loaded);
    free(copy);
    free(w.p);
}

/* The real vocab and merges with tokenizer.ggml.pre = "gpt2". */
static struct gw_buf real_with_pre(const char *pre)
{
    static const char *const arrays[] = {"tokenizer.ggml.tokens", "tokenizer.ggml.merges"};
    struct gw_buf w = {0};
    int32_t *types = NULL;
    uint64_t n_types = 0;

    gw_bytes(&w, "GGUF", 4);
    gw_u32(&w, 3);
    gw_u64(&w, 0);
    gw_u64(&w, 5);
    gw_key(&w, "tokenizer.ggml.model", GGUF_TYPE_STRING);
    gw_str(&w, "gpt2");
    gw_key(&w, "tokenizer.ggml.pre", GGUF_TYPE_STRING);
    gw_str(&w, pre);
    for (int a = 0; a < 2; a++) {
        struct gguf_str *v = NULL;
        uint64_t n = 0;
        if (gguf_get_arr_str(&real.g, arrays[a], &v, &n) < 0)
            break;
        gw_key(&w, arrays[a], GGUF_TYPE_ARRAY);
        gw_u32(&w, GGUF_TYPE_STRING);
        gw_u64(&w, n);
        for (uint64_t i = 0; i < n; i++) {
            gw_u64(&w, v[i].len);
            gw_bytes(&w, v[i].ptr, v[i].len);
        }
        free(v);
    }
    if (gguf_get_arr_i32(&real.g, "tokenizer.ggml.token_type", &types, &n_types) == 0) {
        gw_key(&w, "tokenizer.ggml.token_type", GGUF_TYPE_ARRAY);
        gw_u32(&w, GGUF_TYPE_INT32);
        gw_u64(&w, n_types);
        gw_bytes(&w, types, n_types * sizeof *types);
        free(types);
    }
    return w;
}

TEST(tokenizer_gpt2_pattern_matches_hugging_face_on_the_real_vocab)
{
    struct gw_buf w;
    struct gguf_file g;
    struct tokenizer *t2 = NULL;
    char err[256];

    REAL_TOK(t);
    (void)t;
    ASSERT(tok_fixture_load(&fx_gpt2) > 0);
    w = real_with_pre("gpt2");
    ASSERT_OK(gguf_parse(&g, w.p, w.len, err, sizeof err));
    ASSERT_OK(tok_load(&t2, &g, err, sizeof err));
    gguf_free(&g);
    free(w.p);
    ASSERT_EQ(tok_fixture_mismatches(t2, &fx_gpt2), 0);
    tok_free(t2);
}

TEST_MAIN()
