/*
 * test_attention.c: the CPU attention op as the backend drives it
 * (engine/cpu/attention.h): several tokens' query rows scored together by
 * cpu_attention_span_rows over fixed key blocks, then cpu_attention_merge.
 *
 * Every kernel set this CPU can run (scalar, AVX2, AVX-512, and the AVX-512
 * file again under SIMDe's emulation where libsimde-dev is installed, so that
 * CPUs without AVX-512 check its logic too) is checked against a
 * reference loop written here in double (scores, max, exponentials and the
 * weighted sum of values, no tiles, no online rescaling), over: head_dim 64,
 * 256 (Gemma 3) and 20 (not a multiple of 8: the masked tails); GQA 3:1 and
 * 4:1; f32, f16 and q8_0 K/V (q8_0 where head_dim is a multiple of 32; the
 * reference reads the values that engine/quant.c's scalar dequantizer gives
 * for the stored blocks); the sink, softmax and softpick normalizers; sinks
 * scored with the in-cache query; a window that wraps around its ring (three
 * runs); rows of unequal, odd lengths spanning several key blocks; rows
 * whose windows slide (each starts some keys into the union of their keys).
 *
 * And batch invariance (DESIGN.md invariant 2 at the op level): each row's
 * partial state is bit-identical to the one cpu_attention_span computes for
 * that row's token alone, with its own keys, as a decode step does.
 *
 * Tolerance: outputs are (sub-)convex combinations of values in [-1, 1).
 * The op sums up to ~1,200 terms in f32 with online rescaling; each step
 * rounds by 2^-24 relative, bounded by ~1,200 * 6e-8 = 7.2e-5, and about
 * 2e-7 in practice (the largest error is printed). TOL = 2e-6: a wrong weight
 * (one key's share is ~1e-3 and up, times values ~0.5) is 250x larger.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/cpu/attention.h"
#include "engine/cpu/matmul.h"
#include "engine/quant.h"
#include "test.h"
#include "support/rng.h"

#define TOL 2e-6
#define BLOCK ATTN_KEY_BLOCK /* the backend's blocks */
#define MAX_CELLS (2 * BLOCK + 200)
#define MAX_DH 256
#define MAX_TOK 6
#define MAX_G 4
#define SOFTPICK_EPS 1e-6 /* DESIGN.md's eps */
#define FLOOR (-64.0)     /* ATTN_SOFTPICK_M_FLOOR */

struct kv {
    int dh, fmt;
    float kf[MAX_CELLS * MAX_DH], vf[MAX_CELLS * MAX_DH]; /* the stored values, as f32 */
    uint16_t kh[MAX_CELLS * MAX_DH], vh[MAX_CELLS * MAX_DH];
    struct block_q8_0 kq[MAX_CELLS * MAX_DH / 32], vq[MAX_CELLS * MAX_DH / 32];
};

/* Random K and V rows stored in fmt; kf and vf get the values as stored
 * (for q8_0 through quant_dequant_row, the scalar reference). */
static void kv_fill(struct kv *c, int dh, int fmt, uint64_t seed)
{
    c->dh = dh;
    c->fmt = fmt;
    for (int i = 0; i < MAX_CELLS * dh; i++) {
        float k = test_rng_sym(&seed) * 2.0f, v = test_rng_sym(&seed);
        c->kh[i] = quant_f32_to_f16(k);
        c->vh[i] = quant_f32_to_f16(v);
        c->kf[i] = fmt == ATTN_F16 ? quant_f16_to_f32(c->kh[i]) : k;
        c->vf[i] = fmt == ATTN_F16 ? quant_f16_to_f32(c->vh[i]) : v;
    }
    if (fmt == ATTN_Q8_0) {
        quant_quantize_row(QTYPE_Q8_0, c->kf, c->kq, (int64_t)MAX_CELLS * dh);
        quant_quantize_row(QTYPE_Q8_0, c->vf, c->vq, (int64_t)MAX_CELLS * dh);
        quant_dequant_row(QTYPE_Q8_0, c->kq, c->kf, (int64_t)MAX_CELLS * dh);
        quant_dequant_row(QTYPE_Q8_0, c->vq, c->vf, (int64_t)MAX_CELLS * dh);
    }
}

static const void *kv_k(const struct kv *c)
{
    return c->fmt == ATTN_F16    ? (const void *)c->kh
           : c->fmt == ATTN_Q8_0 ? (const void *)c->kq
                                 : (const void *)c->kf;
}

static const void *kv_v(const struct kv *c)
{
    return c->fmt == ATTN_F16    ? (const void *)c->vh
           : c->fmt == ATTN_Q8_0 ? (const void *)c->vq
                                 : (const void *)c->vf;
}

/* keys of a token that sees `end` visit indices: sinks [0, S), then a
 * window of the ring [S, S + R) starting at ring offset o (wrapping) */
static struct attn_keys keys_of(const struct kv *c, int S, int R, int o, int64_t end)
{
    struct attn_keys k = {.k = kv_k(c), .v = kv_v(c), .fmt = c->fmt, .head_dim = c->dh};
    int64_t w = end - S; /* window keys */
    k.run_start[0] = 0;
    k.run_len[0] = S;
    k.run_start[1] = S + o;
    k.run_len[1] = w < R - o ? w : R - o;
    k.run_start[2] = S;
    k.run_len[2] = w - k.run_len[1];
    k.run_uses_qc[0] = 1;
    return k;
}

static int64_t visit_cell(const struct attn_keys *k, int64_t v)
{
    for (int r = 0; r < 3; r++) {
        if (v < k->run_len[r])
            return k->run_start[r] + v;
        v -= k->run_len[r];
    }
    return -1;
}

