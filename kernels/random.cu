/* random.cu — lt_rand_uniform / normal / int / bernoulli on CUDA tensors.
 *
 * Element i of out (row-major over its shape, whatever the strides) draws the Philox words of
 * counter offset + i under key seed and turns them into a value with kernels/philox.h's
 * transforms, the very functions host/ops/random.c runs, then stores it as ops/random.c's store_values does
 * (double -> f32 -> bf16/f16, integers cast). So every value is bit-identical with the CPU's,
 * except the normal's, whose log and cos are libdevice's here (kernels/philox.h says why). */
#include "kernels/common.cuh"
#include "kernels/philox.h"
extern "C" {
#include "kernels/random.h"
}

namespace {

struct rng_params { /* by value to the kernels */
  int kind, f64;
  uint32_t key[2];
  uint64_t offset, first_top, range;
  double a, b;
  uint32_t below;
  int64_t ilo;
};

struct rng_dims {
  int64_t v[LT_MAX_DIMS];
};

/* Element i's value: a double (uniform, normal) or an integer (int, bernoulli). */
__host__ __device__ inline bool rng_value(const rng_params &p, uint64_t i, double *v, int64_t *iv) {
  uint32_t w0, w1;
  lt_philox_draw(p.key, p.offset + i, &w0, &w1);
  switch (p.kind) {
  case LT_RNG_UNIFORM:
    *v = p.f64 ? lt_philox_uniform53_value(lt_philox_uniform_k53(w0, w1), p.a, p.b, p.first_top)
               : lt_philox_uniform24_value(lt_philox_uniform_k24(w0), p.a, p.b, p.first_top);
    return false;
  case LT_RNG_NORMAL: *v = lt_philox_normal_value(w0, w1, p.a, p.b); return false;
  case LT_RNG_INT: *iv = lt_philox_int_value(w0, w1, p.ilo, p.range); return true;
  default: *iv = lt_philox_bernoulli_value(w0, p.below); return true;
  }
}

/* host/ops/random.c's store_values, one element. */
template <typename T> __host__ __device__ inline T rng_store(double v, int64_t iv, bool ints) {
  if constexpr (std::is_same<T, double>::value) {
    return ints ? (double)iv : v;
  } else if constexpr (std::is_same<T, float>::value) {
    return ints ? (float)iv : (float)v;
  } else if constexpr (std::is_same<T, lt_bf16_bits>::value) {
    return {lt_f32_to_bf16(ints ? (float)iv : (float)v)};
  } else if constexpr (std::is_same<T, lt_f16_bits>::value) {
    return {lt_f32_to_f16(ints ? (float)iv : (float)v)};
  } else if constexpr (std::is_same<T, int32_t>::value) {
    return (int32_t)iv;
  } else if constexpr (std::is_same<T, int64_t>::value) {
    return iv;
  } else if constexpr (std::is_same<T, uint8_t>::value) {
    return (uint8_t)iv;
  } else {
    return {(uint8_t)iv};
  }
}

template <typename T> __host__ __device__ inline T rng_element(const rng_params &p, uint64_t i) {
  double v = 0;
  int64_t iv = 0;
  bool ints = rng_value(p, i, &v, &iv);
  return rng_store<T>(v, iv, ints);
}

// out is contiguous (n); runs of N elements go out as one 128-bit store when N > 1.
template <typename T, int N> __global__ void rng_contig_kernel(T *out, int64_t n, rng_params p) {
  int64_t stride = (int64_t)gridDim.x * blockDim.x, first = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  int64_t runs = n / N;
  for (int64_t r = first; r < runs; r += stride) {
    lt_dev_vec<T, N> vec;
#pragma unroll
    for (int k = 0; k < N; k++) vec.v[k] = rng_element<T>(p, (uint64_t)(r * N + k));
    reinterpret_cast<lt_dev_vec<T, N> *>(out)[r] = vec;
  }
  for (int64_t i = runs * N + first; i < n; i += stride) out[i] = rng_element<T>(p, (uint64_t)i);
}

// out has any layout: element i (row-major over shape) lives at base[offset_of(i)].
template <typename T>
__global__ void rng_strided_kernel(T *base, int64_t n, int ndim, rng_dims shape, rng_dims stride, rng_params p) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t rest = i, off = 0;
    for (int d = ndim - 1; d >= 0; d--) {
      off += (rest % shape.v[d]) * stride.v[d];
      rest /= shape.v[d];
    }
    base[off] = rng_element<T>(p, (uint64_t)i);
  }
}

