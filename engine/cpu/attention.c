/*
 * attention.c: one query row against the keys it sees, with every normalizer
 * of DESIGN.md through one online pass (attention.h).
 *
 *   softmax / softmax1 / sink:  m = s_h, l = 1 (vanilla: m = -inf, l = 0),
 *     acc = v_h, the sink's value (sink with attn_sinks_v; else acc = 0)
 *     for each key: z = q.k * scale; m' = max(m, z);
 *                   acc = acc e^(m-m') + e^(z-m') v;  l = l e^(m-m') + e^(z-m')
 *     out = acc / l           (l == 0 only when there are no keys: out = 0)
 *   softpick: m the running max of z over the keys, floored at
 *     ATTN_SOFTPICK_M_FLOOR (attention.h: keeps e^(-m) finite); numerator weights
 *     relu(e^(z-m) - e^(-m)) and denominator Σ |e^(z-m) - e^(-m)|, both
 *     rescaled by e^(m-m') when the max moves (e^(z-m') - e^(-m') =
 *     e^(m-m') (e^(z-m) - e^(-m))); out = acc / (den + eps).
 */
#include "attention.h"

#include <assert.h>

#include <math.h>
#include <string.h>

#include "../quant.h"

/* Value i of a row of K or V in fmt (for Q8_0 the f32 product d * q). */
static float load_value(const void *row, int i, int fmt)
{
    if (fmt == ATTN_F16)
        return quant_f16_to_f32(((const uint16_t *)row)[i]);
    if (fmt == ATTN_Q8_0) {
        const struct block_q8_0 *b = (const struct block_q8_0 *)row + i / 32;
        return quant_f16_to_f32(b->d) * (float)b->qs[i % 32];
    }
    return ((const float *)row)[i];
}

static float dot_scalar(const float *q, const void *k, int n, int fmt)
{
    float s = 0;
    for (int i = 0; i < n; i++)
        s += q[i] * load_value(k, i, fmt);
    return s;
}

static void axpy_scalar(float *acc, float a, const void *v, int n, int fmt)
{
    for (int i = 0; i < n; i++)
        acc[i] += a * load_value(v, i, fmt);
}

static void scale_scalar(float *acc, float a, int n)
{
    for (int i = 0; i < n; i++)
        acc[i] *= a;
}

static void to_f32_scalar(float *dst, const void *src, int rows, int n, int fmt)
{
    const size_t rb = attn_row_bytes(fmt, n);
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < n; i++)
            dst[(size_t)r * (size_t)n + (size_t)i] =
                load_value((const char *)src + (size_t)r * rb, i, fmt);
}

static float exp_sub_scalar(float *w, const float *z, float m, int n)
{
    float s = 0.0f;
    for (int i = 0; i < n; i++) {
        w[i] = expf(z[i] - m);
        s += w[i];
    }
    return s;
}

static float scores_scalar(float *z, const float *q, const float *kf, int nt, int n, float scale)
{
    float mx = -INFINITY;
    for (int i = 0; i < nt; i++) {
        z[i] = dot_scalar(q, kf + (size_t)i * (size_t)n, n, ATTN_F32) * scale;
        mx = z[i] > mx ? z[i] : mx;
    }
    return mx;
}

static void accum_scalar(float *acc, const float *w, const float *vf, int nt, int n)
{
    for (int i = 0; i < nt; i++)
        axpy_scalar(acc, w[i], vf + (size_t)i * (size_t)n, n, ATTN_F32);
}

void cpu_attention_kernels(struct attn_kernels *out, int level)
{
    memset(out, 0, sizeof *out);
    if (level >= 1) {
        out->dot = cpu__attn_dot_avx2;
        out->axpy = cpu__attn_axpy_avx2;
        out->scale = cpu__attn_scale_avx2;
        out->to_f32 = cpu__attn_to_f32_avx2;
        out->exp_sub = cpu__attn_exp_sub_avx2;
        out->exp_sub_rows = cpu__attn_exp_sub_rows_avx2;
        out->scores = cpu__attn_scores_avx2;
        out->accum = cpu__attn_accum_avx2;
        out->scores_kv = cpu__attn_scores_kv_avx2;
        out->accum_kv = cpu__attn_accum_kv_avx2;
        out->keys_t = cpu__attn_keys_t_avx2;
        out->scores_t = cpu__attn_scores_t_avx2;
        out->max_kv = cpu__attn_max_kv_avx2;
        if (level >= 2) { /* the block kernels give the AVX2 scores_kv's bits: none here */
            out->scores = cpu__attn_scores_avx512;
            out->accum = cpu__attn_accum_avx512;
            out->exp_sub = cpu__attn_exp_sub_avx512;
            out->exp_sub_rows = NULL;
            out->to_f32 = cpu__attn_to_f32_avx512;
            out->scores_kv = cpu__attn_scores_kv_avx512;
            out->accum_kv = cpu__attn_accum_kv_avx512;
            out->keys_t = NULL;
            out->scores_t = NULL;
            out->max_kv = NULL;
        }
    } else {
        out->dot = dot_scalar;
        out->axpy = axpy_scalar;
        out->scale = scale_scalar;
        out->to_f32 = to_f32_scalar;
        out->exp_sub = exp_sub_scalar;
        out->scores = scores_scalar;
        out->accum = accum_scalar;
    }
}

