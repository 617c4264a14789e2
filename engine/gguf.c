/*
 * gguf.c: the GGUF parser (format described in gguf.h). One pass over the
 * span with a bounds-checked cursor: header, key/value section, tensor
 * directory, then the data section, which is only checked (offsets aligned,
 * every tensor inside the file, no two tensors overlapping), never copied.
 *
 * Main invariant: no read happens before the cursor has checked that the bytes
 * are there, and every size computed from the file is checked for overflow
 * before it is used. Counts from the file are compared with the bytes left
 * before anything is allocated for them, so a 100-byte file cannot ask for a
 * gigabyte. Whatever goes wrong, the caller gets -EINVAL (or -ENOMEM) and one
 * line in err; nothing here asserts or exits on input.
 */
#include "gguf.h"

#include "quant.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GGUF_MAGIC 0x46554747u /* "GGUF" read as a little-endian u32 */
#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_DIMS 4
/* Arrays of arrays nest; recursion is bounded so a file cannot exhaust the stack. */
#define GGUF_MAX_ARRAY_DEPTH 8
/* Smallest possible entries, used to reject absurd counts before allocating:
 * a kv is a key length, a type and a one-byte value; a tensor entry is a name
 * length, n_dims, a type and an offset (n_dims may be 0). */
#define GGUF_MIN_KV_BYTES (8 + 4 + 1)
#define GGUF_MIN_TENSOR_BYTES (8 + 4 + 4 + 8)

struct cursor {
    const uint8_t *base;
    size_t len;
    size_t pos;
};

/* An error message under construction: err may be NULL or err_len 0. */
static void set_err(char *err, size_t err_len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void set_err(char *err, size_t err_len, const char *fmt, ...)
{
    va_list ap;

    if (!err || err_len == 0)
        return;
    va_start(ap, fmt);
    vsnprintf(err, err_len, fmt, ap);
    va_end(ap);
}

/* A name from the file made safe for a one-line message: at most 64 bytes,
 * anything outside printable ASCII (and quotes) shown as '?'. */
static const char *printable(struct gguf_str s, char *buf, size_t cap)
{
    size_t n = 0;
    uint64_t i;

    for (i = 0; i < s.len && n + 4 < cap; i++) {
        unsigned char c = (unsigned char)s.ptr[i];
        buf[n++] = (c >= 0x20 && c < 0x7f && c != '\'') ? (char)c : '?';
    }
    if (i < s.len) {
        buf[n++] = '.';
        buf[n++] = '.';
        buf[n++] = '.';
    }
    buf[n] = '\0';
    return buf;
}

static size_t remaining(const struct cursor *c)
{
    return c->len - c->pos;
}

static int read_bytes(struct cursor *c, void *dst, size_t n)
{
    if (n > remaining(c))
        return -EINVAL;
    memcpy(dst, c->base + c->pos, n);
    c->pos += n;
    return 0;
}

static int read_u32(struct cursor *c, uint32_t *out)
{
    return read_bytes(c, out, sizeof *out); /* the format and all our hosts are little-endian */
}

static int read_u64(struct cursor *c, uint64_t *out)
{
    return read_bytes(c, out, sizeof *out);
}

static int read_str(struct cursor *c, struct gguf_str *out)
{
    uint64_t n;

    if (read_u64(c, &n) < 0)
        return -EINVAL;
    if (n > remaining(c))
        return -EINVAL;
    out->ptr = (const char *)(c->base + c->pos);
    out->len = n;
    c->pos += (size_t)n;
    return 0;
}

/* Bytes of one scalar of type t; 0 for string, array and unknown types. */
static size_t scalar_size(uint32_t t)
{
    switch (t) {
    case GGUF_TYPE_UINT8:
    case GGUF_TYPE_INT8:
    case GGUF_TYPE_BOOL:
        return 1;
    case GGUF_TYPE_UINT16:
    case GGUF_TYPE_INT16:
        return 2;
    case GGUF_TYPE_UINT32:
    case GGUF_TYPE_INT32:
    case GGUF_TYPE_FLOAT32:
        return 4;
    case GGUF_TYPE_UINT64:
    case GGUF_TYPE_INT64:
    case GGUF_TYPE_FLOAT64:
        return 8;
    default:
        return 0;
    }
}

static int type_known(uint32_t t)
{
    return t <= GGUF_TYPE_FLOAT64;
}

static const char *type_name(uint32_t t)
{
    static const char *const names[] = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                        "bool", "string", "array", "u64", "i64", "f64"};
    return type_known(t) ? names[t] : "unknown";
}

