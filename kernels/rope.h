/* rope.h — the rope kernel (kernels/rope.cu) as host/ops/rope.c calls it.
 *
 * The host checks every argument (with the CPU's messages) before calling these; they take
 * device pointers of contiguous buffers unless strides are given, launch on the device's
 * compute stream and return 0, or -1 with the error set. */
#ifndef LUTRA_KERNELS_ROPE_H
#define LUTRA_KERNELS_ROPE_H
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif

typedef struct lt_rope_plan {
  int device, dtype;
  int64_t B, T, H, D;
  const void *x;
  int64_t xs[4]; /* element strides of x (B, T, H, D) */
  void *out;
  int64_t os[4];
  const void *pos; /* NULL: position t; else i32/i64 (T) or (B, T) */
  int pdtype, per_batch;
  int64_t ps[2];      /* element strides of pos: (T) uses ps[0]; (B, T) uses both */
  const double *freq; /* host array of D / 2 frequencies, as the CPU computes them */
  double sign;        /* 1, or -1 for the inverse rotation */
  double scale;       /* multiplies cos and sin (1: a plain rotation) */
} lt_rope_plan;
int lt_cuda_rope(const lt_rope_plan *a);

#ifdef __cplusplus
}
#endif
#endif
