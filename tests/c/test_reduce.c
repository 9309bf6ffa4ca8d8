/* test_reduce.c — lt_reduce, lt_var, lt_argmax/argmin against naive double loops. */
#include "check.h"

static const int float_dtypes[] = {LT_F32, LT_F64, LT_BF16, LT_F16};
static const int int_dtypes[] = {LT_I32, LT_I64, LT_U8};

/* Output linear index of input linear index i when the dims in red[] are reduced. */
static int64_t out_index(const lt_tensor *a, const bool *red, int64_t i) {
  int64_t o = 0, mul = 1;
  for (int d = a->ndim - 1; d >= 0; d--) {
    int64_t k = i % a->shape[d];
    i /= a->shape[d];
    if (!red[d]) o += k * mul, mul *= a->shape[d];
  }
  return o;
}

typedef struct ref {
  double *sum, *abs, *sq, *prod, *max, *min, *var;
  int64_t *isum, *iprod, *imax, *imin, count;
} ref;

/* Everything a reduction of a over red[] can produce, in double (and wrapping int64). */
static ref reference(const lt_tensor *a, const bool *red, int64_t n_out, int64_t correction) {
  ref r;
  double **f[] = {&r.sum, &r.abs, &r.sq, &r.prod, &r.max, &r.min, &r.var};
  int64_t **in[] = {&r.isum, &r.iprod, &r.imax, &r.imin};
  for (int k = 0; k < 7; k++) *f[k] = calloc(n_out + 1, sizeof(double));
  for (int k = 0; k < 4; k++) *in[k] = calloc(n_out + 1, sizeof(int64_t));
  int64_t n = lt_numel(a);
  r.count = n_out ? n / n_out : 0;
  for (int64_t o = 0; o < n_out; o++) {
    r.prod[o] = 1, r.max[o] = -INFINITY, r.min[o] = INFINITY, r.iprod[o] = 1;
    r.imax[o] = INT64_MIN, r.imin[o] = INT64_MAX;
  }
  for (int64_t i = 0; i < n; i++) {
    int64_t o = out_index(a, red, i);
    double v = check_at(a, i);
    int64_t iv = (int64_t)v;
    r.sum[o] += v, r.abs[o] += fabs(v), r.sq[o] += v * v, r.prod[o] *= v;
    r.max[o] = isnan(v) || isnan(r.max[o]) ? NAN : fmax(r.max[o], v);
    r.min[o] = isnan(v) || isnan(r.min[o]) ? NAN : fmin(r.min[o], v);
    r.isum[o] = (int64_t)((uint64_t)r.isum[o] + (uint64_t)iv);
    r.iprod[o] = (int64_t)((uint64_t)r.iprod[o] * (uint64_t)iv);
    r.imax[o] = iv > r.imax[o] ? iv : r.imax[o];
    r.imin[o] = iv < r.imin[o] ? iv : r.imin[o];
  }
  for (int64_t i = 0; i < n; i++) {
    int64_t o = out_index(a, red, i);
    double d = check_at(a, i) - r.sum[o] / (double)r.count;
    r.var[o] += d * d;
  }
  for (int64_t o = 0; o < n_out; o++) r.var[o] /= (double)(r.count > correction ? r.count - correction : 0);
  return r;
}

static void free_ref(ref *r) {
  void *p[] = {r->sum, r->abs, r->sq, r->prod, r->max, r->min, r->var, r->isum, r->iprod, r->imax, r->imin};
  for (int k = 0; k < 11; k++) free(p[k]);
}

/* Integer result as the output dtype stores it. */
static double as_int_dtype(int64_t v, int dtype) {
  if (dtype == LT_I32) return (int32_t)v;
  if (dtype == LT_U8) return (uint8_t)v;
  return (double)v;
}

static double round_to(double v, int dtype) {
  unsigned char buf[8];
  lt_store_f64(buf, dtype, 0, v);
  return lt_load_f64(buf, dtype, 0);
}

