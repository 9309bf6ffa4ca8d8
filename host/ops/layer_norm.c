/* layer_norm.c — LayerNorm, forward and backward, plain or with the residual add of a pre-norm
 * block fused in, and the checked ops that RMSNorm shares (ops/rms_norm.c: LayerNorm with
 * center = 0, no bias): argument checks, outputs, and the dispatch to the CPU rows
 * (ops/layer_norm_cpu.c) or the CUDA kernels (kernels/layer_norm.cu). Both sides see contiguous
 * (N, C) rows: x (..., C) with N = numel / C; non-contiguous inputs are gathered and
 * non-contiguous outputs written through a contiguous work tensor. Saved mean/rstd are f32 (N),
 * or f64 when the caller passes them defined as f64 for f64 x.
 *
 * The fused entry points (lutra.h, "fused transformer kernels"):
 *   forward:  res_out = x + residual (the new residual stream), out = norm(res_out)
 *   backward: dx = norm_backward(dout) + dres, dres the gradient that reaches res_out from
 *             its other use (the next residual add), so that one pass over the rows
 *             replaces a norm backward and an add.
 * On the CPU both give the bits of the unfused ops for f32 and f64 (the forward's add rounds
 * once, the backward adds dres to the plain dx); 16-bit dx rounds once instead of twice. */
#include "ops/layer_norm.h"
#include "ops/backend.h"
#include "ops/device_tensors.h"
#include <stdio.h>

/* ---- device-aware helpers --------------------------------------------------------------- */

/* Checks that t (weight, residual, a statistic, ...) lives where x does. */
static int check_device(const char *op, const char *what, const lt_tensor *t, const lt_tensor *x) {
  if (t->device == x->device) return 0;
  char d[LT_DESC_STR], dev[16];
  return lt_errorf("%s: %s is %s, expected x's device (%s)", op, what, lt_desc(d, t), lt_device_str(dev, x->device));
}

/* Checks x's device exists in this build and makes it current before its memory is touched. */
static int use_device(const char *op, int device) {
  if (device == LT_DEVICE_CPU) return 0;
  const lt_backend *be = lt_backend_for(op, device);
  return be ? be->use_device(op, device) : -1;
}

/* c = t as a contiguous tensor on t's device (a view when t already is). */
static int gather(lt_tensor *c, const lt_tensor *t) {
  if (t->device == LT_DEVICE_CPU || lt_is_contiguous(t)) return lt_contiguous(c, t);
  const lt_backend *be = lt_backend_for("contiguous", t->device);
  if (!be) return -1;
  int64_t stride[LT_MAX_DIMS];
  LT_TRY(lt_empty(c, t->ndim, t->shape, t->dtype, t->device));
  lt_contiguous_strides(t->ndim, t->shape, stride);
  return be->strided_copy(t->device, lt_data_ptr(c), stride, lt_data_ptr(t), t->stride, t->ndim, t->shape, t->dtype);
}

/* A contiguous tensor on `device` to compute an output into: out itself when contiguous (allocated
 * if undefined), else a work tensor that out_finish scatters back. */
static lt_tensor *out_begin(const char *op, const char *what, lt_tensor *out, int ndim, const int64_t *shape, int dtype,
                            int device) {
  if (device == LT_DEVICE_CPU) return lt_out_begin(op, what, out, ndim, shape, dtype);
  return lt_nn_cuda_out_begin(op, what, out, ndim, shape, dtype, device);
}

static int out_finish(lt_tensor *out, lt_tensor *work, int rc) {
  if (work && out->device == LT_DEVICE_CPU) return lt_out_finish(out, work, rc);
  return lt_nn_cuda_out_finish(out, work, rc);
}

/* Checks weight (or bias) is a (C) vector of x's dtype or f32 on x's device, and makes buf a
 * contiguous (C) tensor of the compute type (f64 for f64 x, else f32) holding it, or `fill`
 * everywhere when t is NULL. */
