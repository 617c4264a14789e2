/*
 * test_kvcache.c: the sinks + ring bookkeeping of kvcache/ against a
 * brute-force model of what a query at position p may see: the first S
 * positions of the sequence and the last W positions up to p.
 */
#include "kvcache/kvcache.h"
#include "test.h"

#include <errno.h>

static struct kv_geometry geo(int64_t s, int64_t w, int64_t c, int64_t slots)
{
    return (struct kv_geometry){2, 2, 8, s, w, c, slots, KV_DTYPE_F16, 0, 0};
}

TEST(policy_names_parse_and_round_trip)
{
    const char *names[] = {"auto", "window", "sinks:4", "sinks:1", "dense", "recompute"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        struct kv_policy p;
        char buf[32];
        ASSERT_OK(kv_policy_parse(names[i], &p));
        kv_policy_name(&p, buf, sizeof buf);
        ASSERT_STREQ(buf, names[i]);
    }
    struct kv_policy p;
    ASSERT_EQ(kv_policy_parse("sinks:0", &p), 0);
    ASSERT_EQ(p.kind, KV_POLICY_WINDOW);
    ASSERT_EQ(kv_policy_parse("sinks:", &p), -EINVAL);
    ASSERT_EQ(kv_policy_parse("sinks:-1", &p), -EINVAL);
    ASSERT_EQ(kv_policy_parse("sinks:65", &p), -EINVAL);
    ASSERT_EQ(kv_policy_parse("sinks:4x", &p), -EINVAL);
    ASSERT_EQ(kv_policy_parse("Window", &p), -EINVAL);
    ASSERT_EQ(kv_policy_parse("", &p), -EINVAL);
}

TEST(auto_pins_four_sinks_for_softmax_and_nothing_otherwise)
{
    struct kv_policy a = {KV_POLICY_AUTO, 0};
    struct kv_policy v = kv_policy_resolve(a, 1), f = kv_policy_resolve(a, 0);
    ASSERT_EQ(v.kind, KV_POLICY_SINKS);
    ASSERT_EQ(kv_policy_sinks(&v), 4);
    ASSERT_EQ(f.kind, KV_POLICY_WINDOW);
    ASSERT_EQ(kv_policy_sinks(&f), 0);
}

TEST(pool_hands_out_every_slot_once_then_refuses)
{
    struct kv_pool pool;
    struct kv_geometry g = geo(4, 16, 8, 3);
    char err[128];
    ASSERT_OK(kv_pool_init(&pool, &g, err, sizeof err));
    int64_t s[3], extra;
    for (int i = 0; i < 3; i++)
        ASSERT_OK(kv_pool_acquire(&pool, &s[i]));
    ASSERT(s[0] != s[1] && s[1] != s[2] && s[0] != s[2]);
    ASSERT_EQ(kv_pool_acquire(&pool, &extra), -EBUSY);
    kv_pool_release(&pool, s[1]);
    kv_pool_release(&pool, s[1]); /* idempotent */
    ASSERT_EQ(pool.n_free, 1);
    ASSERT_OK(kv_pool_acquire(&pool, &extra));
    ASSERT_EQ(extra, s[1]);
    kv_pool_free(&pool);
}

/* Row sizes and byte offsets per dtype: a q8_0 row is head_dim / 32 blocks
 * of 34 bytes, rows stay back to back in the same order as f16's, and a
 * head_dim that is no multiple of 32 is refused with a message. */
