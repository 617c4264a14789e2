/*
 * decoder_impl.h: struct decoder (include/decoder.h), for the engine's own
 * files: the engine thread embeds one and drives its forward state with its
 * own sequences (engine_impl.h); the commands reach it only through
 * decoder.h. Internal to engine/.
 */
#ifndef SS_DECODER_IMPL_H
#define SS_DECODER_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "decoder.h"
#include "forward.h"
#include "kvcache.h"
#include "model.h"
#include "tokenizer.h"

struct decoder {
    struct model model;
    struct tokenizer *tok;
    struct backend backend;
    struct fwd fwd; /* the KV pool (fwd.pool), the step, the observer */
    int have_backend, have_fwd;
    enum engine_backend kind;
    /* sequences opened through decoder_seq_open (the engine keeps its own) */
    struct kv_seq *seqs;      /* [n_slots], index == slot */
    unsigned char *seq_open;  /* [n_slots] */
    struct fwd_input *inputs; /* [n_slots] one decoder_step's inputs */
};

/* Fills caller-provided memory (the engine embeds its decoder). Returns 0 or
 * a negative errno with one line in err; decoder__free is safe either way. */
int decoder__init(struct decoder *d, const struct decoder_config *cfg, char *err, size_t err_len);
void decoder__free(struct decoder *d);
/* One batched step over the caller's own sequences (fwd_step). */
int64_t decoder__step(struct decoder *d, const struct fwd_input *in, int n_in);
/* fn(arg, i, n) for every i < n on the backend's threads (the calling
 * thread alone where the backend has none); between steps only. */
void decoder__run_parts(struct decoder *d, void (*fn)(void *arg, int i, int n), void *arg, int n);

#endif
