/*
 * backend_cuda.cu: the CUDA backend (backend.h), the ops table and the
 * launches of its element-wise kernels (elementwise_kernels.cuh). Reference:
 * engine/cpu/backend_cpu.c, op for op (tests/invariants/test_cuda_matches_cpu.c).
 *
 * One stream, one synchronization per step. The ops forward.c calls do not
 * launch anything: each records a command, and sync issues the whole step at
 * once, on the stream: the step's metadata (one host-to-device copy from
 * pinned memory), then every command. A step made only of decode tokens is
 * captured as a CUDA graph the first time its exact command list is seen
 * (same batch shape, same buffers) and replayed from then on; steps with
 * prefill tiles, probe steps and shapes past the cache run eagerly. Because
 * the graph is chosen by comparing the recorded commands, a replay can never
 * run something forward.c did not ask for.
 *
 * Memory: weights are uploaded once (matmul.cu: FP16 matrices, FP32 norms and
 * embedding rows); activations are device FP32 with one FP16 copy of the last
 * GEMM input; the logits come back into pinned host rows (acts.logits).
 *
 * Errors: every CUDA and cuBLAS call is checked (common.cuh); a failure in a
 * step makes sync return -EIO (engine.c fails that step's sequences), never
 * exits.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.cuh"
#include "elementwise_kernels.cuh"

#define PREFILL_MIN_RUN 4 /* a sequence's run of tokens this long uses the prefill kernel */
#define GRAPH_CACHE 64    /* decode shapes kept as CUDA graphs */
#define CUBLAS_WORKSPACE (32u << 20)

void cuda_log_error(const char *file, int line, const char *expr, const char *msg)
{
    fprintf(stderr, "cuda backend: %s:%d: %s: %s\n", file, line, expr, msg);
}

enum cmd_op {
    CMD_EMBED = 1,
    CMD_RMSNORM,
    CMD_MATMUL,
    CMD_ROPE,
    CMD_KV_STORE,
    CMD_ATTENTION,
    CMD_SWIGLU,
    CMD_ADD,
    CMD_GATHER,
    CMD_LOGITS,
    CMD_GEGLU,
    CMD_SCALE,
};

/* One recorded op. Zeroed before it is filled, so two lists compare with
 * memcmp (padding included). */
struct cmd {
    int op;
    int layer;
    int norm;
    float s; /* scale's factor */
    int64_t rows, N, K;
    const void *a, *b, *c; /* inputs (device) */
    void *d, *e;           /* outputs (device) */
    float *host;           /* logits or probe destination (host) */
};

struct weight { /* one uploaded tensor */
    const void *host;
    int as_f32;
    void *dev;
};

struct graph_entry {
    int64_t T, n_out, n_dec;
    int n_cmds;
    struct cmd *cmds;
    cudaGraphExec_t exec;
};

struct shape {
    int64_t T, n_out, n_dec;
};

/* Byte offsets of one step's metadata (16-byte aligned sections). The _local
 * sections are the local layers' (kv_geometry.swa_period > 0): the tokens'
 * cells and views in the local rings, their prefill tiles, and the RoPE table
 * at the absolute positions with the local layers' base. */
struct meta_layout {
    size_t tok, cs_abs, cs_cache, dec, tiles, out_rows, sinks;
    size_t tok_local, tiles_local, cs_abs_local, total;
};

struct cuda_ctx {
    int device;
    int use_graphs;
    cudaStream_t stream;
    cublasHandle_t blas;
    void *blas_ws;

    struct weight *w;
    int n_w, cap_w;

    /* KV */
    struct kv_geometry geo;
    struct cuda_kv_geo *lgeo; /* [L] each layer's offsets */
    int kv_f16;
    void *kmem, *vmem;
    size_t kv_elems; /* elements of kmem (and of vmem) */
    int n_split;
    float *part;        /* split partial states */
    float *stats;       /* (T, H, 2) */
    float *sink_logits; /* (T, H) per-token sink logits of a layer with sink keys */

    /* activations */
    __half *h16;         /* FP16 copy of one activation buffer */
    const float *h16_of; /* which (NULL: stale) */
    float *dlogits;      /* (max_tokens, V) */

    /* step */
    unsigned char *hmeta, *dmeta; /* pinned host / device metadata */
    struct meta_layout ml;
    int64_t T, n_out, n_dec, n_tiles;
    int tile_tokens;
    struct cmd *cmds;
    int n_cmds, cap_cmds;
    int record_err; /* an op could not be recorded: the step fails at sync */
    int has_probe;

    /* probe (allocated on first use) */
    float *dprobe, *hprobe; /* (L, max_tokens, H, PROBE_K) */

    struct graph_entry graphs[GRAPH_CACHE];
    int n_graphs;
    struct shape seen[GRAPH_CACHE * 2]; /* decode shapes run once (captured the next time) */
    int n_seen;
};

/* Blocks of 256 threads for a grid-stride loop over n elements. */
static unsigned grid_for(int64_t n)
{
    int64_t b = (n + 255) / 256;
    return (unsigned)(b < 4096 ? (b > 0 ? b : 1) : 4096);
}

/* ---- helpers ------------------------------------------------------------------------------- */

static struct cuda_ctx *ctx_of(struct backend *b)
{
    return static_cast<struct cuda_ctx *>(b->ctx);
}

static size_t align16(size_t x)
{
    return (x + 15) & ~(size_t)15;
}

static struct meta_layout meta_layout_for(int64_t T, int rope_dim, int64_t n_sinks_all)
{
    struct meta_layout l;
    size_t o = 0;
    l.tok = o;
    o = align16(o + (size_t)T * sizeof(struct cuda_tok));
    l.cs_abs = o;
    o = align16(o + (size_t)T * (size_t)rope_dim * sizeof(float));
    l.cs_cache = o;
    o = align16(o + (size_t)T * (size_t)rope_dim * sizeof(float));
    l.dec = o;
    o = align16(o + (size_t)T * sizeof(int32_t));
    l.tiles = o;
    o = align16(o + (size_t)T * sizeof(struct cuda_tile));
    l.out_rows = o;
    o = align16(o + (size_t)T * sizeof(int32_t));
    l.sinks = o;
    o = align16(o + (size_t)n_sinks_all * sizeof(float));
    l.tok_local = o;
    o = align16(o + (size_t)T * sizeof(struct cuda_tok));
    l.tiles_local = o;
    o = align16(o + (size_t)T * sizeof(struct cuda_tile));
    l.cs_abs_local = o;
    o = align16(o + (size_t)T * (size_t)rope_dim * sizeof(float));
    l.total = o;
    return l;
}

