/* unary.cu — out = op(a), its gradient, and clamp on CUDA, with host/ops/unary.c's semantics:
 * f32, bf16 and f16 compute in f32 (16-bit results rounded to nearest even), f64 in f64; neg,
 * abs, relu and square also on integers, wrapping on overflow; clamp keeps NaN. The formulas are
 * the CPU's, term for term (sigmoid from exp(-|x|), GELU in its tanh form, the same derivative
 * expressions); the device's expf/tanhf/logf/sinf/cosf/powf are within 2 ulp of exact, as are the
 * CPU's, so results agree to a few ulp (not bit for bit: the CPU's f32 exp and tanh are its own
 * polynomials, host/ops/vecmath.h). */
#include "kernels/elementwise.cuh"
#include <stdio.h>

/* ---- scalar functions, float and double ---------------------------------------------------- */

__host__ __device__ inline float ew_exp(float x) { return expf(x); }
__host__ __device__ inline double ew_exp(double x) { return exp(x); }
__host__ __device__ inline float ew_log(float x) { return logf(x); }
__host__ __device__ inline double ew_log(double x) { return log(x); }
__host__ __device__ inline float ew_sqrt(float x) { return sqrtf(x); }
__host__ __device__ inline double ew_sqrt(double x) { return sqrt(x); }
__host__ __device__ inline float ew_tanh(float x) { return tanhf(x); }
__host__ __device__ inline double ew_tanh(double x) { return tanh(x); }
__host__ __device__ inline float ew_fabs(float x) { return fabsf(x); }
__host__ __device__ inline double ew_fabs(double x) { return fabs(x); }
__host__ __device__ inline float ew_erf(float x) { return erff(x); }
__host__ __device__ inline double ew_erf(double x) { return erf(x); }
__host__ __device__ inline float ew_sin(float x) { return sinf(x); }
__host__ __device__ inline double ew_sin(double x) { return sin(x); }
__host__ __device__ inline float ew_cos(float x) { return cosf(x); }
__host__ __device__ inline double ew_cos(double x) { return cos(x); }

/* sqrt(2/pi) and the cubic coefficient of the tanh approximation of GELU (as ops/unary.c). */
#define GELU_K 0.7978845608028654
#define GELU_C 0.044715

template <typename T> __host__ __device__ inline T ew_sigmoid(T x) { /* exp of -|x| only: no overflow */
  T e = ew_exp(x < 0 ? x : -x);
  return (x < 0 ? e : (T)1) / (1 + e);
}
template <typename T> __host__ __device__ inline T ew_gelu(T x) {
  return (T)0.5 * x * (1 + ew_tanh((T)GELU_K * (x + (T)GELU_C * x * x * x)));
}
template <typename T> __host__ __device__ inline T ew_gelu_grad(T x) {
  T t = ew_tanh((T)GELU_K * (x + (T)GELU_C * x * x * x));
  return (T)0.5 * (1 + t) + (T)0.5 * x * (1 - t * t) * (T)GELU_K * (1 + 3 * (T)GELU_C * x * x);
}

/* 1/sqrt(2), 2/sqrt(pi), 1/sqrt(2 pi) (as ops/unary.c): exact GELU and erf's derivative. */
#define SQRT1_2 0.7071067811865476
#define TWO_OVER_SQRTPI 1.1283791670955126
#define INV_SQRT_2PI 0.3989422804014327
template <typename T> __host__ __device__ inline T ew_gelu_erf(T x) { return x * (T)0.5 * (1 + ew_erf(x * (T)SQRT1_2)); }
template <typename T> __host__ __device__ inline T ew_gelu_erf_grad(T x) {
  return (T)0.5 * (1 + ew_erf(x * (T)SQRT1_2)) + x * (T)INV_SQRT_2PI * ew_exp((T)-0.5 * x * x);
}

