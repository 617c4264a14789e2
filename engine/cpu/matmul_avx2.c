/*
 * matmul_avx2.c: AVX2 + FMA + F16C kernels behind cpu_prepare_act and
 * cpu_matmul_rows (matmul.h). Compiled with -mavx2 -mfma -mf16c; matmul.c
 * calls into this file only after CPUID says the CPU has all three.
 *
 * Quantized weights: the activation row is quantized to 8 bits per 32-value
 * block (struct block_q8_act), so each block's dot product is an exact integer
 * sum (VPMADDUBSW: unsigned x signed bytes -> int16 pairs; VPMADDWD by ones ->
 * int32), scaled once by d_w * d_a in float. VPMADDUBSW wants its first
 * operand unsigned: Q4_1 nibbles are; Q8_0 and Q4_0 (nib - 8) are signed, so
 * the kernel multiplies |w| by sign(w) * a (VPSIGNB), as ggml does. No int16
 * pair can saturate: |w| <= 128 and |a| <= 127 give at most 32512.
 *
 * Register tiles: one tile is up to TILE_T activation rows x TILE_N weight
 * rows, so an unpacked weight block is used TILE_T times and an activation
 * block TILE_N times per load. The tile kernels are always_inline and called
 * with constant sizes: each size is its own unrolled copy with the
 * accumulators in registers. Around them, weight rows are cut into chunks of
 * CHUNK_BYTES that meet every activation tile while both are in L1.
 *
 * Float summation order differs from quant_dot_ref (8 lanes, then a tree), so
 * results match the reference to rounding, not bit for bit. prepare_act does
 * match it bit for bit.
 */
#include "matmul_impl.h"
#include "simd_avx2.h"

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

/* An empty asm that clobbers memory. Without it GCC merges the activation
 * loads of the two weight rows of a tile and keeps TILE_T more vectors live
 * than AVX2's 16 registers hold, spilling accumulators; re-reading an
 * activation block from L1 costs a load, not a register. */
#define RELOAD_BARRIER() __asm__ volatile("" ::: "memory")

INLINE float hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Lane i of the result: the sum of the 8 lanes of v_i. */
INLINE __m128 hsum4(__m256 v0, __m256 v1, __m256 v2, __m256 v3)
{
    __m256 s = _mm256_hadd_ps(_mm256_hadd_ps(v0, v1), _mm256_hadd_ps(v2, v3));
    return _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
}

INLINE int hsum_i32(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

/* y[t * ldy + r] = lane sum of acc[t][r], plus lane t of extra[r] if given. */
INLINE void store_tile(const int nt, const int nr, __m256 acc[TILE_T][TILE_N], const __m128 *extra,
                       const struct tile *p)
{
    const __m256 z = _mm256_setzero_ps();
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

/* 16 bytes of packed nibbles -> 32 bytes in element order (low nibbles, then
 * high): broadcast to both halves (a load, no shuffle), shift the upper half. */
INLINE __m256i unpack_nibbles(const uint8_t *qs)
{
    __m256i both = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs));
    both = _mm256_srlv_epi32(both, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4));
    return _mm256_and_si256(both, _mm256_set1_epi8(0x0f));
}

/* ---- activation preparation --------------------------------------------- */

/* Same arithmetic as quant_prepare_act_ref, so the bytes are identical: amax
 * by exact max (cpu_amax32: a NaN value ignored, as block_amax ignores it),
 * d = amax / 127 and 1/d in scalar float, x * (1/d) in float, VCVTPS2DQ
 * rounding half to even (the default MXCSR mode, as nearbyintf in the
 * default FE mode). */
