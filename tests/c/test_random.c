/* test_random.c — Philox4x32-10 known answers, the documented distribution formulas element by
 * element, statistics, determinism across offsets, layouts and thread counts, bad arguments. */
#include "check.h"

/* Exported by host/ops/random.c for these tests (the full 4-word counter). */
void lt_philox4x32_words(const uint32_t counter[4], const uint32_t key[2], uint32_t out4[4]);

static lt_tensor *empty(int ndim, const int64_t *shape, int dtype) {
  lt_tensor *t = lt_tensor_new();
  if (lt_empty(t, ndim, shape, dtype, LT_DEVICE_CPU)) exit(2);
  return t;
}

static void test_known_answers(void) {
  /* Random123 kat_vectors: philox4x32 10 (counter words, key words) -> output words */
  static const uint32_t kat[3][10] = {
      {0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
      {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0x408f276d, 0x41c83b0e, 0xa20bc7c6,
       0x6d5451fd},
      {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, 0xd16cfe09, 0x94fdcceb, 0x5001e420,
       0x24126ea1},
  };
  for (int v = 0; v < 3; v++) {
    uint32_t got[4];
    lt_philox4x32_words(kat[v], kat[v] + 4, got);
    for (int w = 0; w < 4; w++)
      CHECK(got[w] == kat[v][6 + w], "vector %d word %d: %08x, want %08x", v, w, got[w], kat[v][6 + w]);
  }
  uint32_t got[4];
  CHECK_OK(lt_philox4x32(0, 0, got));
  CHECK(got[0] == 0x6627e8d5 && got[1] == 0xe169c58d && got[2] == 0xbc57ac4c && got[3] == 0x9b00dbd8,
        "lt_philox4x32(0, 0) = %08x %08x %08x %08x", got[0], got[1], got[2], got[3]);
  /* the 64-bit API maps key = (low, high) and counter = (low, high, 0, 0) */
  uint64_t key = 0x299f31d0a4093822ull, ctr = 0x85a308d3243f6a88ull;
  uint32_t words_c[4] = {0x243f6a88, 0x85a308d3, 0, 0}, words_k[2] = {0xa4093822, 0x299f31d0}, want[4];
  lt_philox4x32_words(words_c, words_k, want);
  CHECK_OK(lt_philox4x32(key, ctr, got));
  CHECK(memcmp(got, want, sizeof got) == 0, "64-bit key/counter words are split low word first");
  CHECK_ERR(lt_philox4x32(0, 0, NULL), "NULL");
}

/* The documented formulas, computed from the raw generator. */
static double want_uniform(uint64_t seed, uint64_t counter, double lo, double hi, int dtype) {
  uint32_t w[4];
  lt_philox4x32(seed, counter, w);
  double u = dtype == LT_F64 ? (double)((((uint64_t)w[1] << 32) | w[0]) >> 11) / 9007199254740992.0
                             : (double)(w[0] >> 8) / 16777216.0;
  return fma(hi - lo, u, lo);
}
static double want_normal(uint64_t seed, uint64_t counter, double mean, double std) {
  uint32_t w[4];
  lt_philox4x32(seed, counter, w);
  double u1 = ((double)w[0] + 1.0) / 4294967296.0, u2 = (double)w[1] / 4294967296.0;
  return fma(std, sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2), mean);
}
/* value as stored in dtype (double -> f32 -> 16-bit) */
static double rounded(double v, int dtype) {
  unsigned char buf[8];
  lt_store_f64(buf, dtype, 0, v);
  return lt_load_f64(buf, dtype, 0);
}

