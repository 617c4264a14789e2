/* attention_avx512.c: AVX-512 tile kernels for attention.c (attention.h):
 * the AVX2 kernels' structure with 16-value vectors. */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "attention.h"
#include "simd_avx512.h"

/* lanes 0..n-1 of 16 */
static inline __mmask16 mask16(int n)
{
    return (__mmask16)((1u << n) - 1u);
}

/* the 128-bit quarters of a and b that imm picks (VSHUFF32X4, as its integer
 * twin: the emulation the unit tests build this file with has only that) */
#define SHUF128(a, b, imm)                                                                         \
    _mm512_castsi512_ps(_mm512_shuffle_i32x4(_mm512_castps_si512(a), _mm512_castps_si512(b), imm))

/* The sums of 8 accumulators in one vector, lane i = the sum of a[i]'s 16
 * lanes l0..l15, by cpu_sum8's tree (simd_avx2.h) after folding the two
 * halves: with p_j = l_j + l_(j+8), ((p0+p1)+(p2+p3)) + ((p4+p5)+(p6+p7)).
 * Lane i depends on a[i] alone. Each level adds two vectors whose lanes the
 * shuffles pair up, four keys' 128-bit quarters side by side, so the eight
 * sums take 16 shuffles and 8 adds (folding each accumulator on its own and
 * then cpu_sum8 would take 22 shuffles and 15 adds). */
static inline __m256 sum8_512(const __m512 *a)
{
    /* level 0, keys (i, i+4): quarters 0-1 are p_0..7 of key i, 2-3 of key i+4 */
    __m512 p[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++)
        p[i] = _mm512_add_ps(SHUF128(a[i], a[i + 4], 0x44), SHUF128(a[i], a[i + 4], 0xEE));
    /* level 1, adjacent lanes of each quarter: quarter 0 holds p0+p1, p2+p3
     * of keys 0 and 1, quarter 1 their p4+p5, p6+p7, quarters 2-3 those of
     * keys 4 and 5 (q01), and likewise for keys 2, 3, 6, 7 (q23) */
    const __m512 q01 =
        _mm512_add_ps(_mm512_shuffle_ps(p[0], p[1], 0x88), _mm512_shuffle_ps(p[0], p[1], 0xDD));
    const __m512 q23 =
        _mm512_add_ps(_mm512_shuffle_ps(p[2], p[3], 0x88), _mm512_shuffle_ps(p[2], p[3], 0xDD));
    /* level 2: quarter 0 = the low sums (p0+p1)+(p2+p3) of keys 0-3, quarter 1
     * their high sums, quarters 2-3 the same for keys 4-7 */
    const __m512 r =
        _mm512_add_ps(_mm512_shuffle_ps(q01, q23, 0x88), _mm512_shuffle_ps(q01, q23, 0xDD));
    /* level 3: low + high, keys in order */
    const __m512 x = SHUF128(r, r, 0xD8); /* quarters 0, 2, 1, 3 */
    return _mm256_add_ps(_mm512_castps512_ps256(x),
                         _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
}

float cpu__attn_scores_avx512(float *z, const float *q, const float *kf, int nt, int n, float scale)
{
    const int nf = n & ~15;
    const __mmask16 tm = mask16(n & 15);
    const __m256 vs = _mm256_set1_ps(scale);
    __m256 mx = _mm256_set1_ps(-INFINITY); /* a short group's repeated key is a real score */
    for (int i0 = 0; i0 < nt; i0 += 8) {
        const int kn = nt - i0 < 8 ? nt - i0 : 8;
        const float *kp[8]; /* a short last group repeats its last key */
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++)
            kp[k] = kf + (size_t)(i0 + (k < kn ? k : kn - 1)) * (size_t)n;
        __m512 a[8];
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++)
            a[k] = _mm512_setzero_ps();
        for (int j = 0; j < nf; j += 16) {
            __m512 qv = _mm512_loadu_ps(q + j);
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++)
                a[k] = _mm512_fmadd_ps(qv, _mm512_loadu_ps(kp[k] + j), a[k]);
        }
        if (nf < n) {
            __m512 qv = _mm512_maskz_loadu_ps(tm, q + nf);
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++)
                a[k] = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(tm, kp[k] + nf), a[k]);
        }
        __m256 s = _mm256_mul_ps(sum8_512(a), vs);
        mx = _mm256_max_ps(mx, s);
        if (kn == 8) {
            _mm256_storeu_ps(z + i0, s);
        } else {
            float t[8];
            _mm256_storeu_ps(t, s);
            memcpy(z + i0, t, (size_t)kn * sizeof(float));
        }
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    return _mm_cvtss_f32(m4);
}

