/* test_attention.c — attention forward against a naive double softmax(QK^T scale + mask) V, lse
 * included; backward against a naive double backward and, in f64, central finite differences;
 * GQA/MQA, causal with T != S, segment ids, strided views, every float dtype, determinism across
 * thread counts, bad inputs. */
#include "check.h"

typedef struct shape {
  int64_t B, T, S, H, Hkv, D;
  int64_t W; /* sliding window (causal cases), 0: none */
} shape;

static int64_t at4(int64_t b, int64_t t, int64_t h, int64_t d, int64_t T, int64_t H, int64_t D) {
  return ((b * T + t) * H + h) * D + d;
}

/* Query t sits at absolute position t + S - T (after S - T cached keys); with a window W it sees
 * the W positions ending at its own (transformers: kv_idx > q_idx - sliding_window). */
static bool visible(const lt_tensor *seg, int64_t b, int64_t t, int64_t s, int64_t T, int64_t S, int causal,
                    int64_t W) {
  int64_t pos = t + (S - T);
  if (causal && s > pos) return false;
  if (W > 0 && !(s > pos - W)) return false;
  if (seg && check_at(seg, b * T + t) != check_at(seg, b * T + s)) return false;
  return true;
}

/* Naive forward (and backward when dout given) in double. out, lse, dq, dk, dv are row-major
 * arrays; lse is (B, H, T) with -inf for rows that see no key. */
static void reference(shape z, const lt_tensor *q, const lt_tensor *k, const lt_tensor *v, const lt_tensor *seg,
                      double scale, int causal, double *out, double *lse, const lt_tensor *dout, double *dq, double *dk,
                      double *dv) {
  int64_t B = z.B, T = z.T, S = z.S, H = z.H, Hkv = z.Hkv, D = z.D, grp = H / Hkv;
  double *p = malloc((size_t)(S + 1) * sizeof(double)), *dp = malloc((size_t)(S + 1) * sizeof(double));
  if (dq) {
    memset(dq, 0, (size_t)(B * T * H * D) * sizeof(double));
    memset(dk, 0, (size_t)(B * S * Hkv * D) * sizeof(double));
    memset(dv, 0, (size_t)(B * S * Hkv * D) * sizeof(double));
  }
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < H; h++)
      for (int64_t t = 0; t < T; t++) {
        int64_t g = h / grp;
        double m = -INFINITY, sum = 0;
        for (int64_t s = 0; s < S; s++) {
          p[s] = -INFINITY;
          if (!visible(seg, b, t, s, T, S, causal, z.W)) continue;
          double dot = 0;
          for (int64_t d = 0; d < D; d++)
            dot += check_at(q, at4(b, t, h, d, T, H, D)) * check_at(k, at4(b, s, g, d, S, Hkv, D));
          p[s] = dot * scale;
          m = fmax(m, p[s]);
        }
        for (int64_t s = 0; s < S; s++) sum += p[s] == -INFINITY ? 0 : exp(p[s] - m);
        for (int64_t s = 0; s < S; s++) p[s] = p[s] == -INFINITY ? 0 : exp(p[s] - m) / sum;
        if (lse) lse[(b * H + h) * T + t] = sum > 0 ? m + log(sum) : -INFINITY;
        for (int64_t d = 0; d < D; d++) {
          double o = 0;
          for (int64_t s = 0; s < S; s++) o += p[s] * check_at(v, at4(b, s, g, d, S, Hkv, D));
          if (out) out[at4(b, t, h, d, T, H, D)] = o;
        }
        if (!dq) continue;
        /* dS = P * (dP - sum_s P dP): derived directly, without the delta = dout . out shortcut */
        double pdp = 0;
        for (int64_t s = 0; s < S; s++) {
          dp[s] = 0;
          for (int64_t d = 0; d < D; d++)
            dp[s] += check_at(dout, at4(b, t, h, d, T, H, D)) * check_at(v, at4(b, s, g, d, S, Hkv, D));
          pdp += p[s] * dp[s];
        }
        for (int64_t s = 0; s < S; s++) {
          double ds = p[s] * (dp[s] - pdp) * scale;
          for (int64_t d = 0; d < D; d++) {
            dq[at4(b, t, h, d, T, H, D)] += ds * check_at(k, at4(b, s, g, d, S, Hkv, D));
            dk[at4(b, s, g, d, S, Hkv, D)] += ds * check_at(q, at4(b, t, h, d, T, H, D));
            dv[at4(b, s, g, d, S, Hkv, D)] += p[s] * check_at(dout, at4(b, t, h, d, T, H, D));
          }
        }
      }
  free(p);
  free(dp);
}

