/* emu.h — a tiny CUDA emulator for checking kernels on a machine without a GPU (run.sh).
 *
 * Each launch runs its blocks one after another; the threads of a block (1-, 2- or 3-D) are
 * fibers (ucontext) switched at barriers, so __syncthreads, __syncthreads_or/count and the warp
 * shuffles/votes (per-warp barriers) behave as on a GPU: a thread that returned no longer counts
 * at a barrier (as on sm_70+), and a shuffle or barrier reached by only part of the live threads
 * of a warp or block is a deadlock, reported (emu_errors) as the bug it would be on a GPU. Threads
 * run until they wait, so a data race between threads of a block shows only at barriers. A shuffle
 * that reads a lane which has exited is reported (emu_errors). __shared__ variables become
 * function statics (one block at a time uses them); `extern __shared__` arrays point at the
 * launch's dynamic shared memory (emu_rewrite.pl rewrites them). Both are poisoned (0xff bytes:
 * NaN in every float format) before each block, so a block that reads what it did not write shows.
 * Dynamic shared memory over 48 KB needs the kernel's cudaFuncSetAttribute opt-in (at most
 * 227 KB, sm_90), and a vector access must be aligned to its type's CUDA alignment (checked
 * vector accesses, below): either is reported.
 * mma.sync.m16n8k16 (bf16/f16, f32 accumulation) is a warp-collective op (emu_mma_m16n8k16,
 * into which emu_rewrite.pl turns the inline PTX). Device memory is host memory; atomics are real
 * atomics. What it does not model: memory ordering between blocks, timing, float rounding of
 * device intrinsics (expf is glibc's) and of the tensor cores' adder tree, other inline PTX. */
