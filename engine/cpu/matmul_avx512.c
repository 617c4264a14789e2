/*
 * matmul_avx512.c: AVX-512 kernels behind cpu_prepare_act and cpu_matmul_rows
 * (matmul.h). Compiled with AVX-512 F, BW, VL and DQ (plus AVX2, FMA, F16C);
 * matmul.c calls into this file only after CPUID says the CPU has them all.
 *
 * Same scheme as matmul_avx2.c (read that first): per-block exact integer dot
 * products scaled by d_w * d_a, tiles of TILE_T activation rows x TILE_N
 * weight rows, weight rows cut into L1-sized chunks. A 512-bit vector holds
 * two blocks, so the main loop takes blocks two at a time (an odd last block
 * goes alone, the upper half zero). The integer dot is VPMADDUBSW +
 * VPMADDWD. Signed weights (Q8_0, Q4_0) go in as |w| with sign(w) moved onto
 * the activation bytes (a masked subtract: AVX-512 has no VPSIGNB).
 *
 * The quantized kernels here serve CPUs with AVX-512 but without
 * AVX512-VNNI: on CPUs with VNNI, cpu_matmul_rows takes Q4_0, Q4_1 and Q8_0
 * weights to matmul_rows16_avx512.c (sixteen rows per vector, VPDPBUSD).
 * The float kernels serve both.
 */
#include "matmul_impl.h"

#include <immintrin.h>
#include <string.h>

#define TILE_T 4          /* activation rows per tile */
#define TILE_N 2          /* weight rows per tile */
#define CHUNK_BYTES 16384 /* weight bytes per cache block: half of a 32 KiB L1D */

#define INLINE static inline __attribute__((always_inline))

/* One call's operands at one tile. */
struct tile {
    const char *w;   /* first weight row of the tile */
    size_t w_stride; /* bytes between weight rows */
    const char *a;   /* first activation row of the tile */
    size_t a_stride; /* bytes between activation rows */
    int64_t k;       /* values per row */
    float *y;        /* y[t * ldy + r] for tile row t, weight row r */
    int64_t ldy;
};

INLINE __m256 fold256(__m512 v)
{
    __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    return _mm256_add_ps(_mm512_castps512_ps256(v), hi);
}

INLINE float hsum256(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Lane i of the result: the sum of the 16 lanes of v_i. */
INLINE __m128 hsum4(__m512 v0, __m512 v1, __m512 v2, __m512 v3)
{
    __m256 s01 = _mm256_hadd_ps(fold256(v0), fold256(v1));
    __m256 s = _mm256_hadd_ps(s01, _mm256_hadd_ps(fold256(v2), fold256(v3)));
    return _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
}

/* y[t * ldy + r] = lane sum of acc[t][r], plus lane t of extra[r] if given. */
INLINE void store_tile(const int nt, const int nr, __m512 acc[TILE_T][TILE_N], const __m128 *extra,
                       const struct tile *p)
{
    const __m512 z = _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int r = 0; r < nr; r++) {
        __m128 sums = hsum4(acc[0][r], nt > 1 ? acc[1][r] : z, nt > 2 ? acc[2][r] : z,
                            nt > 3 ? acc[3][r] : z);
        if (extra)
            sums = _mm_add_ps(sums, extra[r]);
        float out[4];
        _mm_storeu_ps(out, sums);
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++)
            p->y[t * p->ldy + r] = out[t];
    }
}

/* [lo | hi] halves of a 512-bit vector. */
INLINE __m512i join_i(__m256i lo, __m256i hi)
{
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

INLINE __m512 join_ps(__m256 lo, __m256 hi)
{
    return _mm512_castpd_ps(
        _mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(lo)), _mm256_castps_pd(hi), 1));
}

/* ---- activation preparation --------------------------------------------- */

/* Same arithmetic as quant_prepare_act_ref, so the bytes are identical (see
 * prepare_q8 in matmul_avx2.c). */
