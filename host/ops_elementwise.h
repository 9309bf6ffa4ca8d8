/* ops_elementwise.h — the loop driver and dtype helpers shared by ops_unary.c and
 * ops_binary.c (private to the elementwise ops). */
#ifndef LUTRA_OPS_ELEMENTWISE_H
#define LUTRA_OPS_ELEMENTWISE_H
#include "internal.h"

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

/* Error "<op>: not implemented on cuda yet" when t is on a CUDA device. */
int ew_check_cpu(const char *op, const lt_tensor *t);

/* Reads n elements of src (f32, bf16 or f16, element stride `stride`) into dst as f32.
 * A broadcast source (stride 0) is read once into dst[0]. Returns the stride to use
 * on dst: 0 for a broadcast source, else 1. */
int64_t ew_load_f32(float *dst, const char *src, int dtype, int64_t stride, int64_t n);
/* Writes n f32 values to dst (f32, bf16 or f16, element stride `stride`), rounding to
 * nearest even. */
void ew_store_f32(char *dst, int dtype, int64_t stride, const float *src, int64_t n);

static inline bool ew_is_int(int dtype) { return dtype == LT_I32 || dtype == LT_I64 || dtype == LT_U8; }
static inline bool ew_is_half(int dtype) { return dtype == LT_BF16 || dtype == LT_F16; }

#endif
