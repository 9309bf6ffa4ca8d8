/* cross_entropy.c — fused softmax cross-entropy on the CPU, forward and backward.
 *
 * logits (N, V), targets (N) I32/I64. Forward saves lse (N) f32, the log-sum-exp of
 * each row, so that backward forms softmax = exp(logit - lse) on the fly and never
 * stores probabilities. f32/bf16/f16 rows compute in f32 (16-bit rows converted to
 * scratch), f64 rows in f64. */
#include "core/internal.h"
#include <stdio.h>
#include <stdlib.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* Let GCC if-convert float compares (the clamps in lt_exp_flush_f32) so the row loops vectorise;
 * nothing here reads floating-point exception flags. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif
#include "ops/device_tensors.h"
#include "ops/dtype_generic.h"
#include "ops/vecmath.h"

/* ---- row kernels ------------------------------------------------------------------- */

/* log(sum(exp(x))) of a row, stable: max first, then the sum of exp(x - max). */
#define DEFINE_ROW_LSE(T, S, EXP, LOG, SIMD)                                                                           \
  static T row_lse_##S(const T *x, int64_t V) {                                                                        \
    T mx = -INFINITY, s = 0;                                                                                           \
    SIMD(reduction(max : mx))                                                                                          \
    for (int64_t j = 0; j < V; j++) mx = x[j] > mx ? x[j] : mx;                                                        \
    if (isinf(mx)) return mx; /* all -inf (or a +inf logit): no finite normaliser */                                   \
    SIMD(reduction(+ : s))                                                                                             \
    for (int64_t j = 0; j < V; j++) s += EXP(x[j] - mx);                                                               \
    return mx + LOG(s);                                                                                                \
  }

/* dx = dl * (exp(x - lse) - onehot(t)); dx may alias x. */
#define DEFINE_ROW_GRAD(T, S, EXP, SIMD)                                                                               \
  static void row_grad_##S(T *dx, const T *x, int64_t V, T lse, T dl, int64_t t) {                                     \
    T xt = x[t];                                                                                                       \
    SIMD()                                                                                                             \
    for (int64_t j = 0; j < V; j++) dx[j] = dl * EXP(x[j] - lse);                                                      \
    dx[t] = dl * (EXP(xt - lse) - (T)1);                                                                               \
  }

/* f32 vectorised (ops/vecmath.h's exp); f64, the reference, in element order with libm's. */
DEFINE_ROW_LSE(float, f32, lt_exp_flush_f32, logf, LT_SIMD)
DEFINE_ROW_LSE(double, f64, exp, log, LT_IN_ORDER)
DEFINE_ROW_GRAD(float, f32, lt_exp_flush_f32, LT_SIMD)
DEFINE_ROW_GRAD(double, f64, exp, LT_IN_ORDER)

/* ---- helpers ----------------------------------------------------------------------- */

/* Checks logits (N, V) and targets (N): shapes, dtypes, one device. */
static int check_shapes(const char *op, const lt_tensor *logits, const lt_tensor *targets, int64_t *N, int64_t *V) {
  char d1[LT_DESC_STR], d2[LT_DESC_STR];
  LT_TRY(lt_check_defined(op, "logits", logits));
  LT_TRY(lt_check_defined(op, "targets", targets));
  LT_TRY(lt_check_same_device(op, logits, targets));
  if (logits->ndim != 2 || logits->shape[1] < 1 || !lt_dtype_is_float(logits->dtype))
    return lt_errorf("%s: logits is %s, expected (N, V) with V >= 1 and a floating dtype", op, lt_desc(d1, logits));
  *N = logits->shape[0], *V = logits->shape[1];
  if (targets->ndim != 1 || targets->shape[0] != *N || (targets->dtype != LT_I32 && targets->dtype != LT_I64))
    return lt_errorf("%s: targets is %s, expected [%lld] i32 or i64 for logits %s", op, lt_desc(d1, targets),
                     (long long)*N, lt_desc(d2, logits));
  return 0;
}

static int target_error(const char *op, int64_t t, int64_t V, int64_t row, int64_t ignore_index) {
  return lt_errorf("%s: target %lld out of range [0, %lld) at row %lld (ignore_index is %lld)", op, (long long)t,
                   (long long)V, (long long)row, (long long)ignore_index);
}

/* Reads CPU targets (N) into a new int64 array (NULL on
 * error); a target outside [0, V) that is not ignore_index is an error naming the row. */
