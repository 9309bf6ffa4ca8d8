/* rms_norm.c — RMSNorm's entry points, plain and fused with the residual add. RMSNorm is
 * LayerNorm without centering (the mean taken as 0) and without bias: its checks, plan and
 * kernels are layer_norm's with center = 0 (ops/layer_norm.c, ops/layer_norm_cpu.c,
 * kernels/layer_norm.cu), as Apex runs both from one layer_norm kernel file. */
#include "ops/layer_norm.h"

int lt_rms_norm_forward(lt_tensor *out, lt_tensor *rstd, const lt_tensor *x, const lt_tensor *weight, double eps) {
  return lt_layer_norm_forward_op("rms_norm", NULL, out, NULL, rstd, x, NULL, weight, NULL, eps, 0);
}

int lt_rms_norm_backward(lt_tensor *dx, lt_tensor *dweight, const lt_tensor *dout, const lt_tensor *x,
                         const lt_tensor *weight, const lt_tensor *rstd) {
  return lt_layer_norm_backward_op("rms_norm_backward", dx, dweight, NULL, dout, NULL, x, weight, NULL, rstd, 0);
}

/* res_out = x + residual, out = rms_norm(res_out) (the fused forward of ops/layer_norm.c's head) */
int lt_add_rms_norm_forward(lt_tensor *res_out, lt_tensor *out, lt_tensor *rstd, const lt_tensor *x,
                            const lt_tensor *residual, const lt_tensor *weight, double eps) {
  if (!residual) return lt_errorf("add_rms_norm: residual is NULL");
  return lt_layer_norm_forward_op("add_rms_norm", res_out, out, NULL, rstd, x, residual, weight, NULL, eps, 0);
}

/* dx = rms_norm_backward(dout) + dres (the fused backward of ops/layer_norm.c's head) */
int lt_rms_norm_backward_add(lt_tensor *dx, lt_tensor *dweight, const lt_tensor *dout, const lt_tensor *dres,
                             const lt_tensor *x, const lt_tensor *weight, const lt_tensor *rstd) {
  return lt_layer_norm_backward_op("rms_norm_backward_add", dx, dweight, NULL, dout, dres, x, weight, NULL, rstd, 0);
}
