/*
 * test_tokenizer_spm.c: the SentencePiece path of engine/tokenizer.h (spm.c),
 * tokenizer.ggml.model = "llama".
 *
 * On the real Gemma 3 270M file: token ids identical to sentencepiece (and to
 * transformers' GGUF loader, but for the one documented difference) for every
 * case of tests/fixtures/tokenizer_ids_gemma3.txt (made by
 * tools/make_spm_tokenizer_fixture.py), tok_check_decode(tok_check_encode(x)) == x, the streaming
 * detokenizer, byte fallback for invalid UTF-8, control tokens, long inputs.
 * Those tests skip when the file is absent (test_gemma_model_path()); a
 * file that is present must load.
 *
 * On small vocabularies built in memory: the merge order (highest score,
 * leftmost on ties) against a brute-force oracle that rescans every pair after
 * every merge, byte fallback and the unknown token, add_space_prefix, which
 * token types may be merge results, load errors, damaged files.
 */
#include "support/gguf_writer.h"
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

#define SPACE_MARK "\xE2\x96\x81"

/* ---- the real Gemma 3 file, loaded once, and the fixture ------------------ */

static struct tok_real real;
#define REAL_TOK(t)                                                                                \
    TOK_REAL(t, real, test_gemma_model_path(), 1, "scripts/fetch-model.sh gemma3-270m")
static struct tok_fixture fx = {.path = SS_FIXTURES_DIR "/tokenizer_ids_gemma3.txt"};

/* ---- real-file tests ------------------------------------------------------ */

TEST(spm_loads_gemma3_metadata)
{
    size_t len;
    const char *p;

    REAL_TOK(t);
    ASSERT_EQ(tok_n_vocab(t), 262144);
    ASSERT_EQ(tok_bos(t), 2);
    ASSERT_EQ(tok_eos(t), 1);
    ASSERT_EQ(tok_add_bos(t), 1);
    ASSERT(tok_warning(t) == NULL);
    ASSERT(tok_is_eog(t, 1));   /* <eos> */
    ASSERT(tok_is_eog(t, 106)); /* <end_of_turn> */
    ASSERT(!tok_is_eog(t, 105));
    ASSERT(!tok_is_eog(t, 2));
    /* pieces: '▁' is a space, <0x41> the byte 'A', control tokens their text */
    p = tok_piece(t, 236743, &len);
    ASSERT(p && len == 1 && p[0] == ' ');
    p = tok_piece(t, 238 + 0x41, &len);
    ASSERT(p && len == 1 && p[0] == 'A');
    p = tok_piece(t, 106, &len);
    ASSERT(p && len == 13 && memcmp(p, "<end_of_turn>", 13) == 0);
}

TEST(spm_ids_match_sentencepiece_for_every_fixture_case)
{
    REAL_TOK(t);
    ASSERT(tok_fixture_load(&fx) > 0);
    ASSERT_EQ(tok_fixture_mismatches(t, &fx), 0);
}

TEST(spm_decode_and_stream_give_the_text_back_for_every_fixture_case)
{
    int checked = 0;

    REAL_TOK(t);
    ASSERT(tok_fixture_load(&fx) > 0);
    for (int i = 0; i < fx.n; i++) {
        const struct tok_case *c = &fx.c[i];
        if (!c->roundtrips) {
            /* a literal U+2581 is SentencePiece's space: it decodes as ' ' */
            ASSERT(memmem(c->text, c->len, SPACE_MARK, 3) != NULL);
            continue;
        }
        if (!tok_check_roundtrips(t, c->text, c->len, c->special) ||
            !tok_check_stream_equals(t, c->ids, c->n_ids, c->text, c->len))
            tok_check_print_text(c->text, c->len);
        ASSERT(tok_check_roundtrips(t, c->text, c->len, c->special));
        ASSERT(tok_check_stream_equals(t, c->ids, c->n_ids, c->text, c->len));
        checked++;
    }
    printf("  %d of %d cases round-trip (the others hold a literal U+2581)\n", checked, fx.n);
}