static int64_t *read_targets(const char *op, const lt_tensor *targets, int64_t ignore_index, int64_t N, int64_t V) {
  int64_t *t = malloc((size_t)(N > 0 ? N : 1) * sizeof(int64_t));
  if (!t) {
    lt_errorf("%s: out of host memory", op);
    return NULL;
  }
  const void *tp = lt_data_ptr(targets);
  for (int64_t i = 0; i < N; i++) {
    t[i] = lt_load_i64(tp, targets->dtype, i * targets->stride[0]);
    if (t[i] != ignore_index && (t[i] < 0 || t[i] >= V)) {
      target_error(op, t[i], V, i, ignore_index);
      free(t);
      return NULL;
    }
  }
  return t;
}

/* ---- forward ----------------------------------------------------------------------- */

/* losses and lse are f32; for f64 logits a caller may pass them already defined as f64 to keep
 * full precision (gradient checks). */
static int row_dtype(const lt_tensor *logits, const lt_tensor *t) {
  return logits->dtype == LT_F64 && t->storage && t->dtype == LT_F64 ? LT_F64 : LT_F32;
}

/* What the forward rows read and write: logits xp (N, V), targets tgt (N), losses lp (N), lse sp (N) or NULL. */
typedef struct {
  int64_t N, V;
  int dtype;
  int64_t ignore_index;
  const int64_t *tgt;
  const void *xp;
  void *lp, *sp;
  int ldtype, sdtype;
} forward_job;

/* Rows [N tid / nthreads, N (tid + 1) / nthreads): each row alone, so any split gives the same
 * results. Returns 1 when out of memory for the 16-bit row scratch. */
static int forward_rows(void *job, int tid, int nthreads) {
  const forward_job *j = job;
  int64_t V = j->V, i0 = j->N * tid / nthreads, i1 = j->N * (tid + 1) / nthreads;
  bool half = j->dtype == LT_BF16 || j->dtype == LT_F16;
  float *scratch = half && i1 > i0 ? malloc((size_t)V * sizeof(float)) : NULL;
  if (half && i1 > i0 && !scratch) return 1;
  for (int64_t i = i0; i < i1; i++) {
    double s, xt;
    int64_t t = j->tgt[i];
    if (j->dtype == LT_F64) {
      const double *x = (const double *)j->xp + i * V;
      s = row_lse_f64(x, V);
      xt = t == j->ignore_index ? 0 : x[t];
    } else {
      const float *x = lt_load_row_f32(j->xp, j->dtype, i * V, V, scratch);
      s = row_lse_f32(x, V);
      xt = t == j->ignore_index ? 0 : x[t];
    }
    lt_store_f64(j->lp, j->ldtype, i, t == j->ignore_index ? 0.0 : s - xt);
    if (j->sp) lt_store_f64(j->sp, j->sdtype, i, s);
  }
  free(scratch);
  return 0;
}

/* ---- CUDA (kernels/cross_entropy.cu) ---------------------------------------------------------- */
/* The CPU's check of targets, run on the device (one flag read back). */
static int check_targets_cuda(const lt_backend *be, const char *op, const lt_tensor *targets, int64_t N, int64_t V,
                              int64_t ignore_index) {
  int64_t bad, id;
  LT_TRY(be->check_indices(op, targets->device, lt_data_ptr(targets), targets->dtype, targets->stride[0], N, V, 1,
                           ignore_index, &bad, &id));
  return bad >= 0 ? target_error(op, id, V, bad, ignore_index) : 0;
}

static int forward_cuda(const lt_backend *be, lt_tensor *losses, lt_tensor *lse, const lt_tensor *logits,
                        const lt_tensor *targets, int64_t ignore_index, int64_t N, int64_t V) {
  const char *op = "cross_entropy";
  int device = logits->device, rc = -1;
  int64_t nshape[1] = {N};
  LT_TRY(check_targets_cuda(be, op, targets, N, V, ignore_index));
  lt_tensor *xc = lt_nn_cuda_contiguous(logits), *lw = NULL, *sw = NULL;
  if (!xc) goto done;
  if (!(lw = lt_nn_cuda_out_begin(op, "losses", losses, 1, nshape, row_dtype(logits, losses), device))) goto done;
  if (lse && !(sw = lt_nn_cuda_out_begin(op, "lse", lse, 1, nshape, row_dtype(logits, lse), device))) goto done;
  rc = be->cross_entropy_forward(device, logits->dtype, lt_data_ptr(xc), N, V, lt_data_ptr(targets), targets->dtype,
                                 targets->stride[0], ignore_index, lt_data_ptr(lw), lw->dtype,
                                 sw ? lt_data_ptr(sw) : NULL, sw ? sw->dtype : LT_F32);
done:
  rc = lt_nn_cuda_out_finish(losses, lw, rc);
  if (lse) rc = lt_nn_cuda_out_finish(lse, sw, rc);
  lt_release(xc);
  return rc;
}

