/* attention_backward_mma.cu — the tensor-core attention backward for bf16/f16 with D 64 or 128 (passes 2
 * and 3 of kernels/attention_backward.cu, which computes delta first and launches these). mma.sync m16n8k16 with
 * f32 accumulation; fragment layouts as in kernels/attention_forward.cu. Deterministic: no atomics.
 *
 * att_dq_mma: one CTA of 4 warps per (b, h, block of 64 query rows), each warp 16 rows with its Q
 *   and dout rows as A fragments in registers; key tiles of 32 keys (K row-major and transposed,
 *   V row-major in shared memory, 27 KB for D = 128): S = Q K^T, dP = dO V^T, P = exp2(S scale2 -
 *   lse2), dS = P (dP - delta), dQ += dS K with dS rounded to 16 bits. Tiles past the block's
 *   causal diagonal, and before its first row's sliding window, are skipped.
 * att_dkv_mma: one CTA of 4 warps per (b, kv head, tile of 64 keys), each warp 16 keys; K, V staged
 *   once; for each query head of the group in order, query tiles of 32 rows from the first that
 *   sees the key tile to the last whose sliding window still reaches it (q and dout row-major and
 *   transposed): S^T = K Q^T, dP^T = V dO^T, then
 *   dV += P^T dO and dK += dS^T Q with P and dS rounded to 16 bits, accumulated in registers.
 *   Shared memory att_dkv_mma_smem(D): 38 KB for D = 64, 72 KB for D = 128 (opted in).
 */
#include "kernels/attention_tile.cuh"

template <typename E, int D>
__global__ void __launch_bounds__(ATT_MMA_WARPS * 32)
    att_dq_mma(const lt_cuda_att_args a, int64_t nblk, const float *delta) {
  constexpr int BR = ATT_BWD_MMA_BR, BC = ATT_BWD_MMA_BC, KLD = D + 8, KTLD = BC + 8, NK = D / 16, NT = BC / 8,
                ND = D / 8;
  static_assert(BR == ATT_MMA_WARPS * 16, "one warp per 16 query rows");
  __shared__ __align__(16) uint16_t sK[BC * KLD];
  __shared__ __align__(16) uint16_t sV[BC * KLD];
  __shared__ __align__(16) uint16_t sKt[D * KTLD];
  __shared__ int64_t sSeg[BC];
  using ops = mma_ops<E>;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gid = lane / 4, tig = lane % 4;
  const int64_t task = blockIdx.x, qb = att_query_block(task, nblk), bh = task / nblk;
  const int64_t h = bh % a.H, b = bh / a.H, g = h / a.group, t0 = qb * BR, TQ = a.T, S = a.S;
  const int64_t tr[2] = {t0 + warp * 16 + gid, t0 + warp * 16 + gid + 8};

  uint32_t qf[NK][4], gf[NK][4]; /* the warp's rows of Q and dout as A fragments */
  float lse2[2], dl[2];
  int64_t segq[2];
  for (int r = 0; r < 2; r++) {
    bool in = tr[r] < TQ;
    const uint16_t *qrow = in ? att_row<const uint16_t>(a.q, b, tr[r], h) : nullptr;
    const uint16_t *grow = in ? att_row<const uint16_t>(a.dout, b, tr[r], h) : nullptr;
#pragma unroll
    for (int kk = 0; kk < NK; kk++) {
      qf[kk][r] = in ? ld32(qrow + kk * 16 + tig * 2) : 0u;
      qf[kk][r + 2] = in ? ld32(qrow + kk * 16 + tig * 2 + 8) : 0u;
      gf[kk][r] = in ? ld32(grow + kk * 16 + tig * 2) : 0u;
      gf[kk][r + 2] = in ? ld32(grow + kk * 16 + tig * 2 + 8) : 0u;
    }
    lse2[r] = in ? a.lse[b * a.lse_sb + h * a.lse_sh + tr[r] * a.lse_st] * (float)ATT_LOG2E : -INFINITY;
    dl[r] = in ? delta[(b * a.H + h) * TQ + tr[r]] : 0.f;
    segq[r] = in ? att_seg(a, b, tr[r]) : 0;
  }
  float dq[ND][4];
#pragma unroll
  for (int n = 0; n < ND; n++) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.f;
  const float scale2 = (float)(a.scale * ATT_LOG2E);
  const int64_t t_last = (t0 + BR < TQ ? t0 + BR : TQ) - 1, kend = att_key_end(t_last, S, a.off, a.causal);
  const int64_t kbegin = att_key_begin(t0, a.off, a.window, BC);
  int64_t qmin = 0, qmax = 0;
  if (a.seg && t0 < TQ) att_seg_span(a, b, t0, t_last + 1, &qmin, &qmax);

  for (int64_t kv0 = kbegin; kv0 < kend; kv0 += BC) {
    __syncthreads();
    att_stage16<D>(sK, KLD, sKt, KTLD, a.k, b, g, kv0, BC, S);
    att_stage16<D>(sV, KLD, nullptr, 0, a.v, b, g, kv0, BC, S);
    if (a.seg && threadIdx.x < BC) sSeg[threadIdx.x] = kv0 + threadIdx.x < S ? att_seg(a, b, kv0 + threadIdx.x) : 0;
    __syncthreads();
    if (a.seg) { /* the tile shares no segment with the block's rows */
      int64_t kmin, kmax;
      att_seg_span_shared(sSeg, (int)(S - kv0 < BC ? S - kv0 : BC), &kmin, &kmax);
      if (!att_ranges_meet(qmin, qmax, kmin, kmax)) continue; /* uniform over the CTA */
    }
    float s[NT][4], dp[NT][4];
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) s[n][e] = dp[n][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < NK; kk++) {
#pragma unroll
      for (int n = 0; n < NT; n++) {
        const uint16_t *kp = &sK[(n * 8 + gid) * KLD + kk * 16 + tig * 2],
                       *vp = &sV[(n * 8 + gid) * KLD + kk * 16 + tig * 2];
        ops::mma(s[n], qf[kk], ld32(kp), ld32(kp + 8));
        ops::mma(dp[n], gf[kk], ld32(vp), ld32(vp + 8));
      }
    }
#pragma unroll
    for (int n = 0; n < NT; n++) {
#pragma unroll
      for (int e = 0; e < 4; e++) {
        int r = e / 2, j = n * 8 + tig * 2 + (e & 1);
        bool vis = att_visible(tr[r], TQ, kv0 + j, S, a.off, a.causal, a.window) && (!a.seg || segq[r] == sSeg[j]);
        float p = vis ? att_prob_f32(s[n][e] * scale2, lse2[r]) : 0.f;
        s[n][e] = vis ? att_dscore_f32(p, dp[n][e], dl[r]) : 0.f; /* dS */
      }
    }
    /* dQ += dS K: dS in C layout is the A operand; B[key][d] = K^T staged as sKt[d][key] */
#pragma unroll
    for (int kk = 0; kk < BC / 16; kk++) {
      uint32_t da[4] = {ops::pack(s[2 * kk][0], s[2 * kk][1]), ops::pack(s[2 * kk][2], s[2 * kk][3]),
                        ops::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]), ops::pack(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int n = 0; n < ND; n++) {
        const uint16_t *kp = &sKt[(n * 8 + gid) * KTLD + kk * 16 + tig * 2];
        ops::mma(dq[n], da, ld32(kp), ld32(kp + 8));
      }
    }
  }
  const float scale = (float)a.scale;
