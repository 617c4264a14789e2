/*
 * test_gguf.c: the GGUF parser (engine/gguf.c) on the real SmolLM2 file and on
 * small files built in memory by the writer below, which can also build the
 * broken files the parser must reject. Robustness tests truncate and corrupt
 * both kinds of file; run under ASan/UBSan, "never crashes" means no report.
 *
 * The real-model tests print a note and pass when the file is absent (see
 * test_model_path() in test.h), so the synthetic tests still count.
 *
 * With STREAMSINK_GGUF_SEED_DIR=dir set, the seed test writes the synthetic
 * files into dir as a corpus for tests/fuzz/fuzz_gguf_parse.
 */
#include "test.h"

#include "gguf.h"
#include "quant.h"

#include <errno.h>

/* ---- a tiny GGUF writer ------------------------------------------------- */

struct wbuf {
    uint8_t *p;
    size_t len;
    size_t cap;
};

static void w_bytes(struct wbuf *w, const void *src, size_t n)
{
    if (w->len + n > w->cap) {
        size_t cap = w->cap ? w->cap : 256;
        while (cap < w->len + n)
            cap *= 2;
        uint8_t *p = realloc(w->p, cap);
        if (!p) {
            fprintf(stderr, "test_gguf: out of memory\n");
            exit(1);
        }
        w->p = p;
        w->cap = cap;
    }
    memcpy(w->p + w->len, src, n);
    w->len += n;
}

static void w_u8(struct wbuf *w, uint8_t v)
{
    w_bytes(w, &v, 1);
}
static void w_u16(struct wbuf *w, uint16_t v)
{
    w_bytes(w, &v, 2);
}
static void w_u32(struct wbuf *w, uint32_t v)
{
    w_bytes(w, &v, 4);
}
static void w_u64(struct wbuf *w, uint64_t v)
{
    w_bytes(w, &v, 8);
}
static void w_f32(struct wbuf *w, float v)
{
    w_bytes(w, &v, 4);
}
static void w_f64(struct wbuf *w, double v)
{
    w_bytes(w, &v, 8);
}
static void w_str(struct wbuf *w, const char *s)
{
    w_u64(w, strlen(s));
    w_bytes(w, s, strlen(s));
}
/* A key and its value type; the value follows. Returns 1, one more pair. */
static int w_key(struct wbuf *w, const char *key, enum gguf_type t)
{
    w_str(w, key);
    w_u32(w, t);
    return 1;
}
static void w_arr(struct wbuf *w, enum gguf_type et, uint64_t n)
{
    w_u32(w, et);
    w_u64(w, n);
}

struct tspec {
    const char *name;
    uint32_t n_dims;
    int64_t ne[4];
    uint32_t type;
    int64_t offset; /* -1: next aligned offset after the previous tensor */
};

/* Writes the key/value section; returns the number of pairs written. */
typedef int (*kv_writer)(struct wbuf *w);

static uint64_t tspec_nbytes(const struct tspec *t)
{
    /* unsupported types: any size, the parser stops before it matters */
    uint64_t n = qtype_supported((int)t->type) ? qtype_row_bytes((int)t->type, t->ne[0]) : 64;
    for (uint32_t d = 1; d < t->n_dims && d < 4; d++)
        n *= (uint64_t)t->ne[d];
    return n;
}

static uint64_t align_up(uint64_t x, uint64_t a)
{
    return (x + a - 1) / a * a;
}

/* Builds a GGUF file: header, kvs from kvw (may be NULL), the tensor
 * directory of ts[0..nt), padding to align, and data ending exactly at the
 * last tensor's end. Tensor data bytes are (offset + i) * 7 + 1 mod 256. */
static struct wbuf build(uint32_t version, kv_writer kvw, const struct tspec *ts, int nt,
                         uint64_t align)
{
    struct wbuf w = {0};
    uint64_t off[64], end = 0, next = 0;
    size_t nkv_at;

    w_u32(&w, 0x46554747u);
    w_u32(&w, version);
    w_u64(&w, (uint64_t)nt);
    nkv_at = w.len;
    w_u64(&w, 0);
    if (kvw) {
        uint64_t nkv = (uint64_t)kvw(&w);
        memcpy(w.p + nkv_at, &nkv, 8);
    }
    for (int i = 0; i < nt; i++) {
        off[i] = ts[i].offset >= 0 ? (uint64_t)ts[i].offset : align_up(next, align);
        next = off[i] + tspec_nbytes(&ts[i]);
        if (next > end)
            end = next;
        w_str(&w, ts[i].name);
        w_u32(&w, ts[i].n_dims);
        for (uint32_t d = 0; d < ts[i].n_dims; d++)
            w_u64(&w, d < 4 ? (uint64_t)ts[i].ne[d] : 1);
        w_u32(&w, ts[i].type);
        w_u64(&w, off[i]);
    }
    if (nt > 0) {
        while (w.len % align)
            w_u8(&w, 0);
        if (end > (1u << 20)) /* absurd shapes and offsets: the parser must stop anyway */
            end = 0;
        for (uint64_t i = 0; i < end; i++)
            w_u8(&w, (uint8_t)(i * 7 + 1));
    }
    return w;
}

static int parse(struct gguf_file *g, const struct wbuf *w, char *err, size_t err_len)
{
    return gguf_parse(g, w->p, w->len, err, err_len);
}

/* ---- the sample file: every type the format has ------------------------- */

