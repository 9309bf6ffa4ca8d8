/* elementwise.h — the elementwise ops between host C and kernels/ (unary.cu, binary.cu,
 * kernels/copy.cu, elementwise.cu): the geometry every kernel walks, and the launchers.
 *
 * The geometry is plain C, compiled for both sides (LT_HOST_DEVICE), so that the offset
 * arithmetic the kernels run is the one tests/c/test_cuda_elementwise_geom.c checks on the CPU.
 * The launchers run on `device`; given LT_DEVICE_CPU they run the very same loops on the host,
 * as a few emulated threads of a grid-stride loop, over host memory (a test hook: the kernels'
 * element rules and index math checked without a GPU). */
#ifndef LUTRA_CUDA_ELEMENTWISE_H
#define LUTRA_CUDA_ELEMENTWISE_H
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

/* g for shape (ndim dims, row-major) and each operand's strides over it (host/ops/elementwise.c). */
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

/* Each returns 0, or -1 with the error set (naming op). Pointers are element [0,...,0] of each
 * operand; dtypes and shapes were checked by the caller. */

/* out = op(a); dtype is both's (kernels/unary.cu). */
int lt_cuda_unary(int device, int op, int dtype, const lt_ew_geom *g, void *out, const void *a);
/* grad_in = grad_out * op'(x), operands in that order. */
int lt_cuda_unary_backward(int device, int op, int dtype, const lt_ew_geom *g, void *grad_in, const void *grad_out,
                           const void *x);
/* out = min(max(a, lo), hi); for integers lo and hi are already rounded and clipped to the dtype. */
int lt_cuda_clamp(int device, int dtype, const lt_ew_geom *g, void *out, const void *a, double lo, double hi);

/* out = a op b, a and b of dtype, out of dtype or bool (comparisons) (kernels/binary.cu).
 * scalar_side 1: a is the scalar *scalar (g has no operand for it: its strides are 0);
 * 2: b is; 0: none. The scalar is held in scalar_dtype (f32 for f32/bf16/f16, else dtype). */
int lt_cuda_binary(int device, int op, int dtype, const lt_ew_geom *g, void *out, const void *a, const void *b,
                   int scalar_side, const void *scalar);
/* out = cond ? a : b; cond bool/u8, elements of `size` bytes moved unchanged. */
int lt_cuda_where(int device, int size, const lt_ew_geom *g, void *out, const void *cond, const void *a, const void *b);

/* dst = src converted from src_dtype to dst_dtype by host/core/copy.c's rules (kernels/copy.cu). */
int lt_cuda_copy(int device, const lt_ew_geom *g, void *dst, int dst_dtype, const void *src, int src_dtype);
/* out = value (as lt_store_f64 stores it) over g (one operand). */
int lt_cuda_fill(int device, const lt_ew_geom *g, void *out, int dtype, double value);
/* out[i * stride] = start + i * step for i < n, stored as lt_store_f64 does. */
int lt_cuda_sequence(int device, void *out, int64_t stride, int dtype, int64_t n, double start, double step);

#endif
