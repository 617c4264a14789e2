/*
 * backend_cpu.c: the CPU backend (backend.h). Matrix products and attention
 * are split across a thread pool; kernels come from matmul.c (AVX-512, AVX2
 * or scalar, chosen at run time) and attention.c. KV storage is one host
 * allocation laid out by kv_geometry_offset.
 */
#include <assert.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../backend.h"
#include "../quant.h"
#include "../rope.h"
#include "attention.h"
#include "matmul.h"
#include "ops.h"
#include "sink_key.h"
#include "threadpool.h"

#define MATMUL_ROW_BLOCK 16  /* weight rows per work item */
#define MATMUL_T_TILE 64     /* activation rows per pass over a weight block */
#define ATTN_GROUP_TOKENS 16 /* tokens of one sequence scored together in a task */

/* A weight matrix repacked at load for the kernel (cpu_pack_rows), keyed by
 * the data pointer of the model's tensor. */
struct packed_weight {
    const void *src;
    void *data;
};

struct cpu_ctx {
    struct threadpool *tp;
    enum cpu_isa isa;
    int reference_matmul; /* f32 dot products with dequantized weights */
    struct attn_kernels akr;
    const struct fwd_batch *batch;
    float *cs_abs;       /* (T, rope_dim) cos/sin at absolute positions */
    float *cs_cache;     /* (T, rope_dim) cos/sin at in-cache positions */
    float *cs_abs_local; /* (T, rope_dim) cos/sin at absolute positions, local layers' base */
    float *sink_logits;  /* (T, H) per-token sink logits of a layer with sink keys */
    void *act;           /* prepared activation rows */
    size_t act_cap;
    struct kv_geometry geo;
    void *kmem, *vmem;   /* KV storage */
    float *attn_part;    /* partial attention states, one per task */
    int64_t attn_blocks; /* key blocks per (token, kv head): ceil((S + W) / ATTN_KEY_BLOCK) */
    int64_t *attn_nk;    /* (T) keys each token sees in the current layer */
    int64_t *attn_group; /* (T + 1) first token of each group of tokens scored together */
    struct kv_view *attn_uview; /* (T) each group's keys: the union of its tokens' views */
    int64_t *attn_shift;        /* (T) where each token's window starts in its group's */
    int64_t attn_n_groups;
    int kv_fmt;                 /* enum attn_fmt of the K/V rows */
    struct deferred {           /* a product's element-wise op not done yet (cpu_product) */
        enum backend_then then; /* NONE: nothing deferred */
        float *x;               /* x += y (ADD) or x = silu(x) * y (SWIGLU) */
        const float *y;
        int64_t rows, row_len;
    } deferred;
    struct packed_weight *packed; /* open-addressed table of n_packed_cap entries */
    size_t n_packed_cap;
    char *packed_arena; /* every repacked matrix, in the order a forward pass reads them */
    size_t packed_used, packed_size;
};

static void settle(struct backend *b);

static void *xalloc(size_t n)
{
    /* 64-byte aligned, zeroed */
    void *p = NULL;
    if (posix_memalign(&p, 64, n ? n : 64) != 0)
        return NULL;
    memset(p, 0, n);
    return p;
}

/* xalloc for the large buffers streamed every step (the KV pool, the arena
 * of repacked weights): 2 MiB aligned and, where the kernel has transparent
 * huge pages in madvise mode, backed by huge pages (under 4 MiB: xalloc).
 * A decode step reads every slot's window once; with 4 KiB pages each 4 KiB
 * of K or V is a new TLB entry (a page walk), and the KV of a few streams
 * spans more pages than the TLB holds. */
static void *xalloc_large(size_t n)
{
    const size_t huge = (size_t)2 << 20;
    if (n < 2 * huge)
        return xalloc(n);
    void *p = NULL;
    size_t rounded = (n + huge - 1) / huge * huge;
    if (posix_memalign(&p, huge, rounded) != 0)
        return NULL;
#ifdef MADV_HUGEPAGE
    (void)madvise(p, rounded, MADV_HUGEPAGE); /* advice only: 4 KiB pages if refused */
#endif
    memset(p, 0, n);
    return p;
}

static void cpu_free(struct backend *b)
{
    struct cpu_ctx *c = b->ctx;
    if (c) {
        threadpool_free(c->tp);
        free(c->cs_abs);
        free(c->cs_cache);
        free(c->cs_abs_local);
        free(c->sink_logits);
        free(c->act);
        free(c->kmem);
        free(c->attn_part);
        free(c->attn_nk);
        free(c->attn_group);
        free(c->attn_uview);
        free(c->attn_shift);
        free(c->vmem);
        free(c->packed_arena);
        free(c->packed);
        free(c);
    }
    struct backend_acts *a = &b->acts;
    float **bufs[] = {&a->x, &a->xb,  &a->xb2, &a->q,   &a->qc, &a->k,
                      &a->v, &a->att, &a->hb,  &a->hb2, &a->xo, &a->logits};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        free(*bufs[i]);
        *bufs[i] = NULL;
    }
    b->ctx = NULL;
}

static int cpu_kv_alloc(struct backend *b, const struct kv_geometry *g)
{
    struct cpu_ctx *c = b->ctx;
    /* rows the attention kernels can read: a q8_0 row is at most
     * ATTN_KV_MAX_BLOCKS blocks (the model loader keeps head_dim <= 256) */
    if (kv_geometry_row_bytes(g) == 0 ||
        (g->dtype == KV_DTYPE_Q8_0 && g->head_dim > ATTN_KV_MAX_BLOCKS * 32))
        return -EINVAL;
    size_t bytes = kv_geometry_slot_bytes(g) * (size_t)g->n_slots;
    c->kmem = xalloc_large(bytes);
    c->vmem = xalloc_large(bytes);
    if (!c->kmem || !c->vmem)
        return -ENOMEM;
    c->geo = *g;
    c->kv_fmt = attn_fmt_of(g->dtype);
    /* a query sees at most S + W keys in a global layer, swa_window in a local one */
    int64_t most_keys = g->n_sinks + g->window;
    if (g->swa_period > 0 && g->swa_window > most_keys)
        most_keys = g->swa_window;
    c->attn_blocks = (most_keys + ATTN_KEY_BLOCK - 1) / ATTN_KEY_BLOCK;
    if (c->attn_blocks > ATTN_MAX_BLOCKS)
        return -EINVAL;
    const struct model_hparams *hp = &b->model->hp;
    c->attn_part = xalloc((size_t)b->max_tokens * (size_t)c->attn_blocks * (size_t)hp->n_head *
                          ((size_t)hp->head_dim + 2) * sizeof(float));
    if (!c->attn_part)
        return -ENOMEM;
    return 0;
}

static int cpu_begin_step(struct backend *b, const struct fwd_batch *batch)
{
    settle(b);
    struct cpu_ctx *c = b->ctx;
    const struct model_hparams *hp = &b->model->hp;
    if (batch->T > b->max_tokens || batch->n_out > batch->T)
        return -EINVAL;
    c->batch = batch;
    for (int64_t t = 0; t < batch->T; t++) {
        rope_cos_sin(batch->pos[t], hp->rope_base, hp->rope_dim, c->cs_abs + t * hp->rope_dim);
        rope_cos_sin(batch->view[t].pos_cache, hp->rope_base, hp->rope_dim,
                     c->cs_cache + t * hp->rope_dim);
        if (hp->n_swa > 0)
            rope_cos_sin(batch->pos[t], hp->rope_base_local, hp->rope_dim,
                         c->cs_abs_local + t * hp->rope_dim);
    }
    return 0;
}

static void cpu_embed(struct backend *b, float *x)
{
    settle(b);
    struct cpu_ctx *c = b->ctx;
    const struct tensor *e = &b->model->w.tok_embd;
    for (int64_t t = 0; t < c->batch->T; t++) {
        const char *row = (const char *)e->data + (size_t)c->batch->tokens[t] * e->row_bytes;
        quant_dequant_row(e->type, row, x + t * e->ne0, e->ne0);
    }
}

/* Element-wise ops run on the pool once they are large enough to pay for a
 * run (a prefill chunk, many streams); each element's arithmetic does not
 * depend on the split. */
#define EW_MIN_PER_PART 8192 /* values */

