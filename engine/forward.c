/*
 * forward.c: the decoder, one batched step, against backend.h: Llama and
 * Gemma 3, each layer written out beside the other.
 *
 * Letters: L layers, D model dim, H query heads, Hkv kv heads, Dh head dim,
 * F ffn dim, V vocab; T tokens in this step, S sinks, W window.
 *
 * Llama, each layer (Touvron et al. 2023, "LLaMA"):
 *     h = x + Wo · Attn(RoPE(Wq · norm(x)), RoPE(Wk · norm(x)), Wv · norm(x))
 *     x = h + W2 · (silu(W1 · norm(h)) * (W3 · norm(h)))
 * then logits = Wout · norm(x).
 *
 * Gemma 3 (Gemma Team 2025, "Gemma 3 Technical Report"): x starts as the
 * embedding times sqrt(D); each layer
 *     q = RoPE(qnorm(Wq · norm(x))), k = RoPE(knorm(Wk · norm(x))), v = Wv · norm(x)
 *     h = x + postnorm(Wo · Attn(q, k, v))
 *     x = h + postnorm(W2 · (gelu_tanh(W1 · norm(h)) * (W3 · norm(h))))
 * with qnorm/knorm RMSNorms over each head's Dh values, NEOX RoPE, and five
 * local layers (a sliding window of their own, RoPE base 10^4) to every
 * global one (RoPE base 10^6); logits = Wout · norm(x), soft-capped if the
 * file says so. The file's norm weights already hold 1 + w (the GGUF
 * converter folds in Gemma's "1 +"), so every norm is the plain RMSNorm.
 *
 * Attention runs over the keys kvcache.h says a token sees (a global layer:
 * pinned sinks + its window, per the policy; a local layer: the model's own
 * window), with the model's normalizer.
 */
#include "forward.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int fwd_init(struct fwd *f, const struct model *m, struct backend *b, const struct kv_geometry *g,
             char *err, size_t err_len)
{
    memset(f, 0, sizeof *f);
    f->m = m;
    f->b = b;
    f->max_tokens = b->max_tokens;
    struct kv_geometry geo = *g; /* a model's local layers are part of the model */
    geo.swa_period = m->hp.n_swa > 0 ? m->hp.swa_period : 0;
    geo.swa_window = m->hp.n_swa > 0 ? m->hp.n_swa : 0;
    int rc = kv_pool_init(&f->pool, &geo, err, err_len);
    if (rc < 0)
        return rc;
    rc = b->ops->kv_alloc(b, &geo);
    if (rc == -EINVAL) {
        snprintf(err, err_len,
                 "kv cache: the %s backend cannot hold this KV cache (%s, head dim %d, %lld keys "
                 "a query)",
                 b->ops->name, kv_dtype_name(geo.dtype), geo.head_dim,
                 (long long)(geo.n_sinks + geo.window));
        fwd_free(f);
        return rc;
    }
    if (rc < 0) {
        snprintf(err, err_len, "kv cache: cannot allocate %zu bytes",
                 2 * kv_geometry_slot_bytes(&geo) * (size_t)geo.n_slots);
        fwd_free(f);
        return rc;
    }
    size_t T = (size_t)f->max_tokens;
    f->tokens = calloc(T, sizeof *f->tokens);
    f->pos = calloc(T, sizeof *f->pos);
    f->slot = calloc(T, sizeof *f->slot);
    f->cell = calloc(T, sizeof *f->cell);
    f->out_rows = calloc(T, sizeof *f->out_rows);
    f->view = calloc(T, sizeof *f->view);
    f->cell_local = calloc(T, sizeof *f->cell_local);
    f->view_local = calloc(T, sizeof *f->view_local);
    f->seq = calloc(T, sizeof *f->seq);
    f->logits = b->acts.logits; /* the backend's host rows (pinned on CUDA) */
    if (!f->tokens || !f->pos || !f->slot || !f->cell || !f->out_rows || !f->view || !f->seq ||
        !f->cell_local || !f->view_local || !f->logits) {
        snprintf(err, err_len, "forward: out of memory");
        fwd_free(f);
        return -ENOMEM;
    }
    return 0;
}

void fwd_free(struct fwd *f)
{
    kv_pool_free(&f->pool);
    free(f->tokens);
    free(f->pos);
    free(f->slot);
    free(f->cell);
    free(f->out_rows);
    free(f->view);
    free(f->cell_local);
    free(f->view_local);
    free(f->seq);
    free(f->first);
    memset(f, 0, sizeof *f);
}

