/* rope.c — rotary position embedding, "rotate half" convention (Hugging Face Llama).
 *
 * x is (B, T, H, D), D even, half = D / 2. For i < half, with p the position of (b, t):
 *   freq_i = pow(theta, -(2 i) / D), angle = p * freq_i      (both in double)
 *   out[i]        = x[i] * cos(angle) - x[i + half] * sin(angle)
 *   out[i + half] = x[i + half] * cos(angle) + x[i] * sin(angle)
 * inverse != 0 rotates by -angle: the exact backward, a rotation being orthogonal.
 * Precision: angles, cos and sin are always computed in double (positions stay exact up to 2^53
 * and large positions keep their phase); f64 then rotates in double, while f32, bf16 and f16 round
 * cos and sin to f32 and rotate in f32 (bf16/f16 rows are converted to f32 and rounded back).
 * The CUDA kernel (kernels/rope.cu) follows the same recipe, with these frequencies.
 */
#include "core/internal.h"
#include "ops/backend.h"
#include "ops/dtype_generic.h"
#include <stdlib.h>

/* A row of n elements at src (element stride `stride`, any float dtype) into f32 / f64 buffers. */
static void load_row_f32(float *dst, const char *src, int dtype, int64_t stride, int64_t n) {
  if (dtype == LT_F32 && stride == 1) {
    memcpy(dst, src, (size_t)n * sizeof(float));
  } else if (dtype == LT_F32) {
    for (int64_t i = 0; i < n; i++) dst[i] = ((const float *)src)[i * stride];
  } else if (dtype == LT_BF16) {
    for (int64_t i = 0; i < n; i++) dst[i] = lt_bf16_to_f32(((const uint16_t *)src)[i * stride]);
  } else {
    for (int64_t i = 0; i < n; i++) dst[i] = lt_f16_to_f32(((const uint16_t *)src)[i * stride]);
  }
}

static void store_row_f32(char *dst, int dtype, int64_t stride, const float *src, int64_t n) {
  if (dtype == LT_F32 && stride == 1) {
    memcpy(dst, src, (size_t)n * sizeof(float));
  } else if (dtype == LT_F32) {
    for (int64_t i = 0; i < n; i++) ((float *)dst)[i * stride] = src[i];
  } else if (dtype == LT_BF16) {
    for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i * stride] = lt_f32_to_bf16(src[i]);
  } else {
    for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i * stride] = lt_f32_to_f16(src[i]);
  }
}

// y, x are (D); c, s are (D/2). Rotates x by the angles whose cos/sin are c/s.
#define DEFINE_ROTATE(T, S)                                                                                            \
  static void rotate_##S(T *restrict y, const T *restrict x, const T *restrict c, const T *restrict s, int64_t half) { \
    for (int64_t i = 0; i < half; i++) {                                                                               \
      y[i] = x[i] * c[i] - x[i + half] * s[i];                                                                         \
      y[i + half] = x[i + half] * c[i] + x[i] * s[i];                                                                  \
    }                                                                                                                  \
  }
DEFINE_ROTATE(float, f32)
DEFINE_ROTATE(double, f64)

typedef struct rope_job {
  const lt_tensor *x, *out, *positions;
  const char *pos_base;
  char *cos_tab, *sin_tab; /* (tab_rows, half), f64 or f32 */
  const double *freq;
  int64_t T, H, D, half;
  double sign;
  bool f64, per_batch;
} rope_job;

/* Table row r: cos and sin of the angles of position row r. */
static inline void table_row(const rope_job *J, int64_t r) {
  const lt_tensor *positions = J->positions;
  int64_t half = J->half;
  double p = (double)r;
  if (positions) {
    int64_t off =
        J->per_batch ? (r / J->T) * positions->stride[0] + (r % J->T) * positions->stride[1] : r * positions->stride[0];
    p = (double)lt_load_i64(J->pos_base, positions->dtype, off);
  }
  for (int64_t i = 0; i < half; i++) {
    double angle = p * J->freq[i], c = cos(angle), s = J->sign * sin(angle);
    if (J->f64) {
      ((double *)J->cos_tab)[r * half + i] = c;
      ((double *)J->sin_tab)[r * half + i] = s;
    } else {
      ((float *)J->cos_tab)[r * half + i] = (float)c;
      ((float *)J->sin_tab)[r * half + i] = (float)s;
    }
  }
}