/* Picks a random set of dims (ndims 0 = all), negative half the time. */
static int random_dims(int ndim, int64_t *dims, bool *red) {
  int ndims = 0;
  for (int d = 0; d < ndim; d++) red[d] = false;
  if (ndim == 0 || check_uniform() < 0.15) {
    for (int d = 0; d < ndim; d++) red[d] = true;
    return 0;
  }
  for (int d = 0; d < ndim; d++)
    if (check_uniform() < 0.5) red[d] = true, dims[ndims++] = check_uniform() < 0.5 ? d : d - ndim;
  if (ndims == 0) red[ndim - 1] = true, dims[ndims++] = ndim - 1;
  for (int k = ndims - 1; k > 0; k--) { /* shuffle: order must not matter */
    int j = (int)check_randint(0, k + 1);
    int64_t t = dims[k];
    dims[k] = dims[j], dims[j] = t;
  }
  return ndims;
}

/* Reduces a over random dims with every op valid for its dtype and checks against reference. */
static void check_all_ops(const lt_tensor *a, int ndims, const int64_t *dims, const bool *red, int keepdim) {
  int64_t n_out = 1;
  for (int d = 0; d < a->ndim; d++) n_out *= red[d] ? 1 : a->shape[d];
  int64_t corr = check_randint(0, 3);
  ref r = reference(a, red, n_out, corr);
  bool is_float = lt_dtype_is_float(a->dtype);
  double tol = is_float ? check_tol(a->dtype) : 0;
  for (int op = 0; op <= LT_NUM_REDUCE_OPS; op++) { /* the last one is var */
    if (!is_float && (op == LT_MEAN || op == LT_NORM || op == LT_NUM_REDUCE_OPS)) continue;
    lt_tensor *out = lt_tensor_new();
    int rc = op < LT_NUM_REDUCE_OPS ? lt_reduce(out, a, op, ndims, dims, keepdim)
                                    : lt_var(out, a, ndims, dims, corr, keepdim);
    const char *name = op < LT_NUM_REDUCE_OPS ? lt_reduce_name(op) : "var";
    if ((op == LT_MAX || op == LT_MIN) && r.count == 0 && n_out > 0) {
      CHECK(rc != 0 && strstr(lt_last_error(), "cannot reduce an empty dim"), "%s: %s", name, lt_last_error());
      lt_release(out);
      continue;
    }
    CHECK(rc == 0, "%s %s: %s", name, lt_dtype_name(a->dtype), lt_last_error());
    if (rc) {
      lt_release(out);
      continue;
    }
    CHECK(out->dtype == a->dtype && lt_numel(out) == n_out &&
              out->ndim == (keepdim ? a->ndim : a->ndim - (ndims ? ndims : a->ndim)),
          "%s: out is %s ndim %d", name, lt_dtype_name(out->dtype), out->ndim);
    int bad = 0;
    for (int64_t o = 0; o < n_out && bad < 3; o++) {
      double got = check_at(out, o), want, atol = 0, rtol = tol;
      switch (op) {
      case LT_SUM: want = is_float ? r.sum[o] : as_int_dtype(r.isum[o], a->dtype), atol = tol * r.abs[o]; break;
      case LT_MEAN: want = r.sum[o] / (double)r.count, atol = tol * r.abs[o] / (double)r.count; break;
      case LT_MAX: want = is_float ? r.max[o] : as_int_dtype(r.imax[o], a->dtype), rtol = 0; break;
      case LT_MIN: want = is_float ? r.min[o] : as_int_dtype(r.imin[o], a->dtype), rtol = 0; break;
      case LT_PROD: /* long products leave the range of 16-bit floats: compare after the same rounding */
        want = is_float ? round_to(r.prod[o], a->dtype) : as_int_dtype(r.iprod[o], a->dtype), rtol = tol * 4;
        break;
      case LT_NORM: want = sqrt(r.sq[o]); break;
      default: want = r.var[o], atol = tol * 4 * r.sq[o] / (double)(r.count > 1 ? r.count : 1); break;
      }
      if (!check_close(got, want, rtol, atol + 1e-300)) {
        bad++;
        char s[LT_SHAPE_STR];
        CHECK(false, "%s %s %s keepdim %d ndims %d: out[%lld] = %.9g, want %.9g", name, lt_dtype_name(a->dtype),
              lt_shape_str(s, a->ndim, a->shape), keepdim, ndims, (long long)o, got, want);
      }
    }
    if (!bad) CHECK(true, "ok");
    lt_release(out);
  }
  free_ref(&r);
}