/* the reference: one row, in double */
static void reference(const struct kv *c, const struct attn_keys *k, const float *q,
                      const float *qc, enum model_normalizer norm, double sink, double *out)
{
    const int n = c->dh;
    const int64_t nk = k->run_len[0] + k->run_len[1] + k->run_len[2];
    static double z[MAX_CELLS];
    double m = norm == MODEL_NORM_SOFTPICK ? FLOOR : -INFINITY;
    for (int64_t v = 0; v < nk; v++) {
        const float *qq = v < k->run_len[0] ? qc : q;
        const float *kr = c->kf + visit_cell(k, v) * n;
        double s = 0;
        for (int i = 0; i < n; i++)
            s += (double)qq[i] * kr[i];
        z[v] = s / sqrt((double)n);
        m = z[v] > m ? z[v] : m;
    }
    double l = 0;
    if (norm == MODEL_NORM_SINK) {
        m = sink > m ? sink : m;
        l = exp(sink - m); /* the virtual key, value zero */
    }
    for (int i = 0; i < n; i++)
        out[i] = 0;
    for (int64_t v = 0; v < nk; v++) {
        const float *vr = c->vf + visit_cell(k, v) * n;
        double w;
        if (norm == MODEL_NORM_SOFTPICK) {
            double d = exp(z[v] - m) - exp(-m);
            l += fabs(d);
            w = d > 0 ? d : 0;
        } else {
            w = exp(z[v] - m);
            l += w;
        }
        for (int i = 0; i < n; i++)
            out[i] += w * vr[i];
    }
    double den = norm == MODEL_NORM_SOFTPICK ? l + SOFTPICK_EPS : l;
    for (int i = 0; i < n; i++)
        out[i] = den > 0 ? out[i] / den : 0;
}

/* The AVX-512 tile kernels again, compiled against SIMDe (where it is
 * installed), so that machines without AVX-512 check their logic too. */
#include "support/simde_avx512_begin.h"
#ifdef SS_EMULATE_AVX512
#define cpu__attn_scores_avx512 emu_attn_scores_avx512
#define cpu__attn_accum_avx512 emu_attn_accum_avx512
#define cpu__attn_scores_kv_avx512 emu_attn_scores_kv_avx512
#define cpu__attn_accum_kv_avx512 emu_attn_accum_kv_avx512
#define cpu__attn_exp_sub_avx512 emu_attn_exp_sub_avx512
#define cpu__attn_to_f32_avx512 emu_attn_to_f32_avx512
float emu_attn_scores_avx512(float *z, const float *q, const float *kf, int nt, int n, float scale);
void emu_attn_accum_avx512(float *acc, const float *w, const float *vf, int nt, int n);
void emu_attn_scores_kv_avx512(float *z, int64_t zs, int nr, const float *const *q,
                               const void *const *k, int nt, int n, float scale, float *mx,
                               int fmt);
void emu_attn_accum_kv_avx512(float *const *acc, int nr, const float *w, int64_t ws,
                              const void *const *v, int nt, int n, int fmt);
float emu_attn_exp_sub_avx512(float *w, const float *z, float m, int n);
void emu_attn_to_f32_avx512(float *dst, const void *src, int rows, int n, int fmt);
#include "engine/cpu/attention_avx512.c"
#undef cpu__attn_scores_avx512
#undef cpu__attn_accum_avx512
#undef cpu__attn_scores_kv_avx512
#undef cpu__attn_accum_kv_avx512
#undef cpu__attn_exp_sub_avx512
#undef cpu__attn_to_f32_avx512
#endif
#include "support/simde_avx512_end.h"

/* Every kernel set this CPU runs, and (on AVX2 CPUs, with SIMDe) the
 * AVX-512 one under emulation: at most 4. */
static int kernel_sets(struct attn_kernels *k, const char **names)
{
    static const char *const all[] = {"scalar", "avx2", "avx512"};
    int n = 0;
    for (int level = 0; level <= (int)cpu_isa_best() && level < 3; level++) {
        cpu_attention_kernels(&k[n], level);
        names[n++] = all[level];
    }
#ifdef SS_EMULATE_AVX512
    if (cpu_isa_best() >= CPU_ISA_AVX2) {
        cpu_attention_kernels(&k[n], 1);
        k[n].scores = emu_attn_scores_avx512;
        k[n].accum = emu_attn_accum_avx512;
        k[n].scores_kv = emu_attn_scores_kv_avx512;
        k[n].accum_kv = emu_attn_accum_kv_avx512;
        k[n].exp_sub = emu_attn_exp_sub_avx512;
        k[n].exp_sub_rows = NULL; /* as at level 2: exp_sub row by row */
        k[n].keys_t = NULL;       /* as at level 2: no block kernels */
        k[n].scores_t = NULL;
        k[n].max_kv = NULL;
        k[n].to_f32 = emu_attn_to_f32_avx512;
        names[n++] = "avx512 (SIMDe)";
    }
#endif
    return n;
}

static struct kv g_kv;
static float g_q[MAX_TOK * MAX_G * MAX_DH], g_qc[MAX_TOK * MAX_G * MAX_DH];
/* per (token, head, block): m, l, acc */
static float g_m[MAX_TOK * MAX_G][MAX_CELLS / BLOCK + 1],
    g_l[MAX_TOK * MAX_G][MAX_CELLS / BLOCK + 1];
static float g_acc[MAX_TOK * MAX_G][MAX_CELLS / BLOCK + 1][MAX_DH];
static float s_m[MAX_G], s_l[MAX_G], s_acc[MAX_G * MAX_DH];

struct shape {
    int dh, G, S, R, o; /* head_dim, heads per kv head, sinks, ring cells, window offset */
    int ntok;
    int64_t end[MAX_TOK];   /* keys each token sees (sinks included) */
    int64_t shift[MAX_TOK]; /* where each token's window starts in the union's (attn_row) */
};

/* One shape, all kernel sets, f32, f16 and q8_0, all normalizers: returns the
 * largest error against the reference, or -1 on a bit-identity failure. */
