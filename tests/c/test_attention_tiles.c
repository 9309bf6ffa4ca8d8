/* test_attention_tiles.c — a CPU emulation of the CUDA attention kernels (kernels/attention_forward.cu,
 * kernels/attention_backward.cu), checked against lt_attention_forward / lt_attention_backward on the CPU.
 *
 * There is no GPU here, so the kernels' algorithm is run on the CPU instead: the same tile sizes,
 * loop orders, skip rules and online-softmax update (the functions of kernels/attention_tile.h, which
 * the kernels include), in f32 arithmetic for f32/bf16/f16 (every operation rounded to float) and
 * in f64 for f64, with P (and dS) rounded to the 16-bit dtype before the products of the tensor-core
 * forward and backward. Random shapes: causal with S < T (rows that see no key), S > T, segments (sorted and not), GQA,
 * sliding windows, T and S not multiples of the tiles, head dims that make the CUDA-core tiles small (D = 200, 256 in
 * f64). Also: every skipped tile (keys past att_key_end or before att_key_begin, queries before att_query_begin or
 * from att_query_end) is checked to be fully masked, and the bounds are checked to be tight.
 */
#include "check.h"
#include "kernels/attention_tile.h"
#include <stdlib.h>

typedef struct emu {
  int64_t B, T, S, H, Hkv, D, group, off, window;
  int causal, dtype;
  bool f64;
  double scale;
  const int64_t *seg;             /* (B, T) or NULL */
  const double *q, *k, *v, *dout; /* values as the kernels load them, contiguous */
} emu;

static const double *row_q(const emu *e, const double *x, int64_t b, int64_t t, int64_t h) {
  return x + ((b * e->T + t) * e->H + h) * e->D;
}
static const double *row_k(const emu *e, const double *x, int64_t b, int64_t s, int64_t g) {
  return x + ((b * e->S + s) * e->Hkv + g) * e->D;
}

/* One operation's result in the kernel's compute type. */
static double rnd(const emu *e, double x) { return e->f64 ? x : (double)(float)x; }
/* x rounded to dtype (the kernels' final stores, and P before the tensor-core P V). */
static double round_to(int dtype, double x) {
  char buf[8];
  lt_store_f64(buf, dtype, 0, x);
  return lt_load_f64(buf, dtype, 0);
}
static double prob(const emu *e, double x2, double m) {
  return e->f64 ? att_prob_f64(x2, m) : att_prob_f32((float)x2, (float)m);
}
static double rescale(const emu *e, double m_old, double m_new) {
  return e->f64 ? att_rescale_f64(m_old, m_new) : att_rescale_f32((float)m_old, (float)m_new);
}
static double dscore(const emu *e, double p, double dp, double delta) {
  return e->f64 ? att_dscore_f64(p, dp, delta) : att_dscore_f32((float)p, (float)dp, (float)delta);
}
static double dot(const emu *e, const double *x, const double *y) {
  double s = 0;
  for (int64_t d = 0; d < e->D; d++) s = rnd(e, s + rnd(e, x[d] * y[d]));
  return s;
}
static bool visible(const emu *e, int64_t b, int64_t t, int64_t s) {
  return att_visible(t, e->T, s, e->S, e->off, e->causal, e->window) &&
         (!e->seg || e->seg[b * e->T + t] == e->seg[b * e->T + s]);
}
/* A score in log2 units, -inf when masked. */
static double score2(const emu *e, int64_t b, int64_t t, int64_t h, int64_t s) {
  if (!visible(e, b, t, s)) return -INFINITY;
  return rnd(e, dot(e, row_q(e, e->q, b, t, h), row_k(e, e->k, b, s, h / e->group)) * rnd(e, e->scale * ATT_LOG2E));
}

/* The tensor-core kernels skip a (query rows [r0, r1), keys [k0, k1)) tile when the spans of
 * their segment ids do not meet (att_ranges_meet); a skipped tile must be fully masked, which
 * *violations counts. */
