/* attention_cpu.c — the CPU rows of attention: the block kernels, written once for float and
 * double (a generator, ops/dtype_generic.h), and the forward and backward passes that run them
 * as tasks. ops/attention.c has the math and the work split. */
#include "ops/attention_cpu.h"
#include "ops/dtype_generic.h"
#include "ops/vecmath.h"
#include <cblas.h>
#include <stdlib.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* Keys [lo, hi) that query t of batch b may see (with unsorted segments, a superset). */
static inline void row_keys(const att_ctx *c, int64_t b, int64_t t, int64_t *lo, int64_t *hi) {
  int64_t a = 0, e = c->S;
  if (c->causal && t + c->off + 1 < e) e = t + c->off + 1;
  if (c->window > 0 && t + c->off - c->window + 1 > a) a = t + c->off - c->window + 1;
  if (c->seg && c->sorted[b]) {
    int64_t i = b * c->T + t;
    if (c->run_start[i] > a) a = c->run_start[i];
    if (c->run_end[i] < e) e = c->run_end[i];
  }
  *lo = a;
  *hi = e > a ? e : a;
}

/* Per-row key ranges of rows [t0, t0 + nr) and their union [klo, khi); empty rows get lo = hi = klo. */
static void block_keys(const att_ctx *c, int64_t b, int64_t t0, int64_t nr, int64_t *lo, int64_t *hi, int64_t *klo,
                       int64_t *khi) {
  int64_t a = c->S, e = 0;
  for (int64_t i = 0; i < nr; i++) {
    row_keys(c, b, t0 + i, &lo[i], &hi[i]);
    if (hi[i] > lo[i]) {
      a = lo[i] < a ? lo[i] : a;
      e = hi[i] > e ? hi[i] : e;
    }
  }
  if (e <= a) a = e = 0;
  for (int64_t i = 0; i < nr; i++)
    if (hi[i] <= lo[i]) lo[i] = hi[i] = a;
  *klo = a;
  *khi = e;
}

/* Queries [qlo, qhi) of batch b whose key range meets keys [s0, s0 + nc). */
static void block_queries(const att_ctx *c, int64_t b, int64_t s0, int64_t nc, int64_t *qlo, int64_t *qhi) {
  int64_t a = c->T, e = 0, lo, hi;
  for (int64_t t = 0; t < c->T; t++) {
    row_keys(c, b, t, &lo, &hi);
    if (hi > lo && lo < s0 + nc && hi > s0) {
      a = t < a ? t : a;
      e = t + 1;
    }
  }
  *qlo = e > a ? a : 0;
  *qhi = e > a ? e : 0;
}

/* The block kernels of one compute type: `real` (float or double), the suffix SFX of their names,
 * GEMM (cblas_sgemm or cblas_dgemm), EXP and LOG. (T and S name the context's sizes here.) */
