/*
 * test_matmul_kquant.c: the Q5_0 and K-quant kernels (engine/cpu/
 * matmul_kquant_*.c) against the scalar reference (quant_dot_ref, itself
 * checked against the gguf package in test_quant_k.c), on every ISA this
 * CPU has (AVX-512 with and without VNNI), on odd shapes: odd Q5_0 block
 * counts, one to eight super-blocks, weight row ranges that do not start at
 * 0, T from 1 to 9, ldy > N; and on the real Gemma 3 270M tensors when the
 * file is present.
 */
#include "test.h"

#include <fcntl.h>
#include <float.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/cpu/matmul.h"
#include "engine/cpu/matmul_impl.h"
#include "engine/cpu/matmul_kquant.h"
#include "engine/gguf.h"

static const enum qtype k_types[] = {QTYPE_Q5_0, QTYPE_Q3_K, QTYPE_Q4_K, QTYPE_Q5_K, QTYPE_Q6_K};

struct kernel {
    const char *name;
    enum cpu_isa isa;
    int avx512_no_vnni; /* call the AVX-512 kernel directly with vnni = 0 */
};

static int list_kernels(struct kernel *out)
{
    enum cpu_isa best = cpu_isa_best();
    int n = 0;
    out[n++] = (struct kernel){"scalar", CPU_ISA_SCALAR, 0};
    if (best >= CPU_ISA_AVX2)
        out[n++] = (struct kernel){"avx2", CPU_ISA_AVX2, 0};
    if (best >= CPU_ISA_AVX512) {
        out[n++] = (struct kernel){cpu__has_vnni() ? "avx512-vnni" : "avx512", CPU_ISA_AVX512, 0};
        if (cpu__has_vnni())
            out[n++] = (struct kernel){"avx512 without vnni", CPU_ISA_AVX512, 1};
    }
    return n;
}

static void kernel_matmul(const struct kernel *kn, enum qtype t, const void *w, int64_t k,
                          int64_t n0, int64_t n1, const void *act, int64_t T, float *y, int64_t ldy)
{
    if (kn->avx512_no_vnni)
        cpu__matmul_rows_kquant_avx512(t, w, k, n0, n1, act, T, y, ldy, 0);
    else
        cpu_matmul_rows(kn->isa, t, w, k, n0, n1, act, T, y, ldy);
}

static uint64_t rng = 0xbb67ae8584caa73bull;

static uint32_t rand_u32(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 32);
}

/* Random bytes with every f16 scale a finite value of magnitude 2^-12..2^2. */
static void random_blocks(enum qtype t, uint8_t *p, int64_t nblocks)
{
    size_t bb = qtype_block_bytes(t);
    size_t at[2] = {0, 2};
    int ns = t == QTYPE_Q4_K || t == QTYPE_Q5_K ? 2 : 1;
    if (t == QTYPE_Q3_K)
        at[0] = offsetof(struct block_q3_k, d);
    if (t == QTYPE_Q6_K)
        at[0] = offsetof(struct block_q6_k, d);
    for (int64_t b = 0; b < nblocks; b++) {
        uint8_t *blk = p + (size_t)b * bb;
        for (size_t i = 0; i < bb; i++)
            blk[i] = (uint8_t)rand_u32();
        for (int s = 0; s < ns; s++) {
            float v =
                ldexpf(1.0f + (float)(rand_u32() % 1024) / 1024.0f, (int)(rand_u32() % 15) - 12);
            uint16_t h = quant_f32_to_f16(rand_u32() & 1 ? -v : v);
            memcpy(blk + at[s], &h, 2);
        }
    }
}

/* Activation values with a different scale per 32-block and some zero blocks. */
static void fill(float *x, int64_t k)
{
    for (int64_t i = 0; i < k; i++) {
        int64_t b = i / 32;
        float scale = (float)pow(10.0, (double)(b % 5) - 2.0);
        x[i] = b % 11 == 10 ? 0.0f : ((float)(rand_u32() >> 8) * 0x1p-23f - 1.0f) * scale;
    }
}

/* The magnitudes a kernel sums in float, and how many terms: each group's
 * 8 (AVX2) or 8 of 16 (AVX-512) lane partials, bounded by sum |dw sc q a|
 * over the group's values, plus its min term |mw s_a|. */
static double dot_magnitude(enum qtype t, const uint8_t *w, const struct block_q8_act *a, int64_t k,
                            int *nterms)
{
    const int64_t gpb = qtype_block_values(t) / 32;
    double mag = 0.0;
    for (int64_t gi = 0; gi < k / 32; gi++) {
        struct quant_group gr;
        quant_k_group(t, w + (size_t)(gi / gpb) * qtype_block_bytes(t), (int)(gi % gpb), &gr);
        for (int j = 0; j < 32; j++)
            mag += fabs((double)gr.dw * gr.sc[j / 16] * gr.q[j] * a[gi].d * a[gi].qs[j]);
        mag += fabs((double)gr.mw * a[gi].s);
    }
    *nterms = (int)(9 * (k / 32));
    return mag;
}

