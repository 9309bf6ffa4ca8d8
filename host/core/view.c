/* view.c — views that share storage: view, reshape, transpose, permute, narrow, slice,
 * select, expand, unsqueeze, squeeze. Each writes the view into `out`. */
#include "core/internal.h"

/* out = src's storage with a new geometry (shape/stride given). */
static int make_view(lt_tensor *out, const lt_tensor *src, int ndim, const int64_t *shape, const int64_t *stride,
                     int64_t extra_offset_elems) {
  if (!out) return lt_errorf("view: out is NULL");
  lt_tensor tmp = *src; /* src may alias out */
  int64_t sh[LT_MAX_DIMS], st[LT_MAX_DIMS];
  memcpy(sh, shape, sizeof(int64_t) * (size_t)ndim);
  memcpy(st, stride, sizeof(int64_t) * (size_t)ndim);
  if (out != src) {
    __atomic_add_fetch(&tmp.storage->refcount, 1, __ATOMIC_RELAXED);
    lt_storage_release(out->storage);
    out->storage = tmp.storage;
  }
  out->offset = tmp.offset + extra_offset_elems * lt_dtype_size(tmp.dtype);
  out->ndim = ndim;
  memcpy(out->shape, sh, sizeof(int64_t) * (size_t)ndim);
  memcpy(out->stride, st, sizeof(int64_t) * (size_t)ndim);
  out->dtype = tmp.dtype;
  out->device = tmp.device;
  return 0;
}

/* Resolves a single -1 in shape against numel; checks the total matches. */
static int infer_shape(const char *op, const lt_tensor *src, int ndim, const int64_t *shape, int64_t *out) {
  if (ndim < 0 || ndim > LT_MAX_DIMS)
    return lt_errorf("%s: %d dims requested, at most %d supported", op, ndim, LT_MAX_DIMS);
  if (ndim > 0 && !shape) return lt_errorf("%s: shape is NULL", op);
  int infer = -1;
  int64_t known = 1, numel = lt_numel(src);
  char s[LT_SHAPE_STR], want[LT_SHAPE_STR];
  for (int d = 0; d < ndim; d++) {
    out[d] = shape[d];
    if (shape[d] == -1) {
      if (infer >= 0) return lt_errorf("%s: only one dim can be -1 in %s", op, lt_shape_str(s, ndim, shape));
      infer = d;
    } else if (shape[d] < 0) {
      return lt_errorf("%s: negative size in shape %s", op, lt_shape_str(s, ndim, shape));
    } else {
      known *= shape[d];
    }
  }
  if (infer >= 0) {
    if (known == 0 || numel % known)
      return lt_errorf("%s: shape %s is invalid for input of shape %s (%lld elements)", op,
                       lt_shape_str(want, ndim, shape), lt_shape_str(s, src->ndim, src->shape), (long long)numel);
    out[infer] = numel / known;
    known *= out[infer];
  }
  if (known != numel)
    return lt_errorf("%s: shape %s is invalid for input of shape %s (%lld elements)", op,
                     lt_shape_str(want, ndim, shape), lt_shape_str(s, src->ndim, src->shape), (long long)numel);
  return 0;
}

/* Strides for viewing src as new_shape without copying, as torch's computeStride:
 * false when src's memory layout does not allow it. */
