/* test_cuda_elementwise_geom.c — the CUDA elementwise kernels' logic, checked on the CPU.
 *
 * 1. The geometry the kernels walk (kernels/elementwise.h): coalescing and the 32/64-bit
 *    offset calculators against a naive row-major walk of the uncoalesced dims, on random
 *    shapes of 0..8 dims with contiguous, permuted, broadcast and negative strides.
 * 2. In a CUDA build: the kernels' launchers run on the host (device LT_DEVICE_CPU: the same
 *    functors, loops and vector paths, as emulated threads of a grid-stride loop) against the
 *    CPU ops, for every op and dtype, on contiguous, non-contiguous, misaligned (scalar path)
 *    and broadcast operands, in place too. Integer, comparison, where, copy and fill results must
 *    be bit-identical; float math within a few ulp (the host libm's expf/tanhf vs the CPU ops'
 *    own polynomials; the GPU's are as close). */
#include "check.h"
#include "kernels/elementwise.h"

/* kernels/ exports (present only in a CUDA build; weak so that a CPU-only build links) */
__attribute__((weak)) int lt_cuda_unary(int device, int op, int dtype, const lt_ew_geom *g, void *out, const void *a);
__attribute__((weak)) int lt_cuda_unary_backward(int device, int op, int dtype, const lt_ew_geom *g, void *grad_in,
                                                 const void *grad_out, const void *x);
__attribute__((weak)) int lt_cuda_clamp(int device, int dtype, const lt_ew_geom *g, void *out, const void *a, double lo,
                                        double hi);
__attribute__((weak)) int lt_cuda_binary(int device, int op, int dtype, const lt_ew_geom *g, void *out, const void *a,
                                         const void *b, int scalar_side, const void *scalar);
__attribute__((weak)) int lt_cuda_where(int device, int size, const lt_ew_geom *g, void *out, const void *cond,
                                        const void *a, const void *b);
__attribute__((weak)) int lt_cuda_copy(int device, const lt_ew_geom *g, void *dst, int dst_dtype, const void *src,
                                       int src_dtype);
__attribute__((weak)) int lt_cuda_fill(int device, const lt_ew_geom *g, void *out, int dtype, double value);
__attribute__((weak)) int lt_cuda_sequence(int device, void *out, int64_t stride, int dtype, int64_t n, double start,
                                           double step);

static const int all_dtypes[] = {LT_F32, LT_F64, LT_BF16, LT_F16, LT_I32, LT_I64, LT_U8, LT_BOOL};

/* ---- 1. geometry ---------------------------------------------------------------------------- */

static void check_walk(int ndim, const int64_t *shape, int nops, int64_t (*st)[LT_MAX_DIMS], const char *what) {
  lt_ew_geom g;
  lt_ew_geom_init(&g, ndim, shape, nops, (const int64_t(*)[LT_MAX_DIMS])st);
  int64_t numel = lt_shape_numel(ndim, shape);
  CHECK(g.numel == numel && g.nops == nops && g.ndim >= 1 && g.ndim <= (ndim > 0 ? ndim : 1), "%s: numel %lld ndim %d",
        what, (long long)g.numel, g.ndim);
  int bad = 0;
  for (int64_t i = 0; i < numel && bad < 3; i++) {
    int64_t o32[LT_EW_MAX_OPS], o64[LT_EW_MAX_OPS];
    lt_ew_offsets32(&g, (uint32_t)i, nops, o32);
    lt_ew_offsets64(&g, i, nops, o64);
    for (int k = 0; k < nops; k++) {
      int64_t want = lt_offset_of(i, ndim, shape, st[k]);
      if (o32[k] != want || o64[k] != want) {
        bad++;
        CHECK(0, "%s: element %lld operand %d: offsets %lld/%lld, want %lld", what, (long long)i, k, (long long)o32[k],
              (long long)o64[k], (long long)want);
      }
    }
  }
  CHECK(bad == 0, "%s: walk", what);
}

