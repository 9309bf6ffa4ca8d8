/* lamb.cu — LAMB on CUDA (host/ops/lamb.c checks and calls it, and is the CPU twin). Bitwise
 * equal to the CPU: every elementwise operation is an explicitly rounded intrinsic, which nvcc
 * never contracts into an fma, and the norms are summed in the order of kernels/lamb.h (a run of
 * LT_LAMB_RUN elements per thread, in index order; the run sums added by one thread in run
 * order). The trust ratio stays on the device: nothing waits for the host. */
#include "kernels/multi_tensor.cuh"
extern "C" {
#include "kernels/lamb.h"
}

/* r = m / bc1 / (sqrt(v / bc2) + eps) + weight_decay * param, as lamb.c (a: the scalars). */
template <typename T>
static __device__ __forceinline__ T lamb_r_at(const T *p, const T *m, const T *v, const lt_lamb_args &a, int64_t i) {
  T den = rn_add(rn_sqrt(rn_div(v[i], (T)a.bc2)), (T)a.eps);
  return rn_add(rn_div(rn_div(m[i], (T)a.bc1), den), rn_mul((T)a.weight_decay, p[i]));
}
template <typename T> static __device__ __forceinline__ T lamb_r(const lt_lamb_args &a, int64_t i) {
  return lamb_r_at<T>((const T *)a.param, (const T *)a.m, (const T *)a.v, a, i);
}
template <typename T> static __device__ __forceinline__ void lamb_moments_at(T *m, T *v, const T *g, const lt_lamb_args &a,
                                                                             int64_t i) {
  T b1 = (T)a.beta1, c1 = (T)(1.0 - a.beta1), b2 = (T)a.beta2, c2 = (T)(1.0 - a.beta2);
  m[i] = rn_add(rn_mul(m[i], b1), rn_mul(c1, g[i]));
  v[i] = rn_add(rn_mul(v[i], b2), rn_mul(rn_mul(c2, g[i]), g[i]));
}
/* The sums of param^2 and r^2 over elements [r0, end), in index order, in double. */
template <typename T>
static __device__ __forceinline__ void lamb_run_sums(const T *p, const T *m, const T *v, const lt_lamb_args &a, int64_t r0,
                                                     int64_t end, double *w, double *r) {
  double ws = 0, rs = 0;
  for (int64_t i = r0; i < end; i++) {
    double pi = (double)p[i], ri = (double)lamb_r_at<T>(p, m, v, a, i);
    ws = __dadd_rn(ws, __dmul_rn(pi, pi));
    rs = __dadd_rn(rs, __dmul_rn(ri, ri));
  }
  *w = ws, *r = rs;
}
/* lr * trust from the total sums, rounded as the CPU rounds it, held in a double. */
template <typename T> static __device__ __forceinline__ double lamb_step_size(const lt_lamb_args &a, double w, double r) {
  T wn = (T)__dsqrt_rn(w), rn = (T)__dsqrt_rn(r);
  T trust = wn > 0 && rn > 0 ? rn_div(wn, rn) : (T)1;
  return (double)rn_mul((T)a.lr, trust);
}

template <typename T> __global__ void moments_kernel(lt_lamb_args a) {
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < a.n; i += stride)
    lamb_moments_at<T>((T *)a.m, (T *)a.v, (const T *)a.grad, a, i);
}

/* partial[2k], partial[2k + 1]: run k's sums of param^2 and r^2. */
template <typename T> __global__ void norms_kernel(lt_lamb_args a, double *partial, int64_t runs) {
  int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (k >= runs) return;
  int64_t r0 = k * LT_LAMB_RUN, end = a.n - r0 < LT_LAMB_RUN ? a.n : r0 + LT_LAMB_RUN;
  lamb_run_sums<T>((const T *)a.param, (const T *)a.m, (const T *)a.v, a, r0, end, &partial[2 * k], &partial[2 * k + 1]);
}

/* One thread: step = lr * trust, trust = ||param|| / ||r|| or 1. */
template <typename T> __global__ void trust_kernel(lt_lamb_args a, const double *partial, int64_t runs, double *step) {
  double w = 0, r = 0;
  for (int64_t k = 0; k < runs; k++) w = __dadd_rn(w, partial[2 * k]), r = __dadd_rn(r, partial[2 * k + 1]);
  *step = lamb_step_size<T>(a, w, r);
}