static void test_formulas(void) {
  int dtypes[4] = {LT_F32, LT_F64, LT_BF16, LT_F16};
  for (int k = 0; k < 4; k++) {
    int dt = dtypes[k];
    int64_t shape[2] = {37, 29};
    lt_tensor *u = empty(2, shape, dt), *n = empty(2, shape, dt);
    uint64_t seed = 0x123456789abcdefull + (uint64_t)k, offset = 1000 * (uint64_t)k + 7;
    CHECK_OK(lt_rand_uniform(u, seed, offset, -2.5, 3.0));
    CHECK_OK(lt_rand_normal(n, seed, offset, 0.5, 2.0));
    int bad_u = 0, bad_n = 0;
    for (int64_t i = 0; i < 37 * 29; i++) {
      double wu = rounded(want_uniform(seed, offset + (uint64_t)i, -2.5, 3.0, dt), dt);
      if (wu >= 3.0) wu = -2.5;
      if (check_at(u, i) != wu) bad_u++;
      double wn = rounded(want_normal(seed, offset + (uint64_t)i, 0.5, 2.0), dt);
      if (check_at(n, i) != wn) bad_n++;
    }
    CHECK(bad_u == 0, "%s uniform: %d elements differ from the documented formula", lt_dtype_name(dt), bad_u);
    CHECK(bad_n == 0, "%s normal: %d elements differ from the documented formula", lt_dtype_name(dt), bad_n);
    lt_release(u);
    lt_release(n);
  }
  /* bf16 and f16 draws that round up onto hi are stored as lo (often, in these ranges) */
  int clamp_dt[2] = {LT_BF16, LT_F16};
  double clamp_lo[2] = {1, 1000}, clamp_hi[2] = {2, 1001};
  for (int k = 0; k < 2; k++) {
    int64_t n = 20000, clamped = 0, bad = 0;
    lt_tensor *u = empty(1, &n, clamp_dt[k]);
    CHECK_OK(lt_rand_uniform(u, 99, 5, clamp_lo[k], clamp_hi[k]));
    for (int64_t i = 0; i < n; i++) {
      double w = rounded(want_uniform(99, 5 + (uint64_t)i, clamp_lo[k], clamp_hi[k], clamp_dt[k]), clamp_dt[k]);
      if (w >= clamp_hi[k]) w = clamp_lo[k], clamped++;
      bad += check_at(u, i) != w;
    }
    CHECK(bad == 0 && clamped > 0, "%s uniform clamp at hi: %lld differ, %lld clamped", lt_dtype_name(clamp_dt[k]),
          (long long)bad, (long long)clamped);
    lt_release(u);
  }
  /* rand_int and bernoulli, element by element */
  int64_t shape[1] = {5000};
  lt_tensor *r = empty(1, shape, LT_I64), *b = empty(1, shape, LT_U8);
  CHECK_OK(lt_rand_int(r, 42, 99, -1000000007, 3));
  CHECK_OK(lt_rand_bernoulli(b, 42, 99, 0.3));
  int bad_r = 0, bad_b = 0;
  for (int64_t i = 0; i < 5000; i++) {
    uint32_t w[4];
    lt_philox4x32(42, 99 + (uint64_t)i, w);
    uint64_t x = ((uint64_t)w[1] << 32) | w[0];
    int64_t want = -1000000007 + (int64_t)(((unsigned __int128)x * 1000000010u) >> 64);
    if (((int64_t *)lt_data_ptr(r))[i] != want) bad_r++;
    if (((uint8_t *)lt_data_ptr(b))[i] != ((double)(w[0] >> 8) / 16777216.0 < 0.3)) bad_b++;
  }
  CHECK(bad_r == 0, "rand_int: %d elements differ from the documented formula", bad_r);
  CHECK(bad_b == 0, "bernoulli: %d elements differ from the documented formula", bad_b);
  lt_release(r);
  lt_release(b);
}

