/* test_elementwise.c — lt_binary, lt_binary_scalar, lt_unary, lt_where and lt_clamp against
 * naive loops in double: random shapes, every dtype, non-contiguous, broadcast, expanded and
 * in-place operands, and sizes that take the threaded paths. */
#include "elementwise_ref.h"

/* ---- binary -------------------------------------------------------------------------------- */

static bool binary_supported(int op, int dtype) {
  if (is_float(dtype)) return true;
  if (dtype == LT_BOOL) return is_cmp(op);
  return op != LT_DIV && op != LT_POW;
}

/* out = a op b on random broadcast shapes; variant 0 contiguous, 1 non-contiguous inputs
 * and out, 2 in place on a. */
static void test_binary_case(int op, int dtype, int variant) {
  int ndim, na, nb;
  int64_t shape[LT_MAX_DIMS], sa[LT_MAX_DIMS], sb[LT_MAX_DIMS];
  random_shape(&ndim, shape);
  na = variant == 2 ? ndim : broadcastable_from(ndim, shape, sa);
  if (variant == 2) memcpy(sa, shape, sizeof shape);
  nb = broadcastable_from(ndim, shape, sb);
  if (variant == 0 && check_uniform() < 0.3) nb = ndim, memcpy(sb, shape, sizeof shape);
  lt_tensor *a = input(na, sa, dtype, op, false), *b = input(nb, sb, dtype, op, false);
  int rn;
  int64_t rshape[LT_MAX_DIMS];
  CHECK_OK(lt_broadcast_shape(na, sa, nb, sb, &rn, rshape));
  if (variant == 1) {
    lt_tensor *x = check_noncontig(a), *y = check_noncontig(b);
    lt_release(a), lt_release(b);
    a = x, b = y;
  }
  int64_t n = lt_shape_numel(rn, rshape);
  double *want = malloc(sizeof(double) * (size_t)(n + 1));
  int odtype = is_cmp(op) ? LT_BOOL : dtype;
  for (int64_t i = 0; i < n; i++) {
    double r = ref_binary(op, bcast_at(a, rn, rshape, i), bcast_at(b, rn, rshape, i));
    want[i] = is_float(odtype) ? r : wrap(odtype, r);
  }
  lt_tensor *out = variant == 2 && !is_cmp(op) ? (lt_retain(a), a) : make_out(rn, rshape, odtype, variant == 1);
  char what[64];
  snprintf(what, sizeof what, "%s %s variant %d", lt_binary_name(op), lt_dtype_name(dtype), variant);
  CHECK_OK(lt_binary(out, a, b, op));
  if (lt_is_defined(out)) expect(what, out, want, tol(odtype));
  lt_release(out);
  /* scalar forms: a op s and s op a; pow has fast paths for some exponents */
  const double pows[5] = {0.75, 2, 0.5, -0.5, -1};
  double s = is_float(dtype) ? pows[op == LT_POW ? variant + (int)check_randint(0, 3) : 0] : dtype == LT_BOOL ? 1 : 3;
  for (int reverse = 0; reverse < 2; reverse++) {
    lt_tensor *o = lt_tensor_new();
    n = lt_numel(a);
    for (int64_t i = 0; i < n; i++) {
      double x = check_at(a, i), r = reverse ? ref_binary(op, s, x) : ref_binary(op, x, s);
      want[i] = is_float(odtype) ? r : wrap(odtype, r);
    }
    CHECK_OK(lt_binary_scalar(o, a, s, op, reverse));
    snprintf(what, sizeof what, "%s %s scalar %g reverse %d", lt_binary_name(op), lt_dtype_name(dtype), s, reverse);
    if (lt_is_defined(o)) expect(what, o, want, tol(odtype));
    lt_release(o);
  }
  free(want);
  lt_release(a);
  lt_release(b);
}