/* Skips count elements of type t (the body of an array), checking every
 * length. Each element takes at least one byte, so the work is bounded by the
 * span even for arrays of empty arrays. */
static int skip_elements(struct cursor *c, uint32_t t, uint64_t count, int depth, char *err,
                         size_t err_len, const char *what)
{
    size_t sz = scalar_size(t);
    uint64_t i;

    if (sz > 0) {
        if (count > remaining(c) / sz) {
            set_err(err, err_len,
                    "gguf: %s: array of %llu %s values (%llu bytes each) runs past end of file "
                    "(%zu bytes)",
                    what, (unsigned long long)count, type_name(t), (unsigned long long)sz, c->len);
            return -EINVAL;
        }
        c->pos += (size_t)(count * sz);
        return 0;
    }
    if (t == GGUF_TYPE_STRING) {
        if (count > remaining(c) / 8) {
            set_err(err, err_len,
                    "gguf: %s: array of %llu strings runs past end of file (%zu bytes)", what,
                    (unsigned long long)count, c->len);
            return -EINVAL;
        }
        for (i = 0; i < count; i++) {
            struct gguf_str s;
            if (read_str(c, &s) < 0) {
                set_err(err, err_len,
                        "gguf: %s: string %llu of %llu runs past end of file (%zu bytes)", what,
                        (unsigned long long)i, (unsigned long long)count, c->len);
                return -EINVAL;
            }
        }
        return 0;
    }
    if (t == GGUF_TYPE_ARRAY) {
        if (depth >= GGUF_MAX_ARRAY_DEPTH) {
            set_err(err, err_len, "gguf: %s: arrays nested deeper than %d", what,
                    GGUF_MAX_ARRAY_DEPTH);
            return -EINVAL;
        }
        if (count > remaining(c) / 12) { /* each inner array has a type and a count */
            set_err(err, err_len,
                    "gguf: %s: array of %llu arrays runs past end of file (%zu bytes)", what,
                    (unsigned long long)count, c->len);
            return -EINVAL;
        }
        for (i = 0; i < count; i++) {
            uint32_t et;
            uint64_t n;
            int rc;
            if (read_u32(c, &et) < 0 || read_u64(c, &n) < 0) {
                set_err(err, err_len, "gguf: %s: inner array header runs past end of file", what);
                return -EINVAL;
            }
            if (!type_known(et)) {
                set_err(err, err_len, "gguf: %s: inner array has unknown element type %u", what,
                        et);
                return -EINVAL;
            }
            rc = skip_elements(c, et, n, depth + 1, err, err_len, what);
            if (rc < 0)
                return rc;
        }
        return 0;
    }
    set_err(err, err_len, "gguf: %s: unknown value type %u", what, t);
    return -EINVAL;
}

/* Reads the value of kv (its type is already set) and records where it is. */
static int read_value(struct cursor *c, struct gguf_kv *kv, char *err, size_t err_len,
                      const char *what)
{
    size_t start = c->pos;
    uint32_t t = kv->type;
    int rc;

    if (t == GGUF_TYPE_ARRAY) {
        uint32_t et;
        if (read_u32(c, &et) < 0 || read_u64(c, &kv->arr_len) < 0) {
            set_err(err, err_len, "gguf: %s: array header runs past end of file (%zu bytes)", what,
                    c->len);
            return -EINVAL;
        }
        if (!type_known(et)) {
            set_err(err, err_len, "gguf: %s: array has unknown element type %u", what, et);
            return -EINVAL;
        }
        kv->arr_type = (enum gguf_type)et;
        start = c->pos;
        rc = skip_elements(c, et, kv->arr_len, 1, err, err_len, what);
        if (rc < 0)
            return rc;
    } else if (t == GGUF_TYPE_STRING) {
        struct gguf_str s;
        if (read_str(c, &s) < 0) {
            set_err(err, err_len, "gguf: %s: string value runs past end of file (%zu bytes)", what,
                    c->len);
            return -EINVAL;
        }
    } else if (scalar_size(t) > 0) {
        if (scalar_size(t) > remaining(c)) {
            set_err(err, err_len, "gguf: %s: %s value runs past end of file (%zu bytes)", what,
                    type_name(t), c->len);
            return -EINVAL;
        }
        c->pos += scalar_size(t);
    } else {
        set_err(err, err_len, "gguf: %s: unknown value type %u", what, t);
        return -EINVAL;
    }
    kv->val = c->base + start;
    kv->val_len = c->pos - start;
    return 0;
}

