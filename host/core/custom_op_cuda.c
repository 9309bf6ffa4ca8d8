/* custom_op_cuda.c — CUDA bodies of custom ops: CUDA C source compiled at run time with NVRTC
 * into PTX, loaded and launched through the driver API (lutra/cuda.h, "kernels compiled at run
 * time"). Both libraries are opened with dlopen on first use, never linked (NVRTC from
 * $LUTRA_NVRTC alone when set, else the loader's path, $CUDA_HOME/lib64, /usr/local/cuda): a build without the
 * CUDA toolkit, or a machine without a GPU, has these entry points and they say what is
 * missing. The driver shares the runtime's primary context, so a launch sees the tensors the
 * runtime allocated and queues on the same compute stream as every other op. */
#include "core/internal.h"
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- NVRTC -------------------------------------------------------------------------------
 * The few declarations of nvrtc.h used here (its ABI is plain C: an int result, an opaque
 * program handle). */
typedef struct nvrtc_program_s *nvrtc_program;
static struct {
  int tried, ok;
  char why[512];
  const char *(*error_string)(int result);
  int (*version)(int *major, int *minor);
  int (*create)(nvrtc_program *prog, const char *src, const char *name, int nheaders, const char *const *headers,
                const char *const *include_names);
  int (*compile)(nvrtc_program prog, int nopts, const char *const *opts);
  int (*ptx_size)(nvrtc_program prog, size_t *size);
  int (*ptx)(nvrtc_program prog, char *ptx);
  int (*log_size)(nvrtc_program prog, size_t *size);
  int (*log)(nvrtc_program prog, char *log);
  int (*destroy)(nvrtc_program *prog);
} nvrtc;
static pthread_mutex_t open_lock = PTHREAD_MUTEX_INITIALIZER;

/* Opens the first library of `names` that loads; its path is left in why on failure. */
static void *open_first(const char *const *names, char *why, size_t why_len) {
  size_t used = 0;
  for (int i = 0; names[i]; i++) {
    void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (h) return h;
    const char *e = dlerror();
    int n = snprintf(why + used, why_len - used, "%s%s", used ? "; " : "", e ? e : names[i]);
    if (n > 0 && (size_t)n < why_len - used) used += (size_t)n;
  }
  return NULL;
}

static int load_nvrtc(void) {
  pthread_mutex_lock(&open_lock);
  if (!nvrtc.tried) {
    nvrtc.tried = 1;
    /* the loader's path first (ldconfig knows the toolkit on most installs), then the toolkit */
    static const char *const names[] = {"libnvrtc.so",
                                        "libnvrtc.so.13",
                                        "libnvrtc.so.12",
                                        "libnvrtc.so.11.2",
                                        "/usr/local/cuda/lib64/libnvrtc.so",
                                        "/usr/local/cuda/lib/libnvrtc.so",
                                        NULL};
    char path[512] = {0};
    const char *home = getenv("CUDA_HOME"), *only = getenv("LUTRA_NVRTC");
    void *h = NULL;
    if (only && *only) { /* this library and no other (tests: what a machine without NVRTC sees) */
      const char *one[] = {only, NULL};
      h = open_first(one, nvrtc.why, sizeof nvrtc.why);
    } else {
      if (home && *home) {
        snprintf(path, sizeof path, "%s/lib64/libnvrtc.so", home);
        h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
      }
      if (!h) h = open_first(names, nvrtc.why, sizeof nvrtc.why);
    }
    if (h) {
      /* dlsym returns void*; the function types are nvrtc.h's */
#define SYM(field, name) *(void **)&nvrtc.field = dlsym(h, name)
      SYM(error_string, "nvrtcGetErrorString");
      SYM(version, "nvrtcVersion");
      SYM(create, "nvrtcCreateProgram");
      SYM(compile, "nvrtcCompileProgram");
      SYM(ptx_size, "nvrtcGetPTXSize");
      SYM(ptx, "nvrtcGetPTX");
      SYM(log_size, "nvrtcGetProgramLogSize");
      SYM(log, "nvrtcGetProgramLog");
      SYM(destroy, "nvrtcDestroyProgram");
#undef SYM
      nvrtc.ok = nvrtc.error_string && nvrtc.version && nvrtc.create && nvrtc.compile && nvrtc.ptx_size &&
                 nvrtc.ptx && nvrtc.log_size && nvrtc.log && nvrtc.destroy;
      if (!nvrtc.ok) snprintf(nvrtc.why, sizeof nvrtc.why, "libnvrtc lacks an nvrtc* function this needs");
    }
  }
  pthread_mutex_unlock(&open_lock);
  if (!nvrtc.ok) return lt_errorf("nvrtc: NVRTC (the CUDA toolkit's run-time compiler) cannot be loaded: %s", nvrtc.why);
  return 0;
}

