/* test_copy.c — lt_copy across every dtype pair (round to nearest even into bf16/f16,
 * checked on known bit patterns), layouts and broadcasting; lt_fill on views; arange,
 * linspace; the host buffer copies. */
#include "check.h"

static const int all_dtypes[] = {LT_F32, LT_F64, LT_BF16, LT_F16, LT_I32, LT_I64, LT_U8, LT_BOOL};

static lt_tensor *vec(int dtype, int64_t n) {
  lt_tensor *t = lt_tensor_new();
  CHECK_OK(lt_empty(t, 1, &n, dtype, LT_DEVICE_CPU));
  return t;
}

/* The 16 bits of element i of a bf16/f16 tensor. */
static uint16_t bits16(const lt_tensor *t, int64_t i) { return ((const uint16_t *)lt_data_ptr(t))[i]; }

static void test_copy_all_pairs(void) {
  /* values every dtype holds exactly (bool holds v != 0) */
  const double vals[7] = {0, 1, 2, 3, 7, 100, 255};
  for (int i = 0; i < 8; i++) {
    for (int j = 0; j < 8; j++) {
      int sd = all_dtypes[i], dd = all_dtypes[j];
      /* contiguous (7), and a strided source into a transposed destination (2,7)->(7,2)^T */
      lt_tensor *src = vec(sd, 7), *dst = vec(dd, 7);
      for (int k = 0; k < 7; k++) lt_store_f64(lt_data_ptr(src), sd, k, vals[k]);
      CHECK_OK(lt_copy(dst, src));
      bool ok = true;
      for (int k = 0; k < 7; k++) {
        double want = sd == LT_BOOL || dd == LT_BOOL ? vals[k] != 0 : vals[k];
        ok &= check_at(dst, k) == want;
      }
      CHECK(ok, "copy %s -> %s", lt_dtype_name(sd), lt_dtype_name(dd));
      lt_tensor *big = lt_tensor_new(), *s2 = lt_tensor_new(), *dbase = lt_tensor_new(), *d2 = lt_tensor_new();
      int64_t bs[2] = {7, 4}, ds[2] = {2, 7};
      lt_empty(big, 2, bs, sd, LT_DEVICE_CPU);
      lt_fill(big, 0);
      for (int k = 0; k < 7; k++) lt_store_f64(lt_data_ptr(big), sd, 4 * k + 1, vals[k]);
      lt_slice(s2, big, 1, 1, 4, 2); /* (7,2) with strides (4,2): column 1 is vals */
      lt_empty(dbase, 2, ds, dd, LT_DEVICE_CPU);
      lt_transpose(d2, dbase, 0, 1); /* (7,2) with strides (1,7) */
      CHECK_OK(lt_copy(d2, s2));
      ok = true;
      for (int k = 0; k < 7; k++) {
        double want = sd == LT_BOOL || dd == LT_BOOL ? vals[k] != 0 : vals[k];
        ok &= check_at(d2, 2 * k) == want && check_at(d2, 2 * k + 1) == 0;
      }
      CHECK(ok, "strided copy %s -> %s", lt_dtype_name(sd), lt_dtype_name(dd));
      lt_release(src), lt_release(dst), lt_release(big), lt_release(s2), lt_release(dbase), lt_release(d2);
    }
  }
  /* signed values and truncation toward zero from floats into integers */
  lt_tensor *f = vec(LT_F64, 4), *i32 = vec(LT_I32, 4), *i64 = vec(LT_I64, 4);
  double fv[4] = {-3.75, 2.5, -0.5, 1e9};
  CHECK_OK(lt_copy_from_buffer(f, fv, LT_F64, 4));
  CHECK_OK(lt_copy(i32, f));
  CHECK_OK(lt_copy(i64, i32));
  CHECK(check_at(i64, 0) == -3 && check_at(i64, 1) == 2 && check_at(i64, 2) == 0 && check_at(i64, 3) == 1e9,
        "float -> int truncates toward zero");
  lt_release(f), lt_release(i32), lt_release(i64);
}

