/* ops_adamw.c — one fused AdamW step on the CPU.
 *
 * The arithmetic follows torch.optim.AdamW (single-tensor path) operation by operation:
 *   param *= 1 - lr * weight_decay
 *   m = lerp(m, grad, 1 - beta1)              (an fma, as ATen's vectorised lerp)
 *   v = v * beta2 + (1 - beta2) * grad * grad
 *   param += -(lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps),  bc_k = 1 - beta_k^step
 * with the scalars formed in double and each tensor op rounded in the tensor's dtype.
 * Dtypes: f32 param/grad/m/v; f64 param/grad/m/v; or a bf16/f16 param (grad of its dtype or
 * f32) with f32 m and v, computed in f32 and rounded to the param's dtype once. */
#include "internal.h"
#include <stdlib.h>

/* Keep a*b + c as two roundings where torch rounds twice (fmaf() marks the one fused step),
 * and let sqrt vectorise (v >= 0: errno is never set). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off", "no-math-errno", "no-trapping-math")
#elif defined(__clang__)
#pragma clang fp contract(off)
#endif

typedef struct adamw_scalars {
  double decay;  /* 1 - lr * weight_decay */
  double lerp_w; /* 1 - beta1 */
  double beta2, one_minus_beta2;
  double step_size; /* lr / (1 - beta1^step) */
  double bc2_sqrt;  /* sqrt(1 - beta2^step) */
  double eps;
} adamw_scalars;

static void adamw_f32(float *p, const float *g, float *m, float *v, int64_t n, const adamw_scalars *s) {
  const float decay = (float)s->decay, w = (float)s->lerp_w, b2 = (float)s->beta2, c2 = (float)s->one_minus_beta2;
  const float neg_step = (float)-s->step_size, bc2_sqrt = (float)s->bc2_sqrt, eps = (float)s->eps;
  const bool small_w = fabsf(w) < 0.5f;
  const float coeff = small_w ? w : w - 1.0f; /* lerp(a, b, w) = fma(coeff, b - a, small_w ? a : b) */
#pragma omp simd
  for (int64_t i = 0; i < n; i++) {
    float gi = g[i], mi = m[i];
    float pi = p[i] * decay;
    mi = fmaf(coeff, gi - mi, small_w ? mi : gi);
    float vi = v[i] * b2;
    vi = vi + c2 * gi * gi;
    float denom = sqrtf(vi) / bc2_sqrt + eps;
    p[i] = pi + neg_step * mi / denom;
    m[i] = mi;
    v[i] = vi;
  }
}

static void adamw_f64(double *p, const double *g, double *m, double *v, int64_t n, const adamw_scalars *s) {
  const double w = s->lerp_w, coeff = fabs(w) < 0.5 ? w : w - 1.0, neg_step = -s->step_size;
  const bool small_w = fabs(w) < 0.5;
#pragma omp simd
  for (int64_t i = 0; i < n; i++) {
    double gi = g[i], mi = m[i];
    double pi = p[i] * s->decay;
    mi = fma(coeff, gi - mi, small_w ? mi : gi);
    double vi = v[i] * s->beta2;
    vi = vi + s->one_minus_beta2 * gi * gi;
    double denom = sqrt(vi) / s->bc2_sqrt + s->eps;
    p[i] = pi + neg_step * mi / denom;
    m[i] = mi;
    v[i] = vi;
  }
}

/* 16-bit param: blocks converted to f32, updated by adamw_f32, rounded back once. */
enum { HALF_BLOCK = 2048 };
static void adamw_half(uint16_t *p, int pdtype, const void *g, int gdtype, float *m, float *v, int64_t n,
                       const adamw_scalars *s) {
  float pf[HALF_BLOCK], gf[HALF_BLOCK];
  for (int64_t i0 = 0; i0 < n; i0 += HALF_BLOCK) {
    int64_t len = n - i0 < HALF_BLOCK ? n - i0 : HALF_BLOCK;
    for (int64_t i = 0; i < len; i++) pf[i] = pdtype == LT_BF16 ? lt_bf16_to_f32(p[i0 + i]) : lt_f16_to_f32(p[i0 + i]);
    const float *gp = gf;
    if (gdtype == LT_F32)
      gp = (const float *)g + i0;
    else
      for (int64_t i = 0; i < len; i++) gf[i] = (float)lt_load_f64(g, gdtype, i0 + i);
    adamw_f32(pf, gp, m + i0, v + i0, len, s);
    for (int64_t i = 0; i < len; i++) p[i0 + i] = pdtype == LT_BF16 ? lt_f32_to_bf16(pf[i]) : lt_f32_to_f16(pf[i]);
  }
}

