/* cuda_runtime.cu — the CUDA side of the device bridge (host/core/internal.h): device discovery,
 * device memory through the stream-ordered caching allocator (host/core/caching_alloc.c) over
 * cudaMalloc, pinned host buffers, copies and synchronisation.
 *
 * Everything here must behave on a machine with no GPU and no driver: the probe
 * reports count 0 with a reason, and nothing prints or aborts. */
#include <cuda_runtime.h>
#include "core/cuda.h"
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
extern "C" {
#include "core/caching_alloc.h"
extern "C" {
#include "core/device.h"
}
}

enum { MAX_CUDA_DEVICES = 16 }; /* as host/core/memory.c */
static int device_count;
static int sm_count[MAX_CUDA_DEVICES];

int lt_cuda_error(const char *op, int device, cudaError_t err) {
  cudaGetLastError(); /* the failure is reported now; do not let it leak into the next check */
  return lt_errorf("%s: CUDA error on cuda:%d: %s (%s)", op, device, cudaGetErrorString(err), cudaGetErrorName(err));
}

int lt_cuda_use_device(const char *op, int device) {
  if (device < 0 || device >= device_count)
    return lt_errorf("%s: device cuda:%d is not available (%d CUDA devices)", op, device, device_count);
  cudaError_t err = cudaSetDevice(device);
  return err == cudaSuccess ? 0 : lt_cuda_error(op, device, err);
}

int lt_cuda_blocks(int device, int64_t work) {
  int64_t needed = (work + LT_CUDA_THREADS - 1) / LT_CUDA_THREADS;
  int64_t cap = (int64_t)(device >= 0 && device < MAX_CUDA_DEVICES && sm_count[device] ? sm_count[device] : 108) * 8;
  return (int)(needed < 1 ? 1 : needed < cap ? needed : cap);
}

/* Why there is no usable device, in words a user can act on. Returns LT_CUDA_NO_DEVICE
 * where this machine has no GPU to offer (no device; no driver installed, as on any machine
 * without a GPU), LT_CUDA_BROKEN where a driver is there but does not work. */
static int describe_failure(cudaError_t err, char *status, int status_len) {
  if (err == cudaErrorNoDevice) {
    snprintf(status, (size_t)status_len, "no CUDA device");
    return LT_CUDA_NO_DEVICE;
  }
  if (err == cudaErrorInsufficientDriver) {
    /* the runtime says this both when libcuda is missing and when it is too old */
    void *driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (!driver) {
      snprintf(status, (size_t)status_len, "no CUDA driver (libcuda.so.1 not found)");
      return LT_CUDA_NO_DEVICE;
    }
    dlclose(driver);
    int driver_version = 0, runtime_version = 0;
    cudaDriverGetVersion(&driver_version);
    cudaRuntimeGetVersion(&runtime_version);
    snprintf(status, (size_t)status_len, "CUDA driver too old: supports CUDA %d.%d, lutra was built with %d.%d",
             driver_version / 1000, driver_version % 1000 / 10, runtime_version / 1000, runtime_version % 1000 / 10);
    return LT_CUDA_BROKEN;
  }
  snprintf(status, (size_t)status_len, "no usable CUDA device: %s (%s)", cudaGetErrorString(err),
           cudaGetErrorName(err));
  return LT_CUDA_BROKEN;
}

int lt_cuda_init_devices(int *count, char *status, int status_len) {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess || n <= 0) {
    cudaGetLastError();
    device_count = *count = 0;
    return describe_failure(err == cudaSuccess ? cudaErrorNoDevice : err, status, status_len);
  }
  if (n > MAX_CUDA_DEVICES) n = MAX_CUDA_DEVICES;
  /* "1 CUDA device: cuda:0 NVIDIA H200 (sm_90, 140 GiB)" */
  int len = snprintf(status, (size_t)status_len, "%d CUDA device%s:", n, n > 1 ? "s" : "");
  for (int d = 0; d < n; d++) {
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, d) != cudaSuccess) {
      cudaGetLastError();
      continue;
    }
    sm_count[d] = prop.multiProcessorCount;
    if (len >= 0 && len < status_len)
      len += snprintf(status + len, (size_t)(status_len - len), "%s cuda:%d %s (sm_%d%d, %.0f GiB)", d ? "," : "", d,
                      prop.name, prop.major, prop.minor, (double)prop.totalGlobalMem / (1 << 30));
  }
  device_count = *count = n;
  return LT_CUDA_READY;
}

/* ---- device memory: the caching allocator (host/core/caching_alloc.c) over cudaMalloc ------
 * One allocator per device, made on first use. Its backend context is the device
 * ordinal; every callback selects the device first. Events for stream-ordered reuse come
 * from a small per-device pool, since one is recorded at every free. */
enum { EVENT_POOL = 256 };
typedef struct device_allocator {
  lt_caching_alloc ca;
  bool ready;
  cudaEvent_t spare_events[EVENT_POOL];
  int nspare;
  pthread_mutex_t event_lock;
} device_allocator;
static device_allocator allocators[MAX_CUDA_DEVICES];
static pthread_mutex_t allocators_lock = PTHREAD_MUTEX_INITIALIZER;

