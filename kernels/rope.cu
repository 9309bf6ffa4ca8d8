/* rope.cu — rotary position embedding ("rotate half") on CUDA, host/ops/rope.c's recipe.
 *
 * The frequencies come from the host (the CPU's pow, or the caller's table, bit for bit); angle
 * = p * freq is the same double multiply; cos and sin are libdevice's in double (the CPU's libm
 * may differ in the last bit), times the plan's scale in double, rounded to f32 for f32/bf16/f16 rows. The rotation
 * rounds every product and sum (explicit _rn intrinsics, which nvcc does not fuse): a fixed recipe, while the CPU build
 * (-mfma, GCC's default contraction) may fuse a product into an FMA. Results match the CPU's
 * to an ulp or two, not bitwise.
 *
 * One thread per (b, t, i < D/2): it computes the angle's cos and sin once and rotates the
 * pair (i, i + D/2) of every head h. Any strides; out may be x (in place). */
#include "kernels/common.cuh"
extern "C" {
#include "kernels/rope.h"
}

namespace {

struct rope_geom { /* by value to the kernel */
  int64_t B, T, H, half;
  int64_t xs[4], os[4], ps[2];
  int p64, has_pos, per_batch;
  double sign, scale;
};

template <typename T> __host__ __device__ inline float to_f32(T x) {
  if constexpr (std::is_same<T, lt_bf16_bits>::value)
    return lt_bf16_to_f32(x.bits);
  else if constexpr (std::is_same<T, lt_f16_bits>::value)
    return lt_f16_to_f32(x.bits);
  else
    return x;
}
template <typename T> __host__ __device__ inline T from_f32(float v) {
  if constexpr (std::is_same<T, lt_bf16_bits>::value)
    return {lt_f32_to_bf16(v)};
  else if constexpr (std::is_same<T, lt_f16_bits>::value)
    return {lt_f32_to_f16(v)};
  else
    return v;
}

/* Products and sums rounded one by one (no FMA), as the CPU computes them. */
#ifdef __CUDA_ARCH__
#define ROPE_MUL_F(a, b) __fmul_rn(a, b)
#define ROPE_ADD_F(a, b) __fadd_rn(a, b)
#define ROPE_SUB_F(a, b) __fsub_rn(a, b)
#define ROPE_MUL_D(a, b) __dmul_rn(a, b)
#define ROPE_ADD_D(a, b) __dadd_rn(a, b)
#define ROPE_SUB_D(a, b) __dsub_rn(a, b)
#else /* the host pass (lt_cuda_rope_on_host): x86-64 without FMA rounds each operation */
#define ROPE_MUL_F(a, b) ((a) * (b))
#define ROPE_ADD_F(a, b) ((a) + (b))
#define ROPE_SUB_F(a, b) ((a) - (b))
#define ROPE_MUL_D(a, b) ((a) * (b))
#define ROPE_ADD_D(a, b) ((a) + (b))
#define ROPE_SUB_D(a, b) ((a) - (b))
#endif

// Work item idx = (b, t, i < D/2): the pairs (i, i + D/2) of every head of x (B, T, H, D), strides
// g.xs, rotated into out (strides g.os); freq (D/2) f64; pos (T) or (B, T) or none.
template <typename T>
__host__ __device__ inline void rope_item(T *out, const T *x, const double *freq, const void *pos, const rope_geom &g,
                                          int64_t idx) {
  int64_t i = idx % g.half, bt = idx / g.half, b = bt / g.T, t = bt % g.T;
  double p = (double)t;
  if (g.has_pos) {
    int64_t off = g.per_batch ? b * g.ps[0] + t * g.ps[1] : t * g.ps[0];
    p = g.p64 ? (double)((const int64_t *)pos)[off] : (double)((const int32_t *)pos)[off];
  }
  double angle = p * freq[i], c, s;
#ifdef __CUDA_ARCH__
  sincos(angle, &s, &c);
#else
  s = sin(angle), c = cos(angle);
#endif
  s = g.sign * s;
  c = ROPE_MUL_D(g.scale, c), s = ROPE_MUL_D(g.scale, s); /* exact when scale is 1 */
  int64_t xo = b * g.xs[0] + t * g.xs[1] + i * g.xs[3], oo = b * g.os[0] + t * g.os[1] + i * g.os[3];
  int64_t xh = g.half * g.xs[3], oh = g.half * g.os[3];
  if constexpr (std::is_same<T, double>::value) {
    for (int64_t h = 0; h < g.H; h++, xo += g.xs[2], oo += g.os[2]) {
      double x0 = x[xo], x1 = x[xo + xh];
      out[oo] = ROPE_SUB_D(ROPE_MUL_D(x0, c), ROPE_MUL_D(x1, s));
      out[oo + oh] = ROPE_ADD_D(ROPE_MUL_D(x1, c), ROPE_MUL_D(x0, s));
    }
  } else {
    float cf = (float)c, sf = (float)s;
    for (int64_t h = 0; h < g.H; h++, xo += g.xs[2], oo += g.os[2]) {
      float x0 = to_f32(x[xo]), x1 = to_f32(x[xo + xh]);
      out[oo] = from_f32<T>(ROPE_SUB_F(ROPE_MUL_F(x0, cf), ROPE_MUL_F(x1, sf)));
      out[oo + oh] = from_f32<T>(ROPE_ADD_F(ROPE_MUL_F(x1, cf), ROPE_MUL_F(x0, sf)));
    }
  }
}

template <typename T>
__global__ void rope_kernel(T *out, const T *x, const double *freq, const void *pos, rope_geom g) {
  int64_t total = g.B * g.T * g.half;
  for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
       idx += (int64_t)gridDim.x * blockDim.x)
    rope_item(out, x, freq, pos, g, idx);
}