static double run_shape(const struct shape *sh, uint64_t seed, int *failed)
{
    struct attn_kernels kr[4];
    const char *names[4];
    const int nks = kernel_sets(kr, names);
    const int n = sh->dh, G = sh->G;
    const enum model_normalizer norms[] = {MODEL_NORM_SINK, MODEL_NORM_SOFTMAX,
                                           MODEL_NORM_SOFTPICK};
    const float scale = 1.0f / sqrtf((float)n);
    double worst = 0;
    int64_t longest = 0, union_end = 0; /* the most keys a token sees; keys the union holds */
    for (int t = 0; t < sh->ntok; t++) {
        longest = sh->end[t] > longest ? sh->end[t] : longest;
        const int64_t ue = sh->end[t] + sh->shift[t];
        union_end = ue > union_end ? ue : union_end;
    }
    const int nb = (int)((longest + BLOCK - 1) / BLOCK);
    for (int fmt = ATTN_F32; fmt <= ATTN_Q8_0; fmt++) {
        if (fmt == ATTN_Q8_0 && n % 32 != 0)
            continue; /* q8_0 rows are whole blocks */
        kv_fill(&g_kv, n, fmt, seed + (uint64_t)fmt);
        uint64_t qs = seed * 31 + 7;
        for (int i = 0; i < sh->ntok * G * n; i++) {
            g_q[i] = test_rng_sym(&qs) * 1.5f;
            g_qc[i] = test_rng_sym(&qs) * 1.5f;
        }
        for (int ki = 0; ki < nks; ki++) {
            for (size_t ni = 0; ni < sizeof norms / sizeof norms[0]; ni++) {
                const int softpick = norms[ni] == MODEL_NORM_SOFTPICK;
                const float sink = 0.75f;
                struct attn_keys kl = keys_of(&g_kv, sh->S, sh->R, sh->o, union_end);
                for (int b = 0; b < nb; b++) {
                    struct attn_row rows[MAX_TOK * MAX_G];
                    int nr = 0;
                    for (int t = 0; t < sh->ntok; t++)
                        for (int h = 0; h < G; h++, nr++)
                            rows[nr] = (struct attn_row){g_q + (t * G + h) * n,
                                                         g_qc + (t * G + h) * n,
                                                         sh->end[t],
                                                         &g_m[nr][b],
                                                         &g_l[nr][b],
                                                         g_acc[nr][b],
                                                         sh->shift[t]};
                    cpu_attention_span_rows(&kr[ki], nr, rows, &kl, (int64_t)b * BLOCK,
                                            (int64_t)(b + 1) * BLOCK, scale, softpick, NULL);
                    /* each token alone, as decoding it: its own keys and
                     * block end, all its heads in one call */
                    for (int t = 0; t < sh->ntok; t++) {
                        int64_t v0 = (int64_t)b * BLOCK, v1 = v0 + BLOCK;
                        if (v0 >= sh->end[t])
                            continue; /* the backend never scores an empty block */
                        v1 = v1 < sh->end[t] ? v1 : sh->end[t];
                        struct attn_keys kt = keys_of(
                            &g_kv, sh->S, sh->R, (sh->o + (int)sh->shift[t]) % sh->R, sh->end[t]);
                        cpu_attention_span(&kr[ki], G, g_q + t * G * n, g_qc + t * G * n, &kt, v0,
                                           v1, scale, softpick, s_m, s_l, s_acc);
                        for (int h = 0; h < G; h++) {
                            int r = t * G + h;
                            if (memcmp(&s_m[h], &g_m[r][b], sizeof(float)) != 0 ||
                                memcmp(&s_l[h], &g_l[r][b], sizeof(float)) != 0 ||
                                memcmp(s_acc + h * n, g_acc[r][b], (size_t)n * sizeof(float))) {
                                fprintf(stderr,
                                        "  %s dh %d G %d fmt %d norm %zu token %d head %d block "
                                        "%d: grouped state differs from the token alone\n",
                                        names[ki], n, G, fmt, ni, t, h, b);
                                *failed = 1;
                                return -1;
                            }
                        }
                    }
                }
                for (int t = 0; t < sh->ntok; t++) {
                    struct attn_keys kt = keys_of(&g_kv, sh->S, sh->R,
                                                  (sh->o + (int)sh->shift[t]) % sh->R, sh->end[t]);
                    const int nbt = (int)((sh->end[t] + BLOCK - 1) / BLOCK);
                    for (int h = 0; h < G; h++) {
                        const int r = t * G + h;
                        float out[MAX_DH], m[MAX_CELLS / BLOCK + 1], l[MAX_CELLS / BLOCK + 1];
                        double ref[MAX_DH];
                        for (int b = 0; b < nbt; b++) {
                            m[b] = g_m[r][b];
                            l[b] = g_l[r][b];
                        }
                        cpu_attention_merge(&kr[ki], nbt, m, l, g_acc[r][0], MAX_DH, n, norms[ni],
                                            sink, NULL, out);
                        reference(&g_kv, &kt, g_q + r * n, g_qc + r * n, norms[ni], sink, ref);
                        for (int i = 0; i < n; i++) {
                            double e = fabs(out[i] - ref[i]);
                            if (!(e <= TOL)) {
                                fprintf(stderr,
                                        "  %s dh %d G %d fmt %d norm %zu token %d head %d [%d]: "
                                        "%.8f vs reference %.8f\n",
                                        names[ki], n, G, fmt, ni, t, h, i, out[i], ref[i]);
                                *failed = 1;
                                return -1;
                            }
                            worst = e > worst ? e : worst;
                        }
                    }
                }
            }
        }
    }
    return worst;
}

