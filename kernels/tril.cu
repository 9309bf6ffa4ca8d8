/* tril.cu — tril and triu on CUDA (kernels/tril.h): one thread per element of the result, x's
 * element or zero by its place in the last two dims; in place when out is x. */
#include "kernels/common.cuh"
extern "C" {
#include "kernels/tril.h"
}

namespace {

template <typename T> __global__ void tril_kernel(lt_tril_plan p) {
  int nd = p.ndim;
  int64_t N = p.shape[nd - 1], M = p.shape[nd - 2];
  for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < p.numel; e += (int64_t)gridDim.x * blockDim.x) {
    int64_t j = e % N, i = e / N % M;
    bool keep = p.upper ? j - i >= p.diagonal : j - i <= p.diagonal;
    T *dst = (T *)p.out + lt_dev_offset(e, nd, p.shape, p.os);
    if (keep)
      *dst = ((const T *)p.x)[lt_dev_offset(e, nd, p.shape, p.xs)];
    else
      memset(dst, 0, sizeof(T)); /* all-zero bits: 0 in every dtype */
  }
}

} // namespace

int lt_cuda_tril(const char *op, const lt_tril_plan *p) {
  if (p->numel == 0) return 0;
  LT_TRY(lt_cuda_use_device(op, p->device));
  cudaStream_t s = lt_cuda_compute_stream(p->device);
  bool known = lt_with_dtype(p->dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    tril_kernel<T><<<lt_cuda_blocks(p->device, p->numel), LT_CUDA_THREADS, 0, s>>>(*p);
  });
  if (!known) return lt_errorf("%s: unknown dtype %d", op, p->dtype);
  return lt_cuda_check_launch(op, p->device);
}
