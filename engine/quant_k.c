/*
 * quant_k.c: Q5_0 and the K-quants (Q3_K, Q4_K, Q5_K, Q6_K): decoding one
 * 32-value group, dequantization and the scalar reference dot product
 * (layouts in quant.h). Like quant.c, slow on purpose: the SIMD kernels in
 * cpu/matmul_kquant_*.c are tested against this.
 *
 * Dequantization does the float operations in the order the `gguf` Python
 * package's dequantizer does them ((d * sc) * q - dmin * m, each rounded to
 * float), so the two agree bit for bit; tests/unit/test_quant_k.c checks it
 * against a fixture that package wrote.
 */
#include "quant.h"

#include <assert.h>
#include <string.h>

int qtype_is_k(int t)
{
    return t == QTYPE_Q5_0 || t == QTYPE_Q3_K || t == QTYPE_Q4_K || t == QTYPE_Q5_K ||
           t == QTYPE_Q6_K;
}

/* The 6-bit scale and min of sub-block j of a Q4_K/Q5_K super-block. */
static void scale_min_k4(const uint8_t *s, int j, int *sc, int *m)
{
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* The signed 6-bit scale of sub-block i (0..15) of a Q3_K super-block. */
static int scale_q3_k(const uint8_t *s, int i)
{
    int lo = i < 8 ? s[i] & 15 : s[i - 8] >> 4;
    int hi = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
    return (lo | (hi << 4)) - 32;
}

void quant_k_group(enum qtype t, const void *restrict blk, int g, struct quant_group *out)
{
    int sc, m;

    assert(g >= 0 && g < (t == QTYPE_Q5_0 ? 1 : 8));
    out->mw = 0.0f;
    switch (t) {
    case QTYPE_Q5_0: {
        const struct block_q5_0 *b = blk;
        uint32_t qh;
        memcpy(&qh, b->qh, 4);
        for (int j = 0; j < QK; j++) {
            int nib = j < 16 ? b->qs[j] & 15 : b->qs[j - 16] >> 4;
            out->q[j] = (int8_t)((nib | (int)((qh >> j) & 1) << 4) - 16);
        }
        out->sc[0] = out->sc[1] = 1;
        out->dw = quant_f16_to_f32(b->d);
        break;
    }
    case QTYPE_Q4_K:
    case QTYPE_Q5_K: {
        const uint8_t *scales, *qs;
        const uint8_t *qh = NULL;
        float d, dmin;
        if (t == QTYPE_Q4_K) {
            const struct block_q4_k *b = blk;
            d = quant_f16_to_f32(b->d);
            dmin = quant_f16_to_f32(b->dmin);
            scales = b->scales;
            qs = b->qs;
        } else {
            const struct block_q5_k *b = blk;
            d = quant_f16_to_f32(b->d);
            dmin = quant_f16_to_f32(b->dmin);
            scales = b->scales;
            qs = b->qs;
            qh = b->qh;
        }
        scale_min_k4(scales, g, &sc, &m);
        for (int l = 0; l < 32; l++) {
            int q = (qs[32 * (g / 2) + l] >> (4 * (g % 2))) & 15;
            if (qh)
                q |= ((qh[l] >> g) & 1) << 4;
            out->q[l] = (int8_t)q;
        }
        out->sc[0] = out->sc[1] = (int16_t)sc;
        out->dw = d;
        out->mw = dmin * (float)m;
        break;
    }
    case QTYPE_Q6_K: {
        const struct block_q6_k *b = blk;
        int h = g / 4, i = g % 4;
        for (int l = 0; l < 32; l++) {
            int lo = (b->ql[64 * h + 32 * (i % 2) + l] >> (4 * (i / 2))) & 15;
            int hi = (b->qh[32 * h + l] >> (2 * i)) & 3;
            out->q[l] = (int8_t)((lo | (hi << 4)) - 32);
        }
        out->sc[0] = b->scales[2 * g];
        out->sc[1] = b->scales[2 * g + 1];
        out->dw = quant_f16_to_f32(b->d);
        break;
    }
    case QTYPE_Q3_K: {
        const struct block_q3_k *b = blk;
        int h = g / 4, i = g % 4;
        for (int l = 0; l < 32; l++) {
            int lo = (b->qs[32 * h + l] >> (2 * i)) & 3;
            int hbit = (b->hmask[l] >> g) & 1;
            out->q[l] = (int8_t)(lo - (hbit ? 0 : 4));
        }
        out->sc[0] = (int16_t)scale_q3_k(b->scales, 2 * g);
        out->sc[1] = (int16_t)scale_q3_k(b->scales, 2 * g + 1);
        out->dw = quant_f16_to_f32(b->d);
        break;
    }
    default:
        assert(!"quant_k_group: not a Q5_0 or K-quant type");
        break;
    }
}

/* Bytes of one block (Q5_0) or super-block (K-quants). */
static size_t k_block_bytes(enum qtype t)
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
    case QTYPE_Q6_K:
        return sizeof(struct block_q6_k);
    default:
        return 0;
    }
}

void quant__dequant_row_k(enum qtype t, const void *restrict src, float *restrict dst, int64_t n)
{
    const int groups = t == QTYPE_Q5_0 ? 1 : QK_K / QK;
    const size_t bb = k_block_bytes(t);
    struct quant_group gr;

    assert(bb != 0);
    for (int64_t b = 0; b < n / (QK * groups); b++) {
        const char *blk = (const char *)src + (size_t)b * bb;
        for (int g = 0; g < groups; g++) {
            float *out = dst + (b * groups + g) * QK;
            quant_k_group(t, blk, g, &gr);
            for (int j = 0; j < QK; j++) {
                /* gguf's order: the sub-block's float scale first, then q */
                float scale = gr.dw * (float)gr.sc[j / 16];
                if (t == QTYPE_Q5_0)
                    out[j] = gr.dw * (float)gr.q[j];
                else
                    out[j] = scale * (float)gr.q[j] - gr.mw;
            }
        }
    }
}

/* Per group: the exact integer sum of sc * q * a, times dw * d_a in float, minus
 * mw * s_a (s_a = d_a * sum a): the terms the SIMD kernels form per lane. */
double quant__dot_ref_k(enum qtype t, const void *restrict w, const struct block_q8_act *a,
                        int64_t k)
{
    const int groups = t == QTYPE_Q5_0 ? 1 : QK_K / QK;
    const size_t bb = k_block_bytes(t);
    struct quant_group gr;
    double sum = 0.0;

    assert(bb != 0);
    for (int64_t b = 0; b < k / (QK * groups); b++) {
        const char *blk = (const char *)w + (size_t)b * bb;
        for (int g = 0; g < groups; g++) {
            const struct block_q8_act *ab = a + b * groups + g;
            int isum = 0;
            quant_k_group(t, blk, g, &gr);
            for (int j = 0; j < QK; j++)
                isum += gr.sc[j / 16] * gr.q[j] * ab->qs[j];
            sum += (double)(gr.dw * ab->d * (float)isum);
            if (gr.mw != 0.0f)
                sum -= (double)(gr.mw * ab->s);
        }
    }
    return sum;
}
