/*
 * quant.h: weight block formats shared by the CPU backend, the CUDA backend
 * and the tests. Type ids are GGUF's (ggml_type) numbering.
 *
 *   F32   4 bytes per value
 *   F16   IEEE half, 2 bytes per value
 *   BF16  upper half of an f32, 2 bytes per value
 *   Q8_0  blocks of 32: f16 d, int8 q[32];            x = d * q           (34 bytes)
 *   Q4_0  blocks of 32: f16 d, uint8 qs[16];          x = d * (nib - 8)   (18 bytes)
 *   Q4_1  blocks of 32: f16 d, f16 m, uint8 qs[16];   x = d * nib + m     (20 bytes)
 *         (Q4 nibbles: element j < 16 is the low nibble of qs[j], element j + 16
 *          the high nibble of qs[j])
 *   Q5_0  blocks of 32: f16 d, uint8 qh[4], uint8 qs[16];
 *         x = d * ((nib | hbit << 4) - 16), nibbles as Q4, hbit = bit j of qh
 *         read as a little-endian uint32                                    (22 bytes)
 *
 * K-quants: super-blocks of 256 values (QK_K), cut into sub-blocks that share
 * one f16 d (and f16 dmin) scaled by small integer scales. Values 32j..32j+31
 * are "group" j (0..7) below; a group lines up with one 32-value activation
 * block, which is how every kernel walks them.
 *   Q4_K  f16 d, f16 dmin, uint8 scales[12], uint8 qs[128]                  (144 bytes)
 *         8 sub-blocks of 32, each a 6-bit scale sc and 6-bit min m packed in
 *         scales (j < 4: sc = s[j] & 63, m = s[j+4] & 63; j >= 4: sc = s[j+4] &
 *         15 | (s[j-4] >> 6) << 4, m = s[j+4] >> 4 | (s[j] >> 6) << 4);
 *         x = (d * sc) * q - dmin * m; q: group 2i is the low nibbles of
 *         qs[32i..32i+31], group 2i+1 their high nibbles.
 *   Q5_K  f16 d, f16 dmin, uint8 scales[12], uint8 qh[32], uint8 qs[128]  (176 bytes)
 *         as Q4_K, plus a fifth bit: bit j of qh[l] is bit 4 of value l of group j.
 *   Q6_K  uint8 ql[128], uint8 qh[64], int8 scales[16], f16 d              (210 bytes)
 *         16 sub-blocks of 16 with a signed 8-bit scale each; x = (d * sc) *
 *         (q - 32), q 6 bits: for half h (128 values) and l < 32, values
 *         l, l+32, l+64, l+96 take the low nibble of ql[64h+l], of ql[64h+32+l],
 *         the high nibble of ql[64h+l], of ql[64h+32+l], and bits 0-1, 2-3, 4-5,
 *         6-7 of qh[32h+l] as their bits 4-5.
 *   Q3_K  uint8 hmask[32], uint8 qs[64], uint8 scales[12], f16 d           (110 bytes)
 *         16 sub-blocks of 16 with a signed 6-bit scale each, stored as sc + 32:
 *         bits 0-3 of sub-block i's are the low nibble of s[i] (i < 8) or the
 *         high nibble of s[i-8], bits 4-5 are bits 2(i/4)..2(i/4)+1 of s[8 + i%4];
 *         x = (d * sc) * (q - 4 * !hbit), q 2 bits: for half h and l < 32, group
 *         4h+i takes bits 2i..2i+1 of qs[32h+l]; hbit is bit j of hmask[l] for
 *         group j.
 *
 * Matrix products quantize the activation row once per row (quant_prepare_act)
 * and then take integer dot products against every weight row; float weight
 * formats take f32 activations as they are. The scalar code here is the
 * reference every SIMD kernel (engine/cpu/matmul*.c) is tested against.
 */
#ifndef SS_QUANT_H
#define SS_QUANT_H

#include <stddef.h>
#include <stdint.h>

enum qtype {
    QTYPE_F32 = 0,
    QTYPE_F16 = 1,
    QTYPE_Q4_0 = 2,
    QTYPE_Q4_1 = 3,
    QTYPE_Q5_0 = 6,
    QTYPE_Q8_0 = 8,
    QTYPE_Q3_K = 11,
    QTYPE_Q4_K = 12,
    QTYPE_Q5_K = 13,
    QTYPE_Q6_K = 14,
    QTYPE_BF16 = 30,
};

#define QK 32    /* values per quantized block */
#define QK_K 256 /* values per K-quant super-block */