rope_geom make_geom(const lt_rope_plan *a) {
  rope_geom g;
  g.B = a->B, g.T = a->T, g.H = a->H, g.half = a->D / 2;
  for (int d = 0; d < 4; d++) g.xs[d] = a->xs[d], g.os[d] = a->os[d];
  g.ps[0] = a->ps[0], g.ps[1] = a->ps[1];
  g.p64 = a->pdtype == LT_I64, g.has_pos = a->pos != NULL, g.per_batch = a->per_batch;
  g.sign = a->sign, g.scale = a->scale;
  return g;
}

} // namespace

int lt_cuda_rope(const lt_rope_plan *a) {
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
  rope_geom g = make_geom(a);
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

/* The kernel's work items run on the CPU over host memory (cos and sin from libm, products and
 * sums unfused), exported for tests/c/test_nn_kernels_host.c, which routes host/ops/rope.c's CUDA
 * calls here: checks the arguments ops/rope.c passes and the index math against the CPU op. */
extern "C" int lt_cuda_rope_on_host(const lt_rope_plan *a) {
  rope_geom g = make_geom(a);
  int64_t total = a->H == 0 ? 0 : a->B * a->T * g.half;
  for (int64_t idx = 0; idx < total; idx++) {
    switch (a->dtype) {
    case LT_F32: rope_item((float *)a->out, (const float *)a->x, a->freq, a->pos, g, idx); break;
    case LT_F64: rope_item((double *)a->out, (const double *)a->x, a->freq, a->pos, g, idx); break;
    case LT_BF16: rope_item((lt_bf16_bits *)a->out, (const lt_bf16_bits *)a->x, a->freq, a->pos, g, idx); break;
    case LT_F16: rope_item((lt_f16_bits *)a->out, (const lt_f16_bits *)a->x, a->freq, a->pos, g, idx); break;
    default: return lt_errorf("rope: dtype %s is not supported on cuda", lt_dtype_name(a->dtype));
    }
  }
  return 0;
}