/* Both sides form every term with a few float roundings (the kernels: the
 * scale product and a fused multiply-add; the reference: two products, and
 * the final rounding of its double sum), and the kernels sum n terms in some
 * order, erring by at most (n - 1) * 2^-24 * sum |terms|. So |y - ref| <=
 * (n + 6) * 2^-24 * sum |terms|. */
static double tolerance(int nterms, double mag)
{
    return (nterms + 6) * 0x1p-24 * mag + FLT_MIN;
}

#define K_MAX 2048
#define N_MAX 40
#define T_MAX 9

TEST(kquant_kernels_match_the_scalar_reference_for_every_type_shape_and_isa)
{
    static const int64_t ks_q5_0[] = {32, 96, 640, 1056};
    static const int64_t ks_k[] = {256, 512, 768, 2048};
    static const int64_t ts[] = {1, 2, 3, 4, 5, 7, 9};
    static const int64_t ns[][2] = {{0, 1}, {3, 4}, {1, 6}, {5, 18}, {2, 39}};
    static float x[T_MAX][K_MAX];
    _Alignas(64) static uint8_t w[N_MAX * K_MAX];
    _Alignas(64) static struct block_q8_act act[T_MAX][K_MAX / 32];
    static float y[T_MAX * (N_MAX + 3)], want[T_MAX * (N_MAX + 3)];
    static double tol[T_MAX * (N_MAX + 3)];
    const int64_t ldy = N_MAX + 3;
    const float sentinel = -12345.0f;
    struct kernel kernels[4];
    int nk = list_kernels(kernels);
    long long checked = 0;

    for (int ki = 1; ki < nk; ki++)
        printf("  kernel: %s\n", kernels[ki].name);
    if (nk == 1)
        printf("  no SIMD kernels on this CPU: only the scalar path runs\n");
    for (size_t ti = 0; ti < sizeof k_types / sizeof k_types[0]; ti++) {
        enum qtype t = k_types[ti];
        const int64_t *ks = t == QTYPE_Q5_0 ? ks_q5_0 : ks_k;
        for (int kj = 0; kj < 4; kj++) {
            int64_t k = ks[kj];
            size_t rb = qtype_row_bytes(t, k);
            ASSERT(rb != 0);
            random_blocks(t, w, N_MAX * k / qtype_block_values(t));
            for (int tt = 0; tt < T_MAX; tt++) {
                fill(x[tt], k);
                cpu_prepare_act(CPU_ISA_SCALAR, t, x[tt], k, act[tt]);
                for (int64_t n = 0; n < N_MAX; n++) {
                    int nt;
                    double mag = dot_magnitude(t, w + (size_t)n * rb, act[tt], k, &nt);
                    want[tt * ldy + n] = quant_dot_ref(t, w + (size_t)n * rb, act[tt], k);
                    tol[tt * ldy + n] = tolerance(nt, mag);
                }
            }
            for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
                int64_t n0 = ns[ni][0], n1 = ns[ni][1];
                for (size_t tj = 0; tj < sizeof ts / sizeof ts[0]; tj++) {
                    int64_t T = ts[tj];
                    for (int kk = 0; kk < nk; kk++) {
                        const struct kernel *kn = &kernels[kk];
                        for (size_t i = 0; i < sizeof y / sizeof y[0]; i++)
                            y[i] = sentinel;
                        /* act rows are K_MAX / 32 blocks apart, so each row
                         * is prepared for k and the kernel sees them packed */
                        static struct block_q8_act packed[T_MAX * K_MAX / 32];
                        for (int64_t tt = 0; tt < T; tt++)
                            memcpy(packed + tt * (k / 32), act[tt], quant_act_bytes(t, k));
                        kernel_matmul(kn, t, w, k, n0, n1, packed, T, y, ldy);
                        int shown = 0;
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
                                double err = fabs((double)got - want[tt * ldy + n]);
                                if (!(err <= tol[tt * ldy + n]) && shown++ < 4)
                                    fprintf(stderr,
                                            "  %s %s K=%lld T=%lld rows [%lld,%lld): y[%lld][%lld]"
                                            " = %.9g, reference %.9g (tolerance %.3g)\n",
                                            kn->name, qtype_name(t), (long long)k, (long long)T,
                                            (long long)n0, (long long)n1, (long long)tt,
                                            (long long)n, got, want[tt * ldy + n],
                                            tol[tt * ldy + n]);
                                checked++;
                            }
                        }
                        if (shown)
                            FAIL_AT("%s %s K=%lld T=%lld: values off the reference", kn->name,
                                    qtype_name(t), (long long)k, (long long)T);
                    }
                }
            }
        }
    }
    printf("  %lld outputs checked across %d kernels\n", checked, nk);
}

/* A batch row gives the same result as the same row decoded alone: the
 * kernels' arithmetic per output does not depend on the tile it lands in
 * (the scheduler batches sequences; README: batched and solo greedy streams
 * are bit-identical). */
