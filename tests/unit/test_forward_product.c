/*
 * test_forward_product.c: the CPU backend's product op (a projection with
 * the element-wise ops around it done in the products' runs: RMSNorm before
 * it, SwiGLU or the residual add after it) changes where work is done, never
 * a value. The forward pass with the op must give the logits of the same
 * forward pass with the op removed from the backend's table (forward.c then
 * calls rmsnorm, matmul, swiglu and add one by one), bit for bit, for every
 * token: a prompt chunk of 40 (RMSNorm, SwiGLU and the add run as pool runs
 * of their own there), chunks of 8 (every op folded in), then decode steps
 * of one token, with a window small enough that the cache wraps. On the
 * default model (its Q4_1 and Q8_0 weights, repacked where the CPU has VNNI)
 * and on the tiny random model (F32 and Q8_0 weights), with f16 and q8_0
 * K/V.
 */
#include <stdlib.h>
#include <string.h>

#include "engine/backend.h"
#include "engine/forward.h"
#include "engine/model.h"
#include "support/model_file.h"
#include "support/tiny_model.h"
#include "test.h"

enum { N_TOK = 72 };

/* Feeds the same tokens to a rig with the product op and to one without;
 * returns the first token whose logits differ, or -1. */
static int64_t compare(const struct model *m, enum kv_dtype dtype)
{
    struct tiny_rig a, b;
    const struct tiny_rig_config rc = {
        .policy = {KV_POLICY_SINKS, 4}, .window = 48, .chunk = 40, .dtype = dtype, .n_threads = 2};
    if (tiny_rig_open(&a, m, &rc) < 0)
        return -2;
    if (tiny_rig_open(&b, m, &rc) < 0) {
        tiny_rig_close(&a);
        return -2;
    }
    struct backend_ops ops = *b.b.ops; /* the same backend without the fused op */
    const struct backend_ops *real = b.b.ops;
    ops.product = NULL;
    b.b.ops = &ops;

    const int64_t V = m->hp.n_vocab;
    int32_t tok[N_TOK];
    tiny_tokens(tok, N_TOK, V, 9);
    float *la = malloc((size_t)(N_TOK * V) * sizeof(float));
    float *lb = malloc((size_t)(N_TOK * V) * sizeof(float));
    int64_t bad = la && lb ? -1 : -2;
    /* tokens [0, 40) in one step, [40, 64) eight at a time, then one by one */
    const int64_t start[] = {0, 40, 64}, len[] = {40, 24, 8}, step[] = {40, 8, 1};
    for (int s = 0; s < 3 && bad == -1; s++) {
        const int32_t *t = tok + start[s];
        float *oa = la + start[s] * V, *ob = lb + start[s] * V;
        if (tiny_rig_feed(&a, t, len[s], step[s], oa) != 0 ||
            tiny_rig_feed(&b, t, len[s], step[s], ob) != 0) {
            bad = -2;
            break;
        }
        for (int64_t i = 0; i < len[s] && bad == -1; i++)
            if (memcmp(oa + i * V, ob + i * V, (size_t)V * sizeof(float)) != 0)
                bad = start[s] + i;
    }
    free(la);
    free(lb);
    b.b.ops = real;
    tiny_rig_close(&a);
    tiny_rig_close(&b);
    return bad;
}

TEST(the_default_models_forward_pass_is_the_same_with_and_without_the_fused_product)
{
    TEST_NEED_MODEL();
    struct model m;
    char err[256];
    if (model_load(&m, test_model_path(), err, sizeof err) < 0)
        FAIL_AT("cannot load the model: %s", err);
    const enum kv_dtype dt[] = {KV_DTYPE_F16, KV_DTYPE_Q8_0};
    for (size_t i = 0; i < sizeof dt / sizeof dt[0]; i++) {
        int64_t bad = compare(&m, dt[i]);
        if (bad != -1) {
            model_free(&m);
            FAIL_AT("kv dtype %zu: %s %lld", i,
                    bad == -2 ? "setup failed" : "logits differ at token", (long long)bad);
        }
    }
    model_free(&m);
}

TEST(the_tiny_models_forward_pass_is_the_same_with_and_without_the_fused_product)
{
    const enum qtype wt[] = {QTYPE_F32, QTYPE_Q8_0};
    for (size_t i = 0; i < sizeof wt / sizeof wt[0]; i++) {
        struct tiny_config tc = tiny_config_default();
        tc.wtype = wt[i];
        struct tiny_model tm;
        ASSERT_OK(tiny_model_init(&tm, &tc));
        int64_t bad = compare(&tm.m, KV_DTYPE_F16);
        tiny_model_free(&tm);
        if (bad != -1)
            FAIL_AT("weights %zu: %s %lld", i,
                    bad == -2 ? "setup failed" : "logits differ at token", (long long)bad);
    }
}

TEST_MAIN()
