/* streams.c — asynchronous copies between pinned CPU tensors and CUDA tensors (the event and
 * stream API is host/core/cuda_streams.cu's, or device.c's refusals without CUDA).
 *
 * lt_copy_async checks its operands here, so that the rules and messages are the same with
 * and without CUDA, and hands the raw copy to the device side. */
#include "core/device.h"

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
  const lt_device_runtime *rt = lt_device_cuda();
  if (!rt) return lt_errorf("copy_async: lutra was built without CUDA");
  return rt->copy_bytes_async(lt_data_ptr(dst), dst->device, lt_data_ptr(src), src->device,
                              lt_numel(src) * lt_dtype_size(src->dtype), done);
}
