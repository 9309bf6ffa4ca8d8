/* test_elementwise_edge.c — lt_unary_backward against the analytic derivatives and finite
 * differences; NaN, overflow, empty and 0-d cases; and the errors of bad input. */
#include "elementwise_ref.h"

static void test_unary_backward(void) {
  for (int op = 0; op < LT_NUM_UNARY_OPS; op++) {
    for (int k = 0; k < 4; k++) {
      int dtype = float_dtypes[k], ndim;
      int64_t shape[LT_MAX_DIMS];
      for (int variant = 0; variant < 3; variant++) {
        random_shape(&ndim, shape);
        lt_tensor *x = input(ndim, shape, dtype, op, true), *g = check_random(ndim, shape, dtype, -1, 1);
        if (variant == 1) {
          lt_tensor *x2 = check_noncontig(x), *g2 = check_noncontig(g);
          lt_release(x), lt_release(g);
          x = x2, g = g2;
        }
        int64_t n = lt_numel(x);
        double *want = malloc(sizeof(double) * (size_t)n);
        for (int64_t i = 0; i < n; i++) want[i] = check_at(g, i) * ref_grad(op, check_at(x, i));
        lt_tensor *gi = variant == 2 ? (lt_retain(g), g) : make_out(ndim, shape, dtype, variant == 1);
        CHECK_OK(lt_unary_backward(gi, g, x, op));
        char what[64];
        snprintf(what, sizeof what, "%s backward %s variant %d", lt_unary_name(op), lt_dtype_name(dtype), variant);
        if (lt_is_defined(gi)) expect(what, gi, want, 2 * tol(dtype));
        free(want);
        lt_release(gi), lt_release(x), lt_release(g);
      }
    }
    /* finite differences, f64 */
    int64_t shape[2] = {5, 7}, n = 35;
    const double h = 1e-5;
    lt_tensor *x = input(2, shape, LT_F64, op, true), *ones = lt_tensor_new(), *gi = lt_tensor_new();
    lt_tensor *xp = lt_tensor_new(), *xm = lt_tensor_new(), *fp = lt_tensor_new(), *fm = lt_tensor_new();
    lt_empty(ones, 2, shape, LT_F64, LT_DEVICE_CPU);
    lt_fill(ones, 1);
    CHECK_OK(lt_binary_scalar(xp, x, h, LT_ADD, 0));
    CHECK_OK(lt_binary_scalar(xm, x, h, LT_SUB, 0));
    CHECK_OK(lt_unary(fp, xp, op));
    CHECK_OK(lt_unary(fm, xm, op));
    CHECK_OK(lt_unary_backward(gi, ones, x, op));
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
      double fd = (check_at(fp, i) - check_at(fm, i)) / (check_at(xp, i) - check_at(xm, i));
      worst = fmax(worst, fabs(fd - check_at(gi, i)) / (1 + fabs(fd)));
    }
    CHECK(worst < 1e-7, "%s backward vs finite differences: relative error %g", lt_unary_name(op), worst);
    lt_release(x), lt_release(ones), lt_release(gi), lt_release(xp), lt_release(xm), lt_release(fp), lt_release(fm);
  }
}
/* ---- special values --------------------------------------------------------------------- */

/* A 1-d tensor of the given values. */
static lt_tensor *vec(int dtype, int64_t n, const double *v) {
  lt_tensor *t = lt_tensor_new();
  lt_empty(t, 1, &n, dtype, LT_DEVICE_CPU);
  lt_copy_from_buffer(t, v, LT_F64, n);
  return t;
}

/* f32 exp and tanh over their whole range: within 2 ulp of the double result, overflow to
 * inf, underflow to 0, NaN kept, tiny arguments exact. */
