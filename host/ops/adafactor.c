/* adafactor.c — one Adafactor step on the CPU, CUDA tensors to kernels/adafactor.cu (Shazeer & Stern 2018), as
 * transformers.optimization.Adafactor computes it, operation by operation:
 *   rms_p = ||param|| / sqrt(n);  lr = (scale_parameter ? max(eps2, rms_p) : 1) * rel_lr
 *   u = grad^2 + eps1
 *   factored (param of 2 or more dims [..., R, C]):
 *     row = row * beta2t + (1 - beta2t) * mean_C(u);  col = col * beta2t + (1 - beta2t) * mean_R(u)
 *     u = rsqrt(row / mean_R(row)) * rsqrt(col) * grad
 *   else: v = v * beta2t + (1 - beta2t) * u;  u = rsqrt(v) * grad
 *   u = u / max(rms(u) / clip_threshold, 1) * lr
 *   with beta1 (exp_avg given): m = m * beta1 + (1 - beta1) * u;  u = m
 *   param = param + (-weight_decay * lr) * param  (when weight_decay != 0);  param = param - u
 * rel_lr (the group lr or the relative step) and beta2t = 1 - step^decay_rate are formed by the
 * caller (lua/lutra/optim/adafactor.lua). Sums (norms, means) accumulate in double in the order of
 * kernels/adafactor.h and are rounded once to the compute dtype; every other operation is rounded
 * in the compute dtype, as kernels/adafactor.cu does it with explicitly rounded intrinsics: CUDA
 * and CPU agree bitwise. Dtypes: param, grad and state all f32 or all f64 (a bf16/f16 param is
 * stepped through an f32 copy by the caller, as transformers does). */
#include "ops/backend.h"
#include "ops/multi_tensor.h"
#include <math.h>
#include <stdlib.h>

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off")
#elif defined(__clang__)
#pragma clang fp contract(off)
#endif

typedef lt_adafactor_args adafactor_args;

_Static_assert(LT_OPTIM_CHUNK % LT_ADAFACTOR_RUN == 0, "kernels/adafactor.cu numbers the norms' runs by chunk");

