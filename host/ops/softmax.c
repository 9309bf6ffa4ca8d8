/* softmax.c — softmax and log-softmax over any dim, forward and backward, on the CPU.
 *
 * Work goes row by row, a row being the n elements along `dim`. Rows that lie contiguous
 * in f32 or f64 are used in place; others (a dim that is not innermost, 16-bit dtypes) are
 * gathered into per-thread f32/f64 scratch and scattered back. Numerically stable: the
 * row max is subtracted before exp. 16-bit dtypes compute in f32, f64 in f64.
 * CUDA tensors take the same checks and plan, then kernels/softmax.cu (kernels/reduce.h). */
#include "ops/reduce_geom.h"
#include <stdlib.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* Let GCC if-convert the float compares in lt_exp_nonpos_f32 so the row loops vectorise; nothing
 * here reads floating-point exception flags. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif
#include "ops/vecmath.h"

/* Sums of exp run in float lanes over blocks of this many elements, blocks add in double:
 * as fast as a float sum, as accurate as a double one for long rows. */
enum { SUM_BLOCK = 512 };

/* In the order of kernels/reduce.h's LT_CUDA_SOFTMAX... */
typedef enum { SOFTMAX, LOG_SOFTMAX, SOFTMAX_BACKWARD, LOG_SOFTMAX_BACKWARD } softmax_kind;

/* ---- row kernels: forward out = f(x); backward out = grad_in from x = grad_out, y ------- */

/* s += the sum of EXPR over i in [0, n): float lanes within blocks of SUM_BLOCK, blocks in double. */
#define BLOCK_SUM(s, n, i, EXPR)                                                                                       \
  do {                                                                                                                 \
    for (int64_t i0_ = 0; i0_ < (n); i0_ += SUM_BLOCK) {                                                               \
      int64_t i1_ = (n)-i0_ < SUM_BLOCK ? (n) : i0_ + SUM_BLOCK;                                                       \
      float part_ = 0;                                                                                                 \
      _Pragma("omp simd reduction(+ : part_)") for (int64_t i = i0_; i < i1_; i++) part_ += (EXPR);                    \
      s += part_;                                                                                                      \
    }                                                                                                                  \
  } while (0)

/* sum(x * y), or sum(x) when y is NULL. */
static double dot_f32(const float *x, const float *y, int64_t n) {
  double s = 0;
  if (y)
    BLOCK_SUM(s, n, i, x[i] * y[i]);
  else
    BLOCK_SUM(s, n, i, x[i]);
  return s;
}

static void row_f32(softmax_kind kind, float *out, const float *x, const float *y, int64_t n) {
  float m = -INFINITY;
  double s = 0;
  int nan = 0;
  switch (kind) {
  case SOFTMAX:
  case LOG_SOFTMAX:
#pragma omp simd reduction(max : m) reduction(| : nan)
    for (int64_t i = 0; i < n; i++) {
      m = x[i] > m ? x[i] : m;
      nan |= x[i] != x[i];
    }
    if (nan) { /* a NaN spreads over its row, as in torch */
      for (int64_t i = 0; i < n; i++) out[i] = NAN;
    } else if (kind == SOFTMAX) {
      BLOCK_SUM(s, n, i, out[i] = lt_exp_nonpos_f32(x[i] - m));
      float inv = (float)(1.0 / s);
#pragma omp simd
      for (int64_t i = 0; i < n; i++) out[i] *= inv;
    } else {
      BLOCK_SUM(s, n, i, lt_exp_nonpos_f32(x[i] - m));
      float lse = m + (float)log(s);
#pragma omp simd
      for (int64_t i = 0; i < n; i++) out[i] = x[i] - lse;
    }
    break;
  /* softmax: grad_in = y * (grad_out - sum(grad_out * y)) */
  case SOFTMAX_BACKWARD: s = dot_f32(x, y, n);
#pragma omp simd
    for (int64_t i = 0; i < n; i++) out[i] = y[i] * (x[i] - (float)s);
    break;
  /* log_softmax: grad_in = grad_out - exp(y) * sum(grad_out) */
  case LOG_SOFTMAX_BACKWARD: s = dot_f32(x, NULL, n);
#pragma omp simd
    for (int64_t i = 0; i < n; i++) out[i] = x[i] - (y[i] != y[i] ? y[i] : lt_exp_nonpos_f32(y[i])) * (float)s;
    break;
  }
}