static int ctx_device(void *ctx) { return (int)(intptr_t)ctx; }

static void *device_raw_alloc(void *ctx, size_t nbytes) {
  void *p = NULL;
  if (cudaSetDevice(ctx_device(ctx)) != cudaSuccess || cudaMalloc(&p, nbytes) != cudaSuccess) {
    cudaGetLastError();
    return NULL;
  }
  return p;
}

static void device_raw_free(void *ctx, void *ptr) {
  if (cudaSetDevice(ctx_device(ctx)) != cudaSuccess || cudaFree(ptr) != cudaSuccess) cudaGetLastError();
}

static void *device_record_event(void *ctx, void *stream) {
  int device = ctx_device(ctx);
  device_allocator *a = &allocators[device];
  cudaEvent_t ev = NULL;
  pthread_mutex_lock(&a->event_lock);
  if (a->nspare) ev = a->spare_events[--a->nspare];
  pthread_mutex_unlock(&a->event_lock);
  if (cudaSetDevice(device) != cudaSuccess ||
      (!ev && cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) != cudaSuccess)) {
    cudaGetLastError();
    if (ev) cudaEventDestroy(ev);
    return NULL; /* the block is then reused only on its own stream */
  }
  if (cudaEventRecord(ev, (cudaStream_t)stream) != cudaSuccess) {
    cudaGetLastError();
    cudaEventDestroy(ev);
    return NULL;
  }
  return (void *)ev;
}

static int device_query_event(void *ctx, void *event) {
  (void)ctx;
  cudaError_t err = cudaEventQuery((cudaEvent_t)event);
  if (err == cudaSuccess) return 1;
  cudaGetLastError(); /* cudaErrorNotReady, or a failure: keep waiting either way */
  return 0;
}

static void device_release_event(void *ctx, void *event) {
  device_allocator *a = &allocators[ctx_device(ctx)];
  pthread_mutex_lock(&a->event_lock);
  bool kept = a->nspare < EVENT_POOL;
  if (kept) a->spare_events[a->nspare++] = (cudaEvent_t)event;
  pthread_mutex_unlock(&a->event_lock);
  if (!kept) cudaEventDestroy((cudaEvent_t)event);
}

/* The allocator of a device, or NULL with an error for a device that does not exist. */
static lt_caching_alloc *allocator_of(const char *op, int device) {
  if (device < 0 || device >= device_count) {
    lt_errorf("%s: device cuda:%d is not available (%d CUDA devices)", op, device, device_count);
    return NULL;
  }
  device_allocator *a = &allocators[device];
  pthread_mutex_lock(&allocators_lock);
  if (!a->ready) {
    lt_ca_backend backend = {(void *)(intptr_t)device, device_raw_alloc,   device_raw_free,
                             device_record_event,      device_query_event, device_release_event};
    char name[24];
    snprintf(name, sizeof name, "cuda:%d", device);
    pthread_mutex_init(&a->event_lock, NULL);
    a->ready = lt_ca_init(&a->ca, &backend, name) == 0;
  }
  pthread_mutex_unlock(&allocators_lock);
  return a->ready ? &a->ca : NULL;
}

int lt_cuda_alloc_stream(int device, int64_t nbytes, void *stream, void **ptr) {
  *ptr = NULL;
  if (nbytes < 0) return lt_errorf("cuda_alloc: negative size %lld", (long long)nbytes);
  lt_caching_alloc *ca = allocator_of("cuda_alloc", device);
  if (!ca) return -1;
  /* an empty tensor still gets a real (tiny) block: NULL means out of memory to the caller */
  if (lt_ca_alloc(ca, (size_t)(nbytes > 0 ? nbytes : 1), stream, ptr) == 0) return 0;
  char message[400];
  snprintf(message, sizeof message, "%s", lt_last_error());
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaSetDevice(device) != cudaSuccess || cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
    cudaGetLastError();
    return lt_errorf("%s", message);
  }
  return lt_errorf("%s; the device has %.2f of %.2f GiB free", message, (double)free_bytes / (1 << 30),
                   (double)total_bytes / (1 << 30));
}

int lt_cuda_alloc(int device, int64_t nbytes, void **ptr) { return lt_cuda_alloc_stream(device, nbytes, NULL, ptr); }

void lt_cuda_free(int device, void *ptr) {
  if (!ptr || device < 0 || device >= device_count) return;
  lt_caching_alloc *ca = allocator_of("cuda_free", device);
  if (ca && lt_ca_free(ca, ptr) == 0) return;
  /* not from the allocator: hand it to cudaFree as before */
  lt_clear_error();
  if (cudaSetDevice(device) != cudaSuccess || cudaFree(ptr) != cudaSuccess) cudaGetLastError();
}

