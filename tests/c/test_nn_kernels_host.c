/* test_nn_kernels_host.c — logic of the CUDA cross-entropy kernel checked on the CPU: its online
 * log-sum-exp (running max, rescaled sum, per-thread states merged as the block merges them),
 * exported by kernels/cross_entropy.cu as lt_cuda_row_lse_on_host, against host/ops/cross_entropy.c's two-pass lse,
 * on random rows and on the edge cases (NaN, +-inf, rows of -inf, threads left without elements);
 * and the CUDA paths of the RNG and rope (the host files' arguments, the kernels' element rules
 * and index math) run on host memory against lt_rand_* (bit for bit) and lt_rope (to rounding). Skipped (0 checks) in a
 * CPU-only build.
 */
#include "check.h"
#include "kernels/cross_entropy.h"
#include "kernels/random.h"
#include "kernels/rope.h"
#include <stdarg.h>

/* kernels/ exports, present only in a CUDA build (weak so that a CPU build links) */
__attribute__((weak)) int lt_cuda_row_lse_on_host(const void *row, int dtype, int64_t V, int threads, double *lse);
__attribute__((weak)) int lt_cuda_rng_fill_on_host(const lt_cuda_rng_args *a);
__attribute__((weak)) int lt_cuda_rope_on_host(const lt_rope_plan *a);

/* host/ops/random.c calls lt_cuda_rng_fill for a tensor on a CUDA device. This definition, in the
 * executable, takes the library's place (ELF interposition): it runs the kernels' element rule
 * and layout (kernels/random.cu) on the tensor's bytes, which are host memory here. */
static int rng_routed;
int lt_cuda_rng_fill(const lt_cuda_rng_args *a) {
  rng_routed++;
  return lt_cuda_rng_fill_on_host ? lt_cuda_rng_fill_on_host(a) : lt_errorf("no lt_cuda_rng_fill_on_host");
}

/* host/ops/cross_entropy.c's lse of one row (targets ignored), kept in f64 for f64 rows. */
static double cpu_lse(const lt_tensor *row) {
  int64_t one = 1;
  int out_dtype = row->dtype == LT_F64 ? LT_F64 : LT_F32;
  lt_tensor *tg = lt_tensor_new(), *loss = lt_tensor_new(), *lse = lt_tensor_new();
  if (lt_empty(tg, 1, &one, LT_I64, LT_DEVICE_CPU) || lt_empty(loss, 1, &one, out_dtype, LT_DEVICE_CPU) ||
      lt_empty(lse, 1, &one, out_dtype, LT_DEVICE_CPU))
    exit(2);
  ((int64_t *)lt_data_ptr(tg))[0] = 0;
  CHECK_OK(lt_cross_entropy_forward(loss, lse, row, tg, 0));
  double v = check_at(lse, 0);
  lt_release(tg), lt_release(loss), lt_release(lse);
  return v;
}

static void compare(const char *what, lt_tensor *row, int threads) {
  int dtype = row->dtype;
  int64_t V = row->shape[1];
  double got = 0, want = cpu_lse(row);
  CHECK_OK(lt_cuda_row_lse_on_host(lt_data_ptr(row), dtype, V, threads, &got));
  double tol = dtype == LT_F64 ? 1e-12 : 2e-6 * (1 + log((double)V));
  bool same = isnan(want) ? isnan(got) : isinf(want) ? got == want : fabs(got - want) <= tol * fmax(1, fabs(want));
  CHECK(same, "%s %s V=%lld threads=%d: kernel lse %.9g, cpu %.9g", what, lt_dtype_name(dtype), (long long)V, threads,
        got, want);
}

/* Likewise ops/cross_entropy.c's and ops/embedding.c's calls into kernels/cross_entropy.cu and embedding.cu. */
__attribute__((weak)) int lt_cuda_check_indices_on_host(const char *op, int device, const void *ids, int dtype,
                                                        int64_t stride, int64_t n, int64_t V, int has_ignore,
                                                        int64_t ignore_index, int64_t *bad_pos, int64_t *bad_id);
