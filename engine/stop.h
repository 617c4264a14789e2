/*
 * stop.h: stop strings over a stream of text pieces. Internal to engine/.
 *
 * The filter sees a request's generated text one piece at a time (a token's
 * text, of any length) and passes on what can no longer be part of a stop
 * string. Its contract, for any split of a text T into pieces:
 *
 *   everything it emits == T cut at the earliest occurrence of any stop
 *   string (all of T when none occurs), and it reports a match exactly when
 *   T contains a stop string.
 *
 * "Earliest" is by start position, over the whole text: when one stop string
 * has completed but a longer one that would start earlier is still possible
 * (stops "bc" and "abcd", text so far "abc"), the filter waits for more text
 * before it decides, so the result never depends on how T was cut into
 * tokens. It holds back at most ENGINE_MAX_STOP_LEN - 1 bytes that may begin
 * a stop string, plus up to 3 bytes so that emitted text never ends inside a
 * UTF-8 character (for UTF-8 input, every emitted chunk is whole characters,
 * even if a piece itself ends inside one).
 *
 * Fixed-size memory: the stop strings are copied in and the buffer is part
 * of the struct. A piece longer than the buffer is taken in several rounds.
 */
#ifndef SS_STOP_H
#define SS_STOP_H

#include <stddef.h>

#include "engine.h" /* ENGINE_MAX_STOP, ENGINE_MAX_STOP_LEN */

/* Most bytes held between pushes: a possible start of a stop string (at most
 * ENGINE_MAX_STOP_LEN - 1 bytes) plus an incomplete UTF-8 character (3). */
#define STOP_HOLD_MAX (ENGINE_MAX_STOP_LEN + 2)

struct stop_filter {
    int n_stop; /* 0: the filter passes text straight through */
    int done;   /* a stop string matched: nothing more is emitted */
    size_t len[ENGINE_MAX_STOP];
    char stop[ENGINE_MAX_STOP][ENGINE_MAX_STOP_LEN];
    size_t n;                    /* bytes in buf */
    char buf[2 * STOP_HOLD_MAX]; /* held text, then the next round of a piece */
};

/* Copies the stop strings stops[0..n) (n <= ENGINE_MAX_STOP; the list may end
 * early at a NULL; empty strings are ignored). Returns 0, or -EINVAL when
 * there are more than ENGINE_MAX_STOP or one is longer than
 * ENGINE_MAX_STOP_LEN bytes (f then passes text through). */
int stop_filter_init(struct stop_filter *f, const char *const *stops, int n);

/* Feeds text[0..len). Writes the text that is now safe to emit to out (cap
 * bytes; cap >= len + STOP_HOLD_MAX is always enough) and its length to
 * *out_len. Returns 1 when a stop string matched (out ends just before it;
 * later pushes emit nothing), 0 when not yet, -ENOSPC (nothing consumed) when
 * cap is too small. */
int stop_filter_push(struct stop_filter *f, const char *text, size_t len, char *out, size_t cap,
                     size_t *out_len);

/* The end of the text: writes what is still held (cut before a stop string
 * that was waiting on a longer, earlier one) to out (cap >= STOP_HOLD_MAX is
 * enough). Returns 1 if a stop string matched, 0 if not, -ENOSPC. */
int stop_filter_flush(struct stop_filter *f, char *out, size_t cap, size_t *out_len);

#endif
