/*
 * gguf_writer.h: builds GGUF bytes in memory for tests (synthetic model and
 * tokenizer files, corrupted headers). Values are written in the host's byte
 * order, which GGUF's little-endian layout matches on every machine the
 * project builds for. The layout itself is described in engine/gguf.h; this
 * writer knows only the primitive encodings, and each test lays out its own
 * file with them, so that a test can also write what a valid file never holds.
 */
#ifndef SS_TESTS_SUPPORT_GGUF_WRITER_H
#define SS_TESTS_SUPPORT_GGUF_WRITER_H

#include <stddef.h>
#include <stdint.h>

#define GW_MAGIC 0x46554747u /* "GGUF" read as a little-endian u32 */

/* A growing byte buffer. Zero-initialize; release p with free(). Running out
 * of memory ends the test binary with a message (a test cannot go on). */
struct gw_buf {
    uint8_t *p;
    size_t len;
    size_t cap;
};

void gw_bytes(struct gw_buf *w, const void *src, size_t n);
void gw_u8(struct gw_buf *w, uint8_t v);
void gw_u16(struct gw_buf *w, uint16_t v);
void gw_u32(struct gw_buf *w, uint32_t v);
void gw_u64(struct gw_buf *w, uint64_t v);
void gw_f32(struct gw_buf *w, float v);
void gw_f64(struct gw_buf *w, double v);
/* A GGUF string: u64 length, then the bytes (no NUL). */
void gw_str(struct gw_buf *w, const char *s);
/* A key and its value type (enum gguf_type); the value follows. Returns 1:
 * one more pair, for the caller's count. */
int gw_key(struct gw_buf *w, const char *key, uint32_t type);
/* An array value's header: element type and count; the elements follow. */
void gw_arr(struct gw_buf *w, uint32_t elem_type, uint64_t n);
/* Overwrite 4 or 8 bytes at offset at (a count written before it was known,
 * or a field a test corrupts). */
void gw_put_u32_at(struct gw_buf *w, size_t at, uint32_t v);
void gw_put_u64_at(struct gw_buf *w, size_t at, uint64_t v);

#endif
