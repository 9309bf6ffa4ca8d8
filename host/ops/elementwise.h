/* elementwise.h — the loop driver and dtype helpers shared by ops/unary.c and
 * ops/binary.c (private to the elementwise ops). */
#ifndef LUTRA_OPS_ELEMENTWISE_H
#define LUTRA_OPS_ELEMENTWISE_H
#include "core/internal.h"
#include "ops/vecmath.h"

/* One run of n elements: operand k starts at ptr[k] and steps stride[k] elements
 * (0 for a broadcast operand). Operand 0 is the output. */
typedef void (*ew_kernel)(const void *ctx, char *const *ptr, const int64_t *stride, int64_t n);

enum { EW_MAX_OPERANDS = 4, EW_BLOCK = 256 };

/* Calls kernel over every element of shape, in runs along the innermost (coalesced)
 * dim. Operand k has base address base[k], element size esize[k] and element strides
 * strides[k] (already broadcast to shape). Runs are split across OpenMP threads when
 * numel >= grain. */
void ew_execute(int ndim, const int64_t *shape, int noperands, char *const *base, const int *esize,
                const int64_t (*strides)[LT_MAX_DIMS], ew_kernel kernel, const void *ctx, int64_t grain);

/* Prepares out for a result of (ndim, shape, dtype, device) as lt_prepare_out, and
 * refuses an out whose elements overlap (an expanded view). */
int ew_prepare_out(const char *op, lt_tensor *out, int ndim, const int64_t *shape, int dtype, int device);

/* Refuses an input that shares memory with out without being out itself (a row of out,
 * a shifted view): the result would depend on the order of the loops. */
int ew_check_overlap(const char *op, const lt_tensor *out, const lt_tensor *in, const char *what);

/* 0 when t's device can run the op: the CPU, or (CUDA builds) a CUDA device that exists.
 * Else "<op>: device cuda:K is not available (why)", or in a CPU-only build
 * "<op>: not implemented on cuda yet (lutra was built without CUDA)". */
int ew_check_cuda_device(const char *op, const lt_tensor *t);
/* (inline: every elementwise op calls it per operand, and CPU tensors need only the compare) */
static inline int ew_check_device(const char *op, const lt_tensor *t) {
  return t->device == LT_DEVICE_CPU ? 0 : ew_check_cuda_device(op, t);
}

/* Reads n elements of src (f32, bf16 or f16, element stride `stride`) into dst as f32.
 * A broadcast source (stride 0) is read once into dst[0]. Returns the stride to use
 * on dst: 0 for a broadcast source, else 1. */
int64_t ew_load_f32(float *dst, const char *src, int dtype, int64_t stride, int64_t n);
/* Writes n f32 values to dst (f32, bf16 or f16, element stride `stride`), rounding to
 * nearest even. */
void ew_store_f32(char *dst, int dtype, int64_t stride, const float *src, int64_t n);

/* ---- f32 exp and tanh in plain arithmetic, so that loops calling them vectorise (libm's
 * expf/tanhf are scalar calls): about 1 ulp over the whole range, with overflow to inf, gradual
 * underflow to 0, and NaN kept (exp: ops/vecmath.h's lt_exp_f32). */

static inline float ew_expf(float x) { return lt_exp_f32(x); }

static inline float ew_tanhf(float x) {
  float ax = x < 0 ? -x : x;
  float big = 1.0f - 2.0f / (ew_expf(2.0f * ax) + 1.0f); /* no cancellation for |x| >= 0.625 */
  big = x < 0 ? -big : big;
  float z = x * x; /* odd polynomial for small |x| */
  float small = ((((-5.70498872745e-3f * z + 2.06390887954e-2f) * z - 5.37397155531e-2f) * z + 1.33314422036e-1f) * z -
                 3.33332819422e-1f) *
                    z * x +
                x;
  return ax < 0.625f ? small : big;
}

static inline bool ew_is_int(int dtype) { return dtype == LT_I32 || dtype == LT_I64 || dtype == LT_U8; }
static inline bool ew_is_half(int dtype) { return dtype == LT_BF16 || dtype == LT_F16; }

#endif
