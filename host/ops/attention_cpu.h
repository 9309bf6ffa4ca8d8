/* attention_cpu.h — what the attention front (ops/attention.c: checks, operands) and its CPU
 * rows (ops/attention_cpu.c) share: the block sizes, the operands and the context of one call. */
#ifndef LUTRA_OPS_ATTENTION_CPU_H
#define LUTRA_OPS_ATTENTION_CPU_H
#include "core/internal.h"

enum {
  BLOCK_ROWS = 32, /* query rows per forward / dQ task */
  BLOCK_KEYS = 64, /* keys per dK / dV task */
  QCHUNK = 64,     /* query rows per step of a dK / dV task */
  /* OpenBLAS (pthreads build) starts its own threads for a product with M*N*K > 2^18, even when
   * called from inside our OpenMP threads: measured 3-5x slower than keeping each call at or below
   * that size, where it runs on the calling thread. */
  GEMM_BUDGET = 1 << 18,
};

typedef struct operand {
  lt_tensor *t;           /* what the kernels read or write: the caller's tensor or a work copy */
  lt_tensor *dst;         /* an output computed into a work copy: the caller's tensor to copy it into */
  char *base;             /* element [0,0,0,0] */
  int64_t sb, st, sh, ld; /* element strides of dims 0, 1, 2; D is dense; ld: rows for BLAS */
} operand;

typedef struct att_ctx {
  int64_t B, T, S, H, Hkv, D, group, off; /* group = H / Hkv, off = S - T */
  double scale;
  bool causal;
  int64_t window; /* 0: none; else query t sees keys s > t + off - window */
  operand q, k, v, out, dout, dq, dk, dv;
  const int64_t *seg;                 /* (B, T) segment ids or NULL */
  const bool *sorted;                 /* (B): batch b's ids never decrease, so runs bound the keys */
  const int64_t *run_start, *run_end; /* (B, T): [start, end) of the run of equal ids around t */
  float *lse;                         /* forward output, or NULL */
  const float *lse_in;                /* backward input */
  int64_t lse_sb, lse_sh, lse_st;
  void *delta;       /* (B, H, T) in the compute type */
  double *lse_exact; /* f64 backward: (B, H, T) lse recomputed in double (the saved one is f32) */
} att_ctx;

/* The CPU passes over c, its operands laid out by the front: double rows when f64, else float.
 * 0, or -1 with the error set (out of memory for scratch). */
int lt_attention_forward_cpu(att_ctx *c, bool f64);
int lt_attention_backward_cpu(att_ctx *c, bool f64);

#endif
