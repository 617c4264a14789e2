/*
 * matmul_kquant.h: the SIMD kernels for Q5_0 and the K-quants (Q3_K, Q4_K,
 * Q5_K, Q6_K), what matmul.c dispatches to and tests/unit/test_matmul_kquant.c
 * checks. Internal to engine/cpu/. Same contract as cpu_matmul_rows
 * (matmul.h); the activation rows are the Q8 blocks every quantized type
 * takes (struct block_q8_act, one per 32 values), and each 32-value weight
 * group (quant.h) meets exactly one of them.
 *
 * The group decoders below are shared by the AVX2 and AVX-512 files (both are
 * compiled with AVX2 enabled; nothing here may be included elsewhere). A
 * decoder turns group g of a weight row into 32 bytes of small integers q
 * (signed for Q5_0, Q6_K, Q3_K; unsigned for Q4_K, Q5_K), the float scale of
 * each 8-lane int32 partial sum (lanes 0-3 hold values 0-15, lanes 4-7 values
 * 16-31, as VPMADDUBSW + VPMADDWD leave them), and the float min mw.
 */
#ifndef SS_CPU_MATMUL_KQUANT_H
#define SS_CPU_MATMUL_KQUANT_H

#include <stdint.h>

#include "../quant.h"

/* AVX2 + FMA + F16C. t: QTYPE_Q5_0 or a K-quant. */
void cpu__matmul_rows_kquant_avx2(enum qtype t, const void *restrict w, int64_t k, int64_t n0,
                                  int64_t n1, const void *restrict act, int64_t T,
                                  float *restrict y, int64_t ldy);

/* AVX-512 F + BW + VL + DQ; vnni != 0 uses VPDPBUSD (needs the CPUID bit). */
void cpu__matmul_rows_kquant_avx512(enum qtype t, const void *restrict w, int64_t k, int64_t n0,
                                    int64_t n1, const void *restrict act, int64_t T,
                                    float *restrict y, int64_t ldy, int vnni);

#ifdef SS_KQUANT_DECODERS

#include <immintrin.h>
#include <string.h>

#define KQ_INLINE static inline __attribute__((always_inline))

/* One decoded group. */
struct kq_group {
    __m256i q;    /* 32 values, in order */
    __m256 scale; /* float scale per int32 lane of the VPMADDWD partial sums */
    float mw;     /* value = scale * q - mw */
};

/* Bytes of the row's 32-value groups: a Q5_0 block is one group, a K-quant
 * super-block eight. */
KQ_INLINE int kq_groups_per_block(const enum qtype t)
{
    return t == QTYPE_Q5_0 ? 1 : QK_K / QK;
}

KQ_INLINE size_t kq_block_bytes(const enum qtype t)
{
    switch (t) {
    case QTYPE_Q5_0:
        return sizeof(struct block_q5_0);
    case QTYPE_Q3_K:
        return sizeof(struct block_q3_k);
    case QTYPE_Q4_K:
        return sizeof(struct block_q4_k);
    case QTYPE_Q5_K:
        return sizeof(struct block_q5_k);
    default:
        return sizeof(struct block_q6_k);
    }
}

/* 1 when the decoded values are signed (the kernel moves their sign onto the
 * activations, since VPMADDUBSW's first operand is unsigned). */
KQ_INLINE int kq_signed(const enum qtype t)
{
    return t == QTYPE_Q5_0 || t == QTYPE_Q6_K || t == QTYPE_Q3_K;
}

/* 1 when the type has a min (value = scale * q - mw). */
KQ_INLINE int kq_has_min(const enum qtype t)
{
    return t == QTYPE_Q4_K || t == QTYPE_Q5_K;
}

KQ_INLINE __m256i kq_load32(const uint8_t *p)
{
    return _mm256_loadu_si256((const __m256i *)p);
}

/* Bytes >> n (n < 8) with the bits of the neighbouring byte masked off by the
 * caller. */
KQ_INLINE __m256i kq_srl_bytes(__m256i v, int n)
{
    return _mm256_srl_epi16(v, _mm_cvtsi32_si128(n));
}

/* 0xff in byte l where bit g of byte l of bits is set, else 0. */
KQ_INLINE __m256i kq_bit_set(__m256i bits, int g)
{
    const __m256i m = _mm256_set1_epi8((char)(1 << g));
    return _mm256_cmpeq_epi8(_mm256_and_si256(bits, m), m);
}