TEST(grouped_rows_match_the_reference_and_each_token_alone)
{
    /* lengths relative to the backend's block B; E: B + 8 keys */
    enum { B = BLOCK, E = BLOCK + 8 };
    const struct shape shapes[] = {
        /* SmolLM2: Dh 64, GQA 3:1; a prefill chunk without wrap, odd ends,
         * the last ones across the first block boundary */
        {64, 3, 4, B + 188, 0, 5, {5, 131, B - 1, B + 1, B + 5}, {0}},
        /* window wrapping around the ring (three runs) across the first
         * block boundary, 4:1 */
        {64, 4, 4, B + 244, 377, 4, {B + 44, B + 77, B + 145, B + 247}, {0}},
        /* Gemma 3: Dh 256, 4:1, no sinks, three blocks */
        {256, 4, 0, 2 * B + 188, 50, 3, {1, B + 5, 2 * B + 188}, {0}},
        /* Dh not a multiple of 8: masked tails; one key only; 3:1 */
        {20, 3, 2, B + 44, B + 43, 6, {1, 2, 3, 9, 33, B + 46}, {0}},
        /* a chunk whose window slides (each token's starts one key on, all
         * see a full window) across the first block boundary and the
         * ring's wrap */
        {64, 3, 4, B + 44, B - 6, 6, {E, E, E, E, E, E}, {0, 1, 2, 3, 4, 5}},
        /* the window fills, then slides; 4:1 */
        {64, 4, 4, 500, 100, 5, {100, 101, 102, 102, 102}, {0, 0, 0, 1, 2}},
        /* masked tails and the largest shift, in no order */
        {20, 3, 2, 300, 280, 3, {40, 40, 40}, {0, 32, 17}},
        /* no sinks: every key is shifted; Dh 256 */
        {256, 4, 0, B + 444, B + 394, 3, {B + 44, B + 44, B + 44}, {0, 3, 9}},
        /* the block kernels' other head dims: Dh 128 sliding, 3:1; Dh 48,
         * 2:1 (a row tile of three holds two tokens' rows), shifts apart */
        {128, 3, 4, B + 44, 120, 4, {E, E, E, E}, {0, 1, 2, 3}},
        {48, 2, 4, B + 144, B + 134, 3, {B + 34, B + 34, B + 34}, {0, 5, 11}},
    };
    double worst = 0;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        double e = run_shape(&shapes[i], 1000 + i, failed);
        if (*failed)
            return;
        worst = e > worst ? e : worst;
    }
    fprintf(stderr, "  largest error against the reference: %.3g (tolerance %.0e)\n", worst, TOL);
}

/* The tile kernels alone, every length 1..40 and head dims around the
 * vector widths, against a double loop: scores and their max, the
 * exponentials and their sum, the weighted sum of values. */
TEST(score_and_accumulate_kernels_match_double_loops)
{
    struct attn_kernels kr[4];
    const char *names[4];
    const int nks = kernel_sets(kr, names);
    static float q[MAX_DH], kf[40 * MAX_DH], w[40], acc[MAX_DH], acc0[MAX_DH], z[40];
    uint64_t s = 99;
    const int dims[] = {1, 7, 8, 9, 16, 20, 24, 63, 64, 65, 72, 128, 200, 256};
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
        const int n = dims[di];
        for (int nt = 1; nt <= 40; nt++) {
            for (int i = 0; i < n; i++)
                q[i] = test_rng_sym(&s);
            for (int i = 0; i < nt * n; i++)
                kf[i] = test_rng_sym(&s);
            for (int i = 0; i < nt; i++)
                w[i] = (float)test_rng_unit(&s);
            for (int i = 0; i < n; i++)
                acc0[i] = test_rng_sym(&s);
            for (int ki = 0; ki < nks; ki++) {
                float zmax = kr[ki].scores(z, q, kf, nt, n, 0.125f);
                float want = z[0];
                for (int i = 1; i < nt; i++)
                    want = z[i] > want ? z[i] : want;
                if (zmax != want)
                    FAIL_AT("%s scores n %d nt %d returned max %.8f, largest %.8f", names[ki], n,
                            nt, zmax, want);
                float e[40];
                double esum = 0;
                float got = kr[ki].exp_sub(e, z, want, nt);
                for (int i = 0; i < nt; i++) {
                    double r = exp((double)z[i] - want);
                    if (fabs(e[i] - r) > 3e-7 * r)
                        FAIL_AT("%s exp_sub nt %d [%d]: %.9g vs %.9g", names[ki], nt, i, e[i], r);
                    esum += r;
                }
                if (fabs(got - esum) > 1e-6 * esum)
                    FAIL_AT("%s exp_sub nt %d sum %.9g vs %.9g", names[ki], nt, got, esum);
                memcpy(acc, acc0, sizeof acc);
                kr[ki].accum(acc, w, kf, nt, n);
                for (int i = 0; i < nt; i++) {
                    double r = 0;
                    for (int j = 0; j < n; j++)
                        r += (double)q[j] * kf[i * n + j];
                    r *= 0.125;
                    if (fabs(z[i] - r) > 1e-6 * (1 + n))
                        FAIL_AT("%s scores n %d nt %d key %d: %.8f vs %.8f", names[ki], n, nt, i,
                                z[i], r);
                }
                for (int j = 0; j < n; j++) {
                    double r = acc0[j];
                    for (int i = 0; i < nt; i++)
                        r += (double)w[i] * kf[i * n + j];
                    if (fabs(acc[j] - r) > 1e-6 * (1 + nt))
                        FAIL_AT("%s accum n %d nt %d [%d]: %.8f vs %.8f", names[ki], n, nt, j,
                                acc[j], r);
                }
                for (int j = n; j < MAX_DH; j++) /* nothing past the row is written */
                    if (acc[j] != acc0[j])
                        FAIL_AT("%s accum n %d wrote past the row at %d", names[ki], n, j);
            }
        }
    }
}

/* The score of one key as the vector kernels compute it, step for step in
 * scalar floats: lane l of L (8 for AVX2, 16 for AVX-512) chains the FMAs of
 * values l, l + L, l + 2L, ... (a masked tail adds 0 * 0); 16 lanes fold
 * lane l + 8 onto lane l; the eight lanes are summed
 * ((l0+l1)+(l2+l3)) + ((l4+l5)+(l6+l7)); the sum is scaled. */
static float score_model(const float *q, const float *k, int n, float scale, int L)
{
    float a[16] = {0};
    for (int j = 0; j < n; j += L)
        for (int l = 0; l < L; l++)
            a[l] = j + l < n ? fmaf(q[j + l], k[j + l], a[l]) : fmaf(0.0f, 0.0f, a[l]);
    float p[8];
    for (int l = 0; l < 8; l++)
        p[l] = L == 16 ? a[l] + a[l + 8] : a[l];
    return (((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]))) * scale;
}

