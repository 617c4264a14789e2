/*
 * matmul_rows16_ymm.h: the 256-bit kernel for Q4_0, Q4_1 and Q8_0 weights
 * repacked by cpu_pack_rows (layout in matmul.h), behind
 * cpu_matmul_rows_packed on CPUs whose best ISA is AVX2 (no AVX512-VNNI).
 * Not a header to include for its declarations (those are in
 * matmul_impl.h): the source of the kernel, which matmul_rows16_avx2.c
 * compiles with AVX2, FMA and F16C and matmul_rows16_avxvnni.c with
 * AVX-VNNI as well; matmul.c calls into either only after CPUID says the
 * CPU has what it was compiled for.
 *
 * Layout. A repacked group of sixteen rows stores each block's quants as
 * runs of 64 bytes, bytes 4r .. 4r+3 of run j being values 4j .. 4j+3 of
 * row r: the low 32 bytes of a run are rows 0-7, the high 32 rows 8-15. So
 * one 256-bit load gives eight rows, one row per int32 lane, and the
 * activation's four bytes 4j .. 4j+3, broadcast, meet all eight at once:
 * VPMADDUBSW multiplies the unsigned weight bytes by the signed activation
 * bytes and adds neighbours into 16-bit lanes, VPMADDWD by ones adds those
 * into one int32 per row. Nothing is summed across lanes. A half group
 * (eight rows) is taken against a register tile of up to four activation
 * rows, so that each block's quants are loaded (the nibbles split) once for
 * the tile (five rows ran within the noise of four on Zen 3); the AVX-VNNI
 * build below needs no 16-bit partial sums and takes up to six. A single
 * activation row (T = 1, or the one row left in the last 64-row block of
 * T = 65, 129, ...) the AVX2 build takes against a group's two halves in
 * one pass instead (tile16_t1): each broadcast serves sixteen rows, and
 * each 64-byte run of a block is loaded in one pass, not half of it in each
 * of two (a decode token's products ran 1.2x faster on Zen 3,
 * docs/benchmarks.md).
 *
 * The integer dot product of a block is exact, as in the VNNI kernel:
 *   Q4_0 and Q4_1: the nibbles q (0..15) against a (|a| <= 127: the
 *     activation quantizer's range) in 16-bit lanes, summed over the eight
 *     runs before widening: at most 8 * 2 * 15 * 128 = 30,720 < 2^15, no
 *     saturation and no wrap; then i = that - bias * sum(a), bias 8 for
 *     Q4_0 and 0 for Q4_1.
 *   Q8_0: the stored bytes are w + 128, which VPMADDUBSW cannot take (a
 *     pair of 255 * 127 saturates), so each run is made signed again (w)
 *     and taken as |w| against a with w's sign: a pair is at most
 *     2 * 128 * 127 = 32,512, widened to int32 at every run. i = sum(w a).
 * Then, per output, the VNNI kernel's float steps in the same order:
 *     acc = fma((float)i, d_w * d_a, acc)
 *     acc = fma(m_w, s_a, acc)                     (Q4_1 only)
 * so a repacked row's result is bit-identical to the VNNI kernel's (the
 * tests compare them where both run), and it depends neither on T nor on
 * the rows of the call nor on the row's place in its group: a row's result
 * is the same however it is batched.
 *
 * Compiled with ROWS16_AVXVNNI defined (matmul_rows16_avxvnni.c) it is the
 * kernel for CPUs with AVX-VNNI, the 256-bit VPDPBUSD, which Intel's parts
 * without AVX-512 have had since Alder Lake (client cores, Sierra Forest):
 * one VPDPBUSD per run and row takes the place of VPMADDUBSW and its 16-bit
 * add (Q4), or of the sign steps, VPMADDUBSW, VPMADDWD and the add (Q8_0,
 * whose stored bytes w + 128 it takes as they are, with bias 128 as in the
 * VNNI kernel). Its sums are the same exact integers, so its results are
 * the same bits.
 *
 * The last N % 16 rows of a repacked matrix are stored as they are; they are
 * transposed block by block into a group of their own on the stack (its
 * lanes past the last row repeat it and are not stored), so they take the
 * same steps. cpu__matmul_rows16_avx2 does that for every group of a matrix
 * whose rows are all as they are, so that cpu_matmul_rows gives these types
 * the same bits on AVX2 whether or not the weights were repacked (slowly:
 * the backend repacks them, so only tests and benchmarks go this way).
 */