static const void *weight_dev(struct cuda_ctx *c, const void *host, int as_f32)
{
    for (int i = 0; i < c->n_w; i++)
        if (c->w[i].host == host && c->w[i].as_f32 == as_f32)
            return c->w[i].dev;
    return NULL;
}

static int upload(struct cuda_ctx *c, const struct tensor *t, int as_f32, char *err, size_t el)
{
    if (!t->data || weight_dev(c, t->data, as_f32))
        return 0; /* absent, or shared with another view (tied embeddings) */
    if (c->n_w == c->cap_w) {
        int cap = c->cap_w ? 2 * c->cap_w : 64;
        struct weight *nw = (struct weight *)realloc(c->w, (size_t)cap * sizeof *nw);
        if (!nw) {
            snprintf(err, el, "cuda backend: out of memory");
            return -ENOMEM;
        }
        c->w = nw;
        c->cap_w = cap;
    }
    void *dev = NULL;
    int rc = cuda_upload_tensor(t, as_f32, &dev, err, el);
    if (rc < 0)
        return rc;
    c->w[c->n_w++] = (struct weight){t->data, as_f32, dev};
    return 0;
}

static struct cmd *record(struct backend *b, int op)
{
    struct cuda_ctx *c = ctx_of(b);
    if (c->n_cmds == c->cap_cmds) {
        int cap = c->cap_cmds ? 2 * c->cap_cmds : 1024;
        struct cmd *n = (struct cmd *)realloc(c->cmds, (size_t)cap * sizeof *n);
        if (!n) {
            c->record_err = 1;
            return NULL;
        }
        c->cmds = n;
        c->cap_cmds = cap;
    }
    struct cmd *k = &c->cmds[c->n_cmds++];
    memset(k, 0, sizeof *k);
    k->op = op;
    return k;
}

/* ---- ops: record ----------------------------------------------------------------------------- */

static void cuda_embed(struct backend *b, float *x)
{
    struct cmd *k = record(b, CMD_EMBED);
    if (k)
        k->d = x;
}

static void cuda_rmsnorm(struct backend *b, const float *x, const struct tensor *w, float *out,
                         int64_t rows)
{
    struct cmd *k = record(b, CMD_RMSNORM);
    if (!k)
        return;
    k->a = x;
    k->b = weight_dev(ctx_of(b), w->data, 1);
    k->d = out;
    k->rows = rows;
    k->K = w->ne0;
    if (!k->b)
        ctx_of(b)->record_err = 1;
}

static void cuda_matmul(struct backend *b, const struct tensor *W, const float *x, float *y,
                        int64_t rows)
{
    struct cmd *k = record(b, CMD_MATMUL);
    if (!k)
        return;
    k->a = x;
    k->b = weight_dev(ctx_of(b), W->data, 0);
    k->d = y;
    k->rows = rows;
    k->N = W->ne1;
    k->K = W->ne0;
    if (!k->b)
        ctx_of(b)->record_err = 1;
}

static void cuda_rope(struct backend *b, int layer, float *q, float *qc, float *kk)
{
    struct cmd *k = record(b, CMD_ROPE);
    if (!k)
        return;
    k->layer = layer;
    k->d = q;
    k->e = qc;
    k->c = kk;
}

static void cuda_kv_store(struct backend *b, int layer, const float *kk, const float *v)
{
    struct cmd *k = record(b, CMD_KV_STORE);
    if (!k)
        return;
    k->layer = layer;
    k->a = kk;
    k->b = v;
}

static void cuda_attention(struct backend *b, int layer, const float *q, const float *qc,
                           const float *sinks, enum model_normalizer norm, float *att, float *probe)
{
    struct cuda_ctx *c = ctx_of(b);
    struct cmd *k = record(b, CMD_ATTENTION);
    if (!k)
        return;
    k->layer = layer;
    k->norm = (int)norm;
    k->a = q;
    k->b = qc;
    k->d = att;
    k->host = probe;
    /* the sink logits travel with the step's metadata: K = their index, -1 none */
    const struct model *m = b->model;
    const int64_t n_all = (int64_t)m->hp.n_layer * m->hp.n_head;
    k->K = -1;
    if (sinks) {
        if (m->sinks_mem && sinks >= m->sinks_mem && sinks + m->hp.n_head <= m->sinks_mem + n_all)
            k->K = sinks - m->sinks_mem;
        else
            c->record_err = 1; /* logits this backend cannot see */
    }
    if (probe)
        c->has_probe = 1;
}

static void cuda_swiglu(struct backend *b, float *hb, const float *hb2, int64_t rows)
{
    struct cmd *k = record(b, CMD_SWIGLU);
    if (!k)
        return;
    k->d = hb;
    k->a = hb2;
    k->rows = rows;
}

static void cuda_geglu(struct backend *b, float *hb, const float *hb2, int64_t rows)
{
    struct cmd *k = record(b, CMD_GEGLU);
    if (!k)
        return;
    k->d = hb;
    k->a = hb2;
    k->rows = rows;
}

static void cuda_scale(struct backend *b, float *x, float s, int64_t rows)
{
    struct cmd *k = record(b, CMD_SCALE);
    if (!k)
        return;
    k->d = x;
    k->s = s;
    k->rows = rows;
}

static void cuda_add(struct backend *b, float *x, const float *y, int64_t rows)
{
    struct cmd *k = record(b, CMD_ADD);
    if (!k)
        return;
    k->d = x;
    k->a = y;
    k->rows = rows;
}

static void cuda_gather(struct backend *b, const float *x, float *xo)
{
    struct cmd *k = record(b, CMD_GATHER);
    if (!k)
        return;
    k->a = x;
    k->d = xo;
}

static void cuda_logits(struct backend *b, const struct tensor *W, const float *xo,
                        float *host_logits)
{
    struct cmd *k = record(b, CMD_LOGITS);
    if (!k)
        return;
    k->a = xo;
    k->b = weight_dev(ctx_of(b), W->data, 0);
    k->N = W->ne1;
    k->K = W->ne0;
    k->host = host_logits;
    if (!k->b)
        ctx_of(b)->record_err = 1;
}

