/* matmul.cu — matmuls on CUDA tensors through cuBLASLt (host/core/internal.h's bridge).
 *
 * lutra's matrices are row-major with strides; cuBLASLt's are column-major. A row-major
 * (R, C) matrix with row stride ld is the column-major (C, R) matrix of its transpose with
 * the same ld, so C = op(A) @ op(B) (row-major) is run as C^T = op(B)^T @ op(A)^T: cuBLASLt's
 * "A" is our b, its "B" is our a, m and n swap, the trans flags and lds carry over as they are.
 * The bias of a linear layer (one value per column of our C) is then one value per row of
 * cuBLASLt's D, as its BIAS epilogue wants, and our "row sums of op(A)" bias gradient is its
 * BGRADB.
 *
 * Per device: one cublasLt handle, one 32 MiB workspace, made at first use and kept. The
 * algorithm for a (shape, layout, dtype, epilogue, alignment) problem comes from
 * cublasLtMatmulAlgoGetHeuristic once and is cached. Everything runs on the legacy default
 * stream, as the other kernels do. */
#include "kernels/common.cuh"
#include "kernels/matmul.h"
#include <cublasLt.h>
#include <cublas_v2.h>
#include <pthread.h>

enum { GEMM_MAX_DEVICES = 16, GEMM_CACHE_SIZE = 64 };
static const size_t GEMM_WORKSPACE_BYTES = (size_t)32 << 20;

static pthread_mutex_t gemm_lock = PTHREAD_MUTEX_INITIALIZER;
static cublasLtHandle_t lt_handles[GEMM_MAX_DEVICES];
static void *workspaces[GEMM_MAX_DEVICES];
static cublasHandle_t blas_handles[GEMM_MAX_DEVICES]; /* the benchmark's reference only */

