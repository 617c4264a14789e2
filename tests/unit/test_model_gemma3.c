/*
 * test_model_gemma3.c: loading Gemma 3 files (engine/model.c): the
 * hyperparameters (head dim not D / H, sliding window, which layers are
 * local, the two RoPE bases, the query scale, soft-capping), the extra norm
 * tensors, and a clear error (model_open fails, the CLI and server exit 3)
 * for every inconsistent or missing piece.
 *
 * The files are small F32 GGUFs written here with each key and tensor
 * switchable, so every error path is reached. The real Gemma 3 270M file is
 * checked too when it is present and this build reads its tensor types.
 */
#include "test.h"

#include "gguf.h"
#include "model.h"

#include <errno.h>
#include <unistd.h>

/* ---- a small GGUF writer -------------------------------------------------- */

struct wbuf {
    uint8_t *p;
    size_t len;
    size_t cap;
};

static void w_bytes(struct wbuf *w, const void *src, size_t n)
{
    if (w->len + n > w->cap) {
        size_t cap = w->cap ? w->cap : 4096;
        uint8_t *p;
        while (cap < w->len + n)
            cap *= 2;
        p = realloc(w->p, cap);
        if (!p) {
            fprintf(stderr, "test_model_gemma3: out of memory\n");
            exit(1);
        }
        w->p = p;
        w->cap = cap;
    }
    if (src)
        memcpy(w->p + w->len, src, n);
    else
        memset(w->p + w->len, 0, n);
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

/* What the synthetic file holds. Dimensions are small; Dh * H != D on purpose. */
struct g3 {
    int L, D, H, Hkv, Dh, F, V;
    int64_t key_length;   /* < 0: key absent */
    int64_t value_length; /* < 0: absent */
    int64_t window;       /* < 0: absent */
    int64_t pattern;      /* < 0: absent */
    double rope_swa;      /* < 0: absent */
    double scale;         /* < 0: absent */
    double final_softcap; /* < 0: absent */
    double attn_softcap;  /* < 0: absent */
    const char *skip;     /* a tensor name suffix to leave out (layer 3), or NULL */
    const char *misshape; /* a tensor name suffix written one element short (layer 3) */
};

static struct g3 g3_default(void)
{
    return (struct g3){.L = 12,
                       .D = 32,
                       .H = 2,
                       .Hkv = 1,
                       .Dh = 24,
                       .F = 48,
                       .V = 16,
                       .key_length = 24,
                       .value_length = 24,
                       .window = 8,
                       .pattern = -1,
                       .rope_swa = -1,
                       .scale = -1,
                       .final_softcap = -1,
                       .attn_softcap = -1};
}

struct tdesc {
    char name[64];
    int64_t ne0, ne1;
};

static void kv_u32(struct wbuf *w, uint64_t *n, const char *k, int64_t v)
{
    if (v < 0)
        return;
    w_str(w, k);
    w_u32(w, GGUF_TYPE_UINT32);
    w_u32(w, (uint32_t)v);
    (*n)++;
}

static void kv_f32(struct wbuf *w, uint64_t *n, const char *k, double v)
{
    float f = (float)v;
    if (v < 0)
        return;
    w_str(w, k);
    w_u32(w, GGUF_TYPE_FLOAT32);
    w_bytes(w, &f, 4);
    (*n)++;
}

/* Writes the file for c into a new temporary file; its path goes to path. */
static int g3_write(const struct g3 *c, char *path, size_t cap)
{
    struct wbuf w = {0};
    struct tdesc *t = calloc((size_t)(2 + 15 * c->L), sizeof *t);
    int nt = 0;
    uint64_t n_kv = 0;
    size_t n_kv_at;
    uint64_t off = 0;
    int fd;
    int64_t Dq = (int64_t)c->H * c->Dh, Dkv = (int64_t)c->Hkv * c->Dh;

    if (!t)
        return -1;
    t[nt++] = (struct tdesc){"token_embd.weight", c->D, c->V};
    t[nt++] = (struct tdesc){"output_norm.weight", c->D, 1};
    for (int l = 0; l < c->L; l++) {
        const struct {
            const char *s;
            int64_t ne0, ne1;
        } tab[] = {
            {"attn_norm", c->D, 1},     {"attn_q", c->D, Dq},
            {"attn_k", c->D, Dkv},      {"attn_v", c->D, Dkv},
            {"attn_output", Dq, c->D},  {"attn_q_norm", c->Dh, 1},
            {"attn_k_norm", c->Dh, 1},  {"post_attention_norm", c->D, 1},
            {"ffn_norm", c->D, 1},      {"ffn_gate", c->D, c->F},
            {"ffn_up", c->D, c->F},     {"ffn_down", c->F, c->D},
            {"post_ffw_norm", c->D, 1},
        };
        for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++) {
            if (l == 3 && c->skip && strcmp(c->skip, tab[i].s) == 0)
                continue;
            snprintf(t[nt].name, sizeof t[nt].name, "blk.%d.%s.weight", l, tab[i].s);
            t[nt].ne0 = tab[i].ne0 - (l == 3 && c->misshape && !strcmp(c->misshape, tab[i].s));
            t[nt].ne1 = tab[i].ne1;
            nt++;
        }
    }

    w_bytes(&w, "GGUF", 4);
    w_u32(&w, 3);
    w_u64(&w, (uint64_t)nt);
    n_kv_at = w.len;
    w_u64(&w, 0);
    w_str(&w, "general.architecture");
    w_u32(&w, GGUF_TYPE_STRING);
    w_str(&w, "gemma3");
    n_kv++;
    kv_u32(&w, &n_kv, "gemma3.block_count", c->L);
    kv_u32(&w, &n_kv, "gemma3.embedding_length", c->D);
    kv_u32(&w, &n_kv, "gemma3.feed_forward_length", c->F);
    kv_u32(&w, &n_kv, "gemma3.attention.head_count", c->H);
    kv_u32(&w, &n_kv, "gemma3.attention.head_count_kv", c->Hkv);
    kv_u32(&w, &n_kv, "gemma3.attention.key_length", c->key_length);
    kv_u32(&w, &n_kv, "gemma3.attention.value_length", c->value_length);
    kv_u32(&w, &n_kv, "gemma3.attention.sliding_window", c->window);
    kv_u32(&w, &n_kv, "gemma3.attention.sliding_window_pattern", c->pattern);
    kv_u32(&w, &n_kv, "gemma3.context_length", 4096);
    kv_f32(&w, &n_kv, "gemma3.rope.freq_base", 1e6);
    kv_f32(&w, &n_kv, "gemma3.rope.freq_base_swa", c->rope_swa);
    kv_f32(&w, &n_kv, "gemma3.attention.layer_norm_rms_epsilon", 1e-6);
    kv_f32(&w, &n_kv, "gemma3.attention.scale", c->scale);
    kv_f32(&w, &n_kv, "gemma3.final_logit_softcapping", c->final_softcap);
    kv_f32(&w, &n_kv, "gemma3.attn_logit_softcapping", c->attn_softcap);
    memcpy(w.p + n_kv_at, &n_kv, 8);
    for (int i = 0; i < nt; i++) {
        w_str(&w, t[i].name);
        w_u32(&w, 2);
        w_u64(&w, (uint64_t)t[i].ne0);
        w_u64(&w, (uint64_t)t[i].ne1);
        w_u32(&w, 0); /* F32 */
        w_u64(&w, off);
        off += ((uint64_t)(t[i].ne0 * t[i].ne1) * 4 + 31) / 32 * 32;
    }
    w_bytes(&w, NULL, (32 - w.len % 32) % 32);
    for (int i = 0; i < nt; i++) {
        size_t n = (size_t)(t[i].ne0 * t[i].ne1);
        size_t at = w.len;
        w_bytes(&w, NULL, (n * 4 + 31) / 32 * 32);
        for (size_t k = 0; k < n; k++) {
            float v = 1.0f + 0.001f * (float)(k % 7);
            memcpy(w.p + at + 4 * k, &v, 4);
        }
    }
    free(t);

    snprintf(path, cap, "/tmp/streamsink-gemma3-XXXXXX");
    fd = mkstemp(path);
    if (fd < 0 || write(fd, w.p, w.len) != (ssize_t)w.len) {
        free(w.p);
        return -1;
    }
    close(fd);
    free(w.p);
    return 0;
}

