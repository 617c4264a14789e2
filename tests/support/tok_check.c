/* tok_check.c: see tok_check.h. */
#include "tok_check.h"

#include "utf8_check.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct tokenizer *tok_real_load(struct tok_real *r, const char *path, int metadata_only)
{
    char err[256];
    struct stat st;
    int fd;

    if (r->tried)
        return r->t;
    r->tried = 1;
    fd = open(path, O_RDONLY);
    if (fd < 0 || fstat(fd, &st) < 0) {
        printf("note: %s absent: its tests skip\n", path);
        if (fd >= 0)
            close(fd);
        return NULL;
    }
    r->len = (size_t)st.st_size;
    r->map = mmap(NULL, r->len, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    close(fd);
    if (r->map == MAP_FAILED) {
        r->map = NULL;
        return NULL;
    }
    if (metadata_only && r->len >= 24)
        memset((char *)r->map + 8, 0, 8); /* the tensor count */
    if (gguf_parse(&r->g, r->map, r->len, err, sizeof err) < 0) {
        printf("gguf_parse: %s\n", err);
        return NULL;
    }
    if (tok_load(&r->t, &r->g, err, sizeof err) < 0) {
        printf("tok_load: %s\n", err);
        return NULL;
    }
    return r->t;
}

int32_t *tok_check_encode(const struct tokenizer *t, const char *s, size_t len, int bos,
                          int special, int64_t *n)
{
    int64_t need = tok_encode(t, s, len, bos, special, NULL, 0);
    int32_t *ids;

    *n = need;
    if (need < 0)
        return NULL;
    ids = malloc((size_t)(need ? need : 1) * sizeof *ids);
    if (!ids)
        return NULL;
    *n = tok_encode(t, s, len, bos, special, ids, need);
    return ids;
}

char *tok_check_decode(const struct tokenizer *t, const int32_t *ids, int64_t n, size_t *len)
{
    size_t total = 0;
    char *out;

    for (int64_t i = 0; i < n; i++) {
        size_t l;
        if (!tok_piece(t, ids[i], &l))
            return NULL;
        total += l;
    }
    out = malloc(total + 1);
    if (!out)
        return NULL;
    *len = 0;
    for (int64_t i = 0; i < n; i++) {
        size_t l;
        const char *p = tok_piece(t, ids[i], &l);
        memcpy(out + *len, p, l);
        *len += l;
    }
    out[*len] = '\0';
    return out;
}

int64_t tok_check_controls(const struct tok_real *r, const struct tokenizer *t)
{
    int32_t *types = NULL;
    uint64_t n_types = 0;
    if (gguf_get_arr_i32(&r->g, "tokenizer.ggml.token_type", &types, &n_types) != 0 ||
        n_types != (uint64_t)tok_n_vocab(t)) {
        free(types);
        return -1;
    }
    int64_t n = 0;
    for (uint64_t i = 0; i < n_types; i++) {
        size_t len = 0;
        const char *p = tok_piece(t, (int32_t)i, &len);
        int want = types[i] == 3 && p && len > 0;
        if (tok_is_control(t, (int32_t)i) != want) {
            fprintf(stderr, "  token %llu: tok_is_control %d, token_type %d\n",
                    (unsigned long long)i, !want, types[i]);
            free(types);
            return -1;
        }
        n += want;
    }
    free(types);
    return n;
}

int tok_check_roundtrips(const struct tokenizer *t, const char *s, size_t len, int special)
{
    int64_t n;
    int32_t *ids = tok_check_encode(t, s, len, 0, special, &n);
    size_t back_len = 0;
    char *back = ids ? tok_check_decode(t, ids, n, &back_len) : NULL;
    int ok = back && back_len == len && memcmp(back, s, len) == 0;

    free(ids);
    free(back);
    return ok;
}

int tok_check_stream_equals(const struct tokenizer *t, const int32_t *ids, int64_t n,
                            const char *want, size_t want_len)
{
    struct tok_stream st = {0};
    size_t got = 0;
    char buf[1024];
    int ok = 1;

    for (int64_t i = 0; i < n && ok; i++) {
        int64_t w = tok_stream_push(t, &st, ids[i], buf, sizeof buf);
        if (w < 0 || !test_valid_utf8((unsigned char *)buf, (size_t)w) ||
            got + (size_t)w > want_len || memcmp(want + got, buf, (size_t)w) != 0)
            ok = 0;
        else
            got += (size_t)w;
    }
    if (ok && tok_stream_flush(&st, buf, sizeof buf) != 0)
        ok = 0;
    return ok && got == want_len;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int tok_check_encode_long(const struct tokenizer *t, const char *what, const char *text, size_t len)
{
    double t0 = now_s();
    int64_t n;
    int32_t *ids = tok_check_encode(t, text, len, 0, 0, &n);
    double dt = now_s() - t0;
    size_t back_len = 0;
    char *back;
    int ok;

    if (!ids)
        return 0;
    printf("  %s: %zu bytes -> %lld tokens in %.3f s (%.2f M tokens/s, %.1f MB/s)\n", what, len,
           (long long)n, dt, (double)n / dt / 1e6, (double)len / dt / 1e6);
    back = tok_check_decode(t, ids, n, &back_len);
    ok = back && back_len == len && memcmp(back, text, len) == 0;
    free(back);
    free(ids);
    return ok;
}

char *tok_check_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    long n;

    *len = 0;
    if (!f)
        return NULL;
    if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
        (buf = malloc((size_t)n + 1)) != NULL) {
        *len = fread(buf, 1, (size_t)n, f);
        buf[*len] = '\0';
    }
    fclose(f);
    return buf;
}

