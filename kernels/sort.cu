/* sort.cu — sort and topk along one dim on CUDA (kernels/sort.h): one block per row, a bitonic
 * network over the row in shared memory, and the backward's scatter.
 *
 * Each element becomes a 64-bit key whose unsigned order is kernels/sort.h's order: a float as
 * its double's bits (sign flipped for positives, all bits for negatives, -0 as +0, NaN as the
 * largest key), an integer with its sign bit flipped; descending inverts the key. Pairs compare
 * by (key, index), so the network's result is the stable order however it moves the pairs, and
 * it equals the CPU's exactly. The row pads to a power of two with pairs that sort after every
 * element; rows up to LT_CUDA_SORT_MAX_ROW fit the 48 KiB of shared memory a block gets. */
#include "kernels/common.cuh"
extern "C" {
#include "kernels/sort.h"
}

namespace {

enum { THREADS = 512 };

template <typename T> __device__ inline uint64_t order_key(T v, bool descending) {
  uint64_t k;
  if constexpr (lt_dev_dtype<T>::is_float) {
    double d = lt_dev_dtype<T>::load(v);
    if (d != d) {
      k = ~(uint64_t)0;
    } else {
      if (d == 0) d = 0; /* -0 sorts as +0 */
      uint64_t b = (uint64_t)__double_as_longlong(d);
      k = (b >> 63) ? ~b : b | ((uint64_t)1 << 63);
    }
  } else {
    int64_t iv;
    if constexpr (std::is_same<T, int64_t>::value)
      iv = v; /* through double, beyond 2^53 would not be exact */
    else
      iv = (int64_t)lt_dev_dtype<T>::load(v);
    k = (uint64_t)iv ^ ((uint64_t)1 << 63);
  }
  return descending ? ~k : k;
}

__device__ inline bool after(uint64_t ka, int ia, uint64_t kb, int ib) { return ka > kb || (ka == kb && ia > ib); }

template <typename T> __global__ void sort_rows_kernel(lt_sort_plan p, int P) {
  extern __shared__ uint64_t smem[];
  uint64_t *key = smem;
  int *idx = (int *)(smem + P);
  const T *x = (const T *)p.x;
  T *values = (T *)p.values;
  for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
    int64_t xo = lt_dev_offset(r, p.nkept, p.kshape, p.xk);
    for (int i = threadIdx.x; i < P; i += blockDim.x) {
      if (i < p.n) {
        key[i] = order_key(x[xo + i * p.xd], p.descending != 0);
        idx[i] = i;
      } else {
        key[i] = ~(uint64_t)0, idx[i] = i; /* i >= n: after every element, NaN included */
      }
    }
    __syncthreads();
    for (int k = 2; k <= P; k <<= 1) {
      for (int j = k >> 1; j > 0; j >>= 1) {
        for (int i = threadIdx.x; i < P; i += blockDim.x) {
          int l = i ^ j;
          if (l > i) {
            bool up = (i & k) == 0;
            if (after(key[i], idx[i], key[l], idx[l]) == up) {
              uint64_t tk = key[i];
              key[i] = key[l], key[l] = tk;
              int ti = idx[i];
              idx[i] = idx[l], idx[l] = ti;
            }
          }
        }
        __syncthreads();
      }
    }
    int64_t vo = lt_dev_offset(r, p.nkept, p.kshape, p.vk), io = lt_dev_offset(r, p.nkept, p.kshape, p.ik);
    for (int j = threadIdx.x; j < p.k; j += blockDim.x) {
      values[vo + j * p.vd] = x[xo + (int64_t)idx[j] * p.xd];
      p.indices[io + j * p.id] = idx[j];
    }
    __syncthreads(); /* the next row reuses the shared arrays */
  }
}

template <typename T> __global__ void scatter_kernel(lt_sort_backward_plan p) {
  int64_t total = p.rows * p.k;
  for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += (int64_t)gridDim.x * blockDim.x) {
    int64_t r = t / p.k, j = t - r * p.k;
    int64_t gi = lt_dev_offset(r, p.nkept, p.kshape, p.gk_in), go = lt_dev_offset(r, p.nkept, p.kshape, p.gk);
    int64_t at = p.indices[lt_dev_offset(r, p.nkept, p.kshape, p.ik) + j * p.id];
    ((T *)p.grad_in)[gi + at * p.gd_in] = ((const T *)p.grad_out)[go + j * p.gd];
  }
}

} // namespace

int lt_cuda_sort(const char *op, const lt_sort_plan *p) {
  if (p->n > LT_CUDA_SORT_MAX_ROW)
    return lt_errorf("%s: rows of %lld elements are longer than cuda sorts (at most %d; sort on the cpu)", op,
                     (long long)p->n, (int)LT_CUDA_SORT_MAX_ROW);
  if (p->rows == 0 || p->k == 0) return 0;
  LT_TRY(lt_cuda_use_device(op, p->device));
  cudaStream_t s = lt_cuda_compute_stream(p->device);
  int P = 1;
  while (P < p->n) P <<= 1;
  size_t shared = (size_t)P * (sizeof(uint64_t) + sizeof(int));
  int64_t blocks = p->rows < 65535 ? p->rows : 65535;
  bool known = lt_with_dtype(p->dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    sort_rows_kernel<T><<<(unsigned)blocks, THREADS, shared, s>>>(*p, P);
  });
  if (!known) return lt_errorf("%s: unknown dtype %d", op, p->dtype);
  return lt_cuda_check_launch(op, p->device);
}

int lt_cuda_sort_backward(const char *op, const lt_sort_backward_plan *p) {
  if (p->rows * p->k == 0) return 0;
  LT_TRY(lt_cuda_use_device(op, p->device));
  cudaStream_t s = lt_cuda_compute_stream(p->device);
  int blocks = lt_cuda_blocks(p->device, p->rows * p->k);
  bool known = lt_with_dtype(p->dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    scatter_kernel<T><<<blocks, LT_CUDA_THREADS, 0, s>>>(*p);
  });
  if (!known) return lt_errorf("%s: unknown dtype %d", op, p->dtype);
  return lt_cuda_check_launch(op, p->device);
}
