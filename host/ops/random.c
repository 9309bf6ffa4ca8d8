/* random.c — counter-based random numbers: Philox4x32-10 and the distributions drawn from it.
 *
 * The exact recipe, which the CUDA kernels (kernels/random.cu) reproduce bit for bit: the generator
 * and the bits -> value transforms live in kernels/philox.h, compiled for both sides.
 *
 * Generator. Philox4x32-10 as in Random123 (Salmon et al., SC'11): multipliers 0xD2511F53 and
 * 0xCD9E8D57, key increments 0x9E3779B9 and 0xBB67AE85, 10 rounds, the key bumped between rounds.
 * key = (low32(seed), high32(seed)). Element i of out, counted in row-major order over out's shape
 * whatever its strides, uses the counter c = offset + i (mod 2^64) as the four counter words
 * (low32(c), high32(c), 0, 0) and gets four words w0, w1, w2, w3, of which only w0 and w1 are used.
 *
 * uniform(lo, hi), out f32/bf16/f16: u = (w0 >> 8) * 2^-24, in [0, 1).
 *                  out f64:          u = (((uint64)w1 << 32 | w0) >> 11) * 2^-53, in [0, 1).
 *   v = fma(hi - lo, u, lo) in double (an explicit fused multiply-add: one rounding), rounded to
 *   nearest-even to f32 (f32, bf16, f16 outs) and from there to bf16 or f16. If the rounded value
 *   is >= hi (it rounded up onto hi), lo is stored instead: results always lie in [lo, hi).
 *
 * normal(mean, std): Box-Muller in double. u1 = (w0 + 1) * 2^-32 in (0, 1] (never log(0)),
 *   u2 = w1 * 2^-32 in [0, 1), z = sqrt(-2 log(u1)) * cos(6.283185307179586 * u2),
 *   v = fma(std, z, mean), rounded as for uniform (double -> f32 -> bf16/f16). log and cos are
 *   libm's here and libdevice's on the GPU (both faithful in double), so an f64 result may differ
 *   in its last bit between devices; f32 and narrower agree unless v falls within an ulp of a tie.
 *
 * rand_int(lo, hi), values in [lo, hi): x = (uint64)w1 << 32 | w0,
 *   v = lo + (((uint128)x * (hi - lo)) >> 64) (Lemire's multiply-shift: no division; the bias is at
 *   most (hi - lo) / 2^64 per value). Integer outs i32/i64/u8, or floats (rounded from the integer).
 *
 * bernoulli(p): v = 1 if (w0 >> 8) * 2^-24 < p (exactly: (w0 >> 8) < ceil(p * 2^24)), else 0,
 *   in out's dtype (bool, u8, any).
 */
#include "core/internal.h"
#include "kernels/philox.h"
#include "ops/backend.h"

/* The generator with every counter word exposed (for the Random123 known-answer tests; not in
 * lutra.h because the distributions only ever use 64-bit counters). */
void lt_philox4x32_words(const uint32_t counter[4], const uint32_t key[2], uint32_t out4[4]) {
  lt_philox4x32_10(counter, key, out4);
}

int lt_philox4x32(uint64_t key, uint64_t counter, uint32_t *out4) {
  if (!out4) return lt_errorf("philox4x32: out4 is NULL");
  uint32_t c[4] = {(uint32_t)counter, (uint32_t)(counter >> 32), 0, 0}, k[2] = {(uint32_t)key, (uint32_t)(key >> 32)};
  lt_philox4x32_10(c, k, out4);
  return 0;
}

/* ---- distributions ------------------------------------------------------------------- */

typedef enum { DIST_UNIFORM, DIST_NORMAL, DIST_INT, DIST_BERNOULLI } dist_kind;