static int64_t seg_skipped; /* tiles skipped that way, over the whole test */
static bool seg_skip(const emu *e, int64_t b, int64_t r0, int64_t r1, int64_t k0, int64_t k1, int64_t *violations) {
  if (!e->seg) return false;
  if (r1 > e->T) r1 = e->T;
  if (k1 > e->S) k1 = e->S;
  int64_t qmin = INT64_MAX, qmax = INT64_MIN, kmin = INT64_MAX, kmax = INT64_MIN;
  for (int64_t t = r0; t < r1; t++) qmin = fmin(qmin, e->seg[b * e->T + t]), qmax = fmax(qmax, e->seg[b * e->T + t]);
  for (int64_t s = k0; s < k1; s++) kmin = fmin(kmin, e->seg[b * e->T + s]), kmax = fmax(kmax, e->seg[b * e->T + s]);
  if (att_ranges_meet(qmin, qmax, kmin, kmax)) return false;
  seg_skipped++;
  for (int64_t t = r0; t < r1; t++)
    for (int64_t s = k0; s < k1; s++) *violations += visible(e, b, t, s);
  return true;
}

/* Rows [t0, t_last] of a block see no key outside [kbegin, kend): *violations counts those they do. */
static void skipped_keys(const emu *e, int64_t b, int64_t t0, int64_t t_last, int64_t kbegin, int64_t kend,
                         int64_t *violations) {
  for (int64_t t = t0; t <= t_last; t++)
    for (int64_t s = 0; s < e->S; s++)
      if (s < kbegin || s >= kend) *violations += visible(e, b, t, s);
}

/* ---- forward: att_fwd_mma (mma) or att_fwd_gen ------------------------------------------------- */

static void emu_forward(const emu *e, bool mma, double *out, float *lse, int64_t *violations) {
  int64_t BR = mma ? ATT_MMA_BR : ATT_GEN_BR, BC = mma ? ATT_MMA_BC : att_gen_bc(e->D, e->f64 ? 8 : 4, 1);
  int64_t nblk = (e->T + BR - 1) / BR, D = e->D;
  double *o = calloc((size_t)D + 1, sizeof(double)), *x = malloc((size_t)BC * sizeof(double));
  for (int64_t b = 0; b < e->B; b++)
    for (int64_t h = 0; h < e->H; h++)
      for (int64_t task = 0; task < nblk; task++) {
        int64_t t0 = att_query_block(task, nblk) * BR, t_last = (t0 + BR < e->T ? t0 + BR : e->T) - 1;
        int64_t kend = att_key_end(t_last, e->S, e->off, e->causal), g = h / e->group;
        int64_t kbegin = att_key_begin(t0, e->off, e->window, BC);
        skipped_keys(e, b, t0, t_last, kbegin, kend, violations);
        for (int64_t t = t0; t <= t_last; t++) {
          double m = -INFINITY, l = 0;
          for (int64_t d = 0; d < D; d++) o[d] = 0;
          for (int64_t kv0 = kbegin; kv0 < kend; kv0 += BC) {
            if (mma && seg_skip(e, b, t0, t_last + 1, kv0, kv0 + BC, violations)) continue;
            double mx = -INFINITY;
            for (int64_t j = 0; j < BC; j++) {
              x[j] = score2(e, b, t, h, kv0 + j);
              mx = x[j] > mx ? x[j] : mx;
            }
            double m_new = m > mx ? m : mx, alpha = rescale(e, m, m_new);
            m = m_new;
            l = rnd(e, l * alpha);
            for (int64_t d = 0; d < D; d++) o[d] = rnd(e, o[d] * alpha);
            for (int64_t j = 0; j < BC && kv0 + j < e->S; j++) {
              double p = prob(e, x[j], m), pv = mma ? round_to(e->dtype, p) : p;
              l = rnd(e, l + p);
              const double *vj = row_k(e, e->v, b, kv0 + j, g);
              for (int64_t d = 0; d < D; d++) o[d] = rnd(e, o[d] + rnd(e, pv * vj[d]));
            }
          }
          double inv = l > 0 ? rnd(e, 1 / l) : 0;
          double *orow = out + ((b * e->T + t) * e->H + h) * D;
          for (int64_t d = 0; d < D; d++) orow[d] = round_to(e->dtype, rnd(e, o[d] * inv));
          lse[(b * e->H + h) * e->T + t] = e->f64 ? (float)att_lse_f64(m, l) : att_lse_f32((float)m, (float)l);
        }
      }
  free(o);
  free(x);
}

