/* emu_nn.c — kernels/layer_norm.cu, kernels/cross_entropy.cu, embedding.cu, rope.cu and kernels/random.cu under the
 * emulator against the CPU ops (suites "layer_norm", "loss", "embedding", "rope", "rng"). Each case calls the
 * same lt_* entry point on CPU tensors and on their device copies (contiguous, strided or
 * transposed), with every optional output, and compares every output with the tolerances of
 * lua/lutra/selftest/{layer_norm,rms_norm,cross_entropy,embedding,rope,random}.lua; rng must be
 * bit-identical. */
#include "emu_check.h"
static const int fdts[] = {LT_F32, LT_F64, LT_BF16, LT_F16};
enum { MAXT = 6 };
/* the outputs of one call on both sides: c[i] (CPU) and d[i] (device), all start undefined */
typedef struct {
  lt_tensor *c[MAXT], *d[MAXT];
} pair;
static void pair_init(pair *p) {
  for (int i = 0; i < MAXT; i++) p->c[i] = lt_tensor_new(), p->d[i] = lt_tensor_new();
}
static void pair_free(pair *p) {
  for (int i = 0; i < MAXT; i++) lt_release(p->c[i]), lt_release(p->d[i]);
}
/* both sides must agree on success; then outputs [0, n) are compared with tol[i] */
static void pair_check(const char *name, int dt, pair *p, int rc_c, int rc_d, int n, const double *tol,
                       const char *const *what) {
  if (rc_c || rc_d) {
    if ((rc_c != 0) != (rc_d != 0)) emu_fails++, printf("FAIL %s %s: cpu rc %d, device rc %d: %s\n", name,
                                                        lt_dtype_name(dt), rc_c, rc_d, lt_last_error());
    else if (getenv("EMU_VERBOSE"))
      printf("refused by both sides (as expected) %s %s: %s\n", name, lt_dtype_name(dt), lt_last_error());
    return;
  }
  char full[160];
  for (int i = 0; i < n; i++) {
    if (!lt_is_defined(p->c[i]) || tol[i] < 0) continue;
    snprintf(full, sizeof full, "%s %s", name, what[i]);
    emu_check(full, dt, p->d[i], p->c[i], tol[i]);
  }
}
#define D(x, m) emu_dev(x, m)