static void test_binary(void) {
  for (int op = 0; op < LT_NUM_BINARY_OPS; op++)
    for (size_t k = 0; k < sizeof all_dtypes / sizeof all_dtypes[0]; k++)
      if (binary_supported(op, all_dtypes[k]))
        for (int trial = 0; trial < 6; trial++) test_binary_case(op, all_dtypes[k], trial % 3);
  /* the example of the brief: (3,1,5) + (4,1) -> (3,4,5) */
  int64_t s1[3] = {3, 1, 5}, s2[2] = {4, 1};
  lt_tensor *a = check_random(3, s1, LT_F32, -1, 1), *b = check_random(2, s2, LT_F32, -1, 1), *o = lt_tensor_new();
  CHECK_OK(lt_binary(o, a, b, LT_SUB));
  CHECK(o->ndim == 3 && o->shape[0] == 3 && o->shape[1] == 4 && o->shape[2] == 5, "shape of (3,1,5)-(4,1)");
  int64_t idx[3] = {2, 3, 4}, ia[3] = {2, 0, 4}, ib[2] = {3, 0};
  double got, x, y;
  lt_get_at(o, idx, &got), lt_get_at(a, ia, &x), lt_get_at(b, ib, &y);
  CHECK(got == (float)(x - y), "(3,1,5)-(4,1) at [2,3,4]: %g vs %g", got, x - y);
  lt_release(a), lt_release(b), lt_release(o);
}

/* Large enough for the threaded paths: one long row, many rows, a row broadcast (N,C)+(C),
 * a column broadcast (N,C)*(N,1), and a scalar. */
static void test_binary_large(void) {
  int64_t shapes[][2] = {{1, 300001}, {1001, 257}, {3, 100003}};
  for (int k = 0; k < 3; k++) {
    int64_t *s = shapes[k], row[1] = {s[1]}, col[2] = {s[0], 1}, n = s[0] * s[1];
    for (int dt = 0; dt < 3; dt++) {
      int dtype = dt == 0 ? LT_F32 : dt == 1 ? LT_BF16 : LT_F64;
      lt_tensor *a = check_random(2, s, dtype, -2, 2), *r = check_random(1, row, dtype, -2, 2);
      lt_tensor *c = check_random(2, col, dtype, -2, 2), *o = lt_tensor_new(), *p = lt_tensor_new();
      double *want = malloc(sizeof(double) * (size_t)n), *want2 = malloc(sizeof(double) * (size_t)n);
      for (int64_t i = 0; i < n; i++) {
        want[i] = check_at(a, i) + check_at(r, i % s[1]);
        want2[i] = check_at(a, i) * check_at(c, i / s[1]);
      }
      CHECK_OK(lt_binary(o, a, r, LT_ADD));
      expect("large row broadcast add", o, want, tol(dtype));
      CHECK_OK(lt_binary(p, a, c, LT_MUL));
      expect("large column broadcast mul", p, want2, tol(dtype));
      CHECK_OK(lt_binary(o, a, p, LT_MAXIMUM)); /* same shape, into a defined out */
      for (int64_t i = 0; i < n; i++) want[i] = fmax(check_at(a, i), check_at(p, i));
      expect("large maximum", o, want, tol(dtype));
      for (int64_t i = 0; i < n; i++) want[i] = 2 - check_at(a, i);
      CHECK_OK(lt_binary_scalar(a, a, 2, LT_SUB, 1)); /* in place, reversed: a = 2 - a */
      expect("large in-place reversed scalar sub", a, want, tol(dtype));
      free(want), free(want2);
      lt_release(a), lt_release(r), lt_release(c), lt_release(o), lt_release(p);
    }
  }
  /* a transposed operand (walked in tiles), with partial tiles on both dims and an outer dim */
  int64_t ts[3] = {3, 300, 521}, tts[3] = {3, 521, 300}, n = 3 * 300 * 521;
  for (int dt = 0; dt < 2; dt++) {
    int dtype = dt ? LT_F16 : LT_F32;
    lt_tensor *a = check_random(3, ts, dtype, -2, 2), *b = check_random(3, tts, dtype, -2, 2);
    lt_tensor *bt = lt_tensor_new(), *o = lt_tensor_new(), *u = make_out(3, ts, dtype, true);
    CHECK_OK(lt_transpose(bt, b, 1, 2));
    double *want = malloc(sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < n; i++) want[i] = check_at(a, i) - check_at(bt, i);
    CHECK_OK(lt_binary(o, a, bt, LT_SUB));
    expect("large sub with a transposed operand", o, want, tol(dtype));
    for (int64_t i = 0; i < n; i++) want[i] = ref_unary(LT_SIGMOID, check_at(bt, i));
    CHECK_OK(lt_unary(u, bt, LT_SIGMOID)); /* transposed input into a transposed out */
    expect("large sigmoid of a transposed operand", u, want, tol(dtype));
    free(want);
    lt_release(a), lt_release(b), lt_release(bt), lt_release(o), lt_release(u);
  }
}

/* ---- unary ------------------------------------------------------------------------------- */

