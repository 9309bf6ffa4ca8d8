/* test_reduce_cuda.c — reductions, argmax/argmin and softmax given CUDA tensors.
 *
 * Everywhere: bad input gets the CPU's message before any device work (dtype, dims, shapes),
 * and a tensor on an absent device gets a clear error ("not available" in a CUDA build,
 * "not implemented on cuda yet" in a CPU-only one) that leaves out undefined.
 * With a GPU: test_reduce_cuda_gpu.c. */
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

int main(void) {
  test_refused();
  return check_summary();
}
