/* test_nn_kernels_host.c — logic of the CUDA cross-entropy kernel checked on the CPU: its online
 * log-sum-exp (running max, rescaled sum, per-thread states merged as the block merges them),
 * exported by kernels/loss.cu as lt_cuda_row_lse_on_host, against host/ops_loss.c's two-pass lse,
 * on random rows and on the edge cases (NaN, +-inf, rows of -inf, threads left without elements).
 * Skipped (0 checks) in a CPU-only build. */
#include "check.h"

__attribute__((weak)) int lt_cuda_row_lse_on_host(const void *row, int dtype, int64_t V, int threads, double *lse);

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
  double got;
  CHECK_ERR(lt_cuda_row_lse_on_host(NULL, LT_F32, 0, 33, &got), "bad thread count");
  CHECK_ERR(lt_cuda_row_lse_on_host(NULL, LT_I32, 0, 32, &got), "not floating");
  return check_summary();
}