static int kvs_every_type(struct wbuf *w)
{
    int n = 0;

    n += w_key(w, "general.architecture", GGUF_TYPE_STRING);
    w_str(w, "llama");
    n += w_key(w, "t.u8", GGUF_TYPE_UINT8);
    w_u8(w, 200);
    n += w_key(w, "t.i8", GGUF_TYPE_INT8);
    w_u8(w, (uint8_t)(int8_t)-5);
    n += w_key(w, "t.u16", GGUF_TYPE_UINT16);
    w_u16(w, 60000);
    n += w_key(w, "t.i16", GGUF_TYPE_INT16);
    w_u16(w, (uint16_t)(int16_t)-30000);
    n += w_key(w, "t.u32", GGUF_TYPE_UINT32);
    w_u32(w, 4000000000u);
    n += w_key(w, "t.i32", GGUF_TYPE_INT32);
    w_u32(w, (uint32_t)(int32_t)-2000000000);
    n += w_key(w, "t.f32", GGUF_TYPE_FLOAT32);
    w_f32(w, 1.5f);
    n += w_key(w, "t.bool", GGUF_TYPE_BOOL);
    w_u8(w, 1);
    n += w_key(w, "t.str", GGUF_TYPE_STRING);
    w_str(w, "hello, world");
    n += w_key(w, "t.empty_str", GGUF_TYPE_STRING);
    w_str(w, "");
    n += w_key(w, "t.u64", GGUF_TYPE_UINT64);
    w_u64(w, UINT64_MAX);
    n += w_key(w, "t.i64", GGUF_TYPE_INT64);
    w_u64(w, 0 - (1ull << 40));
    n += w_key(w, "t.f64", GGUF_TYPE_FLOAT64);
    w_f64(w, 2.25);

    n += w_key(w, "a.u8", GGUF_TYPE_ARRAY);
    w_arr(w, GGUF_TYPE_UINT8, 3);
    w_u8(w, 1);
    w_u8(w, 2);
    w_u8(w, 255);
    n += w_key(w, "a.i16", GGUF_TYPE_ARRAY);
    w_arr(w, GGUF_TYPE_INT16, 2);
    w_u16(w, (uint16_t)(int16_t)-7);
    w_u16(w, 7);
    n += w_key(w, "a.i32", GGUF_TYPE_ARRAY);
    w_arr(w, GGUF_TYPE_INT32, 4);
    w_u32(w, 1);
    w_u32(w, (uint32_t)-2);
    w_u32(w, 3);
    w_u32(w, (uint32_t)INT32_MIN);
    n += w_key(w, "a.u32_big", GGUF_TYPE_ARRAY);
    w_arr(w, GGUF_TYPE_UINT32, 2);
    w_u32(w, 5);
    w_u32(w, 3000000000u);
    n += w_key(w, "a.i64", GGUF_TYPE_ARRAY);
    w_arr(w, GGUF_TYPE_INT64, 2);
    w_u64(w, 9);
    w_u64(w, (uint64_t)-9);
    n += w_key(w, "a.f32", GGUF_TYPE_ARRAY);
    w_arr(w, GGUF_TYPE_FLOAT32, 3);
    w_f32(w, 0.5f);
    w_f32(w, -1.25f);
    w_f32(w, 1e30f);
    n += w_key(w, "a.f64", GGUF_TYPE_ARRAY);
    w_arr(w, GGUF_TYPE_FLOAT64, 2);
    w_f64(w, 0.125);
    w_f64(w, -3.0);
    n += w_key(w, "a.bool", GGUF_TYPE_ARRAY);
    w_arr(w, GGUF_TYPE_BOOL, 2);
    w_u8(w, 0);
    w_u8(w, 1);
    n += w_key(w, "a.str", GGUF_TYPE_ARRAY);
    w_arr(w, GGUF_TYPE_STRING, 3);
    w_str(w, "alpha");
    w_str(w, "");
    w_str(w, "gamma");
    n += w_key(w, "a.empty", GGUF_TYPE_ARRAY);
    w_arr(w, GGUF_TYPE_INT32, 0);
    /* an array of arrays: [[1,2,3], ["x","yz"], [[]]] */
    n += w_key(w, "a.nested", GGUF_TYPE_ARRAY);
    w_arr(w, GGUF_TYPE_ARRAY, 3);
    w_arr(w, GGUF_TYPE_UINT32, 3);
    w_u32(w, 1);
    w_u32(w, 2);
    w_u32(w, 3);
    w_arr(w, GGUF_TYPE_STRING, 2);
    w_str(w, "x");
    w_str(w, "yz");
    w_arr(w, GGUF_TYPE_ARRAY, 1);
    w_arr(w, GGUF_TYPE_FLOAT64, 0);
    n += w_key(w, "t.after_nested", GGUF_TYPE_UINT32);
    w_u32(w, 77);
    return n;
}

static const struct tspec sample_tensors[] = {
    {"tok_embd.weight", 2, {64, 3, 1, 1}, QTYPE_Q8_0, -1},
    {"norm.weight", 1, {5, 1, 1, 1}, QTYPE_F32, -1},
    {"w.q4_1", 2, {32, 2, 1, 1}, QTYPE_Q4_1, -1},
    {"w.q4_0", 3, {32, 1, 2, 1}, QTYPE_Q4_0, -1},
    {"w.f16", 4, {3, 2, 2, 2}, QTYPE_F16, -1},
    {"w.bf16", 2, {7, 1, 1, 1}, QTYPE_BF16, -1},
    {"empty", 2, {0, 4, 1, 1}, QTYPE_F32, -1},
};
#define N_SAMPLE_TENSORS ((int)(sizeof sample_tensors / sizeof sample_tensors[0]))

static struct wbuf sample_file(uint32_t version)
{
    return build(version, kvs_every_type, sample_tensors, N_SAMPLE_TENSORS, 32);
}

/* Every view a parsed file hands out lies inside the span, and every getter
 * answers without crashing. Returns 0 if so. */
static int check_views(const struct gguf_file *g)
{
    const uint8_t *lo = g->base, *hi = g->base + g->len;
    char key[256];

    for (uint64_t i = 0; i < g->n_kv; i++) {
        const struct gguf_kv *kv = &g->kv[i];
        if ((const uint8_t *)kv->key.ptr < lo || kv->key.len > (uint64_t)(hi - lo) ||
            (const uint8_t *)kv->key.ptr + kv->key.len > hi)
            return 1;
        if (kv->val < lo || kv->val_len > (size_t)(hi - kv->val))
            return 1;
        if (kv->key.len >= sizeof key || memchr(kv->key.ptr, 0, kv->key.len))
            continue;
        memcpy(key, kv->key.ptr, kv->key.len);
        key[kv->key.len] = '\0';
        if (gguf_find_kv(g, key) == NULL)
            return 1;
        int64_t iv;
        double fv;
        int bv;
        struct gguf_str s, *sv = NULL;
        int32_t *i32 = NULL;
        float *f32 = NULL;
        uint64_t n;
        char cbuf[16];
        gguf_get_i64(g, key, &iv);
        gguf_get_f64(g, key, &fv);
        gguf_get_bool(g, key, &bv);
        if (gguf_get_str(g, key, &s) == 0 &&
            ((const uint8_t *)s.ptr < lo || s.len > (uint64_t)(hi - (const uint8_t *)s.ptr)))
            return 1;
        gguf_get_cstr(g, key, cbuf, sizeof cbuf);
        if (gguf_get_arr_str(g, key, &sv, &n) == 0) {
            for (uint64_t j = 0; j < n; j++)
                if ((const uint8_t *)sv[j].ptr < lo ||
                    sv[j].len > (uint64_t)(hi - (const uint8_t *)sv[j].ptr))
                    return 1;
            free(sv);
        }
        if (gguf_get_arr_i32(g, key, &i32, &n) == 0)
            free(i32);
        if (gguf_get_arr_f32(g, key, &f32, &n) == 0)
            free(f32);
    }
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const struct gguf_tensor *t = &g->tensors[i];
        const uint8_t *d = t->data;
        if (d < lo || d > hi || t->nbytes > (size_t)(hi - d))
            return 1;
        if (t->nbytes > 0) { /* touch both ends, so ASan checks them */
            volatile uint8_t ends = d[0] ^ d[t->nbytes - 1];
            (void)ends;
        }
        if (t->n_dims > 4 || t->offset % g->alignment != 0)
            return 1;
    }
    return 0;
}

/* Parses a copy of buf[0..len) in its own allocation, so ASan sees any read
 * past len. Returns the parser's result; the error must be one non-empty line. */
