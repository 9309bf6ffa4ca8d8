/* gather.c — gather, scatter and scatter_add along one dim, with PyTorch's semantics:
 *
 *   gather(x, dim, index)            out[p] = x[p with coordinate dim := index[p]], out shaped as index
 *   scatter(x, dim, index, src)      out = x, then out[p with dim := index[p]] = src[p] for p over index
 *   scatter_add(x, dim, index, src)  the same, adding (duplicates sum in index order along dim)
 *   scatter_reduce(..., reduce)      the same, reducing with "sum", "amax" or "amin" (NaN kept)
 *
 * x, index (and src) have the same number of dims; index is no larger than x in the dims other
 * than dim (and no larger than src in any); index is i32 or i64 with values in [0, x.shape[dim])
 * (a value outside is an error naming the op, the value and its position: never a wild read or
 * write). dim may be negative. The loops are the plan's (kernels/gather.h, ops/gather_cpu.c,
 * kernels/gather.cu); index_select.c's ops run on the same plan. */
#include "ops/gather.h"
#include "ops/backend.h"
#include "ops/device_tensors.h"
#include <stdio.h>

/* "[0,2]": the coordinates of flat row-major position pos in shape. */
static const char *coords(char *buf, int ndim, const int64_t *shape, int64_t pos) {
  int64_t c[LT_MAX_DIMS];
  for (int d = ndim - 1; d >= 0; d--) c[d] = shape[d] ? pos % shape[d] : 0, pos = shape[d] ? pos / shape[d] : 0;
  return lt_shape_str(buf, ndim, c);
}

static int bad_index(const char *op, const lt_tensor *index, int64_t pos, int64_t value, int64_t size, int dim) {
  char c[LT_SHAPE_STR];
  return lt_errorf("%s: index %lld out of range [0, %lld) of dim %d, at index%s", op, (long long)value, (long long)size,
                   dim, coords(c, index->ndim, index->shape, pos));
}

lt_tensor *lt_gather_checked_index(const char *op, const lt_tensor *index, const lt_tensor *like, int64_t size,
                                   int dim) {
  char d[LT_DESC_STR];
  if (lt_check_defined(op, "index", index) || lt_check_same_device(op, like, index)) return NULL;
  if (index->dtype != LT_I32 && index->dtype != LT_I64) {
    lt_errorf("%s: index is %s, expected i32 or i64", op, lt_desc(d, index));
    return NULL;
  }
  int64_t n = lt_numel(index);
  if (index->device != LT_DEVICE_CPU) {
    const lt_backend *be = lt_backend_for(op, index->device);
    lt_tensor *ic = be ? lt_nn_cuda_contiguous(index) : NULL;
    int64_t bad = -1, value = 0;
    if (!ic) return NULL;
    if (n > 0 && be->check_indices(op, ic->device, lt_data_ptr(ic), ic->dtype, 1, n, size, 0, 0, &bad, &value)) {
      lt_release(ic);
      return NULL;
    }
    if (bad < 0) return ic;
    lt_release(ic);
    bad_index(op, index, bad, value, size, dim);
    return NULL;
  }
  const char *base = lt_data_ptr(index);
  for (int64_t pos = 0; pos < n; pos++) {
    int64_t off = 0, rest = pos;
    for (int k = index->ndim - 1; k >= 0; k--)
      off += (rest % index->shape[k]) * index->stride[k], rest /= index->shape[k];
    int64_t v = index->dtype == LT_I64 ? ((const int64_t *)base)[off] : ((const int32_t *)base)[off];
    if (v < 0 || v >= size) {
      bad_index(op, index, pos, v, size, dim);
      return NULL;
    }
  }
  lt_tensor *v = lt_tensor_new();
  if (v && lt_set(v, index) == 0) return v;
  lt_release(v);
  return NULL;
}

int lt_gather_copy_into(const char *op, lt_tensor *out, const lt_tensor *x) {
  LT_TRY(lt_prepare_out(op, out, x->ndim, x->shape, x->dtype, x->device));
  bool same = lt_data_ptr(out) == lt_data_ptr(x);
  for (int d = 0; same && d < x->ndim; d++) same = out->stride[d] == x->stride[d];
  return same ? 0 : lt_copy(out, x);
}

int lt_gather_dispatch(const char *op, const lt_gather_plan *p) {
  const lt_backend *be = lt_backend_for(op, p->device);
  if (!be) return -1;
  for (int d = 0; d < p->ndim; d++)
    if (p->shape[d] == 0) return 0;
  return be->gather(p);
}