static int param_tensor(const char *op, const char *what, const lt_tensor *t, const lt_tensor *x, int64_t C,
                        double fill, lt_tensor *buf) {
  int cdtype = x->dtype == LT_F64 ? LT_F64 : LT_F32;
  int64_t shape[1] = {C};
  if (t) {
    LT_TRY(lt_check_defined(op, what, t));
    LT_TRY(check_device(op, what, t, x));
    char d[LT_DESC_STR];
    if (t->ndim != 1 || t->shape[0] != C)
      return lt_errorf("%s: %s is %s, expected [%lld] for x's last dim", op, what, lt_desc(d, t), (long long)C);
    if (t->dtype != x->dtype && t->dtype != LT_F32)
      return lt_errorf("%s: %s is %s, expected x's dtype (%s) or f32", op, what, lt_dtype_name(t->dtype),
                       lt_dtype_name(x->dtype));
    if (t->dtype == cdtype && lt_is_contiguous(t)) return lt_set(buf, t);
  }
  LT_TRY(use_device(op, x->device));
  LT_TRY(lt_empty(buf, 1, shape, cdtype, x->device));
  if (!t) return lt_fill(buf, fill);
  if (x->device == LT_DEVICE_CPU) return lt_copy(buf, t);
  lt_tensor *tc = lt_tensor_new();
  int rc = tc ? gather(tc, t) : -1;
  if (rc == 0) rc = lt_copy(buf, tc); /* contiguous, same device: a conversion kernel */
  lt_release(tc);
  return rc;
}

/* Validates x and returns its row count and width; a CUDA x needs a CUDA build and the device. */
static int check_x(const char *op, const lt_tensor *x, int64_t *N, int64_t *C) {
  LT_TRY(lt_check_defined(op, "x", x));
  char d[LT_DESC_STR];
  if (!lt_dtype_is_float(x->dtype)) return lt_errorf("%s: x is %s, expected a floating dtype", op, lt_desc(d, x));
  if (x->ndim < 1 || x->shape[x->ndim - 1] < 1)
    return lt_errorf("%s: x is %s, expected (..., C) with C >= 1", op, lt_desc(d, x));
  LT_TRY(use_device(op, x->device));
  *C = x->shape[x->ndim - 1];
  *N = lt_numel(x) / *C;
  return 0;
}

/* A tensor that must have x's shape, dtype and device (residual, dout, dres). */
static int check_like_x(const char *op, const char *what, const lt_tensor *t, const lt_tensor *x) {
  LT_TRY(lt_check_defined(op, what, t));
  LT_TRY(check_device(op, what, t, x));
  char d1[LT_DESC_STR], d2[LT_DESC_STR];
  if (!lt_same_shape(t, x) || t->dtype != x->dtype)
    return lt_errorf("%s: %s is %s, expected the shape and dtype of x (%s)", op, what, lt_desc(d1, t), lt_desc(d2, x));
  return 0;
}

/* ---- forward ------------------------------------------------------------------------ */

/* Saved statistics are f32; for f64 x a caller may pass them already defined as f64 to keep
 * full precision through backward (gradient checks). */
static int stat_dtype(const lt_tensor *x, const lt_tensor *stat) {
  return x->dtype == LT_F64 && stat->storage && stat->dtype == LT_F64 ? LT_F64 : LT_F32;
}