void cpu__attn_accum_avx512(float *acc, const float *w, const float *vf, int nt, int n)
{
    const int nf = n & ~15;
    int j = 0;
    for (; j + 128 <= nf; j += 128) {
        __m512 a[8];
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++)
            a[c] = _mm512_loadu_ps(acc + j + 16 * c);
        for (int i = 0; i < nt; i++) {
            const __m512 wi = _mm512_set1_ps(w[i]);
            const float *v = vf + (size_t)i * n + j;
#pragma GCC unroll 8
            for (int c = 0; c < 8; c++)
                a[c] = _mm512_fmadd_ps(wi, _mm512_loadu_ps(v + 16 * c), a[c]);
        }
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++)
            _mm512_storeu_ps(acc + j + 16 * c, a[c]);
    }
    for (; j + 64 <= nf; j += 64) {
        __m512 a[4];
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++)
            a[c] = _mm512_loadu_ps(acc + j + 16 * c);
        for (int i = 0; i < nt; i++) {
            const __m512 wi = _mm512_set1_ps(w[i]);
            const float *v = vf + (size_t)i * n + j;
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++)
                a[c] = _mm512_fmadd_ps(wi, _mm512_loadu_ps(v + 16 * c), a[c]);
        }
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++)
            _mm512_storeu_ps(acc + j + 16 * c, a[c]);
    }
    for (; j < n; j += 16) { /* the rest, 16 values at a time (the last one masked) */
        const __mmask16 m = mask16(n - j < 16 ? n - j : 16);
        __m512 a = _mm512_maskz_loadu_ps(m, acc + j);
        for (int i = 0; i < nt; i++)
            a = _mm512_fmadd_ps(_mm512_set1_ps(w[i]),
                                _mm512_maskz_loadu_ps(m, vf + (size_t)i * n + j), a);
        _mm512_mask_storeu_ps(acc + j, m, a);
    }
}

/*
 * The two tile kernels above for up to KV_ROWS_MAX query rows at once,
 * reading f16 or Q8_0 K/V rows straight from the cache (each row addressed
 * on its own) and converting them in registers: a key or value row is loaded
 * and converted once for all the rows, where the f32 kernels need the tile
 * converted to memory first. Each row's arithmetic is exactly that of
 * cpu__attn_scores_avx512 / cpu__attn_accum_avx512 on the tile as to_f32
 * converts it (the same FMA chain per key or per lane, the same reduction
 * tree; f16 to f32 is exact and a Q8_0 value is the one product d * q), so
 * either path gives the same bits. fmt is a constant in each instance.
 */
#define KV_ROWS_MAX 3

/* The f16 scale of Q8_0 block b of a row, as f32. */
static inline float q8_scale(const void *row, int b)
{
    uint16_t d;
    memcpy(&d, attn_q8_block(row, b * KV_Q8_BLOCK), 2);
    return _cvtsh_ss(d);
}

/* Values j .. j+15 of a row (j a multiple of 16; for Q8_0 they share block
 * j / 32, whose scale is d). */
static inline __attribute__((always_inline)) __m512 load16(const void *row, int j, float d,
                                                           const int fmt)
{
    if (fmt == ATTN_Q8_0) {
        const __m128i q =
            _mm_loadu_si128((const __m128i *)(attn_q8_block(row, j) + 2 + j % KV_Q8_BLOCK));
        return _mm512_mul_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)));
    }
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)row + j)));
}

/* The same for the masked last m values of an f16 row (Q8_0 rows have none:
 * their length is a multiple of 32). */
static inline __m512 load16_f16_masked(const void *row, int j, __mmask16 m)
{
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)row + j));
}