TEST(spm_byte_fallback_round_trips_invalid_utf8_and_unknown_characters)
{
    /* stray continuation bytes, a truncated sequence, a surrogate, 0xFF, and
     * a private-use character that has no token of its own */
    static const char text[] = "a\x80\xbf b \xe4\xb8 c\xed\xa0\x80 d\xff \xf3\xb0\x80\x81";
    int64_t n;
    int32_t *ids;

    REAL_TOK(t);
    ASSERT(tok_check_roundtrips(t, text, sizeof text - 1, 0));
    ids = tok_check_encode(t, "\xf3\xb0\x80\x81", 4, 0, 0, &n);
    ASSERT(ids);
    ASSERT_EQ(n, 4); /* U+F0001 falls back to its four byte tokens */
    ASSERT_EQ(ids[0], 238 + 0xF3);
    ASSERT_EQ(ids[3], 238 + 0x81);
    free(ids);
    ids = tok_check_encode(t, "\xff", 1, 0, 0, &n);
    ASSERT(ids && n == 1 && ids[0] == 238 + 0xFF);
    free(ids);
}

TEST(spm_matches_control_tokens_only_when_asked_and_user_tokens_always)
{
    static const char text[] = "<start_of_turn>user\n<b>Hi</b>  there<end_of_turn>";
    int64_t n_on;
    int64_t n_off;
    int32_t *on;
    int32_t *off;
    int has_bold = 0;

    REAL_TOK(t);
    on = tok_check_encode(t, text, strlen(text), 1, 1, &n_on);
    off = tok_check_encode(t, text, strlen(text), 0, 0, &n_off);
    ASSERT(on && off);
    ASSERT_EQ(on[0], 2);   /* BOS */
    ASSERT_EQ(on[1], 105); /* <start_of_turn> */
    ASSERT_EQ(on[n_on - 1], 106);
    ASSERT(n_off > n_on);
    for (int64_t i = 0; i < n_off; i++) {
        ASSERT(off[i] != 105 && off[i] != 106);
        has_bold |= off[i] == 200; /* <b>, user-defined: matched either way */
    }
    ASSERT(has_bold);
    ASSERT(tok_check_roundtrips(t, text, strlen(text), 1));
    ASSERT(tok_check_roundtrips(t, text, strlen(text), 0));
    free(on);
    free(off);
}

/* tok_is_control against the file's own token types, id by id: Gemma's
 * CONTROL tokens (<bos>, <start_of_turn>, <unused...>, the image tokens) and
 * nothing else; <b> (USER_DEFINED) keeps its text in output */
TEST(spm_control_tokens_are_the_files_token_type_3)
{
    REAL_TOK(t);
    ASSERT(tok_check_controls(&real, t) > 6000);
    ASSERT(tok_is_control(t, 2) && tok_is_control(t, 105));
    ASSERT(!tok_is_control(t, 200));
}

TEST(spm_encodes_long_inputs)
{
    size_t corpus_len;
    char *corpus;
    char *text;
    size_t len = 0;
    uint64_t rng = 12345;

    REAL_TOK(t);
    corpus = tok_check_read_file(SS_FIXTURES_DIR "/tokenizer_corpus.txt", &corpus_len);
    text = malloc(1 << 21);
    ASSERT(corpus && corpus_len > 0 && corpus_len < 100000 && text);
    while (len + corpus_len < 800000) {
        memcpy(text + len, corpus, corpus_len);
        len += corpus_len;
    }
    ASSERT(tok_check_encode_long(t, "mixed text", text, len));
    /* One stretch with no added token in it: no newline, no double space. */
    for (len = 0; len + 2 <= 400000; len += 2)
        memcpy(text + len, "a ", 2);
    ASSERT(tok_check_encode_long(t, "200k x 'a '", text, len));
    memset(text, 'a', 400000);
    ASSERT(tok_check_encode_long(t, "400k x 'a'", text, 400000));
    memset(text, ' ', 400000);
    ASSERT(tok_check_encode_long(t, "400k spaces", text, 400000));
    for (len = 0; len + 4 <= 800000; len += 4)
        memcpy(text + len, "\xF0\x9F\x98\x80", 4);
    ASSERT(tok_check_encode_long(t, "200k emoji", text, len));
    for (len = 0; len + 4 <= 800000; len += 4)
        memcpy(text + len, "\xf3\xb0\x80\x81", 4); /* byte fallback */
    ASSERT(tok_check_encode_long(t, "200k unknown characters", text, len));
    /* 6249 control and 165 user-defined tokens start with '<', '\n', '\t' or ' ' */
    memset(text, '<', 400000);
    ASSERT(tok_check_encode_long(t, "400k x '<'", text, 400000));
    for (len = 0; len + 8 <= 400000; len += 8)
        memcpy(text + len, "<unused9", 8);
    ASSERT(tok_check_encode_long(t, "50k x '<unused9'", text, len));
    for (len = 0; len < 400000; len++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        text[len] = (char)(rng >> 56);
    }
    ASSERT(tok_check_encode_long(t, "400k random bytes", text, len));
    free(text);
    free(corpus);
}

