/* test_cross_entropy.c — fused cross-entropy: forward against a naive double reference, backward
 * against central finite differences in f64, ignore_index rows, dtypes, layouts, bad inputs. */
#include "check.h"

static const int64_t IGNORE = -100;

static double *to_doubles(const lt_tensor *t) {
  int64_t n = lt_numel(t);
  double *v = malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
  if (lt_copy_to_buffer(t, v, LT_F64, n)) fprintf(stderr, "to_doubles: %s\n", lt_last_error());
  return v;
}

/* losses[i] = logsumexp(x[i]) - x[i][t[i]], 0 for ignored rows; lse[i] for every row. */
static void ref_ce(double *loss, double *lse, const double *x, const int64_t *t, int64_t N, int64_t V, int64_t ignore) {
  for (int64_t i = 0; i < N; i++) {
    double mx = -INFINITY, s = 0;
    for (int64_t j = 0; j < V; j++) mx = fmax(mx, x[i * V + j]);
    for (int64_t j = 0; j < V; j++) s += exp(x[i * V + j] - mx);
    lse[i] = mx + log(s);
    loss[i] = t[i] == ignore ? 0 : lse[i] - x[i * V + t[i]];
  }
}

/* Targets in [0, V) with about one row in four set to `ignore` (when ignore_rows). */
static lt_tensor *make_targets(int64_t N, int64_t V, int dtype, int64_t ignore, int ignore_rows, int64_t *t) {
  lt_tensor *tt = lt_tensor_new();
  int64_t shape[1] = {N};
  lt_empty(tt, 1, shape, dtype, LT_DEVICE_CPU);
  for (int64_t i = 0; i < N; i++) {
    t[i] = ignore_rows && check_uniform() < 0.25 ? ignore : check_randint(0, V);
    lt_store_f64(lt_data_ptr(tt), dtype, i, (double)t[i]);
  }
  return tt;
}

static void test_forward(int dtype, int tdtype, int64_t N, int64_t V, double offset, int noncontig) {
  int64_t shape[2] = {N, V}, t[64];
  lt_tensor *x0 = check_random(2, shape, dtype, offset - 8, offset + 8);
  lt_tensor *x = noncontig ? check_noncontig(x0) : x0, *tg = make_targets(N, V, tdtype, IGNORE, 1, t);
  lt_tensor *losses = lt_tensor_new(), *lse = lt_tensor_new();
  CHECK_OK(lt_cross_entropy_forward(losses, lse, x, tg, IGNORE));
  double *xv = to_doubles(x0), want[64], wlse[64];
  ref_ce(want, wlse, xv, t, N, V, IGNORE);
  /* losses are f32 differences of values near `offset`: tolerance relative to the logit scale */
  double tol = 1e-6 * (fabs(offset) + 8 + log((double)V)), worst = 0;
  int bad = 0;
  for (int64_t i = 0; i < N; i++) {
    double got = check_at(losses, i), gl = check_at(lse, i);
    if (!check_close(got, want[i], 0, tol) || !check_close(gl, wlse[i], 1e-6, tol)) bad++;
    if (t[i] == IGNORE && got != 0) bad++;
    worst = fmax(worst, fabs(got - want[i]));
  }
  CHECK(bad == 0 && losses->dtype == LT_F32 && lse->dtype == LT_F32 && losses->ndim == 1 && losses->shape[0] == N,
        "cross_entropy %s targets %s [%lld,%lld] offset %g nc %d: %d bad, max err %g", lt_dtype_name(dtype),
        lt_dtype_name(tdtype), (long long)N, (long long)V, offset, noncontig, bad, worst);
  free(xv);
  if (x != x0) lt_release(x);
  lt_release(x0), lt_release(tg), lt_release(losses), lt_release(lse);
}

/* sum(losses * R) of the double reference, and of the op itself. */
static double ref_functional(const double *x, const int64_t *t, const double *R, int64_t N, int64_t V) {
  double loss[64], lse[64], s = 0;
  ref_ce(loss, lse, x, t, N, V, IGNORE);
  for (int64_t i = 0; i < N; i++) s += loss[i] * R[i];
  return s;
}

static double op_functional(const lt_tensor *x, const lt_tensor *tg, const double *R) {
  lt_tensor *losses = lt_tensor_new();
  int64_t nshape[1] = {x->shape[0]};
  lt_empty(losses, 1, nshape, LT_F64, LT_DEVICE_CPU); /* f64 losses: full precision for differences */
  lt_cross_entropy_forward(losses, NULL, x, tg, IGNORE);
  double s = 0;
  for (int64_t i = 0; i < lt_numel(losses); i++) s += check_at(losses, i) * R[i];
  lt_release(losses);
  return s;
}

