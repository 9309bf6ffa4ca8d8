/* adamw.h — AdamW's step scalars (formed in double once, on the host), which the CPU rows
 * (host/ops/adamw.c) and the kernel (kernels/adamw.cu) both take, and the kernel's launcher. */
#ifndef LUTRA_KERNELS_ADAMW_H
#define LUTRA_KERNELS_ADAMW_H
#include "kernels/multi_tensor.h"

/* AdamW's scalars in double; the f32 kernels cast each once (host and device alike). */
typedef struct lt_adamw_scalars {
  double decay;  /* 1 - lr * weight_decay */
  double lerp_w; /* 1 - beta1 */
  double beta2, one_minus_beta2;
  double step_size; /* lr / (1 - beta1^step) */
  double bc2_sqrt;  /* sqrt(1 - beta2^step) */
  double eps;
} lt_adamw_scalars;

/* AdamW over entries[0..n) (chunks: the total of their chunks) in one launch on the device's
 * compute stream, master weights included; the table is copied to the device through a pinned
 * buffer and nothing waits for the host. */
int lt_cuda_adamw_multi(int device, const lt_optim_entry *entries, int64_t n, int64_t chunks,
                        const lt_adamw_scalars *s);

#endif