/* The AVX2 and AVX-512 score kernels against that model, bit for bit, on
 * values whose exponents spread over 2^-20..2^20 (so that any other order of
 * the additions rounds differently somewhere): a change to the reduction's
 * shuffles that pairs other lanes shows here even where the double loop's
 * tolerance would let it through. */
TEST(vector_scores_take_the_exact_steps_of_the_scalar_model)
{
    struct attn_kernels kr[4];
    const char *names[4];
    const int nks = kernel_sets(kr, names);
    static float q[MAX_DH], kf[40 * MAX_DH], z[40];
    uint64_t s = 7;
    const int dims[] = {1, 7, 8, 9, 16, 20, 24, 63, 64, 65, 72, 128, 200, 256};
    int checked = 0;
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
        const int n = dims[di];
        for (int nt = 1; nt <= 40; nt += 3) {
            for (int i = 0; i < n; i++)
                q[i] = ldexpf(test_rng_sym(&s), (int)(test_rng_unit(&s) * 40) - 20);
            for (int i = 0; i < nt * n; i++)
                kf[i] = ldexpf(test_rng_sym(&s), (int)(test_rng_unit(&s) * 40) - 20);
            for (int ki = 0; ki < nks; ki++) {
                const int L = !strcmp(names[ki], "avx2")         ? 8
                              : !strncmp(names[ki], "avx512", 6) ? 16
                                                                 : 0;
                if (!L)
                    continue;
                kr[ki].scores(z, q, kf, nt, n, 0.125f);
                for (int i = 0; i < nt; i++) {
                    const float want = score_model(q, kf + (size_t)i * n, n, 0.125f, L);
                    if (memcmp(&z[i], &want, sizeof want))
                        FAIL_AT("%s scores n %d nt %d key %d: %.9g, the model %.9g", names[ki], n,
                                nt, i, z[i], want);
                    checked++;
                }
            }
        }
    }
    if (cpu_isa_best() >= CPU_ISA_AVX2 && checked == 0)
        FAIL_AT("%s", "no vector kernel set was checked");
}

/* The in-place kernels (scores_kv, accum_kv: several rows at once, f16 or
 * q8_0 K/V rows read where they lie, addressed one by one and scattered
 * here), on odd shapes and row counts: each row against a double loop, and
 * bit for bit equal to scores / accum of the same kernel set on the rows
 * converted to f32 by its to_f32 (the backend mixes the two paths and
 * relies on that). to_f32 itself must give what quant.c's scalar
 * dequantizer gives. */
TEST(in_place_row_kernels_match_double_loops_and_the_f32_kernels_bit_for_bit)
{
    struct attn_kernels kr[4];
    const char *names[4];
    const int nks = kernel_sets(kr, names);
    enum { NT = 40, NR = 7, GAP = 6 };
    static float q[NR][MAX_DH], kf[NT * MAX_DH], vf[NT * MAX_DH], w[NR][NT], z[NR][NT];
    static float acc[NR][MAX_DH], acc0[NR][MAX_DH], zf[NT], accf[MAX_DH], row[MAX_DH];
    static float kref[NT * MAX_DH], vref[NT * MAX_DH];
    uint64_t s = 4242;
    int tested = 0;
    const int dims[] = {1, 15, 16, 20, 32, 64, 65, 96, 100, 160, 256};
    for (int fmt = ATTN_F16; fmt <= ATTN_Q8_0; fmt++) {
        for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
            const int n = dims[di];
            if (fmt == ATTN_Q8_0 && n % 32 != 0)
                continue;
            const size_t rb = attn_row_bytes(fmt, n), stride = rb + GAP; /* not back to back */
            for (int nt = 1; nt <= NT; nt += (nt < 9 ? 1 : 7)) {
                /* the row at the highest address ends the allocation: a read
                 * past a row is a heap overflow under ASan */
                const size_t bytes = (size_t)(nt - 1) * stride + rb;
                uint8_t *kmem = malloc(bytes), *vmem = malloc(bytes);
                ASSERT(kmem && vmem);
                for (int nr = 1; nr <= NR; nr++) {
                    const float *qp[NR];
                    float *ap[NR];
                    const void *kp[NT], *vp[NT];
                    for (int r = 0; r < nr; r++) {
                        for (int j = 0; j < n; j++)
                            q[r][j] = test_rng_sym(&s);
                        for (int i = 0; i < nt; i++)
                            w[r][i] = (float)test_rng_unit(&s);
                        for (int j = 0; j < MAX_DH; j++)
                            acc0[r][j] = test_rng_sym(&s);
                        qp[r] = q[r];
                        ap[r] = acc[r];
                    }
                    for (int i = 0; i < nt; i++) { /* keys in reverse order in memory */
                        uint8_t *kb = kmem + (size_t)(nt - 1 - i) * stride;
                        uint8_t *vb = vmem + (size_t)(nt - 1 - i) * stride;
                        kp[i] = kb;
                        vp[i] = vb;
                        const float ks = fmt == ATTN_Q8_0 ? 4.0f : 1.0f; /* various scales */
                        for (int j = 0; j < n; j++)
                            row[j] = test_rng_sym(&s) * ks * (float)(1 + j % 3);
                        quant_quantize_row(fmt == ATTN_Q8_0 ? QTYPE_Q8_0 : QTYPE_F16, row, kb, n);
                        quant_dequant_row(fmt == ATTN_Q8_0 ? QTYPE_Q8_0 : QTYPE_F16, kb,
                                          kref + i * n, n);
                        for (int j = 0; j < n; j++)
                            row[j] = test_rng_sym(&s);
                        quant_quantize_row(fmt == ATTN_Q8_0 ? QTYPE_Q8_0 : QTYPE_F16, row, vb, n);
                        quant_dequant_row(fmt == ATTN_Q8_0 ? QTYPE_Q8_0 : QTYPE_F16, vb,
                                          vref + i * n, n);
                    }
                    for (int ki = 0; ki < nks; ki++) {
                        for (int i = 0; i < nt; i++) { /* this set's conversion */
                            kr[ki].to_f32(kf + i * n, kp[i], 1, n, fmt);
                            kr[ki].to_f32(vf + i * n, vp[i], 1, n, fmt);
                        }
                        if (memcmp(kf, kref, (size_t)(nt * n) * sizeof(float)) ||
                            memcmp(vf, vref, (size_t)(nt * n) * sizeof(float)))
                            FAIL_AT("%s to_f32 fmt %d n %d: not the scalar dequantizer's values",
                                    names[ki], fmt, n);
                        if (!kr[ki].scores_kv)
                            continue;
                        tested++;
                        float mx[NR];
                        kr[ki].scores_kv(&z[0][0], NT, nr, qp, kp, nt, n, 0.125f, mx, fmt);
                        memcpy(acc, acc0, sizeof acc);
                        kr[ki].accum_kv(ap, nr, &w[0][0], NT, vp, nt, n, fmt);
                        for (int r = 0; r < nr; r++) {
                            float fm = kr[ki].scores(zf, q[r], kf, nt, n, 0.125f);
                            if (memcmp(zf, z[r], (size_t)nt * sizeof(float)) || fm != mx[r])
                                FAIL_AT("%s scores_kv fmt %d n %d nt %d nr %d row %d: not the "
                                        "f32 kernel's bits",
                                        names[ki], fmt, n, nt, nr, r);
                            memcpy(accf, acc0[r], sizeof accf);
                            kr[ki].accum(accf, w[r], vf, nt, n);
                            if (memcmp(accf, acc[r], sizeof accf))
                                FAIL_AT("%s accum_kv fmt %d n %d nt %d nr %d row %d: not the f32 "
                                        "kernel's bits (or wrote past the row)",
                                        names[ki], fmt, n, nt, nr, r);
                            for (int i = 0; i < nt; i++) {
                                double ref = 0, mag = 0;
                                for (int j = 0; j < n; j++) {
                                    ref += (double)q[r][j] * kref[i * n + j];
                                    mag += fabs((double)q[r][j] * kref[i * n + j]);
                                }
                                ref *= 0.125;
                                if (fabs(z[r][i] - ref) > 1e-6 * (1 + mag))
                                    FAIL_AT("%s scores_kv fmt %d n %d row %d key %d: %.8f vs "
                                            "%.8f",
                                            names[ki], fmt, n, r, i, z[r][i], ref);
                            }
                            for (int j = 0; j < n; j++) {
                                double ref = acc0[r][j];
                                for (int i = 0; i < nt; i++)
                                    ref += (double)w[r][i] * vref[i * n + j];
                                if (fabs(acc[r][j] - ref) > 1e-6 * (1 + nt))
                                    FAIL_AT("%s accum_kv fmt %d n %d row %d [%d]: %.8f vs %.8f",
                                            names[ki], fmt, n, r, j, acc[r][j], ref);
                            }
                        }
                    }
                }
                free(kmem);
                free(vmem);
            }
        }
    }
    if (!tested)
        TEST_SKIP("no kernel set on this CPU has the in-place row kernels");
}

