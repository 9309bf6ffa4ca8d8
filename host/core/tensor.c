/* tensor.c — tensor lifecycle, geometry helpers, output preparation, element access. */
#include "core/device.h"
#include <stdio.h>
#include <stdlib.h>

lt_tensor *lt_tensor_new(void) {
  lt_tensor *t = calloc(1, sizeof *t);
  if (!t) {
    lt_errorf("tensor_new: out of host memory");
    return NULL;
  }
  t->refcount = 1;
  t->device = LT_DEVICE_CPU;
  return t;
}

int lt_retain(lt_tensor *t) {
  if (!t) return lt_errorf("retain: tensor is NULL");
  __atomic_add_fetch(&t->refcount, 1, __ATOMIC_RELAXED);
  return 0;
}

int lt_release(lt_tensor *t) {
  if (!t) return 0;
  if (__atomic_sub_fetch(&t->refcount, 1, __ATOMIC_ACQ_REL) > 0) return 0;
  lt_storage_release(t->storage);
  free(t);
  return 0;
}

int lt_free_storage(lt_tensor *t) {
  if (!t) return lt_errorf("free_storage: tensor is NULL");
  lt_storage_release(t->storage);
  t->storage = NULL;
  t->offset = 0;
  return 0;
}

int lt_is_defined(const lt_tensor *t) { return t && t->storage; }

int64_t lt_shape_numel(int ndim, const int64_t *shape) {
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) n *= shape[d];
  return n;
}

int64_t lt_numel(const lt_tensor *t) { return t && t->storage ? lt_shape_numel(t->ndim, t->shape) : 0; }

void lt_contiguous_strides(int ndim, const int64_t *shape, int64_t *stride) {
  int64_t s = 1;
  for (int d = ndim - 1; d >= 0; d--) {
    stride[d] = s;
    s *= shape[d] > 0 ? shape[d] : 1;
  }
}

int lt_is_contiguous(const lt_tensor *t) {
  if (!t) return 0;
  if (lt_shape_numel(t->ndim, t->shape) == 0) return 1; /* no element to misplace (as PyTorch) */
  int64_t s = 1;
  for (int d = t->ndim - 1; d >= 0; d--) {
    if (t->shape[d] != 1 && t->stride[d] != s) return 0;
    s *= t->shape[d];
  }
  return 1;
}

bool lt_same_shape(const lt_tensor *a, const lt_tensor *b) {
  if (a->ndim != b->ndim) return false;
  for (int d = 0; d < a->ndim; d++)
    if (a->shape[d] != b->shape[d]) return false;
  return true;
}

void *lt_data_ptr(const lt_tensor *t) {
  if (!t || !t->storage) return NULL;
  return (char *)t->storage->data + t->offset;
}

static int check_shape(const char *op, int ndim, const int64_t *shape) {
  if (ndim < 0 || ndim > LT_MAX_DIMS)
    return lt_errorf("%s: %d dims requested, at most %d supported", op, ndim, LT_MAX_DIMS);
  if (ndim > 0 && !shape) return lt_errorf("%s: shape is NULL", op);
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) {
    char s[LT_SHAPE_STR];
    if (shape[d] < 0) return lt_errorf("%s: negative size in shape %s", op, lt_shape_str(s, ndim, shape));
    if (shape[d] && n > INT64_MAX / 16 / shape[d])
      return lt_errorf("%s: shape %s is too large", op, lt_shape_str(s, ndim, shape));
    n *= shape[d];
  }
  return 0;
}

/* A fresh contiguous tensor on device whose storage comes from storage_device (the
 * same, or LT_STORAGE_PINNED for a CPU tensor in page-locked memory). */
static int empty_on(const char *op, lt_tensor *out, int ndim, const int64_t *shape, int dtype, int device,
                    int storage_device) {
  if (!out) return lt_errorf("%s: out is NULL", op);
  LT_TRY(check_shape(op, ndim, shape));
  if (lt_dtype_size(dtype) == 0) return lt_errorf("%s: unknown dtype %d", op, dtype);
  int64_t nbytes = lt_shape_numel(ndim, shape) * lt_dtype_size(dtype);
  lt_storage *s = lt_storage_alloc(op, nbytes, storage_device);
  if (!s) return -1;
  lt_storage_release(out->storage);
  out->storage = s;
  out->offset = 0;
  out->ndim = ndim;
  for (int d = 0; d < ndim; d++) out->shape[d] = shape[d];
  lt_contiguous_strides(ndim, shape, out->stride);
  out->dtype = dtype;
  out->device = device;
  return 0;
}

