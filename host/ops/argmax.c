/* argmax.c — argmax and argmin along one dim (or all dims), on the CPU.
 * Indices are LT_I64, 0-based; ties give the first occurrence and a NaN wins (the first
 * NaN), as in torch. Same two paths as ops/reduce.c (see ops/reduce_geom.h): runs along
 * memory for the inner case, whole rows compared against a vector of bests otherwise.
 * CUDA tensors take the same checks and plan, then kernels/reduce.cu (kernels/reduce.h). */
#include "ops/reduce_geom.h"
#include <stdlib.h>

enum { COLS = 256, SPLIT_GRAIN = 65536, FEW_TASKS = 64 };

/* A best value so far (floats as double, integers as int64) and its index (-1: none yet). */
typedef struct arg_best {
  double f;
  int64_t i, idx;
} arg_best;

static bool better_f(double v, double best, bool is_max) { return v != v || (is_max ? v > best : v < best); }

/* Folds the best of a later chunk into cur: strict comparisons keep the first occurrence. */
static void merge_best(arg_best *cur, const arg_best *next, bool is_int, bool is_max) {
  if (next->idx < 0) return;
  if (cur->idx < 0) {
    *cur = *next;
  } else if (is_int) {
    if (is_max ? next->i > cur->i : next->i < cur->i) *cur = *next;
  } else if (cur->f == cur->f && better_f(next->f, cur->f, is_max)) {
    *cur = *next;
  }
}

/* Index of the first max (min) of a contiguous f32 run, n >= 1, or of its first NaN: the
 * extreme value in one vectorised pass, then a search for it 64 elements at a time. */
static int64_t argbest_f32(const float *p, int64_t n, bool is_max) {
  float m = is_max ? -INFINITY : INFINITY;
  int nan = 0;
  if (is_max) {
#pragma omp simd reduction(max : m) reduction(| : nan)
    for (int64_t i = 0; i < n; i++) m = p[i] > m ? p[i] : m, nan |= p[i] != p[i];
  } else {
#pragma omp simd reduction(min : m) reduction(| : nan)
    for (int64_t i = 0; i < n; i++) m = p[i] < m ? p[i] : m, nan |= p[i] != p[i];
  }
  for (int64_t i0 = 0; i0 < n; i0 += 64) {
    int64_t i1 = n - i0 < 64 ? n : i0 + 64;
    int hit = 0;
    if (nan) {
#pragma omp simd reduction(| : hit)
      for (int64_t i = i0; i < i1; i++) hit |= p[i] != p[i];
    } else {
#pragma omp simd reduction(| : hit)
      for (int64_t i = i0; i < i1; i++) hit |= p[i] == m;
    }
    if (hit)
      for (int64_t i = i0; i < i1; i++)
        if (nan ? p[i] != p[i] : p[i] == m) return i;
  }
  return 0;
}

/* Scans n elements at element stride `stride`; element k has index idx0 + k. */
static void scan_run(arg_best *b, const char *p, int dtype, int64_t n, int64_t stride, int64_t idx0, bool is_max) {
  if (dtype == LT_F32 && stride == 1 && n > 0) {
    int64_t k = argbest_f32((const float *)p, n, is_max);
    arg_best local = {((const float *)p)[k], 0, idx0 + k};
    merge_best(b, &local, false, is_max);
    return;
  }
#define SCAN_F(T, LOAD)                                                                                                \
  for (int64_t k = 0; k < n && b->f == b->f; k++) {                                                                    \
    double v = LOAD(((const T *)p)[k * stride]);                                                                       \
    if (b->idx < 0 || better_f(v, b->f, is_max)) b->f = v, b->idx = idx0 + k;                                          \
  }
#define SCAN_I(T)                                                                                                      \
  for (int64_t k = 0; k < n; k++) {                                                                                    \
    int64_t v = ((const T *)p)[k * stride];                                                                            \
    if (b->idx < 0 || (is_max ? v > b->i : v < b->i)) b->i = v, b->idx = idx0 + k;                                     \
  }
#define AS_IS(x) (x)
  switch (dtype) {
  case LT_F32: SCAN_F(float, AS_IS); break;
  case LT_F64: SCAN_F(double, AS_IS); break;
  case LT_BF16: SCAN_F(uint16_t, lt_bf16_to_f32); break;
  case LT_F16: SCAN_F(uint16_t, lt_f16_to_f32); break;
  case LT_I32: SCAN_I(int32_t); break;
  case LT_I64: SCAN_I(int64_t); break;
  default: SCAN_I(uint8_t); break;
  }
}