static int blas_error(const char *op, int device, const char *what, cublasStatus_t st) {
  return lt_errorf("%s: cuBLASLt error on cuda:%d in %s: %s (%s)", op, device, what, cublasLtGetStatusString(st),
                   cublasLtGetStatusName(st));
}
#define LT_BLAS_TRY(op, device, call)                                                                                  \
  do {                                                                                                                 \
    cublasStatus_t st_ = (call);                                                                                       \
    if (st_ != CUBLAS_STATUS_SUCCESS) {                                                                                \
      rc = blas_error(op, device, #call, st_);                                                                         \
      goto done;                                                                                                       \
    }                                                                                                                  \
  } while (0)

/* The device's handle and workspace, made at first use (the device is current). */
static int device_context(const char *op, int device, cublasLtHandle_t *handle, void **workspace) {
  if (device < 0 || device >= GEMM_MAX_DEVICES) return lt_errorf("%s: device cuda:%d is out of range", op, device);
  int rc = 0;
  pthread_mutex_lock(&gemm_lock);
  if (!lt_handles[device]) {
    cublasStatus_t st = cublasLtCreate(&lt_handles[device]);
    if (st != CUBLAS_STATUS_SUCCESS) {
      lt_handles[device] = NULL;
      rc = blas_error(op, device, "cublasLtCreate", st);
    }
  }
  if (rc == 0 && !workspaces[device]) {
    cudaError_t err = cudaMalloc(&workspaces[device], GEMM_WORKSPACE_BYTES);
    if (err != cudaSuccess) {
      workspaces[device] = NULL;
      rc = lt_cuda_error(op, device, err);
    }
  }
  *handle = lt_handles[device];
  *workspace = workspaces[device];
  pthread_mutex_unlock(&gemm_lock);
  return rc;
}

static bool cuda_type_of(int dtype, cudaDataType_t *t) {
  switch (dtype) {
  case LT_F32: *t = CUDA_R_32F; return true;
  case LT_F64: *t = CUDA_R_64F; return true;
  case LT_BF16: *t = CUDA_R_16BF; return true;
  case LT_F16: *t = CUDA_R_16F; return true;
  default: return false;
  }
}

/* Largest power of two (up to 256) dividing the address: heuristics must only offer
 * algorithms that are valid for pointers into the middle of a tensor. */
static int64_t alignment_of(const void *p) {
  uintptr_t u = (uintptr_t)p;
  int64_t a = 256;
  while (a > 1 && u % (uintptr_t)a) a /= 2;
  return a;
}

/* ---- the algorithm cache ------------------------------------------------------------------ */

/* All int64 so that the key has no padding and compares with memcmp. */
typedef struct gemm_key {
  int64_t device, dtype, out_dtype, M, N, K, batch, lda, ldb, ldc, stride_a, stride_b, stride_c, trans_a, trans_b,
      epilogue, tf32, align_a, align_b, align_c, align_bias;
} gemm_key;

typedef struct gemm_cache_entry {
  bool used;
  gemm_key key;
  cublasLtMatmulAlgo_t algo;
} gemm_cache_entry;

static gemm_cache_entry algo_cache[GEMM_CACHE_SIZE];
static int algo_cache_next; /* round-robin replacement */

static bool cache_find(const gemm_key *k, cublasLtMatmulAlgo_t *algo) {
  bool found = false;
  pthread_mutex_lock(&gemm_lock);
  for (int i = 0; i < GEMM_CACHE_SIZE && !found; i++)
    if (algo_cache[i].used && memcmp(&algo_cache[i].key, k, sizeof *k) == 0) *algo = algo_cache[i].algo, found = true;
  pthread_mutex_unlock(&gemm_lock);
  return found;
}

static void cache_put(const gemm_key *k, const cublasLtMatmulAlgo_t *algo) {
  pthread_mutex_lock(&gemm_lock);
  gemm_cache_entry *e = &algo_cache[algo_cache_next];
  algo_cache_next = (algo_cache_next + 1) % GEMM_CACHE_SIZE;
  e->used = true, e->key = *k, e->algo = *algo;
  pthread_mutex_unlock(&gemm_lock);
}

/* ---- one GEMM --------------------------------------------------------------------------------- */

static cublasLtEpilogue_t epilogue_of(int epi) {
  switch (epi) {
  case LT_GEMM_EPI_BIAS: return CUBLASLT_EPILOGUE_BIAS;
  case LT_GEMM_EPI_GELU_BIAS: return CUBLASLT_EPILOGUE_GELU_BIAS;
  case LT_GEMM_EPI_GELU: return CUBLASLT_EPILOGUE_GELU;
  case LT_GEMM_EPI_BGRAD_A: return CUBLASLT_EPILOGUE_BGRADB; /* our A is cuBLASLt's B */
  default: return CUBLASLT_EPILOGUE_DEFAULT;
  }
}

/* Checks what cuBLASLt would reject less clearly: dtypes, sizes, strides. */
static int check_gemm_args(const char *op, const lt_cuda_gemm_args *g, cudaDataType_t *ab_type,
                           cudaDataType_t *c_type) {
  if (!cuda_type_of(g->dtype, ab_type) || !cuda_type_of(g->out_dtype, c_type))
    return lt_errorf("%s: cuda gemm needs f32, f64, bf16 or f16 operands, got %s -> %s", op, lt_dtype_name(g->dtype),
                     lt_dtype_name(g->out_dtype));
  bool half = g->dtype == LT_BF16 || g->dtype == LT_F16;
  if (g->out_dtype != g->dtype && !(half && g->out_dtype == LT_F32))
    return lt_errorf("%s: cuda gemm of %s operands writes %s or f32, not %s", op, lt_dtype_name(g->dtype),
                     lt_dtype_name(g->dtype), lt_dtype_name(g->out_dtype));
  if (g->M < 0 || g->N < 0 || g->K < 0 || g->batch < 0)
    return lt_errorf("%s: negative gemm size M=%lld N=%lld K=%lld batch=%lld", op, (long long)g->M, (long long)g->N,
                     (long long)g->K, (long long)g->batch);
  if (g->epilogue != LT_GEMM_EPI_NONE && g->batch > 1)
    return lt_errorf("%s: gemm epilogues take one matrix, not a batch of %lld", op, (long long)g->batch);
  if (g->epilogue != LT_GEMM_EPI_NONE && g->epilogue != LT_GEMM_EPI_GELU && !g->bias)
    return lt_errorf("%s: this gemm epilogue needs a bias buffer", op);
  if (g->epilogue != LT_GEMM_EPI_NONE && (g->beta != 0 || g->dtype == LT_F64))
    return lt_errorf("%s: gemm epilogues need beta == 0 and a 16-bit or f32 dtype", op);
  return 0;
}

int lt_cuda_gemm(const char *op, const lt_cuda_gemm_args *g) {
  cudaDataType_t ab_type = CUDA_R_32F, c_type = CUDA_R_32F;
  LT_TRY(check_gemm_args(op, g, &ab_type, &c_type));
  if (g->M == 0 || g->N == 0 || g->batch == 0) return 0;
  if (g->K == 0) return lt_errorf("%s: cuda gemm with K == 0 (the caller fills or scales C)", op);
  LT_TRY(lt_cuda_use_device(op, g->device));
  cublasLtHandle_t handle = NULL;
  void *workspace = NULL;
  LT_TRY(device_context(op, g->device, &handle, &workspace));

  bool f64 = g->dtype == LT_F64;
  cublasComputeType_t compute = f64                               ? CUBLAS_COMPUTE_64F
                                : (g->dtype == LT_F32 && g->tf32) ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                                  : CUBLAS_COMPUTE_32F;
  cudaDataType_t scale_type = f64 ? CUDA_R_64F : CUDA_R_32F;
  float alpha_f = (float)g->alpha, beta_f = (float)g->beta;
  const void *alpha = f64 ? (const void *)&g->alpha : (const void *)&alpha_f;
  const void *beta = f64 ? (const void *)&g->beta : (const void *)&beta_f;

  /* cuBLASLt's view (column-major): D (N, M) = op(b') (N, K) @ op(a') (K, M) */
  cublasOperation_t op_a = g->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = g->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  uint64_t a_rows = (uint64_t)(g->trans_b ? g->K : g->N), a_cols = (uint64_t)(g->trans_b ? g->N : g->K);
  uint64_t b_rows = (uint64_t)(g->trans_a ? g->M : g->K), b_cols = (uint64_t)(g->trans_a ? g->K : g->M);
  cublasLtEpilogue_t epilogue = epilogue_of(g->epilogue);

  int rc = 0;
  cublasLtMatmulDesc_t desc = NULL;
  cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
  cublasLtMatmulPreference_t pref = NULL;
  if (g->batch > INT32_MAX) return lt_errorf("%s: gemm batch of %lld is too large", op, (long long)g->batch);
  int32_t batch = (int32_t)g->batch;
  gemm_key key;
  memset(&key, 0, sizeof key);
  key = (gemm_key){g->device,
                   g->dtype,
                   g->out_dtype,
                   g->M,
                   g->N,
                   g->K,
                   g->batch,
                   g->lda,
                   g->ldb,
                   g->ldc,
                   g->stride_a,
                   g->stride_b,
                   g->stride_c,
                   g->trans_a,
                   g->trans_b,
                   g->epilogue,
                   g->tf32,
                   alignment_of(g->a),
                   alignment_of(g->b),
                   alignment_of(g->c),
                   g->bias ? alignment_of(g->bias) : 0};
  cublasLtMatmulAlgo_t algo;

  LT_BLAS_TRY(op, g->device, cublasLtMatmulDescCreate(&desc, compute, scale_type));
  LT_BLAS_TRY(op, g->device, cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a));
  LT_BLAS_TRY(op, g->device, cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b));
  if (epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
    LT_BLAS_TRY(op, g->device,
                cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue));
    if (g->bias) {
      LT_BLAS_TRY(op, g->device,
                  cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g->bias, sizeof g->bias));
      LT_BLAS_TRY(op, g->device,
                  cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &c_type, sizeof c_type));
    }
  }
  LT_BLAS_TRY(op, g->device, cublasLtMatrixLayoutCreate(&la, ab_type, a_rows, a_cols, g->ldb));
  LT_BLAS_TRY(op, g->device, cublasLtMatrixLayoutCreate(&lb, ab_type, b_rows, b_cols, g->lda));
  LT_BLAS_TRY(op, g->device, cublasLtMatrixLayoutCreate(&lc, c_type, (uint64_t)g->N, (uint64_t)g->M, g->ldc));
  if (batch > 1) {
    cublasLtMatrixLayout_t layouts[3] = {la, lb, lc};
    int64_t strides[3] = {g->stride_b, g->stride_a, g->stride_c};
    for (int i = 0; i < 3; i++) {
      LT_BLAS_TRY(
          op, g->device,
          cublasLtMatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof batch));
      LT_BLAS_TRY(op, g->device,
                  cublasLtMatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &strides[i],
                                                   sizeof strides[i]));
    }
  }

  if (!cache_find(&key, &algo)) {
    uint64_t ws = GEMM_WORKSPACE_BYTES;
    uint32_t align_a = (uint32_t)key.align_b, align_b = (uint32_t)key.align_a, align_c = (uint32_t)key.align_c;
    LT_BLAS_TRY(op, g->device, cublasLtMatmulPreferenceCreate(&pref));
    LT_BLAS_TRY(op, g->device,
                cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    LT_BLAS_TRY(op, g->device,
                cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a,
                                                     sizeof align_a));
    LT_BLAS_TRY(op, g->device,
                cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b,
                                                     sizeof align_b));
    LT_BLAS_TRY(op, g->device,
                cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c,
                                                     sizeof align_c));
    LT_BLAS_TRY(op, g->device,
                cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c,
                                                     sizeof align_c));
    cublasLtMatmulHeuristicResult_t result;
    int found = 0;
    memset(&result, 0, sizeof result);
    LT_BLAS_TRY(op, g->device, cublasLtMatmulAlgoGetHeuristic(handle, desc, la, lb, lc, lc, pref, 1, &result, &found));
    if (found < 1) {
      rc =
          lt_errorf("%s: cuBLASLt has no algorithm for %s (M=%lld N=%lld K=%lld, batch %lld, lds %lld/%lld/%lld, "
                    "epilogue %d) on cuda:%d",
                    op, lt_dtype_name(g->dtype), (long long)g->M, (long long)g->N, (long long)g->K, (long long)g->batch,
                    (long long)g->lda, (long long)g->ldb, (long long)g->ldc, g->epilogue, g->device);
      goto done;
    }
    algo = result.algo;
    cache_put(&key, &algo);
  }
  LT_BLAS_TRY(op, g->device,
              cublasLtMatmul(handle, desc, alpha, g->b, la, g->a, lb, beta, g->c, lc, g->c, lc, &algo, workspace,
                             GEMM_WORKSPACE_BYTES, lt_cuda_compute_stream(g->device)));
  rc = lt_cuda_check_launch(op, g->device);