#define SOFTPICK_EPS 1e-6f

void cpu_attention_row(const struct attn_kernels *kr, const float *q, const float *qc,
                       const struct attn_keys *keys, float scale, enum model_normalizer norm,
                       float sink, const float *sink_v, float *out)
{
    const int n = keys->head_dim;
    const size_t rb = attn_row_bytes(keys->fmt, n);
    const int softpick = norm == MODEL_NORM_SOFTPICK;
    float m, l;

    float zs[ATTN_PROBE_K];
    int64_t visited = 0;
    const int64_t probe_n =
        keys->probe ? (keys->probe_n < ATTN_PROBE_K ? keys->probe_n : ATTN_PROBE_K) : 0;

    memset(out, 0, (size_t)n * sizeof(float));
    if (softpick) {
        m = ATTN_SOFTPICK_M_FLOOR;
        l = 0.0f;
    } else if (norm == MODEL_NORM_SOFTMAX) {
        m = -INFINITY;
        l = 0.0f;
    } else {
        m = norm == MODEL_NORM_SOFTMAX1 ? 0.0f : sink;
        l = 1.0f; /* the virtual key: e^(s_h - m) with m = s_h, value v_h (or zero) */
        if (norm == MODEL_NORM_SINK && sink_v)
            memcpy(out, sink_v, (size_t)n * sizeof(float));
    }
    for (int r = 0; r < 3; r++) {
        const float *qq = keys->run_uses_qc[r] ? qc : q;
        for (int64_t c = keys->run_start[r]; c < keys->run_start[r] + keys->run_len[r]; c++) {
            const char *kp = (const char *)keys->k + (size_t)c * rb;
            const char *vp = (const char *)keys->v + (size_t)c * rb;
            float z = kr->dot(qq, kp, n, keys->fmt) * scale;
            if (visited < probe_n)
                zs[visited] = z;
            visited++;
            if (z > m) {
                float corr = expf(m - z); /* 0 when m = -inf */
                l *= corr;
                kr->scale(out, corr, n);
                m = z;
            }
            if (softpick) {
                float e = expf(z - m), e0 = expf(-m);
                float d = e - e0;
                l += fabsf(d);
                if (d > 0)
                    kr->axpy(out, d, vp, n, keys->fmt);
            } else {
                float w = expf(z - m);
                l += w;
                kr->axpy(out, w, vp, n, keys->fmt);
            }
        }
    }
    for (int64_t i = 0; i < probe_n; i++) { /* final weights of the probed keys */
        float w;
        if (softpick) {
            float d = expf(zs[i] - m) - expf(-m);
            w = d > 0 ? d / (l + SOFTPICK_EPS) : 0.0f;
        } else {
            w = l > 0 ? expf(zs[i] - m) / l : 0.0f;
        }
        keys->probe[i] = w;
    }
    if (softpick) {
        /* DESIGN.md's formula adds eps to the max-shifted denominator: l */
        float denom = l + SOFTPICK_EPS;
        kr->scale(out, 1.0f / denom, n);
        return;
    }
    if (l > 0)
        kr->scale(out, 1.0f / l, n);
}

/* Keys are taken in tiles of ATTN_TILE visit indices, aligned to visit
 * index 0 (so the tiles, like the blocks, do not depend on where the ring
 * wraps or on the batch): the tile's K and V rows are converted to f32 once
 * for all nq heads, each head's scores for the tile come first, then one
 * rescale per tile (if the max moved) and the exponentials as a vector. */
