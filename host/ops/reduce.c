/* reduce.c — sum, mean, max, min, prod, L2 norm and var over any set of dims, on the CPU.
 *
 * The input's dims are split into kept and reduced ones, sorted by input stride and coalesced
 * (ops/reduce_geom.h). Two shapes of work follow from the innermost dim:
 * - inner: the innermost dim is reduced. Each output reduces runs along memory (a row of a
 *   (N, C) tensor reduced over C); few outputs split their reduction into fixed chunks.
 * - outer: the innermost dim is kept. Each output row accumulates whole input rows into a
 *   vector (dim 0 of (N, C): add N rows of C), never striding across memory.
 * Floats accumulate in double (16M x 0.1f sums right to ~1e-9), integers in int64.
 * CUDA tensors take the same checks and plan, then kernels/reduce.cu (kernels/reduce.h). */
#include "ops/reduce_geom.h"
#include <stdlib.h>

static const char *const reduce_names[LT_NUM_REDUCE_OPS] = {"sum", "mean", "max", "min", "prod", "norm"};
const char *lt_reduce_name(int op) { return op >= 0 && op < LT_NUM_REDUCE_OPS ? reduce_names[op] : "?"; }

/* What is accumulated; the public op is applied when results are finished. */
typedef enum { ACC_SUM, ACC_SUMSQ, ACC_SQDEV, ACC_PROD, ACC_MAX, ACC_MIN } acc_op;

enum {
  BLOCK = 1024,        /* elements converted / reduced at a time (stays in L1) */
  COLS = 512,          /* columns per task in the outer path */
  SPLIT_GRAIN = 65536, /* elements per chunk when one output's reduction is split */
  FEW_TASKS = 64       /* below this many outputs (or column blocks) reductions get split */
};

static double acc_init_f(acc_op op) {
  switch (op) {
  case ACC_PROD: return 1;
  case ACC_MAX: return -INFINITY;
  case ACC_MIN: return INFINITY;
  default: return 0;
  }
}
static int64_t acc_init_i(acc_op op) {
  switch (op) {
  case ACC_PROD: return 1;
  case ACC_MAX: return INT64_MIN;
  case ACC_MIN: return INT64_MAX;
  default: return 0;
  }
}
/* NaN wins max and min, as in torch. */
static double combine_f(acc_op op, double x, double y) {
  switch (op) {
  case ACC_PROD: return x * y;
  case ACC_MAX: return isnan(x) || isnan(y) ? NAN : (y > x ? y : x);
  case ACC_MIN: return isnan(x) || isnan(y) ? NAN : (y < x ? y : x);
  default: return x + y;
  }
}
static int64_t combine_i(acc_op op, int64_t x, int64_t y) {
  switch (op) {
  case ACC_PROD: return (int64_t)((uint64_t)x * (uint64_t)y); /* wraps like torch, no UB */
  case ACC_MAX: return y > x ? y : x;
  case ACC_MIN: return y < x ? y : x;
  default: return (int64_t)((uint64_t)x + (uint64_t)y);
  }
}

/* ---- float kernels: a contiguous block of f32 or f64, accumulated in double --------- */

#define BLOCK_REDUCE(T)                                                                                                \
  static double block_##T(const T *p, int64_t n, acc_op op, double center) {                                           \
    double s = 0, prod = 1;                                                                                            \
    T m = op == ACC_MAX ? -INFINITY : INFINITY;                                                                        \
    int nan = 0;                                                                                                       \
    switch (op) {                                                                                                      \
    case ACC_SUM: _Pragma("omp simd reduction(+ : s)") for (int64_t i = 0; i < n; i++) s += p[i]; return s;            \
    case ACC_SUMSQ:                                                                                                    \
      _Pragma("omp simd reduction(+ : s)") for (int64_t i = 0; i < n; i++) s += (double)p[i] * p[i];                   \
      return s;                                                                                                        \
    case ACC_SQDEV:                                                                                                    \
      _Pragma("omp simd reduction(+ : s)") for (int64_t i = 0; i < n; i++) {                                           \
        double d = p[i] - center;                                                                                      \
        s += d * d;                                                                                                    \
      }                                                                                                                \
      return s;                                                                                                        \
    case ACC_PROD: _Pragma("omp simd reduction(* : prod)") for (int64_t i = 0; i < n; i++) prod *= p[i]; return prod;  \
    case ACC_MAX:                                                                                                      \
      _Pragma("omp simd reduction(max : m) reduction(| : nan)") for (int64_t i = 0; i < n; i++) {                      \
        m = p[i] > m ? p[i] : m;                                                                                       \
        nan |= p[i] != p[i];                                                                                           \
      }                                                                                                                \
      return nan ? NAN : m;                                                                                            \
    case ACC_MIN:                                                                                                      \
      _Pragma("omp simd reduction(min : m) reduction(| : nan)") for (int64_t i = 0; i < n; i++) {                      \
        m = p[i] < m ? p[i] : m;                                                                                       \
        nan |= p[i] != p[i];                                                                                           \
      }                                                                                                                \
      return nan ? NAN : m;                                                                                            \
    }                                                                                                                  \
    return 0;                                                                                                          \
  }