done:
  if (pref) cublasLtMatmulPreferenceDestroy(pref);
  if (lc) cublasLtMatrixLayoutDestroy(lc);
  if (lb) cublasLtMatrixLayoutDestroy(lb);
  if (la) cublasLtMatrixLayoutDestroy(la);
  if (desc) cublasLtMatmulDescDestroy(desc);
  return rc;
}

/* ---- linear layers ------------------------------------------------------------------------------ */

static int check_cuda_operand(const char *op, const char *what, const lt_tensor *t, int device) {
  LT_TRY(lt_check_defined(op, what, t));
  char d1[16], d2[16];
  if (t->device != device)
    return lt_errorf("%s: %s is on %s, expected %s", op, what, lt_device_str(d1, t->device), lt_device_str(d2, device));
  if (!lt_is_contiguous(t)) return lt_errorf("%s: %s must be contiguous on cuda", op, what);
  return 0;
}

/* out's dtype: out's own when defined (x's dtype, or f32 for 16-bit x), else x's. */
static int out_dtype_for(const char *op, const lt_tensor *out, const lt_tensor *x, int *dtype) {
  *dtype = x->dtype;
  if (!lt_is_defined(out)) return 0;
  bool half = x->dtype == LT_BF16 || x->dtype == LT_F16;
  if (out->dtype == x->dtype || (half && out->dtype == LT_F32)) return *dtype = out->dtype, 0;
  return lt_errorf("%s: out is %s, expected %s%s", op, lt_dtype_name(out->dtype), lt_dtype_name(x->dtype),
                   half ? " or f32" : "");
}

