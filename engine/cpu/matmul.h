/*
 * matmul.h: CPU matrix products over quantized weight rows, with kernels
 * chosen at run time from CPUID: AVX-512 (F + BW + VL, VNNI when present),
 * AVX2 + FMA, or the scalar reference in quant.c. Internal to engine/.
 *
 * Y[t][n] = dot(W[n], X[t]) for weight rows n in [n0, n1) and T activation
 * rows. The activation rows are prepared once (cpu_prepare_act: Q8 blocks for
 * quantized weights, f32 for float weights); a caller splits [0, N) across
 * threads and each thread calls cpu_matmul_rows on its range.
 */
#ifndef SS_CPU_MATMUL_H
#define SS_CPU_MATMUL_H

#include <stddef.h>
#include <stdint.h>

#include "../quant.h"

enum cpu_isa { CPU_ISA_SCALAR = 0, CPU_ISA_AVX2 = 1, CPU_ISA_AVX512 = 2 };

/* Best ISA this CPU supports (cached). STREAMSINK_ISA=scalar|avx2|avx512 in
 * the environment caps it (for tests and benchmarks); avxvnni caps it at
 * AVX2 as avx2 does but keeps AVX-VNNI (256-bit VPDPBUSD) where the CPU has
 * it, which plain avx2 leaves out. */
enum cpu_isa cpu_isa_best(void);
const char *cpu_isa_name(enum cpu_isa isa);

/* Prepares one activation row of k values for weights of type t into dst
 * (quant_act_bytes(t, k) bytes). */
void cpu_prepare_act(enum cpu_isa isa, enum qtype t, const float *restrict x, int64_t k,
                     void *restrict dst);

/* For n in [n0, n1), tt in [0, T): y[tt * ldy + n] = dot(W row n, act row tt).
 * W has rows of k values of type t, row_bytes = qtype_row_bytes(t, k) apart;
 * act rows are quant_act_bytes(t, k) apart. */
void cpu_matmul_rows(enum cpu_isa isa, enum qtype t, const void *restrict w, int64_t k, int64_t n0,
                     int64_t n1, const void *restrict act, int64_t T, float *restrict y,
                     int64_t ldy);

/* Repacked weights. The sixteen-row kernels (VNNI, and AVX2 where there is no
 * VNNI) read each weight row group transposed; cpu_pack_rows does that once
 * (at load) instead of once per call.
 * cpu_matmul_packs says whether cpu_matmul_rows_packed takes type t on isa
 * (Q4_0, Q4_1 and Q8_0, on AVX-512 with VNNI and on AVX2); when it does not,
 * keep the rows as they are and call cpu_matmul_rows.
 *
 * Layout: the same bytes as the n rows (qtype_row_bytes(t, k) * n). Rows
 * 16g .. 16g+15 of every full group of sixteen fill that group's place,
 * block after block (each block's sixteen rows take 16 * the block's bytes),
 * each block b in three parts: the quants (Q4: 4, Q8_0: 8 runs of 64 bytes;
 * bytes 4r .. 4r+3 of run j are bytes 4j .. 4j+3 of row r's quants in block
 * b, Q8_0 quants stored as unsigned w + 128); then the sixteen f16 scales d,
 * row r at [r]; then (Q4_1) the sixteen f16 minimums m alike. A group is
 * thus read front to back in one pass. The last n % 16 rows are copied as
 * they are. */
int cpu_matmul_packs(enum cpu_isa isa, enum qtype t);
void cpu_pack_rows(enum qtype t, const void *restrict w, int64_t k, int64_t n, void *restrict dst);

/* cpu_matmul_rows on a matrix of N rows repacked by cpu_pack_rows, for a
 * type and ISA cpu_matmul_packs takes; bit-identical to cpu_matmul_rows on
 * the rows as they were. */
void cpu_matmul_rows_packed(enum cpu_isa isa, enum qtype t, const void *restrict wp, int64_t k,
                            int64_t N, int64_t n0, int64_t n1, const void *restrict act, int64_t T,
                            float *restrict y, int64_t ldy);

#endif
