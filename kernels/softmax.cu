/* softmax.cu — softmax and log-softmax over any dim, forward and backward, on CUDA tensors,
 * with the semantics of host/ops/softmax.c.
 *
 * A row is the n elements along dim. One kernel, three ways to share rows among threads:
 * - rows contiguous along dim, n <= 1024: a warp per row (8 rows a block);
 * - rows contiguous along dim, longer: a block of 512 per row;
 * - dim not innermost (strided rows): 32 neighbouring rows a block of 512, 16 threads a row,
 *   so that a warp reads the same element of 32 rows side by side (softmax over dim 0 of
 *   (N, C) reads 32 columns together), and long rows still spread over 16 threads.
 * Each row takes three passes as the CPU: the max, the sum of exp(x - max), the output (the
 * row is re-read from L1/L2), and no online rescaling, so that -inf entries and NaN rows
 * come out exactly as on the CPU.
 * Compute as the CPU: f32 for f32/bf16/f16 (a NaN anywhere in a row makes it all NaN; exp
 * of x - max below -87 is 0; sums run in f32 over runs of 512 elements and add up in
 * double), f64 in f64. Differences from the CPU: expf is the device's (within 2 ulp, the CPU
 * uses its own polynomial) and the sums run in another order. */
#include "kernels/common.cuh"
#include <type_traits>
extern "C" {
#include "kernels/reduce.h"
}

enum { SUM_RUN = 512, WARP_ROW_MAX = 1024, ROW_BLOCK = 512 };

/* The compute type: double for f64, float for the others. */
template <typename T> using comp_t = lt_acc_t<T>;

/* exp as the CPU rows use it: lt_exp_nonpos_f32 (0 below -87 and for NaN) in f32, exp in f64. */
__device__ __forceinline__ float row_exp(float x) { return x >= -87.0f ? expf(x) : 0.0f; }
__device__ __forceinline__ double row_exp(double x) { return exp(x); }

/* How threads share rows:
 * - MODE_WARP: a warp per row (lane = threadIdx.x % 32), blockDim.x / 32 rows a block;
 * - MODE_BLOCK: the block per row;
 * - MODE_COLS: 32 neighbouring rows a block (row rb + threadIdx.x % 32), each shared by the
 *   blockDim.x / 32 threads of one column (lane = threadIdx.x / 32): a warp reads the same
 *   element of 32 rows, side by side in memory when dim is not the innermost one. */
enum { MODE_WARP, MODE_BLOCK, MODE_COLS };
enum { COLS_THREADS = 512 };

/* Reductions over the threads of a row; every thread of the row gets the result. scratch
 * holds COLS_THREADS values. */