TEST(q8_0_rows_are_blocks_back_to_back_and_need_whole_blocks)
{
    ASSERT_EQ(kv_dtype_row_bytes(KV_DTYPE_F16, 64), (size_t)128);
    ASSERT_EQ(kv_dtype_row_bytes(KV_DTYPE_F32, 64), (size_t)256);
    ASSERT_EQ(kv_dtype_row_bytes(KV_DTYPE_Q8_0, 64), (size_t)68);
    ASSERT_EQ(kv_dtype_row_bytes(KV_DTYPE_Q8_0, 256), (size_t)272);
    ASSERT_EQ(kv_dtype_row_bytes(KV_DTYPE_Q8_0, 48), (size_t)0);
    ASSERT_EQ(kv_dtype_row_bytes((enum kv_dtype)7, 64), (size_t)0);
    static const char *const names[] = {"f16", "f32", "q8_0"};
    for (int i = 0; i < 3; i++) {
        enum kv_dtype t;
        ASSERT_EQ(kv_dtype_parse(names[i], &t), 0);
        ASSERT(strcmp(kv_dtype_name(t), names[i]) == 0);
    }
    enum kv_dtype t;
    ASSERT_EQ(kv_dtype_parse("q8", &t), -EINVAL);
    ASSERT_EQ(kv_dtype_parse("Q8_0", &t), -EINVAL);
    ASSERT_EQ(kv_dtype_parse(NULL, &t), -EINVAL);

    /* Gemma-like: local and global layers, 2 kv heads of 256 */
    struct kv_geometry f = {6, 2, 256, 4, 100, 16, 3, KV_DTYPE_F16, 3, 40};
    struct kv_geometry q = f;
    q.dtype = KV_DTYPE_Q8_0;
    size_t next = 0;
    for (int64_t slot = 0; slot < q.n_slots; slot++)
        for (int l = 0; l < q.n_layer; l++)
            for (int h = 0; h < q.n_kv_head; h++)
                for (int64_t c = 0; c < kv_geometry_layer_cells(&q, l); c++) {
                    ASSERT_EQ(kv_geometry_byte_offset(&q, slot, l, h, c), next);
                    ASSERT_EQ(kv_geometry_byte_offset(&f, slot, l, h, c), next / 272 * 512);
                    next += 272;
                }
    ASSERT_EQ(next, kv_geometry_slot_bytes(&q) * 3);
    ASSERT_EQ(kv_geometry_slot_bytes(&q) * 512, kv_geometry_slot_bytes(&f) * 272);

    struct kv_pool pool;
    char err[160] = "";
    q.head_dim = 48;
    ASSERT_EQ(kv_pool_init(&pool, &q, err, sizeof err), -EINVAL);
    ASSERT(strstr(err, "q8_0") != NULL && strstr(err, "48") != NULL);
    q.head_dim = 64;
    ASSERT_EQ(kv_pool_init(&pool, &q, err, sizeof err), 0);
    kv_pool_free(&pool);
}

TEST(pool_rejects_bad_geometry_with_a_message)
{
    struct kv_pool pool;
    char err[128] = "";
    struct kv_geometry g = geo(4, 0, 8, 3);
    ASSERT_EQ(kv_pool_init(&pool, &g, err, sizeof err), -EINVAL);
    ASSERT(strstr(err, "window") != NULL);
    g = geo(65, 16, 8, 3);
    ASSERT_EQ(kv_pool_init(&pool, &g, err, sizeof err), -EINVAL);
    g = geo(4, (int64_t)1 << 41, 8, 3);
    ASSERT_EQ(kv_pool_init(&pool, &g, err, sizeof err), -EINVAL);
}

/* For every position of a long stream, for several S, W and start offsets,
 * the view equals the brute-force visible set, every visible position maps to
 * a distinct cell, and no stored-but-visible cell was overwritten by a later
 * position of the same chunk. */