#pragma once
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <functional>
#include <math.h>
#include <mutex>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <thread>
#include <type_traits>
#include <vector>
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __shared__ static
#define __constant__ static
#define __restrict__ __restrict
#define __grid_constant__
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
struct dim3 {
  unsigned x, y, z;
  dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
struct alignas(16) float4 {
  float x, y, z, w;
};
struct alignas(8) float2 {
  float x, y;
};
struct alignas(8) uint2 {
  unsigned x, y;
};
struct alignas(8) int2 {
  int x, y;
};
struct alignas(16) int4 {
  int x, y, z, w;
};
struct alignas(16) double2 {
  double x, y;
};
static inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
typedef void *cudaStream_t;
typedef void *cudaEvent_t;
typedef int cudaError_t;
enum { cudaSuccess = 0, cudaErrorInvalidValue = 1 };
enum cudaMemcpyKind {
  cudaMemcpyHostToHost,
  cudaMemcpyHostToDevice,
  cudaMemcpyDeviceToHost,
  cudaMemcpyDeviceToDevice,
  cudaMemcpyDefault
};
enum { cudaEventDisableTiming = 2, cudaEventDefault = 0 };
extern thread_local dim3 threadIdx, blockIdx;
extern thread_local unsigned emu_tid; /* linear thread index in the block */
extern dim3 blockDim, gridDim;
extern unsigned char *emu_dyn_smem;
extern std::atomic<long> emu_errors;
extern const char *emu_kernel; /* the running kernel's name as launched (NULL outside a launch) */
/* reports a bug a GPU would have (counted in emu_errors); quiet while emu_expect counts them */
void emu_report(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* A barrier that exited threads leave: `expected` drops when a thread returns from the kernel.
 * Threads are fibers (emu.cpp): a thread that must wait switches to the next runnable one. */
struct emu_bar;
void emu_wait(emu_bar *bar, unsigned gen); /* switches away until bar->gen != gen */
struct emu_bar {
  int expected = 0, count = 0;
  unsigned gen = 0;
  void reset(int n) { expected = n, count = 0; }
  void arrive() {
    if (++count >= expected) {
      count = 0, gen++;
      return;
    }
    emu_wait(this, gen);
  }
  void leave() {
    expected--;
    if (count > 0 && count >= expected) count = 0, gen++;
  }
};
/* one lane's operands of a warp's mma.sync (emu_mma_m16n8k16) */
struct emu_mma_lane {
  uint32_t a[4], b[2];
  float c[4], d[4];
  int kind; /* 0: not at an mma; EMU_MMA_BF16 or EMU_MMA_F16 */
};
enum { EMU_MMA_BF16 = 1, EMU_MMA_F16 = 2 };
struct emu_block_state {
  emu_mma_lane mma[32][32];
  unsigned mma_seq[32]; /* mma.sync ops the warp completed */
  emu_bar block_bar;
  emu_bar warp_bar[32];
  uint64_t slot[32][32];
  int exited[32][32];
  int or_flag, and_flag, cnt, warp_flag[32];
  unsigned warp_bits[32];
};
extern emu_block_state *emu_bs;
static inline void __syncthreads() { emu_bs->block_bar.arrive(); }
static inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
static inline void __threadfence_block() { std::atomic_thread_fence(std::memory_order_seq_cst); }
static inline int __syncthreads_count(int v) {
  __syncthreads();
  if (v) __atomic_fetch_add(&emu_bs->cnt, 1, __ATOMIC_SEQ_CST);
  __syncthreads();
  int r = __atomic_load_n(&emu_bs->cnt, __ATOMIC_SEQ_CST);
  __syncthreads();
  if (emu_tid == 0) emu_bs->cnt = 0;
  __syncthreads();
  return r;
}
static inline int __syncthreads_or(int v) { return __syncthreads_count(v != 0) != 0; }
static inline int __syncthreads_and(int v) { return __syncthreads_count(v == 0) == 0; }
static inline void emu_warp_bar() { emu_bs->warp_bar[emu_tid / 32].arrive(); }
static inline void __syncwarp(unsigned = 0xffffffffu) { emu_warp_bar(); }
/* Every live lane of the warp publishes v, then reads lane src's value (its own when src < 0). */
template <typename T> static inline T emu_exchange(T v, int src) {
  static_assert(sizeof(T) <= 8, "shuffle of a type over 8 bytes");
  int w = emu_tid / 32, lane = emu_tid % 32;
  memcpy(&emu_bs->slot[w][lane], &v, sizeof(T));
  emu_warp_bar();
  T r = v;
  if (src >= 0) {
    if (src >= 32 || emu_bs->exited[w][src] || w * 32 + src >= (int)(blockDim.x * blockDim.y * blockDim.z)) {
      emu_report("shuffle reads lane %d of warp %d, which has exited or does not exist", src, w);
    } else {
      memcpy(&r, &emu_bs->slot[w][src], sizeof(T));
    }
  }
  emu_warp_bar();
  return r;
}
template <typename T> static inline T __shfl_xor_sync(unsigned, T v, int offset, int width = 32) {
  int lane = emu_tid % 32, src = lane ^ offset;
  if ((src & ~(width - 1)) != (lane & ~(width - 1))) src = lane;
  return emu_exchange(v, src);
}
template <typename T> static inline T __shfl_sync(unsigned, T v, int src_lane, int width = 32) {
  int lane = emu_tid % 32;
  return emu_exchange(v, (lane & ~(width - 1)) + (src_lane & (width - 1)));
}
template <typename T> static inline T __shfl_down_sync(unsigned, T v, unsigned delta, int width = 32) {
  int lane = emu_tid % 32;
  return emu_exchange(v, (lane & (width - 1)) + (int)delta < width ? lane + (int)delta : lane);
}
template <typename T> static inline T __shfl_up_sync(unsigned, T v, unsigned delta, int width = 32) {
  int lane = emu_tid % 32;
  return emu_exchange(v, (lane & (width - 1)) >= (int)delta ? lane - (int)delta : lane);
}
static inline unsigned __ballot_sync(unsigned, int v) {
  int w = emu_tid / 32;
  emu_warp_bar();
  if (v) __atomic_fetch_or(&emu_bs->warp_bits[w], 1u << (emu_tid % 32), __ATOMIC_SEQ_CST);
  emu_warp_bar();
  unsigned r = __atomic_load_n(&emu_bs->warp_bits[w], __ATOMIC_SEQ_CST);
  emu_warp_bar();
  if (emu_tid % 32 == 0) emu_bs->warp_bits[w] = 0;
  emu_warp_bar();
  return r;
}
static inline int __any_sync(unsigned m, int v) { return __ballot_sync(m, v) != 0; }
static inline int __all_sync(unsigned m, int v) {
  int w = emu_tid / 32, n = (int)(blockDim.x * blockDim.y * blockDim.z) - w * 32;
  unsigned live = 0;
  for (int l = 0; l < 32 && l < n; l++)
    if (!emu_bs->exited[w][l]) live |= 1u << l;
  return (__ballot_sync(m, v) & live) == live;
}
static inline unsigned __activemask() { return 0xffffffffu; }
template <typename T> static inline T __ldg(const T *p) { return *p; }
template <typename T> static inline T __ldcs(const T *p) { return *p; }
template <typename T> static inline void __stcs(T *p, T v) { *p = v; }

/* ---- mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32 D, A, B, C ----
 * emu_rewrite.pl turns the inline PTX into a call with the operands in order (D by reference). A
 * warp-collective op, as on a GPU: every lane deposits its fragments, in the PTX ISA layouts
 * ("Matrix Fragments for mma.m16n8k16 with floating point type"; lane = 4 gid + tig, the
 * lower-indexed element of a pair in the low 16 bits):
 *   A (16 x 16, row): a0 = A[gid][2 tig, +1], a1 = A[gid + 8][2 tig, +1],
 *                     a2 = A[gid][2 tig + 8, +9], a3 = A[gid + 8][2 tig + 8, +9]
 *   B (16 x 8, col):  b0 = B[2 tig, +1][gid], b1 = B[2 tig + 8, +9][gid]
 *   C, D (16 x 8):    c0, c1 = C[gid][2 tig, +1], c2, c3 = C[gid + 8][2 tig, +1]
 * and waits at the warp's barrier; the last lane to arrive computes the warp's D (emu_mma_warp,
 * emu.cpp) and each lane takes its fragment of D. A lane missing (exited, or a warp of fewer than
 * 32 threads) or at another warp op, or a mix of types, is reported. */
void emu_mma_warp(int w);
extern long emu_mma_ops; /* mma.sync ops run (per warp) */
template <int kind>
static inline void emu_mma_m16n8k16(float &d0, float &d1, float &d2, float &d3, uint32_t a0, uint32_t a1, uint32_t a2,
                                    uint32_t a3, uint32_t b0, uint32_t b1, float c0, float c1, float c2, float c3) {
  int w = emu_tid / 32;
  emu_mma_lane &m = emu_bs->mma[w][emu_tid % 32];
  m.a[0] = a0, m.a[1] = a1, m.a[2] = a2, m.a[3] = a3, m.b[0] = b0, m.b[1] = b1;
  m.c[0] = c0, m.c[1] = c1, m.c[2] = c2, m.c[3] = c3, m.kind = kind;
  unsigned seq = emu_bs->mma_seq[w];
  emu_bar &bar = emu_bs->warp_bar[w];
  if (bar.count + 1 >= bar.expected) emu_mma_warp(w); /* the last lane to arrive */
  bar.arrive();
  if (emu_bs->mma_seq[w] == seq) { /* the barrier completed without an mma: nobody computed */
    emu_report("kernel %s: mma.sync of warp %d: a lane exited or reached another warp op meanwhile", emu_kernel, w);
    m.kind = 0;
  }
  d0 = m.d[0], d1 = m.d[1], d2 = m.d[2], d3 = m.d[3];
}

/* inline PTX that emu_rewrite.pl does not know: the kernel cannot go on */
static inline void emu_asm_unsupported(const char *what) {
  fprintf(stderr, "emu: kernel %s: inline PTX is not emulated: %s\n", emu_kernel, what);
  abort();
}

/* ---- checked vector accesses (emu_rewrite.pl) ----
 * The kernels access memory as wider types through casts (uint4, lt_dev_vec, uint32_t pairs of
 * 16-bit elements), and a GPU faults on an access not aligned to the type: report one inside a
 * kernel. A cast accessed at once is checked there (emu_vcast); a struct declared alignas(n)
 * (lt_dev_vec) checks its copies (EMU_VEC_CHECKS). The vector types above have CUDA's alignments. */
void emu_misaligned(const void *p, size_t align);
static inline void emu_check_align(const void *p, size_t align) {
  if (emu_kernel && align > 1 && (uintptr_t)p % align) emu_misaligned(p, align);
}
template <typename P, typename Q> static inline P emu_vcast(Q q) {
  typedef typename std::remove_cv<typename std::remove_pointer<P>::type>::type T;
  if constexpr (std::is_object<T>::value && std::is_pointer<Q>::value) emu_check_align((const void *)q, alignof(T));
  return reinterpret_cast<P>(q);
}
#define EMU_VEC_CHECKS(V)                                                                                              \
  V() = default;                                                                                                       \
  V(const V &o) {                                                                                                      \
    emu_check_align(&o, alignof(V));                                                                                   \
    memcpy((void *)this, (const void *)&o, sizeof(V));                                                                 \
  }                                                                                                                    \
  V &operator=(const V &o) {                                                                                           \
    emu_check_align(this, alignof(V)), emu_check_align(&o, alignof(V));                                                \
    memcpy((void *)this, (const void *)&o, sizeof(V));                                                                 \
    return *this;                                                                                                      \
  }

/* ---- static __shared__ arrays: emu_rewrite.pl appends emu_smem_static(&name, sizeof name) to each
 * declaration, so that the launch poisons them before every block (the first thread to reach the
 * declaration in a launch poisons it before any thread of the block can use it) ---- */
void emu_smem_static(void *p, size_t n);

/* ---- atomics: real ones (blocks run one at a time, threads of a block concurrently) ---- */
template <typename T> static inline T emu_atomic_cas_loop(T *p, T v, int op) {
  T old;
  memcpy(&old, p, sizeof(T));
  for (;;) {
    T want = op == 0 ? (T)(old + v) : op == 1 ? std::max(old, v) : op == 2 ? std::min(old, v) : v;
    if (__atomic_compare_exchange(p, &old, &want, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) return old;
  }
}
template <typename T> static inline T atomicAdd(T *p, T v) { return emu_atomic_cas_loop(p, v, 0); }
template <typename T> static inline T atomicMax(T *p, T v) { return emu_atomic_cas_loop(p, v, 1); }
template <typename T> static inline T atomicMin(T *p, T v) { return emu_atomic_cas_loop(p, v, 2); }
template <typename T> static inline T atomicExch(T *p, T v) { return emu_atomic_cas_loop(p, v, 3); }
template <typename T> static inline T atomicSub(T *p, T v) { return emu_atomic_cas_loop(p, (T)(0 - v), 0); }
template <typename T> static inline T atomicOr(T *p, T v) { return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST); }
template <typename T> static inline T atomicAnd(T *p, T v) { return __atomic_fetch_and(p, v, __ATOMIC_SEQ_CST); }
template <typename T> static inline T atomicCAS(T *p, T cmp, T v) {
  __atomic_compare_exchange(p, &cmp, &v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  return cmp;
}

/* ---- math intrinsics, as the host's libm computes them ---- */
#define __expf expf
#define __logf logf
#define __log2f log2f
#define __sinf sinf
#define __cosf cosf
#define __tanf tanf
#define __powf powf
static inline float __fdividef(float a, float b) { return a / b; }
static inline float __frcp_rn(float a) { return 1.0f / a; }
static inline float __fsqrt_rn(float a) { return sqrtf(a); }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline double __dsub_rn(double a, double b) { return a - b; }
static inline double __ddiv_rn(double a, double b) { return a / b; }
static inline double __dsqrt_rn(double a) { return sqrt(a); }
static inline double __drcp_rn(double a) { return 1.0 / a; }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline double __fma_rn(double a, double b, double c) { return fma(a, b, c); }
static inline float __saturatef(float x) { return x < 0 ? 0 : x > 1 ? 1 : x; }
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }
static inline float rcbrtf(float x) { return 1.0f / cbrtf(x); }
static inline int __float2int_rn(float x) { return (int)nearbyintf(x); }
static inline int __float2int_rz(float x) { return (int)x; }
static inline unsigned __float2uint_rn(float x) { return (unsigned)nearbyintf(x); }
static inline float __int2float_rn(int x) { return (float)x; }
static inline float __uint2float_rn(unsigned x) { return (float)x; }
static inline double __uint2double_rn(unsigned x) { return (double)x; }
static inline float __int_as_float(int x) {
  float f;
  memcpy(&f, &x, 4);
  return f;
}
static inline int __float_as_int(float x) {
  int i;
  memcpy(&i, &x, 4);
  return i;
}
static inline float __uint_as_float(unsigned x) {
  float f;
  memcpy(&f, &x, 4);
  return f;
}
static inline unsigned __float_as_uint(float x) {
  unsigned i;
  memcpy(&i, &x, 4);
  return i;
}
static inline double __longlong_as_double(long long x) {
  double f;
  memcpy(&f, &x, 8);
  return f;
}
static inline long long __double_as_longlong(double x) {
  long long i;
  memcpy(&i, &x, 8);
  return i;
}
static inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((uint64_t)a * b) >> 32); }
static inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
  return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
