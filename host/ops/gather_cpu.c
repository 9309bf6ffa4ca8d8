/* gather_cpu.c — the CPU row of the gather plan (kernels/gather.h has the recipe): one line along
 * dim per iteration, lines in parallel (their writes never meet), each line in index order, so
 * scatter's last write and scatter_add's sums are the same for any thread count. */
#include "core/internal.h"
#include "ops/dtype_generic.h"
#include "ops/gather.h"

/* Element offsets of line `line` (its coordinate along dim 0) in self, other and index. */
static void line_offsets(const lt_gather_plan *p, int64_t line, int64_t *so, int64_t *oo, int64_t *io) {
  int64_t s = 0, o = 0, i = 0;
  for (int d = p->ndim - 1; d >= 0; d--) {
    if (d == p->dim) continue;
    int64_t c = line % p->shape[d];
    line /= p->shape[d];
    s += c * p->self_stride[d], o += c * p->other_stride[d], i += c * p->index_stride[d];
  }
  *so = s, *oo = o, *io = i;
}

static inline int64_t index_at(const lt_gather_plan *p, int64_t off) {
  return p->idtype == LT_I64 ? ((const int64_t *)p->index)[off] : ((const int32_t *)p->index)[off];
}

/* One line: n positions, j-th at index offset io + j * istep, other offset oo + j * ostep. amax and
 * amin compare loaded values (LOAD: 16-bit bits to f32) and keep a NaN, as PyTorch's. */
#define DEFINE_GATHER_LINE(T, S, ADD, LOAD)                                                                            \
  static void line_##S(const lt_gather_plan *p, int64_t so, int64_t oo, int64_t io) {                                  \
    T *self = (T *)p->self, *other = (T *)p->other;                                                                    \
    int64_t n = p->shape[p->dim], sstep = p->self_stride[p->dim], ostep = p->other_stride[p->dim];                     \
    int64_t istep = p->index_stride[p->dim];                                                                           \
    for (int64_t j = 0; j < n; j++) {                                                                                  \
      T *s = self + so + index_at(p, io + j * istep) * sstep, *o = other + oo + j * ostep;                             \
      if (p->mode == LT_GATHER_READ) {                                                                                 \
        *o = *s;                                                                                                       \
      } else if (p->mode == LT_GATHER_WRITE) {                                                                         \
        *s = *o;                                                                                                       \
      } else if (p->mode == LT_GATHER_ADD) {                                                                           \
        *s = ADD(*s, *o);                                                                                              \
      } else {                                                                                                         \
        double a = (double)LOAD(*s), b = (double)LOAD(*o);                                                             \
        bool keep = a != a || (p->mode == LT_GATHER_AMAX ? a >= b : a <= b);                                           \
        if (!keep) *s = *o;                                                                                            \
      }                                                                                                                \
    }                                                                                                                  \
  }
#define PLAIN_ADD(a, b) ((a) + (b))
#define BF16_ADD(a, b) lt_f32_to_bf16(lt_bf16_to_f32(a) + lt_bf16_to_f32(b))
#define F16_ADD(a, b) lt_f32_to_f16(lt_f16_to_f32(a) + lt_f16_to_f32(b))
#define U8_ADD(a, b) ((uint8_t)((a) + (b)))
#define PLAIN_LOAD(a) (a)
DEFINE_GATHER_LINE(float, f32, PLAIN_ADD, PLAIN_LOAD)
DEFINE_GATHER_LINE(double, f64, PLAIN_ADD, PLAIN_LOAD)
DEFINE_GATHER_LINE(uint16_t, bf16, BF16_ADD, lt_bf16_to_f32)
DEFINE_GATHER_LINE(uint16_t, f16, F16_ADD, lt_f16_to_f32)
DEFINE_GATHER_LINE(int32_t, i32, PLAIN_ADD, PLAIN_LOAD)
DEFINE_GATHER_LINE(int64_t, i64, PLAIN_ADD, PLAIN_LOAD)
DEFINE_GATHER_LINE(uint8_t, u8, U8_ADD, PLAIN_LOAD)

typedef void (*gather_line_fn)(const lt_gather_plan *p, int64_t so, int64_t oo, int64_t io);

int lt_gather_cpu(const lt_gather_plan *p) {
  gather_line_fn fn;
  switch (p->dtype) {
  case LT_F32: fn = line_f32; break;
  case LT_F64: fn = line_f64; break;
  case LT_BF16: fn = line_bf16; break;
  case LT_F16: fn = line_f16; break;
  case LT_I32: fn = line_i32; break;
  case LT_I64: fn = line_i64; break;
  default:
    if (lt_dtype_size(p->dtype) != 1) return lt_errorf("gather: dtype %s is not supported", lt_dtype_name(p->dtype));
    fn = line_u8; /* bool, u8, i8: copies, and adds modulo 256 */
  }
  int64_t n = p->shape[p->dim], lines = 1;
  for (int d = 0; d < p->ndim; d++)
    if (d != p->dim) lines *= p->shape[d];
  if (n == 0 || lines == 0) return 0;
  if (lines > 1 && lines * n >= LT_PAR_GRAIN) { /* no omp construct for small work: see ew_execute */
#pragma omp parallel for schedule(static)
    for (int64_t l = 0; l < lines; l++) {
      int64_t so, oo, io;
      line_offsets(p, l, &so, &oo, &io);
      fn(p, so, oo, io);
    }
  } else {
    for (int64_t l = 0; l < lines; l++) {
      int64_t so, oo, io;
      line_offsets(p, l, &so, &oo, &io);
      fn(p, so, oo, io);
    }
  }
  return 0;
}