static void test_geometry_cases(void) {
  int64_t shape[3] = {2, 3, 4}, st[LT_EW_MAX_OPS][LT_MAX_DIMS] = {{12, 4, 1}, {12, 4, 1}, {0, 0, 0}, {1, 2, 6}};
  lt_ew_geom g;
  lt_ew_geom_init(&g, 3, shape, 2, (const int64_t(*)[LT_MAX_DIMS])st);
  CHECK(g.ndim == 1 && g.shape[0] == 24 && g.stride[0][0] == 1 && g.stride[1][0] == 1 && lt_ew_geom_contiguous(&g),
        "contiguous pair coalesces to one dim: ndim %d", g.ndim);
  lt_ew_geom_init(&g, 3, shape, 3, (const int64_t(*)[LT_MAX_DIMS])st);
  CHECK(g.ndim == 1 && g.stride[2][0] == 0 && !lt_ew_geom_contiguous(&g), "a scalar broadcast: one dim, stride 0");
  lt_ew_geom_init(&g, 3, shape, 4, (const int64_t(*)[LT_MAX_DIMS])st);
  CHECK(g.ndim == 3 && g.shape[0] == 4 && g.shape[2] == 2 && g.stride[3][0] == 6 && g.stride[3][2] == 1,
        "a transposed operand keeps every dim, innermost first");
  check_walk(3, shape, 4, st, "fixed 4 operands");
  int64_t one[2] = {1, 1}, zero[2] = {3, 0}, st1[LT_EW_MAX_OPS][LT_MAX_DIMS] = {{5, 7}, {0, 0}};
  lt_ew_geom_init(&g, 2, one, 2, (const int64_t(*)[LT_MAX_DIMS])st1);
  CHECK(g.ndim == 1 && g.numel == 1 && g.shape[0] == 1, "a single element");
  lt_ew_geom_init(&g, 0, one, 2, (const int64_t(*)[LT_MAX_DIMS])st1);
  CHECK(g.ndim == 1 && g.numel == 1, "a 0-dim tensor");
  lt_ew_geom_init(&g, 2, zero, 2, (const int64_t(*)[LT_MAX_DIMS])st1);
  CHECK(g.numel == 0, "an empty tensor: numel 0");
}

static void test_geometry_random(void) {
  for (int trial = 0; trial < 400; trial++) {
    int ndim = (int)check_randint(0, LT_MAX_DIMS + 1), nops = (int)check_randint(1, LT_EW_MAX_OPS + 1);
    int64_t shape[LT_MAX_DIMS], st[LT_EW_MAX_OPS][LT_MAX_DIMS] = {{0}};
    for (int d = 0; d < ndim; d++) shape[d] = check_randint(1, ndim > 5 ? 3 : 6);
    for (int k = 0; k < nops; k++) {
      int kind = (int)check_randint(0, 5); /* contiguous, permuted, broadcast, negative, random */
      int64_t run = 1;
      for (int d = ndim - 1; d >= 0; d--) {
        st[k][d] = run;
        run *= shape[d] + (kind == 4 ? check_randint(0, 3) : 0); /* padding: a slice of a bigger tensor */
      }
      if (kind == 1 && ndim >= 2) { /* swap two dims' strides */
        int d0 = (int)check_randint(0, ndim), d1 = (int)check_randint(0, ndim);
        int64_t t = st[k][d0];
        st[k][d0] = st[k][d1], st[k][d1] = t;
      }
      for (int d = 0; d < ndim; d++) {
        if (kind == 2 && check_uniform() < 0.5) st[k][d] = 0;
        if (kind == 3 && check_uniform() < 0.5) st[k][d] = -st[k][d];
      }
    }
    char what[64];
    snprintf(what, sizeof what, "random trial %d (%d dims, %d operands)", trial, ndim, nops);
    check_walk(ndim, shape, nops, st, what);
  }
}

/* ---- 2. the kernels' code on the host --------------------------------------------------------- */

static lt_tensor *new_empty(int ndim, const int64_t *shape, int dtype) {
  lt_tensor *t = lt_tensor_new();
  CHECK_OK(lt_empty(t, ndim, shape, dtype, LT_DEVICE_CPU));
  return t;
}

/* t's values in a view whose data starts one element past a 16-byte boundary: contiguous but
 * misaligned, so the kernels take the scalar path. */