/* Row r of contiguous f32 compared into nc float bests, branch-free so that it vectorises. */
static void scan_row_f32(float *bf, int64_t *idx, const float *p, int64_t nc, int64_t r, bool is_max) {
  if (is_max) {
    for (int64_t j = 0; j < nc; j++) {
      bool take = p[j] > bf[j] || (p[j] != p[j] && bf[j] == bf[j]);
      bf[j] = take ? p[j] : bf[j], idx[j] = take ? r : idx[j];
    }
  } else {
    for (int64_t j = 0; j < nc; j++) {
      bool take = p[j] < bf[j] || (p[j] != p[j] && bf[j] == bf[j]);
      bf[j] = take ? p[j] : bf[j], idx[j] = take ? r : idx[j];
    }
  }
}

/* Row r compared into the bests of nc columns (element stride cs). */
static void scan_row(double *bf, int64_t *bi, int64_t *idx, const char *p, int dtype, int64_t nc, int64_t cs, int64_t r,
                     bool is_max) {
#define ROW_F(T, LOAD)                                                                                                 \
  for (int64_t j = 0; j < nc; j++) {                                                                                   \
    double v = LOAD(((const T *)p)[j * cs]);                                                                           \
    if (r == 0 || (bf[j] == bf[j] && better_f(v, bf[j], is_max))) bf[j] = v, idx[j] = r;                               \
  }
#define ROW_I(T)                                                                                                       \
  for (int64_t j = 0; j < nc; j++) {                                                                                   \
    int64_t v = ((const T *)p)[j * cs];                                                                                \
    if (r == 0 || (is_max ? v > bi[j] : v < bi[j])) bi[j] = v, idx[j] = r;                                             \
  }
  switch (dtype) {
  case LT_F32: ROW_F(float, AS_IS); break;
  case LT_F64: ROW_F(double, AS_IS); break;
  case LT_BF16: ROW_F(uint16_t, lt_bf16_to_f32); break;
  case LT_F16: ROW_F(uint16_t, lt_f16_to_f32); break;
  case LT_I32: ROW_I(int32_t); break;
  case LT_I64: ROW_I(int64_t); break;
  default: ROW_I(uint8_t); break;
  }
}

/* Task t: split t % nsplit of output t / nsplit. */
static inline arg_best inner_task(const reduce_geom *g, const char *base, int dtype, bool is_max, int64_t t,
                                  int64_t nsplit) {
  int64_t n = g->rshape[0], rs = g->rstride[0];
  int64_t o = t / nsplit, s = t % nsplit, k0 = n * s / nsplit, k1 = n * (s + 1) / nsplit;
  int64_t off = lt_offset_of(o, g->nkept, g->kshape, g->kstride) + k0 * rs;
  arg_best b = {0, 0, -1};
  scan_run(&b, base + off * lt_dtype_size(dtype), dtype, k1 - k0, rs, k0, is_max);
  return b;
}