int lt_empty(lt_tensor *out, int ndim, const int64_t *shape, int dtype, int device) {
  return empty_on("empty", out, ndim, shape, dtype, device, device);
}

int lt_empty_pinned(lt_tensor *out, int ndim, const int64_t *shape, int dtype) {
  return empty_on("empty_pinned", out, ndim, shape, dtype, LT_DEVICE_CPU, LT_STORAGE_PINNED);
}

int lt_is_pinned(const lt_tensor *t) { return lt_is_defined(t) && t->storage->device == LT_STORAGE_PINNED; }

int lt_set(lt_tensor *out, const lt_tensor *src) {
  if (!out) return lt_errorf("set: out is NULL");
  LT_TRY(lt_check_defined("set", "source", src));
  if (out == src) return 0;
  __atomic_add_fetch(&src->storage->refcount, 1, __ATOMIC_RELAXED);
  lt_storage_release(out->storage);
  out->storage = src->storage;
  out->offset = src->offset;
  out->ndim = src->ndim;
  memcpy(out->shape, src->shape, sizeof out->shape);
  memcpy(out->stride, src->stride, sizeof out->stride);
  out->dtype = src->dtype;
  out->device = src->device;
  return 0;
}

int lt_prepare_out(const char *op, lt_tensor *out, int ndim, const int64_t *shape, int dtype, int device) {
  if (!out) return lt_errorf("%s: out is NULL", op);
  if (!out->storage) {
    if (lt_empty(out, ndim, shape, dtype, device) == 0) return 0;
    char why[512]; /* the message is re-prefixed: copy it out of the buffer lt_errorf writes to */
    snprintf(why, sizeof why, "%s", lt_last_error());
    return lt_errorf("%s: %s", op, why);
  }
  char want[LT_SHAPE_STR], have[LT_DESC_STR], dev[16];
  bool same = out->ndim == ndim && out->dtype == dtype && out->device == device;
  for (int d = 0; same && d < ndim; d++) same = out->shape[d] == shape[d];
  if (same) return 0;
  return lt_errorf("%s: out is %s, expected %s %s %s", op, lt_desc(have, out), lt_shape_str(want, ndim, shape),
                   lt_dtype_name(dtype), lt_device_str(dev, device));
}

int lt_prepare_out_like(const char *op, lt_tensor *out, const lt_tensor *like, int dtype) {
  return lt_prepare_out(op, out, like->ndim, like->shape, dtype, like->device);
}

int lt_broadcast_shape(int ndim_a, const int64_t *shape_a, int ndim_b, const int64_t *shape_b, int *ndim_out,
                       int64_t *shape_out) {
  int n = ndim_a > ndim_b ? ndim_a : ndim_b;
  for (int i = 0; i < n; i++) {
    int da = ndim_a - n + i, db = ndim_b - n + i;
    int64_t sa = da >= 0 ? shape_a[da] : 1, sb = db >= 0 ? shape_b[db] : 1;
    if (sa != sb && sa != 1 && sb != 1) {
      char a[LT_SHAPE_STR], b[LT_SHAPE_STR];
      return lt_errorf("broadcast: shapes %s and %s are not broadcastable (dim %d: %lld vs %lld)",
                       lt_shape_str(a, ndim_a, shape_a), lt_shape_str(b, ndim_b, shape_b), i, (long long)sa,
                       (long long)sb);
    }
    shape_out[i] = sa == 1 ? sb : sa;
  }
  *ndim_out = n;
  return 0;
}

void lt_broadcast_strides(const lt_tensor *t, int ndim, const int64_t *shape, int64_t *stride) {
  for (int i = 0; i < ndim; i++) {
    int d = t->ndim - ndim + i;
    stride[i] = (d < 0 || (t->shape[d] == 1 && shape[i] != 1)) ? 0 : t->stride[d];
  }
}

/* ---- strided loops ---------------------------------------------------------------- */

void lt_loop_init(lt_strided_loop *L, int ndim, const int64_t *shape, int noperands, const int64_t *const *strides) {
  L->noperands = noperands;
  int n = 0;
  /* drop size-1 dims, then merge dim d into d+1 when every operand is contiguous across them */
  for (int d = 0; d < ndim; d++) {
    if (shape[d] == 1) continue;
    L->shape[n] = shape[d];
    for (int k = 0; k < noperands; k++) L->stride[k][n] = strides[k][d];
    if (n > 0) {
      bool merge = true;
      for (int k = 0; k < noperands; k++) merge &= L->stride[k][n - 1] == L->stride[k][n] * L->shape[n];
      if (merge) {
        L->shape[n - 1] *= L->shape[n];
        for (int k = 0; k < noperands; k++) L->stride[k][n - 1] = L->stride[k][n];
        continue;
      }
    }
    n++;
  }
  if (n == 0) { /* a single element */
    L->shape[0] = 1;
    for (int k = 0; k < noperands; k++) L->stride[k][0] = 0;
    n = 1;
  }
  L->ndim = n;
}

