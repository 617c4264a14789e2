/* simd_avx2.h: inline AVX2 + FMA helpers shared by the CPU kernels. Include
 * only from files built for AVX2 (*_avx2.c, *_avx512.c). */
#ifndef STREAMSINK_CPU_SIMD_AVX2_H
#define STREAMSINK_CPU_SIMD_AVX2_H

#include <immintrin.h>

/* e^x = p * 2^k for x clamped to [-87, 88]: x = k ln2 + r with |r| <= ln2/2
 * (Cody-Waite, two steps), p = e^r by a degree-6 Taylor polynomial
 * (remainder < 2e-7 relative); returns p, k (integral) in *k. */
static inline __m256 cpu_exp256_frac(__m256 x, __m256 *k)
{
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    *k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(*k, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(*k, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.0f / 720);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    return _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
}

/* e^x for x in [-87, 88] (clamped there): cpu_exp256_frac's p times 2^k,
 * built in the exponent field as two factors 2^(k/2) so that k = 128 (x
 * near 88.7) cannot overflow it. Each factor is an exact power of two, so
 * the result rounds once, as with one factor. */
static inline __m256 cpu_exp256(__m256 x)
{
    __m256 k;
    const __m256 p = cpu_exp256_frac(x, &k);
    __m256i ki = _mm256_cvtps_epi32(k);
    __m256i k1 = _mm256_srai_epi32(ki, 1), k2 = _mm256_sub_epi32(ki, k1);
    __m256 e1 =
        _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k1, _mm256_set1_epi32(127)), 23));
    __m256 e2 =
        _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k2, _mm256_set1_epi32(127)), 23));
    return _mm256_mul_ps(_mm256_mul_ps(p, e1), e2);
}

/* The largest |x| over the 32 floats of v[0..3], a NaN value ignored as
 * fmaxf ignores it (the block scale of quant.c's Q8 quantizers). */
static inline float cpu_amax32(const __m256 v[4])
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps();
    for (int j = 0; j < 4; j++) /* a NaN operand loses: MAXPS returns the second */
        m = _mm256_max_ps(_mm256_andnot_ps(sign, v[j]), m);
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

/* The 32 int32 of q[0..3], each within int8, stored as 32 int8 in order. */
static inline void cpu_store_i8x32(void *dst, const __m256i q[4])
{
    /* packs work within 128-bit lanes; the permute puts the dwords back in order */
    const __m256i p =
        _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    _mm256_storeu_si256((__m256i *)dst,
                        _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}

/* The sums of 8 accumulators in one vector, lane i = the sum of a[i]'s lanes,
 * always by the same tree: ((l0+l1)+(l2+l3)) + ((l4+l5)+(l6+l7)). Lane i
 * depends on a[i] alone, so a key's score does not depend on the other keys
 * of its group (or on how many there are). */
static inline __m256 cpu_sum8(const __m256 *a)
{
    __m256 h01 = _mm256_hadd_ps(a[0], a[1]), h23 = _mm256_hadd_ps(a[2], a[3]);
    __m256 h45 = _mm256_hadd_ps(a[4], a[5]), h67 = _mm256_hadd_ps(a[6], a[7]);
    __m256 q0 = _mm256_hadd_ps(h01, h23), q1 = _mm256_hadd_ps(h45, h67);
    /* q0 = [k0..k3 low halves | k0..k3 high halves], q1 likewise for k4..k7 */
    return _mm256_add_ps(_mm256_permute2f128_ps(q0, q1, 0x20),
                         _mm256_permute2f128_ps(q0, q1, 0x31));
}

#endif
