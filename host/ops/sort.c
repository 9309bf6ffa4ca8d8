/* sort.c — sort and argsort along one dim, the rows topk shares (host/ops/topk.c), and the
 * backward of both: the gradient scattered back to the indices.
 *
 * Order (kernels/sort.h): by value, NaN greater than every number, equal values by index,
 * lower first. That makes the order total, so a plain comparison sort (qsort) gives the stable
 * order and the CUDA kernel's bitonic network the same one. Floats are compared as doubles
 * (exact for every float dtype), integers as int64. The CPU sorts one row per thread.
 * CUDA tensors take the same checks and plan, then kernels/sort.cu. */
#include "ops/along_dim.h"
#include "ops/backend.h"
#include "ops/sort_rows.h"
#include <stdlib.h>

typedef struct sort_key {
  double f;
  int64_t i, idx;
} sort_key;

static int by_idx(const sort_key *a, const sort_key *b) { return (a->idx > b->idx) - (a->idx < b->idx); }

static int float_asc(const void *pa, const void *pb) {
  const sort_key *a = pa, *b = pb;
  int an = a->f != a->f, bn = b->f != b->f;
  if (an != bn) return an - bn;
  if (!an && a->f != b->f) return a->f < b->f ? -1 : 1;
  return by_idx(a, b);
}
static int float_desc(const void *pa, const void *pb) {
  const sort_key *a = pa, *b = pb;
  int an = a->f != a->f, bn = b->f != b->f;
  if (an != bn) return bn - an;
  if (!an && a->f != b->f) return a->f > b->f ? -1 : 1;
  return by_idx(a, b);
}
static int int_asc(const void *pa, const void *pb) {
  const sort_key *a = pa, *b = pb;
  if (a->i != b->i) return a->i < b->i ? -1 : 1;
  return by_idx(a, b);
}
static int int_desc(const void *pa, const void *pb) {
  const sort_key *a = pa, *b = pb;
  if (a->i != b->i) return a->i > b->i ? -1 : 1;
  return by_idx(a, b);
}

static void sort_row(const lt_sort_plan *p, int64_t r, sort_key *keys) {
  bool is_float = lt_dtype_is_float(p->dtype);
  int64_t xo = lt_offset_of(r, p->nkept, p->kshape, p->xk);
  int64_t vo = lt_offset_of(r, p->nkept, p->kshape, p->vk);
  int64_t io = lt_offset_of(r, p->nkept, p->kshape, p->ik);
  for (int64_t j = 0; j < p->n; j++) {
    keys[j].idx = j;
    if (is_float)
      keys[j].f = lt_load_f64(p->x, p->dtype, xo + j * p->xd);
    else
      keys[j].i = lt_load_i64(p->x, p->dtype, xo + j * p->xd);
  }
  int (*cmp)(const void *, const void *) =
      is_float ? (p->descending ? float_desc : float_asc) : (p->descending ? int_desc : int_asc);
  qsort(keys, (size_t)p->n, sizeof *keys, cmp);
  int esize = lt_dtype_size(p->dtype);
  for (int64_t j = 0; j < p->k; j++) {
    /* the value's own bits: no round trip through double for integers */
    memcpy((char *)p->values + (vo + j * p->vd) * esize, (const char *)p->x + (xo + keys[j].idx * p->xd) * esize,
           esize);
    p->indices[io + j * p->id] = keys[j].idx;
  }
}

static int sort_cpu(const char *op, const lt_sort_plan *p) {
  int failed = 0;
#pragma omp parallel if (p->rows > 1 && p->rows * p->n >= LT_PAR_GRAIN)
  {
    sort_key *keys = malloc(sizeof(sort_key) * (size_t)(p->n ? p->n : 1));
    if (!keys) {
#pragma omp atomic write
      failed = 1;
    }
#pragma omp for schedule(dynamic, 16)
    for (int64_t r = 0; r < p->rows; r++)
      if (keys) sort_row(p, r, keys);
    free(keys);
  }
  return failed ? lt_errorf("%s: out of host memory", op) : 0;
}

int lt_sort_rows(const char *op, lt_tensor *values, lt_tensor *indices, const lt_tensor *x, int dim, int64_t k,
                 int descending) {
  int64_t oshape[LT_MAX_DIMS];
  memcpy(oshape, x->shape, sizeof oshape);
  if (x->ndim) oshape[dim] = k;
  LT_TRY(lt_prepare_out(op, values, x->ndim, oshape, x->dtype, x->device));
  LT_TRY(lt_prepare_out(op, indices, x->ndim, oshape, LT_I64, x->device));
  lt_sort_plan p;
  memset(&p, 0, sizeof p);
  p.device = x->device, p.dtype = x->dtype, p.descending = descending != 0;
  p.nkept = along_dim_kept(x, dim, p.kshape, &p.rows);
  p.n = x->ndim ? x->shape[dim] : 1, p.k = k;
  p.x = lt_data_ptr(x), p.values = lt_data_ptr(values), p.indices = lt_data_ptr(indices);
  along_dim_strides(x, dim, p.xk, &p.xd);
  along_dim_strides(values, dim, p.vk, &p.vd);
  along_dim_strides(indices, dim, p.ik, &p.id);
  if (p.rows == 0 || k == 0) return 0;
  if (x->device == LT_DEVICE_CPU) return sort_cpu(op, &p);
  const lt_backend *be = lt_backend_for(op, x->device);
  if (!be) return -1;
  return be->sort(op, &p);
}