/* The plan's geometry from three tensors of one ndim (a 0-d op runs as one element). */
static void plan_geometry(lt_gather_plan *p, int dim, const lt_tensor *shape_of, const lt_tensor *self,
                          const lt_tensor *other, const lt_tensor *index) {
  p->device = self->device, p->dtype = self->dtype, p->idtype = index->dtype;
  p->ndim = shape_of->ndim > 0 ? shape_of->ndim : 1, p->dim = dim;
  p->self = lt_data_ptr(self), p->other = lt_data_ptr(other), p->index = lt_data_ptr(index);
  for (int d = 0; d < p->ndim; d++) {
    bool scalar = shape_of->ndim == 0;
    p->shape[d] = scalar ? 1 : shape_of->shape[d];
    p->self_stride[d] = scalar ? 0 : self->stride[d];
    p->other_stride[d] = scalar ? 0 : other->stride[d];
    p->index_stride[d] = scalar ? 0 : index->stride[d];
  }
}

/* The checks gather and scatter share: x and index defined, one ndim, dim wrapped, index no
 * larger than x off dim. */
static int check_common(const char *op, const lt_tensor *x, int dim, const lt_tensor *index, int *wrapped) {
  char a[LT_DESC_STR], b[LT_DESC_STR];
  LT_TRY(lt_check_defined(op, "x", x));
  LT_TRY(lt_check_defined(op, "index", index));
  if (index->ndim != x->ndim)
    return lt_errorf("%s: index is %s, expected as many dims as x %s", op, lt_desc(a, index), lt_desc(b, x));
  LT_TRY(lt_wrap_dim(op, dim, x->ndim > 0 ? x->ndim : 1, wrapped));
  for (int d = 0; d < x->ndim; d++)
    if (d != *wrapped && index->shape[d] > x->shape[d])
      return lt_errorf("%s: index %s is larger than x %s in dim %d", op, lt_desc(a, index), lt_desc(b, x), d);
  return 0;
}

static int64_t dim_size(const lt_tensor *x, int dim) { return x->ndim > 0 ? x->shape[dim] : 1; }

int lt_gather(lt_tensor *out, const lt_tensor *x, int dim, const lt_tensor *index) {
  const char *op = "gather";
  int w;
  LT_TRY(check_common(op, x, dim, index, &w));
  lt_tensor *ic = lt_gather_checked_index(op, index, x, dim_size(x, w), w);
  if (!ic) return -1;
  int rc = lt_prepare_out(op, out, index->ndim, index->shape, x->dtype, x->device);
  if (rc == 0) {
    lt_gather_plan p = {.mode = LT_GATHER_READ};
    plan_geometry(&p, w, index, x, out, ic);
    rc = lt_gather_dispatch(op, &p);
  }
  lt_release(ic);
  return rc;
}

static int scatter(const char *op, int mode, lt_tensor *out, const lt_tensor *x, int dim, const lt_tensor *index,
                   const lt_tensor *src) {
  char a[LT_DESC_STR], b[LT_DESC_STR];
  int w;
  LT_TRY(check_common(op, x, dim, index, &w));
  LT_TRY(lt_check_defined(op, "src", src));
  LT_TRY(lt_check_same_device(op, x, src));
  if (src->dtype != x->dtype)
    return lt_errorf("%s: src is %s, expected x's dtype (x is %s)", op, lt_desc(a, src), lt_desc(b, x));
  if (src->ndim != x->ndim)
    return lt_errorf("%s: src is %s, expected as many dims as x %s", op, lt_desc(a, src), lt_desc(b, x));
  for (int d = 0; d < x->ndim; d++)
    if (index->shape[d] > src->shape[d])
      return lt_errorf("%s: index %s is larger than src %s in dim %d", op, lt_desc(a, index), lt_desc(b, src), d);
  lt_tensor *ic = lt_gather_checked_index(op, index, x, dim_size(x, w), w);
  if (!ic) return -1;
  int rc = lt_gather_copy_into(op, out, x);
  if (rc == 0) {
    lt_gather_plan p = {.mode = mode};
    plan_geometry(&p, w, index, out, src, ic);
    rc = lt_gather_dispatch(op, &p);
  }
  lt_release(ic);
  return rc;
}

int lt_scatter(lt_tensor *out, const lt_tensor *x, int dim, const lt_tensor *index, const lt_tensor *src) {
  return scatter("scatter", LT_GATHER_WRITE, out, x, dim, index, src);
}

int lt_scatter_add(lt_tensor *out, const lt_tensor *x, int dim, const lt_tensor *index, const lt_tensor *src) {
  return scatter("scatter_add", LT_GATHER_ADD, out, x, dim, index, src);
}

int lt_scatter_reduce(lt_tensor *out, const lt_tensor *x, int dim, const lt_tensor *index, const lt_tensor *src,
                      const char *reduce) {
  const char *op = "scatter_reduce";
  int mode = !reduce                   ? -1
             : !strcmp(reduce, "sum")  ? LT_GATHER_ADD
             : !strcmp(reduce, "amax") ? LT_GATHER_AMAX
             : !strcmp(reduce, "amin") ? LT_GATHER_AMIN
                                       : -1;
  if (mode < 0) return lt_errorf("%s: reduce is '%s', expected sum, amax or amin", op, reduce ? reduce : "(null)");
  return scatter(op, mode, out, x, dim, index, src);
}