#define DEFINE_ATTENTION_ROWS(real, SFX, GEMM, EXP, LOG)                                                               \
  /* C (M, N) = alpha * op(A) @ op(B) + beta * C, row-major. op(A) is (M, K): A is (M, K) with lda,                    \
   * or (K, M) when trans_a. op(B) is (K, N): B is (K, N) with ldb, or (N, K) when trans_b. Split so                   \
   * that every BLAS call has M*N*K <= GEMM_BUDGET (see ops/attention.c); K chunks accumulate in order. */             \
  static void gemm##_##SFX(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, real alpha, const real *A,     \
                           int64_t lda, const real *B, int64_t ldb, real beta, real *C, int64_t ldc) {                 \
    if (M == 0 || N == 0) return;                                                                                      \
    if (K == 0) {                                                                                                      \
      for (int64_t i = 0; i < M; i++)                                                                                  \
        for (int64_t j = 0; j < N; j++) C[i * ldc + j] = beta == 0 ? 0 : beta * C[i * ldc + j];                        \
      return;                                                                                                          \
    }                                                                                                                  \
    int64_t mb = M, nb = N, kb = K;                                                                                    \
    while (mb * nb * kb > GEMM_BUDGET) {                                                                               \
      if (kb >= nb && kb >= mb && kb > 16)                                                                             \
        kb = (kb + 1) / 2;                                                                                             \
      else if (nb >= mb && nb > 16)                                                                                    \
        nb = (nb + 1) / 2;                                                                                             \
      else if (mb > 1)                                                                                                 \
        mb = (mb + 1) / 2;                                                                                             \
      else                                                                                                             \
        break;                                                                                                         \
    }                                                                                                                  \
    for (int64_t i0 = 0; i0 < M; i0 += mb)                                                                             \
      for (int64_t j0 = 0; j0 < N; j0 += nb)                                                                           \
        for (int64_t k0 = 0; k0 < K; k0 += kb) {                                                                       \
          int64_t m = M - i0 < mb ? M - i0 : mb, n = N - j0 < nb ? N - j0 : nb, k = K - k0 < kb ? K - k0 : kb;         \
          const real *a = trans_a ? A + k0 * lda + i0 : A + i0 * lda + k0;                                             \
          const real *b = trans_b ? B + j0 * ldb + k0 : B + k0 * ldb + j0;                                             \
          GEMM(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, (int)m,        \
               (int)n, (int)k, alpha, a, (int)lda, b, (int)ldb, k0 == 0 ? beta : (real)1, C + i0 * ldc + j0,           \
               (int)ldc);                                                                                              \
        }                                                                                                              \
  }                                                                                                                    \
                                                                                                                       \
  static inline real *row##_##SFX(const operand *o, int64_t b, int64_t t, int64_t h) {                                 \
    return (real *)o->base + b * o->sb + t * o->st + h * o->sh;                                                        \
  }                                                                                                                    \
                                                                                                                       \
  /* One row of scaled scores s[0, n): keeps [a, b) and, when segk is given, the keys whose segment                    \
   * is seg_t; overwrites s with exp(s - max), 0 where masked. Returns the sum (0: no key visible). */                 \
  static real softmax_row##_##SFX(real *s, int64_t n, int64_t a, int64_t b, const int64_t *segk, int64_t seg_t,        \
                                  real *max_out) {                                                                     \
    real m = -INFINITY, sum = 0;                                                                                       \
    if (segk) {                                                                                                        \
      for (int64_t j = a; j < b; j++)                                                                                  \
        if (segk[j] == seg_t && s[j] > m) m = s[j];                                                                    \
    } else {                                                                                                           \
      LT_SIMD(reduction(max : m))                                                                                      \
      for (int64_t j = a; j < b; j++) m = s[j] > m ? s[j] : m;                                                         \
    }                                                                                                                  \
    if (m == -INFINITY) a = b = 0;                                                                                     \
    for (int64_t j = 0; j < a; j++) s[j] = 0;                                                                          \
    for (int64_t j = b; j < n; j++) s[j] = 0;                                                                          \
    if (segk) {                                                                                                        \
      for (int64_t j = a; j < b; j++) {                                                                                \
        real p = segk[j] == seg_t ? EXP(s[j] - m) : 0;                                                                 \
        s[j] = p;                                                                                                      \
        sum += p;                                                                                                      \
      }                                                                                                                \
    } else {                                                                                                           \
      LT_SIMD(reduction(+ : sum))                                                                                      \
      for (int64_t j = a; j < b; j++) {                                                                                \
        real p = EXP(s[j] - m);                                                                                        \
        s[j] = p;                                                                                                      \
        sum += p;                                                                                                      \
      }                                                                                                                \
    }                                                                                                                  \
    *max_out = m;                                                                                                      \
    return sum;                                                                                                        \
  }                                                                                                                    \
                                                                                                                       \
  /* Backward: scores s[0, n) -> probabilities exp(s - lse) on the visible keys, 0 elsewhere. */                       \
  static void probs_row##_##SFX(real *s, int64_t n, int64_t a, int64_t b, const int64_t *segk, int64_t seg_t,          \
                                real lse) {                                                                            \
    if (lse == -INFINITY) a = b = 0; /* a row that saw no key */                                                       \
    for (int64_t j = 0; j < a; j++) s[j] = 0;                                                                          \
    for (int64_t j = b; j < n; j++) s[j] = 0;                                                                          \
    if (segk) {                                                                                                        \
      for (int64_t j = a; j < b; j++) s[j] = segk[j] == seg_t ? EXP(s[j] - lse) : 0;                                   \
    } else {                                                                                                           \
      LT_SIMD()                                                                                                        \
      for (int64_t j = a; j < b; j++) s[j] = EXP(s[j] - lse);                                                          \
    }                                                                                                                  \
  }                                                                                                                    \
                                                                                                                       \
  /* dP row -> dS = P * (dP - delta) */                                                                                \
  static void dscores_row##_##SFX(real *restrict dp, const real *restrict p, int64_t n, real delta) {                  \
    LT_SIMD()                                                                                                          \
    for (int64_t j = 0; j < n; j++) dp[j] = p[j] * (dp[j] - delta);                                                    \
  }                                                                                                                    \
                                                                                                                       \
  /* Forward for query rows [t0, t0 + nr) of head h in batch b. scores: (nr, S) scratch. */                            \
  static void forward_block##_##SFX(const att_ctx *c, int64_t b, int64_t h, int64_t t0, int64_t nr, real *scores,      \
                                    int64_t *lo, int64_t *hi, real *inv_sum) {                                         \
    int64_t g = h / c->group, klo, khi, D = c->D;                                                                      \
    block_keys(c, b, t0, nr, lo, hi, &klo, &khi);                                                                      \
    int64_t nk = khi - klo;                                                                                            \
    real *O = row##_##SFX(&c->out, b, t0, h);                                                                          \
    const int64_t *seg = c->seg ? c->seg + b * c->T : NULL, *segk = seg && !c->sorted[b] ? seg + klo : NULL;           \
    if (nk > 0) {                                                                                                      \
      gemm##_##SFX(false, true, nr, nk, D, (real)c->scale, row##_##SFX(&c->q, b, t0, h), c->q.ld,                      \
                   row##_##SFX(&c->k, b, klo, g), c->k.ld, 0, scores, nk);                                             \
      for (int64_t i = 0; i < nr; i++) {                                                                               \
        real m, sum = softmax_row##_##SFX(scores + i * nk, nk, lo[i] - klo, hi[i] - klo, segk, segk ? seg[t0 + i] : 0, \
                                          &m);                                                                         \
        inv_sum[i] = sum > 0 ? 1 / sum : 0;                                                                            \
        if (c->lse)                                                                                                    \
          c->lse[b * c->lse_sb + h * c->lse_sh + (t0 + i) * c->lse_st] = sum > 0 ? (float)(m + LOG(sum)) : -INFINITY;  \
      }                                                                                                                \
      gemm##_##SFX(false, false, nr, D, nk, 1, scores, nk, row##_##SFX(&c->v, b, klo, g), c->v.ld, 0, O, c->out.ld);   \
    } else {                                                                                                           \
      for (int64_t i = 0; i < nr; i++) {                                                                               \
        inv_sum[i] = 0;                                                                                                \
        if (c->lse) c->lse[b * c->lse_sb + h * c->lse_sh + (t0 + i) * c->lse_st] = -INFINITY;                          \
      }                                                                                                                \
    }                                                                                                                  \
    for (int64_t i = 0; i < nr; i++) {                                                                                 \
      real *o = O + i * c->out.ld, r = inv_sum[i];                                                                     \
      if (nk == 0) {                                                                                                   \
        for (int64_t d = 0; d < D; d++) o[d] = 0;                                                                      \
      } else {                                                                                                         \
        LT_SIMD()                                                                                                      \
        for (int64_t d = 0; d < D; d++) o[d] *= r;                                                                     \
      }                                                                                                                \
    }                                                                                                                  \
  }                                                                                                                    \
                                                                                                                       \
  /* delta[b, h, t] = dout[b, t, h, :] . out[b, t, h, :] for the rows r in [r0, r0 + n) of (B, H, T). */               \
  static void delta_rows##_##SFX(const att_ctx *c, int64_t r0, int64_t n) {                                            \
    real *delta = c->delta;                                                                                            \
    for (int64_t r = r0; r < r0 + n; r++) {                                                                            \
      int64_t b = r / (c->H * c->T), h = (r / c->T) % c->H, t = r % c->T;                                              \
      const real *x = row##_##SFX(&c->dout, b, t, h), *y = row##_##SFX(&c->out, b, t, h);                              \
      real s = 0;                                                                                                      \
      LT_SIMD(reduction(+ : s))                                                                                        \
      for (int64_t d = 0; d < c->D; d++) s += x[d] * y[d];                                                             \
      delta[r] = s;                                                                                                    \
    }                                                                                                                  \
  }                                                                                                                    \
                                                                                                                       \
  static real lse_at##_##SFX(const att_ctx *c, int64_t b, int64_t h, int64_t t) {                                      \
    if (c->lse_exact) return (real)c->lse_exact[(b * c->H + h) * c->T + t];                                            \
    return (real)c->lse_in[b * c->lse_sb + h * c->lse_sh + t * c->lse_st];                                             \
  }                                                                                                                    \
                                                                                                                       \
  /* The lse of one row of scaled scores s[0, n) over its visible keys (as softmax_row), -inf if none. */              \
  static real row_lse##_##SFX(const real *s, int64_t a, int64_t b, const int64_t *segk, int64_t seg_t) {               \
    real m = -INFINITY, sum = 0;                                                                                       \
    for (int64_t j = a; j < b; j++)                                                                                    \
      if ((!segk || segk[j] == seg_t) && s[j] > m) m = s[j];                                                           \
    if (m == -INFINITY) return m;                                                                                      \
    for (int64_t j = a; j < b; j++)                                                                                    \
      if (!segk || segk[j] == seg_t) sum += EXP(s[j] - m);                                                             \
    return m + LOG(sum);                                                                                               \
  }                                                                                                                    \
                                                                                                                       \
  /* dQ for query rows [t0, t0 + nr) of head h in batch b. p, dp: (nr, S) scratch. */                                  \
  static void dq_block##_##SFX(const att_ctx *c, int64_t b, int64_t h, int64_t t0, int64_t nr, real *p, real *dp,      \
                               int64_t *lo, int64_t *hi) {                                                             \
    int64_t g = h / c->group, klo, khi, D = c->D;                                                                      \
    block_keys(c, b, t0, nr, lo, hi, &klo, &khi);                                                                      \
    int64_t nk = khi - klo;                                                                                            \
    real *dQ = row##_##SFX(&c->dq, b, t0, h);                                                                          \
    if (nk == 0) {                                                                                                     \
      for (int64_t i = 0; i < nr; i++) {                                                                               \
        for (int64_t d = 0; d < D; d++) dQ[i * c->dq.ld + d] = 0;                                                      \
        if (c->lse_exact) c->lse_exact[(b * c->H + h) * c->T + t0 + i] = -INFINITY;                                    \
      }                                                                                                                \
      return;                                                                                                          \
    }                                                                                                                  \
    const int64_t *seg = c->seg ? c->seg + b * c->T : NULL, *segk = seg && !c->sorted[b] ? seg + klo : NULL;           \
    const real *K = row##_##SFX(&c->k, b, klo, g), *delta = (const real *)c->delta + (b * c->H + h) * c->T + t0;       \
    gemm##_##SFX(false, true, nr, nk, D, (real)c->scale, row##_##SFX(&c->q, b, t0, h), c->q.ld, K, c->k.ld, 0, p, nk); \
    gemm##_##SFX(false, true, nr, nk, D, 1, row##_##SFX(&c->dout, b, t0, h), c->dout.ld,                               \
                 row##_##SFX(&c->v, b, klo, g), c->v.ld, 0, dp, nk);                                                   \
    for (int64_t i = 0; i < nr; i++) {                                                                                 \
      int64_t seg_t = segk ? seg[t0 + i] : 0;                                                                          \
      if (c->lse_exact) /* this task is the only one to see the whole row: refine its lse for dK, dV */                \
        c->lse_exact[(b * c->H + h) * c->T + t0 + i] =                                                                 \
            (double)row_lse##_##SFX(p + i * nk, lo[i] - klo, hi[i] - klo, segk, seg_t);                                \
      probs_row##_##SFX(p + i * nk, nk, lo[i] - klo, hi[i] - klo, segk, seg_t, lse_at##_##SFX(c, b, h, t0 + i));       \
      dscores_row##_##SFX(dp + i * nk, p + i * nk, nk, delta[i]);                                                      \
    }                                                                                                                  \
    gemm##_##SFX(false, false, nr, D, nk, (real)c->scale, dp, nk, K, c->k.ld, 0, dQ, c->dq.ld);                        \
  }                                                                                                                    \
                                                                                                                       \
  /* dK, dV for keys [s0, s0 + nc) of kv head g in batch b: sums over the group's heads and their */                   \
  /* query rows in a fixed order. p, dp: (QCHUNK, nc) scratch; lo, hi: (QCHUNK). */                                    \
  static void dkv_block##_##SFX(const att_ctx *c, int64_t b, int64_t g, int64_t s0, int64_t nc, real *p, real *dp,     \
                                int64_t *lo, int64_t *hi) {                                                            \
    int64_t D = c->D, qlo, qhi;                                                                                        \
    block_queries(c, b, s0, nc, &qlo, &qhi);                                                                           \
    real *dK = row##_##SFX(&c->dk, b, s0, g), *dV = row##_##SFX(&c->dv, b, s0, g);                                     \
    const real *K = row##_##SFX(&c->k, b, s0, g), *V = row##_##SFX(&c->v, b, s0, g);                                   \
    const int64_t *seg = c->seg ? c->seg + b * c->T : NULL, *segk = seg && !c->sorted[b] ? seg + s0 : NULL;            \
    real beta = 0;                                                                                                     \
    for (int64_t h = g * c->group; h < (g + 1) * c->group; h++) {                                                      \
      const real *delta = (const real *)c->delta + (b * c->H + h) * c->T;                                              \
      for (int64_t t0 = qlo; t0 < qhi; t0 += QCHUNK) {                                                                 \
        int64_t nq = qhi - t0 < QCHUNK ? qhi - t0 : QCHUNK;                                                            \
        const real *Q = row##_##SFX(&c->q, b, t0, h), *dO = row##_##SFX(&c->dout, b, t0, h);                           \
        gemm##_##SFX(false, true, nq, nc, D, (real)c->scale, Q, c->q.ld, K, c->k.ld, 0, p, nc);                        \
        for (int64_t i = 0; i < nq; i++) {                                                                             \
          row_keys(c, b, t0 + i, &lo[i], &hi[i]);                                                                      \
          int64_t a = lo[i] - s0 < 0 ? 0 : lo[i] - s0, e = hi[i] - s0 > nc ? nc : hi[i] - s0;                          \
          probs_row##_##SFX(p + i * nc, nc, a, e > a ? e : a, segk, segk ? seg[t0 + i] : 0,                            \
                            lse_at##_##SFX(c, b, h, t0 + i));                                                          \
        }                                                                                                              \
        gemm##_##SFX(true, false, nc, D, nq, 1, p, nc, dO, c->dout.ld, beta, dV, c->dv.ld);                            \
        gemm##_##SFX(false, true, nq, nc, D, 1, dO, c->dout.ld, V, c->v.ld, 0, dp, nc);                                \
        for (int64_t i = 0; i < nq; i++) dscores_row##_##SFX(dp + i * nc, p + i * nc, nc, delta[t0 + i]);              \
        gemm##_##SFX(true, false, nc, D, nq, (real)c->scale, dp, nc, Q, c->q.ld, beta, dK, c->dk.ld);                  \
        beta = 1;                                                                                                      \
      }                                                                                                                \
    }                                                                                                                  \
    if (beta == 0) /* no query sees these keys */                                                                      \
      for (int64_t i = 0; i < nc; i++)                                                                                 \
        for (int64_t d = 0; d < D; d++) dK[i * c->dk.ld + d] = dV[i * c->dv.ld + d] = 0;                               \
  }
