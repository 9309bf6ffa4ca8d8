/* cuda_streams.cu — the streams of each device and the events that order them.
 *
 * compute: every kernel and GEMM. It is created blocking (cudaStreamDefault), so the
 *   synchronous copies of core/cuda_runtime.cu, which run on the legacy default stream, still wait
 *   for the kernels queued before them and are waited for by those after.
 * copy: asynchronous host<->device copies through pinned buffers (checkpoint staging,
 *   prefetch). Non-blocking; it waits for compute with an event before reading a tensor,
 *   and compute waits for it before using what it wrote.
 * The communication stream belongs to host/dist/nccl.cu and is ordered the same way. */
#include <cuda_runtime.h>
#include "core/cuda.h"
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

/* ---- events and the stream API of lutra.h ------------------------------------------------ */

static cudaStream_t stream_of(const char *op, int device, int kind, bool *ok) {
  *ok = false;
  if (kind != LT_STREAM_COMPUTE && kind != LT_STREAM_COPY) {
    lt_errorf("%s: unknown stream %d (0 compute, 1 copy)", op, kind);
    return (cudaStream_t)0;
  }
  if (lt_cuda_use_device(op, device) != 0 || !ensure_streams(op, device)) return (cudaStream_t)0;
  *ok = true;
  return kind == LT_STREAM_COPY ? streams[device].copy : streams[device].compute;
}

int lt_cuda_event_create(void **event) {
  if (!event) return lt_errorf("cuda_event_create: event is NULL");
  *event = NULL;
  cudaEvent_t ev;
  cudaError_t err = cudaEventCreate(&ev); /* with timing: events also time the benchmarks */
  if (err != cudaSuccess) return lt_cuda_error("cuda_event_create", -1, err);
  *event = (void *)ev;
  return 0;
}

int lt_cuda_event_destroy(void *event) {
  if (!event) return 0;
  cudaError_t err = cudaEventDestroy((cudaEvent_t)event);
  return err == cudaSuccess ? 0 : lt_cuda_error("cuda_event_destroy", -1, err);
}

int lt_cuda_event_record(void *event, int device, int stream) {
  if (!event) return lt_errorf("cuda_event_record: event is NULL");
  bool ok;
  cudaStream_t s = stream_of("cuda_event_record", device, stream, &ok);
  if (!ok) return -1;
  cudaError_t err = cudaEventRecord((cudaEvent_t)event, s);
  return err == cudaSuccess ? 0 : lt_cuda_error("cuda_event_record", device, err);
}

int lt_cuda_event_synchronize(void *event) {
  if (!event) return lt_errorf("cuda_event_synchronize: event is NULL");
  cudaError_t err = cudaEventSynchronize((cudaEvent_t)event);
  return err == cudaSuccess ? 0 : lt_cuda_error("cuda_event_synchronize", -1, err);
}

int lt_cuda_event_query(void *event) {
  if (!event) return lt_errorf("cuda_event_query: event is NULL");
  cudaError_t err = cudaEventQuery((cudaEvent_t)event);
  if (err == cudaSuccess) return 1;
  if (err == cudaErrorNotReady) {
    cudaGetLastError();
    return 0;
  }
  return lt_cuda_error("cuda_event_query", -1, err);
}

int lt_cuda_event_elapsed_ms(void *start, void *end, double *ms) {
  if (!start || !end || !ms) return lt_errorf("cuda_event_elapsed_ms: NULL argument");
  float f = 0;
  cudaError_t err = cudaEventElapsedTime(&f, (cudaEvent_t)start, (cudaEvent_t)end);
  if (err != cudaSuccess) return lt_cuda_error("cuda_event_elapsed_ms", -1, err);
  *ms = f;
  return 0;
}

int lt_cuda_stream_wait_event(int device, int stream, void *event) {
  if (!event) return lt_errorf("cuda_stream_wait_event: event is NULL");
  bool ok;
  cudaStream_t s = stream_of("cuda_stream_wait_event", device, stream, &ok);
  if (!ok) return -1;
  cudaError_t err = cudaStreamWaitEvent(s, (cudaEvent_t)event, 0);
  return err == cudaSuccess ? 0 : lt_cuda_error("cuda_stream_wait_event", device, err);
}

int lt_cuda_stream_synchronize(int device, int stream) {
  bool ok;
  cudaStream_t s = stream_of("cuda_stream_synchronize", device, stream, &ok);
  if (!ok) return -1;
  cudaError_t err = cudaStreamSynchronize(s);
  return err == cudaSuccess ? 0 : lt_cuda_error("cuda_stream_synchronize", device, err);
}

int lt_cuda_stream_handle(int device, int stream, void **handle) {
  if (!handle) return lt_errorf("cuda_stream_handle: handle is NULL");
  bool ok;
  cudaStream_t s = stream_of("cuda_stream_handle", device, stream, &ok);
  if (!ok) return -1;
  *handle = (void *)s;
  return 0;
}

/* The copy stream waits for compute (the source may still be being written, or the
 * destination read), copies, and compute waits for the copy (its next op may read the
 * destination). *done marks the copy for the host. */
extern "C" int lt_cuda_copy_async_raw(void *dst, int dst_device, const void *src, int src_device, int64_t nbytes,
                                      void **done) {
  const char *op = "copy_async";
  int device = dst_device >= 0 ? dst_device : src_device;
  bool ok;
  cudaStream_t copy = stream_of(op, device, LT_STREAM_COPY, &ok);
  if (!ok) return -1;
  cudaStream_t compute = streams[device].compute;
  cudaEvent_t before = NULL, after = NULL;
  cudaError_t err = cudaEventCreateWithFlags(&before, cudaEventDisableTiming);
  if (err == cudaSuccess) err = cudaEventCreateWithFlags(&after, cudaEventDisableTiming);
  if (err == cudaSuccess) err = cudaEventRecord(before, compute);
  if (err == cudaSuccess) err = cudaStreamWaitEvent(copy, before, 0);
  if (err == cudaSuccess)
    err = cudaMemcpyAsync(dst, src, (size_t)nbytes, dst_device >= 0 ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost,
                          copy);
  if (err == cudaSuccess) err = cudaEventRecord(after, copy);
  if (err == cudaSuccess) err = cudaStreamWaitEvent(compute, after, 0);
  if (before) cudaEventDestroy(before); /* released by the runtime once the wait is done */
  if (err != cudaSuccess) {
    if (after) cudaEventDestroy(after);
    return lt_cuda_error(op, device, err);
  }
  if (done)
    *done = (void *)after; /* the caller destroys it (lt_cuda_event_destroy) */
  else
    cudaEventDestroy(after);
  return 0;
}
