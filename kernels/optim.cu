/* optim.cu — the optimizer's kernels: multi-tensor AdamW (one launch for a whole param group,
 * master weights included), Lion, the multi-tensor sum of squares and scale of gradient
 * clipping, and clipping's coefficient.
 *
 * Bitwise equal to the CPU (host/ops/adamw.c, ops/lion.c, ops/multi_tensor.c) for the updates:
 * every product, sum, quotient and square root is an explicitly rounded intrinsic (__fmul_rn,
 * __fadd_rn, __fdiv_rn, __fsqrt_rn, ...), which nvcc never contracts into an fma, and the one
 * fused step the CPU takes (the lerp's fmaf) is __fmaf_rn here; scalars are formed in double on
 * the host and cast once, as the CPU does. The sums of squares agree to rounding (another order).
 *
 * Multi-tensor calls describe their tensors with a table of lt_optim_entry (kernels/optim.h)
 * copied to the device through a pinned staging slot; each block takes chunks of LT_OPTIM_CHUNK
 * elements of one tensor (the tensor found by a binary search over the table's first chunks),
 * so a launch covers any number of tensors of any sizes (as apex's multi_tensor_apply, without
 * its per-launch tensor limit). Nothing waits for the host: the staging slot of a table is reused
 * only once the copy out of it completed (an event), 32 uploads later. */
#include "kernels/common.cuh"
#include <pthread.h>
extern "C" {
#include "kernels/optim.h"
}

/* ---- uploading a table ------------------------------------------------------------------------ */

enum { STAGE_SLOTS = 32, MAX_STAGE_DEVICES = 64 };
typedef struct stage_slot {
  void *host; /* pinned */
  int64_t cap;
  cudaEvent_t done; /* recorded after the copy out of host */
  bool pending;
} stage_slot;
typedef struct device_stage {
  stage_slot slot[STAGE_SLOTS];
  int next;
} device_stage;
static device_stage stages[MAX_STAGE_DEVICES];
static pthread_mutex_t stage_lock = PTHREAD_MUTEX_INITIALIZER;

/* Copies `bytes` of `table` into *dev, a device buffer of the caching allocator ordered on
 * `stream`; the caller frees it with lt_cuda_free after queueing its kernels. */
static int upload_table(const char *op, int device, cudaStream_t stream, const void *table, int64_t bytes, void **dev) {
  if (device >= MAX_STAGE_DEVICES) return lt_errorf("%s: device cuda:%d is out of range", op, device);
  LT_TRY(lt_cuda_alloc_stream(device, bytes, (void *)stream, dev));
  pthread_mutex_lock(&stage_lock);
  device_stage *ds = &stages[device];
  stage_slot *s = &ds->slot[ds->next];
  ds->next = (ds->next + 1) % STAGE_SLOTS;
  cudaError_t err = cudaSuccess;
  int rc = 0;
  if (s->pending) err = cudaEventSynchronize(s->done); /* 32 uploads ago: done long since */
  s->pending = false;
  if (err == cudaSuccess && !s->done) err = cudaEventCreateWithFlags(&s->done, cudaEventDisableTiming);
  if (err == cudaSuccess && s->cap < bytes) {
    lt_cuda_host_free(s->host);
    s->host = NULL, s->cap = 0;
    int64_t cap = bytes < 4096 ? 4096 : bytes;
    rc = lt_cuda_host_alloc(cap, &s->host);
    if (rc == 0) s->cap = cap;
  }
  if (err == cudaSuccess && rc == 0) {
    memcpy(s->host, table, (size_t)bytes);
    err = cudaMemcpyAsync(*dev, s->host, (size_t)bytes, cudaMemcpyHostToDevice, stream);
    if (err == cudaSuccess) err = cudaEventRecord(s->done, stream);
    s->pending = err == cudaSuccess;
  }
  pthread_mutex_unlock(&stage_lock);
  if (err != cudaSuccess) rc = lt_cuda_error(op, device, err);
  if (rc) {
    lt_cuda_free(device, *dev);
    *dev = NULL;
  }
  return rc;
}

