/* layer_norm_cpu.c — the CPU rows of LayerNorm and RMSNorm, forward and backward, with the
 * residual add of the fused ops (res = x + residual before the norm; dx = norm grad + dres).
 *
 * RMSNorm is LayerNorm without centering (mean taken as 0) and without bias, so both share
 * one row kernel with a `center` flag. 16-bit rows are converted to f32 scratch and computed
 * in f32; f64 computes in f64. A fused forward rounds x + residual to the dtype first (as the
 * add op does) and normalises the rounded values, so it gives exactly the unfused result.
 * dweight/dbias are summed over rows in a fixed number of row chunks (set by the shape, not
 * by the thread count) and the chunk partials are added in chunk order, so results are
 * bitwise reproducible for any number of threads. */
#include "ops/dtype_generic.h"
#include "ops/layer_norm.h"
#include <stdlib.h>

/* ---- row kernels: one generator, a float and a double instance (ops/dtype_generic.h) ------ */

/* y (C) = (x - mu) * rstd * w + b with mu = mean(x) when center, else 0. */
#define DEFINE_ROW_FORWARD(T, S, SQRT)                                                                                 \
  static void row_forward_##S(T *y, const T *x, const T *w, const T *b, int64_t C, T eps, int center,                  \
                              double *mean_out, double *rstd_out) {                                                    \
    T mu = 0, ss = 0;                                                                                                  \
    if (center) {                                                                                                      \
      T s = 0;                                                                                                         \
      LT_SIMD(reduction(+ : s))                                                                                        \
      for (int64_t j = 0; j < C; j++) s += x[j];                                                                       \
      mu = s / (T)C;                                                                                                   \
    }                                                                                                                  \
    LT_SIMD(reduction(+ : ss))                                                                                         \
    for (int64_t j = 0; j < C; j++) ss += (x[j] - mu) * (x[j] - mu);                                                   \
    T rs = (T)1 / SQRT(ss / (T)C + eps);                                                                               \
    for (int64_t j = 0; j < C; j++) y[j] = (x[j] - mu) * rs * w[j] + b[j];                                             \
    *mean_out = mu;                                                                                                    \
    *rstd_out = rs;                                                                                                    \
  }
DEFINE_ROW_FORWARD(float, f32, sqrtf)
DEFINE_ROW_FORWARD(double, f64, sqrt)

/* With dres, the plain dx of a tile of columns is computed first (the very expression of the plain
 * backward, so that the compiler contracts it into fmas alike), then dres is added: f32 and f64
 * give the bits of the unfused backward followed by the add. The tile keeps dx == dy or
 * dx == dres (in place) safe: a tile's inputs are read before its dx is written. */
enum { DX_TILE = 256 };

/* With xhat = (x - mu) * rstd and g = dy * w:
 *   dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) + dres   (mean(g) only when center; dres may be NULL)
 *   dw += dy * xhat, db += dy  (dw, db may be NULL).
 * dx may alias dy or dres. */
#define DEFINE_ROW_BACKWARD(T, S)                                                                                      \
  static void row_backward_##S(T *dx, T *dw, T *db, const T *dy, const T *dres, const T *x, const T *w, int64_t C,     \
                               T mu, T rs, int center) {                                                               \
    T sum_g = 0, sum_gx = 0;                                                                                           \
    LT_SIMD(reduction(+ : sum_g, sum_gx))                                                                              \
    for (int64_t j = 0; j < C; j++) {                                                                                  \
      T g = dy[j] * w[j];                                                                                              \
      sum_g += g;                                                                                                      \
      sum_gx += g * ((x[j] - mu) * rs);                                                                                \
    }                                                                                                                  \
    if (dw)                                                                                                            \
      for (int64_t j = 0; j < C; j++) dw[j] += dy[j] * ((x[j] - mu) * rs);                                             \
    if (db)                                                                                                            \
      for (int64_t j = 0; j < C; j++) db[j] += dy[j];                                                                  \
    if (!dx) return;                                                                                                   \
    T mean_g = center ? sum_g / (T)C : (T)0, mean_gx = sum_gx / (T)C;                                                  \
    if (!dres) {                                                                                                       \
      for (int64_t j = 0; j < C; j++) dx[j] = rs * (dy[j] * w[j] - mean_g - (x[j] - mu) * rs * mean_gx);               \
      return;                                                                                                          \
    }                                                                                                                  \
    T t[DX_TILE]; /* see DX_TILE */                                                                                    \
    for (int64_t j0 = 0; j0 < C; j0 += DX_TILE) {                                                                      \
      int64_t n = C - j0 < DX_TILE ? C - j0 : DX_TILE;                                                                 \
      for (int64_t k = 0; k < n; k++) t[k] = rs * (dy[j0 + k] * w[j0 + k] - mean_g - (x[j0 + k] - mu) * rs * mean_gx); \
      for (int64_t k = 0; k < n; k++) dx[j0 + k] = t[k] + dres[j0 + k];                                                \
    }                                                                                                                  \
  }
