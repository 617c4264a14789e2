/*
 * matmul_rows16_avx512.c: the AVX512-VNNI kernel for Q4_0, Q4_1 and Q8_0
 * weights behind cpu_matmul_rows (matmul.h), for every T (decode and
 * prefill alike). Compiled with AVX-512 F, BW, VL and DQ (plus AVX2, FMA,
 * F16C); matmul.c calls into this file only after CPUID says the CPU has
 * them and AVX512-VNNI.
 *
 * Layout. Weight rows are taken sixteen at a time, one row per int32 lane of
 * a 512-bit vector. For each block of 32 values the sixteen rows' quants are
 * transposed into eight vectors; vector j holds values 4j .. 4j+3 of every
 * row, as unsigned bytes (Q4: the nibble q in 0..15; Q8_0: w + 128). One
 * VPDPBUSD against the activation's four bytes 4j .. 4j+3, broadcast, then
 * adds four products to each of the sixteen rows: the activation is loaded
 * once for sixteen rows and nothing is summed across lanes. The transposed
 * quants and the rows' f32 scales of up to CHUNK_BLOCKS blocks go into a
 * scratch buffer on the stack (L1-sized) and serve every activation row of
 * the call, eight at a time.
 *
 * Arithmetic, per output (weight row n, activation row t), over the blocks b
 * in order:
 *     i   = sum_j u_j a_j - bias * sum_j a_j      (exact int32: the block's
 *                                                   integer dot product)
 *     acc = fma((float)i, d_w * d_a, acc)
 *     acc = fma(m_w, s_a, acc)                     (Q4_1 only)
 * with bias 8 for Q4_0, 128 for Q8_0 and 0 for Q4_1. Every step is one lane
 * of one vector instruction, and neither the lane nor the order depends on T,
 * on the row range of the call or on the row's place in its group of
 * sixteen, so a row's result is bit-identical however it is batched.
 *
 * Repacked weights (cpu_pack_rows, layout in matmul.h) hold every full group
 * already transposed, so cpu__matmul_rows16_packed_avx512_vnni loads them
 * straight into the dot products, in register tiles of up to DIRECT_T
 * activation rows (no scratch buffer), prefetching the next group's bytes
 * block by block meanwhile. At T = 1 (up to K = 32,768) the groups are read
 * one after another, each front to back: one sequential stream, which the
 * hardware prefetchers follow at about twice the rate they reach on two
 * interleaved streams (two groups at once, or a group's quants and its
 * scales apart). The arithmetic is the one above, step for step; the
 * integer part i may be summed in two chains for up to four rows (int32
 * addition is exact and associative), so a repacked row's result is
 * bit-identical to the row's result here.
 */
#include "matmul_impl.h"

#include <assert.h>
#include <immintrin.h>
#include <string.h>

#define GROUP 16        /* weight rows per group: one per int32 lane */
#define CHUNK_BLOCKS 32 /* blocks per scratch fill: 16 KiB of quants */
#define TILE_T 8        /* activation rows per register tile (scratch path) */
#define DIRECT_T 12     /* and in the repacked path, which holds no quants */
#define TOKEN_BLOCK 64  /* activation rows whose corrections are kept at once */

#define INLINE static inline __attribute__((always_inline))

/* acc + the sums of four products of unsigned bytes of u and signed bytes of
 * s, per int32 lane: VPDPBUSD. Written as inline asm so that this file is
 * compiled without -mavx512vnni and the compiler cannot emit VNNI anywhere
 * else. The emulation test in tests/unit/test_matmul.c, which compiles this
 * file against SIMDe, defines AVX512_DPBUSD. */
#ifdef AVX512_DPBUSD
#define dpbusd AVX512_DPBUSD
#else
INLINE __m512i dpbusd(__m512i acc, __m512i u, __m512i s)
{
    __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(s));
    return acc;
}
#endif