/* ---- small vocabularies built in memory ------------------------------------ */

/* A synthetic SentencePiece file: <unk> (id 0), the 256 <0xXX> byte tokens
 * (ids 1..256, when bytes is set), then piece[] with score[] and type[]. */
#define SYN_MAX 64
struct syn {
    const char *model;
    int bytes;
    int n;
    const char *piece[SYN_MAX];
    float score[SYN_MAX];
    int32_t type[SYN_MAX];
    int scores; /* 0: no scores key; -1: one score too few; 2: scores as int32 */
    int prefix; /* add_space_prefix: -1 absent, 0, 1 */
};

static int32_t syn_id(const struct syn *s, int i)
{
    return 1 + (s->bytes ? 256 : 0) + i;
}

static struct gw_buf syn_file(const struct syn *s)
{
    struct gw_buf w = {0};
    uint64_t n_kv = 0;
    size_t n_kv_at;
    uint64_t n_tok = 1 + (s->bytes ? 256 : 0) + (uint64_t)s->n;
    char name[8];

    gw_bytes(&w, "GGUF", 4);
    gw_u32(&w, 3);
    gw_u64(&w, 0);
    n_kv_at = w.len;
    gw_u64(&w, 0);
    gw_key(&w, "tokenizer.ggml.model", GGUF_TYPE_STRING);
    gw_str(&w, s->model ? s->model : "llama");
    gw_key(&w, "tokenizer.ggml.tokens", GGUF_TYPE_ARRAY);
    gw_u32(&w, GGUF_TYPE_STRING);
    gw_u64(&w, n_tok);
    gw_str(&w, "<unk>");
    for (int b = 0; s->bytes && b < 256; b++) {
        snprintf(name, sizeof name, "<0x%02X>", b);
        gw_str(&w, name);
    }
    for (int i = 0; i < s->n; i++)
        gw_str(&w, s->piece[i]);
    gw_key(&w, "tokenizer.ggml.token_type", GGUF_TYPE_ARRAY);
    gw_u32(&w, GGUF_TYPE_INT32);
    gw_u64(&w, n_tok);
    for (uint64_t i = 0; i < n_tok; i++) {
        int32_t ty = i == 0                   ? 2
                     : (s->bytes && i <= 256) ? 6
                                              : s->type[i - 1 - (s->bytes ? 256 : 0)];
        gw_bytes(&w, &ty, 4);
    }
    n_kv += 3;
    if (s->scores) {
        uint64_t n_sc = s->scores == -1 ? n_tok - 1 : n_tok;
        gw_key(&w, "tokenizer.ggml.scores", GGUF_TYPE_ARRAY);
        gw_u32(&w, s->scores == 2 ? GGUF_TYPE_INT32 : GGUF_TYPE_FLOAT32);
        gw_u64(&w, n_sc);
        for (uint64_t i = 0; i < n_sc; i++) {
            size_t first = 1 + (s->bytes ? 256 : 0);
            float v = i < first ? 0.0f : s->score[i - first];
            gw_bytes(&w, &v, 4);
        }
        n_kv++;
    }
    gw_key(&w, "tokenizer.ggml.unknown_token_id", GGUF_TYPE_UINT32);
    gw_u32(&w, 0);
    n_kv++;
    if (s->prefix >= 0) {
        uint8_t v = (uint8_t)s->prefix;
        gw_key(&w, "tokenizer.ggml.add_space_prefix", GGUF_TYPE_BOOL);
        gw_bytes(&w, &v, 1);
        n_kv++;
    }
    memcpy(w.p + n_kv_at, &n_kv, 8);
    return w;
}

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
    free(w.p);
    return rc;
}