/* ---- ops: issue ------------------------------------------------------------------------------ */

/* The FP16 copy of x for a GEMM (converted only when stale). */
static int f16_input(struct cuda_ctx *c, const float *x, int64_t n)
{
    int rc = 0;
    if (c->h16_of != x) {
        CUDA_TRY(cuda_to_f16(x, c->h16, n, c->stream));
        c->h16_of = x;
    }
    return 0;
fail:
    return rc;
}

static int issue_attention(struct backend *b, const struct cmd *k)
{
    struct cuda_ctx *c = ctx_of(b);
    const struct model_hparams *hp = &b->model->hp;
    int rc = 0;
    const int local = kv_geometry_layer_is_local(&c->geo, k->layer);
    struct cuda_attn_args a;
    memset(&a, 0, sizeof a);
    a.q = (const float *)k->a;
    a.qc = (const float *)k->b;
    a.out = (float *)k->d;
    a.out_h = c->h16;
    a.stats = c->stats;
    a.k = c->kmem;
    a.v = c->vmem;
    a.tok = (const struct cuda_tok *)(c->dmeta + (local ? c->ml.tok_local : c->ml.tok));
    a.dec = (const int32_t *)(c->dmeta + c->ml.dec);
    a.tiles = (const struct cuda_tile *)(c->dmeta + (local ? c->ml.tiles_local : c->ml.tiles));
    a.part = c->part;
    a.sinks = k->K >= 0 ? (const float *)(c->dmeta + c->ml.sinks) + k->K : NULL;
    /* the sink values were uploaded with the weights (f32) */
    const void *sv = b->model->w.layers[k->layer].attn_sinks_v.data;
    a.sinks_v = sv && k->norm == MODEL_NORM_SINK ? (const float *)weight_dev(c, sv, 1) : NULL;
    if (sv && k->norm == MODEL_NORM_SINK && !a.sinks_v)
        return -EIO;
    /* sink keys: each token's own sink logits, from q as rope_kernel left it
     * (rotated at the absolute position, with the layer's table) */
    const void *sk = b->model->w.layers[k->layer].attn_sinks_k.data;
    if (sk && k->norm == MODEL_NORM_SINK) {
        const float *dk = (const float *)weight_dev(c, sk, 1);
        if (!dk || !a.sinks)
            return -EIO;
        const int rope_local = model_layer_is_local(hp, k->layer);
        const float *cs =
            (const float *)(c->dmeta + (rope_local ? c->ml.cs_abs_local : c->ml.cs_abs));
        sink_key_logits_kernel<<<(unsigned)c->T, 128, 0, c->stream>>>(
            a.q, cs, a.sinks, dk, c->sink_logits, hp->n_head, hp->n_head_kv, hp->head_dim,
            hp->rope_dim, hp->rope_neox ? 1 : 0, hp->attn_scale);
        a.sink_logits = c->sink_logits;
    }
    a.geo = c->lgeo[k->layer];
    a.layer = k->layer;
    a.norm = k->norm;
    a.H = hp->n_head;
    a.Hkv = hp->n_head_kv;
    a.G = hp->n_head / hp->n_head_kv;
    a.Dh = hp->head_dim;
    a.n_split = c->n_split;
    a.tile_tokens = c->tile_tokens;
    a.scale = hp->attn_scale;
    CUDA_TRY(cuda_attention_prefill(&a, (int)c->n_tiles, c->kv_f16, c->stream));
    CUDA_TRY(cuda_attention_decode(&a, (int)c->n_dec, c->kv_f16, c->stream));
    c->h16_of = a.out;
    if (k->host) {
        const size_t per_layer = (size_t)c->T * (size_t)hp->n_head * BACKEND_PROBE_K;
        float *dp = c->dprobe + (size_t)k->layer * per_layer;
        CUDA_TRY(cuda_attention_probe(&a, (int)c->T, c->kv_f16, dp, c->stream));
        CUDA_TRY(cudaMemcpyAsync(c->hprobe + (size_t)k->layer * per_layer, dp,
                                 per_layer * sizeof(float), cudaMemcpyDeviceToHost, c->stream));
    }
    return 0;
fail:
    return rc;
}

