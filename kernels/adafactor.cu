/* adafactor.cu — Adafactor on CUDA (host/ops/adafactor.c checks and calls it, and is the CPU
 * twin). Bitwise equal to the CPU: every elementwise operation is an explicitly rounded intrinsic
 * (rn_add, rn_mul, ... below), which nvcc never contracts into an fma, and every sum runs in the
 * order of kernels/adafactor.h (a row, a column, a run of LT_ADAFACTOR_RUN elements: one thread
 * each, in index order; the run sums added by one thread in run order). The scalars that depend
 * on a sum (the lr from the param's rms, the clipping divisor) stay on the device: nothing waits
 * for the host. */
#include "kernels/multi_tensor.cuh"
extern "C" {
#include "kernels/adafactor.h"
}

/* The device scalars of one step. */
struct adafactor_scalars {
  double lr, clip_div; /* values of the compute dtype */
};

/* Element i of the update before clipping, as adafactor.c's unscaled_. */
template <typename T>
static __device__ __forceinline__ T unscaled(const lt_adafactor_args &a, const T *rmean, int64_t i) {
  const T *g = (const T *)a.grad;
  if (!a.factored) return rn_mul(rn_div((T)1, rn_sqrt(((const T *)a.v)[i])), g[i]);
  int64_t len = a.n / a.batches, b = i / len, k = i % len;
  T rf = rn_div((T)1, rn_sqrt(rn_div(((const T *)a.row)[b * a.rows + k / a.cols], rmean[b])));
  T cf = rn_div((T)1, rn_sqrt(((const T *)a.col)[b * a.cols + k % a.cols]));
  return rn_mul(rn_mul(rf, cf), g[i]);
}

/* The sum of squares of run k of param (update false) or of the update (true). */
template <typename T> static __device__ double run_sumsq(const lt_adafactor_args &a, const T *rmean, bool update, int64_t k) {
  int64_t r0 = k * LT_ADAFACTOR_RUN, end = a.n - r0 < LT_ADAFACTOR_RUN ? a.n : r0 + LT_ADAFACTOR_RUN;
  double run = 0;
  for (int64_t i = r0; i < end; i++) {
    T u = update ? unscaled<T>(a, rmean, i) : ((const T *)a.param)[i];
    run = __dadd_rn(run, __dmul_rn((double)u, (double)u));
  }
  return run;
}
template <typename T>
__global__ void run_sumsq_kernel(lt_adafactor_args a, const T *rmean, bool update, double *partial, int64_t runs) {
  int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (k < runs) partial[k] = run_sumsq<T>(a, rmean, update, k);
}

/* The lr (after the param's sums, update false) or the clipping divisor (true) from the runs. */
template <typename T>
static __device__ void set_scalars(const lt_adafactor_args &a, const double *partial, int64_t runs, bool update,
                                   adafactor_scalars *s) {
  double total = 0;
  for (int64_t k = 0; k < runs; k++) total = __dadd_rn(total, partial[k]);
  T rms = rn_div((T)__dsqrt_rn(total), (T)__dsqrt_rn((double)a.n));
  if (!update) {
    s->lr = a.scale_parameter ? rn_mul(rms > (T)a.eps2 ? rms : (T)a.eps2, (T)a.rel_lr) : (T)a.rel_lr;
  } else {
    T r = rn_div(rms, (T)a.clip);
    s->clip_div = r > (T)1 ? r : (T)1;
  }
}
template <typename T>
__global__ void scalars_kernel(lt_adafactor_args a, const double *partial, int64_t runs, bool update,
                               adafactor_scalars *s) {
  set_scalars<T>(a, partial, runs, update, s);
}

