/* layer_norm.cu — LayerNorm and RMSNorm (LayerNorm with center = 0) on CUDA, forward and backward,
 * with the fused residual add (host/ops/layer_norm.c checks, allocates and calls these;
 * host/ops/layer_norm_cpu.c is the CPU twin).
 *
 * Rows are contiguous (N, C). The compute type A is f32 for f32/bf16/f16 and f64 for f64, as on
 * the CPU, with the same formulas in the same order; only the order of the row sums differs
 * (a block reduction), which moves results by an ulp or so.
 *   forward:  one block per row (grid-stride over rows). A row moves in runs of V elements
 *             (128-bit accesses when aligned) and each thread owns the same runs in every pass,
 *             so a thread only ever reads back what it wrote itself (res, then y): in-place use
 *             (y == x, res == x) is safe.
 *   backward: one block per chunk of rows. dx needs two block sums per row; dweight/dbias are
 *             accumulated per chunk into partial rows (each thread owns its columns: no atomics),
 *             then a second kernel adds the chunk partials in chunk order, in double (as the
 *             CPU does). The chunk count depends on the shape only: results are deterministic. */
#include "kernels/common.cuh"
extern "C" {
#include "kernels/layer_norm.h"
}

/* ---- element access in the compute type ------------------------------------------------------- */

template <typename T> struct norm_elem;
template <> struct norm_elem<float> {
  using A = float;
  __device__ static float load(float v) { return v; }
  __device__ static float store(float v) { return v; }
};
template <> struct norm_elem<double> {
  using A = double;
  __device__ static double load(double v) { return v; }
  __device__ static double store(double v) { return v; }
};
template <> struct norm_elem<lt_bf16_bits> {
  using A = float;
  __device__ static float load(lt_bf16_bits v) { return lt_bf16_to_f32(v.bits); }
  __device__ static lt_bf16_bits store(float v) { return {lt_f32_to_bf16(v)}; }
};
template <> struct norm_elem<lt_f16_bits> {
  using A = float;
  __device__ static float load(lt_f16_bits v) { return lt_f16_to_f32(v.bits); }
  __device__ static lt_f16_bits store(float v) { return {lt_f32_to_f16(v)}; }
};

__device__ inline float norm_rsqrt(float v) { return 1.0f / sqrtf(v); } /* IEEE sqrt and divide, as the CPU */
__device__ inline double norm_rsqrt(double v) { return 1.0 / sqrt(v); }

/* a + b never contracted into an fma with the product that made a */
__device__ inline float norm_add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ inline double norm_add_rn(double a, double b) { return __dadd_rn(a, b); }

/* Statistics are f32 or f64 (is64). */
__device__ inline double load_stat(const void *p, bool is64, int64_t i) {
  return is64 ? ((const double *)p)[i] : (double)((const float *)p)[i];
}
__device__ inline void store_stat(void *p, bool is64, int64_t i, double v) {
  if (is64)
    ((double *)p)[i] = v;
  else
    ((float *)p)[i] = (float)v;
}

/* Element j of an f32, f64, bf16 or f16 buffer = v, rounded as lt_store_f64 does. */
__device__ inline void store_any(void *p, int dtype, int64_t j, double v) {
  switch (dtype) {
  case LT_F64: ((double *)p)[j] = v; break;
  case LT_BF16: ((uint16_t *)p)[j] = lt_f32_to_bf16((float)v); break;
  case LT_F16: ((uint16_t *)p)[j] = lt_f32_to_f16((float)v); break;
  default: ((float *)p)[j] = (float)v; break;
  }
}

/* ---- forward ------------------------------------------------------------------------------- */

/* Rows are read and written as runs of V elements (lt_dev_vec: one 128-bit access when V is
 * 16 / sizeof(T)); the host picks V = 1 unless every row pointer is 16-byte aligned and V divides
 * C. Run v of a row belongs to thread v % blockDim.x in every pass. */
