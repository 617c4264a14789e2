/*
 * detok.c: decoding. Each token's bytes are built once at load (GPT-2's
 * bytes_to_unicode reversed, tokenizer_impl.h) and tok_piece returns a view;
 * the streaming decoder holds back the bytes of a UTF-8 character split
 * across tokens, so a streamed piece is never a broken sequence.
 */
#include "tokenizer_impl.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "utf8_seq.h"

/* The bytes a token decodes to, as HF's ByteLevel decoder: every character
 * mapped back to its byte, or the raw text if one is outside the alphabet. */
static size_t decode_token(const int16_t *cp_byte, struct gguf_str s, char *out)
{
    const uint8_t *p = (const uint8_t *)s.ptr;
    size_t n = 0;

    for (size_t i = 0; i < s.len;) {
        uint32_t cp;
        size_t l = tok__utf8_next(p + i, s.len - i, &cp);

        if (cp == CP_INVALID || cp >= BYTE_ALPHABET_END || cp_byte[cp] < 0) {
            memcpy(out, s.ptr, s.len);
            return s.len;
        }
        out[n++] = (char)cp_byte[cp];
        i += l;
    }
    return n;
}

int tok__build_pieces(struct tokenizer *t, const struct gguf_str *tokens,
                      const uint32_t byte_cp[256])
{
    int16_t cp_byte[BYTE_ALPHABET_END];
    size_t total = 0;

    for (int i = 0; i < BYTE_ALPHABET_END; i++)
        cp_byte[i] = -1;
    for (int b = 0; b < 256; b++)
        cp_byte[byte_cp[b]] = (int16_t)b;
    for (size_t i = 0; i < t->n_vocab; i++)
        total += tokens[i].len;
    t->pieces = malloc(total ? total : 1);
    t->piece_off = malloc((t->n_vocab + 1) * sizeof *t->piece_off);
    if (!t->pieces || !t->piece_off)
        return -ENOMEM;
    t->piece_off[0] = 0;
    for (size_t i = 0; i < t->n_vocab; i++) {
        size_t n = decode_token(cp_byte, tokens[i], t->pieces + t->piece_off[i]);
        t->piece_off[i + 1] = t->piece_off[i] + n;
    }
    return 0;
}

/* ---- queries ---- */

const char *tok_piece(const struct tokenizer *t, int32_t id, size_t *len)
{
    if (id < 0 || (size_t)id >= t->n_vocab)
        return NULL;
    if (len)
        *len = t->piece_off[id + 1] - t->piece_off[id];
    return t->pieces + t->piece_off[id];
}

/* ---- streaming detokenizer ---- */

struct sink { /* bounded output */
    char *out;
    size_t cap;
    size_t n;
    int full;
};

static void put(struct sink *o, const void *p, size_t n)
{
    if (o->n + n > o->cap) {
        o->full = 1;
        return;
    }
    memcpy(o->out + o->n, p, n);
    o->n += n;
}

static void put_replacement(struct sink *o)
{
    put(o, "\xEF\xBF\xBD", 3);
}

/* Feeds one byte through the held-back state; an invalid maximal subpart
 * becomes one U+FFFD (the Unicode "maximal subpart" practice, which is what
 * Rust's from_utf8_lossy and Python's decode(errors="replace") do). Returns
 * 1 when b cannot continue the held sequence, which then goes out as a
 * U+FFFD first, else 0. */
static int stream_byte(struct tok_stream *s, struct sink *o, uint8_t b)
{
    int broke = 0;

    if (s->n_pend > 0) {
        if (utf8_continues(s->pend[0], s->n_pend, b)) {
            s->pend[s->n_pend++] = b;
            if (s->n_pend == utf8_seq_len(s->pend[0])) {
                put(o, s->pend, (size_t)s->n_pend);
                s->n_pend = 0;
            }
            return 0;
        }
        put_replacement(o);
        s->n_pend = 0;
        broke = 1;
    }
    switch (utf8_seq_len(b)) {
    case 1:
        put(o, &b, 1);
        break;
    case 0:
        put_replacement(o);
        break;
    default:
        s->pend[0] = b;
        s->n_pend = 1;
        break;
    }
    return broke;
}

int64_t tok_stream_push(const struct tokenizer *t, struct tok_stream *s, int32_t id, char *out,
                        size_t cap)
{
    struct tok_stream st = *s;
    struct sink o = {.out = out, .cap = cap};
    size_t len;
    const char *p = tok_piece(t, id, &len);

    if (!p || s->n_pend < 0 || s->n_pend > 3)
        return -EINVAL;
    st.n_earlier = 0;
    for (size_t i = 0; i < len && !o.full; i++) {
        /* only the first byte can break a tail that earlier pieces left:
         * past it, a held sequence began in this piece */
        if (stream_byte(&st, &o, (uint8_t)p[i]) && i == 0)
            st.n_earlier = 3;
    }
    if (o.full)
        return -ENOSPC; /* *s unchanged: call again with more room */
    *s = st;
    return (int64_t)o.n;
}

int64_t tok_stream_flush(struct tok_stream *s, char *out, size_t cap)
{
    struct sink o = {.out = out, .cap = cap};

    if (s->n_pend < 0 || s->n_pend > 3)
        return -EINVAL;
    if (s->n_pend > 0)
        put_replacement(&o);
    if (o.full)
        return -ENOSPC;
    s->n_pend = 0;
    return (int64_t)o.n;
}
