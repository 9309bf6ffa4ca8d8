/* multi_tensor.c — ops over many tensors in one call, for the optimizer: the global
 * gradient norm's sum of squares, the scale that clips gradients, clipping's coefficient, and
 * the checks and chunk loops that the multi-tensor AdamW (host/ops/adamw.c) shares.
 *
 * Work is cut into chunks of LT_OPTIM_CHUNK elements of one tensor each, numbered across all
 * tensors: the CPU runs them as OpenMP tasks, CUDA as one block each in one launch. A sum of
 * squares is formed per chunk in f64 and the chunk sums are added in chunk order, so the result
 * does not depend on the thread count, and nothing waits for the host on CUDA. */
#include "ops/multi_tensor.h"
#include "ops/backend.h"
#include <stdio.h>
#include <stdlib.h>

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off")
#elif defined(__clang__)
#pragma clang fp contract(off)
#endif

/* ---- shared checks and loops ------------------------------------------------------------- */

const char *lt_optim_name(char *buf, int len, const char *what, int64_t i, bool single) {
  size_t k = strlen(what);
  if (single) /* the single op's operand: "params" -> "param", "m" stays */
    snprintf(buf, (size_t)len, "%.*s", (int)(k > 1 && what[k - 1] == 's' ? k - 1 : k), what);
  else
    snprintf(buf, (size_t)len, "%s[%lld]", what, (long long)i);
  return buf;
}

int lt_optim_check_operand(const char *op, const char *what, const lt_tensor *t, int64_t n, int dtype_a, int dtype_b,
                           const lt_tensor *param) {
  char d[LT_DESC_STR], dp[LT_DESC_STR];
  LT_TRY(lt_check_defined(op, what, t));
  if (t->device != param->device)
    return lt_errorf("%s: %s is %s, expected it on the device of param (%s)", op, what, lt_desc(d, t),
                     lt_desc(dp, param));
  if (lt_numel(t) != n)
    return lt_errorf("%s: %s is %s, expected %lld elements as param (%s)", op, what, lt_desc(d, t), (long long)n,
                     lt_desc(dp, param));
  if (t->dtype != dtype_a && t->dtype != dtype_b)
    return lt_errorf("%s: %s is %s, expected %s%s%s for param %s", op, what, lt_desc(d, t), lt_dtype_name(dtype_a),
                     dtype_a == dtype_b ? "" : " or ", dtype_a == dtype_b ? "" : lt_dtype_name(dtype_b),
                     lt_desc(dp, param));
  return lt_optim_check_storage(op, what, t);
}

int lt_optim_check_storage(const char *op, const char *what, const lt_tensor *t) {
  char dev[16], sdev[16];
  if (t->device >= 0 && t->storage && t->storage->device != t->device)
    return lt_errorf("%s: %s on %s has its storage on %s", op, what, lt_device_str(dev, t->device),
                     lt_device_str(sdev, t->storage->device));
  return 0;
}

int lt_optim_check_build(const char *op, int device) { return lt_backend_for(op, device) ? 0 : -1; }

void lt_optim_for_chunks(int64_t chunks, int64_t elements, void (*fn)(void *ctx, int64_t c), void *ctx) {
  if (elements >= 2 * LT_PAR_GRAIN) { /* no omp construct for small work: see ew_execute */
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < chunks; c++) fn(ctx, c);
  } else {
    for (int64_t c = 0; c < chunks; c++) fn(ctx, c);
  }
}

int64_t lt_optim_number_chunks(lt_optim_entry *entries, int64_t n) {
  int64_t chunks = 0;
  for (int64_t i = 0; i < n; i++) {
    entries[i].first_chunk = chunks;
    chunks += (entries[i].n + LT_OPTIM_CHUNK - 1) / LT_OPTIM_CHUNK;
  }
  return chunks;
}

/* ---- the tensors of a reduction or a scale --------------------------------------------- */