#pragma unroll
  for (int r = 0; r < 2; r++) {
    if (tr[r] >= TQ) continue;
    uint16_t *row = att_row<uint16_t>(a.dq, b, tr[r], h);
#pragma unroll
    for (int n = 0; n < ND; n++) {
      uint32_t pair =
          (uint32_t)ops::to_bits(scale * dq[n][2 * r]) | ((uint32_t)ops::to_bits(scale * dq[n][2 * r + 1]) << 16);
      *reinterpret_cast<uint32_t *>(row + n * 8 + tig * 2) = pair;
    }
  }
}

template <typename E, int D>
__global__ void __launch_bounds__(ATT_MMA_WARPS * 32)
    att_dkv_mma(const lt_cuda_att_args a, int64_t kblk, const float *delta) {
  constexpr int BKV = ATT_BWD_MMA_BKV, BQ = ATT_BWD_MMA_BQ, LD = D + 8, QTLD = BQ + 8, NK = D / 16, NQ = BQ / 8,
                ND = D / 8;
  static_assert(BKV == ATT_MMA_WARPS * 16, "one warp per 16 keys");
  extern __shared__ __align__(16) unsigned char smem[];
  uint16_t *sK = (uint16_t *)smem, *sV = sK + BKV * LD, *sQ = sV + BKV * LD, *sdO = sQ + BQ * LD, *sQt = sdO + BQ * LD,
           *sdOt = sQt + D * QTLD;
  float *sLse = (float *)(sdOt + D * QTLD), *sDelta = sLse + BQ;
  int64_t *sSegQ = (int64_t *)(sDelta + BQ), *sSegK = sSegQ + BQ;
  using ops = mma_ops<E>;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gid = lane / 4, tig = lane % 4;
  const int64_t task = blockIdx.x, kb = task % kblk, bg = task / kblk, g = bg % a.Hkv, b = bg / a.Hkv;
  const int64_t s0 = kb * BKV, TQ = a.T, S = a.S;
  const int kl[2] = {warp * 16 + gid, warp * 16 + gid + 8}; /* this lane's two keys in the tile */

  att_stage16<D>(sK, LD, nullptr, 0, a.k, b, g, s0, BKV, S);
  att_stage16<D>(sV, LD, nullptr, 0, a.v, b, g, s0, BKV, S);
  if (a.seg)
    for (int i = threadIdx.x; i < BKV; i += blockDim.x) sSegK[i] = s0 + i < S ? att_seg(a, b, s0 + i) : 0;
  float dk[ND][4], dv[ND][4];
#pragma unroll
  for (int n = 0; n < ND; n++)
#pragma unroll
    for (int e = 0; e < 4; e++) dk[n][e] = dv[n][e] = 0.f;
  const float scale2 = (float)(a.scale * ATT_LOG2E);
  const int64_t qbegin = att_query_begin(s0, a.off, a.causal),
                qend = att_query_end((s0 + BKV < S ? s0 + BKV : S) - 1, TQ, a.off, a.window);
  int64_t kmin = 0, kmax = 0;
  if (a.seg) att_seg_span(a, b, s0, s0 + BKV < S ? s0 + BKV : S, &kmin, &kmax);

  for (int64_t h = g * a.group; h < (g + 1) * a.group; h++) {
    for (int64_t tq = qbegin; tq < qend; tq += BQ) {
      __syncthreads(); /* the previous query tile is no longer read (and K, V are staged) */
      att_stage16<D>(sQ, LD, sQt, QTLD, a.q, b, h, tq, BQ, TQ);
      att_stage16<D>(sdO, LD, sdOt, QTLD, a.dout, b, h, tq, BQ, TQ);
      for (int i = threadIdx.x; i < BQ; i += blockDim.x) {
        int64_t t = tq + i;
        bool in = t < TQ;
        sLse[i] = in ? a.lse[b * a.lse_sb + h * a.lse_sh + t * a.lse_st] * (float)ATT_LOG2E : -INFINITY;
        sDelta[i] = in ? delta[(b * a.H + h) * TQ + t] : 0.f;
        sSegQ[i] = in ? att_seg(a, b, t) : 0;
      }
      __syncthreads();
      if (a.seg) { /* the query tile shares no segment with the key tile */
        int64_t qmin, qmax;
        att_seg_span_shared(sSegQ, (int)(TQ - tq < BQ ? TQ - tq : BQ), &qmin, &qmax);
        if (!att_ranges_meet(qmin, qmax, kmin, kmax)) continue; /* uniform over the CTA */
      }
      /* S^T = K Q^T and dP^T = V dO^T: the warp's 16 keys against the tile's BQ queries */
      float st[NQ][4], dpt[NQ][4];
#pragma unroll
      for (int n = 0; n < NQ; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) st[n][e] = dpt[n][e] = 0.f;
#pragma unroll
      for (int kk = 0; kk < NK; kk++) {
        const uint16_t *ka = &sK[kl[0] * LD + kk * 16 + tig * 2], *va = &sV[kl[0] * LD + kk * 16 + tig * 2];
        uint32_t kf[4] = {ld32(ka), ld32(ka + 8 * LD), ld32(ka + 8), ld32(ka + 8 * LD + 8)};
        uint32_t vf[4] = {ld32(va), ld32(va + 8 * LD), ld32(va + 8), ld32(va + 8 * LD + 8)};
#pragma unroll
        for (int n = 0; n < NQ; n++) {
          const uint16_t *qp = &sQ[(n * 8 + gid) * LD + kk * 16 + tig * 2],
                         *gp = &sdO[(n * 8 + gid) * LD + kk * 16 + tig * 2];
          ops::mma(st[n], kf, ld32(qp), ld32(qp + 8));
          ops::mma(dpt[n], vf, ld32(gp), ld32(gp + 8));
        }
      }
#pragma unroll
      for (int n = 0; n < NQ; n++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
          int r = e / 2, j = n * 8 + tig * 2 + (e & 1); /* key kl[r], query tq + j */
          bool vis =
              att_visible(tq + j, TQ, s0 + kl[r], S, a.off, a.causal, a.window) && (!a.seg || sSegQ[j] == sSegK[kl[r]]);
          float p = vis ? att_prob_f32(st[n][e] * scale2, sLse[j]) : 0.f;
          dpt[n][e] = vis ? att_dscore_f32(p, dpt[n][e], sDelta[j]) : 0.f;
          st[n][e] = p;
        }
      }
      /* dV += P^T dO, dK += dS^T Q: P^T, dS^T in C layout are A operands (k = query);
       * B[query][d] = dO, Q staged transposed as sdOt[d][query], sQt[d][query] */
#pragma unroll
      for (int kk = 0; kk < BQ / 16; kk++) {
        uint32_t pa[4] = {ops::pack(st[2 * kk][0], st[2 * kk][1]), ops::pack(st[2 * kk][2], st[2 * kk][3]),
                          ops::pack(st[2 * kk + 1][0], st[2 * kk + 1][1]),
                          ops::pack(st[2 * kk + 1][2], st[2 * kk + 1][3])};
        uint32_t da[4] = {ops::pack(dpt[2 * kk][0], dpt[2 * kk][1]), ops::pack(dpt[2 * kk][2], dpt[2 * kk][3]),
                          ops::pack(dpt[2 * kk + 1][0], dpt[2 * kk + 1][1]),
                          ops::pack(dpt[2 * kk + 1][2], dpt[2 * kk + 1][3])};
#pragma unroll
        for (int n = 0; n < ND; n++) {
          const uint16_t *gp = &sdOt[(n * 8 + gid) * QTLD + kk * 16 + tig * 2];
          const uint16_t *qp = &sQt[(n * 8 + gid) * QTLD + kk * 16 + tig * 2];
          ops::mma(dv[n], pa, ld32(gp), ld32(gp + 8));
          ops::mma(dk[n], da, ld32(qp), ld32(qp + 8));
        }
      }
    }
  }
  const float scale = (float)a.scale;
