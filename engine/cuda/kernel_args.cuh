/*
 * kernel_args.cuh: the plain structs the attention kernels take (the step's
 * per-token metadata and one layer's arguments) and the host functions that
 * pack them. Which cells a token sees comes from kv_view_runs (kvcache.h),
 * called here on the host: the kernels walk the runs it returns and know
 * nothing of the ring, so the ring's arithmetic lives in one place for the
 * CPU backend, the CUDA backend and the emulation test. No CUDA header is
 * included here: include cuda_fp16.h (or an emulation of it) first, for
 * __half.
 */
#ifndef SS_CUDA_KERNEL_ARGS_CUH
#define SS_CUDA_KERNEL_ARGS_CUH

#include <stdint.h>
#include <string.h>

#ifndef restrict
#define SS_UNDEF_RESTRICT
#define restrict __restrict__ /* the C headers use C99's keyword */
#endif
extern "C" {
#include "../backend.h"
#include "../model.h"
}
#ifdef SS_UNDEF_RESTRICT
#undef restrict
#undef SS_UNDEF_RESTRICT
#endif

#define CUDA_ATT_SPLIT 128 /* keys per split-K block (fixed by key index) */
#define CUDA_ATT_MAXG 8    /* query heads per kv head */

/* One token of the step, as the kernels see it (packed on the host in
 * begin_step, copied to the device with the step's other metadata). */
struct cuda_tok {
    int64_t slot;      /* KV slot */
    int64_t cell;      /* cell its K/V go to */
    int64_t n_sinks;   /* kv_view: sink cells 0 .. n_sinks-1 */
    int64_t win_start; /* kv_view: window positions win_start .. +win_len-1 */
    int64_t win_len;
    /* kv_view_runs: visit index v (sinks, then the window in position order)
     * is the v-th cell of these runs; the kernels never see the ring */
    struct kv_run run[KV_VIEW_RUNS];
    int64_t pos_first; /* kv_seq: the sequence's first position (probe) */
    int32_t token;
    int32_t pad;
};

/* A run of consecutive tokens of one sequence handled by the prefill kernel. */
struct cuda_tile {
    int32_t first; /* token index of the first */
    int32_t count; /* <= the tile size the step was built with */
    /* the union of the tokens' windows, positions win_start .. +win_len-1
     * (win_len 0: no token has a window), and its cells as kv_view_runs
     * gives them (run[0] is empty: the sinks are read by cell) */
    int64_t win_start;
    int64_t win_len;
    struct kv_run run[KV_VIEW_RUNS];
};

/* Host side: fills token k's metadata from its sequence and view. */
static inline void cuda_tok_pack(struct cuda_tok *k, const struct kv_seq *s,
                                 const struct kv_view *v, int64_t slot, int64_t cell, int32_t token)
{
    memset(k, 0, sizeof *k);
    k->slot = slot;
    k->cell = cell;
    k->n_sinks = v->n_sinks;
    k->win_start = v->win_start;
    k->win_len = v->win_len;
    kv_view_runs(s, v, k->run);
    k->pos_first = s->pos_first;
    k->token = token;
}

/* Host side: the tile of count tokens from tok[first] (consecutive positions
 * of sequence s, packed by cuda_tok_pack). Their windows overlap, so their
 * union is one run of positions, at most W + count - 1 <= the ring long. */
static inline struct cuda_tile cuda_tile_pack(const struct cuda_tok *tok, const struct kv_seq *s,
                                              int32_t first, int32_t count)
{
    struct cuda_tile tl;
    memset(&tl, 0, sizeof tl);
    tl.first = first;
    tl.count = count;
    int64_t lo = INT64_MAX, hi = INT64_MIN;
    for (int32_t i = first; i < first + count; i++)
        if (tok[i].win_len > 0) {
            lo = tok[i].win_start < lo ? tok[i].win_start : lo;
            hi = tok[i].win_start + tok[i].win_len > hi ? tok[i].win_start + tok[i].win_len : hi;
        }
    struct kv_view u = {0, 0, 0, 0};
    if (lo < hi) {
        u.win_start = lo;
        u.win_len = hi - lo;
    }
    tl.win_start = u.win_start;
    tl.win_len = u.win_len;
    kv_view_runs(s, &u, tl.run);
    return tl;
}

/* Element offsets into a K or V buffer, [slot][layer][kv_head][cell][Dh]
 * (kv_geometry_offset), for one layer: each layer has its own number of
 * cells (kv_geometry_layer_cells: a local layer's ring is shorter). */
struct cuda_kv_geo {
    int64_t cells;     /* of this layer, per slot and head */
    int64_t per_head;  /* cells * Dh */
    int64_t layer_off; /* where this layer starts inside a slot */
    int64_t per_slot;  /* one slot, all layers */
};

/* Host side: layer's offsets in geometry g, from kv_geometry_offset itself. */
static inline struct cuda_kv_geo cuda_kv_geo_for(const struct kv_geometry *g, int layer)
{
    struct cuda_kv_geo k;
    k.cells = kv_geometry_layer_cells(g, layer);
    k.per_head = k.cells * g->head_dim;
    k.layer_off = (int64_t)kv_geometry_offset(g, 0, layer, 0, 0);
    k.per_slot = (int64_t)kv_geometry_offset(g, 1, 0, 0, 0);
    return k;
}

/* Everything the attention kernels of one layer need. */
struct cuda_attn_args {
    const float *q, *qc; /* (T, H*Dh) */
    float *out;          /* (T, H*Dh) */
    __half *out_h;       /* (T, H*Dh) f16 copy for the next GEMM */
    float *stats;        /* (T, H, 2): final (max, sum) per query head, for the probe */
    const void *k, *v;   /* KV buffers (f16 or f32) */
    const struct cuda_tok *tok;
    const int32_t *dec; /* decode tokens: token indices */
    const struct cuda_tile *tiles;
    float *part;              /* split partial states */
    const float *sinks;       /* (H) sink logits on the device, or NULL */
    const float *sinks_v;     /* (H, Dh) sink values on the device (sink only), or NULL: zero */
    const float *sink_logits; /* (T, H) per-token sink logits (sink keys), or NULL: sinks */
    struct cuda_kv_geo geo;   /* this layer's */
    int layer;
    int norm; /* enum model_normalizer */
    int H, Hkv, G, Dh;
    int n_split;     /* key splits per (token, kv head) */
    int tile_tokens; /* tokens per prefill tile */
    float scale;     /* on q.k: the model's attn_scale (1/sqrt(Dh) unless the file says) */
};

#endif