struct ew_job {
    struct backend *b;
    float *x, *out;
    const float *y;
    const struct tensor *w;
    int64_t rows, row_len; /* the op's rows and their length */
    float s;
};

/* The parts ew_run splits an op of rows x row_len values into. */
static int64_t ew_parts(const struct cpu_ctx *c, int64_t rows, int64_t row_len)
{
    int64_t parts = rows * row_len / EW_MIN_PER_PART;
    int64_t most = 2 * (int64_t)threadpool_size(c->tp);
    parts = parts < most ? parts : most;
    return parts < rows ? parts : rows;
}

static void ew_run(struct cpu_ctx *c, void (*fn)(void *, int, int), struct ew_job *j)
{
    int64_t parts = ew_parts(c, j->rows, j->row_len);
    if (parts <= 1)
        fn(j, 0, 1);
    else
        threadpool_run_parts(c->tp, fn, j, (int)parts);
}

/* The sum of squares of x[0, n) in double, in eight interleaved chains
 * added in a fixed tree, so a row's result depends only on the row. One
 * chain would wait an add latency per value, and below 2 x EW_MIN_PER_PART
 * values (up to 28 rows of 576) ew_run runs the op on the calling thread
 * while the pool waits. */
static double sum_squares(const float *x, int64_t n)
{
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) { /* eight named chains: registers, not a stack array */
        s0 += (double)x[i] * x[i];
        s1 += (double)x[i + 1] * x[i + 1];
        s2 += (double)x[i + 2] * x[i + 2];
        s3 += (double)x[i + 3] * x[i + 3];
        s4 += (double)x[i + 4] * x[i + 4];
        s5 += (double)x[i + 5] * x[i + 5];
        s6 += (double)x[i + 6] * x[i + 6];
        s7 += (double)x[i + 7] * x[i + 7];
    }
    for (; i < n; i++)
        s0 += (double)x[i] * x[i];
    return ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7));
}

/* One row of RMSNorm: o = x / rms(x) * g, D values (o may be x). The AVX2
 * kernels are these loops' arithmetic, bit for bit (ops.h). */
static void rmsnorm_row(enum cpu_isa isa, const float *xr, const float *g, int64_t D, float eps,
                        float *o)
{
    const int vec = isa >= CPU_ISA_AVX2;
    const double ss = vec ? cpu__sum_squares_avx2(xr, D) : sum_squares(xr, D);
    float inv = (float)(1.0 / sqrt(ss / (double)D + eps));
    if (vec) {
        cpu__scale_mul_avx2(o, xr, inv, g, D);
        return;
    }
    for (int64_t i = 0; i < D; i++)
        o[i] = xr[i] * inv * g[i];
}

static void rmsnorm_task(void *arg, int ith, int nth)
{
    struct ew_job *j = arg;
    const struct cpu_ctx *c = j->b->ctx;
    const int64_t D = j->w->ne0;
    const float eps = j->b->model->hp.norm_eps;
    for (int64_t t = j->rows * ith / nth; t < j->rows * (ith + 1) / nth; t++)
        rmsnorm_row(c->isa, j->y + t * D, j->w->data, D, eps, j->out + t * D);
}

/* x += y over n values (the residual add). */
static void add_span(const struct cpu_ctx *c, float *x, const float *y, int64_t n)
{
    if (c->isa >= CPU_ISA_AVX2) {
        cpu__add_avx2(x, y, n);
        return;
    }
    for (int64_t i = 0; i < n; i++)
        x[i] += y[i];
}

/* hb = silu(hb) * hb2 over n values; each value's arithmetic depends on
 * nothing but its two inputs (not on n or on where the span starts). */
static void swiglu_span(const struct cpu_ctx *c, float *hb, const float *hb2, int64_t n);

static void cpu_rmsnorm(struct backend *b, const float *x, const struct tensor *w, float *out,
                        int64_t rows)
{
    settle(b);
    struct ew_job j = {.b = b, .out = out, .y = x, .w = w, .rows = rows, .row_len = w->ne0};
    ew_run(b->ctx, rmsnorm_task, &j);
}

/* n products of one prepared input: W[i] (repacked: wp[i], or NULL) into
 * y[i]. The row blocks of all n are numbered in order, W[i]'s from
 * blk0[i] to blk0[i + 1], and a run's parts split that numbering. */
struct matmul_job {
    struct cpu_ctx *c;
    int n;
    const struct tensor *W[BACKEND_SHARED_MAX];
    const void *wp[BACKEND_SHARED_MAX];
    float *y[BACKEND_SHARED_MAX];
    int64_t blk0[BACKEND_SHARED_MAX + 1];
    const float *x;
    int64_t rows;
    size_t act_bytes;
    /* cpu_product's element-wise neighbours (zero in a plain product) */
    const struct tensor *norm; /* x's RMSNorm, into xn, before it is prepared */
    float *xn;
    float eps;
    enum backend_then then; /* done by each part on the outputs it made */
    float *res;
    /* the previous product's deferred op, done on each row of x (in place:
     * xd is x) before its RMSNorm and preparation */
    enum backend_then first;
    float *xd;
    const float *first_y;
};

/* Each part prepares one contiguous range of rows, split as ew_run splits
 * the element-wise op before it (a decode step of a few dozen streams: one
 * range per thread), so a row is mostly read in the cache of the core that
 * wrote it; rows dealt out in turn crossed cores every other row (at 32
 * streams this run took 1.1 ms of a step instead of 0.86). */
static void matmul_prepare_task(void *arg, int ith, int nth)
{
    struct matmul_job *j = arg;
    const struct tensor *W = j->W[0];
    const int64_t K = W->ne0;
    for (int64_t t = j->rows * ith / nth; t < j->rows * (ith + 1) / nth; t++) {
        const float *xr = j->x + t * K;
        if (j->first == BACKEND_THEN_ADD)
            add_span(j->c, j->xd + t * K, j->first_y + t * K, K);
        else if (j->first == BACKEND_THEN_SWIGLU)
            swiglu_span(j->c, j->xd + t * K, j->first_y + t * K, K);
        if (j->norm) { /* the row's RMSNorm, as cpu_rmsnorm computes it */
            rmsnorm_row(j->c->isa, xr, j->norm->data, K, j->eps, j->xn + t * K);
            xr = j->xn + t * K;
        }
        cpu_prepare_act(j->c->isa, W->type, xr, K, (char *)j->c->act + (size_t)t * j->act_bytes);
    }
}

/* Row blocks [b0, b1) of W (repacked: wp) into y. */
static void matmul_blocks(const struct matmul_job *j, const struct tensor *W, const void *wp,
                          float *y, int64_t b0, int64_t b1)
{
    const int64_t N = W->ne1;
    if (wp) {
        int64_t n0 = b0 * MATMUL_ROW_BLOCK,
                n1 = b1 * MATMUL_ROW_BLOCK < N ? b1 * MATMUL_ROW_BLOCK : N;
        for (int64_t t0 = 0; t0 < j->rows; t0 += MATMUL_T_TILE) {
            int64_t tn = j->rows - t0 < MATMUL_T_TILE ? j->rows - t0 : MATMUL_T_TILE;
            cpu_matmul_rows_packed(j->c->isa, W->type, wp, W->ne0, N, n0, n1,
                                   (const char *)j->c->act + (size_t)t0 * j->act_bytes, tn,
                                   y + t0 * N, N);
        }
        return;
    }
    for (int64_t blk = b0; blk < b1; blk++) {
        int64_t n0 = blk * MATMUL_ROW_BLOCK;
        int64_t n1 = n0 + MATMUL_ROW_BLOCK < N ? n0 + MATMUL_ROW_BLOCK : N;
        for (int64_t t0 = 0; t0 < j->rows; t0 += MATMUL_T_TILE) {
            int64_t tn = j->rows - t0 < MATMUL_T_TILE ? j->rows - t0 : MATMUL_T_TILE;
            cpu_matmul_rows(j->c->isa, W->type, W->data, W->ne0, n0, n1,
                            (const char *)j->c->act + (size_t)t0 * j->act_bytes, tn, y + t0 * N, N);
        }
    }
}

/* The row blocks a run's parts split: with SwiGLU after it, the gate's, each
 * taken with the up projection's block of the same rows. */
