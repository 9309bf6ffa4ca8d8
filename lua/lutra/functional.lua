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
--   F.rope(x, positions, theta, out)            -> x rotated ("rotate half"); x (B, T, H, D)
--   F.scaled_dot_product_attention{q, k, v, causal=, scale=, segment_ids=, out=}
--                                               -> out, lse; q (B, T, H, D), k, v (B, S, Hkv, D)
--   F.adamw_step(param, grad, m, v, {lr=, beta1=, beta2=, eps=, weight_decay=, step=})
--                                               -> param, updated in place (m, v too)
-- Backward kernels, for autograd: layer_norm_backward, rms_norm_backward (both take an
-- optional dres, added to dx: the fused ops' backward; and which parameter gradients to
-- make, by default those of the weight and bias given),
-- cross_entropy_backward, embedding_backward, rope_backward, attention_backward,
-- softmax_backward, log_softmax_backward, unary_backward.
-- Autograd records the first result of each op (y, loss, out) when an input requires
-- grad, through the record its declaration registers (lutra/autograd/nn.lua); the extra
-- results (statistics, per-row losses, lse) are not differentiable.
-- For f64 inputs the saved statistics are f64 too (exact gradient checks).
--
-- Autocast (mixed precision): while lutra.autocast.dtype is "bf16" or "f16" (F.autocast(dt, fn)
-- sets it; lutra.train's config.precision does, around each forward), F.linear and
-- F.scaled_dot_product_attention compute in that dtype: their f32 inputs, weights and biases
-- are cast per call through autograd (so f32 weights get f32 gradients), their results are
-- low precision. F.embedding casts the rows it picks. Norms, softmax and cross-entropy take
-- the low-precision activations as they are: their kernels compute in f32 and keep the
-- statistics, per-row losses and lse in f32 (norm weights stay f32). Off (nil): unchanged.
local lt = require "lutra.ffi"
local errors = require "lutra.errors"
local memory = require "lutra.memory"
local ops = require "lutra.ops"
local dtype = require "lutra.dtype"
local S = require "lutra.autograd.state"
local op = require "lutra.autograd.op"
local fields = require "lutra.tensor.fields"
local is_tracked = fields.is_tracked
local ffi, C = lt.ffi, lt.C

local records = op.records

local F = {}

local new, fail, raise = memory.new, errors.fail, errors.raise
local is_tensor = ops.is_tensor

local function tensor_or_nil(op, what, t)
  if t ~= nil and not is_tensor(t) then raise(string.format("%s: %s must be a tensor or nil, got %s", op, what, type(t))) end
  return t
end

local function need(op, what, t)
  if not is_tensor(t) then raise(string.format("%s: %s must be a tensor, got %s", op, what, type(t))) end
  return t
end

local function grad_of(a) return a ~= nil and is_tracked(a) end

-- True when autograd records this op (grad mode on, an input requires grad).
local function tracked(a, b, c)
  return S.enabled and (grad_of(a) or grad_of(b) or grad_of(c))
end

-- A caller's `out` is written in place: checked, versioned, and cleared when untracked.
local function writing(op, out, a, b, c)
  if out == nil then return end
  ops.before_write(op, out, a, b)
  if c ~= nil then ops.before_write(op, out, c) end
  S.bump(out)
  if S.enabled then S.clear(out) end
end

-- ---- autocast (lutra.autocast: the switch; F.autocast(dt, fn, ...) runs fn with it on) ----------

local AC = require "lutra.autocast"
local low = AC.low
F.autocast = AC.run

-- Per-row statistics (N) of x (..., C): f64 when x is, else left to the C op (f32).
local function row_stats(x)
  local t = new()
  if fields.dtype_id(x) == dtype.F64 and x.ndim > 0 then
    local n = 1
    for d = 0, x.ndim - 2 do n = n * fields.size(x, d) end
    if C.lt_empty(t, 1, ffi.new("int64_t[1]", n), dtype.F64, fields.device_id(x)) ~= 0 then fail() end
  end
  return t
end

-- torch passes normalized_shape second; accept and check it.
local function skip_normalized_shape(op, x, a, ...)
  if type(a) == "table" and not is_tensor(a) then
    if #a ~= 1 or a[1] ~= x:size(-1) then
      raise(op .. ": only the last dim can be normalized (normalized_shape {" .. x:size(-1) .. "})")
    end
    return ...
  end
  return a, ...
end

function F.layer_norm(x, ...)
  need("layer_norm", "x", x)
  local weight, bias, eps, out = skip_normalized_shape("layer_norm", x, ...)
  tensor_or_nil("layer_norm", "weight", weight)
  tensor_or_nil("layer_norm", "bias", bias)
  writing("layer_norm", out, x, weight, bias)
  out = out or new()
  local mean, rstd = row_stats(x), row_stats(x)
  if C.lt_layer_norm_forward(out, mean, rstd, x, weight, bias, eps or 1e-5) ~= 0 then fail() end
  if tracked(x, weight, bias) then records.layer_norm(out, x, weight, bias, mean, rstd) end
  return out, mean, rstd
end

-- need_weight, need_bias: whether to make dweight, dbias (default: when weight is given).
function F.layer_norm_backward(dout, x, weight, mean, rstd, dres, need_weight, need_bias)
  if need_weight == nil then need_weight = weight ~= nil end
  if need_bias == nil then need_bias = weight ~= nil end
  local dx, dweight, dbias = new(), need_weight and new() or nil, need_bias and new() or nil
  local rc
  if dres == nil then
    rc = C.lt_layer_norm_backward(dx, dweight, dbias, dout, x, weight, mean, rstd)
  else
    rc = C.lt_layer_norm_backward_add(dx, dweight, dbias, dout, dres, x, weight, mean, rstd)
  end
  if rc ~= 0 then fail() end
  return dx, dweight, dbias
end

function F.rms_norm(x, ...)
  need("rms_norm", "x", x)
  local weight, eps, out = skip_normalized_shape("rms_norm", x, ...)
  tensor_or_nil("rms_norm", "weight", weight)
  writing("rms_norm", out, x, weight)
  out = out or new()
  local rstd = row_stats(x)
  if C.lt_rms_norm_forward(out, rstd, x, weight, eps or 1e-6) ~= 0 then fail() end
  if tracked(x, weight) then records.rms_norm(out, x, weight, rstd) end
  return out, rstd
end

-- need_weight: whether to make dweight (default: when weight is given).
function F.rms_norm_backward(dout, x, weight, rstd, dres, need_weight)
  if need_weight == nil then need_weight = weight ~= nil end
  local dx, dweight = new(), need_weight and new() or nil
  local rc
  if dres == nil then
    rc = C.lt_rms_norm_backward(dx, dweight, dout, x, weight, rstd)
  else
    rc = C.lt_rms_norm_backward_add(dx, dweight, dout, dres, x, weight, rstd)
  end
  if rc ~= 0 then fail() end
  return dx, dweight
end

local function tracked4(a, b, c, d)
  return S.enabled and (grad_of(a) or grad_of(b) or grad_of(c) or grad_of(d))
end

function F.add_layer_norm(x, residual, weight, bias, eps)
  need("add_layer_norm", "x", x)
  need("add_layer_norm", "residual", residual)
  tensor_or_nil("add_layer_norm", "weight", weight)
  tensor_or_nil("add_layer_norm", "bias", bias)
  local res, out = new(), new()
  local mean, rstd = row_stats(x), row_stats(x)
  if C.lt_add_layer_norm_forward(res, out, mean, rstd, x, residual, weight, bias, eps or 1e-5) ~= 0 then fail() end
  if tracked4(x, residual, weight, bias) then records.add_norm(res, out, x, residual, weight, bias, mean, rstd) end
  return res, out, mean, rstd
end

function F.add_rms_norm(x, residual, weight, eps)
  need("add_rms_norm", "x", x)
  need("add_rms_norm", "residual", residual)
  tensor_or_nil("add_rms_norm", "weight", weight)
  local res, out = new(), new()
  local rstd = row_stats(x)
  if C.lt_add_rms_norm_forward(res, out, rstd, x, residual, weight, eps or 1e-6) ~= 0 then fail() end
  if tracked4(x, residual, weight) then records.add_norm(res, out, x, residual, weight, nil, nil, rstd) end
  return res, out, rstd
end


-- For a fresh y of x (..., in), weight (out, in) and bias (out), all of one dtype and device:
-- y is made holding bias in every row, so that the gemm adds into it (beta = 1) instead of
-- a separate pass adding the bias to y.
-- Operands lt_linear takes as they are: x (..., in) with 2 <= ndim <= 16, weight (out, in),
-- bias (out) or nil, one dtype and one device.
local function linear_fusable(x, weight, bias)
  local nd = x.ndim
  if nd < 2 or nd > 16 or weight.ndim ~= 2 or fields.dims(x)[nd - 1] ~= fields.dims(weight)[1]
    or not fields.same_kind(weight, x) then
    return false
  end
  return bias == nil or (bias.ndim == 1 and fields.dims(bias)[0] == fields.dims(weight)[0] and fields.same_kind(bias, x))
end

-- x (..., in) @ weight (out, in)^T + bias (out).
function F.linear(x, weight, bias, out)
  need("linear", "x", x)
  need("linear", "weight", weight)
  tensor_or_nil("linear", "bias", bias)
  if AC.dtype and out == nil then x, weight, bias = low(x), low(weight), low(bias) end
  writing("linear", out, x, weight, bias)
  local y = out or new()
  if out == nil and linear_fusable(x, weight, bias) then
    -- one op: on CUDA one cuBLASLt GEMM with the bias in its epilogue; on the CPU the GEMM
    -- adds into the broadcast bias (beta = 1)
    if C.lt_linear(y, x, weight, bias, 0) ~= 0 then fail() end
  else
    if C.lt_matmul(y, x, weight, 0, 1, 1.0, 0.0) ~= 0 then fail() end
    if bias ~= nil and C.lt_binary(y, y, bias, ops.BINARY.add) ~= 0 then fail() end
  end
  if tracked(x, weight, bias) then records.linear(y, x, weight, bias) end
  return y
end

-- ---- cross entropy -------------------------------------------------------------------

local function ce_options(opts)
  if type(opts) == "number" then return opts, "mean", nil end
  opts = opts or {}
  return opts.ignore_index or -100, opts.reduction or "mean", opts.out
end

-- Flattens logits (..., V) to (N, V) and targets (...) to (N).
local function flat_rows(logits, targets)
  local v = logits:size(-1)
  return logits:reshape(-1, v), targets:reshape(-1)
end

function F.cross_entropy(logits, targets, opts)
  need("cross_entropy", "logits", logits)
  need("cross_entropy", "targets", targets)
  local ignore_index, reduction, out = ce_options(opts)
  if reduction ~= "none" and reduction ~= "sum" and reduction ~= "mean" then
    raise("cross_entropy: reduction must be \"mean\", \"sum\" or \"none\", got " .. tostring(reduction))
  end
  local track = tracked(logits)
  -- the pieces below are one recorded op
  local loss, losses, lse, valid = op.untracked(function()
    local l2, t1 = flat_rows(logits, targets)
    local losses, lse = row_stats(l2), row_stats(l2)
    if C.lt_cross_entropy_forward(losses, lse, l2, t1, ignore_index) ~= 0 then fail() end
    -- the flat view is dropped now: a tidy scope would keep the logits' storage to its end
    if not rawequal(l2, logits) then l2:free() end
    if reduction == "none" then
      if out then out:copy_(losses) end
      return out or losses, losses, lse
    end
    local total = ops.sum(losses, nil, false, out)
    if reduction == "sum" then return total, losses, lse end
    local valid = ops.sum(ops.ne(t1, ignore_index):to(dtype.name(fields.dtype_id(losses))))
    return ops.div(total, valid, total), losses, lse, valid
  end)
  if track then records.cross_entropy(loss, logits, targets, lse, ignore_index, reduction, valid) end
  return loss, losses, lse
end

-- dlogits (N, V) from dlosses (N); logits and targets as given to the forward. out (logits'
-- shape) may be logits itself: the gradient overwrites them.
function F.cross_entropy_backward(dlosses, logits, targets, lse, ignore_index, out)
  local l2, t1 = flat_rows(logits, targets)
  local dlogits = out and out:reshape(l2.shape) or new()
  if C.lt_cross_entropy_backward(dlogits, dlosses, l2, t1, lse, ignore_index or -100) ~= 0 then fail() end
  return dlogits:view(logits.shape)
end

-- ---- embedding, rope ---------------------------------------------------------------------

function F.embedding(ids, weight, out)
  need("embedding", "ids", ids)
  need("embedding", "weight", weight)
  writing("embedding", out, weight)
  local cast = AC.dtype ~= nil and out == nil
  out = out or new()
  if C.lt_embedding_forward(out, weight, ids) ~= 0 then fail() end
  if tracked(weight) then records.embedding(out, ids, weight) end
  if cast and fields.dtype_id(out) == dtype.F32 then
    local rows = out
    out = low(rows)
    rows:free() -- the f32 rows: the cast's record does not need them
  end
  return out
end

-- dweight (V, C) shaped like `weight` (a tensor, or a {V, C} shape list).
function F.embedding_backward(dout, ids, weight)
  local dweight
  if is_tensor(weight) then
    dweight = require("lutra.create").zeros_like(weight, {dtype = dtype.name(fields.dtype_id(dout))})
  else
    dweight = require("lutra.create").zeros(weight, {dtype = dtype.name(fields.dtype_id(dout)),
      device = dtype.device_name(fields.device_id(dout))})
  end
  if C.lt_embedding_backward(dweight, dout, ids) ~= 0 then fail() end
  return dweight
end

function F.rope(x, positions, theta, out)
  need("rope", "x", x)
  tensor_or_nil("rope", "positions", positions)
  writing("rope", out, x)
  out = out or new()
  if C.lt_rope(out, x, positions, theta or 10000.0, 0) ~= 0 then fail() end
  if tracked(x) then records.rope(out, x, positions, theta or 10000.0) end
  return out
end

function F.rope_backward(dout, positions, theta, out)
  out = out or new()
  if C.lt_rope(out, dout, positions, theta or 10000.0, 1) ~= 0 then fail() end
  return out
end

-- ---- attention ----------------------------------------------------------------------------

local function attention_args(args)
  if type(args) ~= "table" or is_tensor(args) then
    raise("scaled_dot_product_attention: expected a table {q, k, v, causal=, scale=, segment_ids=}")
  end
  local q, k, v = args[1] or args.q, args[2] or args.k, args[3] or args.v
  need("scaled_dot_product_attention", "q", q)
  need("scaled_dot_product_attention", "k", k)
  need("scaled_dot_product_attention", "v", v)
  tensor_or_nil("scaled_dot_product_attention", "segment_ids", args.segment_ids)
  local scale = args.scale or 1 / math.sqrt(q:size(-1))
  return q, k, v, scale, args.causal and 1 or 0, args.segment_ids
end

function F.scaled_dot_product_attention(args)
  local q, k, v, scale, causal, seg = attention_args(args)
  if AC.dtype and args.out == nil then q, k, v = low(q), low(k), low(v) end
  writing("scaled_dot_product_attention", args.out, q, k, v)
  local out, lse = args.out or new(), new()
  if C.lt_attention_forward(out, lse, q, k, v, seg, scale, causal) ~= 0 then fail() end
  if tracked(q, k, v) then records.attention(out, lse, q, k, v, seg, scale, causal) end
  return out, lse
end

-- {dout, q, k, v, out, lse, causal=, scale=, segment_ids=} -> dq, dk, dv
function F.attention_backward(args)
  local q, k, v, scale, causal, seg = attention_args {args[2], args[3], args[4], causal = args.causal,
    scale = args.scale, segment_ids = args.segment_ids}
  local dq, dk, dv = new(), new(), new()
  if C.lt_attention_backward(dq, dk, dv, args[1], q, k, v, args[5], args[6], seg, scale, causal) ~= 0 then fail() end
  return dq, dk, dv
end

-- ---- optimizer ---------------------------------------------------------------------------------

function F.adamw_step(param, grad, m, v, opts)
  opts = opts or {}
  if type(opts.step) ~= "number" or opts.step < 1 then raise("adamw_step: opts.step (>= 1) is required") end
  if type(opts.lr) ~= "number" then raise("adamw_step: opts.lr is required") end
  local rc = C.lt_adamw_step(param, grad, m, v, opts.lr, opts.beta1 or 0.9, opts.beta2 or 0.999, opts.eps or 1e-8,
    opts.weight_decay or 0.01, opts.step)
  if rc ~= 0 then fail() end
  S.bump(param) -- an optimizer update: graphs that saved param see it changed
  S.bump(m)
  S.bump(v)
  return param
end

-- ---- plain ops under F too, as torch.nn.functional has them ------------------------------------

for _, name in ipairs {"relu", "gelu", "silu", "sigmoid", "tanh", "softmax", "log_softmax"} do F[name] = ops[name] end

function F.softmax_backward(grad_out, y, dim, out)
  out = out or new()
  if C.lt_softmax_backward(out, grad_out, y, dim or -1) ~= 0 then fail() end
  return out
end

function F.log_softmax_backward(grad_out, y, dim, out)
  out = out or new()
  if C.lt_log_softmax_backward(out, grad_out, y, dim or -1) ~= 0 then fail() end
  return out
end

F.unary_backward = ops.unary_backward

return F
