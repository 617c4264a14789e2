/*
 * test_quant.c: the scalar reference in engine/quant.c against independent
 * naive arithmetic: half and bfloat16 conversions (exhaustive round trips,
 * round-to-nearest-even at every tie), quantize -> dequantize error bounds
 * per block format, activation preparation, and quant_dot_ref against
 * double-precision dot products with tolerances derived in the comments.
 */
#include "support/rng.h"
#include "test.h"

#include <float.h>
#include <stdint.h>

#include "engine/quant.h"

#define K_MAX 1536

static uint64_t rng = 0x243f6a8885a308d3ull;

static uint32_t rand_u32(void)
{
    return (uint32_t)(test_rng_u64(&rng) >> 32);
}

/* Uniform in [-1, 1). */
static float rand_unit(void)
{
    return test_rng_sym(&rng);
}

static float bits_to_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint32_t f32_to_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* Fills x[0..k) with blocks of varied character: plain uniform, a large
 * outlier among small values, all zeros, all one sign, constant, and scales
 * from 1e-3 to 1e3. */
static void fill_blocks(float *x, int64_t k, int variant)
{
    for (int64_t b = 0; b < k / 32; b++) {
        float scale = (float)pow(10.0, (double)((b + variant) % 7) - 3.0);
        int kind = (int)((b + (int64_t)variant * 3) % 6);
        for (int j = 0; j < 32; j++) {
            float v = rand_unit() * scale;
            switch (kind) {
            case 1:
                v = j == 7 ? 50.0f * scale : 0.01f * v;
                break;
            case 2:
                v = 0.0f;
                break;
            case 3:
                v = fabsf(v) + 0.5f * scale;
                break;
            case 4:
                v = -0.75f * scale;
                break;
            default:
                break;
            }
            x[b * 32 + j] = v;
        }
    }
}

/* ---- half and bfloat16 --------------------------------------------------- */

TEST(f16_to_f32_matches_known_values)
{
    ASSERT_EQ(quant_f16_to_f32(0x3c00), 1.0f);
    ASSERT_EQ(quant_f16_to_f32(0xc000), -2.0f);
    ASSERT_EQ(quant_f16_to_f32(0x7bff), 65504.0f);
    ASSERT(quant_f16_to_f32(0x0001) == 0x1p-24f);
    ASSERT(quant_f16_to_f32(0x03ff) == 1023.0f * 0x1p-24f);
    ASSERT(quant_f16_to_f32(0x0400) == 0x1p-14f);
    ASSERT(quant_f16_to_f32(0x3555) == 0x1.554p-2f);
    ASSERT(isinf(quant_f16_to_f32(0x7c00)) && quant_f16_to_f32(0x7c00) > 0);
    ASSERT(isinf(quant_f16_to_f32(0xfc00)) && quant_f16_to_f32(0xfc00) < 0);
    ASSERT(isnan(quant_f16_to_f32(0x7e00)));
    ASSERT(signbit(quant_f16_to_f32(0x8000)) && quant_f16_to_f32(0x8000) == 0.0f);
}

/* The f16 value of h as a double, computed from the definition. */
static double f16_value(uint16_t h)
{
    int e = (h >> 10) & 0x1f;
    int m = h & 0x3ff;
    double v = e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
    return (h & 0x8000) ? -v : v;
}

TEST(f16_round_trips_every_value_exactly)
{
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = quant_f16_to_f32((uint16_t)h);
        if (((h >> 10) & 0x1f) == 0x1f && (h & 0x3ff)) {
            ASSERT(isnan(f));
            ASSERT(isnan(quant_f16_to_f32(quant_f32_to_f16(f))));
            continue;
        }
        if (((h >> 10) & 0x1f) != 0x1f && (double)f != f16_value((uint16_t)h))
            FAIL_AT("h=0x%04x decodes to %.9g, want %.9g", h, f, f16_value((uint16_t)h));
        if (quant_f32_to_f16(f) != h)
            FAIL_AT("h=0x%04x -> %.9g -> 0x%04x", h, f, quant_f32_to_f16(f));
    }
}

/* Between two adjacent finite halves h and h+1 (same sign, positive here):
 * the exact midpoint rounds to the even one, anything off it to the nearer. */
