/* test_norm_residual.c — the fused residual add + LayerNorm/RMSNorm: forward against naive
 * double loops and bitwise against the unfused composition (add, then norm), backward against
 * the double formula, central finite differences in f64 and the unfused composition (norm
 * backward, then add), every dtype, non-contiguous inputs and outputs, in place, bad inputs. */
#include "check.h"

static const double EPS = 1e-5;

static double *to_doubles(const lt_tensor *t) {
  int64_t n = lt_numel(t);
  double *v = malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
  if (lt_copy_to_buffer(t, v, LT_F64, n)) fprintf(stderr, "to_doubles: %s\n", lt_last_error());
  return v;
}

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
  CHECK_OK(center ? lt_layer_norm_backward(g2, dw2, db2, dy, s, w, m2, r2) : lt_rms_norm_backward(g2, dw2, dy, s, w, r2));
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

static void test_errors(void) {
  int64_t shape[2] = {4, 8}, other[2] = {4, 7};
  lt_tensor *x = check_random(2, shape, LT_F32, -1, 1), *r7 = check_random(2, other, LT_F32, -1, 1);
  lt_tensor *r64 = check_random(2, shape, LT_F64, -1, 1), *out = lt_tensor_new(), *res = lt_tensor_new();
  lt_tensor *mean = lt_tensor_new(), *rstd = lt_tensor_new(), *dx = lt_tensor_new();
  CHECK_ERR(lt_add_layer_norm_forward(res, out, mean, rstd, x, NULL, NULL, NULL, EPS),
            "add_layer_norm: residual is NULL");
  CHECK_ERR(lt_add_layer_norm_forward(res, out, mean, rstd, x, r7, NULL, NULL, EPS),
            "add_layer_norm: residual is [4,7] f32 cpu, expected the shape and dtype of x ([4,8] f32 cpu)");
  CHECK_ERR(lt_add_rms_norm_forward(res, out, rstd, x, r64, NULL, EPS), "add_rms_norm: residual is [4,8] f64 cpu");
  CHECK_ERR(lt_add_rms_norm_forward(NULL, out, rstd, x, x, NULL, EPS), "add_rms_norm: res_out is NULL");
  CHECK_ERR(lt_add_rms_norm_forward(out, out, rstd, x, x, NULL, EPS), "res_out and out must be different");
  CHECK_ERR(lt_add_rms_norm_forward(res, out, rstd, NULL, x, NULL, EPS), "add_rms_norm: x is NULL");
  CHECK_OK(lt_add_layer_norm_forward(res, out, mean, rstd, x, x, NULL, NULL, EPS));
  CHECK_ERR(lt_add_layer_norm_forward(res, res, NULL, NULL, x, x, NULL, NULL, EPS), "res_out and out must be different");
  CHECK_ERR(lt_layer_norm_backward_add(dx, NULL, NULL, x, r7, res, NULL, mean, rstd),
            "layer_norm_backward_add: dres is [4,7] f32 cpu, expected the shape and dtype of x");
  CHECK_ERR(lt_rms_norm_backward_add(dx, NULL, x, r64, res, NULL, rstd), "rms_norm_backward_add: dres is [4,8] f64");
  CHECK_ERR(lt_rms_norm_backward_add(dx, NULL, r7, NULL, res, NULL, rstd), "rms_norm_backward_add: dout is [4,7]");
  CHECK_ERR(lt_layer_norm_backward_add(dx, NULL, NULL, x, NULL, res, NULL, NULL, rstd), "mean is NULL");
  CHECK_OK(lt_layer_norm_backward_add(dx, NULL, NULL, x, NULL, res, NULL, mean, rstd));
  /* a residual claiming to live on cuda:15 (refused before any kernel) */
  r64->dtype = LT_F32, r64->device = 15;
  CHECK_ERR(lt_add_rms_norm_forward(res, out, rstd, x, r64, NULL, EPS),
            "add_rms_norm: residual is [4,8] f32 cuda:15, expected x's device (cpu)");
  x->device = 15; /* x on cuda:15: a CPU-only build says so; a CUDA build without that GPU too */
  bool built_with_cuda = strstr(lt_build_info(), "cuda: built with CUDA") != NULL;
  CHECK_ERR(lt_add_rms_norm_forward(res, out, rstd, x, r64, NULL, EPS),
            built_with_cuda ? "add_rms_norm: device cuda:15 is not available"
                            : "add_rms_norm: lutra was built without CUDA");
  CHECK_ERR(lt_rms_norm_backward(dx, NULL, x, x, NULL, rstd), built_with_cuda
                                                                 ? "rms_norm_backward: device cuda:15 is not available"
                                                                 : "rms_norm_backward: lutra was built without CUDA");
  x->device = LT_DEVICE_CPU, r64->device = LT_DEVICE_CPU, r64->dtype = LT_F64;
  lt_release(x), lt_release(r7), lt_release(r64), lt_release(out), lt_release(res), lt_release(mean);
  lt_release(rstd), lt_release(dx);
}

int main(void) {
  static const int64_t widths[] = {1, 7, 33, 257};
  static const int dtypes[] = {LT_F32, LT_F64, LT_BF16, LT_F16};
  for (int center = 0; center < 2; center++) {
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
  test_errors();
  return check_summary();
}
