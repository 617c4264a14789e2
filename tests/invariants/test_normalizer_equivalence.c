/*
 * test_normalizer_equivalence.c: DESIGN.md invariant 1,
 *     softmax1 == sink(s = 0) == vanilla attention with one extra key whose
 *     logit is s and whose value is zero,
 * and softpick == its formula, first at the op level (cpu_attention_row, f32
 * and f16 keys, scalar and AVX2 row kernels) against naive loops written
 * here, then at the model level on the tiny random model (tests/support/tiny_model.h).
 *
 * The extra key is built from the query: q[0] = 1 and k = (s / scale) e_0,
 * so q.k * scale is exactly s (scale = 1/sqrt(Dh) is a power of two for
 * Dh = 16 and 64, and s / scale is exact in f16 for the s used here).
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
#include "support/tiny_model.h"

#define N_KEYS 100
#define MAX_DH 64
#define SOFTPICK_EPS 1e-6 /* DESIGN.md's eps */

/*
 * Tolerances (op level). Outputs are convex combinations (or, for softpick,
 * sub-convex) of values ~N(0, 1), so |out| < 4.
 * - Sink term versus the same virtual key placed first among the keys: the
 *   online pass then does the very same float operations (m = s, l = 1, a
 *   zero axpy), so the results are identical: tolerance 0.
 * - Virtual key placed last, and the naive loops: the online pass rescales
 *   (acc, l) whenever the max moves and sums 100 terms in f32; each step
 *   rounds by 2^-24 relative, so the error is bounded by ~100 * 6e-8 * 4 =
 *   2.4e-5 and is ~1e-6 in practice (measured: see the printed figures).
 *   OP_TOL = 1e-5: 10x above typical, still four orders below what a wrong
 *   weight (one key's share ~1e-2 and up) would cause.
 */
#define OP_TOL 1e-5

/* Model level: the same weights and tokens through two normalizers whose
 * attention is, by construction, the same float operations (see above):
 * identical logits expected. MODEL_TOL = 0. */
#define MODEL_TOL 0.0

struct op_case {
    int dh;
    int f16;
    float q[MAX_DH];
    float kf[(N_KEYS + 1) * MAX_DH]; /* cell 0: the virtual key; 1..N: real keys (f32 values) */
    float vf[(N_KEYS + 1) * MAX_DH];
    uint16_t kh[(N_KEYS + 1) * MAX_DH];
    uint16_t vh[(N_KEYS + 1) * MAX_DH];
};

/* Random keys/values; the values actually stored (after f16 rounding) are
 * written back to kf/vf so the naive loops see what the kernel sees. */
static void op_case_fill(struct op_case *c, int dh, int f16, uint64_t seed)
{
    memset(c, 0, sizeof *c);
    c->dh = dh;
    c->f16 = f16;
    /* q ~ N(0, 9): scores q.k/sqrt(Dh) have std ~3, so softmax is peaked */
    for (int i = 0; i < dh; i++)
        c->q[i] = (float)(3.0 * test_rng_normal(&seed));
    c->q[0] = 1.0f;
    for (int j = 1; j <= N_KEYS; j++)
        for (int i = 0; i < dh; i++) {
            c->kf[j * dh + i] = (float)test_rng_normal(&seed);
            c->vf[j * dh + i] = (float)test_rng_normal(&seed);
        }
    for (int j = 0; j < (N_KEYS + 1) * dh; j++) {
        c->kh[j] = quant_f32_to_f16(c->kf[j]);
        c->vh[j] = quant_f32_to_f16(c->vf[j]);
        if (f16) {
            c->kf[j] = quant_f16_to_f32(c->kh[j]);
            c->vf[j] = quant_f16_to_f32(c->vh[j]);
        }
    }
}

/* Cell 0 becomes the virtual key with logit exactly s and a zero value. */
static void op_case_set_virtual(struct op_case *c, float s)
{
    float scale = 1.0f / sqrtf((float)c->dh);
    for (int i = 0; i < c->dh; i++) {
        c->kf[i] = 0;
        c->vf[i] = 0;
    }
    c->kf[0] = s / scale;
    for (int i = 0; i < c->dh; i++) {
        c->kh[i] = quant_f32_to_f16(c->kf[i]);
        c->vh[i] = quant_f32_to_f16(c->vf[i]);
    }
}