/* Writes c, opens it with flags, removes the file. Returns model_open's result. */
static int g3_open(const struct g3 *c, struct model *m, unsigned flags, char *err, size_t err_len)
{
    char path[64];
    int rc;

    if (g3_write(c, path, sizeof path) < 0) {
        snprintf(err, err_len, "cannot write the test file");
        return -EIO;
    }
    rc = model_open(m, path, flags, err, err_len);
    unlink(path);
    return rc;
}

/* ---- tests ---------------------------------------------------------------- */

TEST(gemma3_hparams_and_layer_pattern_are_read)
{
    struct g3 c = g3_default();
    struct model m;
    char err[256] = "";
    int local = 0;

    ASSERT_OK(g3_open(&c, &m, 0, err, sizeof err));
    if (err[0])
        printf("  %s\n", err);
    ASSERT_EQ(m.hp.arch_kind, MODEL_ARCH_GEMMA3);
    ASSERT_EQ(m.hp.n_layer, 12);
    ASSERT_EQ(m.hp.n_embd, 32);
    ASSERT_EQ(m.hp.head_dim, 24); /* not D / H = 16 */
    ASSERT_EQ(m.hp.n_head_kv, 1);
    ASSERT_EQ(m.hp.n_swa, 8);
    ASSERT_EQ(m.hp.swa_period, 6);
    ASSERT_EQ(m.hp.rope_neox, 1);
    ASSERT_NEAR(m.hp.rope_base, 1e6, 1e-3);
    ASSERT_NEAR(m.hp.rope_base_local, 1e4, 1e-6);
    ASSERT_NEAR(m.hp.attn_scale, 1.0 / sqrt(24.0), 1e-7);
    ASSERT_EQ(m.hp.final_softcap, 0);
    ASSERT_NEAR(m.hp.norm_eps, 1e-6, 1e-12);
    /* every 6th layer global: 5 and 11 */
    for (int l = 0; l < 12; l++) {
        ASSERT_EQ(model_layer_is_local(&m.hp, l), l != 5 && l != 11);
        local += model_layer_is_local(&m.hp, l);
    }
    ASSERT_EQ(local, 10);
    ASSERT(m.w.layers[7].attn_q_norm.data && m.w.layers[7].post_ffw_norm.data);
    ASSERT_EQ(m.w.layers[7].attn_k_norm.ne0, 24);
    ASSERT_EQ(m.w.layers[7].post_attn_norm.ne0, 32);
    ASSERT_EQ(m.w.layers[7].wq.ne1, 48);
    ASSERT_EQ(m.w.layers[7].wo.ne0, 48);
    ASSERT(m.w.output.data == m.w.tok_embd.data); /* tied */
    model_free(&m);
}

