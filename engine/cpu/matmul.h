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
 * the environment caps it (for tests and benchmarks). */
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

#endif
