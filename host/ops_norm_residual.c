/* ops_norm_residual.c — the residual add of a pre-norm transformer block fused with the
 * norm that follows it (lutra.h, "fused transformer kernels"):
 *   forward:  res_out = x + residual (the new residual stream), out = norm(res_out)
 *   backward: dx = norm_backward(dout) + dres, dres the gradient that reaches res_out from
 *             its other use (the next residual add), so that one pass over the rows
 *             replaces a norm backward and an add.
 * On the CPU both give the bits of the unfused ops for f32 and f64 (the forward's add rounds
 * once, the backward adds dres to the plain dx); 16-bit dx rounds once instead of twice.
 * The checks and rows are the plain norms' (ops_norm.c, ops_norm_cpu.c, kernels/norm.cu). */
#include "ops_norm.h"

int lt_add_layernorm_forward(lt_tensor *res_out, lt_tensor *out, lt_tensor *mean, lt_tensor *rstd, const lt_tensor *x,
                             const lt_tensor *residual, const lt_tensor *weight, const lt_tensor *bias, double eps) {
  if (!residual) return lt_errorf("add_layernorm: residual is NULL");
  return lt_norm_forward_op("add_layernorm", res_out, out, mean, rstd, x, residual, weight, bias, eps, 1);
}

int lt_add_rmsnorm_forward(lt_tensor *res_out, lt_tensor *out, lt_tensor *rstd, const lt_tensor *x,
                           const lt_tensor *residual, const lt_tensor *weight, double eps) {
  if (!residual) return lt_errorf("add_rmsnorm: residual is NULL");
  return lt_norm_forward_op("add_rmsnorm", res_out, out, NULL, rstd, x, residual, weight, NULL, eps, 0);
}

int lt_layernorm_backward_add(lt_tensor *dx, lt_tensor *dweight, lt_tensor *dbias, const lt_tensor *dout,
                              const lt_tensor *dres, const lt_tensor *x, const lt_tensor *weight, const lt_tensor *mean,
                              const lt_tensor *rstd) {
  return lt_norm_backward_op("layernorm_backward_add", dx, dweight, dbias, dout, dres, x, weight, mean, rstd, 1);
}

int lt_rmsnorm_backward_add(lt_tensor *dx, lt_tensor *dweight, const lt_tensor *dout, const lt_tensor *dres,
                            const lt_tensor *x, const lt_tensor *weight, const lt_tensor *rstd) {
  return lt_norm_backward_op("rmsnorm_backward_add", dx, dweight, NULL, dout, dres, x, weight, NULL, rstd, 0);
}
