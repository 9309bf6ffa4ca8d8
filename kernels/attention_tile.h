/* attention_tile.h — the tile geometry and online-softmax math of the CUDA attention kernels
 * (kernels/attention_forward.cu, kernels/attention_backward.cu), shared with their CPU emulation
 * (tests/c/test_attention_tiles.c) so that the algorithm the kernels run is tested on a machine
 * without a GPU. Plain C (LT_HOST_DEVICE makes it __host__ __device__ under nvcc).
 *
 * Semantics are host/ops/attention.c's: query t of T sees key s of S when s < S, and
 * (!causal || s <= t + off) with off = S - T, with a sliding window W > 0 t + off - s < W, and
 * with segment ids seg[t] == seg[s].
 * Scores are kept in log2 units (x2 = scale * log2(e) * q.k) so that exp is one exp2; the
 * online softmax keeps per row a running max m (log2 units) and a running sum l of exp2(x2 - m),
 * rescaling both and the output accumulator by exp2(m_old - m_new) when the max grows. A row
 * that saw no key ends with m = -inf, l = 0: out 0 and lse -inf, as the CPU op.
 */
#ifndef LUTRA_ATTENTION_TILE_H
#define LUTRA_ATTENTION_TILE_H
#include "core/internal.h"
#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#define ATT_LOG2E 1.4426950408889634074
#define ATT_LN2 0.69314718055994530942

enum {
  /* tensor-core forward (bf16/f16, D 64 or 128): 4 warps of 16 query rows, key tiles of 64 */
  ATT_MMA_BR = 64,
  ATT_MMA_BC = 64,
  ATT_MMA_WARPS = 4,
  /* CUDA-core kernels (every dtype, D <= 256): 8 warps; forward and dQ give one query row to
   * each warp and one key of a tile to each lane (tiles of at most 32 keys); dK/dV give each
   * warp ATT_DKV_KPW keys and one query row of a tile to each lane (tiles of at most 32 rows) */
  ATT_GEN_WARPS = 8,
  ATT_GEN_BR = 8,
  ATT_GEN_MAX_BC = 32,
  ATT_DKV_MAX_KPW = 2,
  ATT_GEN_MAX_D = 256,
  ATT_SMEM_BUDGET = 48 * 1024, /* bytes of shared memory a CUDA-core CTA may use (no opt-in) */
  /* tensor-core backward (bf16/f16, D 64 or 128), 4 warps of 16 rows: dQ by blocks of 64 query
   * rows over key tiles of 32; dK, dV by tiles of 64 keys over query tiles of 32 */
  ATT_BWD_MMA_BR = 64,
  ATT_BWD_MMA_BC = 32,
  ATT_BWD_MMA_BKV = 64,
  ATT_BWD_MMA_BQ = 32,
};

/* ---- tile geometry ------------------------------------------------------------------------ */

/* Keys [0, end) that any query row <= t_last may see: key tiles from end on are skipped. */
LT_HOST_DEVICE static inline int64_t att_key_end(int64_t t_last, int64_t S, int64_t off, int causal) {
  if (!causal) return S;
  int64_t e = t_last + off + 1;
  return e < 0 ? 0 : (e > S ? S : e);
}

/* The first key that any query row >= t_first may see under a window (0 without one), rounded
 * down to a multiple of `tile`: key tiles before it are skipped. */
LT_HOST_DEVICE static inline int64_t att_key_begin(int64_t t_first, int64_t off, int64_t window, int64_t tile) {
  if (window <= 0) return 0;
  int64_t s = t_first + off - window + 1;
  return s <= 0 ? 0 : s / tile * tile;
}

/* The first query that may see key s0 (or any later key): query tiles before it are skipped. */
LT_HOST_DEVICE static inline int64_t att_query_begin(int64_t s0, int64_t off, int causal) {
  if (!causal) return 0;
  int64_t t = s0 - off;
  return t < 0 ? 0 : t;
}

/* Queries [.., end) that may see key s_last (or any earlier key) under a window (T without
 * one): query tiles from end on are skipped. */
LT_HOST_DEVICE static inline int64_t att_query_end(int64_t s_last, int64_t T, int64_t off, int64_t window) {
  if (window <= 0) return T;
  int64_t e = s_last - off + window;
  return e < 0 ? 0 : (e > T ? T : e);
}

/* Query t sees key s (segments apart: the caller compares ids when there are any). */
LT_HOST_DEVICE static inline bool att_visible(int64_t t, int64_t T, int64_t s, int64_t S, int64_t off, int causal,
                                              int64_t window) {
  return t < T && s < S && (!causal || s <= t + off) && (window <= 0 || t + off - s < window);
}

/* Segment ids: a key tile whose ids span [kmin, kmax] is skipped by a query tile whose ids span
 * [qmin, qmax] when the two ranges do not meet (no id in common; sorted ids of packed documents
 * leave most tiles off the diagonal blocks). Used by the tensor-core kernels. */
LT_HOST_DEVICE static inline bool att_ranges_meet(int64_t qmin, int64_t qmax, int64_t kmin, int64_t kmax) {
  return !(qmax < kmin || kmax < qmin);
}

/* Forward CTAs take query blocks from the last (the longest under a causal mask) to the first,
 * so that the heavy blocks start first. */
LT_HOST_DEVICE static inline int64_t att_query_block(int64_t task, int64_t nblk) { return nblk - 1 - task % nblk; }

