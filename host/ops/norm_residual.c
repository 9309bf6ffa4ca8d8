/* norm_residual.c — the residual add of a pre-norm transformer block fused with the
 * norm that follows it (lutra.h, "fused transformer kernels"):
 *   forward:  res_out = x + residual (the new residual stream), out = norm(res_out)
 *   backward: dx = norm_backward(dout) + dres, dres the gradient that reaches res_out from
 *             its other use (the next residual add), so that one pass over the rows
 *             replaces a norm backward and an add.
 * On the CPU both give the bits of the unfused ops for f32 and f64 (the forward's add rounds
 * once, the backward adds dres to the plain dx); 16-bit dx rounds once instead of twice.
 * The checks and rows are the plain norms' (ops/norm.c, ops/norm_cpu.c, kernels/norm.cu). */
#include "ops/norm.h"

int lt_add_layer_norm_forward(lt_tensor *res_out, lt_tensor *out, lt_tensor *mean, lt_tensor *rstd, const lt_tensor *x,
                             const lt_tensor *residual, const lt_tensor *weight, const lt_tensor *bias, double eps) {
  if (!residual) return lt_errorf("add_layer_norm: residual is NULL");
  return lt_norm_forward_op("add_layer_norm", res_out, out, mean, rstd, x, residual, weight, bias, eps, 1);
}

int lt_add_rms_norm_forward(lt_tensor *res_out, lt_tensor *out, lt_tensor *rstd, const lt_tensor *x,
                           const lt_tensor *residual, const lt_tensor *weight, double eps) {
  if (!residual) return lt_errorf("add_rms_norm: residual is NULL");
  return lt_norm_forward_op("add_rms_norm", res_out, out, NULL, rstd, x, residual, weight, NULL, eps, 0);
}

int lt_layer_norm_backward_add(lt_tensor *dx, lt_tensor *dweight, lt_tensor *dbias, const lt_tensor *dout,
                              const lt_tensor *dres, const lt_tensor *x, const lt_tensor *weight, const lt_tensor *mean,
                              const lt_tensor *rstd) {
  return lt_norm_backward_op("layer_norm_backward_add", dx, dweight, dbias, dout, dres, x, weight, mean, rstd, 1);
}

int lt_rms_norm_backward_add(lt_tensor *dx, lt_tensor *dweight, const lt_tensor *dout, const lt_tensor *dres,
                            const lt_tensor *x, const lt_tensor *weight, const lt_tensor *rstd) {
  return lt_norm_backward_op("rms_norm_backward_add", dx, dweight, NULL, dout, dres, x, weight, NULL, rstd, 0);
}
