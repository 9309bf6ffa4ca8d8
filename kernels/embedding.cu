/* embedding.cu — embedding lookup on CUDA, forward and a deterministic backward.
 *
 * Forward copies rows of weight in the widest unit (16 bytes down to 1) that the row size,
 * the row stride and both pointers allow.
 *
 * Backward uses no float atomics, so it gives the same bits on every run: the (id, position)
 * pairs are sorted by id with CUB's radix sort, which is stable (positions stay ascending
 * within an id), runs of equal ids are found with CUB's run-length encoding, and one block per
 * distinct id sums its dout rows column by column in position order, starting from 0, in f32
 * for f32/bf16/f16 (rounded once) and f64 for f64. That is exactly host/ops/embedding.c's order
 * and arithmetic, so dweight is bit-identical with the CPU's. Rows of absent ids are zero. */
#include "kernels/common.cuh"
#include <algorithm>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_run_length_encode.cuh>
#include <cub/device/device_scan.cuh>
#include <limits.h>
#include <stdlib.h>
extern "C" {
#include "kernels/embedding.h"
}

namespace {

__host__ __device__ inline int64_t load_id(const void *ids, int is64, int64_t k) {
  return is64 ? ((const int64_t *)ids)[k] : (int64_t)((const int32_t *)ids)[k];
}

// out (n, units) = rows ids[k] of weight (row_units apart), in units of U
template <typename U>
__global__ void gather_rows_kernel(U *out, const U *weight, int64_t row_units, const void *ids, int is64, int64_t n,
                                   int64_t units) {
  int64_t total = n * units;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t k = i / units, u = i - k * units;
    out[i] = weight[load_id(ids, is64, k) * row_units + u];
  }
}

// keys[k] = ids[k] (checked in [0, V) < 2^32), positions[k] = k
__global__ void make_pairs_kernel(uint32_t *keys, uint32_t *positions, const void *ids, int is64, int64_t n) {
  for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < n; k += (int64_t)gridDim.x * blockDim.x) {
    keys[k] = (uint32_t)load_id(ids, is64, k);
    positions[k] = (uint32_t)k;
  }
}

template <typename T> using acc_t = lt_acc_t<T>;

/* Column j of the dout rows positions[first .. last), summed in that order from 0: the CPU's
 * memset row, then += in position order (no fma, no reordering). */
template <typename T>
__host__ __device__ inline T sum_column(const T *dout, int64_t C, const uint32_t *positions, int64_t first,
                                        int64_t last, int64_t j) {
  acc_t<T> acc = 0;
  for (int64_t k = first; k < last; k++) acc = acc + lt_to_acc(dout[(int64_t)positions[k] * C + j]);
  return lt_from_acc<T>(acc);
}

// Run r (r < *num_runs) is id unique[r] at sorted positions [start[r], start[r] + count[r]):
// dweight row unique[r] = the sum of dout rows positions[start[r] ...] in that (ascending) order.
template <typename T>
__global__ void sum_runs_kernel(T *dweight, const T *dout, int64_t C, const uint32_t *unique, const uint32_t *count,
                                const uint32_t *start, const uint32_t *positions, const int *num_runs) {
  int runs = *num_runs;
  for (int r = blockIdx.x; r < runs; r += gridDim.x) {
    int64_t first = start[r], last = first + count[r];
    T *row = dweight + (int64_t)unique[r] * C;
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) row[j] = sum_column(dout, C, positions, first, last, j);
  }
}

template <typename F> bool with_float_dtype(int dtype, F &&f) {
  switch (dtype) {
  case LT_F32: f(lt_dev_type_tag<float>{}); return true;
  case LT_F64: f(lt_dev_type_tag<double>{}); return true;
  case LT_BF16: f(lt_dev_type_tag<lt_bf16_bits>{}); return true;
  case LT_F16: f(lt_dev_type_tag<lt_f16_bits>{}); return true;
  default: return false;
  }
}

template <typename U>
void launch_gather(int device, cudaStream_t s, void *out, const void *weight, int64_t row_bytes, int64_t stride_bytes,
                   const void *ids, int is64, int64_t n) {
  int64_t units = row_bytes / (int64_t)sizeof(U);
  gather_rows_kernel<U><<<lt_cuda_blocks(device, n * units), LT_CUDA_THREADS, 0, s>>>(
      (U *)out, (const U *)weight, stride_bytes / (int64_t)sizeof(U), ids, is64, n, units);
}

