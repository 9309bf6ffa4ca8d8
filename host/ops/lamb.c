/* lamb.c — one LAMB step on the CPU, CUDA tensors to kernels/lamb.cu (You et al. 2020, "Large Batch
 * Optimization for Deep Learning", Algorithm 2, with phi the identity), the order of tests/py/ref_optim_extra.py:
 *   m = m * beta1 + (1 - beta1) * grad;  v = v * beta2 + (1 - beta2) * grad * grad
 *   r = (m / bc1) / (sqrt(v / bc2) + eps) + weight_decay * param,  bc_k = 1 - beta_k^step
 *   trust = ||param|| / ||r||, or 1 when either norm is 0 (as apex's FusedLAMB, timm's Lamb
 *   and torch-optimizer's Lamb)
 *   param = param - (lr * trust) * r
 * The norms accumulate in double in the order of kernels/lamb.h and are rounded once to the
 * compute dtype; every other operation is rounded in the compute dtype, as kernels/lamb.cu does it
 * with explicitly rounded intrinsics: CUDA and CPU agree bitwise. Dtypes: param, grad, m and v all
 * f32 or all f64 (a bf16/f16 param is stepped through an f32 copy by the caller). */
#include "ops/backend.h"
#include "ops/multi_tensor.h"
#include <math.h>
#include <stdlib.h>

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off")
#elif defined(__clang__)
#pragma clang fp contract(off)
#endif

typedef lt_lamb_args lamb_args;

/* The passes of kernels/lamb.cu: the moments; the norms of param and r in runs; the step. */
#define DEFINE_LAMB(T, S, SQRT)                                                                                        \
  static void lamb_##S(const lamb_args *a, double *runs) {                                                             \
    T *p = a->param, *m = a->m, *v = a->v;                                                                             \
    const T *g = a->grad;                                                                                              \
    const T b1 = (T)a->beta1, c1 = (T)(1.0 - a->beta1), b2 = (T)a->beta2, c2 = (T)(1.0 - a->beta2);                    \
    const T bc1 = (T)a->bc1, bc2 = (T)a->bc2, eps = (T)a->eps, wd = (T)a->weight_decay;                                \
    bool par = a->n >= 2 * LT_PAR_GRAIN;                                                                               \
    int64_t nruns = (a->n + LT_LAMB_RUN - 1) / LT_LAMB_RUN;                                                            \
    _Pragma("omp parallel for schedule(static) if (par)")                                                              \
    for (int64_t i = 0; i < a->n; i++) {                                                                               \
      m[i] = m[i] * b1 + c1 * g[i];                                                                                    \
      v[i] = v[i] * b2 + c2 * g[i] * g[i];                                                                             \
    }                                                                                                                  \
    _Pragma("omp parallel for schedule(static) if (par)")                                                              \
    for (int64_t k = 0; k < nruns; k++) {                                                                              \
      double wrun = 0, rrun = 0;                                                                                       \
      int64_t r0 = k * LT_LAMB_RUN, end = a->n - r0 < LT_LAMB_RUN ? a->n : r0 + LT_LAMB_RUN;                           \
      for (int64_t i = r0; i < end; i++) {                                                                             \
        T r = m[i] / bc1 / (SQRT(v[i] / bc2) + eps) + wd * p[i];                                                       \
        wrun += (double)p[i] * (double)p[i];                                                                           \
        rrun += (double)r * (double)r;                                                                                 \
      }                                                                                                                \
      runs[2 * k] = wrun, runs[2 * k + 1] = rrun;                                                                      \
    }                                                                                                                  \
    double wsum = 0, rsum = 0;                                                                                         \
    for (int64_t k = 0; k < nruns; k++) wsum += runs[2 * k], rsum += runs[2 * k + 1];                                  \
    T wn = (T)sqrt(wsum), rn = (T)sqrt(rsum);                                                                          \
    T trust = wn > 0 && rn > 0 ? wn / rn : (T)1;                                                                       \
    T step = (T)a->lr * trust;                                                                                         \
    _Pragma("omp parallel for schedule(static) if (par)")                                                              \
    for (int64_t i = 0; i < a->n; i++) {                                                                               \
      T r = m[i] / bc1 / (SQRT(v[i] / bc2) + eps) + wd * p[i];                                                         \
      p[i] = p[i] - step * r;                                                                                          \
    }                                                                                                                  \
  }
