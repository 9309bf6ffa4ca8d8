/* fake_libcuda.c — a libcuda.so.1 whose driver supports only CUDA 9.0 and never initialises:
 * the CUDA runtime finds "a driver that is too old". tests/cli/test_selftest.sh puts it first
 * on LD_LIBRARY_PATH to check that a broken driver fails `lutra selftest` rather than skip. */
int cuDriverGetVersion(int *version);
int cuInit(unsigned int flags);

int cuDriverGetVersion(int *version) {
  *version = 9000;
  return 0;
}

int cuInit(unsigned int flags) {
  (void)flags;
  return 3; /* CUDA_ERROR_NOT_INITIALIZED */
}