#include "matmul_impl.h"

#include <immintrin.h>
#include <string.h>

#define GROUP 16        /* weight rows per repacked group */
#define HALF 8          /* rows per 256-bit vector: one per int32 lane */
#define CHUNK_BLOCKS 32 /* blocks per pass over the groups */
#ifdef ROWS16_AVXVNNI
#define TILE_MAX 6 /* activation rows per register tile */
#else
#define TILE_MAX 4 /* activation rows per register tile */
#endif
#define TOKEN_BLOCK 64 /* activation rows whose corrections are kept at once */
#define T1_BLOCKS 1024 /* T = 1: blocks per pass, so each group is read in one */

#define INLINE static inline __attribute__((always_inline))

#ifdef ROWS16_AVXVNNI
#define ROWS16_NAME(f) f##_avxvnni
#else
#define ROWS16_NAME(f) f##_avx2
#endif

/* The offset of the quants in the sums this kernel forms
 * (cpu__packed_bias): the AVX2 build makes Q8_0's bytes signed again first,
 * so for it they have none; the AVX-VNNI build takes them as stored. */
INLINE int bias_of(const enum qtype type)
{
#ifndef ROWS16_AVXVNNI
    if (type == QTYPE_Q8_0)
        return 0;
#endif
    return cpu__packed_bias(type);
}

INLINE int32_t load_i32(const void *p)
{
    int32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* Run j's quants (0..15) from the 32 bytes v that hold runs j % 4 and
 * j % 4 + 4 of eight rows: the low nibbles for runs 0-3, the high ones for
 * 4-7. */
INLINE __m256i run_nibbles(__m256i v, int j)
{
    const __m256i lo4 = _mm256_set1_epi8(0x0f);
    return j < 4 ? _mm256_and_si256(v, lo4) : _mm256_and_si256(_mm256_srli_epi16(v, 4), lo4);
}

/* Half h's eight f16 scales of the repacked block at qb, and (Q4_1) its
 * minimums (zeros for the other types). */
INLINE __m256 half_scales(const enum qtype type, const char *qb, int h)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(qb + cpu__packed_qb(type) + 16 * h)));
}
INLINE __m256 half_mins(const enum qtype type, const char *qb, int h)
{
    return type == QTYPE_Q4_1 ? _mm256_cvtph_ps(_mm_loadu_si128(
                                    (const __m128i *)(qb + cpu__packed_qb(type) + 32 + 16 * h)))
                              : _mm256_setzero_ps();
}

/* One block's float steps for eight outputs f: the block's integer sums i
 * (one per row) times the rows' scales d times the activation block's, then
 * (Q4_1) the rows' minimums m times the activation block's sum. Every tile
 * here takes these steps in this order, so a row's bits do not depend on
 * which tile made them. */
INLINE __m256 block_out(const enum qtype type, __m256i i, __m256 d, __m256 m,
                        const struct block_q8_act *ab, __m256 f)
{
    f = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_mul_ps(d, _mm256_set1_ps(ab->d)), f);
    if (type == QTYPE_Q4_1)
        f = _mm256_fmadd_ps(m, _mm256_set1_ps(ab->s), f);
    return f;
}

#ifndef ROWS16_AVXVNNI
/* VPMADDUBSW of u against the four activation bytes at p, broadcast: the
 * sixteen-bit sums of a run's products. mub_add adds them to acc (VPADDW).
 * Each is one asm statement so that the product is made where it is used.
 * Written with intrinsics, GCC made all of a block's products for a tile
 * first and kept them on the stack until their adds (about forty 256-bit
 * stores and reloads per block and tile); on Zen 3 a block of eight rows
 * and one activation row then took about 11 cycles, and takes 9 so (a
 * throwaway driver of this loop). Same instructions, same sums. */
