/*
 * test_snapshot.c: session snapshots (engine/snapshot.h) and the backend's
 * KV export/import ops.
 *
 * The reader is a pure function over bytes: a round trip gives back every
 * field and every KV byte; every truncation, every single-bit flip, another
 * version, a header whose fields disagree, and an id with path characters
 * are refused, never read past. The CPU backend's kv_export/kv_import carry
 * a sequence's cells into another slot so that the next tokens give
 * bit-identical logits (a session continued after a restore).
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "test.h"
#include "support/tiny_model.h"

#include "engine/backend.h"
#include "engine/forward.h"
#include "engine/session.h"
#include "engine/snapshot.h"

static struct snapshot_meta sample_meta(void)
{
    struct snapshot_meta m;
    memset(&m, 0, sizeof m);
    for (int i = 0; i < 32; i++)
        m.model_digest[i] = (uint8_t)(i * 7 + 1);
    m.dtype = KV_DTYPE_F16;
    m.n_layer = 2;
    m.n_kv_head = 1;
    m.head_dim = 4;
    m.policy = (struct kv_policy){KV_POLICY_SINKS, 2};
    m.owner = 0xF00DCAFE12345679ull;
    m.n_sinks = 2;
    m.window = 5;
    m.pos_first = 1000;
    m.pos_next = 1012;
    m.next_tok = 42;
    m.has_next = 1;
    m.saved_at = 1700000000;
    snprintf(m.id, sizeof m.id, "sess_abc-1");
    snapshot_meta_cells(&m);
    return m;
}

/* A sealed snapshot of m with KV bytes from a counter; caller frees. */
static uint8_t *build(const struct snapshot_meta *m, size_t *len)
{
    *len = snapshot_size(m);
    uint8_t *buf = malloc(*len);
    uint8_t *k, *v;
    snapshot_encode_header(m, buf, &k, &v);
    size_t kvb = snapshot_kv_bytes(m);
    for (size_t i = 0; i < kvb; i++) {
        k[i] = (uint8_t)(i * 13 + 5);
        v[i] = (uint8_t)(i * 29 + 11);
    }
    snapshot_seal(buf, *len);
    return buf;
}

static void put32le(uint8_t *p, uint32_t x)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(x >> (8 * i));
}

/* Rewrites the checksum (zlib crc32, computed here independently). */
static void reseal(uint8_t *buf, size_t len)
{
    put32le(buf + len - 4, (uint32_t)crc32(0L, buf, (uInt)(len - 4)));
}

TEST(snapshot_cells_are_sinks_plus_the_last_window_positions)
{
    struct snapshot_meta m = sample_meta(); /* 12 tokens stored, S 2, W 5 */
    ASSERT_EQ(m.n_sink_cells, 2);
    ASSERT_EQ(m.win_pos0, 1007);
    ASSERT_EQ(m.n_cells, 7);
    ASSERT_EQ(m.n_evicted, 5);
    m.pos_next = 1001; /* one token: a sink only */
    snapshot_meta_cells(&m);
    ASSERT_EQ(m.n_sink_cells, 1);
    ASSERT_EQ(m.n_cells, 1);
    ASSERT_EQ(m.n_evicted, 0);
}

/* Decodes buf; prints the reader's message when it refuses. */
static int decode(const uint8_t *buf, size_t len, struct snapshot_meta *d, const uint8_t **k,
                  const uint8_t **v)
{
    char err[200] = "";
    int rc = snapshot_decode(buf, len, d, k, v, err, sizeof err);
    if (rc < 0)
        fprintf(stderr, "  %s\n", err);
    return rc;
}

/* Builds m's snapshot and decodes it: every field and every KV byte must
 * come back. Leaves the decoded header in *d and the buffer in *buf (caller
 * frees), for the layout's own checks. */
