/* snapshot.c: session snapshot bytes (snapshot.h). Pure: memory in, memory out. */
#include "snapshot.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <zlib.h>

static const uint8_t magic[8] = {'S', 'S', 'N', 'A', 'P', 'K', 'V', 0};

#define MAX_DIM (1 << 16)
#define MAX_POS ((int64_t)1 << 62)

static void put32(uint8_t *p, uint32_t x)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(x >> (8 * i));
}

static void put64(uint8_t *p, uint64_t x)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(x >> (8 * i));
}

static uint32_t get32(const uint8_t *p)
{
    uint32_t x = 0;
    for (int i = 0; i < 4; i++)
        x |= (uint32_t)p[i] << (8 * i);
    return x;
}

static uint64_t get64(const uint8_t *p)
{
    uint64_t x = 0;
    for (int i = 0; i < 8; i++)
        x |= (uint64_t)p[i] << (8 * i);
    return x;
}

/* zlib's crc32 takes uInt lengths: feed it in pieces. */
static uint32_t crc_of(const uint8_t *p, size_t n)
{
    uLong c = crc32(0L, Z_NULL, 0);
    while (n > 0) {
        uInt k = n > (1u << 30) ? (1u << 30) : (uInt)n;
        c = crc32(c, p, k);
        p += k;
        n -= k;
    }
    return (uint32_t)c;
}

int engine_session_id_valid(const char *id)
{
    size_t n = 0;
    for (; id[n]; n++) {
        char c = id[n];
        int ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                 c == '_' || c == '-';
        if (!ok || n + 1 >= ENGINE_SESSION_ID_MAX)
            return 0;
    }
    return n > 0;
}

int engine_session_id_equal(const char *a, const char *b)
{
    size_t la = strnlen(a, ENGINE_SESSION_ID_MAX), lb = strnlen(b, ENGINE_SESSION_ID_MAX);
    volatile unsigned char d = (unsigned char)(la != lb); /* no early exit */
    for (size_t i = 0; i < ENGINE_SESSION_ID_MAX; i++) {
        /* past its end a string reads as its terminating NUL (in bounds) */
        size_t ia = i < la ? i : la;
        size_t ib = i < lb ? i : lb;
        d = (unsigned char)(d | ((unsigned char)a[ia] ^ (unsigned char)b[ib]));
    }
    return d == 0;
}

void snapshot_meta_cells(struct snapshot_meta *m)
{
    int64_t stored = m->pos_next - m->pos_first;
    m->n_sink_cells = stored < m->n_sinks ? stored : m->n_sinks;
    m->win_pos0 = m->pos_first + m->n_sinks;
    if (m->pos_next - m->window > m->win_pos0)
        m->win_pos0 = m->pos_next - m->window;
    int64_t nw = m->pos_next > m->win_pos0 ? m->pos_next - m->win_pos0 : 0;
    m->n_cells = m->n_sink_cells + nw;
    int64_t kept = m->n_sinks + m->window;
    m->n_evicted = stored > kept ? stored - kept : 0;
    m->n_local_cells = 0;
    if (m->swa_period > 0)
        m->n_local_cells = stored < m->swa_window ? stored : m->swa_window;
    m->local_pos0 = m->pos_next - m->n_local_cells;
}

int snapshot_layer_is_local(const struct snapshot_meta *m, int layer)
{
    return m->swa_period > 0 && (layer + 1) % m->swa_period != 0;
}

int64_t snapshot_layer_cells(const struct snapshot_meta *m, int layer)
{
    return snapshot_layer_is_local(m, layer) ? m->n_local_cells : m->n_cells;
}

size_t snapshot_layer_offset(const struct snapshot_meta *m, int layer)
{
    size_t cells = 0;
    for (int l = 0; l < layer; l++)
        cells += (size_t)snapshot_layer_cells(m, l);
    return cells * (size_t)m->n_kv_head * kv_dtype_row_bytes(m->dtype, m->head_dim);
}

size_t snapshot_kv_bytes(const struct snapshot_meta *m)
{
    return snapshot_layer_offset(m, m->n_layer);
}

size_t snapshot_header_fixed(uint32_t version)
{
    return version == 1   ? SNAPSHOT_V1_FIXED_HEADER
           : version == 2 ? SNAPSHOT_V2_FIXED_HEADER
                          : SNAPSHOT_FIXED_HEADER;
}

uint32_t snapshot_write_version(const struct snapshot_meta *m)
{
    return m->swa_period > 0 ? 3 : 2;
}

size_t snapshot_size(const struct snapshot_meta *m)
{
    return snapshot_header_fixed(snapshot_write_version(m)) + strlen(m->id) +
           2 * snapshot_kv_bytes(m) + 4;
}

