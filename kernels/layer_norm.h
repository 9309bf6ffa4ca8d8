/* layer_norm.h — the plans of LayerNorm and RMSNorm, which the CPU rows
 * (host/ops/layer_norm_cpu.c) and the kernels (kernels/layer_norm.cu) both take, and the kernels'
 * launchers. The host (ops/layer_norm.c, ops/rms_norm.c) checks and allocates; the launchers queue on the device's
 * compute stream and return 0 or -1 with the error set.
 *
 * Both plans describe contiguous (N, C) rows already checked and allocated on one device.
 * RMSNorm is LayerNorm with center = 0 (mean taken as 0) and no bias. The compute type
 * ("A") is f64 for f64 x, else f32: w and b are C values of it (never NULL: ones and zeros
 * stand in for a missing weight or bias). Statistics are f32 or f64 (mean_dtype, rstd_dtype). */
#ifndef LUTRA_KERNELS_LAYER_NORM_H
#define LUTRA_KERNELS_LAYER_NORM_H
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif

typedef struct lt_layer_norm_forward_plan {
  int device, dtype; /* x's */
  int64_t N, C;
  double eps;
  int center;
  const void *x;        /* (N, C) */
  const void *residual; /* (N, C) or NULL: with it, res = x + residual is normalised */
  void *res;            /* (N, C) x + residual rounded to dtype (NULL without residual) */
  void *y;              /* (N, C) */
  const void *w, *b;    /* (C) compute type */
  void *mean, *rstd;    /* (N) or NULL */
  int mean_dtype, rstd_dtype;
} lt_layer_norm_forward_plan;

typedef struct lt_layer_norm_backward_plan {
  int device, dtype;
  int64_t N, C;
  int center;
  const void *dy, *x;      /* (N, C) */
  const void *dres;        /* (N, C) added to dx, or NULL */
  const void *w;           /* (C) compute type */
  const void *mean, *rstd; /* (N); mean unused without center */
  int mean_dtype, rstd_dtype;
  void *dx;      /* (N, C) or NULL */
  void *dw, *db; /* (C) or NULL, overwritten */
  int dw_dtype, db_dtype;
} lt_layer_norm_backward_plan;

/* res = x + residual (when residual), y = norm(res or x), mean/rstd per row: one block a row. */
int lt_cuda_layer_norm_forward(const char *op, const lt_layer_norm_forward_plan *p);
/* dx (+ dres) one block a row chunk; dw/db as per-chunk partial sums (each thread owns its
 * columns), then a second kernel sums the chunks in a fixed order: deterministic, no atomics. */
int lt_cuda_layer_norm_backward(const char *op, const lt_layer_norm_backward_plan *p);

#ifdef __cplusplus
}
#endif
#endif
