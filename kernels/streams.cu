/* streams.cu — the streams of each device and the events that order them.
 *
 * compute: every kernel and GEMM. It is created blocking (cudaStreamDefault), so the
 *   synchronous copies of runtime.cu, which run on the legacy default stream, still wait
 *   for the kernels queued before them and are waited for by those after.
 * copy: asynchronous host<->device copies through pinned buffers (checkpoint staging,
 *   prefetch). Non-blocking; it waits for compute with an event before reading a tensor,
 *   and compute waits for it before using what it wrote.
 * The communication stream belongs to kernels/comm_nccl.cu and is ordered the same way. */
#include "common.cuh"
#include <pthread.h>

enum { MAX_STREAM_DEVICES = 16 };
typedef struct device_streams {
  cudaStream_t compute, copy;
  bool ready;
} device_streams;
static device_streams streams[MAX_STREAM_DEVICES];
static pthread_mutex_t streams_lock = PTHREAD_MUTEX_INITIALIZER;

/* Creates the streams of device on first use; false (with the error set) when it cannot. */
static bool ensure_streams(const char *op, int device) {
  if (device < 0 || device >= MAX_STREAM_DEVICES) {
    lt_errorf("%s: device cuda:%d is out of range", op, device);
    return false;
  }
  device_streams *s = &streams[device];
  pthread_mutex_lock(&streams_lock);
  bool ok = s->ready;
  if (!ok && lt_cuda_use_device(op, device) == 0) {
    cudaError_t err = cudaStreamCreateWithFlags(&s->compute, cudaStreamDefault);
    if (err == cudaSuccess) err = cudaStreamCreateWithFlags(&s->copy, cudaStreamNonBlocking);
    if (err == cudaSuccess)
      ok = s->ready = true;
    else
      lt_cuda_error(op, device, err);
  }
  pthread_mutex_unlock(&streams_lock);
  return ok;
}

cudaStream_t lt_cuda_compute_stream(int device) {
  /* a failure leaves the legacy default stream, which is still correct, only serialised */
  return ensure_streams("cuda_stream", device) ? streams[device].compute : (cudaStream_t)0;
}

cudaStream_t lt_cuda_copy_stream(int device) {
  return ensure_streams("cuda_stream", device) ? streams[device].copy : (cudaStream_t)0;
}
