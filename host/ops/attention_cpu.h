/* attention_cpu.h — the attention block kernels, written once and included twice by
 * ops/attention.c (as Torch7's generic/ files): `real` is the compute type, FN(name) appends its
 * suffix, GEMM is cblas_sgemm or cblas_dgemm, EXP and LOG its exp and log. */

/* C (M, N) = alpha * op(A) @ op(B) + beta * C, row-major. op(A) is (M, K): A is (M, K) with lda,
 * or (K, M) when trans_a. op(B) is (K, N): B is (K, N) with ldb, or (N, K) when trans_b. Split so
 * that every BLAS call has M*N*K <= GEMM_BUDGET (see ops/attention.c); K chunks accumulate in order. */
static void FN(gemm)(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, real alpha, const real *A,
                     int64_t lda, const real *B, int64_t ldb, real beta, real *C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (K == 0) {
    for (int64_t i = 0; i < M; i++)
      for (int64_t j = 0; j < N; j++) C[i * ldc + j] = beta == 0 ? 0 : beta * C[i * ldc + j];
    return;
  }
  int64_t mb = M, nb = N, kb = K;
  while (mb * nb * kb > GEMM_BUDGET) {
    if (kb >= nb && kb >= mb && kb > 16)
      kb = (kb + 1) / 2;
    else if (nb >= mb && nb > 16)
      nb = (nb + 1) / 2;
    else if (mb > 1)
      mb = (mb + 1) / 2;
    else
      break;
  }
  for (int64_t i0 = 0; i0 < M; i0 += mb)
    for (int64_t j0 = 0; j0 < N; j0 += nb)
      for (int64_t k0 = 0; k0 < K; k0 += kb) {
        int64_t m = M - i0 < mb ? M - i0 : mb, n = N - j0 < nb ? N - j0 : nb, k = K - k0 < kb ? K - k0 : kb;
        const real *a = trans_a ? A + k0 * lda + i0 : A + i0 * lda + k0;
        const real *b = trans_b ? B + j0 * ldb + k0 : B + k0 * ldb + j0;
        GEMM(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, (int)m, (int)n,
             (int)k, alpha, a, (int)lda, b, (int)ldb, k0 == 0 ? beta : (real)1, C + i0 * ldc + j0, (int)ldc);
      }
}

static inline real *FN(row)(const operand *o, int64_t b, int64_t t, int64_t h) {
  return (real *)o->base + b * o->sb + t * o->st + h * o->sh;
}

/* One row of scaled scores s[0, n): keeps [a, b) and, when segk is given, the keys whose segment
 * is seg_t; overwrites s with exp(s - max), 0 where masked. Returns the sum (0: no key visible). */
static real FN(softmax_row)(real *s, int64_t n, int64_t a, int64_t b, const int64_t *segk, int64_t seg_t,
                            real *max_out) {
  real m = -INFINITY, sum = 0;
  if (segk) {
    for (int64_t j = a; j < b; j++)
      if (segk[j] == seg_t && s[j] > m) m = s[j];
  } else {
#pragma omp simd reduction(max : m)
    for (int64_t j = a; j < b; j++) m = s[j] > m ? s[j] : m;
  }
  if (m == -INFINITY) a = b = 0;
  for (int64_t j = 0; j < a; j++) s[j] = 0;
  for (int64_t j = b; j < n; j++) s[j] = 0;
  if (segk) {
    for (int64_t j = a; j < b; j++) {
      real p = segk[j] == seg_t ? EXP(s[j] - m) : 0;
      s[j] = p;
      sum += p;
    }
  } else {
#pragma omp simd reduction(+ : sum)
    for (int64_t j = a; j < b; j++) {
      real p = EXP(s[j] - m);
      s[j] = p;
      sum += p;
    }
  }
  *max_out = m;
  return sum;
}

/* Backward: scores s[0, n) -> probabilities exp(s - lse) on the visible keys, 0 elsewhere. */
static void FN(probs_row)(real *s, int64_t n, int64_t a, int64_t b, const int64_t *segk, int64_t seg_t, real lse) {
  if (lse == -INFINITY) a = b = 0; /* a row that saw no key */
  for (int64_t j = 0; j < a; j++) s[j] = 0;
  for (int64_t j = b; j < n; j++) s[j] = 0;
  if (segk) {
    for (int64_t j = a; j < b; j++) s[j] = segk[j] == seg_t ? EXP(s[j] - lse) : 0;
  } else {
#pragma omp simd
    for (int64_t j = a; j < b; j++) s[j] = EXP(s[j] - lse);
  }
}

