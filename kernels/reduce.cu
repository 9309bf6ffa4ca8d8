/* reduce.cu — sum, mean, max, min, prod, norm, var and argmax/argmin of CUDA tensors, with
 * the semantics of host/ops/reduce.c and host/ops/argmax.c.
 *
 * The host plans the geometry (host/ops/reduce_geom.h): n_out outputs in kept-linear order, each
 * reducing n_red elements. Two kernel shapes follow from the innermost input dim:
 * - rows (it is reduced, more than ROWS_MIN elements an output): a warp (short reductions) or
 *   a block (long ones) per output, threads striding over its elements, 128-bit loads when
 *   the run is contiguous, then a warp or block combine.
 * - cols (it is kept, or outputs of a few elements): a thread per output, consecutive threads
 *   on consecutive outputs (so a warp reads neighbouring elements), each looping over the
 *   reduced elements in order.
 * When the outputs are too few to fill the device, each reduction is split into S chunks
 * (more warps/blocks for rows, grid y for cols) whose partial results go to a scratch
 * buffer, and reduce_finish combines them in chunk order (the two-pass path; a whole-tensor
 * sum is the extreme case).
 *
 * Floats accumulate in double and integers in int64 with wrapping, as on the CPU. The order
 * is a tree instead of the CPU's blocks, so a float result may differ from the CPU's by the
 * rounding of a double sum (in practice: at most an ulp of the output dtype, usually none);
 * max/min (a NaN wins) and integer results are bit-identical. argmax/argmin give the first
 * NaN, else the first index of the extreme value: bit-identical too. */
#include "kernels/common.cuh"
#include <algorithm>
#include <stdlib.h>
#include <type_traits>
extern "C" {
#include "kernels/reduce.h"
}

/* What is accumulated (as host/ops/reduce.c's acc_op) and how a result is finished. */
enum { ACC_SUM, ACC_SUMSQ, ACC_SQDEV, ACC_PROD, ACC_MAX, ACC_MIN };
enum { FIN_NONE, FIN_DIV, FIN_SQRT };

struct red_args {
  lt_cuda_red_geom g;
  const void *in;
  void *out;            /* out's element [0,...,0], or a double buffer (kept-linear) when out_linear */
  const double *center; /* per output (kept-linear), for ACC_SQDEV */
  void *partial;        /* n_out * S accumulators (output o, chunk s at o * S + s), or NULL */
  int64_t S;            /* chunks per output */
  int acc, fin, out_linear;
  double denom; /* FIN_DIV: the result is divided by it */
};

/* ---- accumulation: double for floats, int64 for integers (u8 and bool read as bytes) ---- */

template <typename T> using acc_t = typename std::conditional<lt_dev_dtype<T>::is_float, double, int64_t>::type;

template <typename T> __device__ __forceinline__ acc_t<T> load_acc(T x) {
  if constexpr (std::is_same<T, lt_bool_byte>::value)
    return (int64_t)x.byte;
  else if constexpr (lt_dev_dtype<T>::is_float)
    return lt_dev_dtype<T>::load(x);
  else
    return (int64_t)x;
}

template <typename A> __device__ __forceinline__ A acc_init(int op);
template <> __device__ __forceinline__ double acc_init<double>(int op) {
  return op == ACC_PROD ? 1.0 : op == ACC_MAX ? -INFINITY : op == ACC_MIN ? INFINITY : 0.0;
}
template <> __device__ __forceinline__ int64_t acc_init<int64_t>(int op) {
  return op == ACC_PROD ? 1 : op == ACC_MAX ? INT64_MIN : op == ACC_MIN ? INT64_MAX : 0;
}

