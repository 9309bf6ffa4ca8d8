/* layer_norm_cases.h — the cases LayerNorm (center = 1) and RMSNorm (center = 0, LayerNorm without
 * centering, one plan and one kernel) share, for tests/c/test_layer_norm.c and test_rms_norm.c:
 *   plain:  forward against a naive double reference, backward against central finite
 *           differences in f64, every dtype, layouts (non-contiguous inputs and outputs);
 *   fused with the residual add (add_layer_norm / add_rms_norm, *_backward_add): forward
 *           against naive double loops and bitwise against the unfused composition (add, then
 *           norm), backward against the double formula, central finite differences in f64 and
 *           the unfused composition (norm backward, then add), every dtype, non-contiguous inputs
 *           and outputs, in place.
 * run_norm_cases(center) runs them all for one op. */
#ifndef LUTRA_TEST_LAYER_NORM_CASES_H
#define LUTRA_TEST_LAYER_NORM_CASES_H
#include "check.h"

static const double EPS = 1e-5;

static double *to_doubles(const lt_tensor *t) {
  int64_t n = lt_numel(t);
  double *v = malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
  if (lt_copy_to_buffer(t, v, LT_F64, n)) fprintf(stderr, "to_doubles: %s\n", lt_last_error());
  return v;
}

/* y = (x - mu) * rstd * w + b per row (mu = 0 and no centering for rms_norm). w, b may be NULL. */
static void ref_norm(double *y, double *mu, double *rs, const double *x, const double *w, const double *b, int64_t N,
                     int64_t C, int center) {
  for (int64_t i = 0; i < N; i++) {
    const double *xr = x + i * C;
    double m = 0, v = 0;
    if (center) {
      for (int64_t j = 0; j < C; j++) m += xr[j];
      m /= (double)C;
    }
    for (int64_t j = 0; j < C; j++) v += (xr[j] - m) * (xr[j] - m);
    double r = 1.0 / sqrt(v / (double)C + EPS);
    for (int64_t j = 0; j < C; j++) y[i * C + j] = (xr[j] - m) * r * (w ? w[j] : 1.0) + (b ? b[j] : 0.0);
    mu[i] = m;
    rs[i] = r;
  }
}

static int forward(int center, lt_tensor *out, lt_tensor *mean, lt_tensor *rstd, const lt_tensor *x, const lt_tensor *w,
                   const lt_tensor *b) {
  return center ? lt_layer_norm_forward(out, mean, rstd, x, w, b, EPS) : lt_rms_norm_forward(out, rstd, x, w, EPS);
}

static int backward(int center, lt_tensor *dx, lt_tensor *dw, lt_tensor *db, const lt_tensor *dout, const lt_tensor *x,
                    const lt_tensor *w, const lt_tensor *mean, const lt_tensor *rstd) {
  return center ? lt_layer_norm_backward(dx, dw, db, dout, x, w, mean, rstd)
                : lt_rms_norm_backward(dx, dw, dout, x, w, rstd);
}

/* Forward of every dtype (weight of x's dtype or f32), with and without weight/bias, on a
 * non-contiguous x and a non-contiguous out, against the double reference. */
