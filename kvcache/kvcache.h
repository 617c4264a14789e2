/*
 * kvcache.h: per-sequence KV memory bookkeeping. Knows nothing above it: no
 * tensors, no model, no threads. The storage itself belongs to the backend
 * (host memory on the CPU, device memory on CUDA); this module decides which
 * cell a token's key and value live in and which cells a query may see.
 *
 * One sequence owns one slot of the pool. A slot has S_max pinned sink cells
 * followed by a ring of R = W_max + C_max cells (W_max the largest window, C_max
 * the largest prefill chunk):
 *
 *     cell:  0 .. S-1          S_max .. S_max+R-1
 *           [ sinks (pinned) ][ ring: token at position p -> cell S_max + p mod R ]
 *
 * A query at absolute position p of a sequence that started at position p0
 * sees (StreamingLLM, "rolling KV cache with attention sinks"):
 *   - the sinks: the first S tokens of the sequence, positions p0 .. p0+S-1
 *     (only those <= p);
 *   - the window: positions max(p0+S, p-W+1) .. p, the last W tokens with p
 *     itself, a contiguous run.
 * So at most S+W keys, whatever p is. The ring holds W+C cells so that
 * storing a chunk of C new tokens never overwrites a key that the chunk's own
 * first query still needs.
 *
 * Positions (DESIGN.md, "Attention, positions and the window"): every key is
 * stored rotated at its absolute position and never re-rotated. Window keys are
 * scored with the query rotated at its absolute position p (true distances;
 * the window is contiguous). Sink keys are scored with the query rotated at
 * p0 + its position inside the cache, qc = n_sinks_visible + (p - win_start),
 * so a sink is never farther than S+W from the query, as StreamingLLM
 * measures distances inside the cache.
 *
 * All sizes, offsets and positions are 64-bit.
 */
#ifndef SS_KVCACHE_H
#define SS_KVCACHE_H

#include <stddef.h>
#include <stdint.h>

enum kv_policy_kind {
    KV_POLICY_AUTO = 0,  /* by the model's normalizer: softmax -> sinks:4, else window */
    KV_POLICY_WINDOW,    /* pin nothing: pure sliding window */
    KV_POLICY_SINKS,     /* pin the first n_sinks tokens, slide the rest */
    KV_POLICY_DENSE,     /* no eviction: refuse past the window (the context length) */
    KV_POLICY_RECOMPUTE, /* evaluation oracle: re-run the window from scratch every token */
};

struct kv_policy {
    enum kv_policy_kind kind;
    int64_t n_sinks; /* for KV_POLICY_SINKS */
};

#define KV_DEFAULT_SINKS 4 /* StreamingLLM's four attention sinks */
#define KV_MAX_SINKS 64

/* Parses "auto", "window", "sinks:N", "dense", "recompute". Returns 0 or -EINVAL. */
int kv_policy_parse(const char *s, struct kv_policy *out);
/* Writes the canonical name ("sinks:4") into buf. */
void kv_policy_name(const struct kv_policy *p, char *buf, size_t cap);
/* Resolves auto for a model: vanilla softmax (needs_sinks = 1) pins
 * KV_DEFAULT_SINKS; softmax1 / sink / softpick (needs_sinks = 0) evict freely. */
struct kv_policy kv_policy_resolve(struct kv_policy p, int needs_sinks);
/* Number of pinned sinks the resolved policy keeps. */
int64_t kv_policy_sinks(const struct kv_policy *p);

/* How a K or V row (head_dim values) is stored. f16 and f32 hold each value;
 * q8_0 holds each run of 32 values as one Q8_0 block (engine/quant.h: an f16
 * scale d and 32 int8 q, x = d * q; 34 bytes), so a row is head_dim / 32
 * blocks, 1.0625 bytes a value against f16's 2. q8_0 needs head_dim to be a
 * multiple of 32. */
enum kv_dtype { KV_DTYPE_F16 = 0, KV_DTYPE_F32 = 1, KV_DTYPE_Q8_0 = 2 };
#define KV_Q8_BLOCK 32       /* values per Q8_0 block */
#define KV_Q8_BLOCK_BYTES 34 /* f16 scale + 32 int8 */

