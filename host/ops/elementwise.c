/* elementwise.c — the loop driver of the elementwise ops (runs along the innermost
 * dim, split across threads) and the 16-bit float block conversions they share. */
#include "ops/elementwise.h"
#include "ops/backend.h"
#include <stdlib.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#ifdef __F16C__
#include <immintrin.h>
#endif

static void offsets_of(int64_t r, int nd, const int64_t *sh, int nops, int64_t (*st)[LT_MAX_DIMS], int64_t *off) {
  for (int k = 0; k < nops; k++) off[k] = 0;
  for (int d = nd - 1; d >= 0; d--) {
    int64_t i = r % sh[d];
    r /= sh[d];
    for (int k = 0; k < nops; k++) off[k] += i * st[k][d];
  }
}

enum { TILE_ROWS = 32, TILE_COLS = 256 };

/* True when an operand walks the innermost dim with a large stride but the one before it
 * with a small one (a transpose): row-by-row runs would touch a new cache line per element. */
static bool wants_tiles(int nd, const int64_t *sh, int nops, int64_t (*st)[LT_MAX_DIMS]) {
  if (nd < 2 || sh[nd - 1] < TILE_COLS || sh[nd - 2] < TILE_ROWS) return false;
  for (int k = 0; k < nops; k++) {
    int64_t inner = llabs(st[k][nd - 1]), outer = llabs(st[k][nd - 2]);
    if (inner >= 16 && outer < inner) return true;
  }
  return false;
}

/* The last two dims in tiles of TILE_ROWS x TILE_COLS: the lines a tile reads of the
 * transposed operand stay in cache while its rows are walked. */
static void execute_tiled(int nd, const int64_t *sh, int nops, char *const *base, const int *esize,
                          int64_t (*st)[LT_MAX_DIMS], ew_kernel kernel, const void *ctx, int nthreads) {
  int64_t nrows = sh[nd - 2], ncols = sh[nd - 1], outer = lt_shape_numel(nd - 2, sh);
  int64_t row_tiles = (nrows + TILE_ROWS - 1) / TILE_ROWS, col_tiles = (ncols + TILE_COLS - 1) / TILE_COLS;
  int64_t tasks = outer * row_tiles * col_tiles;
#pragma omp parallel for schedule(static) if (nthreads > 1)
  for (int64_t t = 0; t < tasks; t++) {
    int64_t r = t / (row_tiles * col_tiles), i0 = (t / col_tiles) % row_tiles * TILE_ROWS;
    int64_t j0 = t % col_tiles * TILE_COLS, n = ncols - j0 < TILE_COLS ? ncols - j0 : TILE_COLS;
    int64_t off[EW_MAX_OPERANDS], step[EW_MAX_OPERANDS];
    offsets_of(r, nd - 2, sh, nops, st, off);
    char *ptr[EW_MAX_OPERANDS];
    for (int64_t i = i0; i < nrows && i < i0 + TILE_ROWS; i++) {
      for (int k = 0; k < nops; k++) {
        step[k] = st[k][nd - 1];
        ptr[k] = base[k] + (off[k] + i * st[k][nd - 2] + j0 * step[k]) * esize[k];
      }
      kernel(ctx, ptr, step, n);
    }
  }
}

/* One task of ew_execute: `chunk` elements of row t / per_row. */
static inline void run_task(int64_t t, int64_t per_row, int64_t chunk, int64_t inner, int nd, const int64_t *sh,
                            int nops, char *const *base, const int *esize, int64_t (*st)[LT_MAX_DIMS], ew_kernel kernel,
                            const void *ctx) {
  int64_t r = t / per_row, i0 = (t % per_row) * chunk;
  int64_t n = inner - i0 < chunk ? inner - i0 : chunk;
  int64_t off[EW_MAX_OPERANDS], step[EW_MAX_OPERANDS];
  offsets_of(r, nd - 1, sh, nops, st, off);
  char *ptr[EW_MAX_OPERANDS];
  for (int k = 0; k < nops; k++) {
    step[k] = st[k][nd - 1];
    ptr[k] = base[k] + (off[k] + i0 * step[k]) * esize[k];
  }
  kernel(ctx, ptr, step, n);
}

void ew_execute(int ndim, const int64_t *shape, int nops, char *const *base, const int *esize,
                const int64_t (*strides)[LT_MAX_DIMS], ew_kernel kernel, const void *ctx, int64_t grain) {
  int64_t sh[LT_MAX_DIMS], st[EW_MAX_OPERANDS][LT_MAX_DIMS];
  int nd = lt_ew_coalesce(ndim, shape, nops, strides, sh, st);
  if (nd == 0) return;
  int64_t inner = sh[nd - 1], rows = lt_shape_numel(nd - 1, sh), numel = rows * inner;
  int nthreads = 1;
#ifdef _OPENMP
  if (numel >= grain) nthreads = omp_get_max_threads();
#endif
  if (wants_tiles(nd, sh, nops, st)) return execute_tiled(nd, sh, nops, base, esize, st, kernel, ctx, nthreads);
  /* Long runs are cut into chunks so that a few long rows still spread over all threads. */
  int64_t chunk = inner;
  if (nthreads > 1 && rows < 4 * nthreads) {
    int64_t want = (numel + 4 * nthreads - 1) / (4 * nthreads);
    chunk = want < 4096 ? 4096 : (want + 63) / 64 * 64;
    if (chunk > inner) chunk = inner;
  }
  int64_t per_row = (inner + chunk - 1) / chunk, tasks = rows * per_row;
  /* A parallel construct costs a team set-up even when `if` turns it off (libgomp
   * allocates), which dominates tiny ops: stay serial unless there is real work. */
  if (nthreads > 1 && tasks > 1) {
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < tasks; t++) run_task(t, per_row, chunk, inner, nd, sh, nops, base, esize, st, kernel, ctx);
  } else {
    for (int64_t t = 0; t < tasks; t++) run_task(t, per_row, chunk, inner, nd, sh, nops, base, esize, st, kernel, ctx);
  }
}