INLINE int32_t load_i32(const void *p)
{
    int32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* dpbusd(acc, u, the four bytes at p broadcast to every lane), with the
 * broadcast folded into the instruction's memory operand ({1to16}): one
 * instruction where a broadcast load and the product were two. The same
 * operation, so the same bits. */
#ifdef AVX512_DPBUSD
#define dpbusd_bcast(acc, u, p) AVX512_DPBUSD(acc, u, _mm512_set1_epi32(load_i32(p)))
#else
INLINE __m512i dpbusd_bcast(__m512i acc, __m512i u, const void *p)
{
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(u), "m"(*(const i32_bytes *)p));
    return acc;
}
#endif

/* One group's blocks, transposed: q[b][j] lane r = values 4j .. 4j+3 of row r
 * in block b, as unsigned bytes; d (and m, Q4_1) lane r = row r's scale. */
struct packed {
    __m512i q[CHUNK_BLOCKS][8];
    __m512 d[CHUNK_BLOCKS];
    __m512 m[CHUNK_BLOCKS];
};

/* Lane r of v[j] = the j-th dword of the 16 bytes at row[r] + off. */
INLINE void transpose16x4(const char *const row[GROUP], size_t off, __m512i v[4])
{
    __m512i z[4];
    /* z[k]'s 128-bit lane i holds row 4i + k, so the transpose below puts row
     * 4i + k in int32 lane 4i + k: rows in natural order */
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        __m512i x = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(row[k] + off)));
        x = _mm512_inserti32x4(x, _mm_loadu_si128((const __m128i *)(row[4 + k] + off)), 1);
        x = _mm512_inserti32x4(x, _mm_loadu_si128((const __m128i *)(row[8 + k] + off)), 2);
        z[k] = _mm512_inserti32x4(x, _mm_loadu_si128((const __m128i *)(row[12 + k] + off)), 3);
    }
    __m512i t0 = _mm512_unpacklo_epi32(z[0], z[1]);
    __m512i t1 = _mm512_unpackhi_epi32(z[0], z[1]);
    __m512i t2 = _mm512_unpacklo_epi32(z[2], z[3]);
    __m512i t3 = _mm512_unpackhi_epi32(z[2], z[3]);
    v[0] = _mm512_unpacklo_epi64(t0, t2);
    v[1] = _mm512_unpackhi_epi64(t0, t2);
    v[2] = _mm512_unpacklo_epi64(t1, t3);
    v[3] = _mm512_unpackhi_epi64(t1, t3);
}

/* Transposes blocks b0 .. b0+nb-1 of the group's rows into P. idx[r] is row
 * r's byte offset from row[0]. */
INLINE void pack(const enum qtype type, const char *const row[GROUP], __m512i idx, int64_t b0,
                 int nb, struct packed *P)
{
    const __m512i lo4 = _mm512_set1_epi8(0x0f);
    const size_t bs = type == QTYPE_Q8_0   ? sizeof(struct block_q8_0)
                      : type == QTYPE_Q4_0 ? sizeof(struct block_q4_0)
                                           : sizeof(struct block_q4_1);
    const size_t qoff = type == QTYPE_Q4_1 ? 4 : 2; /* the quants follow d (and m) */

    for (int bb = 0; bb < nb; bb++) {
        const size_t off = (size_t)(b0 + bb) * bs;
        __m512i v[8];
        transpose16x4(row, off + qoff, v);
        if (type == QTYPE_Q8_0) {
            transpose16x4(row, off + qoff + 16, v + 4);
            const __m512i flip = _mm512_set1_epi8((char)0x80);
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++)
                P->q[bb][j] = _mm512_xor_si512(v[j], flip);
        } else {
            /* byte i of a Q4 block: value i in the low nibble, i + 16 high */
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {
                P->q[bb][j] = _mm512_and_si512(v[j], lo4);
                P->q[bb][j + 4] = _mm512_and_si512(_mm512_srli_epi16(v[j], 4), lo4);
            }
        }
        /* d (and m) are the block's first four bytes */
        __m512i dm = _mm512_i32gather_epi32(idx, row[0] + off, 1);
        P->d[bb] = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dm));
        if (type == QTYPE_Q4_1)
            P->m[bb] = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dm, 16)));
    }
}