static void test_statistics(void) {
  int64_t n = 100000, shape[1] = {n};
  lt_tensor *t = empty(1, shape, LT_F32);
  CHECK_OK(lt_rand_normal(t, 7, 0, 0, 1));
  const float *x = lt_data_ptr(t);
  double s = 0, s2 = 0, lo = 0, hi = 0;
  for (int64_t i = 0; i < n; i++) {
    s += x[i];
    s2 += (double)x[i] * x[i];
    lo = fmin(lo, x[i]);
    hi = fmax(hi, x[i]);
  }
  double mean = s / n, var = s2 / n - mean * mean;
  CHECK(fabs(mean) < 5 / sqrt((double)n), "normal mean %g", mean);
  CHECK(fabs(var - 1) < 5 * sqrt(2.0 / n), "normal variance %g", var);
  CHECK(lo < -3.5 && hi > 3.5 && lo > -7 && hi < 7, "normal tails: min %g max %g", lo, hi);
  /* mean and std are applied */
  CHECK_OK(lt_rand_normal(t, 8, 0, 10, 3));
  s = s2 = 0;
  for (int64_t i = 0; i < n; i++) s += x[i], s2 += (double)x[i] * x[i];
  mean = s / n, var = s2 / n - mean * mean;
  CHECK(fabs(mean - 10) < 5 * 3 / sqrt((double)n) && fabs(var / 9 - 1) < 5 * sqrt(2.0 / n), "N(10,3): %g %g", mean,
        var);
  /* std == 0 gives the mean exactly */
  CHECK_OK(lt_rand_normal(t, 8, 0, 1.5, 0));
  CHECK(x[0] == 1.5f && x[n - 1] == 1.5f, "std 0: %g", x[0]);

  /* uniform: range, mean, and a flat histogram */
  CHECK_OK(lt_rand_uniform(t, 9, 0, -1, 3));
  int hist[8] = {0}, out_of_range = 0;
  s = 0;
  for (int64_t i = 0; i < n; i++) {
    if (!(x[i] >= -1 && x[i] < 3)) out_of_range++;
    s += x[i];
    hist[(int)((x[i] + 1) * 2)]++;
  }
  CHECK(out_of_range == 0, "uniform: %d values outside [-1, 3)", out_of_range);
  CHECK(fabs(s / n - 1) < 5 * (4 / sqrt(12.0)) / sqrt((double)n), "uniform mean %g", s / n);
  for (int k = 0; k < 8; k++) CHECK(fabs(hist[k] - n / 8.0) < 5 * sqrt(n / 8.0), "uniform bin %d: %d", k, hist[k]);
  lt_release(t);

  /* 16-bit uniforms never round up onto hi */
  lt_tensor *h = empty(1, shape, LT_BF16), *f = empty(1, shape, LT_F16);
  CHECK_OK(lt_rand_uniform(h, 1, 0, 1, 2));
  CHECK_OK(lt_rand_uniform(f, 1, 0, 0, 1));
  int hits = 0;
  for (int64_t i = 0; i < n; i++) hits += check_at(h, i) >= 2 || check_at(h, i) < 1 || check_at(f, i) >= 1;
  CHECK(hits == 0, "16-bit uniform: %d values reached hi", hits);
  lt_release(h);
  lt_release(f);

  /* rand_int covers [lo, hi) and never gives hi */
  lt_tensor *r = empty(1, shape, LT_I32);
  CHECK_OK(lt_rand_int(r, 3, 0, -3, 5));
  int count[8] = {0}, outside = 0;
  for (int64_t i = 0; i < n; i++) {
    int v = ((int32_t *)lt_data_ptr(r))[i];
    if (v < -3 || v >= 5)
      outside++;
    else
      count[v + 3]++;
  }
  CHECK(outside == 0, "rand_int: %d values outside [-3, 5)", outside);
  for (int k = 0; k < 8; k++)
    CHECK(fabs(count[k] - n / 8.0) < 5 * sqrt(n / 8.0), "rand_int value %d: %d", k - 3, count[k]);
  lt_release(r);
  /* the full i64 range and u8 */
  lt_tensor *big = empty(1, shape, LT_I64), *small = empty(1, shape, LT_U8);
  CHECK_OK(lt_rand_int(big, 3, 0, INT64_MIN, INT64_MAX));
  CHECK_OK(lt_rand_int(small, 3, 0, 250, 256));
  int neg = 0, small_bad = 0;
  for (int64_t i = 0; i < n; i++) {
    neg += ((int64_t *)lt_data_ptr(big))[i] < 0;
    small_bad += ((uint8_t *)lt_data_ptr(small))[i] < 250;
  }
  CHECK(fabs(neg - n / 2.0) < 5 * sqrt(n / 4.0), "full-range rand_int: %d negatives", neg);
  CHECK(small_bad == 0, "u8 rand_int: %d values below lo", small_bad);
  lt_release(big);
  lt_release(small);

  /* bernoulli: frequency, p = 0 and p = 1, every output dtype */
  int dts[4] = {LT_BOOL, LT_U8, LT_F32, LT_BF16};
  for (int k = 0; k < 4; k++) {
    lt_tensor *b = empty(1, shape, dts[k]);
    CHECK_OK(lt_rand_bernoulli(b, 11, 0, 0.25));
    double ones = 0;
    int other = 0;
    for (int64_t i = 0; i < n; i++) {
      double v = check_at(b, i);
      ones += v;
      other += v != 0 && v != 1;
    }
    CHECK(other == 0 && fabs(ones - 0.25 * n) < 5 * sqrt(n * 0.25 * 0.75), "%s bernoulli: %g ones, %d others",
          lt_dtype_name(dts[k]), ones, other);
    CHECK_OK(lt_rand_bernoulli(b, 11, 0, 0));
    ones = 0;
    for (int64_t i = 0; i < n; i++) ones += check_at(b, i);
    CHECK(ones == 0, "bernoulli p=0 gave %g ones", ones);
    CHECK_OK(lt_rand_bernoulli(b, 11, 0, 1));
    ones = 0;
    for (int64_t i = 0; i < n; i++) ones += check_at(b, i);
    CHECK(ones == n, "bernoulli p=1 gave %g ones", ones);
    lt_release(b);
  }
}

