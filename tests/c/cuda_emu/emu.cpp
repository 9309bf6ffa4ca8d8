/* emu.cpp — the emulator's launch and the CUDA runtime entry points kernels/ call (emu.h).
 * EMU_SMS (default 1) is the number of SMs lt_cuda_blocks sizes grids for: small values make
 * the kernels' split (two-pass) paths run on small inputs. */
#include "common.cuh"
thread_local dim3 threadIdx, blockIdx;
dim3 blockDim, gridDim;
emu_block_state *emu_bs;
long emu_launches, emu_threads;
void emu_launch(dim3 grid, dim3 block, std::function<void()> f) {
  if (block.x % 32 || block.x > 1024 || block.y != 1 || grid.x == 0 || grid.y == 0 || grid.y > 65535) {
    fprintf(stderr, "emu: bad launch grid (%u,%u) block (%u,%u)\n", grid.x, grid.y, block.x, block.y);
    abort();
  }
  emu_launches++;
  emu_threads += (long)grid.x * grid.y * block.x;
  static emu_block_state bs;
  emu_bs = &bs;
  memset(&bs, 0, sizeof bs);
  pthread_barrier_init(&bs.block_bar, NULL, block.x);
  for (unsigned w = 0; w < block.x / 32; w++) pthread_barrier_init(&bs.warp_bar[w], NULL, 32);
  blockDim = block, gridDim = grid;
  std::vector<std::thread> th;
  for (unsigned t = 0; t < block.x; t++)
    th.emplace_back([&, t] {
      threadIdx = dim3(t, 0, 0);
      for (unsigned by = 0; by < grid.y; by++)
        for (unsigned bx = 0; bx < grid.x; bx++) {
          blockIdx = dim3(bx, by, 0);
          f();
          pthread_barrier_wait(&bs.block_bar);
        }
    });
  for (auto &x : th) x.join();
  pthread_barrier_destroy(&bs.block_bar);
  for (unsigned w = 0; w < block.x / 32; w++) pthread_barrier_destroy(&bs.warp_bar[w]);
}
int lt_cuda_error(const char *op, int device, cudaError_t err) {
  return lt_errorf("%s: emu error %d on %d", op, err, device);
}
int lt_cuda_use_device(const char *, int) { return 0; }
cudaStream_t lt_cuda_compute_stream(int) { return nullptr; }
int lt_cuda_blocks(int, int64_t work) {
  static int sms = getenv("EMU_SMS") ? atoi(getenv("EMU_SMS")) : 1;
  int64_t needed = (work + LT_CUDA_THREADS - 1) / LT_CUDA_THREADS, cap = sms * 8;
  return (int)(needed < 1 ? 1 : needed < cap ? needed : cap);
}
extern "C" int lt_cuda_alloc(int, int64_t n, void **p) {
  *p = malloc(n > 0 ? n : 1);
  memset(*p, 0xff, n > 0 ? n : 1);
  return 0;
}
extern "C" void lt_cuda_free(int, void *p) { free(p); }
extern "C" int emu_device_count(void) { return 1; }
