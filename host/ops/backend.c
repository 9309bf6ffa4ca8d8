/* backend.c — which backend runs an op on a device: the lookup every op front calls, and the
 * one place in the ops that knows whether this build has CUDA. */
#include "ops/backend.h"

#ifdef LUTRA_HAVE_CUDA
extern const lt_backend lt_backend_cuda; /* ops/backend_cuda.cu */
const lt_backend *lt_backend_cuda_or_null(void) { return &lt_backend_cuda; }
#else
const lt_backend *lt_backend_cuda_or_null(void) { return NULL; }
#endif

const lt_backend *lt_backend_for(const char *op, int device) {
  if (device == LT_DEVICE_CPU) return &lt_backend_cpu;
  const lt_backend *be = lt_backend_cuda_or_null();
  if (!be) lt_errorf("%s: lutra was built without CUDA", op);
  return be;
}

int lt_backend_check_device(const char *op, int device, const char *absent) {
  if (device == LT_DEVICE_CPU) return 0;
  if (!lt_backend_cuda_or_null()) return lt_errorf(absent, op);
  if (device < 0 || device >= lt_cuda_device_count()) {
    char dev[16];
    return lt_errorf("%s: device %s is not available (%s)", op, lt_device_str(dev, device), lt_cuda_status());
  }
  return 0;
}
