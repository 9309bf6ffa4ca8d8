/* linear.c — the linear layer as one op: y = x @ w^T + bias, and its parameter
 * gradients, so that a GPU can do each in one cuBLASLt GEMM with the bias (and GELU) in its
 * epilogue and the bias gradient fused into the weight gradient's GEMM.
 *
 * On the CPU (and for CUDA operands the fused path cannot take: non-contiguous, a dtype
 * cuBLASLt lacks) the same results come from the plain ops: the output starts as the
 * broadcast bias and the GEMM adds into it (beta = 1, one pass less than adding after);
 * GELU (tanh form, as cuBLASLt's epilogue) is lt_unary after; the bias gradient is a
 * row sum of dy. */
#include "ops/backend.h"

static bool fusable(const lt_tensor *t) { return !t || !lt_is_defined(t) || lt_is_contiguous(t); }

static int check_linear(const char *op, const lt_tensor *x, const lt_tensor *w, const lt_tensor *bias, int act) {
  LT_TRY(lt_check_defined(op, "x", x));
  LT_TRY(lt_check_defined(op, "w", w));
  LT_TRY(lt_check_same_device(op, x, w));
  LT_TRY(lt_check_same_dtype(op, x, w));
  char sx[LT_SHAPE_STR], sw[LT_SHAPE_STR];
  if (x->ndim < 1 || w->ndim != 2 || w->shape[1] != x->shape[x->ndim - 1])
    return lt_errorf("%s: needs x (..., K) and w (N, K), got %s and %s", op, lt_shape_str(sx, x->ndim, x->shape),
                     lt_shape_str(sw, w->ndim, w->shape));
  if (act != 0 && act != 1) return lt_errorf("%s: act must be 0 (none) or 1 (gelu), got %d", op, act);
  if (bias && lt_is_defined(bias)) {
    LT_TRY(lt_check_same_device(op, x, bias));
    if (bias->ndim != 1 || bias->shape[0] != w->shape[0] || bias->dtype != x->dtype)
      return lt_errorf("%s: bias must be (%lld) %s, got %s %s", op, (long long)w->shape[0], lt_dtype_name(x->dtype),
                       lt_shape_str(sx, bias->ndim, bias->shape), lt_dtype_name(bias->dtype));
  }
  return 0;
}

// x (..., K), w (N, K), bias (N) or NULL -> out (..., N)
int lt_linear(lt_tensor *out, const lt_tensor *x, const lt_tensor *w, const lt_tensor *bias, int act) {
  const char *op = "linear";
  LT_TRY(check_linear(op, x, w, bias, act));
  bool has_bias = bias && lt_is_defined(bias);
  /* the device's fused entry (the CPU's table has none); no table and no error for a CUDA x in a
   * build without CUDA: the unfused path below refuses it in its own words */
  const lt_backend *be = lt_backend_lookup(op, x->device, NULL, false);
  if (be && be->linear_forward && x->dtype != LT_F64 && fusable(x) && fusable(w) && fusable(bias) && fusable(out) &&
      x->shape[x->ndim - 1] > 0)
    return be->linear_forward(out, x, w, has_bias ? bias : NULL, act);
  int64_t shape[LT_MAX_DIMS];
  memcpy(shape, x->shape, sizeof(int64_t) * (size_t)x->ndim);
  shape[x->ndim - 1] = w->shape[0];
  LT_TRY(lt_prepare_out(op, out, x->ndim, shape, x->dtype, x->device));
  if (has_bias) {
    lt_tensor *rows = lt_tensor_new();
    int rc = rows ? lt_expand(rows, bias, x->ndim, shape) : lt_errorf("%s: out of host memory", op);
    if (rc == 0) rc = lt_copy(out, rows);
    lt_release(rows);
    LT_TRY(rc);
  }
  LT_TRY(lt_matmul(out, x, w, 0, 1, 1.0, has_bias ? 1.0 : 0.0));
  return act ? lt_unary(out, out, LT_GELU) : 0;
}

// dy (..., N), x (..., K) -> dw (N, K) = dy^T x, dbias (N) = sum of dy over rows (NULL: not wanted)
int lt_linear_backward_params(lt_tensor *dw, lt_tensor *dbias, const lt_tensor *dy, const lt_tensor *x) {
  const char *op = "linear_backward";
  LT_TRY(lt_check_defined(op, "dy", dy));
  LT_TRY(lt_check_defined(op, "x", x));
  LT_TRY(lt_check_same_device(op, dy, x));
  LT_TRY(lt_check_same_dtype(op, dy, x));
  char sa[LT_SHAPE_STR], sb[LT_SHAPE_STR];
  if (dy->ndim < 1 || x->ndim < 1 || lt_shape_numel(dy->ndim - 1, dy->shape) != lt_shape_numel(x->ndim - 1, x->shape))
    return lt_errorf("%s: dy (..., N) and x (..., K) need the same rows, got %s and %s", op,
                     lt_shape_str(sa, dy->ndim, dy->shape), lt_shape_str(sb, x->ndim, x->shape));
  int64_t N = dy->shape[dy->ndim - 1], K = x->shape[x->ndim - 1], rows = lt_shape_numel(x->ndim - 1, x->shape);
  const lt_backend *be = lt_backend_lookup(op, dy->device, NULL, false); /* as in lt_linear */
  if (be && be->linear_backward_params && dy->dtype != LT_F64 && fusable(dy) && fusable(x) && fusable(dw) &&
      fusable(dbias) && rows > 0 && dy->ndim == x->ndim)
    return be->linear_backward_params(dw, dbias, dy, x);
  int64_t s2[2] = {rows, N}, x2s[2] = {rows, K};
  lt_tensor *dy2 = lt_tensor_new(), *x2 = lt_tensor_new();
  int rc = dy2 && x2 ? lt_reshape(dy2, dy, 2, s2) : lt_errorf("%s: out of host memory", op);
  if (rc == 0) rc = lt_reshape(x2, x, 2, x2s);
  if (rc == 0) rc = lt_matmul(dw, dy2, x2, 1, 0, 1.0, 0.0);
  if (rc == 0 && dbias) {
    int64_t dim0 = 0;
    rc = lt_reduce(dbias, dy2, LT_SUM, 1, &dim0, 0);
  }
  lt_release(dy2);
  lt_release(x2);
  return rc;
}