TEST(f32_to_f16_rounds_to_nearest_even_at_every_tie)
{
    for (uint32_t h = 0; h < 0x7bff; h++) {
        double lo = f16_value((uint16_t)h);
        double hi = f16_value((uint16_t)(h + 1));
        float mid = (float)((lo + hi) / 2); /* exact: 12 significant bits */
        ASSERT((double)mid == (lo + hi) / 2);
        uint16_t even = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
        if (quant_f32_to_f16(mid) != even)
            FAIL_AT("tie between 0x%04x and 0x%04x: got 0x%04x", h, h + 1, quant_f32_to_f16(mid));
        if (quant_f32_to_f16(-mid) != (even | 0x8000))
            FAIL_AT("negative tie at 0x%04x", h);
        if (quant_f32_to_f16(nextafterf(mid, 0.0f)) != h)
            FAIL_AT("just below the tie after 0x%04x: got 0x%04x", h,
                    quant_f32_to_f16(nextafterf(mid, 0.0f)));
        if (quant_f32_to_f16(nextafterf(mid, INFINITY)) != h + 1)
            FAIL_AT("just above the tie after 0x%04x", h);
    }
}

TEST(f32_to_f16_handles_overflow_underflow_and_nan)
{
    ASSERT_EQ(quant_f32_to_f16(65504.0f), 0x7bff);
    ASSERT_EQ(quant_f32_to_f16(65519.99f), 0x7bff); /* below the tie with 65536 */
    ASSERT_EQ(quant_f32_to_f16(65520.0f), 0x7c00);  /* the tie rounds to even: inf */
    ASSERT_EQ(quant_f32_to_f16(1e10f), 0x7c00);
    ASSERT_EQ(quant_f32_to_f16(-1e10f), 0xfc00);
    ASSERT_EQ(quant_f32_to_f16(INFINITY), 0x7c00);
    ASSERT_EQ(quant_f32_to_f16(0x1p-25f), 0x0000); /* tie with 0 and 2^-24: even is 0 */
    ASSERT_EQ(quant_f32_to_f16(0x1.8p-25f), 0x0001);
    ASSERT_EQ(quant_f32_to_f16(0x1p-30f), 0x0000);
    ASSERT_EQ(quant_f32_to_f16(-0x1p-30f), 0x8000);
    ASSERT_EQ(quant_f32_to_f16(0.1f), 0x2e66);
    uint16_t n = quant_f32_to_f16(NAN);
    ASSERT((n & 0x7c00) == 0x7c00 && (n & 0x3ff) != 0);
}

TEST(f32_to_f16_is_nearest_for_random_floats)
{
    for (int i = 0; i < 200000; i++) {
        /* exponents across the whole half range, subnormals included */
        float f = ldexpf(rand_unit(), (int)(rand_u32() % 44) - 28);
        uint16_t h = quant_f32_to_f16(f);
        double err = fabs(f16_value(h) - (double)f);
        /* the neighbours of h are no nearer */
        for (int dir = -1; dir <= 1; dir += 2) {
            uint32_t mag = (uint32_t)(h & 0x7fff) + (uint32_t)dir;
            if (mag > 0x7bff)
                continue;
            double other = f16_value((uint16_t)((h & 0x8000) | mag));
            if (fabs(other - (double)f) < err)
                FAIL_AT("%.9g -> 0x%04x but 0x%04x is nearer", f, h, (h & 0x8000) | mag);
        }
    }
}

TEST(bf16_round_trips_and_rounds_to_nearest_even)
{
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = quant_bf16_to_f32((uint16_t)h);
        ASSERT_EQ(f32_to_bits(f), h << 16);
        if (isnan(f))
            ASSERT(isnan(quant_bf16_to_f32(quant_f32_to_bf16(f))));
        else if (quant_f32_to_bf16(f) != h)
            FAIL_AT("bf16 0x%04x does not round trip", h);
    }
    /* ties: the low 16 bits exactly 0x8000 go to the even neighbour */
    ASSERT_EQ(quant_f32_to_bf16(bits_to_f32(0x3f808000u)), 0x3f80);
    ASSERT_EQ(quant_f32_to_bf16(bits_to_f32(0x3f818000u)), 0x3f82);
    ASSERT_EQ(quant_f32_to_bf16(bits_to_f32(0x3f808001u)), 0x3f81);
    ASSERT_EQ(quant_f32_to_bf16(bits_to_f32(0x3f807fffu)), 0x3f80);
    ASSERT_EQ(quant_f32_to_bf16(bits_to_f32(0x7f7f8000u)), 0x7f80); /* max finite tie -> inf */
    for (int i = 0; i < 200000; i++) {
        uint32_t u = rand_u32();
        float f = bits_to_f32(u);
        uint16_t h = quant_f32_to_bf16(f);
        if (isnan(f)) {
            ASSERT(isnan(quant_bf16_to_f32(h)));
            continue;
        }
        uint32_t lo = u >> 16;
        uint32_t rem = u & 0xffff;
        uint32_t want = rem > 0x8000 || (rem == 0x8000 && (lo & 1)) ? lo + 1 : lo;
        if (h != want)
            FAIL_AT("0x%08x -> 0x%04x, want 0x%04x", u, h, want);
    }
}

