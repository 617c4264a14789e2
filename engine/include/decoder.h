/*
 * decoder.h: the decoder, public: one model file's weights, tokenizer,
 * backend and forward state behind one opaque type, driven on the calling
 * thread. The engine thread (engine.h) runs its scheduler on one; the offline
 * commands (run, perplexity, probe, calibrate) run on one directly.
 *
 * A decoder holds n_slots KV slots. A sequence takes a slot, a policy and a
 * window; decoder_step feeds tokens to any number of sequences in one batched
 * forward step and leaves their logits in decoder_logits. An observer set
 * with decoder_set_observer sees each layer's attention as the step runs
 * (what the sink probe and the sink calibration measure).
 *
 * Not thread-safe: one thread drives a decoder at a time. Nothing here
 * mentions tensors of the backend, HTTP or JSON.
 */
#ifndef SS_DECODER_H
#define SS_DECODER_H

#include <stddef.h>
#include <stdint.h>

#include "engine.h"

struct decoder; /* opaque */

#define DECODER_DEFAULT_SINKS 4 /* the sinks `auto` pins for a softmax model (StreamingLLM) */
#define DECODER_MAX_SINKS 64    /* the most sink cells a slot may have */

struct decoder_config {
    const char *model_path;
    enum engine_backend backend;
    int n_threads; /* CPU backend threads */
    int no_mmap;   /* read the weights into memory instead of mapping the file */
    /* upper bounds, which the decoder caps at what a step can use (a chunk at
     * the model's context, a step at n_slots chunks; decoder_info says what
     * it took) */
    int64_t max_tokens; /* tokens in one step, all sequences together */
    int64_t chunk;      /* tokens one sequence may take in one step (KV room past its window) */
    int64_t n_sinks;    /* sink cells per slot (the most any sinks:N may pin) */
    int64_t window;     /* window cells per slot (<= 0 or past the model's context: the context) */
    int64_t n_slots;
    enum engine_kv_dtype kv_dtype;
};

/* Opens the model file, its tokenizer, the backend and the KV slots. Returns
 * 0, or a negative errno with one line in err (*out NULL). Whether the model
 * file is at fault: engine_error_is_model(rc). */
int decoder_open(struct decoder **out, const struct decoder_config *cfg, char *err, size_t err_len);
void decoder_close(struct decoder *d); /* NULL is fine */

struct decoder_info {
    const char *name;       /* general.name (valid until decoder_close) */
    const char *arch;       /* "llama" */
    const char *normalizer; /* softmax | softmax1 | sink | softpick */
    int needs_sinks;        /* 1 for softmax: `auto` pins sinks, else it evicts freely */
    int n_layer, n_head, n_head_kv, head_dim;
    int64_t n_vocab, n_ctx_train;
    int64_t window;           /* window cells per slot, as resolved at open */
    int64_t n_sinks;          /* sink cells per slot */
    int64_t max_tokens;       /* tokens in one step, as capped at open */
    size_t kv_bytes_per_slot; /* K and V of one slot */
    int32_t bos, eos;
    int add_bos; /* the tokenizer prepends BOS to a fresh text */
};
void decoder_get_info(const struct decoder *d, struct decoder_info *out);

/* ---- tokens ---------------------------------------------------------------- */

/* Tokenizes text[0..len) into out (cap ids): BOS first when add_bos and the
 * model has one; parse_special recognizes <|im_start|> etc. Returns the count
 * (which may exceed cap: then only cap were written) or a negative errno. */
int64_t decoder_tokenize(const struct decoder *d, const char *text, size_t len, int add_bos,
                         int parse_special, int32_t *out, int64_t cap);
int decoder_token_is_eog(const struct decoder *d, int32_t id);
/* 1 for a CONTROL token, whose text output leaves out by default. */
int decoder_token_is_control(const struct decoder *d, int32_t id);
/* Streams token text: holds back the bytes of a UTF-8 character split across
 * tokens. out needs room for the token's bytes + 4 (3 per byte when they are
 * not UTF-8). Returns the bytes written. */
struct decoder_text {
    uint8_t pend[4];
    int n_pend;
};
int64_t decoder_text_push(const struct decoder *d, struct decoder_text *s, int32_t id, char *out,
                          size_t cap);
/* A tail held back at the end of a stream, as U+FFFD. */
int64_t decoder_text_flush(struct decoder_text *s, char *out, size_t cap);

/* ---- sequences and steps --------------------------------------------------- */

/* Takes a free slot for a new sequence at position 0 with policy p (`auto`
 * resolves by the normalizer; recompute is treated as dense: the caller
 * re-runs the window) and a window of window cells (<= 0: the slot's).
 * Returns the slot (>= 0), -EBUSY with none free, -EINVAL when the policy
 * needs more sinks than a slot has. */
int64_t decoder_seq_open(struct decoder *d, const struct engine_policy *p, int64_t window);
/* Empties a sequence back to position 0, same slot and policy. */
void decoder_seq_reset(struct decoder *d, int64_t seq);
void decoder_seq_close(struct decoder *d, int64_t seq);
/* The policy a sequence runs, resolved (e.g. `auto` -> "sinks:4"). */
void decoder_seq_policy_name(const struct decoder *d, int64_t seq, char *buf, size_t cap);

enum decoder_logits { DECODER_LOGITS_NONE = 0, DECODER_LOGITS_LAST, DECODER_LOGITS_ALL };
struct decoder_input { /* one sequence's tokens in one step */
    int64_t seq;
    const int32_t *tokens;
    int64_t n;
    enum decoder_logits logits;
};
/* One batched forward step: appends every input's tokens to its sequence.
 * Returns the number of logits rows written (decoder_logits, in input order:
 * LAST one row, ALL n rows), -EINVAL for more than max_tokens tokens or a bad
 * token id, -ENOSPC when a sequence cannot take its tokens (a dense window is
 * full), -EIO when the backend failed (sequences are then unchanged). */