static int issue(struct backend *b, const struct cmd *k)
{
    struct cuda_ctx *c = ctx_of(b);
    const struct model_hparams *hp = &b->model->hp;
    const int D = hp->n_embd, H = hp->n_head, Hkv = hp->n_head_kv, Dh = hp->head_dim;
    const float *cs_abs = (const float *)(c->dmeta + c->ml.cs_abs);
    const float *cs_cache = (const float *)(c->dmeta + c->ml.cs_cache);
    const struct cuda_tok *tok = (const struct cuda_tok *)(c->dmeta + c->ml.tok);
    const struct cuda_tok *tok_local = (const struct cuda_tok *)(c->dmeta + c->ml.tok_local);
    const unsigned T = (unsigned)c->T;
    int rc = 0;
    switch (k->op) {
    case CMD_EMBED:
        embed_kernel<<<T, 256, 0, c->stream>>>(
            (const float *)weight_dev(c, b->model->w.tok_embd.data, 1), tok, (float *)k->d, D);
        c->h16_of = NULL;
        break;
    case CMD_RMSNORM:
        rmsnorm_kernel<<<(unsigned)k->rows, 256, 0, c->stream>>>((const float *)k->a,
                                                                 (const float *)k->b, (float *)k->d,
                                                                 c->h16, (int)k->K, hp->norm_eps);
        c->h16_of = (const float *)k->d;
        break;
    case CMD_MATMUL:
        rc = f16_input(c, (const float *)k->a, k->rows * k->K);
        if (rc < 0)
            return rc;
        rc = cuda_gemm(c->blas, (const __half *)k->b, k->N, k->K, c->h16, k->rows, (float *)k->d);
        if (rc < 0)
            return rc;
        break;
    case CMD_ROPE: {
        /* a local layer rotates with its own base and keeps no sinks, so its
         * qc is never scored: both from the local table, as cpu_rope */
        const float *cs_local = (const float *)(c->dmeta + c->ml.cs_abs_local);
        const int local = model_layer_is_local(hp, k->layer);
        rope_kernel<<<T, 128, 0, c->stream>>>(
            (float *)k->d, (float *)k->e, (float *)k->c, local ? cs_local : cs_abs,
            local ? cs_local : cs_cache, H, Hkv, Dh, hp->rope_dim, hp->rope_neox ? 1 : 0);
        c->h16_of = NULL;
        break;
    }
    case CMD_KV_STORE: {
        const struct cuda_tok *tk = kv_geometry_layer_is_local(&c->geo, k->layer) ? tok_local : tok;
        if (c->kv_f16)
            kv_store_kernel<__half><<<T, 128, 0, c->stream>>>(
                (const float *)k->a, (const float *)k->b, (__half *)c->kmem, (__half *)c->vmem, tk,
                c->lgeo[k->layer], Hkv, Dh);
        else
            kv_store_kernel<float><<<T, 128, 0, c->stream>>>(
                (const float *)k->a, (const float *)k->b, (float *)c->kmem, (float *)c->vmem, tk,
                c->lgeo[k->layer], Hkv, Dh);
        break;
    }
    case CMD_ATTENTION:
        return issue_attention(b, k);
    case CMD_SWIGLU: {
        const int64_t n = k->rows * hp->n_ff;
        swiglu_kernel<<<grid_for(n), 256, 0, c->stream>>>((float *)k->d, (const float *)k->a,
                                                          c->h16, n);
        c->h16_of = (const float *)k->d;
        break;
    }
    case CMD_GEGLU: {
        const int64_t n = k->rows * hp->n_ff;
        geglu_kernel<<<grid_for(n), 256, 0, c->stream>>>((float *)k->d, (const float *)k->a, c->h16,
                                                         n);
        c->h16_of = (const float *)k->d;
        break;
    }
    case CMD_SCALE: {
        const int64_t n = k->rows * D;
        scale_kernel<<<grid_for(n), 256, 0, c->stream>>>((float *)k->d, k->s, n);
        c->h16_of = NULL;
        break;
    }
    case CMD_ADD: {
        const int64_t n = k->rows * D;
        add_kernel<<<grid_for(n), 256, 0, c->stream>>>((float *)k->d, (const float *)k->a, n);
        c->h16_of = NULL;
        break;
    }
    case CMD_GATHER:
        if (c->n_out > 0)
            gather_kernel<<<(unsigned)c->n_out, 256, 0, c->stream>>>(
                (const float *)k->a, (float *)k->d, (const int32_t *)(c->dmeta + c->ml.out_rows),
                D);
        c->h16_of = NULL;
        break;
    case CMD_LOGITS:
        if (c->n_out <= 0)
            break;
        rc = f16_input(c, (const float *)k->a, c->n_out * k->K);
        if (rc < 0)
            return rc;
        rc = cuda_gemm(c->blas, (const __half *)k->b, k->N, k->K, c->h16, c->n_out, c->dlogits);
        if (rc < 0)
            return rc;
        CUDA_TRY(cudaMemcpyAsync(k->host, c->dlogits, (size_t)(c->n_out * k->N) * sizeof(float),
                                 cudaMemcpyDeviceToHost, c->stream));
        break;
    default:
        return -EINVAL;
    }
    CUDA_TRY(cudaGetLastError());
    return 0;
fail:
    return rc;
}

/* The metadata copy, then every command, on the stream. */
static int issue_step(struct backend *b)
{
    struct cuda_ctx *c = ctx_of(b);
    int rc = 0;
    c->h16_of = NULL;
    CUDA_TRY(cudaMemcpyAsync(c->dmeta, c->hmeta, c->ml.total, cudaMemcpyHostToDevice, c->stream));
    for (int i = 0; i < c->n_cmds; i++) {
        const struct cmd *k = &c->cmds[i], *nx = i + 1 < c->n_cmds ? &c->cmds[i + 1] : NULL;
        if (k->op == CMD_ADD && nx && nx->op == CMD_RMSNORM && nx->a == k->d &&
            nx->rows == k->rows && nx->d != k->d && nx->d != k->a) {
            /* fused: one pass over the residual stream instead of two */
            add_rmsnorm_kernel<<<(unsigned)k->rows, 256, 0, c->stream>>>(
                (float *)k->d, (const float *)k->a, (const float *)nx->b, (float *)nx->d, c->h16,
                (int)nx->K, b->model->hp.norm_eps);
            CUDA_TRY(cudaGetLastError());
            c->h16_of = (const float *)nx->d;
            i++;
            continue;
        }
        rc = issue(b, k);
        if (rc < 0)
            return rc;
    }
    return 0;
fail:
    return rc;
}

static struct graph_entry *graph_find(struct cuda_ctx *c)
{
    for (int i = 0; i < c->n_graphs; i++) {
        struct graph_entry *g = &c->graphs[i];
        if (g->T == c->T && g->n_out == c->n_out && g->n_dec == c->n_dec &&
            g->n_cmds == c->n_cmds &&
            memcmp(g->cmds, c->cmds, (size_t)c->n_cmds * sizeof *c->cmds) == 0)
            return g;
    }
    return NULL;
}

/* Captures the step as a graph and caches it; NULL (and rc) on failure. */
static struct graph_entry *graph_capture(struct backend *b, int *rcp)
{
    struct cuda_ctx *c = ctx_of(b);
    int rc = 0;
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    struct graph_entry *g = NULL;
    struct cmd *copy = (struct cmd *)malloc((size_t)c->n_cmds * sizeof *copy);
    if (!copy) {
        *rcp = -ENOMEM;
        return NULL;
    }
    CUDA_TRY(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal));
    rc = issue_step(b);
    {
        cudaError_t e = cudaStreamEndCapture(c->stream, &graph);
        if (rc < 0)
            goto fail;
        CUDA_TRY(e);
    }
    CUDA_TRY(cudaGraphInstantiate(&exec, graph, 0));
    cudaGraphDestroy(graph);
    graph = NULL;
    memcpy(copy, c->cmds, (size_t)c->n_cmds * sizeof *copy);
    g = &c->graphs[c->n_graphs++];
    g->T = c->T;
    g->n_out = c->n_out;
    g->n_dec = c->n_dec;
    g->n_cmds = c->n_cmds;
    g->cmds = copy;
    g->exec = exec;
    return g;
fail:
    if (graph)
        cudaGraphDestroy(graph);
    if (exec)
        cudaGraphExecDestroy(exec);
    free(copy);
    *rcp = rc < 0 ? rc : -EIO;
    return NULL;
}