/* Each pass is one kernel of kernels/adafactor.cu, in the same order of operations. */
#define DEFINE_ADAFACTOR(T, S, SQRT)                                                                                   \
  /* the sum of squares of x[0..n) (or of the update, `update`), in runs */                                          \
  static double sumsq_##S(const adafactor_args *a, const T *x, const T *rmean, bool update, double *runs) {            \
    const T *g = a->grad, *row = a->row, *col = a->col, *v = a->v;                                                     \
    int64_t R = a->rows, C = a->cols, len = a->n / a->batches, nruns = (a->n + LT_ADAFACTOR_RUN - 1) / LT_ADAFACTOR_RUN; \
    _Pragma("omp parallel for schedule(static) if (a->n >= 2 * LT_PAR_GRAIN)")                                        \
    for (int64_t k = 0; k < nruns; k++) {                                                                              \
      double run = 0;                                                                                                  \
      int64_t r0 = k * LT_ADAFACTOR_RUN, end = a->n - r0 < LT_ADAFACTOR_RUN ? a->n : r0 + LT_ADAFACTOR_RUN;            \
      for (int64_t i = r0; i < end; i++) {                                                                             \
        T u = update ? unscaled_##S(g, row, col, v, rmean, a->factored, R, C, len, i) : x[i];                          \
        run += (double)u * (double)u;                                                                                  \
      }                                                                                                                \
      runs[k] = run;                                                                                                   \
    }                                                                                                                  \
    double total = 0;                                                                                                  \
    for (int64_t k = 0; k < nruns; k++) total += runs[k];                                                              \
    return total;                                                                                                      \
  }                                                                                                                    \
  static void adafactor_##S(const adafactor_args *a, T *rmean, double *runs) {                                         \
    T *p = a->param, *m = a->m, *row = a->row, *col = a->col, *v = a->v;                                               \
    const T *g = a->grad;                                                                                              \
    T rms_p = (T)sqrt(sumsq_##S(a, p, rmean, false, runs)) / (T)sqrt((double)a->n);                                          \
    T lr = a->scale_parameter ? (rms_p > (T)a->eps2 ? rms_p : (T)a->eps2) * (T)a->rel_lr : (T)a->rel_lr;               \
    const T eps1 = (T)a->eps1, b2 = (T)a->beta2t, c2 = (T)(1.0 - a->beta2t);                                           \
    int64_t R = a->rows, C = a->cols, len = a->n / a->batches;                                                         \
    bool par = a->n >= 2 * LT_PAR_GRAIN;                                                                               \
    if (a->factored) {                                                                                                 \
      _Pragma("omp parallel for schedule(static) if (par)")                                                            \
      for (int64_t br = 0; br < a->batches * R; br++) { /* a row's mean of grad^2 + eps1 */                            \
        const T *gr = g + br * C;                                                                                      \
        double rs = 0;                                                                                                 \
        for (int64_t c = 0; c < C; c++) rs += gr[c] * gr[c] + eps1;                                                    \
        row[br] = row[br] * b2 + c2 * (T)(rs / (double)C);                                                             \
      }                                                                                                                \
      _Pragma("omp parallel for schedule(static) if (par)")                                                            \
      for (int64_t bc = 0; bc < a->batches * C; bc++) { /* a column's, down its rows */                               \
        const T *gc = g + (bc / C) * R * C + bc % C;                                                                   \
        double cs = 0;                                                                                                 \
        for (int64_t r = 0; r < R; r++) cs += gc[r * C] * gc[r * C] + eps1;                                            \
        col[bc] = col[bc] * b2 + c2 * (T)(cs / (double)R);                                                             \
      }                                                                                                                \
      for (int64_t b = 0; b < a->batches; b++) {                                                                       \
        double rs = 0;                                                                                                 \
        for (int64_t r = 0; r < R; r++) rs += row[b * R + r];                                                          \
        rmean[b] = (T)(rs / (double)R);                                                                                \
      }                                                                                                                \
    } else {                                                                                                           \
      _Pragma("omp parallel for schedule(static) if (par)")                                                            \
      for (int64_t i = 0; i < a->n; i++) v[i] = v[i] * b2 + c2 * (g[i] * g[i] + eps1);                                 \
    }                                                                                                                  \
    T rms_u = (T)sqrt(sumsq_##S(a, NULL, rmean, true, runs)) / (T)sqrt((double)a->n) / (T)a->clip;                           \
    T clip_div = rms_u > (T)1 ? rms_u : (T)1, neg_decay = (T)(-a->weight_decay) * lr;                                  \
    const T b1 = (T)a->beta1, c1 = (T)(1.0 - a->beta1);                                                                \
    _Pragma("omp parallel for schedule(static) if (par)")                                                              \
    for (int64_t i = 0; i < a->n; i++) {                                                                               \
      T u = unscaled_##S(g, row, col, v, rmean, a->factored, R, C, len, i) / clip_div * lr;                            \
      if (a->first_moment) {                                                                                           \
        m[i] = m[i] * b1 + c1 * u;                                                                                     \
        u = m[i];                                                                                                      \
      }                                                                                                                \
      if (a->weight_decay != 0) p[i] = p[i] + neg_decay * p[i];                                                        \
      p[i] = p[i] - u;                                                                                                 \
    }                                                                                                                  \
  }

/* Element i of the update before clipping: rsqrt(row / rmean) * rsqrt(col) * grad, or rsqrt(v) * grad. */
#define DEFINE_UNSCALED(T, S, SQRT)                                                                                    \
  static inline T unscaled_##S(const T *g, const T *row, const T *col, const T *v, const T *rmean, bool factored,     \
                               int64_t R, int64_t C, int64_t len, int64_t i) {                                         \
    if (!factored) return (T)1 / SQRT(v[i]) * g[i];                                                                    \
    int64_t b = i / len, k = i % len;                                                                                  \
    T rf = (T)1 / SQRT(row[b * R + k / C] / rmean[b]), cf = (T)1 / SQRT(col[b * C + k % C]);                           \
    return rf * cf * g[i];                                                                                             \
  }
