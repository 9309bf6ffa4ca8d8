/* internal.h — helpers shared by the C core (never seen by Lua). */
#ifndef LUTRA_INTERNAL_H
#define LUTRA_INTERNAL_H
#include "lutra.h"
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

/* ---- errors ---------------------------------------------------------------- */

/* Formats the thread-local error message; always returns -1. */
int lt_errorf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
#define LT_TRY(expr)                                                                                                   \
  do {                                                                                                                 \
    if ((expr) != 0) return -1;                                                                                        \
  } while (0)

/* Formats a shape as "[2,3,4]" into a buffer of at least LT_SHAPE_STR bytes. */
enum { LT_SHAPE_STR = 192 };
const char *lt_shape_str(char *buf, int ndim, const int64_t *shape);
/* "[2,3] f32 cpu" for messages; buf of LT_DESC_STR bytes. */
enum { LT_DESC_STR = 256 };
const char *lt_desc(char *buf, const lt_tensor *t);
const char *lt_device_str(char *buf, int device); /* "cpu" or "cuda:0"; buf >= 16 bytes */

/* Validates that t is defined (and names `what` in the error). */
int lt_check_defined(const char *op, const char *what, const lt_tensor *t);
int lt_check_same_device(const char *op, const lt_tensor *a, const lt_tensor *b);
int lt_check_same_dtype(const char *op, const lt_tensor *a, const lt_tensor *b);
bool lt_dtype_is_float(int dtype); /* f32, f64, bf16, f16 */
/* Normalises a possibly negative dim against ndim; -1 with error on range. */
int lt_wrap_dim(const char *op, int dim, int ndim, int *wrapped);

/* Makes `out` ready to receive a result of (ndim, shape, dtype, device): allocates it
 * when undefined, else checks it matches exactly (error names the op). */
int lt_prepare_out(const char *op, lt_tensor *out, int ndim, const int64_t *shape, int dtype, int device);
int lt_prepare_out_like(const char *op, lt_tensor *out, const lt_tensor *like, int dtype);

/* ---- geometry ---------------------------------------------------------------- */

int64_t lt_shape_numel(int ndim, const int64_t *shape);
void lt_contiguous_strides(int ndim, const int64_t *shape, int64_t *stride);
/* Strides of t seen through the broadcast shape (ndim, shape): 0 on expanded dims.
 * t's shape must broadcast to it (checked by the caller). */
void lt_broadcast_strides(const lt_tensor *t, int ndim, const int64_t *shape, int64_t *stride);
bool lt_same_shape(const lt_tensor *a, const lt_tensor *b);

/* Element offset (in elements, from the tensor's base) of the linear index i taken in
 * row-major order over shape with the given strides. */
static inline int64_t lt_offset_of(int64_t i, int ndim, const int64_t *shape, const int64_t *stride) {
  int64_t off = 0;
  for (int d = ndim - 1; d >= 0; d--) {
    int64_t n = shape[d];
    off += (i % n) * stride[d];
    i /= n;
  }
  return off;
}

/* Loops over all elements with up to three operands sharing one shape but each with its
 * own strides. The innermost dim is exposed as a run (inner_n, inner strides) so that
 * loops vectorise when strides are 1. Dims are coalesced where strides allow. */
typedef struct lt_strided_loop {
  int ndim; /* after coalescing, >= 1 */
  int64_t shape[LT_MAX_DIMS];
  int64_t stride[3][LT_MAX_DIMS];
  int noperands;
} lt_strided_loop;
void lt_loop_init(lt_strided_loop *L, int ndim, const int64_t *shape, int noperands, const int64_t *const *strides);
/* Offsets (elements) of each operand at the start of outer row r, r in [0, outer_rows). */
int64_t lt_loop_outer_rows(const lt_strided_loop *L);
void lt_loop_row_offsets(const lt_strided_loop *L, int64_t r, int64_t *offsets);

/* ---- dtype conversion -------------------------------------------------------- */

/* The 16-bit conversions compile for the GPU too (kernels/ include this header), so both
 * sides round identically. */
#ifdef __CUDACC__
#define LT_HOST_DEVICE __host__ __device__
#else
#define LT_HOST_DEVICE
#endif

