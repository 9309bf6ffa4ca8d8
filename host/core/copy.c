/* copy.c — copy across dtypes, devices and layouts; fill, arange, linspace. */
#include "core/device.h"
#include <stdlib.h>
#ifdef __F16C__
#include <immintrin.h>
#endif

static bool dtype_is_integral(int dtype) { return !lt_dtype_is_float(dtype); }

/* Converts n elements: dst[i*ds] = src[i*ss] (element strides). */
static void convert_run(void *dst, int dst_dtype, int64_t ds, const void *src, int src_dtype, int64_t ss, int64_t n) {
  if (dst_dtype == src_dtype) {
    int sz = lt_dtype_size(dst_dtype);
    if (ds == 1 && ss == 1) {
      memcpy(dst, src, (size_t)(n * sz));
      return;
    }
    switch (sz) {
    case 1:
      for (int64_t i = 0; i < n; i++) ((uint8_t *)dst)[i * ds] = ((const uint8_t *)src)[i * ss];
      return;
    case 2:
      for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i * ds] = ((const uint16_t *)src)[i * ss];
      return;
    case 4:
      for (int64_t i = 0; i < n; i++) ((uint32_t *)dst)[i * ds] = ((const uint32_t *)src)[i * ss];
      return;
    default:
      for (int64_t i = 0; i < n; i++) ((uint64_t *)dst)[i * ds] = ((const uint64_t *)src)[i * ss];
      return;
    }
  }
  if (dst_dtype == LT_BF16 && src_dtype == LT_F32) {
    for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i * ds] = lt_f32_to_bf16(((const float *)src)[i * ss]);
    return;
  }
  if (dst_dtype == LT_F32 && src_dtype == LT_BF16) {
    for (int64_t i = 0; i < n; i++) ((float *)dst)[i * ds] = lt_bf16_to_f32(((const uint16_t *)src)[i * ss]);
    return;
  }
  if (dst_dtype == LT_F16 && src_dtype == LT_F32) {
    int64_t i = 0;
#ifdef __F16C__
    if (ss == 1 && ds == 1) /* 8 at a time; a block with a NaN goes the scalar way (its canonical NaN) */
      for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps((const float *)src + i);
        if (_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q))) break;
        _mm_storeu_si128((__m128i *)((uint16_t *)dst + i),
                         _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      }
#endif
    for (; i < n; i++) ((uint16_t *)dst)[i * ds] = lt_f32_to_f16(((const float *)src)[i * ss]);
    return;
  }
  if (dst_dtype == LT_F32 && src_dtype == LT_F16) {
    int64_t i = 0;
#ifdef __F16C__
    if (ss == 1 && ds == 1) /* exact; a block with an inf or NaN goes the scalar way (payload kept) */
      for (; i + 8 <= n; i += 8) {
        __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)src + i));
        __m128i e = _mm_and_si128(h, _mm_set1_epi16(0x7c00));
        if (_mm_movemask_epi8(_mm_cmpeq_epi16(e, _mm_set1_epi16(0x7c00)))) break;
        _mm256_storeu_ps((float *)dst + i, _mm256_cvtph_ps(h));
      }
#endif
    for (; i < n; i++) ((float *)dst)[i * ds] = lt_f16_to_f32(((const uint16_t *)src)[i * ss]);
    return;
  }
  if (dst_dtype == LT_F32 && src_dtype == LT_F64) {
    for (int64_t i = 0; i < n; i++) ((float *)dst)[i * ds] = (float)((const double *)src)[i * ss];
    return;
  }
  if (dst_dtype == LT_F64 && src_dtype == LT_F32) {
    for (int64_t i = 0; i < n; i++) ((double *)dst)[i * ds] = ((const float *)src)[i * ss];
    return;
  }
  if (dtype_is_integral(dst_dtype) && dtype_is_integral(src_dtype) && dst_dtype != LT_BOOL) {
    for (int64_t i = 0; i < n; i++) {
      int64_t v = lt_load_i64(src, src_dtype, i * ss);
      switch (dst_dtype) {
      case LT_I32: ((int32_t *)dst)[i * ds] = (int32_t)v; break;
      case LT_I64: ((int64_t *)dst)[i * ds] = v; break;
      default: ((uint8_t *)dst)[i * ds] = (uint8_t)v; break;
      }
    }
    return;
  }
  for (int64_t i = 0; i < n; i++) lt_store_f64(dst, dst_dtype, i * ds, lt_load_f64(src, src_dtype, i * ss));
}

