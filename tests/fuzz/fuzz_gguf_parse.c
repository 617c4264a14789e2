/*
 * fuzz_gguf_parse.c: libFuzzer target for the GGUF parser. Any byte string
 * goes to gguf_parse; when it parses, every getter runs on every key and the
 * first and last byte of every tensor's data is read, so ASan catches a view
 * that points outside the input. The parser must never crash, leak or read
 * past the input, whatever the bytes.
 *
 * Build and run (clang only; the engine sources are compiled in directly):
 *
 *   cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DSTREAMSINK_FUZZ=ON \
 *         -DSTREAMSINK_CUDA=OFF
 *   cmake --build build-fuzz --target fuzz_gguf_parse
 *   mkdir -p /tmp/gguf-corpus
 *   STREAMSINK_GGUF_SEED_DIR=/tmp/gguf-corpus build-fuzz/test_gguf   # seed files
 *   build-fuzz/tests/fuzz/fuzz_gguf_parse /tmp/gguf-corpus -max_total_time=60 \
 *         -max_len=65536 -rss_limit_mb=2048
 *
 * A crash leaves crash-<sha1> in the current directory; rerun it with
 * build-fuzz/tests/fuzz/fuzz_gguf_parse crash-<sha1>.
 */
#include "gguf.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile uint8_t sink;

static void exercise_getters(const struct gguf_file *g, const char *key)
{
    int64_t iv;
    double fv;
    int bv;
    struct gguf_str s;
    struct gguf_str *sv;
    int32_t *i32;
    float *f32;
    uint64_t n;
    char buf[32];

    if (gguf_get_i64(g, key, &iv) == 0)
        sink ^= (uint8_t)iv;
    if (gguf_get_f64(g, key, &fv) == 0)
        sink ^= (uint8_t)(fv == fv);
    if (gguf_get_bool(g, key, &bv) == 0)
        sink ^= (uint8_t)bv;
    if (gguf_get_str(g, key, &s) == 0 && s.len > 0)
        sink ^= (uint8_t)(s.ptr[0] ^ s.ptr[s.len - 1]);
    gguf_get_cstr(g, key, buf, sizeof buf);
    if (gguf_get_arr_str(g, key, &sv, &n) == 0) {
        for (uint64_t i = 0; i < n; i++)
            if (sv[i].len > 0)
                sink ^= (uint8_t)(sv[i].ptr[0] ^ sv[i].ptr[sv[i].len - 1]);
        free(sv);
    }
    if (gguf_get_arr_i32(g, key, &i32, &n) == 0) {
        if (n > 0)
            sink ^= (uint8_t)(i32[0] ^ i32[n - 1]);
        free(i32);
    }
    if (gguf_get_arr_f32(g, key, &f32, &n) == 0) {
        if (n > 0)
            sink ^= (uint8_t)(f32[0] == f32[n - 1]);
        free(f32);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct gguf_file g;
    char err[256];
    char key[128];

    /* a private copy, so a read one past the end is a heap overflow ASan sees */
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy)
        return 0;
    if (size)
        memcpy(copy, data, size);
    if (gguf_parse(&g, copy, size, err, sizeof err) == 0) {
        for (uint64_t i = 0; i < g.n_kv; i++) {
            const struct gguf_kv *kv = &g.kv[i];
            if (kv->key.len >= sizeof key || memchr(kv->key.ptr, 0, kv->key.len))
                continue;
            memcpy(key, kv->key.ptr, kv->key.len);
            key[kv->key.len] = '\0';
            exercise_getters(&g, key);
        }
        exercise_getters(&g, "general.alignment");
        for (uint64_t i = 0; i < g.n_tensors; i++) {
            const struct gguf_tensor *t = &g.tensors[i];
            const uint8_t *d = t->data;
            if (t->nbytes > 0)
                sink ^= (uint8_t)(d[0] ^ d[t->nbytes - 1]);
            if (t->name.len < sizeof key && !memchr(t->name.ptr, 0, t->name.len)) {
                memcpy(key, t->name.ptr, t->name.len);
                key[t->name.len] = '\0';
                if (gguf_find_tensor(&g, key) == NULL)
                    abort(); /* a parsed tensor must be found by its own name */
            }
        }
    }
    gguf_free(&g);
    free(copy);
    return 0;
}
