/* ops.h — the C API, part: ops: elementwise, reductions, matmul, softmax, the fused transformer kernels, random numbers.
 * Include lutra.h, which includes every part in order (and cmake/gen_cdef.awk follows the
 * same order into the one ffi.cdef text); the conventions are at the head of lutra.h. */
#ifndef LUTRA_OPS_H
#define LUTRA_OPS_H

/* ---- elementwise --------------------------------------------------------------- */

typedef enum lt_unary_op {
  LT_NEG = 0,
  LT_EXP,
  LT_LOG,
  LT_SQRT,
  LT_RSQRT,
  LT_TANH,
  LT_SIGMOID,
  LT_RELU,
  LT_GELU, /* tanh approximation */
  LT_SILU,
  LT_ABS,
  LT_SIN,
  LT_COS,
  LT_SQUARE,
  LT_RECIPROCAL,
  LT_ERF,
  LT_GELU_ERF, /* exact GELU: x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)) */
  LT_NUM_UNARY_OPS
} lt_unary_op;

typedef enum lt_binary_op {
  LT_ADD = 0,
  LT_SUB,
  LT_MUL,
  LT_DIV,
  LT_POW,
  LT_MAXIMUM,
  LT_MINIMUM,
  LT_EQ, /* comparisons produce LT_BOOL */
  LT_NE,
  LT_LT,
  LT_LE,
  LT_GT,
  LT_GE,
  LT_NUM_BINARY_OPS
} lt_binary_op;

const char *lt_unary_name(int op);
const char *lt_binary_name(int op);

/* out = op(a). Floating dtypes; NEG, ABS, RELU, SQUARE also for integers. */
int lt_unary(lt_tensor *out, const lt_tensor *a, int op);
/* Gradient of op at x: grad_in = grad_out * op'(x), for TANH, SIGMOID, RELU, GELU, SILU, EXP, LOG,
 * SQRT, RSQRT, SIN, COS, ABS, SQUARE, RECIPROCAL, NEG. */
int lt_unary_backward(lt_tensor *grad_in, const lt_tensor *grad_out, const lt_tensor *x, int op);
/* out = a op b, broadcasting; a and b have the same dtype. */
int lt_binary(lt_tensor *out, const lt_tensor *a, const lt_tensor *b, int op);
/* out = a op s, or s op a when reverse != 0. */
int lt_binary_scalar(lt_tensor *out, const lt_tensor *a, double s, int op, int reverse);
/* out = cond ? a : b, broadcasting all three; cond is LT_BOOL or LT_U8. */
int lt_where(lt_tensor *out, const lt_tensor *cond, const lt_tensor *a, const lt_tensor *b);
int lt_clamp(lt_tensor *out, const lt_tensor *a, double lo, double hi);

/* ---- reductions ---------------------------------------------------------------- */

typedef enum lt_reduce_op { LT_SUM = 0, LT_MEAN, LT_MAX, LT_MIN, LT_PROD, LT_NORM, LT_NUM_REDUCE_OPS } lt_reduce_op;
const char *lt_reduce_name(int op);

/* Reduce over dims[0..ndims) (ndims == 0: all dims). NORM is the L2 norm. */
int lt_reduce(lt_tensor *out, const lt_tensor *a, int op, int ndims, const int64_t *dims, int keepdim);
/* Variance with Bessel-style correction (1 = unbiased, as torch.var). */
int lt_var(lt_tensor *out, const lt_tensor *a, int ndims, const int64_t *dims, int64_t correction, int keepdim);
/* Index (LT_I64) of the max/min along dim; all_dims != 0 flattens first. */
int lt_argmax(lt_tensor *out, const lt_tensor *a, int dim, int keepdim, int all_dims);
int lt_argmin(lt_tensor *out, const lt_tensor *a, int dim, int keepdim, int all_dims);

/* ---- sort, topk, scans, triangles along a dim (host/ops/sort.c, topk.c, cumsum.c, tril.c) --- */

/* values (x's shape) and indices (I64) of x sorted along dim, ascending unless descending; NaN
 * counts as larger than every number, equal values keep their order (stable). Float and integer dtypes. */
