/* along_dim.h — the rows along one dim that sort, topk, cumsum and cumprod work on: every dim
 * but `dim` is "kept" and numbers the rows (row-major), `dim` runs along a row. Strides are in
 * elements, per tensor, so any view works without a copy. */
#ifndef LUTRA_OPS_ALONG_DIM_H
#define LUTRA_OPS_ALONG_DIM_H
#include "core/internal.h"

/* The kept shape of t without dim (nkept dims; a 0-d tensor has one row of one element). */
static inline int along_dim_kept(const lt_tensor *t, int dim, int64_t *kshape, int64_t *rows) {
  int nk = 0;
  *rows = 1;
  for (int d = 0; d < t->ndim; d++)
    if (d != dim) kshape[nk++] = t->shape[d], *rows *= t->shape[d];
  return nk;
}

/* t's strides on the kept dims and along dim (0 for a 0-d tensor). */
static inline void along_dim_strides(const lt_tensor *t, int dim, int64_t *kstride, int64_t *dstride) {
  int nk = 0;
  *dstride = t->ndim ? t->stride[dim] : 0;
  for (int d = 0; d < t->ndim; d++)
    if (d != dim) kstride[nk++] = t->stride[d];
}

#endif
