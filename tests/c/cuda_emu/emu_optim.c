/* emu_optim.c — kernels/adamw.cu, lion.cu and multi_tensor.cu under the emulator against the CPU
 * ops (suite "optim"): AdamW and Lion one tensor at a time (every param dtype, contiguous or
 * strided state, two steps), multi-tensor AdamW (mixed dtypes, empty and odd sizes, master
 * weights), the multi-tensor sum of squares (f32 and f64 results) and scale, and clipping's
 * coefficient (incl. inf and nan); Adafactor (kernels/adafactor.cu: factored 2-d and 3-d, 1-d,
 * with and without beta1, weight decay, the relative step's parameter scale) and LAMB (lamb.cu,
 * a zero param: trust 1), f32 and f64, three steps, exact; LAMB and Adafactor over several tensors in one call.
 * Tolerances: lua/lutra/selftest/optim.lua (exact, but the sum of squares: 2^-22 / 1e-12). */
#include "emu_check.h"
static const int fdts[] = {LT_F32, LT_F64, LT_BF16, LT_F16};
static void same_rc(const char *name, int rc, int rd) {
  if ((rc != 0) != (rd != 0)) emu_fails++, printf("FAIL %s: cpu rc %d device rc %d: %s\n", name, rc, rd, lt_last_error());
}
static void single_cases(int64_t n, int mode) {
  char name[96];
  for (int k = 0; k < 4; k++) {
    int dt = fdts[k], sdt = dt == LT_F64 ? LT_F64 : LT_F32;
    lt_tensor *p = emu_rnd(1, &n, dt, -1, 1, 0), *g = emu_rnd(1, &n, dt, -1, 1, 0);
    lt_tensor *m = emu_rnd(1, &n, sdt, -0.1, 0.1, 0), *v = emu_rnd(1, &n, sdt, 0, 0.01, 0);
    lt_tensor *pd = emu_dev(p, mode), *gd = emu_dev(g, 1 - mode), *md = emu_dev(m, mode), *vd = emu_dev(v, 0);
    for (int step = 1; step <= 2; step++) {
      snprintf(name, sizeof name, "adamw step %d%s", step, emu_mode_name[mode]);
      int rc = lt_adamw_step(p, g, m, v, 1e-3, 0.9, 0.95, 1e-8, 0.1, step);
      int rd = lt_adamw_step(pd, gd, md, vd, 1e-3, 0.9, 0.95, 1e-8, 0.1, step);
      same_rc(name, rc, rd);
      if (rc || rd) break;
      emu_check(name, dt, pd, p, 0), emu_check(name, sdt, md, m, 0), emu_check(name, sdt, vd, v, 0);
    }
    for (int step = 1; step <= 2; step++) {
      snprintf(name, sizeof name, "lion step %d%s", step, emu_mode_name[mode]);
      int rc = lt_lion_step(p, g, m, 1e-3, 0.9, 0.99, 0.1), rd = lt_lion_step(pd, gd, md, 1e-3, 0.9, 0.99, 0.1);
      same_rc(name, rc, rd);
      if (rc || rd) break;
      emu_check(name, dt, pd, p, 0), emu_check(name, sdt, md, m, 0);
    }
    lt_release(p), lt_release(g), lt_release(m), lt_release(v);
    lt_release(pd), lt_release(gd), lt_release(md), lt_release(vd);
  }
}
enum { NT = 6 };
static void multi_cases(int quick) {
  int64_t sizes[NT] = {7, 0, 1, 1000, 33, 4099};
  int dts[NT] = {LT_F32, LT_BF16, LT_F64, LT_F16, LT_BF16, LT_F32};
  int nt = quick ? 4 : NT;
  if (quick) sizes[3] = 300;
  lt_tensor *p[NT], *g[NT], *m[NT], *v[NT], *ms[NT], *pd[NT], *gd[NT], *md[NT], *vd[NT], *msd[NT];
  for (int i = 0; i < nt; i++) {
    int sdt = dts[i] == LT_F64 ? LT_F64 : LT_F32;
    p[i] = emu_rnd(1, &sizes[i], dts[i], -1, 1, 0), g[i] = emu_rnd(1, &sizes[i], dts[i], -1, 1, 0);
    m[i] = emu_rnd(1, &sizes[i], sdt, -0.1, 0.1, 0), v[i] = emu_rnd(1, &sizes[i], sdt, 0, 0.01, 0);
    ms[i] = lt_tensor_new();
    if (dts[i] == LT_BF16 || dts[i] == LT_F16) { /* master weights: f32 copies */
      lt_empty(ms[i], 1, &sizes[i], LT_F32, -1);
      lt_copy(ms[i], p[i]);
    }
    pd[i] = emu_dev(p[i], 0), gd[i] = emu_dev(g[i], i % 2), md[i] = emu_dev(m[i], 0), vd[i] = emu_dev(v[i], 0);
    msd[i] = lt_is_defined(ms[i]) ? emu_dev(ms[i], 0) : lt_tensor_new();
  }
  char name[96];
  for (int step = 1; step <= 2; step++) {
    snprintf(name, sizeof name, "adamw_multi step %d", step);
    int rc = lt_adamw_step_multi(nt, p, g, m, v, ms, 1e-3, 0.9, 0.95, 1e-8, 0.1, step);
    int rd = lt_adamw_step_multi(nt, pd, gd, md, vd, msd, 1e-3, 0.9, 0.95, 1e-8, 0.1, step);
    same_rc(name, rc, rd);
    if (rc || rd) break;
    for (int i = 0; i < nt; i++) {
      emu_check(name, dts[i], pd[i], p[i], 0), emu_check(name, m[i]->dtype, md[i], m[i], 0);
      emu_check(name, v[i]->dtype, vd[i], v[i], 0);
      if (lt_is_defined(ms[i])) emu_check("adamw_multi master", LT_F32, msd[i], ms[i], 0);
    }
  }
  /* sum of squares (f32 out allocated, f64 out given), scale by it, clip coefficient */
  for (int f64 = 0; f64 < 2; f64++) {
    lt_tensor *s = lt_tensor_new(), *sd = lt_tensor_new();
    if (f64) lt_empty(s, 0, NULL, LT_F64, -1), lt_empty(sd, 0, NULL, LT_F64, 0);
    int rc = lt_multi_tensor_sumsq(s, nt, g), rd = lt_multi_tensor_sumsq(sd, nt, gd);
    same_rc("sumsq", rc, rd);
    if (!rc && !rd) {
      emu_check(f64 ? "sumsq f64" : "sumsq", s->dtype, sd, s, f64 ? 1e-12 : 1.0 / (1 << 22));
      lt_tensor *c = lt_tensor_new(), *cd = lt_tensor_new();
      for (int mx = 0; mx < 2; mx++) {
        double max_norm = mx ? 1e9 : 0.5; /* below and above the norm */
        rc = lt_clip_coef(c, s, max_norm), rd = lt_clip_coef(cd, sd, max_norm);
        same_rc("clip_coef", rc, rd);
        if (!rc && !rd) emu_check("clip_coef", c->dtype, cd, c, 0);
      }
      lt_tensor *sc = lt_tensor_new(), *scd = lt_tensor_new(); /* scale by the CPU's coefficient on both sides */
      lt_empty(sc, 0, NULL, s->dtype, -1), lt_fill(sc, 0.37);
      scd = emu_dev(sc, 0);
      rc = lt_multi_tensor_scale(nt, g, sc), rd = lt_multi_tensor_scale(nt, gd, scd);
      same_rc("multi_tensor_scale", rc, rd);
      for (int i = 0; i < nt && !rc && !rd; i++) emu_check("multi_tensor_scale", dts[i], gd[i], g[i], 0);
      lt_release(c), lt_release(cd), lt_release(sc), lt_release(scd);
    }
    lt_release(s), lt_release(sd);
  }
  for (int dt = 0; dt < 2; dt++) /* clip coefficient of an inf and a nan norm: 1 */
    for (int bad = 0; bad < 2; bad++) {
      lt_tensor *s = lt_tensor_new(), *c = lt_tensor_new(), *cd = lt_tensor_new();
      lt_empty(s, 0, NULL, dt ? LT_F64 : LT_F32, -1), lt_fill(s, bad ? NAN : INFINITY);
      lt_tensor *sd = emu_dev(s, 0);
      int rc = lt_clip_coef(c, s, 1.0), rd = lt_clip_coef(cd, sd, 1.0);
      same_rc("clip_coef nonfinite", rc, rd);
      if (!rc && !rd) emu_check("clip_coef nonfinite", c->dtype, cd, c, 0);
      lt_release(s), lt_release(c), lt_release(cd), lt_release(sd);
    }
  for (int i = 0; i < nt; i++) {
    lt_release(p[i]), lt_release(g[i]), lt_release(m[i]), lt_release(v[i]), lt_release(ms[i]);
    lt_release(pd[i]), lt_release(gd[i]), lt_release(md[i]), lt_release(vd[i]), lt_release(msd[i]);
  }
}
/* Adafactor and LAMB on one shape, f32 and f64, three steps from state the device wrote. */
static void extra_cases(int nd, const int64_t *shape, int zero_param) {
  char name[96];
  for (int k = 0; k < 2; k++) {
    int dt = k ? LT_F64 : LT_F32;
    int64_t n = 1, rows = nd >= 2 ? shape[nd - 2] : 1, cols = shape[nd - 1];
    for (int d = 0; d < nd; d++) n *= shape[d];
    int64_t rshape = n / cols, cshape = n / rows;
    lt_tensor *p = emu_rnd(nd, shape, dt, zero_param ? 0 : -1, zero_param ? 0 : 1, 0);
    lt_tensor *m = emu_rnd(1, &n, dt, 0, 0, 0), *m2 = emu_rnd(1, &n, dt, 0, 0, 0), *v = emu_rnd(1, &n, dt, 0, 0, 0);
    lt_tensor *row = nd >= 2 ? emu_rnd(1, &rshape, dt, 0, 0, 0) : NULL;
    lt_tensor *col = nd >= 2 ? emu_rnd(1, &cshape, dt, 0, 0, 0) : NULL;
    lt_tensor *q = emu_rnd(nd, shape, dt, -1, 1, 0);
    lt_tensor *pd = emu_dev(p, 0), *md = emu_dev(m, 0), *m2d = emu_dev(m2, 0), *vd = emu_dev(v, 0);
    lt_tensor *rowd = row ? emu_dev(row, 0) : NULL, *cold = col ? emu_dev(col, 0) : NULL, *qd = emu_dev(q, 0);
    for (int step = 1; step <= 3; step++) {
      lt_tensor *g = emu_rnd(nd, shape, dt, -1, 1, 0), *gd = emu_dev(g, step % 2);
      double beta2t = 1 - pow(step, -0.8), rel = fmin(1e-2, 1 / sqrt(step));
      snprintf(name, sizeof name, "adafactor %dd n %lld step %d", nd, (long long)n, step);
      int rc = lt_adafactor_step(p, g, m, row, col, row ? NULL : v, rel, 1, 1e-30, 1e-3, 1.0, beta2t, 0.9, 0.1);
      int rd = lt_adafactor_step(pd, gd, md, rowd, cold, rowd ? NULL : vd, rel, 1, 1e-30, 1e-3, 1.0, beta2t, 0.9, 0.1);
      same_rc(name, rc, rd);
      if (!rc && !rd) {
        emu_check(name, dt, pd, p, 0), emu_check(name, dt, md, m, 0);
        if (row) emu_check(name, dt, rowd, row, 0), emu_check(name, dt, cold, col, 0);
      }
      snprintf(name, sizeof name, "adafactor no beta1 %dd step %d", nd, step);
      rc = lt_adafactor_step(q, g, NULL, row, col, row ? NULL : v, 1e-2, 0, 1e-30, 1e-3, 0.5, beta2t, 0, 0);
      rd = lt_adafactor_step(qd, gd, NULL, rowd, cold, rowd ? NULL : vd, 1e-2, 0, 1e-30, 1e-3, 0.5, beta2t, 0, 0);
      same_rc(name, rc, rd);
      if (!rc && !rd) emu_check(name, dt, qd, q, 0);
      snprintf(name, sizeof name, "lamb %dd n %lld step %d", nd, (long long)n, step);
      rc = lt_lamb_step(p, g, m2, v, 1e-2, 0.9, 0.99, 1e-6, 0.01, step);
      rd = lt_lamb_step(pd, gd, m2d, vd, 1e-2, 0.9, 0.99, 1e-6, 0.01, step);
      same_rc(name, rc, rd);
      if (!rc && !rd) emu_check(name, dt, pd, p, 0), emu_check(name, dt, m2d, m2, 0), emu_check(name, dt, vd, v, 0);
      lt_release(g), lt_release(gd);
    }
    lt_release(p), lt_release(m), lt_release(m2), lt_release(v), lt_release(row), lt_release(col), lt_release(q);
    lt_release(pd), lt_release(md), lt_release(m2d), lt_release(vd), lt_release(rowd), lt_release(cold), lt_release(qd);
  }
}
/* LAMB over several tensors in one call (lamb.cu's multi-tensor launches) against the CPU's
 * per-tensor loop: f32 and f64 mixed, an empty and a one-element tensor, a tensor of several
 * chunks and a run that ends inside a chunk, a zero param (trust 1); three steps, exact. */
