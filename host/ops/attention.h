/* attention.h — between the attention front (host/ops/attention.c: checks, the CPU path) and
 * its CUDA side (host/ops/attention_cuda.c). */
#ifndef LUTRA_OPS_ATTENTION_H
#define LUTRA_OPS_ATTENTION_H
#include "ops/backend.h"

/* The CUDA side of lt_attention_forward / lt_attention_backward (host/ops/attention_cuda.c),
 * called by host/ops/attention.c after its checks, with out / lse / dq / dk / dv prepared on q's
 * device: lays the operands out for the kernels (copies what they cannot read in place, computes
 * into a scratch what they cannot write in place), allocates scratch, launches. */
int lt_attention_forward_cuda(const lt_backend *be, lt_tensor *out, lt_tensor *lse, const lt_tensor *q,
                              const lt_tensor *k, const lt_tensor *v, const lt_tensor *segment_ids, double scale,
                              int causal, int64_t window);
int lt_attention_backward_cuda(const lt_backend *be, lt_tensor *dq, lt_tensor *dk, lt_tensor *dv, const lt_tensor *dout,
                               const lt_tensor *q, const lt_tensor *k, const lt_tensor *v, const lt_tensor *out,
                               const lt_tensor *lse, const lt_tensor *segment_ids, double scale, int causal,
                               int64_t window);
#endif