/* Bytes of one row of head_dim values stored as t; 0 if t is unknown or
 * head_dim does not fit it (q8_0 and head_dim not a multiple of 32). */
size_t kv_dtype_row_bytes(enum kv_dtype t, int head_dim);
/* "f16", "f32", "q8_0"; "?" for anything else. */
const char *kv_dtype_name(enum kv_dtype t);
/* Parses a kv_dtype_name. Returns 0 or -EINVAL. */
int kv_dtype_parse(const char *s, enum kv_dtype *out);

struct kv_geometry {
    int n_layer;     /* L */
    int n_kv_head;   /* Hkv */
    int head_dim;    /* Dh */
    int64_t n_sinks; /* S_max: pinned cells per slot */
    int64_t window;  /* W_max */
    int64_t chunk;   /* C_max: most tokens one step may add to a sequence */
    int64_t n_slots; /* sequences that can be resident at once */
    enum kv_dtype dtype;
    /* Local layers (a model's own sliding-window layers, as Gemma 3's). 0: every
     * layer is global. Else layer l is local iff (l + 1) % swa_period != 0. A
     * local layer's window is part of the model, not of the policy: it keeps
     * no sinks and exactly the last swa_window positions, in a ring of its own
     * of swa_window + chunk cells from cell 0, whatever the sequence's policy.
     * Global layers follow the policy (S_max + W_max + C_max cells). */
    int swa_period;
    int64_t swa_window;
};

/* 1 if layer l is local (see swa_period). */
int kv_geometry_layer_is_local(const struct kv_geometry *g, int layer);
/* Cells per slot of a global layer: S_max + W_max + C_max. */
int64_t kv_geometry_cells(const struct kv_geometry *g);
/* Cells per slot of layer l: kv_geometry_cells for a global layer,
 * swa_window + C_max for a local one. */
int64_t kv_geometry_layer_cells(const struct kv_geometry *g, int layer);
/* Bytes of K (or of V) for one slot, all layers. */
size_t kv_geometry_slot_bytes(const struct kv_geometry *g);
/* Element offset of (slot, layer, kv head, cell) in a K or V buffer laid out
 * [slot][layer][kv_head][cell][Dh], each layer with its own number of cells
 * (kv_geometry_layer_cells): one head's keys are contiguous. For f16 and f32
 * (one element per value). */
size_t kv_geometry_offset(const struct kv_geometry *g, int64_t slot, int layer, int head,
                          int64_t cell);
/* Bytes of one K or V row in g's dtype (kv_dtype_row_bytes). */
size_t kv_geometry_row_bytes(const struct kv_geometry *g);
/* Byte offset of the same row, for every dtype: the row index
 * kv_geometry_offset / Dh times kv_geometry_row_bytes. */
size_t kv_geometry_byte_offset(const struct kv_geometry *g, int64_t slot, int layer, int head,
                               int64_t cell);

struct kv_pool {
    struct kv_geometry geo;
    uint8_t *in_use; /* [n_slots] */
    int64_t n_free;
};

/* Validates g (every count positive and the total byte size representable) and
 * allocates the slot table once. Returns 0 or -EINVAL/-ENOMEM with a message. */
int kv_pool_init(struct kv_pool *pool, const struct kv_geometry *g, char *err, size_t err_len);
void kv_pool_free(struct kv_pool *pool);
/* Takes a free slot: 0 and *slot, or -EBUSY when all are in use. */
int kv_pool_acquire(struct kv_pool *pool, int64_t *slot);
void kv_pool_release(struct kv_pool *pool, int64_t slot);
/* Takes slot, if it is free: 0, or -EBUSY (in use or out of range). */
int kv_pool_acquire_at(struct kv_pool *pool, int64_t slot);

