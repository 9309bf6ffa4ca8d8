/* unary.c — out = op(a), its gradient, and clamp. Floats compute in their own
 * type (f64 in double), bf16/f16 in f32 by blocks; neg, abs, relu and square also
 * run on integers (wrapping on overflow). */
/* Float compare-and-select (clamping, NaN checks, maximum, relu) and sqrt only vectorise when
 * the compiler may ignore FP exception flags and errno, which nothing here reads. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math", "no-math-errno")
#endif
#include "ops/backend.h"
#include "ops/elementwise.h"
#include <stdio.h>

static const char *const unary_names[LT_NUM_UNARY_OPS] = {"neg",  "exp",     "log",  "sqrt",   "rsqrt",
                                                          "tanh", "sigmoid", "relu", "gelu",   "silu",
                                                          "abs",  "sin",     "cos",  "square", "reciprocal",
                                                          "erf",  "gelu_erf"};

const char *lt_unary_name(int op) { return op >= 0 && op < LT_NUM_UNARY_OPS ? unary_names[op] : "?"; }

static bool is_int_unary(int op) { return op == LT_NEG || op == LT_ABS || op == LT_RELU || op == LT_SQUARE; }
static bool is_cheap_unary(int op) { return is_int_unary(op) || op == LT_RECIPROCAL || op == LT_SQRT; }

/* sqrt(2/pi) and the cubic coefficient of the tanh approximation of GELU. */
#define GELU_K 0.7978845608028654
#define GELU_C 0.044715

/* 1/sqrt(2), 2/sqrt(pi) and 1/sqrt(2 pi): erf's derivative and the normal density of exact GELU. */
#define SQRT1_2 0.7071067811865476
#define TWO_OVER_SQRTPI 1.1283791670955126
#define INV_SQRT_2PI 0.3989422804014327

/* Scalar functions and derivatives shared by forward and backward, for float (S = f)
 * and double (S = d). */
#define DEFINE_SCALAR_FNS(T, S, EXP, TANH, ERF)                                                                        \
  static inline T sigmoid_##S(T x) { /* exp of -|x| only: no overflow, tiny results kept */                            \
    T e = EXP(x < 0 ? x : -x);                                                                                         \
    return (x < 0 ? e : 1) / (1 + e);                                                                                  \
  }                                                                                                                    \
  static inline T gelu_##S(T x) { return (T)0.5 * x * (1 + TANH((T)GELU_K * (x + (T)GELU_C * x * x * x))); }           \
  static inline T gelu_grad_##S(T x) {                                                                                 \
    T t = TANH((T)GELU_K * (x + (T)GELU_C * x * x * x));                                                               \
    return (T)0.5 * (1 + t) + (T)0.5 * x * (1 - t * t) * (T)GELU_K * (1 + 3 * (T)GELU_C * x * x);                      \
  }                                                                                                                    \
  static inline T gelu_erf_##S(T x) { return x * (T)0.5 * (1 + ERF(x * (T)SQRT1_2)); } /* torch's expression */       \
  static inline T gelu_erf_grad_##S(T x) {                                                                             \
    return (T)0.5 * (1 + ERF(x * (T)SQRT1_2)) + x * (T)INV_SQRT_2PI * EXP((T)-0.5 * x * x);                            \
  }
DEFINE_SCALAR_FNS(float, f, ew_expf, ew_tanhf, erff)
DEFINE_SCALAR_FNS(double, d, exp, tanh, erf)

/* ---- forward runs: o[i*so] = f(a[i*sa]) ------------------------------------------ */

#define UNARY_RUN(T, EXPR)                                                                                             \
  do {                                                                                                                 \
    T *o_ = (T *)po;                                                                                                   \
    const T *a_ = (const T *)pa;                                                                                       \
    if (so == 1 && sa == 1) {                                                                                          \
      _Pragma("omp simd") for (int64_t i = 0; i < n; i++) {                                                            \
        T x = a_[i];                                                                                                   \
        o_[i] = (T)(EXPR);                                                                                             \
      }                                                                                                                \
    } else {                                                                                                           \
      for (int64_t i = 0; i < n; i++) {                                                                                \
        T x = a_[i * sa];                                                                                              \
        o_[i * so] = (T)(EXPR);                                                                                        \
      }                                                                                                                \
    }                                                                                                                  \
  } while (0)

