/*
 * rope.h: rotary position embedding in the pairwise layout of GGUF Llama
 * files (the converter permuted Q and K so each rotated pair is two adjacent
 * elements) and in the NEOX layout of Gemma files (pair i is elements i and
 * i + rope_dim/2, Hugging Face's rotate_half). Angles are computed in double: with float, p * theta
 * is already off by ~0.01 rad at p = 10^6 (DESIGN.md).
 */
#ifndef SS_ROPE_H
#define SS_ROPE_H

#include <stdint.h>

/* cs[2*i] = cos(pos * theta_i), cs[2*i+1] = sin(pos * theta_i) for i < rope_dim/2,
 * theta_i = base^(-2i / rope_dim); angles reduced mod 2pi in double. */
void rope_cos_sin(int64_t pos, double base, int rope_dim, float *cs);
/* Rotates n_head vectors of head_dim values in place with the table from
 * rope_cos_sin: (x0, x1) -> (x0 c - x1 s, x0 s + x1 c) for each adjacent pair
 * among the first rope_dim values of each head. */
void rope_apply(float *x, int n_head, int head_dim, int rope_dim, const float *cs);
/* The same rotation on the NEOX pairs (x[i], x[i + rope_dim/2]). */
void rope_apply_neox(float *x, int n_head, int head_dim, int rope_dim, const float *cs);

#endif
