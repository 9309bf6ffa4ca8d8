/* norm.h — the norm kernels (kernels/norm.cu) as host/ops/norm.c calls them. The plans
 * (host/ops/norm.h) hold device pointers to contiguous rows, checked and allocated by the host
 * side; these launch on the device's compute stream and return 0 or -1 with the error set. */
#ifndef LUTRA_CUDA_NORM_H
#define LUTRA_CUDA_NORM_H
#include "ops/norm.h"
#ifdef __cplusplus
extern "C" {
#endif

/* lt_cuda_use_device (kernels/common.cuh, C++ linkage) for the host C: checks the device exists and makes
 * it current, before anything touches a CUDA tensor's memory. */
int lt_cuda_norm_use_device(const char *op, int device);

/* res = x + residual (when residual), y = norm(res or x), mean/rstd per row: one block a row. */
int lt_cuda_norm_forward(const char *op, const lt_norm_fwd *p);
/* dx (+ dres) one block a row chunk; dw/db as per-chunk partial sums (each thread owns its
 * columns), then a second kernel sums the chunks in a fixed order: deterministic, no atomics. */
int lt_cuda_norm_backward(const char *op, const lt_norm_bwd *p);

#ifdef __cplusplus
}
#endif
#endif
