/*
 * pretok.c: step 2 of encoding (tokenizer_impl.h), the pre-tokenizers that cut
 * text into words for BPE: GPT-2's pattern (split_gpt2) and smollm's digit
 * split before it, with UTF-8 decoding and Unicode classes from utf8proc. It
 * holds no state: the classes of ASCII come from the tokenizer's table.
 */
#include "tokenizer_impl.h"

#include <utf8proc.h>

/* ---- UTF-8 and character classes ---- */

/* Decodes the code point at s[0..n), n >= 1. Returns its length; a byte that
 * does not start a valid, complete sequence gives CP_INVALID and length 1. */
size_t tok__utf8_next(const uint8_t *s, size_t n, uint32_t *cp)
{
    uint8_t c = s[0];
    uint8_t lo = 0x80;
    uint8_t hi = 0xBF;
    size_t need;
    uint32_t v;

    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    if (c >= 0xC2 && c <= 0xDF) {
        need = 1;
        v = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
        need = 2;
        v = c & 0x0F;
        lo = c == 0xE0 ? 0xA0 : 0x80; /* no overlongs */
        hi = c == 0xED ? 0x9F : 0xBF; /* no surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 3;
        v = c & 0x07;
        lo = c == 0xF0 ? 0x90 : 0x80;
        hi = c == 0xF4 ? 0x8F : 0xBF; /* nothing past U+10FFFF */
    } else {
        *cp = CP_INVALID;
        return 1;
    }
    for (size_t k = 1; k <= need; k++) {
        if (k >= n || s[k] < lo || s[k] > hi) {
            *cp = CP_INVALID;
            return 1;
        }
        v = v << 6 | (s[k] & 0x3Fu);
        lo = 0x80;
        hi = 0xBF;
    }
    *cp = v;
    return need + 1;
}

enum char_class tok__classify(uint32_t cp)
{
    if (cp == CP_INVALID)
        return CC_OTHER;
    /* Oniguruma's \s is Unicode White_Space: TAB..CR, NEL and Z*. */
    if ((cp >= 0x09 && cp <= 0x0D) || cp == 0x85)
        return CC_SPACE;
    switch (utf8proc_category((utf8proc_int32_t)cp)) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
        return CC_LETTER;
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_NO:
        return CC_NUMBER;
    case UTF8PROC_CATEGORY_ZS:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
        return CC_SPACE;
    default:
        return CC_OTHER;
    }
}

/* Class of the code point at s[0..n); *len gets its length. */
static enum char_class class_at(const struct tokenizer *t, const uint8_t *s, size_t n, size_t *len)
{
    uint32_t cp;

    if (s[0] < 0x80) {
        *len = 1;
        return (enum char_class)t->ascii_class[s[0]];
    }
    *len = tok__utf8_next(s, n, &cp);
    return tok__classify(cp);
}

/* End of the run of characters of class c that starts at s[i]. */
static size_t run_end(const struct tokenizer *t, const uint8_t *s, size_t n, size_t i,
                      enum char_class c)
{
    while (i < n) {
        size_t l;
        if (class_at(t, s + i, n - i, &l) != c)
            break;
        i += l;
    }
    return i;
}

/* Length of a contraction ('s 't 're 've 'm 'll 'd, case-sensitive) at s[i], or 0. */
static size_t contraction(const uint8_t *s, size_t n, size_t i)
{
    if (s[i] != '\'' || i + 1 >= n)
        return 0;
    switch (s[i + 1]) {
    case 's':
    case 't':
    case 'm':
    case 'd':
        return 2;
    case 'r':
    case 'v':
        return i + 2 < n && s[i + 2] == 'e' ? 3 : 0;
    case 'l':
        return i + 2 < n && s[i + 2] == 'l' ? 3 : 0;
    default:
        return 0;
    }
}

/* End of the match of \s+(?!\S)|\s+ at s[i]: the whole run of white space if
 * it ends the text, else all of it but its last character (which then leads
 * the next word, as in " word"), or that one character if the run has no other. */
static size_t space_end(const struct tokenizer *t, const uint8_t *s, size_t n, size_t i)
{
    size_t last = i;
    size_t j = i;

    while (j < n) {
        size_t l;
        if (class_at(t, s + j, n - j, &l) != CC_SPACE)
            break;
        last = j;
        j += l;
    }
    return j < n && last > i ? last : j;
}

/* GPT-2's pattern over s[0..n), each match to bpe_word. The alternatives are
 * tried in the regex's order; the letter, number and other alternatives start
 * at disjoint classes, so the class of the first character (or of the one
 * after a leading space) picks the branch. */
static void split_gpt2(struct encoder *e, const uint8_t *s, size_t n)
{
    const struct tokenizer *t = e->t;
    size_t i = 0;

    while (i < n && !e->err && !e->over) {
        size_t l;
        size_t end;
        enum char_class c = class_at(t, s + i, n - i, &l);

        end = i + contraction(s, n, i);
        if (end > i) {
            tok__bpe_word(e, s + i, end - i);
            i = end;
            continue;
        }
        if (s[i] == ' ' && i + 1 < n) { /* " ?" then \p{L}+, \p{N}+ or other+ */
            size_t l2;
            enum char_class c2 = class_at(t, s + i + 1, n - i - 1, &l2);
            if (c2 != CC_SPACE) {
                end = run_end(t, s, n, i + 1, c2);
                tok__bpe_word(e, s + i, end - i);
                i = end;
                continue;
            }
        }
        if (c != CC_SPACE) {
            end = run_end(t, s, n, i, c);
            tok__bpe_word(e, s + i, end - i);
            i = end;
            continue;
        }
        end = space_end(t, s, n, i);
        tok__bpe_word(e, s + i, end - i);
        i = end;
    }
}

/* The pre-tokenizer over one stretch of text between added tokens. */
void tok__encode_stretch(struct encoder *e, const uint8_t *s, size_t n)
{
    const struct tokenizer *t = e->t;
    size_t i = 0;

    if (!t->split_digits) {
        split_gpt2(e, s, n);
        return;
    }
    /* smollm: every \p{N} character is a word of its own; GPT-2's pattern
     * runs on each stretch between them. */
    while (i < n && !e->err && !e->over) {
        size_t j = i;
        size_t l = 0;
        while (j < n && class_at(t, s + j, n - j, &l) != CC_NUMBER)
            j += l;
        split_gpt2(e, s + i, j - i);
        if (j < n) {
            tok__bpe_word(e, s + j, l);
            j += l;
        }
        i = j;
    }
}