static lt_tensor *misaligned(const lt_tensor *t) {
  int64_t n = lt_numel(t) + 1, flat[1] = {n};
  lt_tensor *big = new_empty(1, flat, t->dtype), *part = lt_tensor_new(), *out = lt_tensor_new();
  CHECK_OK(lt_narrow(part, big, 0, 1, n - 1));
  CHECK_OK(lt_view(out, part, t->ndim, t->shape));
  CHECK_OK(lt_copy(out, t));
  lt_release(big), lt_release(part);
  return out;
}

/* The layouts an operand is tried in. */
enum { LAYOUT_CONTIG, LAYOUT_NONCONTIG, LAYOUT_MISALIGNED, NUM_LAYOUTS };
static lt_tensor *in_layout(const lt_tensor *t, int layout) {
  if (layout == LAYOUT_NONCONTIG) return check_noncontig(t);
  if (layout == LAYOUT_MISALIGNED) return misaligned(t);
  lt_tensor *c = lt_tensor_new();
  CHECK_OK(lt_set(c, t));
  return c;
}

/* An output of shape/dtype in a layout (uninitialised values). */
static lt_tensor *out_in_layout(int ndim, const int64_t *shape, int dtype, int layout) {
  lt_tensor *t = new_empty(ndim, shape, dtype), *o = in_layout(t, layout);
  lt_release(t);
  return o;
}

/* Largest |got - want| / max(1, |want|) over the elements; NaN matches NaN, inf matches itself. */
static double max_err(const lt_tensor *got, const lt_tensor *want) {
  double worst = 0;
  for (int64_t i = 0, n = lt_numel(want); i < n; i++) {
    double g = check_at(got, i), w = check_at(want, i);
    if ((isnan(g) && isnan(w)) || g == w) continue;
    double e = isnan(g) || isnan(w) || isinf(g) || isinf(w) ? INFINITY : fabs(g - w) / fmax(1, fabs(w));
    worst = fmax(worst, e);
  }
  return worst;
}

/* Tolerance of float math per dtype: a few ulp of f32 (f64: of f64), one rounding step of the
 * 16-bit types (an f32 result one ulp apart may round the other way). */
static double math_tol(int dtype) {
  switch (dtype) {
  case LT_F32: return 8 * 0x1p-23;
  case LT_F64: return 8 * 0x1p-52;
  case LT_BF16: return 0x1p-7;
  case LT_F16: return 0x1p-10;
  default: return 0;
  }
}

static const int64_t shapes[][3] = {{1, 1, 1}, {1, 1, 7}, {1, 3, 33}, {2, 5, 17}, {1, 1, 1029}};

static bool unary_ok(int op, int dtype) {
  if (lt_dtype_is_float(dtype)) return true;
  return dtype != LT_BOOL && (op == LT_NEG || op == LT_ABS || op == LT_RELU || op == LT_SQUARE);
}

static void input_range(int op, int dtype, double *lo, double *hi) {
  *lo = -3, *hi = 3;
  if (op == LT_LOG || op == LT_SQRT || op == LT_RSQRT) *lo = 0.05;
  if (!lt_dtype_is_float(dtype)) *lo = dtype == LT_U8 ? 0 : -1000, *hi = dtype == LT_U8 ? 256 : 1000;
}