static void prepare_q8(const float *x, int64_t k, struct block_q8_act *out)
{
    const __m512 sign = _mm512_set1_ps(-0.0f);

    for (int64_t b = 0; b < k / QK; b++) {
        __m512 v0 = _mm512_loadu_ps(x + b * QK);
        __m512 v1 = _mm512_loadu_ps(x + b * QK + 16);
        __m512 m = _mm512_max_ps(_mm512_andnot_ps(sign, v0), _mm512_andnot_ps(sign, v1));
        __m256 m8 = _mm256_max_ps(_mm512_castps512_ps256(m),
                                  _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(m), 1)));
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps(m8, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        float d = _mm_cvtss_f32(h) / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        __m512 vid = _mm512_set1_ps(id);
        __m512i i0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, vid));
        __m512i i1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, vid));
        __m512i s16 = _mm512_add_epi32(i0, i1);
        __m256i s8 =
            _mm256_add_epi32(_mm512_castsi512_si256(s16), _mm512_extracti64x4_epi64(s16, 1));
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(1, 0, 3, 2)));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(2, 3, 0, 1)));
        _mm_storeu_si128((__m128i *)out[b].qs, _mm512_cvtsepi32_epi8(i0));
        _mm_storeu_si128((__m128i *)(out[b].qs + 16), _mm512_cvtsepi32_epi8(i1));
        const int sum = _mm_cvtsi128_si32(s4);
        out[b].d = d;
        out[b].s = d * (float)sum;
        out[b].sum = sum;
    }
}

void cpu__prepare_act_avx512(enum qtype t, const float *restrict x, int64_t k, void *restrict dst)
{
    if (t == QTYPE_Q8_0 || t == QTYPE_Q4_0 || t == QTYPE_Q4_1)
        prepare_q8(x, k, dst);
    else
        memcpy(dst, x, (size_t)k * sizeof(float));
}

/* ---- quantized weights ----------------------------------------------------- */

/* 16 bytes of packed nibbles -> 32 bytes in element order, in a 256-bit half. */
INLINE __m256i unpack_nibbles(const uint8_t *qs)
{
    __m256i both = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs));
    both = _mm256_srlv_epi32(both, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4));
    return _mm256_and_si256(both, _mm256_set1_epi8(0x0f));
}

/* Blocks b and b+1 of a weight row (b alone, upper half zero, when !two) as 64
 * bytes ready for the unsigned operand: |w| for signed types, with *neg set
 * where w < 0. *d = [d_b x 8, d_b+1 x 8]. */
INLINE __m512i load_weights2(const enum qtype type, const char *row, int64_t b, const int two,
                             __mmask64 *neg, __m512 *d)
{
    const __m256i z = _mm256_setzero_si256();
    float d0;
    float d1 = 0.0f;
    __m512i q;

    if (type == QTYPE_Q4_1) {
        const struct block_q4_1 *wb = (const struct block_q4_1 *)row + b;
        d0 = _cvtsh_ss(wb[0].d);
        if (two)
            d1 = _cvtsh_ss(wb[1].d);
        *d = join_ps(_mm256_set1_ps(d0), _mm256_set1_ps(d1));
        return join_i(unpack_nibbles(wb[0].qs), two ? unpack_nibbles(wb[1].qs) : z);
    }
    if (type == QTYPE_Q8_0) {
        const struct block_q8_0 *wb = (const struct block_q8_0 *)row + b;
        d0 = _cvtsh_ss(wb[0].d);
        if (two)
            d1 = _cvtsh_ss(wb[1].d);
        q = join_i(_mm256_loadu_si256((const __m256i *)wb[0].qs),
                   two ? _mm256_loadu_si256((const __m256i *)wb[1].qs) : z);
    } else {
        const struct block_q4_0 *wb = (const struct block_q4_0 *)row + b;
        const __m256i eight = _mm256_set1_epi8(8);
        d0 = _cvtsh_ss(wb[0].d);
        if (two)
            d1 = _cvtsh_ss(wb[1].d);
        q = join_i(_mm256_sub_epi8(unpack_nibbles(wb[0].qs), eight),
                   two ? _mm256_sub_epi8(unpack_nibbles(wb[1].qs), eight) : z);
    }
    *d = join_ps(_mm256_set1_ps(d0), _mm256_set1_ps(d1));
    *neg = _mm512_movepi8_mask(q);
    return _mm512_abs_epi8(q);
}

/* Activation blocks b and b+1 (b alone when !two) of one row, and their
 * scales [d_b x 8, d_b+1 x 8]. */
INLINE __m512i load_act2(const char *row, int64_t b, const int two, __m512 *d)
{
    const struct block_q8_act *ab = (const struct block_q8_act *)row + b;
    *d = join_ps(_mm256_broadcast_ss(&ab[0].d),
                 two ? _mm256_broadcast_ss(&ab[1].d) : _mm256_setzero_ps());
    return join_i(_mm256_loadu_si256((const __m256i *)ab[0].qs),
                  two ? _mm256_loadu_si256((const __m256i *)ab[1].qs) : _mm256_setzero_si256());
}

/* int32 lanes of the products of unsigned bytes u and signed bytes s, four
 * bytes per lane (lanes 0-7: first block, 8-15: second). */
