/*
 * tiny_model.h: a small random-weight Llama model built directly in memory,
 * for the invariant tests (tests/invariants/). No GGUF file and no tokenizer:
 * struct model's hparams and weight views are filled here, model.gguf stays
 * zeroed, and tiny_model_free (never model_free) releases it.
 *
 * The weights are drawn from a fixed seed so every run sees the same model.
 * Query and key projections are large (default sigma 0.3 with D = 64), so
 * attention scores spread over several units and softmax is peaked: a wrong
 * position, a missing key or a wrong normalizer moves the logits by a lot,
 * which is what lets the invariant tests fail. Value, output and FFN
 * projections are scaled 1/sqrt(fan-in) so the residual stream stays O(1)
 * through the layers.
 *
 * Weights are F32 by default (the CPU backend then multiplies f32
 * activations with no quantization) or Q8_0 (made with quant_quantize_row).
 * The normalizer is selectable; per-head sink logits live in m.sinks_mem and
 * layers[l].attn_sinks, as model_load lays them out.
 *
 * Also here: tiny_rig, a CPU backend + forward state + one sequence around any
 * struct model, since every invariant test drives the engine the same way.
 * Random numbers come from support/rng.h (splitmix64).
 */
#ifndef SS_TESTS_SUPPORT_TINY_MODEL_H
#define SS_TESTS_SUPPORT_TINY_MODEL_H

#include <stdint.h>

#include "engine/backend.h"
#include "engine/forward.h"
#include "engine/model.h"
#include "engine/quant.h"
#include "kvcache/kvcache.h"

struct tiny_config {
    int n_layer;     /* L */
    int n_embd;      /* D */
    int n_head;      /* H */
    int n_head_kv;   /* Hkv */
    int head_dim;    /* Dh */
    int n_ff;        /* F */
    int64_t n_vocab; /* V */
    double rope_base;
    float norm_eps;
    enum model_normalizer normalizer;
    enum qtype wtype; /* QTYPE_F32 or QTYPE_Q8_0 for the matrices; norms stay F32 */
    float qk_sigma;   /* std of Wq and Wk entries: sets how peaked attention is */
    float sink_mean;  /* sink logits s_h ~ N(sink_mean, sink_sigma) for MODEL_NORM_SINK */
    float sink_sigma;
    /* MODEL_NORM_SINK only: also per-head sink values (attn_sinks_v) and
     * per-kv-head sink keys (attn_sinks_k), entries N(0, 0.5), drawn from
     * their own seed so the other weights do not change */
    int sink_vectors;
    uint64_t seed;
    /* local sliding-window layers, as Gemma 3's (model_hparams n_swa and
     * swa_period; 0: every layer global): layer l is local iff
     * (l + 1) % swa_period != 0 and sees the last n_swa positions */
    int swa_period;
    int n_swa;
};

struct tiny_config tiny_config_default(void);

#define TINY_MAX_ALLOCS 512 /* enough for 30 layers (tools/bench_cuda.c --synthetic) */

struct tiny_model {
    struct model m;
    struct tiny_config cfg;
    void *mem[TINY_MAX_ALLOCS]; /* everything to free */
    int n_mem;
};

void tiny_model_free(struct tiny_model *tm);

/* Builds the model. Returns 0, or -1 (and tm freed) when memory runs out or a
 * dimension does not fit the weight type's block. */
int tiny_model_init(struct tiny_model *tm, const struct tiny_config *c);

/* Sets every sink logit s_h of every layer to s. */
void tiny_model_set_sinks(struct tiny_model *tm, float s);

/* A backend, the forward state and one sequence in slot 0. */
struct tiny_rig {
    struct backend b;
    struct fwd f;
    struct kv_seq seq;
    int b_ok, f_ok;
};

struct tiny_rig_config {
    struct kv_policy policy; /* resolved (not AUTO) */
    int64_t window;          /* W */
    int64_t chunk;           /* C_max: most tokens per step (also the backend's max_tokens) */
    int64_t pos_first;       /* p0 */
    enum kv_dtype dtype;
    int n_threads;
    int reference_matmul; /* backend_cpu_config.reference_matmul */
};

void tiny_rig_close(struct tiny_rig *r);

/* Returns 0, or -1 with a message on stderr (and r closed). */
int tiny_rig_open(struct tiny_rig *r, const struct model *m, const struct tiny_rig_config *c);

/* Feeds tokens[0..n) in steps of at most chunk tokens with every logits row
 * kept: logits (n, V) gets row i for token i. Returns 0 or the failing
 * fwd_step code. */
int64_t tiny_rig_feed(struct tiny_rig *r, const int32_t *tokens, int64_t n, int64_t chunk,
                      float *logits);

/* A fixed pseudo-random token stream. */
void tiny_tokens(int32_t *out, int64_t n, int64_t n_vocab, uint64_t seed);

/* Largest |a - b| over n values, and the largest |a| (for scale). */
double tiny_max_diff(const float *a, const float *b, int64_t n, double *max_abs);

#endif
