/* attention_backward.cu — attention backward on CUDA, FlashAttention-2 style, deterministic (no atomics).
 * Semantics: host/ops/attention.c; tile math: kernels/attention_tile.h. Three passes on the compute stream:
 *
 * 1. att_delta: delta[b, h, t] = dout[b, t, h, :] . out[b, t, h, :] (a warp per row).
 * 2. att_dq: dQ per (b, h, block of 8 query rows), a warp per row, looping over key tiles of
 *    bc <= 32 keys (K, V staged in shared memory, lane j takes key j): P = exp2(x2 - lse2) from
 *    the saved lse, dS = P (dP - delta), dQ = scale dS K. For f64 it first recomputes the row's lse
 *    in double with the forward's online softmax over the same tiles (the saved lse is f32, and
 *    the CPU op does the same) and writes it (log2 units) for pass 3.
 * 3. att_dkv: dK, dV per (b, kv head, tile of 8 * kpw keys), each warp kpw keys, looping over the
 *    group's query heads in order and, for each, over query tiles of bq <= 32 rows (q, dout, lse,
 *    delta staged; lane i takes row i): dV += P^T dO, dK += scale dS^T Q, summed in registers in a
 *    fixed order. Query tiles before the first row that sees the key tile (causal), and from the
 *    first row whose sliding window has passed it, are skipped.
 * These kernels compute in f32 (f64 for f64) on CUDA cores, within 48 KB of shared memory
 * (att_gen_bc, att_dkv_tiles), for any D <= 256. bf16/f16 with D 64 or 128 take the tensor-core
 * passes 2 and 3 of kernels/attention_backward_mma.cu instead (same structure, tiles of 64 x 32).
 */
#include "kernels/attention_tile.cuh"

/* ---- delta ------------------------------------------------------------------------------------ */

template <typename E, typename acc> __global__ void att_delta(const lt_cuda_att_args a, acc *delta) {
  const int lane = threadIdx.x % 32;
  const int64_t rows = a.B * a.H * a.T, nwarps = (int64_t)gridDim.x * (blockDim.x / 32);
  for (int64_t r = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32; r < rows; r += nwarps) {
    int64_t t = r % a.T, h = (r / a.T) % a.H, b = r / (a.T * a.H);
    const E *x = att_row<const E>(a.dout, b, t, h), *y = att_row<const E>(a.out, b, t, h);
    acc s = 0;
    for (int64_t d = lane; d < a.D; d += 32) s += att_load<E, acc>(x, d) * att_load<E, acc>(y, d);
    s = lt_warp_sum(s);
    if (lane == 0) delta[r] = s;
  }
}

/* ---- dQ ------------------------------------------------------------------------------------------ */

