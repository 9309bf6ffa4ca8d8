/* attention_forward.cu — attention forward on CUDA, flash-style: tiled, with an online softmax, never
 * a T x S matrix in memory. Semantics and the tile math: host/ops/attention.c, kernels/attention_tile.h.
 *
 * Two kernels:
 * - att_fwd_mma<T, D> (bf16/f16, D 64 or 128): one CTA of 4 warps per (b, h, block of 64 query
 *   rows), each warp 16 rows. Q stays in registers as mma A fragments; key tiles of 64 keys of K
 *   and V (V transposed) are staged in shared memory; S = Q K^T and O += P V run on tensor cores
 *   (mma.sync m16n8k16, f32 accumulation); P is rounded to T for the P V product, the row sums l
 *   use the f32 P. Key tiles past the causal diagonal of the block's last row, and before the
 *   sliding window of its first row, are skipped.
 *   Shared memory: K 64 x (D + 8) and V^T D x (64 + 8) 16-bit elements, + 64 segment ids:
 *   18.5 KB for D = 64, 35.5 KB for D = 128.
 * - att_fwd_gen<T, acc> (every dtype, any D <= 256): one CTA of 8 warps per (b, h, block of 8
 *   query rows), a warp per row; key tiles of bc <= 32 keys (att_gen_bc: within 48 KB of shared
 *   memory) staged converted to acc (f32, f64 for f64); lane j scores key j of the tile, the
 *   output row is spread over the lanes (D / 32 values each).
 */
#include "kernels/attention_tile.cuh"

/* ---- tensor-core forward ------------------------------------------------------------------ */

/* Fragment layouts of mma.m16n8k16 (PTX ISA), lane = 4 * gid + tig:
 *   A (16 x 16): reg 0 = row gid, cols 2 tig, +1; reg 1 = row gid + 8, same cols;
 *                reg 2 = row gid, cols 2 tig + 8, +9; reg 3 = row gid + 8, cols 2 tig + 8, +9.
 *   B (16 x 8):  reg 0 = rows 2 tig, +1 of col gid; reg 1 = rows 2 tig + 8, +9 of col gid.
 *   C (16 x 8):  c0, c1 = row gid, cols 2 tig, +1; c2, c3 = row gid + 8, same cols.
 * The lower-indexed element of a pair sits in the low 16 bits (a 32-bit load of two neighbours). */
template <typename T, int D>
__global__ void __launch_bounds__(ATT_MMA_WARPS * 32) att_fwd_mma(const lt_cuda_att_args a, int64_t nblk) {
  constexpr int BR = ATT_MMA_BR, BC = ATT_MMA_BC, KLD = D + 8, VLD = BC + 8, NK = D / 16, NT = BC / 8, ND = D / 8;
  static_assert(BR == ATT_MMA_WARPS * 16, "one warp per 16 query rows");
  __shared__ __align__(16) uint16_t sK[BC * KLD]; /* K tile, row = key */
  __shared__ __align__(16) uint16_t sVt[D * VLD]; /* V tile transposed, row = dim */
  __shared__ int64_t sSeg[BC];
  using ops = mma_ops<T>;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gid = lane / 4, tig = lane % 4;
  const int64_t task = blockIdx.x, qb = att_query_block(task, nblk), bh = task / nblk;
  const int64_t h = bh % a.H, b = bh / a.H, g = h / a.group, t0 = qb * BR, TQ = a.T, S = a.S;
  const int64_t tr[2] = {t0 + warp * 16 + gid, t0 + warp * 16 + gid + 8}; /* this lane's two rows */

  uint32_t qf[NK][4]; /* the warp's 16 rows of Q as A fragments */
  int64_t segq[2];
  for (int r = 0; r < 2; r++) {
    const uint16_t *qrow = tr[r] < TQ ? att_row<const uint16_t>(a.q, b, tr[r], h) : nullptr;
#pragma unroll
    for (int kk = 0; kk < NK; kk++) {
      qf[kk][r] = qrow ? ld32(qrow + kk * 16 + tig * 2) : 0u;
      qf[kk][r + 2] = qrow ? ld32(qrow + kk * 16 + tig * 2 + 8) : 0u;
    }
    segq[r] = tr[r] < TQ ? att_seg(a, b, tr[r]) : 0;
  }
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}; /* l: this lane's part of the row sum */
  float o[ND][4];