static void round_trip(int *failed, const struct snapshot_meta *m, struct snapshot_meta *d,
                       uint8_t **buf, size_t *len)
{
    const uint8_t *k, *v;
    *buf = build(m, len);
    ASSERT_OK(decode(*buf, *len, d, &k, &v));
    ASSERT(memcmp(d->model_digest, m->model_digest, 32) == 0);
    ASSERT_EQ(d->dtype, m->dtype);
    ASSERT_EQ(d->policy.kind, m->policy.kind);
    ASSERT_EQ(d->policy.n_sinks, m->policy.n_sinks);
    ASSERT(d->owner == 0xF00DCAFE12345679ull);
    ASSERT_EQ(d->owner_unknown, 0);
    ASSERT_EQ(d->pos_first, m->pos_first);
    ASSERT_EQ(d->pos_next, m->pos_next);
    ASSERT_EQ(d->n_cells, m->n_cells);
    ASSERT_EQ(d->next_tok, 42);
    ASSERT_EQ(d->has_next, 1);
    ASSERT_STREQ(d->id, "sess_abc-1");
    size_t kvb = snapshot_kv_bytes(m);
    ASSERT(k + kvb == v);
    for (size_t i = 0; i < kvb; i++) {
        ASSERT_EQ(k[i], (uint8_t)(i * 13 + 5));
        ASSERT_EQ(v[i], (uint8_t)(i * 29 + 11));
    }
}

/* Every copy of m's snapshot cut short is refused with -EINVAL. */
static void refuses_every_truncation(int *failed, const struct snapshot_meta *m)
{
    struct snapshot_meta d;
    size_t len;
    uint8_t *buf = build(m, &len);
    char err[200];
    for (size_t n = 0; n < len; n++) {
        /* a copy of exactly n bytes, so a read past the end is an ASan error */
        uint8_t *cut = malloc(n ? n : 1);
        memcpy(cut, buf, n);
        const uint8_t *k, *v;
        int rc = snapshot_decode(cut, n, &d, &k, &v, err, sizeof err);
        free(cut);
        if (rc != -EINVAL) {
            free(buf);
            FAIL_AT("a snapshot cut to %zu of %zu bytes gave %d", n, len, rc);
        }
    }
    free(buf);
}

/* Every single-bit flip anywhere in m's snapshot is noticed. */
static void refuses_every_bit_flip(int *failed, const struct snapshot_meta *m)
{
    struct snapshot_meta d;
    size_t len;
    uint8_t *buf = build(m, &len);
    char err[200];
    for (size_t i = 0; i < len; i++) {
        for (int bit = 0; bit < 8; bit++) {
            buf[i] ^= (uint8_t)(1u << bit);
            const uint8_t *k, *v;
            int rc = snapshot_decode(buf, len, &d, &k, &v, err, sizeof err);
            buf[i] ^= (uint8_t)(1u << bit);
            if (rc >= 0) {
                free(buf);
                FAIL_AT("flipping bit %d of byte %zu went unnoticed", bit, i);
            }
        }
    }
    free(buf);
}

/* A changed byte at each header offset, resealed with a good checksum, is
 * refused: the fields must agree with each other, not only with the CRC. */
static void refuses_changed_fields(int *failed, const struct snapshot_meta *m, const size_t *fields,
                                   size_t n_fields)
{
    struct snapshot_meta d;
    size_t len;
    uint8_t *buf = build(m, &len);
    const uint8_t *k, *v;
    char err[200];
    for (size_t f = 0; f < n_fields; f++) {
        uint8_t *c = malloc(len);
        memcpy(c, buf, len);
        c[fields[f]] ^= 0x41;
        reseal(c, len);
        int rc = snapshot_decode(c, len, &d, &k, &v, err, sizeof err);
        free(c);
        if (rc >= 0) {
            free(buf);
            FAIL_AT("a changed byte at offset %zu was accepted", fields[f]);
        }
    }
    free(buf);
}

