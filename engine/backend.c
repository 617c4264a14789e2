/*
 * backend.c: picking a backend by name, and the CUDA entry points of a build
 * without CUDA (they say so instead of failing to link).
 */
#include "backend.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

int backend_kind_parse(const char *s, enum backend_kind *out)
{
    if (strcmp(s, "cpu") == 0)
        *out = BACKEND_CPU;
    else if (strcmp(s, "cuda") == 0)
        *out = BACKEND_CUDA;
    else
        return -EINVAL;
    return 0;
}

const char *backend_kind_name(enum backend_kind k)
{
    return k == BACKEND_CUDA ? "cuda" : "cpu";
}

int backend_init(struct backend *b, const struct model *m, const struct backend_config *c,
                 char *err, size_t err_len)
{
    if (c->kind == BACKEND_CUDA) {
        struct backend_cuda_config cc = {
            .device = c->cuda_device, .max_tokens = c->max_tokens, .use_graphs = 1};
        return backend_cuda_init(b, m, &cc, err, err_len);
    }
    struct backend_cpu_config pc = {.n_threads = c->n_threads,
                                    .max_tokens = c->max_tokens,
                                    .reference_matmul = c->reference_matmul};
    return backend_cpu_init(b, m, &pc, err, err_len);
}

#ifndef SS_HAVE_CUDA
int backend_cuda_init(struct backend *b, const struct model *m, const struct backend_cuda_config *c,
                      char *err, size_t err_len)
{
    (void)m;
    (void)c;
    memset(b, 0, sizeof *b);
    snprintf(err, err_len,
             "cuda backend: this build has no CUDA support (nvcc was not found "
             "when it was configured; see STREAMSINK_CUDA)");
    return -ENOSYS;
}

int backend_cuda_device_count(void)
{
    return 0;
}

double backend_cuda_copy_gbps(int device, size_t bytes, int reps)
{
    (void)device;
    (void)bytes;
    (void)reps;
    return -1;
}
#endif