INLINE __m256i mub_first(__m256i u, const void *p)
{
    __m256i x;
    __asm__("vpbroadcastd %2, %0\n\tvpmaddubsw %0, %1, %0"
            : "=&x"(x)
            : "x"(u), "m"(*(const i32_bytes *)p));
    return x;
}
INLINE __m256i mub_add(__m256i acc, __m256i u, const void *p)
{
    __m256i x;
    __asm__("vpbroadcastd %3, %1\n\tvpmaddubsw %1, %2, %1\n\tvpaddw %1, %0, %0"
            : "+x"(acc), "=&x"(x)
            : "x"(u), "m"(*(const i32_bytes *)p));
    return acc;
}

/* Q8_0's run (w the signed weight bytes, aw = |w|) against the four
 * activation bytes at p, broadcast: VPSIGNB moves w's sign onto them,
 * VPMADDUBSW and VPMADDWD by ones make the 32-bit sums; q8_add adds them to
 * acc. One asm statement each, as mub_add. */
INLINE __m256i q8_first(__m256i aw, __m256i w, __m256i ones, const void *p)
{
    __m256i x;
    __asm__("vpbroadcastd %4, %0\n\tvpsignb %2, %0, %0\n\tvpmaddubsw %0, %1, %0\n\t"
            "vpmaddwd %3, %0, %0"
            : "=&x"(x)
            : "x"(aw), "x"(w), "x"(ones), "m"(*(const i32_bytes *)p));
    return x;
}
INLINE __m256i q8_add(__m256i acc, __m256i aw, __m256i w, __m256i ones, const void *p)
{
    __m256i x;
    __asm__("vpbroadcastd %5, %1\n\tvpsignb %3, %1, %1\n\tvpmaddubsw %1, %2, %1\n\t"
            "vpmaddwd %4, %1, %1\n\tvpaddd %1, %0, %0"
            : "+x"(acc), "=&x"(x)
            : "x"(aw), "x"(w), "x"(ones), "m"(*(const i32_bytes *)p));
    return acc;
}

/* The same for both halves of a group at once (one activation row): the
 * four activation bytes at p are broadcast once for the two halves' runs u0
 * and u1 (Q8_0: aw0, w0 and aw1, w1), and each half's sums go to its own
 * accumulator. */
INLINE void mub2_first(__m256i *a0, __m256i *a1, __m256i u0, __m256i u1, const void *p)
{
    __m256i x;
    __asm__("vpbroadcastd %5, %2\n\tvpmaddubsw %2, %3, %0\n\tvpmaddubsw %2, %4, %1"
            : "=&x"(*a0), "=&x"(*a1), "=&x"(x)
            : "x"(u0), "x"(u1), "m"(*(const i32_bytes *)p));
}
INLINE void mub2_add(__m256i *a0, __m256i *a1, __m256i u0, __m256i u1, const void *p)
{
    __m256i x, t;
    __asm__("vpbroadcastd %6, %2\n\tvpmaddubsw %2, %4, %3\n\tvpaddw %3, %0, %0\n\t"
            "vpmaddubsw %2, %5, %3\n\tvpaddw %3, %1, %1"
            : "+x"(*a0), "+x"(*a1), "=&x"(x), "=&x"(t)
            : "x"(u0), "x"(u1), "m"(*(const i32_bytes *)p));
}
INLINE void q82_first(__m256i *a0, __m256i *a1, __m256i aw0, __m256i w0, __m256i aw1, __m256i w1,
                      __m256i ones, const void *p)
{
    __m256i x;
    __asm__("vpbroadcastd %8, %2\n\t"
            "vpsignb %4, %2, %0\n\tvpmaddubsw %0, %3, %0\n\tvpmaddwd %7, %0, %0\n\t"
            "vpsignb %6, %2, %1\n\tvpmaddubsw %1, %5, %1\n\tvpmaddwd %7, %1, %1"
            : "=&x"(*a0), "=&x"(*a1), "=&x"(x)
            : "x"(aw0), "x"(w0), "x"(aw1), "x"(w1), "x"(ones), "m"(*(const i32_bytes *)p));
}
INLINE void q82_add(__m256i *a0, __m256i *a1, __m256i aw0, __m256i w0, __m256i aw1, __m256i w1,
                    __m256i ones, const void *p)
{
    __m256i x, t;
    __asm__("vpbroadcastd %9, %2\n\t"
            "vpsignb %5, %2, %3\n\tvpmaddubsw %3, %4, %3\n\tvpmaddwd %8, %3, %3\n\t"
            "vpaddd %3, %0, %0\n\t"
            "vpsignb %7, %2, %3\n\tvpmaddubsw %3, %6, %3\n\tvpmaddwd %8, %3, %3\n\t"
            "vpaddd %3, %1, %1"
            : "+x"(*a0), "+x"(*a1), "=&x"(x), "=&x"(t)
            : "x"(aw0), "x"(w0), "x"(aw1), "x"(w1), "x"(ones), "m"(*(const i32_bytes *)p));
}