/* dlogits in f64 against central differences (h = 1e-5) of the double reference and of the op's
 * own forward (with f64 losses; lse saved as f64 too, or as the default f32, which limits
 * dlogits to ~1e-7 relative). */
static void test_backward_fd(int64_t N, int64_t V, int lse_dtype) {
  int64_t shape[2] = {N, V}, nshape[1] = {N}, t[64];
  lt_tensor *x = check_random(2, shape, LT_F64, -3, 3), *tg = make_targets(N, V, LT_I64, IGNORE, 1, t);
  lt_tensor *dl = check_random(1, nshape, LT_F32, -1, 1), *losses = lt_tensor_new(), *lse = lt_tensor_new();
  lt_tensor *dx = lt_tensor_new();
  double rtol = lse_dtype == LT_F64 ? 1e-8 : 1e-6;
  if (lse_dtype == LT_F64) lt_empty(lse, 1, nshape, LT_F64, LT_DEVICE_CPU);
  CHECK_OK(lt_cross_entropy_forward(losses, lse, x, tg, IGNORE));
  CHECK(lse->dtype == lse_dtype && losses->dtype == LT_F32, "saved lse %s, losses %s", lt_dtype_name(lse->dtype),
        lt_dtype_name(losses->dtype));
  CHECK_OK(lt_cross_entropy_backward(dx, dl, x, tg, lse, IGNORE));
  double *R = to_doubles(dl), *p = lt_data_ptr(x), worst_ref = 0, worst_op = 0;
  int bad_ref = 0, bad_op = 0;
  for (int64_t i = 0; i < N * V; i++) {
    double keep = p[i], got = check_at(dx, i);
    p[i] = keep + 1e-5;
    double fp = ref_functional(p, t, R, N, V);
    p[i] = keep - 1e-5;
    double fm = ref_functional(p, t, R, N, V);
    p[i] = keep + 1e-5;
    double gp = op_functional(x, tg, R);
    p[i] = keep - 1e-5;
    double gm = op_functional(x, tg, R);
    p[i] = keep;
    double fd = (fp - fm) / 2e-5, fd_op = (gp - gm) / 2e-5;
    if (!check_close(got, fd, rtol, rtol / 100)) bad_ref++;
    if (!check_close(got, fd_op, rtol, rtol / 100)) bad_op++;
    worst_ref = fmax(worst_ref, fabs(got - fd)), worst_op = fmax(worst_op, fabs(got - fd_op));
  }
  CHECK(bad_ref == 0 && bad_op == 0,
        "cross_entropy dlogits [%lld,%lld] lse %s vs differences: %d/%d bad, max err %g / %g", (long long)N,
        (long long)V, lt_dtype_name(lse_dtype), bad_ref, bad_op, worst_ref, worst_op);
  for (int64_t i = 0; i < N; i++) /* ignored rows: exactly zero */
    for (int64_t j = 0; t[i] == IGNORE && j < V; j++)
      CHECK(check_at(dx, i * V + j) == 0, "ignored row %lld", (long long)i);
  free(R);
  lt_release(x), lt_release(tg), lt_release(dl), lt_release(losses), lt_release(lse), lt_release(dx);
}

/* f32/bf16/f16 backward against the f64 backward on the same rounded logits; optionally a
 * non-contiguous logits input and a non-contiguous dlogits output. */
