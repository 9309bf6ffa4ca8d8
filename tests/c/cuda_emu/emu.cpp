/* emu.cpp — the emulator's launch and the CUDA runtime entry points kernels/ and host/ call
 * (emu.h), in place of host/core/cuda_runtime.cu and core/cuda_streams.cu: device memory is malloc'ed host
 * memory (filled with 0xff, so that a kernel reading what nobody wrote shows), streams and
 * events are no-ops (everything runs synchronously, in program order).
 * EMU_SMS (default 1) is the number of SMs lt_cuda_blocks sizes grids for: small values make
 * the kernels' grid-stride and split (two-pass) paths run on small inputs. */
#include "kernels/attention_tile.cuh"
#include "kernels/matmul.h"
#include <map>
#include <stdarg.h>
thread_local dim3 threadIdx, blockIdx;
thread_local unsigned emu_tid;
dim3 blockDim, gridDim;
unsigned char *emu_dyn_smem;
std::atomic<long> emu_errors;
emu_block_state *emu_bs;
int emu_launch_error;
long emu_launches, emu_threads, emu_mma_ops;
const char *emu_kernel;
static int quiet; /* emu_expect: count the reports without printing them (but with EMU_VERBOSE) */
static long reports_this_launch;

void emu_report(const char *fmt, ...) {
  emu_errors++;
  if (quiet || ++reports_this_launch > 8) return; /* the first few of a launch tell the story */
  va_list ap;
  va_start(ap, fmt);
  fputs("emu: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}
/* Runs f and returns the emulator errors it caused, which no longer count (the errors suite's
 * negative checks: each rule must be reported when broken). */
extern "C" long emu_expect(void (*f)(void)) {
  long before = emu_errors.load();
  quiet = !getenv("EMU_VERBOSE");
  f();
  quiet = 0;
  long n = emu_errors.load() - before;
  emu_errors -= n;
  return n;
}

/* D = A B + C for warp w from its lanes' fragments (emu.h lists the layouts). The products of
 * bf16 or f16 values are exact in f64 and so is the sum of 16 of them, to 2^-40 or so of the
 * largest: D is the f32 rounding of (nearly) the exact result. A GPU's adder tree rounds or
 * truncates along the way: its D may differ in the last bits of f32. */
void emu_mma_warp(int w) {
  emu_mma_lane *m = emu_bs->mma[w];
  int kind = m[emu_tid % 32].kind;
  for (int l = 0; l < 32; l++)
    if (m[l].kind != kind) {
      emu_report("kernel %s: mma.sync of warp %d: lane %d %s", emu_kernel, w, l,
                 m[l].kind ? "has the other input type" : "is not at the mma (exited, or at another warp op)");
      break;
    }
  float A[16][16], B[16][8];
  for (int l = 0; l < 32; l++) {
    int gid = l / 4, tig = l % 4;
    for (int r = 0; r < 4; r++)
      for (int h = 0; h < 2; h++) {
        uint16_t x = (uint16_t)(m[l].a[r] >> (16 * h));
        A[gid + 8 * (r & 1)][2 * tig + h + 8 * (r >> 1)] = kind == EMU_MMA_F16 ? lt_f16_to_f32(x) : lt_bf16_to_f32(x);
      }
    for (int r = 0; r < 2; r++)
      for (int h = 0; h < 2; h++) {
        uint16_t x = (uint16_t)(m[l].b[r] >> (16 * h));
        B[2 * tig + h + 8 * r][gid] = kind == EMU_MMA_F16 ? lt_f16_to_f32(x) : lt_bf16_to_f32(x);
      }
  }
  for (int l = 0; l < 32; l++) {
    int gid = l / 4, tig = l % 4;
    for (int e = 0; e < 4; e++) {
      int row = gid + 8 * (e >> 1), col = 2 * tig + (e & 1);
      double acc = m[l].c[e];
      for (int k = 0; k < 16; k++) acc += (double)A[row][k] * B[k][col];
      m[l].d[e] = (float)acc;
    }
    m[l].kind = 0;
  }
  emu_bs->mma_seq[w]++;
  emu_mma_ops++;
}
extern "C" long emu_mma_count(void) { return emu_mma_ops; }

void emu_misaligned(const void *p, size_t align) {
  emu_report("kernel %s: misaligned %zu-byte vector access at %p (thread %u of block (%u,%u,%u))", emu_kernel, align, p,
             emu_tid, blockIdx.x, blockIdx.y, blockIdx.z);
}

/* Dynamic shared memory a launch may use: 48 KB, or what cudaFuncSetAttribute opted in to. */
enum { EMU_SMEM_DEFAULT = 48 * 1024, EMU_SMEM_OPTIN = 227 * 1024 };
static std::map<const void *, int> smem_optin;
cudaError_t emu_func_set_attribute(const void *kernel, int attr, int value) {
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaSuccess;
  if (value < 0 || value > EMU_SMEM_OPTIN) return cudaErrorInvalidValue;
  smem_optin[kernel] = value;
  return cudaSuccess;
}

/* Static __shared__ arrays seen so far, each with the last launch that used it. A launch's static
 * arrays count against the same limits as its dynamic shared memory (static alone: 48 KB). */
enum { EMU_POISON = 0xff };
struct smem_region {
  void *p;
  size_t n;
  long launch;
};
static std::vector<smem_region> smem_regions;
static size_t launch_dyn, launch_max, launch_static;
static void static_used(size_t n) {
  launch_static += n;
  if (launch_static > EMU_SMEM_DEFAULT || launch_static + launch_dyn > launch_max)
    emu_report("kernel %s: %zu bytes of static and %zu of dynamic shared memory, over the %zu it may use", emu_kernel,
               launch_static, launch_dyn, launch_max);
}
void emu_smem_static(void *p, size_t n) {
  for (smem_region &r : smem_regions)
    if (r.p == p) {
      if (r.launch != emu_launches) memset(p, EMU_POISON, n), r.launch = emu_launches, static_used(n);
      return;
    }
  memset(p, EMU_POISON, n);
  smem_regions.push_back({p, n, emu_launches});
  static_used(n);
}

/* The fibers of a launch: one per thread of a block, restarted for every block. On x86-64 a
 * switch is emu_switch below (callee-saved registers and the FP control words, no system call);
 * elsewhere ucontext's swapcontext, which also saves the signal mask (a system call a switch:
 * most of the emulator's time). */
enum { EMU_STACK = 256 * 1024 };
#if defined(__x86_64__)
struct emu_ctx {
  void *sp;
};
/* saves the running context's registers on its stack and its stack pointer in *save, then
 * resumes the context whose stack pointer is load */
extern "C" void emu_switch(void **save, void *load);
extern "C" void emu_fiber_entry(); /* a new fiber's first return: calls r12(rbx) */
asm(R"(.text
.globl emu_switch
.type emu_switch, @function
emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
.size emu_switch, .-emu_switch
.globl emu_fiber_entry
.type emu_fiber_entry, @function
emu_fiber_entry:
  movq %rbx, %rdi
  andq $-16, %rsp
  callq *%r12
  ud2
.size emu_fiber_entry, .-emu_fiber_entry
)");
static void ctx_start(emu_ctx *c, char *stack, void (*fn)(unsigned), unsigned arg) {
  uint64_t *sp = (uint64_t *)((uintptr_t)(stack + EMU_STACK) & ~(uintptr_t)15) - 8; /* emu_switch's frame */
  sp[0] = 0x1f80 | (uint64_t)0x037f << 32; /* MXCSR, x87 control word: the defaults */
  sp[1] = sp[2] = sp[3] = 0, sp[4] = (uint64_t)(uintptr_t)fn, sp[5] = arg, sp[6] = 0; /* r15-r13, r12, rbx, rbp */
  sp[7] = (uint64_t)(uintptr_t)emu_fiber_entry;
  c->sp = sp;
}
static void ctx_switch(emu_ctx *save, emu_ctx *load) { emu_switch(&save->sp, load->sp); }
#else
#include <ucontext.h>
struct emu_ctx {
  ucontext_t uc;
};
static void ctx_start(emu_ctx *c, char *stack, void (*fn)(unsigned), unsigned arg) {
  getcontext(&c->uc);
  c->uc.uc_stack.ss_sp = stack, c->uc.uc_stack.ss_size = EMU_STACK, c->uc.uc_link = nullptr;
  makecontext(&c->uc, (void (*)())fn, 1, arg);
}
static void ctx_switch(emu_ctx *save, emu_ctx *load) { swapcontext(&save->uc, &load->uc); }
#endif
struct emu_fiber {
  emu_ctx ctx;
  char *stack;
  emu_bar *bar; /* waiting on it while bar->gen == gen */
  unsigned gen;
  bool done;
};
static std::vector<emu_fiber> fibers;
static emu_ctx sched_ctx;
static unsigned cur, nfibers;
static std::function<void()> *cur_f;
static dim3 cur_block;
static void set_thread(unsigned t) {
  emu_tid = t;
  threadIdx = dim3(t % cur_block.x, t / cur_block.x % cur_block.y, t / (cur_block.x * cur_block.y));
}
void emu_wait(emu_bar *bar, unsigned gen) {
  fibers[cur].bar = bar, fibers[cur].gen = gen;
  ctx_switch(&fibers[cur].ctx, &sched_ctx);
  set_thread(cur);
}
static void fiber_main(unsigned t) {
  set_thread(t);
  (*cur_f)();
  emu_fiber &me = fibers[t];
  me.done = true;
  emu_bs->exited[t / 32][t % 32] = 1;
  emu_bs->warp_bar[t / 32].leave();
  emu_bs->block_bar.leave();
  ctx_switch(&me.ctx, &sched_ctx); /* never resumed */
  abort();
}

void emu_launch_fn(dim3 grid, dim3 block, size_t smem, const char *name, const void *kernel, std::function<void()> f) {
  unsigned nt = block.x * block.y * block.z;
  reports_this_launch = 0;
  auto optin = smem_optin.find(kernel);
  size_t smem_max = optin != smem_optin.end() && optin->second > EMU_SMEM_DEFAULT ? optin->second : EMU_SMEM_DEFAULT;
  if (smem > smem_max) {
    emu_report("kernel %s launched with %zu bytes of dynamic shared memory, over %zu (%s)", name, smem, smem_max,
               smem_max == EMU_SMEM_DEFAULT ? "no cudaFuncSetAttribute MaxDynamicSharedMemorySize opt-in"
                                            : "its MaxDynamicSharedMemorySize");
    emu_launch_error = 1; /* cudaErrorInvalidValue */
    return;
  }
  launch_dyn = smem, launch_max = smem_max, launch_static = 0;
  if (nt == 0 || nt > 1024 || block.z > 64 || grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 ||
      grid.z > 65535 || grid.x > 2147483647u) {
    emu_report("kernel %s: bad launch grid (%u,%u,%u) block (%u,%u,%u)", name, grid.x, grid.y, grid.z, block.x, block.y,
               block.z);
    emu_launch_error = 9; /* cudaErrorInvalidConfiguration */
    return;
  }
  if (nt % 32 && nt != 1 && getenv("EMU_VERBOSE")) fprintf(stderr, "emu: note: block of %u threads\n", nt);
  emu_launches++;
  emu_threads += (long)grid.x * grid.y * grid.z * nt;
  static emu_block_state *bs = new emu_block_state;
  emu_bs = bs;
  std::vector<unsigned char> dyn(smem + 16);
  emu_dyn_smem = dyn.data();
  emu_kernel = name;
  blockDim = block, gridDim = grid, cur_block = block, cur_f = &f;
  unsigned nwarps = (nt + 31) / 32;
  while (fibers.size() < nt) fibers.push_back(emu_fiber{{}, (char *)malloc(EMU_STACK), nullptr, 0, false});
  nfibers = nt;
  /* EMU_REVERSE=1 runs the threads of a block last to first between barriers: a missing barrier
   * shows in one order or the other */
  static bool reverse = getenv("EMU_REVERSE") && atoi(getenv("EMU_REVERSE"));
  for (unsigned bz = 0; bz < grid.z; bz++)
    for (unsigned by = 0; by < grid.y; by++)
      for (unsigned bx = 0; bx < grid.x; bx++) {
        blockIdx = dim3(bx, by, bz);
        bs->block_bar.reset((int)nt);
        for (unsigned w = 0; w < nwarps; w++) bs->warp_bar[w].reset((int)std::min(32u, nt - w * 32));
        memset(bs->exited, 0, sizeof bs->exited);
        bs->or_flag = bs->and_flag = bs->cnt = 0;
        memset(bs->warp_flag, 0, sizeof bs->warp_flag);
        memset(bs->warp_bits, 0, sizeof bs->warp_bits);
        for (unsigned w = 0; w < nwarps; w++) {
          bs->mma_seq[w] = 0;
          for (int l = 0; l < 32; l++) bs->mma[w][l].kind = 0;
        }
        /* shared memory as a new block finds it: garbage, not what the previous block left */
        memset(dyn.data(), EMU_POISON, dyn.size());
        for (smem_region &r : smem_regions)
          if (r.launch == emu_launches) memset(r.p, EMU_POISON, r.n);
        for (unsigned t = 0; t < nt; t++) {
          emu_fiber &fb = fibers[t];
          ctx_start(&fb.ctx, fb.stack, fiber_main, t);
          fb.bar = nullptr, fb.done = false;
        }
        /* round robin over the runnable fibers until all are done; none runnable: a deadlock */
        unsigned done = 0;
        while (done < nt) {
          bool progress = false;
          done = 0;
          for (unsigned i = 0; i < nt; i++) {
            unsigned t = reverse ? nt - 1 - i : i;
            emu_fiber &fb = fibers[t];
            if (fb.done) {
              done++;
              continue;
            }
            if (fb.bar && fb.bar->gen == fb.gen) continue;
            fb.bar = nullptr, cur = t, progress = true;
            ctx_switch(&sched_ctx, &fb.ctx);
            if (fb.done) done++;
          }
          if (!progress && done < nt) {
            emu_report("kernel %s: deadlock in block (%u,%u,%u) of grid (%u,%u,%u), block (%u,%u,%u): a barrier or "
                       "warp operation that not every live thread reaches",
                       name, bx, by, bz, grid.x, grid.y, grid.z, block.x, block.y, block.z);
            emu_dyn_smem = nullptr, emu_kernel = nullptr;
            return;
          }
        }
      }
  emu_dyn_smem = nullptr, emu_kernel = nullptr;
}

int lt_cuda_error(const char *op, int device, cudaError_t err) {
  return lt_errorf("%s: CUDA error on cuda:%d: emulated error %d", op, device, err);
}
int lt_cuda_use_device(const char *op, int device) {
  return device == 0 ? 0 : lt_errorf("%s: emulated device cuda:%d does not exist", op, device);
}
cudaStream_t lt_cuda_compute_stream(int) { return nullptr; }
int lt_cuda_blocks(int, int64_t work) {
  static int sms = getenv("EMU_SMS") ? atoi(getenv("EMU_SMS")) : 1;
  int64_t needed = (work + LT_CUDA_THREADS - 1) / LT_CUDA_THREADS, cap = sms * 8;
  return (int)(needed < 1 ? 1 : needed < cap ? needed : cap);
}
extern "C" {
long emu_live_allocs;
int lt_cuda_alloc_stream(int, int64_t n, void *, void **p) {
  *p = malloc(n > 0 ? n : 1);
  memset(*p, 0xff, n > 0 ? n : 1);
  emu_live_allocs++;
  return 0;
}
int lt_cuda_alloc(int device, int64_t n, void **p) { return lt_cuda_alloc_stream(device, n, NULL, p); }
void lt_cuda_free(int, void *p) {
  if (p) emu_live_allocs--;
  free(p);
}
int lt_cuda_memcpy(void *dst, int, const void *src, int, int64_t nbytes) {
  if (nbytes > 0) memmove(dst, src, (size_t)nbytes);
  return 0;
}
int lt_cuda_copy_async_raw(void *dst, int, const void *src, int, int64_t nbytes, int) {
  if (nbytes > 0) memmove(dst, src, (size_t)nbytes);
  return 0;
}
int lt_cuda_device_synchronize(int) { return 0; }
int lt_cuda_stream_synchronize(int, int) { return 0; }
int lt_cuda_stream_wait_event(int, int, void *) { return 0; }
int lt_cuda_device_count(void) { return 1; }
/* the library's probe (host/core/runtime.c) sees no CUDA, as in the CPU build it links */
int lt_cuda_init_devices(int *count, char *status, int status_len) {
  *count = 0;
  snprintf(status, (size_t)status_len, "built without CUDA");
  return LT_CUDA_NOT_BUILT;
}
int lt_cuda_host_alloc(int64_t nbytes, void **ptr) {
  *ptr = malloc(nbytes > 0 ? nbytes : 1);
  return 0;
}
int lt_cuda_host_free(void *ptr) {
  free(ptr);
  return 0;
}
int lt_cuda_gemm(const char *op, const lt_cuda_gemm_args *) {
  return lt_errorf("%s: matmul is not emulated (cuBLASLt)", op);
}
int lt_cuda_linear_forward(lt_tensor *, const lt_tensor *, const lt_tensor *, const lt_tensor *, int) {
  return lt_errorf("linear: not emulated (cuBLASLt)");
}
int lt_cuda_linear_backward_params(lt_tensor *, lt_tensor *, const lt_tensor *, const lt_tensor *) {
  return lt_errorf("linear_backward: not emulated (cuBLASLt)");
}
}
__nv_bfloat162 __floats2bfloat162_rn(float lo, float hi) { return {lt_f32_to_bf16(lo), lt_f32_to_bf16(hi)}; }
__half2 __floats2half2_rn(float lo, float hi) { return {lt_f32_to_f16(lo), lt_f32_to_f16(hi)}; }
extern "C" long emu_error_count(void) { return emu_errors.load(); }
/* kernels/matmul.cu's strided copy (not emulated: a host loop) */
extern "C" int lt_cuda_strided_copy(int, void *dst, const int64_t *dst_stride, const void *src,
                                    const int64_t *src_stride, int ndim, const int64_t *shape, int dtype) {
  int64_t n = 1, size = lt_dtype_size(dtype);
  for (int d = 0; d < ndim; d++) n *= shape[d];
  for (int64_t i = 0; i < n; i++) {
    int64_t r = i, so = 0, doff = 0;
    for (int d = ndim - 1; d >= 0; d--)
      so += r % shape[d] * src_stride[d], doff += r % shape[d] * dst_stride[d], r /= shape[d];
    memcpy((char *)dst + doff * size, (const char *)src + so * size, (size_t)size);
  }
  return 0;
}
