/* cross_entropy.cu — fused softmax cross-entropy on CUDA, forward and backward, and the index check
 * that cross-entropy and embedding share.
 *
 * One block per row of logits (N, V). Forward reads the row once with an online max/sum
 * (a running max m and the sum s of exp(x - m), rescaled when m grows; blocks merge the
 * per-thread pairs), then writes the loss lse - x[target] and lse. Backward writes
 * dlogits = dloss * (exp(x - lse) - onehot) straight from the logits and the saved lse.
 * Rows are read and written 128 bits at a time: a few scalar elements up to the first
 * 16-byte boundary of the row, vectors, then a scalar tail, so any V (50257, 7) vectorises.
 *
 * Semantics follow host/ops/cross_entropy.c: f32, bf16 and f16 compute in f32 with exp taken as 0
 * below -87 and for NaN (lt_exp_flush_f32's edges: NaN logits drop out of an f32 row), f64 in
 * f64 (a NaN logit makes the row's lse NaN); a row whose max is +-inf has lse = that max. The
 * exp is CUDA's expf/exp, and the sums run in another order, so values agree with the CPU
 * to a few ulps, not bitwise. */
#include "kernels/common.cuh"
#include <limits.h>
extern "C" {
#include "kernels/cross_entropy.h"
}

namespace {

/* ---- element helpers ------------------------------------------------------------------- */

template <typename T> using acc_t = lt_acc_t<T>;

/* exp with lt_exp_flush_f32's edges: x above 88 taken as 88, 0 below -87 and for NaN */
__host__ __device__ inline float ce_exp(float x) { return x >= -87.0f ? expf(x < 88.0f ? x : 88.0f) : 0.0f; }
__host__ __device__ inline double ce_exp(double x) { return exp(x); }

__host__ __device__ inline int64_t load_index(const void *p, int is64, int64_t k) {
  return is64 ? ((const int64_t *)p)[k] : (int64_t)((const int32_t *)p)[k];
}

/* Calls f(x) for this thread's share of row[0 .. V): scalars up to the first 16-byte
 * boundary, then 128-bit vectors, then a scalar tail. */
template <typename T, typename F> __device__ inline void for_row(const T *row, int64_t V, F &&f) {
  constexpr int N = 16 / sizeof(T);
  int64_t head = V;
  if ((uintptr_t)row % sizeof(T) == 0) head = (int64_t)(((16 - (uintptr_t)row % 16) % 16) / sizeof(T));
  if (head > V) head = V;
  for (int64_t j = threadIdx.x; j < head; j += blockDim.x) f(row[j]);
  int64_t nvec = (V - head) / N;
  const lt_dev_vec<T, N> *vec = reinterpret_cast<const lt_dev_vec<T, N> *>(row + head);
  for (int64_t k = threadIdx.x; k < nvec; k += blockDim.x) {
    lt_dev_vec<T, N> v = vec[k];
#pragma unroll
    for (int q = 0; q < N; q++) f(v.v[q]);
  }
  for (int64_t j = head + nvec * N + threadIdx.x; j < V; j += blockDim.x) f(row[j]);
}

/* out[j] = f(in[j], j) for this thread's share of a row; vectors when in and out share their
 * position within 16 bytes (then one head serves both), else scalars. out may be in. */
template <typename T, typename F> __device__ inline void map_row(T *out, const T *in, int64_t V, F &&f) {
  constexpr int N = 16 / sizeof(T);
  int64_t head = V;
  if ((uintptr_t)in % sizeof(T) == 0 && (uintptr_t)in % 16 == (uintptr_t)out % 16)
    head = (int64_t)(((16 - (uintptr_t)in % 16) % 16) / sizeof(T));
  if (head > V) head = V;
  for (int64_t j = threadIdx.x; j < head; j += blockDim.x) out[j] = f(in[j], j);
  int64_t nvec = (V - head) / N;
  const lt_dev_vec<T, N> *vin = reinterpret_cast<const lt_dev_vec<T, N> *>(in + head);
  lt_dev_vec<T, N> *vout = reinterpret_cast<lt_dev_vec<T, N> *>(out + head);
  for (int64_t k = threadIdx.x; k < nvec; k += blockDim.x) {
    lt_dev_vec<T, N> v = vin[k], r;
#pragma unroll
    for (int q = 0; q < N; q++) r.v[q] = f(v.v[q], head + k * N + q);
    vout[k] = r;
  }
  for (int64_t j = head + nvec * N + threadIdx.x; j < V; j += blockDim.x) out[j] = f(in[j], j);
}

/* ---- online log-sum-exp ---------------------------------------------------------------- */

/* The running max m (over values > -inf), the sum s of exp(x - m), and whether a NaN was seen. */
template <typename A> struct lse_state {
  A m = (A)-INFINITY, s = (A)0;
  int nan = 0;
  __host__ __device__ void add(A x) {
    if (!(x > (A)-INFINITY)) { /* -inf adds exactly 0; NaN only matters to f64 rows */
      nan |= x != x;
      return;
    }
    if (x > m) {
      s = s * ce_exp(m - x) + (A)1; /* m = -inf: exp gives 0, s becomes 1 */
      m = x;
    } else {
      s += ce_exp(x - m);
    }
  }
  __host__ __device__ void merge(A m2, A s2, int nan2) {
    nan |= nan2;
    if (m2 == (A)-INFINITY) return;
    if (m == (A)-INFINITY) {
      m = m2, s = s2;
    } else if (m2 > m) {
      s = s * ce_exp(m - m2) + s2;
      m = m2;
    } else {
      s += s2 * ce_exp(m2 - m);
    }
  }
  /* host/ops/cross_entropy.c's row_lse: an infinite max is the answer; f64 rows with a NaN are NaN */
  __host__ __device__ A result() const {
    if (isinf(m)) return m;
    if (std::is_same<A, double>::value && nan) return (A)NAN;
    return m + log(s);
  }
};

/* Row i's loss lse - x[target] (0 when ignored) and lse, stored as the CPU stores them: the
 * difference in double (of f32 values for f32 rows), then f32 or f64. */
template <typename T, typename A>
__host__ __device__ inline void ce_store_row(const T *row, int64_t i, A s, const void *targets, int t64,
                                             int64_t tstride, int64_t ignore_index, void *losses, int l64, void *lse,
                                             int s64) {
  int64_t t = load_index(targets, t64, i * tstride);
  double loss = t == ignore_index ? 0.0 : (double)s - (double)lt_to_acc(row[t]);
  if (l64)
    ((double *)losses)[i] = loss;
  else
    ((float *)losses)[i] = (float)loss;
  if (lse) {
    if (s64)
      ((double *)lse)[i] = (double)s;
    else
      ((float *)lse)[i] = (float)s;
  }
}

/* dlogits[j] = dl * (exp(x[j] - lse) - (j == t)), in the row's compute type, then its dtype. */
template <typename T> __host__ __device__ inline T ce_grad(T xv, int64_t j, int64_t t, acc_t<T> s, acc_t<T> dl) {
  acc_t<T> e = ce_exp(lt_to_acc(xv) - s);
  if (j == t) e = e - (acc_t<T>)1;
  return lt_from_acc<T>(dl * e);
}

/* Merges the states of the whole block; thread 0 gets the result (others: partial). */
template <typename A> __device__ inline lse_state<A> block_lse(lse_state<A> st) {
  __shared__ A sm[32], ss[32];
  __shared__ int sn[32];
  int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
  for (int off = 16; off > 0; off >>= 1)
    st.merge(__shfl_xor_sync(0xffffffffu, st.m, off), __shfl_xor_sync(0xffffffffu, st.s, off),
             __shfl_xor_sync(0xffffffffu, st.nan, off));
  __syncthreads(); /* the previous row's readers are done with the scratch */
  if (lane == 0) sm[warp] = st.m, ss[warp] = st.s, sn[warp] = st.nan;
  __syncthreads();
  if (threadIdx.x == 0)
    for (int w = 1; w < nwarps; w++) st.merge(sm[w], ss[w], sn[w]);
  return st;
}

// logits (N, V), targets (N) at stride tstride -> losses (N), lse (N) (f32 or f64 each)
template <typename T>
__global__ void ce_forward_kernel(const T *logits, int64_t N, int64_t V, const void *targets, int t64, int64_t tstride,
                                  int64_t ignore_index, void *losses, int l64, void *lse, int s64) {
  using A = acc_t<T>;
  for (int64_t i = blockIdx.x; i < N; i += gridDim.x) {
    const T *row = logits + i * V;
    lse_state<A> st;
    for_row(row, V, [&](T x) { st.add(lt_to_acc(x)); });
    st = block_lse(st);
    if (threadIdx.x == 0) ce_store_row(row, i, st.result(), targets, t64, tstride, ignore_index, losses, l64, lse, s64);
  }
}

// dlogits (N, V) = dlosses[i] * (exp(logits - lse[i]) - onehot(targets[i])), 0 for ignored rows
template <typename T>
__global__ void ce_backward_kernel(T *dlogits, const T *logits, int64_t N, int64_t V, const void *targets, int t64,
                                   int64_t tstride, int64_t ignore_index, const acc_t<T> *dlosses,
                                   const acc_t<T> *lse) {
  using A = acc_t<T>;
  for (int64_t i = blockIdx.x; i < N; i += gridDim.x) {
    int64_t t = load_index(targets, t64, i * tstride);
    T *g = dlogits + i * V;
    const T *x = logits + i * V;
    if (t == ignore_index) {
      map_row(g, x, V, [](T, int64_t) { return lt_from_acc<T>((A)0); });
      continue;
    }
    A s = lse[i], dl = dlosses[i];
    map_row(g, x, V, [&](T xv, int64_t j) { return ce_grad<T>(xv, j, t, s, dl); });
  }
}

// the first k < n whose id is outside [0, V) (and not ignore_index when has_ignore)
__global__ void check_indices_kernel(const void *ids, int is64, int64_t stride, int64_t n, int64_t V, int has_ignore,
                                     int64_t ignore_index, unsigned long long *first_bad) {
  for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < n; k += (int64_t)gridDim.x * blockDim.x) {
    int64_t id = load_index(ids, is64, k * stride);
    if ((id < 0 || id >= V) && !(has_ignore && id == ignore_index)) atomicMin(first_bad, (unsigned long long)k);
  }
}