int lt_rtc_version(int *major, int *minor) {
  LT_TRY(load_nvrtc());
  int r = nvrtc.version(major, minor);
  return r ? lt_errorf("nvrtc: nvrtcVersion: %s", nvrtc.error_string(r)) : 0;
}

void lt_rtc_free(char *p) { free(p); }

/* Splits options at newlines into a NULL-terminated array pointing into a copy (*buf). */
static int split_options(const char *options, char **buf, const char ***argv, int *argc) {
  *buf = strdup(options ? options : "");
  int n = 0;
  for (const char *c = *buf; *c; c++) n += *c == '\n';
  *argv = calloc((size_t)n + 2, sizeof **argv);
  if (!*buf || !*argv) return lt_errorf("nvrtc: out of host memory");
  *argc = 0;
  for (char *tok = strtok(*buf, "\n"); tok; tok = strtok(NULL, "\n")) (*argv)[(*argc)++] = tok;
  return 0;
}

int lt_rtc_compile(const char *source, const char *name, const char *options, char **ptx, char **log) {
  if (ptx) *ptx = NULL;
  if (log) *log = NULL;
  if (!source || !name || !ptx || !log) return lt_errorf("nvrtc: source, name, ptx and log must not be NULL");
  LT_TRY(load_nvrtc());
  char *buf = NULL;
  const char **argv = NULL;
  int argc = 0, status = split_options(options, &buf, &argv, &argc);
  nvrtc_program prog = NULL;
  int r = status ? 0 : nvrtc.create(&prog, source, name, 0, NULL, NULL);
  if (!status && r) status = lt_errorf("nvrtc: nvrtcCreateProgram: %s", nvrtc.error_string(r));
  int compiled = status ? 0 : nvrtc.compile(prog, argc, argv);
  size_t n = 0;
  if (!status && !nvrtc.log_size(prog, &n) && n > 1 && (*log = malloc(n))) nvrtc.log(prog, *log);
  if (!status && compiled) {
    status = lt_errorf("nvrtc: compiling %s failed: %s", name, nvrtc.error_string(compiled));
  } else if (!status) {
    r = nvrtc.ptx_size(prog, &n);
    if (!r && !(*ptx = malloc(n + 1))) r = -1;
    if (!r) r = nvrtc.ptx(prog, *ptx);
    if (r) status = lt_errorf("nvrtc: reading the PTX of %s failed", name);
    else (*ptx)[n] = 0;
  }
  if (prog) nvrtc.destroy(&prog);
  free(buf);
  free(argv);
  if (status) {
    free(*ptx);
    *ptx = NULL;
  }
  return status;
}

/* ---- the driver API -------------------------------------------------------------------------
 * The declarations of cuda.h used here: results are ints, handles opaque pointers, a device
 * an int. */
enum { CU_ATTR_CC_MAJOR = 75, CU_ATTR_CC_MINOR = 76 };
static struct {
  int tried, ok;
  char why[768];
  int (*init)(unsigned flags);
  int (*error_name)(int result, const char **name);
  int (*error_string)(int result, const char **text);
  int (*device_get)(int *device, int ordinal);
  int (*device_attribute)(int *value, int attribute, int device);
  int (*primary_retain)(void **ctx, int device);
  int (*ctx_push)(void *ctx);
  int (*ctx_pop)(void **ctx);
  int (*module_load)(void **module, const void *image);
  int (*module_function)(void **function, void *module, const char *name);
  int (*launch)(void *function, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                unsigned shared_bytes, void *stream, void **params, void **extra);
} cu;

static int cu_fail(const char *what, int r) {
  const char *name = "?", *text = "?";
  if (cu.error_name) cu.error_name(r, &name);
  if (cu.error_string) cu.error_string(r, &text);
  return lt_errorf("custom_op: %s: %s (%s)", what, text, name);
}

