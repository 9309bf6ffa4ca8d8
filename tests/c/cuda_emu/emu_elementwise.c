/* emu_elementwise.c — kernels/unary.cu, binary.cu, elementwise.cu and kernels/copy.cu under the
 * emulator against the CPU ops (suite "elementwise"): lt_unary and lt_unary_backward (every op),
 * lt_binary (every op, same shapes and broadcast), lt_binary_scalar (both orders), lt_where,
 * lt_clamp, lt_copy (every dtype pair, strided and transposed), lt_fill, lt_arange; inputs
 * contiguous, strided and transposed, outs allocated or strided. Tolerances: selftest/elementwise.lua. */
#include "emu_check.h"
static const int fdts[] = {LT_F32, LT_F64, LT_BF16, LT_F16};
static const int alldts[] = {LT_F32, LT_F64, LT_BF16, LT_F16, LT_I32, LT_I64, LT_U8, LT_BOOL};
static double ew_tol(int dt) { return emu_tol(dt, 1e-6, 1e-14, 1.0 / 128, 1.0 / 1024); }

/* runs cpu (into want) and dev (into got); both must succeed, or both fail */
#define CASE(name, dt, tol, cpu, dev)                                                                                  \
  do {                                                                                                                 \
    lt_tensor *want = lt_tensor_new();                                                                                 \
    int rc_cpu = (cpu);                                                                                                \
    lt_tensor *got = emu_out(want, rc_cpu == 0 ? out_mode++ % 2 : 0);                                                  \
    int rc_dev = (dev);                                                                                                \
    if (rc_cpu != 0 || rc_dev != 0) {                                                                                  \
      if ((rc_cpu != 0) != (rc_dev != 0)) {                                                                            \
        emu_fails++;                                                                                                   \
        printf("FAIL %s %s: cpu rc %d, device rc %d (%s)\n", name, lt_dtype_name(dt), rc_cpu, rc_dev,                 \
               lt_last_error());                                                                                       \
      }                                                                                                                \
    } else {                                                                                                           \
      emu_check(name, dt, got, want, tol);                                                                             \
    }                                                                                                                  \
    lt_release(want), lt_release(got);                                                                                 \
  } while (0)
static int out_mode;

