/* fused_rows.c — what the fused CPU kernels (norms, cross-entropy, embedding, optimizer
 * steps) share: float rows of 16-bit data, contiguous work buffers for outputs of any
 * layout, and the in-place updates of the optimizer steps. */
#include "core/internal.h"
#include <stdio.h>

const float *lt_load_row_f32(const void *base, int dtype, int64_t off, int64_t n, float *scratch) {
  if (dtype == LT_F32) return (const float *)base + off;
  const uint16_t *h = (const uint16_t *)base + off;
  if (dtype == LT_BF16)
    for (int64_t j = 0; j < n; j++) scratch[j] = lt_bf16_to_f32(h[j]);
  else
    for (int64_t j = 0; j < n; j++) scratch[j] = lt_f16_to_f32(h[j]);
  return scratch;
}

void lt_store_row_f32(void *base, int dtype, int64_t off, const float *src, int64_t n) {
  uint16_t *h = (uint16_t *)base + off;
  if (dtype == LT_BF16)
    for (int64_t j = 0; j < n; j++) h[j] = lt_f32_to_bf16(src[j]);
  else if (dtype == LT_F16)
    for (int64_t j = 0; j < n; j++) h[j] = lt_f32_to_f16(src[j]);
}

lt_tensor *lt_out_begin(const char *op, const char *what, lt_tensor *out, int ndim, const int64_t *shape, int dtype) {
  char name[96]; /* errors name the output: "layer_norm (rstd): out is ..." */
  snprintf(name, sizeof name, "%s (%s)", op, what);
  if (lt_prepare_out(strcmp(what, "out") ? name : op, out, ndim, shape, dtype, LT_DEVICE_CPU)) return NULL;
  if (lt_is_contiguous(out)) return lt_retain(out), out;
  for (int d = 0; d < out->ndim; d++)
    if (out->stride[d] == 0 && out->shape[d] > 1) {
      lt_errorf("%s: out is an expanded view (its elements overlap)", strcmp(what, "out") ? name : op);
      return NULL;
    }
  lt_tensor *t = lt_tensor_new();
  if (t && lt_empty(t, ndim, shape, dtype, LT_DEVICE_CPU) == 0) return t;
  lt_release(t);
  return NULL;
}

int lt_out_finish(lt_tensor *out, lt_tensor *work, int rc) {
  if (!work) return rc;
  if (rc == 0 && work != out) rc = lt_copy(out, work);
  lt_release(work);
  return rc;
}

lt_tensor *lt_begin_inplace(lt_tensor *t) {
  lt_tensor *c = lt_tensor_new();
  if (c && lt_contiguous(c, t) == 0) return c;
  lt_release(c);
  return NULL;
}

int lt_finish_inplace(lt_tensor *t, lt_tensor *c, int rc) {
  if (!c) return rc;
  if (rc == 0 && lt_data_ptr(c) != lt_data_ptr(t)) rc = lt_copy(t, c);
  lt_release(c);
  return rc;
}