struct kv_seq {
    int64_t slot;
    struct kv_policy policy; /* resolved: never AUTO */
    int64_t n_sinks;         /* S for this sequence (<= geo.n_sinks) */
    int64_t window;          /* W for this sequence (<= geo.window) */
    int64_t ring;            /* R = geo.window + geo.chunk */
    int64_t sink_base;       /* first cell of the ring (geo.n_sinks) */
    int64_t pos_first;       /* p0: absolute position of the sequence's first token */
    int64_t pos_next;        /* absolute position of the next token */
    int64_t n_evicted;       /* tokens outside the sinks and the newest token's window */
    int64_t n_evicted_max;   /* the most n_evicted has been (a retract lowers n_evicted) */
    int64_t chunk;           /* C = geo.chunk */
    int64_t retract_min;     /* pos_next may go back this far and no further */
};

/* Sets up seq in slot with a resolved policy. window <= geo.window; for dense,
 * window is the most tokens the sequence may ever hold. Returns 0 or -EINVAL. */
int kv_seq_init(struct kv_seq *seq, const struct kv_geometry *g, int64_t slot,
                struct kv_policy policy, int64_t window, int64_t pos_first);
/* Can n more tokens be added in one step? 0, or -ENOSPC (dense past its window,
 * or n above the chunk room). */
int kv_seq_can_append(const struct kv_seq *seq, const struct kv_geometry *g, int64_t n);
/* Cell holding the token at absolute position pos (which must be stored). */
int64_t kv_seq_cell(const struct kv_seq *seq, int64_t pos);

/* What a query at absolute position pos sees (pos already stored). */
struct kv_view {
    int64_t n_sinks;   /* sink cells 0 .. n_sinks-1 (positions p0 .. p0+n_sinks-1) */
    int64_t win_start; /* first window position */
    int64_t win_len;   /* window positions win_start .. win_start+win_len-1 */
    int64_t
        pos_cache; /* position to rotate the query at for sink keys: p0 + n_sinks + win_len - 1 */
};
struct kv_view kv_seq_view(const struct kv_seq *seq, int64_t pos);

/* A contiguous run of cells [cell, cell + len). */
struct kv_run {
    int64_t cell;
    int64_t len;
};
#define KV_VIEW_RUNS 3
/* The cells of view v of seq as runs in visit order, which is position order:
 *   run[0]  the sinks, cells 0 .. v->n_sinks-1;
 *   run[1]  the window from cell sink_base + win_start mod R up to the ring's
 *           end (or the window's);
 *   run[2]  the rest of the window after the wrap, from cell sink_base
 *           (len 0 when the window does not wrap).
 * Visit index i of the view is the i-th cell of the concatenated runs; runs
 * may be empty. v may be any view of seq with win_len <= R (kv_seq_view's, or
 * one covering the union of several queries' windows). The only place outside
 * kv_seq_cell that knows the ring's arithmetic. */
void kv_view_runs(const struct kv_seq *seq, const struct kv_view *v,
                  struct kv_run run[KV_VIEW_RUNS]);
/* The sequence as a local layer of g sees it (g->swa_period > 0): the same
 * positions, no sinks, a window of g->swa_window in a ring of swa_window +
 * chunk cells starting at cell 0. kv_seq_cell, kv_seq_view and kv_view_runs on
 * the result give a local layer's cells and views. */
struct kv_seq kv_seq_local(const struct kv_seq *seq, const struct kv_geometry *g);
/* Records that n tokens were stored; updates pos_next and n_evicted. */
void kv_seq_advance(struct kv_seq *seq, int64_t n);
/* Gives back the newest n stored tokens, as if they had never been stored:
 * pos_next goes back n, and the newest token's window is again the one it
 * had. A step overwrites only cells whose positions left every window at
 * least C tokens before the newest position ever stored, so a sequence may go
 * back at most C tokens from there (retract_min), never to before a restore
 * (kv_seq_restored). Returns 0, or -ERANGE (nothing changed) when n is
 * negative or goes past retract_min. */
int kv_seq_retract(struct kv_seq *seq, int64_t n);
/* Sets seq, just initialized, to hold positions up to pos_next as a restore
 * leaves them: only the window's cells written, so nothing can be retracted. */
void kv_seq_restored(struct kv_seq *seq, int64_t pos_next);

#endif