/* ---- backward: att_delta, att_dq, att_dkv ----------------------------------------------------------- */

/* out: the forward output (B, T, H, D) as the backward reads it; lse (B, H, T) the saved f32 lse. */
/* mma: the tensor-core passes (tiles of 64 x 32; P and dS rounded to the 16-bit dtype before the
 * products), else the CUDA-core ones. */
static void emu_backward(const emu *e, bool mma, const double *out, const float *lse, double *dq, double *dk,
                         double *dv, int64_t *violations) {
  int64_t B = e->B, T = e->T, H = e->H, D = e->D, es = e->f64 ? 8 : 4;
  double *delta = malloc((size_t)(B * H * T + 1) * sizeof(double)),
         *lse2 = malloc((size_t)(B * H * T + 1) * sizeof(double));
  double *acc = calloc((size_t)(2 * D + 2), sizeof(double));
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < H; h++)
      for (int64_t t = 0; t < T; t++) {
        const double *x = row_q(e, e->dout, b, t, h), *y = row_q(e, out, b, t, h);
        double s = 0;
        for (int64_t d = 0; d < D; d++) s = rnd(e, s + rnd(e, x[d] * y[d]));
        delta[(b * H + h) * T + t] = s;
      }
  /* dQ: blocks of ATT_GEN_BR rows, key tiles of bc */
  int64_t BR = mma ? ATT_BWD_MMA_BR : ATT_GEN_BR, bc = mma ? ATT_BWD_MMA_BC : att_gen_bc(D, (int)es, 2);
  int64_t nblk = (T + BR - 1) / BR;
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < H; h++)
      for (int64_t task = 0; task < nblk; task++) {
        int64_t t0 = att_query_block(task, nblk) * BR, t_last = (t0 + BR < T ? t0 + BR : T) - 1;
        int64_t kend = att_key_end(t_last, e->S, e->off, e->causal), g = h / e->group;
        int64_t kbegin = att_key_begin(t0, e->off, e->window, bc);
        skipped_keys(e, b, t0, t_last, kbegin, kend, violations);
        for (int64_t t = t0; t <= t_last; t++) {
          int64_t row = (b * H + h) * T + t;
          if (e->f64) { /* the row's lse again, by the online softmax over the same tiles */
            double m = -INFINITY, l = 0;
            for (int64_t kv0 = kbegin; kv0 < kend; kv0 += bc) {
              double mx = -INFINITY;
              for (int64_t j = 0; j < bc; j++) {
                double x = score2(e, b, t, h, kv0 + j);
                mx = x > mx ? x : mx;
              }
              double m_new = m > mx ? m : mx, sum = 0;
              for (int64_t j = 0; j < bc; j++) sum += prob(e, score2(e, b, t, h, kv0 + j), m_new);
              l = l * rescale(e, m, m_new) + sum;
              m = m_new;
            }
            lse2[row] = l > 0 ? m + log2(l) : -INFINITY;
          } else {
            lse2[row] = rnd(e, (double)lse[row] * (double)(float)ATT_LOG2E);
          }
          double *dqa = acc;
          for (int64_t d = 0; d < D; d++) dqa[d] = 0;
          for (int64_t kv0 = kbegin; kv0 < kend; kv0 += bc) {
            if (mma && seg_skip(e, b, t0, t_last + 1, kv0, kv0 + bc, violations)) continue;
            for (int64_t j = 0; j < bc && kv0 + j < e->S; j++) {
              int64_t s = kv0 + j;
              double ds = 0;
              if (visible(e, b, t, s)) {
                double p = prob(e, score2(e, b, t, h, s), lse2[row]);
                ds = dscore(e, p, dot(e, row_q(e, e->dout, b, t, h), row_k(e, e->v, b, s, g)), delta[row]);
                if (mma) ds = round_to(e->dtype, ds);
              }
              const double *ks = row_k(e, e->k, b, s, g);
              for (int64_t d = 0; d < D; d++) dqa[d] = rnd(e, dqa[d] + rnd(e, ds * ks[d]));
            }
          }
          double *o = dq + ((b * T + t) * H + h) * D;
          for (int64_t d = 0; d < D; d++) o[d] = round_to(e->dtype, rnd(e, e->scale * dqa[d]));
        }
      }
  /* dK, dV: tiles of 8 * kpw keys, the group's heads in order, query tiles of bq from att_query_begin
   * up to att_query_end */
  int kpw, bq;
  att_dkv_tiles(D, (int)es, &kpw, &bq);
  int64_t bkv = (int64_t)ATT_GEN_WARPS * kpw;
  if (mma) bkv = ATT_BWD_MMA_BKV, bq = ATT_BWD_MMA_BQ;
  for (int64_t b = 0; b < B; b++)
    for (int64_t g = 0; g < e->Hkv; g++)
      for (int64_t s0 = 0; s0 < e->S; s0 += bkv) {
        int64_t qbegin = att_query_begin(s0, e->off, e->causal);
        int64_t qend = att_query_end((s0 + bkv < e->S ? s0 + bkv : e->S) - 1, T, e->off, e->window);
        for (int64_t t = 0; t < T; t++)
          if (t < qbegin || t >= qend)
            for (int64_t s = s0; s < s0 + bkv && s < e->S; s++) *violations += visible(e, b, t, s);
        for (int64_t s = s0; s < s0 + bkv && s < e->S; s++) {
          double *dka = acc, *dva = acc + D;
          for (int64_t d = 0; d < 2 * D; d++) acc[d] = 0;
          for (int64_t h = g * e->group; h < (g + 1) * e->group; h++)
            for (int64_t tq = qbegin; tq < qend; tq += bq) {
              if (mma && seg_skip(e, b, tq, tq + bq, s0, s0 + bkv, violations)) continue;
              for (int64_t t = tq; t < tq + bq && t < T; t++) {
                int64_t row = (b * H + h) * T + t;
                double p = 0, ds = 0;
                if (visible(e, b, t, s)) {
                  p = prob(e, score2(e, b, t, h, s), lse2[row]);
                  ds = dscore(e, p, dot(e, row_q(e, e->dout, b, t, h), row_k(e, e->v, b, s, g)), delta[row]);
                  if (mma) p = round_to(e->dtype, p), ds = round_to(e->dtype, ds);
                }
                const double *qt = row_q(e, e->q, b, t, h), *gt = row_q(e, e->dout, b, t, h);
                for (int64_t d = 0; d < D; d++) {
                  dva[d] = rnd(e, dva[d] + rnd(e, p * gt[d]));
                  dka[d] = rnd(e, dka[d] + rnd(e, ds * qt[d]));
                }
              }
            }
          double *ko = dk + ((b * e->S + s) * e->Hkv + g) * D, *vo = dv + ((b * e->S + s) * e->Hkv + g) * D;
          for (int64_t d = 0; d < D; d++) {
            ko[d] = round_to(e->dtype, rnd(e, e->scale * dka[d]));
            vo[d] = round_to(e->dtype, dva[d]);
          }
        }
      }
  free(delta);
  free(lse2);
  free(acc);
}

