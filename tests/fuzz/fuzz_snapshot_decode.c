/*
 * fuzz_snapshot_decode.c: libFuzzer target for the session snapshot reader
 * (engine/snapshot.h). Any byte string goes to snapshot_decode; so that the
 * fuzzer gets past the checksum, an input whose first byte after the magic's
 * position is odd is first resealed (its last 4 bytes replaced by the CRC-32
 * of the rest). When a snapshot decodes, the first and last byte of its K and
 * V data are read, so ASan catches a view outside the input, and the sizes
 * are checked against the input length. Never a crash, a leak or a read past
 * the input, whatever the bytes.
 *
 *   scripts/fuzz.sh 60   (FUZZ_TARGETS=fuzz_snapshot_decode for this one only)
 */
#include "snapshot.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile uint8_t sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf)
        return 0;
    memcpy(buf, data, size);
    if (size > 16 && (buf[size - 1] & 1)) {
        uint32_t c = (uint32_t)crc32(0L, buf, (uInt)(size - 4));
        for (int i = 0; i < 4; i++)
            buf[size - 4 + (size_t)i] = (uint8_t)(c >> (8 * i));
    }
    struct snapshot_meta m;
    const uint8_t *k, *v;
    char err[200];
    if (snapshot_decode(buf, size, &m, &k, &v, err, sizeof err) == 0) {
        size_t kvb = snapshot_kv_bytes(&m);
        size_t want = snapshot_header_fixed(m.version) + strlen(m.id) + 2 * kvb + 4;
        if (k < buf || v + kvb > buf + size || want != size)
            abort();
        if (kvb > 0)
            sink = (uint8_t)(k[0] ^ k[kvb - 1] ^ v[0] ^ v[kvb - 1]);
        if (!engine_session_id_valid(m.id))
            abort();
    }
    struct snapshot_meta h;
    snapshot_decode_header(buf, size, &h, err, sizeof err);
    free(buf);
    return 0;
}
