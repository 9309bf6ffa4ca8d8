/* attention_cuda.c — attention on CUDA tensors: lays q, k, v, ... out for the kernels of
 * kernels/attention_forward.cu and kernels/attention_backward.cu, with the scratch they need.
 *
 * The kernels read and write (B, T, heads, D) operands through strides with D dense, so the fused
 * qkv views of nn/attention.lua are used in place. An input they cannot read (D strided; for the
 * tensor-core forward also rows not 16-byte aligned) is copied to a contiguous tensor first; an
 * output they cannot write is computed into a contiguous scratch that is copied into it after.
 * Everything is queued on the device's compute stream: no host synchronisation. Head dims above
 * 256 (ATT_GEN_MAX_D) go through the CPU op instead (copies both ways).
 * host/ops/attention.c has checked shapes, dtypes, devices and aliasing before these run.
 */
#include "kernels/attention_tile.h"
#include "ops/attention.h"
#include <stdint.h>

/* The kernels can use x as it lies: D dense and, for the tensor-core forward (mma), element
 * [0,0,0,0] 16-byte aligned with every batch, row and head stride a multiple of 8 elements. */
static bool fits(const lt_tensor *x, bool mma) {
  if (x->shape[3] > 1 && x->stride[3] != 1) return false;
  if (!mma) return true;
  if ((uintptr_t)lt_data_ptr(x) % 16 != 0) return false;
  for (int i = 0; i < 3; i++)
    if (x->shape[i] > 1 && x->stride[i] % 8 != 0) return false;
  return true;
}

typedef struct dev_operand {
  lt_tensor *work; /* a contiguous stand-in for the caller's tensor, or NULL */
  lt_tensor *dst;  /* an output computed into work: where it goes after the kernels */
} dev_operand;

static void set_operand(lt_cuda_att_operand *o, const lt_tensor *t) {
  o->data = lt_data_ptr(t);
  o->sb = t->stride[0], o->st = t->stride[1], o->sh = t->stride[2];
}

/* o describes x, or a contiguous copy of x (held in d->work) when the kernels cannot read x. */
static int operand_in(const lt_backend *be, lt_cuda_att_operand *o, dev_operand *d, const lt_tensor *x, bool mma) {
  d->work = d->dst = NULL;
  if (fits(x, mma)) return set_operand(o, x), 0;
  int64_t stride[LT_MAX_DIMS];
  if (!(d->work = lt_tensor_new())) return lt_errorf("attention: out of memory");
  LT_TRY(lt_empty(d->work, 4, x->shape, x->dtype, x->device));
  lt_contiguous_strides(4, x->shape, stride);
  LT_TRY(be->strided_copy(x->device, lt_data_ptr(d->work), stride, lt_data_ptr(x), x->stride, 4, x->shape, x->dtype));
  set_operand(o, d->work);
  return 0;
}

/* o describes out, or a contiguous scratch that operand_finish copies into out. */
static int operand_out(lt_cuda_att_operand *o, dev_operand *d, lt_tensor *out, bool mma) {
  d->work = d->dst = NULL;
  /* rows at least D apart (no overlapping writes), as the CPU path asks of an output */
  bool rows_apart = out->shape[1] <= 1 || out->stride[1] >= out->shape[3];
  if (fits(out, mma) && rows_apart) return set_operand(o, out), 0;
  if (!(d->work = lt_tensor_new())) return lt_errorf("attention: out of memory");
  LT_TRY(lt_empty(d->work, 4, out->shape, out->dtype, out->device));
  d->dst = out;
  set_operand(o, d->work);
  return 0;
}

/* Copies a scratch result into its output (when rc is still 0) and drops the stand-in. */
static int operand_finish(const lt_backend *be, dev_operand *d, int rc) {
  if (rc == 0 && d->dst) {
    int64_t stride[LT_MAX_DIMS];
    lt_contiguous_strides(4, d->work->shape, stride);
    rc = be->strided_copy(d->dst->device, lt_data_ptr(d->dst), d->dst->stride, lt_data_ptr(d->work), stride, 4,
                          d->dst->shape, d->dst->dtype);
  }
  lt_release(d->work);
  d->work = d->dst = NULL;
  return rc;
}

