/* test_philox.c — kernels/philox.h, the generator and value transforms that host/ops/random.c and
 * kernels/random.cu share: Random123's known answers, and element-by-element equality with
 * lt_rand_* on the CPU for every distribution and dtype at offsets that are not multiples of
 * 4 (so a GPU that runs these same functions gives the same numbers). */
#include "check.h"
#include "kernels/philox.h"

static void test_known_answers(void) {
  /* (Random123's known-answer vectors for lt_philox4x32_10 itself are checked in test_random.c,
   * through lt_philox4x32_words, which is this header's function) */
  /* lt_philox_draw is counter (low, high, 0, 0): the first two words of lt_philox4x32 */
  for (int k = 0; k < 50; k++) {
    uint64_t key = (uint64_t)(check_uniform() * 0x1p53) * 2654435761u, ctr = (uint64_t)(check_uniform() * 0x1p63);
    uint32_t want[4], w0, w1, kw[2] = {(uint32_t)key, (uint32_t)(key >> 32)};
    CHECK_OK(lt_philox4x32(key, ctr, want));
    lt_philox_draw(kw, ctr, &w0, &w1);
    CHECK(w0 == want[0] && w1 == want[1], "draw(%llx, %llx) = %08x %08x, want %08x %08x", (unsigned long long)key,
          (unsigned long long)ctr, w0, w1, want[0], want[1]);
  }
}

/* v as host/ops/random.c stores it: double -> f32 -> bf16/f16 for floats (integers exactly in int dtypes) */
static double stored(double v, int dtype) {
  unsigned char buf[8];
  lt_store_f64(buf, dtype, 0, v);
  return lt_load_f64(buf, dtype, 0);
}

/* The smallest draw whose value rounds up onto hi (host/ops/random.c's first_top): the stored value never
 * decreases with the draw, so bisect. */
static uint64_t first_top_search(double lo, double hi, int dtype) {
  int bits = dtype == LT_F64 ? 53 : 24;
  uint64_t a = 0, e = (uint64_t)1 << bits;
  while (a < e) {
    uint64_t mid = a + (e - a) / 2;
    if (stored(fma(hi - lo, ldexp((double)mid, -bits), lo), dtype) >= hi)
      e = mid;
    else
      a = mid + 1;
  }
  return a;
}

static void test_same_as_rand(void) {
  static const int floats[4] = {LT_F32, LT_F64, LT_BF16, LT_F16};
  static const int all[7] = {LT_F32, LT_F64, LT_BF16, LT_F16, LT_I32, LT_I64, LT_U8};
  int64_t n = 1001;
  for (int rep = 0; rep < 3; rep++) {
    uint64_t seed = 0x9e3779b97f4a7c15ull * (uint64_t)(rep + 1), offset = 4 * (uint64_t)rep * 1000 + 1 + 2 * rep;
    if (rep == 2) offset = UINT64_MAX - 500; /* the counter wraps inside the tensor */
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    for (int k = 0; k < 4; k++) {
      int dt = floats[k];
      lt_tensor *u = lt_tensor_new(), *g = lt_tensor_new();
      CHECK_OK(lt_empty(u, 1, &n, dt, LT_DEVICE_CPU));
      CHECK_OK(lt_empty(g, 1, &n, dt, LT_DEVICE_CPU));
      /* narrow bf16 range: many draws round onto hi, exercising first_top */
      double lo = rep == 1 ? 1.0 : -2.5, hi = rep == 1 ? 1.0078125 : 3.0;
      CHECK_OK(lt_rand_uniform(u, seed, offset, lo, hi));
      CHECK_OK(lt_rand_normal(g, seed, offset, 0.25, 1.5));
      uint64_t top = first_top_search(lo, hi, dt);
      int bad_u = 0, bad_n = 0;
      for (int64_t i = 0; i < n; i++) {
        uint32_t w0, w1;
        lt_philox_draw(key, offset + (uint64_t)i, &w0, &w1);
        double vu = dt == LT_F64 ? lt_philox_uniform53_value(lt_philox_uniform_k53(w0, w1), lo, hi - lo, top)
                                 : lt_philox_uniform24_value(lt_philox_uniform_k24(w0), lo, hi - lo, top);
        vu = stored(vu, dt);
        bad_u += vu != check_at(u, i) || !(vu >= lo && vu < hi);
        bad_n += stored(lt_philox_normal_value(w0, w1, 0.25, 1.5), dt) != check_at(g, i);
      }
      CHECK(bad_u == 0, "%s uniform rep %d: %d differ", lt_dtype_name(dt), rep, bad_u);
      CHECK(bad_n == 0, "%s normal rep %d: %d differ", lt_dtype_name(dt), rep, bad_n);
      lt_release(u), lt_release(g);
    }
    for (int k = 0; k < 7; k++) {
      int dt = all[k];
      int64_t lo = dt == LT_U8 ? 3 : dt == LT_I64 && rep == 2 ? INT64_MIN + 5 : -1000, hi = dt == LT_U8 ? 250 : 777;
      if (dt == LT_I64 && rep == 2) hi = INT64_MAX;
      double p = rep == 0 ? 0.3 : rep == 1 ? 1e-3 : 0.999;
      lt_tensor *r = lt_tensor_new(), *b = lt_tensor_new();
      CHECK_OK(lt_empty(r, 1, &n, dt, LT_DEVICE_CPU));
      CHECK_OK(lt_empty(b, 1, &n, dt, LT_DEVICE_CPU));
      CHECK_OK(lt_rand_int(r, seed, offset, lo, hi));
      CHECK_OK(lt_rand_bernoulli(b, seed, offset, p));
      uint32_t below = (uint32_t)ceil(p * 0x1p24);
      int bad_i = 0, bad_b = 0;
      for (int64_t i = 0; i < n; i++) {
        uint32_t w0, w1;
        lt_philox_draw(key, offset + (uint64_t)i, &w0, &w1);
        int64_t want = lt_philox_int_value(w0, w1, lo, (uint64_t)hi - (uint64_t)lo);
        if (dt == LT_I64) { /* compare as integers: doubles cannot hold these */
          bad_i += ((const int64_t *)lt_data_ptr(r))[i] != want || want < lo || want >= hi;
        } else {
          /* ops/random.c's store: integer -> f32 -> bf16/f16 for 16-bit floats, exact otherwise */
          double v = dt == LT_BF16 || dt == LT_F16 ? stored((double)(float)want, dt) : (double)want;
          bad_i += check_at(r, i) != v;
        }
        bad_b += check_at(b, i) != (double)lt_philox_bernoulli_value(w0, below);
      }
      CHECK(bad_i == 0, "%s rand_int rep %d: %d differ", lt_dtype_name(dt), rep, bad_i);
      CHECK(bad_b == 0, "%s bernoulli rep %d: %d differ", lt_dtype_name(dt), rep, bad_b);
      lt_release(r), lt_release(b);
    }
  }
}

int main(void) {
  test_known_answers();
  test_same_as_rand();
  return check_summary();
}