int fwd_set_observer(struct fwd *f, const struct decoder_observer *obs, int host_acts)
{
    _Static_assert(DECODER_FIRST_K == BACKEND_PROBE_K, "the observer sees the probe's weights");
    if (obs && (obs->what & DECODER_OBSERVE_QK) && !host_acts)
        return -ENOTSUP;
    if (obs && (obs->what & DECODER_OBSERVE_FIRST) && !f->first) {
        f->first = calloc((size_t)f->m->hp.n_layer * (size_t)f->max_tokens *
                              (size_t)f->m->hp.n_head * BACKEND_PROBE_K,
                          sizeof(float));
        if (!f->first)
            return -ENOMEM;
    }
    if (!obs || !(obs->what & DECODER_OBSERVE_FIRST)) {
        free(f->first); /* unobserved steps take the fast attention path */
        f->first = NULL;
    }
    f->obs = obs ? *obs : (struct decoder_observer){0};
    return 0;
}

/* The observer's view of layer l of a step of T tokens. */
static void observe(const struct fwd *f, int l, int64_t T, int with_qk)
{
    const struct model_hparams *hp = &f->m->hp;
    struct decoder_layer_view v = {
        .layer = l,
        .T = T,
        .pos = f->pos,
        .n_head = hp->n_head,
        .n_head_kv = hp->n_head_kv,
        .head_dim = hp->head_dim,
        .first = f->first ? f->first + (size_t)l * (size_t)T * hp->n_head * BACKEND_PROBE_K : NULL,
        .q = with_qk ? f->b->acts.q : NULL,
        .k = with_qk ? f->b->acts.k : NULL,
        .scale = hp->attn_scale,
        .window = model_layer_is_local(hp, l) ? hp->n_swa : 0,
    };
    f->obs.on_layer(f->obs.arg, &v);
}

/* Lays the inputs out as one batch of T tokens. */
static int64_t build_batch(struct fwd *f, const struct fwd_input *in, int n_in,
                           struct fwd_batch *bt)
{
    const struct kv_geometry *geo = &f->pool.geo;
    int64_t T = 0, n_out = 0;
    for (int i = 0; i < n_in; i++) {
        const struct fwd_input *s = &in[i];
        if (s->n <= 0 || T + s->n > f->max_tokens)
            return -EINVAL;
        if (kv_seq_can_append(s->seq, geo, s->n) < 0)
            return -ENOSPC;
        struct kv_seq local = geo->swa_period > 0 ? kv_seq_local(s->seq, geo) : *s->seq;
        for (int64_t j = 0; j < s->n; j++) {
            if (s->tokens[j] < 0 || s->tokens[j] >= f->m->hp.n_vocab)
                return -EINVAL;
            int64_t p = s->seq->pos_next + j;
            f->tokens[T] = s->tokens[j];
            f->pos[T] = p;
            f->slot[T] = s->seq->slot;
            f->cell[T] = kv_seq_cell(s->seq, p);
            f->view[T] = kv_seq_view(s->seq, p);
            f->cell_local[T] = kv_seq_cell(&local, p);
            f->view_local[T] = kv_seq_view(&local, p);
            f->seq[T] = s->seq;
            if (s->logits == FWD_LOGITS_ALL || (s->logits == FWD_LOGITS_LAST && j == s->n - 1))
                f->out_rows[n_out++] = T;
            T++;
        }
    }
    *bt = (struct fwd_batch){
        .T = T,
        .tokens = f->tokens,
        .pos = f->pos,
        .slot = f->slot,
        .cell = f->cell,
        .view = f->view,
        .seq = f->seq,
        .cell_local = geo->swa_period > 0 ? f->cell_local : NULL,
        .view_local = geo->swa_period > 0 ? f->view_local : NULL,
        .n_out = n_out,
        .out_rows = f->out_rows,
    };
    return T;
}

/* Shared by both layers: q, k rotated at layer l's RoPE, stored, attended.
 * q, k, v hold the projections; att gets the attention output (T, H*Dh). */