size_t round_up(size_t x) { return (x + 255) / 256 * 256; }

} // namespace

int lt_cuda_embedding_forward(int device, void *out, const void *weight, int64_t row_stride, int esize, const void *ids,
                              int idtype, int64_t n, int64_t C) {
  const char *op = "embedding";
  if (n == 0 || C == 0) return 0;
  LT_TRY(lt_cuda_use_device(op, device));
  cudaStream_t s = lt_cuda_compute_stream(device);
  int64_t row_bytes = C * esize, stride_bytes = row_stride * esize;
  uintptr_t all = (uintptr_t)out | (uintptr_t)weight | (uintptr_t)row_bytes | (uintptr_t)stride_bytes;
  int is64 = idtype == LT_I64;
  if (all % 16 == 0)
    launch_gather<uint4>(device, s, out, weight, row_bytes, stride_bytes, ids, is64, n);
  else if (all % 8 == 0)
    launch_gather<uint2>(device, s, out, weight, row_bytes, stride_bytes, ids, is64, n);
  else if (all % 4 == 0)
    launch_gather<uint32_t>(device, s, out, weight, row_bytes, stride_bytes, ids, is64, n);
  else if (all % 2 == 0)
    launch_gather<uint16_t>(device, s, out, weight, row_bytes, stride_bytes, ids, is64, n);
  else
    launch_gather<uint8_t>(device, s, out, weight, row_bytes, stride_bytes, ids, is64, n);
  return lt_cuda_check_launch(op, device);
}

int lt_cuda_embedding_backward(int device, int dtype, void *dweight, int64_t V, int64_t C, const void *dout,
                               const void *ids, int idtype, int64_t n) {
  const char *op = "embedding_backward";
  if (V > (int64_t)UINT32_MAX || n > (int64_t)INT_MAX)
    return lt_errorf("%s: %lld ids into %lld rows: cuda handles at most 2^31-1 ids and 2^32 rows", op, (long long)n,
                     (long long)V);
  int esize = lt_dtype_size(dtype);
  if (V == 0 || C == 0) return 0;
  LT_TRY(lt_cuda_use_device(op, device));
  cudaStream_t s = lt_cuda_compute_stream(device);
  cudaError_t err = cudaMemsetAsync(dweight, 0, (size_t)(V * C * esize), s); /* all-zero bits: +0 in every dtype */
  if (err != cudaSuccess) return lt_cuda_error(op, device, err);
  if (n == 0) return 0;
  int end_bit = 1;
  while (end_bit < 32 && ((int64_t)1 << end_bit) < V) end_bit++;
  int items = (int)n;

  /* one scratch block: keys and positions in and sorted, run ids, counts, starts, the run count, CUB's temp */
  size_t sort_bytes = 0, rle_bytes = 0, scan_bytes = 0;
  cub::DeviceRadixSort::SortPairs(NULL, sort_bytes, (const uint32_t *)NULL, (uint32_t *)NULL, (const uint32_t *)NULL,
                                  (uint32_t *)NULL, items, 0, end_bit, s);
  cub::DeviceRunLengthEncode::Encode(NULL, rle_bytes, (const uint32_t *)NULL, (uint32_t *)NULL, (uint32_t *)NULL,
                                     (int *)NULL, items, s);
  cub::DeviceScan::ExclusiveSum(NULL, scan_bytes, (const uint32_t *)NULL, (uint32_t *)NULL, items, s);
  size_t temp_bytes = sort_bytes > rle_bytes ? sort_bytes : rle_bytes;
  temp_bytes = temp_bytes > scan_bytes ? temp_bytes : scan_bytes;
  size_t array = round_up((size_t)n * sizeof(uint32_t));
  size_t total = 7 * array + round_up(sizeof(int)) + round_up(temp_bytes);
  char *scratch = NULL;
  LT_TRY(lt_cuda_alloc_stream(device, (int64_t)total, s, (void **)&scratch));
  uint32_t *keys = (uint32_t *)scratch, *positions = (uint32_t *)(scratch + array);
  uint32_t *keys_sorted = (uint32_t *)(scratch + 2 * array), *positions_sorted = (uint32_t *)(scratch + 3 * array);
  uint32_t *unique = (uint32_t *)(scratch + 4 * array), *count = (uint32_t *)(scratch + 5 * array);
  uint32_t *start = (uint32_t *)(scratch + 6 * array);
  int *num_runs = (int *)(scratch + 7 * array);
  void *temp = scratch + 7 * array + round_up(sizeof(int));

  int is64 = idtype == LT_I64;
  make_pairs_kernel<<<lt_cuda_blocks(device, n), LT_CUDA_THREADS, 0, s>>>(keys, positions, ids, is64, n);
  err = cudaGetLastError();
  if (err == cudaSuccess)
    err = cub::DeviceRadixSort::SortPairs(temp, sort_bytes, keys, keys_sorted, positions, positions_sorted, items, 0,
                                          end_bit, s);
  /* counts past the run count stay 0, so that the scan below reads only written memory */
  if (err == cudaSuccess) err = cudaMemsetAsync(count, 0, (size_t)n * sizeof(uint32_t), s);
  if (err == cudaSuccess)
    err = cub::DeviceRunLengthEncode::Encode(temp, rle_bytes, keys_sorted, unique, count, num_runs, items, s);
  if (err == cudaSuccess) err = cub::DeviceScan::ExclusiveSum(temp, scan_bytes, count, start, items, s);
  if (err == cudaSuccess) {
    int threads = C >= 256 ? 256 : C > 32 ? (int)((C + 31) / 32 * 32) : 32;
    int blocks = (int)(n < 65536 ? n : 65536);
    bool known = with_float_dtype(dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      sum_runs_kernel<T><<<blocks, threads, 0, s>>>((T *)dweight, (const T *)dout, C, unique, count, start,
                                                    positions_sorted, num_runs);
    });
    err = known ? cudaGetLastError() : cudaSuccess;
    if (!known) {
      lt_cuda_free(device, scratch);
      return lt_errorf("%s: dtype %s is not supported on cuda", op, lt_dtype_name(dtype));
    }
  }
  lt_cuda_free(device, scratch); /* stream-ordered: reused only after these kernels */
  return err == cudaSuccess ? 0 : lt_cuda_error(op, device, err);
}