/* The commands ran: a later sync of the same batch issues only what was
 * recorded after this one. */
static void step_done(struct cuda_ctx *c)
{
    c->n_cmds = 0;
    c->has_probe = 0;
    c->record_err = 0;
}

/* A decode shape is captured the second time it is seen, so that its first
 * run (module loading, cuBLAS's first use of a shape) happens eagerly. */
static int shape_seen_before(struct cuda_ctx *c)
{
    for (int i = 0; i < c->n_seen; i++)
        if (c->seen[i].T == c->T && c->seen[i].n_out == c->n_out && c->seen[i].n_dec == c->n_dec)
            return 1;
    if (c->n_seen < GRAPH_CACHE * 2)
        c->seen[c->n_seen++] = (struct shape){c->T, c->n_out, c->n_dec};
    return 0;
}

static int cuda_sync(struct backend *b)
{
    struct cuda_ctx *c = ctx_of(b);
    const struct model_hparams *hp = &b->model->hp;
    int rc = 0;
    if (c->record_err) {
        fprintf(stderr, "cuda backend: an op of this step named memory the backend does not own\n");
        rc = -EIO;
        goto fail;
    }
    CUDA_TRY(cudaSetDevice(c->device));
    if (c->has_probe && (!c->dprobe || !c->hprobe)) {
        const size_t n = (size_t)hp->n_layer * (size_t)b->max_tokens * (size_t)hp->n_head *
                         BACKEND_PROBE_K * sizeof(float);
        if (cudaMalloc((void **)&c->dprobe, n) != cudaSuccess ||
            cudaHostAlloc((void **)&c->hprobe, n, cudaHostAllocDefault) != cudaSuccess) {
            fprintf(stderr, "cuda backend: no memory for the probe's weights\n");
            cudaFree(c->dprobe); /* both, so the next probe step tries again */
            if (c->hprobe)
                cudaFreeHost(c->hprobe);
            c->dprobe = NULL;
            c->hprobe = NULL;
            rc = -ENOMEM;
            goto fail;
        }
    }
    {
        int logits_pinned = 1;
        for (int i = 0; i < c->n_cmds; i++)
            if (c->cmds[i].op == CMD_LOGITS && c->cmds[i].host != b->acts.logits)
                logits_pinned = 0;
        const int graphable =
            c->use_graphs && c->n_tiles == 0 && !c->has_probe && logits_pinned && c->T > 0;
        struct graph_entry *g = graphable ? graph_find(c) : NULL;
        if (!g && graphable && c->n_graphs < GRAPH_CACHE && shape_seen_before(c)) {
            g = graph_capture(b, &rc);
            if (!g) { /* run it eagerly, and stop capturing */
                fprintf(stderr, "cuda backend: CUDA graph capture failed; steps run eagerly\n");
                cudaGetLastError();
                c->use_graphs = 0;
                rc = 0;
            }
        }
        if (g) {
            CUDA_TRY(cudaGraphLaunch(g->exec, c->stream));
        } else {
            rc = issue_step(b);
            if (rc < 0)
                goto fail;
        }
    }
    CUDA_TRY(cudaStreamSynchronize(c->stream));
    if (c->has_probe) { /* pinned staging -> the callers' probe rows */
        const size_t per_layer = (size_t)c->T * (size_t)hp->n_head * BACKEND_PROBE_K;
        for (int i = 0; i < c->n_cmds; i++)
            if (c->cmds[i].op == CMD_ATTENTION && c->cmds[i].host)
                memcpy(c->cmds[i].host, c->hprobe + (size_t)c->cmds[i].layer * per_layer,
                       per_layer * sizeof(float));
    }
    step_done(c);
    return 0;
fail:
    /* leave the stream usable for the next step where the error allows it */
    cudaStreamSynchronize(c->stream);
    cudaGetLastError();
    step_done(c);
    return rc < 0 ? rc : -EIO;
}

/* ---- step metadata --------------------------------------------------------------------------- */

static int cuda_begin_step(struct backend *b, const struct fwd_batch *bt)
{
    struct cuda_ctx *c = ctx_of(b);
    const struct model *m = b->model;
    const struct model_hparams *hp = &m->hp;
    if (bt->T <= 0 || bt->T > b->max_tokens || bt->n_out > bt->T || bt->n_out < 0)
        return -EINVAL;
    if (cudaSetDevice(c->device) != cudaSuccess)
        return -EIO;
    const int64_t n_sinks_all = (int64_t)hp->n_layer * hp->n_head;
    c->ml = meta_layout_for(bt->T, hp->rope_dim, n_sinks_all);
    struct cuda_tok *tok = (struct cuda_tok *)(c->hmeta + c->ml.tok);
    float *cs_abs = (float *)(c->hmeta + c->ml.cs_abs);
    float *cs_cache = (float *)(c->hmeta + c->ml.cs_cache);
    int32_t *dec = (int32_t *)(c->hmeta + c->ml.dec);
    struct cuda_tile *tiles = (struct cuda_tile *)(c->hmeta + c->ml.tiles);
    int32_t *out_rows = (int32_t *)(c->hmeta + c->ml.out_rows);
    float *sinks = (float *)(c->hmeta + c->ml.sinks);
    struct cuda_tok *tok_local = (struct cuda_tok *)(c->hmeta + c->ml.tok_local);
    struct cuda_tile *tiles_local = (struct cuda_tile *)(c->hmeta + c->ml.tiles_local);
    float *cs_abs_local = (float *)(c->hmeta + c->ml.cs_abs_local);
    const int swa = c->geo.swa_period > 0;
    if (swa && (!bt->cell_local || !bt->view_local))
        return -EINVAL;

    for (int64_t t = 0; t < bt->T; t++) {
        const struct kv_seq *s = bt->seq[t];
        const struct kv_view *v = &bt->view[t];
        cuda_tok_pack(&tok[t], s, v, bt->slot[t], bt->cell[t], bt->tokens[t]);
        /* angles in double on the host, as the CPU backend does */
        rope_cos_sin(bt->pos[t], hp->rope_base, hp->rope_dim, cs_abs + t * hp->rope_dim);
        rope_cos_sin(v->pos_cache, hp->rope_base, hp->rope_dim, cs_cache + t * hp->rope_dim);
        if (hp->n_swa > 0)
            rope_cos_sin(bt->pos[t], hp->rope_base_local, hp->rope_dim,
                         cs_abs_local + t * hp->rope_dim);
        if (swa) { /* the token in the local layers' rings */
            const struct kv_seq sl = kv_seq_local(s, &c->geo);
            cuda_tok_pack(&tok_local[t], &sl, &bt->view_local[t], bt->slot[t], bt->cell_local[t],
                          bt->tokens[t]);
        }
    }
    /* runs of consecutive tokens of one sequence: long ones go to the prefill
     * kernel in tiles, the rest (decode tokens) to the split-K kernel */
    c->n_dec = c->n_tiles = 0;
    for (int64_t t = 0; t < bt->T;) {
        int64_t e = t + 1;
        while (e < bt->T && bt->seq[e] == bt->seq[t] && bt->pos[e] == bt->pos[e - 1] + 1)
            e++;
        if (e - t >= PREFILL_MIN_RUN) {
            for (int64_t f = t; f < e; f += c->tile_tokens) {
                int64_t n = e - f < c->tile_tokens ? e - f : c->tile_tokens;
                if (swa) {
                    const struct kv_seq sl = kv_seq_local(bt->seq[t], &c->geo);
                    tiles_local[c->n_tiles] =
                        cuda_tile_pack(tok_local, &sl, (int32_t)f, (int32_t)n);
                }
                tiles[c->n_tiles++] = cuda_tile_pack(tok, bt->seq[t], (int32_t)f, (int32_t)n);
            }
        } else {
            for (int64_t f = t; f < e; f++)
                dec[c->n_dec++] = (int32_t)f;
        }
        t = e;
    }
    for (int64_t i = 0; i < bt->n_out; i++)
        out_rows[i] = (int32_t)bt->out_rows[i];
    if (m->sinks_mem)
        memcpy(sinks, m->sinks_mem, (size_t)n_sinks_all * sizeof(float));
    c->T = bt->T;
    c->n_out = bt->n_out;
    c->n_cmds = 0;
    c->record_err = 0;
    c->has_probe = 0;
    return 0;
}

