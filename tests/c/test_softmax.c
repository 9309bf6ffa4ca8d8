/* test_softmax.c — softmax / log_softmax and their backwards against double references,
 * finite differences in f64, strided and in-place layouts, and bad input. */
#include "check.h"

static const int dtypes[] = {LT_F32, LT_F64, LT_BF16, LT_F16};

/* Linear (row-major) index of element k of row r when rows run along dim d of shape. */
static int64_t row_index(const lt_tensor *t, int d, int64_t r, int64_t k) {
  int64_t inner = 1;
  for (int i = d + 1; i < t->ndim; i++) inner *= t->shape[i];
  int64_t n = t->ndim ? t->shape[d] : 1;
  return r / inner * n * inner + r % inner + k * inner;
}

/* Reference forward or backward of one row in double: out[k] for k < n. */
static void reference_row(int kind, const double *x, const double *y, int64_t n, double *out, double *scale) {
  double m = -INFINITY, s = 0, sabs = 0;
  if (kind < 2) {
    for (int64_t k = 0; k < n; k++) m = fmax(m, x[k]);
    for (int64_t k = 0; k < n; k++) s += exp(x[k] - m);
    for (int64_t k = 0; k < n; k++) {
      out[k] = kind == 0 ? exp(x[k] - m) / s : x[k] - m - log(s);
      scale[k] = kind == 0 ? fabs(out[k]) : fabs(x[k]) + fabs(m + log(s)) + 1;
    }
  } else if (kind == 2) { /* x = grad_out, y = softmax output */
    for (int64_t k = 0; k < n; k++) s += x[k] * y[k], sabs += fabs(x[k] * y[k]);
    for (int64_t k = 0; k < n; k++) out[k] = y[k] * (x[k] - s), scale[k] = fabs(y[k]) * (fabs(x[k]) + sabs);
  } else { /* y = log_softmax output */
    for (int64_t k = 0; k < n; k++) s += x[k], sabs += fabs(x[k]);
    for (int64_t k = 0; k < n; k++) out[k] = x[k] - exp(y[k]) * s, scale[k] = fabs(x[k]) + exp(y[k]) * sabs;
  }
}

static int run_kind(int kind, lt_tensor *out, const lt_tensor *x, const lt_tensor *y, int dim) {
  switch (kind) {
  case 0: return lt_softmax(out, x, dim);
  case 1: return lt_log_softmax(out, x, dim);
  case 2: return lt_softmax_backward(out, x, y, dim);
  default: return lt_log_softmax_backward(out, x, y, dim);
  }
}

/* Checks `out` (already computed by kind over dim) against the reference on every row. */
static void check_against_reference(int kind, const lt_tensor *out, const lt_tensor *x, const lt_tensor *y, int dim,
                                    const char *what) {
  int d = dim < 0 ? dim + x->ndim : dim;
  int64_t n = x->ndim ? x->shape[d] : 1, rows = n ? lt_numel(x) / n : 0;
  double *xr = malloc(sizeof(double) * (n + 1) * 4), *yr = xr + n + 1, *want = yr + n + 1, *scale = want + n + 1;
  double tol = check_tol(x->dtype) * (x->dtype == LT_F32 ? 2 : 1), worst = 0;
  double atol = x->dtype == LT_F16 ? 6e-8 : 0; /* f16 subnormals are spaced 6e-8 apart */
  for (int64_t r = 0; r < rows; r++) {
    for (int64_t k = 0; k < n; k++) {
      xr[k] = check_at(x, row_index(x, d, r, k));
      yr[k] = y ? check_at(y, row_index(y, d, r, k)) : 0;
    }
    reference_row(kind, xr, yr, n, want, scale);
    for (int64_t k = 0; k < n; k++) {
      double got = check_at(out, row_index(out, d, r, k));
      double err = fmax(0, fabs(got - want[k]) - atol) / (scale[k] + 1e-30);
      if (isnan(got) != isnan(want[k])) err = INFINITY;
      worst = err > worst ? err : worst;
    }
  }
  char s[LT_SHAPE_STR];
  CHECK(worst <= tol, "%s kind %d %s %s dim %d: rel err %g", what, kind, lt_dtype_name(x->dtype),
        lt_shape_str(s, x->ndim, x->shape), dim, worst);
  free(xr);
}

