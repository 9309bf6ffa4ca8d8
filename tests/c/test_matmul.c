/* test_matmul.c — lt_matmul against naive double loops: trans flags, broadcast batch dims,
 * every BLAS-readable and unreadable layout, alpha/beta, in-place and strided outputs. */
#include "check.h"

/* Value of t at (batch index bi over the broadcast batch shape bshape, row i, col j). */
static double at_batch(const lt_tensor *t, int nb, const int64_t *bshape, int64_t bi, int64_t i, int64_t j) {
  int64_t idx[LT_MAX_DIMS], lin = 0;
  for (int d = nb - 1; d >= 0; d--) idx[d] = bi % bshape[d], bi /= bshape[d];
  int tb = t->ndim - 2;
  for (int d = 0; d < tb; d++) {
    int64_t k = idx[nb - tb + d];
    lin = lin * t->shape[d] + (t->shape[d] == 1 ? 0 : k);
  }
  lin = (lin * t->shape[tb] + i) * t->shape[tb + 1] + j;
  return check_at(t, lin);
}

/* A tensor with t's values laid out differently: 0 contiguous, 1 column-major last two dims,
 * 2 rows padded (leading dim > cols), 3 every other element of a wider tensor, 4 check_noncontig. */
static lt_tensor *relayout(const lt_tensor *t, int how) {
  lt_tensor *r = lt_tensor_new(), *big = lt_tensor_new(), *tmp = lt_tensor_new();
  int n = t->ndim;
  int64_t shape[LT_MAX_DIMS];
  memcpy(shape, t->shape, sizeof shape);
  if (how == 1) {
    int64_t tmp_shape[LT_MAX_DIMS];
    memcpy(tmp_shape, shape, sizeof tmp_shape);
    tmp_shape[n - 2] = shape[n - 1], tmp_shape[n - 1] = shape[n - 2];
    lt_empty(big, n, tmp_shape, t->dtype, LT_DEVICE_CPU);
    lt_transpose(r, big, n - 2, n - 1);
  } else if (how == 2 || how == 3) {
    shape[n - 1] = how == 2 ? shape[n - 1] + 3 : shape[n - 1] * 2;
    lt_empty(big, n, shape, t->dtype, LT_DEVICE_CPU);
    if (how == 2)
      lt_narrow(r, big, n - 1, 1, t->shape[n - 1]);
    else
      lt_slice(r, big, n - 1, 0, shape[n - 1], 2);
  } else if (how == 4) {
    lt_release(r), lt_release(big), lt_release(tmp);
    return check_noncontig(t);
  } else {
    lt_empty(r, n, shape, t->dtype, LT_DEVICE_CPU);
  }
  lt_copy(r, t);
  lt_release(big), lt_release(tmp);
  return r;
}

static int64_t numel_of(int n, const int64_t *s) { return lt_shape_numel(n, s); }