static int str_cmp(struct gguf_str a, struct gguf_str b)
{
    uint64_t n = a.len < b.len ? a.len : b.len;
    int r = n ? memcmp(a.ptr, b.ptr, (size_t)n) : 0;
    if (r != 0)
        return r;
    return (a.len > b.len) - (a.len < b.len);
}

static int cmp_str_ptr(const void *a, const void *b)
{
    return str_cmp(**(const struct gguf_str *const *)a, **(const struct gguf_str *const *)b);
}

/* Finds two equal strings among n (each at stride bytes from the previous,
 * starting at first). Returns the duplicate or NULL; -ENOMEM through *rc. */
static const struct gguf_str *find_duplicate(const void *first, size_t stride, uint64_t n, int *rc)
{
    const struct gguf_str **v;
    const struct gguf_str *dup = NULL;
    uint64_t i;

    *rc = 0;
    if (n < 2)
        return NULL;
    v = malloc((size_t)n * sizeof *v);
    if (!v) {
        *rc = -ENOMEM;
        return NULL;
    }
    for (i = 0; i < n; i++)
        v[i] = (const struct gguf_str *)((const char *)first + (size_t)i * stride);
    qsort(v, (size_t)n, sizeof *v, cmp_str_ptr);
    for (i = 1; i < n && !dup; i++)
        if (str_cmp(*v[i - 1], *v[i]) == 0)
            dup = v[i];
    free(v);
    return dup;
}

static int cmp_tensor_offset(const void *a, const void *b)
{
    const struct gguf_tensor *x = *(const struct gguf_tensor *const *)a;
    const struct gguf_tensor *y = *(const struct gguf_tensor *const *)b;
    if (x->offset != y->offset)
        return x->offset < y->offset ? -1 : 1;
    return (x->nbytes > y->nbytes) - (x->nbytes < y->nbytes);
}

/* Checks that no two tensors with data share bytes. */
static int check_overlap(const struct gguf_file *g, char *err, size_t err_len)
{
    const struct gguf_tensor **v;
    const struct gguf_tensor *prev = NULL;
    uint64_t i;
    int rc = 0;

    if (g->n_tensors < 2)
        return 0;
    v = malloc((size_t)g->n_tensors * sizeof *v);
    if (!v) {
        set_err(err, err_len, "gguf: out of memory");
        return -ENOMEM;
    }
    for (i = 0; i < g->n_tensors; i++)
        v[i] = &g->tensors[i];
    qsort(v, (size_t)g->n_tensors, sizeof *v, cmp_tensor_offset);
    for (i = 0; i < g->n_tensors; i++) {
        if (v[i]->nbytes == 0)
            continue;
        if (prev && v[i]->offset < prev->offset + prev->nbytes) {
            char a[80], b[80];
            set_err(err, err_len,
                    "gguf: tensors '%s' [offset %llu, %zu bytes] and '%s' [offset %llu, %zu "
                    "bytes] overlap",
                    printable(prev->name, a, sizeof a), (unsigned long long)prev->offset,
                    prev->nbytes, printable(v[i]->name, b, sizeof b),
                    (unsigned long long)v[i]->offset, v[i]->nbytes);
            rc = -EINVAL;
            break;
        }
        prev = v[i];
    }
    free(v);
    return rc;
}

