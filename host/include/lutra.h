/* lutra.h — the C API: the only contract between the C core and Lua.
 *
 * The map of the house (floors, who includes whom, one training step from recipe to kernel):
 * docs/ARCHITECTURE.md; the files an op touches, in order: docs/ADDING_AN_OP.md.
 *
 * Conventions:
 * - Plain declarations only, so that ffi.cdef can parse this file once the
 *   preprocessor lines are stripped (lt_api_cdef() returns exactly that text).
 * - Every entry point returns int status: 0 ok, -1 error. The message
 *   (lt_last_error(), thread-local) names the op, shapes, dtypes and devices.
 *   Nothing aborts on user error. Exceptions: lt_tensor_new() returns a
 *   pointer (NULL on out-of-memory), and the few pure queries named *_name,
 *   *_size, lt_is_* and lt_last_error return their value directly.
 * - Ops write into an output tensor the caller passes. If `out` is undefined
 *   (no storage, as lt_tensor_new() makes it) the op allocates it with the
 *   result's shape, dtype and device. If it is defined it must already have
 *   exactly that shape, dtype and device and is written in place (it may be a
 *   non-contiguous view); passing an input as `out` gives the in-place op.
 * - Tensors are refcounted (lt_retain/lt_release). A view shares the storage
 *   of its source: storages are refcounted too, with a byte offset.
 * - Shapes are int64_t arrays; dims may be negative (counted from the end).
 */
#ifndef LUTRA_H
#define LUTRA_H
#include <stddef.h>
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif

/* ---- types ---------------------------------------------------------------- */

enum { LT_MAX_DIMS = 8 };

typedef enum lt_dtype {
  LT_F32 = 0,
  LT_F64 = 1,
  LT_BF16 = 2,
  LT_F16 = 3,
  LT_I32 = 4,
  LT_I64 = 5,
  LT_U8 = 6,
  LT_BOOL = 7,
  LT_NUM_DTYPES = 8
} lt_dtype;

/* Devices are ints: LT_DEVICE_CPU, or k >= 0 for CUDA device k. */
enum { LT_DEVICE_CPU = -1 };

typedef struct lt_storage {
  void *data;
  int64_t nbytes;
  int32_t refcount;
  int32_t device;
} lt_storage;

typedef struct lt_tensor {
  lt_storage *storage; /* NULL: undefined (an `out` to be allocated) or freed */
  int64_t offset;      /* bytes from storage->data to element [0,...,0] */
  int64_t shape[8];    /* LT_MAX_DIMS */
  int64_t stride[8];   /* in elements, may be 0 (broadcast) */
  int32_t ndim;        /* 0 is a scalar holding one element */
  int32_t dtype;       /* lt_dtype */
  int32_t device;      /* LT_DEVICE_CPU or a CUDA ordinal */
  int32_t refcount;
  int32_t lua_slot;    /* the Lua binding's index of this tensor in its registry (lutra.memory), as PyTorch's
                        * TensorImpl keeps its Python object's slot: the C core never reads it, and an op
                        * that writes a view into `out` keeps out's */
} lt_tensor;

typedef struct lt_memory_stats {
  int64_t allocated;      /* bytes held by live storages */
  int64_t peak;           /* high-water mark of allocated since last reset */
  int64_t reserved;       /* bytes held from the system (>= allocated with caching) */
  int64_t num_allocs;     /* storages allocated so far */
  int64_t num_frees;      /* storages freed so far */
  int64_t since_collect;  /* bytes allocated since lt_memory_collected() */
  /* a CUDA device's caching allocator (0 on the CPU): blocks are requests rounded to 512 B (2 MiB
   * above 1 MiB), allocated/reserved/peak above count blocks and segments held from cudaMalloc */
  int64_t peak_reserved;  /* high-water mark of reserved since the last reset */
  int64_t cache_hits;     /* allocations served from the cache, without cudaMalloc */
  int64_t num_segments;   /* segments held now */
  int64_t segment_allocs; /* cudaMalloc calls that succeeded */
  int64_t segment_frees;  /* cudaFree calls */
  int64_t num_ooms;       /* allocations that failed for lack of memory */
} lt_memory_stats;

/* ---- runtime, errors, build ------------------------------------------------- */

const char *lt_last_error(void);
int lt_set_error(const char *message); /* lets callers (Lua) set a message; returns -1 */
void lt_clear_error(void);
const char *lt_version(void);
const char *lt_api_cdef(void);   /* this header without preprocessor lines */
const char *lt_build_info(void); /* multi-line: compiler, BLAS, OpenMP, CUDA, NCCL, MPI */
int lt_get_num_threads(void);
int lt_set_num_threads(int n);

const char *lt_dtype_name(int dtype);  /* "f32", ... or "?" */
int lt_dtype_size(int dtype);          /* bytes per element, 0 if unknown */
int lt_dtype_from_name(const char *name, int *dtype);

/* CUDA availability never fails: with no GPU, no driver or a CPU-only build the
 * count is 0 and lt_cuda_status() says why. lt_cuda_availability() tells the cases apart
 * for whoever must decide between "nothing to run on" and "something is broken" (lutra
 * selftest: skipped or failed): LT_CUDA_READY (count > 0), LT_CUDA_NOT_BUILT, LT_CUDA_NO_DEVICE
 * (no GPU, or no driver at all), LT_CUDA_BROKEN (a driver that is too old, fails to
 * initialise, or any other error from the runtime). */
enum { LT_CUDA_READY = 0, LT_CUDA_NOT_BUILT = 1, LT_CUDA_NO_DEVICE = 2, LT_CUDA_BROKEN = 3 };
int lt_cuda_device_count(void);
const char *lt_cuda_status(void);
int lt_cuda_availability(void);
/* TF32 tensor cores for f32 matmuls on CUDA (off by default, as PyTorch); no effect on the CPU. */
int lt_cuda_set_tf32(int enabled);
int lt_cuda_get_tf32(void);
int lt_cuda_synchronize(int device);

/* device: LT_DEVICE_CPU or a CUDA ordinal */
int lt_memory_get_stats(int device, lt_memory_stats *stats);
int lt_memory_reset_peak(int device);
int lt_memory_collected(int device); /* resets since_collect (after a Lua GC) */
int lt_memory_empty_cache(int device); /* returns cached free blocks to the system */
/* Direct pointer to the CPU counters, read by Lua on the hot path. */
const lt_memory_stats *lt_memory_cpu_counters(void);

/* ---- training runtime: wall clock, Ctrl-C as a flag (host/core/interrupt.c) ---------- */

/* Seconds on a monotonic clock (for rates and ETAs). */
double lt_wall_time(void);
/* While armed, SIGINT only sets a flag that lt_interrupt_pending reads (clear = 1 also
 * resets it), so a loop can stop between steps. A second SIGINT while the flag is set
 * restores the handler that was in force before arming and re-raises the signal to it.
 * lt_interrupt_disarm restores that handler too. */
int lt_interrupt_arm(void);
int lt_interrupt_pending(int clear);
int lt_interrupt_disarm(void);

/* ---- the parts (host/include/lutra/), in this order ---------------------------------- */
#include "lutra/tensor.h"
#include "lutra/ops.h"
#include "lutra/tok.h"
#include "lutra/dist.h"
#include "lutra/io.h"
#include "lutra/cuda.h"

#ifdef __cplusplus
}
#endif
#endif