static inline __attribute__((always_inline)) void
scores_kv_rows(float *z, int64_t zs, const float *const *q, const void *const *k, int nt, int n,
               float scale, float *mx, const int rn, const int fmt)
{
    const int nf = n & ~15;
    const __mmask16 tm = mask16(n & 15);
    const __m256 vs = _mm256_set1_ps(scale);
    __m256 mxv[KV_ROWS_MAX];
#pragma GCC unroll 3
    for (int r = 0; r < rn; r++)
        mxv[r] = _mm256_set1_ps(-INFINITY);
    for (int i0 = 0; i0 < nt; i0 += 8) {
        const int kn = nt - i0 < 8 ? nt - i0 : 8;
        const void *kp[8]; /* a short last group repeats its last key */
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++)
            kp[c] = k[i0 + (c < kn ? c : kn - 1)];
        float d[8][ATTN_KV_MAX_BLOCKS]; /* Q8_0 scales of the eight keys */
        if (fmt == ATTN_Q8_0)
            for (int c = 0; c < 8; c++)
                for (int b = 0; b < n / 32; b++)
                    d[c][b] = q8_scale(kp[c], b);
        __m512 a[KV_ROWS_MAX][8];
#pragma GCC unroll 3
        for (int r = 0; r < rn; r++)
#pragma GCC unroll 8
            for (int c = 0; c < 8; c++)
                a[r][c] = _mm512_setzero_ps();
        for (int j = 0; j < nf; j += 16) {
#pragma GCC unroll 8
            for (int c = 0; c < 8; c++) {
                const __m512 kv = load16(kp[c], j, fmt == ATTN_Q8_0 ? d[c][j / 32] : 0.0f, fmt);
#pragma GCC unroll 3
                for (int r = 0; r < rn; r++)
                    a[r][c] = _mm512_fmadd_ps(_mm512_loadu_ps(q[r] + j), kv, a[r][c]);
            }
        }
        if (fmt == ATTN_F16 && nf < n) {
#pragma GCC unroll 8
            for (int c = 0; c < 8; c++) {
                const __m512 kv = load16_f16_masked(kp[c], nf, tm);
#pragma GCC unroll 3
                for (int r = 0; r < rn; r++)
                    a[r][c] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tm, q[r] + nf), kv, a[r][c]);
            }
        }
#pragma GCC unroll 3
        for (int r = 0; r < rn; r++) {
            __m256 s = _mm256_mul_ps(sum8_512(a[r]), vs);
            mxv[r] = _mm256_max_ps(mxv[r], s);
            if (kn == 8) {
                _mm256_storeu_ps(z + r * zs + i0, s);
            } else {
                float t[8];
                _mm256_storeu_ps(t, s);
                memcpy(z + r * zs + i0, t, (size_t)kn * sizeof(float));
            }
        }
    }
#pragma GCC unroll 3
    for (int r = 0; r < rn; r++) {
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mxv[r]), _mm256_extractf128_ps(mxv[r], 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        mx[r] = _mm_cvtss_f32(m4);
    }
}

void cpu__attn_scores_kv_avx512(float *z, int64_t zs, int nr, const float *const *q,
                                const void *const *k, int nt, int n, float scale, float *mx,
                                int fmt)
{
    for (int r0 = 0; r0 < nr; r0 += KV_ROWS_MAX) {
        const int rn = nr - r0 < KV_ROWS_MAX ? nr - r0 : KV_ROWS_MAX;
        float *zr = z + r0 * zs;
        if (fmt == ATTN_Q8_0) {
            if (rn == 3)
                scores_kv_rows(zr, zs, q + r0, k, nt, n, scale, mx + r0, 3, ATTN_Q8_0);
            else if (rn == 2)
                scores_kv_rows(zr, zs, q + r0, k, nt, n, scale, mx + r0, 2, ATTN_Q8_0);
            else
                scores_kv_rows(zr, zs, q + r0, k, nt, n, scale, mx + r0, 1, ATTN_Q8_0);
        } else if (rn == 3) {
            scores_kv_rows(zr, zs, q + r0, k, nt, n, scale, mx + r0, 3, ATTN_F16);
        } else if (rn == 2) {
            scores_kv_rows(zr, zs, q + r0, k, nt, n, scale, mx + r0, 2, ATTN_F16);
        } else {
            scores_kv_rows(zr, zs, q + r0, k, nt, n, scale, mx + r0, 1, ATTN_F16);
        }
    }
}

static inline __attribute__((always_inline)) void accum_kv_rows(float *const *acc, const float *w,
                                                                int64_t ws, const void *const *v,
                                                                int nt, int n, const int rn,
                                                                const int fmt)
{
    const int nf = n & ~15;
    int j = 0;
    for (; j + 64 <= nf; j += 64) {
        __m512 a[KV_ROWS_MAX][4];
#pragma GCC unroll 3
        for (int r = 0; r < rn; r++)
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++)
                a[r][c] = _mm512_loadu_ps(acc[r] + j + 16 * c);
        for (int i = 0; i < nt; i++) {
            float d0 = 0.0f, d1 = 0.0f; /* Q8_0: the scales of blocks j/32 and j/32 + 1 */
            if (fmt == ATTN_Q8_0) {
                d0 = q8_scale(v[i], j / 32);
                d1 = q8_scale(v[i], j / 32 + 1);
            }
            __m512 vv[4];
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++)
                vv[c] = load16(v[i], j + 16 * c, c < 2 ? d0 : d1, fmt);
#pragma GCC unroll 3
            for (int r = 0; r < rn; r++) {
                const __m512 wi = _mm512_set1_ps(w[r * ws + i]);
#pragma GCC unroll 4
                for (int c = 0; c < 4; c++)
                    a[r][c] = _mm512_fmadd_ps(wi, vv[c], a[r][c]);
            }
        }