static void test_forward(int center, int dtype, int wdtype, int64_t B, int64_t T, int64_t C, int with_w,
                         int noncontig) {
  const char *name = center ? "layer_norm" : "rms_norm";
  int64_t shape[3] = {B, T, C}, N = B * T, cshape[1] = {C};
  lt_tensor *x0 = check_random(3, shape, dtype, -2, 3);
  lt_tensor *x = noncontig ? check_noncontig(x0) : x0;
  lt_tensor *w = with_w ? check_random(1, cshape, wdtype, 0.5, 1.5) : NULL;
  lt_tensor *b = with_w && center ? check_random(1, cshape, wdtype, -1, 1) : NULL;
  lt_tensor *out = lt_tensor_new(), *mean = lt_tensor_new(), *rstd = lt_tensor_new(), *tmp = lt_tensor_new();
  if (noncontig) { /* a defined, non-contiguous out: the transpose of a (C, T, B) buffer */
    int64_t tshape[3] = {C, T, B};
    lt_empty(tmp, 3, tshape, dtype, LT_DEVICE_CPU);
    lt_transpose(out, tmp, 0, 2);
  }
  CHECK_OK(forward(center, out, mean, rstd, x, w, b));
  double *xv = to_doubles(x0), *wv = w ? to_doubles(w) : NULL, *bv = b ? to_doubles(b) : NULL;
  double *want = malloc((size_t)(N * C) * sizeof(double)), mu[64], rs[64];
  ref_norm(want, mu, rs, xv, wv, bv, N, C, center);
  double tol = check_tol(dtype) * 4, worst = 0;
  int bad = 0;
  for (int64_t i = 0; i < N * C; i++) {
    double got = check_at(out, i);
    if (!check_close(got, want[i], tol, tol)) bad++;
    worst = fmax(worst, fabs(got - want[i]));
  }
  CHECK(bad == 0, "%s %s w %s [%lld,%lld,%lld] w=%d nc=%d: %d bad, max err %g", name, lt_dtype_name(dtype),
        lt_dtype_name(wdtype), (long long)B, (long long)T, (long long)C, with_w, noncontig, bad, worst);
  /* saved statistics: from the f32 (or f64) computation, so f32 tolerance at best */
  double stol = fmax(check_tol(dtype), 1e-5) * 4;
  bad = 0;
  for (int64_t i = 0; i < N; i++) {
    if (center && !check_close(check_at(mean, i), mu[i], stol, stol)) bad++;
    if (!check_close(check_at(rstd, i), rs[i], stol, 0)) bad++;
  }
  CHECK(bad == 0 && rstd->dtype == LT_F32 && rstd->ndim == 1 && rstd->shape[0] == N, "%s %s saved stats: %d bad", name,
        lt_dtype_name(dtype), bad);
  free(xv), free(wv), free(bv), free(want);
  if (x != x0) lt_release(x);
  lt_release(x0), lt_release(w), lt_release(b), lt_release(out), lt_release(mean), lt_release(rstd), lt_release(tmp);
}

/* sum(out * R) for the f64 op at the given inputs. */
static double functional(int center, const lt_tensor *x, const lt_tensor *w, const lt_tensor *b, const double *R) {
  lt_tensor *out = lt_tensor_new();
  forward(center, out, NULL, NULL, x, w, b);
  double s = 0;
  const double *o = lt_data_ptr(out);
  for (int64_t i = 0, n = lt_numel(out); i < n; i++) s += o[i] * R[i];
  lt_release(out);
  return s;
}

/* Central differences of f = sum(out * R) in f64 with respect to every element of t. */
static void check_fd(int center, const char *what, lt_tensor *t, const lt_tensor *grad, const lt_tensor *x,
                     const lt_tensor *w, const lt_tensor *b, const double *R, double rtol) {
  double *p = lt_data_ptr(t), h = 1e-5, worst = 0;
  int bad = 0;
  for (int64_t i = 0, n = lt_numel(t); i < n; i++) {
    double keep = p[i];
    p[i] = keep + h;
    double fp = functional(center, x, w, b, R);
    p[i] = keep - h;
    double fm = functional(center, x, w, b, R);
    p[i] = keep;
    double fd = (fp - fm) / (2 * h), got = check_at(grad, i);
    if (!check_close(got, fd, rtol, rtol / 10)) bad++;
    worst = fmax(worst, fabs(got - fd));
  }
  CHECK(bad == 0, "%s d%s vs finite differences (rtol %g): %d bad, max err %g", center ? "layer_norm" : "rms_norm",
        what, rtol, bad, worst);
}

/* f64 saved statistics (a defined f64 mean/rstd) keep backward exact to ~1e-10; the default f32
 * ones limit it to ~1e-7. */
