/* test_gather.c — lt_gather, lt_scatter, lt_scatter_add, lt_index_select, lt_index_add and
 * lt_index_copy against naive loops in double (every dtype, i32/i64 index, contiguous and
 * transposed inputs, a transposed out), scatter_add's sums the same bits on every run and thread
 * count (a large case), and the refusals: out-of-range indices (never a wild access), shapes,
 * dtypes. */
#include "check.h"

/* row-major coordinates of flat position i in shape */
static void coords_of(int64_t i, int ndim, const int64_t *shape, int64_t *c) {
  for (int d = ndim - 1; d >= 0; d--) c[d] = i % shape[d], i /= shape[d];
}
static int64_t flat_of(int ndim, const int64_t *shape, const int64_t *c) {
  int64_t f = 0;
  for (int d = 0; d < ndim; d++) f = f * shape[d] + c[d];
  return f;
}

static int count_bad(const lt_tensor *got, const double *want, double tol, const char *what) {
  int bad = 0;
  for (int64_t i = 0, n = lt_numel(got); i < n; i++)
    if (!check_close(check_at(got, i), want[i], tol, tol) && bad++ < 3)
      fprintf(stderr, "  %s element %lld: got %.9g want %.9g\n", what, (long long)i, check_at(got, i), want[i]);
  return bad;
}

static lt_tensor *maybe_noncontig(lt_tensor *t, int nc) {
  if (!nc) return t;
  lt_tensor *c = check_noncontig(t);
  lt_release(t);
  return c;
}

static void test_gather_scatter(void) {
  int dtypes[5] = {LT_F32, LT_F64, LT_BF16, LT_F16, LT_I32};
  for (int trial = 0; trial < 30; trial++) {
    int dt = dtypes[trial % 5], idt = trial % 2 ? LT_I32 : LT_I64, nc = (trial / 2) % 2;
    int64_t xs[3] = {check_randint(1, 5), check_randint(1, 6), check_randint(1, 7)}, is[3];
    int dim = (int)check_randint(0, 3);
    for (int d = 0; d < 3; d++) is[d] = d == dim ? check_randint(1, 9) : check_randint(1, xs[d] + 1);
    lt_tensor *x = maybe_noncontig(check_random(3, xs, dt, -4, 4), nc);
    lt_tensor *index = maybe_noncontig(check_random(3, is, idt, 0, (double)xs[dim]), !nc);
    lt_tensor *src = maybe_noncontig(check_random(3, is, dt, -4, 4), nc);
    lt_tensor *g = lt_tensor_new(), *sa = lt_tensor_new(), *sc = lt_tensor_new();
    int64_t ni = lt_numel(index), nx = lt_numel(x), c[3];
    double *want = malloc((size_t)ni * sizeof(double)), *sum = malloc((size_t)nx * sizeof(double));
    double *put = malloc((size_t)nx * sizeof(double));
    for (int64_t i = 0; i < nx; i++) sum[i] = put[i] = check_at(x, i);
    for (int64_t i = 0; i < ni; i++) { /* row-major over index: along dim in order per line */
      coords_of(i, 3, is, c);
      c[dim] = (int64_t)check_at(index, i);
      want[i] = check_at(x, flat_of(3, xs, c));
    }
    /* sums per destination in index order along dim: the lines' order */
    for (int64_t i = 0; i < ni; i++) {
      coords_of(i, 3, is, c);
      c[dim] = (int64_t)check_at(index, i);
      int64_t f = flat_of(3, xs, c);
      sum[f] += check_at(src, i);
    }
    int64_t order[3] = {dim == 0 ? 1 : 0, dim == 2 ? 1 : 2, dim}; /* dim innermost: the last write wins */
    int64_t k[3];
    for (k[0] = 0; k[0] < is[order[0]]; k[0]++)
      for (k[1] = 0; k[1] < is[order[1]]; k[1]++)
        for (k[2] = 0; k[2] < is[order[2]]; k[2]++) {
          int64_t p[3];
          for (int d = 0; d < 3; d++) p[order[d]] = k[d];
          int64_t i = flat_of(3, is, p);
          p[dim] = (int64_t)check_at(index, i);
          put[flat_of(3, xs, p)] = check_at(src, i);
        }
    double tol = dt == LT_I32 ? 0 : 2 * check_tol(dt) * (dt == LT_BF16 || dt == LT_F16 ? 4 : 1);
    CHECK_OK(lt_gather(g, x, dim - 3 * (trial % 3 == 0), index));
    CHECK(count_bad(g, want, 0, "gather") == 0, "gather trial %d", trial);
    CHECK_OK(lt_scatter_add(sa, x, dim, index, src));
    CHECK(count_bad(sa, sum, tol * 4, "scatter_add") == 0, "scatter_add trial %d", trial);
    if (dt != LT_I32) { /* amax / amin: the naive max / min of x's value and the src values written there */
      double *mx = malloc((size_t)nx * sizeof(double)), *mn = malloc((size_t)nx * sizeof(double));
      for (int64_t i = 0; i < nx; i++) mx[i] = mn[i] = check_at(x, i);
      for (int64_t i = 0; i < ni; i++) {
        coords_of(i, 3, is, c);
        c[dim] = (int64_t)check_at(index, i);
        int64_t f = flat_of(3, xs, c);
        mx[f] = fmax(mx[f], check_at(src, i)), mn[f] = fmin(mn[f], check_at(src, i));
      }
      lt_tensor *r = lt_tensor_new();
      CHECK_OK(lt_scatter_reduce(r, x, dim, index, src, "amax"));
      CHECK(count_bad(r, mx, 0, "amax") == 0, "scatter_reduce amax trial %d", trial);
      lt_release(r), r = lt_tensor_new();
      CHECK_OK(lt_scatter_reduce(r, x, dim, index, src, "amin"));
      CHECK(count_bad(r, mn, 0, "amin") == 0, "scatter_reduce amin trial %d", trial);
      lt_release(r);
      free(mx), free(mn);
    }
    CHECK_OK(lt_scatter(sc, x, dim, index, src));
    CHECK(count_bad(sc, put, 0, "scatter") == 0, "scatter trial %d", trial);
    lt_release(x), lt_release(index), lt_release(src), lt_release(g), lt_release(sa), lt_release(sc);
    free(want), free(sum), free(put);
  }
}