/* One more element x; once acc is NaN, max/min keep a NaN. */
__device__ __forceinline__ double acc_step(int op, double acc, double x, double center) {
  switch (op) {
  case ACC_SUMSQ: return acc + x * x;
  case ACC_SQDEV: {
    double d = x - center;
    return acc + d * d;
  }
  case ACC_PROD: return acc * x;
  case ACC_MAX: return (x > acc || x != x) ? x : acc;
  case ACC_MIN: return (x < acc || x != x) ? x : acc;
  default: return acc + x;
  }
}
__device__ __forceinline__ int64_t acc_step(int op, int64_t acc, int64_t x, double) {
  switch (op) {
  case ACC_PROD: return (int64_t)((uint64_t)acc * (uint64_t)x); /* wraps as the CPU, no UB */
  case ACC_MAX: return x > acc ? x : acc;
  case ACC_MIN: return x < acc ? x : acc;
  default: return (int64_t)((uint64_t)acc + (uint64_t)x);
  }
}

/* Two partial results (as the CPU's combine_f / combine_i). */
__device__ __forceinline__ double acc_combine(int op, double a, double b) {
  switch (op) {
  case ACC_PROD: return a * b;
  case ACC_MAX: return a != a || b != b ? (double)NAN : (b > a ? b : a);
  case ACC_MIN: return a != a || b != b ? (double)NAN : (b < a ? b : a);
  default: return a + b;
  }
}
__device__ __forceinline__ int64_t acc_combine(int op, int64_t a, int64_t b) { return acc_step(op, a, b, 0); }