/* Calls f(lt_dev_type_tag<T>{}) for the four floating dtypes; false for others. */
template <typename F> bool with_float_dtype(int dtype, F &&f) {
  switch (dtype) {
  case LT_F32: f(lt_dev_type_tag<float>{}); return true;
  case LT_F64: f(lt_dev_type_tag<double>{}); return true;
  case LT_BF16: f(lt_dev_type_tag<lt_bf16_bits>{}); return true;
  case LT_F16: f(lt_dev_type_tag<lt_f16_bits>{}); return true;
  default: return false;
  }
}

/* Threads per row: enough to stream long rows, few for short ones. */
int row_threads(int64_t V) { return V >= 8192 ? 512 : V >= 1024 ? 256 : 64; }
int row_blocks(int64_t N) { return (int)(N < (1 << 30) ? N : (1 << 30)); }

} // namespace

int lt_cuda_check_indices(const char *op, int device, const void *ids, int dtype, int64_t stride, int64_t n, int64_t V,
                          int has_ignore, int64_t ignore_index, int64_t *bad_pos, int64_t *bad_id) {
  *bad_pos = -1, *bad_id = 0;
  if (n <= 0) return 0;
  LT_TRY(lt_cuda_use_device(op, device));
  cudaStream_t s = lt_cuda_compute_stream(device);
  void *flag = NULL;
  LT_TRY(lt_cuda_alloc_stream(device, sizeof(unsigned long long), s, &flag));
  unsigned long long first = ULLONG_MAX;
  int is64 = dtype == LT_I64, rc = 0;
  cudaError_t err = cudaMemcpyAsync(flag, &first, sizeof first, cudaMemcpyHostToDevice, s);
  if (err == cudaSuccess) {
    check_indices_kernel<<<lt_cuda_blocks(device, n), LT_CUDA_THREADS, 0, s>>>(
        ids, is64, stride, n, V, has_ignore, ignore_index, (unsigned long long *)flag);
    err = cudaGetLastError();
  }
  if (err == cudaSuccess) err = cudaMemcpyAsync(&first, flag, sizeof first, cudaMemcpyDeviceToHost, s);
  if (err == cudaSuccess) err = cudaStreamSynchronize(s);
  if (err == cudaSuccess && first != ULLONG_MAX) { /* fetch the offending id for the message */
    int64_t k = (int64_t)first, id64 = 0;
    int32_t id32 = 0;
    const char *at = (const char *)ids + k * stride * (is64 ? 8 : 4);
    err = is64 ? cudaMemcpy(&id64, at, 8, cudaMemcpyDeviceToHost) : cudaMemcpy(&id32, at, 4, cudaMemcpyDeviceToHost);
    *bad_pos = k;
    *bad_id = is64 ? id64 : id32;
  }
  if (err != cudaSuccess) rc = lt_cuda_error(op, device, err);
  lt_cuda_free(device, flag);
  return rc;
}

