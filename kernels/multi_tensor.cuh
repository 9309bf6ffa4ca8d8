/* multi_tensor.cuh — the device side that the optimizer kernels (kernels/adamw.cu, lion.cu,
 * multi_tensor.cu) share: element access in f32 and f64, the grid of a loop over chunks, and the
 * upload of a multi-tensor call's table of entries (kernels/multi_tensor.h). */
#ifndef LUTRA_KERNELS_MULTI_TENSOR_CUH
#define LUTRA_KERNELS_MULTI_TENSOR_CUH
#include "kernels/common.cuh"
extern "C" {
#include "kernels/multi_tensor.h"
}

/* Copies `bytes` of `table` into *dev, a device buffer of the caching allocator ordered on
 * `stream`, through a pinned staging slot (kernels/multi_tensor.cu); the caller frees it with
 * lt_cuda_free after queueing its kernels. */
int lt_cuda_upload_entries(const char *op, int device, cudaStream_t stream, const void *table, int64_t bytes,
                           void **dev);

/* Blocks for a loop over `chunks` chunks, one block per chunk up to a cap. */
static inline unsigned chunk_blocks(int64_t chunks) { return (unsigned)(chunks < (1 << 20) ? chunks : (1 << 20)); }

/* Element i of an f32, bf16 or f16 buffer as f32 (exact). */
static __device__ __forceinline__ float load_f32(const void *p, int dtype, int64_t i) {
  if (dtype == LT_F32) return ((const float *)p)[i];
  if (dtype == LT_BF16) return lt_bf16_to_f32(((const uint16_t *)p)[i]);
  return lt_f16_to_f32(((const uint16_t *)p)[i]);
}
/* Stores x rounded to an f32, bf16 or f16 buffer. */
static __device__ __forceinline__ void store_f32(void *p, int dtype, int64_t i, float x) {
  if (dtype == LT_F32)
    ((float *)p)[i] = x;
  else if (dtype == LT_BF16)
    ((uint16_t *)p)[i] = lt_f32_to_bf16(x);
  else
    ((uint16_t *)p)[i] = lt_f32_to_f16(x);
}
static __device__ __forceinline__ double load_f64(const void *p, int dtype, int64_t i) {
  return dtype == LT_F64 ? ((const double *)p)[i] : (double)load_f32(p, dtype, i);
}

#endif
