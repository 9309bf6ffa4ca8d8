/* elementwise_ref.h — references in double and tensor helpers shared by the elementwise
 * tests (test_elementwise.c, test_elementwise_edge.c). */
#ifndef LUTRA_TEST_ELEMENTWISE_REF_H
#define LUTRA_TEST_ELEMENTWISE_REF_H
#include "check.h"

static const int float_dtypes[] = {LT_F32, LT_F64, LT_BF16, LT_F16};
static const int all_dtypes[] = {LT_F32, LT_F64, LT_BF16, LT_F16, LT_I32, LT_I64, LT_U8, LT_BOOL};

static inline bool is_float(int dtype) { return lt_dtype_is_float(dtype); }
static inline bool is_cmp(int op) { return op >= LT_EQ; }

/* ---- references, in double ------------------------------------------------------------ */

static inline double ref_unary(int op, double x) {
  switch (op) {
  case LT_NEG: return -x;
  case LT_EXP: return exp(x);
  case LT_LOG: return log(x);
  case LT_SQRT: return sqrt(x);
  case LT_RSQRT: return 1 / sqrt(x);
  case LT_TANH: return tanh(x);
  case LT_SIGMOID: return 1 / (1 + exp(-x));
  case LT_RELU: return x > 0 ? x : 0;
  case LT_GELU: return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
  case LT_SILU: return x / (1 + exp(-x));
  case LT_ABS: return fabs(x);
  case LT_SIN: return sin(x);
  case LT_COS: return cos(x);
  case LT_SQUARE: return x * x;
  case LT_ERF: return erf(x);
  case LT_GELU_ERF: return 0.5 * x * erfc(-x / sqrt(2)); /* x Phi(x) */
  default: return 1 / x; /* LT_RECIPROCAL */
  }
}

/* d/dx of ref_unary, written out by hand. */
static inline double ref_grad(int op, double x) {
  double k = sqrt(2 / M_PI), u = k * (x + 0.044715 * x * x * x), e = exp(-x);
  switch (op) {
  case LT_NEG: return -1;
  case LT_EXP: return exp(x);
  case LT_LOG: return 1 / x;
  case LT_SQRT: return 0.5 / sqrt(x);
  case LT_RSQRT: return -0.5 * pow(x, -1.5);
  case LT_TANH: return 1 / (cosh(x) * cosh(x));
  case LT_SIGMOID: return e / ((1 + e) * (1 + e));
  case LT_RELU: return x > 0;
  case LT_GELU: return 0.5 * (1 + tanh(u)) + 0.5 * x * k * (1 + 3 * 0.044715 * x * x) / (cosh(u) * cosh(u));
  case LT_SILU: return 1 / (1 + e) + x * e / ((1 + e) * (1 + e));
  case LT_ABS: return x > 0 ? 1 : -1;
  case LT_SIN: return cos(x);
  case LT_COS: return -sin(x);
  case LT_SQUARE: return 2 * x;
  case LT_ERF: return 2 / sqrt(M_PI) * exp(-x * x);
  case LT_GELU_ERF: return 0.5 * erfc(-x / sqrt(2)) + x * exp(-0.5 * x * x) / sqrt(2 * M_PI);
  default: return -1 / (x * x);
  }
}

static inline double ref_binary(int op, double x, double y) {
  switch (op) {
  case LT_ADD: return x + y;
  case LT_SUB: return x - y;
  case LT_MUL: return x * y;
  case LT_DIV: return x / y;
  case LT_POW: return pow(x, y);
  case LT_MAXIMUM: return x > y ? x : y;
  case LT_MINIMUM: return x < y ? x : y;
  case LT_EQ: return x == y;
  case LT_NE: return x != y;
  case LT_LT: return x < y;
  case LT_LE: return x <= y;
  case LT_GT: return x > y;
  default: return x >= y;
  }
}

/* An integer result as the dtype stores it (two's complement wrap). */
static inline double wrap(int dtype, double v) {
  if (dtype == LT_U8) return (double)((uint8_t)(int64_t)v);
  if (dtype == LT_I32) return (double)((int32_t)(uint32_t)(int64_t)v);
  return v;
}

