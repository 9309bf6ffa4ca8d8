/* matmul.c — out = alpha * op(a) @ op(b) + beta * out through OpenBLAS (sgemm, dgemm).
 *
 * a (..., M, K) and b (..., K, N) (before op), batch dims broadcast, out (..., M, N).
 * Each matrix goes to BLAS as it lies when its last two dims are row- or column-major
 * (a column-major matrix is the row-major transpose: its trans flag flips); other layouts
 * are copied to contiguous first. bf16/f16 go through f32 scratch and round back. */
#include "ops/backend.h"
#include <cblas.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#ifdef _OPENMP
#include <omp.h>
#endif

void openblas_set_num_threads(int n);

/* BLAS sees a (rows, cols) matrix with element strides (rs, cs) as row-major with leading
 * dim *ld, or, when *transposed, as the row-major (cols, rows) matrix of its transpose. */
static bool blas_layout(int64_t rows, int64_t cols, int64_t rs, int64_t cs, int64_t *ld, bool *transposed) {
  if ((cols == 1 || cs == 1) && (rows == 1 || rs >= cols)) {
    *ld = rows == 1 ? cols : rs;
    *transposed = false;
  } else if ((rows == 1 || rs == 1) && (cols == 1 || cs >= rows)) {
    *ld = cols == 1 ? rows : cs;
    *transposed = true;
  } else {
    return false;
  }
  if (*ld < 1) *ld = 1;
  return *ld <= INT_MAX;
}

/* One operand as BLAS reads it: base pointer, per-batch element strides, ld, transposed. */
typedef struct gemm_operand {
  const lt_tensor *t; /* a, b, out, or a contiguous / f32 stand-in for it */
  int64_t batch_stride[LT_MAX_DIMS];
  int64_t ld;
  bool transposed;
} gemm_operand;

static bool operand_layout(gemm_operand *g, const lt_tensor *t, int nb, const int64_t *bshape) {
  int tb = t->ndim - 2;
  for (int i = 0; i < nb; i++) {
    int d = tb - nb + i;
    g->batch_stride[i] = (d < 0 || (t->shape[d] == 1 && bshape[i] != 1)) ? 0 : t->stride[d];
  }
  g->t = t;
  return blas_layout(t->shape[tb], t->shape[tb + 1], t->stride[tb], t->stride[tb + 1], &g->ld, &g->transposed);
}

/* A fresh contiguous tensor holding t converted to dtype (CPU tensors only). */
static lt_tensor *contiguous_as(const lt_tensor *t, int dtype) {
  lt_tensor *c = lt_tensor_new();
  if (!c || lt_empty(c, t->ndim, t->shape, dtype, LT_DEVICE_CPU) || lt_copy(c, t)) {
    lt_release(c);
    return NULL;
  }
  return c;
}

/* The batch dims and the M rows of an operand that BLAS reads untransposed fold into one
 * row dim of stride ld (x (B, T, C) @ w (C, N) is one (B*T, C) @ (C, N) gemm). */
static bool rows_fold(const gemm_operand *g, int nb, const int64_t *bshape, int64_t rows) {
  int64_t want = g->ld * rows;
  for (int i = nb - 1; i >= 0; i--) {
    if (bshape[i] != 1 && g->batch_stride[i] != want) return false;
    want *= bshape[i];
  }
  return true;
}

typedef struct gemm_plan {
  bool f64;
  int ta, tb; /* BLAS trans flags after layout flips */
  int64_t M, N, K, nbatch;
  int nb;
  const int64_t *bshape;
  gemm_operand A, B, C;
  double alpha, beta;
} gemm_plan;