DEFINE_UNSCALED(float, f32, sqrtf)
DEFINE_UNSCALED(double, f64, sqrt)
DEFINE_ADAFACTOR(float, f32, sqrtf)
DEFINE_ADAFACTOR(double, f64, sqrt)

/* An optional or required state operand of n elements and param's dtype (what: its name). */
static int check_state(const char *op, const char *what, const lt_tensor *t, int64_t n, const lt_tensor *param,
                       bool want) {
  if (!want) {
    if (t && t->storage) return lt_errorf("%s: %s must be NULL for this param", op, what);
    return 0;
  }
  return lt_optim_check_operand(op, what, t, n, param->dtype, param->dtype, param);
}

/* The CPU passes on a's contiguous buffers. */
static int adafactor_cpu(const char *op, lt_adafactor_args *a) {
  if (a->n == 0) return 0;
  size_t esize = a->dtype == LT_F64 ? sizeof(double) : sizeof(float);
  void *rmean = malloc(esize * (size_t)(a->batches > 0 ? a->batches : 1));
  double *runs = malloc(sizeof(double) * (size_t)((a->n + LT_ADAFACTOR_RUN - 1) / LT_ADAFACTOR_RUN));
  if (!rmean || !runs) {
    free(rmean), free(runs);
    return lt_errorf("%s: out of memory", op);
  }
  if (a->dtype == LT_F32)
    adafactor_f32(a, rmean, runs);
  else
    adafactor_f64(a, rmean, runs);
  free(rmean), free(runs);
  return 0;
}

/* The operands of one call, and the scalars every tensor shares. */
typedef struct adafactor_call {
  const char *op;
  bool single;
  lt_tensor *const *params, *const *grads, *const *exp_avgs, *const *rows, *const *cols, *const *vs;
  lt_adafactor_args scalars;
} adafactor_call;

static lt_tensor *operand(lt_tensor *const *list, int64_t i) { return list ? list[i] : NULL; }

/* Checks tensor i of the call and fills a (its shape and scalars; the pointers come later). */
static int adafactor_check_entry(const adafactor_call *c, int64_t i, int device, lt_adafactor_args *a) {
  char name[48], desc[LT_DESC_STR];
  const char *op = c->op;
  lt_tensor *param = c->params[i], *exp_avg = operand(c->exp_avgs, i);
  LT_TRY(lt_check_defined(op, lt_optim_name(name, sizeof name, "params", i, c->single), param));
  if (param->device != device)
    return lt_errorf("%s: %s is %s, expected it on %s as params[0]", op, name, lt_desc(desc, param),
                     lt_device_str((char[16]){0}, device));
  if (param->dtype != LT_F32 && param->dtype != LT_F64)
    return lt_errorf("%s: %s is %s, expected f32 or f64", op, name, lt_dtype_name(param->dtype));
  int64_t n = lt_numel(param);
  *a = c->scalars;
  a->n = n, a->batches = 1, a->rows = 1, a->cols = n, a->dtype = param->dtype;
  a->factored = param->ndim >= 2, a->first_moment = exp_avg != NULL && exp_avg->storage != NULL;
  if (a->factored) {
    a->rows = param->shape[param->ndim - 2];
    a->cols = param->shape[param->ndim - 1];
    a->batches = a->rows * a->cols > 0 ? n / (a->rows * a->cols) : 0;
  }
  LT_TRY(lt_optim_check_operand(op, lt_optim_name(name, sizeof name, "grads", i, c->single), c->grads[i], n,
                                param->dtype, param->dtype, param));
  LT_TRY(check_state(op, lt_optim_name(name, sizeof name, c->single ? "exp_avg" : "exp_avgs", i, c->single), exp_avg,
                     n, param, a->first_moment));
  LT_TRY(check_state(op, lt_optim_name(name, sizeof name, "rows", i, c->single), operand(c->rows, i),
                     a->batches * a->rows, param, a->factored));
  LT_TRY(check_state(op, lt_optim_name(name, sizeof name, "cols", i, c->single), operand(c->cols, i),
                     a->batches * a->cols, param, a->factored));
  LT_TRY(check_state(op, lt_optim_name(name, sizeof name, c->single ? "v" : "vs", i, c->single), operand(c->vs, i), n,
                     param, !a->factored));
  return lt_optim_check_storage(op, lt_optim_name(name, sizeof name, "params", i, c->single), param);
}