static void test_random_reductions(void) {
  for (int trial = 0; trial < 300; trial++) {
    int ndim = (int)check_randint(0, 5);
    int64_t shape[4];
    for (int d = 0; d < ndim; d++) shape[d] = check_randint(1, 8);
    bool is_int = trial % 4 == 3;
    int dtype = is_int ? int_dtypes[trial / 4 % 3] : float_dtypes[trial % 4 == 3 ? 0 : trial / 4 % 4];
    lt_tensor *a = is_int ? check_random(ndim, shape, dtype, dtype == LT_U8 ? 0 : -3, 4)
                          : check_random(ndim, shape, dtype, 0.5, 1.5);
    if (!is_int && trial % 5 == 0) { /* mixed signs for sums, means and norms */
      lt_tensor *b = check_random(ndim, shape, dtype, -2, 2);
      lt_release(a), a = b;
    }
    if (!is_int && trial % 7 == 2 && lt_numel(a) > 0) /* NaN wins max and min, and spreads through the rest */
      lt_store_f64(lt_data_ptr(a), dtype, check_randint(0, lt_numel(a)), NAN);
    lt_tensor *v = trial % 3 == 1 ? check_noncontig(a) : (lt_retain(a), a);
    int64_t dims[4];
    bool red[4];
    int ndims = random_dims(ndim, dims, red);
    check_all_ops(v, ndims, dims, red, trial % 2);
    lt_release(v), lt_release(a);
  }
}

/* Shapes that take each path: split inner and outer reductions, middle dims, strided runs. */
static void test_paths(void) {
  struct {
    int ndim;
    int64_t shape[3];
    int ndims;
    int64_t dims[2];
  } cases[] = {
      {2, {70000, 3}, 1, {0}},   {2, {3, 70000}, 1, {1}},      {1, {300001}, 0, {0}},       {2, {300, 1000}, 1, {0}},
      {3, {40, 50, 30}, 1, {1}}, {3, {20, 30, 40}, 2, {0, 2}}, {3, {5, 600, 7}, 2, {2, 1}}, {2, {1500, 1}, 1, {0}},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    for (int variant = 0; variant < 2; variant++) {
      int dtype = variant ? LT_BF16 : LT_F32;
      lt_tensor *a = check_random(cases[c].ndim, cases[c].shape, dtype, -1, 1.2);
      bool red[3] = {false, false, false};
      for (int k = 0; k < (cases[c].ndims ? cases[c].ndims : cases[c].ndim); k++)
        red[cases[c].ndims ? cases[c].dims[k] : k] = true;
      int64_t n_out = 1;
      for (int d = 0; d < cases[c].ndim; d++) n_out *= red[d] ? 1 : cases[c].shape[d];
      lt_tensor *v = variant ? check_noncontig(a) : (lt_retain(a), a);
      ref r = reference(v, red, n_out, 1);
      int ops[] = {LT_SUM, LT_MAX, LT_MIN, LT_NORM};
      for (int k = 0; k < 4; k++) {
        lt_tensor *out = lt_tensor_new();
        CHECK_OK(lt_reduce(out, v, ops[k], cases[c].ndims, cases[c].dims, 0));
        double worst = 0;
        for (int64_t o = 0; o < n_out; o++) {
          double want = ops[k] == LT_SUM   ? r.sum[o]
                        : ops[k] == LT_MAX ? r.max[o]
                        : ops[k] == LT_MIN ? r.min[o]
                                           : sqrt(r.sq[o]);
          double scale = ops[k] == LT_SUM ? r.abs[o] : fabs(want);
          double err = fabs(check_at(out, o) - want) / (scale + 1e-30);
          worst = err > worst ? err : worst;
        }
        CHECK(worst <= check_tol(dtype), "case %zu %s %s: rel err %g", c, lt_reduce_name(ops[k]), lt_dtype_name(dtype),
              worst);
        lt_release(out);
      }
      lt_tensor *out = lt_tensor_new();
      CHECK_OK(lt_var(out, v, cases[c].ndims, cases[c].dims, 1, 0));
      double worst = 0;
      for (int64_t o = 0; o < n_out; o++) worst = fmax(worst, fabs(check_at(out, o) - r.var[o]) / r.var[o]);
      CHECK(worst <= 4 * check_tol(dtype), "case %zu var: rel err %g", c, worst);
      lt_release(out), free_ref(&r), lt_release(v), lt_release(a);
    }
  }
}