static inline void copy_row(const lt_strided_loop *L, int64_t r, char *dbase, int ddtype, int dsz, int64_t ds,
                            const char *sbase, int sdtype, int ssz, int64_t ss, int64_t inner) {
  int64_t off[2];
  lt_loop_row_offsets(L, r, off);
  convert_run(dbase + off[0] * dsz, ddtype, ds, sbase + off[1] * ssz, sdtype, ss, inner);
}

/* CPU strided copy with conversion; shapes already broadcast-checked. */
static void copy_cpu(lt_tensor *dst, const lt_tensor *src) {
  int64_t sstride[LT_MAX_DIMS];
  lt_broadcast_strides(src, dst->ndim, dst->shape, sstride);
  const int64_t *strides[2] = {dst->stride, sstride};
  lt_strided_loop L;
  lt_loop_init(&L, dst->ndim, dst->shape, 2, strides);
  int64_t rows = lt_loop_outer_rows(&L), inner = L.shape[L.ndim - 1];
  int64_t ds = L.stride[0][L.ndim - 1], ss = L.stride[1][L.ndim - 1];
  char *dbase = lt_data_ptr(dst);
  const char *sbase = lt_data_ptr(src);
  int dsz = lt_dtype_size(dst->dtype), ssz = lt_dtype_size(src->dtype);
  if (rows == 1 && inner >= 4 * LT_PAR_GRAIN) { /* one long run: split it across threads */
    int64_t chunk = LT_PAR_GRAIN;
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < (inner + chunk - 1) / chunk; c++) {
      int64_t i0 = c * chunk, n = inner - i0 < chunk ? inner - i0 : chunk;
      convert_run(dbase + i0 * ds * dsz, dst->dtype, ds, sbase + i0 * ss * ssz, src->dtype, ss, n);
    }
    return;
  }
  if (rows * inner >= LT_PAR_GRAIN && rows > 1) { /* no omp construct at all for small copies: see ew_execute */
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++) copy_row(&L, r, dbase, dst->dtype, dsz, ds, sbase, src->dtype, ssz, ss, inner);
  } else {
    for (int64_t r = 0; r < rows; r++) copy_row(&L, r, dbase, dst->dtype, dsz, ds, sbase, src->dtype, ssz, ss, inner);
  }
}

static int check_broadcast_to(const char *op, const lt_tensor *src, const lt_tensor *dst) {
  int n;
  int64_t shape[LT_MAX_DIMS];
  bool ok = src->ndim <= dst->ndim && lt_broadcast_shape(src->ndim, src->shape, dst->ndim, dst->shape, &n, shape) == 0;
  for (int d = 0; ok && d < n; d++) ok = shape[d] == dst->shape[d];
  if (ok) return 0;
  char a[LT_SHAPE_STR], b[LT_SHAPE_STR];
  return lt_errorf("%s: source shape %s does not broadcast to destination shape %s", op,
                   lt_shape_str(a, src->ndim, src->shape), lt_shape_str(b, dst->ndim, dst->shape));
}

/* dst = src on one CUDA device: any layouts, src broadcast, dtype converted in the same kernel. */
static int copy_on_device(const lt_device_runtime *rt, lt_tensor *dst, const lt_tensor *src) {
  lt_ew_geom g;
  lt_ew_geom_of(&g, dst, 1, &src);
  return rt->copy(dst->device, &g, lt_data_ptr(dst), dst->dtype, lt_data_ptr(src), src->dtype);
}

/* A contiguous tensor of src's shape, in `dtype` on `device`, holding src's values: src itself
 * (a new view) when it already is one, else a copy (made on src's device). NULL on error. */
