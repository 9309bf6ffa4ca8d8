/* lion.c — one fused Lion step on the CPU (Chen et al. 2023; lucidrains' lion-pytorch order):
 *   param *= 1 - lr * weight_decay
 *   c = m * beta1 + (1 - beta1) * grad;   param += -lr * sign(c)      (sign(0) = 0)
 *   m = m * beta2 + (1 - beta2) * grad
 * Each product and sum is rounded in the compute dtype, as torch's mul_ and add(alpha=) do, with
 * the scalars formed in double and cast once. Dtypes: f32 param/grad/m; f64 param/grad/m; or a
 * bf16/f16 param (grad of its dtype or f32) with an f32 m, computed in f32 and rounded once.
 * CUDA tensors go to kernels/lion.cu, which repeats this arithmetic operation by operation. */
#include "ops/backend.h"
#include "ops/dtype_generic.h"
#include "ops/multi_tensor.h"

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off")
#elif defined(__clang__)
#pragma clang fp contract(off)
#endif

typedef lt_lion_scalars lion_scalars;

/* The scalars in T first (no-op casts for double). */
#define DEFINE_LION(T, S)                                                                                              \
  static void lion_##S(T *p, const T *g, T *m, int64_t n, const lion_scalars *s) {                                     \
    const T decay = (T)s->decay, neg_lr = (T)s->neg_lr, b1 = (T)s->beta1;                                              \
    const T c1 = (T)s->one_minus_beta1, b2 = (T)s->beta2, c2 = (T)s->one_minus_beta2;                                  \
    LT_SIMD()                                                                                                          \
    for (int64_t i = 0; i < n; i++) {                                                                                  \
      T gi = g[i], mi = m[i];                                                                                          \
      T c = mi * b1 + c1 * gi;                                                                                         \
      T sign = (T)((c > 0) - (c < 0));                                                                                 \
      p[i] = p[i] * decay + neg_lr * sign;                                                                             \
      m[i] = mi * b2 + c2 * gi;                                                                                        \
    }                                                                                                                  \
  }
DEFINE_LION(float, f32)
DEFINE_LION(double, f64)

/* 16-bit param: blocks converted to f32, updated by lion_f32, rounded back once. */
enum { HALF_BLOCK = 2048 };
static void lion_half(uint16_t *p, int pdtype, const void *g, int gdtype, float *m, int64_t n, const lion_scalars *s) {
  float pf[HALF_BLOCK], gf[HALF_BLOCK];
  for (int64_t i0 = 0; i0 < n; i0 += HALF_BLOCK) {
    int64_t len = n - i0 < HALF_BLOCK ? n - i0 : HALF_BLOCK;
    lt_load_row_f32(p, pdtype, i0, len, pf);
    lion_f32(pf, lt_load_row_f32(g, gdtype, i0, len, gf), m + i0, len, s);
    lt_store_row_f32(p, pdtype, i0, pf, len);
  }
}

enum { LION_CHUNK = 16384 }; /* elements per task, a multiple of HALF_BLOCK */

/* Updates chunk c (elements [c * LION_CHUNK, ...) of n) of param and m. */
static inline void lion_chunk(char *pp, int pdtype, const char *gp, int gdtype, char *mp, int mdtype, int64_t n,
                              int64_t c, const lion_scalars *s) {
  int64_t i0 = c * LION_CHUNK, len = n - i0 < LION_CHUNK ? n - i0 : LION_CHUNK;
  int psize = lt_dtype_size(pdtype), gsize = lt_dtype_size(gdtype), msize = lt_dtype_size(mdtype);
  if (pdtype == LT_F32)
    lion_f32((float *)pp + i0, (const float *)gp + i0, (float *)mp + i0, len, s);
  else if (pdtype == LT_F64)
    lion_f64((double *)pp + i0, (const double *)gp + i0, (double *)mp + i0, len, s);
  else
    lion_half((uint16_t *)(pp + i0 * psize), pdtype, gp + i0 * gsize, gdtype, (float *)(mp + i0 * msize), len, s);
}

int lt_lion_step(lt_tensor *param, const lt_tensor *grad, lt_tensor *m, double lr, double beta1, double beta2,
                 double weight_decay) {
  LT_TRY(lt_check_defined("lion", "param", param));
  LT_TRY(lt_optim_check_build("lion", param->device));
  int pdtype = param->dtype;
  if (!lt_dtype_is_float(pdtype))
    return lt_errorf("lion: param is %s, expected a floating dtype", lt_dtype_name(pdtype));
  if (!(beta1 >= 0 && beta1 < 1) || !(beta2 >= 0 && beta2 < 1))
    return lt_errorf("lion: betas must be in [0, 1), got (%g, %g)", beta1, beta2);
  if (!(lr >= 0) || !(weight_decay >= 0))
    return lt_errorf("lion: lr and weight_decay must be >= 0, got lr %g weight_decay %g", lr, weight_decay);
  int64_t n = lt_numel(param);
  int half = pdtype == LT_BF16 || pdtype == LT_F16, mdtype = pdtype == LT_F64 ? LT_F64 : LT_F32;
  LT_TRY(lt_optim_check_operand("lion", "grad", grad, n, pdtype, half ? LT_F32 : pdtype, param));
  LT_TRY(lt_optim_check_operand("lion", "m", m, n, mdtype, mdtype, param));
  if (lt_data_ptr(m) == lt_data_ptr(param) || lt_data_ptr(m) == lt_data_ptr(grad))
    return lt_errorf("lion: m must not share memory with param or grad");
  LT_TRY(lt_optim_check_storage("lion", "param", param));
  lion_scalars s = {
      .decay = 1.0 - lr * weight_decay,
      .neg_lr = -lr,
      .beta1 = beta1,
      .one_minus_beta1 = 1.0 - beta1,
      .beta2 = beta2,
      .one_minus_beta2 = 1.0 - beta2,
  };
  int rc = -1;
  lt_tensor *pc = lt_begin_inplace(param), *mc = lt_begin_inplace(m), *gc = lt_tensor_new();
  if (!pc || !mc || !gc || lt_contiguous(gc, grad)) goto done;
  char *pp = lt_data_ptr(pc), *mp = lt_data_ptr(mc);
  const char *gp = lt_data_ptr(gc);
  int gdtype = gc->dtype;
  if (param->device != LT_DEVICE_CPU) {
    const lt_backend *be = lt_backend_for("lion", param->device);
    lt_optim_entry e = {.param = pp, .grad = gp, .m = mp, .n = n, .pdtype = pdtype, .gdtype = gdtype};
    rc = !be ? -1 : n > 0 ? be->lion(param->device, &e, &s) : 0;
    goto done;
  }
  int64_t nchunks = (n + LION_CHUNK - 1) / LION_CHUNK;
  if (n >= 2 * LT_PAR_GRAIN) { /* no omp construct for small work: see ew_execute */
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < nchunks; c++) lion_chunk(pp, pdtype, gp, gdtype, mp, mdtype, n, c, &s);
  } else {
    for (int64_t c = 0; c < nchunks; c++) lion_chunk(pp, pdtype, gp, gdtype, mp, mdtype, n, c, &s);
  }
  rc = 0;
done:
  rc = lt_finish_inplace(param, pc, rc);
  rc = lt_finish_inplace(m, mc, rc);
  lt_release(gc);
  return rc;
}