/* ---- comparison with the CPU op ---------------------------------------------------------------------- */

static double *values_of(const lt_tensor *t) {
  int64_t n = lt_numel(t);
  double *x = malloc((size_t)(n + 1) * sizeof(double));
  for (int64_t i = 0; i < n; i++) x[i] = check_at(t, i);
  return x;
}

/* max |got - want| <= tol * max(1, max |want|); infinities must match exactly. */
static bool close_to(const char *what, const double *got, const lt_tensor *want, double tol, const char *desc) {
  int64_t n = lt_numel(want), worst = -1;
  double scale = 1, err = 0;
  for (int64_t i = 0; i < n; i++) scale = fmax(scale, isfinite(check_at(want, i)) ? fabs(check_at(want, i)) : 0);
  for (int64_t i = 0; i < n; i++) {
    double w = check_at(want, i), g = got[i];
    double d = (isinf(w) || isinf(g)) ? (w == g ? 0 : INFINITY) : fabs(g - w);
    if (d != d) d = INFINITY;
    if (d > err) err = d, worst = i;
  }
  bool ok = err <= tol * scale;
  if (!ok)
    fprintf(stderr, "%s %s: max error %g at %lld (got %g, want %g), tol %g\n", desc, what, err, (long long)worst,
            got[worst], check_at(want, worst), tol * scale);
  return ok;
}