int64_t lt_loop_outer_rows(const lt_strided_loop *L) { return lt_shape_numel(L->ndim - 1, L->shape); }

void lt_loop_row_offsets(const lt_strided_loop *L, int64_t r, int64_t *offsets) {
  for (int k = 0; k < L->noperands; k++) offsets[k] = 0;
  for (int d = L->ndim - 2; d >= 0; d--) {
    int64_t n = L->shape[d], i = r % n;
    r /= n;
    for (int k = 0; k < L->noperands; k++) offsets[k] += i * L->stride[k][d];
  }
}

/* ---- element access ------------------------------------------------------------------ */

static int element_offset(const char *op, const lt_tensor *t, const int64_t *index, int64_t *off) {
  LT_TRY(lt_check_defined(op, "tensor", t));
  if (t->ndim > 0 && !index) return lt_errorf("%s: index is NULL", op);
  if (t->device != LT_DEVICE_CPU && !lt_device_cuda()) {
    char d[16];
    return lt_errorf("%s: tensor is on %s, and lutra was built without CUDA", op, lt_device_str(d, t->device));
  }
  int64_t o = 0;
  for (int d = 0; d < t->ndim; d++) {
    int64_t i = index[d];
    if (i < 0 || i >= t->shape[d]) {
      char s[LT_SHAPE_STR];
      return lt_errorf("%s: index %lld out of range for dim %d of shape %s", op, (long long)i, d,
                       lt_shape_str(s, t->ndim, t->shape));
    }
    o += i * t->stride[d];
  }
  *off = o;
  return 0;
}

/* One element of a CUDA tensor goes through a small synchronous copy (as torch's t[i]:
 * fine for a REPL or a test, slow in a loop). */
int lt_get_at(const lt_tensor *t, const int64_t *index, double *value) {
  int64_t off;
  LT_TRY(element_offset("get", t, index, &off));
  if (t->device != LT_DEVICE_CPU) { /* element_offset found the device table */
    unsigned char raw[8];
    int64_t size = lt_dtype_size(t->dtype);
    LT_TRY(lt_device_cuda()->copy_bytes(raw, LT_DEVICE_CPU, (char *)lt_data_ptr(t) + off * size, t->device, size));
    *value = lt_load_f64(raw, t->dtype, 0);
    return 0;
  }
  *value = lt_load_f64(lt_data_ptr(t), t->dtype, off);
  return 0;
}

int lt_set_at(lt_tensor *t, const int64_t *index, double value) {
  int64_t off;
  LT_TRY(element_offset("set", t, index, &off));
  if (t->device != LT_DEVICE_CPU) { /* element_offset found the device table */
    unsigned char raw[8];
    int64_t size = lt_dtype_size(t->dtype);
    lt_store_f64(raw, t->dtype, 0, value);
    return lt_device_cuda()->copy_bytes((char *)lt_data_ptr(t) + off * size, t->device, raw, LT_DEVICE_CPU, size);
  }
  lt_store_f64(lt_data_ptr(t), t->dtype, off, value);
  return 0;
}

int lt_item(const lt_tensor *t, double *value) {
  LT_TRY(lt_check_defined("item", "tensor", t));
  if (lt_numel(t) != 1) {
    char s[LT_SHAPE_STR];
    return lt_errorf("item: tensor of shape %s has %lld elements, expected exactly 1",
                     lt_shape_str(s, t->ndim, t->shape), (long long)lt_numel(t));
  }
  const lt_device_runtime *rt = lt_device_cuda(); /* without it, lt_get_at refuses a device tensor */
  if (t->device != LT_DEVICE_CPU && rt) {
    double buf[1];
    unsigned char raw[8];
    LT_TRY(rt->copy_bytes(raw, LT_DEVICE_CPU, lt_data_ptr(t), t->device, lt_dtype_size(t->dtype)));
    buf[0] = lt_load_f64(raw, t->dtype, 0);
    *value = buf[0];
    return 0;
  }
  int64_t zeros[LT_MAX_DIMS] = {0};
  return lt_get_at(t, zeros, value);
}