/* C's block of rows [m0, m0 + m) and columns [n0, n0 + n) of gemm `batch`. */
static void gemm_block(const gemm_plan *p, int64_t batch, int64_t m0, int64_t m, int64_t n0, int64_t n) {
  int64_t oa = lt_offset_of(batch, p->nb, p->bshape, p->A.batch_stride) + (p->ta ? m0 : m0 * p->A.ld);
  int64_t ob = lt_offset_of(batch, p->nb, p->bshape, p->B.batch_stride) + (p->tb ? n0 * p->B.ld : n0);
  int64_t oc = lt_offset_of(batch, p->nb, p->bshape, p->C.batch_stride) + m0 * p->C.ld + n0;
  enum CBLAS_TRANSPOSE ta = p->ta ? CblasTrans : CblasNoTrans, tb = p->tb ? CblasTrans : CblasNoTrans;
  if (p->f64) {
    const double *a = (const double *)lt_data_ptr(p->A.t) + oa, *b = (const double *)lt_data_ptr(p->B.t) + ob;
    cblas_dgemm(CblasRowMajor, ta, tb, (int)m, (int)n, (int)p->K, p->alpha, a, (int)p->A.ld, b, (int)p->B.ld, p->beta,
                (double *)lt_data_ptr(p->C.t) + oc, (int)p->C.ld);
  } else {
    const float *a = (const float *)lt_data_ptr(p->A.t) + oa, *b = (const float *)lt_data_ptr(p->B.t) + ob;
    cblas_sgemm(CblasRowMajor, ta, tb, (int)m, (int)n, (int)p->K, (float)p->alpha, a, (int)p->A.ld, b, (int)p->B.ld,
                (float)p->beta, (float *)lt_data_ptr(p->C.t) + oc, (int)p->C.ld);
  }
}

/* Threads. OpenBLAS (the pthreads build) keeps a thread pool of its own, whose idle workers
 * spin on sched_yield while the OpenMP workers spin waiting for the next parallel region:
 * on 2 cores the two pools took half of the cycles of a training step. So BLAS runs on
 * one thread (set at the first gemm, and by lt_set_num_threads), and a gemm big enough for
 * threads (OpenBLAS's own threshold) is cut here into one block of C per OpenMP thread.
 * Only very large gemms whose every dim is large get OpenBLAS's threads for the call; the
 * lutra executable sets OPENBLAS_THREAD_TIMEOUT low so that those workers sleep right after
 * (host/app/thread_env.c). OpenBLAS's split packs each panel once, which pays when all three
 * dims are large (1024^3: ~4% faster); but its threads wait for each other at every panel
 * (spinning on sched_yield), so a thin gemm (a dim of a few hundred: the layers of a small
 * transformer, (B*T, 256) @ (256, 1024)) stalls whenever one thread loses its core to another
 * process. Cut into independent blocks, the GPT-2 step of bench/gpt_step.lua (d256) took ~4%
 * less CPU time and ran ~20% faster on a busy 2-core machine. */
#define GEMM_PAR_MNK 262144.0
#define GEMM_BLAS_THREADS_MNK 1e8
#define GEMM_BLAS_THREADS_MIN_DIM 1024

static int gemm_threads(double mnk) {
#ifdef _OPENMP
  static int blas_single = 0;
  if (!blas_single) {
    openblas_set_num_threads(1);
    blas_single = 1;
  }
  if (mnk >= GEMM_PAR_MNK && !omp_in_parallel()) return omp_get_max_threads();
#else
  (void)mnk;
#endif
  return 1;
}

/* Gemm `batch` with m rows of C, cut over nt threads along M or N (the longer one). */
static void gemm_one(const gemm_plan *p, int64_t batch, int64_t m) {
  double mnk = (double)m * (double)p->N * (double)p->K;
  int nt = gemm_threads(mnk);
  if (nt <= 1) return gemm_block(p, batch, 0, m, 0, p->N);
  if (mnk >= GEMM_BLAS_THREADS_MNK && m >= GEMM_BLAS_THREADS_MIN_DIM && p->N >= GEMM_BLAS_THREADS_MIN_DIM &&
      p->K >= GEMM_BLAS_THREADS_MIN_DIM) {
    openblas_set_num_threads(nt);
    gemm_block(p, batch, 0, m, 0, p->N);
    openblas_set_num_threads(1);
    return;
  }
  bool by_rows = m >= p->N;
  int64_t len = by_rows ? m : p->N, align = by_rows ? 16 : 8;
  int64_t chunk = ((len + nt - 1) / nt + align - 1) / align * align;
  int nchunks = (int)((len + chunk - 1) / chunk);
#pragma omp parallel for schedule(static) num_threads(nt)
  for (int c = 0; c < nchunks; c++) {
    int64_t s = c * chunk, n = len - s < chunk ? len - s : chunk;
    if (by_rows)
      gemm_block(p, batch, s, n, 0, p->N);
    else
      gemm_block(p, batch, 0, m, s, n);
  }
}