/* Runs the op over cells given as up to three runs. */
static void op_run(const struct attn_kernels *kr, const struct op_case *c, const int64_t *start,
                   const int64_t *len, int n_runs, enum model_normalizer norm, float sink,
                   float *out)
{
    struct attn_keys keys = {
        .k = c->f16 ? (const void *)c->kh : (const void *)c->kf,
        .v = c->f16 ? (const void *)c->vh : (const void *)c->vf,
        .fmt = c->f16 ? ATTN_F16 : ATTN_F32,
        .head_dim = c->dh,
    };
    for (int r = 0; r < n_runs; r++) {
        keys.run_start[r] = start[r];
        keys.run_len[r] = len[r];
    }
    cpu_attention_row(kr, c->q, c->q, &keys, 1.0f / sqrtf((float)c->dh), norm, sink, NULL, out);
}

/* Scores in double of the first nk real keys (cells 1..nk), as the naive
 * loops use them. */
static void naive_scores(const struct op_case *c, int nk, double *z)
{
    double scale = 1.0 / sqrt((double)c->dh);
    for (int j = 1; j <= nk; j++) {
        double d = 0;
        for (int i = 0; i < c->dh; i++)
            d += (double)c->q[i] * (double)c->kf[j * c->dh + i];
        z[j - 1] = d * scale;
    }
}

/* Two-pass softmax over the first nk real keys plus a sink term s with value
 * sv (NULL: zero; s = -inf: vanilla; no keys and no sink term: zeros). */
static void naive_sink_nv(const struct op_case *c, int nk, double s, const float *sv, double *out)
{
    double z[N_KEYS], m = s, den;
    naive_scores(c, nk, z);
    for (int j = 0; j < nk; j++)
        if (z[j] > m)
            m = z[j];
    den = isinf(s) ? 0.0 : exp(s - m);
    for (int j = 0; j < nk; j++)
        den += exp(z[j] - m);
    for (int i = 0; i < c->dh; i++) {
        double a = sv && !isinf(s) ? exp(s - m) * (double)sv[i] : 0.0;
        for (int j = 0; j < nk; j++)
            a += exp(z[j] - m) * (double)c->vf[(j + 1) * c->dh + i];
        out[i] = den > 0 ? a / den : 0.0;
    }
}

static void naive_sink_n(const struct op_case *c, int nk, double s, double *out)
{
    naive_sink_nv(c, nk, s, NULL, out);
}

static void naive_sink(const struct op_case *c, double s, double *out)
{
    naive_sink_n(c, N_KEYS, s, out);
}

/* DESIGN.md: relu(e^{z_i-m} - e^{-m}) / (sum_j |e^{z_j-m} - e^{-m}| + eps),
 * m = max_j z_j, over the first nk real keys. */
static void naive_softpick_n(const struct op_case *c, int nk, double *out)
{
    double z[N_KEYS], m = -INFINITY, den = 0;
    naive_scores(c, nk, z);
    for (int j = 0; j < nk; j++)
        if (z[j] > m)
            m = z[j];
    for (int j = 0; j < nk; j++)
        den += fabs(exp(z[j] - m) - exp(-m));
    den += SOFTPICK_EPS;
    for (int i = 0; i < c->dh; i++) {
        double a = 0;
        for (int j = 0; j < nk; j++) {
            double num = exp(z[j] - m) - exp(-m);
            if (num > 0)
                a += num * (double)c->vf[(j + 1) * c->dh + i];
        }
        out[i] = a / den;
    }
}

static void naive_softpick(const struct op_case *c, double *out)
{
    naive_softpick_n(c, N_KEYS, out);
}

static double diff_f(const float *a, const float *b, int n)
{
    double d = 0;
    for (int i = 0; i < n; i++) {
        double e = fabs((double)a[i] - (double)b[i]);
        if (isnan(e))
            return INFINITY;
        if (e > d)
            d = e;
    }
    return d;
}

static double diff_d(const float *a, const double *b, int n)
{
    double d = 0;
    for (int i = 0; i < n; i++) {
        double e = fabs((double)a[i] - b[i]);
        if (isnan(e))
            return INFINITY;
        if (e > d)
            d = e;
    }
    return d;
}

/* The kernel sets to test: scalar always, AVX2 when the CPU has it. */
static int kernel_sets(struct attn_kernels *k, const char **names)
{
    cpu_attention_kernels(&k[0], 0);
    names[0] = "scalar";
    if (cpu_isa_best() >= CPU_ISA_AVX2) {
        cpu_attention_kernels(&k[1], 1);
        names[1] = "avx2";
        return 2;
    }
    return 1;
}