static double lse_values(const lt_tensor *lse, float *dst) {
  for (int64_t i = 0, n = lt_numel(lse); i < n; i++) dst[i] = (float)check_at(lse, i);
  return 0;
}

/* Tolerances: the emulation and the CPU op compute the same sums in another order (f32: a few
 * ulps of the largest terms), and 16-bit results are rounded on both sides (one ulp apart at most
 * when the f32 values straddle a rounding boundary); the tensor-core forward also rounds P to 16 bits. */
static double tolerance(int dtype) {
  switch (dtype) {
  case LT_F64: return 1e-11;
  case LT_F32: return 2e-5;
  case LT_BF16: return 1.6e-2;
  default: return 2e-3;
  }
}

static void run_case(int dtype, int64_t B, int64_t T, int64_t S, int64_t H, int64_t Hkv, int64_t D, int causal,
                     int seg_kind, int64_t window) {
  char desc[200];
  snprintf(desc, sizeof desc, "%s B=%lld T=%lld S=%lld H=%lld Hkv=%lld D=%lld causal=%d seg=%d window=%lld",
           lt_dtype_name(dtype), (long long)B, (long long)T, (long long)S, (long long)H, (long long)Hkv, (long long)D,
           causal, seg_kind, (long long)window);
  int64_t qs[4] = {B, T, H, D}, ks[4] = {B, S, Hkv, D}, ss[2] = {B, T};
  lt_tensor *q = check_random(4, qs, dtype, -1, 1), *k = check_random(4, ks, dtype, -1, 1),
            *v = check_random(4, ks, dtype, -1, 1), *dout = check_random(4, qs, dtype, -1, 1), *seg = NULL;
  int64_t *segv = NULL;
  if (seg_kind) { /* 1: sorted runs (packed documents), 2: unsorted ids */
    seg = lt_tensor_new();
    CHECK_OK(lt_empty(seg, 2, ss, LT_I64, LT_DEVICE_CPU));
    segv = lt_data_ptr(seg);
    for (int64_t b = 0; b < B; b++) {
      int64_t id = 0;
      for (int64_t t = 0; t < T; t++) {
        if (seg_kind == 1 && check_uniform() < 0.08) id++;
        segv[b * T + t] = seg_kind == 1 ? id : check_randint(0, 3);
      }
    }
  }
  double scale = (0.5 + 3 * check_uniform()) / sqrt((double)D);
  lt_tensor *out = lt_tensor_new(), *lse = lt_tensor_new(), *dq = lt_tensor_new(), *dk = lt_tensor_new(),
            *dv = lt_tensor_new();
  CHECK_OK(lt_attention_forward(out, lse, q, k, v, seg, scale, causal, window));
  CHECK_OK(lt_attention_backward(dq, dk, dv, dout, q, k, v, out, lse, seg, scale, causal, window));

  double *qv = values_of(q), *kv = values_of(k), *vv = values_of(v), *gv = values_of(dout), *ov = values_of(out);
  emu e = {.B = B,
           .T = T,
           .S = S,
           .H = H,
           .Hkv = Hkv,
           .D = D,
           .group = H / Hkv,
           .off = S - T,
           .window = window,
           .causal = causal,
           .dtype = dtype,
           .f64 = dtype == LT_F64,
           .scale = scale,
           .seg = segv,
           .q = qv,
           .k = kv,
           .v = vv,
           .dout = gv};
  int64_t nq = B * T * H * D, nk = B * S * Hkv * D, nl = B * H * T, violations = 0;
  double *eo = calloc((size_t)nq + 1, sizeof(double)), *el = calloc((size_t)nl + 1, sizeof(double));
  float *elf = calloc((size_t)nl + 1, sizeof(float)), *cpu_lse = calloc((size_t)nl + 1, sizeof(float));
  double tol = tolerance(dtype);
  bool paths[2] = {false, (dtype == LT_BF16 || dtype == LT_F16) && (D == 64 || D == 128)};
  for (int pi = 0; pi < 2; pi++) {
    if (pi == 1 && !paths[1]) continue;
    emu_forward(&e, paths[pi], eo, elf, &violations);
    for (int64_t i = 0; i < nl; i++) el[i] = elf[i];
    CHECK(close_to(paths[pi] ? "mma out" : "gen out", eo, out, tol, desc), "%s", desc);
    /* lse is f32 on both sides; the f32 sums differ in order */
    CHECK(close_to(paths[pi] ? "mma lse" : "gen lse", el, lse, dtype == LT_F64 ? 1e-6 : 1e-5, desc), "%s", desc);
  }
  double *edq = calloc((size_t)nq + 1, sizeof(double)), *edk = calloc((size_t)nk + 1, sizeof(double)),
         *edv = calloc((size_t)nk + 1, sizeof(double));
  lse_values(lse, cpu_lse);
  /* gradients sum more terms (and dS = P (dP - delta) cancels): a looser bound in f32 */
  double gtol = dtype == LT_F32 ? 1e-4 : dtype == LT_F64 ? 1e-10 : tol;
  for (int pi = 0; pi < 2; pi++) {
    if (pi == 1 && !paths[1]) continue;
    emu_backward(&e, paths[pi], ov, cpu_lse, edq, edk, edv, &violations);
    CHECK(close_to(paths[pi] ? "mma dq" : "gen dq", edq, dq, gtol, desc), "%s", desc);
    CHECK(close_to(paths[pi] ? "mma dk" : "gen dk", edk, dk, gtol, desc), "%s", desc);
    CHECK(close_to(paths[pi] ? "mma dv" : "gen dv", edv, dv, gtol, desc), "%s", desc);
  }
  CHECK(violations == 0, "%s: %lld visible (query, key) pairs in skipped tiles", desc, (long long)violations);

  free(qv), free(kv), free(vv), free(gv), free(ov), free(eo), free(el), free(elf), free(cpu_lse);
  free(edq), free(edk), free(edv);
  lt_tensor *ts[10] = {q, k, v, dout, seg, out, lse, dq, dk, dv};
  for (int i = 0; i < 10; i++) lt_release(ts[i]);
}

