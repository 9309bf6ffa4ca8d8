/* multi_tensor.h — what the optimizer ops (adamw, lion, multi_tensor) share between their C files
 * (host/ops/adamw.c, lion.c, multi_tensor.c) and their kernels (kernels/adamw.cu, lion.cu,
 * multi_tensor.cu): one tensor's entry of a multi-tensor call, the chunking of the work, and
 * the multi-tensor ops' CUDA launchers (sum of squares, scale, clipping's coefficient). */
#ifndef LUTRA_KERNELS_MULTI_TENSOR_H
#define LUTRA_KERNELS_MULTI_TENSOR_H
#include "lutra.h"
#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#ifdef __CUDACC__
#define LT_OPTIM_HD __host__ __device__
#else
#define LT_OPTIM_HD
#endif

/* One tensor of a multi-tensor op, contiguous: n elements at param (pdtype), grad (gdtype),
 * m and v (f32, f64 for an f64 param), master (f32, or NULL). The reductions and the scale use
 * param, n and pdtype only. first_chunk: the tensor's first chunk in the call's numbering. */
typedef struct lt_optim_entry {
  void *param;
  const void *grad;
  void *m, *v;
  float *master;
  int64_t n, first_chunk;
  int32_t pdtype, gdtype;
} lt_optim_entry;

/* Elements a CPU task (and a CUDA block) takes at once: a multiple of the 16-bit block. */
enum { LT_OPTIM_CHUNK = 16384 };

/* The index of the entry holding chunk c: the last i with entries[i].first_chunk <= c. */
LT_OPTIM_HD static inline int64_t lt_optim_entry_of(const lt_optim_entry *entries, int64_t n, int64_t c) {
  int64_t lo = 0, hi = n; /* answer in [lo, hi) */
  while (hi - lo > 1) {
    int64_t mid = lo + (hi - lo) / 2;
    if (entries[mid].first_chunk <= c)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

/* Clipping's coefficient (lt_clip_coef) from the sum of squares, the same on both sides. */
LT_OPTIM_HD static inline double lt_clip_coef_of(double sumsq, double max_norm) {
  double norm = sqrt(sumsq), coef = max_norm / (norm + 1e-6);
  return isfinite(norm) && coef < 1 ? coef : 1.0;
}

/* kernels/multi_tensor.cu. Every launch is on the device's compute stream; none waits for the
 * host. entries: n host-side entries (copied to the device through a pinned buffer), chunks the
 * total of their chunks of LT_OPTIM_CHUNK elements. */
/* out (out_dtype f32/f64, one element) = the sum of squares of every entry's param. */
int lt_cuda_sumsq_multi(int device, const lt_optim_entry *entries, int64_t n, int64_t chunks, void *out, int out_dtype);
/* Every entry's param *= scale[0] (scale_dtype f32/f64). */
int lt_cuda_scale_multi(int device, const lt_optim_entry *entries, int64_t n, int64_t chunks, const void *scale,
                        int scale_dtype);
/* coef[0] = the clipping coefficient of sumsq[0] (see lt_clip_coef). */
int lt_cuda_clip_coef(int device, void *coef, int coef_dtype, const void *sumsq, int sumsq_dtype, double max_norm);

#endif