DEFINE_ROW_BACKWARD(float, f32)
DEFINE_ROW_BACKWARD(double, f64)

/* ---- forward ------------------------------------------------------------------------ */

/* res row = x row + residual row, in the compute type; returns the row to normalise (res).
 * 16-bit: the sum is rounded to the dtype and read back, so the norm sees what res holds. */
static const float *add_row_f32(const lt_layer_norm_forward_plan *p, int64_t i, float *scratch) {
  int64_t C = p->C;
  if (p->dtype == LT_F32) {
    const float *x = (const float *)p->x + i * C, *r = (const float *)p->residual + i * C;
    float *res = (float *)p->res + i * C;
    for (int64_t j = 0; j < C; j++) res[j] = x[j] + r[j];
    return res;
  }
  const float *x = lt_load_row_f32(p->x, p->dtype, i * C, C, scratch);
  const float *r = lt_load_row_f32(p->residual, p->dtype, i * C, C, scratch + 2 * C);
  for (int64_t j = 0; j < C; j++) scratch[j] = x[j] + r[j];
  lt_store_row_f32(p->res, p->dtype, i * C, scratch, C);
  return lt_load_row_f32(p->res, p->dtype, i * C, C, scratch);
}

/* Part tid of nth: rows [N*tid/nth, N*(tid+1)/nth). Rows are independent, so the split does not
 * change results. Returns 1 when the scratch rows could not be allocated. */
static int forward_part(void *job, int tid, int nth) {
  const lt_layer_norm_forward_plan *p = job;
  int dtype = p->dtype, center = p->center;
  int64_t C = p->C, i0 = p->N * tid / nth, i1 = p->N * (tid + 1) / nth;
  if (i0 >= i1) return 0;
  /* 16-bit: [x or res | y | residual] */
  float *scratch = dtype == LT_BF16 || dtype == LT_F16 ? malloc(3 * (size_t)C * sizeof(float)) : NULL;
  if (dtype != LT_F32 && dtype != LT_F64 && !scratch) return 1;
  for (int64_t i = i0; i < i1; i++) {
    double m, r;
    if (dtype == LT_F64) {
      const double *xr = (const double *)p->x + i * C;
      if (p->residual) {
        double *res = (double *)p->res + i * C;
        const double *rr = (const double *)p->residual + i * C;
        for (int64_t j = 0; j < C; j++) res[j] = xr[j] + rr[j];
        xr = res;
      }
      row_forward_f64((double *)p->y + i * C, xr, p->w, p->b, C, p->eps, center, &m, &r);
    } else if (dtype == LT_F32) {
      const float *xr = p->residual ? add_row_f32(p, i, NULL) : (const float *)p->x + i * C;
      row_forward_f32((float *)p->y + i * C, xr, p->w, p->b, C, (float)p->eps, center, &m, &r);
    } else {
      const float *xr = p->residual ? add_row_f32(p, i, scratch) : lt_load_row_f32(p->x, dtype, i * C, C, scratch);
      row_forward_f32(scratch + C, xr, p->w, p->b, C, (float)p->eps, center, &m, &r);
      lt_store_row_f32(p->y, dtype, i * C, scratch + C, C);
    }
    if (p->mean) lt_store_f64(p->mean, p->mean_dtype, i, m);
    if (p->rstd) lt_store_f64(p->rstd, p->rstd_dtype, i, r);
  }
  free(scratch);
  return 0;
}

int lt_layer_norm_forward_cpu(const char *op, const lt_layer_norm_forward_plan *p) {
  if (lt_run_parts(forward_part, (void *)p, p->N * p->C >= LT_PAR_GRAIN && p->N > 1))
    return lt_errorf("%s: out of host memory", op);
  return 0;
}

/* ---- backward ----------------------------------------------------------------------- */

int64_t lt_layer_norm_cpu_chunks(int64_t N, int64_t C) {
  int64_t k = N * C / LT_PAR_GRAIN;
  k = k < 1 ? 1 : k > 64 ? 64 : k;
  return k < N ? k : N;
}

typedef struct bwd_job {
  const lt_layer_norm_backward_plan *p;
  int64_t nchunks;
  char *pw_base, *pb_base; /* chunk partials, NULL when not requested */
} bwd_job;

/* Part tid of nth: row chunks [nchunks*tid/nth, nchunks*(tid+1)/nth). Each chunk writes its own
 * partials, so the split does not change results. Returns 1 when scratch could not be allocated. */
