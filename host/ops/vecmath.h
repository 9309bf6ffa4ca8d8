/* vecmath.h — f32 exp in plain arithmetic, so that loops calling it vectorise (glibc's expf is
 * a scalar call without -ffast-math).
 *
 * One Cephes expf core: x = n ln2 + r with |r| <= ln2/2 (n rounded by the 1.5 * 2^23 trick, ln2
 * in two parts), a degree-6 polynomial for e^r, 2^n built in the exponent bits. About 1.5 ulp
 * from exp where the result is normal. The variants differ only at the edges, each named for
 * what its callers rely on:
 *   lt_exp_f32        whole range: overflow to inf, gradual underflow to 0, NaN kept (unary ops);
 *   lt_exp_nonpos_f32 x <= 0 only: 0 below -87 (so -inf gives 0) and 0 for NaN, saving the exp
 *                     loop a blend (softmax rows, x - max, whose callers deal with NaN rows apart);
 *   lt_exp_flush_f32  the same, with x above 88 taken as 88, for x <= 0 up to rounding or a
 *                     caller-supplied lse (cross-entropy rows). Both clamp with float compares:
 *                     callers need -fno-trapping-math (GCC pragma before the include) to vectorise;
 *   lt_exp_clamp_f32  [-87, 88]: x below -87 gives exp(-87) ~ 1.6e-38, NaN kept; clamps compare
 *                     the bits as integers, so it vectorises under -ftrapping-math (attention). */
#ifndef LUTRA_VECMATH_H
#define LUTRA_VECMATH_H

#include <stdint.h>
#include <string.h>

static inline float lt_bits_to_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static inline uint32_t lt_f32_to_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

/* 1.5 * 2^23: x + it rounds x to an integer held in the low mantissa bits, |x| < 2^22 */
#define LT_EXP_ROUND_MAGIC 12582912.0f

/* n = round(x / ln 2) as a float; x must be finite and clamped */
static inline float lt_exp_round_n_f32(float x) {
  return (x * 1.44269504088896341f + LT_EXP_ROUND_MAGIC) - LT_EXP_ROUND_MAGIC;
}

/* r = x - n ln 2, ln 2 in two parts so that n * 0.693359375 is exact */
static inline float lt_exp_reduce_f32(float x, float n) { return x - n * 0.693359375f + n * 2.12194440e-4f; }

/* e^r for |r| <= ln2/2 (Cephes expf polynomial) */
static inline float lt_exp_poly_f32(float r) {
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  return p * r * r + r + 1.0f;
}

/* 2^n for integral n in [-126, 127] */
static inline float lt_exp2i_f32(float n) { return lt_bits_to_f32((uint32_t)((int32_t)n + 127) << 23); }

/* exp over the whole range: overflow to inf, gradual underflow to 0, NaN kept. */
static inline float lt_exp_f32(float x) {
  float xc = x > 89.0f ? 89.0f : x; /* NaN passes through both */
  xc = xc < -104.0f ? -104.0f : xc;
  /* n's bits hold n as an integer (no float to int conversion, which would be undefined for NaN) */
  float t = xc * 1.44269504088896341f + LT_EXP_ROUND_MAGIC, n = t - LT_EXP_ROUND_MAGIC;
  int32_t k = (int32_t)(lt_f32_to_bits(t) - 0x4B400000u), k1 = k >> 1, k2 = k - k1; /* 2^n in two factors */
  float p = lt_exp_poly_f32(lt_exp_reduce_f32(xc, n));
  return p * lt_bits_to_f32((uint32_t)(k1 + 127) << 23) * lt_bits_to_f32((uint32_t)(k2 + 127) << 23);
}

/* exp for x <= 0; 0 below -87 and for NaN. No upper clamp: x > 88 gives garbage. */
static inline float lt_exp_nonpos_f32(float x) {
  float keep = x >= -87.0f ? 1.0f : 0.0f, t = x >= -87.0f ? x : -87.0f;
  float n = lt_exp_round_n_f32(t);
  return lt_exp_poly_f32(lt_exp_reduce_f32(t, n)) * lt_exp2i_f32(n) * keep;
}

/* exp on [-87, 88] (88 above); 0 below -87 and for NaN. */
static inline float lt_exp_flush_f32(float x) { return lt_exp_nonpos_f32(x >= 88.0f ? 88.0f : x); }

/* exp on [-87, 88]; exp(-87) below -87, NaN kept; integer-compare clamps. */
static inline float lt_exp_clamp_f32(float x) {
  uint32_t ux = lt_f32_to_bits(x);
  ux = ux < 0xC2AE0000u ? ux : 0xC2AE0000u;                         /* x < -87 -> -87 (sign-magnitude) */
  int32_t ix = (int32_t)ux < 0x42B00000 ? (int32_t)ux : 0x42B00000; /* x > 88 -> 88 */
  float xc = lt_bits_to_f32((uint32_t)ix);
  float n = lt_exp_round_n_f32(xc);
  return lt_exp_poly_f32(lt_exp_reduce_f32(xc, n)) * lt_exp2i_f32(n) + (x - x); /* + 0, or NaN for NaN */
}

#endif
