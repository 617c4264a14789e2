/* attention_avx2.c: F16C + FMA row kernels for attention.c (attention.h). */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "attention.h"
#include "simd_avx2.h"

static inline float hsum(__m256 v)
{
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}

/* Values i .. i+7 of a row in fmt (attention.h); for Q8_0, i is a multiple
 * of 8, so the eight share one block, and each value is d * q as to_f32
 * gives it. */
static inline __m256 load8(const void *p, int i, int fmt)
{
    if (fmt == ATTN_F16)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)));
    if (fmt == ATTN_Q8_0) {
        const char *b = attn_q8_block(p, i);
        uint16_t d;
        memcpy(&d, b, 2);
        const __m128i q = _mm_loadl_epi64((const __m128i *)(b + 2 + i % 32));
        return _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(d)),
                             _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)));
    }
    return _mm256_loadu_ps((const float *)p + i);
}

static inline float load1(const void *p, int i, int fmt)
{
    if (fmt == ATTN_F16)
        return _cvtsh_ss(((const uint16_t *)p)[i]);
    if (fmt == ATTN_Q8_0) {
        const char *b = attn_q8_block(p, i);
        uint16_t d;
        memcpy(&d, b, 2);
        return _cvtsh_ss(d) * (float)(int8_t)b[2 + i % 32];
    }
    return ((const float *)p)[i];
}

float cpu__attn_dot_avx2(const float *q, const void *k, int n, int fmt)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), load8(k, i, fmt), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8), load8(k, i + 8, fmt), a1);
    }
    for (; i + 8 <= n; i += 8)
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), load8(k, i, fmt), a0);
    float s = hsum(_mm256_add_ps(a0, a1));
    for (; i < n; i++)
        s += q[i] * load1(k, i, fmt);
    return s;
}

void cpu__attn_axpy_avx2(float *acc, float a, const void *v, int n, int fmt)
{
    __m256 va = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(va, load8(v, i, fmt), _mm256_loadu_ps(acc + i)));
    for (; i < n; i++)
        acc[i] += a * load1(v, i, fmt);
}

void cpu__attn_scale_avx2(float *acc, float a, int n)
{
    __m256 va = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(acc + i, _mm256_mul_ps(va, _mm256_loadu_ps(acc + i)));
    for (; i < n; i++)
        acc[i] *= a;
}

void cpu__attn_to_f32_avx2(float *dst, const void *src, int rows, int n, int fmt)
{
    const size_t rb = attn_row_bytes(fmt, n);
    if (fmt == ATTN_F32) {
        memcpy(dst, src, (size_t)rows * rb);
        return;
    }
    for (int r = 0; r < rows; r++) {
        const char *row = (const char *)src + (size_t)r * rb;
        float *d = dst + (size_t)r * (size_t)n;
        int i = 0;
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(d + i, load8(row, i, fmt));
        for (; i < n; i++)
            d[i] = load1(row, i, fmt);
    }
}

/* e^x for x <= 0 (the argument is always z - max); below -87 it is 0.
 * cpu_exp256's p, but 2^k as one factor: k >= -126 here, so 2^k is a
 * normal float and p * 2^k rounds once, as p * 2^(k/2) * 2^(k - k/2) does
 * (its first product is exact): the same bits with fewer steps. */
static inline __m256 exp256_nonpos(__m256 x)
{
    const __m256 under = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_LT_OQ);
    __m256 k;
    const __m256 p = cpu_exp256_frac(x, &k);
    const __m256i e =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

/* exp_sub for R rows at once (w + r * ws, z + r * zs, max m[r], sum to
 * sum[r]): the rows' exponentials are independent chains, interleaved so
 * that one row's latency hides behind the others'. Each row's values and
 * sum are those of the one-row kernel. */