static lt_tensor *contiguous_as(const lt_device_runtime *rt, const lt_tensor *src, int dtype, int device) {
  lt_tensor *t = lt_tensor_new();
  if (!t) return lt_errorf("copy: out of host memory"), NULL;
  int rc;
  if (lt_is_contiguous(src) && src->dtype == dtype && src->device == device) {
    rc = lt_set(t, src);
  } else {
    rc = lt_empty(t, src->ndim, src->shape, dtype, device);
    if (rc == 0 && src->device == LT_DEVICE_CPU)
      copy_cpu(t, src);
    else if (rc == 0)
      rc = copy_on_device(rt, t, src);
  }
  if (rc) lt_release(t), t = NULL;
  return t;
}

/* dst = src across devices (CPU <-> CUDA, or two CUDA devices): src's values, made contiguous in
 * its own shape (and, from the CPU, already in dst's dtype), cross in one memcpy; dst's device
 * then broadcasts, converts and scatters them into dst's layout. */
static int copy_across(const lt_device_runtime *rt, lt_tensor *dst, const lt_tensor *src) {
  bool to_cpu = dst->device == LT_DEVICE_CPU;
  /* from the CPU convert first (the host does it, and fewer bytes may cross) */
  lt_tensor *packed = contiguous_as(rt, src, src->device == LT_DEVICE_CPU ? dst->dtype : src->dtype, src->device);
  if (!packed) return -1;
  int64_t nbytes = lt_numel(packed) * lt_dtype_size(packed->dtype);
  int rc;
  if (lt_is_contiguous(dst) && lt_same_shape(dst, packed) && dst->dtype == packed->dtype) {
    rc = rt->copy_bytes(lt_data_ptr(dst), dst->device, lt_data_ptr(packed), packed->device, nbytes);
  } else {
    lt_tensor *landed = lt_tensor_new();
    rc = landed ? lt_empty(landed, packed->ndim, packed->shape, packed->dtype, dst->device)
                : lt_errorf("copy: out of host memory");
    if (rc == 0) rc = rt->copy_bytes(lt_data_ptr(landed), dst->device, lt_data_ptr(packed), packed->device, nbytes);
    if (rc == 0 && to_cpu) copy_cpu(dst, landed);
    if (rc == 0 && !to_cpu) rc = copy_on_device(rt, dst, landed);
    lt_release(landed);
  }
  lt_release(packed);
  return rc;
}

int lt_copy(lt_tensor *dst, const lt_tensor *src) {
  LT_TRY(lt_check_defined("copy", "destination", dst));
  LT_TRY(lt_check_defined("copy", "source", src));
  LT_TRY(check_broadcast_to("copy", src, dst));
  if (dst->device == LT_DEVICE_CPU && src->device == LT_DEVICE_CPU) {
    copy_cpu(dst, src);
    return 0;
  }
  const lt_device_runtime *rt = lt_device_cuda();
  if (!rt) return lt_errorf("copy: this build of lutra has no CUDA support");
  if (dst->device == src->device) return copy_on_device(rt, dst, src);
  return copy_across(rt, dst, src);
}

int lt_fill(lt_tensor *out, double value) {
  LT_TRY(lt_check_defined("fill", "out", out));
  if (out->device != LT_DEVICE_CPU) {
    const lt_device_runtime *rt = lt_device_cuda();
    if (!rt) return lt_errorf("fill: this build of lutra has no CUDA support");
    lt_ew_geom g;
    lt_ew_geom_of(&g, out, 0, NULL);
    return rt->fill(out->device, &g, lt_data_ptr(out), out->dtype, value);
  }
  /* fill one element, then broadcast-copy it: one code path for every layout */
  unsigned char one[8];
  lt_store_f64(one, out->dtype, 0, value);
  lt_storage st = {one, 8, 1, LT_DEVICE_CPU};
  lt_tensor scalar = {.storage = &st, .ndim = 0, .dtype = out->dtype, .device = LT_DEVICE_CPU, .refcount = 1};
  copy_cpu(out, &scalar);
  return 0;
}