TEST(gemma3_optional_keys_override_the_defaults)
{
    struct g3 c = g3_default();
    struct model m;
    char err[256] = "";

    c.pattern = 4;
    c.rope_swa = 20000;
    c.scale = 0.125;
    c.final_softcap = 30;
    ASSERT_OK(g3_open(&c, &m, 0, err, sizeof err));
    ASSERT_EQ(m.hp.swa_period, 4);
    ASSERT(model_layer_is_local(&m.hp, 2) && !model_layer_is_local(&m.hp, 3));
    ASSERT_NEAR(m.hp.rope_base_local, 20000, 1e-6);
    ASSERT_NEAR(m.hp.attn_scale, 0.125, 1e-9);
    ASSERT_NEAR(m.hp.final_softcap, 30, 1e-6);
    model_free(&m);
}

/* Opens c and expects rc with want in the message. */
static int fails_with(const struct g3 *c, int rc, const char *want)
{
    struct model m;
    char err[256] = "";
    int got = g3_open(c, &m, 0, err, sizeof err);

    printf("  %s\n", err);
    if (got == 0)
        model_free(&m);
    return got == rc && strstr(err, want) != NULL;
}

TEST(gemma3_inconsistent_files_fail_to_load_with_a_message)
{
    struct g3 c;

    c = g3_default();
    c.key_length = -1; /* Dh cannot be guessed from D / H */
    ASSERT(fails_with(&c, -EINVAL, "key_length"));
    c = g3_default();
    c.value_length = 16;
    ASSERT(fails_with(&c, -EINVAL, "value_length"));
    c = g3_default();
    c.window = -1;
    ASSERT(fails_with(&c, -EINVAL, "sliding_window"));
    c = g3_default();
    c.window = 0;
    ASSERT(fails_with(&c, -EINVAL, "sliding_window"));
    c = g3_default();
    c.pattern = 0;
    ASSERT(fails_with(&c, -EINVAL, "sliding_window_pattern"));
    c = g3_default();
    c.rope_swa = 0.5;
    ASSERT(fails_with(&c, -EINVAL, "freq_base_swa"));
    c = g3_default();
    c.attn_softcap = 50;
    ASSERT(fails_with(&c, -ENOTSUP, "attn_logit_softcapping"));
    c = g3_default();
    c.key_length = 512; /* over MODEL_MAX_HEAD_DIM */
    ASSERT(fails_with(&c, -EINVAL, "key_length"));
    c = g3_default();
    c.skip = "post_ffw_norm";
    ASSERT(fails_with(&c, -EINVAL, "blk.3.post_ffw_norm.weight' missing"));
    c = g3_default();
    c.skip = "attn_q_norm";
    ASSERT(fails_with(&c, -EINVAL, "blk.3.attn_q_norm.weight' missing"));
    c = g3_default();
    c.misshape = "attn_k_norm";
    ASSERT(fails_with(&c, -EINVAL, "blk.3.attn_k_norm.weight' has shape"));
    c = g3_default();
    c.misshape = "attn_output";
    ASSERT(fails_with(&c, -EINVAL, "blk.3.attn_output.weight' has shape"));
    c = g3_default();
    c.Hkv = 3; /* 2 heads do not share 3 kv heads */
    ASSERT(fails_with(&c, -EINVAL, "head_count_kv"));
}

