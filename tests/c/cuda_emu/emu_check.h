/* emu_check.h — what the emulator's suites share (emu_check.c): random CPU tensors, their
 * values on the emulated device 0 (contiguous, strided or transposed storage), outs, and the
 * comparison st.check makes in lutra selftest (max abs err <= tol * max(1, max |want|)). */
#pragma once
#include "lutra.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
extern int emu_quick; /* EMU_QUICK=1: the tiny shapes of the ctest */
extern int emu_passes, emu_fails;
extern long emu_launches;
#define OK(x)                                                                                                          \
  do {                                                                                                                 \
    if ((x) != 0) {                                                                                                    \
      printf("error at %s:%d: %s\n", __FILE__, __LINE__, lt_last_error());                                             \
      emu_fails++;                                                                                                     \
      return;                                                                                                          \
    }                                                                                                                  \
  } while (0)
double emu_uni(void);
int64_t emu_irand(int64_t lo, int64_t hi); /* [lo, hi) */
/* a CPU tensor, uniform in [lo, hi) (floored when ints); NULL on error */
lt_tensor *emu_rnd(int nd, const int64_t *shape, int dtype, double lo, double hi, int ints);
/* x's values on the device: mode 0 contiguous, 1 strided (every other element of the last dim),
 * 2 transposed storage (dims 0 and last swapped), on device 0 (emulated: host memory) */
lt_tensor *emu_dev(const lt_tensor *x, int mode);
/* t (any device, any layout) as a contiguous CPU tensor, bytes copied as they are */
lt_tensor *emu_host(const lt_tensor *t);
/* an undefined (mode 0) or strided (mode 1) out for `want`'s shape and dtype, on the device */
lt_tensor *emu_out(const lt_tensor *want, int mode);
/* got (device) vs want (CPU); records a pass or a fail with the name */
int emu_check(const char *what, int dtype, const lt_tensor *got, const lt_tensor *want, double tol);
double emu_tol(int dtype, double f32, double f64, double bf16, double f16);
extern const char *emu_mode_name[3];
void emu_free(lt_tensor *t); /* lt_release, NULL ok */
