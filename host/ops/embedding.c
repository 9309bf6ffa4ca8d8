/* embedding.c — embedding lookup on the CPU, forward and backward.
 *
 * weight (V, C), ids (...) I32/I64 -> out (..., C). Backward is deterministic: the
 * positions are grouped by id with a stable counting sort, then each row of dweight is
 * summed by one thread in position order, so the result does not depend on the thread
 * count (and rows never race). CUDA tensors go to kernels/embedding.cu, which sums in the same
 * order and gives the same bits. */
#include "core/internal.h"
#include "ops/device_tensors.h"
#include <stdio.h>
#include <stdlib.h>

/* Checks ids (any shape, I32/I64, on `like`'s device). */
static int check_ids(const char *op, const lt_tensor *ids, const lt_tensor *like) {
  char d[LT_DESC_STR];
  LT_TRY(lt_check_defined(op, "ids", ids));
  LT_TRY(lt_check_same_device(op, like, ids));
  if (ids->dtype != LT_I32 && ids->dtype != LT_I64)
    return lt_errorf("%s: ids is %s, expected i32 or i64", op, lt_desc(d, ids));
  if (ids->ndim >= LT_MAX_DIMS)
    return lt_errorf("%s: ids is %s: at most %d dims (out adds one)", op, lt_desc(d, ids), LT_MAX_DIMS - 1);
  return 0;
}

static int index_error(const char *op, int64_t id, int64_t V, int64_t pos) {
  return lt_errorf("%s: index %lld out of range [0, %lld) at position %lld", op, (long long)id, (long long)V,
                   (long long)pos);
}

/* Reads checked CPU ids in row-major order into a new int64 array, checking each is in [0, V).
 * NULL on error. */
static int64_t *read_ids(const char *op, const lt_tensor *ids, int64_t V) {
  int64_t n = lt_numel(ids);
  int64_t *v = malloc((size_t)(n > 0 ? n : 1) * sizeof(int64_t));
  if (!v) {
    lt_errorf("%s: out of host memory", op);
    return NULL;
  }
  if (lt_copy_to_buffer(ids, v, LT_I64, n)) {
    free(v);
    return NULL;
  }
  for (int64_t i = 0; i < n; i++)
    if (v[i] < 0 || v[i] >= V) {
      index_error(op, v[i], V, i);
      free(v);
      return NULL;
    }
  return v;
}

/* ids on a CUDA device, contiguous (a gathered copy when needed) and checked in [0, V) there
 * (one flag read back). NULL on error. */
static lt_tensor *cuda_ids(const lt_backend *be, const char *op, const lt_tensor *ids, int64_t V) {
  lt_tensor *ic = lt_nn_cuda_contiguous(ids);
  int64_t bad, id;
  if (!ic) return NULL;
  if (be->check_indices(op, ic->device, lt_data_ptr(ic), ic->dtype, 1, lt_numel(ic), V, 0, 0, &bad, &id) == 0) {
    if (bad < 0) return ic;
    index_error(op, id, V, bad);
  }
  lt_release(ic);
  return NULL;
}

static int forward_cuda(const lt_backend *be, lt_tensor *out, const lt_tensor *weight, const lt_tensor *ids, int ndim,
                        const int64_t *shape) {
  const char *op = "embedding";
  int64_t V = weight->shape[0], C = weight->shape[1];
  int rc = -1;
  lt_tensor *ic = cuda_ids(be, op, ids, V), *wc = NULL, *o = NULL;
  if (!ic) return -1;
  /* rows with unit column stride are read in place; other layouts are made contiguous */
  if (weight->stride[1] == 1 || C == 1) {
    if (!(wc = lt_tensor_new()) || lt_set(wc, weight)) goto done;
  } else if (!(wc = lt_nn_cuda_contiguous(weight))) {
    goto done;
  }
  if (!(o = lt_nn_cuda_out_begin(op, "out", out, ndim, shape, weight->dtype, weight->device))) goto done;
  rc = be->embedding_forward(weight->device, lt_data_ptr(o), lt_data_ptr(wc), wc->stride[0],
                             lt_dtype_size(weight->dtype), lt_data_ptr(ic), ic->dtype, lt_numel(ic), C);
done:
  rc = lt_nn_cuda_out_finish(out, o, rc);
  lt_release(ic), lt_release(wc);
  return rc;
}

