/* binary.c — out = a op b with broadcasting, the scalar variants, and where.
 * Floats compute in their own type (f64 in double), bf16/f16 in f32 by blocks;
 * integers wrap on overflow as in two's complement. */
/* Float compare-and-select (clamping, NaN checks, maximum, relu) and sqrt only vectorise when
 * the compiler may ignore FP exception flags and errno, which nothing here reads. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math", "no-math-errno")
#endif
#include "ops/backend.h"
#include "ops/elementwise.h"
#include <stdio.h>

static const char *const binary_names[LT_NUM_BINARY_OPS] = {"add", "sub", "mul", "div", "pow", "maximum", "minimum",
                                                            "eq",  "ne",  "lt",  "le",  "gt",  "ge"};

const char *lt_binary_name(int op) { return op >= 0 && op < LT_NUM_BINARY_OPS ? binary_names[op] : "?"; }

static bool is_comparison(int op) { return op >= LT_EQ && op <= LT_GE; }

/* ---- runs: o[i*so] = a[i*sa] op b[i*sb] ---------------------------------------------
 * The unit-stride and broadcast-scalar cases get their own loops so that they vectorise;
 * `omp simd` tells the compiler that out may be a or b (in place) without a hazard. */

#define BINARY_RUN(TO, T, EXPR)                                                                                        \
  do {                                                                                                                 \
    TO *o_ = (TO *)po;                                                                                                 \
    const T *a_ = (const T *)pa, *b_ = (const T *)pb;                                                                  \
    if (so == 1 && sa == 1 && sb == 1) {                                                                               \
      _Pragma("omp simd") for (int64_t i = 0; i < n; i++) {                                                            \
        T x = a_[i], y = b_[i];                                                                                        \
        o_[i] = (TO)(EXPR);                                                                                            \
      }                                                                                                                \
    } else if (so == 1 && sa == 1 && sb == 0) {                                                                        \
      const T y = b_[0];                                                                                               \
      _Pragma("omp simd") for (int64_t i = 0; i < n; i++) {                                                            \
        T x = a_[i];                                                                                                   \
        o_[i] = (TO)(EXPR);                                                                                            \
      }                                                                                                                \
    } else if (so == 1 && sa == 0 && sb == 1) {                                                                        \
      const T x = a_[0];                                                                                               \
      _Pragma("omp simd") for (int64_t i = 0; i < n; i++) {                                                            \
        T y = b_[i];                                                                                                   \
        o_[i] = (TO)(EXPR);                                                                                            \
      }                                                                                                                \
    } else {                                                                                                           \
      for (int64_t i = 0; i < n; i++) {                                                                                \
        T x = a_[i * sa], y = b_[i * sb];                                                                              \
        o_[i * so] = (TO)(EXPR);                                                                                       \
      }                                                                                                                \
    }                                                                                                                  \
  } while (0)

/* NaN-propagating maximum/minimum, as torch (fmax would drop the NaN). */
#define MAX_EXPR(x, y) ((x) > (y) || (x) != (x) ? (x) : (y))
#define MIN_EXPR(x, y) ((x) < (y) || (x) != (x) ? (x) : (y))

#define COMPARISON_CASES(T)                                                                                            \
  case LT_EQ: BINARY_RUN(uint8_t, T, x == y); break;                                                                   \
  case LT_NE: BINARY_RUN(uint8_t, T, x != y); break;                                                                   \
  case LT_LT: BINARY_RUN(uint8_t, T, x < y); break;                                                                    \
  case LT_LE: BINARY_RUN(uint8_t, T, x <= y); break;                                                                   \
  case LT_GT: BINARY_RUN(uint8_t, T, x > y); break;                                                                    \
  case LT_GE:                                                                                                          \
    BINARY_RUN(uint8_t, T, x >= y);                                                                                    \
    break;

#define RUN_ARGS int op, char *po, int64_t so, const char *pa, int64_t sa, const char *pb, int64_t sb, int64_t n

