/*
 * ref_logits.h: the reference-logits fixtures of the tests in
 * tests/reference/ (tools/make_logits_fixture.py for SmolLM2,
 * tools/make_gemma_logits_fixture.py for Gemma 3), read into memory, and the
 * one check of an engine logits row against them.
 *
 * Fixture format: '#' comment lines, then per prompt 'prompt N', 'ids ...'
 * (N token ids) and up to N lines 'pos P top id:logit ...' (the reference's
 * REF_TOPK largest logits at position P, largest first).
 */
#ifndef SS_TESTS_SUPPORT_REF_LOGITS_H
#define SS_TESTS_SUPPORT_REF_LOGITS_H

#include <stdint.h>

#define REF_TOPK 16

struct ref_prompt {
    int64_t n;
    int32_t *ids;                 /* [n] */
    int32_t (*top_id)[REF_TOPK];  /* [n][REF_TOPK] */
    float (*top_logit)[REF_TOPK]; /* [n][REF_TOPK] */
};

struct ref_logits {
    int n_prompts;
    struct ref_prompt *prompts;
};

/* Reads the fixture at path: at most max_prompts prompts of at most max_ids
 * tokens each. Returns 0, or -1 when the file is missing, a prompt is longer
 * than max_ids or none was read (r is then empty). */
int ref_logits_load(struct ref_logits *r, const char *path, int max_prompts, int64_t max_ids);
void ref_logits_free(struct ref_logits *r);

/* The largest |got[idx[i]] - want[i]| over i < n (idx NULL: got[i]); NaN
 * when any difference is NaN, so a NaN logit never passes a tolerance. */
double ref_logits_max_diff(const float *got, const int32_t *idx, const float *want, int64_t n);

/* Checks one engine logits row lg (V entries) against prompt pi's reference
 * at pos: each of the reference's top REF_TOPK logits within tol, and the
 * greedy token the reference's wherever its top-two gap exceeds tol (a
 * nearer tie may flip either way). Prints each miss and sets *failed.
 * Returns the largest difference over the top REF_TOPK. */
double ref_logits_check_row(const struct ref_logits *r, int pi, int64_t pos, const float *lg,
                            int64_t V, double tol, int *failed);

#endif
