/* adafactor.h — one Adafactor step's operands and scalars, which the CPU step
 * (host/ops/adafactor.c) and the kernels (kernels/adafactor.cu) both take, and the launcher.
 * Sums run in one order on both sides, so that they agree bitwise: a row's or a column's in
 * index order, a whole tensor's (norms) in runs of LT_ADAFACTOR_RUN elements, each summed in
 * index order, the run sums then added in run order; all in double. */
#ifndef LUTRA_KERNELS_ADAFACTOR_H
#define LUTRA_KERNELS_ADAFACTOR_H
#include "kernels/multi_tensor.h"

enum { LT_ADAFACTOR_RUN = 2048 };

/* param, grad and the state, contiguous, all of dtype (f32 or f64). Factored: row (batches *
 * rows) and col (batches * cols), v NULL; else v (n), row and col NULL. m NULL without beta1. */
typedef struct lt_adafactor_args {
  void *param, *m, *row, *col, *v;
  const void *grad;
  int64_t n, batches, rows, cols; /* factored: n = batches * rows * cols */
  int32_t dtype;
  bool factored, first_moment, scale_parameter;
  double rel_lr, eps1, eps2, clip, beta2t, beta1, weight_decay;
} lt_adafactor_args;

/* The step on the device's compute stream; nothing waits for the host. */
int lt_cuda_adafactor(int device, const lt_adafactor_args *a);

/* One tensor of a multi-tensor step: its operands, and where its chunks (LT_OPTIM_CHUNK elements),
 * rows, columns and batches (factored: batches * rows, batches * cols, batches; else none) start
 * in the call's numbering of each. */
typedef struct lt_adafactor_entry {
  lt_adafactor_args a;
  int64_t first_chunk, first_row, first_col, first_batch;
} lt_adafactor_entry;

/* The totals of a multi-tensor call's numbering. */
typedef struct lt_adafactor_counts {
  int64_t chunks, rows, cols, batches;
} lt_adafactor_counts;

/* The step of n tensors in one set of launches (the single step's passes, each over all of
 * them); each tensor as lt_cuda_adafactor. */
int lt_cuda_adafactor_multi(int device, const lt_adafactor_entry *entries, int64_t n, const lt_adafactor_counts *c);

/* A chunk holds a whole number of the norms' runs. */
enum { LT_ADAFACTOR_RUNS_PER_CHUNK = LT_OPTIM_CHUNK / LT_ADAFACTOR_RUN };

#endif
