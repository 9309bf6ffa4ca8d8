/* backend.h — the one dispatch seam between the op fronts (host/ops/<op>.c: check, plan,
 * dispatch) and the code that runs an op on a device: a table of entry points per device.
 *
 *   lt_backend_cpu  (host/ops/backend_cpu.c)  the CPU rows (host/ops/<op>_cpu.c)
 *   lt_backend_cuda (host/ops/backend_cuda.cu) the kernel launchers (kernels/<op>.cu)
 *
 * A front checks its arguments, builds the plan the kernels declare (kernels/<op>.h: plain C
 * structs both sides share) and calls the entry of the table lt_backend_for gives:
 *
 *   const lt_backend *be = lt_backend_for(op, x->device);
 *   if (!be) return -1;                       // "<op>: lutra was built without CUDA"
 *   return be->layer_norm_forward(op, &plan);
 *
 * An entry is NULL where the front runs that device's path itself (the CPU side of most
 * elementwise ops, whose loops live in the front's file). Every launcher returns 0, or -1 with
 * the error set naming op. This file, backend.c and backend_cpu.c are the only op files that know
 * which backends a build has (backend.c's one #ifdef LUTRA_HAVE_CUDA). */
#ifndef LUTRA_OPS_BACKEND_H
#define LUTRA_OPS_BACKEND_H
#include "core/internal.h"
#include "kernels/adafactor.h"
#include "kernels/adamw.h"
#include "kernels/attention.h"
#include "kernels/cross_entropy.h"
#include "kernels/cumsum.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/gather.h"
#include "kernels/lamb.h"
#include "kernels/layer_norm.h"
#include "kernels/lion.h"
#include "kernels/matmul.h"
#include "kernels/multi_tensor.h"
#include "kernels/random.h"
#include "kernels/reduce.h"
#include "kernels/rope.h"
#include "kernels/sort.h"
#include "kernels/tril.h"