void tok_check_print_text(const char *s, size_t len)
{
    fputs("    text: \"", stderr);
    for (size_t i = 0; i < len && i < 120; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c < 0x7f && c != '\\')
            fputc(c, stderr);
        else
            fprintf(stderr, "\\x%02x", c);
    }
    fputs(len > 120 ? "\"...\n" : "\"\n", stderr);
}

/* ---- the fixtures ---- */

static int hexval(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

/* Parses one "flags TAB hex TAB ids" line (NUL-terminated, no newline). */
static int parse_case(char *line, struct tok_case *c)
{
    char *hex = strchr(line, '\t');
    char *ids = hex ? strchr(hex + 1, '\t') : NULL;
    size_t nhex;

    if (!ids)
        return -1;
    *hex++ = '\0';
    *ids++ = '\0';
    c->special = strchr(line, 's') != NULL;
    c->roundtrips = strchr(line, 'r') != NULL;
    nhex = strlen(hex);
    if (nhex % 2)
        return -1;
    c->len = nhex / 2;
    c->text = malloc(c->len + 1);
    c->ids = malloc((strlen(ids) / 2 + 1) * sizeof *c->ids);
    if (!c->text || !c->ids)
        return -1;
    for (size_t i = 0; i < c->len; i++) {
        int hi = hexval(hex[2 * i]);
        int lo = hexval(hex[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return -1;
        c->text[i] = (char)(hi << 4 | lo);
    }
    c->text[c->len] = '\0';
    c->n_ids = 0;
    for (char *p = ids; *p;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p)
            return -1;
        c->ids[c->n_ids++] = (int32_t)v;
        p = end;
        while (*p == ' ')
            p++;
    }
    return 0;
}

int tok_fixture_load(struct tok_fixture *f)
{
    size_t len;
    char *buf;
    char *line;
    char *save = NULL;
    int cap = 0;

    if (f->loaded)
        return f->n;
    f->loaded = 1;
    buf = tok_check_read_file(f->path, &len);
    if (!buf) {
        printf("cannot read %s\n", f->path);
        f->n = -1;
        return -1;
    }
    for (line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (line[0] == '#')
            continue;
        if (f->n == cap) {
            struct tok_case *nc;
            cap = cap * 2 + 64;
            nc = realloc(f->c, (size_t)cap * sizeof *nc);
            if (!nc) {
                f->n = -1;
                break;
            }
            f->c = nc;
        }
        memset(&f->c[f->n], 0, sizeof f->c[f->n]);
        if (parse_case(line, &f->c[f->n]) < 0) {
            printf("%s: bad line %d\n", f->path, f->n);
            f->n = -1;
            break;
        }
        f->n++;
    }
    free(buf);
    return f->n;
}

int tok_fixture_mismatches(const struct tokenizer *t, const struct tok_fixture *f)
{
    int bad = 0;

    for (int i = 0; i < f->n; i++) {
        const struct tok_case *c = &f->c[i];
        int64_t got_n;
        int32_t *got = tok_check_encode(t, c->text, c->len, 0, c->special, &got_n);
        int64_t k = 0;

        if (!got)
            return f->n;
        while (k < got_n && k < c->n_ids && got[k] == c->ids[k])
            k++;
        if ((k < got_n || k < c->n_ids) && bad++ < 5) {
            fprintf(stderr,
                    "  case %d (special=%d): %lld ids, reference %lld, first diff at %lld:", i,
                    c->special, (long long)got_n, (long long)c->n_ids, (long long)k);
            for (int64_t j = k; j < k + 6; j++)
                fprintf(stderr, " %d/%d", j < got_n ? got[j] : -1, j < c->n_ids ? c->ids[j] : -1);
            fputc('\n', stderr);
            tok_check_print_text(c->text, c->len);
        }
        free(got);
    }
    printf("  %s: %d cases, %d differ from the reference\n", f->path, f->n, bad);
    return bad;
}