/* Rotates (b, t, h) row r of x into out through buf (2 D elements of f64 or f32). */
static inline void rotate_row(const rope_job *J, int64_t r, char *buf) {
  const lt_tensor *x = J->x, *out = J->out;
  int64_t T = J->T, H = J->H, D = J->D, half = J->half, xsz = lt_dtype_size(x->dtype);
  int64_t b = r / (T * H), t = (r / H) % T, h = r % H, tr = J->per_batch ? b * T + t : t;
  const char *xr = (const char *)lt_data_ptr(x) + (b * x->stride[0] + t * x->stride[1] + h * x->stride[2]) * xsz;
  char *orow = (char *)lt_data_ptr(out) + (b * out->stride[0] + t * out->stride[1] + h * out->stride[2]) * xsz;
  if (J->f64) {
    double *in = (double *)buf, *res = in + D;
    for (int64_t i = 0; i < D; i++) in[i] = ((const double *)xr)[i * x->stride[3]];
    rotate_f64(res, in, (const double *)J->cos_tab + tr * half, (const double *)J->sin_tab + tr * half, half);
    for (int64_t i = 0; i < D; i++) ((double *)orow)[i * out->stride[3]] = res[i];
  } else {
    float *in = (float *)buf, *res = in + D;
    load_row_f32(in, xr, x->dtype, x->stride[3], D);
    rotate_f32(res, in, (const float *)J->cos_tab + tr * half, (const float *)J->sin_tab + tr * half, half);
    store_row_f32(orow, out->dtype, out->stride[3], res, D);
  }
}

static int check_positions(const lt_tensor *pos, const lt_tensor *x) {
  if (!pos) return 0;
  char a[LT_DESC_STR], b[LT_DESC_STR];
  LT_TRY(lt_check_defined("rope", "positions", pos));
  if (pos->dtype != LT_I32 && pos->dtype != LT_I64)
    return lt_errorf("rope: positions must be i32 or i64, got %s", lt_desc(a, pos));
  if (pos->device != x->device) return lt_check_same_device("rope", pos, x);
  bool ok = (pos->ndim == 1 && pos->shape[0] == x->shape[1]) ||
            (pos->ndim == 2 && pos->shape[0] == x->shape[0] && pos->shape[1] == x->shape[1]);
  if (!ok) return lt_errorf("rope: positions %s must be (T) or (B, T) for x %s", lt_desc(a, pos), lt_desc(b, x));
  return 0;
}

/* x, out on one CUDA device (checked); the frequencies as the CPU computes them. */
static int rope_cuda(const lt_backend *be, lt_tensor *out, const lt_tensor *x, const lt_tensor *positions, double theta,
                     int inverse) {
  const int64_t D = x->shape[3], half = D / 2;
  double *freq = malloc((size_t)(half > 0 ? half : 1) * sizeof(double));
  if (!freq) return lt_errorf("rope: out of host memory");
  for (int64_t i = 0; i < half; i++) freq[i] = pow(theta, -(double)(2 * i) / (double)D);
  lt_cuda_rope_args a = {.device = x->device,
                         .dtype = x->dtype,
                         .B = x->shape[0],
                         .T = x->shape[1],
                         .H = x->shape[2],
                         .D = D,
                         .x = lt_data_ptr(x),
                         .out = lt_data_ptr(out),
                         .pos = positions ? lt_data_ptr(positions) : NULL,
                         .pdtype = positions ? positions->dtype : LT_I64,
                         .per_batch = positions && positions->ndim == 2,
                         .freq = freq,
                         .sign = inverse ? -1.0 : 1.0};
  for (int d = 0; d < 4; d++) a.xs[d] = x->stride[d], a.os[d] = out->stride[d];
  if (positions) a.ps[0] = positions->stride[0], a.ps[1] = positions->ndim == 2 ? positions->stride[1] : 0;
  int rc = be->rope(&a);
  free(freq);
  return rc;
}

