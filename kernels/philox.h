/* philox.h — the counter-based generator and its bits -> value transforms, compiled for both
 * sides (LT_HOST_DEVICE): host/ops/random.c and kernels/random.cu include this one definition, so the
 * GPU draws bit-identical words and values for the same (seed, offset, element index).
 * host/ops/random.c documents the recipe; these are its formulas, one element at a time.
 *
 * Only exact operations appear here (integer arithmetic, the correctly rounded double
 * +, *, fma, sqrt and conversions), with one exception: the normal's log and cos, which are
 * libm's on the CPU and libdevice's on the GPU (both faithfully rounded, not always equal). */
#ifndef LUTRA_PHILOX_H
#define LUTRA_PHILOX_H
#include <math.h>
#include <stdint.h>

#ifndef LT_HOST_DEVICE /* the same definition as host/core/internal.h's */
#ifdef __CUDACC__
#define LT_HOST_DEVICE __host__ __device__
#else
#define LT_HOST_DEVICE
#endif
#endif

enum { LT_PHILOX_M0 = 0xD2511F53u, LT_PHILOX_M1 = 0xCD9E8D57u, LT_PHILOX_W0 = 0x9E3779B9u, LT_PHILOX_W1 = 0xBB67AE85u };

/* Philox4x32-10 (Random123) on a full 4-word counter and 2-word key. */
LT_HOST_DEVICE static inline void lt_philox4x32_10(const uint32_t ctr_in[4], const uint32_t key_in[2],
                                                   uint32_t out[4]) {
  uint32_t c0 = ctr_in[0], c1 = ctr_in[1], c2 = ctr_in[2], c3 = ctr_in[3], k0 = key_in[0], k1 = key_in[1];
  for (int round = 0; round < 10; round++) {
    uint64_t p0 = (uint64_t)LT_PHILOX_M0 * c0, p1 = (uint64_t)LT_PHILOX_M1 * c2;
    uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
    c0 = n0;
    c1 = (uint32_t)p1;
    c2 = n2;
    c3 = (uint32_t)p0;
    k0 += LT_PHILOX_W0;
    k1 += LT_PHILOX_W1;
  }
  out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

/* The two words an element uses: counter (low32(c), high32(c), 0, 0) under key (low32(seed),
 * high32(seed)). */
LT_HOST_DEVICE static inline void lt_philox_draw(const uint32_t key[2], uint64_t c, uint32_t *w0, uint32_t *w1) {
  uint32_t ctr[4] = {(uint32_t)c, (uint32_t)(c >> 32), 0, 0}, w[4];
  lt_philox4x32_10(ctr, key, w);
  *w0 = w[0];
  *w1 = w[1];
}

/* uniform: the integer draw k (24 bits for f32/bf16/f16 outs, 53 for f64) and its value
 * fma(hi - lo, k 2^-bits, lo) in double, or lo from first_top on (the draws whose rounded value
 * would reach hi; host/ops/random.c finds first_top by bisection). The conversions of k are exact;
 * the 24-bit one goes through int32 so that CPU loops over it vectorise. */
LT_HOST_DEVICE static inline uint32_t lt_philox_uniform_k24(uint32_t w0) { return w0 >> 8; }
LT_HOST_DEVICE static inline uint64_t lt_philox_uniform_k53(uint32_t w0, uint32_t w1) {
  return (((uint64_t)w1 << 32) | w0) >> 11;
}
LT_HOST_DEVICE static inline double lt_philox_uniform24_value(uint32_t k, double lo, double span, uint64_t first_top) {
  double x = fma(span, (double)(int32_t)k * 0x1p-24, lo);
  return k >= first_top ? lo : x;
}
LT_HOST_DEVICE static inline double lt_philox_uniform53_value(uint64_t k, double lo, double span, uint64_t first_top) {
  double x = fma(span, (double)(int64_t)k * 0x1p-53, lo);
  return k >= first_top ? lo : x;
}

/* normal: Box-Muller in double, u1 in (0, 1] (never log(0)), u2 in [0, 1). */
LT_HOST_DEVICE static inline double lt_philox_normal_value(uint32_t w0, uint32_t w1, double mean, double std) {
  double u1 = ((double)w0 + 1.0) * 0x1p-32, u2 = (double)w1 * 0x1p-32;
  return fma(std, sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2), mean);
}

/* rand_int: lo + high64(x * range), x = (w1 << 32 | w0) (Lemire's multiply-shift). */
LT_HOST_DEVICE static inline int64_t lt_philox_int_value(uint32_t w0, uint32_t w1, int64_t lo, uint64_t range) {
  uint64_t x = ((uint64_t)w1 << 32) | w0;
#ifdef __CUDA_ARCH__
  uint64_t hi = __umul64hi(x, range);
#else
  uint64_t hi = (uint64_t)(((unsigned __int128)x * range) >> 64);
#endif
  return (int64_t)((uint64_t)lo + hi);
}

/* bernoulli: 1 when (w0 >> 8) * 2^-24 < p, i.e. (w0 >> 8) < below = ceil(p 2^24). */
LT_HOST_DEVICE static inline int64_t lt_philox_bernoulli_value(uint32_t w0, uint32_t below) {
  return (w0 >> 8) < below;
}

#endif