static int count_bad(const char *what, const lt_tensor *got, const double *want, double rtol, double atol) {
  int bad = 0;
  for (int64_t i = 0, n = lt_numel(got); i < n; i++) {
    double g = check_at(got, i);
    if (!check_close(g, want[i], rtol, atol) || isnan(g)) {
      if (bad++ < 3) fprintf(stderr, "  %s[%lld]: got %.10g want %.10g\n", what, (long long)i, g, want[i]);
    }
  }
  return bad;
}

static double tol_of(int dtype) {
  switch (dtype) {
  case LT_F64: return 1e-10;
  case LT_F32: return 3e-5;
  case LT_F16: return 4e-3;
  default: return 2e-2;
  }
}

static lt_tensor *seg_ids(int64_t B, int64_t T, bool sorted) {
  int64_t shape[2] = {B, T};
  lt_tensor *s = lt_tensor_new();
  lt_empty(s, 2, shape, sorted ? LT_I32 : LT_I64, LT_DEVICE_CPU);
  for (int64_t b = 0; b < B; b++) {
    int64_t id = 0;
    for (int64_t t = 0; t < T; t++) {
      if (sorted && t > 0 && check_uniform() < 0.15) id++;
      int64_t idx[2] = {b, t};
      lt_set_at(s, idx, sorted ? (double)id : (double)check_randint(0, 3));
    }
  }
  return s;
}

/* One forward (and backward) case against the reference. seg_kind: 0 none, 1 sorted, 2 unsorted.
 * layout: 0 contiguous, 1 q/k/v views of a fused projection (needs T == S), 2 D not innermost. */