static int64_t job_blocks(const struct matmul_job *j)
{
    return j->then == BACKEND_THEN_SWIGLU ? j->blk0[1] : j->blk0[j->n];
}

static void matmul_rows_task(void *arg, int ith, int nth)
{
    struct matmul_job *j = arg;
    const int64_t blocks = job_blocks(j);
    const int64_t b0 = blocks * ith / nth, b1 = blocks * (ith + 1) / nth;
    if (j->then != BACKEND_THEN_NONE) {
        /* output rows [n0, n1) of W[0] (and W[1]), finished here by the
         * part that made them, while they are in its cache */
        const int64_t N = j->W[0]->ne1, n0 = b0 * MATMUL_ROW_BLOCK,
                      n1 = b1 * MATMUL_ROW_BLOCK < N ? b1 * MATMUL_ROW_BLOCK : N;
        if (b0 >= b1)
            return;
        matmul_blocks(j, j->W[0], j->wp[0], j->y[0], b0, b1);
        if (j->then == BACKEND_THEN_SWIGLU) {
            matmul_blocks(j, j->W[1], j->wp[1], j->y[1], b0, b1);
            for (int64_t t = 0; t < j->rows; t++)
                swiglu_span(j->c, j->y[0] + t * N + n0, j->y[1] + t * N + n0, n1 - n0);
        } else {
            for (int64_t t = 0; t < j->rows; t++)
                add_span(j->c, j->res + t * N + n0, j->y[0] + t * N + n0, n1 - n0);
        }
        return;
    }
    for (int i = 0; i < j->n; i++) {
        int64_t lo = b0 > j->blk0[i] ? b0 : j->blk0[i];
        int64_t hi = b1 < j->blk0[i + 1] ? b1 : j->blk0[i + 1];
        if (lo < hi)
            matmul_blocks(j, j->W[i], j->wp[i], j->y[i], lo - j->blk0[i], hi - j->blk0[i]);
    }
}

/* The reference product: each weight row dequantized to f32, dotted in double
 * with the f32 activations. No activation quantization, so the only error
 * left against an f32 implementation is summation order (in double, four
 * interleaved partial sums). Slow; for tests. */
static void matmul_reference_task(void *arg, int ith, int nth)
{
    struct matmul_job *j = arg;
    const struct tensor *W = j->W[0];
    const int64_t N = W->ne1, K = W->ne0;
    float *wr = (float *)j->c->act + (size_t)ith * (size_t)K;
    for (int64_t n = N * ith / nth; n < N * (ith + 1) / nth; n++) {
        quant_dequant_row(W->type, (const char *)W->data + (size_t)n * W->row_bytes, wr, K);
        for (int64_t t = 0; t < j->rows; t++) {
            const float *xr = j->x + t * K;
            double s[4] = {0, 0, 0, 0}; /* four chains, so the compiler can vectorize */
            int64_t k = 0;
            for (; k + 4 <= K; k += 4)
                for (int i = 0; i < 4; i++)
                    s[i] += (double)wr[k + i] * (double)xr[k + i];
            for (; k < K; k++)
                s[0] += (double)wr[k] * (double)xr[k];
            j->y[0][t * N + n] = (float)((s[0] + s[1]) + (s[2] + s[3]));
        }
    }
}

static size_t packed_slot(const void *src, size_t cap)
{
    return ((uintptr_t)src >> 6) * 0x9e3779b97f4a7c15ull % cap;
}

/* W's repacked copy, or NULL. */
static const void *packed_find(const struct cpu_ctx *c, const struct tensor *W)
{
    if (!c->n_packed_cap)
        return NULL;
    for (size_t i = packed_slot(W->data, c->n_packed_cap);; i = (i + 1) % c->n_packed_cap) {
        if (c->packed[i].src == W->data)
            return c->packed[i].data;
        if (!c->packed[i].src)
            return NULL;
    }
}

/* Bytes W takes in the arena of repacked weights (0: it is not repacked). */
static size_t packed_bytes(const struct cpu_ctx *c, const struct tensor *W)
{
    if (!W->data || !cpu_matmul_packs(c->isa, (enum qtype)W->type))
        return 0;
    return (W->row_bytes * (size_t)W->ne1 + 63) / 64 * 64;
}

/* Repacks W once for the kernel into the arena (a tied output matrix is the
 * embedding: one copy serves both names). Where the model file is mapped,
 * the original pages are dropped from this process afterwards, so the copy
 * replaces them in memory instead of doubling them; embedding lookups that
 * read the original fault their few pages back in from the file. */
static void pack_weight(struct cpu_ctx *c, const struct model *m, const struct tensor *W)
{
    const size_t room = packed_bytes(c, W);
    if (!room || packed_find(c, W))
        return;
    assert(c->packed_used + room <= c->packed_size);
    void *p = c->packed_arena + c->packed_used;
    c->packed_used += room;
    const size_t bytes = W->row_bytes * (size_t)W->ne1;
    cpu_pack_rows((enum qtype)W->type, W->data, W->ne0, W->ne1, p);
    size_t i = packed_slot(W->data, c->n_packed_cap);
    while (c->packed[i].src)
        i = (i + 1) % c->n_packed_cap;
    c->packed[i] = (struct packed_weight){W->data, p};
    if (m->mapped) {
        const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
        uintptr_t lo = ((uintptr_t)W->data + page - 1) & ~(page - 1);
        uintptr_t hi = ((uintptr_t)W->data + bytes) & ~(page - 1);
        if (hi > lo)
            madvise((void *)lo, hi - lo, MADV_DONTNEED);
    }
}

/* The matrices a forward pass multiplies by, in the order it does: each
 * layer's Q, K, V (one fused product), output projection, gate, up (one
 * fused product) and down projection, then the output matrix. */
static size_t forward_weights(const struct model *m, const struct tensor **ws, size_t cap)
{
    size_t n = 0;
    for (int l = 0; l < m->hp.n_layer; l++) {
        const struct model_layer *ly = &m->w.layers[l];
        const struct tensor *lw[] = {&ly->wq,     &ly->wk,   &ly->wv,    &ly->wo,
                                     &ly->w_gate, &ly->w_up, &ly->w_down};
        for (size_t i = 0; i < sizeof lw / sizeof lw[0] && n < cap; i++)
            ws[n++] = lw[i];
    }
    if (n < cap)
        ws[n++] = &m->w.output;
    return n;
}

/* Repacks every matrix the kernel takes into one arena, laid out in the
 * order a forward pass reads them and, where the kernel offers transparent
 * huge pages, on 2 MiB pages: a decode step then streams its weights from
 * memory as one run, without a TLB miss every 4 KiB (on the Zen 4 VM of
 * docs/benchmarks.md the T = 1 products read 1.2-1.9x faster so). */
static int pack_weights(struct cpu_ctx *c, const struct model *m)
{
    const size_t cap = 7 * (size_t)m->hp.n_layer + 1;
    const struct tensor **ws = calloc(cap, sizeof *ws);
    c->n_packed_cap = 2 * cap + 1;
    c->packed = calloc(c->n_packed_cap, sizeof *c->packed);
    if (!ws || !c->packed) {
        free(ws);
        return -ENOMEM;
    }
    const size_t n = forward_weights(m, ws, cap);
    size_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += packed_bytes(c, ws[i]);
    if (total) {
        c->packed_arena = xalloc_large(total);
        if (!c->packed_arena) {
            free(ws);
            return -ENOMEM;
        }
        c->packed_size = total;
        for (size_t i = 0; i < n; i++)
            pack_weight(c, m, ws[i]);
    }
    free(ws);
    return 0;
}

/* Prepares x once for the n weights of j and runs their products as one. */
static void matmul_run(struct cpu_ctx *c, struct matmul_job *j)
{
    if (j->rows == 1)
        matmul_prepare_task(j, 0, 1);
    else
        threadpool_run(c->tp, matmul_prepare_task, j);
    /* two parts per thread: a thread that runs late takes fewer of them;
     * four were slower at a decode step's sizes, where each part is a few
     * microseconds and its claim and completion cross cores
     * (docs/benchmarks.md) */
    int64_t blocks = job_blocks(j);
    int64_t parts = 2 * (int64_t)threadpool_active(c->tp);
    threadpool_run_parts(c->tp, matmul_rows_task, j, (int)(parts < blocks ? parts : blocks));
}