#define ATTN_TILE 32
#define ATTN_MAX_DH 256
/* Lines of the next task's K (and as many of V) asked for in each tile
 * (struct attn_ahead), half after the scores and half after the weighted
 * sums: a decode task of 80 keys has three tiles, and 64 lines in each
 * spread all of its 160 lines of K over them. */
#define ATTN_AHEAD_PER_TILE 64

/* Cell of visit index v: (run, cell) through the runs; *left = the cells
 * left in that run from v on. */
static int64_t visit_cell(const struct attn_keys *keys, int64_t v, int *run, int64_t *left)
{
    int64_t base = 0;
    int r = 0;
    while (v - base >= keys->run_len[r]) {
        base += keys->run_len[r];
        r++;
    }
    *run = r;
    *left = base + keys->run_len[r] - v;
    return keys->run_start[r] + v - base;
}

/* Starts loading the K rows (and with_v, the V rows) of keys' visit
 * indices from v on (up to ATTN_TILE keys, not past last or the end of v's
 * run) while the converted-tile path works on the current one: a prefill
 * chunk's tiles come from memory once per chunk, and its conversion and
 * per-row work leave time for the whole tile to arrive. */
static void prefetch_tile(const struct attn_keys *keys, int64_t v, int64_t last, int with_v)
{
    int run;
    int64_t left, c = visit_cell(keys, v, &run, &left), cnt = last - v;
    cnt = cnt < left ? cnt : left;
    cnt = cnt < ATTN_TILE ? cnt : ATTN_TILE;
    const size_t rb = attn_row_bytes(keys->fmt, keys->head_dim);
    const size_t o0 = (size_t)c * rb, bytes = (size_t)cnt * rb;
    for (size_t o = 0; o < bytes; o += 64) {
        __builtin_prefetch((const char *)keys->k + o0 + o);
        if (with_v)
            __builtin_prefetch((const char *)keys->v + o0 + o);
    }
}

void cpu_attention_ahead_init(struct attn_ahead *a, const struct attn_keys *keys, int64_t v0,
                              int64_t v1)
{
    const int64_t n = keys->run_len[0] + keys->run_len[1] + keys->run_len[2];
    *a = (struct attn_ahead){.keys = *keys, .v = v0, .v1 = v1 < n ? v1 : n};
}

int64_t cpu_attention_ahead_issue(struct attn_ahead *a, int64_t n)
{
    int64_t issued = 0;
    if (!a)
        return 0;
    const size_t rb = attn_row_bytes(a->keys.fmt, a->keys.head_dim);
    while (n != 0 && a->v < a->v1) {
        int run; /* visit_cell takes only the indices keys has: v < v1 <= n */
        int64_t left, c = visit_cell(&a->keys, a->v, &run, &left);
        const int64_t cnt = left < a->v1 - a->v ? left : a->v1 - a->v;
        const size_t o0 = (size_t)c * rb, bytes = (size_t)cnt * rb;
        for (; n != 0 && a->off < bytes; a->off += 64, n--, issued++) {
            __builtin_prefetch((const char *)a->keys.k + o0 + a->off, 0, 2); /* into L2 */
            __builtin_prefetch((const char *)a->keys.v + o0 + a->off, 0, 2);
        }
        if (a->off >= bytes) {
            a->v += cnt;
            a->off = 0;
        }
    }
    return issued;
}

/* One online-softmax step of a row over its scores z[0, nt) of a tile, in
 * two halves so that several rows' exponentials can be made in one call
 * between them: row_frame rescales (m, l, acc) if the tile's max bm is
 * above m; row_sum adds the tile's weights w (e^(z - m), summing to ws) to
 * l, for softpick turning them into relu(e^(z-m) - e^-m) in place. */
static void row_frame(const struct attn_kernels *kr, const struct attn_row *row, float bm, int n)
{
    float *pm = row->m, *pl = row->l;
    if (bm > *pm) {
        float corr = expf(*pm - bm); /* 0 when m was -inf */
        *pl *= corr;
        kr->scale(row->acc, corr, n);
        *pm = bm;
    }
}

static void row_sum(const struct attn_row *row, float *w, float ws, int nt, int softpick)
{
    float *pl = row->l;
    if (softpick) { /* weights relu(e^(z-m) - e^-m), denominator |.| */
        const float e0 = expf(-*row->m);
        for (int i = 0; i < nt; i++) {
            float d = w[i] - e0;
            *pl += fabsf(d);
            w[i] = d > 0 ? d : 0.0f;
        }
    } else {
        *pl += ws;
    }
}

