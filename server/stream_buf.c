/* stream_buf.c: see stream_buf.h. */
#include "stream_buf.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

__attribute__((weak)) void *stream_buf_alloc(size_t n)
{
    return malloc(n);
}

int stream_id_equal(const char *a, const char *b)
{
    volatile unsigned char d = 0; /* no early exit, whatever the compiler sees */
    for (size_t i = 0; i < STREAM_ID_LEN; i++)
        d = (unsigned char)(d | ((unsigned char)a[i] ^ (unsigned char)b[i]));
    return d == 0;
}

void stream_buf_init(struct stream_buf *b)
{
    memset(b, 0, sizeof *b);
}

void stream_buf_free(struct stream_buf *b)
{
    struct stream_event *e = b->head;
    while (e) {
        struct stream_event *next = e->next;
        free(e);
        e = next;
    }
    memset(b, 0, sizeof *b);
}

uint64_t stream_buf_push(struct stream_buf *b, const char *frame, size_t len)
{
    char id[8 + STREAM_EVENT_ID_MAX];
    uint64_t index = b->last + 1;
    int il = snprintf(id, sizeof id, "id: %llu\n", (unsigned long long)index);
    struct stream_event *e = stream_buf_alloc(sizeof *e + (size_t)il + len);
    if (!e)
        return 0;
    e->next = NULL;
    e->index = index;
    e->len = (size_t)il + len;
    memcpy(e->data, id, (size_t)il);
    memcpy(e->data + il, frame, len);
    if (b->tail)
        b->tail->next = e;
    else
        b->head = e;
    b->tail = e;
    if (!b->cursor)
        b->cursor = e;
    b->last = index;
    b->bytes += e->len;
    b->unsent_bytes += e->len;
    return index;
}

const struct stream_event *stream_buf_next(const struct stream_buf *b)
{
    return b->cursor;
}

void stream_buf_advance(struct stream_buf *b)
{
    if (!b->cursor)
        return;
    b->sent = b->cursor->index;
    b->unsent_bytes -= b->cursor->len;
    b->cursor = b->cursor->next;
}

uint64_t stream_buf_oldest_resumable(const struct stream_buf *b)
{
    return b->head ? b->head->index - 1 : b->last;
}

int stream_buf_rewind(struct stream_buf *b, uint64_t last_id)
{
    if (last_id > b->last)
        return -ERANGE;
    if (last_id < stream_buf_oldest_resumable(b))
        return -ESTALE;
    struct stream_event *e = b->head;
    size_t unsent = b->bytes;
    while (e && e->index <= last_id) {
        unsent -= e->len;
        e = e->next;
    }
    b->cursor = e;
    b->sent = last_id;
    b->unsent_bytes = unsent;
    return 0;
}

size_t stream_buf_trim(struct stream_buf *b, size_t max)
{
    size_t freed = 0;
    while (b->bytes > max && b->head && b->head != b->cursor) {
        struct stream_event *e = b->head;
        b->head = e->next;
        if (!b->head)
            b->tail = NULL;
        b->bytes -= e->len;
        freed += e->len;
        free(e);
    }
    return freed;
}

int stream_id_valid(const char *s, size_t len)
{
    if (len != STREAM_ID_LEN)
        return 0;
    for (size_t i = 0; i < len; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return 0;
    return 1;
}

void stream_id_format(char *out, const unsigned char rnd[16])
{
    static const char hex[] = "0123456789abcdef";
    for (int i = 0; i < 16; i++) {
        out[2 * i] = hex[rnd[i] >> 4];
        out[2 * i + 1] = hex[rnd[i] & 15];
    }
    out[STREAM_ID_LEN] = 0;
}

int stream_event_id_parse(const char *s, size_t len, uint64_t *out)
{
    size_t i = 0;
    while (i < len && (s[i] == ' ' || s[i] == '\t'))
        i++;
    while (len > i && (s[len - 1] == ' ' || s[len - 1] == '\t'))
        len--;
    *out = 0;
    if (i == len)
        return 0; /* empty: no last event */
    if (len - i > STREAM_EVENT_ID_MAX)
        return -EINVAL;
    uint64_t v = 0;
    for (; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -EINVAL;
        uint64_t d = (uint64_t)(s[i] - '0');
        if (v > (UINT64_MAX - d) / 10)
            return -EINVAL;
        v = v * 10 + d;
    }
    *out = v;
    return 0;
}