TEST(views_match_brute_force_and_cells_never_collide)
{
    int64_t sinks[] = {0, 1, 4};
    int64_t windows[] = {1, 5, 16};
    int64_t starts[] = {0, 7, 1000000000};
    const int64_t C = 6;
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++)
            for (int c = 0; c < 3; c++) {
                int64_t S = sinks[a], W = windows[b], p0 = starts[c];
                struct kv_geometry g = geo(8, 16, C, 1);
                struct kv_seq seq;
                struct kv_policy pol = {S ? KV_POLICY_SINKS : KV_POLICY_WINDOW, S};
                ASSERT_OK(kv_seq_init(&seq, &g, 0, pol, W, p0));
                int64_t owner[64];
                for (int i = 0; i < 64; i++)
                    owner[i] = -1;
                for (int64_t p = p0; p < p0 + 100; p += C) {
                    /* store a chunk of C positions, then check every query in it */
                    for (int64_t q = p; q < p + C; q++)
                        owner[kv_seq_cell(&seq, q)] = q;
                    for (int64_t q = p; q < p + C; q++) {
                        struct kv_view v = kv_seq_view(&seq, q);
                        int64_t rel = q - p0;
                        int64_t ns = rel + 1 < S ? rel + 1 : S;
                        int64_t ws = q - W + 1 > p0 + S ? q - W + 1 : p0 + S;
                        int64_t wl = q >= ws ? q - ws + 1 : 0;
                        ASSERT_EQ(v.n_sinks, ns);
                        ASSERT_EQ(v.win_len, wl);
                        if (wl > 0)
                            ASSERT_EQ(v.win_start, ws);
                        ASSERT_EQ(v.pos_cache, p0 + ns + wl - 1);
                        ASSERT(v.pos_cache - p0 <= S + W - 1);
                        for (int64_t k = 0; k < ns; k++)
                            ASSERT_EQ(owner[kv_seq_cell(&seq, p0 + k)], p0 + k);
                        for (int64_t k = ws; k < ws + wl; k++)
                            ASSERT_EQ(owner[kv_seq_cell(&seq, k)], k);
                    }
                    kv_seq_advance(&seq, C);
                }
                int64_t stored = 100 + (C - 100 % C) % C;
                ASSERT_EQ(seq.n_evicted, stored > S + W ? stored - S - W : 0);
            }
}

/* Cell that holds position pos, found by searching the owner table the
 * stream filled (no ring arithmetic), or -1 when no cell holds it. */
static int64_t owner_cell(const int64_t *owner, int64_t n_cells, int64_t pos)
{
    int64_t found = -1;
    for (int64_t c = 0; c < n_cells; c++)
        if (owner[c] == pos) {
            if (found >= 0)
                return -2; /* two cells claim one position: a broken oracle */
            found = c;
        }
    return found;
}

/* The runs of view v, concatenated, are the cells the owner table holds for
 * the view's positions in order: the sinks p0 .. p0+n_sinks-1, then the
 * window win_start .. win_start+win_len-1. Returns 0 or the failing index+1. */
static int64_t runs_match_owner(const struct kv_seq *seq, const struct kv_view *v,
                                const int64_t *owner, int64_t n_cells)
{
    struct kv_run run[KV_VIEW_RUNS];
    kv_view_runs(seq, v, run);
    int64_t visit = 0, total = 0;
    for (int r = 0; r < KV_VIEW_RUNS; r++) {
        if (run[r].len < 0)
            return -1;
        total += run[r].len;
    }
    if (total != v->n_sinks + v->win_len)
        return -1;
    for (int r = 0; r < KV_VIEW_RUNS; r++)
        for (int64_t i = 0; i < run[r].len; i++, visit++) {
            int64_t pos =
                visit < v->n_sinks ? seq->pos_first + visit : v->win_start + visit - v->n_sinks;
            int64_t cell = run[r].cell + i;
            if (cell < 0 || cell >= n_cells || cell != owner_cell(owner, n_cells, pos))
                return visit + 1;
            /* sink runs stay in the sink cells, window runs in the ring */
            if ((visit < v->n_sinks) != (cell < seq->sink_base))
                return visit + 1;
        }
    return 0;
}

/* kv_view_runs against a brute-force oracle over many geometries: S_max 0..5
 * and every S <= S_max, windows from 1 to W_max, chunks 1..4, starts that put
 * the wrap point everywhere in the ring (and far past 2^32), streams from
 * below the capacity S + W to several rings past it. The oracle stores each
 * position of the stream in kv_seq_cell's cell, remembers which position each
 * cell holds, and reads the view's cells back by search. Besides each
 * query's own view, the union of a chunk's windows (what a prefill tile
 * loads) is checked the same way. */
