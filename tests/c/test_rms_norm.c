/* test_rms_norm.c — RMSNorm (LayerNorm without centering: one plan, one kernel), plain and fused
 * with the residual add (add_rms_norm, rms_norm_backward_add): the cases it shares with LayerNorm
 * (layer_norm_cases.h, center = 0), bad inputs, tensors that claim a CUDA device. */
#include "layer_norm_cases.h"

static void test_bad_inputs(void) {
  int64_t shape[2] = {4, 8}, c8[1] = {8};
  lt_tensor *x = check_random(2, shape, LT_F32, -1, 1), *w64 = check_random(1, c8, LT_F64, 0, 1);
  lt_tensor *xi = check_random(2, shape, LT_I32, -3, 3), *out = lt_tensor_new(), *rstd = lt_tensor_new();
  lt_tensor *dx = lt_tensor_new(), *undef = lt_tensor_new();
  CHECK_ERR(lt_rms_norm_forward(out, rstd, x, w64, EPS), "weight is f64, expected x's dtype (f32) or f32");
  CHECK_ERR(lt_rms_norm_forward(out, rstd, xi, NULL, EPS), "expected a floating dtype");
  CHECK_OK(lt_rms_norm_forward(out, rstd, x, NULL, EPS));
  CHECK_ERR(lt_rms_norm_backward(dx, undef, x, x, NULL, rstd), "dweight requested but weight is NULL");
  /* a tensor claiming cuda:15: refused before any kernel (no machine here has 16 GPUs) */
  x->device = 15;
  CHECK_ERR(lt_rms_norm_forward(out, rstd, x, NULL, EPS),
            strstr(lt_build_info(), "cuda: built") ? "is not available" : "built without CUDA");
  x->device = LT_DEVICE_CPU;
  lt_release(x), lt_release(w64), lt_release(xi), lt_release(out), lt_release(rstd), lt_release(dx);
  lt_release(undef);
}

/* add_rms_norm and rms_norm_backward_add's own refusals, and a CUDA device this machine lacks */
static void test_add_errors(void) {
  int64_t shape[2] = {4, 8}, other[2] = {4, 7};
  lt_tensor *x = check_random(2, shape, LT_F32, -1, 1), *r7 = check_random(2, other, LT_F32, -1, 1);
  lt_tensor *r64 = check_random(2, shape, LT_F64, -1, 1), *out = lt_tensor_new(), *res = lt_tensor_new();
  lt_tensor *rstd = lt_tensor_new(), *dx = lt_tensor_new();
  CHECK_ERR(lt_add_rms_norm_forward(res, out, rstd, x, r64, NULL, EPS), "add_rms_norm: residual is [4,8] f64 cpu");
  CHECK_ERR(lt_add_rms_norm_forward(NULL, out, rstd, x, x, NULL, EPS), "add_rms_norm: res_out is NULL");
  CHECK_ERR(lt_add_rms_norm_forward(out, out, rstd, x, x, NULL, EPS), "res_out and out must be different");
  CHECK_ERR(lt_add_rms_norm_forward(res, out, rstd, NULL, x, NULL, EPS), "add_rms_norm: x is NULL");
  CHECK_OK(lt_add_rms_norm_forward(res, out, rstd, x, x, NULL, EPS));
  CHECK_ERR(lt_rms_norm_backward_add(dx, NULL, x, r64, res, NULL, rstd), "rms_norm_backward_add: dres is [4,8] f64");
  CHECK_ERR(lt_rms_norm_backward_add(dx, NULL, r7, NULL, res, NULL, rstd), "rms_norm_backward_add: dout is [4,7]");
  /* a residual claiming to live on cuda:15 (refused before any kernel) */
  r64->dtype = LT_F32, r64->device = 15;
  CHECK_ERR(lt_add_rms_norm_forward(res, out, rstd, x, r64, NULL, EPS),
            "add_rms_norm: residual is [4,8] f32 cuda:15, expected x's device (cpu)");
  x->device = 15; /* x on cuda:15: a CPU-only build says so; a CUDA build without that GPU too */
  bool built_with_cuda = strstr(lt_build_info(), "cuda: built with CUDA") != NULL;
  CHECK_ERR(lt_add_rms_norm_forward(res, out, rstd, x, r64, NULL, EPS),
            built_with_cuda ? "add_rms_norm: device cuda:15 is not available"
                            : "add_rms_norm: lutra was built without CUDA");
  CHECK_ERR(lt_rms_norm_backward(dx, NULL, x, x, NULL, rstd), built_with_cuda
                                                                  ? "rms_norm_backward: device cuda:15 is not available"
                                                                  : "rms_norm_backward: lutra was built without CUDA");
  x->device = LT_DEVICE_CPU, r64->device = LT_DEVICE_CPU, r64->dtype = LT_F64;
  lt_release(x), lt_release(r7), lt_release(r64), lt_release(out), lt_release(res), lt_release(rstd), lt_release(dx);
}

int main(void) {
  run_norm_cases(0);
  test_bad_inputs();
  test_add_errors();
  return check_summary();
}
