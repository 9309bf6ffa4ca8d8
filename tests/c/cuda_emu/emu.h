/* emu.h — a tiny CUDA emulator for checking kernels on a machine without a GPU (run.sh).
 *
 * Each launch runs its blocks one after another; the blockDim.x threads of a block are OS
 * threads, so __syncthreads (a barrier), __syncthreads_or and the warp shuffles/votes (per-warp
 * barriers) behave as on a GPU, and a shuffle or barrier reached by only part of a warp or
 * block hangs (run.sh runs under `timeout`), which is the bug it would be on a GPU.
 * __shared__ variables become function statics: one block at a time uses them. Device memory
 * is host memory. What it does not model: memory ordering between blocks, timing, float
 * rounding of device intrinsics (expf is glibc's), 1-D blocks only (blockDim.y == 1). */
#pragma once
#include <atomic>
#include <functional>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <thread>
#include <vector>
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __grid_constant__
#define __launch_bounds__(...)
struct dim3 {
  unsigned x, y, z;
  dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
typedef void *cudaStream_t;
typedef int cudaError_t;
enum { cudaSuccess = 0 };
extern thread_local dim3 threadIdx, blockIdx;
extern dim3 blockDim, gridDim;
struct emu_block_state {
  pthread_barrier_t block_bar;
  pthread_barrier_t warp_bar[32];
  uint64_t slot[32][32];
  int or_flag, warp_flag[32];
};
extern emu_block_state *emu_bs;
static inline void __syncthreads() { pthread_barrier_wait(&emu_bs->block_bar); }
static inline int __syncthreads_or(int v) {
  __syncthreads();
  if (v) __atomic_store_n(&emu_bs->or_flag, 1, __ATOMIC_SEQ_CST);
  __syncthreads();
  int r = __atomic_load_n(&emu_bs->or_flag, __ATOMIC_SEQ_CST);
  __syncthreads();
  if (threadIdx.x == 0) emu_bs->or_flag = 0;
  return r;
}
static inline void emu_warp_bar() { pthread_barrier_wait(&emu_bs->warp_bar[threadIdx.x / 32]); }
template <typename T> static inline T __shfl_xor_sync(unsigned, T v, int offset) {
  int w = threadIdx.x / 32, lane = threadIdx.x % 32;
  memcpy(&emu_bs->slot[w][lane], &v, sizeof(T));
  emu_warp_bar();
  T r;
  memcpy(&r, &emu_bs->slot[w][lane ^ offset], sizeof(T));
  emu_warp_bar();
  return r;
}
static inline int __any_sync(unsigned, int v) {
  int w = threadIdx.x / 32;
  emu_warp_bar();
  if (v) __atomic_store_n(&emu_bs->warp_flag[w], 1, __ATOMIC_SEQ_CST);
  emu_warp_bar();
  int r = __atomic_load_n(&emu_bs->warp_flag[w], __ATOMIC_SEQ_CST);
  emu_warp_bar();
  if (threadIdx.x % 32 == 0) emu_bs->warp_flag[w] = 0;
  emu_warp_bar();
  return r;
}
void emu_launch(dim3 grid, dim3 block, std::function<void()> f);
#define EMU_CFG(g, b, ...) dim3(g), dim3(b)
static inline cudaError_t cudaGetLastError() { return cudaSuccess; }
using std::fmax;