static bool unary_supported(int op, int dtype) {
  if (is_float(dtype)) return true;
  return dtype != LT_BOOL && (op == LT_NEG || op == LT_ABS || op == LT_RELU || op == LT_SQUARE);
}

/* variant 0 contiguous, 1 non-contiguous input and out, 2 in place, 3 expanded input. */
static void test_unary_case(int op, int dtype, int variant) {
  int ndim;
  int64_t shape[LT_MAX_DIMS];
  random_shape(&ndim, shape);
  int expand_dim = check_uniform() < 0.5 ? 0 : ndim - 1; /* an outer or the innermost dim */
  if (variant == 3) shape[expand_dim] = 1;
  lt_tensor *a = input(ndim, shape, dtype, op, true);
  if (variant == 1) {
    lt_tensor *x = check_noncontig(a);
    lt_release(a);
    a = x;
  } else if (variant == 3) {
    lt_tensor *x = lt_tensor_new();
    shape[expand_dim] = 4;
    CHECK_OK(lt_expand(x, a, ndim, shape));
    lt_release(a);
    a = x;
  }
  int64_t n = lt_numel(a);
  double *want = malloc(sizeof(double) * (size_t)(n + 1));
  for (int64_t i = 0; i < n; i++) want[i] = wrap(dtype, ref_unary(op, check_at(a, i)));
  lt_tensor *out = variant == 2 ? (lt_retain(a), a) : make_out(ndim, shape, dtype, variant == 1);
  char what[64];
  snprintf(what, sizeof what, "%s %s variant %d", lt_unary_name(op), lt_dtype_name(dtype), variant);
  CHECK_OK(lt_unary(out, a, op));
  if (lt_is_defined(out)) expect(what, out, want, tol(dtype));
  free(want);
  lt_release(out);
  lt_release(a);
}

static void test_unary(void) {
  for (int op = 0; op < LT_NUM_UNARY_OPS; op++)
    for (size_t k = 0; k < sizeof all_dtypes / sizeof all_dtypes[0]; k++)
      if (unary_supported(op, all_dtypes[k]))
        for (int trial = 0; trial < 8; trial++) test_unary_case(op, all_dtypes[k], trial % 4);
  /* the threaded path of a transcendental op */
  int64_t shape[2] = {3, 70001};
  for (int k = 0; k < 4; k++) {
    lt_tensor *a = check_random(2, shape, float_dtypes[k], -3, 3), *o = lt_tensor_new();
    double *want = malloc(sizeof(double) * 3 * 70001);
    for (int64_t i = 0; i < 3 * 70001; i++) want[i] = ref_unary(LT_GELU, check_at(a, i));
    CHECK_OK(lt_unary(o, a, LT_GELU));
    expect("large gelu", o, want, tol(float_dtypes[k]));
    free(want);
    lt_release(a), lt_release(o);
  }
}

/* grad_in = grad_out * op'(x): against the hand-written derivative in every float dtype
 * (non-contiguous and in place too), and against central differences of lt_unary in f64. *//* ---- where, clamp ----------------------------------------------------------------------- */