/* Row stride (elements) of a staged (rows, D) tile in a CUDA-core kernel: D + 1 so that lanes
 * reading the same column of different rows fall in different banks. */
LT_HOST_DEVICE static inline int64_t att_gen_ld(int64_t D) { return D + 1; }

/* Keys per tile of the CUDA-core forward and dQ kernels: the largest <= 32 whose shared memory,
 * K and V tiles plus ATT_GEN_BR rows of q (forward) or q and dout (dQ), plus int64 segment ids,
 * fits ATT_SMEM_BUDGET. rows_q is 1 (forward) or 2 (dQ). At least 1 for D <= 256, esize <= 8. */
static inline int att_gen_bc(int64_t D, int esize, int rows_q) {
  int64_t row = att_gen_ld(D) * esize, fixed = (int64_t)rows_q * ATT_GEN_BR * row + ATT_GEN_BR * 8;
  int64_t bc = (ATT_SMEM_BUDGET - fixed) / (2 * row + 8);
  return (int)(bc > (int64_t)ATT_GEN_MAX_BC ? (int64_t)ATT_GEN_MAX_BC : bc < 1 ? 1 : bc);
}
static inline int64_t att_gen_smem(int64_t D, int esize, int rows_q, int bc) {
  return (2 * (int64_t)bc + (int64_t)rows_q * ATT_GEN_BR) * att_gen_ld(D) * esize + (ATT_GEN_BR + bc) * 8;
}

/* dK/dV kernel tiles: keys per warp (2, or 1 when D is large) and query rows per tile (<= 32)
 * so that K, V (ATT_GEN_WARPS * kpw rows) and q, dout (bq rows), plus per-row lse, delta and
 * segment ids (8 bytes each) and the keys' segment ids, fit ATT_SMEM_BUDGET. */
static inline void att_dkv_tiles(int64_t D, int esize, int *kpw, int *bq) {
  int64_t row = att_gen_ld(D) * esize;
  for (int k = ATT_DKV_MAX_KPW; k >= 1; k--) {
    int64_t bkv = (int64_t)ATT_GEN_WARPS * k, fixed = 2 * bkv * row + bkv * 8;
    int64_t q = (ATT_SMEM_BUDGET - fixed) / (2 * row + 24);
    if (q >= 8 || k == 1) {
      *kpw = k;
      *bq = (int)(q > 32 ? 32 : q < 1 ? 1 : q);
      return;
    }
  }
}
static inline int64_t att_dkv_smem(int64_t D, int esize, int kpw, int bq) {
  int64_t bkv = (int64_t)ATT_GEN_WARPS * kpw;
  return (2 * bkv + 2 * (int64_t)bq) * att_gen_ld(D) * esize + bq * 24 + bkv * 8;
}

/* Shared memory of the tensor-core dK/dV kernel: K and V tiles (64 x (D + 8)), q and dout tiles
 * row-major (32 x (D + 8)) and transposed (D x (32 + 8)), 16-bit; per query row lse, delta (f32)
 * and segment id (int64); per key a segment id. */
static inline int64_t att_dkv_mma_smem(int64_t D) {
  return 2 * (int64_t)ATT_BWD_MMA_BKV * (D + 8) * 2 + 2 * (int64_t)ATT_BWD_MMA_BQ * (D + 8) * 2 +
         2 * D * (ATT_BWD_MMA_BQ + 8) * 2 + ATT_BWD_MMA_BQ * 16 + ATT_BWD_MMA_BKV * 8;
}

/* ---- the online softmax, in float (f32, bf16, f16) and in double (f64) ---------------------- */

/* Factor for what was accumulated under max m_old once the max is m_new (>= m_old): 0 while
 * nothing was (m_old = -inf), which also keeps -inf - -inf (NaN) out. */
LT_HOST_DEVICE static inline float att_rescale_f32(float m_old, float m_new) {
  return m_old == -INFINITY ? 0.f : exp2f(m_old - m_new);
}
/* exp2(x2 - m): a masked score is x2 = -inf (0); a row whose max is still -inf has nothing. */
LT_HOST_DEVICE static inline float att_prob_f32(float x2, float m) { return m == -INFINITY ? 0.f : exp2f(x2 - m); }
/* The natural-log lse of a finished row, -inf when it saw no key. */
LT_HOST_DEVICE static inline float att_lse_f32(float m, float l) {
  return l > 0 ? (m + log2f(l)) * (float)ATT_LN2 : -INFINITY;
}
/* dS = P * (dP - delta), delta = dout . out of the row. */
LT_HOST_DEVICE static inline float att_dscore_f32(float p, float dp, float delta) { return p * (dp - delta); }

LT_HOST_DEVICE static inline double att_rescale_f64(double m_old, double m_new) {
  return m_old == -INFINITY ? 0. : exp2(m_old - m_new);
}
LT_HOST_DEVICE static inline double att_prob_f64(double x2, double m) { return m == -INFINITY ? 0. : exp2(x2 - m); }
LT_HOST_DEVICE static inline double att_lse_f64(double m, double l) {
  return l > 0 ? (m + log2(l)) * ATT_LN2 : -INFINITY;
}
LT_HOST_DEVICE static inline double att_dscore_f64(double p, double dp, double delta) { return p * (dp - delta); }

#endif
