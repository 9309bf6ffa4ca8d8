/* runtime.cu — the CUDA side of the device bridge (host/internal.h): device discovery,
 * raw allocation, copies and synchronisation. Caching and statistics live in
 * host/memory.c; this file only talks to the CUDA runtime.
 *
 * Everything here must behave on a machine with no GPU and no driver: the probe
 * reports count 0 with a reason, and nothing prints or aborts. */
#include "common.cuh"
#include <dlfcn.h>
#include <stdio.h>

enum { MAX_CUDA_DEVICES = 16 }; /* as host/memory.c */
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

/* Why there is no usable device, in words a user can act on. */
static void describe_failure(cudaError_t err, char *status, int status_len) {
  if (err == cudaErrorNoDevice) {
    snprintf(status, (size_t)status_len, "no CUDA device");
    return;
  }
  if (err == cudaErrorInsufficientDriver) {
    /* the runtime says this both when libcuda is missing and when it is too old */
    void *driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (!driver) {
      snprintf(status, (size_t)status_len, "no CUDA driver (libcuda.so.1 not found)");
      return;
    }
    dlclose(driver);
    int driver_version = 0, runtime_version = 0;
    cudaDriverGetVersion(&driver_version);
    cudaRuntimeGetVersion(&runtime_version);
    snprintf(status, (size_t)status_len, "CUDA driver too old: supports CUDA %d.%d, lutra was built with %d.%d",
             driver_version / 1000, driver_version % 1000 / 10, runtime_version / 1000, runtime_version % 1000 / 10);
    return;
  }
  snprintf(status, (size_t)status_len, "no usable CUDA device: %s (%s)", cudaGetErrorString(err),
           cudaGetErrorName(err));
}

int lt_cuda_init_devices(int *count, char *status, int status_len) {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess || n <= 0) {
    cudaGetLastError();
    describe_failure(err == cudaSuccess ? cudaErrorNoDevice : err, status, status_len);
    device_count = *count = 0;
    return 0;
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
  return 0;
}

int lt_cuda_alloc(int device, int64_t nbytes, void **ptr) {
  *ptr = NULL;
  LT_TRY(lt_cuda_use_device("cuda_alloc", device));
  /* an empty tensor still gets a real (tiny) block: NULL means out of memory to the caller */
  cudaError_t err = cudaMalloc(ptr, (size_t)(nbytes > 0 ? nbytes : 1));
  if (err == cudaSuccess) return 0;
  *ptr = NULL;
  cudaGetLastError();
  if (err == cudaErrorMemoryAllocation) {
    size_t free_bytes = 0, total_bytes = 0;
    cudaMemGetInfo(&free_bytes, &total_bytes);
    cudaGetLastError();
    return lt_errorf("cuda_alloc: out of memory on cuda:%d allocating %lld bytes (%lld of %lld bytes free)", device,
                     (long long)nbytes, (long long)free_bytes, (long long)total_bytes);
  }
  return lt_cuda_error("cuda_alloc", device, err);
}

void lt_cuda_free(int device, void *ptr) {
  if (!ptr || device < 0 || device >= device_count) return;
  if (cudaSetDevice(device) != cudaSuccess || cudaFree(ptr) != cudaSuccess) cudaGetLastError();
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
