/*
 * matmul_kquant_avx512.c: AVX-512 kernels for Q5_0 and the K-quants
 * (matmul_kquant.h). Compiled with AVX-512 F, BW, VL and DQ (plus AVX2, FMA,
 * F16C); matmul.c calls into this file only after CPUID says the CPU has them.
 *
 * matmul_kquant_avx2.c's scheme (read that first) two groups at a time: a
 * 512-bit vector holds two decoded 32-value groups (an odd last Q5_0 block
 * goes alone, the upper half zero). The integer dot is VPDPBUSD when the CPU
 * has AVX512-VNNI (vnni != 0), VPMADDUBSW + VPMADDWD otherwise; both leave
 * int32 lanes of four values, so each lane's sub-block scale is applied in
 * float. Signed weights go in as |q| with sign(q) moved onto the activation
 * bytes by a masked subtract.
 */
#define SS_KQUANT_DECODERS
#include "matmul_kquant.h"

#include <immintrin.h>

#define TILE_T 4          /* activation rows per tile */
#define TILE_N 2          /* weight rows per tile */
#define CHUNK_BYTES 16384 /* weight bytes per cache block: half of a 32 KiB L1D */

#define INLINE static inline __attribute__((always_inline))

/* VPDPBUSD as inline asm, so this file needs no -mavx512vnni and the compiler
 * cannot emit VNNI anywhere else; reached only with vnni != 0. */
INLINE __m512i dpbusd(__m512i acc, __m512i u, __m512i s)
{
    __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(s));
    return acc;
}

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

/* Lane i of the result: the sum of the 16 lanes of v_i. */
INLINE __m128 hsum4(__m512 v0, __m512 v1, __m512 v2, __m512 v3)
{
    __m256 s01 = _mm256_hadd_ps(fold256(v0), fold256(v1));
    __m256 s = _mm256_hadd_ps(s01, _mm256_hadd_ps(fold256(v2), fold256(v3)));
    return _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
}

INLINE __m512i join_i(__m256i lo, __m256i hi)
{
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

INLINE __m512 join_ps(__m256 lo, __m256 hi)
{
    return _mm512_castpd_ps(
        _mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(lo)), _mm256_castps_pd(hi), 1));
}

/* s_a of activation block g for the tile's rows (0 past nt), one per lane. */
INLINE __m128 act_sums(const int nt, const struct tile *p, int64_t g)
{
#define S_AT(t)                                                                                    \
    (nt > (t) ? ((const struct block_q8_act *)(p->a + (size_t)(t)*p->a_stride) + g)->s : 0.0f)
    return _mm_setr_ps(S_AT(0), S_AT(1), S_AT(2), S_AT(3));
#undef S_AT
}

/* Group gi of a weight row (counted over the whole row). */
INLINE void decode_at(const enum qtype type, const char *row, int64_t gi, struct kq_group *out)
{
    const int gpb = kq_groups_per_block(type);
    kq_decode(type, row + (size_t)(gi / gpb) * kq_block_bytes(type), (int)(gi % gpb), out);
}

/* Groups gi and gi+1 (gi alone when !two) against the tile. */
INLINE void kq_step(const enum qtype type, const int vnni, const int nt, const int nr,
                    const struct tile *p, int64_t gi, const int two, __m512 acc[TILE_T][TILE_N],
                    __m128 mins[TILE_N])
{
    __m512i wq[TILE_N];
    __mmask64 neg[TILE_N];
    __m512 ws[TILE_N];
    __m128 s0 = _mm_setzero_ps(), s1 = _mm_setzero_ps();

    if (kq_has_min(type)) {
        s0 = act_sums(nt, p, gi);
        if (two)
            s1 = act_sums(nt, p, gi + 1);
    }
#pragma GCC unroll 4
    for (int r = 0; r < nr; r++) {
        struct kq_group g0, g1;
        const char *row = p->w + r * p->w_stride;
        decode_at(type, row, gi, &g0);
        if (two) {
            decode_at(type, row, gi + 1, &g1);
        } else {
            g1.q = _mm256_setzero_si256();
            g1.scale = _mm256_setzero_ps();
            g1.mw = 0.0f;
        }
        if (kq_has_min(type)) {
            mins[r] = _mm_fmadd_ps(_mm_set1_ps(g0.mw), s0, mins[r]);
            mins[r] = _mm_fmadd_ps(_mm_set1_ps(g1.mw), s1, mins[r]);
        }
        __m512i q = join_i(g0.q, g1.q);
        ws[r] = join_ps(g0.scale, g1.scale);
        if (kq_signed(type)) {
            neg[r] = _mm512_movepi8_mask(q);
            q = _mm512_abs_epi8(q);
        }
        wq[r] = q;
    }
#pragma GCC unroll 4
    for (int t = 0; t < nt; t++) {
        const struct block_q8_act *ab =
            (const struct block_q8_act *)(p->a + (size_t)t * p->a_stride) + gi;
        __m512 da = join_ps(_mm256_broadcast_ss(&ab[0].d),
                            two ? _mm256_broadcast_ss(&ab[1].d) : _mm256_setzero_ps());
        __m512i qa =
            join_i(_mm256_loadu_si256((const __m256i *)ab[0].qs),
                   two ? _mm256_loadu_si256((const __m256i *)ab[1].qs) : _mm256_setzero_si256());
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++) {
            __m512i s = qa;
            if (kq_signed(type))
                s = _mm512_mask_sub_epi8(qa, neg[r], _mm512_setzero_si512(), qa);
            __m512i i;
            if (vnni)
                i = dpbusd(_mm512_setzero_si512(), wq[r], s);
            else
                i = _mm512_madd_epi16(_mm512_maddubs_epi16(wq[r], s), _mm512_set1_epi16(1));
            acc[t][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), _mm512_mul_ps(ws[r], da), acc[t][r]);
        }
    }
}

