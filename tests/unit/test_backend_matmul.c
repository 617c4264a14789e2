/*
 * test_backend_matmul.c: the CPU backend's matrix products on the default
 * model's own weights. Where the backend repacks weights at load (AVX-512
 * with VNNI), its products must be, bit for bit, the kernel dispatch
 * (cpu_prepare_act + cpu_matmul_rows) on the rows as the file holds them; and
 * matmul_shared (Q/K/V, gate/up: one prepared input, one run) must be, bit for
 * bit, the separate matmul calls. Both at T = 1 (decode) and T = 5. And
 * product (a projection with RMSNorm before it and SwiGLU or the residual
 * add after it) must be, bit for bit, those ops called one after another,
 * at every T where it folds some or all of them into the products' runs
 * and where it does not; and so must a chain of products as a layer makes
 * them, where the backend may leave one product's add or SwiGLU to the next
 * product's preparation run or to the next op.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend.h"
#include "engine/cpu/matmul.h"
#include "engine/model.h"
#include "support/model_file.h"
#include "support/rng.h"
#include "test.h"

enum { T_MAX = 40 };

/* the products' tests: decode and a short batch */
static const int T_PRODUCTS[] = {1, 5};

struct rig {
    struct model m;
    struct backend b;
    float *x, *y, *want;
    void *act;
};

static int rig_open(struct rig *r, char *err, size_t err_len)
{
    memset(r, 0, sizeof *r);
    if (model_load(&r->m, test_model_path(), err, err_len) < 0)
        return -1;
    struct backend_cpu_config bc = {.n_threads = 2, .max_tokens = T_MAX};
    if (backend_cpu_init(&r->b, &r->m, &bc, err, err_len) < 0)
        return -1;
    const struct model_hparams *hp = &r->m.hp;
    size_t kmax = (size_t)(hp->n_ff > hp->n_embd ? hp->n_ff : hp->n_embd);
    size_t nmax = (size_t)hp->n_vocab;
    r->x = malloc(T_MAX * kmax * sizeof(float));
    r->y = malloc(T_MAX * nmax * sizeof(float));
    r->want = malloc(T_MAX * nmax * sizeof(float));
    r->act = malloc(T_MAX * kmax * sizeof(float)); /* f32 is the largest prepared row */
    uint64_t g = 5;
    for (size_t i = 0; r->x && i < T_MAX * kmax; i++)
        r->x[i] = (float)(2.0 * test_rng_unit(&g) - 1.0);
    return r->x && r->y && r->want && r->act ? 0 : -1;
}

static void rig_close(struct rig *r)
{
    if (r->b.ops)
        r->b.ops->free(&r->b);
    model_free(&r->m);
    free(r->x);
    free(r->y);
    free(r->want);
    free(r->act);
}

/* want = the kernel dispatch on W's rows as the file holds them. */
static void kernel_product(struct rig *r, const struct tensor *W, int64_t T)
{
    enum cpu_isa isa = cpu_isa_best();
    size_t ab = quant_act_bytes(W->type, W->ne0);
    for (int64_t t = 0; t < T; t++)
        cpu_prepare_act(isa, W->type, r->x + t * W->ne0, W->ne0, (char *)r->act + (size_t)t * ab);
    cpu_matmul_rows(isa, W->type, W->data, W->ne0, 0, W->ne1, r->act, T, r->want, W->ne1);
}

TEST(backend_products_are_the_kernel_on_the_rows_as_the_file_holds_them)
{
    struct rig r;
    char err[256];
    TEST_NEED_MODEL();
    if (rig_open(&r, err, sizeof err) < 0) {
        rig_close(&r);
        FAIL_AT("cannot open the model and backend: %s", err);
    }
    printf("  isa %s%s\n", cpu_isa_name(cpu_isa_best()),
           cpu_matmul_packs(cpu_isa_best(), QTYPE_Q4_1) ? " (weights repacked at load)" : "");
    const int L = r.m.hp.n_layer;
    long long compared = 0;
    for (size_t ti = 0; ti < sizeof T_PRODUCTS / sizeof T_PRODUCTS[0]; ti++) {
        const int T = T_PRODUCTS[ti];
        for (int li = 0; li < 2; li++) {
            const struct model_layer *ly = &r.m.w.layers[li ? L - 1 : 0];
            const struct tensor *ws[] = {&ly->wq,     &ly->wk,   &ly->wv,    &ly->wo,
                                         &ly->w_gate, &ly->w_up, &ly->w_down};
            for (size_t i = 0; i <= sizeof ws / sizeof ws[0]; i++) {
                const struct tensor *W = i < sizeof ws / sizeof ws[0] ? ws[i] : &r.m.w.output;
                kernel_product(&r, W, T);
                r.b.ops->matmul(&r.b, W, r.x, r.y, T);
                if (memcmp(r.y, r.want, (size_t)(T * W->ne1) * sizeof(float)) != 0) {
                    rig_close(&r);
                    FAIL_AT("layer %d weight %zu (%lld x %lld) T=%d: the backend's product "
                            "differs from the kernel's",
                            li ? L - 1 : 0, i, (long long)W->ne1, (long long)W->ne0, T);
                }
                compared += T * W->ne1;
            }
        }
    }
    printf("  %lld outputs compared\n", compared);
    rig_close(&r);
}

