/* test_adamw.c — the fused AdamW step against a naive double loop of the PyTorch AdamW formula,
 * over several steps, every supported dtype combination, strided state, bad inputs. */
#include "check.h"

typedef struct hparams {
  double lr, beta1, beta2, eps, wd;
} hparams;

/* torch.optim.AdamW, one step, in double: decoupled decay first, then the Adam update. */
static void ref_step(double *p, const double *g, double *m, double *v, int64_t n, hparams h, int64_t step) {
  double bc1 = 1 - pow(h.beta1, (double)step), bc2 = 1 - pow(h.beta2, (double)step);
  for (int64_t i = 0; i < n; i++) {
    p[i] *= 1 - h.lr * h.wd;
    m[i] = h.beta1 * m[i] + (1 - h.beta1) * g[i];
    v[i] = h.beta2 * v[i] + (1 - h.beta2) * g[i] * g[i];
    p[i] -= h.lr * (m[i] / bc1) / (sqrt(v[i] / bc2) + h.eps);
  }
}

static double round_to(int dtype, double x) {
  double y;
  unsigned char buf[8];
  lt_store_f64(buf, dtype, 0, x);
  y = lt_load_f64(buf, dtype, 0);
  return y;
}

/* A tensor of n elements as a 1-D tensor, or as the transpose of a (cols, rows) buffer when
 * strided (n = rows * cols), holding `values`. */
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
  double *m = calloc((size_t)n, sizeof(double)), *v = calloc((size_t)n, sizeof(double));
  for (int64_t i = 0; i < n; i++) p[i] = round_to(pdtype, 2 * check_uniform() - 1);
  lt_tensor *pt = make(rows, cols, pdtype, strided, p), *mt = make(rows, cols, mdtype, strided, m);
  lt_tensor *vt = make(rows, cols, mdtype, strided, v);
  double worst[3] = {0, 0, 0};
  int bad = 0;
  for (int64_t step = 1; step <= 5; step++) {
    for (int64_t i = 0; i < n; i++) g[i] = round_to(gdtype, (2 * check_uniform() - 1) * (i % 3 ? 1 : 1e-3));
    lt_tensor *gt = make(rows, cols, gdtype, !strided, g);
    CHECK_OK(lt_adamw_step(pt, gt, mt, vt, h.lr, h.beta1, h.beta2, h.eps, h.wd, step));
    lt_release(gt);
    ref_step(p, g, m, v, n, h, step);
    /* the op rounds m and v to their dtype every step, and a 16-bit param once per step: so
     * does the reference, so that errors do not compound */
    for (int64_t i = 0; i < n; i++) {
      double got[3] = {check_at(pt, i), check_at(mt, i), check_at(vt, i)}, want[3] = {p[i], m[i], v[i]};
      double tol[3] = {check_tol(pdtype), check_tol(mdtype), check_tol(mdtype)};
      if (pdtype == LT_BF16 || pdtype == LT_F16) tol[0] = pdtype == LT_BF16 ? 4e-3 : 5e-4; /* one rounding */
      for (int k = 0; k < 3; k++) {
        /* p moves by ~lr per step: measure its error against lr; m against its terms (it may cancel) */
        double scale = k == 0   ? fmax(fabs(want[0]), h.lr * 10)
                       : k == 1 ? fabs(want[1]) + (1 - h.beta1) * fabs(g[i]) + 1e-12
                                : fabs(want[2]) + 1e-12;
        double err = fabs(got[k] - want[k]) / scale;
        if (err > tol[k] * 4) bad++;
        worst[k] = fmax(worst[k], err);
      }
      p[i] = got[0], m[i] = got[1], v[i] = got[2];
    }
  }
  CHECK(bad == 0, "adamw param %s grad %s n %lld strided %d lr %g b1 %g wd %g: %d bad, rel errs p %g m %g v %g",
        lt_dtype_name(pdtype), lt_dtype_name(gdtype), (long long)n, strided, h.lr, h.beta1, h.wd, bad, worst[0],
        worst[1], worst[2]);
  free(p), free(g), free(m), free(v);
  lt_release(pt), lt_release(mt), lt_release(vt);
}

/* f32 results are the same with 1 and 2 threads (each element is independent). */
static void test_threads(void) {
  int64_t shape[1] = {200003};
  lt_tensor *p[2], *m[2], *v[2], *g = check_random(1, shape, LT_F32, -1, 1);
  lt_tensor *p0 = check_random(1, shape, LT_F32, -1, 1);
  int threads = lt_get_num_threads();
  for (int r = 0; r < 2; r++) {
    p[r] = lt_tensor_new(), m[r] = lt_tensor_new(), v[r] = lt_tensor_new();
    lt_empty(p[r], 1, shape, LT_F32, LT_DEVICE_CPU), lt_copy(p[r], p0);
    lt_empty(m[r], 1, shape, LT_F32, LT_DEVICE_CPU), lt_fill(m[r], 0);
    lt_empty(v[r], 1, shape, LT_F32, LT_DEVICE_CPU), lt_fill(v[r], 0);
    lt_set_num_threads(r + 1);
    for (int s = 1; s <= 3; s++) CHECK_OK(lt_adamw_step(p[r], g, m[r], v[r], 1e-3, 0.9, 0.999, 1e-8, 0.1, s));
  }
  lt_set_num_threads(threads);
  CHECK(memcmp(lt_data_ptr(p[0]), lt_data_ptr(p[1]), 200003 * 4) == 0, "adamw differs between 1 and 2 threads");
  for (int r = 0; r < 2; r++) lt_release(p[r]), lt_release(m[r]), lt_release(v[r]);
  lt_release(g), lt_release(p0);
}