static void test_index_ops(void) {
  int dtypes[4] = {LT_F32, LT_F64, LT_BF16, LT_F16};
  for (int trial = 0; trial < 16; trial++) {
    int dt = dtypes[trial % 4], idt = trial % 2 ? LT_I32 : LT_I64, nc = (trial / 2) % 2;
    int64_t xs[3] = {check_randint(1, 5), check_randint(2, 6), check_randint(1, 7)};
    int dim = (int)check_randint(0, 3);
    int64_t n = check_randint(1, 8), ss[3] = {xs[0], xs[1], xs[2]}, c[3];
    ss[dim] = n;
    lt_tensor *x = maybe_noncontig(check_random(3, xs, dt, -4, 4), nc);
    lt_tensor *index = check_random(1, &n, idt, 0, (double)xs[dim]);
    lt_tensor *src = maybe_noncontig(check_random(3, ss, dt, -4, 4), !nc);
    lt_tensor *sel = lt_tensor_new(), *add = lt_tensor_new(), *cp = lt_tensor_new();
    int64_t nx = lt_numel(x), ns = lt_numel(src);
    double *want = malloc((size_t)ns * sizeof(double)), *sum = malloc((size_t)nx * sizeof(double));
    double *put = malloc((size_t)nx * sizeof(double));
    for (int64_t i = 0; i < nx; i++) sum[i] = put[i] = check_at(x, i);
    for (int64_t j = 0; j < n; j++)
      for (int64_t i = 0; i < ns; i++) {
        coords_of(i, 3, ss, c);
        if (c[dim] != j) continue;
        c[dim] = (int64_t)check_at(index, j);
        int64_t f = flat_of(3, xs, c);
        want[i] = check_at(x, f);
        sum[f] += check_at(src, i);
        put[f] = check_at(src, i);
      }
    double tol = 8 * check_tol(dt);
    CHECK_OK(lt_index_select(sel, x, dim, index));
    CHECK(count_bad(sel, want, 0, "index_select") == 0, "index_select trial %d", trial);
    CHECK_OK(lt_index_add(add, x, dim - 3, index, src));
    CHECK(count_bad(add, sum, tol, "index_add") == 0, "index_add trial %d", trial);
    /* into a transposed out */
    int64_t ts[3] = {xs[2], xs[1], xs[0]};
    lt_tensor *base = lt_tensor_new(), *tout = lt_tensor_new();
    CHECK_OK(lt_empty(base, 3, ts, dt, LT_DEVICE_CPU));
    CHECK_OK(lt_transpose(tout, base, 0, 2));
    CHECK_OK(lt_index_copy(tout, x, dim, index, src));
    CHECK(count_bad(tout, put, 0, "index_copy") == 0, "index_copy trial %d", trial);
    lt_release(base), lt_release(tout);
    lt_release(x), lt_release(index), lt_release(src), lt_release(sel), lt_release(add), lt_release(cp);
    free(want), free(sum), free(put);
  }
}

