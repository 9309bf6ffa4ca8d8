/* cumsum.cu — cumsum and cumprod along one dim on CUDA (kernels/cumsum.h): one block per row,
 * the row scanned in chunks of the block's width (a warp scan with shuffles, then a scan of
 * the warps' totals), the running total carried from chunk to chunk. Every dtype accumulates
 * in double, as the CPU does; only the order of the additions within a chunk differs.
 * cumprod's backward runs one thread per row, the CPU's two passes over the row, with the
 * running products in device scratch. */
#include "kernels/common.cuh"
extern "C" {
#include "kernels/cumsum.h"
}

namespace {

enum { THREADS = 256 };

__device__ inline double combine(double a, double b, bool prod) { return prod ? a * b : a + b; }

/* Inclusive scan of v across the block; every thread gets its prefix, *total the chunk's. */
__device__ double block_scan(double v, bool prod, double *warp_totals, double *total) {
  int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
  for (int o = 1; o < 32; o <<= 1) {
    double u = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v = combine(u, v, prod);
  }
  if (lane == 31) warp_totals[warp] = v;
  __syncthreads();
  if (warp == 0) {
    double w = lane < nwarps ? warp_totals[lane] : (prod ? 1.0 : 0.0);
    for (int o = 1; o < 32; o <<= 1) {
      double u = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w = combine(u, w, prod);
    }
    if (lane < nwarps) warp_totals[lane] = w;
  }
  __syncthreads();
  if (warp > 0) v = combine(warp_totals[warp - 1], v, prod);
  *total = warp_totals[nwarps - 1];
  __syncthreads(); /* warp_totals is reused by the next chunk */
  return v;
}

template <typename T> __global__ void scan_kernel(lt_cumsum_plan p) {
  __shared__ double warp_totals[32];
  bool prod = p.kind == LT_CUMPROD;
  const T *x = (const T *)p.x;
  T *out = (T *)p.out;
  for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
    int64_t xo = lt_dev_offset(r, p.nkept, p.kshape, p.xk), oo = lt_dev_offset(r, p.nkept, p.kshape, p.ok);
    double carry = prod ? 1.0 : 0.0;
    for (int64_t t0 = 0; t0 < p.n; t0 += blockDim.x) {
      int64_t t = t0 + threadIdx.x, j = p.reverse ? p.n - 1 - t : t;
      double v = t < p.n ? lt_dev_dtype<T>::load(x[xo + j * p.xd]) : (prod ? 1.0 : 0.0);
      double total;
      v = combine(carry, block_scan(v, prod, warp_totals, &total), prod);
      if (t < p.n) out[oo + j * p.od] = lt_dev_dtype<T>::store(v);
      carry = combine(carry, total, prod);
    }
  }
}

/* host/ops/cumsum.c's cumprod_backward_row, y_{i-1} kept in scratch (n doubles per row) */
template <typename T> __global__ void cumprod_backward_kernel(lt_cumsum_plan p, double *scratch) {
  const T *x = (const T *)p.x, *g = (const T *)p.g;
  T *dx = (T *)p.out;
  for (int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; r < p.rows; r += (int64_t)gridDim.x * blockDim.x) {
    int64_t xo = lt_dev_offset(r, p.nkept, p.kshape, p.xk), go = lt_dev_offset(r, p.nkept, p.kshape, p.gk);
    int64_t oo = lt_dev_offset(r, p.nkept, p.kshape, p.ok), n = p.n;
    double *y = scratch + r * n, q = 1;
    for (int64_t i = 0; i < n; i++) y[i] = q, q *= lt_dev_dtype<T>::load(x[xo + i * p.xd]);
    double S = 0;
    for (int64_t i = n - 1; i >= 0; i--) {
      double next = i + 1 < n ? lt_dev_dtype<T>::load(x[xo + (i + 1) * p.xd]) * S : 0;
      S = lt_dev_dtype<T>::load(g[go + i * p.gd]) + next;
      dx[oo + i * p.od] = lt_dev_dtype<T>::store(y[i] * S);
    }
  }
}

} // namespace

int lt_cuda_cumsum(const char *op, const lt_cumsum_plan *p) {
  if (p->rows * p->n == 0) return 0;
  LT_TRY(lt_cuda_use_device(op, p->device));
  cudaStream_t s = lt_cuda_compute_stream(p->device);
  double *scratch = NULL;
  if (p->kind == LT_CUMPROD_BACKWARD)
    LT_TRY(lt_cuda_alloc_stream(p->device, p->rows * p->n * (int64_t)sizeof(double), s, (void **)&scratch));
  bool known = lt_with_dtype(p->dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (p->kind == LT_CUMPROD_BACKWARD) {
      cumprod_backward_kernel<T><<<lt_cuda_blocks(p->device, p->rows), LT_CUDA_THREADS, 0, s>>>(*p, scratch);
    } else {
      unsigned blocks = (unsigned)(p->rows < 65535 ? p->rows : 65535);
      scan_kernel<T><<<blocks, THREADS, 0, s>>>(*p);
    }
  });
  if (scratch) lt_cuda_free(p->device, scratch); /* stream-ordered: reused only after the kernel */
  if (!known) return lt_errorf("%s: unknown dtype %d", op, p->dtype);
  return lt_cuda_check_launch(op, p->device);
}