static void attend(struct fwd *f, int l, int64_t T, int inline_obs)
{
    const struct model_hparams *hp = &f->m->hp;
    const struct model_layer *ly = &f->m->w.layers[l];
    const struct backend_ops *op = f->b->ops;
    struct backend *b = f->b;
    struct backend_acts *a = &b->acts;

    if (op->rope_store) { /* the same two ops as one */
        op->rope_store(b, l, a->q, a->qc, a->k, a->v);
    } else {
        op->rope(b, l, a->q, a->qc, a->k); /* q, qc, k rotated */
        op->kv_store(b, l, a->k, a->v);    /* into each token's cell */
    }
    op->attention(b, l, a->q, a->qc, ly->attn_sinks, hp->normalizer, a->att,
                  f->first ? f->first + (size_t)l * (size_t)T * hp->n_head * BACKEND_PROBE_K
                           : NULL);
    if (inline_obs) /* host activations: q and k still hold this layer's */
        observe(f, l, T, 1);
}

/* y[i] = x W[i]^T for the n weights that share the input x. */
static void matmul_shared(struct backend *b, const struct tensor *const *W, float *const *y, int n,
                          const float *x, int64_t T)
{
    if (b->ops->matmul_shared) {
        b->ops->matmul_shared(b, W, y, n, x, T);
        return;
    }
    for (int i = 0; i < n; i++)
        b->ops->matmul(b, W[i], x, y[i], T);
}

/* A projection with its element-wise neighbours (struct backend_product):
 * the backend's fused op, or the same ops one after another. */
static void product(struct backend *b, const struct backend_product *p, int64_t T)
{
    const struct backend_ops *op = b->ops;
    if (op->product) {
        op->product(b, p, T);
        return;
    }
    const float *in = p->x;
    if (p->norm) {
        op->rmsnorm(b, p->x, p->norm, p->xn, T);
        in = p->xn;
    }
    matmul_shared(b, p->W, p->y, p->n, in, T);
    if (p->then == BACKEND_THEN_SWIGLU)
        op->swiglu(b, p->y[0], p->y[1], T);
    else if (p->then == BACKEND_THEN_ADD)
        op->add(b, p->res, p->y[0], T);
}

/* q, k, v (T, H*Dh), (T, Hkv*Dh), (T, Hkv*Dh) = projections of xb */
static void project_qkv(struct backend *b, const struct model_layer *ly, int64_t T)
{
    struct backend_acts *a = &b->acts;
    const struct tensor *W[] = {&ly->wq, &ly->wk, &ly->wv};
    float *const y[] = {a->q, a->k, a->v};
    matmul_shared(b, W, y, 3, a->xb, T);
}

/* hb, hb2 (T, F) = gate and up projections of xb */
static void project_gate_up(struct backend *b, const struct model_layer *ly, int64_t T)
{
    struct backend_acts *a = &b->acts;
    const struct tensor *W[] = {&ly->w_gate, &ly->w_up};
    float *const y[] = {a->hb, a->hb2};
    matmul_shared(b, W, y, 2, a->xb, T);
}

static void llama_layer(struct fwd *f, int l, int64_t T, int inline_obs)
{
    const struct model_layer *ly = &f->m->w.layers[l];
    struct backend *b = f->b;
    struct backend_acts *a = &b->acts;

    /* attention block: pre-norm, projections, RoPE, cache, attend, project
     * back into the residual stream */
    /* xb = rmsnorm(x); q, k, v = xb Wq, xb Wk, xb Wv */
    const struct backend_product qkv = {
        .x = a->x,
        .norm = &ly->attn_norm,
        .xn = a->xb,
        .n = 3,
        .W = {&ly->wq, &ly->wk, &ly->wv},
        .y = {a->q, a->k, a->v},
    };
    /* x += att Wo */
    const struct backend_product out = {
        .x = a->att,
        .n = 1,
        .W = {&ly->wo},
        .y = {a->xb2},
        .then = BACKEND_THEN_ADD,
        .res = a->x,
    };
    product(b, &qkv, T);
    attend(f, l, T, inline_obs); /* att (T, H*Dh) */
    product(b, &out, T);

    /* feed-forward block: pre-norm, SwiGLU, project back */
    /* xb = rmsnorm(x); hb = silu(xb Wgate) * (xb Wup) */
    const struct backend_product gate_up = {
        .x = a->x,
        .norm = &ly->ffn_norm,
        .xn = a->xb,
        .n = 2,
        .W = {&ly->w_gate, &ly->w_up},
        .y = {a->hb, a->hb2},
        .then = BACKEND_THEN_SWIGLU,
    };
    /* x += hb Wdown */
    const struct backend_product down = {
        .x = a->hb,
        .n = 1,
        .W = {&ly->w_down},
        .y = {a->xb2},
        .then = BACKEND_THEN_ADD,
        .res = a->x,
    };
    product(b, &gate_up, T);
    product(b, &down, T);
}

