/* test_nn_kernels_host.c — logic of the CUDA cross-entropy kernel checked on the CPU: its online
 * log-sum-exp (running max, rescaled sum, per-thread states merged as the block merges them),
 * exported by kernels/loss.cu as lt_cuda_row_lse_on_host, against host/ops_loss.c's two-pass lse,
 * on random rows and on the edge cases (NaN, +-inf, rows of -inf, threads left without elements);
 * and the CUDA paths of the RNG and rope (the host files' arguments, the kernels' element rules
 * and index math) run on host memory against lt_rand_* (bit for bit) and lt_rope (to rounding). Skipped (0 checks) in a
 * CPU-only build.
 */
#define LUTRA_HAVE_CUDA 1 /* for host/cuda_nn_ops.h's declarations; the checks run only in a CUDA build */
#include "check.h"
#include "cuda_nn_ops.h"

/* kernels/ exports, present only in a CUDA build (weak so that a CPU build links) */
__attribute__((weak)) int lt_cuda_row_lse_on_host(const void *row, int dtype, int64_t V, int threads, double *lse);
__attribute__((weak)) int lt_cuda_rng_fill_on_host(const lt_cuda_rng_args *a);
__attribute__((weak)) int lt_cuda_rope_on_host(const lt_cuda_rope_args *a);

/* host/rng.c calls lt_cuda_rng_fill for a tensor on a CUDA device. This definition, in the
 * executable, takes the library's place (ELF interposition): it runs the kernels' element rule
 * and layout (kernels/rng.cu) on the tensor's bytes, which are host memory here. */
static int rng_routed;
int lt_cuda_rng_fill(const lt_cuda_rng_args *a) {
  rng_routed++;
  return lt_cuda_rng_fill_on_host ? lt_cuda_rng_fill_on_host(a) : lt_errorf("no lt_cuda_rng_fill_on_host");
}

/* host/ops_loss.c's lse of one row (targets ignored), kept in f64 for f64 rows. */
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

/* Likewise host/ops_rope.c's call into kernels/rope.cu. */
static int rope_routed;
int lt_cuda_rope(const lt_cuda_rope_args *a) {
  rope_routed++;
  return lt_cuda_rope_on_host ? lt_cuda_rope_on_host(a) : lt_errorf("no lt_cuda_rope_on_host");
}

/* The CUDA path of lt_rope (ops_rope.c's arguments, rope.cu's work items with libm's cos/sin)
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
        CHECK(rope_routed == before + 1 + (mode == 5), "ops_rope.c did not call lt_cuda_rope");
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

/* The CUDA path of lt_rand_* (rng.c's arguments, rng.cu's element rule) equals the CPU path, bit
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
          got->device = 0; /* claims cuda:0: rng.c takes its CUDA path */
          CHECK_OK(draw(kind, got, seed, offsets[o]));
          got->device = LT_DEVICE_CPU;
          CHECK(rng_routed == before + 1, "rng.c did not call lt_cuda_rng_fill");
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
  double got;
  CHECK_ERR(lt_cuda_row_lse_on_host(NULL, LT_F32, 0, 33, &got), "bad thread count");
  CHECK_ERR(lt_cuda_row_lse_on_host(NULL, LT_I32, 0, 32, &got), "not floating");
  return check_summary();
}
