/*
 * kernel_args.cuh: the plain structs the attention kernels take (the step's
 * per-token metadata and one layer's arguments). No CUDA header is included
 * here: include cuda_fp16.h (or an emulation of it) first, for __half.
 */
#ifndef SS_CUDA_KERNEL_ARGS_CUH
#define SS_CUDA_KERNEL_ARGS_CUH

#include <stdint.h>

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
    int64_t ring; /* kv_seq: window position p lives in cell sink_base + p % ring */
    int64_t sink_base;
    int64_t pos_first; /* kv_seq: the sequence's first position (probe) */
    int32_t token;
    int32_t pad;
};

/* A run of consecutive tokens of one sequence handled by the prefill kernel. */
struct cuda_tile {
    int32_t first; /* token index of the first */
    int32_t count; /* <= the tile size the step was built with */
};

/* Element offsets into a K or V buffer, [slot][layer][kv_head][cell][Dh]
 * (kv_geometry_offset). */
struct cuda_kv_geo {
    int64_t cells;    /* per slot and head */
    int64_t per_head; /* cells * Dh */
    int64_t per_layer;
    int64_t per_slot;
};

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
    float *part;        /* split partial states */
    const float *sinks; /* (H) sink logits on the device, or NULL */
    struct cuda_kv_geo geo;
    int layer;
    int norm; /* enum model_normalizer */
    int H, Hkv, G, Dh;
    int n_split;     /* key splits per (token, kv head) */
    int tile_tokens; /* tokens per prefill tile */
    float scale;     /* 1/sqrt(Dh) */
};

#endif