static bool same_values(const lt_tensor *a, const lt_tensor *b, int64_t a_start, int64_t count) {
  for (int64_t i = 0; i < count; i++)
    if (check_at(a, a_start + i) != check_at(b, i)) return false;
  return true;
}

static void test_determinism(void) {
  int64_t shape[3] = {6, 50, 70}, n = 6 * 50 * 70; /* above the parallel threshold */
  lt_tensor *a = empty(3, shape, LT_F32), *b = empty(3, shape, LT_F32);
  CHECK_OK(lt_rand_normal(a, 5, 0, 0, 1));
  CHECK_OK(lt_rand_normal(b, 5, 0, 0, 1));
  CHECK(same_values(a, b, 0, n), "same seed and offset give the same values");
  /* offset k gives the tail of the stream from offset 0 */
  int64_t k = 1234;
  CHECK_OK(lt_rand_normal(b, 5, (uint64_t)k, 0, 1));
  CHECK(same_values(a, b, k, n - k), "offset shifts the stream");
  CHECK_OK(lt_rand_normal(b, 6, 0, 0, 1));
  int equal = 0;
  for (int64_t i = 0; i < n; i++) equal += check_at(a, i) == check_at(b, i);
  CHECK(equal < 10, "another seed gives other values (%d equal)", equal);

  /* independent of the thread count */
  int threads = lt_get_num_threads();
  lt_tensor *c = empty(3, shape, LT_F32);
  CHECK_OK(lt_set_num_threads(1));
  CHECK_OK(lt_rand_uniform(b, 5, 77, 0, 1));
  CHECK_OK(lt_set_num_threads(3));
  CHECK_OK(lt_rand_uniform(c, 5, 77, 0, 1));
  CHECK_OK(lt_set_num_threads(threads));
  CHECK(same_values(b, c, 0, n), "1 and 3 threads give the same values");

  /* a non-contiguous out gets the values in its own row-major order */
  int dtypes[3] = {LT_F64, LT_BF16, LT_I64};
  for (int d = 0; d < 3; d++) {
    lt_tensor *cont = empty(3, shape, dtypes[d]), *base = empty(3, shape, dtypes[d]), *view = lt_tensor_new();
    CHECK_OK(lt_transpose(view, base, 0, 2)); /* (70, 50, 6) */
    lt_tensor *cont_t = empty(3, view->shape, dtypes[d]);
    if (dtypes[d] == LT_I64) {
      CHECK_OK(lt_rand_int(cont_t, 1, 3, -50, 50));
      CHECK_OK(lt_rand_int(view, 1, 3, -50, 50));
    } else {
      CHECK_OK(lt_rand_normal(cont_t, 1, 3, 0, 1));
      CHECK_OK(lt_rand_normal(view, 1, 3, 0, 1));
    }
    CHECK(same_values(view, cont_t, 0, n), "%s: non-contiguous out in row-major order", lt_dtype_name(dtypes[d]));
    /* a strided slice */
    lt_tensor *sl = lt_tensor_new(), *ref = lt_tensor_new();
    CHECK_OK(lt_slice(sl, cont, 2, 1, 70, 3));
    CHECK_OK(lt_empty(ref, 3, sl->shape, dtypes[d], LT_DEVICE_CPU));
    CHECK_OK(lt_rand_bernoulli(sl, 2, 0, 0.5));
    CHECK_OK(lt_rand_bernoulli(ref, 2, 0, 0.5));
    CHECK(same_values(sl, ref, 0, lt_numel(ref)), "%s: strided slice out", lt_dtype_name(dtypes[d]));
    lt_release(cont);
    lt_release(base);
    lt_release(view);
    lt_release(cont_t);
    lt_release(sl);
    lt_release(ref);
  }
  /* a scalar and an empty tensor */
  lt_tensor *s = empty(0, shape, LT_F64), *e = lt_tensor_new();
  int64_t zero[2] = {3, 0};
  CHECK_OK(lt_empty(e, 2, zero, LT_F32, LT_DEVICE_CPU));
  CHECK_OK(lt_rand_uniform(s, 4, 10, 0, 1));
  CHECK(check_at(s, 0) == want_uniform(4, 10, 0, 1, LT_F64), "scalar out uses counter = offset");
  CHECK_OK(lt_rand_uniform(e, 4, 10, 0, 1));
  lt_release(s);
  lt_release(e);
  lt_release(a);
  lt_release(b);
  lt_release(c);
}