/* The 6-bit scale and min of sub-block j of Q4_K/Q5_K (layout in quant.h). */
KQ_INLINE void kq_scale_min_k4(const uint8_t *s, int j, int *sc, int *m)
{
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* The signed 6-bit scale of sub-block i of Q3_K. */
KQ_INLINE int kq_scale_q3_k(const uint8_t *s, int i)
{
    int lo = i < 8 ? s[i] & 15 : s[i - 8] >> 4;
    int hi = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
    return (lo | (hi << 4)) - 32;
}

KQ_INLINE __m256 kq_scale2(float lo, float hi)
{
    return _mm256_set_m128(_mm_set1_ps(hi), _mm_set1_ps(lo));
}

/* Group g of the block at blk. */
KQ_INLINE void kq_decode(const enum qtype t, const char *blk, int g, struct kq_group *out)
{
    const __m256i low4 = _mm256_set1_epi8(0x0f);

    out->mw = 0.0f;
    if (t == QTYPE_Q5_0) {
        const struct block_q5_0 *b = (const struct block_q5_0 *)blk;
        uint32_t qh;
        memcpy(&qh, b->qh, 4);
        /* nibbles: low ones in bytes 0-15, high ones in 16-31 */
        __m256i nib = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)b->qs));
        nib = _mm256_and_si256(_mm256_srlv_epi32(nib, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4)),
                               low4);
        /* byte j takes byte j / 8 of qh, then tests bit j % 8 */
        const __m256i pick = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2,
                                              2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
        const __m256i bit = _mm256_set1_epi64x(0x8040201008040201ll);
        __m256i h = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), pick);
        h = _mm256_cmpeq_epi8(_mm256_and_si256(h, bit), bit);
        /* nib - 16 where the fifth bit is clear: OR in 0xf0 there */
        out->q = _mm256_or_si256(nib, _mm256_andnot_si256(h, _mm256_set1_epi8((char)0xf0)));
        out->scale = _mm256_set1_ps(_cvtsh_ss(b->d));
        return;
    }
    if (t == QTYPE_Q4_K || t == QTYPE_Q5_K) {
        const uint8_t *scales, *qs;
        float d, dmin;
        int sc, m;
        if (t == QTYPE_Q4_K) {
            const struct block_q4_k *b = (const struct block_q4_k *)blk;
            d = _cvtsh_ss(b->d);
            dmin = _cvtsh_ss(b->dmin);
            scales = b->scales;
            qs = b->qs;
        } else {
            const struct block_q5_k *b = (const struct block_q5_k *)blk;
            d = _cvtsh_ss(b->d);
            dmin = _cvtsh_ss(b->dmin);
            scales = b->scales;
            qs = b->qs;
        }
        kq_scale_min_k4(scales, g, &sc, &m);
        __m256i q = _mm256_and_si256(kq_srl_bytes(kq_load32(qs + 32 * (g / 2)), 4 * (g % 2)), low4);
        if (t == QTYPE_Q5_K) {
            const struct block_q5_k *b = (const struct block_q5_k *)blk;
            __m256i h = kq_bit_set(kq_load32(b->qh), g);
            q = _mm256_or_si256(q, _mm256_and_si256(h, _mm256_set1_epi8(0x10)));
        }
        out->q = q;
        out->scale = _mm256_set1_ps(d * (float)sc);
        out->mw = dmin * (float)m;
        return;
    }
    if (t == QTYPE_Q6_K) {
        const struct block_q6_k *b = (const struct block_q6_k *)blk;
        const int h = g / 4, i = g % 4;
        __m256i lo = kq_srl_bytes(kq_load32(b->ql + 64 * h + 32 * (i % 2)), 4 * (i / 2));
        __m256i hi = kq_srl_bytes(kq_load32(b->qh + 32 * h), 2 * i);
        hi = _mm256_slli_epi16(_mm256_and_si256(hi, _mm256_set1_epi8(3)), 4);
        out->q =
            _mm256_sub_epi8(_mm256_or_si256(_mm256_and_si256(lo, low4), hi), _mm256_set1_epi8(32));
        float d = _cvtsh_ss(b->d);
        out->scale = kq_scale2(d * (float)b->scales[2 * g], d * (float)b->scales[2 * g + 1]);
        return;
    }
    /* Q3_K */
    const struct block_q3_k *b = (const struct block_q3_k *)blk;
    const int h = g / 4, i = g % 4;
    __m256i lo =
        _mm256_and_si256(kq_srl_bytes(kq_load32(b->qs + 32 * h), 2 * i), _mm256_set1_epi8(3));
    /* minus 4 where the high bit is clear */
    __m256i hb = kq_bit_set(kq_load32(b->hmask), g);
    out->q = _mm256_sub_epi8(lo, _mm256_andnot_si256(hb, _mm256_set1_epi8(4)));
    float d = _cvtsh_ss(b->d);
    out->scale = kq_scale2(d * (float)kq_scale_q3_k(b->scales, 2 * g),
                           d * (float)kq_scale_q3_k(b->scales, 2 * g + 1));
}

#endif /* SS_KQUANT_DECODERS */

#endif
