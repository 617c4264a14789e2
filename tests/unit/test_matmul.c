/*
 * test_matmul.c: every CPU matmul kernel against the scalar reference
 * (quant_prepare_act_ref + quant_dot_ref), for all six weight types, on odd
 * shapes: K in {32, 64, 576, 1536} (and K not a multiple of the vector width
 * for float weights), weight row ranges that do not start at 0, T activation
 * rows from 1 to 16, ldy > N. Kernels the CPU lacks are skipped, by name.
 *
 * The AVX-512 files (matmul_avx512.c, and matmul_rows16_avx512.c, which
 * needs AVX512-VNNI) are also compiled a second time into this test against
 * SIMDe's portable AVX-512 (when libsimde-dev is installed), so their logic
 * is checked on machines without AVX-512 or VNNI too.
 */
#include "support/rng.h"
#include "test.h"

#include <float.h>
#include <stdint.h>

#include "engine/cpu/matmul.h"
#include "engine/cpu/matmul_impl.h"

/* ---- AVX-512 under emulation ------------------------------------------- */

#include "support/simde_avx512_begin.h"
#ifdef SS_EMULATE_AVX512
#define AVX512_DPBUSD simde_mm512_dpbusd_epi32
#define cpu__prepare_act_avx512 emu_prepare_act_avx512
#define cpu__matmul_rows_avx512 emu_matmul_rows_avx512
#define cpu__matmul_rows16_avx512_vnni emu_matmul_rows16_avx512_vnni
#define cpu__matmul_rows16_packed_avx512_vnni emu_matmul_rows16_packed_avx512_vnni
void emu_prepare_act_avx512(enum qtype t, const float *restrict x, int64_t k, void *restrict dst);
void emu_matmul_rows_avx512(enum qtype t, const void *restrict w, int64_t k, int64_t n0, int64_t n1,
                            const void *restrict act, int64_t T, float *restrict y, int64_t ldy);
void emu_matmul_rows16_avx512_vnni(enum qtype t, const void *restrict w, int64_t k, int64_t n0,
                                   int64_t n1, const void *restrict act, int64_t T,
                                   float *restrict y, int64_t ldy);
void emu_matmul_rows16_packed_avx512_vnni(enum qtype t, const void *restrict wp, int64_t k,
                                          int64_t N, int64_t n0, int64_t n1,
                                          const void *restrict act, int64_t T, float *restrict y,
                                          int64_t ldy);
#include "engine/cpu/matmul_avx512.c"
/* the two files' own macros of the same names */
#undef TILE_T
#undef INLINE
#include "engine/cpu/matmul_rows16_avx512.c"
#undef cpu__prepare_act_avx512
#undef cpu__matmul_rows_avx512
#undef cpu__matmul_rows16_avx512_vnni
#undef cpu__matmul_rows16_packed_avx512_vnni
#endif
#include "support/simde_avx512_end.h"

/* ---- the kernels under test ---------------------------------------------- */

enum path {
    PATH_DISPATCH,    /* cpu_prepare_act / cpu_matmul_rows with an ISA */
    PATH_AVX512_BASE, /* cpu__matmul_rows_avx512 on a VNNI CPU: what CPUs with
                         AVX-512 but without VNNI run */
    PATH_EMU_BASE,    /* SIMDe-emulated cpu__matmul_rows_avx512 */
    PATH_EMU_VNNI,    /* SIMDe-emulated AVX-512 as dispatched on a VNNI CPU: the
                         sixteen-row kernel for Q4_0, Q4_1 and Q8_0 */
};

struct kernel {
    const char *name;
    enum path path;
    enum cpu_isa isa;
};

static void kernel_prepare(const struct kernel *kn, enum qtype t, const float *x, int64_t k,
                           void *dst)
{
    switch (kn->path) {
    case PATH_DISPATCH:
    case PATH_AVX512_BASE:
        cpu_prepare_act(kn->isa, t, x, k, dst);
        break;
    case PATH_EMU_BASE:
    case PATH_EMU_VNNI:
#ifdef SS_EMULATE_AVX512
        emu_prepare_act_avx512(t, x, k, dst);
#endif
        break;
    }
}

static void kernel_matmul(const struct kernel *kn, enum qtype t, const void *w, int64_t k,
                          int64_t n0, int64_t n1, const void *act, int64_t T, float *y, int64_t ldy)
{
    switch (kn->path) {
    case PATH_DISPATCH:
        cpu_matmul_rows(kn->isa, t, w, k, n0, n1, act, T, y, ldy);
        break;
    case PATH_AVX512_BASE:
        cpu__matmul_rows_avx512(t, w, k, n0, n1, act, T, y, ldy);
        break;
    case PATH_EMU_BASE:
    case PATH_EMU_VNNI:
#ifdef SS_EMULATE_AVX512
        /* the same choice as cpu_matmul_rows */
        if (kn->path == PATH_EMU_VNNI && (t == QTYPE_Q4_0 || t == QTYPE_Q4_1 || t == QTYPE_Q8_0))
            emu_matmul_rows16_avx512_vnni(t, w, k, n0, n1, act, T, y, ldy);
        else
            emu_matmul_rows_avx512(t, w, k, n0, n1, act, T, y, ldy);
#endif
        break;
    }
}

/* The kernels this machine can run; prints the ones it skips. */
static int list_kernels(struct kernel *out)
{
    static int printed;
    enum cpu_isa best = cpu_isa_best();
    int n = 0;

    out[n++] = (struct kernel){"scalar", PATH_DISPATCH, CPU_ISA_SCALAR};
    if (best >= CPU_ISA_AVX2)
        out[n++] = (struct kernel){"avx2", PATH_DISPATCH, CPU_ISA_AVX2};
    else if (!printed)
        printf("skip avx2: not available (or capped by STREAMSINK_ISA)\n");
    if (best >= CPU_ISA_AVX512) {
        out[n++] = (struct kernel){cpu__has_vnni() ? "avx512-vnni" : "avx512", PATH_DISPATCH,
                                   CPU_ISA_AVX512};
        if (cpu__has_vnni())
            out[n++] = (struct kernel){"avx512 without vnni", PATH_AVX512_BASE, CPU_ISA_AVX512};
        else if (!printed)
            printf("skip avx512-vnni: this CPU has AVX-512 without VNNI\n");
    } else if (!printed) {
        printf("skip avx512: not available (or capped by STREAMSINK_ISA)\n");
    }
#ifdef SS_EMULATE_AVX512
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        out[n++] = (struct kernel){"avx512 (SIMDe emulation)", PATH_EMU_BASE, CPU_ISA_AVX512};
        out[n++] = (struct kernel){"avx512-vnni (SIMDe emulation)", PATH_EMU_VNNI, CPU_ISA_AVX512};
    } else if (!printed) {
        printf("skip avx512 emulation: it runs on AVX2, which this CPU lacks\n");
    }