/* Runs one matmul and compares every element with the double reference. */
static void check_case(int dtype, int nba, const int64_t *ba, int nbb, const int64_t *bb, int64_t M, int64_t N,
                       int64_t K, int trans_a, int trans_b, double alpha, double beta, int layout_a, int layout_b,
                       int layout_out) {
  int64_t sa[LT_MAX_DIMS], sb[LT_MAX_DIMS], so[LT_MAX_DIMS], bshape[LT_MAX_DIMS];
  for (int d = 0; d < nba; d++) sa[d] = ba[d];
  for (int d = 0; d < nbb; d++) sb[d] = bb[d];
  sa[nba] = trans_a ? K : M, sa[nba + 1] = trans_a ? M : K;
  sb[nbb] = trans_b ? N : K, sb[nbb + 1] = trans_b ? K : N;
  int nb;
  lt_broadcast_shape(nba, ba, nbb, bb, &nb, bshape);
  memcpy(so, bshape, sizeof(int64_t) * nb), so[nb] = M, so[nb + 1] = N;
  lt_tensor *a0 = check_random(nba + 2, sa, dtype, -1, 1), *b0 = check_random(nbb + 2, sb, dtype, -1, 1);
  lt_tensor *o0 = check_random(nb + 2, so, dtype, -1, 1);
  lt_tensor *a = relayout(a0, layout_a), *b = relayout(b0, layout_b), *out = lt_tensor_new();
  if (beta != 0 || layout_out) {
    lt_release(out);
    out = relayout(o0, layout_out);
  }
  int rc = lt_matmul(out, a, b, trans_a, trans_b, alpha, beta);
  char s1[LT_SHAPE_STR], s2[LT_SHAPE_STR];
  CHECK(rc == 0, "matmul %s %s @ %s: %s", lt_dtype_name(dtype), lt_shape_str(s1, nba + 2, sa),
        lt_shape_str(s2, nbb + 2, sb), lt_last_error());
  if (rc == 0) {
    CHECK(out->ndim == nb + 2 && out->dtype == dtype && lt_numel(out) == numel_of(nb + 2, so), "out shape");
    double tol = check_tol(dtype), worst = 0;
    for (int64_t bi = 0; bi < numel_of(nb, bshape); bi++)
      for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
          double want = 0, scale = 0;
          for (int64_t k = 0; k < K; k++) {
            double x = trans_a ? at_batch(a0, nb, bshape, bi, k, i) : at_batch(a0, nb, bshape, bi, i, k);
            double y = trans_b ? at_batch(b0, nb, bshape, bi, j, k) : at_batch(b0, nb, bshape, bi, k, j);
            want += x * y, scale += fabs(x * y);
          }
          double c0 = at_batch(o0, nb, bshape, bi, i, j);
          want = alpha * want + beta * c0, scale = fabs(alpha) * scale + fabs(beta * c0) + 1e-30;
          double err = fabs(at_batch(out, nb, bshape, bi, i, j) - want) / scale;
          worst = err > worst ? err : worst;
        }
    CHECK(worst <= tol, "matmul %s %s%s @ %s%s alpha %g beta %g layouts %d %d %d: rel err %g", lt_dtype_name(dtype),
          lt_shape_str(s1, nba + 2, sa), trans_a ? "^T" : "", lt_shape_str(s2, nbb + 2, sb), trans_b ? "^T" : "", alpha,
          beta, layout_a, layout_b, layout_out, worst);
  }
  lt_release(a0), lt_release(b0), lt_release(o0), lt_release(a), lt_release(b), lt_release(out);
}

static void test_random(void) {
  static const int dtypes[] = {LT_F32, LT_F64, LT_BF16, LT_F16};
  for (int trial = 0; trial < 400; trial++) {
    int dtype = dtypes[trial % 4];
    int nba = (int)check_randint(0, 3), nbb = (int)check_randint(0, 3);
    int64_t ba[2], bb[2];
    int64_t full[2] = {check_randint(1, 4), check_randint(1, 4)};
    /* batch dims are aligned from the right; each side holds the full size or 1 */
    for (int d = 0; d < nba; d++) ba[d] = check_uniform() < 0.3 ? 1 : full[2 - nba + d];
    for (int d = 0; d < nbb; d++) bb[d] = check_uniform() < 0.3 ? 1 : full[2 - nbb + d];
    int64_t M = check_randint(1, 10), N = check_randint(1, 10), K = check_randint(1, 10);
    double beta = trial % 3 == 0 ? 0 : check_uniform() * 2 - 1, alpha = trial % 5 == 0 ? 1 : check_uniform() * 3 - 1.5;
    int la = (int)check_randint(0, 5), lb = (int)check_randint(0, 5),
        lo = trial % 4 == 1 ? (int)check_randint(0, 5) : 0;
    check_case(dtype, nba, ba, nbb, bb, M, N, K, (int)check_randint(0, 2), (int)check_randint(0, 2), alpha, beta, la,
               lb, lo);
  }
}