static void test_backward_dtype(int dtype, int64_t N, int64_t V, int noncontig) {
  int64_t shape[2] = {N, V}, nshape[1] = {N}, t[64];
  lt_tensor *x = check_random(2, shape, dtype, -4, 4), *tg = make_targets(N, V, LT_I32, IGNORE, 1, t);
  lt_tensor *x64 = lt_tensor_new(), *dl = check_random(1, nshape, LT_F32, 0.5, 2);
  lt_empty(x64, 2, shape, LT_F64, LT_DEVICE_CPU), lt_copy(x64, x);
  lt_tensor *l = lt_tensor_new(), *s = lt_tensor_new(), *l64 = lt_tensor_new(), *s64 = lt_tensor_new();
  lt_tensor *dx = lt_tensor_new(), *dx64 = lt_tensor_new(), *tmp = lt_tensor_new();
  lt_tensor *xn = noncontig ? check_noncontig(x) : x;
  if (noncontig) {
    int64_t tshape[2] = {V, N};
    lt_empty(tmp, 2, tshape, dtype, LT_DEVICE_CPU);
    lt_transpose(dx, tmp, 0, 1);
  }
  CHECK_OK(lt_cross_entropy_forward(l, s, xn, tg, IGNORE));
  CHECK_OK(lt_cross_entropy_backward(dx, dl, xn, tg, s, IGNORE));
  CHECK_OK(lt_cross_entropy_forward(l64, s64, x64, tg, IGNORE));
  CHECK_OK(lt_cross_entropy_backward(dx64, dl, x64, tg, s64, IGNORE));
  double tol = dtype == LT_F32 ? 1e-6 : dtype == LT_F16 ? 2e-3 : 1e-2, worst = 0;
  for (int64_t i = 0; i < N * V; i++) worst = fmax(worst, fabs(check_at(dx, i) - check_at(dx64, i)));
  CHECK(worst <= tol * 2 && dx->dtype == dtype, "cross_entropy backward %s [%lld,%lld] nc %d: max err %g",
        lt_dtype_name(dtype), (long long)N, (long long)V, noncontig, worst);
  if (xn != x) lt_release(xn);
  lt_release(x), lt_release(tg), lt_release(x64), lt_release(dl), lt_release(l), lt_release(s), lt_release(l64);
  lt_release(s64), lt_release(dx), lt_release(dx64), lt_release(tmp);
}

/* -inf logits (masked vocabulary entries), large logits (f32 lse keeps ~6e-5 absolute at 1e3),
 * an in-range ignore_index, in-place backward. */
static void test_special(void) {
  int64_t shape[2] = {3, 5};
  double xv[15] = {0, -INFINITY, 1, 2, -INFINITY, 5, 5, 5, 5, 5, 1e3, 1e3 + 1, 1e3 - 1, 1e3, 1e3};
  lt_tensor *x = lt_tensor_new(), *tg = lt_tensor_new(), *l = lt_tensor_new(), *s = lt_tensor_new();
  lt_empty(x, 2, shape, LT_F32, LT_DEVICE_CPU), lt_copy_from_buffer(x, xv, LT_F64, 15);
  int64_t tshape[1] = {3}, tv[3] = {3, 0, 1};
  lt_empty(tg, 1, tshape, LT_I64, LT_DEVICE_CPU), lt_copy_from_buffer(tg, tv, LT_I64, 3);
  CHECK_OK(lt_cross_entropy_forward(l, s, x, tg, 0)); /* ignore_index 0: row 1 ignored */
  double w0 = log(1 + exp(1) + exp(2)) - 2, w2 = log(exp(-1) + 1 + exp(-2) + 2 * exp(-1));
  CHECK(check_close(check_at(l, 0), w0, 1e-6, 0) && check_at(l, 1) == 0 && check_close(check_at(l, 2), w2, 0, 2e-4),
        "special rows: %g %g %g, want %g 0 %g", check_at(l, 0), check_at(l, 1), check_at(l, 2), w0, w2);
  lt_tensor *dl = lt_tensor_new(), *dx = lt_tensor_new();
  int64_t nshape[1] = {3};
  lt_empty(dl, 1, nshape, LT_F32, LT_DEVICE_CPU), lt_fill(dl, 1.0);
  CHECK_OK(lt_cross_entropy_backward(dx, dl, x, tg, s, 0));
  CHECK(check_at(dx, 1) == 0 && check_at(dx, 4) == 0 && check_at(dx, 5) == 0, "masked/ignored entries nonzero");
  double rowsum = 0;
  for (int j = 0; j < 5; j++) rowsum += check_at(dx, 10 + j);
  CHECK(fabs(rowsum) < 1e-4, "gradient row of large logits sums to %g", rowsum);
  CHECK_OK(lt_cross_entropy_backward(x, dl, x, tg, s, 0)); /* in place */
  int same = 1;
  for (int i = 0; i < 15; i++) same &= check_at(x, i) == check_at(dx, i);
  CHECK(same, "in-place cross_entropy backward differs");
  lt_release(x), lt_release(tg), lt_release(l), lt_release(s), lt_release(dl), lt_release(dx);
}