/* Checks tensors[0..n) (float dtypes, one device) and makes each contiguous (held[i]: a view, or
 * a copy that lt_finish_inplace writes back when write_back); fills entries. *device gets theirs. */
static int gather(const char *op, int64_t n, const lt_tensor *const *tensors, lt_tensor **held, lt_optim_entry *entries,
                  bool write_back, int *device) {
  char name[48], d[LT_DESC_STR];
  for (int64_t i = 0; i < n; i++) {
    const lt_tensor *t = tensors[i];
    LT_TRY(lt_check_defined(op, lt_optim_name(name, sizeof name, "tensors", i, false), t));
    if (i == 0) *device = t->device;
    if (t->device != *device)
      return lt_errorf("%s: %s is %s, expected it on %s as tensors[0]", op, name, lt_desc(d, t),
                       lt_device_str((char[16]){0}, *device));
    if (!lt_dtype_is_float(t->dtype))
      return lt_errorf("%s: %s is %s, expected f32, f64, bf16 or f16", op, name, lt_desc(d, t));
  }
  LT_TRY(lt_optim_check_build(op, *device));
  for (int64_t i = 0; i < n; i++)
    LT_TRY(lt_optim_check_storage(op, lt_optim_name(name, sizeof name, "tensors", i, false), tensors[i]));
  for (int64_t i = 0; i < n; i++) {
    held[i] = write_back ? lt_begin_inplace((lt_tensor *)tensors[i]) : lt_tensor_new();
    if (!held[i] || (!write_back && lt_contiguous(held[i], tensors[i]))) return -1;
    entries[i] = (lt_optim_entry){.param = lt_data_ptr(held[i]), .n = lt_numel(held[i]), .pdtype = held[i]->dtype};
  }
  return 0;
}

/* A one-element f32/f64 tensor on device: out itself, allocated 0-dim f32 when undefined. */
static int check_scalar_out(const char *op, const char *what, lt_tensor *out, int device) {
  char d[LT_DESC_STR];
  if (!out) return lt_errorf("%s: %s is NULL", op, what);
  if (!lt_is_defined(out)) return lt_empty(out, 0, NULL, LT_F32, device);
  if (lt_numel(out) != 1 || (out->dtype != LT_F32 && out->dtype != LT_F64) || out->device != device)
    return lt_errorf("%s: %s is %s, expected one f32 or f64 element on %s", op, what, lt_desc(d, out),
                     lt_device_str((char[16]){0}, device));
  return lt_optim_check_storage(op, what, out);
}

/* ---- sum of squares ------------------------------------------------------------------------ */

typedef struct sumsq_job {
  const lt_optim_entry *entries;
  int64_t n;
  double *partial; /* one sum per chunk */
} sumsq_job;

static void sumsq_chunk(void *ctx, int64_t c) {
  const sumsq_job *j = ctx;
  const lt_optim_entry *e = &j->entries[lt_optim_entry_of(j->entries, j->n, c)];
  int64_t i0 = (c - e->first_chunk) * LT_OPTIM_CHUNK, len = e->n - i0 < LT_OPTIM_CHUNK ? e->n - i0 : LT_OPTIM_CHUNK;
  double acc = 0;
  if (e->pdtype == LT_F32) {
    const float *x = (const float *)e->param + i0;
#pragma omp simd reduction(+ : acc)
    for (int64_t i = 0; i < len; i++) acc += (double)x[i] * (double)x[i];
  } else if (e->pdtype == LT_F64) {
    const double *x = (const double *)e->param + i0;
#pragma omp simd reduction(+ : acc)
    for (int64_t i = 0; i < len; i++) acc += x[i] * x[i];
  } else {
    const uint16_t *x = (const uint16_t *)e->param + i0;
    bool bf16 = e->pdtype == LT_BF16;
    for (int64_t i = 0; i < len; i++) {
      double xi = bf16 ? lt_bf16_to_f32(x[i]) : lt_f16_to_f32(x[i]);
      acc += xi * xi;
    }
  }
  j->partial[c] = acc;
}

