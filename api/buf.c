/*
 * buf.c: struct api_buf, the growable string that response.c writes JSON
 * text into and chat_template.c writes prompts into. It holds no limit of its
 * own: each caller counts what it may write (response.c against
 * --max-response). It fails once, cleanly: after a failed allocation oom is
 * set and every later put is a no-op. Once allocated, p is NUL-terminated.
 */
#include "api.h"
#include "internal.h"

#include <stdlib.h>
#include <string.h>

void api__buf_reserve(struct api_buf *b, size_t more)
{
    if (b->oom || b->len + more + 1 <= b->cap)
        return;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + more + 1)
        cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
        b->oom = 1;
        return;
    }
    b->p = p;
    b->cap = cap;
}

void api__buf_put(struct api_buf *b, const char *s, size_t n)
{
    api__buf_reserve(b, n);
    if (b->oom)
        return;
    if (n > 0) {
        memcpy(b->p + b->len, s, n);
        b->len += n;
    }
    b->p[b->len] = 0;
}

void api__buf_puts(struct api_buf *b, const char *s)
{
    api__buf_put(b, s, strlen(s));
}

void api__buf_cut(struct api_buf *b, size_t mark)
{
    if (b->p && mark < b->len) {
        b->len = mark;
        b->p[mark] = 0;
    }
}

char *api__buf_finish(struct api_buf *b)
{
    if (b->oom || !b->p) {
        free(b->p);
        return NULL;
    }
    return b->p;
}