void snapshot_encode_header(const struct snapshot_meta *m, uint8_t *b, uint8_t **k, uint8_t **v)
{
    uint32_t ver = snapshot_write_version(m);
    size_t fixed = snapshot_header_fixed(ver);
    size_t idl = strlen(m->id);
    size_t h = fixed + idl;
    memcpy(b, magic, 8);
    put32(b + 8, ver);
    put32(b + 12, (uint32_t)h);
    put64(b + 16, (uint64_t)snapshot_size(m));
    memcpy(b + 24, m->model_digest, 32);
    put32(b + 56, (uint32_t)m->dtype);
    put32(b + 60, (uint32_t)m->n_layer);
    put32(b + 64, (uint32_t)m->n_kv_head);
    put32(b + 68, (uint32_t)m->head_dim);
    put32(b + 72, (uint32_t)m->policy.kind);
    put32(b + 76, 0); /* reserved */
    put64(b + 80, (uint64_t)m->policy.n_sinks);
    put64(b + 88, (uint64_t)m->n_sinks);
    put64(b + 96, (uint64_t)m->window);
    put64(b + 104, (uint64_t)m->pos_first);
    put64(b + 112, (uint64_t)m->pos_next);
    put64(b + 120, (uint64_t)m->n_evicted);
    put64(b + 128, (uint64_t)m->n_cells);
    put64(b + 136, (uint64_t)m->n_sink_cells);
    put64(b + 144, (uint64_t)m->win_pos0);
    put32(b + 152, (uint32_t)m->next_tok);
    put32(b + 156, (uint32_t)(m->has_next != 0));
    put64(b + 160, (uint64_t)m->saved_at);
    put64(b + 168, m->owner);
    if (ver >= 3) {
        put32(b + 176, (uint32_t)m->swa_period);
        put32(b + 180, 0); /* reserved */
        put64(b + 184, (uint64_t)m->swa_window);
        put64(b + 192, (uint64_t)m->n_local_cells);
        put64(b + 200, (uint64_t)m->local_pos0);
    }
    b[fixed - 2] = (uint8_t)(idl & 0xFF);
    b[fixed - 1] = (uint8_t)(idl >> 8);
    memcpy(b + fixed, m->id, idl);
    *k = b + h;
    *v = *k + snapshot_kv_bytes(m);
}

void snapshot_seal(uint8_t *buf, size_t len)
{
    put32(buf + len - 4, crc_of(buf, len - 4));
}

#define BAD(...)                                                                                   \
    do {                                                                                           \
        snprintf(err, err_len, __VA_ARGS__);                                                       \
        return -EINVAL;                                                                            \
    } while (0)

