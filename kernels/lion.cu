/* lion.cu — Lion on CUDA, one tensor a launch (host/ops/lion.c checks and calls it, and is the
 * CPU twin). Bitwise equal to the CPU: every product and sum is an explicitly rounded intrinsic
 * (__fmul_rn, __fadd_rn, ...), which nvcc never contracts into an fma, and the scalars are formed
 * in double on the host and cast once, as the CPU does. */
#include "kernels/multi_tensor.cuh"
extern "C" {
#include "kernels/lion.h"
}

struct lion_consts {
  float decay, neg_lr, b1, c1, b2, c2;
  double d_decay, d_neg_lr, d_b1, d_c1, d_b2, d_c2;
};

/* host/ops/lion.c's lion_f32 and lion_f64, one element at a time. */
__global__ void lion_kernel(lt_optim_entry e, lion_consts k) {
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < e.n; i += stride) {
    if (e.pdtype == LT_F64) {
      double *p = (double *)e.param, *m = (double *)e.m, gi = ((const double *)e.grad)[i], mi = m[i];
      double c = __dadd_rn(__dmul_rn(mi, k.d_b1), __dmul_rn(k.d_c1, gi));
      double sign = (double)((c > 0) - (c < 0));
      p[i] = __dadd_rn(__dmul_rn(p[i], k.d_decay), __dmul_rn(k.d_neg_lr, sign));
      m[i] = __dadd_rn(__dmul_rn(mi, k.d_b2), __dmul_rn(k.d_c2, gi));
    } else {
      float *m = (float *)e.m, gi = load_f32(e.grad, e.gdtype, i), mi = m[i];
      float c = __fadd_rn(__fmul_rn(mi, k.b1), __fmul_rn(k.c1, gi));
      float sign = (float)((c > 0) - (c < 0));
      float pi = load_f32(e.param, e.pdtype, i);
      store_f32(e.param, e.pdtype, i, __fadd_rn(__fmul_rn(pi, k.decay), __fmul_rn(k.neg_lr, sign)));
      m[i] = __fadd_rn(__fmul_rn(mi, k.b2), __fmul_rn(k.c2, gi));
    }
  }
}

int lt_cuda_lion(int device, const lt_optim_entry *e, const lt_lion_scalars *s) {
  const char *op = "lion";
  if (e->n <= 0) return 0;
  LT_TRY(lt_cuda_use_device(op, device));
  lion_consts k = {(float)s->decay, (float)s->neg_lr,          (float)s->beta1, (float)s->one_minus_beta1,
                   (float)s->beta2, (float)s->one_minus_beta2, s->decay,        s->neg_lr,
                   s->beta1,        s->one_minus_beta1,        s->beta2,        s->one_minus_beta2};
  lion_kernel<<<lt_cuda_blocks(device, e->n), LT_CUDA_THREADS, 0, lt_cuda_compute_stream(device)>>>(*e, k);
  return lt_cuda_check_launch(op, device);
}