/* 16M f32 values of 0.1: a naive f32 sum is off by percents, ours must be right to 1e-6. */
static void test_accuracy(void) {
  int64_t n = 1 << 24, two[2] = {4096, 4096};
  lt_tensor *a = lt_tensor_new(), *s = lt_tensor_new(), *m = lt_tensor_new(), *v = lt_tensor_new(),
            *a2 = lt_tensor_new(), *cols = lt_tensor_new();
  CHECK_OK(lt_empty(a, 1, &n, LT_F32, LT_DEVICE_CPU));
  CHECK_OK(lt_fill(a, 0.1));
  CHECK_OK(lt_reduce(s, a, LT_SUM, 0, NULL, 0));
  CHECK_OK(lt_reduce(m, a, LT_MEAN, 0, NULL, 0));
  double got, want = (double)n * (double)0.1f;
  CHECK_OK(lt_item(s, &got));
  CHECK(fabs(got - want) <= 1e-6 * want, "sum of 16M x 0.1f = %.9g, want %.9g", got, want);
  CHECK_OK(lt_item(m, &got));
  CHECK(fabs(got - 0.1f) <= 1e-6 * 0.1, "mean = %.9g", got);
  /* variance of a large offset plus small noise: one-pass formulas lose it all */
  float *p = lt_data_ptr(a);
  for (int64_t i = 0; i < n; i++) p[i] = 1000.0f + (i % 2 ? 0.5f : -0.5f);
  CHECK_OK(lt_var(v, a, 0, NULL, 0, 0));
  CHECK_OK(lt_item(v, &got));
  CHECK(fabs(got - 0.25) <= 1e-6, "var = %.9g, want 0.25", got);
  /* the outer path: 4096 rows of 4096 columns summed into one row */
  CHECK_OK(lt_view(a2, a, 2, two));
  CHECK_OK(lt_fill(a2, 0.1));
  int64_t dim0 = 0;
  CHECK_OK(lt_reduce(cols, a2, LT_SUM, 1, &dim0, 0));
  CHECK(fabs(check_at(cols, 17) - 4096 * (double)0.1f) <= 1e-6 * 409.6, "column sum %.9g", check_at(cols, 17));
  lt_release(a), lt_release(s), lt_release(m), lt_release(v), lt_release(a2), lt_release(cols);
}

