/* random.h — the random-number kernel (kernels/random.cu) as host/ops/random.c calls it:
 * the same recipe, through kernels/philox.h.
 *
 * The host checks every argument (with the CPU's messages) before calling these; they take
 * device pointers of contiguous buffers unless strides are given, launch on the device's
 * compute stream and return 0, or -1 with the error set. */
#ifndef LUTRA_KERNELS_RANDOM_H
#define LUTRA_KERNELS_RANDOM_H
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif

enum { LT_RNG_UNIFORM = 0, LT_RNG_NORMAL = 1, LT_RNG_INT = 2, LT_RNG_BERNOULLI = 3 };
typedef struct lt_cuda_rng_args {
  int device, dtype, kind, ndim;
  void *data;        /* element [0,...,0] of out */
  int64_t shape[8];  /* LT_MAX_DIMS; element i (row-major over shape) gets counter offset + i */
  int64_t stride[8]; /* in elements */
  uint32_t key[2];   /* low32(seed), high32(seed) */
  uint64_t offset;
  double a, b;        /* uniform: lo, hi - lo; normal: mean, std */
  uint64_t first_top; /* uniform: draws from here on give lo */
  uint32_t below;     /* bernoulli */
  int64_t ilo;        /* rand_int: lo, range */
  uint64_t range;
} lt_cuda_rng_args;
int lt_cuda_rng_fill(const lt_cuda_rng_args *a);

#ifdef __cplusplus
}
#endif
#endif
