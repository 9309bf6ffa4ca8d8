/* adafactor.c — one Adafactor step on the CPU, CUDA tensors to kernels/adafactor.cu (Shazeer & Stern 2018), as
 * transformers.optimization.Adafactor computes it, operation by operation:
 *   rms_p = ||param|| / sqrt(n);  lr = (scale_parameter ? max(eps2, rms_p) : 1) * rel_lr
 *   u = grad^2 + eps1
 *   factored (param of 2 or more dims [..., R, C]):
 *     row = row * beta2t + (1 - beta2t) * mean_C(u);  col = col * beta2t + (1 - beta2t) * mean_R(u)
 *     u = rsqrt(row / mean_R(row)) * rsqrt(col) * grad
 *   else: v = v * beta2t + (1 - beta2t) * u;  u = rsqrt(v) * grad
 *   u = u / max(rms(u) / clip_threshold, 1) * lr
 *   with beta1 (exp_avg given): m = m * beta1 + (1 - beta1) * u;  u = m
 *   param = param + (-weight_decay * lr) * param  (when weight_decay != 0);  param = param - u
 * rel_lr (the group lr or the relative step) and beta2t = 1 - step^decay_rate are formed by the
 * caller (lua/lutra/optim/adafactor.lua). Sums (norms, means) accumulate in double in the order of
 * kernels/adafactor.h and are rounded once to the compute dtype; every other operation is rounded
 * in the compute dtype, as kernels/adafactor.cu does it with explicitly rounded intrinsics: CUDA
 * and CPU agree bitwise. Dtypes: param, grad and state all f32 or all f64 (a bf16/f16 param is
 * stepped through an f32 copy by the caller, as transformers does). */
#include "ops/backend.h"
#include "ops/multi_tensor.h"
#include <math.h>
#include <stdlib.h>

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off")
#elif defined(__clang__)
#pragma clang fp contract(off)
#endif

typedef lt_adafactor_args adafactor_args;

