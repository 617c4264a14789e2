/*
 * test_sampler.c: the sampler against direct computations: greedy is the
 * argmax, filters that keep one token are greedy, draws follow the softmax
 * (checked by frequency over many draws), penalties follow their formulas,
 * and the same seed gives the same tokens.
 */
#include "engine/sampler.h"
#include "test.h"

#include <errno.h>

#define V 64

static void fill(float *lg, unsigned seed)
{
    for (int i = 0; i < V; i++) {
        seed = seed * 1103515245u + 12345u;
        lg[i] = (float)((seed >> 8) % 1000) / 200.0f + (float)i * 1e-4f; /* 0 .. 5, no ties */
    }
}

static int argmax(const float *lg)
{
    int b = 0;
    for (int i = 1; i < V; i++)
        if (lg[i] > lg[b])
            b = i;
    return b;
}

TEST(logsumexp_matches_a_direct_sum_and_survives_large_logits)
{
    /* small logits: the direct sum in double is exact enough to compare */
    float lg[5] = {0.5f, -1.25f, 2.0f, 0.0f, -3.5f};
    double direct = 0;
    for (int i = 0; i < 5; i++)
        direct += exp((double)lg[i]);
    ASSERT(fabs(sampler_logsumexp(lg, 5) - log(direct)) < 1e-12);
    /* large logits: e^1000 overflows a direct sum; shifting by any c must move
     * the result by exactly c */
    float big[5];
    for (int i = 0; i < 5; i++)
        big[i] = lg[i] + 1000.0f;
    double r = sampler_logsumexp(big, 5);
    ASSERT(isfinite(r));
    ASSERT(fabs(r - 1000.0 - log(direct)) < 1e-4);
    /* one token: its own logit */
    ASSERT(sampler_logsumexp(lg + 2, 1) == 2.0);
}

TEST(greedy_and_single_token_filters_pick_the_argmax)
{
    struct sampler s;
    float lg[V], tmp[V];
    for (unsigned seed = 1; seed < 50; seed++) {
        fill(lg, seed);
        int want = argmax(lg);
        struct sampler_params variants[4];
        for (int k = 0; k < 4; k++)
            variants[k] = sampler_default_params();
        variants[0].temperature = 0;
        variants[1].top_k = 1;
        variants[2].top_p = 1e-6f;
        variants[3].min_p = 1.0f;
        for (int k = 0; k < 4; k++) {
            variants[k].seed = seed;
            ASSERT_OK(sampler_init(&s, &variants[k], V));
            memcpy(tmp, lg, sizeof lg);
            int got = sampler_sample(&s, tmp, NULL);
            sampler_free(&s);
            ASSERT_EQ(got, want);
        }
    }
}

TEST(draws_follow_the_tempered_softmax)
{
    struct sampler s;
    struct sampler_params p = sampler_default_params();
    p.temperature = 0.7f;
    p.seed = 42;
    float lg[V], tmp[V];
    fill(lg, 7);
    ASSERT_OK(sampler_init(&s, &p, V));
    static int count[V];
    const int N = 200000;
    for (int i = 0; i < N; i++) {
        memcpy(tmp, lg, sizeof lg);
        count[sampler_sample(&s, tmp, NULL)]++;
    }
    sampler_free(&s);
    double mx = lg[argmax(lg)], z = 0, pr[V];
    for (int i = 0; i < V; i++)
        z += pr[i] = exp((lg[i] - mx) / 0.7);
    for (int i = 0; i < V; i++) {
        double expect = pr[i] / z * N, sd = sqrt(expect) + 1;
        ASSERT(fabs(count[i] - expect) < 5 * sd); /* 5 sigma per token */
    }
}

