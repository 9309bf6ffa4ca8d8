/* test_rope.c — rotary embedding against a naive double reference, inverse(rope(x)) == x, in place,
 * strided inputs and outputs, positions (T) and (B, T), bad inputs; lt_rope_freq (the caller's
 * frequencies and scale) against its naive reference, lt_rope(theta) bit for bit as lt_rope_freq of
 * theta's table, its inverse against central differences in f64. */
#include "check.h"

// x (B, T, H, D) -> naive rope in double, written to want (numel doubles, row-major)
static void rope_reference(double *want, const lt_tensor *x, const lt_tensor *pos, double theta, int inverse) {
  int64_t B = x->shape[0], T = x->shape[1], H = x->shape[2], D = x->shape[3], half = D / 2;
  for (int64_t b = 0; b < B; b++)
    for (int64_t t = 0; t < T; t++) {
      double p = (double)t;
      if (pos && pos->ndim == 1) p = check_at(pos, t);
      if (pos && pos->ndim == 2) p = check_at(pos, b * T + t);
      for (int64_t h = 0; h < H; h++) {
        int64_t row = ((b * T + t) * H + h) * D;
        for (int64_t i = 0; i < half; i++) {
          double angle = p * pow(theta, -2.0 * (double)i / (double)D) * (inverse ? -1 : 1);
          double x1 = check_at(x, row + i), x2 = check_at(x, row + i + half);
          want[row + i] = x1 * cos(angle) - x2 * sin(angle);
          want[row + i + half] = x2 * cos(angle) + x1 * sin(angle);
        }
      }
    }
}

static double tol_of(int dtype) {
  switch (dtype) {
  case LT_F64: return 1e-12;
  case LT_F32: return 2e-6;
  case LT_F16: return 2e-3;
  default: return 1e-2;
  }
}

static int count_bad(const lt_tensor *got, const double *want, double tol) {
  int bad = 0;
  for (int64_t i = 0, n = lt_numel(got); i < n; i++)
    if (!check_close(check_at(got, i), want[i], tol, tol)) {
      if (bad++ < 3) fprintf(stderr, "  element %lld: got %.9g want %.9g\n", (long long)i, check_at(got, i), want[i]);
    }
  return bad;
}

static void test_against_reference(void) {
  int dtypes[4] = {LT_F32, LT_F64, LT_BF16, LT_F16};
  for (int trial = 0; trial < 16; trial++) {
    int dt = dtypes[trial % 4];
    int64_t shape[4] = {check_randint(1, 4), check_randint(1, 12), check_randint(1, 5), 2 * check_randint(1, 40)};
    if (trial == 5) shape[3] = 128;
    int64_t B = shape[0], T = shape[1];
    lt_tensor *x = check_random(4, shape, dt, -1, 1), *pos = NULL;
    int pos_kind = trial % 3; /* NULL, (T) i32, (B, T) i64 */
    if (pos_kind == 1) pos = check_random(1, &shape[1], LT_I32, 0, 3000);
    if (pos_kind == 2) {
      int64_t ps[2] = {B, T};
      pos = check_random(2, ps, LT_I64, 0, 100000);
    }
    double theta = trial % 2 ? 10000.0 : 500000.0;
    int64_t n = lt_numel(x);
    double *want = malloc((size_t)n * sizeof(double)), *want_inv = malloc((size_t)n * sizeof(double));
    rope_reference(want, x, pos, theta, 0);
    rope_reference(want_inv, x, pos, theta, 1);
    lt_tensor *y = lt_tensor_new(), *yi = lt_tensor_new(), *back = lt_tensor_new();
    CHECK_OK(lt_rope(y, x, pos, theta, 0));
    CHECK_OK(lt_rope(yi, x, pos, theta, 1));
    CHECK(count_bad(y, want, tol_of(dt)) == 0, "trial %d: rope %s [%lld,%lld,%lld,%lld] positions kind %d", trial,
          lt_dtype_name(dt), (long long)shape[0], (long long)shape[1], (long long)shape[2], (long long)shape[3],
          pos_kind);
    CHECK(count_bad(yi, want_inv, tol_of(dt)) == 0, "trial %d: inverse rope %s", trial, lt_dtype_name(dt));
    /* inverse(rope(x)) == x (exactly up to rounding in f32/f64) */
    CHECK_OK(lt_rope(back, y, pos, theta, 1));
    if (dt == LT_F32 || dt == LT_F64) {
      double *xs = malloc((size_t)n * sizeof(double));
      for (int64_t i = 0; i < n; i++) xs[i] = check_at(x, i);
      CHECK(count_bad(back, xs, dt == LT_F64 ? 1e-13 : 1e-6) == 0, "trial %d: inverse(rope(x)) == x", trial);
      free(xs);
    }
    /* strided x (D not innermost) and a strided out give the same values */
    lt_tensor *xn = check_noncontig(x), *yn_base = lt_tensor_new(), *yn = lt_tensor_new();
    CHECK_OK(lt_empty(yn_base, 4, shape, dt, LT_DEVICE_CPU));
    lt_release(yn);
    yn = check_noncontig(yn_base);
    CHECK_OK(lt_rope(yn, xn, pos, theta, 0));
    CHECK(count_bad(yn, want, tol_of(dt)) == 0, "trial %d: strided x and out", trial);
    /* in place */
    CHECK_OK(lt_rope(xn, xn, pos, theta, 0));
    int diff = 0;
    for (int64_t i = 0; i < n; i++) diff += check_at(xn, i) != check_at(yn, i);
    CHECK(diff == 0, "trial %d: in place differs in %d elements", trial, diff);
    free(want);
    free(want_inv);
    lt_release(x);
    lt_release(pos);
    lt_release(y);
    lt_release(yi);
    lt_release(back);
    lt_release(xn);
    lt_release(yn_base);
    lt_release(yn);
  }
}