static void test_backward_fd(int center, int64_t N, int64_t C, int stat_dtype) {
  int64_t shape[2] = {N, C}, cshape[1] = {C}, nshape[1] = {N};
  double rtol = stat_dtype == LT_F64 ? 1e-7 : 1e-5;
  lt_tensor *x = check_random(2, shape, LT_F64, -2, 2), *w = check_random(1, cshape, LT_F64, 0.5, 1.5);
  lt_tensor *b = center ? check_random(1, cshape, LT_F64, -1, 1) : NULL, *dout = check_random(2, shape, LT_F64, -1, 1);
  lt_tensor *out = lt_tensor_new(), *mean = lt_tensor_new(), *rstd = lt_tensor_new();
  lt_tensor *dx = lt_tensor_new(), *dw = lt_tensor_new(), *db = center ? lt_tensor_new() : NULL;
  if (stat_dtype == LT_F64)
    lt_empty(mean, 1, nshape, LT_F64, LT_DEVICE_CPU), lt_empty(rstd, 1, nshape, LT_F64, LT_DEVICE_CPU);
  CHECK_OK(forward(center, out, mean, rstd, x, w, b));
  CHECK(rstd->dtype == stat_dtype, "saved rstd is %s", lt_dtype_name(rstd->dtype));
  CHECK_OK(backward(center, dx, dw, db, dout, x, w, mean, rstd));
  double *R = to_doubles(dout);
  check_fd(center, "x", x, dx, x, w, b, R, rtol);
  check_fd(center, "weight", w, dw, x, w, b, R, rtol);
  if (center) check_fd(center, "bias", b, db, x, w, b, R, rtol);
  /* without weight: dx is the gradient of the unscaled norm */
  lt_tensor *dx2 = lt_tensor_new();
  CHECK_OK(backward(center, dx2, NULL, NULL, dout, x, NULL, mean, rstd));
  check_fd(center, "x (no weight)", x, dx2, x, NULL, NULL, R, rtol);
  free(R);
  lt_release(x), lt_release(w), lt_release(b), lt_release(dout), lt_release(out), lt_release(mean);
  lt_release(rstd), lt_release(dx), lt_release(dw), lt_release(db), lt_release(dx2);
}

/* Lower-precision backward against the f64 backward on the same (rounded) values. */
static void test_backward_dtype(int center, int dtype, int wdtype, int64_t N, int64_t C, int noncontig) {
  int64_t shape[2] = {N, C}, cshape[1] = {C};
  lt_tensor *x = check_random(2, shape, dtype, -2, 2), *w = check_random(1, cshape, wdtype, 0.5, 1.5);
  lt_tensor *b = check_random(1, cshape, wdtype, -1, 1), *dout = check_random(2, shape, dtype, -1, 1);
  lt_tensor *x64 = lt_tensor_new(), *w64 = lt_tensor_new(), *b64 = lt_tensor_new(), *d64 = lt_tensor_new();
  lt_empty(x64, 2, shape, LT_F64, LT_DEVICE_CPU), lt_copy(x64, x);
  lt_empty(w64, 1, cshape, LT_F64, LT_DEVICE_CPU), lt_copy(w64, w);
  lt_empty(b64, 1, cshape, LT_F64, LT_DEVICE_CPU), lt_copy(b64, b);
  lt_empty(d64, 2, shape, LT_F64, LT_DEVICE_CPU), lt_copy(d64, dout);
  lt_tensor *t[12];
  for (int i = 0; i < 12; i++) t[i] = lt_tensor_new();
  lt_tensor *xn = noncontig ? check_noncontig(x) : x, *dn = noncontig ? check_noncontig(dout) : dout;
  CHECK_OK(forward(center, t[0], t[1], t[2], xn, w, center ? b : NULL));
  CHECK_OK(backward(center, t[3], t[4], center ? t[5] : NULL, dn, xn, w, t[1], t[2]));
  CHECK_OK(forward(center, t[6], t[7], t[8], x64, w64, center ? b64 : NULL));
  CHECK_OK(backward(center, t[9], t[10], center ? t[11] : NULL, d64, x64, w64, t[7], t[8]));
  for (int k = 0; k < (center ? 3 : 2); k++) {
    lt_tensor *got = t[3 + k], *want = t[9 + k];
    int want_dtype = k == 0 ? dtype : wdtype;
    double tol = fmax(check_tol(dtype), check_tol(want_dtype)) * (dtype == LT_F32 ? 8 : 16);
    double scale = 0, worst = 0; /* dweight/dbias sum N rows: compare against the largest entry */
    for (int64_t i = 0; i < lt_numel(want); i++) scale = fmax(scale, fabs(check_at(want, i)));
    for (int64_t i = 0; i < lt_numel(want); i++) worst = fmax(worst, fabs(check_at(got, i) - check_at(want, i)));
    CHECK(worst <= tol * fmax(scale, 1) && got->dtype == want_dtype, "%s backward %s w %s output %d: max err %g of %g",
          center ? "layer_norm" : "rms_norm", lt_dtype_name(dtype), lt_dtype_name(wdtype), k, worst, scale);
  }
  if (xn != x) lt_release(xn);
  if (dn != dout) lt_release(dn);
  for (int i = 0; i < 12; i++) lt_release(t[i]);
  lt_release(x), lt_release(w), lt_release(b), lt_release(dout);
  lt_release(x64), lt_release(w64), lt_release(b64), lt_release(d64);
}