static void test_f32_exp_tanh_range(void) {
  enum { N = 4001 };
  static double xs[N + 8];
  for (int i = 0; i < N; i++) xs[i] = -104 + 193.0 * i / (N - 1);
  double specials[8] = {INFINITY, -INFINITY, NAN, 1e-30, -3e-6, 1e-40, 0.6249, 0.6251};
  memcpy(xs + N, specials, sizeof specials);
  lt_tensor *x = vec(LT_F32, N + 8, xs), *e = lt_tensor_new(), *t = lt_tensor_new(), *s = lt_tensor_new();
  CHECK_OK(lt_unary(e, x, LT_EXP));
  CHECK_OK(lt_unary(t, x, LT_TANH));
  CHECK_OK(lt_unary(s, x, LT_SIGMOID));
  int64_t bad_e = -1, bad_t = -1, bad_s = -1;
  for (int64_t i = 0; i < N + 8; i++) {
    double xi = check_at(x, i), we = exp(xi), wt = tanh(xi), ws = 1 / (1 + exp(-xi));
    if (we > 3.4028234663852886e38) we = INFINITY;
    if (bad_e < 0 && !check_close(check_at(e, i), we, 2.4e-7, 1.5e-45)) bad_e = i;
    if (bad_t < 0 && !check_close(check_at(t, i), wt, 2.4e-7, 1e-45)) bad_t = i;
    if (bad_s < 0 && !check_close(check_at(s, i), ws, 3.6e-7, 3e-45)) bad_s = i;
  }
  CHECK(bad_e < 0, "f32 exp(%.9g) = %.9g", bad_e < 0 ? 0 : check_at(x, bad_e), bad_e < 0 ? 0 : check_at(e, bad_e));
  CHECK(bad_t < 0, "f32 tanh(%.9g) = %.9g", bad_t < 0 ? 0 : check_at(x, bad_t), bad_t < 0 ? 0 : check_at(t, bad_t));
  CHECK(bad_s < 0, "f32 sigmoid(%.9g) = %.9g", bad_s < 0 ? 0 : check_at(x, bad_s), bad_s < 0 ? 0 : check_at(s, bad_s));
  lt_release(x), lt_release(e), lt_release(t), lt_release(s);
}

static void test_special_values(void) {
  double nan = NAN, xs[4] = {nan, 1, -2, nan}, ys[4] = {0, nan, 5, nan};
  for (int k = 0; k < 4; k++) {
    int dtype = float_dtypes[k];
    lt_tensor *x = vec(dtype, 4, xs), *y = vec(dtype, 4, ys), *o = lt_tensor_new(), *r = lt_tensor_new();
    CHECK_OK(lt_binary(o, x, y, LT_MAXIMUM));
    CHECK(isnan(check_at(o, 0)) && isnan(check_at(o, 1)) && check_at(o, 2) == 5 && isnan(check_at(o, 3)),
          "maximum propagates NaN (%s)", lt_dtype_name(dtype));
    CHECK_OK(lt_binary(o, x, y, LT_MINIMUM));
    CHECK(isnan(check_at(o, 0)) && isnan(check_at(o, 1)) && check_at(o, 2) == -2, "minimum propagates NaN");
    CHECK_OK(lt_unary(r, x, LT_RELU));
    CHECK(isnan(check_at(r, 0)) && check_at(r, 1) == 1 && check_at(r, 2) == 0, "relu keeps NaN");
    CHECK_OK(lt_clamp(r, x, -1, 0.5));
    CHECK(isnan(check_at(r, 0)) && check_at(r, 1) == 0.5 && check_at(r, 2) == -1, "clamp keeps NaN");
    CHECK_OK(lt_clamp(r, x, 3, 2)); /* lo > hi gives hi, as torch */
    CHECK(check_at(r, 1) == 2 && check_at(r, 2) == 2, "clamp with lo > hi");
    CHECK_OK(lt_clamp(r, x, -INFINITY, 0));
    CHECK(check_at(r, 1) == 0 && check_at(r, 2) == -2, "clamp with an infinite bound");
    lt_tensor *ne = lt_tensor_new();
    CHECK_OK(lt_binary(ne, x, y, LT_NE));
    CHECK(lt_is_defined(ne) && check_at(ne, 0) == 1 && check_at(ne, 3) == 1 && check_at(ne, 2) == 1, "NaN != NaN");
    lt_release(ne);
    CHECK_OK(lt_binary_scalar(o, y, 0, LT_DIV, 1)); /* 0 / y */
    CHECK(check_at(o, 2) == 0 && isnan(check_at(o, 0)), "0/0 is NaN");
    CHECK_OK(lt_binary_scalar(o, y, 1, LT_DIV, 1));
    CHECK(isinf(check_at(o, 0)) && check_at(o, 0) > 0, "1/0 is inf");
    lt_release(x), lt_release(y), lt_release(o), lt_release(r);
  }
  /* integers wrap */
  double big[2] = {2147483647, -2147483648.0}, small[3] = {3, 1, 0}, five[3] = {5, 5, 5};
  lt_tensor *i = vec(LT_I32, 2, big), *u = vec(LT_U8, 3, small), *f = vec(LT_U8, 3, five), *o = lt_tensor_new();
  CHECK_OK(lt_binary_scalar(o, i, 1, LT_ADD, 0));
  CHECK(check_at(o, 0) == -2147483648.0, "i32 max + 1 wraps: %g", check_at(o, 0));
  lt_release(o), o = lt_tensor_new();
  CHECK_OK(lt_unary(o, i, LT_ABS));
  CHECK(check_at(o, 1) == -2147483648.0 && check_at(o, 0) == 2147483647, "abs of i32 min wraps");
  lt_release(o), o = lt_tensor_new();
  CHECK_OK(lt_binary(o, u, f, LT_SUB));
  CHECK(check_at(o, 0) == 254 && check_at(o, 2) == 251, "u8 3 - 5 wraps to 254");
  CHECK_OK(lt_unary(o, u, LT_NEG));
  CHECK(check_at(o, 1) == 255 && check_at(o, 2) == 0, "u8 neg wraps");
  lt_release(i), lt_release(u), lt_release(f), lt_release(o);
  /* empty and 0-d tensors */
  int64_t e[2] = {0, 3}, three = 3;
  lt_tensor *z = lt_tensor_new(), *w = lt_tensor_new(), *s0 = lt_tensor_new(), *s1 = lt_tensor_new();
  lt_empty(z, 2, e, LT_F32, LT_DEVICE_CPU);
  lt_empty(w, 1, &three, LT_F32, LT_DEVICE_CPU);
  lt_fill(w, 1);
  o = lt_tensor_new();
  CHECK_OK(lt_binary(o, z, w, LT_ADD));
  CHECK(o->ndim == 2 && o->shape[0] == 0 && o->shape[1] == 3, "empty + (3) is (0,3)");
  lt_release(o), o = lt_tensor_new();
  lt_empty(s0, 0, NULL, LT_F64, LT_DEVICE_CPU);
  lt_fill(s0, 2);
  CHECK_ERR(lt_binary(o, s0, w, LT_ADD), "add: dtype mismatch: f64 vs f32"); /* no type promotion */
  lt_empty(s1, 0, NULL, LT_F64, LT_DEVICE_CPU);
  lt_fill(s1, 3);
  lt_release(o), o = lt_tensor_new();
  CHECK_OK(lt_binary(o, s0, s1, LT_POW));
  double v = 0;
  CHECK(o->ndim == 0 && lt_item(o, &v) == 0 && v == 8, "0-d pow: %g", v);
  lt_release(z), lt_release(w), lt_release(s0), lt_release(s1), lt_release(o);
}

