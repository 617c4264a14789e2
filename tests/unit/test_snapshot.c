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

TEST(snapshot_round_trip_gives_back_every_field_and_byte)
{
    struct snapshot_meta m = sample_meta(), d;
    size_t len;
    uint8_t *buf = build(&m, &len);
    const uint8_t *k, *v;
    char err[200];
    int rc = snapshot_decode(buf, len, &d, &k, &v, err, sizeof err);
    if (rc < 0)
        fprintf(stderr, "  %s\n", err);
    ASSERT_OK(rc);
    ASSERT(memcmp(d.model_digest, m.model_digest, 32) == 0);
    ASSERT_EQ(d.dtype, m.dtype);
    ASSERT_EQ(d.policy.kind, m.policy.kind);
    ASSERT_EQ(d.policy.n_sinks, m.policy.n_sinks);
    ASSERT(d.owner == 0xF00DCAFE12345679ull);
    ASSERT_EQ(d.version, SNAPSHOT_VERSION);
    ASSERT_EQ(d.owner_unknown, 0);
    ASSERT_EQ(d.pos_first, m.pos_first);
    ASSERT_EQ(d.pos_next, m.pos_next);
    ASSERT_EQ(d.n_cells, m.n_cells);
    ASSERT_EQ(d.next_tok, 42);
    ASSERT_EQ(d.has_next, 1);
    ASSERT_STREQ(d.id, "sess_abc-1");
    size_t kvb = snapshot_kv_bytes(&m);
    ASSERT_EQ(kvb, 2 * 1 * 7 * 4 * 2);
    for (size_t i = 0; i < kvb; i++) {
        ASSERT_EQ(k[i], (uint8_t)(i * 13 + 5));
        ASSERT_EQ(v[i], (uint8_t)(i * 29 + 11));
    }
    free(buf);
}

TEST(snapshot_every_truncation_is_refused)
{
    struct snapshot_meta m = sample_meta(), d;
    size_t len;
    uint8_t *buf = build(&m, &len);
    char err[200];
    for (size_t n = 0; n < len; n++) {
        /* a copy of exactly n bytes, so a read past the end is an ASan error */
        uint8_t *cut = malloc(n ? n : 1);
        memcpy(cut, buf, n);
        const uint8_t *k, *v;
        int rc = snapshot_decode(cut, n, &d, &k, &v, err, sizeof err);
        free(cut);
        if (rc != -EINVAL)
            FAIL_AT("a snapshot cut to %zu of %zu bytes gave %d", n, len, rc);
    }
    free(buf);
}

TEST(snapshot_every_bit_flip_is_refused)
{
    struct snapshot_meta m = sample_meta(), d;
    size_t len;
    uint8_t *buf = build(&m, &len);
    char err[200];
    for (size_t i = 0; i < len; i++) {
        for (int bit = 0; bit < 8; bit++) {
            buf[i] ^= (uint8_t)(1u << bit);
            const uint8_t *k, *v;
            int rc = snapshot_decode(buf, len, &d, &k, &v, err, sizeof err);
            buf[i] ^= (uint8_t)(1u << bit);
            if (rc >= 0)
                FAIL_AT("flipping bit %d of byte %zu went unnoticed", bit, i);
        }
    }
    free(buf);
}

TEST(snapshot_of_another_version_says_so)
{
    struct snapshot_meta m = sample_meta(), d;
    size_t len;
    uint8_t *buf = build(&m, &len);
    put32le(buf + 8, 3);
    reseal(buf, len);
    const uint8_t *k, *v;
    char err[200];
    ASSERT_EQ(snapshot_decode(buf, len, &d, &k, &v, err, sizeof err), -EPROTONOSUPPORT);
    ASSERT(strstr(err, "version 3") != NULL);
    free(buf);
}

TEST(snapshot_with_fields_that_disagree_is_refused_even_with_a_good_checksum)
{
    struct snapshot_meta m = sample_meta(), d;
    size_t len;
    uint8_t *buf = build(&m, &len);
    const uint8_t *k, *v;
    char err[200];
    static const size_t fields[] = {12,  16,  56,  60,  72,  76,  80,  88, 96,
                                    104, 112, 120, 128, 136, 144, 156, 176};
    for (size_t f = 0; f < sizeof fields / sizeof fields[0]; f++) {
        uint8_t *c = malloc(len);
        memcpy(c, buf, len);
        c[fields[f]] ^= 0x41;
        reseal(c, len);
        if (snapshot_decode(c, len, &d, &k, &v, err, sizeof err) >= 0)
            FAIL_AT("a changed byte at offset %zu was accepted", fields[f]);
        free(c);
    }
    free(buf);
}