template <typename A> __device__ __forceinline__ A warp_combine(int op, A v) {
  for (int offset = 16; offset > 0; offset >>= 1) v = acc_combine(op, v, (A)__shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

/* Across the block (blockDim.x a multiple of 32, <= 1024); every thread gets the result. */
template <typename A> __device__ __forceinline__ A block_combine(int op, A v, A *scratch) {
  int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
  v = warp_combine(op, v);
  __syncthreads(); /* scratch may still be read by the previous task's combine */
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nwarps ? scratch[lane] : acc_init<A>(op);
  return warp_combine(op, v);
}

/* The finished result o into out, as the CPU's store_one (lt_store_f64 rules for floats,
 * truncating casts for integers, != 0 for bool). */
template <typename T> __device__ __forceinline__ void store_out(const red_args &a, int64_t o, acc_t<T> v) {
  if constexpr (lt_dev_dtype<T>::is_float) {
    double r = v;
    if (a.fin == FIN_DIV)
      r /= a.denom;
    else if (a.fin == FIN_SQRT)
      r = sqrt(r);
    if (a.out_linear) {
      ((double *)a.out)[o] = r;
      return;
    }
    ((T *)a.out)[lt_dev_offset(o, a.g.nkept, a.g.kshape, a.g.kout)] = lt_dev_dtype<T>::store(r);
  } else {
    T *p = (T *)a.out + lt_dev_offset(o, a.g.nkept, a.g.kshape, a.g.kout);
    if constexpr (std::is_same<T, lt_bool_byte>::value)
      *p = lt_bool_byte{(uint8_t)(v != 0)};
    else
      *p = (T)v;
  }
}

/* Accumulates p[0..n) (contiguous) over lanes lane, lane + group, ...: an unaligned head,
 * 128-bit vectors, a tail. */
template <typename T, typename A>
__device__ __forceinline__ A run_contig(int op, A acc, const T *p, int64_t n, int lane, int group, double center) {
  constexpr int N = 16 / sizeof(T);
  uintptr_t addr = (uintptr_t)p;
  int64_t head = n, nv = 0;
  if (addr % sizeof(T) == 0) {
    int64_t mis = (int64_t)((addr / sizeof(T)) % N);
    head = mis ? N - mis : 0;
    if (head > n) head = n;
    nv = (n - head) / N;
  }
  for (int64_t i = lane; i < head; i += group) acc = acc_step(op, acc, load_acc(p[i]), center);
  const lt_dev_vec<T, N> *pv = reinterpret_cast<const lt_dev_vec<T, N> *>(p + head);
  for (int64_t i = lane; i < nv; i += group) {
    lt_dev_vec<T, N> v = pv[i];
#pragma unroll
    for (int k = 0; k < N; k++) acc = acc_step(op, acc, load_acc(v.v[k]), center);
  }
  for (int64_t i = head + nv * N + lane; i < n; i += group) acc = acc_step(op, acc, load_acc(p[i]), center);
  return acc;
}

/* ---- the kernels ----------------------------------------------------------------------- */

/* Task t = o * S + s: chunk s of output o, done by a group of `group` threads (32: a warp;
 * blockDim.x: the block). Loop bounds are uniform over each group, as the combines need. */
template <typename T>
__global__ void __launch_bounds__(512) reduce_rows(const __grid_constant__ red_args a, int group) {
  using A = acc_t<T>;
  __shared__ A scratch[32];
  const T *in = (const T *)a.in;
  int lane = threadIdx.x % group;
  int64_t per_block = blockDim.x / group, ntasks = a.g.n_out * a.S;
  for (int64_t t = blockIdx.x * per_block + threadIdx.x / group; t < ntasks; t += gridDim.x * per_block) {
    int64_t o = t / a.S, s = t % a.S;
    int64_t r0 = a.g.n_red * s / a.S, r1 = a.g.n_red * (s + 1) / a.S;
    double center = a.acc == ACC_SQDEV ? a.center[o] : 0.0;
    int64_t base = lt_dev_offset(o, a.g.nkept, a.g.kshape, a.g.kstride);
    A acc = acc_init<A>(a.acc);
    if (a.g.nred == 1) {
      int64_t rs = a.g.rstride[0], n = r1 - r0;
      const T *p = in + base + r0 * rs;
      if (rs == 1)
        acc = run_contig(a.acc, acc, p, n, lane, group, center);
      else
        for (int64_t i = lane; i < n; i += group) acc = acc_step(a.acc, acc, load_acc(p[i * rs]), center);
    } else {
      for (int64_t r = r0 + lane; r < r1; r += group)
        acc = acc_step(a.acc, acc, load_acc(in[base + lt_dev_offset(r, a.g.nred, a.g.rshape, a.g.rstride)]), center);
    }
    acc = group == 32 ? warp_combine(a.acc, acc) : block_combine(a.acc, acc, scratch);
    if (lane == 0) {
      if (a.partial)
        ((A *)a.partial)[t] = acc;
      else
        store_out<T>(a, o, acc);
    }
  }
}

/* Thread per output o (grid x, strided), chunk s = blockIdx.y of its reduction, in order. */
template <typename T> __global__ void __launch_bounds__(256) reduce_cols(const __grid_constant__ red_args a) {
  using A = acc_t<T>;
  const T *in = (const T *)a.in;
  int64_t s = blockIdx.y, r0 = a.g.n_red * s / a.S, r1 = a.g.n_red * (s + 1) / a.S;
  int nred = a.g.nred;
  for (int64_t o = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; o < a.g.n_out;
       o += (int64_t)gridDim.x * blockDim.x) {
    double center = a.acc == ACC_SQDEV ? a.center[o] : 0.0;
    const T *p = in + lt_dev_offset(o, a.g.nkept, a.g.kshape, a.g.kstride);
    A acc = acc_init<A>(a.acc);
    if (r0 < r1 && nred == 1) {
      int64_t rs = a.g.rstride[0];
      for (int64_t r = r0; r < r1; r++) acc = acc_step(a.acc, acc, load_acc(p[r * rs]), center);
    } else if (r0 < r1) { /* an odometer over the reduced dims (none is 0 when r0 < r1) */
      int64_t idx[LT_MAX_DIMS], off = 0, flat = r0;
      for (int d = nred - 1; d >= 0; d--) {
        idx[d] = flat % a.g.rshape[d];
        flat /= a.g.rshape[d];
        off += idx[d] * a.g.rstride[d];
      }
      for (int64_t r = r0; r < r1; r++) {
        acc = acc_step(a.acc, acc, load_acc(p[off]), center);
        for (int d = nred - 1; d >= 0; d--) {
          off += a.g.rstride[d];
          if (++idx[d] < a.g.rshape[d]) break;
          off -= idx[d] * a.g.rstride[d];
          idx[d] = 0;
        }
      }
    }
    if (a.partial)
      ((A *)a.partial)[o * a.S + s] = acc;
    else
      store_out<T>(a, o, acc);
  }
}

/* Combines each output's S partials in chunk order and finishes it. */
template <typename T> __global__ void __launch_bounds__(256) reduce_finish(const __grid_constant__ red_args a) {
  using A = acc_t<T>;
  const A *part = (const A *)a.partial;
  for (int64_t o = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; o < a.g.n_out;
       o += (int64_t)gridDim.x * blockDim.x) {
    A acc = part[o * a.S];
    for (int64_t s = 1; s < a.S; s++) acc = acc_combine(a.acc, acc, part[o * a.S + s]);
    store_out<T>(a, o, acc);
  }
}

/* ---- launch ------------------------------------------------------------------------------- */

enum {
  ROWS_MIN = 16,
  ROW_WARP_MAX = 1024,
  ROW_BLOCK = 512,
  ROW_CHUNK_MIN = 8192,
  COL_CHUNK_MIN = 32,
  MAX_SPLIT = 65535
};

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
static int64_t clamp64(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : v > hi ? hi : v; }

/* Rows (a warp or block per output) when the innermost dim is reduced, unless each output
 * reduces only a few elements: then a thread per output wastes less (the cols kernel takes
 * any geometry with one reduced dim). */
static bool use_rows(const lt_cuda_red_geom &g) { return g.inner && (g.n_red > ROWS_MIN || g.nred != 1); }

/* Blocks of 256 threads that fill the device (8 per SM). */
static int64_t device_fill(int device) { return lt_cuda_blocks(device, (int64_t)1 << 40); }

/* One reduction pass (a.acc, a.fin, a.out set by the caller); partials when it splits. */
template <typename T> static int run_pass(const char *op, int device, red_args a) {
  cudaStream_t stream = lt_cuda_compute_stream(device);
  const lt_cuda_red_geom &g = a.g;
  int64_t fill = device_fill(device), S = 1, blocks;
  int threads, group = 32;
  bool rows = use_rows(g);
  if (rows) {
    if (g.n_red > ROW_WARP_MAX) {
      group = ROW_BLOCK;
      if (g.n_out < fill)
        S = clamp64(std::min(ceil_div(fill, g.n_out), ceil_div(g.n_red, ROW_CHUNK_MIN)), 1, MAX_SPLIT);
    }
    threads = group == 32 ? 256 : ROW_BLOCK;
    blocks = clamp64(ceil_div(g.n_out * S, threads / group), 1, fill * 4);
  } else {
    threads = g.n_out < 256 ? (int)ceil_div(g.n_out, 32) * 32 : 256;
    blocks = clamp64(ceil_div(g.n_out, threads), 1, fill * 4);
    int64_t busy = blocks * threads, want = fill * 256;
    if (busy < want) S = clamp64(std::min(ceil_div(want, busy), ceil_div(g.n_red, COL_CHUNK_MIN)), 1, MAX_SPLIT);
  }
  a.S = S;
  a.partial = NULL;
  void *partial = NULL;
  if (S > 1) {
    LT_TRY(lt_cuda_alloc(device, g.n_out * S * (int64_t)sizeof(acc_t<T>), &partial));
    a.partial = partial;
  }
  if (rows)
    reduce_rows<T><<<(unsigned)blocks, threads, 0, stream>>>(a, group);
  else
    reduce_cols<T><<<dim3((unsigned)blocks, (unsigned)S), threads, 0, stream>>>(a);
  int rc = lt_cuda_check_launch(op, device);
  if (rc == 0 && S > 1) {
    reduce_finish<T><<<lt_cuda_blocks(device, g.n_out), LT_CUDA_THREADS, 0, stream>>>(a);
    rc = lt_cuda_check_launch(op, device);
  }
  lt_cuda_free(device, partial); /* stream-ordered: reused only after these kernels */
  return rc;
}

template <typename T>
static int run_reduce(const char *op, int device, const lt_cuda_red_geom *g, const void *in, void *out, int what,
                      double var_denom) {
  red_args a;
  memset(&a, 0, sizeof a);
  a.g = *g;
  a.in = in;
  a.out = out;
  if (what != LT_CUDA_REDUCE_VAR) {
    static const int acc_of[LT_NUM_REDUCE_OPS] = {ACC_SUM, ACC_SUM, ACC_MAX, ACC_MIN, ACC_PROD, ACC_SUMSQ};
    a.acc = acc_of[what];
    a.fin = what == LT_MEAN ? FIN_DIV : what == LT_NORM ? FIN_SQRT : FIN_NONE;
    a.denom = (double)g->n_red; /* 0/0 is nan for an empty dim, as the CPU */
    return run_pass<T>(op, device, a);
  }
  if constexpr (lt_dev_dtype<T>::is_float) {
    /* two passes as the CPU: the mean (kept-linear doubles), then squared deviations from it */
    double *mean = NULL;
    LT_TRY(lt_cuda_alloc(device, g->n_out * (int64_t)sizeof(double), (void **)&mean));
    red_args m = a;
    m.acc = ACC_SUM, m.fin = FIN_DIV, m.denom = (double)g->n_red, m.out = mean, m.out_linear = 1;
    int rc = run_pass<T>(op, device, m);
    if (rc == 0) {
      a.acc = ACC_SQDEV, a.fin = FIN_DIV, a.denom = var_denom, a.center = mean;
      rc = run_pass<T>(op, device, a);
    }
    lt_cuda_free(device, mean);
    return rc;
  } else {
    return lt_errorf("%s: needs a floating dtype", op);
  }
}

int lt_cuda_reduce(const char *op, int device, const lt_cuda_red_geom *g, const void *in, void *out, int dtype,
                   int what, double var_denom) {
  if (g->n_out == 0) return 0;
  LT_TRY(lt_cuda_use_device(op, device));
  int rc = -1;
  bool known = lt_with_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    rc = run_reduce<T>(op, device, g, in, out, what, var_denom);
  });
  return known ? rc : lt_errorf("%s: unknown dtype %d", op, dtype);
}

