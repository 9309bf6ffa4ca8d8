/* device_tensors.h — contiguous work tensors on a CUDA device for the fronts that hand
 * contiguous rows to their kernels (ops/cross_entropy.c, ops/embedding.c). Called only for
 * tensors on a device of a CUDA build (the front has checked), so lt_backend_for finds the CUDA
 * table. */
#ifndef LUTRA_OPS_DEVICE_TENSORS_H
#define LUTRA_OPS_DEVICE_TENSORS_H
#include "ops/backend.h"
#include <stdio.h>

/* t's values in a contiguous tensor on t's device: t itself (retained) when contiguous, else a
 * gathered copy. Release the result. NULL on error. */
static inline lt_tensor *lt_nn_cuda_contiguous(const lt_tensor *t) {
  lt_tensor *c = lt_tensor_new();
  if (!c) return NULL;
  if (lt_is_contiguous(t)) {
    if (lt_set(c, t) == 0) return c;
    lt_release(c);
    return NULL;
  }
  int64_t stride[LT_MAX_DIMS];
  lt_contiguous_strides(t->ndim, t->shape, stride);
  if (lt_empty(c, t->ndim, t->shape, t->dtype, t->device) == 0 &&
      lt_backend_for("contiguous", t->device)
              ->strided_copy(t->device, lt_data_ptr(c), stride, lt_data_ptr(t), t->stride, t->ndim, t->shape,
                             t->dtype) == 0)
    return c;
  lt_release(c);
  return NULL;
}

/* t (numel n, any layout, any floating dtype, on a CUDA device) as a new contiguous (n) tensor of
 * `dtype` on the same device. NULL on error. */
static inline lt_tensor *lt_nn_cuda_values(const lt_tensor *t, int dtype) {
  if (t->dtype == dtype && lt_is_contiguous(t)) return lt_nn_cuda_contiguous(t); /* t itself */
  lt_tensor *c = lt_nn_cuda_contiguous(t), *v = lt_tensor_new();
  int64_t n = lt_numel(t);
  int rc = !c || !v ? -1 : lt_empty(v, 1, &n, dtype, t->device);
  if (rc == 0)
    rc = lt_backend_for("convert", t->device)
             ->convert_contig(t->device, lt_data_ptr(v), dtype, lt_data_ptr(c), c->dtype, n);
  lt_release(c);
  if (rc == 0) return v;
  lt_release(v);
  return NULL;
}

/* As lt_out_begin (host/ops/fused_rows.c) on a CUDA device: `out` itself when contiguous (allocated
 * when undefined), else a contiguous work tensor that lt_nn_cuda_out_finish scatters back. */
static inline lt_tensor *lt_nn_cuda_out_begin(const char *op, const char *what, lt_tensor *out, int ndim,
                                              const int64_t *shape, int dtype, int device) {
  char name[96];
  snprintf(name, sizeof name, "%s (%s)", op, what);
  const char *label = strcmp(what, "out") ? name : op;
  if (lt_prepare_out(label, out, ndim, shape, dtype, device)) return NULL;
  if (lt_is_contiguous(out)) return lt_retain(out), out;
  for (int d = 0; d < out->ndim; d++)
    if (out->stride[d] == 0 && out->shape[d] > 1) {
      lt_errorf("%s: out is an expanded view (its elements overlap)", label);
      return NULL;
    }
  lt_tensor *t = lt_tensor_new();
  if (t && lt_empty(t, ndim, shape, dtype, device) == 0) return t;
  lt_release(t);
  return NULL;
}

static inline int lt_nn_cuda_out_finish(lt_tensor *out, lt_tensor *work, int rc) {
  if (!work) return rc;
  if (rc == 0 && work != out) {
    int64_t stride[LT_MAX_DIMS];
    lt_contiguous_strides(work->ndim, work->shape, stride);
    rc = lt_backend_for("copy", out->device)
             ->strided_copy(out->device, lt_data_ptr(out), out->stride, lt_data_ptr(work), stride, out->ndim,
                            out->shape, out->dtype);
  }
  lt_release(work);
  return rc;
}
#endif