static int parse_kvs(struct gguf_file *g, struct cursor *c, char *err, size_t err_len)
{
    uint64_t i;
    const struct gguf_str *dup;
    int rc;

    if (g->n_kv == 0)
        return 0;
    g->kv = calloc((size_t)g->n_kv, sizeof *g->kv);
    if (!g->kv) {
        set_err(err, err_len, "gguf: out of memory for %llu key/value pairs",
                (unsigned long long)g->n_kv);
        return -ENOMEM;
    }
    for (i = 0; i < g->n_kv; i++) {
        struct gguf_kv *kv = &g->kv[i];
        char what[128], name[80];
        uint32_t t;

        if (read_str(c, &kv->key) < 0) {
            set_err(err, err_len, "gguf: key %llu of %llu runs past end of file (%zu bytes)",
                    (unsigned long long)i, (unsigned long long)g->n_kv, c->len);
            return -EINVAL;
        }
        snprintf(what, sizeof what, "key '%s'", printable(kv->key, name, sizeof name));
        if (read_u32(c, &t) < 0) {
            set_err(err, err_len, "gguf: %s: type runs past end of file (%zu bytes)", what, c->len);
            return -EINVAL;
        }
        if (!type_known(t)) {
            set_err(err, err_len, "gguf: %s: unknown value type %u", what, t);
            return -EINVAL;
        }
        kv->type = (enum gguf_type)t;
        rc = read_value(c, kv, err, err_len, what);
        if (rc < 0)
            return rc;
    }
    dup = find_duplicate(&g->kv[0].key, sizeof g->kv[0], g->n_kv, &rc);
    if (rc < 0) {
        set_err(err, err_len, "gguf: out of memory");
        return rc;
    }
    if (dup) {
        char name[80];
        set_err(err, err_len, "gguf: duplicate key '%s'", printable(*dup, name, sizeof name));
        return -EINVAL;
    }
    return 0;
}

static int read_alignment(struct gguf_file *g, char *err, size_t err_len)
{
    const struct gguf_kv *kv = gguf_find_kv(g, "general.alignment");
    int64_t a;

    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    if (!kv)
        return 0;
    if (gguf_get_i64(g, "general.alignment", &a) < 0) {
        if (scalar_size(kv->type) == 0 || kv->type == GGUF_TYPE_BOOL ||
            kv->type == GGUF_TYPE_FLOAT32 || kv->type == GGUF_TYPE_FLOAT64)
            set_err(err, err_len, "gguf: general.alignment has type %s, expected an integer",
                    type_name(kv->type));
        else
            set_err(err, err_len, "gguf: general.alignment is too large");
        return -EINVAL;
    }
    if (a <= 0 || (a & (a - 1)) != 0) {
        set_err(err, err_len, "gguf: general.alignment %lld is not a power of two", (long long)a);
        return -EINVAL;
    }
    g->alignment = (uint64_t)a;
    return 0;
}