static void test_empty_and_special(void) {
  int64_t shape[2] = {0, 3}, dim0 = 0, dim1 = 1;
  lt_tensor *a = check_random(2, shape, LT_F32, 0, 1), *out = lt_tensor_new();
  CHECK_OK(lt_reduce(out, a, LT_SUM, 1, &dim0, 0));
  CHECK(out->ndim == 1 && out->shape[0] == 3 && check_at(out, 2) == 0, "sum over an empty dim is 0");
  lt_release(out), out = lt_tensor_new();
  CHECK_OK(lt_reduce(out, a, LT_MEAN, 1, &dim0, 0));
  CHECK(isnan(check_at(out, 0)), "mean over an empty dim is nan");
  lt_release(out), out = lt_tensor_new();
  CHECK_OK(lt_reduce(out, a, LT_PROD, 1, &dim0, 1));
  CHECK(out->ndim == 2 && out->shape[0] == 1 && check_at(out, 1) == 1, "prod over an empty dim is 1");
  lt_release(out), out = lt_tensor_new();
  CHECK_ERR(lt_reduce(out, a, LT_MAX, 1, &dim0, 0), "max: cannot reduce an empty dim");
  CHECK_ERR(lt_reduce(out, a, LT_MIN, 0, NULL, 0), "min: cannot reduce an empty dim");
  CHECK(!lt_is_defined(out), "a failed reduction leaves out undefined");
  CHECK_OK(lt_reduce(out, a, LT_MAX, 1, &dim1, 0)); /* nothing to reduce into: an empty result */
  CHECK(out->ndim == 1 && out->shape[0] == 0, "max over a non-empty dim of an empty tensor");
  lt_release(out), out = lt_tensor_new();
  CHECK_ERR(lt_argmax(out, a, 0, 0, 0), "argmax: cannot reduce an empty dim");
  CHECK_ERR(lt_argmin(out, a, 1, 0, 1), "argmin: cannot reduce an empty dim");
  CHECK_OK(lt_reduce(out, a, LT_SUM, 0, NULL, 0));
  CHECK(out->ndim == 0 && check_at(out, 0) == 0, "sum of all of an empty tensor");
  lt_release(out), lt_release(a);

  /* a scalar reduces to itself; NaN wins max */
  lt_tensor *s = check_random(0, NULL, LT_F64, 2, 3), *v = lt_tensor_new(),
            *nan = check_random(1, (int64_t[]){5}, LT_F32, 0, 1);
  CHECK_OK(lt_reduce(v, s, LT_SUM, 1, &dim0, 1));
  CHECK(v->ndim == 0 && check_at(v, 0) == check_at(s, 0), "scalar sum");
  lt_release(v), v = lt_tensor_new();
  lt_set_at(nan, (int64_t[]){3}, NAN);
  CHECK_OK(lt_reduce(v, nan, LT_MIN, 0, NULL, 0));
  CHECK(isnan(check_at(v, 0)), "min with a NaN is NaN");
  lt_release(v), v = lt_tensor_new();
  CHECK_OK(lt_var(v, s, 0, NULL, 1, 0));
  CHECK(isnan(check_at(v, 0)), "unbiased var of one element is nan");
  lt_release(v), lt_release(s), lt_release(nan);

  /* integer sums keep the dtype; u8 wraps */
  int64_t n = 300;
  lt_tensor *u = lt_tensor_new(), *us = lt_tensor_new();
  CHECK_OK(lt_empty(u, 1, &n, LT_U8, LT_DEVICE_CPU));
  CHECK_OK(lt_fill(u, 1));
  CHECK_OK(lt_reduce(us, u, LT_SUM, 0, NULL, 0));
  CHECK(us->dtype == LT_U8 && check_at(us, 0) == 300 % 256, "u8 sum %g", check_at(us, 0));
  lt_release(u), lt_release(us);
}

/* A defined out, as a non-contiguous view, is written in place. */
static void test_out_view(void) {
  int64_t shape[3] = {4, 5, 6}, oshape[2] = {6, 4}, dim1 = 1;
  lt_tensor *a = check_random(3, shape, LT_F64, -1, 1), *base = lt_tensor_new(), *out = lt_tensor_new();
  CHECK_OK(lt_empty(base, 2, oshape, LT_F64, LT_DEVICE_CPU));
  CHECK_OK(lt_transpose(out, base, 0, 1)); /* (4, 6), strides (1, 4) */
  CHECK_OK(lt_reduce(out, a, LT_SUM, 1, &dim1, 0));
  double err = 0;
  for (int i = 0; i < 4; i++)
    for (int k = 0; k < 6; k++) {
      double want = 0;
      for (int j = 0; j < 5; j++) want += check_at(a, (i * 5 + j) * 6 + k);
      err = fmax(err, fabs(check_at(base, k * 4 + i) - want));
    }
  CHECK(err < 1e-12, "sum into a transposed out: err %g", err);
  lt_tensor *wrong = lt_tensor_new();
  CHECK_OK(lt_empty(wrong, 2, oshape, LT_F64, LT_DEVICE_CPU));
  CHECK_ERR(lt_reduce(wrong, a, LT_SUM, 1, &dim1, 0), "sum: out is [6,4] f64 cpu, expected [4,6] f64 cpu");
  lt_release(a), lt_release(base), lt_release(out), lt_release(wrong);
}