/* f32 -> bf16/f16 rounds to nearest, ties to even; expected bit patterns worked out by hand. */
static void test_half_rounding(void) {
  const float bf_in[] = {1.0f + 0x1p-8f,
                         1.0f + 3 * 0x1p-8f,
                         1.0f + 0x1p-8f + 0x1p-20f,
                         -2.0f,
                         0.0f,
                         -0.0f,
                         INFINITY,
                         3.4e38f,
                         1.0f - 0x1p-24f,
                         NAN};
  const uint16_t bf_want[] = {0x3F80, 0x3F82, 0x3F81, 0xC000, 0x0000, 0x8000, 0x7F80, 0x7F80, 0x3F80, 0};
  const float h_in[] = {65504.0f,   65519.0f, 65520.0f,     0x1p-24f,        0x1p-25f,
                        0x1.8p-24f, 0x1p-14f, 0x1.ff8p-15f, 1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f,
                        -2.0f,      NAN};
  const uint16_t h_want[] = {0x7BFF, 0x7BFF, 0x7C00, 0x0001, 0x0000, 0x0002, 0x0400, 0x03FF, 0x3C00, 0x3C02, 0xC000, 0};
  int64_t nb = sizeof bf_in / sizeof bf_in[0], nh = sizeof h_in / sizeof h_in[0];
  lt_tensor *f = vec(LT_F32, nb), *b = vec(LT_BF16, nb), *g = vec(LT_F32, nh), *h = vec(LT_F16, nh);
  CHECK_OK(lt_copy_from_buffer(f, bf_in, LT_F32, nb));
  CHECK_OK(lt_copy(b, f));
  for (int64_t i = 0; i + 1 < nb; i++)
    CHECK(bits16(b, i) == bf_want[i], "bf16(%a) = 0x%04X, want 0x%04X", bf_in[i], bits16(b, i), bf_want[i]);
  CHECK((bits16(b, nb - 1) & 0x7F80) == 0x7F80 && (bits16(b, nb - 1) & 0x7F), "bf16(NaN) is NaN");
  CHECK_OK(lt_copy_from_buffer(g, h_in, LT_F32, nh));
  CHECK_OK(lt_copy(h, g));
  for (int64_t i = 0; i + 1 < nh; i++)
    CHECK(bits16(h, i) == h_want[i], "f16(%a) = 0x%04X, want 0x%04X", h_in[i], bits16(h, i), h_want[i]);
  CHECK((bits16(h, nh - 1) & 0x7C00) == 0x7C00 && (bits16(h, nh - 1) & 0x3FF), "f16(NaN) is NaN");
  /* and back: f16 subnormals and the largest finite value widen exactly */
  lt_tensor *back = vec(LT_F64, nh);
  CHECK_OK(lt_copy(back, h));
  CHECK(check_at(back, 0) == 65504 && check_at(back, 3) == 0x1p-24 && check_at(back, 5) == 0x1p-23 &&
            check_at(back, 6) == 0x1p-14 && isinf(check_at(back, 2)),
        "f16 -> f64 widening");
  /* every f16 bit pattern survives f16 -> f32 -> f16, and bf16 -> f32 -> bf16 */
  int64_t all = 65536;
  lt_tensor *h16 = vec(LT_F16, all), *b16 = vec(LT_BF16, all), *w = vec(LT_F32, all), *r = vec(LT_F16, all);
  for (int64_t i = 0; i < all; i++)
    ((uint16_t *)lt_data_ptr(h16))[i] = (uint16_t)i, ((uint16_t *)lt_data_ptr(b16))[i] = (uint16_t)i;
  CHECK_OK(lt_copy(w, h16));
  CHECK_OK(lt_copy(r, w));
  int64_t bad = -1;
  for (int64_t i = 0; i < all && bad < 0; i++)
    if (bits16(r, i) != i && !((i & 0x7C00) == 0x7C00 && (i & 0x3FF))) bad = i; /* NaN payloads may change */
  CHECK(bad < 0, "f16 0x%04llX does not round-trip", (long long)bad);
  lt_tensor *rb = vec(LT_BF16, all);
  CHECK_OK(lt_copy(w, b16));
  CHECK_OK(lt_copy(rb, w));
  bad = -1;
  for (int64_t i = 0; i < all && bad < 0; i++)
    if (bits16(rb, i) != i && !((i & 0x7F80) == 0x7F80 && (i & 0x7F))) bad = i;
  CHECK(bad < 0, "bf16 0x%04llX does not round-trip", (long long)bad);
  lt_release(f), lt_release(b), lt_release(g), lt_release(h), lt_release(back), lt_release(h16), lt_release(b16);
  lt_release(w), lt_release(r), lt_release(rb);
}