/* Reads one of tests/fuzz/corpus/fuzz_snapshot_decode's seeds (written from
 * the layout in snapshot.h by a few lines of Python: struct, zlib) into buf
 * and decodes it. Returns snapshot_decode's result, or -ENOENT. */
static int decode_seed(const char *name, uint8_t *buf, size_t cap, struct snapshot_meta *m,
                       const uint8_t **k, const uint8_t **v)
{
    char path[512];
    snprintf(path, sizeof path, SS_FIXTURES_DIR "/../fuzz/corpus/fuzz_snapshot_decode/%s", name);
    FILE *f = fopen(path, "rb");
    if (!f)
        return -ENOENT;
    size_t n = fread(buf, 1, cap, f);
    fclose(f);
    return decode(buf, n, m, k, v);
}

TEST(snapshot_round_trip_gives_back_every_field_and_byte)
{
    struct snapshot_meta m = sample_meta(), d;
    size_t len;
    uint8_t *buf = NULL;
    round_trip(failed, &m, &d, &buf, &len);
    free(buf);
    if (*failed)
        return;
    ASSERT_EQ(d.version, 2); /* every layer global: the version-2 layout */
    ASSERT_EQ(snapshot_kv_bytes(&m), 2 * 1 * 7 * 4 * 2);
}

TEST(snapshot_every_truncation_is_refused)
{
    struct snapshot_meta m = sample_meta();
    refuses_every_truncation(failed, &m);
}

TEST(snapshot_every_bit_flip_is_refused)
{
    struct snapshot_meta m = sample_meta();
    refuses_every_bit_flip(failed, &m);
}

/* sample_meta of a model with local layers: layer 0 local (window 3),
 * layer 1 global; written as version 3. */
static struct snapshot_meta sample_meta_local(void)
{
    struct snapshot_meta m = sample_meta();
    m.swa_period = 2;
    m.swa_window = 3;
    snapshot_meta_cells(&m);
    return m;
}

TEST(snapshot_with_local_layers_is_version_3_and_round_trips)
{
    struct snapshot_meta m = sample_meta_local(), d;
    ASSERT_EQ(m.n_local_cells, 3); /* the last 3 of 12 positions */
    ASSERT_EQ(m.local_pos0, 1009);
    ASSERT(snapshot_layer_is_local(&m, 0) && !snapshot_layer_is_local(&m, 1));
    ASSERT_EQ(snapshot_layer_cells(&m, 0), 3);
    ASSERT_EQ(snapshot_layer_cells(&m, 1), 7);
    ASSERT_EQ(snapshot_layer_offset(&m, 1), 1 * 3 * 4 * 2);
    ASSERT_EQ(snapshot_kv_bytes(&m), 1 * (3 + 7) * 4 * 2);
    size_t len;
    uint8_t *buf = NULL;
    round_trip(failed, &m, &d, &buf, &len);
    if (*failed) {
        free(buf);
        return;
    }
    size_t want_len = 210 + strlen(m.id) + 2 * snapshot_kv_bytes(&m) + 4;
    uint8_t version_byte = buf[8];
    free(buf);
    ASSERT_EQ(len, want_len);
    ASSERT_EQ(version_byte, 3);
    ASSERT_EQ(d.version, 3);
    ASSERT_EQ(d.swa_period, 2);
    ASSERT_EQ(d.swa_window, 3);
    ASSERT_EQ(d.n_local_cells, 3);
    ASSERT_EQ(d.local_pos0, 1009);
    /* a short session: the local layers hold every position */
    m.pos_next = m.pos_first + 2;
    snapshot_meta_cells(&m);
    ASSERT_EQ(m.n_local_cells, 2);
    ASSERT_EQ(m.local_pos0, m.pos_first);
}