static int backward_cuda(const lt_backend *be, lt_tensor *dlogits, const lt_tensor *dlosses, const lt_tensor *logits,
                         const lt_tensor *targets, const lt_tensor *lse, int64_t ignore_index, int64_t N, int64_t V) {
  const char *op = "cross_entropy_backward";
  int device = logits->device, rc = -1, cdtype = logits->dtype == LT_F64 ? LT_F64 : LT_F32;
  LT_TRY(check_targets_cuda(be, op, targets, N, V, ignore_index));
  lt_tensor *xc = lt_nn_cuda_contiguous(logits), *gw = NULL;
  lt_tensor *dl = lt_nn_cuda_values(dlosses, cdtype), *ls = lt_nn_cuda_values(lse, cdtype);
  if (!xc || !dl || !ls) goto done;
  if (!(gw = lt_nn_cuda_out_begin(op, "dlogits", dlogits, 2, logits->shape, logits->dtype, device))) goto done;
  rc = be->cross_entropy_backward(device, logits->dtype, lt_data_ptr(gw), lt_data_ptr(xc), N, V, lt_data_ptr(targets),
                                  targets->dtype, targets->stride[0], ignore_index, lt_data_ptr(dl), lt_data_ptr(ls));
done:
  rc = lt_nn_cuda_out_finish(dlogits, gw, rc);
  lt_release(xc), lt_release(dl), lt_release(ls);
  return rc;
}

int lt_cross_entropy_forward(lt_tensor *losses, lt_tensor *lse, const lt_tensor *logits, const lt_tensor *targets,
                             int64_t ignore_index) {
  const char *op = "cross_entropy";
  int64_t N, V;
  LT_TRY(check_shapes(op, logits, targets, &N, &V));
  if (!losses) return lt_errorf("%s: losses is NULL", op);
  if (logits->device != LT_DEVICE_CPU) {
    const lt_backend *be = lt_backend_for(op, logits->device);
    return be ? forward_cuda(be, losses, lse, logits, targets, ignore_index, N, V) : -1;
  }
  int64_t *tgt = read_targets(op, targets, ignore_index, N, V);
  if (!tgt) return -1;
  int rc = -1, dtype = logits->dtype, failed = 0;
  int64_t nshape[1] = {N};
  lt_tensor *xc = lt_tensor_new(), *lw = NULL, *sw = NULL;
  if (!xc || lt_contiguous(xc, logits)) goto done;
  if (!(lw = lt_out_begin(op, "losses", losses, 1, nshape, row_dtype(logits, losses)))) goto done;
  if (lse && !(sw = lt_out_begin(op, "lse", lse, 1, nshape, row_dtype(logits, lse)))) goto done;
  const void *xp = lt_data_ptr(xc);
  void *lp = lt_data_ptr(lw), *sp = sw ? lt_data_ptr(sw) : NULL;
  forward_job job = {N, V, dtype, ignore_index, tgt, xp, lp, sp, lw->dtype, sw ? sw->dtype : 0};
  failed = lt_run_parts(forward_rows, &job, N * V >= LT_PAR_GRAIN && N > 1);
  rc = failed ? lt_errorf("%s: out of host memory", op) : 0;
done:
  rc = lt_out_finish(losses, lw, rc);
  if (lse) rc = lt_out_finish(lse, sw, rc);
  lt_release(xc);
  free(tgt);
  return rc;
}

/* ---- backward ---------------------------------------------------------------------- */

/* A per-row input (N) of any floating dtype on logits' device. */
static int check_row_input(const char *op, const char *what, const lt_tensor *t, int64_t N, const lt_tensor *logits) {
  char d[LT_DESC_STR];
  LT_TRY(lt_check_defined(op, what, t));
  LT_TRY(lt_check_same_device(op, logits, t));
  if (lt_numel(t) != N || !lt_dtype_is_float(t->dtype))
    return lt_errorf("%s: %s is %s, expected [%lld] floating (one per row of logits)", op, what, lt_desc(d, t),
                     (long long)N);
  return 0;
}

/* dlosses and lse for backward: lse is what forward saved (f32, or f64 for f64 logits). */
static int check_backward_rows(const char *op, const lt_tensor *dlosses, const lt_tensor *lse, int64_t N,
                               const lt_tensor *logits) {
  char d[LT_DESC_STR];
  LT_TRY(check_row_input(op, "dlosses", dlosses, N, logits));
  LT_TRY(lt_check_defined(op, "lse", lse));
  if (lse->dtype != LT_F32 && lse->dtype != LT_F64)
    return lt_errorf("%s: lse is %s, expected f32 [%lld]", op, lt_desc(d, lse), (long long)N);
  return check_row_input(op, "lse", lse, N, logits);
}