/* ---- memory ---------------------------------------------------------------------------------- */

static int cuda_kv_alloc(struct backend *b, const struct kv_geometry *g)
{
    struct cuda_ctx *c = ctx_of(b);
    const struct model_hparams *hp = &b->model->hp;
    int rc = 0;
    const size_t bytes = kv_geometry_slot_bytes(g) * (size_t)g->n_slots;
    if (g->dtype != KV_DTYPE_F16 && g->dtype != KV_DTYPE_F32)
        return -EINVAL;
    if (g->n_layer < hp->n_layer) /* lgeo is indexed by the model's layers */
        return -EINVAL;
    c->kv_f16 = g->dtype == KV_DTYPE_F16;
    c->geo = *g;
    c->lgeo = (struct cuda_kv_geo *)calloc((size_t)g->n_layer, sizeof *c->lgeo);
    if (!c->lgeo)
        return -ENOMEM;
    for (int l = 0; l < g->n_layer; l++)
        c->lgeo[l] = cuda_kv_geo_for(g, l);
    {
        /* a query sees at most S + W keys in a global layer, swa_window in a local one */
        int64_t most_keys = g->n_sinks + g->window;
        if (g->swa_period > 0 && g->swa_window > most_keys)
            most_keys = g->swa_window;
        c->n_split = (int)((most_keys + CUDA_ATT_SPLIT - 1) / CUDA_ATT_SPLIT);
    }
    const int G = hp->n_head / hp->n_head_kv;
    c->kv_elems = bytes / (c->kv_f16 ? 2 : 4);
    CUDA_TRY(cudaMalloc(&c->kmem, bytes));
    CUDA_TRY(cudaMalloc(&c->vmem, bytes));
    /* cleared on the backend's stream: a plain cudaMemset runs on the legacy
     * stream, which a non-blocking stream's steps and imports do not wait for */
    CUDA_TRY(cudaMemsetAsync(c->kmem, 0, bytes, c->stream));
    CUDA_TRY(cudaMemsetAsync(c->vmem, 0, bytes, c->stream));
    CUDA_TRY(cudaStreamSynchronize(c->stream));
    CUDA_TRY(cudaMalloc((void **)&c->part, (size_t)b->max_tokens * (size_t)hp->n_head_kv *
                                               (size_t)c->n_split * (size_t)G *
                                               ((size_t)hp->head_dim + 2) * sizeof(float)));
    return 0;
fail:
    return rc == -EIO ? -ENOMEM : rc; /* an allocation or clearing failed */
}

/* On the backend's stream (a non-blocking one: the legacy stream would not
 * order a pageable copy before the step's kernels), then waited for. */
static int copy_on_stream(struct cuda_ctx *c, void *dst, const void *src, size_t bytes,
                          cudaMemcpyKind kind)
{
    int rc = 0;
    CUDA_TRY(cudaSetDevice(c->device));
    CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, kind, c->stream));
    CUDA_TRY(cudaStreamSynchronize(c->stream));
    return 0;
fail:
    return rc;
}

static int cuda_copy_in(struct backend *b, float *dst, const float *src, int64_t n)
{
    return copy_on_stream(ctx_of(b), dst, src, (size_t)n * sizeof(float), cudaMemcpyHostToDevice);
}

static int cuda_copy_out(struct backend *b, float *dst, const float *src, int64_t n)
{
    return copy_on_stream(ctx_of(b), dst, src, (size_t)n * sizeof(float), cudaMemcpyDeviceToHost);
}

/* Session snapshots: one strided copy per direction and tensor; the kv
 * head rows of one layer of a slot are that layer's per_head elements apart
 * on the device (lgeo: a local layer has fewer cells) and host_cells * Dh
 * apart on the host. */