static void layer_norm_cases(int64_t N, int64_t C) {
  int64_t sh[2] = {N, C};
  char name[96];
  for (int k = 0; k < 4; k++) {
    int dt = fdts[k];
    double tol = emu_tol(dt, 1e-5, 1e-12, 1.0 / 128, 1.0 / 1024), stol = dt == LT_F64 ? 1e-12 : 1e-5;
    lt_tensor *x = emu_rnd(2, sh, dt, -2, 2, 0), *r = emu_rnd(2, sh, dt, -2, 2, 0), *g = emu_rnd(2, sh, dt, -1, 1, 0);
    lt_tensor *dres = emu_rnd(2, sh, dt, -1, 1, 0), *w = emu_rnd(1, &C, dt, 0.5, 1.5, 0), *b = emu_rnd(1, &C, dt, -1, 1, 0);
    for (int mode = 0; mode < 3; mode++) {
      if (emu_quick && mode == 2) continue;
      lt_tensor *xd = D(x, mode), *rd = D(r, (mode + 1) % 3), *gd = D(g, mode), *dresd = D(dres, mode);
      lt_tensor *wd = D(w, mode), *bd = D(b, 0);
      for (int affine = 0; affine < 2; affine++) {
        lt_tensor *W = affine ? w : NULL, *B = affine ? b : NULL, *Wd = affine ? wd : NULL, *Bd = affine ? bd : NULL;
        pair p, q;
        static const char *lnw[] = {"y", "mean", "rstd", "dx", "dw", "db"};
        double lt_[] = {tol, stol, stol, tol, tol, tol};
        /* layer_norm forward, then backward from the CPU's statistics */
        pair_init(&p);
        snprintf(name, sizeof name, "layer_norm%s%s", affine ? "" : " plain", emu_mode_name[mode]);
        int rc = lt_layer_norm_forward(p.c[0], p.c[1], p.c[2], x, W, B, 1e-5);
        int rd_ = lt_layer_norm_forward(p.d[0], p.d[1], p.d[2], xd, Wd, Bd, 1e-5);
        pair_check(name, dt, &p, rc, rd_, 3, lt_, lnw);
        if (rc == 0) {
          lt_tensor *md = D(p.c[1], 0), *sd = D(p.c[2], 0);
          pair_init(&q);
          snprintf(name, sizeof name, "layer_norm_backward%s%s", affine ? "" : " plain", emu_mode_name[mode]);
          rc = lt_layer_norm_backward(q.c[3], affine ? q.c[4] : NULL, affine ? q.c[5] : NULL, g, x, W, p.c[1], p.c[2]);
          rd_ = lt_layer_norm_backward(q.d[3], affine ? q.d[4] : NULL, affine ? q.d[5] : NULL, gd, xd, Wd, md, sd);
          pair_check(name, dt, &q, rc, rd_, 6, lt_, lnw);
          pair_free(&q), pair_init(&q);
          snprintf(name, sizeof name, "layer_norm_backward_add%s%s", affine ? "" : " plain", emu_mode_name[mode]);
          rc = lt_layer_norm_backward_add(q.c[3], affine ? q.c[4] : NULL, affine ? q.c[5] : NULL, g, dres, x, W, p.c[1],
                                         p.c[2]);
          rd_ = lt_layer_norm_backward_add(q.d[3], affine ? q.d[4] : NULL, affine ? q.d[5] : NULL, gd, dresd, xd, Wd, md,
                                          sd);
          pair_check(name, dt, &q, rc, rd_, 6, lt_, lnw);
          pair_free(&q), lt_release(md), lt_release(sd);
        }
        pair_free(&p), pair_init(&p);
        /* rms_norm */
        static const char *rnw[] = {"y", "-", "rstd", "dx", "dw", "-"};
        snprintf(name, sizeof name, "rms_norm%s%s", affine ? "" : " plain", emu_mode_name[mode]);
        rc = lt_rms_norm_forward(p.c[0], p.c[2], x, W, 1e-5);
        rd_ = lt_rms_norm_forward(p.d[0], p.d[2], xd, Wd, 1e-5);
        pair_check(name, dt, &p, rc, rd_, 3, lt_, rnw);
        if (rc == 0) {
          lt_tensor *sd = D(p.c[2], 0);
          pair_init(&q);
          snprintf(name, sizeof name, "rms_norm_backward%s%s", affine ? "" : " plain", emu_mode_name[mode]);
          rc = lt_rms_norm_backward(q.c[3], affine ? q.c[4] : NULL, g, x, W, p.c[2]);
          rd_ = lt_rms_norm_backward(q.d[3], affine ? q.d[4] : NULL, gd, xd, Wd, sd);
          pair_check(name, dt, &q, rc, rd_, 6, lt_, rnw);
          pair_free(&q), pair_init(&q);
          snprintf(name, sizeof name, "rms_norm_backward_add%s%s", affine ? "" : " plain", emu_mode_name[mode]);
          rc = lt_rms_norm_backward_add(q.c[3], affine ? q.c[4] : NULL, g, dres, x, W, p.c[2]);
          rd_ = lt_rms_norm_backward_add(q.d[3], affine ? q.d[4] : NULL, gd, dresd, xd, Wd, sd);
          pair_check(name, dt, &q, rc, rd_, 6, lt_, rnw);
          if (rc == 0) { /* in place: dx is dres, then dout */
            for (int which = 0; which < 2; which++) {
              lt_tensor *ip = emu_dev(which ? g : dres, mode), *dw = lt_tensor_new();
              snprintf(name, sizeof name, "rms_norm_backward_add dx=%s%s", which ? "dout" : "dres", emu_mode_name[mode]);
              if (lt_rms_norm_backward_add(ip, affine ? dw : NULL, which ? ip : gd, which ? dresd : ip, xd, Wd, sd))
                emu_fails++, printf("FAIL %s: %s\n", name, lt_last_error());
              else
                emu_check(name, dt, ip, q.c[3], tol);
              lt_release(ip), lt_release(dw);
            }
          }
          pair_free(&q), lt_release(sd);
        }
        pair_free(&p), pair_init(&p);
        /* the fused residual forwards */
        static const char *aw[] = {"y", "mean", "rstd", "res_out"};
        double at[] = {tol, stol, stol, 0};
        snprintf(name, sizeof name, "add_layer_norm%s%s", affine ? "" : " plain", emu_mode_name[mode]);
        rc = lt_add_layer_norm_forward(p.c[3], p.c[0], p.c[1], p.c[2], x, r, W, B, 1e-5);
        rd_ = lt_add_layer_norm_forward(p.d[3], p.d[0], p.d[1], p.d[2], xd, rd, Wd, Bd, 1e-5);
        pair_check(name, dt, &p, rc, rd_, 4, at, aw);
        if (rc == 0) { /* in place: res_out is x */
          lt_tensor *ip = emu_dev(x, mode), *o = lt_tensor_new(), *m = lt_tensor_new(), *sr = lt_tensor_new();
          snprintf(name, sizeof name, "add_layer_norm res_out=x%s%s", affine ? "" : " plain", emu_mode_name[mode]);
          if (lt_add_layer_norm_forward(ip, o, m, sr, ip, rd, Wd, Bd, 1e-5))
            emu_fails++, printf("FAIL %s: %s\n", name, lt_last_error());
          else
            emu_check(name, dt, ip, p.c[3], 0), emu_check(name, dt, o, p.c[0], tol);
          lt_release(ip), lt_release(o), lt_release(m), lt_release(sr);
        }
        pair_free(&p), pair_init(&p);
        snprintf(name, sizeof name, "add_rms_norm%s%s", affine ? "" : " plain", emu_mode_name[mode]);
        rc = lt_add_rms_norm_forward(p.c[3], p.c[0], p.c[2], x, r, W, 1e-5);
        rd_ = lt_add_rms_norm_forward(p.d[3], p.d[0], p.d[2], xd, rd, Wd, 1e-5);
        pair_check(name, dt, &p, rc, rd_, 4, at, aw);
        pair_free(&p);
      }
      lt_release(xd), lt_release(rd), lt_release(gd), lt_release(dresd), lt_release(wd), lt_release(bd);
    }
    lt_release(x), lt_release(r), lt_release(g), lt_release(dres), lt_release(w), lt_release(b);
  }
}
void emu_suite_layer_norm(void) {
  int64_t quick[][2] = {{3, 7}, {2, 40}}, full[][2] = {{1, 1}, {5, 7}, {3, 300}, {2, 1030}, {7, 65}, {1, 4099}};
  int n = emu_quick ? 2 : 6;
  for (int i = 0; i < n; i++)
    layer_norm_cases(emu_quick ? quick[i][0] : full[i][0], emu_quick ? quick[i][1] : full[i][1]);
  for (int i = 0; i < (emu_quick ? 0 : 4); i++) layer_norm_cases(emu_irand(1, 20), emu_irand(1, 3000)); /* random */
  if (!emu_quick) layer_norm_cases(300, 5), layer_norm_cases(2, 8192);
}