static void test_shapes(void) {
  int64_t b3[1] = {3}, b64[1] = {64}, b21[2] = {2, 1}, b13[2] = {1, 3};
  check_case(LT_F32, 1, b3, 0, NULL, 5, 4, 7, 0, 0, 1, 0, 0, 0, 0);      /* x (3,5,7) @ w (7,4): folded rows */
  check_case(LT_F32, 1, b3, 0, NULL, 5, 4, 7, 0, 1, 1, 0.5, 0, 0, 0);    /* x @ w^T, as nn.Linear */
  check_case(LT_F32, 0, NULL, 1, b3, 5, 4, 7, 1, 0, 1, 0, 0, 0, 0);      /* a 2-D against a batch of b */
  check_case(LT_F64, 2, b21, 2, b13, 3, 2, 4, 0, 0, 2, 0, 1, 2, 0);      /* (2,1) with (1,3) batches */
  check_case(LT_F32, 1, b64, 1, b64, 8, 8, 8, 0, 0, 1, 0, 0, 0, 0);      /* many small gemms in parallel */
  check_case(LT_F32, 1, b64, 1, b64, 8, 6, 5, 1, 1, 1, 1, 1, 1, 1);      /* ... with every layout flip */
  check_case(LT_F32, 0, NULL, 0, NULL, 65, 66, 70, 0, 0, 1, 0, 0, 0, 0); /* cut over threads (rows) */
  /* big gemms cut into blocks of C by rows or columns, with every transpose and layout */
  check_case(LT_F32, 0, NULL, 0, NULL, 97, 50, 80, 1, 1, 1, 0.5, 1, 2, 1);
  check_case(LT_F64, 0, NULL, 0, NULL, 37, 131, 90, 1, 0, -2, 0, 2, 1, 3);
  check_case(LT_F32, 0, NULL, 0, NULL, 41, 99, 100, 0, 1, 1, 1, 0, 0, 0);
  check_case(LT_F32, 0, NULL, 0, NULL, 41, 99, 100, 1, 1, 1, 0, 1, 1, 2);
  check_case(LT_F32, 1, b3, 1, b3, 60, 70, 75, 1, 0, 1, 0, 0, 0, 0);    /* a batch of big gemms */
  check_case(LT_BF16, 1, b3, 0, NULL, 33, 17, 40, 0, 1, 1, 1, 4, 1, 2); /* 16-bit through f32 scratch */
  check_case(LT_F16, 1, b3, 1, b3, 1, 1, 40, 1, 0, 1, 0, 0, 3, 0);      /* 1x1 results */
  check_case(LT_F32, 0, NULL, 0, NULL, 1, 9, 4, 0, 0, 1, 0, 3, 2, 1);   /* a single row */
  check_case(LT_F64, 1, b3, 0, NULL, 4, 1, 6, 0, 0, 1, -1, 1, 1, 3);    /* a single column */
}

static void test_special(void) {
  /* K == 0: out = beta * out */
  int64_t sa[2] = {3, 0}, sb[2] = {0, 2}, so[2] = {3, 2};
  lt_tensor *a = check_random(2, sa, LT_F32, 0, 1), *b = check_random(2, sb, LT_F32, 0, 1);
  lt_tensor *out = check_random(2, so, LT_F32, 1, 2), *z = lt_tensor_new();
  double before = check_at(out, 4);
  CHECK_OK(lt_matmul(out, a, b, 0, 0, 1, 0.5));
  CHECK(check_at(out, 4) == (float)(0.5 * before), "K == 0 scales out by beta");
  CHECK_OK(lt_matmul(z, a, b, 0, 0, 1, 0));
  CHECK(z->shape[0] == 3 && z->shape[1] == 2 && check_at(z, 5) == 0, "K == 0 with beta 0 gives zeros");
  lt_release(a), lt_release(b), lt_release(out), lt_release(z);

  /* in place: out is a itself (K = 300 spans several of OpenBLAS's panels, so an aliased
   * write would be read back) */
  int64_t s4[2] = {300, 300};
  lt_tensor *x = check_random(2, s4, LT_F64, -1, 1), *w = check_random(2, s4, LT_F64, -1, 1), *x0 = lt_tensor_new();
  CHECK_OK(lt_empty(x0, 2, s4, LT_F64, LT_DEVICE_CPU));
  CHECK_OK(lt_copy(x0, x));
  CHECK_OK(lt_matmul(x, x, w, 0, 0, 1, 0));
  double err = 0;
  for (int i = 0; i < 300; i++)
    for (int j = 0; j < 300; j++) {
      double want = 0;
      for (int k = 0; k < 300; k++) want += check_at(x0, i * 300 + k) * check_at(w, k * 300 + j);
      err = fmax(err, fabs(check_at(x, i * 300 + j) - want));
    }
  CHECK(err < 1e-12, "in-place matmul err %g", err);
  /* NaN in out does not leak through beta == 0 */
  lt_tensor *o = lt_tensor_new();
  CHECK_OK(lt_empty(o, 2, s4, LT_F64, LT_DEVICE_CPU));
  CHECK_OK(lt_fill(o, NAN));
  CHECK_OK(lt_matmul(o, x0, w, 0, 0, 1, 0));
  CHECK(!isnan(check_at(o, 7)), "beta == 0 ignores what out held");
  lt_release(x), lt_release(w), lt_release(x0), lt_release(o);
}

