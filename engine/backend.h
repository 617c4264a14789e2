/*
 * backend.h: the coarse operations forward.c is written against. A backend
 * is a table of function pointers plus its context; it implements every op or
 * it is not a backend (no optional ops, no partial offload). Activation
 * pointers are the backend's own memory (host on the CPU, device on CUDA):
 * forward.c passes them around and never dereferences them.
 *
 * One step processes a batch of T tokens from one or more sequences (decode
 * tokens and prefill chunks together). begin_step hands the backend the
 * batch's host-side metadata once; every op afterwards refers to it.
 */
#ifndef SS_BACKEND_H
#define SS_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "kvcache.h"
#include "model.h"

#define BACKEND_PROBE_K 16

struct fwd_batch {
    int64_t T;                       /* tokens in this step */
    const int32_t *tokens;           /* [T] */
    const int64_t *pos;              /* [T] absolute positions */
    const int64_t *slot;             /* [T] KV slot of the token's sequence */
    const int64_t *cell;             /* [T] cell the token's K/V are stored in */
    const struct kv_view *view;      /* [T] what each token's query sees */
    const struct kv_seq *const *seq; /* [T] the token's sequence (for cell lookups) */
    /* local layers (kv_geometry.swa_period > 0; NULL otherwise): the cell and
     * the view of each token in the local layers' own rings (kv_seq_local) */
    const int64_t *cell_local;        /* [T] */
    const struct kv_view *view_local; /* [T] */
    int64_t n_out;                    /* rows whose logits are wanted */
    const int64_t *out_rows;          /* [n_out] token indices */
};

struct backend_acts { /* activation buffers, sized for max_tokens rows */
    float *x;         /* (T, D) residual stream */
    float *xb;        /* (T, D) normed input / attention output projection */
    float *xb2;       /* (T, D) */
    float *q;         /* (T, H*Dh) query rotated at its absolute position */
    float *qc;        /* (T, H*Dh) query rotated at its in-cache position (sink keys) */
    float *k;         /* (T, Hkv*Dh) */
    float *v;         /* (T, Hkv*Dh) */
    float *att;       /* (T, H*Dh) attention output */
    float *hb;        /* (T, F) gate */
    float *hb2;       /* (T, F) up */
    float *xo;        /* (n_out, D) rows gathered for the output head */
    float *logits;    /* (max_tokens, V) HOST rows the logits op writes (pinned on CUDA) */
};

struct backend;

#define BACKEND_SHARED_MAX 3

/* What follows a product in backend_ops.product. */
enum backend_then {
    BACKEND_THEN_NONE,
    BACKEND_THEN_SWIGLU, /* y[0] = silu(y[0]) * y[1] (gate, up: n = 2, same shape) */
    BACKEND_THEN_ADD,    /* res += y[0] (a projection back into the residual stream: n = 1) */
};

/* in = norm ? rmsnorm(x, norm), also written to xn : x;
 * y[i] = in W[i]^T for i < n (weights that take the same input); then. */
struct backend_product {
    const float *x;            /* (rows, W[i].ne0) */
    const struct tensor *norm; /* RMSNorm weight, or NULL */
    float *xn;                 /* (rows, ne0): the normed input (with norm) */
    int n;                     /* 1 .. BACKEND_SHARED_MAX */
    const struct tensor *W[BACKEND_SHARED_MAX];
    float *y[BACKEND_SHARED_MAX]; /* (rows, W[i].ne1) */
    enum backend_then then;
    float *res; /* (rows, W[0].ne1): BACKEND_THEN_ADD's residual stream */
};