static bool view_strides(const lt_tensor *src, int ndim, const int64_t *shape, int64_t *stride) {
  if (lt_numel(src) == 0 || src->ndim == 0) {
    lt_contiguous_strides(ndim, shape, stride);
    return true;
  }
  int view_d = ndim - 1;
  int64_t chunk_base_stride = src->stride[src->ndim - 1], tensor_numel = 1, view_numel = 1;
  for (int d = src->ndim - 1; d >= 0; d--) {
    tensor_numel *= src->shape[d];
    if (d == 0 || (src->shape[d - 1] != 1 && src->stride[d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
        stride[view_d] = view_numel * chunk_base_stride;
        view_numel *= shape[view_d];
        view_d--;
      }
      if (view_numel != tensor_numel) return false;
      if (d > 0) {
        chunk_base_stride = src->stride[d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  return view_d == -1;
}

int lt_view(lt_tensor *out, const lt_tensor *src, int ndim, const int64_t *shape) {
  LT_TRY(lt_check_defined("view", "input", src));
  int64_t sh[LT_MAX_DIMS], st[LT_MAX_DIMS];
  LT_TRY(infer_shape("view", src, ndim, shape, sh));
  if (!view_strides(src, ndim, sh, st)) {
    char a[LT_SHAPE_STR], b[LT_SHAPE_STR];
    return lt_errorf("view: cannot view a non-contiguous tensor of shape %s as %s; use reshape (which copies)",
                     lt_shape_str(a, src->ndim, src->shape), lt_shape_str(b, ndim, sh));
  }
  return make_view(out, src, ndim, sh, st, 0);
}

int lt_reshape(lt_tensor *out, const lt_tensor *src, int ndim, const int64_t *shape) {
  LT_TRY(lt_check_defined("reshape", "input", src));
  int64_t sh[LT_MAX_DIMS], st[LT_MAX_DIMS];
  LT_TRY(infer_shape("reshape", src, ndim, shape, sh));
  if (view_strides(src, ndim, sh, st)) return make_view(out, src, ndim, sh, st, 0);
  lt_tensor *tmp = lt_tensor_new();
  if (!tmp) return -1;
  int rc = lt_contiguous(tmp, src);
  if (rc == 0) {
    lt_contiguous_strides(ndim, sh, st);
    rc = make_view(out, tmp, ndim, sh, st, 0);
  }
  lt_release(tmp);
  return rc;
}

int lt_transpose(lt_tensor *out, const lt_tensor *src, int dim0, int dim1) {
  LT_TRY(lt_check_defined("transpose", "input", src));
  int a, b;
  LT_TRY(lt_wrap_dim("transpose", dim0, src->ndim, &a));
  LT_TRY(lt_wrap_dim("transpose", dim1, src->ndim, &b));
  int64_t sh[LT_MAX_DIMS], st[LT_MAX_DIMS];
  memcpy(sh, src->shape, sizeof sh);
  memcpy(st, src->stride, sizeof st);
  if (src->ndim > 0) {
    int64_t t = sh[a];
    sh[a] = sh[b], sh[b] = t;
    t = st[a];
    st[a] = st[b], st[b] = t;
  }
  return make_view(out, src, src->ndim, sh, st, 0);
}

int lt_permute(lt_tensor *out, const lt_tensor *src, int ndim, const int64_t *dims) {
  LT_TRY(lt_check_defined("permute", "input", src));
  if (ndim != src->ndim) return lt_errorf("permute: %d dims given for a %d-d tensor", ndim, src->ndim);
  if (ndim > 0 && !dims) return lt_errorf("permute: dims is NULL");
  int64_t sh[LT_MAX_DIMS], st[LT_MAX_DIMS];
  bool seen[LT_MAX_DIMS] = {false};
  for (int i = 0; i < ndim; i++) {
    int d;
    LT_TRY(lt_wrap_dim("permute", (int)dims[i], ndim, &d));
    if (seen[d]) return lt_errorf("permute: dim %d repeated", d);
    seen[d] = true;
    sh[i] = src->shape[d];
    st[i] = src->stride[d];
  }
  return make_view(out, src, ndim, sh, st, 0);
}

int lt_slice(lt_tensor *out, const lt_tensor *src, int dim, int64_t start, int64_t stop, int64_t step) {
  LT_TRY(lt_check_defined("slice", "input", src));
  if (src->ndim == 0) return lt_errorf("slice: cannot slice a 0-d tensor");
  int d;
  LT_TRY(lt_wrap_dim("slice", dim, src->ndim, &d));
  if (step <= 0) return lt_errorf("slice: step must be positive, got %lld", (long long)step);
  int64_t n = src->shape[d];
  if (start < 0) start += n;
  if (stop < 0) stop += n;
  if (start < 0) start = 0;
  if (stop > n) stop = n;
  if (start > n) start = n;
  if (stop < start) stop = start;
  int64_t sh[LT_MAX_DIMS], st[LT_MAX_DIMS];
  memcpy(sh, src->shape, sizeof sh);
  memcpy(st, src->stride, sizeof st);
  sh[d] = (stop - start + step - 1) / step;
  st[d] = src->stride[d] * step;
  return make_view(out, src, src->ndim, sh, st, start * src->stride[d]);
}

int lt_narrow(lt_tensor *out, const lt_tensor *src, int dim, int64_t start, int64_t length) {
  LT_TRY(lt_check_defined("narrow", "input", src));
  if (src->ndim == 0) return lt_errorf("narrow: cannot narrow a 0-d tensor");
  int d;
  LT_TRY(lt_wrap_dim("narrow", dim, src->ndim, &d));
  int64_t n = src->shape[d];
  if (start < 0) start += n;
  if (start < 0 || length < 0 || start + length > n)
    return lt_errorf("narrow: range [%lld, %lld) out of bounds for dim %d of size %lld", (long long)start,
                     (long long)(start + length), d, (long long)n);
  return lt_slice(out, src, d, start, start + length, 1);
}

int lt_select(lt_tensor *out, const lt_tensor *src, int dim, int64_t index) {
  LT_TRY(lt_check_defined("select", "input", src));
  if (src->ndim == 0) return lt_errorf("select: cannot index a 0-d tensor");
  int d;
  LT_TRY(lt_wrap_dim("select", dim, src->ndim, &d));
  int64_t n = src->shape[d], i = index < 0 ? index + n : index;
  if (i < 0 || i >= n)
    return lt_errorf("select: index %lld out of range for dim %d of size %lld", (long long)index, d, (long long)n);
  int64_t sh[LT_MAX_DIMS], st[LT_MAX_DIMS];
  int k = 0;
  for (int j = 0; j < src->ndim; j++)
    if (j != d) sh[k] = src->shape[j], st[k++] = src->stride[j];
  return make_view(out, src, src->ndim - 1, sh, st, i * src->stride[d]);
}

int lt_expand(lt_tensor *out, const lt_tensor *src, int ndim, const int64_t *shape) {
  LT_TRY(lt_check_defined("expand", "input", src));
  char a[LT_SHAPE_STR], b[LT_SHAPE_STR];
  if (ndim < src->ndim || ndim > LT_MAX_DIMS)
    return lt_errorf("expand: cannot expand shape %s to %d dims", lt_shape_str(a, src->ndim, src->shape), ndim);
  if (ndim > 0 && !shape) return lt_errorf("expand: shape is NULL");
  int64_t sh[LT_MAX_DIMS], st[LT_MAX_DIMS];
  for (int i = 0; i < ndim; i++) {
    int d = src->ndim - ndim + i;
    int64_t have = d >= 0 ? src->shape[d] : 1, want = shape[i];
    if (want == -1) {
      if (d < 0) return lt_errorf("expand: -1 not allowed for a new leading dim (%d)", i);
      want = have;
    }
    if (have == want) {
      sh[i] = want;
      st[i] = d >= 0 ? src->stride[d] : 0;
    } else if (have == 1 && want >= 0) {
      sh[i] = want;
      st[i] = 0;
    } else {
      return lt_errorf("expand: shape %s cannot expand to %s (dim %d: %lld vs %lld)",
                       lt_shape_str(a, src->ndim, src->shape), lt_shape_str(b, ndim, shape), i, (long long)have,
                       (long long)want);
    }
  }
  return make_view(out, src, ndim, sh, st, 0);
}

int lt_unsqueeze(lt_tensor *out, const lt_tensor *src, int dim) {
  LT_TRY(lt_check_defined("unsqueeze", "input", src));
  if (src->ndim >= LT_MAX_DIMS) return lt_errorf("unsqueeze: tensor already has %d dims", LT_MAX_DIMS);
  int n = src->ndim + 1;
  if (dim < -n || dim >= n) return lt_errorf("unsqueeze: dim %d out of range for a %d-d result", dim, n);
  int d = dim < 0 ? dim + n : dim;
  int64_t sh[LT_MAX_DIMS], st[LT_MAX_DIMS];
  for (int i = 0, j = 0; i < n; i++) {
    if (i == d) {
      sh[i] = 1;
      st[i] = j < src->ndim ? src->stride[j] * src->shape[j] : 1;
    } else {
      sh[i] = src->shape[j];
      st[i] = src->stride[j++];
    }
  }
  return make_view(out, src, n, sh, st, 0);
}

int lt_squeeze(lt_tensor *out, const lt_tensor *src, int dim) {
  LT_TRY(lt_check_defined("squeeze", "input", src));
  int d;
  LT_TRY(lt_wrap_dim("squeeze", dim, src->ndim, &d)); /* a 0-d tensor takes dim 0 or -1 */
  if (src->ndim == 0) return lt_set(out, src);
  if (src->shape[d] != 1) {
    char s[LT_SHAPE_STR];
    return lt_errorf("squeeze: dim %d of shape %s has size %lld, not 1", d, lt_shape_str(s, src->ndim, src->shape),
                     (long long)src->shape[d]);
  }
  return lt_select(out, src, d, 0);
}

int lt_squeeze_all(lt_tensor *out, const lt_tensor *src) {
  LT_TRY(lt_check_defined("squeeze", "input", src));
  int64_t sh[LT_MAX_DIMS], st[LT_MAX_DIMS];
  int n = 0;
  for (int d = 0; d < src->ndim; d++)
    if (src->shape[d] != 1) sh[n] = src->shape[d], st[n++] = src->stride[d];
  return make_view(out, src, n, sh, st, 0);
}

int lt_contiguous(lt_tensor *out, const lt_tensor *src) {
  LT_TRY(lt_check_defined("contiguous", "input", src));
  if (lt_is_contiguous(src)) return lt_set(out, src);
  if (out == src) return lt_errorf("contiguous: out must not be the input when a copy is needed");
  LT_TRY(lt_empty(out, src->ndim, src->shape, src->dtype, src->device));
  return lt_copy(out, src);
}
