/* emu_attention.c — kernels/attention_forward.cu, kernels/attention_backward.cu and kernels/attention_backward_mma.cu
 * under the emulator against the CPU op (suite "attention"): f32/f64/bf16/f16, causal or not, GQA (Hkv < H), S != T,
 * packed segments, sliding windows (with segments, after a cache), q/k/v contiguous or permuted ((B, H, T, D) storage),
 * forward (out, lse) and backward (dq, dk, dv from the CPU's out and lse). bf16/f16 with D 64
 * or 128 take the tensor-core (mma.sync) kernels, as on a GPU; the suite counts the cases that
 * ran mma.sync forward and backward (emu_mma_count). Tolerances: lua/lutra/selftest/attention.lua. */
#include "emu_check.h"
long emu_mma_count(void);
static const int fdts[] = {LT_F32, LT_F64, LT_BF16, LT_F16};
enum { ALL = 15, BF16 = 4, HALF = 12 }; /* dtypes a case runs: bits of fdts */
static int n_cases, n_mma_fwd, n_mma_bwd;
/* x (B, T, H, D) on the device, in (B, H, T, D) storage when perm */
static lt_tensor *dev_perm(const lt_tensor *x, int perm) {
  if (!perm) return emu_dev(x, 0);
  lt_tensor *t = lt_tensor_new(), *c = lt_tensor_new(), *v = lt_tensor_new();
  lt_transpose(t, x, 1, 2);
  lt_contiguous(c, t); /* (B, H, T, D) values, contiguous */
  lt_tensor *cd = emu_dev(c, 0);
  lt_transpose(v, cd, 1, 2);
  lt_release(t), lt_release(c), lt_release(cd);
  return v;
}
static void att_case_w(int64_t B, int64_t T, int64_t S, int64_t H, int64_t Hkv, int64_t Dm, int causal, int seg,
                       int perm, int dts, int64_t window) {
  int64_t qs[4] = {B, T, H, Dm}, ks[4] = {B, S, Hkv, Dm}, ss[2] = {B, T};
  char name[128];
  for (int k = 0; k < 4; k++) {
    if (!(dts >> k & 1)) continue;
    int dt = fdts[k];
    double tol = emu_tol(dt, 2e-5, 1e-10, 1.6e-2, 2e-3), gtol = emu_tol(dt, 1e-4, 1e-10, 1.6e-2, 2e-3);
    double ltol = dt == LT_F64 ? 1e-6 : 1e-5;
    lt_tensor *q = emu_rnd(4, qs, dt, -1, 1, 0), *kk = emu_rnd(4, ks, dt, -1, 1, 0), *v = emu_rnd(4, ks, dt, -1, 1, 0);
    lt_tensor *dout = emu_rnd(4, qs, dt, -1, 1, 0), *sid = NULL, *sidd = NULL;
    if (seg) { /* sorted segment ids 0, 0, 1, 1, 1, 2 ... */
      sid = lt_tensor_new();
      lt_empty(sid, 2, ss, LT_I32, -1);
      for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0, s = 0; t < T; t++) {
          if (t > 0 && emu_uni() < 0.3) s++;
          lt_set_at(sid, (int64_t[]){b, t}, (double)s);
        }
      sidd = emu_dev(sid, 0);
    }
    lt_tensor *qd = dev_perm(q, perm), *kd = dev_perm(kk, perm), *vd = dev_perm(v, 0), *doutd = dev_perm(dout, perm);
    double scale = 1 / sqrt((double)Dm);
    snprintf(name, sizeof name, "attention %s B%lld T%lld S%lld H%lld/%lld D%lld W%lld%s%s%s", lt_dtype_name(dt),
             (long long)B, (long long)T, (long long)S, (long long)H, (long long)Hkv, (long long)Dm, (long long)window,
             causal ? " causal" : "", seg ? " segments" : "", perm ? " permuted" : "");
    lt_tensor *out = lt_tensor_new(), *lse = lt_tensor_new(), *outd = lt_tensor_new(), *lsed = lt_tensor_new();
    int rc = lt_attention_forward(out, lse, q, kk, v, sid, scale, causal, window);
    long m0 = emu_mma_count();
    int rd = lt_attention_forward(outd, lsed, qd, kd, vd, sidd, scale, causal, window);
    n_cases++, n_mma_fwd += emu_mma_count() > m0;
    if (rc || rd) {
      if ((rc != 0) != (rd != 0))
        emu_fails++, printf("FAIL %s: cpu rc %d device rc %d: %s\n", name, rc, rd, lt_last_error());
      else if (getenv("EMU_VERBOSE"))
        printf("refused by both sides (as expected) %s: %s\n", name, lt_last_error());
    } else {
      char n2[160];
      snprintf(n2, sizeof n2, "%s out", name), emu_check(n2, dt, outd, out, tol);
      snprintf(n2, sizeof n2, "%s lse", name), emu_check(n2, dt, lsed, lse, ltol);
      lt_tensor *g[3], *gd[3];
      for (int i = 0; i < 3; i++) g[i] = lt_tensor_new(), gd[i] = lt_tensor_new();
      lt_tensor *od = emu_dev(out, 0), *ld = emu_dev(lse, 0);
      rc = lt_attention_backward(g[0], g[1], g[2], dout, q, kk, v, out, lse, sid, scale, causal, window);
      long m1 = emu_mma_count();
      rd = lt_attention_backward(gd[0], gd[1], gd[2], doutd, qd, kd, vd, od, ld, sidd, scale, causal, window);
      n_mma_bwd += emu_mma_count() > m1;
      if (rc || rd) {
        emu_fails++, printf("FAIL %s backward: cpu rc %d device rc %d: %s\n", name, rc, rd, lt_last_error());
      } else {
        static const char *gn[3] = {"dq", "dk", "dv"};
        for (int i = 0; i < 3; i++) snprintf(n2, sizeof n2, "%s %s", name, gn[i]), emu_check(n2, dt, gd[i], g[i], gtol);
      }
      for (int i = 0; i < 3; i++) lt_release(g[i]), lt_release(gd[i]);
      lt_release(od), lt_release(ld);
    }
    lt_release(out), lt_release(lse), lt_release(outd), lt_release(lsed);
    lt_release(q), lt_release(kk), lt_release(v), lt_release(dout), emu_free(sid), emu_free(sidd);
    lt_release(qd), lt_release(kd), lt_release(vd), lt_release(doutd);
  }
}
static void att_case(int64_t B, int64_t T, int64_t S, int64_t H, int64_t Hkv, int64_t Dm, int causal, int seg, int perm,
                     int dts) {
  att_case_w(B, T, S, H, Hkv, Dm, causal, seg, perm, dts, 0);
}
void emu_suite_attention(void) {
  n_cases = n_mma_fwd = n_mma_bwd = 0;
  /*        B  T  S  H  Hkv D  causal seg perm dtypes */
  att_case(1, 5, 5, 2, 1, 8, 1, 0, 0, ALL);
  att_case(2, 3, 7, 2, 2, 4, 0, 0, 1, ALL);
  att_case(1, 6, 6, 2, 2, 8, 1, 1, 0, ALL);
  /* the tensor-core kernels: several key tiles (64 keys forward, 32 in dQ, 64-key blocks in dK/dV) */
  att_case(1, 70, 70, 2, 1, 64, 1, 0, 0, HALF);
  att_case(1, 72, 72, 2, 2, 128, 0, 0, 1, BF16);
  att_case(1, 70, 70, 2, 1, 128, 1, 1, 0, BF16);
  /* sliding windows: key tiles before the window skipped (forward, dQ), query tiles past it (dK/dV) */
  /*          B  T   S    H  Hkv D   causal seg perm dtypes window */
  att_case_w(1, 11, 11, 2, 1, 8, 1, 0, 0, ALL, 3);
  att_case_w(1, 9, 20, 2, 2, 8, 1, 0, 1, ALL, 5); /* queries after 11 cached keys */
  att_case_w(1, 140, 140, 2, 1, 64, 1, 0, 0, HALF, 40);
  att_case_w(1, 100, 100, 2, 1, 128, 1, 1, 0, BF16, 70);
  if (!emu_quick) {
    att_case_w(2, 40, 40, 3, 1, 32, 1, 1, 1, ALL, 7);
    att_case_w(1, 1, 130, 2, 2, 64, 1, 0, 0, ALL, 33); /* one query decoding after 129 cached keys */
    att_case_w(1, 30, 170, 2, 1, 64, 1, 0, 0, HALF, 64);
    att_case_w(1, 200, 200, 2, 2, 64, 1, 1, 1, HALF, 1);
    att_case(1, 7, 4, 4, 2, 16, 1, 0, 0, ALL); /* T > S, causal: early queries see nothing */
    att_case(2, 33, 33, 3, 1, 32, 1, 0, 1, ALL);
    att_case(1, 70, 70, 2, 1, 64, 1, 1, 0, ALL);
    att_case(1, 17, 40, 2, 2, 128, 0, 0, 0, ALL);
    att_case(1, 9, 9, 1, 1, 72, 0, 0, 1, ALL);
    att_case(1, 65, 130, 2, 2, 256, 1, 0, 0, ALL);
    att_case(2, 130, 130, 4, 2, 128, 1, 0, 1, HALF);
    att_case(1, 40, 100, 3, 1, 64, 1, 0, 0, HALF); /* S > T, causal: the diagonal offset */
    att_case(1, 100, 40, 2, 2, 64, 1, 1, 0, HALF); /* T > S with segments */
    att_case(1, 150, 150, 2, 1, 64, 0, 1, 1, HALF);
  }
  printf("attention: %d of %d cases ran the tensor-core (mma.sync) forward, %d the tensor-core backward\n", n_mma_fwd,
         n_cases, n_mma_bwd);
}