template <typename T> __global__ void step_kernel(lt_lamb_args a, const double *step) {
  T s = (T)*step, *p = (T *)a.param;
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < a.n; i += stride) {
    T r = lamb_r<T>(a, i);
    p[i] = rn_sub(p[i], rn_mul(s, r));
  }
}

template <typename T> static int launch(int device, const lt_lamb_args *a, double *scratch, int64_t runs) {
  cudaStream_t stream = lt_cuda_compute_stream(device);
  unsigned grid = lt_cuda_blocks(device, a->n), run_grid = (unsigned)((runs + LT_CUDA_THREADS - 1) / LT_CUDA_THREADS);
  const lt_lamb_args k = *a;
  moments_kernel<T><<<grid, LT_CUDA_THREADS, 0, stream>>>(k);
  norms_kernel<T><<<run_grid, LT_CUDA_THREADS, 0, stream>>>(k, scratch + 1, runs);
  trust_kernel<T><<<1, 1, 0, stream>>>(k, scratch + 1, runs, scratch);
  step_kernel<T><<<grid, LT_CUDA_THREADS, 0, stream>>>(k, scratch);
  return lt_cuda_check_launch("lamb", device);
}

int lt_cuda_lamb(int device, const lt_lamb_args *a) {
  const char *op = "lamb";
  if (a->n <= 0) return 0;
  LT_TRY(lt_cuda_use_device(op, device));
  int64_t runs = (a->n + LT_LAMB_RUN - 1) / LT_LAMB_RUN;
  void *scratch = NULL;
  LT_TRY(lt_cuda_alloc_stream(device, (1 + 2 * runs) * (int64_t)sizeof(double), (void *)lt_cuda_compute_stream(device),
                              &scratch));
  int rc = a->dtype == LT_F64 ? launch<double>(device, a, (double *)scratch, runs)
                              : launch<float>(device, a, (double *)scratch, runs);
  lt_cuda_free(device, scratch);
  return rc;
}

/* ---- many tensors: the same four passes, each one launch over a table of entries ----
 * The norms' runs are numbered by chunk (LT_LAMB_RUNS_PER_CHUNK per chunk; a tensor's runs are
 * the slots from its first chunk on, in order), so each tensor's run sums are added in the
 * order lt_cuda_lamb adds them. */

template <typename T> static __device__ void multi_moments_chunk(const lt_optim_entry &e, const lt_lamb_args &a, int64_t i0,
                                                                 int64_t end) {
  for (int64_t i = i0 + threadIdx.x; i < end; i += blockDim.x) lamb_moments_at<T>((T *)e.m, (T *)e.v, (const T *)e.grad, a, i);
}
__global__ void multi_moments_kernel(const lt_optim_entry *table, int64_t ntable, int64_t chunks, lt_lamb_args a) {
  for (int64_t c = blockIdx.x; c < chunks; c += gridDim.x) {
    lt_optim_entry e = table[lt_optim_entry_of(table, ntable, c)];
    int64_t i0 = (c - e.first_chunk) * LT_OPTIM_CHUNK, end = e.n - i0 < LT_OPTIM_CHUNK ? e.n : i0 + LT_OPTIM_CHUNK;
    if (e.pdtype == LT_F64)
      multi_moments_chunk<double>(e, a, i0, end);
    else
      multi_moments_chunk<float>(e, a, i0, end);
  }
}

/* Slot s (chunk s / LT_LAMB_RUNS_PER_CHUNK): the run sums of its run, if the tensor has it. */
__global__ void multi_norms_kernel(const lt_optim_entry *table, int64_t ntable, int64_t slots, lt_lamb_args a,
                                   double *partial) {
  int64_t s = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (s >= slots) return;
  int64_t c = s / LT_LAMB_RUNS_PER_CHUNK;
  lt_optim_entry e = table[lt_optim_entry_of(table, ntable, c)];
  int64_t r0 = (s - e.first_chunk * LT_LAMB_RUNS_PER_CHUNK) * LT_LAMB_RUN;
  if (r0 >= e.n) return;
  int64_t end = e.n - r0 < LT_LAMB_RUN ? e.n : r0 + LT_LAMB_RUN;
  if (e.pdtype == LT_F64)
    lamb_run_sums<double>((const double *)e.param, (const double *)e.m, (const double *)e.v, a, r0, end, &partial[2 * s],
                          &partial[2 * s + 1]);
  else
    lamb_run_sums<float>((const float *)e.param, (const float *)e.m, (const float *)e.v, a, r0, end, &partial[2 * s],
                         &partial[2 * s + 1]);
}