/* The kernels' parameters from the host's arguments. */
rng_params make_params(const lt_cuda_rng_args *a) {
  rng_params p;
  p.kind = a->kind, p.f64 = a->dtype == LT_F64;
  p.key[0] = a->key[0], p.key[1] = a->key[1];
  p.offset = a->offset, p.first_top = a->first_top, p.range = a->range;
  p.a = a->a, p.b = a->b, p.below = a->below, p.ilo = a->ilo;
  return p;
}

/* True when element i of out lives at data[i] (dims of size 1 have any stride). */
bool is_contiguous(const lt_cuda_rng_args *a) {
  int64_t cstride[LT_MAX_DIMS];
  lt_contiguous_strides(a->ndim, a->shape, cstride);
  bool contiguous = true;
  for (int d = 0; d < a->ndim; d++) contiguous &= a->shape[d] == 1 || a->stride[d] == cstride[d];
  return contiguous;
}

const char *op_name(int kind) {
  static const char *names[4] = {"rand_uniform", "rand_normal", "rand_int", "rand_bernoulli"};
  return names[kind & 3];
}

} // namespace

int lt_cuda_rng_fill(const lt_cuda_rng_args *a) {
  const char *op = op_name(a->kind);
  int64_t n = lt_shape_numel(a->ndim, a->shape);
  if (n == 0) return 0;
  LT_TRY(lt_cuda_use_device(op, a->device));
  rng_params p = make_params(a);
  bool contiguous = is_contiguous(a);
  rng_dims shape, stride;
  for (int d = 0; d < LT_MAX_DIMS; d++) {
    shape.v[d] = d < a->ndim ? a->shape[d] : 1;
    stride.v[d] = d < a->ndim ? a->stride[d] : 0;
  }
  cudaStream_t s = lt_cuda_compute_stream(a->device);
  bool known = lt_with_dtype(a->dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int N = 16 / sizeof(T);
    if (contiguous && lt_aligned(a->data, 16))
      rng_contig_kernel<T, N><<<lt_cuda_blocks(a->device, n / N + N), LT_CUDA_THREADS, 0, s>>>((T *)a->data, n, p);
    else if (contiguous)
      rng_contig_kernel<T, 1><<<lt_cuda_blocks(a->device, n), LT_CUDA_THREADS, 0, s>>>((T *)a->data, n, p);
    else
      rng_strided_kernel<T>
          <<<lt_cuda_blocks(a->device, n), LT_CUDA_THREADS, 0, s>>>((T *)a->data, n, a->ndim, shape, stride, p);
  });
  if (!known) return lt_errorf("%s: unknown dtype %d", op, a->dtype);
  return lt_cuda_check_launch(op, a->device);
}

/* The kernels' element rule and layout run on the CPU over host memory at a->data, exported for
 * tests/c/test_nn_kernels_host.c (which routes host/ops/random.c's CUDA calls here): checks the
 * arguments ops/random.c passes and the per-element code against lt_rand_* on the CPU. */
extern "C" int lt_cuda_rng_fill_on_host(const lt_cuda_rng_args *a) {
  int64_t n = lt_shape_numel(a->ndim, a->shape);
  rng_params p = make_params(a);
  bool contiguous = is_contiguous(a);
  bool known = lt_with_dtype(a->dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    for (int64_t i = 0; i < n; i++) {
      int64_t off = contiguous ? i : lt_offset_of(i, a->ndim, a->shape, a->stride);
      ((T *)a->data)[off] = rng_element<T>(p, (uint64_t)i);
    }
  });
  return known ? 0 : lt_errorf("%s: unknown dtype %d", op_name(a->kind), a->dtype);
}