INLINE __m512i dot_u8s8(__m512i u, __m512i s)
{
    return _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1));
}

/* One step of the main loop: blocks b and b+1 (b alone when !two). */
INLINE void quant_step(const enum qtype type, const int nt, const int nr, const struct tile *p,
                       int64_t b, const int two, __m512 acc[TILE_T][TILE_N])
{
    __m512i wq[TILE_N];
    __mmask64 neg[TILE_N];
    __m512 dw[TILE_N];

#pragma GCC unroll 4
    for (int r = 0; r < nr; r++)
        wq[r] = load_weights2(type, p->w + r * p->w_stride, b, two, &neg[r], &dw[r]);
#pragma GCC unroll 4
    for (int t = 0; t < nt; t++) {
        __m512 da;
        __m512i qa = load_act2(p->a + (size_t)t * p->a_stride, b, two, &da);
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++) {
            __m512i s = qa;
            if (type != QTYPE_Q4_1)
                s = _mm512_mask_sub_epi8(qa, neg[r], _mm512_setzero_si512(), qa);
            __m512i i = dot_u8s8(wq[r], s);
            acc[t][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), _mm512_mul_ps(dw[r], da), acc[t][r]);
        }
    }
}

/* Q4_1's offset term for a tile: lane t of out[r] is the sum over blocks of
 * m_w * s_a for weight row r and activation row t. */
INLINE void q4_1_offsets(const int nt, const int nr, const struct tile *p, __m128 out[TILE_N])
{
    const size_t as = p->a_stride;
    __m256 acc = _mm256_setzero_ps(); /* lanes 0-3: weight row 0; 4-7: row 1 */

    for (int64_t b = 0; b < p->k / QK; b++) {
        const struct block_q8_act *a0 = (const struct block_q8_act *)p->a + b;
        const struct block_q4_1 *w0 = (const struct block_q4_1 *)p->w + b;
#define S_AT(t) (nt > (t) ? ((const struct block_q8_act *)((const char *)a0 + (t)*as))->s : 0.0f)
        __m128 s = _mm_setr_ps(S_AT(0), S_AT(1), S_AT(2), S_AT(3));
#undef S_AT
        __m128i m16 = _mm_set1_epi16((short)w0->m);
        if (nr > 1)
            m16 =
                _mm_insert_epi16(m16, ((const struct block_q4_1 *)(p->w + p->w_stride) + b)->m, 4);
        __m256 m = _mm256_cvtph_ps(_mm_shufflelo_epi16(_mm_shufflehi_epi16(m16, 0), 0));
        acc = _mm256_fmadd_ps(m, _mm256_set_m128(s, s), acc);
    }
    out[0] = _mm256_castps256_ps128(acc);
    out[1] = _mm256_extractf128_ps(acc, 1);
}

INLINE void tile_quant(const enum qtype type, const int nt, const int nr, const struct tile *p)
{
    const int64_t nb = p->k / QK;
    __m512 acc[TILE_T][TILE_N];

#pragma GCC unroll 4
    for (int t = 0; t < nt; t++)
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++)
            acc[t][r] = _mm512_setzero_ps();

    for (int64_t b = 0; b + 1 < nb; b += 2)
        quant_step(type, nt, nr, p, b, 1, acc);
    if (nb & 1)
        quant_step(type, nt, nr, p, nb - 1, 0, acc);

    if (type == QTYPE_Q4_1) {
        __m128 offsets[TILE_N];
        q4_1_offsets(nt, nr, p, offsets);
        store_tile(nt, nr, acc, offsets, p);
    } else {
        store_tile(nt, nr, acc, NULL, p);
    }
}

/* Quantized weights against one activation row (decode), four weight rows at
 * a time: the activation blocks are loaded once for four rows, and Q4_1's
 * offset term is folded into the main loop, four rows in the lanes of one
 * vector. Every output gets exactly the arithmetic of tile_quant (the same
 * per-lane products, sums and fused multiply-adds in the same order; lanes
 * are never combined differently), so a row's result does not depend on
 * which path computed it and cpu_matmul_rows stays batch-invariant. */