#define DEFINE_FLOAT_BINARY(NAME, T, POW)                                                                              \
  static void NAME(RUN_ARGS) {                                                                                         \
    switch (op) {                                                                                                      \
    case LT_ADD: BINARY_RUN(T, T, x + y); break;                                                                       \
    case LT_SUB: BINARY_RUN(T, T, x - y); break;                                                                       \
    case LT_MUL: BINARY_RUN(T, T, x *y); break;                                                                        \
    case LT_DIV: BINARY_RUN(T, T, x / y); break;                                                                       \
    case LT_POW: BINARY_RUN(T, T, POW(x, y)); break;                                                                   \
    case LT_MAXIMUM: BINARY_RUN(T, T, MAX_EXPR(x, y)); break;                                                          \
    case LT_MINIMUM:                                                                                                   \
      BINARY_RUN(T, T, MIN_EXPR(x, y));                                                                                \
      break;                                                                                                           \
      COMPARISON_CASES(T)                                                                                              \
    }                                                                                                                  \
  }
DEFINE_FLOAT_BINARY(binary_f32, float, powf)
DEFINE_FLOAT_BINARY(binary_f64, double, pow)

/* UT is the unsigned type the arithmetic runs in, so that overflow wraps instead of
 * being undefined. */
#define DEFINE_INT_BINARY(NAME, T, UT)                                                                                 \
  static void NAME(RUN_ARGS) {                                                                                         \
    switch (op) {                                                                                                      \
    case LT_ADD: BINARY_RUN(T, T, (UT)x + (UT)y); break;                                                               \
    case LT_SUB: BINARY_RUN(T, T, (UT)x - (UT)y); break;                                                               \
    case LT_MUL: BINARY_RUN(T, T, (UT)x *(UT)y); break;                                                                \
    case LT_MAXIMUM: BINARY_RUN(T, T, x > y ? x : y); break;                                                           \
    case LT_MINIMUM:                                                                                                   \
      BINARY_RUN(T, T, x < y ? x : y);                                                                                 \
      break;                                                                                                           \
      COMPARISON_CASES(T)                                                                                              \
    }                                                                                                                  \
  }
DEFINE_INT_BINARY(binary_i32, int32_t, uint32_t)
DEFINE_INT_BINARY(binary_i64, int64_t, uint64_t)
DEFINE_INT_BINARY(binary_u8, uint8_t, uint32_t)

/* compute: the tensors' dtype; a and b may be an f32 scalar when compute is bf16/f16. */
typedef struct binary_ctx {
  int op, compute, dtype_out, dtype_a, dtype_b;
} binary_ctx;

/* bf16/f16: blocks converted to f32, computed, rounded back. */
static void binary_half(const binary_ctx *c, char *const *p, const int64_t *s, int64_t n) {
  float xa[EW_BLOCK], xb[EW_BLOCK], xo[EW_BLOCK];
  int64_t ea = lt_dtype_size(c->dtype_a), eb = lt_dtype_size(c->dtype_b), eo = lt_dtype_size(c->dtype_out);
  bool compare = is_comparison(c->op);
  for (int64_t i0 = 0; i0 < n; i0 += EW_BLOCK) {
    int64_t m = n - i0 < EW_BLOCK ? n - i0 : EW_BLOCK;
    int64_t fa = ew_load_f32(xa, p[1] + i0 * s[1] * ea, c->dtype_a, s[1], m);
    int64_t fb = ew_load_f32(xb, p[2] + i0 * s[2] * eb, c->dtype_b, s[2], m);
    char *o = p[0] + i0 * s[0] * eo;
    if (compare) { /* bool out: written directly */
      binary_f32(c->op, o, s[0], (char *)xa, fa, (char *)xb, fb, m);
    } else {
      binary_f32(c->op, (char *)xo, 1, (char *)xa, fa, (char *)xb, fb, m);
      ew_store_f32(o, c->dtype_out, s[0], xo, m);
    }
  }
}

static void binary_kernel(const void *ctx, char *const *p, const int64_t *s, int64_t n) {
  const binary_ctx *c = ctx;
  switch (c->compute) {
  case LT_F32: binary_f32(c->op, p[0], s[0], p[1], s[1], p[2], s[2], n); break;
  case LT_F64: binary_f64(c->op, p[0], s[0], p[1], s[1], p[2], s[2], n); break;
  case LT_BF16:
  case LT_F16: binary_half(c, p, s, n); break;
  case LT_I32: binary_i32(c->op, p[0], s[0], p[1], s[1], p[2], s[2], n); break;
  case LT_I64: binary_i64(c->op, p[0], s[0], p[1], s[1], p[2], s[2], n); break;
  default: binary_u8(c->op, p[0], s[0], p[1], s[1], p[2], s[2], n); break; /* u8, bool */
  }
}