int lt_multi_tensor_sumsq(lt_tensor *out, int64_t n, lt_tensor *const *tensors) {
  const char *op = "multi_tensor_sumsq";
  if (n < 0) return lt_errorf("%s: n must be >= 0, got %lld", op, (long long)n);
  if (n > 0 && !tensors) return lt_errorf("%s: tensors is NULL for n = %lld", op, (long long)n);
  int device = out && lt_is_defined(out) ? out->device : LT_DEVICE_CPU, rc = -1;
  lt_tensor **held = calloc((size_t)n + 1, sizeof *held);
  lt_optim_entry *entries = calloc((size_t)n + 1, sizeof *entries);
  double *partial = NULL;
  if (!held || !entries) {
    rc = lt_errorf("%s: out of memory for %lld tensors", op, (long long)n);
    goto done;
  }
  if (gather(op, n, (const lt_tensor *const *)tensors, held, entries, false, &device) ||
      lt_optim_check_build(op, device) || check_scalar_out(op, "out", out, device))
    goto done;
  int64_t chunks = lt_optim_number_chunks(entries, n), elements = 0;
  for (int64_t i = 0; i < n; i++) elements += entries[i].n;
  if (device != LT_DEVICE_CPU) {
    rc = lt_backend_for(op, device)->sumsq_multi(device, entries, n, chunks, lt_data_ptr(out), out->dtype);
    goto done;
  }
  partial = malloc((size_t)(chunks + 1) * sizeof *partial);
  if (!partial) {
    rc = lt_errorf("%s: out of memory for %lld partial sums", op, (long long)chunks);
    goto done;
  }
  sumsq_job job = {entries, n, partial};
  lt_optim_for_chunks(chunks, elements, sumsq_chunk, &job);
  double total = 0;
  for (int64_t c = 0; c < chunks; c++) total += partial[c];
  lt_store_f64(lt_data_ptr(out), out->dtype, 0, total);
  rc = 0;
done:
  for (int64_t i = 0; held && i < n; i++) lt_release(held[i]);
  free(held);
  free(entries);
  free(partial);
  return rc;
}

/* ---- scale ------------------------------------------------------------------------------------ */

typedef struct scale_job {
  const lt_optim_entry *entries;
  int64_t n;
  double s;
} scale_job;

/* As lt_binary_scalar's mul: the scalar in f32 for f32/bf16/f16 (computed in f32, rounded
 * once), in f64 for f64. */
static void scale_chunk(void *ctx, int64_t c) {
  const scale_job *j = ctx;
  const lt_optim_entry *e = &j->entries[lt_optim_entry_of(j->entries, j->n, c)];
  int64_t i0 = (c - e->first_chunk) * LT_OPTIM_CHUNK, len = e->n - i0 < LT_OPTIM_CHUNK ? e->n - i0 : LT_OPTIM_CHUNK;
  const float sf = (float)j->s;
  if (e->pdtype == LT_F32) {
    float *x = (float *)e->param + i0;
#pragma omp simd
    for (int64_t i = 0; i < len; i++) x[i] = x[i] * sf;
  } else if (e->pdtype == LT_F64) {
    double *x = (double *)e->param + i0, s = j->s;
#pragma omp simd
    for (int64_t i = 0; i < len; i++) x[i] = x[i] * s;
  } else if (e->pdtype == LT_BF16) {
    uint16_t *x = (uint16_t *)e->param + i0;
    for (int64_t i = 0; i < len; i++) x[i] = lt_f32_to_bf16(lt_bf16_to_f32(x[i]) * sf);
  } else {
    uint16_t *x = (uint16_t *)e->param + i0;
    for (int64_t i = 0; i < len; i++) x[i] = lt_f32_to_f16(lt_f16_to_f32(x[i]) * sf);
  }
}