static inline double tol(int dtype) { return is_float(dtype) ? check_tol(dtype) : 0; }

/* ---- tensors --------------------------------------------------------------------------- */

static inline void random_shape(int *ndim, int64_t *shape) {
  *ndim = (int)check_randint(1, 5);
  for (int d = 0; d < *ndim; d++) shape[d] = 2 * check_randint(0, 4) + 1; /* odd: 1..7 */
}

/* A suffix of shape with some dims set to 1: broadcasts to shape. */
static inline int broadcastable_from(int ndim, const int64_t *shape, int64_t *out) {
  int n = (int)check_randint(0, ndim + 1);
  for (int d = 0; d < n; d++) out[d] = check_uniform() < 0.3 ? 1 : shape[ndim - n + d];
  return n;
}

/* Input range of each op: away from poles and domains edges. */
static inline void input_range(int dtype, int op, bool unary, double *lo, double *hi) {
  *lo = -3, *hi = 3;
  if (dtype == LT_U8 || dtype == LT_BOOL)
    *lo = 0, *hi = dtype == LT_BOOL ? 2 : 200;
  else if (!is_float(dtype))
    *lo = -20, *hi = 20;
  else if (unary && (op == LT_LOG || op == LT_SQRT || op == LT_RSQRT || op == LT_RECIPROCAL))
    *lo = 0.25;
  else if (!unary && (op == LT_POW || op == LT_DIV))
    *lo = 0.5, *hi = 2;
}

static inline lt_tensor *input(int ndim, const int64_t *shape, int dtype, int op, bool unary) {
  double lo, hi;
  input_range(dtype, op, unary, &lo, &hi);
  lt_tensor *t = check_random(ndim, shape, dtype, lo, hi);
  if (!unary && is_cmp(op) && is_float(dtype)) { /* few distinct values, so that ties happen */
    for (int64_t i = 0; i < lt_numel(t); i++)
      lt_store_f64(lt_data_ptr(t), dtype, i, floor(check_uniform() * 5) / 2 - 1);
  }
  return t;
}

/* Element of t seen through the broadcast shape (ndim, shape) at row-major index i. */
static inline double bcast_at(const lt_tensor *t, int ndim, const int64_t *shape, int64_t i) {
  int64_t coord[LT_MAX_DIMS], idx[LT_MAX_DIMS];
  for (int d = ndim - 1; d >= 0; d--) coord[d] = i % shape[d], i /= shape[d];
  for (int d = 0; d < t->ndim; d++) {
    int od = ndim - t->ndim + d;
    idx[d] = t->shape[d] == 1 ? 0 : coord[od];
  }
  double v = 0;
  lt_get_at(t, idx, &v);
  return v;
}

/* Checks every element of got against want (row-major), reporting the first mismatch. */
static inline void expect(const char *what, const lt_tensor *got, const double *want, double rtol) {
  int64_t n = lt_numel(got), bad = -1;
  for (int64_t i = 0; i < n && bad < 0; i++)
    if (!check_close(check_at(got, i), want[i], rtol, rtol)) bad = i;
  char s[LT_DESC_STR];
  CHECK(bad < 0, "%s %s: element %lld: got %.9g, want %.9g", what, lt_desc(s, got), (long long)bad,
        bad < 0 ? 0 : check_at(got, bad), bad < 0 ? 0 : want[bad]);
}

/* An undefined tensor, or a defined non-contiguous one of shape (the transpose of a
 * tensor of the transposed shape), to receive a result. */
static inline lt_tensor *make_out(int ndim, const int64_t *shape, int dtype, bool noncontig) {
  lt_tensor *out = lt_tensor_new();
  if (!noncontig || ndim < 2) return out;
  int64_t tshape[LT_MAX_DIMS];
  memcpy(tshape, shape, sizeof(int64_t) * (size_t)ndim);
  tshape[0] = shape[ndim - 1], tshape[ndim - 1] = shape[0];
  lt_tensor *base = lt_tensor_new();
  lt_empty(base, ndim, tshape, dtype, LT_DEVICE_CPU);
  lt_fill(base, 7);
  lt_transpose(out, base, 0, ndim - 1);
  lt_release(base);
  return out;
}

#endif
