/*
 * forward.h: one batched step of the Llama or Gemma 3 forward pass over any mix of
 * sequences (decode tokens and prefill chunks), written once against
 * backend.h. Internal to engine/.
 */
#ifndef SS_FORWARD_H
#define SS_FORWARD_H

#include <stdint.h>

#include "backend.h"
#include "decoder.h"
#include "kvcache.h"
#include "model.h"

enum fwd_logits { FWD_LOGITS_NONE = 0, FWD_LOGITS_LAST, FWD_LOGITS_ALL };

struct fwd_input { /* one sequence's tokens in this step */
    struct kv_seq *seq;
    const int32_t *tokens;
    int64_t n;
    enum fwd_logits logits;
};

struct fwd {
    const struct model *m;
    struct backend *b;
    struct kv_pool pool;
    int64_t max_tokens;
    /* per-step metadata, sized max_tokens */
    int32_t *tokens;
    int64_t *pos, *slot, *cell, *out_rows;
    struct kv_view *view;
    int64_t *cell_local; /* the token's cell and view in the local layers */
    struct kv_view *view_local;
    const struct kv_seq **seq;
    float *logits;               /* (max_tokens, V) host */
    struct decoder_observer obs; /* obs.on_layer NULL: none */
    float *first; /* NULL, or (L, max_tokens, H, BACKEND_PROBE_K) attention weights on each
                     sequence's first positions, while an observer asks for them */
};

/* Sets (obs) or clears (NULL) the observer every later step reports each
 * layer to (decoder.h: struct decoder_observer). QK needs a backend whose
 * activations are host memory (host_acts). Returns 0, -ENOTSUP or -ENOMEM. */
int fwd_set_observer(struct fwd *f, const struct decoder_observer *obs, int host_acts);

/* Sets up the pool (geometry g) and the backend's KV storage. The model's
 * local layers (Gemma 3) are added to g: f->pool.geo is the geometry used. */
int fwd_init(struct fwd *f, const struct model *m, struct backend *b, const struct kv_geometry *g,
             char *err, size_t err_len);
void fwd_free(struct fwd *f);

/* Runs one step. Appends every input's tokens to its sequence. On success
 * returns the number of logits rows written to f->logits, in input order
 * (LAST: one row, ALL: n rows). -EINVAL for a batch larger than max_tokens or a
 * bad token id, -ENOSPC when a sequence cannot take its tokens, -EIO when the
 * backend failed (sequences are then unchanged). */
int64_t fwd_step(struct fwd *f, const struct fwd_input *in, int n_in);

#endif