#pragma unroll
  for (int n = 0; n < ND; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  const float scale2 = (float)(a.scale * ATT_LOG2E);
  const int64_t t_last = (t0 + BR < TQ ? t0 + BR : TQ) - 1, kend = att_key_end(t_last, S, a.off, a.causal);
  const int64_t kbegin = att_key_begin(t0, a.off, a.window, BC);
  int64_t qmin = 0, qmax = 0;
  if (a.seg && t0 < TQ) att_seg_span(a, b, t0, t_last + 1, &qmin, &qmax);

  for (int64_t kv0 = kbegin; kv0 < kend; kv0 += BC) {
    __syncthreads(); /* the previous tile is no longer read */
    att_stage16<D>(sK, KLD, nullptr, 0, a.k, b, g, kv0, BC, S);
    att_stage16<D>(nullptr, 0, sVt, VLD, a.v, b, g, kv0, BC, S);
    if (a.seg && threadIdx.x < BC) sSeg[threadIdx.x] = kv0 + threadIdx.x < S ? att_seg(a, b, kv0 + threadIdx.x) : 0;
    __syncthreads();
    if (a.seg) { /* no key of the tile shares a segment with the block's rows: nothing to add */
      int64_t kmin, kmax;
      att_seg_span_shared(sSeg, (int)(S - kv0 < BC ? S - kv0 : BC), &kmin, &kmax);
      if (!att_ranges_meet(qmin, qmax, kmin, kmax)) continue; /* uniform over the CTA */
    }

    float s[NT][4]; /* scores of rows gid, gid + 8 against the tile's keys */
#pragma unroll
    for (int n = 0; n < NT; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < NK; kk++) {
#pragma unroll
      for (int n = 0; n < NT; n++) {
        const uint16_t *kp = &sK[(n * 8 + gid) * KLD + kk * 16 + tig * 2];
        ops::mma(s[n], qf[kk], ld32(kp), ld32(kp + 8));
      }
    }
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < NT; n++) {
#pragma unroll
      for (int e = 0; e < 4; e++) {
        int r = e / 2, j = n * 8 + tig * 2 + (e & 1);
        bool vis = att_visible(tr[r], TQ, kv0 + j, S, a.off, a.causal, a.window) && (!a.seg || segq[r] == sSeg[j]);
        float x = vis ? s[n][e] * scale2 : -INFINITY;
        s[n][e] = x;
        mx[r] = fmaxf(mx[r], x);
      }
    }
    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; r++) { /* the row's max over the quad that holds it */
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      float m_new = fmaxf(m[r], mx[r]);
      alpha[r] = att_rescale_f32(m[r], m_new);
      m[r] = m_new;
      l[r] *= alpha[r];
    }
#pragma unroll
    for (int n = 0; n < NT; n++) {
#pragma unroll
      for (int e = 0; e < 4; e++) {
        float p = att_prob_f32(s[n][e], m[e / 2]);
        s[n][e] = p;
        l[e / 2] += p;
      }
    }
#pragma unroll
    for (int n = 0; n < ND; n++) {
      o[n][0] *= alpha[0], o[n][1] *= alpha[0];
      o[n][2] *= alpha[1], o[n][3] *= alpha[1];
    }
    /* O += P V: two adjacent n-tiles of P (C layout) are one k-step of A */
#pragma unroll
    for (int kk = 0; kk < BC / 16; kk++) {
      uint32_t pa[4] = {ops::pack(s[2 * kk][0], s[2 * kk][1]), ops::pack(s[2 * kk][2], s[2 * kk][3]),
                        ops::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]), ops::pack(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int n = 0; n < ND; n++) {
        const uint16_t *vp = &sVt[(n * 8 + gid) * VLD + kk * 16 + tig * 2];
        ops::mma(o[n], pa, ld32(vp), ld32(vp + 8));
      }
    }
  }