typedef struct dist {
  dist_kind kind;
  double a, b;        /* uniform: lo, hi; normal: mean, std */
  uint64_t first_top; /* uniform: the smallest integer draw whose value rounds up to >= hi */
  uint32_t below;     /* bernoulli: w0 >> 8 < below  <=>  (w0 >> 8) * 2^-24 < p */
  int64_t ilo;        /* rand_int: lo */
  uint64_t range;     /* rand_int: hi - lo */
  uint32_t key[2];    /* the seed */
} dist;

/* v rounded into a floating dtype as the recipe says: double -> f32 -> bf16/f16. */
static inline double round_to(double v, int dtype) {
  switch (dtype) {
  case LT_F32: return (float)v;
  case LT_BF16: return lt_bf16_to_f32(lt_f32_to_bf16((float)v));
  case LT_F16: return lt_f16_to_f32(lt_f32_to_f16((float)v));
  default: return v;
  }
}

/* Uniform draws are integers k < 2^bits with u = k 2^-bits. The stored value rounded(fma(hi - lo,
 * u, lo)) never decreases with k, so "rounds up onto hi, store lo" is exactly k >= the first such k,
 * found once by bisection; the per-element loop is then free of float compares and vectorises. */
static uint64_t first_top(double lo, double hi, int dtype) {
  int bits = dtype == LT_F64 ? 53 : 24;
  uint64_t a = 0, e = (uint64_t)1 << bits; /* answer in [a, e]; e: no draw reaches hi */
  while (a < e) {
    uint64_t mid = a + (e - a) / 2;
    if (round_to(fma(hi - lo, ldexp((double)mid, -bits), lo), dtype) >= hi)
      e = mid;
    else
      a = mid + 1;
  }
  return a;
}

enum { RNG_CHUNK = 64 };

/* Stores n values (double or int64) at base[j * stride] (element strides) in out's dtype. */
static void store_values(char *base, int dtype, int64_t stride, const double *v, const int64_t *iv, int n) {
  switch (dtype) {
  case LT_F64:
    for (int j = 0; j < n; j++) ((double *)base)[j * stride] = iv ? (double)iv[j] : v[j];
    return;
  case LT_F32:
    for (int j = 0; j < n; j++) ((float *)base)[j * stride] = iv ? (float)iv[j] : (float)v[j];
    return;
  case LT_BF16:
    for (int j = 0; j < n; j++) ((uint16_t *)base)[j * stride] = lt_f32_to_bf16(iv ? (float)iv[j] : (float)v[j]);
    return;
  case LT_F16:
    for (int j = 0; j < n; j++) ((uint16_t *)base)[j * stride] = lt_f32_to_f16(iv ? (float)iv[j] : (float)v[j]);
    return;
  case LT_I32:
    for (int j = 0; j < n; j++) ((int32_t *)base)[j * stride] = (int32_t)iv[j];
    return;
  case LT_I64:
    for (int j = 0; j < n; j++) ((int64_t *)base)[j * stride] = iv[j];
    return;
  default: /* u8, bool */
    for (int j = 0; j < n; j++) ((uint8_t *)base)[j * stride] = (uint8_t)iv[j];
    return;
  }
}

