/* ops_softmax.c — softmax and log-softmax over any dim, forward and backward, on the CPU.
 *
 * Work goes row by row, a row being the n elements along `dim`. Rows that lie contiguous
 * in f32 or f64 are used in place; others (a dim that is not innermost, 16-bit dtypes) are
 * gathered into per-thread f32/f64 scratch and scattered back. Numerically stable: the
 * row max is subtracted before exp; sums accumulate in double. */
#include "internal.h"
#include <stdlib.h>

/* Let GCC if-convert the float compares in exp_f32 so the row loops vectorise; nothing
 * here reads floating-point exception flags. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif

/* exp(x) in float arithmetic that vectorises (glibc's expf does not without -ffast-math):
 * x = k ln2 + r with |r| <= ln2/2, a degree-6 polynomial for e^r (Cephes expf), 2^k built
 * in the exponent bits. About 2 ulp on [-87, 88]; 0 below -87 (so -inf gives 0), NaN stays NaN. */
static inline float exp_f32(float x) {
  float keep = x >= -87.0f ? 1.0f : 0.0f, t = x >= -87.0f ? x : -87.0f;
  t = t <= 88.0f ? t : 88.0f;
  const float round_magic = 12582912.0f; /* 1.5 * 2^23: adding and subtracting it rounds */
  float k = (t * 1.44269504088896341f + round_magic) - round_magic;
  float r = t - k * 0.693359375f + k * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  float e = p * r * r + r + 1.0f;
  int32_t bits = ((int32_t)k + 127) << 23;
  float scale;
  memcpy(&scale, &bits, 4);
  float y = e * scale * keep;
  return x != x ? x : y;
}

typedef enum { SOFTMAX, LOG_SOFTMAX, SOFTMAX_BACKWARD, LOG_SOFTMAX_BACKWARD } softmax_kind;

/* ---- row kernels: forward out = f(x); backward out = grad_in from x = grad_out, y ------- */

static void row_f32(softmax_kind kind, float *out, const float *x, const float *y, int64_t n) {
  float m = -INFINITY;
  double s = 0;
  switch (kind) {
  case SOFTMAX:
  case LOG_SOFTMAX:
#pragma omp simd reduction(max : m)
    for (int64_t i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
    if (kind == SOFTMAX) {
#pragma omp simd reduction(+ : s)
      for (int64_t i = 0; i < n; i++) {
        float e = exp_f32(x[i] - m);
        out[i] = e;
        s += e;
      }
      float inv = (float)(1.0 / s);
#pragma omp simd
      for (int64_t i = 0; i < n; i++) out[i] *= inv;
    } else {
#pragma omp simd reduction(+ : s)
      for (int64_t i = 0; i < n; i++) s += exp_f32(x[i] - m);
      float lse = m + (float)log(s);
#pragma omp simd
      for (int64_t i = 0; i < n; i++) out[i] = x[i] - lse;
    }
    break;
  case SOFTMAX_BACKWARD: /* grad_in = y * (grad_out - sum(grad_out * y)) */
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; i++) s += (double)x[i] * y[i];
#pragma omp simd
    for (int64_t i = 0; i < n; i++) out[i] = y[i] * (x[i] - (float)s);
    break;
  case LOG_SOFTMAX_BACKWARD: /* grad_in = grad_out - exp(y) * sum(grad_out) */
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; i++) s += x[i];
#pragma omp simd
    for (int64_t i = 0; i < n; i++) out[i] = x[i] - exp_f32(y[i]) * (float)s;
    break;
  }
}

