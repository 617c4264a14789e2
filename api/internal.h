/*
 * internal.h: helpers shared by api/'s files (the double-underscore names).
 * Not part of api.h; only api/ and its tests include it.
 */
#ifndef SS_API_INTERNAL_H
#define SS_API_INTERNAL_H

#include <stddef.h>

/* Copies src into dst as valid UTF-8: each invalid or truncated sequence
 * becomes U+FFFD. dst gets a NUL; returns the bytes written (< cap). */
size_t api__utf8_sanitize(char *dst, size_t cap, const char *src, size_t len);
/* Length of the longest prefix of s that is complete, valid UTF-8. */
size_t api__utf8_valid_prefix(const char *s, size_t len);

#endif
