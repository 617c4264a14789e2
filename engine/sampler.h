/*
 * sampler.h: next-token choice from logits. Order: penalties (repetition,
 * presence, frequency over the last penalty_last_n tokens), temperature,
 * top-k, top-p, min-p, then a draw from the kept tokens renormalized.
 * temperature <= 0 is greedy. Memory is sized at init (vocab-sized scratch
 * and a ring of recent tokens): nothing grows with the stream. The same seed
 * and the same inputs give the same tokens.
 *
 * The filters keep a prefix of the tokens ranked by logit (larger first,
 * ties by smaller id); the draw walks the kept tokens in id order. A
 * histogram of the probabilities (buckets 1/16 of an octave wide) finds the
 * bucket the prefix ends in, and only that bucket's tokens are sorted by
 * logit: O(V) a step for real logits, whose buckets hold few tokens each;
 * O(V log V) at worst, for a near-flat distribution that puts most of the
 * vocabulary in one bucket.
 */
#ifndef SS_SAMPLER_H
#define SS_SAMPLER_H

#include <stdint.h>

struct sampler_params {
    float temperature;       /* 0: greedy */
    int64_t top_k;           /* 0: off */
    float top_p;             /* 1: off */
    float min_p;             /* 0: off */
    float repeat_penalty;    /* 1: off (HF/llama.cpp: divide positive logits, multiply negative) */
    float presence_penalty;  /* OpenAI: -= p if the token occurred */
    float frequency_penalty; /* OpenAI: -= f * count */
    int64_t penalty_last_n;  /* window the penalties look at (0: off) */
    uint64_t seed;
};

/* Defaults: temperature 1, top_p 1, others off, penalty_last_n 64, seed 0. */
struct sampler_params sampler_default_params(void);

#define SAMPLER_BUCKETS 2048 /* histogram buckets by probability (sampler.c) */

struct sampler_ranked {
    float logit;
    int32_t id;
};

struct sampler {
    struct sampler_params p;
    int64_t n_vocab;
    uint64_t rng[4];
    int32_t *recent; /* ring of penalty_last_n tokens */
    int64_t n_recent, recent_head;
    int32_t *counts;               /* [V] occurrences within the ring */
    float *probs;                  /* [V] scratch */
    struct sampler_ranked *ranked; /* [V] scratch: one bucket's tokens */
    int64_t *bucket_n;             /* [SAMPLER_BUCKETS] tokens per bucket */
    double *bucket_mass;           /* [SAMPLER_BUCKETS] their probability */
};

/* Returns 0, -EINVAL for out-of-range params, or -ENOMEM. */
int sampler_init(struct sampler *s, const struct sampler_params *p, int64_t n_vocab);
void sampler_free(struct sampler *s);
/* Records a token (prompt or generated) for the penalties. */
void sampler_accept(struct sampler *s, int32_t token);
/* Picks the next token. logits (V) is modified (penalties). If
 * prob is non-NULL it gets the chosen token's probability after the filters. */
int32_t sampler_sample(struct sampler *s, float *logits, float *prob);
/* The first index of the largest value of x[0, n) that is not NaN (n >= 1;
 * 0 if every value is NaN). */
int64_t sampler_argmax(const float *x, int64_t n);
/* log Σ_v e^logits[v] over n logits (max-shifted, summed in double): a
 * token's log-probability is logits[t] - sampler_logsumexp(logits, n). */
double sampler_logsumexp(const float *logits, int64_t n);

#endif