INLINE void quant_row4(const enum qtype type, const struct tile *p)
{
    const int64_t nb = p->k / QK;
    const struct block_q8_act *a = (const struct block_q8_act *)p->a;
    const char *w[4];
    __m512 acc[4];
    __m128 off = _mm_setzero_ps(); /* Q4_1, lane r: the offset sum of row r */

#pragma GCC unroll 4
    for (int r = 0; r < 4; r++) {
        w[r] = p->w + r * p->w_stride;
        acc[r] = _mm512_setzero_ps();
    }
    for (int64_t b = 0; b < nb; b += 2) {
        const int two = b + 1 < nb;
        __m512 da;
        __m512i qa = load_act2(p->a, b, two, &da);
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            __m512 dw;
            __mmask64 neg;
            __m512i wq = load_weights2(type, w[r], b, two, &neg, &dw);
            __m512i sa = qa;
            if (type != QTYPE_Q4_1)
                sa = _mm512_mask_sub_epi8(qa, neg, _mm512_setzero_si512(), qa);
            __m512i i = dot_u8s8(wq, sa);
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), _mm512_mul_ps(dw, da), acc[r]);
        }
        if (type == QTYPE_Q4_1) {
            /* the offsets of blocks b and b + 1, in block order */
            for (int64_t bb = b; bb < b + 1 + two; bb++) {
#define M_AT(r) ((short)((const struct block_q4_1 *)w[r])[bb].m)
                __m128i m16 = _mm_setr_epi16(M_AT(0), M_AT(1), M_AT(2), M_AT(3), 0, 0, 0, 0);
#undef M_AT
                off = _mm_fmadd_ps(_mm_cvtph_ps(m16), _mm_set1_ps(a[bb].s), off);
            }
        }
    }
    const __m512 z = _mm512_setzero_ps();
    float o[4];
    _mm_storeu_ps(o, off);
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++) {
        __m128 sums = hsum4(acc[r], z, z, z);
        if (type == QTYPE_Q4_1)
            sums = _mm_add_ps(sums, _mm_set_ss(o[r]));
        p->y[r] = _mm_cvtss_f32(sums);
    }
}

static void row4_q4_1(const struct tile *p)
{
    quant_row4(QTYPE_Q4_1, p);
}
static void row4_q8_0(const struct tile *p)
{
    quant_row4(QTYPE_Q8_0, p);
}
static void row4_q4_0(const struct tile *p)
{
    quant_row4(QTYPE_Q4_0, p);
}

/* ---- F32, F16, BF16 weights against f32 activations --------------------- */

INLINE __m512 load_float16(const enum qtype type, const char *row, int64_t i)
{
    if (type == QTYPE_F32)
        return _mm512_loadu_ps((const float *)row + i);
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)row + i));
    if (type == QTYPE_F16)
        return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

INLINE float load_float1(const enum qtype type, const char *row, int64_t i)
{
    if (type == QTYPE_F32)
        return ((const float *)row)[i];
    if (type == QTYPE_F16)
        return quant_f16_to_f32(((const uint16_t *)row)[i]);
    return quant_bf16_to_f32(((const uint16_t *)row)[i]);
}

INLINE void tile_float(const enum qtype type, const int nt, const int nr, const struct tile *p)
{
    const int64_t k16 = p->k & ~(int64_t)15;
    __m512 acc[TILE_T][TILE_N];

#pragma GCC unroll 4
    for (int t = 0; t < nt; t++)
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++)
            acc[t][r] = _mm512_setzero_ps();

    for (int64_t i = 0; i < k16; i += 16) {
        __m512 wv[TILE_N];
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++)
            wv[r] = load_float16(type, p->w + r * p->w_stride, i);
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++) {
            __m512 xv = _mm512_loadu_ps((const float *)(p->a + (size_t)t * p->a_stride) + i);
#pragma GCC unroll 4
            for (int r = 0; r < nr; r++)
                acc[t][r] = _mm512_fmadd_ps(wv[r], xv, acc[t][r]);
        }
    }
    if (k16 == p->k) {
        store_tile(nt, nr, acc, NULL, p);
        return;
    }

    /* k not a multiple of 16: the last values one at a time */
#pragma GCC unroll 4
    for (int t = 0; t < nt; t++) {
        const float *x = (const float *)(p->a + (size_t)t * p->a_stride);
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++) {
            float sum = hsum256(fold256(acc[t][r]));
            for (int64_t i = k16; i < p->k; i++)
                sum += load_float1(type, p->w + r * p->w_stride, i) * x[i];
            p->y[t * p->ldy + r] = sum;
        }
    }
}

/* ---- dispatch ------------------------------------------------------------ */

