/* lutra.h — the C API: the only contract between the C core and Lua.
 *
 * Conventions (see GUIDE.md):
 * - Plain declarations only, so that ffi.cdef can parse this file once the
 *   preprocessor lines are stripped (lt_api_cdef() returns exactly that text).
 * - Every entry point returns int status: 0 ok, -1 error. The message
 *   (lt_last_error(), thread-local) names the op, shapes, dtypes and devices.
 *   Nothing aborts on user error. Exceptions: lt_tensor_new() returns a
 *   pointer (NULL on out-of-memory), and the few pure queries named *_name,
 *   *_size, lt_is_* and lt_last_error return their value directly.
 * - Ops write into an output tensor the caller passes. If `out` is undefined
 *   (no storage, as lt_tensor_new() makes it) the op allocates it with the
 *   result's shape, dtype and device. If it is defined it must already have
 *   exactly that shape, dtype and device and is written in place (it may be a
 *   non-contiguous view); passing an input as `out` gives the in-place op.
 * - Tensors are refcounted (lt_retain/lt_release). A view shares the storage
 *   of its source: storages are refcounted too, with a byte offset.
 * - Shapes are int64_t arrays; dims may be negative (counted from the end).
 */
#ifndef LUTRA_H
#define LUTRA_H
#include <stddef.h>
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif

/* ---- types ---------------------------------------------------------------- */

enum { LT_MAX_DIMS = 8 };

typedef enum lt_dtype {
  LT_F32 = 0,
  LT_F64 = 1,
  LT_BF16 = 2,
  LT_F16 = 3,
  LT_I32 = 4,
  LT_I64 = 5,
  LT_U8 = 6,
  LT_BOOL = 7,
  LT_NUM_DTYPES = 8
} lt_dtype;

/* Devices are ints: LT_DEVICE_CPU, or k >= 0 for CUDA device k. */
enum { LT_DEVICE_CPU = -1 };

typedef struct lt_storage {
  void *data;
  int64_t nbytes;
  int32_t refcount;
  int32_t device;
} lt_storage;

typedef struct lt_tensor {
  lt_storage *storage; /* NULL: undefined (an `out` to be allocated) or freed */
  int64_t offset;      /* bytes from storage->data to element [0,...,0] */
  int64_t shape[8];    /* LT_MAX_DIMS */
  int64_t stride[8];   /* in elements, may be 0 (broadcast) */
  int32_t ndim;        /* 0 is a scalar holding one element */
  int32_t dtype;       /* lt_dtype */
  int32_t device;      /* LT_DEVICE_CPU or a CUDA ordinal */
  int32_t refcount;
  int64_t tag;         /* free for the Lua layer (autograd bookkeeping); views start at 0 */
} lt_tensor;

typedef struct lt_memory_stats {
  int64_t allocated;      /* bytes held by live storages */
  int64_t peak;           /* high-water mark of allocated since last reset */
  int64_t reserved;       /* bytes held from the system (>= allocated with caching) */
  int64_t num_allocs;     /* storages allocated so far */
  int64_t num_frees;      /* storages freed so far */
  int64_t since_collect;  /* bytes allocated since lt_memory_collected() */
} lt_memory_stats;

/* ---- runtime, errors, build ------------------------------------------------- */

const char *lt_last_error(void);
int lt_set_error(const char *message); /* lets callers (Lua) set a message; returns -1 */
void lt_clear_error(void);
const char *lt_version(void);
const char *lt_api_cdef(void);   /* this header without preprocessor lines */
const char *lt_build_info(void); /* multi-line: compiler, BLAS, OpenMP, CUDA, NCCL, MPI */
int lt_get_num_threads(void);
int lt_set_num_threads(int n);

const char *lt_dtype_name(int dtype);  /* "f32", ... or "?" */
int lt_dtype_size(int dtype);          /* bytes per element, 0 if unknown */
int lt_dtype_from_name(const char *name, int *dtype);

/* CUDA availability never fails: with no GPU, no driver or a CPU-only build the
 * count is 0 and lt_cuda_status() says why. lt_cuda_availability() tells the cases apart
 * for whoever must decide between "nothing to run on" and "something is broken" (lutra
 * selftest: skipped or failed): LT_CUDA_READY (count > 0), LT_CUDA_NOT_BUILT, LT_CUDA_NO_DEVICE
 * (no GPU, or no driver at all), LT_CUDA_BROKEN (a driver that is too old, fails to
 * initialise, or any other error from the runtime). */
enum { LT_CUDA_READY = 0, LT_CUDA_NOT_BUILT = 1, LT_CUDA_NO_DEVICE = 2, LT_CUDA_BROKEN = 3 };
int lt_cuda_device_count(void);
const char *lt_cuda_status(void);
int lt_cuda_availability(void);
/* TF32 tensor cores for f32 matmuls on CUDA (off by default, as PyTorch); no effect on the CPU. */
int lt_cuda_set_tf32(int enabled);
int lt_cuda_get_tf32(void);
int lt_cuda_synchronize(int device);

/* device: LT_DEVICE_CPU or a CUDA ordinal */
int lt_memory_get_stats(int device, lt_memory_stats *stats);
int lt_memory_reset_peak(int device);
int lt_memory_collected(int device); /* resets since_collect (after a Lua GC) */
int lt_memory_empty_cache(int device); /* returns cached free blocks to the system */
/* Direct pointer to the CPU counters, read by Lua on the hot path. */
const lt_memory_stats *lt_memory_cpu_counters(void);

/* ---- tensor lifecycle ------------------------------------------------------- */