TEST(snapshot_with_local_layers_refuses_every_truncation_flip_and_disagreeing_field)
{
    struct snapshot_meta m = sample_meta_local();
    refuses_every_truncation(failed, &m);
    if (*failed)
        return;
    refuses_every_bit_flip(failed, &m);
    if (*failed)
        return;
    /* period, reserved, local window, local cells, first local position, id length */
    static const size_t fields[] = {176, 180, 184, 192, 200, 208};
    refuses_changed_fields(failed, &m, fields, sizeof fields / sizeof fields[0]);
}

TEST(snapshot_of_another_version_says_so)
{
    struct snapshot_meta m = sample_meta(), d;
    size_t len;
    uint8_t *buf = build(&m, &len);
    put32le(buf + 8, SNAPSHOT_VERSION + 1);
    reseal(buf, len);
    const uint8_t *k, *v;
    char err[200];
    ASSERT_EQ(snapshot_decode(buf, len, &d, &k, &v, err, sizeof err), -EPROTONOSUPPORT);
    ASSERT(strstr(err, "version 4") != NULL);
    free(buf);
}

/* A q8_0 snapshot round-trips (its cells are head_dim / 32 blocks of 34
 * bytes), and one whose head_dim is no multiple of 32 is refused with a
 * message, not divided by a zero row size. */
TEST(snapshot_of_a_q8_0_cache_round_trips_and_needs_whole_blocks)
{
    struct snapshot_meta m = sample_meta(), d;
    m.dtype = KV_DTYPE_Q8_0;
    m.head_dim = 64;
    ASSERT_EQ(snapshot_kv_bytes(&m), (size_t)(2 * 1 * 7) * 68);
    size_t len;
    uint8_t *buf = NULL;
    round_trip(failed, &m, &d, &buf, &len);
    free(buf);
    if (*failed)
        return;
    m.dtype = KV_DTYPE_F16; /* 48 values are no whole blocks: written as f16, relabelled */
    m.head_dim = 48;
    buf = build(&m, &len);
    uint32_t q8 = KV_DTYPE_Q8_0;
    memcpy(buf + 56, &q8, 4);
    char err[160] = "";
    ASSERT_EQ(snapshot_decode_header(buf, len, &d, err, sizeof err), -EINVAL);
    ASSERT(strstr(err, "q8_0") != NULL);
    free(buf);
}

TEST(snapshot_with_fields_that_disagree_is_refused_even_with_a_good_checksum)
{
    struct snapshot_meta m = sample_meta();
    static const size_t fields[] = {12,  16,  56,  60,  72,  76,  80,  88, 96,
                                    104, 112, 120, 128, 136, 144, 156, 176};
    refuses_changed_fields(failed, &m, fields, sizeof fields / sizeof fields[0]);
}

TEST(snapshot_id_with_path_characters_is_refused)
{
    struct snapshot_meta m = sample_meta(), d;
    snprintf(m.id, sizeof m.id, "abcd");
    size_t len;
    uint8_t *buf = build(&m, &len);
    memcpy(buf + SNAPSHOT_V2_FIXED_HEADER, "../x", 4); /* a model without local layers */
    reseal(buf, len);
    const uint8_t *k, *v;
    char err[200];
    ASSERT_EQ(snapshot_decode(buf, len, &d, &k, &v, err, sizeof err), -EINVAL);
    free(buf);
    ASSERT(!engine_session_id_valid(".."));
    ASSERT(!engine_session_id_valid("a/b"));
    ASSERT(!engine_session_id_valid(""));
    ASSERT(!engine_session_id_valid("a.b"));
    ASSERT(engine_session_id_valid("Az09_-"));
    char longid[ENGINE_SESSION_ID_MAX + 1];
    memset(longid, 'a', sizeof longid - 1);
    longid[ENGINE_SESSION_ID_MAX] = 0;
    ASSERT(!engine_session_id_valid(longid));
    longid[ENGINE_SESSION_ID_MAX - 1] = 0;
    ASSERT(engine_session_id_valid(longid));
}

