/*
 * test_shift_invariance.c: DESIGN.md invariant 3, the same window contents
 * give the same logits at absolute offset 0 and 10^9.
 *
 * A sequence that starts at position p0 = 10^9 (kv_seq_init's pos_first)
 * must behave as one that starts at 0: RoPE makes scores depend on position
 * differences only, and the sink + window bookkeeping is relative to p0.
 * Checked on the tiny random model (tests/support/tiny_model.h) with the window and
 * sinks:4 policies, a stream four times longer than the window, in chunks of
 * 5 (prefill rows and evictions inside chunks). Then at the RoPE level: q
 * rotated at p and k at p' give a dot product that depends only on p - p',
 * for p ~ 10^9, which needs the angles in double (DESIGN.md).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/rope.h"
#include "test.h"
#include "support/rng.h"
#include "support/tiny_model.h"

#define OFFSET 1000000000LL /* 10^9 */
#define W 16
#define N_TOK (4 * W + 3)
#define CHUNK 5

/*
 * Model tolerance. The tables cos/sin(p theta) are computed in double and
 * rounded to float: at p ~ 10^9 the rounding errors (2^-24 relative per
 * entry) fall differently than at p ~ 0, so a rotated q or k differs by
 * ~1e-7 relative between the two runs, and a score q.k/sqrt(Dh) of magnitude
 * up to ~30 by ~1e-6 absolute. Through the peaked softmax and two layers that
 * gives ~1e-5 on logits of magnitude ~30 (measured: see the printed figure).
 * SHIFT_TOL = 2e-4: an order above that, and three below what float32 angles
 * would cause (whole radians at 10^9) or what one wrong position does.
 */
#define SHIFT_TOL 2e-4

static int run(const struct model *m, struct kv_policy pol, int64_t p0, const int32_t *toks,
               float *logits)
{
    struct tiny_rig r;
    struct tiny_rig_config rc = {.policy = pol,
                                 .window = W,
                                 .chunk = CHUNK,
                                 .pos_first = p0,
                                 .dtype = KV_DTYPE_F32,
                                 .n_threads = 1};
    if (tiny_rig_open(&r, m, &rc) < 0)
        return -1;
    int64_t rv = tiny_rig_feed(&r, toks, N_TOK, CHUNK, logits);
    if (rv == 0 && r.seq.pos_next != p0 + N_TOK)
        rv = -1;
    tiny_rig_close(&r);
    return rv < 0 ? -1 : 0;
}

static void shift_case(struct kv_policy pol, const char *name, int *failed)
{
    struct tiny_config cfg = tiny_config_default();
    struct tiny_model tm;
    ASSERT_OK(tiny_model_init(&tm, &cfg));
    const int64_t V = tm.m.hp.n_vocab;
    int32_t toks[N_TOK];
    tiny_tokens(toks, N_TOK, V, 11);
    float *a = malloc((size_t)(N_TOK * V) * sizeof(float));
    float *b = malloc((size_t)(N_TOK * V) * sizeof(float));
    ASSERT(a && b);
    int ok = run(&tm.m, pol, 0, toks, a) == 0 && run(&tm.m, pol, OFFSET, toks, b) == 0;
    double mx = 0, worst = ok ? tiny_max_diff(a, b, N_TOK * V, &mx) : INFINITY;
    int64_t worst_pos = -1;
    for (int64_t p = 0; ok && p < N_TOK; p++)
        if (tiny_max_diff(a + p * V, b + p * V, V, NULL) == worst)
            worst_pos = p;
    printf("  %s, W=%d, %d tokens, offset 0 vs 10^9: max logit diff %.3g at token %lld "
           "(max |logit| %.3g)\n",
           name, W, N_TOK, worst, (long long)worst_pos, mx);
    if (!(worst <= SHIFT_TOL) && worst_pos >= 0)
        for (int i = 0; i < 4; i++)
            fprintf(stderr, "    logit[%d] at 0: %.7g at 10^9: %.7g\n", i,
                    (double)a[worst_pos * V + i], (double)b[worst_pos * V + i]);
    free(a);
    free(b);
    tiny_model_free(&tm);
    ASSERT(ok);
    ASSERT(worst <= SHIFT_TOL);
}

TEST(window_policy_logits_are_the_same_at_offset_0_and_1e9)
{
    shift_case((struct kv_policy){KV_POLICY_WINDOW, 0}, "window", failed);
}

TEST(sinks4_policy_logits_are_the_same_at_offset_0_and_1e9)
{
    shift_case((struct kv_policy){KV_POLICY_SINKS, 4}, "sinks:4", failed);
}

