/*
 * snapshot.h: the bytes of a session snapshot (--session-dir), encoded and
 * decoded by pure functions over memory (no files, no backend), so the
 * reader can be unit-tested and fuzzed on its own. Internal to engine/.
 *
 * Everything a session needs to continue bit for bit: its KV cells as stored
 * (f16 or f32), its absolute positions, the token sampled last and not yet
 * fed, its policy, its owner (a keyed hash of the API key it belongs to,
 * computed by the server), and the model file's SHA-256
 * (a snapshot of another model is refused). The sampler is not stored: it
 * lives per request (each request seeds its own), so an idle session has none.
 *
 * Two layouts are written: version 2 for a model whose layers are all
 * global, version 3 for one with local sliding-window layers (Gemma 3's),
 * whose cells a version-2 reader would misplace. Little-endian, version 3:
 *
 *   off  size  field
 *     0     8  magic "SSNAPKV\0"
 *     8     4  version (3)
 *    12     4  header bytes H (210 + id length): where the KV data starts
 *    16     8  file bytes (all of it, the checksum included)
 *    24    32  SHA-256 of the model file
 *    56     4  KV dtype (0 f16, 1 f32, 2 q8_0: kvcache.h row layout)
 *    60     4  layers L        64  4  kv heads Hkv      68  4  head dim Dh
 *    72     4  policy kind (window 1, sinks 2, dense 3)
 *    76     4  reserved (0)
 *    80     8  policy sinks N (sinks:N)
 *    88     8  sinks S kept by the sequence   96  8  window W
 *   104     8  pos_first p0                  112  8  pos_next
 *   120     8  tokens evicted                128  8  cells stored n = ns + nw
 *   136     8  sink cells ns                 144  8  first window position w0
 *   152     4  next token                    156  4  next token pending (0/1)
 *   160     8  saved at (unix seconds)
 *   168     8  owner: keyed hash of the API key that made it (0: an open server)
 *   176     4  local layers' period P (0: every layer is global; else layer l
 *              is local iff (l + 1) % P != 0, kv_geometry.swa_period)
 *   180     4  reserved (0)
 *   184     8  local window Wl (kv_geometry.swa_window; 0 when P is 0)
 *   192     8  local cells nl = min(Wl, pos_next - p0) (0 when P is 0)
 *   200     8  first local position l0 = pos_next - nl
 *   208     2  id length, then the id ([A-Za-z0-9_-])
 *     H        K: layer after layer, each [Hkv][n_l] rows of Dh values (kvcache.h;
 *              a q8_0 row is Dh / 32 Q8_0 blocks) in position
 *              order, in the dtype: for a global layer n_l = n (the ns sinks
 *              p0.., then positions w0 .. pos_next-1); for a local layer
 *              n_l = nl (positions l0 .. pos_next-1)
 *              V: the same
 *   end-4   4  CRC-32 (zlib) of every byte before it
 *
 * Version 2 (written when every layer is global) is version 3 without the
 * local layers' fields: the id length at 176, H = 178 + id length, K
 * [L][Hkv][n][Dh]. Version 1 (read, never written) is version 2
 * without the owner hash: the owner was the index of the API key in the
 * server's key list (int32 at 76; -1: an open server), the id length at 168
 * and H = 170 + id length. An index means nothing once the key list
 * changes, so a version-1 snapshot of a key decodes with owner_unknown set
 * (the server refuses to restore it and keeps the file); one of an open
 * server decodes with owner 0.
 *
 * The window cells stored are the last min(W, stored) positions: what the
 * next query can see (it sees W - 1 of them plus itself). A local layer
 * keeps no sinks and the last min(Wl, stored) positions, whatever the
 * policy.
 */
#ifndef SS_SNAPSHOT_H
#define SS_SNAPSHOT_H

#include <stddef.h>
#include <stdint.h>

#include "engine.h"
#include "kvcache.h"

#define SNAPSHOT_VERSION 3           /* the newest this server reads and writes */
#define SNAPSHOT_FIXED_HEADER 210    /* header bytes before the id, version 3 (the most) */
#define SNAPSHOT_V2_FIXED_HEADER 178 /* ... in version 2 */
#define SNAPSHOT_V1_FIXED_HEADER 170 /* ... in version 1 */

struct snapshot_meta {
    uint8_t model_digest[32];
    enum kv_dtype dtype;
    int n_layer, n_kv_head, head_dim;
    struct kv_policy policy; /* resolved: window, sinks:N or dense */
    uint32_t version;        /* decoded: the file's format version */
    uint64_t owner;          /* keyed hash of the owner's API key; 0: an open server */
    int owner_unknown;       /* decoded: a version-1 snapshot of a key (owner not known) */
    int64_t n_sinks, window, pos_first, pos_next, n_evicted;
    int64_t n_cells, n_sink_cells, win_pos0;
    int swa_period;                    /* local layers (kv_geometry.swa_period); 0: all global */
    int64_t swa_window;                /* their window (0 when swa_period is 0) */
    int64_t n_local_cells, local_pos0; /* derived: cells a local layer stores, from */
    int32_t next_tok;
    int has_next;
    int64_t saved_at;
    char id[ENGINE_SESSION_ID_MAX];
};

/* Fills the derived cell fields (n_evicted, n_sink_cells, win_pos0, n_cells,
 * n_local_cells, local_pos0) from policy, n_sinks, window, swa_period,
 * swa_window and positions. */
void snapshot_meta_cells(struct snapshot_meta *m);
/* 1 if layer l of m is local (swa_period, as kv_geometry_layer_is_local). */
int snapshot_layer_is_local(const struct snapshot_meta *m, int layer);
/* Cells stored for layer l: n_local_cells for a local layer, else n_cells. */
int64_t snapshot_layer_cells(const struct snapshot_meta *m, int layer);
/* Byte offset of layer l's cells inside K (= inside V). */
size_t snapshot_layer_offset(const struct snapshot_meta *m, int layer);
/* Bytes of K (= of V) for m. */
size_t snapshot_kv_bytes(const struct snapshot_meta *m);
/* Header bytes before the id in a snapshot of that format version. */
size_t snapshot_header_fixed(uint32_t version);
/* The version m is written as: 3 with local layers (swa_period > 0), else 2. */
uint32_t snapshot_write_version(const struct snapshot_meta *m);
/* Bytes of the whole snapshot for m (written as snapshot_write_version). */
size_t snapshot_size(const struct snapshot_meta *m);
/* Writes m's header at buf (snapshot_size(m) bytes); the caller fills K at
 * *k and V at *v (snapshot_kv_bytes each), then calls snapshot_seal. */
void snapshot_encode_header(const struct snapshot_meta *m, uint8_t *buf, uint8_t **k, uint8_t **v);
/* Writes the checksum into the last 4 bytes of buf[0..len). */
void snapshot_seal(uint8_t *buf, size_t len);

/* Validates the header alone (first bytes of a file: for listings). Returns
 * 0, or -EINVAL with a reason in err. len may be shorter than the file. */
int snapshot_decode_header(const uint8_t *buf, size_t len, struct snapshot_meta *m, char *err,
                           size_t err_len);
/* Validates a whole snapshot: header, sizes, consistency, checksum. On 0,
 * *k and *v point at the K and V data inside buf. Else -EINVAL (malformed,
 * truncated, corrupted) or -EPROTONOSUPPORT (another version), with a reason
 * in err. Never reads outside buf[0..len). */
int snapshot_decode(const uint8_t *buf, size_t len, struct snapshot_meta *m, const uint8_t **k,
                    const uint8_t **v, char *err, size_t err_len);

#endif