int lt_multi_tensor_scale(int64_t n, lt_tensor *const *tensors, const lt_tensor *scale) {
  const char *op = "multi_tensor_scale";
  char d[LT_DESC_STR];
  if (n < 0) return lt_errorf("%s: n must be >= 0, got %lld", op, (long long)n);
  if (n > 0 && !tensors) return lt_errorf("%s: tensors is NULL for n = %lld", op, (long long)n);
  LT_TRY(lt_check_defined(op, "scale", scale));
  int device = scale->device, rc = -1;
  if (lt_numel(scale) != 1 || (scale->dtype != LT_F32 && scale->dtype != LT_F64))
    return lt_errorf("%s: scale is %s, expected one f32 or f64 element", op, lt_desc(d, scale));
  lt_tensor **held = calloc((size_t)n + 1, sizeof *held);
  lt_optim_entry *entries = calloc((size_t)n + 1, sizeof *entries);
  if (!held || !entries) {
    rc = lt_errorf("%s: out of memory for %lld tensors", op, (long long)n);
    goto done;
  }
  if (gather(op, n, (const lt_tensor *const *)tensors, held, entries, true, &device) ||
      lt_optim_check_build(op, device))
    goto done;
  if (device != scale->device) {
    rc = lt_errorf("%s: scale is %s, expected it on %s as the tensors", op, lt_desc(d, scale),
                   lt_device_str((char[16]){0}, device));
    goto done;
  }
  if (lt_optim_check_storage(op, "scale", scale)) goto done;
  int64_t chunks = lt_optim_number_chunks(entries, n), elements = 0;
  for (int64_t i = 0; i < n; i++) elements += entries[i].n;
  if (device != LT_DEVICE_CPU) {
    const lt_backend *be = lt_backend_for(op, device);
    rc = !be ? -1 : chunks > 0 ? be->scale_multi(device, entries, n, chunks, lt_data_ptr(scale), scale->dtype) : 0;
    goto done;
  }
  scale_job job = {entries, n, lt_load_f64(lt_data_ptr(scale), scale->dtype, 0)};
  lt_optim_for_chunks(chunks, elements, scale_chunk, &job);
  rc = 0;
done:
  for (int64_t i = 0; held && i < n; i++) rc = lt_finish_inplace(tensors[i], held[i], rc);
  free(held);
  free(entries);
  return rc;
}

/* ---- clipping's coefficient ---------------------------------------------------------------- */

int lt_clip_coef(lt_tensor *coef, const lt_tensor *sumsq, double max_norm) {
  const char *op = "clip_coef";
  char d[LT_DESC_STR];
  LT_TRY(lt_check_defined(op, "sumsq", sumsq));
  if (lt_numel(sumsq) != 1 || (sumsq->dtype != LT_F32 && sumsq->dtype != LT_F64))
    return lt_errorf("%s: sumsq is %s, expected one f32 or f64 element", op, lt_desc(d, sumsq));
  LT_TRY(lt_optim_check_storage(op, "sumsq", sumsq));
  if (!(max_norm >= 0)) return lt_errorf("%s: max_norm must be >= 0, got %g", op, max_norm);
  LT_TRY(lt_optim_check_build(op, sumsq->device));
  LT_TRY(check_scalar_out(op, "coef", coef, sumsq->device));
  if (sumsq->device != LT_DEVICE_CPU) {
    const lt_backend *be = lt_backend_for(op, sumsq->device);
    if (!be) return -1;
    return be->clip_coef(sumsq->device, lt_data_ptr(coef), coef->dtype, lt_data_ptr(sumsq), sumsq->dtype, max_norm);
  }
  double value = lt_clip_coef_of(lt_load_f64(lt_data_ptr(sumsq), sumsq->dtype, 0), max_norm);
  lt_store_f64(lt_data_ptr(coef), coef->dtype, 0, value);
  return 0;
}