TEST(gemma3_270m_file_hparams)
{
    struct model m;
    char err[256] = "";
    int rc;

    TEST_NEED_GEMMA_MODEL();
    rc = model_open(&m, test_gemma_model_path(), 0, err, sizeof err);
    if (rc < 0 && strstr(err, "unsupported tensor type")) {
        printf("  %s\n", err);
        TEST_SKIP("this build does not read all of the file's tensor types");
    }
    ASSERT_OK(rc);
    ASSERT_EQ(m.hp.n_layer, 18);
    ASSERT_EQ(m.hp.n_embd, 640);
    ASSERT_EQ(m.hp.n_head, 4);
    ASSERT_EQ(m.hp.n_head_kv, 1);
    ASSERT_EQ(m.hp.head_dim, 256);
    ASSERT_EQ(m.hp.n_ff, 2048);
    ASSERT_EQ(m.hp.n_vocab, 262144);
    ASSERT_EQ(m.hp.n_ctx_train, 32768);
    ASSERT_EQ(m.hp.n_swa, 512);
    ASSERT_EQ(m.hp.swa_period, 6);
    ASSERT_NEAR(m.hp.rope_base, 1e6, 1e-3);
    ASSERT_NEAR(m.hp.rope_base_local, 1e4, 1e-6);
    ASSERT_NEAR(m.hp.attn_scale, 1.0 / 16, 1e-9);
    ASSERT_EQ(m.hp.final_softcap, 0);
    ASSERT(model_layer_is_local(&m.hp, 4) && !model_layer_is_local(&m.hp, 5) &&
           !model_layer_is_local(&m.hp, 17));
    model_free(&m);
}

TEST_MAIN()
