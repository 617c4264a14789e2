/*
 * test_sampler.c: the sampler against direct computations: greedy is the
 * argmax, filters that keep one token are greedy, draws follow the softmax
 * (checked by frequency over many draws), penalties follow their formulas,
 * and the same seed gives the same tokens. On a larger vocabulary (where
 * the sampler ranks through a histogram and sorts one bucket), the kept set
 * matches a brute-force ranking of every token and the draws and reported
 * probabilities follow the renormalized softmax over it; sampler_argmax
 * matches a scalar loop on ties, NaN, -inf and signed zeros.
 */
#include "engine/sampler.h"
#include "test.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define V 64

static void fill(float *lg, unsigned seed)
{
    for (int i = 0; i < V; i++) {
        seed = seed * 1103515245u + 12345u;
        lg[i] = (float)((seed >> 8) % 1000) / 200.0f + (float)i * 1e-4f; /* 0 .. 5, no ties */
    }
}

/* The first index of the largest value that is not NaN (0 if all are). */
static int64_t argmax_ref(const float *x, int64_t n)
{
    int64_t b = -1;
    for (int64_t i = 0; i < n; i++)
        if (!isnan(x[i]) && (b < 0 || x[i] > x[b]))
            b = i;
    return b < 0 ? 0 : b;
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
        int want = argmax_ref(lg, V);
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
    double mx = lg[argmax_ref(lg, V)], z = 0, pr[V];
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

#define VB 5003 /* a larger vocabulary: odd, so blocks of 16 and 64 leave a tail */

static unsigned lcg(unsigned *x)
{
    *x = *x * 1103515245u + 12345u;
    return *x >> 8;
}

/* Logits dense in [-4, 4) with many exact ties (multiples of 1/512), so
 * a histogram bucket holds several tokens and several distinct logits. */
static void fill_big(float *lg, unsigned seed)
{
    for (int i = 0; i < VB; i++)
        lg[i] = (float)(lcg(&seed) % 4096) / 512.0f - 4.0f;
}

/* The definition (sampler.h), brute force: every token ranked by logit,
 * then id; token j is kept if it is the first, or fewer than top_k are
 * kept, the probability before it is below top_p and its own is at least
 * min_p times the largest (probabilities in double). Returns how many are
 * kept; order gets the ranking, pr each token's probability. */
static int rank_ref(const float *lg, const struct sampler_params *p, int *order, double *pr)
{
    for (int i = 0; i < VB; i++)
        order[i] = i;
    /* insertion sort by (logit desc, id asc) */
    for (int i = 1; i < VB; i++) {
        int t = order[i], j = i;
        while (j > 0 && lg[order[j - 1]] < lg[t])
            order[j] = order[j - 1], j--;
        order[j] = t;
    }
    double z = 0;
    for (int i = 0; i < VB; i++)
        z += pr[i] = exp(((double)lg[i] - lg[order[0]]) / p->temperature);
    for (int i = 0; i < VB; i++)
        pr[i] /= z;
    int kept = 0;
    double cum = 0;
    for (int j = 0; j < VB; j++) {
        double pj = pr[order[j]];
        if (kept > 0 && ((p->top_k > 0 && kept >= p->top_k) || (p->top_p < 1 && cum >= p->top_p) ||
                         pj < p->min_p * pr[order[0]]))
            break;
        kept++;
        cum += pj;
    }
    return kept;
}

TEST(on_a_large_vocabulary_the_kept_set_is_the_ranked_prefix)
{
    static float lg[VB], tmp[VB];
    static int order[VB], count[VB], rank_of[VB];
    static double pr[VB];
    struct sampler s;
    for (unsigned seed = 1; seed <= 12; seed++) {
        fill_big(lg, seed);
        struct sampler_params p = sampler_default_params();
        p.seed = seed;
        p.temperature = 0.5f + 0.25f * (float)(seed % 4);
        rank_ref(lg, &p, order, pr); /* the ranking alone */
        /* top_p halfway between two prefix sums (so float rounding cannot
         * move the boundary); top_k and min_p on some seeds */
        int m = 1 + (int)(seed * 311 % 2000);
        double before = 0;
        for (int j = 0; j < m; j++)
            before += pr[order[j]];
        p.top_p = (float)(before + pr[order[m]] / 2);
        if (seed % 3 == 0)
            p.top_k = 5 + 37 * seed;
        if (seed % 4 == 1)
            p.min_p = 0.3f;
        if (seed == 12)
            p.top_p = 1.0f; /* off: every token, the vocabulary walked whole */
        const int kept = rank_ref(lg, &p, order, pr);
        ASSERT(kept >= 1);
        for (int j = 0; j < VB; j++)
            rank_of[order[j]] = j;
        double zk = 0;
        for (int j = 0; j < kept; j++)
            zk += pr[order[j]];
        memset(count, 0, sizeof count);
        ASSERT_OK(sampler_init(&s, &p, VB));
        const int N = 6000;
        for (int i = 0; i < N; i++) {
            memcpy(tmp, lg, sizeof lg);
            float prob = -1;
            int t = sampler_sample(&s, tmp, &prob);
            ASSERT(t >= 0 && t < VB);
            ASSERT(rank_of[t] < kept);                                   /* only kept tokens */
            ASSERT(fabs(prob - pr[t] / zk) <= 1e-5 * pr[t] / zk + 1e-9); /* renormalized */
            count[t]++;
        }
        sampler_free(&s);
        for (int j = 0; j < kept; j++) { /* frequencies: 5 sigma per token */
            double expect = pr[order[j]] / zk * N, sd = sqrt(expect) + 1;
            ASSERT(fabs(count[order[j]] - expect) < 5 * sd);
        }
    }
}

TEST(ties_rank_by_id)
{
    static float lg[VB], tmp[VB];
    static int count[VB];
    for (int i = 0; i < VB; i++)
        lg[i] = 1.5f;
    struct sampler s;
    struct sampler_params p = sampler_default_params();
    p.top_k = 3;
    p.seed = 5;
    ASSERT_OK(sampler_init(&s, &p, VB));
    for (int i = 0; i < 3000; i++) {
        memcpy(tmp, lg, sizeof lg);
        count[sampler_sample(&s, tmp, NULL)]++;
    }
    sampler_free(&s);
    for (int t = 0; t < 3; t++)
        ASSERT(abs(count[t] - 1000) < 5 * 32);
    ASSERT_EQ(count[0] + count[1] + count[2], 3000);
}

TEST(nan_logits_are_never_drawn_and_crash_nothing)
{
    static float lg[VB], tmp[VB];
    fill_big(lg, 77);
    unsigned x = 3;
    static int is_nan[VB];
    for (int k = 0; k < 50; k++) {
        int i = (int)(lcg(&x) % VB);
        lg[i] = NAN;
        is_nan[i] = 1;
    }
    struct sampler s;
    struct sampler_params p = sampler_default_params();
    p.top_p = 0.9f;
    ASSERT_OK(sampler_init(&s, &p, VB));
    for (int i = 0; i < 2000; i++) {
        memcpy(tmp, lg, sizeof lg);
        int t = sampler_sample(&s, tmp, NULL);
        ASSERT(t >= 0 && t < VB && !is_nan[t]);
    }
    for (int i = 0; i < VB; i++)
        tmp[i] = NAN;
    ASSERT_EQ(sampler_sample(&s, tmp, NULL), 0); /* nothing to draw from: token 0 */
    sampler_free(&s);
}

TEST(argmax_matches_a_scalar_loop)
{
    static float x[VB];
    const float pool[] = {-1.0f, 0.0f, -0.0f, 2.5f, 2.5f, -INFINITY, NAN, 1e30f, -3.0f};
    unsigned seed = 9;
    for (int n = 1; n <= VB; n += n < 300 ? 1 : 977) {
        for (int rep = 0; rep < 4; rep++) {
            for (int i = 0; i < n; i++)
                x[i] = rep < 2 ? pool[lcg(&seed) % 9] : (float)(lcg(&seed) % 1000) - 500.0f;
            if (rep == 3)
                x[0] = NAN; /* never wins, even first */
            ASSERT_EQ(sampler_argmax(x, n), argmax_ref(x, n));
        }
    }
}

/* One draw at params p from lg (V values); prob into *pr. */
static int draw(const float *lg, struct sampler_params p, float *pr)
{
    struct sampler s;
    float tmp[V];
    memcpy(tmp, lg, sizeof tmp);
    if (sampler_init(&s, &p, V) < 0)
        return -1;
    int t = sampler_sample(&s, tmp, pr);
    sampler_free(&s);
    return t;
}

TEST(degenerate_logits_pick_what_greedy_would)
{
    float lg[V], pr;
    struct sampler_params p = sampler_default_params();
    fill(lg, 5);
    /* a NaN at 0 wins nothing: greedy and sampling skip it */
    lg[0] = NAN;
    p.temperature = 0;
    ASSERT_EQ(draw(lg, p, &pr), argmax_ref(lg, V));
    ASSERT(pr == 1.0f);
    p.temperature = 1;
    for (uint64_t seed = 0; seed < 200; seed++) {
        p.seed = seed;
        ASSERT(draw(lg, p, NULL) != 0);
    }
    /* two +inf: the first, with probability 1 (nothing finite is left) */
    fill(lg, 6);
    lg[17] = INFINITY;
    lg[40] = INFINITY;
    ASSERT_EQ(draw(lg, p, &pr), 17);
    ASSERT(pr == 1.0f);
    /* -inf everywhere but one token: that token, probability 1 */
    for (int i = 0; i < V; i++)
        lg[i] = -INFINITY;
    lg[33] = -2.0f;
    ASSERT_EQ(draw(lg, p, &pr), 33);
    ASSERT(pr == 1.0f);
    /* a temperature too small to divide by is greedy: the first of tied maxima */
    fill(lg, 7);
    lg[50] = lg[51] = lg[52] = 9.0f;
    p.temperature = 1e-40f;
    for (uint64_t seed = 0; seed < 20; seed++) {
        p.seed = seed;
        ASSERT_EQ(draw(lg, p, NULL), 50);
    }
}

TEST(min_p_alone_keeps_the_ranked_prefix_above_it)
{
    static float lg[VB], tmp[VB];
    static int order[VB], rank_of[VB];
    static double pr[VB];
    fill_big(lg, 21);
    struct sampler_params p = sampler_default_params();
    p.min_p = 0.5f;
    p.seed = 4;
    const int kept = rank_ref(lg, &p, order, pr);
    ASSERT(kept > 1 && kept < VB);
    for (int j = 0; j < VB; j++)
        rank_of[order[j]] = j;
    struct sampler s;
    ASSERT_OK(sampler_init(&s, &p, VB));
    int seen_last = 0;
    for (int i = 0; i < 20000; i++) {
        memcpy(tmp, lg, sizeof lg);
        int t = sampler_sample(&s, tmp, NULL);
        ASSERT(rank_of[t] < kept);
        seen_last |= rank_of[t] >= kept - kept / 4; /* the low end is reached too */
    }
    sampler_free(&s);
    ASSERT(seen_last);
}

TEST_MAIN()