/* f32: ops/vecmath.h's exp, which vectorises under -ftrapping-math and keeps NaN */
DEFINE_ATTENTION_ROWS(float, f32, cblas_sgemm, lt_exp_clamp_f32, logf)
DEFINE_ATTENTION_ROWS(double, f64, cblas_dgemm, exp, log)

/* ---- forward --------------------------------------------------------------------------- */

/* The next task of a dynamic schedule: a shared counter, so any thread order gives the same
 * results (every task writes its own rows). */
static int64_t next_task(int64_t *counter) {
  int64_t task;
#pragma omp atomic capture
  task = (*counter)++;
  return task;
}

typedef struct {
  att_ctx *c;
  bool f64, oom;
  int64_t nblk, tasks, next;
  size_t scratch;
} forward_job;

/* Forward tasks (b, h, block of BLOCK_ROWS query rows), taken from j->next. */
static int forward_tasks(void *job, int tid, int nthreads) {
  (void)tid, (void)nthreads;
  forward_job *j = job;
  att_ctx *c = j->c;
  int64_t nblk = j->nblk;
  size_t esize = j->f64 ? 8 : 4;
  char *buf = malloc(j->scratch);
  if (!buf) {
#pragma omp atomic write
    j->oom = true;
    return 0;
  }
  int64_t *lo = (int64_t *)buf, *hi = lo + BLOCK_ROWS;
  void *inv = hi + BLOCK_ROWS, *scores = (char *)inv + BLOCK_ROWS * esize;
  for (int64_t task = next_task(&j->next); task < j->tasks; task = next_task(&j->next)) {
    int64_t b = task / (c->H * nblk), h = (task / nblk) % c->H, t0 = (task % nblk) * BLOCK_ROWS;
    int64_t nr = c->T - t0 < BLOCK_ROWS ? c->T - t0 : BLOCK_ROWS;
    if (j->f64)
      forward_block_f64(c, b, h, t0, nr, scores, lo, hi, inv);
    else
      forward_block_f32(c, b, h, t0, nr, scores, lo, hi, inv);
  }
  free(buf);
  return 0; /* a failure is recorded in the job (j->oom) */
}

