/* cuda.h — what the CUDA side of the core (core/cuda_runtime.cu, cuda_streams.cu, cuda_device.cu)
 * and every kernel share: error reporting, the current device, stream-ordered scratch memory,
 * the compute stream and the launch geometry. C++ only: include <cuda_runtime.h> first (the
 * CUDA emulator of tests/c/cuda_emu puts its own runtime there). */
#ifndef LUTRA_CORE_CUDA_H
#define LUTRA_CORE_CUDA_H
#include <math.h> /* before core/internal.h: C++ system headers must not get C linkage */
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

extern "C" {
#include "core/internal.h"
}

/* ---- errors --------------------------------------------------------------------- */

/* Sets the lutra error "<op>: CUDA error on cuda:<device>: <text> (<name>)" and
 * returns -1. Clears the runtime's last-error slot so that the next call starts clean. */
int lt_cuda_error(const char *op, int device, cudaError_t err);

/* Makes `device` current for this thread after checking it exists. */
int lt_cuda_use_device(const char *op, int device);

/* Device scratch from the caching allocator, ordered on `stream` (host/core/cuda_runtime.cu). */
extern "C" int lt_cuda_alloc_stream(int device, int64_t nbytes, void *stream, void **ptr);

/* Checks a kernel launch (configuration errors show up here; faults inside the kernel
 * show up at the next synchronising call). */
static inline int lt_cuda_check_launch(const char *op, int device) {
  cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? 0 : lt_cuda_error(op, device, err);
}

/* ---- streams -------------------------------------------------------------------------- */

/* The compute stream of `device`: every kernel and cuBLASLt call of an op is queued on it,
 * so ops run in program order without host synchronisation. The communication (NCCL) and
 * copy streams order themselves after it with events (host/core/cuda_runtime.cu). */
cudaStream_t lt_cuda_compute_stream(int device);

/* ---- launch geometry -------------------------------------------------------------- */

enum { LT_CUDA_THREADS = 256 };

#endif