int lt_cuda_cross_entropy_forward(int device, int dtype, const void *logits, int64_t N, int64_t V, const void *targets,
                                  int tdtype, int64_t tstride, int64_t ignore_index, void *losses, int ldtype,
                                  void *lse, int sdtype) {
  const char *op = "cross_entropy";
  if (N == 0) return 0;
  LT_TRY(lt_cuda_use_device(op, device));
  cudaStream_t s = lt_cuda_compute_stream(device);
  bool known = with_float_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    ce_forward_kernel<T><<<row_blocks(N), row_threads(V), 0, s>>>((const T *)logits, N, V, targets, tdtype == LT_I64,
                                                                  tstride, ignore_index, losses, ldtype == LT_F64, lse,
                                                                  sdtype == LT_F64);
  });
  if (!known) return lt_errorf("%s: dtype %s is not supported on cuda", op, lt_dtype_name(dtype));
  return lt_cuda_check_launch(op, device);
}

int lt_cuda_cross_entropy_backward(int device, int dtype, void *dlogits, const void *logits, int64_t N, int64_t V,
                                   const void *targets, int tdtype, int64_t tstride, int64_t ignore_index,
                                   const void *dlosses, const void *lse) {
  const char *op = "cross_entropy_backward";
  if (N == 0) return 0;
  LT_TRY(lt_cuda_use_device(op, device));
  cudaStream_t s = lt_cuda_compute_stream(device);
  bool known = with_float_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    ce_backward_kernel<T><<<row_blocks(N), row_threads(V), 0, s>>>((T *)dlogits, (const T *)logits, N, V, targets,
                                                                   tdtype == LT_I64, tstride, ignore_index,
                                                                   (const A *)dlosses, (const A *)lse);
  });
  if (!known) return lt_errorf("%s: dtype %s is not supported on cuda", op, lt_dtype_name(dtype));
  return lt_cuda_check_launch(op, device);
}

