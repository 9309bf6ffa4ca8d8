/* layer_norm.h — what LayerNorm and RMSNorm (LayerNorm with center = 0) share between their
 * entry points (ops/layer_norm.c, ops/rms_norm.c) and the CPU rows (ops/layer_norm_cpu.c). The
 * plans both backends take are in kernels/layer_norm.h. */
#ifndef LUTRA_OPS_LAYER_NORM_H
#define LUTRA_OPS_LAYER_NORM_H
#include "core/internal.h"
#include "kernels/layer_norm.h"

/* The checked ops behind every entry point (ops/layer_norm.c): residual / dres NULL give the plain norm. */
int lt_layer_norm_forward_op(const char *op, lt_tensor *res_out, lt_tensor *out, lt_tensor *mean, lt_tensor *rstd,
                             const lt_tensor *x, const lt_tensor *residual, const lt_tensor *weight,
                             const lt_tensor *bias, double eps, int center);
int lt_layer_norm_backward_op(const char *op, lt_tensor *dx, lt_tensor *dweight, lt_tensor *dbias,
                              const lt_tensor *dout, const lt_tensor *dres, const lt_tensor *x, const lt_tensor *weight,
                              const lt_tensor *mean, const lt_tensor *rstd, int center);

/* The CPU rows (ops/layer_norm_cpu.c). Return 0, or -1 with the error set (out of host memory). */
int lt_layer_norm_forward_cpu(const char *op, const lt_layer_norm_forward_plan *p);
int lt_layer_norm_backward_cpu(const char *op, const lt_layer_norm_backward_plan *p);

/* Rows a chunk of the dweight/dbias partial sums on the CPU: set by the shape only. */
int64_t lt_layer_norm_cpu_chunks(int64_t N, int64_t C);

#endif