static inline __attribute__((always_inline)) void exp_sub_group(float *w, int64_t ws,
                                                                const float *z, int64_t zs,
                                                                const float *m, int n, float *sum,
                                                                const int R)
{
    __m256 vm[4], acc[4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        vm[r] = _mm256_set1_ps(m[r]);
        acc[r] = _mm256_setzero_ps();
    }
    int i = 0;
    for (; i + 8 <= n; i += 8) {
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const __m256 e = exp256_nonpos(_mm256_sub_ps(_mm256_loadu_ps(z + r * zs + i), vm[r]));
            acc[r] = _mm256_add_ps(acc[r], e);
            _mm256_storeu_ps(w + r * ws + i, e);
        }
    }
    if (i < n) {
        const int rem = n - i;
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            float zt[8], wt[8];
            for (int j = 0; j < 8; j++)
                zt[j] = j < rem ? z[r * zs + i + j] : -INFINITY; /* e^-inf = 0: adds nothing */
            const __m256 e = exp256_nonpos(_mm256_sub_ps(_mm256_loadu_ps(zt), vm[r]));
            acc[r] = _mm256_add_ps(acc[r], e);
            _mm256_storeu_ps(wt, e);
            memcpy(w + r * ws + i, wt, (size_t)rem * sizeof(float));
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
        sum[r] = hsum(acc[r]);
}

float cpu__attn_exp_sub_avx2(float *w, const float *z, float m, int n)
{
    float s;
    exp_sub_group(w, 0, z, 0, &m, n, &s, 1);
    return s;
}

void cpu__attn_exp_sub_rows_avx2(float *w, int64_t ws, const float *z, int64_t zs, int nr,
                                 const float *m, int n, float *sum)
{
    int r0 = 0;
    for (; r0 + 4 <= nr; r0 += 4)
        exp_sub_group(w + r0 * ws, ws, z + r0 * zs, zs, m + r0, n, sum + r0, 4);
    if (nr - r0 == 3)
        exp_sub_group(w + r0 * ws, ws, z + r0 * zs, zs, m + r0, n, sum + r0, 3);
    else if (nr - r0 == 2)
        exp_sub_group(w + r0 * ws, ws, z + r0 * zs, zs, m + r0, n, sum + r0, 2);
    else if (nr - r0 == 1)
        exp_sub_group(w + r0 * ws, ws, z + r0 * zs, zs, m + r0, n, sum + r0, 1);
}

/* lanes 0..n-1 set, for a masked load of a row's last n % 8 values */
static inline __m256i tail_mask(int n)
{
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), idx);
}

/* Values nf .. n-1 of an f16 row (0 < n - nf < 8; a Q8_0 row is a whole
 * number of 32-value blocks), zeros in the lanes after them: what the masked
 * load of the f32 row gives. */
static inline __m256 load_tail_f16(const void *p, int nf, int n)
{
    uint16_t h[8] = {0};
    memcpy(h, (const uint16_t *)p + nf, (size_t)(n - nf) * sizeof h[0]);
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h));
}

/* the largest of four lanes */
static inline float hmax4(__m128 m)
{
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

/* Scores of a tile of f32 key rows, eight keys at a time: one accumulator
 * per key over the 8-value chunks of the row (a chunk of q is loaded once
 * for the eight keys), then one transposing reduction instead of eight
 * horizontal sums. */
float cpu__attn_scores_avx2(float *z, const float *q, const float *kf, int nt, int n, float scale)
{
    const int nf = n & ~7;
    const __m256i tm = tail_mask(n & 7);
    const __m256 vs = _mm256_set1_ps(scale);
    __m256 mx = _mm256_set1_ps(-INFINITY); /* a short group's repeated key is a real score */
    for (int i0 = 0; i0 < nt; i0 += 8) {
        const int kn = nt - i0 < 8 ? nt - i0 : 8;
        /* a short last group repeats its last key; those lanes are dropped */
        const float *kr[8];
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++)
            kr[k] = kf + (size_t)(i0 + (k < kn ? k : kn - 1)) * (size_t)n;
        __m256 a[8];
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++)
            a[k] = _mm256_setzero_ps();
        for (int j = 0; j < nf; j += 8) {
            __m256 qv = _mm256_loadu_ps(q + j);
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++)
                a[k] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kr[k] + j), a[k]);
        }
        if (nf < n) {
            __m256 qv = _mm256_maskload_ps(q + nf, tm);
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++)
                a[k] = _mm256_fmadd_ps(qv, _mm256_maskload_ps(kr[k] + nf, tm), a[k]);
        }
        __m256 s = _mm256_mul_ps(cpu_sum8(a), vs);
        mx = _mm256_max_ps(mx, s);
        if (kn == 8) {
            _mm256_storeu_ps(z + i0, s);
        } else {
            float t[8];
            _mm256_storeu_ps(t, s);
            memcpy(z + i0, t, (size_t)kn * sizeof(float));
        }
    }
    return hmax4(_mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1)));
}

