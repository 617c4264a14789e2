/*
 * test_cpu_ops.c: the CPU backend's element-wise kernels (engine/cpu/ops.h)
 * against their scalar forms: SwiGLU with the C library's expf (relative
 * tolerance: the vector e^x is within 2e-7 relative, one division and two
 * products add a few ulps: 1e-6) and each value's result independent of the
 * span it is in, the AVX-512 SwiGLU against the AVX2 one bit for bit, the RoPE rotation against
 * rope_apply bit for bit, the F16C row conversion against quant_f32_to_f16 bit for bit (every
 * rounding case: ties, subnormals, overflow, infinities), the Q8_0 row quantizer of the 8-bit KV
 * store against quant_quantize_row byte for byte, and RMSNorm's sum of squares, its scaling and the
 * residual add against their scalar loops bit for bit.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "engine/cpu/matmul.h"
#include "engine/cpu/ops.h"
#include "engine/quant.h"
#include "engine/rope.h"
#include "test.h"
#include "support/rng.h"

#define N 4099 /* not a multiple of 8: the scalar tail too */

TEST(swiglu_matches_the_scalar_formula)
{
    if (cpu_isa_best() < CPU_ISA_AVX2)
        TEST_SKIP("no AVX2");
    static float g[N], u[N], out[N];
    uint64_t s = 5;
    for (int i = 0; i < N; i++) {
        /* gates over the whole range the exponential sees, and beyond */
        g[i] = i < 16 ? (float)(i - 8) * 15.0f : (float)test_rng_normal(&s) * 6.0f;
        u[i] = test_rng_sym(&s) * 3.0f;
    }
    memcpy(out, g, sizeof out);
    cpu__swiglu_avx2(out, u, N);
    for (int i = 0; i < N; i++) {
        double ref = (double)g[i] / (1.0 + exp(-(double)g[i])) * u[i];
        double tol = 1e-6 * fabs(ref) + 1e-30;
        if (!(fabs(out[i] - ref) <= tol))
            FAIL_AT("[%d] gate %.6g up %.6g: %.9g vs %.9g", i, g[i], u[i], out[i], ref);
    }
}

/* Each value's SwiGLU depends on its inputs alone: the fused products call
 * the kernel on spans that start and end anywhere (the row blocks a part
 * made), and a value must come out the same whichever span holds it. */
TEST(swiglu_values_do_not_depend_on_the_span)
{
    if (cpu_isa_best() < CPU_ISA_AVX2)
        TEST_SKIP("no AVX2");
    static float g[N], u[N], whole[N], part[N];
    uint64_t s = 11;
    for (int i = 0; i < N; i++) {
        g[i] = (float)test_rng_normal(&s) * 6.0f;
        u[i] = test_rng_sym(&s) * 3.0f;
    }
    memcpy(whole, g, sizeof whole);
    cpu__swiglu_avx2(whole, u, N);
    for (int shift = 0; shift < 8; shift++) {
        /* spans of 1 .. 23 values, the first starting at shift */
        memcpy(part, g, sizeof part);
        cpu__swiglu_avx2(part, u, shift);
        for (int i = shift, len = 1; i < N; i += len, len = len % 23 + 1)
            cpu__swiglu_avx2(part + i, u + i, i + len <= N ? len : N - i);
        for (int i = 0; i < N; i++)
            if (memcmp(&part[i], &whole[i], sizeof(float)) != 0)
                FAIL_AT("[%d] shift %d: %.9g in short spans, %.9g in one", i, shift, part[i],
                        whole[i]);
    }
}

/* The AVX-512 SwiGLU is the AVX2 kernel's arithmetic sixteen values at a
 * time: the same bits for every value (the exponential's clamps, zeros,
 * infinities and NaN gates included), in one span or in short ones. */