static void run_case(shape z, int dtype, int causal, int seg_kind, int layout, bool backward) {
  int64_t qs[4] = {z.B, z.T, z.H, z.D}, ks[4] = {z.B, z.S, z.Hkv, z.D}, ls[3] = {z.B, z.H, z.T};
  lt_tensor *q, *k, *v, *fused = NULL;
  if (layout == 1) {
    int64_t fs[4] = {z.B, z.T, z.H + 2 * z.Hkv, z.D};
    fused = check_random(4, fs, dtype, -1.5, 1.5);
    q = lt_tensor_new(), k = lt_tensor_new(), v = lt_tensor_new();
    lt_narrow(q, fused, 2, 0, z.H);
    lt_narrow(k, fused, 2, z.H, z.Hkv);
    lt_narrow(v, fused, 2, z.H + z.Hkv, z.Hkv);
  } else {
    q = check_random(4, qs, dtype, -1.5, 1.5);
    k = check_random(4, ks, dtype, -1.5, 1.5);
    v = check_random(4, ks, dtype, -1.5, 1.5);
    if (layout == 2) {
      lt_tensor *a = check_noncontig(q), *b = check_noncontig(k), *c = check_noncontig(v);
      lt_release(q), lt_release(k), lt_release(v);
      q = a, k = b, v = c;
    }
  }
  lt_tensor *seg = seg_kind ? seg_ids(z.B, z.T, seg_kind == 1) : NULL;
  double scale = 1 / sqrt((double)z.D) * (1 + check_uniform());
  int64_t nq = z.B * z.T * z.H * z.D, nk = z.B * z.S * z.Hkv * z.D;
  double *want = malloc((size_t)nq * 8), *want_lse = malloc((size_t)(z.B * z.H * z.T + 1) * 8);
  double *wdq = malloc((size_t)nq * 8), *wdk = malloc((size_t)nk * 8), *wdv = malloc((size_t)nk * 8);
  lt_tensor *dout = backward ? check_random(4, qs, dtype, -1, 1) : NULL;
  reference(z, q, k, v, seg, scale, causal, want, want_lse, dout, backward ? wdq : NULL, wdk, wdv);

  lt_tensor *out = lt_tensor_new(), *lse = lt_tensor_new();
  if (layout == 2) { /* strided outputs too */
    lt_tensor *o = lt_tensor_new(), *l = lt_tensor_new();
    lt_empty(o, 4, qs, dtype, LT_DEVICE_CPU);
    lt_empty(l, 3, ls, LT_F32, LT_DEVICE_CPU);
    lt_release(out), lt_release(lse);
    out = check_noncontig(o), lse = check_noncontig(l);
    lt_release(o), lt_release(l);
  }
  char what[160];
  snprintf(what, sizeof what, "%s B%lld T%lld S%lld H%lld Hkv%lld D%lld W%lld causal %d seg %d layout %d",
           lt_dtype_name(dtype), (long long)z.B, (long long)z.T, (long long)z.S, (long long)z.H, (long long)z.Hkv,
           (long long)z.D, (long long)z.W, causal, seg_kind, layout);
  CHECK_OK(lt_attention_forward(out, lse, q, k, v, seg, scale, causal, z.W));
  double tol = tol_of(dtype);
  CHECK(count_bad("out", out, want, tol, tol) == 0, "forward out: %s", what);
  int bad_lse = 0;
  for (int64_t i = 0; i < z.B * z.H * z.T; i++) {
    double g = check_at(lse, i);
    bool ok = want_lse[i] == -INFINITY ? g == -INFINITY : check_close(g, want_lse[i], 2e-6, 2e-6 + tol / 4);
    if (!ok && bad_lse++ < 3) fprintf(stderr, "  lse[%lld]: got %.9g want %.9g\n", (long long)i, g, want_lse[i]);
  }
  CHECK(bad_lse == 0, "forward lse: %s", what);

  if (backward) {
    lt_tensor *dq = lt_tensor_new(), *dk = lt_tensor_new(), *dv = lt_tensor_new(), *dfused = NULL;
    if (layout == 1) { /* gradients written into views of one fused (B, T, H + 2 Hkv, D) buffer */
      int64_t fs[4] = {z.B, z.T, z.H + 2 * z.Hkv, z.D};
      dfused = check_random(4, fs, dtype, -1, 1);
      lt_narrow(dq, dfused, 2, 0, z.H);
      lt_narrow(dk, dfused, 2, z.H, z.Hkv);
      lt_narrow(dv, dfused, 2, z.H + z.Hkv, z.Hkv);
    }
    CHECK_OK(lt_attention_backward(dq, dk, dv, dout, q, k, v, out, lse, seg, scale, causal, z.W));
    /* bf16/f16 gradients sum many rounded terms: compare against the largest magnitude */
    double gtol = dtype == LT_F32 ? 1e-4 : dtype == LT_F64 ? 1e-9 : tol * 4, scale_q = 0, scale_k = 0;
    for (int64_t i = 0; i < nq; i++) scale_q = fmax(scale_q, fabs(wdq[i]));
    for (int64_t i = 0; i < nk; i++) scale_k = fmax(scale_k, fabs(wdk[i]) + fabs(wdv[i]));
    CHECK(count_bad("dq", dq, wdq, gtol, gtol * fmax(1, scale_q)) == 0, "backward dq: %s", what);
    CHECK(count_bad("dk", dk, wdk, gtol, gtol * fmax(1, scale_k)) == 0, "backward dk: %s", what);
    CHECK(count_bad("dv", dv, wdv, gtol, gtol * fmax(1, scale_k)) == 0, "backward dv: %s", what);
    lt_release(dq), lt_release(dk), lt_release(dv), lt_release(dfused);
  }
  free(want), free(want_lse), free(wdq), free(wdk), free(wdv);
  lt_release(q), lt_release(k), lt_release(v), lt_release(fused), lt_release(seg), lt_release(out);
  lt_release(lse), lt_release(dout);
}

static bool bitwise_equal(const lt_tensor *a, const lt_tensor *b);

