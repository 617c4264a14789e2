/*
 * matmul.c: run-time ISA choice and dispatch for the CPU matrix products
 * (API in matmul.h). The kernels live in matmul_avx2.c, matmul_avx512.c,
 * matmul_rows16_avx512.c, matmul_rows16_avx2.c and matmul_rows16_avxvnni.c
 * (two builds of matmul_rows16_ymm.h) and matmul_kquant_*.c (K-quants),
 * which are compiled with their ISA enabled; nothing here calls into them
 * unless CPUID (and the OS, which __builtin_cpu_supports also checks
 * through XGETBV) says the instructions exist. The scalar ISA is the
 * reference in quant.c, looped: slow, and what everything else is tested
 * against.
 */
#include "matmul.h"
#include "matmul_impl.h"
#include "matmul_kquant.h"

#include <assert.h>
#include <cpuid.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static pthread_once_t detect_once = PTHREAD_ONCE_INIT;
static enum cpu_isa detected_isa;
static int detected_vnni;
static int detected_avxvnni;

static int has_f16c(void)
{
    unsigned int a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return 0;
    return (c & bit_F16C) != 0;
}

/* AVX-VNNI, the VEX-encoded VPDPBUSD: CPUID leaf 7, sub-leaf 1, EAX bit 4
 * (the OS's saving of the YMM state is part of the AVX2 check). */
static int has_avxvnni(void)
{
    unsigned int a, b, c, d;
    if (!__get_cpuid_count(7, 1, &a, &b, &c, &d))
        return 0;
    return (a & (1u << 4)) != 0;
}

/* Runs once. STREAMSINK_ISA can only lower the choice: asking for an ISA the
 * CPU lacks must not crash. */
static void detect(void)
{
    enum cpu_isa best = CPU_ISA_SCALAR;

    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c()) {
        best = CPU_ISA_AVX2;
        /* DQ too: matmul_avx512.c is compiled with -mavx512dq, and every CPU
         * with BW and VL has it. */
        if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
            __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
            best = CPU_ISA_AVX512;
    }
    detected_vnni = best == CPU_ISA_AVX512 && __builtin_cpu_supports("avx512vnni");
    detected_avxvnni = best >= CPU_ISA_AVX2 && has_avxvnni();

    const char *cap = getenv("STREAMSINK_ISA");
    if (cap) {
        if (strcmp(cap, "scalar") == 0) {
            best = CPU_ISA_SCALAR;
            detected_avxvnni = 0;
        } else if (strcmp(cap, "avx2") == 0 || strcmp(cap, "avxvnni") == 0) {
            if (best > CPU_ISA_AVX2)
                best = CPU_ISA_AVX2;
            if (strcmp(cap, "avx2") == 0)
                detected_avxvnni = 0;
        }
    }
    detected_isa = best;
}

enum cpu_isa cpu_isa_best(void)
{
    pthread_once(&detect_once, detect);
    return detected_isa;
}

int cpu__has_vnni(void)
{
    pthread_once(&detect_once, detect);
    return detected_vnni;
}

int cpu__has_avxvnni(void)
{
    pthread_once(&detect_once, detect);
    return detected_avxvnni;
}

const char *cpu_isa_name(enum cpu_isa isa)
{
    switch (isa) {
    case CPU_ISA_SCALAR:
        return "scalar";
    case CPU_ISA_AVX2:
        return "avx2";
    case CPU_ISA_AVX512:
        return "avx512";
    }
    return "unknown";
}

static int is_quantized(enum qtype t)
{
    return t == QTYPE_Q8_0 || t == QTYPE_Q4_0 || t == QTYPE_Q4_1 || qtype_is_k(t);
}

void cpu_prepare_act(enum cpu_isa isa, enum qtype t, const float *restrict x, int64_t k,
                     void *restrict dst)
{
    assert(qtype_supported(t) && (!is_quantized(t) || k % QK == 0));
    /* every quantized type takes the same Q8 activation row */
    if (qtype_is_k(t))
        t = QTYPE_Q8_0;
    switch (isa) {
    case CPU_ISA_AVX512:
        cpu__prepare_act_avx512(t, x, k, dst);
        break;
    case CPU_ISA_AVX2:
        cpu__prepare_act_avx2(t, x, k, dst);
        break;
    case CPU_ISA_SCALAR:
        quant_prepare_act_ref(t, x, k, dst);
        break;
    }
}