__attribute__((weak)) int lt_cuda_cross_entropy_forward_on_host(int device, int dtype, const void *logits, int64_t N,
                                                                int64_t V, const void *targets, int tdtype,
                                                                int64_t tstride, int64_t ignore_index, void *losses,
                                                                int ldtype, void *lse, int sdtype);
__attribute__((weak)) int lt_cuda_cross_entropy_backward_on_host(int device, int dtype, void *dlogits,
                                                                 const void *logits, int64_t N, int64_t V,
                                                                 const void *targets, int tdtype, int64_t tstride,
                                                                 int64_t ignore_index, const void *dlosses,
                                                                 const void *lse);
__attribute__((weak)) int lt_cuda_embedding_forward_on_host(int device, void *out, const void *weight,
                                                            int64_t row_stride, int esize, const void *ids, int idtype,
                                                            int64_t n, int64_t C);
__attribute__((weak)) int lt_cuda_embedding_backward_on_host(int device, int dtype, void *dweight, int64_t V, int64_t C,
                                                             const void *dout, const void *ids, int idtype, int64_t n);
static int nn_routed;
int lt_cuda_check_indices(const char *op, int device, const void *ids, int dtype, int64_t stride, int64_t n, int64_t V,
                          int has_ignore, int64_t ignore_index, int64_t *bad_pos, int64_t *bad_id) {
  nn_routed++;
  return lt_cuda_check_indices_on_host(op, device, ids, dtype, stride, n, V, has_ignore, ignore_index, bad_pos, bad_id);
}
int lt_cuda_cross_entropy_forward(int device, int dtype, const void *logits, int64_t N, int64_t V, const void *targets,
                                  int tdtype, int64_t tstride, int64_t ignore_index, void *losses, int ldtype,
                                  void *lse, int sdtype) {
  nn_routed++;
  return lt_cuda_cross_entropy_forward_on_host(device, dtype, logits, N, V, targets, tdtype, tstride, ignore_index,
                                               losses, ldtype, lse, sdtype);
}
int lt_cuda_cross_entropy_backward(int device, int dtype, void *dlogits, const void *logits, int64_t N, int64_t V,
                                   const void *targets, int tdtype, int64_t tstride, int64_t ignore_index,
                                   const void *dlosses, const void *lse) {
  nn_routed++;
  return lt_cuda_cross_entropy_backward_on_host(device, dtype, dlogits, logits, N, V, targets, tdtype, tstride,
                                                ignore_index, dlosses, lse);
}
int lt_cuda_embedding_forward(int device, void *out, const void *weight, int64_t row_stride, int esize, const void *ids,
                              int idtype, int64_t n, int64_t C) {
  nn_routed++;
  return lt_cuda_embedding_forward_on_host(device, out, weight, row_stride, esize, ids, idtype, n, C);
}
int lt_cuda_embedding_backward(int device, int dtype, void *dweight, int64_t V, int64_t C, const void *dout,
                               const void *ids, int idtype, int64_t n) {
  nn_routed++;
  return lt_cuda_embedding_backward_on_host(device, dtype, dweight, V, C, dout, ids, idtype, n);
}

/* Sets the device of each tensor of a NULL-terminated list. */
static void claim(int device, lt_tensor *t, ...) {
  va_list ap;
  va_start(ap, t);
  for (; t; t = va_arg(ap, lt_tensor *)) t->device = device;
  va_end(ap);
}

static int count_bad(const lt_tensor *got, const lt_tensor *want, double tol) {
  int bad = 0;
  for (int64_t i = 0, n = lt_numel(want); i < n; i++) {
    double a = check_at(got, i), b = check_at(want, i);
    bad += !(a == b || (a != a && b != b) || fabs(a - b) <= tol * fmax(1, fabs(b)));
  }
  return bad;
}

/* The CUDA paths of cross-entropy and embedding (the host files' arguments, the kernels' row code,
 * contiguous inputs and defined outputs: no device copies) against the CPU ops. Cross-entropy to
 * the exp's rounding (expf here, a polynomial on the CPU); embedding bit for bit. */