/* ---- bad input ------------------------------------------------------------------------------ */

static void test_bad_input(void) {
  int64_t s34[2] = {3, 4}, s5[1] = {5}, s22[2] = {2, 2}, s14[2] = {1, 4};
  lt_tensor *f = check_random(2, s34, LT_F32, -1, 1), *h = check_random(2, s34, LT_BF16, -1, 1);
  lt_tensor *f5 = check_random(1, s5, LT_F32, -1, 1), *i = check_random(2, s34, LT_I32, 1, 5);
  lt_tensor *bl = check_random(2, s34, LT_BOOL, 0, 2), *und = lt_tensor_new(), *o = lt_tensor_new();
  lt_tensor *small = check_random(2, s22, LT_F32, -1, 1), *row = check_random(2, s14, LT_F32, -1, 1);
  CHECK_ERR(lt_binary(o, f, h, LT_ADD), "add: dtype mismatch: f32 vs bf16");
  CHECK_ERR(lt_binary(o, f, f5, LT_MUL), "not broadcastable");
  CHECK_ERR(lt_binary(o, f, f5, LT_MUL), "mul: ");
  CHECK_ERR(lt_binary(small, f, f, LT_ADD), "add: out is [2,2] f32 cpu, expected [3,4] f32 cpu");
  CHECK_ERR(lt_binary(small, f, f, LT_LT), "lt: out is");
  CHECK_ERR(lt_binary(o, f, f, -1), "unknown op");
  CHECK_ERR(lt_binary(o, und, f, LT_ADD), "add: a is undefined");
  CHECK_ERR(lt_binary(o, f, NULL, LT_ADD), "add: b is NULL");
  CHECK_ERR(lt_binary(NULL, f, f, LT_ADD), "out is NULL");
  CHECK_ERR(lt_binary(o, i, i, LT_DIV), "div: not supported for i32");
  CHECK_ERR(lt_binary(o, i, i, LT_POW), "pow: not supported for i32");
  CHECK_ERR(lt_binary_scalar(o, i, 2, LT_DIV, 0), "div: not supported for i32");
  CHECK_ERR(lt_binary_scalar(o, i, 0.5, LT_ADD, 0), "add: scalar 0.5 is not a value of i32");
  CHECK_ERR(lt_binary(o, bl, bl, LT_ADD), "add: not supported for bool");
  CHECK_ERR(lt_unary(o, i, LT_EXP), "exp: not supported for i32");
  CHECK_ERR(lt_unary(o, bl, LT_NEG), "neg: not supported for bool");
  CHECK_ERR(lt_unary(o, und, LT_EXP), "exp: input is undefined");
  CHECK_ERR(lt_unary(o, f, LT_NUM_UNARY_OPS), "unknown op");
  CHECK_ERR(lt_unary(small, f, LT_TANH), "tanh: out is");
  lt_tensor *ex = lt_tensor_new();
  CHECK_OK(lt_expand(ex, row, 2, s34));
  CHECK_ERR(lt_unary(ex, f, LT_NEG), "expanded view");
  CHECK_ERR(lt_unary_backward(o, f, small, LT_TANH), "differ in shape");
  CHECK_ERR(lt_unary_backward(o, f, h, LT_TANH), "tanh_backward: dtype mismatch: f32 vs bf16");
  CHECK_ERR(lt_unary_backward(o, i, i, LT_RELU), "relu_backward: not supported for i32");
  CHECK_ERR(lt_where(o, f, f, f), "where: cond must be bool or u8, got f32");
  CHECK_ERR(lt_where(o, bl, f, h), "where: dtype mismatch");
  CHECK_ERR(lt_where(o, bl, f, f5), "not broadcastable");
  CHECK_ERR(lt_clamp(o, f, NAN, 1), "clamp: bounds must not be NaN");
  CHECK_ERR(lt_clamp(o, bl, 0, 1), "clamp: not supported for bool");
  /* out partly overlapping an input: refused; disjoint views of one storage are fine */
  lt_tensor *row0 = lt_tensor_new(), *lo = lt_tensor_new(), *hi = lt_tensor_new();
  CHECK_OK(lt_select(row0, f, 0, 0));
  CHECK_ERR(lt_binary(f, f, row0, LT_SUB), "sub: out [3,4] f32 cpu partly overlaps b [4] f32 cpu");
  CHECK_OK(lt_narrow(lo, f, 0, 0, 1));
  CHECK_OK(lt_narrow(hi, f, 0, 1, 1));
  CHECK_OK(lt_unary(lo, hi, LT_NEG));
  CHECK(check_at(lo, 2) == -check_at(hi, 2), "neg of a disjoint view of the same storage");
  CHECK_OK(lt_narrow(hi, f, 0, 1, 2));
  CHECK_OK(lt_narrow(lo, f, 0, 0, 2));
  CHECK_ERR(lt_unary(lo, hi, LT_NEG), "neg: out [2,4] f32 cpu partly overlaps input");
  CHECK_ERR(lt_clamp(lo, hi, 0, 1), "clamp: out");
  CHECK_ERR(lt_binary_scalar(lo, hi, 1, LT_ADD, 0), "partly overlaps a");
  CHECK_ERR(lt_unary_backward(lo, hi, lo, LT_TANH), "partly overlaps grad_out");
  lt_release(row0), lt_release(lo), lt_release(hi);
  /* tensors that claim to live on a CUDA device: no crash, clear errors */
  /* (cuda:15: no machine here has 16 GPUs, so the ops refuse it before any kernel reads its
   * host pointer; a CUDA build says the device is missing, a CPU-only build has no CUDA) */
  lt_tensor fake = *f;
  fake.device = 15;
  const char *no_device = strstr(lt_build_info(), "cuda: built") ? "is not available" : "built without CUDA";
  CHECK_ERR(lt_binary(o, &fake, f, LT_ADD), "add: tensors on different devices: cuda:15 vs cpu");
  CHECK_ERR(lt_binary(o, &fake, &fake, LT_MUL), no_device);
  CHECK_ERR(lt_unary(o, &fake, LT_EXP), no_device);
  CHECK_ERR(lt_binary_scalar(o, &fake, 1, LT_ADD, 0), no_device);
  CHECK_ERR(lt_where(o, bl, &fake, &fake), "where: tensors on different devices");
  CHECK(!lt_is_defined(o), "failed ops leave an undefined out undefined");
  lt_release(f), lt_release(h), lt_release(f5), lt_release(i), lt_release(bl), lt_release(und), lt_release(o);
  lt_release(small), lt_release(row), lt_release(ex);
}

static void test_names(void) {
  CHECK(strcmp(lt_unary_name(LT_GELU), "gelu") == 0 && strcmp(lt_unary_name(LT_RECIPROCAL), "reciprocal") == 0,
        "unary names");
  CHECK(strcmp(lt_binary_name(LT_MAXIMUM), "maximum") == 0 && strcmp(lt_binary_name(LT_GE), "ge") == 0, "binary names");
  CHECK(strcmp(lt_unary_name(99), "?") == 0 && strcmp(lt_binary_name(-1), "?") == 0, "unknown op names");
}
int main(void) {
  test_names();
  test_unary_backward();
  test_special_values();
  test_f32_exp_tanh_range();
  test_bad_input();
  return check_summary();
}
