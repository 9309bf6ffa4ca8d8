/* elementwise.cu — fill, dtype conversion and add on contiguous CUDA buffers.
 *
 * Each kernel is a grid-stride loop over runs of N elements moved with one 128-bit
 * load/store (when every pointer is aligned for it), then a scalar tail. Results are
 * bit-identical with the CPU: fill writes the bit pattern the host computed, convert
 * follows host/core/copy.c's conversion rules, and 16-bit adds compute in f32 and round to
 * nearest even as the host does. */
#include "kernels/elementwise.cuh"

/* ---- the shared loop shape ------------------------------------------------------------ */

/* Calls op(i) for i in [0, n) run by run: op.vec(r) handles elements [r*N, r*N+N),
 * op.one(i) handles a tail element. */
template <int N, typename Op> __device__ void grid_stride(int64_t n, Op op) {
  int64_t stride = (int64_t)gridDim.x * blockDim.x, first = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  int64_t runs = n / N;
  for (int64_t r = first; r < runs; r += stride) op.vec(r);
  for (int64_t i = runs * N + first; i < n; i += stride) op.one(i);
}

/* ---- fill ------------------------------------------------------------------------------- */

/* T is an unsigned integer of the element size; `pattern` is one element's bits. */
template <typename T, int N> struct fill_op {
  T *out;
  T pattern;
  __device__ void vec(int64_t r) {
    lt_dev_vec<T, N> v;
#pragma unroll
    for (int k = 0; k < N; k++) v.v[k] = pattern;
    reinterpret_cast<lt_dev_vec<T, N> *>(out)[r] = v;
  }
  __device__ void one(int64_t i) { out[i] = pattern; }
};

template <typename T, int N> __global__ void fill_kernel(T *out, T pattern, int64_t n) {
  grid_stride<N>(n, fill_op<T, N>{out, pattern});
}

template <typename T> static void launch_fill(int device, void *data, const unsigned char *bits, int64_t n) {
  T pattern;
  memcpy(&pattern, bits, sizeof pattern);
  constexpr int N = 16 / sizeof(T);
  int blocks = lt_cuda_blocks(device, n / N + N);
  if (lt_aligned(data, 16))
    fill_kernel<T, N><<<blocks, LT_CUDA_THREADS, 0, lt_cuda_compute_stream(device)>>>((T *)data, pattern, n);
  else
    fill_kernel<T, 1><<<blocks, LT_CUDA_THREADS, 0, lt_cuda_compute_stream(device)>>>((T *)data, pattern, n);
}

/* data[0..n) = value in dtype (bits as lt_store_f64 makes them on the host). */
int lt_cuda_fill_contig(int device, void *data, int dtype, int64_t n, double value) {
  int size = lt_dtype_size(dtype);
  if (!size) return lt_errorf("fill: unknown dtype %d", dtype);
  if (n <= 0) return 0;
  LT_TRY(lt_cuda_use_device("fill", device));
  unsigned char bits[8];
  lt_store_f64(bits, dtype, 0, value);
  switch (size) {
  case 1: launch_fill<uint8_t>(device, data, bits, n); break;
  case 2: launch_fill<uint16_t>(device, data, bits, n); break;
  case 4: launch_fill<uint32_t>(device, data, bits, n); break;
  default: launch_fill<uint64_t>(device, data, bits, n); break;
  }
  return lt_cuda_check_launch("fill", device);
}

/* ---- convert ------------------------------------------------------------------------------ */

template <typename D, typename S, int N> struct convert_op {
  D *dst;
  const S *src;
  __device__ void vec(int64_t r) {
    lt_dev_vec<S, N> in = reinterpret_cast<const lt_dev_vec<S, N> *>(src)[r];
    lt_dev_vec<D, N> res;
#pragma unroll
    for (int k = 0; k < N; k++) res.v[k] = convert_one<D>(in.v[k]);
    reinterpret_cast<lt_dev_vec<D, N> *>(dst)[r] = res;
  }
  __device__ void one(int64_t i) { dst[i] = convert_one<D>(src[i]); }
};

template <typename D, typename S, int N> __global__ void convert_kernel(D *dst, const S *src, int64_t n) {
  grid_stride<N>(n, convert_op<D, S, N>{dst, src});
}

template <typename D, typename S> static void launch_convert(int device, void *dst, const void *src, int64_t n) {
  /* 16 bytes on the wider side per run */
  constexpr int N = 16 / (sizeof(S) > sizeof(D) ? sizeof(S) : sizeof(D));
  int blocks = lt_cuda_blocks(device, n / N + N);
  if (lt_aligned(dst, sizeof(D) * N) && lt_aligned(src, sizeof(S) * N))
    convert_kernel<D, S, N>
        <<<blocks, LT_CUDA_THREADS, 0, lt_cuda_compute_stream(device)>>>((D *)dst, (const S *)src, n);
  else
    convert_kernel<D, S, 1>
        <<<blocks, LT_CUDA_THREADS, 0, lt_cuda_compute_stream(device)>>>((D *)dst, (const S *)src, n);
}

