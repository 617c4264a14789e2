/* sampler.c: penalties, temperature, top-k/top-p/min-p, seeded draw (sampler.h). */
#include "sampler.h"

#include <errno.h>
#include <float.h>
#include <stdint.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

struct sampler_params sampler_default_params(void)
{
    return (struct sampler_params){
        .temperature = 1.0f,
        .top_k = 0,
        .top_p = 1.0f,
        .min_p = 0.0f,
        .repeat_penalty = 1.0f,
        .presence_penalty = 0.0f,
        .frequency_penalty = 0.0f,
        .penalty_last_n = 64,
        .seed = 0,
    };
}

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

/* xoshiro256** */
static uint64_t rng_next(uint64_t *s)
{
    uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return r;
}

static double rng_uniform(uint64_t *s) /* [0, 1) */
{
    return (double)(rng_next(s) >> 11) * 0x1.0p-53;
}

int sampler_init(struct sampler *s, const struct sampler_params *p, int64_t n_vocab)
{
    memset(s, 0, sizeof *s);
    if (n_vocab <= 0 || !(p->temperature >= 0) || p->top_k < 0 || !(p->top_p > 0) ||
        !(p->top_p <= 1) || !(p->min_p >= 0) || !(p->min_p <= 1) || !(p->repeat_penalty > 0) ||
        !isfinite(p->presence_penalty) || !isfinite(p->frequency_penalty) ||
        p->penalty_last_n < 0 || p->penalty_last_n > (1 << 20))
        return -EINVAL;
    s->p = *p;
    s->n_vocab = n_vocab;
    uint64_t x = p->seed;
    for (int i = 0; i < 4; i++)
        s->rng[i] = splitmix64(&x);
    s->recent = calloc((size_t)(p->penalty_last_n ? p->penalty_last_n : 1), sizeof(int32_t));
    s->counts = calloc((size_t)n_vocab, sizeof(int32_t));
    s->probs = calloc((size_t)n_vocab, sizeof(float));
    s->ranked = calloc((size_t)n_vocab, sizeof *s->ranked);
    s->bucket_n = calloc(SAMPLER_BUCKETS, sizeof *s->bucket_n);
    s->bucket_mass = calloc(SAMPLER_BUCKETS, sizeof *s->bucket_mass);
    if (!s->recent || !s->counts || !s->probs || !s->ranked || !s->bucket_n || !s->bucket_mass) {
        sampler_free(s);
        return -ENOMEM;
    }
    return 0;
}

void sampler_free(struct sampler *s)
{
    free(s->recent);
    free(s->counts);
    free(s->probs);
    free(s->ranked);
    free(s->bucket_n);
    free(s->bucket_mass);
    memset(s, 0, sizeof *s);
}

void sampler_accept(struct sampler *s, int32_t token)
{
    int64_t n = s->p.penalty_last_n;
    if (n == 0 || token < 0 || token >= s->n_vocab)
        return;
    if (s->n_recent == n) { /* the oldest leaves the window */
        s->counts[s->recent[s->recent_head]]--;
        s->recent[s->recent_head] = token;
        s->recent_head = (s->recent_head + 1) % n;
    } else {
        s->recent[(s->recent_head + s->n_recent) % n] = token;
        s->n_recent++;
    }
    s->counts[token]++;
}

static void apply_penalties(struct sampler *s, float *logits)
{
    const struct sampler_params *p = &s->p;
    if (p->repeat_penalty == 1.0f && p->presence_penalty == 0.0f && p->frequency_penalty == 0.0f)
        return;
    int64_t n = p->penalty_last_n;
    for (int64_t i = 0; i < s->n_recent; i++) {
        int32_t t = s->recent[(s->recent_head + i) % n];
        int32_t c = s->counts[t];
        if (c <= 0)
            continue; /* already penalized this step: counts are negated below */
        float *l = &logits[t];
        if (p->repeat_penalty != 1.0f)
            *l = *l > 0 ? *l / p->repeat_penalty : *l * p->repeat_penalty;
        *l -= (float)c * p->frequency_penalty + p->presence_penalty;
        s->counts[t] = -c;
    }
    for (int64_t i = 0; i < s->n_recent; i++) {
        int32_t t = s->recent[(s->recent_head + i) % n];
        if (s->counts[t] < 0)
            s->counts[t] = -s->counts[t];
    }
}