/* ---- argmax / argmin ------------------------------------------------------------------------ */

/* A candidate: its value (floats as double, integers as int64) and index (-1: none). */
struct arg_best {
  double f;
  int64_t i, idx;
};

/* Is a to be preferred to b? A NaN beats any number, a larger (smaller) value beats a
 * smaller one, and between equals the lower index wins: the CPU's first NaN, else first
 * extreme, whatever order the candidates meet in. */
template <bool IS_INT> __device__ __forceinline__ bool arg_better(const arg_best &a, const arg_best &b, bool is_max) {
  if (a.idx < 0) return false;
  if (b.idx < 0) return true;
  if constexpr (IS_INT) {
    if (a.i != b.i) return is_max ? a.i > b.i : a.i < b.i;
  } else {
    bool an = a.f != a.f, bn = b.f != b.f;
    if (an || bn) return an && (!bn || a.idx < b.idx);
    if (a.f != b.f) return is_max ? a.f > b.f : a.f < b.f;
  }
  return a.idx < b.idx;
}

template <typename T> __device__ __forceinline__ arg_best arg_of(T x, int64_t idx) {
  arg_best c;
  if constexpr (lt_dev_dtype<T>::is_float)
    c.f = load_acc(x), c.i = 0;
  else
    c.f = 0, c.i = load_acc(x);
  c.idx = idx;
  return c;
}