static void loss_cases(int64_t N, int64_t V) {
  int64_t sh[2] = {N, V};
  char name[96];
  for (int k = 0; k < 4; k++) {
    int dt = fdts[k];
    double ft = emu_tol(dt, 3e-5, 1e-12, 3e-5, 3e-5), bt = emu_tol(dt, 1e-6, 1e-14, 1.0 / 64, 1.0 / 512);
    lt_tensor *x = emu_rnd(2, sh, dt, -4, 4, 0), *dl = emu_rnd(1, &N, LT_F32, -1, 1, 0);
    for (int tdt = LT_I32; tdt <= LT_I64; tdt++) {
      lt_tensor *t = emu_rnd(1, &N, tdt, 0, (double)V, 1);
      if (N > 2) lt_set_at(t, (int64_t[]){1}, -100); /* an ignored row */
      for (int mode = 0; mode < 3; mode++) {
        if (emu_quick && mode == 2) continue;
        lt_tensor *xd = D(x, mode), *td = D(t, mode % 2), *dld = D(dl, 0);
        pair p;
        pair_init(&p);
        static const char *w[] = {"loss", "lse", "dlogits"};
        double tol[] = {ft, ft, bt};
        snprintf(name, sizeof name, "cross_entropy %s%s", lt_dtype_name(tdt), emu_mode_name[mode]);
        int rc = lt_cross_entropy_forward(p.c[0], p.c[1], x, t, -100);
        int rd = lt_cross_entropy_forward(p.d[0], p.d[1], xd, td, -100);
        pair_check(name, dt, &p, rc, rd, 2, tol, w);
        if (rc == 0) {
          lt_tensor *dl2 = dl;
          if (p.c[1]->dtype != LT_F32) { /* dlosses of the lse's dtype */
            dl2 = lt_tensor_new();
            lt_empty(dl2, 1, &N, p.c[1]->dtype, -1), lt_copy(dl2, dl);
          }
          lt_tensor *sd = D(p.c[1], 0), *dl2d = D(dl2, 0);
          snprintf(name, sizeof name, "cross_entropy_backward %s%s", lt_dtype_name(tdt), emu_mode_name[mode]);
          rc = lt_cross_entropy_backward(p.c[2], dl2, x, t, p.c[1], -100);
          rd = lt_cross_entropy_backward(p.d[2], dl2d, xd, td, sd, -100);
          pair_check(name, dt, &p, rc, rd, 3, (double[]){-1, -1, bt}, w);
          lt_tensor *ip = emu_dev(x, mode); /* in place: dlogits is logits */
          snprintf(name, sizeof name, "cross_entropy_backward in place %s%s", lt_dtype_name(tdt), emu_mode_name[mode]);
          if (rc == 0) {
            if (lt_cross_entropy_backward(ip, dl2d, ip, td, sd, -100))
              emu_fails++, printf("FAIL %s: %s\n", name, lt_last_error());
            else
              emu_check(name, dt, ip, p.c[2], bt);
          }
          lt_release(ip);
          lt_release(sd), lt_release(dl2d);
          if (dl2 != dl) lt_release(dl2);
        }
        pair_free(&p);
        lt_release(xd), lt_release(td), lt_release(dld);
      }
      /* a target out of range: both refuse */
      lt_set_at(t, (int64_t[]){0}, (double)V);
      lt_tensor *xd = D(x, 0), *td = D(t, 0);
      pair p;
      pair_init(&p);
      int rc = lt_cross_entropy_forward(p.c[0], p.c[1], x, t, -100);
      int rd = lt_cross_entropy_forward(p.d[0], p.d[1], xd, td, -100);
      if (!rc || !rd) emu_fails++, printf("FAIL cross_entropy bad target: cpu rc %d device rc %d\n", rc, rd);
      else emu_passes++;
      pair_free(&p), lt_release(xd), lt_release(td), lt_release(t);
    }
    lt_release(x), lt_release(dl);
  }
}
void emu_suite_loss(void) {
  int64_t quick[][2] = {{3, 7}, {2, 300}}, full[][2] = {{1, 1}, {5, 7}, {3, 300}, {4, 1030}, {2, 5001}, {9, 33}};
  int n = emu_quick ? 2 : 6;
  for (int i = 0; i < n; i++) loss_cases(emu_quick ? quick[i][0] : full[i][0], emu_quick ? quick[i][1] : full[i][1]);
  for (int i = 0; i < (emu_quick ? 0 : 3); i++) loss_cases(emu_irand(1, 6), emu_irand(1, 20000)); /* random */
  if (!emu_quick) loss_cases(300, 3);
}