int lt_attention_forward_cpu(att_ctx *c, bool f64) {
  int64_t nblk = (c->T + BLOCK_ROWS - 1) / BLOCK_ROWS, tasks = c->B * c->H * nblk;
  size_t esize = f64 ? 8 : 4, scratch = (size_t)BLOCK_ROWS * ((size_t)c->S * esize + 2 * 8 + esize) + 64;
  forward_job job = {.c = c, .f64 = f64, .nblk = nblk, .tasks = tasks, .scratch = scratch};
  lt_run_parts(forward_tasks, &job, tasks > 1 && c->B * c->H * c->T * (c->S + 1) * (c->D + 1) >= 8 * LT_PAR_GRAIN);
  return job.oom
             ? lt_errorf("attention_forward: out of memory for a %d x %lld score block", BLOCK_ROWS, (long long)c->S)
             : 0;
}

/* ---- backward -------------------------------------------------------------------------- */

typedef struct {
  att_ctx *c;
  bool f64, oom;
  int64_t nblk, kblk, rows, dq_tasks, dkv_tasks, next_dq, next_dkv;
  size_t scratch;
} backward_job;

/* The three backward passes with a team barrier between them: delta rows split statically,
 * then dQ and dK/dV tasks taken from shared counters. No barrier on one thread: called outside
 * the team (the serial branch), an orphaned barrier would bind to a caller's enclosing team. */