template <bool IS_INT> __device__ __forceinline__ arg_best arg_shfl_merge(arg_best v, int offset, bool is_max) {
  arg_best o;
  o.f = __shfl_xor_sync(0xffffffffu, v.f, offset);
  o.i = __shfl_xor_sync(0xffffffffu, v.i, offset);
  o.idx = __shfl_xor_sync(0xffffffffu, v.idx, offset);
  return arg_better<IS_INT>(o, v, is_max) ? o : v;
}

template <bool IS_INT> __device__ __forceinline__ arg_best arg_warp(arg_best v, bool is_max) {
  for (int offset = 16; offset > 0; offset >>= 1) v = arg_shfl_merge<IS_INT>(v, offset, is_max);
  return v;
}

template <bool IS_INT> __device__ __forceinline__ arg_best arg_block(arg_best v, arg_best *scratch, bool is_max) {
  int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
  v = arg_warp<IS_INT>(v, is_max);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (lane < nwarps)
    v = scratch[lane];
  else
    v.f = 0, v.i = 0, v.idx = -1;
  return arg_warp<IS_INT>(v, is_max);
}

struct arg_args {
  lt_cuda_red_geom g;
  const void *in;
  int64_t *out;
  arg_best *partial; /* n_out * S, or NULL */
  int64_t S;
  int is_max;
};