// x is (..., K), w is (N, K), bias is (N), out is (..., N)
int lt_cuda_linear_forward(lt_tensor *out, const lt_tensor *x, const lt_tensor *w, const lt_tensor *bias, int act) {
  const char *op = "linear";
  LT_TRY(lt_check_defined(op, "x", x));
  LT_TRY(check_cuda_operand(op, "x", x, x->device));
  LT_TRY(check_cuda_operand(op, "w", w, x->device));
  LT_TRY(lt_check_same_dtype(op, x, w));
  char sx[LT_SHAPE_STR], sw[LT_SHAPE_STR];
  if (x->ndim < 1 || w->ndim != 2 || w->shape[1] != x->shape[x->ndim - 1])
    return lt_errorf("%s: needs x (..., K) and w (N, K), got %s and %s", op, lt_shape_str(sx, x->ndim, x->shape),
                     lt_shape_str(sw, w->ndim, w->shape));
  if (act != 0 && act != 1) return lt_errorf("%s: act must be 0 (none) or 1 (gelu), got %d", op, act);
  int64_t N = w->shape[0], K = w->shape[1], M = K ? lt_numel(x) / K : 0, shape[LT_MAX_DIMS];
  if (K == 0) M = lt_shape_numel(x->ndim - 1, x->shape);
  int dtype;
  LT_TRY(out_dtype_for(op, out, x, &dtype));
  bool has_bias = bias && lt_is_defined(bias);
  if (has_bias) {
    LT_TRY(check_cuda_operand(op, "bias", bias, x->device));
    if (bias->ndim != 1 || bias->shape[0] != N || bias->dtype != dtype)
      return lt_errorf("%s: bias must be (%lld) %s, got %s %s", op, (long long)N, lt_dtype_name(dtype),
                       lt_shape_str(sx, bias->ndim, bias->shape), lt_dtype_name(bias->dtype));
  }
  memcpy(shape, x->shape, sizeof(int64_t) * (size_t)x->ndim);
  shape[x->ndim - 1] = N;
  LT_TRY(lt_prepare_out(op, out, x->ndim, shape, dtype, x->device));
  if (!lt_is_contiguous(out)) return lt_errorf("%s: out must be contiguous on cuda", op);
  if (M * N == 0) return 0;
  if (K == 0) return lt_errorf("%s: K == 0 is not supported on cuda", op);
  lt_cuda_gemm_args g;
  memset(&g, 0, sizeof g);
  g.device = x->device, g.dtype = x->dtype, g.out_dtype = dtype;
  g.M = M, g.N = N, g.K = K, g.batch = 1;
  g.a = lt_data_ptr(x), g.lda = K;                /* x (M, K) */
  g.b = lt_data_ptr(w), g.ldb = K, g.trans_b = 1; /* w (N, K) read as w^T (K, N) */
  g.c = lt_data_ptr(out), g.ldc = N;
  g.alpha = 1, g.beta = 0;
  g.epilogue =
      has_bias ? (act ? LT_GEMM_EPI_GELU_BIAS : LT_GEMM_EPI_BIAS) : (act ? LT_GEMM_EPI_GELU : LT_GEMM_EPI_NONE);
  g.bias = has_bias ? lt_data_ptr(bias) : NULL;
  g.tf32 = lt_cuda_get_tf32();
  return lt_cuda_gemm(op, &g);
}