static void test_errors(void) {
  int64_t shape[2] = {3, 4}, dup[2] = {1, -1}, bad = 2;
  lt_tensor *a = check_random(2, shape, LT_F32, 0, 1), *i = check_random(2, shape, LT_I32, 0, 5),
            *b = check_random(2, shape, LT_BOOL, 0, 2), *out = lt_tensor_new(), *undef = lt_tensor_new();
  CHECK_ERR(lt_reduce(out, a, LT_SUM, 2, dup, 0), "dim 1 appears more than once");
  CHECK_ERR(lt_reduce(out, a, LT_MAX, 1, &bad, 0), "max: dim 2 out of range for a 2-d tensor");
  CHECK_ERR(lt_reduce(out, a, 99, 0, NULL, 0), "reduce: unknown op 99");
  CHECK_ERR(lt_reduce(out, a, LT_SUM, 1, NULL, 0), "sum: dims is NULL");
  CHECK_ERR(lt_reduce(out, a, LT_SUM, 9, dup, 0), "sum: 9 dims given");
  CHECK_ERR(lt_reduce(out, i, LT_MEAN, 0, NULL, 0), "mean: needs a floating dtype, got i32");
  CHECK_ERR(lt_reduce(out, i, LT_NORM, 0, NULL, 0), "norm: needs a floating dtype");
  CHECK_ERR(lt_var(out, i, 0, NULL, 1, 0), "var: needs a floating dtype");
  CHECK_ERR(lt_var(out, a, 0, NULL, -1, 0), "var: correction must be >= 0");
  CHECK_ERR(lt_reduce(out, b, LT_SUM, 0, NULL, 0), "sum: not supported for bool");
  CHECK_ERR(lt_reduce(out, undef, LT_SUM, 0, NULL, 0), "sum: input is undefined");
  CHECK_ERR(lt_reduce(out, NULL, LT_PROD, 0, NULL, 0), "prod: input is NULL");
  CHECK_ERR(lt_argmax(out, a, 2, 0, 0), "argmax: dim 2 out of range");
  CHECK_ERR(lt_argmin(out, undef, 0, 0, 0), "argmin: input is undefined");
  /* a tensor claiming cuda:15 (no machine here has 16 GPUs: refused before any kernel reads
   * its host pointer): a CUDA build says the device is missing, a CPU-only build has no CUDA */
  lt_tensor cuda = *a;
  cuda.device = 15;
  const char *no_device = strstr(lt_build_info(), "cuda: built") ? "is not available" : "built without CUDA";
  CHECK_ERR(lt_reduce(out, &cuda, LT_SUM, 0, NULL, 0), no_device);
  CHECK_ERR(lt_argmax(out, &cuda, 0, 0, 0), no_device);
  lt_tensor *f64out = lt_tensor_new();
  CHECK_OK(lt_empty(f64out, 0, NULL, LT_F64, LT_DEVICE_CPU));
  CHECK_ERR(lt_reduce(f64out, a, LT_SUM, 0, NULL, 0), "sum: out is [] f64 cpu, expected [] f32 cpu");
  CHECK_OK(lt_reduce(out, b, LT_MAX, 0, NULL, 0)); /* max of bool is any */
  lt_release(a), lt_release(i), lt_release(b), lt_release(out), lt_release(undef), lt_release(f64out);
}

/* ---- argmax / argmin ---- */

