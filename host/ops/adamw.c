/* adamw.c — one fused AdamW step on the CPU.
 *
 * The arithmetic follows torch.optim.AdamW (single-tensor path) operation by operation:
 *   param *= 1 - lr * weight_decay
 *   m = lerp(m, grad, 1 - beta1)              (an fma, as ATen's vectorised lerp)
 *   v = v * beta2 + (1 - beta2) * grad * grad
 *   param += -(lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps),  bc_k = 1 - beta_k^step
 * with the scalars formed in double and each tensor op rounded in the tensor's dtype.
 * Dtypes: f32 param/grad/m/v; f64 param/grad/m/v; or a bf16/f16 param (grad of its dtype or
 * f32) with f32 m and v, computed in f32 and rounded to the param's dtype once; or, with master
 * weights, that update done on an f32 master copy which the param then receives rounded.
 * lt_adamw_step is lt_adamw_step_multi over one tensor: one code path, one set of checks. */
#include "ops/backend.h"
#include "ops/dtype_generic.h"
#include "ops/multi_tensor.h"
#include <stdlib.h>

/* Keep a*b + c as two roundings where torch rounds twice (fmaf() marks the one fused step),
 * and let sqrt vectorise (v >= 0: errno is never set). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off", "no-math-errno", "no-trapping-math")
#elif defined(__clang__)
#pragma clang fp contract(off)
#endif

typedef lt_adamw_scalars adamw_scalars;

/* The scalars in T first (no-op casts for double); lerp(a, b, w) = fma(coeff, b - a, small_w ? a : b). */
#define DEFINE_ADAMW(T, S, FABS, FMA, SQRT)                                                                            \
  static void adamw_##S(T *p, const T *g, T *m, T *v, int64_t n, const adamw_scalars *s) {                             \
    const T decay = (T)s->decay, w = (T)s->lerp_w, b2 = (T)s->beta2, c2 = (T)s->one_minus_beta2;                       \
    const T neg_step = (T)-s->step_size, bc2_sqrt = (T)s->bc2_sqrt, eps = (T)s->eps;                                   \
    const bool small_w = FABS(w) < (T)0.5;                                                                             \
    const T coeff = small_w ? w : w - (T)1;                                                                            \
    LT_SIMD()                                                                                                          \
    for (int64_t i = 0; i < n; i++) {                                                                                  \
      T gi = g[i], mi = m[i];                                                                                          \
      T pi = p[i] * decay;                                                                                             \
      mi = FMA(coeff, gi - mi, small_w ? mi : gi);                                                                     \
      T vi = v[i] * b2;                                                                                                \
      vi = vi + c2 * gi * gi;                                                                                          \
      T denom = SQRT(vi) / bc2_sqrt + eps;                                                                             \
      p[i] = pi + neg_step * mi / denom;                                                                               \
      m[i] = mi;                                                                                                       \
      v[i] = vi;                                                                                                       \
    }                                                                                                                  \
  }
DEFINE_ADAMW(float, f32, fabsf, fmaf, sqrtf)
DEFINE_ADAMW(double, f64, fabs, fma, sqrt)

/* 16-bit param: blocks converted to f32, updated by adamw_f32, rounded back once. */
enum { HALF_BLOCK = 2048 };
static void adamw_half(uint16_t *p, int pdtype, const void *g, int gdtype, float *m, float *v, int64_t n,
                       const adamw_scalars *s) {
  float pf[HALF_BLOCK], gf[HALF_BLOCK];
  for (int64_t i0 = 0; i0 < n; i0 += HALF_BLOCK) {
    int64_t len = n - i0 < HALF_BLOCK ? n - i0 : HALF_BLOCK;
    lt_load_row_f32(p, pdtype, i0, len, pf);
    adamw_f32(pf, lt_load_row_f32(g, gdtype, i0, len, gf), m + i0, v + i0, len, s);
    lt_store_row_f32(p, pdtype, i0, pf, len);
  }
}

/* Master weights: the update is adamw_f32 on the f32 master (as a separate f32 step would do it),
 * then the 16-bit param gets the master rounded. */
static void adamw_master(uint16_t *p, int pdtype, const void *g, int gdtype, float *master, float *m, float *v,
                         int64_t n, const adamw_scalars *s) {
  float gf[HALF_BLOCK];
  for (int64_t i0 = 0; i0 < n; i0 += HALF_BLOCK) {
    int64_t len = n - i0 < HALF_BLOCK ? n - i0 : HALF_BLOCK;
    adamw_f32(master + i0, lt_load_row_f32(g, gdtype, i0, len, gf), m + i0, v + i0, len, s);
    lt_store_row_f32(p, pdtype, i0, master + i0, len);
  }
}