/* acc += sum_i w[i] v_i over a tile of f32 value rows with the row's
 * accumulators held in registers, 64 values at a time, keys innermost:
 * eight independent FMA chains instead of one chain per 8 values. Each
 * value is still the keys' FMAs in key order. */
void cpu__attn_accum_avx2(float *acc, const float *w, const float *vf, int nt, int n)
{
    const int nf = n & ~7;
    int j = 0;
    for (; j + 64 <= nf; j += 64) {
        __m256 a[8];
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++)
            a[c] = _mm256_loadu_ps(acc + j + 8 * c);
        for (int i = 0; i < nt; i++) {
            const __m256 wi = _mm256_broadcast_ss(w + i);
            const float *v = vf + (size_t)i * (size_t)n;
#pragma GCC unroll 8
            for (int c = 0; c < 8; c++)
                a[c] = _mm256_fmadd_ps(wi, _mm256_loadu_ps(v + j + 8 * c), a[c]);
        }
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++)
            _mm256_storeu_ps(acc + j + 8 * c, a[c]);
    }
    for (; j < n; j += 8) { /* the rest, 8 values at a time (the last one masked) */
        const __m256i m = tail_mask(n - j < 8 ? n - j : 8);
        __m256 a = _mm256_maskload_ps(acc + j, m);
        for (int i = 0; i < nt; i++)
            a = _mm256_fmadd_ps(_mm256_broadcast_ss(w + i),
                                _mm256_maskload_ps(vf + (size_t)i * (size_t)n + j, m), a);
        _mm256_maskstore_ps(acc + j, m, a);
    }
}

/* Four keys' sums at once with cpu_sum8's tree: each key's lanes are
 * added ((0+1)+(2+3)) + ((4+5)+(6+7)), as cpu_sum8 adds them for its keys
 * 0..3, so a score is the same bits in either. */
static inline __m128 sum4(const __m256 *a)
{
    const __m256 q = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    return _mm_add_ps(_mm256_castps256_ps128(q), _mm256_extractf128_ps(q, 1));
}

/* The in-place kernels (attention.h) on AVX2. The query rows of a kv head
 * are taken R = 3 (or fewer) at a time so that each 8-value chunk of a K or
 * V row is converted once for the R rows, not once per row: the scores
 * four keys at a time (3 x 4 accumulators), the weighted values 32 values
 * at a time (3 x 4 accumulators and the R keys' weights). For every row,
 * key and value these are the FMAs of the f32 kernels above in the
 * same order, and the scores' reduction is cpu_sum8's tree (sum4), so the
 * results are the f32 kernels' bits. */
static inline __attribute__((always_inline)) void
scores_group(float *z, int64_t zs, const float *const *q, const void *const *kp, int nt, int n,
             float scale, float *mx, const int R, const int fmt, const int tail)
{
    const int nf = n & ~7;
    const __m256i tm = tail_mask(n & 7);
    const __m128 vs = _mm_set1_ps(scale);
    __m128 m[3];
#pragma GCC unroll 3
    for (int r = 0; r < R; r++)
        m[r] = _mm_set1_ps(-INFINITY);
    for (int i0 = 0; i0 < nt; i0 += 4) {
        const int kn = nt - i0 < 4 ? nt - i0 : 4;
        const void *kr[4]; /* a short last group repeats its last key; dropped */
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++)
            kr[k] = kp[i0 + (k < kn ? k : kn - 1)];
        __m256 a[3][4];
#pragma GCC unroll 3
        for (int r = 0; r < R; r++)
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++)
                a[r][k] = _mm256_setzero_ps();
        for (int j = 0; j < nf; j += 8) {
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                const __m256 kv = load8(kr[k], j, fmt);
#pragma GCC unroll 3
                for (int r = 0; r < R; r++)
                    a[r][k] = _mm256_fmadd_ps(_mm256_loadu_ps(q[r] + j), kv, a[r][k]);
            }
        }
        if (tail && nf < n) {
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                const __m256 kv = load_tail_f16(kr[k], nf, n);
#pragma GCC unroll 3
                for (int r = 0; r < R; r++)
                    a[r][k] = _mm256_fmadd_ps(_mm256_maskload_ps(q[r] + nf, tm), kv, a[r][k]);
            }
        }