/* Both halves of a repacked group (all sixteen rows live) against one
 * activation row a, blocks bb = 0 .. nb-1 at base + bb * cpu__packed_bs,
 * into y[0 .. 15] (zero first where first; added to otherwise): each
 * block's runs are loaded in one pass and each broadcast serves both
 * halves, where tile takes the group twice, a half at a time. Per row the
 * same integer sums and the same float steps in the same order as tile's,
 * so the same bits. */
INLINE void tile16_t1(const enum qtype type, const char *base, int nb, const char *a,
                      const int32_t *corr, float *y, int first)
{
    const __m256i flip = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1);
    __m256 f0 = first ? _mm256_setzero_ps() : _mm256_loadu_ps(y),
           f1 = first ? _mm256_setzero_ps() : _mm256_loadu_ps(y + HALF);
    for (int bb = 0; bb < nb; bb++) {
        const char *qb = base + (size_t)bb * cpu__packed_bs(type);
        const struct block_q8_act *ab = (const struct block_q8_act *)a + bb;
        __m256i acc0, acc1;
        if (type == QTYPE_Q8_0) {
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++) {
                const __m256i w0 =
                    _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(qb + 64 * j)), flip);
                const __m256i w1 =
                    _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(qb + 64 * j + 32)), flip);
                const __m256i aw0 = _mm256_abs_epi8(w0), aw1 = _mm256_abs_epi8(w1);
                if (j == 0)
                    q82_first(&acc0, &acc1, aw0, w0, aw1, w1, ones, ab->qs + 4 * j);
                else
                    q82_add(&acc0, &acc1, aw0, w0, aw1, w1, ones, ab->qs + 4 * j);
            }
        } else {
#pragma GCC unroll 8
            for (int jj = 0; jj < 8; jj++) {
                const int j = jj % 2 ? 4 + jj / 2 : jj / 2;
                const __m256i v0 = _mm256_loadu_si256((const __m256i *)(qb + 64 * (j % 4)));
                const __m256i v1 = _mm256_loadu_si256((const __m256i *)(qb + 64 * (j % 4) + 32));
                const __m256i u0 = run_nibbles(v0, j), u1 = run_nibbles(v1, j);
                if (jj == 0)
                    mub2_first(&acc0, &acc1, u0, u1, ab->qs + 4 * j);
                else
                    mub2_add(&acc0, &acc1, u0, u1, ab->qs + 4 * j);
            }
            acc0 = _mm256_madd_epi16(acc0, ones);
            acc1 = _mm256_madd_epi16(acc1, ones);
            if (type == QTYPE_Q4_0) {
                acc0 = _mm256_add_epi32(acc0, _mm256_set1_epi32(corr[bb]));
                acc1 = _mm256_add_epi32(acc1, _mm256_set1_epi32(corr[bb]));
            }
        }
        f0 = block_out(type, acc0, half_scales(type, qb, 0), half_mins(type, qb, 0), ab, f0);
        f1 = block_out(type, acc1, half_scales(type, qb, 1), half_mins(type, qb, 1), ab, f1);
    }
    _mm256_storeu_ps(y, f0);
    _mm256_storeu_ps(y + HALF, f1);
}
#endif

/* Half h (rows 8h .. 8h+7) of a repacked group, blocks bb = 0 .. nb-1 at
 * base + bb * cpu__packed_bs, against nt activation rows (a, a_stride apart,
 * positioned at the first of those blocks), accumulated into the outputs
 * y[t * ldy + 0 .. 7] of the lanes in mask (zero first where first).
 * corr[t * cs + bb] = -bias * sum of activation row t's block bb. */
INLINE void tile(const enum qtype type, const int nt, const char *base, int h, int nb,
                 const char *a, size_t a_stride, const int32_t *corr, int cs, float *y, int64_t ldy,
                 __m256i mask, int first)
{
#ifndef ROWS16_AVXVNNI
    const __m256i flip = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1);
