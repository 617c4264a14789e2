/* attention_avx2.c: F16C + FMA row kernels for attention.c (attention.h). */
#include <immintrin.h>

#include "attention.h"

static inline float hsum(__m256 v)
{
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}

static inline __m256 load8(const void *p, int i, int f16)
{
    if (f16)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)));
    return _mm256_loadu_ps((const float *)p + i);
}

static inline float load1(const void *p, int i, int f16)
{
    if (f16)
        return _cvtsh_ss(((const uint16_t *)p)[i]);
    return ((const float *)p)[i];
}

float cpu__attn_dot_avx2(const float *q, const void *k, int n, int f16)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), load8(k, i, f16), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8), load8(k, i + 8, f16), a1);
    }
    for (; i + 8 <= n; i += 8)
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), load8(k, i, f16), a0);
    float s = hsum(_mm256_add_ps(a0, a1));
    for (; i < n; i++)
        s += q[i] * load1(k, i, f16);
    return s;
}

void cpu__attn_axpy_avx2(float *acc, float a, const void *v, int n, int f16)
{
    __m256 va = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(va, load8(v, i, f16), _mm256_loadu_ps(acc + i)));
    for (; i < n; i++)
        acc[i] += a * load1(v, i, f16);
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
