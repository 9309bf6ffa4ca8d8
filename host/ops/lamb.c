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

_Static_assert(LT_OPTIM_CHUNK % LT_LAMB_RUN == 0, "kernels/lamb.cu numbers the norms' runs by chunk");

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

/* The checks of tensor i of a call, named as the single op names them when single. */
static int lamb_check_entry(const char *op, bool single, int64_t i, const lt_tensor *param, const lt_tensor *grad,
                            const lt_tensor *m, const lt_tensor *v, int device) {
  char name[48], desc[LT_DESC_STR];
  LT_TRY(lt_check_defined(op, lt_optim_name(name, sizeof name, "params", i, single), param));
  if (param->device != device)
    return lt_errorf("%s: %s is %s, expected it on %s as params[0]", op, name, lt_desc(desc, param),
                     lt_device_str((char[16]){0}, device));
  if (param->dtype != LT_F32 && param->dtype != LT_F64)
    return lt_errorf("%s: %s is %s, expected f32 or f64", op, name, lt_dtype_name(param->dtype));
  int64_t n = lt_numel(param);
  int dt = param->dtype;
  LT_TRY(lt_optim_check_operand(op, lt_optim_name(name, sizeof name, "grads", i, single), grad, n, dt, dt, param));
  LT_TRY(lt_optim_check_operand(op, lt_optim_name(name, sizeof name, "m", i, single), m, n, dt, dt, param));
  LT_TRY(lt_optim_check_operand(op, lt_optim_name(name, sizeof name, "v", i, single), v, n, dt, dt, param));
  if (lt_data_ptr(m) == lt_data_ptr(v) || lt_data_ptr(m) == lt_data_ptr(param) || lt_data_ptr(v) == lt_data_ptr(param))
    return lt_errorf("%s: m, v and param%s must not share memory", op,
                     single ? "" : lt_optim_name(name, sizeof name, " of tensor", i, false));
  return lt_optim_check_storage(op, lt_optim_name(name, sizeof name, "params", i, single), param);
}

/* The step of one contiguous tensor on the CPU (entry e: param, grad, m, v). */
static int lamb_cpu(const char *op, const lt_optim_entry *e, lamb_args a) {
  if (e->n == 0) return 0;
  a.param = e->param, a.grad = e->grad, a.m = e->m, a.v = e->v, a.n = e->n, a.dtype = e->pdtype;
  double *runs = malloc(sizeof(double) * 2 * (size_t)((e->n + LT_LAMB_RUN - 1) / LT_LAMB_RUN));
  if (!runs) return lt_errorf("%s: out of memory", op);
  if (a.dtype == LT_F32)
    lamb_f32(&a, runs);
  else
    lamb_f64(&a, runs);
  free(runs);
  return 0;
}

/* One step of n tensors: on the CPU each in turn (lamb_cpu), on CUDA all in one set of launches
 * (kernels/lamb.cu); each tensor gets exactly what a call for it alone gives it. */
static int lamb_run(const char *op, bool single, int64_t n, lt_tensor *const *params, lt_tensor *const *grads,
                    lt_tensor *const *ms, lt_tensor *const *vs, double lr, double beta1, double beta2, double eps,
                    double weight_decay, int64_t step) {
  if (n < 0) return lt_errorf("%s: n must be >= 0, got %lld", op, (long long)n);
  if (n > 0 && (!params || !grads || !ms || !vs))
    return lt_errorf("%s: params, grads, m and v must be arrays of %lld tensors (got NULL)", op, (long long)n);
  if (!(beta1 >= 0 && beta1 < 1) || !(beta2 >= 0 && beta2 < 1))
    return lt_errorf("%s: betas must be in [0, 1), got (%g, %g)", op, beta1, beta2);
  if (!(lr >= 0) || !(eps >= 0) || !(weight_decay >= 0))
    return lt_errorf("%s: lr, eps and weight_decay must be >= 0, got %g, %g, %g", op, lr, eps, weight_decay);
  if (step < 1) return lt_errorf("%s: step must be >= 1, got %lld", op, (long long)step);
  if (n == 0) return 0;
  LT_TRY(lt_check_defined(op, single ? "param" : "params[0]", params[0]));
  int device = params[0]->device;
  LT_TRY(lt_optim_check_build(op, device));
  for (int64_t i = 0; i < n; i++) LT_TRY(lamb_check_entry(op, single, i, params[i], grads[i], ms[i], vs[i], device));
  lamb_args a = {.lr = lr, .beta1 = beta1, .beta2 = beta2, .eps = eps, .weight_decay = weight_decay,
                 .bc1 = 1.0 - pow(beta1, (double)step), .bc2 = 1.0 - pow(beta2, (double)step)};
  int rc = -1;
  lt_tensor **held = calloc((size_t)n * 4, sizeof *held);
  lt_optim_entry *entries = calloc((size_t)n, sizeof *entries);
  if (!held || !entries) {
    rc = lt_errorf("%s: out of memory for %lld tensors", op, (long long)n);
    goto done;
  }
  for (int64_t i = 0; i < n; i++) {
    lt_tensor **h = held + 4 * i;
    h[0] = lt_begin_inplace(params[i]), h[2] = lt_begin_inplace(ms[i]), h[3] = lt_begin_inplace(vs[i]);
    h[1] = lt_tensor_new();
    if (!h[0] || !h[1] || !h[2] || !h[3] || lt_contiguous(h[1], grads[i])) goto done;
    entries[i] = (lt_optim_entry){.param = lt_data_ptr(h[0]), .grad = lt_data_ptr(h[1]), .m = lt_data_ptr(h[2]),
                                  .v = lt_data_ptr(h[3]), .n = lt_numel(h[0]), .pdtype = h[0]->dtype,
                                  .gdtype = h[1]->dtype};
  }
  int64_t chunks = lt_optim_number_chunks(entries, n);
  if (device == LT_DEVICE_CPU) {
    rc = 0;
    for (int64_t i = 0; i < n && rc == 0; i++) rc = lamb_cpu(op, &entries[i], a);
  } else {
    const lt_backend *be = lt_backend_for(op, device);
    rc = !be ? -1 : chunks > 0 ? be->lamb_multi(device, entries, n, chunks, &a) : 0;
  }
done:
  for (int64_t i = 0; held && i < n; i++) {
    lt_tensor **h = held + 4 * i;
    rc = lt_finish_inplace(params[i], h[0], rc);
    rc = lt_finish_inplace(ms[i], h[2], rc);
    rc = lt_finish_inplace(vs[i], h[3], rc);
    lt_release(h[1]);
  }
  free(held);
  free(entries);
  return rc;
}

int lt_lamb_step(lt_tensor *param, const lt_tensor *grad, lt_tensor *m, lt_tensor *v, double lr, double beta1,
                 double beta2, double eps, double weight_decay, int64_t step) {
  lt_tensor *g = (lt_tensor *)grad; /* only read */
  return lamb_run("lamb", true, 1, &param, &g, &m, &v, lr, beta1, beta2, eps, weight_decay, step);
}

int lt_lamb_step_multi(int64_t n, lt_tensor *const *params, lt_tensor *const *grads, lt_tensor *const *m,
                       lt_tensor *const *v, double lr, double beta1, double beta2, double eps, double weight_decay,
                       int64_t step) {
  return lamb_run("lamb_multi", false, n, params, grads, m, v, lr, beta1, beta2, eps, weight_decay, step);
}
