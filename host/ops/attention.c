/* attention.c — scaled dot-product attention with causal and segment masks and grouped
 * query heads (GQA/MQA), forward and backward: the checks, the operands, and the dispatch to the
 * CPU rows (ops/attention_cpu.c) or the CUDA side (ops/attention_cuda.c).
 *
 * q (B, T, H, D), k and v (B, S, Hkv, D); query head h reads kv head h / (H / Hkv).
 * score(t, s) = scale * q_t . k_s is visible when (!causal || s <= t + S - T), with a window W > 0
 * (causal only) when (t + S - T) - s < W, and with segment ids (T == S) when seg[t] == seg[s].
 * The window counts absolute positions: query t is at t + S - T (decoding T new tokens after a
 * cache of S - T), key s at s; it is Hugging Face's sliding window (transformers' masking_utils:
 * kv_idx > q_idx - sliding_window and kv_idx <= q_idx), W keys per query counting its own. out_t = sum_s
 * softmax(score(t, .))_s v_s over visible s, and lse_t = log sum_s exp(score(t, s)) over visible s. A row that sees no
 * key (S < T with causal, or segments) gets out 0 and lse -inf (the log of an empty sum: merging it by lse weights it
 * 0). Backward recomputes P = exp(score - lse) and, with delta_t = dout_t . out_t: dV = P^T dO, dP = dO V^T, dS = P *
 * (dP - delta), dQ = scale dS K, dK = scale dS^T Q, dK and dV summed over the H / Hkv query heads of a kv head. The
 * saved lse is f32, so in f64 the backward recomputes it in double (the dQ pass sees whole rows anyway) to keep f64
 * gradients exact. lse may be NULL in the forward (inference: nothing saved).
 *
 * Work split, the same results for any thread count (every output row is written by one task,
 * which sums in a fixed order):
 *   forward and dQ: tasks (b, h, block of BLOCK_ROWS query rows) that see all their keys at once,
 *     so one (BLOCK_ROWS, S) score block per thread is the largest scratch;
 *   dK and dV: tasks (b, kv head, block of BLOCK_KEYS keys) that loop over the group's heads and
 *     their query rows in chunks of QCHUNK, in order.
 * Products go to OpenBLAS on blocks; f32 rows use a polynomial exp that vectorises.
 * f32 and f64 compute in their type; bf16/f16 inputs are copied to f32 and results rounded back.
 * Inputs may be strided views (e.g. of a fused qkv projection): used in place when D is innermost
 * and dense, else copied. Outputs must not share storage with the inputs.
 * CUDA tensors pass the same checks, then go to host/ops/attention_cuda.c (flash-style kernels in
 * kernels/attention_*.cu, whose tile algorithm tests/c/test_attention_tiles.c emulates); lse then
 * lives on q's device.
 */
#include "ops/attention.h"
#include "ops/attention_cpu.h"
#include <stdlib.h>

/* ---- operands ------------------------------------------------------------------------ */

/* Usable in place by the kernels: compute dtype, D dense, rows at least D apart, int-sized ld. */
static bool usable(const lt_tensor *x, int work) {
  int64_t D = x->shape[3];
  return x->dtype == work && (D <= 1 || x->stride[3] == 1) && (x->shape[1] <= 1 || x->stride[1] >= D) &&
         x->stride[1] < INT32_MAX;
}

static void operand_geometry(operand *o) {
  const lt_tensor *t = o->t;
  int64_t D = t->shape[3];
  o->base = lt_data_ptr(t);
  o->sb = t->stride[0], o->st = t->stride[1], o->sh = t->stride[2];
  o->ld = t->shape[1] <= 1 ? (D > 1 ? D : 1) : t->stride[1];
  if (o->ld < 1) o->ld = 1;
}

static int operand_in(operand *o, const lt_tensor *x, int work) {
  o->t = lt_tensor_new();
  o->dst = NULL;
  if (!o->t) return lt_errorf("attention: out of memory");
  if (usable(x, work)) {
    LT_TRY(lt_set(o->t, x));
  } else {
    LT_TRY(lt_empty(o->t, 4, x->shape, work, LT_DEVICE_CPU));
    LT_TRY(lt_copy(o->t, x));
  }
  operand_geometry(o);
  return 0;
}

