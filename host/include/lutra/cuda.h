/* cuda.h — the C API, part: CUDA memory, pinned tensors, streams and events.
 * Include lutra.h, which includes every part in order (and cmake/gen_cdef.awk follows the
 * same order into the one ffi.cdef text); the conventions are at the head of lutra.h. */
#ifndef LUTRA_CUDA_H
#define LUTRA_CUDA_H

/* ---- CUDA memory (its figures: lt_memory_get_stats, lutra.h) ----------------- */
/* Page-locked host buffers for async copies, from a small cache. Free one only once
 * the copies using it have completed (synchronize the stream first). */
int lt_cuda_host_alloc(int64_t nbytes, void **ptr);
int lt_cuda_host_free(void *ptr);

/* ---- pinned tensors, streams and events --------------------------------------------
 * Each CUDA device has a compute stream (every op runs on it, in program order), a copy
 * stream (asynchronous host<->device copies) and a communication stream (NCCL). Work on
 * one stream is ordered after another's with events. Without CUDA these return an error
 * that says so (lt_empty_pinned, lt_copy_async) or do nothing (synchronize). */
enum { LT_STORAGE_PINNED = -2 }; /* lt_storage.device of a CPU tensor in page-locked memory */
typedef enum lt_stream_kind { LT_STREAM_COMPUTE = 0, LT_STREAM_COPY = 1 } lt_stream_kind;
/* A CPU tensor whose storage is page-locked, so copies to and from a GPU can be async. */
int lt_empty_pinned(lt_tensor *out, int ndim, const int64_t *shape, int dtype);
int lt_is_pinned(const lt_tensor *t);
/* dst = src between a pinned CPU tensor and a CUDA tensor (either way; same shape and
 * dtype, both contiguous), queued on the device's copy stream after the work its compute
 * stream has queued so far; returns at once. The compute stream waits for the copy before
 * its next op, and *done (when not NULL) is an event for the host to wait on before it
 * reads or reuses the CPU side. Any other pair of tensors falls back to lt_copy (sync). */
int lt_copy_async(lt_tensor *dst, const lt_tensor *src, void **done);
/* Events: create (with timing), record on a device's stream, wait from the host or from
 * another stream, query (1 complete, 0 pending), elapsed milliseconds between two. */
int lt_cuda_event_create(void **event);
int lt_cuda_event_destroy(void *event);
int lt_cuda_event_record(void *event, int device, int stream);
int lt_cuda_event_synchronize(void *event);
int lt_cuda_event_query(void *event);
int lt_cuda_event_elapsed_ms(void *start, void *end, double *ms);
int lt_cuda_stream_wait_event(int device, int stream, void *event);
int lt_cuda_stream_synchronize(int device, int stream);
/* The runtime's handle of a device's stream (a cudaStream_t, which is also the driver's
 * CUstream), for launches through the driver API (custom ops). */
int lt_cuda_stream_handle(int device, int stream, void **handle);

/* ---- kernels compiled at run time (custom ops' CUDA bodies, host/core/custom_op_cuda.c) ----
 * NVRTC and the driver (libcuda) are opened with dlopen on first use, so a build without the
 * CUDA toolkit has these and they say what is missing. lt_rtc_compile turns CUDA C source into
 * PTX: options are separated by newlines ("--gpu-architecture=compute_80\n-DLT_SCALAR=float").
 * On success *ptx (0-terminated) is set; on a compile error the status is -1, the error says
 * "nvrtc: compiling <name> failed" and *log holds NVRTC's log ("<name>(LINE): error: ...").
 * Free both with lt_rtc_free. lt_rtc_module_load loads PTX on a device (the primary context
 * that the runtime shares) and finds one kernel by name; lt_rtc_launch queues it on the
 * device's compute stream with one argument: the args_size bytes at args, by value.
 * Without a usable GPU these fail with "no GPU: ..." and why (no libcuda, no device). */
int lt_rtc_version(int *major, int *minor);
int lt_rtc_compile(const char *source, const char *name, const char *options, char **ptx, char **log);
void lt_rtc_free(char *p);
int lt_rtc_device_arch(int device, int *arch);
int lt_rtc_module_load(const char *ptx, const char *kernel, int device, void **function);
int lt_rtc_launch(void *function, int device, const uint32_t *grid, const uint32_t *block, uint32_t shared_bytes,
                  const void *args, int64_t args_size);

#endif