static void test_forward_backward_cases(void) {
  /* B, T, S, H, Hkv, D */
  shape gqa = {2, 37, 37, 4, 2, 16, 0}, mqa = {1, 45, 45, 4, 1, 8, 0}, mha = {2, 9, 9, 2, 2, 64, 0};
  shape longer_kv = {2, 7, 75, 4, 2, 16, 0}, shorter_kv = {2, 13, 6, 2, 1, 8, 0}, odd = {3, 1, 1, 2, 2, 8, 0};
  shape big = {1, 70, 70, 2, 1, 64, 0};
  for (int causal = 0; causal < 2; causal++) {
    run_case(gqa, LT_F32, causal, 0, 0, true);
    run_case(mqa, LT_F32, causal, 0, 0, true);
    run_case(mha, LT_F64, causal, 0, 0, true);
    run_case(longer_kv, LT_F32, causal, 0, 0, true);
    run_case(shorter_kv, LT_F32, causal, 0, 0, true);
    run_case(odd, LT_F64, causal, 0, 0, true);
    run_case(big, LT_F32, causal, 0, 1, true);
    for (int seg_kind = 1; seg_kind <= 2; seg_kind++) {
      run_case(gqa, LT_F32, causal, seg_kind, 0, true);
      run_case(mqa, LT_F64, causal, seg_kind, 1, true);
    }
    run_case(gqa, LT_F32, causal, 0, 1, true);
    run_case(gqa, LT_F32, causal, 1, 2, true);
    run_case(longer_kv, LT_F64, causal, 0, 2, true);
    run_case(gqa, LT_BF16, causal, 0, 0, true);
    run_case(mqa, LT_F16, causal, 1, 0, true);
    run_case(mha, LT_BF16, causal, 0, 2, false);
  }
}

/* Sliding windows (causal): inside one row, with segments (sorted and not), with queries after a
 * cache (S > T: the window counts absolute positions), T > S, window 1 (a token sees itself),
 * windows wider than the row, across the block sizes of the CPU work split. */
static void test_window_cases(void) {
  /* B, T, S, H, Hkv, D, W */
  shape w5 = {2, 37, 37, 4, 2, 16, 5}, w1 = {1, 9, 9, 2, 1, 8, 1}, w33 = {1, 70, 70, 2, 1, 64, 33};
  shape decode = {2, 7, 75, 4, 2, 16, 10}, decode1 = {1, 1, 40, 2, 2, 8, 6}, wide = {1, 12, 12, 2, 2, 8, 50};
  shape shorter = {2, 13, 6, 2, 1, 8, 3}, long_rows = {1, 150, 150, 2, 1, 16, 70};
  run_case(w5, LT_F32, 1, 0, 0, true);
  run_case(w5, LT_F64, 1, 0, 0, true);
  run_case(w1, LT_F64, 1, 0, 0, true);
  run_case(w33, LT_F32, 1, 0, 1, true);
  run_case(decode, LT_F32, 1, 0, 0, true);
  run_case(decode, LT_F64, 1, 0, 2, true);
  run_case(decode1, LT_F64, 1, 0, 0, true);
  run_case(wide, LT_F32, 1, 0, 0, true);
  run_case(shorter, LT_F32, 1, 0, 0, true);
  run_case(long_rows, LT_F32, 1, 0, 0, true);
  for (int seg_kind = 1; seg_kind <= 2; seg_kind++) {
    run_case(w5, LT_F32, 1, seg_kind, 0, true);
    run_case(w5, LT_F64, 1, seg_kind, 1, true);
    run_case(long_rows, LT_F32, 1, seg_kind, 2, true);
  }
  run_case(w5, LT_BF16, 1, 0, 0, true);
  run_case(w33, LT_F16, 1, 1, 0, true);
  run_case(decode, LT_BF16, 1, 0, 2, false);
}

/* A window at least as wide as the last query's position + 1 hides nothing: bitwise the same as
 * no window, forward and backward. */