static void test_bad_inputs(void) {
  int64_t s8[1] = {8}, s7[1] = {7};
  lt_tensor *p = check_random(1, s8, LT_F32, -1, 1), *g = check_random(1, s8, LT_F32, -1, 1);
  lt_tensor *m = check_random(1, s8, LT_F32, 0, 1), *v = check_random(1, s8, LT_F32, 0, 1);
  lt_tensor *g7 = check_random(1, s7, LT_F32, -1, 1), *g64 = check_random(1, s8, LT_F64, -1, 1);
  lt_tensor *m64 = check_random(1, s8, LT_F64, 0, 1), *pi = check_random(1, s8, LT_I32, 0, 3);
  lt_tensor *pb = check_random(1, s8, LT_BF16, -1, 1), *undef = lt_tensor_new();
  double p_before[8], m_before[8];
  for (int i = 0; i < 8; i++) p_before[i] = check_at(p, i), m_before[i] = check_at(m, i);
  CHECK_ERR(lt_adamw_step(p, g, m, v, 1e-3, 0.9, 0.999, 1e-8, 0.1, 0), "step must be >= 1 for bias correction, got 0");
  CHECK_ERR(lt_adamw_step(p, g, m, v, 1e-3, 0.9, 0.999, 1e-8, 0.1, -3), "got -3");
  CHECK_ERR(lt_adamw_step(p, g, m, v, 1e-3, 1.0, 0.999, 1e-8, 0.1, 1), "betas must be in [0, 1), got (1, 0.999)");
  CHECK_ERR(lt_adamw_step(p, g, m, v, -1e-3, 0.9, 0.999, 1e-8, 0.1, 1), "lr, eps and weight_decay must be >= 0");
  CHECK_ERR(lt_adamw_step(p, g7, m, v, 1e-3, 0.9, 0.999, 1e-8, 0.1, 1), "grad is [7] f32 cpu, expected 8 elements");
  CHECK_ERR(lt_adamw_step(p, g64, m, v, 1e-3, 0.9, 0.999, 1e-8, 0.1, 1), "grad is [8] f64 cpu, expected f32 for param");
  CHECK_ERR(lt_adamw_step(p, g, m64, v, 1e-3, 0.9, 0.999, 1e-8, 0.1, 1), "m is [8] f64 cpu, expected f32");
  CHECK_ERR(lt_adamw_step(pb, g64, m, v, 1e-3, 0.9, 0.999, 1e-8, 0.1, 1), "expected bf16 or f32");
  CHECK_ERR(lt_adamw_step(pi, g, m, v, 1e-3, 0.9, 0.999, 1e-8, 0.1, 1), "param is i32, expected a floating dtype");
  CHECK_ERR(lt_adamw_step(p, g, m, m, 1e-3, 0.9, 0.999, 1e-8, 0.1, 1), "m and v must be different tensors");
  CHECK_ERR(lt_adamw_step(p, undef, m, v, 1e-3, 0.9, 0.999, 1e-8, 0.1, 1), "grad is undefined");
  CHECK_ERR(lt_adamw_step(NULL, g, m, v, 1e-3, 0.9, 0.999, 1e-8, 0.1, 1), "param is NULL");
  p->device = 15; /* claims cuda:15, which no machine here has: refused before any kernel */
  CHECK_ERR(lt_adamw_step(p, g, m, v, 1e-3, 0.9, 0.999, 1e-8, 0.1, 1), strstr(lt_build_info(), "cuda: built")
                                                                           ? "expected it on the device of param"
                                                                           : "lutra was built without CUDA");
  p->device = LT_DEVICE_CPU;
  int untouched = 1;
  for (int i = 0; i < 8; i++) untouched &= check_at(p, i) == p_before[i] && check_at(m, i) == m_before[i];
  CHECK(untouched, "a failed step must not touch param or m");
  lt_release(p), lt_release(g), lt_release(m), lt_release(v), lt_release(g7), lt_release(g64), lt_release(m64);
  lt_release(pi), lt_release(pb), lt_release(undef);
}

int main(void) {
  hparams usual = {1e-3, 0.9, 0.999, 1e-8, 0.1}, other = {3e-2, 0.3, 0.95, 1e-6, 0.0};
  static const int64_t sizes[][2] = {{1, 1}, {7, 1}, {11, 3}, {40, 25}};
  for (int k = 0; k < 4; k++) {
    int64_t r = sizes[k][0], c = sizes[k][1];
    for (int strided = 0; strided < 2; strided++) {
      test_steps(LT_F32, LT_F32, r, c, strided, usual);
      test_steps(LT_F64, LT_F64, r, c, strided, usual);
      test_steps(LT_BF16, LT_BF16, r, c, strided, usual);
      test_steps(LT_BF16, LT_F32, r, c, strided, other);
      test_steps(LT_F16, LT_F16, r, c, strided, usual);
      test_steps(LT_F32, LT_F32, r, c, strided, other); /* lerp weight >= 0.5, no decay */
    }
  }
  test_steps(LT_F32, LT_F32, 1000, 70, 0, usual); /* several parallel chunks */
  test_steps(LT_BF16, LT_F32, 1000, 70, 0, usual);
  test_threads();
  test_bad_inputs();
  return check_summary();
}