/* Fills n elements at base[j * stride] (element strides) with elements counter0 + j of the stream. */
static void fill_run(char *base, int dtype, int64_t stride, int64_t n, uint64_t counter0, const dist *d) {
  uint32_t w0[RNG_CHUNK], w1[RNG_CHUNK];
  double v[RNG_CHUNK];
  int64_t iv[RNG_CHUNK];
  const double lo = d->a, span = d->b - d->a;
  for (int64_t j0 = 0; j0 < n; j0 += RNG_CHUNK) {
    int m = n - j0 < RNG_CHUNK ? (int)(n - j0) : RNG_CHUNK;
    for (int j = 0; j < m; j++) /* the generator: independent lanes, vectorisable */
      lt_philox_draw(d->key, counter0 + (uint64_t)(j0 + j), &w0[j], &w1[j]);
    bool ints = false;
    switch (d->kind) { /* the value transforms of kernels/philox.h, shared with kernels/random.cu */
    case DIST_UNIFORM:
      if (dtype == LT_F64) {
        for (int j = 0; j < m; j++)
          v[j] = lt_philox_uniform53_value(lt_philox_uniform_k53(w0[j], w1[j]), lo, span, d->first_top);
      } else {
        for (int j = 0; j < m; j++)
          v[j] = lt_philox_uniform24_value(lt_philox_uniform_k24(w0[j]), lo, span, d->first_top);
      }
      break;
    case DIST_NORMAL:
      for (int j = 0; j < m; j++) v[j] = lt_philox_normal_value(w0[j], w1[j], d->a, d->b);
      break;
    case DIST_INT:
      for (int j = 0; j < m; j++) iv[j] = lt_philox_int_value(w0[j], w1[j], d->ilo, d->range);
      ints = true;
      break;
    case DIST_BERNOULLI:
      for (int j = 0; j < m; j++) iv[j] = lt_philox_bernoulli_value(w0[j], d->below);
      ints = true;
      break;
    }
    store_values(base + j0 * stride * lt_dtype_size(dtype), dtype, stride, v, ints ? iv : NULL, m);
  }
}

/* Piece t: elements [j0, j0 + chunk) of row t / per_row, j0 = (t % per_row) * chunk. */
static inline void fill_piece(const lt_strided_loop *L, char *base, int dtype, int64_t inner, int64_t chunk,
                              uint64_t offset, const dist *d, int64_t t) {
  int64_t per_row = (inner + chunk - 1) / chunk, stride = L->stride[0][L->ndim - 1];
  int64_t r = t / per_row, j0 = (t % per_row) * chunk, n = inner - j0 < chunk ? inner - j0 : chunk, roff;
  lt_loop_row_offsets(L, r, &roff);
  fill_run(base + (roff + j0 * stride) * lt_dtype_size(dtype), dtype, stride, n, offset + (uint64_t)(r * inner + j0),
           d);
}

/* Fills out (any layout) in row-major element order; element i gets counter offset + i. */
static int fill(lt_tensor *out, uint64_t seed, uint64_t offset, dist *d) {
  d->key[0] = (uint32_t)seed;
  d->key[1] = (uint32_t)(seed >> 32);
  static const char *names[4] = {"rand_uniform", "rand_normal", "rand_int", "rand_bernoulli"};
  if (out->device != LT_DEVICE_CPU) { /* kernels/random.cu: the same recipe through kernels/philox.h */
    const lt_backend *be = lt_backend_for(names[d->kind], out->device);
    if (!be) return -1;
    static const int kinds[4] = {LT_RNG_UNIFORM, LT_RNG_NORMAL, LT_RNG_INT, LT_RNG_BERNOULLI};
    lt_cuda_rng_args a = {.device = out->device,
                          .dtype = out->dtype,
                          .kind = kinds[d->kind],
                          .ndim = out->ndim,
                          .data = lt_data_ptr(out),
                          .key = {d->key[0], d->key[1]},
                          .offset = offset,
                          .a = d->a,
                          .b = d->kind == DIST_UNIFORM ? d->b - d->a : d->b,
                          .first_top = d->first_top,
                          .below = d->below,
                          .ilo = d->ilo,
                          .range = d->range};
    memcpy(a.shape, out->shape, sizeof a.shape);
    memcpy(a.stride, out->stride, sizeof a.stride);
    return be->rng_fill(&a);
  }
  const int64_t *strides[1] = {out->stride};
  lt_strided_loop L;
  lt_loop_init(&L, out->ndim, out->shape, 1, strides);
  int64_t rows = lt_loop_outer_rows(&L), inner = L.shape[L.ndim - 1];
  char *base = lt_data_ptr(out);
  int dtype = out->dtype;
  if (lt_numel(out) == 0) return 0;
  /* Split into pieces of at most `chunk` elements of one row: same values for any thread count,
   * since each element's value depends only on its linear index. */
  int64_t chunk = inner < 4096 ? inner : 4096, per_row = (inner + chunk - 1) / chunk;
  int64_t pieces = rows * per_row;
  if (rows * inner >= LT_PAR_GRAIN / 4) { /* no omp construct for small work: see ew_execute */
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < pieces; t++) fill_piece(&L, base, dtype, inner, chunk, offset, d, t);
  } else {
    for (int64_t t = 0; t < pieces; t++) fill_piece(&L, base, dtype, inner, chunk, offset, d, t);
  }
  return 0;
}

