/*
 * options.h: the engine facade's choices (engine.h: backend, policy, KV
 * dtype, sampling) mapped onto the modules that implement them. Internal to
 * engine/.
 */
#ifndef SS_ENGINE_OPTIONS_H
#define SS_ENGINE_OPTIONS_H

#include "backend.h"
#include "engine.h"
#include "kvcache.h"
#include "sampler.h"

enum backend_kind engine__backend_kind(enum engine_backend b);
struct kv_policy engine__kv_policy(struct engine_policy p);
struct engine_policy engine__policy_of(struct kv_policy p);
enum kv_dtype engine__kv_dtype(enum engine_kv_dtype d);
struct sampler_params engine__sampler_params(const struct engine_sampling *s);

#endif