static void test_random(void) {
  for (int trial = 0; trial < 240; trial++) {
    int dtype = dtypes[trial % 4], kind = trial / 4 % 4, ndim = (int)check_randint(0, 4);
    int64_t shape[3];
    for (int i = 0; i < ndim; i++) shape[i] = check_randint(1, 12);
    if (ndim && trial % 7 == 0) shape[ndim - 1] = check_randint(200, 700); /* long rows */
    int dim = ndim ? (int)check_randint(-ndim, ndim) : 0;
    lt_tensor *x0 = check_random(ndim, shape, dtype, -4, 4), *y0 = NULL;
    if (kind >= 2) { /* a genuine forward output to differentiate through */
      lt_tensor *src = check_random(ndim, shape, dtype, -3, 3);
      y0 = lt_tensor_new();
      CHECK_OK(run_kind(kind - 2, y0, src, NULL, dim));
      lt_release(src);
    }
    int layout = trial % 3; /* 0 contiguous, 1 non-contiguous inputs, 2 non-contiguous out too */
    lt_tensor *x = layout ? check_noncontig(x0) : (lt_retain(x0), x0);
    lt_tensor *y = y0 ? (layout ? check_noncontig(y0) : (lt_retain(y0), y0)) : NULL;
    lt_tensor *out = lt_tensor_new();
    if (layout == 2) { /* a strided out of its own (fresh storage, whatever ndim) */
      lt_tensor *fresh = check_random(ndim, shape, dtype, 0, 1);
      lt_release(out);
      out = check_noncontig(fresh);
      lt_release(fresh);
    }
    int rc = run_kind(kind, out, x, y, dim);
    CHECK(rc == 0, "kind %d: %s", kind, lt_last_error());
    if (rc == 0) check_against_reference(kind, out, x0, y0, dim, "random");
    lt_release(x0), lt_release(y0), lt_release(x), lt_release(y), lt_release(out);
  }
}

/* In place (out is the input) along the innermost dim and along dim 0. */
static void test_in_place(void) {
  int64_t shape[2] = {37, 53};
  for (int kind = 0; kind < 4; kind++)
    for (int dim = 0; dim < 2; dim++) {
      lt_tensor *x = check_random(2, shape, LT_F32, -3, 3), *x0 = lt_tensor_new(), *y = NULL;
      lt_empty(x0, 2, shape, LT_F32, LT_DEVICE_CPU), lt_copy(x0, x);
      if (kind >= 2) {
        y = lt_tensor_new();
        CHECK_OK(run_kind(kind - 2, y, x0, NULL, dim));
      }
      CHECK_OK(run_kind(kind, x, x, y, dim));
      check_against_reference(kind, x, x0, y, dim, "in place");
      lt_release(x), lt_release(x0), lt_release(y);
    }
}

/* L(x) = sum(w * f(x)); backward(w, f(x)) must match central differences in f64. */
static void test_finite_differences(void) {
  int64_t shapes[3][3] = {{3, 5, 4}, {2, 7, 1}, {6, 1, 3}};
  for (int s = 0; s < 3; s++)
    for (int log = 0; log < 2; log++)
      for (int dim = -1; dim < 3; dim += 2) {
        lt_tensor *x = check_random(3, shapes[s], LT_F64, -2, 2), *w = check_random(3, shapes[s], LT_F64, -1, 1);
        lt_tensor *y = lt_tensor_new(), *g = lt_tensor_new(), *yp = lt_tensor_new();
        CHECK_OK(run_kind(log, y, x, NULL, dim));
        CHECK_OK(run_kind(2 + log, g, w, y, dim));
        double worst = 0, h = 1e-6, *px = lt_data_ptr(x);
        for (int64_t j = 0; j < lt_numel(x); j++) {
          double keep = px[j], lp = 0, lm = 0;
          px[j] = keep + h;
          run_kind(log, yp, x, NULL, dim);
          for (int64_t i = 0; i < lt_numel(x); i++) lp += check_at(w, i) * check_at(yp, i);
          px[j] = keep - h;
          run_kind(log, yp, x, NULL, dim);
          for (int64_t i = 0; i < lt_numel(x); i++) lm += check_at(w, i) * check_at(yp, i);
          px[j] = keep;
          worst = fmax(worst, fabs((lp - lm) / (2 * h) - check_at(g, j)));
        }
        CHECK(worst < 1e-7, "%ssoftmax backward vs finite differences, shape %d dim %d: err %g", log ? "log_" : "", s,
              dim, worst);
        lt_release(x), lt_release(w), lt_release(y), lt_release(g), lt_release(yp);
      }
}

