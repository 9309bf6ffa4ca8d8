/* backend.c — which backend runs an op on a device: the one lookup every op front calls, and the
 * one place in the ops that knows whether this build has CUDA. */
#include "ops/backend.h"

#ifdef LUTRA_HAVE_CUDA
extern const lt_backend lt_backend_cuda; /* ops/backend_cuda.cu */
static const lt_backend *const cuda_table = &lt_backend_cuda;
#else
static const lt_backend *const cuda_table = NULL;
#endif

const lt_backend *lt_backend_lookup(const char *op, int device, const char *absent, bool available) {
  if (device == LT_DEVICE_CPU) return &lt_backend_cpu;
  if (!cuda_table) {
    if (absent) lt_errorf(absent, op);
    return NULL;
  }
  if (available && (device < 0 || device >= lt_cuda_device_count())) {
    char dev[16];
    lt_errorf("%s: device %s is not available (%s)", op, lt_device_str(dev, device), lt_cuda_status());
    return NULL;
  }
  return cuda_table;
}
