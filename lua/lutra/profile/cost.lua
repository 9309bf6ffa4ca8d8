-- lutra.profile.cost — the FLOPs of the ops whose count is known, by op name, as the profiler
-- records them: rule(args...) -> per_out, flops: per_out flops per element of the op's first
-- result (added when it returns), flops a count known from the inputs alone. An op with no rule
-- has no FLOPs (views, copies, indexing). Conventions (those of torch's flop counter): a
-- multiply-add is 2 FLOPs; attention counts both of its matmuls in full (4 B H T S D, causal or
-- not); an elementwise op 1 per element; an autograd node's backward twice its forward's.
local ffi = require "ffi"
local fields = require "lutra.tensor.fields"

local Tensor = ffi.typeof("lt_tensor")
local type, istype = type, ffi.istype
local numel, dims = fields.numel, fields.dims

local function tensor(x) return type(x) == "cdata" and istype(Tensor, x) and not fields.is_freed(x) end
-- Size of dim d of t (negative: from the end).
local function dim(t, d)
  local n = t.ndim
  if d < 0 then d = n + d end
  if d < 0 or d >= n then return 1 end
  return tonumber(dims(t)[d])
end

local M = {}

-- a (..., M, K) @ b (..., K, N): 2K per element of the result.
function M.matmul(a, b)
  if tensor(a) and tensor(b) then return 2 * dim(a, -1) end
end
M.mm = M.matmul

function M.gemm(a, b, opts)
  if tensor(a) and tensor(b) then return 2 * dim(a, type(opts) == "table" and opts.trans_a and -2 or -1) end
end

-- x (..., in) @ weight (out, in)^T (+ bias): 2 in (+ 1) per element.
function M.linear(x, weight, bias)
  if tensor(x) then return 2 * dim(x, -1) + (tensor(bias) and 1 or 0) end
end

-- q (B, T, H, D), k (B, S, Hkv, D): 4 S D per element of the result (B, T, H, D) / D.
function M.scaled_dot_product_attention(args)
  local k = type(args) == "table" and args[2]
  if tensor(k) then return 4 * dim(k, 1) end
end

function M.grouped_linear(x)
  if tensor(x) then return 2 * dim(x, -1) end
end

local function per_element(n)
  return function() return n end
end
for _, name in ipairs {"add", "sub", "mul", "div", "pow", "maximum", "minimum", "add_", "sub_", "mul_", "div_",
                       "pow_", "neg", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "relu", "gelu", "gelu_erf",
                       "silu", "abs", "sin", "cos", "square", "reciprocal", "erf", "clamp", "where",
                       "eq", "ne", "lt", "le", "gt", "ge"} do
  M[name] = per_element(1)
end
-- the fused normalisations: a few passes over the row
for name, n in pairs {layer_norm = 8, rms_norm = 5, add_layer_norm = 9, add_rms_norm = 6, softmax = 5,
                      log_softmax = 5, rope = 3} do
  M[name] = per_element(n)
end

-- reductions: one per input element
local function per_input(a)
  if tensor(a) then return nil, numel(a) end
end
for _, name in ipairs {"sum", "mean", "max", "min", "prod", "norm", "var", "std", "logsumexp"} do M[name] = per_input end

-- cross-entropy over logits (..., V): max, exp-sum and the target, about 4 per logit
function M.cross_entropy(logits)
  if tensor(logits) then return nil, 4 * numel(logits) end
end

-- AdamW's update: about 12 per parameter
function M.adamw_step(param)
  if tensor(param) then return nil, 12 * numel(param) end
end

return M