#else
    if (!printed)
        printf("skip avx512 emulation: SIMDe headers not installed (libsimde-dev)\n");
#endif
    printed = 1;
    return n;
}

/* ---- inputs ------------------------------------------------------------- */

#define K_MAX 1536
#define N_MAX 40
#define T_MAX 16

static const enum qtype all_types[] = {QTYPE_F32,  QTYPE_F16,  QTYPE_BF16,
                                       QTYPE_Q8_0, QTYPE_Q4_0, QTYPE_Q4_1};

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static float rand_unit(void)
{
    return test_rng_sym(&rng);
}

/* Random values with a different scale per 32-block, an occasional outlier,
 * and some all-zero blocks. */
static void fill(float *x, int64_t k)
{
    for (int64_t i = 0; i < k; i++) {
        int64_t b = i / 32;
        float scale = (float)pow(10.0, (double)(b % 5) - 2.0);
        x[i] = b % 11 == 10 ? 0.0f : rand_unit() * scale;
        if (i % 97 == 13)
            x[i] *= 40.0f;
    }
}

/* rows weight rows of k values of type t. Q8_0 rows get some -128 bytes: our
 * quantizer never writes them, but a file may hold them. */
static void make_weights(enum qtype t, int64_t rows, int64_t k, uint8_t *w)
{
    static float x[K_MAX];
    size_t rb = qtype_row_bytes(t, k);
    for (int64_t r = 0; r < rows; r++) {
        fill(x, k);
        quant_quantize_row(t, x, w + (size_t)r * rb, k);
        if (t == QTYPE_Q8_0 && r % 3 == 1) {
            struct block_q8_0 *blk = (struct block_q8_0 *)(w + (size_t)r * rb);
            blk[0].qs[5] = -128;
            blk[k / 32 - 1].qs[31] = -128;
        }
    }
}

/* The sum of the magnitudes of everything a kernel may add up in float, and
 * how many such terms there are: what any summation order's rounding error is
 * proportional to. A SIMD kernel splits each block's integer dot across
 * vector lanes and scales each lane's partial sum separately, so for
 * quantized weights the terms are d_w * d_a * |w_j q_j| over every value (an
 * upper bound on the lane partials, which may cancel within a block), at most
 * 8 lanes per block, plus Q4_1's m_w * s_a per block. */
static double dot_magnitude(enum qtype t, const uint8_t *w, const uint8_t *a, int64_t k,
                            int *nterms)
{
    static float wf[K_MAX + 64];
    double sum = 0.0;

    quant_dequant_row(t, w, wf, k);
    if (qtype_block_values(t) == 1) {
        const float *x = (const float *)a;
        for (int64_t i = 0; i < k; i++)
            sum += fabs((double)wf[i] * x[i]);
        *nterms = (int)k;
        return sum;
    }
    const struct block_q8_act *ab = (const struct block_q8_act *)a;
    for (int64_t b = 0; b < k / 32; b++) {
        for (int j = 0; j < 32; j++)
            sum += fabs((double)wf[b * 32 + j] * ((double)ab[b].d * ab[b].qs[j]));
        if (t == QTYPE_Q4_1) {
            const struct block_q4_1 *wb = (const struct block_q4_1 *)w + b;
            /* the offset term, and its share of d * nib + m in wf above */
            sum += 2.0 * fabs((double)quant_f16_to_f32(wb->m) * ab[b].s);
        }
    }
    *nterms = (int)((t == QTYPE_Q4_1 ? 9 : 8) * (k / 32));
    return sum;
}

/* ---- tests ----------------------------------------------------------------- */

TEST(isa_names_and_detection_are_consistent)
{
    enum cpu_isa best = cpu_isa_best();
    ASSERT(best >= CPU_ISA_SCALAR && best <= CPU_ISA_AVX512);
    ASSERT_EQ(cpu_isa_best(), best);
    ASSERT_STREQ(cpu_isa_name(CPU_ISA_SCALAR), "scalar");
    ASSERT_STREQ(cpu_isa_name(CPU_ISA_AVX2), "avx2");
    ASSERT_STREQ(cpu_isa_name(CPU_ISA_AVX512), "avx512");
    ASSERT(!cpu__has_vnni() || best == CPU_ISA_AVX512 || getenv("STREAMSINK_ISA"));
    /* AVX-VNNI only on top of AVX2, and never where the cap leaves it out */
    const char *cap = getenv("STREAMSINK_ISA");
    ASSERT(!cpu__has_avxvnni() || best >= CPU_ISA_AVX2);
    ASSERT(!cpu__has_avxvnni() || !cap || (strcmp(cap, "avx2") && strcmp(cap, "scalar")));
    printf("  best isa here: %s%s%s\n", cpu_isa_name(best), cpu__has_vnni() ? " (vnni)" : "",
           cpu__has_avxvnni() ? " (avx-vnni)" : "");
}

/* The SIMD quantizers do the same float operations as the reference (amax,
 * d = amax / 127, 1/d, x * (1/d), round half to even), so the bytes must be
 * equal, not merely within one quantum. */
TEST(prepare_act_is_byte_identical_to_the_reference_on_every_isa)
{
    static float x[K_MAX];
    _Alignas(64) static uint8_t want[K_MAX * 4], got[K_MAX * 4];
    struct kernel kernels[8];
    int nk = list_kernels(kernels);

    for (int rep = 0; rep < 6; rep++) {
        fill(x, K_MAX);
        if (rep == 1) {
            /* exact halves after scaling: amax 127 makes d = 1 */
            for (int i = 0; i < K_MAX; i++)
                x[i] = i % 32 == 0 ? 127.0f : (float)((i % 64) - 32) + 0.5f;
        }
        if (rep == 2) {
            for (int i = 0; i < K_MAX; i++)
                x[i] = i % 7 == 0 ? 1e-30f : (i % 5 == 0 ? -3e20f : 0.0f);
        }
        for (size_t ti = 0; ti < sizeof all_types / sizeof all_types[0]; ti++) {
            enum qtype t = all_types[ti];
            size_t bytes = quant_act_bytes(t, K_MAX);
            quant_prepare_act_ref(t, x, K_MAX, want);
            for (int ki = 0; ki < nk; ki++) {
                memset(got, 0x5a, bytes);
                kernel_prepare(&kernels[ki], t, x, K_MAX, got);
                if (memcmp(got, want, bytes) != 0) {
                    size_t i = 0;
                    while (got[i] == want[i])
                        i++;
                    FAIL_AT("%s %s rep %d: first differing byte %zu (block %zu): %d vs %d",
                            kernels[ki].name, qtype_name(t), rep, i,
                            i / sizeof(struct block_q8_act), got[i], want[i]);
                }
            }
        }
    }
}

