/* gather_cpu.c — the CPU row of the gather plan (kernels/gather.h has the recipe): tiles of lines
 * along dim in parallel (their writes never meet), each line in index order, so scatter's last
 * write and scatter_add's sums are the same for any thread count. */
#include "core/internal.h"
#include "ops/dtype_generic.h"
#include "ops/gather.h"

/* The CPU walks tiles: a tile is the positions that share every coordinate but dim's and inner's
 * (the last dim when it is not dim; none, inner = -1, when dim is last), with up to TILE_COLS
 * coordinates along inner, visited dim-major (j along dim, then c along inner), so that a line
 * along dim still sees its positions in index order while consecutive accesses run along the last
 * dim (contiguous rows for index_select and index_add along dim 0). */
static int inner_dim(const lt_gather_plan *p) { return p->dim == p->ndim - 1 ? -1 : p->ndim - 1; }

enum { TILE_COLS = 256 }; /* positions along inner per tile: tiles of one row still spread over threads */

/* Element offsets of tile `tile` (row-major over the dims but dim and inner, then inner's chunks of
 * TILE_COLS) in self, other and index; its first coordinate along inner in *c0. */
static void tile_offsets(const lt_gather_plan *p, int inner, int64_t tile, int64_t *so, int64_t *oo, int64_t *io,
                         int64_t *c0) {
  int64_t s = 0, o = 0, i = 0, chunks = inner < 0 ? 1 : (p->shape[inner] + TILE_COLS - 1) / TILE_COLS;
  *c0 = (tile % chunks) * TILE_COLS;
  tile /= chunks;
  if (inner >= 0) s = *c0 * p->self_stride[inner], o = *c0 * p->other_stride[inner], i = *c0 * p->index_stride[inner];
  for (int d = p->ndim - 1; d >= 0; d--) {
    if (d == p->dim || d == inner) continue;
    int64_t c = tile % p->shape[d];
    tile /= p->shape[d];
    s += c * p->self_stride[d], o += c * p->other_stride[d], i += c * p->index_stride[d];
  }
  *so = s, *oo = o, *io = i;
}

static inline int64_t index_at(const lt_gather_plan *p, int64_t off) {
  return p->idtype == LT_I64 ? ((const int64_t *)p->index)[off] : ((const int32_t *)p->index)[off];
}

/* One tile (see above): m positions along inner (strides of inner: ds, dot, di; 0 when none) per
 * position j along dim. amax and amin compare loaded values (LOAD: 16-bit bits to f32) and keep a
 * NaN, as PyTorch's. */
#define DEFINE_GATHER_TILE(T, S, ADD, LOAD)                                                                            \
  static void tile_##S(const lt_gather_plan *p, int inner, int64_t so, int64_t oo, int64_t io, int64_t c0) {           \
    T *self = (T *)p->self, *other = (T *)p->other;                                                                    \
    int64_t n = p->shape[p->dim], sstep = p->self_stride[p->dim], ostep = p->other_stride[p->dim];                     \
    int64_t istep = p->index_stride[p->dim], m = inner < 0 ? 1 : p->shape[inner] - c0;                                 \
    if (m > TILE_COLS) m = TILE_COLS;                                                                                  \
    int64_t ds = inner < 0 ? 0 : p->self_stride[inner], dot = inner < 0 ? 0 : p->other_stride[inner];                  \
    int64_t di = inner < 0 ? 0 : p->index_stride[inner];                                                               \
    for (int64_t j = 0; j < n; j++)                                                                                    \
      for (int64_t c = 0; c < m; c++) {                                                                                \
        T *s = self + so + c * ds + index_at(p, io + j * istep + c * di) * sstep;                                      \
        T *o = other + oo + j * ostep + c * dot;                                                                       \
        if (p->mode == LT_GATHER_READ) {                                                                               \
          *o = *s;                                                                                                     \
        } else if (p->mode == LT_GATHER_WRITE) {                                                                       \
          *s = *o;                                                                                                     \
        } else if (p->mode == LT_GATHER_ADD) {                                                                         \
          *s = ADD(*s, *o);                                                                                            \
        } else {                                                                                                       \
          double a = (double)LOAD(*s), b = (double)LOAD(*o);                                                           \
          bool keep = a != a || (p->mode == LT_GATHER_AMAX ? a >= b : a <= b);                                         \
          if (!keep) *s = *o;                                                                                          \
        }                                                                                                              \
      }                                                                                                                \
  }
#define PLAIN_ADD(a, b) ((a) + (b))
#define BF16_ADD(a, b) lt_f32_to_bf16(lt_bf16_to_f32(a) + lt_bf16_to_f32(b))
#define F16_ADD(a, b) lt_f32_to_f16(lt_f16_to_f32(a) + lt_f16_to_f32(b))
#define U8_ADD(a, b) ((uint8_t)((a) + (b)))
#define PLAIN_LOAD(a) (a)
DEFINE_GATHER_TILE(float, f32, PLAIN_ADD, PLAIN_LOAD)
DEFINE_GATHER_TILE(double, f64, PLAIN_ADD, PLAIN_LOAD)
DEFINE_GATHER_TILE(uint16_t, bf16, BF16_ADD, lt_bf16_to_f32)
DEFINE_GATHER_TILE(uint16_t, f16, F16_ADD, lt_f16_to_f32)
DEFINE_GATHER_TILE(int32_t, i32, PLAIN_ADD, PLAIN_LOAD)
DEFINE_GATHER_TILE(int64_t, i64, PLAIN_ADD, PLAIN_LOAD)
DEFINE_GATHER_TILE(uint8_t, u8, U8_ADD, PLAIN_LOAD)

typedef void (*gather_tile_fn)(const lt_gather_plan *p, int inner, int64_t so, int64_t oo, int64_t io, int64_t c0);

int lt_gather_cpu(const lt_gather_plan *p) {
  gather_tile_fn fn;
  switch (p->dtype) {
  case LT_F32: fn = tile_f32; break;
  case LT_F64: fn = tile_f64; break;
  case LT_BF16: fn = tile_bf16; break;
  case LT_F16: fn = tile_f16; break;
  case LT_I32: fn = tile_i32; break;
  case LT_I64: fn = tile_i64; break;
  default:
    if (lt_dtype_size(p->dtype) != 1) return lt_errorf("gather: dtype %s is not supported", lt_dtype_name(p->dtype));
    fn = tile_u8; /* bool, u8, i8: copies, and adds modulo 256 */
  }
  int inner = inner_dim(p);
  int64_t total = 1, tiles = 1;
  for (int d = 0; d < p->ndim; d++) {
    total *= p->shape[d];
    if (d != p->dim && d != inner) tiles *= p->shape[d];
  }
  if (inner >= 0) tiles *= (p->shape[inner] + TILE_COLS - 1) / TILE_COLS;
  if (total == 0) return 0;
  if (tiles > 1 && total >= LT_PAR_GRAIN) { /* no omp construct for small work: see ew_execute */
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < tiles; t++) {
      int64_t so, oo, io, c0;
      tile_offsets(p, inner, t, &so, &oo, &io, &c0);
      fn(p, inner, so, oo, io, c0);
    }
  } else {
    for (int64_t t = 0; t < tiles; t++) {
      int64_t so, oo, io, c0;
      tile_offsets(p, inner, t, &so, &oo, &io, &c0);
      fn(p, inner, so, oo, io, c0);
    }
  }
  return 0;
}