static void test_wide_window_is_none(void) {
  int64_t qs[4] = {2, 40, 4, 16}, ks[4] = {2, 52, 2, 16};
  lt_tensor *q = check_random(4, qs, LT_F32, -1, 1), *k = check_random(4, ks, LT_F32, -1, 1);
  lt_tensor *v = check_random(4, ks, LT_F32, -1, 1), *dout = check_random(4, qs, LT_F32, -1, 1);
  lt_tensor *r[2][5];
  int64_t windows[2] = {0, 52};
  for (int run = 0; run < 2; run++) {
    for (int i = 0; i < 5; i++) r[run][i] = lt_tensor_new();
    CHECK_OK(lt_attention_forward(r[run][0], r[run][1], q, k, v, NULL, 0.25, 1, windows[run]));
    CHECK_OK(lt_attention_backward(r[run][2], r[run][3], r[run][4], dout, q, k, v, r[run][0], r[run][1], NULL, 0.25, 1,
                                   windows[run]));
  }
  const char *names[5] = {"out", "lse", "dq", "dk", "dv"};
  for (int i = 0; i < 5; i++) CHECK(bitwise_equal(r[0][i], r[1][i]), "%s: window 52 differs from none", names[i]);
  for (int run = 0; run < 2; run++)
    for (int i = 0; i < 5; i++) lt_release(r[run][i]);
  lt_release(q), lt_release(k), lt_release(v), lt_release(dout);
}

/* Central differences in f64 of L = sum(out * G) against the backward. */
static void test_finite_differences(shape z, int causal, bool with_seg) {
  int64_t qs[4] = {z.B, z.T, z.H, z.D}, ks[4] = {z.B, z.S, z.Hkv, z.D};
  lt_tensor *q = check_random(4, qs, LT_F64, -1, 1), *k = check_random(4, ks, LT_F64, -1, 1);
  lt_tensor *v = check_random(4, ks, LT_F64, -1, 1), *G = check_random(4, qs, LT_F64, -1, 1);
  lt_tensor *seg = with_seg ? seg_ids(z.B, z.T, false) : NULL;
  lt_tensor *out = lt_tensor_new(), *lse = lt_tensor_new(), *dq = lt_tensor_new(), *dk = lt_tensor_new(),
            *dv = lt_tensor_new();
  double scale = 0.7;
  CHECK_OK(lt_attention_forward(out, lse, q, k, v, seg, scale, causal, z.W));
  CHECK_OK(lt_attention_backward(dq, dk, dv, G, q, k, v, out, lse, seg, scale, causal, z.W));
  lt_tensor *inputs[3] = {q, k, v}, *grads[3] = {dq, dk, dv};
  const char *names[3] = {"dq", "dk", "dv"};
  double eps = 1e-5;
  for (int w = 0; w < 3; w++) {
    double *x = lt_data_ptr(inputs[w]);
    int bad = 0;
    for (int64_t i = 0, n = lt_numel(inputs[w]); i < n; i++) {
      double saved = x[i], loss[2];
      for (int sgn = 0; sgn < 2; sgn++) {
        x[i] = saved + (sgn ? -eps : eps);
        lt_tensor *o = lt_tensor_new();
        lt_attention_forward(o, NULL, q, k, v, seg, scale, causal, z.W);
        loss[sgn] = 0;
        for (int64_t j = 0; j < lt_numel(o); j++)
          loss[sgn] += ((double *)lt_data_ptr(o))[j] * ((double *)lt_data_ptr(G))[j];
        lt_release(o);
      }
      x[i] = saved;
      double num = (loss[0] - loss[1]) / (2 * eps), got = ((double *)lt_data_ptr(grads[w]))[i];
      if (!check_close(got, num, 1e-8, 1e-9) && bad++ < 3)
        fprintf(stderr, "  %s[%lld]: backward %.10g, finite difference %.10g\n", names[w], (long long)i, got, num);
    }
    CHECK(bad == 0, "finite differences %s: causal %d seg %d T %lld S %lld W %lld", names[w], causal, with_seg,
          (long long)z.T, (long long)z.S, (long long)z.W);
  }
  lt_release(q), lt_release(k), lt_release(v), lt_release(G), lt_release(seg), lt_release(out), lt_release(lse);
  lt_release(dq), lt_release(dk), lt_release(dv);
}

