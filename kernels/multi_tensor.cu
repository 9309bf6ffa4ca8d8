/* multi_tensor.cu — the multi-tensor ops on CUDA: the sum of squares and the scale of gradient
 * clipping, clipping's coefficient, and the upload of a call's table that they share with
 * multi-tensor AdamW (kernels/adamw.cu). host/ops/multi_tensor.c checks and calls them, and is
 * the CPU twin: the scale is bitwise equal to it (explicitly rounded intrinsics), the sums of
 * squares agree to rounding (another order).
 *
 * Multi-tensor calls describe their tensors with a table of lt_optim_entry (kernels/multi_tensor.h)
 * copied to the device through a pinned staging slot; each block takes chunks of LT_OPTIM_CHUNK
 * elements of one tensor (the tensor found by a binary search over the table's first chunks),
 * so a launch covers any number of tensors of any sizes (as apex's multi_tensor_apply, without
 * its per-launch tensor limit). Nothing waits for the host: the staging slot of a table is reused
 * only once the copy out of it completed (an event), 32 uploads later. */
#include "kernels/multi_tensor.cuh"
#include <pthread.h>

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

int lt_cuda_upload_entries(const char *op, int device, cudaStream_t stream, const void *table, int64_t bytes,
                           void **dev) {
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
    if (lt_cuda_upload_entries(op, device, stream, entries, n * (int64_t)sizeof *entries, &table)) {
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
  LT_TRY(lt_cuda_upload_entries(op, device, stream, entries, n * (int64_t)sizeof *entries, &table));
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