/* nt activation rows (a, a_stride apart, positioned at the chunk's first
 * block) against the packed group: f[t] lane r += row r's blocks. corr[t][b]
 * = -bias * sum of activation row t's block b. */
INLINE void tile(const enum qtype type, const int nt, const struct packed *P, int nb, const char *a,
                 size_t a_stride, const int32_t (*corr)[CHUNK_BLOCKS], __m512 f[TILE_T])
{
    for (int bb = 0; bb < nb; bb++) {
        __m512i i[TILE_T];
#pragma GCC unroll 8
        for (int t = 0; t < nt; t++)
            i[t] = _mm512_set1_epi32(type == QTYPE_Q4_1 ? 0 : corr[t][bb]);
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            const __m512i w = P->q[bb][j];
#pragma GCC unroll 8
            for (int t = 0; t < nt; t++) {
                const struct block_q8_act *ab =
                    (const struct block_q8_act *)(a + (size_t)t * a_stride) + bb;
                i[t] = dpbusd(i[t], w, _mm512_set1_epi32(load_i32(ab->qs + 4 * j)));
            }
        }
        const __m512 d = P->d[bb];
#pragma GCC unroll 8
        for (int t = 0; t < nt; t++) {
            const struct block_q8_act *ab =
                (const struct block_q8_act *)(a + (size_t)t * a_stride) + bb;
            f[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i[t]),
                                   _mm512_mul_ps(d, _mm512_set1_ps(ab->d)), f[t]);
            if (type == QTYPE_Q4_1)
                f[t] = _mm512_fmadd_ps(P->m[bb], _mm512_set1_ps(ab->s), f[t]);
        }
    }
}

/* Calls tile with nt as a constant. */
INLINE void tile_n(const enum qtype type, int nt, const struct packed *P, int nb, const char *a,
                   size_t a_stride, const int32_t (*corr)[CHUNK_BLOCKS], __m512 f[TILE_T])
{
    switch (nt) {
    case 8:
        tile(type, 8, P, nb, a, a_stride, corr, f);
        break;
    case 7:
        tile(type, 7, P, nb, a, a_stride, corr, f);
        break;
    case 6:
        tile(type, 6, P, nb, a, a_stride, corr, f);
        break;
    case 5:
        tile(type, 5, P, nb, a, a_stride, corr, f);
        break;
    case 4:
        tile(type, 4, P, nb, a, a_stride, corr, f);
        break;
    case 3:
        tile(type, 3, P, nb, a, a_stride, corr, f);
        break;
    case 2:
        tile(type, 2, P, nb, a, a_stride, corr, f);
        break;
    default:
        tile(type, 1, P, nb, a, a_stride, corr, f);
        break;
    }
}

/* corr[t][bb] = -bias x sum(a) of activation block b0 + bb of token t, the
 * exact integer correction for quants stored unsigned (q + bias). */
INLINE void bias_corrections(int32_t corr[TOKEN_BLOCK][CHUNK_BLOCKS], const char *a0,
                             size_t a_stride, int64_t tn, int64_t b0, int nb, int bias)
{
    for (int64_t t = 0; t < tn; t++)
        for (int bb = 0; bb < nb; bb++)
            corr[t][bb] =
                -bias * ((const struct block_q8_act *)(a0 + (size_t)t * a_stride))[b0 + bb].sum;
}

