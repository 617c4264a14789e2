/* sink_key.c: per-token sink logits from learned sink keys (sink_key.h). */
#include "sink_key.h"

#include <string.h>

#include "../model.h"
#include "../rope.h"

void cpu_sink_key_logits(const float *q, int64_t T, int H, int Hkv, int head_dim, int rope_dim,
                         int neox, const float *cs, const float *sinks, const float *k_s,
                         float scale, float *out)
{
    const int G = H / Hkv;
    float kr[MODEL_MAX_HEAD_DIM];
    for (int64_t t = 0; t < T; t++) {
        const float *ct = cs + t * rope_dim;
        for (int g = 0; g < Hkv; g++) {
            /* k_g rotated at the token's position, as its query was */
            memcpy(kr, k_s + (int64_t)g * head_dim, (size_t)head_dim * sizeof(float));
            if (neox)
                rope_apply_neox(kr, 1, head_dim, rope_dim, ct);
            else
                rope_apply(kr, 1, head_dim, rope_dim, ct);
            for (int k = 0; k < G; k++) {
                const int h = g * G + k;
                const float *qh = q + (t * H + h) * (int64_t)head_dim;
                double dot = 0.0;
                for (int e = 0; e < head_dim; e++)
                    dot += (double)qh[e] * (double)kr[e];
                out[t * H + h] = (float)((double)sinks[h] + (double)scale * dot);
            }
        }
    }
}
