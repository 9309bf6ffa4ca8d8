/* test_caching_alloc_gpu.c — with a GPU (label gpu; skipped without one): tensors on cuda:0 go
 * through the caching allocator (host/core/caching_alloc.c): statistics, a cache hit, the
 * out-of-memory path, pinned host memory. The allocator itself: test_caching_alloc.c.
 * Written without a GPU at hand: not yet run on one. */
#include "check.h"
#include "core/device.h"
#include <string.h>

static void test_on_gpu(void) {
  lt_cuda_memory_stats st0, st;
  CHECK_OK(lt_cuda_empty_cache(0));
  CHECK_OK(lt_cuda_get_memory_stats(0, &st0));
  lt_tensor *t = lt_tensor_new();
  int64_t shape[1] = {1000};
  CHECK_OK(lt_empty(t, 1, shape, LT_F32, 0)); /* 4000 B: a 512 B-rounded block */
  CHECK_OK(lt_cuda_get_memory_stats(0, &st));
  CHECK(st.allocated - st0.allocated == 4096 && st.num_allocs == st0.num_allocs + 1, "allocated %lld",
        (long long)(st.allocated - st0.allocated));
  CHECK_OK(lt_free_storage(t));
  CHECK_OK(lt_empty(t, 1, shape, LT_F32, 0));
  CHECK_OK(lt_cuda_get_memory_stats(0, &st));
  CHECK(st.cache_hits >= st0.cache_hits + 1, "the second allocation is a cache hit");
  int64_t huge[1] = {(int64_t)1 << 40}; /* 4 TiB */
  lt_tensor *h = lt_tensor_new();
  CHECK_ERR(lt_empty(h, 1, huge, LT_F32, 0), "out of memory");
  CHECK_OK(lt_cuda_get_memory_stats(0, &st));
  CHECK(st.num_ooms == st0.num_ooms + 1, "the OOM is counted");
  lt_release(h);
  lt_release(t);
  void *pinned = NULL;
  CHECK_OK(lt_cuda_host_alloc(3 << 20, &pinned));
  if (pinned) memset(pinned, 1, 3 << 20);
  CHECK_OK(lt_cuda_host_free(pinned));
  CHECK_ERR(lt_cuda_host_free(&st), "not a live block");
  CHECK_OK(lt_cuda_empty_cache(0));
  CHECK_OK(lt_cuda_get_memory_stats(0, &st));
  CHECK(st.allocated == st0.allocated, "all freed");
}

int main(void) {
  int skip = check_need_gpu();
  if (skip) return skip;
  test_on_gpu();
  return check_summary();
}