/* The second moment: a thread per row, per column, per batch's row mean (factored), or per element. */
template <typename T> static __device__ void row_moment(const lt_adafactor_args &a, int64_t br) {
  const T *gr = (const T *)a.grad + br * a.cols;
  T eps1 = (T)a.eps1, b2 = (T)a.beta2t, c2 = (T)(1.0 - a.beta2t), *row = (T *)a.row;
  double rs = 0;
  for (int64_t c = 0; c < a.cols; c++) rs = __dadd_rn(rs, (double)rn_add(rn_mul(gr[c], gr[c]), eps1));
  row[br] = rn_add(rn_mul(row[br], b2), rn_mul(c2, (T)__ddiv_rn(rs, (double)a.cols)));
}
template <typename T> __global__ void rows_kernel(lt_adafactor_args a) {
  int64_t br = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (br < a.batches * a.rows) row_moment<T>(a, br);
}
template <typename T> static __device__ void col_moment(const lt_adafactor_args &a, int64_t bc) {
  const T *gc = (const T *)a.grad + (bc / a.cols) * a.rows * a.cols + bc % a.cols;
  T eps1 = (T)a.eps1, b2 = (T)a.beta2t, c2 = (T)(1.0 - a.beta2t), *col = (T *)a.col;
  double cs = 0;
  for (int64_t r = 0; r < a.rows; r++) cs = __dadd_rn(cs, (double)rn_add(rn_mul(gc[r * a.cols], gc[r * a.cols]), eps1));
  col[bc] = rn_add(rn_mul(col[bc], b2), rn_mul(c2, (T)__ddiv_rn(cs, (double)a.rows)));
}
template <typename T> __global__ void cols_kernel(lt_adafactor_args a) {
  int64_t bc = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (bc < a.batches * a.cols) col_moment<T>(a, bc);
}
template <typename T> static __device__ void row_mean(const lt_adafactor_args &a, T *rmean, int64_t b) {
  double rs = 0;
  for (int64_t r = 0; r < a.rows; r++) rs = __dadd_rn(rs, (double)((const T *)a.row)[b * a.rows + r]);
  rmean[b] = (T)__ddiv_rn(rs, (double)a.rows);
}
template <typename T> __global__ void row_mean_kernel(lt_adafactor_args a, T *rmean) {
  int64_t b = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (b < a.batches) row_mean<T>(a, rmean, b);
}
template <typename T> static __device__ __forceinline__ void v_moment(const lt_adafactor_args &a, int64_t i) {
  T eps1 = (T)a.eps1, b2 = (T)a.beta2t, c2 = (T)(1.0 - a.beta2t), *v = (T *)a.v;
  const T *g = (const T *)a.grad;
  v[i] = rn_add(rn_mul(v[i], b2), rn_mul(c2, rn_add(rn_mul(g[i], g[i]), eps1)));
}
template <typename T> __global__ void v_kernel(lt_adafactor_args a) {
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < a.n; i += stride) v_moment<T>(a, i);
}

/* The step of element i: the update clipped, scaled, averaged (beta1), weight decay, param -= update. */
template <typename T>
static __device__ __forceinline__ void step_at(const lt_adafactor_args &a, const T *rmean, const adafactor_scalars &s,
                                               int64_t i) {
  T lr = (T)s.lr, clip_div = (T)s.clip_div, neg_decay = rn_mul((T)(-a.weight_decay), lr);
  T b1 = (T)a.beta1, c1 = (T)(1.0 - a.beta1), *p = (T *)a.param, *m = (T *)a.m;
  T u = rn_mul(rn_div(unscaled<T>(a, rmean, i), clip_div), lr);
  if (a.first_moment) {
    u = rn_add(rn_mul(m[i], b1), rn_mul(c1, u));
    m[i] = u;
  }
  T pi = p[i];
  if (a.weight_decay != 0) pi = rn_add(pi, rn_mul(neg_decay, pi));
  p[i] = rn_sub(pi, u);
}
template <typename T> __global__ void step_kernel(lt_adafactor_args a, const T *rmean, const adafactor_scalars *s) {
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < a.n; i += stride) step_at<T>(a, rmean, *s, i);
}

static unsigned blocks_for(int64_t threads) { return (unsigned)((threads + LT_CUDA_THREADS - 1) / LT_CUDA_THREADS); }

template <typename T> static int launch(int device, const lt_adafactor_args *a, void *scratch, int64_t runs) {
  cudaStream_t stream = lt_cuda_compute_stream(device);
  adafactor_scalars *s = (adafactor_scalars *)scratch;
  double *partial = (double *)(s + 1);
  T *rmean = (T *)(partial + runs);
  const lt_adafactor_args k = *a;
  unsigned grid = lt_cuda_blocks(device, a->n);
  run_sumsq_kernel<T><<<blocks_for(runs), LT_CUDA_THREADS, 0, stream>>>(k, rmean, false, partial, runs);
  scalars_kernel<T><<<1, 1, 0, stream>>>(k, partial, runs, false, s);
  if (a->factored) {
    rows_kernel<T><<<blocks_for(a->batches * a->rows), LT_CUDA_THREADS, 0, stream>>>(k);
    cols_kernel<T><<<blocks_for(a->batches * a->cols), LT_CUDA_THREADS, 0, stream>>>(k);
    row_mean_kernel<T><<<blocks_for(a->batches), LT_CUDA_THREADS, 0, stream>>>(k, rmean);
  } else {
    v_kernel<T><<<grid, LT_CUDA_THREADS, 0, stream>>>(k);
  }
  run_sumsq_kernel<T><<<blocks_for(runs), LT_CUDA_THREADS, 0, stream>>>(k, rmean, true, partial, runs);
  scalars_kernel<T><<<1, 1, 0, stream>>>(k, partial, runs, true, s);
  step_kernel<T><<<grid, LT_CUDA_THREADS, 0, stream>>>(k, rmean, s);
  return lt_cuda_check_launch("adafactor", device);
}

