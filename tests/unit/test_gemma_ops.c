/*
 * test_gemma_ops.c: the CPU backend's Gemma 3 ops against scalar loops in
 * double: geglu (gelu with the tanh approximation, times the up projection),
 * scale, and rope on NEOX pairs with each layer's own base (local layers
 * 10^4, global 10^6) at positions up to 10^9.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/rng.h"
#include "support/tiny_model.h"
#include "test.h"

static double gelu_tanh_ref(double x)
{
    return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

struct ops_rig {
    struct tiny_model tm;
    struct backend b;
};

static int ops_open(struct ops_rig *r)
{
    struct tiny_config c = tiny_config_default();
    char err[256];
    if (tiny_model_init(&r->tm, &c) < 0)
        return -1;
    /* Gemma 3's layer pattern on the tiny model: every 2nd layer global */
    struct model_hparams *hp = &r->tm.m.hp;
    hp->n_swa = 8;
    hp->swa_period = 2;
    hp->rope_neox = 1;
    hp->rope_base = 1e6;
    hp->rope_base_local = 1e4;
    struct backend_cpu_config bc = {.n_threads = 2, .max_tokens = 4};
    if (backend_cpu_init(&r->b, &r->tm.m, &bc, err, sizeof err) < 0) {
        fprintf(stderr, "%s\n", err);
        tiny_model_free(&r->tm);
        return -1;
    }
    return 0;
}

static void ops_close(struct ops_rig *r)
{
    r->b.ops->free(&r->b);
    tiny_model_free(&r->tm);
}

TEST(geglu_and_scale_match_scalar_loops)
{
    struct ops_rig r;
    ASSERT_OK(ops_open(&r));
    const struct model_hparams *hp = &r.tm.m.hp;
    const int64_t rows = 3, nf = rows * hp->n_ff, nd = rows * hp->n_embd;
    float *hb = r.b.acts.hb, *hb2 = r.b.acts.hb2, *x = r.b.acts.x;
    double *want = malloc((size_t)nf * sizeof(double));
    ASSERT(want);
    uint64_t g = 11;
    for (int64_t i = 0; i < nf; i++) {
        hb[i] = (float)(8.0 * test_rng_unit(&g) - 4.0); /* both tails of gelu */
        hb2[i] = (float)(2.0 * test_rng_unit(&g) - 1.0);
        want[i] = gelu_tanh_ref(hb[i]) * hb2[i];
    }
    r.b.ops->geglu(&r.b, hb, hb2, rows);
    double worst = 0;
    for (int64_t i = 0; i < nf; i++) {
        double d = fabs(hb[i] - want[i]);
        worst = d > worst ? d : worst;
    }
    printf("  geglu: largest difference %.3g\n", worst);
    ASSERT(worst < 1e-5);
    for (int64_t i = 0; i < nd; i++)
        x[i] = (float)i - 7.5f;
    r.b.ops->scale(&r.b, x, 25.298221f, rows);
    for (int64_t i = 0; i < nd; i++)
        ASSERT(x[i] == ((float)i - 7.5f) * 25.298221f);
    free(want);
    ops_close(&r);
}

/* rotate_half in double: pair (i, i + Dh/2) turned by pos * base^(-2i/Dh) */
static void rope_neox_ref(const float *in, double *out, int n_head, int Dh, int64_t pos,
                          double base)
{
    for (int h = 0; h < n_head; h++)
        for (int i = 0; i < Dh / 2; i++) {
            double a = (double)pos * pow(base, -2.0 * i / Dh);
            double x0 = in[h * Dh + i], x1 = in[h * Dh + i + Dh / 2];
            out[h * Dh + i] = x0 * cos(a) - x1 * sin(a);
            out[h * Dh + i + Dh / 2] = x0 * sin(a) + x1 * cos(a);
        }
}

TEST(rope_turns_neox_pairs_with_each_layers_own_base)
{
    struct ops_rig r;
    ASSERT_OK(ops_open(&r));
    const struct model_hparams *hp = &r.tm.m.hp;
    const int H = hp->n_head, Hkv = hp->n_head_kv, Dh = hp->head_dim;
    int64_t positions[] = {0, 1, 511, 1000000, 1000000000};
    uint64_t g = 5;
    for (int pi = 0; pi < 5; pi++)
        for (int layer = 0; layer < 2; layer++) {
            int64_t pos = positions[pi];
            struct kv_view view = {0, pos, 1, pos};
            struct fwd_batch bt = {.T = 1, .pos = &pos, .view = &view};
            ASSERT_OK(r.b.ops->begin_step(&r.b, &bt));
            float q[1024], k[1024];
            double wq[1024], wk[1024];
            ASSERT(H * Dh <= 1024);
            for (int i = 0; i < H * Dh; i++)
                q[i] = r.b.acts.q[i] = (float)(2.0 * test_rng_unit(&g) - 1.0);
            for (int i = 0; i < Hkv * Dh; i++)
                k[i] = r.b.acts.k[i] = (float)(2.0 * test_rng_unit(&g) - 1.0);
            double base = layer == 0 ? 1e4 : 1e6; /* layer 0 local, layer 1 global */
            rope_neox_ref(q, wq, H, Dh, pos, base);
            rope_neox_ref(k, wk, Hkv, Dh, pos, base);
            r.b.ops->rope(&r.b, layer, r.b.acts.q, r.b.acts.qc, r.b.acts.k);
            double worst = 0;
            for (int i = 0; i < H * Dh; i++)
                worst = fmax(worst, fabs(r.b.acts.q[i] - wq[i]));
            for (int i = 0; i < Hkv * Dh; i++)
                worst = fmax(worst, fabs(r.b.acts.k[i] - wk[i]));
            printf("  layer %d (base %g), position %lld: largest difference %.3g\n", layer, base,
                   (long long)pos, worst);
            /* float rotation of float inputs; a wrong base or pair layout is O(1) */
            ASSERT(worst < 1e-5);
        }
    ops_close(&r);
}

TEST_MAIN()
