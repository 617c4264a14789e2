/*
 * matmul.cu: weights on the device and the projections through cuBLAS.
 *
 * Weights are dequantized once at load (on the host, with the same
 * quant_dequant_row the CPU backend uses) and uploaded as FP16: decode at
 * batch <= 64 reads every weight once per step, so FP16 halves the bytes of
 * FP32 and feeds the tensor cores through cublasGemmEx (FP16 inputs, FP32
 * accumulation and output). FP16 rather than BF16 because the values are
 * small (Q4_1/Q8_0 blocks scaled by an f16 d) and FP16 keeps 3 more mantissa
 * bits. Quantized Q4_1 kernels would read 3.2x fewer bytes than FP16; not
 * written yet (see the README's CUDA section).
 *
 * Activations stay FP32 between ops; the op that produces a GEMM input
 * (rmsnorm, swiglu, attention) also writes its FP16 copy, so a GEMM reads
 * FP16 without a conversion pass (backend_cuda.c tracks which buffer the
 * FP16 copy belongs to and converts only when it is stale).
 */
#include <stdlib.h>
#include <string.h>

#include "common.cuh"

__global__ void to_f16_kernel(const float *x, __half *y, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        y[i] = __float2half_rn(x[i]);
}

cudaError_t cuda_to_f16(const float *x, __half *y, int64_t n, cudaStream_t s)
{
    int64_t blocks = (n + 255) / 256;
    to_f16_kernel<<<(unsigned)(blocks < 65535 ? blocks : 65535), 256, 0, s>>>(x, y, n);
    return cudaGetLastError();
}

int cuda_gemm(cublasHandle_t h, const __half *W, int64_t N, int64_t K, const __half *x,
              int64_t rows, float *y)
{
    /* Row-major y (rows, N) = x (rows, K) W^T is column-major y^T (N, rows) =
     * W (as a K x N column-major matrix, transposed) times x^T (K x rows). */
    int rc = 0;
    const float one = 1.0f, zero = 0.0f;
    CUBLAS_TRY(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)N, (int)rows, (int)K, &one, W,
                            CUDA_R_16F, (int)K, x, CUDA_R_16F, (int)K, &zero, y, CUDA_R_32F, (int)N,
                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return 0;
fail:
    return rc;
}

int cuda_upload_tensor(const struct tensor *t, int as_f32, void **dev, char *err, size_t err_len)
{
    int rc = 0;
    const size_t n = (size_t)t->ne0 * (size_t)t->ne1;
    const size_t esz = as_f32 ? 4 : 2;
    float *row = (float *)malloc((size_t)t->ne0 * sizeof(float));
    void *host = malloc(n * esz);
    *dev = NULL;
    if (!row || !host) {
        snprintf(err, err_len, "cuda backend: out of host memory uploading weights");
        free(row);
        free(host);
        return -ENOMEM;
    }
    for (int64_t r = 0; r < t->ne1; r++) {
        quant_dequant_row((enum qtype)t->type, (const char *)t->data + (size_t)r * t->row_bytes,
                          row, t->ne0);
        if (as_f32) {
            memcpy((float *)host + (size_t)r * (size_t)t->ne0, row, (size_t)t->ne0 * 4);
        } else {
            __half *hr = (__half *)host + (size_t)r * (size_t)t->ne0;
            for (int64_t i = 0; i < t->ne0; i++)
                hr[i] = __float2half_rn(row[i]);
        }
    }
    CUDA_TRY(cudaMalloc(dev, n * esz));
    CUDA_TRY(cudaMemcpy(*dev, host, n * esz, cudaMemcpyHostToDevice));
    free(row);
    free(host);
    return 0;
fail:
    snprintf(err, err_len, "cuda backend: cannot upload a %lld x %lld weight (%zu bytes)",
             (long long)t->ne1, (long long)t->ne0, n * esz);
    if (*dev)
        cudaFree(*dev);
    *dev = NULL;
    free(row);
    free(host);
    return rc;
}