/* The block kernels against scores_kv, bit for bit: keys transposed in
 * chunks of 8 (a short last chunk), any number of rows, head dims that are
 * multiples of 16, keys in reverse order in memory and not back to back,
 * zeros of both signs, a subnormal and an infinity among the keys, nothing
 * written past the chunks or the rows; and max_kv against scores_kv's largest
 * score for every tile length. */
TEST(block_scores_are_scores_kv_bit_for_bit)
{
    struct attn_kernels kr;
    if (cpu_isa_best() < CPU_ISA_AVX2) {
        fprintf(stderr, "  no AVX2: the block kernels are not used here\n");
        return;
    }
    cpu_attention_kernels(&kr, 1);
    ASSERT(kr.keys_t && kr.scores_t && kr.max_kv);
    enum { NK = 41, NR = 8, GAP = 6, ZS = 48 };
    static float q[NR][MAX_DH], z[NR][ZS], zb[NR][ZS], row[MAX_DH];
    static uint16_t kt[ZS * 128];
    uint64_t s = 777;
    int tested = 0;
    const int dims[] = {16, 32, 48, 64, 128};
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
        const int n = dims[di];
        const size_t rb = attn_row_bytes(ATTN_F16, n), stride = rb + GAP;
        for (int nk = 1; nk <= NK; nk += (nk < 17 ? 1 : 6)) {
            const size_t bytes = (size_t)(nk - 1) * stride + rb;
            uint8_t *kmem = malloc(bytes);
            ASSERT(kmem);
            const void *kp[NK];
            for (int i = 0; i < nk; i++) {
                kp[i] = kmem + (size_t)(nk - 1 - i) * stride;
                for (int j = 0; j < n; j++)
                    row[j] = test_rng_sym(&s) * (float)(1 + j % 5);
                if (i == 3)
                    row[n - 1] = -0.0f; /* zeros of both signs */
                if (i == 5)
                    for (int j = 0; j < n; j++)
                        row[j] = 0.0f;
                if (i == 7)
                    row[1] = 3e-7f; /* an f16 subnormal */
                if (i == 9)
                    row[2] = INFINITY; /* scores of +-inf or NaN: the same bits too */
                quant_quantize_row(QTYPE_F16, row, (void *)kp[i], n);
            }
            const int nc = (nk + 7) / 8;
            memset(kt, 0xA5, sizeof kt);
            kr.keys_t(kt, kp, nk, n);
            for (size_t i = (size_t)nc * 8 * (size_t)n; i < sizeof kt / sizeof kt[0]; i++)
                ASSERT(kt[i] == 0xA5A5); /* nothing past the last chunk */
            for (int nr = 1; nr <= NR; nr++) {
                const float *qp[NR];
                float mx[NR], mb[NR];
                for (int r = 0; r < nr; r++) {
                    for (int j = 0; j < n; j++)
                        q[r][j] = test_rng_sym(&s) * 2.0f;
                    qp[r] = q[r];
                }
                memset(z, 0, sizeof z);
                memset(zb, 0xFF, sizeof zb); /* NaN: a score not written shows */
                kr.scores_kv(&z[0][0], ZS, nr, qp, kp, nk, n, 0.125f, mx, ATTN_F16);
                kr.scores_t(&zb[0][0], ZS, nr, qp, kt, nc, n, 0.125f);
                for (int r = 0; r < NR; r++) /* nothing past a row's chunks, or after the rows */
                    for (int i = r < nr ? nc * 8 : 0; i < ZS; i++)
                        ASSERT(((const uint32_t *)zb[r])[i] == 0xFFFFFFFFu);
                for (int r = 0; r < nr; r++) {
                    if (memcmp(z[r], zb[r], (size_t)nk * sizeof(float)) != 0) {
                        for (int i = 0; i < nk; i++)
                            if (memcmp(&z[r][i], &zb[r][i], sizeof(float)) != 0)
                                fprintf(stderr,
                                        "  dh %d keys %d rows %d: row %d key %d: %.9g vs %.9g\n", n,
                                        nk, nr, r, i, zb[r][i], z[r][i]);
                        ASSERT(0);
                    }
                    for (int i = nk; i < nc * 8; i++) /* a short chunk's repeats */
                        ASSERT(memcmp(&zb[r][i], &z[r][nk - 1], sizeof(float)) == 0);
                }
                /* the largest of every prefix, as scores_kv finds it */
                for (int nt = 1; nt <= nk; nt++) {
                    kr.scores_kv(&z[0][0], ZS, nr, qp, kp, nt, n, 0.125f, mx, ATTN_F16);
                    kr.max_kv(mb, &zb[0][0], ZS, nr, nt);
                    ASSERT(memcmp(mx, mb, (size_t)nr * sizeof(float)) == 0);
                }
                tested++;
            }
            free(kmem);
        }
    }
    fprintf(stderr, "  %d shapes, every score the same bits\n", tested);
}

