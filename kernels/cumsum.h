/* cumsum.h — cumulative sums and products along one dim (kernels/cumsum.cu), as
 * host/ops/cumsum.c calls them, and cumprod's backward.
 *
 * Rows as in kernels/sort.h (every dim but the scanned one numbers the rows). Sums and products
 * run in double for every dtype on both devices; each element is rounded once.
 * The host checks every argument first; the launchers return 0 or -1 with the error set. */
#ifndef LUTRA_KERNELS_CUMSUM_H
#define LUTRA_KERNELS_CUMSUM_H
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif

typedef enum lt_cumsum_kind { LT_CUMSUM = 0, LT_CUMPROD, LT_CUMPROD_BACKWARD } lt_cumsum_kind;

typedef struct lt_cumsum_plan {
  int device, dtype, kind;
  int reverse; /* LT_CUMSUM: from the end of the row (cumsum's backward) */
  int nkept;
  int64_t kshape[8], rows, n;
  const void *x; /* the input (LT_CUMPROD_BACKWARD: cumprod's input) */
  int64_t xk[8], xd;
  const void *g; /* LT_CUMPROD_BACKWARD: the gradient of cumprod's result, else NULL */
  int64_t gk[8], gd;
  void *out; /* the result (LT_CUMPROD_BACKWARD: the gradient of x) */
  int64_t ok[8], od;
} lt_cumsum_plan;
int lt_cuda_cumsum(const char *op, const lt_cumsum_plan *p);

#ifdef __cplusplus
}
#endif
#endif
