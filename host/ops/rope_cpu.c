/* rope_cpu.c — the CPU row of rope (ops/rope.c has the recipe): a table of cos and sin per
 * position row, computed in double, then every (b, t, h) row rotated through a scratch row, so
 * that any strides and any float dtype work, in place too. */
#include "core/internal.h"
#include "ops/dtype_generic.h"
#include "ops/rope.h"
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
  const lt_rope_plan *p;
  char *cos_tab, *sin_tab; /* (tab_rows, half), f64 or f32 */
  int64_t half;
  bool f64;
} rope_job;

/* Table row r: cos and sin of the angles of position row r. */
static inline void table_row(const rope_job *J, int64_t r) {
  const lt_rope_plan *P = J->p;
  int64_t half = J->half;
  double p = (double)r;
  if (P->pos) {
    int64_t off = P->per_batch ? (r / P->T) * P->ps[0] + (r % P->T) * P->ps[1] : r * P->ps[0];
    p = (double)lt_load_i64(P->pos, P->pdtype, off);
  }
  for (int64_t i = 0; i < half; i++) {
    double angle = p * P->freq[i], c = P->scale * cos(angle), s = P->scale * (P->sign * sin(angle));
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
  const lt_rope_plan *P = J->p;
  int64_t T = P->T, H = P->H, D = P->D, half = J->half, xsz = lt_dtype_size(P->dtype);
  int64_t b = r / (T * H), t = (r / H) % T, h = r % H, tr = P->per_batch ? b * T + t : t;
  const char *xr = (const char *)P->x + (b * P->xs[0] + t * P->xs[1] + h * P->xs[2]) * xsz;
  char *orow = (char *)P->out + (b * P->os[0] + t * P->os[1] + h * P->os[2]) * xsz;
  if (J->f64) {
    double *in = (double *)buf, *res = in + D;
    for (int64_t i = 0; i < D; i++) in[i] = ((const double *)xr)[i * P->xs[3]];
    rotate_f64(res, in, (const double *)J->cos_tab + tr * half, (const double *)J->sin_tab + tr * half, half);
    for (int64_t i = 0; i < D; i++) ((double *)orow)[i * P->os[3]] = res[i];
  } else {
    float *in = (float *)buf, *res = in + D;
    load_row_f32(in, xr, P->dtype, P->xs[3], D);
    rotate_f32(res, in, (const float *)J->cos_tab + tr * half, (const float *)J->sin_tab + tr * half, half);
    store_row_f32(orow, P->dtype, P->os[3], res, D);
  }
}

/* Every (b, t, h) row; false when a scratch row could not be allocated. */
static bool rotate_rows(const rope_job *J, int64_t esize) {
  const int64_t rows = J->p->B * J->p->T * J->p->H, D = J->p->D;
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
        if (buf) rotate_row(J, r, buf);
      free(buf);
    }
  } else {
    char *buf = malloc((size_t)(2 * D * esize));
    oom = !buf;
    for (int64_t r = 0; r < rows && buf; r++) rotate_row(J, r, buf);
    free(buf);
  }
  return !oom;
}

int lt_rope_cpu(const lt_rope_plan *p) {
  const bool f64 = p->dtype == LT_F64;
  const int64_t half = p->D / 2, tab_rows = p->per_batch ? p->B * p->T : p->T, esize = f64 ? 8 : 4;
  /* cos/sin table: one row of `half` angles per position row ((B*T) or (T) rows) */
  char *cos_tab = malloc((size_t)(tab_rows * half * esize)), *sin_tab = malloc((size_t)(tab_rows * half * esize));
  if (!cos_tab || !sin_tab) {
    free(cos_tab), free(sin_tab);
    return lt_errorf("rope: out of memory for a %lld x %lld angle table", (long long)tab_rows, (long long)half);
  }
  rope_job J = {p, cos_tab, sin_tab, half, f64};
  if (tab_rows * half >= LT_PAR_GRAIN / 16) { /* no omp construct for small work: see ew_execute */
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < tab_rows; r++) table_row(&J, r);
  } else {
    for (int64_t r = 0; r < tab_rows; r++) table_row(&J, r);
  }
  bool ok = rotate_rows(&J, esize);
  free(cos_tab), free(sin_tab);
  return ok ? 0 : lt_errorf("rope: out of memory for a scratch row of %lld elements", (long long)p->D);
}