#pragma unroll
  for (int r = 0; r < 2; r++) {
    float lt = l[r];
    lt += __shfl_xor_sync(0xffffffffu, lt, 1);
    lt += __shfl_xor_sync(0xffffffffu, lt, 2);
    if (tr[r] >= TQ) continue;
    float inv = lt > 0 ? 1.f / lt : 0.f;
    uint16_t *orow = att_row<uint16_t>(a.out, b, tr[r], h);
#pragma unroll
    for (int n = 0; n < ND; n++) {
      uint32_t pair = (uint32_t)ops::to_bits(o[n][2 * r] * inv) | ((uint32_t)ops::to_bits(o[n][2 * r + 1] * inv) << 16);
      *reinterpret_cast<uint32_t *>(orow + n * 8 + tig * 2) = pair;
    }
    if (a.lse && tig == 0) a.lse[b * a.lse_sb + h * a.lse_sh + tr[r] * a.lse_st] = att_lse_f32(m[r], lt);
  }
}

/* ---- CUDA-core forward ----------------------------------------------------------------------- */

template <typename T, typename acc>
__global__ void __launch_bounds__(ATT_GEN_WARPS * 32) att_fwd_gen(const lt_cuda_att_args a, int64_t nblk, int bc) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int64_t D = a.D, ld = att_gen_ld(D), TQ = a.T, S = a.S;
  int64_t *sSeg = (int64_t *)smem; /* bc key segment ids */
  acc *sK = (acc *)(sSeg + ATT_GEN_BR + bc), *sV = sK + bc * ld, *sQ = sV + bc * ld;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t task = blockIdx.x, qb = att_query_block(task, nblk), bh = task / nblk;
  const int64_t h = bh % a.H, b = bh / a.H, g = h / a.group, t0 = qb * ATT_GEN_BR, t = t0 + warp;
  acc *q = sQ + warp * ld;
  if (t < TQ) {
    const T *qrow = att_row<const T>(a.q, b, t, h);
    for (int64_t d = lane; d < D; d += 32) q[d] = att_load<T, acc>(qrow, d);
  }
  const int64_t segq = t < TQ ? att_seg(a, b, t) : 0;
  const acc scale2 = (acc)(a.scale * ATT_LOG2E);
  acc m = -INFINITY, l = 0, o[ATT_GEN_MAX_D / 32];
#pragma unroll
  for (int i = 0; i < ATT_GEN_MAX_D / 32; i++) o[i] = 0;
  const int64_t t_last = (t0 + ATT_GEN_BR < TQ ? t0 + ATT_GEN_BR : TQ) - 1,
                kend = att_key_end(t_last, S, a.off, a.causal), kbegin = att_key_begin(t0, a.off, a.window, bc);

  for (int64_t kv0 = kbegin; kv0 < kend; kv0 += bc) {
    __syncthreads();
    att_stage_rows<T, acc>(sK, ld, a.k, b, g, kv0, bc, S, D);
    att_stage_rows<T, acc>(sV, ld, a.v, b, g, kv0, bc, S, D);
    if (a.seg)
      for (int i = threadIdx.x; i < bc; i += blockDim.x) sSeg[i] = kv0 + i < S ? att_seg(a, b, kv0 + i) : 0;
    __syncthreads();
    acc x = -INFINITY;
    if (lane < bc && att_visible(t, TQ, kv0 + lane, S, a.off, a.causal, a.window) && (!a.seg || sSeg[lane] == segq))
      x = att_dot(q, sK + lane * ld, D) * scale2;
    acc m_new = fmax(m, lt_warp_max(x)), alpha = att_rescale(m, m_new);
    acc p = att_prob(x, m_new);
    l = l * alpha + lt_warp_sum(p);
    m = m_new;
#pragma unroll
    for (int i = 0; i < ATT_GEN_MAX_D / 32; i++) o[i] *= alpha;
    for (int j = 0; j < bc; j++) {
      acc pj = __shfl_sync(0xffffffffu, p, j);
      const acc *vj = sV + j * ld;
#pragma unroll
      for (int i = 0; i < ATT_GEN_MAX_D / 32; i++)
        if (lane + 32 * i < D) o[i] += pj * vj[lane + 32 * i];
    }
  }
  if (t >= TQ) return; /* no barrier after this point */
  T *orow = att_row<T>(a.out, b, t, h);
  acc inv = l > 0 ? 1 / l : 0;
