/* cumsum.c — cumsum and cumprod along one dim, and their backwards: cumsum's is a cumsum from
 * the end of the row (lt_cumsum with reverse), cumprod's is lt_cumprod_backward, right where
 * the row has zeros (below).
 *
 * The CPU runs one row per thread, in double for every dtype. CUDA tensors take the same checks
 * and plan, then kernels/cumsum.cu (kernels/cumsum.h). */
#include "ops/along_dim.h"
#include "ops/backend.h"
#include <stdlib.h>

/* cumprod's gradient on one row (x and g loaded into doubles), y = cumprod(x):
 *   dx_i = sum_{j>=i} g_j prod_{k<=j, k!=i} x_k = y_{i-1} S_i,  S_i = g_i + x_{i+1} S_{i+1}
 * (y_{-1} = 1, S_{n-1} = g_{n-1}): no division, so zeros in x need no special case and the
 * result is exact up to rounding. dx is written into g; y is scratch. */
static void cumprod_backward_row(int64_t n, const double *x, double *g, double *y) {
  double p = 1;
  for (int64_t i = 0; i < n; i++) y[i] = p, p *= x[i]; /* y[i] holds y_{i-1} */
  double S = 0;
  for (int64_t i = n - 1; i >= 0; i--) {
    S = g[i] + (i + 1 < n ? x[i + 1] * S : 0);
    g[i] = y[i] * S;
  }
}

static void cumsum_row(const lt_cumsum_plan *p, int64_t r, double *buf) {
  int64_t xo = lt_offset_of(r, p->nkept, p->kshape, p->xk), oo = lt_offset_of(r, p->nkept, p->kshape, p->ok);
  int64_t n = p->n;
  for (int64_t j = 0; j < n; j++) buf[j] = lt_load_f64(p->x, p->dtype, xo + j * p->xd);
  if (p->kind == LT_CUMPROD_BACKWARD) {
    int64_t go = lt_offset_of(r, p->nkept, p->kshape, p->gk);
    double *g = buf + n;
    for (int64_t j = 0; j < n; j++) g[j] = lt_load_f64(p->g, p->dtype, go + j * p->gd);
    cumprod_backward_row(n, buf, g, g + n);
    for (int64_t j = 0; j < n; j++) lt_store_f64(p->out, p->dtype, oo + j * p->od, g[j]);
    return;
  }
  double acc = p->kind == LT_CUMPROD ? 1 : 0;
  for (int64_t t = 0; t < n; t++) {
    int64_t j = p->reverse ? n - 1 - t : t;
    acc = p->kind == LT_CUMPROD ? acc * buf[j] : acc + buf[j];
    lt_store_f64(p->out, p->dtype, oo + j * p->od, acc);
  }
}

static int cumsum_cpu(const char *op, const lt_cumsum_plan *p) {
  int failed = 0;
#pragma omp parallel if (p->rows > 1 && p->rows * p->n >= LT_PAR_GRAIN)
  {
    double *buf = malloc(sizeof(double) * 3 * (size_t)(p->n ? p->n : 1));
    if (!buf) {
#pragma omp atomic write
      failed = 1;
    }
#pragma omp for schedule(static)
    for (int64_t r = 0; r < p->rows; r++)
      if (buf) cumsum_row(p, r, buf);
    free(buf);
  }
  return failed ? lt_errorf("%s: out of host memory", op) : 0;
}

static int check_float(const char *op, const char *what, const lt_tensor *t) {
  LT_TRY(lt_check_defined(op, what, t));
  if (!lt_dtype_is_float(t->dtype))
    return lt_errorf("%s: %s must be a float tensor (f32, f64, bf16, f16), got %s", op, what,
                     lt_desc((char[96]){0}, t));
  return 0;
}

/* out (x's shape) from x along dim; g: cumprod's result gradient for LT_CUMPROD_BACKWARD. */
static int scan(const char *op, int kind, lt_tensor *out, const lt_tensor *x, const lt_tensor *g, int dim,
                int reverse) {
  LT_TRY(check_float(op, "x", x));
  int d;
  LT_TRY(lt_wrap_dim(op, dim, x->ndim, &d));
  if (g) {
    LT_TRY(check_float(op, "grad_out", g));
    LT_TRY(lt_check_same_device(op, x, g));
    LT_TRY(lt_check_same_dtype(op, x, g));
    if (!lt_same_shape(x, g))
      return lt_errorf("%s: grad_out %s must have x's shape %s", op, lt_desc((char[96]){0}, g),
                       lt_desc((char[96]){0}, x));
  }
  LT_TRY(lt_prepare_out_like(op, out, x, x->dtype));
  lt_cumsum_plan p;
  memset(&p, 0, sizeof p);
  p.device = x->device, p.dtype = x->dtype, p.kind = kind, p.reverse = reverse != 0;
  p.nkept = along_dim_kept(x, d, p.kshape, &p.rows);
  p.n = x->ndim ? x->shape[d] : 1;
  p.x = lt_data_ptr(x), p.out = lt_data_ptr(out);
  along_dim_strides(x, d, p.xk, &p.xd);
  along_dim_strides(out, d, p.ok, &p.od);
  if (g) p.g = lt_data_ptr(g), along_dim_strides(g, d, p.gk, &p.gd);
  if (p.rows * p.n == 0) return 0;
  if (x->device == LT_DEVICE_CPU) return cumsum_cpu(op, &p);
  const lt_backend *be = lt_backend_for(op, x->device);
  if (!be) return -1;
  return be->cumsum(op, &p);
}

int lt_cumsum(lt_tensor *out, const lt_tensor *x, int dim, int reverse) {
  return scan("cumsum", LT_CUMSUM, out, x, NULL, dim, reverse);
}
int lt_cumprod(lt_tensor *out, const lt_tensor *x, int dim) { return scan("cumprod", LT_CUMPROD, out, x, NULL, dim, 0); }
int lt_cumprod_backward(lt_tensor *grad_in, const lt_tensor *grad_out, const lt_tensor *x, int dim) {
  return scan("cumprod_backward", LT_CUMPROD_BACKWARD, grad_in, x, grad_out, dim, 0);
}