int64_t decoder_step(struct decoder *d, const struct decoder_input *in, int n_in);
/* (rows, n_vocab) floats of the last step; valid until the next step. */
float *decoder_logits(struct decoder *d);
/* -log p(token) under one row of logits (softmax over the vocabulary, in
 * double: the perplexity command's score). */
double decoder_nll(const struct decoder *d, const float *row, int32_t token);

/* ---- sampling -------------------------------------------------------------- */

struct decoder_sampler; /* opaque: one sequence's sampler (penalty window, rng) */
/* Returns 0, -EINVAL for out-of-range parameters, or -ENOMEM. */
int decoder_sampler_new(struct decoder_sampler **out, const struct engine_sampling *p,
                        int64_t n_vocab);
void decoder_sampler_free(struct decoder_sampler *s); /* NULL is fine */
/* Records a prompt or generated token for the penalties. */
void decoder_sampler_accept(struct decoder_sampler *s, int32_t token);
/* Picks the next token from a row of logits (modifies it: penalties, temperature). */
int32_t decoder_sampler_sample(struct decoder_sampler *s, float *logits);

/* ---- the observer ---------------------------------------------------------- */

#define DECODER_FIRST_K 16 /* first positions whose attention weights an observer sees */

enum decoder_observe {
    DECODER_OBSERVE_FIRST = 1u, /* attention weights on each sequence's first DECODER_FIRST_K
                                   positions (any backend) */
    DECODER_OBSERVE_QK = 2u,    /* the layer's q and k after RoPE (host-memory backends: cpu) */
};

/* One layer of one step, as the observer sees it. Rows are the step's tokens
 * in input order (the inputs' tokens one after another). */
struct decoder_layer_view {
    int layer;
    int64_t T;          /* tokens in this step */
    const int64_t *pos; /* [T] absolute positions */
    int n_head, n_head_kv, head_dim;
    /* (T, H, DECODER_FIRST_K): the weight row t's head h puts on its
     * sequence's first positions (0 for a position no longer cached); NULL
     * unless DECODER_OBSERVE_FIRST */
    const float *first;
    /* (T, H*Dh) queries rotated at their absolute positions and (T, Hkv*Dh)
     * keys rotated at theirs, exactly what attention scored (before the KV
     * cache's storage type); NULL unless DECODER_OBSERVE_QK */
    const float *q;
    const float *k;
    /* how the layer scores: q.k times scale, over the newest window positions
     * up to the query's own (a local layer's sliding window; 0: every one) */
    float scale;
    int64_t window;
};

struct decoder_observer {
    unsigned what; /* enum decoder_observe bits */
    /* Called once per layer, in layer order, for every later step: right after
     * the layer's attention when QK is asked, else after the step finished.
     * The view is valid during the call only. */
    void (*on_layer)(void *arg, const struct decoder_layer_view *v);
    void *arg;
};
/* Sets (obs) or clears (NULL) the observer. While FIRST is asked, steps take
 * the backend's slower per-head attention path; QK alone changes no result
 * (test_decoder_observer checks the logits bit for bit). Returns 0, -ENOTSUP
 * for QK on a backend whose activations are not in host memory (cuda), or
 * -ENOMEM. */
int decoder_set_observer(struct decoder *d, const struct decoder_observer *obs);

/* ---- the sink probe -------------------------------------------------------- */

#define DECODER_PROBE_MIN_CTX 64      /* only queries at this position or later count */
#define DECODER_PROBE_SINK_MASS 0.3f  /* a sink head puts more than this on position 0 */
#define DECODER_PROBE_WARN_RATE 0.10f /* above this sink rate a free-evicting model is warned */

/* Per layer and head, the mean attention mass that queries at position >=
 * DECODER_PROBE_MIN_CTX put on the sequence's first 1, 4 and 16 positions
 * (dense attention, one sequence). A sink head's mean first-position mass is
 * above DECODER_PROBE_SINK_MASS; the sink rate is the share of such heads. */
struct decoder_probe {
    int n_layer, n_head;
    int64_t n_queries; /* queries averaged per head */
    float *mass1;      /* [L*H] */
    float *mass4;      /* [L*H] */
    float *mass16;     /* [L*H] */
    float sink_rate;
};
/* Runs ids[0..n) through a free slot (dense, steps of at most the slot's
 * chunk) with an observer, and fills out (caller frees with
 * decoder_probe_free). Returns 0, -EINVAL when n <= DECODER_PROBE_MIN_CTX or
 * n is past the window, -EBUSY with no free slot, -ENOMEM, or a step's error.
 * Clears the decoder's observer (the probe is one). */
int decoder_probe_run(struct decoder *d, const int32_t *ids, int64_t n, struct decoder_probe *out);
void decoder_probe_free(struct decoder_probe *p);
/* A built-in public-domain English text (Genesis 1, King James Version). */
extern const char decoder_probe_text[];

/* The load-time sink check: the probe on decoder_probe_text. The one policy
 * for warnings: a model declared softmax1, sink or softpick (`auto` evicts
 * freely) whose sink rate is above DECODER_PROBE_WARN_RATE gets warn = 1. */
struct decoder_sink_check {
    int ran;          /* 0: the probe could not run (window or slots too small) */
    float sink_rate;  /* share of sink heads */
    float first_mass; /* mean first-position mass over all heads */
    int warn;
};
void decoder_sink_check(struct decoder *d, struct decoder_sink_check *out);

#endif