static struct op_case g_case; /* large: keep it off the stack */

TEST(sink_term_equals_vanilla_softmax_with_one_zero_value_key_at_the_op_level)
{
    static const float sinks[] = {-3.0f, -0.5f, 0.0f, 1.25f, 2.5f, 8.0f};
    struct attn_kernels kr[2];
    const char *names[2];
    int nk = kernel_sets(kr, names);
    double worst_first = 0, worst_last = 0, worst_naive = 0;
    for (int ki = 0; ki < nk; ki++)
        for (int f16 = 0; f16 <= 1; f16++)
            for (int dhi = 0; dhi < 2; dhi++) {
                int dh = dhi ? 64 : 16;
                for (size_t si = 0; si < sizeof sinks / sizeof sinks[0]; si++) {
                    struct op_case *c = &g_case;
                    float s = sinks[si];
                    op_case_fill(c, dh, f16, 1000 + si * 7 + (uint64_t)dh + (uint64_t)f16);
                    op_case_set_virtual(c, s);
                    float o_sink[MAX_DH], o_first[MAX_DH], o_last[MAX_DH];
                    double o_naive[MAX_DH];
                    /* sink term over the real keys (cells 1..N) */
                    int64_t st1[] = {1}, ln1[] = {N_KEYS};
                    op_run(&kr[ki], c, st1, ln1, 1, MODEL_NORM_SINK, s, o_sink);
                    /* vanilla over the virtual key first, then the real keys */
                    int64_t st2[] = {0}, ln2[] = {N_KEYS + 1};
                    op_run(&kr[ki], c, st2, ln2, 1, MODEL_NORM_SOFTMAX, 0.0f, o_first);
                    /* vanilla over the real keys, then the virtual key last */
                    int64_t st3[] = {1, 0}, ln3[] = {N_KEYS, 1};
                    op_run(&kr[ki], c, st3, ln3, 2, MODEL_NORM_SOFTMAX, 0.0f, o_last);
                    naive_sink(c, s, o_naive);
                    double d1 = diff_f(o_sink, o_first, dh);
                    double d2 = diff_f(o_sink, o_last, dh);
                    double d3 = diff_d(o_sink, o_naive, dh);
                    if (d1 > worst_first)
                        worst_first = d1;
                    if (d2 > worst_last)
                        worst_last = d2;
                    if (d3 > worst_naive)
                        worst_naive = d3;
                    if (!(d1 <= 0.0) || !(d2 <= OP_TOL) || !(d3 <= OP_TOL)) {
                        fprintf(stderr,
                                "  %s f16=%d Dh=%d s=%g: sink vs virtual-first %.3g, "
                                "vs virtual-last %.3g, vs naive %.3g\n",
                                names[ki], f16, dh, (double)s, d1, d2, d3);
                        for (int i = 0; i < 4; i++)
                            fprintf(stderr,
                                    "    out[%d] sink %.9g first %.9g last %.9g naive %.9g\n", i,
                                    (double)o_sink[i], (double)o_first[i], (double)o_last[i],
                                    o_naive[i]);
                    }
                    ASSERT(d1 <= 0.0);
                    ASSERT(d2 <= OP_TOL);
                    ASSERT(d3 <= OP_TOL);
                }
            }
    printf("  sink(s) vs vanilla+virtual key: first max diff %.3g, last %.3g; vs naive %.3g "
           "(%d kernel sets, f32+f16, Dh 16+64)\n",
           worst_first, worst_last, worst_naive, nk);
}

/*
 * Sink values (gguf-normalizer.md, blk.N.attn_sinks_v): the sink term with
 * logit s and value v_h == vanilla softmax with one extra key of logit s and
 * value v_h, and == the formula (e^s v_h + sum_i e^{z_i} v_i) / (e^s + sum_i
 * e^{z_i}) in double, through the row form and the split form (1..7 spans,
 * including empty ones and no keys at all), scalar and AVX2 kernels, f32 and
 * f16 keys. The virtual key placed first does the same float operations as
 * the sink term (acc starts at v_h with weight 1): tolerance 0, as above.
 * v_h ~ N(0, 4) is stored in f16 precision in cell 0 so that the f16-keys
 * case holds the very same vector; OP_TOL as above. Other normalizers
 * ignore v_h: softmax1 and softpick with and without it are identical.
 */