BLOCK_REDUCE(float)
BLOCK_REDUCE(double)

/* acc[j] op= p[j] for a block of columns. */
#define ROWS_ACCUMULATE(T)                                                                                             \
  static void accumulate_##T(double *acc, const T *p, int64_t n, acc_op op, const double *center) {                    \
    switch (op) {                                                                                                      \
    case ACC_SUM:                                                                                                      \
      for (int64_t j = 0; j < n; j++) acc[j] += p[j];                                                                  \
      break;                                                                                                           \
    case ACC_SUMSQ:                                                                                                    \
      for (int64_t j = 0; j < n; j++) acc[j] += (double)p[j] * p[j];                                                   \
      break;                                                                                                           \
    case ACC_SQDEV:                                                                                                    \
      for (int64_t j = 0; j < n; j++) {                                                                                \
        double d = p[j] - center[j];                                                                                   \
        acc[j] += d * d;                                                                                               \
      }                                                                                                                \
      break;                                                                                                           \
    case ACC_PROD:                                                                                                     \
      for (int64_t j = 0; j < n; j++) acc[j] *= p[j];                                                                  \
      break;                                                                                                           \
    case ACC_MAX: /* once acc[j] is NaN nothing compares above it */                                                   \
      for (int64_t j = 0; j < n; j++) acc[j] = (p[j] > acc[j] || p[j] != p[j]) ? p[j] : acc[j];                        \
      break;                                                                                                           \
    case ACC_MIN:                                                                                                      \
      for (int64_t j = 0; j < n; j++) acc[j] = (p[j] < acc[j] || p[j] != p[j]) ? p[j] : acc[j];                        \
      break;                                                                                                           \
    }                                                                                                                  \
  }
ROWS_ACCUMULATE(float)
ROWS_ACCUMULATE(double)

/* Converts n (<= BLOCK) elements at element stride `stride` of a float dtype other than f64
 * into f32, or returns the data itself when it already is contiguous f32. */
static const float *as_f32(float *buf, const char *p, int dtype, int64_t n, int64_t stride) {
  if (dtype == LT_F32 && stride == 1) return (const float *)p;
  if (dtype == LT_F32)
    for (int64_t i = 0; i < n; i++) buf[i] = ((const float *)p)[i * stride];
  else if (dtype == LT_BF16)
    for (int64_t i = 0; i < n; i++) buf[i] = lt_bf16_to_f32(((const uint16_t *)p)[i * stride]);
  else
    for (int64_t i = 0; i < n; i++) buf[i] = lt_f16_to_f32(((const uint16_t *)p)[i * stride]);
  return buf;
}
static const double *as_f64(double *buf, const char *p, int64_t n, int64_t stride) {
  if (stride == 1) return (const double *)p;
  for (int64_t i = 0; i < n; i++) buf[i] = ((const double *)p)[i * stride];
  return buf;
}

/* Reduces a run of n elements at p (element stride `stride`) of a float dtype. */
static double run_f(const char *p, int dtype, int esize, int64_t n, int64_t stride, acc_op op, double center) {
  double acc = acc_init_f(op);
  for (int64_t i0 = 0; i0 < n; i0 += BLOCK) {
    int64_t m = n - i0 < BLOCK ? n - i0 : BLOCK;
    const char *q = p + i0 * stride * esize;
    if (dtype == LT_F64) {
      double buf[BLOCK];
      acc = combine_f(op, acc, block_double(as_f64(buf, q, m, stride), m, op, center));
    } else {
      float buf[BLOCK];
      acc = combine_f(op, acc, block_float(as_f32(buf, q, dtype, m, stride), m, op, center));
    }
  }
  return acc;
}