/* Reads one tensor directory entry: name, shape, type, offset; computes nbytes. */
static int parse_tensor_info(struct gguf_tensor *t, uint64_t index, uint64_t n, struct cursor *c,
                             char *err, size_t err_len)
{
    char name[80];
    uint32_t d, type;
    int64_t nelem = 1;
    size_t row;

    if (read_str(c, &t->name) < 0) {
        set_err(err, err_len, "gguf: name of tensor %llu of %llu runs past end of file (%zu bytes)",
                (unsigned long long)index, (unsigned long long)n, c->len);
        return -EINVAL;
    }
    printable(t->name, name, sizeof name);
    if (read_u32(c, &t->n_dims) < 0) {
        set_err(err, err_len, "gguf: tensor '%s': n_dims runs past end of file", name);
        return -EINVAL;
    }
    if (t->n_dims > GGUF_MAX_DIMS) {
        set_err(err, err_len, "gguf: tensor '%s' has %u dimensions (at most %d)", name, t->n_dims,
                GGUF_MAX_DIMS);
        return -EINVAL;
    }
    for (d = 0; d < GGUF_MAX_DIMS; d++)
        t->ne[d] = 1;
    for (d = 0; d < t->n_dims; d++) {
        uint64_t v;
        if (read_u64(c, &v) < 0) {
            set_err(err, err_len, "gguf: tensor '%s': shape runs past end of file", name);
            return -EINVAL;
        }
        if (v > (uint64_t)INT64_MAX) {
            set_err(err, err_len, "gguf: tensor '%s': ne[%u] = %llu is negative or too large", name,
                    d, (unsigned long long)v);
            return -EINVAL;
        }
        t->ne[d] = (int64_t)v;
        if (t->ne[d] != 0 && nelem > INT64_MAX / t->ne[d]) {
            set_err(err, err_len, "gguf: tensor '%s': element count overflows", name);
            return -EINVAL;
        }
        nelem *= t->ne[d];
    }
    if (read_u32(c, &type) < 0 || read_u64(c, &t->offset) < 0) {
        set_err(err, err_len, "gguf: tensor '%s': type/offset runs past end of file", name);
        return -EINVAL;
    }
    t->type = (int)type;
    if (type > (uint32_t)INT32_MAX || !qtype_supported((int)type)) {
        set_err(err, err_len, "gguf: tensor '%s' has unsupported tensor type %s (%u)", name,
                qtype_name(type > (uint32_t)INT32_MAX ? -1 : (int)type), type);
        return -EINVAL;
    }
    /* nbytes = row bytes of ne[0] values, times ne[1] * ne[2] * ne[3] rows */
    row = qtype_row_bytes(t->type, t->ne[0]);
    if (row == 0 && t->ne[0] != 0) {
        set_err(err, err_len,
                "gguf: tensor '%s': ne[0] = %lld is not a multiple of the %s block (%lld values)",
                name, (long long)t->ne[0], qtype_name(t->type),
                (long long)qtype_block_values(t->type));
        return -EINVAL;
    }
    t->nbytes = row;
    for (d = 1; d < GGUF_MAX_DIMS; d++) {
        uint64_t r = (uint64_t)t->ne[d];
        if (r != 0 && t->nbytes > SIZE_MAX / r) {
            set_err(err, err_len, "gguf: tensor '%s': byte size overflows", name);
            return -EINVAL;
        }
        t->nbytes *= (size_t)r;
    }
    return 0;
}

static int parse_tensors(struct gguf_file *g, struct cursor *c, char *err, size_t err_len)
{
    uint64_t i, data_start, data_len, pad;
    const struct gguf_str *dup;
    int rc;

    if (g->n_tensors > remaining(c) / GGUF_MIN_TENSOR_BYTES) {
        set_err(err, err_len,
                "gguf: %llu tensors cannot fit in the %zu bytes left after the key/value section",
                (unsigned long long)g->n_tensors, remaining(c));
        return -EINVAL;
    }
    if (g->n_tensors > 0) {
        g->tensors = calloc((size_t)g->n_tensors, sizeof *g->tensors);
        if (!g->tensors) {
            set_err(err, err_len, "gguf: out of memory for %llu tensors",
                    (unsigned long long)g->n_tensors);
            return -ENOMEM;
        }
    }
    for (i = 0; i < g->n_tensors; i++) {
        rc = parse_tensor_info(&g->tensors[i], i, g->n_tensors, c, err, err_len);
        if (rc < 0)
            return rc;
    }
    if (g->n_tensors == 0)
        return 0; /* some writers stop at the directory: no data section, no padding */

    /* data section: header end rounded up to the alignment */
    pad = (g->alignment - (uint64_t)c->pos % g->alignment) % g->alignment;
    if (pad > remaining(c)) {
        set_err(err, err_len,
                "gguf: data section (at %zu, aligned to %llu) starts past end of file (%zu "
                "bytes)",
                c->pos, (unsigned long long)g->alignment, c->len);
        return -EINVAL;
    }
    data_start = c->pos + pad;
    data_len = c->len - data_start;

    for (i = 0; i < g->n_tensors; i++) {
        struct gguf_tensor *t = &g->tensors[i];
        char name[80];

        if (t->offset % g->alignment != 0) {
            set_err(err, err_len, "gguf: tensor '%s' offset %llu is not aligned to %llu bytes",
                    printable(t->name, name, sizeof name), (unsigned long long)t->offset,
                    (unsigned long long)g->alignment);
            return -EINVAL;
        }
        if (t->offset > data_len || t->nbytes > data_len - t->offset) {
            set_err(err, err_len,
                    "gguf: tensor '%s' data [offset %llu, %zu bytes] runs past end of file "
                    "(%zu bytes)",
                    printable(t->name, name, sizeof name), (unsigned long long)t->offset, t->nbytes,
                    c->len);
            return -EINVAL;
        }
        t->data = c->base + data_start + t->offset;
    }
    dup = find_duplicate(&g->tensors[0].name, sizeof g->tensors[0], g->n_tensors, &rc);
    if (rc < 0) {
        set_err(err, err_len, "gguf: out of memory");
        return rc;
    }
    if (dup) {
        char name[80];
        set_err(err, err_len, "gguf: duplicate tensor name '%s'",
                printable(*dup, name, sizeof name));
        return -EINVAL;
    }
    return check_overlap(g, err, err_len);
}

