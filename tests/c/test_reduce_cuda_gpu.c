/* test_reduce_cuda_gpu.c — with a GPU (label gpu; skipped without one): sum/mean/max/var/
 * argmax/softmax of contiguous tensors on cuda:0 against the CPU (the full matrix of shapes,
 * layouts and dtypes is `lutra selftest`'s). The refusals without a device: test_reduce_cuda.c. */
#include "check.h"

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
  int skip = check_need_gpu();
  if (skip) return skip;
  test_gpu();
  return check_summary();
}