TEST(snapshot_id_with_path_characters_is_refused)
{
    struct snapshot_meta m = sample_meta(), d;
    snprintf(m.id, sizeof m.id, "abcd");
    size_t len;
    uint8_t *buf = build(&m, &len);
    memcpy(buf + SNAPSHOT_FIXED_HEADER, "../x", 4);
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
    /* tests/fuzz/corpus/fuzz_snapshot_decode/valid_f16_sinks2 was written
     * from the layout in snapshot.h by a few lines of Python (struct, zlib) */
    const char *path = SS_FIXTURES_DIR "/../fuzz/corpus/fuzz_snapshot_decode/valid_f16_sinks2";
    FILE *f = fopen(path, "rb");
    ASSERT(f != NULL);
    uint8_t buf[1024];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    struct snapshot_meta m;
    const uint8_t *k, *v;
    char err[200] = "";
    int rc = snapshot_decode(buf, n, &m, &k, &v, err, sizeof err);
    if (rc < 0)
        fprintf(stderr, "  %s\n", err);
    ASSERT_OK(rc);
    ASSERT_STREQ(m.id, "seed-1");
    ASSERT_EQ(m.version, 1); /* the previous format, of an open server: owner 0 */
    ASSERT(m.owner == 0);
    ASSERT_EQ(m.owner_unknown, 0);
    ASSERT_EQ(m.n_cells, 7);
    ASSERT_EQ(m.next_tok, 7);
    ASSERT_EQ(k[1], 7);
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

/* Feeds tokens into two rigs; exports rig a's stored cells (as a snapshot
 * holds them), imports them into rig b at the same positions, then checks
 * that the next tokens give bit-identical logits in both. */
static void continue_after_copy(int *failed, enum kv_dtype dt, struct kv_policy pol)
{
    struct tiny_config tc = tiny_config_default();
    struct tiny_model tm;
    ASSERT_OK(tiny_model_init(&tm, &tc));
    const int64_t W = 8, C = 4, n1 = 34, n2 = 6;
    struct tiny_rig_config rc = {pol, W, C, 100, dt, 1, 0};
    struct tiny_rig a, b;
    ASSERT_OK(tiny_rig_open(&a, &tm.m, &rc));
    ASSERT_OK(tiny_rig_open(&b, &tm.m, &rc));
    int32_t toks[64];
    tiny_tokens(toks, n1 + n2, tc.n_vocab, 7);
    ASSERT_OK(tiny_rig_feed(&a, toks, n1, C, NULL));
    /* what a snapshot holds */
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
    snapshot_meta_cells(&m);
    ASSERT(m.n_evicted > 0); /* the window slid before the copy */
    size_t kvb = snapshot_kv_bytes(&m);
    uint8_t *k = malloc(kvb), *v = malloc(kvb);
    size_t cell_bytes = (size_t)tc.head_dim * (dt == KV_DTYPE_F16 ? 2 : 4);
    const struct backend_ops *op = a.b.ops;
    ASSERT_OK(op->kv_export(&a.b, a.seq.slot, 0, m.n_sink_cells, k, v, m.n_cells));
    int64_t off = m.n_sink_cells, wrapped = 0;
    for (int64_t p = m.win_pos0; p < m.pos_next;) {
        int64_t len = a.seq.ring - p % a.seq.ring;
        if (len > m.pos_next - p)
            len = m.pos_next - p;
        wrapped += len < m.pos_next - p;
        ASSERT_OK(op->kv_export(&a.b, a.seq.slot, kv_seq_cell(&a.seq, p), len,
                                k + (size_t)off * cell_bytes, v + (size_t)off * cell_bytes,
                                m.n_cells));
        p += len;
        off += len;
    }
    ASSERT(wrapped > 0); /* the window crossed the ring's end: two runs */
    /* into b */
    b.seq.pos_next = m.pos_next;
    b.seq.n_evicted = m.n_evicted;
    ASSERT_OK(op->kv_import(&b.b, b.seq.slot, 0, m.n_sink_cells, k, v, m.n_cells));
    off = m.n_sink_cells;
    for (int64_t p = m.win_pos0; p < m.pos_next;) {
        int64_t len = b.seq.ring - p % b.seq.ring;
        if (len > m.pos_next - p)
            len = m.pos_next - p;
        ASSERT_OK(op->kv_import(&b.b, b.seq.slot, kv_seq_cell(&b.seq, p), len,
                                k + (size_t)off * cell_bytes, v + (size_t)off * cell_bytes,
                                m.n_cells));
        p += len;
        off += len;
    }
    ASSERT_EQ(op->kv_export(&a.b, 1, 0, 1, k, v, 1), -EINVAL); /* no slot 1 */
    ASSERT_EQ(op->kv_export(&a.b, 0, 0, 2, k, v, 1), -EINVAL); /* n > host_cells */
    const int64_t V = tc.n_vocab;
    float *la = malloc((size_t)(n2 * V) * sizeof(float)), *lb = malloc((size_t)(n2 * V) * 4);
    ASSERT_OK(tiny_rig_feed(&a, toks + n1, n2, 1, la));
    ASSERT_OK(tiny_rig_feed(&b, toks + n1, n2, 1, lb));
    ASSERT(memcmp(la, lb, (size_t)(n2 * V) * sizeof(float)) == 0);
    free(la);
    free(lb);
    free(k);
    free(v);
    tiny_rig_close(&a);
    tiny_rig_close(&b);
    tiny_model_free(&tm);
}

TEST(cpu_kv_export_import_continues_bit_for_bit_f16_sinks)
{
    continue_after_copy(failed, KV_DTYPE_F16, (struct kv_policy){KV_POLICY_SINKS, 2});
}

TEST(cpu_kv_export_import_continues_bit_for_bit_f32_window)
{
    continue_after_copy(failed, KV_DTYPE_F32, (struct kv_policy){KV_POLICY_WINDOW, 0});
}

TEST_MAIN()