#pragma GCC unroll 3
        for (int r = 0; r < R; r++) {
            const __m128 s = _mm_mul_ps(sum4(a[r]), vs);
            m[r] = _mm_max_ps(m[r], s);
            if (kn == 4) {
                _mm_storeu_ps(z + r * zs + i0, s);
            } else {
                float t[4];
                _mm_storeu_ps(t, s);
                memcpy(z + r * zs + i0, t, (size_t)kn * sizeof(float));
            }
        }
    }
#pragma GCC unroll 3
    for (int r = 0; r < R; r++)
        mx[r] = hmax4(m[r]);
}

static inline __attribute__((always_inline)) void accum_group(float *const *acc, const float *w,
                                                              int64_t ws, const void *const *vp,
                                                              int nt, int n, const int R,
                                                              const int fmt, const int tail)
{
    const int nf = n & ~7;
    int j = 0;
    for (; j + 32 <= nf; j += 32) {
        __m256 a[3][4];
#pragma GCC unroll 3
        for (int r = 0; r < R; r++)
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++)
                a[r][c] = _mm256_loadu_ps(acc[r] + j + 8 * c);
        for (int i = 0; i < nt; i++) {
            __m256 wi[3];
#pragma GCC unroll 3
            for (int r = 0; r < R; r++)
                wi[r] = _mm256_broadcast_ss(w + r * ws + i);
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) {
                const __m256 kv = load8(vp[i], j + 8 * c, fmt);
#pragma GCC unroll 3
                for (int r = 0; r < R; r++)
                    a[r][c] = _mm256_fmadd_ps(wi[r], kv, a[r][c]);
            }
        }
#pragma GCC unroll 3
        for (int r = 0; r < R; r++)
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++)
                _mm256_storeu_ps(acc[r] + j + 8 * c, a[r][c]);
    }
    for (; j < n; j += 8) { /* the rest, 8 values at a time (the last one masked) */
        const __m256i msk = tail_mask(n - j < 8 ? n - j : 8);
        __m256 a[3];
#pragma GCC unroll 3
        for (int r = 0; r < R; r++)
            a[r] = _mm256_maskload_ps(acc[r] + j, msk);
        for (int i = 0; i < nt; i++) {
            const __m256 kv =
                !tail || j + 8 <= n ? load8(vp[i], j, fmt) : load_tail_f16(vp[i], j, n);
#pragma GCC unroll 3
            for (int r = 0; r < R; r++)
                a[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(w + r * ws + i), kv, a[r]);
        }
#pragma GCC unroll 3
        for (int r = 0; r < R; r++)
            _mm256_maskstore_ps(acc[r] + j, msk, a[r]);
    }
}

/* R rows of a kernel for fmt, with or without code for a row's last n % 8
 * values (a Q8_0 row has none; without it the accumulators stay in
 * registers) */
#define ATTN_AVX2_GROUP(call, R)                                                                   \
    do {                                                                                           \
        if (fmt == ATTN_Q8_0)                                                                      \
            call(R, ATTN_Q8_0, 0);                                                                 \
        else if (n & 7)                                                                            \
            call(R, ATTN_F16, 1);                                                                  \
        else                                                                                       \
            call(R, ATTN_F16, 0);                                                                  \
    } while (0)

/* the next min(3, left) rows */
#define ATTN_AVX2_ROWS(call, left)                                                                 \
    do {                                                                                           \
        if ((left) >= 3)                                                                           \
            ATTN_AVX2_GROUP(call, 3);                                                              \
        else if ((left) == 2)                                                                      \
            ATTN_AVX2_GROUP(call, 2);                                                              \
        else                                                                                       \
            ATTN_AVX2_GROUP(call, 1);                                                              \
    } while (0)

void cpu__attn_scores_kv_avx2(float *z, int64_t zs, int nr, const float *const *q,
                              const void *const *k, int nt, int n, float scale, float *mx, int fmt)
{
    for (int r0 = 0; r0 < nr; r0 += 3) {
#define SCORES(R, F, T) scores_group(z + r0 * zs, zs, q + r0, k, nt, n, scale, mx + r0, R, F, T)
        ATTN_AVX2_ROWS(SCORES, nr - r0);
#undef SCORES
    }
}

void cpu__attn_accum_kv_avx2(float *const *acc, int nr, const float *w, int64_t ws,
                             const void *const *v, int nt, int n, int fmt)
{
    for (int r0 = 0; r0 < nr; r0 += 3) {
#define ACCUM(R, F, T) accum_group(acc + r0, w + r0 * ws, ws, v, nt, n, R, F, T)
        ATTN_AVX2_ROWS(ACCUM, nr - r0);
#undef ACCUM
    }
}