int lt_sort(lt_tensor *values, lt_tensor *indices, const lt_tensor *x, int dim, int descending);
/* The k largest (smallest) along dim, sorted, and their indices (I64); a tie keeps the lower index. */
int lt_topk(lt_tensor *values, lt_tensor *indices, const lt_tensor *x, int64_t k, int dim, int largest);
/* grad_in (grad_out's shape with n along dim) = 0, grad_out scattered to indices along dim (I64). */
int lt_sort_backward(lt_tensor *grad_in, const lt_tensor *grad_out, const lt_tensor *indices, int dim, int64_t n);
/* out = the running sum along dim (from the end when reverse != 0); float dtypes. */
int lt_cumsum(lt_tensor *out, const lt_tensor *x, int dim, int reverse);
/* out = the running product along dim; float dtypes. */
int lt_cumprod(lt_tensor *out, const lt_tensor *x, int dim);
/* grad_in of cumprod(x, dim) for the result's gradient grad_out; exact where x has zeros. */
int lt_cumprod_backward(lt_tensor *grad_in, const lt_tensor *grad_out, const lt_tensor *x, int dim);
/* out = x on and below (tril) or above (triu) the diagonal of the last two dims, else 0;
 * diagonal 0 is the main one, > 0 above it. out may be x. */
int lt_tril(lt_tensor *out, const lt_tensor *x, int64_t diagonal);
int lt_triu(lt_tensor *out, const lt_tensor *x, int64_t diagonal);

/* ---- matmul (OpenBLAS on the CPU) --------------------------------------------- */

/* out = alpha * op(a) @ op(b) + beta * out, op = transpose of the last two dims when
 * trans_* != 0. a (..., M, K), b (..., K, N), batch dims broadcast; out (..., M, N).
 * With beta == 0 `out` may be undefined. */
int lt_matmul(lt_tensor *out, const lt_tensor *a, const lt_tensor *b, int trans_a, int trans_b, double alpha,
              double beta);
/* The linear layer: out (..., N) = act(x (..., K) @ w^T + bias), w (N, K), bias (N) of x's
 * dtype or NULL, act 0 none or 1 GELU (tanh form). On CUDA one cuBLASLt GEMM with the bias and
 * GELU in its epilogue (contiguous operands; else as on the CPU): out starts as the broadcast
 * bias and the GEMM adds into it. */
int lt_linear(lt_tensor *out, const lt_tensor *x, const lt_tensor *w, const lt_tensor *bias, int act);
/* Its parameter gradients: dw (N, K) = dy^T @ x over all rows of dy (..., N) and x (..., K);
 * dbias (N) = dy summed over rows, or NULL. One GEMM on CUDA (the bias gradient in its epilogue). */
int lt_linear_backward_params(lt_tensor *dw, lt_tensor *dbias, const lt_tensor *dy, const lt_tensor *x);

/* ---- softmax ------------------------------------------------------------------ */

int lt_softmax(lt_tensor *out, const lt_tensor *a, int dim);
int lt_log_softmax(lt_tensor *out, const lt_tensor *a, int dim);
/* grad_in from grad_out and the forward output y. */
int lt_softmax_backward(lt_tensor *grad_in, const lt_tensor *grad_out, const lt_tensor *y, int dim);
int lt_log_softmax_backward(lt_tensor *grad_in, const lt_tensor *grad_out, const lt_tensor *y, int dim);

/* ---- fused transformer kernels --------------------------------------------------
 * x is (..., C) and N = numel / C rows. Saved statistics are f32 (N) when allocated
 * by the op; pass them already allocated as f64 to keep f64 precision (gradient
 * checks). weight and bias may be NULL; so may the saved statistics when not needed.
 * Backward overwrites dx, dweight, dbias (those not NULL).                          */

int lt_layer_norm_forward(lt_tensor *out, lt_tensor *mean, lt_tensor *rstd, const lt_tensor *x,
                         const lt_tensor *weight, const lt_tensor *bias, double eps);
int lt_layer_norm_backward(lt_tensor *dx, lt_tensor *dweight, lt_tensor *dbias, const lt_tensor *dout,
                          const lt_tensor *x, const lt_tensor *weight, const lt_tensor *mean,
                          const lt_tensor *rstd);
int lt_rms_norm_forward(lt_tensor *out, lt_tensor *rstd, const lt_tensor *x, const lt_tensor *weight, double eps);
int lt_rms_norm_backward(lt_tensor *dx, lt_tensor *dweight, const lt_tensor *dout, const lt_tensor *x,
                        const lt_tensor *weight, const lt_tensor *rstd);