/* Each pass is one kernel of kernels/adafactor.cu, in the same order of operations. */
#define DEFINE_ADAFACTOR(T, S, SQRT)                                                                                   \
  /* the sum of squares of x[0..n) (or of the update, `update`), in runs */                                          \
  static double sumsq_##S(const adafactor_args *a, const T *x, const T *rmean, bool update, double *runs) {            \
    const T *g = a->grad, *row = a->row, *col = a->col, *v = a->v;                                                     \
    int64_t R = a->rows, C = a->cols, len = a->n / a->batches, nruns = (a->n + LT_ADAFACTOR_RUN - 1) / LT_ADAFACTOR_RUN; \
    _Pragma("omp parallel for schedule(static) if (a->n >= 2 * LT_PAR_GRAIN)")                                        \
    for (int64_t k = 0; k < nruns; k++) {                                                                              \
      double run = 0;                                                                                                  \
      int64_t r0 = k * LT_ADAFACTOR_RUN, end = a->n - r0 < LT_ADAFACTOR_RUN ? a->n : r0 + LT_ADAFACTOR_RUN;            \
      for (int64_t i = r0; i < end; i++) {                                                                             \
        T u = update ? unscaled_##S(g, row, col, v, rmean, a->factored, R, C, len, i) : x[i];                          \
        run += (double)u * (double)u;                                                                                  \
      }                                                                                                                \
      runs[k] = run;                                                                                                   \
    }                                                                                                                  \
    double total = 0;                                                                                                  \
    for (int64_t k = 0; k < nruns; k++) total += runs[k];                                                              \
    return total;                                                                                                      \
  }                                                                                                                    \
  static void adafactor_##S(const adafactor_args *a, T *rmean, double *runs) {                                         \
    T *p = a->param, *m = a->m, *row = a->row, *col = a->col, *v = a->v;                                               \
    const T *g = a->grad;                                                                                              \
    T rms_p = (T)sqrt(sumsq_##S(a, p, rmean, false, runs)) / (T)sqrt((double)a->n);                                          \
    T lr = a->scale_parameter ? (rms_p > (T)a->eps2 ? rms_p : (T)a->eps2) * (T)a->rel_lr : (T)a->rel_lr;               \
    const T eps1 = (T)a->eps1, b2 = (T)a->beta2t, c2 = (T)(1.0 - a->beta2t);                                           \
    int64_t R = a->rows, C = a->cols, len = a->n / a->batches;                                                         \
    bool par = a->n >= 2 * LT_PAR_GRAIN;                                                                               \
    if (a->factored) {                                                                                                 \
      _Pragma("omp parallel for schedule(static) if (par)")                                                            \
      for (int64_t br = 0; br < a->batches * R; br++) { /* a row's mean of grad^2 + eps1 */                            \
        const T *gr = g + br * C;                                                                                      \
        double rs = 0;                                                                                                 \
        for (int64_t c = 0; c < C; c++) rs += gr[c] * gr[c] + eps1;                                                    \
        row[br] = row[br] * b2 + c2 * (T)(rs / (double)C);                                                             \
      }                                                                                                                \
      _Pragma("omp parallel for schedule(static) if (par)")                                                            \
      for (int64_t bc = 0; bc < a->batches * C; bc++) { /* a column's, down its rows */                               \
        const T *gc = g + (bc / C) * R * C + bc % C;                                                                   \
        double cs = 0;                                                                                                 \
        for (int64_t r = 0; r < R; r++) cs += gc[r * C] * gc[r * C] + eps1;                                            \
        col[bc] = col[bc] * b2 + c2 * (T)(cs / (double)R);                                                             \
      }                                                                                                                \
      for (int64_t b = 0; b < a->batches; b++) {                                                                       \
        double rs = 0;                                                                                                 \
        for (int64_t r = 0; r < R; r++) rs += row[b * R + r];                                                          \
        rmean[b] = (T)(rs / (double)R);                                                                                \
      }                                                                                                                \
    } else {                                                                                                           \
      _Pragma("omp parallel for schedule(static) if (par)")                                                            \
      for (int64_t i = 0; i < a->n; i++) v[i] = v[i] * b2 + c2 * (g[i] * g[i] + eps1);                                 \
    }                                                                                                                  \
    T rms_u = (T)sqrt(sumsq_##S(a, NULL, rmean, true, runs)) / (T)sqrt((double)a->n) / (T)a->clip;                           \
    T clip_div = rms_u > (T)1 ? rms_u : (T)1, neg_decay = (T)(-a->weight_decay) * lr;                                  \
    const T b1 = (T)a->beta1, c1 = (T)(1.0 - a->beta1);                                                                \
    _Pragma("omp parallel for schedule(static) if (par)")                                                              \
    for (int64_t i = 0; i < a->n; i++) {                                                                               \
      T u = unscaled_##S(g, row, col, v, rmean, a->factored, R, C, len, i) / clip_div * lr;                            \
      if (a->first_moment) {                                                                                           \
        m[i] = m[i] * b1 + c1 * u;                                                                                     \
        u = m[i];                                                                                                      \
      }                                                                                                                \
      if (a->weight_decay != 0) p[i] = p[i] + neg_decay * p[i];                                                        \
      p[i] = p[i] - u;                                                                                                 \
    }                                                                                                                  \
  }

/* Element i of the update before clipping: rsqrt(row / rmean) * rsqrt(col) * grad, or rsqrt(v) * grad. */
#define DEFINE_UNSCALED(T, S, SQRT)                                                                                    \
  static inline T unscaled_##S(const T *g, const T *row, const T *col, const T *v, const T *rmean, bool factored,     \
                               int64_t R, int64_t C, int64_t len, int64_t i) {                                         \
    if (!factored) return (T)1 / SQRT(v[i]) * g[i];                                                                    \
    int64_t b = i / len, k = i % len;                                                                                  \
    T rf = (T)1 / SQRT(row[b * R + k / C] / rmean[b]), cf = (T)1 / SQRT(col[b * C + k % C]);                           \
    return rf * cf * g[i];                                                                                             \
  }
DEFINE_UNSCALED(float, f32, sqrtf)
DEFINE_UNSCALED(double, f64, sqrt)
DEFINE_ADAFACTOR(float, f32, sqrtf)
DEFINE_ADAFACTOR(double, f64, sqrt)

/* An optional or required state operand of n elements and param's dtype. */
static int check_state(const char *what, const lt_tensor *t, int64_t n, const lt_tensor *param, bool want) {
  if (!want) {
    if (t && t->storage) return lt_errorf("adafactor: %s must be NULL for this param", what);
    return 0;
  }
  return lt_optim_check_operand("adafactor", what, t, n, param->dtype, param->dtype, param);
}

