/*
 * matmul_impl.h: what matmul.c shares with the ISA-specific kernel files
 * (matmul_avx2.c, matmul_avx512.c, matmul_rows16_avx512.c) and with
 * tests/unit/test_matmul.c. Internal to engine/cpu/. Each function here has the contract of the
 * cpu_ function of the same shape in matmul.h, and may only be called after cpu_isa_best() (or the
 * CPUID checks it makes) says the CPU has that ISA.
 */
#ifndef SS_CPU_MATMUL_IMPL_H
#define SS_CPU_MATMUL_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "../quant.h"

/* Four bytes at any address read as one int32: the memory operand of the
 * kernels' asm statements that broadcast four quant or activation bytes
 * (matmul_rows16_avx512.c, matmul_rows16_ymm.h). */
typedef int32_t __attribute__((may_alias, aligned(1))) i32_bytes;

/* AVX2 + FMA + F16C. */
void cpu__prepare_act_avx2(enum qtype t, const float *restrict x, int64_t k, void *restrict dst);
void cpu__matmul_rows_avx2(enum qtype t, const void *restrict w, int64_t k, int64_t n0, int64_t n1,
                           const void *restrict act, int64_t T, float *restrict y, int64_t ldy);

/* AVX-512 F + BW + VL + DQ. What cpu_matmul_rows runs for float weights on
 * every AVX-512 CPU, and for Q4_0, Q4_1 and Q8_0 on those without VNNI. */
void cpu__prepare_act_avx512(enum qtype t, const float *restrict x, int64_t k, void *restrict dst);
void cpu__matmul_rows_avx512(enum qtype t, const void *restrict w, int64_t k, int64_t n0,
                             int64_t n1, const void *restrict act, int64_t T, float *restrict y,
                             int64_t ldy);

/* AVX-512 F + BW + VL + DQ and AVX512-VNNI, Q4_0, Q4_1 and Q8_0 weights only:
 * sixteen weight rows per vector, one per int32 lane (matmul_rows16_avx512.c).
 * What cpu_matmul_rows runs for those types when the CPU has VNNI. */
void cpu__matmul_rows16_avx512_vnni(enum qtype t, const void *restrict w, int64_t k, int64_t n0,
                                    int64_t n1, const void *restrict act, int64_t T,
                                    float *restrict y, int64_t ldy);

/* The same kernel on weights cpu_pack_rows repacked: cpu_matmul_rows_packed's contract. */
void cpu__matmul_rows16_packed_avx512_vnni(enum qtype t, const void *restrict wp, int64_t k,
                                           int64_t N, int64_t n0, int64_t n1,
                                           const void *restrict act, int64_t T, float *restrict y,
                                           int64_t ldy);

/* The AVX2 kernel for Q4_0, Q4_1 and Q8_0 (matmul_rows16_ymm.h): the VNNI
 * kernel's steps, the same bits; on rows as they are (cpu_matmul_rows) and on
 * repacked ones (cpu_matmul_rows_packed). */
void cpu__matmul_rows16_avx2(enum qtype t, const void *restrict w, int64_t k, int64_t n0,
                             int64_t n1, const void *restrict act, int64_t T, float *restrict y,
                             int64_t ldy);
void cpu__matmul_rows16_packed_avx2(enum qtype t, const void *restrict wp, int64_t k, int64_t N,
                                    int64_t n0, int64_t n1, const void *restrict act, int64_t T,
                                    float *restrict y, int64_t ldy);
/* The same kernel built for AVX-VNNI (matmul_rows16_avxvnni.c): the same
 * bits; call only where cpu__has_avxvnni(). */
void cpu__matmul_rows16_avxvnni(enum qtype t, const void *restrict w, int64_t k, int64_t n0,
                                int64_t n1, const void *restrict act, int64_t T, float *restrict y,
                                int64_t ldy);
void cpu__matmul_rows16_packed_avxvnni(enum qtype t, const void *restrict wp, int64_t k, int64_t N,
                                       int64_t n0, int64_t n1, const void *restrict act, int64_t T,
                                       float *restrict y, int64_t ldy);

/* The repacked layout (matmul.h): the bytes of a block's quants in a group
 * of sixteen rows (Q4: 4, Q8_0: 8 runs of 64), and of the whole block, the
 * quants followed by the sixteen f16 scales d and (Q4_1) sixteen f16 m. */
static inline __attribute__((always_inline)) size_t cpu__packed_qb(enum qtype t)
{
    return t == QTYPE_Q8_0 ? 8 * 64 : 4 * 64;
}

static inline __attribute__((always_inline)) size_t cpu__packed_bs(enum qtype t)
{
    return cpu__packed_qb(t) + (t == QTYPE_Q4_1 ? 64 : 32);
}

/* What a block's quants are stored offset by, as unsigned bytes: Q4_0's
 * nibbles are w + 8, Q8_0's bytes w + 128 (quant.h); Q4_1's nibbles are
 * unsigned. A kernel that multiplies them as they are subtracts
 * bias * sum(a) per block. */
static inline __attribute__((always_inline)) int cpu__packed_bias(enum qtype t)
{
    return t == QTYPE_Q8_0 ? 128 : t == QTYPE_Q4_0 ? 8 : 0;
}

/* Block b of the sixteen rows at rows (rb bytes apart; the last 16 - nr
 * repeat row nr - 1) in cpu_pack_rows' layout at dst (16 * the block's
 * bytes). */
void cpu__pack_block(enum qtype t, const void *rows, size_t rb, int nr, int64_t b, void *dst);

/* 1 when the CPU has AVX512-VNNI (cached). */
int cpu__has_vnni(void);
/* 1 when the CPU has AVX2 and AVX-VNNI and STREAMSINK_ISA does not cap it
 * below avxvnni (cached): the AVX2-level sixteen-row products then take the
 * AVX-VNNI build of their kernel. */
int cpu__has_avxvnni(void);

#endif