static void test_loss_embedding_rules(void) {
  static const int dtypes[] = {LT_F32, LT_F64, LT_BF16, LT_F16};
  static const int64_t sizes[][2] = {{3, 7}, {4, 1000}, {1, 1}, {5, 257}};
  for (int k = 0; k < 4; k++)
    for (int sz = 0; sz < 4; sz++) {
      int dt = dtypes[k], cdt = dt == LT_F64 ? LT_F64 : LT_F32;
      int64_t N = sizes[sz][0], V = sizes[sz][1];
      lt_tensor *x = check_random(2, sizes[sz], dt, -6, 6), *tg = lt_tensor_new(),
                *dl = check_random(1, &N, cdt, 0.5, 1.5);
      CHECK_OK(lt_empty(tg, 1, &N, sz % 2 ? LT_I32 : LT_I64, LT_DEVICE_CPU));
      for (int64_t i = 0; i < N; i++)
        lt_store_f64(lt_data_ptr(tg), tg->dtype, i, i % 3 == 1 ? -100 : (double)((i * 7) % V));
      lt_tensor *l_c = lt_tensor_new(), *s_c = lt_tensor_new(), *g_c = lt_tensor_new();
      lt_tensor *l_d = lt_tensor_new(), *s_d = lt_tensor_new(), *g_d = lt_tensor_new();
      CHECK_OK(lt_empty(l_c, 1, &N, cdt, LT_DEVICE_CPU));
      CHECK_OK(lt_empty(s_c, 1, &N, cdt, LT_DEVICE_CPU));
      CHECK_OK(lt_empty(l_d, 1, &N, cdt, LT_DEVICE_CPU));
      CHECK_OK(lt_empty(s_d, 1, &N, cdt, LT_DEVICE_CPU));
      CHECK_OK(lt_empty(g_c, 2, sizes[sz], dt, LT_DEVICE_CPU));
      CHECK_OK(lt_empty(g_d, 2, sizes[sz], dt, LT_DEVICE_CPU));
      CHECK_OK(lt_cross_entropy_forward(l_c, s_c, x, tg, -100));
      CHECK_OK(lt_cross_entropy_backward(g_c, dl, x, tg, s_c, -100));
      int before = nn_routed;
      claim(0, x, tg, dl, l_d, s_d, g_d, s_c, NULL);
      CHECK_OK(lt_cross_entropy_forward(l_d, s_d, x, tg, -100));
      CHECK_OK(lt_cross_entropy_backward(g_d, dl, x, tg, s_c, -100));
      claim(LT_DEVICE_CPU, x, tg, dl, l_d, s_d, g_d, s_c, NULL);
      CHECK(nn_routed == before + 4, "ops/cross_entropy.c's CUDA path was not taken (%d calls)", nn_routed - before);
      double ftol = dt == LT_F64 ? 1e-12 : 1e-5, gtol = dt == LT_F64 ? 1e-14 : dt == LT_F32 ? 1e-6 : 0x1p-6;
      int bl = count_bad(l_d, l_c, ftol), bs = count_bad(s_d, s_c, ftol), bg = count_bad(g_d, g_c, gtol);
      CHECK(bl + bs + bg == 0, "cross_entropy %s %lldx%lld: loss %d, lse %d, dlogits %d differ", lt_dtype_name(dt),
            (long long)N, (long long)V, bl, bs, bg);
      lt_release(x), lt_release(tg), lt_release(dl), lt_release(l_c), lt_release(s_c), lt_release(g_c);
      lt_release(l_d), lt_release(s_d), lt_release(g_d);
    }
  /* a bad target: the CPU's message */
  int64_t nv[2] = {3, 7}, three = 3;
  lt_tensor *x = check_random(2, nv, LT_F32, -1, 1), *tg = lt_tensor_new(), *l = lt_tensor_new();
  CHECK_OK(lt_empty(tg, 1, &three, LT_I64, LT_DEVICE_CPU));
  CHECK_OK(lt_empty(l, 1, &three, LT_F32, LT_DEVICE_CPU));
  int64_t *t = lt_data_ptr(tg);
  t[0] = 1, t[1] = -100, t[2] = 7;
  claim(0, x, tg, l, NULL);
  CHECK_ERR(lt_cross_entropy_forward(l, NULL, x, tg, -100),
            "cross_entropy: target 7 out of range [0, 7) at row 2 (ignore_index is -100)");
  claim(LT_DEVICE_CPU, x, tg, l, NULL);
  lt_release(x), lt_release(tg), lt_release(l);

  for (int k = 0; k < 4; k++)
    for (int rep = 0; rep < 2; rep++) {
      int dt = dtypes[k];
      int64_t V = rep ? 5 : 300, Cw = rep ? 129 : 8, ishape[2] = {7, 33}, oshape[3] = {7, 33, Cw}, wshape[2] = {V, Cw};
      lt_tensor *w = check_random(2, wshape, dt, -2, 2), *ids = check_random(2, ishape, LT_I32, 0, (double)V);
      lt_tensor *dout = check_random(3, oshape, dt, -1, 1), *o_c = lt_tensor_new(), *o_d = lt_tensor_new();
      lt_tensor *g_c = lt_tensor_new(), *g_d = lt_tensor_new();
      CHECK_OK(lt_empty(o_d, 3, oshape, dt, LT_DEVICE_CPU));
      CHECK_OK(lt_empty(g_c, 2, wshape, dt, LT_DEVICE_CPU));
      CHECK_OK(lt_empty(g_d, 2, wshape, dt, LT_DEVICE_CPU));
      CHECK_OK(lt_embedding_forward(o_c, w, ids));
      CHECK_OK(lt_embedding_backward(g_c, dout, ids));
      int before = nn_routed;
      claim(0, w, ids, dout, o_d, g_d, NULL);
      CHECK_OK(lt_embedding_forward(o_d, w, ids));
      CHECK_OK(lt_embedding_backward(g_d, dout, ids));
      claim(LT_DEVICE_CPU, w, ids, dout, o_d, g_d, NULL);
      CHECK(nn_routed == before + 4, "ops/embedding.c's CUDA path was not taken (%d calls)", nn_routed - before);
      int bo = count_bad(o_d, o_c, 0), bg = count_bad(g_d, g_c, 0);
      bg += memcmp(lt_data_ptr(g_d), lt_data_ptr(g_c), (size_t)(V * Cw * lt_dtype_size(dt))) != 0;
      CHECK(bo + bg == 0, "embedding %s V=%lld C=%lld: out %d, dweight %d differ", lt_dtype_name(dt), (long long)V,
            (long long)Cw, bo, bg);
      ((int32_t *)lt_data_ptr(ids))[40] = (int32_t)V;
      claim(0, w, ids, o_d, NULL);
      CHECK_ERR(lt_embedding_forward(o_d, w, ids), "out of range [0,");
      claim(LT_DEVICE_CPU, w, ids, o_d, NULL);
      char want[128];
      snprintf(want, sizeof want, "embedding: index %lld out of range [0, %lld) at position 40", (long long)V,
               (long long)V);
      CHECK(strstr(lt_last_error(), want) != NULL, "'%s' lacks '%s'", lt_last_error(), want);
      lt_release(w), lt_release(ids), lt_release(dout), lt_release(o_c), lt_release(o_d), lt_release(g_c),
          lt_release(g_d);
    }
}

