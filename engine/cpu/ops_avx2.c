/* ops_avx2.c: AVX2 + FMA + F16C element-wise kernels (ops.h). */
#include <immintrin.h>
#include <math.h>

#include "ops.h"
#include "simd_avx2.h"

#include "../quant.h"
#include "../rope.h"

void cpu__swiglu_avx2(float *hb, const float *hb2, int64_t n)
{
    const __m256 one = _mm256_set1_ps(1.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 g = _mm256_loadu_ps(hb + i);
        __m256 e = cpu_exp256(_mm256_sub_ps(_mm256_setzero_ps(), g));
        __m256 s = _mm256_div_ps(g, _mm256_add_ps(one, e));
        _mm256_storeu_ps(hb + i, _mm256_mul_ps(s, _mm256_loadu_ps(hb2 + i)));
    }
    if (i < n) { /* the last 1..7 values in the same vector arithmetic: a value's result
                  * does not depend on where a span of them starts or ends */
        const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - i)),
                                             _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        __m256 g = _mm256_maskload_ps(hb + i, m);
        __m256 e = cpu_exp256(_mm256_sub_ps(_mm256_setzero_ps(), g));
        __m256 s = _mm256_div_ps(g, _mm256_add_ps(one, e));
        _mm256_maskstore_ps(hb + i, m, _mm256_mul_ps(s, _mm256_maskload_ps(hb2 + i, m)));
    }
}

void cpu__rope_apply_avx2(float *x, int n_head, int head_dim, int rope_dim, const float *cs)
{
    for (int h = 0; h < n_head; h++) {
        float *v = x + (int64_t)h * head_dim;
        int i = 0;
        for (; i + 8 <= rope_dim; i += 8) { /* four pairs */
            const __m256 xv = _mm256_loadu_ps(v + i), t = _mm256_loadu_ps(cs + i);
            const __m256 c = _mm256_moveldup_ps(t), s = _mm256_movehdup_ps(t);
            const __m256 xs = _mm256_permute_ps(xv, 0xb1); /* each pair swapped */
            /* even lanes x0 c - x1 s, odd lanes x1 c + x0 s: rope_apply's two
             * products and one sum per value (no fused multiply-add) */
            _mm256_storeu_ps(v + i, _mm256_addsub_ps(_mm256_mul_ps(xv, c), _mm256_mul_ps(xs, s)));
        }
        if (i < rope_dim) /* the pairs after the last four: rope_apply's own loop */
            rope_apply(v + i, 1, rope_dim - i, rope_dim - i, cs + i);
    }
}

void cpu__f32_to_f16_avx2(uint16_t *dst, const float *src, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++)
        dst[i] = _cvtss_sh(src[i], _MM_FROUND_TO_NEAREST_INT);
}

void cpu__quantize_row_q8_0_avx2(void *dst, const float *src, int64_t n)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    /* roundf(y) = trunc(y + copysign(0.5 - 2^-25, y)) for every float y in
     * (-127.5, 127.5), checked exhaustively; 0.5 itself would round
     * 0.49999997 up. */
    const __m256 below_half = _mm256_set1_ps(0.49999997f);
    const __m256 lo = _mm256_set1_ps(-127.5f), hi = _mm256_set1_ps(127.5f);
    struct block_q8_0 *b = dst;
    for (int64_t i = 0; i < n / QK; i++, b++) {
        const float *x = src + i * QK;
        __m256 v[4];
        for (int j = 0; j < 4; j++)
            v[j] = _mm256_loadu_ps(x + 8 * j);
        const float d = cpu_amax32(v) / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        b->d = quant_f32_to_f16(d);
        const __m256 vid = _mm256_set1_ps(id);
        __m256i q[4];
        for (int j = 0; j < 4; j++) {
            const __m256 y = _mm256_mul_ps(v[j], vid);
            /* out of range or NaN (an infinite block: inf * 0) stores 0 */
            const __m256 ok =
                _mm256_and_ps(_mm256_cmp_ps(y, lo, _CMP_GT_OQ), _mm256_cmp_ps(y, hi, _CMP_LT_OQ));
            const __m256 r =
                _mm256_round_ps(_mm256_add_ps(y, _mm256_or_ps(below_half, _mm256_and_ps(y, sign))),
                                _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
            q[j] = _mm256_cvttps_epi32(_mm256_and_ps(r, ok));
        }
        cpu_store_i8x32(b->qs, q); /* all within +-127 */
    }
}

double cpu__sum_squares_avx2(const float *x, int64_t n)
{
    /* lanes of lo: chains 0..3, of hi: chains 4..7; each value squared in
     * double and added, as the scalar chains do (no fused multiply-add) */
    __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256d a = _mm256_cvtps_pd(_mm_loadu_ps(x + i));
        const __m256d b = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 4));
        lo = _mm256_add_pd(lo, _mm256_mul_pd(a, a));
        hi = _mm256_add_pd(hi, _mm256_mul_pd(b, b));
    }
    double s[8];
    _mm256_storeu_pd(s, lo);
    _mm256_storeu_pd(s + 4, hi);
    for (; i < n; i++)
        s[0] += (double)x[i] * x[i];
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

void cpu__scale_mul_avx2(float *o, const float *x, float s, const float *g, int64_t n)
{
    const __m256 vs = _mm256_set1_ps(s);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(o + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), vs),
                                              _mm256_loadu_ps(g + i)));
    for (; i < n; i++)
        o[i] = x[i] * s * g[i];
}

void cpu__add_avx2(float *x, const float *y, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(x + i, _mm256_add_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++)
        x[i] += y[i];
}
