/* test_lion.c — the fused Lion step against a naive double loop of lion-pytorch's update, over
 * several steps, every supported dtype combination, strided tensors, threads, bad inputs. */
#include "check.h"

typedef struct hparams {
  double lr, beta1, beta2, wd;
} hparams;

/* One step in double, as lucidrains' lion-pytorch. */
static void ref_step(double *p, const double *g, double *m, int64_t n, hparams h) {
  for (int64_t i = 0; i < n; i++) {
    double c = h.beta1 * m[i] + (1 - h.beta1) * g[i];
    p[i] = p[i] * (1 - h.lr * h.wd) - h.lr * (double)((c > 0) - (c < 0));
    m[i] = h.beta2 * m[i] + (1 - h.beta2) * g[i];
  }
}

static double round_to(int dtype, double x) {
  unsigned char buf[8];
  lt_store_f64(buf, dtype, 0, x);
  return lt_load_f64(buf, dtype, 0);
}

/* n = rows * cols values as a 1-D tensor, or as the transpose of a (cols, rows) buffer. */
static lt_tensor *make(int64_t rows, int64_t cols, int dtype, int strided, const double *values) {
  lt_tensor *t = lt_tensor_new();
  if (strided) {
    int64_t shape[2] = {cols, rows};
    lt_tensor *base = lt_tensor_new();
    lt_empty(base, 2, shape, dtype, LT_DEVICE_CPU);
    lt_transpose(t, base, 0, 1);
    lt_release(base);
  } else {
    int64_t shape[1] = {rows * cols};
    lt_empty(t, 1, shape, dtype, LT_DEVICE_CPU);
  }
  lt_copy_from_buffer(t, values, LT_F64, rows * cols);
  return t;
}

static void test_steps(int pdtype, int gdtype, int64_t rows, int64_t cols, int strided, hparams h) {
  int64_t n = rows * cols;
  int mdtype = pdtype == LT_F64 ? LT_F64 : LT_F32;
  double *p = malloc((size_t)n * sizeof(double)), *g = malloc((size_t)n * sizeof(double));
  double *m = calloc((size_t)n, sizeof(double));
  for (int64_t i = 0; i < n; i++) p[i] = round_to(pdtype, 2 * check_uniform() - 1);
  lt_tensor *pt = make(rows, cols, pdtype, strided, p), *mt = make(rows, cols, mdtype, strided, m);
  int bad = 0;
  double worst_p = 0, worst_m = 0;
  for (int step = 1; step <= 5; step++) {
    for (int64_t i = 0; i < n; i++) g[i] = round_to(gdtype, 2 * check_uniform() - 1);
    lt_tensor *gt = make(rows, cols, gdtype, !strided, g);
    CHECK_OK(lt_lion_step(pt, gt, mt, h.lr, h.beta1, h.beta2, h.wd));
    lt_release(gt);
    ref_step(p, g, m, n, h);
    /* the reference restarts from the op's values each step, so that errors do not compound;
     * sign(c) is exact unless c is within rounding of 0, which random inputs avoid */
    for (int64_t i = 0; i < n; i++) {
      double gp = check_at(pt, i), gm = check_at(mt, i);
      double tol_p = pdtype == LT_BF16 ? 4e-3 : pdtype == LT_F16 ? 5e-4 : check_tol(pdtype);
      double ep = fabs(gp - p[i]) / fmax(fabs(p[i]), h.lr * 10);
      double em = fabs(gm - m[i]) / (fabs(m[i]) + (1 - h.beta2) * fabs(g[i]) + 1e-12);
      if (ep > tol_p * 4 || em > check_tol(mdtype) * 4) bad++;
      worst_p = fmax(worst_p, ep), worst_m = fmax(worst_m, em);
      p[i] = gp, m[i] = gm;
    }
  }
  CHECK(bad == 0, "lion param %s grad %s n %lld strided %d lr %g wd %g: %d bad, rel errs p %g m %g",
        lt_dtype_name(pdtype), lt_dtype_name(gdtype), (long long)n, strided, h.lr, h.wd, bad, worst_p, worst_m);
  free(p), free(g), free(m);
  lt_release(pt), lt_release(mt);
}

