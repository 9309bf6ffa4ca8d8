/* optim.h — what the optimizer ops share between their C files and kernels/optim.cu:
 * the step's scalars (formed in double once, on the host), one tensor's entry of a
 * multi-tensor call, the CPU chunk routines, and the CUDA launchers (with CUDA only). */
#ifndef LUTRA_CUDA_OPTIM_H
#define LUTRA_CUDA_OPTIM_H
#include "lutra.h"
#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#ifdef __CUDACC__
#define LT_OPTIM_HD __host__ __device__
#else
#define LT_OPTIM_HD
#endif

/* AdamW's scalars in double; the f32 kernels cast each once (host and device alike). */
typedef struct lt_adamw_scalars {
  double decay;  /* 1 - lr * weight_decay */
  double lerp_w; /* 1 - beta1 */
  double beta2, one_minus_beta2;
  double step_size; /* lr / (1 - beta1^step) */
  double bc2_sqrt;  /* sqrt(1 - beta2^step) */
  double eps;
} lt_adamw_scalars;

typedef struct lt_lion_scalars {
  double decay; /* 1 - lr * weight_decay */
  double neg_lr;
  double beta1, one_minus_beta1, beta2, one_minus_beta2;
} lt_lion_scalars;

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

/* ---- host/ops/multi_tensor.c: checks and loops the optimizer ops share -------------------- */

/* what itself for a single-tensor op, else "what[i]" (the plural the multi op names). */
const char *lt_optim_name(char *buf, int len, const char *what, int64_t i, bool single);
/* One optimizer operand, on any device: t defined, on param's device, n elements, dtype_a or dtype_b. */
int lt_optim_check_operand(const char *op, const char *what, const lt_tensor *t, int64_t n, int dtype_a, int dtype_b,
                           const lt_tensor *param);
/* A CUDA tensor's storage must be on its device: a pointer is never handed to a kernel otherwise. */
int lt_optim_check_storage(const char *op, const char *what, const lt_tensor *t);
/* "<op>: lutra was built without CUDA" in a CPU-only build for a CUDA device, else 0. */
int lt_optim_check_build(const char *op, int device);
/* Calls fn(ctx, c) for every chunk c < chunks, over OpenMP threads when elements is large. */
void lt_optim_for_chunks(int64_t chunks, int64_t elements, void (*fn)(void *ctx, int64_t c), void *ctx);
/* Numbers the chunks of entries[0..n) (first_chunk); returns their total. */
int64_t lt_optim_number_chunks(lt_optim_entry *entries, int64_t n);

/* CPU: AdamW on chunk c of e (host/ops/adamw.c, which owns the arithmetic). */
void lt_adamw_chunk_cpu(const lt_optim_entry *e, int64_t c, const lt_adamw_scalars *s);
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

/* kernels/optim.cu. Every launch is on the device's compute stream; none waits for the host.
 * entries: n host-side entries (copied to the device through a pinned buffer), chunks the
 * total of their chunks of LT_OPTIM_CHUNK elements. */
int lt_cuda_adamw_multi(int device, const lt_optim_entry *entries, int64_t n, int64_t chunks,
                        const lt_adamw_scalars *s);
/* Lion on one tensor (param, grad, m; master unused). */
int lt_cuda_lion(int device, const lt_optim_entry *e, const lt_lion_scalars *s);
/* out (out_dtype f32/f64, one element) = the sum of squares of every entry's param. */
int lt_cuda_sumsq_multi(int device, const lt_optim_entry *entries, int64_t n, int64_t chunks, void *out, int out_dtype);
/* Every entry's param *= scale[0] (scale_dtype f32/f64). */
int lt_cuda_scale_multi(int device, const lt_optim_entry *entries, int64_t n, int64_t chunks, const void *scale,
                        int scale_dtype);
/* coef[0] = the clipping coefficient of sumsq[0] (see lt_clip_coef). */
int lt_cuda_clip_coef(int device, void *coef, int coef_dtype, const void *sumsq, int sumsq_dtype, double max_norm);

#endif
