/* tiny_model.c: the random-weight Llama model and its CPU rig (tiny_model.h). */
#include "support/tiny_model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/rng.h"

struct tiny_config tiny_config_default(void)
{
    struct tiny_config c = {
        .n_layer = 2,
        .n_embd = 64,
        .n_head = 4,
        .n_head_kv = 2,
        .head_dim = 16,
        .n_ff = 128,
        .n_vocab = 256,
        .rope_base = 10000.0,
        .norm_eps = 1e-5f,
        .normalizer = MODEL_NORM_SOFTMAX,
        .wtype = QTYPE_F32,
        .qk_sigma = 0.3f,
        .sink_mean = 1.0f,
        .sink_sigma = 1.0f,
        .seed = 42,
    };
    return c;
}

static void *tiny_alloc(struct tiny_model *tm, size_t bytes)
{
    if (tm->n_mem == TINY_MAX_ALLOCS)
        return NULL;
    void *p = calloc(1, bytes ? bytes : 1);
    if (p)
        tm->mem[tm->n_mem++] = p;
    return p;
}

static int tiny_tensor(struct tiny_model *tm, struct tensor *out, enum qtype t, int64_t cols,
                       int64_t rows, double mean, double sigma, uint64_t *rng)
{
    size_t row_bytes = qtype_row_bytes(t, cols);
    float *row = malloc((size_t)cols * sizeof(float));
    void *data = row_bytes ? tiny_alloc(tm, row_bytes * (size_t)rows) : NULL;
    if (!row || !data) {
        free(row);
        return -1;
    }
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t i = 0; i < cols; i++)
            row[i] = (float)(mean + sigma * test_rng_normal(rng));
        quant_quantize_row(t, row, (char *)data + (size_t)r * row_bytes, cols);
    }
    free(row);
    *out = (struct tensor){
        .data = data, .type = (int)t, .ne0 = cols, .ne1 = rows, .row_bytes = row_bytes};
    return 0;
}

void tiny_model_free(struct tiny_model *tm)
{
    for (int i = 0; i < tm->n_mem; i++)
        free(tm->mem[i]);
    memset(tm, 0, sizeof *tm);
}

int tiny_model_init(struct tiny_model *tm, const struct tiny_config *c)
{
    memset(tm, 0, sizeof *tm);
    tm->cfg = *c;
    struct model_hparams *hp = &tm->m.hp;
    snprintf(hp->arch, sizeof hp->arch, "llama");
    snprintf(hp->name, sizeof hp->name, "tiny-random-llama");
    hp->n_layer = c->n_layer;
    hp->n_embd = c->n_embd;
    hp->n_head = c->n_head;
    hp->n_head_kv = c->n_head_kv;
    hp->head_dim = c->head_dim;
    hp->n_ff = c->n_ff;
    hp->n_vocab = c->n_vocab;
    hp->n_ctx_train = 1 << 20;
    hp->norm_eps = c->norm_eps;
    hp->rope_base = c->rope_base;
    hp->rope_base_local = c->rope_base;
    hp->n_swa = c->n_swa;
    hp->swa_period = c->swa_period;
    hp->rope_dim = c->head_dim;
    hp->attn_scale = (float)(1.0 / sqrt((double)c->head_dim)); /* as model.c sets it */
    hp->normalizer = c->normalizer;
    hp->file_type = (int)c->wtype;

    const int64_t D = c->n_embd, F = c->n_ff, V = c->n_vocab;
    const int64_t DQ = (int64_t)c->n_head * c->head_dim;
    const int64_t DKV = (int64_t)c->n_head_kv * c->head_dim;
    const enum qtype wt = c->wtype;
    uint64_t rng = c->seed;
    struct model_weights *w = &tm->m.w;
    int bad = 0;

    w->layers = tiny_alloc(tm, (size_t)c->n_layer * sizeof *w->layers);
    tm->m.sinks_mem = tiny_alloc(tm, (size_t)c->n_layer * (size_t)c->n_head * sizeof(float));
    if (!w->layers || !tm->m.sinks_mem)
        goto fail;
    /* embeddings N(0, 1): after the first rmsnorm only their direction matters */
    bad |= tiny_tensor(tm, &w->tok_embd, wt, D, V, 0.0, 1.0, &rng);
    for (int l = 0; l < c->n_layer; l++) {
        struct model_layer *ly = &w->layers[l];
        bad |= tiny_tensor(tm, &ly->attn_norm, QTYPE_F32, D, 1, 1.0, 0.1, &rng);
        bad |= tiny_tensor(tm, &ly->wq, wt, D, DQ, 0.0, c->qk_sigma, &rng);
        bad |= tiny_tensor(tm, &ly->wk, wt, D, DKV, 0.0, c->qk_sigma, &rng);
        bad |= tiny_tensor(tm, &ly->wv, wt, D, DKV, 0.0, 1.0 / sqrt((double)D), &rng);
        bad |= tiny_tensor(tm, &ly->wo, wt, DQ, D, 0.0, 1.0 / sqrt((double)DQ), &rng);
        bad |= tiny_tensor(tm, &ly->ffn_norm, QTYPE_F32, D, 1, 1.0, 0.1, &rng);
        bad |= tiny_tensor(tm, &ly->w_gate, wt, D, F, 0.0, 1.0 / sqrt((double)D), &rng);
        bad |= tiny_tensor(tm, &ly->w_up, wt, D, F, 0.0, 1.0 / sqrt((double)D), &rng);
        bad |= tiny_tensor(tm, &ly->w_down, wt, F, D, 0.0, 1.0 / sqrt((double)F), &rng);
        float *s = tm->m.sinks_mem + (size_t)l * (size_t)c->n_head;
        for (int h = 0; h < c->n_head; h++) {
            /* drawn for every normalizer, so the other weights do not depend on it */
            float r = (float)(c->sink_mean + c->sink_sigma * test_rng_normal(&rng));
            /* zeros otherwise: softmax1 is sink with s_h = 0 (as model_load) */
            s[h] = c->normalizer == MODEL_NORM_SINK ? r : 0.0f;
        }
        ly->attn_sinks = s;
    }
    if (c->sink_vectors && c->normalizer == MODEL_NORM_SINK) {
        uint64_t rs = c->seed ^ 0x51C5EEDull;
        for (int l = 0; l < c->n_layer; l++) {
            struct model_layer *ly = &w->layers[l];
            bad |= tiny_tensor(tm, &ly->attn_sinks_v, QTYPE_F32, c->head_dim, c->n_head, 0.0, 0.5,
                               &rs);
            bad |= tiny_tensor(tm, &ly->attn_sinks_k, QTYPE_F32, c->head_dim, c->n_head_kv, 0.0,
                               0.5, &rs);
        }
    }
    bad |= tiny_tensor(tm, &w->output_norm, QTYPE_F32, D, 1, 1.0, 0.1, &rng);
    bad |= tiny_tensor(tm, &w->output, wt, D, V, 0.0, 1.0, &rng);
    if (bad)
        goto fail;
    return 0;
fail:
    tiny_model_free(tm);
    return -1;
}