TEST(snapshot_written_by_an_independent_python_writer_decodes)
{
    uint8_t buf[1024];
    struct snapshot_meta m;
    const uint8_t *k, *v;
    ASSERT_OK(decode_seed("valid_f16_sinks2", buf, sizeof buf, &m, &k, &v));
    ASSERT_STREQ(m.id, "seed-1");
    ASSERT_EQ(m.version, 1); /* the previous format, of an open server: owner 0 */
    ASSERT(m.owner == 0);
    ASSERT_EQ(m.owner_unknown, 0);
    ASSERT_EQ(m.n_cells, 7);
    ASSERT_EQ(m.next_tok, 7);
    ASSERT_EQ(k[1], 7);
}

/* The same seed rewritten by Python as a q8_0 cache of head dim 32 (one
 * 34-byte block a row: f16 scale 1/16, then 32 int8): it decodes, its K and V
 * are 14 rows of 34 bytes each, and its first block reads as written. It is
 * the q8_0 seed of the snapshot fuzzer too. */
TEST(snapshot_of_a_q8_0_cache_written_by_an_independent_python_writer_decodes)
{
    uint8_t buf[2048];
    struct snapshot_meta m;
    const uint8_t *k, *v;
    ASSERT_OK(decode_seed("valid_q8_0_sinks2", buf, sizeof buf, &m, &k, &v));
    ASSERT_EQ(m.dtype, KV_DTYPE_Q8_0);
    ASSERT_EQ(m.head_dim, 32);
    ASSERT_EQ(m.n_cells, 7);
    ASSERT_EQ(snapshot_kv_bytes(&m), (size_t)14 * 34);
    ASSERT(v == k + 14 * 34);
    ASSERT_EQ(k[0] | k[1] << 8, 0x2c00);
    ASSERT_EQ((int8_t)k[2], -127);
    ASSERT_EQ((int8_t)k[3], -124);
}

TEST(snapshot_with_local_layers_written_by_an_independent_python_writer_decodes)
{
    /* layer 0 local (window 3), layer 1 global, 12 positions stored */
    uint8_t buf[1024];
    struct snapshot_meta m;
    const uint8_t *k, *v;
    ASSERT_OK(decode_seed("valid_f16_local3", buf, sizeof buf, &m, &k, &v));
    ASSERT_STREQ(m.id, "seed-3");
    ASSERT_EQ(m.version, 3);
    ASSERT_EQ(m.swa_period, 2);
    ASSERT_EQ(m.swa_window, 3);
    ASSERT_EQ(m.n_local_cells, 3);
    ASSERT_EQ(m.local_pos0, 1009);
    ASSERT_EQ(m.n_cells, 7);
    ASSERT_EQ(snapshot_kv_bytes(&m), (3 + 7) * 4 * 2);
    ASSERT_EQ(k[1], 7);
    ASSERT_EQ(v[1], 7);
}

/* The same snapshot in the version-1 layout (snapshot.h): no owner hash, the
 * key index at 76, the id length at 168. Caller frees. */
static uint8_t *to_version_1(const uint8_t *v2, size_t len, int32_t key_index, size_t *out_len)
{
    size_t n = len - 8;
    uint8_t *b = malloc(n);
    memcpy(b, v2, 168);
    memcpy(b + 168, v2 + 176, len - 176);
    size_t idl = (size_t)b[168] | (size_t)b[169] << 8;
    put32le(b + 8, 1);
    put32le(b + 12, (uint32_t)(170 + idl));
    put32le(b + 16, (uint32_t)n);
    put32le(b + 20, 0);
    put32le(b + 76, (uint32_t)key_index);
    reseal(b, n);
    *out_len = n;
    return b;
}

