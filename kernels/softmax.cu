/* softmax.cu — softmax and log-softmax over any dim, forward and backward, on CUDA tensors,
 * with the semantics of host/ops_softmax.c.
 *
 * A row is the n elements along dim. One kernel, three shapes of work by `group`, the number
 * of threads that share a row:
 * - rows contiguous along dim, n <= 1024: a warp per row (8 rows a block);
 * - rows contiguous along dim, longer: a block of 512 per row;
 * - dim not innermost (strided rows): a thread per row, so that a warp reads the neighbouring
 *   rows' elements side by side (softmax over dim 0 of (N, C) reads C columns together).
 * Each row takes three passes as the CPU: the max, the sum of exp(x - max), the output (the
 * row is re-read from L1/L2), and no online rescaling, so that -inf entries and NaN rows
 * come out exactly as on the CPU.
 * Compute as the CPU: f32 for f32/bf16/f16 (a NaN anywhere in a row makes it all NaN; exp
 * of x - max below -87 is 0; sums run in f32 over runs of 512 elements and add up in
 * double), f64 in f64. Differences from the CPU: expf is the device's (within 2 ulp, the CPU
 * uses its own polynomial) and the sums run in another order. */
#include "common.cuh"
#include <type_traits>
extern "C" {
#include "cuda_reduce.h"
}

enum { SUM_RUN = 512, WARP_ROW_MAX = 1024, ROW_BLOCK = 512 };

__device__ __forceinline__ int64_t row_offset(int64_t i, int n, const int64_t *shape, const int64_t *stride) {
  int64_t off = 0;
  for (int d = n - 1; d >= 0; d--) {
    int64_t s = shape[d];
    off += (i % s) * stride[d];
    i /= s;
  }
  return off;
}

/* The compute type: double for f64, float for the others. */
template <typename T> using comp_t = typename std::conditional<std::is_same<T, double>::value, double, float>::type;

template <typename T> __device__ __forceinline__ comp_t<T> ld(T x) {
  if constexpr (std::is_same<T, lt_bf16_bits>::value)
    return lt_bf16_to_f32(x.bits);
  else if constexpr (std::is_same<T, lt_f16_bits>::value)
    return lt_f16_to_f32(x.bits);
  else
    return x;
}
template <typename T> __device__ __forceinline__ T st(comp_t<T> v) {
  if constexpr (std::is_same<T, lt_bf16_bits>::value)
    return lt_bf16_bits{lt_f32_to_bf16(v)};
  else if constexpr (std::is_same<T, lt_f16_bits>::value)
    return lt_f16_bits{lt_f32_to_f16(v)};
  else
    return v;
}

/* exp as the CPU rows use it: lt_exp_nonpos_f32 (0 below -87 and for NaN) in f32, exp in f64. */
__device__ __forceinline__ float row_exp(float x) { return x >= -87.0f ? expf(x) : 0.0f; }
__device__ __forceinline__ double row_exp(double x) { return exp(x); }

/* Reductions over the threads sharing a row: 1 (nothing to do), a warp, or the block. */
template <typename V> __device__ __forceinline__ V group_sum(V v, int group, V *scratch) {
  if (group == 1) return v;
  if (group == 32) return lt_warp_sum(v);
  return lt_block_sum(v, scratch);
}
template <typename V> __device__ __forceinline__ V group_max(V v, int group, V *scratch) {
  if (group == 1) return v;
  if (group == 32) return lt_warp_max(v);
  return lt_block_max(v, scratch);
}
__device__ __forceinline__ int group_any(int v, int group) {
  if (group == 1) return v;
  if (group == 32) return __any_sync(0xffffffffu, v);
  return __syncthreads_or(v);
}

/* s += v in runs of SUM_RUN: a W partial, folded into a double (the CPU's BLOCK_SUM). */
template <typename W> struct run_sum {
  W part = 0;
  int count = 0;
  double total = 0;
  __device__ __forceinline__ void add(W v) {
    part += v;
    if (++count == SUM_RUN) total += part, part = 0, count = 0;
  }
  __device__ __forceinline__ double done() { return total + part; }
};

/* Row r is handled by the `group` threads r maps to; every loop bound below is uniform over a
 * group, as the warp and block reductions need. */
