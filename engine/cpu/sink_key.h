/*
 * sink_key.h: per-token sink logits of a layer with learned sink keys
 * (blk.N.attn_sinks_k, docs/gguf-normalizer.md). Internal to engine/cpu; the
 * CUDA backend's sink_key_logits_kernel (engine/cuda/elementwise_kernels.cuh)
 * computes the same array and is held to this function by tests/cuda_emu.
 */
#ifndef SS_CPU_SINK_KEY_H
#define SS_CPU_SINK_KEY_H

#include <stdint.h>

/* out[t*H + h] = sinks[h] + scale * q0[t,h] . k_s[g], g = h / (H / Hkv), for
 * T tokens, where q0 is the query before RoPE. q holds the queries already
 * rotated (T, H*Dh), each token's with the table cs + t*rope_dim (rope_cos_sin
 * at the token's position, the layer's base) in the adjacent (neox = 0) or
 * NEOX layout; k_s (Hkv, Dh). Each k_g is rotated with the token's own table,
 * so that q_rot . R k_g = q0 . k_g: the sink sits at distance 0 from every
 * query. The dot product is summed in double. head_dim <= MODEL_MAX_HEAD_DIM
 * (model_load refuses wider heads). */
void cpu_sink_key_logits(const float *q, int64_t T, int H, int Hkv, int head_dim, int rope_dim,
                         int neox, const float *cs, const float *sinks, const float *k_s,
                         float scale, float *out);

#endif