template <typename T> __host__ __device__ inline T unary_float(int op, T x) {
  switch (op) {
  case LT_NEG: return -x;
  case LT_EXP: return ew_exp(x);
  case LT_LOG: return ew_log(x);
  case LT_SQRT: return ew_sqrt(x);
  case LT_RSQRT: return 1 / ew_sqrt(x); /* not rsqrtf: that one is approximate */
  case LT_TANH: return ew_tanh(x);
  case LT_SIGMOID: return ew_sigmoid(x);
  case LT_RELU: return x < 0 ? (T)0 : x; /* NaN stays NaN */
  case LT_GELU: return ew_gelu(x);
  case LT_SILU: return x * ew_sigmoid(x);
  case LT_ABS: return ew_fabs(x);
  case LT_SIN: return ew_sin(x);
  case LT_COS: return ew_cos(x);
  case LT_SQUARE: return x * x;
  case LT_ERF: return ew_erf(x);
  case LT_GELU_ERF: return ew_gelu_erf(x);
  default: return 1 / x; /* LT_RECIPROCAL */
  }
}

/* The unsigned type integer arithmetic wraps in (u8 in 32 bits, as C promotes it). */
template <typename T>
using ew_unsigned = typename std::conditional<(sizeof(T) < 4), uint32_t, typename std::make_unsigned<T>::type>::type;

template <typename T> __host__ __device__ inline bool ew_negative(T x) {
  if constexpr (std::is_unsigned<T>::value)
    return false;
  else
    return x < 0;
}

template <typename T> __host__ __device__ inline T unary_int(int op, T x) {
  using UT = ew_unsigned<T>;
  switch (op) {
  case LT_NEG: return (T)((UT)0 - (UT)x);
  case LT_ABS: return ew_negative(x) ? (T)((UT)0 - (UT)x) : x; /* identity for u8 */
  case LT_RELU: return ew_negative(x) ? (T)0 : x;
  default: return (T)((UT)x * (UT)x); /* LT_SQUARE */
  }
}

template <typename T> __host__ __device__ inline T unary_grad(int op, T g, T x) {
  switch (op) {
  case LT_NEG: return -g;
  case LT_EXP: return g * ew_exp(x);
  case LT_LOG: return g / x;
  case LT_SQRT: return g * (T)0.5 / ew_sqrt(x);
  case LT_RSQRT: return g * (T)-0.5 / (x * ew_sqrt(x));
  case LT_TANH: return g * (1 - ew_tanh(x) * ew_tanh(x));
  case LT_SIGMOID: {
    T s = ew_sigmoid(x);
    return g * s * (1 - s);
  }
  case LT_RELU: return x > 0 ? g : (T)0;
  case LT_GELU: return g * ew_gelu_grad(x);
  case LT_SILU: {
    T s = ew_sigmoid(x);
    return g * s * (1 + x * (1 - s));
  }
  case LT_ABS: return x > 0 ? g : x < 0 ? -g : (T)0;
  case LT_SIN: return g * ew_cos(x);
  case LT_COS: return -g * ew_sin(x);
  case LT_SQUARE: return 2 * g * x;
  case LT_ERF: return g * (T)TWO_OVER_SQRTPI * ew_exp(-x * x);
  case LT_GELU_ERF: return g * ew_gelu_erf_grad(x);
  default: return -g / (x * x); /* LT_RECIPROCAL */
  }
}

/* ---- functors ------------------------------------------------------------------------------------ */

template <typename T> struct unary_fn {
  using C = typename ew_compute<T>::type;
  static constexpr int nops = 2, vec_n = ew_vec_n<T>();
  T *out;
  const T *a;
  int op;
  __host__ __device__ T apply(T v) const {
    if constexpr (std::is_floating_point<C>::value)
      return ew_store<T>(unary_float(op, ew_load<C>(v)));
    else
      return unary_int(op, v);
  }
  __host__ __device__ void one(const int64_t *off) const { out[off[0]] = apply(a[off[1]]); }
  __host__ __device__ void vec(int64_t r) const {
    lt_dev_vec<T, vec_n> x = ew_vload<vec_n>(a, r), y;
    LT_EW_UNROLL for (int k = 0; k < vec_n; k++) y.v[k] = apply(x.v[k]);
    ew_vstore<vec_n>(out, r, y);
  }
  bool aligned() const { return lt_aligned(out, 16) && lt_aligned(a, 16); }
};