enum { HELD = 6 }; /* per tensor: param, grad, exp_avg, row, col, v */

/* Makes tensor i's operands contiguous (h[0..HELD)) and points a at them; nonzero on failure. */
static int adafactor_hold(const adafactor_call *c, int64_t i, lt_tensor **h, lt_adafactor_args *a) {
  h[0] = lt_begin_inplace(c->params[i]), h[1] = lt_tensor_new();
  if (a->first_moment) h[2] = lt_begin_inplace(c->exp_avgs[i]);
  if (a->factored) h[3] = lt_begin_inplace(c->rows[i]), h[4] = lt_begin_inplace(c->cols[i]);
  if (!a->factored) h[5] = lt_begin_inplace(c->vs[i]);
  if (!h[0] || !h[1] || (a->first_moment && !h[2]) || (a->factored && (!h[3] || !h[4])) || (!a->factored && !h[5]) ||
      lt_contiguous(h[1], c->grads[i]))
    return -1;
  a->param = lt_data_ptr(h[0]), a->grad = lt_data_ptr(h[1]);
  a->m = h[2] ? lt_data_ptr(h[2]) : NULL, a->row = h[3] ? lt_data_ptr(h[3]) : NULL;
  a->col = h[4] ? lt_data_ptr(h[4]) : NULL, a->v = h[5] ? lt_data_ptr(h[5]) : NULL;
  return 0;
}

static int adafactor_release(const adafactor_call *c, int64_t i, lt_tensor **h, int rc) {
  lt_tensor *targets[HELD] = {c->params[i], NULL, operand(c->exp_avgs, i), operand(c->rows, i), operand(c->cols, i),
                              operand(c->vs, i)};
  for (int k = 0; k < HELD; k++)
    if (h[k] && k != 1) rc = lt_finish_inplace(targets[k], h[k], rc);
  lt_release(h[1]);
  return rc;
}

/* Numbers the entries' chunks, rows, columns and batches (lt_adafactor_entry). */
static lt_adafactor_counts number_entries(lt_adafactor_entry *e, int64_t n) {
  lt_adafactor_counts t = {0, 0, 0, 0};
  for (int64_t i = 0; i < n; i++) {
    const lt_adafactor_args *a = &e[i].a;
    e[i].first_chunk = t.chunks, e[i].first_row = t.rows, e[i].first_col = t.cols, e[i].first_batch = t.batches;
    t.chunks += (a->n + LT_OPTIM_CHUNK - 1) / LT_OPTIM_CHUNK;
    if (a->factored) t.rows += a->batches * a->rows, t.cols += a->batches * a->cols, t.batches += a->batches;
  }
  return t;
}