/* Both halves for one row: the tile's weights into w */
static void row_weights(const struct attn_kernels *kr, const struct attn_row *row, float *z,
                        float *w, int nt, float bm, int n, int softpick)
{
    row_frame(kr, row, bm, n);
    row_sum(row, w, kr->exp_sub(w, z, *row->m, nt), nt, softpick);
}

/* Capacity: a backend task's block (ATTN_KEY_BLOCK keys), its rows' largest
 * shift and a tile's slack; a longer span walks the runs for each tile. */
#define SPAN_CELLS_MAX (ATTN_KEY_BLOCK + ATTN_MAX_SHIFT + ATTN_TILE)
/* The K and V rows of keys' indices [u0, u0 + n) past the sink run, found
 * once for a span's runs of rows: each run (a token's rows, with its own
 * shift) takes its tiles' rows from here instead of walking the runs again
 * for every tile. */
struct span_cells {
    int64_t u0, n;
    const void *k[SPAN_CELLS_MAX], *v[SPAN_CELLS_MAX];
};

/* cells->k, v for keys' indices [u0, u1) when they fit, else cells->n = 0 */
static void span_cells_find(struct span_cells *cells, const struct attn_keys *keys, int64_t u0,
                            int64_t u1)
{
    const size_t rb = attn_row_bytes(keys->fmt, keys->head_dim);
    cells->u0 = u0;
    cells->n = 0;
    if (u1 - u0 > SPAN_CELLS_MAX)
        return;
    for (int64_t u = u0; u < u1;) {
        int run;
        int64_t left, c = visit_cell(keys, u, &run, &left);
        const int64_t cnt = left < u1 - u ? left : u1 - u;
        for (int64_t k = 0; k < cnt; k++) {
            cells->k[u - u0 + k] = (const char *)keys->k + (size_t)(c + k) * rb;
            cells->v[u - u0 + k] = (const char *)keys->v + (size_t)(c + k) * rb;
        }
        u += cnt;
    }
    cells->n = u1 - u0;
}

/* Tiles at the start of each key block of a one-token span whose rows are
 * asked for ahead of the kernels (prefetch_span_start), for rows of at most
 * ATTN_SELF_ROW_BYTES (head_dim 64: 8 KiB a tile in f16, 4.25 KiB in
 * Q8_0). Measured at head_dim 64 only; narrower heads (and Q8_0 up to
 * head_dim 96) take it too, unmeasured. Gemma 3's 512-byte rows (head_dim
 * 256 in f16) showed no gain with it (its attention is a small part of its
 * step) and are left to the hardware. A Q8_0 tile starts anywhere in a
 * line, and prefetch_tile (as cpu_attention_ahead_issue) steps 64 bytes
 * from its first byte, so it may leave out the tile's last line; asking
 * for that line too made the engine's attention slower, f16 rows included,
 * whose lines it did not change (docs/benchmarks.md). */
#define ATTN_SELF_TILES 4
#define ATTN_SELF_ROW_BYTES 128

/* A decode token's span starts cold: the first task of a pool part had no
 * task before it to load its rows ahead (struct attn_ahead), the others
 * have only their first keys in L2, and the hardware prefetchers start
 * over at each span, which sits in the ring of its own head and slot. So
 * for the first ATTN_SELF_TILES tiles of each key block of a one-token
 * span, before a tile's scores, this tile's V rows (read after the scores)
 * and the next tile's K rows are asked for, into L1. At 8 streams on a Zen
 * 5 core this took about a fifth off the attention's time with f16 K/V,
 * most of it from the V rows, and about a tenth with Q8_0 K/V; past the
 * first tiles the two streams are the hardware prefetchers'
 * (docs/benchmarks.md). vp: the tile's nt V rows; t1, last:
 * the next tile's first visit index and the span's end; S, shift: the sink
 * run's length and the rows' shift past it. */
static void prefetch_span_start(const struct attn_keys *keys, const void *const *vp, int nt,
                                int64_t t1, int64_t last, int64_t S, int64_t shift)
{
    const size_t rb = attn_row_bytes(keys->fmt, keys->head_dim);
    for (int i = 0; i < nt; i++)
        for (size_t o = 0; o < rb; o += 64)
            __builtin_prefetch((const char *)vp[i] + o, 0, 3);
    if (t1 >= last)
        return;
    /* the next tile in keys' indices: the sink run as it is, past it shifted */
    const int64_t u = t1 < S ? t1 : t1 + shift, last_u = last <= S ? last : last + shift;
    assert(last_u <= keys->run_len[0] + keys->run_len[1] + keys->run_len[2]);
    prefetch_tile(keys, u, last_u, 0);
}