static int kv_copy(struct backend *b, int64_t slot, int layer, int64_t cell0, int64_t n, void *hk,
                   void *hv, int64_t host_cells, cudaMemcpyKind kind)
{
    struct cuda_ctx *c = ctx_of(b);
    const struct model_hparams *hp = &b->model->hp;
    int rc = 0;
    if (slot < 0 || layer < 0 || layer >= hp->n_layer || cell0 < 0 || n < 0 || n > host_cells)
        return -EINVAL;
    const struct cuda_kv_geo *lg = &c->lgeo[layer];
    if (cell0 + n > lg->cells || (size_t)slot * (size_t)lg->per_slot >= c->kv_elems)
        return -EINVAL;
    if (n == 0)
        return 0;
    const size_t esz = c->kv_f16 ? 2 : 4;
    const size_t dev_off = ((size_t)slot * (size_t)lg->per_slot + (size_t)lg->layer_off +
                            (size_t)cell0 * hp->head_dim) *
                           esz;
    const size_t dpitch = (size_t)lg->per_head * esz;
    const size_t hpitch = (size_t)host_cells * (size_t)hp->head_dim * esz;
    const size_t width = (size_t)n * (size_t)hp->head_dim * esz;
    const size_t rows = (size_t)hp->n_head_kv;
    char *dk = (char *)c->kmem + dev_off, *dv = (char *)c->vmem + dev_off;
    CUDA_TRY(cudaSetDevice(c->device));
    if (kind == cudaMemcpyDeviceToHost) {
        CUDA_TRY(cudaMemcpy2DAsync(hk, hpitch, dk, dpitch, width, rows, kind, c->stream));
        CUDA_TRY(cudaMemcpy2DAsync(hv, hpitch, dv, dpitch, width, rows, kind, c->stream));
    } else {
        CUDA_TRY(cudaMemcpy2DAsync(dk, dpitch, hk, hpitch, width, rows, kind, c->stream));
        CUDA_TRY(cudaMemcpy2DAsync(dv, dpitch, hv, hpitch, width, rows, kind, c->stream));
    }
    CUDA_TRY(cudaStreamSynchronize(c->stream));
    return 0;
fail:
    return rc;
}

static int cuda_kv_export(struct backend *b, int64_t slot, int layer, int64_t cell0, int64_t n,
                          void *hk, void *hv, int64_t host_cells)
{
    return kv_copy(b, slot, layer, cell0, n, hk, hv, host_cells, cudaMemcpyDeviceToHost);
}

static int cuda_kv_import(struct backend *b, int64_t slot, int layer, int64_t cell0, int64_t n,
                          const void *hk, const void *hv, int64_t host_cells)
{
    return kv_copy(b, slot, layer, cell0, n, (void *)hk, (void *)hv, host_cells,
                   cudaMemcpyHostToDevice);
}

static void cuda_free(struct backend *b)
{
    struct cuda_ctx *c = ctx_of(b);
    struct backend_acts *a = &b->acts;
    if (c) {
        cudaSetDevice(c->device);
        if (c->stream)
            cudaStreamSynchronize(c->stream);
        for (int i = 0; i < c->n_graphs; i++) {
            cudaGraphExecDestroy(c->graphs[i].exec);
            free(c->graphs[i].cmds);
        }
        for (int i = 0; i < c->n_w; i++)
            cudaFree(c->w[i].dev);
        free(c->w);
        free(c->cmds);
        free(c->lgeo);
        cudaFree(c->kmem);
        cudaFree(c->vmem);
        cudaFree(c->part);
        cudaFree(c->stats);
        cudaFree(c->sink_logits);
        cudaFree(c->h16);
        cudaFree(c->dlogits);
        cudaFree(c->dmeta);
        cudaFree(c->dprobe);
        if (c->hmeta)
            cudaFreeHost(c->hmeta);
        if (c->hprobe)
            cudaFreeHost(c->hprobe);
        if (a->logits)
            cudaFreeHost(a->logits);
        float **bufs[] = {&a->x, &a->xb,  &a->xb2, &a->q,   &a->qc, &a->k,
                          &a->v, &a->att, &a->hb,  &a->hb2, &a->xo};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
            cudaFree(*bufs[i]);
        if (c->blas)
            cublasDestroy(c->blas);
        cudaFree(c->blas_ws); /* after the handle that uses it */
        if (c->stream)
            cudaStreamDestroy(c->stream);
        free(c);
    }
    memset(a, 0, sizeof *a);
    b->ctx = NULL;
}

static const struct backend_ops cuda_ops = {
    "cuda",       cuda_free,     cuda_kv_alloc,  cuda_begin_step, cuda_embed,
    cuda_rmsnorm, cuda_matmul,   cuda_rope,      cuda_kv_store,   cuda_attention,
    cuda_swiglu,  cuda_add,      cuda_gather,    cuda_logits,     cuda_sync,
    cuda_copy_in, cuda_copy_out, cuda_kv_export, cuda_kv_import,  cuda_geglu,
    cuda_scale,   NULL, /* matmul_shared: forward.c makes one matmul call per weight */
};

extern "C" int backend_cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

extern "C" double backend_cuda_copy_gbps(int device, size_t bytes, int reps)
{
    int rc = 0;
    void *src = NULL, *dst = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    float ms[64];
    double gbps = -1;
    if (reps < 1 || reps > 64)
        return -1;
    CUDA_TRY(cudaSetDevice(device));
    CUDA_TRY(cudaMalloc(&src, bytes));
    CUDA_TRY(cudaMalloc(&dst, bytes));
    CUDA_TRY(cudaMemset(src, 1, bytes));
    CUDA_TRY(cudaEventCreate(&e0));
    CUDA_TRY(cudaEventCreate(&e1));
    CUDA_TRY(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice)); /* warm-up */
    for (int i = 0; i < reps; i++) {
        CUDA_TRY(cudaEventRecord(e0));
        CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice));
        CUDA_TRY(cudaEventRecord(e1));
        CUDA_TRY(cudaEventSynchronize(e1));
        CUDA_TRY(cudaEventElapsedTime(&ms[i], e0, e1));
    }
    qsort(ms, (size_t)reps, sizeof ms[0], cmp_float);
    gbps = 2.0 * (double)bytes / (ms[reps / 2] * 1e-3) / 1e9;
fail:
    if (e0)
        cudaEventDestroy(e0);
    if (e1)
        cudaEventDestroy(e1);
    cudaFree(src);
    cudaFree(dst);
    return rc < 0 ? -1.0 : gbps;
}

