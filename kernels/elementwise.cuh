/* elementwise.cuh — the loops and the launcher shared by the elementwise kernels
 * (unary.cu, binary.cu, kernels/copy.cu).
 *
 * An op is a functor F over raw pointers:
 *   static constexpr int nops;      operands, the output first (<= LT_EW_MAX_OPS)
 *   static constexpr int vec_n;     elements per 128-bit run of the widest operand (0: no vec path)
 *   one(off)                        the element at operand offsets off[0..nops)
 *   vec(r)                          contiguous operands: elements [r*vec_n, r*vec_n + vec_n)
 *   aligned()                       every pointer aligned for vec's loads and stores
 * Contiguous operands (one coalesced dim, unit strides) with aligned pointers take vec; all
 * others take the strided loop, whose offsets come from lt_ew_offsets32/64 (kernels/elementwise.h). */
#ifndef LUTRA_KERNELS_ELEMENTWISE_CUH
#define LUTRA_KERNELS_ELEMENTWISE_CUH
#include "kernels/common.cuh"
extern "C" {
#include "kernels/elementwise.h"
}

/* ---- element types: storage <-> compute ------------------------------------------------- */

/* The compute type of a storage type: f32 for the 16-bit floats, the type itself otherwise. */
template <typename T> struct ew_compute { using type = T; };
template <> struct ew_compute<lt_bf16_bits> { using type = float; };
template <> struct ew_compute<lt_f16_bits> { using type = float; };

template <typename C, typename T> __host__ __device__ inline C ew_load(T x) { return (C)x; }
template <> __host__ __device__ inline float ew_load<float, lt_bf16_bits>(lt_bf16_bits x) {
  return lt_bf16_to_f32(x.bits);
}
template <> __host__ __device__ inline float ew_load<float, lt_f16_bits>(lt_f16_bits x) {
  return lt_f16_to_f32(x.bits);
}

template <typename T, typename C> __host__ __device__ inline T ew_store(C v) { return (T)v; }
template <> __host__ __device__ inline lt_bf16_bits ew_store<lt_bf16_bits, float>(float v) {
  return {lt_f32_to_bf16(v)};
}
template <> __host__ __device__ inline lt_f16_bits ew_store<lt_f16_bits, float>(float v) { return {lt_f32_to_f16(v)}; }

/* Run r (of N elements) of a contiguous buffer, as one vector. */
template <int N, typename T> __host__ __device__ inline lt_dev_vec<T, N> ew_vload(const T *p, int64_t r) {
  return reinterpret_cast<const lt_dev_vec<T, N> *>(p)[r];
}
template <int N, typename T> __host__ __device__ inline void ew_vstore(T *p, int64_t r, const lt_dev_vec<T, N> &v) {
  reinterpret_cast<lt_dev_vec<T, N> *>(p)[r] = v;
}

/* Elements per 128-bit run for operands of at most `widest` bytes. */
template <typename... T> constexpr int ew_vec_n() {
  size_t widest = 1;
  ((widest = sizeof(T) > widest ? sizeof(T) : widest), ...);
  return (int)(16 / widest);
}

/* One element of S as D, by host/core/copy.c's rules (convert_run, lt_load_f64/lt_store_f64). */
template <typename D, typename S> __host__ __device__ inline D convert_one(S x) {
  using SD = lt_dev_dtype<S>;
  using DD = lt_dev_dtype<D>;
  if constexpr (SD::is_int && DD::is_int && !std::is_same<D, lt_bool_byte>::value) {
    /* integer to integer: through int64, wrapping */
    int64_t v;
    if constexpr (std::is_same<S, lt_bool_byte>::value)
      v = x.byte;
    else
      v = (int64_t)x;
    return (D)v;
  } else if constexpr (SD::is_float && DD::is_float && !std::is_same<S, double>::value &&
                       !std::is_same<D, double>::value) {
    /* f32/bf16/f16 to f32/bf16/f16: through f32, which is what the host's double
     * round trip amounts to since every such value is exact in f32 */
    return DD::store((float)SD::load(x));
  } else {
    return DD::store(SD::load(x));
  }
}

/* ---- the loops (host and device) ----------------------------------------------------------- */