/* Every kernel against quant_dot_ref on the same prepared activations. The
 * integer parts are exact, so the results differ only by float rounding: the
 * order in which the terms (see dot_magnitude) are summed and whether a
 * multiply-add is fused. Summing n terms in any order errs by at most
 * (n - 1) * 2^-24 * sum |terms|; each term's own roundings add a few
 * 2^-24 |term|, and the reference's double sum is rounded once to float. So
 * |y - ref| <= (n + 4) * 2^-24 * sum |terms|: the tolerance below, about
 * 1e-5 of sum |terms| at K = 1536 and far below the activation quantization
 * error the model sees. */
TEST(matmul_rows_matches_the_scalar_reference_for_every_type_shape_and_isa)
{
    static const int64_t ks[] = {32, 64, 576, 1536, 7, 37};
    static const int64_t ts[] = {1, 2, 3, 4, 5, 7, 16};
    static const int64_t ns[][2] = {{0, 1}, {3, 4}, {1, 6}, {5, 18}, {2, 39}};
    static float x[T_MAX][K_MAX];
    _Alignas(64) static uint8_t w[N_MAX * K_MAX * 4];
    _Alignas(64) static uint8_t act[T_MAX * K_MAX * 4];
    static float y[T_MAX * (N_MAX + 3)], want[T_MAX * (N_MAX + 3)];
    static double mag[T_MAX * (N_MAX + 3)];
    static int nterms[T_MAX * (N_MAX + 3)];
    const float sentinel = -12345.0f;
    const int64_t ldy = N_MAX + 3;
    struct kernel kernels[8];
    int nk = list_kernels(kernels);
    long long checked = 0;

    for (size_t ti = 0; ti < sizeof all_types / sizeof all_types[0]; ti++) {
        enum qtype t = all_types[ti];
        for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++) {
            int64_t k = ks[ki];
            if (qtype_row_bytes(t, k) == 0)
                continue; /* quantized types need whole blocks */
            size_t rb = qtype_row_bytes(t, k);
            size_t ab = quant_act_bytes(t, k);
            make_weights(t, N_MAX, k, w);
            for (int64_t tt = 0; tt < T_MAX; tt++) {
                fill(x[tt], k);
                quant_prepare_act_ref(t, x[tt], k, act + (size_t)tt * ab);
            }
            for (int64_t tt = 0; tt < T_MAX; tt++) {
                for (int64_t n = 0; n < N_MAX; n++) {
                    const uint8_t *wr = w + (size_t)n * rb;
                    const uint8_t *ar = act + (size_t)tt * ab;
                    want[tt * ldy + n] = quant_dot_ref(t, wr, ar, k);
                    mag[tt * ldy + n] = dot_magnitude(t, wr, ar, k, &nterms[tt * ldy + n]);
                }
            }
            for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
                int64_t n0 = ns[ni][0], n1 = ns[ni][1];
                for (size_t tj = 0; tj < sizeof ts / sizeof ts[0]; tj++) {
                    int64_t T = ts[tj];
                    for (int kk = 0; kk < nk; kk++) {
                        const struct kernel *kn = &kernels[kk];
                        /* emulation is slow: the big shapes once per type */
                        if (kn->path >= PATH_EMU_BASE && k == 1536 && T != 5)
                            continue;
                        for (size_t i = 0; i < sizeof y / sizeof y[0]; i++)
                            y[i] = sentinel;
                        kernel_matmul(kn, t, w, k, n0, n1, act, T, y, ldy);

                        int shown = 0;
                        double max_err = 0.0;
                        for (int64_t tt = 0; tt < T_MAX; tt++) {
                            for (int64_t n = 0; n < ldy; n++) {
                                float got = y[tt * ldy + n];
                                if (tt >= T || n < n0 || n >= n1) {
                                    if (got != sentinel)
                                        FAIL_AT("%s %s: wrote y[%lld][%lld] outside its range",
                                                kn->name, qtype_name(t), (long long)tt,
                                                (long long)n);
                                    continue;
                                }
                                double ref = want[tt * ldy + n];
                                double tol =
                                    (nterms[tt * ldy + n] + 4) * 0x1p-24 * mag[tt * ldy + n] +
                                    FLT_MIN;
                                double err = fabs(got - ref);
                                max_err = fmax(max_err, err / (tol > 0 ? tol : 1));
                                if (!(err <= tol) && shown++ < 4)
                                    fprintf(stderr,
                                            "  %s %s K=%lld T=%lld rows [%lld,%lld): y[%lld][%lld]"
                                            " = %.9g, reference %.9g (tolerance %.3g)\n",
                                            kn->name, qtype_name(t), (long long)k, (long long)T,
                                            (long long)n0, (long long)n1, (long long)tt,
                                            (long long)n, got, ref, tol);
                                checked++;
                            }
                        }
                        if (shown)
                            FAIL_AT("%s %s K=%lld T=%lld: %d values off, max error %.3g x "
                                    "tolerance",
                                    kn->name, qtype_name(t), (long long)k, (long long)T, shown,
                                    max_err);
                    }
                }
            }
        }
    }
    printf("  %lld outputs checked across %d kernels\n", checked, nk);
}

/* The kernels are the decoder's hot path: also check them on the model's own
 * shapes, against the reference, for one weight row range per call as a
 * thread would get it. */
TEST(matmul_rows_matches_the_reference_on_smollm2_shapes)
{
    static const struct {
        enum qtype t;
        int64_t n;
        int64_t k;
    } shapes[] = {{QTYPE_Q4_1, 40, 576}, {QTYPE_Q4_1, 40, 1536}, {QTYPE_Q8_0, 40, 576}};
    static float x[4][K_MAX];
    _Alignas(64) static uint8_t w[N_MAX * K_MAX * 4];
    _Alignas(64) static uint8_t act[4 * K_MAX * 4];
    static float y[4 * N_MAX];
    struct kernel kernels[8];
    int nk = list_kernels(kernels);

    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        enum qtype t = shapes[si].t;
        int64_t n = shapes[si].n, k = shapes[si].k;
        size_t rb = qtype_row_bytes(t, k), ab = quant_act_bytes(t, k);
        make_weights(t, n, k, w);
        for (int kk = 0; kk < nk; kk++) {
            for (int tt = 0; tt < 4; tt++) {
                fill(x[tt], k);
                kernel_prepare(&kernels[kk], t, x[tt], k, act + (size_t)tt * ab);
            }
            kernel_matmul(&kernels[kk], t, w, k, 8, n, act, 4, y, N_MAX);
            for (int tt = 0; tt < 4; tt++) {
                for (int64_t r = 8; r < n; r++) {
                    const uint8_t *wr = w + (size_t)r * rb;
                    const uint8_t *ar = act + (size_t)tt * ab;
                    int nt;
                    double tol = 0.0;
                    double mag = dot_magnitude(t, wr, ar, k, &nt);
                    tol = (nt + 4) * 0x1p-24 * mag + FLT_MIN;
                    float ref = quant_dot_ref(t, wr, ar, k);
                    if (!(fabs(y[tt * N_MAX + r] - ref) <= tol))
                        FAIL_AT("%s %s %lldx%lld: y[%d][%lld] = %.9g vs %.9g", kernels[kk].name,
                                qtype_name(t), (long long)n, (long long)k, tt, (long long)r,
                                y[tt * N_MAX + r], ref);
                }
            }
        }
    }
}