#endif
    /* masked moves only where some lanes are out: on some AMD cores a
     * masked store is microcoded */
    const int whole = _mm256_movemask_ps(_mm256_castsi256_ps(mask)) == 0xff;
    __m256 f[TILE_MAX];
#pragma GCC unroll 8
    for (int t = 0; t < nt; t++)
        f[t] = first   ? _mm256_setzero_ps()
               : whole ? _mm256_loadu_ps(y + t * ldy)
                       : _mm256_maskload_ps(y + t * ldy, mask);
    for (int bb = 0; bb < nb; bb++) {
        const char *qb = base + (size_t)bb * cpu__packed_bs(type);
        __m256i acc[TILE_MAX];
#ifdef ROWS16_AVXVNNI
        /* the block's correction first, then one VPDPBUSD per run: the
         * stored bytes (nibbles, or w + 128) against the activation bytes */
#pragma GCC unroll 8
        for (int t = 0; t < nt; t++)
            acc[t] =
                type == QTYPE_Q4_1 ? _mm256_setzero_si256() : _mm256_set1_epi32(corr[t * cs + bb]);
#pragma GCC unroll 8
        for (int jj = 0; jj < 8; jj++) {
            const int j = type == QTYPE_Q8_0 ? jj : jj % 2 ? 4 + jj / 2 : jj / 2;
            __m256i u;
            if (type == QTYPE_Q8_0) {
                u = _mm256_loadu_si256((const __m256i *)(qb + 64 * j + 32 * h));
            } else {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(qb + 64 * (j % 4) + 32 * h));
                u = run_nibbles(v, j);
            }
#pragma GCC unroll 8
            for (int t = 0; t < nt; t++) {
                const struct block_q8_act *ab =
                    (const struct block_q8_act *)(a + (size_t)t * a_stride) + bb;
                acc[t] =
                    _mm256_dpbusd_avx_epi32(acc[t], u, _mm256_set1_epi32(load_i32(ab->qs + 4 * j)));
            }
        }
#else
        if (type == QTYPE_Q8_0) {
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++) {
                const __m256i w = _mm256_xor_si256(
                    _mm256_loadu_si256((const __m256i *)(qb + 64 * j + 32 * h)), flip);
                const __m256i aw = _mm256_abs_epi8(w);
#pragma GCC unroll 8
                for (int t = 0; t < nt; t++) {
                    const struct block_q8_act *ab =
                        (const struct block_q8_act *)(a + (size_t)t * a_stride) + bb;
                    acc[t] = j == 0 ? q8_first(aw, w, ones, ab->qs + 4 * j)
                                    : q8_add(acc[t], aw, w, ones, ab->qs + 4 * j);
                }
            }
        } else {
            /* a run's low nibbles, then its high ones */
#pragma GCC unroll 8
            for (int jj = 0; jj < 8; jj++) {
                const int j = jj % 2 ? 4 + jj / 2 : jj / 2;
                const __m256i v = _mm256_loadu_si256((const __m256i *)(qb + 64 * (j % 4) + 32 * h));
                const __m256i u = run_nibbles(v, j);
#pragma GCC unroll 8
                for (int t = 0; t < nt; t++) {
                    const struct block_q8_act *ab =
                        (const struct block_q8_act *)(a + (size_t)t * a_stride) + bb;
                    acc[t] =
                        jj == 0 ? mub_first(u, ab->qs + 4 * j) : mub_add(acc[t], u, ab->qs + 4 * j);
                }
            }
#pragma GCC unroll 8
            for (int t = 0; t < nt; t++) {
                acc[t] = _mm256_madd_epi16(acc[t], ones);
                if (type == QTYPE_Q4_0)
                    acc[t] = _mm256_add_epi32(acc[t], _mm256_set1_epi32(corr[t * cs + bb]));
            }
        }
#endif
        const __m256 d = half_scales(type, qb, h), m = half_mins(type, qb, h);
#pragma GCC unroll 8
        for (int t = 0; t < nt; t++)
            f[t] = block_out(type, acc[t], d, m,
                             (const struct block_q8_act *)(a + (size_t)t * a_stride) + bb, f[t]);
    }