int lt_cuda_adafactor(int device, const lt_adafactor_args *a) {
  const char *op = "adafactor";
  if (a->n <= 0) return 0;
  LT_TRY(lt_cuda_use_device(op, device));
  int64_t runs = (a->n + LT_ADAFACTOR_RUN - 1) / LT_ADAFACTOR_RUN;
  int64_t bytes = (int64_t)sizeof(adafactor_scalars) + runs * (int64_t)sizeof(double) +
                  (a->batches > 0 ? a->batches : 1) * (int64_t)sizeof(double);
  void *scratch = NULL;
  LT_TRY(lt_cuda_alloc_stream(device, bytes, (void *)lt_cuda_compute_stream(device), &scratch));
  int rc = a->dtype == LT_F64 ? launch<double>(device, a, scratch, runs) : launch<float>(device, a, scratch, runs);
  lt_cuda_free(device, scratch);
  return rc;
}

/* ---- many tensors: the same passes, each one launch over a table of entries ----
 * Every pass numbers its work across the tensors (chunks, the norms' runs by chunk, rows,
 * columns, batches: lt_adafactor_entry) and finds a unit's tensor by binary search; a tensor's
 * runs are added in the order lt_cuda_adafactor adds them. A tensor's row means live at its
 * first batch's 8-byte slot of rmeans, as an array of its dtype. */

enum which_first { FIRST_CHUNK, FIRST_ROW, FIRST_COL, FIRST_BATCH };

static __device__ __forceinline__ int64_t first_of(const lt_adafactor_entry &e, int which) {
  return which == FIRST_CHUNK ? e.first_chunk : which == FIRST_ROW ? e.first_row : which == FIRST_COL ? e.first_col
                                                                                                      : e.first_batch;
}
/* The last entry whose numbering of `which` starts at or before x (entries without such units
 * start where the next one does, so the search passes over them). */
static __device__ int64_t entry_at(const lt_adafactor_entry *t, int64_t n, int64_t x, int which) {
  int64_t lo = 0, hi = n;
  while (hi - lo > 1) {
    int64_t mid = lo + (hi - lo) / 2;
    if (first_of(t[mid], which) <= x)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}
template <typename T> static __device__ __forceinline__ T *rmean_of(double *rmeans, const lt_adafactor_entry &e) {
  return (T *)(rmeans + e.first_batch);
}

/* Slot s: run s - first_chunk * LT_ADAFACTOR_RUNS_PER_CHUNK of its tensor, if it has that run. */
__global__ void multi_sumsq_kernel(const lt_adafactor_entry *t, int64_t n, int64_t slots, double *rmeans, bool update,
                                   double *partial) {
  int64_t s = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (s >= slots) return;
  const lt_adafactor_entry &e = t[entry_at(t, n, s / LT_ADAFACTOR_RUNS_PER_CHUNK, FIRST_CHUNK)];
  int64_t k = s - e.first_chunk * LT_ADAFACTOR_RUNS_PER_CHUNK;
  if (k * LT_ADAFACTOR_RUN >= e.a.n) return;
  partial[s] = e.a.dtype == LT_F64 ? run_sumsq<double>(e.a, rmean_of<double>(rmeans, e), update, k)
                                   : run_sumsq<float>(e.a, rmean_of<float>(rmeans, e), update, k);
}
__global__ void multi_scalars_kernel(const lt_adafactor_entry *t, int64_t n, const double *partial, bool update,
                                     adafactor_scalars *s) {
  int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= n || t[j].a.n == 0) return;
  const lt_adafactor_entry &e = t[j];
  int64_t runs = (e.a.n + LT_ADAFACTOR_RUN - 1) / LT_ADAFACTOR_RUN;
  const double *own = partial + e.first_chunk * LT_ADAFACTOR_RUNS_PER_CHUNK;
  if (e.a.dtype == LT_F64)
    set_scalars<double>(e.a, own, runs, update, &s[j]);
  else
    set_scalars<float>(e.a, own, runs, update, &s[j]);
}
__global__ void multi_rows_kernel(const lt_adafactor_entry *t, int64_t n, int64_t rows) {
  int64_t x = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (x >= rows) return;
  const lt_adafactor_entry &e = t[entry_at(t, n, x, FIRST_ROW)];
  if (e.a.dtype == LT_F64)
    row_moment<double>(e.a, x - e.first_row);
  else
    row_moment<float>(e.a, x - e.first_row);
}
__global__ void multi_cols_kernel(const lt_adafactor_entry *t, int64_t n, int64_t cols) {
  int64_t x = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (x >= cols) return;
  const lt_adafactor_entry &e = t[entry_at(t, n, x, FIRST_COL)];
  if (e.a.dtype == LT_F64)
    col_moment<double>(e.a, x - e.first_col);
  else
    col_moment<float>(e.a, x - e.first_col);
}
__global__ void multi_row_mean_kernel(const lt_adafactor_entry *t, int64_t n, int64_t batches, double *rmeans) {
  int64_t x = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (x >= batches) return;
  const lt_adafactor_entry &e = t[entry_at(t, n, x, FIRST_BATCH)];
  if (e.a.dtype == LT_F64)
    row_mean<double>(e.a, rmean_of<double>(rmeans, e), x - e.first_batch);
  else
    row_mean<float>(e.a, rmean_of<float>(rmeans, e), x - e.first_batch);
}
/* A block per chunk: the second moment of a 1-d tensor (update false), or the step (true). */
__global__ void multi_chunks_kernel(const lt_adafactor_entry *t, int64_t n, int64_t chunks, double *rmeans, bool step,
                                    const adafactor_scalars *s) {
  for (int64_t c = blockIdx.x; c < chunks; c += gridDim.x) {
    int64_t j = entry_at(t, n, c, FIRST_CHUNK);
    const lt_adafactor_entry &e = t[j];
    if (!step && e.a.factored) continue;
    int64_t i0 = (c - e.first_chunk) * LT_OPTIM_CHUNK, end = e.a.n - i0 < LT_OPTIM_CHUNK ? e.a.n : i0 + LT_OPTIM_CHUNK;
    for (int64_t i = i0 + threadIdx.x; i < end; i += blockDim.x) {
      if (e.a.dtype == LT_F64)
        step ? step_at<double>(e.a, rmean_of<double>(rmeans, e), s[j], i) : v_moment<double>(e.a, i);
      else
        step ? step_at<float>(e.a, rmean_of<float>(rmeans, e), s[j], i) : v_moment<float>(e.a, i);
    }
  }
}

