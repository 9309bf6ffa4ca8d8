/* gather.h — the plan of gather and scatter along one dim (kernels/gather.cu, host/ops/gather_cpu.c).
 *
 * One plan serves gather, scatter, scatter_add, scatter_reduce's amax and amin, index_select,
 * index_copy and index_add (the index ops are gather/scatter with their 1-d index expanded over the
 * other dims by zero strides). The positions visited are those of `shape` (the index's shape, ndim
 * dims). At position p with v = index[p] (checked by the front to lie in [0, size)) and q = p with
 * coordinate `dim` set to v:
 *   LT_GATHER_READ         other[p] = self[q]      (gather: self the source, other the output)
 *   LT_GATHER_WRITE        self[q]  = other[p]     (scatter: self the output, other the source)
 *   LT_GATHER_ADD          self[q] += other[p]
 *   LT_GATHER_AMAX / AMIN  self[q] = max / min(self[q], other[p]), a NaN on either side kept
 * Writes to one self element come from positions that differ only along dim: both backends visit
 * those in increasing order, each line along dim on one thread, so results are deterministic and
 * the same on the CPU and CUDA (16-bit sums round after each addition, as PyTorch's CPU does).
 * Strides are in elements; index is i32 or i64. The header includes only <stdint.h>. */
#ifndef LUTRA_KERNELS_GATHER_H
#define LUTRA_KERNELS_GATHER_H
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif

enum { LT_GATHER_READ = 0, LT_GATHER_WRITE = 1, LT_GATHER_ADD = 2, LT_GATHER_AMAX = 3, LT_GATHER_AMIN = 4 };

typedef struct lt_gather_plan {
  int device, dtype, idtype, mode;
  int ndim, dim;
  int64_t shape[8]; /* the positions visited (LT_MAX_DIMS) */
  void *self;       /* gather's source, scatter's output */
  int64_t self_stride[8];
  void *other; /* gather's output, scatter's source */
  int64_t other_stride[8];
  const void *index;
  int64_t index_stride[8];
} lt_gather_plan;

int lt_cuda_gather(const lt_gather_plan *p);

#ifdef __cplusplus
}
#endif
#endif
