/* gguf_writer.c: GGUF primitive encodings into a growing buffer (gguf_writer.h). */
#include "support/gguf_writer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void gw_bytes(struct gw_buf *w, const void *src, size_t n)
{
    if (w->len + n > w->cap) {
        size_t cap = w->cap ? w->cap : 256;
        while (cap < w->len + n)
            cap *= 2;
        uint8_t *p = realloc(w->p, cap);
        if (!p) {
            fprintf(stderr, "gguf_writer: out of memory\n");
            exit(1);
        }
        w->p = p;
        w->cap = cap;
    }
    if (n > 0)
        memcpy(w->p + w->len, src, n);
    w->len += n;
}

void gw_u8(struct gw_buf *w, uint8_t v)
{
    gw_bytes(w, &v, 1);
}

void gw_u16(struct gw_buf *w, uint16_t v)
{
    gw_bytes(w, &v, 2);
}

void gw_u32(struct gw_buf *w, uint32_t v)
{
    gw_bytes(w, &v, 4);
}

void gw_u64(struct gw_buf *w, uint64_t v)
{
    gw_bytes(w, &v, 8);
}

void gw_f32(struct gw_buf *w, float v)
{
    gw_bytes(w, &v, 4);
}

void gw_f64(struct gw_buf *w, double v)
{
    gw_bytes(w, &v, 8);
}

void gw_str(struct gw_buf *w, const char *s)
{
    gw_u64(w, strlen(s));
    gw_bytes(w, s, strlen(s));
}

int gw_key(struct gw_buf *w, const char *key, uint32_t type)
{
    gw_str(w, key);
    gw_u32(w, type);
    return 1;
}

void gw_arr(struct gw_buf *w, uint32_t elem_type, uint64_t n)
{
    gw_u32(w, elem_type);
    gw_u64(w, n);
}

void gw_put_u32_at(struct gw_buf *w, size_t at, uint32_t v)
{
    memcpy(w->p + at, &v, 4);
}

void gw_put_u64_at(struct gw_buf *w, size_t at, uint64_t v)
{
    memcpy(w->p + at, &v, 8);
}
