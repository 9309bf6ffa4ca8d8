/* elementwise.h — the elementwise ops between host C and kernels/ (unary.cu, binary.cu,
 * kernels/copy.cu, elementwise.cu): the geometry every kernel walks, and the launchers.
 *
 * The geometry is plain C, compiled for both sides (LT_HOST_DEVICE), so that the offset
 * arithmetic the kernels run is the one tests/c/test_cuda_elementwise_geom.c checks on the CPU.
 * The launchers run on `device`; given LT_DEVICE_CPU they run the very same loops on the host,
 * as a few emulated threads of a grid-stride loop, over host memory (a test hook: the kernels'
 * element rules and index math checked without a GPU). */
#ifndef LUTRA_CUDA_ELEMENTWISE_H
#define LUTRA_CUDA_ELEMENTWISE_H
#include "core/device.h"
#include "core/ew_geom.h"


/* Each returns 0, or -1 with the error set (naming op). Pointers are element [0,...,0] of each
 * operand; dtypes and shapes were checked by the caller. */

/* out = op(a); dtype is both's (kernels/unary.cu). */
int lt_cuda_unary(int device, int op, int dtype, const lt_ew_geom *g, void *out, const void *a);
/* grad_in = grad_out * op'(x), operands in that order. */
int lt_cuda_unary_backward(int device, int op, int dtype, const lt_ew_geom *g, void *grad_in, const void *grad_out,
                           const void *x);
/* out = min(max(a, lo), hi); for integers lo and hi are already rounded and clipped to the dtype. */
int lt_cuda_clamp(int device, int dtype, const lt_ew_geom *g, void *out, const void *a, double lo, double hi);

/* out = a op b, a and b of dtype, out of dtype or bool (comparisons) (kernels/binary.cu).
 * scalar_side 1: a is the scalar *scalar (g has no operand for it: its strides are 0);
 * 2: b is; 0: none. The scalar is held in scalar_dtype (f32 for f32/bf16/f16, else dtype). */
int lt_cuda_binary(int device, int op, int dtype, const lt_ew_geom *g, void *out, const void *a, const void *b,
                   int scalar_side, const void *scalar);
/* out = cond ? a : b; cond bool/u8, elements of `size` bytes moved unchanged. */
int lt_cuda_where(int device, int size, const lt_ew_geom *g, void *out, const void *cond, const void *a, const void *b);

/* lt_cuda_copy, lt_cuda_fill, lt_cuda_sequence: the core's device kernels, declared in core/device.h. */

#endif
