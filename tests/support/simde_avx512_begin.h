/*
 * simde_avx512_begin.h / simde_avx512_end.h: compile an engine AVX-512 file
 * (an engine/cpu file named for AVX-512) a second time inside a test, against SIMDe's
 * portable AVX-512, so its logic is checked on machines without AVX-512.
 *
 *   #include "support/simde_avx512_begin.h"
 *   #ifdef SS_EMULATE_AVX512
 *   #define cpu__kernel_avx512 emu_kernel_avx512   (rename what the test calls)
 *   #include "engine/cpu/..._avx512.c"
 *   #endif
 *   #include "support/simde_avx512_end.h"
 *
 * SS_EMULATE_AVX512 is defined where it can be done: GCC only (it uses GCC's
 * target and optimize pragmas) and libsimde-dev installed; about 15 s of
 * compile time per file, which -DSS_NO_AVX512_EMULATION saves.
 */
#if defined(__has_include) && defined(__GNUC__) && !defined(__clang__) &&                          \
    !defined(SS_NO_AVX512_EMULATION)
#if __has_include(<simde/x86/avx512.h>) && __has_include(<simde/x86/f16c.h>)
#define SS_EMULATE_AVX512 1
#endif
#endif

#ifdef SS_EMULATE_AVX512
#include <stdint.h>
#include <string.h>
/* SIMDe runs its 256-bit halves on AVX2 (so this part needs an AVX2 CPU);
 * unoptimized and not inlined, since speed does not matter here and the
 * compile time would. */
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#pragma GCC optimize("O0")
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"
#define SIMDE_ENABLE_NATIVE_ALIASES
#define SIMDE_NO_INLINE
#include <simde/x86/avx512.h>
#include <simde/x86/f16c.h>

/* Conversions SIMDe 0.7 lacks, from its 256-bit ones. */
static inline simde__m512 emu_cvtepi32_ps(simde__m512i v)
{
    simde__m256 lo = simde_mm256_cvtepi32_ps(simde_mm512_castsi512_si256(v));
    simde__m256 hi = simde_mm256_cvtepi32_ps(simde_mm512_extracti64x4_epi64(v, 1));
    return simde_mm512_insertf32x8(simde_mm512_castps256_ps512(lo), hi, 1);
}

static inline simde__m512i emu_cvtps_epi32(simde__m512 v)
{
    simde__m256i lo = simde_mm256_cvtps_epi32(simde_mm512_castps512_ps256(v));
    simde__m256i hi = simde_mm256_cvtps_epi32(
        simde_mm256_castpd_ps(simde_mm512_extractf64x4_pd(simde_mm512_castps_pd(v), 1)));
    return simde_mm512_inserti64x4(simde_mm512_castsi256_si512(lo), hi, 1);
}

static inline simde__m512i emu_cvtepu16_epi32(simde__m256i v)
{
    simde__m256i lo = simde_mm256_cvtepu16_epi32(simde_mm256_castsi256_si128(v));
    simde__m256i hi = simde_mm256_cvtepu16_epi32(simde_mm256_extracti128_si256(v, 1));
    return simde_mm512_inserti64x4(simde_mm512_castsi256_si512(lo), hi, 1);
}

static inline simde__m512i emu_cvtepi8_epi32(simde__m128i v)
{
    simde__m256i lo = simde_mm256_cvtepi8_epi32(v);
    simde__m256i hi = simde_mm256_cvtepi8_epi32(simde_mm_srli_si128(v, 8));
    return simde_mm512_inserti64x4(simde_mm512_castsi256_si512(lo), hi, 1);
}

static inline simde__m512i emu_srai_epi32(simde__m512i v, int i)
{
    simde__m256i lo = simde_mm256_srai_epi32(simde_mm512_castsi512_si256(v), i);
    simde__m256i hi = simde_mm256_srai_epi32(simde_mm512_extracti64x4_epi64(v, 1), i);
    return simde_mm512_inserti64x4(simde_mm512_castsi256_si512(lo), hi, 1);
}

static inline simde__m512 emu_cvtph_ps(simde__m256i v)
{
    simde__m256 lo = simde_mm256_cvtph_ps(simde_mm256_castsi256_si128(v));
    simde__m256 hi = simde_mm256_cvtph_ps(simde_mm256_extracti128_si256(v, 1));
    return simde_mm512_insertf32x8(simde_mm512_castps256_ps512(lo), hi, 1);
}