/* q as a view of a fused (B, T, 3, H, D) projection, positions (B, T) with offsets per batch */
static void test_fused_view(void) {
  int64_t B = 2, T = 33, H = 4, D = 16, fused_shape[5] = {B, T, 3, H, D}, ps[2] = {B, T};
  lt_tensor *qkv = check_random(5, fused_shape, LT_F32, -2, 2), *q = lt_tensor_new(), *pos = lt_tensor_new();
  CHECK_OK(lt_select(q, qkv, 2, 1));
  CHECK(!lt_is_contiguous(q), "the view is strided");
  CHECK_OK(lt_empty(pos, 2, ps, LT_I64, LT_DEVICE_CPU));
  for (int64_t b = 0; b < B; b++)
    for (int64_t t = 0; t < T; t++) ((int64_t *)lt_data_ptr(pos))[b * T + t] = 1000 * b + t;
  double *want = malloc((size_t)(B * T * H * D) * sizeof(double));
  rope_reference(want, q, pos, 10000, 0);
  lt_tensor *y = lt_tensor_new();
  CHECK_OK(lt_rope(y, q, pos, 10000, 0));
  CHECK(count_bad(y, want, 2e-6) == 0, "rope of a fused-projection view");
  CHECK(y->ndim == 4 && lt_is_contiguous(y), "an undefined out is allocated contiguous (B, T, H, D)");
  /* positions NULL is 0..T-1: equals batch 0 of the explicit positions */
  lt_tensor *y0 = lt_tensor_new();
  CHECK_OK(lt_rope(y0, q, NULL, 10000, 0));
  int diff = 0;
  for (int64_t i = 0; i < T * H * D; i++) diff += check_at(y0, i) != check_at(y, i);
  CHECK(diff == 0, "NULL positions are 0..T-1 (%d differ)", diff);
  /* rope at position 0 is the identity */
  lt_tensor *zero = lt_tensor_new(), *y1 = lt_tensor_new();
  CHECK_OK(lt_empty(zero, 1, &T, LT_I32, LT_DEVICE_CPU));
  CHECK_OK(lt_fill(zero, 0));
  CHECK_OK(lt_rope(y1, q, zero, 10000, 0));
  diff = 0;
  for (int64_t i = 0; i < B * T * H * D; i++) diff += check_at(y1, i) != check_at(q, i);
  CHECK(diff == 0, "position 0 is the identity (%d differ)", diff);
  free(want);
  lt_release(qkv), lt_release(q), lt_release(pos), lt_release(y), lt_release(y0), lt_release(zero), lt_release(y1);
}

/* A large case that runs the parallel path */
static void test_large(void) {
  int64_t shape[4] = {2, 300, 8, 64};
  lt_tensor *x = check_random(4, shape, LT_F32, -1, 1), *y = lt_tensor_new();
  double *want = malloc((size_t)lt_numel(x) * sizeof(double));
  rope_reference(want, x, NULL, 10000, 0);
  CHECK_OK(lt_rope(y, x, NULL, 10000, 0));
  CHECK(count_bad(y, want, 2e-6) == 0, "large f32 rope");
  free(want);
  lt_release(x), lt_release(y);
}