/* ---- fused with the residual add ---------------------------------------------------------- */

/* v rounded to dtype (what a tensor of that dtype holds). */
static double round_to(int dtype, double v) {
  unsigned char buf[8];
  lt_store_f64(buf, dtype, 0, v);
  return lt_load_f64(buf, dtype, 0);
}

static int fwd(int center, lt_tensor *res, lt_tensor *out, lt_tensor *mean, lt_tensor *rstd, const lt_tensor *x,
               const lt_tensor *r, const lt_tensor *w, const lt_tensor *b) {
  return center ? lt_add_layer_norm_forward(res, out, mean, rstd, x, r, w, b, EPS)
                : lt_add_rms_norm_forward(res, out, rstd, x, r, w, EPS);
}

static int bwd(int center, lt_tensor *dx, lt_tensor *dw, lt_tensor *db, const lt_tensor *dout, const lt_tensor *dres,
               const lt_tensor *x, const lt_tensor *w, const lt_tensor *mean, const lt_tensor *rstd) {
  return center ? lt_layer_norm_backward_add(dx, dw, db, dout, dres, x, w, mean, rstd)
                : lt_rms_norm_backward_add(dx, dw, dout, dres, x, w, rstd);
}

/* x, residual (N, C) doubles -> res (rounded to dtype), y, mean, rstd; the backward of
 * L = sum(y * dy) + sum(res * dres): dx, dw, db. */
static void reference(int center, int dtype, int64_t N, int64_t C, const double *x, const double *r, const double *w,
                      const double *b, const double *dy, const double *dres, double *res, double *y, double *dx,
                      double *dw, double *db) {
  for (int64_t j = 0; j < C; j++) dw[j] = db[j] = 0;
  for (int64_t i = 0; i < N; i++) {
    double m = 0, v = 0, sg = 0, sgx = 0;
    for (int64_t j = 0; j < C; j++) res[i * C + j] = round_to(dtype, x[i * C + j] + r[i * C + j]);
    const double *xr = res + i * C;
    if (center) {
      for (int64_t j = 0; j < C; j++) m += xr[j];
      m /= (double)C;
    }
    for (int64_t j = 0; j < C; j++) v += (xr[j] - m) * (xr[j] - m);
    double rs = 1.0 / sqrt(v / (double)C + EPS);
    for (int64_t j = 0; j < C; j++) {
      double xhat = (xr[j] - m) * rs, g = dy[i * C + j] * w[j];
      y[i * C + j] = xhat * w[j] + b[j];
      sg += g;
      sgx += g * xhat;
      dw[j] += dy[i * C + j] * xhat;
      db[j] += dy[i * C + j];
    }
    for (int64_t j = 0; j < C; j++) {
      double xhat = (xr[j] - m) * rs, g = dy[i * C + j] * w[j];
      dx[i * C + j] = rs * (g - (center ? sg / (double)C : 0) - xhat * sgx / (double)C) + (dres ? dres[i * C + j] : 0);
    }
  }
}

