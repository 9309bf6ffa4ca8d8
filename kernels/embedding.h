/* embedding.h — the embedding kernels (kernels/embedding.cu) as host/ops/embedding.c calls them.
 *
 * The host checks every argument (with the CPU's messages) before calling these; they take
 * device pointers of contiguous buffers unless strides are given, launch on the device's
 * compute stream and return 0, or -1 with the error set. */
#ifndef LUTRA_KERNELS_EMBEDDING_H
#define LUTRA_KERNELS_EMBEDDING_H
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif

/* out (n, C) contiguous = rows ids[k] of weight (rows row_stride elements apart, unit column
 * stride), elements of esize bytes; ids (n) contiguous i32/i64, checked in [0, V). */
int lt_cuda_embedding_forward(int device, void *out, const void *weight, int64_t row_stride, int esize, const void *ids,
                              int idtype, int64_t n, int64_t C);
/* dweight (V, C) contiguous, dtype f32/f64/bf16/f16, = per id the sum of its dout rows
 * (dout (n, C) contiguous) in increasing position order; rows of absent ids are zero. */
int lt_cuda_embedding_backward(int device, int dtype, void *dweight, int64_t V, int64_t C, const void *dout,
                               const void *ids, int idtype, int64_t n);

#ifdef __cplusplus
}
#endif
#endif