static int backward_cuda(const lt_backend *be, lt_tensor *dweight, const lt_tensor *dout, const lt_tensor *ids) {
  const char *op = "embedding_backward";
  int64_t V = dweight->shape[0], C = dweight->shape[1];
  int rc = -1;
  lt_tensor *ic = cuda_ids(be, op, ids, V), *dc = NULL, *g = NULL;
  if (!ic) return -1;
  if (!(dc = lt_nn_cuda_contiguous(dout))) goto done;
  if (!(g = lt_nn_cuda_out_begin(op, "dweight", dweight, 2, dweight->shape, dweight->dtype, dweight->device)))
    goto done;
  rc = be->embedding_backward(dweight->device, dweight->dtype, lt_data_ptr(g), V, C, lt_data_ptr(dc), lt_data_ptr(ic),
                              ic->dtype, lt_numel(ic));
done:
  rc = lt_nn_cuda_out_finish(dweight, g, rc);
  lt_release(ic), lt_release(dc);
  return rc;
}

int lt_embedding_forward(lt_tensor *out, const lt_tensor *weight, const lt_tensor *ids) {
  const char *op = "embedding";
  char d[LT_DESC_STR];
  LT_TRY(lt_check_defined(op, "weight", weight));
  if (weight->ndim != 2) return lt_errorf("%s: weight is %s, expected (V, C)", op, lt_desc(d, weight));
  LT_TRY(check_ids(op, ids, weight));
  int64_t V = weight->shape[0], C = weight->shape[1], shape[LT_MAX_DIMS];
  memcpy(shape, ids->shape, (size_t)ids->ndim * sizeof(int64_t));
  shape[ids->ndim] = C;
  if (weight->device != LT_DEVICE_CPU) {
    const lt_backend *be = lt_backend_for(op, weight->device);
    return be ? forward_cuda(be, out, weight, ids, ids->ndim + 1, shape) : -1;
  }
  int64_t *id = read_ids(op, ids, V);
  if (!id) return -1;
  int64_t n = lt_numel(ids);
  int rc = -1, esize = lt_dtype_size(weight->dtype);
  lt_tensor *wc = lt_tensor_new(), *o = NULL;
  if (!wc) goto done;
  /* rows with unit column stride are read in place; other layouts are made contiguous */
  if (weight->stride[1] == 1 || C == 1 ? lt_set(wc, weight) : lt_contiguous(wc, weight)) goto done;
  if (!(o = lt_out_begin(op, "out", out, ids->ndim + 1, shape, weight->dtype))) goto done;
  const char *wp = lt_data_ptr(wc);
  char *op_ = lt_data_ptr(o);
  int64_t row_stride = wc->stride[0];
  size_t row_bytes = (size_t)(C * esize);
  if (n * C >= LT_PAR_GRAIN) { /* no omp construct for small work: see ew_execute */
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) memcpy(op_ + i * C * esize, wp + id[i] * row_stride * esize, row_bytes);
  } else {
    for (int64_t i = 0; i < n; i++) memcpy(op_ + i * C * esize, wp + id[i] * row_stride * esize, row_bytes);
  }
  rc = 0;
done:
  rc = lt_out_finish(out, o, rc);
  lt_release(wc);
  free(id);
  return rc;
}

/* dweight row v = sum of the dout rows of id v, in increasing position order; acc (C) is f32
 * scratch for 16-bit dtypes. */
static inline void grad_row(void *gp, int dtype, const void *dp, int64_t C, const int64_t *start, const int64_t *order,
                            int64_t v, float *acc) {
  if (dtype == LT_F32) {
    float *row = (float *)gp + v * C;
    memset(row, 0, (size_t)C * sizeof(float));
    for (int64_t k = start[v]; k < start[v + 1]; k++) {
      const float *src = (const float *)dp + order[k] * C;
      for (int64_t j = 0; j < C; j++) row[j] += src[j];
    }
  } else if (dtype == LT_F64) {
    double *row = (double *)gp + v * C;
    memset(row, 0, (size_t)C * sizeof(double));
    for (int64_t k = start[v]; k < start[v + 1]; k++) {
      const double *src = (const double *)dp + order[k] * C;
      for (int64_t j = 0; j < C; j++) row[j] += src[j];
    }
  } else { /* 16-bit: sum in f32, round once */
    memset(acc, 0, (size_t)C * sizeof(float));
    for (int64_t k = start[v]; k < start[v + 1]; k++) {
      const uint16_t *src = (const uint16_t *)dp + order[k] * C;
      if (dtype == LT_BF16)
        for (int64_t j = 0; j < C; j++) acc[j] += lt_bf16_to_f32(src[j]);
      else
        for (int64_t j = 0; j < C; j++) acc[j] += lt_f16_to_f32(src[j]);
    }
    uint16_t *row = (uint16_t *)gp + v * C;
    if (dtype == LT_BF16)
      for (int64_t j = 0; j < C; j++) row[j] = lt_f32_to_bf16(acc[j]);
    else
      for (int64_t j = 0; j < C; j++) row[j] = lt_f32_to_f16(acc[j]);
  }
}