static double max_rel_err(const lt_tensor *t, const double *want, int64_t n) {
  double worst = 0, scale = 1;
  for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs(want[i]));
  for (int64_t i = 0; i < n; i++) worst = fmax(worst, fabs(check_at(t, i) - want[i]) / scale);
  return worst;
}

static bool same_values(const lt_tensor *a, const lt_tensor *b) {
  if (lt_numel(a) != lt_numel(b)) return false;
  for (int64_t i = 0, n = lt_numel(a); i < n; i++)
    if (check_at(a, i) != check_at(b, i) && !(isnan(check_at(a, i)) && isnan(check_at(b, i)))) return false;
  return true;
}

/* One case: fused forward and backward on (B, T, C) of dtype (weight f32 or dtype), inputs
 * and outputs contiguous or not, against the double reference and the unfused ops. */
static void test_case(int center, int dtype, int wdtype, int64_t B, int64_t T, int64_t C, int noncontig,
                      int with_dres) {
  const char *name = center ? "add_layer_norm" : "add_rms_norm";
  int64_t shape[3] = {B, T, C}, N = B * T, cshape[1] = {C};
  lt_tensor *x0 = check_random(3, shape, dtype, -2, 3), *r0 = check_random(3, shape, dtype, -1, 1);
  lt_tensor *dy0 = check_random(3, shape, dtype, -1, 1), *dres0 = check_random(3, shape, dtype, -1, 1);
  lt_tensor *x = noncontig ? check_noncontig(x0) : x0, *r = noncontig ? check_noncontig(r0) : r0;
  lt_tensor *dy = noncontig ? check_noncontig(dy0) : dy0, *dres = noncontig ? check_noncontig(dres0) : dres0;
  lt_tensor *w = check_random(1, cshape, wdtype, 0.5, 1.5), *b = center ? check_random(1, cshape, wdtype, -1, 1) : NULL;
  lt_tensor *res = lt_tensor_new(), *out = lt_tensor_new(), *mean = lt_tensor_new(), *rstd = lt_tensor_new();
  lt_tensor *dx = lt_tensor_new(), *dw = lt_tensor_new(), *db = center ? lt_tensor_new() : NULL, *tmp = lt_tensor_new();
  if (noncontig) { /* a defined, non-contiguous res_out: the transpose of a (C, T, B) buffer */
    int64_t tshape[3] = {C, T, B};
    lt_empty(tmp, 3, tshape, dtype, LT_DEVICE_CPU);
    lt_transpose(res, tmp, 0, 2);
  }
  if (dtype == LT_F64) { /* f64 statistics keep the backward in f64 */
    int64_t nshape[1] = {N};
    lt_empty(mean, 1, nshape, LT_F64, LT_DEVICE_CPU), lt_empty(rstd, 1, nshape, LT_F64, LT_DEVICE_CPU);
  }
  CHECK_OK(fwd(center, res, out, mean, rstd, x, r, w, b));
  CHECK_OK(bwd(center, dx, dw, db, dy, with_dres ? dres : NULL, res, w, mean, rstd));
  double *xv = to_doubles(x0), *rv = to_doubles(r0), *wv = to_doubles(w), *dyv = to_doubles(dy0);
  double *dresv = to_doubles(dres0), *bv = calloc((size_t)C, sizeof(double));
  if (b) lt_copy_to_buffer(b, bv, LT_F64, C);
  double *res_ref = malloc((size_t)(N * C) * sizeof(double)), *y_ref = malloc((size_t)(N * C) * sizeof(double));
  double *dx_ref = malloc((size_t)(N * C) * sizeof(double));
  double *dw_ref = malloc((size_t)C * sizeof(double)), *db_ref = malloc((size_t)C * sizeof(double));
  reference(center, dtype, N, C, xv, rv, wv, bv, dyv, with_dres ? dresv : NULL, res_ref, y_ref, dx_ref, dw_ref, db_ref);
  /* res is one rounding of the sum (the reference rounds through f64 first: a rare double
   * rounding may move it by an ulp); the rest within the dtype's tolerance (16-bit: rounded
   * inputs of each step, several roundings) */
  double tol = dtype == LT_F64 ? 1e-12 : dtype == LT_F32 ? 2e-5 : dtype == LT_BF16 ? 2e-2 : 4e-3;
  double e_res = max_rel_err(res, res_ref, N * C);
  double res_tol = dtype == LT_F64 ? 1e-15 : dtype == LT_F32 ? 1e-7 : tol;
  CHECK(e_res <= res_tol, "%s %s res C=%lld: %g", name, lt_dtype_name(dtype), (long long)C, e_res);
  double e_y = max_rel_err(out, y_ref, N * C), e_dx = max_rel_err(dx, dx_ref, N * C);
  double e_dw = max_rel_err(dw, dw_ref, C), e_db = db ? max_rel_err(db, db_ref, C) : 0;
  double ptol = wdtype == LT_F32 && dtype == LT_F64 ? 2e-5 : tol; /* dw, db have the weight's dtype */
  CHECK(e_y <= tol && e_dx <= tol && e_dw <= ptol && e_db <= ptol,
        "%s %s [%lld,%lld,%lld] nc=%d: y %g dx %g dw %g db %g", name, lt_dtype_name(dtype), (long long)B, (long long)T,
        (long long)C, noncontig, e_y, e_dx, e_dw, e_db);

  /* the unfused composition: add, then the plain norm; its backward, then add dres */
  lt_tensor *s = lt_tensor_new(), *y2 = lt_tensor_new(), *m2 = lt_tensor_new(), *r2 = lt_tensor_new();
  lt_tensor *g2 = lt_tensor_new(), *dx2 = lt_tensor_new(), *dw2 = lt_tensor_new(),
            *db2 = center ? lt_tensor_new() : NULL;
  if (dtype == LT_F64) {
    int64_t nshape[1] = {N};
    lt_empty(m2, 1, nshape, LT_F64, LT_DEVICE_CPU), lt_empty(r2, 1, nshape, LT_F64, LT_DEVICE_CPU);
  }
  CHECK_OK(lt_binary(s, x, r, LT_ADD));
  CHECK_OK(center ? lt_layer_norm_forward(y2, m2, r2, s, w, b, EPS) : lt_rms_norm_forward(y2, r2, s, w, EPS));
  CHECK(same_values(s, res) && same_values(y2, out) && same_values(r2, rstd) && (!center || same_values(m2, mean)),
        "%s %s: fused forward differs from add + norm", name, lt_dtype_name(dtype));
  CHECK_OK(center ? lt_layer_norm_backward(g2, dw2, db2, dy, s, w, m2, r2)
                  : lt_rms_norm_backward(g2, dw2, dy, s, w, r2));
  if (with_dres) {
    CHECK_OK(lt_binary(dx2, g2, dres, LT_ADD));
  } else {
    lt_set(dx2, g2);
  }
  CHECK(same_values(dw2, dw) && (!center || same_values(db2, db)), "%s %s: fused dw/db differ from the plain backward",
        name, lt_dtype_name(dtype));
  /* f32/f64: the same bits (the plain dx, then the add); 16-bit: the unfused dx is rounded twice */
  double *dx2v = to_doubles(dx2);
  double e_unfused = max_rel_err(dx, dx2v, N * C);
  CHECK(dtype == LT_F32 || dtype == LT_F64 ? e_unfused == 0 : e_unfused <= 2 * tol, "%s %s: dx vs unfused %g", name,
        lt_dtype_name(dtype), e_unfused);
  free(dx2v);
  lt_release(s), lt_release(y2), lt_release(m2), lt_release(r2), lt_release(g2), lt_release(dx2), lt_release(dw2);
  lt_release(db2);

  free(xv), free(rv), free(wv), free(dyv), free(dresv), free(bv), free(res_ref), free(y_ref), free(dx_ref);
  free(dw_ref), free(db_ref);
  if (x != x0) lt_release(x), lt_release(r), lt_release(dy), lt_release(dres);
  lt_release(x0), lt_release(r0), lt_release(dy0), lt_release(dres0), lt_release(w), lt_release(b);
  lt_release(res), lt_release(out), lt_release(mean), lt_release(rstd), lt_release(dx), lt_release(dw);
  lt_release(db), lt_release(tmp);
}