static void row_f64(softmax_kind kind, double *out, const double *x, const double *y, int64_t n) {
  double m = -INFINITY, s = 0;
  switch (kind) {
  case SOFTMAX:
  case LOG_SOFTMAX:
    for (int64_t i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
    if (kind == SOFTMAX) {
      for (int64_t i = 0; i < n; i++) s += out[i] = exp(x[i] - m);
      for (int64_t i = 0; i < n; i++) out[i] /= s;
    } else {
      for (int64_t i = 0; i < n; i++) s += exp(x[i] - m);
      double lse = m + log(s);
      for (int64_t i = 0; i < n; i++) out[i] = x[i] - lse;
    }
    break;
  case SOFTMAX_BACKWARD:
    for (int64_t i = 0; i < n; i++) s += x[i] * y[i];
    for (int64_t i = 0; i < n; i++) out[i] = y[i] * (x[i] - s);
    break;
  case LOG_SOFTMAX_BACKWARD:
    for (int64_t i = 0; i < n; i++) s += x[i];
    for (int64_t i = 0; i < n; i++) out[i] = x[i] - exp(y[i]) * s;
    break;
  }
}

/* ---- the driver ------------------------------------------------------------------------- */

/* Rows are handled up to BLOCK at a time. A row that is not contiguous f32/f64 is gathered into
 * scratch; gathering a block element-major (element i of every row, then i + 1) reads
 * neighbouring rows together, which is what makes a softmax over dim 0 of (N, C) cheap:
 * its rows are the columns, adjacent in memory. */
enum { BLOCK = 16 };

/* Operand k (0 out, 1 x, 2 y): its stride along dim and over the other dims. */
typedef struct softmax_plan {
  softmax_kind kind;
  int dtype, esize, nops, nrest;
  bool direct; /* every operand is contiguous f32/f64 along dim: rows are used in place */
  int block;   /* rows per block: BLOCK, fewer for long rows so that scratch stays a few MB */
  int64_t n, rows;
  int64_t rest_shape[LT_MAX_DIMS], rest_stride[3][LT_MAX_DIMS], dim_stride[3];
  char *base[3];
  int64_t nblocks; /* blocks of `block` rows, shared out by softmax_blocks */
} softmax_plan;

/* buf[j * n + i] = row j's element i (as f32, or f64 for f64) for the nr rows at p[j]. */
static void gather_block(void *buf, char *const *p, int nr, int64_t n, int dtype, int64_t stride) {
#define GATHER(T, W, LOAD)                                                                                             \
  for (int64_t i = 0; i < n; i++)                                                                                      \
    for (int j = 0; j < nr; j++) ((W *)buf)[j * n + i] = LOAD(((const T *)p[j])[i * stride]);
#define AS_IS(x) (x)
  switch (dtype) {
  case LT_F64: GATHER(double, double, AS_IS); break;
  case LT_F32: GATHER(float, float, AS_IS); break;
  case LT_BF16: GATHER(uint16_t, float, lt_bf16_to_f32); break;
  default: GATHER(uint16_t, float, lt_f16_to_f32); break;
  }
}

static void scatter_block(char *const *p, const void *buf, int nr, int64_t n, int dtype, int64_t stride) {
#define SCATTER(T, W, STORE)                                                                                           \
  for (int64_t i = 0; i < n; i++)                                                                                      \
    for (int j = 0; j < nr; j++) ((T *)p[j])[i * stride] = STORE(((const W *)buf)[j * n + i]);
  switch (dtype) {
  case LT_F64: SCATTER(double, double, AS_IS); break;
  case LT_F32: SCATTER(float, float, AS_IS); break;
  case LT_BF16: SCATTER(uint16_t, float, lt_f32_to_bf16); break;
  default: SCATTER(uint16_t, float, lt_f32_to_f16); break;
  }
}

/* Rows [r0, r0 + nr), nr <= P->block; scratch holds 3 * P->block * n doubles. */
static void softmax_block(const softmax_plan *P, int64_t r0, int nr, char *scratch) {
  int64_t n = P->n;
  bool wide = P->dtype == LT_F64;
  char *p[3][BLOCK] = {{NULL}};
  for (int j = 0; j < nr; j++)
    for (int k = 0; k < P->nops; k++)
      p[k][j] = P->base[k] + lt_offset_of(r0 + j, P->nrest, P->rest_shape, P->rest_stride[k]) * P->esize;
  if (P->direct) {
    for (int j = 0; j < nr; j++) {
      if (j + 1 < nr) /* start the next input rows on their way while this one computes (~10%) */
        for (int k = 1; k < P->nops; k++)
          for (int64_t i = 0; i < n * P->esize; i += 64) __builtin_prefetch(p[k][j + 1] + i);
      if (wide)
        row_f64(P->kind, (double *)p[0][j], (const double *)p[1][j], (const double *)p[2][j], n);
      else
        row_f32(P->kind, (float *)p[0][j], (const float *)p[1][j], (const float *)p[2][j], n);
    }
    return;
  }
  int64_t w = wide ? 8 : 4, slot = P->block * n * w;
  for (int k = 1; k < P->nops; k++) gather_block(scratch + k * slot, p[k], nr, n, P->dtype, P->dim_stride[k]);
  for (int j = 0; j < nr; j++) {
    char *o = scratch + j * n * w, *x = scratch + slot + j * n * w, *y = scratch + 2 * slot + j * n * w;
    if (wide)
      row_f64(P->kind, (double *)o, (const double *)x, (const double *)y, n);
    else
      row_f32(P->kind, (float *)o, (const float *)x, (const float *)y, n);
  }
  scatter_block(p[0], scratch, nr, n, P->dtype, P->dim_stride[0]);
}

/* Blocks [nblocks tid / nthreads, nblocks (tid + 1) / nthreads) of P.block rows: each row alone,
 * so any split gives the same results. Returns 1 when out of memory for the row scratch. */
static int softmax_blocks(void *job, int tid, int nthreads) {
  const softmax_plan *P = job;
  int64_t nblocks = P->nblocks;
  int64_t b0 = nblocks * tid / nthreads, b1 = nblocks * (tid + 1) / nthreads;
  if (b1 <= b0) return 0;
  char *scratch = P->direct ? NULL : malloc((size_t)(3 * P->block * P->n * 8));
  if (!P->direct && !scratch) return 1;
  for (int64_t b = b0; b < b1; b++) {
    int nr = (int)(P->rows - b * P->block < P->block ? P->rows - b * P->block : P->block);
    softmax_block(P, b * P->block, nr, scratch);
  }
  free(scratch);
  return 0;
}

/* A CUDA tensor's rows, by kernels/softmax.cu (the kinds are in the same order). */
static int softmax_cuda(const char *op, const softmax_plan *P, int device) {
  const lt_backend *be = lt_backend_for(op, device);
  if (!be) return -1;
  lt_cuda_softmax_args a;
  memset(&a, 0, sizeof a);
  a.kind = (int32_t)P->kind, a.dtype = P->dtype, a.nops = P->nops, a.nrest = P->nrest;
  a.n = P->n, a.rows = P->rows;
  memcpy(a.rest_shape, P->rest_shape, sizeof a.rest_shape);
  memcpy(a.rest_stride, P->rest_stride, sizeof a.rest_stride);
  memcpy(a.dim_stride, P->dim_stride, sizeof a.dim_stride);
  for (int k = 0; k < P->nops; k++) a.base[k] = P->base[k];
  return be->softmax(op, device, &a);
}

static int softmax_run(const char *op, softmax_kind kind, lt_tensor *out, const lt_tensor *x, const lt_tensor *y,
                       int dim) {
  bool backward = kind == SOFTMAX_BACKWARD || kind == LOG_SOFTMAX_BACKWARD;
  LT_TRY(lt_check_defined(op, backward ? "grad_out" : "input", x));
  if (backward) {
    LT_TRY(lt_check_defined(op, "y", y));
    LT_TRY(lt_check_same_device(op, x, y));
    LT_TRY(lt_check_same_dtype(op, x, y));
    if (!lt_same_shape(x, y)) {
      char a[LT_DESC_STR], b[LT_DESC_STR];
      return lt_errorf("%s: grad_out is %s but y is %s", op, lt_desc(a, x), lt_desc(b, y));
    }
  }
  LT_TRY(lt_reduce_check_device(op, x));
  if (!lt_dtype_is_float(x->dtype)) return lt_errorf("%s: needs a floating dtype, got %s", op, lt_dtype_name(x->dtype));
  int d;
  LT_TRY(lt_wrap_dim(op, dim, x->ndim, &d));
  LT_TRY(lt_prepare_out_like(op, out, x, x->dtype));

  softmax_plan P = {.kind = kind, .dtype = x->dtype, .esize = lt_dtype_size(x->dtype), .nops = backward ? 3 : 2};
  const lt_tensor *ops[3] = {out, x, y};
  P.n = x->ndim ? x->shape[d] : 1;
  for (int k = 0; k < P.nops; k++) {
    P.base[k] = lt_data_ptr(ops[k]);
    P.dim_stride[k] = x->ndim ? ops[k]->stride[d] : 1;
  }
  for (int i = 0; i < x->ndim; i++) {
    if (i == d) continue;
    P.rest_shape[P.nrest] = x->shape[i];
    for (int k = 0; k < P.nops; k++) P.rest_stride[k][P.nrest] = ops[k]->stride[i];
    P.nrest++;
  }
  P.rows = lt_shape_numel(P.nrest, P.rest_shape);
  if (P.rows == 0 || P.n == 0) return 0;
  if (x->device != LT_DEVICE_CPU) return softmax_cuda(op, &P, x->device);
  P.direct = P.dtype == LT_F32 || P.dtype == LT_F64;
  for (int k = 0; k < P.nops; k++) P.direct &= P.dim_stride[k] == 1 || P.n == 1;
  P.block = P.n >= (1 << 18) / BLOCK ? (int)((1 << 18) / P.n > 1 ? (1 << 18) / P.n : 1) : BLOCK;
  int64_t nblocks = (P.rows + P.block - 1) / P.block;
  P.nblocks = nblocks;
  int failed = lt_run_parts(softmax_blocks, &P, nblocks > 1 && P.rows * P.n >= LT_PAR_GRAIN);
  return failed ? lt_errorf("%s: out of host memory for rows of %lld", op, (long long)P.n) : 0;
}

int lt_softmax(lt_tensor *out, const lt_tensor *a, int dim) {
  return softmax_run("softmax", SOFTMAX, out, a, NULL, dim);
}
int lt_log_softmax(lt_tensor *out, const lt_tensor *a, int dim) {
  return softmax_run("log_softmax", LOG_SOFTMAX, out, a, NULL, dim);
}
int lt_softmax_backward(lt_tensor *grad_in, const lt_tensor *grad_out, const lt_tensor *y, int dim) {
  return softmax_run("softmax_backward", SOFTMAX_BACKWARD, grad_in, grad_out, y, dim);
}
int lt_log_softmax_backward(lt_tensor *grad_in, const lt_tensor *grad_out, const lt_tensor *y, int dim) {
  return softmax_run("log_softmax_backward", LOG_SOFTMAX_BACKWARD, grad_in, grad_out, y, dim);
}
