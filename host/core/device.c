/* device.c — which device runtime this build has: the core's one #ifdef LUTRA_HAVE_CUDA.
 * Without CUDA the table is absent and the CUDA entry points of lutra.h say so. */
#include "core/device.h"
#include <string.h>

#ifdef LUTRA_HAVE_CUDA
extern const lt_device_runtime lt_device_runtime_cuda; /* host/core/cuda_device.cu */
const lt_device_runtime *lt_device_cuda(void) { return &lt_device_runtime_cuda; }
#else
const lt_device_runtime *lt_device_cuda(void) { return NULL; }

int lt_cuda_get_memory_stats(int device, lt_cuda_memory_stats *stats) {
  if (stats) memset(stats, 0, sizeof *stats);
  return lt_errorf("memory_stats: device cuda:%d is not available (lutra was built without CUDA)", device);
}
int lt_cuda_reset_peak_memory_stats(int device) {
  return lt_errorf("reset_peak_memory_stats: device cuda:%d is not available (lutra was built without CUDA)", device);
}
int lt_cuda_empty_cache(int device) {
  return lt_errorf("empty_cache: device cuda:%d is not available (lutra was built without CUDA)", device);
}
int lt_cuda_host_alloc(int64_t nbytes, void **ptr) {
  if (ptr) *ptr = NULL;
  return lt_errorf("cuda_host_alloc: no pinned memory for %lld bytes: lutra was built without CUDA", (long long)nbytes);
}
int lt_cuda_host_free(void *ptr) {
  return ptr ? lt_errorf("cuda_host_free: %p: lutra was built without CUDA", ptr) : 0;
}

static int no_cuda(const char *op) { return lt_errorf("%s: lutra was built without CUDA", op); }
int lt_cuda_event_create(void **event) {
  if (event) *event = NULL;
  return no_cuda("cuda_event_create");
}
int lt_cuda_event_destroy(void *event) { return event ? no_cuda("cuda_event_destroy") : 0; }
int lt_cuda_event_record(void *event, int device, int stream) {
  (void)event, (void)device, (void)stream;
  return no_cuda("cuda_event_record");
}
int lt_cuda_event_synchronize(void *event) { return event ? no_cuda("cuda_event_synchronize") : 0; }
int lt_cuda_event_query(void *event) { return event ? no_cuda("cuda_event_query") : 1; }
int lt_cuda_event_elapsed_ms(void *start, void *end, double *ms) {
  (void)start, (void)end;
  if (ms) *ms = 0;
  return no_cuda("cuda_event_elapsed_ms");
}
int lt_cuda_stream_wait_event(int device, int stream, void *event) {
  (void)device, (void)stream, (void)event;
  return no_cuda("cuda_stream_wait_event");
}
int lt_cuda_stream_synchronize(int device, int stream) {
  (void)device, (void)stream;
  return no_cuda("cuda_stream_synchronize");
}
int lt_cuda_stream_handle(int device, int stream, void **handle) {
  (void)device, (void)stream;
  if (handle) *handle = NULL;
  return no_cuda("cuda_stream_handle");
}
#endif