static int parse_copy(const uint8_t *buf, size_t len, int *bad_views)
{
    struct gguf_file g;
    char err[256];
    uint8_t *copy = malloc(len ? len : 1);
    int rc;

    memcpy(copy, buf, len);
    err[0] = 'x';
    err[1] = '\0';
    rc = gguf_parse(&g, copy, len, err, sizeof err);
    if (rc == 0) {
        *bad_views |= check_views(&g);
        gguf_free(&g);
    } else {
        *bad_views |= strncmp(err, "gguf: ", 6) != 0 || strchr(err, '\n') != NULL;
        *bad_views |= g.kv != NULL || g.tensors != NULL;
    }
    free(copy);
    return rc;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng_next(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* Overwrites 1..4 random bytes of buf[0..span) with values that often break
 * lengths and counts (0, 0xff, a flipped bit, anything); their positions go
 * to at[] (room for 4). Returns how many. */
static int corrupt(uint8_t *buf, size_t span, size_t *at)
{
    int k = 1 + (int)(rng_next() % 4);
    for (int i = 0; i < k; i++) {
        at[i] = (size_t)(rng_next() % span);
        switch (rng_next() % 4) {
        case 0:
            buf[at[i]] = 0;
            break;
        case 1:
            buf[at[i]] = 0xff;
            break;
        case 2:
            buf[at[i]] ^= (uint8_t)(1u << (rng_next() % 8));
            break;
        default:
            buf[at[i]] = (uint8_t)rng_next();
            break;
        }
    }
    return k;
}

/* ---- the real model ----------------------------------------------------- */

static uint8_t *real_buf;
static size_t real_len;

/* Reads the real model once; NULL (with a note) if it is not there. */
static const uint8_t *real_model(void)
{
    static int tried;
    if (!tried) {
        tried = 1;
        FILE *f = fopen(test_model_path(), "rb");
        if (f && fseek(f, 0, SEEK_END) == 0) {
            long n = ftell(f);
            if (n > 0 && fseek(f, 0, SEEK_SET) == 0) {
                real_buf = malloc((size_t)n);
                if (real_buf && fread(real_buf, 1, (size_t)n, f) == (size_t)n) {
                    real_len = (size_t)n;
                } else {
                    free(real_buf);
                    real_buf = NULL;
                }
            }
        }
        if (f)
            fclose(f);
    }
    if (!real_buf)
        printf("  note: %s not found; real-model checks not run\n", test_model_path());
    return real_buf;
}

TEST(real_model_parses_with_llama_hparams_and_272_tensors)
{
    const uint8_t *buf = real_model();
    struct gguf_file g;
    char err[256], s[64];
    int64_t v;
    double f;

    if (!buf) {
        TEST_NEED_MODEL();
        FAIL_AT("%s is present but could not be read", test_model_path());
    }
    ASSERT_OK(gguf_parse(&g, buf, real_len, err, sizeof err));
    ASSERT_EQ(g.version, 3);
    ASSERT_EQ(g.n_tensors, 272);
    ASSERT_EQ(g.alignment, 32);
    ASSERT_OK(gguf_get_cstr(&g, "general.architecture", s, sizeof s));
    ASSERT_STREQ(s, "llama");
    ASSERT_OK(gguf_get_i64(&g, "llama.block_count", &v));
    ASSERT_EQ(v, 30);
    ASSERT_OK(gguf_get_i64(&g, "llama.embedding_length", &v));
    ASSERT_EQ(v, 576);
    ASSERT_OK(gguf_get_i64(&g, "llama.attention.head_count", &v));
    ASSERT_EQ(v, 9);
    ASSERT_OK(gguf_get_i64(&g, "llama.attention.head_count_kv", &v));
    ASSERT_EQ(v, 3);
    ASSERT_OK(gguf_get_f64(&g, "llama.rope.freq_base", &f));
    ASSERT_NEAR(f, 1e5, 0);
    ASSERT_OK(gguf_get_cstr(&g, "tokenizer.ggml.pre", s, sizeof s));
    ASSERT_STREQ(s, "smollm");
    ASSERT(gguf_find_kv(&g, "tokenizer.chat_template") != NULL);
    ASSERT_EQ(check_views(&g), 0);
    gguf_free(&g);
}

TEST(real_model_has_a_token_array_of_49152_strings)
{
    const uint8_t *buf = real_model();
    struct gguf_file g;
    struct gguf_str *tok;
    int32_t *types;
    uint64_t n, nt;
    char err[256];

    if (!buf) {
        TEST_NEED_MODEL();
        FAIL_AT("%s is present but could not be read", test_model_path());
    }
    ASSERT_OK(gguf_parse(&g, buf, real_len, err, sizeof err));
    ASSERT_OK(gguf_get_arr_str(&g, "tokenizer.ggml.tokens", &tok, &n));
    ASSERT_EQ(n, 49152);
    ASSERT(gguf_str_eq(tok[0], "<|endoftext|>"));
    ASSERT(gguf_str_eq(tok[1], "<|im_start|>"));
    ASSERT(gguf_str_eq(tok[2], "<|im_end|>"));
    free(tok);
    ASSERT_OK(gguf_get_arr_i32(&g, "tokenizer.ggml.token_type", &types, &nt));
    ASSERT_EQ(nt, 49152);
    ASSERT_EQ(types[0], 3); /* control */
    ASSERT_EQ(types[100], 1);
    free(types);
    ASSERT_OK(gguf_get_arr_str(&g, "tokenizer.ggml.merges", &tok, &n));
    ASSERT_EQ(n, 48900);
    free(tok);
    gguf_free(&g);
}

TEST(real_model_token_embd_is_q8_0_576_by_49152_inside_the_file)
{
    const uint8_t *buf = real_model();
    struct gguf_file g;
    const struct gguf_tensor *t;
    char err[256];

    if (!buf) {
        TEST_NEED_MODEL();
        FAIL_AT("%s is present but could not be read", test_model_path());
    }
    ASSERT_OK(gguf_parse(&g, buf, real_len, err, sizeof err));
    t = gguf_find_tensor(&g, "token_embd.weight");
    ASSERT(t != NULL);
    ASSERT_EQ(t->n_dims, 2);
    ASSERT_EQ(t->ne[0], 576);
    ASSERT_EQ(t->ne[1], 49152);
    ASSERT_EQ(t->type, QTYPE_Q8_0);
    ASSERT_EQ(t->nbytes, (size_t)576 / 32 * 34 * 49152);
    t = gguf_find_tensor(&g, "blk.29.ffn_down.weight");
    ASSERT(t != NULL);
    ASSERT_EQ(t->type, QTYPE_Q4_1);
    ASSERT_EQ(t->ne[0], 1536);
    ASSERT_EQ(t->ne[1], 576);
    t = gguf_find_tensor(&g, "output_norm.weight");
    ASSERT(t != NULL);
    ASSERT_EQ(t->type, QTYPE_F32);
    ASSERT(gguf_find_tensor(&g, "output.weight") == NULL); /* tied embeddings */
    ASSERT(gguf_find_tensor(&g, "blk.30.attn_q.weight") == NULL);
    for (uint64_t i = 0; i < g.n_tensors; i++) {
        const uint8_t *d = g.tensors[i].data;
        ASSERT(d >= buf && d + g.tensors[i].nbytes <= buf + real_len);
        ASSERT_EQ((size_t)(d - buf) % 32, 0);
    }
    gguf_free(&g);
}

/* ---- synthetic files ---------------------------------------------------- */

TEST(sample_file_reads_back_every_scalar_type)
{
    struct wbuf w = sample_file(3);
    struct gguf_file g;
    char err[256], s[8];
    struct gguf_str str;
    int64_t v;
    double f;
    int b;

    ASSERT_OK(parse(&g, &w, err, sizeof err));
    ASSERT_EQ(g.n_kv, 26);
    ASSERT_OK(gguf_get_i64(&g, "t.u8", &v));
    ASSERT_EQ(v, 200);
    ASSERT_OK(gguf_get_i64(&g, "t.i8", &v));
    ASSERT_EQ(v, -5);
    ASSERT_OK(gguf_get_i64(&g, "t.u16", &v));
    ASSERT_EQ(v, 60000);
    ASSERT_OK(gguf_get_i64(&g, "t.i16", &v));
    ASSERT_EQ(v, -30000);
    ASSERT_OK(gguf_get_i64(&g, "t.u32", &v));
    ASSERT_EQ(v, 4000000000LL);
    ASSERT_OK(gguf_get_i64(&g, "t.i32", &v));
    ASSERT_EQ(v, -2000000000LL);
    ASSERT_OK(gguf_get_i64(&g, "t.i64", &v));
    ASSERT_EQ(v, -(1LL << 40));
    ASSERT_OK(gguf_get_f64(&g, "t.f32", &f));
    ASSERT_NEAR(f, 1.5, 0);
    ASSERT_OK(gguf_get_f64(&g, "t.f64", &f));
    ASSERT_NEAR(f, 2.25, 0);
    ASSERT_OK(gguf_get_bool(&g, "t.bool", &b));
    ASSERT_EQ(b, 1);
    ASSERT_OK(gguf_get_str(&g, "t.str", &str));
    ASSERT(gguf_str_eq(str, "hello, world"));
    ASSERT_OK(gguf_get_str(&g, "t.empty_str", &str));
    ASSERT_EQ(str.len, 0);
    ASSERT(gguf_str_eq(str, ""));
    ASSERT_OK(gguf_get_cstr(&g, "t.str", s, sizeof s)); /* truncates to 7 chars */
    ASSERT_STREQ(s, "hello, ");
    ASSERT_OK(gguf_get_i64(&g, "t.after_nested", &v));
    ASSERT_EQ(v, 77);
    gguf_free(&g);
    free(w.p);
}

TEST(getters_convert_integers_only_when_the_value_fits)
{
    struct wbuf w = sample_file(3);
    struct gguf_file g;
    char err[256], s[8];
    int64_t v;
    double f;
    int b;
    struct gguf_str str;

    ASSERT_OK(parse(&g, &w, err, sizeof err));
    ASSERT_EQ(gguf_get_i64(&g, "t.u64", &v), -EINVAL); /* UINT64_MAX does not fit */
    ASSERT_EQ(gguf_get_i64(&g, "t.f32", &v), -EINVAL);
    ASSERT_EQ(gguf_get_i64(&g, "t.bool", &v), -EINVAL);
    ASSERT_EQ(gguf_get_i64(&g, "t.str", &v), -EINVAL);
    ASSERT_EQ(gguf_get_f64(&g, "t.u32", &f), -EINVAL);
    ASSERT_EQ(gguf_get_bool(&g, "t.u8", &b), -EINVAL);
    ASSERT_EQ(gguf_get_str(&g, "t.u8", &str), -EINVAL);
    ASSERT_EQ(gguf_get_str(&g, "a.str", &str), -EINVAL);
    ASSERT_EQ(gguf_get_i64(&g, "no.such.key", &v), -ENOENT);
    ASSERT_EQ(gguf_get_f64(&g, "no.such.key", &f), -ENOENT);
    ASSERT_EQ(gguf_get_bool(&g, "no.such.key", &b), -ENOENT);
    ASSERT_EQ(gguf_get_cstr(&g, "no.such.key", s, sizeof s), -ENOENT);
    ASSERT_EQ(gguf_get_cstr(&g, "t.str", s, 0), -EINVAL);
    ASSERT(gguf_find_kv(&g, "t.u") == NULL); /* prefixes do not match */
    ASSERT(gguf_find_kv(&g, "t.u88") == NULL);
    gguf_free(&g);
    free(w.p);
}

TEST(sample_file_reads_back_every_array_type_and_skips_nested_arrays)
{
    struct wbuf w = sample_file(3);
    struct gguf_file g;
    char err[256];
    int32_t *iv;
    float *fv;
    struct gguf_str *sv;
    uint64_t n;
    const struct gguf_kv *kv;

    ASSERT_OK(parse(&g, &w, err, sizeof err));
    ASSERT_OK(gguf_get_arr_i32(&g, "a.u8", &iv, &n));
    ASSERT_EQ(n, 3);
    ASSERT_EQ(iv[2], 255);
    free(iv);
    ASSERT_OK(gguf_get_arr_i32(&g, "a.i16", &iv, &n));
    ASSERT_EQ(n, 2);
    ASSERT_EQ(iv[0], -7);
    free(iv);
    ASSERT_OK(gguf_get_arr_i32(&g, "a.i32", &iv, &n));
    ASSERT_EQ(n, 4);
    ASSERT_EQ(iv[1], -2);
    ASSERT_EQ(iv[3], INT32_MIN);
    free(iv);
    ASSERT_OK(gguf_get_arr_i32(&g, "a.i64", &iv, &n));
    ASSERT_EQ(iv[1], -9);
    free(iv);
    ASSERT_EQ(gguf_get_arr_i32(&g, "a.u32_big", &iv, &n), -EINVAL); /* 3e9 > INT32_MAX */
    ASSERT_EQ(gguf_get_arr_i32(&g, "a.f32", &iv, &n), -EINVAL);
    ASSERT_EQ(gguf_get_arr_i32(&g, "a.bool", &iv, &n), -EINVAL);
    ASSERT_OK(gguf_get_arr_f32(&g, "a.f32", &fv, &n));
    ASSERT_EQ(n, 3);
    ASSERT_NEAR(fv[1], -1.25, 0);
    ASSERT_NEAR(fv[2], 1e30, 1e23);
    free(fv);
    ASSERT_OK(gguf_get_arr_f32(&g, "a.f64", &fv, &n));
    ASSERT_NEAR(fv[0], 0.125, 0);
    free(fv);
    ASSERT_EQ(gguf_get_arr_f32(&g, "a.i32", &fv, &n), -EINVAL);
    ASSERT_OK(gguf_get_arr_str(&g, "a.str", &sv, &n));
    ASSERT_EQ(n, 3);
    ASSERT(gguf_str_eq(sv[0], "alpha"));
    ASSERT(gguf_str_eq(sv[1], ""));
    ASSERT(gguf_str_eq(sv[2], "gamma"));
    free(sv);
    ASSERT_EQ(gguf_get_arr_str(&g, "a.i32", &sv, &n), -EINVAL);
    ASSERT_EQ(gguf_get_arr_str(&g, "t.str", &sv, &n), -EINVAL);
    ASSERT_OK(gguf_get_arr_i32(&g, "a.empty", &iv, &n));
    ASSERT_EQ(n, 0);
    free(iv);
    kv = gguf_find_kv(&g, "a.nested");
    ASSERT(kv != NULL);
    ASSERT_EQ(kv->type, GGUF_TYPE_ARRAY);
    ASSERT_EQ(kv->arr_type, GGUF_TYPE_ARRAY);
    ASSERT_EQ(kv->arr_len, 3);
    /* [u32 x3] = 12+12, [str "x","yz"] = 12+9+10, [[f64 x0]] = 12+12 */
    ASSERT_EQ(kv->val_len, 24 + 31 + 24);
    ASSERT_EQ(gguf_get_arr_i32(&g, "a.nested", &iv, &n), -EINVAL);
    kv = gguf_find_kv(&g, "a.bool");
    ASSERT_EQ(kv->arr_type, GGUF_TYPE_BOOL);
    ASSERT_EQ(kv->val_len, 2);
    ASSERT_EQ(kv->val[1], 1);
    gguf_free(&g);
    free(w.p);
}

TEST(sample_tensors_have_their_shapes_sizes_and_data)
{
    struct wbuf w = sample_file(3);
    struct gguf_file g;
    char err[256];
    static const size_t nbytes[] = {3 * 68, 5 * 4, 2 * 20, 2 * 18, 24 * 2, 7 * 2, 0};
    const uint8_t *data_start;

    ASSERT_OK(parse(&g, &w, err, sizeof err));
    ASSERT_EQ(g.n_tensors, N_SAMPLE_TENSORS);
    data_start = (const uint8_t *)g.tensors[0].data;
    ASSERT_EQ((size_t)(data_start - w.p) % 32, 0);
    for (int i = 0; i < N_SAMPLE_TENSORS; i++) {
        const struct gguf_tensor *t = gguf_find_tensor(&g, sample_tensors[i].name);
        const uint8_t *d;
        ASSERT(t == &g.tensors[i]);
        ASSERT_EQ(t->type, sample_tensors[i].type);
        ASSERT_EQ(t->n_dims, sample_tensors[i].n_dims);
        for (int k = 0; k < 4; k++)
            ASSERT_EQ(t->ne[k], sample_tensors[i].ne[k]);
        ASSERT_EQ(t->nbytes, nbytes[i]);
        ASSERT_EQ(t->offset % 32, 0);
        d = t->data;
        ASSERT(d == data_start + t->offset);
        if (t->nbytes)
            ASSERT_EQ(d[0], (uint8_t)(t->offset * 7 + 1));
    }
    ASSERT(gguf_find_tensor(&g, "tok_embd") == NULL);
    ASSERT(gguf_find_tensor(&g, "") == NULL);
    gguf_free(&g);
    free(w.p);
}

TEST(version_2_and_version_3_files_parse_the_same)
{
    struct wbuf w2 = sample_file(2), w3 = sample_file(3);
    struct gguf_file g2, g3;
    char err[256];

    ASSERT_OK(parse(&g2, &w2, err, sizeof err));
    ASSERT_OK(parse(&g3, &w3, err, sizeof err));
    ASSERT_EQ(g2.version, 2);
    ASSERT_EQ(g3.version, 3);
    ASSERT_EQ(g2.n_kv, g3.n_kv);
    ASSERT_EQ(g2.n_tensors, g3.n_tensors);
    for (uint64_t i = 0; i < g2.n_kv; i++) {
        ASSERT_EQ(g2.kv[i].val_len, g3.kv[i].val_len);
        ASSERT(memcmp(g2.kv[i].val, g3.kv[i].val, g2.kv[i].val_len) == 0);
    }
    for (uint64_t i = 0; i < g2.n_tensors; i++) {
        ASSERT_EQ(g2.tensors[i].offset, g3.tensors[i].offset);
        ASSERT_EQ(g2.tensors[i].nbytes, g3.tensors[i].nbytes);
    }
    gguf_free(&g2);
    gguf_free(&g3);
    free(w2.p);
    free(w3.p);
}

static int kvs_align_64(struct wbuf *w)
{
    w_key(w, "general.alignment", GGUF_TYPE_UINT32);
    w_u32(w, 64);
    return 1;
}
static int kvs_align_48(struct wbuf *w)
{
    w_key(w, "general.alignment", GGUF_TYPE_UINT32);
    w_u32(w, 48);
    return 1;
}
static int kvs_align_0(struct wbuf *w)
{
    w_key(w, "general.alignment", GGUF_TYPE_UINT32);
    w_u32(w, 0);
    return 1;
}
static int kvs_align_str(struct wbuf *w)
{
    w_key(w, "general.alignment", GGUF_TYPE_STRING);
    w_str(w, "32");
    return 1;
}
static int kvs_align_huge(struct wbuf *w)
{
    w_key(w, "general.alignment", GGUF_TYPE_UINT64);
    w_u64(w, 1ull << 63);
    return 1;
}
static int kvs_align_2_62(struct wbuf *w)
{
    w_key(w, "general.alignment", GGUF_TYPE_UINT64);
    w_u64(w, 1ull << 62);
    return 1;
}
static int kvs_align_1(struct wbuf *w)
{
    w_key(w, "general.alignment", GGUF_TYPE_UINT64);
    w_u64(w, 1);
    return 1;
}

static const struct tspec two_tensors[] = {
    {"a", 1, {8, 1, 1, 1}, QTYPE_F32, -1},
    {"b", 2, {32, 2, 1, 1}, QTYPE_Q8_0, -1},
};

TEST(general_alignment_moves_the_data_section_and_the_offsets)
{
    struct wbuf w = build(3, kvs_align_64, two_tensors, 2, 64);
    struct gguf_file g;
    char err[256];

    ASSERT_OK(parse(&g, &w, err, sizeof err));
    ASSERT_EQ(g.alignment, 64);
    ASSERT_EQ(g.tensors[1].offset, 64);
    ASSERT_EQ(((const uint8_t *)g.tensors[0].data - w.p) % 64, 0);
    ASSERT_EQ(((const uint8_t *)g.tensors[1].data - w.p) % 64, 0);
    gguf_free(&g);
    free(w.p);

    w = build(3, kvs_align_1, two_tensors, 2, 1); /* packed: no padding at all */
    ASSERT_OK(parse(&g, &w, err, sizeof err));
    ASSERT_EQ(g.alignment, 1);
    ASSERT_EQ(g.tensors[1].offset, 32);
    gguf_free(&g);
    free(w.p);
}

TEST(default_alignment_is_32_and_the_data_section_starts_rounded_up)
{
    struct wbuf w = build(3, NULL, two_tensors, 2, 32);
    struct gguf_file g;
    char err[256];
    /* header 24 + "a" (8+1+4+8+4+8 = 33) + "b" (8+1+4+16+4+8 = 41) = 98 -> 128 */
    ASSERT_OK(parse(&g, &w, err, sizeof err));
    ASSERT_EQ(g.alignment, 32);
    ASSERT_EQ((const uint8_t *)g.tensors[0].data - w.p, 128);
    gguf_free(&g);
    free(w.p);
}

TEST(file_without_tensors_or_keys_parses)
{
    struct wbuf w = build(3, NULL, NULL, 0, 32);
    struct gguf_file g;
    char err[256];

    ASSERT_EQ(w.len, 24);
    ASSERT_OK(parse(&g, &w, err, sizeof err));
    ASSERT_EQ(g.n_kv, 0);
    ASSERT_EQ(g.n_tensors, 0);
    ASSERT(gguf_find_kv(&g, "x") == NULL);
    ASSERT(gguf_find_tensor(&g, "x") == NULL);
    gguf_free(&g);
    gguf_free(&g); /* twice is fine */
    free(w.p);
}

/* ---- rejected files: the error names the problem ----------------------- */

/* Parses w, expects -EINVAL and an error containing want. */
#define ASSERT_REJECTS(w, want)                                                                    \
    do {                                                                                           \
        struct gguf_file g_;                                                                       \
        char e_[256];                                                                              \
        int rc_ = parse(&g_, &(w), e_, sizeof e_);                                                 \
        if (rc_ != -EINVAL)                                                                        \
            FAIL_AT("expected -EINVAL for \"%s\", got %d", want, rc_);                             \
        if (!strstr(e_, want))                                                                     \
            FAIL_AT("error \"%s\" does not mention \"%s\"", e_, want);                             \
        if (g_.kv || g_.tensors)                                                                   \
            FAIL_AT("%s", "g not freed after an error");                                           \
        printf("    %s\n", e_);                                                                    \
    } while (0)

static void put_u32_at(struct wbuf *w, size_t at, uint32_t v)
{
    memcpy(w->p + at, &v, 4);
}
static void put_u64_at(struct wbuf *w, size_t at, uint64_t v)
{
    memcpy(w->p + at, &v, 8);
}

TEST(bad_magic_is_rejected)
{
    struct wbuf w = sample_file(3);
    w.p[0] = 'X';
    ASSERT_REJECTS(w, "bad magic");
    w.len = 3;
    ASSERT_REJECTS(w, "bad magic");
    w.len = 0;
    ASSERT_REJECTS(w, "bad magic");
    free(w.p);
}

TEST(versions_1_and_4_and_big_endian_files_are_rejected)
{
    struct wbuf w = sample_file(3);
    put_u32_at(&w, 4, 1);
    ASSERT_REJECTS(w, "unsupported version 1");
    put_u32_at(&w, 4, 4);
    ASSERT_REJECTS(w, "unsupported version 4");
    put_u32_at(&w, 4, 0x03000000u);
    ASSERT_REJECTS(w, "big-endian");
    free(w.p);
}

TEST(absurd_counts_are_rejected_before_allocating)
{
    struct wbuf w = sample_file(3);
    put_u64_at(&w, 8, UINT64_MAX);
    ASSERT_REJECTS(w, "cannot fit");
    put_u64_at(&w, 8, 1ull << 40);
    ASSERT_REJECTS(w, "cannot fit");
    put_u64_at(&w, 8, N_SAMPLE_TENSORS);
    put_u64_at(&w, 16, UINT64_MAX / 2);
    ASSERT_REJECTS(w, "cannot fit");
    free(w.p);
}

static int kvs_huge_array(struct wbuf *w)
{
    w_key(w, "a", GGUF_TYPE_ARRAY);
    w_arr(w, GGUF_TYPE_UINT32, 1ull << 62);
    w_u32(w, 1);
    return 1;
}
static int kvs_huge_str_array(struct wbuf *w)
{
    w_key(w, "tokens", GGUF_TYPE_ARRAY);
    w_arr(w, GGUF_TYPE_STRING, 3);
    w_str(w, "a");
    w_u64(w, UINT64_MAX - 3);
    w_str(w, "c");
    return 1;
}
static int kvs_huge_string(struct wbuf *w)
{
    w_key(w, "s", GGUF_TYPE_STRING);
    w_u64(w, 1ull << 63);
    w_u32(w, 0);
    return 1;
}
static int kvs_huge_key(struct wbuf *w)
{
    w_u64(w, 1000);
    w_bytes(w, "abc", 3);
    return 1;
}
static int kvs_unknown_type(struct wbuf *w)
{
    w_key(w, "weird", (enum gguf_type)13);
    w_u32(w, 0);
    return 1;
}
static int kvs_unknown_elem_type(struct wbuf *w)
{
    w_key(w, "weird", GGUF_TYPE_ARRAY);
    w_arr(w, (enum gguf_type)99, 1);
    w_u32(w, 0);
    return 1;
}
static int kvs_deep_nesting(struct wbuf *w)
{
    w_key(w, "deep", GGUF_TYPE_ARRAY);
    for (int i = 0; i < 40; i++)
        w_arr(w, GGUF_TYPE_ARRAY, 1);
    w_arr(w, GGUF_TYPE_UINT8, 0);
    return 1;
}
static int kvs_duplicate_key(struct wbuf *w)
{
    w_key(w, "k", GGUF_TYPE_UINT8);
    w_u8(w, 1);
    w_key(w, "j", GGUF_TYPE_UINT8);
    w_u8(w, 2);
    w_key(w, "k", GGUF_TYPE_UINT8);
    w_u8(w, 3);
    return 3;
}

TEST(lengths_past_the_end_of_the_file_are_rejected)
{
    struct wbuf w = build(3, kvs_huge_array, two_tensors, 2, 32);
    ASSERT_REJECTS(w, "key 'a': array of 4611686018427387904 u32 values");
    free(w.p);
    w = build(3, kvs_huge_str_array, two_tensors, 2, 32);
    ASSERT_REJECTS(w, "key 'tokens': string 1 of 3 runs past end of file");
    free(w.p);
    w = build(3, kvs_huge_string, two_tensors, 2, 32);
    ASSERT_REJECTS(w, "key 's': string value runs past end of file");
    free(w.p);
    w = build(3, kvs_huge_key, two_tensors, 2, 32);
    ASSERT_REJECTS(w, "key 0 of 1 runs past end of file");
    free(w.p);
}

TEST(unknown_value_types_and_deep_nesting_are_rejected)
{
    struct wbuf w = build(3, kvs_unknown_type, two_tensors, 2, 32);
    ASSERT_REJECTS(w, "key 'weird': unknown value type 13");
    free(w.p);
    w = build(3, kvs_unknown_elem_type, two_tensors, 2, 32);
    ASSERT_REJECTS(w, "unknown element type 99");
    free(w.p);
    w = build(3, kvs_deep_nesting, two_tensors, 2, 32);
    ASSERT_REJECTS(w, "arrays nested deeper than");
    free(w.p);
}

TEST(duplicate_keys_are_rejected)
{
    struct wbuf w = build(3, kvs_duplicate_key, two_tensors, 2, 32);
    ASSERT_REJECTS(w, "duplicate key 'k'");
    free(w.p);
}

TEST(alignment_that_is_not_a_power_of_two_is_rejected)
{
    struct wbuf w = build(3, kvs_align_48, two_tensors, 2, 48);
    ASSERT_REJECTS(w, "general.alignment 48 is not a power of two");
    free(w.p);
    w = build(3, kvs_align_0, two_tensors, 2, 32);
    ASSERT_REJECTS(w, "general.alignment 0 is not a power of two");
    free(w.p);
    w = build(3, kvs_align_str, two_tensors, 2, 32);
    ASSERT_REJECTS(w, "general.alignment has type string");
    free(w.p);
    w = build(3, kvs_align_huge, two_tensors, 2, 32);
    ASSERT_REJECTS(w, "general.alignment is too large");
    free(w.p);
    w = build(3, kvs_align_2_62, two_tensors, 2, 32); /* a power of two, but past the end */
    ASSERT_REJECTS(w, "data section (at 135, aligned to 4611686018427387904) starts past end");
    free(w.p);
}

TEST(misaligned_tensor_offset_is_rejected)
{
    const struct tspec ts[] = {
        {"a", 1, {8, 1, 1, 1}, QTYPE_F32, 0},
        {"blk.0.attn_q.weight", 2, {32, 2, 1, 1}, QTYPE_Q8_0, 36},
    };
    struct wbuf w = build(3, NULL, ts, 2, 32);
    ASSERT_REJECTS(w, "tensor 'blk.0.attn_q.weight' offset 36 is not aligned to 32 bytes");
    free(w.p);
}

TEST(overlapping_tensors_are_rejected)
{
    const struct tspec ts[] = {
        {"first", 1, {64, 1, 1, 1}, QTYPE_F32, 0},
        {"second", 1, {8, 1, 1, 1}, QTYPE_F32, 128},
        {"empty", 1, {0, 1, 1, 1}, QTYPE_F32, 64}, /* zero bytes overlap nothing */
    };
    struct wbuf w = build(3, NULL, ts, 3, 32);
    ASSERT_REJECTS(w, "tensors 'first' [offset 0, 256 bytes] and 'second' [offset 128, 32 "
                      "bytes] overlap");
    free(w.p);
    const struct tspec same[] = {
        {"x", 1, {8, 1, 1, 1}, QTYPE_F32, 0},
        {"y", 1, {8, 1, 1, 1}, QTYPE_F32, 0},
    };
    w = build(3, NULL, same, 2, 32);
    ASSERT_REJECTS(w, "overlap");
    free(w.p);
}

TEST(tensor_data_past_end_of_file_is_rejected)
{
    struct wbuf w = build(3, NULL, two_tensors, 2, 32);
    w.len -= 1;
    ASSERT_REJECTS(w, "tensor 'b' data [offset 32, 68 bytes] runs past end of file");
    free(w.p);
}

TEST(unsupported_tensor_type_is_named_in_the_error)
{
    const struct tspec ts[] = {
        {"a", 1, {8, 1, 1, 1}, QTYPE_F32, -1},
        {"blk.0.ffn_up.weight", 2, {256, 4, 1, 1}, 10, -1},
    };
    struct wbuf w = build(3, NULL, ts, 2, 32);
    ASSERT_REJECTS(w, "tensor 'blk.0.ffn_up.weight' has unsupported tensor type Q2_K (10)");
    free(w.p);
    const struct tspec ts2[] = {{"x", 1, {8, 1, 1, 1}, 4000000000u, -1}};
    w = build(3, NULL, ts2, 1, 32);
    ASSERT_REJECTS(w, "unsupported tensor type unknown (4000000000)");
    free(w.p);
}

TEST(duplicate_tensor_names_are_rejected)
{
    const struct tspec ts[] = {
        {"a", 1, {8, 1, 1, 1}, QTYPE_F32, -1},
        {"b", 1, {8, 1, 1, 1}, QTYPE_F32, -1},
        {"a", 1, {8, 1, 1, 1}, QTYPE_F32, -1},
    };
    struct wbuf w = build(3, NULL, ts, 3, 32);
    ASSERT_REJECTS(w, "duplicate tensor name 'a'");
    free(w.p);
}

TEST(bad_shapes_are_rejected)
{
    const struct tspec five[] = {{"t5", 5, {1, 1, 1, 1}, QTYPE_F32, 0}};
    struct wbuf w = build(3, NULL, five, 1, 32);
    ASSERT_REJECTS(w, "tensor 't5' has 5 dimensions (at most 4)");
    free(w.p);

    const struct tspec neg[] = {{"neg", 2, {8, -3, 1, 1}, QTYPE_F32, 0}};
    w = build(3, NULL, neg, 1, 32);
    ASSERT_REJECTS(w, "tensor 'neg': ne[1] = 18446744073709551613 is negative or too large");
    free(w.p);

    const struct tspec big[] = {{"big", 3, {1LL << 32, 1LL << 32, 4, 1}, QTYPE_F32, 0}};
    w = build(3, NULL, big, 1, 32);
    ASSERT_REJECTS(w, "tensor 'big': element count overflows");
    free(w.p);

    /* elements fit in int64 but bytes do not fit in size_t */
    const struct tspec bytes[] = {{"bytes", 2, {1LL << 31, 1LL << 31, 1, 1}, QTYPE_F32, 0}};
    w = build(3, NULL, bytes, 1, 32);
    ASSERT_REJECTS(w, "tensor 'bytes': byte size overflows");
    free(w.p);

    /* bytes fit in size_t but not in the file */
    const struct tspec huge[] = {{"huge", 2, {1LL << 20, 1LL << 20, 1, 1}, QTYPE_F32, 0}};
    w = build(3, NULL, huge, 1, 32);
    ASSERT_REJECTS(w, "tensor 'huge' data [offset 0, 4398046511104 bytes] runs past end");
    free(w.p);

    const struct tspec odd[] = {{"odd", 2, {48, 2, 1, 1}, QTYPE_Q4_1, 0}};
    w = build(3, NULL, odd, 1, 32);
    ASSERT_REJECTS(w, "tensor 'odd': ne[0] = 48 is not a multiple of the Q4_1 block (32 values)");
    free(w.p);
}

/* K-quant rows are whole 256-value super-blocks; Q5_0 rows whole 32-value
 * blocks, with the byte sizes of their layouts. */
TEST(k_quant_tensors_parse_with_their_block_sizes)
{
    const struct tspec ts[] = {
        {"q5_0", 2, {640, 3, 1, 1}, QTYPE_Q5_0, -1}, {"q4_k", 2, {512, 2, 1, 1}, QTYPE_Q4_K, -1},
        {"q6_k", 2, {256, 5, 1, 1}, QTYPE_Q6_K, -1}, {"q5_k", 2, {256, 1, 1, 1}, QTYPE_Q5_K, -1},
        {"q3_k", 2, {256, 1, 1, 1}, QTYPE_Q3_K, -1},
    };
    static const size_t nbytes[] = {3 * 20 * 22, 2 * 2 * 144, 5 * 210, 176, 110};
    struct wbuf w = build(3, NULL, ts, 5, 32);
    struct gguf_file g;
    char err[256];
    ASSERT_OK(parse(&g, &w, err, sizeof err));
    for (int i = 0; i < 5; i++) {
        const struct gguf_tensor *t = gguf_find_tensor(&g, ts[i].name);
        ASSERT(t != NULL);
        ASSERT_EQ(t->type, (int)ts[i].type);
        ASSERT_EQ(t->nbytes, nbytes[i]);
    }
    gguf_free(&g);
    free(w.p);

    const struct tspec odd[] = {{"odd", 2, {640, 2, 1, 1}, QTYPE_Q4_K, 0}};
    w = build(3, NULL, odd, 1, 32);
    ASSERT_REJECTS(w, "tensor 'odd': ne[0] = 640 is not a multiple of the Q4_K block (256 values)");
    free(w.p);
}

TEST(tensor_offset_far_past_the_data_section_is_rejected)
{
    const struct tspec ts[] = {
        {"a", 1, {8, 1, 1, 1}, QTYPE_F32, 0},
        {"far", 1, {8, 1, 1, 1}, QTYPE_F32, (int64_t)(UINT64_MAX >> 1) & ~(int64_t)31},
    };
    /* the writer would pad out to the far offset, so write "far" with a small
     * offset and patch its offset field (the last 8 bytes of the directory) */
    struct tspec near[2] = {ts[0], ts[1]};
    near[1].offset = 32;
    struct wbuf w = build(3, NULL, near, 2, 32);
    size_t dir_end = 24 + (8 + 1 + 4 + 8 + 4 + 8) + (8 + 3 + 4 + 8 + 4 + 8);
    put_u64_at(&w, dir_end - 8, (uint64_t)ts[1].offset);
    ASSERT_REJECTS(w, "tensor 'far' data [offset 9223372036854775776, 32 bytes] runs past end");
    put_u64_at(&w, dir_end - 8, UINT64_MAX - 31);
    ASSERT_REJECTS(w, "runs past end of file");
    free(w.p);
}

TEST(names_with_odd_bytes_are_printed_safely)
{
    const struct tspec ts[] = {{"bad\nname'\x01", 1, {8, 1, 1, 1}, 10, -1}};
    struct wbuf w = build(3, NULL, ts, 1, 32);
    ASSERT_REJECTS(w, "tensor 'bad?name?\?' has unsupported");
    free(w.p);
}

TEST(parse_with_no_error_buffer_or_a_tiny_one_is_safe)
{
    struct wbuf w = sample_file(3);
    struct gguf_file g;
    char tiny[4] = "zzz";

    w.p[0] = 'X';
    ASSERT_EQ(gguf_parse(&g, w.p, w.len, NULL, 0), -EINVAL);
    ASSERT_EQ(gguf_parse(&g, w.p, w.len, tiny, sizeof tiny), -EINVAL);
    ASSERT_STREQ(tiny, "ggu");
    ASSERT_EQ(gguf_parse(&g, NULL, 0, NULL, 0), -EINVAL);
    free(w.p);
}

/* ---- robustness --------------------------------------------------------- */

TEST(every_truncation_of_the_sample_file_fails_cleanly)
{
    struct wbuf w = sample_file(3);
    int bad = 0;

    ASSERT_OK(parse_copy(w.p, w.len, &bad));
    ASSERT_EQ(bad, 0);
    for (size_t n = 0; n < w.len; n++) {
        int rc = parse_copy(w.p, n, &bad);
        if (rc != -EINVAL)
            FAIL_AT("truncated to %zu of %zu bytes: rc %d", n, w.len, rc);
    }
    ASSERT_EQ(bad, 0);
    free(w.p);
}

TEST(truncations_of_the_real_file_fail_cleanly)
{
    const uint8_t *buf = real_model();
    struct gguf_file g;
    char err[256];
    size_t dir_start, data_start, cuts = 0;
    int bad = 0;

    if (!buf) {
        TEST_NEED_MODEL();
        FAIL_AT("%s is present but could not be read", test_model_path());
    }
    ASSERT_OK(gguf_parse(&g, buf, real_len, err, sizeof err));
    dir_start = (size_t)((const uint8_t *)g.tensors[0].name.ptr - 8 - buf);
    data_start = (size_t)((const uint8_t *)g.tensors[0].data - buf) - g.tensors[0].offset;
    gguf_free(&g);

    /* header and the first keys: every length */
    for (size_t n = 0; n < 4096; n++, cuts++)
        ASSERT_EQ(parse_copy(buf, n, &bad), -EINVAL);
    /* the key/value section (token and merge arrays): every 997th length */
    for (size_t n = 4096; n < dir_start; n += 997, cuts++)
        ASSERT_EQ(parse_copy(buf, n, &bad), -EINVAL);
    /* the tensor directory and the padding: every 7th length, and its ends */
    for (size_t n = dir_start - 16; n <= data_start; n += 7, cuts++)
        ASSERT_EQ(parse_copy(buf, n, &bad), -EINVAL);
    /* the data section: the parser reads none of it, so a shorter view is enough */
    for (size_t n = data_start; n < real_len; n += real_len / 211, cuts++) {
        ASSERT_EQ(gguf_parse(&g, buf, n, err, sizeof err), -EINVAL);
        ASSERT(strstr(err, "runs past end of file") != NULL);
    }
    ASSERT_EQ(gguf_parse(&g, buf, real_len - 1, err, sizeof err), -EINVAL);
    ASSERT(strstr(err, "tensor 'output_norm.weight' data") != NULL);
    ASSERT_EQ(bad, 0);
    printf("    %zu cuts; directory at %zu, data at %zu\n", cuts, dir_start, data_start);
}

TEST(random_corruption_of_the_sample_file_never_crashes)
{
    struct wbuf w = sample_file(3);
    uint8_t *copy = malloc(w.len);
    size_t at[4];
    int bad = 0, ok = 0;

    rng_state = 12345;
    for (int i = 0; i < 20000; i++) {
        memcpy(copy, w.p, w.len);
        corrupt(copy, w.len, at);
        if (parse_copy(copy, w.len, &bad) == 0)
            ok++;
        if (bad)
            FAIL_AT("iteration %d: bad view or error message", i);
    }
    printf("    %d of 20000 corrupted files still parsed\n", ok);
    free(copy);
    free(w.p);
}

TEST(random_corruption_of_the_real_header_never_crashes)
{
    const uint8_t *buf = real_model();
    uint8_t *copy;
    size_t span;
    int bad = 0, ok = 0, n = 2000;

    if (!buf) {
        TEST_NEED_MODEL();
        FAIL_AT("%s is present but could not be read", test_model_path());
    }
    /* corrupt the first 2 MB (the whole header and directory) of a full copy,
     * so that files which survive still reach their tensor data */
    copy = malloc(real_len);
    ASSERT(copy != NULL);
    memcpy(copy, buf, real_len);
    span = real_len < (2u << 20) ? real_len : (2u << 20);
    rng_state = 777;
    for (int i = 0; i < n; i++) {
        struct gguf_file g;
        char err[256];
        size_t at[4];
        int k = corrupt(copy, span, at);
        if (gguf_parse(&g, copy, real_len, err, sizeof err) == 0) {
            ok++;
            bad |= check_views(&g);
            gguf_free(&g);
        } else {
            bad |= strncmp(err, "gguf: ", 6) != 0;
        }
        if (bad)
            FAIL_AT("iteration %d: bad view or error message", i);
        for (int j = 0; j < k; j++) /* undo */
            copy[at[j]] = buf[at[j]];
    }
    ASSERT(memcmp(copy, buf, span) == 0);
    /* a 2 MB prefix alone (no tensor data) with corruption: still no crash */
    for (int i = 0; i < n / 4; i++) {
        size_t at[4];
        int k = corrupt(copy, span, at);
        parse_copy(copy, span, &bad);
        for (int j = 0; j < k; j++)
            copy[at[j]] = buf[at[j]];
    }
    ASSERT_EQ(bad, 0);
    printf("    %d of %d corrupted headers still parsed\n", ok, n);
    free(copy);
}

/* ---- fuzz seeds --------------------------------------------------------- */

static int write_file(const char *dir, const char *name, const struct wbuf *w)
{
    char path[4096];
    FILE *f;

    snprintf(path, sizeof path, "%s/%s", dir, name);
    f = fopen(path, "wb");
    if (!f)
        return -1;
    fwrite(w->p, 1, w->len, f);
    return fclose(f);
}

TEST(writes_the_fuzz_seed_corpus_when_asked)
{
    const char *dir = getenv("STREAMSINK_GGUF_SEED_DIR");
    struct wbuf w;

    if (!dir || !*dir)
        return;
    w = sample_file(3);
    ASSERT_OK(write_file(dir, "sample_v3.gguf", &w));
    free(w.p);
    w = sample_file(2);
    ASSERT_OK(write_file(dir, "sample_v2.gguf", &w));
    free(w.p);
    w = build(3, kvs_align_64, two_tensors, 2, 64);
    ASSERT_OK(write_file(dir, "align64.gguf", &w));
    free(w.p);
    w = build(3, NULL, NULL, 0, 32);
    ASSERT_OK(write_file(dir, "empty.gguf", &w));
    free(w.p);
    printf("    seeds written to %s\n", dir);
}

TEST_MAIN()