int gguf_parse(struct gguf_file *g, const void *buf, size_t len, char *err, size_t err_len)
{
    struct cursor c = {buf, len, 0};
    uint32_t magic;
    int rc;

    memset(g, 0, sizeof *g);
    g->base = buf;
    g->len = len;
    if (err && err_len > 0)
        err[0] = '\0';

    if (!buf && len > 0) {
        set_err(err, err_len, "gguf: no buffer");
        return -EINVAL;
    }
    if (read_u32(&c, &magic) < 0 || magic != GGUF_MAGIC) {
        set_err(err, err_len, "gguf: bad magic: not a GGUF file (%zu bytes)", len);
        return -EINVAL;
    }
    if (read_u32(&c, &g->version) < 0) {
        set_err(err, err_len, "gguf: header runs past end of file (%zu bytes)", len);
        return -EINVAL;
    }
    if (g->version != 2 && g->version != 3) {
        /* a big-endian file reads as 0x02000000 or 0x03000000 */
        set_err(err, err_len, "gguf: unsupported version %u (need 2 or 3%s)", g->version,
                g->version > 0xffff && (g->version & 0xffff) == 0 ? "; a big-endian file?" : "");
        rc = -EINVAL;
        goto fail;
    }
    if (read_u64(&c, &g->n_tensors) < 0 || read_u64(&c, &g->n_kv) < 0) {
        set_err(err, err_len, "gguf: header runs past end of file (%zu bytes)", len);
        rc = -EINVAL;
        goto fail;
    }
    /* absurd counts are rejected before anything is allocated for them */
    if (g->n_kv > remaining(&c) / GGUF_MIN_KV_BYTES ||
        g->n_tensors > (remaining(&c) - g->n_kv * GGUF_MIN_KV_BYTES) / GGUF_MIN_TENSOR_BYTES) {
        set_err(err, err_len,
                "gguf: %llu tensors and %llu key/value pairs cannot fit in a file of %zu bytes",
                (unsigned long long)g->n_tensors, (unsigned long long)g->n_kv, len);
        rc = -EINVAL;
        goto fail;
    }
    rc = parse_kvs(g, &c, err, err_len);
    if (rc < 0)
        goto fail;
    rc = read_alignment(g, err, err_len);
    if (rc < 0)
        goto fail;
    rc = parse_tensors(g, &c, err, err_len);
    if (rc < 0)
        goto fail;
    return 0;
fail:
    gguf_free(g);
    return rc;
}

void gguf_free(struct gguf_file *g)
{
    if (!g)
        return;
    free(g->kv);
    free(g->tensors);
    memset(g, 0, sizeof *g);
}

int gguf_str_eq(struct gguf_str s, const char *c)
{
    size_t n = strlen(c);
    return s.len == n && (n == 0 || memcmp(s.ptr, c, n) == 0);
}