/* L(x, r, w, b) = sum(y * A) + sum(res * Bm) with res = x + r, y = norm(res): its gradients from
 * the fused backward (dout = A, dres = Bm) against central differences, in f64. */
static double loss(int center, const lt_tensor *x, const lt_tensor *r, const lt_tensor *w, const lt_tensor *b,
                   const double *A, const double *Bm) {
  lt_tensor *res = lt_tensor_new(), *y = lt_tensor_new();
  fwd(center, res, y, NULL, NULL, x, r, w, b);
  double s = 0;
  for (int64_t i = 0, n = lt_numel(x); i < n; i++) s += check_at(y, i) * A[i] + check_at(res, i) * Bm[i];
  lt_release(res), lt_release(y);
  return s;
}

static void test_fd(int center, int64_t N, int64_t C) {
  int64_t shape[2] = {N, C}, cshape[1] = {C}, n = N * C;
  int64_t one[1] = {N};
  lt_tensor *x = check_random(2, shape, LT_F64, -2, 2), *r = check_random(2, shape, LT_F64, -1, 1);
  lt_tensor *w = check_random(1, cshape, LT_F64, 0.5, 1.5), *b = center ? check_random(1, cshape, LT_F64, -1, 1) : NULL;
  lt_tensor *At = check_random(2, shape, LT_F64, -1, 1), *Bt = check_random(2, shape, LT_F64, -1, 1);
  double *A = to_doubles(At), *Bm = to_doubles(Bt);
  lt_tensor *res = lt_tensor_new(), *y = lt_tensor_new(), *mean = lt_tensor_new(), *rstd = lt_tensor_new();
  lt_empty(mean, 1, one, LT_F64, LT_DEVICE_CPU), lt_empty(rstd, 1, one, LT_F64, LT_DEVICE_CPU);
  lt_tensor *dx = lt_tensor_new(), *dw = lt_tensor_new(), *db = center ? lt_tensor_new() : NULL;
  CHECK_OK(fwd(center, res, y, mean, rstd, x, r, w, b));
  CHECK_OK(bwd(center, dx, dw, db, At, Bt, res, w, mean, rstd));
  const double h = 1e-6;
  double worst = 0;
  lt_tensor *vars[4] = {x, r, w, b};
  for (int v = 0; v < 4; v++) {
    lt_tensor *t = vars[v];
    if (!t) continue;
    const lt_tensor *grad = v < 2 ? dx : v == 2 ? dw : db; /* res = x + r: both get dx */
    for (int64_t i = 0, m = lt_numel(t); i < m; i++) {
      double *p = (double *)lt_data_ptr(t) + i, keep = *p;
      *p = keep + h;
      double lp = loss(center, x, r, w, b, A, Bm);
      *p = keep - h;
      double lm = loss(center, x, r, w, b, A, Bm);
      *p = keep;
      double fd = (lp - lm) / (2 * h), an = check_at(grad, i);
      worst = fmax(worst, fabs(fd - an) / fmax(1, fabs(fd)));
    }
  }
  CHECK(worst < 1e-6, "%s fd [%lld,%lld]: worst %g", center ? "add_layer_norm" : "add_rms_norm", (long long)N,
        (long long)C, worst);
  (void)n;
  free(A), free(Bm);
  lt_release(x), lt_release(r), lt_release(w), lt_release(b), lt_release(At), lt_release(Bt), lt_release(res);
  lt_release(y), lt_release(mean), lt_release(rstd), lt_release(dx), lt_release(dw), lt_release(db);
}

