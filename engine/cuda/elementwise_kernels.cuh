/*
 * elementwise_kernels.cuh: the element-wise kernels of the CUDA backend
 * (device code only; the launches are in backend_cuda.cu's issue() and
 * issue_step()). Each is held to the CPU backend's op of the same name,
 * engine/cpu/backend_cpu.c (tests/invariants/test_cuda_matches_cpu.c on a
 * GPU, tests/cuda_emu/test_elementwise_emulated.cpp without one):
 *
 * - embed_kernel: x row t = tok_embd row tok[t].token (FP32 rows uploaded
 *   once); reference cpu_embed (quant_dequant_row of the same row).
 * - rmsnorm_kernel: out = x * rsqrt(mean(x^2) + eps) * w per row of D (the
 *   model width, or one head's Dh for Gemma's per-head norms), one block per row (blockDim a
 * multiple of 32, at most 1024), plus the FP16 copy of out for the next GEMM; reference cpu_rmsnorm
 * (sum of squares in double there, a float shuffle tree here).
 * - add_rmsnorm_kernel: x += y, then rmsnorm_kernel's out of the new x: the
 *   same float operations as add_kernel followed by rmsnorm_kernel; reference
 *   cpu_add then cpu_rmsnorm.
 * - rope_kernel: q rotated at the absolute position (cs_abs), qc = q rotated
 *   at the in-cache position (cs_cache), k at the absolute position, from the
 *   host's double-precision tables (rope_cos_sin, with the layer's RoPE base);
 *   adjacent or NEOX pairs; elements past rope_dim are copied into qc and
 *   left alone in q and k; reference cpu_rope (memcpy + rope_apply or
 *   rope_apply_neox, engine/rope.c).
 * - sink_key_logits_kernel: the per-token sink logits s_h + scale q0 . k_g
 *   of a layer with sink keys (q0 the query before RoPE; k_g rotated with
 *   the query's table instead); reference cpu_sink_key_logits.
 * - kv_store_kernel: token t's k and v rows into the KV buffers at
 *   (slot, layer, kv head, cell), laid out as kv_geometry_offset
 *   (kvcache.h), FP16 (round to nearest even) or FP32; reference cpu_kv_store.
 * - swiglu_kernel: hb = silu(hb) * hb2 = g / (1 + e^-g) * u, plus its FP16
 *   copy; reference cpu_swiglu.
 * - geglu_kernel: hb = gelu_tanh(hb) * hb2 (tanh approximation), plus its
 *   FP16 copy; reference cpu_geglu.
 * - scale_kernel: x *= s; reference cpu_scale.
 * - add_kernel: x += y; reference cpu_add.
 * - gather_kernel: xo row i = x row rows[i] (the rows that need logits);
 *   reference cpu_gather.
 */
#ifndef SS_CUDA_ELEMENTWISE_KERNELS_CUH
#define SS_CUDA_ELEMENTWISE_KERNELS_CUH

#include <math.h>
#include <stdint.h>

#include "kernel_args.cuh"

/* The second half of both norms: sums this thread's partial sum of squares
 * ss over the block (warp shuffles, then one warp over the warps' sums in
 * part[32]) and writes row = xr / rms * w in f32 and its f16 copy. In place
 * (row == xr) is fine: each thread rewrites what it read. */
__device__ __forceinline__ void rmsnorm_row_finish(const float *xr, float ss, float *part,
                                                   const float *w, float *row, __half *row_h, int D,
                                                   float eps)
{
    for (int o = 16; o > 0; o >>= 1)
        ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if ((threadIdx.x & 31) == 0)
        part[threadIdx.x >> 5] = ss;
    __syncthreads();
    if (threadIdx.x < 32) {
        float s = threadIdx.x < (blockDim.x >> 5) ? part[threadIdx.x] : 0.0f;
        for (int o = 16; o > 0; o >>= 1)
            s += __shfl_xor_sync(0xffffffffu, s, o);
        if (threadIdx.x == 0)
            part[0] = s;
    }
    __syncthreads();
    const float inv = rsqrtf(part[0] / (float)D + eps);
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        const float o = xr[i] * inv * w[i];
        row[i] = o;
        row_h[i] = __float2half_rn(o);
    }
}