/* The exponentials of several rows in one call are each row's exp_sub, bit
 * for bit (values and sum), for 1-9 rows of 1-40 scores, with scores far
 * below the max (e^x flushed to 0 under -87) and -inf (a short tile's
 * padding); nothing past a row's n scores is written. */
TEST(exp_sub_of_several_rows_is_each_rows_exp_sub_bit_for_bit)
{
    struct attn_kernels kr[4];
    const char *names[4];
    const int nks = kernel_sets(kr, names);
    enum { MR = 9, NT = 40, ST = 48 };
    static float z[MR * ST], w[MR * ST], w1[NT];
    float m[MR], sum[MR];
    uint64_t s = 7;
    int checked = 0;
    for (int ki = 0; ki < nks; ki++) {
        if (!kr[ki].exp_sub_rows)
            continue;
        for (int nr = 1; nr <= MR; nr++) {
            for (int nt = 1; nt <= NT; nt++) {
                for (int r = 0; r < nr; r++) {
                    m[r] = 4.0f * test_rng_sym(&s);
                    for (int i = 0; i < nt; i++) {
                        const float u = (float)test_rng_unit(&s);
                        z[r * ST + i] = u < 0.05f   ? -INFINITY
                                        : u < 0.15f ? m[r] - 90.0f - 20.0f * u
                                                    : m[r] - 30.0f * u;
                    }
                    z[r * ST + (int)(test_rng_unit(&s) * nt)] = m[r]; /* the max is a score */
                }
                for (int i = 0; i < MR * ST; i++)
                    w[i] = 12345.0f;
                kr[ki].exp_sub_rows(w, ST, z, ST, nr, m, nt, sum);
                for (int r = 0; r < nr; r++) {
                    const float s1 = kr[ki].exp_sub(w1, z + r * ST, m[r], nt);
                    if (memcmp(&s1, &sum[r], sizeof s1) != 0)
                        FAIL_AT("%s exp_sub_rows nr %d nt %d row %d: sum %.9g, exp_sub's %.9g",
                                names[ki], nr, nt, r, sum[r], s1);
                    if (memcmp(w1, w + r * ST, (size_t)nt * sizeof(float)) != 0)
                        FAIL_AT("%s exp_sub_rows nr %d nt %d row %d: not exp_sub's values",
                                names[ki], nr, nt, r);
                    for (int i = nt; i < ST; i++)
                        if (w[r * ST + i] != 12345.0f)
                            FAIL_AT("%s exp_sub_rows nr %d nt %d row %d wrote [%d]", names[ki], nr,
                                    nt, r, i);
                }
                checked++;
            }
        }
    }
    if (cpu_isa_best() >= CPU_ISA_AVX2 && checked == 0)
        FAIL_AT("%s", "no kernel set with exp_sub_rows was checked");
}

/* The vector kernels' exponentials are one another's bits: the AVX2 kernel
 * builds 2^k as one factor, the AVX-512 one (cpu_exp512, here also under
 * SIMDe) as two, which must round alike, for x from 0 down to -90 (every k
 * of the range, and the flush to 0 under -87). */
TEST(vector_exponentials_are_the_same_bits_at_every_level)
{
    struct attn_kernels kr[4];
    const char *names[4];
    const int nks = kernel_sets(kr, names);
    uint64_t s = 11;
    int avx2 = -1;
    for (int ki = 0; ki < nks; ki++)
        if (strcmp(names[ki], "avx2") == 0)
            avx2 = ki;
    for (int ki = 0; ki < nks && avx2 >= 0; ki++) {
        if (strncmp(names[ki], "avx512", 6) != 0)
            continue;
        for (int i = 0; i < 4096; i++) {
            const float zi = -90.0f * (float)test_rng_unit(&s);
            float ea, eb;
            kr[avx2].exp_sub(&ea, &zi, 0.0f, 1);
            kr[ki].exp_sub(&eb, &zi, 0.0f, 1);
            if (memcmp(&ea, &eb, sizeof ea) != 0)
                FAIL_AT("%s exp_sub e^%.9g: %.9g, the AVX2 kernel's %.9g", names[ki], zi, eb, ea);
        }
    }
}