static void check_arg(const lt_tensor *a, int dim, int keepdim, int all_dims, bool is_max) {
  lt_tensor *out = lt_tensor_new();
  int rc = is_max ? lt_argmax(out, a, dim, keepdim, all_dims) : lt_argmin(out, a, dim, keepdim, all_dims);
  CHECK(rc == 0, "arg: %s", lt_last_error());
  if (rc) return (void)lt_release(out);
  int d = dim < 0 ? dim + a->ndim : dim;
  int64_t n = all_dims ? lt_numel(a) : (a->ndim ? a->shape[d] : 1), inner = 1;
  if (!all_dims)
    for (int k = d + 1; k < a->ndim; k++) inner *= a->shape[k];
  int64_t n_out = lt_numel(a) / n;
  CHECK(out->dtype == LT_I64 && lt_numel(out) == n_out, "arg out %s numel %lld", lt_dtype_name(out->dtype),
        (long long)lt_numel(out));
  CHECK(out->ndim == (all_dims ? (keepdim ? a->ndim : 0) : (keepdim || a->ndim == 0 ? a->ndim : a->ndim - 1)),
        "arg out ndim %d", out->ndim);
  int bad = 0;
  for (int64_t o = 0; o < n_out && bad < 3; o++) {
    int64_t base = o / inner * n * inner + o % inner, best = 0;
    for (int64_t k = 1; k < n; k++) {
      double v = check_at(a, base + k * inner), b = check_at(a, base + best * inner);
      if (isnan(b)) break;
      if (isnan(v) || (is_max ? v > b : v < b)) best = k;
    }
    double got = check_at(out, o);
    if (got != (double)best) {
      bad++;
      char s[LT_SHAPE_STR];
      CHECK(false, "arg%s %s %s dim %d all %d: out[%lld] = %g, want %lld", is_max ? "max" : "min",
            lt_dtype_name(a->dtype), lt_shape_str(s, a->ndim, a->shape), dim, all_dims, (long long)o, got,
            (long long)best);
    }
  }
  if (!bad) CHECK(true, "ok");
  lt_release(out);
}

static void test_argmax(void) {
  static const int dtypes[] = {LT_F32, LT_F64, LT_BF16, LT_F16, LT_I32, LT_I64, LT_U8};
  for (int trial = 0; trial < 200; trial++) {
    int ndim = (int)check_randint(0, 4), dtype = dtypes[trial % 7];
    int64_t shape[3];
    for (int d = 0; d < ndim; d++) shape[d] = check_randint(1, 9);
    lt_tensor *a = check_random(ndim, shape, dtype, 0, 4); /* few distinct values: many ties */
    if (lt_dtype_is_float(dtype) && trial % 3 == 0 && lt_numel(a) > 2) {
      lt_store_f64(lt_data_ptr(a), dtype, check_randint(0, lt_numel(a)), NAN);
      lt_store_f64(lt_data_ptr(a), dtype, check_randint(0, lt_numel(a)), NAN);
    }
    lt_tensor *v = trial % 2 ? check_noncontig(a) : (lt_retain(a), a);
    int dim = ndim ? (int)check_randint(-ndim, ndim) : 0;
    check_arg(v, dim, trial % 4 < 2, trial % 5 == 0, trial % 3 != 1);
    lt_release(v), lt_release(a);
  }
  /* long runs (split across chunks) and the outer path, with ties at the extremes */
  int64_t n = 300000, shape2[2] = {1000, 300};
  lt_tensor *a = check_random(1, &n, LT_F32, -1, 1), *b = check_random(2, shape2, LT_F32, -1, 1);
  float *p = lt_data_ptr(a);
  p[200001] = 5, p[250000] = 5, p[100] = -5, p[299999] = -5;
  check_arg(a, 0, 0, 0, true), check_arg(a, 0, 0, 1, false);
  p[270000] = NAN, p[280000] = NAN;
  check_arg(a, 0, 1, 0, true), check_arg(a, -1, 0, 1, false);
  float *q = lt_data_ptr(b);
  q[700 * 300 + 5] = 3, q[900 * 300 + 5] = 3, q[10 * 300 + 6] = NAN, q[20 * 300 + 6] = NAN;
  check_arg(b, 0, 0, 0, true), check_arg(b, 0, 1, 0, false), check_arg(b, 1, 0, 0, true);
  lt_release(a), lt_release(b);
}

int main(void) {
  test_random_reductions();
  test_paths();
  test_accuracy();
  test_empty_and_special();
  test_out_view();
  test_errors();
  test_argmax();
  return check_summary();
}
