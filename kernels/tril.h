/* tril.h — tril and triu (kernels/tril.cu), as host/ops/tril.c calls them: out = x where
 * element (i, j) of the last two dims is kept, else 0. tril keeps j - i <= diagonal, triu keeps
 * j - i >= diagonal. The host checks every argument first; the launcher returns 0 or -1 with
 * the error set. */
#ifndef LUTRA_KERNELS_TRIL_H
#define LUTRA_KERNELS_TRIL_H
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif

typedef struct lt_tril_plan {
  int device, dtype, upper, ndim; /* ndim >= 2 */
  int64_t shape[8], numel, diagonal;
  const void *x;
  int64_t xs[8]; /* element strides */
  void *out;
  int64_t os[8];
} lt_tril_plan;
int lt_cuda_tril(const char *op, const lt_tril_plan *p);

#ifdef __cplusplus
}
#endif
#endif