/* A checked CPU per-row input (N), read into a new buffer of `dtype` (f32 or f64). */
static void *row_values(const char *op, const lt_tensor *t, int64_t N, int dtype) {
  void *buf = malloc((size_t)(N > 0 ? N : 1) * (size_t)lt_dtype_size(dtype));
  if (!buf) {
    lt_errorf("%s: out of host memory", op);
    return NULL;
  }
  if (lt_copy_to_buffer(t, buf, dtype, N) == 0) return buf;
  free(buf);
  return NULL;
}

/* What the backward rows read and write: logits xp (N, V), targets tgt (N), dlogits gp (N, V),
 * dlosses dl (N) and lse ls (N) in f64 for f64 logits, else f32. */
typedef struct {
  int64_t N, V;
  int dtype;
  int64_t ignore_index;
  const int64_t *tgt;
  const void *xp;
  void *gp;
  const void *dl, *ls;
} backward_job;

/* Rows [N tid / nthreads, N (tid + 1) / nthreads), each alone. Returns 1 when out of memory. */
static int backward_rows(void *job, int tid, int nthreads) {
  const backward_job *j = job;
  int64_t V = j->V, i0 = j->N * tid / nthreads, i1 = j->N * (tid + 1) / nthreads;
  int dtype = j->dtype;
  bool half = dtype == LT_BF16 || dtype == LT_F16;
  float *scratch = half && i1 > i0 ? malloc(2 * (size_t)V * sizeof(float)) : NULL;
  if (half && i1 > i0 && !scratch) return 1;
  const float *ls = j->ls, *dl = j->dl;
  for (int64_t i = i0; i < i1; i++) {
    int64_t t = j->tgt[i];
    if (t == j->ignore_index) {
      memset((char *)j->gp + i * V * lt_dtype_size(dtype), 0, (size_t)(V * lt_dtype_size(dtype)));
    } else if (dtype == LT_F64) {
      row_grad_f64((double *)j->gp + i * V, (const double *)j->xp + i * V, V, ((const double *)j->ls)[i],
                   ((const double *)j->dl)[i], t);
    } else if (dtype == LT_F32) {
      row_grad_f32((float *)j->gp + i * V, (const float *)j->xp + i * V, V, ls[i], dl[i], t);
    } else {
      const float *x = lt_load_row_f32(j->xp, dtype, i * V, V, scratch);
      row_grad_f32(scratch + V, x, V, ls[i], dl[i], t);
      lt_store_row_f32(j->gp, dtype, i * V, scratch + V, V);
    }
  }
  free(scratch);
  return 0;
}

int lt_cross_entropy_backward(lt_tensor *dlogits, const lt_tensor *dlosses, const lt_tensor *logits,
                              const lt_tensor *targets, const lt_tensor *lse, int64_t ignore_index) {
  const char *op = "cross_entropy_backward";
  int64_t N, V;
  LT_TRY(check_shapes(op, logits, targets, &N, &V));
  LT_TRY(check_backward_rows(op, dlosses, lse, N, logits));
  if (logits->device != LT_DEVICE_CPU) {
    const lt_backend *be = lt_backend_for(op, logits->device);
    return be ? backward_cuda(be, dlogits, dlosses, logits, targets, lse, ignore_index, N, V) : -1;
  }
  int64_t *tgt = read_targets(op, targets, ignore_index, N, V);
  if (!tgt) return -1;
  int rc = -1, dtype = logits->dtype, cdtype = dtype == LT_F64 ? LT_F64 : LT_F32, failed = 0;
  lt_tensor *xc = lt_tensor_new(), *gw = NULL;
  void *dl = NULL, *ls = NULL;
  if (!xc || lt_contiguous(xc, logits)) goto done;
  if (!(dl = row_values(op, dlosses, N, cdtype)) || !(ls = row_values(op, lse, N, cdtype))) goto done;
  if (!(gw = lt_out_begin(op, "dlogits", dlogits, 2, logits->shape, dtype))) goto done;
  const void *xp = lt_data_ptr(xc);
  void *gp = lt_data_ptr(gw);
  backward_job job = {N, V, dtype, ignore_index, tgt, xp, gp, dl, ls};
  failed = lt_run_parts(backward_rows, &job, N * V >= LT_PAR_GRAIN && N > 1);
  rc = failed ? lt_errorf("%s: out of host memory", op) : 0;
done:
  rc = lt_out_finish(dlogits, gw, rc);
  lt_release(xc);
  free(tgt);
  free(dl);
  free(ls);
  return rc;
}
