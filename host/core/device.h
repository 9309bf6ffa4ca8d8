/* device.h — the core's one seam to a device runtime: what storages, tensors and copies need
 * of a CUDA device. lt_device_cuda() gives the table (host/core/cuda_device.cu), or NULL in a
 * build without CUDA; host/core/device.c is the core's one place that knows which. */
#ifndef LUTRA_CORE_DEVICE_H
#define LUTRA_CORE_DEVICE_H
#include "core/internal.h"
#include "core/caching_alloc.h"
#include "core/ew_geom.h"

typedef struct lt_device_runtime {
  /* LT_CUDA_READY with *count > 0, or why not (status says it) */
  int (*init_devices)(int *count, char *status, int status_len);
  int (*synchronize)(int device);
  int (*alloc)(int device, int64_t nbytes, void **ptr);
  void (*release)(int device, void *ptr);
  /* nbytes between any two of the host and the devices (synchronous) */
  int (*copy_bytes)(void *dst, int dst_device, const void *src, int src_device, int64_t nbytes);
  /* nbytes between pinned host memory and a device, on the device's copy stream */
  int (*copy_bytes_async)(void *dst, int dst_device, const void *src, int src_device, int64_t nbytes, void **done);
  /* dst = src on one device over g, converting dtypes (kernels/copy.cu) */
  int (*copy)(int device, const lt_ew_geom *g, void *dst, int dst_dtype, const void *src, int src_dtype);
  int (*fill)(int device, const lt_ew_geom *g, void *out, int dtype, double value);
  int (*sequence)(int device, void *out, int64_t stride, int dtype, int64_t n, double start, double step);
} lt_device_runtime;

const lt_device_runtime *lt_device_cuda(void);

/* The device kernels the core's copies and fills need (kernels/copy.cu, kernels/elementwise.cu
 * define them): dst = src over g converting dtypes, out = value, out[i] = start + i * step. */
int lt_cuda_copy(int device, const lt_ew_geom *g, void *dst, int dst_dtype, const void *src, int src_dtype);
int lt_cuda_fill(int device, const lt_ew_geom *g, void *out, int dtype, double value);
int lt_cuda_sequence(int device, void *out, int64_t stride, int dtype, int64_t n, double start, double step);

/* The caching allocator's figures of one CUDA device (lt_cuda_memory_stats: core/caching_alloc.h),
 * which lt_memory_get_stats passes on. */
int lt_cuda_get_memory_stats(int device, lt_cuda_memory_stats *stats);
int lt_cuda_reset_peak_memory_stats(int device);
int lt_cuda_empty_cache(int device); /* returns fully free segments to the device */

#endif