#pragma unroll
  for (int i = 0; i < ATT_GEN_MAX_D / 32; i++)
    if (lane + 32 * i < D) att_store<T, acc>(orow, lane + 32 * i, o[i] * inv);
  if (a.lse && lane == 0) a.lse[b * a.lse_sb + h * a.lse_sh + t * a.lse_st] = (float)att_lse(m, l);
}

/* ---- launch ------------------------------------------------------------------------------------ */

extern "C" int lt_cuda_attention_fwd_uses_mma(int dtype, int64_t D) {
  return (dtype == LT_BF16 || dtype == LT_F16) && (D == 64 || D == 128);
}

template <typename T, int D> static void launch_mma(const lt_cuda_att_args *a, int64_t nblk, cudaStream_t stream) {
  att_fwd_mma<T, D><<<(unsigned)(a->B * a->H * nblk), ATT_MMA_WARPS * 32, 0, stream>>>(*a, nblk);
}

template <typename T, typename acc> static void launch_gen(const lt_cuda_att_args *a, cudaStream_t stream) {
  int bc = att_gen_bc(a->D, sizeof(acc), 1);
  int64_t nblk = (a->T + ATT_GEN_BR - 1) / ATT_GEN_BR, smem = att_gen_smem(a->D, sizeof(acc), 1, bc);
  att_fwd_gen<T, acc><<<(unsigned)(a->B * a->H * nblk), ATT_GEN_WARPS * 32, (size_t)smem, stream>>>(*a, nblk, bc);
}

extern "C" int lt_cuda_attention_forward(const lt_cuda_att_args *a) {
  const char *op = "attention_forward";
  if (a->B * a->H * a->T == 0) return 0;
  if (a->D > ATT_GEN_MAX_D)
    return lt_errorf("%s: head dim %lld > %d is not implemented on cuda", op, (long long)a->D, ATT_GEN_MAX_D);
  int64_t rows = lt_cuda_attention_fwd_uses_mma(a->dtype, a->D) ? ATT_MMA_BR : ATT_GEN_BR;
  if (a->B * a->H * ((a->T + rows - 1) / rows) > INT32_MAX)
    return lt_errorf("%s: B * H * T = %lld rows is too many for one grid", op, (long long)(a->B * a->H * a->T));
  LT_TRY(lt_cuda_use_device(op, a->device));
  cudaStream_t stream = lt_cuda_compute_stream(a->device);
  if (lt_cuda_attention_fwd_uses_mma(a->dtype, a->D)) {
    int64_t nblk = (a->T + ATT_MMA_BR - 1) / ATT_MMA_BR;
    if (a->dtype == LT_BF16)
      a->D == 64 ? launch_mma<lt_bf16_bits, 64>(a, nblk, stream) : launch_mma<lt_bf16_bits, 128>(a, nblk, stream);
    else
      a->D == 64 ? launch_mma<lt_f16_bits, 64>(a, nblk, stream) : launch_mma<lt_f16_bits, 128>(a, nblk, stream);
  } else {
    switch (a->dtype) {
    case LT_F32: launch_gen<float, float>(a, stream); break;
    case LT_F64: launch_gen<double, double>(a, stream); break;
    case LT_BF16: launch_gen<lt_bf16_bits, float>(a, stream); break;
    case LT_F16: launch_gen<lt_f16_bits, float>(a, stream); break;
    default: return lt_errorf("%s: dtype %s is not supported on cuda", op, lt_dtype_name(a->dtype));
    }
  }
  return lt_cuda_check_launch(op, a->device);
}
