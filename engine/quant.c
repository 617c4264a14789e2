/*
 * quant.c: block formats (layouts in quant.h), half/bfloat conversions and the
 * scalar reference kernels. Nothing here is fast on purpose: this is what the
 * SIMD kernels in cpu/ are tested against.
 */
#include "quant.h"

#include <assert.h>
#include <math.h>
#include <string.h>

int qtype_supported(int t)
{
    switch (t) {
    case QTYPE_F32:
    case QTYPE_F16:
    case QTYPE_BF16:
    case QTYPE_Q8_0:
    case QTYPE_Q4_0:
    case QTYPE_Q4_1:
        return 1;
    default:
        return qtype_is_k(t);
    }
}

const char *qtype_name(int t)
{
    static const char *const names[] = {
        [0] = "F32",     [1] = "F16",      [2] = "Q4_0",   [3] = "Q4_1",    [6] = "Q5_0",
        [7] = "Q5_1",    [8] = "Q8_0",     [9] = "Q8_1",   [10] = "Q2_K",   [11] = "Q3_K",
        [12] = "Q4_K",   [13] = "Q5_K",    [14] = "Q6_K",  [15] = "Q8_K",   [16] = "IQ2_XXS",
        [17] = "IQ2_XS", [18] = "IQ3_XXS", [19] = "IQ1_S", [20] = "IQ4_NL", [21] = "IQ3_S",
        [22] = "IQ2_S",  [23] = "IQ4_XS",  [24] = "I8",    [25] = "I16",    [26] = "I32",
        [27] = "I64",    [28] = "F64",     [29] = "IQ1_M", [30] = "BF16",
    };
    if (t >= 0 && t < (int)(sizeof names / sizeof names[0]) && names[t])
        return names[t];
    return "unknown";
}

int64_t qtype_block_values(int t)
{
    switch (t) {
    case QTYPE_F32:
    case QTYPE_F16:
    case QTYPE_BF16:
        return 1;
    case QTYPE_Q8_0:
    case QTYPE_Q4_0:
    case QTYPE_Q4_1:
    case QTYPE_Q5_0:
        return QK;
    case QTYPE_Q3_K:
    case QTYPE_Q4_K:
    case QTYPE_Q5_K:
    case QTYPE_Q6_K:
        return QK_K;
    default:
        return 0;
    }
}

size_t qtype_block_bytes(int t)
{
    switch (t) {
    case QTYPE_F32:
        return 4;
    case QTYPE_F16:
    case QTYPE_BF16:
        return 2;
    case QTYPE_Q8_0:
        return sizeof(struct block_q8_0);
    case QTYPE_Q4_0:
        return sizeof(struct block_q4_0);
    case QTYPE_Q4_1:
        return sizeof(struct block_q4_1);
    case QTYPE_Q5_0:
        return sizeof(struct block_q5_0);
    case QTYPE_Q3_K:
        return sizeof(struct block_q3_k);
    case QTYPE_Q4_K:
        return sizeof(struct block_q4_k);
    case QTYPE_Q5_K:
        return sizeof(struct block_q5_k);
    case QTYPE_Q6_K:
        return sizeof(struct block_q6_k);
    default:
        return 0;
    }
}

size_t qtype_row_bytes(int t, int64_t n)
{
    int64_t bv = qtype_block_values(t);
    if (bv == 0 || n < 0 || n % bv != 0)
        return 0;
    return (size_t)(n / bv) * qtype_block_bytes(t);
}

float quant_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    uint32_t bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: value = man * 2^-24 */
            float f = (float)man * 0x1p-24f;
            memcpy(&bits, &f, 4);
            bits |= sign;
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    }
    float out;
    memcpy(&out, &bits, 4);
    return out;
}