/* Thread j: tensor j's lr * trust, from its runs in order. */
__global__ void multi_trust_kernel(const lt_optim_entry *table, int64_t ntable, lt_lamb_args a, const double *partial,
                                   double *steps) {
  int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= ntable) return;
  lt_optim_entry e = table[j];
  int64_t runs = (e.n + LT_LAMB_RUN - 1) / LT_LAMB_RUN, s0 = e.first_chunk * LT_LAMB_RUNS_PER_CHUNK;
  double w = 0, r = 0;
  for (int64_t k = 0; k < runs; k++) w = __dadd_rn(w, partial[2 * (s0 + k)]), r = __dadd_rn(r, partial[2 * (s0 + k) + 1]);
  steps[j] = e.pdtype == LT_F64 ? lamb_step_size<double>(a, w, r) : lamb_step_size<float>(a, w, r);
}

template <typename T> static __device__ void multi_step_chunk(const lt_optim_entry &e, const lt_lamb_args &a, T s, int64_t i0,
                                                              int64_t end) {
  T *p = (T *)e.param;
  for (int64_t i = i0 + threadIdx.x; i < end; i += blockDim.x) {
    T r = lamb_r_at<T>(p, (const T *)e.m, (const T *)e.v, a, i);
    p[i] = rn_sub(p[i], rn_mul(s, r));
  }
}
__global__ void multi_step_kernel(const lt_optim_entry *table, int64_t ntable, int64_t chunks, lt_lamb_args a,
                                  const double *steps) {
  for (int64_t c = blockIdx.x; c < chunks; c += gridDim.x) {
    int64_t j = lt_optim_entry_of(table, ntable, c);
    lt_optim_entry e = table[j];
    int64_t i0 = (c - e.first_chunk) * LT_OPTIM_CHUNK, end = e.n - i0 < LT_OPTIM_CHUNK ? e.n : i0 + LT_OPTIM_CHUNK;
    if (e.pdtype == LT_F64)
      multi_step_chunk<double>(e, a, steps[j], i0, end);
    else
      multi_step_chunk<float>(e, a, (float)steps[j], i0, end);
  }
}

int lt_cuda_lamb_multi(int device, const lt_optim_entry *entries, int64_t n, int64_t chunks, const lt_lamb_args *a) {
  const char *op = "lamb_multi";
  if (chunks <= 0) return 0;
  LT_TRY(lt_cuda_use_device(op, device));
  cudaStream_t stream = lt_cuda_compute_stream(device);
  int64_t slots = chunks * LT_LAMB_RUNS_PER_CHUNK;
  void *table = NULL, *scratch = NULL;
  LT_TRY(lt_cuda_upload_entries(op, device, stream, entries, n * (int64_t)sizeof *entries, &table));
  if (lt_cuda_alloc_stream(device, (2 * slots + n) * (int64_t)sizeof(double), (void *)stream, &scratch) != 0) {
    lt_cuda_free(device, table);
    return -1;
  }
  const lt_optim_entry *t = (const lt_optim_entry *)table;
  double *partial = (double *)scratch, *steps = partial + 2 * slots;
  const lt_lamb_args k = *a;
  unsigned slot_grid = (unsigned)((slots + LT_CUDA_THREADS - 1) / LT_CUDA_THREADS);
  unsigned entry_grid = (unsigned)((n + LT_CUDA_THREADS - 1) / LT_CUDA_THREADS);
  multi_moments_kernel<<<chunk_blocks(chunks), LT_CUDA_THREADS, 0, stream>>>(t, n, chunks, k);
  multi_norms_kernel<<<slot_grid, LT_CUDA_THREADS, 0, stream>>>(t, n, slots, k, partial);
  multi_trust_kernel<<<entry_grid, LT_CUDA_THREADS, 0, stream>>>(t, n, k, partial, steps);
  multi_step_kernel<<<chunk_blocks(chunks), LT_CUDA_THREADS, 0, stream>>>(t, n, chunks, k, steps);
  int rc = lt_cuda_check_launch(op, device);
  lt_cuda_free(device, scratch); /* stream-ordered: reused only by work queued after the kernels */
  lt_cuda_free(device, table);
  return rc;
}
