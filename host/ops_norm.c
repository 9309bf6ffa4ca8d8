/* ops_norm.c — LayerNorm and RMSNorm on the CPU, forward and backward.
 *
 * RMSNorm is LayerNorm without centering (mean taken as 0) and without bias, so both
 * share one row kernel with a `center` flag. x is (..., C), N = numel / C rows.
 * x is f32, f64, bf16 or f16; 16-bit rows are converted to f32 scratch and computed in
 * f32, f64 computes in f64. The saved mean/rstd are f32 (N).
 * dweight/dbias are summed over rows in a fixed number of row chunks (set by the shape,
 * not by the thread count) and the chunk partials are added in chunk order, so results
 * are bitwise reproducible for any number of threads. */
#include "internal.h"
#ifdef _OPENMP
#include <omp.h>
#endif
#include <stdio.h>
#include <stdlib.h>

/* ---- row kernels: one for float, one for double ------------------------------------ */

/* y (C) = (x - mu) * rstd * w + b with mu = mean(x) when center, else 0. */
static void norm_row_forward_f32(float *y, const float *x, const float *w, const float *b, int64_t C, float eps,
                                 int center, double *mean_out, double *rstd_out) {
  float mu = 0, ss = 0;
  if (center) {
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < C; j++) s += x[j];
    mu = s / (float)C;
  }
#pragma omp simd reduction(+ : ss)
  for (int64_t j = 0; j < C; j++) ss += (x[j] - mu) * (x[j] - mu);
  float rs = 1.0f / sqrtf(ss / (float)C + eps);
  for (int64_t j = 0; j < C; j++) y[j] = (x[j] - mu) * rs * w[j] + b[j];
  *mean_out = mu;
  *rstd_out = rs;
}

static void norm_row_forward_f64(double *y, const double *x, const double *w, const double *b, int64_t C, double eps,
                                 int center, double *mean_out, double *rstd_out) {
  double mu = 0, ss = 0;
  if (center) {
    double s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < C; j++) s += x[j];
    mu = s / (double)C;
  }
#pragma omp simd reduction(+ : ss)
  for (int64_t j = 0; j < C; j++) ss += (x[j] - mu) * (x[j] - mu);
  double rs = 1.0 / sqrt(ss / (double)C + eps);
  for (int64_t j = 0; j < C; j++) y[j] = (x[j] - mu) * rs * w[j] + b[j];
  *mean_out = mu;
  *rstd_out = rs;
}

/* With xhat = (x - mu) * rstd and g = dy * w:
 *   dx = rstd * (g - mean(g) - xhat * mean(g * xhat))   (mean(g) term only when center)
 *   dw += dy * xhat, db += dy  (dw, db may be NULL).
 * dx may alias dy: every dy is read before dx is written. */
static void norm_row_backward_f32(float *dx, float *dw, float *db, const float *dy, const float *x, const float *w,
                                  int64_t C, float mu, float rs, int center) {
  float sum_g = 0, sum_gx = 0;
#pragma omp simd reduction(+ : sum_g, sum_gx)
  for (int64_t j = 0; j < C; j++) {
    float g = dy[j] * w[j];
    sum_g += g;
    sum_gx += g * ((x[j] - mu) * rs);
  }
  if (dw)
    for (int64_t j = 0; j < C; j++) dw[j] += dy[j] * ((x[j] - mu) * rs);
  if (db)
    for (int64_t j = 0; j < C; j++) db[j] += dy[j];
  if (!dx) return;
  float mean_g = center ? sum_g / (float)C : 0.0f, mean_gx = sum_gx / (float)C;
  for (int64_t j = 0; j < C; j++) dx[j] = rs * (dy[j] * w[j] - mean_g - (x[j] - mu) * rs * mean_gx);
}

static void norm_row_backward_f64(double *dx, double *dw, double *db, const double *dy, const double *x,
                                  const double *w, int64_t C, double mu, double rs, int center) {
  double sum_g = 0, sum_gx = 0;
#pragma omp simd reduction(+ : sum_g, sum_gx)
  for (int64_t j = 0; j < C; j++) {
    double g = dy[j] * w[j];
    sum_g += g;
    sum_gx += g * ((x[j] - mu) * rs);
  }
  if (dw)
    for (int64_t j = 0; j < C; j++) dw[j] += dy[j] * ((x[j] - mu) * rs);
  if (db)
    for (int64_t j = 0; j < C; j++) db[j] += dy[j];
  if (!dx) return;
  double mean_g = center ? sum_g / (double)C : 0.0, mean_gx = sum_gx / (double)C;
  for (int64_t j = 0; j < C; j++) dx[j] = rs * (dy[j] * w[j] - mean_g - (x[j] - mu) * rs * mean_gx);
}

