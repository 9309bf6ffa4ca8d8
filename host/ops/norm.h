/* norm.h — what the norm ops share between their checks (ops/norm.c), the CPU rows
 * (ops/norm_cpu.c) and the CUDA kernels (kernels/norm.cu, through kernels/norm.h).
 *
 * Both plans describe contiguous (N, C) rows already checked and allocated on one device.
 * RMSNorm is LayerNorm with center = 0 (mean taken as 0) and no bias. The compute type
 * ("A") is f64 for f64 x, else f32: w and b are C values of it (never NULL: ones and zeros
 * stand in for a missing weight or bias). Statistics are f32 or f64 (mean_dtype, rstd_dtype). */
#ifndef LUTRA_OPS_NORM_H
#define LUTRA_OPS_NORM_H
#include "core/internal.h"

typedef struct lt_norm_fwd {
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
} lt_norm_fwd;

typedef struct lt_norm_bwd {
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
} lt_norm_bwd;

/* The checked ops behind every entry point (ops/norm.c): residual / dres NULL give the plain norm. */
int lt_norm_forward_op(const char *op, lt_tensor *res_out, lt_tensor *out, lt_tensor *mean, lt_tensor *rstd,
                       const lt_tensor *x, const lt_tensor *residual, const lt_tensor *weight, const lt_tensor *bias,
                       double eps, int center);
int lt_norm_backward_op(const char *op, lt_tensor *dx, lt_tensor *dweight, lt_tensor *dbias, const lt_tensor *dout,
                        const lt_tensor *dres, const lt_tensor *x, const lt_tensor *weight, const lt_tensor *mean,
                        const lt_tensor *rstd, int center);

/* The CPU rows (ops/norm_cpu.c). Return 0, or -1 with the error set (out of host memory). */
int lt_norm_forward_cpu(const char *op, const lt_norm_fwd *p);
int lt_norm_backward_cpu(const char *op, const lt_norm_bwd *p);

/* Rows a chunk of the dweight/dbias partial sums on the CPU: set by the shape only. */
int64_t lt_norm_cpu_chunks(int64_t N, int64_t C);

#endif
