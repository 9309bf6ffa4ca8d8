/* lamb.cu — LAMB on CUDA (host/ops/lamb.c checks and calls it, and is the CPU twin). Bitwise
 * equal to the CPU: every elementwise operation is an explicitly rounded intrinsic, which nvcc
 * never contracts into an fma, and the norms are summed in the order of kernels/lamb.h (a run of
 * LT_LAMB_RUN elements per thread, in index order; the run sums added by one thread in run
 * order). The trust ratio stays on the device: nothing waits for the host. */
#include "kernels/multi_tensor.cuh"
extern "C" {
#include "kernels/lamb.h"
}

/* r = m / bc1 / (sqrt(v / bc2) + eps) + weight_decay * param, as lamb.c. */
template <typename T> static __device__ __forceinline__ T lamb_r(const lt_lamb_args &a, int64_t i) {
  const T *p = (const T *)a.param, *m = (const T *)a.m, *v = (const T *)a.v;
  T den = rn_add(rn_sqrt(rn_div(v[i], (T)a.bc2)), (T)a.eps);
  return rn_add(rn_div(rn_div(m[i], (T)a.bc1), den), rn_mul((T)a.weight_decay, p[i]));
}

template <typename T> __global__ void moments_kernel(lt_lamb_args a) {
  T b1 = (T)a.beta1, c1 = (T)(1.0 - a.beta1), b2 = (T)a.beta2, c2 = (T)(1.0 - a.beta2);
  T *m = (T *)a.m, *v = (T *)a.v;
  const T *g = (const T *)a.grad;
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < a.n; i += stride) {
    m[i] = rn_add(rn_mul(m[i], b1), rn_mul(c1, g[i]));
    v[i] = rn_add(rn_mul(v[i], b2), rn_mul(rn_mul(c2, g[i]), g[i]));
  }
}

/* partial[2k], partial[2k + 1]: run k's sums of param^2 and r^2. */
template <typename T> __global__ void norms_kernel(lt_lamb_args a, double *partial, int64_t runs) {
  int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (k >= runs) return;
  int64_t r0 = k * LT_LAMB_RUN, end = a.n - r0 < LT_LAMB_RUN ? a.n : r0 + LT_LAMB_RUN;
  double w = 0, r = 0;
  for (int64_t i = r0; i < end; i++) {
    double pi = (double)((const T *)a.param)[i], ri = (double)lamb_r<T>(a, i);
    w = __dadd_rn(w, __dmul_rn(pi, pi));
    r = __dadd_rn(r, __dmul_rn(ri, ri));
  }
  partial[2 * k] = w, partial[2 * k + 1] = r;
}

/* One thread: step = lr * trust, trust = ||param|| / ||r|| or 1. */
template <typename T> __global__ void trust_kernel(lt_lamb_args a, const double *partial, int64_t runs, double *step) {
  double w = 0, r = 0;
  for (int64_t k = 0; k < runs; k++) w = __dadd_rn(w, partial[2 * k]), r = __dadd_rn(r, partial[2 * k + 1]);
  T wn = (T)__dsqrt_rn(w), rn = (T)__dsqrt_rn(r);
  T trust = wn > 0 && rn > 0 ? rn_div(wn, rn) : (T)1;
  *step = rn_mul((T)a.lr, trust);
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
