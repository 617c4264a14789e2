/*
 * owner.h: who owns a session or a stream. Internal to server/.
 *
 * An owner is a keyed hash (SipHash-2-4) of the API key a request carried:
 * the same for every request with that key, whatever the key's place in the
 * key list, and unguessable without the hash key. Sessions store it in their
 * snapshots, so with --session-dir the hash key is a secret kept in the
 * directory (DIR/owner.secret, made once with O_EXCL and mode 0600 by the
 * first server with API keys), shared
 * by every server on that directory (replicas agree on owners, and a
 * restart keeps them); without one it is random per process.
 */
#ifndef SS_OWNER_H
#define SS_OWNER_H

#include <stddef.h>
#include <stdint.h>

#define OWNER_SECRET_FILE "owner.secret"

/* Fills key with the hash key: read from dir/owner.secret, made there first
 * if missing (dir NULL or "": random bytes). 0, or -errno with a message in
 * err. */
int owner_secret_load(const char *dir, unsigned char key[16], char *err, size_t err_len);

/* The owner of a request that carried token[0..len): never 0 (0 is the
 * owner on an open server). */
uint64_t owner_of_token(const unsigned char key[16], const char *token, size_t len);

/* The group of a client on an open server (--max-detached), by its address:
 * an IPv4 address; of an IPv6 one its /64, since a single host (any
 * customer of an ISP) may hold a whole /64 and pick a fresh address per
 * connection; an IPv4-mapped IPv6 address (a dual-stack listener) as the
 * IPv4 address. 0 for other families. */
struct sockaddr;
uint64_t owner_group_of_address(const unsigned char key[16], const struct sockaddr *sa);

#endif