static void run_gemms(const gemm_plan *p) {
  if (p->nbatch > 1 && rows_fold(&p->A, p->nb, p->bshape, p->M) && !p->ta && rows_fold(&p->C, p->nb, p->bshape, p->M) &&
      p->M * p->nbatch <= INT_MAX) {
    bool b_shared = true;
    for (int i = 0; i < p->nb; i++) b_shared &= p->B.batch_stride[i] == 0;
    if (b_shared) return gemm_one(p, 0, p->M * p->nbatch);
  }
  /* many gemms, each too small for threads: the threads share out the batch */
  double mnk = (double)p->M * (double)p->N * (double)p->K;
  int nt = mnk < GEMM_PAR_MNK ? gemm_threads(mnk * (double)p->nbatch) : 1;
  if (nt > 1 && p->nbatch >= nt) {
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t i = 0; i < p->nbatch; i++) gemm_block(p, i, 0, p->M, 0, p->N);
    return;
  }
  for (int64_t i = 0; i < p->nbatch; i++) gemm_one(p, i, p->M);
}

/* out *= beta (or = 0), for K == 0 where BLAS is not called. */
static void scale_out(lt_tensor *out, double beta) {
  char *base = lt_data_ptr(out);
  for (int64_t i = 0, n = lt_numel(out); i < n; i++) {
    int64_t off = lt_offset_of(i, out->ndim, out->shape, out->stride);
    lt_store_f64(base, out->dtype, off, beta == 0 ? 0 : beta * lt_load_f64(base, out->dtype, off));
  }
}

static bool shares_storage(const lt_tensor *x, const lt_tensor *y) { return x->storage == y->storage; }

/* ---- CUDA tensors: the same plan, run by kernels/matmul.cu ------------------------------ */

static int tf32_enabled; /* lt_cuda_set_tf32; off by default, as in PyTorch */

int lt_cuda_set_tf32(int enabled) {
  tf32_enabled = enabled != 0;
  return 0;
}
int lt_cuda_get_tf32(void) { return tf32_enabled; }

/* A fresh contiguous tensor on t's device holding t (or a copy of t's layout when !fill). */
static lt_tensor *cuda_contiguous(const lt_backend *be, const lt_tensor *t, bool fill) {
  lt_tensor *c = lt_tensor_new();
  int64_t stride[LT_MAX_DIMS];
  if (!c || lt_empty(c, t->ndim, t->shape, t->dtype, t->device)) return lt_release(c), NULL;
  lt_contiguous_strides(t->ndim, t->shape, stride);
  if (fill &&
      be->strided_copy(t->device, lt_data_ptr(c), stride, lt_data_ptr(t), t->stride, t->ndim, t->shape, t->dtype))
    return lt_release(c), NULL;
  return c;
}

/* The single element stride between consecutive batches of an operand, when there is one. */
static bool uniform_batch_stride(const gemm_operand *g, int nb, const int64_t *bshape, int64_t nbatch, int64_t *s) {
  *s = nbatch > 1 ? lt_offset_of(1, nb, bshape, g->batch_stride) : 0;
  int64_t want = *s;
  for (int i = nb - 1; i >= 0; i--) {
    if (bshape[i] != 1 && g->batch_stride[i] != want) return false;
    want *= bshape[i];
  }
  return true;
}

static int cuda_run_gemms(const lt_backend *be, const gemm_plan *p, int dtype) {
  char *a = lt_data_ptr(p->A.t), *b = lt_data_ptr(p->B.t), *c = lt_data_ptr(p->C.t);
  int64_t esize = lt_dtype_size(dtype);
  lt_cuda_gemm_args g = {.device = p->C.t->device,
                         .dtype = dtype,
                         .out_dtype = dtype,
                         .M = p->M,
                         .N = p->N,
                         .K = p->K,
                         .batch = 1,
                         .a = a,
                         .lda = p->A.ld,
                         .trans_a = p->ta,
                         .b = b,
                         .ldb = p->B.ld,
                         .trans_b = p->tb,
                         .c = c,
                         .ldc = p->C.ld,
                         .alpha = p->alpha,
                         .beta = p->beta,
                         .tf32 = tf32_enabled};
  if (p->nbatch == 1) return be->gemm("matmul", &g);
  /* x (B, T, C) @ w (C, N): one (B*T, C) @ (C, N) gemm */
  bool b_shared = true;
  for (int i = 0; i < p->nb; i++) b_shared &= p->B.batch_stride[i] == 0;
  if (b_shared && !p->ta && rows_fold(&p->A, p->nb, p->bshape, p->M) && rows_fold(&p->C, p->nb, p->bshape, p->M)) {
    g.M = p->M * p->nbatch;
    return be->gemm("matmul", &g);
  }
  if (uniform_batch_stride(&p->A, p->nb, p->bshape, p->nbatch, &g.stride_a) &&
      uniform_batch_stride(&p->B, p->nb, p->bshape, p->nbatch, &g.stride_b) &&
      uniform_batch_stride(&p->C, p->nb, p->bshape, p->nbatch, &g.stride_c) && p->nbatch <= INT_MAX) {
    g.batch = p->nbatch;
    return be->gemm("matmul", &g);
  }
  for (int64_t i = 0; i < p->nbatch; i++) { /* batch dims that do not collapse to one stride */
    g.a = a + esize * lt_offset_of(i, p->nb, p->bshape, p->A.batch_stride);
    g.b = b + esize * lt_offset_of(i, p->nb, p->bshape, p->B.batch_stride);
    g.c = c + esize * lt_offset_of(i, p->nb, p->bshape, p->C.batch_stride);
    LT_TRY(be->gemm("matmul", &g));
  }
  return 0;
}