/* a large scatter_add (many duplicates, above the parallel grain): the same bits twice, and the
 * f32 sums as a serial loop in index order gives them */
static void test_deterministic(void) {
  int64_t xs[2] = {64, 50}, is[2] = {64, 4000};
  lt_tensor *x = check_random(2, xs, LT_F32, -1, 1), *index = check_random(2, is, LT_I64, 0, 50);
  lt_tensor *src = check_random(2, is, LT_F32, -1, 1), *a = lt_tensor_new(), *b = lt_tensor_new();
  CHECK_OK(lt_scatter_add(a, x, 1, index, src));
  CHECK_OK(lt_scatter_add(b, x, 1, index, src));
  CHECK(memcmp(lt_data_ptr(a), lt_data_ptr(b), 64 * 50 * sizeof(float)) == 0, "scatter_add: two runs differ");
  float *want = malloc(64 * 50 * sizeof(float));
  memcpy(want, lt_data_ptr(x), 64 * 50 * sizeof(float));
  const int64_t *ip = lt_data_ptr(index);
  const float *sp = lt_data_ptr(src);
  for (int64_t r = 0; r < 64; r++)
    for (int64_t j = 0; j < 4000; j++) want[r * 50 + ip[r * 4000 + j]] += sp[r * 4000 + j];
  CHECK(memcmp(lt_data_ptr(a), want, 64 * 50 * sizeof(float)) == 0, "scatter_add: not the serial sums");
  free(want);
  lt_release(x), lt_release(index), lt_release(src), lt_release(a), lt_release(b);
}

/* index_add along dim 0 of wide rows (several tiles per row on the CPU): the serial sums */
static void test_wide_rows(void) {
  int64_t xs[2] = {50, 600}, n = 3000, ss[2] = {3000, 600};
  lt_tensor *x = check_random(2, xs, LT_F32, -1, 1), *index = check_random(1, &n, LT_I32, 0, 50);
  lt_tensor *src = check_random(2, ss, LT_F32, -1, 1), *a = lt_tensor_new(), *sel = lt_tensor_new();
  CHECK_OK(lt_index_add(a, x, 0, index, src));
  CHECK_OK(lt_index_select(sel, x, 0, index));
  float *want = malloc(50 * 600 * sizeof(float));
  memcpy(want, lt_data_ptr(x), 50 * 600 * sizeof(float));
  const int32_t *ip = lt_data_ptr(index);
  const float *sp = lt_data_ptr(src), *xp = lt_data_ptr(x), *selp = lt_data_ptr(sel);
  int bad = 0;
  for (int64_t j = 0; j < n; j++)
    for (int64_t c = 0; c < 600; c++) {
      want[ip[j] * 600 + c] += sp[j * 600 + c];
      bad += selp[j * 600 + c] != xp[ip[j] * 600 + c];
    }
  CHECK(memcmp(lt_data_ptr(a), want, 50 * 600 * sizeof(float)) == 0, "index_add wide rows: not the serial sums");
  CHECK(bad == 0, "index_select wide rows: %d elements differ", bad);
  free(want);
  lt_release(x), lt_release(index), lt_release(src), lt_release(a), lt_release(sel);
}