/* dst[0..n) (dst_dtype) = src[0..n) (src_dtype), both on `device`. */
int lt_cuda_convert_contig(int device, void *dst, int dst_dtype, const void *src, int src_dtype, int64_t n) {
  if (!lt_dtype_size(dst_dtype) || !lt_dtype_size(src_dtype))
    return lt_errorf("copy: unknown dtype (%d from %d)", dst_dtype, src_dtype);
  if (n <= 0) return 0;
  if (dst_dtype == src_dtype) return lt_cuda_memcpy(dst, device, src, device, n * lt_dtype_size(dst_dtype));
  LT_TRY(lt_cuda_use_device("copy", device));
  lt_with_dtype(dst_dtype, [&](auto dst_tag) {
    lt_with_dtype(src_dtype, [&](auto src_tag) {
      launch_convert<typename decltype(dst_tag)::type, typename decltype(src_tag)::type>(device, dst, src, n);
    });
  });
  return lt_cuda_check_launch("copy", device);
}

/* The kernels' element rule run on the CPU, exported for tests/c/test_cuda_nogpu.c: it
 * checks the rules against host/core/copy.c on machines without a GPU. Not part of lutra.h. */
extern "C" int lt_cuda_convert_on_host(void *dst, int dst_dtype, const void *src, int src_dtype, int64_t n) {
  bool known = lt_with_dtype(dst_dtype, [&](auto dst_tag) {
    lt_with_dtype(src_dtype, [&](auto src_tag) {
      using D = typename decltype(dst_tag)::type;
      using S = typename decltype(src_tag)::type;
      for (int64_t i = 0; i < n; i++) ((D *)dst)[i] = convert_one<D>(((const S *)src)[i]);
    });
  });
  return known && lt_dtype_size(src_dtype) ? 0 : lt_errorf("copy: unknown dtype (%d from %d)", dst_dtype, src_dtype);
}

/* ---- add ------------------------------------------------------------------------------------ */

/* add has kernels for f32, f64, bf16, f16, i32, i64 */
template <typename T>
constexpr bool add_supported =
    std::is_floating_point<T>::value || std::is_same<T, lt_bf16_bits>::value || std::is_same<T, lt_f16_bits>::value ||
    std::is_same<T, int32_t>::value || std::is_same<T, int64_t>::value;
static bool add_supported_dtype(int dtype) {
  bool ok = false;
  lt_with_dtype(dtype, [&](auto tag) { ok = add_supported<typename decltype(tag)::type>; });
  return ok;
}

template <typename T> __host__ __device__ inline T add_one(T a, T b) {
  if constexpr (std::is_same<T, lt_bf16_bits>::value)
    return {lt_f32_to_bf16(lt_bf16_to_f32(a.bits) + lt_bf16_to_f32(b.bits))};
  else if constexpr (std::is_same<T, lt_f16_bits>::value)
    return {lt_f32_to_f16(lt_f16_to_f32(a.bits) + lt_f16_to_f32(b.bits))};
  else if constexpr (std::is_integral<T>::value) /* wraps on overflow, as two's complement does */
    return (T)((typename std::make_unsigned<T>::type)a + (typename std::make_unsigned<T>::type)b);
  else
    return a + b;
}

template <typename T, int N> struct add_op {
  T *out;
  const T *a, *b;
  __device__ void vec(int64_t r) {
    lt_dev_vec<T, N> x = reinterpret_cast<const lt_dev_vec<T, N> *>(a)[r];
    lt_dev_vec<T, N> y = reinterpret_cast<const lt_dev_vec<T, N> *>(b)[r];
    lt_dev_vec<T, N> z;
#pragma unroll
    for (int k = 0; k < N; k++) z.v[k] = add_one(x.v[k], y.v[k]);
    reinterpret_cast<lt_dev_vec<T, N> *>(out)[r] = z;
  }
  __device__ void one(int64_t i) { out[i] = add_one(a[i], b[i]); }
};

template <typename T, int N> __global__ void add_kernel(T *out, const T *a, const T *b, int64_t n) {
  grid_stride<N>(n, add_op<T, N>{out, a, b});
}

template <typename T> static void launch_add(int device, void *out, const void *a, const void *b, int64_t n) {
  constexpr int N = 16 / sizeof(T);
  int blocks = lt_cuda_blocks(device, n / N + N);
  if (lt_aligned(out, 16) && lt_aligned(a, 16) && lt_aligned(b, 16))
    add_kernel<T, N>
        <<<blocks, LT_CUDA_THREADS, 0, lt_cuda_compute_stream(device)>>>((T *)out, (const T *)a, (const T *)b, n);
  else
    add_kernel<T, 1>
        <<<blocks, LT_CUDA_THREADS, 0, lt_cuda_compute_stream(device)>>>((T *)out, (const T *)a, (const T *)b, n);
}

/* out[0..n) = a[0..n) + b[0..n); out may alias a or b exactly (in place). */
int lt_cuda_add_contig(int device, void *out, const void *a, const void *b, int dtype, int64_t n) {
  if (!add_supported_dtype(dtype)) return lt_errorf("add: dtype %s is not supported on cuda", lt_dtype_name(dtype));
  if (n <= 0) return 0;
  LT_TRY(lt_cuda_use_device("add", device));
  lt_with_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (add_supported<T>) launch_add<T>(device, out, a, b, n);
  });
  return lt_cuda_check_launch("add", device);
}

/* As lt_cuda_convert_on_host, for add (tests only). */
extern "C" int lt_cuda_add_on_host(void *out, const void *a, const void *b, int dtype, int64_t n) {
  if (!add_supported_dtype(dtype)) return lt_errorf("add: dtype %s is not supported on cuda", lt_dtype_name(dtype));
  lt_with_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (add_supported<T>)
      for (int64_t i = 0; i < n; i++) ((T *)out)[i] = add_one(((const T *)a)[i], ((const T *)b)[i]);
  });
  return 0;
}