/* The kernels' log-sum-exp state machine run on the CPU, exported for tests/c/test_nn_kernels_host.c:
 * the row (f32, f64, bf16 or f16) dealt round-robin to `threads` states as for_row deals it, then
 * merged as block_lse merges (a butterfly within each warp of 32, then warp results in order).
 * Checks the edge cases (NaN, +-inf, empty threads) against host/ops/cross_entropy.c where no GPU is. */
extern "C" int lt_cuda_row_lse_on_host(const void *row, int dtype, int64_t V, int threads, double *lse) {
  if (threads <= 0 || threads % 32 || threads > 1024) return lt_errorf("row_lse_on_host: bad thread count %d", threads);
  bool known = with_float_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    lse_state<A> st[1024]; /* empty states: max -inf, sum 0 */
    for (int64_t j = 0; j < V; j++) st[j % threads].add(lt_to_acc(((const T *)row)[j]));
    for (int w = 0; w < threads; w += 32) /* __shfl_xor butterfly: every lane ends with the warp's merge */
      for (int off = 16; off > 0; off >>= 1) {
        lse_state<A> next[32];
        for (int lane = 0; lane < 32; lane++) {
          next[lane] = st[w + lane];
          const lse_state<A> &o = st[w + (lane ^ off)];
          next[lane].merge(o.m, o.s, o.nan);
        }
        for (int lane = 0; lane < 32; lane++) st[w + lane] = next[lane];
      }
    for (int w = 32; w < threads; w += 32) st[0].merge(st[w].m, st[w].s, st[w].nan);
    *lse = (double)st[0].result();
  });
  return known ? 0 : lt_errorf("row_lse_on_host: dtype %s is not floating", lt_dtype_name(dtype));
}