/* Batch invariance at the kernel level: a row's result is bit-identical
 * whether it is computed for one activation row (decode, which has its own
 * four-row path for some types) or as part of T rows, and whatever weight
 * row range the call covers (so whether the row falls in a group of four or
 * in the remainder). Chunked prefill equals token-by-token decode only if
 * this holds. */
TEST(matmul_rows_do_not_depend_on_batch_size_or_row_range)
{
    static const int64_t ks[] = {32, 64, 96, 576, 1536};
    static const int64_t ranges[][2] = {{0, 37}, {1, 38}, {3, 30}, {5, 6}, {2, 9}};
    enum { T = 7, N = 40 };
    static float x[T][K_MAX];
    _Alignas(64) static uint8_t w[N * K_MAX * 4];
    _Alignas(64) static uint8_t act[T * K_MAX * 4];
    static float ybatch[T * N], yone[N];
    struct kernel kernels[8];
    int nk = list_kernels(kernels);
    long long compared = 0;

    for (size_t ti = 0; ti < sizeof all_types / sizeof all_types[0]; ti++) {
        enum qtype t = all_types[ti];
        for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++) {
            int64_t k = ks[ki];
            size_t ab = quant_act_bytes(t, k);
            make_weights(t, N, k, w);
            for (int kk = 0; kk < nk; kk++) {
                const struct kernel *kn = &kernels[kk];
                if (kn->path >= PATH_EMU_BASE && k == 1536)
                    continue; /* emulation is slow */
                for (int tt = 0; tt < T; tt++) {
                    fill(x[tt], k);
                    kernel_prepare(kn, t, x[tt], k, act + (size_t)tt * ab);
                }
                kernel_matmul(kn, t, w, k, 0, N, act, T, ybatch, N);
                for (size_t ri = 0; ri < sizeof ranges / sizeof ranges[0]; ri++) {
                    int64_t n0 = ranges[ri][0], n1 = ranges[ri][1];
                    for (int tt = 0; tt < T; tt++) {
                        kernel_matmul(kn, t, w, k, n0, n1, act + (size_t)tt * ab, 1, yone, N);
                        for (int64_t n = n0; n < n1; n++, compared++)
                            if (memcmp(&yone[n], &ybatch[tt * N + n], sizeof(float)) != 0)
                                FAIL_AT("%s %s K=%lld: row %lld of activation %d is %.9g alone "
                                        "(rows [%lld,%lld)) and %.9g in a batch of %d",
                                        kn->name, qtype_name(t), (long long)k, (long long)n, tt,
                                        yone[n], (long long)n0, (long long)n1, ybatch[tt * N + n],
                                        T);
                    }
                }
            }
        }
    }
    printf("  %lld outputs compared across %d kernels\n", compared, nk);
}

/* Long batches (prefill chunks): T = 70 activation rows, more than the
 * sixteen-row kernel keeps corrections for at once (64), K = 1536, more
 * blocks than it transposes at once (32), and N = 37 (two full groups of
 * sixteen and a partial one). Every output within the reference tolerance
 * and bit-identical to the same row computed alone. The emulated sixteen-row
 * kernel runs here too, so its chunking is checked on every machine. */
TEST(matmul_rows_handles_long_batches_and_partial_row_groups)
{
    enum { T = 70, N = 37, K = 1536 };
    static float x[K_MAX];
    _Alignas(64) static uint8_t w[N * K * 4];
    _Alignas(64) static uint8_t act[T * K * 4];
    static float y[T * N], yone[N];
    static const enum qtype types[] = {QTYPE_Q8_0, QTYPE_Q4_0, QTYPE_Q4_1};
    struct kernel kernels[8];
    int nk = list_kernels(kernels);
    long long checked = 0;

    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        enum qtype t = types[ti];
        size_t rb = qtype_row_bytes(t, K), ab = quant_act_bytes(t, K);
        make_weights(t, N, K, w);
        for (int kk = 0; kk < nk; kk++) {
            const struct kernel *kn = &kernels[kk];
            if (kn->path == PATH_EMU_BASE || kn->isa == CPU_ISA_SCALAR)
                continue; /* slow, and covered by the tests above */
            for (int tt = 0; tt < T; tt++) {
                fill(x, K);
                kernel_prepare(kn, t, x, K, act + (size_t)tt * ab);
            }
            kernel_matmul(kn, t, w, K, 0, N, act, T, y, N);
            for (int tt = 0; tt < T; tt++) {
                const uint8_t *ar = act + (size_t)tt * ab;
                kernel_matmul(kn, t, w, K, 0, N, ar, 1, yone, N);
                for (int64_t n = 0; n < N; n++, checked++) {
                    int nt = 0;
                    double mag = dot_magnitude(t, w + (size_t)n * rb, ar, K, &nt);
                    double tol = (nt + 4) * 0x1p-24 * mag + FLT_MIN;
                    float ref = quant_dot_ref(t, w + (size_t)n * rb, ar, K);
                    if (!(fabs(y[tt * N + n] - ref) <= tol))
                        FAIL_AT("%s %s: y[%d][%lld] = %.9g vs reference %.9g", kn->name,
                                qtype_name(t), tt, (long long)n, y[tt * N + n], ref);
                    if (memcmp(&y[tt * N + n], &yone[n], sizeof(float)) != 0)
                        FAIL_AT("%s %s: row %lld of activation %d is %.9g in a batch of %d and "
                                "%.9g alone",
                                kn->name, qtype_name(t), (long long)n, tt, y[tt * N + n], T,
                                yone[n]);
                }
            }
        }
    }
    printf("  %lld outputs checked\n", checked);
}