TEST(view_runs_match_a_brute_force_oracle_for_every_wrap)
{
    int64_t n_views = 0, n_wrapped = 0, n_empty_window = 0;
    for (int64_t smax = 0; smax <= 5; smax++)
        for (int64_t S = 0; S <= smax; S++)
            for (int64_t wmax = 1; wmax <= 9; wmax += 4)
                for (int64_t W = 1; W <= wmax; W += (W < 3 ? 1 : 3))
                    for (int64_t C = 1; C <= 4; C++) {
                        struct kv_geometry g = geo(smax, wmax, C, 1);
                        const int64_t R = wmax + C, cells = smax + R;
                        int64_t starts[] = {0, 1, 5, R - 1, ((int64_t)1 << 33) + 3};
                        for (int a = 0; a < 5; a++) {
                            int64_t p0 = starts[a];
                            struct kv_seq seq;
                            struct kv_policy pol = {S ? KV_POLICY_SINKS : KV_POLICY_WINDOW, S};
                            ASSERT_OK(kv_seq_init(&seq, &g, 0, pol, W, p0));
                            int64_t owner[64];
                            ASSERT(cells <= 64);
                            for (int i = 0; i < 64; i++)
                                owner[i] = -1;
                            const int64_t len = 3 * (S + R) + 2;
                            for (int64_t p = p0; p < p0 + len; p += C) {
                                for (int64_t q = p; q < p + C; q++)
                                    owner[kv_seq_cell(&seq, q)] = q;
                                int64_t u_lo = INT64_MAX, u_hi = INT64_MIN;
                                for (int64_t q = p; q < p + C; q++) {
                                    struct kv_view v = kv_seq_view(&seq, q);
                                    ASSERT_EQ(runs_match_owner(&seq, &v, owner, cells), 0);
                                    struct kv_run run[KV_VIEW_RUNS];
                                    kv_view_runs(&seq, &v, run);
                                    n_views++;
                                    n_wrapped += run[2].len > 0;
                                    n_empty_window += v.win_len == 0;
                                    if (v.win_len > 0) {
                                        u_lo = v.win_start < u_lo ? v.win_start : u_lo;
                                        u_hi = v.win_start + v.win_len > u_hi
                                                   ? v.win_start + v.win_len
                                                   : u_hi;
                                    }
                                }
                                if (u_lo < u_hi) {
                                    struct kv_view u = {0, u_lo, u_hi - u_lo, 0};
                                    ASSERT_EQ(runs_match_owner(&seq, &u, owner, cells), 0);
                                }
                                kv_seq_advance(&seq, C);
                            }
                        }
                    }
    /* the sweep reached the cases it is for */
    ASSERT(n_views > 10000);
    ASSERT(n_wrapped > 1000);
    ASSERT(n_empty_window > 0);
}

/* kv_seq_retract against the owner oracle: a stream of steps of 1..C
 * tokens, each token written to its cell, with retracts of 0..C + 1 tokens
 * between steps, so that retracts pile up below the newest position ever
 * stored. A retract kv_seq_retract takes must leave the newest token's view
 * finding every position of its window in the cell that still holds it
 * (nothing newer overwrote it), local layers' too, and the sequence equal to
 * one that stored as many tokens without a retract; then the stream goes on
 * from there. Going one token past retract_min, which it refuses, breaks some
 * view in the sweep (the bound is tight; the oracle can fail). A restored
 * sequence cannot go back at all. */