/* Likewise host/ops/rope.c's call into kernels/rope.cu. */
static int rope_routed;
int lt_cuda_rope(const lt_rope_plan *a) {
  rope_routed++;
  return lt_cuda_rope_on_host ? lt_cuda_rope_on_host(a) : lt_errorf("no lt_cuda_rope_on_host");
}

/* The CUDA path of lt_rope (ops/rope.c's arguments, rope.cu's work items with libm's cos/sin)
 * equals the CPU path to rounding: positions none, (T) and (B, T), inverse, strided, in place. */
static void test_rope_rule(void) {
  static const int dtypes[] = {LT_F32, LT_F64, LT_BF16, LT_F16};
  static const int64_t shapes[][4] = {{2, 5, 3, 8}, {1, 17, 4, 64}, {3, 7, 2, 2}, {2, 9, 5, 10}};
  for (int k = 0; k < 4; k++)
    for (int sh = 0; sh < 4; sh++)
      for (int mode = 0; mode < 6; mode++) { /* positions: none, (T), (B, T); x contiguous or permuted */
        const int64_t *shape = shapes[sh];
        int64_t B = shape[0], T = shape[1], H = shape[2], D = shape[3];
        int64_t perm_shape[4] = {B, H, T, D}, tshape[1] = {T}, btshape[2] = {B, T};
        int inverse = mode % 2, dt = dtypes[k];
        lt_tensor *x = lt_tensor_new(), *pos = NULL;
        lt_tensor *stored = check_random(4, mode >= 3 ? perm_shape : shape, dt, -1, 1);
        if (mode >= 3)
          CHECK_OK(lt_transpose(x, stored, 1, 2));
        else
          CHECK_OK(lt_set(x, stored));
        if (mode % 3 == 1) pos = check_random(1, tshape, LT_I64, 0, 5000);
        if (mode % 3 == 2) pos = check_random(2, btshape, LT_I32, 0, 300000);
        double theta = mode % 3 == 2 ? 500000 : 10000;
        lt_tensor *want = lt_tensor_new(), *got = lt_tensor_new();
        CHECK_OK(lt_rope(want, x, pos, theta, inverse));
        CHECK_OK(lt_empty(got, 4, shape, dt, LT_DEVICE_CPU));
        int before = rope_routed;
        x->device = got->device = 0;
        if (pos) pos->device = 0;
        CHECK_OK(lt_rope(got, x, pos, theta, inverse));
        if (mode == 5) CHECK_OK(lt_rope(x, x, pos, theta, inverse)); /* in place, strided */
        x->device = got->device = LT_DEVICE_CPU;
        if (pos) pos->device = LT_DEVICE_CPU;
        CHECK(rope_routed == before + 1 + (mode == 5), "ops/rope.c did not call lt_cuda_rope");
        /* The CPU build contracts x*c - y*s into FMAs (-mfma, GCC's default -ffp-contract=fast) where
         * the kernel rounds each product: one rounding apart, 2 units of the dtype at |value| <= ~1.4.
         * An index or stride mistake would be off by O(1). */
        double eps = dt == LT_F64 ? 0x1p-52 : dt == LT_F32 ? 0x1p-23 : dt == LT_BF16 ? 0x1p-8 : 0x1p-11;
        int bad = 0, bad_inplace = 0;
        for (int64_t i = 0; i < B * T * H * D; i++) {
          double w = check_at(want, i), tol = 2 * eps * fmax(1, fabs(w));
          bad += !(fabs(check_at(got, i) - w) <= tol);
          if (mode == 5) bad_inplace += !(fabs(check_at(x, i) - w) <= tol);
        }
        CHECK(bad == 0 && bad_inplace == 0, "rope %s shape %d mode %d: %d (in place %d) elements differ",
              lt_dtype_name(dt), sh, mode, bad, bad_inplace);
        lt_release(x), lt_release(stored), lt_release(pos), lt_release(want), lt_release(got);
      }
}