TEST(swiglu_avx512_is_the_avx2_kernel_bit_for_bit)
{
    if (cpu_isa_best() < CPU_ISA_AVX512)
        TEST_SKIP("no AVX-512");
    static float g[N], u[N], want[N], got[N];
    uint64_t s = 13;
    const float special[] = {0.0f,  -0.0f,  87.0f,    -87.0f,    88.5f, -88.5f,
                             1e30f, -1e30f, INFINITY, -INFINITY, NAN,   1e-40f};
    for (int i = 0; i < N; i++) {
        g[i] = i < 12 ? special[i] : (float)test_rng_normal(&s) * 8.0f;
        u[i] = test_rng_sym(&s) * 3.0f;
    }
    memcpy(want, g, sizeof want);
    cpu__swiglu_avx2(want, u, N);
    memcpy(got, g, sizeof got);
    cpu__swiglu_avx512(got, u, N);
    for (int i = 0; i < N; i++)
        if (memcmp(&got[i], &want[i], sizeof(float)) != 0)
            FAIL_AT("[%d] gate %.9g: %.9g vs the AVX2 kernel's %.9g", i, g[i], got[i], want[i]);
    /* spans of 1 .. 37 values */
    memcpy(got, g, sizeof got);
    for (int i = 0, len = 1; i < N; i += len, len = len % 37 + 1)
        cpu__swiglu_avx512(got + i, u + i, i + len <= N ? len : N - i);
    for (int i = 0; i < N; i++)
        if (memcmp(&got[i], &want[i], sizeof(float)) != 0)
            FAIL_AT("[%d] gate %.9g in short spans: %.9g vs %.9g", i, g[i], got[i], want[i]);
}

/* The AVX2 rotation is rope_apply's arithmetic, bit for bit: heads of 64 and
 * 80 values, rope_dim the whole head or a part of it (a multiple of 8, or
 * not: the scalar pairs after the vector ones), angles from small and huge
 * positions. */
TEST(rope_rotation_is_rope_apply_bit_for_bit)
{
    if (cpu_isa_best() < CPU_ISA_AVX2)
        TEST_SKIP("no AVX2");
    static const int shapes[][2] = {{64, 64}, {64, 32}, {80, 80}, {80, 42}, {64, 6}};
    static const int64_t pos[] = {0, 1, 7, 4095, 1000003, (int64_t)1 << 40};
    enum { HEADS = 5, DMAX = 80 };
    float x[HEADS * DMAX], want[HEADS * DMAX], got[HEADS * DMAX], cs[DMAX];
    uint64_t s = 3;
    long compared = 0;
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        const int hd = shapes[k][0], rd = shapes[k][1];
        for (size_t p = 0; p < sizeof pos / sizeof pos[0]; p++) {
            rope_cos_sin(pos[p], 10000.0, rd, cs);
            for (int i = 0; i < HEADS * hd; i++)
                x[i] = (float)test_rng_normal(&s) * (i % 7 == 0 ? 100.0f : 1.0f);
            memcpy(want, x, sizeof x);
            memcpy(got, x, sizeof x);
            rope_apply(want, HEADS, hd, rd, cs);
            cpu__rope_apply_avx2(got, HEADS, hd, rd, cs);
            for (int i = 0; i < HEADS * hd; i++, compared++)
                if (memcmp(&got[i], &want[i], sizeof(float)) != 0)
                    FAIL_AT("head_dim %d rope_dim %d pos %lld [%d]: %.9g vs rope_apply's %.9g", hd,
                            rd, (long long)pos[p], i, got[i], want[i]);
        }
    }
    printf("  %ld values compared\n", compared);
}

