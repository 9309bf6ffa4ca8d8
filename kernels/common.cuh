/* common.cuh — what every kernels .cu file shares: the core's CUDA side (core/cuda.h: the C
 * core's internal header with C linkage, error reporting, streams, launch geometry), block
 * reductions, and the element types as the device sees them. Nothing here knows Lua exists. */
#ifndef LUTRA_KERNELS_COMMON_CUH
#define LUTRA_KERNELS_COMMON_CUH
#include <cuda_runtime.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <type_traits>

#include "core/cuda.h"

/* ---- reductions inside a block ------------------------------------------------------- */

/* Sum and max across the 32 lanes of a warp (every lane gets the result). */
template <typename T> __device__ inline T lt_warp_sum(T v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}
template <typename T> __device__ inline T lt_warp_max(T v) {
  for (int offset = 16; offset > 0; offset >>= 1) v = fmax(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

/* Sum across the whole block (blockDim.x a multiple of 32, at most 1024); every thread
 * gets the result. `scratch` is __shared__ T[32]; the block may call this again after it. */
template <typename T> __device__ inline T lt_block_sum(T v, T *scratch) {
  int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
  v = lt_warp_sum(v);
  __syncthreads(); /* scratch may still be read by a previous call */
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nwarps ? scratch[lane] : (T)0;
  return lt_warp_sum(v);
}
template <typename T> __device__ inline T lt_block_max(T v, T *scratch) {
  int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
  v = lt_warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nwarps ? scratch[lane] : (T)-INFINITY;
  return lt_warp_max(v);
}

/* Blocks for a grid-stride loop over `work` items: enough to fill the device a few
 * times over, never more than the work needs. */
int lt_cuda_blocks(int device, int64_t work);

/* ---- element types ---------------------------------------------------------------- */

/* 16-bit floats and bool are stored as bits; these wrappers give each dtype its own
 * C++ type so that templates can tell them apart. */
struct lt_bf16_bits {
  uint16_t bits;
};
struct lt_f16_bits {
  uint16_t bits;
};
struct lt_bool_byte {
  uint8_t byte;
};

/* The bit-level conversions lt_bf16_to_f32, lt_f32_to_bf16, lt_f16_to_f32 and lt_f32_to_f16
 * come from host/core/internal.h, compiled for both sides (LT_HOST_DEVICE), so that a tensor
 * converted on the GPU is bit-identical to one converted on the CPU, NaN payloads included. */

/* Float to integer as the host's casts compile on x86-64 (cvttsd2si): truncation toward
 * zero, and NaN or out-of-range gives the "integer indefinite" INT_MIN. The CUDA casts
 * saturate instead; C leaves these cases undefined, we choose to agree with the CPU. */
__host__ __device__ static inline int32_t lt_dev_f64_to_i32(double v) {
  return (v > -2147483649.0 && v < 2147483648.0) ? (int32_t)v : INT32_MIN;
}
__host__ __device__ static inline int64_t lt_dev_f64_to_i64(double v) {
  return (v >= -9223372036854775808.0 && v < 9223372036854775808.0) ? (int64_t)v : INT64_MIN;
}

/* Per-dtype reads and writes through double, the host's generic conversion path
 * (lt_load_f64 / lt_store_f64 in host/core/internal.h). */
template <typename T> struct lt_dev_dtype;
template <> struct lt_dev_dtype<float> {
  static constexpr bool is_float = true, is_int = false;
  __host__ __device__ static double load(float x) { return x; }
  __host__ __device__ static float store(double v) { return (float)v; }
};
template <> struct lt_dev_dtype<double> {
  static constexpr bool is_float = true, is_int = false;
  __host__ __device__ static double load(double x) { return x; }
  __host__ __device__ static double store(double v) { return v; }
};
template <> struct lt_dev_dtype<lt_bf16_bits> {
  static constexpr bool is_float = true, is_int = false;
  __host__ __device__ static double load(lt_bf16_bits x) { return lt_bf16_to_f32(x.bits); }
  __host__ __device__ static lt_bf16_bits store(double v) { return {lt_f32_to_bf16((float)v)}; }
};
template <> struct lt_dev_dtype<lt_f16_bits> {
  static constexpr bool is_float = true, is_int = false;
  __host__ __device__ static double load(lt_f16_bits x) { return lt_f16_to_f32(x.bits); }
  __host__ __device__ static lt_f16_bits store(double v) { return {lt_f32_to_f16((float)v)}; }
};
template <> struct lt_dev_dtype<int32_t> {
  static constexpr bool is_float = false, is_int = true;
  __host__ __device__ static double load(int32_t x) { return x; }
  __host__ __device__ static int32_t store(double v) { return lt_dev_f64_to_i32(v); }
};
template <> struct lt_dev_dtype<int64_t> {
  static constexpr bool is_float = false, is_int = true;
  __host__ __device__ static double load(int64_t x) { return (double)x; }
  __host__ __device__ static int64_t store(double v) { return lt_dev_f64_to_i64(v); }
};
template <> struct lt_dev_dtype<uint8_t> {
  static constexpr bool is_float = false, is_int = true;
  __host__ __device__ static double load(uint8_t x) { return x; }
  __host__ __device__ static uint8_t store(double v) { return (uint8_t)lt_dev_f64_to_i32(v); }
};
template <> struct lt_dev_dtype<lt_bool_byte> {
  static constexpr bool is_float = false, is_int = true;
  __host__ __device__ static double load(lt_bool_byte x) { return x.byte != 0; }
  __host__ __device__ static lt_bool_byte store(double v) { return {(uint8_t)(v != 0)}; }
};

/* The type an element computes in, as on the CPU: double for f64, float for every other float
 * dtype (bf16/f16 are widened to f32 and rounded back once). */
template <typename T> using lt_acc_t = typename std::conditional<std::is_same<T, double>::value, double, float>::type;
template <typename T> __host__ __device__ inline lt_acc_t<T> lt_to_acc(T x) {
  if constexpr (std::is_same<T, lt_bf16_bits>::value)
    return lt_bf16_to_f32(x.bits);
  else if constexpr (std::is_same<T, lt_f16_bits>::value)
    return lt_f16_to_f32(x.bits);
  else
    return x;
}
template <typename T> __host__ __device__ inline T lt_from_acc(lt_acc_t<T> v) {
  if constexpr (std::is_same<T, lt_bf16_bits>::value)
    return {lt_f32_to_bf16(v)};
  else if constexpr (std::is_same<T, lt_f16_bits>::value)
    return {lt_f32_to_f16(v)};
  else
    return (T)v;
}

/* Element offset of row-major linear index i over n dims of shape with strides. */
__host__ __device__ inline int64_t lt_dev_offset(int64_t i, int n, const int64_t *shape, const int64_t *stride) {
  int64_t off = 0;
  for (int d = n - 1; d >= 0; d--) {
    int64_t s = shape[d];
    off += (i % s) * stride[d];
    i /= s;
  }
  return off;
}

/* A run of N elements moved with one 128-bit (or narrower) load or store. */
template <typename T, int N> struct alignas(sizeof(T) * N) lt_dev_vec { T v[N]; };

/* Calls f(lt_dev_type_tag<T>{}) with T the element type of dtype; false if unknown. */
template <typename T> struct lt_dev_type_tag { using type = T; };
template <typename F> static inline bool lt_with_dtype(int dtype, F &&f) {
  switch (dtype) {
  case LT_F32: f(lt_dev_type_tag<float>{}); return true;
  case LT_F64: f(lt_dev_type_tag<double>{}); return true;
  case LT_BF16: f(lt_dev_type_tag<lt_bf16_bits>{}); return true;
  case LT_F16: f(lt_dev_type_tag<lt_f16_bits>{}); return true;
  case LT_I32: f(lt_dev_type_tag<int32_t>{}); return true;
  case LT_I64: f(lt_dev_type_tag<int64_t>{}); return true;
  case LT_U8: f(lt_dev_type_tag<uint8_t>{}); return true;
  case LT_BOOL: f(lt_dev_type_tag<lt_bool_byte>{}); return true;
  default: return false;
  }
}

/* True when every pointer is aligned for N-element vectors of its type. */
static inline bool lt_aligned(const void *p, size_t bytes) { return ((uintptr_t)p % bytes) == 0; }

/* Arithmetic rounded once per operation, in both precisions: nvcc never contracts these into an
 * fma, so a kernel written with them gives the bits of the CPU loop that does the same operations. */
static __device__ __forceinline__ float rn_add(float a, float b) { return __fadd_rn(a, b); }
static __device__ __forceinline__ double rn_add(double a, double b) { return __dadd_rn(a, b); }
static __device__ __forceinline__ float rn_sub(float a, float b) { return __fsub_rn(a, b); }
static __device__ __forceinline__ double rn_sub(double a, double b) { return __dsub_rn(a, b); }
static __device__ __forceinline__ float rn_mul(float a, float b) { return __fmul_rn(a, b); }
static __device__ __forceinline__ double rn_mul(double a, double b) { return __dmul_rn(a, b); }
static __device__ __forceinline__ float rn_div(float a, float b) { return __fdiv_rn(a, b); }
static __device__ __forceinline__ double rn_div(double a, double b) { return __ddiv_rn(a, b); }
static __device__ __forceinline__ float rn_sqrt(float a) { return __fsqrt_rn(a); }
static __device__ __forceinline__ double rn_sqrt(double a) { return __dsqrt_rn(a); }

#endif