/* ---- block formats ----------------------------------------------------- */

TEST(row_and_act_sizes_follow_the_block_layouts)
{
    ASSERT_EQ(sizeof(struct block_q8_0), 34);
    ASSERT_EQ(sizeof(struct block_q4_0), 18);
    ASSERT_EQ(sizeof(struct block_q4_1), 20);
    ASSERT_EQ(sizeof(struct block_q8_act), 44);
    ASSERT_EQ(qtype_row_bytes(QTYPE_Q4_1, 576), 18 * 20);
    ASSERT_EQ(qtype_row_bytes(QTYPE_Q8_0, 576), 18 * 34);
    ASSERT_EQ(qtype_row_bytes(QTYPE_Q4_0, 33), 0);
    ASSERT_EQ(qtype_row_bytes(QTYPE_F16, 33), 66);
    ASSERT_EQ(quant_act_bytes(QTYPE_Q4_1, 576), 18 * 44);
    ASSERT_EQ(quant_act_bytes(QTYPE_BF16, 576), 576 * 4);
}

/* Q4 nibble order: element j < 16 is the low nibble of qs[j], j + 16 the high. */
TEST(q4_nibbles_are_in_ggml_order)
{
    struct block_q4_1 b = {0};
    b.d = quant_f32_to_f16(1.0f);
    b.m = quant_f32_to_f16(0.0f);
    for (int j = 0; j < 16; j++)
        b.qs[j] = (uint8_t)(j | ((15 - j) << 4));
    float out[32];
    quant_dequant_row(QTYPE_Q4_1, &b, out, 32);
    for (int j = 0; j < 16; j++) {
        ASSERT_EQ(out[j], j);
        ASSERT_EQ(out[j + 16], 15 - j);
    }
}

TEST(q8_0_quantizes_a_ramp_to_known_bytes)
{
    float x[32];
    struct block_q8_0 b;
    for (int j = 0; j < 32; j++)
        x[j] = (float)(j - 16) / 16.0f; /* amax 1: d = 1/127 */
    quant_quantize_row(QTYPE_Q8_0, x, &b, 32);
    ASSERT_EQ(b.d, quant_f32_to_f16(1.0f / 127.0f));
    ASSERT_EQ(b.qs[0], -127);
    ASSERT_EQ(b.qs[16], 0);
    ASSERT_EQ(b.qs[24], 64); /* 0.5 * 127 = 63.5 rounds away from zero */
    ASSERT_EQ(b.qs[8], -64);
}

/* Error bounds of quantize -> dequantize, per block, with d the float scale the
 * quantizer computed and d_h its f16 rounding: |d - d_h| <= e(d) = max(2^-11
 * |d|, 2^-25) (relative in the normal range, half a subnormal step below it):
 *   Q8_0: |q| <= 127, |x - d q| <= d/2, so |x - d_h q| <= d/2 + 127 e(d).
 *   Q4_0: d = max / -8 and q in [0, 15]; the value opposite the max (x / d up
 *         to 8) clamps to 15, one step short, so |x - d_h (q - 8)| <= |d| +
 *         8 e(d).
 *   Q4_1: d = (max - min) / 15, |x - (d q + m)| <= d/2, plus 15 e(d) for d's
 *         rounding and e(min) for m's.
 *   F16: 2^-11 relative plus 2^-25 absolute; BF16: 2^-8 relative; F32 exact.
 * Each gets 4 float ulps of the block's largest magnitude on top, for the
 * float arithmetic inside the quantizer and the dequantizer. */
static double f16_err(double v)
{
    return fmax(fabs(v) * 0x1p-11, 0x1p-25);
}

