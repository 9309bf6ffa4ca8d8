/* cuda_values.h — inputs shared by test_cuda_nogpu.c (the kernels' element rules on the CPU) and
 * test_cuda_copy_gpu.c (the same conversions on a device): values that stress conversions. */
#ifndef LUTRA_TEST_CUDA_VALUES_H
#define LUTRA_TEST_CUDA_VALUES_H
#include "check.h"

static const int add_dtypes[] = {LT_F32, LT_F64, LT_BF16, LT_F16, LT_I32, LT_I64};

/* Values that stress conversions: ties, subnormals, infinities, NaN, big and negative. */
static double special_value(int64_t i, int src_dtype, int dst_dtype) {
  static const double floats[] = {0.0,   -0.0,    1.0,        -1.5,        2.5,       65504.0, 65520.0, 1e-8,
                                  6e-8,  3e-5,    1.00390625, 1.005859375, 3.4e38,    -1e30,   1e-40,   0.1,
                                  255.0, -128.75, 300.0,      INFINITY,    -INFINITY, NAN};
  static const double ints[] = {0, 1, -1, 2, 127, -128, 255, 256, 1000, -70000, 16777217, 2147483647, -2147483647};
  /* float -> int of an out-of-range value is undefined in C: those stay in range (f16 too) */
  static const double small_ints[] = {0, 1, -1, 2, 127, -128, 255, 256, 1000, -60000};
  bool int_dst = !lt_dtype_is_float(dst_dtype), int_src = !lt_dtype_is_float(src_dtype);
  if (int_src || int_dst) {
    double v = int_src ? ints[i % (int64_t)(sizeof ints / sizeof *ints)]
                       : small_ints[i % (int64_t)(sizeof small_ints / sizeof *small_ints)];
    if (dst_dtype == LT_U8 || src_dtype == LT_U8) v = fabs(fmod(v, 256.0));
    return v + (int_src ? 0.0 : 0.25 * (double)(i % 4));
  }
  return floats[i % (int64_t)(sizeof floats / sizeof *floats)] * (i % 3 == 2 ? -1.0 : 1.0);
}

static lt_tensor *special_tensor(int64_t n, int src_dtype, int dst_dtype) {
  int64_t shape[1] = {n};
  lt_tensor *t = lt_tensor_new();
  CHECK_OK(lt_empty(t, 1, shape, src_dtype, LT_DEVICE_CPU));
  for (int64_t i = 0; i < n; i++) lt_store_f64(lt_data_ptr(t), src_dtype, i, special_value(i, src_dtype, dst_dtype));
  return t;
}

static bool same_bytes(const lt_tensor *a, const lt_tensor *b) {
  return lt_numel(a) == lt_numel(b) && a->dtype == b->dtype &&
         memcmp(lt_data_ptr(a), lt_data_ptr(b), (size_t)(lt_numel(a) * lt_dtype_size(a->dtype))) == 0;
}
#endif