/* As the CPU path: operands that cuBLASLt cannot read as they lie are gathered to contiguous
 * first, and a result that cannot be written in place (transposed, strided, overlapping an
 * input) goes through a scratch that is scattered back. 16-bit dtypes need no f32 copies:
 * cuBLASLt reads them and accumulates in f32. */
static int cuda_matmul(const lt_backend *be, gemm_plan *p, lt_tensor *out, const lt_tensor *a, const lt_tensor *b,
                       int trans_a, int trans_b) {
  if (p->K == 0) { /* an empty sum: out = beta * out */
    if (p->beta == 0) return lt_fill(out, 0);
    return p->beta == 1 ? 0 : lt_binary_scalar(out, out, p->beta, LT_MUL, 0);
  }
  int rc = -1;
  lt_tensor *ta = NULL, *tb = NULL, *tc = NULL;
  if (!operand_layout(&p->A, a, p->nb, p->bshape)) {
    if (!(ta = cuda_contiguous(be, a, true))) goto done;
    operand_layout(&p->A, ta, p->nb, p->bshape);
  }
  if (!operand_layout(&p->B, b, p->nb, p->bshape)) {
    if (!(tb = cuda_contiguous(be, b, true))) goto done;
    operand_layout(&p->B, tb, p->nb, p->bshape);
  }
  if (!operand_layout(&p->C, out, p->nb, p->bshape) || p->C.transposed || shares_storage(out, a) ||
      shares_storage(out, b)) {
    if (!(tc = cuda_contiguous(be, out, p->beta != 0))) goto done;
    operand_layout(&p->C, tc, p->nb, p->bshape);
  }
  p->ta = trans_a ^ p->A.transposed;
  p->tb = trans_b ^ p->B.transposed;
  rc = cuda_run_gemms(be, p, a->dtype);
  if (rc == 0 && tc) {
    int64_t stride[LT_MAX_DIMS];
    lt_contiguous_strides(tc->ndim, tc->shape, stride);
    rc = be->strided_copy(out->device, lt_data_ptr(out), out->stride, lt_data_ptr(tc), stride, out->ndim, out->shape,
                          out->dtype);
  }
done:
  lt_release(ta), lt_release(tb), lt_release(tc);
  return rc;
}

static int check_args(lt_tensor *out, const lt_tensor *a, const lt_tensor *b, int trans_a, int trans_b, double beta,
                      int64_t *M, int64_t *N, int64_t *K, int *nb, int64_t *bshape) {
  LT_TRY(lt_check_defined("matmul", "a", a));
  LT_TRY(lt_check_defined("matmul", "b", b));
  if (a->device != b->device) return lt_check_same_device("matmul", a, b);
  if (!lt_backend_lookup("matmul", a->device, "%s: not implemented on cuda yet (lutra was built without CUDA)", true))
    return -1;
  LT_TRY(lt_check_same_dtype("matmul", a, b));
  if (!lt_dtype_is_float(a->dtype))
    return lt_errorf("matmul: needs a floating dtype, got %s (convert first)", lt_dtype_name(a->dtype));
  char sa[LT_SHAPE_STR], sb[LT_SHAPE_STR];
  if (a->ndim < 2 || b->ndim < 2)
    return lt_errorf("matmul: needs at least 2 dims on each side, got %s @ %s", lt_shape_str(sa, a->ndim, a->shape),
                     lt_shape_str(sb, b->ndim, b->shape));
  int64_t a0 = a->shape[a->ndim - 2], a1 = a->shape[a->ndim - 1], b0 = b->shape[b->ndim - 2],
          b1 = b->shape[b->ndim - 1];
  *M = trans_a ? a1 : a0, *K = trans_a ? a0 : a1, *N = trans_b ? b0 : b1;
  if (*K != (trans_b ? b1 : b0))
    return lt_errorf("matmul: inner dims differ: %s%s @ %s%s", lt_shape_str(sa, a->ndim, a->shape), trans_a ? "^T" : "",
                     lt_shape_str(sb, b->ndim, b->shape), trans_b ? "^T" : "");
  if (*M > INT_MAX || *N > INT_MAX || *K > INT_MAX)
    return lt_errorf("matmul: matrix dims of %s @ %s exceed what BLAS takes", lt_shape_str(sa, a->ndim, a->shape),
                     lt_shape_str(sb, b->ndim, b->shape));
  if (lt_broadcast_shape(a->ndim - 2, a->shape, b->ndim - 2, b->shape, nb, bshape))
    return lt_errorf("matmul: batch dims of %s and %s do not broadcast", lt_shape_str(sa, a->ndim, a->shape),
                     lt_shape_str(sb, b->ndim, b->shape));
  if (beta != 0 && !lt_is_defined(out)) return lt_errorf("matmul: beta != 0 needs a defined out to accumulate into");
  return 0;
}

