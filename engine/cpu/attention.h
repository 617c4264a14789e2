/*
 * attention.h: the CPU attention op for one (token, head): online softmax with
 * the per-head sink scalar over the sink keys and the window keys a query
 * sees, plus the rectified softpick path. Internal to engine/cpu.
 *
 * Normalizers (DESIGN.md): the running max starts at s_h and the running sum
 * at 1 (the virtual key with logit s_h and a zero value); vanilla softmax
 * starts at -inf and 0; softmax1 is s_h = 0. A row with no keys and no sink
 * term returns zeros, never NaN.
 */
#ifndef SS_CPU_ATTENTION_H
#define SS_CPU_ATTENTION_H

#include <stddef.h>
#include <stdint.h>

#include "../../kvcache/kvcache.h"
#include "../model.h"

/* How a K/V row of n values is stored: n f32 values, n f16 values, or
 * n / 32 Q8_0 blocks (f16 scale d, 32 int8 q; value d * q). Numbered so
 * that a 0/1 "is f16" flag reads as f32/f16, not as kvcache.h's kv_dtype:
 * convert with attn_fmt_of. */
enum attn_fmt { ATTN_F32 = 0, ATTN_F16 = 1, ATTN_Q8_0 = 2 };
static inline int attn_fmt_of(enum kv_dtype t)
{
    return t == KV_DTYPE_F16 ? ATTN_F16 : t == KV_DTYPE_Q8_0 ? ATTN_Q8_0 : ATTN_F32;
}
/* Bytes of one row of n values in fmt. */
static inline size_t attn_row_bytes(int fmt, int n)
{
    return fmt == ATTN_Q8_0 ? (size_t)(n / KV_Q8_BLOCK) * KV_Q8_BLOCK_BYTES
                            : (size_t)n * (fmt == ATTN_F16 ? 2 : 4);
}
/* The Q8_0 block of a row that holds value i: its f16 scale at bytes 0-1,
 * then the int8 values, value i at byte 2 + i % KV_Q8_BLOCK. */
static inline const char *attn_q8_block(const void *row, int i)
{
    return (const char *)row + (size_t)(i / KV_Q8_BLOCK) * KV_Q8_BLOCK_BYTES;
}

/* K/V rows of one kv head, Dh values each, in one attn_fmt. */
struct attn_keys {
    const void *k; /* first cell of the head */
    const void *v;
    int fmt; /* enum attn_fmt */
    int head_dim;
    /* cells to visit, as up to three contiguous runs [start, start + len) */
    int64_t run_start[3];
    int64_t run_len[3];
    int run_uses_qc[3]; /* 1: score with the in-cache query (sink keys) */
    /* sink probe (optional): the final weights of the first probe_n keys in
     * visit order (at most ATTN_PROBE_K) are written to probe */
    float *probe;
    int64_t probe_n;
};
#define ATTN_PROBE_K 16
/* Longest head_dim of a Q8_0 row the in-place kernels take, in blocks (the
 * tile path's limit, ATTN_MAX_DH = 256 values, over 32). */
#define ATTN_KV_MAX_BLOCKS 8

/* Softpick's running max starts here instead of at -inf. Its weights are
 * relu(e^(z-m) - e^(-m)) in the frame of the running max m, and e^(-m)
 * overflows a float once m < -88: a block of keys that all score below that
 * would turn the merged output into inf * 0 = NaN. Flooring the frame at -64
 * keeps e^(-m) <= e^64 and changes nothing whenever any score is >= -64 (the
 * frame is then the true max, and frame changes are exact rescalings). The
 * CUDA kernels use the same floor (engine/cuda/attention_kernels.cuh). */
#define ATTN_SOFTPICK_M_FLOOR (-64.0f)