static int backward_part(void *job, int tid, int nth) {
  const bwd_job *J = job;
  const lt_layer_norm_backward_plan *p = J->p;
  int dtype = p->dtype, is64 = dtype == LT_F64, center = p->center, csize = is64 ? 8 : 4;
  int64_t C = p->C, N = p->N, nchunks = J->nchunks;
  int64_t k0 = nchunks * tid / nth, k1 = nchunks * (tid + 1) / nth;
  if (k0 >= k1) return 0;
  /* 16-bit: [x | dy | dx | dres] */
  float *scratch = !is64 && dtype != LT_F32 ? malloc(4 * (size_t)C * sizeof(float)) : NULL;
  if (!is64 && dtype != LT_F32 && !scratch) return 1;
  for (int64_t k = k0; k < k1; k++) {
    int64_t i0 = N * k / nchunks, i1 = N * (k + 1) / nchunks;
    char *pw = J->pw_base ? J->pw_base + (size_t)(k * C * csize) : NULL;
    char *pb = J->pb_base ? J->pb_base + (size_t)(k * C * csize) : NULL;
    for (int64_t i = i0; i < i1; i++) {
      double mu = center ? lt_load_f64(p->mean, p->mean_dtype, i) : 0.0, rs = lt_load_f64(p->rstd, p->rstd_dtype, i);
      if (is64) {
        double *dxr = p->dx ? (double *)p->dx + i * C : NULL;
        const double *dres = p->dres ? (const double *)p->dres + i * C : NULL;
        row_backward_f64(dxr, (double *)pw, (double *)pb, (const double *)p->dy + i * C, dres,
                         (const double *)p->x + i * C, p->w, C, mu, rs, center);
      } else if (dtype == LT_F32) {
        float *dxr = p->dx ? (float *)p->dx + i * C : NULL;
        const float *dres = p->dres ? (const float *)p->dres + i * C : NULL;
        row_backward_f32(dxr, (float *)pw, (float *)pb, (const float *)p->dy + i * C, dres, (const float *)p->x + i * C,
                         p->w, C, mu, rs, center);
      } else {
        const float *xr = lt_load_row_f32(p->x, dtype, i * C, C, scratch);
        const float *dyr = lt_load_row_f32(p->dy, dtype, i * C, C, scratch + C);
        const float *dres = p->dx && p->dres ? lt_load_row_f32(p->dres, dtype, i * C, C, scratch + 3 * C) : NULL;
        row_backward_f32(p->dx ? scratch + 2 * C : NULL, (float *)pw, (float *)pb, dyr, dres, xr, p->w, C, mu, rs,
                         center);
        if (p->dx) lt_store_row_f32(p->dx, dtype, i * C, scratch + 2 * C, C);
      }
    }
  }
  free(scratch);
  return 0;
}

/* Column j of the chunk partials, summed in fixed chunk order. */
static inline void sum_partials(void *tp, int tdtype, const char *base, int is64, int64_t nchunks, int64_t C,
                                int64_t j) {
  double s = 0;
  for (int64_t k = 0; k < nchunks; k++)
    s += is64 ? ((const double *)base)[k * C + j] : (double)((const float *)base)[k * C + j];
  lt_store_f64(tp, tdtype, j, s);
}

int lt_layer_norm_backward_cpu(const char *op, const lt_layer_norm_backward_plan *p) {
  int64_t N = p->N, C = p->C, nchunks = lt_layer_norm_cpu_chunks(N, C);
  int is64 = p->dtype == LT_F64, csize = is64 ? 8 : 4;
  /* partials: chunk k's dweight sums at [k*C], its dbias sums at [(nchunks + k)*C] */
  char *partial = calloc((size_t)(2 * nchunks * C + 1), (size_t)csize);
  if (!partial) return lt_errorf("%s: out of host memory", op);
  bwd_job J = {p, nchunks, p->dw ? partial : NULL, p->db ? partial + (size_t)(nchunks * C * csize) : NULL};
  if (lt_run_parts(backward_part, &J, N * C >= LT_PAR_GRAIN && nchunks > 1)) {
    free(partial);
    return lt_errorf("%s: out of host memory", op);
  }
  for (int which = 0; which < 2; which++) { /* fixed-order reduction of the chunk partials */
    void *tp = which ? p->db : p->dw;
    int tdtype = which ? p->db_dtype : p->dw_dtype;
    if (!tp) continue;
    const char *base = partial + (size_t)(which * nchunks * C * csize);
    if (nchunks * C >= LT_PAR_GRAIN) {
#pragma omp parallel for schedule(static)
      for (int64_t j = 0; j < C; j++) sum_partials(tp, tdtype, base, is64, nchunks, C, j);
    } else {
      for (int64_t j = 0; j < C; j++) sum_partials(tp, tdtype, base, is64, nchunks, C, j);
    }
  }
  free(partial);
  return 0;
}