DEFINE_LAMB(float, f32, sqrtf)
DEFINE_LAMB(double, f64, sqrt)

int lt_lamb_step(lt_tensor *param, const lt_tensor *grad, lt_tensor *m, lt_tensor *v, double lr, double beta1,
                 double beta2, double eps, double weight_decay, int64_t step) {
  LT_TRY(lt_check_defined("lamb", "param", param));
  LT_TRY(lt_optim_check_build("lamb", param->device));
  if (param->dtype != LT_F32 && param->dtype != LT_F64)
    return lt_errorf("lamb: param is %s, expected f32 or f64", lt_dtype_name(param->dtype));
  if (!(beta1 >= 0 && beta1 < 1) || !(beta2 >= 0 && beta2 < 1))
    return lt_errorf("lamb: betas must be in [0, 1), got (%g, %g)", beta1, beta2);
  if (!(lr >= 0) || !(eps >= 0) || !(weight_decay >= 0))
    return lt_errorf("lamb: lr, eps and weight_decay must be >= 0, got %g, %g, %g", lr, eps, weight_decay);
  if (step < 1) return lt_errorf("lamb: step must be >= 1, got %lld", (long long)step);
  int64_t n = lt_numel(param);
  LT_TRY(lt_optim_check_operand("lamb", "grad", grad, n, param->dtype, param->dtype, param));
  LT_TRY(lt_optim_check_operand("lamb", "m", m, n, param->dtype, param->dtype, param));
  LT_TRY(lt_optim_check_operand("lamb", "v", v, n, param->dtype, param->dtype, param));
  if (lt_data_ptr(m) == lt_data_ptr(v) || lt_data_ptr(m) == lt_data_ptr(param) || lt_data_ptr(v) == lt_data_ptr(param))
    return lt_errorf("lamb: m, v and param must not share memory");
  LT_TRY(lt_optim_check_storage("lamb", "param", param));
  if (n == 0) return 0;
  lamb_args a = {.n = n, .dtype = param->dtype, .lr = lr, .beta1 = beta1, .beta2 = beta2, .eps = eps, .weight_decay = weight_decay,
                 .bc1 = 1.0 - pow(beta1, (double)step), .bc2 = 1.0 - pow(beta2, (double)step)};
  int rc = -1;
  lt_tensor *pc = lt_begin_inplace(param), *mc = lt_begin_inplace(m), *vc = lt_begin_inplace(v), *gc = lt_tensor_new();
  if (!pc || !mc || !vc || !gc || lt_contiguous(gc, grad)) goto done;
  a.param = lt_data_ptr(pc), a.grad = lt_data_ptr(gc), a.m = lt_data_ptr(mc), a.v = lt_data_ptr(vc);
  if (param->device != LT_DEVICE_CPU) {
    const lt_backend *be = lt_backend_for("lamb", param->device);
    rc = be ? be->lamb(param->device, &a) : -1;
  } else {
    double *runs = malloc(sizeof(double) * 2 * (size_t)((n + LT_LAMB_RUN - 1) / LT_LAMB_RUN));
    if (!runs) {
      lt_errorf("lamb: out of memory");
      goto done;
    }
    if (param->dtype == LT_F32)
      lamb_f32(&a, runs);
    else
      lamb_f64(&a, runs);
    free(runs);
    rc = 0;
  }
done:
  rc = lt_finish_inplace(param, pc, rc);
  rc = lt_finish_inplace(m, mc, rc);
  rc = lt_finish_inplace(v, vc, rc);
  lt_release(gc);
  return rc;
}