// dy is (..., N), x is (..., K), dw is (N, K), dbias is (N)
int lt_cuda_linear_backward_params(lt_tensor *dw, lt_tensor *dbias, const lt_tensor *dy, const lt_tensor *x) {
  const char *op = "linear_backward";
  LT_TRY(lt_check_defined(op, "dy", dy));
  LT_TRY(check_cuda_operand(op, "dy", dy, dy->device));
  LT_TRY(check_cuda_operand(op, "x", x, dy->device));
  LT_TRY(lt_check_same_dtype(op, dy, x));
  char sa[LT_SHAPE_STR], sb[LT_SHAPE_STR];
  if (dy->ndim < 1 || x->ndim != dy->ndim ||
      lt_shape_numel(dy->ndim - 1, dy->shape) != lt_shape_numel(x->ndim - 1, x->shape))
    return lt_errorf("%s: dy (..., N) and x (..., K) need the same leading dims, got %s and %s", op,
                     lt_shape_str(sa, dy->ndim, dy->shape), lt_shape_str(sb, x->ndim, x->shape));
  int64_t N = dy->shape[dy->ndim - 1], K = x->shape[x->ndim - 1], rows = lt_shape_numel(x->ndim - 1, x->shape);
  int dtype;
  LT_TRY(out_dtype_for(op, dw, x, &dtype));
  int64_t wshape[2] = {N, K};
  LT_TRY(lt_prepare_out(op, dw, 2, wshape, dtype, dy->device));
  if (!lt_is_contiguous(dw)) return lt_errorf("%s: dw must be contiguous on cuda", op);
  if (dbias) LT_TRY(lt_prepare_out(op, dbias, 1, &N, dtype, dy->device));
  if (dbias && !lt_is_contiguous(dbias)) return lt_errorf("%s: dbias must be contiguous on cuda", op);
  if (N * K == 0) return 0;
  if (rows == 0) return lt_errorf("%s: no rows (an empty batch) is not supported on cuda", op);
  lt_cuda_gemm_args g;
  memset(&g, 0, sizeof g);
  g.device = dy->device, g.dtype = x->dtype, g.out_dtype = dtype;
  g.M = N, g.N = K, g.K = rows, g.batch = 1;
  g.a = lt_data_ptr(dy), g.lda = N, g.trans_a = 1; /* dy (rows, N) read as dy^T (N, rows) */
  g.b = lt_data_ptr(x), g.ldb = K;                 /* x (rows, K) */
  g.c = lt_data_ptr(dw), g.ldc = K;
  g.alpha = 1, g.beta = 0;
  g.epilogue = dbias ? LT_GEMM_EPI_BGRAD_A : LT_GEMM_EPI_NONE;
  g.bias = dbias ? lt_data_ptr(dbias) : NULL;
  g.tf32 = lt_cuda_get_tf32();
  return lt_cuda_gemm(op, &g);
}