/* The skip bounds are tight: the last row of a block sees key att_key_end - 1, and query
 * att_query_begin sees key s0, whenever those exist. */
static void check_bounds(void) {
  for (int trial = 0; trial < 2000; trial++) {
    int64_t T = check_randint(1, 200), S = check_randint(1, 200), off = S - T, t_last = check_randint(0, T);
    int64_t kend = att_key_end(t_last, S, off, 1);
    CHECK(kend >= 0 && kend <= S, "kend %lld", (long long)kend);
    if (kend > 0)
      CHECK(att_visible(t_last, T, kend - 1, S, off, 1, 0), "T %lld S %lld t %lld", (long long)T, (long long)S,
            (long long)t_last);
    if (kend < S)
      CHECK(!att_visible(t_last, T, kend, S, off, 1, 0), "T %lld S %lld t %lld", (long long)T, (long long)S,
            (long long)t_last);
    int64_t s0 = check_randint(0, S), qb = att_query_begin(s0, off, 1);
    if (qb < T) CHECK(att_visible(qb, T, s0, S, off, 1, 0), "s0 %lld qb %lld", (long long)s0, (long long)qb);
    if (qb > 0) CHECK(!att_visible(qb - 1, T, s0 + 0, S, off, 1, 0), "s0 %lld qb %lld", (long long)s0, (long long)qb);
    CHECK(att_key_end(t_last, S, off, 0) == S && att_query_begin(s0, off, 0) == 0, "non-causal bounds");
    CHECK(att_key_begin(t_last, off, 0, 32) == 0 && att_query_end(s0, T, off, 0) == T, "no-window bounds");
    /* windows: the first row of a block sees no key before att_key_begin, and the tile it starts is
     * the one holding the first key that row sees; the last key of a tile is seen by no query from
     * att_query_end on, and by query att_query_end - 1 when it is causal-visible */
    int64_t W = check_randint(1, 40), tile = check_randint(1, 70), t0 = check_randint(0, T);
    int64_t kb = att_key_begin(t0, off, W, tile), first = t0 + off - W + 1;
    CHECK(kb % tile == 0 && kb >= 0 && (first <= 0 ? kb == 0 : kb <= first && first < kb + tile),
          "key begin %lld for first key %lld, tile %lld", (long long)kb, (long long)first, (long long)tile);
    for (int64_t s = 0; s < kb && s < S; s++)
      CHECK(!att_visible(t0, T, s, S, off, 1, W), "t0 %lld sees key %lld before %lld", (long long)t0, (long long)s,
            (long long)kb);
    int64_t qe = att_query_end(s0, T, off, W);
    CHECK(qe >= 0 && qe <= T, "query end %lld", (long long)qe);
    if (s0 < S) {
      for (int64_t t = qe; t < T; t++)
        CHECK(!att_visible(t, T, s0, S, off, 1, W), "query %lld from end %lld sees key %lld", (long long)t,
              (long long)qe, (long long)s0);
      if (qe > 0 && qe - 1 + off >= s0)
        CHECK(att_visible(qe - 1, T, s0, S, off, 1, W), "query end %lld not tight for key %lld", (long long)qe,
              (long long)s0);
    }
  }
  /* the CUDA-core kernels' tiles fit the shared memory they launch with (no opt-in above 48 KB) */
  for (int64_t D = 0; D <= ATT_GEN_MAX_D; D++)
    for (int es = 4; es <= 8; es += 4) {
      int bc1 = att_gen_bc(D, es, 1), bc2 = att_gen_bc(D, es, 2), kpw, bq;
      att_dkv_tiles(D, es, &kpw, &bq);
      CHECK(bc1 >= 1 && bc1 <= 32 && att_gen_smem(D, es, 1, bc1) <= ATT_SMEM_BUDGET, "D %lld fwd bc %d", (long long)D,
            bc1);
      CHECK(bc2 >= 1 && bc2 <= 32 && att_gen_smem(D, es, 2, bc2) <= ATT_SMEM_BUDGET, "D %lld dq bc %d", (long long)D,
            bc2);
      CHECK(kpw >= 1 && kpw <= ATT_DKV_MAX_KPW && bq >= 1 && bq <= 32 &&
                att_dkv_smem(D, es, kpw, bq) <= ATT_SMEM_BUDGET,
            "D %lld dkv kpw %d bq %d", (long long)D, kpw, bq);
    }
  /* the tensor-core dK/dV kernel's shared memory fits an A100's opt-in limit (163 KB) */
  CHECK(att_dkv_mma_smem(64) <= 48 * 1024 && att_dkv_mma_smem(128) <= 163 * 1024, "mma dkv smem %lld",
        (long long)att_dkv_mma_smem(128));
  /* the online softmax of a row in two tiles equals the one-pass softmax */
  float x[6] = {0.5f, -3.f, 2.f, -INFINITY, 7.f, 1.f}, m = -INFINITY, l = 0, ref_m = 7.f, ref_l = 0;
  for (int tile = 0; tile < 2; tile++) {
    float mx = -INFINITY;
    for (int j = 0; j < 3; j++) mx = fmaxf(mx, x[3 * tile + j]);
    float m_new = fmaxf(m, mx);
    l *= att_rescale_f32(m, m_new);
    for (int j = 0; j < 3; j++) l += att_prob_f32(x[3 * tile + j], m_new);
    m = m_new;
  }
  for (int j = 0; j < 6; j++) ref_l += exp2f(x[j] - ref_m);
  CHECK(fabsf(att_lse_f32(m, l) - (ref_m + log2f(ref_l)) * (float)ATT_LN2) < 1e-5f, "online lse %g", att_lse_f32(m, l));
  CHECK(att_lse_f32(-INFINITY, 0) == -INFINITY && att_prob_f32(-INFINITY, -INFINITY) == 0 &&
            att_rescale_f32(-INFINITY, -INFINITY) == 0,
        "empty rows");
}