TEST(quantize_then_dequantize_stays_within_each_formats_bound)
{
    static const enum qtype types[] = {QTYPE_F32,  QTYPE_F16,  QTYPE_BF16,
                                       QTYPE_Q8_0, QTYPE_Q4_0, QTYPE_Q4_1};
    static float x[K_MAX], back[K_MAX];
    _Alignas(64) static uint8_t packed[K_MAX * 4];

    for (int variant = 0; variant < 12; variant++) {
        fill_blocks(x, K_MAX, variant);
        for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
            enum qtype t = types[ti];
            quant_quantize_row(t, x, packed, K_MAX);
            quant_dequant_row(t, packed, back, K_MAX);
            for (int64_t b = 0; b < K_MAX / 32; b++) {
                const float *xb = x + b * 32;
                float amax = 0.0f, min = xb[0], max = xb[0];
                for (int j = 0; j < 32; j++) {
                    amax = fmaxf(amax, fabsf(xb[j]));
                    min = fminf(min, xb[j]);
                    max = fmaxf(max, xb[j]);
                }
                double bound = 4.0 * FLT_EPSILON * amax;
                double d;
                switch (t) {
                case QTYPE_Q8_0:
                    d = amax / 127.0;
                    bound += d * 0.5 + 127.0 * f16_err(d);
                    break;
                case QTYPE_Q4_0:
                    d = amax / 8.0;
                    bound += d + 8.0 * f16_err(d);
                    break;
                case QTYPE_Q4_1:
                    d = ((double)max - min) / 15.0;
                    bound += d * 0.5 + 15.0 * f16_err(d) + f16_err(min);
                    break;
                default:
                    break;
                }
                for (int j = 0; j < 32; j++) {
                    double err = fabs((double)back[b * 32 + j] - xb[j]);
                    double lim = bound;
                    if (t == QTYPE_F32)
                        lim = 0.0;
                    else if (t == QTYPE_F16)
                        lim = fabs(xb[j]) * 0x1p-11 + 0x1p-25;
                    else if (t == QTYPE_BF16)
                        lim = fabs(xb[j]) * 0x1p-8;
                    if (!(err <= lim))
                        FAIL_AT("%s variant %d block %lld [%d]: %.9g -> %.9g (err %.3g > %.3g)",
                                qtype_name(t), variant, (long long)b, j, xb[j], back[b * 32 + j],
                                err, lim);
                }
            }
        }
    }
}

/* ---- activation preparation and the reference dot ------------------------- */

TEST(prepare_act_ref_scales_by_amax_and_rounds_half_to_even)
{
    float x[64];
    struct block_q8_act a[2];
    for (int j = 0; j < 32; j++)
        x[j] = 0.0f;
    x[0] = 127.0f; /* d = 1 exactly, so q = round(x) */
    x[1] = 2.5f;
    x[2] = 3.5f;
    x[3] = -2.5f;
    x[4] = -0.5f;
    x[5] = 126.4f;
    x[6] = -127.0f;
    for (int j = 32; j < 64; j++)
        x[j] = 0.0f; /* an all-zero block */
    quant_prepare_act_ref(QTYPE_Q4_1, x, 64, a);
    ASSERT_EQ(a[0].d, 1.0f);
    ASSERT_EQ(a[0].qs[0], 127);
    ASSERT_EQ(a[0].qs[1], 2);
    ASSERT_EQ(a[0].qs[2], 4);
    ASSERT_EQ(a[0].qs[3], -2);
    ASSERT_EQ(a[0].qs[4], 0);
    ASSERT_EQ(a[0].qs[5], 126);
    ASSERT_EQ(a[0].qs[6], -127);
    ASSERT_EQ(a[0].s, 127 + 2 + 4 - 2 + 126 - 127);
    ASSERT_EQ(a[0].sum, 127 + 2 + 4 - 2 + 126 - 127);
    ASSERT_EQ(a[1].d, 0.0f);
    ASSERT_EQ(a[1].s, 0.0f);
    ASSERT_EQ(a[1].sum, 0);
    for (int j = 0; j < 32; j++)
        ASSERT_EQ(a[1].qs[j], 0);

    static float xr[K_MAX];
    static struct block_q8_act ar[K_MAX / 32];
    fill_blocks(xr, K_MAX, 5);
    quant_prepare_act_ref(QTYPE_Q8_0, xr, K_MAX, ar);
    for (int b = 0; b < K_MAX / 32; b++) {
        int sum = 0;
        for (int j = 0; j < 32; j++) {
            ASSERT(ar[b].qs[j] >= -127 && ar[b].qs[j] <= 127);
            /* |x - d q| <= d/2, up to float rounding of x / d */
            ASSERT(fabs(xr[b * 32 + j] - (double)ar[b].d * ar[b].qs[j]) <= ar[b].d * (0.5 + 1e-5));
            sum += ar[b].qs[j];
        }
        ASSERT(ar[b].s == ar[b].d * (float)sum);
        ASSERT_EQ(ar[b].sum, sum);
    }
    /* float weights take the activations as they are */
    float copy[64];
    quant_prepare_act_ref(QTYPE_F16, x, 64, copy);
    ASSERT(memcmp(copy, x, sizeof copy) == 0);
}