/* ---- helpers ------------------------------------------------------------------------ */

/* Checks weight (or bias) is a (C) vector of x's dtype or f32 and returns it as a contiguous buffer
 * of the compute type (f64 for f64 x, else f32); `fill` stands in when t is NULL. NULL on error. */
static void *param_buffer(const char *op, const char *what, const lt_tensor *t, const lt_tensor *x, int64_t C,
                          double fill) {
  if (t) {
    if (lt_check_defined(op, what, t) || lt_check_cpu(op, t)) return NULL;
    char d[LT_DESC_STR];
    if (t->ndim != 1 || t->shape[0] != C) {
      lt_errorf("%s: %s is %s, expected [%lld] for x's last dim", op, what, lt_desc(d, t), (long long)C);
      return NULL;
    }
    if (t->dtype != x->dtype && t->dtype != LT_F32) {
      lt_errorf("%s: %s is %s, expected x's dtype (%s) or f32", op, what, lt_dtype_name(t->dtype),
                lt_dtype_name(x->dtype));
      return NULL;
    }
  }
  int cdtype = x->dtype == LT_F64 ? LT_F64 : LT_F32;
  void *buf = malloc((size_t)(C > 0 ? C : 1) * (size_t)lt_dtype_size(cdtype));
  if (!buf) {
    lt_errorf("%s: out of host memory", op);
    return NULL;
  }
  if (t) {
    if (lt_copy_to_buffer(t, buf, cdtype, C) == 0) return buf;
    free(buf);
    return NULL;
  }
  for (int64_t j = 0; j < C; j++) lt_store_f64(buf, cdtype, j, fill);
  return buf;
}

/* Validates x and returns its row count and width. */
static int check_x(const char *op, const lt_tensor *x, int64_t *N, int64_t *C) {
  LT_TRY(lt_check_defined(op, "x", x));
  LT_TRY(lt_check_cpu(op, x));
  char d[LT_DESC_STR];
  if (!lt_dtype_is_float(x->dtype)) return lt_errorf("%s: x is %s, expected a floating dtype", op, lt_desc(d, x));
  if (x->ndim < 1 || x->shape[x->ndim - 1] < 1)
    return lt_errorf("%s: x is %s, expected (..., C) with C >= 1", op, lt_desc(d, x));
  *C = x->shape[x->ndim - 1];
  *N = lt_numel(x) / *C;
  return 0;
}

/* ---- forward ------------------------------------------------------------------------ */

/* Saved statistics are f32; for f64 x a caller may pass them already defined as f64 to keep
 * full precision through backward (gradient checks). */
static int stat_dtype(const lt_tensor *x, const lt_tensor *stat) {
  return x->dtype == LT_F64 && stat->storage && stat->dtype == LT_F64 ? LT_F64 : LT_F32;
}

typedef struct norm_fwd_job {
  int dtype;
  int64_t C, N;
  double eps;
  int center;
  const void *xp;
  void *yp;
  const void *w, *b;
  void *mup;
  int mu_dtype;
  void *rsp;
  int rs_dtype;
} norm_fwd_job;

/* Part tid of nth: rows [N*tid/nth, N*(tid+1)/nth). Rows are independent, so the split does not
 * change results. Returns 1 when the scratch row could not be allocated. */