static void prepare_q8(const float *x, int64_t k, struct block_q8_act *out)
{
    for (int64_t b = 0; b < k / QK; b++) {
        const float *xb = x + b * QK;
        __m256 v[4];
        for (int j = 0; j < 4; j++)
            v[j] = _mm256_loadu_ps(xb + 8 * j);
        float d = cpu_amax32(v) / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        __m256 vid = _mm256_set1_ps(id);
        __m256i q[4];
        for (int j = 0; j < 4; j++)
            q[j] = _mm256_cvtps_epi32(_mm256_mul_ps(v[j], vid));
        int sum =
            hsum_i32(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
        cpu_store_i8x32(out[b].qs, q);
        out[b].d = d;
        out[b].s = d * (float)sum;
        out[b].sum = sum;
    }
}

void cpu__prepare_act_avx2(enum qtype t, const float *restrict x, int64_t k, void *restrict dst)
{
    if (t == QTYPE_Q8_0 || t == QTYPE_Q4_0 || t == QTYPE_Q4_1)
        prepare_q8(x, k, dst);
    else
        memcpy(dst, x, (size_t)k * sizeof(float));
}

/* ---- quantized weights ----------------------------------------------------- */

/* Block b of a weight row as 32 bytes ready for VPMADDUBSW's unsigned operand
 * (|w| for signed types, with the sign in *sign), and its scale d_w. */
INLINE __m256i load_weight_block(const enum qtype type, const char *row, int64_t b, __m256i *sign,
                                 __m256 *d)
{
    if (type == QTYPE_Q4_1) {
        const struct block_q4_1 *wb = (const struct block_q4_1 *)row + b;
        *d = _mm256_set1_ps(_cvtsh_ss(wb->d));
        return unpack_nibbles(wb->qs);
    }
    __m256i q;
    if (type == QTYPE_Q8_0) {
        const struct block_q8_0 *wb = (const struct block_q8_0 *)row + b;
        *d = _mm256_set1_ps(_cvtsh_ss(wb->d));
        q = _mm256_loadu_si256((const __m256i *)wb->qs);
    } else {
        const struct block_q4_0 *wb = (const struct block_q4_0 *)row + b;
        *d = _mm256_set1_ps(_cvtsh_ss(wb->d));
        q = _mm256_sub_epi8(unpack_nibbles(wb->qs), _mm256_set1_epi8(8));
    }
    *sign = q;
    return _mm256_sign_epi8(q, q);
}

/* Q4_1's offset term for a tile: lane t of out[r] is the sum over blocks of
 * m_w * s_a for weight row r and activation row t. A pass of its own keeps
 * the main loop's registers free. */
INLINE void q4_1_offsets(const int nt, const int nr, const struct tile *p, __m128 out[TILE_N])
{
    const size_t as = p->a_stride;
    __m256 acc = _mm256_setzero_ps(); /* lanes 0-3: weight row 0; 4-7: row 1 */

    for (int64_t b = 0; b < p->k / QK; b++) {
        const struct block_q8_act *a0 = (const struct block_q8_act *)p->a + b;
        const struct block_q4_1 *w0 = (const struct block_q4_1 *)p->w + b;
        /* nt and nr are constants: loads and inserts, no stores */
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

/* Decode (one activation row) for Q4_1: [d_w, m_w] * [d_a, s_a] forms both
 * scales in one multiply. Lane 1 of accm sums m_w * s_a; lane 0 is unused. */
INLINE void tile_q4_1_t1(const int nr, const struct tile *p)
{
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[TILE_T][TILE_N];
    __m128 accm[TILE_N];

#pragma GCC unroll 4
    for (int r = 0; r < nr; r++) {
        acc[0][r] = _mm256_setzero_ps();
        accm[r] = _mm_setzero_ps();
    }
    for (int64_t b = 0; b < p->k / QK; b++) {
        const struct block_q8_act *ab = (const struct block_q8_act *)p->a + b;
        __m256i qa = _mm256_loadu_si256((const __m256i *)ab->qs);
        __m128 ds = _mm_castpd_ps(_mm_load_sd((const double *)(const void *)&ab->d));
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++) {
            const struct block_q4_1 *wb = (const struct block_q4_1 *)(p->w + r * p->w_stride) + b;
            int32_t dm_bits;
            memcpy(&dm_bits, wb, sizeof dm_bits); /* d and m: adjacent f16 */
            __m128 dm = _mm_cvtph_ps(_mm_cvtsi32_si128(dm_bits));
            __m128 prod = _mm_mul_ps(dm, ds);
            __m256i i = _mm256_madd_epi16(_mm256_maddubs_epi16(unpack_nibbles(wb->qs), qa), ones);
            acc[0][r] =
                _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_broadcastss_ps(prod), acc[0][r]);
            /* fused like q4_1_offsets, so one row gives bit-identical results
             * whether it is decoded alone or in a batch */
            accm[r] = _mm_fmadd_ps(dm, ds, accm[r]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < nr; r++)
        accm[r] = _mm_permute_ps(accm[r], 0x55);
    store_tile(1, nr, acc, accm, p);
}

INLINE void tile_quant(const enum qtype type, const int nt, const int nr, const struct tile *p)
{
    if (type == QTYPE_Q4_1 && nt == 1) {
        tile_q4_1_t1(nr, p);
        return;
    }

    const __m256i ones = _mm256_set1_epi16(1);
    const char *w = p->w;
    const char *a = p->a;
    const size_t w_stride = p->w_stride;
    const size_t a_stride = p->a_stride;
    __m256 acc[TILE_T][TILE_N];

#pragma GCC unroll 4
    for (int t = 0; t < nt; t++)
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++)
            acc[t][r] = _mm256_setzero_ps();

    /* Weight row outer, activation row inner: one unpacked weight block live
     * at a time, so the accumulators stay in registers. */
    for (int64_t b = 0; b < p->k / QK; b++) {
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++) {
            __m256i sign;
            __m256 dw;
            if (nt > 1)
                RELOAD_BARRIER();
            __m256i wq = load_weight_block(type, w + r * w_stride, b, &sign, &dw);
#pragma GCC unroll 4
            for (int t = 0; t < nt; t++) {
                const struct block_q8_act *ab =
                    (const struct block_q8_act *)(a + (size_t)t * a_stride) + b;
                __m256i qa = _mm256_loadu_si256((const __m256i *)ab->qs);
                if (type != QTYPE_Q4_1)
                    qa = _mm256_sign_epi8(qa, sign);
                __m256i i = _mm256_madd_epi16(_mm256_maddubs_epi16(wq, qa), ones);
                __m256 scale = _mm256_mul_ps(dw, _mm256_broadcast_ss(&ab->d));
                acc[t][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), scale, acc[t][r]);
            }
        }
    }

    if (type == QTYPE_Q4_1) {
        __m128 offsets[TILE_N];
        q4_1_offsets(nt, nr, p, offsets);
        store_tile(nt, nr, acc, offsets, p);
    } else {
        store_tile(nt, nr, acc, NULL, p);
    }
}