/* Blocks for a loop over `chunks` chunks, one block per chunk up to a cap. */
static unsigned chunk_blocks(int64_t chunks) { return (unsigned)(chunks < (1 << 20) ? chunks : (1 << 20)); }

/* ---- element access -------------------------------------------------------------------------- */

/* Element i of an f32, bf16 or f16 buffer as f32 (exact). */
__device__ __forceinline__ float load_f32(const void *p, int dtype, int64_t i) {
  if (dtype == LT_F32) return ((const float *)p)[i];
  if (dtype == LT_BF16) return lt_bf16_to_f32(((const uint16_t *)p)[i]);
  return lt_f16_to_f32(((const uint16_t *)p)[i]);
}
/* Stores x rounded to an f32, bf16 or f16 buffer. */
__device__ __forceinline__ void store_f32(void *p, int dtype, int64_t i, float x) {
  if (dtype == LT_F32)
    ((float *)p)[i] = x;
  else if (dtype == LT_BF16)
    ((uint16_t *)p)[i] = lt_f32_to_bf16(x);
  else
    ((uint16_t *)p)[i] = lt_f32_to_f16(x);
}
__device__ __forceinline__ double load_f64(const void *p, int dtype, int64_t i) {
  return dtype == LT_F64 ? ((const double *)p)[i] : (double)load_f32(p, dtype, i);
}

/* ---- AdamW ----------------------------------------------------------------------------------- */

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
  LT_TRY(upload_table(op, device, stream, entries, n * (int64_t)sizeof *entries, &table));
  adamw_multi_kernel<<<chunk_blocks(chunks), LT_CUDA_THREADS, 0, stream>>>((const lt_optim_entry *)table, n, chunks,
                                                                           adamw_consts_of(s));
  int rc = lt_cuda_check_launch(op, device);
  lt_cuda_free(device, table); /* stream-ordered: reused only by work queued after the kernel */
  return rc;
}

/* ---- Lion ------------------------------------------------------------------------------------ */

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

/* ---- sum of squares -------------------------------------------------------------------------- */

/* partial[c] = the sum of squares of chunk c, in f64: each thread sums its strided elements in
 * order, then the block's fixed tree (lt_block_sum). The loop bound is the same for every
 * thread of a block, so the __syncthreads inside lt_block_sum are reached by all. */
__global__ void sumsq_kernel(const lt_optim_entry *table, int64_t ntable, int64_t chunks, double *partial) {
  __shared__ double scratch[32];
  for (int64_t c = blockIdx.x; c < chunks; c += gridDim.x) {
    lt_optim_entry e = table[lt_optim_entry_of(table, ntable, c)];
    int64_t i0 = (c - e.first_chunk) * LT_OPTIM_CHUNK;
    int64_t end = e.n - i0 < LT_OPTIM_CHUNK ? e.n : i0 + LT_OPTIM_CHUNK;
    double acc = 0;
    for (int64_t i = i0 + threadIdx.x; i < end; i += blockDim.x) {
      double x = load_f64(e.param, e.pdtype, i);
      acc = __fma_rn(x, x, acc);
    }
    acc = lt_block_sum(acc, scratch);
    if (threadIdx.x == 0) partial[c] = acc;
  }
}

/* out = the sum of partial[0..chunks) by one block, in a fixed order. */
__global__ void sum_partials_kernel(const double *partial, int64_t chunks, void *out, int out_dtype) {
  __shared__ double scratch[32];
  double acc = 0;
  for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) acc += partial[c];
  acc = lt_block_sum(acc, scratch);
  if (threadIdx.x == 0) {
    if (out_dtype == LT_F64)
      *(double *)out = acc;
    else
      *(float *)out = (float)acc;
  }
}