int lt_layer_norm_forward_op(const char *op, lt_tensor *res_out, lt_tensor *out, lt_tensor *mean, lt_tensor *rstd,
                             const lt_tensor *x, const lt_tensor *residual, const lt_tensor *weight,
                             const lt_tensor *bias, double eps, int center) {
  int64_t N, C;
  LT_TRY(check_x(op, x, &N, &C));
  if (residual) {
    LT_TRY(check_like_x(op, "residual", residual, x));
    if (!res_out) return lt_errorf("%s: res_out is NULL", op);
    if (res_out == out || (res_out->storage && out && out->storage && lt_data_ptr(res_out) == lt_data_ptr(out)))
      return lt_errorf("%s: res_out and out must be different tensors", op);
  }
  int rc = -1, dtype = x->dtype, device = x->device;
  int64_t nshape[1] = {N};
  lt_tensor *xc = lt_tensor_new(), *rc_t = lt_tensor_new(), *w = lt_tensor_new(), *b = lt_tensor_new();
  lt_tensor *y = NULL, *res = NULL, *mu_t = NULL, *rs_t = NULL;
  if (!xc || !rc_t || !w || !b) goto done;
  if (param_tensor(op, "weight", weight, x, C, 1.0, w) || param_tensor(op, "bias", bias, x, C, 0.0, b)) goto done;
  if (gather(xc, x) || (residual && gather(rc_t, residual))) goto done;
  if (residual && !(res = out_begin(op, "res_out", res_out, x->ndim, x->shape, dtype, device))) goto done;
  if (!(y = out_begin(op, "out", out, x->ndim, x->shape, dtype, device))) goto done;
  if (mean && !(mu_t = out_begin(op, "mean", mean, 1, nshape, stat_dtype(x, mean), device))) goto done;
  if (rstd && !(rs_t = out_begin(op, "rstd", rstd, 1, nshape, stat_dtype(x, rstd), device))) goto done;
  lt_layer_norm_forward_plan p = {.device = device,
                                  .dtype = dtype,
                                  .N = N,
                                  .C = C,
                                  .eps = eps,
                                  .center = center,
                                  .x = lt_data_ptr(xc),
                                  .residual = residual ? lt_data_ptr(rc_t) : NULL,
                                  .res = res ? lt_data_ptr(res) : NULL,
                                  .y = lt_data_ptr(y),
                                  .w = lt_data_ptr(w),
                                  .b = lt_data_ptr(b),
                                  .mean = mu_t ? lt_data_ptr(mu_t) : NULL,
                                  .rstd = rs_t ? lt_data_ptr(rs_t) : NULL,
                                  .mean_dtype = mu_t ? mu_t->dtype : LT_F32,
                                  .rstd_dtype = rs_t ? rs_t->dtype : LT_F32};
  rc = lt_backend_for(op, device)->layer_norm_forward(op, &p); /* check_x found the backend */
done:
  if (residual) rc = out_finish(res_out, res, rc);
  rc = out_finish(out, y, rc);
  if (mean) rc = out_finish(mean, mu_t, rc);
  if (rstd) rc = out_finish(rstd, rs_t, rc);
  lt_release(xc), lt_release(rc_t), lt_release(w), lt_release(b);
  return rc;
}

int lt_layer_norm_forward(lt_tensor *out, lt_tensor *mean, lt_tensor *rstd, const lt_tensor *x, const lt_tensor *weight,
                          const lt_tensor *bias, double eps) {
  return lt_layer_norm_forward_op("layer_norm", NULL, out, mean, rstd, x, NULL, weight, bias, eps, 1);
}

int lt_add_layer_norm_forward(lt_tensor *res_out, lt_tensor *out, lt_tensor *mean, lt_tensor *rstd, const lt_tensor *x,
                              const lt_tensor *residual, const lt_tensor *weight, const lt_tensor *bias, double eps) {
  if (!residual) return lt_errorf("add_layer_norm: residual is NULL");
  return lt_layer_norm_forward_op("add_layer_norm", res_out, out, mean, rstd, x, residual, weight, bias, eps, 1);
}

/* ---- backward ----------------------------------------------------------------------- */

/* A saved statistic: f32 (or f64) with N elements on x's device, made contiguous into tc. */
static int check_stat(const char *op, const char *what, const lt_tensor *t, const lt_tensor *x, int64_t N,
                      lt_tensor *tc) {
  LT_TRY(lt_check_defined(op, what, t));
  LT_TRY(check_device(op, what, t, x));
  char d[LT_DESC_STR];
  if ((t->dtype != LT_F32 && t->dtype != LT_F64) || lt_numel(t) != N)
    return lt_errorf("%s: %s is %s, expected f32 [%lld] (one per row of x)", op, what, lt_desc(d, t), (long long)N);
  return gather(tc, t);
}