static int arg_inner(const reduce_geom *g, const char *base, int dtype, bool is_max, int64_t *res) {
  bool is_int = !lt_dtype_is_float(dtype);
  int64_t n_out = g->n_out, n = g->rshape[0], nsplit = 1;
  if (n_out < FEW_TASKS && n > 2 * SPLIT_GRAIN) nsplit = (n + SPLIT_GRAIN - 1) / SPLIT_GRAIN;
  arg_best *parts = malloc(sizeof(arg_best) * n_out * nsplit);
  if (!parts) return lt_errorf("argmax: out of host memory");
  int64_t ntasks = n_out * nsplit;
  if (ntasks > 1 && n_out * n >= LT_PAR_GRAIN) { /* no omp construct for small work: see ew_execute */
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < ntasks; t++) parts[t] = inner_task(g, base, dtype, is_max, t, nsplit);
  } else {
    for (int64_t t = 0; t < ntasks; t++) parts[t] = inner_task(g, base, dtype, is_max, t, nsplit);
  }
  for (int64_t o = 0; o < n_out; o++) {
    arg_best b = parts[o * nsplit];
    for (int64_t s = 1; s < nsplit; s++) merge_best(&b, &parts[o * nsplit + s], is_int, is_max);
    res[o] = b.idx;
  }
  free(parts);
  return 0;
}

/* Task t: column block t % ncb of outer row t / ncb. */
static inline void outer_task(const reduce_geom *g, const char *base, int dtype, bool is_max, int64_t *res, int64_t t) {
  int esize = lt_dtype_size(dtype);
  int64_t C = g->kshape[g->nkept - 1], cs = g->kstride[g->nkept - 1];
  int64_t ncb = (C + COLS - 1) / COLS, n = g->rshape[0], rs = g->rstride[0];
  int64_t o = t / ncb, c0 = t % ncb * COLS, nc = C - c0 < COLS ? C - c0 : COLS;
  int64_t off = lt_offset_of(o, g->nkept - 1, g->kshape, g->kstride) + c0 * cs;
  double bf[COLS];
  int64_t bi[COLS];
  if (dtype == LT_F32 && cs == 1) {
    float b32[COLS];
    memcpy(b32, base + off * esize, sizeof(float) * nc);
    for (int64_t j = 0; j < nc; j++) res[o * C + c0 + j] = 0;
    for (int64_t r = 1; r < n; r++)
      scan_row_f32(b32, res + o * C + c0, (const float *)(base + (off + r * rs) * esize), nc, r, is_max);
    return;
  }
  for (int64_t r = 0; r < n; r++)
    scan_row(bf, bi, res + o * C + c0, base + (off + r * rs) * esize, dtype, nc, cs, r, is_max);
}

static void arg_outer(const reduce_geom *g, const char *base, int dtype, bool is_max, int64_t *res) {
  int64_t C = g->kshape[g->nkept - 1], O = g->n_out / C;
  int64_t ncb = (C + COLS - 1) / COLS, n = g->rshape[0];
  if (O * ncb > 1 && g->n_out * n >= LT_PAR_GRAIN) {
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < O * ncb; t++) outer_task(g, base, dtype, is_max, res, t);
  } else {
    for (int64_t t = 0; t < O * ncb; t++) outer_task(g, base, dtype, is_max, res, t);
  }
}

/* A CUDA tensor over all its dims: the flat row-major index is walked over a's own dims (size-1
 * dims dropped, neighbours that step as one coalesced), so nothing is copied. */
static int arg_all_cuda(const char *op, lt_tensor *out, const lt_tensor *a, int keepdim, bool is_max) {
  int64_t oshape[LT_MAX_DIMS];
  int ondim = keepdim ? a->ndim : 0;
  for (int d = 0; d < ondim; d++) oshape[d] = 1;
  LT_TRY(lt_prepare_out(op, out, ondim, oshape, LT_I64, a->device));
  const lt_backend *be = lt_backend_for(op, a->device); /* lt_reduce_check_device passed it */
  if (!be) return -1;
  lt_cuda_red_geom c;
  memset(&c, 0, sizeof c);
  c.n_out = 1, c.n_red = lt_numel(a), c.nkept = 1, c.kshape[0] = 1, c.inner = 1;
  for (int d = 0; d < a->ndim; d++) {
    if (a->shape[d] == 1) continue;
    int k = c.nred;
    if (k > 0 && c.rstride[k - 1] == a->stride[d] * a->shape[d]) {
      c.rshape[k - 1] *= a->shape[d], c.rstride[k - 1] = a->stride[d];
    } else {
      c.rshape[k] = a->shape[d], c.rstride[k] = a->stride[d], c.nred++;
    }
  }
  if (c.nred == 0) c.rshape[0] = 1, c.rstride[0] = 0, c.nred = 1;
  return be->argreduce(op, a->device, &c, lt_data_ptr(a), a->dtype, lt_data_ptr(out), is_max);
}