static void test_copy_broadcast_and_fill(void) {
  int64_t ds[3] = {2, 3, 4}, ss[2] = {3, 1};
  lt_tensor *dst = lt_tensor_new(), *src = lt_tensor_new();
  lt_empty(dst, 3, ds, LT_F32, LT_DEVICE_CPU);
  lt_empty(src, 2, ss, LT_I64, LT_DEVICE_CPU);
  for (int k = 0; k < 3; k++) ((int64_t *)lt_data_ptr(src))[k] = 10 * (k + 1);
  CHECK_OK(lt_copy(dst, src));
  bool ok = true;
  for (int64_t i = 0; i < 24; i++) ok &= check_at(dst, i) == 10 * ((i / 4) % 3 + 1);
  CHECK(ok, "copy (3,1) i64 into (2,3,4) f32 broadcasts");
  CHECK_ERR(lt_copy(src, dst), "copy: source shape [2,3,4] does not broadcast to destination shape [3,1]");
  lt_tensor *und = lt_tensor_new();
  CHECK_ERR(lt_copy(und, src), "copy: destination is undefined");
  CHECK_ERR(lt_copy(dst, und), "copy: source is undefined");
  /* fill a strided column and a slice with a step: the rest stays */
  lt_tensor *col = lt_tensor_new(), *st = lt_tensor_new();
  CHECK_OK(lt_fill(dst, 0));
  CHECK_OK(lt_select(col, dst, 2, 1)); /* (2,3) with strides (12,4) */
  CHECK_OK(lt_fill(col, 5));
  CHECK_OK(lt_slice(st, dst, 2, 2, 4, 2)); /* (2,3,1): element 2 of each row */
  CHECK_OK(lt_fill(st, -1));
  ok = true;
  for (int64_t i = 0; i < 24; i++) ok &= check_at(dst, i) == (i % 4 == 1 ? 5 : i % 4 == 2 ? -1 : 0);
  CHECK(ok, "fill on non-contiguous views");
  lt_tensor *b = lt_tensor_new(), *bv = lt_tensor_new();
  lt_empty(b, 1, (int64_t[]){9}, LT_BOOL, LT_DEVICE_CPU);
  CHECK_OK(lt_fill(b, 0));
  CHECK_OK(lt_slice(bv, b, 0, 1, 9, 3));
  CHECK_OK(lt_fill(bv, 2.5));
  CHECK(check_at(b, 1) == 1 && check_at(b, 4) == 1 && check_at(b, 7) == 1 && check_at(b, 2) == 0 &&
            ((uint8_t *)lt_data_ptr(b))[4] == 1,
        "fill a bool view stores 1");
  /* a large strided copy takes the threaded path */
  int64_t big[2] = {300, 700};
  lt_tensor *m = lt_tensor_new(), *mt = lt_tensor_new(), *c = lt_tensor_new();
  lt_empty(m, 2, big, LT_F32, LT_DEVICE_CPU);
  for (int64_t i = 0; i < 300 * 700; i++) ((float *)lt_data_ptr(m))[i] = (float)i;
  lt_transpose(mt, m, 0, 1);
  CHECK_OK(lt_contiguous(c, mt));
  ok = true;
  for (int64_t i = 0; i < 700 && ok; i++)
    for (int64_t j = 0; j < 300; j++) ok &= ((float *)lt_data_ptr(c))[i * 300 + j] == (float)(j * 700 + i);
  CHECK(ok, "large transposed copy");
  lt_release(dst), lt_release(src), lt_release(und), lt_release(col), lt_release(st), lt_release(b);
  lt_release(bv), lt_release(m), lt_release(mt), lt_release(c);
}