/* Task t = o * S + s, as reduce_rows. Index r along the reduced dim (rshape[0] long at rstride[0]),
 * or the flat row-major index over the reduced dims of a whole-tensor argmax. */
template <typename T> __global__ void __launch_bounds__(512) arg_rows(const __grid_constant__ arg_args a, int group) {
  constexpr bool IS_INT = !lt_dev_dtype<T>::is_float;
  __shared__ arg_best scratch[32];
  const T *in = (const T *)a.in;
  int lane = threadIdx.x % group;
  int64_t per_block = blockDim.x / group, ntasks = a.g.n_out * a.S, n = a.g.n_red, rs = a.g.rstride[0];
  for (int64_t t = blockIdx.x * per_block + threadIdx.x / group; t < ntasks; t += gridDim.x * per_block) {
    int64_t o = t / a.S, s = t % a.S, r0 = n * s / a.S, r1 = n * (s + 1) / a.S;
    const T *p = in + lt_dev_offset(o, a.g.nkept, a.g.kshape, a.g.kstride);
    arg_best b = {0, 0, -1};
    for (int64_t r = r0 + lane; r < r1; r += group) { /* increasing r: ties keep the first */
      arg_best c = arg_of(a.g.nred == 1 ? p[r * rs] : p[lt_dev_offset(r, a.g.nred, a.g.rshape, a.g.rstride)], r);
      if (arg_better<IS_INT>(c, b, a.is_max)) b = c;
    }
    b = group == 32 ? arg_warp<IS_INT>(b, a.is_max) : arg_block<IS_INT>(b, scratch, a.is_max);
    if (lane == 0) {
      if (a.partial)
        a.partial[t] = b;
      else
        a.out[lt_dev_offset(o, a.g.nkept, a.g.kshape, a.g.kout)] = b.idx;
    }
  }
}

template <typename T> __global__ void __launch_bounds__(256) arg_cols(const __grid_constant__ arg_args a) {
  constexpr bool IS_INT = !lt_dev_dtype<T>::is_float;
  const T *in = (const T *)a.in;
  int64_t n = a.g.n_red, rs = a.g.rstride[0], s = blockIdx.y, r0 = n * s / a.S, r1 = n * (s + 1) / a.S;
  for (int64_t o = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; o < a.g.n_out;
       o += (int64_t)gridDim.x * blockDim.x) {
    const T *p = in + lt_dev_offset(o, a.g.nkept, a.g.kshape, a.g.kstride);
    arg_best b = {0, 0, -1};
    for (int64_t r = r0; r < r1; r++) {
      arg_best c = arg_of(p[r * rs], r);
      if (arg_better<IS_INT>(c, b, a.is_max)) b = c;
    }
    if (a.partial)
      a.partial[o * a.S + s] = b;
    else
      a.out[lt_dev_offset(o, a.g.nkept, a.g.kshape, a.g.kout)] = b.idx;
  }
}