typedef struct lt_backend {
  const char *name;
  /* makes device current for op's kernels (layer_norm's check before it touches device memory) */
  int (*use_device)(const char *op, int device);
  /* ---- memory on the device ---- */
  int (*strided_copy)(int device, void *dst, const int64_t *dst_stride, const void *src, const int64_t *src_stride,
                      int ndim, const int64_t *shape, int dtype);
  int (*convert_contig)(int device, void *dst, int dst_dtype, const void *src, int src_dtype, int64_t n);
  /* ---- elementwise (kernels/unary.cu, binary.cu) ---- */
  int (*unary)(int device, int op, int dtype, const lt_ew_geom *g, void *out, const void *a);
  int (*unary_backward)(int device, int op, int dtype, const lt_ew_geom *g, void *grad_in, const void *grad_out,
                        const void *x);
  int (*clamp)(int device, int dtype, const lt_ew_geom *g, void *out, const void *a, double lo, double hi);
  int (*binary)(int device, int op, int dtype, const lt_ew_geom *g, void *out, const void *a, const void *b,
                int scalar_side, const void *scalar);
  int (*where)(int device, int size, const lt_ew_geom *g, void *out, const void *cond, const void *a, const void *b);
  /* ---- reductions (kernels/reduce.cu, softmax.cu) ---- */
  int (*reduce)(const char *op, int device, const lt_cuda_red_geom *g, const void *in, void *out, int dtype, int what,
                double var_denom);
  int (*argreduce)(const char *op, int device, const lt_cuda_red_geom *g, const void *in, int dtype, int64_t *out,
                   int is_max);
  int (*softmax)(const char *op, int device, const lt_cuda_softmax_args *a);
  /* ---- nn ops ---- */
  int (*layer_norm_forward)(const char *op, const lt_layer_norm_forward_plan *p);
  int (*layer_norm_backward)(const char *op, const lt_layer_norm_backward_plan *p);
  int (*check_indices)(const char *op, int device, const void *ids, int dtype, int64_t stride, int64_t n, int64_t V,
                       int has_ignore, int64_t ignore_index, int64_t *bad_pos, int64_t *bad_id);
  int (*cross_entropy_forward)(int device, int dtype, const void *logits, int64_t N, int64_t V, const void *targets,
                               int tdtype, int64_t tstride, int64_t ignore_index, void *losses, int ldtype, void *lse,
                               int sdtype);
  int (*cross_entropy_backward)(int device, int dtype, void *dlogits, const void *logits, int64_t N, int64_t V,
                                const void *targets, int tdtype, int64_t tstride, int64_t ignore_index,
                                const void *dlosses, const void *lse);
  int (*embedding_forward)(int device, void *out, const void *weight, int64_t row_stride, int esize, const void *ids,
                           int idtype, int64_t n, int64_t C);
  int (*embedding_backward)(int device, int dtype, void *dweight, int64_t V, int64_t C, const void *dout,
                            const void *ids, int idtype, int64_t n);
  int (*gather)(const lt_gather_plan *p);
  int (*rope)(const lt_rope_plan *a);
  int (*rng_fill)(const lt_cuda_rng_args *a);
  int (*attention_fwd_uses_mma)(int dtype, int64_t D);
  int (*attention_bwd_uses_mma)(int dtype, int64_t D);
  int (*attention_forward)(const lt_cuda_att_args *a);
  int (*attention_backward)(const lt_cuda_att_args *a);
  /* ---- matmul (kernels/matmul.cu) ---- */
  int (*gemm)(const char *op, const lt_cuda_gemm_args *g);
  int (*linear_forward)(lt_tensor *out, const lt_tensor *x, const lt_tensor *w, const lt_tensor *bias, int act);
  int (*linear_backward_params)(lt_tensor *dw, lt_tensor *dbias, const lt_tensor *dy, const lt_tensor *x);
  /* ---- optimizers and multi-tensor ops (kernels/adamw.cu, lion.cu, multi_tensor.cu) ---- */
  int (*adamw_multi)(int device, const lt_optim_entry *entries, int64_t n, int64_t chunks, const lt_adamw_scalars *s);
  int (*lion)(int device, const lt_optim_entry *e, const lt_lion_scalars *s);
  int (*sumsq_multi)(int device, const lt_optim_entry *entries, int64_t n, int64_t chunks, void *out, int out_dtype);
  int (*scale_multi)(int device, const lt_optim_entry *entries, int64_t n, int64_t chunks, const void *scale,
                     int scale_dtype);
  int (*clip_coef)(int device, void *coef, int coef_dtype, const void *sumsq, int sumsq_dtype, double max_norm);
  /* ---- along a dim (kernels/sort.cu, cumsum.cu, tril.cu) ---- */
  int (*sort)(const char *op, const lt_sort_plan *p);
  int (*sort_backward)(const char *op, const lt_sort_backward_plan *p);
  int (*cumsum)(const char *op, const lt_cumsum_plan *p);
  int (*tril)(const char *op, const lt_tril_plan *p);
  int (*adafactor)(int device, const lt_adafactor_args *a); /* kernels/adafactor.cu */
  int (*adafactor_multi)(int device, const lt_adafactor_entry *entries, int64_t n, const lt_adafactor_counts *c);
  int (*lamb)(int device, const lt_lamb_args *a);           /* kernels/lamb.cu */
  int (*lamb_multi)(int device, const lt_optim_entry *entries, int64_t n, int64_t chunks, const lt_lamb_args *a);
} lt_backend;

extern const lt_backend lt_backend_cpu;

/* The one lookup (backend.c): the table that runs op on device (LT_DEVICE_CPU or a CUDA
 * ordinal), or NULL. The front says how a CUDA device that cannot run op here is refused:
 *   absent     this build has no CUDA: the error, a format naming op through one %s
 *              (LT_BACKEND_ABSENT, or the front's own words); NULL sets none, for a front that
 *              then runs its own path (linear: the unfused matmul, which refuses in its words);
 *   available  also refuse a CUDA device this machine lacks: "<op>: device cuda:N is not
 *              available (<lt_cuda_status()>)" (the fronts that check the device before their
 *              arguments; the others meet it at the kernel's lt_cuda_use_device). */
const lt_backend *lt_backend_lookup(const char *op, int device, const char *absent, bool available);
#define LT_BACKEND_ABSENT "%s: lutra was built without CUDA"

/* The lookup every front makes: the table for device, or NULL with the error
 * "<op>: lutra was built without CUDA". */
static inline const lt_backend *lt_backend_for(const char *op, int device) {
  return lt_backend_lookup(op, device, LT_BACKEND_ABSENT, false);
}

#endif