static void test_where(void) {
  /* masked fill: a scalar a or b with full-shape cond and other operand */
  int64_t ms[2] = {37, 129}, mn = 37 * 129;
  for (int k = 0; k < 4; k++) {
    int dtype = float_dtypes[k];
    lt_tensor *c = check_random(2, ms, LT_BOOL, 0, 2), *x = check_random(2, ms, dtype, -1, 1);
    lt_tensor *z = check_random(0, NULL, dtype, 5, 6), *o1 = lt_tensor_new(), *o2 = lt_tensor_new();
    double *w1 = malloc(sizeof(double) * (size_t)mn), *w2 = malloc(sizeof(double) * (size_t)mn), zv = check_at(z, 0);
    for (int64_t i = 0; i < mn; i++) {
      w1[i] = check_at(c, i) ? check_at(x, i) : zv;
      w2[i] = check_at(c, i) ? zv : check_at(x, i);
    }
    CHECK_OK(lt_where(o1, c, x, z));
    expect("where(c, x, scalar)", o1, w1, 0);
    CHECK_OK(lt_where(o2, c, z, x));
    expect("where(c, scalar, x)", o2, w2, 0);
    free(w1), free(w2);
    lt_release(c), lt_release(x), lt_release(z), lt_release(o1), lt_release(o2);
  }
  for (size_t k = 0; k < sizeof all_dtypes / sizeof all_dtypes[0]; k++) {
    for (int trial = 0; trial < 6; trial++) {
      int dtype = all_dtypes[k], ndim, nc, na, nb;
      int64_t shape[LT_MAX_DIMS], sc[LT_MAX_DIMS], sa[LT_MAX_DIMS], sb[LT_MAX_DIMS];
      random_shape(&ndim, shape);
      nc = trial == 0 ? ndim : broadcastable_from(ndim, shape, sc);
      if (trial == 0) memcpy(sc, shape, sizeof shape);
      na = broadcastable_from(ndim, shape, sa);
      nb = trial % 2 ? ndim : broadcastable_from(ndim, shape, sb);
      if (trial % 2) memcpy(sb, shape, sizeof shape);
      lt_tensor *c = check_random(nc, sc, trial % 3 ? LT_BOOL : LT_U8, 0, trial % 3 ? 2 : 4);
      lt_tensor *a = input(na, sa, dtype, LT_ADD, false), *b = input(nb, sb, dtype, LT_ADD, false);
      int n1, rn;
      int64_t s1[LT_MAX_DIMS], rshape[LT_MAX_DIMS];
      lt_broadcast_shape(na, sa, nb, sb, &n1, s1);
      lt_broadcast_shape(nc, sc, n1, s1, &rn, rshape);
      if (trial >= 3) {
        lt_tensor *c2 = check_noncontig(c), *a2 = check_noncontig(a);
        lt_release(c), lt_release(a);
        c = c2, a = a2;
      }
      int64_t n = lt_shape_numel(rn, rshape);
      double *want = malloc(sizeof(double) * (size_t)(n + 1));
      for (int64_t i = 0; i < n; i++)
        want[i] = bcast_at(c, rn, rshape, i) != 0 ? bcast_at(a, rn, rshape, i) : bcast_at(b, rn, rshape, i);
      lt_tensor *out = make_out(rn, rshape, dtype, trial >= 3);
      CHECK_OK(lt_where(out, c, a, b));
      char what[64];
      snprintf(what, sizeof what, "where %s cond %s trial %d", lt_dtype_name(dtype), lt_dtype_name(c->dtype), trial);
      if (lt_is_defined(out)) expect(what, out, want, 0);
      free(want);
      lt_release(out), lt_release(c), lt_release(a), lt_release(b);
    }
  }
}

static void test_clamp(void) {
  for (size_t k = 0; k + 1 < sizeof all_dtypes / sizeof all_dtypes[0]; k++) { /* all but bool */
    int dtype = all_dtypes[k], ndim;
    int64_t shape[LT_MAX_DIMS];
    double lo = is_float(dtype) ? -1 : dtype == LT_U8 ? 20.5 : -5.5;
    double hi = is_float(dtype) ? 1.5 : dtype == LT_U8 ? 150.2 : 7.2;
    double ilo = is_float(dtype) ? lo : ceil(lo), ihi = is_float(dtype) ? hi : floor(hi);
    for (int variant = 0; variant < 4; variant++) { /* contiguous, non-contiguous, in place, expanded */
      random_shape(&ndim, shape);
      if (variant == 3) shape[ndim - 1] = 1;
      lt_tensor *a = input(ndim, shape, dtype, LT_ADD, true);
      if (variant == 1 || variant == 3) {
        lt_tensor *x = lt_tensor_new();
        shape[ndim - 1] = variant == 3 ? 3 : shape[ndim - 1];
        if (variant == 1)
          lt_release(x), x = check_noncontig(a);
        else
          CHECK_OK(lt_expand(x, a, ndim, shape));
        lt_release(a);
        a = x;
      }
      int64_t n = lt_numel(a);
      double *want = malloc(sizeof(double) * (size_t)n);
      for (int64_t i = 0; i < n; i++) want[i] = fmin(fmax(check_at(a, i), ilo), ihi);
      lt_tensor *out = variant == 2 ? (lt_retain(a), a) : make_out(ndim, shape, dtype, variant == 1);
      CHECK_OK(lt_clamp(out, a, lo, hi));
      char what[64];
      snprintf(what, sizeof what, "clamp %s variant %d", lt_dtype_name(dtype), variant);
      if (lt_is_defined(out)) expect(what, out, want, tol(dtype));
      free(want);
      lt_release(out), lt_release(a);
    }
  }
}
int main(void) {
  test_binary();
  test_binary_large();
  test_unary();
  test_where();
  test_clamp();
  return check_summary();
}
