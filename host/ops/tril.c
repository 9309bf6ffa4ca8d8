/* tril.c — tril and triu: the lower (upper) triangle of the last two dims, the rest zero, for
 * every dtype; in place when out is x. Their backward is the same op on the gradient.
 * CUDA tensors take the same checks and plan, then kernels/tril.cu (kernels/tril.h). */
#include "core/internal.h"
#include "ops/backend.h"

/* Row r of the (..., M, N) matrix rows: N elements, column j kept when j - i is on the side. */
static void tril_row(const lt_tril_plan *p, int64_t r) {
  int nd = p->ndim;
  int64_t M = p->shape[nd - 2], N = p->shape[nd - 1], i = r % M;
  int64_t xo = lt_offset_of(r, nd - 1, p->shape, p->xs), oo = lt_offset_of(r, nd - 1, p->shape, p->os);
  int esize = lt_dtype_size(p->dtype);
  for (int64_t j = 0; j < N; j++) {
    bool keep = p->upper ? j - i >= p->diagonal : j - i <= p->diagonal;
    char *dst = (char *)p->out + (oo + j * p->os[nd - 1]) * esize;
    if (keep)
      memmove(dst, (const char *)p->x + (xo + j * p->xs[nd - 1]) * esize, esize);
    else
      memset(dst, 0, esize); /* all-zero bits: 0 in every dtype */
  }
}

static int tri(const char *op, lt_tensor *out, const lt_tensor *x, int64_t diagonal, int upper) {
  LT_TRY(lt_check_defined(op, "x", x));
  if (x->ndim < 2) return lt_errorf("%s: x must have at least 2 dims, got %s", op, lt_desc((char[96]){0}, x));
  if (x->dtype < 0 || x->dtype >= LT_NUM_DTYPES) return lt_errorf("%s: unknown dtype %d", op, x->dtype);
  LT_TRY(lt_prepare_out_like(op, out, x, x->dtype));
  lt_tril_plan p;
  memset(&p, 0, sizeof p);
  p.device = x->device, p.dtype = x->dtype, p.upper = upper, p.ndim = x->ndim, p.diagonal = diagonal;
  memcpy(p.shape, x->shape, sizeof p.shape);
  memcpy(p.xs, x->stride, sizeof p.xs);
  memcpy(p.os, out->stride, sizeof p.os);
  p.numel = lt_numel(x), p.x = lt_data_ptr(x), p.out = lt_data_ptr(out);
  if (p.numel == 0) return 0;
  if (x->device != LT_DEVICE_CPU) {
    const lt_backend *be = lt_backend_for(op, x->device);
    if (!be) return -1;
    return be->tril(op, &p);
  }
  int64_t rows = p.numel / x->shape[x->ndim - 1];
  if (rows > 1 && p.numel >= LT_PAR_GRAIN) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++) tril_row(&p, r);
  } else {
    for (int64_t r = 0; r < rows; r++) tril_row(&p, r);
  }
  return 0;
}

int lt_tril(lt_tensor *out, const lt_tensor *x, int64_t diagonal) { return tri("tril", out, x, diagonal, 0); }
int lt_triu(lt_tensor *out, const lt_tensor *x, int64_t diagonal) { return tri("triu", out, x, diagonal, 1); }