/* Every batch size from 1 to 70 (each remainder of the sixteen-row kernel's
 * eight-row tiles, and both sides of its 64-row token block) on a weight row
 * range that starts off a group boundary and ends inside a group: every
 * output within the reference tolerance, and nothing written outside the
 * call's rows. */
TEST(matmul_rows_matches_the_reference_for_every_batch_size_up_to_70)
{
    enum { T = 70, N = 40, K = 96, LDY = N + 3 };
    static const int64_t n0 = 3, n1 = 38;
    static float x[K];
    _Alignas(64) static uint8_t w[N * K * 4];
    _Alignas(64) static uint8_t act[T * K * 4];
    static float y[T * LDY], want[T * LDY];
    static double tol[T * LDY];
    static const enum qtype types[] = {QTYPE_Q8_0, QTYPE_Q4_0, QTYPE_Q4_1};
    const float sentinel = -12345.0f;
    struct kernel kernels[8];
    int nk = list_kernels(kernels);
    long long checked = 0;

    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        enum qtype t = types[ti];
        size_t rb = qtype_row_bytes(t, K), ab = quant_act_bytes(t, K);
        make_weights(t, N, K, w);
        for (int tt = 0; tt < T; tt++) {
            fill(x, K);
            quant_prepare_act_ref(t, x, K, act + (size_t)tt * ab);
            for (int64_t n = n0; n < n1; n++) {
                const uint8_t *wr = w + (size_t)n * rb, *ar = act + (size_t)tt * ab;
                int nt = 0;
                double mag = dot_magnitude(t, wr, ar, K, &nt);
                want[tt * LDY + n] = quant_dot_ref(t, wr, ar, K);
                tol[tt * LDY + n] = (nt + 4) * 0x1p-24 * mag + FLT_MIN;
            }
        }
        for (int kk = 0; kk < nk; kk++) {
            const struct kernel *kn = &kernels[kk];
            if (kn->isa == CPU_ISA_SCALAR)
                continue; /* the reference itself */
            for (int64_t bt = 1; bt <= T; bt++) {
                for (size_t i = 0; i < sizeof y / sizeof y[0]; i++)
                    y[i] = sentinel;
                kernel_matmul(kn, t, w, K, n0, n1, act, bt, y, LDY);
                for (int64_t tt = 0; tt < T; tt++) {
                    for (int64_t n = 0; n < LDY; n++) {
                        float got = y[tt * LDY + n];
                        if (tt >= bt || n < n0 || n >= n1) {
                            if (got != sentinel)
                                FAIL_AT("%s %s T=%lld: wrote y[%lld][%lld] outside its range",
                                        kn->name, qtype_name(t), (long long)bt, (long long)tt,
                                        (long long)n);
                            continue;
                        }
                        checked++;
                        if (!(fabs(got - want[tt * LDY + n]) <= tol[tt * LDY + n]))
                            FAIL_AT("%s %s T=%lld: y[%lld][%lld] = %.9g, reference %.9g", kn->name,
                                    qtype_name(t), (long long)bt, (long long)tt, (long long)n, got,
                                    want[tt * LDY + n]);
                    }
                }
            }
        }
    }
    printf("  %lld outputs checked\n", checked);
}

/* ---- repacked weights ------------------------------------------------------ */

static const enum qtype packed_types[] = {QTYPE_Q8_0, QTYPE_Q4_0, QTYPE_Q4_1};

/* cpu_pack_rows writes the layout matmul.h documents, byte for byte (checked
 * here against the rows' own fields, not against the kernel), keeps the size,
 * and copies the rows past the last full group unchanged. */
TEST(pack_rows_writes_the_documented_layout)
{
    enum { N = 37, K = 96, NB = K / 32 };
    _Alignas(64) static uint8_t w[N * K * 2], p[N * K * 2];
    for (size_t ti = 0; ti < sizeof packed_types / sizeof packed_types[0]; ti++) {
        enum qtype t = packed_types[ti];
        const size_t rb = qtype_row_bytes(t, K), bs = qtype_block_bytes(t);
        const size_t qoff = t == QTYPE_Q4_1 ? 4 : 2;
        const int nq = t == QTYPE_Q8_0 ? 8 : 4;
        make_weights(t, N, K, w);
        memset(p, 0xa5, sizeof p);
        cpu_pack_rows(t, w, K, N, p);
        for (int g = 0; g < N / 16; g++) {
            for (int b = 0; b < NB; b++) {
                /* block b of the group: 16 * bs bytes, quants then d then m */
                const uint8_t *gq = p + (size_t)g * 16 * rb + (size_t)b * 16 * bs;
                const uint8_t *gd = gq + (size_t)nq * 64, *gm = gd + 32;
                for (int r = 0; r < 16; r++) {
                    const uint8_t *blk = w + (size_t)(16 * g + r) * rb + (size_t)b * bs;
                    for (int i = 0; i < 4 * nq; i++) {
                        uint8_t want = blk[qoff + i] ^ (t == QTYPE_Q8_0 ? 0x80 : 0);
                        uint8_t got = gq[64 * (i / 4) + 4 * r + i % 4];
                        ASSERT_EQ(got, want);
                    }
                    ASSERT(memcmp(gd + r * 2, blk, 2) == 0);
                    if (t == QTYPE_Q4_1)
                        ASSERT(memcmp(gm + r * 2, blk + 2, 2) == 0);
                }
            }
        }
        ASSERT(memcmp(p + 32 * rb, w + 32 * rb, 5 * rb) == 0);
        ASSERT_EQ(p[N * rb], 0xa5); /* nothing past the matrix */
    }
}

/* The sixteen-row kernel on repacked weights gives, for every type, batch
 * size, row range (aligned or not, into the rows past the last full group or
 * not) and K (one chunk of blocks or several), exactly the bits the kernel
 * gives on the rows as they are, and stays within the scalar reference's
 * tolerance; it writes nothing outside its rows. Natively on a VNNI CPU, and
 * under SIMDe emulation wherever the headers are installed. */