/* ---- F32, F16, BF16 weights against f32 activations --------------------- */

INLINE __m256 load_float8(const enum qtype type, const char *row, int64_t i)
{
    if (type == QTYPE_F32)
        return _mm256_loadu_ps((const float *)row + i);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)row + i));
    if (type == QTYPE_F16)
        return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
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
    const char *w = p->w;
    const char *a = p->a;
    const size_t w_stride = p->w_stride;
    const size_t a_stride = p->a_stride;
    const int64_t k8 = p->k & ~(int64_t)7;
    __m256 acc[TILE_T][TILE_N];

#pragma GCC unroll 4
    for (int t = 0; t < nt; t++)
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++)
            acc[t][r] = _mm256_setzero_ps();

    for (int64_t i = 0; i < k8; i += 8) {
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++) {
            if (nt > 1)
                RELOAD_BARRIER();
            __m256 wv = load_float8(type, w + r * w_stride, i);
#pragma GCC unroll 4
            for (int t = 0; t < nt; t++) {
                __m256 xv = _mm256_loadu_ps((const float *)(a + (size_t)t * a_stride) + i);
                acc[t][r] = _mm256_fmadd_ps(wv, xv, acc[t][r]);
            }
        }
    }
    if (k8 == p->k) {
        store_tile(nt, nr, acc, NULL, p);
        return;
    }

    /* k not a multiple of 8: the last values one at a time */
#pragma GCC unroll 4
    for (int t = 0; t < nt; t++) {
        const float *x = (const float *)(a + (size_t)t * a_stride);
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++) {
            float sum = hsum(acc[t][r]);
            for (int64_t i = k8; i < p->k; i++)
                sum += load_float1(type, w + r * w_stride, i) * x[i];
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

static void run_q4_1(int nt, int nr, const struct tile *p)
{
    TILE_CASES(tile_quant, QTYPE_Q4_1, nt, nr, p);
}

static void run_q8_0(int nt, int nr, const struct tile *p)
{
    TILE_CASES(tile_quant, QTYPE_Q8_0, nt, nr, p);
}

static void run_q4_0(int nt, int nr, const struct tile *p)
{
    TILE_CASES(tile_quant, QTYPE_Q4_0, nt, nr, p);
}

static void run_f32(int nt, int nr, const struct tile *p)
{
    TILE_CASES(tile_float, QTYPE_F32, nt, nr, p);
}

static void run_f16(int nt, int nr, const struct tile *p)
{
    TILE_CASES(tile_float, QTYPE_F16, nt, nr, p);
}

static void run_bf16(int nt, int nr, const struct tile *p)
{
    TILE_CASES(tile_float, QTYPE_BF16, nt, nr, p);
}

void cpu__matmul_rows_avx2(enum qtype t, const void *restrict w, int64_t k, int64_t n0, int64_t n1,
                           const void *restrict act, int64_t T, float *restrict y, int64_t ldy)
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
    /* Cache blocking: a chunk of weight rows small enough for L1 meets every
     * activation tile before the next chunk is read. */
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