struct block_q8_0 {
    uint16_t d; /* f16 scale */
    int8_t qs[QK];
};
struct block_q4_0 {
    uint16_t d;
    uint8_t qs[QK / 2];
};
struct block_q4_1 {
    uint16_t d; /* f16 scale */
    uint16_t m; /* f16 minimum */
    uint8_t qs[QK / 2];
};
struct block_q5_0 {
    uint16_t d;    /* f16 scale */
    uint8_t qh[4]; /* bit 4 of each value */
    uint8_t qs[QK / 2];
};
struct block_q4_k {
    uint16_t d;    /* f16 super-block scale */
    uint16_t dmin; /* f16 super-block scale of the mins */
    uint8_t scales[12];
    uint8_t qs[QK_K / 2];
};
struct block_q5_k {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[12];
    uint8_t qh[QK_K / 8];
    uint8_t qs[QK_K / 2];
};
struct block_q6_k {
    uint8_t ql[QK_K / 2];
    uint8_t qh[QK_K / 4];
    int8_t scales[QK_K / 16];
    uint16_t d;
};
struct block_q3_k {
    uint8_t hmask[QK_K / 8];
    uint8_t qs[QK_K / 4];
    uint8_t scales[12];
    uint16_t d;
};

/* One 32-value group of a Q5_0 block or K-quant super-block, decoded to small
 * integers: value j = dw * (float)(sc[j / 16] * q[j]) - mw, up to rounding.
 * Every kernel takes its dot products in this form: sum_j sc q_j a_j exactly
 * in integers, then dw, then the min term mw * sum_j a_j. */
struct quant_group {
    int8_t q[QK];  /* Q5_0: -16..15; Q4_K: 0..15; Q5_K: 0..31; Q6_K: -32..31; Q3_K: -4..3 */
    int16_t sc[2]; /* integer scale of values 0-15 and 16-31 (1 for Q5_0) */
    float dw;      /* float scale */
    float mw;      /* float min, 0 for types without one */
};

/* Activation block: 8-bit values, scale, d * sum(qs) (needed by Q4_1's
 * offset term m * sum(x)) and sum(qs) itself, exact (the integer correction
 * of the kernels that multiply Q4_0 or Q8_0 quants stored with an offset:
 * made once with the values instead of in every product that reads them).
 * Not a file format: our own layout. */
struct block_q8_act {
    float d;
    float s; /* d * sum(qs) */
    int8_t qs[QK];
    int32_t sum; /* sum(qs) */
};

/* 1 for Q5_0 and the K-quants: the types quant_k.c holds. */
int qtype_is_k(int t);
/* Decodes group g (0..7 within a K-quant super-block, always 0 for Q5_0) of the
 * block at blk. For tests and references; the kernels inline their own. */
void quant_k_group(enum qtype t, const void *restrict blk, int g, struct quant_group *out);

/* 1 if t is one of the types above, else 0. */
int qtype_supported(int t);
/* Name for messages ("Q4_1"), also for types we do not support ("Q4_K"). */
const char *qtype_name(int t);
/* Values per block (1 for float types, 32 or 256 for quantized); 0 if unsupported. */
int64_t qtype_block_values(int t);
/* Bytes per block; 0 if unsupported. */
size_t qtype_block_bytes(int t);
/* Bytes of a row of n values; 0 if unsupported or n is not a multiple of the block. */
size_t qtype_row_bytes(int t, int64_t n);

float quant_f16_to_f32(uint16_t h);
uint16_t quant_f32_to_f16(float f); /* round to nearest even */
float quant_bf16_to_f32(uint16_t h);
uint16_t quant_f32_to_bf16(float f); /* round to nearest even */

/* Scalar reference: dst[0..n) = values of a row of type t. */
void quant_dequant_row(enum qtype t, const void *restrict src, float *restrict dst, int64_t n);
/* Scalar reference: quantize a row of n floats into type t (Q8_0/Q4_0/Q4_1/F16/BF16/F32). */
void quant_quantize_row(enum qtype t, const float *restrict src, void *restrict dst, int64_t n);

/* Bytes of one prepared activation row of k values for weights of type t:
 * k/32 block_q8_act for quantized t (the same row for every quantized type),
 * k floats for float t. */
size_t quant_act_bytes(enum qtype t, int64_t k);
/* Scalar reference for preparing an activation row (k a multiple of 32 for quantized t). */
void quant_prepare_act_ref(enum qtype t, const float *restrict x, int64_t k, void *restrict dst);
/* Scalar reference dot product of weight row w (type t) and prepared activation row a. */
float quant_dot_ref(enum qtype t, const void *restrict w, const void *restrict a, int64_t k);

/* quant_k.c's parts of quant_dequant_row and quant_dot_ref (internal). */
void quant__dequant_row_k(enum qtype t, const void *restrict src, float *restrict dst, int64_t n);
double quant__dot_ref_k(enum qtype t, const void *restrict w, const struct block_q8_act *a,
                        int64_t k);

#endif