lt_tensor *lt_tensor_new(void); /* undefined tensor, refcount 1 */
int lt_retain(lt_tensor *t);
int lt_release(lt_tensor *t);     /* frees at refcount 0 (NULL is ok) */
int lt_free_storage(lt_tensor *t); /* drop t's storage now: t becomes undefined */
int lt_is_defined(const lt_tensor *t);
int lt_is_contiguous(const lt_tensor *t);
int64_t lt_numel(const lt_tensor *t);
void *lt_data_ptr(const lt_tensor *t); /* address of element [0,...,0] */

/* Allocates fresh storage for `out` (dropping what it had). */
int lt_empty(lt_tensor *out, int ndim, const int64_t *shape, int dtype, int device);
/* Makes `out` share src's storage and geometry. */
int lt_set(lt_tensor *out, const lt_tensor *src);

/* ---- element access (CPU tensors; values as double) -------------------------- */

int lt_item(const lt_tensor *t, double *value); /* t must hold one element */
int lt_get_at(const lt_tensor *t, const int64_t *index, double *value);
int lt_set_at(lt_tensor *t, const int64_t *index, double value);
/* Contiguous host buffer <-> tensor of the same numel, converting dtypes. */
int lt_copy_from_buffer(lt_tensor *dst, const void *src, int src_dtype, int64_t count);
int lt_copy_to_buffer(const lt_tensor *src, void *dst, int dst_dtype, int64_t count);

/* ---- views (no copy: out shares src's storage) ------------------------------- */

int lt_view(lt_tensor *out, const lt_tensor *src, int ndim, const int64_t *shape); /* one dim may be -1 */
int lt_reshape(lt_tensor *out, const lt_tensor *src, int ndim, const int64_t *shape); /* copies if it must */
int lt_transpose(lt_tensor *out, const lt_tensor *src, int dim0, int dim1);
int lt_permute(lt_tensor *out, const lt_tensor *src, int ndim, const int64_t *dims);
int lt_narrow(lt_tensor *out, const lt_tensor *src, int dim, int64_t start, int64_t length);
int lt_slice(lt_tensor *out, const lt_tensor *src, int dim, int64_t start, int64_t stop, int64_t step);
int lt_select(lt_tensor *out, const lt_tensor *src, int dim, int64_t index);
int lt_expand(lt_tensor *out, const lt_tensor *src, int ndim, const int64_t *shape); /* -1 keeps a dim */
int lt_unsqueeze(lt_tensor *out, const lt_tensor *src, int dim);
int lt_squeeze(lt_tensor *out, const lt_tensor *src, int dim); /* dim must have size 1 */
int lt_squeeze_all(lt_tensor *out, const lt_tensor *src);
int lt_contiguous(lt_tensor *out, const lt_tensor *src); /* a view if src already is */
int lt_broadcast_shape(int ndim_a, const int64_t *shape_a, int ndim_b, const int64_t *shape_b, int *ndim_out,
                       int64_t *shape_out);

/* ---- copy and creation ------------------------------------------------------- */

/* dst = src converted to dst's dtype and device; src broadcasts to dst's shape. */
int lt_copy(lt_tensor *dst, const lt_tensor *src);
int lt_fill(lt_tensor *out, double value);
int lt_arange(lt_tensor *out, double start, double end, double step, int dtype, int device);
int lt_linspace(lt_tensor *out, double start, double end, int64_t steps, int dtype, int device);

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

int lt_layernorm_forward(lt_tensor *out, lt_tensor *mean, lt_tensor *rstd, const lt_tensor *x,
                         const lt_tensor *weight, const lt_tensor *bias, double eps);
int lt_layernorm_backward(lt_tensor *dx, lt_tensor *dweight, lt_tensor *dbias, const lt_tensor *dout,
                          const lt_tensor *x, const lt_tensor *weight, const lt_tensor *mean,
                          const lt_tensor *rstd);
int lt_rmsnorm_forward(lt_tensor *out, lt_tensor *rstd, const lt_tensor *x, const lt_tensor *weight, double eps);
int lt_rmsnorm_backward(lt_tensor *dx, lt_tensor *dweight, const lt_tensor *dout, const lt_tensor *x,
                        const lt_tensor *weight, const lt_tensor *rstd);
/* The residual add of a pre-norm block fused with the next norm. res_out = x + residual
 * (required; x's shape and dtype, residual too; 16-bit sums rounded once, as lt_binary),
 * then out, mean, rstd exactly as the plain forward of res_out. res_out may be x or
 * residual (in place), not out. Backward: x is the forward's res_out, and
 * dx = the plain backward's dx + dres, dres (x's shape and dtype) the gradient reaching
 * res_out from its other uses, or NULL; dx may be dout or dres (in place).            */
int lt_add_layernorm_forward(lt_tensor *res_out, lt_tensor *out, lt_tensor *mean, lt_tensor *rstd, const lt_tensor *x,
                             const lt_tensor *residual, const lt_tensor *weight, const lt_tensor *bias, double eps);
int lt_add_rmsnorm_forward(lt_tensor *res_out, lt_tensor *out, lt_tensor *rstd, const lt_tensor *x,
                           const lt_tensor *residual, const lt_tensor *weight, double eps);
int lt_layernorm_backward_add(lt_tensor *dx, lt_tensor *dweight, lt_tensor *dbias, const lt_tensor *dout,
                              const lt_tensor *dres, const lt_tensor *x, const lt_tensor *weight,
                              const lt_tensor *mean, const lt_tensor *rstd);
