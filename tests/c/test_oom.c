/* test_oom.c — running out of memory is an error with the size and the allocator's
 * statistics, never a crash; nothing already allocated is disturbed. */
#include "check.h"

int main(void) {
  int64_t huge[4] = {1024, 1024, 1024, 1024}; /* 4 TiB of f32 */
  lt_tensor *keep = lt_tensor_new(), *t = lt_tensor_new();
  int64_t small[1] = {1000};
  CHECK_OK(lt_empty(keep, 1, small, LT_F32, LT_DEVICE_CPU));
  CHECK_OK(lt_fill(keep, 3));
  lt_memory_stats before, after;
  CHECK_OK(lt_memory_get_stats(LT_DEVICE_CPU, &before));

  CHECK_ERR(lt_empty(t, 4, huge, LT_F32, LT_DEVICE_CPU), "empty: out of memory on cpu allocating 4398046511104 bytes");
  CHECK(strstr(lt_last_error(), "allocated ") && strstr(lt_last_error(), "peak "), "stats in: %s", lt_last_error());
  CHECK(!lt_is_defined(t), "a failed allocation leaves out undefined");

  /* an op whose result does not fit: (2^20, 1) + (1, 2^20) broadcasts to 4 TiB */
  int64_t col[2] = {1 << 20, 1}, row[2] = {1, 1 << 20};
  lt_tensor *a = lt_tensor_new(), *b = lt_tensor_new(), *c = lt_tensor_new();
  CHECK_OK(lt_empty(a, 2, col, LT_F32, LT_DEVICE_CPU));
  CHECK_OK(lt_empty(b, 2, row, LT_F32, LT_DEVICE_CPU));
  CHECK_ERR(lt_binary(c, a, b, LT_ADD), "out of memory");

  lt_release(a);
  lt_release(b);
  lt_release(c);
  CHECK_OK(lt_memory_get_stats(LT_DEVICE_CPU, &after));
  CHECK(after.allocated == before.allocated, "allocated %lld after failures, %lld before", (long long)after.allocated,
        (long long)before.allocated);
  double v = 0;
  int64_t i0[1] = {999};
  CHECK_OK(lt_get_at(keep, i0, &v));
  CHECK(v == 3, "existing tensor intact: %g", v);
  CHECK_OK(lt_empty(t, 1, small, LT_F32, LT_DEVICE_CPU)); /* allocation still works */
  lt_release(t);
  lt_release(keep);
  return check_summary();
}