template <typename V> __device__ __forceinline__ V group_sum(V v, int mode, V *scratch) {
  if (mode == MODE_WARP) return lt_warp_sum(v);
  if (mode == MODE_BLOCK) return lt_block_sum(v, scratch);
  __syncthreads(); /* the previous reduction may still read scratch */
  scratch[threadIdx.x] = v;
  __syncthreads();
  V s = 0;
  for (unsigned k = threadIdx.x % 32; k < blockDim.x; k += 32) s += scratch[k]; /* in order: same sum in all */
  return s;
}
template <typename V> __device__ __forceinline__ V group_max(V v, int mode, V *scratch) {
  if (mode == MODE_WARP) return lt_warp_max(v);
  if (mode == MODE_BLOCK) return lt_block_max(v, scratch);
  __syncthreads();
  scratch[threadIdx.x] = v;
  __syncthreads();
  V m = scratch[threadIdx.x % 32];
  for (unsigned k = threadIdx.x % 32 + 32; k < blockDim.x; k += 32) m = scratch[k] > m ? scratch[k] : m;
  return m;
}
__device__ __forceinline__ int group_any(int v, int mode, int *scratch) {
  if (mode == MODE_WARP) return __any_sync(0xffffffffu, v);
  if (mode == MODE_BLOCK) return __syncthreads_or(v);
  __syncthreads();
  scratch[threadIdx.x] = v;
  __syncthreads();
  int any = 0;
  for (unsigned k = threadIdx.x % 32; k < blockDim.x; k += 32) any |= scratch[k];
  return any;
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

/* Rows go out in batches of rows_per_block a block (uniform over the block, so every thread
 * reaches every reduction; a thread past the last row reduces nothing and writes nothing). */
template <typename T>
__global__ void __launch_bounds__(512, 2) softmax_kernel(const __grid_constant__ lt_cuda_softmax_args a, int mode) {
  using W = comp_t<T>;
  constexpr bool wide = std::is_same<T, double>::value;
  __shared__ double sum_scratch[COLS_THREADS];
  __shared__ W max_scratch[COLS_THREADS];
  __shared__ int any_scratch[COLS_THREADS];
  int lane, group;
  int64_t sub, per_block;
  if (mode == MODE_WARP)
    lane = threadIdx.x % 32, group = 32, sub = threadIdx.x / 32, per_block = blockDim.x / 32;
  else if (mode == MODE_BLOCK)
    lane = threadIdx.x, group = blockDim.x, sub = 0, per_block = 1;
  else
    lane = threadIdx.x / 32, group = blockDim.x / 32, sub = threadIdx.x % 32, per_block = 32;
  int64_t so = a.dim_stride[0], sx = a.dim_stride[1], sy = a.dim_stride[2];
  for (int64_t rb = blockIdx.x * per_block; rb < a.rows; rb += gridDim.x * per_block) {
    int64_t r = rb + sub, n = r < a.rows ? a.n : 0; /* n = 0: this thread has no row */
    if (r >= a.rows) r = a.rows - 1;                /* a valid row for the pointers below */
    T *out = (T *)a.base[0] + lt_dev_offset(r, a.nrest, a.rest_shape, a.rest_stride[0]);
    const T *x = (const T *)a.base[1] + lt_dev_offset(r, a.nrest, a.rest_shape, a.rest_stride[1]);
    const T *y = a.nops > 2 ? (const T *)a.base[2] + lt_dev_offset(r, a.nrest, a.rest_shape, a.rest_stride[2]) : x;
    run_sum<W> acc;
    if (a.kind == LT_CUDA_SOFTMAX || a.kind == LT_CUDA_LOG_SOFTMAX) {
      W m = -INFINITY;
      int nan = 0;
      for (int64_t i = lane; i < n; i += group) {
        W v = lt_to_acc(x[i * sx]);
        m = v > m ? v : m; /* a NaN never compares greater: m stays a number (or -inf) */
        nan |= v != v;
      }
      m = group_max(m, mode, max_scratch);
      /* a NaN spreads over its row (f32 rows only, as the CPU; f64 rows get NaN from the sum) */
      nan = wide ? 0 : group_any(nan, mode, any_scratch);
      if (!nan)
        for (int64_t i = lane; i < n; i += group) acc.add(row_exp(lt_to_acc(x[i * sx]) - m));
      double s = group_sum(acc.done(), mode, sum_scratch);
      if (nan) {
        for (int64_t i = lane; i < n; i += group) out[i * so] = lt_from_acc<T>((W)NAN);
      } else if (a.kind == LT_CUDA_SOFTMAX) {
        if constexpr (wide) {
          for (int64_t i = lane; i < n; i += group) out[i * so] = row_exp(x[i * sx] - m) / s;
        } else {
          float inv = (float)(1.0 / s);
          for (int64_t i = lane; i < n; i += group)
            out[i * so] = lt_from_acc<T>(row_exp(lt_to_acc(x[i * sx]) - m) * inv);
        }
      } else {
        W lse = m + (W)log(s);
        for (int64_t i = lane; i < n; i += group) out[i * so] = lt_from_acc<T>(lt_to_acc(x[i * sx]) - lse);
      }
    } else if (a.kind == LT_CUDA_SOFTMAX_BACKWARD) { /* grad_in = y * (grad_out - sum(grad_out * y)) */
      for (int64_t i = lane; i < n; i += group) acc.add(lt_to_acc(x[i * sx]) * lt_to_acc(y[i * sy]));
      W s = (W)group_sum(acc.done(), mode, sum_scratch);
      for (int64_t i = lane; i < n; i += group)
        out[i * so] = lt_from_acc<T>(lt_to_acc(y[i * sy]) * (lt_to_acc(x[i * sx]) - s));
    } else { /* log_softmax: grad_in = grad_out - exp(y) * sum(grad_out) */
      for (int64_t i = lane; i < n; i += group) acc.add(lt_to_acc(x[i * sx]));
      W s = (W)group_sum(acc.done(), mode, sum_scratch);
      for (int64_t i = lane; i < n; i += group) {
        W yv = lt_to_acc(y[i * sy]);
        W e = wide ? row_exp(yv) : (yv != yv ? yv : row_exp(yv));
        out[i * so] = lt_from_acc<T>(lt_to_acc(x[i * sx]) - e * s);
      }
    }
  }
}

template <typename T> static int launch_softmax(const char *op, int device, const lt_cuda_softmax_args *a) {
  bool contiguous = true;
  for (int k = 0; k < a->nops; k++) contiguous &= a->dim_stride[k] == 1 || a->n == 1;
  int64_t cap = (int64_t)lt_cuda_blocks(device, (int64_t)1 << 40) * 4, blocks;
  int mode, threads;
  if (!contiguous) {
    mode = MODE_COLS, threads = COLS_THREADS;
    blocks = (a->rows + 31) / 32;
  } else if (a->n <= WARP_ROW_MAX) {
    mode = MODE_WARP, threads = 256;
    blocks = (a->rows + 7) / 8;
  } else {
    mode = MODE_BLOCK, threads = ROW_BLOCK;
    blocks = a->rows;
  }
  blocks = blocks < cap ? blocks : cap;
  softmax_kernel<T><<<(unsigned)blocks, threads, 0, lt_cuda_compute_stream(device)>>>(*a, mode);
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
