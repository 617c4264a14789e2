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

/* Length of the valid sequence at s (1..4), or 0 if it is invalid or cut. */
static size_t seq_len(const unsigned char *s, size_t len)
{
    unsigned char c = s[0];
    size_t n;
    uint32_t cp;
    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF) {
        n = 2;
        cp = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        cp = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        cp = c & 0x07;
    } else {
        return 0;
    }
    if (len < n)
        return 0;
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
        (cp >= 0xD800 && cp <= 0xDFFF))
        return 0; /* overlong, out of range or a surrogate */
    return n;
}

size_t api__utf8_bad_len(const char *s, size_t len)
{
    const unsigned char *u = (const unsigned char *)s;
    unsigned char c = u[0];
    size_t n = c >= 0xC2 && c <= 0xDF   ? 2
               : c >= 0xE0 && c <= 0xEF ? 3
               : c >= 0xF0 && c <= 0xF4 ? 4
                                        : 1;
    /* the second byte's range (Unicode Table 3-7): no overlong form,
     * surrogate or code point past U+10FFFF */
    unsigned char lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80;
    unsigned char hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
    size_t k = 1;
    while (k < n && k < len && u[k] >= (k == 1 ? lo : 0x80) && u[k] <= (k == 1 ? hi : 0xBF))
        k++;
    return k < n ? k : 1; /* k == n: a whole character, which the caller found invalid: cannot be */
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
