/* adafactor.c — one Adafactor step on the CPU (Shazeer & Stern 2018), as transformers'
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
 * caller (lua/lutra/optim/adafactor.lua). Sums (norms, means) accumulate in double in index order
 * and are rounded once to the compute dtype, so the result does not depend on the thread count.
 * Dtypes: param, grad and state all f32 or all f64 (a bf16/f16 param is stepped through an f32
 * copy by the caller, as transformers does). CPU tensors only: a CUDA param is refused. */
#include "ops/backend.h"
#include "ops/multi_tensor.h"
#include <math.h>
#include <stdlib.h>

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off")
#elif defined(__clang__)
#pragma clang fp contract(off)
#endif

typedef struct adafactor_args {
  int64_t n, batches, rows, cols; /* factored: n = batches * rows * cols */
  bool factored, first_moment;
  double rel_lr, eps1, eps2, clip, beta2t, beta1, weight_decay;
  bool scale_parameter;
} adafactor_args;

/* p, g, m (NULL without beta1), row, col (factored) or v, acc: cols doubles (factored). */
#define DEFINE_ADAFACTOR(T, S, SQRT)                                                                                   \
  static void adafactor_##S(T *p, const T *g, T *m, T *row, T *col, T *v, double *acc, const adafactor_args *a) {      \
    double sum = 0;                                                                                                    \
    for (int64_t i = 0; i < a->n; i++) sum += (double)p[i] * (double)p[i];                                             \
    T rms_p = (T)sqrt(sum) / (T)sqrt((double)a->n);                                                                    \
    T lr = a->scale_parameter ? (rms_p > (T)a->eps2 ? rms_p : (T)a->eps2) * (T)a->rel_lr : (T)a->rel_lr;               \
    const T eps1 = (T)a->eps1, b2 = (T)a->beta2t, c2 = (T)(1.0 - a->beta2t);                                           \
    int64_t R = a->rows, C = a->cols;                                                                                  \
    if (a->factored) {                                                                                                 \
      for (int64_t b = 0; b < a->batches; b++) {                                                                       \
        const T *gb = g + b * R * C;                                                                                   \
        for (int64_t c = 0; c < C; c++) acc[c] = 0;                                                                    \
        for (int64_t r = 0; r < R; r++) {                                                                              \
          double rs = 0;                                                                                               \
          for (int64_t c = 0; c < C; c++) {                                                                            \
            T u = gb[r * C + c] * gb[r * C + c] + eps1;                                                                \
            rs += u;                                                                                                   \
            acc[c] += u;                                                                                               \
          }                                                                                                            \
          T *ro = row + b * R + r;                                                                                     \
          *ro = *ro * b2 + c2 * (T)(rs / (double)C);                                                                   \
        }                                                                                                              \
        for (int64_t c = 0; c < C; c++) {                                                                              \
          T *co = col + b * C + c;                                                                                     \
          *co = *co * b2 + c2 * (T)(acc[c] / (double)R);                                                               \
        }                                                                                                              \
      }                                                                                                                \
    } else {                                                                                                           \
      for (int64_t i = 0; i < a->n; i++) v[i] = v[i] * b2 + c2 * (g[i] * g[i] + eps1);                                \
    }                                                                                                                  \
    /* two passes over the update: its rms, then the step (u recomputed, bitwise the same) */                        \
    T clip_div = (T)1, neg_decay = (T)(-a->weight_decay) * lr;                                                         \
    const T b1 = (T)a->beta1, c1 = (T)(1.0 - a->beta1);                                                                \
    for (int pass = 0; pass < 2; pass++) {                                                                             \
      double usum = 0;                                                                                                 \
      for (int64_t b = 0; b < a->batches; b++) {                                                                       \
        T rmean = (T)1;                                                                                                \
        if (a->factored) {                                                                                             \
          double rs = 0;                                                                                               \
          for (int64_t r = 0; r < R; r++) rs += row[b * R + r];                                                        \
          rmean = (T)(rs / (double)R);                                                                                 \
        }                                                                                                              \
        int64_t len = a->n / a->batches;                                                                               \
        for (int64_t k = 0; k < len; k++) {                                                                            \
          int64_t i = b * len + k;                                                                                     \
          T u;                                                                                                         \
          if (a->factored) {                                                                                           \
            T rf = (T)1 / SQRT(row[b * R + k / C] / rmean), cf = (T)1 / SQRT(col[b * C + k % C]);                      \
            u = rf * cf * g[i];                                                                                        \
          } else {                                                                                                     \
            u = (T)1 / SQRT(v[i]) * g[i];                                                                              \
          }                                                                                                            \
          if (pass == 0) {                                                                                             \
            usum += (double)u * (double)u;                                                                             \
            continue;                                                                                                  \
          }                                                                                                            \
          u = u / clip_div * lr;                                                                                       \
          if (a->first_moment) {                                                                                       \
            m[i] = m[i] * b1 + c1 * u;                                                                                 \
            u = m[i];                                                                                                  \
          }                                                                                                            \
          if (a->weight_decay != 0) p[i] = p[i] + neg_decay * p[i];                                                    \
          p[i] = p[i] - u;                                                                                             \
        }                                                                                                              \
      }                                                                                                                \
      if (pass == 0) {                                                                                                 \
        T rms_u = (T)sqrt(usum) / (T)sqrt((double)a->n) / (T)a->clip;                                                  \
        clip_div = rms_u > (T)1 ? rms_u : (T)1;                                                                        \
      }                                                                                                                \
    }                                                                                                                  \
  }
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