static void test_bad_inputs(void) {
  int64_t xs[2] = {2, 3}, is[2] = {2, 2}, one = 3;
  lt_tensor *x = check_random(2, xs, LT_F32, 0, 1), *index = check_random(2, is, LT_I64, 0, 3);
  lt_tensor *src = check_random(2, is, LT_F32, 0, 1), *out = lt_tensor_new();
  int64_t *ip = lt_data_ptr(index);
  ip[3] = INT64_MAX;
  CHECK_ERR(lt_gather(out, x, 1, index),
            "gather: index 9223372036854775807 out of range [0, 3) of dim 1, at index[1,1]");
  ip[3] = -1;
  CHECK_ERR(lt_scatter_add(out, x, 1, index, src), "scatter_add: index -1 out of range [0, 3) of dim 1, at index[1,1]");
  CHECK_ERR(lt_scatter(out, x, -1, index, src), "scatter: index -1 out of range");
  ip[3] = 0;
  CHECK_ERR(lt_gather(out, x, 2, index), "gather");
  CHECK_ERR(lt_gather(out, x, 0, src), "gather: index is [2,2] f32 cpu, expected i32 or i64");
  lt_tensor *i1 = check_random(1, &one, LT_I32, 0, 2);
  ((int32_t *)lt_data_ptr(i1))[1] = 2;
  CHECK_ERR(lt_index_select(out, x, 0, i1), "index_select: index 2 out of range [0, 2) of dim 0, at index[1]");
  CHECK_ERR(lt_index_add(out, x, 1, i1, src), "index_add: src is [2,2] f32 cpu, expected [2,3]");
  CHECK_ERR(lt_gather(out, x, 0, i1), "gather: index is [3] i32 cpu, expected as many dims as x");
  lt_tensor *xb = check_random(2, is, LT_F64, 0, 1);
  CHECK_ERR(lt_scatter_add(out, x, 0, index, xb), "scatter_add: src is [2,2] f64 cpu, expected x's dtype");
  int64_t big[2] = {3, 2};
  lt_tensor *ib = check_random(2, big, LT_I64, 0, 1);
  CHECK_ERR(lt_gather(out, x, 1, ib), "gather: index [3,2] i64 cpu is larger than x [2,3] f32 cpu in dim 0");
  CHECK_ERR(lt_scatter_reduce(out, x, 1, index, src, "prod"),
            "scatter_reduce: reduce is 'prod', expected sum, amax or amin");
  /* a NaN on either side is kept by amax and amin */
  ((float *)lt_data_ptr(x))[0] = NAN;
  ((float *)lt_data_ptr(src))[3] = NAN;
  int64_t *iz = lt_data_ptr(index);
  iz[0] = 0, iz[1] = 1, iz[2] = 2, iz[3] = 2;
  CHECK_OK(lt_scatter_reduce(out, x, 1, index, src, "amax"));
  CHECK(isnan(check_at(out, 0)) && isnan(check_at(out, 5)) && !isnan(check_at(out, 1)), "amax keeps NaN");
  lt_release(x), lt_release(index), lt_release(src), lt_release(out), lt_release(i1), lt_release(xb), lt_release(ib);
}

int main(void) {
  test_gather_scatter();
  test_index_ops();
  test_deterministic();
  test_wide_rows();
  test_bad_inputs();
  return check_summary();
}