int ew_prepare_out(const char *op, lt_tensor *out, int ndim, const int64_t *shape, int dtype, int device) {
  LT_TRY(lt_prepare_out(op, out, ndim, shape, dtype, device));
  for (int d = 0; d < out->ndim; d++)
    if (out->shape[d] > 1 && out->stride[d] == 0) {
      char s[LT_DESC_STR];
      return lt_errorf("%s: out %s is an expanded view (stride 0 in dim %d): its elements overlap", op, lt_desc(s, out),
                       d);
    }
  return 0;
}

int ew_check_overlap(const char *op, const lt_tensor *out, const lt_tensor *in, const char *what) {
  /* As torch: decided only for contiguous pairs, where byte ranges say it exactly. */
  if (out->storage != in->storage || !lt_is_contiguous(out) || !lt_is_contiguous(in)) return 0;
  int64_t out_end = out->offset + lt_numel(out) * lt_dtype_size(out->dtype);
  int64_t in_end = in->offset + lt_numel(in) * lt_dtype_size(in->dtype);
  if (out->offset >= in_end || in->offset >= out_end || lt_numel(out) == 0 || lt_numel(in) == 0) return 0;
  if (out->offset == in->offset && out_end == in_end && out->dtype == in->dtype) return 0; /* in place */
  char a[LT_DESC_STR], b[LT_DESC_STR];
  return lt_errorf("%s: out %s partly overlaps %s %s (views of one storage); copy the input first", op, lt_desc(a, out),
                   what, lt_desc(b, in));
}

int ew_check_cuda_device(const char *op, const lt_tensor *t) {
  if (!lt_backend_lookup(op, t->device, "%s: not implemented on cuda yet (lutra was built without CUDA)", true))
    return -1;
  /* a tensor that claims a device its storage is not on: never hand its pointer to a kernel */
  char dev[16], sdev[16];
  if (t->storage && t->storage->device != t->device)
    return lt_errorf("%s: tensor on %s has its storage on %s", op, lt_device_str(dev, t->device),
                     lt_device_str(sdev, t->storage->device));
  return 0;
}

/* ---- 16-bit floats <-> f32 ------------------------------------------------------- */

static void f16_to_f32_contig(float *dst, const uint16_t *src, int64_t n) {
  int64_t i = 0;
#ifdef __F16C__
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
#endif
  for (; i < n; i++) dst[i] = lt_f16_to_f32(src[i]);
}

static void f32_to_f16_contig(uint16_t *dst, const float *src, int64_t n) {
  int64_t i = 0;
#ifdef __F16C__
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128((__m128i *)(dst + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
  for (; i < n; i++) dst[i] = lt_f32_to_f16(src[i]);
}

/* Round to nearest even as lt_f32_to_bf16, written without branches so the loop vectorises. */
static inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, nan = (u >> 16) | 0x40u;
  return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

int64_t ew_load_f32(float *dst, const char *src, int dtype, int64_t stride, int64_t n) {
  if (stride == 0) n = 1;
  const uint16_t *h = (const uint16_t *)src;
  if (dtype == LT_F32) {
    const float *f = (const float *)src;
    if (stride == 1)
      memcpy(dst, f, (size_t)n * sizeof(float));
    else
      for (int64_t i = 0; i < n; i++) dst[i] = f[i * stride];
  } else if (dtype == LT_BF16) {
    if (stride == 1)
      for (int64_t i = 0; i < n; i++) dst[i] = lt_bf16_to_f32(h[i]);
    else
      for (int64_t i = 0; i < n; i++) dst[i] = lt_bf16_to_f32(h[i * stride]);
  } else {
    if (stride == 1)
      f16_to_f32_contig(dst, h, n);
    else
      for (int64_t i = 0; i < n; i++) dst[i] = lt_f16_to_f32(h[i * stride]);
  }
  return stride == 0 ? 0 : 1;
}

void ew_store_f32(char *dst, int dtype, int64_t stride, const float *src, int64_t n) {
  uint16_t *h = (uint16_t *)dst;
  if (dtype == LT_F32) {
    float *f = (float *)dst;
    if (stride == 1)
      memcpy(f, src, (size_t)n * sizeof(float));
    else
      for (int64_t i = 0; i < n; i++) f[i * stride] = src[i];
  } else if (dtype == LT_BF16) {
    if (stride == 1)
      for (int64_t i = 0; i < n; i++) h[i] = f32_to_bf16(src[i]);
    else
      for (int64_t i = 0; i < n; i++) h[i * stride] = f32_to_bf16(src[i]);
  } else {
    if (stride == 1)
      f32_to_f16_contig(h, src, n);
    else
      for (int64_t i = 0; i < n; i++) h[i * stride] = lt_f32_to_f16(src[i]);
  }
}