static void gemma_layer(struct fwd *f, int l, int64_t T, int inline_obs)
{
    const struct model_hparams *hp = &f->m->hp;
    const struct model_layer *ly = &f->m->w.layers[l];
    const struct backend_ops *op = f->b->ops;
    struct backend *b = f->b;
    struct backend_acts *a = &b->acts;

    /* attention block: pre-norm, projections, per-head q/k norms, RoPE, cache,
     * attend, project back, post-norm, residual */
    op->rmsnorm(b, a->x, &ly->attn_norm, a->xb, T);                  /* xb (T, D) */
    project_qkv(b, ly, T);                                           /* q, k, v */
    op->rmsnorm(b, a->q, &ly->attn_q_norm, a->q, T * hp->n_head);    /* each (Dh) head */
    op->rmsnorm(b, a->k, &ly->attn_k_norm, a->k, T * hp->n_head_kv); /* each (Dh) head */
    attend(f, l, T, inline_obs);                                     /* att (T, H*Dh) */
    op->matmul(b, &ly->wo, a->att, a->xb2, T);                       /* xb2 (T, D) */
    op->rmsnorm(b, a->xb2, &ly->post_attn_norm, a->xb2, T);
    op->add(b, a->x, a->xb2, T); /* residual */

    /* feed-forward block: pre-norm, GeGLU, project back, post-norm, residual */
    op->rmsnorm(b, a->x, &ly->ffn_norm, a->xb, T);
    project_gate_up(b, ly, T);                    /* hb, hb2 (T, F) */
    op->geglu(b, a->hb, a->hb2, T);               /* hb = gelu_tanh(hb) * hb2 */
    op->matmul(b, &ly->w_down, a->hb, a->xb2, T); /* xb2 (T, D) */
    op->rmsnorm(b, a->xb2, &ly->post_ffw_norm, a->xb2, T);
    op->add(b, a->x, a->xb2, T); /* residual */
}

int64_t fwd_step(struct fwd *f, const struct fwd_input *in, int n_in)
{
    const struct model_hparams *hp = &f->m->hp;
    const struct model_weights *w = &f->m->w;
    const struct backend_ops *op = f->b->ops;
    struct backend *b = f->b;
    struct backend_acts *a = &b->acts;
    struct fwd_batch bt;
    const int gemma = hp->arch_kind == MODEL_ARCH_GEMMA3;

    int64_t T = build_batch(f, in, n_in, &bt);
    if (T < 0)
        return T;
    int rc = op->begin_step(b, &bt);
    if (rc < 0)
        return rc; /* -EIO (a device failure) must reach the engine as such */
    const int inline_obs = f->obs.on_layer && (f->obs.what & DECODER_OBSERVE_QK);

    op->embed(b, a->x); /* x (T, D) */
    if (gemma)          /* sqrt(D) rounded to f32, as Gemma's reference scales it */
        op->scale(b, a->x, (float)sqrt((double)hp->n_embd), T);
    for (int l = 0; l < hp->n_layer; l++) {
        if (gemma)
            gemma_layer(f, l, T, inline_obs);
        else
            llama_layer(f, l, T, inline_obs);
    }
    if (bt.n_out > 0) {
        op->gather(b, a->x, a->xo); /* xo (n_out, D) */
        op->rmsnorm(b, a->xo, &w->output_norm, a->xo, bt.n_out);
        op->logits(b, &w->output, a->xo, f->logits); /* logits (n_out, V) */
    }
    if (op->sync(b) < 0)
        return -EIO;
    if (hp->final_softcap > 0) { /* host rows after sync: logits = c tanh(logits / c) */
        const float cap = hp->final_softcap;
        for (int64_t i = 0; i < bt.n_out * hp->n_vocab; i++)
            f->logits[i] = cap * tanhf(f->logits[i] / cap);
    }
    if (f->obs.on_layer && !inline_obs) /* the weights are the host's after sync */
        for (int l = 0; l < hp->n_layer; l++)
            observe(f, l, T, 0);
    for (int i = 0; i < n_in; i++)
        kv_seq_advance(in[i].seq, in[i].n);
    return bt.n_out;
}
