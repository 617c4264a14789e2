/*
 * utf8_seq.h: the shape of a UTF-8 sequence (RFC 3629: no overlong forms, no
 * surrogates, nothing past U+10FFFF), for the engine's byte-level readers:
 * the streaming detokenizer (detok.c) and the JSON answer's grammar
 * (json_gram.c). Internal to engine/.
 */
#ifndef SS_UTF8_SEQ_H
#define SS_UTF8_SEQ_H

#include <stdint.h>

/* Bytes in the UTF-8 sequence that lead byte c starts; 0 if c cannot start one. */
static inline int utf8_seq_len(uint8_t c)
{
    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF)
        return 2;
    if (c >= 0xE0 && c <= 0xEF)
        return 3;
    if (c >= 0xF0 && c <= 0xF4)
        return 4;
    return 0;
}

/* 1 if b may follow the n >= 1 bytes of an incomplete sequence that starts
 * with lead (only the second byte's range depends on the lead). */
static inline int utf8_continues(uint8_t lead, int n, uint8_t b)
{
    uint8_t lo = 0x80;
    uint8_t hi = 0xBF;

    if (n == 1) {
        if (lead == 0xE0)
            lo = 0xA0;
        else if (lead == 0xED)
            hi = 0x9F;
        else if (lead == 0xF0)
            lo = 0x90;
        else if (lead == 0xF4)
            hi = 0x8F;
    }
    return b >= lo && b <= hi;
}

#endif