static void test_bad_inputs(void) {
  int64_t s4[4] = {2, 3, 2, 8}, odd[4] = {2, 3, 2, 7}, s3[3] = {2, 3, 8}, t4[1] = {4}, bt[2] = {3, 3};
  lt_tensor *x = check_random(4, s4, LT_F32, -1, 1), *xo = check_random(4, odd, LT_F32, -1, 1);
  lt_tensor *x3 = check_random(3, s3, LT_F32, -1, 1), *xi = check_random(4, s4, LT_I32, -1, 1);
  lt_tensor *p4 = check_random(1, t4, LT_I32, 0, 4), *pbt = check_random(2, bt, LT_I64, 0, 4);
  lt_tensor *pf = check_random(1, &s4[1], LT_F32, 0, 4), *out = lt_tensor_new(), *undef = lt_tensor_new();
  lt_tensor *wrong = check_random(4, s4, LT_F64, 0, 1);
  CHECK_ERR(lt_rope(out, xo, NULL, 10000, 0), "D even");
  CHECK_ERR(lt_rope(out, x3, NULL, 10000, 0), "(B, T, H, D)");
  CHECK_ERR(lt_rope(out, xi, NULL, 10000, 0), "floating dtype");
  CHECK_ERR(lt_rope(out, x, p4, 10000, 0), "positions");
  CHECK_ERR(lt_rope(out, x, pbt, 10000, 0), "(T) or (B, T)");
  CHECK_ERR(lt_rope(out, x, pf, 10000, 0), "i32 or i64");
  CHECK_ERR(lt_rope(out, x, NULL, 0, 0), "theta");
  CHECK_ERR(lt_rope(out, x, NULL, -1, 0), "theta");
  CHECK_ERR(lt_rope(out, x, NULL, NAN, 0), "theta");
  CHECK_ERR(lt_rope(out, undef, NULL, 10000, 0), "undefined");
  CHECK_ERR(lt_rope(out, NULL, NULL, 10000, 0), "NULL");
  CHECK_ERR(lt_rope(wrong, x, NULL, 10000, 0), "out is");
  CHECK_ERR(lt_rope(NULL, x, NULL, 10000, 0), "out is NULL");
  CHECK_ERR(lt_rope(out, x, undef, 10000, 0), "positions is undefined");
  lt_release(x), lt_release(xo), lt_release(x3), lt_release(xi), lt_release(p4), lt_release(pbt);
  lt_release(pf), lt_release(out), lt_release(undef), lt_release(wrong);
}

/* ---- lt_rope_freq ---------------------------------------------------------------------- */

/* Naive lt_rope_freq: angle = p * inv_freq[i], out = scale * rotation by angle (by -angle when
 * inverse), in double. */
static void freq_reference(double *want, const lt_tensor *x, const lt_tensor *pos, const double *inv_freq, double scale,
                           int inverse) {
  int64_t B = x->shape[0], T = x->shape[1], H = x->shape[2], D = x->shape[3], half = D / 2;
  for (int64_t b = 0; b < B; b++)
    for (int64_t t = 0; t < T; t++) {
      double p = !pos ? (double)t : pos->ndim == 1 ? check_at(pos, t) : check_at(pos, b * T + t);
      for (int64_t h = 0; h < H; h++) {
        int64_t row = ((b * T + t) * H + h) * D;
        for (int64_t i = 0; i < half; i++) {
          double angle = (inverse ? -p : p) * inv_freq[i];
          double x1 = check_at(x, row + i), x2 = check_at(x, row + i + half);
          want[row + i] = scale * (x1 * cos(angle) - x2 * sin(angle));
          want[row + i + half] = scale * (x2 * cos(angle) + x1 * sin(angle));
        }
      }
    }
}

/* A (n) f64 CPU tensor of values, every `stride`-th element of a larger buffer when stride > 1. */
static lt_tensor *f64_vector(const double *values, int64_t n, int64_t stride) {
  int64_t len = n * stride;
  lt_tensor *base = lt_tensor_new(), *v = lt_tensor_new();
  lt_empty(base, 1, &len, LT_F64, LT_DEVICE_CPU);
  for (int64_t i = 0; i < len; i++) ((double *)lt_data_ptr(base))[i] = i % stride ? NAN : values[i / stride];
  CHECK_OK(lt_slice(v, base, 0, 0, len, stride));
  lt_release(base);
  return v;
}

/* Hugging Face's llama3 rope table in miniature: theta's frequencies, the low ones divided by a
 * factor and the middle band interpolated (what the caller computes; any finite table works). */