static void test_arange_linspace(void) {
  lt_tensor *t = lt_tensor_new();
  CHECK_OK(lt_arange(t, 0, 5, 1, LT_I64, LT_DEVICE_CPU));
  CHECK(t->ndim == 1 && t->shape[0] == 5 && t->dtype == LT_I64 && check_at(t, 4) == 4, "arange(0,5)");
  lt_release(t), t = lt_tensor_new();
  CHECK_OK(lt_arange(t, 5, 0, -1.5, LT_F32, LT_DEVICE_CPU));
  CHECK(t->shape[0] == 4 && check_at(t, 0) == 5 && check_at(t, 3) == 0.5, "arange(5,0,-1.5)");
  lt_release(t), t = lt_tensor_new();
  CHECK_OK(lt_arange(t, 0, 1, 0.1, LT_F64, LT_DEVICE_CPU));
  CHECK(t->shape[0] == 10 && fabs(check_at(t, 9) - 0.9) < 1e-12, "arange(0,1,0.1) has 10 elements");
  lt_release(t), t = lt_tensor_new();
  CHECK_OK(lt_arange(t, 3, 3, 1, LT_F32, LT_DEVICE_CPU));
  CHECK(lt_is_defined(t) && t->shape[0] == 0, "empty arange");
  CHECK_ERR(lt_arange(t, 0, 5, 0, LT_F32, LT_DEVICE_CPU), "arange: step must be nonzero");
  CHECK_ERR(lt_arange(t, 0, INFINITY, 1, LT_F32, LT_DEVICE_CPU), "must be finite");
  CHECK_ERR(lt_arange(t, 0, 1e300, 1e-300, LT_F32, LT_DEVICE_CPU), "arange: ");
  lt_tensor *o = lt_tensor_new();
  lt_empty(o, 1, (int64_t[]){3}, LT_F32, LT_DEVICE_CPU);
  CHECK_ERR(lt_arange(o, 0, 5, 1, LT_F32, LT_DEVICE_CPU), "arange: out is [3] f32 cpu, expected [5] f32 cpu");
  CHECK_OK(lt_linspace(o, -1, 1, 3, LT_F32, LT_DEVICE_CPU)); /* into a defined out */
  CHECK(check_at(o, 0) == -1 && check_at(o, 1) == 0 && check_at(o, 2) == 1, "linspace into a defined out");
  lt_tensor *l = lt_tensor_new();
  CHECK_OK(lt_linspace(l, 0, 1, 5, LT_F64, LT_DEVICE_CPU));
  CHECK(l->shape[0] == 5 && check_at(l, 1) == 0.25 && check_at(l, 4) == 1, "linspace(0,1,5)");
  lt_release(l), l = lt_tensor_new();
  CHECK_OK(lt_linspace(l, 2, 9, 1, LT_F32, LT_DEVICE_CPU));
  CHECK(l->shape[0] == 1 && check_at(l, 0) == 2, "linspace with one step is start");
  CHECK_ERR(lt_linspace(l, 0, 1, -2, LT_F32, LT_DEVICE_CPU), "linspace: steps must be non-negative");
  lt_release(t), lt_release(o), lt_release(l);
}

static void test_buffers(void) {
  lt_tensor *t = lt_tensor_new(), *tr = lt_tensor_new();
  lt_empty(t, 2, (int64_t[]){2, 3}, LT_BF16, LT_DEVICE_CPU);
  int32_t in[6] = {1, 2, 3, 4, 5, 6};
  CHECK_OK(lt_copy_from_buffer(t, in, LT_I32, 6));
  lt_transpose(tr, t, 0, 1);
  double out[6];
  CHECK_OK(lt_copy_to_buffer(tr, out, LT_F64, 6));
  CHECK(out[0] == 1 && out[1] == 4 && out[2] == 2 && out[5] == 6, "copy_to_buffer follows the view's order");
  CHECK_ERR(lt_copy_from_buffer(t, in, LT_I32, 5), "copy_from_buffer: 5 values given for a tensor of 6 elements");
  CHECK_ERR(lt_copy_to_buffer(t, out, LT_F64, 7), "copy_to_buffer: buffer of 7 values");
  CHECK_ERR(lt_copy_from_buffer(t, in, 17, 6), "unknown dtype 17");
  CHECK_ERR(lt_copy_from_buffer(t, NULL, LT_I32, 6), "buffer is NULL");
  CHECK_ERR(lt_copy_to_buffer(t, NULL, LT_F64, 6), "buffer is NULL");
  lt_release(t), lt_release(tr);
}

int main(void) {
  test_copy_all_pairs();
  test_half_rounding();
  test_copy_broadcast_and_fill();
  test_arange_linspace();
  test_buffers();
  return check_summary();
}
