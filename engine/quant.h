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
    QTYPE_Q8_0 = 8,
    QTYPE_BF16 = 30,
};

#define QK 32 /* values per quantized block */

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
/* Activation block: 8-bit values, scale, and d * sum(qs) (needed by Q4_1's
 * offset term m * sum(x)). Not a file format: our own layout. */
struct block_q8_act {
    float d;
    float s; /* d * sum(qs) */
    int8_t qs[QK];
};

/* 1 if t is one of the types above, else 0. */
int qtype_supported(int t);
/* Name for messages ("Q4_1"), also for types we do not support ("Q4_K"). */
const char *qtype_name(int t);
/* Values per block (1 for float types, 32 for quantized); 0 if unsupported. */
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
 * k/32 block_q8_act for quantized t, k floats for float t. */
size_t quant_act_bytes(enum qtype t, int64_t k);
/* Scalar reference for preparing an activation row (k a multiple of 32 for quantized t). */
void quant_prepare_act_ref(enum qtype t, const float *restrict x, int64_t k, void *restrict dst);
/* Scalar reference dot product of weight row w (type t) and prepared activation row a. */
float quant_dot_ref(enum qtype t, const void *restrict w, const void *restrict a, int64_t k);

#endif