/* ---- strided gather/scatter for operands cuBLASLt cannot read as they lie ------------------------ */

struct dims_arg { /* passed by value to the kernel */
  int64_t v[LT_MAX_DIMS];
};

template <typename T>
__global__ void strided_copy_kernel(T *dst, const T *src, int64_t n, int ndim, dims_arg shape, dims_arg dst_stride,
                                    dims_arg src_stride) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t rest = i, od = 0, os = 0;
    for (int d = ndim - 1; d >= 0; d--) {
      int64_t k = rest % shape.v[d];
      rest /= shape.v[d];
      od += k * dst_stride.v[d];
      os += k * src_stride.v[d];
    }
    dst[od] = src[os];
  }
}

/* dst[...] = src[...] elementwise over shape, each with its own element strides (same dtype). */
int lt_cuda_strided_copy(int device, void *dst, const int64_t *dst_stride, const void *src, const int64_t *src_stride,
                         int ndim, const int64_t *shape, int dtype) {
  if (ndim < 0 || ndim > LT_MAX_DIMS) return lt_errorf("strided_copy: %d dims", ndim);
  int64_t n = lt_shape_numel(ndim, shape);
  if (n == 0) return 0;
  LT_TRY(lt_cuda_use_device("strided_copy", device));
  dims_arg sh, ds, ss;
  for (int d = 0; d < LT_MAX_DIMS; d++) {
    sh.v[d] = d < ndim ? shape[d] : 1;
    ds.v[d] = d < ndim ? dst_stride[d] : 0;
    ss.v[d] = d < ndim ? src_stride[d] : 0;
  }
  int blocks = lt_cuda_blocks(device, n);
  switch (lt_dtype_size(dtype)) {
  case 1:
    strided_copy_kernel<uint8_t><<<blocks, LT_CUDA_THREADS, 0, lt_cuda_compute_stream(device)>>>(
        (uint8_t *)dst, (const uint8_t *)src, n, ndim, sh, ds, ss);
    break;
  case 2:
    strided_copy_kernel<uint16_t>
        <<<blocks, LT_CUDA_THREADS, 0, lt_cuda_compute_stream(device)>>>((uint16_t *)dst, (const uint16_t *)src, n, ndim, sh, ds, ss);
    break;
  case 4:
    strided_copy_kernel<uint32_t>
        <<<blocks, LT_CUDA_THREADS, 0, lt_cuda_compute_stream(device)>>>((uint32_t *)dst, (const uint32_t *)src, n, ndim, sh, ds, ss);
    break;
  case 8:
    strided_copy_kernel<uint64_t>
        <<<blocks, LT_CUDA_THREADS, 0, lt_cuda_compute_stream(device)>>>((uint64_t *)dst, (const uint64_t *)src, n, ndim, sh, ds, ss);
    break;
  default: return lt_errorf("strided_copy: dtype %s is not supported", lt_dtype_name(dtype));
  }
  return lt_cuda_check_launch("strided_copy", device);
}