static void llama3_like(double *inv, int64_t half, double theta) {
  for (int64_t i = 0; i < half; i++) {
    double f = pow(theta, -2.0 * (double)i / (double)(2 * half)), wavelen = 2 * M_PI / f;
    if (wavelen > 512)
      f /= 8;
    else if (wavelen > 128) {
      double smooth = (1024.0 / wavelen - 1) / 3;
      f = (1 - smooth) * f / 8 + smooth * f;
    }
    inv[i] = f;
  }
}

static void test_freq_against_reference(void) {
  int dtypes[4] = {LT_F32, LT_F64, LT_BF16, LT_F16};
  for (int trial = 0; trial < 16; trial++) {
    int dt = dtypes[trial % 4];
    int64_t shape[4] = {check_randint(1, 4), check_randint(1, 12), check_randint(1, 5), 2 * check_randint(1, 40)};
    int64_t B = shape[0], T = shape[1], half = shape[3] / 2;
    lt_tensor *x = check_random(4, shape, dt, -1, 1), *pos = NULL;
    int pos_kind = trial % 3; /* NULL, (T) i32, (B, T) i64 */
    if (pos_kind == 1) pos = check_random(1, &shape[1], LT_I32, 0, 3000);
    if (pos_kind == 2) {
      int64_t ps[2] = {B, T};
      pos = check_random(2, ps, LT_I64, 0, 100000);
    }
    double *inv = malloc((size_t)half * sizeof(double)), scale = trial % 2 ? 1.0 : 0.8 + 0.6 * check_uniform();
    if (trial % 4 < 2)
      llama3_like(inv, half, 500000.0);
    else /* yarn-like: any positive table */
      for (int64_t i = 0; i < half; i++) inv[i] = pow(10000.0, -2.0 * (double)i / (double)shape[3]) / (1 + (double)i);
    lt_tensor *invt = f64_vector(inv, half, 1 + trial % 2); /* strided every other trial */
    int64_t n = lt_numel(x);
    double *want = malloc((size_t)n * sizeof(double)), *want_inv = malloc((size_t)n * sizeof(double));
    freq_reference(want, x, pos, inv, scale, 0);
    freq_reference(want_inv, x, pos, inv, scale, 1);
    lt_tensor *y = lt_tensor_new(), *yi = lt_tensor_new();
    CHECK_OK(lt_rope_freq(y, x, pos, invt, scale, 0));
    CHECK_OK(lt_rope_freq(yi, x, pos, invt, scale, 1));
    double tol = tol_of(dt) * (dt == LT_F64 ? 1 : 2);
    CHECK(count_bad(y, want, tol) == 0, "trial %d: rope_freq %s [%lld,%lld,%lld,%lld] positions kind %d scale %g",
          trial, lt_dtype_name(dt), (long long)shape[0], (long long)shape[1], (long long)shape[2], (long long)shape[3],
          pos_kind, scale);
    CHECK(count_bad(yi, want_inv, tol) == 0, "trial %d: inverse rope_freq %s", trial, lt_dtype_name(dt));
    free(inv), free(want), free(want_inv);
    lt_release(x), lt_release(pos), lt_release(invt), lt_release(y), lt_release(yi);
  }
}

/* lt_rope(theta) is lt_rope_freq with theta's table and scale 1, bit for bit (one plan) */
static void test_theta_is_freq(void) {
  int dtypes[4] = {LT_F32, LT_F64, LT_BF16, LT_F16};
  for (int k = 0; k < 4; k++) {
    int64_t shape[4] = {2, 9, 3, 36}, half = 18, ps[2] = {2, 9};
    lt_tensor *x = check_random(4, shape, dtypes[k], -1, 1), *pos = check_random(2, ps, LT_I64, 0, 70000);
    double inv[18];
    for (int64_t i = 0; i < half; i++) inv[i] = pow(500000.0, -(double)(2 * i) / 36.0);
    lt_tensor *invt = f64_vector(inv, half, 1);
    for (int inverse = 0; inverse < 2; inverse++) {
      lt_tensor *a = lt_tensor_new(), *b = lt_tensor_new();
      CHECK_OK(lt_rope(a, x, pos, 500000.0, inverse));
      CHECK_OK(lt_rope_freq(b, x, pos, invt, 1.0, inverse));
      CHECK(memcmp(lt_data_ptr(a), lt_data_ptr(b), (size_t)(lt_numel(a) * lt_dtype_size(a->dtype))) == 0,
            "%s inverse %d: lt_rope(theta) and lt_rope_freq of its table differ", lt_dtype_name(dtypes[k]), inverse);
      lt_release(a), lt_release(b);
    }
    lt_release(x), lt_release(pos), lt_release(invt);
  }
}

/* The inverse is the exact backward: for L = sum(G * rope_freq(x)), dL/dx = rope_freq(G, inverse),
 * against central differences in f64 (scale != 1 included). */
