/*
 * probe.h: the sink probe. Runs a text through the model (dense, one
 * sequence) and measures, per layer and head, the mean attention mass that
 * queries at context >= PROBE_MIN_CTX put on the sequence's first 1, 4 and 16
 * positions. A head "is a sink head" when its mean first-position mass is
 * above PROBE_SINK_MASS; the sink rate is the share of such heads.
 * Internal to engine/ (the server reads the result through engine.h later).
 */
#ifndef SS_PROBE_H
#define SS_PROBE_H

#include <stdint.h>

#include "forward.h"

#define PROBE_MIN_CTX 64      /* only queries that see at least this many keys count */
#define PROBE_SINK_MASS 0.3f  /* a sink head puts more than this on position 0 */
#define PROBE_WARN_RATE 0.10f /* softmax1/sink models above this sink rate get a warning */

struct probe_result {
    int n_layer, n_head;
    int64_t n_queries; /* queries averaged per head */
    float *mass1;      /* [L*H] mean mass on the first position */
    float *mass4;      /* [L*H] ... first 4 positions */
    float *mass16;     /* [L*H] ... first 16 positions */
    float sink_rate;   /* share of heads with mass1 > PROBE_SINK_MASS */
};

/* Feeds ids[0..n) through a free slot of f (dense, chunks of f->max_tokens)
 * and fills out (caller frees with probe_free). The slot is released after.
 * Returns 0, -EINVAL when n <= PROBE_MIN_CTX or the window is too small,
 * -EBUSY with no free slot, -ENOMEM. */
int probe_run(struct fwd *f, const int32_t *ids, int64_t n, struct probe_result *out);
void probe_free(struct probe_result *r);

/* A built-in public-domain English text (Genesis 1, King James Version) for
 * the load-time check. */
extern const char probe_builtin_text[];

#endif