#pragma GCC unroll 3
        for (int r = 0; r < rn; r++)
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++)
                _mm512_storeu_ps(acc[r] + j + 16 * c, a[r][c]);
    }
    for (; j < n; j += 16) { /* the rest, 16 values at a time (the last one masked) */
        const __mmask16 m = mask16(n - j < 16 ? n - j : 16);
        __m512 a[KV_ROWS_MAX];
#pragma GCC unroll 3
        for (int r = 0; r < rn; r++)
            a[r] = _mm512_maskz_loadu_ps(m, acc[r] + j);
        for (int i = 0; i < nt; i++) {
            const __m512 vv = fmt == ATTN_Q8_0 ? load16(v[i], j, q8_scale(v[i], j / 32), fmt)
                                               : load16_f16_masked(v[i], j, m);
#pragma GCC unroll 3
            for (int r = 0; r < rn; r++)
                a[r] = _mm512_fmadd_ps(_mm512_set1_ps(w[r * ws + i]), vv, a[r]);
        }
#pragma GCC unroll 3
        for (int r = 0; r < rn; r++)
            _mm512_mask_storeu_ps(acc[r] + j, m, a[r]);
    }
}

void cpu__attn_accum_kv_avx512(float *const *acc, int nr, const float *w, int64_t ws,
                               const void *const *v, int nt, int n, int fmt)
{
    for (int r0 = 0; r0 < nr; r0 += KV_ROWS_MAX) {
        const int rn = nr - r0 < KV_ROWS_MAX ? nr - r0 : KV_ROWS_MAX;
        const float *wr = w + r0 * ws;
        if (fmt == ATTN_Q8_0) {
            if (rn == 3)
                accum_kv_rows(acc + r0, wr, ws, v, nt, n, 3, ATTN_Q8_0);
            else if (rn == 2)
                accum_kv_rows(acc + r0, wr, ws, v, nt, n, 2, ATTN_Q8_0);
            else
                accum_kv_rows(acc + r0, wr, ws, v, nt, n, 1, ATTN_Q8_0);
        } else if (rn == 3) {
            accum_kv_rows(acc + r0, wr, ws, v, nt, n, 3, ATTN_F16);
        } else if (rn == 2) {
            accum_kv_rows(acc + r0, wr, ws, v, nt, n, 2, ATTN_F16);
        } else {
            accum_kv_rows(acc + r0, wr, ws, v, nt, n, 1, ATTN_F16);
        }
    }
}

/* cpu__attn_exp_sub_avx2 on 16 lanes (cpu_exp512 is cpu_exp256's steps):
 * the same bits, and the same lanes zeroed (those below -87, not NaN ones). */
float cpu__attn_exp_sub_avx512(float *w, const float *z, float m, int n)
{
    const __m512 vm = _mm512_set1_ps(m), lo = _mm512_set1_ps(-87.0f);
    __m512 acc = _mm512_setzero_ps();
    for (int i = 0; i < n; i += 16) {
        /* lanes past n read as -inf: e^-inf = 0 adds nothing */
        const __mmask16 k = mask16(n - i < 16 ? n - i : 16);
        __m512 x = _mm512_sub_ps(_mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), k, z + i), vm);
        /* e^x for x <= 0; below -87 it is 0 */
        __m512 e = _mm512_maskz_mov_ps(~_mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ), cpu_exp512(x));
        acc = _mm512_add_ps(acc, e);
        _mm512_mask_storeu_ps(w + i, k, e);
    }
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(acc),
                             _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc), 1)));
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    q = _mm_add_ss(q, _mm_movehdup_ps(q));
    return _mm_cvtss_f32(q);
}

void cpu__attn_to_f32_avx512(float *dst, const void *src, int rows, int n, int fmt)
{
    const size_t rb = attn_row_bytes(fmt, n);
    if (fmt == ATTN_F32) {
        memcpy(dst, src, (size_t)rows * rb);
        return;
    }
    for (int r = 0; r < rows; r++) {
        const char *row = (const char *)src + (size_t)r * rb;
        float *d = dst + (size_t)r * (size_t)n;
        if (fmt == ATTN_Q8_0) { /* n is a multiple of 32 */
            for (int j = 0; j < n; j += 16)
                _mm512_storeu_ps(d + j, load16(row, j, q8_scale(row, j / 32), ATTN_Q8_0));
            continue;
        }
        for (int j = 0; j < n; j += 16) {
            const __mmask16 m = mask16(n - j < 16 ? n - j : 16);
            _mm512_mask_storeu_ps(d + j, m, load16_f16_masked(row, j, m));
        }
    }
}