static int norm_forward_part(void *job, int tid, int nth) {
  const norm_fwd_job *J = job;
  int dtype = J->dtype, center = J->center;
  int64_t C = J->C, i0 = J->N * tid / nth, i1 = J->N * (tid + 1) / nth;
  const void *xp = J->xp, *w = J->w, *b = J->b;
  void *yp = J->yp;
  if (i0 >= i1) return 0;
  float *scratch = dtype == LT_BF16 || dtype == LT_F16 ? malloc(2 * (size_t)C * sizeof(float)) : NULL;
  if (dtype != LT_F32 && dtype != LT_F64 && !scratch) return 1;
  for (int64_t i = i0; i < i1; i++) {
    double m, r;
    if (dtype == LT_F64) {
      norm_row_forward_f64((double *)yp + i * C, (const double *)xp + i * C, w, b, C, J->eps, center, &m, &r);
    } else if (dtype == LT_F32) {
      norm_row_forward_f32((float *)yp + i * C, (const float *)xp + i * C, w, b, C, (float)J->eps, center, &m, &r);
    } else {
      const float *xr = lt_load_row_f32(xp, dtype, i * C, C, scratch);
      norm_row_forward_f32(scratch + C, xr, w, b, C, (float)J->eps, center, &m, &r);
      lt_store_row_f32(yp, dtype, i * C, scratch + C, C);
    }
    if (J->mup) lt_store_f64(J->mup, J->mu_dtype, i, m);
    if (J->rsp) lt_store_f64(J->rsp, J->rs_dtype, i, r);
  }
  free(scratch);
  return 0;
}

static int norm_forward(const char *op, lt_tensor *out, lt_tensor *mean, lt_tensor *rstd, const lt_tensor *x,
                        const lt_tensor *weight, const lt_tensor *bias, double eps, int center) {
  int64_t N, C;
  LT_TRY(check_x(op, x, &N, &C));
  int rc = -1, dtype = x->dtype;
  int64_t nshape[1] = {N};
  lt_tensor *xc = lt_tensor_new(), *y = NULL, *mu_t = NULL, *rs_t = NULL;
  void *w = param_buffer(op, "weight", weight, x, C, 1.0);
  void *b = w ? param_buffer(op, "bias", bias, x, C, 0.0) : NULL;
  if (!xc || !w || !b || lt_contiguous(xc, x)) goto done;
  if (!(y = lt_out_begin(op, "out", out, x->ndim, x->shape, dtype))) goto done;
  if (mean && !(mu_t = lt_out_begin(op, "mean", mean, 1, nshape, stat_dtype(x, mean)))) goto done;
  if (rstd && !(rs_t = lt_out_begin(op, "rstd", rstd, 1, nshape, stat_dtype(x, rstd)))) goto done;
  const void *xp = lt_data_ptr(xc);
  void *yp = lt_data_ptr(y);
  void *mup = mu_t ? lt_data_ptr(mu_t) : NULL, *rsp = rs_t ? lt_data_ptr(rs_t) : NULL;
  norm_fwd_job J = {dtype, C, N, eps, center, xp, yp, w, b, mup, mu_t ? mu_t->dtype : 0, rsp, rs_t ? rs_t->dtype : 0};
  int failed = lt_run_parts(norm_forward_part, &J, N * C >= LT_PAR_GRAIN && N > 1);
  rc = failed ? lt_errorf("%s: out of host memory", op) : 0;
done:
  rc = lt_out_finish(out, y, rc);
  if (mean) rc = lt_out_finish(mean, mu_t, rc);
  if (rstd) rc = lt_out_finish(rstd, rs_t, rc);
  lt_release(xc);
  free(w);
  free(b);
  return rc;
}

int lt_layernorm_forward(lt_tensor *out, lt_tensor *mean, lt_tensor *rstd, const lt_tensor *x, const lt_tensor *weight,
                         const lt_tensor *bias, double eps) {
  return norm_forward("layernorm", out, mean, rstd, x, weight, bias, eps, 1);
}

int lt_rmsnorm_forward(lt_tensor *out, lt_tensor *rstd, const lt_tensor *x, const lt_tensor *weight, double eps) {
  return norm_forward("rmsnorm", out, NULL, rstd, x, weight, NULL, eps, 0);
}

/* ---- backward ----------------------------------------------------------------------- */

/* A saved statistic: f32 (or f64) with N elements, made contiguous into tc. */
static int check_stat(const char *op, const char *what, const lt_tensor *t, int64_t N, lt_tensor *tc) {
  LT_TRY(lt_check_defined(op, what, t));
  LT_TRY(lt_check_cpu(op, t));
  char d[LT_DESC_STR];
  if ((t->dtype != LT_F32 && t->dtype != LT_F64) || lt_numel(t) != N)
    return lt_errorf("%s: %s is %s, expected f32 [%lld] (one per row of x)", op, what, lt_desc(d, t), (long long)N);
  return lt_contiguous(tc, t);
}

