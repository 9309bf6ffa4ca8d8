/* emu_cub.h — the three CUB device algorithms kernels/embedding.cu uses, for the emulator:
 * the same call shapes (a size query with temp == NULL, then the call), done on the host with
 * a stable sort, as cub::DeviceRadixSort is stable. */
#pragma once
#include "emu.h"
namespace cub {
struct DeviceRadixSort {
  template <typename K, typename V>
  static cudaError_t SortPairs(void *temp, size_t &bytes, const K *keys_in, K *keys_out, const V *vals_in, V *vals_out,
                               int n, int begin_bit = 0, int end_bit = (int)sizeof(K) * 8, cudaStream_t = 0) {
    if (!temp) return bytes = 1, cudaSuccess;
    K mask = (K)((end_bit - begin_bit >= (int)sizeof(K) * 8 ? ~(K)0 : (((K)1 << (end_bit - begin_bit)) - 1))
                 << begin_bit);
    std::vector<int> idx(n);
    for (int i = 0; i < n; i++) idx[i] = i;
    std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return (keys_in[a] & mask) < (keys_in[b] & mask); });
    std::vector<K> k(n);
    std::vector<V> v(n);
    for (int i = 0; i < n; i++) k[i] = keys_in[idx[i]], v[i] = vals_in[idx[i]];
    for (int i = 0; i < n; i++) keys_out[i] = k[i], vals_out[i] = v[i];
    return cudaSuccess;
  }
};
struct DeviceRunLengthEncode {
  template <typename K, typename C, typename N>
  static cudaError_t Encode(void *temp, size_t &bytes, const K *in, K *unique_out, C *counts_out, N *num_runs_out, int n,
                            cudaStream_t = 0) {
    if (!temp) return bytes = 1, cudaSuccess;
    int runs = 0;
    for (int i = 0; i < n; i++) {
      if (i == 0 || in[i] != in[i - 1]) unique_out[runs] = in[i], counts_out[runs++] = 0;
      counts_out[runs - 1]++;
    }
    *num_runs_out = (N)runs;
    return cudaSuccess;
  }
};
struct DeviceScan {
  template <typename I, typename O>
  static cudaError_t ExclusiveSum(void *temp, size_t &bytes, const I *in, O *out, int n, cudaStream_t = 0) {
    if (!temp) return bytes = 1, cudaSuccess;
    O acc = 0;
    for (int i = 0; i < n; i++) {
      O x = (O)in[i];
      out[i] = acc, acc += x;
    }
    return cudaSuccess;
  }
};
} // namespace cub