/* Floats: every op. Integers: add, sub, mul, maximum, minimum, comparisons. Bool: comparisons. */
static int check_binary_dtype(const char *name, int op, int dtype) {
  if (lt_dtype_is_float(dtype)) return 0;
  if (ew_is_int(dtype) && op != LT_DIV && op != LT_POW) return 0;
  if (dtype == LT_BOOL && is_comparison(op)) return 0;
  if (dtype == LT_BOOL) return lt_errorf("%s: not supported for bool tensors (comparisons and where only)", name);
  if (lt_dtype_size(dtype) == 0) return lt_errorf("%s: unknown dtype %d", name, dtype);
  return lt_errorf("%s: not supported for %s tensors (floating dtypes only); convert first", name,
                   lt_dtype_name(dtype));
}

/* Broadcast shape of a and b; the error names the op. */
static int broadcast_pair(const char *name, const lt_tensor *a, const lt_tensor *b, int *ndim, int64_t *shape) {
  if (lt_broadcast_shape(a->ndim, a->shape, b->ndim, b->shape, ndim, shape) == 0) return 0;
  char msg[512];
  const char *e = lt_last_error();
  if (strncmp(e, "broadcast: ", 11) == 0) e += 11;
  snprintf(msg, sizeof msg, "%s", e);
  return lt_errorf("%s: %s", name, msg);
}

/* Runs out = x op y on the CPU. The tensors are checked; out has the broadcast shape. */
static void binary_cpu(lt_tensor *out, const lt_tensor *x, const lt_tensor *y, int op, int compute) {
  int64_t st[3][LT_MAX_DIMS];
  lt_broadcast_strides(out, out->ndim, out->shape, st[0]);
  lt_broadcast_strides(x, out->ndim, out->shape, st[1]);
  lt_broadcast_strides(y, out->ndim, out->shape, st[2]);
  char *base[3] = {lt_data_ptr(out), lt_data_ptr(x), lt_data_ptr(y)};
  int esize[3] = {lt_dtype_size(out->dtype), lt_dtype_size(x->dtype), lt_dtype_size(y->dtype)};
  binary_ctx c = {op, compute, out->dtype, x->dtype, y->dtype};
  int64_t grain = op == LT_POW ? LT_PAR_GRAIN / 8 : LT_PAR_GRAIN;
  ew_execute(out->ndim, out->shape, 3, base, esize, (const int64_t(*)[LT_MAX_DIMS])st, binary_kernel, &c, grain);
}


int lt_binary(lt_tensor *out, const lt_tensor *a, const lt_tensor *b, int op) {
  if (op < 0 || op >= LT_NUM_BINARY_OPS) return lt_errorf("binary: unknown op %d", op);
  const char *name = binary_names[op];
  LT_TRY(lt_check_defined(name, "a", a));
  LT_TRY(lt_check_defined(name, "b", b));
  LT_TRY(lt_check_same_device(name, a, b));
  LT_TRY(lt_check_same_dtype(name, a, b));
  LT_TRY(check_binary_dtype(name, op, a->dtype));
  int ndim;
  int64_t shape[LT_MAX_DIMS];
  LT_TRY(broadcast_pair(name, a, b, &ndim, shape));
  LT_TRY(ew_check_device(name, a));
  LT_TRY(ew_check_device(name, b));
  LT_TRY(ew_prepare_out(name, out, ndim, shape, is_comparison(op) ? LT_BOOL : a->dtype, a->device));
  LT_TRY(ew_check_overlap(name, out, a, "a"));
  LT_TRY(ew_check_overlap(name, out, b, "b"));
  if (a->device != LT_DEVICE_CPU) {
    const lt_backend *be = lt_backend_for(name, a->device);
    if (!be) return -1;
    lt_ew_geom g;
    const lt_tensor *ins[2] = {a, b};
    lt_ew_geom_of(&g, out, 2, ins);
    return be->binary(a->device, op, a->dtype, &g, lt_data_ptr(out), lt_data_ptr(a), lt_data_ptr(b), 0, NULL);
  }
  binary_cpu(out, a, b, op, a->dtype);
  return 0;
}

