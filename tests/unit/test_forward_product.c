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
 * K/V. The same for rope_store (RoPE and the K/V store as one op) against
 * rope and kv_store.
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

/* Which fused op the second rig goes without (FUSED_NONE: none; the rigs
 * differ in their threads). */
enum fused { FUSED_PRODUCT, FUSED_ROPE_STORE, FUSED_NONE };

/* Feeds the same tokens to a rig with the fused op and to one without (or,
 * FUSED_NONE, to a rig of two threads and one of threads_b); returns the
 * first token whose logits differ, or -1. */
static int64_t compare_threads(const struct model *m, enum kv_dtype dtype, enum fused without,
                               int threads_b)
{
    struct tiny_rig a, b;
    const struct tiny_rig_config rc = {
        .policy = {KV_POLICY_SINKS, 4}, .window = 48, .chunk = 40, .dtype = dtype, .n_threads = 2};
    struct tiny_rig_config rcb = rc;
    rcb.n_threads = threads_b;
    if (tiny_rig_open(&a, m, &rc) < 0)
        return -2;
    if (tiny_rig_open(&b, m, &rcb) < 0) {
        tiny_rig_close(&a);
        return -2;
    }
    struct backend_ops ops = *b.b.ops; /* the same backend without the fused op */
    const struct backend_ops *real = b.b.ops;
    if (without == FUSED_PRODUCT)
        ops.product = NULL;
    else if (without == FUSED_ROPE_STORE)
        ops.rope_store = NULL;
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

static int64_t compare(const struct model *m, enum kv_dtype dtype, enum fused without)
{
    return compare_threads(m, dtype, without, 2);
}

/* Each fused op against the ops it stands for: product (with f16 and q8_0
 * K/V) and rope_store (RoPE and the K/V store in one pool run, tokens split
 * across parts at the 40-token chunk; with every K/V type). */
TEST(the_default_models_forward_pass_is_the_same_with_and_without_each_fused_op)
{
    TEST_NEED_MODEL();
    struct model m;
    char err[256];
    if (model_load(&m, test_model_path(), err, sizeof err) < 0)
        FAIL_AT("cannot load the model: %s", err);
    const struct {
        enum fused without;
        enum kv_dtype dt;
    } runs[] = {{FUSED_PRODUCT, KV_DTYPE_F16},
                {FUSED_PRODUCT, KV_DTYPE_Q8_0},
                {FUSED_ROPE_STORE, KV_DTYPE_F16},
                {FUSED_ROPE_STORE, KV_DTYPE_Q8_0},
                {FUSED_ROPE_STORE, KV_DTYPE_F32}};
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        int64_t bad = compare(&m, runs[i].dt, runs[i].without);
        if (bad != -1) {
            model_free(&m);
            FAIL_AT("run %zu (fused op %d, kv dtype %d): %s %lld", i, (int)runs[i].without,
                    (int)runs[i].dt, bad == -2 ? "setup failed" : "logits differ at token",
                    (long long)bad);
        }
    }
    model_free(&m);
}

TEST(the_tiny_models_forward_pass_is_the_same_with_and_without_each_fused_op)
{
    const enum qtype wt[] = {QTYPE_F32, QTYPE_Q8_0};
    for (size_t i = 0; i < 2 * sizeof wt / sizeof wt[0]; i++) {
        struct tiny_config tc = tiny_config_default();
        tc.wtype = wt[i / 2];
        struct tiny_model tm;
        ASSERT_OK(tiny_model_init(&tm, &tc));
        int64_t bad = compare(&tm.m, KV_DTYPE_F16, i % 2 ? FUSED_ROPE_STORE : FUSED_PRODUCT);
        tiny_model_free(&tm);
        if (bad != -1)
            FAIL_AT("weights %zu, fused op %zu: %s %lld", i / 2, i % 2,
                    bad == -2 ? "setup failed" : "logits differ at token", (long long)bad);
    }
}

/* The number of threads (and so how many parts each run is cut into: a
 * caller whose worker shares a busy core runs the parts one thread would
 * have, threadpool_active) changes where work is done, never a value: the
 * default model's logits on one and three threads are those on two, bit
 * for bit, for a 40-token chunk, chunks of 8 and decode steps. */
TEST(the_default_models_forward_pass_is_the_same_on_one_two_and_three_threads)
{
    TEST_NEED_MODEL();
    struct model m;
    char err[256];
    if (model_load(&m, test_model_path(), err, sizeof err) < 0)
        FAIL_AT("cannot load the model: %s", err);
    const int threads[] = {1, 3};
    const enum kv_dtype dts[] = {KV_DTYPE_F16, KV_DTYPE_Q8_0};
    for (size_t i = 0; i < 4; i++) {
        int64_t bad = compare_threads(&m, dts[i % 2], FUSED_NONE, threads[i / 2]);
        if (bad != -1) {
            model_free(&m);
            FAIL_AT("%d threads against 2, kv dtype %d: %s %lld", threads[i / 2], (int)dts[i % 2],
                    bad == -2 ? "setup failed" : "logits differ at token", (long long)bad);
        }
    }
    model_free(&m);
}

TEST_MAIN()