TEST(snapshot_of_version_1_decodes_with_its_owner_unknown_when_it_names_a_key)
{
    struct snapshot_meta m = sample_meta(), d;
    size_t len, n;
    uint8_t *buf = build(&m, &len);
    const uint8_t *k, *v;
    char err[200] = "";
    uint8_t *old = to_version_1(buf, len, 2, &n);
    int rc = snapshot_decode(old, n, &d, &k, &v, err, sizeof err);
    if (rc < 0)
        fprintf(stderr, "  %s\n", err);
    ASSERT_OK(rc);
    ASSERT_EQ(d.version, 1);
    ASSERT_EQ(d.owner_unknown, 1);
    ASSERT(d.owner == 0);
    ASSERT_STREQ(d.id, "sess_abc-1");
    ASSERT_EQ(d.n_cells, m.n_cells);
    ASSERT_EQ(k[0], 5); /* the KV data right after the shorter header */
    free(old);
    old = to_version_1(buf, len, -1, &n); /* an open server's */
    ASSERT_OK(snapshot_decode(old, n, &d, &k, &v, err, sizeof err));
    ASSERT_EQ(d.owner_unknown, 0);
    put32le(old + 76, (uint32_t)-2);
    reseal(old, n);
    ASSERT_EQ(snapshot_decode(old, n, &d, &k, &v, err, sizeof err), -EINVAL);
    free(old);
    free(buf);
}

/* Feeds tokens into two rigs; saves rig a's session as a snapshot (the
 * cells copied out by session_copy_cells, encoded, sealed), decodes it,
 * imports it into rig b at the same positions, then checks that the next
 * tokens give bit-identical logits in both. swa_period > 0 gives the tiny
 * model local layers with a window of swa_window. */
static void continue_after_copy(int *failed, enum kv_dtype dt, struct kv_policy pol, int swa_period,
                                int swa_window, int64_t n1)
{
    struct tiny_config tc = tiny_config_default();
    tc.n_layer = 3;
    if (dt == KV_DTYPE_Q8_0)
        tc.head_dim = 32; /* whole Q8_0 blocks */
    tc.swa_period = swa_period;
    tc.n_swa = swa_window;
    struct tiny_model tm;
    ASSERT_OK(tiny_model_init(&tm, &tc));
    const int64_t W = 8, C = 4, n2 = 6;
    struct tiny_rig_config rc = {pol, W, C, 100, dt, 1, 0};
    struct tiny_rig a, b;
    ASSERT_OK(tiny_rig_open(&a, &tm.m, &rc));
    ASSERT_OK(tiny_rig_open(&b, &tm.m, &rc));
    const struct kv_geometry *g = &a.f.pool.geo;
    ASSERT_EQ(g->swa_period, swa_period);
    int32_t toks[64];
    tiny_tokens(toks, n1 + n2, tc.n_vocab, 7);
    ASSERT_OK(tiny_rig_feed(&a, toks, n1, C, NULL));
    /* what a save holds */
    struct snapshot_meta m;
    memset(&m, 0, sizeof m);
    m.dtype = dt;
    m.n_layer = tc.n_layer;
    m.n_kv_head = tc.n_head_kv;
    m.head_dim = tc.head_dim;
    m.policy = pol;
    m.n_sinks = a.seq.n_sinks;
    m.window = W;
    m.pos_first = a.seq.pos_first;
    m.pos_next = a.seq.pos_next;
    m.swa_period = swa_period;
    m.swa_window = swa_period > 0 ? swa_window : 0;
    snprintf(m.id, sizeof m.id, "s");
    snapshot_meta_cells(&m);
    ASSERT(m.n_evicted > 0); /* the window slid before the save */
    /* the stored runs cross their rings' ends */
    ASSERT(kv_seq_cell(&a.seq, m.win_pos0) > kv_seq_cell(&a.seq, m.pos_next - 1));
    if (swa_period > 0) {
        struct kv_seq local = kv_seq_local(&a.seq, g);
        ASSERT(m.pos_next - m.pos_first > local.ring); /* the local ring went round */
        ASSERT_EQ(m.n_local_cells, swa_window);
        ASSERT(kv_seq_cell(&local, m.local_pos0) > kv_seq_cell(&local, m.pos_next - 1));
    }
    size_t len = snapshot_size(&m);
    uint8_t *buf = malloc(len), *k, *v;
    snapshot_encode_header(&m, buf, &k, &v);
    ASSERT_OK(session_copy_cells(&a.b, g, &a.seq, &m, k, v, 0));
    snapshot_seal(buf, len);
    /* restored into b */
    struct snapshot_meta d;
    const uint8_t *dk, *dv;
    char err[200] = "";
    int drc = snapshot_decode(buf, len, &d, &dk, &dv, err, sizeof err);
    if (drc < 0)
        fprintf(stderr, "  %s\n", err);
    ASSERT_OK(drc);
    ASSERT_EQ(d.version, swa_period > 0 ? 3 : 2);
    b.seq.pos_next = d.pos_next;
    b.seq.n_evicted = d.n_evicted;
    ASSERT_OK(session_copy_cells(&b.b, &b.f.pool.geo, &b.seq, &d, (uint8_t *)dk, (uint8_t *)dv, 1));
    const struct backend_ops *op = a.b.ops;
    ASSERT_EQ(op->kv_export(&a.b, 1, 0, 0, 1, k, v, 1), -EINVAL);          /* no slot 1 */
    ASSERT_EQ(op->kv_export(&a.b, 0, 0, 0, 2, k, v, 1), -EINVAL);          /* n > host_cells */
    ASSERT_EQ(op->kv_export(&a.b, 0, tc.n_layer, 0, 1, k, v, 1), -EINVAL); /* no such layer */
    /* past the layer's own cells */
    int64_t cells0 = kv_geometry_layer_cells(g, 0);
    ASSERT_EQ(op->kv_export(&a.b, 0, 0, cells0, 1, k, v, 1), -EINVAL);
    const int64_t V = tc.n_vocab;
    float *la = malloc((size_t)(n2 * V) * sizeof(float)), *lb = malloc((size_t)(n2 * V) * 4);
    ASSERT_OK(tiny_rig_feed(&a, toks + n1, n2, 1, la));
    ASSERT_OK(tiny_rig_feed(&b, toks + n1, n2, 1, lb));
    ASSERT(memcmp(la, lb, (size_t)(n2 * V) * sizeof(float)) == 0);
    free(la);
    free(lb);
    free(buf);
    tiny_rig_close(&a);
    tiny_rig_close(&b);
    tiny_model_free(&tm);
}

