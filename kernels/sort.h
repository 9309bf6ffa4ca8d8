/* sort.h — sort, argsort and topk along one dim (kernels/sort.cu), as host/ops/sort.c and
 * host/ops/topk.c call them; also the backward that scatters a gradient to the indices.
 *
 * A row is the n elements along the dim; the other dims ("kept", at most 8) number the rows.
 * Order: ascending (or descending) by value, NaN greater than every number (last ascending,
 * first descending), equal values by their index, lower first: a stable sort, and for topk
 * the lower index wins a tie. The first k of the sorted row are written (k == n: sort).
 * The host checks every argument first; the launchers return 0 or -1 with the error set. */
#ifndef LUTRA_KERNELS_SORT_H
#define LUTRA_KERNELS_SORT_H
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif

/* the longest row the CUDA kernel sorts (in shared memory, one block per row) */
enum { LT_CUDA_SORT_MAX_ROW = 4096 };

typedef struct lt_sort_plan {
  int device, dtype, descending;
  int nkept;
  int64_t kshape[8], rows; /* kept dims and their product */
  int64_t n, k;            /* row length, results per row */
  const void *x;
  int64_t xk[8], xd; /* element strides of x: kept dims, the sorted dim */
  void *values;
  int64_t vk[8], vd;
  int64_t *indices;
  int64_t ik[8], id;
} lt_sort_plan;
int lt_cuda_sort(const char *op, const lt_sort_plan *p);

/* grad_in (n along the dim, zero-filled by the host) gets grad_in[row, indices[row, j]] = grad_out[row, j]
 * for j < k: the indices of one row are distinct. */
typedef struct lt_sort_backward_plan {
  int device, dtype, nkept;
  int64_t kshape[8], rows, n, k;
  void *grad_in;
  int64_t gk_in[8], gd_in;
  const void *grad_out;
  int64_t gk[8], gd;
  const int64_t *indices;
  int64_t ik[8], id;
} lt_sort_backward_plan;
int lt_cuda_sort_backward(const char *op, const lt_sort_backward_plan *p);

#ifdef __cplusplus
}
#endif
#endif