static int arg_reduce(const char *op, lt_tensor *out, const lt_tensor *a, int dim, int keepdim, int all_dims,
                      bool is_max) {
  LT_TRY(lt_check_defined(op, "input", a));
  LT_TRY(lt_reduce_check_device(op, a));
  if (a->dtype < 0 || a->dtype >= LT_NUM_DTYPES) return lt_errorf("%s: unknown dtype %d", op, a->dtype);
  lt_tensor *flat = NULL;
  const lt_tensor *src = a;
  if (all_dims) {
    int64_t numel = lt_numel(a);
    if (numel == 0) return lt_errorf("%s: cannot reduce an empty dim (the tensor has no elements)", op);
    if (a->device != LT_DEVICE_CPU) return arg_all_cuda(op, out, a, keepdim, is_max);
    flat = lt_tensor_new();
    if (!flat || lt_reshape(flat, a, 1, &numel)) return lt_release(flat), -1;
    src = flat;
    dim = 0;
  }
  int rc = -1;
  int64_t d64 = dim, oshape[LT_MAX_DIMS];
  reduce_geom g;
  int64_t *res = NULL;
  if (reduce_geom_plan(op, &g, src, 1, &d64)) goto done;
  if (g.n_red == 0) {
    rc = lt_errorf("%s: cannot reduce an empty dim", op);
    goto done;
  }
  int ondim = reduce_out_shape(src, g.reduced, keepdim, oshape);
  if (all_dims) {
    ondim = keepdim ? a->ndim : 0;
    for (int d = 0; d < ondim; d++) oshape[d] = 1;
  }
  if (lt_prepare_out(op, out, ondim, oshape, LT_I64, src->device)) goto done;
  if (g.n_out == 0) {
    rc = 0;
    goto done;
  }
  reduce_geom_set_out(&g, src, out, keepdim && !all_dims);
  if (src->device != LT_DEVICE_CPU) {
    const lt_backend *be = lt_backend_for(op, src->device);
    if (!be) goto done;
    lt_cuda_red_geom c;
    reduce_geom_to_cuda(&g, &c);
    rc = be->argreduce(op, src->device, &c, lt_data_ptr(src), src->dtype, lt_data_ptr(out), is_max);
    goto done;
  }
  res = malloc(sizeof(int64_t) * g.n_out);
  if (!res) {
    rc = lt_errorf("%s: out of host memory", op);
    goto done;
  }
  if (g.inner) {
    if (arg_inner(&g, lt_data_ptr(src), src->dtype, is_max, res)) goto done;
  } else {
    arg_outer(&g, lt_data_ptr(src), src->dtype, is_max, res);
  }
  int64_t *o64 = lt_data_ptr(out);
  for (int64_t o = 0; o < g.n_out; o++) o64[lt_offset_of(o, g.nkept, g.kshape, g.kout)] = res[o];
  rc = 0;
done:
  free(res);
  lt_release(flat);
  return rc;
}

int lt_argmax(lt_tensor *out, const lt_tensor *a, int dim, int keepdim, int all_dims) {
  return arg_reduce("argmax", out, a, dim, keepdim, all_dims, true);
}
int lt_argmin(lt_tensor *out, const lt_tensor *a, int dim, int keepdim, int all_dims) {
  return arg_reduce("argmin", out, a, dim, keepdim, all_dims, false);
}