/* A static shared-memory array of n T named `name`, one per block. (A macro so
 * that a CPU emulation of the execution model can give each block its own
 * storage; tests/cuda_emu/.) */
#ifndef SS_STATIC_SMEM
#define SS_STATIC_SMEM(T, name, n) __shared__ T name[n]
#endif

__global__ void embed_kernel(const float *emb, const cuda_tok *tok, float *x, int D)
{
    const int64_t t = blockIdx.x;
    const float *row = emb + (int64_t)tok[t].token * D;
    for (int i = threadIdx.x; i < D; i += blockDim.x)
        x[t * D + i] = row[i];
}

__global__ void rmsnorm_kernel(const float *x, const float *w, float *out, __half *out_h, int D,
                               float eps)
{
    SS_STATIC_SMEM(float, part, 32);
    const int64_t t = blockIdx.x;
    const float *xr = x + t * D;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < D; i += blockDim.x)
        ss += xr[i] * xr[i];
    rmsnorm_row_finish(xr, ss, part, w, out + t * D, out_h + t * D, D, eps);
}

/* x += y, then out = rmsnorm(x) * w: the residual add and the next block's
 * norm in one pass over x (forward.c's add + rmsnorm pair). The same float
 * operations as add_kernel followed by rmsnorm_kernel. */
__global__ void add_rmsnorm_kernel(float *x, const float *y, const float *w, float *out,
                                   __half *out_h, int D, float eps)
{
    SS_STATIC_SMEM(float, part, 32);
    const int64_t t = blockIdx.x;
    float *xr = x + t * D;
    const float *yr = y + t * D;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        const float v = xr[i] + yr[i];
        xr[i] = v;
        ss += v * v;
    }
    rmsnorm_row_finish(xr, ss, part, w, out + t * D, out_h + t * D, D, eps);
}

/* q -> q at the absolute position and qc at the in-cache one; k at the
 * absolute position. Pair j < rope_dim/2 of a head is elements (2j, 2j+1)
 * (adjacent layout) or (j, j + rope_dim/2) (neox); elements from rope_dim on
 * are copied into qc and left alone in q and k. The tables are the layer's
 * (a local layer's RoPE base has its own). */
__global__ void rope_kernel(float *q, float *qc, float *k, const float *cs_abs,
                            const float *cs_cache, int H, int Hkv, int Dh, int rope_dim, int neox)
{
    const int64_t t = blockIdx.x;
    const int half = Dh / 2, rhalf = rope_dim / 2;
    const float *ca = cs_abs + t * rope_dim, *cc = cs_cache + t * rope_dim;
    for (int i = threadIdx.x; i < (H + Hkv) * half; i += blockDim.x) {
        const int j = i % half;     /* pair within the head */
        const bool rot = j < rhalf; /* as rope_apply / rope_apply_neox */
        const int hd = i / half;    /* head: query heads, then key heads */
        /* the pair's two elements within the head */
        const int e0 = rot && neox ? j : 2 * j, e1 = rot && neox ? j + rhalf : 2 * j + 1;
        if (hd < H) {
            float *qh = q + (t * H + hd) * Dh;
            float *ch = qc + (t * H + hd) * Dh;
            const float x0 = qh[e0], x1 = qh[e1];
            if (rot) {
                ch[e0] = x0 * cc[2 * j] - x1 * cc[2 * j + 1];
                ch[e1] = x0 * cc[2 * j + 1] + x1 * cc[2 * j];
                qh[e0] = x0 * ca[2 * j] - x1 * ca[2 * j + 1];
                qh[e1] = x0 * ca[2 * j + 1] + x1 * ca[2 * j];
            } else {
                ch[e0] = x0;
                ch[e1] = x1;
            }
        } else if (rot) {
            float *kh = k + (t * Hkv + (hd - H)) * Dh;
            const float x0 = kh[e0], x1 = kh[e1];
            kh[e0] = x0 * ca[2 * j] - x1 * ca[2 * j + 1];
            kh[e1] = x0 * ca[2 * j + 1] + x1 * ca[2 * j];
        }
    }
}