INLINE void rows16(const enum qtype type, const void *restrict w, int64_t k, int64_t n0, int64_t n1,
                   const void *restrict act, int64_t T, float *restrict y, int64_t ldy)
{
    const int bias = cpu__packed_bias(type);
    const size_t row_bytes = qtype_row_bytes(type, k);
    const size_t a_stride = quant_act_bytes(type, k);
    const int64_t nbk = k / QK;
    _Alignas(64) struct packed P;
    int32_t corr[TOKEN_BLOCK][CHUNK_BLOCKS];

    for (int64_t t0 = 0; t0 < T; t0 += TOKEN_BLOCK) {
        const int64_t tn = T - t0 < TOKEN_BLOCK ? T - t0 : TOKEN_BLOCK;
        const char *a0 = (const char *)act + (size_t)t0 * a_stride;
        for (int64_t b0 = 0; b0 < nbk; b0 += CHUNK_BLOCKS) {
            const int nb = nbk - b0 < CHUNK_BLOCKS ? (int)(nbk - b0) : CHUNK_BLOCKS;
            if (bias)
                bias_corrections(corr, a0, a_stride, tn, b0, nb, bias);
            for (int64_t g = n0; g < n1; g += GROUP) {
                const int nr = n1 - g < GROUP ? (int)(n1 - g) : GROUP;
                const __mmask16 live = (__mmask16)((1u << nr) - 1);
                const char *row[GROUP];
                int32_t idx_r[GROUP];
                /* lanes past the last row repeat it; their results are not stored */
                for (int r = 0; r < GROUP; r++) {
                    int rr = r < nr ? r : nr - 1;
                    idx_r[r] = (int32_t)((size_t)rr * row_bytes);
                    row[r] = (const char *)w + (size_t)(g + rr) * row_bytes;
                }
                pack(type, row, _mm512_loadu_si512(idx_r), b0, nb, &P);
                for (int64_t tt = 0; tt < tn; tt += TILE_T) {
                    const int nt = tn - tt < TILE_T ? (int)(tn - tt) : TILE_T;
                    float *yt = y + (t0 + tt) * ldy + g;
                    __m512 f[TILE_T];
                    for (int t = 0; t < nt; t++)
                        f[t] = b0 == 0 ? _mm512_setzero_ps()
                                       : _mm512_maskz_loadu_ps(live, yt + t * ldy);
                    tile_n(type, nt, &P, nb,
                           a0 + (size_t)tt * a_stride + (size_t)b0 * sizeof(struct block_q8_act),
                           a_stride, (const int32_t(*)[CHUNK_BLOCKS])corr[tt], f);
                    for (int t = 0; t < nt; t++)
                        _mm512_mask_storeu_ps(yt + t * ldy, live, f[t]);
                }
            }
        }
    }
}

void cpu__matmul_rows16_avx512_vnni(enum qtype t, const void *restrict w, int64_t k, int64_t n0,
                                    int64_t n1, const void *restrict act, int64_t T,
                                    float *restrict y, int64_t ldy)
{
    switch (t) {
    case QTYPE_Q4_0:
        rows16(QTYPE_Q4_0, w, k, n0, n1, act, T, y, ldy);
        break;
    case QTYPE_Q4_1:
        rows16(QTYPE_Q4_1, w, k, n0, n1, act, T, y, ldy);
        break;
    default:
        rows16(QTYPE_Q8_0, w, k, n0, n1, act, T, y, ldy);
        break;
    }
}

/* ---- repacked weights ----------------------------------------------------- */

/* One full group of repacked rows: block after block, each block's quants,
 * then its sixteen f16 scales d, then (Q4_1) its sixteen f16 minimums m, so
 * that a group is one sequential stream. */
struct group_src {
    const char *base; /* block b at base + b * cpu__packed_bs(type) */
};

INLINE struct group_src group_at(const void *wp, size_t row_bytes, int64_t g)
{
    return (struct group_src){(const char *)wp + (size_t)g * row_bytes};
}

/* The lanes of the group of rows [g, g + 16) that fall in [n0, n1). */
INLINE __mmask16 group_live(int64_t g, int64_t n0, int64_t n1)
{
    const int lo = n0 > g ? (int)(n0 - g) : 0;
    const int hi = n1 - g < GROUP ? (int)(n1 - g) : GROUP;
    return (__mmask16)(((1u << hi) - 1) & ~((1u << lo) - 1));
}

