/* ops_avx512.c: AVX-512 forms of element-wise kernels (ops.h). */
#include <immintrin.h>

#include "ops.h"
#include "simd_avx512.h"

void cpu__swiglu_avx512(float *hb, const float *hb2, int64_t n)
{
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t i = 0; i < n; i += 16) {
        /* the last 1..15 values masked, in the same vector arithmetic */
        const __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1u);
        const __m512 g = _mm512_maskz_loadu_ps(m, hb + i);
        const __m512 e = cpu_exp512(_mm512_sub_ps(_mm512_setzero_ps(), g));
        const __m512 s = _mm512_div_ps(g, _mm512_add_ps(one, e));
        _mm512_mask_storeu_ps(hb + i, m, _mm512_mul_ps(s, _mm512_maskz_loadu_ps(m, hb2 + i)));
    }
}
