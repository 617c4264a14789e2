/* matmul_rows16_avxvnni.c: the 256-bit sixteen-row kernel (its source and
 * description: matmul_rows16_ymm.h) for CPUs that also have AVX-VNNI: one
 * VPDPBUSD per run and row, the same bits as the AVX2 build. */
#define ROWS16_AVXVNNI 1
#include "matmul_rows16_ymm.h"