#pragma unroll
  for (int r = 0; r < 2; r++) {
    int64_t s = s0 + kl[r];
    if (s >= S) continue;
    uint16_t *krow = att_row<uint16_t>(a.dk, b, s, g), *vrow = att_row<uint16_t>(a.dv, b, s, g);
#pragma unroll
    for (int n = 0; n < ND; n++) {
      uint32_t kp =
          (uint32_t)ops::to_bits(scale * dk[n][2 * r]) | ((uint32_t)ops::to_bits(scale * dk[n][2 * r + 1]) << 16);
      uint32_t vp = (uint32_t)ops::to_bits(dv[n][2 * r]) | ((uint32_t)ops::to_bits(dv[n][2 * r + 1]) << 16);
      *reinterpret_cast<uint32_t *>(krow + n * 8 + tig * 2) = kp;
      *reinterpret_cast<uint32_t *>(vrow + n * 8 + tig * 2) = vp;
    }
  }
}

template <typename E, int D> static int launch(const lt_cuda_att_args *a, cudaStream_t stream, const float *delta) {
  int64_t rows = a->B * a->H * a->T;
  if (rows > 0) {
    int64_t nblk = (a->T + ATT_BWD_MMA_BR - 1) / ATT_BWD_MMA_BR;
    att_dq_mma<E, D><<<(unsigned)(a->B * a->H * nblk), ATT_MMA_WARPS * 32, 0, stream>>>(*a, nblk, delta);
  }
  if (a->B * a->Hkv * a->S == 0) return 0;
  int64_t kblk = (a->S + ATT_BWD_MMA_BKV - 1) / ATT_BWD_MMA_BKV, smem = att_dkv_mma_smem(D);
  if (smem > 48 * 1024) {
    cudaError_t e = cudaFuncSetAttribute(att_dkv_mma<E, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return lt_cuda_error("attention_backward", a->device, e);
  }
  att_dkv_mma<E, D><<<(unsigned)(a->B * a->Hkv * kblk), ATT_MMA_WARPS * 32, (size_t)smem, stream>>>(*a, kblk, delta);
  return 0;
}

extern "C" int lt_cuda_attention_bwd_uses_mma(int dtype, int64_t D) {
  return (dtype == LT_BF16 || dtype == LT_F16) && (D == 64 || D == 128);
}

/* Passes 2 and 3 of the backward for bf16/f16 with D 64 or 128 (kernels/attention_backward.cu queued delta). */
int att_backward_mma(const lt_cuda_att_args *a, cudaStream_t stream, const float *delta) {
  if (a->dtype == LT_BF16)
    return a->D == 64 ? launch<lt_bf16_bits, 64>(a, stream, delta) : launch<lt_bf16_bits, 128>(a, stream, delta);
  return a->D == 64 ? launch<lt_f16_bits, 64>(a, stream, delta) : launch<lt_f16_bits, 128>(a, stream, delta);
}