/* In place: res_out = x (the residual stream updated), dx = dres (the gradient accumulated). */
static void test_inplace(int center, int dtype) {
  int64_t shape[2] = {5, 33}, cshape[1] = {33};
  lt_tensor *x = check_random(2, shape, dtype, -2, 2), *r = check_random(2, shape, dtype, -1, 1);
  lt_tensor *w = check_random(1, cshape, LT_F32, 0.5, 1.5), *dy = check_random(2, shape, dtype, -1, 1);
  lt_tensor *dres = check_random(2, shape, dtype, -1, 1);
  lt_tensor *res = lt_tensor_new(), *y = lt_tensor_new(), *mean = lt_tensor_new(), *rstd = lt_tensor_new();
  lt_tensor *y2 = lt_tensor_new(), *dx = lt_tensor_new(), *xc = lt_tensor_new(), *dresc = lt_tensor_new();
  lt_empty(xc, 2, shape, dtype, LT_DEVICE_CPU), lt_copy(xc, x);
  lt_empty(dresc, 2, shape, dtype, LT_DEVICE_CPU), lt_copy(dresc, dres);
  CHECK_OK(fwd(center, res, y, mean, rstd, x, r, w, NULL));
  CHECK_OK(fwd(center, xc, y2, NULL, NULL, xc, r, w, NULL)); /* res_out == x */
  CHECK(same_values(xc, res) && same_values(y2, y), "in-place forward differs (%s)", lt_dtype_name(dtype));
  CHECK_OK(bwd(center, dx, NULL, NULL, dy, dres, res, w, mean, rstd));
  CHECK_OK(bwd(center, dresc, NULL, NULL, dy, dresc, res, w, mean, rstd)); /* dx == dres */
  CHECK(same_values(dresc, dx), "in-place backward differs (%s)", lt_dtype_name(dtype));
  lt_release(x), lt_release(r), lt_release(w), lt_release(dy), lt_release(dres), lt_release(res), lt_release(y);
  lt_release(mean), lt_release(rstd), lt_release(y2), lt_release(dx), lt_release(xc), lt_release(dresc);
}

