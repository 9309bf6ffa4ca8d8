/* test_cuda_nogpu.c — the CUDA path, meaningful on every machine.
 *
 * Without a GPU (or in a CPU-only build): the device count is 0, the status says why,
 * and every attempt to use cuda:k fails with a clear error and crashes nothing. The
 * kernels' element rules (kernels/elementwise.cu, run on the CPU through the
 * *_on_host exports of a CUDA build) must agree bit for bit with host/core/copy.c.
 * ctest runs it with any GPU hidden (CUDA_VISIBLE_DEVICES=). With a GPU: test_cuda_copy_gpu.c. */
#include "check.h"
#include "cuda_values.h"

/* kernels/ exports (present only in a CUDA build; weak so that a CPU build links) */
__attribute__((weak)) int lt_cuda_convert_on_host(void *dst, int dst_dtype, const void *src, int src_dtype, int64_t n);
__attribute__((weak)) int lt_cuda_add_on_host(void *out, const void *a, const void *b, int dtype, int64_t n);

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
      CHECK(same_bytes(want, got), "convert %s -> %s differs from host/core/copy.c", lt_dtype_name(s), lt_dtype_name(d));
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
  printf("element rules: %d dtype pairs converted as host/core/copy.c does; add for %d dtypes\n", pairs,
         (int)(sizeof add_dtypes / sizeof *add_dtypes));
}

int main(void) {
  int n = lt_cuda_device_count();
  /* ctest hides any GPU (CUDA_VISIBLE_DEVICES=), so the no-GPU checks run on every machine */
  CHECK(n == 0, "%d devices visible: run with CUDA_VISIBLE_DEVICES= (as ctest does)", n);
  test_rules_on_host();
  if (n == 0) test_no_gpu();
  return check_summary();
}