/* Updates chunk c (elements [c * LT_OPTIM_CHUNK, ...) of e->n) of one tensor. */
static void adamw_chunk(const lt_optim_entry *e, int64_t c, const adamw_scalars *s) {
  int64_t i0 = c * LT_OPTIM_CHUNK, len = e->n - i0 < LT_OPTIM_CHUNK ? e->n - i0 : LT_OPTIM_CHUNK;
  int pdtype = e->pdtype, gsize = lt_dtype_size(e->gdtype);
  const char *g = (const char *)e->grad + i0 * gsize;
  if (pdtype == LT_F32)
    adamw_f32((float *)e->param + i0, (const float *)g, (float *)e->m + i0, (float *)e->v + i0, len, s);
  else if (pdtype == LT_F64)
    adamw_f64((double *)e->param + i0, (const double *)g, (double *)e->m + i0, (double *)e->v + i0, len, s);
  else if (e->master)
    adamw_master((uint16_t *)e->param + i0, pdtype, g, e->gdtype, e->master + i0, (float *)e->m + i0,
                 (float *)e->v + i0, len, s);
  else
    adamw_half((uint16_t *)e->param + i0, pdtype, g, e->gdtype, (float *)e->m + i0, (float *)e->v + i0, len, s);
}

typedef struct adamw_job {
  const lt_optim_entry *entries;
  int64_t n;
  const adamw_scalars *s;
} adamw_job;

static void adamw_job_chunk(void *ctx, int64_t c) {
  const adamw_job *j = ctx;
  const lt_optim_entry *e = &j->entries[lt_optim_entry_of(j->entries, j->n, c)];
  adamw_chunk(e, c - e->first_chunk, j->s);
}

/* Checks tensor i of a call (named as the single op names it when single). */
static int adamw_check_entry(const char *op, bool single, int64_t i, lt_tensor *param, const lt_tensor *grad,
                             const lt_tensor *m, const lt_tensor *v, const lt_tensor *master, int device) {
  char name[48], desc[LT_DESC_STR];
  LT_TRY(lt_check_defined(op, lt_optim_name(name, sizeof name, "params", i, single), param));
  if (param->device != device)
    return lt_errorf("%s: %s is %s, expected it on %s as params[0]", op, name, lt_desc(desc, param),
                     lt_device_str((char[16]){0}, device));
  int pdtype = param->dtype;
  if (!lt_dtype_is_float(pdtype))
    return lt_errorf("%s: %s is %s, expected a floating dtype", op, name, lt_dtype_name(pdtype));
  int64_t n = lt_numel(param);
  int half = pdtype == LT_BF16 || pdtype == LT_F16, mdtype = pdtype == LT_F64 ? LT_F64 : LT_F32;
  LT_TRY(lt_optim_check_operand(op, lt_optim_name(name, sizeof name, "grads", i, single), grad, n, pdtype,
                                half ? LT_F32 : pdtype, param));
  LT_TRY(lt_optim_check_operand(op, lt_optim_name(name, sizeof name, "m", i, single), m, n, mdtype, mdtype, param));
  LT_TRY(lt_optim_check_operand(op, lt_optim_name(name, sizeof name, "v", i, single), v, n, mdtype, mdtype, param));
  if (m == v || lt_data_ptr(m) == lt_data_ptr(v)) {
    char vname[48];
    return lt_errorf("%s: %s and %s must be different tensors", op, lt_optim_name(name, sizeof name, "m", i, single),
                     lt_optim_name(vname, sizeof vname, "v", i, single));
  }
  if (master) {
    lt_optim_name(name, sizeof name, "masters", i, false);
    if (!half)
      return lt_errorf("%s: %s is given for params[%lld] %s: master weights are for bf16/f16 params", op, name,
                       (long long)i, lt_desc(desc, param));
    LT_TRY(lt_optim_check_operand(op, name, master, n, LT_F32, LT_F32, param));
    if (lt_data_ptr(master) == lt_data_ptr(m) || lt_data_ptr(master) == lt_data_ptr(v))
      return lt_errorf("%s: %s must not share memory with m or v", op, name);
  }
  return lt_optim_check_storage(op, lt_optim_name(name, sizeof name, "params", i, single), param);
}