/* One step of the call's n tensors: on the CPU each in turn, on CUDA in one set of launches. */
static int adafactor_run(const adafactor_call *c, int64_t n) {
  const char *op = c->op;
  const lt_adafactor_args *s = &c->scalars;
  if (n < 0) return lt_errorf("%s: n must be >= 0, got %lld", op, (long long)n);
  if (n > 0 && (!c->params || !c->grads))
    return lt_errorf("%s: params and grads must be arrays of %lld tensors (got NULL)", op, (long long)n);
  if (!(s->rel_lr >= 0) || !(s->eps1 >= 0) || !(s->eps2 >= 0) || !(s->clip > 0) || !(s->weight_decay >= 0))
    return lt_errorf("%s: lr, eps and weight_decay must be >= 0 and clip_threshold > 0", op);
  if (!(s->beta2t >= 0 && s->beta2t < 1)) return lt_errorf("%s: beta2t must be in [0, 1), got %g", op, s->beta2t);
  if (n == 0) return 0;
  LT_TRY(lt_check_defined(op, c->single ? "param" : "params[0]", c->params[0]));
  int device = c->params[0]->device;
  LT_TRY(lt_optim_check_build(op, device));
  lt_adafactor_entry *entries = calloc((size_t)n, sizeof *entries);
  lt_tensor **held = calloc((size_t)n * HELD, sizeof *held);
  int rc = -1;
  if (!entries || !held) {
    rc = lt_errorf("%s: out of memory for %lld tensors", op, (long long)n);
    goto done;
  }
  for (int64_t i = 0; i < n; i++) {
    if (adafactor_check_entry(c, i, device, &entries[i].a)) goto done;
    if (entries[i].a.first_moment && !(s->beta1 >= 0 && s->beta1 < 1)) {
      rc = lt_errorf("%s: beta1 must be in [0, 1), got %g", op, s->beta1);
      goto done;
    }
  }
  for (int64_t i = 0; i < n; i++)
    if (adafactor_hold(c, i, held + HELD * i, &entries[i].a)) goto done;
  if (device == LT_DEVICE_CPU) {
    rc = 0;
    for (int64_t i = 0; i < n && rc == 0; i++) rc = adafactor_cpu(op, &entries[i].a);
  } else {
    lt_adafactor_counts counts = number_entries(entries, n);
    const lt_backend *be = lt_backend_for(op, device);
    rc = !be ? -1 : counts.chunks > 0 ? be->adafactor_multi(device, entries, n, &counts) : 0;
  }
done:
  for (int64_t i = 0; held && i < n; i++) rc = adafactor_release(c, i, held + HELD * i, rc);
  free(held);
  free(entries);
  return rc;
}

static lt_adafactor_args shared_scalars(double rel_lr, int scale_parameter, double eps1, double eps2,
                                        double clip_threshold, double beta2t, double beta1, double weight_decay) {
  return (lt_adafactor_args){.scale_parameter = scale_parameter != 0, .rel_lr = rel_lr, .eps1 = eps1, .eps2 = eps2,
                             .clip = clip_threshold, .beta2t = beta2t, .beta1 = beta1, .weight_decay = weight_decay};
}

int lt_adafactor_step(lt_tensor *param, const lt_tensor *grad, lt_tensor *exp_avg, lt_tensor *row, lt_tensor *col,
                      lt_tensor *v, double rel_lr, int scale_parameter, double eps1, double eps2,
                      double clip_threshold, double beta2t, double beta1, double weight_decay) {
  lt_tensor *g = (lt_tensor *)grad; /* only read */
  adafactor_call c = {"adafactor", true, &param, &g, &exp_avg, &row, &col, &v,
                      shared_scalars(rel_lr, scale_parameter, eps1, eps2, clip_threshold, beta2t, beta1, weight_decay)};
  return adafactor_run(&c, 1);
}

int lt_adafactor_step_multi(int64_t n, lt_tensor *const *params, lt_tensor *const *grads, lt_tensor *const *exp_avgs,
                            lt_tensor *const *rows, lt_tensor *const *cols, lt_tensor *const *vs, double rel_lr,
                            int scale_parameter, double eps1, double eps2, double clip_threshold, double beta2t,
                            double beta1, double weight_decay) {
  adafactor_call c = {"adafactor_multi", false, params, grads, exp_avgs, rows, cols, vs,
                      shared_scalars(rel_lr, scale_parameter, eps1, eps2, clip_threshold, beta2t, beta1, weight_decay)};
  return adafactor_run(&c, n);
}
