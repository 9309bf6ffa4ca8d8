/* lion.h — Lion's step scalars (formed in double once, on the host), which the CPU rows
 * (host/ops/lion.c) and the kernel (kernels/lion.cu) both take, and the kernel's launcher. */
#ifndef LUTRA_KERNELS_LION_H
#define LUTRA_KERNELS_LION_H
#include "kernels/multi_tensor.h"

typedef struct lt_lion_scalars {
  double decay; /* 1 - lr * weight_decay */
  double neg_lr;
  double beta1, one_minus_beta1, beta2, one_minus_beta2;
} lt_lion_scalars;

/* Lion on one tensor (param, grad, m; master unused), on the device's compute stream. */
int lt_cuda_lion(int device, const lt_optim_entry *e, const lt_lion_scalars *s);

#endif