#pragma GCC unroll 8
    for (int t = 0; t < nt; t++) {
        if (whole)
            _mm256_storeu_ps(y + t * ldy, f[t]);
        else
            _mm256_maskstore_ps(y + t * ldy, mask, f[t]);
    }
}

/* Calls tile with nt as a constant. */
INLINE void tile_n(const enum qtype type, int nt, const char *base, int h, int nb, const char *a,
                   size_t a_stride, const int32_t *corr, int cs, float *y, int64_t ldy,
                   __m256i mask, int first)
{
    switch (nt) {
#if TILE_MAX > 5
    case 6:
        tile(type, 6, base, h, nb, a, a_stride, corr, cs, y, ldy, mask, first);
        break;
#endif
#if TILE_MAX > 4
    case 5:
        tile(type, 5, base, h, nb, a, a_stride, corr, cs, y, ldy, mask, first);
        break;
#endif
    case 4:
        tile(type, 4, base, h, nb, a, a_stride, corr, cs, y, ldy, mask, first);
        break;
    case 3:
        tile(type, 3, base, h, nb, a, a_stride, corr, cs, y, ldy, mask, first);
        break;
    case 2:
        tile(type, 2, base, h, nb, a, a_stride, corr, cs, y, ldy, mask, first);
        break;
    default:
        tile(type, 1, base, h, nb, a, a_stride, corr, cs, y, ldy, mask, first);
        break;
    }
}

/* The int32 lanes of half h of the group at row g that fall in [n0, n1). */
INLINE __m256i half_mask(int64_t g, int h, int64_t n0, int64_t n1)
{
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const int64_t r0 = g + HALF * h;
    const int lo = n0 > r0 ? (int)(n0 - r0 < HALF ? n0 - r0 : HALF) : 0;
    const int hi = n1 > r0 ? (int)(n1 - r0 < HALF ? n1 - r0 : HALF) : 0;
    return _mm256_and_si256(_mm256_cmpgt_epi32(_mm256_set1_epi32(hi), lane),
                            _mm256_cmpgt_epi32(lane, _mm256_set1_epi32(lo - 1)));
}

/* Tiles as even as they divide (7 rows: 4 and 3) of the tn
 * activation rows at a (a_stride apart, positioned at the chunk's first
 * block) against half h of a group, blocks bb = 0 .. nb-1 at base. */
INLINE void tiles(const enum qtype type, const char *base, int h, int nb, const char *a,
                  size_t a_stride, int64_t tn, const int32_t *corr, int cs, float *y, int64_t ldy,
                  __m256i mask, int first)
{
    const int n_tiles = (int)((tn + TILE_MAX - 1) / TILE_MAX);
    for (int64_t tt = 0, ti = 0; tt < tn; ti++) {
        const int nt = (int)(tn / n_tiles + (ti < tn % n_tiles));
        tile_n(type, nt, base, h, nb, a + (size_t)tt * a_stride, a_stride, corr + tt * cs, cs,
               y + tt * ldy, ldy, mask, first);
        tt += nt;
    }
}

/* Rows [n0, n1) of a matrix of N rows of k values whose first `full` rows
 * (a multiple of 16) are repacked and the rest stored as they are. */
