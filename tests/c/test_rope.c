/* test_rope.c — rotary embedding against a naive double reference, inverse(rope(x)) == x, in place,
 * strided inputs and outputs, positions (T) and (B, T), bad inputs. */
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

int main(void) {
  test_against_reference();
  test_fused_view();
  test_large();
  test_bad_inputs();
  return check_summary();
}
