/* test_sort.c — sort, topk, their backward, cumsum, cumprod (and its backward, rows with zeros),
 * tril and triu against naive double loops, along every dim of a 3-d tensor, contiguous and
 * transposed (non-contiguous), in every dtype each op takes; ties (integer-valued inputs) and
 * NaN in the stable order; bad inputs and their messages. */
#include "check.h"

enum { ND = 3 };
static const int64_t SHAPE[ND] = {3, 5, 4};

/* row-major linear index of element j of row r along dim (rows number the other dims) */
static int64_t lin(const int64_t *shape, int dim, int64_t r, int64_t j) {
  int64_t idx[ND], rest = r;
  for (int d = ND - 1; d >= 0; d--) {
    if (d == dim) continue;
    idx[d] = rest % shape[d], rest /= shape[d];
  }
  idx[dim] = j;
  int64_t l = 0;
  for (int d = 0; d < ND; d++) l = l * shape[d] + idx[d];
  return l;
}

/* a before b in the order of kernels/sort.h (values va, vb at indices a, b) */
static bool before(double va, int64_t a, double vb, int64_t b, int desc) {
  bool na = isnan(va), nb = isnan(vb);
  if (na != nb) return desc ? na : nb;
  if (!na && va != vb) return desc ? va > vb : va < vb;
  return a < b;
}

/* the sorted order of a row by insertion (stable by construction) */
static void naive_order(const double *v, int64_t n, int desc, int64_t *order) {
  for (int64_t i = 0; i < n; i++) {
    int64_t j = i;
    while (j > 0 && before(v[i], i, v[order[j - 1]], order[j - 1], desc)) order[j] = order[j - 1], j--;
    order[j] = i;
  }
}

static void check_sort(int dtype, bool noncontig) {
  lt_tensor *base = check_random(ND, SHAPE, dtype, -3, 3);
  char *p = lt_data_ptr(base);
  if (lt_dtype_is_float(dtype)) {
    for (int64_t i = 0; i < lt_numel(base); i++) lt_store_f64(p, dtype, i, floor(check_at(base, i)));
    lt_store_f64(p, dtype, 7, NAN), lt_store_f64(p, dtype, 20, NAN), lt_store_f64(p, dtype, 21, -0.0);
  }
  lt_tensor *x = noncontig ? check_noncontig(base) : base;
  for (int dim = 0; dim < ND; dim++)
    for (int desc = 0; desc < 2; desc++) {
      int64_t n = SHAPE[dim], rows = lt_numel(x) / n, k = n > 2 ? n - 2 : n;
      lt_tensor *v = lt_tensor_new(), *i = lt_tensor_new(), *tv = lt_tensor_new(), *ti = lt_tensor_new();
      CHECK_OK(lt_sort(v, i, x, dim - ND * (dim == 2), desc)); /* dim 2 as -1 */
      CHECK_OK(lt_topk(tv, ti, x, k, dim, desc));
      int64_t vshape[ND] = {SHAPE[0], SHAPE[1], SHAPE[2]};
      vshape[dim] = k;
      int bad = 0;
      for (int64_t r = 0; r < rows; r++) {
        double row[8];
        int64_t order[8];
        for (int64_t j = 0; j < n; j++) row[j] = check_at(x, lin(SHAPE, dim, r, j));
        naive_order(row, n, desc, order);
        for (int64_t j = 0; j < n; j++) {
          double got = check_at(v, lin(SHAPE, dim, r, j)), want = row[order[j]];
          bad += check_at(i, lin(SHAPE, dim, r, j)) != order[j] || !(got == want || (isnan(got) && isnan(want)));
          if (j < k) bad += check_at(ti, lin(vshape, dim, r, j)) != order[j];
        }
      }
      CHECK(bad == 0, "sort/topk %s%s dim %d desc %d: %d elements off the naive stable order", lt_dtype_name(dtype),
            noncontig ? " noncontig" : "", dim, desc, bad);
      /* the backward: grad of topk's values scattered to its indices, zeros elsewhere */
      lt_tensor *g = check_random(ND, vshape, dtype, -2, 2), *gi = lt_tensor_new();
      CHECK_OK(lt_sort_backward(gi, g, ti, dim, n));
      bad = 0;
      for (int64_t r = 0; r < rows; r++) {
        double want[8] = {0};
        for (int64_t j = 0; j < k; j++)
          want[(int64_t)check_at(ti, lin(vshape, dim, r, j))] = check_at(g, lin(vshape, dim, r, j));
        for (int64_t j = 0; j < n; j++) bad += check_at(gi, lin(SHAPE, dim, r, j)) != want[j];
      }
      CHECK(bad == 0, "sort_backward %s dim %d: %d elements differ", lt_dtype_name(dtype), dim, bad);
      lt_release(v), lt_release(i), lt_release(tv), lt_release(ti), lt_release(g), lt_release(gi);
    }
  if (x != base) lt_release(x);
  lt_release(base);
}