template <typename T, int V> __global__ void layer_norm_forward_kernel(const lt_layer_norm_forward_plan p) {
  using E = norm_elem<T>;
  using A = typename E::A;
  using Vec = lt_dev_vec<T, V>;
  __shared__ A scratch[32];
  const int64_t C = p.C, nv = C / V;
  const A *w = (const A *)p.w, *b = (const A *)p.b;
  const A eps = (A)p.eps;
  const bool mean64 = p.mean_dtype == LT_F64, rstd64 = p.rstd_dtype == LT_F64;
  for (int64_t i = blockIdx.x; i < p.N; i += gridDim.x) {
    const Vec *x = reinterpret_cast<const Vec *>((const T *)p.x + i * C);
    if (p.residual) { /* res = x + residual rounded to T; the norm reads back these rounded values */
      const Vec *r = reinterpret_cast<const Vec *>((const T *)p.residual + i * C);
      Vec *res = reinterpret_cast<Vec *>((T *)p.res + i * C);
      for (int64_t v = threadIdx.x; v < nv; v += blockDim.x) {
        Vec a = x[v], c = r[v], s;
#pragma unroll
        for (int k = 0; k < V; k++) s.v[k] = E::store(E::load(a.v[k]) + E::load(c.v[k]));
        res[v] = s;
      }
      x = res;
    }
    A mu = 0;
    if (p.center) {
      A s = 0;
      for (int64_t v = threadIdx.x; v < nv; v += blockDim.x) {
        Vec a = x[v];
#pragma unroll
        for (int k = 0; k < V; k++) s += E::load(a.v[k]);
      }
      mu = lt_block_sum(s, scratch) / (A)C;
    }
    A ss = 0;
    for (int64_t v = threadIdx.x; v < nv; v += blockDim.x) {
      Vec a = x[v];
#pragma unroll
      for (int k = 0; k < V; k++) {
        A d = E::load(a.v[k]) - mu;
        ss += d * d;
      }
    }
    A rs = norm_rsqrt(lt_block_sum(ss, scratch) / (A)C + eps);
    Vec *y = reinterpret_cast<Vec *>((T *)p.y + i * C);
    for (int64_t v = threadIdx.x; v < nv; v += blockDim.x) {
      Vec a = x[v], o;
#pragma unroll
      for (int k = 0; k < V; k++) {
        int64_t j = v * V + k;
        o.v[k] = E::store((E::load(a.v[k]) - mu) * rs * w[j] + b[j]);
      }
      y[v] = o;
    }
    if (threadIdx.x == 0) {
      if (p.mean) store_stat(p.mean, mean64, i, mu);
      if (p.rstd) store_stat(p.rstd, rstd64, i, rs);
    }
  }
}

/* Threads a block: about 4 columns a thread, 32..512 (a multiple of 32, as lt_block_sum needs). */
static int row_threads(int64_t C) {
  int64_t t = (C + 3) / 4;
  t = (t + 31) / 32 * 32;
  return (int)(t < 32 ? 32 : t > 512 ? 512 : t);
}

static int grid_for(int64_t work) { return (int)(work < (1 << 20) ? work : (1 << 20)); }

/* True when rows of C elements of T can be moved 16 bytes at a time from every pointer given. */
template <typename T> static bool vec_ok(int64_t C, const void *a, const void *b, const void *c, const void *d) {
  constexpr int V = 16 / sizeof(T);
  return C % V == 0 && lt_aligned(a, 16) && (!b || lt_aligned(b, 16)) && (!c || lt_aligned(c, 16)) &&
         (!d || lt_aligned(d, 16));
}

template <typename T> static void launch_forward(const lt_layer_norm_forward_plan *p) {
  constexpr int V = 16 / sizeof(T);
  cudaStream_t stream = lt_cuda_compute_stream(p->device);
  if (vec_ok<T>(p->C, p->x, p->residual, p->res, p->y))
    layer_norm_forward_kernel<T, V><<<grid_for(p->N), row_threads(p->C / V), 0, stream>>>(*p);
  else
    layer_norm_forward_kernel<T, 1><<<grid_for(p->N), row_threads(p->C), 0, stream>>>(*p);
}