template <typename T> struct unary_backward_fn {
  using C = typename ew_compute<T>::type;
  static constexpr int nops = 3, vec_n = ew_vec_n<T>();
  T *grad_in;
  const T *grad_out, *x;
  int op;
  __host__ __device__ T apply(T g, T v) const { return ew_store<T>(unary_grad(op, ew_load<C>(g), ew_load<C>(v))); }
  __host__ __device__ void one(const int64_t *off) const { grad_in[off[0]] = apply(grad_out[off[1]], x[off[2]]); }
  __host__ __device__ void vec(int64_t r) const {
    lt_dev_vec<T, vec_n> g = ew_vload<vec_n>(grad_out, r), v = ew_vload<vec_n>(x, r), y;
    LT_EW_UNROLL for (int k = 0; k < vec_n; k++) y.v[k] = apply(g.v[k], v.v[k]);
    ew_vstore<vec_n>(grad_in, r, y);
  }
  bool aligned() const { return lt_aligned(grad_in, 16) && lt_aligned(grad_out, 16) && lt_aligned(x, 16); }
};

/* min(max(x, lo), hi) written as the CPU's selects: a NaN x fails both compares and stays. */
template <typename T> struct clamp_fn {
  using C = typename ew_compute<T>::type;
  static constexpr int nops = 2, vec_n = ew_vec_n<T>();
  T *out;
  const T *a;
  C lo, hi;
  __host__ __device__ T apply(T v) const {
    C x = ew_load<C>(v), y = x < lo ? lo : x;
    return ew_store<T>(y > hi ? hi : y);
  }
  __host__ __device__ void one(const int64_t *off) const { out[off[0]] = apply(a[off[1]]); }
  __host__ __device__ void vec(int64_t r) const {
    lt_dev_vec<T, vec_n> x = ew_vload<vec_n>(a, r), y;
    LT_EW_UNROLL for (int k = 0; k < vec_n; k++) y.v[k] = apply(x.v[k]);
    ew_vstore<vec_n>(out, r, y);
  }
  bool aligned() const { return lt_aligned(out, 16) && lt_aligned(a, 16); }
};

/* ---- launchers ------------------------------------------------------------------------------------- */

template <typename T> constexpr bool ew_is_float = std::is_floating_point<typename ew_compute<T>::type>::value;
template <typename T> constexpr bool ew_is_arith = !std::is_same<T, lt_bool_byte>::value;

static int unknown_dtype(const char *op, int dtype) {
  return lt_errorf("%s: dtype %s is not supported on cuda", op, lt_dtype_name(dtype));
}

int lt_cuda_unary(int device, int op, int dtype, const lt_ew_geom *g, void *out, const void *a) {
  const char *name = lt_unary_name(op);
  int rc = unknown_dtype(name, dtype);
  lt_with_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (ew_is_arith<T>) rc = ew_launch(name, device, unary_fn<T>{(T *)out, (const T *)a, op}, *g);
  });
  return rc;
}

int lt_cuda_unary_backward(int device, int op, int dtype, const lt_ew_geom *g, void *grad_in, const void *grad_out,
                           const void *x) {
  char name[48];
  snprintf(name, sizeof name, "%s_backward", lt_unary_name(op));
  int rc = unknown_dtype(name, dtype);
  lt_with_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (ew_is_float<T>)
      rc = ew_launch(name, device, unary_backward_fn<T>{(T *)grad_in, (const T *)grad_out, (const T *)x, op}, *g);
  });
  return rc;
}

int lt_cuda_clamp(int device, int dtype, const lt_ew_geom *g, void *out, const void *a, double lo, double hi) {
  int rc = unknown_dtype("clamp", dtype);
  lt_with_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = typename ew_compute<T>::type;
    if constexpr (ew_is_arith<T>)
      rc = ew_launch("clamp", device, clamp_fn<T>{(T *)out, (const T *)a, (C)lo, (C)hi}, *g);
  });
  return rc;
}