template <typename E, typename acc>
__global__ void __launch_bounds__(ATT_GEN_WARPS * 32)
    att_dq(const lt_cuda_att_args a, int64_t nblk, int bc, const acc *delta, double *lse2_out) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int64_t D = a.D, ld = att_gen_ld(D), TQ = a.T, S = a.S;
  int64_t *sSeg = (int64_t *)smem;
  acc *sK = (acc *)(sSeg + ATT_GEN_BR + bc), *sV = sK + bc * ld, *sQ = sV + bc * ld, *sdO = sQ + ATT_GEN_BR * ld;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t task = blockIdx.x, qb = att_query_block(task, nblk), bh = task / nblk;
  const int64_t h = bh % a.H, b = bh / a.H, g = h / a.group, t0 = qb * ATT_GEN_BR, t = t0 + warp;
  acc *q = sQ + warp * ld, *dO = sdO + warp * ld;
  if (t < TQ) {
    const E *qrow = att_row<const E>(a.q, b, t, h), *grow = att_row<const E>(a.dout, b, t, h);
    for (int64_t d = lane; d < D; d += 32) q[d] = att_load<E, acc>(qrow, d), dO[d] = att_load<E, acc>(grow, d);
  }
  const int64_t segq = t < TQ ? att_seg(a, b, t) : 0, row = (b * a.H + h) * TQ + t;
  const acc scale2 = (acc)(a.scale * ATT_LOG2E), delta_t = t < TQ ? delta[row] : (acc)0;
  const int64_t t_last = (t0 + ATT_GEN_BR < TQ ? t0 + ATT_GEN_BR : TQ) - 1,
                kend = att_key_end(t_last, S, a.off, a.causal), kbegin = att_key_begin(t0, a.off, a.window, bc);

  acc lse2 = -INFINITY;
  if (lse2_out) { /* f64: the row's lse again, in double, by the forward's online softmax */
    acc m = -INFINITY, l = 0;
    for (int64_t kv0 = kbegin; kv0 < kend; kv0 += bc) {
      __syncthreads();
      att_stage_rows<E, acc>(sK, ld, a.k, b, g, kv0, bc, S, D);
      if (a.seg)
        for (int i = threadIdx.x; i < bc; i += blockDim.x) sSeg[i] = kv0 + i < S ? att_seg(a, b, kv0 + i) : 0;
      __syncthreads();
      acc x = -INFINITY;
      if (lane < bc && att_visible(t, TQ, kv0 + lane, S, a.off, a.causal, a.window) && (!a.seg || sSeg[lane] == segq))
        x = att_dot(q, sK + lane * ld, D) * scale2;
      acc m_new = fmax(m, lt_warp_max(x));
      l = l * att_rescale(m, m_new) + lt_warp_sum(att_prob(x, m_new));
      m = m_new;
    }
    lse2 = (acc)att_lse2(m, l);
    if (t < TQ && lane == 0) lse2_out[row] = lse2;
  } else if (t < TQ) {
    lse2 = (acc)a.lse[b * a.lse_sb + h * a.lse_sh + t * a.lse_st] * (acc)ATT_LOG2E;
  }

  acc dq[ATT_GEN_MAX_D / 32];
#pragma unroll
  for (int i = 0; i < ATT_GEN_MAX_D / 32; i++) dq[i] = 0;
  for (int64_t kv0 = kbegin; kv0 < kend; kv0 += bc) {
    __syncthreads();
    att_stage_rows<E, acc>(sK, ld, a.k, b, g, kv0, bc, S, D);
    att_stage_rows<E, acc>(sV, ld, a.v, b, g, kv0, bc, S, D);
    if (a.seg)
      for (int i = threadIdx.x; i < bc; i += blockDim.x) sSeg[i] = kv0 + i < S ? att_seg(a, b, kv0 + i) : 0;
    __syncthreads();
    acc ds = 0;
    if (lane < bc && att_visible(t, TQ, kv0 + lane, S, a.off, a.causal, a.window) && (!a.seg || sSeg[lane] == segq)) {
      acc p = att_prob(att_dot(q, sK + lane * ld, D) * scale2, lse2);
      ds = att_dscore(p, att_dot(dO, sV + lane * ld, D), delta_t);
    }
    for (int j = 0; j < bc; j++) {
      acc dsj = __shfl_sync(0xffffffffu, ds, j);
      const acc *kj = sK + j * ld;
#pragma unroll
      for (int i = 0; i < ATT_GEN_MAX_D / 32; i++)
        if (lane + 32 * i < D) dq[i] += dsj * kj[lane + 32 * i];
    }
  }
  if (t >= TQ) return; /* no barrier after this point */
  E *out = att_row<E>(a.dq, b, t, h);
  const acc scale = (acc)a.scale;
#pragma unroll
  for (int i = 0; i < ATT_GEN_MAX_D / 32; i++)
    if (lane + 32 * i < D) att_store<E, acc>(out, lane + 32 * i, scale * dq[i]);
}

/* ---- dK, dV ---------------------------------------------------------------------------------------- */