TEST(sink_values_equal_one_extra_key_with_that_value_and_the_formula)
{
    static const float sinks[] = {-3.0f, 0.0f, 1.25f, 8.0f};
    static const int n_keys[] = {N_KEYS, 3, 1, 0};
    static const int splits[] = {1, 2, 3, 7};
    struct attn_kernels kr[2];
    const char *names[2];
    int nk_sets = kernel_sets(kr, names);
    double worst_first = 0, worst_naive = 0, worst_split = 0;
    for (int ki = 0; ki < nk_sets; ki++)
        for (int f16 = 0; f16 <= 1; f16++)
            for (int dhi = 0; dhi < 2; dhi++)
                for (size_t si = 0; si < sizeof sinks / sizeof sinks[0]; si++) {
                    const int dh = dhi ? 64 : 16;
                    const float s = sinks[si];
                    struct op_case *c = &g_case;
                    uint64_t seed = 4242 + si * 13 + (uint64_t)dh + (uint64_t)f16;
                    op_case_fill(c, dh, f16, seed);
                    op_case_set_virtual(c, s);
                    float sv[MAX_DH];
                    for (int i = 0; i < dh; i++) {
                        uint16_t h = quant_f32_to_f16((float)(2.0 * test_rng_normal(&seed)));
                        sv[i] = quant_f16_to_f32(h);
                        c->vf[i] = sv[i];
                        c->vh[i] = h;
                    }
                    float o_sink[MAX_DH], o_first[MAX_DH];
                    double o_naive[MAX_DH];
                    struct attn_keys keys = {
                        .k = f16 ? (const void *)c->kh : (const void *)c->kf,
                        .v = f16 ? (const void *)c->vh : (const void *)c->vf,
                        .fmt = f16 ? ATTN_F16 : ATTN_F32,
                        .head_dim = dh,
                    };
                    const float scale = 1.0f / sqrtf((float)dh);
                    keys.run_start[0] = 1;
                    keys.run_len[0] = N_KEYS;
                    cpu_attention_row(&kr[ki], c->q, c->q, &keys, scale, MODEL_NORM_SINK, s, sv,
                                      o_sink);
                    keys.run_start[0] = 0;
                    keys.run_len[0] = N_KEYS + 1;
                    cpu_attention_row(&kr[ki], c->q, c->q, &keys, scale, MODEL_NORM_SOFTMAX, 0.0f,
                                      sv /* ignored */, o_first);
                    naive_sink_nv(c, N_KEYS, s, sv, o_naive);
                    double d1 = diff_f(o_sink, o_first, dh), d2 = diff_d(o_sink, o_naive, dh);
                    worst_first = d1 > worst_first ? d1 : worst_first;
                    worst_naive = d2 > worst_naive ? d2 : worst_naive;
                    if (!(d1 <= 0.0) || !(d2 <= OP_TOL))
                        fprintf(stderr,
                                "  %s f16=%d Dh=%d s=%g row: vs key first %.3g, naive %.3g\n",
                                names[ki], f16, dh, (double)s, d1, d2);
                    ASSERT(d1 <= 0.0);
                    ASSERT(d2 <= OP_TOL);
                    /* the split form, over cells 1..nk */
                    for (size_t kn = 0; kn < 4; kn++)
                        for (size_t sp_i = 0; sp_i < 4; sp_i++) {
                            const int nk = n_keys[kn], S = splits[sp_i];
                            float m[8], l[8], acc[8 * MAX_DH], o[MAX_DH];
                            double n[MAX_DH];
                            keys.run_start[0] = 1;
                            keys.run_len[0] = nk;
                            for (int sp = 0; sp < S; sp++)
                                cpu_attention_span(&kr[ki], 1, c->q, c->q, &keys,
                                                   (int64_t)nk * sp / S, (int64_t)nk * (sp + 1) / S,
                                                   scale, 0, &m[sp], &l[sp], acc + sp * MAX_DH);
                            cpu_attention_merge(&kr[ki], S, m, l, acc, MAX_DH, dh, MODEL_NORM_SINK,
                                                s, sv, o);
                            naive_sink_nv(c, nk, s, sv, n);
                            double d = diff_d(o, n, dh);
                            worst_split = d > worst_split ? d : worst_split;
                            if (!(d <= OP_TOL))
                                fprintf(stderr, "  %s f16=%d Dh=%d s=%g keys=%d splits=%d: %.3g\n",
                                        names[ki], f16, dh, (double)s, nk, S, d);
                            ASSERT(d <= OP_TOL);
                        }
                    /* no keys at all: the output is v_h itself */
                    keys.run_len[0] = 0;
                    cpu_attention_row(&kr[ki], c->q, c->q, &keys, scale, MODEL_NORM_SINK, s, sv,
                                      o_sink);
                    for (int i = 0; i < dh; i++)
                        ASSERT(fabs((double)o_sink[i] - (double)sv[i]) <= OP_TOL);
                    /* softmax1 and softpick ignore it */
                    keys.run_len[0] = N_KEYS;
                    static const enum model_normalizer others[] = {MODEL_NORM_SOFTMAX1,
                                                                   MODEL_NORM_SOFTPICK};
                    for (int oi = 0; oi < 2; oi++) {
                        float a[MAX_DH], b[MAX_DH];
                        cpu_attention_row(&kr[ki], c->q, c->q, &keys, scale, others[oi], s, sv, a);
                        cpu_attention_row(&kr[ki], c->q, c->q, &keys, scale, others[oi], s, NULL,
                                          b);
                        ASSERT(diff_f(a, b, dh) <= 0.0);
                    }
                }
    printf("  sink values: vs extra key first %.3g, row vs formula %.3g, spans+merge vs formula "
           "%.3g (%d kernel sets, f32+f16, Dh 16+64)\n",
           worst_first, worst_naive, worst_split, nk_sets);
}