/* The residual add of a pre-norm block fused with the next norm. res_out = x + residual
 * (required; x's shape and dtype, residual too; 16-bit sums rounded once, as lt_binary),
 * then out, mean, rstd exactly as the plain forward of res_out. res_out may be x or
 * residual (in place), not out. Backward: x is the forward's res_out, and
 * dx = the plain backward's dx + dres, dres (x's shape and dtype) the gradient reaching
 * res_out from its other uses, or NULL; dx may be dout or dres (in place).            */
int lt_add_layer_norm_forward(lt_tensor *res_out, lt_tensor *out, lt_tensor *mean, lt_tensor *rstd, const lt_tensor *x,
                             const lt_tensor *residual, const lt_tensor *weight, const lt_tensor *bias, double eps);
int lt_add_rms_norm_forward(lt_tensor *res_out, lt_tensor *out, lt_tensor *rstd, const lt_tensor *x,
                           const lt_tensor *residual, const lt_tensor *weight, double eps);
int lt_layer_norm_backward_add(lt_tensor *dx, lt_tensor *dweight, lt_tensor *dbias, const lt_tensor *dout,
                              const lt_tensor *dres, const lt_tensor *x, const lt_tensor *weight,
                              const lt_tensor *mean, const lt_tensor *rstd);
int lt_rms_norm_backward_add(lt_tensor *dx, lt_tensor *dweight, const lt_tensor *dout, const lt_tensor *dres,
                            const lt_tensor *x, const lt_tensor *weight, const lt_tensor *rstd);

/* logits (N, V), targets (N) I32/I64. losses (N) f32: -log softmax(logits)[target],
 * 0 where target == ignore_index; lse (N) f32 saved for backward.
 * dlogits = dlosses[i] * (softmax(logits[i]) - onehot(target[i])), 0 for ignored rows. */
int lt_cross_entropy_forward(lt_tensor *losses, lt_tensor *lse, const lt_tensor *logits, const lt_tensor *targets,
                             int64_t ignore_index);
int lt_cross_entropy_backward(lt_tensor *dlogits, const lt_tensor *dlosses, const lt_tensor *logits,
                              const lt_tensor *targets, const lt_tensor *lse, int64_t ignore_index);

/* weight (V, C), ids (...) I32/I64 -> out (..., C). Backward zeroes dweight (V, C)
 * then scatter-adds dout rows into it. */
int lt_embedding_forward(lt_tensor *out, const lt_tensor *weight, const lt_tensor *ids);
int lt_embedding_backward(lt_tensor *dweight, const lt_tensor *dout, const lt_tensor *ids);

/* Gather and scatter along dim (negative counts from the end), as PyTorch: index i32/i64 with
 * x's ndim, no larger than x off dim (and than src everywhere), values in [0, x.shape[dim]).
 * gather: out (index's shape) = x at index along dim. scatter / scatter_add: out (x's shape) =
 * x with src written / added at index along dim (duplicates: the last write; sums in index order). */
int lt_gather(lt_tensor *out, const lt_tensor *x, int dim, const lt_tensor *index);
int lt_scatter(lt_tensor *out, const lt_tensor *x, int dim, const lt_tensor *index, const lt_tensor *src);
int lt_scatter_add(lt_tensor *out, const lt_tensor *x, int dim, const lt_tensor *index, const lt_tensor *src);
/* scatter with reduce "sum" (scatter_add), "amax" or "amin" (a NaN on either side is kept) */
int lt_scatter_reduce(lt_tensor *out, const lt_tensor *x, int dim, const lt_tensor *index, const lt_tensor *src,
                      const char *reduce);
/* index 1-d (n) i32/i64 in [0, x.shape[dim]). index_select: out = x's slices index[j] along dim
 * (n at dim). index_add / index_copy: out (x's shape) = x with src (x's shape, n at dim) added /
 * written at slices index[j] (sums in index order). */
int lt_index_select(lt_tensor *out, const lt_tensor *x, int dim, const lt_tensor *index);
int lt_index_add(lt_tensor *out, const lt_tensor *x, int dim, const lt_tensor *index, const lt_tensor *src);
int lt_index_copy(lt_tensor *out, const lt_tensor *x, int dim, const lt_tensor *index, const lt_tensor *src);

/* Rotary embedding, "rotate half" convention (as Hugging Face Llama): x (B, T, H, D), D even.
 * positions (T) or (B, T) I32/I64, or NULL for 0..T-1. inverse != 0 rotates by -angle,
 * which is the backward. */