/* acc[0..n) op= row[0..n) (element stride `stride`), n <= COLS. */
static void accumulate_f(double *acc, const char *row, int dtype, int64_t n, int64_t stride, acc_op op,
                         const double *center) {
  if (dtype == LT_F64) {
    double buf[COLS];
    accumulate_double(acc, as_f64(buf, row, n, stride), n, op, center);
  } else {
    float buf[COLS];
    accumulate_float(acc, as_f32(buf, row, dtype, n, stride), n, op, center);
  }
}

/* ---- integer kernels (sum, prod, max, min in int64) ---------------------------------- */

#define INT_LOOP(T, BODY)                                                                                              \
  do {                                                                                                                 \
    const T *p = (const T *)base;                                                                                      \
    for (int64_t i = 0; i < n; i++) {                                                                                  \
      int64_t x = p[i * stride];                                                                                       \
      BODY;                                                                                                            \
    }                                                                                                                  \
  } while (0)
#define INT_DISPATCH(BODY)                                                                                             \
  switch (dtype) {                                                                                                     \
  case LT_I32: INT_LOOP(int32_t, BODY); break;                                                                         \
  case LT_I64: INT_LOOP(int64_t, BODY); break;                                                                         \
  default: INT_LOOP(uint8_t, BODY); break;                                                                             \
  }

static int64_t run_i(const char *base, int dtype, int64_t n, int64_t stride, acc_op op) {
  int64_t acc = acc_init_i(op);
  switch (op) {
  case ACC_PROD: INT_DISPATCH(acc = (int64_t)((uint64_t)acc * (uint64_t)x)); break;
  case ACC_MAX: INT_DISPATCH(acc = x > acc ? x : acc); break;
  case ACC_MIN: INT_DISPATCH(acc = x < acc ? x : acc); break;
  default: INT_DISPATCH(acc = (int64_t)((uint64_t)acc + (uint64_t)x)); break;
  }
  return acc;
}

static void accumulate_i(int64_t *acc, const char *base, int dtype, int64_t n, int64_t stride, acc_op op) {
#define J (i)
  switch (op) {
  case ACC_PROD: INT_DISPATCH(acc[J] = (int64_t)((uint64_t)acc[J] * (uint64_t)x)); break;
  case ACC_MAX: INT_DISPATCH(acc[J] = x > acc[J] ? x : acc[J]); break;
  case ACC_MIN: INT_DISPATCH(acc[J] = x < acc[J] ? x : acc[J]); break;
  default: INT_DISPATCH(acc[J] = (int64_t)((uint64_t)acc[J] + (uint64_t)x)); break;
  }
#undef J
}

/* ---- the two paths -------------------------------------------------------------------- */

typedef struct reduce_job {
  const reduce_geom *g;
  const char *base; /* a's element [0,...,0] */
  int dtype, esize;
  bool is_int;
  acc_op op;
  const double *center; /* per output (kept-linear order), for ACC_SQDEV */
} reduce_job;

/* Reduces flat reduced indices [r0, r1) for the output whose input offset is in_off. */
static void inner_range(const reduce_job *J, int64_t in_off, int64_t o, int64_t r0, int64_t r1, double *rf,
                        int64_t *ri) {
  const reduce_geom *g = J->g;
  int64_t len = g->rshape[g->nred - 1], rs = g->rstride[g->nred - 1];
  double accf = acc_init_f(J->op), center = J->center ? J->center[o] : 0;
  int64_t acci = acc_init_i(J->op);
  for (int64_t r = r0; r < r1;) {
    int64_t row = r / len, col = r % len, n = len - col < r1 - r ? len - col : r1 - r;
    int64_t off = in_off + lt_offset_of(row, g->nred - 1, g->rshape, g->rstride) + col * rs;
    const char *p = J->base + off * J->esize;
    if (J->is_int)
      acci = combine_i(J->op, acci, run_i(p, J->dtype, n, rs, J->op));
    else
      accf = combine_f(J->op, accf, run_f(p, J->dtype, J->esize, n, rs, J->op, center));
    r += n;
  }
  *rf = accf;
  *ri = acci;
}

