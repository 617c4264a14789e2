/*
 * model.h: a Llama- or Gemma 3-architecture model loaded from a GGUF file: hyperparameters
 * (the blueprint, never changes) and weights (views into the read-only mmap).
 * Internal to engine/. Every tensor's type and shape is checked at load, so
 * the forward pass can trust them.
 *
 * A mapped file that shrinks under us (truncated, or overwritten in place)
 * turns the next read of a weight into SIGBUS. While a file is mapped, a
 * process-wide SIGBUS handler (installed once) turns a fault inside one of
 * the mapped models into one line on stderr and _exit(MODEL_EXIT_CHANGED)
 * instead of a bare crash; faults elsewhere go to the previous handler. With
 * MODEL_NO_MMAP the file is read into anonymous memory and can change freely.
 */
#ifndef SS_MODEL_H
#define SS_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "gguf.h"

enum model_normalizer {
    MODEL_NORM_SOFTMAX = 0, /* vanilla: e^z / Σ e^z */
    MODEL_NORM_SOFTMAX1,    /* off-by-one: e^z / (1 + Σ e^z) */
    MODEL_NORM_SINK,        /* learned per-head logit s_h: e^z / (e^s_h + Σ e^z) */
    MODEL_NORM_SOFTPICK,    /* rectified: relu(e^z - 1) / (Σ |e^z - 1| + eps) */
};
const char *model_normalizer_name(enum model_normalizer n);

struct tensor { /* a view of a 2-D weight: ne1 rows of ne0 values */
    const void *data;
    int type;    /* enum qtype */
    int64_t ne0; /* values per row (the contiguous dimension) */
    int64_t ne1; /* rows */
    size_t row_bytes;
};

enum model_arch {
    MODEL_ARCH_LLAMA = 0, /* Llama, SmolLM2, TinyLlama */
    MODEL_ARCH_GEMMA3,    /* Gemma 3 (text): sandwich norms, q/k norms, local + global layers */
};

struct model_hparams {
    char arch[32];
    enum model_arch arch_kind;
    char name[128];
    int n_layer;         /* L */
    int n_embd;          /* D */
    int n_head;          /* H */
    int n_head_kv;       /* Hkv */
    int head_dim;        /* Dh */
    int n_ff;            /* F */
    int64_t n_vocab;     /* V */
    int64_t n_ctx_train; /* context length the model was trained with */
    float norm_eps;
    double rope_base;
    int rope_dim;  /* rotated dims per head (== Dh for llama) */
    int rope_neox; /* 1: rotate pairs (i, i + rope_dim/2) (Gemma); 0: adjacent pairs (GGUF
                      Llama files, whose converter permuted Q and K) */
    enum model_normalizer normalizer;
    int file_type; /* dominant weight type, for messages */
    /* Gemma 3 (zero / defaults for llama) */
    int n_swa;              /* sliding window of the local layers, in tokens (0: none) */
    int swa_period;         /* layer l is global iff (l + 1) % swa_period == 0 (0: all global) */
    double rope_base_local; /* RoPE base of the local layers (rope_base: the global ones) */
    float attn_scale;       /* query scale before q.k: 1/sqrt(Dh) unless the file says */
    float final_softcap;    /* logits = c * tanh(logits / c); 0: none */
};

/* 1 if layer l attends over a sliding window of hp->n_swa tokens (Gemma 3's
 * local layers), 0 if over the whole context the KV policy keeps. */
static inline int model_layer_is_local(const struct model_hparams *hp, int l)
{
    return hp->n_swa > 0 && hp->swa_period > 0 && (l + 1) % hp->swa_period != 0;
}

struct model_layer {
    struct tensor attn_norm; /* (D) f32 */
    struct tensor wq;        /* (H*Dh, D) */
    struct tensor wk;        /* (Hkv*Dh, D) */
    struct tensor wv;        /* (Hkv*Dh, D) */
    struct tensor wo;        /* (D, H*Dh) */
    struct tensor ffn_norm;  /* (D) f32 */
    struct tensor w_gate;    /* (F, D) */
    struct tensor w_up;      /* (F, D) */
    struct tensor w_down;    /* (D, F) */
    const float *attn_sinks; /* (H) per-head sink logits, NULL if none (copied, aligned) */
    /* (H, Dh) f32 per-query-head sink values (blk.N.attn_sinks_v, copied, aligned): the
     * sink normalizer's virtual key carries v_h; data NULL if the file has none (zero) */
    struct tensor attn_sinks_v;
    /* (Hkv, Dh) f32 per-kv-head sink keys (blk.N.attn_sinks_k, copied, aligned): the
     * sink logit of query head h at position p is s_h + attn_scale * q_{p,h} . k_g,
     * q before RoPE, g = h's kv head (the sink sits at distance 0 from every
     * query); data NULL if the file has none (the logit is s_h) */
    struct tensor attn_sinks_k;
    /* Gemma 3 only (data NULL otherwise); norms as stored, 1 + w already folded in */
    struct tensor attn_q_norm;    /* (Dh) f32: RMSNorm of each query head before RoPE */
    struct tensor attn_k_norm;    /* (Dh) f32: the same for each key head */
    struct tensor post_attn_norm; /* (D) f32: on the attention output, before the residual */
    struct tensor post_ffw_norm;  /* (D) f32: on the FFN output, before the residual */
};

struct model_weights {
    struct tensor tok_embd;     /* (V, D) */
    struct tensor output_norm;  /* (D) f32 */
    struct tensor output;       /* (V, D); == tok_embd when tied */
    struct model_layer *layers; /* [L] */
};

struct model {
    struct model_hparams hp;
    struct model_weights w;
    struct gguf_file gguf;
    float *sinks_mem;   /* [L*H] attn_sinks copies (or all zeros for softmax1) */
    float *sinks_v_mem; /* [L*H*Dh] attn_sinks_v copies, NULL if the file has none */
    float *sinks_k_mem; /* [L*Hkv*Dh] attn_sinks_k copies, NULL if the file has none */
    void *map;          /* the file's bytes: a mapping of it, or an anonymous copy (no_mmap) */
    size_t map_len;
    int fd;
    int mapped; /* map is a mapping of the file (registered with the SIGBUS guard) */
};

/* Loads the model at path. On failure returns a negative errno, fills err with
 * one line and leaves m freed. */
int model_load(struct model *m, const char *path, char *err, size_t err_len);
/* The largest head dimension the attention kernels take (CPU key tiles and
 * CUDA shared memory are sized for it); a larger one is a load error. */
#define MODEL_MAX_HEAD_DIM 256
/* The process exit code of the SIGBUS guard: a signal handler cannot return
 * an error, so the engine names this one code itself. It is the program's
 * code for a bad model file (cmd/cmd.h CMD_EXIT_MODEL; test_engine_model_file
 * checks the two agree). */
#define MODEL_EXIT_CHANGED 3
#define MODEL_NO_MMAP 1u /* read the file into memory instead of mapping it */
/* model_load with flags (MODEL_NO_MMAP). */
int model_open(struct model *m, const char *path, unsigned flags, char *err, size_t err_len);
/* Safe on a zeroed or half-built model. Does not free m itself. */
void model_free(struct model *m);

#endif
