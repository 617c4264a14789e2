/*
 * test_sink_key.c: cpu_sink_key_logits (engine/cpu/sink_key.h), the per-token
 * sink logits of a layer with learned sink keys (blk.N.attn_sinks_k), against
 * their definition written as a scalar double loop over tokens and heads:
 *     out[t, h] = s_h + scale * sum_e q0[t, h, e] * k[h / G, e],
 * q0 the query before RoPE. The function gets the queries rotated at each
 * token's position (as the CPU backend holds them in attention) and rotates
 * k_g by the same angle; the reference never rotates anything. Positions run
 * from 0 to past 2^40 (angles reduced in double by rope_cos_sin), both pair
 * layouts, a partial rotary dimension and grouped-query heads.
 *
 * Tolerance: q rotated in f32 and k_g rotated in f32 each carry ~1e-7
 * relative error per element; the dot product (summed in double) of Dh <= 128
 * terms of magnitude |q0| |k| / sqrt(Dh) then errs by a few 1e-7 times
 * sum_e |q0_e k_e| (bound below: 1e-5 of that sum, times scale). A wrong
 * head-to-group mapping, a key rotated at another position or the rotated
 * query dotted with the unrotated key moves the logit by O(scale |q0| |k|).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "engine/cpu/sink_key.h"
#include "engine/rope.h"
#include "test.h"
#include "support/rng.h"

#define MAX_T 8
#define MAX_H 12
#define MAX_DH 128

struct shape {
    int H, Hkv, Dh, rope_dim, neox;
};

static void check_shape(const struct shape *sh, const int64_t *pos, int T, uint64_t seed,
                        int *failed)
{
    static float q0[MAX_T * MAX_H * MAX_DH], q[MAX_T * MAX_H * MAX_DH];
    static float ks[MAX_H * MAX_DH], cs[MAX_T * MAX_DH], sinks[MAX_H], out[MAX_T * MAX_H];
    const int H = sh->H, Hkv = sh->Hkv, Dh = sh->Dh, G = H / Hkv;
    const float scale = 1.0f / sqrtf((float)Dh);
    uint64_t s = seed;
    for (int i = 0; i < T * H * Dh; i++)
        q0[i] = (float)test_rng_normal(&s) * 3.0f;
    for (int i = 0; i < Hkv * Dh; i++)
        ks[i] = (float)test_rng_normal(&s);
    for (int h = 0; h < H; h++)
        sinks[h] = (float)test_rng_normal(&s) * 2.0f;
    /* the queries as the backend has them: rotated at their positions */
    memcpy(q, q0, (size_t)T * H * Dh * sizeof(float));
    for (int t = 0; t < T; t++) {
        rope_cos_sin(pos[t], 10000.0, sh->rope_dim, cs + t * sh->rope_dim);
        (sh->neox ? rope_apply_neox : rope_apply)(q + (int64_t)t * H * Dh, H, Dh, sh->rope_dim,
                                                  cs + t * sh->rope_dim);
    }
    cpu_sink_key_logits(q, T, H, Hkv, Dh, sh->rope_dim, sh->neox, cs, sinks, ks, scale, out);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++) {
            const float *qh = q0 + ((int64_t)t * H + h) * Dh, *kg = ks + (int64_t)(h / G) * Dh;
            double dot = 0.0, mag = 0.0;
            for (int e = 0; e < Dh; e++) {
                dot += (double)qh[e] * (double)kg[e];
                mag += fabs((double)qh[e] * (double)kg[e]);
            }
            const double ref = (double)sinks[h] + (double)scale * dot;
            const double tol = 1e-5 * (double)scale * mag + 1e-6 * fabs((double)sinks[h]);
            if (!(fabs((double)out[t * H + h] - ref) <= tol))
                FAIL_AT("H %d Hkv %d Dh %d rope_dim %d neox %d, pos %lld head %d: %.9g vs %.9g "
                        "(tol %.3g)",
                        H, Hkv, Dh, sh->rope_dim, sh->neox, (long long)pos[t], h,
                        (double)out[t * H + h], ref, tol);
        }
}

static const int64_t POS[MAX_T] = {
    0, 1, 63, 1000, 65537, 1000000, (int64_t)1 << 31, ((int64_t)1 << 40) + 12345};

TEST(sink_key_logits_match_the_double_loop_adjacent_pairs)
{
    const struct shape sh[] = {{9, 3, 64, 64, 0}, {4, 4, 16, 16, 0}, {8, 1, 128, 128, 0}};
    for (size_t i = 0; i < sizeof sh / sizeof sh[0]; i++)
        check_shape(&sh[i], POS, MAX_T, 100 + i, failed);
}

TEST(sink_key_logits_match_the_double_loop_neox_pairs)
{
    const struct shape sh[] = {{4, 1, 64, 64, 1}, {12, 4, 32, 32, 1}};
    for (size_t i = 0; i < sizeof sh / sizeof sh[0]; i++)
        check_shape(&sh[i], POS, MAX_T, 200 + i, failed);
}

TEST(sink_key_logits_match_with_a_partial_rotary_dimension)
{
    /* elements past rope_dim are rotated neither in q nor in k_g */
    const struct shape sh[] = {{6, 2, 64, 32, 0}, {6, 3, 64, 16, 1}};
    for (size_t i = 0; i < sizeof sh / sizeof sh[0]; i++)
        check_shape(&sh[i], POS, MAX_T, 300 + i, failed);
}

TEST(zero_sink_keys_give_exactly_the_sink_logits)
{
    /* k = 0: s_h + scale * 0 is s_h to the bit, so a file whose keys are all
     * zero scores exactly like one without them */
    static float q[2 * 4 * 32], ks[2 * 32], cs[2 * 32], out[2 * 4];
    const float sinks[4] = {1.25f, -3.5f, 0.1f, 7.0f};
    uint64_t s = 9;
    for (size_t i = 0; i < sizeof q / sizeof q[0]; i++)
        q[i] = (float)test_rng_normal(&s) * 10.0f;
    memset(ks, 0, sizeof ks);
    rope_cos_sin(5, 10000.0, 32, cs);
    rope_cos_sin(123456789, 10000.0, 32, cs + 32);
    cpu_sink_key_logits(q, 2, 4, 2, 32, 32, 0, cs, sinks, ks, 0.17f, out);
    for (int t = 0; t < 2; t++)
        for (int h = 0; h < 4; h++)
            ASSERT(memcmp(&out[t * 4 + h], &sinks[h], sizeof(float)) == 0);
}

TEST_MAIN()