static void syn_add(struct syn *s, const char *piece, float score, int32_t type)
{
    s->piece[s->n] = piece;
    s->score[s->n] = score;
    s->type[s->n] = type;
    s->n++;
}

/* Single characters a b c ▁ (d and é have no piece), merged pieces with
 * scores that tie in places, a control and an unused piece. */
static struct syn syn_default(void)
{
    struct syn s = {.bytes = 1, .scores = 1, .prefix = 0};

    syn_add(&s, "a", -100, 1);
    syn_add(&s, "b", -101, 1);
    syn_add(&s, "c", -102, 1);
    syn_add(&s, SPACE_MARK, -103, 1);
    syn_add(&s, "ab", -1, 1);
    syn_add(&s, "bc", -1, 1); /* ties with ab: the leftmost pair merges */
    syn_add(&s, "ca", -2, 1);
    syn_add(&s, "abc", -3, 1);
    syn_add(&s, "aa", -4, 1);
    syn_add(&s, "aaa", -0.5f, 1); /* better than aa, reachable only through it */
    syn_add(&s, SPACE_MARK "a", -5, 1);
    syn_add(&s, SPACE_MARK SPACE_MARK, -6, 1);
    syn_add(&s, "cab", -7, 1);
    syn_add(&s, "a" SPACE_MARK, -8, 1);
    syn_add(&s, "d" SPACE_MARK, -9, 1); /* d alone is no piece */
    syn_add(&s, "<x", -10, 1);
    syn_add(&s, "<x>", 10, 3);    /* control: never a merge result */
    syn_add(&s, "cc", 20, 5);     /* unused: never a merge result */
    syn_add(&s, "<u>", -1000, 4); /* user-defined: matched whole */
    syn_add(&s, "<", -104, 1);
    syn_add(&s, "x", -105, 1);
    syn_add(&s, ">", -106, 1);
    return s;
}

/* The merge rule written the slow way: after every merge, rescan all pairs
 * for the best (highest score, leftmost) whose text is a NORMAL or
 * USER_DEFINED piece; then pieces or byte fallback. Returns the id count. */
static int oracle(const struct syn *s, const char *text, int32_t *out)
{
    char sym[256][64];
    int ns = 0;
    int n = 0;
    int prefix = s->prefix != 0;
    char norm[512];
    size_t m = 0;

    if (prefix && text[0]) {
        memcpy(norm, SPACE_MARK, 3);
        m = 3;
    }
    for (const char *p = text; *p; p++) {
        if (*p == ' ') {
            memcpy(norm + m, SPACE_MARK, 3);
            m += 3;
        } else {
            norm[m++] = *p;
        }
    }
    for (size_t i = 0; i < m;) {
        unsigned char c = (unsigned char)norm[i];
        size_t l = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
        memcpy(sym[ns], norm + i, l);
        sym[ns++][l] = '\0';
        i += l;
    }
    for (;;) {
        int best = -1;
        float best_score = 0;
        for (int i = 0; i + 1 < ns; i++) {
            char cat[128];
            size_t la = strlen(sym[i]);
            size_t lb = strlen(sym[i + 1]);
            if (la + lb >= sizeof cat)
                continue;
            memcpy(cat, sym[i], la);
            memcpy(cat + la, sym[i + 1], lb + 1);
            for (int k = 0; k < s->n; k++) {
                if ((s->type[k] == 1 || s->type[k] == 4) && strcmp(s->piece[k], cat) == 0 &&
                    (best < 0 || s->score[k] > best_score)) {
                    best = i;
                    best_score = s->score[k];
                }
            }
        }
        if (best < 0)
            break;
        {
            size_t la = strlen(sym[best]);
            size_t lb = strlen(sym[best + 1]);
            memcpy(sym[best] + la, sym[best + 1], lb + 1); /* a piece: fits */
        }
        memmove(sym[best + 1], sym[best + 2], (size_t)(ns - best - 2) * sizeof sym[0]);
        ns--;
    }
    for (int i = 0; i < ns; i++) {
        int id = -1;
        for (int k = 0; k < s->n; k++) {
            if ((s->type[k] == 1 || s->type[k] == 4) && strcmp(s->piece[k], sym[i]) == 0)
                id = syn_id(s, k);
        }
        if (id >= 0) {
            out[n++] = id;
        } else {
            for (const char *p = sym[i]; *p; p++)
                out[n++] = 1 + (unsigned char)*p;
        }
    }
    return n;
}