extern "C" int backend_cuda_init(struct backend *b, const struct model *m,
                                 const struct backend_cuda_config *cfg, char *err, size_t err_len)
{
    const struct model_hparams *hp = &m->hp;
    int rc = 0, n_dev = backend_cuda_device_count();
    memset(b, 0, sizeof *b);
    b->ops = &cuda_ops;
    b->model = m;
    b->max_tokens = cfg->max_tokens > 0 ? cfg->max_tokens : 1;
    if (n_dev <= 0) {
        snprintf(err, err_len, "cuda backend: no CUDA device found");
        return -ENODEV;
    }
    if (b->max_tokens > 65535) { /* the decode grid's z dimension */
        snprintf(err, err_len, "cuda backend: at most 65535 tokens per step");
        return -EINVAL;
    }
    if (cfg->device < 0 || cfg->device >= n_dev) {
        snprintf(err, err_len, "cuda backend: device %d does not exist (%d found)", cfg->device,
                 n_dev);
        return -ENODEV;
    }
    if (hp->arch_kind != MODEL_ARCH_LLAMA && hp->arch_kind != MODEL_ARCH_GEMMA3) {
        snprintf(err, err_len, "cuda backend: the %s forward pass runs on the cpu backend only",
                 hp->arch);
        return -ENOTSUP;
    }
    if (hp->n_head_kv <= 0 || hp->n_head % hp->n_head_kv != 0)
        return snprintf(err, err_len, "cuda backend: bad head counts"), -EINVAL;
    rc = cuda_attention_check(hp->head_dim, hp->n_head / hp->n_head_kv, err, err_len);
    if (rc < 0)
        return rc;
    struct cuda_ctx *c = (struct cuda_ctx *)calloc(1, sizeof *c);
    if (!c)
        return snprintf(err, err_len, "cuda backend: out of memory"), -ENOMEM;
    b->ctx = c;
    c->device = cfg->device;
    c->use_graphs = cfg->use_graphs;
    c->tile_tokens = cuda_attention_tile_tokens(hp->head_dim, hp->n_head / hp->n_head_kv);
    {
        const size_t T = (size_t)b->max_tokens;
        const size_t D = (size_t)hp->n_embd, F = (size_t)hp->n_ff, V = (size_t)hp->n_vocab;
        const size_t DQ = (size_t)hp->n_head * (size_t)hp->head_dim;
        const size_t DKV = (size_t)hp->n_head_kv * (size_t)hp->head_dim;
        size_t kmax = D > F ? D : F;
        kmax = kmax > DQ ? kmax : DQ;
        struct backend_acts *a = &b->acts;
        struct meta_layout ml;

        CUDA_TRY(cudaSetDevice(c->device));
        CUDA_TRY(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
        CUBLAS_TRY(cublasCreate(&c->blas));
        CUBLAS_TRY(cublasSetStream(c->blas, c->stream));
        CUDA_TRY(cudaMalloc(&c->blas_ws, CUBLAS_WORKSPACE));
        CUBLAS_TRY(cublasSetWorkspace(c->blas, c->blas_ws, CUBLAS_WORKSPACE));
        if (cuda_attention_setup(hp->head_dim, hp->n_head / hp->n_head_kv, 1) < 0 ||
            cuda_attention_setup(hp->head_dim, hp->n_head / hp->n_head_kv, 0) < 0) {
            rc = -EIO;
            snprintf(err, err_len, "cuda backend: cannot configure the attention kernels");
            goto fail_msg;
        }

        /* weights, once: matrices FP16, norms and embedding rows FP32 */
        rc = upload(c, &m->w.tok_embd, 1, err, err_len);
        if (rc == 0)
            rc = upload(c, &m->w.output_norm, 1, err, err_len);
        if (rc == 0)
            rc = upload(c, &m->w.output, 0, err, err_len);
        for (int l = 0; rc == 0 && l < hp->n_layer; l++) {
            const struct model_layer *ly = &m->w.layers[l];
            /* Gemma 3's per-head and post norms are absent (no data) in a Llama;
             * sink values and keys in a model without them */
            const struct tensor *f32s[] = {
                &ly->attn_norm,      &ly->ffn_norm,      &ly->attn_q_norm,  &ly->attn_k_norm,
                &ly->post_attn_norm, &ly->post_ffw_norm, &ly->attn_sinks_v, &ly->attn_sinks_k};
            const struct tensor *f16s[] = {&ly->wq,     &ly->wk,   &ly->wv,    &ly->wo,
                                           &ly->w_gate, &ly->w_up, &ly->w_down};
            for (size_t i = 0; rc == 0 && i < sizeof f32s / sizeof f32s[0]; i++)
                rc = upload(c, f32s[i], 1, err, err_len);
            for (size_t i = 0; rc == 0 && i < 7; i++)
                rc = upload(c, f16s[i], 0, err, err_len);
        }
        if (rc < 0)
            goto fail_msg;
        /* a pageable cudaMemcpy may return before its DMA lands, on the legacy
         * stream the backend's non-blocking stream does not wait for */
        CUDA_TRY(cudaDeviceSynchronize());

        float **bufs[] = {&a->x, &a->xb,  &a->xb2, &a->q,   &a->qc, &a->k,
                          &a->v, &a->att, &a->hb,  &a->hb2, &a->xo};
        const size_t widths[] = {D, D, D, DQ, DQ, DKV, DKV, DQ, F, F, D};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
            CUDA_TRY(cudaMalloc((void **)bufs[i], T * widths[i] * sizeof(float)));
        CUDA_TRY(cudaHostAlloc((void **)&a->logits, T * V * sizeof(float), cudaHostAllocDefault));
        CUDA_TRY(cudaMalloc((void **)&c->dlogits, T * V * sizeof(float)));
        CUDA_TRY(cudaMalloc((void **)&c->h16, T * kmax * sizeof(__half)));
        CUDA_TRY(cudaMalloc((void **)&c->stats, T * (size_t)hp->n_head * 2 * sizeof(float)));
        CUDA_TRY(cudaMalloc((void **)&c->sink_logits, T * (size_t)hp->n_head * sizeof(float)));
        ml = meta_layout_for(b->max_tokens, hp->rope_dim, (int64_t)hp->n_layer * hp->n_head);
        CUDA_TRY(cudaHostAlloc((void **)&c->hmeta, ml.total, cudaHostAllocDefault));
        CUDA_TRY(cudaMalloc((void **)&c->dmeta, ml.total));
        memset(c->hmeta, 0, ml.total);
    }
    return 0;
fail:
    snprintf(err, err_len, "cuda backend: device setup failed (see the message above)");
fail_msg:
    cuda_free(b);
    return rc < 0 ? rc : -EIO;
}