uint16_t quant_f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t absx = x & 0x7fffffffu;
    if (absx >= 0x7f800000u) /* inf or nan */
        return (uint16_t)(sign | 0x7c00 | (absx > 0x7f800000u ? 0x200 : 0));
    if (absx >= 0x477ff000u) /* rounds to >= 65520: overflow to inf */
        return (uint16_t)(sign | 0x7c00);
    if (absx < 0x38800000u) { /* below the smallest normal half: subnormal or zero */
        float a;
        memcpy(&a, &absx, 4);
        /* a * 2^24 rounded to nearest even integer is the subnormal mantissa */
        float m = nearbyintf(a * 0x1p24f);
        return (uint16_t)(sign | (uint32_t)m);
    }
    uint32_t exp = (absx >> 23) - 112;
    uint32_t man = absx & 0x7fffff;
    uint32_t h = (exp << 10) | (man >> 13);
    uint32_t rem = man & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1)))
        h++; /* carries into the exponent correctly */
    return (uint16_t)(sign | h);
}

float quant_bf16_to_f32(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t quant_f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40); /* quiet nan */
    x += 0x7fff + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

/* ---- scalar reference kernels ------------------------------------------------
 * Conventions (the SIMD kernels in cpu/ reproduce the integer parts exactly):
 *   Q8_0  d = amax / 127,          q = round(x / d)                 in [-127, 127]
 *   Q4_0  d = max / -8,            q = clamp(round(x / d) + 8, 0, 15)
 *         (max is the value of largest magnitude, with its sign: ggml's convention,
 *          so that value maps exactly onto q = 0)
 *   Q4_1  d = (max - min) / 15, m = min, q = clamp(round((x - m) / d), 0, 15)
 * The weight quantizers follow ggml's reference code (multiply by 1/d; Q8_0 and
 * Q4_1 round half away from zero, Q4_0 rounds half up), so their output matches
 * files written by llama.cpp's tools. */

static float block_amax(const float *x)
{
    float amax = 0.0f;
    for (int j = 0; j < QK; j++)
        amax = fmaxf(amax, fabsf(x[j]));
    return amax;
}

static void quantize_q8_0(const float *x, struct block_q8_0 *b)
{
    float d = block_amax(x) / 127.0f;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    b->d = quant_f32_to_f16(d);
    for (int j = 0; j < QK; j++) {
        /* |x * id| <= 127 for finite x (a hair above after rounding, which
         * still rounds to 127); a NaN value, or any value of a block with an
         * infinity (d = inf, id = 0, x * id NaN), stores 0: never an
         * undefined cast. A NaN reads back as 0, an infinite block as
         * inf * 0 = NaN. */
        float v = x[j] * id;
        b->qs[j] = v > -127.5f && v < 127.5f ? (int8_t)roundf(v) : 0;
    }
}

static void quantize_q4_0(const float *x, struct block_q4_0 *b)
{
    float amax = 0.0f;
    float max = 0.0f;
    for (int j = 0; j < QK; j++) {
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    }
    float d = max / -8.0f;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    b->d = quant_f32_to_f16(d);
    /* |x * id| <= 8, so x * id + 8.5 > 0 and the cast is floor: round half up. */
    for (int j = 0; j < QK / 2; j++) {
        int lo = (int)fminf(15.0f, x[j] * id + 8.5f);
        int hi = (int)fminf(15.0f, x[j + QK / 2] * id + 8.5f);
        b->qs[j] = (uint8_t)(lo | (hi << 4));
    }
}

static void quantize_q4_1(const float *x, struct block_q4_1 *b)
{
    float min = x[0];
    float max = x[0];
    for (int j = 1; j < QK; j++) {
        min = fminf(min, x[j]);
        max = fmaxf(max, x[j]);
    }
    float d = (max - min) / 15.0f;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    b->d = quant_f32_to_f16(d);
    b->m = quant_f32_to_f16(min);
    for (int j = 0; j < QK / 2; j++) {
        int lo = (int)fminf(15.0f, roundf((x[j] - min) * id));
        int hi = (int)fminf(15.0f, roundf((x[j + QK / 2] - min) * id));
        b->qs[j] = (uint8_t)(lo | (hi << 4));
    }
}

