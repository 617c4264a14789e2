/*
 * test_forward_errors.c: a backend failure reaches the engine as the
 * backend reported it. The engine tells a device failure (-EIO: the backend
 * is unhealthy, /health says so) from a bad request (-EINVAL); fwd_step must
 * pass begin_step's code through, whatever the step.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend.h"
#include "engine/forward.h"
#include "engine/model.h"
#include "test.h"
#include "support/tiny_model.h"

static int begin_rc;

static int failing_begin_step(struct backend *b, const struct fwd_batch *bt)
{
    (void)b;
    (void)bt;
    return begin_rc;
}

TEST(fwd_step_passes_begin_steps_error_code_through)
{
    struct tiny_config tc = tiny_config_default();
    struct tiny_model tm;
    ASSERT_OK(tiny_model_init(&tm, &tc));
    struct tiny_rig r;
    struct tiny_rig_config rc = {.policy = {KV_POLICY_WINDOW, 0},
                                 .window = 32,
                                 .chunk = 8,
                                 .dtype = KV_DTYPE_F32,
                                 .n_threads = 1};
    ASSERT_OK(tiny_rig_open(&r, &tm.m, &rc));
    int32_t tok[4];
    tiny_tokens(tok, 4, tm.m.hp.n_vocab, 7);
    ASSERT_EQ(tiny_rig_feed(&r, tok, 4, 4, NULL), 0); /* the real backend runs */

    struct backend_ops ops = *r.b.ops; /* the same backend, with a begin_step that fails */
    const struct backend_ops *real = r.b.ops;
    ops.begin_step = failing_begin_step;
    r.b.ops = &ops;
    const int codes[] = {-EIO, -ENOMEM, -EINVAL};
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
        begin_rc = codes[i];
        struct fwd_input in = {&r.seq, tok, 1, FWD_LOGITS_LAST};
        ASSERT_EQ(fwd_step(&r.f, &in, 1), (int64_t)codes[i]);
    }
    r.b.ops = real;
    tiny_rig_close(&r);
    tiny_model_free(&tm);
}

TEST_MAIN()