static int operand_out(operand *o, lt_tensor *out, int work) {
  o->t = lt_tensor_new();
  o->dst = NULL;
  if (!o->t) return lt_errorf("attention: out of memory");
  if (usable(out, work)) {
    LT_TRY(lt_set(o->t, out));
  } else {
    LT_TRY(lt_empty(o->t, 4, out->shape, work, LT_DEVICE_CPU));
    o->dst = out;
  }
  operand_geometry(o);
  return 0;
}

/* Copies a work result back into the caller's output, and drops the operand. */
static int operand_finish(operand *o, int rc) {
  if (rc == 0 && o->dst) rc = lt_copy(o->dst, o->t);
  lt_release(o->t);
  o->t = NULL;
  return rc;
}

/* ---- checks -------------------------------------------------------------------------- */

static int check_qkv(const char *op, const lt_tensor *q, const lt_tensor *k, const lt_tensor *v, const lt_tensor *seg,
                     double scale, int causal, int64_t window) {
  char a[LT_DESC_STR], b[LT_DESC_STR], d[LT_DESC_STR];
  LT_TRY(lt_check_defined(op, "q", q));
  LT_TRY(lt_check_defined(op, "k", k));
  LT_TRY(lt_check_defined(op, "v", v));
  if (q->ndim != 4 || k->ndim != 4 || v->ndim != 4)
    return lt_errorf("%s: q (B, T, H, D), k and v (B, S, Hkv, D) must be 4-d, got q %s, k %s, v %s", op, lt_desc(a, q),
                     lt_desc(b, k), lt_desc(d, v));
  if (!lt_dtype_is_float(q->dtype) || q->dtype != k->dtype || q->dtype != v->dtype)
    return lt_errorf("%s: q, k, v must share one floating dtype, got q %s, k %s, v %s", op, lt_desc(a, q),
                     lt_desc(b, k), lt_desc(d, v));
  LT_TRY(lt_check_same_device(op, q, k));
  LT_TRY(lt_check_same_device(op, q, v));
  if (!lt_backend_lookup(op, q->device, LT_BACKEND_ABSENT, true)) return -1;
  bool kv_same = true;
  for (int i = 0; i < 4; i++) kv_same &= k->shape[i] == v->shape[i];
  if (!kv_same || k->shape[0] != q->shape[0] || k->shape[3] != q->shape[3] || k->shape[2] < 1 ||
      q->shape[2] % k->shape[2] != 0)
    return lt_errorf("%s: expected q (B, T, H, D), k = v (B, S, Hkv, D) with H %% Hkv == 0, got q %s, k %s, v %s", op,
                     lt_desc(a, q), lt_desc(b, k), lt_desc(d, v));
  if (!isfinite(scale)) return lt_errorf("%s: scale must be finite, got %g", op, scale);
  if (window < 0) return lt_errorf("%s: window must be >= 0 (0: none), got %lld", op, (long long)window);
  if (window > 0 && !causal)
    return lt_errorf("%s: a sliding window (window %lld) needs causal attention", op, (long long)window);
  if (seg) {
    LT_TRY(lt_check_defined(op, "segment_ids", seg));
    if (seg->dtype != LT_I32 && seg->dtype != LT_I64)
      return lt_errorf("%s: segment_ids must be i32 or i64, got %s", op, lt_desc(a, seg));
    LT_TRY(lt_check_same_device(op, q, seg));
    if (seg->ndim != 2 || seg->shape[0] != q->shape[0] || seg->shape[1] != q->shape[1] || q->shape[1] != k->shape[1])
      return lt_errorf("%s: segment_ids %s must be (B, T) with T == S, for q %s and k %s", op, lt_desc(a, seg),
                       lt_desc(b, q), lt_desc(d, k));
  }
  return 0;
}

static int check_like(const char *op, const char *what, const lt_tensor *x, const lt_tensor *like) {
  char a[LT_DESC_STR], b[LT_DESC_STR];
  LT_TRY(lt_check_defined(op, what, x));
  if (!lt_same_shape(x, like) || x->dtype != like->dtype || x->device != like->device)
    return lt_errorf("%s: %s is %s, expected %s like q", op, what, lt_desc(a, x), lt_desc(b, like));
  return 0;
}

