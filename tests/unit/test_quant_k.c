/*
 * test_quant_k.c: Q5_0 and the K-quants (engine/quant_k.c) against an
 * independent reference, the `gguf` Python package's dequantizer:
 *  - random blocks of every type and the floats gguf made of them
 *    (tests/fixtures/quant_k_blocks.txt, tools/make_quant_fixture.py), equal
 *    bit for bit;
 *  - every Q5_0, Q4_K, Q6_K and Q8_0 tensor of the real Gemma 3 270M file,
 *    dequantized whole and digested, against gguf's digests of the same
 *    tensors (tests/fixtures/gemma3_dequant_digests.txt); skipped when the
 *    file is absent, failed when it is present but does not parse or match;
 *  - quant_dot_ref against a double-precision dot of the dequantized values,
 *    within a bound derived below.
 */
#include "test.h"

#include <fcntl.h>
#include <float.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/gguf.h"
#include "engine/quant.h"

#ifndef SS_FIXTURES_DIR
#define SS_FIXTURES_DIR "tests/fixtures"
#endif

static const enum qtype k_types[] = {QTYPE_Q5_0, QTYPE_Q3_K, QTYPE_Q4_K, QTYPE_Q5_K, QTYPE_Q6_K};

static uint64_t rng = 0x6a09e667f3bcc908ull;

static uint32_t rand_u32(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 32);
}

TEST(block_layouts_have_the_ggml_sizes)
{
    ASSERT_EQ(sizeof(struct block_q5_0), 22);
    ASSERT_EQ(sizeof(struct block_q3_k), 110);
    ASSERT_EQ(sizeof(struct block_q4_k), 144);
    ASSERT_EQ(sizeof(struct block_q5_k), 176);
    ASSERT_EQ(sizeof(struct block_q6_k), 210);
    ASSERT_EQ(qtype_row_bytes(QTYPE_Q5_0, 640), 20 * 22);
    ASSERT_EQ(qtype_row_bytes(QTYPE_Q4_K, 2048), 8 * 144);
    ASSERT_EQ(qtype_row_bytes(QTYPE_Q6_K, 256), 210);
    ASSERT_EQ(qtype_row_bytes(QTYPE_Q4_K, 640), 0); /* not whole super-blocks */
    ASSERT_EQ(qtype_block_values(QTYPE_Q5_K), 256);
    ASSERT_EQ(qtype_block_values(QTYPE_Q5_0), 32);
    ASSERT_EQ(quant_act_bytes(QTYPE_Q6_K, 512), 16 * sizeof(struct block_q8_act));
    for (size_t i = 0; i < sizeof k_types / sizeof k_types[0]; i++) {
        ASSERT(qtype_supported(k_types[i]));
        ASSERT(qtype_is_k(k_types[i]));
    }
    ASSERT(!qtype_is_k(QTYPE_Q8_0));
    ASSERT(!qtype_supported(10)); /* Q2_K */
    ASSERT_STREQ(qtype_name(QTYPE_Q6_K), "Q6_K");
}

/* ---- the gguf package's dequantizer, on random blocks --------------------- */

