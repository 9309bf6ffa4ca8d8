/* check.h — a tiny test harness for the C unit tests: checks that count failures and
 * name the line, random inputs, and a closing "N passed, N failed" line (check_skip: exit 77). */
#ifndef LUTRA_TEST_CHECK_H
#define LUTRA_TEST_CHECK_H
#include "core/internal.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int check_passed, check_failed;

#define CHECK(cond, ...)                                                                                               \
  do {                                                                                                                 \
    if (cond) {                                                                                                        \
      check_passed++;                                                                                                  \
    } else {                                                                                                           \
      check_failed++;                                                                                                  \
      fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond);                                         \
      fprintf(stderr, __VA_ARGS__);                                                                                    \
      fprintf(stderr, "\n");                                                                                           \
    }                                                                                                                  \
  } while (0)

/* Calls an API function that must succeed. */
#define CHECK_OK(call) CHECK((call) == 0, "%s -> %s", #call, lt_last_error())
/* Calls an API function that must fail with a message containing `needle`. */
#define CHECK_ERR(call, needle)                                                                                        \
  do {                                                                                                                 \
    int rc_ = (call);                                                                                                  \
    CHECK(rc_ != 0 && strstr(lt_last_error(), needle), "%s -> rc %d, error '%s', expected '%s'", #call, rc_,           \
          lt_last_error(), needle);                                                                                    \
  } while (0)

static inline int check_summary(void) {
  printf("%d passed, %d failed\n", check_passed, check_failed);
  return check_failed ? 1 : 0;
}

/* For main() of a test that cannot run here (a GPU test without a GPU): says why and returns
 * 77, ctest's SKIP_RETURN_CODE, so that it is reported as skipped and never as passed. */
static inline int check_skip(const char *why) {
  printf("skipped: %s\n%d passed, %d failed, skipped\n", why, check_passed, check_failed);
  return check_failed ? 1 : 77;
}

/* For main() of a GPU test (tests/c/test_*_gpu.c, label gpu): 0 where a device is usable, else
 * the exit status, decided as `lutra selftest` does: skipped (77) without a GPU, failed (1)
 * where the driver is there but broken, or where LUTRA_REQUIRE_GPU is set (GPU machines). */
static inline int check_need_gpu(void) {
  int state = lt_cuda_availability();
  if (state == LT_CUDA_READY) return 0;
  const char *require = getenv("LUTRA_REQUIRE_GPU");
  if (state == LT_CUDA_BROKEN || (require && require[0] && strcmp(require, "0") != 0)) {
    CHECK(0, "no usable GPU (%s)%s", lt_cuda_status(), state == LT_CUDA_BROKEN ? "" : " and LUTRA_REQUIRE_GPU is set");
    return check_summary();
  }
  char why[512];
  snprintf(why, sizeof why, "no GPU to test (%s)", lt_cuda_status());
  return check_skip(why);
}

/* xorshift64*: deterministic test inputs independent of the library's RNG. */
static uint64_t check_rng_state = 0x9E3779B97F4A7C15ull;
static inline double check_uniform(void) {
  check_rng_state ^= check_rng_state >> 12;
  check_rng_state ^= check_rng_state << 25;
  check_rng_state ^= check_rng_state >> 27;
  return (double)((check_rng_state * 2685821657736338717ull) >> 11) / 9007199254740992.0;
}
static inline int64_t check_randint(int64_t lo, int64_t hi) {
  return lo + (int64_t)(check_uniform() * (double)(hi - lo));
}

/* A new tensor of the given shape/dtype on the CPU filled with uniform values in [lo, hi). */
static inline lt_tensor *check_random(int ndim, const int64_t *shape, int dtype, double lo, double hi) {
  lt_tensor *t = lt_tensor_new();
  if (lt_empty(t, ndim, shape, dtype, LT_DEVICE_CPU)) {
    fprintf(stderr, "check_random: %s\n", lt_last_error());
    exit(2);
  }
  char *p = lt_data_ptr(t);
  for (int64_t i = 0, n = lt_numel(t); i < n; i++) {
    double v = lo + (hi - lo) * check_uniform();
    if (!lt_dtype_is_float(dtype)) v = floor(v);
    lt_store_f64(p, dtype, i, v);
  }
  return t;
}

/* Value of element at linear row-major index i of any (possibly strided) CPU tensor. */
static inline double check_at(const lt_tensor *t, int64_t i) {
  return lt_load_f64(lt_data_ptr(t), t->dtype, lt_offset_of(i, t->ndim, t->shape, t->stride));
}

/* A non-contiguous tensor with the same values as t: the transpose of a contiguous
 * copy of t's transpose (dims 0 and last swapped), or t itself for ndim < 2. */
static inline lt_tensor *check_noncontig(const lt_tensor *t) {
  lt_tensor *a = lt_tensor_new(), *b = lt_tensor_new(), *c = lt_tensor_new();
  if (t->ndim < 2) {
    lt_set(c, t);
  } else {
    lt_transpose(a, t, 0, t->ndim - 1);
    lt_empty(b, a->ndim, a->shape, a->dtype, LT_DEVICE_CPU);
    lt_copy(b, a);
    lt_transpose(c, b, 0, t->ndim - 1);
  }
  lt_release(a);
  lt_release(b);
  return c;
}

/* Relative tolerance for comparing a computation in dtype against a double reference. */
static inline double check_tol(int dtype) {
  switch (dtype) {
  case LT_F64: return 1e-10;
  case LT_F32: return 1e-5;
  case LT_BF16: return 1e-2;
  case LT_F16: return 2e-3;
  default: return 0;
  }
}

static inline bool check_close(double got, double want, double rtol, double atol) {
  if (isnan(want)) return isnan(got);
  if (isinf(want)) return got == want;
  return fabs(got - want) <= atol + rtol * fabs(want);
}
#endif