int lt_matmul(lt_tensor *out, const lt_tensor *a, const lt_tensor *b, int trans_a, int trans_b, double alpha,
              double beta) {
  int64_t M = 0, N = 0, K = 0, shape[LT_MAX_DIMS];
  int nb = 0;
  LT_TRY(check_args(out, a, b, trans_a, trans_b, beta, &M, &N, &K, &nb, shape));
  if (nb + 2 > LT_MAX_DIMS) return lt_errorf("matmul: result would have more than %d dims", LT_MAX_DIMS);
  shape[nb] = M, shape[nb + 1] = N;
  LT_TRY(lt_prepare_out("matmul", out, nb + 2, shape, a->dtype, a->device));
  int64_t nbatch = lt_shape_numel(nb, shape);
  if (nbatch * M * N == 0) return 0;
  if (a->device != LT_DEVICE_CPU) { /* check_args found the backend */
    gemm_plan p = {.M = M, .N = N, .K = K, .nbatch = nbatch, .nb = nb, .bshape = shape, .alpha = alpha, .beta = beta};
    return cuda_matmul(lt_backend_for("matmul", a->device), &p, out, a, b, trans_a, trans_b);
  }
  if (K == 0) return scale_out(out, beta), 0;

  /* stand-ins: f32 copies for 16-bit dtypes, contiguous copies for layouts BLAS cannot read,
   * and a scratch result when out cannot be written directly or overlaps an input */
  int rc = -1;
  bool half = a->dtype == LT_BF16 || a->dtype == LT_F16;
  int wdtype = half ? LT_F32 : a->dtype;
  lt_tensor *ta = NULL, *tb = NULL, *tc = NULL;
  gemm_plan p = {.f64 = a->dtype == LT_F64,
                 .M = M,
                 .N = N,
                 .K = K,
                 .nbatch = nbatch,
                 .nb = nb,
                 .bshape = shape,
                 .alpha = alpha,
                 .beta = beta};
  if (half || !operand_layout(&p.A, a, nb, shape)) {
    if (!(ta = contiguous_as(a, wdtype))) goto done;
    operand_layout(&p.A, ta, nb, shape);
  }
  if (half || !operand_layout(&p.B, b, nb, shape)) {
    if (!(tb = contiguous_as(b, wdtype))) goto done;
    operand_layout(&p.B, tb, nb, shape);
  }
  if (half || !operand_layout(&p.C, out, nb, shape) || p.C.transposed || shares_storage(out, a) ||
      shares_storage(out, b)) {
    if (!(tc = lt_tensor_new()) || lt_empty(tc, out->ndim, out->shape, wdtype, LT_DEVICE_CPU)) goto done;
    if (beta != 0 && lt_copy(tc, out)) goto done;
    operand_layout(&p.C, tc, nb, shape);
  }
  p.ta = trans_a ^ p.A.transposed;
  p.tb = trans_b ^ p.B.transposed;
  run_gemms(&p);
  rc = tc ? lt_copy(out, tc) : 0;
done:
  if (rc) {
    char why[256];
    snprintf(why, sizeof why, "%s", lt_last_error());
    lt_errorf("matmul: %s", why);
  }
  lt_release(ta), lt_release(tb), lt_release(tc);
  return rc;
}