/* The launches above run on the CPU over host memory (one sequential state per row), exported for
 * tests/c/test_nn_kernels_host.c, which routes host/ops/cross_entropy.c's and ops/embedding.c's CUDA calls
 * here: checks the arguments those files pass and the kernels' per-row code against the CPU ops. */
extern "C" int lt_cuda_check_indices_on_host(const char *op, int device, const void *ids, int dtype, int64_t stride,
                                             int64_t n, int64_t V, int has_ignore, int64_t ignore_index,
                                             int64_t *bad_pos, int64_t *bad_id) {
  (void)op, (void)device;
  *bad_pos = -1, *bad_id = 0;
  for (int64_t k = 0; k < n; k++) {
    int64_t id = load_index(ids, dtype == LT_I64, k * stride);
    if ((id < 0 || id >= V) && !(has_ignore && id == ignore_index)) {
      *bad_pos = k, *bad_id = id;
      return 0;
    }
  }
  return 0;
}

extern "C" int lt_cuda_cross_entropy_forward_on_host(int device, int dtype, const void *logits, int64_t N, int64_t V,
                                                     const void *targets, int tdtype, int64_t tstride,
                                                     int64_t ignore_index, void *losses, int ldtype, void *lse,
                                                     int sdtype) {
  (void)device;
  bool known = with_float_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    for (int64_t i = 0; i < N; i++) {
      const T *row = (const T *)logits + i * V;
      lse_state<acc_t<T>> st;
      for (int64_t j = 0; j < V; j++) st.add(lt_to_acc(row[j]));
      ce_store_row(row, i, st.result(), targets, tdtype == LT_I64, tstride, ignore_index, losses, ldtype == LT_F64, lse,
                   sdtype == LT_F64);
    }
  });
  return known ? 0 : lt_errorf("cross_entropy: dtype %s is not supported on cuda", lt_dtype_name(dtype));
}

extern "C" int lt_cuda_cross_entropy_backward_on_host(int device, int dtype, void *dlogits, const void *logits,
                                                      int64_t N, int64_t V, const void *targets, int tdtype,
                                                      int64_t tstride, int64_t ignore_index, const void *dlosses,
                                                      const void *lse) {
  (void)device;
  bool known = with_float_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    for (int64_t i = 0; i < N; i++) {
      int64_t t = load_index(targets, tdtype == LT_I64, i * tstride);
      for (int64_t j = 0; j < V; j++) {
        T xv = ((const T *)logits)[i * V + j];
        ((T *)dlogits)[i * V + j] = t == ignore_index
                                        ? lt_from_acc<T>((A)0)
                                        : ce_grad<T>(xv, j, t, ((const A *)lse)[i], ((const A *)dlosses)[i]);
      }
    }
  });
  return known ? 0 : lt_errorf("cross_entropy_backward: dtype %s is not supported on cuda", lt_dtype_name(dtype));
}