/* Block b of a repacked group as the vectors pack() makes of it. */
INLINE void load_block(const enum qtype type, const struct group_src *s, int64_t b, __m512i q[8],
                       __m512 *d, __m512 *m)
{
    const char *qb = s->base + (size_t)b * cpu__packed_bs(type);
    if (type == QTYPE_Q8_0) {
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++)
            q[j] = _mm512_loadu_si512((const void *)(qb + 64 * j));
    } else {
        const __m512i lo4 = _mm512_set1_epi8(0x0f);
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            const __m512i v = _mm512_loadu_si512((const void *)(qb + 64 * j));
            q[j] = _mm512_and_si512(v, lo4);
            q[j + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), lo4);
        }
    }
    *d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(qb + cpu__packed_qb(type))));
    if (type == QTYPE_Q4_1)
        *m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(qb + cpu__packed_qb(type) + 32)));
}

/* Starts loading block b of a repacked group into L2: the lines its bytes
 * span (a Q4_0 block is 4.5 lines, so its first and last may be shared).
 * Into L2, not L1: with the L1 hint the 49,152-row Q8_0 output matrix at
 * T = 2 .. 32 ran 1.1-2x slower on Zen 4 (bench_matmul batch, weights from
 * memory); the layer shapes did not get slower. Why the L1 hint cost that
 * much was not pinned down (the next group, the one being computed and the
 * activation rows fit a 32 KiB L1 together up to T = 16). */
INLINE void prefetch_block(const enum qtype type, const struct group_src *s, int64_t b)
{
    const char *qb = s->base + (size_t)b * cpu__packed_bs(type);
    for (size_t o = 0; o < cpu__packed_bs(type); o += 64)
        _mm_prefetch(qb + o, _MM_HINT_T1);
    _mm_prefetch(qb + cpu__packed_bs(type) - 1, _MM_HINT_T1);
}

/* tile() for one activation row, reading the repacked group directly. */
INLINE __m512 tile1(const enum qtype type, const struct group_src *s, int64_t b0, int nb,
                    const char *a, const int32_t *corr, __m512 f)
{
    for (int bb = 0; bb < nb; bb++) {
        const struct block_q8_act *ab = (const struct block_q8_act *)a + bb;
        __m512i q[8];
        __m512 d, m = _mm512_setzero_ps();
        load_block(type, s, b0 + bb, q, &d, &m);
        __m512i i0 = _mm512_set1_epi32(type == QTYPE_Q4_1 ? 0 : corr[bb]);
        __m512i i1 = _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int j = 0; j < 8; j += 2) {
            i0 = dpbusd_bcast(i0, q[j], ab->qs + 4 * j);
            i1 = dpbusd_bcast(i1, q[j + 1], ab->qs + 4 * j + 4);
        }
        const __m512i i = _mm512_add_epi32(i0, i1);
        f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), _mm512_mul_ps(d, _mm512_set1_ps(ab->d)), f);
        if (type == QTYPE_Q4_1)
            f = _mm512_fmadd_ps(m, _mm512_set1_ps(ab->s), f);
    }
    return f;
}

/* tile() for nt (2 .. DIRECT_T) activation rows, reading the repacked group
 * directly, and loading and storing the rows' outputs itself: y[t * ldy]
 * for t < nt, in the lanes live. Each block's quants are loaded (the nibbles
 * split) once for the nt rows, one vector at a time, so that the registers
 * hold nt accumulators of outputs and nt of integer sums: 12 independent
 * VNNI chains instead of the 8 that fit beside eight vectors of quants
 * (Q4_0 at T = 32: about 4% less time). The outputs are loaded and stored
 * here, where nt is a constant, so that they stay in registers: from an
 * array that the caller indexed with a variable nt, GCC stored them to
 * the stack after every block. Up to four rows, each row's integer dot
 * product runs in two chains (int32 addition is exact and associative), so
 * that a few rows still keep enough chains in flight.
 * next (or NULL): the group after this one, whose blocks pf_phase,
 * pf_phase + pf_stride, ... this tile prefetches with its own, so that a
 * batched decode step, which streams its weights from memory, has them
 * arrive while this group is computed: the group's tiles share the next
 * group's lines between them (tile i takes every pf_stride-th block from
 * block i), and the prefetches are spread over all of the group's work. All
 * of them in the first tile held it up on line-fill buffers: spread, the
 * products of a 32-stream step (then four tiles) took 3-6% less time. */
