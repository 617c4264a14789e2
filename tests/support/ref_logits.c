/*
 * ref_logits.c: reads the reference-logits fixtures and checks engine
 * logits rows against them (ref_logits.h).
 */
#include "ref_logits.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ref_logits_free(struct ref_logits *r)
{
    for (int i = 0; i < r->n_prompts; i++) {
        free(r->prompts[i].ids);
        free(r->prompts[i].top_id);
        free(r->prompts[i].top_logit);
    }
    free(r->prompts);
    memset(r, 0, sizeof *r);
}

int ref_logits_load(struct ref_logits *r, const char *path, int max_prompts, int64_t max_ids)
{
    memset(r, 0, sizeof *r);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    r->prompts = calloc((size_t)max_prompts, sizeof *r->prompts);
    static char line[65536];
    struct ref_prompt *p = NULL;
    int rc = r->prompts ? 0 : -1;
    while (rc == 0 && fgets(line, sizeof line, f)) {
        if (line[0] == '#')
            continue;
        if (strncmp(line, "prompt ", 7) == 0) {
            if (r->n_prompts == max_prompts)
                break;
            p = &r->prompts[r->n_prompts++];
            p->n = atoll(line + 7);
            if (p->n < 1 || p->n > max_ids) {
                rc = -1;
                break;
            }
            p->ids = calloc((size_t)p->n, sizeof *p->ids);
            p->top_id = calloc((size_t)p->n, sizeof *p->top_id);
            p->top_logit = calloc((size_t)p->n, sizeof *p->top_logit);
            if (!p->ids || !p->top_id || !p->top_logit)
                rc = -1;
        } else if (p && strncmp(line, "ids ", 4) == 0) {
            char *s = line + 4;
            for (int64_t i = 0; i < p->n; i++)
                p->ids[i] = (int32_t)strtol(s, &s, 10);
        } else if (p && strncmp(line, "pos ", 4) == 0) {
            char *s = line + 4;
            long pos = strtol(s, &s, 10);
            if (pos < 0 || pos >= p->n || !(s = strstr(s, "top ")))
                continue;
            s += 4;
            for (int k = 0; k < REF_TOPK; k++) {
                p->top_id[pos][k] = (int32_t)strtol(s, &s, 10);
                s++; /* ':' */
                p->top_logit[pos][k] = strtof(s, &s);
            }
        }
    }
    fclose(f);
    if (rc == 0 && r->n_prompts == 0)
        rc = -1;
    if (rc < 0)
        ref_logits_free(r);
    return rc;
}

double ref_logits_max_diff(const float *got, const int32_t *idx, const float *want, int64_t n)
{
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)got[idx ? idx[i] : i] - (double)want[i]);
        if (!(d <= worst))
            worst = d; /* NaN stays */
        if (isnan(worst))
            break;
    }
    return worst;
}

double ref_logits_check_row(const struct ref_logits *r, int pi, int64_t pos, const float *lg,
                            int64_t V, double tol, int *failed)
{
    const struct ref_prompt *p = &r->prompts[pi];
    int64_t am = 0;
    for (int64_t v = 1; v < V; v++)
        if (lg[v] > lg[am])
            am = v;
    double gap = p->top_logit[pos][0] - p->top_logit[pos][1];
    if (am != p->top_id[pos][0] && gap > tol) {
        fprintf(stderr, "  prompt %d pos %lld: greedy %lld, reference %d (gap %.3f)\n", pi,
                (long long)pos, (long long)am, p->top_id[pos][0], gap);
        *failed = 1;
    }
    double worst = ref_logits_max_diff(lg, p->top_id[pos], p->top_logit[pos], REF_TOPK);
    if (!(worst <= tol)) {
        for (int k = 0; k < REF_TOPK; k++) {
            double d = fabs(lg[p->top_id[pos][k]] - p->top_logit[pos][k]);
            if (!(d <= tol))
                fprintf(stderr, "  prompt %d pos %lld token %d: %.4f vs reference %.4f\n", pi,
                        (long long)pos, p->top_id[pos][k], lg[p->top_id[pos][k]],
                        p->top_logit[pos][k]);
        }
        *failed = 1;
    }
    return worst;
}