template <typename E, typename acc>
__global__ void __launch_bounds__(ATT_GEN_WARPS * 32)
    att_dkv(const lt_cuda_att_args a, int64_t kblk, int kpw, int bq, const acc *delta, const double *lse2_in) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int64_t D = a.D, ld = att_gen_ld(D), TQ = a.T, S = a.S, bkv = (int64_t)ATT_GEN_WARPS * kpw;
  int64_t *sSegK = (int64_t *)smem, *sSegQ = sSegK + bkv;
  acc *sLse = (acc *)(sSegQ + bq), *sDelta = sLse + bq, *sK = sDelta + bq, *sV = sK + bkv * ld, *sQ = sV + bkv * ld,
      *sdO = sQ + bq * ld;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t task = blockIdx.x, kb = task % kblk, bg = task / kblk, g = bg % a.Hkv, b = bg / a.Hkv;
  const int64_t s0 = kb * bkv;
  att_stage_rows<E, acc>(sK, ld, a.k, b, g, s0, (int)bkv, S, D);
  att_stage_rows<E, acc>(sV, ld, a.v, b, g, s0, (int)bkv, S, D);
  if (a.seg)
    for (int i = threadIdx.x; i < bkv; i += blockDim.x) sSegK[i] = s0 + i < S ? att_seg(a, b, s0 + i) : 0;
  const acc scale2 = (acc)(a.scale * ATT_LOG2E);
  acc dk[ATT_DKV_MAX_KPW][ATT_GEN_MAX_D / 32], dv[ATT_DKV_MAX_KPW][ATT_GEN_MAX_D / 32];
#pragma unroll
  for (int k = 0; k < ATT_DKV_MAX_KPW; k++)
#pragma unroll
    for (int i = 0; i < ATT_GEN_MAX_D / 32; i++) dk[k][i] = dv[k][i] = 0;
  const int64_t qbegin = att_query_begin(s0, a.off, a.causal),
                qend = att_query_end((s0 + bkv < S ? s0 + bkv : S) - 1, TQ, a.off, a.window);

  for (int64_t h = g * a.group; h < (g + 1) * a.group; h++) {
    for (int64_t tq = qbegin; tq < qend; tq += bq) {
      __syncthreads(); /* the previous query tile is no longer read (and K, V are staged) */
      att_stage_rows<E, acc>(sQ, ld, a.q, b, h, tq, bq, TQ, D);
      att_stage_rows<E, acc>(sdO, ld, a.dout, b, h, tq, bq, TQ, D);
      for (int i = threadIdx.x; i < bq; i += blockDim.x) {
        int64_t t = tq + i, row = (b * a.H + h) * TQ + t;
        bool in = t < TQ;
        sLse[i] = !in       ? (acc)-INFINITY
                  : lse2_in ? (acc)lse2_in[row]
                            : (acc)a.lse[b * a.lse_sb + h * a.lse_sh + t * a.lse_st] * (acc)ATT_LOG2E;
        sDelta[i] = in ? delta[row] : (acc)0;
        sSegQ[i] = in ? att_seg(a, b, t) : 0;
      }
      __syncthreads();
#pragma unroll
      for (int k = 0; k < ATT_DKV_MAX_KPW; k++) {
        if (k >= kpw) break; /* kpw is uniform over the CTA */
        const int j = warp + ATT_GEN_WARPS * k;
        const acc *kj = sK + j * ld, *vj = sV + j * ld;
        acc p = 0, ds = 0;
        if (lane < bq && att_visible(tq + lane, TQ, s0 + j, S, a.off, a.causal, a.window) &&
            (!a.seg || sSegQ[lane] == sSegK[j])) {
          p = att_prob(att_dot(sQ + lane * ld, kj, D) * scale2, sLse[lane]);
          ds = att_dscore(p, att_dot(sdO + lane * ld, vj, D), sDelta[lane]);
        }
        for (int r = 0; r < bq; r++) {
          acc pr = __shfl_sync(0xffffffffu, p, r), dsr = __shfl_sync(0xffffffffu, ds, r);
          const acc *qr = sQ + r * ld, *gr = sdO + r * ld;
#pragma unroll
          for (int i = 0; i < ATT_GEN_MAX_D / 32; i++) {
            int64_t d = lane + 32 * i;
            if (d < D) {
              dv[k][i] += pr * gr[d];
              dk[k][i] += dsr * qr[d];
            }
          }
        }
      }
    }
  }
  const acc scale = (acc)a.scale;