const struct gguf_kv *gguf_find_kv(const struct gguf_file *g, const char *key)
{
    uint64_t i;

    if (!g->kv)
        return NULL;
    for (i = 0; i < g->n_kv; i++)
        if (gguf_str_eq(g->kv[i].key, key))
            return &g->kv[i];
    return NULL;
}

const struct gguf_tensor *gguf_find_tensor(const struct gguf_file *g, const char *name)
{
    uint64_t i;

    if (!g->tensors)
        return NULL;
    for (i = 0; i < g->n_tensors; i++)
        if (gguf_str_eq(g->tensors[i].name, name))
            return &g->tensors[i];
    return NULL;
}

/* Integer at p of type t, widened: signed types to *s, unsigned to *u.
 * Returns 1 for signed, 0 for unsigned, -1 if t is not an integer type. */
static int load_int(const uint8_t *p, uint32_t t, int64_t *s, uint64_t *u)
{
    switch (t) {
    case GGUF_TYPE_UINT8: {
        uint8_t v;
        memcpy(&v, p, 1);
        *u = v;
        return 0;
    }
    case GGUF_TYPE_INT8: {
        int8_t v;
        memcpy(&v, p, 1);
        *s = v;
        return 1;
    }
    case GGUF_TYPE_UINT16: {
        uint16_t v;
        memcpy(&v, p, 2);
        *u = v;
        return 0;
    }
    case GGUF_TYPE_INT16: {
        int16_t v;
        memcpy(&v, p, 2);
        *s = v;
        return 1;
    }
    case GGUF_TYPE_UINT32: {
        uint32_t v;
        memcpy(&v, p, 4);
        *u = v;
        return 0;
    }
    case GGUF_TYPE_INT32: {
        int32_t v;
        memcpy(&v, p, 4);
        *s = v;
        return 1;
    }
    case GGUF_TYPE_UINT64:
        memcpy(u, p, 8);
        return 0;
    case GGUF_TYPE_INT64:
        memcpy(s, p, 8);
        return 1;
    default:
        return -1;
    }
}

/* Integer at p of type t as an int64 within [lo, hi]; -EINVAL if it is not an
 * integer or does not fit. */
static int load_int_in(const uint8_t *p, uint32_t t, int64_t lo, int64_t hi, int64_t *out)
{
    int64_t s = 0;
    uint64_t u = 0;
    int k = load_int(p, t, &s, &u);

    if (k < 0)
        return -EINVAL;
    if (k == 0) {
        if (u > (uint64_t)hi)
            return -EINVAL;
        s = (int64_t)u;
    }
    if (s < lo || s > hi)
        return -EINVAL;
    *out = s;
    return 0;
}

static int load_float(const uint8_t *p, uint32_t t, double *out)
{
    if (t == GGUF_TYPE_FLOAT32) {
        float f;
        memcpy(&f, p, 4);
        *out = f;
        return 0;
    }
    if (t == GGUF_TYPE_FLOAT64) {
        memcpy(out, p, 8);
        return 0;
    }
    return -EINVAL;
}

int gguf_get_i64(const struct gguf_file *g, const char *key, int64_t *out)
{
    const struct gguf_kv *kv = gguf_find_kv(g, key);

    if (!kv)
        return -ENOENT;
    return load_int_in(kv->val, kv->type, INT64_MIN, INT64_MAX, out);
}

int gguf_get_f64(const struct gguf_file *g, const char *key, double *out)
{
    const struct gguf_kv *kv = gguf_find_kv(g, key);

    if (!kv)
        return -ENOENT;
    return load_float(kv->val, kv->type, out);
}

int gguf_get_bool(const struct gguf_file *g, const char *key, int *out)
{
    const struct gguf_kv *kv = gguf_find_kv(g, key);

    if (!kv)
        return -ENOENT;
    if (kv->type != GGUF_TYPE_BOOL)
        return -EINVAL;
    *out = kv->val[0] != 0;
    return 0;
}

int gguf_get_str(const struct gguf_file *g, const char *key, struct gguf_str *out)
{
    const struct gguf_kv *kv = gguf_find_kv(g, key);
    uint64_t n;

    if (!kv)
        return -ENOENT;
    if (kv->type != GGUF_TYPE_STRING)
        return -EINVAL;
    memcpy(&n, kv->val, 8);
    out->ptr = (const char *)kv->val + 8;
    out->len = n;
    return 0;
}