static void lamb_multi_cases(int quick) {
  enum { N = 6 };
  int64_t sizes[N] = {7, 0, 1, 40000, 2049, 33};
  int dts[N] = {LT_F32, LT_F64, LT_F64, LT_F32, LT_F64, LT_F32};
  if (quick) sizes[3] = 16385;
  lt_tensor *p[N], *m[N], *v[N], *pd[N], *md[N], *vd[N];
  for (int i = 0; i < N; i++) {
    double lo = i == 5 ? 0 : -1, hi = i == 5 ? 0 : 1;
    p[i] = emu_rnd(1, &sizes[i], dts[i], lo, hi, 0);
    m[i] = emu_rnd(1, &sizes[i], dts[i], 0, 0, 0), v[i] = emu_rnd(1, &sizes[i], dts[i], 0, 0, 0);
    pd[i] = emu_dev(p[i], 0), md[i] = emu_dev(m[i], 0), vd[i] = emu_dev(v[i], 0);
  }
  char name[96];
  for (int step = 1; step <= 3; step++) {
    lt_tensor *g[N], *gd[N];
    for (int i = 0; i < N; i++) g[i] = emu_rnd(1, &sizes[i], dts[i], -1, 1, 0), gd[i] = emu_dev(g[i], i % 2);
    snprintf(name, sizeof name, "lamb_multi step %d", step);
    int rc = lt_lamb_step_multi(N, p, g, m, v, 1e-2, 0.9, 0.99, 1e-6, 0.01, step);
    int rd = lt_lamb_step_multi(N, pd, gd, md, vd, 1e-2, 0.9, 0.99, 1e-6, 0.01, step);
    same_rc(name, rc, rd);
    for (int i = 0; i < N && !rc && !rd; i++)
      emu_check(name, dts[i], pd[i], p[i], 0), emu_check(name, dts[i], md[i], m[i], 0), emu_check(name, dts[i], vd[i], v[i], 0);
    for (int i = 0; i < N; i++) lt_release(g[i]), lt_release(gd[i]);
  }
  for (int i = 0; i < N; i++) {
    lt_release(p[i]), lt_release(m[i]), lt_release(v[i]), lt_release(pd[i]), lt_release(md[i]), lt_release(vd[i]);
  }
}
/* Adafactor over several tensors in one call (adafactor.cu's multi-tensor launches) against the
 * CPU's per-tensor loop: 1-d, factored 2-d and 3-d, empty, f32 and f64 mixed, a tensor of
 * several chunks, with and without beta1 and weight decay; three steps, exact. */