/* Rows that see no key: out 0 (not NaN), lse -inf, and zero gradients through them. */
static void test_empty_rows(void) {
  int64_t qs[4] = {1, 6, 2, 8}, ks[4] = {1, 3, 1, 8};
  lt_tensor *q = check_random(4, qs, LT_F32, -1, 1), *k = check_random(4, ks, LT_F32, -1, 1);
  lt_tensor *v = check_random(4, ks, LT_F32, -1, 1), *out = lt_tensor_new(), *lse = lt_tensor_new();
  CHECK_OK(lt_attention_forward(out, lse, q, k, v, NULL, 0.3, 1, 0)); /* S - T = -3: rows 0..2 see nothing */
  int nonzero = 0, finite = 0;
  for (int64_t i = 0; i < 3 * 2 * 8; i++) nonzero += check_at(out, i) != 0;
  for (int64_t i = 3 * 2 * 8; i < 6 * 2 * 8; i++) finite += isfinite(check_at(out, i));
  CHECK(nonzero == 0 && finite == 3 * 2 * 8, "empty rows give 0, others finite (%d nonzero, %d finite)", nonzero,
        finite);
  int64_t idx[3] = {0, 1, 2}, idx3[3] = {0, 1, 3};
  double l, l3;
  lt_get_at(lse, idx, &l);
  lt_get_at(lse, idx3, &l3);
  CHECK(l == -INFINITY && isfinite(l3), "lse of an empty row is -inf: %g, %g", l, l3);
  lt_tensor *dout = check_random(4, qs, LT_F32, -1, 1), *dq = lt_tensor_new(), *dk = lt_tensor_new(),
            *dv = lt_tensor_new();
  CHECK_OK(lt_attention_backward(dq, dk, dv, dout, q, k, v, out, lse, NULL, 0.3, 1, 0));
  int bad = 0;
  for (int64_t i = 0; i < 6 * 2 * 8; i++) bad += !isfinite(check_at(dq, i)) || (i < 48 && check_at(dq, i) != 0);
  for (int64_t i = 0; i < 3 * 8; i++) bad += !isfinite(check_at(dk, i)) || !isfinite(check_at(dv, i));
  CHECK(bad == 0, "gradients through empty rows are 0 and finite (%d bad)", bad);
  /* S == 0: every row empty */
  int64_t ks0[4] = {1, 0, 1, 8};
  lt_tensor *k0 = lt_tensor_new(), *v0 = lt_tensor_new(), *o0 = lt_tensor_new();
  lt_empty(k0, 4, ks0, LT_F32, LT_DEVICE_CPU);
  lt_empty(v0, 4, ks0, LT_F32, LT_DEVICE_CPU);
  CHECK_OK(lt_attention_forward(o0, NULL, q, k0, v0, NULL, 0.3, 0, 0));
  nonzero = 0;
  for (int64_t i = 0; i < lt_numel(o0); i++) nonzero += check_at(o0, i) != 0;
  CHECK(nonzero == 0, "no keys at all: out is 0");
  lt_release(q), lt_release(k), lt_release(v), lt_release(out), lt_release(lse), lt_release(dout), lt_release(dq);
  lt_release(dk), lt_release(dv), lt_release(k0), lt_release(v0), lt_release(o0);
}

static bool bitwise_equal(const lt_tensor *a, const lt_tensor *b) {
  return lt_numel(a) == lt_numel(b) &&
         memcmp(lt_data_ptr(a), lt_data_ptr(b), (size_t)(lt_numel(a) * lt_dtype_size(a->dtype))) == 0;
}

/* Large enough to run in parallel: 1 and 3 threads give bitwise equal results. */
static void test_determinism(void) {
  int64_t qs[4] = {2, 96, 4, 32}, ks[4] = {2, 96, 2, 32};
  lt_tensor *q = check_random(4, qs, LT_F32, -1, 1), *k = check_random(4, ks, LT_F32, -1, 1);
  lt_tensor *v = check_random(4, ks, LT_F32, -1, 1), *dout = check_random(4, qs, LT_F32, -1, 1);
  lt_tensor *r[2][5];
  int threads = lt_get_num_threads(), counts[2] = {1, 3};
  for (int run = 0; run < 2; run++) {
    for (int i = 0; i < 5; i++) r[run][i] = lt_tensor_new();
    lt_set_num_threads(counts[run]);
    CHECK_OK(lt_attention_forward(r[run][0], r[run][1], q, k, v, NULL, 0.2, 1, 0));
    CHECK_OK(
        lt_attention_backward(r[run][2], r[run][3], r[run][4], dout, q, k, v, r[run][0], r[run][1], NULL, 0.2, 1, 0));
  }
  lt_set_num_threads(threads);
  const char *names[5] = {"out", "lse", "dq", "dk", "dv"};
  for (int i = 0; i < 5; i++) CHECK(bitwise_equal(r[0][i], r[1][i]), "%s: 1 and 3 threads differ", names[i]);
  for (int run = 0; run < 2; run++)
    for (int i = 0; i < 5; i++) lt_release(r[run][i]);
  lt_release(q), lt_release(k), lt_release(v), lt_release(dout);
}