TEST(packed_rows_are_bit_identical_to_the_kernel_on_the_rows_as_they_are)
{
    enum { NMAX = 53, LDY = NMAX + 3, TMAX = 70 };
    static const int64_t ks[] = {32, 96, 576, 1536};
    static const int64_t Ns[] = {53, 48, 16, 7};
    /* 1: the one-row path; 2 .. 12: one register tile straight from the
     * repacked quants (two chains per row up to 4); 13: tiles of 7 and 6;
     * 14: two of 7; 25: 9, 8 and 8; 32: 11, 11 and 10; 70: a block of 64
     * rows (tiles of 11 and 10) and one of 6 */
    static const int64_t ts[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 13, 14, 25, 32, 70};
    static const int64_t ranges[][2] = {{0, 53}, {0, 16}, {16, 48}, {3, 38}, {40, 53}, {5, 6}};
    static float x[K_MAX];
    _Alignas(64) static uint8_t w[NMAX * K_MAX * 2], p[NMAX * K_MAX * 2];
    _Alignas(64) static uint8_t act[TMAX * (K_MAX / 32) * sizeof(struct block_q8_act)];
    static float y[TMAX * LDY], want[TMAX * LDY];
    const float sentinel = -12345.0f;
    int native = cpu_isa_best() == CPU_ISA_AVX512 && cpu_matmul_packs(CPU_ISA_AVX512, QTYPE_Q4_0);
    int emulated = 0;
#ifdef SS_EMULATE_AVX512
    emulated = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
    if (!native)
        printf("  skip native: no AVX512-VNNI here (or capped by STREAMSINK_ISA)\n");
    if (!emulated)
        printf("  skip emulation: no SIMDe headers, or no AVX2\n");
    long long checked = 0;

    for (size_t ti = 0; ti < sizeof packed_types / sizeof packed_types[0]; ti++) {
        enum qtype t = packed_types[ti];
        for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++) {
            const int64_t k = ks[ki];
            const size_t rb = qtype_row_bytes(t, k), ab = quant_act_bytes(t, k);
            make_weights(t, NMAX, k, w);
            for (int tt = 0; tt < TMAX; tt++) {
                fill(x, k);
                quant_prepare_act_ref(t, x, k, act + (size_t)tt * ab);
            }
            for (size_t Ni = 0; Ni < sizeof Ns / sizeof Ns[0]; Ni++) {
                const int64_t N = Ns[Ni];
                cpu_pack_rows(t, w, k, N, p);
                for (size_t ri = 0; ri < sizeof ranges / sizeof ranges[0]; ri++) {
                    const int64_t n0 = ranges[ri][0];
                    const int64_t n1 = ranges[ri][1] < N ? ranges[ri][1] : N;
                    if (n0 > n1)
                        continue;
                    for (size_t tj = 0; tj < sizeof ts / sizeof ts[0]; tj++) {
                        const int64_t T = ts[tj];
                        for (int emu = 0; emu < 2; emu++) {
                            if (emu ? !emulated : !native)
                                continue;
                            /* emulation is slow: small K up to T = 14, and
                             * K = 1536 (two chunks of blocks) at T <= 2 */
                            if (emu && (T > 14 || (k > 96 && (k != 1536 || T > 2))))
                                continue;
                            for (size_t i = 0; i < sizeof y / sizeof y[0]; i++)
                                y[i] = want[i] = sentinel;
                            if (!emu) {
                                cpu__matmul_rows16_avx512_vnni(t, w, k, n0, n1, act, T, want, LDY);
                                cpu_matmul_rows_packed(CPU_ISA_AVX512, t, p, k, N, n0, n1, act, T,
                                                       y, LDY);
                            } else {
#ifdef SS_EMULATE_AVX512
                                emu_matmul_rows16_avx512_vnni(t, w, k, n0, n1, act, T, want, LDY);
                                emu_matmul_rows16_packed_avx512_vnni(t, p, k, N, n0, n1, act, T, y,
                                                                     LDY);
#endif
                            }
                            for (int64_t tt = 0; tt < TMAX; tt++) {
                                for (int64_t n = 0; n < LDY; n++) {
                                    const float got = y[tt * LDY + n];
                                    if (tt >= T || n < n0 || n >= n1) {
                                        if (got != sentinel)
                                            FAIL_AT("%s K=%lld N=%lld T=%lld: wrote y[%lld][%lld]",
                                                    qtype_name(t), (long long)k, (long long)N,
                                                    (long long)T, (long long)tt, (long long)n);
                                        continue;
                                    }
                                    if (memcmp(&got, &want[tt * LDY + n], sizeof got) != 0)
                                        FAIL_AT("%s%s K=%lld N=%lld T=%lld rows [%lld,%lld): "
                                                "y[%lld][%lld] = %.9g repacked, %.9g as they are",
                                                emu ? " (emulated)" : "", qtype_name(t),
                                                (long long)k, (long long)N, (long long)T,
                                                (long long)n0, (long long)n1, (long long)tt,
                                                (long long)n, got, want[tt * LDY + n]);
                                    const uint8_t *wr = w + (size_t)n * rb;
                                    const uint8_t *ar = act + (size_t)tt * ab;
                                    int nt = 0;
                                    double tol =
                                        (dot_magnitude(t, wr, ar, k, &nt) * (nt + 4)) * 0x1p-24 +
                                        FLT_MIN;
                                    float ref = quant_dot_ref(t, wr, ar, k);
                                    if (!(fabs(got - ref) <= tol))
                                        FAIL_AT("%s K=%lld: y[%lld][%lld] = %.9g, scalar %.9g",
                                                qtype_name(t), (long long)k, (long long)tt,
                                                (long long)n, got, ref);
                                    checked++;
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    printf("  %lld outputs checked\n", checked);
}

/* The sixteen-row kernels' arithmetic for one output, as a scalar loop: per
 * block the exact integer dot product of the quants (Q4: the nibbles, less
 * 8 for Q4_0; Q8_0: the signed bytes), then acc = fma((float)i, d_w * d_a,
 * acc) and, for Q4_1, acc = fma(m_w, s_a, acc), in block order. */
static float rows16_steps(enum qtype t, const uint8_t *w, const uint8_t *a, int64_t k)
{
    const struct block_q8_act *ab = (const struct block_q8_act *)a;
    float acc = 0.0f;
    for (int64_t b = 0; b < k / 32; b++) {
        int32_t i = 0;
        uint16_t d, m = 0;
        if (t == QTYPE_Q8_0) {
            const struct block_q8_0 *wb = (const struct block_q8_0 *)w + b;
            for (int j = 0; j < 32; j++)
                i += wb->qs[j] * ab[b].qs[j];
            d = wb->d;
        } else {
            const uint8_t *qs = t == QTYPE_Q4_0 ? ((const struct block_q4_0 *)w + b)->qs
                                                : ((const struct block_q4_1 *)w + b)->qs;
            const int bias = t == QTYPE_Q4_0 ? 8 : 0;
            for (int j = 0; j < 16; j++)
                i += ((qs[j] & 15) - bias) * ab[b].qs[j] + ((qs[j] >> 4) - bias) * ab[b].qs[j + 16];
            d = t == QTYPE_Q4_0 ? ((const struct block_q4_0 *)w + b)->d
                                : ((const struct block_q4_1 *)w + b)->d;
            if (t == QTYPE_Q4_1)
                m = ((const struct block_q4_1 *)w + b)->m;
        }
        const float dd = quant_f16_to_f32(d) * ab[b].d;
        acc = fmaf((float)i, dd, acc);
        if (t == QTYPE_Q4_1)
            acc = fmaf(quant_f16_to_f32(m), ab[b].s, acc);
    }
    return acc;
}

/* The AVX2 kernel on repacked weights (what CPUs without AVX512-VNNI run)
 * takes exactly rows16_steps for every type, K (one chunk of blocks or
 * several; at T = 1 one pass), N (full groups, and rows past the last one,
 * which it transposes on the fly), row range, and T (register tiles of 1 to
 * 4 rows, as even as they divide; 64-row blocks; a single row, as at T = 1
 * and in the last block of T = 65, takes both halves of a group in one
 * pass, the second chunk of blocks adding to the first's outputs), and
 * writes nothing outside its rows; so does its AVX-VNNI build where the CPU
 * has AVX-VNNI, whose tiles hold up to 6 rows (T = 5, 6, 11, 25, 32 and 70
 * take tiles of 5 or 6 there). Where the CPU also has AVX512-VNNI the
 * kernels give the same bits. */
TEST(packed_rows_on_avx2_take_the_exact_steps_of_the_scalar_loop)
{
    enum { NMAX = 53, LDY = NMAX + 3, TMAX = 70 };
    static const int64_t ks[] = {32, 96, 576, 1536};
    static const int64_t Ns[] = {53, 48, 16, 7};
    static const int64_t ts[] = {1, 2, 3, 5, 6, 7, 11, 12, 13, 25, 32, 65, 70};
    static const int64_t ranges[][2] = {{0, 53}, {0, 16}, {16, 48}, {3, 38}, {40, 53}, {5, 6}};
    static float x[K_MAX];
    _Alignas(64) static uint8_t w[NMAX * K_MAX * 2], p[NMAX * K_MAX * 2];
    _Alignas(64) static uint8_t act[TMAX * (K_MAX / 32) * sizeof(struct block_q8_act)];
    static float y[TMAX * LDY], want[TMAX * LDY], vnni[TMAX * LDY];
    const float sentinel = -12345.0f;
    if (!cpu_matmul_packs(CPU_ISA_AVX2, QTYPE_Q4_0) || cpu_isa_best() < CPU_ISA_AVX2)
        TEST_SKIP("no AVX2 here (or capped by STREAMSINK_ISA)");
    const int also_vnni =
        cpu_isa_best() == CPU_ISA_AVX512 && cpu_matmul_packs(CPU_ISA_AVX512, QTYPE_Q4_0);
    long long checked = 0, compared = 0, checked_avxvnni = 0;
    if (!cpu__has_avxvnni())
        printf("  skip the AVX-VNNI build: no AVX-VNNI here (or capped by STREAMSINK_ISA)\n");
    for (size_t ti = 0; ti < sizeof packed_types / sizeof packed_types[0]; ti++) {
        const enum qtype t = packed_types[ti];
        for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++) {
            const int64_t k = ks[ki];
            const size_t rb = qtype_row_bytes(t, k), ab = quant_act_bytes(t, k);
            make_weights(t, NMAX, k, w);
            for (int tt = 0; tt < TMAX; tt++) {
                fill(x, k);
                quant_prepare_act_ref(t, x, k, act + (size_t)tt * ab);
            }
            for (int tt = 0; tt < TMAX; tt++)
                for (int n = 0; n < NMAX; n++)
                    want[tt * LDY + n] =
                        rows16_steps(t, w + (size_t)n * rb, act + (size_t)tt * ab, k);
            for (size_t Ni = 0; Ni < sizeof Ns / sizeof Ns[0]; Ni++) {
                const int64_t N = Ns[Ni];
                cpu_pack_rows(t, w, k, N, p);
                for (size_t ri = 0; ri < sizeof ranges / sizeof ranges[0]; ri++) {
                    const int64_t n0 = ranges[ri][0];
                    const int64_t n1 = ranges[ri][1] < N ? ranges[ri][1] : N;
                    if (n0 > n1)
                        continue;
                    for (size_t tj = 0; tj < sizeof ts / sizeof ts[0] * 2; tj++) {
                        const int64_t T = ts[tj / 2];
                        const int avxvnni = (int)(tj % 2); /* 1: the AVX-VNNI build */
                        if (avxvnni && !cpu__has_avxvnni())
                            continue;
                        for (size_t i = 0; i < sizeof y / sizeof y[0]; i++)
                            y[i] = vnni[i] = sentinel;
                        /* the AVX-VNNI build through the dispatch, which takes
                         * it where the CPU has AVX-VNNI; the AVX2 one directly */
                        if (avxvnni)
                            cpu_matmul_rows_packed(CPU_ISA_AVX2, t, p, k, N, n0, n1, act, T, y,
                                                   LDY);
                        else
                            cpu__matmul_rows16_packed_avx2(t, p, k, N, n0, n1, act, T, y, LDY);
                        checked_avxvnni += avxvnni;
                        if (also_vnni)
                            cpu_matmul_rows_packed(CPU_ISA_AVX512, t, p, k, N, n0, n1, act, T, vnni,
                                                   LDY);
                        for (int64_t tt = 0; tt < TMAX; tt++) {
                            for (int64_t n = 0; n < LDY; n++) {
                                const float got = y[tt * LDY + n];
                                if (tt >= T || n < n0 || n >= n1) {
                                    if (got != sentinel)
                                        FAIL_AT("%s K=%lld N=%lld T=%lld: wrote y[%lld][%lld]",
                                                qtype_name(t), (long long)k, (long long)N,
                                                (long long)T, (long long)tt, (long long)n);
                                    continue;
                                }
                                if (memcmp(&got, &want[tt * LDY + n], sizeof got) != 0)
                                    FAIL_AT("%s%s K=%lld N=%lld T=%lld rows [%lld,%lld): "
                                            "y[%lld][%lld] = %.9g, the scalar steps %.9g",
                                            avxvnni ? " (AVX-VNNI)" : "", qtype_name(t),
                                            (long long)k, (long long)N, (long long)T, (long long)n0,
                                            (long long)n1, (long long)tt, (long long)n, got,
                                            want[tt * LDY + n]);
                                checked++;
                                if (also_vnni) {
                                    if (memcmp(&got, &vnni[tt * LDY + n], sizeof got) != 0)
                                        FAIL_AT("%s K=%lld N=%lld T=%lld: y[%lld][%lld] = %.9g "
                                                "on AVX2, %.9g with VNNI",
                                                qtype_name(t), (long long)k, (long long)N,
                                                (long long)T, (long long)tt, (long long)n, got,
                                                vnni[tt * LDY + n]);
                                    compared++;
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    printf("  %lld outputs checked (%lld calls of the AVX-VNNI build), %lld against the VNNI "
           "kernel\n",
           checked, checked_avxvnni, compared);
}

/* At T = 1 each repacked group is read in one pass of all its blocks, up to
 * 1,024 blocks (K = 32,768); past that the chunked path takes T = 1 too.
 * Both, just inside and just past the limit, give exactly the bits of the
 * kernel on the rows as they are, for all N rows, for a range that starts
 * and ends inside a repacked group (rows [17, 29)) and for one that starts
 * inside a group and ends in the rows past the last full group (rows [3,
 * 34)), and write nothing outside the rows asked for (the outputs around
 * them, and past N, keep a canary).
 * A row of K values is made of K / 1,024 rows of 1,024 (make_weights'
 * longest rows are K_MAX). */
TEST(packed_single_row_inside_and_past_the_one_pass_limit)
{
    enum { N = 37, KC = 1024, KMAX = 33 * KC, GUARD = 16 };
    static const int64_t ks[] = {32 * KC, 33 * KC};
    static const int64_t ranges[][2] = {{0, N}, {17, 29}, {3, 34}};
    if (cpu_isa_best() != CPU_ISA_AVX512 || !cpu_matmul_packs(CPU_ISA_AVX512, QTYPE_Q4_0))
        TEST_SKIP("no AVX512-VNNI here (or capped by STREAMSINK_ISA)");
    static float x[KMAX], y[N + GUARD], want[N];
    const float canary = -1234.5f;
    uint8_t *w = malloc(qtype_row_bytes(QTYPE_Q8_0, KMAX) * N);
    uint8_t *p = malloc(qtype_row_bytes(QTYPE_Q8_0, KMAX) * N);
    uint8_t *act = malloc(quant_act_bytes(QTYPE_Q8_0, KMAX));
    ASSERT(w && p && act);
    for (size_t ti = 0; ti < sizeof packed_types / sizeof packed_types[0]; ti++) {
        const enum qtype t = packed_types[ti];
        for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++) {
            const int64_t k = ks[ki];
            make_weights(t, N * (k / KC), KC, w);
            fill(x, k);
            quant_prepare_act_ref(t, x, k, act);
            cpu_pack_rows(t, w, k, N, p);
            cpu__matmul_rows16_avx512_vnni(t, w, k, 0, N, act, 1, want, N);
            for (size_t ri = 0; ri < sizeof ranges / sizeof ranges[0]; ri++) {
                const int64_t n0 = ranges[ri][0], n1 = ranges[ri][1];
                for (int n = 0; n < N + GUARD; n++)
                    y[n] = canary;
                cpu_matmul_rows_packed(CPU_ISA_AVX512, t, p, k, N, n0, n1, act, 1, y, N);
                for (int n = 0; n < N + GUARD; n++) {
                    const int inside = n >= n0 && n < n1;
                    if (inside && memcmp(&y[n], &want[n], sizeof y[n]) != 0)
                        FAIL_AT("%s K=%lld rows [%lld, %lld): y[%d] = %.9g repacked, %.9g as "
                                "they are",
                                qtype_name(t), (long long)k, (long long)n0, (long long)n1, n, y[n],
                                want[n]);
                    if (!inside && y[n] != canary)
                        FAIL_AT("%s K=%lld rows [%lld, %lld): y[%d] written (%.9g)", qtype_name(t),
                                (long long)k, (long long)n0, (long long)n1, n, y[n]);
                }
            }
        }
    }
    free(w);
    free(p);
    free(act);
}

/* The tied output matrix of SmolLM2-135M: 49,152 Q8_0 rows of 576 (and three
 * more rows, a partial group), repacked, for one activation row (decode),
 * for five and eight (a batched decode step's register tile) and for twelve
 * (tiles of 8 and 4), split into per-thread ranges the way the CPU backend splits them:
 * bit-identical to the kernel on the rows as they are, within the scalar
 * reference's tolerance. */
TEST(packed_output_matrix_matches_the_kernel_and_the_reference)
{
    enum { N = 49152 + 3, K = 576, T = 12 };
    const enum qtype t = QTYPE_Q8_0;
    if (cpu_isa_best() != CPU_ISA_AVX512 || !cpu_matmul_packs(CPU_ISA_AVX512, t))
        TEST_SKIP("no AVX512-VNNI here (or capped by STREAMSINK_ISA)");
    const size_t rb = qtype_row_bytes(t, K), ab = quant_act_bytes(t, K);
    uint8_t *w = malloc(rb * N), *p = malloc(rb * N);
    float *y = malloc(sizeof(float) * N * T), *want = malloc(sizeof(float) * N * T);
    _Alignas(64) static uint8_t act[T * (K / 32) * sizeof(struct block_q8_act)];
    static float x[K];
    ASSERT(w && p && y && want);
    for (int64_t r = 0; r < N; r += 40)
        make_weights(t, N - r < 40 ? N - r : 40, K, w + (size_t)r * rb);
    for (int tt = 0; tt < T; tt++) {
        fill(x, K);
        quant_prepare_act_ref(t, x, K, act + (size_t)tt * ab);
    }
    cpu_pack_rows(t, w, K, N, p);
    static const int64_t Ts[] = {1, 5, 8, T};
    for (int i = 0; i < 4; i++) {
        const int64_t bt = Ts[i];
        cpu__matmul_rows16_avx512_vnni(t, w, K, 0, N, act, bt, want, N);
        const int64_t parts = 8, blocks = (N + 15) / 16;
        for (int64_t q = 0; q < parts; q++) {
            int64_t n0 = blocks * q / parts * 16, n1 = blocks * (q + 1) / parts * 16;
            cpu_matmul_rows_packed(CPU_ISA_AVX512, t, p, K, N, n0, n1 < N ? n1 : N, act, bt, y, N);
        }
        ASSERT(memcmp(y, want, sizeof(float) * (size_t)(N * bt)) == 0);
        for (int64_t tt = 0; tt < bt; tt++)
            for (int64_t n = 0; n < N; n += 97) {
                int nt = 0;
                const uint8_t *wr = w + (size_t)n * rb, *ar = act + (size_t)tt * ab;
                double tol = dot_magnitude(t, wr, ar, K, &nt) * (nt + 4) * 0x1p-24 + FLT_MIN;
                ASSERT(fabs(y[tt * N + n] - quant_dot_ref(t, wr, ar, K)) <= tol);
            }
    }
    free(w);
    free(p);
    free(y);
    free(want);
}

TEST_MAIN()