#define UNARY_ARGS int op, char *po, int64_t so, const char *pa, int64_t sa, int64_t n

#define DEFINE_FLOAT_UNARY(NAME, T, S, EXP, LOG, SQRT, TANH, FABS, SIN, COS, ERF)                                      \
  static void NAME(UNARY_ARGS) {                                                                                       \
    switch (op) {                                                                                                      \
    case LT_NEG: UNARY_RUN(T, -x); break;                                                                              \
    case LT_EXP: UNARY_RUN(T, EXP(x)); break;                                                                          \
    case LT_LOG: UNARY_RUN(T, LOG(x)); break;                                                                          \
    case LT_SQRT: UNARY_RUN(T, SQRT(x)); break;                                                                        \
    case LT_RSQRT: UNARY_RUN(T, 1 / SQRT(x)); break;                                                                   \
    case LT_TANH: UNARY_RUN(T, TANH(x)); break;                                                                        \
    case LT_SIGMOID: UNARY_RUN(T, sigmoid_##S(x)); break;                                                              \
    case LT_RELU: UNARY_RUN(T, x < 0 ? 0 : x); break; /* NaN stays NaN */                                              \
    case LT_GELU: UNARY_RUN(T, gelu_##S(x)); break;                                                                    \
    case LT_SILU: UNARY_RUN(T, x *sigmoid_##S(x)); break;                                                              \
    case LT_ABS: UNARY_RUN(T, FABS(x)); break;                                                                         \
    case LT_SIN: UNARY_RUN(T, SIN(x)); break;                                                                          \
    case LT_COS: UNARY_RUN(T, COS(x)); break;                                                                          \
    case LT_SQUARE: UNARY_RUN(T, x *x); break;                                                                         \
    case LT_RECIPROCAL: UNARY_RUN(T, 1 / x); break;                                                                    \
    case LT_ERF: UNARY_RUN(T, ERF(x)); break;                                                                          \
    case LT_GELU_ERF: UNARY_RUN(T, gelu_erf_##S(x)); break;                                                            \
    }                                                                                                                  \
  }
DEFINE_FLOAT_UNARY(unary_f32, float, f, ew_expf, logf, sqrtf, ew_tanhf, fabsf, sinf, cosf, erff)
DEFINE_FLOAT_UNARY(unary_f64, double, d, exp, log, sqrt, tanh, fabs, sin, cos, erf)

#define DEFINE_INT_UNARY(NAME, T, UT)                                                                                  \
  static void NAME(UNARY_ARGS) {                                                                                       \
    switch (op) {                                                                                                      \
    case LT_NEG: UNARY_RUN(T, (UT)0 - (UT)x); break;                                                                   \
    case LT_ABS: UNARY_RUN(T, x < 0 ? (UT)0 - (UT)x : (UT)x); break;                                                   \
    case LT_RELU: UNARY_RUN(T, x < 0 ? 0 : x); break;                                                                  \
    case LT_SQUARE: UNARY_RUN(T, (UT)x *(UT)x); break;                                                                 \
    }                                                                                                                  \
  }
DEFINE_INT_UNARY(unary_i32, int32_t, uint32_t)
DEFINE_INT_UNARY(unary_i64, int64_t, uint64_t)

static void unary_u8(UNARY_ARGS) { /* unsigned: abs and relu are the identity */
  switch (op) {
  case LT_NEG: UNARY_RUN(uint8_t, 0u - x); break;
  case LT_ABS:
  case LT_RELU: UNARY_RUN(uint8_t, x); break;
  case LT_SQUARE: UNARY_RUN(uint8_t, (uint32_t)x * x); break;
  }
}

typedef struct unary_ctx {
  int op, dtype;
} unary_ctx;

static void unary_kernel(const void *ctx, char *const *p, const int64_t *s, int64_t n) {
  const unary_ctx *c = ctx;
  switch (c->dtype) {
  case LT_F32: unary_f32(c->op, p[0], s[0], p[1], s[1], n); break;
  case LT_F64: unary_f64(c->op, p[0], s[0], p[1], s[1], n); break;
  case LT_I32: unary_i32(c->op, p[0], s[0], p[1], s[1], n); break;
  case LT_I64: unary_i64(c->op, p[0], s[0], p[1], s[1], n); break;
  case LT_U8: unary_u8(c->op, p[0], s[0], p[1], s[1], n); break;
  default: { /* bf16, f16: through f32 blocks, computed in place */
    float x[EW_BLOCK];
    int64_t e = lt_dtype_size(c->dtype);
    for (int64_t i0 = 0; i0 < n; i0 += EW_BLOCK) {
      int64_t m = n - i0 < EW_BLOCK ? n - i0 : EW_BLOCK;
      int64_t step = ew_load_f32(x, p[1] + i0 * s[1] * e, c->dtype, s[1], m);
      unary_f32(c->op, (char *)x, 1, (char *)x, 1, step ? m : 1);
      for (int64_t i = step ? m : 1; i < m; i++) x[i] = x[0]; /* a broadcast input */
      ew_store_f32(p[0] + i0 * s[0] * e, c->dtype, s[0], x, m);
    }
  }
  }
}

/* Floats: every op. Integers: neg, abs, relu, square. */
static int check_unary_dtype(const char *name, int op, int dtype) {
  if (lt_dtype_is_float(dtype) || (ew_is_int(dtype) && is_int_unary(op))) return 0;
  if (lt_dtype_size(dtype) == 0) return lt_errorf("%s: unknown dtype %d", name, dtype);
  if (dtype == LT_BOOL) return lt_errorf("%s: not supported for bool tensors (comparisons and where only)", name);
  return lt_errorf("%s: not supported for %s tensors (floating dtypes only); convert first", name,
                   lt_dtype_name(dtype));
}

/* Strides of out and a, both of out's shape (a's shape equals it). */
static void unary_strides(const lt_tensor *out, const lt_tensor *a, int64_t (*st)[LT_MAX_DIMS]) {
  lt_broadcast_strides(out, out->ndim, out->shape, st[0]);
  lt_broadcast_strides(a, out->ndim, out->shape, st[1]);
}

int lt_unary(lt_tensor *out, const lt_tensor *a, int op) {
  if (op < 0 || op >= LT_NUM_UNARY_OPS) return lt_errorf("unary: unknown op %d", op);
  const char *name = unary_names[op];
  LT_TRY(lt_check_defined(name, "input", a));
  LT_TRY(check_unary_dtype(name, op, a->dtype));
  LT_TRY(ew_check_device(name, a));
  LT_TRY(ew_prepare_out(name, out, a->ndim, a->shape, a->dtype, a->device));
  LT_TRY(ew_check_overlap(name, out, a, "input"));
  if (a->device != LT_DEVICE_CPU) {
    const lt_backend *be = lt_backend_for(name, a->device);
    if (!be) return -1;
    lt_ew_geom g;
    lt_ew_geom_of(&g, out, 1, &a);
    return be->unary(a->device, op, a->dtype, &g, lt_data_ptr(out), lt_data_ptr(a));
  }
  int64_t st[2][LT_MAX_DIMS];
  unary_strides(out, a, st);
  char *base[2] = {lt_data_ptr(out), lt_data_ptr(a)};
  int esize[2] = {lt_dtype_size(a->dtype), lt_dtype_size(a->dtype)};
  unary_ctx c = {op, a->dtype};
  /* transcendental ops are worth threads on smaller tensors */
  int64_t grain = is_cheap_unary(op) ? LT_PAR_GRAIN : LT_PAR_GRAIN / 8;
  ew_execute(a->ndim, a->shape, 2, base, esize, (const int64_t(*)[LT_MAX_DIMS])st, unary_kernel, &c, grain);
  return 0;
}

/* ---- backward runs: gi[i] = g[i] * f'(x[i]) ---------------------------------------- */

#define BACKWARD_RUN(T, EXPR)                                                                                          \
  do {                                                                                                                 \
    T *o_ = (T *)p[0];                                                                                                 \
    const T *g_ = (const T *)p[1], *x_ = (const T *)p[2];                                                              \
    if (s[0] == 1 && s[1] == 1 && s[2] == 1) {                                                                         \
      _Pragma("omp simd") for (int64_t i = 0; i < n; i++) {                                                            \
        T g = g_[i], x = x_[i];                                                                                        \
        o_[i] = (T)(EXPR);                                                                                             \
      }                                                                                                                \
    } else {                                                                                                           \
      for (int64_t i = 0; i < n; i++) {                                                                                \
        T g = g_[i * s[1]], x = x_[i * s[2]];                                                                          \
        o_[i * s[0]] = (T)(EXPR);                                                                                      \
      }                                                                                                                \
    }                                                                                                                  \
  } while (0)

#define DEFINE_FLOAT_BACKWARD(NAME, T, S, EXP, SQRT, TANH, SIN, COS)                                                   \
  static void NAME(int op, char *const *p, const int64_t *s, int64_t n) {                                              \
    switch (op) {                                                                                                      \
    case LT_NEG: BACKWARD_RUN(T, ((void)x, -g)); break;                                                                \
    case LT_EXP: BACKWARD_RUN(T, g *EXP(x)); break;                                                                    \
    case LT_LOG: BACKWARD_RUN(T, g / x); break;                                                                        \
    case LT_SQRT: BACKWARD_RUN(T, g *(T)0.5 / SQRT(x)); break;                                                         \
    case LT_RSQRT: BACKWARD_RUN(T, g *(T)-0.5 / (x * SQRT(x))); break;                                                 \
    case LT_TANH: BACKWARD_RUN(T, g *(1 - TANH(x) * TANH(x))); break;                                                  \
    case LT_SIGMOID: BACKWARD_RUN(T, g *sigmoid_##S(x) * (1 - sigmoid_##S(x))); break;                                 \
    case LT_RELU: BACKWARD_RUN(T, x > 0 ? g : 0); break;                                                               \
    case LT_GELU: BACKWARD_RUN(T, g *gelu_grad_##S(x)); break;                                                         \
    case LT_SILU: BACKWARD_RUN(T, g *sigmoid_##S(x) * (1 + x * (1 - sigmoid_##S(x)))); break;                          \
    case LT_ABS: BACKWARD_RUN(T, x > 0 ? g : x < 0 ? -g : 0); break;                                                   \
    case LT_SIN: BACKWARD_RUN(T, g *COS(x)); break;                                                                    \
    case LT_COS: BACKWARD_RUN(T, -g *SIN(x)); break;                                                                   \
    case LT_SQUARE: BACKWARD_RUN(T, 2 * g * x); break;                                                                 \
    case LT_RECIPROCAL: BACKWARD_RUN(T, -g / (x * x)); break;                                                          \
    case LT_ERF: BACKWARD_RUN(T, g *(T)TWO_OVER_SQRTPI * EXP(-x * x)); break;                                          \
    case LT_GELU_ERF: BACKWARD_RUN(T, g *gelu_erf_grad_##S(x)); break;                                                 \
    }                                                                                                                  \
  }
DEFINE_FLOAT_BACKWARD(backward_f32, float, f, ew_expf, sqrtf, ew_tanhf, sinf, cosf)
DEFINE_FLOAT_BACKWARD(backward_f64, double, d, exp, sqrt, tanh, sin, cos)

static void backward_kernel(const void *ctx, char *const *p, const int64_t *s, int64_t n) {
  const unary_ctx *c = ctx;
  if (c->dtype == LT_F32) return backward_f32(c->op, p, s, n);
  if (c->dtype == LT_F64) return backward_f64(c->op, p, s, n);
  float g[EW_BLOCK], x[EW_BLOCK], o[EW_BLOCK]; /* bf16, f16: through f32 blocks; o apart from g, which may
                                                 * be one broadcast element read for every i */
  int64_t e = lt_dtype_size(c->dtype);
  for (int64_t i0 = 0; i0 < n; i0 += EW_BLOCK) {
    int64_t m = n - i0 < EW_BLOCK ? n - i0 : EW_BLOCK;
    int64_t sg = ew_load_f32(g, p[1] + i0 * s[1] * e, c->dtype, s[1], m);
    int64_t sx = ew_load_f32(x, p[2] + i0 * s[2] * e, c->dtype, s[2], m);
    char *fp[3] = {(char *)o, (char *)g, (char *)x};
    int64_t fs[3] = {1, sg, sx};
    backward_f32(c->op, fp, fs, m);
    ew_store_f32(p[0] + i0 * s[0] * e, c->dtype, s[0], o, m);
  }
}

int lt_unary_backward(lt_tensor *grad_in, const lt_tensor *grad_out, const lt_tensor *x, int op) {
  if (op < 0 || op >= LT_NUM_UNARY_OPS) return lt_errorf("unary_backward: unknown op %d", op);
  char name[48];
  snprintf(name, sizeof name, "%s_backward", unary_names[op]);
  LT_TRY(lt_check_defined(name, "grad_out", grad_out));
  LT_TRY(lt_check_defined(name, "x", x));
  LT_TRY(lt_check_same_device(name, grad_out, x));
  LT_TRY(lt_check_same_dtype(name, grad_out, x));
  if (!lt_dtype_is_float(x->dtype))
    return lt_errorf("%s: not supported for %s tensors (floating dtypes only)", name, lt_dtype_name(x->dtype));
  if (!lt_same_shape(grad_out, x)) {
    char a[LT_SHAPE_STR], b[LT_SHAPE_STR];
    return lt_errorf("%s: grad_out %s and x %s differ in shape", name, lt_shape_str(a, grad_out->ndim, grad_out->shape),
                     lt_shape_str(b, x->ndim, x->shape));
  }
  LT_TRY(ew_check_device(name, grad_out));
  LT_TRY(ew_check_device(name, x));
  LT_TRY(ew_prepare_out(name, grad_in, x->ndim, x->shape, x->dtype, x->device));
  LT_TRY(ew_check_overlap(name, grad_in, grad_out, "grad_out"));
  LT_TRY(ew_check_overlap(name, grad_in, x, "x"));
  if (x->device != LT_DEVICE_CPU) {
    const lt_backend *be = lt_backend_for(name, x->device);
    if (!be) return -1;
    lt_ew_geom g;
    const lt_tensor *ins[2] = {grad_out, x};
    lt_ew_geom_of(&g, grad_in, 2, ins);
    return be->unary_backward(x->device, op, x->dtype, &g, lt_data_ptr(grad_in), lt_data_ptr(grad_out), lt_data_ptr(x));
  }
  int64_t st[3][LT_MAX_DIMS];
  lt_broadcast_strides(grad_in, x->ndim, x->shape, st[0]);
  lt_broadcast_strides(grad_out, x->ndim, x->shape, st[1]);
  lt_broadcast_strides(x, x->ndim, x->shape, st[2]);
  char *base[3] = {lt_data_ptr(grad_in), lt_data_ptr(grad_out), lt_data_ptr(x)};
  int e = lt_dtype_size(x->dtype), esize[3] = {e, e, e};
  unary_ctx c = {op, x->dtype};
  int64_t grain = is_cheap_unary(op) ? LT_PAR_GRAIN : LT_PAR_GRAIN / 8;
  ew_execute(x->ndim, x->shape, 3, base, esize, (const int64_t(*)[LT_MAX_DIMS])st, backward_kernel, &c, grain);
  return 0;
}

/* ---- clamp: out = min(max(a, lo), hi), NaN stays NaN --------------------------------- */

typedef struct clamp_ctx {
  int dtype;
  double lo, hi; /* for integers: already rounded inwards and clipped to the dtype's range */
} clamp_ctx;

#define CLAMP_RUN(T, LO, HI)                                                                                           \
  do {                                                                                                                 \
    const T lo_ = (T)(LO), hi_ = (T)(HI);                                                                              \
    char *po = p[0];                                                                                                   \
    const char *pa = p[1];                                                                                             \
    int64_t so = s[0], sa = s[1];                                                                                      \
    UNARY_RUN(T, (x < lo_ ? lo_ : x) > hi_ ? hi_ : (x < lo_ ? lo_ : x));                                               \
  } while (0)

static void clamp_kernel(const void *ctx, char *const *p, const int64_t *s, int64_t n) {
  const clamp_ctx *c = ctx;
  switch (c->dtype) {
  case LT_F32: CLAMP_RUN(float, c->lo, c->hi); break;
  case LT_F64: CLAMP_RUN(double, c->lo, c->hi); break;
  case LT_I32: CLAMP_RUN(int32_t, c->lo, c->hi); break;
  case LT_I64: CLAMP_RUN(int64_t, c->lo, c->hi); break;
  case LT_U8: CLAMP_RUN(uint8_t, c->lo, c->hi); break;
  default: { /* bf16, f16 */
    float x[EW_BLOCK];
    int64_t e = lt_dtype_size(c->dtype);
    for (int64_t i0 = 0; i0 < n; i0 += EW_BLOCK) {
      int64_t m = n - i0 < EW_BLOCK ? n - i0 : EW_BLOCK;
      int64_t step = ew_load_f32(x, p[1] + i0 * s[1] * e, c->dtype, s[1], m);
      for (int64_t i = 1; !step && i < m; i++) x[i] = x[0];
      char *fp[2] = {(char *)x, (char *)x};
      int64_t fs[2] = {1, 1};
      clamp_ctx fc = {LT_F32, c->lo, c->hi};
      clamp_kernel(&fc, fp, fs, m);
      ew_store_f32(p[0] + i0 * s[0] * e, c->dtype, s[0], x, m);
    }
  }
  }
}

int lt_clamp(lt_tensor *out, const lt_tensor *a, double lo, double hi) {
  LT_TRY(lt_check_defined("clamp", "input", a));
  if (isnan(lo) || isnan(hi)) return lt_errorf("clamp: bounds must not be NaN (got %g, %g)", lo, hi);
  if (!lt_dtype_is_float(a->dtype) && !ew_is_int(a->dtype))
    return lt_errorf("clamp: not supported for %s tensors", lt_dtype_name(a->dtype));
  LT_TRY(ew_check_device("clamp", a));
  clamp_ctx c = {a->dtype, lo, hi};
  if (ew_is_int(a->dtype)) { /* integer bounds: round inwards, then clip to the dtype's range */
    double tmin = a->dtype == LT_I32 ? -2147483648.0 : a->dtype == LT_I64 ? -9223372036854775808.0 : 0;
    double tmax = a->dtype == LT_I32 ? 2147483647.0 : a->dtype == LT_I64 ? 9223372036854774784.0 : 255;
    c.lo = fmin(fmax(ceil(lo), tmin), tmax);
    c.hi = fmin(fmax(floor(hi), tmin), tmax);
  }
  LT_TRY(ew_prepare_out("clamp", out, a->ndim, a->shape, a->dtype, a->device));
  LT_TRY(ew_check_overlap("clamp", out, a, "input"));
  if (a->device != LT_DEVICE_CPU) {
    const lt_backend *be = lt_backend_for("clamp", a->device);
    if (!be) return -1;
    lt_ew_geom g;
    lt_ew_geom_of(&g, out, 1, &a);
    return be->clamp(a->device, a->dtype, &g, lt_data_ptr(out), lt_data_ptr(a), c.lo, c.hi);
  }
  int64_t st[2][LT_MAX_DIMS];
  unary_strides(out, a, st);
  char *base[2] = {lt_data_ptr(out), lt_data_ptr(a)};
  int esize[2] = {lt_dtype_size(a->dtype), lt_dtype_size(a->dtype)};
  ew_execute(a->ndim, a->shape, 2, base, esize, (const int64_t(*)[LT_MAX_DIMS])st, clamp_kernel, &c, LT_PAR_GRAIN);
  return 0;
}