INLINE void tile_direct(const enum qtype type, const int nt, const struct group_src *s,
                        const struct group_src *next, int pf_phase, int pf_stride, int64_t b0,
                        int nb, const char *a, size_t a_stride, const int32_t (*corr)[CHUNK_BLOCKS],
                        float *yt, int64_t ldy, __mmask16 live)
{
    const int two = nt <= 4;
    const __m512i lo4 = _mm512_set1_epi8(0x0f);
    __m512 f[DIRECT_T];
#pragma GCC unroll 12
    for (int t = 0; t < nt; t++)
        f[t] = b0 == 0 ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(live, yt + t * ldy);
    int pf_next = next ? pf_phase : nb;
    for (int bb = 0; bb < nb; bb++) {
        if (bb == pf_next) {
            prefetch_block(type, next, b0 + bb);
            pf_next += pf_stride;
        }
        const char *qb = s->base + (size_t)(b0 + bb) * cpu__packed_bs(type);
        __m512i i0[DIRECT_T], i1[DIRECT_T];
#pragma GCC unroll 12
        for (int t = 0; t < nt; t++) {
            i0[t] = _mm512_set1_epi32(type == QTYPE_Q4_1 ? 0 : corr[t][bb]);
            i1[t] = _mm512_setzero_si512();
        }
        /* the quants one vector at a time (Q4: a vector's low nibbles,
         * then its high ones), so that the tile's rows have the registers */
#pragma GCC unroll 8
        for (int jj = 0; jj < 8; jj++) {
            const int j = type == QTYPE_Q8_0 ? jj : jj % 2 ? 4 + jj / 2 : jj / 2;
            __m512i q;
            if (type == QTYPE_Q8_0) {
                q = _mm512_loadu_si512((const void *)(qb + 64 * j));
            } else {
                const __m512i v = _mm512_loadu_si512((const void *)(qb + 64 * (j % 4)));
                q = j < 4 ? _mm512_and_si512(v, lo4)
                          : _mm512_and_si512(_mm512_srli_epi16(v, 4), lo4);
            }
#pragma GCC unroll 12
            for (int t = 0; t < nt; t++) {
                const struct block_q8_act *ab =
                    (const struct block_q8_act *)(a + (size_t)t * a_stride) + bb;
                if (two && jj % 2)
                    i1[t] = dpbusd_bcast(i1[t], q, ab->qs + 4 * j);
                else
                    i0[t] = dpbusd_bcast(i0[t], q, ab->qs + 4 * j);
            }
        }
        const __m512 d =
            _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(qb + cpu__packed_qb(type))));
        const __m512 m = type == QTYPE_Q4_1 ? _mm512_cvtph_ps(_mm256_loadu_si256((
                                                  const __m256i *)(qb + cpu__packed_qb(type) + 32)))
                                            : _mm512_setzero_ps();
#pragma GCC unroll 12
        for (int t = 0; t < nt; t++) {
            const struct block_q8_act *ab =
                (const struct block_q8_act *)(a + (size_t)t * a_stride) + bb;
            const __m512i i = two ? _mm512_add_epi32(i0[t], i1[t]) : i0[t];
            f[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), _mm512_mul_ps(d, _mm512_set1_ps(ab->d)),
                                   f[t]);
            if (type == QTYPE_Q4_1)
                f[t] = _mm512_fmadd_ps(m, _mm512_set1_ps(ab->s), f[t]);
        }
    }
#pragma GCC unroll 12
    for (int t = 0; t < nt; t++)
        _mm512_mask_storeu_ps(yt + t * ldy, live, f[t]);
}