/* The scalar operand is held in the type the op computes in: f32 for f32/bf16/f16
 * (no rounding of s to 16 bits), f64 for f64, the tensor's type for integers (s must
 * then be an integer in its range). */
static int scalar_operand(const char *name, int dtype, double s, unsigned char *buf, int *scalar_dtype) {
  if (lt_dtype_is_float(dtype)) {
    *scalar_dtype = dtype == LT_F64 ? LT_F64 : LT_F32;
    lt_store_f64(buf, *scalar_dtype, 0, s);
    return 0;
  }
  double lo = dtype == LT_I32 ? -2147483648.0 : dtype == LT_I64 ? -9223372036854775808.0 : 0;
  double hi = dtype == LT_I32 ? 2147483647.0 : dtype == LT_I64 ? 9223372036854775807.0 : 255;
  if (s != floor(s) || s < lo || s > hi || (dtype == LT_BOOL && s != 0 && s != 1))
    return lt_errorf("%s: scalar %.17g is not a value of %s (the tensor's dtype)", name, s, lt_dtype_name(dtype));
  *scalar_dtype = dtype;
  if (dtype == LT_I64)
    *(int64_t *)buf = s >= 9223372036854775807.0 ? INT64_MAX : (int64_t)s;
  else
    lt_store_f64(buf, dtype, 0, s);
  return 0;
}

int lt_binary_scalar(lt_tensor *out, const lt_tensor *a, double s, int op, int reverse) {
  if (op < 0 || op >= LT_NUM_BINARY_OPS) return lt_errorf("binary: unknown op %d", op);
  const char *name = binary_names[op];
  LT_TRY(lt_check_defined(name, "a", a));
  LT_TRY(check_binary_dtype(name, op, a->dtype));
  LT_TRY(ew_check_device(name, a));
  _Alignas(8) unsigned char buf[8] = {0};
  int sdtype = a->dtype;
  LT_TRY(scalar_operand(name, a->dtype, s, buf, &sdtype));
  LT_TRY(ew_prepare_out(name, out, a->ndim, a->shape, is_comparison(op) ? LT_BOOL : a->dtype, a->device));
  LT_TRY(ew_check_overlap(name, out, a, "a"));
  /* powers with a cheaper exact form, as torch: x^2, x^0.5, x^-0.5, x^-1 */
  if (op == LT_POW && !reverse && lt_dtype_is_float(a->dtype)) {
    int uop = s == 2 ? LT_SQUARE : s == 0.5 ? LT_SQRT : s == -0.5 ? LT_RSQRT : s == -1 ? LT_RECIPROCAL : -1;
    if (uop >= 0) return lt_unary(out, a, uop);
  }
  if (a->device != LT_DEVICE_CPU) { /* the scalar is not an operand: a's geometry stands in for it */
    const lt_backend *be = lt_backend_for(name, a->device);
    if (!be) return -1;
    lt_ew_geom g;
    const lt_tensor *ins[2] = {a, a};
    lt_ew_geom_of(&g, out, 2, ins);
    return be->binary(a->device, op, a->dtype, &g, lt_data_ptr(out), lt_data_ptr(a), lt_data_ptr(a), reverse ? 1 : 2,
                      buf);
  }
  lt_storage st = {buf, 8, 1, LT_DEVICE_CPU};
  lt_tensor scalar = {.storage = &st, .ndim = 0, .dtype = sdtype, .device = LT_DEVICE_CPU, .refcount = 1};
  if (reverse)
    binary_cpu(out, &scalar, a, op, a->dtype);
  else
    binary_cpu(out, a, &scalar, op, a->dtype);
  return 0;
}

/* ---- where: out = cond ? a : b --------------------------------------------------- */

