/* test_norm.c — LayerNorm and RMSNorm: forward against a naive double reference, backward
 * against central finite differences in f64, every dtype, layouts, determinism, bad inputs. */
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
  CHECK(bad == 0, "%s d%s vs finite differences (rtol %g): %d bad, max err %g", center ? "layer_norm" : "rms_norm", what,
        rtol, bad, worst);
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

/* dweight/dbias are bitwise the same with 1 and 2 threads; in-place forward (out == x). */
static void test_determinism_and_inplace(void) {
  int64_t shape[2] = {300, 257}, cshape[1] = {257};
  lt_tensor *x = check_random(2, shape, LT_F32, -2, 2), *w = check_random(1, cshape, LT_F32, 0.5, 1.5);
  lt_tensor *b = check_random(1, cshape, LT_F32, -1, 1), *dout = check_random(2, shape, LT_F32, -1, 1);
  lt_tensor *out = lt_tensor_new(), *mean = lt_tensor_new(), *rstd = lt_tensor_new();
  CHECK_OK(lt_layer_norm_forward(out, mean, rstd, x, w, b, EPS));
  lt_tensor *dw[2], *db[2], *dx[2];
  int threads = lt_get_num_threads();
  for (int r = 0; r < 2; r++) {
    dw[r] = lt_tensor_new(), db[r] = lt_tensor_new(), dx[r] = lt_tensor_new();
    lt_set_num_threads(r == 0 ? 1 : 2);
    CHECK_OK(lt_layer_norm_backward(dx[r], dw[r], db[r], dout, x, w, mean, rstd));
  }
  lt_set_num_threads(threads);
  CHECK(memcmp(lt_data_ptr(dw[0]), lt_data_ptr(dw[1]), 257 * 4) == 0 &&
            memcmp(lt_data_ptr(db[0]), lt_data_ptr(db[1]), 257 * 4) == 0,
        "layer_norm dweight/dbias differ between 1 and 2 threads");
  /* in place: out == x, and dx == dout */
  lt_tensor *xc = lt_tensor_new(), *dc = lt_tensor_new();
  lt_empty(xc, 2, shape, LT_F32, LT_DEVICE_CPU), lt_copy(xc, x);
  lt_empty(dc, 2, shape, LT_F32, LT_DEVICE_CPU), lt_copy(dc, dout);
  CHECK_OK(lt_layer_norm_forward(xc, NULL, NULL, xc, w, b, EPS));
  CHECK(memcmp(lt_data_ptr(xc), lt_data_ptr(out), 300 * 257 * 4) == 0, "in-place layer_norm forward differs");
  CHECK_OK(lt_layer_norm_backward(dc, NULL, NULL, dc, x, w, mean, rstd));
  CHECK(memcmp(lt_data_ptr(dc), lt_data_ptr(dx[0]), 300 * 257 * 4) == 0, "in-place layer_norm backward differs");
  for (int r = 0; r < 2; r++) lt_release(dw[r]), lt_release(db[r]), lt_release(dx[r]);
  lt_release(x), lt_release(w), lt_release(b), lt_release(dout), lt_release(out), lt_release(mean), lt_release(rstd);
  lt_release(xc), lt_release(dc);
}