/* Task t: split t % nsplit of output t / nsplit, into pf[t], pi[t]. */
static inline void inner_task(const reduce_job *J, int64_t t, int64_t nsplit, double *pf, int64_t *pi) {
  const reduce_geom *g = J->g;
  int64_t o = t / nsplit, s = t % nsplit, n_red = g->n_red;
  int64_t in_off = lt_offset_of(o, g->nkept, g->kshape, g->kstride);
  inner_range(J, in_off, o, n_red * s / nsplit, n_red * (s + 1) / nsplit, &pf[t], &pi[t]);
}

static int reduce_inner(const reduce_job *J, double *resf, int64_t *resi) {
  const reduce_geom *g = J->g;
  int64_t n_out = g->n_out, n_red = g->n_red, nsplit = 1;
  if (n_out < FEW_TASKS && n_red > 2 * SPLIT_GRAIN) nsplit = (n_red + SPLIT_GRAIN - 1) / SPLIT_GRAIN;
  double *pf = resf;
  int64_t *pi = resi;
  if (nsplit > 1) {
    pf = malloc(sizeof(double) * n_out * nsplit);
    pi = malloc(sizeof(int64_t) * n_out * nsplit);
    if (!pf || !pi) return free(pf), free(pi), lt_errorf("reduce: out of host memory for partial results");
  }
  int64_t ntasks = n_out * nsplit;
  if (ntasks > 1 && n_out * n_red >= LT_PAR_GRAIN) { /* no omp construct for small work: see ew_execute */
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < ntasks; t++) inner_task(J, t, nsplit, pf, pi);
  } else {
    for (int64_t t = 0; t < ntasks; t++) inner_task(J, t, nsplit, pf, pi);
  }
  if (nsplit > 1) { /* combine chunks in order: the result does not depend on the thread count */
    for (int64_t o = 0; o < n_out; o++) {
      resf[o] = pf[o * nsplit];
      resi[o] = pi[o * nsplit];
      for (int64_t s = 1; s < nsplit; s++) {
        resf[o] = combine_f(J->op, resf[o], pf[o * nsplit + s]);
        resi[o] = combine_i(J->op, resi[o], pi[o * nsplit + s]);
      }
    }
    free(pf);
    free(pi);
  }
  return 0;
}

/* Task t: column block t / nsplit % ncb of outer row t / (ncb * nsplit), split t % nsplit; writes partial s. */
static inline void outer_task(const reduce_job *J, int64_t t, int64_t nsplit, double *pf, int64_t *pi) {
  const reduce_geom *g = J->g;
  int64_t C = g->kshape[g->nkept - 1], cs = g->kstride[g->nkept - 1];
  int64_t ncb = (C + COLS - 1) / COLS, n_red = g->n_red;
  int64_t o = t / (ncb * nsplit), cb = t / nsplit % ncb, s = t % nsplit;
  int64_t c0 = cb * COLS, nc = C - c0 < COLS ? C - c0 : COLS;
  int64_t in_off = lt_offset_of(o, g->nkept - 1, g->kshape, g->kstride) + c0 * cs;
  int64_t dst = s * g->n_out + o * C + c0; /* partial s of output (o, c0..) */
  double accf[COLS];
  int64_t acci[COLS];
  for (int64_t j = 0; j < nc; j++) accf[j] = acc_init_f(J->op), acci[j] = acc_init_i(J->op);
  const double *center = J->center ? J->center + o * C + c0 : NULL;
  reduce_odometer it;
  int64_t r0 = n_red * s / nsplit, r1 = n_red * (s + 1) / nsplit;
  reduce_odometer_start(&it, g->nred, g->rshape, g->rstride, r0);
  for (int64_t r = r0; r < r1; r++, reduce_odometer_next(&it)) {
    const char *row = J->base + (in_off + it.offset) * J->esize;
    if (J->is_int)
      accumulate_i(acci, row, J->dtype, nc, cs, J->op);
    else
      accumulate_f(accf, row, J->dtype, nc, cs, J->op, center);
  }
  memcpy(pf + dst, accf, sizeof(double) * nc);
  memcpy(pi + dst, acci, sizeof(int64_t) * nc);
}