int lt_cuda_layer_norm_forward(const char *op, const lt_layer_norm_forward_plan *p) {
  LT_TRY(lt_cuda_use_device(op, p->device));
  if (p->N == 0) return 0;
  switch (p->dtype) {
  case LT_F32: launch_forward<float>(p); break;
  case LT_F64: launch_forward<double>(p); break;
  case LT_BF16: launch_forward<lt_bf16_bits>(p); break;
  case LT_F16: launch_forward<lt_f16_bits>(p); break;
  default: return lt_errorf("%s: dtype %s is not supported on cuda", op, lt_dtype_name(p->dtype));
  }
  return lt_cuda_check_launch(op, p->device);
}

/* ---- backward ------------------------------------------------------------------------------ */

/* With xhat = (x - mu) * rstd and g = dy * w (as host/ops/layer_norm_cpu.c):
 *   dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) + dres   (mean(g) only when center)
 *   partial dw[k] += dy * xhat, partial db[k] += dy over the rows of chunk k.
 * Runs of V as in the forward. dx may alias dy or dres: a thread reads its own runs before
 * writing them; the partial columns of a run belong to its thread too. */
template <typename T, int V>
__global__ void layer_norm_backward_kernel(const lt_layer_norm_backward_plan p, int64_t nchunks,
                                           typename norm_elem<T>::A *pw, typename norm_elem<T>::A *pb) {
  using E = norm_elem<T>;
  using A = typename E::A;
  using Vec = lt_dev_vec<T, V>;
  __shared__ A scratch[32];
  const int64_t C = p.C, N = p.N, nv = C / V;
  const A *w = (const A *)p.w;
  const bool mean64 = p.mean_dtype == LT_F64, rstd64 = p.rstd_dtype == LT_F64;
  for (int64_t k = blockIdx.x; k < nchunks; k += gridDim.x) {
    int64_t i0 = N * k / nchunks, i1 = N * (k + 1) / nchunks; /* nchunks <= N: never empty */
    A *pwk = pw ? pw + k * C : nullptr, *pbk = pb ? pb + k * C : nullptr;
    for (int64_t i = i0; i < i1; i++) {
      A mu = p.center ? (A)load_stat(p.mean, mean64, i) : (A)0, rs = (A)load_stat(p.rstd, rstd64, i);
      const Vec *dy = reinterpret_cast<const Vec *>((const T *)p.dy + i * C);
      const Vec *x = reinterpret_cast<const Vec *>((const T *)p.x + i * C);
      A sum_g = 0, sum_gx = 0;
      for (int64_t v = threadIdx.x; v < nv; v += blockDim.x) {
        Vec dv = dy[v], xv = x[v];
#pragma unroll
        for (int q = 0; q < V; q++) {
          int64_t j = v * V + q;
          A d = E::load(dv.v[q]), xhat = (E::load(xv.v[q]) - mu) * rs, g = d * w[j];
          sum_g += g;
          sum_gx += g * xhat;
          if (pwk) pwk[j] = (i == i0 ? (A)0 : pwk[j]) + d * xhat;
          if (pbk) pbk[j] = (i == i0 ? (A)0 : pbk[j]) + d;
        }
      }
      sum_g = lt_block_sum(sum_g, scratch);
      sum_gx = lt_block_sum(sum_gx, scratch);
      if (!p.dx) continue; /* the same for every thread of the block */
      A mean_g = p.center ? sum_g / (A)C : (A)0, mean_gx = sum_gx / (A)C;
      const Vec *dres = p.dres ? reinterpret_cast<const Vec *>((const T *)p.dres + i * C) : nullptr;
      Vec *dx = reinterpret_cast<Vec *>((T *)p.dx + i * C);
      for (int64_t v = threadIdx.x; v < nv; v += blockDim.x) {
        Vec dv = dy[v], xv = x[v], o, rv = {};
        if (dres) rv = dres[v];
#pragma unroll
        for (int q = 0; q < V; q++) {
          int64_t j = v * V + q;
          A val = rs * (E::load(dv.v[q]) * w[j] - mean_g - (E::load(xv.v[q]) - mu) * rs * mean_gx);
          if (dres) val = norm_add_rn(val, E::load(rv.v[q])); /* rounded alone, as the CPU's add */
          o.v[q] = E::store(val);
        }
        dx[v] = o;
      }
    }
  }
}

