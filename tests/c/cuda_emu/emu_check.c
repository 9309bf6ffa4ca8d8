/* emu_check.c — the suites' shared helpers (emu_check.h). */
#include "emu_check.h"
#include "core/internal.h"
int emu_quick, emu_passes, emu_fails;
const char *emu_mode_name[3] = {"", " strided", " transposed"};
static unsigned long long rs = 88172645463325252ULL;
double emu_uni(void) {
  rs ^= rs << 13;
  rs ^= rs >> 7;
  rs ^= rs << 17;
  return (double)(rs >> 11) / 9007199254740992.0;
}
int64_t emu_irand(int64_t lo, int64_t hi) { return lo + (int64_t)(emu_uni() * (double)(hi - lo)); }
void emu_free(lt_tensor *t) {
  if (t) lt_release(t);
}
lt_tensor *emu_rnd(int nd, const int64_t *shape, int dtype, double lo, double hi, int ints) {
  lt_tensor *t = lt_tensor_new();
  if (lt_empty(t, nd, shape, dtype, -1)) return printf("emu_rnd: %s\n", lt_last_error()), NULL;
  int64_t n = lt_numel(t);
  double *b = malloc(sizeof(double) * (n + 1));
  for (int64_t i = 0; i < n; i++) b[i] = ints ? floor(lo + (hi - lo) * emu_uni()) : lo + (hi - lo) * emu_uni();
  lt_copy_from_buffer(t, b, LT_F64, n);
  free(b);
  return t;
}
/* the view of `mode` over base (a fresh tensor): see emu_dev */
static void view_of(lt_tensor *v, lt_tensor *base, int mode) {
  int nd = base->ndim;
  if (mode == 1) lt_slice(v, base, nd - 1, 0, base->shape[nd - 1], 2);
  else if (mode == 2) lt_transpose(v, base, 0, nd - 1);
  else lt_set(v, base);
}
static int64_t storage_bytes(const lt_tensor *t) { return lt_numel(t) * lt_dtype_size(t->dtype); }
lt_tensor *emu_dev(const lt_tensor *x, int mode) {
  int nd = x->ndim;
  if (nd < 1 || (mode == 2 && nd < 2)) mode = 0;
  int64_t sh[8];
  memcpy(sh, x->shape, sizeof sh);
  if (mode == 1) sh[nd - 1] *= 2;
  if (mode == 2) sh[0] = x->shape[nd - 1], sh[nd - 1] = x->shape[0];
  lt_tensor *cb = lt_tensor_new(), *db = lt_tensor_new(), *cv = lt_tensor_new(), *dv = lt_tensor_new();
  if (lt_empty(cb, nd, sh, x->dtype, -1) || lt_empty(db, nd, sh, x->dtype, 0)) printf("emu_dev: %s\n", lt_last_error());
  lt_fill(cb, 0);
  view_of(cv, cb, mode), view_of(dv, db, mode);
  lt_copy(cv, x);
  memcpy(lt_data_ptr(db), lt_data_ptr(cb), (size_t)storage_bytes(cb));
  lt_release(cb), lt_release(db), lt_release(cv);
  return dv;
}
lt_tensor *emu_host(const lt_tensor *t) {
  lt_tensor *h = lt_tensor_new();
  lt_empty(h, t->ndim, t->shape, t->dtype, -1);
  int64_t n = lt_numel(t), size = lt_dtype_size(t->dtype);
  const char *src = lt_data_ptr(t);
  char *dst = lt_data_ptr(h);
  for (int64_t i = 0; i < n; i++) {
    int64_t r = i, off = 0;
    for (int d = t->ndim - 1; d >= 0; d--) off += r % t->shape[d] * t->stride[d], r /= t->shape[d];
    memcpy(dst + i * size, src + off * size, (size_t)size);
  }
  return h;
}
lt_tensor *emu_out(const lt_tensor *w, int mode) {
  lt_tensor *o = lt_tensor_new();
  if (mode == 0) return o;
  int64_t sh[8];
  memcpy(sh, w->shape, sizeof sh);
  if (w->ndim >= 1) sh[w->ndim - 1] *= 2;
  lt_tensor *big = lt_tensor_new();
  lt_empty(big, w->ndim, sh, w->dtype, 0);
  view_of(o, big, w->ndim >= 1 ? 1 : 0);
  lt_release(big);
  return o;
}
double emu_tol(int dt, double f32, double f64, double bf16, double f16) {
  return dt == LT_F32 ? f32 : dt == LT_F64 ? f64 : dt == LT_BF16 ? bf16 : dt == LT_F16 ? f16 : 0;
}
int emu_check(const char *what, int dtype, const lt_tensor *got, const lt_tensor *want, double tol) {
  int64_t n = lt_numel(want);
  int bad_shape = !lt_is_defined(got) || got->ndim != want->ndim || lt_numel(got) != n || got->device != 0;
  for (int d = 0; !bad_shape && d < want->ndim; d++) bad_shape = got->shape[d] != want->shape[d];
  if (bad_shape) {
    emu_fails++;
    printf("FAIL %s %s: got a tensor of another shape or device\n", what, lt_dtype_name(dtype));
    return 0;
  }
  double *g = malloc(8 * (n + 1)), *w = malloc(8 * (n + 1));
  lt_tensor *gc = emu_host(got);
  lt_copy_to_buffer(gc, g, LT_F64, n);
  lt_release(gc);
  lt_copy_to_buffer(want, w, LT_F64, n);
  double scale = 1, err = 0;
  int64_t at = -1;
  for (int64_t i = 0; i < n; i++) {
    if (isfinite(w[i]) && fabs(w[i]) > scale) scale = fabs(w[i]);
    if (g[i] == w[i] || (g[i] != g[i] && w[i] != w[i])) continue;
    double e = fabs(g[i] - w[i]);
    if (e != e) e = INFINITY;
    if (e > err) err = e, at = i;
  }
  int ok = !(err > tol * scale);
  if (!ok) {
    emu_fails++;
    printf("FAIL %s %s shape", what, lt_dtype_name(dtype));
    for (int d = 0; d < want->ndim; d++) printf(" %lld", (long long)want->shape[d]);
    printf(": err %g (tol %g) at [%lld]\n", err, tol * scale, (long long)at);
    for (int64_t i = at < 4 ? 0 : at - 3; i < n && i < at + 4; i++)
      printf("   [%lld] got %.9g want %.9g\n", (long long)i, g[i], w[i]);
  } else {
    emu_passes++;
  }
  free(g), free(w);
  return ok;
}
