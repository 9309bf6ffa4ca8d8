/* copy.cu — copies on one CUDA device between any layouts (strided source and
 * destination, broadcast source), converting dtypes in the same pass by host/core/copy.c's rules
 * (convert_one); fill of any layout; arange/linspace sequences. Contiguous conversions and fills
 * go to elementwise.cu's vectorised kernels, so the kernels here have no vector path. */
#include "kernels/elementwise.cuh"

/* dst = src element by element, same dtype: T an unsigned integer of the element size. */
template <typename T> struct move_fn {
  static constexpr int nops = 2, vec_n = ew_vec_n<T>();
  T *dst;
  const T *src;
  __host__ __device__ void one(const int64_t *off) const { dst[off[0]] = src[off[1]]; }
  __host__ __device__ void vec(int64_t r) const { ew_vstore<vec_n>(dst, r, ew_vload<vec_n>(src, r)); }
  bool aligned() const { return lt_aligned(dst, 16) && lt_aligned(src, 16); }
};

template <typename D, typename S> struct convert_fn {
  static constexpr int nops = 2, vec_n = 0;
  D *dst;
  const S *src;
  __host__ __device__ void one(const int64_t *off) const { dst[off[0]] = convert_one<D>(src[off[1]]); }
  __host__ __device__ void vec(int64_t) const {}
  bool aligned() const { return false; }
};

static int move_by_size(int device, const lt_ew_geom *g, void *dst, const void *src, int size) {
  switch (size) {
  case 1: return ew_launch("copy", device, move_fn<uint8_t>{(uint8_t *)dst, (const uint8_t *)src}, *g);
  case 2: return ew_launch("copy", device, move_fn<uint16_t>{(uint16_t *)dst, (const uint16_t *)src}, *g);
  case 4: return ew_launch("copy", device, move_fn<uint32_t>{(uint32_t *)dst, (const uint32_t *)src}, *g);
  default: return ew_launch("copy", device, move_fn<uint64_t>{(uint64_t *)dst, (const uint64_t *)src}, *g);
  }
}

int lt_cuda_copy(int device, const lt_ew_geom *g, void *dst, int dst_dtype, const void *src, int src_dtype) {
  int dsize = lt_dtype_size(dst_dtype), ssize = lt_dtype_size(src_dtype);
  if (!dsize || !ssize) return lt_errorf("copy: unknown dtype (%d from %d)", dst_dtype, src_dtype);
  if (g->numel == 0) return 0;
  bool contiguous = lt_ew_geom_contiguous(g);
  if (dst_dtype == src_dtype) {
    if (contiguous && device != LT_DEVICE_CPU) { /* one async copy on the compute stream */
      LT_TRY(lt_cuda_use_device("copy", device));
      cudaError_t err = cudaMemcpyAsync(dst, src, (size_t)(g->numel * dsize), cudaMemcpyDeviceToDevice,
                                        lt_cuda_compute_stream(device));
      return err == cudaSuccess ? 0 : lt_cuda_error("copy", device, err);
    }
    return move_by_size(device, g, dst, src, dsize);
  }
  if (contiguous && device != LT_DEVICE_CPU)
    return lt_cuda_convert_contig(device, dst, dst_dtype, src, src_dtype, g->numel);
  int rc = 0;
  lt_with_dtype(dst_dtype, [&](auto dst_tag) {
    lt_with_dtype(src_dtype, [&](auto src_tag) {
      using D = typename decltype(dst_tag)::type;
      using S = typename decltype(src_tag)::type;
      if constexpr (!std::is_same<D, S>::value)
        rc = ew_launch("copy", device, convert_fn<D, S>{(D *)dst, (const S *)src}, *g);
    });
  });
  return rc;
}

/* ---- fill --------------------------------------------------------------------------------------- */

/* T an unsigned integer of the element size; pattern is one element's bits. */
template <typename T> struct fill_fn {
  static constexpr int nops = 1, vec_n = 0;
  T *out;
  T pattern;
  __host__ __device__ void one(const int64_t *off) const { out[off[0]] = pattern; }
  __host__ __device__ void vec(int64_t) const {}
  bool aligned() const { return false; }
};

template <typename T> static int launch_fill(int device, const lt_ew_geom *g, void *out, const unsigned char *bits) {
  T pattern;
  memcpy(&pattern, bits, sizeof pattern);
  return ew_launch("fill", device, fill_fn<T>{(T *)out, pattern}, *g);
}

int lt_cuda_fill(int device, const lt_ew_geom *g, void *out, int dtype, double value) {
  int size = lt_dtype_size(dtype);
  if (!size) return lt_errorf("fill: unknown dtype %d", dtype);
  if (g->numel == 0) return 0;
  if (lt_ew_geom_contiguous(g) && device != LT_DEVICE_CPU)
    return lt_cuda_fill_contig(device, out, dtype, g->numel, value);
  unsigned char bits[8];
  lt_store_f64(bits, dtype, 0, value); /* the host's bits, broadcast */
  switch (size) {
  case 1: return launch_fill<uint8_t>(device, g, out, bits);
  case 2: return launch_fill<uint16_t>(device, g, out, bits);
  case 4: return launch_fill<uint32_t>(device, g, out, bits);
  default: return launch_fill<uint64_t>(device, g, out, bits);
  }
}

/* ---- arange / linspace ------------------------------------------------------------------------------ */

/* out[i * stride] = start + i * step, in double, stored as lt_store_f64 stores (lt_dev_dtype). The
 * host's loop (core/copy.c, built with -mfma) computes it as one fused multiply-add, so this does too:
 * integer dtypes truncate, and a last-bit difference could move a value across an integer. */
template <typename T>
__host__ __device__ inline void sequence_range(T *out, int64_t stride, int64_t n, double start, double step,
                                               int64_t first, int64_t every) {
  for (int64_t i = first; i < n; i += every) out[i * stride] = lt_dev_dtype<T>::store(fma((double)i, step, start));
}

template <typename T>
__global__ void __launch_bounds__(LT_CUDA_THREADS)
    sequence_kernel(T *out, int64_t stride, int64_t n, double start, double step) {
  sequence_range(out, stride, n, start, step, (int64_t)blockIdx.x * blockDim.x + threadIdx.x,
                 (int64_t)gridDim.x * blockDim.x);
}

int lt_cuda_sequence(int device, void *out, int64_t stride, int dtype, int64_t n, double start, double step) {
  if (!lt_dtype_size(dtype)) return lt_errorf("arange: unknown dtype %d", dtype);
  if (n <= 0) return 0;
  if (device != LT_DEVICE_CPU) LT_TRY(lt_cuda_use_device("arange", device));
  lt_with_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (device == LT_DEVICE_CPU) { /* the test hook: the same loop on the host */
      for (int t = 0; t < EW_HOST_THREADS; t++) sequence_range((T *)out, stride, n, start, step, t, EW_HOST_THREADS);
      return;
    }
    sequence_kernel<T><<<lt_cuda_blocks(device, n), LT_CUDA_THREADS, 0, lt_cuda_compute_stream(device)>>>(
        (T *)out, stride, n, start, step);
  });
  return device == LT_DEVICE_CPU ? 0 : lt_cuda_check_launch("arange", device);
}