/* out[j] (out_dtype) = the sum over chunks k, in order, of partial[k * C + j], in double. */
template <typename A>
__global__ void sum_partials_kernel(void *out, int out_dtype, const A *partial, int64_t nchunks, int64_t C) {
  for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < C; j += (int64_t)gridDim.x * blockDim.x) {
    double s = 0;
    for (int64_t k = 0; k < nchunks; k++) s += (double)partial[k * C + j];
    store_any(out, out_dtype, j, s);
  }
}

/* Row chunks (blocks) for the dweight/dbias partials, set by the shape only: up to 2048 blocks to
 * fill a large GPU, fewer for wide rows so that the partials stay within 4M values each. */
static int64_t gpu_chunks(int64_t N, int64_t C) {
  int64_t k = ((int64_t)1 << 22) / C;
  k = k < 64 ? 64 : k > 2048 ? 2048 : k;
  return N < k ? N : k;
}

template <typename T> static int launch_backward(const char *op, const lt_layer_norm_backward_plan *p) {
  using A = typename norm_elem<T>::A;
  int device = p->device;
  cudaStream_t stream = lt_cuda_compute_stream(device);
  int64_t N = p->N, C = p->C, nchunks = gpu_chunks(N, C);
  void *partial = NULL;
  if (p->dw || p->db) LT_TRY(lt_cuda_alloc(device, 2 * nchunks * C * (int64_t)sizeof(A), &partial));
  A *pw = p->dw ? (A *)partial : nullptr, *pb = p->db ? (A *)partial + nchunks * C : nullptr;
  constexpr int V = 16 / sizeof(T);
  if (vec_ok<T>(C, p->dy, p->x, p->dres, p->dx))
    layer_norm_backward_kernel<T, V><<<(int)nchunks, row_threads(C / V), 0, stream>>>(*p, nchunks, pw, pb);
  else
    layer_norm_backward_kernel<T, 1><<<(int)nchunks, row_threads(C), 0, stream>>>(*p, nchunks, pw, pb);
  int rc = lt_cuda_check_launch(op, device);
  int blocks = lt_cuda_blocks(device, C);
  if (rc == 0 && p->dw) {
    sum_partials_kernel<A><<<blocks, LT_CUDA_THREADS, 0, stream>>>(p->dw, p->dw_dtype, pw, nchunks, C);
    rc = lt_cuda_check_launch(op, device);
  }
  if (rc == 0 && p->db) {
    sum_partials_kernel<A><<<blocks, LT_CUDA_THREADS, 0, stream>>>(p->db, p->db_dtype, pb, nchunks, C);
    rc = lt_cuda_check_launch(op, device);
  }
  /* the caching allocator orders the block's reuse after the work queued so far */
  lt_cuda_free(device, partial);
  return rc;
}

int lt_cuda_layer_norm_backward(const char *op, const lt_layer_norm_backward_plan *p) {
  LT_TRY(lt_cuda_use_device(op, p->device));
  if (p->N == 0) { /* no rows: dx is empty, the parameter gradients are zero */
    if (p->dw) LT_TRY(lt_cuda_fill_contig(p->device, p->dw, p->dw_dtype, p->C, 0.0));
    if (p->db) LT_TRY(lt_cuda_fill_contig(p->device, p->db, p->db_dtype, p->C, 0.0));
    return 0;
  }
  switch (p->dtype) {
  case LT_F32: return launch_backward<float>(op, p);
  case LT_F64: return launch_backward<double>(op, p);
  case LT_BF16: return launch_backward<lt_bf16_bits>(op, p);
  case LT_F16: return launch_backward<lt_f16_bits>(op, p);
  default: return lt_errorf("%s: dtype %s is not supported on cuda", op, lt_dtype_name(p->dtype));
  }
}
