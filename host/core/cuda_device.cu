/* cuda_device.cu — the CUDA device table (host/core/device.h): the runtime glue of
 * core/cuda_runtime.cu and core/cuda_streams.cu, and the copy kernels of kernels/copy.cu. */
extern "C" {
#include "core/device.h"
int lt_cuda_copy_async_raw(void *dst, int dst_device, const void *src, int src_device, int64_t nbytes, void **done);
}

/* in the struct's order (C++17 has no designated initializers) */
extern "C" const lt_device_runtime lt_device_runtime_cuda = {
    lt_cuda_init_devices, lt_cuda_device_synchronize, lt_cuda_alloc, lt_cuda_free,
    lt_cuda_memcpy,       lt_cuda_copy_async_raw,     lt_cuda_copy,  lt_cuda_fill,
    lt_cuda_sequence,
};
