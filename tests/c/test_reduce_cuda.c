/* test_reduce_cuda.c — reductions, argmax/argmin and softmax given CUDA tensors.
 *
 * Everywhere: bad input gets the CPU's message before any device work (dtype, dims, shapes),
 * and a tensor on an absent device gets a clear error ("not available" in a CUDA build,
 * "not implemented on cuda yet" in a CPU-only one) that leaves out undefined.
 * With a GPU: sum/mean/max/var/argmax/softmax of contiguous tensors on cuda:0 against the CPU
 * (the full matrix of shapes, layouts and dtypes is `lutra selftest`'s). */
#include "check.h"

static lt_tensor *fake_cuda(const lt_tensor *t) {
  lt_tensor *f = lt_tensor_new();
  CHECK_OK(lt_set(f, t));
  f->device = 15; /* a view claiming cuda:15: only ever refused, never read */
  return f;
}

static void test_refused(void) {
  bool cuda_build = strstr(lt_build_info(), "cuda: built") != NULL;
  const char *absent = cuda_build ? "is not available" : "not implemented on cuda yet";
  char want[64];
  int64_t shape[2] = {3, 4}, dim1 = 1;
  lt_tensor *a = check_random(2, shape, LT_F32, -1, 1), *i = check_random(2, shape, LT_I32, 0, 5);
  lt_tensor *ca = fake_cuda(a), *ci = fake_cuda(i), *out = lt_tensor_new();
  for (int op = 0; op < LT_NUM_REDUCE_OPS; op++) {
    snprintf(want, sizeof want, "%s: ", lt_reduce_name(op));
    CHECK_ERR(lt_reduce(out, ca, op, 1, &dim1, 0), want);
    CHECK(strstr(lt_last_error(), absent) != NULL, "%s: %s", lt_reduce_name(op), lt_last_error());
  }
  CHECK_ERR(lt_var(out, ca, 0, NULL, 1, 0), "var: ");
  CHECK(strstr(lt_last_error(), absent) != NULL, "var: %s", lt_last_error());
  CHECK_ERR(lt_argmax(out, ca, 1, 0, 0), "argmax: ");
  CHECK(strstr(lt_last_error(), absent) != NULL, "argmax: %s", lt_last_error());
  CHECK_ERR(lt_argmin(out, ca, 0, 1, 1), "argmin: ");
  CHECK(strstr(lt_last_error(), absent) != NULL, "argmin: %s", lt_last_error());
  CHECK_ERR(lt_softmax(out, ca, -1), "softmax: ");
  CHECK(strstr(lt_last_error(), absent) != NULL, "softmax: %s", lt_last_error());
  CHECK_ERR(lt_log_softmax(out, ca, 0), "log_softmax: ");
  CHECK_ERR(lt_softmax_backward(out, ca, ca, 0), "softmax_backward: ");
  CHECK_ERR(lt_log_softmax_backward(out, ca, ca, 1), "log_softmax_backward: ");
  CHECK(strstr(lt_last_error(), absent) != NULL, "log_softmax_backward: %s", lt_last_error());
  CHECK(!lt_is_defined(out), "a refused op left out defined");
  /* the CPU's checks come first, with the CPU's messages */
  CHECK_ERR(lt_reduce(out, ci, LT_MEAN, 0, NULL, 0), "mean: needs a floating dtype, got i32");
  CHECK_ERR(lt_var(out, ci, 0, NULL, 1, 0), "var: needs a floating dtype, got i32");
  CHECK_ERR(lt_softmax_backward(out, ca, a, 0), "softmax_backward: tensors on different devices");
  lt_release(a), lt_release(i), lt_release(ca), lt_release(ci), lt_release(out);
}

/* t on cuda:0 (contiguous copy) */
static lt_tensor *to_gpu(const lt_tensor *t) {
  lt_tensor *g = lt_tensor_new();
  CHECK_OK(lt_empty(g, t->ndim, t->shape, t->dtype, 0));
  CHECK_OK(lt_copy(g, t));
  return g;
}
static lt_tensor *to_cpu(const lt_tensor *g) {
  lt_tensor *t = lt_tensor_new();
  CHECK_OK(lt_empty(t, g->ndim, g->shape, g->dtype, LT_DEVICE_CPU));
  CHECK_OK(lt_copy(t, g));
  return t;
}
/* got (on the GPU; released here) against want, element by element */
static void expect_close(const char *what, lt_tensor *got_gpu, const lt_tensor *want, double tol) {
  lt_tensor *got = to_cpu(got_gpu);
  int64_t n = lt_numel(want), bad = 0;
  CHECK(lt_numel(got) == n, "%s: %lld elements, want %lld", what, (long long)lt_numel(got), (long long)n);
  double *g = malloc(sizeof(double) * (size_t)(n + 1)), *w = malloc(sizeof(double) * (size_t)(n + 1));
  CHECK_OK(lt_copy_to_buffer(got, g, LT_F64, n));
  CHECK_OK(lt_copy_to_buffer(want, w, LT_F64, n));
  for (int64_t k = 0; k < n; k++) bad += !check_close(g[k], w[k], tol, tol);
  CHECK(bad == 0, "%s: %lld of %lld elements differ", what, (long long)bad, (long long)n);
  free(g), free(w);
  lt_release(got), lt_release(got_gpu);
}

static void test_gpu(void) {
  if (lt_cuda_device_count() == 0) {
    printf("no GPU (%s): device comparisons skipped\n", lt_cuda_status());
    return;
  }
  int64_t shapes[][2] = {{7, 1}, {33, 1023}, {2, 65537}, {65537, 3}};
  for (int s = 0; s < 4; s++) {
    lt_tensor *a = check_random(2, shapes[s], LT_F32, -2, 2), *ga = to_gpu(a);
    for (int64_t d = -1; d < 2; d++) {
      int nd = d < 0 ? 0 : 1;
      for (int op = 0; op < LT_NUM_REDUCE_OPS; op++) {
        if (op == LT_PROD) continue;
        lt_tensor *want = lt_tensor_new(), *got = lt_tensor_new();
        CHECK_OK(lt_reduce(want, a, op, nd, &d, 1));
        CHECK_OK(lt_reduce(got, ga, op, nd, &d, 1));
        expect_close(lt_reduce_name(op), got, want, 1e-6);
        lt_release(want);
      }
      lt_tensor *want = lt_tensor_new(), *got = lt_tensor_new();
      CHECK_OK(lt_var(want, a, nd, &d, 1, 0));
      CHECK_OK(lt_var(got, ga, nd, &d, 1, 0));
      expect_close("var", got, want, 1e-6);
      lt_release(want);
      want = lt_tensor_new(), got = lt_tensor_new();
      CHECK_OK(lt_argmax(want, a, (int)(d < 0 ? 0 : d), 0, d < 0));
      CHECK_OK(lt_argmax(got, ga, (int)(d < 0 ? 0 : d), 0, d < 0));
      expect_close("argmax", got, want, 0);
      lt_release(want);
    }
    for (int d = 0; d < 2; d++) {
      lt_tensor *want = lt_tensor_new(), *got = lt_tensor_new();
      CHECK_OK(lt_softmax(want, a, d));
      CHECK_OK(lt_softmax(got, ga, d));
      expect_close("softmax", got, want, 1e-6);
      lt_release(want);
    }
    CHECK_OK(lt_cuda_synchronize(0));
    lt_release(a), lt_release(ga);
  }
}

int main(void) {
  test_refused();
  test_gpu();
  return check_summary();
}