static void adafactor_multi_cases(int quick) {
  enum { N = 6 };
  int nds[N] = {1, 2, 1, 3, 2, 2};
  int64_t shapes[N][3] = {{37}, {19, 7}, {0}, {3, 5, 4}, {quick ? 130 : 300, 257}, {1, 9}};
  int dts[N] = {LT_F32, LT_F64, LT_F32, LT_F64, LT_F32, LT_F32};
  lt_tensor *p[N], *m[N], *row[N], *col[N], *v[N], *pd[N], *md[N], *rowd[N], *cold[N], *vd[N];
  for (int i = 0; i < N; i++) {
    int nd = nds[i];
    int64_t n = 1, R = nd >= 2 ? shapes[i][nd - 2] : 1, Cn = shapes[i][nd - 1];
    for (int d = 0; d < nd; d++) n *= shapes[i][d];
    int64_t rs = Cn ? n / Cn : 0, cs = R ? n / R : 0;
    p[i] = emu_rnd(nd, shapes[i], dts[i], -1, 1, 0), m[i] = emu_rnd(1, &n, dts[i], 0, 0, 0);
    row[i] = nd >= 2 ? emu_rnd(1, &rs, dts[i], 0, 0, 0) : NULL, col[i] = nd >= 2 ? emu_rnd(1, &cs, dts[i], 0, 0, 0) : NULL;
    v[i] = nd >= 2 ? NULL : emu_rnd(1, &n, dts[i], 0, 0, 0);
    pd[i] = emu_dev(p[i], 0), md[i] = emu_dev(m[i], 0), rowd[i] = row[i] ? emu_dev(row[i], 0) : NULL;
    cold[i] = col[i] ? emu_dev(col[i], 0) : NULL, vd[i] = v[i] ? emu_dev(v[i], 0) : NULL;
  }
  char name[96];
  for (int step = 1; step <= 3; step++) {
    lt_tensor *g[N], *gd[N];
    for (int i = 0; i < N; i++) g[i] = emu_rnd(nds[i], shapes[i], dts[i], -1, 1, 0), gd[i] = emu_dev(g[i], i % 2);
    double beta2t = 1 - pow(step, -0.8), beta1 = step == 2 ? 0 : 0.9, wd = step == 3 ? 0 : 0.1;
    snprintf(name, sizeof name, "adafactor_multi step %d", step);
    int rc = lt_adafactor_step_multi(N, p, g, beta1 > 0 ? m : NULL, row, col, v, 1e-2, 1, 1e-30, 1e-3, 1.0, beta2t, beta1, wd);
    int rd = lt_adafactor_step_multi(N, pd, gd, beta1 > 0 ? md : NULL, rowd, cold, vd, 1e-2, 1, 1e-30, 1e-3, 1.0, beta2t,
                                     beta1, wd);
    same_rc(name, rc, rd);
    for (int i = 0; i < N && !rc && !rd; i++) {
      emu_check(name, dts[i], pd[i], p[i], 0), emu_check(name, dts[i], md[i], m[i], 0);
      if (row[i]) emu_check(name, dts[i], rowd[i], row[i], 0), emu_check(name, dts[i], cold[i], col[i], 0);
      if (v[i]) emu_check(name, dts[i], vd[i], v[i], 0);
    }
    for (int i = 0; i < N; i++) lt_release(g[i]), lt_release(gd[i]);
  }
  for (int i = 0; i < N; i++) {
    lt_release(p[i]), lt_release(m[i]), lt_release(row[i]), lt_release(col[i]), lt_release(v[i]);
    lt_release(pd[i]), lt_release(md[i]), lt_release(rowd[i]), lt_release(cold[i]), lt_release(vd[i]);
  }
}
void emu_suite_optim(void) {
  lamb_multi_cases(emu_quick);
  adafactor_multi_cases(emu_quick);
  int64_t s1[1] = {37}, s2[2] = {19, 7}, s3[3] = {3, 5, 4}, big[2] = {70, 90};
  extra_cases(1, s1, 0), extra_cases(2, s2, 0), extra_cases(3, s3, 0), extra_cases(2, s2, 1);
  if (!emu_quick) extra_cases(2, big, 0);
  single_cases(7, 0);
  single_cases(33, 1);
  if (!emu_quick) single_cases(1, 0), single_cases(5000, 1), single_cases(1029, 0);
  multi_cases(emu_quick);
}
