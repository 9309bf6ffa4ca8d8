/* lamb.h — one LAMB step's operands and scalars, which the CPU step (host/ops/lamb.c) and the
 * kernels (kernels/lamb.cu) both take, and the launcher. The norms are summed in one order on
 * both sides, so that they agree bitwise: runs of LT_LAMB_RUN elements, each in index order, the
 * run sums then added in run order; all in double. */
#ifndef LUTRA_KERNELS_LAMB_H
#define LUTRA_KERNELS_LAMB_H
#include "kernels/multi_tensor.h"

enum { LT_LAMB_RUN = 2048 };

/* param, grad, m and v, contiguous, all of dtype (f32 or f64). */
typedef struct lt_lamb_args {
  void *param, *m, *v;
  const void *grad;
  int64_t n;
  int32_t dtype;
  double lr, beta1, beta2, eps, weight_decay, bc1, bc2;
} lt_lamb_args;

/* The step on the device's compute stream; nothing waits for the host. */
int lt_cuda_lamb(int device, const lt_lamb_args *a);
/* The step of n tensors (entries: param, grad, m, v, n, pdtype; chunks numbered by
 * lt_optim_number_chunks) with a's scalars, in four launches; each tensor as lt_cuda_lamb. */
int lt_cuda_lamb_multi(int device, const lt_optim_entry *entries, int64_t n, int64_t chunks, const lt_lamb_args *a);

/* A chunk of a multi-tensor call holds a whole number of the norms' runs. */
enum { LT_LAMB_RUNS_PER_CHUNK = LT_OPTIM_CHUNK / LT_LAMB_RUN };

#endif