static void job_add(struct cpu_ctx *c, struct matmul_job *j, const struct tensor *W, float *y)
{
    j->W[j->n] = W;
    j->wp[j->n] = packed_find(c, W);
    j->y[j->n] = y;
    j->blk0[j->n + 1] = j->blk0[j->n] + (W->ne1 + MATMUL_ROW_BLOCK - 1) / MATMUL_ROW_BLOCK;
    j->n++;
}

static void cpu_matmul(struct backend *b, const struct tensor *W, const float *x, float *y,
                       int64_t rows)
{
    settle(b);
    struct cpu_ctx *c = b->ctx;
    struct matmul_job j = {
        .c = c, .x = x, .rows = rows, .act_bytes = quant_act_bytes(W->type, W->ne0)};
    job_add(c, &j, W, y);
    if (c->reference_matmul) {
        threadpool_run(c->tp, matmul_reference_task, &j);
        return;
    }
    matmul_run(c, &j);
}

/* Weights whose prepared input rows are the same bytes: quantized weights all
 * take one Q8 row, float weights f32 rows of their own type's preparation. */
static int same_act(const struct tensor *a, const struct tensor *b)
{
    if (a->ne0 != b->ne0)
        return 0;
    if (a->type == b->type)
        return 1;
    return qtype_block_values(a->type) > 1 && qtype_block_values(b->type) > 1;
}

static void cpu_matmul_shared(struct backend *b, const struct tensor *const *W, float *const *y,
                              int n, const float *x, int64_t rows)
{
    settle(b);
    struct cpu_ctx *c = b->ctx;
    int shared = !c->reference_matmul && n <= BACKEND_SHARED_MAX;
    for (int i = 1; i < n && shared; i++)
        shared = same_act(W[0], W[i]);
    if (!shared) {
        for (int i = 0; i < n; i++)
            cpu_matmul(b, W[i], x, y[i], rows);
        return;
    }
    struct matmul_job j = {
        .c = c, .x = x, .rows = rows, .act_bytes = quant_act_bytes(W[0]->type, W[0]->ne0)};
    for (int i = 0; i < n; i++)
        job_add(c, &j, W[i], y[i]);
    matmul_run(c, &j);
}

/* RoPE of tokens [t0, t1): q rotated at each token's position, qc (a copy)
 * at its in-cache position, k at its position. */
static void rope_tokens(const struct cpu_ctx *c, const struct model_hparams *hp, int layer,
                        float *q, float *qc, float *k, int64_t t0, int64_t t1)
{
    const int64_t dq = (int64_t)hp->n_head * hp->head_dim;
    const int64_t dk = (int64_t)hp->n_head_kv * hp->head_dim;
    const int local = model_layer_is_local(hp, layer);
    const float *cs_abs = local ? c->cs_abs_local : c->cs_abs;
    /* local layers keep no sinks, so their qc is never scored */
    const float *cs_cache = local ? c->cs_abs_local : c->cs_cache;
    void (*apply)(float *, int, int, int, const float *) = hp->rope_neox ? rope_apply_neox
                                                           : c->isa >= CPU_ISA_AVX2
                                                               ? cpu__rope_apply_avx2
                                                               : rope_apply;
    for (int64_t t = t0; t < t1; t++) {
        memcpy(qc + t * dq, q + t * dq, (size_t)dq * sizeof(float));
        apply(q + t * dq, hp->n_head, hp->head_dim, hp->rope_dim, cs_abs + t * hp->rope_dim);
        apply(qc + t * dq, hp->n_head, hp->head_dim, hp->rope_dim, cs_cache + t * hp->rope_dim);
        apply(k + t * dk, hp->n_head_kv, hp->head_dim, hp->rope_dim, cs_abs + t * hp->rope_dim);
    }
}

static void cpu_rope(struct backend *b, int layer, float *q, float *qc, float *k)
{
    settle(b);
    struct cpu_ctx *c = b->ctx;
    rope_tokens(c, &b->model->hp, layer, q, qc, k, 0, c->batch->T);
}

static void store_row(void *dst, const float *src, int n, int fmt, enum cpu_isa isa)
{
    if (fmt == ATTN_F16 && isa >= CPU_ISA_AVX2) {
        cpu__f32_to_f16_avx2(dst, src, n); /* the same bits, NaN payloads aside */
    } else if (fmt == ATTN_F16) {
        uint16_t *d = dst;
        for (int i = 0; i < n; i++)
            d[i] = quant_f32_to_f16(src[i]);
    } else if (fmt == ATTN_Q8_0 && isa >= CPU_ISA_AVX2) {
        cpu__quantize_row_q8_0_avx2(dst, src, n); /* the same bytes */
    } else if (fmt == ATTN_Q8_0) {
        quant_quantize_row(QTYPE_Q8_0, src, dst, n);
    } else {
        memcpy(dst, src, (size_t)n * sizeof(float));
    }
}

/* The K and V rows of tokens [t0, t1) into their cells. */
static void store_tokens(const struct cpu_ctx *c, const struct model_hparams *hp, int layer,
                         const float *k, const float *v, int64_t t0, int64_t t1)
{
    const int Dh = hp->head_dim;
    const int64_t *cell =
        kv_geometry_layer_is_local(&c->geo, layer) ? c->batch->cell_local : c->batch->cell;
    for (int64_t t = t0; t < t1; t++) {
        for (int g = 0; g < hp->n_head_kv; g++) {
            size_t off = kv_geometry_byte_offset(&c->geo, c->batch->slot[t], layer, g, cell[t]);
            const int64_t src = t * (int64_t)hp->n_head_kv * Dh + (int64_t)g * Dh;
            store_row((char *)c->kmem + off, k + src, Dh, c->kv_fmt, c->isa);
            store_row((char *)c->vmem + off, v + src, Dh, c->kv_fmt, c->isa);
        }
    }
}

static void cpu_kv_store(struct backend *b, int layer, const float *k, const float *v)
{
    settle(b);
    struct cpu_ctx *c = b->ctx;
    store_tokens(c, &b->model->hp, layer, k, v, 0, c->batch->T);
}

struct rope_store_job {
    struct backend *b;
    int layer;
    float *q, *qc, *k;
    const float *v;
};

static void rope_store_task(void *arg, int ith, int nth)
{
    const struct rope_store_job *j = arg;
    const struct cpu_ctx *c = j->b->ctx;
    const int64_t T = c->batch->T, t0 = T * ith / nth, t1 = T * (ith + 1) / nth;
    rope_tokens(c, &j->b->model->hp, j->layer, j->q, j->qc, j->k, t0, t1);
    store_tokens(c, &j->b->model->hp, j->layer, j->k, j->v, t0, t1);
}

/* backend_ops.rope_store: each part rotates its tokens' rows and stores
 * their K and V, so the pool shares what was the calling thread's alone (at
 * 32 streams 0.9 ms of a 21 ms step). Every token is its own: a step's
 * tokens have distinct cells (kvcache.h: a sequence's chunk never wraps onto
 * itself, and each sequence has its own slot), so no two parts write the
 * same row. */
static void cpu_rope_store(struct backend *b, int layer, float *q, float *qc, float *k,
                           const float *v)
{
    settle(b);
    struct cpu_ctx *c = b->ctx;
    const struct model_hparams *hp = &b->model->hp;
    struct rope_store_job j = {b, layer, q, qc, k, v};
    /* per token: q, qc and k rotated, k and v stored */
    const int64_t per_token = 2 * (int64_t)(hp->n_head + hp->n_head_kv) * hp->head_dim;
    const int64_t parts = ew_parts(c, c->batch->T, per_token);
    if (parts <= 1)
        rope_store_task(&j, 0, 1);
    else
        threadpool_run_parts(c->tp, rope_store_task, &j, (int)parts);
}

struct attn_job {
    struct backend *b;
    int layer;
    const float *q, *qc, *sinks;
    enum model_normalizer norm;
    float *att;
    float *probe;
    const float *tsinks; /* (T, H) per-token sink logits (sink keys), or NULL: sinks[h] */
    int merge_in_task;   /* every token's keys fit one block: each task merges its own rows */
    int active;          /* threads taking part (threadpool_active, read by the caller) */
};

