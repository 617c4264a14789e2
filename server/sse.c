/* sse.c: see sse.h. */
#include "sse.h"

#include <string.h>

static const char DATA[] = "data: ";

/* Bytes of the data frame for data, counting a "data: " per line. */
static size_t data_len(const char *data, size_t len)
{
    size_t n = sizeof DATA - 1 + 1 + 1; /* first prefix, last \n, blank line */
    for (size_t i = 0; i < len; i++) {
        if (data[i] == '\r' && i + 1 < len && data[i + 1] == '\n')
            continue; /* \r\n counts once, at the \n */
        if (data[i] == '\n' || data[i] == '\r')
            n += 1 + sizeof DATA - 1;
        else
            n++;
    }
    return n;
}

size_t sse_frame_data(char *buf, size_t cap, const char *data, size_t len)
{
    size_t need = data_len(data, len);
    if (need > cap)
        return need;
    size_t o = 0;
    memcpy(buf, DATA, sizeof DATA - 1);
    o += sizeof DATA - 1;
    for (size_t i = 0; i < len; i++) {
        if (data[i] == '\r' && i + 1 < len && data[i + 1] == '\n')
            continue;
        if (data[i] == '\n' || data[i] == '\r') {
            buf[o++] = '\n';
            memcpy(buf + o, DATA, sizeof DATA - 1);
            o += sizeof DATA - 1;
        } else {
            buf[o++] = data[i];
        }
    }
    buf[o++] = '\n';
    buf[o++] = '\n';
    return o;
}

size_t sse_frame_comment(char *buf, size_t cap, const char *text)
{
    size_t tl = 0;
    while (text[tl] && text[tl] != '\n' && text[tl] != '\r')
        tl++; /* a comment is one line */
    size_t need = 2 + tl + 2;
    if (need > cap)
        return need;
    buf[0] = ':';
    buf[1] = ' ';
    memcpy(buf + 2, text, tl);
    buf[2 + tl] = '\n';
    buf[3 + tl] = '\n';
    return need;
}

size_t sse_frame_done(char *buf, size_t cap)
{
    static const char done[] = "data: [DONE]\n\n";
    if (sizeof done - 1 <= cap)
        memcpy(buf, done, sizeof done - 1);
    return sizeof done - 1;
}
