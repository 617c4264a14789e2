/*
 * common.cuh: what the CUDA backend's files share (engine/cuda/ only; the
 * only files that include cuda*.h). The context, the per-token metadata the
 * kernels read, error handling and the launchers of attention.cu and
 * matmul.cu.
 *
 * Errors: CUDA_TRY / CUBLAS_TRY log file:line and the library's message to
 * stderr, set rc = -EIO and `goto fail`. They never exit: a failed step fails
 * that step's sequences (engine.c) and the process keeps serving.
 */
#ifndef SS_CUDA_COMMON_CUH
#define SS_CUDA_COMMON_CUH

#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>

#define restrict __restrict__ /* the C headers use C99's keyword */
extern "C" {
#include "../backend.h"
#include "../quant.h"
#include "../rope.h"
}
#undef restrict

#define CUDA_TRY(expr)                                                                             \
    do {                                                                                           \
        cudaError_t e_ = (expr);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            cuda_log_error(__FILE__, __LINE__, #expr, cudaGetErrorString(e_));                     \
            rc = -EIO;                                                                             \
            goto fail;                                                                             \
        }                                                                                          \
    } while (0)

#define CUBLAS_TRY(expr)                                                                           \
    do {                                                                                           \
        cublasStatus_t s_ = (expr);                                                                \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                         \
            cuda_log_error(__FILE__, __LINE__, #expr, cublasGetStatusString(s_));                  \
            rc = -EIO;                                                                             \
            goto fail;                                                                             \
        }                                                                                          \
    } while (0)

void cuda_log_error(const char *file, int line, const char *expr, const char *msg);

/* One token of the step, as the kernels see it (packed on the host in
 * begin_step, copied to the device with the step's other metadata). */
struct cuda_tok {
    int64_t slot;      /* KV slot */
    int64_t cell;      /* cell its K/V go to */
    int64_t n_sinks;   /* kv_view: sink cells 0 .. n_sinks-1 */
    int64_t win_start; /* kv_view: window positions win_start .. +win_len-1 */
    int64_t win_len;
    int64_t ring; /* kv_seq: window position p lives in cell sink_base + p % ring */
    int64_t sink_base;
    int64_t pos_first; /* kv_seq: the sequence's first position (probe) */
    int32_t token;
    int32_t pad;
};

/* A run of consecutive tokens of one sequence handled by the prefill kernel. */
struct cuda_tile {
    int32_t first; /* token index of the first */
    int32_t count; /* <= the tile size the step was built with */
};

/* Element offsets into a K or V buffer, [slot][layer][kv_head][cell][Dh]
 * (kv_geometry_offset). */
struct cuda_kv_geo {
    int64_t cells;    /* per slot and head */
    int64_t per_head; /* cells * Dh */
    int64_t per_layer;
    int64_t per_slot;
};

/* Everything the attention kernels of one layer need. */
struct cuda_attn_args {
    const float *q, *qc; /* (T, H*Dh) */
    float *out;          /* (T, H*Dh) */
    __half *out_h;       /* (T, H*Dh) f16 copy for the next GEMM */
    float *stats;        /* (T, H, 2): final (max, sum) per query head, for the probe */
    const void *k, *v;   /* KV buffers (f16 or f32) */
    const struct cuda_tok *tok;
    const int32_t *dec; /* decode tokens: token indices */
    const struct cuda_tile *tiles;
    float *part;        /* split partial states */
    const float *sinks; /* (H) sink logits on the device, or NULL */
    struct cuda_kv_geo geo;
    int layer;
    int norm; /* enum model_normalizer */
    int H, Hkv, G, Dh;
    int n_split;     /* key splits per (token, kv head) */
    int tile_tokens; /* tokens per prefill tile */
    float scale;     /* 1/sqrt(Dh) */
};

/* attention.cu */
#define CUDA_ATT_SPLIT 128 /* keys per split-K block (fixed by key index) */
#define CUDA_ATT_MAXG 8    /* query heads per kv head */
/* Checks the shapes the kernels support; 0 or -EINVAL with a message. */
int cuda_attention_check(int Dh, int G, int kv_f16, char *err, size_t err_len);
/* Sets the kernels' shared-memory limits once (needs the device). */
int cuda_attention_setup(int Dh, int G, int kv_f16);
/* Prefill tile size for (Dh, G): as many tokens as fit the shared memory. */
int cuda_attention_tile_tokens(int Dh, int G);
/* The decode path: n_dec tokens, one split-K launch plus one merge launch. */
cudaError_t cuda_attention_decode(const struct cuda_attn_args *a, int n_dec, int kv_f16,
                                  cudaStream_t s);
/* The chunked-prefill path: n_tiles tiles of the sliding-window causal mask. */
cudaError_t cuda_attention_prefill(const struct cuda_attn_args *a, int n_tiles, int kv_f16,
                                   cudaStream_t s);
/* Probe weights (T, H, BACKEND_PROBE_K) from the final stats of both paths. */
cudaError_t cuda_attention_probe(const struct cuda_attn_args *a, int T, int kv_f16, float *probe,
                                 cudaStream_t s);

/* matmul.cu */
/* y (rows, N) f32 = x (rows, K) f16 times W^T, W (N, K) f16 row-major. */
cudaError_t cuda_to_f16(const float *x, __half *y, int64_t n, cudaStream_t s);
int cuda_gemm(cublasHandle_t h, const __half *W, int64_t N, int64_t K, const __half *x,
              int64_t rows, float *y);
/* Dequantizes a host tensor into a new device array of f16 (or f32) values. */
int cuda_upload_tensor(const struct tensor *t, int as_f32, void **dev, char *err, size_t err_len);

#endif