static void test_unary_on_host(void) {
  int cases = 0;
  for (int op = 0; op < LT_NUM_UNARY_OPS; op++)
    for (size_t di = 0; di < sizeof all_dtypes / sizeof *all_dtypes; di++) {
      int dtype = all_dtypes[di];
      if (!unary_ok(op, dtype)) continue;
      for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++)
        for (int layout = 0; layout < NUM_LAYOUTS; layout++) {
          double lo, hi;
          input_range(op, dtype, &lo, &hi);
          lt_tensor *a0 = check_random(3, shapes[si], dtype, lo, hi), *a = in_layout(a0, (layout + 1) % NUM_LAYOUTS);
          lt_tensor *want = lt_tensor_new(), *got = out_in_layout(3, shapes[si], dtype, layout);
          CHECK_OK(lt_unary(want, a0, op));
          lt_ew_geom g;
          const lt_tensor *ins[1] = {a};
          lt_ew_geom_of(&g, got, 1, ins);
          CHECK_OK(lt_cuda_unary(LT_DEVICE_CPU, op, dtype, &g, lt_data_ptr(got), lt_data_ptr(a)));
          double e = max_err(got, want);
          CHECK(e <= math_tol(dtype), "unary %s %s shape %lld layout %d: error %g", lt_unary_name(op),
                lt_dtype_name(dtype), (long long)shapes[si][2], layout, e);
          /* in place, through the vector path when aligned */
          if (layout != LAYOUT_NONCONTIG) {
            lt_ew_geom_of(&g, a, 1, ins);
            CHECK_OK(lt_cuda_unary(LT_DEVICE_CPU, op, dtype, &g, lt_data_ptr(a), lt_data_ptr(a)));
            e = max_err(a, want);
            CHECK(e <= math_tol(dtype), "unary %s %s in place: error %g", lt_unary_name(op), lt_dtype_name(dtype), e);
          }
          /* the backward, from a random grad_out */
          if (lt_dtype_is_float(dtype)) {
            lt_tensor *gout = check_random(3, shapes[si], dtype, -1, 1), *gw = lt_tensor_new();
            lt_tensor *gi = out_in_layout(3, shapes[si], dtype, layout), *x = in_layout(a0, layout);
            CHECK_OK(lt_unary_backward(gw, gout, a0, op));
            const lt_tensor *bins[2] = {gout, x};
            lt_ew_geom_of(&g, gi, 2, bins);
            CHECK_OK(lt_cuda_unary_backward(LT_DEVICE_CPU, op, dtype, &g, lt_data_ptr(gi), lt_data_ptr(gout),
                                            lt_data_ptr(x)));
            e = max_err(gi, gw);
            CHECK(e <= 4 * math_tol(dtype), "%s_backward %s: error %g", lt_unary_name(op), lt_dtype_name(dtype), e);
            lt_release(gout), lt_release(gw), lt_release(gi), lt_release(x);
          }
          lt_release(a0), lt_release(a), lt_release(want), lt_release(got);
          cases++;
        }
    }
  printf("unary on the host: %d cases\n", cases);
}

static void test_clamp_on_host(void) {
  const double bounds[][2] = {{-0.5, 0.75}, {-2000.7, 1e30}, {3.5, 2}};
  for (size_t di = 0; di < sizeof all_dtypes / sizeof *all_dtypes; di++)
    for (size_t bi = 0; bi < 3; bi++)
      for (int layout = 0; layout < NUM_LAYOUTS; layout++) {
        int dtype = all_dtypes[di];
        if (dtype == LT_BOOL) continue;
        double lo, hi;
        input_range(LT_NEG, dtype, &lo, &hi);
        lt_tensor *a0 = check_random(3, shapes[3], dtype, lo, hi), *a = in_layout(a0, layout);
        if (lt_dtype_is_float(dtype)) lt_store_f64(lt_data_ptr(a0), dtype, 0, NAN); /* NaN stays NaN */
        CHECK_OK(lt_copy(a, a0));
        lt_tensor *want = lt_tensor_new(), *got = out_in_layout(3, shapes[3], dtype, (layout + 2) % NUM_LAYOUTS);
        CHECK_OK(lt_clamp(want, a0, bounds[bi][0], bounds[bi][1]));
        /* the integer bounds as lt_clamp rounds them */
        double l = bounds[bi][0], h = bounds[bi][1];
        if (!lt_dtype_is_float(dtype)) {
          double tmin = dtype == LT_I32 ? -2147483648.0 : dtype == LT_I64 ? -9223372036854775808.0 : 0;
          double tmax = dtype == LT_I32 ? 2147483647.0 : dtype == LT_I64 ? 9223372036854774784.0 : 255;
          l = fmin(fmax(ceil(l), tmin), tmax), h = fmin(fmax(floor(h), tmin), tmax);
        }
        lt_ew_geom g;
        const lt_tensor *ins[1] = {a};
        lt_ew_geom_of(&g, got, 1, ins);
        CHECK_OK(lt_cuda_clamp(LT_DEVICE_CPU, dtype, &g, lt_data_ptr(got), lt_data_ptr(a), l, h));
        CHECK(max_err(got, want) == 0, "clamp %s [%g, %g]: error %g", lt_dtype_name(dtype), bounds[bi][0],
              bounds[bi][1], max_err(got, want));
        lt_release(a0), lt_release(a), lt_release(want), lt_release(got);
      }
}

