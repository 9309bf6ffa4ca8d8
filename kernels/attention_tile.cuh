/* attention_tile.cuh — device helpers of the attention kernels (attention_fwd.cu, attention_bwd.cu):
 * element loads and stores in the compute type, segment ids, and the online-softmax math of
 * host/attention_tile.h overloaded by compute type (float for f32/bf16/f16, double for f64). */
#ifndef LUTRA_KERNELS_ATTENTION_TILE_CUH
#define LUTRA_KERNELS_ATTENTION_TILE_CUH
#include "common.cuh"
extern "C" {
#include "attention_tile.h"
#include "cuda_attention.h"
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

#endif
