/* emu_probe.cu — kernels of the errors suite (emu_errors.c), rewritten and compiled like kernels/
 * (run.sh): the tensor-core helper the attention kernels use (mma_ops<T>::mma) against a plain
 * product, and kernels that break a rule on purpose, each of which the emulator must report. */
#include "kernels/attention_tile.cuh"

/* One warp: D (16 x 8) = A (16 x 16, row-major) B (16 x 8, stored transposed as Bt[n][k]) + C,
 * each lane's fragments gathered as the PTX ISA lays them out (emu.h), independently of the
 * attention kernels' own indexing. */
template <typename T> __global__ void probe_mma(const uint16_t *A, const uint16_t *Bt, const float *C, float *D) {
  const int lane = threadIdx.x % 32, gid = lane / 4, tig = lane % 4;
  uint32_t a[4];
  for (int r = 0; r < 4; r++) a[r] = ld32(A + (gid + 8 * (r & 1)) * 16 + 2 * tig + 8 * (r >> 1));
  uint32_t b0 = ld32(Bt + gid * 16 + 2 * tig), b1 = ld32(Bt + gid * 16 + 2 * tig + 8);
  float c[4];
  for (int e = 0; e < 4; e++) c[e] = C[(gid + 8 * (e >> 1)) * 8 + 2 * tig + (e & 1)];
  mma_ops<T>::mma(c, a, b0, b1);
  for (int e = 0; e < 4; e++) D[(gid + 8 * (e >> 1)) * 8 + 2 * tig + (e & 1)] = c[e];
}

/* Elements of A, B and C that differ from the f64 product by more than f32 rounding (bf16 when
 * f16 is 0, else f16), over a few random matrices. */
extern "C" int emu_probe_mma(int f16) {
  uint16_t A[256], Bt[128];
  float C[128], D[128], a[256], bt[128];
  unsigned s = 12345u + (unsigned)f16;
  /* uniform in [-1, 1) */
  auto uni = [&s]() {
    s = s * 1664525u + 1013904223u;
    return (float)((s >> 8) & 0xffff) / 32768.f - 1.f;
  };
  /* x in the 16-bit type: its bits, and its value */
  auto round16 = [f16](float x, uint16_t *bits) {
    *bits = f16 ? lt_f32_to_f16(x) : lt_f32_to_bf16(x);
    return f16 ? lt_f16_to_f32(*bits) : lt_bf16_to_f32(*bits);
  };
  int bad = 0;
  for (int rep = 0; rep < 4; rep++) {
    for (int i = 0; i < 256; i++) a[i] = round16(uni(), &A[i]);
    for (int i = 0; i < 128; i++) bt[i] = round16(uni(), &Bt[i]);
    for (int i = 0; i < 128; i++) C[i] = 4 * uni();
    if (f16)
      probe_mma<lt_f16_bits><<<1, 32>>>(A, Bt, C, D);
    else
      probe_mma<lt_bf16_bits><<<1, 32>>>(A, Bt, C, D);
    for (int m = 0; m < 16; m++)
      for (int n = 0; n < 8; n++) {
        double want = C[m * 8 + n];
        for (int k = 0; k < 16; k++) want += (double)a[m * 16 + k] * bt[n * 16 + k];
        if (!(fabs(D[m * 8 + n] - want) <= 1e-6 * (fabs(want) + 1))) bad++;
      }
  }
  return bad;
}

/* an mma.sync that lane 5 does not reach */
__global__ void probe_mma_exit(float *D) {
  float c[4] = {0, 0, 0, 0};
  uint32_t a[4] = {0, 0, 0, 0};
  if (threadIdx.x == 5) return;
  mma_ops<lt_bf16_bits>::mma(c, a, 0u, 0u);
  D[threadIdx.x] = c[0];
}
extern "C" void emu_probe_mma_exit(void) {
  static float D[32];
  probe_mma_exit<<<1, 32>>>(D);
}