enum { ADAMW_CHUNK = 16384 }; /* elements per task, a multiple of HALF_BLOCK */

/* Updates chunk c (elements [c * ADAMW_CHUNK, ...) of n) of param, m, v. */
static inline void adamw_chunk(char *pp, int pdtype, const char *gp, int gdtype, char *mp, char *vp, int mdtype,
                               int64_t n, int64_t c, const adamw_scalars *s) {
  int64_t i0 = c * ADAMW_CHUNK, len = n - i0 < ADAMW_CHUNK ? n - i0 : ADAMW_CHUNK;
  int psize = lt_dtype_size(pdtype), gsize = lt_dtype_size(gdtype), msize = lt_dtype_size(mdtype);
  if (pdtype == LT_F32)
    adamw_f32((float *)pp + i0, (const float *)gp + i0, (float *)mp + i0, (float *)vp + i0, len, s);
  else if (pdtype == LT_F64)
    adamw_f64((double *)pp + i0, (const double *)gp + i0, (double *)mp + i0, (double *)vp + i0, len, s);
  else
    adamw_half((uint16_t *)(pp + i0 * psize), pdtype, gp + i0 * gsize, gdtype, (float *)(mp + i0 * msize),
               (float *)(vp + i0 * msize), len, s);
}

int lt_adamw_step(lt_tensor *param, const lt_tensor *grad, lt_tensor *m, lt_tensor *v, double lr, double beta1,
                  double beta2, double eps, double weight_decay, int64_t step) {
  LT_TRY(lt_check_defined("adamw", "param", param));
  if (param->device != LT_DEVICE_CPU) return lt_errorf("adamw: not implemented on cuda yet");
  int pdtype = param->dtype;
  if (!lt_dtype_is_float(pdtype))
    return lt_errorf("adamw: param is %s, expected a floating dtype", lt_dtype_name(pdtype));
  if (step < 1) return lt_errorf("adamw: step must be >= 1 for bias correction, got %lld", (long long)step);
  if (!(beta1 >= 0 && beta1 < 1) || !(beta2 >= 0 && beta2 < 1))
    return lt_errorf("adamw: betas must be in [0, 1), got (%g, %g)", beta1, beta2);
  if (!(lr >= 0) || !(eps >= 0) || !(weight_decay >= 0))
    return lt_errorf("adamw: lr, eps and weight_decay must be >= 0, got lr %g eps %g weight_decay %g", lr, eps,
                     weight_decay);
  int64_t n = lt_numel(param);
  int half = pdtype == LT_BF16 || pdtype == LT_F16, mdtype = pdtype == LT_F64 ? LT_F64 : LT_F32;
  LT_TRY(lt_check_step_operand("adamw", "grad", grad, n, pdtype, half ? LT_F32 : pdtype, param));
  LT_TRY(lt_check_step_operand("adamw", "m", m, n, mdtype, mdtype, param));
  LT_TRY(lt_check_step_operand("adamw", "v", v, n, mdtype, mdtype, param));
  if (m == v || lt_data_ptr(m) == lt_data_ptr(v)) return lt_errorf("adamw: m and v must be different tensors");
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
  lt_tensor *pc = lt_begin_inplace(param), *mc = lt_begin_inplace(m), *vc = lt_begin_inplace(v), *gc = lt_tensor_new();
  if (!pc || !mc || !vc || !gc || lt_contiguous(gc, grad)) goto done;
  char *pp = lt_data_ptr(pc), *mp = lt_data_ptr(mc), *vp = lt_data_ptr(vc);
  const char *gp = lt_data_ptr(gc);
  int gdtype = gc->dtype;
  int64_t nchunks = (n + ADAMW_CHUNK - 1) / ADAMW_CHUNK;
  if (n >= 2 * LT_PAR_GRAIN) { /* no omp construct for small work: see ew_execute */
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < nchunks; c++) adamw_chunk(pp, pdtype, gp, gdtype, mp, vp, mdtype, n, c, &s);
  } else {
    for (int64_t c = 0; c < nchunks; c++) adamw_chunk(pp, pdtype, gp, gdtype, mp, vp, mdtype, n, c, &s);
  }
  rc = 0;
done:
  rc = lt_finish_inplace(param, pc, rc);
  rc = lt_finish_inplace(m, mc, rc);
  rc = lt_finish_inplace(v, vc, rc);
  lt_release(gc);
  return rc;
}