int lt_cuda_adafactor_multi(int device, const lt_adafactor_entry *entries, int64_t n, const lt_adafactor_counts *c) {
  const char *op = "adafactor_multi";
  if (c->chunks <= 0) return 0;
  LT_TRY(lt_cuda_use_device(op, device));
  cudaStream_t stream = lt_cuda_compute_stream(device);
  int64_t slots = c->chunks * LT_ADAFACTOR_RUNS_PER_CHUNK;
  int64_t bytes = n * (int64_t)sizeof(adafactor_scalars) + (slots + (c->batches > 0 ? c->batches : 1)) * 8;
  void *table = NULL, *scratch = NULL;
  LT_TRY(lt_cuda_upload_entries(op, device, stream, entries, n * (int64_t)sizeof *entries, &table));
  if (lt_cuda_alloc_stream(device, bytes, (void *)stream, &scratch) != 0) {
    lt_cuda_free(device, table);
    return -1;
  }
  const lt_adafactor_entry *t = (const lt_adafactor_entry *)table;
  adafactor_scalars *s = (adafactor_scalars *)scratch;
  double *partial = (double *)(s + n), *rmeans = partial + slots;
  unsigned chunk_grid = chunk_blocks(c->chunks);
  multi_sumsq_kernel<<<blocks_for(slots), LT_CUDA_THREADS, 0, stream>>>(t, n, slots, rmeans, false, partial);
  multi_scalars_kernel<<<blocks_for(n), LT_CUDA_THREADS, 0, stream>>>(t, n, partial, false, s);
  if (c->rows > 0) multi_rows_kernel<<<blocks_for(c->rows), LT_CUDA_THREADS, 0, stream>>>(t, n, c->rows);
  if (c->cols > 0) multi_cols_kernel<<<blocks_for(c->cols), LT_CUDA_THREADS, 0, stream>>>(t, n, c->cols);
  if (c->batches > 0)
    multi_row_mean_kernel<<<blocks_for(c->batches), LT_CUDA_THREADS, 0, stream>>>(t, n, c->batches, rmeans);
  multi_chunks_kernel<<<chunk_grid, LT_CUDA_THREADS, 0, stream>>>(t, n, c->chunks, rmeans, false, s);
  multi_sumsq_kernel<<<blocks_for(slots), LT_CUDA_THREADS, 0, stream>>>(t, n, slots, rmeans, true, partial);
  multi_scalars_kernel<<<blocks_for(n), LT_CUDA_THREADS, 0, stream>>>(t, n, partial, true, s);
  multi_chunks_kernel<<<chunk_grid, LT_CUDA_THREADS, 0, stream>>>(t, n, c->chunks, rmeans, true, s);
  int rc = lt_cuda_check_launch(op, device);
  lt_cuda_free(device, scratch); /* stream-ordered: reused only by work queued after the kernels */
  lt_cuda_free(device, table);
  return rc;
}