enum { U, N, I, B };
static int draw(int kind, lt_tensor *t, uint64_t seed, uint64_t offset) {
  switch (kind) {
  case U: return lt_rand_uniform(t, seed, offset, -2.5, 3.0);
  case N: return lt_rand_normal(t, seed, offset, 0.5, 2.0);
  case I: return lt_rand_int(t, seed, offset, t->dtype == LT_U8 ? 3 : -1000, t->dtype == LT_U8 ? 250 : 777);
  default: return lt_rand_bernoulli(t, seed, offset, 0.3);
  }
}

/* The CUDA path of lt_rand_* (ops/random.c's arguments, kernels/random.cu's element rule) equals the CPU path, bit
 * for bit, for every dtype and distribution, contiguous and strided, at offsets not a multiple of 4. */
static void test_rng_rule(void) {
  static const int dtypes[] = {LT_F32, LT_F64, LT_BF16, LT_F16, LT_I32, LT_I64, LT_U8, LT_BOOL};
  static const uint64_t offsets[] = {3, 0x100000005ull, 0xFFFFFFFFFFFFFFFDull};
  for (int k = 0; k < 8; k++)
    for (int kind = U; kind <= B; kind++) {
      int dt = dtypes[k];
      bool is_float = lt_dtype_is_float(dt);
      if ((kind == U || kind == N) && !is_float) continue;
      if (kind == I && dt == LT_BOOL) continue;
      for (int o = 0; o < 3; o++)
        for (int strided = 0; strided < 2; strided++) {
          int64_t shape[2] = {37, 29};
          uint64_t seed = 0x123456789abcdefull * (uint64_t)(o + 1);
          lt_tensor *want = lt_tensor_new(), *base = lt_tensor_new(), *got = lt_tensor_new();
          CHECK_OK(lt_empty(want, 2, shape, dt, LT_DEVICE_CPU));
          CHECK_OK(lt_empty(base, 2, shape, dt, LT_DEVICE_CPU));
          if (strided) { /* a (29, 37) tensor seen transposed: not contiguous */
            int64_t tshape[2] = {29, 37};
            CHECK_OK(lt_empty(base, 2, tshape, dt, LT_DEVICE_CPU));
            CHECK_OK(lt_transpose(got, base, 0, 1));
          } else {
            CHECK_OK(lt_set(got, base));
          }
          CHECK_OK(draw(kind, want, seed, offsets[o]));
          int before = rng_routed;
          got->device = 0; /* claims cuda:0: ops/random.c takes its CUDA path */
          CHECK_OK(draw(kind, got, seed, offsets[o]));
          got->device = LT_DEVICE_CPU;
          CHECK(rng_routed == before + 1, "ops/random.c did not call lt_cuda_rng_fill");
          int bad = 0;
          for (int64_t i = 0; i < 37 * 29; i++) {
            double a = check_at(got, i), b = check_at(want, i);
            bad += !(a == b || (a != a && b != b));
          }
          if (dt == LT_I64 && !strided) bad += memcmp(lt_data_ptr(got), lt_data_ptr(want), 37 * 29 * 8) != 0;
          CHECK(bad == 0, "%s kind %d offset %d strided %d: %d elements differ", lt_dtype_name(dt), kind, o, strided,
                bad);
          lt_release(want), lt_release(base), lt_release(got);
        }
    }
}