static bool shares(const lt_tensor *out, const lt_tensor *in) { return in && out->storage == in->storage; }

static int check_no_alias(const char *op, const char *what, const lt_tensor *out, const lt_tensor *const *ins, int n) {
  for (int i = 0; i < n; i++)
    if (shares(out, ins[i])) return lt_errorf("%s: %s shares storage with an input", op, what);
  return 0;
}

/* ---- setup shared by forward and backward ------------------------------------------------ */

static void ctx_init(att_ctx *c, const lt_tensor *q, const lt_tensor *k, double scale, int causal, int64_t window) {
  memset(c, 0, sizeof *c);
  c->B = q->shape[0], c->T = q->shape[1], c->H = q->shape[2], c->D = q->shape[3];
  c->S = k->shape[1], c->Hkv = k->shape[2];
  c->group = c->H / c->Hkv;
  c->off = c->S - c->T;
  c->scale = scale;
  c->causal = causal != 0;
  c->window = window;
}

/* Loads segment ids into (B, T) i64 with the runs of equal ids; one allocation, freed by the caller. */
static int64_t *load_segments(att_ctx *c, const lt_tensor *seg) {
  if (!seg) return NULL;
  int64_t B = c->B, T = c->T;
  int64_t *buf = malloc((size_t)(3 * B * T + 1) * sizeof(int64_t) + (size_t)B * sizeof(bool));
  if (!buf) return NULL;
  int64_t *ids = buf, *start = buf + B * T, *end = buf + 2 * B * T;
  bool *sorted = (bool *)(buf + 3 * B * T + 1);
  const char *base = lt_data_ptr(seg);
  for (int64_t b = 0; b < B; b++) {
    int64_t *id = ids + b * T;
    sorted[b] = true;
    for (int64_t t = 0; t < T; t++) {
      id[t] = lt_load_i64(base, seg->dtype, b * seg->stride[0] + t * seg->stride[1]);
      if (t > 0 && id[t] < id[t - 1]) sorted[b] = false;
      start[b * T + t] = t > 0 && id[t] == id[t - 1] ? start[b * T + t - 1] : t;
    }
    for (int64_t t = T - 1; t >= 0; t--) end[b * T + t] = t < T - 1 && id[t] == id[t + 1] ? end[b * T + t + 1] : t + 1;
  }
  c->seg = ids, c->run_start = start, c->run_end = end, c->sorted = sorted;
  return buf;
}

int lt_attention_forward(lt_tensor *out, lt_tensor *lse, const lt_tensor *q, const lt_tensor *k, const lt_tensor *v,
                         const lt_tensor *segment_ids, double scale, int causal, int64_t window) {
  const char *op = "attention_forward";
  LT_TRY(check_qkv(op, q, k, v, segment_ids, scale, causal, window));
  att_ctx c;
  ctx_init(&c, q, k, scale, causal, window);
  int64_t lse_shape[3] = {c.B, c.H, c.T};
  LT_TRY(lt_prepare_out_like(op, out, q, q->dtype));
  if (lse) LT_TRY(lt_prepare_out(op, lse, 3, lse_shape, LT_F32, q->device));
  const lt_tensor *ins[4] = {q, k, v, segment_ids};
  LT_TRY(check_no_alias(op, "out", out, ins, 4));
  if (lse) LT_TRY(check_no_alias(op, "lse", lse, ins, 4));
  if (q->device != LT_DEVICE_CPU)
    return lt_attention_forward_cuda(lt_backend_for(op, q->device), out, lse, q, k, v, segment_ids, scale, causal,
                                     window);
  if (lse) {
    c.lse = lt_data_ptr(lse);
    c.lse_sb = lse->stride[0], c.lse_sh = lse->stride[1], c.lse_st = lse->stride[2];
  }
  bool f64 = q->dtype == LT_F64;
  int work = f64 ? LT_F64 : LT_F32, rc = 0;
  int64_t *segbuf = load_segments(&c, segment_ids);
  if (segment_ids && !segbuf) return lt_errorf("%s: out of memory for segment ids", op);
  if (operand_in(&c.q, q, work) || operand_in(&c.k, k, work) || operand_in(&c.v, v, work) ||
      operand_out(&c.out, out, work))
    rc = -1;
  if (rc == 0) rc = lt_attention_forward_cpu(&c, f64);
  operand *ops[4] = {&c.q, &c.k, &c.v, &c.out};
  for (int i = 0; i < 4; i++)
    if (ops[i]->t) rc = operand_finish(ops[i], rc);
  free(segbuf);
  return rc;
}

