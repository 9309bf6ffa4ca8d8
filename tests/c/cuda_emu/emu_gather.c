/* emu_gather.c — kernels/gather.cu under the emulator against the CPU ops (suite "gather"): gather,
 * scatter, scatter_add, scatter_reduce amax/amin, index_select, index_add and index_copy on the
 * same inputs on both sides (device copies contiguous, strided or transposed; i32 and i64 index
 * with repeats), every output bit-identical (the kernel sums each line in index order as the CPU
 * row does: tolerance 0, as lua/lutra/selftest/gather.lua's), and an out-of-range index refused by
 * both with one message. */
#include "emu_check.h"
#include <string.h>

static const int dts[] = {LT_F32, LT_F64, LT_BF16, LT_F16, LT_I32};

static void check_pair(const char *name, int dt, int rc_c, int rc_d, lt_tensor *c, lt_tensor *d) {
  if (rc_c || rc_d) {
    emu_fails++,
        printf("FAIL %s %s: cpu rc %d, device rc %d: %s\n", name, lt_dtype_name(dt), rc_c, rc_d, lt_last_error());
    return;
  }
  emu_check(name, dt, d, c, 0);
}

static void gather_cases(int64_t A, int64_t B, int64_t Cn, int dim, int64_t n) {
  int64_t xs[3] = {A, B, Cn}, is[3] = {A, B, Cn};
  is[dim] = n;
  char name[96];
  for (int k = 0; k < 5; k++) {
    int dt = dts[k];
    lt_tensor *x = emu_rnd(3, xs, dt, -2, 2, dt == LT_I32), *src = emu_rnd(3, is, dt, -2, 2, dt == LT_I32);
    for (int idt = LT_I32; idt <= LT_I64; idt++) {
      lt_tensor *index = emu_rnd(3, is, idt, 0, (double)xs[dim], 1), *sel = emu_rnd(1, &n, idt, 0, (double)xs[dim], 1);
      for (int mode = 0; mode < 3; mode++) {
        if (emu_quick && mode == 2) continue;
        lt_tensor *xd = emu_dev(x, mode), *sd = emu_dev(src, (mode + 1) % 3), *id = emu_dev(index, mode % 2);
        lt_tensor *seld = emu_dev(sel, 0);
        lt_tensor *c = lt_tensor_new(), *d = lt_tensor_new();
#define BOTH(label, call_c, call_d)                                                                                    \
  do {                                                                                                                 \
    snprintf(name, sizeof name, "%s %s dim %d%s", label, lt_dtype_name(idt), dim, emu_mode_name[mode]);                \
    int rc_c = (call_c), rc_d = (call_d);                                                                              \
    check_pair(name, dt, rc_c, rc_d, c, d);                                                                            \
    lt_release(c), lt_release(d), c = lt_tensor_new(), d = lt_tensor_new();                                            \
  } while (0)
        BOTH("gather", lt_gather(c, x, dim, index), lt_gather(d, xd, dim, id));
        BOTH("scatter_add", lt_scatter_add(c, x, dim, index, src), lt_scatter_add(d, xd, dim, id, sd));
        BOTH("scatter", lt_scatter(c, x, dim, index, src), lt_scatter(d, xd, dim, id, sd));
        BOTH("scatter_reduce amax", lt_scatter_reduce(c, x, dim, index, src, "amax"),
             lt_scatter_reduce(d, xd, dim, id, sd, "amax"));
        BOTH("scatter_reduce amin", lt_scatter_reduce(c, x, dim, index, src, "amin"),
             lt_scatter_reduce(d, xd, dim, id, sd, "amin"));
        BOTH("index_select", lt_index_select(c, x, dim, sel), lt_index_select(d, xd, dim, seld));
        BOTH("index_add", lt_index_add(c, x, dim, sel, src), lt_index_add(d, xd, dim, seld, sd));
        BOTH("index_copy", lt_index_copy(c, x, dim, sel, src), lt_index_copy(d, xd, dim, seld, sd));
#undef BOTH
        lt_release(c), lt_release(d), lt_release(xd), lt_release(sd), lt_release(id), lt_release(seld);
      }
      lt_release(index), lt_release(sel);
    }
    lt_release(x), lt_release(src);
  }
}

/* an index out of range: both sides refuse, with the same message */
static void bad_index_case(void) {
  int64_t xs[2] = {2, 3};
  lt_tensor *x = emu_rnd(2, xs, LT_F32, -1, 1, 0), *index = emu_rnd(2, xs, LT_I64, 0, 3, 1);
  ((int64_t *)lt_data_ptr(index))[4] = 7;
  lt_tensor *xd = emu_dev(x, 0), *id = emu_dev(index, 0), *c = lt_tensor_new(), *d = lt_tensor_new();
  char cpu_msg[256];
  int rc_c = lt_gather(c, x, 1, index);
  snprintf(cpu_msg, sizeof cpu_msg, "%s", lt_last_error());
  int rc_d = lt_gather(d, xd, 1, id);
  if (rc_c == 0 || rc_d == 0 || strcmp(cpu_msg, lt_last_error()) != 0)
    emu_fails++,
        printf("FAIL gather bad index: cpu rc %d '%s', device rc %d '%s'\n", rc_c, cpu_msg, rc_d, lt_last_error());
  else
    emu_passes++;
  lt_release(x), lt_release(index), lt_release(xd), lt_release(id), lt_release(c), lt_release(d);
}

void emu_suite_gather(void) {
  gather_cases(2, 3, 4, 1, 5);
  gather_cases(3, 1, 5, 0, 2);
  bad_index_case();
  if (emu_quick) return;
  gather_cases(4, 33, 7, 2, 9);
  gather_cases(40, 6, 300, 0, 70);
}