/* dP row -> dS = P * (dP - delta) */
static void FN(dscores_row)(real *restrict dp, const real *restrict p, int64_t n, real delta) {
#pragma omp simd
  for (int64_t j = 0; j < n; j++) dp[j] = p[j] * (dp[j] - delta);
}

// Forward for query rows [t0, t0 + nr) of head h in batch b. scores: (nr, S) scratch.
static void FN(forward_block)(const att_ctx *c, int64_t b, int64_t h, int64_t t0, int64_t nr, real *scores, int64_t *lo,
                              int64_t *hi, real *inv_sum) {
  int64_t g = h / c->group, klo, khi, D = c->D;
  block_keys(c, b, t0, nr, lo, hi, &klo, &khi);
  int64_t nk = khi - klo;
  real *O = FN(row)(&c->out, b, t0, h);
  const int64_t *seg = c->seg ? c->seg + b * c->T : NULL, *segk = seg && !c->sorted[b] ? seg + klo : NULL;
  if (nk > 0) {
    FN(gemm)
    (false, true, nr, nk, D, (real)c->scale, FN(row)(&c->q, b, t0, h), c->q.ld, FN(row)(&c->k, b, klo, g), c->k.ld, 0,
     scores, nk);
    for (int64_t i = 0; i < nr; i++) {
      real m, sum = FN(softmax_row)(scores + i * nk, nk, lo[i] - klo, hi[i] - klo, segk, segk ? seg[t0 + i] : 0, &m);
      inv_sum[i] = sum > 0 ? 1 / sum : 0;
      if (c->lse)
        c->lse[b * c->lse_sb + h * c->lse_sh + (t0 + i) * c->lse_st] = sum > 0 ? (float)(m + LOG(sum)) : -INFINITY;
    }
    FN(gemm)(false, false, nr, D, nk, 1, scores, nk, FN(row)(&c->v, b, klo, g), c->v.ld, 0, O, c->out.ld);
  } else {
    for (int64_t i = 0; i < nr; i++) {
      inv_sum[i] = 0;
      if (c->lse) c->lse[b * c->lse_sb + h * c->lse_sh + (t0 + i) * c->lse_st] = -INFINITY;
    }
  }
  for (int64_t i = 0; i < nr; i++) {
    real *o = O + i * c->out.ld, r = inv_sum[i];
    if (nk == 0) {
      for (int64_t d = 0; d < D; d++) o[d] = 0;
    } else {
#pragma omp simd
      for (int64_t d = 0; d < D; d++) o[d] *= r;
    }
  }
}

// delta[b, h, t] = dout[b, t, h, :] . out[b, t, h, :] for the rows r in [r0, r0 + n) of (B, H, T).
static void FN(delta_rows)(const att_ctx *c, int64_t r0, int64_t n) {
  real *delta = c->delta;
  for (int64_t r = r0; r < r0 + n; r++) {
    int64_t b = r / (c->H * c->T), h = (r / c->T) % c->H, t = r % c->T;
    const real *x = FN(row)(&c->dout, b, t, h), *y = FN(row)(&c->out, b, t, h);
    real s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t d = 0; d < c->D; d++) s += x[d] * y[d];
    delta[r] = s;
  }
}

static real FN(lse_at)(const att_ctx *c, int64_t b, int64_t h, int64_t t) {
  if (c->lse_exact) return (real)c->lse_exact[(b * c->H + h) * c->T + t];
  return (real)c->lse_in[b * c->lse_sb + h * c->lse_sh + t * c->lse_st];
}

/* The lse of one row of scaled scores s[0, n) over its visible keys (as softmax_row), -inf if none. */
static real FN(row_lse)(const real *s, int64_t a, int64_t b, const int64_t *segk, int64_t seg_t) {
  real m = -INFINITY, sum = 0;
  for (int64_t j = a; j < b; j++)
    if ((!segk || segk[j] == seg_t) && s[j] > m) m = s[j];
  if (m == -INFINITY) return m;
  for (int64_t j = a; j < b; j++)
    if (!segk || segk[j] == seg_t) sum += EXP(s[j] - m);
  return m + LOG(sum);
}