/* The sink logit of token t's query head h. */
static float sink_logit(const struct attn_job *j, int64_t t, int h)
{
    return j->tsinks ? j->tsinks[t * j->b->model->hp.n_head + h] : j->sinks[h];
}

/* Layer's per-token sink logits when it has sink keys (blk.N.attn_sinks_k):
 * s_h + scale q0 . k_g from the queries q rotated at their absolute positions
 * (the table cpu_rope used), into c->sink_logits; else NULL. */
static const float *sink_key_logits(struct cpu_ctx *c, const struct model *m, int layer,
                                    const float *q, const float *sinks, enum model_normalizer norm)
{
    const struct model_hparams *hp = &m->hp;
    const float *ks = m->w.layers[layer].attn_sinks_k.data;
    if (!ks || norm != MODEL_NORM_SINK)
        return NULL;
    const float *cs = model_layer_is_local(hp, layer) ? c->cs_abs_local : c->cs_abs;
    cpu_sink_key_logits(q, c->batch->T, hp->n_head, hp->n_head_kv, hp->head_dim, hp->rope_dim,
                        hp->rope_neox, cs, sinks, ks, hp->attn_scale, c->sink_logits);
    return c->sink_logits;
}

/* The view token t's query has in layer (a local layer's own, or the
 * policy's), and the sequence as that layer stores it. */
static const struct kv_view *view_for(const struct cpu_ctx *c, int64_t t, int layer,
                                      struct kv_seq *seq)
{
    const struct fwd_batch *bt = c->batch;
    if (kv_geometry_layer_is_local(&c->geo, layer)) {
        *seq = kv_seq_local(bt->seq[t], &c->geo);
        return &bt->view_local[t];
    }
    *seq = *bt->seq[t];
    return &bt->view[t];
}

/* The keys of view vw of token t's sequence (seq: as the layer stores it) in
 * kv head g, as runs of cells in visit order: sinks (scored with qc), then
 * the window ring, possibly wrapping. */
static struct attn_keys keys_of_view(const struct cpu_ctx *c, int64_t t, const struct kv_seq *seq,
                                     const struct kv_view *vw, int layer, int g, int Dh)
{
    size_t base = kv_geometry_byte_offset(&c->geo, c->batch->slot[t], layer, g, 0);
    struct attn_keys keys = {
        .k = (const char *)c->kmem + base,
        .v = (const char *)c->vmem + base,
        .fmt = c->kv_fmt,
        .head_dim = Dh,
    };
    struct kv_run run[KV_VIEW_RUNS];
    _Static_assert(KV_VIEW_RUNS == sizeof keys.run_start / sizeof keys.run_start[0],
                   "attn_keys holds one entry per kv_view run");
    kv_view_runs(seq, vw, run);
    for (int r = 0; r < KV_VIEW_RUNS; r++) {
        keys.run_start[r] = run[r].cell;
        keys.run_len[r] = run[r].len;
        keys.run_uses_qc[r] = r == 0; /* run 0 holds the sinks */
    }
    return keys;
}

/* The keys token t's query sees in kv head g. */
static struct attn_keys keys_for(const struct cpu_ctx *c, int64_t t, int layer, int g, int Dh)
{
    struct kv_seq seq;
    const struct kv_view *vw = view_for(c, t, layer, &seq);
    return keys_of_view(c, t, &seq, vw, layer, g, Dh);
}

/* Probe path: one (token, head) at a time, recording the weights on the
 * sequence's first positions. Used only by the sink probe. */
static void attention_probe_task(void *arg, int ith, int nth)
{
    struct attn_job *j = arg;
    struct cpu_ctx *c = j->b->ctx;
    const struct model_hparams *hp = &j->b->model->hp;
    const struct fwd_batch *bt = c->batch;
    const int H = hp->n_head, Dh = hp->head_dim, group = hp->n_head / hp->n_head_kv;
    const float scale = hp->attn_scale;
    int64_t n_tasks = bt->T * H;
    for (int64_t i = n_tasks * ith / nth; i < n_tasks * (ith + 1) / nth; i++) {
        int64_t t = i / H;
        int h = (int)(i % H);
        struct kv_seq seq_l;
        const struct kv_view *vw = view_for(c, t, j->layer, &seq_l);
        const struct kv_seq *seq = &seq_l;
        struct attn_keys keys = keys_for(c, t, j->layer, h / group, Dh);
        float visit_w[ATTN_PROBE_K];
        int64_t lim = seq->pos_first + BACKEND_PROBE_K;
        /* keys are visited in position order (sinks, then the window), so the
         * sequence's first positions still in the cache come first */
        keys.probe = visit_w;
        keys.probe_n = vw->n_sinks;
        if (vw->win_len > 0 && vw->win_start < lim)
            keys.probe_n += lim - vw->win_start < vw->win_len ? lim - vw->win_start : vw->win_len;
        const int64_t off = t * (int64_t)H * Dh + (int64_t)h * Dh;
        const float *sv = j->b->model->w.layers[j->layer].attn_sinks_v.data;
        cpu_attention_row(&c->akr, j->q + off, j->qc + off, &keys, scale, j->norm,
                          sink_logit(j, t, h), sv ? sv + (int64_t)h * Dh : NULL, j->att + off);
        float *pr = j->probe + (t * H + h) * BACKEND_PROBE_K;
        memset(pr, 0, BACKEND_PROBE_K * sizeof(float));
        for (int64_t v = 0; v < keys.probe_n && v < ATTN_PROBE_K; v++) {
            /* visit index -> position relative to the sequence start */
            int64_t rel = v < vw->n_sinks ? v : vw->win_start - seq->pos_first + v - vw->n_sinks;
            if (rel < BACKEND_PROBE_K)
                pr[rel] = visit_w[v];
        }
    }
}

/* Whether a token whose view is v can join a group of tokens of the same
 * sequence whose keys are the union view u, and if so widens u to take v in
 * and sets *shift to where v's window starts in u's (attn_row.shift). v's
 * window must start at most ATTN_MAX_SHIFT keys after u's, never before it
 * and not past its end (so every position of the union is in some token's
 * window, hence stored), the union must fit the ring (kv_view_runs), and
 * the two have the same sinks, unless the one with fewer has no window (the
 * sequence's first tokens, which see sinks only). */
static int view_join(struct kv_view *u, const struct kv_view *v, int64_t ring, int64_t *shift)
{
    const int64_t ns = u->n_sinks > v->n_sinks ? u->n_sinks : v->n_sinks;
    if ((u->n_sinks < ns && u->win_len > 0) || (v->n_sinks < ns && v->win_len > 0))
        return 0;
    *shift = 0;
    if (v->win_len > 0 && u->win_len == 0) {
        u->win_start = v->win_start;
        u->win_len = v->win_len;
    } else if (v->win_len > 0) {
        const int64_t sh = v->win_start - u->win_start;
        const int64_t ue = u->win_start + u->win_len, ve = v->win_start + v->win_len;
        const int64_t end = ue > ve ? ue : ve;
        if (sh < 0 || sh > ATTN_MAX_SHIFT || v->win_start > ue || end - u->win_start > ring)
            return 0;
        u->win_len = end - u->win_start;
        *shift = sh;
    }
    u->n_sinks = ns;
    return 1;
}

/* Task i of a layer's attention: its group of tokens [ta, tb), kv head g,
 * key block blk and the group's keys (the union of its tokens' views).
 * live = 0: the block is past every token's keys (no work, and merge reads
 * no state there). */
struct attn_task {
    int64_t ta, tb, blk;
    int g, live;
    struct attn_keys keys;
};

static struct attn_task attention_task_at(const struct cpu_ctx *c, int layer, int64_t i)
{
    const int Hkv = c->geo.n_kv_head;
    struct attn_task k = {0};
    /* blocks outermost: neighbouring parts hold unlike amounts of work */
    k.blk = i / (c->attn_n_groups * Hkv);
    const int64_t gi = i / Hkv % c->attn_n_groups;
    k.g = (int)(i % Hkv);
    k.ta = c->attn_group[gi];
    k.tb = c->attn_group[gi + 1];
    int64_t t_long = k.ta;
    for (int64_t t = k.ta + 1; t < k.tb; t++)
        t_long = c->attn_nk[t] > c->attn_nk[t_long] ? t : t_long;
    k.live = k.blk * ATTN_KEY_BLOCK < c->attn_nk[t_long];
    if (k.live) {
        struct kv_seq seq;
        view_for(c, k.ta, layer, &seq);
        k.keys = keys_of_view(c, k.ta, &seq, &c->attn_uview[gi], layer, k.g, c->geo.head_dim);
    }
    return k;
}

