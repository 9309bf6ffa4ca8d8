/* check.c — the operand checks every op shares: defined, same device, same dtype, a dim in
 * range. Each fails with a message naming the op (core/error.c). */
#include "core/internal.h"

int lt_check_defined(const char *op, const char *what, const lt_tensor *t) {
  if (!t) return lt_errorf("%s: %s is NULL", op, what);
  if (!t->storage) return lt_errorf("%s: %s is undefined (freed, or never allocated)", op, what);
  /* A tensor on an existing GPU whose memory is elsewhere (a struct edited by hand through the
   * FFI) is refused here, before any op could hand its pointer to a kernel. (On a device that
   * does not exist, each op says that instead.) */
  if (t->device >= 0 && t->storage->device != t->device && t->device < lt_cuda_device_count()) {
    char dev[16], sdev[16];
    return lt_errorf("%s: %s claims %s but its memory is on %s", op, what, lt_device_str(dev, t->device),
                     lt_device_str(sdev, t->storage->device));
  }
  return 0;
}

int lt_check_same_device(const char *op, const lt_tensor *a, const lt_tensor *b) {
  if (a->device == b->device) return 0;
  char da[16], db[16];
  return lt_errorf("%s: tensors on different devices: %s vs %s", op, lt_device_str(da, a->device),
                   lt_device_str(db, b->device));
}

int lt_check_same_dtype(const char *op, const lt_tensor *a, const lt_tensor *b) {
  if (a->dtype == b->dtype) return 0;
  return lt_errorf("%s: dtype mismatch: %s vs %s", op, lt_dtype_name(a->dtype), lt_dtype_name(b->dtype));
}

int lt_wrap_dim(const char *op, int dim, int ndim, int *wrapped) {
  int n = ndim > 0 ? ndim : 1; /* a scalar accepts dim 0 / -1, as torch */
  if (dim < -n || dim >= n) return lt_errorf("%s: dim %d out of range for a %d-d tensor", op, dim, ndim);
  *wrapped = dim < 0 ? dim + n : dim;
  return 0;
}