/* cpu_attention_span_rows for rows that all see the same keys (the query
 * heads of one kv head of a token: one end, one shift) over f16 or Q8_0
 * K/V, with the in-place kernels: each K and V row is read once per tile
 * for all rows, converted in registers. Same tiles, same per-row
 * arithmetic, same bits.
 * One token's span (cells NULL) asks for the rows of each key block's
 * first tiles ahead (prefetch_span_start); the rest is left to the hardware
 * prefetchers: a burst of prefetches for every next tile made a 4,096-key
 * decode 1.5x slower on a Zen 4 core (docs/benchmarks.md). The next task's
 * rows (ahead) are asked for a dose after each tile. */
static void span_rows_inplace(const struct attn_kernels *kr, int nr, const struct attn_row *rows,
                              const struct attn_keys *keys, int64_t v0, int64_t last, float scale,
                              int softpick, const struct span_cells *cells, const float *zc,
                              int64_t zcs, struct attn_ahead *ahead)
{
    const int64_t S = keys->run_len[0], shift = rows[0].shift;
    const int n = keys->head_dim, fmt = keys->fmt;
    const size_t rb = attn_row_bytes(fmt, n);
    float z[ATTN_MAX_ROWS * ATTN_TILE], w[ATTN_MAX_ROWS * ATTN_TILE], bm[ATTN_MAX_ROWS],
        b2[ATTN_MAX_ROWS];
    const float *qs[ATTN_MAX_ROWS], *qcs[ATTN_MAX_ROWS];
    float *accs[ATTN_MAX_ROWS];
    const void *kt[ATTN_TILE], *vt[ATTN_TILE];
    for (int r = 0; r < nr; r++) {
        qs[r] = rows[r].q;
        qcs[r] = rows[r].qc;
        accs[r] = rows[r].acc;
    }
    for (int64_t t0 = v0; t0 < last;) {
        int64_t t1 = (t0 / ATTN_TILE + 1) * ATTN_TILE;
        if (t1 > last)
            t1 = last;
        const int nt = (int)(t1 - t0);
        const void *const *kp = kt, *const *vp = vt;
        const float *zp = z; /* the tile's scores: row r's at zp + r * zps */
        int64_t zps = ATTN_TILE;
        int n_qc = 0; /* sink keys (scored with qc) come first in visit order */
        int in_cells = 0;
        if (t0 >= S && cells && t0 + shift - cells->u0 + nt <= cells->n) {
            /* past the sink run: keys' indices [t0 + shift, t1 + shift) */
            kp = cells->k + (t0 + shift - cells->u0);
            vp = cells->v + (t0 + shift - cells->u0);
            in_cells = 1;
        } else {
            for (int i = 0; i < nt;) {
                int run;
                const int64_t u = t0 + i < S ? t0 + i : t0 + i + shift; /* keys' index */
                int64_t left, c = visit_cell(keys, u, &run, &left);
                const int cnt = left < nt - i ? (int)left : nt - i;
                for (int k = 0; k < cnt; k++) {
                    kt[i + k] = (const char *)keys->k + (size_t)(c + k) * rb;
                    vt[i + k] = (const char *)keys->v + (size_t)(c + k) * rb;
                }
                if (keys->run_uses_qc[run])
                    n_qc = i + cnt;
                i += cnt;
            }
        }
        if (!cells && t0 - v0 < ATTN_SELF_TILES * ATTN_TILE && rb <= ATTN_SELF_ROW_BYTES)
            prefetch_span_start(keys, vp, nt, t1, last, S, shift);
        for (int r = 0; r < nr; r++)
            bm[r] = -INFINITY;
        if (in_cells && zc) { /* scored already, with the span's other rows */
            zp = zc + (t0 + shift - cells->u0);
            zps = zcs;
            kr->max_kv(b2, zp, zps, nr, nt);
            for (int r = 0; r < nr; r++)
                bm[r] = b2[r] > bm[r] ? b2[r] : bm[r];
        } else {
            if (n_qc > 0)
                kr->scores_kv(z, ATTN_TILE, nr, qcs, kp, n_qc, n, scale, bm, fmt);
            if (n_qc < nt) {
                kr->scores_kv(z + n_qc, ATTN_TILE, nr, qs, kp + n_qc, nt - n_qc, n, scale, b2, fmt);
                for (int r = 0; r < nr; r++)
                    bm[r] = b2[r] > bm[r] ? b2[r] : bm[r];
            }
        }
        cpu_attention_ahead_issue(ahead, ATTN_AHEAD_PER_TILE / 2);
        for (int r = 0; r < nr; r++) {
            row_frame(kr, &rows[r], bm[r], n);
            bm[r] = *rows[r].m;
        }
        if (kr->exp_sub_rows) {
            kr->exp_sub_rows(w, ATTN_TILE, zp, zps, nr, bm, nt, b2);
        } else {
            for (int r = 0; r < nr; r++)
                b2[r] = kr->exp_sub(w + r * ATTN_TILE, zp + r * zps, bm[r], nt);
        }
        for (int r = 0; r < nr; r++)
            row_sum(&rows[r], w + r * ATTN_TILE, b2[r], nt, softpick);
        kr->accum_kv(accs, nr, w, ATTN_TILE, vp, nt, n, fmt);
        cpu_attention_ahead_issue(ahead, ATTN_AHEAD_PER_TILE / 2);
        t0 = t1;
    }
}