static void run_norm_cases(int center) {
  static const int64_t widths[] = {1, 7, 33, 257};
  static const int dtypes[] = {LT_F32, LT_F64, LT_BF16, LT_F16};
  for (int d = 0; d < 4; d++) {
    for (int k = 0; k < 4; k++) {
      int64_t B = check_randint(1, 4), T = check_randint(1, 6), C = widths[k];
      test_forward(center, dtypes[d], dtypes[d], B, T, C, 1, 0);
      test_forward(center, dtypes[d], LT_F32, B, T, C, 1, 1);
      test_forward(center, dtypes[d], dtypes[d], B, T, C, 0, k & 1);
    }
  }
  test_backward_fd(center, 3, 1, LT_F64);
  test_backward_fd(center, 3, 7, LT_F64);
  test_backward_fd(center, 4, 33, LT_F64);
  test_backward_fd(center, 4, 33, LT_F32);
  for (int d = 0; d < 4; d++) {
    test_backward_dtype(center, dtypes[d], dtypes[d], 5, 33, 0);
    test_backward_dtype(center, dtypes[d], LT_F32, 70, 257, 1); /* several row chunks */
  }
  /* fused with the residual add */
  for (int d = 0; d < 4; d++)
    for (int k = 0; k < 4; k++) {
      int64_t B = check_randint(1, 4), T = check_randint(1, 6);
      test_case(center, dtypes[d], dtypes[d], B, T, widths[k], k & 1, 1);
      test_case(center, dtypes[d], LT_F32, B, T, widths[k], !(k & 1), k == 2);
    }
  test_case(center, LT_F32, LT_F32, 8, 64, 129, 0, 1); /* above the parallel grain */
  test_case(center, LT_BF16, LT_F32, 8, 64, 129, 1, 1);
  test_fd(center, 3, 1);
  test_fd(center, 3, 7);
  test_fd(center, 4, 33);
  for (int d = 0; d < 4; d++) test_inplace(center, dtypes[d]);
}

#endif