template <bool IS_INT> __global__ void __launch_bounds__(256) arg_finish(const __grid_constant__ arg_args a) {
  for (int64_t o = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; o < a.g.n_out;
       o += (int64_t)gridDim.x * blockDim.x) {
    arg_best b = a.partial[o * a.S];
    for (int64_t s = 1; s < a.S; s++)
      if (arg_better<IS_INT>(a.partial[o * a.S + s], b, a.is_max)) b = a.partial[o * a.S + s];
    a.out[lt_dev_offset(o, a.g.nkept, a.g.kshape, a.g.kout)] = b.idx;
  }
}

template <typename T> static int run_arg(const char *op, int device, arg_args a) {
  cudaStream_t stream = lt_cuda_compute_stream(device);
  const lt_cuda_red_geom &g = a.g;
  int64_t fill = device_fill(device), S = 1, blocks;
  int threads, group = 32;
  bool rows = use_rows(g);
  if (rows) {
    if (g.n_red > ROW_WARP_MAX) {
      group = ROW_BLOCK;
      if (g.n_out < fill)
        S = clamp64(std::min(ceil_div(fill, g.n_out), ceil_div(g.n_red, ROW_CHUNK_MIN)), 1, MAX_SPLIT);
    }
    threads = group == 32 ? 256 : ROW_BLOCK;
    blocks = clamp64(ceil_div(g.n_out * S, threads / group), 1, fill * 4);
  } else {
    threads = g.n_out < 256 ? (int)ceil_div(g.n_out, 32) * 32 : 256;
    blocks = clamp64(ceil_div(g.n_out, threads), 1, fill * 4);
    int64_t busy = blocks * threads, want = fill * 256;
    if (busy < want) S = clamp64(std::min(ceil_div(want, busy), ceil_div(g.n_red, COL_CHUNK_MIN)), 1, MAX_SPLIT);
  }
  a.S = S;
  a.partial = NULL;
  if (S > 1) LT_TRY(lt_cuda_alloc(device, g.n_out * S * (int64_t)sizeof(arg_best), (void **)&a.partial));
  if (rows)
    arg_rows<T><<<(unsigned)blocks, threads, 0, stream>>>(a, group);
  else
    arg_cols<T><<<dim3((unsigned)blocks, (unsigned)S), threads, 0, stream>>>(a);
  int rc = lt_cuda_check_launch(op, device);
  if (rc == 0 && S > 1) {
    constexpr bool is_int = !lt_dev_dtype<T>::is_float;
    arg_finish<is_int><<<lt_cuda_blocks(device, g.n_out), LT_CUDA_THREADS, 0, stream>>>(a);
    rc = lt_cuda_check_launch(op, device);
  }
  lt_cuda_free(device, a.partial);
  return rc;
}

int lt_cuda_argreduce(const char *op, int device, const lt_cuda_red_geom *g, const void *in, int dtype, int64_t *out,
                      int is_max) {
  if (g->n_out == 0) return 0;
  if (!g->inner && g->nred != 1) return lt_errorf("%s: internal error: %d reduced dims", op, g->nred);
  LT_TRY(lt_cuda_use_device(op, device));
  arg_args a;
  memset(&a, 0, sizeof a);
  a.g = *g, a.in = in, a.out = out, a.is_max = is_max != 0;
  int rc = -1;
  bool known = lt_with_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    rc = run_arg<T>(op, device, a);
  });
  return known ? rc : lt_errorf("%s: unknown dtype %d", op, dtype);
}