TEST(spm_merges_highest_score_first_leftmost_on_ties_as_a_brute_force_oracle)
{
    static const char *const alphabet[] = {"a", "b", "c", " ", "d", "\xc3\xa9", "<", "x", ">"};
    struct syn s = syn_default();
    struct tokenizer *t;
    char err[256];
    uint64_t rng = 42;
    int checked = 0;

    ASSERT_OK(syn_load(&s, &t, err, sizeof err));
    for (int prefix = 0; prefix < 2; prefix++) {
        s.prefix = prefix;
        tok_free(t);
        ASSERT_OK(syn_load(&s, &t, err, sizeof err));
        for (int trial = 0; trial < 4000; trial++) {
            char text[128] = "";
            int32_t want[512];
            int32_t got[512];
            int len = (int)(trial % 40);
            int nw;
            int64_t ng;

            for (int i = 0; i < len; i++) {
                rng = rng * 6364136223846793005ull + 1442695040888963407ull;
                strcat(text, alphabet[(rng >> 33) % (trial < 2000 ? 4 : 9)]);
            }
            nw = oracle(&s, text, want);
            ng = tok_encode(t, text, strlen(text), 0, 0, got, 512);
            if (ng != nw || memcmp(got, want, (size_t)nw * sizeof *got) != 0) {
                fprintf(stderr, "  prefix=%d: %lld ids, oracle %d\n", prefix, (long long)ng, nw);
                tok_check_print_text(text, strlen(text));
            }
            ASSERT_EQ(ng, nw);
            ASSERT(memcmp(got, want, (size_t)nw * sizeof *got) == 0);
            checked++;
        }
    }
    printf("  %d random strings agree with the oracle\n", checked);
    tok_free(t);
}

static int ids_are(const struct tokenizer *t, const char *text, int special, const int32_t *want,
                   int n)
{
    int32_t got[64];
    int64_t ng = tok_encode(t, text, strlen(text), 0, special, got, 64);

    if (ng != n || memcmp(got, want, (size_t)n * sizeof *got) != 0) {
        fprintf(stderr, "  \"%s\":", text);
        for (int64_t i = 0; i < ng && i < 64; i++)
            fprintf(stderr, " %d", got[i]);
        fputc('\n', stderr);
        return 0;
    }
    return 1;
}