/* Calls fn(type, nt, nr, p) with nt and nr as constants. */
#define TILE_CASES(fn, type, nt, nr, p)                                                            \
    do {                                                                                           \
        if ((nr) == 2) {                                                                           \
            switch (nt) {                                                                          \
            case 4:                                                                                \
                fn(type, 4, 2, p);                                                                 \
                break;                                                                             \
            case 3:                                                                                \
                fn(type, 3, 2, p);                                                                 \
                break;                                                                             \
            case 2:                                                                                \
                fn(type, 2, 2, p);                                                                 \
                break;                                                                             \
            default:                                                                               \
                fn(type, 1, 2, p);                                                                 \
                break;                                                                             \
            }                                                                                      \
        } else {                                                                                   \
            switch (nt) {                                                                          \
            case 4:                                                                                \
                fn(type, 4, 1, p);                                                                 \
                break;                                                                             \
            case 3:                                                                                \
                fn(type, 3, 1, p);                                                                 \
                break;                                                                             \
            case 2:                                                                                \
                fn(type, 2, 1, p);                                                                 \
                break;                                                                             \
            default:                                                                               \
                fn(type, 1, 1, p);                                                                 \
                break;                                                                             \
            }                                                                                      \
        }                                                                                          \
    } while (0)

#define DEFINE_RUN(name, fn, type)                                                                 \
    static void name(int nt, int nr, const struct tile *p)                                         \
    {                                                                                              \
        TILE_CASES(fn, type, nt, nr, p);                                                           \
    }

DEFINE_RUN(run_q4_1, tile_quant, QTYPE_Q4_1)
DEFINE_RUN(run_q8_0, tile_quant, QTYPE_Q8_0)
DEFINE_RUN(run_q4_0, tile_quant, QTYPE_Q4_0)
DEFINE_RUN(run_f32, tile_float, QTYPE_F32)
DEFINE_RUN(run_f16, tile_float, QTYPE_F16)
DEFINE_RUN(run_bf16, tile_float, QTYPE_BF16)

void cpu__matmul_rows_avx512(enum qtype t, const void *restrict w, int64_t k, int64_t n0,
                             int64_t n1, const void *restrict act, int64_t T, float *restrict y,
                             int64_t ldy)
{
    void (*run)(int, int, const struct tile *) = run_f32;
    switch (t) {
    case QTYPE_Q4_1:
        run = run_q4_1;
        break;
    case QTYPE_Q8_0:
        run = run_q8_0;
        break;
    case QTYPE_Q4_0:
        run = run_q4_0;
        break;
    case QTYPE_F32:
        run = run_f32;
        break;
    case QTYPE_F16:
        run = run_f16;
        break;
    case QTYPE_BF16:
        run = run_bf16;
        break;
    default: /* Q5_0 and the K-quants: matmul_kquant_*.c */
        break;
    }

    struct tile p = {
        .w_stride = qtype_row_bytes(t, k),
        .a_stride = quant_act_bytes(t, k),
        .k = k,
        .ldy = ldy,
    };
    int64_t chunk = p.w_stride ? (int64_t)(CHUNK_BYTES / p.w_stride) : TILE_N;
    chunk = chunk < TILE_N ? TILE_N : chunk - chunk % TILE_N;
    void (*row4)(const struct tile *) = NULL;
    if (t == QTYPE_Q4_1)
        row4 = row4_q4_1;
    else if (t == QTYPE_Q8_0)
        row4 = row4_q8_0;
    else if (t == QTYPE_Q4_0)
        row4 = row4_q4_0;
    if (row4 && T == 1) {
        /* decode: four rows at a time, the rest in tiles of TILE_N */
        int64_t n = n0;
        p.a = act;
        for (; n + 4 <= n1; n += 4) {
            p.w = (const char *)w + (size_t)n * p.w_stride;
            p.y = y + n;
            row4(&p);
        }
        for (; n < n1; n += TILE_N) {
            p.w = (const char *)w + (size_t)n * p.w_stride;
            p.y = y + n;
            run(1, n1 - n < TILE_N ? (int)(n1 - n) : TILE_N, &p);
        }
        return;
    }
    for (int64_t c0 = n0; c0 < n1; c0 += chunk) {
        int64_t c1 = n1 - c0 < chunk ? n1 : c0 + chunk;
        for (int64_t tt = 0; tt < T; tt += TILE_T) {
            int nt = T - tt < TILE_T ? (int)(T - tt) : TILE_T;
            for (int64_t n = c0; n < c1; n += TILE_N) {
                p.w = (const char *)w + (size_t)n * p.w_stride;
                p.a = (const char *)act + (size_t)tt * p.a_stride;
                p.y = y + tt * ldy + n;
                run(nt, c1 - n < TILE_N ? (int)(c1 - n) : TILE_N, &p);
            }
        }
    }
}