TEST(retract_restores_the_window_exactly_within_the_ring_slack)
{
    int64_t n_taken = 0, n_refused = 0, n_past_min_broken = 0;
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    for (int64_t smax = 0; smax <= 3; smax++)
        for (int64_t S = 0; S <= smax; S++)
            for (int64_t W = 1; W <= 9; W += 2)
                for (int64_t C = 1; C <= 4; C++) {
                    struct kv_geometry g = geo(smax, 9, C, 1);
                    g.swa_period = 2;
                    g.swa_window = W;
                    const int64_t R = 9 + C, cells = smax + R, lcells = W + C;
                    int64_t starts[] = {0, 7, ((int64_t)1 << 33) + 5};
                    for (int a = 0; a < 3; a++) {
                        int64_t p0 = starts[a];
                        struct kv_policy pol = {S ? KV_POLICY_SINKS : KV_POLICY_WINDOW, S};
                        struct kv_seq seq;
                        ASSERT_OK(kv_seq_init(&seq, &g, 0, pol, W, p0));
                        int64_t owner[64], lowner[64];
                        ASSERT(cells <= 64 && lcells <= 64);
                        for (int i = 0; i < 64; i++)
                            owner[i] = lowner[i] = -1;
                        int64_t hw = p0; /* the newest position reached */
                        for (int turn = 0; turn < 60; turn++) {
                            rng ^= rng << 13;
                            rng ^= rng >> 7;
                            rng ^= rng << 17;
                            int64_t n = 1 + (int64_t)(rng % (uint64_t)C);
                            struct kv_seq loc = kv_seq_local(&seq, &g);
                            for (int64_t q = seq.pos_next; q < seq.pos_next + n; q++) {
                                owner[kv_seq_cell(&seq, q)] = q;
                                lowner[kv_seq_cell(&loc, q)] = q;
                            }
                            kv_seq_advance(&seq, n);
                            hw = seq.pos_next > hw ? seq.pos_next : hw;
                            int64_t back = (int64_t)((rng >> 20) % (uint64_t)(C + 2));
                            if (seq.pos_next - back <= p0)
                                continue;
                            struct kv_seq before = seq;
                            if (kv_seq_retract(&seq, back) < 0) {
                                n_refused++;
                                ASSERT_EQ(seq.pos_next, before.pos_next);
                                ASSERT(seq.pos_next - back < seq.retract_min);
                                if (seq.pos_next - back == seq.retract_min - 1) {
                                    struct kv_seq past = seq;
                                    past.pos_next -= back;
                                    struct kv_view v = kv_seq_view(&past, past.pos_next - 1);
                                    struct kv_seq pl = kv_seq_local(&past, &g);
                                    struct kv_view lv = kv_seq_view(&pl, pl.pos_next - 1);
                                    n_past_min_broken +=
                                        runs_match_owner(&past, &v, owner, cells) ||
                                        runs_match_owner(&pl, &lv, lowner, lcells);
                                }
                                continue;
                            }
                            n_taken += back > 0;
                            struct kv_seq fresh;
                            ASSERT_OK(kv_seq_init(&fresh, &g, 0, pol, W, p0));
                            kv_seq_advance(&fresh, seq.pos_next - p0);
                            ASSERT_EQ(seq.pos_next, fresh.pos_next);
                            ASSERT_EQ(seq.n_evicted, fresh.n_evicted);
                            /* evictions counted once: those of the newest position reached */
                            ASSERT_EQ(seq.n_evicted_max, hw - p0 > S + W ? hw - p0 - S - W : 0);
                            struct kv_view v = kv_seq_view(&seq, seq.pos_next - 1);
                            ASSERT_EQ(runs_match_owner(&seq, &v, owner, cells), 0);
                            struct kv_seq l = kv_seq_local(&seq, &g);
                            struct kv_view lv = kv_seq_view(&l, l.pos_next - 1);
                            ASSERT_EQ(runs_match_owner(&l, &lv, lowner, lcells), 0);
                        }
                        ASSERT_EQ(kv_seq_retract(&seq, -1), -ERANGE);
                        kv_seq_restored(&seq, seq.pos_next);
                        ASSERT_EQ(kv_seq_retract(&seq, 1), -ERANGE);
                        ASSERT_OK(kv_seq_retract(&seq, 0));
                    }
                }
    ASSERT(n_taken > 1000);
    ASSERT(n_refused > 100);
    ASSERT(n_past_min_broken > 10);
}