int snapshot_decode_header(const uint8_t *b, size_t len, struct snapshot_meta *m, char *err,
                           size_t err_len)
{
    memset(m, 0, sizeof *m);
    if (len < 12)
        BAD("truncated: %zu bytes, shorter than a header", len);
    if (memcmp(b, magic, 8) != 0)
        BAD("not a streamsink session snapshot (bad magic)");
    uint32_t ver = get32(b + 8);
    if (ver < 1 || ver > SNAPSHOT_VERSION) {
        snprintf(err, err_len, "snapshot format version %u; this server reads versions 1 to %d",
                 ver, SNAPSHOT_VERSION);
        return -EPROTONOSUPPORT;
    }
    m->version = ver;
    size_t fixed = snapshot_header_fixed(ver);
    if (len < fixed)
        BAD("truncated: %zu bytes, shorter than a header", len);
    size_t idl = (size_t)b[fixed - 2] | (size_t)b[fixed - 1] << 8;
    if (idl == 0 || idl >= ENGINE_SESSION_ID_MAX)
        BAD("bad session id length %zu", idl);
    if (get32(b + 12) != fixed + idl)
        BAD("bad header length");
    if (len < fixed + idl)
        BAD("truncated inside the header");
    memcpy(m->id, b + fixed, idl);
    m->id[idl] = 0;
    if (!engine_session_id_valid(m->id))
        BAD("bad session id");
    memcpy(m->model_digest, b + 24, 32);
    uint32_t dt = get32(b + 56);
    if (dt != KV_DTYPE_F16 && dt != KV_DTYPE_F32 && dt != KV_DTYPE_Q8_0)
        BAD("bad KV dtype %u", dt);
    m->dtype = (enum kv_dtype)dt;
    uint32_t L = get32(b + 60), Hkv = get32(b + 64), Dh = get32(b + 68);
    if (L < 1 || L > MAX_DIM || Hkv < 1 || Hkv > MAX_DIM || Dh < 1 || Dh > MAX_DIM)
        BAD("bad KV geometry %u x %u x %u", L, Hkv, Dh);
    if (kv_dtype_row_bytes(m->dtype, (int)Dh) == 0)
        BAD("a %s KV cache cannot hold rows of head dim %u", kv_dtype_name(m->dtype), Dh);
    m->n_layer = (int)L;
    m->n_kv_head = (int)Hkv;
    m->head_dim = (int)Dh;
    uint32_t pk = get32(b + 72);
    if (pk != KV_POLICY_WINDOW && pk != KV_POLICY_SINKS && pk != KV_POLICY_DENSE)
        BAD("bad policy %u", pk);
    m->policy.kind = (enum kv_policy_kind)pk;
    if (ver == 1) { /* the index of a key in the key list of the server that wrote it */
        int32_t idx = (int32_t)get32(b + 76);
        if (idx < -1)
            BAD("bad owner");
        m->owner_unknown = idx >= 0;
    } else {
        if (get32(b + 76) != 0)
            BAD("bad reserved field");
        m->owner = get64(b + 168);
    }
    m->policy.n_sinks = (int64_t)get64(b + 80);
    m->n_sinks = (int64_t)get64(b + 88);
    m->window = (int64_t)get64(b + 96);
    m->pos_first = (int64_t)get64(b + 104);
    m->pos_next = (int64_t)get64(b + 112);
    if (m->policy.n_sinks < 0 || m->policy.n_sinks > KV_MAX_SINKS ||
        (pk != KV_POLICY_SINKS && m->policy.n_sinks != 0))
        BAD("bad policy sinks");
    if (m->n_sinks != kv_policy_sinks(&m->policy))
        BAD("sinks %lld do not match the policy", (long long)m->n_sinks);
    if (m->window < 1 || m->window > MAX_POS || m->pos_first < 0 || m->pos_first > MAX_POS ||
        m->pos_next < m->pos_first || m->pos_next > MAX_POS)
        BAD("bad window or positions");
    if (pk == KV_POLICY_DENSE && m->pos_next - m->pos_first > m->window)
        BAD("a dense session holds more than its window");
    if (ver >= 3) {
        uint32_t period = get32(b + 176);
        m->swa_window = (int64_t)get64(b + 184);
        if (get32(b + 180) != 0)
            BAD("bad reserved field");
        if (period > MAX_DIM || (period == 0 && m->swa_window != 0) ||
            (period > 0 && (m->swa_window < 1 || m->swa_window > MAX_POS)))
            BAD("bad local layers: period %u, window %lld", period, (long long)m->swa_window);
        m->swa_period = (int)period;
    }
    snapshot_meta_cells(m); /* the derived fields must agree with the stored ones */
    if ((int64_t)get64(b + 120) != m->n_evicted || (int64_t)get64(b + 128) != m->n_cells ||
        (int64_t)get64(b + 136) != m->n_sink_cells || (int64_t)get64(b + 144) != m->win_pos0 ||
        (ver >= 3 &&
         ((int64_t)get64(b + 192) != m->n_local_cells || (int64_t)get64(b + 200) != m->local_pos0)))
        BAD("cell counts do not match the positions");
    m->next_tok = (int32_t)get32(b + 152);
    uint32_t hn = get32(b + 156);
    if (hn > 1 || (hn && m->next_tok < 0))
        BAD("bad pending token");
    m->has_next = (int)hn;
    m->saved_at = (int64_t)get64(b + 160);
    return 0;
}

int snapshot_decode(const uint8_t *b, size_t len, struct snapshot_meta *m, const uint8_t **k,
                    const uint8_t **v, char *err, size_t err_len)
{
    *k = *v = NULL;
    int rc = snapshot_decode_header(b, len, m, err, err_len);
    if (rc < 0)
        return rc;
    uint64_t total = get64(b + 16);
    if (total != len)
        BAD("%s: the file has %zu bytes, its header says %llu",
            len < total ? "truncated" : "trailing bytes", len, (unsigned long long)total);
    /* the cell counts <= 2^62 and the dims <= 2^16 each: check the product fits */
    size_t h = snapshot_header_fixed(m->version) + strlen(m->id);
    /* one layer's cell */
    size_t row = (size_t)m->n_kv_head * kv_dtype_row_bytes(m->dtype, m->head_dim);
    if (len < h + 4)
        BAD("truncated: the KV cells do not fit the file");
    uint64_t room = (len - h - 4) / 2 / row, cells = 0;
    for (int l = 0; l < m->n_layer; l++) {
        uint64_t c = (uint64_t)snapshot_layer_cells(m, l);
        if (c > room - cells)
            BAD("truncated: the KV cells do not fit the file");
        cells += c;
    }
    size_t kvb = snapshot_kv_bytes(m);
    if (h + 2 * kvb + 4 != len)
        BAD("the file size does not match its KV cells");
    uint32_t want = get32(b + len - 4);
    uint32_t got = crc_of(b, len - 4);
    if (want != got)
        BAD("checksum mismatch (stored %08x, computed %08x): the file is corrupted", want, got);
    *k = b + h;
    *v = b + h + kvb;
    return 0;
}
