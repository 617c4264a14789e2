/* ops_avx2.c: AVX2 + FMA + F16C element-wise kernels (ops.h). */
#include <immintrin.h>
#include <math.h>

#include "ops.h"
#include "simd_avx2.h"

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
    for (; i < n; i++) {
        float g = hb[i];
        hb[i] = g / (1.0f + expf(-g)) * hb2[i];
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
