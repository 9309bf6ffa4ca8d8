/* test_cuda_nogpu.c — the CUDA path, meaningful on every machine.
 *
 * Without a GPU (or in a CPU-only build): the device count is 0, the status says why,
 * and every attempt to use cuda:k fails with a clear error and crashes nothing. The
 * kernels' element rules (kernels/elementwise.cu, run on the CPU through the
 * *_on_host exports of a CUDA build) must agree bit for bit with host/copy.c.
 * With a GPU: fill, add, convert and host<->device copies agree with the CPU, bit for
 * bit, on odd sizes and misaligned starts. */
#include "check.h"

/* kernels/ exports (present only in a CUDA build; weak so that a CPU build links) */
__attribute__((weak)) int lt_cuda_convert_on_host(void *dst, int dst_dtype, const void *src, int src_dtype, int64_t n);
__attribute__((weak)) int lt_cuda_add_on_host(void *out, const void *a, const void *b, int dtype, int64_t n);
__attribute__((weak)) int lt_cuda_add_contig(int device, void *out, const void *a, const void *b, int dtype, int64_t n);

static const int add_dtypes[] = {LT_F32, LT_F64, LT_BF16, LT_F16, LT_I32, LT_I64};

/* Values that stress conversions: ties, subnormals, infinities, NaN, big and negative. */
static double special_value(int64_t i, int src_dtype, int dst_dtype) {
  static const double floats[] = {0.0,   -0.0,    1.0,        -1.5,        2.5,       65504.0, 65520.0, 1e-8,
                                  6e-8,  3e-5,    1.00390625, 1.005859375, 3.4e38,    -1e30,   1e-40,   0.1,
                                  255.0, -128.75, 300.0,      INFINITY,    -INFINITY, NAN};
  static const double ints[] = {0, 1, -1, 2, 127, -128, 255, 256, 1000, -70000, 16777217, 2147483647, -2147483647};
  /* float -> int of an out-of-range value is undefined in C: those stay in range (f16 too) */
  static const double small_ints[] = {0, 1, -1, 2, 127, -128, 255, 256, 1000, -60000};
  bool int_dst = !lt_dtype_is_float(dst_dtype), int_src = !lt_dtype_is_float(src_dtype);
  if (int_src || int_dst) {
    double v = int_src ? ints[i % (int64_t)(sizeof ints / sizeof *ints)]
                       : small_ints[i % (int64_t)(sizeof small_ints / sizeof *small_ints)];
    if (dst_dtype == LT_U8 || src_dtype == LT_U8) v = fabs(fmod(v, 256.0));
    return v + (int_src ? 0.0 : 0.25 * (double)(i % 4));
  }
  return floats[i % (int64_t)(sizeof floats / sizeof *floats)] * (i % 3 == 2 ? -1.0 : 1.0);
}

static lt_tensor *special_tensor(int64_t n, int src_dtype, int dst_dtype) {
  int64_t shape[1] = {n};
  lt_tensor *t = lt_tensor_new();
  CHECK_OK(lt_empty(t, 1, shape, src_dtype, LT_DEVICE_CPU));
  for (int64_t i = 0; i < n; i++) lt_store_f64(lt_data_ptr(t), src_dtype, i, special_value(i, src_dtype, dst_dtype));
  return t;
}

static bool same_bytes(const lt_tensor *a, const lt_tensor *b) {
  return lt_numel(a) == lt_numel(b) && a->dtype == b->dtype &&
         memcmp(lt_data_ptr(a), lt_data_ptr(b), (size_t)(lt_numel(a) * lt_dtype_size(a->dtype))) == 0;
}

/* ---- no GPU --------------------------------------------------------------------------- */