/*
 * RoPE level. q and k of Dh = 64 with unit norm; the dot product of q
 * rotated at p and k rotated at p' is compared with the same pair rotated at
 * p - p' + d and d for small d. Each rotated component carries the float
 * rounding of its cos/sin entry (2^-24) and of the rotation itself, so the
 * dot of two unit vectors moves by ~1e-7. ROPE_TOL = 1e-6 (the brief's figure
 * for angles in double); angles in float32 are off by whole radians at 10^9,
 * which the control below shows.
 */
#define ROPE_TOL 1e-6
#define DH 64

static double dot64(const float *a, const float *b)
{
    double s = 0;
    for (int i = 0; i < DH; i++)
        s += (double)a[i] * (double)b[i];
    return s;
}

static double rotated_dot(const float *q, const float *k, int64_t pq, int64_t pk, double base)
{
    float qr[DH], kr[DH], cs[DH];
    memcpy(qr, q, sizeof qr);
    memcpy(kr, k, sizeof kr);
    rope_cos_sin(pq, base, DH, cs);
    rope_apply(qr, 1, DH, DH, cs);
    rope_cos_sin(pk, base, DH, cs);
    rope_apply(kr, 1, DH, DH, cs);
    return dot64(qr, kr);
}

/* The same rotation with the angle formed in float32, as a naive port would. */
static double rotated_dot_f32_angles(const float *q, const float *k, int64_t pq, int64_t pk,
                                     double base)
{
    float qr[DH], kr[DH];
    memcpy(qr, q, sizeof qr);
    memcpy(kr, k, sizeof kr);
    for (int i = 0; i < DH / 2; i++) {
        float theta = (float)pow(base, -2.0 * i / DH);
        float aq = (float)pq * theta, ak = (float)pk * theta;
        float x0 = qr[2 * i], x1 = qr[2 * i + 1];
        qr[2 * i] = x0 * cosf(aq) - x1 * sinf(aq);
        qr[2 * i + 1] = x0 * sinf(aq) + x1 * cosf(aq);
        x0 = kr[2 * i];
        x1 = kr[2 * i + 1];
        kr[2 * i] = x0 * cosf(ak) - x1 * sinf(ak);
        kr[2 * i + 1] = x0 * sinf(ak) + x1 * cosf(ak);
    }
    return dot64(qr, kr);
}

TEST(rope_dot_product_depends_only_on_the_distance_at_1e9)
{
    static const double bases[] = {1e4, 1e5};
    static const int64_t dists[] = {0, 1, 3, 17, 100, 4095};
    static const int64_t bigs[] = {1000000000LL, 1000000007LL, 3000000019LL}; /* > 2^31 too */
    uint64_t rng = 5;
    double worst = 0, worst_f32 = 0;
    for (int trial = 0; trial < 8; trial++) {
        float q[DH], k[DH];
        double nq = 0, nk = 0;
        for (int i = 0; i < DH; i++) {
            q[i] = (float)test_rng_normal(&rng);
            k[i] = (float)test_rng_normal(&rng);
            nq += (double)q[i] * q[i];
            nk += (double)k[i] * k[i];
        }
        for (int i = 0; i < DH; i++) {
            q[i] = (float)(q[i] / sqrt(nq));
            k[i] = (float)(k[i] / sqrt(nk));
        }
        for (size_t bi = 0; bi < 2; bi++)
            for (size_t di = 0; di < sizeof dists / sizeof dists[0]; di++)
                for (size_t pi = 0; pi < sizeof bigs / sizeof bigs[0]; pi++) {
                    int64_t d = dists[di], p = bigs[pi] + trial;
                    double near = rotated_dot(q, k, d + 5, 5, bases[bi]);
                    double far = rotated_dot(q, k, p + d, p, bases[bi]);
                    double e = fabs(near - far);
                    if (e > worst)
                        worst = e;
                    if (!(e <= ROPE_TOL))
                        fprintf(stderr, "  base %g d %lld p %lld: %.9f vs %.9f\n", bases[bi],
                                (long long)d, (long long)p, near, far);
                    ASSERT(e <= ROPE_TOL);
                    double ef = fabs(rotated_dot_f32_angles(q, k, d + 5, 5, bases[bi]) -
                                     rotated_dot_f32_angles(q, k, p + d, p, bases[bi]));
                    if (ef > worst_f32)
                        worst_f32 = ef;
                }
    }
    printf("  rope: |dot(q@p+d, k@p) - dot(q@d+5, k@5)| max %.3g at p ~ 1e9 (tolerance %g); "
           "with float32 angles %.3g\n",
           worst, ROPE_TOL, worst_f32);
    /* control: the check can tell float32 angles apart */
    ASSERT(worst_f32 > 100 * ROPE_TOL);
}

TEST_MAIN()