TEST(top_k_and_top_p_only_ever_return_kept_tokens)
{
    struct sampler s;
    float lg[V], tmp[V];
    fill(lg, 3);
    /* rank tokens by logit */
    int order[V];
    for (int i = 0; i < V; i++)
        order[i] = i;
    for (int i = 0; i < V; i++)
        for (int j = i + 1; j < V; j++)
            if (lg[order[j]] > lg[order[i]]) {
                int t = order[i];
                order[i] = order[j];
                order[j] = t;
            }
    struct sampler_params p = sampler_default_params();
    p.top_k = 5;
    p.seed = 1;
    ASSERT_OK(sampler_init(&s, &p, V));
    for (int i = 0; i < 2000; i++) {
        memcpy(tmp, lg, sizeof lg);
        int t = sampler_sample(&s, tmp, NULL), rank = 0;
        while (order[rank] != t)
            rank++;
        ASSERT(rank < 5);
    }
    sampler_free(&s);
    /* top_p: the smallest prefix of ranked tokens whose mass reaches p */
    double mx = lg[order[0]], z = 0, pr[V];
    for (int i = 0; i < V; i++)
        z += pr[i] = exp(lg[i] - mx);
    double cum = 0;
    int keep = 0;
    while (cum < 0.5) /* prefix reaching p = 0.5 */
        cum += pr[order[keep++]] / z;
    p = sampler_default_params();
    p.top_p = 0.5f;
    p.seed = 2;
    ASSERT_OK(sampler_init(&s, &p, V));
    for (int i = 0; i < 2000; i++) {
        memcpy(tmp, lg, sizeof lg);
        int t = sampler_sample(&s, tmp, NULL), rank = 0;
        while (order[rank] != t)
            rank++;
        ASSERT(rank < keep);
    }
    sampler_free(&s);
}

TEST(same_seed_same_tokens_other_seed_other_tokens)
{
    struct sampler a, b;
    struct sampler_params p = sampler_default_params();
    p.seed = 1234;
    float lg[V], t1[V], t2[V];
    fill(lg, 11);
    ASSERT_OK(sampler_init(&a, &p, V));
    ASSERT_OK(sampler_init(&b, &p, V));
    int same = 1;
    for (int i = 0; i < 100; i++) {
        memcpy(t1, lg, sizeof lg);
        memcpy(t2, lg, sizeof lg);
        same &= sampler_sample(&a, t1, NULL) == sampler_sample(&b, t2, NULL);
    }
    ASSERT(same);
    sampler_free(&b);
    p.seed = 99;
    ASSERT_OK(sampler_init(&b, &p, V));
    int diff = 0;
    for (int i = 0; i < 100; i++) {
        memcpy(t1, lg, sizeof lg);
        memcpy(t2, lg, sizeof lg);
        diff += sampler_sample(&a, t1, NULL) != sampler_sample(&b, t2, NULL);
    }
    ASSERT(diff > 10);
    sampler_free(&a);
    sampler_free(&b);
}

TEST(penalties_follow_their_formulas_within_the_window)
{
    struct sampler s;
    struct sampler_params p = sampler_default_params();
    p.temperature = 0;
    p.repeat_penalty = 2.0f;
    p.presence_penalty = 0.5f;
    p.frequency_penalty = 0.25f;
    p.penalty_last_n = 4;
    ASSERT_OK(sampler_init(&s, &p, V));
    int32_t seen[] = {9, 3, 3, 7, 9, 9}; /* the window keeps the last 4: 3 7 9 9 */
    for (int i = 0; i < 6; i++)
        sampler_accept(&s, seen[i]);
    float lg[V];
    for (int i = 0; i < V; i++)
        lg[i] = 0.0f;
    lg[3] = 4.0f;
    lg[7] = -2.0f;
    lg[9] = 6.0f;
    lg[20] = 1.0f;
    sampler_sample(&s, lg, NULL); /* greedy; penalties applied in place */
    ASSERT_NEAR(lg[3], 4.0f / 2 - 1 * 0.25f - 0.5f, 1e-6);
    ASSERT_NEAR(lg[7], -2.0f * 2 - 1 * 0.25f - 0.5f, 1e-6);
    ASSERT_NEAR(lg[9], 6.0f / 2 - 2 * 0.25f - 0.5f, 1e-6);
    ASSERT_NEAR(lg[20], 1.0f, 0);
    ASSERT_NEAR(lg[0], 0.0f, 0);
    sampler_free(&s);
}

TEST(bad_parameters_are_rejected)
{
    struct sampler s;
    struct sampler_params p = sampler_default_params();
    p.top_p = 0;
    ASSERT_EQ(sampler_init(&s, &p, V), -EINVAL);
    p = sampler_default_params();
    p.temperature = -1;
    ASSERT_EQ(sampler_init(&s, &p, V), -EINVAL);
    p = sampler_default_params();
    p.min_p = 1.5f;
    ASSERT_EQ(sampler_init(&s, &p, V), -EINVAL);
    p = sampler_default_params();
    p.temperature = NAN;
    ASSERT_EQ(sampler_init(&s, &p, V), -EINVAL);
}

TEST_MAIN()
