/* nn_ops.h — between the host side of the fused nn ops (host/ops/cross_entropy.c, ops/embedding.c,
 * ops/rope.c, ops/random.c) and their kernels (kernels/cross_entropy.cu, embedding.cu, rope.cu, kernels/random.cu).
 *
 * The host checks every argument (with the CPU's messages) before calling these; they take
 * device pointers of contiguous buffers unless strides are given, launch on the device's
 * compute stream and return 0, or -1 with the error set. */
#ifndef LUTRA_CUDA_NN_OPS_H
#define LUTRA_CUDA_NN_OPS_H
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif

/* ---- random numbers (kernels/random.cu): host/ops/random.c's recipe, through host/ops/philox.h ---- */
enum { LT_RNG_UNIFORM = 0, LT_RNG_NORMAL = 1, LT_RNG_INT = 2, LT_RNG_BERNOULLI = 3 };
typedef struct lt_cuda_rng_args {
  int device, dtype, kind, ndim;
  void *data;        /* element [0,...,0] of out */
  int64_t shape[8];  /* LT_MAX_DIMS; element i (row-major over shape) gets counter offset + i */
  int64_t stride[8]; /* in elements */
  uint32_t key[2];   /* low32(seed), high32(seed) */
  uint64_t offset;
  double a, b;        /* uniform: lo, hi - lo; normal: mean, std */
  uint64_t first_top; /* uniform: draws from here on give lo */
  uint32_t below;     /* bernoulli */
  int64_t ilo;        /* rand_int: lo, range */
  uint64_t range;
} lt_cuda_rng_args;
int lt_cuda_rng_fill(const lt_cuda_rng_args *a);

/* ---- indices (kernels/cross_entropy.cu) -------------------------------------------------------- */
/* ids[k * stride], k < n, i32 or i64: *bad_pos gets the first k whose id is outside [0, V)
 * (and is not ignore_index when has_ignore), with that id in *bad_id; -1 when all are fine.
 * One flag read back (a synchronisation). */
int lt_cuda_check_indices(const char *op, int device, const void *ids, int dtype, int64_t stride, int64_t n, int64_t V,
                          int has_ignore, int64_t ignore_index, int64_t *bad_pos, int64_t *bad_id);

/* ---- cross-entropy (kernels/cross_entropy.cu) --------------------------------------------------- */
/* logits (N, V) contiguous, dtype f32/f64/bf16/f16; targets[i * tstride] i32/i64, checked.
 * losses (N) and lse (N, or NULL) are f32, or f64 when their dtype says so (f64 logits). */
int lt_cuda_cross_entropy_forward(int device, int dtype, const void *logits, int64_t N, int64_t V, const void *targets,
                                  int tdtype, int64_t tstride, int64_t ignore_index, void *losses, int ldtype,
                                  void *lse, int sdtype);
/* dlogits (N, V) contiguous, logits' dtype (may be logits itself); dlosses and lse (N)
 * contiguous, f64 for f64 logits, else f32. */
int lt_cuda_cross_entropy_backward(int device, int dtype, void *dlogits, const void *logits, int64_t N, int64_t V,
                                   const void *targets, int tdtype, int64_t tstride, int64_t ignore_index,
                                   const void *dlosses, const void *lse);

/* ---- embedding (kernels/embedding.cu) --------------------------------------------------- */
/* out (n, C) contiguous = rows ids[k] of weight (rows row_stride elements apart, unit column
 * stride), elements of esize bytes; ids (n) contiguous i32/i64, checked in [0, V). */
int lt_cuda_embedding_forward(int device, void *out, const void *weight, int64_t row_stride, int esize, const void *ids,
                              int idtype, int64_t n, int64_t C);
/* dweight (V, C) contiguous, dtype f32/f64/bf16/f16, = per id the sum of its dout rows
 * (dout (n, C) contiguous) in increasing position order; rows of absent ids are zero. */
int lt_cuda_embedding_backward(int device, int dtype, void *dweight, int64_t V, int64_t C, const void *dout,
                               const void *ids, int idtype, int64_t n);

/* ---- rope (kernels/rope.cu) --------------------------------------------------------------- */
typedef struct lt_cuda_rope_args {
  int device, dtype;
  int64_t B, T, H, D;
  const void *x;
  int64_t xs[4]; /* element strides of x (B, T, H, D) */
  void *out;
  int64_t os[4];
  const void *pos; /* NULL: position t; else i32/i64 (T) or (B, T) */
  int pdtype, per_batch;
  int64_t ps[2];      /* element strides of pos: (T) uses ps[0]; (B, T) uses both */
  const double *freq; /* host array of D / 2 frequencies, as the CPU computes them */
  double sign;        /* 1, or -1 for the inverse rotation */
} lt_cuda_rope_args;
int lt_cuda_rope(const lt_cuda_rope_args *a);

#ifdef __cplusplus
}
#endif

#endif