/* The block kernels (attention.h: keys_t, scores_t, max_kv). A chunk of 8
 * keys transposed: for each 16 values d0 .. d0 + 15 of the rows, eight
 * 32-byte lines, line m holding value d0 + m of the 8 keys then value
 * d0 + 8 + m of the 8 keys (what an 8 x 8 transpose of 16-bit values in
 * each 128-bit lane gives). */
static inline const uint16_t *chunk_at(const uint16_t *kt, int i, int j)
{
    /* value j + 8 i of the chunk's 8 keys (j < 8) */
    return kt + (i >> 1) * 128 + j * 16 + (i & 1) * 8;
}

void cpu__attn_keys_t_avx2(uint16_t *kt, const void *const *k, int nk, int n)
{
    for (int c = 0; c * 8 < nk; c++) {
        const uint16_t *r[8]; /* a short last chunk repeats its last key */
#pragma GCC unroll 8
        for (int l = 0; l < 8; l++)
            r[l] = k[c * 8 + l < nk ? c * 8 + l : nk - 1];
        uint16_t *o = kt + (size_t)c * 8 * (size_t)n;
        for (int d0 = 0; d0 < n; d0 += 16) {
            __m256i a[8], b[8];
#pragma GCC unroll 8
            for (int l = 0; l < 8; l++)
                a[l] = _mm256_loadu_si256((const __m256i *)(r[l] + d0));
#pragma GCC unroll 4
            for (int p = 0; p < 4; p++) { /* keys 2p, 2p + 1 value by value */
                b[2 * p] = _mm256_unpacklo_epi16(a[2 * p], a[2 * p + 1]);
                b[2 * p + 1] = _mm256_unpackhi_epi16(a[2 * p], a[2 * p + 1]);
            }
            /* keys 0-3 (c0-c3) and 4-7 (c4-c7), values 2m and 2m + 1 */
            const __m256i c0 = _mm256_unpacklo_epi32(b[0], b[2]),
                          c1 = _mm256_unpackhi_epi32(b[0], b[2]),
                          c2 = _mm256_unpacklo_epi32(b[1], b[3]),
                          c3 = _mm256_unpackhi_epi32(b[1], b[3]),
                          c4 = _mm256_unpacklo_epi32(b[4], b[6]),
                          c5 = _mm256_unpackhi_epi32(b[4], b[6]),
                          c6 = _mm256_unpacklo_epi32(b[5], b[7]),
                          c7 = _mm256_unpackhi_epi32(b[5], b[7]);
            const __m256i e[8] = {_mm256_unpacklo_epi64(c0, c4), _mm256_unpackhi_epi64(c0, c4),
                                  _mm256_unpacklo_epi64(c1, c5), _mm256_unpackhi_epi64(c1, c5),
                                  _mm256_unpacklo_epi64(c2, c6), _mm256_unpackhi_epi64(c2, c6),
                                  _mm256_unpacklo_epi64(c3, c7), _mm256_unpackhi_epi64(c3, c7)};
#pragma GCC unroll 8
            for (int m = 0; m < 8; m++)
                _mm256_storeu_si256((__m256i *)(o + d0 * 8 + m * 16), e[m]);
        }
    }
}

/* The tiles' loops fully unrolled, except under AddressSanitizer (the
 * sanitizer and fuzz builds), where the unrolled tiles' checked loads take
 * clang minutes to compile: the same operations in the same order, so the
 * same bits, rolled up. */
#if defined(__SANITIZE_ADDRESS__)
#define SCORES_T_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SCORES_T_ASAN 1
#endif
#endif
#ifdef SCORES_T_ASAN
#define SCORES_T_UNROLL _Pragma("GCC unroll 1")
#else
#define SCORES_T_UNROLL _Pragma("GCC unroll 16")
#endif

/* R rows x C chunks. Lane l of chain j of (row, chunk) is lane j of
 * scores_group's accumulator of the chunk's key l: the FMAs of values j,
 * j + 8, ... in order from zero; the eight chains are then added with
 * sum4's tree and scaled, so each score is scores_kv's bits. */