static void test_errors(void) {
  int64_t s48[2] = {4, 8}, s73[2] = {7, 3}, s84[2] = {8, 4}, s2[3] = {2, 4, 8}, s3[3] = {3, 8, 3}, s1[1] = {8};
  lt_tensor *a = check_random(2, s48, LT_F32, 0, 1), *b = check_random(2, s73, LT_F32, 0, 1);
  lt_tensor *at = check_random(2, s84, LT_F32, 0, 1), *a3 = check_random(3, s2, LT_F32, 0, 1);
  lt_tensor *b3 = check_random(3, s3, LT_F32, 0, 1), *v = check_random(1, s1, LT_F32, 0, 1);
  lt_tensor *d = check_random(2, s84, LT_F64, 0, 1), *ia = check_random(2, s48, LT_I32, 0, 3);
  lt_tensor *ib = check_random(2, s84, LT_I32, 0, 3), *out = lt_tensor_new(), *undef = lt_tensor_new();
  CHECK_ERR(lt_matmul(out, a, b, 0, 0, 1, 0), "matmul: inner dims differ: [4,8] @ [7,3]");
  CHECK_ERR(lt_matmul(out, at, b, 1, 0, 1, 0), "matmul: inner dims differ: [8,4]^T @ [7,3]");
  CHECK_ERR(lt_matmul(out, a, b, 0, 1, 1, 0), "matmul: inner dims differ: [4,8] @ [7,3]^T");
  CHECK_ERR(lt_matmul(out, a, d, 0, 0, 1, 0), "matmul: dtype mismatch: f32 vs f64");
  CHECK_ERR(lt_matmul(out, ia, ib, 0, 0, 1, 0), "matmul: needs a floating dtype, got i32");
  CHECK_ERR(lt_matmul(out, a3, b3, 0, 0, 1, 0), "matmul: batch dims of [2,4,8] and [3,8,3] do not broadcast");
  CHECK_ERR(lt_matmul(out, v, at, 0, 0, 1, 0), "matmul: needs at least 2 dims on each side, got [8] @ [8,4]");
  CHECK_ERR(lt_matmul(out, a, at, 0, 0, 1, 0.5), "matmul: beta != 0 needs a defined out");
  CHECK_ERR(lt_matmul(out, undef, at, 0, 0, 1, 0), "matmul: a is undefined");
  CHECK_ERR(lt_matmul(out, a, NULL, 0, 0, 1, 0), "matmul: b is NULL");
  lt_tensor cuda = *a, cudb = *at;
  cuda.device = 0, cudb.device = 0;
  /* a CUDA build without a device says the device is missing; a CPU-only build, no CUDA path */
  CHECK_ERR(lt_matmul(out, &cuda, &cudb, 0, 0, 1, 0),
            strstr(lt_build_info(), "cuda: built") ? "is not available" : "not implemented on cuda yet");
  CHECK_ERR(lt_matmul(out, &cuda, at, 0, 0, 1, 0), "matmul: tensors on different devices");
  CHECK(!lt_is_defined(out), "failed matmuls leave out undefined");
  lt_tensor *wrong = check_random(2, s48, LT_F32, 0, 1);
  CHECK_ERR(lt_matmul(wrong, a, at, 0, 0, 1, 0), "matmul: out is [4,8] f32 cpu, expected [4,4] f32 cpu");
  lt_tensor *ts[] = {a, b, at, a3, b3, v, d, ia, ib, out, undef, wrong};
  for (size_t k = 0; k < sizeof ts / sizeof ts[0]; k++) lt_release(ts[k]);
}

int main(void) {
  test_random();
  test_shapes();
  test_special();
  test_errors();
  return check_summary();
}