int lt_rmsnorm_backward_add(lt_tensor *dx, lt_tensor *dweight, const lt_tensor *dout, const lt_tensor *dres,
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

/* Rotary embedding, "rotate half" convention (as Hugging Face Llama): x (B, T, H, D), D even.
 * positions (T) or (B, T) I32/I64, or NULL for 0..T-1. inverse != 0 rotates by -angle,
 * which is the backward. */
int lt_rope(lt_tensor *out, const lt_tensor *x, const lt_tensor *positions, double theta, int inverse);

/* Scaled dot-product attention. q (B, T, H, D), k and v (B, S, Hkv, D), H % Hkv == 0
 * (GQA: head h reads kv head h / (H / Hkv)). out (B, T, H, D); lse (B, H, T) f32 saved.
 * causal: query t sees keys s <= t + (S - T). segment_ids (B, T) I32/I64 or NULL:
 * with T == S, a query only sees keys of its own segment (packed documents). */
int lt_attention_forward(lt_tensor *out, lt_tensor *lse, const lt_tensor *q, const lt_tensor *k,
                         const lt_tensor *v, const lt_tensor *segment_ids, double scale, int causal);
int lt_attention_backward(lt_tensor *dq, lt_tensor *dk, lt_tensor *dv, const lt_tensor *dout, const lt_tensor *q,
                          const lt_tensor *k, const lt_tensor *v, const lt_tensor *out, const lt_tensor *lse,
                          const lt_tensor *segment_ids, double scale, int causal);

/* One AdamW step in one pass, decoupled weight decay, bias correction at `step` (>= 1):
 * param -= lr * (mhat / (sqrt(vhat) + eps) + weight_decay * param). m and v are f32. */
int lt_adamw_step(lt_tensor *param, const lt_tensor *grad, lt_tensor *m, lt_tensor *v, double lr, double beta1,
                  double beta2, double eps, double weight_decay, int64_t step);

/* One Lion step in one pass (lucidrains' lion-pytorch order): param *= 1 - lr * weight_decay;
 * param -= lr * sign(beta1 * m + (1 - beta1) * grad); m = beta2 * m + (1 - beta2) * grad.
 * m is f32 (f64 for an f64 param); a bf16/f16 param takes a grad of its dtype or f32. */
int lt_lion_step(lt_tensor *param, const lt_tensor *grad, lt_tensor *m, double lr, double beta1, double beta2,
                 double weight_decay);

/* lt_adamw_step over the n parameters of one param group in one call (host/ops_adamw.c):
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

/* ---- tokenizer -------------------------------------------------------------------
 * An opaque handle: byte-level BPE (as GPT-2's) or char-level. Token ids are int32,
 * 0 .. vocab_size-1. Decoding any encoding gives back the text byte for byte (any bytes:
 * NUL, invalid UTF-8). Special tokens are matched in the text before pre-tokenization
 * when allow_special != 0 and decode to their text; merges never produce them. A handle
 * is not safe for concurrent calls (encode keeps a cache of words).
 * special_tokens: num_special NUL-terminated UTF-8 strings (may be NULL when 0). */
typedef struct lt_tokenizer lt_tokenizer;

/* BPE trained on text (len bytes) to vocab_size tokens in all: the 256 bytes, the merges,
 * then the special tokens. Fewer when the corpus runs out of pairs. Deterministic: the
 * most frequent pair merges first, ties to the smallest (left id, right id). */
int lt_tokenizer_train_bpe(lt_tokenizer **out, const char *text, int64_t len, int32_t vocab_size,
                           const char *const *special_tokens, int32_t num_special);
int lt_tokenizer_train_bpe_file(lt_tokenizer **out, const char *path, int32_t vocab_size,
                                const char *const *special_tokens, int32_t num_special);
/* Char-level: one token per distinct code point of text in code point order (as Python's
 * sorted(set(text))), then one per byte that is not valid UTF-8, then the special tokens. */
int lt_tokenizer_new_char(lt_tokenizer **out, const char *text, int64_t len, const char *const *special_tokens,
                          int32_t num_special);
/* Hugging Face tokenizer.json (a BPE model with a ByteLevel pre-tokenizer and decoder,
 * as GPT-2's), or lutra's own JSON for char tokenizers. Post-processors (BOS/EOS
 * templates), truncation and padding are ignored; anything else unsupported is an error
 * naming the key. */
int lt_tokenizer_load(lt_tokenizer **out, const char *path);
int lt_tokenizer_load_json(lt_tokenizer **out, const char *json, int64_t len);
int lt_tokenizer_save(const lt_tokenizer *tok, const char *path);
int lt_tokenizer_free(lt_tokenizer *tok); /* NULL is ok */

int lt_tokenizer_vocab_size(const lt_tokenizer *tok);
const char *lt_tokenizer_kind_name(const lt_tokenizer *tok); /* "bpe" or "char" */
/* Writes the ids of text into ids[0 .. capacity) and their number to *count. Fails when
 * capacity is too small (*count still gets the number needed); capacity >= 2 * len + 1
 * always suffices (len + 1 unless the tokenizer adds prefix spaces). Errors on a character
 * (char) or byte (bpe, no unk token) not in the vocab. */
int lt_tokenizer_encode(lt_tokenizer *tok, const char *text, int64_t len, int allow_special, int32_t *ids,
                        int64_t capacity, int64_t *count);
/* The same into out: a 1-d i32 tensor of the ids (the `out` convention applies). */
int lt_tokenizer_encode_tensor(lt_tensor *out, lt_tokenizer *tok, const char *text, int64_t len, int allow_special);
/* Writes the bytes of ids into buf[0 .. capacity) and their number to *len. buf may be
 * NULL with capacity 0 to get the length only; otherwise a short buf is an error. */
int lt_tokenizer_decode(const lt_tokenizer *tok, const int32_t *ids, int64_t n, char *buf, int64_t capacity,
                        int64_t *len);
/* The bytes of one token (valid while tok lives and no token is added). */
int lt_tokenizer_token(const lt_tokenizer *tok, int32_t id, const char **bytes, int64_t *len);
/* The id of the token with exactly these bytes (special tokens included), -1 if none. */
int lt_tokenizer_token_id(const lt_tokenizer *tok, const char *bytes, int64_t len, int32_t *id);
int lt_tokenizer_is_special(const lt_tokenizer *tok, int32_t id); /* 1 or 0 (also for bad ids) */
/* Adds a special token (or returns the id of the one with this text). */
int lt_tokenizer_add_special(lt_tokenizer *tok, const char *text, int32_t *id);
int lt_tokenizer_num_merges(const lt_tokenizer *tok);
/* Merge `rank`: tokens a and b join into token out. */
int lt_tokenizer_merge(const lt_tokenizer *tok, int32_t rank, int32_t *a, int32_t *b, int32_t *out);
/* A hash of everything that decides the ids (tokens, merges, added tokens, options). */
int lt_tokenizer_fingerprint(const lt_tokenizer *tok, uint64_t *out);

/* ---- token files ---------------------------------------------------------------
 * A corpus tokenized once (host/tokfile.c): a 128-byte little-endian header, then
 * `count` tokens of `token_bytes` each (u16 when vocab_size <= 65536, else u32):
 *   0 "LUTRATOK"  8 u32 version (1)  12 u32 token_bytes  16 u64 count  24 u64 vocab_size
 *   32 u64 tokenizer_hash  40 u64 tokens_hash (FNV-1a 64 of the token bytes)
 *   48 u64 source_bytes  56 u64 source_hash (FNV-1a 64 of the text)  64 i64 source_mtime_ns
 *   72..128 zeros. The file size is exactly 128 + count * token_bytes.
 * Writing streams (open, append any number of times, finish) into a temporary file that
 * finish renames into place, so a reader never sees a partial file. Reading maps the
 * file (read-only, MAP_SHARED) after validating the header; errors name the file. */

typedef struct lt_tokfile_info {
  uint32_t version;
  uint32_t token_bytes;
  int64_t count;
  int64_t vocab_size;
  uint64_t tokenizer_hash;
  uint64_t tokens_hash;
  int64_t source_bytes;
  uint64_t source_hash;
  int64_t source_mtime_ns;
} lt_tokfile_info;

typedef struct lt_tokwriter lt_tokwriter; /* opaque */
typedef struct lt_tokfile lt_tokfile;     /* opaque: a mapped token file */

int lt_tokwriter_open(lt_tokwriter **out, const char *path, int64_t vocab_size, uint64_t tokenizer_hash);
/* ids: count values of ids_dtype (LT_I32 or LT_I64), each in [0, vocab_size). */
int lt_tokwriter_append(lt_tokwriter *w, const void *ids, int ids_dtype, int64_t count);
/* Both end the writer and free it: finish writes the header and renames the file into
 * place; abort removes the temporary file (NULL is ok). */
int lt_tokwriter_finish(lt_tokwriter *w, int64_t source_bytes, uint64_t source_hash, int64_t source_mtime_ns);
int lt_tokwriter_abort(lt_tokwriter *w);

int lt_tokfile_open(lt_tokfile **out, const char *path);
int lt_tokfile_close(lt_tokfile *f); /* NULL is ok */
int lt_tokfile_get_info(const lt_tokfile *f, lt_tokfile_info *info);
/* Reads and validates the header of the file at path, as open does, without mapping it. */
int lt_tokfile_read_header(const char *path, lt_tokfile_info *info);
/* Recomputes the tokens checksum: an error names the file when it differs. */
int lt_tokfile_verify(const lt_tokfile *f);
/* out (count) = tokens [start, start + count): I64 or I32 (undefined: allocated I64). */
int lt_tokfile_tokens(lt_tensor *out, const lt_tokfile *f, int64_t start, int64_t count);
/* Row b of a batch is the window of T + 1 tokens at starts[b], with 0 <= starts[b] and
 * starts[b] + T + 1 <= count. With y: x (B, T) = tokens[s, s + T) and y (B, T) =
 * tokens[s + 1, s + T + 1) (the next-token targets); with y NULL: x (B, T + 1) holds the
 * whole window. x and y are I64 or I32 (undefined: allocated I64). */
int lt_tokfile_batch(lt_tensor *x, lt_tensor *y, const lt_tokfile *f, const int64_t *starts, int64_t batch,
                     int64_t seq_len);

/* FNV-1a 64 of nbytes at data, continuing from *hash (start from 0xcbf29ce484222325). */
int lt_hash64(const void *data, int64_t nbytes, uint64_t *hash);
/* Size in bytes and modification time (ns since the epoch) of the file at path. */
int lt_file_stat(const char *path, int64_t *size, int64_t *mtime_ns);

/* ---- training runtime: wall clock, Ctrl-C as a flag (host/interrupt.c) ---------- */

/* Seconds on a monotonic clock (for rates and ETAs). */
double lt_wall_time(void);
/* While armed, SIGINT only sets a flag that lt_interrupt_pending reads (clear = 1 also
 * resets it), so a loop can stop between steps. A second SIGINT while the flag is set
 * restores the handler that was in force before arming and re-raises the signal to it.
 * lt_interrupt_disarm restores that handler too. */
int lt_interrupt_arm(void);
int lt_interrupt_pending(int clear);
int lt_interrupt_disarm(void);

/* ---- distributed: process groups and collectives (host/dist_*.c) ----------------
 * Ranks are processes started by mpirun or srun (OpenMPI): lt_comm_init calls
 * MPI_Init_thread there. Without a launcher (or in a build without MPI) the process
 * is a singleton: a world of one rank, no MPI at all; collectives are local copies.
 * A group is an MPI communicator for CPU tensors (and an NCCL communicator, made at
 * its first CUDA collective, for CUDA tensors). Group ranks are 0-based indices in
 * the group. Tensors must be contiguous and of one dtype across the group. Over MPI,
 * all_reduce and broadcast take any count (in pieces of at most 2^31-1 elements); the
 * other calls take at most 2^31-1 elements per rank's piece (MPI's int counts).
 * Passing req == NULL waits for the result; else *req receives a request that
 * lt_comm_wait (or lt_comm_test until done) completes and frees; the tensors are
 * retained until then. Every call is recorded in a per-rank flight recorder, and a
 * watchdog thread ends the process (status 3) with a report on stderr when a wait
 * lasts longer than the timeout (env LUTRA_COMM_TIMEOUT, default 600 s). */

typedef struct lt_group lt_group;               /* opaque, lives until exit */
typedef struct lt_comm_request lt_comm_request; /* opaque async handle */

typedef enum lt_comm_op { LT_COMM_SUM = 0, LT_COMM_AVG, LT_COMM_MAX, LT_COMM_MIN, LT_NUM_COMM_OPS } lt_comm_op;
typedef enum lt_comm_state { LT_COMM_POSTED = 0, LT_COMM_WAITING, LT_COMM_DONE, LT_COMM_FAILED } lt_comm_state;
enum { LT_COMM_SEND = 0, LT_COMM_RECV = 1 }; /* kinds in lt_comm_p2p */

/* One flight-recorder entry. start/end: seconds on a coarse monotonic clock (ms resolution;
 * end 0 while pending). */
typedef struct lt_comm_record {
  int64_t seq;   /* per group, from 1 */
  int64_t count; /* elements */
  double start;
  double end;
  int32_t dtype;
  int32_t state; /* lt_comm_state */
  int32_t peer;  /* root or peer (group rank), -1 when none */
  int32_t pad_;
  char op[24];
  char group[32];
  char shape[64];
} lt_comm_record;

int lt_comm_init(void); /* idempotent */
int lt_comm_initialized(void);
int lt_comm_uses_mpi(void); /* 1 when running under MPI, 0 as a singleton */
int lt_comm_rank(void);
int lt_comm_size(void);
int lt_comm_local_rank(void);
int lt_comm_world(lt_group **out);
/* Collective over parent (every rank calls it in the same order): the ranks of parent
 * with the same color form a group ordered by (key, parent rank). *out is NULL where
 * color < 0. name (up to 31 bytes) is used in messages. */
int lt_comm_split(lt_group **out, lt_group *parent, int color, int key, const char *name);
const char *lt_comm_group_name(const lt_group *g);
int lt_comm_group_rank(const lt_group *g);
int lt_comm_group_size(const lt_group *g);
int lt_comm_group_ranks(const lt_group *g, int *world_ranks); /* fills group-size ints */

/* t is reduced in place over the group; AVG needs a floating dtype; bf16/f16 reduce in f32. */
int lt_comm_all_reduce(lt_group *g, lt_tensor *t, int op, lt_comm_request **req);
/* inp holds the pieces of every rank, rank-major: counts[i] elements for rank i (counts
 * NULL: inp's numel / group size each); out (counts[rank]) gets this rank's reduced piece. */
int lt_comm_reduce_scatter(lt_group *g, lt_tensor *out, const lt_tensor *inp, int op, const int64_t *counts,
                           lt_comm_request **req);
/* out = the inps of every rank, rank-major; counts[i] elements from rank i (NULL: equal). */
int lt_comm_all_gather(lt_group *g, lt_tensor *out, const lt_tensor *inp, const int64_t *counts,
                       lt_comm_request **req);
int lt_comm_broadcast(lt_group *g, lt_tensor *t, int root, lt_comm_request **req);
int lt_comm_send(lt_group *g, const lt_tensor *t, int peer, int tag, lt_comm_request **req);
int lt_comm_recv(lt_group *g, lt_tensor *t, int peer, int tag, lt_comm_request **req);
/* n sends and receives (kinds[i] LT_COMM_SEND/RECV with peers[i]) posted together. */
int lt_comm_p2p(lt_group *g, int n, const int *kinds, lt_tensor *const *tensors, const int *peers, int tag,
                lt_comm_request **req);
int lt_comm_barrier(lt_group *g, lt_comm_request **req);
int lt_comm_wait(lt_comm_request *req);             /* completes and frees req */
/* Lets MPI advance posted requests (OpenMPI moves nonblocking collectives only inside MPI
 * calls): call it now and then while computing to overlap communication. */
int lt_comm_progress(void);
int lt_comm_test(lt_comm_request *req, int *done);  /* done = 1 once complete (still call wait) */

int lt_comm_set_timeout(double seconds); /* watchdog timeout; <= 0 disables it */
double lt_comm_timeout(void);
/* hold != 0 disables this rank's watchdog until a matching hold(0) (nests). While held,
 * the hold file exists (env LUTRA_HOLD_FILE, else /tmp/lutra-hold-<job id>), and the
 * other ranks' watchdogs keep waiting instead of ending the job. */
int lt_comm_hold(int hold);
/* Fingerprint mode: before each collective the group compares (op, dtype, count, root,
 * seq, call site) and every rank fails with the first mismatch. */
int lt_comm_set_debug(int on);
int lt_comm_debug(void);
int lt_comm_set_callsite(const char *where); /* the caller's file:line, for fingerprints */
/* The last n records, oldest first, into out[0 .. n); *count gets how many there were. */
int lt_comm_recent(int n, lt_comm_record *out, int *count);

/* ---- storage residency (lutra.dist.zero stage 3) ------------------------------ */

/* Frees the bytes of t's storage but keeps the storage object (its views and the
 * references autograd saved stay valid); data becomes NULL, nbytes 0. No-op when
 * already released. Reading t before restoring is a use-after-free. */
int lt_storage_release_bytes(lt_tensor *t);
/* Allocates the bytes of a released storage again (at least nbytes, and all that t
 * reaches), uninitialised; no-op when resident. */
int lt_storage_restore_bytes(lt_tensor *t, int64_t nbytes);
int lt_storage_is_resident(const lt_tensor *t); /* 1: t's storage holds its bytes */

/* ---- safetensors: defensive header parsing, tensor reads and writes (host/safetensors*.c) ----
 * A .safetensors file is an 8-byte little-endian header length N, N bytes of JSON
 * {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
 *  "__metadata__": {"key": "value"}} (padded with spaces), then the data section, which
 * the offsets index. Parsing checks everything before any byte of data is trusted: N is
 * at most 100 MB and within the file, the JSON is well formed, dtypes are ones lutra has
 * (F32 F64 BF16 F16 I32 I64 U8 BOOL), shapes are non-negative integers of at most 8 dims
 * whose byte size does not overflow, offsets lie in the data section, end - begin equals
 * the byte size, no two tensors overlap, names are unique, and metadata values are
 * strings. Errors name the file (or "buffer"), the tensor and the problem. */

typedef struct lt_st_header lt_st_header; /* opaque: a validated header (and the open file) */

typedef struct lt_st_info {
  const char *name;  /* owned by the header */
  int64_t shape[8];  /* LT_MAX_DIMS */
  int64_t begin;     /* byte offsets in the data section */
  int64_t end;
  int32_t ndim;
  int32_t dtype;     /* lt_dtype */
} lt_st_info;

/* Parses the header at the start of buf (len bytes: at least 8 + N) of a file of
 * file_size bytes. source names it in messages (NULL: "buffer"). */
int lt_st_parse(lt_st_header **out, const void *buf, int64_t len, int64_t file_size, const char *source);
/* Opens and parses the file at path; the file stays open for lt_st_load until lt_st_close. */
int lt_st_open(lt_st_header **out, const char *path);
int lt_st_close(lt_st_header *h); /* NULL is ok */
/* Tensors are in name order (byte order of the UTF-8 names), i in [0, count). */
int lt_st_count(const lt_st_header *h, int64_t *count);
int lt_st_tensor(const lt_st_header *h, int64_t i, lt_st_info *info);
int lt_st_find(const lt_st_header *h, const char *name, int64_t *index); /* index -1 when absent */
int lt_st_data_offset(const lt_st_header *h, int64_t *offset); /* 8 + N: where the data section starts */
int lt_st_metadata_count(const lt_st_header *h, int64_t *count);
int lt_st_metadata(const lt_st_header *h, int64_t i, const char **key, const char **value);
/* Reads tensor i of an opened file into out (undefined: allocated on the CPU with the
 * stored dtype and shape; defined: must match them, contiguous on the CPU). */
int lt_st_load(lt_tensor *out, const lt_st_header *h, int64_t i);
/* Writes n tensors (contiguous, on the CPU) under unique names, sorted by name, with
 * n_meta metadata string pairs, to a temporary file that is fsync'ed and renamed to path. */
int lt_st_save(const char *path, int64_t n, const char *const *names, const lt_tensor *const *tensors, int64_t n_meta,
               const char *const *meta_keys, const char *const *meta_values);

/* ---- checkpoint io: lz4-framed shard files, background saves (host/ckpt_*.c) ----
 * A shard file holds pieces (the bytes of one tensor box each), each one or more LZ4 frames
 * (liblz4's frame format, content checksum on, at most chunk_bytes raw bytes a frame), then
 * a footer: one 40-byte little-endian entry per piece {u64 offset, u64 csize, u64 raw_bytes,
 * u32 nframes, u32 checksum, u32 shuffle, u32 0}, then 24 bytes {u64 count, u32 hash of the entries, u32
 * version, the 8 bytes "LTCKPT1\n"}. A piece's checksum hashes its frames' content checksums
 * (each of which LZ4 checks against the decoded bytes), so a footer that points at the wrong
 * frames is caught too. Every read checks every size against the file before trusting it;
 * errors name the file, the piece, the frame and the problem (bad magic, checksum mismatch,
 * truncated, size mismatch), never crash.
 *
 * A job writes one shard file: pieces are added (pointers to bytes that must stay valid
 * until the job is waited for), then it runs on this thread (lt_ckpt_job_run) or on a
 * background thread (lt_ckpt_job_start, then lt_ckpt_job_wait). It writes PATH.part with
 * large sequential writes, fsyncs it and renames it to PATH. With a commit (rank 0) it then
 * waits until the `world` files tmp_dir/rank_%05d.lz4 exist, writes tmp_dir/manifest.json,
 * fsyncs it and tmp_dir, renames tmp_dir to final_dir (an older final_dir is moved aside
 * and removed), fsyncs the parent, and replaces latest_path by latest_text (temp file,
 * fsync, rename). Every started job is joined at exit (atexit), so a process never ends
 * with a save half-written. Test hook: env LUTRA_FAULT=save:start | save:mid_file |
 * save:after_file | save:after_manifest | save:after_rename ends the process (_exit(86)) at
 * that point; POINT@R only on rank R (OMPI_COMM_WORLD_RANK, PMIX_RANK or LUTRA_RANK). */

typedef struct lt_ckpt_piece {
  int64_t offset;    /* of the piece's first frame in the file */
  int64_t csize;     /* compressed bytes (all its frames) */
  int64_t raw_bytes; /* decoded bytes */
  int32_t nframes;
  uint32_t checksum;
  int32_t shuffle;   /* 0: plain bytes; k > 1: each frame holds its bytes transposed by k-byte
                      * elements (all first bytes, then all second bytes, ...): the exponent
                      * bytes of float weights then compress, where plain lz4 finds nothing */
  int32_t reserved;
} lt_ckpt_piece;

typedef struct lt_ckpt_job lt_ckpt_job; /* opaque */

/* chunk_bytes <= 0: 4 MiB; level: lz4 compression level (0 fast, up to 12: HC). */
int lt_ckpt_job_new(lt_ckpt_job **out, const char *path, int64_t chunk_bytes, int level);
/* Adds a piece: copy = 1 copies the bytes now (the job owns them: an async save's host
 * buffer); copy = 2 has the job's thread copy them first, the caller keeping them unchanged
 * until lt_ckpt_job_wait_copied; copy = 0: they must stay valid until the job is waited for.
 * shuffle: 0 or 1 plain,
 * 2, 4 or 8: byte-transposed by elements of that size (nbytes a multiple of it). */
int lt_ckpt_job_add(lt_ckpt_job *j, const void *data, int64_t nbytes, int shuffle, int copy);
/* Threads compressing frames (default 1; 0: all of OpenMP's). */
int lt_ckpt_job_threads(lt_ckpt_job *j, int threads);
/* A small file the job writes (a copy of data; temp, fsync, rename) before its shard file
 * appears: this rank's extra state, files copied into the checkpoint. */
int lt_ckpt_job_add_file(lt_ckpt_job *j, const char *path, const void *data, int64_t nbytes);
/* A directory the committing job removes (rm -r) after a successful commit: the
 * checkpoints that keeping the last K drops. */
int lt_ckpt_job_remove_after(lt_ckpt_job *j, const char *path);
/* Makes the job rank 0's: commit the checkpoint once every rank's file is there (waiting at
 * most timeout_s seconds for the others; latest_path NULL: no pointer). */
int lt_ckpt_job_commit(lt_ckpt_job *j, const char *tmp_dir, const char *final_dir, const char *manifest_text,
                       int world, const char *latest_path, const char *latest_text, double timeout_s);
/* The commit alone (what a committing job does after its file), for callers that write the
 * files first and agree that every rank succeeded before committing. */
int lt_ckpt_commit(const char *tmp_dir, const char *final_dir, const char *manifest_text, int world,
                   const char *latest_path, const char *latest_text, double timeout_s);
int lt_ckpt_job_run(lt_ckpt_job *j);
int lt_ckpt_job_start(lt_ckpt_job *j);
int lt_ckpt_job_poll(lt_ckpt_job *j, int *done); /* done = 1 once the thread finished (still wait) */
/* Returns once a started job has taken its deferred copies (lt_ckpt_job_add with copy = 2: the
 * job's thread copies the sources first): after it the caller may change them. */
int lt_ckpt_job_wait_copied(lt_ckpt_job *j);
/* Retains t until the job has taken its deferred copies (then releases it, from the job's
 * thread): a source freed by its owner (a Lua state closing at exit) stays readable. */
int lt_ckpt_job_hold(lt_ckpt_job *j, lt_tensor *t);
int lt_ckpt_job_wait(lt_ckpt_job *j);            /* joins; 0 or -1 with the job's error */
/* After the job: piece i's frames, and totals (raw, compressed bytes; seconds it took). */
int lt_ckpt_job_piece(const lt_ckpt_job *j, int64_t i, lt_ckpt_piece *piece);
int lt_ckpt_job_stats(const lt_ckpt_job *j, int64_t *raw, int64_t *compressed, double *seconds);
int lt_ckpt_job_free(lt_ckpt_job *j); /* waits for a running job first; NULL is ok */
int lt_ckpt_wait_all(void);          /* joins every started job; the first error */
/* Async saves keep their host buffers for the next save (same sizes: pages already touched,
 * a faster copy); this frees them. */
int lt_ckpt_release_buffers(void);

/* Reads a shard file's footer: *count pieces, the first min(count, max) into pieces (may be
 * NULL with max 0); *file_size the file's bytes. */
int lt_ckpt_read_index(const char *path, lt_ckpt_piece *pieces, int64_t max, int64_t *count, int64_t *file_size);
/* Decodes piece `index` of path (as its footer entry p says) into dst (dst_bytes must equal
 * p->raw_bytes), verifying magic, frame checksums, sizes and the piece checksum. */
int lt_ckpt_read_piece(const char *path, int64_t index, const lt_ckpt_piece *p, void *dst, int64_t dst_bytes);
/* Decodes bytes [begin, begin + len) of piece `index` into dst (len bytes): only the frames
 * holding them are decoded (each checked), the others are walked by their block headers;
 * the piece's size, frame count and checksum are verified as for a whole read. */
int lt_ckpt_read_range(const char *path, int64_t index, const lt_ckpt_piece *p, int64_t begin, int64_t len, void *dst);
/* Decodes every piece of path into a scratch buffer: a full check. raw/compressed may be NULL. */
int lt_ckpt_verify_file(const char *path, int64_t *raw, int64_t *compressed);

/* Files: fsync of a file or a directory; rename then fsync of the target's directory; an
 * atomic small file (temp, fsync, rename, fsync of the directory); rm -r. */
int lt_ckpt_fsync_path(const char *path);
int lt_ckpt_rename(const char *from, const char *to);
int lt_ckpt_write_file(const char *path, const void *data, int64_t nbytes);
int lt_ckpt_remove_tree(const char *path);
/* The test hook: ends the process when env LUTRA_FAULT names `point`; 0 otherwise. */
int lt_ckpt_fault(const char *point);

/* Validates a manifest.json text (host/ckpt_manifest.c) before Lua trusts it: format and
 * version, files (plain names), tensors (unique names, known dtypes, shapes of at most 8
 * non-negative dims without overflow), pieces (file in range, index >= 0, box inside the
 * global shape, bytes = box elements * dtype size). Counts go to n_tensors / n_pieces. */
int lt_ckpt_manifest_check(const char *text, int64_t len, const char *source, int64_t *n_tensors, int64_t *n_pieces);

/* ---- CUDA memory ------------------------------------------------------------ */
/* Figures of the stream-ordered caching allocator of one CUDA device
 * (host/caching_alloc.h). Byte counts are of blocks (requests rounded to 512 B, or
 * 2 MiB above 1 MiB); reserved is what is held from cudaMalloc. */
typedef struct lt_cuda_memory_stats {
  int64_t allocated;      /* bytes in blocks handed out */
  int64_t reserved;       /* bytes in segments held from the device */
  int64_t peak_allocated; /* high-water marks since the last reset */
  int64_t peak_reserved;
  int64_t num_allocs;     /* successful allocations */
  int64_t num_frees;      /* successful frees */
  int64_t cache_hits;     /* allocations served from the cache, without cudaMalloc */
  int64_t num_segments;   /* segments held now */
  int64_t segment_allocs; /* cudaMalloc calls that succeeded */
  int64_t segment_frees;  /* cudaFree calls */
  int64_t num_ooms;       /* allocations that failed for lack of memory */
} lt_cuda_memory_stats;
int lt_cuda_get_memory_stats(int device, lt_cuda_memory_stats *stats);
int lt_cuda_reset_peak_memory_stats(int device);
int lt_cuda_empty_cache(int device); /* returns fully free segments to the device */
/* Page-locked host buffers for async copies, from a small cache. Free one only once
 * the copies using it have completed (synchronize the stream first). */
int lt_cuda_host_alloc(int64_t nbytes, void **ptr);
int lt_cuda_host_free(void *ptr);

/* ---- pinned tensors, streams and events --------------------------------------------
 * Each CUDA device has a compute stream (every op runs on it, in program order), a copy
 * stream (asynchronous host<->device copies) and a communication stream (NCCL). Work on
 * one stream is ordered after another's with events. Without CUDA these return an error
 * that says so (lt_empty_pinned, lt_copy_async) or do nothing (synchronize). */
enum { LT_STORAGE_PINNED = -2 }; /* lt_storage.device of a CPU tensor in page-locked memory */
typedef enum lt_stream_kind { LT_STREAM_COMPUTE = 0, LT_STREAM_COPY = 1 } lt_stream_kind;
/* A CPU tensor whose storage is page-locked, so copies to and from a GPU can be async. */
int lt_empty_pinned(lt_tensor *out, int ndim, const int64_t *shape, int dtype);
int lt_is_pinned(const lt_tensor *t);
/* dst = src between a pinned CPU tensor and a CUDA tensor (either way; same shape and
 * dtype, both contiguous), queued on the device's copy stream after the work its compute
 * stream has queued so far; returns at once. The compute stream waits for the copy before
 * its next op, and *done (when not NULL) is an event for the host to wait on before it
 * reads or reuses the CPU side. Any other pair of tensors falls back to lt_copy (sync). */
int lt_copy_async(lt_tensor *dst, const lt_tensor *src, void **done);
/* Events: create (with timing), record on a device's stream, wait from the host or from
 * another stream, query (1 complete, 0 pending), elapsed milliseconds between two. */
int lt_cuda_event_create(void **event);
int lt_cuda_event_destroy(void *event);
int lt_cuda_event_record(void *event, int device, int stream);
int lt_cuda_event_synchronize(void *event);
int lt_cuda_event_query(void *event);
int lt_cuda_event_elapsed_ms(void *start, void *end, double *ms);
int lt_cuda_stream_wait_event(int device, int stream, void *event);
int lt_cuda_stream_synchronize(int device, int stream);

/* ---- JSON ---------------------------------------------------------------------------
 * The one JSON reader, for C and for Lua (lutra.json walks a parsed text through these):
 * RFC 8259 and strict (no leading zeros, trailing commas or bare dots, no raw control
 * characters in strings, numbers within the double range, at most max_depth nested arrays
 * and objects, which is capped at 1000). A UTF-8 byte order mark is skipped. A bad text is
 * an error that names the problem and where: "',' or ']' expected, got end of input at line
 * 1 column 6" (columns count bytes). Strings are decoded to UTF-8 (escaped surrogate pairs joined;
 * a lone surrogate is an error; other bytes pass through unchecked) and may hold NUL bytes,
 * so their lengths are given. A repeated key is kept: an object's members come in the
 * order of the text, both of them (lutra.json keeps the last). Values live as long as
 * their document. */
typedef struct lt_json_doc lt_json_doc;     /* opaque: a parsed text */
typedef struct lt_json_value lt_json_value; /* opaque: a value inside a document */
enum {
  LT_JSON_NULL = 0,
  LT_JSON_FALSE = 1,
  LT_JSON_TRUE = 2,
  LT_JSON_NUMBER = 3,
  LT_JSON_STRING = 4,
  LT_JSON_ARRAY = 5,
  LT_JSON_OBJECT = 6
};
int lt_json_parse(lt_json_doc **out, const char *text, int64_t len, int max_depth);
void lt_json_free(lt_json_doc *doc);
const lt_json_value *lt_json_root(const lt_json_doc *doc);
int lt_json_type(const lt_json_value *value); /* LT_JSON_* */
double lt_json_number(const lt_json_value *value);
/* A string value's bytes and length (NULL for another type). */
const char *lt_json_string(const lt_json_doc *doc, const lt_json_value *value, int64_t *len);
/* The first item of an array or member of an object (NULL when empty or not a container),
 * the one after item (NULL at the end), and a member's key. */
const lt_json_value *lt_json_first(const lt_json_value *value);
const lt_json_value *lt_json_next(const lt_json_value *item);
const char *lt_json_key(const lt_json_doc *doc, const lt_json_value *member, int64_t *len);

#ifdef __cplusplus
}
#endif
#endif
