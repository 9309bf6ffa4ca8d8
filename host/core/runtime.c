/* runtime.c — version, build information, threads, and the CUDA probe. */
#include "core/device.h"
#include <cblas.h>
#include <pthread.h>
#include <stdio.h>
#ifdef LUTRA_HAVE_MPI
#include <mpi.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

extern const char lt_api_cdef_text[];

const char *lt_version(void) { return LUTRA_VERSION; }
const char *lt_api_cdef(void) { return lt_api_cdef_text; }

/* OpenBLAS exports these; declared here since cblas.h variants differ. */
char *openblas_get_config(void);
int openblas_get_num_threads(void);
void openblas_set_num_threads(int n);

int lt_get_num_threads(void) {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

int lt_set_num_threads(int n) {
  if (n < 1) return lt_errorf("set_num_threads: need at least 1 thread, got %d", n);
#ifdef _OPENMP
  /* BLAS stays on one thread: lt_matmul cuts big gemms over the OpenMP threads itself
   * (two spinning thread pools on the same cores fight, see ops/matmul.c) */
  omp_set_num_threads(n);
  openblas_set_num_threads(1);
#else
  openblas_set_num_threads(n);
#endif
  return 0;
}

/* ---- CUDA probe: done once, never fails ------------------------------------------- */

static int cuda_count = 0, cuda_availability = LT_CUDA_NOT_BUILT;
static char cuda_status_text[256];
static pthread_once_t cuda_probe_once = PTHREAD_ONCE_INIT;

static void probe_cuda_once(void) {
  const lt_device_runtime *rt = lt_device_cuda();
  int n = 0;
  if (rt) {
    cuda_availability = rt->init_devices(&n, cuda_status_text, sizeof cuda_status_text);
    if (cuda_availability != LT_CUDA_READY) n = 0;
  } else {
    snprintf(cuda_status_text, sizeof cuda_status_text, "built without CUDA");
  }
  cuda_count = n;
}

static void probe_cuda(void) { pthread_once(&cuda_probe_once, probe_cuda_once); }

int lt_cuda_device_count(void) {
  probe_cuda();
  return cuda_count;
}

const char *lt_cuda_status(void) {
  probe_cuda();
  return cuda_status_text;
}

int lt_cuda_availability(void) {
  probe_cuda();
  return cuda_availability;
}

int lt_cuda_synchronize(int device) {
  if (device == LT_DEVICE_CPU) return 0;
  if (device < 0 || device >= lt_cuda_device_count())
    return lt_errorf("cuda_synchronize: device cuda:%d is not available (%s)", device, lt_cuda_status());
  return lt_device_cuda()->synchronize(device); /* a device exists: so does the table */
}

const char *lt_build_info(void) {
  static char info[2048];
  size_t n = 0, cap = sizeof info;
  n += (size_t)snprintf(info + n, cap - n, "lutra %s\ncompiler: %s\n", LUTRA_VERSION, __VERSION__);
  n +=
      (size_t)snprintf(info + n, cap - n, "blas: %s (threads %d)\n", openblas_get_config(), openblas_get_num_threads());
#ifdef _OPENMP
  n += (size_t)snprintf(info + n, cap - n, "openmp: %d (max threads %d)\n", _OPENMP, omp_get_max_threads());
#else
  n += (size_t)snprintf(info + n, cap - n, "openmp: no\n");
#endif
#ifdef LUTRA_HAVE_CUDA
  n +=
      (size_t)snprintf(info + n, cap - n, "cuda: built with CUDA %s for sm %s\n", LUTRA_CUDA_VERSION, LUTRA_CUDA_ARCHS);
#else
  n += (size_t)snprintf(info + n, cap - n, "cuda: not built\n");
#endif
#ifdef LUTRA_HAVE_NCCL
  n += (size_t)snprintf(info + n, cap - n, "nccl: %s\n", LUTRA_NCCL_VERSION);
#else
  n += (size_t)snprintf(info + n, cap - n, "nccl: not built\n");
#endif
#ifdef LUTRA_HAVE_MPI
  char mpi_version[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(mpi_version, &len); /* allowed before MPI_Init */
  char *nl = strchr(mpi_version, ',');
  if (nl) *nl = 0;
  snprintf(info + n, cap - n, "mpi: %s\n", mpi_version);
#else
  snprintf(info + n, cap - n, "mpi: not built\n");
#endif
  return info;
}