static void args_init(lt_cuda_att_args *a, const lt_tensor *q, const lt_tensor *k, const lt_tensor *seg, double scale,
                      int causal, int64_t window) {
  memset(a, 0, sizeof *a);
  a->device = q->device, a->dtype = q->dtype, a->causal = causal != 0, a->window = window;
  a->B = q->shape[0], a->T = q->shape[1], a->H = q->shape[2], a->D = q->shape[3];
  a->S = k->shape[1], a->Hkv = k->shape[2];
  a->group = a->H / a->Hkv, a->off = a->S - a->T;
  a->scale = scale;
  if (seg) {
    a->seg = lt_data_ptr(seg);
    a->seg_dtype = seg->dtype;
    a->seg_sb = seg->stride[0], a->seg_st = seg->stride[1];
  }
}

static void args_lse(lt_cuda_att_args *a, const lt_tensor *lse) {
  a->lse = lt_data_ptr(lse);
  a->lse_sb = lse->stride[0], a->lse_sh = lse->stride[1], a->lse_st = lse->stride[2];
}

/* ---- head dims above ATT_GEN_MAX_D: no kernel keeps such rows in registers, so the CPU op computes
 * them (copies both ways; slow but exact, and every shape the CPU takes works on CUDA) ---- */

/* A CPU copy of x (NULL stays NULL); *fail set on error. */
static lt_tensor *cpu_copy(const lt_tensor *x, bool *fail) {
  if (!x || *fail) return NULL;
  lt_tensor *c = lt_tensor_new();
  if (!c || lt_empty(c, x->ndim, x->shape, x->dtype, LT_DEVICE_CPU) || lt_copy(c, x)) {
    if (!c) lt_errorf("attention: out of memory");
    *fail = true;
    lt_release(c);
    return NULL;
  }
  return c;
}

static int forward_via_cpu(lt_tensor *out, lt_tensor *lse, const lt_tensor *q, const lt_tensor *k, const lt_tensor *v,
                           const lt_tensor *seg, double scale, int causal, int64_t window) {
  bool fail = false;
  lt_tensor *cq = cpu_copy(q, &fail), *ck = cpu_copy(k, &fail), *cv = cpu_copy(v, &fail), *cs = cpu_copy(seg, &fail);
  lt_tensor *co = fail ? NULL : lt_tensor_new(), *cl = fail || !lse ? NULL : lt_tensor_new();
  int rc = fail || !co || (lse && !cl) ? -1 : lt_attention_forward(co, cl, cq, ck, cv, cs, scale, causal, window);
  if (rc == 0) rc = lt_copy(out, co);
  if (rc == 0 && lse) rc = lt_copy(lse, cl);
  lt_tensor *all[6] = {cq, ck, cv, cs, co, cl};
  for (int i = 0; i < 6; i++) lt_release(all[i]);
  return rc;
}

static int backward_via_cpu(lt_tensor *dq, lt_tensor *dk, lt_tensor *dv, const lt_tensor *dout, const lt_tensor *q,
                            const lt_tensor *k, const lt_tensor *v, const lt_tensor *out, const lt_tensor *lse,
                            const lt_tensor *seg, double scale, int causal, int64_t window) {
  bool fail = false;
  lt_tensor *in[7] = {cpu_copy(dout, &fail), cpu_copy(q, &fail),   cpu_copy(k, &fail),  cpu_copy(v, &fail),
                      cpu_copy(out, &fail),  cpu_copy(lse, &fail), cpu_copy(seg, &fail)};
  lt_tensor *g[3] = {lt_tensor_new(), lt_tensor_new(), lt_tensor_new()};
  int rc = fail || !g[0] || !g[1] || !g[2] ? -1
                                           : lt_attention_backward(g[0], g[1], g[2], in[0], in[1], in[2], in[3], in[4],
                                                                   in[5], in[6], scale, causal, window);
  if (rc == 0) rc = lt_copy(dq, g[0]);
  if (rc == 0) rc = lt_copy(dk, g[1]);
  if (rc == 0) rc = lt_copy(dv, g[2]);
  for (int i = 0; i < 7; i++) lt_release(in[i]);
  for (int i = 0; i < 3; i++) lt_release(g[i]);
  return rc;
}

