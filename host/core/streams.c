/* streams.c — asynchronous copies between pinned CPU tensors and CUDA tensors, and the
 * event/stream API where lutra is built without CUDA (host/core/cuda_streams.cu has the real one).
 *
 * lt_copy_async checks its operands here, so that the rules and messages are the same with
 * and without CUDA, and hands the raw copy to the device side. */
#include "core/internal.h"

#ifdef LUTRA_HAVE_CUDA
/* host/core/cuda_streams.cu: nbytes from src to dst on device's copy stream (see lutra.h). */
int lt_cuda_copy_async_raw(void *dst, int dst_device, const void *src, int src_device, int64_t nbytes, void **done);
#endif

/* A pinned CPU tensor and a CUDA tensor, same shape and dtype, both contiguous. */
static bool async_pair(const lt_tensor *dst, const lt_tensor *src) {
  bool down = dst->device == LT_DEVICE_CPU && src->device >= 0; /* device -> host */
  bool up = src->device == LT_DEVICE_CPU && dst->device >= 0;
  const lt_tensor *host = down ? dst : src;
  return (down || up) && lt_is_pinned(host) && lt_same_shape(dst, src) && dst->dtype == src->dtype &&
         lt_is_contiguous(dst) && lt_is_contiguous(src);
}

int lt_copy_async(lt_tensor *dst, const lt_tensor *src, void **done) {
  if (done) *done = NULL;
  LT_TRY(lt_check_defined("copy_async", "dst", dst));
  LT_TRY(lt_check_defined("copy_async", "src", src));
  if (!async_pair(dst, src)) return lt_copy(dst, src); /* nothing to overlap: the plain copy */
#ifdef LUTRA_HAVE_CUDA
  return lt_cuda_copy_async_raw(lt_data_ptr(dst), dst->device, lt_data_ptr(src), src->device,
                                lt_numel(src) * lt_dtype_size(src->dtype), done);
#else
  return lt_errorf("copy_async: lutra was built without CUDA");
#endif
}

#ifndef LUTRA_HAVE_CUDA
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
#endif