static int backward_tasks(void *job, int tid, int nthreads) {
  backward_job *j = job;
  att_ctx *c = j->c;
  int64_t nblk = j->nblk, kblk = j->kblk;
  size_t esize = j->f64 ? 8 : 4;
  char *buf = malloc(j->scratch);
  int64_t *lo = (int64_t *)buf, *hi = lo + BLOCK_ROWS + QCHUNK;
  char *p = (char *)(hi + BLOCK_ROWS + QCHUNK);
  if (!buf) {
#pragma omp atomic write
    j->oom = true;
  }
  /* delta = rowsum(dout * out), by chunks of 256 rows */
  int64_t nchunks = (j->rows + 255) / 256;
  for (int64_t ci = nchunks * tid / nthreads; ci < nchunks * (tid + 1) / nthreads; ci++) {
    int64_t r0 = ci * 256, n = j->rows - r0 < 256 ? j->rows - r0 : 256;
    if (j->f64)
      delta_rows_f64(c, r0, n);
    else
      delta_rows_f32(c, r0, n);
  }
  if (nthreads > 1) {
#pragma omp barrier
  }
  /* dQ by query-row blocks (the barrier above makes delta complete); every thread reaches the
   * barriers, with or without scratch */
  for (int64_t task = buf ? next_task(&j->next_dq) : j->dq_tasks; task < j->dq_tasks; task = next_task(&j->next_dq)) {
    int64_t b = task / (c->H * nblk), h = (task / nblk) % c->H, t0 = (task % nblk) * BLOCK_ROWS;
    int64_t nr = c->T - t0 < BLOCK_ROWS ? c->T - t0 : BLOCK_ROWS;
    size_t half = (size_t)BLOCK_ROWS * (size_t)c->S * esize;
    if (j->f64)
      dq_block_f64(c, b, h, t0, nr, (double *)p, (double *)(p + half), lo, hi);
    else
      dq_block_f32(c, b, h, t0, nr, (float *)p, (float *)(p + half), lo, hi);
  }
  if (nthreads > 1) {
#pragma omp barrier
  }
  /* dK, dV by key blocks of each kv head */
  for (int64_t task = buf ? next_task(&j->next_dkv) : j->dkv_tasks; task < j->dkv_tasks;
       task = next_task(&j->next_dkv)) {
    int64_t b = task / (c->Hkv * kblk), g = (task / kblk) % c->Hkv, s0 = (task % kblk) * BLOCK_KEYS;
    int64_t nc = c->S - s0 < BLOCK_KEYS ? c->S - s0 : BLOCK_KEYS;
    size_t half = (size_t)QCHUNK * BLOCK_KEYS * esize;
    if (j->f64)
      dkv_block_f64(c, b, g, s0, nc, (double *)p, (double *)(p + half), lo, hi);
    else
      dkv_block_f32(c, b, g, s0, nc, (float *)p, (float *)(p + half), lo, hi);
  }
  free(buf);
  return 0; /* a failure is recorded in the job (j->oom) */
}