/* A span's scores made once for all its rows (scores_t): keys in chunks
 * of 8, for head_dim up to SPAN_Z_MAX_DH */
#define SPAN_Z_KEYS ((SPAN_CELLS_MAX + 7) / 8 * 8)
#define SPAN_Z_MAX_DH 128

/* span_rows_inplace for several tokens' rows (runs of rows with one end and
 * one shift), their cells found once for all. With f16 keys and the block
 * kernels, every row's scores over all the cells are made first, in one
 * call over the keys transposed once: a run's tiles past the sink run then
 * read them (the same bits as scoring them tile by tile, scores_t), and the
 * scores' horizontal sums, a third of scores_kv's time on AVX2, are gone
 * (docs/benchmarks.md). Its buffers take about 300 KB of stack (a block's
 * cells, their scores for 64 rows, the keys transposed at head_dim 128):
 * the pool's and the engine's threads have the default stack, 8 MiB under
 * glibc's usual limit. */
static __attribute__((noinline)) void span_rows_runs(const struct attn_kernels *kr, int nr,
                                                     const struct attn_row *rows,
                                                     const struct attn_keys *keys, int64_t v0,
                                                     int64_t v1, int64_t last_u, float scale,
                                                     int softpick, struct attn_ahead *ahead)
{
    struct span_cells cells;
    float zc[ATTN_MAX_ROWS * SPAN_Z_KEYS];
    uint16_t kt[SPAN_Z_KEYS * SPAN_Z_MAX_DH];
    const int n = keys->head_dim;
    const int64_t u0 = v0 > keys->run_len[0] ? v0 : keys->run_len[0];
    span_cells_find(&cells, keys, u0, last_u > u0 ? last_u : u0);
    const int scored = kr->keys_t && kr->scores_t && kr->max_kv && keys->fmt == ATTN_F16 &&
                       n % 16 == 0 && n <= SPAN_Z_MAX_DH && cells.n > 0;
    if (scored) {
        const float *qs[ATTN_MAX_ROWS];
        for (int r = 0; r < nr; r++)
            qs[r] = rows[r].q;
        kr->keys_t(kt, cells.k, (int)cells.n, n);
        kr->scores_t(zc, SPAN_Z_KEYS, nr, qs, kt, (int)(cells.n + 7) / 8, n, scale);
    }
    for (int r0 = 0, r1; r0 < nr; r0 = r1) { /* runs of rows with one end and one shift */
        for (r1 = r0 + 1;
             r1 < nr && rows[r1].end == rows[r0].end && rows[r1].shift == rows[r0].shift; r1++)
            ;
        const int64_t e = rows[r0].end < v1 ? rows[r0].end : v1;
        if (e > v0)
            span_rows_inplace(kr, r1 - r0, rows + r0, keys, v0, e, scale, softpick, &cells,
                              scored ? zc + (int64_t)r0 * SPAN_Z_KEYS : NULL, SPAN_Z_KEYS, ahead);
    }
}

/* cpu_attention_span_rows through f32 tiles: the keys any row needs for a
 * tile are converted once for all rows; rows may see different prefixes of
 * their visit orders and have different shifts. Row r's keys of the tile
 * [t0, t1), which it sees up to e = min(end, t1), are keys' visit indices
 * [t0, min(e, S)) (S: the sink run's length) and then [max(t0, S) + shift,
 * e + shift): at most two stretches of the converted rows, which hold
 * keys' indices [t0, u1). Each row's
 * scores are made key by key, and its weighted values key after key for
 * every value, so a row gets the same bits from its stretches as from one
 * contiguous tile. last_u: the end of the keys' indices any row needs. */