static void test_bad_args(void) {
  int64_t shape[1] = {8};
  lt_tensor *f = empty(1, shape, LT_F32), *i = empty(1, shape, LT_I32), *u = lt_tensor_new(),
            *b = empty(1, shape, LT_BOOL);
  CHECK_ERR(lt_rand_uniform(f, 0, 0, 1, 1), "lo < hi");
  CHECK_ERR(lt_rand_uniform(f, 0, 0, 2, 1), "lo < hi");
  CHECK_ERR(lt_rand_uniform(f, 0, 0, 0, INFINITY), "finite");
  CHECK_ERR(lt_rand_uniform(f, 0, 0, NAN, 1), "finite");
  CHECK_ERR(lt_rand_uniform(i, 0, 0, 0, 1), "floating dtype");
  CHECK_ERR(lt_rand_normal(f, 0, 0, 0, -1), "std >= 0");
  CHECK_ERR(lt_rand_normal(f, 0, 0, NAN, 1), "finite mean");
  CHECK_ERR(lt_rand_normal(i, 0, 0, 0, 1), "floating dtype");
  CHECK_ERR(lt_rand_int(i, 0, 0, 5, 5), "lo < hi");
  CHECK_ERR(lt_rand_int(i, 0, 0, 0, (int64_t)1 << 40), "does not fit in i32");
  CHECK_ERR(lt_rand_int(b, 0, 0, 0, 2), "got bool");
  CHECK_ERR(lt_rand_bernoulli(f, 0, 0, 1.5), "0 <= p <= 1");
  CHECK_ERR(lt_rand_bernoulli(f, 0, 0, -0.1), "0 <= p <= 1");
  CHECK_ERR(lt_rand_bernoulli(f, 0, 0, NAN), "0 <= p <= 1");
  CHECK_ERR(lt_rand_uniform(u, 0, 0, 0, 1), "undefined");
  CHECK_ERR(lt_rand_normal(NULL, 0, 0, 0, 1), "NULL");
  CHECK_OK(lt_rand_int(f, 0, 0, -5, 5)); /* floats may hold integers */
  int bad = 0;
  for (int k = 0; k < 8; k++)
    bad += check_at(f, k) != floor(check_at(f, k)) || check_at(f, k) < -5 || check_at(f, k) >= 5;
  CHECK(bad == 0, "rand_int into f32: %d bad values", bad);
  lt_release(f);
  lt_release(i);
  lt_release(u);
  lt_release(b);
}

int main(void) {
  test_known_answers();
  test_formulas();
  test_statistics();
  test_determinism();
  test_bad_args();
  return check_summary();
}