int lt_attention_backward_cpu(att_ctx *c, bool f64) {
  int64_t nblk = (c->T + BLOCK_ROWS - 1) / BLOCK_ROWS, kblk = (c->S + BLOCK_KEYS - 1) / BLOCK_KEYS;
  size_t esize = f64 ? 8 : 4;
  size_t dq_scratch = 2 * (size_t)BLOCK_ROWS * (size_t)c->S * esize;
  size_t dkv_scratch = 2 * (size_t)QCHUNK * BLOCK_KEYS * esize;
  size_t scratch = (dq_scratch > dkv_scratch ? dq_scratch : dkv_scratch) + 2 * 8 * (BLOCK_ROWS + QCHUNK) + 64;
  backward_job job = {.c = c,
                      .f64 = f64,
                      .nblk = nblk,
                      .kblk = kblk,
                      .rows = c->B * c->H * c->T,
                      .dq_tasks = c->B * c->H * nblk,
                      .dkv_tasks = c->B * c->Hkv * kblk,
                      .scratch = scratch};
  lt_run_parts(backward_tasks, &job, c->B * c->H * c->T * (c->S + 1) * (c->D + 1) >= 8 * LT_PAR_GRAIN);
  return job.oom ? lt_errorf("attention_backward: out of memory for scratch blocks") : 0;
}
