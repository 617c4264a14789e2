/*
 * stream_buf.h: the replay buffer of one resumable stream, and the parsing of
 * what a client sends back to resume it (the stream id in the URL, the
 * Last-Event-ID header). Pure: no sockets, no clock, so it is unit-tested
 * without a server.
 *
 * A stream's events are numbered 1, 2, 3, ... in the order they are made;
 * each is kept as the exact bytes of its SSE frame ("id: N\n" + data lines +
 * blank line). The buffer is a FIFO of such events with a cursor that splits
 * it in two:
 *
 *   head ... [delivered: index <= sent] [undelivered: index > sent] ... tail
 *
 * Delivered events were handed to a connection; they stay for replay (a
 * client that lost them in a dying TCP connection asks again) until
 * stream_buf_trim drops the oldest ones. Undelivered events are never
 * dropped: the producer is paused instead (streams.c). Rewinding the cursor
 * to a client's Last-Event-ID makes the events after it undelivered again.
 */
#ifndef SS_STREAM_BUF_H
#define SS_STREAM_BUF_H

#include <stddef.h>
#include <stdint.h>

#define STREAM_ID_LEN 32       /* lowercase hex characters of a stream id (128 random bits) */
#define STREAM_EVENT_ID_MAX 20 /* decimal digits of the largest event index (2^64 - 1) */

struct stream_event {
    struct stream_event *next;
    uint64_t index; /* 1, 2, ... */
    size_t len;
    char data[]; /* the SSE frame */
};

struct stream_buf {
    struct stream_event *head, *tail;
    struct stream_event *cursor; /* the first undelivered event, or NULL */
    uint64_t last;               /* index of the newest event (0: none yet) */
    uint64_t sent;               /* index of the newest delivered event */
    size_t bytes;                /* frame bytes held */
    size_t unsent_bytes;         /* ... of them, after the cursor */
};

void stream_buf_init(struct stream_buf *b);
/* Frees every event. */
void stream_buf_free(struct stream_buf *b);

/* Appends the next event: "id: <index>\n" followed by the len bytes of a
 * framed SSE event (sse.h). Returns its index, or 0 if out of memory. */
uint64_t stream_buf_push(struct stream_buf *b, const char *frame, size_t len);

/* The first undelivered event, or NULL. Valid until the next call that
 * changes b. */
const struct stream_event *stream_buf_next(const struct stream_buf *b);
/* Marks the event stream_buf_next returned as delivered. */
void stream_buf_advance(struct stream_buf *b);

/* The oldest index a client may name as its Last-Event-ID: the events after
 * it are all still here. */
uint64_t stream_buf_oldest_resumable(const struct stream_buf *b);
/* Makes every event after last_id undelivered again (the client has up to
 * last_id). Returns 0, -ERANGE if last_id is beyond the newest event, or
 * -ESTALE if events after last_id were already dropped (the cursor is then
 * unchanged). */
int stream_buf_rewind(struct stream_buf *b, uint64_t last_id);

/* Drops the oldest delivered events while more than max bytes are held.
 * Returns the bytes freed. */
size_t stream_buf_trim(struct stream_buf *b, size_t max);

/* 1 if a and b, two stream ids of STREAM_ID_LEN characters, are the same,
 * in time that does not depend on where they differ (an id is a bearer
 * secret: an early exit would leak how much of a guess is right). */
int stream_id_equal(const char *a, const char *b);

/* The allocator of events: malloc. A weak symbol, so that a test binary
 * can inject allocation failures by defining its own. */
void *stream_buf_alloc(size_t n);

/* 1 if s[0..len) is a well-formed stream id: exactly STREAM_ID_LEN
 * characters of [0-9a-f]. */
int stream_id_valid(const char *s, size_t len);
/* Writes a stream id for 16 random bytes into out[STREAM_ID_LEN + 1]. */
void stream_id_format(char *out, const unsigned char rnd[16]);
/* Parses a Last-Event-ID value: optional spaces/tabs around a decimal
 * number of at most STREAM_EVENT_ID_MAX digits that fits in 64 bits. An
 * empty value means "none" (the EventSource rule): 0. Returns 0 with *out,
 * or -EINVAL (a sign, other characters, too many digits, overflow). */
int stream_event_id_parse(const char *s, size_t len, uint64_t *out);

#endif
