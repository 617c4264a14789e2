/*
 * ops.h: element-wise kernels of the CPU backend (SwiGLU, RoPE, f32 -> f16 rows,
 * f32 -> Q8_0 rows, RMSNorm's sums and scaling, the residual add), AVX2 (and
 * for SwiGLU AVX-512) forms chosen at run time by backend_cpu.c. Internal to
 * engine/cpu.
 */
#ifndef SS_CPU_OPS_H
#define SS_CPU_OPS_H

#include <stdint.h>

/* hb[i] = silu(hb[i]) * hb2[i], silu(g) = g / (1 + e^-g). The AVX2 form's
 * e^x has a relative error below 2e-7 (attention_avx2.c's polynomial); every
 * value, the last few of a span too, goes through the same vector steps, so
 * its result does not depend on n or on where the span starts. */
void cpu__swiglu_avx2(float *hb, const float *hb2, int64_t n);
/* cpu__swiglu_avx2 sixteen values at a time (AVX-512 F): the same steps per
 * value, so the same bits. */
void cpu__swiglu_avx512(float *hb, const float *hb2, int64_t n);
/* rope_apply (rope.h, the adjacent-pair layout) with AVX2: the same bits. */
void cpu__rope_apply_avx2(float *x, int n_head, int head_dim, int rope_dim, const float *cs);
/* dst[i] = src[i] rounded to f16, to nearest even (F16C): the same bits as
 * quant_f32_to_f16 for every non-NaN input. */
void cpu__f32_to_f16_avx2(uint16_t *dst, const float *src, int64_t n);
/* quant_quantize_row(QTYPE_Q8_0, src, dst, n), n a multiple of 32: the same
 * bytes for every input (NaN and infinities included). */
void cpu__quantize_row_q8_0_avx2(void *dst, const float *src, int64_t n);
/* The sum of x[i]^2 in double in eight chains (chain k takes the values
 * i = k mod 8 below the last multiple of 8, chain 0 the rest after them),
 * added ((c0 + c1) + (c2 + c3)) + ((c4 + c5) + (c6 + c7)): RMSNorm's sum of
 * squares, bit for bit the scalar loop's. */
double cpu__sum_squares_avx2(const float *x, int64_t n);
/* o[i] = (x[i] * s) * g[i] (o may be x): the same bits as the scalar loop. */
void cpu__scale_mul_avx2(float *o, const float *x, float s, const float *g, int64_t n);
/* x[i] += y[i]: the same bits as the scalar loop. */
void cpu__add_avx2(float *x, const float *y, int64_t n);

#endif