int main(void) {
  check_bounds();
  const int dtypes[4] = {LT_F32, LT_BF16, LT_F16, LT_F64};
  /* fixed cases: the benchmark's shape in miniature, S < T and S > T under causal, segments, GQA */
  run_case(LT_BF16, 1, 130, 130, 4, 2, 64, 1, 0, 0);
  run_case(LT_F16, 2, 70, 70, 2, 1, 128, 1, 1, 0);
  run_case(LT_BF16, 1, 90, 40, 3, 3, 64, 1, 0, 0); /* S < T: the first 50 rows see no key */
  run_case(LT_F16, 1, 40, 150, 2, 2, 64, 1, 0, 0); /* S > T: a prefix every row sees */
  run_case(LT_F32, 2, 45, 45, 6, 2, 17, 1, 2, 0);  /* unsorted segments, GQA 3 */
  run_case(LT_F64, 1, 21, 33, 2, 1, 200, 1, 0, 0); /* small CUDA-core tiles (kpw 1) */
  run_case(LT_F64, 1, 19, 19, 1, 1, 256, 0, 1, 0);
  run_case(LT_BF16, 1, 300, 300, 2, 1, 64, 0, 1, 0); /* packed documents: tiles skipped by segment */
  run_case(LT_F32, 1, 0, 9, 2, 1, 8, 1, 0, 0);       /* T == 0: dk, dv zero */
  run_case(LT_F32, 1, 9, 0, 2, 1, 8, 0, 0, 0);       /* S == 0: out 0, lse -inf */
  /* sliding windows: within the tiles, across several, with segments, after a cache (S > T) */
  run_case(LT_BF16, 1, 200, 200, 2, 1, 64, 1, 0, 70);
  run_case(LT_F16, 1, 150, 150, 2, 2, 128, 1, 1, 40);
  run_case(LT_BF16, 1, 40, 190, 2, 1, 64, 1, 0, 100);
  run_case(LT_F32, 2, 45, 45, 4, 2, 17, 1, 2, 9);
  run_case(LT_F64, 1, 30, 70, 2, 1, 200, 1, 0, 25);
  run_case(LT_F32, 1, 60, 60, 2, 1, 8, 1, 0, 1);
  for (int trial = 0; trial < 14; trial++) {
    int dtype = dtypes[trial % 4];
    int64_t Ds[7] = {1, 3, 16, 33, 64, 128, 96};
    int64_t D = Ds[check_randint(0, 7)], Hkv = check_randint(1, 3), H = Hkv * check_randint(1, 4);
    int64_t T = check_randint(1, 100), S = check_uniform() < 0.5 ? T : check_randint(1, 100);
    int causal = check_uniform() < 0.7, seg_kind = S == T ? (int)check_randint(0, 3) : 0;
    int64_t window = causal && check_uniform() < 0.4 ? check_randint(1, 80) : 0;
    run_case(dtype, check_randint(1, 3), T, S, H, Hkv, D, causal, seg_kind, window);
  }
  CHECK(seg_skipped > 0, "no tile was skipped by its segment ids: the rule went untested");
  printf("%lld tiles skipped by segment ids\n", (long long)seg_skipped);
  return check_summary();
}