#define WHERE_RUN(T)                                                                                                   \
  do {                                                                                                                 \
    T *o_ = (T *)p[0];                                                                                                 \
    const uint8_t *c_ = (const uint8_t *)p[1];                                                                         \
    const T *a_ = (const T *)p[2], *b_ = (const T *)p[3];                                                              \
    if (s[0] == 1 && s[1] == 1 && s[2] == 1 && s[3] == 1) {                                                            \
      _Pragma("omp simd") for (int64_t i = 0; i < n; i++) o_[i] = c_[i] ? a_[i] : b_[i];                               \
    } else if (s[0] == 1 && s[1] == 1 && s[2] == 1 && s[3] == 0) { /* masked fill: b a scalar */                       \
      const T b0 = b_[0];                                                                                              \
      _Pragma("omp simd") for (int64_t i = 0; i < n; i++) o_[i] = c_[i] ? a_[i] : b0;                                  \
    } else if (s[0] == 1 && s[1] == 1 && s[2] == 0 && s[3] == 1) {                                                     \
      const T a0 = a_[0];                                                                                              \
      _Pragma("omp simd") for (int64_t i = 0; i < n; i++) o_[i] = c_[i] ? a0 : b_[i];                                  \
    } else {                                                                                                           \
      for (int64_t i = 0; i < n; i++) o_[i * s[0]] = c_[i * s[1]] ? a_[i * s[2]] : b_[i * s[3]];                       \
    }                                                                                                                  \
  } while (0)

/* Elements are moved, not converted: only their size matters. */
static void where_kernel(const void *ctx, char *const *p, const int64_t *s, int64_t n) {
  switch (*(const int *)ctx) {
  case 1: WHERE_RUN(uint8_t); break;
  case 2: WHERE_RUN(uint16_t); break;
  case 4: WHERE_RUN(uint32_t); break;
  default: WHERE_RUN(uint64_t); break;
  }
}

int lt_where(lt_tensor *out, const lt_tensor *cond, const lt_tensor *a, const lt_tensor *b) {
  LT_TRY(lt_check_defined("where", "cond", cond));
  LT_TRY(lt_check_defined("where", "a", a));
  LT_TRY(lt_check_defined("where", "b", b));
  LT_TRY(lt_check_same_device("where", cond, a));
  LT_TRY(lt_check_same_device("where", a, b));
  if (cond->dtype != LT_BOOL && cond->dtype != LT_U8)
    return lt_errorf("where: cond must be bool or u8, got %s", lt_dtype_name(cond->dtype));
  LT_TRY(lt_check_same_dtype("where", a, b));
  int nab, ndim;
  int64_t ab[LT_MAX_DIMS], shape[LT_MAX_DIMS];
  LT_TRY(broadcast_pair("where", a, b, &nab, ab));
  lt_tensor ab_shape = {.ndim = nab};
  memcpy(ab_shape.shape, ab, sizeof ab);
  LT_TRY(broadcast_pair("where", cond, &ab_shape, &ndim, shape));
  LT_TRY(ew_check_device("where", cond));
  LT_TRY(ew_check_device("where", a));
  LT_TRY(ew_check_device("where", b));
  LT_TRY(ew_prepare_out("where", out, ndim, shape, a->dtype, a->device));
  LT_TRY(ew_check_overlap("where", out, cond, "cond"));
  LT_TRY(ew_check_overlap("where", out, a, "a"));
  LT_TRY(ew_check_overlap("where", out, b, "b"));
  const lt_tensor *ops[4] = {out, cond, a, b};
  if (a->device != LT_DEVICE_CPU) {
    const lt_backend *be = lt_backend_for("where", a->device);
    if (!be) return -1;
    lt_ew_geom g;
    lt_ew_geom_of(&g, out, 3, ops + 1);
    return be->where(a->device, lt_dtype_size(a->dtype), &g, lt_data_ptr(out), lt_data_ptr(cond), lt_data_ptr(a),
                     lt_data_ptr(b));
  }
  int64_t st[4][LT_MAX_DIMS];
  char *base[4];
  int esize[4];
  for (int k = 0; k < 4; k++) {
    lt_broadcast_strides(ops[k], ndim, shape, st[k]);
    base[k] = lt_data_ptr(ops[k]);
    esize[k] = lt_dtype_size(ops[k]->dtype);
  }
  int size = lt_dtype_size(a->dtype);
  ew_execute(ndim, shape, 4, base, esize, (const int64_t(*)[LT_MAX_DIMS])st, where_kernel, &size, LT_PAR_GRAIN);
  return 0;
}
