/* rope.c: RoPE angles in double, rotation in float (rope.h). */
#include "rope.h"

#include <math.h>

void rope_cos_sin(int64_t pos, double base, int rope_dim, float *cs)
{
    for (int i = 0; i < rope_dim / 2; i++) {
        double theta = pow(base, -2.0 * (double)i / (double)rope_dim);
        /* p * theta exactly enough in double for p up to ~2^53 / 1; reduce before
         * cos/sin so huge angles lose nothing further */
        double a = fmod((double)pos * theta, 2.0 * M_PI);
        cs[2 * i] = (float)cos(a);
        cs[2 * i + 1] = (float)sin(a);
    }
}

void rope_apply(float *x, int n_head, int head_dim, int rope_dim, const float *cs)
{
    for (int h = 0; h < n_head; h++) {
        float *v = x + (int64_t)h * head_dim;
        for (int i = 0; i < rope_dim / 2; i++) {
            float c = cs[2 * i], s = cs[2 * i + 1];
            float x0 = v[2 * i], x1 = v[2 * i + 1];
            v[2 * i] = x0 * c - x1 * s;
            v[2 * i + 1] = x0 * s + x1 * c;
        }
    }
}

void rope_apply_neox(float *x, int n_head, int head_dim, int rope_dim, const float *cs)
{
    const int half = rope_dim / 2;
    for (int h = 0; h < n_head; h++) {
        float *v = x + (int64_t)h * head_dim;
        for (int i = 0; i < half; i++) {
            float c = cs[2 * i], s = cs[2 * i + 1];
            float x0 = v[i], x1 = v[i + half];
            v[i] = x0 * c - x1 * s;
            v[i + half] = x0 * s + x1 * c;
        }
    }
}