/* Local layers (kv_geometry.swa_period) against a brute-force sliding-window
 * oracle: whatever the global policy (dense, window, sinks), a local layer's
 * query at q sees no sinks and exactly the positions max(p0, q - Wl + 1) .. q,
 * in the cells its own ring of Wl + C cells stored them in; the global view
 * is the one the same sequence has without local layers. */
TEST(local_layers_see_exactly_their_trained_window_whatever_the_policy)
{
    int64_t n_views = 0, n_slid = 0;
    struct kv_policy pols[] = {{KV_POLICY_DENSE, 0}, {KV_POLICY_WINDOW, 0}, {KV_POLICY_SINKS, 2}};
    for (int64_t wl = 1; wl <= 9; wl += 2)
        for (int64_t C = 1; C <= 4; C++)
            for (int pi = 0; pi < 3; pi++) {
                struct kv_geometry g = geo(2, 64, C, 1), g0 = g;
                g.swa_period = 3;
                g.swa_window = wl;
                const int64_t R = wl + C;
                int64_t starts[] = {0, 3, ((int64_t)1 << 33) + 1};
                for (int a = 0; a < 3; a++) {
                    int64_t p0 = starts[a];
                    struct kv_seq seq, seq0;
                    ASSERT_OK(kv_seq_init(&seq, &g, 0, pols[pi], 64, p0));
                    ASSERT_OK(kv_seq_init(&seq0, &g0, 0, pols[pi], 64, p0));
                    int64_t owner[64];
                    for (int i = 0; i < 64; i++)
                        owner[i] = -1;
                    for (int64_t p = p0; p < p0 + 60; p += C) {
                        struct kv_seq loc = kv_seq_local(&seq, &g);
                        ASSERT_EQ(loc.ring, R);
                        ASSERT_EQ(loc.sink_base, 0);
                        for (int64_t q = p; q < p + C; q++) {
                            int64_t cell = kv_seq_cell(&loc, q);
                            ASSERT(cell >= 0 && cell < R);
                            owner[cell] = q;
                        }
                        for (int64_t q = p; q < p + C; q++) {
                            struct kv_view v = kv_seq_view(&loc, q);
                            int64_t lo = q - wl + 1 > p0 ? q - wl + 1 : p0;
                            ASSERT_EQ(v.n_sinks, 0);
                            ASSERT_EQ(v.win_start, lo);
                            ASSERT_EQ(v.win_len, q - lo + 1);
                            ASSERT_EQ(runs_match_owner(&loc, &v, owner, R), 0);
                            struct kv_view vg = kv_seq_view(&seq, q), vg0 = kv_seq_view(&seq0, q);
                            ASSERT_EQ(vg.n_sinks, vg0.n_sinks);
                            ASSERT_EQ(vg.win_start, vg0.win_start);
                            ASSERT_EQ(vg.win_len, vg0.win_len);
                            ASSERT_EQ(vg.pos_cache, vg0.pos_cache);
                            ASSERT_EQ(kv_seq_cell(&seq, q), kv_seq_cell(&seq0, q));
                            n_views++;
                            n_slid += lo > p0;
                        }
                        ASSERT_OK(kv_seq_can_append(&seq, &g, C));
                        kv_seq_advance(&seq, C);
                        kv_seq_advance(&seq0, C);
                        if (pols[pi].kind == KV_POLICY_DENSE && seq.pos_next - p0 + C > 64)
                            break;
                    }
                }
            }
    ASSERT(n_views > 1000);
    ASSERT(n_slid > 500);
}

/* Layers of different sizes tile a slot: each (layer, head) run of cells
 * starts where the previous one ends, local layers hold Wl + C cells and
 * global ones S + W + C, and the slots follow each other. */