/* 64 KB of dynamic shared memory: refused without the opt-in, fine with it */
__global__ void probe_smem(float *out) {
  extern __shared__ float big[];
  big[threadIdx.x] = 1.f;
  __syncthreads();
  out[threadIdx.x] = big[31 - threadIdx.x];
}
__global__ void probe_smem_optin(float *out) {
  extern __shared__ float big2[];
  big2[threadIdx.x] = 1.f;
  __syncthreads();
  out[threadIdx.x] = big2[31 - threadIdx.x];
}
extern "C" void emu_probe_smem_over(void) {
  static float out[32];
  probe_smem<<<1, 32, 64 * 1024>>>(out);
}
extern "C" void emu_probe_smem_optin(void) {
  static float out[32];
  if (cudaFuncSetAttribute(probe_smem_optin, cudaFuncAttributeMaxDynamicSharedMemorySize, 228 * 1024) == cudaSuccess)
    emu_report("cudaFuncSetAttribute accepted 228 KB, over sm_90's 227 KB");
  if (cudaFuncSetAttribute(probe_smem_optin, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024) != cudaSuccess)
    emu_report("cudaFuncSetAttribute refused 64 KB");
  probe_smem_optin<<<1, 32, 64 * 1024>>>(out);
}

/* 32 KB of static and 32 KB of dynamic shared memory: over 48 KB together, without the opt-in */
__global__ void probe_static(float *out) {
  __shared__ float st[8192];
  extern __shared__ float dyn3[];
  st[threadIdx.x] = dyn3[threadIdx.x] = 1.f;
  __syncthreads();
  out[threadIdx.x] = st[31 - threadIdx.x] + dyn3[31 - threadIdx.x];
}
extern "C" void emu_probe_static_over(void) {
  static float out[32];
  probe_static<<<1, 32, 32 * 1024>>>(out);
}

/* Vector accesses through pointers off their alignment by one element where bit 0 (float4), 1
 * (a u32 pair of 16-bit elements) or 2 (lt_dev_vec through a pointer kept for later) of `off` is
 * set. A misaligned pointer formed but never accessed is fine. */
__global__ void probe_vec(const float *in, const uint16_t *h, float *out, int off) {
  float4 x = *reinterpret_cast<const float4 *>(in + 4 * threadIdx.x + (off & 1));
  uint32_t y = ld32(h + 2 * threadIdx.x + (off >> 1 & 1));
  const lt_dev_vec<float, 4> *pv = reinterpret_cast<const lt_dev_vec<float, 4> *>(in + (off >> 2 & 1));
  const lt_dev_vec<float, 4> *unused = reinterpret_cast<const lt_dev_vec<float, 4> *>(in + 1);
  lt_dev_vec<float, 4> v = pv[threadIdx.x];
  out[threadIdx.x] = x.x + (float)y + v.v[0] + (float)(unused != nullptr);
}
static void probe_vec_run(int off) {
  alignas(16) static float in[4 * 32 + 4], out[32];
  alignas(16) static uint16_t h[2 * 32 + 2];
  probe_vec<<<1, 32>>>(in, h, out, off);
}
extern "C" void emu_probe_misaligned_float4(void) { probe_vec_run(1); }
extern "C" void emu_probe_misaligned_u32(void) { probe_vec_run(2); }
extern "C" void emu_probe_misaligned_vec(void) { probe_vec_run(4); }
extern "C" void emu_probe_aligned(void) { probe_vec_run(0); }

/* Block 1 reads the static and the dynamic shared memory that block 0 wrote: it must see the
 * poison (NaN), not block 0's values. Returns the reads that did not. */
__global__ void probe_poison(float *out) {
  __shared__ float st[32];
  extern __shared__ float dyn[];
  if (blockIdx.x == 0) st[threadIdx.x] = 1.f, dyn[threadIdx.x] = 2.f;
  __syncthreads();
  out[blockIdx.x * 64 + threadIdx.x] = st[threadIdx.x];
  out[blockIdx.x * 64 + 32 + threadIdx.x] = dyn[threadIdx.x];
}
extern "C" int emu_probe_poison(void) {
  static float out[2 * 64];
  probe_poison<<<2, 32, 32 * sizeof(float)>>>(out);
  int bad = 0;
  for (int i = 0; i < 64; i++) bad += out[i] != (i < 32 ? 1.f : 2.f) || !isnan(out[64 + i]);
  return bad;
}