int lt_attention_backward(lt_tensor *dq, lt_tensor *dk, lt_tensor *dv, const lt_tensor *dout, const lt_tensor *q,
                          const lt_tensor *k, const lt_tensor *v, const lt_tensor *out, const lt_tensor *lse,
                          const lt_tensor *segment_ids, double scale, int causal, int64_t window) {
  const char *op = "attention_backward";
  LT_TRY(check_qkv(op, q, k, v, segment_ids, scale, causal, window));
  LT_TRY(check_like(op, "dout", dout, q));
  LT_TRY(check_like(op, "out", out, q));
  att_ctx c;
  ctx_init(&c, q, k, scale, causal, window);
  char a[LT_DESC_STR], dev[16];
  LT_TRY(lt_check_defined(op, "lse", lse));
  if (lse->ndim != 3 || lse->shape[0] != c.B || lse->shape[1] != c.H || lse->shape[2] != c.T || lse->dtype != LT_F32 ||
      lse->device != q->device)
    return lt_errorf("%s: lse is %s, expected [%lld,%lld,%lld] f32 %s (B, H, T)", op, lt_desc(a, lse), (long long)c.B,
                     (long long)c.H, (long long)c.T, lt_device_str(dev, q->device));
  LT_TRY(lt_prepare_out_like("attention_backward dq", dq, q, q->dtype));
  LT_TRY(lt_prepare_out_like("attention_backward dk", dk, k, k->dtype));
  LT_TRY(lt_prepare_out_like("attention_backward dv", dv, k, k->dtype));
  const lt_tensor *ins[7] = {q, k, v, dout, out, lse, segment_ids};
  LT_TRY(check_no_alias(op, "dq", dq, ins, 7));
  LT_TRY(check_no_alias(op, "dk", dk, ins, 7));
  LT_TRY(check_no_alias(op, "dv", dv, ins, 7));
  if (q->device != LT_DEVICE_CPU) /* check_qkv found the backend */
    return lt_attention_backward_cuda(lt_backend_for(op, q->device), dq, dk, dv, dout, q, k, v, out, lse, segment_ids,
                                      scale, causal, window);
  c.lse_in = lt_data_ptr(lse);
  c.lse_sb = lse->stride[0], c.lse_sh = lse->stride[1], c.lse_st = lse->stride[2];
  bool f64 = q->dtype == LT_F64;
  int work = f64 ? LT_F64 : LT_F32, rc = 0;
  int64_t *segbuf = load_segments(&c, segment_ids);
  c.delta = malloc((size_t)(c.B * c.H * c.T + 1) * (f64 ? 8 : 4));
  if (f64) c.lse_exact = malloc((size_t)(c.B * c.H * c.T + 1) * sizeof(double));
  if ((segment_ids && !segbuf) || !c.delta || (f64 && !c.lse_exact)) {
    free(segbuf), free(c.delta), free(c.lse_exact);
    return lt_errorf("%s: out of memory", op);
  }
  if (operand_in(&c.q, q, work) || operand_in(&c.k, k, work) || operand_in(&c.v, v, work) ||
      operand_in(&c.dout, dout, work) || operand_in(&c.out, out, work) || operand_out(&c.dq, dq, work) ||
      operand_out(&c.dk, dk, work) || operand_out(&c.dv, dv, work))
    rc = -1;
  if (rc == 0) rc = lt_attention_backward_cpu(&c, f64);
  operand *ops[8] = {&c.q, &c.k, &c.v, &c.dout, &c.out, &c.dq, &c.dk, &c.dv};
  for (int i = 0; i < 8; i++)
    if (ops[i]->t) rc = operand_finish(ops[i], rc);
  free(segbuf);
  free(c.delta);
  free(c.lse_exact);
  return rc;
}