TEST(matmul_shared_is_the_separate_products_bit_for_bit)
{
    struct rig r;
    char err[256];
    TEST_NEED_MODEL();
    if (rig_open(&r, err, sizeof err) < 0) {
        rig_close(&r);
        FAIL_AT("cannot open the model and backend: %s", err);
    }
    ASSERT(r.b.ops->matmul_shared);
    for (size_t ti = 0; ti < sizeof T_PRODUCTS / sizeof T_PRODUCTS[0]; ti++) {
        const int T = T_PRODUCTS[ti];
        for (int l = 0; l < r.m.hp.n_layer; l += r.m.hp.n_layer - 1) {
            const struct model_layer *ly = &r.m.w.layers[l];
            const struct tensor *qkv[] = {&ly->wq, &ly->wk, &ly->wv};
            const struct tensor *gu[] = {&ly->w_gate, &ly->w_up};
            const struct tensor *const *sets[] = {qkv, gu};
            const int ns[] = {3, 2};
            for (int s = 0; s < 2; s++) {
                const struct tensor *const *W = sets[s];
                float *y[BACKEND_SHARED_MAX], *want[BACKEND_SHARED_MAX];
                size_t off = 0;
                for (int i = 0; i < ns[s]; i++) {
                    y[i] = r.y + off;
                    want[i] = r.want + off;
                    off += (size_t)(T * W[i]->ne1);
                    r.b.ops->matmul(&r.b, W[i], r.x, want[i], T);
                }
                memset(r.y, 0xff, off * sizeof(float));
                r.b.ops->matmul_shared(&r.b, W, y, ns[s], r.x, T);
                if (memcmp(r.y, r.want, off * sizeof(float)) != 0) {
                    rig_close(&r);
                    FAIL_AT("layer %d %s T=%d: matmul_shared differs from separate matmuls", l,
                            s ? "gate/up" : "q/k/v", T);
                }
            }
        }
    }
    rig_close(&r);
}

/* What a product op stands for: the ops one after another (forward.c's way
 * without it). */
static void separate_ops(const struct backend_ops *op, struct backend *b,
                         const struct backend_product *p, int64_t T)
{
    const float *in = p->x;
    if (p->norm) {
        op->rmsnorm(b, p->x, p->norm, p->xn, T);
        in = p->xn;
    }
    for (int i = 0; i < p->n; i++)
        op->matmul(b, p->W[i], in, p->y[i], T);
    if (p->then == BACKEND_THEN_SWIGLU)
        op->swiglu(b, p->y[0], p->y[1], T);
    else if (p->then == BACKEND_THEN_ADD)
        op->add(b, p->res, p->y[0], T);
}

/* The four products of a layer as forward.c asks for them, against the
 * separate ops: xb = rmsnorm(x), q/k/v; xb = rmsnorm(x), gate/up, SwiGLU;
 * x += att Wo; x += hb Wdown. */