int lt_cuda_get_memory_stats(int device, lt_cuda_memory_stats *stats) {
  if (!stats) return lt_errorf("memory_stats: NULL stats");
  memset(stats, 0, sizeof *stats);
  lt_caching_alloc *ca = allocator_of("memory_stats", device);
  if (!ca) return -1;
  lt_ca_get_stats(ca, stats);
  return 0;
}

int lt_cuda_reset_peak_memory_stats(int device) {
  lt_caching_alloc *ca = allocator_of("reset_peak_memory_stats", device);
  if (!ca) return -1;
  lt_ca_reset_peak(ca);
  return 0;
}

int lt_cuda_empty_cache(int device) {
  lt_caching_alloc *ca = allocator_of("empty_cache", device);
  return ca ? lt_ca_empty_cache(ca) : -1;
}

/* ---- pinned host buffers: the same allocator over cudaHostAlloc, on one stream ------
 * (no events: a buffer is reused at once, so callers free it after its copies finished).
 * The cache keeps at most PINNED_CACHE_MAX bytes free. */
static const int64_t PINNED_CACHE_MAX = (int64_t)256 << 20;
static lt_caching_alloc pinned;
static bool pinned_ready;

static void *pinned_raw_alloc(void *ctx, size_t nbytes) {
  (void)ctx;
  void *p = NULL;
  if (cudaHostAlloc(&p, nbytes, cudaHostAllocPortable) != cudaSuccess) {
    cudaGetLastError();
    return NULL;
  }
  return p;
}

static void pinned_raw_free(void *ctx, void *ptr) {
  (void)ctx;
  if (cudaFreeHost(ptr) != cudaSuccess) cudaGetLastError();
}

static lt_caching_alloc *pinned_allocator(const char *op) {
  if (device_count == 0) {
    lt_errorf("%s: no CUDA device for pinned host memory", op);
    return NULL;
  }
  pthread_mutex_lock(&allocators_lock);
  if (!pinned_ready) {
    lt_ca_backend backend = {NULL, pinned_raw_alloc, pinned_raw_free, NULL, NULL, NULL};
    pinned_ready = lt_ca_init(&pinned, &backend, "cuda_host:pinned") == 0;
  }
  pthread_mutex_unlock(&allocators_lock);
  return pinned_ready ? &pinned : NULL;
}

int lt_cuda_host_alloc(int64_t nbytes, void **ptr) {
  if (!ptr) return lt_errorf("cuda_host_alloc: NULL result pointer");
  *ptr = NULL;
  if (nbytes <= 0) return lt_errorf("cuda_host_alloc: size must be positive, got %lld", (long long)nbytes);
  lt_caching_alloc *ca = pinned_allocator("cuda_host_alloc");
  return ca ? lt_ca_alloc(ca, (size_t)nbytes, NULL, ptr) : -1;
}

int lt_cuda_host_free(void *ptr) {
  if (!ptr) return 0;
  lt_caching_alloc *ca = pinned_allocator("cuda_host_free");
  if (!ca) return -1;
  LT_TRY(lt_ca_free(ca, ptr));
  lt_ca_stats st;
  lt_ca_get_stats(ca, &st);
  return st.reserved - st.allocated > PINNED_CACHE_MAX ? lt_ca_empty_cache(ca) : 0;
}

/* Copies nbytes between any two places (CPU or a CUDA device); synchronous. */
int lt_cuda_memcpy(void *dst, int dst_device, const void *src, int src_device, int64_t nbytes) {
  if (nbytes < 0) return lt_errorf("memcpy: negative size %lld", (long long)nbytes);
  if (nbytes == 0) return 0;
  if (!dst || !src) return lt_errorf("memcpy: NULL pointer (%lld bytes)", (long long)nbytes);
  size_t size = (size_t)nbytes;
  cudaError_t err;
  int device = dst_device >= 0 ? dst_device : src_device;
  if (dst_device < 0 && src_device < 0) {
    memcpy(dst, src, size);
    return 0;
  }
  if (dst_device >= 0 && src_device >= 0 && dst_device != src_device) {
    LT_TRY(lt_cuda_use_device("memcpy", src_device));
    LT_TRY(lt_cuda_use_device("memcpy", dst_device));
    err = cudaMemcpyPeer(dst, dst_device, src, src_device, size);
  } else {
    LT_TRY(lt_cuda_use_device("memcpy", device));
    cudaMemcpyKind kind = dst_device < 0   ? cudaMemcpyDeviceToHost
                          : src_device < 0 ? cudaMemcpyHostToDevice
                                           : cudaMemcpyDeviceToDevice;
    err = cudaMemcpy(dst, src, size, kind);
  }
  return err == cudaSuccess ? 0 : lt_cuda_error("memcpy", device, err);
}

int lt_cuda_device_synchronize(int device) {
  LT_TRY(lt_cuda_use_device("cuda_synchronize", device));
  cudaError_t err = cudaDeviceSynchronize();
  return err == cudaSuccess ? 0 : lt_cuda_error("cuda_synchronize", device, err);
}
