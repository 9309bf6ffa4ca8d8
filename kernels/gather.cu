/* gather.cu — the gather plan on CUDA (kernels/gather.h has the recipe). Gather reads one element
 * per thread; scatter and scatter_add run one thread per line along dim, visiting the line in index
 * order as the CPU row does: no atomics, so sums are deterministic and bit-identical with the
 * CPU's (16-bit sums round after each addition there and here). */
#include "kernels/common.cuh"
extern "C" {
#include "kernels/gather.h"
}

namespace {

/* The plan's numbers by value, for the kernels' parameters. */
struct gather_geom {
  int ndim, dim, is64, mode;
  int64_t shape[8], ss[8], os[8], is[8];
};

__host__ __device__ inline int64_t load_index(const void *index, int is64, int64_t off) {
  return is64 ? ((const int64_t *)index)[off] : (int64_t)((const int32_t *)index)[off];
}

/* Element offsets of position `pos` (row-major over shape, with dim's coordinate fixed to 0 when
 * skip_dim) in self (without dim), other and index. */
__host__ __device__ inline void offsets(const gather_geom &g, int64_t pos, bool skip_dim, int64_t *so, int64_t *oo,
                                        int64_t *io) {
  int64_t s = 0, o = 0, i = 0;
  for (int d = g.ndim - 1; d >= 0; d--) {
    if (skip_dim && d == g.dim) continue;
    int64_t c = pos % g.shape[d];
    pos /= g.shape[d];
    i += c * g.is[d], o += c * g.os[d];
    if (d != g.dim) s += c * g.ss[d];
  }
  *so = s, *oo = o, *io = i;
}

template <typename T> __host__ __device__ inline T add(T a, T b) {
  if constexpr (lt_dev_dtype<T>::is_float)
    return lt_from_acc<T>(lt_to_acc(a) + lt_to_acc(b));
  else if constexpr (std::is_same<T, lt_bool_byte>::value)
    return {(uint8_t)(a.byte + b.byte)};
  else
    return (T)(a + b);
}

template <typename T>
__host__ __device__ inline void read_item(T *self, T *other, const void *index, const gather_geom &g, int64_t pos) {
  int64_t so, oo, io;
  offsets(g, pos, false, &so, &oo, &io);
  other[oo] = self[so + load_index(index, g.is64, io) * g.ss[g.dim]];
}

template <typename T>
__host__ __device__ inline void write_line(T *self, const T *other, const void *index, const gather_geom &g,
                                           int64_t line) {
  int64_t so, oo, io, n = g.shape[g.dim];
  offsets(g, line, true, &so, &oo, &io);
  for (int64_t j = 0; j < n; j++) {
    T *s = self + so + load_index(index, g.is64, io + j * g.is[g.dim]) * g.ss[g.dim];
    const T o = other[oo + j * g.os[g.dim]];
    if (g.mode == LT_GATHER_WRITE) {
      *s = o;
    } else if (g.mode == LT_GATHER_ADD) {
      *s = add(*s, o);
    } else { /* amax / amin, as the CPU row: compared as doubles, a NaN kept */
      double a = lt_dev_dtype<T>::load(*s), b = lt_dev_dtype<T>::load(o);
      bool keep = a != a || (g.mode == LT_GATHER_AMAX ? a >= b : a <= b);
      if (!keep) *s = o;
    }
  }
}

template <typename T> __global__ void read_kernel(T *self, T *other, const void *index, gather_geom g, int64_t total) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x)
    read_item(self, other, index, g, i);
}

template <typename T>
__global__ void write_kernel(T *self, const T *other, const void *index, gather_geom g, int64_t lines) {
  for (int64_t l = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; l < lines; l += (int64_t)gridDim.x * blockDim.x)
    write_line(self, other, index, g, l);
}

gather_geom make_geom(const lt_gather_plan *p) {
  gather_geom g = {p->ndim, p->dim, p->idtype == LT_I64, p->mode, {0}, {0}, {0}, {0}};
  for (int d = 0; d < p->ndim; d++)
    g.shape[d] = p->shape[d], g.ss[d] = p->self_stride[d], g.os[d] = p->other_stride[d], g.is[d] = p->index_stride[d];
  return g;
}

/* positions visited and lines along dim */
void counts(const lt_gather_plan *p, int64_t *total, int64_t *lines) {
  int64_t t = 1;
  for (int d = 0; d < p->ndim; d++) t *= p->shape[d];
  *total = t;
  *lines = p->shape[p->dim] ? t / p->shape[p->dim] : 0;
}

} // namespace

extern "C" int lt_cuda_gather(const lt_gather_plan *p) {
  const char *op = "gather";
  int64_t total, lines;
  counts(p, &total, &lines);
  if (total == 0) return 0;
  LT_TRY(lt_cuda_use_device(op, p->device));
  cudaStream_t s = lt_cuda_compute_stream(p->device);
  gather_geom g = make_geom(p);
  bool read = p->mode == LT_GATHER_READ;
  int blocks = lt_cuda_blocks(p->device, read ? total : lines);
  bool known = lt_with_dtype(p->dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (read)
      read_kernel<T><<<blocks, LT_CUDA_THREADS, 0, s>>>((T *)p->self, (T *)p->other, p->index, g, total);
    else
      write_kernel<T><<<blocks, LT_CUDA_THREADS, 0, s>>>((T *)p->self, (const T *)p->other, p->index, g, lines);
  });
  if (!known) return lt_errorf("%s: dtype %s is not supported on cuda", op, lt_dtype_name(p->dtype));
  return lt_cuda_check_launch(op, p->device);
}