struct attn_kernels { /* row kernels chosen at run time (F16C+FMA or scalar) */
    /* q . k and acc += a * v over one row of n values in fmt */
    float (*dot)(const float *q, const void *k, int n, int fmt);
    void (*axpy)(float *acc, float a, const void *v, int n, int fmt);
    void (*scale)(float *acc, float a, int n);
    /* rows consecutive rows of n values in fmt to f32: dst[r * n + i] is the
     * value (for Q8_0 the f32 product d * q, one rounding) */
    void (*to_f32)(float *dst, const void *src, int rows, int n, int fmt);
    /* w[i] = e^(z[i] - m) for i < n (relative error < 2e-7 on the AVX2 path);
     * returns their sum, added in an order that depends on n alone */
    float (*exp_sub)(float *w, const float *z, float m, int n);
    /* exp_sub for nr rows (w + r * ws from z + r * zs with max m[r], sum to
     * sum[r]), each row's values and sum those of exp_sub; NULL: exp_sub
     * row by row */
    void (*exp_sub_rows)(float *w, int64_t ws, const float *z, int64_t zs, int nr, const float *m,
                         int n, float *sum);
    /* z[i] = scale * dot(q, kf + i * n) for a tile of nt f32 key rows;
     * returns the largest z[i] */
    float (*scores)(float *z, const float *q, const float *kf, int nt, int n, float scale);
    /* acc += sum_i w[i] * (vf + i * n) for a tile of nt f32 value rows */
    void (*accum)(float *acc, const float *w, const float *vf, int nt, int n);
    /* scores and accum for nr query rows at once over f16 or Q8_0 K/V rows
     * read in place (k[i], v[i]: row i of the tile, in fmt), each row's
     * arithmetic exactly that of scores / accum on the tile converted to
     * f32 by to_f32, so both give the same bits; a key or value row is
     * loaded and converted once for all nr rows. Row r's scores go to
     * z + r * zs and its largest to mx[r]; its weights are read from
     * w + r * ws. NULL where the CPU has no such kernels. */
    void (*scores_kv)(float *z, int64_t zs, int nr, const float *const *q, const void *const *k,
                      int nt, int n, float scale, float *mx, int fmt);
    void (*accum_kv)(float *const *acc, int nr, const float *w, int64_t ws, const void *const *v,
                     int nt, int n, int fmt);
    /* Scores of many rows over keys they share (a prefill group's), f16 K
     * with n a multiple of 16; NULL where the CPU has none. keys_t lays nk
     * key rows k[i] out as ceil(nk / 8) chunks of 8 keys, transposed (n * 8
     * halves each; a short last chunk repeats its last key); scores_t sets
     * z[r * zs + i] for rows r < nr and the nc chunks' keys i < 8 * nc to
     * the bits scores_kv gives row r for key i; max_kv sets mx[r] to the
     * largest of z[r * zs + i], i < nt, as scores_kv finds it. */
    void (*keys_t)(uint16_t *kt, const void *const *k, int nk, int n);
    void (*scores_t)(float *z, int64_t zs, int nr, const float *const *q, const uint16_t *kt,
                     int nc, int n, float scale);
    void (*max_kv)(float *mx, const float *z, int64_t zs, int nr, int nt);
};
/* level: 0 scalar (no in-place kernels), 1 AVX2 (+FMA, F16C; in-place
 * kernels up to three rows at once), 2 AVX-512 tile kernels (scores, accum,
 * exp_sub, to_f32 and the in-place ones, up to three rows at once) over the
 * AVX2 row kernels; the cpu_isa of matmul.h fits. */
void cpu_attention_kernels(struct attn_kernels *out, int level);

/* out (Dh) = attention of query q (and qc for sink runs) over keys. scale is
 * 1/sqrt(Dh). norm picks the normalizer; sink is s_h (ignored for softmax and
 * softpick); sink_v is v_h, the sink's value vector (Dh floats; NULL: zero;
 * read for the sink normalizer only). */
void cpu_attention_row(const struct attn_kernels *kr, const float *q, const float *qc,
                       const struct attn_keys *keys, float scale, enum model_normalizer norm,
                       float sink, const float *sink_v, float *out);

/*
 * The split form used by the backend (grouped-query aware, flash-decoding):
 * nq query heads that share one kv head are scored against the keys with
 * visit index in [v0, v1) (visit order: the runs of keys, in order), each key
 * row read once for all of them. The partial state per head is (m, l, acc):
 * running max, sum and unnormalized output, started at m = -inf, l = 0 (no
 * sink term: cpu_attention_merge adds it exactly once). acc is nq * Dh.
 */
/* The backend's blocks: visit indices [b * ATTN_KEY_BLOCK, (b + 1) * ATTN_KEY_BLOCK),
 * fixed by key index alone (never by batch, grouping or threads), so a
 * token's attention is merged from the same blocks however it is run. */
#define ATTN_KEY_BLOCK 512
#define ATTN_MAX_BLOCKS 4096 /* key blocks merged per query head: a window of ~2M keys */
void cpu_attention_span(const struct attn_kernels *kr, int nq, const float *q, const float *qc,
                        const struct attn_keys *keys, int64_t v0, int64_t v1, float scale,
                        int softpick, float *m, float *l, float *acc);

/*
 * The same for query rows that need not belong to one token: several tokens
 * of one sequence (a prefill chunk), each with all the query heads of the kv
 * head, over keys that cover every row's (the union of their views). Row r
 * has its own visit order: its visit index v is keys' v while v is in the
 * sink run (run 0) and keys' v + shift after it, so that rows whose windows
 * slide by one key per token share keys. Row r sees its visit indices
 * [v0, min(v1, end)) and keeps its partial state in (*m, *l, acc[Dh]); a row
 * that sees none of them gets m = -inf (merge skips it). Each row's state is
 * bit-identical to what cpu_attention_span computes for it alone: the tiles
 * are fixed by the row's visit index, and every float operation on a row
 * depends only on that row and its keys. f16 and Q8_0 K/V are read in place
 * (scores_kv, accum_kv) by one token's rows at a time, while the group's
 * keys are in cache; with f16 keys and the block kernels (keys_t, scores_t)
 * every row's scores over the span are made first, in one call, with the
 * same bits. Otherwise (f32, or no in-place kernels) each tile's K/V rows
 * are converted once for all rows.
 */