int lt_adafactor_step(lt_tensor *param, const lt_tensor *grad, lt_tensor *exp_avg, lt_tensor *row, lt_tensor *col,
                      lt_tensor *v, double rel_lr, int scale_parameter, double eps1, double eps2,
                      double clip_threshold, double beta2t, double beta1, double weight_decay) {
  LT_TRY(lt_check_defined("adafactor", "param", param));
  if (param->device != LT_DEVICE_CPU) return lt_errorf("adafactor: param must be a CPU tensor (no CUDA step yet)");
  if (param->dtype != LT_F32 && param->dtype != LT_F64)
    return lt_errorf("adafactor: param is %s, expected f32 or f64", lt_dtype_name(param->dtype));
  if (!(rel_lr >= 0) || !(eps1 >= 0) || !(eps2 >= 0) || !(clip_threshold > 0) || !(weight_decay >= 0))
    return lt_errorf("adafactor: lr, eps and weight_decay must be >= 0 and clip_threshold > 0");
  if (!(beta2t >= 0 && beta2t < 1)) return lt_errorf("adafactor: beta2t must be in [0, 1), got %g", beta2t);
  bool first_moment = exp_avg != NULL && exp_avg->storage != NULL;
  if (first_moment && !(beta1 >= 0 && beta1 < 1)) return lt_errorf("adafactor: beta1 must be in [0, 1), got %g", beta1);
  int64_t n = lt_numel(param);
  adafactor_args a = {.n = n, .batches = 1, .rows = 1, .cols = n, .factored = param->ndim >= 2,
                      .first_moment = first_moment, .rel_lr = rel_lr, .eps1 = eps1, .eps2 = eps2,
                      .clip = clip_threshold, .beta2t = beta2t, .beta1 = beta1, .weight_decay = weight_decay,
                      .scale_parameter = scale_parameter != 0};
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
  if (n == 0) return 0;
  int rc = -1;
  double *acc = a.factored ? malloc(sizeof(double) * (size_t)a.cols) : NULL;
  lt_tensor *pc = lt_begin_inplace(param), *gc = lt_tensor_new();
  lt_tensor *mc = first_moment ? lt_begin_inplace(exp_avg) : NULL;
  lt_tensor *rc_ = a.factored ? lt_begin_inplace(row) : NULL, *cc = a.factored ? lt_begin_inplace(col) : NULL;
  lt_tensor *vc = a.factored ? NULL : lt_begin_inplace(v);
  if (!pc || !gc || (first_moment && !mc) || (a.factored && (!acc || !rc_ || !cc)) || (!a.factored && !vc) ||
      lt_contiguous(gc, grad))
    goto done;
  if (param->dtype == LT_F32)
    adafactor_f32(lt_data_ptr(pc), lt_data_ptr(gc), mc ? lt_data_ptr(mc) : NULL, rc_ ? lt_data_ptr(rc_) : NULL,
                  cc ? lt_data_ptr(cc) : NULL, vc ? lt_data_ptr(vc) : NULL, acc, &a);
  else
    adafactor_f64(lt_data_ptr(pc), lt_data_ptr(gc), mc ? lt_data_ptr(mc) : NULL, rc_ ? lt_data_ptr(rc_) : NULL,
                  cc ? lt_data_ptr(cc) : NULL, vc ? lt_data_ptr(vc) : NULL, acc, &a);
  rc = 0;
done:
  if (!acc && a.factored && rc != 0) lt_errorf("adafactor: out of memory");
  free(acc);
  rc = lt_finish_inplace(param, pc, rc);
  if (mc) rc = lt_finish_inplace(exp_avg, mc, rc);
  if (rc_) rc = lt_finish_inplace(row, rc_, rc);
  if (cc) rc = lt_finish_inplace(col, cc, rc);
  if (vc) rc = lt_finish_inplace(v, vc, rc);
  lt_release(gc);
  return rc;
}