int gguf_get_cstr(const struct gguf_file *g, const char *key, char *buf, size_t cap)
{
    struct gguf_str s;
    size_t n;
    int rc;

    if (cap == 0)
        return -EINVAL;
    rc = gguf_get_str(g, key, &s);
    if (rc < 0)
        return rc;
    n = s.len < cap - 1 ? (size_t)s.len : cap - 1;
    if (n > 0)
        memcpy(buf, s.ptr, n);
    buf[n] = '\0';
    return 0;
}

/* The array at key with element type check: -ENOENT / -EINVAL as the getters. */
static int find_array(const struct gguf_file *g, const char *key, const struct gguf_kv **out)
{
    const struct gguf_kv *kv = gguf_find_kv(g, key);

    if (!kv)
        return -ENOENT;
    if (kv->type != GGUF_TYPE_ARRAY)
        return -EINVAL;
    *out = kv;
    return 0;
}

int gguf_get_arr_str(const struct gguf_file *g, const char *key, struct gguf_str **out, uint64_t *n)
{
    const struct gguf_kv *kv;
    struct gguf_str *v;
    const uint8_t *p;
    uint64_t i;
    int rc = find_array(g, key, &kv);

    if (rc < 0)
        return rc;
    if (kv->arr_type != GGUF_TYPE_STRING)
        return -EINVAL;
    /* the parser checked every length: each string is at least its 8-byte length */
    v = malloc(kv->arr_len ? (size_t)kv->arr_len * sizeof *v : 1);
    if (!v)
        return -ENOMEM;
    p = kv->val;
    for (i = 0; i < kv->arr_len; i++) {
        memcpy(&v[i].len, p, 8);
        v[i].ptr = (const char *)p + 8;
        p += 8 + (size_t)v[i].len;
    }
    *out = v;
    *n = kv->arr_len;
    return 0;
}

int gguf_get_arr_i32(const struct gguf_file *g, const char *key, int32_t **out, uint64_t *n)
{
    const struct gguf_kv *kv;
    int32_t *v;
    size_t sz;
    uint64_t i;
    int rc = find_array(g, key, &kv);

    if (rc < 0)
        return rc;
    sz = scalar_size(kv->arr_type);
    if (sz == 0 || kv->arr_type == GGUF_TYPE_BOOL || kv->arr_type == GGUF_TYPE_FLOAT32 ||
        kv->arr_type == GGUF_TYPE_FLOAT64)
        return -EINVAL;
    v = malloc(kv->arr_len ? (size_t)kv->arr_len * sizeof *v : 1);
    if (!v)
        return -ENOMEM;
    for (i = 0; i < kv->arr_len; i++) {
        int64_t x;
        if (load_int_in(kv->val + (size_t)i * sz, kv->arr_type, INT32_MIN, INT32_MAX, &x) < 0) {
            free(v);
            return -EINVAL;
        }
        v[i] = (int32_t)x;
    }
    *out = v;
    *n = kv->arr_len;
    return 0;
}

int gguf_get_arr_f32(const struct gguf_file *g, const char *key, float **out, uint64_t *n)
{
    const struct gguf_kv *kv;
    float *v;
    size_t sz;
    uint64_t i;
    int rc = find_array(g, key, &kv);

    if (rc < 0)
        return rc;
    if (kv->arr_type != GGUF_TYPE_FLOAT32 && kv->arr_type != GGUF_TYPE_FLOAT64)
        return -EINVAL;
    sz = scalar_size(kv->arr_type);
    v = malloc(kv->arr_len ? (size_t)kv->arr_len * sizeof *v : 1);
    if (!v)
        return -ENOMEM;
    for (i = 0; i < kv->arr_len; i++) {
        double x;
        load_float(kv->val + (size_t)i * sz, kv->arr_type, &x);
        v[i] = (float)x;
    }
    *out = v;
    *n = kv->arr_len;
    return 0;
}
