/* index_select.c — index_select, index_add and index_copy along one dim, with PyTorch's semantics:
 *
 *   index_select(x, dim, index)        out = x with dim's slices index[0], index[1], ... (out.shape[dim] = n)
 *   index_add(x, dim, index, src)      out = x, then slice index[j] of out += slice j of src
 *   index_copy(x, dim, index, src)     out = x, then slice index[j] of out = slice j of src
 *
 * index is 1-d (or 0-d: one index) i32/i64 with n values in [0, x.shape[dim]); src is x's shape
 * with n at dim. They run on gather's plan (ops/gather.c) with index expanded over the other dims
 * by zero strides: index_select is a gather, index_add a scatter_add, index_copy a scatter, so
 * index_add sums duplicates in index order on either device. */
#include "ops/gather.h"

static int check_x_index(const char *op, const lt_tensor *x, int dim, const lt_tensor *index, int *w) {
  char a[LT_DESC_STR];
  LT_TRY(lt_check_defined(op, "x", x));
  LT_TRY(lt_check_defined(op, "index", index));
  if (x->ndim == 0) return lt_errorf("%s: x is %s, expected at least one dim", op, lt_desc(a, x));
  if (index->ndim > 1) return lt_errorf("%s: index is %s, expected 1-d", op, lt_desc(a, index));
  return lt_wrap_dim(op, dim, x->ndim, w);
}

/* The plan over shape (x's with n at dim) reading the 1-d index ic along dim. */
static void index_plan(lt_gather_plan *p, int mode, int dim, const lt_tensor *shape_of, const lt_tensor *self,
                       const lt_tensor *other, const lt_tensor *ic) {
  *p = (lt_gather_plan){.device = self->device,
                        .dtype = self->dtype,
                        .idtype = ic->dtype,
                        .mode = mode,
                        .ndim = shape_of->ndim,
                        .dim = dim,
                        .self = lt_data_ptr(self),
                        .other = lt_data_ptr(other),
                        .index = lt_data_ptr(ic)};
  for (int d = 0; d < p->ndim; d++) {
    p->shape[d] = shape_of->shape[d];
    p->self_stride[d] = self->stride[d], p->other_stride[d] = other->stride[d];
    p->index_stride[d] = d == dim && ic->ndim == 1 ? ic->stride[0] : 0;
  }
}

int lt_index_select(lt_tensor *out, const lt_tensor *x, int dim, const lt_tensor *index) {
  const char *op = "index_select";
  int w;
  LT_TRY(check_x_index(op, x, dim, index, &w));
  lt_tensor *ic = lt_gather_checked_index(op, index, x, x->shape[w], w);
  if (!ic) return -1;
  int64_t shape[LT_MAX_DIMS];
  memcpy(shape, x->shape, (size_t)x->ndim * sizeof(int64_t));
  shape[w] = lt_numel(index);
  int rc = lt_prepare_out(op, out, x->ndim, shape, x->dtype, x->device);
  if (rc == 0) {
    lt_gather_plan p;
    index_plan(&p, LT_GATHER_READ, w, out, x, out, ic);
    rc = lt_gather_dispatch(op, &p);
  }
  lt_release(ic);
  return rc;
}

static int index_write(const char *op, int mode, lt_tensor *out, const lt_tensor *x, int dim, const lt_tensor *index,
                       const lt_tensor *src) {
  char a[LT_DESC_STR], b[LT_DESC_STR], s[LT_SHAPE_STR];
  int w;
  LT_TRY(check_x_index(op, x, dim, index, &w));
  LT_TRY(lt_check_defined(op, "src", src));
  LT_TRY(lt_check_same_device(op, x, src));
  if (src->dtype != x->dtype)
    return lt_errorf("%s: src is %s, expected x's dtype (x is %s)", op, lt_desc(a, src), lt_desc(b, x));
  int64_t shape[LT_MAX_DIMS];
  memcpy(shape, x->shape, (size_t)x->ndim * sizeof(int64_t));
  shape[w] = lt_numel(index);
  bool ok = src->ndim == x->ndim;
  for (int d = 0; ok && d < x->ndim; d++) ok = src->shape[d] == shape[d];
  if (!ok)
    return lt_errorf("%s: src is %s, expected %s (x %s with index's %lld at dim %d)", op, lt_desc(a, src),
                     lt_shape_str(s, x->ndim, shape), lt_desc(b, x), (long long)shape[w], w);
  lt_tensor *ic = lt_gather_checked_index(op, index, x, x->shape[w], w);
  if (!ic) return -1;
  int rc = lt_gather_copy_into(op, out, x);
  if (rc == 0) {
    lt_gather_plan p;
    index_plan(&p, mode, w, src, out, src, ic);
    rc = lt_gather_dispatch(op, &p);
  }
  lt_release(ic);
  return rc;
}

int lt_index_add(lt_tensor *out, const lt_tensor *x, int dim, const lt_tensor *index, const lt_tensor *src) {
  return index_write("index_add", LT_GATHER_ADD, out, x, dim, index, src);
}

int lt_index_copy(lt_tensor *out, const lt_tensor *x, int dim, const lt_tensor *index, const lt_tensor *src) {
  return index_write("index_copy", LT_GATHER_WRITE, out, x, dim, index, src);
}