static void test_bad_inputs(void) {
  int64_t qs[4] = {2, 5, 4, 8}, ks[4] = {2, 5, 2, 8}, k3s[4] = {2, 5, 3, 8}, kds[4] = {2, 5, 2, 4}, ls[3] = {2, 4, 5};
  int64_t segs[2] = {2, 5}, ks7[4] = {2, 7, 2, 8}, segs_bad[2] = {2, 4}, ls_bad[3] = {2, 5, 4};
  lt_tensor *q = check_random(4, qs, LT_F32, -1, 1), *k = check_random(4, ks, LT_F32, -1, 1);
  lt_tensor *v = check_random(4, ks, LT_F32, -1, 1), *k3 = check_random(4, k3s, LT_F32, -1, 1);
  lt_tensor *kd = check_random(4, kds, LT_F32, -1, 1), *k64 = check_random(4, ks, LT_F64, -1, 1);
  lt_tensor *seg = check_random(2, segs, LT_I32, 0, 2), *segf = check_random(2, segs, LT_F32, 0, 2);
  lt_tensor *seg_bad = check_random(2, segs_bad, LT_I32, 0, 2), *k7 = check_random(4, ks7, LT_F32, -1, 1);
  lt_tensor *out = lt_tensor_new(), *lse = lt_tensor_new(), *undef = lt_tensor_new(),
            *q3 = check_random(3, qs, LT_F32, 0, 1);
  lt_tensor *qi = check_random(4, qs, LT_I32, -1, 1), *lse_bad = check_random(3, ls_bad, LT_F32, 0, 1);
  const char *fw = "attention_forward";
  (void)fw;
  CHECK_ERR(lt_attention_forward(out, lse, q, k3, k3, NULL, 0.3, 1, 0), "H % Hkv == 0");
  CHECK_ERR(lt_attention_forward(out, lse, q, kd, kd, NULL, 0.3, 1, 0), "H % Hkv == 0");
  CHECK_ERR(lt_attention_forward(out, lse, q, k, k3, NULL, 0.3, 1, 0), "k = v");
  CHECK_ERR(lt_attention_forward(out, lse, q, k64, k64, NULL, 0.3, 1, 0), "one floating dtype");
  CHECK_ERR(lt_attention_forward(out, lse, qi, qi, qi, NULL, 0.3, 1, 0), "one floating dtype");
  CHECK_ERR(lt_attention_forward(out, lse, q3, k, v, NULL, 0.3, 1, 0), "4-d");
  CHECK_ERR(lt_attention_forward(out, lse, q, k, v, segf, 0.3, 1, 0), "i32 or i64");
  CHECK_ERR(lt_attention_forward(out, lse, q, k, v, seg_bad, 0.3, 1, 0), "(B, T) with T == S");
  CHECK_ERR(lt_attention_forward(out, lse, q, k7, k7, seg, 0.3, 1, 0), "T == S");
  CHECK_ERR(lt_attention_forward(out, lse, q, k, v, NULL, NAN, 1, 0), "scale must be finite");
  CHECK_ERR(lt_attention_forward(out, lse, q, k, v, NULL, 0.3, 1, -1), "window must be >= 0 (0: none), got -1");
  CHECK_ERR(lt_attention_forward(out, lse, q, k, v, NULL, 0.3, 0, 4), "sliding window (window 4) needs causal");
  CHECK_ERR(lt_attention_forward(out, lse, undef, k, v, NULL, 0.3, 1, 0), "q is undefined");
  CHECK_ERR(lt_attention_forward(out, lse, q, NULL, v, NULL, 0.3, 1, 0), "k is NULL");
  CHECK_ERR(lt_attention_forward(out, lse, q, k, v, undef, 0.3, 1, 0), "segment_ids is undefined");
  CHECK_ERR(lt_attention_forward(k, lse, q, k, v, NULL, 0.3, 1, 0), "out is");
  lt_tensor *qq = lt_tensor_new();
  lt_set(qq, q);
  CHECK_ERR(lt_attention_forward(qq, lse, q, k, v, NULL, 0.3, 1, 0), "shares storage");
  CHECK_OK(lt_attention_forward(out, lse, q, k, v, seg, 0.3, 1, 0));
  CHECK(lse->ndim == 3 && lse->shape[0] == 2 && lse->shape[1] == 4 && lse->shape[2] == 5 && lse->dtype == LT_F32,
        "lse is allocated (B, H, T) f32");
  lt_tensor *dq = lt_tensor_new(), *dk = lt_tensor_new(), *dv = lt_tensor_new();
  const char *bw = "attention_backward";
  (void)bw;
  CHECK_ERR(lt_attention_backward(dq, dk, dv, k, q, k, v, out, lse, seg, 0.3, 1, 0), "dout is");
  CHECK_ERR(lt_attention_backward(dq, dk, dv, q, q, k, v, undef, lse, seg, 0.3, 1, 0), "out is undefined");
  CHECK_ERR(lt_attention_backward(dq, dk, dv, q, q, k, v, out, lse_bad, seg, 0.3, 1, 0), "(B, H, T)");
  CHECK_ERR(lt_attention_backward(dq, dk, dv, q, q, k, v, out, NULL, seg, 0.3, 1, 0), "lse is NULL");
  CHECK_ERR(lt_attention_backward(dq, dq, dv, q, q, k, v, out, lse, seg, 0.3, 1, 0), "attention_backward dk: out is");
  CHECK_ERR(lt_attention_backward(qq, dk, dv, q, q, k, v, out, lse, seg, 0.3, 1, 0), "shares storage");
  CHECK_ERR(lt_attention_backward(dq, dk, dv, q, q, k, v, out, lse, seg, 0.3, 1, -3), "window must be >= 0");
  CHECK_ERR(lt_attention_backward(dq, dk, dv, q, q, k, v, out, lse, seg, 0.3, 0, 2), "needs causal");
  CHECK_OK(lt_attention_backward(dq, dk, dv, q, q, k, v, out, lse, seg, 0.3, 1, 0));
  (void)ls;
  lt_release(q), lt_release(k), lt_release(v), lt_release(k3), lt_release(kd), lt_release(k64), lt_release(seg);
  lt_release(segf), lt_release(seg_bad), lt_release(k7), lt_release(out), lt_release(lse), lt_release(undef);
  lt_release(q3), lt_release(qi), lt_release(lse_bad), lt_release(qq), lt_release(dq), lt_release(dk), lt_release(dv);
}

int main(void) {
  /* the naive reference itself against central differences first */
  test_finite_differences((shape){2, 5, 5, 4, 2, 8, 0}, 1, false);
  test_finite_differences((shape){1, 4, 7, 2, 1, 8, 0}, 1, false);
  test_finite_differences((shape){1, 6, 3, 2, 2, 4, 0}, 1, false);
  test_finite_differences((shape){2, 6, 6, 2, 1, 8, 0}, 0, true);
  test_finite_differences((shape){1, 7, 7, 3, 1, 16, 0}, 1, true);
  test_finite_differences((shape){2, 9, 9, 2, 1, 8, 3}, 1, false);
  test_finite_differences((shape){1, 8, 8, 3, 1, 8, 4}, 1, true);
  test_finite_differences((shape){1, 4, 11, 2, 2, 8, 5}, 1, false); /* queries after 7 cached keys */
  test_forward_backward_cases();
  test_window_cases();
  test_wide_window_is_none();
  test_empty_rows();
  test_determinism();
  test_bad_inputs();
  return check_summary();
}