static int check_out(const char *op, const lt_tensor *out) {
  LT_TRY(lt_check_defined(op, "out", out));
  return 0;
}

int lt_rand_uniform(lt_tensor *out, uint64_t seed, uint64_t offset, double lo, double hi) {
  LT_TRY(check_out("rand_uniform", out));
  if (!lt_dtype_is_float(out->dtype))
    return lt_errorf("rand_uniform: out must be a floating dtype (f32, f64, bf16, f16), got %s",
                     lt_dtype_name(out->dtype));
  if (!isfinite(lo) || !isfinite(hi) || !isfinite(hi - lo) || !(hi > lo))
    return lt_errorf("rand_uniform: need finite lo < hi, got lo=%g hi=%g", lo, hi);
  dist d = {.kind = DIST_UNIFORM, .a = lo, .b = hi, .first_top = first_top(lo, hi, out->dtype)};
  return fill(out, seed, offset, &d);
}

int lt_rand_normal(lt_tensor *out, uint64_t seed, uint64_t offset, double mean, double std) {
  LT_TRY(check_out("rand_normal", out));
  if (!lt_dtype_is_float(out->dtype))
    return lt_errorf("rand_normal: out must be a floating dtype (f32, f64, bf16, f16), got %s",
                     lt_dtype_name(out->dtype));
  if (!isfinite(mean) || !isfinite(std) || std < 0)
    return lt_errorf("rand_normal: need a finite mean and a finite std >= 0, got mean=%g std=%g", mean, std);
  dist d = {.kind = DIST_NORMAL, .a = mean, .b = std};
  return fill(out, seed, offset, &d);
}

int lt_rand_int(lt_tensor *out, uint64_t seed, uint64_t offset, int64_t lo, int64_t hi) {
  LT_TRY(check_out("rand_int", out));
  int dt = out->dtype;
  if (dt == LT_BOOL) return lt_errorf("rand_int: out must be an integer (i32, i64, u8) or floating dtype, got bool");
  if (hi <= lo) return lt_errorf("rand_int: need lo < hi, got lo=%lld hi=%lld", (long long)lo, (long long)hi);
  int64_t min = dt == LT_I32 ? INT32_MIN : dt == LT_U8 ? 0 : INT64_MIN;
  int64_t max = dt == LT_I32 ? INT32_MAX : dt == LT_U8 ? 255 : INT64_MAX;
  if (lo < min || hi - 1 > max)
    return lt_errorf("rand_int: range [%lld, %lld) does not fit in %s", (long long)lo, (long long)hi,
                     lt_dtype_name(dt));
  dist d = {.kind = DIST_INT, .ilo = lo, .range = (uint64_t)hi - (uint64_t)lo};
  return fill(out, seed, offset, &d);
}

int lt_rand_bernoulli(lt_tensor *out, uint64_t seed, uint64_t offset, double p) {
  LT_TRY(check_out("rand_bernoulli", out));
  if (!(p >= 0 && p <= 1)) return lt_errorf("rand_bernoulli: need 0 <= p <= 1, got p=%g", p);
  /* k * 2^-24 < p  <=>  k < ceil(p * 2^24), p * 2^24 being exact */
  dist d = {.kind = DIST_BERNOULLI, .below = (uint32_t)ceil(p * 0x1p24)};
  return fill(out, seed, offset, &d);
}