// dQ for query rows [t0, t0 + nr) of head h in batch b. p, dp: (nr, S) scratch.
static void FN(dq_block)(const att_ctx *c, int64_t b, int64_t h, int64_t t0, int64_t nr, real *p, real *dp, int64_t *lo,
                         int64_t *hi) {
  int64_t g = h / c->group, klo, khi, D = c->D;
  block_keys(c, b, t0, nr, lo, hi, &klo, &khi);
  int64_t nk = khi - klo;
  real *dQ = FN(row)(&c->dq, b, t0, h);
  if (nk == 0) {
    for (int64_t i = 0; i < nr; i++) {
      for (int64_t d = 0; d < D; d++) dQ[i * c->dq.ld + d] = 0;
      if (c->lse_exact) c->lse_exact[(b * c->H + h) * c->T + t0 + i] = -INFINITY;
    }
    return;
  }
  const int64_t *seg = c->seg ? c->seg + b * c->T : NULL, *segk = seg && !c->sorted[b] ? seg + klo : NULL;
  const real *K = FN(row)(&c->k, b, klo, g), *delta = (const real *)c->delta + (b * c->H + h) * c->T + t0;
  FN(gemm)(false, true, nr, nk, D, (real)c->scale, FN(row)(&c->q, b, t0, h), c->q.ld, K, c->k.ld, 0, p, nk);
  FN(gemm)
  (false, true, nr, nk, D, 1, FN(row)(&c->dout, b, t0, h), c->dout.ld, FN(row)(&c->v, b, klo, g), c->v.ld, 0, dp, nk);
  for (int64_t i = 0; i < nr; i++) {
    int64_t seg_t = segk ? seg[t0 + i] : 0;
    if (c->lse_exact) /* this task is the only one to see the whole row: refine its lse for dK, dV */
      c->lse_exact[(b * c->H + h) * c->T + t0 + i] =
          (double)FN(row_lse)(p + i * nk, lo[i] - klo, hi[i] - klo, segk, seg_t);
    FN(probs_row)(p + i * nk, nk, lo[i] - klo, hi[i] - klo, segk, seg_t, FN(lse_at)(c, b, h, t0 + i));
    FN(dscores_row)(dp + i * nk, p + i * nk, nk, delta[i]);
  }
  FN(gemm)(false, false, nr, D, nk, (real)c->scale, dp, nk, K, c->k.ld, 0, dQ, c->dq.ld);
}

// dK, dV for keys [s0, s0 + nc) of kv head g in batch b: sums over the group's heads and their
// query rows in a fixed order. p, dp: (QCHUNK, nc) scratch; lo, hi: (QCHUNK).
static void FN(dkv_block)(const att_ctx *c, int64_t b, int64_t g, int64_t s0, int64_t nc, real *p, real *dp,
                          int64_t *lo, int64_t *hi) {
  int64_t D = c->D, qlo, qhi;
  block_queries(c, b, s0, nc, &qlo, &qhi);
  real *dK = FN(row)(&c->dk, b, s0, g), *dV = FN(row)(&c->dv, b, s0, g);
  const real *K = FN(row)(&c->k, b, s0, g), *V = FN(row)(&c->v, b, s0, g);
  const int64_t *seg = c->seg ? c->seg + b * c->T : NULL, *segk = seg && !c->sorted[b] ? seg + s0 : NULL;
  real beta = 0;
  for (int64_t h = g * c->group; h < (g + 1) * c->group; h++) {
    const real *delta = (const real *)c->delta + (b * c->H + h) * c->T;
    for (int64_t t0 = qlo; t0 < qhi; t0 += QCHUNK) {
      int64_t nq = qhi - t0 < QCHUNK ? qhi - t0 : QCHUNK;
      const real *Q = FN(row)(&c->q, b, t0, h), *dO = FN(row)(&c->dout, b, t0, h);
      FN(gemm)(false, true, nq, nc, D, (real)c->scale, Q, c->q.ld, K, c->k.ld, 0, p, nc);
      for (int64_t i = 0; i < nq; i++) {
        row_keys(c, b, t0 + i, &lo[i], &hi[i]);
        int64_t a = lo[i] - s0 < 0 ? 0 : lo[i] - s0, e = hi[i] - s0 > nc ? nc : hi[i] - s0;
        FN(probs_row)(p + i * nc, nc, a, e > a ? e : a, segk, segk ? seg[t0 + i] : 0, FN(lse_at)(c, b, h, t0 + i));
      }
      FN(gemm)(true, false, nc, D, nq, 1, p, nc, dO, c->dout.ld, beta, dV, c->dv.ld);
      FN(gemm)(false, true, nq, nc, D, 1, dO, c->dout.ld, V, c->v.ld, 0, dp, nc);
      for (int64_t i = 0; i < nq; i++) FN(dscores_row)(dp + i * nc, p + i * nc, nc, delta[t0 + i]);
      FN(gemm)(true, false, nc, D, nq, (real)c->scale, dp, nc, Q, c->q.ld, beta, dK, c->dk.ld);
      beta = 1;
    }
  }
  if (beta == 0) /* no query sees these keys */
    for (int64_t i = 0; i < nc; i++)
      for (int64_t d = 0; d < D; d++) dK[i * c->dk.ld + d] = dV[i * c->dv.ld + d] = 0;
}
