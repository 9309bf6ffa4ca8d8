/* attention.h — what host/ops/attention_cuda.c hands to the attention kernels
 * (kernels/attention_forward.cu, kernels/attention_backward.cu). C linkage. */
#ifndef LUTRA_CUDA_ATTENTION_H
#define LUTRA_CUDA_ATTENTION_H
#include "lutra.h"
#include <stdint.h>

/* A (B, T or S, heads, D) operand: element [b, t, h, 0] is at data + b*sb + t*st + h*sh (elements),
 * and D is dense. */
typedef struct lt_cuda_att_operand {
  void *data;
  int64_t sb, st, sh;
} lt_cuda_att_operand;

typedef struct lt_cuda_att_args {
  int device, dtype, causal;
  int64_t B, T, S, H, Hkv, D, group, off; /* group = H / Hkv, off = S - T */
  int64_t window;                         /* 0: none; else query t sees keys s > t + off - window */
  double scale;
  lt_cuda_att_operand q, k, v, out, dout, dq, dk, dv; /* forward: q k v out; backward: all */
  float *lse;                                         /* (B, H, T) f32: forward output (may be NULL), backward input */
  int64_t lse_sb, lse_sh, lse_st;
  const void *seg; /* (B, T) segment ids (i32 or i64) or NULL */
  int seg_dtype;
  int64_t seg_sb, seg_st;
  /* backward scratch from the caller: delta (B, H, T) in the compute type (f32, or f64 for f64),
   * and for f64 the exact lse (B, H, T) in log2 units that the dQ pass recomputes in double */
  void *delta;
  double *lse2;
} lt_cuda_att_args;

/* Whether the tensor-core forward takes these args (bf16/f16, D 64 or 128); it needs q, k, v,
 * out 16-byte aligned with strides that are multiples of 8 elements (the caller copies). */
int lt_cuda_attention_fwd_uses_mma(int dtype, int64_t D);
/* Whether the tensor-core backward takes them (bf16/f16, D 64 or 128): q, k, v, dout aligned as
 * for the forward, dq, dk, dv likewise (the caller copies). */
int lt_cuda_attention_bwd_uses_mma(int dtype, int64_t D);
/* Forward: out (and lse when not NULL) from q, k, v. Queued on the device's compute stream. */
int lt_cuda_attention_forward(const lt_cuda_att_args *a);
/* Backward: dq, dk, dv from dout, q, k, v, out, lse (deterministic: no atomics). */
int lt_cuda_attention_backward(const lt_cuda_att_args *a);

#endif