static void shape_cases(int nd, const int64_t *shape) {
  char name[96];
  for (int k = 0; k < 4; k++) { /* unary, forward and backward */
    int dt = fdts[k];
    lt_tensor *x = emu_rnd(nd, shape, dt, -3, 3, 0), *g = emu_rnd(nd, shape, dt, -1, 1, 0);
    lt_tensor *xp = emu_rnd(nd, shape, dt, 0.1, 4, 0);
    for (int mode = 0; mode < 3; mode++) {
      lt_tensor *xd = emu_dev(x, mode), *gd = emu_dev(g, (mode + 1) % 3), *xpd = emu_dev(xp, mode);
      for (int op = 0; op < LT_NUM_UNARY_OPS; op++) {
        int pos = op == LT_LOG || op == LT_SQRT || op == LT_RSQRT || op == LT_RECIPROCAL;
        lt_tensor *a = pos ? xp : x, *ad = pos ? xpd : xd;
        snprintf(name, sizeof name, "unary %d%s", op, emu_mode_name[mode]);
        CASE(name, dt, ew_tol(dt), lt_unary(want, a, op), lt_unary(got, ad, op));
        snprintf(name, sizeof name, "unary %d in place%s", op, emu_mode_name[mode]);
        lt_tensor *ip = emu_dev(a, mode);
        CASE(name, dt, ew_tol(dt), lt_unary(want, a, op), (lt_release(got), got = ip, lt_unary(ip, ip, op)));
        snprintf(name, sizeof name, "unary_backward %d%s", op, emu_mode_name[mode]);
        CASE(name, dt, 4 * ew_tol(dt), lt_unary_backward(want, g, a, op), lt_unary_backward(got, gd, ad, op));
      }
      snprintf(name, sizeof name, "clamp%s", emu_mode_name[mode]);
      CASE(name, dt, 0, lt_clamp(want, x, -1, 0.5), lt_clamp(got, xd, -1, 0.5));
      lt_release(xd), lt_release(gd), lt_release(xpd);
    }
    lt_release(x), lt_release(g), lt_release(xp);
  }
  for (int k = 0; k < 8; k++) { /* binary, with b broadcast along dim 0 in every other run */
    int dt = alldts[k], fl = k < 4;
    int64_t bshape[8];
    memcpy(bshape, shape, sizeof bshape);
    for (int bc = 0; bc < 2; bc++) {
      if (bc) bshape[0] = 1;
      lt_tensor *a = emu_rnd(nd, shape, dt, fl ? -3 : 0, fl ? 3 : 9, !fl);
      lt_tensor *b = emu_rnd(nd, bshape, dt, fl ? 0.5 : 1, fl ? 2 : 5, !fl);
      lt_tensor *c = emu_rnd(nd, shape, LT_BOOL, 0, 2, 1);
      for (int mode = 0; mode < 3; mode++) {
        if (!emu_quick && mode == 2 && k >= 4) continue;
        lt_tensor *ad = emu_dev(a, mode), *bd = emu_dev(b, (mode + bc) % 3), *cd = emu_dev(c, mode);
        for (int op = 0; op < LT_NUM_BINARY_OPS; op++) {
          double tol = op == LT_POW ? ew_tol(dt) : 0;
          snprintf(name, sizeof name, "binary %d%s%s", op, bc ? " broadcast" : "", emu_mode_name[mode]);
          CASE(name, dt, tol, lt_binary(want, a, b, op), lt_binary(got, ad, bd, op));
          if (op < LT_EQ) {
            snprintf(name, sizeof name, "binary %d in place%s%s", op, bc ? " broadcast" : "", emu_mode_name[mode]);
            lt_tensor *ip = emu_dev(a, mode);
            CASE(name, dt, tol, lt_binary(want, a, b, op), (lt_release(got), got = ip, lt_binary(ip, ip, bd, op)));
          }
          if (bc) continue;
          for (int rev = 0; rev < 2; rev++) {
            snprintf(name, sizeof name, "binary_scalar %d rev %d%s", op, rev, emu_mode_name[mode]);
            CASE(name, dt, tol, lt_binary_scalar(want, a, 1.5, op, rev), lt_binary_scalar(got, ad, 1.5, op, rev));
          }
        }
        snprintf(name, sizeof name, "where%s%s", bc ? " broadcast" : "", emu_mode_name[mode]);
        CASE(name, dt, 0, lt_where(want, c, a, b), lt_where(got, cd, ad, bd));
        for (int k2 = 0; k2 < 8 && !bc; k2++) { /* copy with conversion */
          snprintf(name, sizeof name, "copy to %s%s", lt_dtype_name(alldts[k2]), emu_mode_name[mode]);
          lt_tensor *want = lt_tensor_new(), *got = lt_tensor_new();
          if (lt_empty(want, nd, shape, alldts[k2], -1) == 0 && lt_copy(want, a) == 0) {
            lt_empty(got, nd, shape, alldts[k2], -1);
            lt_fill(got, 77); /* garbage first: a copy that writes nothing must fail */
            lt_tensor *like = emu_dev(got, (mode + k2) % 3);
            if (lt_copy(like, ad) != 0) {
              emu_fails++;
              printf("FAIL %s: %s\n", name, lt_last_error());
            } else {
              emu_check(name, alldts[k2], like, want, 0);
            }
            lt_release(like);
          }
          lt_release(want), lt_release(got);
        }
        if (!bc) {
          snprintf(name, sizeof name, "fill%s", emu_mode_name[mode]);
          lt_tensor *want = lt_tensor_new(), *got = emu_dev(a, mode);
          lt_empty(want, nd, shape, dt, -1);
          lt_fill(want, 2.75);
          if (lt_fill(got, 2.75))
            emu_fails++, printf("FAIL %s: %s\n", name, lt_last_error());
          else
            emu_check(name, dt, got, want, 0);
          lt_release(want), lt_release(got);
        }
        lt_release(ad), lt_release(bd), lt_release(cd);
      }
      lt_release(a), lt_release(b), lt_release(c);
    }
    lt_tensor *want = lt_tensor_new(), *got = lt_tensor_new();
    if (lt_arange(want, -3, 40, 1.5, dt, -1) == 0) {
      if (lt_arange(got, -3, 40, 1.5, dt, 0))
        emu_fails++, printf("FAIL arange %s: %s\n", lt_dtype_name(dt), lt_last_error());
      else
        emu_check("arange", dt, got, want, 0);
    }
    lt_release(want), lt_release(got);
  }
}

void emu_suite_elementwise(void) {
  int64_t quick[][4] = {{1, 7}, {2, 3, 5}};
  int64_t full[][4] = {{1, 1}, {1, 7}, {2, 33, 5}, {3, 3, 5, 7}, {2, 2, 1030}, {1, 5000}};
  int n = emu_quick ? 2 : 6;
  for (int i = 0; i < n; i++) {
    int64_t *s = emu_quick ? quick[i] : full[i];
    shape_cases((int)s[0], s + 1);
  }
}