static void row_f64(softmax_kind kind, double *out, const double *x, const double *y, int64_t n) {
  double m = -INFINITY, s = 0;
  switch (kind) {
  case SOFTMAX:
  case LOG_SOFTMAX:
    for (int64_t i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
    for (int64_t i = 0; i < n; i++) s += exp(x[i] - m);
    if (kind == SOFTMAX) {
      for (int64_t i = 0; i < n; i++) out[i] = exp(x[i] - m) / s;
    } else {
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

/* ---- moving rows in and out of scratch ------------------------------------------------ */

/* The row at p (element stride `stride`) as f32/f64 (wide = f64): p itself when it already
 * is, else converted into buf. */
static const void *row_in(void *buf, const char *p, int dtype, int64_t n, int64_t stride) {
  if ((dtype == LT_F32 || dtype == LT_F64) && (stride == 1 || n == 1)) return p;
  if (dtype == LT_F64) {
    for (int64_t i = 0; i < n; i++) ((double *)buf)[i] = ((const double *)p)[i * stride];
  } else if (dtype == LT_F32) {
    for (int64_t i = 0; i < n; i++) ((float *)buf)[i] = ((const float *)p)[i * stride];
  } else if (dtype == LT_BF16) {
    for (int64_t i = 0; i < n; i++) ((float *)buf)[i] = lt_bf16_to_f32(((const uint16_t *)p)[i * stride]);
  } else {
    for (int64_t i = 0; i < n; i++) ((float *)buf)[i] = lt_f16_to_f32(((const uint16_t *)p)[i * stride]);
  }
  return buf;
}

static void row_out(char *p, int dtype, int64_t n, int64_t stride, const void *buf) {
  if (dtype == LT_F64) {
    for (int64_t i = 0; i < n; i++) ((double *)p)[i * stride] = ((const double *)buf)[i];
  } else if (dtype == LT_F32) {
    for (int64_t i = 0; i < n; i++) ((float *)p)[i * stride] = ((const float *)buf)[i];
  } else if (dtype == LT_BF16) {
    for (int64_t i = 0; i < n; i++) ((uint16_t *)p)[i * stride] = lt_f32_to_bf16(((const float *)buf)[i]);
  } else {
    for (int64_t i = 0; i < n; i++) ((uint16_t *)p)[i * stride] = lt_f32_to_f16(((const float *)buf)[i]);
  }
}

/* ---- the driver ------------------------------------------------------------------------- */

/* Operand k (0 out, 1 x, 2 y): its stride along dim and over the other dims. */
typedef struct softmax_plan {
  softmax_kind kind;
  int dtype, esize, nops, nrest;
  int64_t n, rows;
  int64_t rest_shape[LT_MAX_DIMS], rest_stride[3][LT_MAX_DIMS], dim_stride[3];
  char *base[3];
} softmax_plan;

static void softmax_rows(const softmax_plan *P, int64_t r0, int64_t r1, char *scratch) {
  int64_t n = P->n;
  bool wide = P->dtype == LT_F64;
  for (int64_t r = r0; r < r1; r++) {
    const void *in[3] = {NULL, NULL, NULL};
    char *p[3];
    for (int k = 0; k < P->nops; k++)
      p[k] = P->base[k] + lt_offset_of(r, P->nrest, P->rest_shape, P->rest_stride[k]) * P->esize;
    for (int k = 1; k < P->nops; k++) in[k] = row_in(scratch + k * n * 8, p[k], P->dtype, n, P->dim_stride[k]);
    bool direct = (P->dtype == LT_F32 || P->dtype == LT_F64) && (P->dim_stride[0] == 1 || n == 1);
    void *out = direct ? p[0] : scratch;
    if (wide)
      row_f64(P->kind, out, in[1], in[2], n);
    else
      row_f32(P->kind, out, in[1], in[2], n);
    if (!direct) row_out(p[0], P->dtype, n, P->dim_stride[0], scratch);
  }
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
  if (x->device != LT_DEVICE_CPU) return lt_errorf("%s: not implemented on cuda yet", op);
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
  int failed = 0;
#pragma omp parallel if (P.rows > 1 && P.rows * P.n >= LT_PAR_GRAIN)
  {
    char *scratch = malloc((size_t)(3 * P.n * 8));
    if (!scratch) {
#pragma omp atomic write
      failed = 1;
    }
#pragma omp for schedule(static)
    for (int64_t r = 0; r < P.rows; r++)
      if (scratch) softmax_rows(&P, r, r + 1, scratch);
    free(scratch);
  }
  return failed ? lt_errorf("%s: out of host memory for a row of %lld", op, (long long)P.n) : 0;
}

int lt_softmax(lt_tensor *out, const lt_tensor *a, int dim) { return softmax_run("softmax", SOFTMAX, out, a, NULL, dim); }
int lt_log_softmax(lt_tensor *out, const lt_tensor *a, int dim) {
  return softmax_run("log_softmax", LOG_SOFTMAX, out, a, NULL, dim);
}
int lt_softmax_backward(lt_tensor *grad_in, const lt_tensor *grad_out, const lt_tensor *y, int dim) {
  return softmax_run("softmax_backward", SOFTMAX_BACKWARD, grad_in, grad_out, y, dim);
}
int lt_log_softmax_backward(lt_tensor *grad_in, const lt_tensor *grad_out, const lt_tensor *y, int dim) {
  return softmax_run("log_softmax_backward", LOG_SOFTMAX_BACKWARD, grad_in, grad_out, y, dim);
}