static void embedding_cases(int64_t V, int64_t C, int64_t n) {
  int64_t wsh[2] = {V, C}, ish[2] = {2, n};
  char name[96];
  for (int k = 0; k < 4; k++) {
    int dt = fdts[k];
    double tol = emu_tol(dt, 1e-6, 1e-14, 1.0 / 128, 1.0 / 1024);
    lt_tensor *w = emu_rnd(2, wsh, dt, -1, 1, 0);
    for (int idt = LT_I32; idt <= LT_I64; idt++) {
      lt_tensor *ids = emu_rnd(2, ish, idt, 0, (double)(V > 3 ? V / 2 : V), 1); /* repeats */
      int64_t osh[3] = {2, n, C};
      lt_tensor *g = emu_rnd(3, osh, dt, -1, 1, 0);
      for (int mode = 0; mode < 3; mode++) {
        if (emu_quick && mode == 2) continue;
        lt_tensor *wd = D(w, mode), *idsd = D(ids, mode % 2), *gd = D(g, mode);
        pair p;
        pair_init(&p);
        static const char *wn[] = {"out", "dweight"};
        snprintf(name, sizeof name, "embedding %s%s", lt_dtype_name(idt), emu_mode_name[mode]);
        int rc = lt_embedding_forward(p.c[0], w, ids), rd = lt_embedding_forward(p.d[0], wd, idsd);
        pair_check(name, dt, &p, rc, rd, 1, (double[]){0}, wn);
        /* dweight: defined (V, C) with garbage in it; on the device strided in every other run */
        lt_release(p.c[1]), lt_release(p.d[1]);
        p.c[1] = emu_rnd(2, wsh, dt, 5, 6, 0), p.d[1] = D(p.c[1], mode % 2);
        snprintf(name, sizeof name, "embedding_backward %s%s", lt_dtype_name(idt), emu_mode_name[mode]);
        rc = lt_embedding_backward(p.c[1], g, ids), rd = lt_embedding_backward(p.d[1], gd, idsd);
        pair_check(name, dt, &p, rc, rd, 2, (double[]){-1, tol}, wn);
        pair_free(&p);
        lt_release(wd), lt_release(idsd), lt_release(gd);
      }
      lt_release(ids), lt_release(g);
    }
    lt_release(w);
  }
}
void emu_suite_embedding(void) {
  embedding_cases(7, 5, 9);
  embedding_cases(3, 40, 1);
  if (emu_quick) return;
  embedding_cases(50, 300, 37);
  embedding_cases(1000, 33, 300);
}

