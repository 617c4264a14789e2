/*
 * stop.c: the stop-string filter (stop.h).
 *
 * buf holds the text from the earliest position where a stop string may
 * still start. Each round appends as much of the piece as fits, then scans:
 *
 *   best = earliest start of a complete stop string in buf;
 *   live = earliest start q of a suffix buf[q..n) that is a proper prefix of
 *          some stop string (a match that more text could complete).
 *
 * If best <= live the answer is final: no earlier match is possible, so the
 * text before best is emitted and the filter is done. Otherwise everything
 * before live (moved back to a UTF-8 character boundary) is emitted and the
 * rest stays. live >= n - (ENGINE_MAX_STOP_LEN - 1), so at most STOP_HOLD_MAX
 * bytes stay and the next round has room for STOP_HOLD_MAX more: a piece of
 * any length goes through in rounds. A pending complete match (best > live)
 * lies after live, so it stays in buf until it is decided.
 */
#include "stop.h"

#include <errno.h>
#include <stdint.h>
#include <string.h>

int stop_filter_init(struct stop_filter *f, const char *const *stops, int n)
{
    f->n_stop = 0;
    f->done = 0;
    f->n = 0;
    if (n < 0 || n > ENGINE_MAX_STOP)
        return -EINVAL;
    int k = 0;
    for (int i = 0; i < n && stops[i]; i++) {
        size_t len = strlen(stops[i]);
        if (len > ENGINE_MAX_STOP_LEN) {
            f->n_stop = 0;
            return -EINVAL;
        }
        if (len == 0)
            continue;
        memcpy(f->stop[k], stops[i], len);
        f->len[k++] = len;
    }
    f->n_stop = k;
    return 0;
}

/* First occurrence of s[0..sl) in b[0..n), or SIZE_MAX. */
static size_t find(const char *b, size_t n, const char *s, size_t sl)
{
    size_t p = 0;
    while (p + sl <= n) {
        const char *hit = memchr(b + p, s[0], n - sl + 1 - p);
        if (!hit)
            return SIZE_MAX;
        p = (size_t)(hit - b);
        if (memcmp(b + p, s, sl) == 0)
            return p;
        p++;
    }
    return SIZE_MAX;
}

/* Byte length of the UTF-8 sequence lead byte c announces (1 for ASCII, and
 * for bytes that cannot lead one). */
static size_t utf8_len(unsigned char c)
{
    if (c >= 0xF0 && c <= 0xF4)
        return 4;
    if (c >= 0xE0)
        return c <= 0xEF ? 3 : 1;
    if (c >= 0xC2)
        return 2;
    return 1;
}

/* Moves cut r of b back (by at most 3 bytes) so that b[0..r) does not end
 * inside a UTF-8 character. */
static size_t utf8_cut(const char *b, size_t r)
{
    for (size_t j = r; j > 0 && r - j < 3;) {
        j--;
        unsigned char c = (unsigned char)b[j];
        if ((c & 0xC0) != 0x80) /* the last lead byte before r */
            return utf8_len(c) > r - j ? j : r;
    }
    return r;
}

/* Scans buf. Returns 1 with *cut = best when the match is final, else 0 with
 * *cut = how many leading bytes are safe to emit. At the end of the text
 * (final), nothing more can complete a match. */
static int scan(const struct stop_filter *f, int final, size_t *cut)
{
    const char *b = f->buf;
    size_t n = f->n;
    size_t best = SIZE_MAX;
    for (int i = 0; i < f->n_stop; i++) {
        size_t lim = n; /* only starts before best matter */
        if (best != SIZE_MAX && best + f->len[i] - 1 < n)
            lim = best + f->len[i] - 1;
        size_t p = find(b, lim, f->stop[i], f->len[i]);
        if (p < best)
            best = p;
    }
    size_t live = n;
    for (int i = 0; i < f->n_stop && !final; i++) {
        const char *s = f->stop[i];
        size_t kmax = f->len[i] - 1 < n ? f->len[i] - 1 : n;
        /* the longest suffix that s begins with starts earliest */
        for (size_t k = kmax; k > 0 && n - k < live; k--) {
            if (b[n - k] == s[0] && memcmp(b + n - k, s, k) == 0) {
                live = n - k;
                break;
            }
        }
    }
    if (best != SIZE_MAX && best <= live) {
        *cut = best;
        return 1;
    }
    *cut = utf8_cut(b, live);
    return 0;
}

/* Emits b[0..k) of the buffer to out and keeps the rest. */
static void release(struct stop_filter *f, size_t k, char *out, size_t *o)
{
    memcpy(out + *o, f->buf, k);
    *o += k;
    memmove(f->buf, f->buf + k, f->n - k);
    f->n -= k;
}

int stop_filter_push(struct stop_filter *f, const char *text, size_t len, char *out, size_t cap,
                     size_t *out_len)
{
    size_t o = 0;
    *out_len = 0;
    if (f->done)
        return 1;
    if (cap < f->n + len)
        return -ENOSPC;
    if (f->n_stop == 0) {
        memcpy(out, text, len);
        *out_len = len;
        return 0;
    }
    while (len > 0) {
        size_t k = sizeof f->buf - f->n; /* >= STOP_HOLD_MAX: see the top of the file */
        if (k > len)
            k = len;
        memcpy(f->buf + f->n, text, k);
        f->n += k;
        text += k;
        len -= k;
        size_t cut;
        if (scan(f, 0, &cut)) {
            memcpy(out + o, f->buf, cut);
            *out_len = o + cut;
            f->n = 0;
            f->done = 1;
            return 1;
        }
        release(f, cut, out, &o);
    }
    *out_len = o;
    return 0;
}

int stop_filter_flush(struct stop_filter *f, char *out, size_t cap, size_t *out_len)
{
    size_t cut;
    *out_len = 0;
    if (f->done)
        return 1;
    if (cap < f->n)
        return -ENOSPC;
    int hit = scan(f, 1, &cut);
    memcpy(out, f->buf, hit ? cut : f->n);
    *out_len = hit ? cut : f->n;
    f->n = 0;
    f->done = hit;
    return hit;
}