/* Runs the step on a's contiguous buffers: the CPU passes, or the device's kernels. */
static int run_step(int device, lt_adafactor_args *a) {
  if (device != LT_DEVICE_CPU) {
    const lt_backend *be = lt_backend_for("adafactor", device);
    return be ? be->adafactor(device, a) : -1;
  }
  size_t esize = a->dtype == LT_F64 ? sizeof(double) : sizeof(float);
  void *rmean = malloc(esize * (size_t)(a->batches > 0 ? a->batches : 1));
  double *runs = malloc(sizeof(double) * (size_t)((a->n + LT_ADAFACTOR_RUN - 1) / LT_ADAFACTOR_RUN));
  if (!rmean || !runs) {
    free(rmean), free(runs);
    return lt_errorf("adafactor: out of memory");
  }
  if (a->dtype == LT_F32)
    adafactor_f32(a, rmean, runs);
  else
    adafactor_f64(a, rmean, runs);
  free(rmean), free(runs);
  return 0;
}

int lt_adafactor_step(lt_tensor *param, const lt_tensor *grad, lt_tensor *exp_avg, lt_tensor *row, lt_tensor *col,
                      lt_tensor *v, double rel_lr, int scale_parameter, double eps1, double eps2,
                      double clip_threshold, double beta2t, double beta1, double weight_decay) {
  LT_TRY(lt_check_defined("adafactor", "param", param));
  LT_TRY(lt_optim_check_build("adafactor", param->device));
  if (param->dtype != LT_F32 && param->dtype != LT_F64)
    return lt_errorf("adafactor: param is %s, expected f32 or f64", lt_dtype_name(param->dtype));
  if (!(rel_lr >= 0) || !(eps1 >= 0) || !(eps2 >= 0) || !(clip_threshold > 0) || !(weight_decay >= 0))
    return lt_errorf("adafactor: lr, eps and weight_decay must be >= 0 and clip_threshold > 0");
  if (!(beta2t >= 0 && beta2t < 1)) return lt_errorf("adafactor: beta2t must be in [0, 1), got %g", beta2t);
  bool first_moment = exp_avg != NULL && exp_avg->storage != NULL;
  if (first_moment && !(beta1 >= 0 && beta1 < 1)) return lt_errorf("adafactor: beta1 must be in [0, 1), got %g", beta1);
  int64_t n = lt_numel(param);
  lt_adafactor_args a = {.n = n, .batches = 1, .rows = 1, .cols = n, .dtype = param->dtype,
                         .factored = param->ndim >= 2, .first_moment = first_moment,
                         .scale_parameter = scale_parameter != 0, .rel_lr = rel_lr, .eps1 = eps1, .eps2 = eps2,
                         .clip = clip_threshold, .beta2t = beta2t, .beta1 = beta1, .weight_decay = weight_decay};
  if (a.factored) {
    a.rows = param->shape[param->ndim - 2];
    a.cols = param->shape[param->ndim - 1];
    a.batches = a.rows * a.cols > 0 ? n / (a.rows * a.cols) : 0;
  }
  LT_TRY(lt_optim_check_operand("adafactor", "grad", grad, n, param->dtype, param->dtype, param));
  LT_TRY(check_state("exp_avg", exp_avg, n, param, first_moment));
  LT_TRY(check_state("row", row, a.batches * a.rows, param, a.factored));
  LT_TRY(check_state("col", col, a.batches * a.cols, param, a.factored));
  LT_TRY(check_state("v", v, n, param, !a.factored));
  LT_TRY(lt_optim_check_storage("adafactor", "param", param));
  if (n == 0) return 0;
  int rc = -1;
  lt_tensor *pc = lt_begin_inplace(param), *gc = lt_tensor_new();
  lt_tensor *mc = first_moment ? lt_begin_inplace(exp_avg) : NULL;
  lt_tensor *rc_ = a.factored ? lt_begin_inplace(row) : NULL, *cc = a.factored ? lt_begin_inplace(col) : NULL;
  lt_tensor *vc = a.factored ? NULL : lt_begin_inplace(v);
  if (!pc || !gc || (first_moment && !mc) || (a.factored && (!rc_ || !cc)) || (!a.factored && !vc) ||
      lt_contiguous(gc, grad))
    goto done;
  a.param = lt_data_ptr(pc), a.grad = lt_data_ptr(gc);
  a.m = mc ? lt_data_ptr(mc) : NULL, a.v = vc ? lt_data_ptr(vc) : NULL;
  a.row = rc_ ? lt_data_ptr(rc_) : NULL, a.col = cc ? lt_data_ptr(cc) : NULL;
  rc = run_step(param->device, &a);
done:
  rc = lt_finish_inplace(param, pc, rc);
  if (mc) rc = lt_finish_inplace(exp_avg, mc, rc);
  if (rc_) rc = lt_finish_inplace(row, rc_, rc);
  if (cc) rc = lt_finish_inplace(col, cc, rc);
  if (vc) rc = lt_finish_inplace(v, vc, rc);
  lt_release(gc);
  return rc;
}