struct backend_ops {
    const char *name;
    /* Frees everything the backend owns. */
    void (*free)(struct backend *b);
    /* KV storage for a pool geometry; called once. */
    int (*kv_alloc)(struct backend *b, const struct kv_geometry *g);
    /* Copies the batch metadata for this step (positions, cells, views). */
    int (*begin_step)(struct backend *b, const struct fwd_batch *batch);
    /* x[t] = embedding row of tokens[t]                          x: (T, D) */
    void (*embed)(struct backend *b, float *x);
    /* out = x / rms(x) * w, each row of w.ne0 values: (rows, D), or per head
     * (rows = T*H, w.ne0 = Dh) for Gemma's query and key norms */
    void (*rmsnorm)(struct backend *b, const float *x, const struct tensor *w, float *out,
                    int64_t rows);
    /* y = x W^T                                   x: (rows, W.ne0), y: (rows, W.ne1) */
    void (*matmul)(struct backend *b, const struct tensor *W, const float *x, float *y,
                   int64_t rows);
    /* q -> q rotated at pos, qc rotated at view.pos_cache; k rotated at pos (in
     * place), with layer's RoPE base (Gemma's local layers have their own) and
     * the model's pair layout (adjacent, or NEOX halves) */
    void (*rope)(struct backend *b, int layer, float *q, float *qc, float *k);
    /* stores k, v of every token into its cell of layer l */
    void (*kv_store)(struct backend *b, int layer, const float *k, const float *v);
    /* att[t, h] = normalizer-weighted sum of V over the keys token t sees,
     * sink keys scored with qc, window keys with q; sinks[h] the sink logit.
     * probe: NULL, or (T, H, BACKEND_PROBE_K) host floats that get the weights
     * token t's head h puts on its sequence's first BACKEND_PROBE_K positions
     * (0 for positions no longer in the cache) */
    void (*attention)(struct backend *b, int layer, const float *q, const float *qc,
                      const float *sinks, enum model_normalizer norm, float *att, float *probe);
    /* hb = silu(hb) * hb2                                          (T, F) */
    void (*swiglu)(struct backend *b, float *hb, const float *hb2, int64_t rows);
    /* x += y                                                       (rows, D) */
    void (*add)(struct backend *b, float *x, const float *y, int64_t rows);
    /* xo[i] = x[out_rows[i]]                                       (n_out, D) */
    void (*gather)(struct backend *b, const float *x, float *xo);
    /* host_logits (n_out, V) = xo W_out^T, copied to host memory */
    void (*logits)(struct backend *b, const struct tensor *W, const float *xo, float *host_logits);
    /* waits for the step; returns 0 or -EIO if anything in it failed */
    int (*sync)(struct backend *b);
    /* Synchronous copies of n floats between host memory and activation
     * memory, for tests and tools; only between steps (after sync). 0 or -EIO. */
    int (*copy_in)(struct backend *b, float *dst, const float *host_src, int64_t n);
    int (*copy_out)(struct backend *b, float *host_dst, const float *src, int64_t n);
    /* Session snapshots: copies cells cell0 .. cell0+n-1 of every kv head of
     * one layer of one slot between KV storage and host memory, in the
     * storage dtype (f16 or f32), bit for bit. Cells are the layer's own
     * (kv_geometry_layer_cells: a local layer has a ring of its own). Host
     * layout, for K and for V alike: [Hkv][host_cells][Dh], the run going to
     * (coming from) cells 0 .. n-1 of each head's row of the host array. Only
     * between steps. 0, -EINVAL (outside the slot or layer, or n >
     * host_cells), or -EIO. */
    int (*kv_export)(struct backend *b, int64_t slot, int layer, int64_t cell0, int64_t n,
                     void *host_k, void *host_v, int64_t host_cells);
    int (*kv_import)(struct backend *b, int64_t slot, int layer, int64_t cell0, int64_t n,
                     const void *host_k, const void *host_v, int64_t host_cells);
    /* Gemma 3's own element-wise ops */
    /* hb = gelu_tanh(hb) * hb2 (GeGLU)                             (T, F) */
    void (*geglu)(struct backend *b, float *hb, const float *hb2, int64_t rows);
    /* x *= s                                                       (rows, D) */
    void (*scale)(struct backend *b, float *x, float s, int64_t rows);
    /* y[i] = x W[i]^T for i < n (n <= BACKEND_SHARED_MAX), weights that take
     * the same input (Q, K and V; gate and up): the values of n matmul calls,
     * bit for bit, with x prepared once and the products run as one. NULL
     * where a backend has no such op (forward.c then makes the n calls). */
    void (*matmul_shared)(struct backend *b, const struct tensor *const *W, float *const *y, int n,
                          const float *x, int64_t rows);
    /* Host work between steps on the backend's threads: fn(arg, i, n) once
     * for every i < n, on any thread, returning when all are done; parts
     * may be long and uneven. NULL where a backend has no host threads (the
     * caller then runs them). */
    void (*run_parts)(struct backend *b, void (*fn)(void *arg, int i, int n), void *arg, int n);
    /* One projection with the element-wise ops around it (struct
     * backend_product): the values of rmsnorm, matmul_shared (or matmul),
     * then swiglu or add, called one after another, bit for bit, in one pass
     * over the rows where the backend can. NULL where a backend has no such
     * op (forward.c then makes those calls). */
    void (*product)(struct backend *b, const struct backend_product *p, int64_t rows);
    /* rope, then kv_store, as one op: the values of the two calls, bit for
     * bit. NULL where a backend has no such op (forward.c then makes the two
     * calls). */
    void (*rope_store)(struct backend *b, int layer, float *q, float *qc, float *k, const float *v);
};

struct backend {
    const struct backend_ops *ops;
    void *ctx;
    struct backend_acts acts;
    const struct model *model;
    int64_t max_tokens;
};

struct backend_cpu_config {
    int n_threads;
    int64_t max_tokens;   /* largest T of a step */
    int reference_matmul; /* 1: f32 products with dequantized weights (slow; tests) */
};
/* Creates the CPU backend for model m. Returns 0 or -errno with a message. */
int backend_cpu_init(struct backend *b, const struct model *m, const struct backend_cpu_config *c,
                     char *err, size_t err_len);

/* CUDA backend (engine/cuda/): weights dequantized once to FP16 on the device,
 * projections through cuBLAS, fused attention kernels, CUDA graphs for decode
 * steps. Built when CMake finds nvcc; otherwise backend_cuda_init says so. */
struct backend_cuda_config {
    int device;         /* CUDA device ordinal */
    int64_t max_tokens; /* largest T of a step */
    int use_graphs;     /* 1: replay decode steps as CUDA graphs (default in backend_init) */
};
int backend_cuda_init(struct backend *b, const struct model *m, const struct backend_cuda_config *c,
                      char *err, size_t err_len);
/* CUDA devices usable by this build: 0 without CUDA support or without a GPU. */
int backend_cuda_device_count(void);
/* Benchmarks: device-to-device cudaMemcpy of `bytes`, median of reps; returns
 * the memory traffic (bytes read + bytes written) per second in GB/s, or -1. */
double backend_cuda_copy_gbps(int device, size_t bytes, int reps);

/* Picking a backend by name (--backend): "cpu" or "cuda". */
enum backend_kind { BACKEND_CPU = 0, BACKEND_CUDA };
int backend_kind_parse(const char *s, enum backend_kind *out);
const char *backend_kind_name(enum backend_kind k);
struct backend_config {
    enum backend_kind kind;
    int n_threads;        /* CPU */
    int64_t max_tokens;   /* largest T of a step */
    int reference_matmul; /* CPU: f32 products (tests) */
    int cuda_device;      /* CUDA */
};
int backend_init(struct backend *b, const struct model *m, const struct backend_config *c,
                 char *err, size_t err_len);

#endif