/* Rows per chunk for the dweight/dbias partial sums depend only on the shape. */
static int64_t num_row_chunks(int64_t N, int64_t C) {
  int64_t k = N * C / LT_PAR_GRAIN;
  k = k < 1 ? 1 : k > 64 ? 64 : k;
  return k < N ? k : N;
}

typedef struct norm_bwd_job {
  int dtype;
  int64_t C, N, nchunks;
  int center;
  const void *xp, *dyp, *w;
  const void *mup;
  int mu_dtype;
  const void *rsp;
  int rs_dtype;
  void *dxp;
  char *pw_base, *pb_base; /* partials, NULL when not requested */
} norm_bwd_job;

/* Part tid of nth: row chunks [nchunks*tid/nth, nchunks*(tid+1)/nth). Each chunk writes its own
 * partials, so the split does not change results. Returns 1 when scratch could not be allocated. */
static int norm_backward_part(void *job, int tid, int nth) {
  const norm_bwd_job *J = job;
  int dtype = J->dtype, is64 = dtype == LT_F64, center = J->center, csize = is64 ? 8 : 4;
  int64_t C = J->C, N = J->N, nchunks = J->nchunks;
  int64_t k0 = nchunks * tid / nth, k1 = nchunks * (tid + 1) / nth;
  const void *xp = J->xp, *dyp = J->dyp, *w = J->w;
  void *dxp = J->dxp;
  if (k0 >= k1) return 0;
  float *scratch = !is64 && dtype != LT_F32 ? malloc(3 * (size_t)C * sizeof(float)) : NULL;
  if (!is64 && dtype != LT_F32 && !scratch) return 1;
  for (int64_t k = k0; k < k1; k++) {
    int64_t i0 = N * k / nchunks, i1 = N * (k + 1) / nchunks;
    char *pw = J->pw_base ? J->pw_base + (size_t)(k * C * csize) : NULL;
    char *pb = J->pb_base ? J->pb_base + (size_t)((nchunks + k) * C * csize) : NULL;
    for (int64_t i = i0; i < i1; i++) {
      double mu = center ? lt_load_f64(J->mup, J->mu_dtype, i) : 0.0, rs = lt_load_f64(J->rsp, J->rs_dtype, i);
      if (is64) {
        double *dxr = dxp ? (double *)dxp + i * C : NULL;
        norm_row_backward_f64(dxr, (double *)pw, (double *)pb, (const double *)dyp + i * C, (const double *)xp + i * C,
                              w, C, mu, rs, center);
      } else if (dtype == LT_F32) {
        float *dxr = dxp ? (float *)dxp + i * C : NULL;
        norm_row_backward_f32(dxr, (float *)pw, (float *)pb, (const float *)dyp + i * C, (const float *)xp + i * C, w,
                              C, mu, rs, center);
      } else {
        const float *xr = lt_load_row_f32(xp, dtype, i * C, C, scratch);
        const float *dyr = lt_load_row_f32(dyp, dtype, i * C, C, scratch + C);
        norm_row_backward_f32(dxp ? scratch + 2 * C : NULL, (float *)pw, (float *)pb, dyr, xr, w, C, mu, rs, center);
        if (dxp) lt_store_row_f32(dxp, dtype, i * C, scratch + 2 * C, C);
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

static int norm_backward(const char *op, lt_tensor *dx, lt_tensor *dweight, lt_tensor *dbias, const lt_tensor *dout,
                         const lt_tensor *x, const lt_tensor *weight, const lt_tensor *mean, const lt_tensor *rstd,
                         int center) {
  int64_t N, C;
  LT_TRY(check_x(op, x, &N, &C));
  LT_TRY(lt_check_defined(op, "dout", dout));
  LT_TRY(lt_check_cpu(op, dout));
  char d1[LT_DESC_STR], d2[LT_DESC_STR];
  if (!lt_same_shape(dout, x) || dout->dtype != x->dtype)
    return lt_errorf("%s: dout is %s, expected the shape and dtype of x (%s)", op, lt_desc(d1, dout), lt_desc(d2, x));
  if (dweight && !weight) return lt_errorf("%s: dweight requested but weight is NULL", op);
  int dtype = x->dtype, is64 = dtype == LT_F64, csize = is64 ? 8 : 4;
  int dbias_dtype = weight ? weight->dtype : dtype;
  if (dbias && dbias->storage) {
    if (dbias->dtype != dtype && dbias->dtype != LT_F32)
      return lt_errorf("%s: dbias is %s, expected %s or f32", op, lt_desc(d1, dbias), lt_dtype_name(dtype));
    dbias_dtype = dbias->dtype;
  }
  int rc = -1, failed = 0;
  int64_t cshape[1] = {C}, nchunks = num_row_chunks(N, C);
  lt_tensor *xc = lt_tensor_new(), *dyc = lt_tensor_new(), *muc = lt_tensor_new(), *rsc = lt_tensor_new();
  lt_tensor *dxw = NULL, *dww = NULL, *dbw = NULL;
  char *partial = NULL;
  void *w = param_buffer(op, "weight", weight, x, C, 1.0);
  if (!xc || !dyc || !muc || !rsc || !w) goto done;
  if (center && check_stat(op, "mean", mean, N, muc)) goto done;
  if (check_stat(op, "rstd", rstd, N, rsc) || lt_contiguous(xc, x) || lt_contiguous(dyc, dout)) goto done;
  if (dx && !(dxw = lt_out_begin(op, "dx", dx, x->ndim, x->shape, dtype))) goto done;
  if (dweight && !(dww = lt_out_begin(op, "dweight", dweight, 1, cshape, weight->dtype))) goto done;
  if (dbias && !(dbw = lt_out_begin(op, "dbias", dbias, 1, cshape, dbias_dtype))) goto done;
  /* partials: chunk k's dweight sums at [k*C], its dbias sums at [(nchunks + k)*C] */
  partial = calloc((size_t)(2 * nchunks * C + 1), (size_t)csize);
  if (!partial) {
    rc = lt_errorf("%s: out of host memory", op);
    goto done;
  }
  const void *xp = lt_data_ptr(xc), *dyp = lt_data_ptr(dyc);
  const void *mup = center ? lt_data_ptr(muc) : NULL, *rsp = lt_data_ptr(rsc);
  void *dxp = dxw ? lt_data_ptr(dxw) : NULL;
  norm_bwd_job J = {dtype,
                    C,
                    N,
                    nchunks,
                    center,
                    xp,
                    dyp,
                    w,
                    mup,
                    center ? muc->dtype : 0,
                    rsp,
                    rsc->dtype,
                    dxp,
                    dww ? partial : NULL,
                    dbw ? partial : NULL};
  failed = lt_run_parts(norm_backward_part, &J, N * C >= LT_PAR_GRAIN && nchunks > 1);
  if (failed) {
    rc = lt_errorf("%s: out of host memory", op);
    goto done;
  }
  /* fixed-order reduction of the chunk partials */
  for (int which = 0; which < 2; which++) {
    lt_tensor *t = which ? dbw : dww;
    if (!t) continue;
    const char *base = partial + (size_t)(which * nchunks * C * csize);
    void *tp = lt_data_ptr(t);
    if (nchunks * C >= LT_PAR_GRAIN) {
#pragma omp parallel for schedule(static)
      for (int64_t j = 0; j < C; j++) sum_partials(tp, t->dtype, base, is64, nchunks, C, j);
    } else {
      for (int64_t j = 0; j < C; j++) sum_partials(tp, t->dtype, base, is64, nchunks, C, j);
    }
  }
  rc = 0;
done:
  if (dx) rc = lt_out_finish(dx, dxw, rc);
  if (dweight) rc = lt_out_finish(dweight, dww, rc);
  if (dbias) rc = lt_out_finish(dbias, dbw, rc);
  lt_release(xc);
  lt_release(dyc);
  lt_release(muc);
  lt_release(rsc);
  free(partial);
  free(w);
  return rc;
}

int lt_layernorm_backward(lt_tensor *dx, lt_tensor *dweight, lt_tensor *dbias, const lt_tensor *dout,
                          const lt_tensor *x, const lt_tensor *weight, const lt_tensor *mean, const lt_tensor *rstd) {
  return norm_backward("layernorm_backward", dx, dweight, dbias, dout, x, weight, mean, rstd, 1);
}

int lt_rmsnorm_backward(lt_tensor *dx, lt_tensor *dweight, const lt_tensor *dout, const lt_tensor *x,
                        const lt_tensor *weight, const lt_tensor *rstd) {
  return norm_backward("rmsnorm_backward", dx, dweight, NULL, dout, x, weight, NULL, rstd, 0);
}