TEST(f16_rows_round_like_quant_f32_to_f16)
{
    if (cpu_isa_best() < CPU_ISA_AVX2)
        TEST_SKIP("no AVX2");
    static float x[N];
    static uint16_t h[N];
    uint64_t s = 11;
    const float edge[] = {
        0.0f,     -0.0f,    65504.0f,     65519.99f,       65520.0f,          -65520.0f,
        1e9f,     INFINITY, -INFINITY,    0x1p-24f,        0x1p-25f,          0x1.8p-25f,
        0x1p-26f, 0x1p-14f, 0x1.ffcp-15f, 1.0f + 0x1p-11f, 1.0f + 0x1.8p-10f, -2.5e-6f};
    const int ne = (int)(sizeof edge / sizeof edge[0]);
    for (int i = 0; i < N; i++) {
        if (i < ne) {
            x[i] = edge[i];
        } else {
            /* random bit patterns over the f16 range, ties included */
            uint32_t bits = (uint32_t)test_rng_u64(&s);
            uint32_t e = 100 + (uint32_t)test_rng_below(&s, 45); /* 2^-27 .. 2^17 */
            bits = (bits & 0x807fffffu) | (e << 23);
            if (i % 4 == 0)
                bits &= ~0xfffu; /* exact ties and near-ties */
            memcpy(&x[i], &bits, 4);
        }
    }
    cpu__f32_to_f16_avx2(h, x, N);
    for (int i = 0; i < N; i++)
        if (h[i] != quant_f32_to_f16(x[i]))
            FAIL_AT("[%d] %a: 0x%04x vs quant_f32_to_f16 0x%04x", i, x[i], h[i],
                    quant_f32_to_f16(x[i]));
}

/* The Q8_0 KV store's AVX2 quantizer writes exactly quant_quantize_row's
 * bytes: random blocks over many scales, blocks whose scaled values fall on
 * halves (amax 127, so d = 1: roundf's ties away from zero, and the
 * largest floats below a half), all zero, -0, subnormal, two NaN (one in
 * the last eight values, which a max in the wrong operand order lets
 * through), one infinity, and the largest finite values. */
TEST(q8_0_rows_quantize_like_quant_quantize_row)
{
    if (cpu_isa_best() < CPU_ISA_AVX2)
        TEST_SKIP("no AVX2");
    enum { B = 64, K = B * 32 };
    static float x[K];
    static struct block_q8_0 got[B], want[B];
    uint64_t s = 29;
    for (int round = 0; round < 200; round++) {
        for (int b = 0; b < B; b++) {
            float *xb = x + b * 32;
            const int kind = (b + round) % 9;
            const float scale = ldexpf(1.0f, (int)test_rng_below(&s, 60) - 30);
            for (int j = 0; j < 32; j++) {
                switch (kind) {
                case 0: /* halves and just below: d = 1 */
                    xb[j] = j == 0 ? 127.0f
                                   : (float)((int)test_rng_below(&s, 254) - 127) +
                                         (j % 2 ? 0.5f : nextafterf(0.5f, 0.0f));
                    break;
                case 1:
                    xb[j] = 0.0f;
                    break;
                case 2:
                    xb[j] = j % 2 ? -0.0f : 0x1p-140f * (float)j;
                    break;
                case 3:
                    xb[j] = j == 7 || j == 30 ? NAN : test_rng_sym(&s) * scale;
                    break;
                case 4:
                    xb[j] = j == 9 ? -INFINITY : test_rng_sym(&s) * scale;
                    break;
                case 5:
                    xb[j] = j % 3 ? 3.4e38f : -3.4e38f;
                    break;
                default:
                    xb[j] = (float)test_rng_normal(&s) * scale;
                    break;
                }
            }
        }
        memset(got, 0xa5, sizeof got);
        quant_quantize_row(QTYPE_Q8_0, x, want, K);
        cpu__quantize_row_q8_0_avx2(got, x, K);
        for (int b = 0; b < B; b++)
            if (memcmp(&got[b], &want[b], sizeof got[b]) != 0)
                FAIL_AT("round %d block %d (kind %d): bytes differ from quant_quantize_row", round,
                        b, (b + round) % 9);
    }
}