TEST(softmax1_equals_sink_zero_and_vanilla_matches_the_naive_loop)
{
    struct attn_kernels kr[2];
    const char *names[2];
    int nk = kernel_sets(kr, names);
    double worst_s1 = 0, worst_vanilla = 0;
    for (int ki = 0; ki < nk; ki++)
        for (int f16 = 0; f16 <= 1; f16++) {
            struct op_case *c = &g_case;
            op_case_fill(c, 64, f16, 77 + (uint64_t)f16);
            float o1[MAX_DH], o0[MAX_DH], ov[MAX_DH];
            double nv[MAX_DH], n1[MAX_DH];
            int64_t st[] = {1}, ln[] = {N_KEYS};
            op_run(&kr[ki], c, st, ln, 1, MODEL_NORM_SOFTMAX1, 123.0f /* ignored */, o1);
            op_run(&kr[ki], c, st, ln, 1, MODEL_NORM_SINK, 0.0f, o0);
            op_run(&kr[ki], c, st, ln, 1, MODEL_NORM_SOFTMAX, 0.0f, ov);
            naive_sink(c, -INFINITY, nv);
            naive_sink(c, 0.0, n1);
            double d01 = diff_f(o1, o0, 64), dv = diff_d(ov, nv, 64), d1n = diff_d(o1, n1, 64);
            if (d01 > worst_s1)
                worst_s1 = d01;
            if (dv > worst_vanilla)
                worst_vanilla = dv;
            if (d1n > worst_vanilla)
                worst_vanilla = d1n;
            if (!(d01 <= 0.0) || !(dv <= OP_TOL) || !(d1n <= OP_TOL))
                fprintf(stderr,
                        "  %s f16=%d: softmax1 vs sink(0) %.3g, vanilla vs naive %.3g, "
                        "softmax1 vs naive %.3g\n",
                        names[ki], f16, d01, dv, d1n);
            /* the same float operations: identical */
            ASSERT(d01 <= 0.0);
            ASSERT(dv <= OP_TOL);
            ASSERT(d1n <= OP_TOL);
        }
    printf("  softmax1 vs sink(0) max diff %.3g; vanilla/softmax1 vs naive %.3g\n", worst_s1,
           worst_vanilla);
}