int main(void) {
  if (!lt_cuda_row_lse_on_host) {
    printf("CPU-only build: no kernels to check\n");
    return check_summary();
  }
  static const int dtypes[] = {LT_F32, LT_F64, LT_BF16, LT_F16};
  static const int64_t widths[] = {1, 7, 33, 100, 1000, 50257};
  static const int threads[] = {32, 64, 512};
  for (int d = 0; d < 4; d++)
    for (int w = 0; w < 6; w++)
      for (int k = 0; k < 3; k++) {
        int64_t shape[2] = {1, widths[w]};
        double lo = d == 3 ? -8 : -30, hi = d == 3 ? 8 : 30; /* f16 holds exp-sized spreads only so far */
        lt_tensor *row = check_random(2, shape, dtypes[d], lo, hi);
        compare("random", row, threads[k]);
        /* edge cases written into the row: each alone */
        int64_t V = widths[w];
        char *p = lt_data_ptr(row);
        double saved0 = check_at(row, 0), savedl = check_at(row, V - 1);
        lt_store_f64(p, dtypes[d], V - 1, NAN); /* f32 rows drop NaN, f64 rows become NaN */
        compare("nan", row, threads[k]);
        lt_store_f64(p, dtypes[d], V - 1, INFINITY);
        compare("+inf", row, threads[k]);
        lt_store_f64(p, dtypes[d], 0, -INFINITY);
        lt_store_f64(p, dtypes[d], V - 1, savedl);
        compare("-inf", row, threads[k]);
        lt_store_f64(p, dtypes[d], 0, saved0);
        for (int64_t j = 0; j < V; j++) lt_store_f64(p, dtypes[d], j, -INFINITY);
        compare("all -inf", row, threads[k]);
        lt_store_f64(p, dtypes[d], V / 2, NAN);
        compare("nan among -inf", row, threads[k]);
        lt_store_f64(p, dtypes[d], 0, 3.0);
        compare("one finite", row, threads[k]);
        lt_release(row);
      }
  test_rng_rule();
  test_rope_rule();
  test_loss_embedding_rules();
  double got;
  CHECK_ERR(lt_cuda_row_lse_on_host(NULL, LT_F32, 0, 33, &got), "bad thread count");
  CHECK_ERR(lt_cuda_row_lse_on_host(NULL, LT_I32, 0, 32, &got), "not floating");
  return check_summary();
}