/* Results are the same with 1 and 2 threads (each element is independent). */
static void test_threads(void) {
  int64_t shape[1] = {200003};
  lt_tensor *p[2], *m[2], *g = check_random(1, shape, LT_F32, -1, 1), *p0 = check_random(1, shape, LT_F32, -1, 1);
  int threads = lt_get_num_threads();
  for (int r = 0; r < 2; r++) {
    p[r] = lt_tensor_new(), m[r] = lt_tensor_new();
    lt_empty(p[r], 1, shape, LT_F32, LT_DEVICE_CPU), lt_copy(p[r], p0);
    lt_empty(m[r], 1, shape, LT_F32, LT_DEVICE_CPU), lt_fill(m[r], 0);
    lt_set_num_threads(r + 1);
    for (int s = 1; s <= 3; s++) CHECK_OK(lt_lion_step(p[r], g, m[r], 1e-3, 0.9, 0.99, 0.1));
  }
  lt_set_num_threads(threads);
  CHECK(memcmp(lt_data_ptr(p[0]), lt_data_ptr(p[1]), 200003 * 4) == 0, "lion differs between 1 and 2 threads");
  CHECK(memcmp(lt_data_ptr(m[0]), lt_data_ptr(m[1]), 200003 * 4) == 0, "lion m differs between 1 and 2 threads");
  for (int r = 0; r < 2; r++) lt_release(p[r]), lt_release(m[r]);
  lt_release(g), lt_release(p0);
}

/* sign(0) is 0: a zero gradient on a zero momentum leaves the param to the decay alone. */
static void test_zero_update(void) {
  int64_t s4[1] = {4};
  lt_tensor *p = check_random(1, s4, LT_F32, -1, 1), *g = lt_tensor_new(), *m = lt_tensor_new();
  lt_empty(g, 1, s4, LT_F32, LT_DEVICE_CPU), lt_fill(g, 0);
  lt_empty(m, 1, s4, LT_F32, LT_DEVICE_CPU), lt_fill(m, 0);
  double before[4];
  for (int i = 0; i < 4; i++) before[i] = check_at(p, i);
  CHECK_OK(lt_lion_step(p, g, m, 0.1, 0.9, 0.99, 0.5));
  int ok = 1;
  for (int i = 0; i < 4; i++) ok &= check_at(p, i) == (double)((float)before[i] * (float)(1 - 0.1 * 0.5));
  CHECK(ok, "a zero gradient must only decay the param");
  lt_release(p), lt_release(g), lt_release(m);
}