static void rope_cases(int64_t B, int64_t T, int64_t H, int64_t Dm) {
  int64_t sh[4] = {B, T, H, Dm}, psh[2] = {B, T};
  char name[96];
  for (int k = 0; k < 4; k++) {
    int dt = fdts[k];
    double tol = emu_tol(dt, 1.0 / (1 << 21), 1e-14, 1.0 / 64, 1.0 / 512);
    lt_tensor *x = emu_rnd(4, sh, dt, -2, 2, 0);
    lt_tensor *pos[3] = {NULL, emu_rnd(1, &T, LT_I32, 0, 1000, 1), emu_rnd(2, psh, LT_I64, 0, 5000, 1)};
    for (int mode = 0; mode < 3; mode++) {
      if (emu_quick && mode == 2) continue;
      lt_tensor *xd = D(x, mode);
      for (int pk = 0; pk < 3; pk++)
        for (int inv = 0; inv < 2; inv++) {
          lt_tensor *pd = pos[pk] ? D(pos[pk], 0) : NULL;
          pair p;
          pair_init(&p);
          static const char *wn[] = {"out"};
          snprintf(name, sizeof name, "rope pos%d inv%d%s", pk, inv, emu_mode_name[mode]);
          lt_tensor *od = emu_out(x, mode % 2);
          int rc = lt_rope(p.c[0], x, pos[pk], 10000, inv), rd = lt_rope(od, xd, pd, 10000, inv);
          lt_release(p.d[0]), p.d[0] = od;
          pair_check(name, dt, &p, rc, rd, 1, (double[]){tol}, wn);
          pair_free(&p);
          lt_tensor *want = lt_tensor_new(), *ip = emu_dev(x, mode); /* in place */
          snprintf(name, sizeof name, "rope in place pos%d inv%d%s", pk, inv, emu_mode_name[mode]);
          if (lt_rope(want, x, pos[pk], 10000, inv) == 0) {
            if (lt_rope(ip, ip, pd, 10000, inv)) emu_fails++, printf("FAIL %s: %s\n", name, lt_last_error());
            else emu_check(name, dt, ip, want, tol);
          }
          lt_release(want), lt_release(ip);
          emu_free(pd);
        }
      lt_release(xd);
    }
    lt_release(x), emu_free(pos[1]), emu_free(pos[2]);
  }
}
/* lt_rope_freq: the caller's frequencies (a CPU f64 table, for a device x too) and a scale */
static void rope_freq_cases(int64_t B, int64_t T, int64_t H, int64_t Dm) {
  int64_t sh[4] = {B, T, H, Dm}, psh[2] = {B, T}, half = Dm / 2;
  char name[96];
  lt_tensor *inv = lt_tensor_new();
  lt_empty(inv, 1, &half, LT_F64, -1);
  for (int64_t i = 0; i < half; i++)
    ((double *)lt_data_ptr(inv))[i] = pow(50000.0, -2.0 * (double)i / (double)Dm) / 3;
  for (int k = 0; k < 4; k++) {
    int dt = fdts[k];
    double tol = emu_tol(dt, 1.0 / (1 << 21), 1e-14, 1.0 / 64, 1.0 / 512);
    lt_tensor *x = emu_rnd(4, sh, dt, -2, 2, 0), *pos = emu_rnd(2, psh, LT_I64, 0, 5000, 1);
    for (int mode = 0; mode < 2; mode++) {
      lt_tensor *xd = D(x, mode), *pd = D(pos, 0);
      for (int inv_dir = 0; inv_dir < 2; inv_dir++) {
        pair p;
        pair_init(&p);
        static const char *wn[] = {"out"};
        snprintf(name, sizeof name, "rope_freq scale 1.3 inv%d%s", inv_dir, emu_mode_name[mode]);
        lt_tensor *od = emu_out(x, mode % 2);
        int rc = lt_rope_freq(p.c[0], x, pos, inv, 1.3, inv_dir), rd = lt_rope_freq(od, xd, pd, inv, 1.3, inv_dir);
        lt_release(p.d[0]), p.d[0] = od;
        pair_check(name, dt, &p, rc, rd, 1, (double[]){tol}, wn);
        pair_free(&p);
      }
      lt_release(xd), emu_free(pd);
    }
    lt_release(x), emu_free(pos);
  }
  lt_release(inv);
}
void emu_suite_rope(void) {
  rope_cases(2, 3, 2, 8);
  rope_freq_cases(2, 3, 2, 8);
  if (emu_quick) return;
  rope_freq_cases(3, 17, 3, 64);
  rope_cases(1, 1, 1, 2);
  rope_cases(3, 17, 3, 64);
  rope_cases(2, 5, 4, 130);
}

