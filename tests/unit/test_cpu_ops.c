/*
 * test_cpu_ops.c: the CPU backend's element-wise kernels (engine/cpu/ops.h)
 * against their scalar forms: SwiGLU with the C library's expf (relative
 * tolerance: the vector e^x is within 2e-7 relative, one division and two
 * products add a few ulps: 1e-6), and the F16C row conversion against
 * quant_f32_to_f16 bit for bit (every rounding case: ties, subnormals,
 * overflow, infinities).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "engine/cpu/matmul.h"
#include "engine/cpu/ops.h"
#include "engine/quant.h"
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

TEST_MAIN()