int lt_rope(lt_tensor *out, const lt_tensor *x, const lt_tensor *positions, double theta, int inverse) {
  char a[LT_DESC_STR];
  LT_TRY(lt_check_defined("rope", "x", x));
  if (x->ndim != 4 || !lt_dtype_is_float(x->dtype) || x->shape[3] % 2 != 0)
    return lt_errorf("rope: x must be (B, T, H, D) with D even and a floating dtype, got %s", lt_desc(a, x));
  if (!(theta > 0) || !isfinite(theta)) return lt_errorf("rope: theta must be positive and finite, got %g", theta);
  LT_TRY(check_positions(positions, x));
  const lt_backend *be = lt_backend_for("rope", x->device);
  if (!be) return -1;
  LT_TRY(lt_prepare_out_like("rope", out, x, x->dtype));
  const int64_t B = x->shape[0], T = x->shape[1], H = x->shape[2], D = x->shape[3], half = D / 2;
  if (lt_numel(x) == 0) return 0;
  const bool f64 = x->dtype == LT_F64, per_batch = positions && positions->ndim == 2;
  if (x->device != LT_DEVICE_CPU) return rope_cuda(be, out, x, positions, theta, inverse);

  /* cos/sin table: one row of `half` angles per position row ((B*T) or (T) rows) */
  const int64_t tab_rows = per_batch ? B * T : T, esize = f64 ? 8 : 4;
  char *cos_tab = malloc((size_t)(tab_rows * half * esize)), *sin_tab = malloc((size_t)(tab_rows * half * esize));
  double *freq = malloc((size_t)half * sizeof(double));
  if (!cos_tab || !sin_tab || !freq) {
    free(cos_tab), free(sin_tab), free(freq);
    return lt_errorf("rope: out of memory for a %lld x %lld angle table", (long long)tab_rows, (long long)half);
  }
  for (int64_t i = 0; i < half; i++) freq[i] = pow(theta, -(double)(2 * i) / (double)D);
  const char *pos_base = positions ? lt_data_ptr(positions) : NULL;
  const double sign = inverse ? -1.0 : 1.0;
  rope_job J = {x, out, positions, pos_base, cos_tab, sin_tab, freq, T, H, D, half, sign, f64, per_batch};
  if (tab_rows * half >= LT_PAR_GRAIN / 16) { /* no omp construct for small work: see ew_execute */
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < tab_rows; r++) table_row(&J, r);
  } else {
    for (int64_t r = 0; r < tab_rows; r++) table_row(&J, r);
  }

  /* rotate every (b, t, h) row through a scratch row: any strides, any float dtype, in place ok */
  const int64_t rows = B * T * H;
  bool oom = false;
  if (rows * D >= LT_PAR_GRAIN) {
#pragma omp parallel
    {
      char *buf = malloc((size_t)(2 * D * esize));
      if (!buf) {
#pragma omp atomic write
        oom = true;
      }
#pragma omp for schedule(static)
      for (int64_t r = 0; r < rows; r++)
        if (buf) rotate_row(&J, r, buf);
      free(buf);
    }
  } else {
    char *buf = malloc((size_t)(2 * D * esize));
    oom = !buf;
    for (int64_t r = 0; r < rows && buf; r++) rotate_row(&J, r, buf);
    free(buf);
  }
  free(cos_tab), free(sin_tab), free(freq);
  if (oom) return lt_errorf("rope: out of memory for a scratch row of %lld elements", (long long)D);
  return 0;
}
