/* adamw.cu — multi-tensor AdamW on CUDA: one launch for a whole param group, master weights
 * included (host/ops/adamw.c checks and calls it, and is the CPU twin).
 *
 * Bitwise equal to the CPU: every product, sum, quotient and square root is an explicitly
 * rounded intrinsic (__fmul_rn, __fadd_rn, __fdiv_rn, __fsqrt_rn, ...), which nvcc never
 * contracts into an fma, and the one fused step the CPU takes (the lerp's fmaf) is __fmaf_rn
 * here; scalars are formed in double on the host and cast once, as the CPU does.
 *
 * The param group is a table of lt_optim_entry (kernels/multi_tensor.h) uploaded to the device;
 * each block takes chunks of LT_OPTIM_CHUNK elements of one tensor (kernels/multi_tensor.cu's
 * head says how). */
#include "kernels/multi_tensor.cuh"
extern "C" {
#include "kernels/adamw.h"
}

/* The scalars as host/ops/adamw.c's adamw_f32 and adamw_f64 cast and derive them. */
struct adamw_consts {
  float decay, coeff, b2, c2, neg_step, bc2_sqrt, eps;
  double d_decay, d_coeff, d_b2, d_c2, d_neg_step, d_bc2_sqrt, d_eps;
  bool small_w, d_small_w;
};

static adamw_consts adamw_consts_of(const lt_adamw_scalars *s) {
  adamw_consts k;
  float w = (float)s->lerp_w;
  k.decay = (float)s->decay, k.b2 = (float)s->beta2, k.c2 = (float)s->one_minus_beta2;
  k.neg_step = (float)-s->step_size, k.bc2_sqrt = (float)s->bc2_sqrt, k.eps = (float)s->eps;
  k.small_w = fabsf(w) < 0.5f;
  k.coeff = k.small_w ? w : w - 1.0f;
  double dw = s->lerp_w;
  k.d_small_w = fabs(dw) < 0.5;
  k.d_coeff = k.d_small_w ? dw : dw - 1.0;
  k.d_decay = s->decay, k.d_b2 = s->beta2, k.d_c2 = s->one_minus_beta2, k.d_neg_step = -s->step_size;
  k.d_bc2_sqrt = s->bc2_sqrt, k.d_eps = s->eps;
  return k;
}

/* adamw_f32's body for one element: p, m, v updated in place. */
__device__ __forceinline__ void adamw_one_f32(float &p, float g, float &m, float &v, const adamw_consts &k) {
  float pi = __fmul_rn(p, k.decay);
  float mi = __fmaf_rn(k.coeff, __fsub_rn(g, m), k.small_w ? m : g);
  float vi = __fmul_rn(v, k.b2);
  vi = __fadd_rn(vi, __fmul_rn(__fmul_rn(k.c2, g), g));
  float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), k.bc2_sqrt), k.eps);
  p = __fadd_rn(pi, __fdiv_rn(__fmul_rn(k.neg_step, mi), denom));
  m = mi;
  v = vi;
}

__device__ __forceinline__ void adamw_one_f64(double &p, double g, double &m, double &v, const adamw_consts &k) {
  double pi = __dmul_rn(p, k.d_decay);
  double mi = __fma_rn(k.d_coeff, __dsub_rn(g, m), k.d_small_w ? m : g);
  double vi = __dmul_rn(v, k.d_b2);
  vi = __dadd_rn(vi, __dmul_rn(__dmul_rn(k.d_c2, g), g));
  double denom = __dadd_rn(__ddiv_rn(__dsqrt_rn(vi), k.d_bc2_sqrt), k.d_eps);
  p = __dadd_rn(pi, __ddiv_rn(__dmul_rn(k.d_neg_step, mi), denom));
  m = mi;
  v = vi;
}

/* Each block updates whole chunks; the threads of a block stride through a chunk (coalesced). */
__global__ void adamw_multi_kernel(const lt_optim_entry *table, int64_t ntable, int64_t chunks, adamw_consts k) {
  for (int64_t c = blockIdx.x; c < chunks; c += gridDim.x) {
    lt_optim_entry e = table[lt_optim_entry_of(table, ntable, c)];
    int64_t i0 = (c - e.first_chunk) * LT_OPTIM_CHUNK;
    int64_t end = e.n - i0 < LT_OPTIM_CHUNK ? e.n : i0 + LT_OPTIM_CHUNK;
    if (e.pdtype == LT_F64) {
      double *p = (double *)e.param, *m = (double *)e.m, *v = (double *)e.v;
      const double *g = (const double *)e.grad;
      for (int64_t i = i0 + threadIdx.x; i < end; i += blockDim.x) {
        double pi = p[i], mi = m[i], vi = v[i];
        adamw_one_f64(pi, g[i], mi, vi, k);
        p[i] = pi, m[i] = mi, v[i] = vi;
      }
    } else {
      float *m = (float *)e.m, *v = (float *)e.v;
      for (int64_t i = i0 + threadIdx.x; i < end; i += blockDim.x) {
        float pi = e.master ? e.master[i] : load_f32(e.param, e.pdtype, i);
        float mi = m[i], vi = v[i];
        adamw_one_f32(pi, load_f32(e.grad, e.gdtype, i), mi, vi, k);
        if (e.master) e.master[i] = pi;
        store_f32(e.param, e.pdtype, i, pi);
        m[i] = mi, v[i] = vi;
      }
    }
  }
}

int lt_cuda_adamw_multi(int device, const lt_optim_entry *entries, int64_t n, int64_t chunks,
                        const lt_adamw_scalars *s) {
  const char *op = "adamw";
  if (chunks <= 0) return 0;
  LT_TRY(lt_cuda_use_device(op, device));
  cudaStream_t stream = lt_cuda_compute_stream(device);
  void *table = NULL;
  LT_TRY(lt_cuda_upload_entries(op, device, stream, entries, n * (int64_t)sizeof *entries, &table));
  adamw_multi_kernel<<<chunk_blocks(chunks), LT_CUDA_THREADS, 0, stream>>>((const lt_optim_entry *)table, n, chunks,
                                                                           adamw_consts_of(s));
  int rc = lt_cuda_check_launch(op, device);
  lt_cuda_free(device, table); /* stream-ordered: reused only by work queued after the kernel */
  return rc;
}