static void test_bad_inputs(void) {
  int64_t shape[2] = {4, 8}, c8[1] = {8}, c7[1] = {7}, n4[1] = {4}, n5[1] = {5};
  lt_tensor *x = check_random(2, shape, LT_F32, -1, 1), *w = check_random(1, c8, LT_F32, 0, 1);
  lt_tensor *w7 = check_random(1, c7, LT_F32, 0, 1), *w64 = check_random(1, c8, LT_F64, 0, 1);
  lt_tensor *xi = check_random(2, shape, LT_I32, -3, 3), *out = lt_tensor_new(), *mean = lt_tensor_new();
  lt_tensor *rstd = lt_tensor_new(), *dx = lt_tensor_new(), *undef = lt_tensor_new();
  lt_tensor *r5 = check_random(1, n5, LT_F32, 1, 2), *r4d = check_random(1, n4, LT_I32, 1, 2);
  lt_tensor *wrong_out = check_random(2, shape, LT_F64, 0, 1), *d3 = check_random(1, c8, LT_F32, 0, 1);
  CHECK_ERR(lt_layer_norm_forward(out, mean, rstd, x, w7, NULL, EPS), "weight is [7] f32 cpu, expected [8]");
  CHECK_ERR(lt_layer_norm_forward(out, mean, rstd, x, w, w7, EPS), "bias is [7]");
  CHECK_ERR(lt_rms_norm_forward(out, rstd, x, w64, EPS), "weight is f64, expected x's dtype (f32) or f32");
  CHECK_ERR(lt_rms_norm_forward(out, rstd, xi, NULL, EPS), "expected a floating dtype");
  CHECK_ERR(lt_layer_norm_forward(out, mean, rstd, NULL, w, NULL, EPS), "x is NULL");
  CHECK_ERR(lt_layer_norm_forward(out, mean, rstd, undef, w, NULL, EPS), "x is undefined");
  CHECK_ERR(lt_layer_norm_forward(wrong_out, mean, rstd, x, w, NULL, EPS), "out is [4,8] f64 cpu, expected [4,8] f32");
  CHECK_ERR(lt_layer_norm_forward(out, mean, r4d, x, w, NULL, EPS),
            "layer_norm (rstd): out is [4] i32 cpu, expected [4] f32");
  lt_tensor *row = check_random(1, c8, LT_F32, 0, 1), *expanded = lt_tensor_new();
  lt_expand(expanded, row, 2, shape);
  CHECK_ERR(lt_layer_norm_forward(expanded, NULL, NULL, x, w, NULL, EPS), "layer_norm: out is an expanded view");
  lt_release(row), lt_release(expanded);
  CHECK_OK(lt_layer_norm_forward(out, mean, rstd, x, w, NULL, EPS));
  CHECK_ERR(lt_layer_norm_backward(dx, NULL, NULL, d3, x, w, mean, rstd), "dout is [8] f32 cpu, expected the shape");
  CHECK_ERR(lt_layer_norm_backward(dx, NULL, NULL, x, x, w, mean, r5), "rstd is [5] f32 cpu, expected f32 [4]");
  CHECK_ERR(lt_layer_norm_backward(dx, NULL, NULL, x, x, w, r4d, rstd), "mean is [4] i32 cpu, expected f32 [4]");
  CHECK_ERR(lt_layer_norm_backward(dx, NULL, NULL, x, x, w, NULL, rstd), "mean is NULL");
  CHECK_ERR(lt_rms_norm_backward(dx, undef, x, x, NULL, rstd), "dweight requested but weight is NULL");
  /* a tensor claiming cuda:15: refused before any kernel (no machine here has 16 GPUs) */
  x->device = 15;
  CHECK_ERR(lt_rms_norm_forward(out, rstd, x, NULL, EPS),
            strstr(lt_build_info(), "cuda: built") ? "is not available" : "built without CUDA");
  x->device = LT_DEVICE_CPU;
  lt_release(x), lt_release(w), lt_release(w7), lt_release(w64), lt_release(xi), lt_release(out), lt_release(mean);
  lt_release(rstd), lt_release(dx), lt_release(undef), lt_release(r5), lt_release(r4d), lt_release(wrong_out);
  lt_release(d3);
}

int main(void) {
  static const int64_t widths[] = {1, 7, 33, 257};
  static const int dtypes[] = {LT_F32, LT_F64, LT_BF16, LT_F16};
  for (int center = 0; center < 2; center++) {
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
  }
  test_determinism_and_inplace();
  test_bad_inputs();
  return check_summary();
}
