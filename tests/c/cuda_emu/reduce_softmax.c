/* reduce_softmax.c — kernels/reduce.cu and kernels/softmax.cu run under the CUDA emulator
 * (emu.h) against the CPU ops, through the real host entry points (host/ops/reduce.c,
 * ops/argmax.c, ops/softmax.c compiled with LUTRA_HAVE_CUDA), on
 * "device" tensors (CPU tensors marked device 0): every reduce op over every dim set,
 * var, argmax/argmin with ties, softmax/log_softmax forward and backward over every dim, each
 * contiguous, strided and transposed, into contiguous and strided outs; odd sizes, empty and
 * size-1 dims, -inf and NaN. Suites "reduce" and "softmax" of emu_main.c. */
#include "emu_check.h"
#undef OK
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static unsigned long long rs = 88172645463325252ULL;
static double uni(void) {
  rs ^= rs << 13;
  rs ^= rs >> 7;
  rs ^= rs << 17;
  return (double)(rs >> 11) / 9007199254740992.0;
}
static int fails, passes;
#define OK(x)                                                                                                          \
  do {                                                                                                                 \
    if ((x) != 0) {                                                                                                    \
      printf("error at %d: %s\n", __LINE__, lt_last_error());                                                          \
      exit(1);                                                                                                         \
    }                                                                                                                  \
  } while (0)

static lt_tensor *rnd(int nd, const int64_t *shape, int dtype, double lo, double hi, int ints) {
  lt_tensor *t = lt_tensor_new();
  OK(lt_empty(t, nd, shape, dtype, -1));
  int64_t n = lt_numel(t);
  double *b = malloc(sizeof(double) * (n + 1));
  for (int64_t i = 0; i < n; i++) b[i] = ints ? floor(lo + (hi - lo) * uni()) : lo + (hi - lo) * uni();
  OK(lt_copy_from_buffer(t, b, LT_F64, n));
  free(b);
  return t;
}
static lt_tensor *dev(const lt_tensor *x, int mode) { return emu_dev(x, mode); }
static int out_count;
/* every other out is a strided view (every other element of its last dim) */
static lt_tensor *out_like(const lt_tensor *w) {
  lt_tensor *o = emu_out(w, 1);
  if (out_count++ % 2 == 0) lt_release(o), o = lt_tensor_new(), lt_empty(o, w->ndim, w->shape, w->dtype, 0);
  return o;
}
static void check(const char *what, int dtype, const lt_tensor *got, const lt_tensor *want, double tol) {
  if (emu_check(what, dtype, got, want, tol)) passes++;
  else fails++;
}
static double tol_of(int dt) {
  return dt == LT_F32    ? ldexp(1, -22)
         : dt == LT_F64  ? 1e-12
         : dt == LT_BF16 ? ldexp(1, -7)
         : dt == LT_F16  ? ldexp(1, -10)
                         : 0;
}
static const char *mode_name[3] = {"", " strided", " transposed"};

static void reduce_cases(int nd, const int64_t *shape) {
  static const int dts[] = {LT_F32, LT_F64, LT_BF16, LT_F16, LT_I32, LT_I64, LT_U8, LT_BOOL};
  for (int k = 0; k < 8; k++) {
    int dt = dts[k], fl = k < 4;
    int full = dt == LT_F32 || dt == LT_I32 || dt == LT_BF16;
    lt_tensor *x = rnd(nd, shape, dt,
                       dt == LT_BOOL ? 0
                       : dt == LT_U8 ? 0
                                     : -1000,
                       dt == LT_BOOL ? 2
                       : dt == LT_U8 ? 256
                                     : 1000,
                       !fl);
    if (fl) {
      lt_release(x);
      x = rnd(nd, shape, dt, -1, 1, 0);
    }
    lt_tensor *p = rnd(nd, shape, dt, fl ? 0.95 : 0, fl ? 1.05 : 4, !fl);
    int64_t sets[12][2];
    int nsets[12], ns = 0;
    nsets[ns++] = 0;
    for (int d = 0; d < nd; d++) sets[ns][0] = d, nsets[ns++] = 1;
    if (nd >= 2) sets[ns][0] = 0, sets[ns][1] = nd - 1, nsets[ns++] = 2;
    for (int mode = 0; mode < (full ? 3 : 1); mode++) {
      lt_tensor *xd = dev(x, mode), *pd = dev(p, mode);
      for (int s = 0; s < ns; s++) {
        int keep = s % 2;
        for (int op = 0; op < LT_NUM_REDUCE_OPS; op++) {
          if (!fl && (op == LT_MEAN || op == LT_NORM)) continue;
          if (dt == LT_BOOL && (op == LT_SUM || op == LT_PROD)) continue;
          lt_tensor *src = op == LT_PROD ? p : x, *srcd = op == LT_PROD ? pd : xd;
          lt_tensor *want = lt_tensor_new();
          if (lt_reduce(want, src, op, nsets[s], sets[s], keep)) {
            lt_release(want);
            continue;
          } /* empty max */
          lt_tensor *got = out_like(want);
          OK(lt_reduce(got, srcd, op, nsets[s], sets[s], keep));
          char name[64];
          snprintf(name, sizeof name, "%s%s set%d", lt_reduce_name(op), mode_name[mode], s);
          check(name, dt, got, want, op == LT_MAX || op == LT_MIN ? 0 : tol_of(dt));
          lt_release(want), lt_release(got);
        }
        if (fl) {
          lt_tensor *want = lt_tensor_new();
          OK(lt_var(want, x, nsets[s], sets[s], s % 2, keep));
          lt_tensor *got = out_like(want);
          OK(lt_var(got, xd, nsets[s], sets[s], s % 2, keep));
          check(mode ? "var nc" : "var", dt, got, want, tol_of(dt));
          lt_release(want), lt_release(got);
        }
      }
      /* argmax/argmin on ties */
      lt_tensor *xt = rnd(nd, shape, dt, 0, dt == LT_BOOL ? 2 : 4, 1), *xtd = dev(xt, mode);
      for (int d = -1; d < nd; d++)
        for (int mx = 0; mx < 2; mx++) {
          lt_tensor *want = lt_tensor_new();
          int rc = mx ? lt_argmax(want, xt, d < 0 ? 0 : d, d % 2 == 0, d < 0)
                      : lt_argmin(want, xt, d < 0 ? 0 : d, d % 2 == 0, d < 0);
          if (rc) {
            lt_release(want);
            continue;
          }
          lt_tensor *got = out_like(want);
          OK(mx ? lt_argmax(got, xtd, d < 0 ? 0 : d, d % 2 == 0, d < 0)
                : lt_argmin(got, xtd, d < 0 ? 0 : d, d % 2 == 0, d < 0));
          check(mx ? "argmax" : "argmin", dt, got, want, 0);
          lt_release(want), lt_release(got);
        }
      lt_release(xt), lt_release(xtd), lt_release(xd), lt_release(pd);
    }
    lt_release(x), lt_release(p);
  }
}

