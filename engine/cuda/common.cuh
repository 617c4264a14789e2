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

#include "kernel_args.cuh"

/* attention.cu */
/* Checks the shapes the kernels support; 0 or -EINVAL with a message. */
int cuda_attention_check(int Dh, int G, char *err, size_t err_len);
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
