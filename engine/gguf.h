/*
 * gguf.h: a GGUF (versions 2 and 3) parser over a byte span, usually an mmap.
 * It copies nothing: strings and tensor data are views into the span. Every
 * count, length, offset and size is checked against the span before use, so a
 * truncated or corrupted file gives an error message, never a crash.
 *
 * Layout (all little-endian):
 *
 *   u32 magic "GGUF"  u32 version (2 or 3)  u64 n_tensors  u64 n_kv
 *   n_kv times:       string key, u32 type, value
 *   n_tensors times:  string name, u32 n_dims (<= 4), u64 ne[n_dims],
 *                     u32 ggml_type, u64 offset (relative to the data section)
 *   padding to general.alignment (default 32, a power of two)
 *   data section: each tensor at its offset, offsets aligned
 *
 *   string = u64 len, len bytes (not NUL-terminated)
 *   value  = scalar of the type, a string, or an array:
 *            u32 element type, u64 count, count elements (arrays of arrays allowed)
 *   types: 0 u8, 1 i8, 2 u16, 3 i16, 4 u32, 5 i32, 6 f32, 7 bool, 8 string,
 *          9 array, 10 u64, 11 i64, 12 f64
 *
 * ne[0] is the innermost (contiguous) dimension: a weight matrix of N rows of
 * K values has ne = {K, N}.
 */
#ifndef SS_GGUF_H
#define SS_GGUF_H

#include <stddef.h>
#include <stdint.h>

enum gguf_type {
    GGUF_TYPE_UINT8 = 0,
    GGUF_TYPE_INT8 = 1,
    GGUF_TYPE_UINT16 = 2,
    GGUF_TYPE_INT16 = 3,
    GGUF_TYPE_UINT32 = 4,
    GGUF_TYPE_INT32 = 5,
    GGUF_TYPE_FLOAT32 = 6,
    GGUF_TYPE_BOOL = 7,
    GGUF_TYPE_STRING = 8,
    GGUF_TYPE_ARRAY = 9,
    GGUF_TYPE_UINT64 = 10,
    GGUF_TYPE_INT64 = 11,
    GGUF_TYPE_FLOAT64 = 12,
};

struct gguf_str { /* a view into the file; not NUL-terminated */
    const char *ptr;
    uint64_t len;
};

struct gguf_kv {
    struct gguf_str key;
    enum gguf_type type;
    enum gguf_type arr_type; /* element type when type == ARRAY */
    uint64_t arr_len;        /* element count when type == ARRAY */
    const uint8_t *val;      /* scalar value, string (u64 len + bytes) or first array element */
    size_t val_len;          /* bytes of the whole value (array: all elements) */
};

struct gguf_tensor {
    struct gguf_str name;
    uint32_t n_dims;
    int64_t ne[4];   /* unused dims are 1 */
    int type;        /* ggml type id (enum qtype for the ones we support) */
    uint64_t offset; /* relative to the data section */
    size_t nbytes;
    const void *data; /* view into the span */
};

struct gguf_file {
    uint32_t version;
    uint64_t n_kv;
    uint64_t n_tensors;
    struct gguf_kv *kv;          /* [n_kv], owned */
    struct gguf_tensor *tensors; /* [n_tensors], owned */
    uint64_t alignment;
    const uint8_t *base; /* the span */
    size_t len;
};

/* Parses buf[0..len). On failure returns -EINVAL (or -ENOMEM), writes one
 * line to err and leaves g freed. Tensors of types qtype_supported() rejects
 * are an error ("unsupported tensor type"). g keeps views into buf: buf must
 * outlive g. */
int gguf_parse(struct gguf_file *g, const void *buf, size_t len, char *err, size_t err_len);
/* Safe on a zeroed or half-built g. Does not free g itself. */
void gguf_free(struct gguf_file *g);

const struct gguf_kv *gguf_find_kv(const struct gguf_file *g, const char *key);
const struct gguf_tensor *gguf_find_tensor(const struct gguf_file *g, const char *name);

/* Typed getters. Return 0 on success, -ENOENT if the key is absent, -EINVAL if
 * it has a type that cannot be converted (integers convert between widths when
 * the value fits; floats from f32/f64). */
int gguf_get_i64(const struct gguf_file *g, const char *key, int64_t *out);
int gguf_get_f64(const struct gguf_file *g, const char *key, double *out);
int gguf_get_bool(const struct gguf_file *g, const char *key, int *out);
int gguf_get_str(const struct gguf_file *g, const char *key, struct gguf_str *out);
/* Copies a string value into buf as a NUL-terminated string (truncating). */
int gguf_get_cstr(const struct gguf_file *g, const char *key, char *buf, size_t cap);

/* Arrays. gguf_get_arr_str fills *out with a malloc'd array of n views into the
 * file (caller frees *out with free()). gguf_get_arr_i32/f32 copy n elements of
 * an integer/float array (converting from any integer / float element type)
 * into a malloc'd array the caller frees. */
int gguf_get_arr_str(const struct gguf_file *g, const char *key, struct gguf_str **out,
                     uint64_t *n);
int gguf_get_arr_i32(const struct gguf_file *g, const char *key, int32_t **out, uint64_t *n);
int gguf_get_arr_f32(const struct gguf_file *g, const char *key, float **out, uint64_t *n);

/* 1 if s equals the NUL-terminated c. */
int gguf_str_eq(struct gguf_str s, const char *c);

#endif
