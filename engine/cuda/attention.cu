/*
 * attention.cu: the launchers of the attention kernels (attention_kernels.cuh)
 * and the shape checks; common.cuh declares them.
 */
#include "common.cuh"

#include "attention_kernels.cuh"

int cuda_attention_tile_tokens(int Dh, int G)
{
    return att_tile_tokens(Dh, G);
}

/* ---- launchers ----------------------------------------------------------------------------- */

int cuda_attention_check(int Dh, int G, char *err, size_t err_len)
{
    if (Dh != 16 && Dh != 32 && Dh != 64 && Dh != 128 && Dh != 256) {
        snprintf(err, err_len, "cuda backend: head_dim %d is not supported (16, 32, 64, 128, 256)",
                 Dh);
        return -EINVAL;
    }
    if (G < 1 || G > CUDA_ATT_MAXG) {
        snprintf(err, err_len, "cuda backend: %d query heads per kv head (at most %d)", G,
                 CUDA_ATT_MAXG);
        return -EINVAL;
    }
    if (prefill_smem(Dh, G, 1) > PRE_SMEM_LIMIT) {
        snprintf(err, err_len,
                 "cuda backend: head_dim %d with %d heads per group needs too much "
                 "shared memory",
                 Dh, G);
        return -EINVAL;
    }
    return 0;
}

/* Calls f.template operator()<KV, DH>() for the run-time (kv_f16, Dh). */
template <typename F> static cudaError_t dispatch(int kv_f16, int Dh, F f)
{
#define SS_DH_CASES(KV)                                                                            \
    switch (Dh) {                                                                                  \
    case 16:                                                                                       \
        return f.template operator()<KV, 16>();                                                    \
    case 32:                                                                                       \
        return f.template operator()<KV, 32>();                                                    \
    case 64:                                                                                       \
        return f.template operator()<KV, 64>();                                                    \
    case 128:                                                                                      \
        return f.template operator()<KV, 128>();                                                   \
    case 256:                                                                                      \
        return f.template operator()<KV, 256>();                                                   \
    default:                                                                                       \
        return cudaErrorInvalidValue;                                                              \
    }
    if (kv_f16) {
        SS_DH_CASES(__half)
    } else {
        SS_DH_CASES(float)
    }
#undef SS_DH_CASES
}

struct setup_fn {
    int Dh, G;
    template <typename KV, int DH> cudaError_t operator()() const
    {
        cudaError_t e = cudaFuncSetAttribute(attention_split_kernel<KV, DH>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)split_smem(DH, G));
        if (e != cudaSuccess)
            return e;
        return cudaFuncSetAttribute(attention_prefill_kernel<KV, DH>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)prefill_smem(DH, G, cuda_attention_tile_tokens(DH, G)));
    }
};

int cuda_attention_setup(int Dh, int G, int kv_f16)
{
    return dispatch(kv_f16, Dh, setup_fn{Dh, G}) == cudaSuccess ? 0 : -EIO;
}

struct decode_fn {
    const cuda_attn_args *a;
    int n_dec;
    cudaStream_t s;
    template <typename KV, int DH> cudaError_t operator()() const
    {
        dim3 grid(a->n_split, a->Hkv, n_dec);
        attention_split_kernel<KV, DH><<<grid, ATT_THREADS, split_smem(DH, a->G), s>>>(*a);
        attention_merge_kernel<DH><<<dim3(n_dec, a->H), DH, 0, s>>>(*a);
        return cudaGetLastError();
    }
};

cudaError_t cuda_attention_decode(const struct cuda_attn_args *a, int n_dec, int kv_f16,
                                  cudaStream_t s)
{
    if (n_dec <= 0)
        return cudaSuccess;
    return dispatch(kv_f16, a->Dh, decode_fn{a, n_dec, s});
}

struct prefill_fn {
    const cuda_attn_args *a;
    int n_tiles;
    cudaStream_t s;
    template <typename KV, int DH> cudaError_t operator()() const
    {
        attention_prefill_kernel<KV, DH>
            <<<dim3(n_tiles, a->Hkv), ATT_THREADS, prefill_smem(DH, a->G, a->tile_tokens), s>>>(*a);
        return cudaGetLastError();
    }
};

cudaError_t cuda_attention_prefill(const struct cuda_attn_args *a, int n_tiles, int kv_f16,
                                   cudaStream_t s)
{
    if (n_tiles <= 0)
        return cudaSuccess;
    return dispatch(kv_f16, a->Dh, prefill_fn{a, n_tiles, s});
}

struct probe_fn {
    const cuda_attn_args *a;
    int T;
    float *probe;
    cudaStream_t s;
    template <typename KV, int DH> cudaError_t operator()() const
    {
        attention_probe_kernel<KV, DH><<<dim3(T, a->H), BACKEND_PROBE_K, 0, s>>>(*a, probe);
        return cudaGetLastError();
    }
};

cudaError_t cuda_attention_probe(const struct cuda_attn_args *a, int T, int kv_f16, float *probe,
                                 cudaStream_t s)
{
    if (T <= 0)
        return cudaSuccess;
    return dispatch(kv_f16, a->Dh, probe_fn{a, T, probe, s});
}