int lt_rope(lt_tensor *out, const lt_tensor *x, const lt_tensor *positions, double theta, int inverse);
/* Rotary embedding with the caller's frequencies: inv_freq (D / 2) f64 on the CPU (for x on any
 * device), angle = position * inv_freq[i]; cos and sin are multiplied by scale (> 0; 1 for a plain
 * rotation), Hugging Face's attention_scaling (yarn, longrope). lt_rope(theta) is the case
 * inv_freq[i] = theta^(-2i/D), scale 1. inverse != 0 is the backward: scale times the inverse rotation. */
int lt_rope_freq(lt_tensor *out, const lt_tensor *x, const lt_tensor *positions, const lt_tensor *inv_freq,
                 double scale, int inverse);

/* Scaled dot-product attention. q (B, T, H, D), k and v (B, S, Hkv, D), H % Hkv == 0
 * (GQA: head h reads kv head h / (H / Hkv)). out (B, T, H, D); lse (B, H, T) f32 saved.
 * causal: query t sees keys s <= t + (S - T). segment_ids (B, T) I32/I64 or NULL:
 * with T == S, a query only sees keys of its own segment (packed documents).
 * window: 0 for none; W > 0 (causal only) is a sliding window: query t, at absolute position
 * t + (S - T), sees key s only when (t + S - T) - s < W, so W keys counting its own (Hugging
 * Face's sliding_window: kv_idx > q_idx - sliding_window, on top of the causal mask). */
int lt_attention_forward(lt_tensor *out, lt_tensor *lse, const lt_tensor *q, const lt_tensor *k,
                         const lt_tensor *v, const lt_tensor *segment_ids, double scale, int causal, int64_t window);
int lt_attention_backward(lt_tensor *dq, lt_tensor *dk, lt_tensor *dv, const lt_tensor *dout, const lt_tensor *q,
                          const lt_tensor *k, const lt_tensor *v, const lt_tensor *out, const lt_tensor *lse,
                          const lt_tensor *segment_ids, double scale, int causal, int64_t window);

/* One AdamW step in one pass, decoupled weight decay, bias correction at `step` (>= 1):
 * param -= lr * (mhat / (sqrt(vhat) + eps) + weight_decay * param). m and v are f32. */
int lt_adamw_step(lt_tensor *param, const lt_tensor *grad, lt_tensor *m, lt_tensor *v, double lr, double beta1,
                  double beta2, double eps, double weight_decay, int64_t step);

/* One Lion step in one pass (lucidrains' lion-pytorch order): param *= 1 - lr * weight_decay;
 * param -= lr * sign(beta1 * m + (1 - beta1) * grad); m = beta2 * m + (1 - beta2) * grad.
 * m is f32 (f64 for an f64 param); a bf16/f16 param takes a grad of its dtype or f32. */
int lt_lion_step(lt_tensor *param, const lt_tensor *grad, lt_tensor *m, double lr, double beta1, double beta2,
                 double weight_decay);

/* One Adafactor step (transformers.optimization.Adafactor's arithmetic; host/ops/adafactor.c).
 * A param of 2+ dims [..., R, C] is factored: row has its numel / C elements, col numel / R, v is
 * NULL; a 1-d param keeps v (numel elements), row and col NULL. exp_avg: the first moment, NULL
 * without beta1. rel_lr: the group lr or the relative step; beta2t = 1 - step^decay_rate. param,
 * grad and state f32 or f64, on the CPU or CUDA. */
int lt_adafactor_step(lt_tensor *param, const lt_tensor *grad, lt_tensor *exp_avg, lt_tensor *row, lt_tensor *col,
                      lt_tensor *v, double rel_lr, int scale_parameter, double eps1, double eps2,
                      double clip_threshold, double beta2t, double beta1, double weight_decay);

/* One LAMB step (host/ops/lamb.c): Adam moments with bias correction at `step` (>= 1), r =
 * mhat / (sqrt(vhat) + eps) + weight_decay * param, param -= lr * ||param|| / ||r|| * r (trust
 * ratio 1 when either norm is 0). param, grad, m, v f32 or f64, on the CPU or CUDA. */
int lt_lamb_step(lt_tensor *param, const lt_tensor *grad, lt_tensor *m, lt_tensor *v, double lr, double beta1,
                 double beta2, double eps, double weight_decay, int64_t step);

