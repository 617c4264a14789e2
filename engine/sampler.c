/* sampler.c: penalties, temperature, top-k/top-p/min-p, seeded draw (sampler.h). */
#include "sampler.h"

#include <errno.h>
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
    s->heap = calloc((size_t)n_vocab, sizeof(int32_t));
    if (!s->recent || !s->counts || !s->probs || !s->heap) {
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
    free(s->heap);
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

/* max-heap of token ids by probs */
static void sift_down(const float *pr, int32_t *h, int64_t n, int64_t i)
{
    for (;;) {
        int64_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && pr[h[l]] > pr[h[m]])
            m = l;
        if (r < n && pr[h[r]] > pr[h[m]])
            m = r;
        if (m == i)
            return;
        int32_t tmp = h[i];
        h[i] = h[m];
        h[m] = tmp;
        i = m;
    }
}

int32_t sampler_sample(struct sampler *s, float *logits, float *prob)
{
    const int64_t V = s->n_vocab;
    apply_penalties(s, logits);

    int64_t best = 0;
    for (int64_t i = 1; i < V; i++)
        if (logits[i] > logits[best])
            best = i;
    if (s->p.temperature <= 0.0f) {
        if (prob)
            *prob = 1.0f;
        return (int32_t)best;
    }

    /* softmax with temperature */
    const float inv_t = 1.0f / s->p.temperature;
    const float mx = logits[best];
    double sum = 0;
    for (int64_t i = 0; i < V; i++) {
        float e = expf((logits[i] - mx) * inv_t);
        s->probs[i] = e;
        sum += e;
    }
    for (int64_t i = 0; i < V; i++)
        s->probs[i] = (float)(s->probs[i] / sum);

    /* pop tokens in descending probability while the filters keep them; the
     * kept set is moved to the end of the heap array */
    int32_t *h = s->heap;
    for (int64_t i = 0; i < V; i++)
        h[i] = (int32_t)i;
    for (int64_t i = V / 2 - 1; i >= 0; i--)
        sift_down(s->probs, h, V, i);
    const float pmax = s->probs[h[0]];
    int64_t n = V, kept = 0;
    double cum = 0;
    while (n > 0) {
        int32_t t = h[0];
        float pt = s->probs[t];
        if (kept > 0) {
            if (s->p.top_k > 0 && kept >= s->p.top_k)
                break;
            if (cum >= s->p.top_p)
                break;
            if (pt < s->p.min_p * pmax)
                break;
        }
        h[0] = h[n - 1];
        h[n - 1] = t;
        n--;
        sift_down(s->probs, h, n, 0);
        kept++;
        cum += pt;
    }
    /* kept tokens are h[V-kept .. V-1], most probable at the end */
    double r = rng_uniform(s->rng) * cum, acc = 0;
    int32_t choice = h[V - 1];
    for (int64_t i = V - 1; i >= V - kept; i--) {
        acc += s->probs[h[i]];
        if (r < acc) {
            choice = h[i];
            break;
        }
    }
    if (prob)
        *prob = (float)(s->probs[choice] / cum);
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