static void test_freq_finite_differences(void) {
  int64_t shape[4] = {2, 3, 2, 6}, ps[2] = {2, 3};
  lt_tensor *x = check_random(4, shape, LT_F64, -1, 1), *G = check_random(4, shape, LT_F64, -1, 1);
  lt_tensor *pos = check_random(2, ps, LT_I32, 0, 40);
  double inv[3] = {1.0, 0.3, 0.0123}, scale = 1.2345;
  lt_tensor *invt = f64_vector(inv, 3, 1), *dx = lt_tensor_new();
  CHECK_OK(lt_rope_freq(dx, G, pos, invt, scale, 1));
  double *xv = lt_data_ptr(x), eps = 1e-6;
  int bad = 0;
  for (int64_t i = 0; i < lt_numel(x); i++) {
    double saved = xv[i], loss[2];
    for (int sgn = 0; sgn < 2; sgn++) {
      xv[i] = saved + (sgn ? -eps : eps);
      lt_tensor *y = lt_tensor_new();
      CHECK_OK(lt_rope_freq(y, x, pos, invt, scale, 0));
      loss[sgn] = 0;
      for (int64_t j = 0; j < lt_numel(y); j++) loss[sgn] += check_at(y, j) * check_at(G, j);
      lt_release(y);
    }
    xv[i] = saved;
    double num = (loss[0] - loss[1]) / (2 * eps);
    if (!check_close(check_at(dx, i), num, 1e-8, 1e-9) && bad++ < 3)
      fprintf(stderr, "  dx[%lld]: inverse %.10g, finite difference %.10g\n", (long long)i, check_at(dx, i), num);
  }
  CHECK(bad == 0, "rope_freq: the inverse is the gradient (%d of %lld differ)", bad, (long long)lt_numel(x));
  lt_release(x), lt_release(G), lt_release(pos), lt_release(invt), lt_release(dx);
}

static void test_freq_bad_inputs(void) {
  int64_t s4[4] = {2, 3, 2, 8}, two[2] = {2, 2}, three = 3, four = 4;
  lt_tensor *x = check_random(4, s4, LT_F32, -1, 1), *out = lt_tensor_new(), *undef = lt_tensor_new();
  lt_tensor *inv3 = check_random(1, &three, LT_F64, 0, 1), *inv4f = check_random(1, &four, LT_F32, 0, 1);
  lt_tensor *inv22 = check_random(2, two, LT_F64, 0, 1), *inv4 = check_random(1, &four, LT_F64, 0, 1);
  double bad_vals[4] = {1, 0.5, INFINITY, 0.1};
  lt_tensor *inv_inf = f64_vector(bad_vals, 4, 1);
  CHECK_ERR(lt_rope_freq(out, x, NULL, inv3, 1, 0), "inv_freq must be (D / 2) = (4) f64 on the cpu");
  CHECK_ERR(lt_rope_freq(out, x, NULL, inv4f, 1, 0), "inv_freq must be (D / 2) = (4) f64");
  CHECK_ERR(lt_rope_freq(out, x, NULL, inv22, 1, 0), "inv_freq must be (D / 2)");
  CHECK_ERR(lt_rope_freq(out, x, NULL, undef, 1, 0), "inv_freq is undefined");
  CHECK_ERR(lt_rope_freq(out, x, NULL, NULL, 1, 0), "inv_freq is NULL");
  CHECK_ERR(lt_rope_freq(out, x, NULL, inv_inf, 1, 0), "inv_freq[2] must be finite, got inf");
  CHECK_ERR(lt_rope_freq(out, x, NULL, inv4, 0, 0), "scale must be positive and finite, got 0");
  CHECK_ERR(lt_rope_freq(out, x, NULL, inv4, -1, 0), "scale must be positive");
  CHECK_ERR(lt_rope_freq(out, x, NULL, inv4, NAN, 0), "scale must be positive");
  CHECK_ERR(lt_rope_freq(out, undef, NULL, inv4, 1, 0), "x is undefined");
  CHECK_OK(lt_rope_freq(out, x, NULL, inv4, 1, 0));
  lt_release(x), lt_release(out), lt_release(undef), lt_release(inv3), lt_release(inv4f), lt_release(inv22);
  lt_release(inv4), lt_release(inv_inf);
}

int main(void) {
  test_against_reference();
  test_fused_view();
  test_large();
  test_bad_inputs();
  test_freq_against_reference();
  test_theta_is_freq();
  test_freq_finite_differences();
  test_freq_bad_inputs();
  return check_summary();
}
