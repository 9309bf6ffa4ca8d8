/* reduce_geom.h — the geometry of a reduction, shared by ops/reduce.c and ops/argmax.c.
 *
 * The input's dims (size-1 dims dropped) are sorted by input stride, largest first, then
 * split into kept and reduced dims, each group coalesced where strides allow. An output's
 * "kept-linear" index runs over the kept dims in that order; kout maps it to out's offset.
 * inner: the innermost (smallest stride) dim is reduced, so each output reduces runs along
 * memory; otherwise the innermost dim is kept and outputs accumulate whole rows. */
#ifndef LUTRA_REDUCE_GEOM_H
#define LUTRA_REDUCE_GEOM_H
#include "ops/backend.h"
#include <stdlib.h>

typedef struct reduce_geom {
  bool reduced[LT_MAX_DIMS]; /* per input dim */
  int64_t n_out, n_red;      /* output elements, elements reduced into each */
  int nkept, nred;           /* >= 1 each after reduce_geom_set_out (a size-1 dim stands in) */
  int64_t kshape[LT_MAX_DIMS], kstride[LT_MAX_DIMS], kout[LT_MAX_DIMS];
  int64_t rshape[LT_MAX_DIMS], rstride[LT_MAX_DIMS];
  bool inner;
} reduce_geom;

/* Marks the reduced dims (ndims == 0: all); errors on bad, out-of-range or repeated dims. */
static inline int reduce_geom_plan(const char *op, reduce_geom *g, const lt_tensor *a, int ndims, const int64_t *dims) {
  memset(g, 0, sizeof *g);
  if (ndims < 0 || ndims > LT_MAX_DIMS) return lt_errorf("%s: %d dims given, expected 0 to %d", op, ndims, LT_MAX_DIMS);
  if (ndims > 0 && !dims) return lt_errorf("%s: dims is NULL", op);
  bool seen[LT_MAX_DIMS] = {false};
  for (int i = 0; i < ndims; i++) {
    int d;
    if (dims[i] < INT32_MIN || dims[i] > INT32_MAX)
      return lt_errorf("%s: dim %lld out of range for a %d-d tensor", op, (long long)dims[i], a->ndim);
    LT_TRY(lt_wrap_dim(op, (int)dims[i], a->ndim, &d));
    if (seen[d]) return lt_errorf("%s: dim %d appears more than once in dims", op, d);
    seen[d] = true;
    if (a->ndim > 0) g->reduced[d] = true;
  }
  g->n_out = g->n_red = 1;
  for (int d = 0; d < a->ndim; d++) {
    if (ndims == 0) g->reduced[d] = true;
    if (g->reduced[d])
      g->n_red *= a->shape[d];
    else
      g->n_out *= a->shape[d];
  }
  return 0;
}

/* The output shape for the reduced dims; returns its ndim. */
static inline int reduce_out_shape(const lt_tensor *a, const bool *reduced, int keepdim, int64_t *shape) {
  int n = 0;
  for (int d = 0; d < a->ndim; d++) {
    if (!reduced[d])
      shape[n++] = a->shape[d];
    else if (keepdim)
      shape[n++] = 1;
  }
  return n;
}

/* Sorts, splits and coalesces the dims once out (already prepared) gives the output strides. */
static inline void reduce_geom_set_out(reduce_geom *g, const lt_tensor *a, const lt_tensor *out, int keepdim) {
  struct {
    int64_t size, in, out;
    bool red;
  } d[LT_MAX_DIMS], tmp;
  int n = 0, od = 0;
  for (int i = 0; i < a->ndim; i++) {
    int64_t ostride = 0;
    if (!g->reduced[i])
      ostride = out->stride[od++];
    else if (keepdim)
      od++;
    if (a->shape[i] == 1) continue;
    d[n].size = a->shape[i], d[n].in = a->stride[i], d[n].out = ostride, d[n].red = g->reduced[i];
    n++;
  }
  for (int i = 1; i < n; i++) /* stable insertion sort, largest input stride first */
    for (int j = i; j > 0 && llabs(d[j].in) > llabs(d[j - 1].in); j--) tmp = d[j], d[j] = d[j - 1], d[j - 1] = tmp;
  g->inner = n > 0 && d[n - 1].red;
  g->nkept = g->nred = 0;
  for (int i = 0; i < n; i++) {
    if (d[i].red) {
      int k = g->nred;
      if (k > 0 && g->rstride[k - 1] == d[i].in * d[i].size) {
        g->rshape[k - 1] *= d[i].size, g->rstride[k - 1] = d[i].in;
      } else {
        g->rshape[k] = d[i].size, g->rstride[k] = d[i].in, g->nred++;
      }
    } else {
      int k = g->nkept;
      if (k > 0 && g->kstride[k - 1] == d[i].in * d[i].size && g->kout[k - 1] == d[i].out * d[i].size) {
        g->kshape[k - 1] *= d[i].size, g->kstride[k - 1] = d[i].in, g->kout[k - 1] = d[i].out;
      } else {
        g->kshape[k] = d[i].size, g->kstride[k] = d[i].in, g->kout[k] = d[i].out, g->nkept++;
      }
    }
  }
  if (g->nkept == 0) g->kshape[0] = 1, g->kstride[0] = 0, g->kout[0] = 0, g->nkept = 1;
  if (g->nred == 0) g->rshape[0] = 1, g->rstride[0] = 0, g->nred = 1;
}

/* 0 when the op can run on t's device here: the CPU, or an available CUDA device in a CUDA
 * build; else the error, naming op. */
static inline int lt_reduce_check_device(const char *op, const lt_tensor *t) {
  const char *absent = "%s: not implemented on cuda yet: lutra was built without CUDA";
  return lt_backend_lookup(op, t->device, absent, true) ? 0 : -1;
}

/* The plan as kernels/reduce.cu takes it. */
static inline void reduce_geom_to_cuda(const reduce_geom *g, lt_cuda_red_geom *c) {
  memset(c, 0, sizeof *c);
  c->n_out = g->n_out, c->n_red = g->n_red;
  c->nkept = g->nkept, c->nred = g->nred, c->inner = g->inner;
  memcpy(c->kshape, g->kshape, sizeof c->kshape);
  memcpy(c->kstride, g->kstride, sizeof c->kstride);
  memcpy(c->kout, g->kout, sizeof c->kout);
  memcpy(c->rshape, g->rshape, sizeof c->rshape);
  memcpy(c->rstride, g->rstride, sizeof c->rstride);
}

/* Walks flat indices over (n, shape) keeping the element offset under stride. */
typedef struct reduce_odometer {
  int n;
  int64_t idx[LT_MAX_DIMS];
  const int64_t *shape, *stride;
  int64_t offset;
} reduce_odometer;

static inline void reduce_odometer_start(reduce_odometer *it, int n, const int64_t *shape, const int64_t *stride,
                                         int64_t flat) {
  it->n = n, it->shape = shape, it->stride = stride, it->offset = 0;
  for (int d = n - 1; d >= 0; d--) { /* flat == 0 never divides: shapes may hold a 0 */
    it->idx[d] = flat ? flat % shape[d] : 0;
    if (flat) flat /= shape[d];
    it->offset += it->idx[d] * stride[d];
  }
}

static inline void reduce_odometer_next(reduce_odometer *it) {
  for (int d = it->n - 1; d >= 0; d--) {
    it->offset += it->stride[d];
    if (++it->idx[d] < it->shape[d]) return;
    it->offset -= it->idx[d] * it->stride[d];
    it->idx[d] = 0;
  }
}
#endif
