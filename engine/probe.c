/*
 * probe.c: the sink probe and the load-time sink check (decoder.h), measured
 * through the decoder's observer: each observed layer adds its queries'
 * weights on the first positions to per-head sums.
 */
#include "decoder_impl.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

const char decoder_probe_text[] =
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

void decoder_probe_free(struct decoder_probe *p)
{
    free(p->mass1);
    free(p->mass4);
    free(p->mass16);
    memset(p, 0, sizeof *p);
}

struct probe_acc {
    int n_head;
    double *acc; /* [L*H][3] sums of the mass on the first 1, 4, 16 positions */
};

/* One observed layer: every query at position >= DECODER_PROBE_MIN_CTX (it
 * sees that many keys and itself: the probe runs one dense sequence from
 * position 0) adds its heads' first-position masses. */
static void probe_layer(void *arg, const struct decoder_layer_view *v)
{
    struct probe_acc *p = arg;
    const int H = p->n_head;
    for (int64_t t = 0; t < v->T; t++) {
        if (v->pos[t] < DECODER_PROBE_MIN_CTX)
            continue;
        for (int h = 0; h < H; h++) {
            const float *w = v->first + ((size_t)t * H + h) * DECODER_FIRST_K;
            double s = 0;
            double *a = p->acc + ((size_t)v->layer * H + h) * 3;
            for (int k = 0; k < DECODER_FIRST_K; k++) {
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

int decoder_probe_run(struct decoder *d, const int32_t *ids, int64_t n, struct decoder_probe *out)
{
    struct fwd *f = &d->fwd;
    const struct model_hparams *hp = &d->model.hp;
    const int L = hp->n_layer, H = hp->n_head;
    memset(out, 0, sizeof *out);
    if (n <= DECODER_PROBE_MIN_CTX || n > f->pool.geo.window)
        return -EINVAL;
    struct probe_acc pa = {H, calloc((size_t)L * H * 3, sizeof(double))};
    if (!pa.acc)
        return -ENOMEM;
    const struct decoder_observer obs = {DECODER_OBSERVE_FIRST, probe_layer, &pa};
    if (fwd_set_observer(f, &obs, 0) < 0) {
        free(pa.acc);
        return -ENOMEM;
    }
    int64_t slot;
    if (kv_pool_acquire(&f->pool, &slot) < 0) {
        fwd_set_observer(f, NULL, 0);
        free(pa.acc);
        return -EBUSY;
    }
    out->n_layer = L;
    out->n_head = H;
    out->mass1 = calloc((size_t)L * H, sizeof(float));
    out->mass4 = calloc((size_t)L * H, sizeof(float));
    out->mass16 = calloc((size_t)L * H, sizeof(float));
    int rc = 0;
    if (!out->mass1 || !out->mass4 || !out->mass16) {
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
    }
    out->n_queries = n - DECODER_PROBE_MIN_CTX;
    int sinks = 0;
    for (int i = 0; i < L * H; i++) {
        out->mass1[i] = (float)(pa.acc[i * 3 + 0] / (double)out->n_queries);
        out->mass4[i] = (float)(pa.acc[i * 3 + 1] / (double)out->n_queries);
        out->mass16[i] = (float)(pa.acc[i * 3 + 2] / (double)out->n_queries);
        sinks += out->mass1[i] > DECODER_PROBE_SINK_MASS;
    }
    out->sink_rate = (float)sinks / (float)(L * H);
done:
    free(pa.acc);
    fwd_set_observer(f, NULL, 0); /* later steps take the fast attention path again */
    kv_pool_release(&f->pool, slot);
    if (rc < 0)
        decoder_probe_free(out);
    return rc;
}

void decoder_sink_check(struct decoder *d, struct decoder_sink_check *out)
{
    int32_t ids[1024];
    struct decoder_probe pr;
    memset(out, 0, sizeof *out);
    out->sink_rate = out->first_mass = -1.0f;
    int64_t n = tok_encode(d->tok, decoder_probe_text, strlen(decoder_probe_text),
                           tok_add_bos(d->tok), 0, ids, 1024);
    if (n <= 0 || n > 1024 || decoder_probe_run(d, ids, n, &pr) < 0)
        return;
    double mass = 0;
    for (int i = 0; i < pr.n_layer * pr.n_head; i++)
        mass += pr.mass1[i];
    out->ran = 1;
    out->sink_rate = pr.sink_rate;
    out->first_mass = (float)(mass / (pr.n_layer * pr.n_head));
    out->warn =
        d->model.hp.normalizer != MODEL_NORM_SOFTMAX && pr.sink_rate > DECODER_PROBE_WARN_RATE;
    decoder_probe_free(&pr);
}