static void softmax_cases(int nd, const int64_t *shape) {
  static const int dts[] = {LT_F32, LT_F64, LT_BF16, LT_F16};
  for (int k = 0; k < 4; k++) {
    int dt = dts[k];
    lt_tensor *x = rnd(nd, shape, dt, -5, 5, 0), *g = rnd(nd, shape, dt, -1, 1, 0);
    int64_t n = lt_numel(x);
    if (k % 2) { /* a -inf every 3rd element and a NaN, in the f64 and f16 runs */
      for (int64_t i = 0; i < n; i++) {
        int64_t idx[8], r = i;
        for (int d = nd - 1; d >= 0; d--) idx[d] = r % shape[d], r /= shape[d];
        if (i % 3 == 0 || i == 7) OK(lt_set_at(x, idx, i == 7 ? NAN : -INFINITY));
      }
    }
    for (int mode = 0; mode < 3; mode++) {
      lt_tensor *xd = dev(x, mode), *gd = dev(g, mode);
      for (int d = 0; d < nd; d++) {
        for (int kind = 0; kind < 4; kind++) {
          lt_tensor *y = lt_tensor_new(), *want = lt_tensor_new();
          if (kind % 2 == 0)
            OK(lt_softmax(y, x, d));
          else
            OK(lt_log_softmax(y, x, d));
          lt_tensor *got, *yd = NULL;
          double tol = dt == LT_F32 ? ldexp(1, -17) : dt == LT_F64 ? 1e-12 : tol_of(dt);
          if (kind < 2) {
            lt_set(want, y);
            got = out_like(want);
            OK(kind == 0 ? lt_softmax(got, xd, d) : lt_log_softmax(got, xd, d));
          } else {
            OK(kind == 2 ? lt_softmax_backward(want, g, y, d) : lt_log_softmax_backward(want, g, y, d));
            yd = dev(y, (mode + 1) % 3);
            got = out_like(want);
            OK(kind == 2 ? lt_softmax_backward(got, gd, yd, d) : lt_log_softmax_backward(got, gd, yd, d));
          }
          static const char *kn[4] = {"softmax", "log_softmax", "softmax_bwd", "log_softmax_bwd"};
          char name[64];
          snprintf(name, sizeof name, "%s%s dim%d", kn[kind], mode_name[mode], d);
          check(name, dt, got, want, tol);
          lt_release(y), lt_release(want), lt_release(got), lt_release(yd);
        }
      }
      lt_release(xd), lt_release(gd);
    }
    lt_release(x), lt_release(g);
  }
}

void emu_suite_reduce_softmax(const char *which) {
  int64_t shapes[][4] = {{1, 7}, {2, 3, 33}, {3, 3, 5, 7}, {3, 4, 1, 6}, {2, 4, 0},  {2, 0, 5},
                         {1, 1}, {2, 2, 3000}, {1, 20000},   {2, 3000, 3}, {2, 40, 33}, {1, 1023}};
  int ns = emu_quick ? 2 : (int)(sizeof shapes / sizeof *shapes);
  int p0 = passes, f0 = fails;
  for (int i = 0; i < ns; i++) {
    int nd = (int)shapes[i][0];
    if (strcmp(which, "reduce") == 0) reduce_cases(nd, shapes[i] + 1);
    if (strcmp(which, "softmax") == 0) softmax_cases(nd, shapes[i] + 1);
  }
  (void)p0, (void)f0; /* emu_check counted them */
}
