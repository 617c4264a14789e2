/* utf8_check.c: the tests' own UTF-8 validity check (utf8_check.h). */
#include "support/utf8_check.h"

int test_valid_utf8(const unsigned char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        size_t k;
        unsigned v;
        if (c < 0x80) {
            i++;
            continue;
        }
        if (c >= 0xC2 && c <= 0xDF)
            k = 1;
        else if (c >= 0xE0 && c <= 0xEF)
            k = 2;
        else if (c >= 0xF0 && c <= 0xF4)
            k = 3;
        else
            return 0;
        if (i + k + 1 > n)
            return 0;
        v = c & (0x3F >> k);
        for (size_t j = 1; j <= k; j++) {
            if ((s[i + j] & 0xC0) != 0x80)
                return 0;
            v = v << 6 | (s[i + j] & 0x3F);
        }
        if ((k == 2 && (v < 0x800 || (v >= 0xD800 && v <= 0xDFFF))) ||
            (k == 3 && (v < 0x10000 || v > 0x10FFFF)))
            return 0;
        i += k + 1;
    }
    return 1;
}