/* lt_adafactor_step over the n parameters of one param group in one call (host/ops/adafactor.c),
 * with one set of scalars: each tensor gets exactly what lt_adafactor_step gives it (its own
 * parameter scale and clipping); on CUDA one set of launches for all of them. exp_avgs may be NULL
 * (no beta1); rows and cols hold each factored tensor's row and column moments (NULL entries
 * for a 1-d one), vs each 1-d tensor's second moment (NULL entries for a factored one); any of
 * the three arrays may be NULL when no tensor uses it. */
int lt_adafactor_step_multi(int64_t n, lt_tensor *const *params, lt_tensor *const *grads, lt_tensor *const *exp_avgs,
                            lt_tensor *const *rows, lt_tensor *const *cols, lt_tensor *const *vs, double rel_lr,
                            int scale_parameter, double eps1, double eps2, double clip_threshold, double beta2t,
                            double beta1, double weight_decay);

/* lt_lamb_step over the n parameters of one param group in one call (host/ops/lamb.c): each tensor
 * gets exactly what lt_lamb_step gives it (its own trust ratio); on CUDA one set of launches for all
 * of them (moments, the norms' runs, the trust ratios, the step). All tensors on one device, each
 * with its grad, m and v of its dtype (f32 or f64). */
int lt_lamb_step_multi(int64_t n, lt_tensor *const *params, lt_tensor *const *grads, lt_tensor *const *m,
                       lt_tensor *const *v, double lr, double beta1, double beta2, double eps, double weight_decay,
                       int64_t step);

/* lt_adamw_step over the n parameters of one param group in one call (host/ops/adamw.c):
 * one OpenMP loop over chunks of all of them on the CPU, one kernel launch on CUDA; each tensor
 * gets exactly what lt_adamw_step gives it. All tensors on one device. masters may be NULL, and so
 * may masters[i]: params[i] is then stepped itself. masters[i] defined (master weights): an f32
 * tensor of params[i]'s numel, params[i] bf16/f16; the step updates the master in f32 (grads[i]
 * f32 or the param's dtype) and params[i] receives the master rounded to its dtype. */
int lt_adamw_step_multi(int64_t n, lt_tensor *const *params, lt_tensor *const *grads, lt_tensor *const *m,
                        lt_tensor *const *v, lt_tensor *const *masters, double lr, double beta1, double beta2,
                        double eps, double weight_decay, int64_t step);
/* The global gradient norm's square without a host sync: out (one element, f32 or f64, on the
 * tensors' device; undefined: allocated as a 0-dim f32 there, on the CPU when n == 0) = the sum
 * over the tensors of the sum of their squared elements. Each chunk of each tensor is summed in
 * f64 (any dtype), the chunk sums are added in a fixed order: deterministic, no atomics.
 * Tensors are f32, f64, bf16 or f16, any shape or layout, all on one device. */
int lt_multi_tensor_sumsq(lt_tensor *out, int64_t n, lt_tensor *const *tensors);
/* tensors[i] *= s in place, s the value of `scale` (one element, f32 or f64, on their device),
 * each element as lt_binary_scalar(t, t, s, LT_MUL, 0) computes it. */
int lt_multi_tensor_scale(int64_t n, lt_tensor *const *tensors, const lt_tensor *scale);
/* Gradient clipping's coefficient from lt_multi_tensor_sumsq's result, on its device:
 * coef (one element, f32 or f64; undefined: allocated like sumsq) = max_norm / (sqrt(sumsq) + 1e-6)
 * (torch's rule) when that is below 1 and the norm is finite, else 1 (a nan or inf norm leaves
 * the gradients alone). */
int lt_clip_coef(lt_tensor *coef, const lt_tensor *sumsq, double max_norm);

/* ---- random numbers: counter-based (Philox4x32-10) ------------------------------
 * Element i (in row-major order of out) draws from counter (offset + i) under key
 * seed, so results depend only on (seed, offset, i): the same on CPU and GPU, and
 * a generator resumes exactly from (seed, offset). Callers advance offset by numel. */

int lt_rand_uniform(lt_tensor *out, uint64_t seed, uint64_t offset, double lo, double hi);
int lt_rand_normal(lt_tensor *out, uint64_t seed, uint64_t offset, double mean, double std);
int lt_rand_int(lt_tensor *out, uint64_t seed, uint64_t offset, int64_t lo, int64_t hi); /* [lo, hi) */
int lt_rand_bernoulli(lt_tensor *out, uint64_t seed, uint64_t offset, double p);
/* The raw generator, for tests: 4 words of Philox4x32-10 at (key, counter). */
int lt_philox4x32(uint64_t key, uint64_t counter, uint32_t *out4);

#endif