TEST(cpu_kv_export_import_continues_bit_for_bit_f16_sinks)
{
    continue_after_copy(failed, KV_DTYPE_F16, (struct kv_policy){KV_POLICY_SINKS, 2}, 0, 0, 34);
}

TEST(cpu_kv_export_import_continues_bit_for_bit_f32_window)
{
    continue_after_copy(failed, KV_DTYPE_F32, (struct kv_policy){KV_POLICY_WINDOW, 0}, 0, 0, 34);
}

TEST(cpu_kv_export_import_continues_bit_for_bit_q8_0_sinks)
{
    continue_after_copy(failed, KV_DTYPE_Q8_0, (struct kv_policy){KV_POLICY_SINKS, 2}, 0, 0, 34);
}

/* Layers 0 and 1 local (window 5: a ring of 9 cells), layer 2 global. */
TEST(cpu_session_with_local_layers_continues_bit_for_bit_f16_sinks)
{
    continue_after_copy(failed, KV_DTYPE_F16, (struct kv_policy){KV_POLICY_SINKS, 2}, 3, 5, 37);
}

/* A local window wider than the policy's (W 8): the local layers keep more
 * positions than the global ones. */
TEST(cpu_session_with_local_layers_continues_bit_for_bit_f32_window)
{
    continue_after_copy(failed, KV_DTYPE_F32, (struct kv_policy){KV_POLICY_WINDOW, 0}, 3, 11, 37);
}

TEST_MAIN()