#pragma unroll
  for (int k = 0; k < ATT_DKV_MAX_KPW; k++) {
    int64_t s = s0 + warp + ATT_GEN_WARPS * k;
    if (k >= kpw || s >= S) break;
    E *dkrow = att_row<E>(a.dk, b, s, g), *dvrow = att_row<E>(a.dv, b, s, g);
#pragma unroll
    for (int i = 0; i < ATT_GEN_MAX_D / 32; i++)
      if (lane + 32 * i < D) {
        att_store<E, acc>(dkrow, lane + 32 * i, scale * dk[k][i]);
        att_store<E, acc>(dvrow, lane + 32 * i, dv[k][i]);
      }
  }
}

/* ---- launch ------------------------------------------------------------------------------------------ */

template <typename E, typename acc> static int launch_backward(const lt_cuda_att_args *a, cudaStream_t stream) {
  acc *delta = (acc *)a->delta;
  double *lse2 = std::is_same<acc, double>::value ? a->lse2 : nullptr;
  int64_t rows = a->B * a->H * a->T;
  if (rows > 0) att_delta<E, acc><<<lt_cuda_blocks(a->device, rows * 32), 256, 0, stream>>>(*a, delta);
  if (lt_cuda_attention_bwd_uses_mma(a->dtype, a->D)) return att_backward_mma(a, stream, (const float *)delta);
  if (rows > 0) { /* dQ of rows that see no key (S == 0) is zeroed by att_dq too */
    int bc = att_gen_bc(a->D, sizeof(acc), 2);
    int64_t nblk = (a->T + ATT_GEN_BR - 1) / ATT_GEN_BR, smem = att_gen_smem(a->D, sizeof(acc), 2, bc);
    att_dq<E, acc>
        <<<(unsigned)(a->B * a->H * nblk), ATT_GEN_WARPS * 32, (size_t)smem, stream>>>(*a, nblk, bc, delta, lse2);
  }
  if (a->B * a->Hkv * a->S == 0) return 0;
  int kpw, bq;
  att_dkv_tiles(a->D, sizeof(acc), &kpw, &bq);
  int64_t bkv = (int64_t)ATT_GEN_WARPS * kpw, kblk = (a->S + bkv - 1) / bkv;
  att_dkv<E, acc><<<(unsigned)(a->B * a->Hkv * kblk), ATT_GEN_WARPS * 32,
                    (size_t)att_dkv_smem(a->D, sizeof(acc), kpw, bq), stream>>>(*a, kblk, kpw, bq, delta, lse2);
  return 0;
}

extern "C" int lt_cuda_attention_backward(const lt_cuda_att_args *a) {
  const char *op = "attention_backward";
  if (a->D > ATT_GEN_MAX_D)
    return lt_errorf("%s: head dim %lld > %d is not implemented on cuda", op, (long long)a->D, ATT_GEN_MAX_D);
  if (a->B * a->H * ((a->T + ATT_GEN_BR - 1) / ATT_GEN_BR) > INT32_MAX || a->B * a->Hkv * a->S > INT32_MAX)
    return lt_errorf("%s: B * H * T = %lld rows is too many for one grid", op, (long long)(a->B * a->H * a->T));
  LT_TRY(lt_cuda_use_device(op, a->device));
  cudaStream_t stream = lt_cuda_compute_stream(a->device);
  int rc;
  switch (a->dtype) {
  case LT_F32: rc = launch_backward<float, float>(a, stream); break;
  case LT_F64: rc = launch_backward<double, double>(a, stream); break;
  case LT_BF16: rc = launch_backward<lt_bf16_bits, float>(a, stream); break;
  case LT_F16: rc = launch_backward<lt_f16_bits, float>(a, stream); break;
  default: return lt_errorf("%s: dtype %s is not supported on cuda", op, lt_dtype_name(a->dtype));
  }
  if (rc) return rc;
  return lt_cuda_check_launch(op, a->device);
}