static bool binary_ok(int op, int dtype) {
  if (lt_dtype_is_float(dtype)) return true;
  if (dtype == LT_BOOL) return op >= LT_EQ;
  return op != LT_DIV && op != LT_POW;
}

static void test_binary_on_host(void) {
  /* b's shapes: same, broadcast row, broadcast column, a scalar tensor */
  const int64_t ashape[3] = {3, 5, 37}, bshapes[4][3] = {{3, 5, 37}, {1, 1, 37}, {3, 5, 1}, {1, 1, 1}};
  int cases = 0;
  for (int op = 0; op < LT_NUM_BINARY_OPS; op++)
    for (size_t di = 0; di < sizeof all_dtypes / sizeof *all_dtypes; di++) {
      int dtype = all_dtypes[di], odtype = op >= LT_EQ ? LT_BOOL : dtype;
      if (!binary_ok(op, dtype)) continue;
      double lo = -4, hi = 4;
      if (!lt_dtype_is_float(dtype))
        lo = dtype == LT_I32 || dtype == LT_I64 ? -300 : 0, hi = dtype == LT_BOOL ? 2 : 256;
      if (op == LT_POW) lo = 0.1;
      double tol = op == LT_POW ? math_tol(dtype) : 0;
      for (int bi = 0; bi < 4; bi++)
        for (int layout = 0; layout < NUM_LAYOUTS; layout++) {
          lt_tensor *a0 = check_random(3, ashape, dtype, lo, hi), *b0 = check_random(3, bshapes[bi], dtype, lo, hi);
          if (lt_dtype_is_float(dtype) && op != LT_POW) lt_store_f64(lt_data_ptr(b0), dtype, 0, NAN);
          if (bi == 0) { /* ties for eq, le, maximum */
            CHECK_OK(lt_copy(b0, a0));
            lt_store_f64(lt_data_ptr(b0), dtype, 1, hi - 1);
          }
          lt_tensor *a = in_layout(a0, layout), *b = in_layout(b0, (layout + 1) % NUM_LAYOUTS);
          lt_tensor *want = lt_tensor_new(), *got = out_in_layout(3, ashape, odtype, (layout + 2) % NUM_LAYOUTS);
          CHECK_OK(lt_binary(want, a0, b0, op));
          lt_ew_geom g;
          const lt_tensor *ins[2] = {a, b};
          lt_ew_geom_of(&g, got, 2, ins);
          CHECK_OK(
              lt_cuda_binary(LT_DEVICE_CPU, op, dtype, &g, lt_data_ptr(got), lt_data_ptr(a), lt_data_ptr(b), 0, NULL));
          double e = max_err(got, want);
          CHECK(e <= tol, "binary %s %s b %d layout %d: error %g", lt_binary_name(op), lt_dtype_name(dtype), bi, layout,
                e);
          /* the scalar forms: the scalar as scalar_operand holds it (f32 for the 16-bit floats) */
          if (bi == 0) {
            double s = dtype == LT_BOOL ? 1 : lt_dtype_is_float(dtype) ? 1.3 : 7;
            for (int reverse = 0; reverse < 2; reverse++) {
              _Alignas(8) unsigned char buf[8] = {0};
              int sdtype = lt_dtype_is_float(dtype) && dtype != LT_F64 ? LT_F32 : dtype;
              lt_store_f64(buf, sdtype, 0, s);
              lt_tensor *sw = lt_tensor_new(), *sg = out_in_layout(3, ashape, odtype, layout);
              CHECK_OK(lt_binary_scalar(sw, a0, s, op, reverse));
              const lt_tensor *sins[2] = {a, a};
              lt_ew_geom_of(&g, sg, 2, sins);
              CHECK_OK(lt_cuda_binary(LT_DEVICE_CPU, op, dtype, &g, lt_data_ptr(sg), lt_data_ptr(a), lt_data_ptr(a),
                                      reverse ? 1 : 2, buf));
              e = max_err(sg, sw);
              CHECK(e <= tol, "binary_scalar %s %s reverse %d: error %g", lt_binary_name(op), lt_dtype_name(dtype),
                    reverse, e);
              lt_release(sw), lt_release(sg);
            }
          }
          /* in place into a (not for comparisons: bool out); last, as it changes a */
          if (odtype == dtype) {
            lt_ew_geom_of(&g, a, 2, ins);
            CHECK_OK(
                lt_cuda_binary(LT_DEVICE_CPU, op, dtype, &g, lt_data_ptr(a), lt_data_ptr(a), lt_data_ptr(b), 0, NULL));
            CHECK(max_err(a, want) <= tol, "binary %s %s in place: error %g", lt_binary_name(op), lt_dtype_name(dtype),
                  max_err(a, want));
          }
          lt_release(a0), lt_release(b0), lt_release(a), lt_release(b), lt_release(want), lt_release(got);
          cases++;
        }
    }
  printf("binary on the host: %d cases\n", cases);
}