static int fill_sequence(const char *op, lt_tensor *out, int64_t n, double start, double step, int dtype, int device) {
  int64_t shape[1] = {n};
  LT_TRY(lt_prepare_out(op, out, 1, shape, dtype, device));
  const lt_device_runtime *rt = lt_device_cuda();
  if (device != LT_DEVICE_CPU && rt)
    return rt->sequence(device, lt_data_ptr(out), out->stride[0], dtype, n, start, step);
  lt_tensor *host = out;
  if (device != LT_DEVICE_CPU) {
    host = lt_tensor_new();
    if (!host || lt_empty(host, 1, shape, dtype, LT_DEVICE_CPU)) return lt_release(host), -1;
  }
  char *p = lt_data_ptr(host);
  for (int64_t i = 0; i < n; i++) lt_store_f64(p, dtype, i * host->stride[0], start + (double)i * step);
  int rc = host == out ? 0 : lt_copy(out, host);
  if (host != out) lt_release(host);
  return rc;
}

int lt_arange(lt_tensor *out, double start, double end, double step, int dtype, int device) {
  if (step == 0 || isnan(step)) return lt_errorf("arange: step must be nonzero");
  if (!isfinite(start) || !isfinite(end)) return lt_errorf("arange: start and end must be finite");
  double span = (end - start) / step;
  if (span > 0x1p62) return lt_errorf("arange: [%g, %g) in steps of %g has too many elements", start, end, step);
  int64_t n = span > 0 ? (int64_t)ceil(span) : 0;
  return fill_sequence("arange", out, n, start, step, dtype, device);
}

int lt_linspace(lt_tensor *out, double start, double end, int64_t steps, int dtype, int device) {
  if (steps < 0) return lt_errorf("linspace: steps must be non-negative, got %lld", (long long)steps);
  double step = steps > 1 ? (end - start) / (double)(steps - 1) : 0;
  return fill_sequence("linspace", out, steps, start, step, dtype, device);
}

int lt_copy_from_buffer(lt_tensor *dst, const void *src, int src_dtype, int64_t count) {
  LT_TRY(lt_check_defined("copy_from_buffer", "destination", dst));
  if (count != lt_numel(dst))
    return lt_errorf("copy_from_buffer: %lld values given for a tensor of %lld elements", (long long)count,
                     (long long)lt_numel(dst));
  if (lt_dtype_size(src_dtype) == 0) return lt_errorf("copy_from_buffer: unknown dtype %d", src_dtype);
  if (!src && count > 0) return lt_errorf("copy_from_buffer: buffer is NULL");
  lt_storage st = {(void *)src, count * lt_dtype_size(src_dtype), 1, LT_DEVICE_CPU};
  lt_tensor view = {.storage = &st, .ndim = dst->ndim, .dtype = src_dtype, .device = LT_DEVICE_CPU, .refcount = 1};
  memcpy(view.shape, dst->shape, sizeof view.shape);
  lt_contiguous_strides(dst->ndim, dst->shape, view.stride);
  return lt_copy(dst, &view);
}

int lt_copy_to_buffer(const lt_tensor *src, void *dst, int dst_dtype, int64_t count) {
  LT_TRY(lt_check_defined("copy_to_buffer", "source", src));
  if (count != lt_numel(src))
    return lt_errorf("copy_to_buffer: buffer of %lld values for a tensor of %lld elements", (long long)count,
                     (long long)lt_numel(src));
  if (lt_dtype_size(dst_dtype) == 0) return lt_errorf("copy_to_buffer: unknown dtype %d", dst_dtype);
  if (!dst && count > 0) return lt_errorf("copy_to_buffer: buffer is NULL");
  lt_storage st = {dst, count * lt_dtype_size(dst_dtype), 1, LT_DEVICE_CPU};
  lt_tensor view = {.storage = &st, .ndim = src->ndim, .dtype = dst_dtype, .device = LT_DEVICE_CPU, .refcount = 1};
  memcpy(view.shape, src->shape, sizeof view.shape);
  lt_contiguous_strides(src->ndim, src->shape, view.stride);
  return lt_copy(&view, src);
}