TEST(softpick_matches_the_design_formula)
{
    struct attn_kernels kr[2];
    const char *names[2];
    int nk = kernel_sets(kr, names);
    double worst = 0;
    /* shift moves every score: at -4 most of e^{z-m} fall below e^{-m} and get
     * rectified to zero; at +4 m is large and e^{-m} is small */
    static const float shifts[] = {-4.0f, 0.0f, 4.0f};
    for (int ki = 0; ki < nk; ki++)
        for (int f16 = 0; f16 <= 1; f16++)
            for (size_t si = 0; si < sizeof shifts / sizeof shifts[0]; si++) {
                struct op_case *c = &g_case;
                op_case_fill(c, 64, f16, 500 + si + (uint64_t)f16);
                /* q[0] = 1: key element 0 shifts a key's score by k[0] / 8 */
                for (int j = 1; j <= N_KEYS; j++) {
                    c->kf[j * 64] += shifts[si] * 8.0f;
                    c->kh[j * 64] = quant_f32_to_f16(c->kf[j * 64]);
                    if (f16)
                        c->kf[j * 64] = quant_f16_to_f32(c->kh[j * 64]);
                }
                float o[MAX_DH];
                double n[MAX_DH];
                int64_t st[] = {1}, ln[] = {N_KEYS};
                op_run(&kr[ki], c, st, ln, 1, MODEL_NORM_SOFTPICK, 0.0f, o);
                naive_softpick(c, n);
                double d = diff_d(o, n, 64);
                if (d > worst)
                    worst = d;
                if (!(d <= OP_TOL)) {
                    fprintf(stderr, "  %s f16=%d shift %g: softpick vs formula %.3g\n", names[ki],
                            f16, (double)shifts[si], d);
                    for (int i = 0; i < 4; i++)
                        fprintf(stderr, "    out[%d] op %.9g formula %.9g\n", i, (double)o[i],
                                n[i]);
                }
                ASSERT(d <= OP_TOL);
            }
    printf("  softpick vs formula max diff %.3g\n", worst);
}

TEST(a_row_with_no_keys_returns_zeros_for_every_normalizer)
{
    struct attn_kernels kr[2];
    const char *names[2];
    int nk = kernel_sets(kr, names);
    static const enum model_normalizer norms[] = {MODEL_NORM_SOFTMAX, MODEL_NORM_SOFTMAX1,
                                                  MODEL_NORM_SINK, MODEL_NORM_SOFTPICK};
    for (int ki = 0; ki < nk; ki++)
        for (int f16 = 0; f16 <= 1; f16++)
            for (size_t ni = 0; ni < 4; ni++) {
                struct op_case *c = &g_case;
                op_case_fill(c, 16, f16, 9);
                float o[MAX_DH];
                for (int i = 0; i < MAX_DH; i++)
                    o[i] = NAN; /* the op must overwrite every value */
                int64_t st[] = {0}, ln[] = {0};
                /* for sink the whole weight goes to the null (zero-value) key */
                op_run(&kr[ki], c, st, ln, 1, norms[ni], 2.0f, o);
                for (int i = 0; i < 16; i++) {
                    if (o[i] != 0.0f)
                        fprintf(stderr, "  %s f16=%d %s: out[%d] = %g\n", names[ki], f16,
                                model_normalizer_name(norms[ni]), i, (double)o[i]);
                    ASSERT(o[i] == 0.0f);
                }
            }
}

/*
 * The split form the backend runs (flash-decoding): the keys cut into S
 * spans, each span's partial state (m, l, acc) computed without the sink
 * term, then merged with the sink term added exactly once. It must give the
 * same as the naive loops for every normalizer and any cut, including empty
 * spans (S above the number of keys) and no keys at all. Same OP_TOL: only
 * the order of the f32 sums changes.
 */
TEST(split_key_spans_merged_with_the_sink_term_match_the_naive_loops)
{
    struct attn_kernels kr[2];
    const char *names[2];
    int nk_sets = kernel_sets(kr, names);
    static const enum model_normalizer norms[] = {MODEL_NORM_SOFTMAX, MODEL_NORM_SOFTMAX1,
                                                  MODEL_NORM_SINK, MODEL_NORM_SOFTPICK};
    static const int n_keys[] = {N_KEYS, 3, 1, 0};
    static const int splits[] = {1, 2, 3, 7};
    const float sink = 1.25f;
    double worst = 0;
    for (int ki = 0; ki < nk_sets; ki++)
        for (int f16 = 0; f16 <= 1; f16++)
            for (size_t ni = 0; ni < 4; ni++)
                for (size_t kn = 0; kn < 4; kn++)
                    for (size_t si = 0; si < 4; si++) {
                        struct op_case *c = &g_case;
                        const int nk = n_keys[kn], S = splits[si], dh = 64;
                        op_case_fill(c, dh, f16, 321 + (uint64_t)f16);
                        struct attn_keys keys = {
                            .k = f16 ? (const void *)c->kh : (const void *)c->kf,
                            .v = f16 ? (const void *)c->vh : (const void *)c->vf,
                            .fmt = f16 ? ATTN_F16 : ATTN_F32,
                            .head_dim = dh,
                        };
                        /* two runs, so spans also cut across a run boundary */
                        keys.run_start[0] = 1;
                        keys.run_len[0] = nk / 2;
                        keys.run_start[1] = 1 + nk / 2;
                        keys.run_len[1] = nk - nk / 2;
                        float m[8], l[8], acc[8 * MAX_DH], o[MAX_DH];
                        for (int sp = 0; sp < S; sp++)
                            cpu_attention_span(&kr[ki], 1, c->q, c->q, &keys, (int64_t)nk * sp / S,
                                               (int64_t)nk * (sp + 1) / S, 1.0f / 8.0f,
                                               norms[ni] == MODEL_NORM_SOFTPICK, &m[sp], &l[sp],
                                               acc + sp * MAX_DH);
                        cpu_attention_merge(&kr[ki], S, m, l, acc, MAX_DH, dh, norms[ni], sink,
                                            NULL, o);
                        double n[MAX_DH];
                        if (norms[ni] == MODEL_NORM_SOFTPICK)
                            naive_softpick_n(c, nk, n);
                        else
                            naive_sink_n(c, nk,
                                         norms[ni] == MODEL_NORM_SINK       ? sink
                                         : norms[ni] == MODEL_NORM_SOFTMAX1 ? 0.0
                                                                            : -INFINITY,
                                         n);
                        double d = diff_d(o, n, dh);
                        if (d > worst)
                            worst = d;
                        if (!(d <= OP_TOL))
                            fprintf(stderr, "  %s f16=%d %s keys=%d splits=%d: diff %.3g\n",
                                    names[ki], f16, model_normalizer_name(norms[ni]), nk, S, d);
                        ASSERT(d <= OP_TOL);
                    }
    printf("  split spans + merge vs naive: max diff %.3g (4 normalizers, 0..%d keys, 1..7 "
           "spans)\n",
           worst, N_KEYS);
}

