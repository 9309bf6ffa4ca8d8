/* error.c — the thread-local error message, and the names of dtypes, shapes, devices and
 * tensors that messages use. The operand checks that fill it: core/check.c. */
#include "core/internal.h"
#include <stdarg.h>
#include <stdio.h>

enum { LT_ERROR_LEN = 1024 };
static _Thread_local char error_message[LT_ERROR_LEN];

const char *lt_last_error(void) { return error_message[0] ? error_message : "no error"; }
void lt_clear_error(void) { error_message[0] = 0; }

int lt_set_error(const char *message) {
  snprintf(error_message, sizeof error_message, "%s", message ? message : "unknown error");
  return -1;
}

int lt_errorf(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(error_message, sizeof error_message, fmt, ap);
  va_end(ap);
  return -1;
}

static const char *const dtype_names[LT_NUM_DTYPES] = {"f32", "f64", "bf16", "f16", "i32", "i64", "u8", "bool"};
static const int dtype_sizes[LT_NUM_DTYPES] = {4, 8, 2, 2, 4, 8, 1, 1};

const char *lt_dtype_name(int dtype) { return dtype >= 0 && dtype < LT_NUM_DTYPES ? dtype_names[dtype] : "?"; }
int lt_dtype_size(int dtype) { return dtype >= 0 && dtype < LT_NUM_DTYPES ? dtype_sizes[dtype] : 0; }

int lt_dtype_from_name(const char *name, int *dtype) {
  static const struct {
    const char *alias;
    int dtype;
  } aliases[] = {{"float32", LT_F32}, {"float", LT_F32}, {"float64", LT_F64}, {"double", LT_F64}, {"bfloat16", LT_BF16},
                 {"float16", LT_F16}, {"half", LT_F16},  {"fp16", LT_F16},    {"fp32", LT_F32},   {"int32", LT_I32},
                 {"int", LT_I32},     {"int64", LT_I64}, {"long", LT_I64},    {"uint8", LT_U8},   {"byte", LT_U8}};
  if (!name) return lt_errorf("dtype: name is NULL");
  for (int d = 0; d < LT_NUM_DTYPES; d++)
    if (strcmp(name, dtype_names[d]) == 0) return *dtype = d, 0;
  for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
    if (strcmp(name, aliases[i].alias) == 0) return *dtype = aliases[i].dtype, 0;
  return lt_errorf("dtype: unknown dtype '%s' (expected f32, f64, bf16, f16, i32, i64, u8 or bool)", name);
}

bool lt_dtype_is_float(int dtype) { return dtype == LT_F32 || dtype == LT_F64 || dtype == LT_BF16 || dtype == LT_F16; }

const char *lt_shape_str(char *buf, int ndim, const int64_t *shape) {
  size_t n = 0, cap = LT_SHAPE_STR;
  n += (size_t)snprintf(buf + n, cap - n, "[");
  for (int d = 0; d < ndim && n < cap; d++)
    n += (size_t)snprintf(buf + n, cap - n, d ? ",%lld" : "%lld", (long long)shape[d]);
  if (n < cap) snprintf(buf + n, cap - n, "]");
  return buf;
}

const char *lt_device_str(char *buf, int device) {
  if (device == LT_DEVICE_CPU)
    snprintf(buf, 16, "cpu");
  else
    snprintf(buf, 16, "cuda:%d", device);
  return buf;
}

const char *lt_desc(char *buf, const lt_tensor *t) {
  char s[LT_SHAPE_STR], d[16];
  if (!t)
    snprintf(buf, LT_DESC_STR, "(null)");
  else if (!t->storage)
    snprintf(buf, LT_DESC_STR, "(undefined tensor)");
  else
    snprintf(buf, LT_DESC_STR, "%s %s %s", lt_shape_str(s, t->ndim, t->shape), lt_dtype_name(t->dtype),
             lt_device_str(d, t->device));
  return buf;
}