/* Calls tile_direct with nt as a constant. */
INLINE void tile_direct_n(const enum qtype type, int nt, const struct group_src *s,
                          const struct group_src *next, int pf_phase, int pf_stride, int64_t b0,
                          int nb, const char *a, size_t a_stride,
                          const int32_t (*corr)[CHUNK_BLOCKS], float *yt, int64_t ldy,
                          __mmask16 live)
{
    assert(nt >= 2 && nt <= DIRECT_T); /* one row is tile1's */
    switch (nt) {
    case 12:
        tile_direct(type, 12, s, next, pf_phase, pf_stride, b0, nb, a, a_stride, corr, yt, ldy,
                    live);
        break;
    case 11:
        tile_direct(type, 11, s, next, pf_phase, pf_stride, b0, nb, a, a_stride, corr, yt, ldy,
                    live);
        break;
    case 10:
        tile_direct(type, 10, s, next, pf_phase, pf_stride, b0, nb, a, a_stride, corr, yt, ldy,
                    live);
        break;
    case 9:
        tile_direct(type, 9, s, next, pf_phase, pf_stride, b0, nb, a, a_stride, corr, yt, ldy,
                    live);
        break;
    case 8:
        tile_direct(type, 8, s, next, pf_phase, pf_stride, b0, nb, a, a_stride, corr, yt, ldy,
                    live);
        break;
    case 7:
        tile_direct(type, 7, s, next, pf_phase, pf_stride, b0, nb, a, a_stride, corr, yt, ldy,
                    live);
        break;
    case 6:
        tile_direct(type, 6, s, next, pf_phase, pf_stride, b0, nb, a, a_stride, corr, yt, ldy,
                    live);
        break;
    case 5:
        tile_direct(type, 5, s, next, pf_phase, pf_stride, b0, nb, a, a_stride, corr, yt, ldy,
                    live);
        break;
    case 4:
        tile_direct(type, 4, s, next, pf_phase, pf_stride, b0, nb, a, a_stride, corr, yt, ldy,
                    live);
        break;
    case 3:
        tile_direct(type, 3, s, next, pf_phase, pf_stride, b0, nb, a, a_stride, corr, yt, ldy,
                    live);
        break;
    default:
        tile_direct(type, 2, s, next, pf_phase, pf_stride, b0, nb, a, a_stride, corr, yt, ldy,
                    live);
        break;
    }
}

/* Rows [n0, n1) within the full groups of a repacked matrix. */
INLINE void rows16_packed(const enum qtype type, const void *restrict wp, int64_t k, int64_t n0,
                          int64_t n1, const void *restrict act, int64_t T, float *restrict y,
                          int64_t ldy)
{
    const int bias = cpu__packed_bias(type);
    const size_t row_bytes = qtype_row_bytes(type, k);
    const size_t a_stride = quant_act_bytes(type, k);
    const int64_t nbk = k / QK;
    int32_t corr[TOKEN_BLOCK][CHUNK_BLOCKS];

    for (int64_t t0 = 0; t0 < T; t0 += TOKEN_BLOCK) {
        const int64_t tn = T - t0 < TOKEN_BLOCK ? T - t0 : TOKEN_BLOCK;
        const char *a0 = (const char *)act + (size_t)t0 * a_stride;
        for (int64_t b0 = 0; b0 < nbk; b0 += CHUNK_BLOCKS) {
            const int nb = nbk - b0 < CHUNK_BLOCKS ? (int)(nbk - b0) : CHUNK_BLOCKS;
            if (bias)
                bias_corrections(corr, a0, a_stride, tn, b0, nb, bias);
            const char *ab0 = a0 + (size_t)b0 * sizeof(struct block_q8_act);
            for (int64_t g = n0 / GROUP * GROUP; g < n1; g += GROUP) {
                const __mmask16 live = group_live(g, n0, n1);
                const struct group_src src = group_at(wp, row_bytes, g);
                /* register tiles of up to DIRECT_T rows, as even as they
                 * divide (32 rows: 11, 11 and 10), straight from the
                 * repacked quants (one row: tile1); the tiles of two rows
                 * or more share the loading of the next group between them
                 * (tile_direct), and find this group in L1 or L2 */
                const struct group_src nxt =
                    g + GROUP < n1 ? group_at(wp, row_bytes, g + GROUP) : src;
                const int n_direct = (int)((tn + DIRECT_T - 1) / DIRECT_T);
                const int64_t base = tn / n_direct, extra = tn % n_direct;
                for (int64_t tt = 0, ti = 0; tt < tn; ti++) {
                    const int nt = (int)(base + (ti < extra));
                    float *yt = y + (t0 + tt) * ldy + g;
                    if (nt == 1) {
                        const __m512 f0 =
                            b0 == 0 ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(live, yt);
                        _mm512_mask_storeu_ps(
                            yt, live,
                            tile1(type, &src, b0, nb, ab0 + (size_t)tt * a_stride, corr[tt], f0));
                    } else {
                        tile_direct_n(type, nt, &src, g + GROUP < n1 ? &nxt : NULL, (int)ti,
                                      n_direct, b0, nb, ab0 + (size_t)tt * a_stride, a_stride,
                                      (const int32_t(*)[CHUNK_BLOCKS])corr[tt], yt, ldy, live);
                    }
                    tt += nt;
                }
            }
        }
    }
}