int64_t sampler_argmax(const float *x, int64_t n)
{
    /* blocks of ARGMAX_BLOCK: eight running maxima per block (vectorizable;
     * a NaN never compares larger, so it is never taken), and only a block
     * whose maximum beats the best so far is searched for the first index
     * holding it. The best starts at the first value that is not NaN. */
    enum { ARGMAX_BLOCK = 64 };
    int64_t best = 0, b = 0;
    while (best < n && x[best] != x[best])
        best++;
    if (best == n)
        return 0;
    float bv = x[best];
    for (; b + ARGMAX_BLOCK <= n; b += ARGMAX_BLOCK) {
        float m[8];
        for (int j = 0; j < 8; j++)
            m[j] = -INFINITY;
        for (int k = 0; k < ARGMAX_BLOCK; k += 8)
            for (int j = 0; j < 8; j++)
                m[j] = x[b + k + j] > m[j] ? x[b + k + j] : m[j];
        float mm = m[0];
        for (int j = 1; j < 8; j++)
            mm = m[j] > mm ? m[j] : mm;
        if (mm > bv) {
            int64_t i = b;
            while (x[i] != mm)
                i++;
            best = i;
            bv = mm;
        }
    }
    for (; b < n; b++)
        if (x[b] > bv) {
            bv = x[b];
            best = b;
        }
    return best;
}

/* e^x for x <= 0 (x is a logit minus the largest, over the temperature):
 * 2^n e^r with n = round(x / ln 2), |r| <= ln 2 / 2, e^r a degree-6 Taylor
 * polynomial; within 3e-7 of expf. Below -87 (e^x < 2^-125) and for NaN it
 * is 0. Straight-line and branch-free (selects are bit masks), so the
 * compiler vectorizes a loop of it: 2-3x faster than expf over a vocabulary. */
static inline float exp_nonpos(float x)
{
    const float lo = -87.0f;
    uint32_t xb, lob, vb;
    memcpy(&xb, &x, sizeof xb);
    memcpy(&lob, &lo, sizeof lob);
    const uint32_t ok = 0u - (uint32_t)(x >= lo); /* all ones where x >= -87, not NaN */
    const uint32_t xcb = (xb & ok) | (lob & ~ok);
    float xc;
    memcpy(&xc, &xcb, sizeof xc);
    /* round to nearest by the 1.5 * 2^23 trick: exact for |n| < 2^22 */
    const float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    const float r =
        (xc - n * 0.693145751953125f) - n * 1.42860682030941723212e-6f; /* ln 2 hi, lo */
    float q = 1.0f / 720.0f;
    q = q * r + 1.0f / 120.0f;
    q = q * r + 1.0f / 24.0f;
    q = q * r + 1.0f / 6.0f;
    q = q * r + 0.5f;
    q = q * r + 1.0f;
    q = q * r + 1.0f;
    const uint32_t sb = (uint32_t)((int32_t)n + 127) << 23; /* 2^n, n in [-126, 0] */
    float sc;
    memcpy(&sc, &sb, sizeof sc);
    const float v = q * sc;
    memcpy(&vb, &v, sizeof vb);
    vb &= ok;
    float out;
    memcpy(&out, &vb, sizeof out);
    return out;
}

/* e[i] = e^((l[i] - mx) * inv_t) for i < n, l[i] <= mx. */
static void exp_row(float *restrict e, const float *restrict l, float mx, float inv_t, int64_t n)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) /* a fixed count: vectorized */
        for (int c = 0; c < 16; c++)
            e[i + c] = exp_nonpos((l[i + c] - mx) * inv_t);
    for (; i < n; i++)
        e[i] = exp_nonpos((l[i] - mx) * inv_t);
}

/* Probabilities in (0, 1] ranked coarsely: the float's bits above the low
 * 19 (its exponent and 4 mantissa bits) order them, a larger key for a
 * larger probability. */
static int prob_bucket(float p)
{
    uint32_t u;
    memcpy(&u, &p, sizeof u);
    u >>= 19;
    return u < SAMPLER_BUCKETS ? (int)u : SAMPLER_BUCKETS - 1;
}

