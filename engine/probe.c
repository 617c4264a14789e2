/* probe.c: the sink probe (probe.h). */
#include "probe.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

const char probe_builtin_text[] =
    "In the beginning God created the heaven and the earth. And the earth was without form, "
    "and void; and darkness was upon the face of the deep. And the Spirit of God moved upon "
    "the face of the waters. And God said, Let there be light: and there was light. And God "
    "saw the light, that it was good: and God divided the light from the darkness. And God "
    "called the light Day, and the darkness he called Night. And the evening and the morning "
    "were the first day. And God said, Let there be a firmament in the midst of the waters, "
    "and let it divide the waters from the waters. And God made the firmament, and divided "
    "the waters which were under the firmament from the waters which were above the "
    "firmament: and it was so. And God called the firmament Heaven. And the evening and the "
    "morning were the second day. And God said, Let the waters under the heaven be gathered "
    "together unto one place, and let the dry land appear: and it was so. And God called the "
    "dry land Earth; and the gathering together of the waters called he Seas: and God saw "
    "that it was good.";

void probe_free(struct probe_result *r)
{
    free(r->mass1);
    free(r->mass4);
    free(r->mass16);
    memset(r, 0, sizeof *r);
}

int probe_run(struct fwd *f, const int32_t *ids, int64_t n, struct probe_result *out)
{
    const struct model_hparams *hp = &f->m->hp;
    const int L = hp->n_layer, H = hp->n_head;
    memset(out, 0, sizeof *out);
    if (n <= PROBE_MIN_CTX || n > f->pool.geo.window)
        return -EINVAL;
    if (fwd_probe_enable(f) < 0)
        return -ENOMEM;
    int64_t slot;
    if (kv_pool_acquire(&f->pool, &slot) < 0) {
        fwd_probe_disable(f);
        return -EBUSY;
    }
    out->n_layer = L;
    out->n_head = H;
    out->mass1 = calloc((size_t)L * H, sizeof(float));
    out->mass4 = calloc((size_t)L * H, sizeof(float));
    out->mass16 = calloc((size_t)L * H, sizeof(float));
    double *acc = calloc((size_t)L * H * 3, sizeof(double));
    int rc = 0;
    if (!out->mass1 || !out->mass4 || !out->mass16 || !acc) {
        rc = -ENOMEM;
        goto done;
    }
    struct kv_seq seq;
    kv_seq_init(&seq, &f->pool.geo, slot, (struct kv_policy){KV_POLICY_DENSE, 0},
                f->pool.geo.window, 0);
    int64_t chunk = f->max_tokens < f->pool.geo.chunk ? f->max_tokens : f->pool.geo.chunk;
    for (int64_t i0 = 0; i0 < n; i0 += chunk) {
        int64_t T = n - i0 < chunk ? n - i0 : chunk;
        struct fwd_input in = {&seq, ids + i0, T, FWD_LOGITS_NONE};
        int64_t r = fwd_step(f, &in, 1);
        if (r < 0) {
            rc = (int)r;
            goto done;
        }
        for (int l = 0; l < L; l++) {
            for (int64_t t = 0; t < T; t++) {
                if (i0 + t < PROBE_MIN_CTX)
                    continue;
                for (int h = 0; h < H; h++) {
                    const float *w = f->probe + (((size_t)l * T + t) * H + h) * BACKEND_PROBE_K;
                    double s = 0;
                    double *a = acc + ((size_t)l * H + h) * 3;
                    for (int k = 0; k < BACKEND_PROBE_K; k++) {
                        s += w[k];
                        if (k == 0)
                            a[0] += s;
                        if (k == 3)
                            a[1] += s;
                    }
                    a[2] += s;
                }
            }
        }
    }
    out->n_queries = n - PROBE_MIN_CTX;
    int sinks = 0;
    for (int i = 0; i < L * H; i++) {
        out->mass1[i] = (float)(acc[i * 3 + 0] / (double)out->n_queries);
        out->mass4[i] = (float)(acc[i * 3 + 1] / (double)out->n_queries);
        out->mass16[i] = (float)(acc[i * 3 + 2] / (double)out->n_queries);
        sinks += out->mass1[i] > PROBE_SINK_MASS;
    }
    out->sink_rate = (float)sinks / (float)(L * H);
done:
    free(acc);
    fwd_probe_disable(f); /* later steps take the fast attention path again */
    kv_pool_release(&f->pool, slot);
    if (rc < 0)
        probe_free(out);
    return rc;
}
