/* matmul.h — the GEMM and linear-layer launchers of kernels/matmul.cu as host/ops/matmul.c
 * and ops/linear.c call them (through host/ops/backend.h), and its strided copy. */
#ifndef LUTRA_KERNELS_MATMUL_H
#define LUTRA_KERNELS_MATMUL_H
#include "lutra.h"
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif

/* One (strided-batched) GEMM in lutra's row-major terms, run by kernels/matmul.cu:
 * for each batch i < batch, C_i (M, N) = epilogue(alpha * op(A_i) (M, K) @ op(B_i) (K, N) + beta * C_i).
 * A is stored (M, K) row-major with row stride lda, or (K, M) when trans_a; likewise B;
 * stride_* are the element distances between batches (0: shared by every batch). a and b
 * have dtype `dtype`; c has out_dtype (= dtype, or f32 for bf16/f16 inputs). Epilogues:
 * BIAS and GELU_BIAS add bias (N values, one per column of C, dtype out_dtype) before
 * the (tanh) GELU; BGRAD_A writes into bias_grad the M row sums of op(A) over K (the bias
 * gradient of a linear layer when op(A) = dy^T), in out_dtype. */
enum {
  LT_GEMM_EPI_NONE = 0,
  LT_GEMM_EPI_BIAS = 1,
  LT_GEMM_EPI_GELU_BIAS = 2,
  LT_GEMM_EPI_BGRAD_A = 3,
  LT_GEMM_EPI_GELU = 4
};
typedef struct lt_cuda_gemm_args {
  int device, dtype, out_dtype;
  int64_t M, N, K, batch;
  const void *a;
  int64_t lda, stride_a;
  int trans_a;
  const void *b;
  int64_t ldb, stride_b;
  int trans_b;
  void *c;
  int64_t ldc, stride_c;
  double alpha, beta;
  int epilogue;
  void *bias; /* read for BIAS / GELU_BIAS, written for BGRAD_A */
  int tf32;   /* f32 only: tensor cores with TF32 inputs */
} lt_cuda_gemm_args;
int lt_cuda_gemm(const char *op, const lt_cuda_gemm_args *g);
/* Linear layer on CUDA tensors (x (..., K), w (N, K), bias (N) or undefined/NULL):
 * out (..., N) = act(x @ w^T + bias), act 0 none, 1 GELU (tanh form, cuBLASLt's). out is
 * allocated with x's dtype when undefined; a defined out may also be f32 for bf16/f16 x. */
int lt_cuda_linear_forward(lt_tensor *out, const lt_tensor *x, const lt_tensor *w, const lt_tensor *bias, int act);
/* Its parameter gradients: dw (N, K) = dy^T @ x and, when dbias is non-NULL, dbias (N) = the
 * sum of dy over rows, fused into the same GEMM (BGRADB). dy (..., N), x (..., K) contiguous. */
int lt_cuda_linear_backward_params(lt_tensor *dw, lt_tensor *dbias, const lt_tensor *dy, const lt_tensor *x);
/* dst = src over shape, each with its own element strides (same dtype; any element size). */
int lt_cuda_strided_copy(int device, void *dst, const int64_t *dst_stride, const void *src, const int64_t *src_stride,
                         int ndim, const int64_t *shape, int dtype);
/* cuBLAS's own rate for a benchmark: c = a @ b, n x n matrices of dtype on device (f32 obeys
 * tf32), through cublasGemmEx directly; `iters` of them timed with events; seconds per GEMM. */
int lt_cuda_bench_cublas_gemm(int device, int dtype, int n, const void *a, const void *b, void *c, int iters, int tf32,
                              double *seconds);

#ifdef __cplusplus
}
#endif
#endif