static void test_bad_inputs(void) {
  int64_t shape[2] = {4, 7}, n4[1] = {4}, n3[1] = {3}, t[4];
  lt_tensor *x = check_random(2, shape, LT_F32, -1, 1), *tg = make_targets(4, 7, LT_I32, IGNORE, 0, t);
  lt_tensor *l = lt_tensor_new(), *s = lt_tensor_new(), *dx = lt_tensor_new(), *tf = check_random(1, n4, LT_F32, 0, 3);
  lt_tensor *t3 = check_random(1, n3, LT_I64, 0, 3), *x1 = check_random(1, n4, LT_F32, 0, 1);
  lt_tensor *s64 = check_random(1, n4, LT_F64, 0, 1), *dl3 = check_random(1, n3, LT_F32, 0, 1);
  CHECK_OK(lt_cross_entropy_forward(l, s, x, tg, IGNORE));
  lt_store_f64(lt_data_ptr(tg), LT_I32, 2, 7);
  CHECK_ERR(lt_cross_entropy_forward(l, s, x, tg, IGNORE), "target 7 out of range [0, 7) at row 2");
  CHECK_ERR(lt_cross_entropy_backward(dx, l, x, tg, s, IGNORE), "target 7 out of range [0, 7) at row 2");
  lt_store_f64(lt_data_ptr(tg), LT_I32, 2, -1);
  CHECK_ERR(lt_cross_entropy_forward(l, s, x, tg, IGNORE), "target -1 out of range [0, 7) at row 2");
  CHECK_OK(lt_cross_entropy_forward(l, s, x, tg, -1)); /* -1 is fine as ignore_index */
  CHECK_ERR(lt_cross_entropy_forward(l, s, x, tf, IGNORE), "targets is [4] f32 cpu, expected [4] i32 or i64");
  CHECK_ERR(lt_cross_entropy_forward(l, s, x, t3, IGNORE), "targets is [3] i64 cpu, expected [4]");
  CHECK_ERR(lt_cross_entropy_forward(l, s, x1, tg, -1), "logits is [4] f32 cpu, expected (N, V)");
  CHECK_ERR(lt_cross_entropy_forward(NULL, s, x, tg, -1), "losses is NULL");
  CHECK_ERR(lt_cross_entropy_forward(s64, NULL, x, tg, -1),
            "cross_entropy (losses): out is [4] f64 cpu, expected [4] f32");
  CHECK_ERR(lt_cross_entropy_backward(dx, l, x, tg, t3, -1), "lse is [3] i64 cpu, expected f32 [4]");
  CHECK_ERR(lt_cross_entropy_backward(dx, dl3, x, tg, s, -1), "dlosses is [3] f32 cpu, expected [4]");
  CHECK_ERR(lt_cross_entropy_backward(dx, l, x, tg, NULL, -1), "lse is NULL");
  x->device = 15; /* claims cuda:15, which no machine here has: refused before any kernel */
  CHECK_ERR(lt_cross_entropy_forward(l, s, x, tg, -1), "cross_entropy: tensors on different devices: cuda:15 vs cpu");
  x->device = LT_DEVICE_CPU;
  lt_release(x), lt_release(tg), lt_release(l), lt_release(s), lt_release(dx), lt_release(tf), lt_release(t3);
  lt_release(x1), lt_release(s64), lt_release(dl3);
}

int main(void) {
  static const int64_t vocab[] = {1, 7, 33, 257, 1000};
  static const int dtypes[] = {LT_F32, LT_F64, LT_BF16, LT_F16};
  for (int d = 0; d < 4; d++)
    for (int k = 0; k < 5; k++) {
      int64_t N = check_randint(1, 40);
      test_forward(dtypes[d], k & 1 ? LT_I32 : LT_I64, N, vocab[k], 0, k & 1);
      if (dtypes[d] != LT_F16) test_forward(dtypes[d], LT_I64, N, vocab[k], dtypes[d] == LT_BF16 ? 64 : 300, 0);
    }
  test_forward(LT_F32, LT_I32, 64, 5000, 0, 0); /* large enough for the parallel path */
  test_backward_fd(3, 1, LT_F64);
  test_backward_fd(4, 7, LT_F64);
  test_backward_fd(5, 33, LT_F64);
  test_backward_fd(5, 33, LT_F32);
  for (int d = 0; d < 4; d++) {
    test_backward_dtype(dtypes[d], 9, 33, 0);
    test_backward_dtype(dtypes[d], 40, 1000, 1);
  }
  test_special();
  test_bad_inputs();
  return check_summary();
}
