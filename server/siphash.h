/*
 * siphash.h: SipHash-2-4 (Aumasson and Bernstein, 2012), a keyed 64-bit hash.
 * The server names the owner of a resumable stream by the keyed hash of the
 * API key that started it, so no copy of the key is kept with the stream and
 * the owner cannot be guessed without the process's random hash key.
 */
#ifndef SS_SIPHASH_H
#define SS_SIPHASH_H

#include <stddef.h>
#include <stdint.h>

uint64_t siphash24(const unsigned char key[16], const void *data, size_t len);

#endif