/* Ranking order: larger logit first, then smaller id. */
static int by_rank(const void *a, const void *b)
{
    const struct sampler_ranked *x = a, *y = b;
    if (x->logit != y->logit)
        return x->logit > y->logit ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

int32_t sampler_sample(struct sampler *s, float *logits, float *prob)
{
    const int64_t V = s->n_vocab;
    const struct sampler_params *p = &s->p;
    apply_penalties(s, logits);

    const int64_t best = sampler_argmax(logits, V);
    const float inv_t = 1.0f / p->temperature;
    if (!(inv_t <= FLT_MAX)) { /* temperature 0 or too small to divide by: greedy */
        if (prob)
            *prob = 1.0f;
        return (int32_t)best;
    }

    /* softmax with temperature, left unnormalized: e_i = e^((l_i - max) / t)
     * in (0, 1], the largest exactly 1, summed in four fixed chains */
    const float mx = logits[best];
    float *e = s->probs;
    exp_row(e, logits, mx, inv_t, V);
    int64_t i;
    double part[4] = {0, 0, 0, 0};
    for (i = 0; i + 4 <= V; i += 4)
        for (int c = 0; c < 4; c++)
            part[c] += e[i + c];
    for (; i < V; i++)
        part[0] += e[i];
    const double sum = (part[0] + part[1]) + (part[2] + part[3]);

    /* The kept tokens are a prefix of the tokens ranked by logit (then by
     * id): token j of the ranking is kept if it is the first, or if fewer
     * than top_k are kept, the probability kept is below top_p and its own
     * is at least min_p times the largest. min_p is a threshold on e; top_k
     * and top_p end the prefix in some bucket of a histogram of e, and only
     * that bucket's tokens are sorted. */
    const float thr = p->min_p; /* times the largest e, which is 1 */
    const int64_t top_k = p->top_k > 0 ? p->top_k : V;
    const double top_p = p->top_p < 1.0f ? p->top_p * sum : INFINITY; /* 1: off */
    int64_t kept = 0;
    double cum = 0;
    int cut = -1;               /* the bucket the prefix ends in, or -1: every candidate is kept */
    float cut_logit = INFINITY; /* the last kept token of the cut bucket: */
    int32_t cut_id = -1;        /* the cut bucket's tokens ranked after it are not kept */
    if (top_k < V || top_p < INFINITY) {
        int64_t *bn = s->bucket_n;
        double *bm = s->bucket_mass;
        memset(bn, 0, SAMPLER_BUCKETS * sizeof *bn);
        memset(bm, 0, SAMPLER_BUCKETS * sizeof *bm);
        for (i = 0; i < V; i++)
            if (e[i] > 0 && e[i] >= thr) {
                const int k = prob_bucket(e[i]);
                bn[k]++;
                bm[k] += e[i];
            }
        /* whole buckets while they fit; the first that does not is ranked
         * and walked token by token, and the walk may use it up (rounding
         * of the bucket's sum) and go on to the next */
        for (int k = SAMPLER_BUCKETS - 1; k >= 0 && cut < 0; k--) {
            if (bn[k] == 0)
                continue;
            if (kept + bn[k] < top_k && cum + bm[k] < top_p) {
                kept += bn[k];
                cum += bm[k];
                continue;
            }
            struct sampler_ranked *rk = s->ranked;
            int64_t n = 0, sorted = 1;
            for (i = 0; i < V; i++)
                if (e[i] > 0 && e[i] >= thr && prob_bucket(e[i]) == k) {
                    rk[n] = (struct sampler_ranked){logits[i], (int32_t)i};
                    sorted &= n == 0 || rk[n].logit <= rk[n - 1].logit; /* ids ascend */
                    n++;
                }
            if (!sorted)
                qsort(rk, (size_t)n, sizeof *rk, by_rank);
            cut_logit = INFINITY; /* none of this bucket kept yet */
            cut_id = -1;
            for (int64_t j = 0; j < n; j++) {
                if (kept > 0 && (kept >= top_k || cum >= top_p)) {
                    cut = k; /* ends before rk[j]: the last kept is rk[j - 1] */
                    break;
                }
                cut_logit = rk[j].logit;
                cut_id = rk[j].id;
                kept++;
                cum += e[rk[j].id];
            }
        }
    }
    if (cut < 0 && thr > 0) { /* every token with e at least the threshold */
        kept = 0;
        cum = 0;
        for (i = 0; i < V; i++)
            if (e[i] >= thr) {
                kept++;
                cum += e[i];
            }
    } else if (cut < 0) { /* every token with e above zero */
        kept = sum > 0;
        cum = sum;
    }
    if (kept == 0) { /* no probability left above zero (NaN logits): the argmax */
        if (prob)
            *prob = 1.0f;
        return (int32_t)best;
    }

    /* draw: the kept tokens walked in id order */
    const double r = rng_uniform(s->rng) * cum;
    double acc = 0;
    int32_t choice = -1;
    for (i = 0; i < V; i++) {
        if (!(e[i] > 0 && e[i] >= thr))
            continue;
        if (cut >= 0) {
            const int k = prob_bucket(e[i]);
            if (k < cut ||
                (k == cut && (logits[i] < cut_logit || (logits[i] == cut_logit && i > cut_id))))
                continue;
        }
        choice = (int32_t)i;
        acc += e[i];
        if (r < acc)
            break;
    }
    if (prob)
        *prob = (float)(e[choice] / cum);
    return choice;
}

double sampler_logsumexp(const float *logits, int64_t n)
{
    float mx = logits[0];
    for (int64_t v = 1; v < n; v++)
        mx = logits[v] > mx ? logits[v] : mx;
    double sum = 0;
    for (int64_t v = 0; v < n; v++)
        sum += exp((double)(logits[v] - mx));
    return (double)mx + log(sum);
}