static inline int __clzll(long long x) { return x ? __builtin_clzll((unsigned long long)x) : 64; }
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline int __ffsll(long long x) { return __builtin_ffsll(x); }
static inline unsigned __brev(unsigned x) {
  unsigned r = 0;
  for (int i = 0; i < 32; i++) r |= ((x >> i) & 1u) << (31 - i);
  return r;
}
/* CUDA's min/max overloads for mixed integer types */
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
static inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
static inline long long min(long long a, long long b) { return a < b ? a : b; }
static inline long long max(long long a, long long b) { return a > b ? a : b; }
static inline long min(long a, long b) { return a < b ? a : b; }
static inline long max(long a, long b) { return a > b ? a : b; }
static inline unsigned long min(unsigned long a, unsigned long b) { return a < b ? a : b; }
static inline unsigned long max(unsigned long a, unsigned long b) { return a > b ? a : b; }
static inline float min(float a, float b) { return fminf(a, b); }
static inline float max(float a, float b) { return fmaxf(a, b); }
static inline double min(double a, double b) { return fmin(a, b); }
static inline double max(double a, double b) { return fmax(a, b); }
using std::fmax;
using std::fmin;

/* ---- launches and the runtime API the kernels call ---- */
/* kernel: the launched function (the key of its cudaFuncSetAttribute opt-in); name: as written */
void emu_launch_fn(dim3 grid, dim3 block, size_t smem, const char *name, const void *kernel, std::function<void()> f);
template <typename F>
static inline void emu_launch(dim3 grid, dim3 block, size_t smem, const char *name, F *kernel,
                              std::function<void()> f) {
  emu_launch_fn(grid, block, smem, name, (const void *)kernel, std::move(f));
}
#define EMU_CFG(g, b, ...) dim3(g), dim3(b), emu_smem_arg(__VA_ARGS__)
static inline size_t emu_smem_arg() { return 0; }
template <typename A> static inline size_t emu_smem_arg(A s) { return (size_t)s; }
template <typename A, typename B> static inline size_t emu_smem_arg(A s, B) { return (size_t)s; }
extern int emu_launch_error; /* set by a bad launch configuration, returned by cudaGetLastError */
static inline cudaError_t cudaGetLastError() {
  int e = emu_launch_error;
  emu_launch_error = 0;
  return e;
}
static inline cudaError_t cudaPeekAtLastError() { return emu_launch_error; }
static inline const char *cudaGetErrorString(cudaError_t) { return "emulated launch error"; }
static inline const char *cudaGetErrorName(cudaError_t) { return "cudaErrorEmu"; }
static inline cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, int, cudaStream_t = 0) {
  if (n) memmove(d, s, n);
  return cudaSuccess;
}
static inline cudaError_t cudaMemcpy(void *d, const void *s, size_t n, int) { return cudaMemcpyAsync(d, s, n, 0); }
static inline cudaError_t cudaMemcpy2DAsync(void *d, size_t dp, const void *s, size_t sp, size_t w, size_t h, int,
                                            cudaStream_t = 0) {
  for (size_t r = 0; r < h; r++) memmove((char *)d + r * dp, (const char *)s + r * sp, w);
  return cudaSuccess;
}
static inline cudaError_t cudaMemsetAsync(void *d, int v, size_t n, cudaStream_t = 0) {
  if (n) memset(d, v, n);
  return cudaSuccess;
}
static inline cudaError_t cudaMemset(void *d, int v, size_t n) { return cudaMemsetAsync(d, v, n); }
static inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
static inline cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }
static inline cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned = 0) { return cudaSuccess; }
static inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned) {
  *e = malloc(1);
  return cudaSuccess;
}
static inline cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, 0); }
static inline cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t = 0) { return cudaSuccess; }
static inline cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
static inline cudaError_t cudaEventQuery(cudaEvent_t) { return cudaSuccess; }
static inline cudaError_t cudaEventDestroy(cudaEvent_t e) {
  free(e);
  return cudaSuccess;
}
static inline cudaError_t cudaGetDevice(int *d) {
  *d = 0;
  return cudaSuccess;
}
static inline cudaError_t cudaSetDevice(int) { return cudaSuccess; }
enum { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
/* records MaxDynamicSharedMemorySize (the launch checks it); other attributes are accepted */
cudaError_t emu_func_set_attribute(const void *kernel, int attr, int value);
template <typename F> static inline cudaError_t cudaFuncSetAttribute(F *kernel, int attr, int value) {
  return emu_func_set_attribute((const void *)kernel, attr, value);
}
static inline cudaError_t cudaMallocHost(void **p, size_t n) {
  *p = malloc(n ? n : 1);
  return *p ? cudaSuccess : 2;
}
static inline cudaError_t cudaFreeHost(void *p) {
  free(p);
  return cudaSuccess;
}

/* ---- cuda_bf16.h / cuda_fp16.h: the pair types the mma helpers use ---- */
struct alignas(4) __nv_bfloat162 {
  uint16_t x, y;
};
struct alignas(4) __half2 {
  uint16_t x, y;
};
__nv_bfloat162 __floats2bfloat162_rn(float lo, float hi);
__half2 __floats2half2_rn(float lo, float hi);