/* ---- the kernels ---------------------------------------------------------------------------------- */

int lt_attention_forward_cuda(const lt_backend *be, lt_tensor *out, lt_tensor *lse, const lt_tensor *q,
                              const lt_tensor *k, const lt_tensor *v, const lt_tensor *segment_ids, double scale,
                              int causal, int64_t window) {
  if (q->shape[3] > ATT_GEN_MAX_D) return forward_via_cpu(out, lse, q, k, v, segment_ids, scale, causal, window);
  lt_cuda_att_args a;
  args_init(&a, q, k, segment_ids, scale, causal, window);
  if (a.B * a.H * a.T == 0) return 0; /* out and lse are empty */
  if (lse) args_lse(&a, lse);
  bool mma = be->attention_fwd_uses_mma(a.dtype, a.D) != 0;
  dev_operand d[4] = {{0}};
  int rc = 0;
  if (operand_in(be, &a.q, &d[0], q, mma) || operand_in(be, &a.k, &d[1], k, mma) ||
      operand_in(be, &a.v, &d[2], v, mma) || operand_out(&a.out, &d[3], out, mma))
    rc = -1;
  if (rc == 0) rc = be->attention_forward(&a);
  for (int i = 0; i < 4; i++) rc = operand_finish(be, &d[i], rc);
  return rc;
}

int lt_attention_backward_cuda(const lt_backend *be, lt_tensor *dq, lt_tensor *dk, lt_tensor *dv, const lt_tensor *dout,
                               const lt_tensor *q, const lt_tensor *k, const lt_tensor *v, const lt_tensor *out,
                               const lt_tensor *lse, const lt_tensor *segment_ids, double scale, int causal,
                               int64_t window) {
  if (q->shape[3] > ATT_GEN_MAX_D)
    return backward_via_cpu(dq, dk, dv, dout, q, k, v, out, lse, segment_ids, scale, causal, window);
  lt_cuda_att_args a;
  args_init(&a, q, k, segment_ids, scale, causal, window);
  args_lse(&a, lse);
  bool f64 = a.dtype == LT_F64;
  int64_t rows = a.B * a.H * a.T;
  lt_tensor *delta = lt_tensor_new(), *lse2 = f64 ? lt_tensor_new() : NULL;
  dev_operand d[8] = {{0}};
  int rc = !delta || (f64 && !lse2) ? lt_errorf("attention_backward: out of memory") : 0;
  if (rc == 0) rc = lt_empty(delta, 1, &rows, f64 ? LT_F64 : LT_F32, a.device);
  if (rc == 0 && f64) rc = lt_empty(lse2, 1, &rows, LT_F64, a.device);
  bool mma = be->attention_bwd_uses_mma(a.dtype, a.D) != 0; /* out is read by the delta pass alone */
  if (rc == 0 && (operand_in(be, &a.q, &d[0], q, mma) || operand_in(be, &a.k, &d[1], k, mma) ||
                  operand_in(be, &a.v, &d[2], v, mma) || operand_in(be, &a.dout, &d[3], dout, mma) ||
                  operand_in(be, &a.out, &d[4], out, false) || operand_out(&a.dq, &d[5], dq, mma) ||
                  operand_out(&a.dk, &d[6], dk, mma) || operand_out(&a.dv, &d[7], dv, mma)))
    rc = -1;
  if (rc == 0) {
    a.delta = lt_data_ptr(delta);
    a.lse2 = f64 ? lt_data_ptr(lse2) : NULL;
    rc = be->attention_backward(&a);
  }
  for (int i = 0; i < 8; i++) rc = operand_finish(be, &d[i], rc);
  lt_release(delta);
  lt_release(lse2);
  return rc;
}
