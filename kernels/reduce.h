/* reduce.h — what host/ops/reduce.c, ops/argmax.c and ops/softmax.c hand to
 * kernels/reduce.cu and kernels/softmax.cu for CUDA tensors. Plain C structs, C linkage.
 *
 * Every argument has been checked on the host (shapes, dtypes, dims, out prepared on the
 * input's device) before these are called; they only launch kernels on the device's
 * compute stream and report launch errors. */
#ifndef LUTRA_CUDA_REDUCE_H
#define LUTRA_CUDA_REDUCE_H
#include "lutra.h"
#include <stdint.h>

/* What lt_cuda_reduce finishes: an lt_reduce_op (LT_SUM .. LT_NORM), or var. */
enum { LT_CUDA_REDUCE_VAR = LT_NUM_REDUCE_OPS };

/* A reduction's geometry as ops/reduce_geom.h plans it: output o (kept-linear order) reads
 * input element offset_of(o, kept dims, kstride) + offset_of(r, reduced dims, rstride) for
 * r in [0, n_red), and is written at offset_of(o, kept dims, kout) of out. inner: the
 * smallest input stride belongs to a reduced dim (each output reduces runs along memory). */
typedef struct lt_cuda_red_geom {
  int64_t n_out, n_red;
  int32_t nkept, nred, inner;
  int64_t kshape[LT_MAX_DIMS], kstride[LT_MAX_DIMS], kout[LT_MAX_DIMS];
  int64_t rshape[LT_MAX_DIMS], rstride[LT_MAX_DIMS];
} lt_cuda_red_geom;

/* out (dtype, on device) = the reduction `what` of in (dtype) under g. Floats accumulate in
 * double and integers in int64 (wrapping), as the CPU does; var divides the sum of squared
 * deviations from the mean by var_denom (the host's n_red - correction, or 0). */
int lt_cuda_reduce(const char *op, int device, const lt_cuda_red_geom *g, const void *in, void *out, int dtype,
                   int what, double var_denom);

/* out (int64 on device, written through g's kout) = the index along the one reduced dim
 * (g->nred == 1) of the first max (is_max) or min, or of the first NaN. */
int lt_cuda_argreduce(const char *op, int device, const lt_cuda_red_geom *g, const void *in, int dtype, int64_t *out,
                      int is_max);

/* Softmax rows: row r (of `rows`, over the rest dims) has n elements along dim. Operand k
 * (0 out, 1 x = input or grad_out, 2 y = the forward output, backward only) starts at
 * base[k] + offset_of(r, rest dims, rest_stride[k]) and steps dim_stride[k] (elements). */
enum { LT_CUDA_SOFTMAX = 0, LT_CUDA_LOG_SOFTMAX, LT_CUDA_SOFTMAX_BACKWARD, LT_CUDA_LOG_SOFTMAX_BACKWARD };
typedef struct lt_cuda_softmax_args {
  int32_t kind, dtype, nops, nrest;
  int64_t n, rows;
  int64_t rest_shape[LT_MAX_DIMS], rest_stride[3][LT_MAX_DIMS], dim_stride[3];
  void *base[3];
} lt_cuda_softmax_args;
int lt_cuda_softmax(const char *op, int device, const lt_cuda_softmax_args *a);

#endif