/* quant_dot_ref against double-precision sums.
 *
 * (1) Against the dequantized weights dotted with the dequantized activations
 *     (x_a = d_a * q_a): the integer part is exact, so the only error is
 *     float rounding in each block term (d_w * d_a, times the integer sum, and
 *     for Q4_1 s_a = d_a * sum(q) and m_w * s_a: at most 4 roundings, each
 *     2^-24 relative) and the final conversion of the double sum to float. So
 *     |ref - exact| <= 5 * 2^-24 * sum_i |w_i x_a,i| (+ the same for the Q4_1
 *     offset terms). Float weights: products and sum in double, one final
 *     rounding: 2^-24 relative to sum |w x|, plus K * 2^-53.
 * (2) Against the dequantized weights dotted with the original f32 x: the
 *     activation quantization adds at most d_a / 2 per value, i.e. at most
 *     sum over blocks of (d_a / 2) * sum_{i in block} |w_i|. That bound is the
 *     worst case (all rounding errors aligned with the weight signs); it holds
 *     for every input, so the test can use it as is. */
TEST(dot_ref_matches_double_precision_within_derived_bounds)
{
    static const enum qtype types[] = {QTYPE_F32,  QTYPE_F16,  QTYPE_BF16,
                                       QTYPE_Q8_0, QTYPE_Q4_0, QTYPE_Q4_1};
    static const int64_t ks[] = {32, 64, 576, 1536};
    static float xw[K_MAX], xa[K_MAX], wdq[K_MAX];
    _Alignas(64) static uint8_t w[K_MAX * 4];
    _Alignas(64) static uint8_t a[K_MAX * 4];

    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        enum qtype t = types[ti];
        int quantized = qtype_block_values(t) == 32;
        for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++) {
            int64_t k = ks[ki];
            for (int rep = 0; rep < 8; rep++) {
                fill_blocks(xw, k, rep);
                fill_blocks(xa, k, rep + 3);
                quant_quantize_row(t, xw, w, k);
                quant_dequant_row(t, w, wdq, k);
                quant_prepare_act_ref(t, xa, k, a);
                float got = quant_dot_ref(t, w, a, k);

                double exact_q = 0.0, abs_q = 0.0, exact_x = 0.0, act_err = 0.0;
                for (int64_t i = 0; i < k; i++) {
                    double av = xa[i];
                    if (quantized) {
                        const struct block_q8_act *ab = (const struct block_q8_act *)a + i / 32;
                        av = (double)ab->d * ab->qs[i % 32];
                        act_err += 0.5 * ab->d * fabs(wdq[i]);
                    }
                    exact_q += (double)wdq[i] * av;
                    abs_q += fabs((double)wdq[i] * av);
                    exact_x += (double)wdq[i] * xa[i];
                }
                double tol1 = quantized ? 5.0 * 0x1p-24 * abs_q : 0x1p-24 * abs_q;
                tol1 += (double)k * 0x1p-53 * abs_q + 1e-30;
                if (!(fabs(got - exact_q) <= tol1))
                    FAIL_AT("%s k=%lld rep %d: ref %.9g vs exact %.9g (tol %.3g)", qtype_name(t),
                            (long long)k, rep, got, exact_q, tol1);
                double tol2 = act_err + tol1 + 0x1p-24 * fabs(exact_x);
                if (!(fabs(got - exact_x) <= tol2))
                    FAIL_AT("%s k=%lld rep %d: ref %.9g vs f32-activation dot %.9g (tol %.3g)",
                            qtype_name(t), (long long)k, rep, got, exact_x, tol2);
            }
        }
    }
}

TEST_MAIN()