/* The backend's scalar sum of squares (backend_cpu.c): eight chains in
 * double, the values after the last multiple of eight in chain 0, a fixed
 * tree at the end. */
static double sum_squares_ref(const float *x, int64_t n)
{
    double c[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++)
            c[k] += (double)x[i + k] * x[i + k];
    for (; i < n; i++)
        c[0] += (double)x[i] * x[i];
    return ((c[0] + c[1]) + (c[2] + c[3])) + ((c[4] + c[5]) + (c[6] + c[7]));
}

/* Values over many scales, so that a sum of the squares in another order or
 * with a fused multiply-add rounds differently somewhere. */
static void fill_scaled(float *x, int n, uint64_t *s)
{
    for (int i = 0; i < n; i++)
        x[i] = test_rng_sym(s) * ldexpf(1.0f, (int)test_rng_below(s, 40) - 20);
}

/* Row lengths around the vector width and the model's (576, 1536), and N. */
static const int lens[] = {0, 1, 3, 7, 8, 9, 15, 16, 17, 63, 64, 65, 576, 1536, N};

TEST(rmsnorm_sum_of_squares_is_the_scalar_chains_bit_for_bit)
{
    if (cpu_isa_best() < CPU_ISA_AVX2)
        TEST_SKIP("no AVX2");
    static float x[N];
    uint64_t s = 31;
    for (int round = 0; round < 50; round++) {
        fill_scaled(x, N, &s);
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
            /* from an offset too: the vector loads are unaligned */
            const int off = round % 5, n = lens[li] + off <= N ? lens[li] : N - off;
            const double want = sum_squares_ref(x + off, n),
                         got = cpu__sum_squares_avx2(x + off, n);
            if (memcmp(&got, &want, sizeof got) != 0)
                FAIL_AT("round %d n %d: %.17g vs %.17g", round, n, got, want);
        }
    }
}

TEST(rmsnorm_scaling_and_the_residual_add_are_the_scalar_loops_bit_for_bit)
{
    if (cpu_isa_best() < CPU_ISA_AVX2)
        TEST_SKIP("no AVX2");
    static float x[N], g[N], y[N], got[N], want[N];
    uint64_t s = 37;
    for (int round = 0; round < 20; round++) {
        fill_scaled(x, N, &s);
        fill_scaled(g, N, &s);
        fill_scaled(y, N, &s);
        const float sc = test_rng_sym(&s) * 8.0f;
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
            const int n = lens[li];
            /* o = (x * s) * g, into another row and in place */
            for (int i = 0; i < n; i++)
                want[i] = x[i] * sc * g[i];
            memset(got, 0xa5, sizeof got);
            cpu__scale_mul_avx2(got, x, sc, g, n);
            if (memcmp(got, want, (size_t)n * sizeof(float)) != 0)
                FAIL_AT("round %d n %d: scaling differs", round, n);
            memcpy(got, x, (size_t)n * sizeof(float));
            cpu__scale_mul_avx2(got, got, sc, g, n);
            if (memcmp(got, want, (size_t)n * sizeof(float)) != 0)
                FAIL_AT("round %d n %d: scaling in place differs", round, n);
            const uint32_t fill = 0xa5a5a5a5u;
            if (n < N && memcmp(&got[n], &fill, sizeof fill) != 0)
                FAIL_AT("round %d n %d: the scaling wrote past the row", round, n);
            /* x += y */
            for (int i = 0; i < n; i++)
                want[i] = x[i] + y[i];
            memcpy(got, x, sizeof got);
            cpu__add_avx2(got, y, n);
            if (memcmp(got, want, (size_t)n * sizeof(float)) != 0)
                FAIL_AT("round %d n %d: the add differs", round, n);
            if (n < N && memcmp(&got[n], &x[n], sizeof(float)) != 0)
                FAIL_AT("round %d n %d: the add wrote past the row", round, n);
        }
    }
}

TEST_MAIN()
