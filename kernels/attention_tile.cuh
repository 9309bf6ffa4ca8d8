/* attention_tile.cuh — device helpers of the attention kernels (kernels/attention_forward.cu, kernels/attention_backward.cu):
 * element loads and stores in the compute type, segment ids, and the online-softmax math of
 * kernels/attention_tile.h overloaded by compute type (float for f32/bf16/f16, double for f64). */
#ifndef LUTRA_KERNELS_ATTENTION_TILE_CUH
#define LUTRA_KERNELS_ATTENTION_TILE_CUH
#include "kernels/common.cuh"
#include <cuda_bf16.h>
#include <cuda_fp16.h>
extern "C" {
#include "kernels/attention_tile.h"
#include "kernels/attention.h"
}

/* Element of T as the compute type, and back (rounding as the CPU op's final copy does). */
template <typename T, typename acc> __device__ inline acc att_load(const T *p, int64_t i) { return (acc)p[i]; }
template <> __device__ inline float att_load<lt_bf16_bits, float>(const lt_bf16_bits *p, int64_t i) {
  return lt_bf16_to_f32(p[i].bits);
}
template <> __device__ inline float att_load<lt_f16_bits, float>(const lt_f16_bits *p, int64_t i) {
  return lt_f16_to_f32(p[i].bits);
}
template <typename T, typename acc> __device__ inline void att_store(T *p, int64_t i, acc x) { p[i] = (T)x; }
template <> __device__ inline void att_store<lt_bf16_bits, float>(lt_bf16_bits *p, int64_t i, float x) {
  p[i].bits = lt_f32_to_bf16(x);
}
template <> __device__ inline void att_store<lt_f16_bits, float>(lt_f16_bits *p, int64_t i, float x) {
  p[i].bits = lt_f32_to_f16(x);
}

/* Element [b, t, h, 0] of an operand. */
template <typename T> __device__ inline T *att_row(const lt_cuda_att_operand &o, int64_t b, int64_t t, int64_t h) {
  return (T *)o.data + b * o.sb + t * o.st + h * o.sh;
}

/* Segment id of (b, t); 0 when there are none (then every comparison is equal). */
__device__ inline int64_t att_seg(const lt_cuda_att_args &a, int64_t b, int64_t t) {
  if (!a.seg) return 0;
  int64_t i = b * a.seg_sb + t * a.seg_st;
  return a.seg_dtype == LT_I32 ? (int64_t)((const int32_t *)a.seg)[i] : ((const int64_t *)a.seg)[i];
}

/* The span [lo, hi] of the segment ids of rows [r0, r1) (r0 < r1) of batch b, read from memory,
 * or of n ids staged in shared memory (n >= 1). Every thread of the CTA gets the same. */
__device__ inline void att_seg_span(const lt_cuda_att_args &a, int64_t b, int64_t r0, int64_t r1, int64_t *lo,
                                    int64_t *hi) {
  int64_t mn = INT64_MAX, mx = INT64_MIN;
  for (int64_t r = r0; r < r1; r++) {
    int64_t s = att_seg(a, b, r);
    mn = s < mn ? s : mn;
    mx = s > mx ? s : mx;
  }
  *lo = mn, *hi = mx;
}
__device__ inline void att_seg_span_shared(const int64_t *seg, int n, int64_t *lo, int64_t *hi) {
  int64_t mn = INT64_MAX, mx = INT64_MIN;
  for (int i = 0; i < n; i++) {
    mn = seg[i] < mn ? seg[i] : mn;
    mx = seg[i] > mx ? seg[i] : mx;
  }
  *lo = mn, *hi = mx;
}

__device__ inline float att_rescale(float m_old, float m_new) { return att_rescale_f32(m_old, m_new); }
__device__ inline double att_rescale(double m_old, double m_new) { return att_rescale_f64(m_old, m_new); }
__device__ inline float att_prob(float x2, float m) { return att_prob_f32(x2, m); }
__device__ inline double att_prob(double x2, double m) { return att_prob_f64(x2, m); }
__device__ inline float att_lse(float m, float l) { return att_lse_f32(m, l); }
__device__ inline double att_lse(double m, double l) { return att_lse_f64(m, l); }
__device__ inline float att_dscore(float p, float dp, float delta) { return att_dscore_f32(p, dp, delta); }
__device__ inline double att_dscore(double p, double dp, double delta) { return att_dscore_f64(p, dp, delta); }
/* lse in log2 units of a finished row (the backward's form), -inf when it saw no key. */
__device__ inline double att_lse2(double m, double l) { return l > 0 ? m + log2(l) : -INFINITY; }