TEST(product_is_the_separate_ops_bit_for_bit)
{
    struct rig r;
    char err[256];
    TEST_NEED_MODEL();
    if (rig_open(&r, err, sizeof err) < 0) {
        rig_close(&r);
        FAIL_AT("cannot open the model and backend: %s", err);
    }
    const struct backend_ops *op = r.b.ops;
    ASSERT(op->product);
    const int64_t D = r.m.hp.n_embd, F = r.m.hp.n_ff;
    const size_t big = (size_t)T_MAX * (size_t)(F > D ? F : D);
    float *yw[BACKEND_SHARED_MAX], *yg[BACKEND_SHARED_MAX];
    float *xnw = malloc(big * sizeof(float)), *xng = malloc(big * sizeof(float));
    float *resw = malloc(big * sizeof(float)), *resg = malloc(big * sizeof(float));
    int ok = xnw && xng && resw && resg;
    for (int i = 0; i < BACKEND_SHARED_MAX; i++) {
        yw[i] = malloc(big * sizeof(float));
        yg[i] = malloc(big * sizeof(float));
        ok = ok && yw[i] && yg[i];
    }
    /* T = 1, 3, 8: every op folded in; 20: RMSNorm folded in, SwiGLU (20 x
     * F values) a pool run of its own; 40: none folded in */
    static const int Ts[] = {1, 3, 8, 20, 40};
    long long compared = 0;
    char what[160] = "";
    for (size_t ti = 0; ok && ti < sizeof Ts / sizeof Ts[0]; ti++) {
        const int64_t T = Ts[ti];
        for (int l = 0; ok && l < r.m.hp.n_layer; l += r.m.hp.n_layer - 1) {
            const struct model_layer *ly = &r.m.w.layers[l];
            const struct backend_product cases[] = {
                {.x = r.x, .norm = &ly->attn_norm, .n = 3, .W = {&ly->wq, &ly->wk, &ly->wv}},
                {.x = r.x,
                 .norm = &ly->ffn_norm,
                 .n = 2,
                 .W = {&ly->w_gate, &ly->w_up},
                 .then = BACKEND_THEN_SWIGLU},
                {.x = r.x, .n = 1, .W = {&ly->wo}, .then = BACKEND_THEN_ADD},
                {.x = r.x, .n = 1, .W = {&ly->w_down}, .then = BACKEND_THEN_ADD},
            };
            for (size_t ci = 0; ok && ci < sizeof cases / sizeof cases[0]; ci++) {
                struct backend_product want = cases[ci], got = cases[ci];
                const int64_t N = want.W[0]->ne1;
                want.xn = xnw;
                got.xn = xng;
                want.res = resw;
                got.res = resg;
                uint64_t g = 77 + ci;
                for (int64_t i = 0; i < T * N; i++) /* the residual stream before the add */
                    resw[i] = resg[i] = (float)(2.0 * test_rng_unit(&g) - 1.0);
                memset(xng, 0xff, big * sizeof(float));
                for (int i = 0; i < want.n; i++) {
                    want.y[i] = yw[i];
                    got.y[i] = yg[i];
                    memset(yg[i], 0xff, big * sizeof(float));
                }
                separate_ops(op, &r.b, &want, T);
                op->product(&r.b, &got, T);
                /* the activations are the backend's: read after sync (the CPU
                 * backend may leave a product's add or SwiGLU to the next op) */
                ASSERT(op->sync(&r.b) == 0);

                snprintf(what, sizeof what, "layer %d product %zu T=%lld", l, ci, (long long)T);
                if (want.norm && memcmp(xng, xnw, (size_t)(T * D) * sizeof(float)) != 0) {
                    ok = 0;
                    strcat(what, ": the normed input differs");
                }
                for (int i = 0; ok && i < want.n; i++)
                    if (memcmp(yg[i], yw[i], (size_t)(T * want.W[i]->ne1) * sizeof(float)) != 0) {
                        ok = 0;
                        snprintf(what + strlen(what), sizeof what - strlen(what),
                                 ": output %d differs", i);
                    }
                if (ok && want.then == BACKEND_THEN_ADD &&
                    memcmp(resg, resw, (size_t)(T * N) * sizeof(float)) != 0) {
                    ok = 0;
                    strcat(what, ": the residual stream differs");
                }
                compared += ok ? T * N : 0;
            }
        }
    }
    for (int i = 0; i < BACKEND_SHARED_MAX; i++) {
        free(yw[i]);
        free(yg[i]);
    }
    free(xnw);
    free(xng);
    free(resw);
    free(resg);
    rig_close(&r);
    if (!ok)
        FAIL_AT("%s", what[0] ? what : "out of memory");
    printf("  %lld outputs compared\n", compared);
}

/* The ops of one side of the chain test: its own buffers, each (T_MAX, F
 * or D) floats. */
struct chain_bufs {
    float *res, *xn, *y, *hb, *hb2, *q, *k, *v, *xn2;
};

static int chain_alloc(struct chain_bufs *c, size_t n)
{
    float **p[] = {&c->res, &c->xn, &c->y, &c->hb, &c->hb2, &c->q, &c->k, &c->v, &c->xn2};
    int ok = 1;
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) {
        *p[i] = malloc(n * sizeof(float));
        ok = ok && *p[i];
        if (*p[i])
            memset(*p[i], 0xff, n * sizeof(float));
    }
    return ok;
}

static void chain_free(struct chain_bufs *c)
{
    float *p[] = {c->res, c->xn, c->y, c->hb, c->hb2, c->q, c->k, c->v, c->xn2};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
        free(p[i]);
}