static void test_no_gpu(void) {
  bool built_with_cuda = strstr(lt_build_info(), "cuda: built with CUDA") != NULL;
  const char *status = lt_cuda_status();
  printf("no GPU: %s build, status \"%s\"\n", built_with_cuda ? "CUDA" : "CPU-only", status);
  CHECK(status && status[0], "empty cuda status");
  if (built_with_cuda)
    CHECK(strstr(status, "CUDA") && !strstr(status, "built without"), "status does not say why: %s", status);
  else
    CHECK(strstr(status, "built without CUDA"), "status: %s", status);

  int64_t shape[2] = {3, 4};
  lt_tensor *t = lt_tensor_new();
  CHECK_ERR(lt_empty(t, 2, shape, LT_F32, 0), "cuda:0 is not available");
  CHECK(strstr(lt_last_error(), status) != NULL, "error does not repeat the status: %s", lt_last_error());
  CHECK(!lt_is_defined(t), "a failed allocation left the tensor defined");
  CHECK_ERR(lt_empty(t, 2, shape, LT_BF16, 3), "cuda:3 is not available");
  CHECK_ERR(lt_empty(t, 2, shape, LT_F32, 99), "invalid device");
  CHECK_ERR(lt_empty(t, 2, shape, LT_F32, -7), "invalid device");
  CHECK_ERR(lt_arange(t, 0, 10, 1, LT_F32, 0), "cuda:0 is not available");
  CHECK_ERR(lt_linspace(t, 0, 1, 5, LT_F64, 0), "cuda:0 is not available");
  CHECK_ERR(lt_cuda_synchronize(0), "cuda:0 is not available");
  CHECK_OK(lt_cuda_synchronize(LT_DEVICE_CPU));

  /* nothing was allocated on the (absent) device */
  lt_memory_stats st;
  CHECK_OK(lt_memory_get_stats(0, &st));
  CHECK(st.allocated == 0 && st.reserved == 0 && st.num_allocs == 0, "cuda:0 stats not empty");
  CHECK_OK(lt_memory_empty_cache(0));

  /* the CPU keeps working after all those failures */
  CHECK_OK(lt_empty(t, 2, shape, LT_F32, LT_DEVICE_CPU));
  CHECK_OK(lt_fill(t, 2.5));
  CHECK(check_at(t, 11) == 2.5, "cpu fill after cuda errors");
  lt_release(t);
}

/* ---- the kernels' element rules, run on the CPU ------------------------------------------ */

static void test_rules_on_host(void) {
  if (!lt_cuda_convert_on_host || !lt_cuda_add_on_host) {
    printf("element rules: skipped (CPU-only build)\n");
    return;
  }
  int pairs = 0;
  for (int s = 0; s < LT_NUM_DTYPES; s++)
    for (int d = 0; d < LT_NUM_DTYPES; d++) {
      int64_t n = 97, shape[1] = {n};
      lt_tensor *src = special_tensor(n, s, d), *want = lt_tensor_new(), *got = lt_tensor_new();
      CHECK_OK(lt_empty(want, 1, shape, d, LT_DEVICE_CPU));
      CHECK_OK(lt_empty(got, 1, shape, d, LT_DEVICE_CPU));
      CHECK_OK(lt_copy(want, src));
      CHECK_OK(lt_cuda_convert_on_host(lt_data_ptr(got), d, lt_data_ptr(src), s, n));
      CHECK(same_bytes(want, got), "convert %s -> %s differs from host/copy.c", lt_dtype_name(s), lt_dtype_name(d));
      pairs++;
      lt_release(src), lt_release(want), lt_release(got);
    }
  CHECK_ERR(lt_cuda_convert_on_host(NULL, 42, NULL, LT_F32, 0), "unknown dtype");

  /* add: 16-bit computed in f32 and rounded to nearest even, integers wrap */
  for (size_t k = 0; k < sizeof add_dtypes / sizeof *add_dtypes; k++) {
    int dt = add_dtypes[k];
    int64_t n = 1023, shape[1] = {n};
    lt_tensor *a = check_random(1, shape, dt, -1000, 1000), *b = check_random(1, shape, dt, -1000, 1000);
    lt_tensor *got = lt_tensor_new();
    CHECK_OK(lt_empty(got, 1, shape, dt, LT_DEVICE_CPU));
    CHECK_OK(lt_cuda_add_on_host(lt_data_ptr(got), lt_data_ptr(a), lt_data_ptr(b), dt, n));
    int bad = 0;
    for (int64_t i = 0; i < n; i++) {
      double want = check_at(a, i) + check_at(b, i);
      unsigned char bits[8];
      if (dt == LT_F32 || dt == LT_BF16 || dt == LT_F16) { /* the f32 sum (exact via double), then rounded */
        lt_store_f64(bits, dt, 0, (double)(float)want);
        want = lt_load_f64(bits, dt, 0);
      }
      if (check_at(got, i) != want) bad++;
    }
    CHECK(bad == 0, "add %s: %d of %lld elements differ", lt_dtype_name(dt), bad, (long long)n);
    lt_release(a), lt_release(b), lt_release(got);
  }
  int32_t big[2] = {2147483647, 1}, sum[1];
  CHECK_OK(lt_cuda_add_on_host(sum, big, big + 1, LT_I32, 1));
  CHECK(sum[0] == -2147483647 - 1, "i32 add does not wrap: %d", sum[0]);
  CHECK_ERR(lt_cuda_add_on_host(sum, big, big, LT_U8, 1), "not supported on cuda");
  printf("element rules: %d dtype pairs converted as host/copy.c does; add for %d dtypes\n", pairs,
         (int)(sizeof add_dtypes / sizeof *add_dtypes));
}

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
  int n = lt_cuda_device_count();
  CHECK(n >= 0, "negative device count %d", n);
  test_rules_on_host();
  if (n == 0)
    test_no_gpu();
  else
    test_gpu();
  return check_summary();
}