void cpu_matmul_rows(enum cpu_isa isa, enum qtype t, const void *restrict w, int64_t k, int64_t n0,
                     int64_t n1, const void *restrict act, int64_t T, float *restrict y,
                     int64_t ldy)
{
    assert(qtype_supported(t) && (!is_quantized(t) || k % QK == 0));
    assert(0 <= n0 && n0 <= n1 && (T <= 1 || ldy >= n1));
    if (qtype_is_k(t) && isa == CPU_ISA_AVX512) {
        cpu__matmul_rows_kquant_avx512(t, w, k, n0, n1, act, T, y, ldy, cpu__has_vnni());
        return;
    }
    if (qtype_is_k(t) && isa == CPU_ISA_AVX2) {
        cpu__matmul_rows_kquant_avx2(t, w, k, n0, n1, act, T, y, ldy);
        return;
    }
    if (isa == CPU_ISA_AVX512 && cpu__has_vnni() &&
        (t == QTYPE_Q4_0 || t == QTYPE_Q4_1 || t == QTYPE_Q8_0)) {
        cpu__matmul_rows16_avx512_vnni(t, w, k, n0, n1, act, T, y, ldy);
        return;
    }
    if (isa == CPU_ISA_AVX2 && (t == QTYPE_Q4_0 || t == QTYPE_Q4_1 || t == QTYPE_Q8_0)) {
        if (cpu__has_avxvnni())
            cpu__matmul_rows16_avxvnni(t, w, k, n0, n1, act, T, y, ldy);
        else
            cpu__matmul_rows16_avx2(t, w, k, n0, n1, act, T, y, ldy);
        return;
    }
    switch (isa) {
    case CPU_ISA_AVX512:
        cpu__matmul_rows_avx512(t, w, k, n0, n1, act, T, y, ldy);
        break;
    case CPU_ISA_AVX2:
        cpu__matmul_rows_avx2(t, w, k, n0, n1, act, T, y, ldy);
        break;
    case CPU_ISA_SCALAR: {
        size_t row_bytes = qtype_row_bytes(t, k);
        size_t act_bytes = quant_act_bytes(t, k);
        for (int64_t tt = 0; tt < T; tt++) {
            const char *a = (const char *)act + (size_t)tt * act_bytes;
            for (int64_t n = n0; n < n1; n++)
                y[tt * ldy + n] = quant_dot_ref(t, (const char *)w + (size_t)n * row_bytes, a, k);
        }
        break;
    }
    }
}

int cpu_matmul_packs(enum cpu_isa isa, enum qtype t)
{
    return ((isa == CPU_ISA_AVX512 && cpu__has_vnni()) || isa == CPU_ISA_AVX2) &&
           (t == QTYPE_Q4_0 || t == QTYPE_Q4_1 || t == QTYPE_Q8_0);
}

void cpu__pack_block(enum qtype t, const void *rows, size_t rb, int nr, int64_t b, void *dst)
{
    const size_t bs = qtype_block_bytes(t);
    const size_t qoff = t == QTYPE_Q4_1 ? 4 : 2;  /* the quants follow d (and m) */
    const int nq = (int)(cpu__packed_qb(t) / 64); /* runs of 64 bytes per block */
    uint8_t *q = dst, *d = q + cpu__packed_qb(t), *m = d + 32;
    for (int r = 0; r < 16; r++) {
        const uint8_t *blk =
            (const uint8_t *)rows + (size_t)(r < nr ? r : nr - 1) * rb + (size_t)b * bs;
        for (int j = 0; j < nq; j++) {
            uint32_t v;
            memcpy(&v, blk + qoff + 4 * j, 4);
            if (t == QTYPE_Q8_0)
                v ^= 0x80808080u;
            memcpy(q + 64 * j + 4 * r, &v, 4);
        }
        memcpy(d + 2 * r, blk, 2);
        if (t == QTYPE_Q4_1)
            memcpy(m + 2 * r, blk + 2, 2);
    }
}

void cpu_pack_rows(enum qtype t, const void *restrict w, int64_t k, int64_t n, void *restrict dst)
{
    assert((t == QTYPE_Q4_0 || t == QTYPE_Q4_1 || t == QTYPE_Q8_0) && k % QK == 0);
    const size_t rb = qtype_row_bytes(t, k), bs = qtype_block_bytes(t);
    const int64_t nbk = k / QK, full = n / 16 * 16;
    for (int64_t g = 0; g < full; g += 16)
        for (int64_t b = 0; b < nbk; b++)
            cpu__pack_block(t, (const uint8_t *)w + (size_t)g * rb, rb, 16, b,
                            (uint8_t *)dst + (size_t)g * rb + (size_t)b * 16 * bs);
    memcpy((char *)dst + (size_t)full * rb, (const char *)w + (size_t)full * rb,
           (size_t)(n - full) * rb);
}

void cpu_matmul_rows_packed(enum cpu_isa isa, enum qtype t, const void *restrict wp, int64_t k,
                            int64_t N, int64_t n0, int64_t n1, const void *restrict act, int64_t T,
                            float *restrict y, int64_t ldy)
{
    assert(cpu_matmul_packs(isa, t) && k % QK == 0);
    assert(0 <= n0 && n0 <= n1 && n1 <= N && (T <= 1 || ldy >= n1));
    if (isa == CPU_ISA_AVX512)
        cpu__matmul_rows16_packed_avx512_vnni(t, wp, k, N, n0, n1, act, T, y, ldy);
    else if (cpu__has_avxvnni())
        cpu__matmul_rows16_packed_avxvnni(t, wp, k, N, n0, n1, act, T, y, ldy);
    else
        cpu__matmul_rows16_packed_avx2(t, wp, k, N, n0, n1, act, T, y, ldy);
}
