/* test_cuda_copy_gpu.c — with a GPU (label gpu; skipped without one): fill, add, convert and
 * host<->device copies agree with the CPU, bit for bit, on odd sizes and misaligned starts.
 * Without a GPU: test_cuda_nogpu.c. */
#include "cuda_values.h"

/* kernels/ exports (present only in a CUDA build; weak so that a CPU build links) */
__attribute__((weak)) int lt_cuda_add_on_host(void *out, const void *a, const void *b, int dtype, int64_t n);
__attribute__((weak)) int lt_cuda_add_contig(int device, void *out, const void *a, const void *b, int dtype, int64_t n);

/* ---- with a GPU ------------------------------------------------------------------------------ */

/* A cuda tensor of n elements starting `skip` elements into its storage (misaligned for
 * 128-bit vectors when skip is odd), holding a copy of the CPU tensor `from` if given. */
static lt_tensor *cuda_tensor(int64_t n, int dtype, int64_t skip, const lt_tensor *from) {
  int64_t full[1] = {n + skip};
  lt_tensor *base = lt_tensor_new(), *t = lt_tensor_new();
  CHECK_OK(lt_empty(base, 1, full, dtype, 0));
  CHECK_OK(lt_narrow(t, base, 0, skip, n));
  lt_release(base);
  if (from) CHECK_OK(lt_copy(t, from));
  return t;
}

static lt_tensor *to_cpu(const lt_tensor *t) {
  lt_tensor *h = lt_tensor_new();
  CHECK_OK(lt_empty(h, t->ndim, t->shape, t->dtype, LT_DEVICE_CPU));
  CHECK_OK(lt_copy(h, t));
  return h;
}

static void test_gpu(void) {
  printf("GPU: %s\n", lt_cuda_status());
  static const int64_t sizes[] = {0, 1, 7, 1023, 65537};
  static const int64_t skips[] = {0, 1};
  int runs = 0;
  for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++)
    for (size_t ki = 0; ki < 2; ki++) {
      int64_t n = sizes[si], skip = skips[ki], shape[1] = {n};
      for (int dt = 0; dt < LT_NUM_DTYPES; dt++) {
        /* copy round trip: host -> device -> host is exact */
        lt_tensor *h = check_random(1, shape, dt, -100, 100);
        lt_tensor *d = cuda_tensor(n, dt, skip, h), *back = to_cpu(d);
        CHECK(same_bytes(h, back), "copy round trip %s n=%lld skip=%lld", lt_dtype_name(dt), (long long)n,
              (long long)skip);
        /* fill: same bits as the CPU fill */
        double value = dt == LT_BOOL ? 1 : lt_dtype_is_float(dt) ? -1.0 / 3.0 : -5;
        if (dt == LT_U8) value = 200;
        CHECK_OK(lt_fill(d, value));
        lt_release(back);
        back = to_cpu(d);
        CHECK_OK(lt_fill(h, value));
        CHECK(same_bytes(h, back), "fill %s n=%lld skip=%lld", lt_dtype_name(dt), (long long)n, (long long)skip);
        lt_release(h), lt_release(d), lt_release(back);
        /* convert from every dtype into dt on the device */
        for (int s = 0; s < LT_NUM_DTYPES; s++) {
          lt_tensor *hs = special_tensor(n, s, dt), *want = lt_tensor_new();
          CHECK_OK(lt_empty(want, 1, shape, dt, LT_DEVICE_CPU));
          CHECK_OK(lt_copy(want, hs));
          lt_tensor *ds = cuda_tensor(n, s, skip, hs), *dd = cuda_tensor(n, dt, 0, NULL);
          CHECK_OK(lt_copy(dd, ds));
          lt_tensor *got = to_cpu(dd);
          CHECK(same_bytes(want, got), "convert %s -> %s n=%lld skip=%lld", lt_dtype_name(s), lt_dtype_name(dt),
                (long long)n, (long long)skip);
          lt_release(hs), lt_release(want), lt_release(ds), lt_release(dd), lt_release(got);
        }
        runs++;
      }
      /* add, through the bridge (lt_binary's dispatch is tested by `lutra selftest`) */
      for (size_t k = 0; k < sizeof add_dtypes / sizeof *add_dtypes; k++) {
        int dt = add_dtypes[k];
        lt_tensor *a = check_random(1, shape, dt, -50, 50), *b = check_random(1, shape, dt, -50, 50);
        lt_tensor *want = lt_tensor_new();
        CHECK_OK(lt_empty(want, 1, shape, dt, LT_DEVICE_CPU));
        CHECK_OK(lt_cuda_add_on_host(lt_data_ptr(want), lt_data_ptr(a), lt_data_ptr(b), dt, n));
        lt_tensor *da = cuda_tensor(n, dt, skip, a), *db = cuda_tensor(n, dt, 0, b),
                  *dout = cuda_tensor(n, dt, 0, NULL);
        CHECK_OK(lt_cuda_add_contig(0, lt_data_ptr(dout), lt_data_ptr(da), lt_data_ptr(db), dt, n));
        CHECK_OK(lt_cuda_add_contig(0, lt_data_ptr(db), lt_data_ptr(da), lt_data_ptr(db), dt, n)); /* in place */
        lt_tensor *got = to_cpu(dout), *got_inplace = to_cpu(db);
        CHECK(same_bytes(want, got), "add %s n=%lld skip=%lld", lt_dtype_name(dt), (long long)n, (long long)skip);
        CHECK(same_bytes(want, got_inplace), "in-place add %s n=%lld", lt_dtype_name(dt), (long long)n);
        lt_release(a), lt_release(b), lt_release(want), lt_release(da), lt_release(db), lt_release(dout);
        lt_release(got), lt_release(got_inplace);
      }
    }
  CHECK_OK(lt_cuda_synchronize(0));
  printf("GPU: %d fill/copy/convert runs\n", runs);

  /* errors name the op and device, and nothing crashes */
  int64_t shape[1] = {4};
  lt_tensor *t = lt_tensor_new();
  CHECK_ERR(lt_empty(t, 1, shape, LT_F32, lt_cuda_device_count()), "is not available");
  CHECK_ERR(lt_cuda_add_contig(0, NULL, NULL, NULL, LT_U8, 4), "not supported on cuda");
  int64_t huge[1] = {(int64_t)1 << 50};
  CHECK_ERR(lt_empty(t, 1, huge, LT_F32, 0), "out of memory");
  CHECK_OK(lt_empty(t, 1, shape, LT_F32, 0)); /* the device is fine after a failed allocation */
  CHECK_OK(lt_fill(t, 1));
  lt_release(t);

  lt_memory_stats st;
  CHECK_OK(lt_memory_get_stats(0, &st));
  CHECK(st.allocated == 0, "cuda:0 leaks %lld bytes", (long long)st.allocated);
}

int main(void) {
  int skip = check_need_gpu();
  if (skip) return skip;
  test_gpu();
  return check_summary();
}