template <typename T>
__global__ void __launch_bounds__(512, 2) softmax_kernel(const __grid_constant__ lt_cuda_softmax_args a, int group) {
  using W = comp_t<T>;
  constexpr bool wide = std::is_same<T, double>::value;
  __shared__ double sum_scratch[32];
  __shared__ W max_scratch[32];
  int lane = threadIdx.x % group;
  int64_t per_block = blockDim.x / group, n = a.n;
  int64_t so = a.dim_stride[0], sx = a.dim_stride[1], sy = a.dim_stride[2];
  for (int64_t r = blockIdx.x * per_block + threadIdx.x / group; r < a.rows; r += gridDim.x * per_block) {
    T *out = (T *)a.base[0] + row_offset(r, a.nrest, a.rest_shape, a.rest_stride[0]);
    const T *x = (const T *)a.base[1] + row_offset(r, a.nrest, a.rest_shape, a.rest_stride[1]);
    const T *y = a.nops > 2 ? (const T *)a.base[2] + row_offset(r, a.nrest, a.rest_shape, a.rest_stride[2]) : x;
    run_sum<W> acc;
    if (a.kind == LT_CUDA_SOFTMAX || a.kind == LT_CUDA_LOG_SOFTMAX) {
      W m = -INFINITY;
      int nan = 0;
      for (int64_t i = lane; i < n; i += group) {
        W v = ld(x[i * sx]);
        m = v > m ? v : m; /* a NaN never compares greater: m stays a number (or -inf) */
        nan |= v != v;
      }
      m = group_max(m, group, max_scratch);
      if (!wide && group_any(nan, group)) { /* a NaN spreads over its row (f32 rows only, as the CPU) */
        for (int64_t i = lane; i < n; i += group) out[i * so] = st<T>((W)NAN);
        continue;
      }
      for (int64_t i = lane; i < n; i += group) acc.add(row_exp(ld(x[i * sx]) - m));
      double s = group_sum(acc.done(), group, sum_scratch);
      if (a.kind == LT_CUDA_SOFTMAX) {
        if constexpr (wide) {
          for (int64_t i = lane; i < n; i += group) out[i * so] = row_exp(x[i * sx] - m) / s;
        } else {
          float inv = (float)(1.0 / s);
          for (int64_t i = lane; i < n; i += group) out[i * so] = st<T>(row_exp(ld(x[i * sx]) - m) * inv);
        }
      } else {
        W lse = m + (W)log(s);
        for (int64_t i = lane; i < n; i += group) out[i * so] = st<T>(ld(x[i * sx]) - lse);
      }
    } else if (a.kind == LT_CUDA_SOFTMAX_BACKWARD) { /* grad_in = y * (grad_out - sum(grad_out * y)) */
      for (int64_t i = lane; i < n; i += group) acc.add(ld(x[i * sx]) * ld(y[i * sy]));
      W s = (W)group_sum(acc.done(), group, sum_scratch);
      for (int64_t i = lane; i < n; i += group) out[i * so] = st<T>(ld(y[i * sy]) * (ld(x[i * sx]) - s));
    } else { /* log_softmax: grad_in = grad_out - exp(y) * sum(grad_out) */
      for (int64_t i = lane; i < n; i += group) acc.add(ld(x[i * sx]));
      W s = (W)group_sum(acc.done(), group, sum_scratch);
      for (int64_t i = lane; i < n; i += group) {
        W yv = ld(y[i * sy]);
        W e = wide ? row_exp(yv) : (yv != yv ? yv : row_exp(yv));
        out[i * so] = st<T>(ld(x[i * sx]) - e * s);
      }
    }
  }
}

template <typename T> static int launch_softmax(const char *op, int device, const lt_cuda_softmax_args *a) {
  bool contiguous = true;
  for (int k = 0; k < a->nops; k++) contiguous &= a->dim_stride[k] == 1 || a->n == 1;
  int group, threads;
  int64_t blocks;
  if (!contiguous) {
    group = 1, threads = LT_CUDA_THREADS;
    blocks = lt_cuda_blocks(device, a->rows);
  } else if (a->n <= WARP_ROW_MAX) {
    group = 32, threads = 256;
    blocks = lt_cuda_blocks(device, a->rows * 32);
  } else {
    group = threads = ROW_BLOCK;
    int64_t cap = (int64_t)lt_cuda_blocks(device, (int64_t)1 << 40) * 4;
    blocks = a->rows < cap ? a->rows : cap;
  }
  softmax_kernel<T><<<(unsigned)blocks, threads, 0, lt_cuda_compute_stream(device)>>>(*a, group);
  return lt_cuda_check_launch(op, device);
}

int lt_cuda_softmax(const char *op, int device, const lt_cuda_softmax_args *a) {
  if (a->rows == 0 || a->n == 0) return 0;
  LT_TRY(lt_cuda_use_device(op, device));
  switch (a->dtype) {
  case LT_F32: return launch_softmax<float>(op, device, a);
  case LT_F64: return launch_softmax<double>(op, device, a);
  case LT_BF16: return launch_softmax<lt_bf16_bits>(op, device, a);
  case LT_F16: return launch_softmax<lt_f16_bits>(op, device, a);
  default: return lt_errorf("%s: needs a floating dtype, got %s", op, lt_dtype_name(a->dtype));
  }
}