/* Keys 1..n_cold score -100 - u (u in [0, 10)): below -88, where e^(-z)
 * overflows a float. The rest keep their random scores (std ~3). */
static void op_case_make_cold(struct op_case *c, int n_cold, uint64_t seed)
{
    const int dh = c->dh;
    const double scale = 1.0 / sqrt((double)dh);
    double qq = 0;
    for (int i = 0; i < dh; i++)
        qq += (double)c->q[i] * c->q[i];
    for (int j = 1; j <= n_cold; j++) {
        double z = -100.0 - 10.0 * test_rng_unit(&seed);
        for (int i = 0; i < dh; i++) {
            c->kf[j * dh + i] = (float)(z / scale * c->q[i] / qq); /* q.k * scale = z */
            c->kh[j * dh + i] = quant_f32_to_f16(c->kf[j * dh + i]);
            if (c->f16)
                c->kf[j * dh + i] = quant_f16_to_f32(c->kh[j * dh + i]);
        }
    }
}

/* Softpick works in the frame of the running max m with weights
 * relu(e^(z-m) - e^(-m)): a span (or the first keys of a row) that only saw
 * scores below -88 would have e^(-m) = inf and merge into inf * 0 = NaN. The
 * frame starts at ATTN_SOFTPICK_M_FLOOR instead; the naive loop in double
 * (frame: the global max) is the reference. */
TEST(softpick_survives_spans_whose_scores_are_all_below_minus_88)
{
    struct attn_kernels kr[2];
    const char *names[2];
    int nk_sets = kernel_sets(kr, names);
    static const int splits[] = {1, 2, 3, 7};
    double worst = 0;
    for (int ki = 0; ki < nk_sets; ki++)
        for (int f16 = 0; f16 <= 1; f16++) {
            struct op_case *c = &g_case;
            const int dh = 64, nk = N_KEYS;
            op_case_fill(c, dh, f16, 555 + (uint64_t)f16);
            op_case_make_cold(c, 60, 99);
            double n[MAX_DH];
            naive_softpick_n(c, nk, n);
            struct attn_keys keys = {
                .k = f16 ? (const void *)c->kh : (const void *)c->kf,
                .v = f16 ? (const void *)c->vh : (const void *)c->vf,
                .fmt = f16 ? ATTN_F16 : ATTN_F32,
                .head_dim = dh,
            };
            keys.run_start[0] = 1;
            keys.run_len[0] = nk;
            float o[MAX_DH];
            /* the row path: its first 60 keys are cold */
            cpu_attention_row(&kr[ki], c->q, c->q, &keys, 1.0f / 8.0f, MODEL_NORM_SOFTPICK, 0, NULL,
                              o);
            double d = diff_d(o, n, dh);
            worst = d > worst ? d : worst;
            if (!(d <= OP_TOL))
                fprintf(stderr, "  %s f16=%d row: diff %.3g\n", names[ki], f16, d);
            ASSERT(d <= OP_TOL);
            for (size_t si = 0; si < 4; si++) {
                const int S = splits[si];
                float m[8], l[8], acc[8 * MAX_DH];
                for (int sp = 0; sp < S; sp++)
                    cpu_attention_span(&kr[ki], 1, c->q, c->q, &keys, (int64_t)nk * sp / S,
                                       (int64_t)nk * (sp + 1) / S, 1.0f / 8.0f, 1, &m[sp], &l[sp],
                                       acc + sp * MAX_DH);
                cpu_attention_merge(&kr[ki], S, m, l, acc, MAX_DH, dh, MODEL_NORM_SOFTPICK, 0, NULL,
                                    o);
                d = diff_d(o, n, dh);
                worst = d > worst ? d : worst;
                if (!(d <= OP_TOL))
                    fprintf(stderr, "  %s f16=%d splits=%d: diff %.3g\n", names[ki], f16, S, d);
                ASSERT(d <= OP_TOL);
            }
        }
    printf("  softpick with 60 of 100 keys scoring below -100: max diff %.3g\n", worst);
}