/* Stages rows [r0, r0 + n) of an operand's head h in batch b, converted to acc, into
 * dst (n rows of ld); rows at or past `limit` get zeros. The whole CTA calls it. */
template <typename T, typename acc>
__device__ inline void att_stage_rows(acc *dst, int64_t ld, const lt_cuda_att_operand &o, int64_t b, int64_t h,
                                      int64_t r0, int n, int64_t limit, int64_t D) {
  const T *base = (const T *)o.data + b * o.sb + h * o.sh;
  for (int64_t i = threadIdx.x; i < (int64_t)n * D; i += blockDim.x) {
    int64_t r = i / D, d = i % D;
    dst[r * ld + d] = r0 + r < limit ? att_load<T, acc>(base, (r0 + r) * o.st + d) : (acc)0;
  }
}

/* Dot product of two staged rows of length D. */
template <typename acc> __device__ inline acc att_dot(const acc *x, const acc *y, int64_t D) {
  acc s = 0;
  for (int64_t d = 0; d < D; d++) s += x[d] * y[d];
  return s;
}

/* ---- tensor cores: mma.sync m16n8k16 with f32 accumulation, for bf16 and f16 ---------------- */

template <typename E> struct mma_ops;
template <> struct mma_ops<lt_bf16_bits> {
  static __device__ inline uint32_t pack(float lo, float hi) { /* lo in the low half, as in memory */
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    uint32_t u;
    memcpy(&u, &v, 4);
    return u;
  }
  static __device__ inline uint16_t to_bits(float x) { return lt_f32_to_bf16(x); }
  /* c (16 x 8, f32) += a (16 x 16, row) b (16 x 8, col) */
  static __device__ inline void mma(float *c, const uint32_t *a, uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};
template <> struct mma_ops<lt_f16_bits> {
  static __device__ inline uint32_t pack(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    uint32_t u;
    memcpy(&u, &v, 4);
    return u;
  }
  static __device__ inline uint16_t to_bits(float x) { return lt_f32_to_f16(x); }
  static __device__ inline void mma(float *c, const uint32_t *a, uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

static __device__ inline uint32_t ld32(const uint16_t *p) { return *reinterpret_cast<const uint32_t *>(p); }

/* Stages rows [r0, r0 + n) of an operand's head h in batch b (16-bit elements, D a multiple of 8,
 * rows 16-byte aligned) into dst (row-major, row stride ld) when dst is not NULL, and into dst_t
 * transposed (dst_t[d * ld_t + r]) when dst_t is not NULL; rows at or past `limit` are zeros.
 * The whole CTA calls it. */
template <int D>
__device__ inline void att_stage16(uint16_t *dst, int ld, uint16_t *dst_t, int ld_t, const lt_cuda_att_operand &o,
                                   int64_t b, int64_t h, int64_t r0, int n, int64_t limit) {
  const uint16_t *base = (const uint16_t *)o.data + b * o.sb + h * o.sh;
  /* Row-major only: neighbouring threads read neighbouring 16-byte chunks of a row (coalesced).
   * Transposed: neighbouring threads take neighbouring rows of one chunk, so that a warp's 2-byte
   * stores to dst_t fall in distinct 32-bit words of distinct banks (a warp spanning a row's chunks
   * would hit one bank 8 times: the transposed rows are a multiple of 32 banks apart). */
  const bool by_rows = dst_t != nullptr;
  for (int i = threadIdx.x; i < n * (D / 8); i += blockDim.x) {
    int r = by_rows ? i % n : i / (D / 8), c = by_rows ? i / n : i % (D / 8);
    uint4 x = make_uint4(0, 0, 0, 0);
    if (r0 + r < limit) x = *reinterpret_cast<const uint4 *>(base + (r0 + r) * o.st + c * 8);
    if (dst) *reinterpret_cast<uint4 *>(&dst[r * ld + c * 8]) = x;
    if (dst_t) {
      uint16_t e[8];
      memcpy(e, &x, 16);
#pragma unroll
      for (int k = 0; k < 8; k++) dst_t[(c * 8 + k) * ld_t + r] = e[k];
    }
  }
}

/* Passes 2 and 3 of the backward on tensor cores (kernels/attention_backward_mma.cu), for the args that
 * lt_cuda_attention_bwd_uses_mma accepts; delta (B, H, T) f32 is already queued. */
int att_backward_mma(const lt_cuda_att_args *a, cudaStream_t stream, const float *delta);

#endif
