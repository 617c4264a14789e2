/* siphash.c: SipHash-2-4 as specified in the SipHash paper (section 2). */
#include "siphash.h"

static uint64_t rotl(uint64_t x, int b)
{
    return (x << b) | (x >> (64 - b));
}

static uint64_t load_le64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* One SipRound. */
static void round_(uint64_t v[4])
{
    v[0] += v[1];
    v[1] = rotl(v[1], 13);
    v[1] ^= v[0];
    v[0] = rotl(v[0], 32);
    v[2] += v[3];
    v[3] = rotl(v[3], 16);
    v[3] ^= v[2];
    v[0] += v[3];
    v[3] = rotl(v[3], 21);
    v[3] ^= v[0];
    v[2] += v[1];
    v[1] = rotl(v[1], 17);
    v[1] ^= v[2];
    v[2] = rotl(v[2], 32);
}

uint64_t siphash24(const unsigned char key[16], const void *data, size_t len)
{
    const unsigned char *m = data;
    uint64_t k0 = load_le64(key), k1 = load_le64(key + 8);
    uint64_t v[4] = {k0 ^ 0x736f6d6570736575ull, k1 ^ 0x646f72616e646f6dull,
                     k0 ^ 0x6c7967656e657261ull, k1 ^ 0x7465646279746573ull};
    size_t full = len - len % 8;
    for (size_t i = 0; i < full; i += 8) {
        uint64_t w = load_le64(m + i);
        v[3] ^= w;
        round_(v);
        round_(v);
        v[0] ^= w;
    }
    /* the last block: the remaining bytes, then the length's low byte on top */
    uint64_t last = (uint64_t)(len & 0xff) << 56;
    for (size_t i = 0; i < len % 8; i++)
        last |= (uint64_t)m[full + i] << (8 * i);
    v[3] ^= last;
    round_(v);
    round_(v);
    v[0] ^= last;
    v[2] ^= 0xff;
    for (int i = 0; i < 4; i++)
        round_(v);
    return v[0] ^ v[1] ^ v[2] ^ v[3];
}