static void test_where_on_host(void) {
  const int64_t shape[3] = {2, 7, 19}, cshape[3] = {1, 7, 19}, bshape[3] = {2, 1, 1};
  for (size_t di = 0; di < sizeof all_dtypes / sizeof *all_dtypes; di++)
    for (int layout = 0; layout < NUM_LAYOUTS; layout++) {
      int dtype = all_dtypes[di];
      lt_tensor *c0 = check_random(3, layout == 1 ? cshape : shape, layout == 2 ? LT_U8 : LT_BOOL, 0, 2);
      lt_tensor *a0 = check_random(3, shape, dtype, -100, 100),
                *b0 = check_random(3, layout ? bshape : shape, dtype, -9, 9);
      lt_tensor *c = in_layout(c0, layout), *a = in_layout(a0, (layout + 1) % NUM_LAYOUTS), *b = in_layout(b0, layout);
      lt_tensor *want = lt_tensor_new(), *got = out_in_layout(3, shape, dtype, (layout + 2) % NUM_LAYOUTS);
      CHECK_OK(lt_where(want, c0, a0, b0));
      lt_ew_geom g;
      const lt_tensor *ins[3] = {c, a, b};
      lt_ew_geom_of(&g, got, 3, ins);
      CHECK_OK(lt_cuda_where(LT_DEVICE_CPU, lt_dtype_size(dtype), &g, lt_data_ptr(got), lt_data_ptr(c), lt_data_ptr(a),
                             lt_data_ptr(b)));
      CHECK(max_err(got, want) == 0, "where %s layout %d", lt_dtype_name(dtype), layout);
      lt_release(c0), lt_release(a0), lt_release(b0), lt_release(c), lt_release(a), lt_release(b);
      lt_release(want), lt_release(got);
    }
}