/* A layer's products after its attention, then the next layer's Q/K/V and,
 * after one more down projection, a plain RMSNorm of the residual stream:
 * x += att Wo; gate/up of rmsnorm(x), SwiGLU; x += hb Wdown; q/k/v of
 * rmsnorm(x); x += hb Wdown; rmsnorm(x). With fused = 0 as the ops one
 * after another (forward.c's way without a product op). */
static void run_chain(const struct backend_ops *op, struct backend *b, const struct model_layer *ly,
                      const float *att, struct chain_bufs *c, int64_t T, int fused)
{
    const struct backend_product p[] = {
        {.x = att, .n = 1, .W = {&ly->wo}, .y = {c->y}, .then = BACKEND_THEN_ADD, .res = c->res},
        {.x = c->res,
         .norm = &ly->ffn_norm,
         .xn = c->xn,
         .n = 2,
         .W = {&ly->w_gate, &ly->w_up},
         .y = {c->hb, c->hb2},
         .then = BACKEND_THEN_SWIGLU},
        {.x = c->hb,
         .n = 1,
         .W = {&ly->w_down},
         .y = {c->y},
         .then = BACKEND_THEN_ADD,
         .res = c->res},
        {.x = c->res,
         .norm = &ly->attn_norm,
         .xn = c->xn,
         .n = 3,
         .W = {&ly->wq, &ly->wk, &ly->wv},
         .y = {c->q, c->k, c->v}},
        {.x = c->hb,
         .n = 1,
         .W = {&ly->w_down},
         .y = {c->y},
         .then = BACKEND_THEN_ADD,
         .res = c->res},
    };
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) {
        if (fused)
            op->product(b, &p[i], T);
        else
            separate_ops(op, b, &p[i], T);
    }
    op->rmsnorm(b, c->res, &ly->attn_norm, c->xn2, T);
}

TEST(a_chain_of_products_is_the_separate_ops_bit_for_bit)
{
    struct rig r;
    char err[256];
    TEST_NEED_MODEL();
    if (rig_open(&r, err, sizeof err) < 0) {
        rig_close(&r);
        FAIL_AT("cannot open the model and backend: %s", err);
    }
    const struct backend_ops *op = r.b.ops;
    const int64_t D = r.m.hp.n_embd, F = r.m.hp.n_ff;
    const size_t big = (size_t)T_MAX * (size_t)(F > D ? F : D);
    struct chain_bufs want = {0}, got = {0};
    int ok = chain_alloc(&want, big) && chain_alloc(&got, big);
    /* T = 1, 8: the adds and SwiGLU folded into the products; 20, 32, 40:
     * left to the next product or op */
    static const int Ts[] = {1, 8, 20, 32, 40};
    char what[160] = "";
    for (size_t ti = 0; ok && ti < sizeof Ts / sizeof Ts[0]; ti++) {
        const int64_t T = Ts[ti];
        for (int l = 0; ok && l < r.m.hp.n_layer; l += r.m.hp.n_layer - 1) {
            const struct model_layer *ly = &r.m.w.layers[l];
            uint64_t g = 91 + (uint64_t)l;
            for (int64_t i = 0; i < T * D; i++) /* the residual stream before the layer */
                want.res[i] = got.res[i] = (float)(2.0 * test_rng_unit(&g) - 1.0);
            run_chain(op, &r.b, ly, r.x, &want, T, 0);
            run_chain(op, &r.b, ly, r.x, &got, T, 1);
            ASSERT(op->sync(&r.b) == 0);
            const struct {
                const char *name;
                const float *w, *g;
                int64_t n;
            } out[] = {
                {"residual stream", want.res, got.res, T * D},
                {"normed input", want.xn, got.xn, T * D},
                {"down projection", want.y, got.y, T * D},
                {"SwiGLU", want.hb, got.hb, T * F},
                {"q", want.q, got.q, T * ly->wq.ne1},
                {"k", want.k, got.k, T * ly->wk.ne1},
                {"v", want.v, got.v, T * ly->wv.ne1},
                {"final RMSNorm", want.xn2, got.xn2, T * D},
            };
            for (size_t o = 0; ok && o < sizeof out / sizeof out[0]; o++)
                if (memcmp(out[o].w, out[o].g, (size_t)out[o].n * sizeof(float)) != 0) {
                    ok = 0;
                    snprintf(what, sizeof what, "layer %d T=%lld: the %s differs", l, (long long)T,
                             out[o].name);
                }
        }
    }
    chain_free(&want);
    chain_free(&got);
    rig_close(&r);
    if (!ok)
        FAIL_AT("%s", what[0] ? what : "out of memory");
}

TEST_MAIN()
