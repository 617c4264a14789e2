/*
 * sse.h: server-sent events framing into a caller's buffer. Pure: no sockets,
 * no allocation, so it is unit-tested byte for byte.
 *
 *   data frame:  "data: <line>\n" for each line of the payload, then "\n"
 *   comment:     ": <text>\n\n"   (keep-alives; clients ignore them)
 *   done:        "data: [DONE]\n\n"
 *
 * A payload line break (\n, \r\n or \r) starts a new "data: " line, so any
 * text frames correctly; cJSON's unformatted output has none, so a JSON chunk
 * is exactly one line. Each function returns the bytes the frame needs; it
 * writes only when that fits in cap (snprintf's contract, without the NUL).
 */
#ifndef SS_SSE_H
#define SS_SSE_H

#include <stddef.h>

size_t sse_frame_data(char *buf, size_t cap, const char *data, size_t len);
size_t sse_frame_comment(char *buf, size_t cap, const char *text);
size_t sse_frame_done(char *buf, size_t cap);

#endif