static void span_rows_tiled(const struct attn_kernels *kr, int nr, const struct attn_row *rows,
                            const struct attn_keys *keys, int64_t v0, int64_t last, int64_t last_u,
                            float scale, int softpick, struct attn_ahead *ahead)
{
    enum { CAP = ATTN_TILE + ATTN_MAX_SHIFT }; /* converted rows a tile can need */
    const int n = keys->head_dim;
    const size_t rb = attn_row_bytes(keys->fmt, n);
    const int64_t S = keys->run_len[0];
    float kf[CAP * ATTN_MAX_DH], vf[CAP * ATTN_MAX_DH];
    float z[ATTN_TILE], w[ATTN_TILE];
    int use_qc[CAP];
    for (int64_t t0 = v0; t0 < last;) {
        int64_t t1 = (t0 / ATTN_TILE + 1) * ATTN_TILE;
        if (t1 > last)
            t1 = last;
        int64_t u1 = t0; /* keys' indices [t0, u1) are the tile's for some row */
        for (int r = 0; r < nr; r++) {
            const int64_t e = rows[r].end < t1 ? rows[r].end : t1;
            const int64_t ue = e > S && e > t0 ? e + rows[r].shift : e;
            u1 = ue > u1 ? ue : u1;
        }
        const int nc = (int)(u1 - t0);
        /* gather the tile's rows: keys' index -> (run, cell), one conversion
         * per stretch of consecutive cells */
        for (int i = 0; i < nc;) {
            int r;
            int64_t len, cell = visit_cell(keys, t0 + i, &r, &len);
            const int cnt = len < nc - i ? (int)len : nc - i;
            const size_t c = (size_t)cell * rb;
            kr->to_f32(kf + (size_t)i * n, (const char *)keys->k + c, cnt, n, keys->fmt);
            kr->to_f32(vf + (size_t)i * n, (const char *)keys->v + c, cnt, n, keys->fmt);
            for (int k = 0; k < cnt; k++)
                use_qc[i + k] = keys->run_uses_qc[r];
            i += cnt;
        }
        if (t1 < last && u1 < last_u)
            prefetch_tile(keys, u1, last_u, 1);
        for (int r = 0; r < nr; r++) {
            const struct attn_row *row = &rows[r];
            /* the keys of this tile that row r sees: the tile's first ntr
             * (a row sees a prefix of its visit order), in tile-aligned
             * steps exactly as it would alone */
            int64_t e = row->end < t1 ? row->end : t1;
            if (e <= t0)
                continue;
            const int ntr = (int)(e - t0);
            /* its stretches: keys [0, ns) at converted row 0 (the sink
             * run), keys [ns, ntr) at converted row ns + sh */
            const int ns = S > t0 ? (int)(S - t0 < ntr ? S - t0 : ntr) : 0;
            const int sh = ns < ntr ? (int)row->shift : 0;
            float bm = -INFINITY;
            for (int i = 0; i < ntr;) { /* runs of keys scored with the same query */
                const int b = i < ns ? i : i + sh, stop = i < ns ? ns : ntr;
                int j = i + 1;
                while (j < stop && use_qc[(j < ns ? j : j + sh)] == use_qc[b])
                    j++;
                const float bj = kr->scores(z + i, use_qc[b] ? row->qc : row->q,
                                            kf + (size_t)b * (size_t)n, j - i, n, scale);
                bm = bj > bm ? bj : bm;
                i = j;
            }
            row_weights(kr, row, z, w, ntr, bm, n, softpick);
            if (ns > 0 && sh > 0) {
                kr->accum(row->acc, w, vf, ns, n);
                kr->accum(row->acc, w + ns, vf + (size_t)(ns + sh) * (size_t)n, ntr - ns, n);
            } else {
                kr->accum(row->acc, w, vf + (size_t)sh * (size_t)n, ntr, n);
            }
        }
        cpu_attention_ahead_issue(ahead, ATTN_AHEAD_PER_TILE);
        t0 = t1;
    }
}

