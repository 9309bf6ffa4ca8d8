/* test_custom_op_cuda.c — the C side of custom ops' CUDA bodies (host/core/custom_op_cuda.c) on any
 * machine: NVRTC (dlopen'ed) turns CUDA C into PTX with the entry in it, for the architecture and
 * with the macros the options give; a compile error fails with NVRTC's log naming the source's
 * line; bad arguments are refused; loading and launching say "no GPU" and why (ctest hides any
 * GPU). Skipped (77) only where libnvrtc cannot be loaded (LUTRA_NVRTC=/nonexistent shows that path). The Lua side: tests/lua/test_custom_op.lua. */
#include "check.h"
#include <stdlib.h>

static const char *SRC = "extern \"C\" __global__ void twice(float *y, const float *x, int n) {\n"
                         "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
                         "  if (i < n) y[i] = SCALE * x[i];\n"
                         "}\n";

static void test_compile(void) {
  char *ptx = NULL, *log = NULL;
  CHECK_OK(lt_rtc_compile(SRC, "twice.cu", "--gpu-architecture=compute_80\n-DSCALE=3.0f", &ptx, &log));
  CHECK(ptx && strstr(ptx, ".entry twice"), "no entry in the PTX");
  CHECK(ptx && strstr(ptx, ".target sm_80"), "not compiled for sm_80");
  CHECK(ptx && strstr(ptx, "0f40400000"), "SCALE (3.0f) is not in the PTX"); /* 3.0f as PTX writes it */
  lt_rtc_free(ptx), lt_rtc_free(log);
  /* another architecture */
  CHECK_OK(lt_rtc_compile(SRC, "twice.cu", "--gpu-architecture=compute_90\n-DSCALE=3.0f", &ptx, &log));
  CHECK(ptx && strstr(ptx, ".target sm_90"), "not compiled for sm_90");
  lt_rtc_free(ptx), lt_rtc_free(log);
  /* SCALE missing: an error on line 3, the log says so */
  CHECK_ERR(lt_rtc_compile(SRC, "twice.cu", "--gpu-architecture=compute_80", &ptx, &log),
            "nvrtc: compiling twice.cu failed: NVRTC_ERROR_COMPILATION");
  CHECK(ptx == NULL, "PTX left after a failed compile");
  CHECK(log && strstr(log, "twice.cu(3): error: identifier \"SCALE\" is undefined"), "log: %s", log ? log : "(none)");
  lt_rtc_free(log);
  /* an unknown option */
  CHECK_ERR(lt_rtc_compile(SRC, "twice.cu", "--no-such-option", &ptx, &log), "nvrtc: compiling twice.cu failed");
  lt_rtc_free(log);
  CHECK_ERR(lt_rtc_compile(NULL, "twice.cu", "", &ptx, &log), "must not be NULL");
  CHECK_ERR(lt_rtc_compile(SRC, "twice.cu", "", NULL, &log), "must not be NULL");
}

static void test_no_gpu(void) {
  void *fn = (void *)1;
  CHECK_ERR(lt_rtc_module_load(".version 8.0\n", "twice", 0, &fn), "custom_op: no GPU: the CUDA driver cannot be used (");
  CHECK(fn == NULL, "function left set");
  int arch = 0;
  CHECK_ERR(lt_rtc_device_arch(0, &arch), "no GPU");
  uint32_t grid[3] = {1, 1, 1}, block[3] = {32, 1, 1};
  char args[16] = {0};
  CHECK_ERR(lt_rtc_launch((void *)1, 0, grid, block, 0, args, sizeof args), "no GPU");
  CHECK_ERR(lt_rtc_launch(NULL, 0, grid, block, 0, args, sizeof args), "needs a function");
  CHECK_ERR(lt_rtc_module_load(NULL, "twice", 0, &fn), "must not be NULL");
}

int main(void) {
  int major = 0, minor = 0;
  if (lt_rtc_version(&major, &minor) != 0) return check_skip(lt_last_error());
  printf("NVRTC %d.%d\n", major, minor);
  test_compile();
  CHECK(lt_cuda_device_count() == 0, "a GPU is visible: run with CUDA_VISIBLE_DEVICES= (as ctest does)");
  test_no_gpu();
  return check_summary();
}