LT_HOST_DEVICE static inline float lt_bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
LT_HOST_DEVICE static inline uint16_t lt_f32_to_bf16(float f) { /* round to nearest even; NaN stays NaN */
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
LT_HOST_DEVICE static inline float lt_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else { /* subnormal: normalise */
      exp = 127 - 15 + 1;
      while (!(man & 0x400u)) {
        man <<= 1;
        exp--;
      }
      u = sign | (exp << 23) | ((man & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (man << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  memcpy(&f, &u, 4);
  return f;
}
LT_HOST_DEVICE static inline uint16_t lt_f32_to_f16(float f) { /* round to nearest even */
  uint32_t u;
  memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);  /* NaN */
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* overflow to inf */
  if (a < 0x38800000u) {                                   /* subnormal or zero in f16 */
    if (a < 0x33000000u) return (uint16_t)sign;
    uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u;
    int shift = 126 - (int)e; /* 14..24 */
    uint32_t half = 1u << (shift - 1), rem = m & ((1u << shift) - 1), r = m >> shift;
    if (rem > half || (rem == half && (r & 1u))) r++;
    return (uint16_t)(sign | r);
  }
  uint32_t r = ((a >> 13) - ((127 - 15) << 10));
  uint32_t rem = a & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) r++;
  return (uint16_t)(sign | r);
}

/* Reads element i (an element offset) of a buffer of the given dtype as double/float. */
static inline double lt_load_f64(const void *p, int dtype, int64_t i) {
  switch (dtype) {
  case LT_F32: return ((const float *)p)[i];
  case LT_F64: return ((const double *)p)[i];
  case LT_BF16: return lt_bf16_to_f32(((const uint16_t *)p)[i]);
  case LT_F16: return lt_f16_to_f32(((const uint16_t *)p)[i]);
  case LT_I32: return ((const int32_t *)p)[i];
  case LT_I64: return (double)((const int64_t *)p)[i];
  case LT_U8: return ((const uint8_t *)p)[i];
  case LT_BOOL: return ((const uint8_t *)p)[i] != 0;
  default: return 0;
  }
}
static inline void lt_store_f64(void *p, int dtype, int64_t i, double v) {
  switch (dtype) {
  case LT_F32: ((float *)p)[i] = (float)v; break;
  case LT_F64: ((double *)p)[i] = v; break;
  case LT_BF16: ((uint16_t *)p)[i] = lt_f32_to_bf16((float)v); break;
  case LT_F16: ((uint16_t *)p)[i] = lt_f32_to_f16((float)v); break;
  case LT_I32: ((int32_t *)p)[i] = (int32_t)v; break;
  case LT_I64: ((int64_t *)p)[i] = (int64_t)v; break;
  case LT_U8: ((uint8_t *)p)[i] = (uint8_t)v; break;
  case LT_BOOL: ((uint8_t *)p)[i] = v != 0; break;
  default: break;
  }
}
static inline int64_t lt_load_i64(const void *p, int dtype, int64_t i) {
  switch (dtype) {
  case LT_I32: return ((const int32_t *)p)[i];
  case LT_I64: return ((const int64_t *)p)[i];
  case LT_U8:
  case LT_BOOL: return ((const uint8_t *)p)[i];
  default: return (int64_t)lt_load_f64(p, dtype, i);
  }
}

/* ---- fused CPU kernels (host/ops/fused_rows.c) ------------------------------------------ */

/* Row of n values at element offset off as floats: the data itself for f32, else converted
 * from bf16/f16 into scratch. */
const float *lt_load_row_f32(const void *base, int dtype, int64_t off, int64_t n, float *scratch);
void lt_store_row_f32(void *base, int dtype, int64_t off, const float *src, int64_t n); /* bf16/f16 */
/* A contiguous tensor to compute a result into: `out` itself when it is contiguous (allocated
 * if undefined), else a temporary that lt_out_finish copies back and releases. NULL on error;
 * `what` names the output in errors ("out", "rstd", ...). */
lt_tensor *lt_out_begin(const char *op, const char *what, lt_tensor *out, int ndim, const int64_t *shape, int dtype);
int lt_out_finish(lt_tensor *out, lt_tensor *work, int rc);
/* Optimizer steps update in place through a contiguous tensor: t itself (a view), or a copy
 * that lt_finish_inplace writes back and releases. */
lt_tensor *lt_begin_inplace(lt_tensor *t);
int lt_finish_inplace(lt_tensor *t, lt_tensor *c, int rc);

/* ---- memory and devices --------------------------------------------------------- */

/* Allocates a storage of nbytes on device (CPU: 64-byte aligned). Error on OOM names op. */
lt_storage *lt_storage_alloc(const char *op, int64_t nbytes, int device);
void lt_storage_release(lt_storage *s);

/* Work split for OpenMP: parallelise only when there is enough to do. */
enum { LT_PAR_GRAIN = 32768 };
/* Runs part(job, tid, nthreads) on every thread of an OpenMP team when `parallel`, else
 * once as part(job, 0, 1) with no OpenMP construct at all (host/core/parallel.c says why).
 * Returns nonzero when any part did (out of memory, by convention). */
int lt_run_parts(int (*part)(void *job, int tid, int nthreads), void *job, bool parallel);

/* ---- CUDA bridge (kernels/, present when built with CUDA) ----------------------- */
int lt_cuda_alloc(int device, int64_t nbytes, void **ptr);
void lt_cuda_free(int device, void *ptr);
int lt_cuda_memcpy(void *dst, int dst_device, const void *src, int src_device, int64_t nbytes);
int lt_cuda_fill_contig(int device, void *data, int dtype, int64_t n, double value);
int lt_cuda_add_contig(int device, void *out, const void *a, const void *b, int dtype, int64_t n);
int lt_cuda_convert_contig(int device, void *dst, int dst_dtype, const void *src, int src_dtype, int64_t n);
/* Returns LT_CUDA_READY with *count > 0, or LT_CUDA_NO_DEVICE / LT_CUDA_BROKEN with *count 0;
 * status says which devices, or why there are none. */
int lt_cuda_init_devices(int *count, char *status, int status_len);
int lt_cuda_device_synchronize(int device);

/* TF32 for f32 matmuls on CUDA (off by default, as PyTorch); the flag lives in host/ops/matmul.c
 * so that it exists without CUDA too. set returns 0; get returns 0 or 1. */
int lt_cuda_set_tf32(int enabled);
int lt_cuda_get_tf32(void);

#endif