void emu_suite_rng(void) {
  static const int dts[] = {LT_F32, LT_F64, LT_BF16, LT_F16, LT_I32, LT_I64, LT_U8, LT_BOOL};
  int64_t shapes[][4] = {{1, 1}, {1, 7}, {2, 5, 9}, {3, 4, 3, 37}, {1, 5000}};
  int ns = emu_quick ? 3 : 5;
  char name[96];
  for (int s = 0; s < ns; s++)
    for (int k = 0; k < 8; k++)
      for (int kind = 0; kind < 4; kind++)
        for (int mode = 0; mode < 2; mode++) {
          int dt = dts[k], nd = (int)shapes[s][0];
          lt_tensor *want = lt_tensor_new();
          lt_empty(want, nd, shapes[s] + 1, dt, -1);
          lt_tensor *got = emu_dev(want, mode);
          uint64_t seed = 0x123456789abcdefULL + (uint64_t)s, off = (uint64_t)k * 1000 + 3;
          int rc, rd;
          switch (kind) {
          case 0: rc = lt_rand_uniform(want, seed, off, -2, 3), rd = lt_rand_uniform(got, seed, off, -2, 3); break;
          case 1: rc = lt_rand_normal(want, seed, off, 0.5, 2), rd = lt_rand_normal(got, seed, off, 0.5, 2); break;
          case 2: rc = lt_rand_int(want, seed, off, -7, 100), rd = lt_rand_int(got, seed, off, -7, 100); break;
          default: rc = lt_rand_bernoulli(want, seed, off, 0.3), rd = lt_rand_bernoulli(got, seed, off, 0.3);
          }
          snprintf(name, sizeof name, "rand kind %d%s", kind, emu_mode_name[mode]);
          if (rc || rd) {
            if ((rc != 0) != (rd != 0)) emu_fails++, printf("FAIL %s %s: cpu rc %d device rc %d: %s\n", name,
                                                            lt_dtype_name(dt), rc, rd, lt_last_error());
          } else {
            emu_check(name, dt, got, want, 0);
          }
          lt_release(want), lt_release(got);
        }
}
