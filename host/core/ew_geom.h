/* ew_geom.h — the geometry every elementwise loop walks, on the CPU and in the CUDA kernels
 * (kernels/elementwise.h): plain C, compiled for both sides (LT_HOST_DEVICE), so that the offset
 * arithmetic the kernels run is the one tests/c/test_cuda_elementwise_geom.c checks on the CPU. */
#ifndef LUTRA_CORE_EW_GEOM_H
#define LUTRA_CORE_EW_GEOM_H
#include "core/internal.h"

enum { LT_EW_MAX_OPS = 4 };

/* numel elements of an op with nops operands (operand 0 the output). Dims are coalesced as
 * ew_execute does (size-1 dims dropped, neighbours merged where every operand walks them
 * contiguously) and stored INNERMOST FIRST: shape[0] is the fastest-moving dim, so that
 * kernels unroll over dims with constant indices (no dynamic indexing of parameters).
 * Strides are in elements, may be 0 (broadcast) or negative; unused operands have 0. */
typedef struct lt_ew_geom {
  int32_t ndim; /* >= 1; a single element is ndim 1, shape {1} */
  int32_t nops;
  int64_t numel; /* 0: nothing to do */
  int64_t shape[LT_MAX_DIMS];
  int64_t stride[LT_EW_MAX_OPS][LT_MAX_DIMS];
} lt_ew_geom;

/* Drops size-1 dims and merges neighbouring dims that every operand walks contiguously, into
 * sh and st (row-major, outermost first). Returns the number of dims, 0 when there is nothing to do. */
int lt_ew_coalesce(int ndim, const int64_t *shape, int nops, const int64_t (*strides)[LT_MAX_DIMS], int64_t *sh,
                   int64_t (*st)[LT_MAX_DIMS]);

/* g for shape (ndim dims, row-major) and each operand's strides over it. */
void lt_ew_geom_init(lt_ew_geom *g, int ndim, const int64_t *shape, int nops, const int64_t (*strides)[LT_MAX_DIMS]);

/* g for out and inputs broadcast to out's shape: operand 0 is out, then ins[0..nin). */
void lt_ew_geom_of(lt_ew_geom *g, const lt_tensor *out, int nin, const lt_tensor *const *ins);

/* Every operand walks memory contiguously (one dim, unit strides). */
LT_HOST_DEVICE static inline bool lt_ew_geom_contiguous(const lt_ew_geom *g) {
  if (g->ndim != 1) return false;
  for (int k = 0; k < g->nops; k++)
    if (g->stride[k][0] != 1) return false;
  return true;
}

#ifdef __CUDA_ARCH__
#define LT_EW_UNROLL _Pragma("unroll")
#else
#define LT_EW_UNROLL
#endif

/* Element offsets off[0..nops) of the element with row-major linear index i (< numel).
 * Index is the type the divisions run in: 32-bit where numel < 2^31 (much cheaper on the
 * GPU), 64-bit otherwise; offsets are always 64-bit. */
#define LT_EW_DEFINE_OFFSETS(NAME, INDEX)                                                                              \
  LT_HOST_DEVICE static inline void NAME(const lt_ew_geom *g, INDEX i, int nops, int64_t *off) {                       \
    LT_EW_UNROLL for (int k = 0; k < LT_EW_MAX_OPS; k++) off[k] = 0;                                                   \
    LT_EW_UNROLL for (int d = 0; d < LT_MAX_DIMS; d++) {                                                               \
      if (d == g->ndim) break;                                                                                         \
      INDEX n = (INDEX)g->shape[d], q = i / n;                                                                         \
      int64_t r = (int64_t)(i - q * n);                                                                                \
      i = q;                                                                                                           \
      LT_EW_UNROLL for (int k = 0; k < LT_EW_MAX_OPS; k++) if (k < nops) off[k] += r * g->stride[k][d];                \
    }                                                                                                                  \
  }
LT_EW_DEFINE_OFFSETS(lt_ew_offsets32, uint32_t)
LT_EW_DEFINE_OFFSETS(lt_ew_offsets64, int64_t)

#endif
