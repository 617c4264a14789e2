/*
 * utf8.c: UTF-8 checks for text that leaves as JSON. The engine never emits a
 * broken sequence in event text, but a single token's bytes (logprobs) may be
 * part of a character; JSON strings must be valid UTF-8, so such bytes become
 * U+FFFD in the string (the exact bytes still go out as a "bytes" array).
 */
#include "internal.h"
#include "api.h"

#include <stdint.h>
#include <string.h>

/* The length a character starting with byte c has (1..4), or 0 for a byte
 * that starts none (a continuation byte, C0, C1, F5..FF). */
static size_t lead_len(unsigned char c)
{
    return c < 0x80 ? 1 : c < 0xC2 ? 0 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : c < 0xF5 ? 4 : 0;
}

/* How many of the n bytes of the character starting at u[0] are there and
 * in their range (Unicode Table 3-7): the second byte's range excludes
 * overlong forms, surrogates and code points past U+10FFFF. n when the
 * character is whole and valid. */
static size_t in_range(const unsigned char *u, size_t len, size_t n)
{
    const unsigned char c = u[0];
    const unsigned char lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80;
    const unsigned char hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
    size_t k = 1;
    while (k < n && k < len && u[k] >= (k == 1 ? lo : 0x80) && u[k] <= (k == 1 ? hi : 0xBF))
        k++;
    return k;
}

/* Length of the valid sequence at s (1..4), or 0 if it is invalid or cut. */
static size_t seq_len(const unsigned char *s, size_t len)
{
    const size_t n = lead_len(s[0]);
    return n > 0 && in_range(s, len, n) == n ? n : 0;
}

size_t api__utf8_bad_len(const char *s, size_t len)
{
    const unsigned char *u = (const unsigned char *)s;
    const size_t n = lead_len(u[0]);
    const size_t k = n > 1 ? in_range(u, len, n) : 1;
    return k < n ? k : 1; /* (k == n: a whole character, which the caller found invalid) */
}

size_t api__utf8_valid_prefix(const char *s, size_t len)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < len) {
        size_t n = seq_len(u + i, len - i);
        if (n == 0)
            break;
        i += n;
    }
    return i;
}

size_t api__utf8_sanitize(char *dst, size_t cap, const char *src, size_t len)
{
    static const char repl[] = "\xEF\xBF\xBD";
    const unsigned char *u = (const unsigned char *)src;
    size_t o = 0, i = 0;
    if (cap == 0)
        return 0;
    while (i < len) {
        size_t n = seq_len(u + i, len - i);
        const char *p = n ? src + i : repl;
        size_t w = n ? n : 3;
        if (o + w >= cap)
            break;
        memcpy(dst + o, p, w);
        o += w;
        i += n ? n : api__utf8_bad_len(src + i, len - i);
    }
    dst[o] = 0;
    return o;
}

void api_text_clean(char *dst, size_t cap, const char *src)
{
    static const char repl[] = "\xEF\xBF\xBD";
    const unsigned char *u = (const unsigned char *)src;
    size_t len = strlen(src), o = 0, i = 0;
    if (cap == 0)
        return;
    while (i < len) {
        size_t n = seq_len(u + i, len - i);
        int bad = n == 0 || u[i] < 0x20 || u[i] == 0x7f;
        size_t w = bad ? 3 : n;
        if (o + w >= cap)
            break;
        memcpy(dst + o, bad ? repl : src + i, w);
        o += w;
        i += n ? n : api__utf8_bad_len(src + i, len - i);
    }
    dst[o] = 0;
}
