/* cross_entropy.h — the cross-entropy kernels (kernels/cross_entropy.cu) as host/ops/cross_entropy.c
 * calls them, and the device check of class / token ids that ops/embedding.c uses too.
 *
 * The host checks every argument (with the CPU's messages) before calling these; they take
 * device pointers of contiguous buffers unless strides are given, launch on the device's
 * compute stream and return 0, or -1 with the error set. */
#ifndef LUTRA_KERNELS_CROSS_ENTROPY_H
#define LUTRA_KERNELS_CROSS_ENTROPY_H
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif

/* ids[k * stride], k < n, i32 or i64: *bad_pos gets the first k whose id is outside [0, V)
 * (and is not ignore_index when has_ignore), with that id in *bad_id; -1 when all are fine.
 * One flag read back (a synchronisation). */
int lt_cuda_check_indices(const char *op, int device, const void *ids, int dtype, int64_t stride, int64_t n, int64_t V,
                          int has_ignore, int64_t ignore_index, int64_t *bad_pos, int64_t *bad_id);

/* logits (N, V) contiguous, dtype f32/f64/bf16/f16; targets[i * tstride] i32/i64, checked.
 * losses (N) and lse (N, or NULL) are f32, or f64 when their dtype says so (f64 logits). */
int lt_cuda_cross_entropy_forward(int device, int dtype, const void *logits, int64_t N, int64_t V, const void *targets,
                                  int tdtype, int64_t tstride, int64_t ignore_index, void *losses, int ldtype,
                                  void *lse, int sdtype);
/* dlogits (N, V) contiguous, logits' dtype (may be logits itself); dlosses and lse (N)
 * contiguous, f64 for f64 logits, else f32. */
int lt_cuda_cross_entropy_backward(int device, int dtype, void *dlogits, const void *logits, int64_t N, int64_t V,
                                   const void *targets, int tdtype, int64_t tstride, int64_t ignore_index,
                                   const void *dlosses, const void *lse);

#ifdef __cplusplus
}
#endif
#endif