static inline __attribute__((always_inline)) void
scores_t_tile(float *z, int64_t zs, const float *const *q, const uint16_t *kt, int n, float scale,
              const int R, const int C)
{
    __m256 t[8][3][3];
    SCORES_T_UNROLL
    for (int j = 0; j < 8; j++) {
        __m256 a[3][3];
#pragma GCC unroll 3
        for (int r = 0; r < R; r++)
#pragma GCC unroll 3
            for (int c = 0; c < C; c++)
                a[r][c] = _mm256_setzero_ps();
        SCORES_T_UNROLL
        for (int i = 0; i < n / 8; i++) {
            __m256 kv[3];
#pragma GCC unroll 3
            for (int c = 0; c < C; c++)
                kv[c] = _mm256_cvtph_ps(
                    _mm_loadu_si128((const __m128i *)chunk_at(kt + (size_t)c * 8 * n, i, j)));
#pragma GCC unroll 3
            for (int r = 0; r < R; r++) {
                const __m256 b = _mm256_broadcast_ss(q[r] + j + 8 * i);
#pragma GCC unroll 3
                for (int c = 0; c < C; c++)
                    a[r][c] = _mm256_fmadd_ps(b, kv[c], a[r][c]);
            }
        }
#pragma GCC unroll 3
        for (int r = 0; r < R; r++)
#pragma GCC unroll 3
            for (int c = 0; c < C; c++)
                t[j][r][c] = a[r][c];
    }
    const __m256 vs = _mm256_set1_ps(scale);
#pragma GCC unroll 3
    for (int r = 0; r < R; r++)
#pragma GCC unroll 3
        for (int c = 0; c < C; c++) {
            const __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(t[0][r][c], t[1][r][c]),
                                                         _mm256_add_ps(t[2][r][c], t[3][r][c])),
                                           _mm256_add_ps(_mm256_add_ps(t[4][r][c], t[5][r][c]),
                                                         _mm256_add_ps(t[6][r][c], t[7][r][c])));
            _mm256_storeu_ps(z + r * zs + c * 8, _mm256_mul_ps(s, vs));
        }
}

/* R rows x C chunks; n = 64 (SmolLM2's heads) with its loop unrolled */
#define SCORES_T_TILE(R, C)                                                                        \
    (n == 64 ? scores_t_tile(zr, zs, qr, ktc, 64, scale, R, C)                                     \
             : scores_t_tile(zr, zs, qr, ktc, n, scale, R, C))
/* the next min(3, left) chunks of R rows */
#define SCORES_T_CHUNKS(R, left)                                                                   \
    do {                                                                                           \
        if ((left) >= 3)                                                                           \
            SCORES_T_TILE(R, 3);                                                                   \
        else if ((left) == 2)                                                                      \
            SCORES_T_TILE(R, 2);                                                                   \
        else                                                                                       \
            SCORES_T_TILE(R, 1);                                                                   \
    } while (0)

void cpu__attn_scores_t_avx2(float *z, int64_t zs, int nr, const float *const *q,
                             const uint16_t *kt, int nc, int n, float scale)
{
    for (int r0 = 0; r0 < nr; r0 += 3) {
        const float *const *qr = q + r0;
        for (int c0 = 0; c0 < nc; c0 += 3) {
            float *zr = z + r0 * zs + c0 * 8;
            const uint16_t *ktc = kt + (size_t)c0 * 8 * (size_t)n;
            if (nr - r0 >= 3)
                SCORES_T_CHUNKS(3, nc - c0);
            else if (nr - r0 == 2)
                SCORES_T_CHUNKS(2, nc - c0);
            else
                SCORES_T_CHUNKS(1, nc - c0);
        }
    }
}
#undef SCORES_T_CHUNKS
#undef SCORES_T_TILE

/* The largest of each row's nt scores as scores_group finds it: four keys
 * at a time lane by lane (a short last group repeating its last key), then
 * hmax4 */
void cpu__attn_max_kv_avx2(float *mx, const float *z, int64_t zs, int nr, int nt)
{
    for (int r = 0; r < nr; r++) {
        const float *zr = z + r * zs;
        __m128 m = _mm_set1_ps(-INFINITY);
        int i0 = 0;
        for (; i0 + 4 <= nt; i0 += 4)
            m = _mm_max_ps(m, _mm_loadu_ps(zr + i0));
        if (i0 < nt) {
            float t[4];
            for (int k = 0; k < 4; k++)
                t[k] = zr[i0 + k < nt ? i0 + k : nt - 1];
            m = _mm_max_ps(m, _mm_loadu_ps(t));
        }
        mx[r] = hmax4(m);
    }
}