/*
 * Model level. One stream through the tiny model: window policy, W = 16,
 * 48 tokens in chunks of 8 (so rows see partial and full windows, evicted
 * keys and prefill chunks), f32 KV, logits at every position.
 */
#define M_W 16
#define M_N 48
#define M_CHUNK 8

static int run_model(const struct model *m, const int32_t *toks, float *logits)
{
    struct tiny_rig r;
    struct tiny_rig_config rc = {.policy = {KV_POLICY_WINDOW, 0},
                                 .window = M_W,
                                 .chunk = M_CHUNK,
                                 .dtype = KV_DTYPE_F32,
                                 .n_threads = 2};
    if (tiny_rig_open(&r, m, &rc) < 0)
        return -1;
    int64_t rc2 = tiny_rig_feed(&r, toks, M_N, M_CHUNK, logits);
    tiny_rig_close(&r);
    return rc2 < 0 ? -1 : 0;
}

TEST(model_softmax1_equals_sink_zero_and_sink_minus_inf_equals_softmax)
{
    struct tiny_config cfg = tiny_config_default();
    struct tiny_model tm;
    ASSERT_OK(tiny_model_init(&tm, &cfg));
    const int64_t V = tm.m.hp.n_vocab;
    int32_t toks[M_N];
    tiny_tokens(toks, M_N, V, 3);
    float *a = malloc((size_t)(M_N * V) * sizeof(float));
    float *b = malloc((size_t)(M_N * V) * sizeof(float));
    ASSERT(a && b);
    double mx;

    tm.m.hp.normalizer = MODEL_NORM_SOFTMAX1;
    tiny_model_set_sinks(&tm, 0.0f);
    ASSERT_OK(run_model(&tm.m, toks, a));
    tm.m.hp.normalizer = MODEL_NORM_SINK;
    ASSERT_OK(run_model(&tm.m, toks, b));
    double d_s1 = tiny_max_diff(a, b, M_N * V, &mx);
    printf("  softmax1 vs sink(s_h = 0): max logit diff %.3g (max |logit| %.3g)\n", d_s1, mx);

    tm.m.hp.normalizer = MODEL_NORM_SOFTMAX;
    ASSERT_OK(run_model(&tm.m, toks, a));
    tm.m.hp.normalizer = MODEL_NORM_SINK;
    tiny_model_set_sinks(&tm, -1e30f);
    ASSERT_OK(run_model(&tm.m, toks, b));
    double d_inf = tiny_max_diff(a, b, M_N * V, &mx);
    printf("  softmax vs sink(s_h = -1e30): max logit diff %.3g (max |logit| %.3g)\n", d_inf, mx);

    /* The control: a sink logit that matters must change the logits, or the
     * two checks above prove nothing (a normalizer ignored by the model
     * would pass them). */
    tiny_model_set_sinks(&tm, 2.0f);
    ASSERT_OK(run_model(&tm.m, toks, b));
    double d_ctl = tiny_max_diff(a, b, M_N * V, NULL);
    printf("  control: softmax vs sink(s_h = 2) max logit diff %.3g (must be large)\n", d_ctl);

    tiny_model_free(&tm);
    free(a);
    free(b);
    ASSERT(d_s1 <= MODEL_TOL);
    ASSERT(d_inf <= MODEL_TOL);
    ASSERT(d_ctl > 0.1);
}

TEST_MAIN()