/* The launches above run on the CPU over host memory (a stable sort by id in place of CUB's),
 * exported for tests/c/test_nn_kernels_host.c: checks ops/embedding.c's arguments and the
 * per-id sums against the CPU op. */
extern "C" int lt_cuda_embedding_forward_on_host(int device, void *out, const void *weight, int64_t row_stride,
                                                 int esize, const void *ids, int idtype, int64_t n, int64_t C) {
  (void)device;
  for (int64_t k = 0; k < n; k++)
    memcpy((char *)out + k * C * esize, (const char *)weight + load_id(ids, idtype == LT_I64, k) * row_stride * esize,
           (size_t)(C * esize));
  return 0;
}

extern "C" int lt_cuda_embedding_backward_on_host(int device, int dtype, void *dweight, int64_t V, int64_t C,
                                                  const void *dout, const void *ids, int idtype, int64_t n) {
  (void)device;
  memset(dweight, 0, (size_t)(V * C * lt_dtype_size(dtype)));
  uint32_t *positions = (uint32_t *)malloc((size_t)(n > 0 ? n : 1) * sizeof(uint32_t));
  if (!positions) return lt_errorf("embedding_backward: out of host memory");
  for (int64_t k = 0; k < n; k++) positions[k] = (uint32_t)k;
  int is64 = idtype == LT_I64;
  std::stable_sort(positions, positions + n,
                   [&](uint32_t a, uint32_t b) { return load_id(ids, is64, a) < load_id(ids, is64, b); });
  bool known = with_float_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    for (int64_t first = 0, last; first < n; first = last) {
      int64_t id = load_id(ids, is64, positions[first]);
      for (last = first + 1; last < n && load_id(ids, is64, positions[last]) == id;) last++;
      for (int64_t j = 0; j < C; j++)
        ((T *)dweight)[id * C + j] = sum_column((const T *)dout, C, positions, first, last, j);
    }
  });
  free(positions);
  return known ? 0 : lt_errorf("embedding_backward: dtype %s is not supported on cuda", lt_dtype_name(dtype));
}