/* A grid-stride loop over contiguous operands: this thread's runs, then its tail elements. */
template <typename F>
__host__ __device__ inline void ew_contig_range(const F &f, int64_t n, int64_t first, int64_t step) {
  constexpr int N = F::vec_n > 0 ? F::vec_n : 1;
  int64_t runs = n / N;
  if constexpr (F::vec_n > 0)
    for (int64_t r = first; r < runs; r += step) f.vec(r);
  for (int64_t i = runs * N + first; i < n; i += step) {
    int64_t off[LT_EW_MAX_OPS];
    LT_EW_UNROLL for (int k = 0; k < LT_EW_MAX_OPS; k++) off[k] = i;
    f.one(off);
  }
}

/* A grid-stride loop over strided operands; Index is uint32_t when numel < 2^31. */
template <typename Index, typename F>
__host__ __device__ inline void ew_strided_range(const F &f, const lt_ew_geom &g, Index first, Index step) {
  Index n = (Index)g.numel;
  for (Index i = first; i < n; i += step) {
    int64_t off[LT_EW_MAX_OPS];
    if constexpr (sizeof(Index) == 4)
      lt_ew_offsets32(&g, i, F::nops, off);
    else
      lt_ew_offsets64(&g, i, F::nops, off);
    f.one(off);
  }
}

template <typename F> __global__ void __launch_bounds__(LT_CUDA_THREADS) ew_contig_kernel(F f, int64_t n) {
  ew_contig_range(f, n, (int64_t)blockIdx.x * blockDim.x + threadIdx.x, (int64_t)gridDim.x * blockDim.x);
}

template <typename Index, typename F>
__global__ void __launch_bounds__(LT_CUDA_THREADS) ew_strided_kernel(F f, const __grid_constant__ lt_ew_geom g) {
  ew_strided_range<Index>(f, g, (Index)(blockIdx.x * blockDim.x + threadIdx.x), (Index)(gridDim.x * blockDim.x));
}

/* Threads the host emulation runs (first = t, step = EW_HOST_THREADS): enough to exercise
 * the grid-stride split of runs and tails. Odd threads of a strided walk index in 64 bits
 * even when 32 would do, so that both offset calculators run (each element still once). */
enum { EW_HOST_THREADS = 3 };

/* Runs f over g: kernels on device's compute stream, or the same loops on the host when
 * device is LT_DEVICE_CPU (the test hook). */
template <typename F> int ew_launch(const char *op, int device, const F &f, const lt_ew_geom &g) {
  if (g.numel == 0) return 0;
  bool vec = false;
  if constexpr (F::vec_n > 0) vec = lt_ew_geom_contiguous(&g) && f.aligned();
  bool small = g.numel < ((int64_t)1 << 31);
  if (device == LT_DEVICE_CPU) {
    for (int t = 0; t < EW_HOST_THREADS; t++) {
      if (vec)
        ew_contig_range(f, g.numel, t, EW_HOST_THREADS);
      else if (small && t % 2 == 0)
        ew_strided_range<uint32_t>(f, g, (uint32_t)t, (uint32_t)EW_HOST_THREADS);
      else
        ew_strided_range<int64_t>(f, g, (int64_t)t, (int64_t)EW_HOST_THREADS);
    }
    return 0;
  }
  LT_TRY(lt_cuda_use_device(op, device));
  cudaStream_t stream = lt_cuda_compute_stream(device);
  if constexpr (F::vec_n > 0) {
    if (vec) {
      int blocks = lt_cuda_blocks(device, g.numel / F::vec_n + F::vec_n);
      ew_contig_kernel<F><<<blocks, LT_CUDA_THREADS, 0, stream>>>(f, g.numel);
      return lt_cuda_check_launch(op, device);
    }
  }
  if (small) {
    ew_strided_kernel<uint32_t, F><<<lt_cuda_blocks(device, g.numel), LT_CUDA_THREADS, 0, stream>>>(f, g);
  } else {
    ew_strided_kernel<int64_t, F><<<lt_cuda_blocks(device, g.numel), LT_CUDA_THREADS, 0, stream>>>(f, g);
  }
  return lt_cuda_check_launch(op, device);
}

#endif