/* The innermost kept dim holds C columns; outputs are (O, C) in kept-linear order. */
static int reduce_outer(const reduce_job *J, double *resf, int64_t *resi) {
  const reduce_geom *g = J->g;
  int64_t C = g->kshape[g->nkept - 1], O = g->n_out / C;
  int64_t ncb = (C + COLS - 1) / COLS, n_red = g->n_red, nsplit = 1;
  if (O * ncb < FEW_TASKS && n_red * C > 2 * SPLIT_GRAIN) {
    nsplit = n_red * C / SPLIT_GRAIN;
    if (nsplit > 16) nsplit = 16;
    if (nsplit > n_red) nsplit = n_red;
  }
  double *pf = resf;
  int64_t *pi = resi;
  if (nsplit > 1) {
    pf = malloc(sizeof(double) * g->n_out * nsplit);
    pi = malloc(sizeof(int64_t) * g->n_out * nsplit);
    if (!pf || !pi) return free(pf), free(pi), lt_errorf("reduce: out of host memory for partial results");
  }
  int64_t ntasks = O * ncb * nsplit;
  if (ntasks > 1 && g->n_out * n_red >= LT_PAR_GRAIN) {
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < ntasks; t++) outer_task(J, t, nsplit, pf, pi);
  } else {
    for (int64_t t = 0; t < ntasks; t++) outer_task(J, t, nsplit, pf, pi);
  }
  if (nsplit > 1) {
    for (int64_t o = 0; o < g->n_out; o++) {
      resf[o] = pf[o];
      resi[o] = pi[o];
      for (int64_t s = 1; s < nsplit; s++) {
        resf[o] = combine_f(J->op, resf[o], pf[s * g->n_out + o]);
        resi[o] = combine_i(J->op, resi[o], pi[s * g->n_out + o]);
      }
    }
    free(pf);
    free(pi);
  }
  return 0;
}

static int run_reduction(const reduce_job *J, double *resf, int64_t *resi) {
  if (J->g->n_out == 0) return 0;
  return J->g->inner ? reduce_inner(J, resf, resi) : reduce_outer(J, resf, resi);
}

/* ---- entry points ---------------------------------------------------------------------- */

static inline void store_one(char *base, int dtype, const reduce_geom *g, int64_t o, const double *resf,
                             const int64_t *resi, bool is_int) {
  int64_t off = lt_offset_of(o, g->nkept, g->kshape, g->kout);
  if (!is_int) {
    lt_store_f64(base, dtype, off, resf[o]);
  } else {
    switch (dtype) {
    case LT_I32: ((int32_t *)base)[off] = (int32_t)resi[o]; break;
    case LT_I64: ((int64_t *)base)[off] = resi[o]; break;
    default: ((uint8_t *)base)[off] = dtype == LT_BOOL ? resi[o] != 0 : (uint8_t)resi[o]; break;
    }
  }
}

/* Writes results (kept-linear order) into out through its own strides. */
static void store_results(lt_tensor *out, const reduce_geom *g, const double *resf, const int64_t *resi, bool is_int) {
  char *base = lt_data_ptr(out);
  int dtype = out->dtype;
  if (g->n_out >= LT_PAR_GRAIN) {
#pragma omp parallel for schedule(static)
    for (int64_t o = 0; o < g->n_out; o++) store_one(base, dtype, g, o, resf, resi, is_int);
  } else {
    for (int64_t o = 0; o < g->n_out; o++) store_one(base, dtype, g, o, resf, resi, is_int);
  }
}

/* A CUDA tensor's reduction `what` (an lt_reduce_op or LT_CUDA_REDUCE_VAR), by kernels/reduce.cu. */
static int reduce_cuda(const char *op, lt_tensor *out, const lt_tensor *a, const reduce_geom *g, int what,
                       double var_denom) {
  const lt_backend *be = lt_backend_for(op, a->device); /* lt_reduce_check_device passed it */
  if (!be) return -1;
  lt_cuda_red_geom c;
  reduce_geom_to_cuda(g, &c);
  return be->reduce(op, a->device, &c, lt_data_ptr(a), lt_data_ptr(out), a->dtype, what, var_denom);
}

/* Checks a, plans the geometry and prepares out; buffers of n_out results are returned. */
static int reduce_setup(const char *op, lt_tensor *out, const lt_tensor *a, int ndims, const int64_t *dims, int keepdim,
                        bool empty_is_error, reduce_geom *g, double **resf, int64_t **resi) {
  LT_TRY(lt_check_defined(op, "input", a));
  LT_TRY(lt_reduce_check_device(op, a));
  LT_TRY(reduce_geom_plan(op, g, a, ndims, dims));
  if (empty_is_error && g->n_red == 0) return lt_errorf("%s: cannot reduce an empty dim", op);
  int64_t oshape[LT_MAX_DIMS];
  int ondim = reduce_out_shape(a, g->reduced, keepdim, oshape);
  LT_TRY(lt_prepare_out(op, out, ondim, oshape, a->dtype, a->device));
  reduce_geom_set_out(g, a, out, keepdim);
  *resf = NULL, *resi = NULL;
  if (a->device != LT_DEVICE_CPU) return 0; /* the kernels keep their results on the device */
  int64_t n = g->n_out > 0 ? g->n_out : 1;
  *resf = malloc(sizeof(double) * n);
  *resi = malloc(sizeof(int64_t) * n);
  if (!*resf || !*resi) return free(*resf), free(*resi), lt_errorf("%s: out of host memory", op);
  return 0;
}