int lt_embedding_backward(lt_tensor *dweight, const lt_tensor *dout, const lt_tensor *ids) {
  const char *op = "embedding_backward";
  char d1[LT_DESC_STR], d2[LT_DESC_STR];
  if (!dweight || !dweight->storage)
    return lt_errorf("%s: dweight must be a defined (V, C) tensor: the vocabulary size is not known from ids", op);
  LT_TRY(lt_check_defined(op, "dout", dout));
  LT_TRY(lt_check_same_device(op, dweight, dout));
  if (dweight->ndim != 2 || !lt_dtype_is_float(dweight->dtype))
    return lt_errorf("%s: dweight is %s, expected (V, C) floating", op, lt_desc(d1, dweight));
  LT_TRY(check_ids(op, ids, dweight));
  int64_t V = dweight->shape[0], C = dweight->shape[1];
  int dtype = dweight->dtype;
  bool shape_ok = dout->ndim == ids->ndim + 1 && dout->shape[ids->ndim] == C && dout->dtype == dtype;
  for (int k = 0; shape_ok && k < ids->ndim; k++) shape_ok = dout->shape[k] == ids->shape[k];
  if (!shape_ok) {
    char s[LT_SHAPE_STR];
    return lt_errorf("%s: dout is %s, expected ids' shape %s plus (C = %lld) and dweight's dtype (%s)", op,
                     lt_desc(d1, dout), lt_shape_str(s, ids->ndim, ids->shape), (long long)C, lt_desc(d2, dweight));
  }
  if (dweight->device != LT_DEVICE_CPU) {
    const lt_backend *be = lt_backend_for(op, dweight->device);
    return be ? backward_cuda(be, dweight, dout, ids) : -1;
  }
  int64_t *id = read_ids(op, ids, V);
  if (!id) return -1;
  int64_t n = lt_numel(ids);
  int rc = -1;
  int64_t *start = NULL, *order = NULL;
  lt_tensor *dc = lt_tensor_new(), *g = NULL;
  if (!dc || lt_contiguous(dc, dout)) goto done;
  if (!(g = lt_out_begin(op, "dweight", dweight, 2, dweight->shape, dtype))) goto done;
  /* stable counting sort: positions of id v are order[start[v] .. start[v+1]), increasing */
  start = calloc((size_t)(V + 1), sizeof(int64_t));
  order = malloc((size_t)(n > 0 ? n : 1) * sizeof(int64_t));
  if (!start || !order) {
    rc = lt_errorf("%s: out of host memory", op);
    goto done;
  }
  for (int64_t i = 0; i < n; i++) start[id[i] + 1]++;
  for (int64_t v = 0; v < V; v++) start[v + 1] += start[v];
  for (int64_t i = 0; i < n; i++) order[start[id[i]]++] = i;
  for (int64_t v = V; v > 0; v--) start[v] = start[v - 1]; /* the fill advanced start[v] to v's end */
  start[0] = 0;
  const void *dp = lt_data_ptr(dc);
  void *gp = lt_data_ptr(g);
  int failed = 0;
  bool need_acc = dtype == LT_BF16 || dtype == LT_F16;
  if ((n + V) * C >= LT_PAR_GRAIN) { /* no omp construct for small work: see ew_execute */
#pragma omp parallel
    {
      float *acc = need_acc ? malloc((size_t)(C > 0 ? C : 1) * sizeof(float)) : NULL;
      if (need_acc && !acc) {
#pragma omp atomic write
        failed = 1;
      }
#pragma omp for schedule(dynamic, 16)
      for (int64_t v = 0; v < V; v++)
        if (!need_acc || acc) grad_row(gp, dtype, dp, C, start, order, v, acc);
      free(acc);
    }
  } else {
    float *acc = need_acc ? malloc((size_t)(C > 0 ? C : 1) * sizeof(float)) : NULL;
    if (need_acc && !acc) failed = 1;
    for (int64_t v = 0; v < V && !failed; v++) grad_row(gp, dtype, dp, C, start, order, v, acc);
    free(acc);
  }
  rc = failed ? lt_errorf("%s: out of host memory", op) : 0;
done:
  rc = lt_out_finish(dweight, g, rc);
  lt_release(dc);
  free(id);
  free(start);
  free(order);
  return rc;
}
