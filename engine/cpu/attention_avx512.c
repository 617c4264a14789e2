/* attention_avx512.c: AVX-512 tile kernels for attention.c (attention.h):
 * the AVX2 kernels' structure with 16-value vectors. */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "attention.h"
#include "simd_avx2.h"

/* lanes 0..n-1 of 16 */
static inline __mmask16 mask16(int n)
{
    return (__mmask16)((1u << n) - 1u);
}

/* cpu_sum8 (simd_avx2.h), after folding each 16-lane accumulator into 8
 * lanes (low half + high half): lane i depends on a[i] alone. */
static inline __m256 sum8_512(const __m512 *a)
{
    __m256 f[8];
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++)
        f[k] = _mm256_add_ps(_mm512_castps512_ps256(a[k]),
                             _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a[k]), 1)));
    return cpu_sum8(f);
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