static void test_special_values(void) {
  /* large logits are stable; -inf gives exact zeros; a NaN spreads over its row */
  int64_t two[2] = {3, 4};
  lt_tensor *x = lt_tensor_new(), *y = lt_tensor_new(), *ly = lt_tensor_new();
  CHECK_OK(lt_empty(x, 2, two, LT_F32, LT_DEVICE_CPU));
  float v[12] = {1000, 1001, 999, 1000, 0, -INFINITY, 2, -INFINITY, 1, NAN, 2, 3};
  CHECK_OK(lt_copy_from_buffer(x, v, LT_F32, 12));
  CHECK_OK(lt_softmax(y, x, 1));
  CHECK_OK(lt_log_softmax(ly, x, -1));
  double e = exp(1.0), s = 2 + e + 1 / e;
  CHECK(fabs(check_at(y, 1) - e / s) < 1e-6 && fabs(check_at(ly, 1) - (1 - log(s))) < 1e-5, "softmax of 1000s: %g",
        check_at(y, 1));
  CHECK(check_at(y, 5) == 0 && check_at(y, 7) == 0 && fabs(check_at(y, 6) - 1 / (1 + exp(-2.0))) < 1e-6,
        "-inf entries get exactly 0");
  CHECK(check_at(ly, 5) == -INFINITY, "log_softmax of -inf is -inf");
  CHECK(isnan(check_at(y, 8)) && isnan(check_at(y, 11)) && isnan(check_at(ly, 8)), "NaN spreads over its row");
  lt_release(x), lt_release(y), lt_release(ly);

  /* a scalar: softmax 1, log_softmax 0; an empty dim is fine */
  lt_tensor *sc = check_random(0, NULL, LT_F32, -5, 5), *o = lt_tensor_new(), *lo = lt_tensor_new();
  CHECK_OK(lt_softmax(o, sc, 0));
  CHECK_OK(lt_log_softmax(lo, sc, -1));
  CHECK(check_at(o, 0) == 1 && check_at(lo, 0) == 0, "scalar softmax");
  int64_t empty[2] = {4, 0};
  lt_tensor *ex = check_random(2, empty, LT_F32, 0, 1), *eo = lt_tensor_new();
  CHECK_OK(lt_softmax(eo, ex, 1));
  CHECK(eo->shape[0] == 4 && eo->shape[1] == 0, "empty softmax keeps the shape");
  lt_release(sc), lt_release(o), lt_release(lo), lt_release(ex), lt_release(eo);

  /* long strided rows (softmax over dim 0 of (20000, 3)) take fewer rows per scratch block */
  int64_t tall[2] = {20000, 3};
  lt_tensor *t = check_random(2, tall, LT_F32, -8, 8), *ts = lt_tensor_new(), *tl = lt_tensor_new();
  CHECK_OK(lt_softmax(ts, t, 0));
  check_against_reference(0, ts, t, NULL, 0, "tall");
  CHECK_OK(lt_log_softmax(tl, t, -2));
  check_against_reference(1, tl, t, NULL, -2, "tall");
  lt_release(t), lt_release(ts), lt_release(tl);

  /* one long row sums to 1 */
  int64_t n = 1 << 20;
  lt_tensor *big = check_random(1, &n, LT_F32, -10, 10), *p = lt_tensor_new();
  CHECK_OK(lt_softmax(p, big, 0));
  double total = 0;
  float *pp = lt_data_ptr(p);
  for (int64_t i = 0; i < n; i++) total += pp[i];
  CHECK(fabs(total - 1) < 1e-5, "a row of 1M sums to %.9f", total);
  lt_release(big), lt_release(p);
}

static void test_errors(void) {
  int64_t s23[2] = {2, 3}, s32[2] = {3, 2};
  lt_tensor *a = check_random(2, s23, LT_F32, 0, 1), *i = check_random(2, s23, LT_I32, 0, 3);
  lt_tensor *d = check_random(2, s23, LT_F64, 0, 1), *t = check_random(2, s32, LT_F32, 0, 1);
  lt_tensor *out = lt_tensor_new(), *undef = lt_tensor_new();
  CHECK_ERR(lt_softmax(out, i, 0), "softmax: needs a floating dtype, got i32");
  CHECK_ERR(lt_log_softmax(out, a, 2), "log_softmax: dim 2 out of range for a 2-d tensor");
  CHECK_ERR(lt_softmax(out, undef, 0), "softmax: input is undefined");
  CHECK_ERR(lt_softmax_backward(out, a, d, 1), "softmax_backward: dtype mismatch: f32 vs f64");
  CHECK_ERR(lt_log_softmax_backward(out, a, t, 1), "log_softmax_backward: grad_out is [2,3] f32 cpu but y is [3,2]");
  CHECK_ERR(lt_softmax_backward(out, a, NULL, 1), "softmax_backward: y is NULL");
  CHECK_ERR(lt_softmax(t, a, 1), "softmax: out is [3,2] f32 cpu, expected [2,3] f32 cpu");
  lt_tensor cuda = *a;
  cuda.device = 15; /* refused before any kernel could read its host pointer */
  CHECK_ERR(lt_softmax(out, &cuda, 1),
            strstr(lt_build_info(), "cuda: built") ? "is not available" : "built without CUDA");
  CHECK(!lt_is_defined(out), "failed softmax leaves out undefined");
  lt_release(a), lt_release(i), lt_release(d), lt_release(t), lt_release(out), lt_release(undef);
}

int main(void) {
  test_random();
  test_in_place();
  test_finite_differences();
  test_special_values();
  test_errors();
  return check_summary();
}
