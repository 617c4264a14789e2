/*
 * options.c: the facade's option types (engine.h) and their mapping onto the
 * backend, the KV cache and the sampler. Parsing is the modules' own
 * (kv_policy_parse, backend_kind_parse), so the accepted spellings cannot
 * drift between the CLI, the API and the engine.
 */
#include "options.h"

#include <errno.h>

int engine_backend_parse(const char *s, enum engine_backend *out)
{
    enum backend_kind k;
    if (backend_kind_parse(s, &k) < 0)
        return -EINVAL;
    *out = k == BACKEND_CUDA ? ENGINE_BACKEND_CUDA : ENGINE_BACKEND_CPU;
    return 0;
}

const char *engine_backend_name(enum engine_backend b)
{
    return backend_kind_name(engine__backend_kind(b));
}

enum backend_kind engine__backend_kind(enum engine_backend b)
{
    return b == ENGINE_BACKEND_CUDA ? BACKEND_CUDA : BACKEND_CPU;
}

struct kv_policy engine__kv_policy(struct engine_policy p)
{
    static const enum kv_policy_kind kinds[] = {
        [ENGINE_POLICY_AUTO] = KV_POLICY_AUTO,           [ENGINE_POLICY_WINDOW] = KV_POLICY_WINDOW,
        [ENGINE_POLICY_SINKS] = KV_POLICY_SINKS,         [ENGINE_POLICY_DENSE] = KV_POLICY_DENSE,
        [ENGINE_POLICY_RECOMPUTE] = KV_POLICY_RECOMPUTE,
    };
    return (struct kv_policy){kinds[p.kind], p.n_sinks};
}

struct engine_policy engine__policy_of(struct kv_policy p)
{
    static const enum engine_policy_kind kinds[] = {
        [KV_POLICY_AUTO] = ENGINE_POLICY_AUTO,           [KV_POLICY_WINDOW] = ENGINE_POLICY_WINDOW,
        [KV_POLICY_SINKS] = ENGINE_POLICY_SINKS,         [KV_POLICY_DENSE] = ENGINE_POLICY_DENSE,
        [KV_POLICY_RECOMPUTE] = ENGINE_POLICY_RECOMPUTE,
    };
    return (struct engine_policy){kinds[p.kind], p.n_sinks};
}

int engine_policy_parse(const char *s, struct engine_policy *out)
{
    struct kv_policy p;
    if (kv_policy_parse(s, &p) < 0)
        return -EINVAL;
    *out = engine__policy_of(p);
    return 0;
}

void engine_policy_name(const struct engine_policy *p, char *buf, size_t cap)
{
    struct kv_policy k = engine__kv_policy(*p);
    kv_policy_name(&k, buf, cap);
}

enum kv_dtype engine__kv_dtype(enum engine_kv_dtype d)
{
    return d == ENGINE_KV_F32 ? KV_DTYPE_F32 : d == ENGINE_KV_Q8_0 ? KV_DTYPE_Q8_0 : KV_DTYPE_F16;
}

int engine_kv_dtype_parse(const char *s, enum engine_kv_dtype *out)
{
    enum kv_dtype k;
    if (kv_dtype_parse(s, &k) < 0)
        return -EINVAL;
    *out = k == KV_DTYPE_F32 ? ENGINE_KV_F32 : k == KV_DTYPE_Q8_0 ? ENGINE_KV_Q8_0 : ENGINE_KV_F16;
    return 0;
}

const char *engine_kv_dtype_name(enum engine_kv_dtype d)
{
    return kv_dtype_name(engine__kv_dtype(d));
}

struct sampler_params engine__sampler_params(const struct engine_sampling *s)
{
    return (struct sampler_params){
        .temperature = s->temperature,
        .top_k = s->top_k,
        .top_p = s->top_p,
        .min_p = s->min_p,
        .repeat_penalty = s->repeat_penalty,
        .presence_penalty = s->presence_penalty,
        .frequency_penalty = s->frequency_penalty,
        .penalty_last_n = s->penalty_last_n,
        .seed = s->seed,
    };
}

struct engine_sampling engine_sampling_defaults(void)
{
    struct sampler_params p = sampler_default_params();
    return (struct engine_sampling){
        .temperature = p.temperature,
        .top_k = p.top_k,
        .top_p = p.top_p,
        .min_p = p.min_p,
        .repeat_penalty = p.repeat_penalty,
        .presence_penalty = p.presence_penalty,
        .frequency_penalty = p.frequency_penalty,
        .penalty_last_n = p.penalty_last_n,
        .seed = p.seed,
    };
}
