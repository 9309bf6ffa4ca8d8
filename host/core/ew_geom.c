/* ew_geom.c — the geometry of an elementwise loop: dims coalesced and broadcast strides, for
 * the CPU loop driver (ops/elementwise.c), the copies (core/copy.c) and the CUDA kernels. */
#include "core/ew_geom.h"
#include <string.h>

int lt_ew_coalesce(int ndim, const int64_t *shape, int nops, const int64_t (*strides)[LT_MAX_DIMS], int64_t *sh,
                   int64_t (*st)[LT_MAX_DIMS]) {
  int n = 0;
  for (int d = 0; d < ndim; d++) {
    if (shape[d] == 0) return 0;
    if (shape[d] == 1) continue;
    sh[n] = shape[d];
    for (int k = 0; k < nops; k++) st[k][n] = strides[k][d];
    bool merge = n > 0;
    for (int k = 0; merge && k < nops; k++) merge = st[k][n - 1] == st[k][n] * sh[n];
    if (merge) {
      sh[n - 1] *= sh[n];
      for (int k = 0; k < nops; k++) st[k][n - 1] = st[k][n];
    } else {
      n++;
    }
  }
  if (n == 0) { /* a single element */
    sh[0] = 1;
    for (int k = 0; k < nops; k++) st[k][0] = 0;
    n = 1;
  }
  return n;
}

void lt_ew_geom_init(lt_ew_geom *g, int ndim, const int64_t *shape, int nops, const int64_t (*strides)[LT_MAX_DIMS]) {
  int64_t sh[LT_MAX_DIMS], st[LT_EW_MAX_OPS][LT_MAX_DIMS];
  memset(g, 0, sizeof *g);
  g->nops = nops;
  int nd = lt_ew_coalesce(ndim, shape, nops, strides, sh, st);
  g->ndim = nd > 0 ? nd : 1;
  g->numel = nd > 0 ? lt_shape_numel(nd, sh) : 0;
  for (int d = 0; d < nd; d++) { /* innermost first */
    g->shape[d] = sh[nd - 1 - d];
    for (int k = 0; k < nops; k++) g->stride[k][d] = st[k][nd - 1 - d];
  }
}

void lt_ew_geom_of(lt_ew_geom *g, const lt_tensor *out, int nin, const lt_tensor *const *ins) {
  int64_t st[LT_EW_MAX_OPS][LT_MAX_DIMS];
  lt_broadcast_strides(out, out->ndim, out->shape, st[0]);
  for (int k = 0; k < nin; k++) lt_broadcast_strides(ins[k], out->ndim, out->shape, st[k + 1]);
  lt_ew_geom_init(g, out->ndim, out->shape, nin + 1, (const int64_t(*)[LT_MAX_DIMS])st);
}

/* Element offsets of each operand at index r of the dims [0, nd) (row-major). */
