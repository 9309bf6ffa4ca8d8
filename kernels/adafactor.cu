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

/* partial[k] = the sum of squares of run k of param (update false) or of the update (true). */
template <typename T>
__global__ void run_sumsq_kernel(lt_adafactor_args a, const T *rmean, bool update, double *partial, int64_t runs) {
  int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (k >= runs) return;
  int64_t r0 = k * LT_ADAFACTOR_RUN, end = a.n - r0 < LT_ADAFACTOR_RUN ? a.n : r0 + LT_ADAFACTOR_RUN;
  double run = 0;
  for (int64_t i = r0; i < end; i++) {
    T u = update ? unscaled<T>(a, rmean, i) : ((const T *)a.param)[i];
    run = __dadd_rn(run, __dmul_rn((double)u, (double)u));
  }
  partial[k] = run;
}

/* One thread: the lr (after the param's sums, update false) or the clipping divisor (true). */
template <typename T>
__global__ void scalars_kernel(lt_adafactor_args a, const double *partial, int64_t runs, bool update,
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

/* The second moment: a thread per row, per column, per batch's row mean (factored), or per element. */
template <typename T> __global__ void rows_kernel(lt_adafactor_args a) {
  int64_t br = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (br >= a.batches * a.rows) return;
  const T *gr = (const T *)a.grad + br * a.cols;
  T eps1 = (T)a.eps1, b2 = (T)a.beta2t, c2 = (T)(1.0 - a.beta2t), *row = (T *)a.row;
  double rs = 0;
  for (int64_t c = 0; c < a.cols; c++) rs = __dadd_rn(rs, (double)rn_add(rn_mul(gr[c], gr[c]), eps1));
  row[br] = rn_add(rn_mul(row[br], b2), rn_mul(c2, (T)__ddiv_rn(rs, (double)a.cols)));
}
template <typename T> __global__ void cols_kernel(lt_adafactor_args a) {
  int64_t bc = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (bc >= a.batches * a.cols) return;
  const T *gc = (const T *)a.grad + (bc / a.cols) * a.rows * a.cols + bc % a.cols;
  T eps1 = (T)a.eps1, b2 = (T)a.beta2t, c2 = (T)(1.0 - a.beta2t), *col = (T *)a.col;
  double cs = 0;
  for (int64_t r = 0; r < a.rows; r++) cs = __dadd_rn(cs, (double)rn_add(rn_mul(gc[r * a.cols], gc[r * a.cols]), eps1));
  col[bc] = rn_add(rn_mul(col[bc], b2), rn_mul(c2, (T)__ddiv_rn(cs, (double)a.rows)));
}
template <typename T> __global__ void row_mean_kernel(lt_adafactor_args a, T *rmean) {
  int64_t b = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= a.batches) return;
  double rs = 0;
  for (int64_t r = 0; r < a.rows; r++) rs = __dadd_rn(rs, (double)((const T *)a.row)[b * a.rows + r]);
  rmean[b] = (T)__ddiv_rn(rs, (double)a.rows);
}
template <typename T> __global__ void v_kernel(lt_adafactor_args a) {
  T eps1 = (T)a.eps1, b2 = (T)a.beta2t, c2 = (T)(1.0 - a.beta2t), *v = (T *)a.v;
  const T *g = (const T *)a.grad;
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < a.n; i += stride)
    v[i] = rn_add(rn_mul(v[i], b2), rn_mul(c2, rn_add(rn_mul(g[i], g[i]), eps1)));
}

/* The step: the update clipped, scaled, averaged (beta1), weight decay, param -= update. */
template <typename T> __global__ void step_kernel(lt_adafactor_args a, const T *rmean, const adafactor_scalars *s) {
  T lr = (T)s->lr, clip_div = (T)s->clip_div, neg_decay = rn_mul((T)(-a.weight_decay), lr);
  T b1 = (T)a.beta1, c1 = (T)(1.0 - a.beta1), *p = (T *)a.param, *m = (T *)a.m;
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < a.n; i += stride) {
    T u = rn_mul(rn_div(unscaled<T>(a, rmean, i), clip_div), lr);
    if (a.first_moment) {
      u = rn_add(rn_mul(m[i], b1), rn_mul(c1, u));
      m[i] = u;
    }
    T pi = p[i];
    if (a.weight_decay != 0) pi = rn_add(pi, rn_mul(neg_decay, pi));
    p[i] = rn_sub(pi, u);
  }
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