/* Per-token sink logits of a layer with sink keys (blk.N.attn_sinks_k):
 * out[t*H + h] = sinks[h] + scale * q[t,h] . R(t) k_g, g = h / (H/Hkv), q
 * rotated at the absolute position by rope_kernel with the same table cs, so
 * that the product is q before RoPE dotted with k_g (the sink at distance 0
 * from every query). One warp per head: lane-strided pairs, a shuffle sum.
 * Reference cpu_sink_key_logits (engine/cpu/sink_key.c). */
__global__ void sink_key_logits_kernel(const float *q, const float *cs, const float *sinks,
                                       const float *ks, float *out, int H, int Hkv, int Dh,
                                       int rope_dim, int neox, float scale)
{
    const int64_t t = blockIdx.x;
    const int lane = threadIdx.x & 31, G = H / Hkv, half = Dh / 2, rhalf = rope_dim / 2;
    const float *ct = cs + t * rope_dim;
    for (int h = threadIdx.x >> 5; h < H; h += blockDim.x >> 5) {
        const float *qh = q + (t * H + h) * Dh;
        const float *kg = ks + (int64_t)(h / G) * Dh;
        float s = 0.0f;
        for (int j = lane; j < half; j += 32) {
            const bool rot = j < rhalf; /* the pairs of rope_kernel */
            const int e0 = rot && neox ? j : 2 * j, e1 = rot && neox ? j + rhalf : 2 * j + 1;
            float k0 = kg[e0], k1 = kg[e1];
            if (rot) {
                const float c = ct[2 * j], sn = ct[2 * j + 1];
                const float r0 = k0 * c - k1 * sn, r1 = k0 * sn + k1 * c;
                k0 = r0;
                k1 = r1;
            }
            s += qh[e0] * k0 + qh[e1] * k1;
        }
        for (int o = 16; o > 0; o >>= 1)
            s += __shfl_xor_sync(0xffffffffu, s, o);
        if (lane == 0)
            out[t * H + h] = sinks[h] + scale * s;
    }
}

__device__ __forceinline__ void store_kv(__half *d, float x)
{
    *d = __float2half_rn(x);
}
__device__ __forceinline__ void store_kv(float *d, float x)
{
    *d = x;
}

template <typename KV>
__global__ void kv_store_kernel(const float *k, const float *v, KV *K, KV *V, const cuda_tok *tok,
                                cuda_kv_geo geo, int Hkv, int Dh)
{
    const int64_t t = blockIdx.x;
    const cuda_tok tk = tok[t];
    for (int i = threadIdx.x; i < Hkv * Dh; i += blockDim.x) {
        const int g = i / Dh, e = i % Dh;
        const int64_t off =
            tk.slot * geo.per_slot + geo.layer_off + (int64_t)g * geo.per_head + tk.cell * Dh + e;
        store_kv(K + off, k[t * Hkv * Dh + i]);
        store_kv(V + off, v[t * Hkv * Dh + i]);
    }
}

__global__ void swiglu_kernel(float *hb, const float *hb2, __half *hb_h, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const float g = hb[i];
        const float o = g / (1.0f + expf(-g)) * hb2[i];
        hb[i] = o;
        hb_h[i] = __float2half_rn(o);
    }
}

/* GELU, tanh approximation, as the CPU backend's gelu_tanh */
__device__ __forceinline__ float gelu_tanh(float x)
{
    const float k = 0.7978845608028654f; /* sqrt(2 / pi) */
    return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}

__global__ void geglu_kernel(float *hb, const float *hb2, __half *hb_h, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const float o = gelu_tanh(hb[i]) * hb2[i];
        hb[i] = o;
        hb_h[i] = __float2half_rn(o);
    }
}

__global__ void scale_kernel(float *x, float s, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        x[i] *= s;
}

__global__ void add_kernel(float *x, const float *y, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        x[i] += y[i];
}

__global__ void gather_kernel(const float *x, float *xo, const int32_t *rows, int D)
{
    const int64_t i = blockIdx.x;
    const float *src = x + (int64_t)rows[i] * D;
    for (int e = threadIdx.x; e < D; e += blockDim.x)
        xo[i * D + e] = src[e];
}

#endif
