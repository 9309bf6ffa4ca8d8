-- lutra.F — the fused transformer kernels under torch-like names, as thin wrappers
-- that return new tensors (an `out` may be passed, as for every op) and, as extra
-- returns, the statistics the C kernel saves for its backward.
--
--   F.layer_norm(x, weight, bias, eps, out)     -> y, mean, rstd   over the last dim
--   F.rms_norm(x, weight, eps, out)             -> y, rstd         over the last dim
--   F.add_layer_norm(x, residual, weight, bias, eps) -> res, y, mean, rstd
--   F.add_rms_norm(x, residual, weight, eps)         -> res, y, rstd
--       res = x + residual (a pre-norm block's new residual stream), y = the norm of res, in
--       one pass; x and residual have one shape and dtype. Both res and y are differentiable:
--       backward adds res's own gradient into the norm's in the same kernel (so a hook or
--       retain_grad on res sees the gradient of res's other uses only).
--   F.linear(x, weight, bias, out)              -> x @ weight^T (+ bias)
--   F.cross_entropy(logits, targets, opts)      -> loss, losses, lse
--       opts: {ignore_index = -100, reduction = "mean" | "sum" | "none", out = }
--       logits (..., V), targets (...) i32/i64 class indices (0-based); "mean"
--       averages over the targets that are not ignore_index.
--   F.embedding(ids, weight, out)               -> weight[ids]   (..., C)
--   F.rope(x, positions, rope, out)             -> x rotated ("rotate half"); x (B, T, H, D);
--       rope: theta (a number) or {inv_freq = D/2 frequencies, scale = cos/sin factor}
--   F.scaled_dot_product_attention{q, k, v, causal=, scale=, segment_ids=, window=, out=}
--                                               -> out, lse; q (B, T, H, D), k, v (B, S, Hkv, D)
--   F.gather / scatter / scatter_add(x, dim, index[, src]), F.index_select / index_add /
--       index_copy(x, dim, index[, src]), F.masked_fill(x, mask, value), F.one_hot(index, C):
--       PyTorch's indexing ops (also methods: x:gather(dim, index), ...)
--   F.adamw_step(param, grad, m, v, {lr=, beta1=, beta2=, eps=, weight_decay=, step=})
--                                               -> param, updated in place (m, v too)
--   F.topk(x, k, dim, largest, sorted), F.sort(x, dim, descending, stable) -> values, indices;
--   F.argsort, F.cumsum(x, dim), F.cumprod, F.tril(x, diagonal), F.triu, F.logsumexp(x, dims, keepdim),
--   F.isnan, F.isinf, F.isfinite, F.nan_to_num(x, nan, posinf, neginf): also tensor methods (x:topk(k)).
--   F.grouped_linear(x, weight, counts)         -> y (M, out): x's rows in groups of counts[g], each
--       times its weight[g]^T; weight (G, out, in) stacked (a mixture of experts' matmuls, nn.MoE)
--   F.einsum(eq, ...), F.split(x, size, dim), F.chunk, F.unbind, F.clamp(x, min, max) (tensor bounds too),
--   F.clamp_min, F.clamp_max, F.clip, F.repeat_interleave(x, repeats, dim), F.bincount(x, weights,
--   minlength), F.histc(x, bins, min, max): also lutra.X, and tensor methods but einsum (x:split(2)).
-- Backward kernels, for autograd: layer_norm_backward, rms_norm_backward (both take an
-- optional dres, added to dx: the fused ops' backward; and which parameter gradients to
-- make, by default those of the weight and bias given),
-- cross_entropy_backward, embedding_backward, rope_backward, attention_backward,
-- softmax_backward, log_softmax_backward, unary_backward.
--
-- One module per op, named by the op, holds its binding, its backward and its autograd
-- declaration (the record the binding calls): lutra/functional/<op>.lua (layer_norm, rms_norm,
-- add_norm, linear, cross_entropy, embedding, rope, attention, adamw, softmax, grouped_linear,
-- ...); util.lua holds what they share. Autograd records the first result of each op (y, loss, out) when an input
-- requires grad; the extra results (statistics, per-row losses, lse) are not differentiable.
-- For f64 inputs the saved statistics are f64 too (exact gradient checks).
--
-- Autocast (mixed precision): while lutra.autocast.dtype is "bf16" or "f16" (F.autocast(dt, fn)
-- sets it; lutra.train's config.precision does, around each forward), F.linear and
-- F.scaled_dot_product_attention compute in that dtype: their f32 inputs, weights and biases
-- are cast per call through autograd (so f32 weights get f32 gradients), their results are
-- low precision. F.embedding casts the rows it picks. Norms, softmax and cross-entropy take
-- the low-precision activations as they are: their kernels compute in f32 and keep the
-- statistics, per-row losses and lse in f32 (norm weights stay f32). Off (nil): unchanged.
local ops = require "lutra.ops"

local F = {}

local OPS = {"lutra.functional.layer_norm", "lutra.functional.rms_norm", "lutra.functional.add_norm",
             "lutra.functional.linear", "lutra.functional.cross_entropy", "lutra.functional.embedding",
             "lutra.functional.rope", "lutra.functional.attention", "lutra.functional.adamw",
             "lutra.functional.softmax",
             "lutra.functional.gather", "lutra.functional.index_select", "lutra.functional.masked_fill",
             "lutra.functional.one_hot",
             "lutra.functional.sort", "lutra.functional.topk", "lutra.functional.cumsum", "lutra.functional.tril",
             "lutra.functional.logsumexp", "lutra.functional.nan_to_num", "lutra.functional.grouped_linear",
             "lutra.functional.einsum", "lutra.functional.split", "lutra.functional.clamp",
             "lutra.functional.repeat_interleave", "lutra.functional.histogram"}
for _, part in ipairs(OPS) do
  for name, fn in pairs(require(part)) do F[name] = fn end
end

F.autocast = require("lutra.autocast").run

-- plain ops under F too, as torch.nn.functional has them
for _, name in ipairs {"relu", "gelu", "silu", "sigmoid", "tanh", "softmax", "log_softmax"} do F[name] = ops[name] end
F.unary_backward = ops.unary_backward

return F