/* T = 1 on the full groups of a repacked matrix, rows [n0, n1): each group
 * is read from its first block to its last and the groups in order, so the
 * weights are one sequential stream. (rows16_packed takes K in chunks of
 * blocks; at T = 1 that would break each group's stream at every chunk.)
 * The same tile1 steps over the blocks in the same order: the same bits. */
#define T1_MAX_BLOCKS 1024 /* K up to 32,768 */
INLINE void rows16_packed_t1(const enum qtype type, const void *restrict wp, int64_t k, int64_t n0,
                             int64_t n1, const void *restrict act, float *restrict y)
{
    const int bias = cpu__packed_bias(type);
    const size_t row_bytes = qtype_row_bytes(type, k);
    const int nbk = (int)(k / QK);
    int32_t corr[T1_MAX_BLOCKS];
    assert(nbk <= T1_MAX_BLOCKS);
    for (int b = 0; b < nbk; b++)
        corr[b] = -bias * ((const struct block_q8_act *)act)[b].sum;
    for (int64_t g = n0 / GROUP * GROUP; g < n1; g += GROUP) {
        const __mmask16 live = group_live(g, n0, n1);
        const struct group_src src = group_at(wp, row_bytes, g);
        _mm512_mask_storeu_ps(
            y + g, live, tile1(type, &src, 0, nbk, (const char *)act, corr, _mm512_setzero_ps()));
    }
}

void cpu__matmul_rows16_packed_avx512_vnni(enum qtype t, const void *restrict wp, int64_t k,
                                           int64_t N, int64_t n0, int64_t n1,
                                           const void *restrict act, int64_t T, float *restrict y,
                                           int64_t ldy)
{
    /* rows past the last full group are stored as they are, where they were */
    const int64_t full = N / GROUP * GROUP;
    if (n1 > full) {
        cpu__matmul_rows16_avx512_vnni(t, wp, k, n0 > full ? n0 : full, n1, act, T, y, ldy);
        n1 = full;
    }
    if (n0 >= n1)
        return;
    if (T == 1 && k / QK <= T1_MAX_BLOCKS) {
        switch (t) {
        case QTYPE_Q4_0:
            rows16_packed_t1(QTYPE_Q4_0, wp, k, n0, n1, act, y);
            break;
        case QTYPE_Q4_1:
            rows16_packed_t1(QTYPE_Q4_1, wp, k, n0, n1, act, y);
            break;
        default:
            rows16_packed_t1(QTYPE_Q8_0, wp, k, n0, n1, act, y);
            break;
        }
        return;
    }
    switch (t) {
    case QTYPE_Q4_0:
        rows16_packed(QTYPE_Q4_0, wp, k, n0, n1, act, T, y, ldy);
        break;
    case QTYPE_Q4_1:
        rows16_packed(QTYPE_Q4_1, wp, k, n0, n1, act, T, y, ldy);
        break;
    default:
        rows16_packed(QTYPE_Q8_0, wp, k, n0, n1, act, T, y, ldy);
        break;
    }
}
