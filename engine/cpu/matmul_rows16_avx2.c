/* matmul_rows16_avx2.c: the 256-bit sixteen-row kernel (its source and
 * description: matmul_rows16_ymm.h) for CPUs with AVX2, FMA and F16C. */
#include "matmul_rows16_ymm.h"