void quant_quantize_row(enum qtype t, const float *restrict src, void *restrict dst, int64_t n)
{
    switch (t) {
    case QTYPE_F32:
        memcpy(dst, src, (size_t)n * sizeof(float));
        break;
    case QTYPE_F16:
        for (int64_t i = 0; i < n; i++)
            ((uint16_t *)dst)[i] = quant_f32_to_f16(src[i]);
        break;
    case QTYPE_BF16:
        for (int64_t i = 0; i < n; i++)
            ((uint16_t *)dst)[i] = quant_f32_to_bf16(src[i]);
        break;
    case QTYPE_Q8_0:
        for (int64_t b = 0; b < n / QK; b++)
            quantize_q8_0(src + b * QK, (struct block_q8_0 *)dst + b);
        break;
    case QTYPE_Q4_0:
        for (int64_t b = 0; b < n / QK; b++)
            quantize_q4_0(src + b * QK, (struct block_q4_0 *)dst + b);
        break;
    case QTYPE_Q4_1:
        for (int64_t b = 0; b < n / QK; b++)
            quantize_q4_1(src + b * QK, (struct block_q4_1 *)dst + b);
        break;
    default: /* Q5_0 and the K-quants: read from files, never written here */
        assert(!"quant_quantize_row: no quantizer for this type");
        break;
    }
}

void quant_dequant_row(enum qtype t, const void *restrict src, float *restrict dst, int64_t n)
{
    switch (t) {
    case QTYPE_F32:
        memcpy(dst, src, (size_t)n * sizeof(float));
        break;
    case QTYPE_F16:
        for (int64_t i = 0; i < n; i++)
            dst[i] = quant_f16_to_f32(((const uint16_t *)src)[i]);
        break;
    case QTYPE_BF16:
        for (int64_t i = 0; i < n; i++)
            dst[i] = quant_bf16_to_f32(((const uint16_t *)src)[i]);
        break;
    case QTYPE_Q8_0:
        for (int64_t b = 0; b < n / QK; b++) {
            const struct block_q8_0 *blk = (const struct block_q8_0 *)src + b;
            float d = quant_f16_to_f32(blk->d);
            for (int j = 0; j < QK; j++)
                dst[b * QK + j] = d * (float)blk->qs[j];
        }
        break;
    case QTYPE_Q4_0:
        for (int64_t b = 0; b < n / QK; b++) {
            const struct block_q4_0 *blk = (const struct block_q4_0 *)src + b;
            float d = quant_f16_to_f32(blk->d);
            for (int j = 0; j < QK / 2; j++) {
                dst[b * QK + j] = d * (float)((blk->qs[j] & 0x0f) - 8);
                dst[b * QK + j + QK / 2] = d * (float)((blk->qs[j] >> 4) - 8);
            }
        }
        break;
    case QTYPE_Q4_1:
        for (int64_t b = 0; b < n / QK; b++) {
            const struct block_q4_1 *blk = (const struct block_q4_1 *)src + b;
            float d = quant_f16_to_f32(blk->d);
            float m = quant_f16_to_f32(blk->m);
            for (int j = 0; j < QK / 2; j++) {
                dst[b * QK + j] = d * (float)(blk->qs[j] & 0x0f) + m;
                dst[b * QK + j + QK / 2] = d * (float)(blk->qs[j] >> 4) + m;
            }
        }
        break;
    default:
        quant__dequant_row_k(t, src, dst, n);
        break;
    }
}

size_t quant_act_bytes(enum qtype t, int64_t k)
{
    switch (t) {
    case QTYPE_F32:
    case QTYPE_F16:
    case QTYPE_BF16:
        return (size_t)k * sizeof(float);
    case QTYPE_Q8_0:
    case QTYPE_Q4_0:
    case QTYPE_Q4_1:
    case QTYPE_Q5_0:
    case QTYPE_Q3_K:
    case QTYPE_Q4_K:
    case QTYPE_Q5_K:
    case QTYPE_Q6_K:
        return (size_t)(k / QK) * sizeof(struct block_q8_act);
    }
    return 0;
}

