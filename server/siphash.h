/*
 * siphash.h: SipHash-2-4 (Aumasson and Bernstein, 2012), a keyed 64-bit hash.
 * The server names the owner of a resumable stream or a session by the keyed
 * hash of the API key that started it (owner.h), so no copy of the key is
 * kept with it and the owner cannot be guessed without the secret hash key.
 */
#ifndef SS_SIPHASH_H
#define SS_SIPHASH_H

#include <stddef.h>
#include <stdint.h>

uint64_t siphash24(const unsigned char key[16], const void *data, size_t len);

#endif