void cpu_attention_span_rows(const struct attn_kernels *kr, int nr, const struct attn_row *rows,
                             const struct attn_keys *keys, int64_t v0, int64_t v1, float scale,
                             int softpick, struct attn_ahead *ahead)
{
    int64_t last = v0;   /* the furthest visit index any row sees */
    int64_t last_u = v0; /* the furthest of keys' indices any row reads */
    assert(keys->head_dim <= ATTN_MAX_DH);
    assert(nr <= ATTN_MAX_ROWS);
    for (int r = 0; r < nr; r++) {
        *rows[r].m = softpick ? ATTN_SOFTPICK_M_FLOOR : -INFINITY;
        *rows[r].l = 0.0f;
        memset(rows[r].acc, 0, (size_t)keys->head_dim * sizeof(float));
        assert(rows[r].shift >= 0 && rows[r].shift <= ATTN_MAX_SHIFT);
        int64_t e = rows[r].end < v1 ? rows[r].end : v1;
        last = e > last ? e : last;
        if (e > keys->run_len[0] && e > v0)
            e += rows[r].shift;
        last_u = e > last_u ? e : last_u;
    }
    assert(last_u <= keys->run_len[0] + keys->run_len[1] + keys->run_len[2]);
    /* f16 and Q8_0 rows in place, one token's rows (one end, one shift) at a
     * time: per key that is faster than a converted tile's f32 rows taken a
     * row at a time, even for a tile shared by 48 rows (docs/benchmarks.md) */
    if (keys->fmt != ATTN_F32 && kr->scores_kv) {
        int runs = 1;
        for (int r = 1; r < nr; r++)
            runs += rows[r].end != rows[r - 1].end || rows[r].shift != rows[r - 1].shift;
        if (runs > 1) {
            span_rows_runs(kr, nr, rows, keys, v0, v1, last_u, scale, softpick, ahead);
        } else {
            const int64_t e = rows[0].end < v1 ? rows[0].end : v1;
            if (e > v0)
                span_rows_inplace(kr, nr, rows, keys, v0, e, scale, softpick, NULL, NULL, 0, ahead);
        }
    } else {
        span_rows_tiled(kr, nr, rows, keys, v0, last, last_u, scale, softpick, ahead);
    }
    for (int r = 0; r < nr; r++)
        if (rows[r].end <= v0 || v1 <= v0)
            *rows[r].m = -INFINITY; /* no keys here: merge skips the span */
}

void cpu_attention_span(const struct attn_kernels *kr, int nq, const float *q, const float *qc,
                        const struct attn_keys *keys, int64_t v0, int64_t v1, float scale,
                        int softpick, float *m, float *l, float *acc)
{
    const int n = keys->head_dim;
    struct attn_row rows[ATTN_MAX_ROWS];
    assert(nq <= ATTN_MAX_ROWS);
    for (int h = 0; h < nq; h++)
        rows[h] = (struct attn_row){q + (size_t)h * (size_t)n,
                                    qc + (size_t)h * (size_t)n,
                                    v1,
                                    m + h,
                                    l + h,
                                    acc + (size_t)h * (size_t)n,
                                    0};
    cpu_attention_span_rows(kr, nq, rows, keys, v0, v1, scale, softpick, NULL);
}

void cpu_attention_merge(const struct attn_kernels *kr, int n, const float *m, const float *l,
                         const float *acc, int64_t acc_stride, int head_dim,
                         enum model_normalizer norm, float sink, const float *sink_v, float *out)
{
    const int softpick = norm == MODEL_NORM_SOFTPICK;
    /* the sink term is one more partial state: (m, l) = (s_h, 1), acc = v_h (or 0) */
    float M = -INFINITY;
    if (norm == MODEL_NORM_SOFTMAX1)
        M = 0.0f;
    else if (norm == MODEL_NORM_SINK)
        M = sink;
    const float m_sink = M;
    for (int i = 0; i < n; i++)
        M = m[i] > M ? m[i] : M;
    float L = 0.0f;
    if (m_sink > -INFINITY)
        L = expf(m_sink - M);
    memset(out, 0, (size_t)head_dim * sizeof(float));
    if (norm == MODEL_NORM_SINK && sink_v)
        kr->axpy(out, L, sink_v, head_dim, ATTN_F32);
    for (int i = 0; i < n; i++) {
        if (!(m[i] > -INFINITY))
            continue; /* an empty span */
        float c = expf(m[i] - M);
        L += l[i] * c;
        kr->axpy(out, c, acc + i * acc_stride, head_dim, ATTN_F32);
    }
    if (softpick) {
        kr->scale(out, 1.0f / (L + SOFTPICK_EPS), head_dim);
        return;
    }
    if (L > 0)
        kr->scale(out, 1.0f / L, head_dim);
}