/* Activation blocks round half to even (nearbyintf in the default rounding mode)
 * and multiply by 1/d rather than divide: that is one SIMD multiply and one
 * convert, so every ISA produces these bytes exactly. */
void quant_prepare_act_ref(enum qtype t, const float *restrict x, int64_t k, void *restrict dst)
{
    if (t == QTYPE_F32 || t == QTYPE_F16 || t == QTYPE_BF16) {
        memcpy(dst, x, (size_t)k * sizeof(float));
        return;
    }
    for (int64_t b = 0; b < k / QK; b++) {
        struct block_q8_act *a = (struct block_q8_act *)dst + b;
        const float *xb = x + b * QK;
        float d = block_amax(xb) / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        int sum = 0;
        for (int j = 0; j < QK; j++) {
            a->qs[j] = (int8_t)nearbyintf(xb[j] * id);
            sum += a->qs[j];
        }
        a->d = d;
        a->s = d * (float)sum;
        a->sum = sum;
    }
}

/* Each block's term is the exact integer dot times the float product of the
 * two scales (Q4_1 adds m_w * s_a), formed in float as the SIMD kernels form
 * it; they split it across vector lanes and fuse multiply-adds, so they match
 * this to rounding. The sum over blocks, and over values for float weights,
 * is taken in double, so the reference adds no summation error of its own. */
float quant_dot_ref(enum qtype t, const void *restrict w, const void *restrict a, int64_t k)
{
    const float *af = a;
    const struct block_q8_act *aq = a;
    double sum = 0.0;

    switch (t) {
    case QTYPE_F32:
        for (int64_t i = 0; i < k; i++)
            sum += (double)((const float *)w)[i] * (double)af[i];
        break;
    case QTYPE_F16:
        for (int64_t i = 0; i < k; i++)
            sum += (double)quant_f16_to_f32(((const uint16_t *)w)[i]) * (double)af[i];
        break;
    case QTYPE_BF16:
        for (int64_t i = 0; i < k; i++)
            sum += (double)quant_bf16_to_f32(((const uint16_t *)w)[i]) * (double)af[i];
        break;
    case QTYPE_Q8_0:
        for (int64_t b = 0; b < k / QK; b++) {
            const struct block_q8_0 *wb = (const struct block_q8_0 *)w + b;
            int isum = 0;
            for (int j = 0; j < QK; j++)
                isum += wb->qs[j] * aq[b].qs[j];
            sum += (double)(quant_f16_to_f32(wb->d) * aq[b].d * (float)isum);
        }
        break;
    case QTYPE_Q4_0:
        for (int64_t b = 0; b < k / QK; b++) {
            const struct block_q4_0 *wb = (const struct block_q4_0 *)w + b;
            int isum = 0;
            for (int j = 0; j < QK / 2; j++) {
                isum += ((wb->qs[j] & 0x0f) - 8) * aq[b].qs[j];
                isum += ((wb->qs[j] >> 4) - 8) * aq[b].qs[j + QK / 2];
            }
            sum += (double)(quant_f16_to_f32(wb->d) * aq[b].d * (float)isum);
        }
        break;
    case QTYPE_Q4_1:
        for (int64_t b = 0; b < k / QK; b++) {
            const struct block_q4_1 *wb = (const struct block_q4_1 *)w + b;
            int isum = 0;
            for (int j = 0; j < QK / 2; j++) {
                isum += (wb->qs[j] & 0x0f) * aq[b].qs[j];
                isum += (wb->qs[j] >> 4) * aq[b].qs[j + QK / 2];
            }
            sum += (double)(quant_f16_to_f32(wb->d) * aq[b].d * (float)isum);
            sum += (double)(quant_f16_to_f32(wb->m) * aq[b].s);
        }
        break;
    default:
        sum = quant__dot_ref_k(t, w, aq, k);
        break;
    }
    return (float)sum;
}
