/*
 * matmul_kquant_avx2.c: AVX2 + FMA + F16C kernels for Q5_0 and the K-quants
 * (matmul_kquant.h). matmul.c calls into this file only after CPUID says the
 * CPU has all three.
 *
 * The scheme of matmul_avx2.c, one 32-value group at a time: a decoder
 * (matmul_kquant.h) turns the weight group into 32 small integers and a float
 * scale per 16 values; VPMADDUBSW + VPMADDWD take the exact integer dot with
 * the activation block (signed weights as |q| with their sign moved onto the
 * activations by VPSIGNB); each int32 lane is scaled by its sub-block's scale
 * times d_a in float. Q4_K and Q5_K subtract their mins as mw * s_a per group
 * (s_a = d_a * sum a, stored in the activation block). Tiles of TILE_T
 * activation rows x TILE_N weight rows, weight rows cut into L1-sized chunks.
 */
#define SS_KQUANT_DECODERS
#include "matmul_kquant.h"

#include <immintrin.h>

#define TILE_T 4          /* activation rows per tile */
#define TILE_N 2          /* weight rows per tile */
#define CHUNK_BYTES 16384 /* weight bytes per cache block: half of a 32 KiB L1D */

#define INLINE static inline __attribute__((always_inline))

struct tile {
    const char *w;   /* first weight row of the tile */
    size_t w_stride; /* bytes between weight rows */
    const char *a;   /* first activation row of the tile */
    size_t a_stride; /* bytes between activation rows */
    int64_t k;       /* values per row */
    float *y;        /* y[t * ldy + r] for tile row t, weight row r */
    int64_t ldy;
};

/* Lane i of the result: the sum of the 8 lanes of v_i. */
INLINE __m128 hsum4(__m256 v0, __m256 v1, __m256 v2, __m256 v3)
{
    __m256 s = _mm256_hadd_ps(_mm256_hadd_ps(v0, v1), _mm256_hadd_ps(v2, v3));
    return _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
}

/* s_a of activation block g for the tile's rows (0 past nt), one per lane. */
INLINE __m128 act_sums(const int nt, const struct tile *p, int64_t g)
{
#define S_AT(t)                                                                                    \
    (nt > (t) ? ((const struct block_q8_act *)(p->a + (size_t)(t)*p->a_stride) + g)->s : 0.0f)
    return _mm_setr_ps(S_AT(0), S_AT(1), S_AT(2), S_AT(3));
#undef S_AT
}

INLINE void tile_kquant(const enum qtype type, const int nt, const int nr, const struct tile *p)
{
    const __m256i ones = _mm256_set1_epi16(1);
    const int gpb = kq_groups_per_block(type);
    const size_t bb = kq_block_bytes(type);
    const int64_t nblocks = p->k / (QK * gpb);
    __m256 acc[TILE_T][TILE_N];
    __m128 mins[TILE_N]; /* lane t: sum over groups of mw * s_a */

#pragma GCC unroll 4
    for (int r = 0; r < nr; r++) {
        mins[r] = _mm_setzero_ps();
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++)
            acc[t][r] = _mm256_setzero_ps();
    }

    for (int64_t b = 0; b < nblocks; b++) {
        for (int g = 0; g < gpb; g++) {
            const int64_t ga = b * gpb + g; /* the activation block this group meets */
            __m128 s4 = _mm_setzero_ps();
            if (kq_has_min(type))
                s4 = act_sums(nt, p, ga);
#pragma GCC unroll 4
            for (int r = 0; r < nr; r++) {
                struct kq_group wg;
                kq_decode(type, p->w + r * p->w_stride + (size_t)b * bb, g, &wg);
                if (kq_has_min(type))
                    mins[r] = _mm_fmadd_ps(_mm_set1_ps(wg.mw), s4, mins[r]);
                __m256i u = kq_signed(type) ? _mm256_sign_epi8(wg.q, wg.q) : wg.q;
#pragma GCC unroll 4
                for (int t = 0; t < nt; t++) {
                    const struct block_q8_act *ab =
                        (const struct block_q8_act *)(p->a + (size_t)t * p->a_stride) + ga;
                    __m256i qa = _mm256_loadu_si256((const __m256i *)ab->qs);
                    if (kq_signed(type))
                        qa = _mm256_sign_epi8(qa, wg.q);
                    __m256i i = _mm256_madd_epi16(_mm256_maddubs_epi16(u, qa), ones);
                    __m256 scale = _mm256_mul_ps(wg.scale, _mm256_broadcast_ss(&ab->d));
                    acc[t][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), scale, acc[t][r]);
                }
            }
        }
    }

    const __m256 z = _mm256_setzero_ps();
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

/* Calls tile_kquant(type, nt, nr, p) with nt and nr as constants. */
#define TILE_CASES(type, nt, nr, p)                                                                \
    do {                                                                                           \
        if ((nr) == 2) {                                                                           \
            switch (nt) {                                                                          \
            case 4:                                                                                \
                tile_kquant(type, 4, 2, p);                                                        \
                break;                                                                             \
            case 3:                                                                                \
                tile_kquant(type, 3, 2, p);                                                        \
                break;                                                                             \
            case 2:                                                                                \
                tile_kquant(type, 2, 2, p);                                                        \
                break;                                                                             \
            default:                                                                               \
                tile_kquant(type, 1, 2, p);                                                        \
                break;                                                                             \
            }                                                                                      \
        } else {                                                                                   \
            switch (nt) {                                                                          \
            case 4:                                                                                \
                tile_kquant(type, 4, 1, p);                                                        \
                break;                                                                             \
            case 3:                                                                                \
                tile_kquant(type, 3, 1, p);                                                        \
                break;                                                                             \
            case 2:                                                                                \
                tile_kquant(type, 2, 1, p);                                                        \
                break;                                                                             \
            default:                                                                               \
                tile_kquant(type, 1, 1, p);                                                        \
                break;                                                                             \
            }                                                                                      \
        }                                                                                          \
    } while (0)

#define DEFINE_RUN(name, type)                                                                     \
    static void name(int nt, int nr, const struct tile *p)                                         \
    {                                                                                              \
        TILE_CASES(type, nt, nr, p);                                                               \
    }

DEFINE_RUN(run_q5_0, QTYPE_Q5_0)
DEFINE_RUN(run_q3_k, QTYPE_Q3_K)
DEFINE_RUN(run_q4_k, QTYPE_Q4_K)
DEFINE_RUN(run_q5_k, QTYPE_Q5_K)
DEFINE_RUN(run_q6_k, QTYPE_Q6_K)

void cpu__matmul_rows_kquant_avx2(enum qtype t, const void *restrict w, int64_t k, int64_t n0,
                                  int64_t n1, const void *restrict act, int64_t T,
                                  float *restrict y, int64_t ldy)
{
    void (*run)(int, int, const struct tile *);
    switch (t) {
    case QTYPE_Q5_0:
        run = run_q5_0;
        break;
    case QTYPE_Q3_K:
        run = run_q3_k;
        break;
    case QTYPE_Q4_K:
        run = run_q4_k;
        break;
    case QTYPE_Q5_K:
        run = run_q5_k;
        break;
    case QTYPE_Q6_K:
        run = run_q6_k;
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