/* Merges the blocks of token t's query head h into its row of att. */
static void attention_merge_row(const struct attn_job *j, int64_t t, int h)
{
    const struct cpu_ctx *c = j->b->ctx;
    const struct model_hparams *hp = &j->b->model->hp;
    const int H = hp->n_head, Hkv = hp->n_head_kv, Dh = hp->head_dim, G = H / Hkv;
    const int64_t NB = c->attn_blocks;
    const int64_t part = (int64_t)G * (Dh + 2);
    const float *sv = j->b->model->w.layers[j->layer].attn_sinks_v.data; /* (H, Dh) or NULL */
    float m[ATTN_MAX_BLOCKS], l[ATTN_MAX_BLOCKS];
    const int g = h / G, k = h % G;
    const float *st0 = c->attn_part + ((t * Hkv + g) * NB) * part;
    /* blocks past the token's keys hold no state */
    int64_t nb = (c->attn_nk[t] + ATTN_KEY_BLOCK - 1) / ATTN_KEY_BLOCK;
    for (int64_t blk = 0; blk < nb; blk++) {
        m[blk] = st0[blk * part + k];
        l[blk] = st0[blk * part + G + k];
    }
    cpu_attention_merge(&c->akr, (int)nb, m, l, st0 + 2 * G + (int64_t)k * Dh, part, Dh, j->norm,
                        sink_logit(j, t, h), sv ? sv + (int64_t)h * Dh : NULL,
                        j->att + (t * H + h) * Dh);
}

/* Hot path: one task per (group of tokens, kv head, block of ATTN_KEY_BLOCK
 * keys in visit order). A group is up to ATTN_GROUP_TOKENS consecutive tokens
 * of one sequence whose views join (view_join: a prefill chunk, the window
 * full and sliding or not); all query heads of the kv head of all its tokens
 * are scored in one call over the union of their keys, so a block of K/V is
 * read from memory once for the group, and the blocks spread a decode step's
 * long window over every thread (flash-decoding). The blocks are fixed by
 * key index alone, never by batch size, grouping or thread count, and
 * cpu_attention_span_rows computes each row as it would alone, so a token's
 * attention is bit-identical whether it is decoded alone or prefilled in a
 * chunk. Partial states are merged in block order by cpu_attention_merge. */
static void attention_task(void *arg, int ith, int nth)
{
    struct attn_job *j = arg;
    struct cpu_ctx *c = j->b->ctx;
    const struct model_hparams *hp = &j->b->model->hp;
    const int H = hp->n_head, Hkv = hp->n_head_kv, Dh = hp->head_dim, G = H / Hkv;
    const float scale = hp->attn_scale;
    const int64_t NB = c->attn_blocks, n_tasks = c->attn_n_groups * Hkv * NB;
    const int64_t part = (int64_t)G * (Dh + 2); /* floats of one task's partial state */
    const int64_t i0 = n_tasks * ith / nth, i1 = n_tasks * (ith + 1) / nth;
    /* after the part's last task: the first of the part this thread is
     * likeliest to claim next (parts are claimed in turn: on one thread,
     * or a caller gone solo, surely; on several as long as they keep pace),
     * so that it does not start cold; at 8 streams about half of a step's
     * tasks are the first of their part (docs/benchmarks.md) */
    const int64_t later = ith + (int64_t)j->active;
    const int64_t i_later = later < nth ? n_tasks * later / nth : n_tasks;
    struct attn_row rows[ATTN_MAX_ROWS];
    struct attn_task cur = i0 < i1 ? attention_task_at(c, j->layer, i0) : (struct attn_task){0};
    struct attn_ahead ahead;
    for (int64_t i = i0; i < i1; i++) {
        /* the next task's keys start coming into L2 while this one
         * runs: at 8 or more streams a decode task's span of a few pages of
         * K and V comes from memory (docs/benchmarks.md has what this gave).
         * A few lines now, a dose after each of this task's tiles, the rest
         * when it is done. */
        const int64_t ni = i + 1 < i1 ? i + 1 : i_later;
        const struct attn_task next =
            ni < n_tasks ? attention_task_at(c, j->layer, ni) : (struct attn_task){0};
        struct attn_ahead *ah = NULL; /* NULL: no next task to load */
        if (next.live) {
            cpu_attention_ahead_init(&ahead, &next.keys, next.blk * ATTN_KEY_BLOCK,
                                     next.blk * ATTN_KEY_BLOCK + ATTN_PREFETCH_KEYS);
            ah = &ahead;
        }
        cpu_attention_ahead_issue(ah, ATTN_AHEAD_FIRST);
        if (cur.live) {
            const int g = cur.g;
            int nr = 0;
            for (int64_t t = cur.ta; t < cur.tb; t++) {
                float *st =
                    c->attn_part + ((t * Hkv + g) * NB + cur.blk) * part; /* m[G], l[G], acc */
                const int64_t off = t * (int64_t)H * Dh + (int64_t)g * G * Dh;
                const int64_t end = c->attn_nk[t];
                for (int k = 0; k < G; k++)
                    rows[nr++] = (struct attn_row){j->q + off + (int64_t)k * Dh,
                                                   j->qc + off + (int64_t)k * Dh,
                                                   end,
                                                   st + k,
                                                   st + G + k,
                                                   st + 2 * G + (int64_t)k * Dh,
                                                   c->attn_shift[t]};
            }
            const int64_t v0 = cur.blk * ATTN_KEY_BLOCK;
            cpu_attention_span_rows(&c->akr, nr, rows, &cur.keys, v0, v0 + ATTN_KEY_BLOCK, scale,
                                    j->norm == MODEL_NORM_SOFTPICK, ah);
            /* the task holds all of its rows' keys: merge them here (the
             * merge run's own call), and the step has one run fewer */
            if (j->merge_in_task)
                for (int64_t t = cur.ta; t < cur.tb; t++)
                    for (int k = 0; k < G; k++)
                        attention_merge_row(j, t, g * G + k);
        }
        cpu_attention_ahead_issue(ah, -1);
        cur = next;
    }
}

/* Merges the blocks of each (token, head), tokens split across parts. */
static void attention_merge_task(void *arg, int ith, int nth)
{
    struct attn_job *j = arg;
    const struct cpu_ctx *c = j->b->ctx;
    const int H = j->b->model->hp.n_head;
    const int64_t T = c->batch->T;
    for (int64_t i = T * H * ith / nth; i < T * H * (ith + 1) / nth; i++)
        attention_merge_row(j, i / H, (int)(i % H));
}

static void cpu_attention(struct backend *b, int layer, const float *q, const float *qc,
                          const float *sinks, enum model_normalizer norm, float *att, float *probe)
{
    settle(b);
    struct cpu_ctx *c = b->ctx;
    const struct model_hparams *hp = &b->model->hp;
    const int H = hp->n_head, Hkv = hp->n_head_kv, G = H / Hkv;
    const int64_t T = c->batch->T, NB = c->attn_blocks;
    struct attn_job j = {
        b, layer, q, qc, sinks, norm, att, probe, NULL, 0, threadpool_active(c->tp)};
    j.tsinks = sink_key_logits(c, b->model, layer, q, sinks, norm);
    if (probe) {
        threadpool_run(c->tp, attention_probe_task, &j);
        return;
    }
    /* group consecutive tokens of one sequence whose views join (view_join:
     * a prefill chunk, its window sliding or not) */
    const int max_group =
        ATTN_GROUP_TOKENS < ATTN_MAX_ROWS / G ? ATTN_GROUP_TOKENS : ATTN_MAX_ROWS / G;
    int64_t ng = 0;
    /* when no token has keys past the first block (a decode step at short
     * contexts), each task holds all of its rows' keys and merges them */
    j.merge_in_task = 1;
    for (int64_t t = 0; t < T; t++) {
        struct kv_seq seq;
        const struct kv_view *vw = view_for(c, t, layer, &seq);
        c->attn_nk[t] = vw->n_sinks + vw->win_len;
        j.merge_in_task &= c->attn_nk[t] <= ATTN_KEY_BLOCK;
        if (t == 0 || t - c->attn_group[ng - 1] >= max_group ||
            c->batch->slot[t] != c->batch->slot[t - 1] ||
            !view_join(&c->attn_uview[ng - 1], vw, seq.ring, &c->attn_shift[t])) {
            c->attn_group[ng] = t;
            c->attn_uview[ng++] = *vw;
            c->attn_shift[t] = 0;
        }
    }
    c->attn_group[ng] = T;
    c->attn_n_groups = ng;
    int64_t n_tasks = ng * Hkv * NB;
    /* many parts: the work per task is uneven (causal prefill, empty blocks) */
    int64_t parts = 16 * (int64_t)j.active;
    threadpool_run_parts(c->tp, attention_task, &j, (int)(parts < n_tasks ? parts : n_tasks));
    if (j.merge_in_task)
        return;
    int64_t mparts = 4 * (int64_t)j.active;
    if (T * H < mparts)
        mparts = T * H;
    threadpool_run_parts(c->tp, attention_merge_task, &j, (int)mparts);
}