/* ---- the benchmark's reference --------------------------------------------------------------------- */

int lt_cuda_bench_cublas_gemm(int device, int dtype, int n, const void *a, const void *b, void *c, int iters, int tf32,
                              double *seconds) {
  const char *op = "bench_cublas_gemm";
  cudaDataType_t type;
  if (!cuda_type_of(dtype, &type) || dtype == LT_F64)
    return lt_errorf("%s: dtype %s is not one of f32, bf16, f16", op, lt_dtype_name(dtype));
  if (n <= 0 || iters <= 0 || !a || !b || !c || !seconds) return lt_errorf("%s: bad arguments", op);
  LT_TRY(lt_cuda_use_device(op, device));
  if (device >= GEMM_MAX_DEVICES) return lt_errorf("%s: device cuda:%d is out of range", op, device);
  int rc = 0;
  cudaEvent_t start = NULL, stop = NULL;
  float ms = 0, one = 1, zero = 0;
  cublasComputeType_t compute = dtype == LT_F32 && tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  pthread_mutex_lock(&gemm_lock);
  cublasStatus_t cst = blas_handles[device] ? CUBLAS_STATUS_SUCCESS : cublasCreate(&blas_handles[device]);
  pthread_mutex_unlock(&gemm_lock);
  if (cst != CUBLAS_STATUS_SUCCESS) return blas_error(op, device, "cublasCreate", cst);
  cublasHandle_t h = blas_handles[device];
  cudaStream_t stream = lt_cuda_compute_stream(device); /* where our own GEMMs run */
  if ((cst = cublasSetStream(h, stream)) != CUBLAS_STATUS_SUCCESS) return blas_error(op, device, "cublasSetStream", cst);
  for (int i = 0; i < iters + 3; i++) {
    if (i == 3 && (cudaEventCreate(&start) != cudaSuccess || cudaEventCreate(&stop) != cudaSuccess ||
                   cudaEventRecord(start, stream) != cudaSuccess)) {
      rc = lt_cuda_error(op, device, cudaGetLastError());
      goto done;
    }
    LT_BLAS_TRY(op, device,
                cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, b, type, n, a, type, n, &zero, c, type, n,
                             compute, CUBLAS_GEMM_DEFAULT));
  }
  if (cudaEventRecord(stop, stream) != cudaSuccess || cudaEventSynchronize(stop) != cudaSuccess ||
      cudaEventElapsedTime(&ms, start, stop) != cudaSuccess) {
    rc = lt_cuda_error(op, device, cudaGetLastError());
    goto done;
  }
  *seconds = (double)ms / 1000.0 / iters;
done:
  if (start) cudaEventDestroy(start);
  if (stop) cudaEventDestroy(stop);
  return rc;
}