TEST(per_layer_cells_tile_the_slot_without_overlap)
{
    struct kv_geometry g = {18, 1, 256, 4, 2048, 64, 3, KV_DTYPE_F16, 6, 512};
    size_t next = 0;
    int n_local = 0;
    for (int64_t slot = 0; slot < g.n_slots; slot++)
        for (int l = 0; l < g.n_layer; l++) {
            int local = kv_geometry_layer_is_local(&g, l);
            ASSERT_EQ(local, (l + 1) % 6 != 0);
            n_local += slot == 0 && local;
            int64_t cells = kv_geometry_layer_cells(&g, l);
            ASSERT_EQ(cells, local ? 512 + 64 : 4 + 2048 + 64);
            for (int h = 0; h < g.n_kv_head; h++) {
                ASSERT_EQ(kv_geometry_offset(&g, slot, l, h, 0), next);
                next += (size_t)cells * 256;
            }
        }
    ASSERT_EQ(n_local, 15);
    ASSERT_EQ(next * 2, kv_geometry_slot_bytes(&g) * 3);
    ASSERT_EQ(kv_geometry_slot_bytes(&g), (size_t)(15 * 576 + 3 * 2116) * 256 * 2);
}

TEST(dense_refuses_past_its_window_and_chunks_above_the_room)
{
    struct kv_geometry g = geo(4, 16, 8, 1);
    struct kv_seq seq;
    ASSERT_OK(kv_seq_init(&seq, &g, 0, (struct kv_policy){KV_POLICY_DENSE, 0}, 16, 0));
    ASSERT_OK(kv_seq_can_append(&seq, &g, 8));
    ASSERT_EQ(kv_seq_can_append(&seq, &g, 9), -ENOSPC);
    kv_seq_advance(&seq, 8);
    kv_seq_advance(&seq, 8);
    ASSERT_EQ(kv_seq_can_append(&seq, &g, 1), -ENOSPC);
    ASSERT_EQ(seq.n_evicted, 0);
    ASSERT_OK(kv_seq_init(&seq, &g, 0, (struct kv_policy){KV_POLICY_WINDOW, 0}, 16, 0));
    kv_seq_advance(&seq, 1000);
    ASSERT_OK(kv_seq_can_append(&seq, &g, 8));
    ASSERT_EQ(seq.n_evicted, 1000 - 16);
}

TEST(seq_init_rejects_auto_and_too_many_sinks)
{
    struct kv_geometry g = geo(4, 16, 8, 2);
    struct kv_seq seq;
    ASSERT_EQ(kv_seq_init(&seq, &g, 0, (struct kv_policy){KV_POLICY_AUTO, 0}, 16, 0), -EINVAL);
    ASSERT_EQ(kv_seq_init(&seq, &g, 0, (struct kv_policy){KV_POLICY_SINKS, 5}, 16, 0), -EINVAL);
    ASSERT_EQ(kv_seq_init(&seq, &g, 2, (struct kv_policy){KV_POLICY_WINDOW, 0}, 16, 0), -EINVAL);
    ASSERT_EQ(kv_seq_init(&seq, &g, 0, (struct kv_policy){KV_POLICY_WINDOW, 0}, 17, 0), -EINVAL);
}

TEST(offsets_are_64_bit_for_large_pools)
{
    /* 30 layers x 8 heads x (4 + 2^20 + 512) cells x 128 dims x 64 slots > 2^32 */
    struct kv_geometry g = {30, 8, 128, 4, (int64_t)1 << 20, 512, 64, KV_DTYPE_F16, 0, 0};
    size_t off = kv_geometry_offset(&g, 63, 29, 7, kv_geometry_cells(&g) - 1);
    ASSERT(off > ((size_t)1 << 32));
    ASSERT_EQ(off + 128, kv_geometry_slot_bytes(&g) / 2 * 64);
}

TEST_MAIN()