static void swiglu_span(const struct cpu_ctx *c, float *hb, const float *hb2, int64_t n)
{
    if (c->isa >= CPU_ISA_AVX512) {
        cpu__swiglu_avx512(hb, hb2, n);
        return;
    }
    if (c->isa >= CPU_ISA_AVX2) {
        cpu__swiglu_avx2(hb, hb2, n);
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        float g = hb[i];
        hb[i] = g / (1.0f + expf(-g)) * hb2[i];
    }
}

static void swiglu_task(void *arg, int ith, int nth)
{
    struct ew_job *j = arg;
    const int64_t n = j->rows * j->row_len;
    const int64_t i0 = n * ith / nth, i1 = n * (ith + 1) / nth;
    swiglu_span(j->b->ctx, j->x + i0, j->y + i0, i1 - i0);
}

static void cpu_swiglu(struct backend *b, float *hb, const float *hb2, int64_t rows)
{
    settle(b);
    struct ew_job j = {.b = b, .x = hb, .y = hb2, .rows = rows, .row_len = b->model->hp.n_ff};
    ew_run(b->ctx, swiglu_task, &j);
}

/* GELU, tanh approximation (Hendrycks and Gimpel 2016; PyTorch's
 * gelu(approximate="tanh"), Gemma's hidden activation) */
static float gelu_tanh(float x)
{
    const float k = 0.7978845608028654f; /* sqrt(2 / pi) */
    return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}

static void geglu_task(void *arg, int ith, int nth)
{
    struct ew_job *j = arg;
    const int64_t n = j->rows * j->row_len;
    for (int64_t i = n * ith / nth; i < n * (ith + 1) / nth; i++)
        j->x[i] = gelu_tanh(j->x[i]) * j->y[i];
}

static void cpu_geglu(struct backend *b, float *hb, const float *hb2, int64_t rows)
{
    settle(b);
    struct ew_job j = {.b = b, .x = hb, .y = hb2, .rows = rows, .row_len = b->model->hp.n_ff};
    ew_run(b->ctx, geglu_task, &j);
}

static void scale_task(void *arg, int ith, int nth)
{
    struct ew_job *j = arg;
    const int64_t n = j->rows * j->row_len;
    for (int64_t i = n * ith / nth; i < n * (ith + 1) / nth; i++)
        j->x[i] *= j->s;
}

static void cpu_scale(struct backend *b, float *x, float s, int64_t rows)
{
    settle(b);
    struct ew_job j = {.b = b, .x = x, .rows = rows, .row_len = b->model->hp.n_embd, .s = s};
    ew_run(b->ctx, scale_task, &j);
}

static void add_task(void *arg, int ith, int nth)
{
    struct ew_job *j = arg;
    const int64_t n = j->rows * j->row_len, i0 = n * ith / nth;
    add_span(j->b->ctx, j->x + i0, j->y + i0, n * (ith + 1) / nth - i0);
}

static void cpu_add(struct backend *b, float *x, const float *y, int64_t rows)
{
    settle(b);
    struct ew_job j = {.b = b, .x = x, .y = y, .rows = rows, .row_len = b->model->hp.n_embd};
    ew_run(b->ctx, add_task, &j);
}

/* The deferred op (struct deferred), if any, done now as its own op would
 * do it. Every op but cpu_product (which may take it into its preparation
 * run) starts here, so each sees the values the ops one by one make. */
static void settle(struct backend *b)
{
    struct cpu_ctx *c = b->ctx;
    const struct deferred d = c->deferred;
    c->deferred.then = BACKEND_THEN_NONE;
    if (d.then == BACKEND_THEN_ADD)
        cpu_add(b, d.x, d.y, d.rows);
    else if (d.then == BACKEND_THEN_SWIGLU)
        cpu_swiglu(b, d.x, d.y, d.rows);
}

/* backend_ops.product: where the products share one prepared input, one
 * preparation run (each row's RMSNorm first) and one run of the products,
 * each part finishing the outputs it made (SwiGLU on a gate block and the up
 * block of the same rows, or the residual add); else the ops one by one.
 * At batch sizes where that SwiGLU or add would be a pool run of its own,
 * it is deferred instead (struct deferred): the next product whose input it
 * makes does it row by row in its preparation run, before the RMSNorm, and
 * any other op does it first (settle). That saves a run and a pass over the
 * rows twice a layer. The values are those of the separate ops, bit for
 * bit: each value's arithmetic is theirs, only where and when it is done
 * differ. */
static void cpu_product(struct backend *b, const struct backend_product *p, int64_t rows)
{
    struct cpu_ctx *c = b->ctx;
    int fuse = !c->reference_matmul && p->n >= 1 && p->n <= BACKEND_SHARED_MAX;
    for (int i = 1; i < p->n && fuse; i++)
        fuse = same_act(p->W[0], p->W[i]);
    if (p->then == BACKEND_THEN_SWIGLU)
        fuse = fuse && p->n == 2 && p->W[1]->ne1 == p->W[0]->ne1;
    if (p->then == BACKEND_THEN_ADD)
        fuse = fuse && p->n == 1;
    /* the previous product's deferred op, when it made this one's input:
     * done row by row in this one's preparation run (with the RMSNorm, which
     * must follow it) */
    const struct deferred d = c->deferred;
    const int take = fuse && d.then != BACKEND_THEN_NONE && d.x == p->x && d.rows == rows &&
                     d.row_len == p->W[0]->ne0;
    if (take)
        c->deferred.then = BACKEND_THEN_NONE;
    else
        settle(b);
    /* an op is folded in where on its own it would run on the calling
     * thread alone (ew_run): there it leaves the pool idle; larger ones
     * run faster as pool runs of their own, or in the next product's
     * preparation run (deferred) */
    const int fuse_norm = fuse && p->norm && (take || ew_parts(c, rows, p->W[0]->ne0) <= 1);
    const int fuse_then =
        fuse && p->then != BACKEND_THEN_NONE && ew_parts(c, rows, p->W[0]->ne1) <= 1;
    const float *in = p->x;
    if (p->norm && !fuse_norm) {
        cpu_rmsnorm(b, p->x, p->norm, p->xn, rows);
        in = p->xn;
    }
    if (!fuse) {
        cpu_matmul_shared(b, p->W, p->y, p->n, in, rows);
    } else {
        struct matmul_job j = {.c = c,
                               .x = in,
                               .rows = rows,
                               .act_bytes = quant_act_bytes(p->W[0]->type, p->W[0]->ne0),
                               .norm = fuse_norm ? p->norm : NULL,
                               .xn = p->xn,
                               .eps = b->model->hp.norm_eps,
                               .then = fuse_then ? p->then : BACKEND_THEN_NONE,
                               .res = p->res,
                               .first = take ? d.then : BACKEND_THEN_NONE,
                               .xd = d.x,
                               .first_y = d.y};
        for (int i = 0; i < p->n; i++)
            job_add(c, &j, p->W[i], p->y[i]);
        matmul_run(c, &j);
        if (fuse_then)
            return;
        if (p->then != BACKEND_THEN_NONE) { /* for the next op (settle) or product */
            c->deferred = (struct deferred){
                .then = p->then,
                .x = p->then == BACKEND_THEN_ADD ? p->res : p->y[0],
                .y = p->then == BACKEND_THEN_ADD ? p->y[0] : p->y[1],
                .rows = rows,
                .row_len = p->W[0]->ne1,
            };
            return;
        }
    }
    if (p->then == BACKEND_THEN_SWIGLU)
        cpu_swiglu(b, p->y[0], p->y[1], rows);
    else if (p->then == BACKEND_THEN_ADD)
        cpu_add(b, p->res, p->y[0], rows);
}