/* The row kernels the probe path uses (dot, axpy) read q8_0 rows as the
 * scalar dequantizer does, and a row quantized from NaN or infinite values
 * reads back as NaN (never an undefined cast in the quantizer). */
TEST(q8_0_rows_through_dot_and_axpy_and_non_finite_input)
{
    struct attn_kernels kr[4];
    const char *names[4];
    const int nks = kernel_sets(kr, names);
    float x[64], deq[64], q[64], acc[64];
    struct block_q8_0 b[2];
    uint64_t s = 7;
    for (int j = 0; j < 64; j++) {
        x[j] = test_rng_sym(&s) * 3.0f;
        q[j] = test_rng_sym(&s);
    }
    quant_quantize_row(QTYPE_Q8_0, x, b, 64);
    quant_dequant_row(QTYPE_Q8_0, b, deq, 64);
    /* the quantization itself: within half a step d = amax / 127 <= 3 / 127,
     * plus 127 times the f16 rounding of d (2^-11 relative) */
    const float tol = (0.5f + 127.0f / 2048.0f) * 3.0f / 127.0f;
    for (int j = 0; j < 64; j++)
        if (!(fabsf(deq[j] - x[j]) <= tol))
            FAIL_AT("q8_0 value %d: %.6f stored as %.6f", j, x[j], deq[j]);
    for (int ki = 0; ki < nks; ki++) {
        double want = 0;
        for (int j = 0; j < 64; j++)
            want += (double)q[j] * deq[j];
        float got = kr[ki].dot(q, b, 64, ATTN_Q8_0);
        if (fabs(got - want) > 1e-5)
            FAIL_AT("%s dot q8_0: %.8f vs %.8f", names[ki], got, want);
        memset(acc, 0, sizeof acc);
        kr[ki].axpy(acc, 0.5f, b, 64, ATTN_Q8_0);
        for (int j = 0; j < 64; j++)
            if (acc[j] != 0.5f * deq[j])
                FAIL_AT("%s axpy q8_0 [%d]: %.8f vs %.8f", names[ki], j, acc[j], 0.5f * deq[j]);
    }
    x[3] = NAN;
    x[40] = INFINITY;
    quant_quantize_row(QTYPE_Q8_0, x, b, 64);
    quant_dequant_row(QTYPE_Q8_0, b, deq, 64);
    if (!isnan(deq[40]) || !isnan(deq[33]))
        FAIL_AT("a block with an infinity reads back as %.3f, %.3f (want NaN)", deq[40], deq[33]);
    for (int j = 0; j < 32; j++) /* the NaN's own block: its finite values survive, the NaN
                                  * reads as 0 (f16 would keep it) */
        if (j != 3 && !(fabsf(deq[j] - x[j]) <= tol))
            FAIL_AT("q8_0 value %d next to a NaN: %.6f stored as %.6f", j, x[j], deq[j]);
}

/* The next task's rows asked for in doses (struct attn_ahead): every line of
 * K of visit indices [v0, v1) once, run by run (sinks, then a window that
 * wraps), whatever the doses, and none past the keys there are. */
TEST(rows_loaded_ahead_in_doses_cover_each_line_once)
{
    struct attn_keys k = {0};
    static char kbuf[1 << 16], vbuf[1 << 16];
    k.k = kbuf;
    k.v = vbuf;
    k.head_dim = 64;
    const int fmts[] = {ATTN_F16, ATTN_F32, ATTN_Q8_0};
    const int64_t runs[][3] = {{4, 50, 30}, {0, 81, 0}, {3, 1, 77}};
    const int64_t ranges[][2] = {{0, 84}, {2, 70}, {50, 200}, {80, 81}, {5, 5}};
    for (size_t fi = 0; fi < sizeof fmts / sizeof fmts[0]; fi++)
        for (size_t ri = 0; ri < sizeof runs / sizeof runs[0]; ri++)
            for (size_t gi = 0; gi < sizeof ranges / sizeof ranges[0]; gi++) {
                k.fmt = fmts[fi];
                int64_t start = 0;
                for (int r = 0; r < 3; r++) { /* runs in separate places, as a ring's */
                    k.run_start[r] = 100 * r + 7;
                    k.run_len[r] = runs[ri][r];
                }
                const size_t rb = attn_row_bytes(k.fmt, k.head_dim);
                const int64_t n = runs[ri][0] + runs[ri][1] + runs[ri][2];
                const int64_t v0 = ranges[gi][0], v1 = ranges[gi][1] < n ? ranges[gi][1] : n;
                /* the lines each run's part of [v0, v1) spans, run by run */
                int64_t want = 0;
                for (int r = 0; r < 3; r++) {
                    const int64_t lo = v0 > start ? v0 : start;
                    const int64_t hi = v1 < start + k.run_len[r] ? v1 : start + k.run_len[r];
                    if (hi > lo)
                        want += (int64_t)(((size_t)(hi - lo) * rb + 63) / 64);
                    start += k.run_len[r];
                }
                for (int dose = 1; dose <= 65; dose += 16) {
                    struct attn_ahead a;
                    cpu_attention_ahead_init(&a, &k, v0, ranges[gi][1]);
                    int64_t got = 0, d;
                    while ((d = cpu_attention_ahead_issue(&a, dose)) > 0) {
                        if (d > dose)
                            FAIL_AT("a dose of %d asked for %lld lines", dose, (long long)d);
                        got += d;
                    }
                    got += cpu_attention_ahead_issue(&a, -1);
                    if (got != want || a.v < v1)
                        FAIL_AT("fmt %d runs %zu range %zu dose %d: %lld lines (want %lld), at "
                                "visit index %lld of %lld",
                                k.fmt, ri, gi, dose, (long long)got, (long long)want,
                                (long long)a.v, (long long)v1);
                }
            }
    ASSERT(cpu_attention_ahead_issue(NULL, -1) == 0);
}

TEST_MAIN()