/* Copies between every pair of dtypes, strided and broadcast: bit-identical with host/core/copy.c. */
static void test_copy_on_host(void) {
  const int64_t shape[3] = {3, 4, 21}, sshape[2] = {4, 1};
  for (size_t si = 0; si < 8; si++)
    for (size_t di = 0; di < 8; di++)
      for (int layout = 0; layout < NUM_LAYOUTS; layout++) {
        int sd = all_dtypes[si], dd = all_dtypes[di];
        /* in range for every destination (float -> int out of range is undefined in C) */
        double lo = sd == LT_BOOL ? 0 : dd == LT_U8 || sd == LT_U8 ? 0 : -120, hi = sd == LT_BOOL ? 2 : 250;
        lt_tensor *s0 = check_random(layout == 2 ? 2 : 3, layout == 2 ? sshape : shape, sd, lo, hi);
        if (lt_dtype_is_float(sd) && lt_dtype_is_float(dd)) lt_store_f64(lt_data_ptr(s0), sd, 0, NAN);
        lt_tensor *src = in_layout(s0, (layout + 1) % NUM_LAYOUTS);
        lt_tensor *want = new_empty(3, shape, dd), *got = out_in_layout(3, shape, dd, layout);
        CHECK_OK(lt_copy(want, s0));
        lt_ew_geom g;
        const lt_tensor *ins[1] = {src};
        lt_ew_geom_of(&g, got, 1, ins);
        CHECK_OK(lt_cuda_copy(LT_DEVICE_CPU, &g, lt_data_ptr(got), dd, lt_data_ptr(src), sd));
        bool same = true;
        for (int64_t i = 0; i < lt_numel(want) && same; i++) { /* bits, NaN payloads included */
          const char *pw = (const char *)lt_data_ptr(want) + i * lt_dtype_size(dd);
          const char *pg =
              (const char *)lt_data_ptr(got) + lt_offset_of(i, got->ndim, got->shape, got->stride) * lt_dtype_size(dd);
          same = memcmp(pw, pg, (size_t)lt_dtype_size(dd)) == 0;
        }
        CHECK(same, "copy %s -> %s layout %d differs from the CPU's bits", lt_dtype_name(sd), lt_dtype_name(dd),
              layout);
        lt_release(s0), lt_release(src), lt_release(want), lt_release(got);
      }
}

static void test_fill_sequence_on_host(void) {
  const int64_t shape[2] = {9, 13};
  for (size_t di = 0; di < 8; di++) {
    int dtype = all_dtypes[di];
    lt_tensor *t = new_empty(2, shape, dtype), *view = lt_tensor_new(), *want = new_empty(2, shape, dtype);
    CHECK_OK(lt_fill(t, 0));
    CHECK_OK(lt_slice(view, t, 1, 1, 13, 3)); /* columns 1, 4, 7, 10 */
    lt_ew_geom g;
    lt_ew_geom_of(&g, view, 0, NULL);
    CHECK_OK(lt_cuda_fill(LT_DEVICE_CPU, &g, lt_data_ptr(view), dtype, 2.75));
    CHECK_OK(lt_fill(want, 0));
    lt_tensor *wview = lt_tensor_new();
    CHECK_OK(lt_slice(wview, want, 1, 1, 13, 3));
    CHECK_OK(lt_fill(wview, 2.75));
    CHECK(max_err(t, want) == 0, "fill of a strided %s view", lt_dtype_name(dtype));
    lt_release(t), lt_release(view), lt_release(want), lt_release(wview);
    /* arange and linspace into a strided 1-d view */
    int64_t n = 37, big[1] = {2 * n};
    double start = dtype == LT_U8 || dtype == LT_BOOL ? 0 : -5.5, step = dtype == LT_BOOL ? 0.02 : 0.3;
    lt_tensor *seq = lt_tensor_new(), *buf = new_empty(1, big, dtype), *sv = lt_tensor_new();
    CHECK_OK(lt_arange(seq, start, start + (double)n * step, step, dtype, LT_DEVICE_CPU));
    CHECK_OK(lt_slice(sv, buf, 0, 1, 2 * n, 2));
    CHECK(lt_numel(seq) == n && lt_numel(sv) == n, "arange of %lld", (long long)lt_numel(seq));
    CHECK_OK(lt_cuda_sequence(LT_DEVICE_CPU, lt_data_ptr(sv), sv->stride[0], dtype, n, start, step));
    /* both sides compute start + i * step as one fused multiply-add: the same bits */
    CHECK(max_err(sv, seq) == 0, "arange %s: error %g", lt_dtype_name(dtype), max_err(sv, seq));
    lt_release(seq), lt_release(buf), lt_release(sv);
  }
}

int main(void) {
  test_geometry_cases();
  test_geometry_random();
  if (!lt_cuda_unary) {
    printf("CPU-only build: the kernels' host runs are skipped\n");
    return check_summary();
  }
  test_unary_on_host();
  test_clamp_on_host();
  test_binary_on_host();
  test_where_on_host();
  test_copy_on_host();
  test_fill_sequence_on_host();
  return check_summary();
}