int lt_cuda_sumsq_multi(int device, const lt_optim_entry *entries, int64_t n, int64_t chunks, void *out,
                        int out_dtype) {
  const char *op = "multi_tensor_sumsq";
  LT_TRY(lt_cuda_use_device(op, device));
  cudaStream_t stream = lt_cuda_compute_stream(device);
  void *table = NULL, *partial = NULL;
  if (chunks > 0) {
    LT_TRY(lt_cuda_alloc_stream(device, chunks * (int64_t)sizeof(double), (void *)stream, &partial));
    if (upload_table(op, device, stream, entries, n * (int64_t)sizeof *entries, &table)) {
      lt_cuda_free(device, partial);
      return -1;
    }
    sumsq_kernel<<<chunk_blocks(chunks), LT_CUDA_THREADS, 0, stream>>>((const lt_optim_entry *)table, n, chunks,
                                                                       (double *)partial);
  }
  int rc = lt_cuda_check_launch(op, device);
  if (rc == 0) {
    sum_partials_kernel<<<1, 1024, 0, stream>>>((const double *)partial, chunks, out, out_dtype);
    rc = lt_cuda_check_launch(op, device);
  }
  lt_cuda_free(device, table);
  lt_cuda_free(device, partial);
  return rc;
}

/* ---- scale ------------------------------------------------------------------------------------- */

/* As host/ops/multi_tensor.c's scale_chunk: s in f32 for f32/bf16/f16, f64 for f64. */
__global__ void scale_kernel(const lt_optim_entry *table, int64_t ntable, int64_t chunks, const void *scale,
                             int scale_dtype) {
  double s = scale_dtype == LT_F64 ? *(const double *)scale : (double)*(const float *)scale;
  float sf = (float)s;
  for (int64_t c = blockIdx.x; c < chunks; c += gridDim.x) {
    lt_optim_entry e = table[lt_optim_entry_of(table, ntable, c)];
    int64_t i0 = (c - e.first_chunk) * LT_OPTIM_CHUNK;
    int64_t end = e.n - i0 < LT_OPTIM_CHUNK ? e.n : i0 + LT_OPTIM_CHUNK;
    for (int64_t i = i0 + threadIdx.x; i < end; i += blockDim.x) {
      if (e.pdtype == LT_F64)
        ((double *)e.param)[i] = __dmul_rn(((const double *)e.param)[i], s);
      else
        store_f32(e.param, e.pdtype, i, __fmul_rn(load_f32(e.param, e.pdtype, i), sf));
    }
  }
}

int lt_cuda_scale_multi(int device, const lt_optim_entry *entries, int64_t n, int64_t chunks, const void *scale,
                        int scale_dtype) {
  const char *op = "multi_tensor_scale";
  if (chunks <= 0) return 0;
  LT_TRY(lt_cuda_use_device(op, device));
  cudaStream_t stream = lt_cuda_compute_stream(device);
  void *table = NULL;
  LT_TRY(upload_table(op, device, stream, entries, n * (int64_t)sizeof *entries, &table));
  scale_kernel<<<chunk_blocks(chunks), LT_CUDA_THREADS, 0, stream>>>((const lt_optim_entry *)table, n, chunks, scale,
                                                                     scale_dtype);
  int rc = lt_cuda_check_launch(op, device);
  lt_cuda_free(device, table);
  return rc;
}

/* ---- clipping's coefficient --------------------------------------------------------------------- */

__global__ void clip_coef_kernel(void *coef, int coef_dtype, const void *sumsq, int sumsq_dtype, double max_norm) {
  double ss = sumsq_dtype == LT_F64 ? *(const double *)sumsq : (double)*(const float *)sumsq;
  double c = lt_clip_coef_of(ss, max_norm);
  if (coef_dtype == LT_F64)
    *(double *)coef = c;
  else
    *(float *)coef = (float)c;
}

int lt_cuda_clip_coef(int device, void *coef, int coef_dtype, const void *sumsq, int sumsq_dtype, double max_norm) {
  const char *op = "clip_coef";
  LT_TRY(lt_cuda_use_device(op, device));
  clip_coef_kernel<<<1, 1, 0, lt_cuda_compute_stream(device)>>>(coef, coef_dtype, sumsq, sumsq_dtype, max_norm);
  return lt_cuda_check_launch(op, device);
}