static int load_driver(void) {
  pthread_mutex_lock(&open_lock);
  if (!cu.tried) {
    cu.tried = 1;
    static const char *const names[] = {"libcuda.so.1", NULL};
    void *h = open_first(names, cu.why, sizeof cu.why);
    if (h) {
#define SYM(field, name) *(void **)&cu.field = dlsym(h, name)
      SYM(init, "cuInit");
      SYM(error_name, "cuGetErrorName");
      SYM(error_string, "cuGetErrorString");
      SYM(device_get, "cuDeviceGet");
      SYM(device_attribute, "cuDeviceGetAttribute");
      SYM(primary_retain, "cuDevicePrimaryCtxRetain");
      SYM(ctx_push, "cuCtxPushCurrent_v2");
      SYM(ctx_pop, "cuCtxPopCurrent_v2");
      SYM(module_load, "cuModuleLoadData");
      SYM(module_function, "cuModuleGetFunction");
      SYM(launch, "cuLaunchKernel");
#undef SYM
      int r = -1;
      if (!(cu.init && cu.error_name && cu.error_string && cu.device_get && cu.device_attribute && cu.primary_retain &&
            cu.ctx_push && cu.ctx_pop && cu.module_load && cu.module_function && cu.launch)) {
        snprintf(cu.why, sizeof cu.why, "libcuda.so.1 lacks a cu* function this needs");
      } else if ((r = cu.init(0)) != 0) {
        const char *name = "?", *text = "?";
        cu.error_name(r, &name), cu.error_string(r, &text);
        snprintf(cu.why, sizeof cu.why, "cuInit: %s (%s)", text, name);
      }
      cu.ok = r == 0;
    }
  }
  pthread_mutex_unlock(&open_lock);
  if (!cu.ok) return lt_errorf("custom_op: no GPU: the CUDA driver cannot be used (%s)", cu.why);
  return 0;
}

/* Makes the device's primary context (the runtime's) current on this thread; pop it after. */
static int push_device(int device) {
  int dev = 0, r = cu.device_get(&dev, device);
  if (r) return cu_fail("cuDeviceGet", r);
  void *ctx = NULL;
  if ((r = cu.primary_retain(&ctx, dev))) return cu_fail("cuDevicePrimaryCtxRetain", r);
  if ((r = cu.ctx_push(ctx))) return cu_fail("cuCtxPushCurrent", r);
  return 0;
}

int lt_rtc_device_arch(int device, int *arch) {
  if (!arch) return lt_errorf("custom_op: arch is NULL");
  LT_TRY(load_driver());
  int dev = 0, major = 0, minor = 0, r = cu.device_get(&dev, device);
  if (!r) r = cu.device_attribute(&major, CU_ATTR_CC_MAJOR, dev);
  if (!r) r = cu.device_attribute(&minor, CU_ATTR_CC_MINOR, dev);
  if (r) return cu_fail("cuDeviceGetAttribute", r);
  *arch = major * 10 + minor;
  return 0;
}

int lt_rtc_module_load(const char *ptx, const char *kernel, int device, void **function) {
  if (!ptx || !kernel || !function) return lt_errorf("custom_op: ptx, kernel and function must not be NULL");
  *function = NULL;
  LT_TRY(load_driver());
  LT_TRY(push_device(device));
  void *module = NULL, *ctx = NULL;
  int r = cu.module_load(&module, ptx), status = 0;
  if (r) status = cu_fail("cuModuleLoadData", r);
  else if ((r = cu.module_function(function, module, kernel))) status = cu_fail("cuModuleGetFunction", r);
  cu.ctx_pop(&ctx);
  return status; /* modules live as long as the process: the caller caches them by source hash */
}

int lt_rtc_launch(void *function, int device, const uint32_t *grid, const uint32_t *block, uint32_t shared_bytes,
                  const void *args, int64_t args_size) {
  if (!function || !grid || !block || !args || args_size <= 0)
    return lt_errorf("custom_op: launch needs a function, grid, block and arguments");
  LT_TRY(load_driver());
  void *stream = NULL;
  LT_TRY(lt_cuda_stream_handle(device, LT_STREAM_COMPUTE, &stream));
  LT_TRY(push_device(device));
  void *params[1] = {(void *)args}; /* one kernel parameter: the argument block, by value */
  void *ctx = NULL;
  int r = cu.launch(function, grid[0], grid[1], grid[2], block[0], block[1], block[2], shared_bytes, stream, params,
                    NULL);
  cu.ctx_pop(&ctx);
  return r ? cu_fail("cuLaunchKernel", r) : 0;
}