INLINE void rows16(const enum qtype type, const void *restrict wp, int64_t k, int64_t N,
                   int64_t full, int64_t n0, int64_t n1, const void *restrict act, int64_t T,
                   float *restrict y, int64_t ldy)
{
    const int bias = bias_of(type);
    const size_t rb = qtype_row_bytes(type, k), bs = cpu__packed_bs(type);
    const size_t a_stride = quant_act_bytes(type, k);
    const int64_t nbk = k / QK;
    /* blocks per pass over the groups: at T = 1 all of them (up to
     * T1_BLOCKS), so that the weights are read as one stream */
    const int chunk = T == 1 ? T1_BLOCKS : CHUNK_BLOCKS;
    int32_t corr[TOKEN_BLOCK * CHUNK_BLOCKS];
    _Static_assert(T1_BLOCKS <= TOKEN_BLOCK * CHUNK_BLOCKS, "corr holds a T = 1 pass");
    _Alignas(64) char tail[CHUNK_BLOCKS * (8 * 64 + 64)]; /* the last rows' group */

    for (int64_t t0 = 0; t0 < T; t0 += TOKEN_BLOCK) {
        const int64_t tn = T - t0 < TOKEN_BLOCK ? T - t0 : TOKEN_BLOCK;
        const char *a0 = (const char *)act + (size_t)t0 * a_stride;
        for (int64_t b0 = 0; b0 < nbk; b0 += chunk) {
            const int nb = nbk - b0 < chunk ? (int)(nbk - b0) : chunk;
            if (bias)
                for (int64_t t = 0; t < tn; t++)
                    for (int bb = 0; bb < nb; bb++)
                        corr[t * nb + bb] =
                            -bias *
                            ((const struct block_q8_act *)(a0 + (size_t)t * a_stride))[b0 + bb].sum;
            const char *ab0 = a0 + (size_t)b0 * sizeof(struct block_q8_act);
            for (int64_t g = n0 / GROUP * GROUP; g < n1; g += GROUP) {
                for (int h = 0; h < 2; h++) {
                    const __m256i mask = half_mask(g, h, n0, n1);
                    if (_mm256_testz_si256(mask, mask))
                        continue;
                    float *yg = y + t0 * ldy + g + HALF * h;
#ifndef ROWS16_AVXVNNI
                    if (tn == 1 && g < full && h == 0 && g >= n0 && g + GROUP <= n1) {
                        tile16_t1(type, (const char *)wp + (size_t)g * rb + (size_t)b0 * bs, nb,
                                  ab0, corr, yg, b0 == 0);
                        break; /* both halves done */
                    }
#endif
                    if (g < full) {
                        tiles(type, (const char *)wp + (size_t)g * rb + (size_t)b0 * bs, h, nb, ab0,
                              a_stride, tn, corr, nb, yg, ldy, mask, b0 == 0);
                        continue;
                    }
                    /* rows as they are, CHUNK_BLOCKS blocks at a time */
                    for (int c0 = 0; c0 < nb; c0 += CHUNK_BLOCKS) {
                        const int cn = nb - c0 < CHUNK_BLOCKS ? nb - c0 : CHUNK_BLOCKS;
                        for (int bb = 0; bb < cn; bb++)
                            cpu__pack_block(type, (const char *)wp + (size_t)g * rb, rb,
                                            (int)(N - g < GROUP ? N - g : GROUP), b0 + c0 + bb,
                                            tail + (size_t)bb * bs);
                        tiles(type, tail, h, cn, ab0 + (size_t)c0 * sizeof(struct block_q8_act),
                              a_stride, tn, corr + c0, nb, yg, ldy, mask, b0 + c0 == 0);
                    }
                }
            }
        }
    }
}

void ROWS16_NAME(cpu__matmul_rows16_packed)(enum qtype t, const void *restrict wp, int64_t k,
                                            int64_t N, int64_t n0, int64_t n1,
                                            const void *restrict act, int64_t T, float *restrict y,
                                            int64_t ldy)
{
    const int64_t full = N / GROUP * GROUP;
    switch (t) {
    case QTYPE_Q4_0:
        rows16(QTYPE_Q4_0, wp, k, N, full, n0, n1, act, T, y, ldy);
        break;
    case QTYPE_Q4_1:
        rows16(QTYPE_Q4_1, wp, k, N, full, n0, n1, act, T, y, ldy);
        break;
    default:
        rows16(QTYPE_Q8_0, wp, k, N, full, n0, n1, act, T, y, ldy);
        break;
    }
}

void ROWS16_NAME(cpu__matmul_rows16)(enum qtype t, const void *restrict w, int64_t k, int64_t n0,
                                     int64_t n1, const void *restrict act, int64_t T,
                                     float *restrict y, int64_t ldy)
{
    /* no row is repacked; the matrix has at least n1 rows */
    switch (t) {
    case QTYPE_Q4_0:
        rows16(QTYPE_Q4_0, w, k, n1, 0, n0, n1, act, T, y, ldy);
        break;
    case QTYPE_Q4_1:
        rows16(QTYPE_Q4_1, w, k, n1, 0, n0, n1, act, T, y, ldy);
        break;
    default:
        rows16(QTYPE_Q8_0, w, k, n1, 0, n0, n1, act, T, y, ldy);
        break;
    }
}