int lt_sort_check(const char *op, const lt_tensor *x, int dim, int *wrapped) {
  LT_TRY(lt_check_defined(op, "x", x));
  if (x->dtype < 0 || x->dtype >= LT_NUM_DTYPES || x->dtype == LT_BOOL)
    return lt_errorf("%s: x must be a float or integer tensor, got %s", op, lt_desc((char[96]){0}, x));
  return lt_wrap_dim(op, dim, x->ndim, wrapped);
}

int lt_sort(lt_tensor *values, lt_tensor *indices, const lt_tensor *x, int dim, int descending) {
  int d;
  LT_TRY(lt_sort_check("sort", x, dim, &d));
  return lt_sort_rows("sort", values, indices, x, d, x->ndim ? x->shape[d] : 1, descending);
}

/* ---- backward: the gradient back to the places the values came from --------------------- */

static void scatter_row(const lt_sort_backward_plan *p, int64_t r) {
  int64_t go = lt_offset_of(r, p->nkept, p->kshape, p->gk);
  int64_t gi = lt_offset_of(r, p->nkept, p->kshape, p->gk_in);
  int64_t io = lt_offset_of(r, p->nkept, p->kshape, p->ik);
  int esize = lt_dtype_size(p->dtype);
  for (int64_t j = 0; j < p->k; j++)
    memcpy((char *)p->grad_in + (gi + p->indices[io + j * p->id] * p->gd_in) * esize,
           (const char *)p->grad_out + (go + j * p->gd) * esize, esize);
}

int lt_sort_backward(lt_tensor *grad_in, const lt_tensor *grad_out, const lt_tensor *indices, int dim, int64_t n) {
  const char *op = "sort_backward";
  char b1[96], b2[96];
  LT_TRY(lt_check_defined(op, "grad_out", grad_out));
  LT_TRY(lt_check_defined(op, "indices", indices));
  LT_TRY(lt_check_same_device(op, grad_out, indices));
  int d;
  LT_TRY(lt_wrap_dim(op, dim, grad_out->ndim, &d));
  if (indices->dtype != LT_I64 || !lt_same_shape(grad_out, indices))
    return lt_errorf("%s: indices must be i64 of grad_out's shape %s, got %s", op, lt_desc(b1, grad_out),
                     lt_desc(b2, indices));
  int64_t k = grad_out->ndim ? grad_out->shape[d] : 1;
  if (n < k || (grad_out->ndim == 0 && n != 1))
    return lt_errorf("%s: n %lld is shorter than grad_out's %lld results", op, (long long)n, (long long)k);
  int64_t ishape[LT_MAX_DIMS];
  memcpy(ishape, grad_out->shape, sizeof ishape);
  if (grad_out->ndim) ishape[d] = n;
  LT_TRY(lt_prepare_out(op, grad_in, grad_out->ndim, ishape, grad_out->dtype, grad_out->device));
  lt_sort_backward_plan p;
  memset(&p, 0, sizeof p);
  p.device = grad_out->device, p.dtype = grad_out->dtype, p.n = n, p.k = k;
  p.nkept = along_dim_kept(grad_out, d, p.kshape, &p.rows);
  p.grad_in = lt_data_ptr(grad_in), p.grad_out = lt_data_ptr(grad_out), p.indices = lt_data_ptr(indices);
  along_dim_strides(grad_in, d, p.gk_in, &p.gd_in);
  along_dim_strides(grad_out, d, p.gk, &p.gd);
  along_dim_strides(indices, d, p.ik, &p.id);
  LT_TRY(lt_fill(grad_in, 0.0));
  if (p.rows * p.k == 0) return 0;
  if (grad_out->device != LT_DEVICE_CPU) {
    const lt_backend *be = lt_backend_for(op, grad_out->device);
    if (!be) return -1;
    return be->sort_backward(op, &p);
  }
  if (p.rows > 1 && p.rows * p.k >= LT_PAR_GRAIN) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < p.rows; r++) scatter_row(&p, r);
  } else {
    for (int64_t r = 0; r < p.rows; r++) scatter_row(&p, r);
  }
  return 0;
}