static void cpu_gather(struct backend *b, const float *x, float *xo)
{
    settle(b);
    struct cpu_ctx *c = b->ctx;
    const int64_t D = b->model->hp.n_embd;
    for (int64_t i = 0; i < c->batch->n_out; i++)
        memcpy(xo + i * D, x + c->batch->out_rows[i] * D, (size_t)D * sizeof(float));
}

static void cpu_logits(struct backend *b, const struct tensor *W, const float *xo,
                       float *host_logits)
{
    settle(b);
    struct cpu_ctx *c = b->ctx;
    cpu_matmul(b, W, xo, host_logits, c->batch->n_out);
}

static void cpu_run_parts(struct backend *b, void (*fn)(void *, int, int), void *arg, int n)
{
    settle(b);
    struct cpu_ctx *c = b->ctx;
    threadpool_run_parts_uneven(c->tp, fn, arg, n);
}

static int cpu_sync(struct backend *b)
{
    settle(b);
    return 0;
}

static int cpu_copy(struct backend *b, float *dst, const float *src, int64_t n)
{
    settle(b);
    memcpy(dst, src, (size_t)n * sizeof(float));
    return 0;
}

/* ---- KV snapshots ------------------------------------------------------------------------- */

/* dir 0: storage -> host (export), 1: host -> storage (import) */
static int kv_copy(struct backend *b, int64_t slot, int layer, int64_t cell0, int64_t n, void *hk,
                   void *hv, int64_t host_cells, int dir)
{
    struct cpu_ctx *c = b->ctx;
    const struct kv_geometry *g = &c->geo;
    if (slot < 0 || slot >= g->n_slots || layer < 0 || layer >= g->n_layer || cell0 < 0 || n < 0 ||
        n > host_cells || cell0 + n > kv_geometry_layer_cells(g, layer))
        return -EINVAL;
    const size_t row = kv_geometry_row_bytes(g);
    for (int h = 0; h < g->n_kv_head; h++) {
        size_t off = kv_geometry_byte_offset(g, slot, layer, h, cell0);
        size_t hoff = (size_t)h * (size_t)host_cells * row;
        char *sk = (char *)c->kmem + off, *sv = (char *)c->vmem + off;
        char *dk = (char *)hk + hoff, *dv = (char *)hv + hoff;
        if (dir == 0) {
            memcpy(dk, sk, (size_t)n * row);
            memcpy(dv, sv, (size_t)n * row);
        } else {
            memcpy(sk, dk, (size_t)n * row);
            memcpy(sv, dv, (size_t)n * row);
        }
    }
    return 0;
}

static int cpu_kv_export(struct backend *b, int64_t slot, int layer, int64_t cell0, int64_t n,
                         void *hk, void *hv, int64_t host_cells)
{
    settle(b);
    return kv_copy(b, slot, layer, cell0, n, hk, hv, host_cells, 0);
}

static int cpu_kv_import(struct backend *b, int64_t slot, int layer, int64_t cell0, int64_t n,
                         const void *hk, const void *hv, int64_t host_cells)
{
    settle(b);
    return kv_copy(b, slot, layer, cell0, n, (void *)hk, (void *)hv, host_cells, 1);
}

static const struct backend_ops cpu_ops = {
    .name = "cpu",
    .free = cpu_free,
    .kv_alloc = cpu_kv_alloc,
    .begin_step = cpu_begin_step,
    .embed = cpu_embed,
    .rmsnorm = cpu_rmsnorm,
    .matmul = cpu_matmul,
    .rope = cpu_rope,
    .kv_store = cpu_kv_store,
    .attention = cpu_attention,
    .swiglu = cpu_swiglu,
    .geglu = cpu_geglu,
    .scale = cpu_scale,
    .add = cpu_add,
    .gather = cpu_gather,
    .logits = cpu_logits,
    .sync = cpu_sync,
    .copy_in = cpu_copy,
    .copy_out = cpu_copy,
    .kv_export = cpu_kv_export,
    .kv_import = cpu_kv_import,
    .matmul_shared = cpu_matmul_shared,
    .run_parts = cpu_run_parts,
    .product = cpu_product,
    .rope_store = cpu_rope_store,
};

int backend_cpu_init(struct backend *b, const struct model *m, const struct backend_cpu_config *cfg,
                     char *err, size_t err_len)
{
    const struct model_hparams *hp = &m->hp;
    memset(b, 0, sizeof *b);
    b->ops = &cpu_ops;
    b->model = m;
    b->max_tokens = cfg->max_tokens > 0 ? cfg->max_tokens : 1;
    struct cpu_ctx *c = calloc(1, sizeof *c);
    if (!c)
        goto oom;
    b->ctx = c;
    int rc = threadpool_init(&c->tp, cfg->n_threads);
    if (rc < 0) {
        snprintf(err, err_len, "cpu backend: cannot start %d threads", cfg->n_threads);
        cpu_free(b);
        return rc;
    }
    c->isa = cpu_isa_best();
    c->reference_matmul = cfg->reference_matmul;
    cpu_attention_kernels(&c->akr, (int)c->isa);

    const size_t T = (size_t)b->max_tokens;
    const size_t D = (size_t)hp->n_embd, F = (size_t)hp->n_ff;
    const size_t DQ = (size_t)hp->n_head * (size_t)hp->head_dim;
    const size_t DKV = (size_t)hp->n_head_kv * (size_t)hp->head_dim;
    struct backend_acts *a = &b->acts;
    a->x = xalloc(T * D * 4);
    a->xb = xalloc(T * D * 4);
    a->xb2 = xalloc(T * D * 4);
    a->q = xalloc(T * DQ * 4);
    a->qc = xalloc(T * DQ * 4);
    a->k = xalloc(T * DKV * 4);
    a->v = xalloc(T * DKV * 4);
    a->att = xalloc(T * DQ * 4);
    a->hb = xalloc(T * F * 4);
    a->hb2 = xalloc(T * F * 4);
    a->xo = xalloc(T * D * 4);
    a->logits = xalloc(T * (size_t)hp->n_vocab * 4);
    c->cs_abs = xalloc(T * (size_t)hp->rope_dim * 4);
    c->cs_cache = xalloc(T * (size_t)hp->rope_dim * 4);
    c->cs_abs_local = xalloc(T * (size_t)hp->rope_dim * 4);
    c->sink_logits = xalloc(T * (size_t)hp->n_head * 4);
    size_t kmax = D > F ? D : F;
    if (DQ > kmax)
        kmax = DQ;
    /* f32 activations are the largest prepared form; the reference product
     * needs one dequantized row per thread */
    c->act_cap = (T > (size_t)cfg->n_threads ? T : (size_t)cfg->n_threads) * kmax * 4;
    c->act = xalloc(c->act_cap);
    c->attn_nk = xalloc(T * sizeof(int64_t));
    c->attn_group = xalloc((T + 1) * sizeof(int64_t));
    c->attn_uview = xalloc(T * sizeof(struct kv_view));
    c->attn_shift = xalloc(T * sizeof(int64_t));
    if (!c->attn_nk || !c->attn_group || !c->attn_uview || !c->attn_shift || !a->x || !a->xb ||
        !a->xb2 || !a->q || !a->qc || !a->k || !a->v || !a->att || !a->hb || !a->hb2 || !a->xo ||
        !a->logits || !c->cs_abs || !c->cs_cache || !c->cs_abs_local || !c->sink_logits || !c->act)
        goto oom;
    if (!c->reference_matmul && pack_weights(c, m) < 0)
        goto oom;
    return 0;
oom:
    snprintf(err, err_len, "cpu backend: out of memory");
    cpu_free(b);
    return -ENOMEM;
}