/* Lane i: the 4 bytes at base + idx_i * scale. */
static inline simde__m512i emu_i32gather_epi32(simde__m512i idx, const void *base, int scale)
{
    int32_t i[16], v[16];
    simde_mm512_storeu_si512(i, idx);
    for (int l = 0; l < 16; l++)
        memcpy(&v[l], (const char *)base + (int64_t)i[l] * scale, sizeof v[l]);
    return simde_mm512_loadu_si512(v);
}

/* VPMOVDW: the low 16 bits of each int32 lane. */
static inline simde__m256i emu_cvtepi32_epi16(simde__m512i v)
{
    uint32_t a[16];
    uint16_t b[16];
    simde_mm512_storeu_si512(a, v);
    for (int l = 0; l < 16; l++)
        b[l] = (uint16_t)(a[l] & 0xffffu);
    return simde_mm256_loadu_si256(b);
}

/* Masked loads and stores touch only the lanes in the mask, as the
 * instructions do (lanes past a row group's end lie outside y). */
static inline simde__m512 emu_maskz_loadu_ps(simde__mmask16 k, const void *p)
{
    float v[16];
    for (int l = 0; l < 16; l++)
        v[l] = (k >> l) & 1 ? ((const float *)p)[l] : 0.0f;
    return simde_mm512_loadu_ps(v);
}

static inline simde__m512 emu_mask_loadu_ps(simde__m512 src, simde__mmask16 k, const void *p)
{
    float v[16];
    simde_mm512_storeu_ps(v, src);
    for (int l = 0; l < 16; l++)
        if ((k >> l) & 1)
            v[l] = ((const float *)p)[l];
    return simde_mm512_loadu_ps(v);
}

static inline void emu_mask_storeu_ps(void *p, simde__mmask16 k, simde__m512 v)
{
    float a[16];
    simde_mm512_storeu_ps(a, v);
    for (int l = 0; l < 16; l++)
        if ((k >> l) & 1)
            ((float *)p)[l] = a[l];
}

/* Masked 16-bit loads touch only the lanes in the mask (the f16 row
 * kernels read a row's last values this way). */
static inline simde__m256i emu_maskz_loadu_epi16(simde__mmask16 k, const void *p)
{
    uint16_t v[16];
    for (int l = 0; l < 16; l++)
        v[l] = (k >> l) & 1 ? ((const uint16_t *)p)[l] : 0;
    return simde_mm256_loadu_si256(v);
}

/* ... and aliases it gets wrong or leaves out */
#undef _mm512_madd_epi16
#define _mm512_madd_epi16(a, b) simde_mm512_madd_epi16(a, b)
#define __mmask64 simde__mmask64
#define _mm512_cvtepi32_ps emu_cvtepi32_ps
#define _mm512_cvtps_epi32 emu_cvtps_epi32
#define _mm512_cvtepu16_epi32 emu_cvtepu16_epi32
#define _mm512_cvtph_ps emu_cvtph_ps
#define _mm512_cvtepi8_epi32 emu_cvtepi8_epi32
#undef _mm512_i32gather_epi32 /* a macro in GCC's header without __OPTIMIZE__ */
#define _mm512_i32gather_epi32 emu_i32gather_epi32
/* more of GCC's macros without __OPTIMIZE__ (the exponential's) */
#undef _mm512_srai_epi32
#define _mm512_srai_epi32(a, i) emu_srai_epi32(a, i)
#undef _mm512_slli_epi32
#define _mm512_slli_epi32(a, i) simde_mm512_slli_epi32(a, i)
#undef _mm512_roundscale_ps
#define _mm512_roundscale_ps(a, i) simde_mm512_roundscale_ps(a, i)
#undef _mm512_cmp_ps_mask
#define _mm512_cmp_ps_mask(a, b, i) simde_mm512_cmp_ps_mask(a, b, i)
#define _mm512_cvtepi32_epi16 emu_cvtepi32_epi16
#define _mm512_maskz_loadu_ps emu_maskz_loadu_ps
#define _mm512_mask_storeu_ps emu_mask_storeu_ps
#define _mm512_mask_loadu_ps emu_mask_loadu_ps
#define _mm256_maskz_loadu_epi16 emu_maskz_loadu_epi16
/* SIMDe provides everything immintrin.h would: skip the real header (GCC's and
 * clang's include guards), whose declarations the aliases above would rename. */
#define _IMMINTRIN_H_INCLUDED
#define __IMMINTRIN_H
#endif