static int hexval(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

TEST(dequant_matches_the_gguf_package_bit_for_bit_on_random_blocks)
{
    FILE *f = fopen(SS_FIXTURES_DIR "/quant_k_blocks.txt", "r");
    static char line[1 << 16];
    static uint8_t bytes[64 * 256];
    static uint32_t want[64 * 256];
    static float got[64 * 256];
    size_t nbytes = 0, nvals = 0;
    int type = -1, nblocks = 0, types_seen = 0;

    ASSERT(f != NULL);
    while (f && fgets(line, sizeof line, f)) {
        if (line[0] == '#')
            continue;
        if (strncmp(line, "type ", 5) == 0) {
            char name[16];
            ASSERT_EQ(sscanf(line, "type %15s %d blocks %d", name, &type, &nblocks), 3);
            ASSERT_STREQ(qtype_name(type), name);
            nbytes = nvals = 0;
        } else if (strncmp(line, "bytes ", 6) == 0) {
            for (const char *p = line + 6; hexval(p[0]) >= 0 && hexval(p[1]) >= 0; p += 2)
                bytes[nbytes++] = (uint8_t)(hexval(p[0]) << 4 | hexval(p[1]));
        } else if (strncmp(line, "values ", 7) == 0) {
            char *p = line + 7, *end;
            for (unsigned long v = strtoul(p, &end, 16); end != p; v = strtoul(p, &end, 16)) {
                want[nvals++] = (uint32_t)v;
                p = end;
            }
        } else if (strncmp(line, "end", 3) == 0) {
            int64_t n = (int64_t)nblocks * qtype_block_values(type);
            ASSERT_EQ(nbytes, qtype_row_bytes(type, n));
            ASSERT_EQ(nvals, (size_t)n);
            quant_dequant_row(type, bytes, got, n);
            int shown = 0;
            for (int64_t i = 0; i < n; i++) {
                uint32_t g;
                memcpy(&g, &got[i], 4);
                if (g != want[i] && shown++ < 4) {
                    float w;
                    memcpy(&w, &want[i], 4);
                    fprintf(stderr, "  %s value %lld: %.9g (0x%08x), gguf %.9g (0x%08x)\n",
                            qtype_name(type), (long long)i, got[i], g, w, want[i]);
                }
            }
            if (shown)
                FAIL_AT("%s: %d values differ from gguf's", qtype_name(type), shown);
            types_seen++;
        }
    }
    if (f)
        fclose(f);
    ASSERT_EQ(types_seen, 5);
}

/* ---- the real Gemma file -------------------------------------------------- */

/* The digest of tools/make_quant_fixture.py: the sum over i of mix64(i) *
 * mix64(bits_i + 1), modulo 2^64. */
static uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

TEST(dequant_matches_the_gguf_package_on_every_quantized_gemma_tensor)
{
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
    int rc = gguf_parse(&g, map, (size_t)st.st_size, err, sizeof err);
    if (rc < 0)
        FAIL_AT("%s does not parse: %s", path, err);

    FILE *f = fopen(SS_FIXTURES_DIR "/gemma3_dequant_digests.txt", "r");
    ASSERT(f != NULL);
    char line[512];
    int checked = 0, per_type[32] = {0};
    static float row[262144];
    while (rc == 0 && f && fgets(line, sizeof line, f)) {
        char name[128], tname[16];
        long long nvals;
        unsigned long long digest;
        if (line[0] == '#')
            continue;
        ASSERT_EQ(sscanf(line, "%127s %15s %lld %llx", name, tname, &nvals, &digest), 4);
        const struct gguf_tensor *t = gguf_find_tensor(&g, name);
        if (!t) {
            FAIL_AT("tensor %s missing from %s", name, path);
            continue;
        }
        ASSERT_STREQ(qtype_name(t->type), tname);
        int64_t ne0 = t->ne[0];
        int64_t rows = t->ne[1] * t->ne[2] * t->ne[3];
        ASSERT_EQ(ne0 * rows, nvals);
        ASSERT(ne0 <= (int64_t)(sizeof row / sizeof row[0]));
        size_t rb = qtype_row_bytes(t->type, ne0);
        uint64_t h = 0, idx = 0;
        for (int64_t r = 0; r < rows; r++) {
            quant_dequant_row(t->type, (const char *)t->data + (size_t)r * rb, row, ne0);
            for (int64_t i = 0; i < ne0; i++) {
                uint32_t bits;
                memcpy(&bits, &row[i], 4);
                h += mix64(idx++) * mix64((uint64_t)bits + 1);
            }
        }
        if (h != digest)
            FAIL_AT("%s (%s): digest %016llx, gguf's %016llx", name, tname, (unsigned long long)h,
                    digest);
        checked++;
        per_type[t->type & 31]++;
    }
    if (f)
        fclose(f);
    printf("  %d tensors: %d Q5_0, %d Q4_K, %d Q6_K, %d Q8_0\n", checked, per_type[QTYPE_Q5_0],
           per_type[QTYPE_Q4_K], per_type[QTYPE_Q6_K], per_type[QTYPE_Q8_0]);
    ASSERT(per_type[QTYPE_Q5_0] > 0 && per_type[QTYPE_Q4_K] > 0 && per_type[QTYPE_Q6_K] > 0);
    gguf_free(&g);
    munmap(map, (size_t)st.st_size);
}

/* ---- the reference dot product ------------------------------------------- */

/* n random blocks of type t: random bytes with every f16 scale replaced by a
 * finite value between 2^-12 and 2^2 in magnitude, either sign. */
static void random_blocks(enum qtype t, uint8_t *p, int64_t nblocks)
{
    size_t bb = qtype_block_bytes(t);
    size_t scale_at[2];
    int nscales = 1;
    switch (t) {
    case QTYPE_Q5_0:
        scale_at[0] = 0;
        break;
    case QTYPE_Q3_K:
        scale_at[0] = offsetof(struct block_q3_k, d);
        break;
    case QTYPE_Q6_K:
        scale_at[0] = offsetof(struct block_q6_k, d);
        break;
    default: /* Q4_K, Q5_K: d, dmin */
        scale_at[0] = 0;
        scale_at[1] = 2;
        nscales = 2;
        break;
    }
    for (int64_t b = 0; b < nblocks; b++) {
        uint8_t *blk = p + (size_t)b * bb;
        for (size_t i = 0; i < bb; i++)
            blk[i] = (uint8_t)rand_u32();
        for (int s = 0; s < nscales; s++) {
            float v =
                ldexpf(1.0f + (float)(rand_u32() % 1024) / 1024.0f, (int)(rand_u32() % 15) - 12);
            uint16_t h = quant_f32_to_f16(rand_u32() & 1 ? -v : v);
            memcpy(blk + scale_at[s], &h, 2);
        }
    }
}

/* quant_dot_ref forms, per 32-value group, the exact integer sum of sc * q *
 * a, times dw * d_a in float (two roundings, and one converting the integer
 * once it passes 2^24), minus mw * s_a (one rounding, and s_a's own); the
 * sum over groups is in double, rounded to float once. The dequantized
 * values err by at most two roundings of |dw sc q| + |mw| each (the product,
 * then the difference). So with M = sum_i (|dw sc q_i| + |mw|) |d_a a_i| the
 * two sides agree to 8 * 2^-24 * M. */
TEST(dot_ref_matches_a_double_dot_of_the_dequantized_values)
{
    enum { K = 2048 };
    static uint8_t w[K * 2];
    static float wf[K], x[K];
    static struct block_q8_act a[K / 32];

    for (size_t ti = 0; ti < sizeof k_types / sizeof k_types[0]; ti++) {
        enum qtype t = k_types[ti];
        for (int rep = 0; rep < 20; rep++) {
            int64_t k = rep % 2 ? K : 256 * (1 + rep % 4);
            random_blocks(t, w, k / qtype_block_values(t));
            for (int64_t i = 0; i < k; i++)
                x[i] = (float)((int)(rand_u32() % 2001) - 1000) * (rep % 3 ? 1e-3f : 7.5f);
            quant_prepare_act_ref(t, x, k, a);
            quant_dequant_row(t, w, wf, k);
            double want = 0.0, mag = 0.0;
            for (int64_t i = 0; i < k; i++) {
                const struct block_q8_act *ab = &a[i / 32];
                double av = (double)ab->d * ab->qs[i % 32];
                want += (double)wf[i] * av;
                int64_t gi = i / 32; /* group over the row */
                int64_t gpb = qtype_block_values(t) / 32;
                struct quant_group gr;
                quant_k_group(t, w + (size_t)(gi / gpb) * qtype_block_bytes(t), (int)(gi % gpb),
                              &gr);
                mag += (fabs((double)gr.dw * gr.sc[(i % 32) / 16] * gr.q[i % 32]) + fabs(gr.mw)) *
                       fabs(av);
            }
            double got = quant_dot_ref(t, w, a, k);
            double tol = 8.0 * 0x1p-24 * mag + FLT_MIN;
            if (!(fabs(got - want) <= tol))
                FAIL_AT("%s k=%lld rep %d: dot_ref %.9g, double dot %.9g (tolerance %.3g)",
                        qtype_name(t), (long long)k, rep, got, want, tol);
        }
    }
}

TEST_MAIN()