void tiny_model_set_sinks(struct tiny_model *tm, float s)
{
    size_t n = (size_t)tm->m.hp.n_layer * (size_t)tm->m.hp.n_head;
    for (size_t i = 0; i < n; i++)
        tm->m.sinks_mem[i] = s;
}

void tiny_rig_close(struct tiny_rig *r)
{
    if (r->f_ok)
        fwd_free(&r->f);
    if (r->b_ok)
        r->b.ops->free(&r->b);
    memset(r, 0, sizeof *r);
}

int tiny_rig_open(struct tiny_rig *r, const struct model *m, const struct tiny_rig_config *c)
{
    char err[256];
    memset(r, 0, sizeof *r);
    struct backend_cpu_config bc = {.n_threads = c->n_threads > 0 ? c->n_threads : 1,
                                    .max_tokens = c->chunk,
                                    .reference_matmul = c->reference_matmul};
    if (backend_cpu_init(&r->b, m, &bc, err, sizeof err) < 0)
        goto fail;
    r->b_ok = 1;
    int64_t s = kv_policy_sinks(&c->policy);
    struct kv_geometry g = {
        .n_layer = m->hp.n_layer,
        .n_kv_head = m->hp.n_head_kv,
        .head_dim = m->hp.head_dim,
        .n_sinks = s > 0 ? s : 1,
        .window = c->window,
        .chunk = c->chunk,
        .n_slots = 1,
        .dtype = c->dtype,
    };
    if (fwd_init(&r->f, m, &r->b, &g, err, sizeof err) < 0)
        goto fail;
    r->f_ok = 1;
    if (kv_seq_init(&r->seq, &r->f.pool.geo, 0, c->policy, c->window, c->pos_first) < 0) {
        snprintf(err, sizeof err, "kv_seq_init failed");
        goto fail;
    }
    return 0;
fail:
    fprintf(stderr, "  tiny_rig_open: %s\n", err);
    tiny_rig_close(r);
    return -1;
}

int64_t tiny_rig_feed(struct tiny_rig *r, const int32_t *tokens, int64_t n, int64_t chunk,
                      float *logits)
{
    const int64_t V = r->f.m->hp.n_vocab;
    for (int64_t i0 = 0; i0 < n; i0 += chunk) {
        int64_t k = n - i0 < chunk ? n - i0 : chunk;
        struct fwd_input in = {&r->seq, tokens + i0, k, logits ? FWD_LOGITS_ALL : FWD_LOGITS_NONE};
        int64_t rows = fwd_step(&r->f, &in, 1);
        if (rows < 0)
            return rows;
        if (logits)
            memcpy(logits + i0 * V, r->f.logits, (size_t)(k * V) * sizeof(float));
    }
    return 0;
}

void tiny_tokens(int32_t *out, int64_t n, int64_t n_vocab, uint64_t seed)
{
    for (int64_t i = 0; i < n; i++)
        out[i] = (int32_t)(test_rng_u64(&seed) % (uint64_t)n_vocab);
}

double tiny_max_diff(const float *a, const float *b, int64_t n, double *max_abs)
{
    double d = 0, mx = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - (double)b[i]);
        if (isnan(e)) { /* a NaN on either side can never pass */
            if (max_abs)
                *max_abs = NAN;
            return INFINITY;
        }
        if (e > d)
            d = e;
        if (fabs((double)a[i]) > mx)
            mx = fabs((double)a[i]);
    }
    if (max_abs)
        *max_abs = mx;
    return d;
}