static int adamw_run(const char *op, bool single, int64_t n, lt_tensor *const *params, lt_tensor *const *grads,
                     lt_tensor *const *ms, lt_tensor *const *vs, lt_tensor *const *masters, double lr, double beta1,
                     double beta2, double eps, double weight_decay, int64_t step) {
  if (n < 0) return lt_errorf("%s: n must be >= 0, got %lld", op, (long long)n);
  if (n > 0 && (!params || !grads || !ms || !vs))
    return lt_errorf("%s: params, grads, m and v must be arrays of %lld tensors (got NULL)", op, (long long)n);
  if (step < 1) return lt_errorf("%s: step must be >= 1 for bias correction, got %lld", op, (long long)step);
  if (!(beta1 >= 0 && beta1 < 1) || !(beta2 >= 0 && beta2 < 1))
    return lt_errorf("%s: betas must be in [0, 1), got (%g, %g)", op, beta1, beta2);
  if (!(lr >= 0) || !(eps >= 0) || !(weight_decay >= 0))
    return lt_errorf("%s: lr, eps and weight_decay must be >= 0, got lr %g eps %g weight_decay %g", op, lr, eps,
                     weight_decay);
  if (n == 0) return 0;
  LT_TRY(lt_check_defined(op, single ? "param" : "params[0]", params[0]));
  int device = params[0]->device;
  LT_TRY(lt_optim_check_build(op, device));
  for (int64_t i = 0; i < n; i++)
    LT_TRY(adamw_check_entry(op, single, i, params[i], grads[i], ms[i], vs[i], masters ? masters[i] : NULL, device));
  adamw_scalars s = {
      .decay = 1.0 - lr * weight_decay,
      .lerp_w = 1.0 - beta1,
      .beta2 = beta2,
      .one_minus_beta2 = 1.0 - beta2,
      .step_size = lr / (1.0 - pow(beta1, (double)step)),
      .bc2_sqrt = sqrt(1.0 - pow(beta2, (double)step)),
      .eps = eps,
  };
  int rc = -1;
  lt_tensor **held = calloc((size_t)n * 5, sizeof *held);
  lt_optim_entry *entries = calloc((size_t)n, sizeof *entries);
  if (!held || !entries) {
    rc = lt_errorf("%s: out of memory for %lld tensors", op, (long long)n);
    goto done;
  }
  int64_t elements = 0;
  for (int64_t i = 0; i < n; i++) {
    lt_tensor **h = held + 5 * i;
    lt_tensor *master = masters ? masters[i] : NULL;
    h[0] = lt_begin_inplace(params[i]), h[2] = lt_begin_inplace(ms[i]), h[3] = lt_begin_inplace(vs[i]);
    h[1] = lt_tensor_new();
    if (master) h[4] = lt_begin_inplace(master);
    if (!h[0] || !h[1] || !h[2] || !h[3] || (master && !h[4]) || lt_contiguous(h[1], grads[i])) goto done;
    entries[i] = (lt_optim_entry){.param = lt_data_ptr(h[0]),
                                  .grad = lt_data_ptr(h[1]),
                                  .m = lt_data_ptr(h[2]),
                                  .v = lt_data_ptr(h[3]),
                                  .master = master ? lt_data_ptr(h[4]) : NULL,
                                  .n = lt_numel(h[0]),
                                  .pdtype = h[0]->dtype,
                                  .gdtype = h[1]->dtype};
    elements += entries[i].n;
  }
  int64_t chunks = lt_optim_number_chunks(entries, n);
  if (device == LT_DEVICE_CPU) {
    adamw_job job = {entries, n, &s};
    lt_optim_for_chunks(chunks, elements, adamw_job_chunk, &job);
    rc = 0;
  } else {
    const lt_backend *be = lt_backend_for(op, device);
    rc = !be ? -1 : chunks > 0 ? be->adamw_multi(device, entries, n, chunks, &s) : 0;
  }
done:
  for (int64_t i = 0; held && i < n; i++) {
    lt_tensor **h = held + 5 * i;
    rc = lt_finish_inplace(params[i], h[0], rc);
    rc = lt_finish_inplace(ms[i], h[2], rc);
    rc = lt_finish_inplace(vs[i], h[3], rc);
    if (h[4]) rc = lt_finish_inplace(masters[i], h[4], rc);
    lt_release(h[1]);
  }
  free(held);
  free(entries);
  return rc;
}

int lt_adamw_step(lt_tensor *param, const lt_tensor *grad, lt_tensor *m, lt_tensor *v, double lr, double beta1,
                  double beta2, double eps, double weight_decay, int64_t step) {
  lt_tensor *g = (lt_tensor *)grad; /* only read */
  return adamw_run("adamw", true, 1, &param, &g, &m, &v, NULL, lr, beta1, beta2, eps, weight_decay, step);
}

int lt_adamw_step_multi(int64_t n, lt_tensor *const *params, lt_tensor *const *grads, lt_tensor *const *m,
                        lt_tensor *const *v, lt_tensor *const *masters, double lr, double beta1, double beta2,
                        double eps, double weight_decay, int64_t step) {
  return adamw_run("adamw_multi", false, n, params, grads, m, v, masters, lr, beta1, beta2, eps, weight_decay, step);
}
