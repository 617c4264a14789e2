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
/* At s, where no valid character starts (len >= 1): the length of the
 * maximal subpart (Unicode 3.9, U+FFFD substitution of maximal subparts),
 * the bytes that begin a character and are cut or broken after them, or 1.
 * Each becomes one U+FFFD, as Python's decode(errors="replace"), Hugging
 * Face's decode and the engine's own text do. */
size_t api__utf8_bad_len(const char *s, size_t len);

/* struct api_buf (api.h), a growable string (buf.c). Zeroed, it is empty;
 * after a failed allocation oom is set and every put is a no-op. It bounds
 * nothing: each caller counts what it writes. */
struct api_buf;
/* Room for more bytes and a NUL; sets oom when there is none. */
void api__buf_reserve(struct api_buf *b, size_t more);
/* Appends s[0..n) and a NUL; with n 0 the text is still allocated (""). */
void api__buf_put(struct api_buf *b, const char *s, size_t n);
/* Appends the NUL-terminated s. */
void api__buf_puts(struct api_buf *b, const char *s);
/* Drops what was written after mark. */
void api__buf_cut(struct api_buf *b, size_t mark);
/* The text (caller frees), or NULL when nothing was written or an allocation
 * failed (b's memory is freed then). */
char *api__buf_finish(struct api_buf *b);

#endif