INLINE void tile_kquant(const enum qtype type, const int vnni, const int nt, const int nr,
                        const struct tile *p)
{
    const int64_t ng = p->k / QK;
    __m512 acc[TILE_T][TILE_N];
    __m128 mins[TILE_N];

#pragma GCC unroll 4
    for (int r = 0; r < nr; r++) {
        mins[r] = _mm_setzero_ps();
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++)
            acc[t][r] = _mm512_setzero_ps();
    }
    for (int64_t gi = 0; gi + 1 < ng; gi += 2)
        kq_step(type, vnni, nt, nr, p, gi, 1, acc, mins);
    if (ng & 1)
        kq_step(type, vnni, nt, nr, p, ng - 1, 0, acc, mins);

    const __m512 z = _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int r = 0; r < nr; r++) {
        __m128 sums = hsum4(acc[0][r], nt > 1 ? acc[1][r] : z, nt > 2 ? acc[2][r] : z,
                            nt > 3 ? acc[3][r] : z);
        sums = _mm_sub_ps(sums, mins[r]);
        float out[4];
        _mm_storeu_ps(out, sums);
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++)
            p->y[t * p->ldy + r] = out[t];
    }
}

/* Calls tile_kquant(type, vnni, nt, nr, p) with nt and nr as constants. */
#define TILE_CASES(type, vnni, nt, nr, p)                                                          \
    do {                                                                                           \
        if ((nr) == 2) {                                                                           \
            switch (nt) {                                                                          \
            case 4:                                                                                \
                tile_kquant(type, vnni, 4, 2, p);                                                  \
                break;                                                                             \
            case 3:                                                                                \
                tile_kquant(type, vnni, 3, 2, p);                                                  \
                break;                                                                             \
            case 2:                                                                                \
                tile_kquant(type, vnni, 2, 2, p);                                                  \
                break;                                                                             \
            default:                                                                               \
                tile_kquant(type, vnni, 1, 2, p);                                                  \
                break;                                                                             \
            }                                                                                      \
        } else {                                                                                   \
            switch (nt) {                                                                          \
            case 4:                                                                                \
                tile_kquant(type, vnni, 4, 1, p);                                                  \
                break;                                                                             \
            case 3:                                                                                \
                tile_kquant(type, vnni, 3, 1, p);                                                  \
                break;                                                                             \
            case 2:                                                                                \
                tile_kquant(type, vnni, 2, 1, p);                                                  \
                break;                                                                             \
            default:                                                                               \
                tile_kquant(type, vnni, 1, 1, p);                                                  \
                break;                                                                             \
            }                                                                                      \
        }                                                                                          \
    } while (0)

#define DEFINE_RUN(name, type, vnni)                                                               \
    static void name(int nt, int nr, const struct tile *p)                                         \
    {                                                                                              \
        TILE_CASES(type, vnni, nt, nr, p);                                                         \
    }

DEFINE_RUN(run_q5_0, QTYPE_Q5_0, 0)
DEFINE_RUN(run_q3_k, QTYPE_Q3_K, 0)
DEFINE_RUN(run_q4_k, QTYPE_Q4_K, 0)
DEFINE_RUN(run_q5_k, QTYPE_Q5_K, 0)
DEFINE_RUN(run_q6_k, QTYPE_Q6_K, 0)
DEFINE_RUN(run_q5_0_vnni, QTYPE_Q5_0, 1)
DEFINE_RUN(run_q3_k_vnni, QTYPE_Q3_K, 1)
DEFINE_RUN(run_q4_k_vnni, QTYPE_Q4_K, 1)
DEFINE_RUN(run_q5_k_vnni, QTYPE_Q5_K, 1)
DEFINE_RUN(run_q6_k_vnni, QTYPE_Q6_K, 1)

void cpu__matmul_rows_kquant_avx512(enum qtype t, const void *restrict w, int64_t k, int64_t n0,
                                    int64_t n1, const void *restrict act, int64_t T,
                                    float *restrict y, int64_t ldy, int vnni)
{
    void (*run)(int, int, const struct tile *);
    switch (t) {
    case QTYPE_Q5_0:
        run = vnni ? run_q5_0_vnni : run_q5_0;
        break;
    case QTYPE_Q3_K:
        run = vnni ? run_q3_k_vnni : run_q3_k;
        break;
    case QTYPE_Q4_K:
        run = vnni ? run_q4_k_vnni : run_q4_k;
        break;
    case QTYPE_Q5_K:
        run = vnni ? run_q5_k_vnni : run_q5_k;
        break;
    case QTYPE_Q6_K:
        run = vnni ? run_q6_k_vnni : run_q6_k;
        break;
    default:
        return; /* matmul.c sends only the types above */
    }

    struct tile p = {
        .w_stride = qtype_row_bytes(t, k),
        .a_stride = quant_act_bytes(t, k),
        .k = k,
        .ldy = ldy,
    };
    int64_t chunk = p.w_stride ? (int64_t)(CHUNK_BYTES / p.w_stride) : TILE_N;
    chunk = chunk < TILE_N ? TILE_N : chunk - chunk % TILE_N;
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