int lt_layer_norm_backward_op(const char *op, lt_tensor *dx, lt_tensor *dweight, lt_tensor *dbias,
                              const lt_tensor *dout, const lt_tensor *dres, const lt_tensor *x, const lt_tensor *weight,
                              const lt_tensor *mean, const lt_tensor *rstd, int center) {
  int64_t N, C;
  LT_TRY(check_x(op, x, &N, &C));
  LT_TRY(check_like_x(op, "dout", dout, x));
  if (dres) LT_TRY(check_like_x(op, "dres", dres, x));
  if (dweight && !weight) return lt_errorf("%s: dweight requested but weight is NULL", op);
  int dtype = x->dtype, device = x->device;
  int dbias_dtype = weight ? weight->dtype : dtype;
  if (dbias && dbias->storage) {
    char d[LT_DESC_STR];
    if (dbias->dtype != dtype && dbias->dtype != LT_F32)
      return lt_errorf("%s: dbias is %s, expected %s or f32", op, lt_desc(d, dbias), lt_dtype_name(dtype));
    dbias_dtype = dbias->dtype;
  }
  int rc = -1;
  int64_t cshape[1] = {C};
  lt_tensor *xc = lt_tensor_new(), *dyc = lt_tensor_new(), *drc = lt_tensor_new(), *muc = lt_tensor_new();
  lt_tensor *rsc = lt_tensor_new(), *w = lt_tensor_new();
  lt_tensor *dxw = NULL, *dww = NULL, *dbw = NULL;
  if (!xc || !dyc || !drc || !muc || !rsc || !w) goto done;
  if (param_tensor(op, "weight", weight, x, C, 1.0, w)) goto done;
  if (center && check_stat(op, "mean", mean, x, N, muc)) goto done;
  if (check_stat(op, "rstd", rstd, x, N, rsc) || gather(xc, x) || gather(dyc, dout)) goto done;
  if (dres && gather(drc, dres)) goto done;
  if (dx && !(dxw = out_begin(op, "dx", dx, x->ndim, x->shape, dtype, device))) goto done;
  if (dweight && !(dww = out_begin(op, "dweight", dweight, 1, cshape, weight->dtype, device))) goto done;
  if (dbias && !(dbw = out_begin(op, "dbias", dbias, 1, cshape, dbias_dtype, device))) goto done;
  lt_layer_norm_backward_plan p = {.device = device,
                                   .dtype = dtype,
                                   .N = N,
                                   .C = C,
                                   .center = center,
                                   .dy = lt_data_ptr(dyc),
                                   .x = lt_data_ptr(xc),
                                   .dres = dres ? lt_data_ptr(drc) : NULL,
                                   .w = lt_data_ptr(w),
                                   .mean = center ? lt_data_ptr(muc) : NULL,
                                   .rstd = lt_data_ptr(rsc),
                                   .mean_dtype = center ? muc->dtype : LT_F32,
                                   .rstd_dtype = rsc->dtype,
                                   .dx = dxw ? lt_data_ptr(dxw) : NULL,
                                   .dw = dww ? lt_data_ptr(dww) : NULL,
                                   .db = dbw ? lt_data_ptr(dbw) : NULL,
                                   .dw_dtype = dww ? dww->dtype : LT_F32,
                                   .db_dtype = dbw ? dbw->dtype : LT_F32};
  rc = lt_backend_for(op, device)->layer_norm_backward(op, &p); /* check_x found the backend */
done:
  if (dx) rc = out_finish(dx, dxw, rc);
  if (dweight) rc = out_finish(dweight, dww, rc);
  if (dbias) rc = out_finish(dbias, dbw, rc);
  lt_release(xc), lt_release(dyc), lt_release(drc), lt_release(muc), lt_release(rsc), lt_release(w);
  return rc;
}

int lt_layer_norm_backward(lt_tensor *dx, lt_tensor *dweight, lt_tensor *dbias, const lt_tensor *dout,
                           const lt_tensor *x, const lt_tensor *weight, const lt_tensor *mean, const lt_tensor *rstd) {
  return lt_layer_norm_backward_op("layer_norm_backward", dx, dweight, dbias, dout, NULL, x, weight, mean, rstd, 1);
}

int lt_layer_norm_backward_add(lt_tensor *dx, lt_tensor *dweight, lt_tensor *dbias, const lt_tensor *dout,
                               const lt_tensor *dres, const lt_tensor *x, const lt_tensor *weight,
                               const lt_tensor *mean, const lt_tensor *rstd) {
  return lt_layer_norm_backward_op("layer_norm_backward_add", dx, dweight, dbias, dout, dres, x, weight, mean, rstd, 1);
}
