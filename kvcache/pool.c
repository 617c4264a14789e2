/* pool.c: the fixed pool of KV slots, sized once at start (kvcache.h). */
#include "kvcache.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int64_t kv_geometry_cells(const struct kv_geometry *g)
{
    return g->n_sinks + g->window + g->chunk;
}

int kv_geometry_layer_is_local(const struct kv_geometry *g, int layer)
{
    return g->swa_period > 0 && (layer + 1) % g->swa_period != 0;
}

int64_t kv_geometry_layer_cells(const struct kv_geometry *g, int layer)
{
    return kv_geometry_layer_is_local(g, layer) ? g->swa_window + g->chunk : kv_geometry_cells(g);
}

/* Cells of one kv head summed over layers 0 .. layer-1. */
static size_t cells_before(const struct kv_geometry *g, int layer)
{
    size_t n_global = g->swa_period > 0 ? (size_t)(layer / g->swa_period) : (size_t)layer;
    size_t n_local = (size_t)layer - n_global;
    size_t local_cells = g->swa_period > 0 ? (size_t)(g->swa_window + g->chunk) : 0;
    return n_global * (size_t)kv_geometry_cells(g) + n_local * local_cells;
}

size_t kv_dtype_row_bytes(enum kv_dtype t, int head_dim)
{
    if (head_dim <= 0)
        return 0;
    switch (t) {
    case KV_DTYPE_F16:
        return (size_t)head_dim * 2;
    case KV_DTYPE_F32:
        return (size_t)head_dim * 4;
    case KV_DTYPE_Q8_0:
        if (head_dim % KV_Q8_BLOCK != 0)
            return 0;
        return (size_t)(head_dim / KV_Q8_BLOCK) * KV_Q8_BLOCK_BYTES;
    }
    return 0;
}

const char *kv_dtype_name(enum kv_dtype t)
{
    switch (t) {
    case KV_DTYPE_F16:
        return "f16";
    case KV_DTYPE_F32:
        return "f32";
    case KV_DTYPE_Q8_0:
        return "q8_0";
    }
    return "?";
}

int kv_dtype_parse(const char *s, enum kv_dtype *out)
{
    static const enum kv_dtype all[] = {KV_DTYPE_F16, KV_DTYPE_F32, KV_DTYPE_Q8_0};
    for (size_t i = 0; s && i < sizeof all / sizeof all[0]; i++) {
        if (strcmp(s, kv_dtype_name(all[i])) == 0) {
            *out = all[i];
            return 0;
        }
    }
    return -EINVAL;
}

size_t kv_geometry_row_bytes(const struct kv_geometry *g)
{
    return kv_dtype_row_bytes(g->dtype, g->head_dim);
}

size_t kv_geometry_slot_bytes(const struct kv_geometry *g)
{
    return cells_before(g, g->n_layer) * (size_t)g->n_kv_head * kv_geometry_row_bytes(g);
}

size_t kv_geometry_offset(const struct kv_geometry *g, int64_t slot, int layer, int head,
                          int64_t cell)
{
    size_t dh = (size_t)g->head_dim, hkv = (size_t)g->n_kv_head;
    size_t per_slot = cells_before(g, g->n_layer) * hkv * dh;
    size_t per_head = (size_t)kv_geometry_layer_cells(g, layer) * dh;
    return (size_t)slot * per_slot + cells_before(g, layer) * hkv * dh + (size_t)head * per_head +
           (size_t)cell * dh;
}

size_t kv_geometry_byte_offset(const struct kv_geometry *g, int64_t slot, int layer, int head,
                               int64_t cell)
{
    return kv_geometry_offset(g, slot, layer, head, cell) / (size_t)g->head_dim *
           kv_geometry_row_bytes(g);
}

int kv_pool_init(struct kv_pool *pool, const struct kv_geometry *g, char *err, size_t err_len)
{
    memset(pool, 0, sizeof *pool);
    if (g->n_layer <= 0 || g->n_kv_head <= 0 || g->head_dim <= 0 || g->n_sinks < 0 ||
        g->n_sinks > KV_MAX_SINKS || g->window <= 0 || g->chunk <= 0 || g->n_slots <= 0 ||
        g->swa_period < 0 || (g->swa_period > 0 && g->swa_window <= 0)) {
        snprintf(err, err_len,
                 "kv pool: invalid geometry (layers %d, kv heads %d, head dim %d, "
                 "sinks %lld, window %lld, chunk %lld, slots %lld, local period %d window %lld)",
                 g->n_layer, g->n_kv_head, g->head_dim, (long long)g->n_sinks, (long long)g->window,
                 (long long)g->chunk, (long long)g->n_slots, g->swa_period,
                 (long long)g->swa_window);
        return -EINVAL;
    }
    if (kv_geometry_row_bytes(g) == 0) {
        snprintf(err, err_len,
                 "kv pool: KV dtype %s cannot store rows of head dim %d (q8_0 needs a multiple "
                 "of %d)",
                 kv_dtype_name(g->dtype), g->head_dim, KV_Q8_BLOCK);
        return -EINVAL;
    }
    /* the whole pool (K and V) must be addressable with size_t */
    double cells = (double)kv_geometry_cells(g); /* the larger of a global and a local layer's */
    if (g->swa_period > 0 && (double)g->swa_window + (double)g->chunk > cells)
        cells = (double)g->swa_window + (double)g->chunk;
    double total = 2.0 * (double)g->n_slots * (double)g->n_layer * (double)g->n_kv_head * cells *
                   (double)g->head_dim * 4.0;
    if (total > 9.0e18 || g->window > ((int64_t)1 << 40) || g->chunk > ((int64_t)1 << 30) ||
        g->swa_window > ((int64_t)1 << 40)) {
        snprintf(err, err_len, "kv pool: geometry too large");
        return -EINVAL;
    }
    pool->in_use = calloc((size_t)g->n_slots, 1);
    if (!pool->in_use) {
        snprintf(err, err_len, "kv pool: out of memory");
        return -ENOMEM;
    }
    pool->geo = *g;
    pool->n_free = g->n_slots;
    return 0;
}

void kv_pool_free(struct kv_pool *pool)
{
    free(pool->in_use);
    memset(pool, 0, sizeof *pool);
}

int kv_pool_acquire(struct kv_pool *pool, int64_t *slot)
{
    for (int64_t i = 0; i < pool->geo.n_slots; i++) {
        if (!pool->in_use[i]) {
            pool->in_use[i] = 1;
            pool->n_free--;
            *slot = i;
            return 0;
        }
    }
    return -EBUSY;
}

int kv_pool_acquire_at(struct kv_pool *pool, int64_t slot)
{
    if (slot < 0 || slot >= pool->geo.n_slots || pool->in_use[slot])
        return -EBUSY;
    pool->in_use[slot] = 1;
    pool->n_free--;
    return 0;
}

void kv_pool_release(struct kv_pool *pool, int64_t slot)
{
    if (slot >= 0 && slot < pool->geo.n_slots && pool->in_use[slot]) {
        pool->in_use[slot] = 0;
        pool->n_free++;
    }
}