TEST(kquant_kernels_give_a_row_the_same_bits_alone_and_in_a_batch)
{
    enum { K = 512, N = 6, T = 7 };
    static float x[T][K];
    _Alignas(64) static uint8_t w[N * K];
    static struct block_q8_act act[T * K / 32];
    float batch[T * N], solo[N];
    struct kernel kernels[4];
    int nk = list_kernels(kernels);

    for (size_t ti = 0; ti < sizeof k_types / sizeof k_types[0]; ti++) {
        enum qtype t = k_types[ti];
        random_blocks(t, w, N * K / qtype_block_values(t));
        for (int tt = 0; tt < T; tt++) {
            fill(x[tt], K);
            cpu_prepare_act(CPU_ISA_SCALAR, t, x[tt], K, act + tt * (K / 32));
        }
        for (int kk = 0; kk < nk; kk++) {
            kernel_matmul(&kernels[kk], t, w, K, 0, N, act, T, batch, N);
            for (int tt = 0; tt < T; tt++) {
                kernel_matmul(&kernels[kk], t, w, K, 0, N, act + tt * (K / 32), 1, solo, N);
                for (int n = 0; n < N; n++)
                    if (memcmp(&solo[n], &batch[tt * N + n], sizeof(float)) != 0)
                        FAIL_AT("%s %s: row %d output %d: %.9g alone, %.9g in a batch",
                                kernels[kk].name, qtype_name(t), tt, n, solo[n], batch[tt * N + n]);
            }
        }
    }
}

/* The Gemma 3 270M file's own tensors, one of each quantized type and shape
 * (when the file is present), as a thread would get them: rows [8, 40) of
 * each, against the reference. */
TEST(kquant_kernels_match_the_reference_on_the_gemma_tensors)
{
    static const char *const names[] = {"blk.0.attn_q.weight",      "blk.0.attn_k.weight",
                                        "blk.0.attn_output.weight", "blk.0.ffn_up.weight",
                                        "blk.0.ffn_down.weight",    "blk.1.ffn_down.weight",
                                        "blk.2.ffn_down.weight"};
    static float x[4][K_MAX];
    static struct block_q8_act act[4 * K_MAX / 32];
    static float y[4 * 40];
    struct kernel kernels[4];
    int nk = list_kernels(kernels);
    int seen[32] = {0};

    TEST_NEED_GEMMA_MODEL();
    const char *path = test_gemma_model_path();
    int fd = open(path, O_RDONLY);
    struct stat st;
    ASSERT(fd >= 0);
    ASSERT_OK(fstat(fd, &st));
    void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    ASSERT(map != MAP_FAILED);
    struct gguf_file g;
    char err[256] = "";
    if (gguf_parse(&g, map, (size_t)st.st_size, err, sizeof err) < 0) {
        FAIL_AT("%s does not parse: %s", path, err);
        munmap(map, (size_t)st.st_size);
        return;
    }
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const struct gguf_tensor *tn = gguf_find_tensor(&g, names[i]);
        if (!tn) {
            FAIL_AT("%s: no tensor %s", path, names[i]);
            continue;
        }
        enum qtype t = tn->type;
        int64_t k = tn->ne[0];
        ASSERT(k <= K_MAX && tn->ne[1] >= 40);
        if (!qtype_is_k(t))
            continue; /* Q8_0 in some layers: test_matmul's business */
        seen[t]++;
        size_t rb = qtype_row_bytes(t, k);
        for (int tt = 0; tt < 4; tt++) {
            fill(x[tt], k);
            cpu_prepare_act(CPU_ISA_SCALAR, t, x[tt], k, act + tt * (k / 32));
        }
        for (int kk = 0; kk < nk; kk++) {
            kernel_matmul(&kernels[kk], t, tn->data, k, 8, 40, act, 4, y, 40);
            for (int tt = 0; tt < 4; tt++) {
                for (int64_t r = 8; r < 40; r++) {
                    const uint8_t *wr = (const uint8_t *)tn->data + (size_t)r * rb;
                    int nt;
                    double mag = dot_magnitude(t, wr, act + tt * (k / 32), k, &nt);
                    float ref = quant_dot_ref(t, wr, act + tt * (k / 32), k);
                    if (!(fabs(y[tt * 40 + r] - ref) <= tolerance(nt, mag)))
                        FAIL_AT("%s %s %s: y[%d][%lld] = %.9g vs %.9g", kernels[kk].name, names[i],
                                qtype_name(t), tt, (long long)r, y[tt * 40 + r], ref);
                }
            }
        }
    }
    printf("  Gemma tensors checked: %d Q5_0, %d Q4_K, %d Q6_K\n", seen[QTYPE_Q5_0],
           seen[QTYPE_Q4_K], seen[QTYPE_Q6_K]);
    ASSERT(seen[QTYPE_Q5_0] > 0 && seen[QTYPE_Q4_K] > 0 && seen[QTYPE_Q6_K] > 0);
    gguf_free(&g);
    munmap(map, (size_t)st.st_size);
}

TEST_MAIN()