int lt_reduce(lt_tensor *out, const lt_tensor *a, int op, int ndims, const int64_t *dims, int keepdim) {
  if (op < 0 || op >= LT_NUM_REDUCE_OPS) return lt_errorf("reduce: unknown op %d", op);
  const char *name = reduce_names[op];
  LT_TRY(lt_check_defined(name, "input", a));
  bool is_int = !lt_dtype_is_float(a->dtype);
  if (is_int && (op == LT_MEAN || op == LT_NORM))
    return lt_errorf("%s: needs a floating dtype, got %s", name, lt_dtype_name(a->dtype));
  if (a->dtype == LT_BOOL && (op == LT_SUM || op == LT_PROD))
    return lt_errorf("%s: not supported for bool; convert to an integer dtype first", name);
  reduce_geom g;
  double *resf;
  int64_t *resi;
  LT_TRY(reduce_setup(name, out, a, ndims, dims, keepdim, op == LT_MAX || op == LT_MIN, &g, &resf, &resi));
  if (a->device != LT_DEVICE_CPU) return reduce_cuda(name, out, a, &g, op, 0);
  static const acc_op acc_of[LT_NUM_REDUCE_OPS] = {ACC_SUM, ACC_SUM, ACC_MAX, ACC_MIN, ACC_PROD, ACC_SUMSQ};
  reduce_job J = {&g, lt_data_ptr(a), a->dtype, lt_dtype_size(a->dtype), is_int, acc_of[op], NULL};
  int rc = run_reduction(&J, resf, resi);
  if (rc == 0) {
    for (int64_t o = 0; o < g.n_out && !is_int; o++) {
      if (op == LT_MEAN) resf[o] /= (double)g.n_red; /* 0/0 is nan for an empty dim */
      if (op == LT_NORM) resf[o] = sqrt(resf[o]);
    }
    store_results(out, &g, resf, resi, is_int);
  }
  free(resf), free(resi);
  return rc;
}

/* Two passes: the mean, then the sum of squared deviations from it (stable for any offset). */
int lt_var(lt_tensor *out, const lt_tensor *a, int ndims, const int64_t *dims, int64_t correction, int keepdim) {
  LT_TRY(lt_check_defined("var", "input", a));
  if (!lt_dtype_is_float(a->dtype)) return lt_errorf("var: needs a floating dtype, got %s", lt_dtype_name(a->dtype));
  if (correction < 0) return lt_errorf("var: correction must be >= 0, got %lld", (long long)correction);
  reduce_geom g;
  double *resf;
  int64_t *resi;
  LT_TRY(reduce_setup("var", out, a, ndims, dims, keepdim, false, &g, &resf, &resi));
  double denom = g.n_red > correction ? (double)(g.n_red - correction) : 0; /* 0/0 is nan, as torch */
  if (a->device != LT_DEVICE_CPU) return reduce_cuda("var", out, a, &g, LT_CUDA_REDUCE_VAR, denom);
  double *mean = malloc(sizeof(double) * (g.n_out > 0 ? g.n_out : 1));
  if (!mean) return free(resf), free(resi), lt_errorf("var: out of host memory");
  reduce_job J = {&g, lt_data_ptr(a), a->dtype, lt_dtype_size(a->dtype), false, ACC_SUM, NULL};
  int rc = run_reduction(&J, mean, resi);
  if (rc == 0) {
    for (int64_t o = 0; o < g.n_out; o++) mean[o] /= (double)g.n_red;
    J.op = ACC_SQDEV;
    J.center = mean;
    rc = run_reduction(&J, resf, resi);
  }
  if (rc == 0) {
    for (int64_t o = 0; o < g.n_out; o++) resf[o] /= denom;
    store_results(out, &g, resf, resi, false);
  }
  free(mean), free(resf), free(resi);
  return rc;
}
