/* rope.cu — rotary position embedding ("rotate half") on CUDA, host/ops_rope.c's recipe.
 *
 * The frequencies come from the host (the CPU's pow, bit for bit); angle = p * freq is the
 * same double multiply; cos and sin are libdevice's in double (the CPU's libm may differ in
 * the last bit), rounded to f32 for f32/bf16/f16 rows. The rotation is written with
 * explicit round-to-nearest multiplies and adds so that nvcc does not fuse them into FMAs
 * the CPU does not do: results match the CPU's to rounding of cos/sin only.
 *
 * One thread per (b, t, i < D/2): it computes the angle's cos and sin once and rotates the
 * pair (i, i + D/2) of every head h. Any strides; out may be x (in place). */
#include "common.cuh"
extern "C" {
#include "caching_alloc.h"
#include "cuda_nn_ops.h"
}

namespace {

struct rope_geom { /* by value to the kernel */
  int64_t B, T, H, half;
  int64_t xs[4], os[4], ps[2];
  int p64, has_pos, per_batch;
  double sign;
};

template <typename T> __device__ inline float to_f32(T x) {
  if constexpr (std::is_same<T, lt_bf16_bits>::value)
    return lt_bf16_to_f32(x.bits);
  else if constexpr (std::is_same<T, lt_f16_bits>::value)
    return lt_f16_to_f32(x.bits);
  else
    return x;
}
template <typename T> __device__ inline T from_f32(float v) {
  if constexpr (std::is_same<T, lt_bf16_bits>::value)
    return {lt_f32_to_bf16(v)};
  else if constexpr (std::is_same<T, lt_f16_bits>::value)
    return {lt_f32_to_f16(v)};
  else
    return v;
}

// x, out are (B, T, H, D) with strides g.xs, g.os; freq (D/2) f64; pos (T) or (B, T) or none
template <typename T>
__global__ void rope_kernel(T *out, const T *x, const double *freq, const void *pos, rope_geom g) {
  int64_t total = g.B * g.T * g.half;
  for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
       idx += (int64_t)gridDim.x * blockDim.x) {
    int64_t i = idx % g.half, bt = idx / g.half, b = bt / g.T, t = bt % g.T;
    double p = (double)t;
    if (g.has_pos) {
      int64_t off = g.per_batch ? b * g.ps[0] + t * g.ps[1] : t * g.ps[0];
      p = g.p64 ? (double)((const int64_t *)pos)[off] : (double)((const int32_t *)pos)[off];
    }
    double angle = p * freq[i], c, s;
    sincos(angle, &s, &c);
    s = g.sign * s;
    int64_t xo = b * g.xs[0] + t * g.xs[1] + i * g.xs[3], oo = b * g.os[0] + t * g.os[1] + i * g.os[3];
    int64_t xh = g.half * g.xs[3], oh = g.half * g.os[3];
    if constexpr (std::is_same<T, double>::value) {
      for (int64_t h = 0; h < g.H; h++, xo += g.xs[2], oo += g.os[2]) {
        double x0 = x[xo], x1 = x[xo + xh];
        out[oo] = __dsub_rn(__dmul_rn(x0, c), __dmul_rn(x1, s));
        out[oo + oh] = __dadd_rn(__dmul_rn(x1, c), __dmul_rn(x0, s));
      }
    } else {
      float cf = (float)c, sf = (float)s;
      for (int64_t h = 0; h < g.H; h++, xo += g.xs[2], oo += g.os[2]) {
        float x0 = to_f32(x[xo]), x1 = to_f32(x[xo + xh]);
        out[oo] = from_f32<T>(__fsub_rn(__fmul_rn(x0, cf), __fmul_rn(x1, sf)));
        out[oo + oh] = from_f32<T>(__fadd_rn(__fmul_rn(x1, cf), __fmul_rn(x0, sf)));
      }
    }
  }
}

} // namespace

int lt_cuda_rope(const lt_cuda_rope_args *a) {
  const char *op = "rope";
  int64_t half = a->D / 2, total = a->B * a->T * half;
  if (total == 0 || a->H == 0) return 0;
  LT_TRY(lt_cuda_use_device(op, a->device));
  cudaStream_t s = lt_cuda_compute_stream(a->device);
  double *freq = NULL;
  LT_TRY(lt_cuda_alloc_stream(a->device, half * (int64_t)sizeof(double), s, (void **)&freq));
  /* from pageable memory: staged before the call returns, so a->freq may be freed after */
  cudaError_t err = cudaMemcpyAsync(freq, a->freq, (size_t)half * sizeof(double), cudaMemcpyHostToDevice, s);
  if (err != cudaSuccess) {
    lt_cuda_free(a->device, freq);
    return lt_cuda_error(op, a->device, err);
  }
  rope_geom g;
  g.B = a->B, g.T = a->T, g.H = a->H, g.half = half;
  for (int d = 0; d < 4; d++) g.xs[d] = a->xs[d], g.os[d] = a->os[d];
  g.ps[0] = a->ps[0], g.ps[1] = a->ps[1];
  g.p64 = a->pdtype == LT_I64, g.has_pos = a->pos != NULL, g.per_batch = a->per_batch;
  g.sign = a->sign;
  int blocks = lt_cuda_blocks(a->device, total);
  switch (a->dtype) {
  case LT_F32:
    rope_kernel<float><<<blocks, LT_CUDA_THREADS, 0, s>>>((float *)a->out, (const float *)a->x, freq, a->pos, g);
    break;
  case LT_F64:
    rope_kernel<double><<<blocks, LT_CUDA_THREADS, 0, s>>>((double *)a->out, (const double *)a->x, freq, a->pos, g);
    break;
  case LT_BF16:
    rope_kernel<lt_bf16_bits>
        <<<blocks, LT_CUDA_THREADS, 0, s>>>((lt_bf16_bits *)a->out, (const lt_bf16_bits *)a->x, freq, a->pos, g);
    break;
  case LT_F16:
    rope_kernel<lt_f16_bits>
        <<<blocks, LT_CUDA_THREADS, 0, s>>>((lt_f16_bits *)a->out, (const lt_f16_bits *)a->x, freq, a->pos, g);
    break;
  default:
    lt_cuda_free(a->device, freq);
    return lt_errorf("%s: dtype %s is not supported on cuda", op, lt_dtype_name(a->dtype));
  }
  int rc = lt_cuda_check_launch(op, a->device);
  lt_cuda_free(a->device, freq); /* stream-ordered: reused only after the kernel */
  return rc;
}