static void test_bad_inputs(void) {
  int64_t s8[1] = {8}, s7[1] = {7};
  lt_tensor *p = check_random(1, s8, LT_F32, -1, 1), *g = check_random(1, s8, LT_F32, -1, 1);
  lt_tensor *m = check_random(1, s8, LT_F32, 0, 1), *g7 = check_random(1, s7, LT_F32, -1, 1);
  lt_tensor *g64 = check_random(1, s8, LT_F64, -1, 1), *m64 = check_random(1, s8, LT_F64, 0, 1);
  lt_tensor *pi = check_random(1, s8, LT_I32, 0, 3), *pb = check_random(1, s8, LT_BF16, -1, 1);
  lt_tensor *mb = check_random(1, s8, LT_BF16, -1, 1), *undef = lt_tensor_new();
  double p_before[8], m_before[8];
  for (int i = 0; i < 8; i++) p_before[i] = check_at(p, i), m_before[i] = check_at(m, i);
  CHECK_ERR(lt_lion_step(p, g, m, 1e-3, 1.0, 0.99, 0.1), "betas must be in [0, 1), got (1, 0.99)");
  CHECK_ERR(lt_lion_step(p, g, m, -1e-3, 0.9, 0.99, 0.1), "lr and weight_decay must be >= 0");
  CHECK_ERR(lt_lion_step(p, g, m, 1e-3, 0.9, 0.99, -0.1), "weight_decay -0.1");
  CHECK_ERR(lt_lion_step(p, g7, m, 1e-3, 0.9, 0.99, 0.1), "grad is [7] f32 cpu, expected 8 elements");
  CHECK_ERR(lt_lion_step(p, g64, m, 1e-3, 0.9, 0.99, 0.1), "grad is [8] f64 cpu, expected f32 for param");
  CHECK_ERR(lt_lion_step(p, g, m64, 1e-3, 0.9, 0.99, 0.1), "m is [8] f64 cpu, expected f32");
  CHECK_ERR(lt_lion_step(pb, g, mb, 1e-3, 0.9, 0.99, 0.1), "m is [8] bf16 cpu, expected f32");
  CHECK_ERR(lt_lion_step(pb, g64, m, 1e-3, 0.9, 0.99, 0.1), "expected bf16 or f32");
  CHECK_ERR(lt_lion_step(pi, g, m, 1e-3, 0.9, 0.99, 0.1), "param is i32, expected a floating dtype");
  CHECK_ERR(lt_lion_step(p, g, p, 1e-3, 0.9, 0.99, 0.1), "m must not share memory with param or grad");
  CHECK_ERR(lt_lion_step(p, undef, m, 1e-3, 0.9, 0.99, 0.1), "grad is undefined");
  CHECK_ERR(lt_lion_step(p, g, NULL, 1e-3, 0.9, 0.99, 0.1), "m is NULL");
  CHECK_ERR(lt_lion_step(NULL, g, m, 1e-3, 0.9, 0.99, 0.1), "param is NULL");
  p->device = 15; /* claims cuda:15, which no machine here has: refused before any kernel */
  CHECK_ERR(lt_lion_step(p, g, m, 1e-3, 0.9, 0.99, 0.1), strstr(lt_build_info(), "cuda: built")
                                                             ? "expected it on the device of param"
                                                             : "lutra was built without CUDA");
  p->device = LT_DEVICE_CPU;
  int untouched = 1;
  for (int i = 0; i < 8; i++) untouched &= check_at(p, i) == p_before[i] && check_at(m, i) == m_before[i];
  CHECK(untouched, "a failed step must not touch param or m");
  lt_release(p), lt_release(g), lt_release(m), lt_release(g7), lt_release(g64), lt_release(m64);
  lt_release(pi), lt_release(pb), lt_release(mb), lt_release(undef);
}

int main(void) {
  hparams usual = {1e-3, 0.9, 0.99, 0.1}, other = {3e-2, 0.5, 0.9, 0.0};
  static const int64_t sizes[][2] = {{1, 1}, {7, 1}, {11, 3}, {40, 25}};
  for (int k = 0; k < 4; k++) {
    int64_t r = sizes[k][0], c = sizes[k][1];
    for (int strided = 0; strided < 2; strided++) {
      test_steps(LT_F32, LT_F32, r, c, strided, usual);
      test_steps(LT_F64, LT_F64, r, c, strided, usual);
      test_steps(LT_BF16, LT_BF16, r, c, strided, usual);
      test_steps(LT_BF16, LT_F32, r, c, strided, other);
      test_steps(LT_F16, LT_F16, r, c, strided, usual);
      test_steps(LT_F32, LT_F32, r, c, strided, other);
    }
  }
  test_steps(LT_F32, LT_F32, 1000, 70, 0, usual); /* several parallel chunks */
  test_steps(LT_F16, LT_F32, 1000, 70, 0, usual);
  test_threads();
  test_zero_update();
  test_bad_inputs();
  return check_summary();
}