static void check_scans(int dtype, bool noncontig) {
  lt_tensor *base = check_random(ND, SHAPE, dtype, -1.5, 1.5);
  char *p = lt_data_ptr(base);
  lt_store_f64(p, dtype, 5, 0), lt_store_f64(p, dtype, 9, 0), lt_store_f64(p, dtype, 30, 0); /* zeros for cumprod */
  lt_tensor *x = noncontig ? check_noncontig(base) : base;
  lt_tensor *g = check_random(ND, SHAPE, dtype, -1, 1);
  double tol = check_tol(dtype);
  for (int dim = 0; dim < ND; dim++) {
    int64_t n = SHAPE[dim], rows = lt_numel(x) / n;
    lt_tensor *cs = lt_tensor_new(), *rs = lt_tensor_new(), *cp = lt_tensor_new(), *db = lt_tensor_new();
    CHECK_OK(lt_cumsum(cs, x, dim, 0));
    CHECK_OK(lt_cumsum(rs, x, dim, 1));
    CHECK_OK(lt_cumprod(cp, x, dim));
    CHECK_OK(lt_cumprod_backward(db, g, x, dim));
    int bad = 0;
    for (int64_t r = 0; r < rows; r++) {
      double s = 0, q = 1, rsum = 0;
      for (int64_t j = 0; j < n; j++) {
        int64_t l = lin(SHAPE, dim, r, j), lr = lin(SHAPE, dim, r, n - 1 - j);
        s += check_at(x, l), q *= check_at(x, l), rsum += check_at(x, lr);
        bad += !check_close(check_at(cs, l), s, tol, tol) + !check_close(check_at(cp, l), q, tol, tol);
        bad += !check_close(check_at(rs, lr), rsum, tol, tol);
        /* d/dx_j of sum_m g_m cumprod_m = sum_{m>=j} g_m prod_{i<=m, i!=j} x_i */
        double d = 0;
        for (int64_t m = j; m < n; m++) {
          double prod = 1;
          for (int64_t i2 = 0; i2 <= m; i2++)
            if (i2 != j) prod *= check_at(x, lin(SHAPE, dim, r, i2));
          d += check_at(g, lin(SHAPE, dim, r, m)) * prod;
        }
        bad += !check_close(check_at(db, l), d, 4 * tol, 4 * tol);
      }
    }
    CHECK(bad == 0, "cumsum/cumprod %s%s dim %d: %d elements off the naive loops", lt_dtype_name(dtype),
          noncontig ? " noncontig" : "", dim, bad);
    lt_release(cs), lt_release(rs), lt_release(cp), lt_release(db);
  }
  if (x != base) lt_release(x);
  lt_release(base), lt_release(g);
}

static void check_tri(int dtype, bool noncontig) {
  lt_tensor *base = check_random(ND, SHAPE, dtype, -9, 9);
  lt_tensor *x = noncontig ? check_noncontig(base) : base;
  for (int64_t diag = -3; diag <= 4; diag++)
    for (int upper = 0; upper < 2; upper++) {
      lt_tensor *o = lt_tensor_new();
      CHECK_OK(upper ? lt_triu(o, x, diag) : lt_tril(o, x, diag));
      int bad = 0;
      for (int64_t l = 0; l < lt_numel(x); l++) {
        int64_t j = l % SHAPE[2], i = l / SHAPE[2] % SHAPE[1];
        bool keep = upper ? j - i >= diag : j - i <= diag;
        bad += check_at(o, l) != (keep ? check_at(x, l) : 0);
      }
      CHECK(bad == 0, "%s %s diagonal %lld: %d elements differ", upper ? "triu" : "tril", lt_dtype_name(dtype),
            (long long)diag, bad);
      lt_release(o);
    }
  /* in place */
  lt_tensor *c = lt_tensor_new(), *want = lt_tensor_new();
  CHECK_OK(lt_empty(c, ND, SHAPE, dtype, LT_DEVICE_CPU));
  CHECK_OK(lt_copy(c, x));
  CHECK_OK(lt_tril(want, x, 1));
  CHECK_OK(lt_tril(c, c, 1));
  int bad = 0;
  for (int64_t l = 0; l < lt_numel(x); l++) bad += check_at(c, l) != check_at(want, l);
  CHECK(bad == 0, "tril in place %s: %d elements differ", lt_dtype_name(dtype), bad);
  lt_release(c), lt_release(want);
  if (x != base) lt_release(x);
  lt_release(base);
}

static void check_errors(void) {
  lt_tensor *x = check_random(2, (int64_t[]){2, 3}, LT_F32, -1, 1), *v = lt_tensor_new(), *i = lt_tensor_new();
  lt_tensor *b = check_random(2, (int64_t[]){2, 3}, LT_BOOL, 0, 2), *ix = check_random(1, (int64_t[]){3}, LT_I32, 0, 3);
  CHECK_ERR(lt_topk(v, i, x, 4, 1, 1), "topk: k 4 out of range for dim 1 of size 3");
  CHECK_ERR(lt_sort(v, i, x, 2, 0), "sort: dim 2 out of range for a 2-d tensor");
  CHECK_ERR(lt_sort(v, i, b, 0, 0), "sort: x must be a float or integer tensor, got [2,3] bool cpu");
  CHECK_ERR(lt_sort(v, i, NULL, 0, 0), "sort: x");
  CHECK_ERR(lt_cumsum(v, ix, 0, 0), "cumsum: x must be a float tensor (f32, f64, bf16, f16), got [3] i32 cpu");
  CHECK_ERR(lt_cumprod_backward(v, ix, x, 0), "cumprod_backward: grad_out must be a float tensor");
  CHECK_ERR(lt_tril(v, ix, 0), "tril: x must have at least 2 dims, got [3] i32 cpu");
  CHECK_ERR(lt_sort_backward(v, x, x, 1, 3), "sort_backward: indices must be i64 of grad_out's shape");
  lt_release(x), lt_release(v), lt_release(i), lt_release(b), lt_release(ix);
}

int main(void) {
  static const int sortable[] = {LT_F32, LT_F64, LT_BF16, LT_F16, LT_I32, LT_I64};
  static const int floats[] = {LT_F32, LT_F64, LT_BF16, LT_F16};
  for (int nc = 0; nc < 2; nc++) {
    for (int t = 0; t < 6; t++) check_sort(sortable[t], nc), check_tri(sortable[t], nc);
    for (int t = 0; t < 4; t++) check_scans(floats[t], nc);
  }
  check_errors();
  return check_summary();
}