TEST(spm_merge_rules_ties_types_prefix_and_fallback)
{
    struct syn s = syn_default();
    struct tokenizer *t;
    char err[256];
    size_t len;
    const char *p;
    const int32_t a = syn_id(&s, 0), b = syn_id(&s, 1), c = syn_id(&s, 2);
    const int32_t ab = syn_id(&s, 4), aaa = syn_id(&s, 9), sp_a = syn_id(&s, 10);
    const int32_t lt_x = syn_id(&s, 15), ctl = syn_id(&s, 16), user = syn_id(&s, 18);
    const int32_t gt = syn_id(&s, 21);

    ASSERT_OK(syn_load(&s, &t, err, sizeof err));
    /* "abc": ab and bc tie; the left pair wins, then abc (score -3) needs ab+c */
    ASSERT(ids_are(t, "abc", 0, (int32_t[]){syn_id(&s, 7)}, 1));
    /* "bca": bc (-1) beats ca (-2) */
    ASSERT(ids_are(t, "bca", 0, (int32_t[]){syn_id(&s, 5), a}, 2));
    /* aaa scores best but is reached only through aa */
    ASSERT(ids_are(t, "aaa", 0, (int32_t[]){aaa}, 1));
    ASSERT(ids_are(t, " a", 0, (int32_t[]){sp_a}, 1));
    /* the control <x> is not a merge result; the user-defined <u> is matched whole */
    ASSERT(ids_are(t, "<x>", 0, (int32_t[]){lt_x, gt}, 2));
    ASSERT(ids_are(t, "<x>", 1, (int32_t[]){ctl}, 1));
    ASSERT(ids_are(t, "a<u>b", 0, (int32_t[]){a, user, b}, 3));
    /* the unused cc is not a merge result either */
    ASSERT(ids_are(t, "cc", 0, (int32_t[]){c, c}, 2));
    /* d has no piece: its byte; é: two bytes */
    ASSERT(ids_are(t, "d\xc3\xa9", 0, (int32_t[]){1 + 'd', 1 + 0xc3, 1 + 0xa9}, 3));
    /* pieces: ▁ is a space, a byte token its byte */
    p = tok_piece(t, sp_a, &len);
    ASSERT(p && len == 2 && memcmp(p, " a", 2) == 0);
    p = tok_piece(t, 1 + 0xc3, &len);
    ASSERT(p && len == 1 && (unsigned char)p[0] == 0xc3);
    ASSERT(ids_are(t, "ab", 0, (int32_t[]){ab}, 1));
    tok_free(t);

    /* add_space_prefix (absent means on, as llama.cpp): only where the text starts */
    s.prefix = -1;
    ASSERT_OK(syn_load(&s, &t, err, sizeof err));
    ASSERT(ids_are(t, "a", 0, (int32_t[]){sp_a}, 1));
    ASSERT(ids_are(t, "a<u>a", 0, (int32_t[]){sp_a, user, a}, 3));
    ASSERT(ids_are(t, "", 0, (int32_t[]){0}, 0));
    tok_free(t);

    /* no byte tokens: a character without a piece is the unknown token */
    s = syn_default();
    s.bytes = 0;
    ASSERT_OK(syn_load(&s, &t, err, sizeof err));
    ASSERT(ids_are(t, "adb", 0, (int32_t[]){syn_id(&s, 0), 0, syn_id(&s, 1)}, 3));
    tok_free(t);
}

TEST(spm_rejects_bad_metadata_with_a_message)
{
    struct syn s;
    struct tokenizer *t;
    char err[256];

    s = syn_default();
    s.scores = 0;
    ASSERT_EQ(syn_load(&s, &t, err, sizeof err), -EINVAL);
    ASSERT(t == NULL && strstr(err, "tokenizer.ggml.scores") != NULL);
    s.scores = -1;
    ASSERT_EQ(syn_load(&s, &t, err, sizeof err), -EINVAL);
    ASSERT(strstr(err, "count") != NULL);
    s.scores = 2;
    ASSERT_EQ(syn_load(&s, &t, err, sizeof err), -EINVAL);
    ASSERT(strstr(err, "float") != NULL);
    s = syn_default();
    s.model = "bert";
    ASSERT_EQ(syn_load(&s, &t, err, sizeof err), -EINVAL);
    ASSERT(strstr(err, "llama") != NULL && strstr(err, "gpt2") != NULL);
}

TEST(spm_survives_truncated_and_corrupted_files)
{
    struct syn s = syn_default();
    struct gw_buf w = syn_file(&s);
    uint8_t *copy = malloc(w.len);
    uint64_t rng = 0x9E3779B97F4A7C15ull;
    int loaded = 0;
    static const char text[] = "x<x>y abc <u>b \xe4\xb8\xad!\xff";

    ASSERT(copy);
    for (int trial = 0; trial < 3000; trial++) {
        struct gguf_file g;
        struct tokenizer *t = NULL;
        char err[256];
        size_t len = w.len;

        memcpy(copy, w.p, w.len);
        if (trial < 1000) {
            len = (size_t)trial * w.len / 1000;
        } else {
            for (int k = 0; k < 1 + trial % 8; k++) {
                rng = rng * 6364136223846793005ull + 1442695040888963407ull;
                copy[(rng >> 33) % w.len] = (uint8_t)(rng >> 20);
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

TEST_MAIN()