struct attn_row {
    const float *q, *qc; /* head_dim each; qc scores the sink run */
    int64_t end;         /* visit indices this row sees: [0, end) */
    float *m, *l, *acc;
    int64_t shift; /* 0 .. ATTN_MAX_SHIFT: keys' index of visit index v past the sink run - v */
};
#define ATTN_MAX_ROWS 64
#define ATTN_MAX_SHIFT 32

/* The K and V rows of visit indices [v, v1) of keys (those of them keys
 * has), the cells a later span will read, to be loaded into L2 a few lines
 * at a time while other work runs: a burst of a few hundred prefetches
 * holds the core until line-fill buffers free up. */
struct attn_ahead {
    struct attn_keys keys;
    int64_t v, v1;
    size_t off; /* bytes of v's run already asked for */
};
/* What a decode task asks for of the next one: all of its keys (a task
 * holds one key block), and how many lines of them before its own work
 * (the rest in doses after its tiles). A key that nothing asked for waits
 * on memory: asking for only the first 128 keys left the 32-stream step's
 * spans, which grow past 128 keys, with such tails (docs/benchmarks.md). */
#define ATTN_PREFETCH_KEYS ATTN_KEY_BLOCK
#define ATTN_AHEAD_FIRST 16
void cpu_attention_ahead_init(struct attn_ahead *a, const struct attn_keys *keys, int64_t v0,
                              int64_t v1);
/* Asks for up to n more lines of K (each with the V line at the same
 * offset); n < 0: all that are left. Returns how many it asked for (a NULL
 * a: none). */
int64_t cpu_attention_ahead_issue(struct attn_ahead *a, int64_t n);
/* ahead: NULL, or rows to load a dose of after each tile (the next task's) */
void cpu_attention_span_rows(const struct attn_kernels *kr, int nr, const struct attn_row *rows,
                             const struct attn_keys *keys, int64_t v0, int64_t v1, float scale,
                             int softpick, struct attn_ahead *ahead);
/* Merges n partial states of one head (m[i], l[i], acc + i * acc_stride) with
 * the sink term of the normalizer (logit sink, value sink_v as in
 * cpu_attention_row) and writes the normalized output (Dh). */
void cpu_attention_merge(const struct attn_kernels *kr, int n, const float *m, const float *l,
                         const float *acc, int64_t acc_stride, int head_dim,
                         enum model_normalizer norm, float sink, const float *sink_v, float *out);

/* AVX2 row kernels (attention_avx2.c; call only when the CPU has AVX2+FMA+F16C). */
float cpu__attn_dot_avx2(const float *q, const void *k, int n, int fmt);
void cpu__attn_axpy_avx2(float *acc, float a, const void *v, int n, int fmt);
void cpu__attn_scale_avx2(float *acc, float a, int n);
void cpu__attn_to_f32_avx2(float *dst, const void *src, int rows, int n, int fmt);
float cpu__attn_exp_sub_avx2(float *w, const float *z, float m, int n);
void cpu__attn_exp_sub_rows_avx2(float *w, int64_t ws, const float *z, int64_t zs, int nr,
                                 const float *m, int n, float *sum);
float cpu__attn_scores_avx2(float *z, const float *q, const float *kf, int nt, int n, float scale);
void cpu__attn_accum_avx2(float *acc, const float *w, const float *vf, int nt, int n);
void cpu__attn_scores_kv_avx2(float *z, int64_t zs, int nr, const float *const *q,
                              const void *const *k, int nt, int n, float scale, float *mx, int fmt);
void cpu__attn_accum_kv_avx2(float *const *acc, int nr, const float *w, int64_t ws,
                             const void *const *v, int nt, int n, int fmt);
void cpu__attn_keys_t_avx2(uint16_t *kt, const void *const *k, int nk, int n);
void cpu__attn_scores_t_avx2(float *z, int64_t zs, int nr, const float *const *q,
                             const uint16_t *kt, int nc, int n, float scale);
void cpu__attn_max_kv_avx2(float *mx, const float *z, int64_t zs, int nr, int nt);
/* AVX-512 tile kernels (attention_avx512.c; AVX-512 F and the above) */
float cpu__attn_scores_avx512(float *z, const float *q, const float *kf, int nt, int n,
                              float scale);
void cpu__attn_accum_avx512(float *acc, const float *w, const float *vf, int nt, int n);
float cpu__attn_exp_sub_avx512(float *w, const float *z, float m, int n);
void cpu__attn_to_f32_avx512(float *dst, const void *src, int rows, int n, int fmt);
void cpu__attn_scores_kv_avx512(float *z, int64_t zs, int nr, const float *const *q,
                                const void *const *k, int nt, int n, float scale, float *mx,
                                int fmt);
void cpu__attn_accum_kv_avx512(float *const *acc, int nr, const float *w, int64_t ws,
                               const void *const *v, int nt, int n, int fmt);

#endif
